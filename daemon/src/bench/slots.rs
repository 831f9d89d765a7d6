//! Concurrency slots of a benchmark: a fixed number (`--batch-sizes`), or a number that
//! follows a ramp over time (`--ramp-over concurrency`, see [`Ramp::concurrency_at`]).
//!
//! A ramped limit is checked when a slot is asked for, again whenever a slot is freed, and
//! every [`TICK`] while the caller waits (so a rising limit is taken up within about a
//! millisecond). A falling limit (sawtooth) takes no request back: no new one goes until
//! fewer than the new limit are in flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::workload::Ramp;

/// How often a waiting caller re-reads a ramped limit.
pub const TICK: Duration = Duration::from_millis(1);

/// The slots of one benchmark.
#[derive(Debug)]
pub enum Slots {
    /// At most this many in flight.
    Fixed {
        sem: Arc<Semaphore>,
        limit: usize,
        freed_at: FreedAt,
    },
    /// At most `ramp.concurrency_at(now − t0)` in flight; none given after `deadline`.
    Ramp {
        ramp: Ramp,
        t0: Instant,
        deadline: Option<Instant>,
        in_flight: Arc<AtomicUsize>,
        freed: Arc<Notify>,
        freed_at: FreedAt,
    },
}

/// When a slot was last freed (stamped by [`Slot`]'s drop before the slot is given back).
type FreedAt = Arc<Mutex<Option<Instant>>>;

fn stamp(freed_at: &FreedAt) {
    if let Ok(mut t) = freed_at.lock() {
        *t = Some(Instant::now());
    }
}

/// A taken slot; dropping it frees it.
#[derive(Debug)]
pub enum Slot {
    Fixed(OwnedSemaphorePermit, FreedAt),
    Ramp {
        in_flight: Arc<AtomicUsize>,
        freed: Arc<Notify>,
        freed_at: FreedAt,
    },
}

impl Drop for Slot {
    fn drop(&mut self) {
        match self {
            // The stamp first: the permit goes back when the fields drop, after this.
            Slot::Fixed(_, freed_at) => stamp(freed_at),
            Slot::Ramp {
                in_flight,
                freed,
                freed_at,
            } => {
                stamp(freed_at);
                in_flight.fetch_sub(1, Ordering::AcqRel);
                freed.notify_one();
            }
        }
    }
}

impl Slots {
    /// `limit` slots (at least 1).
    pub fn fixed(limit: usize) -> Self {
        let limit = limit.max(1);
        Self::Fixed {
            sem: Arc::new(Semaphore::new(limit)),
            limit,
            freed_at: FreedAt::default(),
        }
    }

    /// Slots that follow a concurrency ramp whose time 0 is `t0`; none are given after
    /// `deadline` (`--duration`).
    pub fn ramp(ramp: Ramp, t0: Instant, deadline: Option<Instant>) -> Self {
        Self::Ramp {
            ramp,
            t0,
            deadline,
            in_flight: Arc::default(),
            freed: Arc::new(Notify::new()),
            freed_at: FreedAt::default(),
        }
    }

    /// Requests in flight now (slots taken and not yet dropped).
    pub fn in_flight(&self) -> usize {
        match self {
            Self::Fixed { sem, limit, .. } => limit - sem.available_permits().min(*limit),
            Self::Ramp { in_flight, .. } => in_flight.load(Ordering::Acquire),
        }
    }

    /// Waits for a free slot. Returns it with the limit in force when it was taken (the
    /// `concurrency_limit` of `requests.jsonl`), or `None` past the deadline.
    pub async fn acquire(&self) -> Option<(Slot, usize)> {
        self.acquire_timed().await.map(|(s, l, _)| (s, l))
    }

    /// [`Slots::acquire`], with the moment the slot it gives became free: the call's time
    /// when one was free, else when a request ended and freed it (or a ramped limit rose).
    /// A closed loop's dispatch delay counts from there.
    pub async fn acquire_timed(&self) -> Option<(Slot, usize, Instant)> {
        let asked = Instant::now();
        let free_since = |freed_at: &FreedAt, waited: bool| {
            let stamped = freed_at.lock().ok().and_then(|t| *t);
            if waited {
                stamped.filter(|t| *t > asked).unwrap_or_else(Instant::now)
            } else {
                asked
            }
        };
        match self {
            Self::Fixed {
                sem,
                limit,
                freed_at,
            } => {
                if let Ok(p) = sem.clone().try_acquire_owned() {
                    return Some((Slot::Fixed(p, freed_at.clone()), *limit, asked));
                }
                let p = sem.clone().acquire_owned().await.ok()?;
                Some((
                    Slot::Fixed(p, freed_at.clone()),
                    *limit,
                    free_since(freed_at, true),
                ))
            }
            Self::Ramp {
                ramp,
                t0,
                deadline,
                in_flight,
                freed,
                freed_at,
            } => loop {
                // Registered before the check, so a slot freed in between still wakes us.
                let woken = freed.notified();
                let now = Instant::now();
                if deadline.is_some_and(|d| now > d) {
                    return None;
                }
                let limit = ramp.concurrency_at(now.saturating_duration_since(*t0).as_secs_f64());
                if in_flight
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n < limit).then_some(n + 1)
                    })
                    .is_ok()
                {
                    let since = free_since(freed_at, now > asked);
                    return Some((
                        Slot::Ramp {
                            in_flight: in_flight.clone(),
                            freed: freed.clone(),
                            freed_at: freed_at.clone(),
                        },
                        limit,
                        since,
                    ));
                }
                tokio::select! {
                    () = woken => {}
                    () = tokio::time::sleep(TICK) => {}
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::workload::RampOver;

    #[tokio::test(start_paused = true)]
    async fn ramped_slots_follow_the_limit() {
        let ramp = Ramp::new_over(
            "sawtooth",
            1.0,
            4.0,
            Duration::from_secs(3),
            RampOver::Concurrency,
        )
        .unwrap();
        let t0 = Instant::now();
        let slots = Slots::ramp(ramp, t0, Some(t0 + Duration::from_secs(5)));
        // t = 0: limit 1.
        let (a, l) = slots.acquire().await.unwrap();
        assert_eq!((l, slots.in_flight()), (1, 1));
        // The second waits until the limit is 2: r(t) = 1 + t ≥ 1.5 at t = 0.5 s.
        let (b, l) = slots.acquire().await.unwrap();
        assert_eq!(l, 2);
        let waited = (Instant::now() - t0).as_secs_f64();
        assert!((0.5..0.502).contains(&waited), "second slot at {waited} s");
        // Up to 4 in flight by t = 2.5 s.
        let (c, _) = slots.acquire().await.unwrap();
        let (d, l) = slots.acquire().await.unwrap();
        assert_eq!((l, slots.in_flight()), (4, 4));
        assert!(((Instant::now() - t0).as_secs_f64() - 2.5).abs() < 0.002);
        // After the fall at t = 3 s the limit is 1: freeing one slot of four gives nothing
        // until fewer than the limit are in flight.
        tokio::time::sleep_until(t0 + Duration::from_millis(3100)).await;
        drop(a);
        let next = tokio::time::timeout(Duration::from_millis(300), slots.acquire()).await;
        assert!(next.is_err(), "3 in flight > limit 1");
        drop((b, c, d));
        let (_e, l) = slots.acquire().await.unwrap();
        assert_eq!((l, slots.in_flight()), (1, 1));
        // Past the deadline: none.
        tokio::time::sleep_until(t0 + Duration::from_millis(5001)).await;
        assert!(slots.acquire().await.is_none());
        // Fixed slots report their limit.
        let f = Slots::fixed(3);
        let (_s, l) = f.acquire().await.unwrap();
        assert_eq!((l, f.in_flight()), (3, 1));
    }

    /// A closed loop's delay counts from the moment the slot became free, not from the start.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_slot_is_free_since_its_holder_ended() {
        let f = Arc::new(Slots::fixed(1));
        let t0 = Instant::now();
        let (a, _, since) = f.acquire_timed().await.unwrap();
        assert_eq!(since, t0, "free at the call");
        let f2 = f.clone();
        let waiter = tokio::spawn(async move { f2.acquire_timed().await.map(|(_, _, s)| s) });
        tokio::time::sleep(Duration::from_millis(700)).await;
        drop(a);
        let since = waiter.await.unwrap().unwrap();
        assert_eq!(
            since - t0,
            Duration::from_millis(700),
            "freed when the holder ended, 700 ms after the call"
        );
        // A free slot asked for later: free since the call.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (_b, _, since) = f.acquire_timed().await.unwrap();
        assert_eq!(since - t0, Duration::from_millis(1000));
    }
}
