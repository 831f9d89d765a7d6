//! A router target's direct paths (issue 52.1, 52.2): the workers behind it that get canaries
//! straight (`canary::direct`), their counts, and the routed and direct requests of the last
//! minutes that [`lmperf_measure::path::compare`] compares (`/api/v1/status` `targets[].path`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use lmperf_measure::path::{PathComparison, PathMetric, PathSample, compare};
use lmperf_measure::workers_apart::{DirectResult, WorkersApart, workers_apart};
use serde::Serialize;

/// The window compared: the routed and direct requests that ended in the last minute.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Samples kept per path: two windows, at most this many (each canary compares them: a
/// copy and a sort of a minute's requests, not of the agent's life).
const KEEP: usize = 2048;
const KEEP_S: f64 = 120.0;
/// Direct results kept per worker (a worker gets one per interval: a minute's is a few).
const KEEP_PER_WORKER: usize = 256;
/// Workers the replies named kept at most (a router naming more is not probed beyond these).
const MAX_REPLIED: usize = 64;

/// Where the direct workers came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkersFrom {
    /// `direct_workers` in the target's configuration.
    Config,
    /// The router's own list (`GET /list_workers`).
    Router,
    /// The pods of the target's `direct_pool` InferencePool that discovery found.
    Pool,
    /// The workers the routed replies named by URL (SGLang's gateway's
    /// `x-smg-routed-worker-id`), when the router lists none.
    Replies,
}

/// One direct worker's canaries so far.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DirectWorkerView {
    /// Its base URL.
    pub url: String,
    pub requests: u64,
    pub ok: u64,
    /// Its last successful canary's TTFT, ms.
    pub last_ttft_ms: Option<f64>,
    /// Its last failed canary's `error.type`.
    pub last_error: Option<String>,
}

/// `/api/v1/status` `targets[].path`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PathView {
    /// Each worker gets a direct canary once per this, seconds.
    pub interval_s: f64,
    /// `config` | `pool` | `router` | `replies`; `None` until a list is known.
    pub workers_from: Option<WorkersFrom>,
    /// Why the router's list could not be read (the last try), when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub list_error: Option<String>,
    pub workers: Vec<DirectWorkerView>,
    /// Routed minus direct TTFT and E2E over the last [`WINDOW`].
    pub ttft: PathComparison,
    pub e2e: PathComparison,
}

#[derive(Debug, Default)]
struct Inner {
    workers_from: Option<WorkersFrom>,
    list_error: Option<String>,
    workers: Vec<DirectWorkerView>,
    routed: VecDeque<PathSample>,
    direct: VecDeque<PathSample>,
    /// The base URLs the routed replies named (at most [`MAX_REPLIED`]).
    replied: BTreeSet<String>,
    /// Each direct worker's results of the last [`KEEP_S`] (failures too), by base URL.
    results: BTreeMap<String, VecDeque<DirectResult>>,
}

/// One router target's direct paths.
#[derive(Debug)]
pub struct DirectPathState {
    pub interval: Duration,
    inner: Mutex<Inner>,
}

fn push(q: &mut VecDeque<PathSample>, s: PathSample) {
    while q.len() >= KEEP
        || q.front()
            .is_some_and(|f| f.at_unix_s < s.at_unix_s - KEEP_S)
    {
        q.pop_front();
    }
    q.push_back(s);
}

impl DirectPathState {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The workers to send to now (base URLs), from `from`: a worker kept keeps its counts.
    pub fn set_workers(&self, from: WorkersFrom, urls: &[String]) {
        let mut g = self.lock();
        g.workers_from = Some(from);
        g.list_error = None;
        g.results.retain(|u, _| urls.contains(u));
        let old = std::mem::take(&mut g.workers);
        g.workers = urls
            .iter()
            .map(|u| {
                old.iter()
                    .find(|w| &w.url == u)
                    .cloned()
                    .unwrap_or_else(|| DirectWorkerView {
                        url: u.clone(),
                        requests: 0,
                        ok: 0,
                        last_ttft_ms: None,
                        last_error: None,
                    })
            })
            .collect();
    }

    /// [`Self::set_workers`], the last list error kept (the router's list still unread).
    pub fn set_workers_keeping_error(&self, from: WorkersFrom, urls: &[String]) {
        let error = self.lock().list_error.clone();
        self.set_workers(from, urls);
        self.lock().list_error = error;
    }

    /// The router's list could not be read: said in the status, the workers known kept.
    pub fn set_list_error(&self, error: String) {
        self.lock().list_error = Some(error);
    }

    /// Where the workers came from, once known.
    pub fn workers_from(&self) -> Option<WorkersFrom> {
        self.lock().workers_from
    }

    /// The workers' base URLs now.
    pub fn workers(&self) -> Vec<String> {
        self.lock().workers.iter().map(|w| w.url.clone()).collect()
    }

    /// A routed canary ended: a successful one joins the comparison; the workers its reply
    /// named by URL (`replied`: base URLs) are kept for [`Self::replied_workers`].
    pub fn record_routed(&self, ok: bool, sample: PathSample, replied: &[String]) {
        let mut g = self.lock();
        for u in replied {
            if g.replied.len() < MAX_REPLIED || g.replied.contains(u) {
                g.replied.insert(u.clone());
            }
        }
        if ok {
            push(&mut g.routed, sample);
        }
    }

    /// The workers the routed replies have named by URL so far, sorted.
    pub fn replied_workers(&self) -> Vec<String> {
        self.lock().replied.iter().cloned().collect()
    }

    /// A direct canary to `worker` ended (`error_type` when it failed).
    pub fn record_direct(&self, worker: &str, error_type: Option<&str>, sample: PathSample) {
        let mut g = self.lock();
        if let Some(w) = g.workers.iter_mut().find(|w| w.url == worker) {
            w.requests += 1;
            match error_type {
                None => {
                    w.ok += 1;
                    w.last_ttft_ms = sample.ttft_ms.or(w.last_ttft_ms);
                }
                Some(e) => w.last_error = Some(e.to_owned()),
            }
        }
        if g.workers.iter().any(|w| w.url == worker) {
            let r = g.results.entry(worker.to_owned()).or_default();
            while r.len() >= KEEP_PER_WORKER
                || r.front()
                    .is_some_and(|f| f.at_unix_s < sample.at_unix_s - KEEP_S)
            {
                r.pop_front();
            }
            r.push_back(DirectResult {
                at_unix_s: sample.at_unix_s,
                ttft_ms: if error_type.is_none() {
                    sample.ttft_ms
                } else {
                    None
                },
            });
        }
        if error_type.is_none() {
            push(&mut g.direct, sample);
        }
    }

    /// The workers apart from the others at `now_unix_s`: the
    /// slowest to its direct canaries and those failing every one ([`workers_apart`]).
    pub fn apart(&self, now_unix_s: f64) -> WorkersApart {
        let g = self.lock();
        let results: Vec<(&str, Vec<DirectResult>)> = g
            .results
            .iter()
            .map(|(u, r)| (u.as_str(), r.iter().copied().collect()))
            .collect();
        workers_apart(
            results.iter().map(|(u, r)| (*u, r.as_slice())),
            now_unix_s,
            lmperf_measure::workers_apart::WINDOW_S,
        )
    }

    /// Routed minus direct `metric` over the [`WINDOW`] ending at `now_unix_s`.
    pub fn compare(&self, metric: PathMetric, now_unix_s: f64) -> PathComparison {
        let g = self.lock();
        let (r, d): (Vec<PathSample>, Vec<PathSample>) = (
            g.routed.iter().copied().collect(),
            g.direct.iter().copied().collect(),
        );
        drop(g);
        compare(&r, &d, metric, now_unix_s, WINDOW.as_secs_f64())
    }

    pub fn view(&self, now_unix_s: f64) -> PathView {
        let (ttft, e2e) = (
            self.compare(PathMetric::Ttft, now_unix_s),
            self.compare(PathMetric::E2e, now_unix_s),
        );
        let g = self.lock();
        PathView {
            interval_s: self.interval.as_secs_f64(),
            workers_from: g.workers_from,
            list_error: g.list_error.clone(),
            workers: g.workers.clone(),
            ttft,
            e2e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at: f64, ttft: f64) -> PathSample {
        PathSample {
            at_unix_s: at,
            ttft_ms: Some(ttft),
            e2e_ms: ttft + 10.0,
        }
    }

    /// The workers the routed replies named: each once, sorted, bounded; an unread list's
    /// error stays beside them.
    #[test]
    fn replied_workers_are_kept_once_and_bounded() {
        let p = DirectPathState::new(Duration::from_secs(5));
        let (b, a) = ("http://b:1/".to_owned(), "http://a:1/".to_owned());
        p.record_routed(true, s(1.0, 10.0), std::slice::from_ref(&b));
        p.record_routed(false, s(2.0, 10.0), &[a.clone(), b.clone()]);
        assert_eq!(p.replied_workers(), [a.clone(), b.clone()]);
        p.set_list_error("GET http://r/list_workers: HTTP 404".to_owned());
        p.set_workers_keeping_error(WorkersFrom::Replies, &p.replied_workers());
        let v = p.view(3.0);
        assert_eq!(v.workers_from, Some(WorkersFrom::Replies));
        assert_eq!(
            v.list_error.as_deref(),
            Some("GET http://r/list_workers: HTTP 404")
        );
        assert_eq!(v.workers.len(), 2);
        for i in 0..2 * MAX_REPLIED {
            p.record_routed(true, s(4.0, 10.0), &[format!("http://w{i}:1/")]);
        }
        assert_eq!(p.replied_workers().len(), MAX_REPLIED);
    }

    /// Workers counted, failures kept out of the comparison, a kept worker keeps its counts.
    #[test]
    fn counts_and_comparison() {
        let p = DirectPathState::new(Duration::from_secs(5));
        p.set_workers(
            WorkersFrom::Router,
            &["http://a/".to_owned(), "http://b/".to_owned()],
        );
        for i in 0..5 {
            let at = 100.0 + f64::from(i);
            p.record_routed(true, s(at, 120.0), &[]);
            p.record_routed(false, s(at, 9000.0), &[]);
            p.record_direct("http://a/", None, s(at, 20.0));
        }
        p.record_direct("http://b/", Some("http_503"), s(104.0, 1.0));
        let v = p.view(105.0);
        assert_eq!(v.ttft.overhead_ms, Some(100.0));
        assert_eq!((v.ttft.routed.n, v.ttft.direct.n), (5, 5));
        assert_eq!((v.workers[0].requests, v.workers[0].ok), (5, 5));
        assert_eq!(v.workers[1].last_error.as_deref(), Some("http_503"));
        // b failed both its direct canaries while a answered: b is failing; a worker not in
        // the list is not kept.
        assert!(p.apart(105.0).failing.is_empty());
        p.record_direct("http://b/", Some("connect_error"), s(104.5, 1.0));
        p.record_direct("http://gone/", Some("connect_error"), s(104.5, 1.0));
        p.record_direct("http://gone/", Some("connect_error"), s(104.6, 1.0));
        assert_eq!(p.apart(105.0).failing, ["http://b/"]);
        p.set_workers(WorkersFrom::Router, &["http://b/".to_owned()]);
        assert_eq!(p.view(105.0).workers[0].requests, 2);
        // With a gone from the list, nobody answered: no worker apart.
        assert!(p.apart(105.0).failing.is_empty());
        p.set_list_error("GET /list_workers: 404".to_owned());
        assert_eq!(p.workers(), ["http://b/"]);
        assert!(p.view(105.0).list_error.is_some());
    }
}
