//! `--probe-rate R`: the agent's own canary (a short built-in prompt, [`DEFAULT_MAX_TOKENS`]
//! tokens, no extra body: [`crate::canary::Canary::measure_with`]'s request) sent at a constant
//! `R` per second beside a measured benchmark, from its start until its last request ends. A
//! probe takes no concurrency slot of the benchmark: it measures what a small interactive
//! request experiences while the server is loaded. Its rows carry `probe: true` and are
//! summarized apart (`benchmarks[].probes`, [`super::groups`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::prompts::Prompt;
use super::summary::RequestRow;
use super::traffic::Endpoints;
use super::{RowKey, row};
use crate::canary::client::{self, CanaryRequest, Clients};
use crate::config::DEFAULT_MAX_TOKENS;

/// Most probe rows one benchmark keeps; later ones are not sent.
pub const MAX_PROBES: usize = 100_000;

/// What a benchmark's probes need.
pub struct ProbeRun {
    pub clients: Clients,
    pub endpoints: Arc<Endpoints>,
    /// The model (never an adapter: the canary names the base model).
    pub model: Arc<str>,
    pub name: String,
    pub concurrency: usize,
    /// Probes per second.
    pub rate: f64,
    /// The benchmark's start; probe `k` is due at `t0 + k / rate`.
    pub t0: Instant,
    /// The benchmark's: cancelled when it is dropped (Ctrl-C).
    pub cancel: CancellationToken,
}

/// Probes being sent; [`Running::finish`] stops them and returns their rows.
pub struct Running {
    stop: CancellationToken,
    sender: JoinHandle<Vec<JoinHandle<RequestRow>>>,
}

/// Starts sending probes on the current runtime.
pub fn start(run: ProbeRun) -> Running {
    let stop = CancellationToken::new();
    let sender = tokio::spawn(send(run, stop.clone()));
    Running { stop, sender }
}

async fn send(run: ProbeRun, stop: CancellationToken) -> Vec<JoinHandle<RequestRow>> {
    let gap = Duration::from_secs_f64(1.0 / run.rate);
    let mut tasks = Vec::new();
    for k in 0..MAX_PROBES {
        let due = run.t0 + gap.mul_f64(k as f64);
        tokio::select! {
            () = tokio::time::sleep_until(due) => {}
            () = stop.cancelled() => break,
            () = run.cancel.cancelled() => break,
        }
        let hold = run.endpoints.pick();
        let (clients, model, name, cancel) = (
            run.clients.clone(),
            run.model.clone(),
            run.name.clone(),
            run.cancel.clone(),
        );
        let (t0, concurrency) = (run.t0, run.concurrency);
        tasks.push(tokio::spawn(async move {
            let canary = crate::canary::prompts::nth(k as u64);
            let traceparent = super::export::BenchTelemetry::new_trace().traceparent();
            let req = CanaryRequest {
                api: hold.target.api,
                model: &model,
                prompt: canary.text,
                max_tokens: DEFAULT_MAX_TOKENS,
                traceparent: &traceparent,
                extra_body: None,
            };
            let dispatched = Instant::now();
            let m = client::execute(&clients, &hold.target, &req, &cancel).await;
            let prompt = Prompt {
                text: String::new(),
                target_tokens: 0,
                tokens: 0,
                source: Default::default(),
            };
            let key = RowKey {
                name: &name,
                index: k,
                turn: 0,
                concurrency,
                concurrency_limit: 0,
            };
            let mut r = row(key, t0, due, dispatched, &prompt, DEFAULT_MAX_TOKENS, &m);
            (r.probe, r.endpoint) = (true, hold.label.clone());
            r
        }));
    }
    tasks
}

impl Running {
    /// Stops sending; waits for the probes in flight; their rows in send order.
    pub async fn finish(self) -> Vec<RequestRow> {
        self.stop.cancel();
        let Ok(tasks) = self.sender.await else {
            return Vec::new();
        };
        let mut rows = Vec::with_capacity(tasks.len());
        for t in tasks {
            if let Ok(r) = t.await {
                rows.push(r);
            }
        }
        rows
    }
}
