//! `lmperf run --find-max-rate`: runs the steps the capacity search ([`super::capacity`])
//! asks for, each an open-loop benchmark at one offered rate, and feeds back what it measured.

use super::capacity::{Capacity, Next, Search, Slo, StepObservation};
use super::context::RunContext;
use super::{BenchError, BenchSummary, RequestRow, feed, one_benchmark, rows, summarize};
use crate::fmt;

/// Highest rate the search offers without `--max-rate`, req/s.
pub const DEFAULT_MAX_RATE: f64 = 10_000.0;
/// Mixed into `--seed` for the throughput probe's prompts.
const PROBE_SEED: u64 = 0x5052_4F42_4500_0001;
/// Where the search starts when the throughput probe completed nothing, req/s.
pub const FALLBACK_START_RATE: f64 = 1.0;

/// `--find-max-rate` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct FindRate {
    pub slos: Vec<Slo>,
    /// `--precision`: 0.05 for 5 %.
    pub precision: f64,
    /// First rate tried (`--request-rate` when finite); `None`: a throughput probe at full
    /// concurrency sets the bracket first ([`Search::probed`]).
    pub start_rate: Option<f64>,
    /// `--max-rate`: the search offers no more.
    pub max_rate: f64,
    /// `--step-requests`: overrides the order-statistic rule (fewer makes the p99 less sure).
    pub step_requests: Option<usize>,
}

/// The search's steps (one benchmark each, named `step{i}_r{rate}`) and its result; the
/// steps' rows go to `out` (a step's rows are kept while it runs: the search's step length
/// bounds them).
///
/// # Errors
/// What stops a benchmark from starting (the dispatcher thread).
pub(super) async fn search(
    ctx: &RunContext<'_>,
    f: &FindRate,
    out: &mut rows::RunRows,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<(Vec<BenchSummary>, Capacity, Option<String>), BenchError> {
    let (spec, tok) = (ctx.spec, ctx.tok);
    let mut s = match f.start_rate {
        Some(start) => Search::new(
            f.slos.clone(),
            f.precision,
            start,
            f.max_rate,
            f.step_requests,
        ),
        None => Search::probed(
            f.slos.clone(),
            f.precision,
            FALLBACK_START_RATE.min(f.max_rate),
            f.max_rate,
            f.step_requests,
        ),
    };
    let concurrency = spec.concurrencies.iter().copied().max().unwrap_or(1);
    let input_len = spec.input_lengths.first().copied().unwrap_or(128);
    let mut benchmarks = Vec::new();
    if spec.progress {
        eprintln!(
            "lmperf run: --find-max-rate: {} requests per step ({})",
            s.step_requests(),
            f.slos
                .iter()
                .map(|s| s.text.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let mut i = 0u64;
    loop {
        let (rate, requests) = match s.next() {
            Next::Done => break,
            Next::Probe { requests } => (None, requests),
            Next::Measure { rate, requests } => (Some(rate), requests),
        };
        let mut sp = spec.clone();
        sp.request_rate = rate;
        sp.num_prompts = requests;
        // The probe's prompts are its own (a prefix cache must not carry them into step 0).
        let seed = match rate {
            Some(_) => spec.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            None => spec.seed ^ PROBE_SEED,
        };
        let items = feed::ItemSource::new(&sp.feed(), tok, requests, input_len, seed);
        let schedule = match rate {
            Some(_) => feed::Schedule::new(&sp.feed(), items.len(), seed)?,
            // The probe: everything due at once, the concurrency the only limit.
            None => feed::Schedule::zero(items.len()),
        };
        let name = match rate {
            Some(rate) => format!("step{i}_r{rate:.3}"),
            None => format!("probe_c{concurrency}"),
        };
        let mut rows = Vec::with_capacity(items.len());
        let mut push = |r| rows.push(r);
        let step = one_benchmark(ctx, &name, concurrency, items, Some(schedule), &mut push);
        // The step's rate and count only shape `items` and `schedule`: the benchmark itself
        // runs with the run's context.
        // Ctrl-C: the steps that completed stand (their rows are in `out`), this one's are cut.
        tokio::select! {
            r = step => { r?; }
            () = stop.cancelled() => {
                s.interrupt();
                return Ok((benchmarks, s.result(), Some(name)));
            }
        }
        let b = summarize(&sp, &name, concurrency, input_len, &rows);
        let ok: Vec<&RequestRow> = rows
            .iter()
            .filter(|r| r.outcome == "ok" && !r.probe)
            .collect();
        // `--probe-rate`: the probes' rows are not the step's load.
        let load = rows.iter().filter(|r| !r.probe).count();
        let achieved_rate = rate_of(ok.iter().map(|r| r.send_ms + r.e2el_ms).collect());
        let Some(rate) = rate else {
            // Completed over first send to last end: requests all due at once end in waves
            // of the server's batch, so the span between ends alone overstates the rate.
            let throughput = Some(b.request_throughput);
            s.feed_probe(throughput);
            if spec.progress {
                eprintln!(
                    "lmperf run: throughput probe ({load} requests at concurrency {concurrency}): {}",
                    throughput.map_or("nothing completed".to_owned(), |t| fmt::rate(t, "req/s"))
                );
            }
            out.begin();
            rows.into_iter().for_each(|r| out.push(r));
            out.commit();
            benchmarks.push(b);
            continue;
        };
        let obs = StepObservation {
            offered_rate: rate,
            achieved_rate: achieved_rate.unwrap_or(b.request_throughput),
            sent_rate: rate_of(
                rows.iter()
                    .filter(|r| !r.probe)
                    .map(|r| r.send_ms)
                    .collect(),
            ),
            requests: load,
            failed: load - ok.len(),
            ttft_ms: ok.iter().filter_map(|r| r.ttft_ms).collect(),
            tpot_ms: ok.iter().filter_map(|r| r.tpot_ms).collect(),
            itl_ms: ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect(),
            e2el_ms: ok.iter().map(|r| r.e2el_ms).collect(),
            // Hook: the server's mean waiting queue over the step, once server metrics are
            // scraped alongside a run.
            server_waiting: None,
        };
        s.feed(obs);
        if spec.progress
            && let Some(step) = s.result().steps.last()
        {
            eprintln!("lmperf run: step {i}: {}", step_line(step));
        }
        out.begin();
        rows.into_iter().for_each(|r| out.push(r));
        out.commit();
        benchmarks.push(b);
        i += 1;
    }
    let c = s.result();
    if spec.progress {
        eprintln!(
            "lmperf run: {}",
            super::report::overview::capacity_sentence(&c)
        );
    }
    Ok((benchmarks, c, None))
}

/// One measured step in words: `offered 83.5 req/s[, sent 80.1 req/s], achieved 77.7 req/s,
/// ttft_p99:400ms 419 ms / bound 443 ms: fail`; the sent rate only where the step counts at
/// it (its sends came slower than offered).
fn step_line(step: &super::capacity::Step) -> String {
    let checks: Vec<String> = step
        .slos
        .iter()
        .map(super::capacity::SloCheck::brief)
        .collect();
    let sent = match step.sent_rate {
        Some(r) if step.tested_rate < step.offered_rate * 0.999 => {
            format!(", sent {}", fmt::rate(r, "req/s"))
        }
        _ => String::new(),
    };
    format!(
        "offered {}{sent}, achieved {}, {}: {}",
        fmt::rate(step.offered_rate, "req/s"),
        fmt::rate(step.achieved_rate, "req/s"),
        checks.join(", "),
        if step.passed { "pass" } else { "fail" }
    )
}

/// Events per second of instants (ms, any order): (count − 1) / (last − first); `None` with
/// fewer than two or no span. Of completions: the requests' own latency does not count as a
/// slower rate; of sends: the rate a schedule realized.
fn rate_of(mut ms: Vec<f64>) -> Option<f64> {
    ms.sort_by(f64::total_cmp);
    match (ms.first(), ms.last()) {
        (Some(a), Some(z)) if ms.len() > 1 && z > a => {
            Some((ms.len() - 1) as f64 / ((z - a) / 1000.0))
        }
        _ => None,
    }
}
