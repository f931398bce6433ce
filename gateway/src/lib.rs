//! WebSocket gate: sessions, routing, limits (filled by the request-path issue).
