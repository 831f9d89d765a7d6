//! `../shared/cases/other/27_otel_python_4946_genai_histogram_buckets.json`: every GenAI
//! histogram has the conventions' explicit boundaries (in seconds for times), and samples land
//! in `(b[i-1], b[i]]`, as read back from the exported `/metrics` page.

use std::time::{Duration, SystemTime};

use super::Instruments;
use super::MetricContext;
use crate::config::{self, Env, Overrides};
use crate::measure::Measured;
use crate::measure::{Outcome, RequestError, RequestRecord};
use crate::telemetry::{Telemetry, names as n};

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

fn case() -> serde_json::Value {
    let text = include_str!(
        "../../../tests/fixtures/cases/other/27_otel_python_4946_genai_histogram_buckets.json"
    );
    serde_json::from_str(text).expect("case 27")
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

fn record(i: &Instruments, model: &str, r: RequestRecord) {
    let c = MetricContext {
        target: "t",
        operation: "chat",
        provider: "openai",
        request_model: model,
        server_address: "127.0.0.1",
        server_port: 1,
        labels: &[],
    };
    i.record(
        &c,
        &Measured {
            record: r,
            wall_start: SystemTime::now(),
            retries: 0,
            conn: None,
        },
    );
}

fn ok(e2e: Duration) -> RequestRecord {
    let mut r = RequestRecord::failed(Outcome::Ok, RequestError::new("none", None), None, e2e);
    r.error = None;
    r
}

/// Per-bucket counts (not cumulative) and the `le` bounds of `family`'s series for `model`.
fn buckets(text: &str, family: &str, model: &str) -> (Vec<f64>, Vec<u64>) {
    let prefix = format!("{family}_bucket{{");
    let mut pairs: Vec<(f64, u64)> = text
        .lines()
        .filter(|l| {
            l.starts_with(&prefix) && l.contains(&format!("gen_ai_request_model=\"{model}\""))
        })
        .map(|l| {
            let le = l
                .split("le=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .expect("le");
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().expect("le number")
            };
            (
                bound,
                l.rsplit(' ')
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("count"),
            )
        })
        .collect();
    assert!(
        !pairs.is_empty(),
        "no {family} series for {model} in:\n{text}"
    );
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let bounds = pairs
        .iter()
        .map(|p| p.0)
        .filter(|b| b.is_finite())
        .collect();
    let mut prev = 0;
    let counts = pairs
        .iter()
        .map(|(_, c)| {
            let d = c - prev;
            prev = *c;
            d
        })
        .collect();
    (bounds, counts)
}

#[tokio::test]
async fn case_27_otel_python_4946_genai_histogram_buckets() {
    let c = case();
    let (input, want) = (&c["input"], &c["expected"]);
    assert_eq!(input["unit"], "s");
    let b = &want["boundaries"];
    assert_eq!(
        n::BUCKETS_TIME_TO_FIRST_CHUNK,
        floats(&b["gen_ai.server.time_to_first_token"]).as_slice()
    );
    assert_eq!(
        n::BUCKETS_TIME_PER_OUTPUT_CHUNK,
        floats(&b["gen_ai.server.time_per_output_token"]).as_slice()
    );
    assert_eq!(
        n::BUCKETS_OPERATION_DURATION,
        floats(&b["gen_ai.client.operation.duration"]).as_slice()
    );
    assert_eq!(
        n::BUCKETS_TOKEN_USAGE,
        floats(&b["gen_ai.client.token.usage"]).as_slice()
    );

    let o = Overrides {
        targets: vec!["http://127.0.0.1:1".into()],
        no_otlp: true,
        ..Overrides::default()
    };
    let t =
        Telemetry::init(&config::load(o, &NoEnv).expect("config").otlp, &NoEnv).expect("telemetry");
    let i = &t.instruments;
    for s in floats(&input["ttft_samples_s"]) {
        let mut r = ok(Duration::from_secs_f64(s));
        r.ttft = Some(Duration::from_secs_f64(s));
        record(i, "ttft", r);
    }
    for s in floats(&input["tpot_samples_s"]) {
        let mut r = ok(Duration::from_secs(1));
        r.token_chunk_times = vec![Duration::ZERO, Duration::from_secs_f64(s)];
        record(i, "tpot", r);
    }
    for s in floats(&input["duration_samples_s"]) {
        record(i, "duration", ok(Duration::from_secs_f64(s)));
    }
    for v in floats(&input["output_token_samples"]) {
        let mut r = ok(Duration::from_secs(1));
        (r.output_tokens, r.http_status) = (Some(v as u64), Some(200));
        record(i, "tokens", r);
    }
    let mut text = String::new();
    prometheus::TextEncoder::new()
        .encode_utf8(&t.registry.gather(), &mut text)
        .expect("encode");
    let counts = |v: &serde_json::Value| -> Vec<u64> {
        v.as_array()
            .expect("counts")
            .iter()
            .map(|x| x.as_u64().expect("count"))
            .collect()
    };
    let cases = [
        (
            "gen_ai_client_operation_time_to_first_chunk_seconds",
            "ttft",
            "gen_ai.server.time_to_first_token",
            "ttft_bucket_counts",
        ),
        (
            "gen_ai_client_operation_time_per_output_chunk_seconds",
            "tpot",
            "gen_ai.server.time_per_output_token",
            "tpot_bucket_counts",
        ),
        (
            "gen_ai_client_operation_duration_seconds",
            "duration",
            "gen_ai.client.operation.duration",
            "duration_bucket_counts",
        ),
        (
            "gen_ai_client_token_usage",
            "tokens",
            "gen_ai.client.token.usage",
            "token_usage_bucket_counts",
        ),
    ];
    for (family, model, bounds_key, counts_key) in cases {
        let (bounds, got) = buckets(&text, family, model);
        assert_eq!(
            bounds,
            floats(&b[bounds_key]),
            "{family}: exported boundaries"
        );
        assert_eq!(
            got,
            counts(&want[counts_key]),
            "{family}: bucket counts, upper bound inclusive"
        );
    }
    // The SDK default (made for ms) would put all four TTFTs in one bucket.
    assert_ne!(
        counts(&want["ttft_bucket_counts"])
            .iter()
            .filter(|c| **c > 0)
            .count(),
        1
    );
}
