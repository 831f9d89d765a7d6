//! The adaptive tail sampler: one per target, decided when a canary ends.
//!
//! Keep always on error, abort, timeout, cancel or SLO breach; in spike mode keep 100 %; else
//! keep a base ratio (consistent with the trace id, so the `ot=th:` threshold is exact) within a
//! per-target rate cap (token bucket). Anchors: the OpenTelemetry Collector's
//! `tailsamplingprocessor` policies (status_code, latency, probabilistic, rate_limiting).
//!
//! Spike mode: over a sliding window of the target's requests, when the error rate reaches
//! `spike_error_rate` or the window's p99 E2E reaches `spike_p99` (with at least
//! `spike_min_requests` in the window), keep everything until `spike_hold` after the condition
//! was last true. Hysteresis: once in spike mode, the condition to stay is half the error
//! rate and 80 % of the latency threshold, so a window hovering at the threshold does not flap.
//!
//! A third rule needs no SLO: a *latency jump* of the target's TTFT or E2E p99 per 10 s bucket
//! (never a bucket's lone largest sample, as in the diagnosis: at 1 canary/s a 10 s p99 is the
//! maximum, and two heavy-tail outliers in 30 s of a calm, loaded server entered spike mode)
//! against its own robust baseline (median and MAD of up to 30 min of buckets), judged by the
//! detector the diagnosis shares ([`crate::diagnosis::detector`]): ≥ `spike_jump_ratio` ×
//! (default 2), robust z ≥ `spike_jump_z` (3.5) and ≥ `spike_jump_floor` (50 ms) above the
//! median, in 2 of the last 3 buckets, where at least `spike_jump_min_share` (25 %) of a
//! bucket's canaries (finished and in flight) are above that threshold themselves: two slow
//! canaries of a calm real server in a 10 s bucket are jitter, a quarter of them is a shift
//! (a 2-minute calm phase of the real llama.cpp server once read 3.6 ×, z 6.9, on two
//! canaries). Staying needs the rule relaxed to 80 %. Which rule fired,
//! with its values, is the [`SpikeRule`] of the entry.
//!
//! Failures are latency evidence too: a failed canary that measured a TTFT (a timeout, a stream
//! cut after tokens) feeds the TTFT series, and a timeout feeds the E2E series with its elapsed
//! time (censored: at least the timeout). A canary skipped because `max_in_flight` requests still
//! run is not in the window (it is counted in `lmperf.canary.skipped`): the canaries stuck in
//! flight speak for the target (below).
//!
//! `spike_min_requests` is judged against what the window can hold at the canary rate
//! ([`effective_min_requests`]): min(`spike_min_requests`, canaries expected in `spike_window`),
//! at least 3; the config warns when a target's window cannot hold 3 canaries.
//!
//! Canaries still in flight count too ([`super::in_flight`]): a canary in flight for `d` has an
//! E2E of at least `d`, a lower bound the E2E series takes in the recent bucket of its start.
//! Besides each finished canary, the caller judges these bounds on a periodic [`tick`]
//! (`TargetSampler::tick`), so an overload that queues canaries for 20 s enters spike mode
//! while they wait rather than once they end. A spike entered on a tick has no span of its
//! own: its `lmperf.spike.entered` event is carried by the next canary's span
//! ([`TargetSampler::take_carried`]) with the entry's time.
//!
//! Requests the agent cancelled itself (shutdown, a stopped load: outcome `cancelled`) are kept
//! as errors but never counted by any rule: they say nothing about the target.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::in_flight::InFlight;
use super::threshold;
use crate::diagnosis::detector::{Aggregate, BucketSeries, DetectorConfig, JumpRule};

/// Why a span was kept (`lmperf.sampling.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Error,
    SloBreach,
    Spike,
    Base,
    /// Decided by `OTEL_TRACES_SAMPLER` (head sampling) instead of the adaptive sampler.
    Head,
    /// A healthy request of load injected through the control API (every one is kept).
    Inject,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::Error,
        Reason::SloBreach,
        Reason::Spike,
        Reason::Base,
        Reason::Head,
        Reason::Inject,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Error => "error",
            Reason::SloBreach => "slo_breach",
            Reason::Spike => "spike",
            Reason::Base => "base",
            Reason::Head => "head",
            Reason::Inject => "inject",
        }
    }

    /// Spans kept for a reason other than chance: they go first and are dropped last.
    pub fn is_priority(self) -> bool {
        matches!(self, Reason::Error | Reason::SloBreach | Reason::Spike)
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Entering or leaving spike mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpikeTransition {
    Entered,
    Left,
}

/// Which rule started spike mode, with its values (`lmperf.spike.reason` and the
/// `lmperf.spike.*` attributes of the `lmperf.spike.entered` event; `spike_reason` in
/// `/api/v1/status`). Times in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum SpikeRule {
    /// The window's error share reached `threshold`.
    ErrorRate {
        error_rate: f64,
        threshold: f64,
        requests: usize,
    },
    /// The window's p99 E2E reached `spike_p99` (`threshold_s`).
    SloP99 { p99_s: f64, threshold_s: f64 },
    /// The p99 of `signal` (`ttft` | `e2e`) per bucket jumped against the target's own
    /// baseline (its median `baseline_s`): `ratio` = p99 ÷ median, `z` the robust z score.
    /// `in_flight`: canaries still in flight whose elapsed time counted as a lower bound.
    LatencyJump {
        signal: &'static str,
        p99_s: f64,
        baseline_s: f64,
        ratio: f64,
        z: f64,
        in_flight: usize,
    },
}

impl SpikeRule {
    /// `error_rate` | `slo_p99` | `latency_jump`.
    pub fn as_str(&self) -> &'static str {
        match self {
            SpikeRule::ErrorRate { .. } => "error_rate",
            SpikeRule::SloP99 { .. } => "slo_p99",
            SpikeRule::LatencyJump { .. } => "latency_jump",
        }
    }

    /// One human line: `latency_jump: ttft p99 2.41 s = 6.3 × baseline 0.38 s (z 41.0)`.
    pub fn describe(&self) -> String {
        match *self {
            SpikeRule::ErrorRate {
                error_rate,
                threshold,
                requests,
            } => format!(
                "error_rate: {:.1} % of {requests} requests failed (threshold {:.1} %)",
                error_rate * 100.0,
                threshold * 100.0
            ),
            SpikeRule::SloP99 { p99_s, threshold_s } => {
                format!("slo_p99: e2e p99 {} ≥ {}", secs(p99_s), secs(threshold_s))
            }
            SpikeRule::LatencyJump {
                signal,
                p99_s,
                baseline_s,
                ratio,
                z,
                in_flight: 0,
            } => {
                format!(
                    "latency_jump: {signal} p99 {} = {ratio:.1} × baseline {} (z {z:.1})",
                    secs(p99_s),
                    secs(baseline_s)
                )
            }
            SpikeRule::LatencyJump {
                signal,
                p99_s,
                baseline_s,
                ratio,
                z,
                in_flight,
            } => {
                format!(
                    "latency_jump: {signal} p99 ≥ {} = {ratio:.1} × baseline {} (z {z:.1}; {in_flight} canaries still in flight)",
                    secs(p99_s),
                    secs(baseline_s)
                )
            }
        }
    }
}

/// Seconds in their own unit, three significant digits: `1.66 ms`, `431 ms`, `4.10 s`.
fn secs(s: f64) -> String {
    crate::fmt::duration_ms(s * 1000.0)
}

/// A sampling decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub keep: bool,
    pub reason: Reason,
    /// Probability with which a span like this one is kept (1.0 for priority reasons).
    pub probability: f64,
    /// Spike mode changed with this request.
    pub transition: Option<SpikeTransition>,
    /// With `transition: Entered`, the rule that fired.
    pub spike: Option<SpikeRule>,
}

/// Per-target sampling policy (validated config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingPolicy {
    /// Share of healthy spans kept outside spikes, in [0, 1]. Default 0.1.
    pub base_ratio: f64,
    /// At most this many base-sampled spans per second per target. Default 10.
    pub max_base_per_second: f64,
    /// A TTFT above this is an SLO breach (kept).
    pub slo_ttft: Option<Duration>,
    /// An E2E above this is an SLO breach (kept).
    pub slo_e2e: Option<Duration>,
    pub spike_window: Duration,
    /// Error share of the window that starts a spike, in (0, 1]. Default 0.05.
    pub spike_error_rate: f64,
    /// Window p99 E2E that starts a spike; default `slo_e2e`, else none.
    pub spike_p99: Option<Duration>,
    pub spike_hold: Duration,
    pub spike_min_requests: usize,
    /// The latency-jump rule against the target's own baseline; `None`: off
    /// (`spike_jump_ratio = 0`).
    pub spike_jump: Option<JumpRule>,
    /// Buckets and baseline history of the jump rule.
    pub spike_detector: DetectorConfig,
}

/// The default latency-jump rule of spike mode: 2 ×, robust z 3.5, 50 ms.
pub const DEFAULT_SPIKE_JUMP: JumpRule = JumpRule {
    ratio: 2.0,
    z: 3.5,
    floor: 0.05,
};

/// The default share of a bucket's canaries that must be above the jump threshold themselves
/// ([`DetectorConfig::min_share_above`]): a quarter.
pub const DEFAULT_SPIKE_JUMP_MIN_SHARE: f64 =
    crate::diagnosis::detector::SPIKE_MODE_MIN_SHARE_ABOVE;

impl Default for SamplingPolicy {
    fn default() -> Self {
        Self {
            base_ratio: 0.1,
            max_base_per_second: 10.0,
            slo_ttft: None,
            slo_e2e: None,
            spike_window: Duration::from_secs(30),
            spike_error_rate: 0.05,
            spike_p99: None,
            spike_hold: Duration::from_secs(60),
            spike_min_requests: 10,
            spike_jump: Some(DEFAULT_SPIKE_JUMP),
            spike_detector: DetectorConfig::spike_mode(),
        }
    }
}

/// The fewest requests the error-rate and SLO rules need in the window, at `rate_per_s`
/// canaries per second: min(`configured`, canaries expected in `window`), at least 3 (unless
/// `configured` is below 3). The second value is `false` when the window cannot hold that many
/// at this rate: the two rules can then never fire.
pub fn effective_min_requests(
    configured: usize,
    window: Duration,
    rate_per_s: f64,
) -> (usize, bool) {
    let expected = (window.as_secs_f64() * rate_per_s).floor();
    let expected = if expected.is_finite() && expected >= 0.0 {
        expected.min(usize::MAX as f64) as usize
    } else {
        usize::MAX
    };
    let min = configured.min(expected.max(3));
    (min, expected >= min)
}

/// Window entries kept at most, whatever the rate (memory bound).
const MAX_WINDOW: usize = 20_000;

/// One finished request as the sampler sees it.
#[derive(Debug, Clone, Copy)]
pub struct Observed {
    pub failed: bool,
    pub ttft: Option<Duration>,
    pub e2e: Duration,
    pub trace_id: u128,
    /// Cancelled by the agent itself (shutdown, a stopped load): kept, never counted.
    pub cancelled: bool,
    /// The request timed out: `e2e` is a lower bound of its latency (fed to the E2E series).
    pub timed_out: bool,
}

/// The sampler of one target.
#[derive(Debug)]
pub struct TargetSampler {
    policy: SamplingPolicy,
    /// (end, failed, E2E; `None`: a skipped canary, no latency).
    window: VecDeque<(Instant, bool, Option<Duration>)>,
    errors_in_window: usize,
    spike_until: Option<Instant>,
    tokens: f64,
    last_refill: Option<Instant>,
    /// The rule that started the current spike.
    rule: Option<SpikeRule>,
    /// Origin of the detectors' time axis (the first request).
    origin: Option<Instant>,
    ttft: BucketSeries,
    e2e: BucketSeries,
    /// Canaries in flight (censored E2E samples).
    in_flight: InFlight,
    /// A spike entered on a [`tick`](Self::tick), with its instant: its event goes on the next
    /// canary's span.
    carried: Option<(SpikeRule, Instant)>,
}

impl TargetSampler {
    pub fn new(policy: SamplingPolicy) -> Self {
        Self {
            policy,
            window: VecDeque::new(),
            errors_in_window: 0,
            spike_until: None,
            tokens: policy.max_base_per_second.max(1.0),
            last_refill: None,
            rule: None,
            origin: None,
            ttft: BucketSeries::new(policy.spike_detector, Aggregate::P99),
            e2e: BucketSeries::new(policy.spike_detector, Aggregate::P99),
            in_flight: InFlight::default(),
            carried: None,
        }
    }

    /// Notes that the canary `trace_id` started at `now` (it counts as a lower bound while in
    /// flight). Its [`decide`](Self::decide) or [`abandoned`](Self::abandoned) ends that.
    pub fn started(&mut self, trace_id: u128, now: Instant) {
        self.origin.get_or_insert(now);
        self.in_flight.start(trace_id, now);
    }

    /// The canary `trace_id` ended without a decision (its task was dropped).
    pub fn abandoned(&mut self, trace_id: u128) {
        self.in_flight.end(trace_id);
    }

    /// Canaries in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The elapsed time at `now` of each canary in flight (the diagnosis's lower bounds).
    pub fn in_flight_elapsed(&self, now: Instant) -> Vec<std::time::Duration> {
        self.in_flight.elapsed(now)
    }

    /// Judges the canaries in flight at `now` without a finished one: enters (or prolongs)
    /// spike mode when a rule holds, and returns the rule when it entered. Never leaves spike
    /// mode: the next finished canary does, on its span.
    pub fn tick(&mut self, now: Instant) -> Option<SpikeRule> {
        let origin = self.origin?;
        let at = now.saturating_duration_since(origin);
        if self.judge(now, at, false) == Some(SpikeTransition::Entered) {
            let rule = self.rule?;
            self.carried = Some((rule, now));
            return Some(rule);
        }
        None
    }

    /// The spike entered on a [`tick`](Self::tick) since the last call, with its instant, for
    /// the `lmperf.spike.entered` event of the next canary span.
    pub fn take_carried(&mut self) -> Option<(SpikeRule, Instant)> {
        self.carried.take()
    }

    pub fn in_spike(&self) -> bool {
        self.spike_until.is_some()
    }

    /// The rule that started the current spike (`None` outside spike mode).
    pub fn spike_rule(&self) -> Option<SpikeRule> {
        self.rule
    }

    /// Decides on one finished request at `now`.
    pub fn decide(&mut self, now: Instant, o: Observed) -> Decision {
        let transition = self.update_window(now, o);
        let p = self.policy;
        let slo_breach = p.slo_ttft.is_some_and(|t| o.ttft.is_some_and(|v| v > t))
            || p.slo_e2e.is_some_and(|t| o.e2e > t);
        let (keep, reason, probability) = if o.failed || o.cancelled {
            (true, Reason::Error, 1.0)
        } else if slo_breach {
            (true, Reason::SloBreach, 1.0)
        } else if self.in_spike() || transition.is_some() {
            (true, Reason::Spike, 1.0)
        } else {
            let keep = threshold::keeps(o.trace_id, p.base_ratio) && self.take_token(now);
            (keep, Reason::Base, p.base_ratio)
        };
        let spike = if transition == Some(SpikeTransition::Entered) {
            self.rule
        } else {
            None
        };
        Decision {
            keep,
            reason,
            probability,
            transition,
            spike,
        }
    }

    fn take_token(&mut self, now: Instant) -> bool {
        let rate = self.policy.max_base_per_second;
        let cap = rate.max(1.0);
        if let Some(last) = self.last_refill {
            self.tokens =
                (self.tokens + now.saturating_duration_since(last).as_secs_f64() * rate).min(cap);
        }
        self.last_refill = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn update_window(&mut self, now: Instant, o: Observed) -> Option<SpikeTransition> {
        let origin = *self.origin.get_or_insert(now);
        let at = now.saturating_duration_since(origin);
        self.in_flight.end(o.trace_id);
        if !o.cancelled {
            self.window.push_back((now, o.failed, Some(o.e2e)));
            self.errors_in_window += o.failed as usize;
            // A measured TTFT is evidence whatever the outcome; a timeout's E2E is a lower bound.
            if let Some(t) = o.ttft {
                self.ttft.push(at, t.as_secs_f64());
            }
            if !o.failed || o.timed_out {
                self.e2e.push(at, o.e2e.as_secs_f64());
            }
        }
        self.judge(now, at, true)
    }

    /// Drops what left the window and updates spike mode (leaving it only when `may_leave`).
    fn judge(&mut self, now: Instant, at: Duration, may_leave: bool) -> Option<SpikeTransition> {
        while let Some(&(t, failed, _)) = self.window.front() {
            if now.saturating_duration_since(t) > self.policy.spike_window
                || self.window.len() > MAX_WINDOW
            {
                self.window.pop_front();
                self.errors_in_window -= failed as usize;
            } else {
                break;
            }
        }
        let in_spike = self.in_spike();
        // Hysteresis: staying in a spike needs less than entering one.
        let (err_factor, lat_factor) = if in_spike { (0.5, 0.8) } else { (1.0, 1.0) };
        if let Some(rule) = self.hot(now, at, err_factor, lat_factor) {
            self.spike_until = Some(now + self.policy.spike_hold);
            if !in_spike {
                self.rule = Some(rule);
                return Some(SpikeTransition::Entered);
            }
            return None;
        }
        if let Some(until) = self.spike_until
            && now >= until
            && may_leave
        {
            self.spike_until = None;
            self.rule = None;
            return Some(SpikeTransition::Left);
        }
        None
    }

    /// The first rule that holds at `at` (detector time), if any.
    fn hot(
        &mut self,
        now: Instant,
        at: Duration,
        err_factor: f64,
        lat_factor: f64,
    ) -> Option<SpikeRule> {
        let p = self.policy;
        let n = self.window.len();
        if n >= p.spike_min_requests {
            let error_rate = self.errors_in_window as f64 / n as f64;
            if error_rate >= p.spike_error_rate * err_factor {
                return Some(SpikeRule::ErrorRate {
                    error_rate,
                    threshold: p.spike_error_rate,
                    requests: n,
                });
            }
            if let Some(t) = p.spike_p99 {
                let p99 = self.p99();
                if p99 >= t.mul_f64(lat_factor) {
                    return Some(SpikeRule::SloP99 {
                        p99_s: p99.as_secs_f64(),
                        threshold_s: t.as_secs_f64(),
                    });
                }
            }
        }
        let rule = p.spike_jump?.relaxed(lat_factor);
        // A canary in flight has no TTFT yet, but an E2E of at least its elapsed time.
        let bounds = self
            .origin
            .map(|o| self.in_flight.bounds(now, o))
            .unwrap_or_default();
        for (signal, series, bounds) in [
            ("ttft", &mut self.ttft, &[][..]),
            ("e2e", &mut self.e2e, &bounds[..]),
        ] {
            if let Some(a) = series.assess_with(at, &rule, bounds)
                && a.jumped
            {
                return Some(SpikeRule::LatencyJump {
                    signal,
                    p99_s: a.peak,
                    baseline_s: a.baseline.median,
                    ratio: a.ratio,
                    z: a.z,
                    in_flight: bounds.len(),
                });
            }
        }
        None
    }

    fn p99(&self) -> Duration {
        let mut v: Vec<Duration> = self.window.iter().filter_map(|e| e.2).collect();
        if v.is_empty() {
            return Duration::ZERO;
        }
        let last = v.len() - 1;
        let idx = (((v.len() as f64) * 0.99).ceil() as usize)
            .saturating_sub(1)
            .min(last);
        let (_, nth, _) = v.select_nth_unstable(idx);
        *nth
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spike rule's sentence keeps three significant digits of small latencies (as the
    /// diagnosis's values do).
    #[test]
    fn small_latencies_keep_significant_digits_in_the_rule() {
        let rule = SpikeRule::LatencyJump {
            signal: "e2e",
            p99_s: 0.431,
            baseline_s: 0.001_66,
            ratio: 259.9,
            z: 40.0,
            in_flight: 2,
        };
        assert_eq!(
            rule.describe(),
            "latency_jump: e2e p99 ≥ 431 ms = 259.9 × baseline 1.66 ms (z 40.0; 2 canaries still in flight)"
        );
    }

    fn obs(failed: bool, e2e_ms: u64, id: u128) -> Observed {
        Observed {
            failed,
            ttft: Some(Duration::from_millis(e2e_ms / 4)),
            e2e: Duration::from_millis(e2e_ms),
            trace_id: id,
            cancelled: false,
            timed_out: false,
        }
    }

    fn policy() -> SamplingPolicy {
        SamplingPolicy {
            spike_window: Duration::from_secs(3),
            spike_error_rate: 0.1,
            spike_hold: Duration::from_secs(5),
            max_base_per_second: 1000.0,
            ..SamplingPolicy::default()
        }
    }

    /// A simple LCG for trace ids.
    fn ids() -> impl FnMut() -> u128 {
        let mut x: u128 = 42;
        move || {
            x = x
                .wrapping_mul(0x2360_ED05_1FC6_5DA4_4385_DF64_9FCC_F645)
                .wrapping_add(0x5851_F42D_4C95_7F2D_1405_7B7E_F767_814F);
            x
        }
    }

    #[tokio::test(start_paused = true)]
    async fn calm_burst_calm() {
        let mut s = TargetSampler::new(policy());
        let mut id = ids();
        let step = Duration::from_millis(50); // 20 req/s
        let t0 = Instant::now();
        let (mut kept_calm, mut calm) = (0, 0);
        for _ in 0..200 {
            tokio::time::advance(step).await;
            let d = s.decide(Instant::now(), obs(false, 100, id()));
            assert_eq!(d.reason, Reason::Base);
            calm += 1;
            kept_calm += d.keep as u32;
        }
        assert!(
            (10..=32).contains(&kept_calm),
            "kept {kept_calm} of {calm} calm spans"
        );
        // Burst: 30 % errors for 20 s.
        let burst_start = Instant::now();
        let mut entered_at = None;
        for i in 0..400 {
            tokio::time::advance(step).await;
            let d = s.decide(Instant::now(), obs(i % 10 < 3, 100, id()));
            if d.transition == Some(SpikeTransition::Entered) {
                entered_at = Some(Instant::now() - burst_start);
            }
            if entered_at.is_some() {
                assert!(d.keep, "everything kept in a spike");
            }
        }
        let entered = entered_at.expect("spike entered");
        assert!(
            entered <= Duration::from_secs(2),
            "entered after {entered:?}"
        );
        // Calm again: leaves after the window drains and the hold passes, once.
        let burst_end = Instant::now();
        let mut left_at = None;
        for _ in 0..400 {
            tokio::time::advance(step).await;
            let d = s.decide(Instant::now(), obs(false, 100, id()));
            match d.transition {
                Some(SpikeTransition::Left) => {
                    assert!(left_at.is_none(), "left twice");
                    left_at = Some(Instant::now() - burst_end);
                }
                Some(SpikeTransition::Entered) => panic!("flapped"),
                None => {}
            }
        }
        let left = left_at.expect("spike left");
        assert!(
            left >= Duration::from_secs(5) && left <= Duration::from_secs(9),
            "left {left:?} after the burst"
        );
        let _ = t0;
    }

    #[tokio::test(start_paused = true)]
    async fn errors_and_slo_breaches_always_kept_and_base_is_rate_capped() {
        let mut s = TargetSampler::new(SamplingPolicy {
            slo_e2e: Some(Duration::from_millis(500)),
            base_ratio: 1.0,
            max_base_per_second: 2.0,
            spike_min_requests: 1000,
            ..SamplingPolicy::default()
        });
        let mut id = ids();
        let now = Instant::now();
        assert_eq!(s.decide(now, obs(true, 10, id())).reason, Reason::Error);
        let d = s.decide(now, obs(false, 900, id()));
        assert!(d.keep && d.reason == Reason::SloBreach);
        // Ratio 1.0 but 2/s cap: 10 healthy spans at one instant, 2 kept.
        let kept = (0..10)
            .filter(|_| s.decide(now, obs(false, 10, id())).keep)
            .count();
        assert_eq!(kept, 2);
        tokio::time::advance(Duration::from_secs(1)).await;
        let kept = (0..10)
            .filter(|_| s.decide(Instant::now(), obs(false, 10, id())).keep)
            .count();
        assert_eq!(kept, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn latency_spike_uses_window_p99() {
        let mut s = TargetSampler::new(SamplingPolicy {
            spike_p99: Some(Duration::from_millis(400)),
            spike_window: Duration::from_secs(2),
            spike_min_requests: 10,
            ..SamplingPolicy::default()
        });
        let mut id = ids();
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(50)).await;
            assert!(
                !s.in_spike()
                    && s.decide(Instant::now(), obs(false, 100, id()))
                        .transition
                        .is_none()
            );
        }
        let mut entered = false;
        for _ in 0..5 {
            tokio::time::advance(Duration::from_millis(50)).await;
            entered |= s.decide(Instant::now(), obs(false, 900, id())).transition
                == Some(SpikeTransition::Entered);
        }
        assert!(entered && s.in_spike());
    }

    #[tokio::test(start_paused = true)]
    async fn latency_jump_without_slo_enters_with_its_values_and_leaves_after_hold() {
        let mut s = TargetSampler::new(SamplingPolicy {
            spike_hold: Duration::from_secs(20),
            ..SamplingPolicy::default()
        });
        let mut id = ids();
        let step = Duration::from_millis(500); // 2 canaries/s
        // 2 min calm at TTFT 100 ms (E2E 400 ms).
        for _ in 0..240 {
            tokio::time::advance(step).await;
            let d = s.decide(Instant::now(), obs(false, 400, id()));
            assert!(d.transition.is_none() && d.reason == Reason::Base);
        }
        // TTFT jumps to 1 s (E2E 4 s) for 40 s.
        let jump = Instant::now();
        let mut entered = None;
        for _ in 0..80 {
            tokio::time::advance(step).await;
            let d = s.decide(Instant::now(), obs(false, 4000, id()));
            if d.transition == Some(SpikeTransition::Entered) {
                entered = Some((Instant::now() - jump, d.spike));
            }
            if entered.is_some() {
                assert!(d.keep && d.reason == Reason::Spike);
            }
        }
        let (after, rule) = entered.expect("spike entered");
        // The bucket in progress counts after 5 samples; 2 of the last 3 buckets must jump.
        assert!(
            after <= Duration::from_secs(20),
            "entered {after:?} after the jump"
        );
        let Some(SpikeRule::LatencyJump {
            signal,
            p99_s,
            baseline_s,
            ratio,
            z,
            ..
        }) = rule
        else {
            panic!("{rule:?}")
        };
        assert_eq!((signal, p99_s, baseline_s), ("ttft", 1.0, 0.1));
        assert!((ratio - 10.0).abs() < 1e-9 && z > 100.0, "{ratio} {z}");
        assert_eq!(s.spike_rule(), rule);
        // Calm again: the hold runs from the last hot request; one exit, no flapping.
        let calm = Instant::now();
        let mut left = None;
        for _ in 0..120 {
            tokio::time::advance(step).await;
            let d = s.decide(Instant::now(), obs(false, 400, id()));
            match d.transition {
                Some(SpikeTransition::Left) => left = Some(Instant::now() - calm),
                Some(SpikeTransition::Entered) => panic!("flapped"),
                None => assert_eq!(
                    d.keep && left.is_none(),
                    left.is_none(),
                    "kept until the hold ends"
                ),
            }
        }
        let left = left.expect("left");
        assert!(
            left >= Duration::from_secs(20) && left <= Duration::from_secs(45),
            "left {left:?} after calm"
        );
        assert_eq!(s.spike_rule(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn one_or_two_outliers_per_bucket_never_enter_three_do() {
        // Calm at 1/s (TTFT 100 ms), then one canary at 1 s in each of three buckets: a bucket's
        // p99 is never its lone largest sample. Then two per bucket: under a quarter of the
        // bucket (`spike_jump_min_share`), jitter. Then three per bucket: entered.
        let mut s = TargetSampler::new(jump_only());
        let mut id = ids();
        let step = Duration::from_secs(1);
        for _ in 0..150 {
            tokio::time::advance(step).await;
            assert!(
                s.decide(Instant::now(), obs(false, 400, id()))
                    .transition
                    .is_none()
            );
        }
        for slow in [&[3][..], &[3, 6]] {
            for i in 0..30 {
                tokio::time::advance(step).await;
                let e2e = if slow.contains(&(i % 10)) { 4000 } else { 400 };
                assert!(
                    s.decide(Instant::now(), obs(false, e2e, id()))
                        .transition
                        .is_none(),
                    "{slow:?}: entered at {i}"
                );
            }
        }
        let mut entered = None;
        for i in 0..30 {
            tokio::time::advance(step).await;
            let e2e = if [3, 6, 8].contains(&(i % 10)) {
                4000
            } else {
                400
            };
            entered = entered.or(s
                .decide(Instant::now(), obs(false, e2e, id()))
                .spike
                .map(|r| (i, r)));
        }
        let (i, rule) = entered.expect("entered");
        assert!(
            i <= 20 && matches!(rule, SpikeRule::LatencyJump { signal: "ttft", .. }),
            "{i} {rule:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn agent_cancellations_never_count() {
        let mut s = TargetSampler::new(policy());
        let mut id = ids();
        for _ in 0..50 {
            tokio::time::advance(Duration::from_millis(50)).await;
            s.decide(Instant::now(), obs(false, 100, id()));
        }
        // Shutdown: every canary in flight is cancelled at once.
        for _ in 0..20 {
            let d = s.decide(
                Instant::now(),
                Observed {
                    cancelled: true,
                    ttft: None,
                    ..obs(true, 5000, id())
                },
            );
            assert!(
                d.keep && d.reason == Reason::Error && d.transition.is_none(),
                "{d:?}"
            );
        }
        assert!(!s.in_spike());
        // A real failure still counts.
        for _ in 0..10 {
            s.decide(Instant::now(), obs(true, 100, id()));
        }
        // The window (3 s at 20/s) holds the real requests only: the 20 cancelled ones are absent.
        let Some(SpikeRule::ErrorRate {
            error_rate,
            requests,
            ..
        }) = s.spike_rule()
        else {
            panic!("{:?}", s.spike_rule())
        };
        assert!(
            requests <= 60 && (error_rate * requests as f64).round() <= 10.0,
            "{requests} {error_rate}"
        );
    }

    #[test]
    fn effective_min_requests_fits_the_window() {
        let w = Duration::from_secs(30);
        assert_eq!(effective_min_requests(10, w, 0.2), (6, true));
        assert_eq!(effective_min_requests(10, w, 10.0), (10, true));
        assert_eq!(
            effective_min_requests(10, Duration::from_secs(10), 0.2),
            (3, false)
        );
        assert_eq!(
            effective_min_requests(2, Duration::from_secs(5), 0.2),
            (2, false)
        );
        assert_eq!(effective_min_requests(2, w, 0.2), (2, true));
    }

    /// The README's defaults at one canary per 5 s (effective minimum 6): a target that goes
    /// down enters spike mode on the error-rate rule.
    #[tokio::test(start_paused = true)]
    async fn target_down_enters_spike_at_default_settings() {
        let (min, ok) = effective_min_requests(10, Duration::from_secs(30), 0.2);
        let mut s = TargetSampler::new(SamplingPolicy {
            spike_min_requests: min,
            ..SamplingPolicy::default()
        });
        assert!(ok);
        let mut id = ids();
        for _ in 0..12 {
            tokio::time::advance(Duration::from_secs(5)).await;
            assert!(
                s.decide(Instant::now(), obs(false, 400, id()))
                    .transition
                    .is_none()
            );
        }
        let mut entered = None;
        for i in 0..8 {
            tokio::time::advance(Duration::from_secs(5)).await;
            let d = s.decide(
                Instant::now(),
                Observed {
                    ttft: None,
                    ..obs(true, 1, id())
                },
            );
            if d.transition == Some(SpikeTransition::Entered) {
                entered = Some((i, d.spike));
            }
        }
        let (i, rule) = entered.expect("spike entered");
        assert_eq!(i, 0, "the first failure of a window of 6 is 17 %");
        assert!(
            matches!(
                rule,
                Some(SpikeRule::ErrorRate {
                    requests: 6..=7,
                    ..
                })
            ),
            "{rule:?}"
        );
    }

    /// Rules other than the jump off: only the TTFT/E2E series can start a spike.
    fn jump_only() -> SamplingPolicy {
        SamplingPolicy {
            spike_min_requests: usize::MAX,
            ..SamplingPolicy::default()
        }
    }

    async fn calm(s: &mut TargetSampler, id: &mut impl FnMut() -> u128) {
        for _ in 0..240 {
            tokio::time::advance(Duration::from_millis(500)).await;
            assert!(
                s.decide(Instant::now(), obs(false, 400, id()))
                    .transition
                    .is_none()
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_canaries_with_a_ttft_feed_the_ttft_series() {
        let mut s = TargetSampler::new(jump_only());
        let mut id = ids();
        calm(&mut s, &mut id).await;
        // Timeouts after a first token at 47 s (TTFT measured, stream cut).
        let mut rule = None;
        for _ in 0..60 {
            tokio::time::advance(Duration::from_millis(500)).await;
            let o = Observed {
                ttft: Some(Duration::from_secs(47)),
                e2e: Duration::from_secs(60),
                timed_out: true,
                ..obs(true, 0, id())
            };
            rule = rule.or(s.decide(Instant::now(), o).spike);
        }
        let Some(SpikeRule::LatencyJump { signal, p99_s, .. }) = rule else {
            panic!("{rule:?}")
        };
        assert_eq!((signal, p99_s), ("ttft", 47.0));
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_feed_the_e2e_series_but_other_failures_do_not() {
        // An error without a TTFT (connection refused, 500): no latency evidence.
        let mut s = TargetSampler::new(jump_only());
        let mut id = ids();
        calm(&mut s, &mut id).await;
        for _ in 0..60 {
            tokio::time::advance(Duration::from_millis(500)).await;
            let d = s.decide(
                Instant::now(),
                Observed {
                    ttft: None,
                    ..obs(true, 30_000, id())
                },
            );
            assert!(d.transition.is_none());
        }
        // A timeout without a first token: its elapsed time is an E2E lower bound.
        let mut s = TargetSampler::new(jump_only());
        calm(&mut s, &mut id).await;
        let mut rule = None;
        for _ in 0..60 {
            tokio::time::advance(Duration::from_millis(500)).await;
            let o = Observed {
                ttft: None,
                timed_out: true,
                ..obs(true, 30_000, id())
            };
            rule = rule.or(s.decide(Instant::now(), o).spike);
        }
        let Some(SpikeRule::LatencyJump { signal, p99_s, .. }) = rule else {
            panic!("{rule:?}")
        };
        assert_eq!((signal, p99_s), ("e2e", 30.0));
    }
}
