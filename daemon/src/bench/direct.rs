//! `lmperf run --target-kind router --direct-workers URL…` (issue 52.2): how much the router
//! adds to a benchmark. After each benchmark's routed requests, the same shape (api, model,
//! prompt lengths, output length, concurrency, rate and count; fresh prompts, so that no prefix
//! cache carries the routed ones over) goes straight to the workers behind the router, spread
//! over them in turn, and the benchmark says routed p50 − direct p50 of TTFT and E2E
//! (`benchmarks[].path`, the terminal and the report). The workers are `--direct-workers`, else
//! the router's own list (`GET /list_workers`, served by vllm-router and SGLang's router). The
//! direct requests' rows go to `direct.jsonl` (never `requests.jsonl`: they are not the
//! benchmark's), each with its worker as `endpoint`.
//!
//! The two phases follow each other, not interleave: the figure compares the benchmark with the
//! minute after it, which the sentence says ("over the benchmark and its direct phase").

use std::io::Write;
use std::time::Instant;

use lmperf_measure::path::{PathComparison, PathMetric, PathSide, compare_sides};
use serde::Serialize;

use super::context::RunContext;
use super::stats::Distribution;
use super::{BenchError, BenchSummary, RequestRow, aggregate, feed, one_benchmark, shape};
use crate::canary::direct::{aimed_target, list_workers_of};
use crate::config::TargetKind;

/// Salt of the direct phase's prompts (other prompts than the routed ones, same shape).
const DIRECT_SALT: u64 = 0x4449_5245_4354;
/// Where the sentence says the figures come from.
const SCOPE: &str = "over the benchmark and its direct phase";

/// The workers a run sends its direct phases to, and where they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectWorkers {
    /// Base URLs, in the order given or listed.
    pub urls: Vec<String>,
    /// `flag` (`--direct-workers`), `router` (its `GET /list_workers`) or `replies` (the
    /// workers the benchmark's replies named by URL).
    pub from: &'static str,
}

/// One benchmark's routed-versus-direct figures (`summary.json` `benchmarks[].path`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchPath {
    /// The workers sent to directly (those that answered a TCP connect), base URLs as
    /// `http://host:port/`.
    pub workers: Vec<String>,
    /// `flag`, `router` or `replies`, as [`DirectWorkers::from`].
    pub workers_from: &'static str,
    /// Direct requests sent, and those that failed (by `error.type` in `direct.jsonl`).
    pub direct_requests: usize,
    pub direct_errors: usize,
    /// The direct phase's length, seconds.
    pub direct_duration_s: f64,
    pub ttft: PathComparison,
    pub e2e: PathComparison,
}

/// The run's direct workers: `--direct-workers` as configured, else (a router target) the
/// router's own list, else (the router lists none, or its list cannot be read: said on stderr
/// with `progress`) those each benchmark's replies name by URL (`from` `replies`, `urls` empty:
/// [`phase`] takes them from the benchmark's per-worker blocks). `None` for a plain server.
pub(crate) async fn workers(ctx: &RunContext<'_>) -> Option<DirectWorkers> {
    let t = &ctx.spec.target;
    if t.kind != TargetKind::Router || !t.direct.enabled {
        return None;
    }
    if !t.direct.workers.is_empty() {
        return Some(DirectWorkers {
            urls: t.direct.workers.iter().map(|u| u.to_string()).collect(),
            from: "flag",
        });
    }
    let why = match list_workers_of(ctx.clients, t).await {
        Ok(urls) if !urls.is_empty() => {
            return Some(DirectWorkers {
                urls,
                from: "router",
            });
        }
        Ok(_) => "the router lists no worker".to_owned(),
        Err(e) => format!("the router's worker list not read ({e})"),
    };
    if ctx.spec.progress {
        eprintln!(
            "lmperf run: {why}: the direct workers are those the replies name by URL, if any (else give --direct-workers)"
        );
    }
    Some(DirectWorkers {
        urls: Vec::new(),
        from: "replies",
    })
}

/// The workers `routed`'s replies named by URL (its per-worker blocks), as base URLs.
fn replied(routed: &BenchSummary) -> Vec<String> {
    routed.workers.as_ref().map_or_else(Vec::new, |w| {
        w.keys()
            .filter_map(|id| crate::config::direct_paths::worker_url(id))
            .map(|u| u.to_string())
            .collect()
    })
}

fn side(d: Option<&Distribution>) -> PathSide {
    PathSide {
        n: d.map_or(0, |d| d.count),
        p50_ms: d.map(|d| d.p50),
    }
}

/// The figures of one benchmark: `routed` (its summary) against `direct` (the direct phase's).
pub fn path_of(
    workers: &DirectWorkers,
    routed: &BenchSummary,
    direct: &BenchSummary,
    direct_duration_s: f64,
) -> BenchPath {
    let window_s = routed.duration_s + direct_duration_s;
    let cmp = |metric, r: Option<&Distribution>, d: Option<&Distribution>| {
        compare_sides(metric, window_s, side(r), side(d), SCOPE)
    };
    BenchPath {
        workers: workers.urls.clone(),
        workers_from: workers.from,
        direct_requests: direct.num_requests,
        direct_errors: direct.num_requests.saturating_sub(direct.completed),
        direct_duration_s,
        ttft: cmp(
            PathMetric::Ttft,
            routed.ttft_ms.as_ref(),
            direct.ttft_ms.as_ref(),
        ),
        e2e: cmp(
            PathMetric::E2e,
            routed.e2el_ms.as_ref(),
            direct.e2el_ms.as_ref(),
        ),
    }
}

/// The direct phase of benchmark `routed` (its summary, as the routed requests made it; its
/// input length `input_len` as sent): the benchmark's shape sent to `workers` in turn, its rows
/// appended to `direct.jsonl`; the figures go to `routed.path` and, with `progress`, a line on
/// stderr.
///
/// # Errors
/// A workload that cannot be scheduled again, or `direct.jsonl` that cannot be written.
pub(crate) async fn phase(
    ctx: &RunContext<'_>,
    workers: &DirectWorkers,
    routed: &mut BenchSummary,
    input_len: u32,
) -> Result<(), BenchError> {
    let mut spec = ctx.spec.clone();
    let named;
    let workers = if workers.from == "replies" {
        named = DirectWorkers {
            urls: replied(routed),
            from: workers.from,
        };
        if named.urls.is_empty() {
            if ctx.spec.progress {
                eprintln!(
                    "lmperf run: {}: no reply named its worker by URL: no routed-versus-direct figure",
                    routed.benchmark
                );
            }
            return Ok(());
        }
        &named
    } else {
        workers
    };
    let (mut aimed, mut reached) = (Vec::new(), Vec::new());
    for w in &workers.urls {
        let Some(t) = aimed_target(&ctx.spec.target, w) else {
            return Err(BenchError::Invalid {
                field: "--direct-workers",
                value: w.clone(),
                reason: "not an http(s) URL with a host and port".into(),
            });
        };
        // A worker the client cannot reach (a pod address outside the cluster) is left out,
        // said, rather than timing out every request sent to it.
        match super::launch::reachable(&t).await {
            Ok(()) => {
                reached.push(t.base_url.to_string());
                aimed.push(t);
            }
            Err(reason) if ctx.spec.progress => {
                eprintln!("lmperf run: direct worker {w} left out: {reason}");
            }
            Err(_) => {}
        }
    }
    let mut aimed = aimed.into_iter();
    let Some(first) = aimed.next() else {
        if ctx.spec.progress {
            eprintln!(
                "lmperf run: {}: no direct worker answers: no routed-versus-direct figure",
                routed.benchmark
            );
        }
        return Ok(());
    };
    spec.target = first;
    spec.traffic.more_endpoints = aimed.collect();
    spec.traffic.endpoint_policy = super::traffic::EndpointPolicy::RoundRobin;
    spec.traffic.probe_rate = None;
    spec.progress = false;
    let direct_ctx = RunContext {
        spec: &spec,
        telemetry: None,
        ..*ctx
    };
    let n = match &spec.workload.trace {
        Some(t) => t.trace.requests.len(),
        None => spec.num_prompts,
    };
    let (name, concurrency) = (routed.benchmark.clone(), routed.concurrency);
    let seed = spec.seed
        ^ DIRECT_SALT
        ^ (concurrency as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ u64::from(input_len).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let items = feed::ItemSource::new(&spec.feed(), ctx.tok, n, input_len, seed);
    let schedule = feed::Schedule::new(&spec.feed(), items.len(), spec.seed)?;
    let mut summarizer = aggregate::Summarizer::new(spec.goodput);
    let mut rows: Vec<RequestRow> = Vec::new();
    let only = (spec.traffic.more_endpoints.is_empty()).then(|| spec.target.base_url.to_string());
    let started = Instant::now();
    one_benchmark(
        &direct_ctx,
        &name,
        concurrency,
        items,
        Some(schedule),
        &mut |mut r: RequestRow| {
            if r.endpoint.is_none() {
                r.endpoint.clone_from(&only);
            }
            summarizer.push(&r);
            rows.push(r);
        },
    )
    .await?;
    let took_s = started.elapsed().as_secs_f64();
    let direct = summarizer.finish(shape(&spec, &name, concurrency, input_len));
    append_rows(&ctx.spec.output_dir.join("direct.jsonl"), &rows)?;
    let reached = DirectWorkers {
        urls: reached,
        from: workers.from,
    };
    let path = path_of(&reached, routed, &direct, took_s);
    if ctx.spec.progress {
        eprintln!("{}", line(&name, &path));
    }
    routed.path = Some(path);
    Ok(())
}

/// Appends `rows` to `path`, one JSON line each.
fn append_rows(path: &std::path::Path, rows: &[RequestRow]) -> Result<(), BenchError> {
    let io = |source| BenchError::Output {
        path: path.to_owned(),
        source,
    };
    let mut lines = String::new();
    for r in rows {
        lines.push_str(&serde_json::to_string(r).map_err(|e| io(std::io::Error::other(e)))?);
        lines.push('\n');
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(lines.as_bytes()))
        .map_err(io)
}

/// The terminal's line for a benchmark's figures: `lmperf run: c1_in16: routed TTFT p50 − …`.
pub fn line(name: &str, p: &BenchPath) -> String {
    format!(
        "lmperf run: {name}: {}; {} ({} direct requests to {} workers, {} failed)",
        p.ttft.says,
        p.e2e.says,
        p.direct_requests,
        p.workers.len(),
        p.direct_errors
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(ttft: &[f64], e2e: &[f64], completed: usize) -> BenchSummary {
        let mut b = super::super::aggregate::Summarizer::new(super::super::Goodput::default())
            .finish(super::super::aggregate::BenchShape {
                name: "c1_in16",
                concurrency: 1,
                input_len: 16,
                output_len: Some(4),
                request_rate: None,
            });
        b.ttft_ms = Distribution::of(ttft);
        b.e2el_ms = Distribution::of(e2e);
        (b.num_requests, b.completed, b.duration_s) = (e2e.len() + 1, completed, 2.0);
        b
    }

    /// The routed benchmark's medians against the direct phase's, said with their counts; a
    /// failed direct request counted.
    #[test]
    fn routed_minus_direct_of_a_benchmark() {
        let w = DirectWorkers {
            urls: vec!["http://127.0.0.1:1/".into(), "http://127.0.0.1:2/".into()],
            from: "flag",
        };
        let routed = bench(&[50.0, 51.0, 52.0, 53.0, 54.0], &[90.0; 5], 5);
        let direct = bench(&[40.0, 41.0, 42.0, 43.0, 44.0], &[70.0; 5], 5);
        let p = path_of(&w, &routed, &direct, 1.5);
        assert_eq!(p.ttft.overhead_ms, Some(10.0));
        assert_eq!(p.e2e.overhead_ms, Some(20.0));
        assert_eq!((p.direct_requests, p.direct_errors), (6, 1));
        assert_eq!(p.ttft.window_s, 3.5);
        assert_eq!(
            line("c1_in16", &p),
            "lmperf run: c1_in16: routed TTFT p50 − direct p50 over the benchmark and its direct phase, n = 5 vs 5: +10.0 ms; routed E2E p50 − direct p50 over the benchmark and its direct phase, n = 5 vs 5: +20.0 ms (6 direct requests to 2 workers, 1 failed)"
        );
        // No direct answer: no figure, and why.
        let none = bench(&[], &[], 0);
        let p = path_of(&w, &routed, &none, 1.0);
        assert_eq!(p.ttft.overhead_ms, None);
        assert!(
            p.ttft.says.starts_with("too few requests"),
            "{}",
            p.ttft.says
        );
    }
}
