//! The gate's own requests over the bus (bind probes, resume take-overs): each one's
//! answer comes back on the gate's reply subject with sid 0 ([`GATE_SID`]),
//! `<prefix>.gw.<gate>.0.<id>`, and is handed to the task waiting for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bus::{Bus, Reply};
use bytes::Bytes;
use rustc_hash::FxHashMap;
use tokio::sync::oneshot;

use crate::bus_target::Target;
use crate::config::GateConfig;
use crate::sessions::GATE_SID;

pub(crate) struct Asks {
    bus: Arc<Bus<Target>>,
    /// `<prefix>.gw.<gate>.0.`
    reply_prefix: String,
    waiting: Mutex<FxHashMap<u64, oneshot::Sender<Option<Bytes>>>>,
    next: AtomicU64,
}

impl Asks {
    pub(crate) fn new(config: &GateConfig, bus: Arc<Bus<Target>>) -> Self {
        Asks {
            bus,
            reply_prefix: format!("{}.gw.{}.{GATE_SID}.", config.prefix, config.gate_id),
            waiting: Mutex::default(),
            next: AtomicU64::new(1),
        }
    }

    /// Sends `payload` to `subject` as a request and waits at most `timeout` for the
    /// answer: `None` when nobody answered (no responders, silence, or no bus).
    pub(crate) async fn ask(
        &self,
        subject: &str,
        payload: &[u8],
        timeout: Duration,
    ) -> Option<Bytes> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id, tx);
        let reply = Reply::Request {
            prefix: &self.reply_prefix,
            id,
        };
        let answer = match self.bus.publish_bytes(subject, reply, payload) {
            Ok(()) => tokio::time::timeout(timeout, rx)
                .await
                .ok()
                .and_then(Result::ok)
                .flatten(),
            Err(_) => None,
        };
        self.lock().remove(&id);
        answer
    }

    /// The answer to request `id` came back: its payload, or `None` for "no responders".
    pub(crate) fn answer(&self, id: u64, answer: Option<Bytes>) {
        if let Some(waiter) = self.lock().remove(&id) {
            let _ = waiter.send(answer);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<u64, oneshot::Sender<Option<Bytes>>>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
