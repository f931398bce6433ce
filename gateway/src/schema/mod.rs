//! The message types workers announce (`rpc::ServiceSchema`), kept per service, and the
//! transcoding of typed bodies between the proto3 JSON mapping and protobuf that they
//! make possible for JSON clients.
//!
//! A gate learns types at run time: it listens on `<prefix>.schema.svc.*`, asks once on
//! `<prefix>.schema.ask` so workers that started before it announce again, and keeps the
//! latest announcement of each service. An announcement that does not decode, names a
//! type its descriptors lack, a method that is not one route token (`inventory.add`
//! where `add` was meant) or a push route not under its service, is refused as a whole
//! (logged) and the service keeps what it had: a broken worker cannot take JSON away
//! from the others, and a misnamed route is said aloud rather than left to answer JSON
//! clients "no announced message types". Protobuf sessions never look here.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use dashmap::DashMap;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};
use proto::Message as _;
use proto::keyed::MAX_PARTITIONS;
use proto::rpc::ServiceSchema;

use crate::config::MAX_ROUTE_LEN;

mod dict;

pub(crate) use dict::{Dict, RouteDict};

/// A typed method's request and response types.
#[derive(Debug, Clone)]
pub(crate) struct MethodTypes {
    pub request: MessageDescriptor,
    pub response: MessageDescriptor,
}

/// One service's announced types.
struct ServiceTypes {
    /// The announcement as received: a repeat of it is not parsed again.
    announced: Bytes,
    methods: HashMap<String, MethodTypes>,
    /// By push route (`<service>.<name>`).
    pushes: HashMap<String, MessageDescriptor>,
    /// How a keyed service routes.
    keyed: Option<Arc<Keyed>>,
}

/// How a keyed service's requests are routed (docs/workers.md, "Keyed services").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keyed {
    pub partitions: u32,
    /// The session data key a request's key comes from when the client gives none;
    /// empty for none.
    pub session_key: String,
}

/// Why an announcement was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SchemaError {
    #[error("announcement does not decode: {0}")]
    Decode(#[from] proto::DecodeError),
    #[error("service {0:?} is not a valid service name")]
    Service(String),
    #[error("descriptors of service {service:?} do not load: {error}")]
    Descriptors {
        service: String,
        error: prost_reflect::DescriptorError,
    },
    #[error("service {service:?} names type {name:?}, which its descriptors lack")]
    MissingType { service: String, name: String },
    #[error(
        "service {service:?} announces method {method:?}, which no route reaches: a method \
         is announced alone, as the one [a-z0-9_-] token after \"{service}.\" in its route \
         (routes are at most {MAX_ROUTE_LEN} bytes)"
    )]
    Method { service: String, method: String },
    #[error(
        "service {service:?} announces push route {route:?}: a push route is \
         {service}.<name>, <name> one [a-z0-9_-] token (routes are at most {MAX_ROUTE_LEN} bytes)"
    )]
    PushRoute { service: String, route: String },
    #[error(
        "service {0:?} is keyed over a partition count or session key the gates cannot route by"
    )]
    Keyed(String),
}

/// Every service's announced types, by service name, and the pomelo route dictionary
/// of their routes.
#[derive(Default)]
pub(crate) struct Schemas {
    services: DashMap<String, Arc<ServiceTypes>>,
    pub pomelo: RouteDict,
    /// Bumped at every service learnt, for [`Schemas::wait_for`].
    learnt: tokio::sync::watch::Sender<u64>,
    /// Some service announced is keyed: until then requests need not look.
    any_keyed: AtomicBool,
}

impl Schemas {
    /// Takes an announcement; returns the service it was for.
    pub fn learn(&self, payload: Bytes) -> Result<String, SchemaError> {
        let schema = ServiceSchema::decode(payload.clone())?;
        let service = schema.service;
        if crate::route::check_token(&service).is_err() {
            return Err(SchemaError::Service(service));
        }
        if self
            .services
            .get(&service)
            .is_some_and(|known| known.announced == payload)
        {
            return Ok(service);
        }
        let keyed = match schema.keyed {
            None => None,
            Some(k)
                if (1..=MAX_PARTITIONS).contains(&k.partitions)
                    && (k.session_key.is_empty()
                        || crate::route::check_token(&k.session_key).is_ok()) =>
            {
                Some(Arc::new(Keyed {
                    partitions: k.partitions,
                    session_key: k.session_key,
                }))
            }
            Some(_) => return Err(SchemaError::Keyed(service)),
        };
        let pool = match DescriptorPool::decode(schema.descriptors) {
            Ok(pool) => pool,
            Err(error) => return Err(SchemaError::Descriptors { service, error }),
        };
        let find = |name: &str| {
            pool.get_message_by_name(name)
                .ok_or_else(|| SchemaError::MissingType {
                    service: service.clone(),
                    name: name.to_owned(),
                })
        };
        let mut methods = HashMap::new();
        for m in schema.methods {
            // The gate looks a route's method up by the token after the service's name.
            if crate::route::parse(&format!("{service}.{}", m.method)).is_err() {
                return Err(SchemaError::Method {
                    service: service.clone(),
                    method: m.method,
                });
            }
            let types = MethodTypes {
                request: find(&m.request_type)?,
                response: find(&m.response_type)?,
            };
            methods.insert(m.method, types);
        }
        let mut pushes = HashMap::new();
        for p in schema.pushes {
            // A push's type is looked up under the service its route's first token names.
            if !matches!(crate::route::parse(&p.route), Ok((owner, _)) if owner == service) {
                return Err(SchemaError::PushRoute {
                    service: service.clone(),
                    route: p.route,
                });
            }
            pushes.insert(p.route, find(&p.message_type)?);
        }
        if keyed.is_some() {
            self.any_keyed.store(true, Ordering::Relaxed);
        }
        let types = Arc::new(ServiceTypes {
            announced: payload,
            methods,
            pushes,
            keyed,
        });
        self.services.insert(service.clone(), types.clone());
        // The types first: a pomelo client given a route's code by the dictionary must
        // find its types when it sends a request by it (else its JSON body would go to
        // the worker untranscoded).
        let mut names: Vec<&str> = types.methods.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut push_routes: Vec<&str> = types.pushes.keys().map(String::as_str).collect();
        push_routes.sort_unstable();
        self.pomelo.add(&service, &names, &push_routes);
        self.learnt.send_modify(|n| *n += 1);
        Ok(service)
    }

    /// Waits until every service in `services` has announced its types.
    pub async fn wait_for(&self, services: &[&str]) {
        let mut learnt = self.learnt.subscribe();
        while !services.iter().all(|s| self.services.contains_key(*s)) {
            if learnt.changed().await.is_err() {
                return;
            }
        }
    }

    /// Whether `route`'s service has announced itself to this gate: some worker has
    /// served it, so "no responders" for it is an outage (503), not an unknown route.
    pub fn knows_service_of(&self, route: &str) -> bool {
        let service = route.split_once('.').map_or(route, |(s, _)| s);
        self.services.contains_key(service)
    }

    /// How `service` routes by key, if it announced itself keyed.
    pub fn keyed(&self, service: &str) -> Option<Arc<Keyed>> {
        if !self.any_keyed.load(Ordering::Relaxed) {
            return None;
        }
        self.services.get(service)?.keyed.clone()
    }

    /// The types of `route` (`service.method`), if its service announced it as typed.
    pub fn method(&self, route: &str) -> Option<MethodTypes> {
        let (service, method) = route.split_once('.')?;
        self.services.get(service)?.methods.get(method).cloned()
    }

    /// The type of push route `route`, looked up under the service its first token
    /// names (`chat.message` under `chat`).
    pub fn push(&self, route: &str) -> Option<MessageDescriptor> {
        let (service, _) = route.split_once('.')?;
        self.services.get(service)?.pushes.get(route).cloned()
    }
}

/// A typed JSON body (proto3 JSON mapping) as protobuf; the error names the field at
/// fault, e.g. `field room: invalid type: integer `5`, expected a string`.
pub(crate) fn json_to_protobuf(
    message: &MessageDescriptor,
    json: &[u8],
) -> Result<Vec<u8>, String> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let mut track = serde_path_to_error::Track::new();
    let parsed = DynamicMessage::deserialize(
        message.clone(),
        serde_path_to_error::Deserializer::new(&mut de, &mut track),
    );
    match parsed {
        Ok(parsed) => Ok(parsed.encode_to_vec()),
        Err(e) => {
            let path = track.path().to_string();
            Err(if path == "." || path.is_empty() {
                format!("{}: {e}", message.full_name())
            } else {
                format!("field {path}: {e}")
            })
        }
    }
}

/// A protobuf body as its proto3 JSON mapping.
pub(crate) fn protobuf_to_json(message: &MessageDescriptor, body: &[u8]) -> Result<String, String> {
    let parsed = DynamicMessage::decode(message.clone(), body)
        .map_err(|e| format!("not a {}: {e}", message.full_name()))?;
    serde_json::to_string(&parsed).map_err(|e| e.to_string())
}

/// Refused announcements, one line a second at most.
static REFUSED_LOG: net::LogLimiter = net::LogLimiter::per_second();

/// Takes one announcement from the bus, logging (at most once a second) one refused.
pub(crate) fn on_announcement(schemas: &Schemas, payload: Bytes) {
    take_announcement(schemas, payload, &REFUSED_LOG);
}

/// [`on_announcement`], with the limiter of its log lines given.
fn take_announcement(schemas: &Schemas, payload: Bytes, refused_log: &net::LogLimiter) {
    match schemas.learn(payload) {
        Ok(service) => tracing::trace!(%service, "schema announced"),
        // Announcements repeat at every ask: a broken worker's would repeat its warning.
        Err(error) => {
            if let Some(tally) = refused_log.check() {
                tracing::warn!(%error, "schema announcement refused{tally}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::rpc::{MethodSchema, PushSchema};

    fn chat_schema() -> ServiceSchema {
        ServiceSchema {
            service: "chat".into(),
            methods: vec![MethodSchema {
                method: "say".into(),
                request_type: "shaddock.chat.SayRequest".into(),
                response_type: "shaddock.chat.SayResponse".into(),
            }],
            pushes: vec![PushSchema {
                route: "chat.message".into(),
                message_type: "shaddock.chat.ChatMessage".into(),
            }],
            descriptors: Bytes::from_static(proto::DESCRIPTORS),
            keyed: None,
        }
    }

    #[test]
    fn announced_types_transcode_both_ways() {
        let schemas = Schemas::default();
        let payload = Bytes::from(chat_schema().encode_to_vec());
        assert_eq!(schemas.learn(payload).unwrap(), "chat");
        let say = schemas.method("chat.say").unwrap();
        let bytes = json_to_protobuf(&say.request, br#"{"room":"lobby","text":"hi"}"#).unwrap();
        let decoded = proto::chat::SayRequest::decode(&bytes[..]).unwrap();
        assert_eq!(
            (decoded.room.as_str(), decoded.text.as_str()),
            ("lobby", "hi")
        );
        let push = schemas.push("chat.message").unwrap();
        let message = proto::chat::ChatMessage {
            room: "lobby".into(),
            from: "ann".into(),
            text: "hi".into(),
            ..Default::default()
        };
        let json = protobuf_to_json(&push, &message.encode_to_vec()).unwrap();
        assert_eq!(json, r#"{"room":"lobby","from":"ann","text":"hi"}"#);
        assert!(schemas.method("chat.login").is_none());
        assert!(schemas.method("echo.echo").is_none());
        assert!(schemas.push("chat.other").is_none());
    }

    #[tokio::test]
    async fn waiting_for_services_ends_when_the_last_one_is_learnt() {
        let schemas = Arc::new(Schemas::default());
        let waiting = tokio::spawn({
            let schemas = schemas.clone();
            async move { schemas.wait_for(&["chat"]).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        schemas
            .learn(Bytes::from(chat_schema().encode_to_vec()))
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("still waiting after the service was learnt")
            .unwrap();
        // Already known: no wait at all.
        schemas.wait_for(&["chat"]).await;
    }

    #[test]
    fn a_bad_body_names_its_field() {
        let schemas = Schemas::default();
        schemas
            .learn(Bytes::from(chat_schema().encode_to_vec()))
            .unwrap();
        let say = schemas.method("chat.say").unwrap().request;
        let wrong_type = json_to_protobuf(&say, br#"{"room":5}"#).unwrap_err();
        assert!(wrong_type.starts_with("field room: "), "{wrong_type}");
        let unknown = json_to_protobuf(&say, br#"{"rom":"x"}"#).unwrap_err();
        assert!(unknown.contains("rom"), "{unknown}");
        let not_object = json_to_protobuf(&say, b"[1]").unwrap_err();
        assert!(
            not_object.contains("shaddock.chat.SayRequest"),
            "{not_object}"
        );
    }

    #[test]
    fn a_broken_announcement_leaves_what_was_known() {
        let schemas = Schemas::default();
        schemas
            .learn(Bytes::from(chat_schema().encode_to_vec()))
            .unwrap();
        let mut missing = chat_schema();
        missing.methods[0].request_type = "shaddock.chat.Nope".into();
        assert!(matches!(
            schemas.learn(Bytes::from(missing.encode_to_vec())),
            Err(SchemaError::MissingType { .. })
        ));
        let mut garbage = chat_schema();
        garbage.descriptors = Bytes::from_static(b"\xff\xff");
        assert!(schemas.learn(Bytes::from(garbage.encode_to_vec())).is_err());
        assert!(schemas.learn(Bytes::from_static(b"\xff")).is_err());
        let mut bad_name = chat_schema();
        bad_name.service = "a.b".into();
        assert!(matches!(
            schemas.learn(Bytes::from(bad_name.encode_to_vec())),
            Err(SchemaError::Service(_))
        ));
        assert!(schemas.method("chat.say").is_some());
        assert_eq!(schemas.services.len(), 1);
    }

    /// What `f` logs, as the gate's log would show it.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_method_no_route_reaches_or_a_push_route_elsewhere_is_refused_and_logged() {
        let schemas = Schemas::default();
        schemas
            .learn(Bytes::from(chat_schema().encode_to_vec()))
            .unwrap();
        // `chat.` and 60 bytes: one byte over a route's length.
        let too_long = "m".repeat(MAX_ROUTE_LEN - "chat".len());
        for method in ["chat.say", "", "Say", "s*", "a b", &too_long] {
            let mut misnamed = chat_schema();
            misnamed.methods[0].method = method.into();
            let refused = schemas.learn(Bytes::from(misnamed.encode_to_vec()));
            assert!(
                matches!(refused, Err(SchemaError::Method { .. })),
                "{method:?}: {refused:?}"
            );
        }
        for route in [
            "message",
            "echo.message",
            "chat.message.x",
            "chat.",
            ".message",
            "chat.Message",
            "chat.m>",
        ] {
            let mut misrouted = chat_schema();
            misrouted.pushes[0].route = route.into();
            let refused = schemas.learn(Bytes::from(misrouted.encode_to_vec()));
            assert!(
                matches!(refused, Err(SchemaError::PushRoute { .. })),
                "{route:?}: {refused:?}"
            );
        }
        // Refused as a whole: what the service announced before stands.
        assert!(schemas.method("chat.say").is_some());
        assert!(schemas.push("chat.message").is_some());
        assert!(schemas.method("chat.chat.say").is_none());

        // The gate's log says which method and what a method is.
        let mut misnamed = chat_schema();
        misnamed.methods[0].method = "chat.say".into();
        let payload = Bytes::from(misnamed.encode_to_vec());
        let limiter = net::LogLimiter::per_second();
        let log = logged(|| take_announcement(&schemas, payload, &limiter));
        assert!(log.contains("WARN"), "{log}");
        assert!(log.contains("schema announcement refused"), "{log}");
        assert!(
            log.contains(r#"service "chat" announces method "chat.say", which no route reaches"#),
            "{log}"
        );
        assert!(log.contains(r#"token after "chat." in its route"#), "{log}");

        // The longest method a route holds is fine.
        let longest = Schemas::default();
        let mut long = chat_schema();
        long.methods[0].method = "m".repeat(MAX_ROUTE_LEN - "chat.".len());
        longest.learn(Bytes::from(long.encode_to_vec())).unwrap();
        let route = format!("chat.{}", long.methods[0].method);
        assert!(longest.method(&route).is_some());
    }

    #[test]
    fn a_keyed_service_is_learnt_without_descriptors_and_bad_routing_is_refused() {
        let schemas = Schemas::default();
        let keyed = |partitions, session_key: &str| ServiceSchema {
            service: "arena".into(),
            keyed: Some(proto::rpc::Keyed {
                partitions,
                session_key: session_key.into(),
            }),
            ..ServiceSchema::default()
        };
        assert_eq!(schemas.keyed("arena"), None);
        for (partitions, session_key) in [(0, ""), (MAX_PARTITIONS + 1, ""), (8, "a.b")] {
            let refused =
                schemas.learn(Bytes::from(keyed(partitions, session_key).encode_to_vec()));
            assert!(
                matches!(refused, Err(SchemaError::Keyed(_))),
                "{partitions} {session_key:?}: {refused:?}"
            );
        }
        schemas
            .learn(Bytes::from(keyed(MAX_PARTITIONS, "match").encode_to_vec()))
            .unwrap();
        let expected = Keyed {
            partitions: MAX_PARTITIONS,
            session_key: "match".into(),
        };
        assert_eq!(schemas.keyed("arena").as_deref(), Some(&expected));
        assert!(schemas.knows_service_of("arena.input"));
        assert_eq!(schemas.keyed("chat"), None);
    }
}
