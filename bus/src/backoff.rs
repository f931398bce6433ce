//! Time between rounds of connection attempts: exponential, capped, jittered, so that
//! the gates of a fleet that lost their bus together do not all come back at once.

use std::time::Duration;

/// The first pause after a round of servers failed.
pub(super) const RECONNECT_MIN: Duration = Duration::from_millis(50);
/// The longest pause between rounds.
pub(super) const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The pause after `failed_rounds` rounds (1 or more) failed: the capped exponential
/// delay, scaled by a random factor in [0.5, 1.0).
pub(super) fn delay(failed_rounds: u32) -> Duration {
    let shift = failed_rounds.saturating_sub(1).min(16);
    let full = RECONNECT_MIN.saturating_mul(1 << shift).min(RECONNECT_MAX);
    full.mul_f64(0.5 + fastrand::f64() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps_and_jitters() {
        for _ in 0..200 {
            let first = delay(1);
            assert!(
                first >= RECONNECT_MIN / 2 && first < RECONNECT_MIN,
                "{first:?}"
            );
            let third = delay(3);
            assert!(
                third >= RECONNECT_MIN * 2 && third < RECONNECT_MIN * 4,
                "{third:?}"
            );
            let late = delay(1000);
            assert!(
                late >= RECONNECT_MAX / 2 && late < RECONNECT_MAX,
                "{late:?}"
            );
        }
        let spread: std::collections::HashSet<Duration> = (0..50).map(|_| delay(5)).collect();
        assert!(spread.len() > 10, "jittered, not fixed");
    }
}
