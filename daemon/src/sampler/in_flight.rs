//! Canaries still in flight, as right-censored latency samples for spike mode.
//!
//! Under an overload the first slow canary ends only after its own long wait (a TTFT of
//! 20 s behind a queue): judged on finished canaries alone, spike mode would start that late.
//! A canary in flight for `d` has an E2E of at least `d`; the sampler hands these lower bounds
//! to the detector ([`crate::diagnosis::detector::BucketSeries::assess_with`]) on each canary
//! and on a periodic tick, so a queue that stalls canaries is seen while they wait. Pure: the
//! caller says when each canary started and ended.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// Requests tracked at most (memory bound); beyond, new starts are not tracked (counted).
pub const MAX_TRACKED: usize = 4096;

/// Start instants of the canaries in flight, by trace id.
#[derive(Debug, Default)]
pub struct InFlight {
    started: HashMap<u128, Instant>,
    /// Starts not tracked because [`MAX_TRACKED`] were in flight.
    pub untracked: u64,
}

impl InFlight {
    /// Notes that the canary `trace_id` started at `at`.
    pub fn start(&mut self, trace_id: u128, at: Instant) {
        if self.started.len() >= MAX_TRACKED && !self.started.contains_key(&trace_id) {
            self.untracked += 1;
            return;
        }
        self.started.insert(trace_id, at);
    }

    /// Notes that the canary ended (or was dropped); unknown ids are ignored.
    pub fn end(&mut self, trace_id: u128) {
        self.started.remove(&trace_id);
    }

    pub fn len(&self) -> usize {
        self.started.len()
    }

    pub fn is_empty(&self) -> bool {
        self.started.is_empty()
    }

    /// At `now`, each canary in flight's elapsed time.
    pub fn elapsed(&self, now: Instant) -> Vec<Duration> {
        self.started
            .values()
            .map(|&s| now.saturating_duration_since(s))
            .collect()
    }

    /// At `now`, each canary in flight as `(start, elapsed)`: its start since `origin` and its
    /// elapsed time in seconds (a lower bound of its E2E). Starts before `origin` count from it.
    pub fn bounds(&self, now: Instant, origin: Instant) -> Vec<(Duration, f64)> {
        self.started
            .values()
            .map(|&s| {
                (
                    s.saturating_duration_since(origin),
                    now.saturating_duration_since(s).as_secs_f64(),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_elapsed_times_since_each_start() {
        let t0 = Instant::now();
        let mut f = InFlight::default();
        f.start(1, t0 + Duration::from_secs(2));
        f.start(2, t0 + Duration::from_secs(5));
        f.end(3);
        let mut b = f.bounds(t0 + Duration::from_secs(7), t0);
        b.sort_by_key(|x| x.0);
        assert_eq!(
            b,
            [(Duration::from_secs(2), 5.0), (Duration::from_secs(5), 2.0)]
        );
        f.end(1);
        assert_eq!(f.len(), 1);
        f.end(2);
        assert!(f.is_empty() && f.bounds(t0, t0).is_empty());
    }

    #[test]
    fn tracking_is_bounded() {
        let t0 = Instant::now();
        let mut f = InFlight::default();
        for id in 0..(MAX_TRACKED as u128 + 10) {
            f.start(id, t0);
        }
        assert_eq!((f.len(), f.untracked), (MAX_TRACKED, 10));
    }

    use crate::sampler::adaptive::{
        Observed, Reason, SamplingPolicy, SpikeRule, SpikeTransition, TargetSampler,
    };

    fn done(id: u128, e2e: Duration) -> Observed {
        Observed {
            failed: false,
            ttft: Some(e2e / 4),
            e2e,
            trace_id: id,
            cancelled: false,
            timed_out: false,
        }
    }

    /// Two minutes of canaries at 1/s (E2E 400 ms, every 7th 600 ms), each started, ticked
    /// on, and decided: never a spike. Returns the next trace id.
    async fn calm(s: &mut TargetSampler) -> u128 {
        for id in 0..120u128 {
            s.started(id, Instant::now());
            let e2e = Duration::from_millis(if id % 7 == 0 { 600 } else { 400 });
            tokio::time::advance(e2e).await;
            assert!(s.decide(Instant::now(), done(id, e2e)).transition.is_none());
            tokio::time::advance(Duration::from_secs(1) - e2e).await;
            assert_eq!(s.tick(Instant::now()), None);
        }
        120
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_enters_spike_mode_on_a_tick_while_canaries_wait() {
        let mut s = TargetSampler::new(SamplingPolicy {
            spike_hold: Duration::from_secs(20),
            ..SamplingPolicy::default()
        });
        let mut id = calm(&mut s).await;
        // Overload: every canary queues for 25 s; none ends before.
        let onset = Instant::now();
        let mut queued = Vec::new();
        let mut entered = None;
        while onset.elapsed() < Duration::from_secs(25) {
            s.started(id, Instant::now());
            queued.push((id, Instant::now()));
            id += 1;
            tokio::time::advance(Duration::from_secs(1)).await;
            if let Some(rule) = s.tick(Instant::now()) {
                assert!(entered.is_none(), "entered twice");
                entered = Some((onset.elapsed(), rule));
            }
        }
        let (after, rule) = entered.expect("entered while the canaries waited");
        // The onset on a bucket boundary is the worst case: the onset's bucket, then the 5
        // canaries the next one needs before it counts (at 1/s).
        assert!(
            after <= Duration::from_secs(15),
            "entered {after:?} after the onset"
        );
        let SpikeRule::LatencyJump {
            signal,
            p99_s,
            baseline_s,
            ratio,
            in_flight,
            ..
        } = rule
        else {
            panic!("{rule:?}")
        };
        assert_eq!(signal, "e2e");
        assert!(
            in_flight >= 5
                && (0.4..=0.6).contains(&baseline_s)
                && p99_s >= 2.0 * baseline_s
                && ratio >= 2.0,
            "{rule:?}"
        );
        assert!(s.in_spike() && s.spike_rule() == Some(rule));
        // The first canary to end carries the entry (once); it and the rest are kept.
        let (at_rule, at) = s.take_carried().expect("carried");
        assert_eq!((at_rule, at - onset), (rule, after));
        assert_eq!(s.take_carried(), None);
        for (q, started) in queued {
            let d = s.decide(Instant::now(), done(q, started.elapsed()));
            assert!(
                d.keep && d.reason == Reason::Spike && d.transition.is_none(),
                "{d:?}"
            );
        }
        assert_eq!(s.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn one_slow_canary_in_flight_does_not_enter() {
        let mut s = TargetSampler::new(SamplingPolicy::default());
        let mut id = calm(&mut s).await;
        // One canary takes 8 s (across a bucket boundary) while the others go on as before.
        let slow = id;
        s.started(slow, Instant::now());
        let t = Instant::now();
        id += 1;
        for _ in 0..30 {
            s.started(id, Instant::now());
            tokio::time::advance(Duration::from_millis(400)).await;
            assert!(
                s.decide(Instant::now(), done(id, Duration::from_millis(400)))
                    .transition
                    .is_none()
            );
            id += 1;
            tokio::time::advance(Duration::from_millis(600)).await;
            assert_eq!(s.tick(Instant::now()), None, "{:?}", s.spike_rule());
            if t.elapsed() >= Duration::from_secs(8) && s.in_flight() > 0 {
                assert!(
                    s.decide(Instant::now(), done(slow, t.elapsed()))
                        .transition
                        .is_none()
                );
            }
        }
        assert!(!s.in_spike() && s.in_flight() == 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tick_never_leaves_spike_mode_the_next_canary_does() {
        let mut s = TargetSampler::new(SamplingPolicy {
            spike_hold: Duration::from_secs(5),
            ..SamplingPolicy::default()
        });
        let mut id = calm(&mut s).await;
        for _ in 0..20 {
            s.started(id, Instant::now());
            id += 1;
            tokio::time::advance(Duration::from_secs(1)).await;
            s.tick(Instant::now());
        }
        assert!(s.in_spike());
        // The queue drains: every canary ends at once, then calm for longer than the hold.
        for q in 120..id {
            s.decide(Instant::now(), done(q, Duration::from_secs(10)));
        }
        for _ in 0..60 {
            tokio::time::advance(Duration::from_secs(1)).await;
            assert_eq!(s.tick(Instant::now()), None);
        }
        assert!(s.in_spike(), "a tick left spike mode");
        s.started(id, Instant::now());
        let d = s.decide(Instant::now(), done(id, Duration::from_millis(400)));
        assert_eq!(d.transition, Some(SpikeTransition::Left));
    }
}
