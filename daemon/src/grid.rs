//! The agent's shared tick grid: periodic housekeeping (judging the canaries in flight for
//! spike mode, the diagnosis step) ticks on multiples of its period from one process-wide
//! epoch, so the work of every target wakes the runtime once per period instead of once per
//! target (each wake-up of the runtime's thread costs more than the work it does: 8 targets
//! found at different times would add 8 of the ~130 wake-ups a second of `agent_cost`).
//!
//! Not for work whose bursts would delay a canary's timestamps (page scrapes stay spread).

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior};

/// The grid's origin: the first call's instant.
static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();

/// The first instant after `now` that is a whole number of `period`s after `epoch` (`now`
/// itself never: a tick is always ahead); the grid extends before the epoch too. A zero
/// `period` is taken as 1 ns.
pub fn next_on_grid(epoch: Instant, now: Instant, period: Duration) -> Instant {
    let p = period.as_nanos().max(1);
    // How far `now` is into its period: the grid runs both ways from the epoch (a paused test
    // clock may read earlier than the epoch taken from the real one).
    let into = match now.checked_duration_since(epoch) {
        Some(after) => after.as_nanos() % p,
        None => (p - (epoch - now).as_nanos() % p) % p,
    };
    // `into < p <= period`, and both fit in u64 nanoseconds for any period a tick uses.
    now + Duration::from_nanos(u64::try_from(p - into).unwrap_or(u64::MAX))
}

/// An interval whose ticks fall on the shared grid of `period` (the first one period or less
/// from now). Missed ticks are skipped, so it stays on the grid after a stall.
pub fn interval(period: Duration) -> Interval {
    let epoch = Instant::from_std(*EPOCH.get_or_init(std::time::Instant::now));
    let now = Instant::now();
    let mut i = tokio::time::interval_at(next_on_grid(epoch, now, period), period);
    i.set_missed_tick_behavior(MissedTickBehavior::Skip);
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_on_grid_is_the_following_multiple_of_the_period() {
        let e = Instant::now();
        let s = Duration::from_secs(1);
        let ms = Duration::from_millis;
        assert_eq!(next_on_grid(e, e, s), e + s);
        assert_eq!(next_on_grid(e, e + ms(1), s), e + s);
        assert_eq!(next_on_grid(e, e + ms(999), s), e + s);
        assert_eq!(next_on_grid(e, e + ms(1000), s), e + ms(2000));
        assert_eq!(next_on_grid(e, e + ms(3250), s), e + ms(4000));
        // Before the epoch (a paused clock): the grid extends back from it.
        assert_eq!(next_on_grid(e + ms(500), e, s), e + ms(500));
        assert_eq!(next_on_grid(e + ms(500), e + ms(500), s), e + ms(1500));
        assert_eq!(next_on_grid(e + ms(2500), e + ms(100), s), e + ms(500));
        assert_eq!(
            next_on_grid(e, e + ms(7), Duration::ZERO),
            e + ms(7) + Duration::from_nanos(1)
        );
    }

    /// Two intervals made 300 ms apart tick at the same instants (once both run).
    #[tokio::test(start_paused = true)]
    async fn intervals_made_apart_tick_together() {
        let mut a = interval(Duration::from_secs(1));
        tokio::time::advance(Duration::from_millis(300)).await;
        let mut b = interval(Duration::from_secs(1));
        let mut ta = a.tick().await;
        for _ in 0..3 {
            let tb = b.tick().await;
            // `a` may have one tick of its own before `b`'s first.
            while ta < tb {
                ta = a.tick().await;
            }
            assert_eq!(ta, tb);
        }
    }
}
