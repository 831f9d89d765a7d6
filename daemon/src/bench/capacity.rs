//! Capacity search (`lmperf run --find-max-rate`): the highest open-loop request rate at
//! which every SLO holds, and the knee where queueing starts. A pure engine: no clock, no IO;
//! its caller measures each step it asks for ([`Search::next`]) and feeds the result back
//! ([`Search::feed`]).
//!
//! **Search.** Bracketing from the start rate (doubling while the SLOs hold, halving while they
//! break), then bisection between the highest passing and the lowest failing rate until
//! `(fail − pass) / pass ≤ precision`. The answer is the highest passing rate, so it is at
//! most `precision` below the true limit. A step counts at the rate it put to the server
//! ([`StepObservation::tested_rate`]): the offered rate, or the rate actually sent when fewer
//! came (a Poisson draw of 473 arrivals is ±4.6 % off its rate; a loaded sender falls
//! behind), so a pass is never credited to a rate the server was not shown.
//!
//! **Throughput probe** ([`Search::probed`], the default without a start rate; as GuideLLM's
//! sweep sets its bounds with a throughput run first): one short closed-loop run at full
//! concurrency ([`Next::Probe`]) measures the server's throughput `C`; no open-loop rate above
//! it can be kept up. The bracket's top is then a tentative `C × (1 + `[`CEILING_MARGIN`]`)`
//! and the first step is [`PROBE_START`]` × C`; bisection runs inside it. The tentative top is
//! never an answer: a search that would stop against it measures it first, and if it passes
//! (the probe understated the server) the search doubles from there as without a probe. Every
//! step keeps the order-statistic length below, so a pass has the same guarantee either way;
//! the probe only saves the doubling from a low start (each doubling step lasts `n / rate`).
//! When the first step fails, the next steps down go by [`PROBE_START`] while above half the
//! probe's throughput, then halve.
//!
//! **Step length (the order-statistic rule).** A step of `n` requests estimates the `q`
//! quantile. Distribution-free, the `k`-th smallest of `n` values is an upper confidence bound
//! of level `1 − α` for the `q` quantile when `P(Binomial(n, q) ≤ k − 1) ≥ 1 − α`. A step is
//! long enough when that bound is not the sample maximum (at least one value above it):
//! `n` = the smallest with `k(n) ≤ n − 1`. With `α = 0.05`: p99 → 473 requests, p95 → 93,
//! p90 → 46. An SLO holds at a step when that upper bound is within the limit (95 % confident
//! that the quantile is), so a pass is never a lucky sample.
//!
//! A step fails when an SLO's bound is over its limit, a request failed, or the achieved rate
//! fell behind the offered one (below `max(`[`ACHIEVED_FLOOR`]`, 1 − precision)` of it: with
//! short requests a step of n requests is too short for a small overload to show in latency,
//! but completions then come at the capacity, not the offered rate).
//!
//! **Over-saturation (the knee).** A step is queueing when the achieved rate falls behind the
//! offered one (as above), when its median TTFT rose above
//! [`LATENCY_RISE`] × the lowest rate's (latency vs rate leaves its flat part), or when the
//! server's waiting queue (a hook: [`StepObservation::server_waiting`], from the server's
//! metrics when the caller has them) is above 0 on average. The knee is the lowest queueing
//! rate.

use serde::Serialize;

/// Confidence of the per-step upper bound of a quantile.
pub const CONFIDENCE: f64 = 0.95;
/// Achieved rate below this fraction of the offered rate (or below `1 − precision`, whichever
/// is higher): the server falls behind.
pub const ACHIEVED_FLOOR: f64 = 0.9;
/// Median TTFT above this multiple of the lowest rate's: queueing.
pub const LATENCY_RISE: f64 = 1.5;
/// The search halves the start rate at most until `start / MIN_RATE_DIVISOR` (steps at low
/// rates take long: n requests at r req/s last n / r s); below it: `no_rate_passes`.
pub const MIN_RATE_DIVISOR: f64 = 16.0;
/// Steps at most (bracketing and bisection together).
pub const MAX_STEPS: usize = 24;
/// The tentative bracket top after a throughput probe: this fraction above its throughput
/// (the probe is short and closed loop: it may understate the server a little).
pub const CEILING_MARGIN: f64 = 0.1;
/// The first step after a throughput probe, as a fraction of its throughput (servers' knees
/// lie between about 0.6 and 0.95 of their throughput; bisection from here takes the fewest
/// steps over that span).
pub const PROBE_START: f64 = 0.75;

/// A latency metric an SLO bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Ttft,
    Tpot,
    Itl,
    E2el,
}

impl Metric {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "ttft" => Some(Self::Ttft),
            "tpot" => Some(Self::Tpot),
            "itl" => Some(Self::Itl),
            "e2el" => Some(Self::E2el),
            _ => None,
        }
    }
}

/// One `--slo` item: `ttft_p99:500ms`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Slo {
    pub text: String,
    pub metric: Metric,
    /// In (0, 1): 0.99 for p99.
    pub quantile: f64,
    pub limit_ms: f64,
}

impl Slo {
    /// Parses `METRIC_pQ:LIMIT` with a `ms` or `s` unit (`ttft_p99:500ms`, `e2el_p90:2s`).
    ///
    /// # Errors
    /// One line naming the value and the expected form.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "--slo {text:?}: {why} (e.g. ttft_p99:500ms tpot_p99:50ms; metrics ttft, tpot, itl, e2el)"
            )
        };
        let (name, limit) = text
            .split_once(':')
            .ok_or_else(|| bad("expected METRIC_pQ:LIMIT"))?;
        let (metric, q) = name
            .split_once("_p")
            .ok_or_else(|| bad("expected METRIC_pQ"))?;
        let metric = Metric::parse(metric).ok_or_else(|| bad("unknown metric"))?;
        let quantile = q
            .parse::<f64>()
            .ok()
            .map(|p| p / 100.0)
            .filter(|q| *q > 0.0 && *q < 1.0)
            .ok_or_else(|| bad("the quantile is pQ with 0 < Q < 100"))?;
        let limit_ms = limit
            .strip_suffix("ms")
            .and_then(|v| v.parse::<f64>().ok())
            .or_else(|| {
                limit
                    .strip_suffix('s')
                    .and_then(|v| v.parse::<f64>().ok())
                    .map(|s| s * 1000.0)
            })
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| bad("the limit is a positive duration in ms or s"))?;
        Ok(Self {
            text: text.to_owned(),
            metric,
            quantile,
            limit_ms,
        })
    }
}

/// The smallest `k` (1-based) such that the `k`-th smallest of `n` values is a `confidence`
/// upper bound of the `q` quantile: `P(Binomial(n, q) ≤ k − 1) ≥ confidence`; `None` when
/// even the maximum is not.
pub fn upper_bound_rank(n: usize, q: f64, confidence: f64) -> Option<usize> {
    // Binomial pmf by the recurrence from i = 0, in logs for large n.
    let (lq, lp) = (q.ln(), (1.0 - q).ln());
    let mut log_pmf = n as f64 * lp; // P(X = 0) = (1 − q)^n
    let mut cdf = log_pmf.exp();
    for k in 1..=n {
        if cdf >= confidence {
            return Some(k);
        }
        // P(X = k) = P(X = k − 1) · (n − k + 1)/k · q/(1 − q)
        log_pmf += ((n - k + 1) as f64 / k as f64).ln() + lq - lp;
        cdf += log_pmf.exp();
    }
    None
}

/// Requests per step for quantile `q`: the smallest `n` whose upper confidence bound
/// ([`upper_bound_rank`] at [`CONFIDENCE`]) leaves at least one value above it.
pub fn step_requests(q: f64) -> usize {
    (2..100_000)
        .find(|&n| upper_bound_rank(n, q, CONFIDENCE).is_some_and(|k| k < n))
        .unwrap_or(100_000)
}

/// What the caller measured at one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepObservation {
    pub offered_rate: f64,
    /// Completions per second over the step: (completed − 1) / (last end − first end), so
    /// the requests' own latency does not count as a slower rate.
    pub achieved_rate: f64,
    /// The arrival rate the step's schedule realized: (sent − 1) / (last send − first send).
    /// Poisson arrivals of n requests are ±1/√n off the offered rate (±4.6 % at 473), so
    /// whether the server kept up is judged against this when present, not the offered rate.
    pub sent_rate: Option<f64>,
    pub requests: usize,
    pub failed: usize,
    /// Successful requests' values per metric, milliseconds, any order.
    pub ttft_ms: Vec<f64>,
    pub tpot_ms: Vec<f64>,
    pub itl_ms: Vec<f64>,
    pub e2el_ms: Vec<f64>,
    /// Mean of the server's waiting queue during the step (vLLM `num_requests_waiting`,
    /// llama.cpp `requests_deferred`); `None` without server metrics.
    pub server_waiting: Option<f64>,
}

impl StepObservation {
    /// The rate the step put to the server, req/s: the offered rate, or the realized send
    /// rate when it came lower (a Poisson schedule's draw, or a sender that fell behind). A
    /// pass counts for the rate the server was shown, never for one it was not; a send rate
    /// above the offered one counts as the offered (the conservative side of either verdict).
    pub fn tested_rate(&self) -> f64 {
        self.sent_rate
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(self.offered_rate, |s| s.min(self.offered_rate))
    }

    fn values(&self, m: Metric) -> &[f64] {
        match m {
            Metric::Ttft => &self.ttft_ms,
            Metric::Tpot => &self.tpot_ms,
            Metric::Itl => &self.itl_ms,
            Metric::E2el => &self.e2el_ms,
        }
    }
}

/// One SLO at one step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloCheck {
    pub slo: String,
    /// The sample quantile (numpy's linear interpolation), ms.
    pub value_ms: Option<f64>,
    /// Its 95 % upper confidence bound (an order statistic), ms; the verdict uses it.
    pub upper_bound_ms: Option<f64>,
    pub holds: bool,
}

impl SloCheck {
    /// `ttft_p99:500ms 312 ms / bound 340 ms`.
    pub fn brief(&self) -> String {
        use crate::fmt::duration_ms;
        format!(
            "{} {} / bound {}",
            self.slo,
            duration_ms(self.value_ms.unwrap_or(f64::NAN)),
            duration_ms(self.upper_bound_ms.unwrap_or(f64::NAN))
        )
    }
}

/// A row of `summary.json` `capacity.steps`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    pub offered_rate: f64,
    /// The rate the verdict counts for the bracket, req/s: the offered rate, or the rate
    /// actually sent when fewer came (see [`StepObservation::tested_rate`]).
    pub tested_rate: f64,
    pub achieved_rate: f64,
    /// See [`StepObservation::sent_rate`].
    pub sent_rate: Option<f64>,
    pub requests: usize,
    pub failed: usize,
    pub ttft_p50_ms: Option<f64>,
    pub slos: Vec<SloCheck>,
    pub server_waiting: Option<f64>,
    /// Every SLO holds, nothing failed, and the achieved rate kept up.
    pub passed: bool,
    /// Why the step counts as queueing (`achieved_behind_offered`, `latency_rise`,
    /// `server_waiting`); empty when it does not.
    pub queueing: Vec<&'static str>,
}

/// `summary.json` `capacity`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capacity {
    pub slos: Vec<Slo>,
    pub precision: f64,
    /// Requests per step and the rule that set it.
    pub step_requests: usize,
    pub step_rule: String,
    /// Highest rate at which every SLO held (req/s; a step's [`Step::tested_rate`]: offered,
    /// or as sent when fewer came); null when none did.
    pub max_rate: Option<f64>,
    /// Lowest rate that broke an SLO (a step's [`Step::tested_rate`], the bracket's top),
    /// null when none did.
    pub failing_rate: Option<f64>,
    /// Lowest offered rate where queueing started (the over-saturation point), null if none.
    pub knee_rate: Option<f64>,
    pub knee_reasons: Vec<&'static str>,
    /// Every step in the order measured.
    pub steps: Vec<Step>,
    /// Throughput of the closed-loop probe at full concurrency that set the bracket (req/s);
    /// null without a probe (a start rate given) or when the probe completed nothing.
    pub probe_rate: Option<f64>,
    /// Why the search stopped: `precision`, `max_steps`, `no_rate_passes`, `max_rate_cap`,
    /// `interrupted` (Ctrl-C: the steps measured so far).
    pub stopped: &'static str,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Measure the throughput of `requests` requests all due at once (closed loop at full
    /// concurrency); feed it with [`Search::feed_probe`].
    Probe {
        requests: usize,
    },
    /// Measure `requests` requests offered at `rate` req/s.
    Measure {
        rate: f64,
        requests: usize,
    },
    Done,
}

/// The search's state.
#[derive(Debug, Clone)]
pub struct Search {
    slos: Vec<Slo>,
    precision: f64,
    requests: usize,
    start: f64,
    max_rate: f64,
    min_rate: f64,
    pass: Option<f64>,
    fail: Option<f64>,
    steps: Vec<Step>,
    stopped: Option<&'static str>,
    probe: Probe,
}

/// Where the throughput probe stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Probe {
    /// No probe (a start rate given).
    None,
    Pending,
    /// Its throughput (req/s) when it completed anything; the tentative bracket top.
    Done {
        rate: Option<f64>,
        ceiling: Option<f64>,
    },
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let pos = q * (n - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64))
}

impl Search {
    /// A search for `slos` from `start` req/s, to `precision` (0.05 = 5 %), never above
    /// `max_rate`; `requests` per step, or the rule's ([`step_requests`] of the highest SLO
    /// quantile) when `None`.
    pub fn new(
        slos: Vec<Slo>,
        precision: f64,
        start: f64,
        max_rate: f64,
        requests: Option<usize>,
    ) -> Self {
        let q = slos.iter().map(|s| s.quantile).fold(0.5, f64::max);
        let requests = requests.unwrap_or_else(|| step_requests(q)).max(1);
        Self {
            slos,
            precision,
            requests,
            start,
            max_rate,
            min_rate: start / MIN_RATE_DIVISOR,
            pass: None,
            fail: None,
            steps: Vec::new(),
            stopped: None,
            probe: Probe::None,
        }
    }

    /// A search that starts with a throughput probe ([`Next::Probe`]) and brackets from it
    /// (see the module doc); without a usable probe it starts at `fallback_start` req/s.
    pub fn probed(
        slos: Vec<Slo>,
        precision: f64,
        fallback_start: f64,
        max_rate: f64,
        requests: Option<usize>,
    ) -> Self {
        Self {
            probe: Probe::Pending,
            ..Self::new(slos, precision, fallback_start, max_rate, requests)
        }
    }

    /// Feeds the probe's throughput (completions per second; `None` or not positive when it
    /// completed nothing: the search then starts at its fallback rate).
    pub fn feed_probe(&mut self, throughput: Option<f64>) {
        let rate = throughput.filter(|r| r.is_finite() && *r > 0.0);
        let ceiling = rate.map(|r| (r * (1.0 + CEILING_MARGIN)).min(self.max_rate));
        if let Some(r) = rate {
            self.start = (r * PROBE_START).min(self.max_rate);
            self.min_rate = self.start / MIN_RATE_DIVISOR;
        }
        self.probe = Probe::Done { rate, ceiling };
    }

    /// Fraction of the offered rate the achieved rate must reach.
    pub fn achieved_floor(&self) -> f64 {
        (1.0 - self.precision).max(ACHIEVED_FLOOR)
    }

    /// Requests per step.
    pub fn step_requests(&self) -> usize {
        self.requests
    }

    /// The next step to measure, or done.
    pub fn next(&self) -> Next {
        if self.stopped.is_some() {
            return Next::Done;
        }
        if self.probe == Probe::Pending {
            return Next::Probe {
                requests: self.requests,
            };
        }
        // The probe's tentative top while no measured failure and no pass reached it.
        let ceiling = match self.probe {
            Probe::Done {
                ceiling: Some(c), ..
            } if self.pass.is_none_or(|p| p < c) => Some(c),
            _ => None,
        };
        let rate = match (self.pass, self.fail) {
            (None, None) => self.start,
            (Some(p), None) => match ceiling {
                // Close enough to the tentative top: measure it (an answer needs a measured
                // failure above it).
                Some(c) if (c - p) / p <= self.precision => c,
                Some(c) => (p * c).sqrt(),
                None => (p * 2.0).min(self.max_rate),
            },
            // Below the probe's first step: down by its fraction while near the probe's
            // throughput (a server's SLO limit usually is), halving further down.
            (None, Some(f)) => match self.probe {
                Probe::Done { rate: Some(c), .. } if f >= 0.5 * c => f * PROBE_START,
                _ => f / 2.0,
            },
            // Geometric midpoint: the bracket's ratio halves in log steps.
            (Some(p), Some(f)) => (p * f).sqrt(),
        };
        Next::Measure {
            rate,
            requests: self.requests,
        }
    }

    /// Feeds the measurement of the step [`Search::next`] asked for.
    pub fn feed(&mut self, obs: StepObservation) {
        let mut slos = Vec::with_capacity(self.slos.len());
        for s in &self.slos {
            let mut v: Vec<f64> = obs
                .values(s.metric)
                .iter()
                .copied()
                .filter(|x| x.is_finite())
                .collect();
            v.sort_by(f64::total_cmp);
            let upper = upper_bound_rank(v.len(), s.quantile, CONFIDENCE).map(|k| v[k - 1]);
            // Too few values for a bound: the maximum stands in (conservative).
            let upper = upper.or_else(|| v.last().copied());
            slos.push(SloCheck {
                slo: s.text.clone(),
                value_ms: quantile(&v, s.quantile),
                upper_bound_ms: upper,
                holds: upper.is_some_and(|u| u <= s.limit_ms),
            });
        }
        let kept_up =
            obs.achieved_rate >= self.achieved_floor() * obs.sent_rate.unwrap_or(obs.offered_rate);
        let passed = obs.failed == 0 && kept_up && slos.iter().all(|c| c.holds);
        let mut ttft = obs.ttft_ms.clone();
        ttft.sort_by(f64::total_cmp);
        let step = Step {
            offered_rate: obs.offered_rate,
            tested_rate: obs.tested_rate(),
            achieved_rate: obs.achieved_rate,
            sent_rate: obs.sent_rate,
            requests: obs.requests,
            failed: obs.failed,
            ttft_p50_ms: quantile(&ttft, 0.5),
            slos,
            server_waiting: obs.server_waiting,
            passed,
            queueing: Vec::new(),
        };
        let r = step.tested_rate;
        if passed {
            self.pass = Some(self.pass.map_or(r, |p| p.max(r)));
        } else {
            self.fail = Some(self.fail.map_or(r, |f| f.min(r)));
        }
        self.steps.push(step);
        self.stopped = match (self.pass, self.fail) {
            _ if self.steps.len() >= MAX_STEPS => Some("max_steps"),
            (Some(p), Some(f)) if (f - p) / p <= self.precision => Some("precision"),
            (Some(p), None) if p >= self.max_rate => Some("max_rate_cap"),
            (None, Some(f)) if f / 2.0 < self.min_rate => Some("no_rate_passes"),
            _ => None,
        };
    }

    /// Ctrl-C: the search ends where it is (`stopped`: `interrupted`).
    pub fn interrupt(&mut self) {
        self.stopped = Some("interrupted");
    }

    /// The result so far (complete once [`Search::next`] says done).
    pub fn result(&self) -> Capacity {
        let mut steps = self.steps.clone();
        let mut order: Vec<usize> = (0..steps.len()).collect();
        order.sort_by(|&a, &b| steps[a].offered_rate.total_cmp(&steps[b].offered_rate));
        let base = order.first().and_then(|&i| steps[i].ttft_p50_ms);
        for &i in &order {
            let s = &mut steps[i];
            if s.achieved_rate < self.achieved_floor() * s.sent_rate.unwrap_or(s.offered_rate) {
                s.queueing.push("achieved_behind_offered");
            }
            if let (Some(b), Some(v)) = (base, s.ttft_p50_ms)
                && v > LATENCY_RISE * b
            {
                s.queueing.push("latency_rise");
            }
            if s.server_waiting.is_some_and(|w| w > 0.0) {
                s.queueing.push("server_waiting");
            }
        }
        let knee = order
            .iter()
            .map(|&i| &steps[i])
            .find(|s| !s.queueing.is_empty());
        Capacity {
            slos: self.slos.clone(),
            precision: self.precision,
            step_requests: self.requests,
            step_rule: format!(
                "requests per step: the smallest n whose {:.0} % distribution-free upper confidence bound of the p{} (an order statistic, P(Binomial(n, q) ≤ k − 1) ≥ {CONFIDENCE}) is not the sample maximum; an SLO holds when that bound is within its limit",
                CONFIDENCE * 100.0,
                self.slos.iter().map(|s| s.quantile).fold(0.5, f64::max) * 100.0
            ),
            max_rate: self.pass,
            failing_rate: self.fail,
            knee_rate: knee.map(|s| s.offered_rate),
            knee_reasons: knee.map(|s| s.queueing.clone()).unwrap_or_default(),
            steps,
            probe_rate: match self.probe {
                Probe::Done { rate, .. } => rate,
                Probe::None | Probe::Pending => None,
            },
            stopped: self.stopped.unwrap_or("running"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slos_parse_and_reject() {
        let s = Slo::parse("ttft_p99:500ms").unwrap();
        assert_eq!(
            (s.metric, s.quantile, s.limit_ms),
            (Metric::Ttft, 0.99, 500.0)
        );
        let s = Slo::parse("e2el_p90:2s").unwrap();
        assert_eq!((s.metric, s.limit_ms), (Metric::E2el, 2000.0));
        assert!((Slo::parse("tpot_p99.9:50ms").unwrap().quantile - 0.999).abs() < 1e-12);
        for bad in [
            "ttft:500ms",
            "ttft_p99:500",
            "lat_p99:5ms",
            "ttft_p100:5ms",
            "ttft_p99:-5ms",
            "ttft_p99",
        ] {
            let e = Slo::parse(bad).unwrap_err();
            assert!(e.starts_with(&format!("--slo {bad:?}")), "{e}");
        }
    }

    /// The rule's numbers, as stated in the module doc.
    #[test]
    fn step_lengths_from_the_order_statistic_bound() {
        assert_eq!(step_requests(0.99), 473);
        assert_eq!(step_requests(0.95), 93);
        assert_eq!(step_requests(0.9), 46);
        // At n = 299 the maximum is first a 95 % bound of the p99 (1 − 0.99^299 ≥ 0.95).
        assert_eq!(upper_bound_rank(298, 0.99, 0.95), None);
        assert_eq!(upper_bound_rank(299, 0.99, 0.95), Some(299));
        assert_eq!(upper_bound_rank(473, 0.99, 0.95), Some(472));
    }

    /// A server with capacity `cap` req/s: below it TTFT is 20 ms, above it the queue grows
    /// over the step (TTFT ∝ overload) and the achieved rate is the capacity.
    fn observe(rate: f64, n: usize, cap: f64) -> StepObservation {
        let over = (rate - cap).max(0.0);
        let span = n as f64 / rate;
        let ttft: Vec<f64> = (0..n)
            .map(|i| 20.0 + over / cap * span * 1000.0 * i as f64 / n as f64)
            .collect();
        StepObservation {
            offered_rate: rate,
            achieved_rate: rate.min(cap),
            requests: n,
            failed: 0,
            ttft_ms: ttft,
            ..StepObservation::default()
        }
    }

    #[test]
    fn brackets_then_bisects_to_the_precision() {
        for (cap, start) in [(80.0, 1.0), (80.0, 500.0), (3.3, 1.0), (1234.0, 10.0)] {
            let mut s = Search::new(
                vec![Slo::parse("ttft_p99:100ms").unwrap()],
                0.05,
                start,
                1e6,
                None,
            );
            let mut steps = 0;
            while let Next::Measure { rate, requests } = s.next() {
                assert_eq!(requests, 473);
                s.feed(observe(rate, requests, cap));
                steps += 1;
            }
            let c = s.result();
            let max = c.max_rate.unwrap();
            assert_eq!(c.stopped, "precision");
            assert!(
                (max - cap).abs() <= 0.05 * cap,
                "cap {cap} from {start}: found {max} in {steps} steps"
            );
            assert!(c.failing_rate.unwrap() > cap * 0.99, "{c:?}");
            // The knee: the first step past the capacity (latency rise and rate behind).
            let knee = c.knee_rate.unwrap();
            assert!(
                knee > cap && knee <= c.failing_rate.unwrap() * 2.0,
                "knee {knee} for cap {cap}"
            );
            assert!(steps < 16, "{steps}");
        }
    }

    /// Runs a search against [`observe`]'s server of capacity `cap`, the probe reading
    /// `probe`; the steps' rates in order.
    fn run_probed(cap: f64, probe: Option<f64>) -> (Capacity, Vec<f64>) {
        let mut s = Search::probed(
            vec![Slo::parse("ttft_p99:100ms").unwrap()],
            0.05,
            1.0,
            1e6,
            None,
        );
        let mut rates = Vec::new();
        let mut probes = 0;
        loop {
            match s.next() {
                Next::Probe { requests } => {
                    assert_eq!(requests, 473);
                    probes += 1;
                    s.feed_probe(probe);
                }
                Next::Measure { rate, requests } => {
                    assert_eq!(requests, 473, "every step keeps the p99 rule's length");
                    rates.push(rate);
                    s.feed(observe(rate, requests, cap));
                }
                Next::Done => break,
            }
        }
        assert_eq!(probes, 1);
        (s.result(), rates)
    }

    /// The probe's throughput sets the bracket: a few steps, all near the capacity, none of
    /// the doubling from 1 req/s; the answer as precise as without the probe.
    #[test]
    fn a_throughput_probe_brackets_in_a_few_steps() {
        for cap in [40.0, 3.3, 1234.0] {
            let (c, rates) = run_probed(cap, Some(cap * 1.02));
            let max = c.max_rate.unwrap();
            assert_eq!(c.stopped, "precision", "{rates:?}");
            assert!(
                (max - cap).abs() <= 0.05 * cap,
                "cap {cap}: {max} {rates:?}"
            );
            assert!(rates.len() <= 5, "cap {cap}: {rates:?}");
            assert!(rates.iter().all(|r| *r >= 0.7 * cap), "{rates:?}");
            assert_eq!(c.probe_rate, Some(cap * 1.02));
            assert!(c.failing_rate.unwrap() > cap);
        }
    }

    /// A probe that understates the server (its top passes: measured, then doubling) or
    /// completed nothing (the fallback start) still ends at the capacity.
    #[test]
    fn a_wrong_or_empty_probe_still_finds_the_capacity() {
        for probe in [Some(10.0), Some(200.0), None] {
            let (c, rates) = run_probed(80.0, probe);
            let max = c.max_rate.unwrap();
            assert!(
                (max - 80.0).abs() <= 4.0,
                "probe {probe:?}: {max} {rates:?}"
            );
            assert_eq!(c.stopped, "precision");
            // The tentative top is never the answer's failing rate unless measured.
            assert!(
                rates.iter().any(|r| *r == c.failing_rate.unwrap()),
                "{rates:?}"
            );
        }
        assert_eq!(run_probed(80.0, None).0.probe_rate, None);
    }

    /// Poisson arrivals that came slower than offered do not count as the server falling
    /// behind: the verdict compares completions with the rate actually sent.
    #[test]
    fn kept_up_is_judged_against_the_sent_rate() {
        let mut s = Search::new(
            vec![Slo::parse("ttft_p90:100ms").unwrap()],
            0.05,
            10.0,
            1e6,
            None,
        );
        s.feed(StepObservation {
            achieved_rate: 9.2,
            sent_rate: Some(9.25),
            ..observe(10.0, 46, 100.0)
        });
        s.feed(StepObservation {
            achieved_rate: 9.2,
            ..observe(10.0, 46, 100.0)
        });
        let c = s.result();
        assert_eq!(
            c.steps.iter().map(|s| s.passed).collect::<Vec<_>>(),
            [true, false]
        );
    }

    /// A step offered 84 req/s whose Poisson draw sent 80 passes for 80, not 84: the
    /// answer and the bracket are rates the server was shown. A draw above the offered rate
    /// counts as the offered one.
    #[test]
    fn a_pass_counts_at_the_rate_actually_sent() {
        let mut s = Search::new(
            vec![Slo::parse("ttft_p90:100ms").unwrap()],
            0.05,
            84.0,
            1e6,
            None,
        );
        s.feed(StepObservation {
            achieved_rate: 79.5,
            sent_rate: Some(80.0),
            ..observe(84.0, 46, 1000.0)
        });
        let c = s.result();
        assert!(c.steps[0].passed);
        assert_eq!(c.steps[0].offered_rate, 84.0);
        assert_eq!(c.steps[0].tested_rate, 80.0);
        assert_eq!(c.max_rate, Some(80.0));
        // The next bracketing step doubles from the rate shown, and a failure there with a
        // higher draw counts at the offered rate.
        assert_eq!(
            s.next(),
            Next::Measure {
                rate: 160.0,
                requests: 46
            }
        );
        s.feed(StepObservation {
            achieved_rate: 100.0,
            sent_rate: Some(170.0),
            ..observe(160.0, 46, 100.0)
        });
        assert_eq!(s.result().failing_rate, Some(160.0));
        assert_eq!(s.result().steps[1].tested_rate, 160.0);
    }

    #[test]
    fn nothing_passes_and_the_server_queue_hook() {
        let mut s = Search::new(
            vec![Slo::parse("ttft_p99:1ms").unwrap()],
            0.05,
            10.0,
            1e6,
            Some(50),
        );
        while let Next::Measure { rate, requests } = s.next() {
            s.feed(observe(rate, requests, 100.0));
        }
        let c = s.result();
        assert_eq!((c.max_rate, c.stopped), (None, "no_rate_passes"));
        // Server signals: a waiting queue above 0 marks the step as queueing.
        let mut s = Search::new(
            vec![Slo::parse("ttft_p90:100ms").unwrap()],
            0.05,
            10.0,
            1e6,
            None,
        );
        s.feed(StepObservation {
            server_waiting: Some(0.0),
            ..observe(10.0, 46, 100.0)
        });
        s.feed(StepObservation {
            server_waiting: Some(2.5),
            ..observe(20.0, 46, 100.0)
        });
        let c = s.result();
        assert_eq!(
            (c.knee_rate, c.knee_reasons.clone()),
            (Some(20.0), vec!["server_waiting"])
        );
        assert_eq!(c.step_requests, 46);
    }
}
