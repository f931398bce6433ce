//! `shaddock routes`: what the services on a bus serve, from their schema announcements
//! (docs/workers.md, "The schema announcement"): it subscribes to the announcements,
//! asks every worker to announce (as a gate that starts late does), and lists what it
//! heard within a short window.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::{ConnectOptions, ServerAddr};
use futures::StreamExt as _;
use proto::Message as _;
use proto::rpc::ServiceSchema;
use serde_json::json;
use services::BusSecurity;

/// `shaddock routes --help`.
pub const ABOUT: &str = "\
List the routes the services on a bus serve, with their message types: every worker
announces its service's schema when asked (as gates ask), and this prints what was heard
within --wait. Typed methods are listed with their request and response types, push
routes with their message type, keyed services with their partition count and session
key.

Every service is listed by name, typed or not; raw methods (echo.raw) carry no types,
so they are not listed as routes. Workers must share the gates' --prefix.";

/// `shaddock routes`: the bus's services, methods, pushes and keyed services.
#[derive(Debug, clap::Args)]
pub struct RoutesArgs {
    /// NATS server URLs, comma-separated (what the gates and workers use).
    #[arg(
        long = "nats",
        env = "SHADDOCK_NATS",
        value_delimiter = ',',
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats: Vec<String>,
    #[command(flatten)]
    pub security: BusSecurity,
    /// Subject prefix shared by gates and workers (the gate's --prefix).
    #[arg(long, env = "SHADDOCK_PREFIX", default_value = gateway::config::DEFAULT_PREFIX)]
    pub prefix: String,
    /// How long to collect announcements after asking (e.g. 500ms, 2s).
    #[arg(long, value_name = "DURATION", value_parser = net::duration::parse_positive, default_value = "1s")]
    pub wait: Duration,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// How long dialling the bus may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `shaddock routes`: fails when nothing was heard.
pub async fn run(args: RoutesArgs) -> anyhow::Result<ExitCode> {
    let schemas = collect(&args).await?;
    if args.json {
        println!("{}", to_json(&schemas));
    } else if !schemas.is_empty() {
        print!("{}", tables(&schemas));
    }
    if schemas.is_empty() {
        eprintln!(
            "shaddock: no service announced itself within {:?} on {} (prefix {:?}): are \
             workers running on this bus, with this --prefix?",
            args.wait,
            args.nats.join(","),
            args.prefix
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Asks for every service's schema and keeps the latest heard per service, within the
/// wait.
async fn collect(args: &RoutesArgs) -> anyhow::Result<BTreeMap<String, ServiceSchema>> {
    let addrs = args
        .nats
        .iter()
        .map(|url| {
            url.parse::<ServerAddr>()
                .with_context(|| format!("invalid NATS URL {url:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let options = ConnectOptions::new()
        .name("shaddock-routes")
        .connection_timeout(CONNECT_TIMEOUT);
    let client = args
        .security
        .apply(options)
        .await?
        .connect(addrs)
        .await
        .with_context(|| format!("connecting to NATS at {}", args.nats.join(",")))?;
    let mut heard = client
        .subscribe(proto::schema::announcements(&args.prefix))
        .await
        .context("subscribing to the schema announcements")?;
    // After the subscription on the same connection: the server has it before the ask.
    client
        .publish(proto::schema::ask_subject(&args.prefix), "".into())
        .await
        .context("asking for schemas")?;
    client.flush().await.context("asking for schemas")?;
    let mut schemas = BTreeMap::new();
    let window = tokio::time::sleep(args.wait);
    tokio::pin!(window);
    loop {
        tokio::select! {
            message = heard.next() => {
                let Some(message) = message else { break };
                match ServiceSchema::decode(message.payload) {
                    Ok(schema) => {
                        schemas.insert(schema.service.clone(), schema);
                    }
                    Err(error) => eprintln!(
                        "shaddock: an announcement on {} does not decode: {error}",
                        message.subject
                    ),
                }
            }
            () = &mut window => break,
        }
    }
    drop(heard);
    let _ = client.drain().await;
    Ok(schemas)
}

/// One JSON document: `{"services":[{"service", "methods", "pushes", "keyed"}]}`.
fn to_json(schemas: &BTreeMap<String, ServiceSchema>) -> serde_json::Value {
    let services: Vec<serde_json::Value> = schemas
        .values()
        .map(|schema| {
            let methods: Vec<_> = sorted_methods(schema)
                .into_iter()
                .map(|(route, request, response)| {
                    json!({"route": route, "request_type": request, "response_type": response})
                })
                .collect();
            let pushes: Vec<_> = sorted_pushes(schema)
                .into_iter()
                .map(|(route, message)| json!({"route": route, "message_type": message}))
                .collect();
            let keyed = schema.keyed.as_ref().map(
                |keyed| json!({"partitions": keyed.partitions, "session_key": keyed.session_key}),
            );
            json!({
                "service": schema.service,
                "methods": methods,
                "pushes": pushes,
                "keyed": keyed,
            })
        })
        .collect();
    json!({ "services": services })
}

fn sorted_methods(schema: &ServiceSchema) -> Vec<(String, &str, &str)> {
    let mut methods: Vec<_> = schema
        .methods
        .iter()
        .map(|m| {
            (
                format!("{}.{}", schema.service, m.method),
                m.request_type.as_str(),
                m.response_type.as_str(),
            )
        })
        .collect();
    methods.sort();
    methods
}

fn sorted_pushes(schema: &ServiceSchema) -> Vec<(&str, &str)> {
    let mut pushes: Vec<_> = schema
        .pushes
        .iter()
        .map(|p| (p.route.as_str(), p.message_type.as_str()))
        .collect();
    pushes.sort();
    pushes
}

/// Human-readable tables: services, routes, pushes, keyed services (each only when not
/// empty).
fn tables(schemas: &BTreeMap<String, ServiceSchema>) -> String {
    let mut services = vec![row(["SERVICE", "TYPED ROUTES", "PUSHES", "KEYED"])];
    let mut routes = vec![row(["ROUTE", "REQUEST", "RESPONSE"])];
    let mut pushes = vec![row(["PUSH", "MESSAGE"])];
    let mut keyed = vec![row(["KEYED SERVICE", "PARTITIONS", "SESSION KEY"])];
    for schema in schemas.values() {
        let keyed_cell = if schema.keyed.is_some() { "yes" } else { "no" };
        services.push(row([
            &schema.service,
            &schema.methods.len().to_string(),
            &schema.pushes.len().to_string(),
            keyed_cell,
        ]));
        for (route, request, response) in sorted_methods(schema) {
            routes.push(row([&route, request, response]));
        }
        for (route, message) in sorted_pushes(schema) {
            pushes.push(row([route, message]));
        }
        if let Some(k) = &schema.keyed {
            let session_key = if k.session_key.is_empty() {
                "- (the uid)"
            } else {
                &k.session_key
            };
            keyed.push(row([
                &schema.service,
                &k.partitions.to_string(),
                session_key,
            ]));
        }
    }
    [services, routes, pushes, keyed]
        .into_iter()
        .filter(|table| table.len() > 1)
        .map(|table| table_text(&table))
        .collect::<Vec<_>>()
        .join("\n")
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|&c| c.to_owned()).collect()
}

/// Columns padded to their widest cell, two spaces apart.
fn table_text(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == columns {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::rpc::{Keyed, MethodSchema, PushSchema};

    fn schemas() -> BTreeMap<String, ServiceSchema> {
        let chat = ServiceSchema {
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
            ..ServiceSchema::default()
        };
        let arena = ServiceSchema {
            service: "arena".into(),
            keyed: Some(Keyed {
                partitions: 64,
                session_key: "arena_match".into(),
            }),
            ..ServiceSchema::default()
        };
        [("chat".into(), chat), ("arena".into(), arena)].into()
    }

    #[test]
    fn tables_list_routes_pushes_and_keyed_services() {
        let text = tables(&schemas());
        assert_eq!(
            text,
            "SERVICE  TYPED ROUTES  PUSHES  KEYED\n\
             arena    0             0       yes\n\
             chat     1             1       no\n\
             \n\
             ROUTE     REQUEST                   RESPONSE\n\
             chat.say  shaddock.chat.SayRequest  shaddock.chat.SayResponse\n\
             \n\
             PUSH          MESSAGE\n\
             chat.message  shaddock.chat.ChatMessage\n\
             \n\
             KEYED SERVICE  PARTITIONS  SESSION KEY\n\
             arena          64          arena_match\n"
        );
    }

    #[test]
    fn json_names_every_part() {
        let json = to_json(&schemas());
        assert_eq!(json["services"][0]["service"], "arena");
        assert_eq!(json["services"][0]["keyed"]["partitions"], 64);
        assert_eq!(json["services"][1]["methods"][0]["route"], "chat.say");
        assert_eq!(
            json["services"][1]["pushes"][0]["message_type"],
            "shaddock.chat.ChatMessage"
        );
        assert!(json["services"][1]["keyed"].is_null());
    }
}
