//! The model server's own signals during `lmperf run`: the target's `/metrics` read at each
//! benchmark's start and end (counters and histograms over the whole benchmark) and every
//! second between (queue depth, running requests, KV usage over time), summarized into the
//! `server` block of each benchmark in `summary.json`. A server without metrics, or one that
//! fails mid-run, costs one warning line and leaves the block `null` or partial; never the run.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::config::TargetConfig;
use crate::server::interval::{self, LatencyStats, ServerSample};
use crate::server::normalize::Reading;
use crate::server::scrape::{Scraper, read_page};
use crate::server::{Monitor, TargetServer};

/// The scrape interval of a run (issue 11: 1 s).
pub const RUN_SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// One point of the server's state over a benchmark.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerPoint {
    /// Seconds from the benchmark's start.
    pub t_s: f64,
    pub waiting: Option<f64>,
    pub running: Option<f64>,
    pub kv_usage: Option<f64>,
}

/// The `server` block of one benchmark. A figure the server does not expose is `null`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerBlock {
    /// vllm | sglang | tgi | llama.cpp | unknown.
    pub kind: &'static str,
    pub version: Option<String>,
    pub model: Option<String>,
    /// Pages read during the benchmark (start and end included).
    pub samples: usize,
    pub waiting_mean: Option<f64>,
    pub waiting_max: Option<f64>,
    pub running_mean: Option<f64>,
    pub running_max: Option<f64>,
    pub kv_usage_mean: Option<f64>,
    pub kv_usage_max: Option<f64>,
    /// Preemptions during the benchmark.
    pub preemptions: Option<f64>,
    /// Prefix-cache hits ÷ queries over the benchmark, 0..1.
    pub prefix_hit_ratio: Option<f64>,
    /// Tokens the server counted during the benchmark.
    pub prompt_tokens: Option<f64>,
    pub generation_tokens: Option<f64>,
    /// Server-side latencies over the benchmark (histogram deltas), seconds.
    pub ttft_s: LatencyStats,
    pub queue_s: LatencyStats,
    pub prefill_s: LatencyStats,
    pub decode_s: LatencyStats,
    /// The server restarted during the benchmark (a counter went backwards).
    pub restarted: bool,
    pub timeline: Vec<ServerPoint>,
}

fn stats(v: impl Iterator<Item = f64>) -> (Option<f64>, Option<f64>) {
    let (n, sum, max) = v.fold((0usize, 0.0, f64::NEG_INFINITY), |(n, s, m), x| {
        (n + 1, s + x, m.max(x))
    });
    if n == 0 {
        (None, None)
    } else {
        (Some(sum / n as f64), Some(max))
    }
}

/// Summarizes a benchmark from the pages read at its start and end and the samples between.
/// Pure: no IO, no clock.
pub fn block(
    start: Option<(&Reading, SystemTime)>,
    end: (&Reading, SystemTime),
    between: &[ServerSample],
    identity: &crate::server::Identity,
) -> ServerBlock {
    let (end_reading, t1) = end;
    let t0 = start
        .map(|(_, t)| t)
        .or_else(|| between.first().map(|s| s.at))
        .unwrap_or(t1);
    let whole = interval::sample(start, end_reading, t1);
    let dt = whole.interval_s.unwrap_or(0.0);
    let mut points: Vec<ServerPoint> = Vec::with_capacity(between.len() + 2);
    let point = |at: SystemTime, w: Option<f64>, r: Option<f64>, k: Option<f64>| ServerPoint {
        t_s: at.duration_since(t0).map_or(0.0, |d| d.as_secs_f64()),
        waiting: w,
        running: r,
        kv_usage: k,
    };
    if let Some((r, at)) = start {
        points.push(point(
            at,
            r.requests_waiting,
            r.requests_running,
            r.kv_cache_usage,
        ));
    }
    points.extend(
        between
            .iter()
            .filter(|s| s.at >= t0 && s.at <= t1)
            .map(|s| {
                point(
                    s.at,
                    s.requests_waiting,
                    s.requests_running,
                    s.kv_cache_usage,
                )
            }),
    );
    points.push(point(
        t1,
        end_reading.requests_waiting,
        end_reading.requests_running,
        end_reading.kv_cache_usage,
    ));
    let (waiting_mean, waiting_max) = stats(points.iter().filter_map(|p| p.waiting));
    let (running_mean, running_max) = stats(points.iter().filter_map(|p| p.running));
    let (kv_usage_mean, kv_usage_max) = stats(points.iter().filter_map(|p| p.kv_usage));
    // rate × dt gives back the counter's increase up to float rounding (431.99999999999994
    // for 432 tokens): rounded to a millionth, a whole-token counter reads as its integer.
    let total = |rate: Option<f64>| rate.map(|r| (r * dt * 1e6).round() / 1e6);
    ServerBlock {
        kind: end_reading.kind.as_str(),
        version: identity.version.clone(),
        model: identity.model.clone(),
        samples: points.len(),
        waiting_mean,
        waiting_max,
        running_mean,
        running_max,
        kv_usage_mean,
        kv_usage_max,
        preemptions: total(whole.preemptions_per_s),
        prefix_hit_ratio: whole.prefix_cache_hit_ratio,
        prompt_tokens: total(whole.prompt_tokens_per_s),
        generation_tokens: total(whole.generation_tokens_per_s),
        ttft_s: whole.ttft,
        queue_s: whole.queue,
        prefill_s: whole.prefill,
        decode_s: whole.decode,
        restarted: whole.reset || between.iter().any(|s| s.reset && s.at >= t0 && s.at <= t1),
        timeline: points,
    }
}

/// One line of `server_samples.jsonl`: a scrape during a benchmark, for `lmperf analyze`.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ServerSampleRow {
    pub schema_version: u32,
    pub benchmark: String,
    /// Milliseconds from the benchmark's start (its first repeat's, with `--repeat`), as the
    /// `*_ms` offsets of `requests.jsonl`.
    pub t_ms: f64,
    /// The scrape, `at` in Unix seconds.
    #[serde(flatten)]
    pub sample: ServerSample,
}

/// Writes `server_samples.jsonl` into `dir` (nothing when no sample was read).
///
/// # Errors
/// The file cannot be written.
pub fn write_samples(dir: &std::path::Path, rows: &[ServerSampleRow]) -> std::io::Result<()> {
    super::write_jsonl(&dir.join(SAMPLES_FILE), rows)
}

/// The file of [`ServerSampleRow`]s in a run directory.
pub const SAMPLES_FILE: &str = "server_samples.jsonl";

/// Scrapes the target during a run.
#[derive(Debug)]
pub struct ServerWatch {
    target: Option<Arc<TargetServer>>,
    scraper: Option<Scraper>,
    monitor: Option<Monitor>,
    start: Option<(Option<Reading>, SystemTime)>,
    warned: bool,
    /// Every benchmark's scrapes so far.
    rows: Vec<ServerSampleRow>,
}

impl ServerWatch {
    /// Starts the 1 s scraper of `target` (nothing with `server_metrics = off`).
    pub fn start(target: &TargetConfig) -> Self {
        let off = Self {
            target: None,
            scraper: None,
            monitor: None,
            start: None,
            warned: false,
            rows: Vec::new(),
        };
        if !target.server.enabled {
            return off;
        }
        let mut t = target.clone();
        t.server.interval = RUN_SCRAPE_INTERVAL;
        t.server.timeout = t.server.timeout.min(RUN_SCRAPE_INTERVAL);
        let (state, monitor) = crate::server::start(std::slice::from_ref(&t), None);
        let (Some(ts), Ok(client)) = (state.targets.get(0), Scraper::client()) else {
            return off;
        };
        let scraper = Scraper::new(&t, ts.clone(), client);
        Self {
            target: Some(ts),
            scraper: Some(scraper),
            monitor: Some(monitor),
            start: None,
            warned: false,
            rows: Vec::new(),
        }
    }

    async fn read(&mut self) -> Option<Reading> {
        let s = self.scraper.as_ref()?;
        let url = s.cfg.metrics_url.as_str();
        let read = match crate::server::scrape::fetch(
            &s.client,
            &s.cfg.metrics_url,
            s.api_key.as_ref(),
            s.cfg.timeout.max(Duration::from_secs(2)),
            s.cfg.max_bytes,
        )
        .await
        {
            Ok((body, _)) => read_page(&body, s.cfg.kind, url).map(|(r, _)| r),
            Err(f) => Err(f),
        };
        match read {
            Ok(r) => Some(r),
            Err(f) => {
                if !self.warned {
                    self.warned = true;
                    eprintln!(
                        "lmperf run: server metrics not read ({}): {}; summary.json's server block stays null or partial",
                        f.kind, f.message
                    );
                }
                None
            }
        }
    }

    /// Marks a benchmark's start.
    pub async fn mark(&mut self) {
        if self.scraper.is_none() {
            return;
        }
        let r = self.read().await;
        self.start = Some((r, SystemTime::now()));
    }

    /// Puts the marked benchmark's zero at `t0`, the wall time its requests' clock starts
    /// (`requests.jsonl`'s `send_ms` 0): its samples' `t_ms` and its timeline count from there,
    /// not from the mark before its prompts were made. The mark's reading stays its start
    /// (nothing was sent between).
    pub fn rebase(&mut self, t0: SystemTime) {
        if let Some((_, at)) = &mut self.start {
            *at = t0;
        }
    }

    /// The block of the benchmark `benchmark` since [`ServerWatch::mark`]; its scrapes are
    /// kept for `server_samples.jsonl` ([`ServerWatch::stop`]).
    pub async fn take(&mut self, benchmark: &str) -> Option<ServerBlock> {
        let (start, t0) = self.start.take()?;
        let end = self.read().await?;
        let t1 = SystemTime::now();
        let ts = self.target.as_ref()?;
        let mut identity = ts.identity();
        if identity.model.is_none()
            && let Some(s) = &self.scraper
        {
            identity = s.read_identity(end.kind).await;
        }
        let between: Vec<ServerSample> = ts.history().into_iter().filter(|s| s.at >= t0).collect();
        self.rows
            .extend(between.iter().filter(|s| s.at <= t1).map(|s| {
                ServerSampleRow {
                    schema_version: super::SCHEMA_VERSION,
                    benchmark: benchmark.to_owned(),
                    t_ms: s
                        .at
                        .duration_since(t0)
                        .map_or(0.0, |d| d.as_secs_f64() * 1000.0),
                    sample: s.clone(),
                }
            }));
        Some(block(
            start.as_ref().map(|r| (r, t0)),
            (&end, t1),
            &between,
            &identity,
        ))
    }

    /// Stops the scraper; returns every benchmark's scrapes.
    pub async fn stop(self) -> Vec<ServerSampleRow> {
        if let Some(m) = self.monitor {
            m.stop().await;
        }
        self.rows
    }
}

/// The `server` block figures `lmperf compare` sets side by side: `(metric, unit, lower is
/// better, JSON path in the block)`. They come with no interval (one figure per run), so
/// their verdict is always `unchanged`; the deltas say how the server behaved differently.
pub const COMPARED: [(&str, &str, bool, &str, &str); 9] = [
    ("server_waiting_mean", "requests", true, "waiting_mean", ""),
    ("server_waiting_max", "requests", true, "waiting_max", ""),
    ("server_running_mean", "requests", false, "running_mean", ""),
    ("server_kv_usage_max", "ratio", true, "kv_usage_max", ""),
    ("server_preemptions", "preemptions", true, "preemptions", ""),
    (
        "server_prefix_hit_ratio",
        "ratio",
        false,
        "prefix_hit_ratio",
        "",
    ),
    ("server_ttft_p99", "s", true, "ttft_s", "p99"),
    ("server_queue_p99", "s", true, "queue_s", "p99"),
    ("server_decode_p99", "s", true, "decode_s", "p99"),
];

/// `(metric, unit, lower is better, base, new)`.
pub type Compared = (&'static str, &'static str, bool, Option<f64>, Option<f64>);

/// The compared figures of two benchmarks' `server` blocks (JSON as in `summary.json`), for
/// those that either side has: `(metric, unit, lower is better, base, new)`.
pub fn compared(base: &serde_json::Value, new: &serde_json::Value) -> Vec<Compared> {
    let get = |v: &serde_json::Value, k: &str, sub: &str| {
        if sub.is_empty() {
            v[k].as_f64()
        } else {
            v[k][sub].as_f64()
        }
    };
    COMPARED
        .iter()
        .filter_map(|&(m, unit, lower, k, sub)| {
            let (b, n) = (get(base, k, sub), get(new, k, sub));
            (b.is_some() || n.is_some()).then_some((m, unit, lower, b, n))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::normalize::normalize;
    use crate::server::parse::parse;

    #[test]
    fn block_over_a_benchmark() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/server/");
        let read = |s: &str| {
            normalize(
                &parse(&std::fs::read_to_string(format!("{dir}vllm-new.{s}.prom")).unwrap())
                    .unwrap(),
                None,
            )
        };
        let (a, b) = (read("a"), read("b"));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut mid = interval::sample(Some((&a, t0)), &b, t0 + Duration::from_secs(2));
        mid.requests_waiting = Some(30.0);
        let id = crate::server::Identity {
            version: Some("0.11.0".into()),
            model: Some("llama".into()),
            model_revision: None,
        };
        let blk = block(
            Some((&a, t0)),
            (&b, t0 + Duration::from_secs(5)),
            &[mid],
            &id,
        );
        // Points: start (waiting 3), the 2 s sample (30), end (9).
        assert_eq!(blk.samples, 3);
        assert_eq!(blk.waiting_max, Some(30.0));
        assert_eq!(blk.waiting_mean, Some((3.0 + 30.0 + 9.0) / 3.0));
        assert_eq!(
            (blk.running_max, blk.kv_usage_max),
            (Some(16.0), Some(0.87))
        );
        // Counters over the whole benchmark: 12 − 7 preemptions, 60000 − 50000 prompt tokens.
        assert!((blk.preemptions.unwrap() - 5.0).abs() < 1e-9);
        assert!((blk.prompt_tokens.unwrap() - 10000.0).abs() < 1e-6);
        assert!((blk.prefix_hit_ratio.unwrap() - 0.3).abs() < 1e-12);
        assert!((blk.ttft_s.p50.unwrap() - 0.4375).abs() < 1e-12);
        assert_eq!(
            blk.timeline.iter().map(|p| p.t_s).collect::<Vec<_>>(),
            vec![0.0, 2.0, 5.0]
        );
        assert_eq!(
            (blk.kind, blk.model.as_deref(), blk.restarted),
            ("vllm", Some("llama"), false)
        );
    }
}
