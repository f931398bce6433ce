//! The gate's pomelo route dictionary: every route the workers announced, with the
//! 2-byte code a pomelo client may send instead of the route string, and the gate
//! sends instead of a push's route.
//!
//! Codes only ever grow: a session keeps the dictionary its handshake gave it for its
//! whole life, so a code once given can never mean another route. Entries: request
//! routes as `<service>.<service>.<method>` (pitaya's `room.room.join` shape), push
//! routes as announced (`chat.message`). Codes start at 1 (pomelo's clients treat a
//! code of 0 as none). Only routes of announced services are here: any other route is
//! sent as a string.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Codes are 2 bytes and 0 is unused, so this many routes at most; later routes are
/// sent as strings. Fed by the (trusted) workers' announcements, never by clients.
pub const MAX_ROUTES: usize = u16::MAX as usize;

/// One version of the dictionary; sessions hold the one of their handshake.
#[derive(Debug, Default)]
pub(crate) struct Dict {
    /// By code - 1: the Shaddock route (`service.method`, or the push route).
    routes: Vec<Arc<str>>,
    codes: HashMap<Arc<str>, u16>,
    /// The handshake's `dict` object, made once per version.
    pub json: String,
}

impl Dict {
    /// The Shaddock route of request route `code`, if this version has it.
    pub fn route(&self, code: u16) -> Option<&Arc<str>> {
        self.routes.get(usize::from(code).checked_sub(1)?)
    }

    /// The code of a pomelo route string (`svc.svc.method` or a push route).
    pub fn code(&self, pomelo_route: &str) -> Option<u16> {
        self.codes.get(pomelo_route).copied()
    }

    /// Whether this version knows `code`: codes are never reused, so a later
    /// version's code is known here exactly when it is not past the end.
    pub fn knows(&self, code: u16) -> bool {
        usize::from(code) <= self.routes.len()
    }
}

/// The growing dictionary of one gate.
#[derive(Debug, Default)]
pub(crate) struct RouteDict(RwLock<Arc<Dict>>);

impl RouteDict {
    /// The current version.
    pub fn current(&self) -> Arc<Dict> {
        self.0.read().map(|d| d.clone()).unwrap_or_default()
    }

    /// Adds a service's methods and push routes it does not have yet.
    pub fn add(&self, service: &str, methods: &[&str], pushes: &[&str]) {
        let new: Vec<(String, Arc<str>)> = {
            let current = self.current();
            let requests = methods
                .iter()
                .map(|m| (format!("{service}.{service}.{m}"), format!("{service}.{m}")));
            let pushes = pushes.iter().map(|p| (p.to_string(), p.to_string()));
            requests
                .chain(pushes)
                .filter(|(pomelo, _)| current.code(pomelo).is_none())
                .map(|(pomelo, route)| (pomelo, route.into()))
                .collect()
        };
        if new.is_empty() {
            return;
        }
        let Ok(mut guard) = self.0.write() else {
            return;
        };
        let mut routes = guard.routes.clone();
        let mut codes = guard.codes.clone();
        for (pomelo, route) in new {
            if routes.len() >= MAX_ROUTES || codes.contains_key(pomelo.as_str()) {
                continue;
            }
            routes.push(route);
            codes.insert(pomelo.into(), routes.len() as u16);
        }
        let json = serde_json::Value::Object(
            codes
                .iter()
                .map(|(route, code)| (route.to_string(), (*code).into()))
                .collect(),
        )
        .to_string();
        *guard = Arc::new(Dict {
            routes,
            codes,
            json,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_start_at_one_and_never_change() {
        let dict = RouteDict::default();
        let first = dict.current();
        assert_eq!(first.json, "");
        dict.add("chat", &["join", "say"], &["chat.message"]);
        let second = dict.current();
        assert_eq!(second.code("chat.chat.join"), Some(1));
        assert_eq!(second.code("chat.chat.say"), Some(2));
        assert_eq!(second.code("chat.message"), Some(3));
        assert_eq!(second.route(1).map(|r| &**r), Some("chat.join"));
        assert_eq!(second.route(3).map(|r| &**r), Some("chat.message"));
        assert_eq!(second.route(0), None);
        assert_eq!(second.route(4), None);
        // Announced again, with one method more: old codes stay.
        dict.add("chat", &["join", "say", "leave"], &["chat.message"]);
        let third = dict.current();
        assert_eq!(third.code("chat.chat.join"), Some(1));
        assert_eq!(third.code("chat.chat.leave"), Some(4));
        assert!(second.knows(3) && !second.knows(4) && third.knows(4));
        assert!(!first.knows(1));
        let json: serde_json::Value = serde_json::from_str(&third.json).unwrap();
        assert_eq!(json["chat.chat.leave"], 4);
        assert_eq!(json["chat.message"], 3);
    }
}
