//! The pomelo wire protocol, which pomelo, pitaya, nano and cherry clients speak, on the
//! gate's WebSocket port (docs/pomelo.md).
//!
//! - [`wire`]: packages and messages as bytes, pure (public: the load test's pomelo
//!   client speaks it too).
//! - `session`: one session's side of it, as the codec the session core calls: the
//!   handshake answer with the dictionary, the handshake-ack step, routes by string or
//!   code, JSON bodies, responses with the error flag, pushes and kicks.

mod session;
pub mod wire;

pub(crate) use session::{PomeloCodec, PomeloPush, heartbeat_secs};
