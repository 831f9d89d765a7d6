//! `lmperf run --profile FILE`: one benchmark that follows a load profile
//! ([`super`]) for `--duration` (or `--num-prompts` requests), re-reading the file
//! when it changes (watched: [`super::watch`]; a change while a step waits re-plans
//! that step): a valid edit applies from the next scheduling step, requests in flight go on;
//! an invalid one is reported and the running revision kept; an edit that leaves the profile
//! as it was is no new revision. Each row records its `profile_revision`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::watch::ProfileWatch;
use super::{self as profile, Profile, scheduler::Scheduler};
use crate::bench::context::RunContext;
use crate::bench::offered::Dispatch;
use crate::bench::prompts;
use crate::bench::rows::Reorder;
use crate::bench::{BenchError, RequestRow, RowKey, export, row};
use crate::canary::client::{self, CanaryRequest};

/// Run length without `--duration`.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(60);

/// `summary.json` `profile`: the file and when each revision took effect.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProfileInfo {
    pub name: String,
    pub file: String,
    /// `(seconds from the start, revision)`, the first at 0.
    pub revisions: Vec<(f64, u32)>,
    /// `adaptive` token rate: the highest sustained output tokens/s (null otherwise).
    pub sustained_token_rate: Option<f64>,
}

/// Runs the profile; passes its rows (benchmark `name`) to `on_row` in index order as they
/// finish ([`crate::bench::rows::Reorder`]) and returns the revision marks and what its steps
/// made due against what went out ([`crate::bench::offered`]: late beyond
/// [`crate::bench::offered::LATE_FLOOR_MS`]; the steps still due when the run ended are never
/// sent).
///
/// # Errors
/// None today besides what the caller's setup reports; kept for symmetry with the others.
pub(crate) async fn run(
    ctx: &RunContext<'_>,
    path: &std::path::Path,
    first: Profile,
    name: &str,
    on_row: &mut dyn FnMut(RequestRow),
) -> Result<(ProfileInfo, Dispatch), BenchError> {
    let (spec, clients, model, extra, tok) = (ctx.spec, ctx.clients, ctx.model, ctx.extra, ctx.tok);
    let telemetry = ctx.telemetry.clone();
    let mut info = ProfileInfo {
        name: first.name.clone(),
        file: path.display().to_string(),
        revisions: vec![(0.0, 0)],
        sustained_token_rate: None,
    };
    let sched = Arc::new(std::sync::Mutex::new(Scheduler::new(
        first,
        spec.output_len,
        spec.seed,
    )));
    let concurrency = spec.concurrencies.iter().copied().max().unwrap_or(1);
    let input_default = spec.input_lengths.first().copied().unwrap_or(128);
    let (in_flight, freed) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let t0 = Instant::now();
    let end = t0 + spec.duration.unwrap_or(DEFAULT_DURATION);
    let mut watch = ProfileWatch::start(path);
    // A change seen while a step waited: re-read before planning again.
    let mut pending = false;
    let mut tasks = tokio::task::JoinSet::new();
    let mut reorder = Reorder::default();
    let cancel = tokio_util::sync::CancellationToken::new();
    // Dropped (Ctrl-C): the requests in flight are cancelled.
    let _cancel_on_drop = cancel.clone().drop_guard();
    // `--duration` bounds the run (it wins over --num-prompts); without it, --num-prompts
    // requests or DEFAULT_DURATION, whichever ends first.
    let requests = if spec.duration.is_some() {
        usize::MAX
    } else {
        spec.num_prompts
    };
    let mut counts = Dispatch::default();
    let late_bound = Duration::from_secs_f64(crate::bench::offered::LATE_FLOOR_MS / 1000.0);
    for i in 0..requests {
        // Rows of the requests that ended, on in index order: the set holds those in flight.
        while let Some(r) = tasks.try_join_next() {
            if let Ok((index, r)) = r {
                reorder.push(index, vec![r], on_row);
            }
        }
        // Hot update: a changed file applies from this step on.
        if std::mem::take(&mut pending) || watch.take_change() {
            reload(path, &sched, t0, spec.progress, &mut info);
        }
        let planned = sched.lock().ok().and_then(|mut s| s.plan_next());
        let due = planned.map_or_else(Instant::now, |p| t0 + p.at);
        if due >= end {
            break;
        }
        counts.due += 1;
        // Wait until due, watching the file meanwhile (a change re-plans this step).
        let replanned = tokio::select! {
            biased;
            () = tokio::time::sleep_until(due) => false,
            () = watch.changed() => true,
        };
        if replanned {
            pending = true;
            // This step is planned again after the reload; index i is never sent.
            if let (Some(p), Ok(mut s)) = (planned, sched.lock()) {
                s.unplan(p);
            }
            counts.due -= 1;
            reorder.push(i, Vec::new(), on_row);
            continue;
        }
        // A free slot under the profile's (or the run's) concurrency limit.
        let (asked, mut free_since) = (Instant::now(), Instant::now());
        let limit = loop {
            let limit = sched
                .lock()
                .ok()
                .and_then(|s| s.concurrency_at(t0.elapsed()))
                .unwrap_or(concurrency);
            if in_flight.load(Ordering::Acquire) < limit || Instant::now() >= end {
                break limit;
            }
            tokio::select! {
                () = freed.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
            free_since = Instant::now();
        };
        if Instant::now() >= end {
            counts.never_sent += 1;
            break;
        }
        counts.sent((due, asked, free_since, Instant::now()), Some(late_bound));
        in_flight.fetch_add(1, Ordering::AcqRel);
        let revision = planned.map_or_else(
            || sched.lock().map(|s| s.revision()).unwrap_or(0),
            |p| p.revision,
        );
        let input = planned
            .and_then(|p| p.input_tokens)
            .unwrap_or(input_default);
        let (clients, target, extra, model, tok, sched, in_flight, freed, cancel, telemetry) = (
            clients.clone(),
            spec.target.clone(),
            extra.clone(),
            model.to_owned(),
            tok.clone(),
            sched.clone(),
            in_flight.clone(),
            freed.clone(),
            cancel.clone(),
            telemetry.clone(),
        );
        let (name, max_tokens, ignore_eos, seed) =
            (name.to_owned(), spec.output_len, spec.ignore_eos, spec.seed);
        tasks.spawn(async move {
            let prompt = prompts::synthetic(
                &tok,
                1,
                input,
                seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            )
            .await
            .pop()
            .unwrap_or(prompts::Prompt {
                text: String::new(),
                target_tokens: input,
                tokens: 0,
                source: prompts::PromptTokensSource::Estimate,
            });
            let mut extra = extra;
            if ignore_eos {
                extra.insert("min_tokens".into(), serde_json::Value::from(max_tokens));
            }
            let ids = export::BenchTelemetry::new_trace();
            let traceparent = ids.traceparent();
            let dispatched = Instant::now();
            let req = CanaryRequest {
                api: target.api,
                model: &model,
                prompt: &prompt.text,
                max_tokens,
                traceparent: &traceparent,
                extra_body: Some(&extra),
            };
            let m = client::execute_with(&clients, &target, &req, &cancel, false).await;
            if let Some(t) = &telemetry {
                t.record(
                    &export::RequestContext {
                        target: &target,
                        model: &model,
                        benchmark: &name,
                        max_tokens,
                        index: i,
                    },
                    ids,
                    &m,
                );
            }
            if let (Some(tpot), Ok(mut s)) = (m.record.tpot, sched.lock()) {
                s.observe_tpot(tpot.as_secs_f64() * 1000.0);
            }
            in_flight.fetch_sub(1, Ordering::AcqRel);
            freed.notify_one();
            let mut r = row(
                RowKey {
                    name: &name,
                    index: i,
                    turn: 0,
                    concurrency: limit,
                    concurrency_limit: limit,
                },
                t0,
                due.min(dispatched),
                dispatched,
                &prompt,
                max_tokens,
                &m,
            );
            r.profile_revision = Some(revision);
            (i, r)
        });
    }
    while let Some(r) = tasks.join_next().await {
        if let Ok((index, r)) = r {
            reorder.push(index, vec![r], on_row);
        }
    }
    reorder.finish(on_row);
    info.sustained_token_rate = sched.lock().ok().and_then(|s| s.sustained_token_rate());
    if let Ok(mut s) = sched.lock() {
        unsent(&mut s, (t0, end), &mut counts);
    }
    Ok((info, counts))
}

/// Reads the profile at `path` again: a valid change becomes `sched`'s next revision (marked in
/// `info`, said when `progress`), an invalid one is said and the running revision kept.
fn reload(
    path: &std::path::Path,
    sched: &std::sync::Mutex<Scheduler>,
    t0: Instant,
    progress: bool,
    info: &mut ProfileInfo,
) {
    match profile::load(path) {
        Ok(p) if sched.lock().is_ok_and(|s| *s.profile() == p) => {}
        Ok(p) => {
            let rev = sched
                .lock()
                .map(|mut s| s.update(p, t0.elapsed()))
                .unwrap_or(0);
            info.revisions.push((t0.elapsed().as_secs_f64(), rev));
            if progress {
                eprintln!(
                    "lmperf run: profile revision {rev} from {} at {:.2} s",
                    path.display(),
                    t0.elapsed().as_secs_f64()
                );
            }
        }
        Err(e) => {
            eprintln!("lmperf run: profile change ignored, keeping the running revision: {e}");
        }
    }
}

/// Steps counted at most (a profile of a million requests a run is far beyond any server).
const MAX_COUNTED: usize = 1_000_000;

/// The steps `sched` still plans before `end` (the run had no slot for them): due, never sent.
fn unsent(sched: &mut Scheduler, (t0, end): (Instant, Instant), counts: &mut Dispatch) {
    while counts.due < MAX_COUNTED {
        match sched.plan_next() {
            Some(p) if t0 + p.at < end => {
                counts.due += 1;
                counts.never_sent += 1;
            }
            _ => break,
        }
    }
}
