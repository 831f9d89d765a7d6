//! The OpenMetrics writer over a real meter provider and Prometheus exporter: same series as
//! the classic encoder, exemplars on the right bucket lines only, valid framing.

use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;

use super::*;
use crate::telemetry::names as n;

const PROMETHEUS_2_42_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

#[test]
fn accept_negotiation() {
    assert!(prefers_openmetrics(Some(PROMETHEUS_2_42_ACCEPT)));
    assert!(prefers_openmetrics(Some(
        "application/openmetrics-text; version=1.0.0"
    )));
    for classic in [
        None,
        Some("*/*"),
        Some("text/plain"),
        Some("text/plain;version=0.0.4"),
        Some("text/plain;version=0.0.4;q=0.5,application/openmetrics-text;version=1.0.0;q=0.3"),
        Some("application/openmetrics-text;q=0"),
    ] {
        assert!(!prefers_openmetrics(classic), "{classic:?}");
    }
}

fn provider() -> (SdkMeterProvider, prometheus::Registry) {
    let registry = prometheus::Registry::new();
    let exporter = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .build()
        .unwrap();
    let mp = SdkMeterProvider::builder()
        .with_resource(Resource::builder().with_service_name("lmperf").build())
        .with_reader(exporter)
        .build();
    (mp, registry)
}

#[test]
fn same_series_as_classic_with_exemplars_on_kept_buckets() {
    let (mp, registry) = provider();
    let meter = mp.meter("lmperf");
    let h = meter
        .f64_histogram(n::METRIC_OPERATION_DURATION)
        .with_unit("s")
        .with_description("GenAI operation duration.")
        .with_boundaries(n::BUCKETS_OPERATION_DURATION.to_vec())
        .build();
    let c = meter
        .u64_counter(n::METRIC_CANARY_REQUESTS)
        .with_unit("{request}")
        .with_description("Canary requests \"by\" outcome.")
        .build();
    let a = [
        KeyValue::new(n::LMPERF_TARGET, "a"),
        KeyValue::new(n::SERVER_PORT, 8000_i64),
    ];
    let b = [
        KeyValue::new(n::LMPERF_TARGET, "b"),
        KeyValue::new(n::SERVER_PORT, 8000_i64),
    ];
    for v in [0.005, 0.15, 0.15, 3.0, 100.0] {
        h.record(v, &a);
    }
    h.record(0.15, &b);
    c.add(3, &a);
    let store = ExemplarStore::default();
    let t = TraceId::from(0x0af7651916cd43dd8448eb211c80319c_u128);
    let s = SpanId::from(0xb7ad6b7169203331_u64);
    let end = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
    store.offer_request(
        &a,
        crate::telemetry::exemplars::KeptRequest {
            trace_id: t,
            span_id: s,
            end,
            e2e: Duration::from_millis(150),
            ttft: None,
        },
        std::iter::empty(),
    );
    c.add(2, &b);
    store.offer_counter(
        "lmperf_canary_requests_total",
        &b,
        TraceId::from(9_u128),
        s,
        end,
        1.0,
    );
    let t2 = TraceId::from(7_u128);
    store.offer_request(
        &a,
        crate::telemetry::exemplars::KeptRequest {
            trace_id: t2,
            span_id: s,
            end,
            e2e: Duration::from_secs(100),
            ttft: None,
        },
        std::iter::empty(),
    );

    let families = registry.gather();
    let om = encode(&families, &store);
    let mut classic = String::new();
    prometheus::TextEncoder::new()
        .encode_utf8(&families, &mut classic)
        .unwrap();

    assert!(om.ends_with("# EOF\n"), "{om}");
    assert_eq!(om.matches("# EOF").count(), 1);
    // Every classic sample is an OpenMetrics sample with the same series (exemplars aside;
    // classic writes infinity as `inf`).
    let series = |text: &str| -> Vec<String> {
        let mut v: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(" # ").next().unwrap_or(l).replace(" inf", " +Inf"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(series(&om), series(&classic));

    let fam = "gen_ai_client_operation_duration_seconds";
    assert!(
        om.contains(&format!(
            "# TYPE {fam} histogram\n# UNIT {fam} seconds\n# HELP {fam} GenAI operation duration.\n"
        )),
        "{om}"
    );
    assert!(
        om.contains("# TYPE lmperf_canary_requests counter\n"),
        "{om}"
    );
    assert!(
        om.contains("# HELP lmperf_canary_requests Canary requests \\\"by\\\" outcome.\n"),
        "{om}"
    );
    assert!(
        om.contains("\nlmperf_canary_requests_total{lmperf_target=\"a\","),
        "{om}"
    );
    assert!(
        om.contains("# TYPE target info\n# HELP target Target metadata\ntarget_info{"),
        "{om}"
    );

    let with_ex: Vec<&str> = om
        .lines()
        .filter(|l| l.contains(" # {") && l.starts_with(fam))
        .collect();
    assert_eq!(with_ex.len(), 2, "{with_ex:#?}");
    // The counter's exemplar on its series' line, the other series none.
    let counter: Vec<&str> = om
        .lines()
        .filter(|l| l.starts_with("lmperf_canary_requests_total{"))
        .collect();
    assert_eq!(counter.len(), 2, "{om}");
    assert!(
        counter.iter().any(|l| l.contains("lmperf_target=\"b\"")
            && l.ends_with("} 2 # {trace_id=\"00000000000000000000000000000009\",span_id=\"b7ad6b7169203331\"} 1 1700000000.250")),
        "{counter:#?}"
    );
    assert!(
        counter
            .iter()
            .any(|l| l.contains("lmperf_target=\"a\"") && !l.contains(" # ")),
        "{counter:#?}"
    );
    assert!(
        with_ex[0].starts_with(&format!("{fam}_bucket{{lmperf_target=\"a\",")),
        "{}",
        with_ex[0]
    );
    assert!(with_ex[0].contains(",le=\"0.16\"} 3 # {trace_id=\"0af7651916cd43dd8448eb211c80319c\",span_id=\"b7ad6b7169203331\"} 0.15 1700000000.250"), "{}", with_ex[0]);
    assert!(
        with_ex[1].contains(",le=\"+Inf\"} 5 # {trace_id=\"00000000000000000000000000000007\","),
        "{}",
        with_ex[1]
    );
    assert!(
        with_ex[1].ends_with("} 100 1700000000.250"),
        "{}",
        with_ex[1]
    );
    // Series b of the histogram has no kept canary: no exemplar.
    assert!(
        !om.lines()
            .any(|l| l.starts_with(fam) && l.contains("lmperf_target=\"b\"") && l.contains(" # "))
    );
}
