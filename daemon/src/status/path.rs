//! A router target's direct paths (issue 52.1, 52.2): the workers behind it that get canaries
//! straight (`canary::direct`), their counts, and the routed and direct requests of the last
//! minutes that [`lmperf_measure::path::compare`] compares (`/api/v1/status` `targets[].path`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use lmperf_measure::path::{PathComparison, PathMetric, PathSample, compare};
use serde::Serialize;

/// The window compared: the routed and direct requests that ended in the last minute.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Samples kept per path: two windows, at most this many (each canary compares them: a
/// copy and a sort of a minute's requests, not of the agent's life).
const KEEP: usize = 2048;
const KEEP_S: f64 = 120.0;

/// Where the direct workers came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkersFrom {
    /// `direct_workers` in the target's configuration.
    Config,
    /// The router's own list (`GET /list_workers`).
    Router,
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
    /// `config` | `router`; `None` until a list is known.
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

    /// The router's list could not be read: said in the status, the workers known kept.
    pub fn set_list_error(&self, error: String) {
        self.lock().list_error = Some(error);
    }

    /// The workers' base URLs now.
    pub fn workers(&self) -> Vec<String> {
        self.lock().workers.iter().map(|w| w.url.clone()).collect()
    }

    /// A routed canary ended: a successful one joins the comparison.
    pub fn record_routed(&self, ok: bool, sample: PathSample) {
        if ok {
            push(&mut self.lock().routed, sample);
        }
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
        if error_type.is_none() {
            push(&mut g.direct, sample);
        }
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
            p.record_routed(true, s(at, 120.0));
            p.record_routed(false, s(at, 9000.0));
            p.record_direct("http://a/", None, s(at, 20.0));
        }
        p.record_direct("http://b/", Some("http_503"), s(104.0, 1.0));
        let v = p.view(105.0);
        assert_eq!(v.ttft.overhead_ms, Some(100.0));
        assert_eq!((v.ttft.routed.n, v.ttft.direct.n), (5, 5));
        assert_eq!((v.workers[0].requests, v.workers[0].ok), (5, 5));
        assert_eq!(v.workers[1].last_error.as_deref(), Some("http_503"));
        p.set_workers(WorkersFrom::Router, &["http://b/".to_owned()]);
        assert_eq!(p.view(105.0).workers[0].requests, 1);
        p.set_list_error("GET /list_workers: 404".to_owned());
        assert_eq!(p.workers(), ["http://b/"]);
        assert!(p.view(105.0).list_error.is_some());
    }
}
