//! Exemplars that always resolve (issue 26): 200 canaries under the adaptive sampler keeping
//! about 10 %; every exemplar on `/metrics` (OpenMetrics, as Prometheus asks for it) names a
//! trace the OTLP receiver got, and the exemplar of the slowest bucket is the slowest kept
//! canary. The classic text format stays the default.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_opentelemetry_collector::{ExportedSpan, FakeCollectorServer};
use lmperf_e2e::agent::Agent;
use lmperf_e2e::openmetrics::{PROMETHEUS_ACCEPT, exemplars, get_accept};
use lmperf_e2e::otlp::attrs;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};

const CANARIES: usize = 200;
/// The one canary far slower than all others (alone in its bucket: 0.64..1.28 s).
const SLOWEST: usize = 150;

#[tokio::test(flavor = "multi_thread")]
async fn exemplars_name_kept_traces_and_the_slowest_bucket_is_the_slowest_kept_canary() {
    let sent: Arc<Mutex<Vec<String>>> = Arc::default();
    let answered = Arc::new(AtomicUsize::new(0));
    // Each request's `traceparent` as the server received it, by its trace id.
    let traceparents: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let (se, an, tps) = (sent.clone(), answered.clone(), traceparents.clone());
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path == "/v1/models" {
            return Reply::json(
                200,
                r#"{"object":"list","data":[{"id":"m","owned_by":"vllm"}]}"#,
            );
        }
        if req.path != "/v1/chat/completions" {
            return Reply::json(404, r#"{"error":"not found"}"#);
        }
        let tp = req.header("traceparent").unwrap_or("").to_owned();
        let trace_id = tp.split('-').nth(1).unwrap_or("").to_owned();
        tps.lock().unwrap().insert(trace_id.clone(), tp);
        let k = {
            let mut s = se.lock().unwrap();
            s.push(trace_id);
            s.len() - 1
        };
        an.fetch_add(1, Ordering::SeqCst);
        let ms = Duration::from_millis;
        if k == SLOWEST {
            Reply::sse(chat_stream(3, ms(800), ms(5), 4))
        } else if k % 25 == 7 {
            // Slower than most (0.08..0.16 s), inside the SLO: kept only by the base ratio.
            Reply::sse(chat_stream(4, ms(60), ms(30), 4))
        } else {
            Reply::sse(chat_stream(3, ms(5), ms(5), 4))
        }
    }))
    .await;
    let mut collector = FakeCollectorServer::start().await.unwrap();
    let dir = std::env::temp_dir().join(format!("lmperf-exemplars-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        "[canary]\nsampling_ratio = 0.1\nsampling_max_per_second = 100\nslo_e2e = \"400ms\"\n",
    )
    .unwrap();
    let (url, endpoint) = (server.url(), collector.endpoint());
    let mut agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(
            &[
                "--config",
                cfg.to_str().unwrap(),
                "--target",
                &url,
                "--model",
                "m",
                "--rate",
                "20",
                "--arrival",
                "constant",
                "--otlp-protocol",
                "grpc",
                "--otlp-endpoint",
                &endpoint,
            ],
            &[],
        )
    })
    .await
    .unwrap();

    let mut spans: Vec<ExportedSpan> = Vec::new();
    let t = Instant::now();
    while answered.load(Ordering::SeqCst) < CANARIES + 2 && t.elapsed() < Duration::from_secs(40) {
        spans.extend(
            collector
                .exported_spans(usize::MAX, Duration::from_millis(200))
                .await,
        );
    }
    // Let the last streams end (the slowest ended long ago), then scrape as Prometheus does.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let admin = agent.admin;
    let (om, classic) = tokio::task::spawn_blocking(move || {
        (
            get_accept(admin, "/metrics", PROMETHEUS_ACCEPT),
            get_accept(admin, "/metrics", "*/*"),
        )
    })
    .await
    .unwrap();
    agent.sigterm();
    let (code, agent) = tokio::task::spawn_blocking(move || {
        (
            agent
                .wait_exit(Duration::from_secs(10))
                .and_then(|s| s.code()),
            agent,
        )
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{}", agent.stderr_text());
    spans.extend(
        collector
            .exported_spans(usize::MAX, Duration::from_secs(1))
            .await,
    );

    // The classic format stays the default; OpenMetrics when asked.
    assert_eq!(om.0, 200);
    assert_eq!(
        om.1,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.2.ends_with("# EOF\n"));
    assert!(
        classic.1.starts_with("text/plain; version=0.0.4"),
        "{}",
        classic.1
    );
    assert!(!classic.2.contains(" # {") && !classic.2.contains("# EOF"));

    let sent = sent.lock().unwrap().clone();
    assert!(sent.len() >= CANARIES, "{} canaries", sent.len());
    let received: HashMap<&str, &ExportedSpan> =
        spans.iter().map(|s| (s.trace_id.as_str(), s)).collect();
    let e2e = |s: &ExportedSpan| attrs(&s.attributes)["lmperf.e2e"].parse::<f64>().unwrap();
    // About 10 % kept (plus the SLO breach).
    let share = received.len() as f64 / sent.len() as f64;
    assert!(
        (0.03..=0.25).contains(&share),
        "kept {} of {}",
        received.len(),
        sent.len()
    );

    let ex = exemplars(&om.2);
    let families = [
        "gen_ai_client_operation_duration_seconds_bucket",
        "gen_ai_client_operation_time_to_first_chunk_seconds_bucket",
        "gen_ai_client_operation_time_per_output_chunk_seconds_bucket",
    ];
    for f in families {
        assert!(
            ex.iter().any(|e| e.metric == f),
            "no exemplar on {f}:\n{}",
            om.2
        );
    }
    assert!(
        ex.iter().all(|e| families.contains(&e.metric.as_str())),
        "{ex:#?}"
    );
    // The server got each kept canary's trace unchanged: `traceparent` names the canary's
    // trace and its span as the parent, so a server that traces (vLLM `--otlp-traces-endpoint`)
    // puts its span in the canary's trace.
    let traceparents = traceparents.lock().unwrap().clone();
    for sp in received.values() {
        let tp = &traceparents[&sp.trace_id];
        assert!(
            tp.starts_with(&format!("00-{}-{}-", sp.trace_id, sp.span_id)) && tp.len() == 55,
            "traceparent {tp} for span {} of trace {}",
            sp.span_id,
            sp.trace_id
        );
    }
    // Every exemplar names a trace the receiver got, with that trace's span id; never a dropped one.
    for e in &ex {
        let sp = received.get(e.trace_id.as_str()).unwrap_or_else(|| {
            panic!(
                "exemplar {e:?} names a trace the receiver never got ({} received)",
                received.len()
            )
        });
        assert_eq!(sp.span_id, e.span_id, "{e:?}");
        assert!(
            (sp.end_time_unix_nano as f64 / 1e9 - e.timestamp).abs() < 0.01,
            "{e:?} vs span end {}",
            sp.end_time_unix_nano
        );
    }
    // At most one per bucket and series (one series here: every canary succeeded).
    let mut per_bucket: HashMap<(&str, Option<&str>), usize> = HashMap::new();
    for e in &ex {
        *per_bucket
            .entry((e.metric.as_str(), e.le.as_deref()))
            .or_default() += 1;
    }
    assert!(per_bucket.values().all(|n| *n == 1), "{per_bucket:?}");

    // The slowest bucket's exemplar is the slowest kept canary (the one the server made slow).
    let slowest_kept = spans
        .iter()
        .max_by(|a, b| e2e(a).total_cmp(&e2e(b)))
        .unwrap();
    assert_eq!(slowest_kept.trace_id, sent[SLOWEST]);
    let top = ex
        .iter()
        .filter(|e| e.metric == families[0])
        .max_by(|a, b| le(a).total_cmp(&le(b)))
        .unwrap();
    assert_eq!(top.le.as_deref(), Some("1.28"), "{top:?}");
    assert_eq!(top.trace_id, slowest_kept.trace_id);
    assert_eq!(top.value, e2e(slowest_kept));
    eprintln!(
        "exemplars: {} canaries, {} traces kept and received, {} exemplars, slowest bucket le={} value {:.3} s trace {}",
        sent.len(),
        received.len(),
        ex.len(),
        top.le.as_deref().unwrap_or(""),
        top.value,
        top.trace_id
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn le(e: &lmperf_e2e::openmetrics::Exemplar) -> f64 {
    match e.le.as_deref() {
        Some("+Inf") => f64::INFINITY,
        Some(v) => v.parse().unwrap_or(f64::NAN),
        None => f64::NAN,
    }
}
