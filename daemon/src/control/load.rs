//! Load injected through the control API (`InjectLoad` / `StopLoad`): a bounded burst against
//! one configured target, at most one at a time.
//!
//! A load is open loop on an absolute schedule ([`crate::canary::schedule`], Poisson or
//! constant gaps) for `duration`, at most `max_requests` sends, at most `concurrency` in
//! flight (a send due while that many run is skipped and counted). A trace replay
//! ([`crate::load::trace`]) sends request i at the start + its arrival offset ÷ speedup, with
//! synthetic text of about its input tokens and `max_tokens` = its output tokens. Each request
//! goes through [`TargetRunner::measure_with`], the canaries' client and measurement, marked
//! as injected. Every bound is checked against [`InjectCaps`] before anything is sent (for a
//! trace: its request count, replay duration and peak rate); a request beyond a cap is refused
//! whole. Loads run on the agent's task tracker, so the agent's shutdown stops them and waits
//! for (or cancels) their requests like canaries. A load profile ([`profile`]) follows
//! `lmperf run --profile`'s scheduler and is updated while it runs (`UpdateLoad`).

mod profile;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::proto;
use crate::canary::schedule::{Gaps, Ticker, wait_until};
use crate::canary::{RequestShape, Shutdown, TargetRunner};
use crate::config::{Arrival, InjectCaps, Schedule};
use crate::load::trace::{self, TraceFormat, TraceRequest};
use crate::status::Source;

/// Why an `InjectLoad` or `StopLoad` is refused. `Display` is one line naming the field, the
/// value and, for a cap, the cap and its config key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("{field} = {value}: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error("{field} = {value}: above the cap of {cap} ({key})")]
    AboveCap {
        field: &'static str,
        value: String,
        cap: String,
        key: &'static str,
    },
    #[error("target = {name:?}: not a configured target ({known})")]
    UnknownTarget { name: String, known: String },
    /// A trace whose replay is beyond a cap; `what` names the quantity and its value.
    #[error("trace_file = {file:?}: {what}: above the cap of {cap} ({key})")]
    TraceAboveCap {
        file: String,
        what: String,
        cap: String,
        key: &'static str,
    },
    #[error("load {0} is running; stop it first (`lmperf ctl stop`)")]
    Busy(String),
    #[error("the agent is shutting down")]
    ShuttingDown,
    #[error("no load is running")]
    NoneRunning,
    #[error("id = {0:?}: not the running load")]
    UnknownLoad(String),
    /// A load profile that does not parse: the parser's one line (file, key, value).
    #[error("{0}")]
    Profile(String),
    /// `UpdateLoad` on a load that follows no profile.
    #[error(
        "load {0} follows no profile: only a load started with a profile (`lmperf ctl inject --profile FILE`) can be updated"
    )]
    NotAProfile(String),
}

impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> Self {
        let msg = r.to_string();
        match r {
            Refusal::Invalid { .. }
            | Refusal::AboveCap { .. }
            | Refusal::TraceAboveCap { .. }
            | Refusal::Profile(_) => tonic::Status::invalid_argument(msg),
            Refusal::NotAProfile(_) => tonic::Status::failed_precondition(msg),
            Refusal::UnknownTarget { .. } | Refusal::NoneRunning | Refusal::UnknownLoad(_) => {
                tonic::Status::not_found(msg)
            }
            Refusal::Busy(_) => tonic::Status::already_exists(msg),
            Refusal::ShuttingDown => tonic::Status::unavailable(msg),
        }
    }
}

/// A validated load.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadSpec {
    /// Index of the target in the agent's runners.
    pub target: usize,
    pub target_name: String,
    /// For a trace: its mean rate ((requests − 1) ÷ duration; 0 when all at once).
    pub rate_per_second: f64,
    /// For a trace: its replay duration (last offset ÷ speedup).
    pub duration: Duration,
    pub concurrency: u32,
    pub max_requests: u64,
    pub arrival: Arrival,
    /// A trace to replay instead of the rate.
    pub replay: Option<Replay>,
    /// A load profile to follow instead of the rate.
    pub profile: Option<profile::ProfileSpec>,
}

/// A trace to replay, as validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The trace's file name (no directory).
    pub name: String,
    pub speedup: f64,
    /// Most sends in any 1 s of the replay (any `1/cap` s when the rate cap is below 1/s,
    /// scaled to a rate).
    pub peak_rate_per_second: f64,
    /// Its requests in order, `at` already divided by the speedup.
    pub requests: Arc<[TraceRequest]>,
}

/// The most requests whose offsets fall in any window `[t, t + window)`; `offsets` sorted.
fn peak_count(offsets: impl Iterator<Item = Duration> + Clone, window: Duration) -> usize {
    let mut start = offsets.clone();
    let (mut first, mut in_window, mut peak) = (start.next(), 0usize, 0usize);
    for at in offsets {
        in_window += 1;
        while let Some(f) = first
            && at.saturating_sub(f) >= window
        {
            in_window -= 1;
            first = start.next();
        }
        peak = peak.max(in_window);
    }
    peak
}

/// Checks an `InjectLoad` request against the targets and the caps. With a `trace_file` this
/// reads the file (blocking).
///
/// # Errors
/// The first field that is invalid or beyond its cap, as a [`Refusal`].
pub fn validate(
    req: &proto::InjectLoadRequest,
    targets: &[&str],
    caps: &InjectCaps,
) -> Result<LoadSpec, Refusal> {
    let invalid = |field, value: String, reason: &str| Refusal::Invalid {
        field,
        value,
        reason: reason.to_owned(),
    };
    let target = match (req.target.as_str(), targets) {
        ("", [_]) => 0,
        ("", _) => {
            return Err(invalid(
                "target",
                "\"\"".into(),
                &format!("name one of: {}", targets.join(", ")),
            ));
        }
        (name, _) => {
            targets
                .iter()
                .position(|t| *t == name)
                .ok_or_else(|| Refusal::UnknownTarget {
                    name: name.to_owned(),
                    known: targets.join(", "),
                })?
        }
    };
    if !req.profile_yaml.is_empty() {
        return profile::validate(req, target, targets[target], caps);
    }
    if !req.trace_file.is_empty() {
        return validate_trace(req, target, targets[target], caps);
    }
    let rate = req.rate_per_second;
    if !(rate.is_finite() && rate > 0.0) {
        return Err(invalid(
            "rate_per_second",
            rate.to_string(),
            "requests per second, above 0",
        ));
    }
    if rate > caps.max_rate_per_second {
        return Err(Refusal::AboveCap {
            field: "rate_per_second",
            value: rate.to_string(),
            cap: caps.max_rate_per_second.to_string(),
            key: "control.max_inject_rate",
        });
    }
    let secs = req.duration_s;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(invalid("duration_s", secs.to_string(), "seconds, above 0"));
    }
    if secs > caps.max_duration.as_secs_f64() {
        return Err(Refusal::AboveCap {
            field: "duration_s",
            value: secs.to_string(),
            cap: caps.max_duration.as_secs_f64().to_string(),
            key: "control.max_inject_duration",
        });
    }
    let concurrency = concurrency_within(req, caps)?;
    let arrival = match req.arrival.as_str() {
        "" | "poisson" => Arrival::Poisson,
        "constant" => Arrival::Constant,
        other => {
            return Err(invalid(
                "arrival",
                format!("{other:?}"),
                "poisson or constant",
            ));
        }
    };
    let (field, max_requests) = if req.max_requests > 0 {
        ("max_requests", req.max_requests)
    } else {
        (
            "rate_per_second × duration_s",
            (rate * secs).ceil().max(1.0) as u64,
        )
    };
    if max_requests > caps.max_requests {
        return Err(Refusal::AboveCap {
            field,
            value: max_requests.to_string(),
            cap: caps.max_requests.to_string(),
            key: "control.max_inject_requests",
        });
    }
    Ok(LoadSpec {
        target,
        target_name: targets[target].to_owned(),
        rate_per_second: rate,
        duration: Duration::from_secs_f64(secs),
        concurrency,
        max_requests,
        arrival,
        replay: None,
        profile: None,
    })
}

fn concurrency_within(req: &proto::InjectLoadRequest, caps: &InjectCaps) -> Result<u32, Refusal> {
    let concurrency = req.concurrency.max(1);
    if concurrency > caps.max_concurrency {
        return Err(Refusal::AboveCap {
            field: "concurrency",
            value: concurrency.to_string(),
            cap: caps.max_concurrency.to_string(),
            key: "control.max_inject_concurrency",
        });
    }
    Ok(concurrency)
}

/// Bytes of a trace file an `InjectLoad` may make the agent read (the file is streamed and
/// reading stops at the request limit; a file that needs more for its rows is refused).
pub const MAX_TRACE_BYTES: u64 = 256 << 20;

/// [`validate`] for a trace replay: streams at most `max_requests` (else the request cap + 1)
/// requests, and at most [`MAX_TRACE_BYTES`] of the file, then checks their count, the replay's
/// duration and its peak rate.
fn validate_trace(
    req: &proto::InjectLoadRequest,
    target: usize,
    target_name: &str,
    caps: &InjectCaps,
) -> Result<LoadSpec, Refusal> {
    let invalid = |field, value: String, reason: String| Refusal::Invalid {
        field,
        value,
        reason,
    };
    let speedup = if req.trace_speedup == 0.0 {
        1.0
    } else {
        req.trace_speedup
    };
    if !(speedup.is_finite() && speedup > 0.0) {
        return Err(invalid(
            "trace_speedup",
            req.trace_speedup.to_string(),
            "a factor above 0 (0: 1)".into(),
        ));
    }
    let format = match req.trace_format.as_str() {
        "" => None,
        f => Some(TraceFormat::parse(f).ok_or_else(|| {
            invalid(
                "trace_format",
                format!("{f:?}"),
                "azure, burstgpt or mooncake".into(),
            )
        })?),
    };
    if req.max_requests > caps.max_requests {
        return Err(Refusal::AboveCap {
            field: "max_requests",
            value: req.max_requests.to_string(),
            cap: caps.max_requests.to_string(),
            key: "control.max_inject_requests",
        });
    }
    // A replay without a concurrency: the cap, so the trace's arrivals (not a limit of 1)
    // decide what is in flight.
    let concurrency = if req.concurrency == 0 {
        caps.max_concurrency
    } else {
        concurrency_within(req, caps)?
    };
    let limit = if req.max_requests > 0 {
        req.max_requests
    } else {
        caps.max_requests.saturating_add(1)
    };
    let file = req.trace_file.clone();
    // Only files under control.trace_dir (links resolved): the API must not make the agent read,
    // or quote in a refusal, any file it can open.
    let Some(dir) = &caps.trace_dir else {
        return Err(invalid(
            "trace_file",
            format!("{file:?}"),
            "trace replay is off: set control.trace_dir to the directory of replayable traces"
                .into(),
        ));
    };
    let inside = std::fs::canonicalize(&req.trace_file)
        .ok()
        .zip(std::fs::canonicalize(dir).ok())
        .filter(|(p, d)| p.starts_with(d) && p.is_file());
    let Some((path, _)) = inside else {
        return Err(invalid(
            "trace_file",
            format!("{file:?}"),
            format!(
                "not a readable file under control.trace_dir ({})",
                dir.display()
            ),
        ));
    };
    let path = path.as_path();
    let t = trace::load_capped(
        path,
        format,
        Some(usize::try_from(limit).unwrap_or(usize::MAX)),
        Some(MAX_TRACE_BYTES),
    )
    .map_err(|e| {
        let reason = match e.line {
            Some(l) => format!("line {l}: {}", e.reason),
            None => e.reason,
        };
        invalid("trace_file", format!("{file:?}"), reason)
    })?;
    let above = |what: String, cap: String, key| Refusal::TraceAboveCap {
        file: file.clone(),
        what,
        cap,
        key,
    };
    let n = t.requests.len() as u64;
    if n > caps.max_requests {
        return Err(above(
            format!("requests = {n} or more (give max_requests)"),
            caps.max_requests.to_string(),
            "control.max_inject_requests",
        ));
    }
    let requests: Arc<[TraceRequest]> = t
        .requests
        .iter()
        .map(|r| TraceRequest {
            at: r.at_speedup(speedup),
            ..*r
        })
        .collect();
    let duration = requests.last().map_or(Duration::ZERO, |r| r.at);
    if duration > caps.max_duration {
        return Err(above(
            format!(
                "replay duration_s = {} at trace_speedup {speedup}",
                duration.as_secs_f64()
            ),
            caps.max_duration.as_secs_f64().to_string(),
            "control.max_inject_duration",
        ));
    }
    // A cap below 1/s is a count per 1/cap s (else one request would exceed it).
    let window = Duration::from_secs_f64((1.0 / caps.max_rate_per_second).clamp(1.0, 86_400.0));
    let peak = peak_count(requests.iter().map(|r| r.at), window) as f64 / window.as_secs_f64();
    if peak > caps.max_rate_per_second {
        return Err(above(
            format!(
                "peak rate_per_second = {peak} (sends in {} s at trace_speedup {speedup})",
                window.as_secs_f64()
            ),
            caps.max_rate_per_second.to_string(),
            "control.max_inject_rate",
        ));
    }
    let mean = if n > 1 && !duration.is_zero() {
        (n - 1) as f64 / duration.as_secs_f64()
    } else {
        0.0
    };
    Ok(LoadSpec {
        target,
        target_name: target_name.to_owned(),
        rate_per_second: mean,
        duration,
        concurrency,
        max_requests: n,
        arrival: Arrival::Constant,
        replay: Some(Replay {
            name: t.name,
            speedup,
            peak_rate_per_second: peak,
            requests,
        }),
        profile: None,
    })
}

/// What a load is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadState {
    Running,
    /// Its duration or request count was reached.
    Done,
    /// Stopped by `StopLoad`.
    Stopped,
    /// Stopped by the agent's shutdown.
    Cancelled,
}

impl LoadState {
    pub fn as_str(self) -> &'static str {
        match self {
            LoadState::Running => "running",
            LoadState::Done => "done",
            LoadState::Stopped => "stopped",
            LoadState::Cancelled => "cancelled",
        }
    }
}

/// One injected load and its live counts.
#[derive(Debug)]
pub struct Load {
    pub id: Arc<str>,
    pub spec: LoadSpec,
    started: SystemTime,
    started_at: tokio::time::Instant,
    finished_at: Mutex<Option<tokio::time::Instant>>,
    state: Mutex<LoadState>,
    sent: AtomicU64,
    skipped: AtomicU64,
    in_flight: AtomicU64,
    by_outcome: Mutex<BTreeMap<&'static str, u64>>,
    /// Ends scheduling (child of the agent's stop).
    stop: CancellationToken,
    /// Cancels requests in flight (child of the agent's cancel).
    cancel: CancellationToken,
    /// Cancelled once every request of the load has finished.
    finished: CancellationToken,
    /// A profile load's scheduler and revisions.
    profile: Option<profile::ProfileState>,
}

impl Load {
    pub fn state(&self) -> LoadState {
        self.state.lock().map(|g| *g).unwrap_or(LoadState::Done)
    }

    /// Requests finished, by outcome.
    pub fn by_outcome(&self) -> BTreeMap<&'static str, u64> {
        self.by_outcome
            .lock()
            .map(|g| g.clone())
            .unwrap_or_default()
    }

    /// The `LoadStatus` message.
    pub fn to_proto(&self) -> proto::LoadStatus {
        let end = self
            .finished_at
            .lock()
            .ok()
            .and_then(|g| *g)
            .unwrap_or_else(tokio::time::Instant::now);
        proto::LoadStatus {
            id: self.id.to_string(),
            target: self.spec.target_name.clone(),
            state: self.state().as_str().to_owned(),
            rate_per_second: self.spec.rate_per_second,
            duration_s: self.spec.duration.as_secs_f64(),
            concurrency: self.spec.concurrency,
            max_requests: self.spec.max_requests,
            arrival: match (&self.spec.replay, self.spec.arrival) {
                (Some(_), _) => "trace",
                (None, Arrival::Poisson) => "poisson",
                (None, Arrival::Constant) => "constant",
            }
            .to_owned(),
            started_unix_s: self
                .started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            elapsed_s: end.saturating_duration_since(self.started_at).as_secs_f64(),
            sent: self.sent.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            by_outcome: self
                .by_outcome()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            trace: self
                .spec
                .replay
                .as_ref()
                .map(|r| r.name.clone())
                .unwrap_or_default(),
            trace_speedup: self.spec.replay.as_ref().map_or(0.0, |r| r.speedup),
            trace_peak_rate_per_second: self
                .spec
                .replay
                .as_ref()
                .map_or(0.0, |r| r.peak_rate_per_second),
            ..Default::default()
        }
        .with_profile(self, end.saturating_duration_since(self.started_at))
    }

    /// Sends request `seq` on its own task when a concurrency slot is free, else counts it
    /// skipped. A trace request gets synthetic text of about its input tokens (made on the
    /// request's task, distinct per `seed` and `seq`) and its output tokens as `max_tokens`.
    /// A profile load's request carries its `revision` (span, recent requests) and feeds its
    /// TPOT back to the scheduler.
    fn send(
        self: &Arc<Self>,
        s: &Sender,
        seq: u64,
        trace_request: Option<(TraceRequest, Option<String>)>,
        seed: u64,
        revision: Option<u32>,
    ) {
        let Ok(permit) = s.slots.clone().try_acquire_owned() else {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let (load, runner) = (self.clone(), s.runner.clone());
        let source = match revision {
            Some(r) => Source::Inject {
                load_id: self.id.clone(),
                profile_revision: Some(r),
            },
            None => s.source.clone(),
        };
        s.tracker.spawn(s.requests.track_future(async move {
            let summary = match trace_request {
                Some((r, calibrated)) => {
                    let prompt = calibrated.unwrap_or_else(|| {
                        crate::load::prompts::estimated(
                            r.input_tokens,
                            seed ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                        )
                    });
                    let shape = RequestShape {
                        prompt: &prompt,
                        input_tokens: r.input_tokens,
                        max_tokens: r.output_tokens,
                    };
                    runner
                        .measure_with(seq, &load.cancel, &source, Some(shape))
                        .await
                }
                None => runner.measure(seq, &load.cancel, &source).await,
            };
            if let Ok(mut g) = load.by_outcome.lock() {
                *g.entry(summary.outcome).or_default() += 1;
            }
            load.observe(&summary);
            load.in_flight.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        }));
    }

    fn set_state_if_running(&self, s: LoadState) {
        if let Ok(mut g) = self.state.lock()
            && *g == LoadState::Running
        {
            *g = s;
        }
    }

    /// The schedule: sends until the duration, the request count or a stop (a trace: until
    /// its last request or a stop); then waits for the requests in flight.
    async fn run(self: Arc<Self>, runner: TargetRunner, tracker: TaskTracker, seed: u64) {
        let spec = &self.spec;
        let sender = Sender {
            slots: Arc::new(Semaphore::new(spec.concurrency as usize)),
            requests: TaskTracker::new(),
            tracker,
            runner,
            source: Source::Inject {
                load_id: self.id.clone(),
                profile_revision: None,
            },
        };
        match &spec.replay {
            _ if self.profile.is_some() => self.run_profile(&sender, seed).await,
            Some(replay) => {
                // Prompts of exact lengths first (the schedule starts after them).
                let mut prompts =
                    calibrated_prompts(&sender.runner, &replay.requests, seed, &self.stop)
                        .await
                        .into_iter();
                let t0 = tokio::time::Instant::now();
                for (seq, r) in replay.requests.iter().enumerate() {
                    tokio::select! {
                        biased;
                        _ = self.stop.cancelled() => break,
                        _ = wait_until(t0 + r.at) => {}
                    }
                    self.send(
                        &sender,
                        seq as u64,
                        Some((*r, prompts.next().flatten())),
                        seed,
                        None,
                    );
                }
            }
            None => {
                let deadline = self.started_at + spec.duration;
                let schedule = Schedule::Rate {
                    per_second: spec.rate_per_second,
                    arrival: spec.arrival,
                };
                let mut ticker = Ticker::new(Gaps::new(schedule, seed), self.started_at);
                while self.sent.load(Ordering::Relaxed) < spec.max_requests {
                    let tick = tokio::select! {
                        biased;
                        _ = self.stop.cancelled() => break,
                        _ = tokio::time::sleep_until(deadline) => break,
                        t = ticker.tick() => t,
                    };
                    if tick.scheduled >= deadline {
                        break;
                    }
                    self.send(&sender, tick.seq, None, seed, None);
                }
            }
        }
        let requests = sender.requests;
        requests.close();
        requests.wait().await;
        if let Ok(mut g) = self.finished_at.lock() {
            *g = Some(tokio::time::Instant::now());
        }
        self.set_state_if_running(if self.stop.is_cancelled() {
            LoadState::Cancelled
        } else {
            LoadState::Done
        });
        tracing::info!(load = %self.id, target_name = %spec.target_name, state = self.state().as_str(), sent = self.sent.load(Ordering::Relaxed), skipped = self.skipped.load(Ordering::Relaxed), "Injected load finished.");
        self.finished.cancel();
    }
}

/// Prompts of each trace request's exact input length, calibrated with the server's
/// `/tokenize` as `lmperf run` does ([`crate::load::prompts::synthetic`]): for a chat target,
/// the whole request with the server's chat template applied (llama.cpp `/apply-template`,
/// vLLM/SGLang `/tokenize` with messages: [`crate::load::tokens::detect`]; the message
/// text alone when it offers none); all `None` (the estimate,
/// [`crate::load::prompts::estimated`], made per request) when the server has no `/tokenize`,
/// and the rest `None` once `stop` is cancelled.
async fn calibrated_prompts(
    runner: &TargetRunner,
    requests: &[TraceRequest],
    seed: u64,
    stop: &CancellationToken,
) -> Vec<Option<String>> {
    use crate::load::prompts::{TokenizeClient, Tokenizer, synthetic};
    let model = runner.target.model.clone().unwrap_or_default();
    let mut tok = TokenizeClient::detect(&runner.clients, &runner.target, &model).await;
    if runner.target.api == crate::config::Api::Chat && tok.kind != Tokenizer::Estimate {
        tok.chat = Some(crate::load::tokens::detect(&tok, None).await);
    }
    let mut out = Vec::with_capacity(requests.len());
    for (seq, r) in requests.iter().enumerate() {
        if tok.kind == Tokenizer::Estimate || stop.is_cancelled() {
            out.push(None);
            continue;
        }
        let s = seed ^ (seq as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        out.push(
            synthetic(&tok, 1, r.input_tokens, s)
                .await
                .pop()
                .map(|p| p.text),
        );
    }
    out
}

/// What [`Load::send`] needs: the concurrency slots, the load's own requests (waited for at
/// its end), the agent's tracker, the target, the span marking.
struct Sender {
    slots: Arc<Semaphore>,
    requests: TaskTracker,
    tracker: TaskTracker,
    runner: TargetRunner,
    source: Source,
}

/// Starts and stops injected loads; holds the running (or last) one.
#[derive(Debug)]
pub struct LoadManager {
    /// The agent's targets now (they join and leave at run time).
    runners: Arc<crate::live_list::LiveList<TargetRunner>>,
    caps: InjectCaps,
    shutdown: Shutdown,
    tracker: TaskTracker,
    current: Mutex<Option<Arc<Load>>>,
    next_id: AtomicU64,
}

/// How long `StopLoad` waits for the cancelled requests to be recorded.
const STOP_WAIT: Duration = Duration::from_secs(2);

impl LoadManager {
    /// Loads against `runners` (the agent's targets), bounded by `caps`, stopped by the
    /// agent's `shutdown`, their tasks on the agent's `tracker`.
    pub fn new(
        runners: Arc<crate::live_list::LiveList<TargetRunner>>,
        caps: InjectCaps,
        shutdown: Shutdown,
        tracker: TaskTracker,
    ) -> Self {
        Self {
            runners,
            caps,
            shutdown,
            tracker,
            current: Mutex::new(None),
            next_id: AtomicU64::new(1),
        }
    }

    pub fn caps(&self) -> InjectCaps {
        self.caps.clone()
    }

    /// The running load, else the last one.
    pub fn current(&self) -> Option<Arc<Load>> {
        self.current.lock().ok().and_then(|g| g.clone())
    }

    /// Validates `req` (a trace file is read on a blocking thread) and starts its load.
    ///
    /// # Errors
    /// [`Refusal`]: invalid or beyond a cap, another load running, shutting down.
    pub async fn start(&self, req: &proto::InjectLoadRequest) -> Result<Arc<Load>, Refusal> {
        let runners: Vec<TargetRunner> = self.runners.iter().map(|r| (*r).clone()).collect();
        let names: Vec<String> = runners.iter().map(|r| r.target.name.clone()).collect();
        let req: &proto::InjectLoadRequest = &profile::with_output_tokens(req, &runners);
        let spec = if req.trace_file.is_empty() {
            validate(
                req,
                &names.iter().map(String::as_str).collect::<Vec<_>>(),
                &self.caps,
            )?
        } else {
            let (req, caps, names) = (req.clone(), self.caps.clone(), names.clone());
            tokio::task::spawn_blocking(move || {
                validate(
                    &req,
                    &names.iter().map(String::as_str).collect::<Vec<_>>(),
                    &caps,
                )
            })
            .await
            .map_err(|_| Refusal::ShuttingDown)??
        };
        if self.shutdown.stop.is_cancelled() {
            return Err(Refusal::ShuttingDown);
        }
        let mut current = self.current.lock().map_err(|_| Refusal::ShuttingDown)?;
        if let Some(l) = current.as_ref().filter(|l| l.state() == LoadState::Running) {
            return Err(Refusal::Busy(l.id.to_string()));
        }
        let id: Arc<str> = format!("load-{}", self.next_id.fetch_add(1, Ordering::Relaxed)).into();
        let Some(runner) = runners.get(spec.target).cloned() else {
            return Err(Refusal::UnknownTarget {
                name: spec.target_name.clone(),
                known: names.join(", "),
            });
        };
        let seed: u64 = rand::random();
        let profile = spec
            .profile
            .as_ref()
            .map(|p| profile::ProfileState::new(p, seed, &self.caps));
        let load = Arc::new(Load {
            id,
            spec,
            started: SystemTime::now(),
            started_at: tokio::time::Instant::now(),
            finished_at: Mutex::new(None),
            state: Mutex::new(LoadState::Running),
            sent: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            by_outcome: Mutex::default(),
            stop: self.shutdown.stop.child_token(),
            cancel: self.shutdown.cancel.child_token(),
            finished: CancellationToken::new(),
            profile,
        });
        tracing::info!(load = %load.id, target_name = %load.spec.target_name, trace = load.spec.replay.as_ref().map_or("-", |r| r.name.as_str()), rate = load.spec.rate_per_second, duration = ?load.spec.duration, concurrency = load.spec.concurrency, max_requests = load.spec.max_requests, "Injected load started.");
        self.tracker
            .spawn(load.clone().run(runner, self.tracker.clone(), seed));
        *current = Some(load.clone());
        Ok(load)
    }

    /// Stops the running load (`id` empty: whichever runs): no new sends, requests in flight
    /// cancelled (recorded `cancelled`). Waits up to 2 s for them to be recorded.
    ///
    /// # Errors
    /// [`Refusal::NoneRunning`], or [`Refusal::UnknownLoad`] when `id` is not the running one.
    pub async fn stop(&self, id: &str) -> Result<Arc<Load>, Refusal> {
        let load = self
            .current()
            .filter(|l| l.state() == LoadState::Running)
            .ok_or(Refusal::NoneRunning)?;
        if !id.is_empty() && *load.id != *id {
            return Err(Refusal::UnknownLoad(id.to_owned()));
        }
        load.set_state_if_running(LoadState::Stopped);
        load.stop.cancel();
        load.cancel.cancel();
        let _ = tokio::time::timeout(STOP_WAIT, load.finished.cancelled()).await;
        Ok(load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(rate: f64, secs: f64) -> proto::InjectLoadRequest {
        proto::InjectLoadRequest {
            rate_per_second: rate,
            duration_s: secs,
            ..Default::default()
        }
    }

    #[test]
    fn caps_refuse_naming_field_value_and_cap() {
        let caps = InjectCaps {
            max_rate_per_second: 10.0,
            max_duration: Duration::from_secs(60),
            max_concurrency: 4,
            max_requests: 100,
            trace_dir: None,
        };
        let t = ["a", "b"];
        let mut r = req(11.0, 5.0);
        r.target = "a".into();
        assert_eq!(
            validate(&r, &t, &caps).unwrap_err().to_string(),
            "rate_per_second = 11: above the cap of 10 (control.max_inject_rate)"
        );
        r.rate_per_second = 5.0;
        r.duration_s = 61.0;
        assert_eq!(
            validate(&r, &t, &caps).unwrap_err().to_string(),
            "duration_s = 61: above the cap of 60 (control.max_inject_duration)"
        );
        r.duration_s = 30.0;
        r.concurrency = 5;
        assert_eq!(
            validate(&r, &t, &caps).unwrap_err().to_string(),
            "concurrency = 5: above the cap of 4 (control.max_inject_concurrency)"
        );
        r.concurrency = 0;
        // 5/s × 30 s = 150 requests > 100.
        assert_eq!(
            validate(&r, &t, &caps).unwrap_err().to_string(),
            "rate_per_second × duration_s = 150: above the cap of 100 (control.max_inject_requests)"
        );
        r.max_requests = 100;
        let spec = validate(&r, &t, &caps).unwrap();
        assert_eq!(
            (
                spec.target,
                spec.concurrency,
                spec.max_requests,
                spec.arrival
            ),
            (0, 1, 100, Arrival::Poisson)
        );
        r.max_requests = 101;
        assert!(matches!(
            validate(&r, &t, &caps),
            Err(Refusal::AboveCap {
                field: "max_requests",
                ..
            })
        ));
    }

    #[test]
    fn targets_values_and_trace_files() {
        let caps = InjectCaps::default();
        let one = ["only"];
        assert_eq!(
            validate(&req(1.0, 1.0), &one, &caps).unwrap().target_name,
            "only"
        );
        assert!(matches!(
            validate(&req(1.0, 1.0), &["a", "b"], &caps),
            Err(Refusal::Invalid {
                field: "target",
                ..
            })
        ));
        let mut r = req(1.0, 1.0);
        r.target = "c".into();
        assert_eq!(
            validate(&r, &["a", "b"], &caps).unwrap_err().to_string(),
            "target = \"c\": not a configured target (a, b)"
        );
        for (rate, secs, field) in [
            (0.0, 1.0, "rate_per_second"),
            (f64::NAN, 1.0, "rate_per_second"),
            (1.0, -1.0, "duration_s"),
        ] {
            assert!(
                matches!(validate(&req(rate, secs), &one, &caps), Err(Refusal::Invalid { field: f, .. }) if f == field)
            );
        }
        let mut r = req(1.0, 1.0);
        r.arrival = "gamma".into();
        assert!(matches!(
            validate(&r, &one, &caps),
            Err(Refusal::Invalid {
                field: "arrival",
                ..
            })
        ));
    }

    fn fixture(name: &str) -> String {
        format!(
            "{}/../tests/fixtures/traces/{name}",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    fn with_traces(caps: InjectCaps) -> InjectCaps {
        InjectCaps {
            trace_dir: Some(
                format!("{}/../tests/fixtures/traces", env!("CARGO_MANIFEST_DIR")).into(),
            ),
            ..caps
        }
    }

    fn trace_req(file: &str, speedup: f64, max_requests: u64) -> proto::InjectLoadRequest {
        proto::InjectLoadRequest {
            trace_file: fixture(file),
            trace_speedup: speedup,
            max_requests,
            ..Default::default()
        }
    }

    #[test]
    fn a_trace_is_read_and_scaled_and_ignores_rate_and_duration() {
        let caps = with_traces(InjectCaps {
            max_rate_per_second: 10.0,
            max_duration: Duration::from_secs(60),
            max_concurrency: 4,
            max_requests: 100,
            trace_dir: None,
        });
        // Azure code sample, first 10 rows: 0 … 1.2993 s apart from the first; 7 in the busiest second.
        let mut r = trace_req("azure_llm_2023_code.head2000.csv", 0.0, 10);
        r.rate_per_second = 1e9;
        r.duration_s = -1.0;
        let spec = validate(&r, &["t"], &caps).unwrap();
        let replay = spec.replay.as_ref().unwrap();
        assert_eq!(
            (
                replay.name.as_str(),
                replay.speedup,
                replay.requests.len(),
                spec.max_requests
            ),
            ("azure_llm_2023_code.head2000.csv", 1.0, 10, 10)
        );
        assert_eq!(
            replay.requests[1],
            TraceRequest {
                at: Duration::from_millis(52),
                input_tokens: 3180,
                output_tokens: 8
            }
        );
        assert_eq!(spec.duration, Duration::from_nanos(1_299_337_000));
        assert!(
            (spec.rate_per_second - 9.0 / 1.299337).abs() < 1e-9,
            "{}",
            spec.rate_per_second
        );
        assert_eq!(replay.peak_rate_per_second, 7.0);
        assert_eq!(
            spec.concurrency, 4,
            "no concurrency given: the cap, so the trace decides"
        );
        let mut one = trace_req("azure_llm_2023_code.head2000.csv", 0.0, 10);
        one.concurrency = 1;
        assert_eq!(validate(&one, &["t"], &caps).unwrap().concurrency, 1);
        let fast = validate(
            &trace_req("azure_llm_2023_code.head2000.csv", 4.0, 10),
            &["t"],
            &caps,
        )
        .unwrap();
        assert_eq!(fast.duration, Duration::from_nanos(1_299_337_000 / 4));
        assert_eq!(
            fast.replay.unwrap().requests[1].at,
            Duration::from_millis(13)
        );
        // The whole trace when max_requests is 0.
        let b = validate(&trace_req("burstgpt_1.head3.csv", 2.0, 0), &["t"], &caps).unwrap();
        assert_eq!(
            (
                b.max_requests,
                b.duration,
                b.replay.unwrap().peak_rate_per_second
            ),
            (3, Duration::from_millis(56_500), 1.0)
        );
    }

    #[test]
    fn a_trace_cannot_bypass_a_cap() {
        let caps = with_traces(InjectCaps {
            max_rate_per_second: 10.0,
            max_duration: Duration::from_secs(60),
            max_concurrency: 4,
            max_requests: 100,
            trace_dir: None,
        });
        let err = |r: &proto::InjectLoadRequest| {
            let e = validate(r, &["t"], &caps).unwrap_err();
            (tonic::Status::from(e.clone()).code(), e.to_string())
        };
        let file = fixture("burstgpt_1.head3.csv");
        // 5 s, 45 s, 118 s: 113 s > 60 s at speedup 1.
        assert_eq!(
            err(&trace_req("burstgpt_1.head3.csv", 1.0, 0)),
            (
                tonic::Code::InvalidArgument,
                format!(
                    "trace_file = {file:?}: replay duration_s = 113 at trace_speedup 1: above the cap of 60 (control.max_inject_duration)"
                )
            )
        );
        // 15 requests at 0 ms, 5 at 3052 ms.
        let file = fixture("mooncake_arxiv_trace.head20.jsonl");
        assert_eq!(
            err(&trace_req("mooncake_arxiv_trace.head20.jsonl", 1.0, 0)).1,
            format!(
                "trace_file = {file:?}: peak rate_per_second = 15 (sends in 1 s at trace_speedup 1): above the cap of 10 (control.max_inject_rate)"
            )
        );
        // A rate cap below 1/s counts sends per 1/cap s: 3 sends 40 s and 73 s apart fit 1 per 30 s.
        let slow = InjectCaps {
            max_rate_per_second: 1.0 / 30.0,
            max_duration: Duration::from_secs(600),
            ..caps.clone()
        };
        assert!(validate(&trace_req("burstgpt_1.head3.csv", 1.0, 0), &["t"], &slow).is_ok());
        assert!(
            validate(&trace_req("burstgpt_1.head3.csv", 2.0, 0), &["t"], &slow).is_err(),
            "40 s → 20 s apart: 2 in 30 s"
        );
        let file = fixture("azure_llm_2023_code.head2000.csv");
        assert_eq!(
            err(&trace_req("azure_llm_2023_code.head2000.csv", 100.0, 0)).1,
            format!(
                "trace_file = {file:?}: requests = 101 or more (give max_requests): above the cap of 100 (control.max_inject_requests)"
            )
        );
        assert!(matches!(
            validate(
                &trace_req("azure_llm_2023_code.head2000.csv", 1.0, 101),
                &["t"],
                &caps
            ),
            Err(Refusal::AboveCap {
                field: "max_requests",
                ..
            })
        ));
        let mut r = trace_req("azure_llm_2023_code.head2000.csv", 1.0, 10);
        r.concurrency = 5;
        assert!(matches!(
            validate(&r, &["t"], &caps),
            Err(Refusal::AboveCap {
                field: "concurrency",
                ..
            })
        ));
    }

    #[test]
    fn a_trace_is_streamed_to_its_row_limit_within_a_byte_cap() {
        let dir = std::env::temp_dir().join(format!("lmperf-inject-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // 5 good rows, then a row that does not parse: never read with max_requests 5.
        let mut text = String::new();
        for i in 0..5 {
            text.push_str(&format!(
                "{{\"timestamp\": {}, \"input_length\": 9, \"output_length\": 4}}\n",
                i * 500
            ));
        }
        text.push_str("{broken\n");
        let path = dir.join("stream.jsonl");
        std::fs::write(&path, &text).unwrap();
        let caps = InjectCaps {
            max_rate_per_second: 10.0,
            max_duration: Duration::from_secs(60),
            max_concurrency: 4,
            max_requests: 100,
            trace_dir: Some(dir.clone()),
        };
        let r = |n| proto::InjectLoadRequest {
            trace_file: path.display().to_string(),
            max_requests: n,
            ..Default::default()
        };
        assert_eq!(validate(&r(5), &["t"], &caps).unwrap().max_requests, 5);
        let e = validate(&r(6), &["t"], &caps).unwrap_err().to_string();
        assert!(e.contains("line 6"), "{e}");
        // A file whose rows need more than the byte cap is refused, naming the cap.
        let long = dir.join("long.jsonl");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&long).unwrap());
        let pad = "x".repeat(8 << 20);
        for i in 0..=(MAX_TRACE_BYTES >> 23) {
            use std::io::Write as _;
            writeln!(f, "{{\"timestamp\": {i}, \"input_length\": 9, \"output_length\": 4, \"pad\": \"{pad}\"}}").unwrap();
        }
        drop(f);
        let e = validate(
            &proto::InjectLoadRequest {
                trace_file: long.display().to_string(),
                ..Default::default()
            },
            &["t"],
            &caps,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(&format!("more than {MAX_TRACE_BYTES} bytes")),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_bad_trace_names_the_field_and_the_parsers_message() {
        // No trace_dir: no replay at all.
        let r = trace_req("burstgpt_1.head3.csv", 1.0, 0);
        let e = validate(&r, &["t"], &InjectCaps::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with(
                "trace replay is off: set control.trace_dir to the directory of replayable traces"
            ),
            "{e}"
        );
        let caps = with_traces(InjectCaps::default());
        let dir = caps.trace_dir.clone().unwrap();
        let outside = format!(
            "not a readable file under control.trace_dir ({})",
            dir.display()
        );
        let mut r = trace_req("no-such-trace.csv", 1.0, 0);
        let missing = r.trace_file.clone();
        assert_eq!(
            validate(&r, &["t"], &caps).unwrap_err().to_string(),
            format!("trace_file = {missing:?}: {outside}")
        );
        // Outside the directory, also through `..`, is refused without reading the file.
        for f in [
            "/etc/passwd".to_owned(),
            fixture("../cases/README.md"),
            fixture("../../Cargo.toml"),
        ] {
            r.trace_file = f.clone();
            assert_eq!(
                validate(&r, &["t"], &caps).unwrap_err().to_string(),
                format!("trace_file = {f:?}: {outside}")
            );
        }
        r.trace_file = fixture("awesome_chatgpt_prompts.csv");
        let e = validate(&r, &["t"], &caps).unwrap_err().to_string();
        assert!(
            e.starts_with("trace_file = ") && e.contains("line 1: unknown trace format"),
            "{e}"
        );
        for (speedup, format, field) in [
            (-1.0, "", "trace_speedup"),
            (f64::NAN, "", "trace_speedup"),
            (1.0, "sharegpt", "trace_format"),
        ] {
            let mut r = trace_req("burstgpt_1.head3.csv", speedup, 0);
            r.trace_format = format.into();
            assert!(
                matches!(validate(&r, &["t"], &caps), Err(Refusal::Invalid { field: f, .. }) if f == field),
                "{field}"
            );
        }
        let mut r = trace_req("burstgpt_1.head3.csv", 1.0, 0);
        r.trace_format = "mooncake".into();
        let e = validate(&r, &["t"], &caps).unwrap_err().to_string();
        assert!(e.contains("line 1: not JSON"), "{e}");
    }

    #[test]
    fn peak_counts_sends_in_a_half_open_window() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        let w = Duration::from_secs(1);
        assert_eq!(peak_count(ms(&[]).into_iter(), w), 0);
        assert_eq!(peak_count(ms(&[0, 0, 0]).into_iter(), w), 3);
        assert_eq!(
            peak_count(ms(&[0, 999, 1000, 1001, 2001]).into_iter(), w),
            3
        );
        assert_eq!(peak_count(ms(&[0, 1000, 2000]).into_iter(), w), 1);
    }
}
