//! When canaries are sent: an absolute schedule that never drifts.
//!
//! Request `i` is due at `t0 + gap_1 + … + gap_i`. The ticker sleeps until that instant and
//! never sleeps when behind, so time spent dispatching does not push later requests back (the
//! drift of `../shared/cases/sse/06_vllm_21104_arrival_drift.json`); how late a tick fired is
//! returned with the tick ([`Tick::lag`]; no metric carries it).

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::config::{Arrival, Schedule};

/// Draws the gaps between arrivals.
#[derive(Debug)]
pub struct Gaps {
    schedule: Schedule,
    rng: SmallRng,
}

/// How long before a due time the ticker stops sleeping and starts yielding.
pub const SPIN_BEFORE: Duration = Duration::from_micros(1500);

/// Interval schedules are jittered uniformly by this fraction each way.
pub const INTERVAL_JITTER: f64 = 0.1;

impl Gaps {
    pub fn new(schedule: Schedule, seed: u64) -> Self {
        Self {
            schedule,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// The next gap: uniform in period × [0.9, 1.1] for an interval; exponential with mean
    /// 1/rate (inverse transform, −ln(1−U)/λ) for Poisson; 1/rate for constant.
    pub fn next_gap(&mut self) -> Duration {
        match self.schedule {
            Schedule::Interval { period } => {
                let f: f64 = self
                    .rng
                    .random_range((1.0 - INTERVAL_JITTER)..=(1.0 + INTERVAL_JITTER));
                period.mul_f64(f)
            }
            Schedule::Rate {
                per_second,
                arrival: Arrival::Constant,
            } => Duration::from_secs_f64(1.0 / per_second),
            Schedule::Rate {
                per_second,
                arrival: Arrival::Poisson,
            } => {
                let u: f64 = self.rng.random();
                Duration::from_secs_f64(-(1.0 - u).ln() / per_second)
            }
        }
    }
}

/// Waits until `at` (returns at once when it has passed): tokio's timer until [`SPIN_BEFORE`]
/// ahead, then yielding in a loop, so the wake-up is exact to well under a millisecond.
pub async fn wait_until(at: Instant) {
    wait_until_spinning(at, SPIN_BEFORE).await;
}

/// [`wait_until`] with `spin` of yielding before `at` instead of [`SPIN_BEFORE`] (zero: the
/// timer alone, up to one of its 1 ms ticks late).
async fn wait_until_spinning(at: Instant, spin: Duration) {
    if let Some(coarse) = at.checked_sub(spin)
        && coarse > Instant::now()
    {
        tokio::time::sleep_until(coarse).await;
    }
    while Instant::now() < at {
        tokio::task::yield_now().await;
    }
}

/// How long before a due time [`pace_until`] stops sleeping and spins.
pub const PACER_SPIN: Duration = Duration::from_micros(30);

/// Sets this thread's timer slack to 1 µs (Linux `PR_SET_TIMERSLACK`; the default 50 µs lets
/// the kernel fire a sleeping thread's timer that much late). Best effort: a failure leaves the
/// default slack, which [`pace_until`]'s spin still absorbs in part.
pub fn pacer_thread_init() {
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes a plain integer and only affects this thread.
    unsafe {
        libc::prctl(
            libc::PR_SET_TIMERSLACK,
            1000 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        );
    }
}

/// Blocks the calling OS thread until `at` (returns at once when it has passed): the kernel's
/// high-resolution sleep until [`PACER_SPIN`] ahead, then a spin. For a dispatcher on its own
/// thread (`lmperf run`): at thousands of sends per second it costs a few µs of CPU per send,
/// where [`wait_until`]'s yield loop on a runtime worker would take a whole core.
pub fn pace_until(at: std::time::Instant) {
    loop {
        let now = std::time::Instant::now();
        let Some(left) = at.checked_duration_since(now).filter(|l| !l.is_zero()) else {
            return;
        };
        if left > PACER_SPIN {
            std::thread::sleep(left - PACER_SPIN);
        } else {
            std::hint::spin_loop();
        }
    }
}

/// One due request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// Sequence number, from 0.
    pub seq: u64,
    /// When it was due.
    pub scheduled: Instant,
    /// How late the ticker woke for it.
    pub lag: Duration,
}

/// Yields ticks on the absolute schedule.
#[derive(Debug)]
pub struct Ticker {
    gaps: Gaps,
    next: Instant,
    seq: u64,
    /// How long before each due time the ticker yields in a loop ([`SPIN_BEFORE`], or zero
    /// for [`coarse`](Self::coarse)).
    spin: Duration,
}

impl Ticker {
    /// First tick at `start`.
    pub fn new(gaps: Gaps, start: Instant) -> Self {
        Self {
            gaps,
            next: start,
            seq: 0,
            spin: SPIN_BEFORE,
        }
    }

    /// Wakes on tokio's timer alone: each tick up to one timer tick (1 ms) late ([`Tick::lag`]),
    /// and no spinning. For the agent's canaries: a canary's latency is timed from
    /// its own send, so a millisecond on its due time changes no measurement, while yielding
    /// for up to [`SPIN_BEFORE`] before each one was 40 % of the agent's CPU (8 targets at 1
    /// canary/s, `tests/benches/agent_cost.rs`: 1.11 % of a core with it, 0.71 % without).
    pub fn coarse(self) -> Self {
        Self {
            spin: Duration::ZERO,
            ..self
        }
    }

    /// First tick after a random share of one gap, so targets and agents started together
    /// spread out.
    pub fn staggered(mut gaps: Gaps, now: Instant) -> Self {
        let first = gaps.next_gap().mul_f64(gaps.rng.random::<f64>());
        Self::new(gaps, now + first)
    }

    /// Waits until the next request is due (returns at once when behind).
    ///
    /// tokio's timer wheel has 1 ms ticks and wakes up to a tick late, so the ticker sleeps
    /// until [`SPIN_BEFORE`] ahead of the due time and yields in a loop for the rest: dispatch
    /// is then exact to well under a millisecond, at the cost of at most that much spinning
    /// (yielding) per request. A [`coarse`](Self::coarse) ticker only sleeps.
    pub async fn tick(&mut self) -> Tick {
        wait_until_spinning(self.next, self.spin).await;
        let now = Instant::now();
        let tick = Tick {
            seq: self.seq,
            scheduled: self.next,
            lag: now.saturating_duration_since(self.next),
        };
        self.seq += 1;
        self.next += self.gaps.next_gap();
        tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `../shared/cases/sse/06_vllm_21104_arrival_drift.json`: 5 ms gaps with 0.45 ms of
    /// client work per dispatch must still dispatch at 0, 5, 10, … ms, and a long run at
    /// 200 req/s must achieve ≥ 198 req/s (a drifting loop, sleeping each gap after its work,
    /// dispatches at 0, 5.45, 10.9, … and gets 183.5 req/s).
    ///
    /// On tokio's paused clock, the client's work advancing it: exact, whatever else the
    /// machine is doing (a real-clock version failed beside CI's e2e tests: a starved thread
    /// is late however it schedules). The ticker is the coarse one (the spinning one yields
    /// until its due time, which a paused clock, moving only while the runtime is idle, never
    /// reaches; both take each due time as the previous one plus a gap). The coarse one wakes
    /// on tokio's 1 ms timer ticks, so each dispatch is due exactly and sent within one tick
    /// of it; the case's ±0.5 ms is the spinning ticker's, on an idle machine.
    #[tokio::test(start_paused = true)]
    async fn case_06_vllm_21104_arrival_drift() {
        let case: serde_json::Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/cases/sse/06_vllm_21104_arrival_drift.json"
        ))
        .unwrap();
        let work = Duration::from_secs_f64(
            case["input"]["per_dispatch_client_work_ms"]
                .as_f64()
                .unwrap()
                / 1000.0,
        );
        let tolerance = case["expected"]["tolerance_ms"].as_f64().unwrap();
        let timer_tick_ms = 1.0;
        let offsets = |key: &str| -> Vec<f64> {
            case["expected"][key]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        };
        let want = offsets("dispatch_offsets_ms");
        let wrong = offsets("wrong_offsets_ms");
        let gap_ms = case["input"]["intervals_ms"][0].as_f64().unwrap();
        let schedule = Schedule::Rate {
            per_second: 1000.0 / gap_ms,
            arrival: Arrival::Constant,
        };

        let t0 = Instant::now() + Duration::from_millis(5);
        let mut ticker = Ticker::new(Gaps::new(schedule, 1), t0).coarse();
        let mut got = Vec::new();
        for w in &want {
            let tick = ticker.tick().await;
            got.push((Instant::now() - t0).as_secs_f64() * 1000.0);
            let due = (tick.scheduled - t0).as_secs_f64() * 1000.0;
            assert!((due - w).abs() < 1e-6, "due at {due} ms, want {w}");
            tokio::time::advance(work).await;
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                *g >= *w && g - w < timer_tick_ms,
                "dispatch {i} at {g} ms, want {w} to {w} + {timer_tick_ms} (all: {got:?})"
            );
        }
        // Lateness never adds up: the last is nowhere near the drifting loop's.
        let (g, w) = (got[got.len() - 1], wrong[wrong.len() - 1]);
        assert!(w - g > tolerance, "dispatched as a drifting loop: {got:?}");

        let rate = case["input"]["long_run"]["rate_rps"].as_f64().unwrap();
        let n = case["input"]["long_run"]["num_requests"].as_u64().unwrap();
        let t0 = Instant::now();
        let mut ticker = Ticker::new(
            Gaps::new(
                Schedule::Rate {
                    per_second: rate,
                    arrival: Arrival::Constant,
                },
                1,
            ),
            t0,
        )
        .coarse();
        let mut last = None;
        for _ in 0..n {
            last = Some(ticker.tick().await);
            tokio::time::advance(work).await;
        }
        let last = last.unwrap();
        let sent = last.scheduled + last.lag;
        let achieved = (n - 1) as f64 / (sent - t0).as_secs_f64();
        let min = case["expected"]["long_run_achieved_rps_min"]
            .as_f64()
            .unwrap();
        assert!(
            achieved >= min && last.lag < Duration::from_millis(1),
            "achieved {achieved} req/s (want ≥ {min}), the last {:?} late",
            last.lag
        );
    }

    /// Counts the wake-ups of the future polled with it.
    #[derive(Default)]
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Polls `tick` once with a counting waker: whether it finished, and the waker it used.
    fn poll_tick(
        tick: &mut std::pin::Pin<Box<impl std::future::Future<Output = Tick>>>,
        wakes: &std::sync::Arc<Wakes>,
    ) -> std::task::Poll<Tick> {
        let waker = std::task::Waker::from(wakes.clone());
        tick.as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
    }

    /// The agent's ticker (`coarse`) sleeps on the timer alone: 1 ms before a due time nothing
    /// has woken it (a spinning one is yielding by then, waking itself each turn), at the due
    /// time it fires once, and the schedule stays absolute (work between ticks never pushes
    /// the next one back). Paused clock: exact instants.
    #[tokio::test(start_paused = true)]
    async fn a_coarse_ticker_sleeps_to_each_due_time_without_spinning() {
        use std::sync::atomic::Ordering::Relaxed;
        let gap = Duration::from_millis(100);
        let t0 = Instant::now();
        let schedule = Schedule::Rate {
            per_second: 10.0,
            arrival: Arrival::Constant,
        };
        let mut ticker = Ticker::new(Gaps::new(schedule, 1), t0 + gap).coarse();
        for i in 1..=3u32 {
            let wakes = std::sync::Arc::new(Wakes::default());
            let mut tick = Box::pin(ticker.tick());
            assert!(poll_tick(&mut tick, &wakes).is_pending());
            let due = t0 + gap * i;
            tokio::time::advance(due - Duration::from_millis(1) - Instant::now()).await;
            assert_eq!(
                wakes.0.load(Relaxed),
                0,
                "tick {i}: woken before its due time"
            );
            assert!(poll_tick(&mut tick, &wakes).is_pending());
            tokio::time::advance(Duration::from_millis(1)).await;
            assert_eq!(
                wakes.0.load(Relaxed),
                1,
                "tick {i}: the timer's one wake-up"
            );
            let std::task::Poll::Ready(t) = poll_tick(&mut tick, &wakes) else {
                panic!("tick {i} not ready at its due time");
            };
            assert_eq!(
                (t.seq, t.scheduled, t.lag),
                (u64::from(i - 1), due, Duration::ZERO)
            );
            // 30 ms of work after each tick: the next is still due on the absolute schedule.
            drop(tick);
            tokio::time::advance(Duration::from_millis(30)).await;
        }
        // The precise ticker, for contrast, is yielding (waking itself) 1 ms before its due time.
        let mut precise = Ticker::new(Gaps::new(schedule, 1), Instant::now() + gap);
        let wakes = std::sync::Arc::new(Wakes::default());
        let mut tick = Box::pin(precise.tick());
        assert!(poll_tick(&mut tick, &wakes).is_pending());
        tokio::time::advance(gap - Duration::from_millis(1)).await;
        assert!(poll_tick(&mut tick, &wakes).is_pending());
        tokio::task::yield_now().await;
        assert!(
            wakes.0.load(Relaxed) >= 2,
            "the precise ticker spins before its due time"
        );
    }

    #[test]
    fn poisson_gaps_have_the_right_mean_and_interval_gaps_stay_in_jitter() {
        let mut g = Gaps::new(
            Schedule::Rate {
                per_second: 50.0,
                arrival: Arrival::Poisson,
            },
            7,
        );
        let n = 20_000;
        let mean = (0..n).map(|_| g.next_gap().as_secs_f64()).sum::<f64>() / n as f64;
        assert!((mean - 0.02).abs() < 0.001, "mean gap {mean}");
        let mut g = Gaps::new(
            Schedule::Interval {
                period: Duration::from_secs(5),
            },
            7,
        );
        for _ in 0..1000 {
            let s = g.next_gap().as_secs_f64();
            assert!((4.5..=5.5).contains(&s), "{s}");
        }
    }
}
