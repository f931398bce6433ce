//! What a partition's last holder took, for a while after the partition came here
//! (docs/workers.md, "Order across subscriptions").

use std::collections::HashMap;
use std::time::Duration;

use proto::Message as _;
use proto::rpc::RequestOrder;
use tokio::time::Instant;

/// The `seen` a partition came with: per origin, the highest `seq` its last holder took.
/// A request at or below it that reaches this worker after the state is one that holder
/// took: no order holds between a worker's subscriptions (nor between its connections in
/// a move), so the state may overtake it, and it must not run again. An origin is
/// forgotten at its first request above it (one origin's requests come in order: none
/// at or below can follow), and everything once the member timeout has passed since the
/// take, so an origin reused with its numbers started again (a gate restarted under a
/// fixed `--gate-id`) is not dropped for longer than that.
#[derive(Debug, Default)]
pub(super) struct TakenBefore {
    seen: HashMap<String, u64>,
    until: Option<Instant>,
}

impl TakenBefore {
    /// What `seen` says, kept for `keep` from now.
    pub(super) fn new(seen: HashMap<String, u64>, keep: Duration) -> Self {
        TakenBefore {
            seen,
            until: Some(Instant::now() + keep),
        }
    }

    /// Whether request `payload` is one the last holder took; forgets what can no longer
    /// come. Decodes nothing once everything is forgotten.
    pub(super) fn took(&mut self, payload: &[u8]) -> bool {
        if self.seen.is_empty() {
            return false;
        }
        if self.until.is_none_or(|until| Instant::now() >= until) {
            self.seen = HashMap::new();
            return false;
        }
        let Ok(order) = RequestOrder::decode(payload) else {
            return false;
        };
        match self.seen.get(&order.origin) {
            Some(&highest) if order.seq <= highest => true,
            Some(_) => {
                self.seen.remove(&order.origin);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(origin: &str, seq: u64) -> Vec<u8> {
        RequestOrder {
            origin: origin.into(),
            seq,
        }
        .encode_to_vec()
    }

    #[test]
    fn what_the_last_holder_took_is_dropped_until_its_origin_goes_past_it() {
        let seen = HashMap::from([("g.1".to_owned(), 5), ("g.2".to_owned(), 9)]);
        let mut taken = TakenBefore::new(seen, Duration::from_secs(60));
        assert!(taken.took(&request("g.1", 4)));
        assert!(taken.took(&request("g.1", 5)));
        assert!(!taken.took(&request("g.3", 1)), "an origin it never saw");
        assert!(!taken.took(&request("", 1)), "no origin");
        assert!(
            !taken.took(b"\xff\xff"),
            "does not decode: served, as before"
        );
        assert!(!taken.took(&request("g.1", 6)));
        assert!(
            !taken.took(&request("g.1", 2)),
            "past it once: the origin is forgotten (its numbers started again)"
        );
        assert!(taken.took(&request("g.2", 9)), "other origins are kept");
    }

    #[test]
    fn everything_is_forgotten_after_the_time_it_is_kept() {
        let seen = HashMap::from([("g.1".to_owned(), 5)]);
        let mut taken = TakenBefore::new(seen, Duration::ZERO);
        assert!(!taken.took(&request("g.1", 1)));
        assert!(!TakenBefore::default().took(&request("g.1", 1)));
    }
}
