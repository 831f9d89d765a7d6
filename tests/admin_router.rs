//! The admin router (`lmperf::admin::router`) driven in process with tower's `oneshot`, no
//! socket: each route's status, content type and body for an agent state built the way
//! `agent::run` builds it (one target with one measured canary, GPU disabled, no OTLP). The
//! same routes over a real socket of the real binary are in `agent_e2e.rs` and `gpu.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use lmperf::admin::{AdminState, router};
use lmperf::config::{self, Env, Overrides, raw::RawCanary};
use lmperf::status::{AgentStatus, RecentRequests, RequestSummary, TargetState};
use lmperf::telemetry::Telemetry;
use lmperf_e2e::prom_text;
use tower::ServiceExt;

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

/// The state of an agent with one target, `http://127.0.0.1:9` (named `127.0.0.1:9` by
/// default), model `m`, that measured
/// one canary (ok, TTFT 12.5 ms, E2E 40 ms), GPU disabled, OTLP off, not yet ready.
fn state() -> AdminState {
    let cfg = config::load(
        Overrides {
            targets: vec!["http://127.0.0.1:9".to_owned()],
            canary: RawCanary {
                model: Some("m".into()),
                ..RawCanary::default()
            },
            no_otlp: true,
            ..Overrides::default()
        },
        &NoEnv,
    )
    .expect("config");
    let telemetry = Arc::new(Telemetry::init(&cfg.otlp, &NoEnv).expect("telemetry"));
    let (gpu, _monitor) = lmperf::gpu::start(
        &lmperf::config::GpuConfig {
            enabled: false,
            ..cfg.gpu.clone()
        },
        &telemetry.meter(),
    );
    let targets: Vec<Arc<TargetState>> = cfg
        .targets
        .iter()
        .map(|t| Arc::new(TargetState::new(t)))
        .collect();
    let targets = Arc::new(lmperf::live_list::LiveList::new(targets));
    lmperf::status::register_spike_gauge(&telemetry.meter(), targets.clone());
    targets
        .iter()
        .next()
        .expect("one target")
        .record(&RequestSummary {
            source: "canary",
            target: "127.0.0.1:9".to_owned(),
            model: "m".to_owned(),
            at_unix_s: 1_700_000_000.0,
            outcome: "ok",
            error_type: None,
            http_status: Some(200),
            ttft_ms: Some(12.5),
            tpot_ms: Some(3.0),
            e2e_ms: 40.0,
            input_tokens: Some(8),
            output_tokens: Some(10),
            trace_id: "0af7651916cd43dd8448eb211c80319c".to_owned(),
            retries: 0,
            load_id: None,
            profile_revision: None,
            worker: None,
            error_message: None,
        });
    let names: Vec<String> = cfg.targets.iter().map(|t| t.name.clone()).collect();
    let status = Arc::new(AgentStatus {
        targets,
        started: SystemTime::now() - Duration::from_secs(3),
        ready: false.into(),
        gpu,
        net: Arc::new(lmperf::net::state::NetState::new(
            lmperf::net::filter::PortFilter::new([9]),
        )),
        recent: Arc::new(RecentRequests::new(16)),
        diagnosis: Arc::new(lmperf::diagnosis_live::LiveDiagnosis::new(
            lmperf::diagnosis::EngineConfig::default(),
            names,
        )),
        server: Arc::new(lmperf::server::state::ServerState::default()),
        discovery: Default::default(),
        reload: Default::default(),
    });
    AdminState { status, telemetry }
}

/// `GET uri` through the router: (status, Content-Type, body).
async fn get(state: &AdminState, uri: &str) -> (StatusCode, String, String) {
    let response = router(state.clone())
        .oneshot(Request::get(uri).body(Body::empty()).expect("request"))
        .await
        .expect("the router is infallible");
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).expect("UTF-8 body"),
    )
}

#[tokio::test]
async fn healthz_and_readyz_follow_the_ready_flag() {
    let s = state();
    assert_eq!(
        get(&s, "/healthz").await,
        (
            StatusCode::OK,
            "text/plain; charset=utf-8".into(),
            "ok\n".into()
        )
    );
    let (code, _, body) = get(&s, "/readyz").await;
    assert_eq!(
        (code, body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    );
    s.status.ready.store(true, Ordering::Relaxed);
    let (code, _, body) = get(&s, "/readyz").await;
    assert_eq!((code, body.as_str()), (StatusCode::OK, "ready\n"));
    // Its one target's last canary fails: still ready (the agent works), and it says so.
    let t = s.status.targets.iter().next().expect("one target");
    let mut last = t.snapshot().last.expect("a last canary");
    (last.outcome, last.error_type) = ("error", Some("non_sse_reply".into()));
    t.record(&last);
    let (code, _, body) = get(&s, "/readyz").await;
    assert_eq!(
        (code, body.as_str()),
        (StatusCode::OK, "ready; all 1 targets failing\n")
    );
    let (_, _, status) = get(&s, "/api/v1/status").await;
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        (
            v["targets_failing"].as_u64(),
            v["all_targets_failing"].as_bool()
        ),
        (Some(1), Some(true))
    );
    // /healthz answers whatever the ready flag says.
    assert_eq!(get(&s, "/healthz").await.0, StatusCode::OK);
}

#[tokio::test]
async fn status_is_the_json_document_of_the_state() {
    let s = state();
    let (code, content_type, body) = get(&s, "/api/v1/status").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(content_type, "application/json");
    let v: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["ready"], false);
    assert!(v["uptime_s"].as_f64().is_some_and(|u| u >= 3.0), "{v}");
    let t = &v["targets"][0];
    assert_eq!(v["targets"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(t["name"], "127.0.0.1:9");
    assert_eq!(t["model"], "m");
    assert_eq!(t["by_outcome"], serde_json::json!({"ok": 1}));
    assert_eq!(t["spike"], false);
    assert_eq!(t["last"]["ttft_ms"], 12.5);
    assert_eq!(t["last"]["e2e_ms"], 40.0);
    assert_eq!(t["last"]["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(v["gpu"]["mode"], "disabled", "{v}");
    assert_eq!(v["server"], serde_json::json!([]));
    assert!(v["exporter"].is_object(), "{v}");
    assert!(v["net"]["mode"].is_string(), "{v}");
}

#[tokio::test]
async fn metrics_is_prometheus_text_of_the_meter() {
    let s = state();
    let (code, content_type, body) = get(&s, "/metrics").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    // The spike gauge registered on the meter, one series per target, 0 while calm.
    assert_eq!(
        prom_text::first(
            &body,
            "lmperf_sampling_spike",
            &["lmperf_target=\"127.0.0.1:9\""]
        ),
        Some(0.0),
        "{body}"
    );
    s.status
        .targets
        .iter()
        .next()
        .expect("one target")
        .spike
        .store(true, Ordering::Relaxed);
    let (_, _, body) = get(&s, "/metrics").await;
    assert_eq!(
        prom_text::first(
            &body,
            "lmperf_sampling_spike",
            &["lmperf_target=\"127.0.0.1:9\""]
        ),
        Some(1.0),
        "{body}"
    );
}

#[tokio::test]
async fn diagnosis_answers_the_document_and_refuses_a_bad_window() {
    let s = state();
    let (code, content_type, body) = get(&s, "/api/v1/diagnosis").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(content_type, "application/json");
    let v: serde_json::Value = serde_json::from_str(&body).expect("diagnosis JSON");
    assert_eq!(v["schema_version"], 1, "{v}");
    let (code, _, body) = get(&s, "/api/v1/diagnosis?target=127.0.0.1:9&window=15m").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, _, body) = get(&s, "/api/v1/diagnosis?window=soon").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("window = \"soon\": "), "{body}");
}

#[tokio::test]
async fn an_unknown_path_is_404() {
    let s = state();
    assert_eq!(get(&s, "/api/v2/status").await.0, StatusCode::NOT_FOUND);
    assert_eq!(get(&s, "/").await.0, StatusCode::NOT_FOUND);
}

/// The node sample the diagnosis is fed: in the status `node` and on `/metrics` as gauges
/// (registered as `agent::run` does, with the diagnosis gauges); a value the node lacks has no
/// field and no series.
#[tokio::test]
async fn the_node_sample_is_in_the_status_and_on_metrics() {
    let s = state();
    lmperf::diagnosis_live::register_gauges(&s.telemetry.meter(), s.status.diagnosis.clone());
    let (_, _, body) = get(&s, "/api/v1/status").await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
    assert!(v.get("node").is_none(), "no sample yet: {v}");
    let sample = lmperf::node::NodeSample {
        cpu_some: Some(0.37),
        memory_some: Some(0.02),
        memory_full: None,
        io_some: None,
        agent_cpu_cores: Some(0.004),
        targets: vec![(
            "127.0.0.1:9".to_owned(),
            lmperf::node::TargetContention {
                cpu_throttled_share: Some(0.5),
                memory_usage_ratio: None,
                oom_kills: Some(1),
                cpu_wait_s_per_s: Some(2.25),
                cpu_cores: Some(1.5),
            },
        )],
    };
    s.status.diagnosis.feed_node(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        &sample,
    );
    let (_, _, body) = get(&s, "/api/v1/status").await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
    assert_eq!(v["node"]["at_unix_s"], 1_700_000_000.0, "{v}");
    assert_eq!(
        v["node"]["psi"],
        serde_json::json!({"cpu_some": 0.37, "memory_some": 0.02})
    );
    assert_eq!(
        v["node"]["targets"][0],
        serde_json::json!({"target": "127.0.0.1:9", "cpu_wait_s_per_s": 2.25, "cpu_cores": 1.5,
            "cpu_throttled_share": 0.5, "oom_kills_total": 1})
    );
    let (_, _, body) = get(&s, "/metrics").await;
    let target = "lmperf_target=\"127.0.0.1:9\"";
    let cpu = "lmperf_node_pressure_resource=\"cpu\"";
    assert_eq!(
        prom_text::first(&body, "lmperf_node_pressure_ratio", &[cpu]),
        Some(0.37),
        "{body}"
    );
    for (name, want) in [
        ("lmperf_server_cpu_wait_per_second", Some(2.25)),
        ("lmperf_server_cpu_usage", Some(1.5)),
        ("lmperf_server_cpu_throttled_ratio", Some(0.5)),
        ("lmperf_server_oom_kills_total", Some(1.0)),
        // No memory limit: no series.
        ("lmperf_server_memory_limit_utilization_ratio", None),
    ] {
        assert_eq!(
            prom_text::first(&body, name, &[target]),
            want,
            "{name}: {body}"
        );
    }
    assert_eq!(
        prom_text::first(
            &body,
            "lmperf_node_pressure_ratio",
            &["lmperf_node_pressure_resource=\"io\""]
        ),
        None,
        "{body}"
    );
}
