//! Pinned probes: a low-rate canary pinned to each worker behind a Dynamo router target, so
//! that a worker the router never picks is measured too, and one that left the router's view
//! is said (`status::workers`). The workers come from the router's own page (read by the
//! target's scraper: `dynamo_component_router_worker_registered`) and from the replies; each
//! is probed once per `worker_probe_interval`, the target's probes at most
//! `worker_probe_max_rate` per second (the most overdue worker first). A probe asks Dynamo
//! for that worker through `nvext` (`status::workers::Pin`) and goes the canary's path
//! (`TargetRunner::measure` with `Source::Probe`): its span and `requests.jsonl`-style summary
//! carry the worker; it is not one of the target's scheduled canaries (no canary counts, no
//! diagnosis sample).

use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::TargetRunner;
use crate::status::Source;
use crate::status::workers::Transition;

fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Says a change of `target`'s worker set in the log: a worker found or back (INFO), gone
/// from the router's view or failing its probes (WARN).
pub(super) fn log_transitions(target: &str, transitions: Vec<Transition>) {
    for t in transitions {
        match t {
            Transition::Found { id, role } => {
                tracing::info!(target_name = %target, worker_id = %id, role, "Worker found behind the router; probing it.");
            }
            Transition::Back { id } => {
                tracing::info!(target_name = %target, worker_id = %id, "Worker registered again by the router; probing it again.");
            }
            Transition::Gone { id } => {
                tracing::warn!(target_name = %target, worker_id = %id, "Worker left the router's view (no longer registered on its /metrics); no longer probed.");
            }
            Transition::OtherModel { id } => {
                tracing::info!(target_name = %target, worker_id = %id, "Worker registered on the frontend serves another model (a probe pinned to it was refused 400); not probed.");
            }
            Transition::Failing { id, error } => {
                tracing::warn!(target_name = %target, worker_id = %id, error = %error, "Worker failing its pinned probes.");
            }
        }
    }
}

/// Runs `runner`'s pinned probes until `stop` (none unless its state holds
/// [`crate::status::WorkerProbes`]); each probe is spawned on `tracker` and cancelled by
/// `cancel`.
pub async fn run(
    runner: TargetRunner,
    stop: CancellationToken,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    let Some(probes) = runner.state.worker_probes.as_ref() else {
        return;
    };
    let gap = Duration::from_secs_f64(1.0 / probes.max_rate);
    let interval_s = probes.interval.as_secs_f64();
    let name = runner.target.name.clone();
    let mut page_at = None;
    let mut seq = 0u64;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(gap) => {}
        }
        if let Some((at, workers)) = runner.server.as_ref().and_then(|s| s.router_workers())
            && page_at != Some(at)
        {
            page_at = Some(at);
            let t = match probes.set.lock() {
                Ok(mut s) => s.from_page(unix_s(at), &workers),
                Err(_) => Vec::new(),
            };
            log_transitions(&name, t);
        }
        let now = unix_s(SystemTime::now());
        let pin = match probes.set.lock() {
            Ok(mut s) => {
                let pin = s.next_due(now, interval_s);
                if let Some(p) = pin {
                    s.probe_started(p, now);
                }
                pin
            }
            Err(_) => None,
        };
        let Some(pin) = pin else {
            continue;
        };
        seq += 1;
        let (r, c) = (runner.clone(), cancel.clone());
        tracker.spawn(crate::cost::metered(&crate::cost::CANARY, async move {
            r.measure(seq, &c, &Source::Probe(pin)).await;
        }));
    }
}
