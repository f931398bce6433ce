//! Lame duck mode, as nats-server has it: a server about to go away stops accepting,
//! tells its clients (an INFO with `"ldm":true`, on which clients such as async-nats
//! raise `LameDuckMode` and nats.go calls its lame duck handler), waits a grace period,
//! then closes them a few at a time over the rest of the lame duck duration, so they
//! reconnect elsewhere gradually instead of all in the same instant.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tracing::info;

use crate::peer::ClientShared;
use crate::state::Shared;

/// The longest pause between two closes: a handful of clients over a two-minute duration
/// need not take two minutes to leave (nats-server's cap).
pub const MAX_CLOSE_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest pause between two closes; with more clients than such pauses fit in the
/// duration, they are closed in batches.
pub const MIN_CLOSE_INTERVAL: Duration = Duration::from_millis(1);

/// How the clients are closed: `batch` at a time, `interval` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClosePlan {
    pub batch: usize,
    pub interval: Duration,
}

impl ClosePlan {
    /// Spreads `clients` closes evenly over `window`: the first batch at once, the last
    /// one `interval` before the window ends. A zero window closes everyone at once.
    pub fn new(clients: usize, window: Duration) -> ClosePlan {
        let all_at_once = ClosePlan {
            batch: clients.max(1),
            interval: Duration::ZERO,
        };
        if clients <= 1 || window.is_zero() {
            return all_at_once;
        }
        let even = window / u32::try_from(clients).unwrap_or(u32::MAX);
        if even >= MIN_CLOSE_INTERVAL {
            return ClosePlan {
                batch: 1,
                interval: even.min(MAX_CLOSE_INTERVAL),
            };
        }
        // More clients than pauses: as many batches as pauses fit, each as large as needed.
        let slots = (window.as_nanos() / MIN_CLOSE_INTERVAL.as_nanos()).max(1);
        let slots = usize::try_from(slots).unwrap_or(usize::MAX);
        ClosePlan {
            batch: clients.div_ceil(slots),
            interval: MIN_CLOSE_INTERVAL,
        }
    }
}

/// Runs lame duck mode over `clients`, the connections open when the server stopped
/// accepting; returns once the last is closed.
pub(crate) async fn run(server: &Shared, clients: Vec<Arc<ClientShared>>) {
    info!("Entering lame duck mode, stop accepting new clients");
    if clients.is_empty() {
        info!("Lame duck mode: no clients to close");
        return;
    }
    let grace = server.config.lame_duck_grace_period;
    let duration = server.config.lame_duck_duration;
    let mut told = 0;
    for client in &clients {
        if client.takes_async_info() {
            client.send(&server.info_line(client.cid, client.addr, client.in_process, true));
            told += 1;
        }
    }
    info!(
        "Lame duck mode: told {told} of {} clients; closing them after a {grace:?} grace period",
        clients.len()
    );
    tokio::time::sleep(grace).await;
    let plan = ClosePlan::new(clients.len(), duration.saturating_sub(grace));
    info!(
        "Closing existing clients, {} at a time, {:?} apart",
        plan.batch, plan.interval
    );
    let start = Instant::now();
    for (i, batch) in clients.chunks(plan.batch).enumerate() {
        // Paced from the start, so time spent closing does not stretch the schedule.
        sleep_until(start + plan.interval * u32::try_from(i).unwrap_or(u32::MAX)).await;
        for client in batch {
            client.close.cancel();
        }
    }
    info!("Lame duck mode: all {} clients closed", clients.len());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(clients: usize, window_ms: u64) -> ClosePlan {
        ClosePlan::new(clients, Duration::from_millis(window_ms))
    }

    #[test]
    fn a_zero_window_closes_everyone_at_once() {
        assert_eq!(
            plan(5, 0),
            ClosePlan {
                batch: 5,
                interval: Duration::ZERO
            }
        );
    }

    #[test]
    fn a_single_client_is_closed_at_once() {
        assert_eq!(plan(1, 10_000).interval, Duration::ZERO);
    }

    #[test]
    fn clients_are_spread_evenly_over_the_window() {
        assert_eq!(
            plan(4, 800),
            ClosePlan {
                batch: 1,
                interval: Duration::from_millis(200)
            }
        );
    }

    #[test]
    fn the_interval_is_capped() {
        assert_eq!(plan(10, 110_000).interval, MAX_CLOSE_INTERVAL);
    }

    #[test]
    fn more_clients_than_intervals_are_closed_in_batches() {
        // 100 intervals of 1 ms fit in 100 ms: 1000 clients go 10 at a time.
        assert_eq!(
            plan(1000, 100),
            ClosePlan {
                batch: 10,
                interval: MIN_CLOSE_INTERVAL
            }
        );
        // At the edge, one per interval.
        assert_eq!(plan(100, 100).batch, 1);
        assert_eq!(plan(101, 100).batch, 2);
        // A window shorter than one interval: everyone in one batch.
        assert_eq!(plan(7, 0).batch, 7);
        assert_eq!(ClosePlan::new(7, Duration::from_micros(500)).batch, 7);
    }
}
