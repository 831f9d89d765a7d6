//! `lmperf.server.*` observable instruments reading [`ServerState`]: collection (OTLP export,
//! `/metrics`) never scrapes a server. Only the normalized signals are exported, never the
//! server's whole page (cardinality). A signal the server lacks has no series, never 0.

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use super::interval::{LatencyStats, ServerSample};
use super::state::ServerState;
use crate::telemetry::names as n;
use lmperf_server_page::router_picks::RouterPick;

fn latest_each(state: &ServerState, mut f: impl FnMut(&ServerSample, &[KeyValue])) {
    for t in &state.targets {
        if let Some(s) = t.history().last() {
            f(s, &[KeyValue::new(n::LMPERF_TARGET, t.target.clone())]);
        }
    }
}

/// Registers every server instrument on `meter`, reading `state`.
pub fn register(meter: &Meter, state: Arc<ServerState>) {
    macro_rules! gauge {
        ($name:expr, $unit:expr, $desc:expr, $field:ident) => {{
            let st = state.clone();
            let _g = meter
                .f64_observable_gauge($name)
                .with_unit($unit)
                .with_description($desc)
                .with_callback(move |o| {
                    latest_each(&st, |s, a| {
                        if let Some(v) = s.$field {
                            o.observe(v, a)
                        }
                    })
                })
                .build();
        }};
    }
    gauge!(
        n::METRIC_SERVER_REQUESTS_RUNNING,
        "{request}",
        "Requests the model server is running, from its own metrics.",
        requests_running
    );
    gauge!(
        n::METRIC_SERVER_REQUESTS_WAITING,
        "{request}",
        "Requests queued in the model server, from its own metrics.",
        requests_waiting
    );
    gauge!(
        n::METRIC_SERVER_KV_CACHE_USAGE,
        "1",
        "Fraction of the model server's KV cache in use.",
        kv_cache_usage
    );
    gauge!(
        n::METRIC_SERVER_PREFIX_CACHE_HIT_RATIO,
        "1",
        "Prefix-cache hits over queries in the last scrape interval.",
        prefix_cache_hit_ratio
    );

    macro_rules! counter {
        ($name:expr, $unit:expr, $desc:expr, $field:ident) => {{
            let st = state.clone();
            let _c = meter
                .f64_observable_counter($name)
                .with_unit($unit)
                .with_description($desc)
                .with_callback(move |o| {
                    for t in &st.targets {
                        if let Some(v) = t.totals().$field {
                            o.observe(v, &[KeyValue::new(n::LMPERF_TARGET, t.target.clone())]);
                        }
                    }
                })
                .build();
        }};
    }
    counter!(
        n::METRIC_SERVER_PROMPT_TOKENS,
        "{token}",
        "Prompt tokens the model server processed since the agent started.",
        prompt_tokens
    );
    counter!(
        n::METRIC_SERVER_GENERATION_TOKENS,
        "{token}",
        "Tokens the model server generated since the agent started.",
        generation_tokens
    );
    counter!(
        n::METRIC_SERVER_REQUESTS,
        "{request}",
        "Requests the model server finished since the agent started.",
        requests
    );
    counter!(
        n::METRIC_SERVER_PREEMPTIONS,
        "{preemption}",
        "Requests the model server preempted since the agent started.",
        preemptions
    );

    let st = state.clone();
    let _l = meter
        .f64_observable_gauge(n::METRIC_SERVER_LATENCY)
        .with_unit("s")
        .with_description(
            "Server-side latency over the last scrape interval, from the server's histograms.",
        )
        .with_callback(move |o| {
            latest_each(&st, |s, a| {
                let phases: [(&'static str, &LatencyStats); 5] = [
                    ("ttft", &s.ttft),
                    ("itl", &s.itl),
                    ("queue", &s.queue),
                    ("prefill", &s.prefill),
                    ("decode", &s.decode),
                ];
                for (phase, l) in phases {
                    for (stat, v) in [("mean", l.mean), ("p50", l.p50), ("p99", l.p99)] {
                        if let Some(v) = v {
                            let mut kv = a.to_vec();
                            kv.push(KeyValue::new(n::LMPERF_SERVER_PHASE, phase));
                            kv.push(KeyValue::new(n::LMPERF_SERVER_STATISTIC, stat));
                            o.observe(v, &kv);
                        }
                    }
                }
            })
        })
        .build();

    let st = state.clone();
    let _c = meter
        .u64_observable_counter(n::METRIC_SERVER_CHANGES)
        .with_unit("{change}")
        .with_description("Server change events: version, model, model revision, restart, kind.")
        .with_callback(move |o| {
            for t in &st.targets {
                for (kind, count) in t.change_counts() {
                    o.observe(
                        count,
                        &[
                            KeyValue::new(n::LMPERF_TARGET, t.target.clone()),
                            KeyValue::new(n::LMPERF_SERVER_CHANGE_KIND, kind),
                        ],
                    );
                }
            }
        })
        .build();

    let st = state.clone();
    let _c = meter
        .u64_observable_counter(n::METRIC_SERVER_SCRAPES)
        .with_unit("{scrape}")
        .with_description("Scrapes of the model server's metrics page by result.")
        .with_callback(move |o| {
            for t in &st.targets {
                let v = t.view();
                let target = KeyValue::new(n::LMPERF_TARGET, t.target.clone());
                if v.mode != super::state::Mode::Off {
                    o.observe(
                        v.scrapes_ok,
                        &[
                            target.clone(),
                            KeyValue::new(n::LMPERF_SERVER_SCRAPE_RESULT, "ok"),
                        ],
                    );
                }
                for (reason, count) in v.failures {
                    o.observe(
                        count,
                        &[
                            target.clone(),
                            KeyValue::new(n::LMPERF_SERVER_SCRAPE_RESULT, reason),
                        ],
                    );
                }
            }
        })
        .build();

    let st = state;
    let _i = meter
        // No unit: an info metric is `lmperf_server_info`, not `…_info_ratio`.
        .u64_observable_gauge(n::METRIC_SERVER_INFO)
        .with_description("1 per scraped model server, with its kind, version and model.")
        .with_callback(move |o| {
            for t in &st.targets {
                let Some(kind) = t.kind() else { continue };
                let id = t.identity();
                o.observe(
                    1,
                    &[
                        KeyValue::new(n::LMPERF_TARGET, t.target.clone()),
                        KeyValue::new(n::LMPERF_SERVER_KIND, kind.as_str()),
                        KeyValue::new(n::LMPERF_SERVER_VERSION, id.version.unwrap_or_default()),
                        KeyValue::new(n::LMPERF_SERVER_MODEL, id.model.unwrap_or_default()),
                    ],
                );
            }
        })
        .build();
}

/// An endpoint picker's pool gauges (issue 52.3): flow control queue, saturation, ready
/// endpoints, by target.
pub fn register_picker_pool(meter: &Meter, state: &Arc<ServerState>) {
    type PoolGauge = (
        &'static str,
        &'static str,
        &'static str,
        fn(&lmperf_server_page::picker_pool::PickerPool) -> Option<f64>,
    );
    let gauges: [PoolGauge; 3] = [
        (
            n::METRIC_ROUTER_FLOW_CONTROL_QUEUE,
            "{request}",
            "Requests the endpoint picker's flow control holds in its queue, from its own metrics.",
            |p| p.flow_control_queue,
        ),
        (
            n::METRIC_ROUTER_POOL_SATURATION,
            "1",
            "The endpoint picker's most saturated pool, 0 (empty) to 1 (saturated), from its own metrics.",
            |p| p.saturation,
        ),
        (
            n::METRIC_ROUTER_READY_ENDPOINTS,
            "{endpoint}",
            "Endpoints the endpoint picker finds ready, from its own metrics.",
            |p| p.ready_endpoints,
        ),
    ];
    for (name, unit, desc, read) in gauges {
        sample_gauge(meter, state, (name, unit, desc), move |s, a, observe| {
            if let Some(v) = s.picker_pool.as_ref().and_then(read) {
                observe(v, a);
            }
        });
    }
    register_pool_load(meter, state);
}

/// A disaggregated deployment's pools as its router says them (issue 53): prompt tokens
/// queued on the prefill workers, KV blocks held on the decode workers, by target.
fn register_pool_load(meter: &Meter, state: &Arc<ServerState>) {
    type LoadGauge = (
        &'static str,
        &'static str,
        &'static str,
        fn(&lmperf_server_page::pool_load::PoolLoad) -> Option<f64>,
    );
    let gauges: [LoadGauge; 2] = [
        (
            n::METRIC_ROUTER_PREFILL_POOL_TOKENS,
            "{token}",
            "Prompt tokens queued on the prefill workers, from the router's own metrics (prefill/decode disaggregation).",
            |p| Some(p.prefill_tokens),
        ),
        (
            n::METRIC_ROUTER_DECODE_POOL_BLOCKS,
            "{block}",
            "KV blocks the decode workers' active sequences hold, from the router's own metrics (prefill/decode disaggregation).",
            |p| p.decode_blocks,
        ),
    ];
    for (name, unit, desc, read) in gauges {
        sample_gauge(meter, state, (name, unit, desc), move |s, a, observe| {
            if let Some(v) = s.pool_load.as_ref().and_then(read) {
                observe(v, a);
            }
        });
    }
}

/// An observable gauge `(name, unit, description)` whose callback passes each target's latest
/// sample and its attributes to `each`, which observes what it reads there.
fn sample_gauge(
    meter: &Meter,
    state: &Arc<ServerState>,
    (name, unit, desc): (&'static str, &'static str, &'static str),
    each: impl Fn(&ServerSample, &[KeyValue], &mut dyn FnMut(f64, &[KeyValue])) + Send + Sync + 'static,
) {
    let st = state.clone();
    let _g = meter
        .f64_observable_gauge(name)
        .with_unit(unit)
        .with_description(desc)
        .with_callback(move |o| {
            latest_each(&st, |s, a| each(s, a, &mut |v, kv| o.observe(v, kv)));
        })
        .build();
}

/// One per-worker router gauge: its name, unit, description and the value read from a pick.
type PickGauge = (
    &'static str,
    &'static str,
    &'static str,
    fn(&RouterPick) -> Option<f64>,
);

/// A router's picks per worker (issue 52.5): share, share were the workers equal, pickable.
pub fn register_router_picks(meter: &Meter, state: &Arc<ServerState>) {
    let shares: [PickGauge; 4] = [
        (
            n::METRIC_ROUTER_PICK_SHARE,
            "1",
            "Share of the router's picks that went to the worker over the last scrape interval, from the router's own metrics.",
            |p| p.share,
        ),
        (
            n::METRIC_ROUTER_FAIR_SHARE,
            "1",
            "The worker's share of the router's picks were its workers equal: 1 / the workers it may pick (healthy, circuit not open), 0 when this one is not among them.",
            |p| Some(p.fair_share),
        ),
        (
            n::METRIC_ROUTER_WORKER_PICKABLE,
            "1",
            "1 when the router says the worker is healthy and its circuit breaker is not open, else 0.",
            |p| {
                (p.healthy.is_some() || p.breaker.is_some())
                    .then(|| f64::from(u8::from(p.fair_share > 0.0)))
            },
        ),
        (
            n::METRIC_ROUTER_WORKER_QUEUE,
            "{request}",
            "Requests waiting in the worker's queue as the router sees it (llm-d's endpoint picker), from the router's own metrics.",
            |p| p.queue,
        ),
    ];
    for (name, unit, desc, read) in shares {
        sample_gauge(meter, state, (name, unit, desc), move |s, a, observe| {
            for p in &s.router_picks {
                if let Some(v) = read(p) {
                    let mut kv = a.to_vec();
                    kv.push(KeyValue::new(n::LMPERF_WORKER_ID, p.worker.clone()));
                    observe(v, &kv);
                }
            }
        });
    }
}
