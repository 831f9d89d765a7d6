//! Injected load profiles (`lmperf ctl inject --profile FILE`, `lmperf ctl update-load`): the
//! agent follows [`crate::load::profile`]'s scheduler, the same one `lmperf run --profile`
//! uses, against one target.
//!
//! The client sends the profile as text (the agent reads no file for it). Arrivals come from
//! `token_rate` (required) ÷ the output tokens asked per request; each request gets synthetic
//! text of about its `prompt_length` (default [`DEFAULT_INPUT_TOKENS`]; the estimate of
//! [`crate::load::prompts::estimated`]); the concurrency limit is the profile's at the time
//! of the send, at most the load's `concurrency`, and a send due while that many run is
//! skipped and counted, as for a rate. `UpdateLoad` swaps the profile in the scheduler from
//! its next scheduling step (a changed dimension restarts at the update; requests in flight go
//! on) and records when each revision took effect; every request carries the revision it was
//! sent under (span `lmperf.profile.revision`, recent requests `profile_revision`).
//!
//! Caps: the profile's request rate (bursty: its on rate) is checked against
//! `control.max_inject_rate` at start and at each update, and an adaptive rate is raised no
//! further than it ([`Scheduler::with_max_request_rate`]).

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Load, LoadManager, LoadSpec, LoadState, Refusal, Sender, concurrency_within};
use crate::canary::TargetRunner;
use crate::canary::schedule::wait_until;
use crate::config::{Arrival, InjectCaps};
use crate::control::proto;
use crate::load::profile::{self as bench_profile, Profile, TokenRate, scheduler::Scheduler};
use crate::load::trace::TraceRequest;

/// Prompt length of a profile without `prompt_length`, in tokens (as `lmperf run`'s default).
pub const DEFAULT_INPUT_TOKENS: u32 = 128;
/// Largest profile text accepted.
pub const MAX_PROFILE_BYTES: usize = 64 << 10;

/// A validated profile load.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileSpec {
    pub profile: Profile,
    /// The file name the client gave (errors and the status name it).
    pub file: String,
    /// `max_tokens` of each request; the token rate ÷ this is the request rate.
    pub output_tokens: u32,
}

/// A running profile load's scheduler, revisions and update signal.
#[derive(Debug)]
pub struct ProfileState {
    sched: Mutex<Scheduler>,
    /// `(seconds from the load's start, revision, file name)`, the first at 0.
    revisions: Mutex<Vec<(f64, u32, String)>>,
    /// What the schedule's arrivals show of the running token rate.
    pace: Mutex<Pace>,
    /// Wakes the schedule waiting for its next arrival: re-plan with the new profile.
    updated: Notify,
}

impl ProfileState {
    pub fn new(spec: &ProfileSpec, seed: u64, caps: &InjectCaps) -> Self {
        let sched = Scheduler::new(spec.profile.clone(), spec.output_tokens, seed)
            .with_max_request_rate(caps.max_rate_per_second);
        Self {
            sched: Mutex::new(sched),
            revisions: Mutex::new(vec![(0.0, 0, spec.file.clone())]),
            pace: Mutex::new(Pace::default()),
            updated: Notify::new(),
        }
    }

    /// The concurrency limit at `elapsed`: the profile's, within 1 ..= `cap` (`None`: the
    /// profile has no concurrency dimension).
    fn concurrency_at(&self, elapsed: Duration, cap: usize) -> Option<usize> {
        let s = self.sched.lock().ok()?;
        s.concurrency_at(elapsed).map(|c| c.clamp(1, cap.max(1)))
    }
}

/// The running token rate as the schedule shows it: since when it runs (seconds from the
/// load's start; bursty phases count from there) and the gap between the last two arrivals
/// planned under it (adaptive: 1 ÷ its current level's request rate).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Pace {
    rate_epoch_s: f64,
    last_at_s: Option<f64>,
    last_gap_s: Option<f64>,
    /// The shortest gap planned under it (adaptive: 1 ÷ the highest level offered).
    min_gap_s: Option<f64>,
}

impl Pace {
    /// Records an arrival planned at `at_s`.
    fn planned(&mut self, at_s: f64) {
        if let Some(prev) = self.last_at_s.filter(|p| at_s > *p) {
            self.last_gap_s = Some(at_s - prev);
            self.min_gap_s = Some(self.min_gap_s.map_or(at_s - prev, |m| m.min(at_s - prev)));
        }
        self.last_at_s = Some(at_s);
    }
}

/// The request rate `profile` asks at `t_s` seconds from the load's start (`None` without
/// `token_rate`), requests asking `output_tokens` each: `constant` its target's (the mean of
/// its jitter); `bursty` twice it in on periods (from `pace.rate_epoch_s`, `period` each) and 0
/// in off periods; `adaptive` 1 ÷ the last planned gap (its current level), its target before
/// two arrivals. Mirrors [`Scheduler`]'s rule (`crate::load::profile::scheduler`).
fn request_rate_now(profile: &Profile, output_tokens: u32, t_s: f64, pace: &Pace) -> Option<f64> {
    let per_request = f64::from(output_tokens.max(1));
    Some(match profile.token_rate? {
        TokenRate::Constant { target, .. } => target / per_request,
        TokenRate::Bursty { target, period } => {
            let phase = ((t_s - pace.rate_epoch_s).max(0.0) / period.as_secs_f64()).floor() as u64;
            if phase.is_multiple_of(2) {
                2.0 * target / per_request
            } else {
                0.0
            }
        }
        TokenRate::Adaptive { target, .. } => pace
            .last_gap_s
            .filter(|g| *g > 0.0)
            .map_or(target / per_request, |g| 1.0 / g),
    })
}

/// The highest request rate an adaptive token rate offered so far (1 ÷ the shortest planned
/// gap), at least its starting target; `None` for other token rates.
fn adaptive_peak(profile: &Profile, output_tokens: u32, pace: &Pace) -> Option<f64> {
    let TokenRate::Adaptive { target, .. } = profile.token_rate? else {
        return None;
    };
    let start = target / f64::from(output_tokens.max(1));
    Some(
        pace.min_gap_s
            .filter(|g| *g > 0.0)
            .map_or(start, |g| (1.0 / g).max(start)),
    )
}

/// `req` with `output_tokens` filled from its target's `canary.max_tokens` when it is a
/// profile load that left it 0 (the target as [`super::validate`] resolves it).
pub fn with_output_tokens<'a>(
    req: &'a proto::InjectLoadRequest,
    runners: &[TargetRunner],
) -> Cow<'a, proto::InjectLoadRequest> {
    if req.profile_yaml.is_empty() || req.output_tokens > 0 {
        return Cow::Borrowed(req);
    }
    let runner = match (req.target.as_str(), runners) {
        ("", [only]) => Some(only),
        (name, _) => runners.iter().find(|r| r.target.name == name),
    };
    match runner {
        Some(r) => Cow::Owned(proto::InjectLoadRequest {
            output_tokens: r.target.max_tokens,
            ..req.clone()
        }),
        None => Cow::Borrowed(req),
    }
}

fn file_name(file: &str) -> &str {
    if file.is_empty() { "profile" } else { file }
}

/// Parses a profile's text and checks it against the rate cap.
fn parse_checked(
    file: &str,
    text: &str,
    output_tokens: u32,
    caps: &InjectCaps,
) -> Result<Profile, Refusal> {
    if text.len() > MAX_PROFILE_BYTES {
        return Err(Refusal::Invalid {
            field: "profile_yaml",
            value: format!("{} bytes", text.len()),
            reason: format!("at most {MAX_PROFILE_BYTES} bytes"),
        });
    }
    let profile = bench_profile::parse(file, text).map_err(|e| Refusal::Profile(e.to_string()))?;
    let Some(rate) = Scheduler::peak_request_rate(&profile, output_tokens) else {
        return Err(Refusal::Invalid {
            field: "profile_yaml",
            value: format!("{file:?}"),
            reason: "no token_rate: an injected profile needs it for its arrivals".into(),
        });
    };
    if rate > caps.max_rate_per_second {
        return Err(Refusal::AboveCap {
            field: "token_rate ÷ output_tokens",
            value: format!("{rate} requests/s ({file})"),
            cap: caps.max_rate_per_second.to_string(),
            key: "control.max_inject_rate",
        });
    }
    Ok(profile)
}

/// [`super::validate`] for a profile load: the profile, `duration_s`, `concurrency`
/// (default: the cap), `max_requests` (default: the cap), `output_tokens` (> 0).
pub fn validate(
    req: &proto::InjectLoadRequest,
    target: usize,
    target_name: &str,
    caps: &InjectCaps,
) -> Result<LoadSpec, Refusal> {
    let invalid = |field, value: String, reason: &str| Refusal::Invalid {
        field,
        value,
        reason: reason.to_owned(),
    };
    if !req.trace_file.is_empty() {
        return Err(invalid(
            "trace_file",
            format!("{:?}", req.trace_file),
            "a load is a profile or a trace, not both",
        ));
    }
    if req.output_tokens == 0 {
        return Err(invalid(
            "output_tokens",
            "0".into(),
            "tokens asked per request, above 0",
        ));
    }
    let file = file_name(&req.profile_file);
    let profile = parse_checked(file, &req.profile_yaml, req.output_tokens, caps)?;
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
    let concurrency = if req.concurrency == 0 {
        caps.max_concurrency
    } else {
        concurrency_within(req, caps)?
    };
    if req.max_requests > caps.max_requests {
        return Err(Refusal::AboveCap {
            field: "max_requests",
            value: req.max_requests.to_string(),
            cap: caps.max_requests.to_string(),
            key: "control.max_inject_requests",
        });
    }
    let max_requests = if req.max_requests == 0 {
        caps.max_requests
    } else {
        req.max_requests
    };
    Ok(LoadSpec {
        target,
        target_name: target_name.to_owned(),
        rate_per_second: Scheduler::peak_request_rate(&profile, req.output_tokens).unwrap_or(0.0),
        duration: Duration::from_secs_f64(secs),
        concurrency,
        max_requests,
        arrival: Arrival::Constant,
        replay: None,
        profile: Some(ProfileSpec {
            profile,
            file: file.to_owned(),
            output_tokens: req.output_tokens,
        }),
    })
}

impl proto::LoadStatus {
    /// Adds a profile load's fields (name, file, revisions, sustained rate, and what it does
    /// `elapsed` from its start: concurrency limit, request and token rate).
    pub(super) fn with_profile(mut self, load: &Load, elapsed: Duration) -> Self {
        let (Some(state), Some(spec)) = (&load.profile, &load.spec.profile) else {
            return self;
        };
        self.arrival = "profile".into();
        self.profile.clone_from(&spec.profile.name);
        self.profile_file.clone_from(&spec.file);
        let pace = state.pace.lock().map(|p| *p).unwrap_or_default();
        if let Ok(s) = state.sched.lock() {
            self.profile_revision = s.revision();
            self.sustained_token_rate = s.sustained_token_rate();
            self.profile.clone_from(&s.profile().name);
            // The running revision's request rate (its start, or its on rate when bursty).
            if let Some(r) = Scheduler::peak_request_rate(s.profile(), spec.output_tokens) {
                self.rate_per_second = r;
            }
            // Adaptive: the highest level it offered, not where it started.
            if let Some(r) = adaptive_peak(s.profile(), spec.output_tokens, &pace) {
                self.rate_per_second = r;
            }
            self.profile_rate_per_second_now = request_rate_now(
                s.profile(),
                spec.output_tokens,
                elapsed.as_secs_f64(),
                &pace,
            );
            self.profile_token_rate_now = self
                .profile_rate_per_second_now
                .map(|r| r * f64::from(spec.output_tokens.max(1)));
        }
        self.profile_concurrency_now = state
            .concurrency_at(elapsed, self.concurrency as usize)
            .map(|c| c as u32);
        self.profile_revisions = state
            .revisions
            .lock()
            .map(|r| {
                r.iter()
                    .map(|(at_s, revision, file)| proto::ProfileRevision {
                        revision: *revision,
                        at_s: *at_s,
                        file: file.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        if let Some(last) = self.profile_revisions.last() {
            self.profile_file.clone_from(&last.file);
        }
        self
    }
}

impl Load {
    /// Feeds a finished request's TPOT to a profile load's scheduler (`adaptive`).
    pub(super) fn observe(&self, summary: &crate::status::RequestSummary) {
        if let (Some(state), Some(tpot)) = (&self.profile, summary.tpot_ms)
            && let Ok(mut s) = state.sched.lock()
        {
            s.observe_tpot(tpot);
        }
    }

    /// A profile load's schedule: the scheduler's next arrival, re-planned when an update
    /// arrives while it waits; until the duration, the request count or a stop.
    pub(super) async fn run_profile(self: &Arc<Self>, sender: &Sender, seed: u64) {
        let (Some(state), Some(spec)) = (&self.profile, &self.spec.profile) else {
            return;
        };
        let t0 = self.started_at;
        let deadline = t0 + self.spec.duration;
        let cap = self.spec.concurrency as usize;
        let mut seq = 0u64;
        while self.sent.load(Ordering::Relaxed) < self.spec.max_requests {
            let Some(planned) = state.sched.lock().ok().and_then(|mut s| s.plan_next()) else {
                break;
            };
            if let Ok(mut p) = state.pace.lock() {
                p.planned(planned.at.as_secs_f64());
            }
            let due = t0 + planned.at;
            if due >= deadline {
                break;
            }
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => break,
                () = state.updated.notified() => {
                    // Planned again under the updated profile.
                    if let Ok(mut s) = state.sched.lock() {
                        s.unplan(planned);
                    }
                    continue;
                }
                _ = wait_until(due) => {}
            }
            let limit = state.concurrency_at(t0.elapsed(), cap).unwrap_or(cap);
            if self.in_flight.load(Ordering::Relaxed) >= limit as u64 {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut s) = state.sched.lock() {
                    s.observe_skipped();
                }
                continue;
            }
            let request = TraceRequest {
                at: planned.at,
                input_tokens: planned.input_tokens.unwrap_or(DEFAULT_INPUT_TOKENS).max(1),
                output_tokens: spec.output_tokens,
            };
            self.send(
                sender,
                seq,
                Some((request, None)),
                seed,
                Some(planned.revision),
            );
            seq += 1;
        }
    }
}

impl LoadManager {
    /// `UpdateLoad`: applies `req`'s profile to the running profile load from its next
    /// scheduling step; returns the load and the revision now running (unchanged when the
    /// profile is the same).
    ///
    /// # Errors
    /// [`Refusal`]: no load running (or not `req.id`), not a profile load, a bad profile or
    /// one beyond the rate cap (the running revision is kept).
    pub fn update(&self, req: &proto::UpdateLoadRequest) -> Result<(Arc<Load>, u32), Refusal> {
        let load = self
            .current()
            .filter(|l| l.state() == LoadState::Running)
            .ok_or(Refusal::NoneRunning)?;
        if !req.id.is_empty() && *load.id != *req.id {
            return Err(Refusal::UnknownLoad(req.id.clone()));
        }
        let (Some(state), Some(spec)) = (&load.profile, &load.spec.profile) else {
            return Err(Refusal::NotAProfile(load.id.to_string()));
        };
        let file = file_name(&req.profile_file);
        let profile = parse_checked(file, &req.profile_yaml, spec.output_tokens, &self.caps)?;
        let elapsed = load.started_at.elapsed();
        let revision = {
            let mut s = state.sched.lock().map_err(|_| Refusal::ShuttingDown)?;
            if *s.profile() == profile {
                return Ok((load.clone(), s.revision()));
            }
            if s.profile().token_rate != profile.token_rate
                && let Ok(mut p) = state.pace.lock()
            {
                *p = Pace {
                    rate_epoch_s: elapsed.as_secs_f64(),
                    ..Pace::default()
                };
            }
            s.update(profile, elapsed)
        };
        if let Ok(mut r) = state.revisions.lock() {
            r.push((elapsed.as_secs_f64(), revision, file.to_owned()));
        }
        state.updated.notify_one();
        tracing::info!(load = %load.id, revision, file, at_s = elapsed.as_secs_f64(), "Injected load profile updated.");
        Ok((load, revision))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> InjectCaps {
        InjectCaps {
            max_rate_per_second: 10.0,
            max_duration: Duration::from_secs(60),
            max_concurrency: 4,
            max_requests: 100,
            trace_dir: None,
        }
    }

    fn req(yaml: &str) -> proto::InjectLoadRequest {
        proto::InjectLoadRequest {
            profile_yaml: yaml.into(),
            profile_file: "load.yaml".into(),
            duration_s: 5.0,
            output_tokens: 8,
            ..Default::default()
        }
    }

    /// A running profile load of `yaml` (8 output tokens per request, the caps of [`caps`]) in
    /// a manager, as `LoadManager::start` makes it, without a target to send to.
    fn running(yaml: &str) -> (LoadManager, Arc<Load>) {
        let spec = validate(&req(yaml), 0, "t", &caps()).unwrap();
        let profile = Some(ProfileState::new(
            spec.profile.as_ref().unwrap(),
            7,
            &caps(),
        ));
        let load = Arc::new(Load {
            id: "load-1".into(),
            spec,
            started: std::time::SystemTime::now(),
            started_at: tokio::time::Instant::now(),
            finished_at: Mutex::new(None),
            state: Mutex::new(LoadState::Running),
            sent: Default::default(),
            skipped: Default::default(),
            in_flight: Default::default(),
            by_outcome: Mutex::default(),
            stop: tokio_util::sync::CancellationToken::new(),
            cancel: tokio_util::sync::CancellationToken::new(),
            finished: tokio_util::sync::CancellationToken::new(),
            profile,
        });
        let shutdown = crate::canary::Shutdown {
            stop: Default::default(),
            cancel: Default::default(),
        };
        let m = LoadManager::new(
            Default::default(),
            caps(),
            shutdown,
            tokio_util::task::TaskTracker::new(),
        );
        *m.current.lock().unwrap() = Some(load.clone());
        (m, load)
    }

    #[test]
    fn the_status_shows_the_running_revision_and_what_it_does_now() {
        // Concurrency 2, 4, 6, … per second (cap 4); bursty 40 tokens/s ÷ 8: 10 req/s on, 0 off.
        let yaml = "profile: first\nconcurrency: {ramp: linear, base: 2, step: 1s, max: 8}\ntoken_rate: {mode: bursty, target: 40/s, period: 1s}\n";
        let (m, load) = running(yaml);
        let at = |ms: u64| {
            load.to_proto()
                .with_profile(&load, Duration::from_millis(ms))
        };
        // Which profile runs, and what it does now.
        let which = |s: &proto::LoadStatus| {
            (
                s.profile.clone(),
                s.profile_file.clone(),
                s.profile_revision,
            )
        };
        let now = |s: &proto::LoadStatus| {
            (
                s.profile_concurrency_now,
                s.profile_rate_per_second_now,
                s.profile_token_rate_now,
            )
        };
        let s = at(500);
        assert_eq!(which(&s), ("first".into(), "load.yaml".into(), 0));
        assert_eq!(now(&s), (Some(2), Some(10.0), Some(80.0)));
        let s = at(1500);
        assert_eq!(now(&s), (Some(4), Some(0.0), Some(0.0)));
        assert_eq!(
            at(3500).profile_concurrency_now,
            Some(4),
            "the load's cap of 4, not the profile's 8"
        );
        assert_eq!(s.concurrency, 4, "the cap stays in `concurrency`");
        // An update from another file: its name, its file, its dimensions; no concurrency
        // dimension: none shown (the cap applies); constant 24 tokens/s = 3 req/s.
        let (_, revision) = m
            .update(&proto::UpdateLoadRequest {
                id: String::new(),
                profile_yaml: "profile: second\ntoken_rate: {mode: constant, target: 24/s}\n"
                    .into(),
                profile_file: "other.yaml".into(),
            })
            .unwrap();
        assert_eq!(revision, 1);
        let s = at(1500);
        assert_eq!(which(&s), ("second".into(), "other.yaml".into(), 1));
        assert_eq!(
            s.profile_revisions
                .iter()
                .map(|r| r.file.as_str())
                .collect::<Vec<_>>(),
            ["load.yaml", "other.yaml"]
        );
        assert_eq!(now(&s), (None, Some(3.0), Some(24.0)));
    }

    #[test]
    fn the_rate_now_follows_bursty_phases_from_the_update_and_adaptive_levels() {
        let p = |yaml: &str| bench_profile::parse("p.yaml", yaml).unwrap();
        let bursty = p("token_rate: {mode: bursty, target: 40/s, period: 2s}\n");
        // Bursty phases count from when its token rate took effect (an update at 3 s).
        let pace = Pace {
            rate_epoch_s: 3.0,
            ..Pace::default()
        };
        assert_eq!(request_rate_now(&bursty, 8, 4.9, &pace), Some(10.0));
        assert_eq!(request_rate_now(&bursty, 8, 5.1, &pace), Some(0.0));
        assert_eq!(request_rate_now(&bursty, 8, 7.1, &pace), Some(10.0));
        // Adaptive: its target before two arrivals, then 1 ÷ the planned gap.
        let adaptive =
            p("token_rate: {mode: adaptive, target: 16/s, increase: 50%, step: 1s, floor: 10}\n");
        let mut pace = Pace::default();
        pace.planned(0.0);
        assert_eq!(request_rate_now(&adaptive, 8, 0.1, &pace), Some(2.0));
        pace.planned(0.5);
        pace.planned(0.75);
        assert_eq!(request_rate_now(&adaptive, 8, 0.8, &pace), Some(4.0));
        // The peak is the highest level offered (gap 0.25 s), kept when the level falls back.
        pace.planned(1.25);
        assert_eq!(request_rate_now(&adaptive, 8, 1.3, &pace), Some(2.0));
        assert_eq!(adaptive_peak(&adaptive, 8, &pace), Some(4.0));
        assert_eq!(adaptive_peak(&adaptive, 8, &Pace::default()), Some(2.0));
        assert_eq!(adaptive_peak(&bursty, 8, &pace), None);
        assert_eq!(
            request_rate_now(&p("concurrency: {ramp: fixed, base: 2}\n"), 8, 0.0, &pace),
            None
        );
    }

    #[test]
    fn a_profile_is_validated_against_the_caps() {
        // 40 tokens/s ÷ 8 = 5 req/s.
        let spec = validate(
            &req("profile: p\ntoken_rate: {mode: constant, target: 40/s}\n"),
            0,
            "t",
            &caps(),
        )
        .unwrap();
        assert_eq!(
            (spec.rate_per_second, spec.concurrency, spec.max_requests),
            (5.0, 4, 100)
        );
        assert_eq!(
            spec.profile.as_ref().map(|p| p.file.as_str()),
            Some("load.yaml")
        );
        let err =
            |r: &proto::InjectLoadRequest| validate(r, 0, "t", &caps()).unwrap_err().to_string();
        // Bursty sends at twice its mean during on periods: 2 × 48 ÷ 8 = 12 > 10.
        assert_eq!(
            err(&req("token_rate: {mode: bursty, target: 48/s}\n")),
            "token_rate ÷ output_tokens = 12 requests/s (load.yaml): above the cap of 10 (control.max_inject_rate)"
        );
        assert_eq!(
            err(&req(
                "token_rate: {mode: constant, target: 40/s, jiter: 5%}\n"
            )),
            "load.yaml: token_rate.jiter = \"5%\": unknown key (expected mode, target, jitter, period, increase, step, floor)"
        );
        assert!(
            err(&req("profile: p\nconcurrency: {ramp: fixed, base: 2}\n"))
                .contains("no token_rate")
        );
        let mut r = req("token_rate: {mode: constant, target: 40/s}\n");
        r.duration_s = 61.0;
        assert!(err(&r).starts_with("duration_s = 61: above the cap of 60"));
        r.duration_s = 5.0;
        r.trace_file = "x.csv".into();
        assert!(err(&r).starts_with("trace_file = \"x.csv\": a load is a profile or a trace"));
        let e = validate(
            &req("token_rate: {mode: constant, target: 40/s, jiter: 5%}\n"),
            0,
            "t",
            &caps(),
        )
        .unwrap_err();
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);
        assert_eq!(
            tonic::Status::from(Refusal::NotAProfile("load-1".into())).code(),
            tonic::Code::FailedPrecondition
        );
    }
}
