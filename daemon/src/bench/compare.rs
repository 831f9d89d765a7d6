//! `lmperf compare BASE_DIR NEW_DIR`: A/B comparison of two `lmperf run` output directories.
//!
//! Both runs' `summary.json` and `requests.jsonl` are read; benchmarks are matched by name.
//! Per matched benchmark and metric (TTFT, ITL, TPOT, E2EL: mean, p50, p90, p99; request and
//! output-token throughput; error and OOM rates) it gives the new − base delta, a percentile bootstrap
//! confidence interval of that delta (requests resampled with replacement, each run on its
//! own, seeded), and a two-sided Mann-Whitney U p-value (normal approximation with tie and
//! continuity correction, as `scipy.stats.mannwhitneyu(method="asymptotic")`). Throughput and
//! error rate are bootstrapped over 10 time windows of each run (batch means). A change is a
//! regression when the whole interval lies on the worse side of zero (higher latency or error
//! rate, lower throughput), an improvement when it lies on the better side.
//!
//! `compare.json` schema ([`COMPARE_SCHEMA_VERSION`] = 1):
//! ```text
//! { schema_version, lmperf_version,
//!   base: {dir, target, model, lmperf_version}, new: {…},
//!   confidence (e.g. 0.95), resamples, seed,
//!   benchmarks: [{ benchmark, base_requests, new_requests,
//!     metrics: [{ metric ("ttft_p99", "output_throughput", "error_rate", …), unit ("ms",
//!       "req/s", "tok/s", "ratio"), better ("lower"|"higher"), base, new, delta (new − base),
//!       delta_pct (100 × delta / base; null when base = 0), ci_low, ci_high (delta, same unit),
//!       p_value (rank test on one value per request, so the same for a metric's four
//!       statistics; null for throughput; for error_rate on failure indicators), verdict ("regression"|"improvement"|"unchanged") }] }],
//!   only_in_base, only_in_new: [benchmark names],
//!   gates: [{ gate, tripped, benchmarks: [where it tripped] }], failed_gates: [gate texts] }
//! ```
//! Values without data (no successful request) are null.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use serde::{Deserialize, Serialize};

use super::report::{esc, line_chart};
use super::stats::percentile;

/// Version of `compare.json`; bumped on any incompatible change.
pub const COMPARE_SCHEMA_VERSION: u32 = 1;

/// The `summary.json` schema versions this build reads.
const READS_SUMMARY_VERSION: u64 = super::SCHEMA_VERSION as u64;

/// A compare that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Format { path: PathBuf, reason: String },
    #[error("bad value {field} = {value:?}: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: String,
    },
}

/// Options of a comparison.
#[derive(Debug, Clone)]
pub struct CompareSpec {
    pub base_dir: PathBuf,
    pub new_dir: PathBuf,
    /// Where `compare.json` and `compare.html` go.
    pub output_dir: PathBuf,
    pub gates: Vec<CompareGate>,
    /// Bootstrap resamples (at least 100).
    pub resamples: usize,
    /// Two-sided confidence level of the interval, in (0, 1).
    pub confidence: f64,
    pub seed: u64,
}

/// A `--fail-on` gate of compare: `METRIC:+X%`, `METRIC:-X%`, `METRIC:+X` (absolute, in the
/// metric's unit). `+` trips when the delta is above X, `-` when it is below −X.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareGate {
    pub text: String,
    pub metric: String,
    /// +1 (trips on an increase) or −1 (on a decrease).
    pub sign: f64,
    pub limit: f64,
    pub percent: bool,
}

/// Statistics of each latency metric, in this order.
const STATS: [&str; 4] = ["mean", "p50", "p90", "p99"];
/// Latency metrics (`requests.jsonl` fields without `_ms`; `ttfo`: time to first visible
/// output, `time_to_first_content_ms`, last so the other metrics' resamples stay as they were).
const LATENCIES: [&str; 5] = ["ttft", "itl", "tpot", "e2el", "ttfo"];
/// The server's own per-request timing (`requests.jsonl` `server_*_ms`,
/// `client_minus_server_ttft_ms`; `server_request_*`, apart from the `server_*_p99` of its
/// `/metrics` histograms): compared only where either run has it, with their own
/// resampling seed so the metrics above resample as without them.
const SERVER_LATENCIES: [&str; 9] = [
    "server_request_ttft",
    "server_request_queue",
    "server_request_prefill",
    "server_request_decode",
    "client_minus_server_ttft",
    // A routed request's TTFT split along the serving path (NVIDIA Dynamo's `nvext.timing`):
    // `requests.jsonl` `ttft_*_ms`, last so the rows above resample as without them.
    "ttft_frontend",
    "ttft_router_queue",
    "ttft_prefill",
    "ttft_transfer_and_first_decode",
];
/// Run-level metrics.
const RATES: [(&str, &str, Better); 4] = [
    ("request_throughput", "req/s", Better::Higher),
    ("output_throughput", "tok/s", Better::Higher),
    ("error_rate", "ratio", Better::Lower),
    ("oom_rate", "ratio", Better::Lower),
];

/// Every metric name a gate may use.
pub fn metric_names() -> Vec<String> {
    let mut v: Vec<String> = LATENCIES
        .iter()
        .chain(SERVER_LATENCIES.iter())
        .flat_map(|m| STATS.iter().map(move |s| format!("{m}_{s}")))
        .collect();
    v.extend(RATES.iter().map(|r| r.0.to_owned()));
    v
}

/// Parses `ttft_p99:+5%`, `output_throughput:-3%`, `error_rate:+0.01`.
pub fn parse_compare_gate(text: &str) -> Result<CompareGate, String> {
    let (metric, thr) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: expected METRIC:+X% or METRIC:-X%, e.g. ttft_p99:+5%"))?;
    let metric = metric.trim();
    if !metric_names().iter().any(|m| m == metric) {
        return Err(format!(
            "{text:?}: unknown metric {metric:?} (one of {})",
            metric_names().join(", ")
        ));
    }
    let thr = thr.trim();
    let (sign, rest) = match thr.as_bytes().first() {
        Some(b'+') => (1.0, &thr[1..]),
        Some(b'-') => (-1.0, &thr[1..]),
        _ => {
            return Err(format!(
                "{text:?}: the threshold needs a sign: + trips on an increase, - on a decrease"
            ));
        }
    };
    let (num, percent) = match rest.strip_suffix('%') {
        Some(n) => (n, true),
        None => (rest, false),
    };
    let limit: f64 = num
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("{text:?}: {num:?} is not a non-negative number"))?;
    Ok(CompareGate {
        text: text.to_owned(),
        metric: metric.to_owned(),
        sign,
        limit,
        percent,
    })
}

/// Which direction of a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Lower,
    Higher,
}

/// Verdict on one metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Regression,
    Improvement,
    Unchanged,
}

/// One metric of one benchmark in `compare.json`.
#[derive(Debug, Clone, Serialize)]
pub struct MetricDelta {
    pub metric: String,
    pub unit: &'static str,
    pub better: Better,
    pub base: Option<f64>,
    pub new: Option<f64>,
    pub delta: Option<f64>,
    pub delta_pct: Option<f64>,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    pub p_value: Option<f64>,
    pub verdict: Verdict,
    /// A tail percentile from too few values to call a change: the values each side would
    /// need (50 for p90, 500 for p99); the verdict is then `unchanged`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub too_few_values: Option<usize>,
}

/// One matched benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct BenchComparison {
    pub benchmark: String,
    pub base_requests: usize,
    pub new_requests: usize,
    pub metrics: Vec<MetricDelta>,
}

/// A run as named in `compare.json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub dir: String,
    pub target: String,
    pub model: String,
    pub lmperf_version: String,
}

/// A gate's result.
#[derive(Debug, Clone, Serialize)]
pub struct GateResult {
    pub gate: String,
    pub tripped: bool,
    pub benchmarks: Vec<String>,
}

/// `compare.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub schema_version: u32,
    pub lmperf_version: &'static str,
    pub base: RunInfo,
    pub new: RunInfo,
    pub confidence: f64,
    pub resamples: usize,
    pub seed: u64,
    pub benchmarks: Vec<BenchComparison>,
    pub only_in_base: Vec<String>,
    pub only_in_new: Vec<String>,
    pub gates: Vec<GateResult>,
    pub failed_gates: Vec<String>,
    /// `--lora-modules`: each pair of the new run's adapters per benchmark, the first as base
    /// (`c1_in8 [adapter a vs b]`); gates do not apply (absent without adapters).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub adapter_pairs: Vec<BenchComparison>,
    /// `--profile-on-fail`: the server profiler's call when a TPOT gate tripped (absent
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_profile: Option<crate::diagnosis::report::ServerProfile>,
    /// What makes the comparison unfair, in words: the server's prefix cache served the two
    /// runs differently ([`cache_warnings`]); empty when nothing does.
    pub warnings: Vec<String>,
}

/// The fields of a `requests.jsonl` line that compare uses.
#[derive(Debug, Clone, Deserialize)]
struct Req {
    benchmark: String,
    outcome: String,
    #[serde(default)]
    repeat: usize,
    send_ms: f64,
    ttft_ms: Option<f64>,
    /// TTFO; absent in runs of versions before it (its metrics are then null).
    #[serde(default)]
    time_to_first_content_ms: Option<f64>,
    #[serde(default)]
    itl_ms: Vec<f64>,
    tpot_ms: Option<f64>,
    e2el_ms: f64,
    output_tokens: Option<u64>,
    /// `--lora-modules`: the adapter; its requests also form `BENCH [adapter NAME]`.
    #[serde(default)]
    adapter: Option<String>,
    /// `--target` repeated: the endpoint; its requests also form `BENCH [endpoint URL]`.
    #[serde(default)]
    endpoint: Option<String>,
    /// `--probe-rate`: a probe, in `BENCH [probes]` only.
    #[serde(default)]
    probe: bool,
    /// The server's own timing, where the run's responses carried it.
    #[serde(default)]
    server_ttft_ms: Option<f64>,
    #[serde(default)]
    server_queue_ms: Option<f64>,
    #[serde(default)]
    server_prefill_ms: Option<f64>,
    #[serde(default)]
    server_decode_ms: Option<f64>,
    #[serde(default)]
    client_minus_server_ttft_ms: Option<f64>,
    /// A routed request's TTFT split (Dynamo), where the run has it.
    #[serde(default)]
    ttft_frontend_ms: Option<f64>,
    #[serde(default)]
    ttft_router_queue_ms: Option<f64>,
    #[serde(default)]
    ttft_prefill_ms: Option<f64>,
    #[serde(default)]
    ttft_transfer_and_first_decode_ms: Option<f64>,
    /// The server's usage: input tokens and those it took from its prefix cache.
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cached_input_tokens: Option<u64>,
    /// A failed request's server error (for the OOM rate, [`super::oom`]).
    #[serde(default)]
    error_server_type: Option<String>,
    #[serde(default)]
    error_code: Option<String>,
    #[serde(default)]
    error_message: Option<String>,
}

impl Req {
    /// Whether the server failed it for memory.
    fn oom(&self) -> bool {
        self.outcome != "ok"
            && super::oom::out_of_memory(
                self.error_server_type.as_deref(),
                self.error_code.as_deref(),
                self.error_message.as_deref(),
            )
    }
}

/// The name of a benchmark's group in compare (`c4_in128 [adapter sql]`, `… [probes]`).
fn group_name(bench: &str, kind: &str, key: Option<&str>) -> String {
    match key {
        Some(k) => format!("{bench} [{kind} {k}]"),
        None => format!("{bench} [{kind}]"),
    }
}

/// A group block of `summary.json` (`adapters.NAME`, `endpoints.URL`, `probes`) as a benchmark
/// of its own: its throughputs from the block, its requests added as they are read.
fn group_bench(g: &serde_json::Value) -> Bench {
    let rate = g["request_throughput"].as_f64();
    let completed = g["completed"].as_f64().unwrap_or(0.0);
    let tokens = g["total_output_tokens"].as_f64().unwrap_or(0.0);
    Bench {
        requests: Vec::new(),
        request_throughput: rate,
        // Tokens over the group's span (completed / request rate).
        output_throughput: rate
            .filter(|r| *r > 0.0 && completed > 0.0)
            .map(|r| tokens * r / completed),
        server: serde_json::Value::Null,
    }
}

/// One benchmark of one run.
#[derive(Debug, Default)]
struct Bench {
    requests: Vec<Req>,
    request_throughput: Option<f64>,
    output_throughput: Option<f64>,
    /// The benchmark's `server` block (`Null` without one).
    server: serde_json::Value,
}

struct Run {
    info: RunInfo,
    /// `summary.json` `seed` (the prompts' seed).
    seed: Option<u64>,
    benches: BTreeMap<String, Bench>,
    order: Vec<String>,
}

fn read_run(dir: &Path) -> Result<Run, CompareError> {
    let path = dir.join("summary.json");
    let io = |path: &Path| {
        let p = path.to_owned();
        move |source| CompareError::Io { path: p, source }
    };
    let fmt = |path: &Path, reason: String| CompareError::Format {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let summary: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| fmt(&path, e.to_string()))?;
    match summary["schema_version"].as_u64() {
        Some(READS_SUMMARY_VERSION) => {}
        v => {
            return Err(fmt(
                &path,
                format!(
                    "schema_version {v:?}: this lmperf reads summary.json version {READS_SUMMARY_VERSION}"
                ),
            ));
        }
    }
    let s = |k: &str| summary[k].as_str().unwrap_or_default().to_owned();
    let info = RunInfo {
        dir: dir.display().to_string(),
        target: s("target"),
        model: s("model"),
        lmperf_version: s("lmperf_version"),
    };
    let mut benches = BTreeMap::new();
    let mut order = Vec::new();
    for b in summary["benchmarks"]
        .as_array()
        .ok_or_else(|| fmt(&path, "no \"benchmarks\" array".into()))?
    {
        let name = b["benchmark"]
            .as_str()
            .ok_or_else(|| fmt(&path, format!("benchmark without a name: {b}")))?
            .to_owned();
        let bench = Bench {
            requests: Vec::new(),
            request_throughput: b["request_throughput"].as_f64(),
            output_throughput: b["output_token_throughput"].as_f64(),
            server: b["server"].clone(),
        };
        order.push(name.clone());
        benches.insert(name.clone(), bench);
        for kind in ["adapter", "endpoint"] {
            if let Some(m) = b[format!("{kind}s")].as_object() {
                for (k, g) in m {
                    let n = group_name(&name, kind, Some(k));
                    order.push(n.clone());
                    benches.insert(n, group_bench(g));
                }
            }
        }
        if b["probes"].is_object() {
            let n = group_name(&name, "probes", None);
            order.push(n.clone());
            benches.insert(n, group_bench(&b["probes"]));
        }
    }
    let rpath = dir.join("requests.jsonl");
    let rtext = std::fs::read_to_string(&rpath).map_err(io(&rpath))?;
    for (i, line) in rtext
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let r: Req =
            serde_json::from_str(line).map_err(|e| fmt(&rpath, format!("line {}: {e}", i + 1)))?;
        let groups = if r.probe {
            vec![group_name(&r.benchmark, "probes", None)]
        } else {
            [("adapter", &r.adapter), ("endpoint", &r.endpoint)]
                .into_iter()
                .filter_map(|(kind, k)| {
                    k.as_deref()
                        .map(|k| group_name(&r.benchmark, kind, Some(k)))
                })
                .collect()
        };
        for g in &groups {
            if let Some(b) = benches.get_mut(g) {
                b.requests.push(r.clone());
            }
        }
        if r.probe {
            continue;
        }
        let b = benches.get_mut(&r.benchmark).ok_or_else(|| {
            fmt(
                &rpath,
                format!(
                    "line {}: benchmark {:?} is not in summary.json",
                    i + 1,
                    r.benchmark
                ),
            )
        })?;
        b.requests.push(r);
    }
    Ok(Run {
        info,
        seed: summary["seed"].as_u64(),
        benches,
        order,
    })
}

/// The share of a benchmark's prompt tokens the server took from its prefix cache, over its
/// successful requests whose usage said (`None` when none did).
fn cached_share(b: &Bench) -> Option<f64> {
    let (cached, input) = b
        .requests
        .iter()
        .filter(|r| r.outcome == "ok")
        .filter_map(|r| Some((r.cached_input_tokens?, r.input_tokens?)))
        .fold((0u64, 0u64), |(c, i), (x, y)| (c + x, i + y));
    (input > 0).then(|| cached as f64 / input as f64)
}

/// Points of cached-token share by which two runs may differ before compare warns.
pub const CACHE_SHARE_POINTS: f64 = 5.0;

/// Warnings for benchmarks whose prompts the server's prefix cache served differently in the
/// two runs (a TTFT change then is the cache's), and for a new run with the base's seed (the
/// same prompts) that met a warm cache.
fn cache_warnings(base: &Run, new: &Run) -> Vec<String> {
    let mut out = Vec::new();
    for name in new.order.iter().filter(|n| !n.contains(" [")) {
        let (Some(b), Some(n)) = (base.benches.get(name), new.benches.get(name)) else {
            continue;
        };
        let (Some(sb), Some(sn)) = (cached_share(b), cached_share(n)) else {
            continue;
        };
        let points = (sn - sb) * 100.0;
        if points.abs() > CACHE_SHARE_POINTS {
            out.push(format!(
                "{name}: the server took {:.0} % of the new run's prompt tokens from its prefix cache against {:.0} % of the base's: TTFT differences are the cache's as much as the build's",
                sn * 100.0,
                sb * 100.0
            ));
        } else if base.seed.is_some() && base.seed == new.seed && sn * 100.0 > CACHE_SHARE_POINTS {
            out.push(format!(
                "{name}: both runs used seed {} (the same prompts) and the server took {:.0} % of the new run's prompt tokens from its cache",
                new.seed.unwrap_or_default(),
                sn * 100.0
            ));
        }
    }
    out
}

/// Values grouped by request (a request's ITLs stay together when resampled).
#[derive(Debug, Default, Clone)]
pub struct Clustered {
    values: Vec<f64>,
    /// `starts[i]..starts[i + 1]` are request i's values; `starts.len()` = requests + 1.
    starts: Vec<usize>,
    /// Every value with its request, sorted by value (for resampling without sorting).
    sorted: Vec<(f64, u32)>,
}

impl Clustered {
    /// From one value list per request.
    pub fn new<'a>(groups: impl IntoIterator<Item = &'a [f64]>) -> Self {
        let mut c = Self {
            values: Vec::new(),
            starts: vec![0],
            sorted: Vec::new(),
        };
        for g in groups {
            c.values.extend(g.iter().copied().filter(|v| v.is_finite()));
            c.starts.push(c.values.len());
        }
        let mut sorted: Vec<(f64, u32)> = (0..c.requests())
            .flat_map(|i| {
                let r = u32::try_from(i).unwrap_or(u32::MAX);
                c.group(i).iter().map(move |&v| (v, r))
            })
            .collect();
        sorted.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        c.sorted = sorted;
        c
    }

    fn requests(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Whether no request has a value.
    fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    fn group(&self, i: usize) -> &[f64] {
        &self.values[self.starts[i]..self.starts[i + 1]]
    }

    /// The mean of each request's values (one value per request with any), for the rank test.
    fn per_request_means(&self) -> Vec<f64> {
        (0..self.requests())
            .map(|i| self.group(i))
            .filter(|g| !g.is_empty())
            .map(|g| g.iter().sum::<f64>() / g.len() as f64)
            .collect()
    }
}

/// Mean, p50, p90, p99 of sorted values (numpy's linear percentiles), `None` when empty.
fn stats_of(sorted: &[f64]) -> Option<[f64; 4]> {
    if sorted.is_empty() {
        return None;
    }
    let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
    Some([
        mean,
        percentile(sorted, 0.5),
        percentile(sorted, 0.9),
        percentile(sorted, 0.99),
    ])
}

fn sorted_all(c: &Clustered) -> Vec<f64> {
    let mut v = c.values.clone();
    v.sort_unstable_by(f64::total_cmp);
    v
}

/// Draws `c.requests()` requests with replacement into `counts` (times each is drawn).
fn draw(c: &Clustered, rng: &mut SmallRng, counts: &mut Vec<u32>) {
    let n = c.requests();
    counts.clear();
    counts.resize(n, 0);
    for _ in 0..n {
        counts[rng.random_range(0..n)] += 1;
    }
}

/// [`stats_of`] of the resample in which request i appears `counts[i]` times, read in one
/// pass over the presorted values (each weighted by its request's count), no sort: the
/// sorted resample is the presorted values, each repeated its weight times.
fn weighted_stats(c: &Clustered, counts: &[u32]) -> Option<[f64; 4]> {
    let weight = |r: u32| counts.get(r as usize).copied().unwrap_or(0) as u64;
    let total: u64 = c.sorted.iter().map(|&(_, r)| weight(r)).sum();
    if total == 0 {
        return None;
    }
    // numpy linear: position q·(W − 1) between ranks lo and lo + 1 (0-based).
    let qs = [0.5, 0.9, 0.99];
    let pos: Vec<(u64, f64)> = qs
        .iter()
        .map(|q| {
            let p = q * (total - 1) as f64;
            (p.floor() as u64, p - p.floor())
        })
        .collect();
    // The six ranks wanted (slot 2k: lo of quantile k, 2k + 1: lo + 1), sorted by rank and
    // filled by one walk over the values.
    let mut ranks: Vec<(u64, usize)> = pos
        .iter()
        .flat_map(|&(lo, _)| [lo, (lo + 1).min(total - 1)])
        .enumerate()
        .map(|(slot, r)| (r, slot))
        .collect();
    ranks.sort_unstable();
    let mut found = [f64::NAN; 6];
    let (mut seen, mut sum, mut next) = (0u64, 0.0, 0usize);
    for &(v, r) in &c.sorted {
        let w = weight(r);
        if w == 0 {
            continue;
        }
        sum += v * w as f64;
        seen += w;
        while next < ranks.len() && ranks[next].0 < seen {
            found[ranks[next].1] = v;
            next += 1;
        }
    }
    let at = [
        [found[0], found[1]],
        [found[2], found[3]],
        [found[4], found[5]],
    ];
    let p = |k: usize| at[k][0] + (at[k][1] - at[k][0]) * pos[k].1;
    Some([sum / total as f64, p(0), p(1), p(2)])
}

/// Percentile bootstrap of (mean, p50, p90, p99)(new) − (…)(base): `resamples` times, each
/// run's requests are drawn with replacement (a request's values together), and the interval
/// is the (1 − confidence)/2 and (1 + confidence)/2 quantiles of the resampled deltas.
/// `None` for a statistic that some resample leaves without data.
pub fn bootstrap_latency(
    base: &Clustered,
    new: &Clustered,
    resamples: usize,
    confidence: f64,
    rng: &mut SmallRng,
) -> [Option<(f64, f64)>; 4] {
    let mut deltas: [Vec<f64>; 4] = Default::default();
    let (mut bc, mut nc) = (Vec::new(), Vec::new());
    for _ in 0..resamples {
        draw(base, rng, &mut bc);
        draw(new, rng, &mut nc);
        if let (Some(b), Some(n)) = (weighted_stats(base, &bc), weighted_stats(new, &nc)) {
            for k in 0..4 {
                deltas[k].push(n[k] - b[k]);
            }
        }
    }
    deltas.map(|mut d| interval(&mut d, resamples, confidence))
}

fn interval(d: &mut [f64], resamples: usize, confidence: f64) -> Option<(f64, f64)> {
    // A statistic that some resamples could not compute has no honest interval.
    if d.is_empty() || d.len() < resamples {
        return None;
    }
    d.sort_unstable_by(f64::total_cmp);
    let a = (1.0 - confidence) / 2.0;
    Some((percentile(d, a), percentile(d, 1.0 - a)))
}

/// Two-sided Mann-Whitney U test, normal approximation with tie correction and continuity
/// correction, as `scipy.stats.mannwhitneyu(x, y, method="asymptotic")` (SciPy ≥ 1.7):
/// U1 = R1 − n1(n1 + 1)/2 (R1: sum of x's mid-ranks in the pooled sample), U = max(U1,
/// n1·n2 − U1), σ² = n1·n2/12 · ((n + 1) − Σ(t³ − t)/(n(n − 1))) over tie groups t,
/// z = (U − n1·n2/2 − 0.5)/σ, p = 2·(1 − Φ(z)) capped at 1. Returns (U1, p); `None` when a
/// sample is empty. When every value is tied (σ = 0) p is 1.
pub fn mann_whitney_u(x: &[f64], y: &[f64]) -> Option<(f64, f64)> {
    let (n1, n2) = (x.len(), y.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let mut pooled: Vec<(f64, bool)> = x
        .iter()
        .map(|&v| (v, true))
        .chain(y.iter().map(|&v| (v, false)))
        .collect();
    pooled.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let n = pooled.len();
    let (mut r1, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && pooled[j + 1].0 == pooled[i].0 {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        let rank = (i + j) as f64 / 2.0 + 1.0;
        r1 += rank * pooled[i..=j].iter().filter(|p| p.1).count() as f64;
        ties += t * t * t - t;
        i = j + 1;
    }
    let (n1f, n2f, nf) = (n1 as f64, n2 as f64, n as f64);
    let u1 = r1 - n1f * (n1f + 1.0) / 2.0;
    let u = u1.max(n1f * n2f - u1);
    let mu = n1f * n2f / 2.0;
    let var = n1f * n2f / 12.0 * ((nf + 1.0) - if n > 1 { ties / (nf * (nf - 1.0)) } else { 0.0 });
    if var <= 0.0 {
        return Some((u1, 1.0));
    }
    let z = (u - mu - 0.5) / var.sqrt();
    let p = 2.0 * normal_sf(z);
    Some((u1, p.min(1.0)))
}

/// 1 − Φ(z) of the standard normal distribution.
fn normal_sf(z: f64) -> f64 {
    use statrs::distribution::{ContinuousCDF as _, Normal};
    Normal::standard().sf(z)
}

fn verdict(better: Better, ci: Option<(f64, f64)>) -> Verdict {
    match (better, ci) {
        (Better::Lower, Some((lo, _))) if lo > 0.0 => Verdict::Regression,
        (Better::Lower, Some((_, hi))) if hi < 0.0 => Verdict::Improvement,
        (Better::Higher, Some((_, hi))) if hi < 0.0 => Verdict::Regression,
        (Better::Higher, Some((lo, _))) if lo > 0.0 => Verdict::Improvement,
        _ => Verdict::Unchanged,
    }
}

fn delta(
    metric: String,
    unit: &'static str,
    better: Better,
    base: Option<f64>,
    new: Option<f64>,
    ci: Option<(f64, f64)>,
    p_value: Option<f64>,
) -> MetricDelta {
    let d = base.zip(new).map(|(b, n)| n - b);
    let pct = base
        .zip(d)
        .and_then(|(b, d)| (b != 0.0).then(|| 100.0 * d / b));
    MetricDelta {
        metric,
        unit,
        better,
        base,
        new,
        delta: d,
        delta_pct: pct,
        ci_low: ci.map(|c| c.0),
        ci_high: ci.map(|c| c.1),
        p_value,
        verdict: verdict(better, ci),
        too_few_values: None,
    }
}

impl MetricDelta {
    /// A tail quantile `q` from `values` values on the smaller side: below
    /// [`values_for_tail`], no verdict but "unchanged", and `too_few_values` says how many it
    /// would need (the delta and its interval stay, for the reader).
    fn with_power(mut self, q: f64, values: usize) -> Self {
        let need = values_for_tail(q);
        if values < need {
            self.verdict = Verdict::Unchanged;
            self.too_few_values = Some(need);
        }
        self
    }

    /// A verdict stands only when the rank test, where there is one, agrees: a p-value at or
    /// above `alpha` makes it "unchanged" (no "regression" beside p = 1).
    fn significant_at(mut self, alpha: f64) -> Self {
        if self.p_value.is_some_and(|p| p >= alpha) {
            self.verdict = Verdict::Unchanged;
        }
        self
    }
}

/// Stable per-benchmark seed (FNV-1a of the name, mixed with the user's seed).
fn bench_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) ^ seed
}

fn latency_values(b: &Bench, metric: &str) -> Clustered {
    let ok = b.requests.iter().filter(|r| r.outcome == "ok");
    let one = |v: Option<f64>| v.map_or_else(Vec::new, |v| vec![v]);
    let groups: Vec<Vec<f64>> = match metric {
        "ttft" => ok.map(|r| one(r.ttft_ms)).collect(),
        "ttfo" => ok.map(|r| one(r.time_to_first_content_ms)).collect(),
        "itl" => ok.map(|r| r.itl_ms.clone()).collect(),
        "tpot" => ok.map(|r| one(r.tpot_ms)).collect(),
        "server_request_ttft" => ok.map(|r| one(r.server_ttft_ms)).collect(),
        "server_request_queue" => ok.map(|r| one(r.server_queue_ms)).collect(),
        "server_request_prefill" => ok.map(|r| one(r.server_prefill_ms)).collect(),
        "server_request_decode" => ok.map(|r| one(r.server_decode_ms)).collect(),
        "client_minus_server_ttft" => ok.map(|r| one(r.client_minus_server_ttft_ms)).collect(),
        "ttft_frontend" => ok.map(|r| one(r.ttft_frontend_ms)).collect(),
        "ttft_router_queue" => ok.map(|r| one(r.ttft_router_queue_ms)).collect(),
        "ttft_prefill" => ok.map(|r| one(r.ttft_prefill_ms)).collect(),
        "ttft_transfer_and_first_decode" => ok
            .map(|r| one(r.ttft_transfer_and_first_decode_ms))
            .collect(),
        _ => ok.map(|r| vec![r.e2el_ms]).collect(),
    };
    Clustered::new(groups.iter().map(Vec::as_slice))
}

/// The four statistics of one latency metric, base against new: each with its bootstrap
/// interval; mean and median also with the rank test's p-value.
fn latency_deltas(
    m: &str,
    b: &Clustered,
    n: &Clustered,
    spec: &CompareSpec,
    rng: &mut SmallRng,
    metrics: &mut Vec<MetricDelta>,
) {
    let (bs, ns) = (stats_of(&sorted_all(b)), stats_of(&sorted_all(n)));
    let cis = bootstrap_latency(b, n, spec.resamples, spec.confidence, rng);
    // The rank test compares requests: one value each (a request's mean ITL for ITL).
    // It tests location, so it stands beside the mean and the median only; a tail (p90, p99)
    // is judged by its interval alone.
    let p = mann_whitney_u(&b.per_request_means(), &n.per_request_means()).map(|r| r.1);
    let fewest = b.values.len().min(n.values.len());
    for (k, stat) in STATS.iter().enumerate() {
        let p = if k < 2 { p } else { None };
        let d = delta(
            format!("{m}_{stat}"),
            "ms",
            Better::Lower,
            bs.map(|s| s[k]),
            ns.map(|s| s[k]),
            cis[k],
            p,
        )
        .significant_at(1.0 - spec.confidence);
        metrics.push(match TAIL_QUANTILES[k] {
            Some(q) => d.with_power(q, fewest),
            None => d,
        });
    }
}

/// The quantile of each of [`STATS`] that is a tail (p90, p99); `None` for the mean and the
/// median, which every sample informs.
const TAIL_QUANTILES: [Option<f64>; 4] = [None, None, Some(0.90), Some(0.99)];

/// Values beyond a tail quantile each side needs before a change of it is called: with fewer,
/// the quantile is one of its few largest values and a resampled interval of it says little
/// (the p99 of 8 requests is their maximum: one slow request reads as a regression).
pub const MIN_TAIL_VALUES: f64 = 5.0;

/// Values a side needs for a change of the `q` quantile to be called ([`MIN_TAIL_VALUES`]
/// beyond it): 50 for p90, 500 for p99.
pub fn values_for_tail(q: f64) -> usize {
    (MIN_TAIL_VALUES / (1.0 - q)).round() as usize
}

fn compare_bench(name: &str, base: &Bench, new: &Bench, spec: &CompareSpec) -> BenchComparison {
    let mut rng = SmallRng::seed_from_u64(bench_seed(spec.seed, name));
    let mut metrics = Vec::new();
    for m in LATENCIES {
        let (b, n) = (latency_values(base, m), latency_values(new, m));
        latency_deltas(m, &b, &n, spec, &mut rng, &mut metrics);
    }
    // Throughput and error rate: a batch-means bootstrap. Each run (each repeat) is cut into
    // WINDOWS equal time windows by request end; windows are resampled, so the interval shows
    // how steady the rate was over the run, not only how many requests there were.
    let (bw, nw) = (windows(base), windows(new));
    let mut deltas: [Vec<f64>; 4] = Default::default();
    if !bw.is_empty() && !nw.is_empty() {
        let (mut bb, mut nb) = (Vec::with_capacity(bw.len()), Vec::with_capacity(nw.len()));
        for _ in 0..spec.resamples {
            bb.clear();
            nb.clear();
            bb.extend((0..bw.len()).map(|_| bw[rng.random_range(0..bw.len())]));
            nb.extend((0..nw.len()).map(|_| nw[rng.random_range(0..nw.len())]));
            let (rb, rn) = (window_rates(&bb), window_rates(&nb));
            for k in 0..RATES.len() {
                deltas[k].push(rn[k] - rb[k]);
            }
        }
    }
    let point = |b: &Bench| -> [Option<f64>; 4] {
        let n = b.requests.len() as f64;
        let failed = b.requests.iter().filter(|r| r.outcome != "ok").count() as f64;
        let oom = b.requests.iter().filter(|r| r.oom()).count() as f64;
        [
            b.request_throughput,
            b.output_throughput,
            (n > 0.0).then(|| failed / n),
            (n > 0.0).then(|| oom / n),
        ]
    };
    let (pb, pn) = (point(base), point(new));
    let indicator = |b: &Bench, oom: bool| {
        b.requests
            .iter()
            .map(|r| f64::from(u8::from(if oom { r.oom() } else { r.outcome != "ok" })))
            .collect::<Vec<f64>>()
    };
    for (k, (metric, unit, better)) in RATES.iter().enumerate() {
        let ci = interval(&mut deltas[k], spec.resamples, spec.confidence);
        // Error and OOM rates: the rank test on failure indicators (with ties, the
        // two-proportion z test).
        let rate = matches!(*metric, "error_rate" | "oom_rate");
        let oom = *metric == "oom_rate";
        let p = rate
            .then(|| mann_whitney_u(&indicator(base, oom), &indicator(new, oom)).map(|r| r.1))
            .flatten();
        metrics.push(
            delta((*metric).to_owned(), unit, *better, pb[k], pn[k], ci, p)
                .significant_at(1.0 - spec.confidence),
        );
    }
    for (metric, unit, lower, b, n) in super::server::compared(&base.server, &new.server) {
        metrics.push(delta(
            metric.to_owned(),
            unit,
            if lower { Better::Lower } else { Better::Higher },
            b,
            n,
            None,
            None,
        ));
    }
    let mut server_rng = SmallRng::seed_from_u64(bench_seed(spec.seed ^ 0x5e7e_7141, name));
    for m in SERVER_LATENCIES {
        let (b, n) = (latency_values(base, m), latency_values(new, m));
        if !b.is_empty() || !n.is_empty() {
            latency_deltas(m, &b, &n, spec, &mut server_rng, &mut metrics);
        }
    }
    BenchComparison {
        benchmark: name.to_owned(),
        base_requests: base.requests.len(),
        new_requests: new.requests.len(),
        metrics,
    }
}

/// Time windows per run (per repeat) of the throughput bootstrap.
const WINDOWS: usize = 10;

/// One time window of a run: requests ended in it.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    ok: f64,
    tokens: f64,
    failed: f64,
    /// Failed for memory ([`Req::oom`]).
    oom: f64,
    total: f64,
    seconds: f64,
}

/// The [`WINDOWS`] equal windows of each repeat of `b`, from its first send to its last end.
fn windows(b: &Bench) -> Vec<Window> {
    let mut by_repeat: BTreeMap<usize, Vec<&Req>> = BTreeMap::new();
    for r in &b.requests {
        by_repeat.entry(r.repeat).or_default().push(r);
    }
    let mut out = Vec::new();
    for reqs in by_repeat.values() {
        let start = reqs.iter().map(|r| r.send_ms).fold(f64::INFINITY, f64::min);
        let end = reqs
            .iter()
            .map(|r| r.send_ms + r.e2el_ms)
            .fold(f64::NEG_INFINITY, f64::max);
        let span = (end - start).max(1e-6);
        let mut w = vec![
            Window {
                seconds: span / 1000.0 / WINDOWS as f64,
                ..Window::default()
            };
            WINDOWS
        ];
        for r in reqs {
            let i = (((r.send_ms + r.e2el_ms - start) / span * WINDOWS as f64) as usize)
                .min(WINDOWS - 1);
            let ok = r.outcome == "ok";
            w[i].total += 1.0;
            if ok {
                w[i].ok += 1.0;
                w[i].tokens += r.output_tokens.unwrap_or(0) as f64;
            } else {
                w[i].failed += 1.0;
                w[i].oom += f64::from(u8::from(r.oom()));
            }
        }
        out.extend(w);
    }
    out
}

/// Request throughput, output-token throughput, error rate and OOM rate of a set of windows.
fn window_rates(w: &[Window]) -> [f64; 4] {
    let sum = |f: fn(&Window) -> f64| w.iter().map(f).sum::<f64>();
    let (secs, total) = (sum(|w| w.seconds).max(1e-9), sum(|w| w.total));
    let of_total = |x: f64| if total > 0.0 { x / total } else { 0.0 };
    [
        sum(|w| w.ok) / secs,
        sum(|w| w.tokens) / secs,
        of_total(sum(|w| w.failed)),
        of_total(sum(|w| w.oom)),
    ]
}

/// Whether the gate trips on this metric. A metric the base run has and the new run lacks
/// (every request failed, or no request-level TPOT) trips: a gate that cannot be checked must
/// not pass a broken run.
fn gate_trips(g: &CompareGate, m: &MetricDelta) -> bool {
    if m.base.is_some() && m.new.is_none() {
        return true;
    }
    let d = if g.percent { m.delta_pct } else { m.delta };
    d.is_some_and(|d| d * g.sign > g.limit)
}

/// Compares the two runs and writes `compare.json` and `compare.html` to `spec.output_dir`.
///
/// # Errors
/// A directory without a readable `summary.json` / `requests.jsonl` of a known schema, or an
/// output that cannot be written.
pub fn compare(spec: &CompareSpec) -> Result<Comparison, CompareError> {
    if spec.resamples < 100 {
        return Err(CompareError::Invalid {
            field: "--resamples",
            value: spec.resamples.to_string(),
            reason: "at least 100".into(),
        });
    }
    if !(spec.confidence > 0.0 && spec.confidence < 1.0) {
        return Err(CompareError::Invalid {
            field: "--confidence",
            value: spec.confidence.to_string(),
            reason: "between 0 and 1, e.g. 0.95".into(),
        });
    }
    let base = read_run(&spec.base_dir)?;
    let new = read_run(&spec.new_dir)?;
    let mut benchmarks = Vec::new();
    for name in &new.order {
        if let (Some(b), Some(n)) = (base.benches.get(name), new.benches.get(name)) {
            benchmarks.push(compare_bench(name, b, n, spec));
        }
    }
    // Adapters of the new run against each other: `c1_in8 [adapter a vs b]` (base: a, new: b).
    let mut adapter_pairs = Vec::new();
    for name in &new.order {
        let prefix = format!("{name} [adapter ");
        let adapters: Vec<&String> = new
            .order
            .iter()
            .filter(|n| n.starts_with(&prefix))
            .collect();
        for (i, a) in adapters.iter().enumerate() {
            for b in &adapters[i + 1..] {
                let label = |n: &str| n[prefix.len()..n.len() - 1].to_owned();
                let pair = format!("{name} [adapter {} vs {}]", label(a), label(b));
                if let (Some(x), Some(y)) = (new.benches.get(*a), new.benches.get(*b)) {
                    adapter_pairs.push(compare_bench(&pair, x, y, spec));
                }
            }
        }
    }
    let only_in_base: Vec<String> = base
        .order
        .iter()
        .filter(|n| !new.benches.contains_key(*n))
        .cloned()
        .collect();
    let only_in_new = new
        .order
        .iter()
        .filter(|n| !base.benches.contains_key(*n))
        .cloned()
        .collect();
    let gates: Vec<GateResult> = spec
        .gates
        .iter()
        .map(|g| {
            let mut hit: Vec<String> = benchmarks
                .iter()
                .filter(|b| {
                    b.metrics
                        .iter()
                        .any(|m| m.metric == g.metric && gate_trips(g, m))
                })
                .map(|b| b.benchmark.clone())
                .collect();
            // A benchmark the base ran and the new run lacks (an interrupted run): every metric
            // of it is missing, so every gate trips on it.
            // A group (adapter, endpoint, probes) the new run lacks is a changed workload,
            // not a missing benchmark.
            hit.extend(
                only_in_base
                    .iter()
                    .filter(|n| !n.contains(" ["))
                    .map(|n| format!("{n} (missing from the new run)")),
            );
            GateResult {
                gate: g.text.clone(),
                tripped: !hit.is_empty(),
                benchmarks: hit,
            }
        })
        .collect();
    let failed_gates = gates
        .iter()
        .filter(|g| g.tripped)
        .map(|g| g.gate.clone())
        .collect();
    let c = Comparison {
        schema_version: COMPARE_SCHEMA_VERSION,
        lmperf_version: env!("CARGO_PKG_VERSION"),
        base: base.info.clone(),
        new: new.info.clone(),
        confidence: spec.confidence,
        resamples: spec.resamples,
        seed: spec.seed,
        benchmarks,
        only_in_base,
        only_in_new,
        gates,
        failed_gates,
        warnings: cache_warnings(&base, &new),
        adapter_pairs,
        server_profile: None,
    };
    let out = &spec.output_dir;
    let io = |source| CompareError::Io {
        path: out.clone(),
        source,
    };
    std::fs::create_dir_all(out).map_err(io)?;
    write_json(out, &c)?;
    std::fs::write(out.join("compare.html"), render(&c, &base, &new)).map_err(io)?;
    Ok(c)
}

/// Writes `compare.json` of `c` into `dir` (again, after `--profile-on-fail` added its record).
///
/// # Errors
/// The file cannot be written.
pub fn write_json(dir: &Path, c: &Comparison) -> Result<(), CompareError> {
    let io = |source| CompareError::Io {
        path: dir.join("compare.json"),
        source,
    };
    let json = serde_json::to_string_pretty(c).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(dir.join("compare.json"), json + "\n").map_err(io)
}

/// `v` divided by `per` (the shown unit), three significant digits, `title`: the exact value.
fn num(v: Option<f64>, per: f64) -> String {
    v.map_or_else(
        || "<td>–</td>".to_owned(),
        |v| format!(r#"<td title="{v}">{}</td>"#, crate::fmt::number(v / per)),
    )
}

fn render(c: &Comparison, base: &Run, new: &Run) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>lmperf compare</title><style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse;margin:8px 0 20px}}
td,th{{border:1px solid #bbb;padding:4px 8px;text-align:right;font-size:13px}} th{{background:#eee}} td.m{{text-align:left}}
tr.regression td{{background:#f6c5c5}} tr.improvement td{{background:#c8eccb}}
figure{{display:inline-block;margin:8px}} figcaption{{font-weight:600;font-size:13px}} h2{{margin-top:28px}}
</style></head><body><h1>lmperf compare</h1><p>base <code>{bd}</code> ({bm}) · new <code>{nd}</code> ({nm}) · {conf:.0} % bootstrap intervals, {res} resamples, seed {seed} · Mann-Whitney U p-values</p>"#,
        bd = esc(&c.base.dir),
        bm = esc(&c.base.model),
        nd = esc(&c.new.dir),
        nm = esc(&c.new.model),
        conf = c.confidence * 100.0,
        res = c.resamples,
        seed = c.seed,
    );
    if !c.failed_gates.is_empty() {
        let _ = write!(
            h,
            r#"<p id="gates" style="color:#b00"><b>Gates tripped:</b> {}</p>"#,
            esc(&c.failed_gates.join(", "))
        );
    }
    for w in &c.warnings {
        let _ = write!(
            h,
            r#"<p class="warning" style="color:#a60"><b>Warning:</b> {}</p>"#,
            esc(w)
        );
    }
    for (what, list) in [
        ("Only in base", &c.only_in_base),
        ("Only in new", &c.only_in_new),
    ] {
        if !list.is_empty() {
            let _ = write!(h, "<p>{what}: {}</p>", esc(&list.join(", ")));
        }
    }
    for b in c.benchmarks.iter().chain(&c.adapter_pairs) {
        let _ = write!(
            h,
            r#"<h2>{name}</h2><p>{} base requests, {} new requests</p><table class="compare" data-benchmark="{name}"><tr><th>metric</th><th>unit</th><th>base</th><th>new</th><th>Δ</th><th>Δ %</th><th>CI of Δ</th><th>p</th><th>verdict</th></tr>"#,
            b.base_requests,
            b.new_requests,
            name = esc(&b.benchmark),
        );
        for m in &b.metrics {
            let v = match m.verdict {
                Verdict::Regression => "regression",
                Verdict::Improvement => "improvement",
                Verdict::Unchanged => "unchanged",
            };
            // Times in one unit per row (that of the larger of base and new): 0.155 ms, 1.24 s.
            let (unit, per) = if m.unit == "ms" {
                let u = crate::fmt::TimeUnit::for_values(m.base.into_iter().chain(m.new));
                (u.symbol(), u.ms())
            } else {
                (m.unit, 1.0)
            };
            let ci =
                |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| crate::fmt::number(v / per));
            // A ratio's change in percentage points (a relative change of a ratio near 0 says
            // little); a metric without interval nor test has no verdict.
            let (delta_cell, pct_cell) = if m.unit == "ratio" {
                (
                    m.delta.map_or_else(
                        || "<td>–</td>".to_owned(),
                        |d| format!(r#"<td title="{d}">{:+.1} pt</td>"#, 100.0 * d),
                    ),
                    "<td>–</td>".to_owned(),
                )
            } else {
                (num(m.delta, per), num(m.delta_pct, 1.0))
            };
            let v = if m.ci_low.is_none() && m.p_value.is_none() {
                "not tested"
            } else {
                v
            };
            let _ = write!(
                h,
                r#"<tr class="{v}" data-metric="{}" data-delta="{}"><td class="m">{}</td><td>{}</td>{}{}{}{}<td>[{}, {}]</td><td>{}</td><td>{v}</td></tr>"#,
                m.metric,
                m.delta.map_or_else(String::new, |d| format!("{d}")),
                m.metric,
                unit,
                num(m.base, per),
                num(m.new, per),
                delta_cell,
                pct_cell,
                ci(m.ci_low),
                ci(m.ci_high),
                m.p_value
                    .map_or_else(|| "–".to_owned(), |p| format!("{p:.3e}")),
            );
        }
        h.push_str("</table>");
        for (title, metric) in [("TTFT CDF", "ttft"), ("E2EL CDF", "e2el")] {
            let series: Vec<(String, Vec<(f64, f64)>)> = [("base", base), ("new", new)]
                .iter()
                .filter_map(|(label, run)| {
                    run.benches
                        .get(&b.benchmark)
                        .map(|bench| (label.to_string(), cdf(&latency_values(bench, metric))))
                })
                .collect();
            h.push_str(&line_chart(
                &format!("{} {title}", b.benchmark),
                "ms",
                "share of requests",
                &series,
            ));
        }
    }
    if !c.gates.is_empty() {
        h.push_str(
            "<h2>Gates</h2><table><tr><th>gate</th><th>tripped</th><th>benchmarks</th></tr>",
        );
        for g in &c.gates {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&g.gate),
                g.tripped,
                esc(&g.benchmarks.join(", "))
            );
        }
        h.push_str("</table>");
    }
    h.push_str("</body></html>\n");
    h
}

fn cdf(c: &Clustered) -> Vec<(f64, f64)> {
    let v = sorted_all(c);
    let n = v.len() as f64;
    v.iter()
        .enumerate()
        .map(|(i, &x)| (x, (i + 1) as f64 / n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn mann_whitney_known_values() {
        // SciPy's own docstring example (scipy.stats.mannwhitneyu, "Examples", after Conover,
        // Practical Nonparametric Statistics): males vs females.
        // scipy.stats.mannwhitneyu(males, females, method="asymptotic") → U1 = 17.0,
        // pvalue = 0.11134688653314041.
        let males = [19.0, 22.0, 16.0, 29.0, 24.0];
        let females = [20.0, 11.0, 17.0, 12.0];
        let (u, p) = mann_whitney_u(&males, &females).unwrap();
        assert_eq!(u, 17.0);
        assert!(close(p, 0.111_346_886_533_140_41, 1e-9), "p = {p}");
        // Hand-computed: x = 1..5, y = 6..10, no ties: U1 = 0, U = 25, μ = 12.5,
        // σ = √(25·11/12) = 4.787136, z = (25 − 12.5 − 0.5)/σ = 2.506718,
        // p = 2·(1 − Φ(z)) = erfc(z/√2) = 0.012185 (Python: math.erfc(2.506718/2**0.5)).
        let x: Vec<f64> = (1..=5).map(f64::from).collect();
        let y: Vec<f64> = (6..=10).map(f64::from).collect();
        let (u, p) = mann_whitney_u(&x, &y).unwrap();
        assert_eq!(u, 0.0);
        assert!(close(p, 0.012_185, 2e-6), "p = {p}");
        // With ties (tie groups 2×3, 3×3, 4×2, 7×2): U1 = 9, σ² = 42/12·(14 − 60/156),
        // z = 1.6659, p = 0.0957333848646 (same formula in Python's stdlib, math.erfc).
        let (u, p2) = mann_whitney_u(
            &[1.0, 2.0, 2.0, 3.0, 4.0, 4.0],
            &[2.0, 3.0, 3.0, 5.0, 6.0, 7.0, 7.0],
        )
        .unwrap();
        assert_eq!(u, 9.0);
        assert!(close(p2, 0.095_733_384_864_633_76, 1e-9), "p = {p2}");
        // Symmetric in its arguments; all ties → p = 1.
        assert!(close(mann_whitney_u(&y, &x).unwrap().1, p, 1e-12));
        assert_eq!(
            mann_whitney_u(&[3.0, 3.0], &[3.0, 3.0, 3.0]).unwrap().1,
            1.0
        );
        assert!(mann_whitney_u(&[], &[1.0]).is_none());
    }

    #[test]
    fn bootstrap_ci_covers_a_known_shift() {
        // New = base + 5 ms on 400 lognormal-ish values: the 95 % intervals of every statistic
        // contain 5 and exclude 0; with no shift they contain 0.
        let mut rng = SmallRng::seed_from_u64(11);
        let base: Vec<f64> = (0..400)
            .map(|_| 100.0 + 20.0 * rng.random::<f64>().powi(3))
            .collect();
        let shifted: Vec<f64> = (0..400)
            .map(|_| 105.0 + 20.0 * rng.random::<f64>().powi(3))
            .collect();
        let same: Vec<f64> = (0..400)
            .map(|_| 100.0 + 20.0 * rng.random::<f64>().powi(3))
            .collect();
        let c = |v: &[f64]| Clustered::new(v.iter().map(std::slice::from_ref));
        let cis = bootstrap_latency(
            &c(&base),
            &c(&shifted),
            2000,
            0.95,
            &mut SmallRng::seed_from_u64(1),
        );
        for (k, ci) in cis.iter().enumerate() {
            let (lo, hi) = ci.unwrap();
            assert!(
                lo < 5.0 && 5.0 < hi && lo > 0.0,
                "{}: [{lo}, {hi}]",
                STATS[k]
            );
        }
        let cis = bootstrap_latency(
            &c(&base),
            &c(&same),
            2000,
            0.95,
            &mut SmallRng::seed_from_u64(1),
        );
        for (k, ci) in cis.iter().enumerate() {
            let (lo, hi) = ci.unwrap();
            assert!(lo < 0.0 && 0.0 < hi, "{}: [{lo}, {hi}]", STATS[k]);
        }
        // Seeded: the same seed gives the same interval.
        let again = bootstrap_latency(
            &c(&base),
            &c(&same),
            2000,
            0.95,
            &mut SmallRng::seed_from_u64(1),
        );
        assert_eq!(again, cis);
        let p = mann_whitney_u(&base, &shifted).unwrap().1;
        assert!(
            p < 1e-6,
            "a 5 ms shift on a 0–20 ms spread is significant: p = {p}"
        );
        assert!(mann_whitney_u(&base, &same).unwrap().1 > 0.01);
    }

    #[test]
    fn weighted_stats_equal_the_sorted_resample() {
        // Requests with 0–3 values each, drawn 0–2 times: the one-pass weighted statistics
        // equal numpy-style statistics of the explicitly expanded and sorted resample.
        let groups: Vec<Vec<f64>> = vec![
            vec![5.0, 1.0],
            vec![],
            vec![3.0],
            vec![2.0, 2.0, 9.0],
            vec![7.5],
            vec![0.5, 4.0],
        ];
        let c = Clustered::new(groups.iter().map(Vec::as_slice));
        let mut rng = SmallRng::seed_from_u64(3);
        for _ in 0..200 {
            let counts: Vec<u32> = (0..groups.len()).map(|_| rng.random_range(0..3)).collect();
            let mut expanded: Vec<f64> = groups
                .iter()
                .zip(&counts)
                .flat_map(|(g, &k)| (0..k).flat_map(move |_| g.iter().copied()))
                .collect();
            expanded.sort_by(f64::total_cmp);
            let (got, want) = (weighted_stats(&c, &counts), stats_of(&expanded));
            match (got, want) {
                (Some(g), Some(w)) => assert!(
                    g.iter().zip(&w).all(|(a, b)| (a - b).abs() < 1e-12),
                    "{counts:?}: {g:?} vs {w:?}"
                ),
                (g, w) => assert_eq!(g, w, "{counts:?}"),
            }
        }
    }

    #[test]
    fn verdicts_follow_direction() {
        assert_eq!(
            verdict(Better::Lower, Some((1.0, 2.0))),
            Verdict::Regression
        );
        assert_eq!(
            verdict(Better::Lower, Some((-2.0, -1.0))),
            Verdict::Improvement
        );
        assert_eq!(
            verdict(Better::Higher, Some((-2.0, -1.0))),
            Verdict::Regression
        );
        assert_eq!(
            verdict(Better::Higher, Some((1.0, 2.0))),
            Verdict::Improvement
        );
        assert_eq!(
            verdict(Better::Lower, Some((-1.0, 2.0))),
            Verdict::Unchanged
        );
        assert_eq!(verdict(Better::Lower, Some((0.0, 0.0))), Verdict::Unchanged);
        assert_eq!(verdict(Better::Lower, None), Verdict::Unchanged);
    }

    /// A tail percentile needs MIN_TAIL_VALUES beyond it on each side before its change is
    /// called: 50 values for p90, 500 for p99; the median is called from 8.
    #[test]
    fn tail_verdicts_need_the_values_for_their_tail() {
        assert_eq!((values_for_tail(0.90), values_for_tail(0.99)), (50, 500));
        let regression = || {
            delta(
                "ttft_p99".into(),
                "ms",
                Better::Lower,
                Some(10.0),
                Some(12.0),
                Some((1.4, 2.2)),
                None,
            )
        };
        let few = regression().with_power(0.99, 8);
        assert_eq!(
            (few.verdict, few.too_few_values),
            (Verdict::Unchanged, Some(500))
        );
        assert_eq!(few.delta, Some(2.0), "the delta stays for the reader");
        let many = regression().with_power(0.99, 500);
        assert_eq!(
            (many.verdict, many.too_few_values),
            (Verdict::Regression, None)
        );
        // Through the whole comparison: 8 requests each, every one 2 ms slower (a shift the
        // median and the mean call), the tails unchanged with the values they need, and the
        // same run against itself twice: nothing flagged.
        let tmp = std::env::temp_dir().join(format!("lmperf-compare-power-{}", std::process::id()));
        let base: Vec<f64> = (0..8).map(|i| 10.0 + f64::from(i) * 0.1).collect();
        let slow: Vec<f64> = base.iter().map(|t| t + 2.0).collect();
        write_run(&tmp.join("base"), &[("c1", &base)]);
        write_run(&tmp.join("new"), &[("c1", &slow)]);
        let c = compare(&CompareSpec {
            base_dir: tmp.join("base"),
            new_dir: tmp.join("new"),
            output_dir: tmp.join("out"),
            gates: Vec::new(),
            resamples: 200,
            confidence: 0.95,
            seed: 1,
        })
        .unwrap();
        let m = |k: &str| {
            c.benchmarks[0]
                .metrics
                .iter()
                .find(|m| m.metric == k)
                .cloned()
                .unwrap_or_else(|| panic!("{k}"))
        };
        assert_eq!(m("ttft_p50").verdict, Verdict::Regression);
        for k in ["ttft_p90", "ttft_p99", "e2el_p99"] {
            assert_eq!(
                (m(k).verdict, m(k).too_few_values.is_some()),
                (Verdict::Unchanged, true),
                "{k}"
            );
        }
        let table = super::super::compare_text::table(&c);
        assert!(
            table.contains("unchanged (too few values: needs 500)"),
            "{table}"
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn gates_parse_and_trip() {
        let g = parse_compare_gate("ttft_p99:+5%").unwrap();
        assert_eq!(
            (g.metric.as_str(), g.sign, g.limit, g.percent),
            ("ttft_p99", 1.0, 5.0, true)
        );
        let t = parse_compare_gate("output_throughput:-3%").unwrap();
        let e = parse_compare_gate("error_rate:+0.01").unwrap();
        assert!(!e.percent);
        for bad in [
            "ttft_p99+5%",
            "ttft_p98:+5%",
            "ttft_p99:5%",
            "ttft_p99:+x%",
            "ttft_p99:+-5%",
        ] {
            assert!(parse_compare_gate(bad).is_err(), "{bad}");
        }
        let m = |metric: &str, base: f64, new: f64| {
            delta(
                metric.into(),
                "ms",
                Better::Lower,
                Some(base),
                Some(new),
                None,
                None,
            )
        };
        assert!(gate_trips(&g, &m("ttft_p99", 100.0, 106.0)));
        assert!(!gate_trips(&g, &m("ttft_p99", 100.0, 104.0)));
        assert!(!gate_trips(&g, &m("ttft_p99", 100.0, 90.0)));
        let lost = delta(
            "ttft_p99".into(),
            "ms",
            Better::Lower,
            Some(100.0),
            None,
            None,
            None,
        );
        assert!(
            gate_trips(&g, &lost),
            "no TTFT in the new run (all failed) trips"
        );
        let neither = delta(
            "ttft_p99".into(),
            "ms",
            Better::Lower,
            None,
            None,
            None,
            None,
        );
        assert!(!gate_trips(&g, &neither));
        assert!(gate_trips(&t, &m("output_throughput", 100.0, 96.0)));
        assert!(!gate_trips(&t, &m("output_throughput", 100.0, 98.0)));
        assert!(gate_trips(&e, &m("error_rate", 0.0, 0.02)));
        assert!(!gate_trips(&e, &m("error_rate", 0.0, 0.005)));
    }

    /// A run directory with `benches` (name, ttft of each of its requests).
    fn write_run(dir: &Path, benches: &[(&str, &[f64])]) {
        std::fs::create_dir_all(dir).unwrap();
        let list: Vec<serde_json::Value> = benches.iter().map(|(n, _)| serde_json::json!({"benchmark": n, "request_throughput": 1.0, "output_token_throughput": 10.0, "server": {"prefix_hit_ratio": if dir.ends_with("base") { 0.01 } else { 0.32 }}})).collect();
        let summary = serde_json::json!({"schema_version": READS_SUMMARY_VERSION, "target": "t", "model": "m", "lmperf_version": "x", "benchmarks": list});
        std::fs::write(dir.join("summary.json"), summary.to_string()).unwrap();
        let mut lines = String::new();
        for (n, ttfts) in benches {
            for (i, t) in ttfts.iter().enumerate() {
                let r = serde_json::json!({"benchmark": n, "outcome": "ok", "send_ms": i as f64 * 10.0, "ttft_ms": t, "tpot_ms": 1.0, "e2el_ms": t + 5.0, "output_tokens": 5});
                lines.push_str(&format!("{r}\n"));
            }
        }
        std::fs::write(dir.join("requests.jsonl"), lines).unwrap();
    }

    /// A run whose requests carry the server's timing: `queue` ms of queue each, a 3 ms gap.
    fn write_timed_run(dir: &Path, queue: f64) {
        std::fs::create_dir_all(dir).unwrap();
        let summary = serde_json::json!({"schema_version": READS_SUMMARY_VERSION, "target": "t", "model": "m", "lmperf_version": "x", "benchmarks": [{"benchmark": "c1", "request_throughput": 1.0, "output_token_throughput": 10.0}]});
        std::fs::write(dir.join("summary.json"), summary.to_string()).unwrap();
        let mut lines = String::new();
        for i in 0..60 {
            let prefill = 20.0 + f64::from(i % 5);
            let server = queue + prefill;
            let r = serde_json::json!({"benchmark": "c1", "outcome": "ok", "send_ms": f64::from(i) * 10.0, "ttft_ms": server + 3.0, "tpot_ms": 1.0, "e2el_ms": server + 30.0, "output_tokens": 5, "server_ttft_ms": server, "server_queue_ms": queue, "server_prefill_ms": prefill, "client_minus_server_ttft_ms": 3.0, "ttft_frontend_ms": 3.0, "ttft_router_queue_ms": queue, "ttft_prefill_ms": prefill, "ttft_transfer_and_first_decode_ms": 0.0});
            lines.push_str(&format!("{r}\n"));
        }
        std::fs::write(dir.join("requests.jsonl"), lines).unwrap();
    }

    /// The server's split is compared where the runs have it: a queue that grew is a
    /// regression of `server_queue_*` while the gap holds; runs without it have no such rows.
    #[test]
    fn server_timing_is_compared_only_where_a_run_has_it() {
        let tmp =
            std::env::temp_dir().join(format!("lmperf-compare-server-{}", std::process::id()));
        write_timed_run(&tmp.join("base"), 1.0);
        write_timed_run(&tmp.join("new"), 21.0);
        let spec = |base: &str, new: &str| CompareSpec {
            base_dir: tmp.join(base),
            new_dir: tmp.join(new),
            output_dir: tmp.join("out"),
            gates: vec![parse_compare_gate("server_request_queue_p99:+10%").unwrap()],
            resamples: 200,
            confidence: 0.95,
            seed: 1,
        };
        let c = compare(&spec("base", "new")).unwrap();
        let m = |name: &str| {
            c.benchmarks[0]
                .metrics
                .iter()
                .find(|m| m.metric == name)
                .unwrap_or_else(|| panic!("{name} missing"))
                .clone()
        };
        let queue = m("server_request_queue_mean");
        assert_eq!((queue.base, queue.new), (Some(1.0), Some(21.0)));
        assert_eq!(queue.verdict, Verdict::Regression);
        assert_eq!(
            m("client_minus_server_ttft_p50").verdict,
            Verdict::Unchanged
        );
        // The serving-path split (issue 51): the router queue grew, the frontend held.
        let rq = m("ttft_router_queue_mean");
        assert_eq!(
            (rq.base, rq.new, rq.verdict),
            (Some(1.0), Some(21.0), Verdict::Regression)
        );
        assert_eq!(m("ttft_frontend_p50").verdict, Verdict::Unchanged);
        // Neither run's server said decode times: no such rows.
        assert!(
            c.benchmarks[0]
                .metrics
                .iter()
                .all(|m| !m.metric.starts_with("server_request_decode"))
        );
        assert_eq!(
            c.failed_gates,
            vec!["server_request_queue_p99:+10%".to_owned()]
        );
        // The TTFT rows are those of a run without server timing (own resampling seed).
        write_run(&tmp.join("plain"), &[("c1", &[10.0, 11.0, 12.0])]);
        let plain = compare(&spec("plain", "plain")).unwrap();
        assert!(
            plain.benchmarks[0]
                .metrics
                .iter()
                .all(|m| !m.metric.starts_with("server_request_")
                    && !m.metric.starts_with("client_minus"))
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// A run whose requests had `cached` of 100 prompt tokens from the cache, with `seed`.
    fn write_cached_run(dir: &Path, cached: u64, seed: u64) {
        std::fs::create_dir_all(dir).unwrap();
        let summary = serde_json::json!({"schema_version": READS_SUMMARY_VERSION, "target": "t", "model": "m", "lmperf_version": "x", "seed": seed, "benchmarks": [{"benchmark": "c1", "request_throughput": 1.0, "output_token_throughput": 10.0}]});
        std::fs::write(dir.join("summary.json"), summary.to_string()).unwrap();
        let lines: String = (0..20)
            .map(|i| {
                let r = serde_json::json!({"benchmark": "c1", "outcome": "ok", "send_ms": f64::from(i) * 10.0, "ttft_ms": 10.0, "e2el_ms": 20.0, "output_tokens": 5, "input_tokens": 100, "cached_input_tokens": cached});
                format!("{r}\n")
            })
            .collect();
        std::fs::write(dir.join("requests.jsonl"), lines).unwrap();
    }

    /// The issue's A/B repro: the same prompts met a warm cache in the second run; compare
    /// says so, and says nothing for two cold runs with their own seeds.
    #[test]
    fn a_prefix_cache_that_served_the_runs_differently_is_a_warning() {
        let tmp = std::env::temp_dir().join(format!("lmperf-compare-cache-{}", std::process::id()));
        let spec = |b: &str, n: &str| CompareSpec {
            base_dir: tmp.join(b),
            new_dir: tmp.join(n),
            output_dir: tmp.join("out"),
            gates: Vec::new(),
            resamples: 100,
            confidence: 0.95,
            seed: 1,
        };
        write_cached_run(&tmp.join("cold"), 1, 0);
        write_cached_run(&tmp.join("warm"), 96, 0);
        write_cached_run(&tmp.join("cold2"), 2, 7);
        write_cached_run(&tmp.join("warm_same_seed"), 4, 0);
        let c = compare(&spec("cold", "warm")).unwrap();
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].starts_with("c1: the server took 96 % of the new run's prompt tokens from its prefix cache against 1 %"), "{:?}", c.warnings);
        let html = std::fs::read_to_string(tmp.join("out/compare.html")).unwrap();
        assert!(html.contains("<b>Warning:</b> c1: the server took 96 %"));
        assert!(compare(&spec("cold", "cold2")).unwrap().warnings.is_empty());
        // 4 % only, but with the base's seed: the same prompts, from the cache.
        let same = compare(&spec("cold", "warm_same_seed")).unwrap().warnings;
        assert!(same.is_empty(), "{same:?}");
        write_cached_run(&tmp.join("warm_same_seed"), 30, 0);
        let same = compare(&spec("warm_same_seed", "warm_same_seed"))
            .unwrap()
            .warnings;
        assert!(same[0].contains("both runs used seed 0"), "{same:?}");
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn a_benchmark_missing_from_the_new_run_trips_every_gate_and_verdicts_follow_p() {
        let tmp =
            std::env::temp_dir().join(format!("lmperf-compare-missing-{}", std::process::id()));
        let same: Vec<f64> = (0..40).map(|i| 10.0 + f64::from(i % 7)).collect();
        write_run(&tmp.join("base"), &[("c1_in32", &same), ("c8_in32", &same)]);
        write_run(&tmp.join("new"), &[("c1_in32", &same)]);
        let spec = CompareSpec {
            base_dir: tmp.join("base"),
            new_dir: tmp.join("new"),
            output_dir: tmp.join("out"),
            gates: vec![parse_compare_gate("ttft_p99:+5%").unwrap()],
            resamples: 200,
            confidence: 0.95,
            seed: 1,
        };
        let c = compare(&spec).unwrap();
        assert_eq!(c.only_in_base, vec!["c8_in32".to_owned()]);
        assert_eq!(c.failed_gates, vec!["ttft_p99:+5%".to_owned()]);
        assert_eq!(
            c.gates[0].benchmarks,
            vec!["c8_in32 (missing from the new run)".to_owned()]
        );
        // Same requests on both sides: p = 1 and no verdict but "unchanged"; tails carry no p.
        let b = &c.benchmarks[0];
        let ttft_mean = b.metrics.iter().find(|m| m.metric == "ttft_mean").unwrap();
        assert!(close(ttft_mean.p_value.unwrap(), 1.0, 1e-9));
        assert!(
            b.metrics
                .iter()
                .all(|m| m.verdict == Verdict::Unchanged || m.p_value.is_none_or(|p| p < 0.05))
        );
        assert!(
            b.metrics
                .iter()
                .find(|m| m.metric == "ttft_p99")
                .unwrap()
                .p_value
                .is_none()
        );
        // A ratio's change in points, no relative change shown.
        let html = std::fs::read_to_string(tmp.join("out/compare.html")).unwrap();
        let row = html
            .split("data-metric=\"server_prefix_hit_ratio\"")
            .nth(1)
            .unwrap();
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(row.contains("+31.0 pt</td><td>–</td>"), "{row}");
        assert!(row.contains("not tested"), "{row}");
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
