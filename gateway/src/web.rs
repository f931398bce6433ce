//! Pages the gate serves over plain HTTP on its WebSocket port: a GET without the
//! upgrade headers is answered from here (by [`crate::upgrade`]), 404 when there is
//! nothing for its path.

/// The content type and body for `path` (without its query string), if there is one.
pub fn respond(path: &str) -> Option<(&'static str, &'static [u8])> {
    let _ = path;
    None
}
