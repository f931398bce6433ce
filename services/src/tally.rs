//! `tally`: a count per key, the smallest keyed service, what keyed routing is tested
//! with (`gateway/tests/keyed.rs`, `tests/mixed_keyed.rs`); the same service in
//! TypeScript is `workers/ts/src/services/tally.ts`, so the two share one keyed service.
//!
//! `tally.add` (raw, any body) counts one for the request's key and answers
//! `"<worker> <count>"`: a key whose answers count 1, 2, 3, ... lost no request and ran
//! none twice, whichever workers answered. A partition's counts move with it, and reach
//! its standby after every frame, as `<key>=<count>\n` lines (the count after the last
//! `=`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use proto::keyed::partition_of;

use crate::handler_error::HandlerError;
use crate::service::Service;

/// The service's name.
pub const NAME: &str = "tally";
/// Its partitions: few, so a handful of keys covers them all.
pub const PARTITIONS: u32 = 8;

/// The tally service, answering as `worker`; `fresh` counts the partitions it took on
/// with no state.
pub fn service(worker: impl Into<String>, fresh: Arc<AtomicUsize>) -> Service {
    let worker = worker.into();
    let counts: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let (on_add, on_hand_over) = (counts.clone(), counts.clone());
    let (on_snapshot, on_take_over) = (counts.clone(), counts);
    Service::new(NAME)
        .keyed(PARTITIONS)
        .raw_method("add", move |ctx, _| {
            let key = ctx
                .key()
                .ok_or_else(|| HandlerError::bad_request("tally.add counts per key: give one"))?
                .to_owned();
            let mut counts = on_add.lock().unwrap_or_else(PoisonError::into_inner);
            let count = counts.entry(key).or_default();
            *count += 1;
            Ok(Bytes::from(format!("{worker} {count}")))
        })
        .on_hand_over(move |_, partition| lines(&on_hand_over, partition, true))
        .on_snapshot(move |partition| lines(&on_snapshot, partition, false))
        .on_take_over(move |_, _, state| match state {
            Some(state) => {
                let mut counts = on_take_over.lock().unwrap_or_else(PoisonError::into_inner);
                for line in String::from_utf8_lossy(&state).lines() {
                    let parsed = line
                        .rsplit_once('=')
                        .and_then(|(key, count)| Some((key, count.parse().ok()?)));
                    match parsed {
                        Some((key, count)) => {
                            counts.insert(key.to_owned(), count);
                        }
                        None => tracing::warn!(line, "a tally line that does not parse"),
                    }
                }
            }
            None => {
                fresh.fetch_add(1, Ordering::Relaxed);
            }
        })
}

/// `partition`'s counts as `<key>=<count>` lines, forgotten here when `forget`.
fn lines(counts: &Mutex<HashMap<String, u64>>, partition: u32, forget: bool) -> Bytes {
    let mut state = String::new();
    let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
    counts.retain(|key, count| {
        let here = partition_of(key.as_bytes(), PARTITIONS) == partition;
        if here {
            state.push_str(&format!("{key}={count}\n"));
        }
        !(here && forget)
    });
    Bytes::from(state)
}
