//! The workers behind one router target as lmperf knows them, for the pinned probes
//! (`canary::probes`) and `/api/v1/status` (`targets[].worker_probes`): from the router's own
//! page (the workers it registers, `server::workers`) and from the replies (the workers Dynamo
//! said served a request), each with its pinned probes' results. A worker the page registered
//! and no longer does has left the router's view: it is said (`gone`, with since when) and no
//! longer probed, never dropped silently; a worker that comes back is present again. Only
//! Dynamo's workers are held: its instance ids are what a request can be pinned to.
//!
//! A frontend serving several models registers all their workers in one series, with no model
//! label (1.6.1, seen live: two models in two namespaces, every series labelled with the
//! first's namespace), and answers a request pinned to another model's worker with 400
//! "Invalid request" (or, a prefill pin on a model with no prefill workers, ignores the pin).
//! A worker known from the page only, never named by this target's replies nor answering its
//! probe, whose probe is refused so serves another model: it is said (`other_model`) and no
//! longer probed, never `failing`.
//!
//! Pure: every method takes the time (Unix seconds); nothing here reads a clock.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::measure::worker::{AttributionSource, ServedBy, WorkerRole};
use lmperf_measure::server_timing::TimingSource;
use lmperf_server_page::workers::RouterWorker;

/// Workers held per target at most; later ones are not probed (a router in front of more is
/// probed by its first 256 ids).
pub const MAX_WORKERS: usize = 256;
/// Failed probes in a row that make a present worker `failing`.
pub const FAILING_AFTER: u32 = 3;

/// Where a worker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Registered or serving, its probes answering.
    Present,
    /// Its last [`FAILING_AFTER`] probes or more failed.
    Failing,
    /// The router's page no longer registers it.
    Gone,
    /// Registered on the frontend's page but not in the router of this target's model: a
    /// probe pinned to it was refused (400, or the pin ignored) before any reply of this
    /// target named it.
    OtherModel,
}

/// How a request is pinned to a worker: Dynamo's `nvext` fields, as its frontend maps the
/// `x-worker-instance-id` and `x-prefill-instance-id` headers onto them
/// (`apply_header_routing_overrides` in ai-dynamo/dynamo `lib/llm/src/protocols/openai/nvext.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// An aggregated worker (or one of no known role): `backend_instance_id` and
    /// `decode_worker_id`.
    Agg(u64),
    /// A decode worker under prefill/decode disaggregation: `decode_worker_id` alone (the
    /// router picks the prefill worker). Dynamo 1.6.1's prefill router reads
    /// `backend_instance_id` as the prefill worker: with a decode worker's id there every probe
    /// was refused (400, "nvext.backend_instance_id=… does not identify a known worker").
    Decode(u64),
    /// A prefill worker: `prefill_worker_id` (the router picks the decode worker).
    Prefill(u64),
}

impl Pin {
    /// The `nvext` object that pins a request.
    pub fn nvext(self) -> serde_json::Value {
        match self {
            Pin::Agg(id) => {
                serde_json::json!({"backend_instance_id": id, "decode_worker_id": id})
            }
            Pin::Decode(id) => serde_json::json!({"decode_worker_id": id}),
            Pin::Prefill(id) => serde_json::json!({"prefill_worker_id": id}),
        }
    }

    /// The worker's instance id.
    pub fn id(self) -> u64 {
        match self {
            Pin::Agg(id) | Pin::Decode(id) | Pin::Prefill(id) => id,
        }
    }

    /// The role it is pinned in: `decode` (an aggregated worker too) or `prefill`.
    pub fn role(self) -> &'static str {
        match self {
            Pin::Agg(_) | Pin::Decode(_) => "decode",
            Pin::Prefill(_) => "prefill",
        }
    }
}

/// One worker (`/api/v1/status` `targets[].worker_probes.workers[]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerView {
    /// Dynamo's instance id, decimal.
    pub id: String,
    /// `agg`, `decode` or `prefill`: from the replies where one named it, else the page's
    /// `worker_type`.
    pub role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    pub state: WorkerState,
    /// Registered on the router's last page read.
    pub registered: bool,
    pub first_seen_unix_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gone_since_unix_s: Option<f64>,
    /// Pinned probes sent and answered with a stream of tokens by this worker.
    pub probes: u64,
    pub probes_ok: u64,
    pub failed_in_a_row: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_probe_unix_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ttft_ms: Option<f64>,
    /// The last failed probe's reason, one line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A change worth a log line.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    Found { id: String, role: &'static str },
    Gone { id: String },
    Back { id: String },
    Failing { id: String, error: String },
    OtherModel { id: String },
}

/// One worker held, with whether a probe of it is in flight.
#[derive(Debug, Clone)]
struct Entry {
    view: WorkerView,
    /// The role its replies named (beats the page's `worker_type`).
    replied_role: Option<WorkerRole>,
    /// This target's replies named it or its probe answered: it serves this target's model.
    confirmed: bool,
    in_flight: bool,
    /// Its probes' results of the last minutes, for the workers apart ([`WorkerSet::apart`]).
    results: std::collections::VecDeque<lmperf_measure::workers_apart::DirectResult>,
}

/// Probe results kept per worker (one per probe interval: a minute's is a few).
const KEEP_RESULTS: usize = 64;

/// The workers of one router target.
#[derive(Debug, Clone, Default)]
pub struct WorkerSet {
    workers: BTreeMap<u64, Entry>,
}

/// A pinned probe's time as its worker's own, ms, the workers of a role compared by it
/// ([`WorkerSet::apart`]): by Dynamo's clock, an aggregated or prefill worker's time from the
/// dispatch to its first token (`prefill_time_ms`: its queue and prefill; the frontend's time
/// before the dispatch, `prefill_wait_time_ms`, is the router's, and the KV transfer after it
/// `kv_transfer`'s); a disaggregated decode worker's time per output token (its own work).
/// Pinned probes pass through the frontend: their client TTFT held the frontend's time (seen
/// live on Dynamo 1.6.1 with the frontend at 1 % of a core: one worker's probes 112 × the
/// other's, the starved router read as a slow worker), and less the router's transfer
/// estimate it held the estimate's error (a rolling restart to a 10 × slower link made the old
/// decode worker's probes 3.3 × the new one's). Without those figures: the client's TTFT less
/// the estimate, never below 0. `None` without a TTFT.
pub fn own_ms(pin: Pin, r: &lmperf_measure::RequestRecord) -> Option<f64> {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let timing = r.server_timing.as_ref();
    let dynamo = timing.filter(|t| t.source == TimingSource::DynamoTiming);
    let own = match pin {
        Pin::Agg(_) | Pin::Prefill(_) => dynamo.and_then(|t| t.prefill).map(ms),
        Pin::Decode(_) => r.tpot.map(ms),
    };
    own.or_else(|| {
        let transfer = timing
            .and_then(|t| t.kv_transfer_estimate)
            .unwrap_or_default();
        r.ttft.map(|t| ms(t.saturating_sub(transfer)))
    })
}

fn role_of_type(worker_type: Option<&str>) -> &'static str {
    match worker_type {
        Some("prefill") => "prefill",
        Some("decode") => "decode",
        _ => "unknown",
    }
}

impl WorkerSet {
    /// A pinned probe to `pin` ended at `at_unix_s`: answered after `ttft_ms`, or failed
    /// (`None`); kept for [`Self::apart`].
    pub fn record_result(&mut self, pin: Pin, at_unix_s: f64, ttft_ms: Option<f64>) {
        let Some(e) = self.workers.get_mut(&pin.id()) else {
            return;
        };
        if e.results.len() >= KEEP_RESULTS {
            e.results.pop_front();
        }
        e.results
            .push_back(lmperf_measure::workers_apart::DirectResult { at_unix_s, ttft_ms });
    }

    /// The workers apart from the others of their role (a prefill worker's probes against the
    /// other prefill workers', an aggregated or decode worker's against theirs), from their
    /// pinned probes of the window ending at `now_unix_s`, among the workers the router's
    /// page still registers: the slowest of all roles and every failing one.
    pub fn apart(&self, now_unix_s: f64) -> lmperf_measure::workers_apart::WorkersApart {
        use lmperf_measure::workers_apart::{WINDOW_S, WorkersApart, workers_apart};
        let mut out = WorkersApart::default();
        for role in ["prefill", "other"] {
            let results: Vec<(&str, Vec<_>)> = self
                .workers
                .values()
                .filter(|e| e.view.registered)
                .filter(|e| (e.view.role == "prefill") == (role == "prefill"))
                .map(|e| (e.view.id.as_str(), e.results.iter().copied().collect()))
                .collect();
            let a = workers_apart(
                results
                    .iter()
                    .map(|(w, r): &(&str, Vec<_>)| (*w, r.as_slice())),
                now_unix_s,
                WINDOW_S,
            );
            if a.slowest.as_ref().map(|s| s.1) > out.slowest.as_ref().map(|s| s.1) {
                out.slowest = a.slowest;
            }
            out.failing.extend(a.failing);
            out.ratios.extend(a.ratios);
        }
        out.failing.sort();
        out
    }

    /// Whether any worker is held (the target is a Dynamo router lmperf can pin).
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    fn insert(&mut self, id: u64, role: &'static str, at: f64) -> Option<Transition> {
        if self.workers.contains_key(&id) || self.workers.len() >= MAX_WORKERS {
            return None;
        }
        self.workers.insert(
            id,
            Entry {
                view: WorkerView {
                    id: id.to_string(),
                    role,
                    dp_rank: None,
                    state: WorkerState::Present,
                    registered: false,
                    first_seen_unix_s: at,
                    gone_since_unix_s: None,
                    probes: 0,
                    probes_ok: 0,
                    failed_in_a_row: 0,
                    last_probe_unix_s: None,
                    last_ttft_ms: None,
                    last_error: None,
                },
                replied_role: None,
                confirmed: false,
                in_flight: false,
                results: std::collections::VecDeque::new(),
            },
        );
        Some(Transition::Found {
            id: id.to_string(),
            role,
        })
    }

    /// The router's page read at `at` registers `workers`: new ones are found, a gone one is
    /// back, and one registered on an earlier page but not on this one is gone.
    pub fn from_page(&mut self, at: f64, workers: &[RouterWorker]) -> Vec<Transition> {
        let mut out = Vec::new();
        let listed: BTreeMap<u64, &RouterWorker> = workers
            .iter()
            .filter_map(|w| Some((w.id.parse::<u64>().ok()?, w)))
            .collect();
        for (id, w) in &listed {
            out.extend(self.insert(*id, role_of_type(w.worker_type.as_deref()), at));
            if let Some(e) = self.workers.get_mut(id) {
                e.view.registered = true;
                e.view.dp_rank = w.dp_rank.or(e.view.dp_rank);
                if e.replied_role.is_none() {
                    e.view.role = role_of_type(w.worker_type.as_deref());
                }
                if e.view.state == WorkerState::Gone {
                    e.view.state = WorkerState::Present;
                    e.view.gone_since_unix_s = None;
                    e.view.failed_in_a_row = 0;
                    out.push(Transition::Back { id: id.to_string() });
                }
            }
        }
        for (id, e) in &mut self.workers {
            if e.view.registered && !listed.contains_key(id) {
                e.view.registered = false;
                if !matches!(e.view.state, WorkerState::Gone | WorkerState::OtherModel) {
                    e.view.state = WorkerState::Gone;
                    e.view.gone_since_unix_s = Some(at);
                    out.push(Transition::Gone { id: id.to_string() });
                }
            }
        }
        out
    }

    /// A reply at `at` named the workers that served it (Dynamo's `nvext.worker_id` only).
    pub fn from_reply(&mut self, at: f64, served: &ServedBy) -> Vec<Transition> {
        if served.source != AttributionSource::DynamoNvext {
            return Vec::new();
        }
        let mut out = Vec::new();
        for w in &served.workers {
            let Ok(id) = w.id.parse::<u64>() else {
                continue;
            };
            out.extend(self.insert(id, w.role.as_str(), at));
            if let Some(e) = self.workers.get_mut(&id) {
                e.confirmed = true;
                if e.view.state == WorkerState::OtherModel {
                    e.view.state = WorkerState::Present;
                }
                e.replied_role = Some(w.role);
                e.view.role = w.role.as_str();
                e.view.dp_rank = w.dp_rank.or(e.view.dp_rank);
            }
        }
        out
    }

    /// The worker to probe now: of those not gone and with no probe in flight, the one whose
    /// last probe is oldest (never probed first), once `interval_s` has passed since it.
    pub fn next_due(&self, now: f64, interval_s: f64) -> Option<Pin> {
        // A prefill worker registered: the decode workers are a disaggregated pool's.
        let disaggregated = self.workers.values().any(|e| e.view.role == "prefill");
        self.workers
            .iter()
            .filter(|(_, e)| {
                !matches!(e.view.state, WorkerState::Gone | WorkerState::OtherModel) && !e.in_flight
            })
            .filter(|(_, e)| {
                e.view
                    .last_probe_unix_s
                    .is_none_or(|t| now - t >= interval_s)
            })
            .min_by(|a, b| {
                let t = |e: &Entry| e.view.last_probe_unix_s.unwrap_or(f64::NEG_INFINITY);
                t(a.1).total_cmp(&t(b.1)).then(a.0.cmp(b.0))
            })
            .map(|(id, e)| match e.view.role {
                "prefill" => Pin::Prefill(*id),
                "decode" if disaggregated => Pin::Decode(*id),
                _ => Pin::Agg(*id),
            })
    }

    /// A probe of `pin` starts at `at`.
    pub fn probe_started(&mut self, pin: Pin, at: f64) {
        if let Some(e) = self.workers.get_mut(&pin.id()) {
            e.in_flight = true;
            e.view.last_probe_unix_s = Some(at);
            e.view.probes += 1;
        }
    }

    /// A probe of `pin` ended: `error` is `None` when the worker answered with tokens (and,
    /// where the reply named its worker, it was the pinned one), else the reason; `refused`
    /// when the frontend answered as for a worker outside this model's router (400, or the
    /// pin ignored: [`pin_refused`]). Returns [`Transition::Failing`] at the
    /// [`FAILING_AFTER`]-th failure in a row, [`Transition::OtherModel`] when a worker never
    /// confirmed as this target's is refused.
    pub fn probe_done(
        &mut self,
        pin: Pin,
        ttft_ms: Option<f64>,
        error: Option<String>,
        refused: bool,
    ) -> Option<Transition> {
        let e = self.workers.get_mut(&pin.id())?;
        e.in_flight = false;
        if let Some(reason) = &error
            && refused
            && !e.confirmed
        {
            e.view.state = WorkerState::OtherModel;
            e.view.last_error = Some(reason.clone());
            return Some(Transition::OtherModel {
                id: e.view.id.clone(),
            });
        }
        match error {
            None => {
                e.confirmed = true;
                e.view.probes_ok += 1;
                e.view.failed_in_a_row = 0;
                e.view.last_ttft_ms = ttft_ms;
                if e.view.state == WorkerState::Failing {
                    e.view.state = WorkerState::Present;
                }
                None
            }
            Some(reason) => {
                e.view.failed_in_a_row += 1;
                e.view.last_error = Some(reason.clone());
                if e.view.failed_in_a_row == FAILING_AFTER && e.view.state == WorkerState::Present {
                    e.view.state = WorkerState::Failing;
                    return Some(Transition::Failing {
                        id: e.view.id.clone(),
                        error: reason,
                    });
                }
                None
            }
        }
    }

    /// Every worker held, by id.
    pub fn view(&self) -> Vec<WorkerView> {
        self.workers.values().map(|e| e.view.clone()).collect()
    }
}

/// Whether the frontend answered a probe as for a worker outside the model's router: HTTP 400
/// ("Invalid request": the pinned id is not among the model's workers), or an answer whose
/// reply named another worker in the pinned role (a `pin_error` without a `failure`).
pub fn pin_refused(http_status: Option<u16>, failure: bool, pin_error: bool) -> bool {
    http_status == Some(400) || (!failure && pin_error)
}

/// Why a probe pinned to `pin` does not count as the worker's answer: the request failed
/// (`failure`), or the reply named another worker in the pinned role (the pin was not
/// honoured). `None`: it answered.
pub fn probe_error(pin: Pin, failure: Option<String>, served: Option<&ServedBy>) -> Option<String> {
    if let Some(f) = failure {
        return Some(f);
    }
    let served = served.filter(|s| s.source == AttributionSource::DynamoNvext)?;
    let want = pin.id().to_string();
    let named = match pin {
        Pin::Agg(_) | Pin::Decode(_) => served.primary(),
        Pin::Prefill(_) => served.prefill().or_else(|| served.primary()),
    }?;
    (named.id != want).then(|| {
        format!(
            "pinned to worker {want}, the router says {} served it",
            named.id
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::worker::{DynamoWorkerIds, ServedBy};

    fn page(ids: &[(&str, &str)]) -> Vec<RouterWorker> {
        ids.iter()
            .map(|(id, t)| RouterWorker {
                id: (*id).to_owned(),
                worker_type: Some((*t).to_owned()),
                dp_rank: Some(0),
            })
            .collect()
    }

    /// Two workers from the page, a third from a reply; one leaves the page (gone, no longer
    /// due), comes back (present again).
    #[test]
    fn page_and_replies_make_the_set_and_a_worker_that_leaves_is_said() {
        let mut s = WorkerSet::default();
        let t = s.from_page(100.0, &page(&[("1", "decode"), ("2", "decode")]));
        assert_eq!(t.len(), 2);
        let agg = ServedBy::from_dynamo(&DynamoWorkerIds {
            prefill_worker_id: Some(3),
            prefill_dp_rank: Some(0),
            decode_worker_id: Some(3),
            decode_dp_rank: Some(0),
        })
        .unwrap();
        assert_eq!(
            s.from_reply(101.0, &agg),
            [Transition::Found {
                id: "3".into(),
                role: "agg"
            }]
        );
        assert_eq!(
            s.from_page(102.0, &page(&[("1", "decode")])),
            [Transition::Gone { id: "2".into() }]
        );
        let v = s.view();
        assert_eq!(v[1].state, WorkerState::Gone);
        assert_eq!(v[1].gone_since_unix_s, Some(102.0));
        // Worker 3 was never registered: the page does not make it gone.
        assert_eq!(v[2].state, WorkerState::Present);
        // Due: never probed first, by id; the gone one never.
        assert_eq!(s.next_due(103.0, 10.0), Some(Pin::Agg(1)));
        s.probe_started(Pin::Agg(1), 103.0);
        assert_eq!(s.next_due(103.0, 10.0), Some(Pin::Agg(3)));
        s.probe_started(Pin::Agg(3), 103.5);
        assert_eq!(s.next_due(104.0, 10.0), None, "in flight or not due");
        s.probe_done(Pin::Agg(1), Some(12.0), None, false);
        assert_eq!(s.next_due(112.9, 10.0), None);
        assert_eq!(s.next_due(113.0, 10.0), Some(Pin::Agg(1)));
        assert_eq!(
            s.from_page(120.0, &page(&[("1", "decode"), ("2", "decode")])),
            [Transition::Back { id: "2".into() }]
        );
        assert_eq!(s.view()[1].state, WorkerState::Present);
    }

    /// Beside a prefill worker a decode worker is pinned by `decode_worker_id` alone (Dynamo
    /// 1.6.1 refused `backend_instance_id` there: its prefill router looks it up among the
    /// prefill workers); alone, an aggregated one by both fields.
    #[test]
    fn a_disaggregated_decode_worker_is_pinned_by_its_decode_id() {
        let mut s = WorkerSet::default();
        s.from_page(0.0, &page(&[("7", "decode"), ("9", "prefill")]));
        let mut pins = Vec::new();
        while let Some(p) = s.next_due(0.0, 5.0) {
            s.probe_started(p, 0.0);
            pins.push(p);
        }
        assert_eq!(pins, [Pin::Decode(7), Pin::Prefill(9)]);
        assert_eq!(pins[0].nvext(), serde_json::json!({"decode_worker_id": 7}));
        let mut agg = WorkerSet::default();
        agg.from_page(0.0, &page(&[("7", "decode")]));
        let pin = agg.next_due(0.0, 5.0);
        assert_eq!(pin, Some(Pin::Agg(7)));
        assert_eq!(
            pin.map(Pin::nvext),
            Some(serde_json::json!({"backend_instance_id": 7, "decode_worker_id": 7}))
        );
    }

    #[test]
    fn failing_after_three_and_back_on_an_answer() {
        let mut s = WorkerSet::default();
        s.from_page(0.0, &page(&[("9", "prefill")]));
        let pin = s.next_due(0.0, 5.0).unwrap();
        assert_eq!(pin, Pin::Prefill(9));
        assert_eq!(pin.nvext(), serde_json::json!({"prefill_worker_id": 9}));
        for k in 1..=3 {
            s.probe_started(pin, f64::from(k));
            let t = s.probe_done(
                pin,
                None,
                Some("503: Service temporarily unavailable".into()),
                false,
            );
            assert_eq!(t.is_some(), k == 3, "{k}");
        }
        assert_eq!(s.view()[0].state, WorkerState::Failing);
        s.probe_started(pin, 4.0);
        s.probe_done(pin, Some(8.0), None, false);
        let v = &s.view()[0];
        assert_eq!(
            (v.state, v.probes, v.probes_ok),
            (WorkerState::Present, 4, 1)
        );
    }

    /// A probe's own time: an aggregated or prefill worker's by Dynamo's clock, from the
    /// dispatch to its first token (not the frontend's wait, not the transfer); a
    /// disaggregated decode worker's time per token; without those, the client's TTFT less
    /// the estimate, never below 0.
    #[test]
    fn own_time_by_role() {
        use lmperf_measure::server_timing::{ServerTiming, TimingSource};
        use lmperf_measure::{Outcome, RequestError, RequestRecord};
        use std::time::Duration;
        let ms = Duration::from_millis;
        let record = |ttft: Option<Duration>, transfer: Option<Duration>, tpot| {
            let mut r =
                RequestRecord::failed(Outcome::Ok, RequestError::new("none", None), None, ms(90));
            r.error = None;
            r.ttft = ttft;
            r.tpot = tpot;
            r.server_timing = Some(ServerTiming {
                ttft: Some(ms(8)),
                queue: Some(ms(1)),
                prefill: Some(ms(5)),
                kv_transfer_estimate: transfer,
                ..ServerTiming::said_by(TimingSource::DynamoTiming)
            });
            r
        };
        let pd = record(Some(ms(74)), Some(ms(65)), Some(ms(3)));
        assert_eq!(own_ms(Pin::Prefill(1), &pd), Some(5.0));
        assert_eq!(own_ms(Pin::Decode(1), &pd), Some(3.0));
        let agg = record(Some(ms(74)), None, None);
        assert_eq!(own_ms(Pin::Agg(1), &agg), Some(5.0));
        // One token (no time per token): the TTFT less the estimate, 0 at the least.
        assert_eq!(
            own_ms(Pin::Decode(1), &record(Some(ms(40)), Some(ms(65)), None)),
            Some(0.0)
        );
        let mut plain = agg.clone();
        plain.server_timing = None;
        assert_eq!(own_ms(Pin::Prefill(1), &plain), Some(74.0));
        plain.ttft = None;
        assert_eq!(own_ms(Pin::Agg(1), &plain), None);
    }

    /// Three decode workers and two prefill workers: decode worker 3 answers its probes at
    /// 4 × the other decode workers' TTFT, prefill worker 5 fails its last two while 4
    /// answers; the prefill workers' slower TTFT is not compared with the decode ones'; a
    /// worker the page no longer registers is left out.
    #[test]
    fn workers_apart_within_their_role() {
        let mut s = WorkerSet::default();
        s.from_page(
            0.0,
            &page(&[
                ("1", "decode"),
                ("2", "decode"),
                ("3", "decode"),
                ("4", "prefill"),
                ("5", "prefill"),
            ]),
        );
        for k in 0..3 {
            let at = 10.0 + f64::from(k);
            s.record_result(Pin::Decode(1), at, Some(40.0));
            s.record_result(Pin::Decode(2), at, Some(42.0));
            s.record_result(Pin::Decode(3), at, Some(164.0));
            s.record_result(Pin::Prefill(4), at, Some(400.0));
            s.record_result(Pin::Prefill(5), at, (k == 0).then_some(410.0));
        }
        let a = s.apart(20.0);
        let (w, ratio) = a.slowest.expect("decode workers answered");
        assert_eq!(w, "3");
        assert!((ratio - 164.0 / 40.0).abs() < 1e-9, "{ratio}");
        assert_eq!(a.failing, ["5"]);
        // Worker 3 leaves the page: the decode workers left answer alike.
        s.from_page(
            21.0,
            &page(&[("1", "decode"), ("2", "decode"), ("4", "prefill")]),
        );
        let a = s.apart(22.0);
        assert!(a.slowest.is_some_and(|(w, r)| w != "3" && r < 1.1));
        assert!(a.failing.is_empty());
    }

    #[test]
    fn a_pin_the_router_did_not_honour_is_an_error() {
        let by = |p: u64, d: u64| {
            ServedBy::from_dynamo(&DynamoWorkerIds {
                prefill_worker_id: Some(p),
                prefill_dp_rank: None,
                decode_worker_id: Some(d),
                decode_dp_rank: None,
            })
        };
        assert_eq!(probe_error(Pin::Decode(5), None, by(5, 5).as_ref()), None);
        let e = probe_error(Pin::Decode(5), None, by(6, 6).as_ref()).unwrap();
        assert!(
            e.contains("pinned to worker 5") && e.contains("6 served it"),
            "{e}"
        );
        assert_eq!(probe_error(Pin::Prefill(7), None, by(7, 8).as_ref()), None);
        assert_eq!(
            probe_error(Pin::Decode(5), Some("connection_refused".into()), None).as_deref(),
            Some("connection_refused")
        );
    }

    /// A frontend with two models lists both's workers on one page: a page-only worker whose
    /// probe is refused 400 serves another model (said once, no longer probed, never failing);
    /// one this target's reply named is its own, and a 400 to it counts as a failure.
    #[test]
    fn a_page_worker_refused_400_serves_another_model() {
        let mut s = WorkerSet::default();
        s.from_page(0.0, &page(&[("1", "decode"), ("2", "decode")]));
        let mine = ServedBy::from_dynamo(&DynamoWorkerIds {
            prefill_worker_id: Some(1),
            prefill_dp_rank: None,
            decode_worker_id: Some(1),
            decode_dp_rank: None,
        })
        .unwrap();
        s.from_reply(0.5, &mine);
        let refused = || Some("Bad Request: Invalid request".to_owned());
        s.probe_started(Pin::Agg(2), 1.0);
        assert_eq!(
            s.probe_done(
                Pin::Agg(2),
                None,
                refused(),
                pin_refused(Some(400), true, true)
            ),
            Some(Transition::OtherModel { id: "2".into() })
        );
        assert_eq!(s.view()[1].state, WorkerState::OtherModel);
        assert_eq!(s.next_due(100.0, 1.0), Some(Pin::Agg(1)));
        s.probe_started(Pin::Agg(1), 100.0);
        assert_eq!(s.next_due(200.0, 1.0), None, "worker 2 is not probed again");
        // Leaving the page: not said gone (it was never this target's).
        assert_eq!(s.from_page(201.0, &page(&[("1", "decode")])), []);
        // This target's own worker refused 400: a failure, not another model's.
        assert_eq!(s.probe_done(Pin::Agg(1), None, refused(), true), None);
        let v = &s.view()[0];
        assert_eq!((v.state, v.failed_in_a_row), (WorkerState::Present, 1));
        // A prefill pin the frontend ignored (an aggregated model): refused too; a failed
        // request (5xx, stream cut) is not.
        assert!(pin_refused(Some(200), false, true));
        assert!(!pin_refused(Some(503), true, true));
        assert!(!pin_refused(Some(200), false, false));
    }
}
