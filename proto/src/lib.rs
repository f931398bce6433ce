//! Client and gate↔worker envelopes (filled by the request-path issue).
