//! One benchmark: its items sent on its schedule through the concurrency slots, each
//! finished request a row (`requests.jsonl`), the rows summarized (`summary.json`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::canary::client::{self, CanaryRequest, Measured};
use crate::config::Api;
use crate::measure::Outcome;
use crate::measure::server_timing::TtftSplit;

use super::context::RunContext;
use super::prompts::Prompt;
use super::{
    BenchError, BenchSummary, ChoiceRow, RequestRow, RunSpec, SCHEMA_VERSION, aggregate, export,
    feed, probe, progress, rows, slots, traffic, workload,
};

/// A duration in milliseconds (`requests.jsonl`'s unit).
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// When a benchmark's clock started, for whatever else is put on it (the server's samples).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Started {
    /// Wall time of the benchmark's zero: `requests.jsonl`'s `send_ms` counts from it.
    pub t0: SystemTime,
    /// From the call to that zero: the first items made (prompts calibrated with the
    /// tokenizer, the server's `/tokenize` for `server_*` tokenizers), before any send.
    pub prepare: Duration,
    /// What the schedule made due against what went out ([`super::offered`]).
    pub dispatch: super::offered::Dispatch,
}

/// Makes the first items ([`feed::ItemSource::start`]), then starts the benchmark's clock
/// 10 ms ahead (its zero, as a monotonic instant and in [`Started`]).
async fn start_clock(items: feed::ItemSource) -> (feed::Feed, Instant, Started) {
    let called = Instant::now();
    let feed = items.start().await;
    let t0 = Instant::now() + Duration::from_millis(10);
    let started = Started {
        t0: SystemTime::now() + Duration::from_millis(10),
        prepare: t0.saturating_duration_since(called),
        dispatch: Default::default(),
    };
    (feed, t0, started)
}

/// Sends one benchmark's `items` on `schedule` (`None`: the warm-up, closed loop) and passes
/// each finished request's rows to `on_row` in `(index, turn)` order ([`rows::Reorder`]).
/// Nothing here grows with the item count: items are made as they are due ([`feed`]), and a
/// row leaves once it is in order. Dropped (Ctrl-C), it stops sending and cancels the
/// requests in flight. Returns when its clock started ([`Started`]).
pub(crate) async fn one_benchmark(
    ctx: &RunContext<'_>,
    name: &str,
    concurrency: usize,
    items: feed::ItemSource,
    schedule: Option<feed::Schedule>,
    on_row: &mut dyn FnMut(RequestRow),
) -> Result<Started, BenchError> {
    let (spec, clients, model, extra) = (ctx.spec, ctx.clients, ctx.model, ctx.extra);
    let n = items.len();
    // Warm-up (no schedule) runs closed loop and is not exported; measured runs follow the
    // schedule.
    let measured = schedule.is_some();
    let telemetry = ctx.telemetry.clone().filter(|_| measured);
    let schedule = schedule.unwrap_or_else(|| feed::Schedule::zero(n));
    // Every offset 0 (no rate, no trace): each request waits for a slot (closed loop).
    let closed_loop = schedule.closed_loop();
    let (mut feed, t0, started) = start_clock(items).await;
    let endpoints = endpoints_of(spec);
    let lora = spec.traffic.lora.clone().map(Arc::new);
    let seed = spec.seed;
    let extra = Arc::new(extra.clone());
    let model: Arc<str> = Arc::from(model);
    let counters = progress::Counters::default();
    let (done, errors) = (counters.done.clone(), counters.errors.clone());
    let shown = progress::Progress::start(name, n, &counters, spec.progress && measured);
    let cancel = CancellationToken::new();
    // Dropped (the benchmark interrupted): no more sends, the requests in flight cancelled.
    let _cancel_on_drop = cancel.clone().drop_guard();
    let (bench_name, multi_turn, ignore_eos, max_offset) = (
        name.to_owned(),
        spec.workload.multi_turn,
        spec.ignore_eos,
        spec.duration,
    );
    // The dispatcher runs on its own thread: it sleeps until each send (no spinning on the
    // runtime's workers, which do the HTTP), waits for a free slot, and spawns the request.
    let slots = slots_of(spec, measured, t0, concurrency);
    // Finished requests' rows, to the collector below (bounded: a full queue holds the
    // requests' tasks, not the dispatcher).
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(usize, Vec<RequestRow>)>(1024);
    // `--probe-rate`: canary probes beside the measured load, until its last request ends.
    let probes = spec.traffic.probe_rate.filter(|_| measured).map(|rate| {
        probe::start(probe::ProbeRun {
            clients: clients.clone(),
            endpoints: endpoints.clone(),
            model: model.clone(),
            name: name.to_owned(),
            concurrency,
            rate,
            t0,
            cancel: cancel.clone(),
        })
    });
    let (handle, clients) = (tokio::runtime::Handle::current(), clients.clone());
    let late_bound = super::offered::late_bound(closed_loop, spec.request_rate);
    let dispatcher = tokio::task::spawn_blocking(move || {
        crate::canary::schedule::pacer_thread_init();
        let mut counts = super::offered::Dispatch::default();
        // `--duration` on the clock: what is still due at its end is never sent.
        let ended = || measured && max_offset.is_some_and(|d| Instant::now() >= t0 + d);
        for (i, offset) in schedule.enumerate().take(n) {
            if cancel.is_cancelled() || max_offset.is_some_and(|d| offset > d) {
                break;
            }
            let Some(item) = feed.next_blocking() else {
                break;
            };
            if counts.due_unless_ended(ended()) {
                continue;
            }
            let scheduled = t0 + offset;
            crate::canary::schedule::pace_until(scheduled.into_std());
            let asked = Instant::now();
            let Some((permit, limit, free_since)) = handle.block_on(slots.acquire_timed()) else {
                break;
            };
            let dispatched = Instant::now();
            if counts.unsent_if(ended()) {
                continue;
            }
            counts.sent((scheduled, asked, free_since, dispatched), late_bound);
            // Closed loop: a request is due when its slot became free.
            let scheduled = if closed_loop {
                scheduled.max(free_since)
            } else {
                scheduled
            };
            // The endpoint, held (in flight) until the request's last turn ends.
            let hold = endpoints.pick();
            let adapter = lora.as_ref().map(|l| l.adapter_for(seed, i).to_owned());
            let (clients, target, extra, model, task_done, task_errors, cancel) = (
                clients.clone(),
                hold.target.clone(),
                extra.clone(),
                adapter.as_deref().map_or_else(|| model.clone(), Arc::from),
                done.clone(),
                errors.clone(),
                cancel.clone(),
            );
            let (bench_name, telemetry, tx) = (bench_name.clone(), telemetry.clone(), tx.clone());
            handle.spawn(async move {
                let mut extra = (*extra).clone();
                if ignore_eos {
                    extra.insert("min_tokens".into(), serde_json::Value::from(item.max_tokens));
                }
                let mut rows = Vec::with_capacity(1 + item.next_turns.len());
                let mut messages = if multi_turn { vec![item.extras.user_message(&item.prompt.text)] } else { Vec::new() };
                let mut prompt = item.prompt.clone();
                let (mut scheduled, mut dispatched) = (scheduled, dispatched);
                for turn in 0..=item.next_turns.len() {
                    if multi_turn {
                        extra.insert("messages".into(), serde_json::Value::Array(messages.clone()));
                    } else if target.api == Api::Chat && let Some(m) = item.extras.chat_messages(&prompt.text) {
                        extra.insert("messages".into(), m);
                    }
                    let ids = export::BenchTelemetry::new_trace();
                    let traceparent = ids.traceparent();
                    let req = CanaryRequest { api: target.api, model: &model, prompt: &prompt.text, max_tokens: item.max_tokens, traceparent: &traceparent, extra_body: Some(&extra) };
                    let m = client::execute_with(&clients, &target, &req, &cancel, multi_turn).await;
                    if let Some(t) = &telemetry {
                        t.record(&export::RequestContext { target: &target, model: &model, benchmark: &bench_name, max_tokens: item.max_tokens, index: i }, ids, &m);
                    }
                    let ok = m.record.outcome == Outcome::Ok;
                    if !ok {
                        task_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    let mut r = row(RowKey { name: &bench_name, index: i, turn: turn as u32, concurrency, concurrency_limit: limit }, t0, scheduled, dispatched, &prompt, item.max_tokens, &m);
                    (r.adapter, r.endpoint) = (adapter.clone(), hold.label.clone());
                    tag(&item.extras, &mut r);
                    rows.push(r);
                    // The next turn: after this answer, with the history.
                    let Some((text, tokens)) = item.next_turns.get(turn).cloned() else { break };
                    if !ok {
                        break;
                    }
                    messages.push(serde_json::json!({ "role": "assistant", "content": m.record.output_text.unwrap_or_default() }));
                    messages.push(serde_json::json!({ "role": "user", "content": text }));
                    prompt = item.next_turn_prompt(&messages, text, tokens).await;
                    (scheduled, dispatched) = (Instant::now(), Instant::now());
                }
                // The endpoint first: the next request, dispatched as the slot frees, sees
                // this one's endpoint no longer in flight (least-outstanding).
                drop(hold);
                drop(permit);
                task_done.fetch_add(1, Ordering::Relaxed);
                // The collector is gone only when the benchmark was dropped.
                let _ = tx.send((i, rows)).await;
            });
        }
        // The dispatcher's sender drops here; the channel closes when every request's has.
        counts
    });
    collect_rows(&mut rx, on_row).await;
    let dispatch = dispatcher
        .await
        .map_err(|e| BenchError::Dispatcher(e.to_string()))?;
    // The load has ended: no more probes; those in flight finish, their rows follow the
    // benchmark's.
    if let Some(p) = probes {
        p.finish().await.into_iter().for_each(&mut *on_row);
    }
    shown.finish().await;
    Ok(Started {
        dispatch,
        ..started
    })
}

/// The endpoints the run's requests go to (`--target` repeated, `--endpoint-policy`).
fn endpoints_of(spec: &RunSpec) -> Arc<traffic::Endpoints> {
    traffic::Endpoints::new(
        &spec.target,
        &spec.traffic.more_endpoints,
        spec.traffic.endpoint_policy,
    )
}

/// The finished requests' rows to `on_row`, back in (index, turn) order as they finish; the
/// channel ends with the last request.
async fn collect_rows(
    rx: &mut tokio::sync::mpsc::Receiver<(usize, Vec<RequestRow>)>,
    on_row: &mut dyn FnMut(RequestRow),
) {
    let mut reorder = rows::Reorder::default();
    while let Some((i, r)) = rx.recv().await {
        reorder.push(i, r, on_row);
    }
    reorder.finish(on_row);
}

/// The benchmark's slots: a measured concurrency ramp's follow the ramp (closed loop), else
/// `concurrency` of them.
fn slots_of(spec: &RunSpec, measured: bool, t0: Instant, concurrency: usize) -> slots::Slots {
    match spec.workload.ramp {
        Some(r) if measured && r.over == workload::RampOver::Concurrency => {
            slots::Slots::ramp(r, t0, spec.duration.map(|d| t0 + d))
        }
        _ => slots::Slots::fixed(concurrency),
    }
}

/// Which request a [`RequestRow`] is: its benchmark, index and turn, and the concurrency it
/// ran at with the limit then in force (`RequestRow::concurrency_limit`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowKey<'a> {
    pub name: &'a str,
    pub index: usize,
    pub turn: u32,
    pub concurrency: usize,
    pub concurrency_limit: usize,
}

pub(crate) fn row(
    RowKey {
        name,
        index,
        turn,
        concurrency,
        concurrency_limit,
    }: RowKey<'_>,
    t0: Instant,
    scheduled: Instant,
    dispatched: Instant,
    prompt: &Prompt,
    max_tokens: u32,
    m: &Measured,
) -> RequestRow {
    let r = &m.record;
    let delay = dispatched.saturating_duration_since(scheduled);
    RequestRow {
        schema_version: SCHEMA_VERSION,
        benchmark: name.to_owned(),
        index,
        repeat: 0,
        concurrency,
        concurrency_limit,
        scheduled_ms: ms(scheduled.saturating_duration_since(t0)),
        dispatch_delay_ms: ms(delay),
        send_ms: ms(dispatched.saturating_duration_since(t0)),
        ttft_ms: r.ttft.map(ms),
        ttft_from_schedule_ms: r.ttft.map(|t| ms(t + delay)),
        time_to_first_content_ms: r.time_to_first_content.map(ms),
        itl_ms: r.itl.iter().map(|d| ms(*d)).collect(),
        tpot_ms: r.tpot.map(ms),
        e2el_ms: ms(r.e2e),
        e2el_from_schedule_ms: ms(r.e2e + delay),
        prompt_tokens: prompt.tokens,
        prompt_tokens_target: prompt.target_tokens,
        output_tokens_target: max_tokens,
        turn,
        input_tokens: r.input_tokens,
        output_tokens: r.output_tokens,
        usage_source: r.usage_source.map(|s| s.as_str()),
        finish_reasons: r.finish_reasons.clone(),
        outcome: r.outcome.as_str(),
        error_type: r.failure().map(|e| e.error_type.clone()),
        http_status: r.http_status,
        retries: m.retries,
        profile_revision: None,
        error_server_type: r.failure().and_then(|e| e.server_type.clone()),
        error_code: r.failure().and_then(|e| e.code.clone()),
        error_message: r.failure().and_then(|e| e.message.clone()),
        retry_after_ms: r.failure().and_then(|e| e.retry_after).map(ms),
        choices: r
            .choices
            .iter()
            .map(|c| ChoiceRow {
                index: c.index,
                ttft_ms: c.first_token.map(ms),
                last_token_ms: c.last_token.map(ms),
                token_chunks: c.token_chunks,
                itl_ms: c.itl.iter().map(|d| ms(*d)).collect(),
                tpot_ms: c.tpot.map(ms),
                finish_reason: c.finish_reason.clone(),
            })
            .collect(),
        prompt_tokens_source: prompt.source,
        adapter: None,
        endpoint: None,
        probe: false,
        cached_input_tokens: r.cached_input_tokens,
        response_id: r.response_id.clone(),
        worker_id: r
            .served_by
            .as_ref()
            .and_then(|b| b.primary())
            .map(|w| w.id.clone()),
        worker_role: r
            .served_by
            .as_ref()
            .and_then(|b| b.primary())
            .map(|w| w.role.as_str()),
        prefill_worker_id: r
            .served_by
            .as_ref()
            .and_then(|b| b.prefill())
            .map(|w| w.id.clone()),
        worker_attribution: r.served_by.as_ref().map(|b| b.source.as_str()),
        server_timing_source: r.server_timing.map(|t| t.source.as_str()),
        server_ttft_ms: r.server_timing.and_then(|t| t.ttft).map(ms),
        server_queue_ms: r.server_timing.and_then(|t| t.queue).map(ms),
        server_prefill_ms: r.server_timing.and_then(|t| t.prefill).map(ms),
        server_decode_ms: r.server_timing.and_then(|t| t.decode).map(ms),
        client_minus_server_ttft_ms: r
            .server_timing
            .zip(r.ttft)
            .and_then(|(t, c)| t.client_minus_server_ttft_ms(c)),
        router_first_token_ms: r.router_stages.and_then(|s| s.first_token_ms),
        router_outside_ms: r
            .router_stages
            .zip(r.ttft)
            .and_then(|(s, t)| s.outside_ms(ms(t))),
        server_kv_hit_rate: r.server_timing.and_then(|t| t.kv_hit_rate),
        server_kv_transfer_ms: r.server_timing.and_then(|t| t.kv_transfer_estimate).map(ms),
        ..split_fields(r)
    }
}

/// The TTFT split fields of a row ([`TtftSplit`]), the rest default.
fn split_fields(r: &crate::measure::RequestRecord) -> RequestRow {
    let split = r
        .server_timing
        .zip(r.ttft)
        .and_then(|(t, c)| TtftSplit::of(c, &t));
    RequestRow {
        ttft_frontend_ms: split.map(|s| s.frontend_ms),
        ttft_router_queue_ms: split.map(|s| s.router_queue_ms),
        ttft_prefill_ms: split.map(|s| s.prefill_ms),
        ttft_transfer_and_first_decode_ms: split.map(|s| s.transfer_and_first_decode_ms),
        ..RequestRow::default()
    }
}

/// The summary of one benchmark's rows. Latency distributions use the successful requests
/// only (a failed request has no meaningful TTFT); errors are counted by type. Percentiles
/// from bounded histograms at 3 significant digits ([`aggregate`]); the rest exact.
pub fn summarize(
    spec: &RunSpec,
    name: &str,
    concurrency: usize,
    input_len: u32,
    rows: &[RequestRow],
) -> BenchSummary {
    let mut s = aggregate::Summarizer::new(spec.goodput);
    rows.iter().for_each(|r| s.push(r));
    s.finish(shape(spec, name, concurrency, input_len))
}

/// What a benchmark's summary says besides its rows' figures.
pub(crate) fn shape<'a>(
    spec: &RunSpec,
    name: &'a str,
    concurrency: usize,
    input_len: u32,
) -> aggregate::BenchShape<'a> {
    let own_output = spec.workload.output_dist.is_some() || spec.workload.trace.is_some();
    aggregate::BenchShape {
        name,
        concurrency,
        input_len,
        output_len: (!own_output).then_some(spec.output_len),
        request_rate: spec.request_rate,
    }
}

/// Writes what a request's extras (shared prefix, images) say into its row.
fn tag(extras: &feed::Extras, row: &mut RequestRow) {
    if let Some((group, first, tokens)) = extras.prefix {
        (row.prefix_group, row.prefix_first, row.prefix_shared_tokens) =
            (Some(group), Some(first), Some(tokens));
    }
    if !extras.images.is_empty() {
        row.images = Some(extras.images.len() as u32);
        row.image_bytes = extras.image_bytes;
        row.image_size = extras.image_size.clone();
    }
}
