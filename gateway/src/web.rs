//! The demo page the gate serves over plain HTTP on its WebSocket port (a GET without
//! the upgrade headers, see [`crate::upgrade`]): chat and echo with a live latency
//! histogram, built from the TypeScript SDK (`clients/ts`, `npm run build` writes
//! `gateway/web/`) and embedded here, so a gate serves it with nothing else installed.
//! `--no-web` turns it off.

/// The content type and body for `path` (without its query string), if there is one.
pub fn respond(path: &str) -> Option<(&'static str, &'static [u8])> {
    Some(match path {
        "/" | "/index.html" => (
            "text/html; charset=utf-8",
            include_bytes!("../web/index.html"),
        ),
        "/app.js" => (
            "text/javascript; charset=utf-8",
            include_bytes!("../web/app.js"),
        ),
        "/app.css" => ("text/css; charset=utf-8", include_bytes!("../web/app.css")),
        _ => return None,
    })
}
