//! Per-group blocks of a benchmark's summary: per LoRA adapter (`--lora-modules`), per
//! endpoint (`--target` repeated), per worker behind a router (`--target-kind router`) and the canary probes sent alongside the load
//! (`--probe-rate`). Each block is a small [`GroupSummary`] fed one request at a time
//! ([`GroupAcc`]), bounded like [`super::aggregate::Summarizer`] (one histogram per
//! distribution whatever the request count). Pure: no clock, no IO.

use std::collections::BTreeMap;

use serde::Serialize;

use super::accumulator::Accumulator;
use super::stats::Distribution;
use super::{Goodput, RequestRow};

/// One group's figures in `summary.json` (`benchmarks[].adapters.NAME`,
/// `benchmarks[].endpoints.URL`, `benchmarks[].probes`). Latencies of successful requests, ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GroupSummary {
    pub num_requests: usize,
    pub completed: usize,
    /// Failed requests by `error.type`.
    pub errors: BTreeMap<String, usize>,
    /// Failed / all (0 without requests).
    pub error_rate: f64,
    /// Completed requests per second over the group's own first send to last end.
    pub request_throughput: f64,
    pub total_output_tokens: u64,
    /// Fraction of the requests meeting every `--goodput` SLO (null without SLOs).
    pub goodput_ratio: Option<f64>,
    pub ttft_ms: Option<Distribution>,
    pub itl_ms: Option<Distribution>,
    pub tpot_ms: Option<Distribution>,
    pub e2el_ms: Option<Distribution>,
    /// Behind NVIDIA Dynamo: the TTFT of its successful requests split along the serving path
    /// (`requests.jsonl`'s `ttft_*_ms` segments); absent where no request carried a split.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_split: Option<TtftSplitSummary>,
}

/// The TTFT split of a group's requests that carried one, ms per segment
/// ([`crate::measure::server_timing::TtftSplit`]): each segment's distribution over those
/// requests (a segment's p99 need not come from the request with the p99 TTFT).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TtftSplitSummary {
    /// Requests that carried the split.
    pub requests: usize,
    pub frontend_ms: Option<Distribution>,
    pub router_queue_ms: Option<Distribution>,
    pub prefill_ms: Option<Distribution>,
    pub transfer_and_first_decode_ms: Option<Distribution>,
}

impl TtftSplitSummary {
    /// The segments' distributions in [`crate::measure::server_timing::TtftSplit::SEGMENTS`]
    /// order.
    pub fn segments(&self) -> [Option<&Distribution>; 4] {
        [
            self.frontend_ms.as_ref(),
            self.router_queue_ms.as_ref(),
            self.prefill_ms.as_ref(),
            self.transfer_and_first_decode_ms.as_ref(),
        ]
    }
}

impl GroupSummary {
    /// A `--fail-on` statistic of this block: `error_rate`, `goodput_ratio`, or a latency
    /// metric (`ttft`, `itl`, `tpot`, `e2el`) at `stat` (`p99`, `mean`, …). `None`: no value
    /// (no successful request, or no SLO for the goodput ratio).
    pub fn value(&self, metric: &str, stat: Option<&str>) -> Option<f64> {
        let d = match metric {
            "error_rate" => return (self.num_requests > 0).then_some(self.error_rate),
            "goodput_ratio" => return self.goodput_ratio,
            "ttft" => &self.ttft_ms,
            "itl" => &self.itl_ms,
            "tpot" => &self.tpot_ms,
            "e2el" => &self.e2el_ms,
            _ => return None,
        };
        d.as_ref().and_then(|d| d.get(stat.unwrap_or("mean")))
    }
}

/// One group's running figures.
#[derive(Debug, Clone, Default)]
pub struct GroupAcc {
    num_requests: usize,
    completed: usize,
    meets_goodput: usize,
    errors: BTreeMap<String, usize>,
    /// Per repeat: first send, last end (ms).
    spans: BTreeMap<usize, (f64, f64)>,
    total_output_tokens: u64,
    ttft_ms: Accumulator,
    itl_ms: Accumulator,
    tpot_ms: Accumulator,
    e2el_ms: Accumulator,
    /// Requests with a TTFT split, and each segment's values.
    split_n: usize,
    split: [Accumulator; 4],
}

impl GroupAcc {
    /// Adds one request; `goodput`: the SLOs it is checked against.
    pub fn push(&mut self, r: &RequestRow, goodput: Goodput) {
        self.num_requests += 1;
        let s = self.spans.entry(r.repeat).or_insert((f64::INFINITY, 0.0));
        *s = (s.0.min(r.send_ms), s.1.max(r.send_ms + r.e2el_ms));
        if r.outcome != "ok" {
            let t = r.error_type.clone().unwrap_or_else(|| r.outcome.to_owned());
            *self.errors.entry(t).or_insert(0) += 1;
            return;
        }
        self.completed += 1;
        self.total_output_tokens += r.output_tokens.unwrap_or(0);
        if goodput
            .ttft_ms
            .is_none_or(|s| r.ttft_ms.is_some_and(|v| v <= s))
            && goodput
                .tpot_ms
                .is_none_or(|s| r.tpot_ms.is_none_or(|v| v <= s))
            && goodput.e2el_ms.is_none_or(|s| r.e2el_ms <= s)
        {
            self.meets_goodput += 1;
        }
        if let Some(v) = r.ttft_ms {
            self.ttft_ms.record(v);
        }
        for v in &r.itl_ms {
            self.itl_ms.record(*v);
        }
        if let Some(v) = r.tpot_ms {
            self.tpot_ms.record(v);
        }
        self.e2el_ms.record(r.e2el_ms);
        if let Some(parts) = r.ttft_split() {
            self.split_n += 1;
            for (acc, v) in self.split.iter_mut().zip(parts) {
                acc.record(v);
            }
        }
    }

    /// The block; `goodput`: whether SLOs were set (else `goodput_ratio` is null).
    pub fn finish(&self, goodput: Goodput) -> GroupSummary {
        let duration_s = (self.spans.values().map(|(a, b)| b - a).sum::<f64>() / 1000.0).max(1e-9);
        let any_slo =
            goodput.ttft_ms.is_some() || goodput.tpot_ms.is_some() || goodput.e2el_ms.is_some();
        let failed = self.num_requests - self.completed;
        GroupSummary {
            num_requests: self.num_requests,
            completed: self.completed,
            errors: self.errors.clone(),
            error_rate: if self.num_requests == 0 {
                0.0
            } else {
                failed as f64 / self.num_requests as f64
            },
            request_throughput: if self.num_requests == 0 {
                0.0
            } else {
                self.completed as f64 / duration_s
            },
            total_output_tokens: self.total_output_tokens,
            goodput_ratio: (any_slo && self.num_requests > 0)
                .then(|| self.meets_goodput as f64 / self.num_requests as f64),
            ttft_ms: self.ttft_ms.distribution(),
            itl_ms: self.itl_ms.distribution(),
            tpot_ms: self.tpot_ms.distribution(),
            e2el_ms: self.e2el_ms.distribution(),
            ttft_split: (self.split_n > 0).then(|| {
                let [f, q, p, t] = &self.split;
                TtftSplitSummary {
                    requests: self.split_n,
                    frontend_ms: f.distribution(),
                    router_queue_ms: q.distribution(),
                    prefill_ms: p.distribution(),
                    transfer_and_first_decode_ms: t.distribution(),
                }
            }),
        }
    }
}

/// The per-adapter, per-endpoint and probe accumulators of one benchmark.
#[derive(Debug, Clone, Default)]
pub struct Groups {
    adapters: BTreeMap<String, GroupAcc>,
    endpoints: BTreeMap<String, GroupAcc>,
    workers: BTreeMap<String, GroupAcc>,
    probes: Option<GroupAcc>,
}

/// [`Groups::finish`]: the blocks, `None` where the run has no such group.
#[derive(Debug, Clone, Default)]
pub struct GroupBlocks {
    pub adapters: Option<BTreeMap<String, GroupSummary>>,
    pub endpoints: Option<BTreeMap<String, GroupSummary>>,
    pub workers: Option<BTreeMap<String, GroupSummary>>,
    pub probes: Option<GroupSummary>,
}

impl Groups {
    /// Adds `r` to its adapter's and endpoint's groups; a probe (`r.probe`) goes to the probes
    /// group only and returns `true` (the caller leaves it out of the benchmark's figures).
    pub fn push(&mut self, r: &RequestRow, goodput: Goodput) -> bool {
        if r.probe {
            self.probes
                .get_or_insert_with(GroupAcc::default)
                .push(r, goodput);
            return true;
        }
        if let Some(a) = &r.adapter {
            self.adapters.entry(a.clone()).or_default().push(r, goodput);
        }
        if let Some(e) = &r.endpoint {
            self.endpoints
                .entry(e.clone())
                .or_default()
                .push(r, goodput);
        }
        if let Some(w) = r.worker_key() {
            self.workers.entry(w).or_default().push(r, goodput);
        }
        false
    }

    pub fn finish(&self, goodput: Goodput) -> GroupBlocks {
        let map = |m: &BTreeMap<String, GroupAcc>| {
            (!m.is_empty()).then(|| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.finish(goodput)))
                    .collect()
            })
        };
        GroupBlocks {
            adapters: map(&self.adapters),
            endpoints: map(&self.endpoints),
            workers: map(&self.workers),
            probes: self.probes.as_ref().map(|p| p.finish(goodput)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(adapter: &str, endpoint: &str, ttft: f64, e2el: f64) -> RequestRow {
        RequestRow {
            outcome: "ok",
            adapter: Some(adapter.to_owned()),
            endpoint: Some(endpoint.to_owned()),
            ttft_ms: Some(ttft),
            e2el_ms: e2el,
            send_ms: 0.0,
            output_tokens: Some(4),
            ..RequestRow::default()
        }
    }

    #[test]
    fn groups_split_by_adapter_endpoint_and_probe() {
        let g = Goodput {
            ttft_ms: Some(150.0),
            ..Goodput::default()
        };
        let mut groups = Groups::default();
        assert!(!groups.push(&ok("a", "e1", 100.0, 1000.0), g));
        assert!(!groups.push(&ok("a", "e2", 120.0, 500.0), g));
        assert!(!groups.push(&ok("b", "e1", 200.0, 2000.0), g));
        let mut failed = ok("b", "e2", 0.0, 10.0);
        (failed.outcome, failed.error_type) = ("error", Some("http_500".to_owned()));
        assert!(!groups.push(&failed, g));
        let probe = RequestRow {
            probe: true,
            ..ok("x", "e1", 50.0, 60.0)
        };
        assert!(groups.push(&probe, g));
        let b = groups.finish(g);
        let a = b.adapters.as_ref().unwrap();
        assert_eq!(a.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!((a["a"].num_requests, a["a"].completed), (2, 2));
        assert_eq!(a["a"].ttft_ms.as_ref().unwrap().max, 120.0);
        assert_eq!(a["a"].goodput_ratio, Some(1.0));
        assert_eq!(a["b"].errors["http_500"], 1);
        assert_eq!(a["b"].error_rate, 0.5);
        assert_eq!(a["b"].goodput_ratio, Some(0.0));
        // 1 completed over the adapter's 0 → 2000 ms: 0.5 req/s.
        assert!((a["b"].request_throughput - 0.5).abs() < 1e-9);
        let e = b.endpoints.as_ref().unwrap();
        assert_eq!((e["e1"].num_requests, e["e2"].num_requests), (2, 2));
        let p = b.probes.unwrap();
        assert_eq!(
            (p.num_requests, p.value("ttft", Some("p99"))),
            (1, Some(50.0))
        );
        assert_eq!(
            Groups::default().finish(g).adapters,
            None,
            "no adapter: no block"
        );
    }
}
