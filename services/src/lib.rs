//! Worker framework and built-in services (filled by the request-path issue).
