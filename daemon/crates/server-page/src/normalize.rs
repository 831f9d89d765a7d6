//! Server-kind detection and the mapping of each server's metric names into one vocabulary
//! ([`Reading`]: gauges as read, counters and histograms cumulative as the server keeps them).
//!
//! Names checked against each server's source (see `tests/fixtures/server/README.md`):
//! vLLM `vllm/v1/metrics/loggers.py`, SGLang `python/sglang/srt/metrics/collector.py`, TGI
//! `router/src/` (`metrics::gauge!`/`histogram!` calls), llama.cpp `tools/server/server.cpp`
//! (`/metrics` handler). A name the page lacks stays `None`, never 0. Series of one metric
//! (per engine, per DP rank, per model) are summed, as PromQL's `sum` would; the KV usage
//! is the largest of them.

use serde::Serialize;

use super::parse::{MetricType, Page, Sample};

/// Which server wrote the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerKind {
    Vllm,
    Sglang,
    Tgi,
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// NVIDIA Dynamo's frontend (its router in front of workers): `dynamo_frontend_*`.
    Dynamo,
    Unknown,
}

impl ServerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::Tgi => "tgi",
            Self::LlamaCpp => "llama.cpp",
            Self::Dynamo => "dynamo",
            Self::Unknown => "unknown",
        }
    }

    /// Parses a `server_kind` config value (`vllm | sglang | tgi | llama.cpp | llamacpp`).
    pub fn from_config(s: &str) -> Option<Self> {
        match s {
            "vllm" => Some(Self::Vllm),
            "sglang" => Some(Self::Sglang),
            "tgi" => Some(Self::Tgi),
            "llama.cpp" | "llamacpp" => Some(Self::LlamaCpp),
            "dynamo" => Some(Self::Dynamo),
            _ => None,
        }
    }
}

/// The kind whose prefix most sample lines carry (`vllm:`, `sglang:`, `tgi_`, `llamacpp:`,
/// `dynamo_frontend_`; every well-formed line of the page counts, kept or not). A worker
/// behind Dynamo also exports `dynamo_component_*`, which names no kind: only the frontend
/// exports `dynamo_frontend_*`.
pub fn detect(page: &Page) -> ServerKind {
    let kinds = [
        ServerKind::Vllm,
        ServerKind::Sglang,
        ServerKind::Tgi,
        ServerKind::LlamaCpp,
        ServerKind::Dynamo,
    ];
    match page
        .prefix_lines
        .iter()
        .enumerate()
        .max_by_key(|(_, c)| **c)
    {
        Some((i, c)) if *c > 0 => kinds[i],
        _ => ServerKind::Unknown,
    }
}

/// Every metric family [`normalize`] reads, any kind (counters without `_total`, histograms
/// without `_bucket`/`_count`/`_sum`). Kept in step with `normalize` by the test
/// `reads_keeps_every_name_normalize_reads`.
const READ: &[&str] = &[
    // vLLM
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:num_preemptions",
    "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_hits",
    "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_queries",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:e2e_request_latency_seconds",
    // SGLang
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:cache_hit_rate",
    "sglang:num_retracted_requests",
    "sglang:prompt_tokens",
    "sglang:generation_tokens",
    "sglang:num_requests",
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:queue_time_seconds",
    "sglang:e2e_request_latency_seconds",
    // TGI
    "tgi_batch_current_size",
    "tgi_queue_size",
    "tgi_request_input_length",
    "tgi_request_generated_tokens",
    "tgi_request_count",
    "tgi_request_queue_duration",
    "tgi_batch_forward_duration",
    "tgi_request_duration",
    // llama.cpp
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "llamacpp:kv_cache_usage_ratio",
    "llamacpp:prompt_tokens_cached",
    "llamacpp:prompt_tokens",
    "llamacpp:tokens_predicted",
    "llamacpp:prompt_seconds",
    "llamacpp:tokens_predicted_seconds",
    // NVIDIA Dynamo's frontend (1.6.1: `dynamo.prometheus_names` `frontend_service`)
    "dynamo_frontend_inflight_requests",
    "dynamo_frontend_queued_requests",
    "dynamo_frontend_requests",
    "dynamo_frontend_output_tokens",
    "dynamo_frontend_time_to_first_token_seconds",
    "dynamo_frontend_inter_token_latency_seconds",
    "dynamo_frontend_request_duration_seconds",
    "dynamo_component_router_kv_hit_rate",
    "dynamo_component_router_kv_transfer_estimated_latency_seconds",
    // vLLM's NIXL KV connector (prefill/decode disaggregation): its transfers' duration
    // (`vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py`, `NixlPromMetrics`).
    VLLM_NIXL_XFER,
];

/// vLLM's NIXL connector's histogram of each KV transfer's duration, seconds ("Histogram of
/// transfer duration for NIXL KV Cache transfers."): the worker's own view of the transfer,
/// read into `router_kv_transfer` where no router's figure is on the page.
const VLLM_NIXL_XFER: &str = "vllm:nixl_xfer_time_seconds";

/// SGLang's model gateway's KV transfer window of a disaggregated request, seconds ("prefill
/// drain to decode send", lightseekorg/smg `describe_histogram!`; labels `backend_type`,
/// `model`, `runtime`): read into `router_kv_transfer` wherever a page has it.
const SMG_KV_TRANSFER: &str = "smg_pd_kv_transfer_duration_seconds";

/// Whether [`normalize`] reads samples named `name`: the filter of
/// [`parse_with`](super::parse::parse_with) on the scraper's path, so the families no signal
/// comes from (`_created`, request-size histograms, Python GC, HTTP handlers) are checked
/// but never stored.
pub fn reads(name: &str) -> bool {
    if name == "process_start_time_seconds"
        || name.starts_with(SMG_KV_TRANSFER)
        || name == super::workers::WORKER_REGISTERED
        || super::router_picks::NAMES.contains(&name)
        || super::picker_pool::reads(name)
        || name == super::pool_load::PREFILL_TOKENS
        || name == super::pool_load::DECODE_BLOCKS
    {
        return true;
    }
    if !super::parse::PREFIXES.iter().any(|p| name.starts_with(p))
        && !name.starts_with("dynamo_component_router_")
    {
        return false;
    }
    READ.contains(&name)
        || ["_bucket", "_count", "_sum", "_total"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .is_some_and(|base| READ.contains(&base))
}

/// A cumulative histogram: `(upper bound, cumulative count)` sorted by bound, the last bound
/// `+Inf`, plus `_count` and `_sum`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub count: f64,
    pub sum: f64,
}

/// Server counters, cumulative (as on the page).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub preemptions: Option<f64>,
    pub prefix_hits: Option<f64>,
    pub prefix_queries: Option<f64>,
    pub prompt_tokens: Option<f64>,
    pub generation_tokens: Option<f64>,
    pub requests: Option<f64>,
    /// llama.cpp: seconds spent on prompts / on generation (`prompt_seconds_total`,
    /// `tokens_predicted_seconds_total`).
    pub prompt_seconds: Option<f64>,
    pub generation_seconds: Option<f64>,
}

/// Server-side latency histograms, cumulative, in seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histograms {
    pub ttft: Option<Histogram>,
    pub itl: Option<Histogram>,
    pub queue: Option<Histogram>,
    pub prefill: Option<Histogram>,
    pub decode: Option<Histogram>,
    pub e2e: Option<Histogram>,
    /// A router's KV hit rate of its routing decisions (0..1 buckets).
    pub router_kv_hit_rate: Option<Histogram>,
    /// A router's estimated KV transfer latency, seconds.
    pub router_kv_transfer: Option<Histogram>,
}

/// One page in the common vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub kind: ServerKind,
    pub requests_running: Option<f64>,
    pub requests_waiting: Option<f64>,
    /// 0..1.
    pub kv_cache_usage: Option<f64>,
    /// A hit ratio the server computes itself (SGLang `cache_hit_rate`), 0..1.
    pub prefix_cache_hit_ratio: Option<f64>,
    pub counters: Counters,
    pub histograms: Histograms,
    /// `process_start_time_seconds` (Unix seconds).
    pub process_start_time_s: Option<f64>,
    /// A router's registered workers ([`super::workers::router_workers`]); `None` when the
    /// page does not say.
    pub router_workers: Option<Vec<super::workers::RouterWorker>>,
    /// What a router's page says of each worker it picks from
    /// ([`super::router_picks::router_worker_readings`]); `None` when the page does not say.
    pub router_worker_readings: Option<Vec<super::router_picks::RouterWorkerReading>>,
    /// An endpoint picker's pool figures ([`super::picker_pool::picker_pool`]); `None` when the
    /// page does not say.
    pub picker_pool: Option<super::picker_pool::PickerPool>,
    /// A disaggregated deployment's pools as its router's page says them
    /// ([`super::pool_load::pool_load`]); `None` when it does not (one pool).
    pub pool_load: Option<super::pool_load::PoolLoad>,
}

fn sum_of<'p, 'a: 'p>(it: impl Iterator<Item = &'p Sample<'a>>) -> Option<f64> {
    it.map(|s| s.value)
        .fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

fn max_of<'p, 'a: 'p>(it: impl Iterator<Item = &'p Sample<'a>>) -> Option<f64> {
    it.map(|s| s.value).fold(None, |acc: Option<f64>, v| {
        Some(acc.map_or(v, |a| a.max(v)))
    })
}

fn mean_of<'p, 'a: 'p>(it: impl Iterator<Item = &'p Sample<'a>>) -> Option<f64> {
    let (n, s) = it.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x.value));
    (n > 0).then(|| s / n as f64)
}

/// The sum over every series of the first name in `names` the page has (old and new names).
fn sum_first(page: &Page, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|n| sum_of(page.named(n)))
}

/// A counter under its `_total` name, or (OpenMetrics-less exporters) its bare name.
fn counter(page: &Page, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|n| {
        sum_of(page.named(n))
            .or_else(|| n.strip_suffix("_total").and_then(|b| sum_of(page.named(b))))
    })
}

/// The histogram `family` summed over its series, keeping only series whose labels include
/// every pair of `only`.
pub fn histogram(page: &Page, family: &str, only: &[(&str, &str)]) -> Option<Histogram> {
    let keep = |s: &&Sample| {
        only.iter()
            .all(|(k, v)| page.label(s, k).as_deref() == Some(*v))
    };
    let bucket = format!("{family}_bucket");
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for s in page.named(&bucket).filter(keep) {
        let Some(le) = page
            .label(s, "le")
            .and_then(|v| super::parse::parse_value(&v))
        else {
            continue;
        };
        if le.is_nan() {
            continue;
        }
        match buckets.iter_mut().find(|(b, _)| *b == le) {
            Some(b) => b.1 += s.value,
            None => buckets.push((le, s.value)),
        }
    }
    if buckets.is_empty() {
        return None;
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let count = sum_of(page.named(&format!("{family}_count")).filter(keep))
        .or_else(|| buckets.last().map(|b| b.1))
        .unwrap_or(0.0);
    let sum = sum_of(page.named(&format!("{family}_sum")).filter(keep)).unwrap_or(f64::NAN);
    Some(Histogram {
        buckets,
        count,
        sum,
    })
}

fn first_histogram(page: &Page, families: &[&str]) -> Option<Histogram> {
    families.iter().find_map(|f| histogram(page, f, &[]))
}

/// Maps a page into the vocabulary. `kind` overrides detection when set (`server_kind`).
pub fn normalize(page: &Page, kind: Option<ServerKind>) -> Reading {
    let kind = kind.unwrap_or_else(|| detect(page));
    let process_start_time_s = max_of(page.named("process_start_time_seconds"));
    let mut r = Reading {
        kind,
        requests_running: None,
        requests_waiting: None,
        kv_cache_usage: None,
        prefix_cache_hit_ratio: None,
        counters: Counters::default(),
        histograms: Histograms::default(),
        process_start_time_s,
        router_workers: super::workers::router_workers(page),
        router_worker_readings: super::router_picks::router_worker_readings(page),
        picker_pool: super::picker_pool::picker_pool(page),
        pool_load: super::pool_load::pool_load(page),
    };
    match kind {
        ServerKind::Vllm => {
            r.requests_running = sum_first(page, &["vllm:num_requests_running"]);
            r.requests_waiting = sum_first(page, &["vllm:num_requests_waiting"]);
            r.kv_cache_usage = max_of(page.named("vllm:kv_cache_usage_perc"))
                .or_else(|| max_of(page.named("vllm:gpu_cache_usage_perc")));
            r.counters = Counters {
                preemptions: counter(page, &["vllm:num_preemptions_total"]),
                prefix_hits: counter(
                    page,
                    &[
                        "vllm:prefix_cache_hits_total",
                        "vllm:gpu_prefix_cache_hits_total",
                    ],
                ),
                prefix_queries: counter(
                    page,
                    &[
                        "vllm:prefix_cache_queries_total",
                        "vllm:gpu_prefix_cache_queries_total",
                    ],
                ),
                prompt_tokens: counter(page, &["vllm:prompt_tokens_total"]),
                generation_tokens: counter(page, &["vllm:generation_tokens_total"]),
                requests: counter(page, &["vllm:request_success_total"]),
                ..Counters::default()
            };
            r.histograms = Histograms {
                ttft: first_histogram(page, &["vllm:time_to_first_token_seconds"]),
                itl: first_histogram(
                    page,
                    &[
                        "vllm:inter_token_latency_seconds",
                        "vllm:time_per_output_token_seconds",
                    ],
                ),
                queue: first_histogram(page, &["vllm:request_queue_time_seconds"]),
                prefill: first_histogram(page, &["vllm:request_prefill_time_seconds"]),
                decode: first_histogram(page, &["vllm:request_decode_time_seconds"]),
                e2e: first_histogram(page, &["vllm:e2e_request_latency_seconds"]),
                ..Histograms::default()
            };
        }
        ServerKind::Sglang => {
            r.requests_running = sum_first(page, &["sglang:num_running_reqs"]);
            r.requests_waiting = sum_first(page, &["sglang:num_queue_reqs"]);
            r.kv_cache_usage = max_of(page.named("sglang:token_usage"));
            r.prefix_cache_hit_ratio = mean_of(page.named("sglang:cache_hit_rate"));
            r.counters = Counters {
                preemptions: counter(page, &["sglang:num_retracted_requests_total"]),
                prompt_tokens: counter(page, &["sglang:prompt_tokens_total"]),
                generation_tokens: counter(page, &["sglang:generation_tokens_total"]),
                requests: counter(page, &["sglang:num_requests_total"]),
                ..Counters::default()
            };
            r.histograms = Histograms {
                ttft: first_histogram(page, &["sglang:time_to_first_token_seconds"]),
                itl: first_histogram(page, &["sglang:inter_token_latency_seconds"]),
                queue: first_histogram(page, &["sglang:queue_time_seconds"]),
                e2e: first_histogram(page, &["sglang:e2e_request_latency_seconds"]),
                ..Histograms::default()
            };
        }
        ServerKind::Tgi => {
            r.requests_running = sum_first(page, &["tgi_batch_current_size"]);
            r.requests_waiting = sum_first(page, &["tgi_queue_size"]);
            let input = histogram(page, "tgi_request_input_length", &[]);
            let generated = histogram(page, "tgi_request_generated_tokens", &[]);
            r.counters = Counters {
                prompt_tokens: input.map(|h| h.sum).filter(|s| s.is_finite()),
                generation_tokens: generated.map(|h| h.sum).filter(|s| s.is_finite()),
                requests: counter(page, &["tgi_request_count"]),
                ..Counters::default()
            };
            r.histograms = Histograms {
                queue: histogram(page, "tgi_request_queue_duration", &[]),
                prefill: histogram(page, "tgi_batch_forward_duration", &[("method", "prefill")]),
                decode: histogram(page, "tgi_batch_forward_duration", &[("method", "decode")]),
                e2e: histogram(page, "tgi_request_duration", &[]),
                ..Histograms::default()
            };
        }
        ServerKind::LlamaCpp => {
            r.requests_running = sum_first(page, &["llamacpp:requests_processing"]);
            r.requests_waiting = sum_first(page, &["llamacpp:requests_deferred"]);
            r.kv_cache_usage = max_of(page.named("llamacpp:kv_cache_usage_ratio"));
            r.counters = Counters {
                prefix_hits: counter(page, &["llamacpp:prompt_tokens_cached_total"]),
                prompt_tokens: counter(page, &["llamacpp:prompt_tokens_total"]),
                generation_tokens: counter(page, &["llamacpp:tokens_predicted_total"]),
                prompt_seconds: counter(page, &["llamacpp:prompt_seconds_total"]),
                generation_seconds: counter(page, &["llamacpp:tokens_predicted_seconds_total"]),
                ..Counters::default()
            };
            // prompt_tokens_total excludes cached tokens: queries = cached + processed.
            r.counters.prefix_queries = match (r.counters.prefix_hits, r.counters.prompt_tokens) {
                (Some(h), Some(p)) => Some(h + p),
                _ => None,
            };
        }
        ServerKind::Dynamo => {
            // The frontend's view of the serving path behind it (names as the installed
            // 1.6.1 `dynamo/prometheus_names.py` and a live frontend's page have them):
            // requests in flight to the workers, those waiting for their first response.
            r.requests_running = sum_first(page, &["dynamo_frontend_inflight_requests"]);
            r.requests_waiting = sum_first(page, &["dynamo_frontend_queued_requests"]);
            r.counters = Counters {
                generation_tokens: counter(page, &["dynamo_frontend_output_tokens_total"]),
                requests: counter(page, &["dynamo_frontend_requests_total"]),
                ..Counters::default()
            };
            r.histograms = Histograms {
                ttft: first_histogram(page, &["dynamo_frontend_time_to_first_token_seconds"]),
                itl: first_histogram(page, &["dynamo_frontend_inter_token_latency_seconds"]),
                e2e: first_histogram(page, &["dynamo_frontend_request_duration_seconds"]),
                // Its KV router's own view (1.6.1 `prometheus_names.py` `router`, summed
                // over the frontend's routers): what the cache saved, what a transfer costs.
                router_kv_hit_rate: first_histogram(page, &["dynamo_component_router_kv_hit_rate"]),
                router_kv_transfer: first_histogram(
                    page,
                    &["dynamo_component_router_kv_transfer_estimated_latency_seconds"],
                ),
                ..Histograms::default()
            };
        }
        ServerKind::Unknown => {}
    }
    if r.histograms.router_kv_transfer.is_none() {
        r.histograms.router_kv_transfer = first_histogram(page, &[SMG_KV_TRANSFER, VLLM_NIXL_XFER]);
    }
    r
}

/// Whether `name` is typed as a counter on the page (for the unknown kind's reset check).
pub fn is_counter(page: &Page, name: &str) -> bool {
    let family = name.strip_suffix("_total").unwrap_or(name);
    matches!(
        page.metric_type(family).or_else(|| page.metric_type(name)),
        Some(MetricType::Counter)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    #[test]
    fn detects_kind_by_prefix_majority() {
        assert_eq!(
            detect(&parse("vllm:a 1\nvllm:b 2\nprocess_start_time_seconds 3\n").unwrap()),
            ServerKind::Vllm
        );
        assert_eq!(
            detect(&parse("llamacpp:requests_processing 1\n").unwrap()),
            ServerKind::LlamaCpp
        );
        assert_eq!(
            detect(&parse("tgi_queue_size 1\ntgi_batch_current_size 2\nsglang:x 1\n").unwrap()),
            ServerKind::Tgi
        );
        assert_eq!(
            detect(&parse("go_goroutines 5\n").unwrap()),
            ServerKind::Unknown
        );
    }

    #[test]
    fn sums_series_and_merges_buckets_across_engines() {
        let page = parse(concat!(
            "vllm:num_requests_waiting{engine=\"0\"} 3\nvllm:num_requests_waiting{engine=\"1\"} 4\n",
            "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n",
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\"} 2\nvllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\"} 1\n",
            "vllm:time_to_first_token_seconds_bucket{engine=\"1\",le=\"0.1\"} 5\nvllm:time_to_first_token_seconds_bucket{engine=\"1\",le=\"+Inf\"} 6\n",
            "vllm:time_to_first_token_seconds_count{engine=\"0\"} 2\nvllm:time_to_first_token_seconds_count{engine=\"1\"} 6\n",
        ))
        .unwrap();
        let r = normalize(&page, None);
        assert_eq!(r.requests_waiting, Some(7.0));
        assert_eq!(r.requests_running, None);
        assert_eq!(r.kv_cache_usage, Some(0.75));
        let h = r.histograms.ttft.unwrap();
        assert_eq!(h.buckets, vec![(0.1, 6.0), (f64::INFINITY, 8.0)]);
        assert_eq!(h.count, 8.0);
        assert!(h.sum.is_nan());
    }

    /// A live Dynamo 1.6.1 frontend's page (1,000 lines, most `dynamo_component_*` that name
    /// no kind) reads as `dynamo`: its in-flight and queued requests, its request and output
    /// token counters, its TTFT histogram.
    #[test]
    fn a_dynamo_frontend_page_reads_as_dynamo() {
        let text = include_str!("../../../../tests/fixtures/server/dynamo-frontend.a.prom");
        let page = parse(text).unwrap();
        assert_eq!(detect(&page), ServerKind::Dynamo);
        let r = normalize(&page, None);
        assert_eq!(r.kind.as_str(), "dynamo");
        assert_eq!(
            (r.requests_running, r.requests_waiting),
            (Some(0.0), Some(0.0))
        );
        assert_eq!(
            (r.counters.requests, r.counters.generation_tokens),
            (Some(4.0), Some(11.0))
        );
        assert_eq!(r.histograms.ttft.map(|h| h.count), Some(4.0));
        // Its KV router: 4 routing decisions, no transfer estimated (aggregated workers).
        assert_eq!(
            r.histograms.router_kv_hit_rate.as_ref().map(|h| h.count),
            Some(4.0)
        );
        assert_eq!(r.histograms.router_kv_transfer.map(|h| h.count), Some(0.0));
        let ids: Vec<String> = r
            .router_workers
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.id)
            .collect();
        assert_eq!(ids, ["11590297227033109259", "15250009274595424523"]);
        assert_eq!(ServerKind::from_config("dynamo"), Some(ServerKind::Dynamo));
    }

    #[test]
    fn smg_kv_transfer_is_the_routers_kv_transfer() {
        let text = "smg_pd_kv_transfer_duration_seconds_bucket{backend_type=\"grpc\",model=\"m\",runtime=\"vllm\",le=\"0.05\"} 2\n\
                    smg_pd_kv_transfer_duration_seconds_bucket{backend_type=\"grpc\",model=\"m\",runtime=\"vllm\",le=\"+Inf\"} 3\n\
                    smg_pd_kv_transfer_duration_seconds_sum{backend_type=\"grpc\",model=\"m\",runtime=\"vllm\"} 0.21\n\
                    smg_pd_kv_transfer_duration_seconds_count{backend_type=\"grpc\",model=\"m\",runtime=\"vllm\"} 3\n\
                    smg_worker_requests_active{worker=\"http://w1:8000\"} 1\n";
        let kept = crate::parse::parse_with(text, reads).unwrap();
        let h = normalize(&kept, None)
            .histograms
            .router_kv_transfer
            .expect("read");
        assert_eq!((h.count, h.sum), (3.0, 0.21));
    }

    #[test]
    fn vllms_nixl_transfer_time_is_the_kv_transfer() {
        let text = "vllm:nixl_xfer_time_seconds_bucket{engine=\"0\",model_name=\"m\",le=\"0.05\"} 4\n\
                    vllm:nixl_xfer_time_seconds_bucket{engine=\"0\",model_name=\"m\",le=\"+Inf\"} 5\n\
                    vllm:nixl_xfer_time_seconds_sum{engine=\"0\",model_name=\"m\"} 0.12\n\
                    vllm:nixl_xfer_time_seconds_count{engine=\"0\",model_name=\"m\"} 5\n\
                    vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1\n";
        let kept = crate::parse::parse_with(text, reads).unwrap();
        let h = normalize(&kept, None)
            .histograms
            .router_kv_transfer
            .expect("read");
        assert_eq!((h.count, h.sum), (5.0, 0.12));
    }

    #[test]
    fn reads_keeps_every_name_normalize_reads() {
        // Each fixture normalized from every sample and from the `reads` samples only: the
        // same reading (Debug, as a NaN histogram sum is not equal to itself).
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../tests/fixtures/server/"
        );
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_none_or(|x| x != "prom") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let all = parse(&text).unwrap();
            let kept = crate::parse::parse_with(&text, reads).unwrap();
            assert!(kept.samples.len() <= all.samples.len(), "{path:?}");
            assert_eq!(
                format!("{:?}", normalize(&all, None)),
                format!("{:?}", normalize(&kept, None)),
                "{path:?}"
            );
            n += 1;
        }
        assert_eq!(n, 14);
        assert!(reads("vllm:time_to_first_token_seconds_bucket") && reads("tgi_request_count"));
        assert!(
            !reads("vllm:prompt_tokens_created") && !reads("python_gc_objects_collected_total")
        );
    }
}
