//! What a router says about each of its workers, and each worker's share of its picks (issue
//! 52.3, 52.5): a router that sends 85 % of its traffic to one of four pods (llm-d-autoscaling
//! #1171) shows here before anything is slow.
//!
//! vllm-router 0.1.17 (PyPI, Rust; names and meanings as the installed binary describes them,
//! pages in `tests/fixtures/server/vllm-router.*.prom`), each series labelled `worker` with the
//! worker's URL:
//! - `vllm_router_processed_requests_total` "Total requests processed by each worker": every
//!   pick, a failed one included (a pick the router then retried elsewhere counts on both);
//! - `vllm_router_worker_health` "Worker health status (1=healthy, 0=unhealthy)";
//! - `vllm_router_cb_state` "Circuit breaker state per worker (0=closed, 1=open, 2=half_open)";
//! - `vllm_router_worker_load` "Current load on each worker" (absent from a page until the
//!   router has a load to say).
//!
//! SGLang's model gateway (lightseekorg/smg, its metrics module: `Metrics::set_worker_health`,
//! `set_worker_cb_state`, `set_worker_requests_active`, each labelled `worker`):
//! `smg_worker_health` (1 healthy, 0 unhealthy), `smg_worker_cb_state` (0 closed, 1 open, 2
//! half-open), `smg_worker_requests_active` (its running requests: the load); no picks.
//!
//! llm-d's endpoint picker (llm-d/llm-d-router `pkg/epp/metrics/llm_d_router_metrics.go`,
//! subsystem `llm_d_epp`, renamed `llm_d_router_epp` in 2026: both read):
//! `*_scheduler_attempts_total{status, target_model_name, endpoint_name, namespace, port}`
//! "Total number of scheduling attempts", `status="success"` a request dispatched to the
//! endpoint: its picks, the worker named `namespace/endpoint_name:port` (the pod, as llm-d's
//! `x-session-token` names it, and its port); `*_per_endpoint_queue_size{name,
//! model_server_endpoint}` "requests pending in the model server queue for each underlying
//! endpoint" (and the Gateway API Inference Extension's older
//! `inference_pool_per_pod_queue_size{name, model_server_pod}`), the endpoint's pod name: the
//! worker whose `endpoint_name` it is. It says no health or breaker per endpoint.
//!
//! A worker's share of capacity is taken as equal among the workers the router may pick
//! (healthy, circuit not open): a router's page says nothing of a worker's size.

use super::parse::Page;

/// The per-worker counter of picks.
pub const PROCESSED: &str = "vllm_router_processed_requests_total";
/// The per-worker health gauge.
pub const HEALTH: &str = "vllm_router_worker_health";
/// The per-worker circuit breaker state gauge.
pub const CB_STATE: &str = "vllm_router_cb_state";
/// The per-worker load gauge.
pub const LOAD: &str = "vllm_router_worker_load";
/// llm-d's endpoint picker's scheduling attempts per endpoint.
pub const EPP_ATTEMPTS: &str = "llm_d_epp_scheduler_attempts_total";
/// [`EPP_ATTEMPTS`] under the picker's newer subsystem (`llm_d_router_epp`).
pub const EPP_ROUTER_ATTEMPTS: &str = "llm_d_router_epp_scheduler_attempts_total";
/// The picker's view of each endpoint's queue (`model_server_endpoint`), both subsystems, and
/// the Gateway API Inference Extension's older name (`model_server_pod`).
pub const EPP_QUEUE: &str = "llm_d_epp_per_endpoint_queue_size";
pub const EPP_ROUTER_QUEUE: &str = "llm_d_router_epp_per_endpoint_queue_size";
pub const GIE_POD_QUEUE: &str = "inference_pool_per_pod_queue_size";
/// SGLang's model gateway's per-worker gauges (`worker` label, the worker's URL):
/// health (1 healthy, 0 not), circuit breaker (0 closed, 1 open, 2 half-open) and running
/// requests. It counts no picks per worker (`smg_worker_selection_total` has no worker label).
pub const SMG_HEALTH: &str = "smg_worker_health";
pub const SMG_CB_STATE: &str = "smg_worker_cb_state";
pub const SMG_ACTIVE: &str = "smg_worker_requests_active";
/// Every per-worker family read here (the queues after the picks: a queue goes to the worker
/// the picks named).
pub const NAMES: [&str; 12] = [
    PROCESSED,
    HEALTH,
    CB_STATE,
    LOAD,
    EPP_ROUTER_ATTEMPTS,
    EPP_ATTEMPTS,
    SMG_HEALTH,
    SMG_CB_STATE,
    SMG_ACTIVE,
    EPP_ROUTER_QUEUE,
    EPP_QUEUE,
    GIE_POD_QUEUE,
];

/// Families that say one thing under the names of several releases, newest first: a picker
/// exports its older names beside the new ones (llm-d-router's e2e test expects both
/// `inference_pool_per_pod_queue_size` and `llm_d_epp_per_endpoint_queue_size`), so only the
/// first on a page is read.
const ALIASES: [&[&str]; 2] = [
    &[EPP_ROUTER_ATTEMPTS, EPP_ATTEMPTS],
    &[EPP_ROUTER_QUEUE, EPP_QUEUE, GIE_POD_QUEUE],
];

/// Whether `name` is an older alias of a family `page` has under a newer name.
fn shadowed(page: &Page, name: &str) -> bool {
    ALIASES.iter().any(|group| {
        group.iter().position(|n| *n == name).is_some_and(|i| {
            group[..i]
                .iter()
                .any(|newer| page.named(newer).next().is_some())
        })
    })
}

/// The pod an EPP worker key (`namespace/endpoint_name:port`) names.
fn endpoint_name_of(worker: &str) -> &str {
    let name = worker.rsplit('/').next().unwrap_or(worker);
    name.split(':').next().unwrap_or(name)
}

/// The worker an EPP series names: `namespace/endpoint_name:port`, the parts it has.
fn epp_endpoint(page: &Page, s: &super::parse::Sample) -> Option<String> {
    let name = page.label(s, "endpoint_name")?;
    let mut w = match page.label(s, "namespace") {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.into_owned(),
    };
    if let Some(port) = page.label(s, "port").filter(|p| !p.is_empty()) {
        w = format!("{w}:{port}");
    }
    Some(w)
}

/// A worker's circuit breaker as the router says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Breaker {
    /// 0: requests flow.
    Closed,
    /// 1: the router sends the worker nothing.
    Open,
    /// 2: the router lets a probe request through.
    HalfOpen,
}

impl Breaker {
    fn from_gauge(v: f64) -> Option<Breaker> {
        match v.round() as i64 {
            0 => Some(Breaker::Closed),
            1 => Some(Breaker::Open),
            2 => Some(Breaker::HalfOpen),
            _ => None,
        }
    }
}

/// One worker on one router page; each field `None` when the page does not say it.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterWorkerReading {
    /// The `worker` label: the worker's URL as the router was given it.
    pub worker: String,
    /// Picks since the router started (cumulative).
    pub picks_total: Option<f64>,
    pub healthy: Option<bool>,
    pub breaker: Option<Breaker>,
    pub load: Option<f64>,
    /// Requests waiting in the worker's queue as the router sees it (llm-d's picker).
    pub queue: Option<f64>,
}

/// Every worker any of [`NAMES`] names on `page`, sorted by worker; `None` when the page has
/// none of them (not a router page lmperf reads).
pub fn router_worker_readings(page: &Page) -> Option<Vec<RouterWorkerReading>> {
    let mut out: Vec<RouterWorkerReading> = Vec::new();
    for name in NAMES.into_iter().filter(|n| !shadowed(page, n)) {
        for s in page.named(name) {
            let queue_of = match name {
                EPP_QUEUE | EPP_ROUTER_QUEUE => page.label(s, "model_server_endpoint"),
                GIE_POD_QUEUE => page.label(s, "model_server_pod"),
                _ => None,
            };
            let worker = match name {
                EPP_ATTEMPTS | EPP_ROUTER_ATTEMPTS => {
                    if page.label(s, "status").as_deref() != Some("success") {
                        continue;
                    }
                    epp_endpoint(page, s)
                }
                EPP_QUEUE | EPP_ROUTER_QUEUE | GIE_POD_QUEUE => queue_of.as_ref().map(|e| {
                    out.iter()
                        .find(|r| endpoint_name_of(&r.worker) == e.as_ref())
                        .map_or_else(|| e.to_string(), |r| r.worker.clone())
                }),
                _ => page.label(s, "worker").map(std::borrow::Cow::into_owned),
            };
            let Some(worker) = worker else {
                continue;
            };
            let i = match out.iter().position(|r| r.worker == worker) {
                Some(i) => i,
                None => {
                    out.push(RouterWorkerReading {
                        worker,
                        picks_total: None,
                        healthy: None,
                        breaker: None,
                        load: None,
                        queue: None,
                    });
                    out.len() - 1
                }
            };
            let r = &mut out[i];
            match name {
                PROCESSED | EPP_ATTEMPTS | EPP_ROUTER_ATTEMPTS => {
                    r.picks_total = Some(r.picks_total.unwrap_or(0.0) + s.value);
                }
                EPP_QUEUE | EPP_ROUTER_QUEUE | GIE_POD_QUEUE => {
                    r.queue = Some(r.queue.unwrap_or(0.0) + s.value);
                }
                HEALTH | SMG_HEALTH => r.healthy = Some(s.value >= 0.5),
                CB_STATE | SMG_CB_STATE => r.breaker = Breaker::from_gauge(s.value),
                _ => r.load = Some(s.value),
            }
        }
    }
    out.sort_by(|a, b| a.worker.cmp(&b.worker));
    (!out.is_empty()).then_some(out)
}

/// One worker's picks over a scrape interval, with what the router says of it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RouterPick {
    /// The worker's URL (the router's `worker` label).
    pub worker: String,
    /// Picks in the interval (a counter reset: the picks since the restart); `None` when the
    /// page has no pick counter for the worker or this is the first page.
    pub picks: Option<f64>,
    /// `picks` ÷ all workers' picks in the interval, 0..1; `None` with no pick in it.
    pub share: Option<f64>,
    /// 1 ÷ the workers the router may pick (healthy or unsaid, circuit not open) when this one
    /// is among them, else 0: its share were the workers equal.
    pub fair_share: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker: Option<Breaker>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
    /// Requests waiting in the worker's queue as the router sees it (llm-d's picker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<f64>,
}

impl RouterWorkerReading {
    fn pickable(&self) -> bool {
        self.healthy != Some(false) && self.breaker != Some(Breaker::Open)
    }
}

/// Each worker of `cur` with its picks since `prev` (the previous page's readings of the same
/// router; `None` on the first page) and its share of them.
pub fn router_picks(
    prev: Option<&[RouterWorkerReading]>,
    cur: &[RouterWorkerReading],
) -> Vec<RouterPick> {
    // A router that counts picks (vllm-router, llm-d) creates a worker's series at its first
    // pick: a worker it lists without one has had none.
    let counts = |r: &[RouterWorkerReading]| r.iter().any(|c| c.picks_total.is_some());
    let total_of = |r: &RouterWorkerReading, page: &[RouterWorkerReading]| {
        r.picks_total.or(counts(page).then_some(0.0))
    };
    let picks: Vec<Option<f64>> = cur
        .iter()
        .map(|c| {
            let prev = prev?;
            let p = prev.iter().find(|p| p.worker == c.worker);
            // A worker new on this page: its picks since it appeared are its whole counter.
            let before = p.map_or(Some(0.0), |p| total_of(p, prev))?;
            let now = total_of(c, cur)?;
            // A counter that went back: the router restarted, its picks since are the count.
            Some(if now < before { now } else { now - before })
        })
        .collect();
    let total: f64 = picks.iter().flatten().sum();
    let pickable = cur.iter().filter(|c| c.pickable()).count();
    cur.iter()
        .zip(picks)
        .map(|(c, n)| RouterPick {
            worker: c.worker.clone(),
            picks: n,
            share: n.filter(|_| total > 0.0).map(|n| n / total),
            fair_share: if c.pickable() && pickable > 0 {
                1.0 / pickable as f64
            } else {
                0.0
            },
            healthy: c.healthy,
            breaker: c.breaker,
            load: c.load,
            queue: c.queue,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    fn page(name: &str) -> Vec<RouterWorkerReading> {
        let text = match name {
            "a" => include_str!("../../../../tests/fixtures/server/vllm-router.a.prom"),
            _ => include_str!("../../../../tests/fixtures/server/vllm-router.b.prom"),
        };
        router_worker_readings(&parse(text).expect("page")).expect("a router page")
    }

    /// The live 0.1.17 pages: 3 and 2 picks round-robin, then the killed worker's breaker open
    /// while it still got half the picks (12 of 22 in the interval, the router retrying them).
    #[test]
    fn vllm_router_pages_give_each_workers_picks_and_share() {
        let (a, b) = (page("a"), page("b"));
        let first = |r: &RouterWorkerReading| (r.worker.clone(), r.picks_total, r.healthy);
        assert_eq!(
            a.iter().map(first).collect::<Vec<_>>(),
            [
                ("http://127.0.0.1:18101".to_owned(), Some(3.0), Some(true)),
                ("http://127.0.0.1:18102".to_owned(), Some(2.0), Some(true)),
            ]
        );
        assert!(
            a.iter()
                .all(|r| r.breaker == Some(Breaker::Closed) && r.load.is_none())
        );
        let p = router_picks(Some(&a), &b);
        assert_eq!(p[0].picks, Some(12.0));
        assert_eq!(p[1].picks, Some(10.0));
        assert_eq!(p[0].share, Some(12.0 / 22.0));
        assert_eq!(p[1].share, Some(10.0 / 22.0));
        assert_eq!(p[1].breaker, Some(Breaker::Open));
        // The open breaker leaves one worker to pick.
        assert_eq!((p[0].fair_share, p[1].fair_share), (1.0, 0.0));
        // The first page: counts but no interval.
        let first_page = router_picks(None, &a);
        assert!(
            first_page
                .iter()
                .all(|p| p.picks.is_none() && p.share.is_none())
        );
        assert_eq!(first_page[0].fair_share, 0.5);
    }

    /// llm-d's endpoint picker: the successful scheduling attempts per endpoint, summed over
    /// its models; failed attempts are no pick.
    #[test]
    fn llm_d_epp_attempts_are_picks_per_endpoint() {
        let text = "llm_d_epp_scheduler_attempts_total{status=\"success\",target_model_name=\"m\",endpoint_name=\"vllm-0\",namespace=\"ml\",port=\"8000\"} 85\n\
                    llm_d_epp_scheduler_attempts_total{status=\"success\",target_model_name=\"m2\",endpoint_name=\"vllm-0\",namespace=\"ml\",port=\"8000\"} 5\n\
                    llm_d_epp_scheduler_attempts_total{status=\"failure\",target_model_name=\"m\",endpoint_name=\"vllm-1\",namespace=\"ml\",port=\"8000\"} 7\n\
                    llm_d_epp_scheduler_attempts_total{status=\"success\",target_model_name=\"m\",endpoint_name=\"vllm-1\",namespace=\"ml\",port=\"8000\"} 10\n";
        let r = router_worker_readings(&parse(text).expect("page")).expect("an EPP page");
        let got: Vec<(&str, Option<f64>)> = r
            .iter()
            .map(|w| (w.worker.as_str(), w.picks_total))
            .collect();
        assert_eq!(
            got,
            [
                ("ml/vllm-0:8000", Some(90.0)),
                ("ml/vllm-1:8000", Some(10.0))
            ]
        );
        let zero: Vec<RouterWorkerReading> = r
            .iter()
            .map(|w| RouterWorkerReading {
                picks_total: Some(0.0),
                ..w.clone()
            })
            .collect();
        let p = router_picks(Some(&zero), &r);
        assert_eq!((p[0].share, p[1].share), (Some(0.9), Some(0.1)));
        assert_eq!((p[0].fair_share, p[1].fair_share), (0.5, 0.5));
    }

    /// The picker's newer subsystem (`llm_d_router_epp`): the same picks; each endpoint's queue
    /// goes to the worker whose pod it names, in both subsystems and the older Gateway API
    /// Inference Extension name; an endpoint with a queue but no pick yet is a worker of its own.
    #[test]
    fn llm_d_router_epp_picks_and_queues_per_endpoint() {
        let text = "llm_d_router_epp_scheduler_attempts_total{status=\"success\",target_model_name=\"m\",endpoint_name=\"vllm-0-rank-0\",namespace=\"ml\",port=\"8000\"} 4\n\
                    llm_d_router_epp_per_endpoint_queue_size{name=\"pool\",model_server_endpoint=\"vllm-0-rank-0\"} 7\n\
                    llm_d_router_epp_per_endpoint_queue_size{name=\"pool\",model_server_endpoint=\"vllm-1-rank-0\"} 0\n";
        let r = router_worker_readings(&parse(text).expect("page")).expect("an EPP page");
        let got: Vec<(&str, Option<f64>, Option<f64>)> = r
            .iter()
            .map(|w| (w.worker.as_str(), w.picks_total, w.queue))
            .collect();
        assert_eq!(
            got,
            [
                ("ml/vllm-0-rank-0:8000", Some(4.0), Some(7.0)),
                ("vllm-1-rank-0", None, Some(0.0))
            ]
        );
        let gie = "llm_d_epp_scheduler_attempts_total{status=\"success\",target_model_name=\"m\",endpoint_name=\"p0\",namespace=\"ml\",port=\"8000\"} 1\n\
                   inference_pool_per_pod_queue_size{name=\"pool\",model_server_pod=\"p0\"} 3\n";
        let r = router_worker_readings(&parse(gie).expect("page")).expect("an EPP page");
        assert_eq!((r.len(), r[0].queue), (1, Some(3.0)));
        // Old and new names side by side: read once, not summed.
        let both = format!(
            "{gie}llm_d_epp_per_endpoint_queue_size{{name=\"pool\",model_server_endpoint=\"p0\"}} 3\n"
        );
        let r = router_worker_readings(&parse(&both).expect("page")).expect("an EPP page");
        assert_eq!(
            (r.len(), r[0].queue, r[0].picks_total),
            (1, Some(3.0), Some(1.0))
        );
        assert_eq!(router_picks(None, &r)[0].queue, Some(3.0));
    }

    /// SGLang's gateway: health, breaker and running requests per worker, no picks (no share),
    /// the workers the gateway may pick still counted for the fair share.
    #[test]
    fn smg_gauges_per_worker() {
        let text = "smg_worker_health{worker=\"http://w1:8000\"} 1\n\
                    smg_worker_health{worker=\"http://w2:8000\"} 0\n\
                    smg_worker_cb_state{worker=\"http://w1:8000\"} 2\n\
                    smg_worker_requests_active{worker=\"http://w1:8000\"} 3\n";
        let r = router_worker_readings(&parse(text).expect("page")).expect("an smg page");
        // No pick counter on the page: no worker's picks are known.
        assert_eq!(r[0].worker, "http://w1:8000");
        assert_eq!(
            (r[0].healthy, r[0].breaker, r[0].load, r[0].picks_total),
            (Some(true), Some(Breaker::HalfOpen), Some(3.0), None)
        );
        assert_eq!(r[1].healthy, Some(false));
        let p = router_picks(Some(&r), &r);
        assert_eq!(
            (p[0].share, p[0].fair_share, p[1].fair_share),
            (None, 1.0, 0.0)
        );
    }

    /// A restarted router's counters start over; a worker new on the page counts whole; a
    /// page from another server says nothing.
    #[test]
    fn reset_new_worker_and_absent() {
        let w = |worker: &str, n: f64| RouterWorkerReading {
            worker: worker.to_owned(),
            picks_total: Some(n),
            healthy: None,
            breaker: None,
            load: None,
            queue: None,
        };
        let p = router_picks(Some(&[w("a", 100.0)]), &[w("a", 3.0), w("b", 1.0)]);
        assert_eq!((p[0].picks, p[1].picks), (Some(3.0), Some(1.0)));
        assert_eq!(p[0].share, Some(0.75));
        let idle = router_picks(Some(&[w("a", 3.0)]), &[w("a", 3.0)]);
        assert_eq!((idle[0].picks, idle[0].share), (Some(0.0), None));
        // A worker the router lists (its health) but never picked: no series yet, 0 picks.
        let never = RouterWorkerReading {
            picks_total: None,
            healthy: Some(true),
            ..w("c", 0.0)
        };
        let p = router_picks(Some(&[w("a", 1.0), never.clone()]), &[w("a", 5.0), never]);
        assert_eq!((p[1].picks, p[1].share), (Some(0.0), Some(0.0)));
        assert_eq!(p[0].share, Some(1.0));
        let vllm = parse("vllm:num_requests_running{engine=\"0\"} 1\n").expect("page");
        assert_eq!(router_worker_readings(&vllm), None);
    }
}
