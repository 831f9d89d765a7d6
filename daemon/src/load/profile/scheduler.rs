//! The profile scheduler: a pure engine (no clock, no IO) that turns a [`Profile`] into
//! arrival times, prompt lengths and concurrency limits; its caller reads the clock, sends,
//! and feeds back TPOT for `adaptive`. [`Scheduler::update`] swaps the profile from the next
//! planned arrival on (requests already planned or in flight are untouched) and bumps the
//! revision each request is sent under (`requests.jsonl` `profile_revision`).
//!
//! `token_rate` → arrivals: with `output_tokens` asked per request, the request rate is
//! `target / output_tokens`; `constant` gaps are `1/rate` scaled by a uniform factor in
//! `1 ± jitter` (seeded, mean kept); `bursty` sends at twice the rate during on periods and
//! nothing during off periods of equal length (same mean); `adaptive` starts at `target`,
//! multiplies it by `1 + increase` every `step` while the mean per-stream decode rate of the
//! last step (1000 / TPOT ms) stays at or above `floor`, and settles on the last level that
//! held: [`Scheduler::sustained_token_rate`].

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{ConcurrencyRamp, Profile, TokenRate};

/// One planned request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Planned {
    /// Send time from the run's start.
    pub at: Duration,
    /// Prompt length from `prompt_length` (`None`: the run's own).
    pub input_tokens: Option<u32>,
    /// Profile revision it is planned under (0 = the file as started).
    pub revision: u32,
}

/// The scheduler's state.
#[derive(Debug, Clone)]
pub struct Scheduler {
    profile: Profile,
    revision: u32,
    output_tokens: f64,
    rng: SmallRng,
    /// Next arrival, seconds from the start.
    next_s: f64,
    /// When the current concurrency / token rate took effect.
    concurrency_epoch_s: f64,
    rate_epoch_s: f64,
    /// Adaptive: current level (k in target·(1+increase)^k), whether it settled, and the
    /// TPOT samples of the current step.
    level: u32,
    settled: bool,
    step_tpot: Vec<f64>,
    /// Arrivals of the current step that were not sent (the concurrency limit was full).
    step_skipped: u32,
    sustained: Option<f64>,
    /// `adaptive` is raised no further than this request rate (an injected load's cap).
    max_request_rate: f64,
}

impl Scheduler {
    /// A scheduler for `profile`, requests asking `output_tokens` each, seeded.
    pub fn new(profile: Profile, output_tokens: u32, seed: u64) -> Self {
        Self {
            profile,
            revision: 0,
            output_tokens: f64::from(output_tokens.max(1)),
            rng: SmallRng::seed_from_u64(seed),
            next_s: 0.0,
            concurrency_epoch_s: 0.0,
            rate_epoch_s: 0.0,
            level: 0,
            settled: false,
            step_tpot: Vec::new(),
            step_skipped: 0,
            sustained: None,
            max_request_rate: f64::INFINITY,
        }
    }

    /// Raises an `adaptive` rate no further than `per_second` requests per second: the level
    /// whose successor would exceed it is where it settles (when its step held).
    pub fn with_max_request_rate(mut self, per_second: f64) -> Self {
        self.max_request_rate = per_second;
        self
    }

    /// The request rate the profile asks first, at its peak for `bursty` (its on periods),
    /// per second (`None` without `token_rate`): what a rate cap is checked against.
    pub fn peak_request_rate(profile: &Profile, output_tokens: u32) -> Option<f64> {
        let per_request = f64::from(output_tokens.max(1));
        Some(match profile.token_rate? {
            TokenRate::Constant { target, .. } | TokenRate::Adaptive { target, .. } => {
                target / per_request
            }
            TokenRate::Bursty { target, .. } => 2.0 * target / per_request,
        })
    }

    pub fn revision(&self) -> u32 {
        self.revision
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Applies `profile` from `now` on: a changed dimension restarts its ramp at `now`, the
    /// next arrival is planned with it; returns the new revision. A changed `token_rate`
    /// starts as a run does: its first arrival at `now`, then its own gaps (not after the
    /// rest of the old rate's gap: at 0.5 req/s that held a new rate back by up to 2 s).
    pub fn update(&mut self, profile: Profile, now: Duration) -> u32 {
        let now_s = now.as_secs_f64();
        if profile.concurrency != self.profile.concurrency {
            self.concurrency_epoch_s = now_s;
        }
        if profile.token_rate != self.profile.token_rate {
            self.rate_epoch_s = now_s;
            self.level = 0;
            self.settled = false;
            self.step_tpot.clear();
            self.next_s = now_s;
        }
        self.profile = profile;
        self.revision += 1;
        self.revision
    }

    /// Takes back `planned`, the last arrival [`Scheduler::plan_next`] gave, which was not sent
    /// (an update came while it waited): the next plan is for its time again, under the profile
    /// then in force, so an edit that leaves `token_rate` alone loses no arrival.
    pub fn unplan(&mut self, planned: Planned) {
        self.next_s = self.next_s.min(planned.at.as_secs_f64());
    }

    /// The concurrency limit at `t` (`None`: the profile leaves it to the run).
    pub fn concurrency_at(&self, t: Duration) -> Option<usize> {
        let c = self.profile.concurrency?;
        let k =
            ((t.as_secs_f64() - self.concurrency_epoch_s).max(0.0) / c.step.as_secs_f64()).floor();
        let base = f64::from(c.base);
        let v = match c.ramp {
            ConcurrencyRamp::Fixed => base,
            ConcurrencyRamp::Linear => base * (k + 1.0),
            ConcurrencyRamp::Exponential => base * 2f64.powf(k.min(60.0)),
            ConcurrencyRamp::Sawtooth => {
                let levels = (f64::from(c.max) / base).floor().max(1.0);
                base * (k % levels + 1.0)
            }
        };
        Some(v.min(f64::from(c.max)) as usize)
    }

    /// Requests per second asked at time `t` (seconds), `None` without `token_rate`.
    fn request_rate_at(&self, t: f64) -> Option<f64> {
        let per_request = self.output_tokens;
        Some(match self.profile.token_rate? {
            TokenRate::Constant { target, .. } => target / per_request,
            TokenRate::Bursty { target, period } => {
                let phase =
                    ((t - self.rate_epoch_s).max(0.0) / period.as_secs_f64()).floor() as u64;
                if phase.is_multiple_of(2) {
                    2.0 * target / per_request
                } else {
                    0.0
                }
            }
            TokenRate::Adaptive {
                target, increase, ..
            } => target * (1.0 + increase).powi(self.level as i32) / per_request,
        })
    }

    /// The next arrival (`None` without `token_rate`: the run's own schedule applies).
    pub fn plan_next(&mut self) -> Option<Planned> {
        let rate = self.request_rate_at(self.next_s)?;
        let at = self.next_s;
        let gap = match self.profile.token_rate? {
            TokenRate::Constant { jitter, .. } if jitter > 0.0 => {
                self.rng.random_range(1.0 - jitter..=1.0 + jitter) / rate
            }
            TokenRate::Bursty { period, .. } if rate == 0.0 => {
                // Off: skip to the next on period.
                let p = period.as_secs_f64();
                let phase = ((at - self.rate_epoch_s) / p).floor();
                self.next_s = self.rate_epoch_s + (phase + 1.0) * p;
                return self.plan_next();
            }
            _ => 1.0 / rate,
        };
        self.next_s = at + gap;
        if let TokenRate::Adaptive { step, .. } = self.profile.token_rate? {
            self.adaptive_step(at, step.as_secs_f64());
        }
        let input_tokens = self
            .profile
            .prompt_length
            .map(|d| d.sample_n(&mut self.rng, 1)[0]);
        Some(Planned {
            at: Duration::from_secs_f64(at),
            input_tokens,
            revision: self.revision,
        })
    }

    fn adaptive_step(&mut self, at: f64, step: f64) {
        let Some(TokenRate::Adaptive {
            target,
            increase,
            floor,
            ..
        }) = self.profile.token_rate
        else {
            return;
        };
        if self.settled || at < self.rate_epoch_s + step * f64::from(self.level + 1) {
            return;
        }
        let level_rate = target * (1.0 + increase).powi(self.level as i32);
        let mean_tpot = if self.step_tpot.is_empty() {
            None
        } else {
            Some(self.step_tpot.iter().sum::<f64>() / self.step_tpot.len() as f64)
        };
        // A level whose arrivals were skipped was not offered: it did not hold, whatever the
        // requests that were sent decoded at (an injected load skips what its limit refuses).
        let skipped = self.step_skipped > 0;
        match mean_tpot {
            // Nothing finished in this step yet: no evidence either way; judged once some has.
            None if !skipped => return,
            Some(t) if skipped || 1000.0 / t < floor => {
                // This level broke the floor: back to the last that held.
                self.settled = true;
                self.level = self.level.saturating_sub(1);
            }
            None => {
                self.settled = true;
                self.level = self.level.saturating_sub(1);
            }
            _ => {
                self.sustained = Some(level_rate);
                let next = target * (1.0 + increase).powi(self.level as i32 + 1);
                if next / self.output_tokens > self.max_request_rate {
                    self.settled = true;
                } else {
                    self.level += 1;
                }
            }
        }
        self.step_tpot.clear();
        self.step_skipped = 0;
    }

    /// Counts an arrival of the current step that was not sent (`adaptive`: the step did not
    /// hold; the level before it is the sustained rate).
    pub fn observe_skipped(&mut self) {
        self.step_skipped = self.step_skipped.saturating_add(1);
    }

    /// Feeds one finished request's TPOT (ms) for `adaptive`.
    pub fn observe_tpot(&mut self, tpot_ms: f64) {
        if tpot_ms.is_finite() && tpot_ms > 0.0 {
            self.step_tpot.push(tpot_ms);
        }
    }

    /// `adaptive`: the highest output-token rate whose step kept the decode rate at or above
    /// the floor (tokens/s); `None` before a step held.
    pub fn sustained_token_rate(&self) -> Option<f64> {
        self.sustained
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ConcurrencyShape, parse};
    use super::*;

    fn profile(text: &str) -> Profile {
        parse("p.yaml", text).unwrap()
    }

    #[test]
    fn constant_token_rate_with_jitter_keeps_its_mean() {
        let mut s = Scheduler::new(
            profile("token_rate: {mode: constant, target: 256/s, jitter: 15%}\n"),
            128,
            7,
        );
        let at: Vec<f64> = (0..2001)
            .map(|_| s.plan_next().unwrap().at.as_secs_f64())
            .collect();
        // 256 tokens/s ÷ 128 tokens per request = 2 req/s.
        let rate = 2000.0 / at[2000];
        assert!((rate - 2.0).abs() < 0.02, "{rate}");
        let gaps: Vec<f64> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter()
                .all(|g| (0.425 - 1e-9..=0.575 + 1e-9).contains(g)),
            "gaps within 0.5 s ± 15 %"
        );
        assert!(gaps.iter().any(|g| *g < 0.45) && gaps.iter().any(|g| *g > 0.55));
    }

    #[test]
    fn bursty_is_on_off_with_the_same_mean() {
        let mut s = Scheduler::new(
            profile("token_rate: {mode: bursty, target: 100/s, period: 2s}\n"),
            10,
            1,
        );
        let at: Vec<f64> = std::iter::from_fn(|| s.plan_next())
            .map(|p| p.at.as_secs_f64())
            .take_while(|t| *t < 40.0)
            .collect();
        assert!(
            (at.len() as f64 - 400.0).abs() <= 4.0,
            "10 req/s on average: {}",
            at.len()
        );
        // (Duration keeps whole nanoseconds: an arrival 1e-10 s before an on period ends reads as its end.)
        let on = |t: f64| ((t / 2.0).floor() as u64).is_multiple_of(2);
        let off: Vec<&f64> = at
            .iter()
            .filter(|t| !on(**t - 1e-6) && !on(**t + 1e-6))
            .collect();
        assert!(off.is_empty(), "nothing in off periods: {off:?}");
    }

    #[test]
    fn concurrency_shapes() {
        let s = Scheduler::new(
            profile("concurrency: {ramp: exponential, base: 4, step: 3s, max: 40}\n"),
            1,
            0,
        );
        let c = |t: f64| s.concurrency_at(Duration::from_secs_f64(t)).unwrap();
        assert_eq!(
            [c(0.0), c(2.9), c(3.0), c(6.5), c(9.0), c(12.0)],
            [4, 4, 8, 16, 32, 40]
        );
        let s = Scheduler::new(
            profile("concurrency: {ramp: sawtooth, base: 2, step: 1s, max: 6}\n"),
            1,
            0,
        );
        let c = |t: f64| s.concurrency_at(Duration::from_secs_f64(t)).unwrap();
        assert_eq!([c(0.0), c(1.0), c(2.0), c(3.0), c(4.0)], [2, 4, 6, 2, 4]);
        let s = Scheduler::new(
            profile("concurrency: {ramp: linear, base: 3, step: 2s}\n"),
            1,
            0,
        );
        assert_eq!(s.concurrency_at(Duration::from_secs(5)), Some(9));
        assert_eq!(
            Scheduler::new(profile("profile: x\n"), 1, 0).concurrency_at(Duration::ZERO),
            None
        );
    }

    /// A hot update applies from the next planned arrival, restarts the changed ramp, and
    /// bumps the revision; the prompt length dimension is independent.
    #[test]
    fn update_applies_from_the_next_step() {
        let mut s = Scheduler::new(
            profile(
                "token_rate: {mode: constant, target: 10/s}\nconcurrency: {ramp: fixed, base: 2}\n",
            ),
            1,
            3,
        );
        let first: Vec<Planned> = (0..10).map(|_| s.plan_next().unwrap()).collect();
        assert!(
            first
                .iter()
                .all(|p| p.revision == 0 && p.input_tokens.is_none())
        );
        assert!((first[9].at.as_secs_f64() - 0.9).abs() < 1e-9);
        let rev = s.update(profile("token_rate: {mode: constant, target: 100/s}\nconcurrency: {ramp: linear, base: 2, step: 1s}\nprompt_length: {distribution: fixed, value: 64}\n"), Duration::from_secs(1));
        assert_eq!(rev, 1);
        let next: Vec<Planned> = (0..5).map(|_| s.plan_next().unwrap()).collect();
        assert!(
            next.iter()
                .all(|p| p.revision == 1 && p.input_tokens == Some(64))
        );
        assert!(
            (next[0].at.as_secs_f64() - 1.0).abs() < 1e-9
                && (next[4].at.as_secs_f64() - 1.04).abs() < 1e-9,
            "{next:?}"
        );
        assert_eq!(
            s.concurrency_at(Duration::from_millis(1500)),
            Some(2),
            "the linear ramp starts at the update"
        );
        assert_eq!(s.concurrency_at(Duration::from_millis(2500)), Some(4));
        assert_eq!(
            s.profile().concurrency.map(|c: ConcurrencyShape| c.ramp),
            Some(ConcurrencyRamp::Linear)
        );
    }

    /// An update while a planned arrival waits (`unplan`, then `update`): an edit of another
    /// dimension keeps the arrival times (none lost); a changed `token_rate` starts at the
    /// update, not after the rest of the old rate's gap.
    #[test]
    fn an_update_while_an_arrival_waits_replans_it() {
        let rate = |target: u32| format!("token_rate: {{mode: constant, target: {target}/s}}\n");
        // 1 token/s of 2 tokens per request: an arrival every 2 s.
        let mut s = Scheduler::new(profile(&rate(1)), 2, 0);
        let at = |p: Planned| p.at.as_secs_f64();
        assert_eq!(
            (at(s.plan_next().unwrap()), at(s.plan_next().unwrap())),
            (0.0, 2.0)
        );
        // At 2.5 s, waiting for 4 s, the prompt length changes: the arrival stays at 4 s.
        let waiting = s.plan_next().unwrap();
        s.unplan(waiting);
        s.update(
            profile(&format!(
                "prompt_length: {{distribution: fixed, value: 16}}\n{}",
                rate(1)
            )),
            Duration::from_millis(2500),
        );
        let p = s.plan_next().unwrap();
        assert_eq!((at(p), p.input_tokens, p.revision), (4.0, Some(16), 1));
        // At 4.5 s, waiting for 6 s, the rate rises to 10 tokens/s (5 req/s): from 4.5 s on.
        let waiting = s.plan_next().unwrap();
        assert_eq!(at(waiting), 6.0);
        s.unplan(waiting);
        s.update(profile(&rate(10)), Duration::from_millis(4500));
        let next: Vec<f64> = (0..3).map(|_| at(s.plan_next().unwrap())).collect();
        assert!(
            next.iter()
                .zip([4.5, 4.7, 4.9])
                .all(|(g, w)| (g - w).abs() < 1e-9),
            "{next:?}"
        );
    }

    /// Adaptive: raised while 1/TPOT stays above the floor; a server whose decode rate falls
    /// below 20 tokens/s past 400 tokens/s settles at the last level under it.
    #[test]
    fn adaptive_settles_at_the_highest_sustainable_rate() {
        let mut s = Scheduler::new(
            profile(
                "token_rate: {mode: adaptive, target: 100/s, increase: 50%, step: 1s, floor: 20}\n",
            ),
            10,
            0,
        );
        for _ in 0..2000 {
            let Some(p) = s.plan_next() else { break };
            if p.at > Duration::from_secs(30) {
                break;
            }
            let offered = s.request_rate_at(p.at.as_secs_f64()).unwrap() * 10.0;
            // Decode rate 40 tokens/s per stream below 400 tokens/s offered, 10 above.
            s.observe_tpot(if offered < 400.0 { 25.0 } else { 100.0 });
        }
        // Levels 100, 150, 225, 337.5 hold; 506.25 breaks.
        assert_eq!(s.sustained_token_rate(), Some(337.5));
    }

    /// Arrivals skipped by a full concurrency limit mean the level was not offered: it did
    /// not hold, however fast the requests that were sent decoded (the new-user walk saw
    /// `sustained=150` reported while 132 of 154 sends were skipped). A step where nothing
    /// finished claims nothing.
    #[test]
    fn adaptive_levels_with_skipped_arrivals_or_no_evidence_do_not_hold() {
        let mut s = Scheduler::new(
            profile(
                "token_rate: {mode: adaptive, target: 100/s, increase: 50%, step: 1s, floor: 20}\n",
            ),
            10,
            0,
        );
        for _ in 0..2000 {
            let Some(p) = s.plan_next() else { break };
            if p.at > Duration::from_secs(30) {
                break;
            }
            let offered = s.request_rate_at(p.at.as_secs_f64()).unwrap() * 10.0;
            // Fast streams throughout, but from 225 tokens/s on the limit refuses arrivals.
            if offered >= 225.0 {
                s.observe_skipped();
            } else {
                s.observe_tpot(10.0);
            }
        }
        // 100 and 150 hold; 225 skipped arrivals.
        assert_eq!(s.sustained_token_rate(), Some(150.0));

        let mut quiet = Scheduler::new(
            profile(
                "token_rate: {mode: adaptive, target: 100/s, increase: 50%, step: 1s, floor: 20}\n",
            ),
            10,
            0,
        );
        while let Some(p) = quiet.plan_next() {
            if p.at > Duration::from_secs(10) {
                break;
            }
        }
        assert_eq!(
            quiet.sustained_token_rate(),
            None,
            "no request finished: nothing held"
        );
    }

    /// A cap on the request rate stops the raise where the next level would exceed it.
    #[test]
    fn adaptive_is_raised_no_further_than_the_cap() {
        let p = profile(
            "token_rate: {mode: adaptive, target: 100/s, increase: 50%, step: 1s, floor: 20}\n",
        );
        assert_eq!(Scheduler::peak_request_rate(&p, 10), Some(10.0));
        // 25 req/s × 10 tokens: 225 tokens/s fits, 337.5 would not.
        let mut s = Scheduler::new(p, 10, 0).with_max_request_rate(25.0);
        let mut last = None;
        while let Some(pl) = s.plan_next() {
            if pl.at > Duration::from_secs(10) {
                break;
            }
            s.observe_tpot(10.0);
            last = s.request_rate_at(pl.at.as_secs_f64());
        }
        assert_eq!(s.sustained_token_rate(), Some(225.0));
        assert_eq!(last, Some(22.5), "stays at the last level under the cap");
        let bursty = profile("token_rate: {mode: bursty, target: 100/s}\n");
        assert_eq!(Scheduler::peak_request_rate(&bursty, 10), Some(20.0));
    }
}
