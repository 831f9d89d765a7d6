//! The workers a router says it routes to, from its own page: NVIDIA Dynamo's frontend exports
//! `dynamo_component_router_worker_registered{router_worker_id, worker_type, dp_rank}` (1 =
//! registered) for each worker and data-parallel rank its router holds (1.6.1, checked on a
//! live frontend's page: `tests/fixtures/server/dynamo-frontend.a.prom`). `router_worker_id`
//! is the worker's instance id in decimal, as `nvext.worker_id` names it in replies; the
//! series's own `worker_id` label is the frontend's component id, not a worker. A killed
//! worker's series leaves the page once its discovery lease expires (about 10 s with the file
//! backend, seen on 1.6.1).

use super::parse::Page;

/// The gauge read (Dynamo 1.6.1's router).
pub const WORKER_REGISTERED: &str = "dynamo_component_router_worker_registered";

/// One worker (and data-parallel rank) the router holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RouterWorker {
    /// Its instance id, decimal (`router_worker_id`).
    pub id: String,
    /// `worker_type`: `decode` (an aggregated worker is a decode worker to the router) or
    /// `prefill`; `None` when the label is absent.
    pub worker_type: Option<String>,
    pub dp_rank: Option<u32>,
}

/// The workers registered on `page` (value 1), sorted; `None` when the page has no
/// [`WORKER_REGISTERED`] series at all (not a Dynamo frontend with a router, or an older one),
/// so that "no worker registered" (`Some(empty)`) is told from "not said".
pub fn router_workers(page: &Page) -> Option<Vec<RouterWorker>> {
    let mut seen = false;
    let mut out = Vec::new();
    for s in page.named(WORKER_REGISTERED) {
        seen = true;
        if s.value < 0.5 {
            continue;
        }
        let Some(id) = page.label(s, "router_worker_id") else {
            continue;
        };
        out.push(RouterWorker {
            id: id.into_owned(),
            worker_type: page.label(s, "worker_type").map(|t| t.into_owned()),
            dp_rank: page.label(s, "dp_rank").and_then(|r| r.parse().ok()),
        });
    }
    out.sort();
    out.dedup();
    seen.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    /// A live 1.6.1 frontend's page names its two mocker workers, by the ids the replies use.
    #[test]
    fn a_dynamo_frontend_page_names_its_registered_workers() {
        let text = include_str!("../../../../tests/fixtures/server/dynamo-frontend.a.prom");
        let page = parse(text).expect("page");
        let w = router_workers(&page).expect("said");
        let ids: Vec<&str> = w.iter().map(|w| w.id.as_str()).collect();
        assert_eq!(ids, ["11590297227033109259", "15250009274595424523"]);
        assert!(w.iter().all(|w| w.worker_type.as_deref() == Some("decode")));
        assert!(w.iter().all(|w| w.dp_rank == Some(0)));
    }

    /// A series at 0 is not registered; a page without the gauge says nothing.
    #[test]
    fn unregistered_and_absent() {
        let text = "dynamo_component_router_worker_registered{router_worker_id=\"7\",worker_type=\"prefill\",dp_rank=\"1\"} 1\n\
                    dynamo_component_router_worker_registered{router_worker_id=\"8\",worker_type=\"decode\"} 0\n";
        let page = parse(text).expect("page");
        assert_eq!(
            router_workers(&page),
            Some(vec![RouterWorker {
                id: "7".into(),
                worker_type: Some("prefill".into()),
                dp_rank: Some(1),
            }])
        );
        let page = parse("vllm:num_requests_running 1\n").expect("page");
        assert_eq!(router_workers(&page), None);
    }
}
