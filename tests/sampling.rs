//! The adaptive sampler at a real receiver: calm → error burst (30 % 503s for 20 s) → calm.
//! About 10 % of calm traces are kept, every trace of the burst is kept, spike mode is entered
//! within 2 s of the burst and left after the hold, and the metrics count every request.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use fake_opentelemetry_collector::{ExportedMetric, ExportedSpan, FakeCollectorServer};
use lmperf_e2e::agent::Agent;
use lmperf_e2e::otlp::attrs;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
use lmperf_e2e::temp;

const CALM: Duration = Duration::from_secs(10);
const BURST: Duration = Duration::from_secs(20);
const AFTER: Duration = Duration::from_secs(14);
const HOLD: Duration = Duration::from_secs(5);
const WINDOW: Duration = Duration::from_secs(3);

/// What the server saw of one canary.
#[derive(Debug, Clone)]
struct Sent {
    at: SystemTime,
    offset: Duration,
    trace_id: String,
    failed: bool,
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn calm_error_burst_calm_at_a_real_receiver() {
    let start: Arc<Mutex<Option<(Instant, SystemTime)>>> = Arc::default();
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let burst_n = Arc::new(AtomicUsize::new(0));
    let (st, se, bn) = (start.clone(), sent.clone(), burst_n.clone());
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path == "/v1/models" {
            return Reply::json(200, r#"{"object":"list","data":[{"id":"m","owned_by":"vllm"}]}"#);
        }
        // The server-signal probes (/metrics, /version, ...) are not canaries.
        if req.path != "/v1/chat/completions" {
            return Reply::json(404, r#"{"error":"not found"}"#);
        }
        let (t0, _) = *st.lock().unwrap().get_or_insert((Instant::now(), SystemTime::now()));
        let offset = t0.elapsed();
        let in_burst = offset >= CALM && offset < CALM + BURST;
        // 30 % of the burst's requests fail: 3 of every 10.
        let failed = in_burst && bn.fetch_add(1, Ordering::SeqCst) % 10 < 3;
        let trace_id = req.header("traceparent").and_then(|tp| tp.split('-').nth(1)).unwrap_or("").to_owned();
        se.lock().unwrap().push(Sent { at: SystemTime::now(), offset, trace_id, failed });
        if failed {
            Reply::json(503, r#"{"object":"error","message":"overloaded","type":"ServiceUnavailableError","code":503}"#)
        } else {
            Reply::sse(chat_stream(3, Duration::from_millis(5), Duration::from_millis(5), 4))
        }
    }))
    .await;
    let mut collector = FakeCollectorServer::start().await.unwrap();
    let dir = temp::dir("sampling");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "[canary]\nsampling_ratio = 0.1\nsampling_max_per_second = 100\nspike_window = \"{}s\"\nspike_error_rate = 0.1\nspike_hold = \"{}s\"\nspike_min_requests = 10\n",
            WINDOW.as_secs(),
            HOLD.as_secs()
        ),
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
            &[("OTEL_METRIC_EXPORT_INTERVAL", "1000")],
        )
    })
    .await
    .unwrap();

    // Run the three phases, draining the receiver as it goes (its channels are small).
    let mut spans: Vec<ExportedSpan> = Vec::new();
    let mut metrics: Vec<ExportedMetric> = Vec::new();
    let run_for = CALM + BURST + AFTER;
    let t = Instant::now();
    while t.elapsed() < run_for + Duration::from_secs(1) {
        spans.extend(
            collector
                .exported_spans(usize::MAX, Duration::from_millis(200))
                .await,
        );
        metrics.extend(collector.exported_metrics(0, Duration::ZERO).await);
    }
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
    metrics.extend(collector.exported_metrics(0, Duration::ZERO).await);

    let sent = sent.lock().unwrap().clone();
    let (_, t0_wall) = start.lock().unwrap().expect("requests arrived");
    let kept: HashMap<&str, &ExportedSpan> =
        spans.iter().map(|s| (s.trace_id.as_str(), s)).collect();
    assert_eq!(kept.len(), spans.len(), "one span per kept trace");

    // Calm before the burst: about 10 % kept, each as `base` with its threshold.
    let calm: Vec<&Sent> = sent.iter().filter(|s| s.offset < CALM).collect();
    let calm_kept: Vec<&&ExportedSpan> = calm
        .iter()
        .filter_map(|s| kept.get(s.trace_id.as_str()))
        .collect();
    let share = calm_kept.len() as f64 / calm.len() as f64;
    assert!(
        calm.len() >= 150 && (0.03..=0.2).contains(&share),
        "calm: kept {} of {}",
        calm_kept.len(),
        calm.len()
    );
    for sp in &calm_kept {
        assert_eq!(attrs(&sp.attributes)["lmperf.sampling.reason"], "base");
        assert_eq!(sp.trace_state, "ot=th:e6666666666666");
    }

    // The burst: every error kept; after spike mode starts, every request kept.
    let burst_start = t0_wall + CALM;
    let entered: Vec<u64> = spans
        .iter()
        .flat_map(|s| &s.events)
        .filter(|e| e.name == "lmperf.spike.entered")
        .map(|e| e.time_unix_nano)
        .collect();
    let left: Vec<u64> = spans
        .iter()
        .flat_map(|s| &s.events)
        .filter(|e| e.name == "lmperf.spike.left")
        .map(|e| e.time_unix_nano)
        .collect();
    assert_eq!(
        (entered.len(), left.len()),
        (1, 1),
        "one spike, no flapping: entered {entered:?} left {left:?}"
    );
    let entered_after = entered[0] as f64 / 1e9 - unix(burst_start);
    assert!(
        (0.0..=2.0).contains(&entered_after),
        "spike mode entered {entered_after:.2} s after the burst began"
    );
    let burst: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.offset >= CALM && s.offset < CALM + BURST)
        .collect();
    assert!(burst.len() >= 350, "{} burst requests", burst.len());
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for s in &burst {
        let sp = kept.get(s.trace_id.as_str());
        if s.failed {
            let sp = sp.unwrap_or_else(|| panic!("error trace {} dropped", s.trace_id));
            assert_eq!(attrs(&sp.attributes)["lmperf.sampling.reason"], "error");
        }
        if unix(s.at) > entered[0] as f64 / 1e9 + 0.1 {
            let sp = sp.unwrap_or_else(|| panic!("burst trace at {:?} dropped", s.offset));
            assert_eq!(sp.trace_state, "ot=th:0");
            *reasons
                .entry(attrs(&sp.attributes)["lmperf.sampling.reason"].clone())
                .or_default() += 1;
        }
    }
    assert!(
        reasons.get("spike").copied().unwrap_or(0) > 200
            && reasons.get("error").copied().unwrap_or(0) > 90,
        "{reasons:?}"
    );

    // Spike mode is left after the hold (window drain + hold), and calm sampling resumes.
    let burst_end = unix(t0_wall + CALM + BURST);
    let left_after = left[0] as f64 / 1e9 - burst_end;
    assert!(
        left_after >= HOLD.as_secs_f64() - 0.5 && left_after <= (HOLD + WINDOW).as_secs_f64() + 1.0,
        "left {left_after:.2} s after the burst"
    );
    let late: Vec<&Sent> = sent
        .iter()
        .filter(|s| unix(s.at) > left[0] as f64 / 1e9 + 0.1)
        .collect();
    let late_kept = late
        .iter()
        .filter(|s| kept.contains_key(s.trace_id.as_str()))
        .count();
    assert!(
        late.len() >= 40 && (late_kept as f64) < 0.3 * late.len() as f64,
        "after the spike: kept {late_kept} of {}",
        late.len()
    );

    // Metrics count every request, before sampling.
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for e in &metrics {
        for m in &e.metrics {
            let data = serde_json::to_value(&m.data).unwrap_or_default();
            let n: u64 = data["Sum"]["data_points"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["value"]["AsInt"].as_u64())
                .sum();
            if n > 0 {
                let v = last.entry(m.name.clone()).or_default();
                *v = (*v).max(n);
            }
        }
    }
    let all = sent.len() as u64;
    assert_eq!(
        last.get("lmperf.canary.requests").copied(),
        Some(all),
        "{last:?}"
    );
    assert_eq!(
        last.get("lmperf.sampling.spans").copied(),
        Some(all),
        "{last:?}"
    );
}
