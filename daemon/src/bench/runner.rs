//! One `lmperf run` from its spec to its files: the launch (if any), the phases (warm-up,
//! the benchmarks or the capacity search or the profile, Ctrl-C), `requests.jsonl`,
//! `summary.json`, `summary.csv` and `report.html`, the gates, the terminal lines.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::canary::client::{self, Clients};
use crate::config::Api;

use super::context::RunContext;
use super::prompts::TokenizeClient;
use super::stats::Distribution;
use super::{
    BenchError, BenchSummary, RequestRow, RunSpec, SCHEMA_VERSION, Summary, aggregate,
    chat_template, export, feed, find_rate, gate_trips, launch, one_benchmark, profile,
    prompt_tokens, repeat, report, rows, server, shape, summary_csv, tokens, vram, workload,
};

/// Runs every benchmark of `spec`, writes `requests.jsonl` and `summary.json`, and returns the
/// summary (its `failed_gates` say whether a `--fail-on` gate tripped).
///
/// # Errors
/// Only what stops the run from starting (output directory, HTTP client, no model).
pub async fn run(spec: RunSpec) -> Result<Summary, BenchError> {
    std::fs::create_dir_all(&spec.output_dir).map_err(|source| BenchError::Output {
        path: spec.output_dir.clone(),
        source,
    })?;
    // Ctrl-C / SIGTERM, awaited once for the whole run: the benchmarks then stop and what
    // completed is written; before them (start-up, discovery) the run just ends.
    let stop = CancellationToken::new();
    let signal = tokio::spawn({
        let stop = stop.clone();
        async move {
            launch::interrupted().await;
            stop.cancel();
        }
    });
    let result = run_launched(spec, &stop).await;
    signal.abort();
    result
}

async fn run_launched(mut spec: RunSpec, stop: &CancellationToken) -> Result<Summary, BenchError> {
    let Some(l) = spec.launch.clone() else {
        return run_on(spec, None, stop).await;
    };
    let port = launch::free_port().map_err(|source| {
        BenchError::Launch(launch::LaunchError::Spawn {
            command: "bind 127.0.0.1:0".into(),
            source,
        })
    })?;
    launch::retarget(&mut spec.target, port).map_err(|reason| BenchError::Invalid {
        field: "--launch",
        value: port.to_string(),
        reason,
    })?;
    let mut server = launch::Server::spawn(&l, port, &spec.output_dir)?;
    let progress = spec.progress;
    let start = async {
        let clients = Clients::new(spec.target.connect_timeout)?;
        let startup = server
            .wait_ready(&clients, &spec.target, l.timeout, progress)
            .await?;
        let version = launch::version(&clients, &spec.target).await;
        let warmup = launch::warm_up(&clients, &spec.target, &l.model).await?;
        Ok::<_, BenchError>(launch::ServerInfo {
            launcher: l.launcher.name(),
            command: server.command.clone(),
            port,
            version,
            startup_s: startup.as_secs_f64(),
            warmup_s: warmup.as_secs_f64(),
            log: server.log.clone(),
        })
    };
    let started = tokio::select! {
        r = start => r,
        () = stop.cancelled() => Err(BenchError::Launch(launch::LaunchError::Interrupted)),
    };
    let result = match started {
        Ok(info) => run_on(spec, Some(info), stop).await,
        Err(e) => Err(e),
    };
    let status = tokio::task::spawn_blocking(move || server.stop(launch::STOP_GRACE))
        .await
        .ok()
        .flatten();
    if progress {
        eprintln!(
            "lmperf run: server stopped ({})",
            status.as_deref().unwrap_or("already gone")
        );
    }
    result
}

async fn run_on(
    spec: RunSpec,
    server: Option<launch::ServerInfo>,
    stop: &CancellationToken,
) -> Result<Summary, BenchError> {
    let interrupted = |during: &str, completed: usize| BenchError::Interrupted {
        during: during.to_owned(),
        completed,
        dir: spec.output_dir.clone(),
    };
    let clients = Clients::new(spec.target.connect_timeout)?;
    for t in std::iter::once(&spec.target).chain(&spec.traffic.more_endpoints) {
        launch::reachable(t)
            .await
            .map_err(|reason| BenchError::Unreachable {
                url: t.base_url.to_string(),
                reason,
            })?;
    }
    let telemetry = match &spec.otlp {
        Some(cfg) => Some(Arc::new(export::BenchTelemetry::start(
            cfg,
            &crate::config::ProcessEnv,
        )?)),
        None => None,
    };
    let model = match &spec.target.model {
        Some(m) => m.clone(),
        None => client::discover_model(&clients, &spec.target)
            .await
            .map(|d| d.model)
            .map_err(|r| {
                BenchError::NoModel(
                    r.error
                        .map(|e| format!("{}: {}", e.error_type, e.message.unwrap_or_default()))
                        .unwrap_or_default(),
                )
            })?,
    };
    let tok = match &spec.workload.tokenizer {
        Some(local) => TokenizeClient::local(&clients, &spec.target, &model, local.clone()),
        None => TokenizeClient::detect(&clients, &spec.target, &model).await,
    };
    if spec.progress {
        let kind = serde_json::to_value(tok.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        eprintln!(
            "lmperf run: target {} model {model} tokenizer {kind} seed {}",
            spec.target.base_url, spec.seed
        );
    }
    let tok = tokens::setup(
        tok,
        spec.workload.chat_template.as_ref(),
        spec.workload.tokenizer.as_ref(),
        spec.target.api,
        spec.progress,
    )
    .await?;
    // Chat prompts shorter than the template itself cannot be sent: warned, and the summary's
    // input_len is then the achieved mean.
    let template_floor = match spec.target.api {
        Api::Chat if !spec.workload.own_inputs() => tokens::template_floor(&tok).await,
        _ => None,
    };
    if spec.progress
        && let Some(w) = template_floor
            .and_then(|f| chat_template::short_lengths_warning(&spec.input_lengths, f))
    {
        eprintln!("{w}");
    }
    let mut extra = serde_json::Map::new();
    if spec.ignore_eos {
        extra.insert("ignore_eos".into(), serde_json::Value::Bool(true));
    }
    if spec.n > 1 {
        extra.insert("n".into(), serde_json::Value::from(spec.n));
    }
    if spec.workload.multi_turn && spec.target.api != Api::Chat {
        return Err(BenchError::Invalid {
            field: "--multi-turn",
            value: "completions".into(),
            reason: "multi-turn needs --api chat".into(),
        });
    }
    // Each request of a shared-prefix workload is its group's prefix and a unique suffix, so the
    // prefix must leave room in every input length (a distribution's lengths are drawn later).
    if let (Some(p), None, Some(&shortest)) = (
        spec.workload.shared_prefix,
        &spec.workload.input_dist,
        spec.input_lengths.iter().min(),
    ) && p.len >= shortest
    {
        return Err(BenchError::Invalid {
            field: "--prefix-len",
            value: p.len.to_string(),
            reason: format!(
                "the shared prefix must be shorter than the shortest --seq-lengths ({shortest} tokens): each request needs a unique suffix"
            ),
        });
    }
    let ctx = RunContext {
        spec: &spec,
        clients: &clients,
        model: &model,
        extra: &extra,
        tok: &tok,
        telemetry: telemetry.clone(),
    };
    let watch = vram::VramWatch::start(&spec.gpu);
    let mut server_watch = server::ServerWatch::start(&spec.target);
    // Rows go to requests.jsonl, the length buckets and the report's sample as they finish.
    let mut out = rows::RunRows::new(&spec.output_dir, spec.seed);
    let mut benchmarks = Vec::new();
    let mut capacity = None;
    let mut profile_info = None;
    if let Some((path, p)) = &spec.profile {
        let name = format!("profile_{}", p.name);
        let concurrency = spec.concurrencies.iter().copied().max().unwrap_or(1);
        server_watch.mark().await;
        let mut s = aggregate::Summarizer::new(spec.goodput);
        out.begin();
        let mut sink = |r: RequestRow| {
            s.push(&r);
            out.push(r);
        };
        let run = profile::run::run(&ctx, path, p.clone(), &name, &mut sink);
        let (info, dispatch) = tokio::select! {
            r = run => r?,
            () = stop.cancelled() => {
                out.discard();
                return Err(interrupted(&name, 0));
            }
        };
        out.commit();
        let input = spec.input_lengths.first().copied().unwrap_or(128);
        let mut summary = s.finish(shape(&spec, &name, concurrency, input));
        summary.server = server_watch.take(&name).await;
        say_done(&spec, &mut summary, dispatch, Some(BEHIND_FLOOR_MS));
        benchmarks.push(summary);
        profile_info = Some(info);
    }
    let input_lengths = if spec.find_rate.is_some() || spec.profile.is_some() {
        Vec::new()
    } else if spec.workload.own_inputs() {
        vec![0]
    } else {
        spec.input_lengths.clone()
    };
    let mut stopped_during = None;
    let direct_workers = super::direct::workers(&ctx).await;
    if let Some(f) = &spec.find_rate {
        // Ctrl-C: the steps that completed are written with a partial `capacity`.
        let (benches, c, cut) = find_rate::search(&ctx, f, &mut out, stop).await?;
        (benchmarks, capacity, stopped_during) = (benches, Some(c), cut);
    }
    'benchmarks: for &input_len in &input_lengths {
        for &concurrency in &spec.concurrencies {
            let name = format!("c{concurrency}_{}", spec.workload.label(input_len));
            out.begin();
            let one = async {
                // Fresh prompts per benchmark: a server's prefix cache must not carry one
                // benchmark's prompts into the next.
                let mut all = aggregate::Summarizer::new(spec.goodput);
                let mut per_repeat = Vec::new();
                let mut summary_input_len = input_len;
                let (mut warmup_requests, mut warmup_s, mut prepare_s) = (0usize, 0.0f64, 0.0f64);
                let (mut dispatch, mut closed_loop) = (super::offered::Dispatch::default(), true);
                for k in 0..spec.repeat.max(1) {
                    // Each repeat: fresh prompts too (the first is the run without --repeat), on
                    // the same schedule.
                    let seed = spec.seed
                        ^ (concurrency as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        ^ (k as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
                    let (warm, measured) = match &spec.workload.trace {
                        // A trace replays all its requests; warm-up sends the shapes of its first ones
                        // with other prompts (no prefix-cache hit carried into the measured replay).
                        Some(t) => (
                            feed::ItemSource::new(
                                &spec.feed(),
                                &tok,
                                spec.warmup,
                                input_len,
                                seed ^ 0x5741_524D_5550,
                            ),
                            feed::ItemSource::new(
                                &spec.feed(),
                                &tok,
                                t.trace.requests.len(),
                                input_len,
                                seed,
                            ),
                        ),
                        None => (
                            feed::ItemSource::new(&spec.feed(), &tok, spec.warmup, input_len, seed),
                            feed::ItemSource::new(
                                &spec.feed(),
                                &tok,
                                spec.warmup + spec.num_prompts,
                                input_len,
                                seed,
                            )
                            .skip(spec.warmup),
                        ),
                    };
                    if !warm.is_empty() {
                        let started = std::time::Instant::now();
                        let mut sent = 0usize;
                        one_benchmark(
                            &ctx,
                            &name,
                            concurrency,
                            warm,
                            None,
                            &mut |_: RequestRow| sent += 1,
                        )
                        .await?;
                        warmup_requests += sent;
                        warmup_s += started.elapsed().as_secs_f64();
                    }
                    let schedule = feed::Schedule::new(&spec.feed(), measured.len(), spec.seed)?;
                    closed_loop = schedule.closed_loop();
                    if k == 0 {
                        watch.reset();
                        server_watch.mark().await;
                    }
                    let mut this = aggregate::Summarizer::new(spec.goodput);
                    // Mean input of the first turns (length distributions, files, traces).
                    let (mut first_turns, mut first_turn_tokens, mut first_turn_sent) =
                        (0usize, 0.0f64, 0.0f64);
                    let mut sink = |mut r: RequestRow| {
                        r.repeat = k;
                        all.push(&r);
                        if spec.repeat > 1 {
                            this.push(&r);
                        }
                        if r.turn == 0 && !r.probe {
                            first_turns += 1;
                            first_turn_tokens += f64::from(r.prompt_tokens_target);
                            first_turn_sent += f64::from(r.prompt_tokens);
                        }
                        out.push(r);
                    };
                    let started = one_benchmark(
                        &ctx,
                        &name,
                        concurrency,
                        measured,
                        Some(schedule),
                        &mut sink,
                    )
                    .await?;
                    dispatch.add(started.dispatch);
                    prepare_s += note_started(&spec, &name, k, started, &mut server_watch);
                    if spec.workload.own_inputs() {
                        summary_input_len =
                            (first_turn_tokens / first_turns.max(1) as f64).round() as u32;
                    } else if template_floor.is_some_and(|f| input_len < f) && first_turns > 0 {
                        summary_input_len = (first_turn_sent / first_turns as f64).round() as u32;
                    }
                    if spec.repeat > 1 {
                        per_repeat.push(this.finish(shape(
                            &spec,
                            &name,
                            concurrency,
                            summary_input_len,
                        )));
                    }
                }
                let mut summary = all.finish(shape(&spec, &name, concurrency, summary_input_len));
                summary.repeat = repeat::repeat_stats(&per_repeat);
                (summary.warmup_requests, summary.warmup_s) = (warmup_requests, warmup_s);
                summary.prepare_s = prepare_s;
                summary.vram = watch.take(summary.output_token_throughput);
                watch.take_samples(&name);
                summary.server = server_watch.take(&name).await;
                let bound = super::offered::late_bound_ms(closed_loop, spec.request_rate);
                say_done(&spec, &mut summary, dispatch, bound);
                if let Some(w) = &direct_workers {
                    super::direct::phase(&ctx, w, &mut summary, summary_input_len).await?;
                }
                Ok::<_, BenchError>(summary)
            };
            let summary = tokio::select! {
                r = one => r?,
                () = stop.cancelled() => {
                    // Only completed benchmarks are written: this one's rows are cut.
                    out.rollback();
                    stopped_during = Some(name);
                    break 'benchmarks;
                }
            };
            out.commit();
            benchmarks.push(summary);
        }
    }
    if let Some(name) = &stopped_during
        && benchmarks.is_empty()
    {
        watch.stop();
        out.discard();
        return Err(interrupted(name, 0));
    }
    let gpu = watch.status();
    let gpu_samples = watch.rows();
    watch.stop();
    let server_samples = server_watch.stop().await;
    let (length_buckets, sample) =
        out.finish(spec.goodput)
            .map_err(|source| BenchError::Output {
                path: spec.output_dir.join("requests.jsonl"),
                source,
            })?;
    let failed_gates = tripped(&spec.fail_on, &benchmarks);
    let summary = Summary {
        schema_version: SCHEMA_VERSION,
        lmperf_version: env!("CARGO_PKG_VERSION"),
        target: spec.target.base_url.to_string(),
        model,
        api: match spec.target.api {
            Api::Chat => "chat",
            Api::Completions => "completions",
        },
        tokenizer: tok.kind,
        seed: spec.seed,
        goodput_slo: spec.goodput,
        benchmarks,
        length_buckets,
        gpu,
        trace: spec
            .workload
            .trace
            .as_ref()
            .map(workload::TraceReplay::info),
        workload: spec.workload.info(),
        failed_gates,
        launch: server,
        capacity,
        profile: profile_info,
        interrupted: stopped_during.is_some(),
        prompt_tokens_source: tok.source(),
        chat_template: tok.chat.as_ref().map(tokens::ChatCounting::describe),
        prompt_tokens_mismatch: 0,
        server_profile: None,
    };
    let summary = prompt_tokens::checked(summary, spec.progress);
    write_outputs(&spec.output_dir, &sample, &summary)?;
    write_samples(&spec.output_dir, &server_samples, &gpu_samples)?;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    match stopped_during {
        Some(name) => Err(interrupted(&name, summary.benchmarks.len())),
        None => Ok(summary),
    }
}

/// A benchmark done: what its schedule offered against what went out into its summary
/// (`bound`: the lateness bound, ms), its result line and, when the schedule was not kept,
/// the warning that says why.
fn say_done(
    spec: &RunSpec,
    summary: &mut BenchSummary,
    dispatch: super::offered::Dispatch,
    bound: Option<f64>,
) {
    let offered = super::offered::Offered::of(dispatch, bound, refused(summary));
    if spec.progress {
        eprintln!("{}", result_line(summary));
        let warning = offered
            .warning(&summary.benchmark, summary.concurrency)
            .or_else(|| behind_warning(summary, spec.request_rate));
        if let Some(w) = warning {
            eprintln!("{w}");
        }
    }
    summary.offered = Some(offered);
}

/// Whether the server pushed back during the benchmark: it refused requests with 429 or 503.
fn refused(summary: &BenchSummary) -> bool {
    ["429", "503"]
        .iter()
        .any(|s| summary.errors_by_status.contains_key(*s))
}

/// The line printed as a benchmark ends: `lmperf run: c1_in8: 10 requests, 10 ok, …`.
fn result_line(summary: &BenchSummary) -> String {
    let errors = if summary.errors.is_empty() {
        String::new()
    } else {
        let oom = if summary.oom == 0 {
            String::new()
        } else {
            format!(", {} of them out of memory", summary.oom)
        };
        format!(
            ", failed: {} (error rate {:.3}{oom})",
            summary.error_reasons().join("; "),
            summary.error_rate
        )
    };
    let ms = |d: &Option<Distribution>, f: fn(&Distribution) -> f64| {
        crate::fmt::opt_duration_ms(d.as_ref().map(f))
    };
    let mut line = format!(
        "lmperf run: {}: {} requests, {} ok{errors}, {}, {}, TTFT p50 {} p99 {}, TPOT p50 {} p99 {}, E2EL p99 {}",
        summary.benchmark,
        summary.num_requests,
        summary.completed,
        crate::fmt::rate(summary.request_throughput, "req/s"),
        crate::fmt::rate(summary.output_token_throughput, "tok/s"),
        ms(&summary.ttft_ms, |d| d.p50),
        ms(&summary.ttft_ms, |d| d.p99),
        ms(&summary.tpot_ms, |d| d.p50),
        ms(&summary.tpot_ms, |d| d.p99),
        ms(&summary.e2el_ms, |d| d.p99),
    );
    for (worker, g) in summary.workers.iter().flatten() {
        if let Some(split) = &g.ttft_split {
            line.push('\n');
            line.push_str(&split_line(worker, split));
        }
    }
    line
}

/// One worker (pair) behind a router, its TTFT split along the serving path: `lmperf run:
///   worker 12→34: TTFT split (8 requests) p50 frontend 1.20 ms + router queue 0.30 ms +
/// prefill 20.1 ms + transfer and first decode 5.00 ms; p99 …`.
fn split_line(worker: &str, split: &super::groups::TtftSplitSummary) -> String {
    let names = [
        "frontend",
        "router queue",
        "prefill",
        "transfer and first decode",
    ];
    let at = |f: fn(&Distribution) -> f64| {
        names
            .iter()
            .zip(split.segments())
            .map(|(n, d)| format!("{n} {}", crate::fmt::opt_duration_ms(d.map(f))))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    format!(
        "lmperf run:   worker {worker}: TTFT split ({} requests) p50 {}; p99 {}",
        split.requests,
        at(|d| d.p50),
        at(|d| d.p99)
    )
}

/// Dispatch delay p99 above which an open-loop schedule counts as fallen behind: one
/// inter-arrival gap at `rate`, at least [`BEHIND_FLOOR_MS`].
pub const BEHIND_FLOOR_MS: f64 = super::offered::LATE_FLOOR_MS;

/// A pause before a benchmark's first send longer than this is said on the terminal.
const PREPARE_SAID_OVER: Duration = Duration::from_secs(1);

/// After a measured run `k` of benchmark `name`: the server's samples count from the first
/// run's first send ([`server::ServerWatch::rebase`]); the seconds it spent making its first
/// items before its clock started (prompts calibrated with the tokenizer, a `server_*`
/// tokenizer's `/tokenize` calls) are returned, and said over [`PREPARE_SAID_OVER`], so a
/// pause between benchmarks is never unexplained.
fn note_started(
    spec: &RunSpec,
    name: &str,
    k: usize,
    started: super::benchmark::Started,
    server_watch: &mut server::ServerWatch,
) -> f64 {
    if k == 0 {
        server_watch.rebase(started.t0);
    }
    let prepare = started.prepare;
    if spec.progress && prepare > PREPARE_SAID_OVER {
        eprintln!(
            "lmperf run: {name}: {:.1} s making the first prompts (each calibrated with the run's tokenizer) before the first send; not measured, the clock starts at the first send",
            prepare.as_secs_f64()
        );
    }
    prepare.as_secs_f64()
}

/// The warning when an open-loop benchmark (`rate` req/s) could not send on schedule: its
/// dispatch delay p99 above the bound (the concurrency limit held requests back).
fn behind_warning(summary: &BenchSummary, rate: Option<f64>) -> Option<String> {
    let rate = rate?;
    let bound = (1000.0 / rate).max(BEHIND_FLOOR_MS);
    let p99 = summary.dispatch_delay_ms.as_ref()?.p99;
    (p99 > bound).then(|| {
        format!(
            "lmperf run: warning: {}: the schedule fell behind (dispatch delay p99 {} > {} at {} offered; achieved {}): concurrency {} holds requests back; raise --batch-sizes (concurrency)",
            summary.benchmark,
            crate::fmt::duration_ms(p99),
            crate::fmt::duration_ms(bound),
            crate::fmt::rate(rate, "req/s"),
            crate::fmt::rate(summary.request_throughput, "req/s"),
            summary.concurrency,
        )
    })
}

/// Writes `rows` as JSON lines to `path`; nothing (no file) when `rows` is empty.
///
/// # Errors
/// A row cannot be serialized or the file cannot be written.
pub(crate) fn write_jsonl<T: Serialize>(path: &std::path::Path, rows: &[T]) -> std::io::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut lines = String::new();
    for r in rows {
        lines.push_str(&serde_json::to_string(r).map_err(std::io::Error::other)?);
        lines.push('\n');
    }
    std::fs::write(path, lines)
}

/// Writes `summary.json`, `summary.csv` ([`summary_csv`]) and `report.html` (`requests.jsonl` is written as rows finish, see
/// [`rows`]); `sample`: the report's rows ([`rows::REPORT_SAMPLE`] per benchmark at most).
/// The `--fail-on` gates that trip on any benchmark, by their text.
fn tripped(gates: &[super::spec::Gate], benchmarks: &[BenchSummary]) -> Vec<String> {
    gates
        .iter()
        .filter(|g| benchmarks.iter().any(|b| gate_trips(g, b)))
        .map(|g| g.text.clone())
        .collect()
}

/// Writes `summary.json` again (after `--profile-on-fail` added the profiler's record).
///
/// # Errors
/// The file cannot be written.
pub fn rewrite_summary(dir: &std::path::Path, summary: &Summary) -> Result<(), BenchError> {
    let io = |source| BenchError::Output {
        path: dir.join("summary.json"),
        source,
    };
    let text = serde_json::to_string_pretty(summary).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(dir.join("summary.json"), text + "\n").map_err(io)
}

fn write_outputs(
    dir: &std::path::Path,
    sample: &[RequestRow],
    summary: &Summary,
) -> Result<(), BenchError> {
    let io = |source| BenchError::Output {
        path: dir.to_owned(),
        source,
    };
    let text = serde_json::to_string_pretty(summary).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(dir.join("summary.json"), text + "\n").map_err(io)?;
    let csv = summary_csv::render(&summary.benchmarks).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(dir.join("summary.csv"), csv).map_err(io)?;
    std::fs::write(dir.join("report.html"), report::render(summary, sample)).map_err(io)
}

/// Writes the server's and the GPU's samples of the run beside its summary.
fn write_samples(
    dir: &std::path::Path,
    server_samples: &[server::ServerSampleRow],
    gpu_samples: &[vram::GpuSampleRow],
) -> Result<(), BenchError> {
    let io = |source| BenchError::Output {
        path: dir.to_owned(),
        source,
    };
    server::write_samples(dir, server_samples).map_err(io)?;
    vram::write_samples(dir, gpu_samples).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Goodput;

    /// `--request-rate 10` at concurrency 1 with requests of ~400 ms: the dispatch delay grows
    /// to seconds; the warning names the figures and --batch-sizes. On schedule: no warning.
    #[test]
    fn a_schedule_that_fell_behind_is_warned() {
        let summary = |delays: &[f64]| {
            let mut s = aggregate::Summarizer::new(Goodput {
                ttft_ms: None,
                tpot_ms: None,
                e2el_ms: None,
            });
            for (i, &d) in delays.iter().enumerate() {
                s.push(&RequestRow {
                    outcome: "ok",
                    send_ms: i as f64 * 400.0,
                    e2el_ms: 400.0,
                    dispatch_delay_ms: d,
                    ..RequestRow::default()
                });
            }
            s.finish(aggregate::BenchShape {
                name: "c1_in8",
                concurrency: 1,
                input_len: 8,
                output_len: Some(4),
                request_rate: Some(10.0),
            })
        };
        let behind = summary(&(0..100).map(|i| f64::from(i) * 60.0).collect::<Vec<_>>());
        let w = behind_warning(&behind, Some(10.0)).unwrap();
        assert!(w.starts_with("lmperf run: warning: c1_in8: the schedule fell behind (dispatch delay p99 5.88 s > 100 ms at 10.0 req/s offered; achieved "), "{w}");
        assert!(
            w.ends_with("concurrency 1 holds requests back; raise --batch-sizes (concurrency)"),
            "{w}"
        );
        assert_eq!(behind_warning(&summary(&[1.0; 100]), Some(10.0)), None);
        assert_eq!(
            behind_warning(&behind, None),
            None,
            "closed loop: no schedule"
        );
    }
}
