//! The live diagnosis in the agent binary (issue 12), on a scripted server over real loopback
//! sockets: 2 min calm (TTFT 20 ms, ITL 5 ms), then the server slows down the way an overload
//! does (TTFT 600 ms, ITL 30 ms). Within 60 s of the onset the agent confirms `load_surge`
//! (TTFT and TPOT both rose, GPU, network and errors flat), with one WARN line, the
//! `/api/v1/diagnosis` document, `lmperf ctl diagnose` (text and JSON), the gauges on
//! `/metrics`, and an `lmperf.diagnosis` span linked to the incident's kept traces. The calm
//! phase yields no diagnosis, and spike mode enters on `latency_jump` without any SLO.
//! The same against the real llama.cpp server is in `tests/spike.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use fake_opentelemetry_collector::{ExportedSpan, FakeCollectorServer};
use lmperf_e2e::agent::Agent;
use lmperf_e2e::otlp::attrs;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
use lmperf_e2e::temp;
use serde_json::Value;

/// The calm phase ends once the engine holds this much history (10 closed buckets: with the
/// 2–3 buckets the slowdown takes to detect, the 8 baseline buckets before the 4 recent ones),
/// and lasts at most [`CALM_MAX`].
const CALM_HISTORY_S: f64 = 100.0;
const CALM_MAX: Duration = Duration::from_secs(150);
const FAULT: Duration = Duration::from_secs(60);
/// Polled this long after the confirmation (the state after it must stay confirmed).
const AFTER_CONFIRMED: Duration = Duration::from_secs(3);

fn unix(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn ctl(agent: &Agent, args: &[&str]) -> (i32, String) {
    let (code, out, err) = agent.ctl(args);
    (code, out + &err)
}

#[tokio::test(flavor = "multi_thread")]
async fn slowdown_is_diagnosed_as_load_surge_within_60_s() {
    // Not serial: the node's CPU pressure (PSI) is a signal of the diagnosis, and the real
    // model server of another test beside it once moved it 59 % → 85 % at the slowdown; a
    // pressure stretches a step at most 1 ÷ (1 − share) (2.7 × there) and the TTFT rose 30 ×,
    // so the engine no longer lets it outscore the load surge (`diagnosis::pressure`).
    let slow = Arc::new(AtomicBool::new(false));
    let s2 = slow.clone();
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path == "/v1/models" {
            return Reply::json(
                200,
                r#"{"object":"list","data":[{"id":"m","owned_by":"vllm"}]}"#,
            );
        }
        if s2.load(Ordering::Relaxed) {
            Reply::sse(chat_stream(
                8,
                Duration::from_millis(600),
                Duration::from_millis(30),
                20,
            ))
        } else {
            Reply::sse(chat_stream(
                8,
                Duration::from_millis(20),
                Duration::from_millis(5),
                20,
            ))
        }
    }))
    .await;
    let mut collector = FakeCollectorServer::start().await.unwrap();
    let dir = temp::dir("diagnosis");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        "[canary]\nsampling_ratio = 0.1\nspike_hold = \"20s\"\nmax_in_flight = 16\n",
    )
    .unwrap();
    let (url, endpoint) = (server.url(), collector.endpoint());
    let agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(
            &[
                "--config",
                cfg.to_str().unwrap(),
                "--target",
                &url,
                "--model",
                "m",
                "--rate",
                "4",
                "--arrival",
                "poisson",
                "--otlp-protocol",
                "grpc",
                "--otlp-endpoint",
                &endpoint,
                "--log-format",
                "json",
            ],
            &[("OTEL_METRIC_EXPORT_INTERVAL", "5000")],
        )
    })
    .await
    .unwrap();

    let mut spans: Vec<ExportedSpan> = Vec::new();
    let t0 = Instant::now();
    loop {
        assert!(
            t0.elapsed() < CALM_MAX,
            "no baseline after {CALM_MAX:?}\n{}",
            agent.stderr_text()
        );
        spans.extend(
            collector
                .exported_spans(usize::MAX, Duration::from_millis(1000))
                .await,
        );
        let (code, body) = agent.get("/api/v1/diagnosis");
        assert_eq!(code, 200, "{body}");
        let d: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(d["schema_version"], 1);
        // Calm: nothing detected. A `warning` (a cause's hard rule holding without a latency
        // symptom, e.g. node CPU pressure on this busy CI machine) is allowed: it never pages.
        let state = d["targets"][0]["state"].as_str().unwrap_or("");
        assert!(
            state == "idle" || state == "warning",
            "calm phase at {:?}: {d}",
            t0.elapsed()
        );
        // The history the engine holds: `baseline_wait` while idle short of a verdict's (not
        // said before the first canary, nor in `warning`: then the time).
        let ready = match d["targets"][0]["baseline_wait"]["have_s"].as_f64() {
            Some(have) => have >= CALM_HISTORY_S,
            None => t0.elapsed().as_secs_f64() >= CALM_HISTORY_S + 10.0,
        };
        if ready {
            break;
        }
    }
    eprintln!("calm phase: {:.0} s", t0.elapsed().as_secs_f64());
    assert!(
        !agent.stderr_text().contains("Diagnosis:"),
        "{}",
        agent.stderr_text()
    );

    let fault_at = SystemTime::now();
    slow.store(true, Ordering::Relaxed);
    let mut confirmed: Option<(f64, Value)> = None;
    let mut states = Vec::new();
    let t1 = Instant::now();
    while t1.elapsed() < FAULT
        && confirmed.as_ref().is_none_or(|(after, _)| {
            unix(SystemTime::now()) - unix(fault_at) < after + AFTER_CONFIRMED.as_secs_f64()
        })
    {
        spans.extend(
            collector
                .exported_spans(usize::MAX, Duration::from_millis(1000))
                .await,
        );
        let d: Value = serde_json::from_str(&agent.get("/api/v1/diagnosis").1).unwrap();
        let state = d["targets"][0]["state"].as_str().unwrap_or("").to_owned();
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        if confirmed.is_none() && state == "root_confirmed" {
            confirmed = Some((
                unix(SystemTime::now()) - unix(fault_at),
                d["targets"][0].clone(),
            ));
        }
    }
    let (after, t) = confirmed
        .unwrap_or_else(|| panic!("not confirmed; states {states:?}\n{}", agent.stderr_text()));
    // In order (a 1 s state may fall between two polls), never back to idle once it moved.
    let order = ["triggered", "propagating", "root_confirmed"];
    let moved: Vec<usize> = states
        .iter()
        .skip_while(|s| *s == "idle" || *s == "warning")
        .map(|s| order.iter().position(|o| o == s).unwrap_or(usize::MAX))
        .collect();
    assert!(
        moved.windows(2).all(|w| w[0] < w[1]) && moved.last() == Some(&2),
        "{states:?}"
    );
    assert!(after <= 60.0, "confirmed {after:.1} s after the slowdown");
    let onset = t["onset_unix_s"].as_f64().unwrap() - unix(fault_at);
    assert!(
        (-5.0..=15.0).contains(&onset),
        "onset {onset:.1} s from the slowdown"
    );
    assert_eq!(t["causes"][0]["cause"], "load_surge", "{t:#}");
    assert!(t["causes"][0]["score"].as_f64().unwrap() >= 0.75, "{t:#}");
    let ttft = &t["causes"][0]["evidence"][0];
    assert_eq!(ttft["signal"], "ttft", "{t:#}");
    assert!(
        ttft["before"].as_f64().unwrap() < 0.06 && ttft["after"].as_f64().unwrap() > 0.55,
        "{ttft}"
    );
    let tpot = &t["causes"][0]["evidence"][1];
    assert!(
        tpot["signal"] == "tpot"
            && tpot["before"].as_f64().unwrap() < 0.01
            && tpot["after"].as_f64().unwrap() > 0.025,
        "{tpot}"
    );
    // Both moved (TTFT 30 x, TPOT 6 x on the script's clock); the symptom is the series whose
    // bucket p99 rose most against its own baseline, and on a loaded machine a descheduled
    // client lifts TTFT's baseline p99 (fresh-machine CI read TPOT once): either, never E2E-only.
    let symptom = t["symptom"]["signal"].as_str().unwrap_or("");
    assert!(symptom == "ttft" || symptom == "tpot", "{t:#}");

    // One WARN line in words.
    let lines: Vec<String> = agent
        .stderr_text()
        .lines()
        .filter(|l| l.contains("Diagnosis:"))
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    // JSON (`--log-format json`): the line carries its diagnosis span's ids (checked below).
    let warn: Value =
        serde_json::from_str(&lines[0]).unwrap_or_else(|e| panic!("{e}: {}", lines[0]));
    assert_eq!(warn["level"], "WARN", "{warn}");
    for l in agent.stderr_text().lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string() && v["message"].is_string(),
            "{l}"
        );
    }
    assert!(
        lines[0].contains("WARN")
            && lines[0].contains("load_surge 0.")
            && lines[0].contains(&format!("{} p99", symptom.to_uppercase()))
            && lines[0].contains("GPU, network, errors flat"),
        "{}",
        lines[0]
    );

    // The scorecard and its JSON through the control API.
    let (code, text) = tokio::task::block_in_place(|| ctl(&agent, &["diagnose"]));
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("root_confirmed") && text.contains("load_surge") && text.contains("TTFT"),
        "{text}"
    );
    let (code, json) =
        tokio::task::block_in_place(|| ctl(&agent, &["--json", "diagnose", "--window", "15m"]));
    assert_eq!(code, 0, "{json}");
    let doc: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        (
            doc["schema_version"].as_u64(),
            doc["targets"][0]["causes"][0]["cause"].as_str()
        ),
        (Some(1), Some("load_surge")),
        "{doc:#}"
    );
    let (code, err) =
        tokio::task::block_in_place(|| ctl(&agent, &["diagnose", "--target", "nope"]));
    assert_eq!(code, 3, "{err}");

    // Gauges; and the counter of confirmed diagnoses, whose OpenMetrics exemplar is the span.
    let admin = agent.admin;
    let (_, _, openmetrics) = tokio::task::block_in_place(|| {
        lmperf_e2e::openmetrics::get_accept(
            admin,
            "/metrics",
            lmperf_e2e::openmetrics::PROMETHEUS_ACCEPT,
        )
    });
    let (_, metrics) = agent.get("/metrics");
    let state_line = metrics
        .lines()
        .find(|l| l.starts_with("lmperf_diagnosis_state") && !l.starts_with('#'))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(state_line.ends_with(" 3"), "{state_line}");
    let score = metrics
        .lines()
        .find(|l| {
            l.starts_with("lmperf_diagnosis_score")
                && l.contains("lmperf_diagnosis_cause=\"load_surge\"")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    let v: f64 = score.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(v >= 0.75, "{score}");

    let (code, agent) = agent.stop(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0), "{}", agent.stderr_text());
    spans.extend(
        collector
            .exported_spans(usize::MAX, Duration::from_secs(1))
            .await,
    );

    // Spike mode on the relative jump, no SLO set.
    let entered: Vec<_> = spans
        .iter()
        .flat_map(|s| &s.events)
        .filter(|e| e.name == "lmperf.spike.entered")
        .map(|e| attrs(&e.attributes))
        .collect();
    assert!(
        !entered.is_empty() && entered[0]["lmperf.spike.reason"] == "latency_jump",
        "{entered:?}"
    );
    // The diagnosis span, linked to kept traces of the spike.
    let diag: Vec<&ExportedSpan> = spans
        .iter()
        .filter(|s| s.name == "lmperf.diagnosis")
        .collect();
    assert_eq!(diag.len(), 1, "{} diagnosis spans", diag.len());
    assert_eq!(
        (warn["trace_id"].as_str(), warn["span_id"].as_str()),
        (
            Some(diag[0].trace_id.as_str()),
            Some(diag[0].span_id.as_str())
        ),
        "the WARN line names its diagnosis span: {warn}"
    );
    let confirmed = openmetrics
        .lines()
        .find(|l| {
            l.starts_with("lmperf_diagnosis_confirmed_total{")
                && l.contains("lmperf_diagnosis_cause=\"load_surge\"")
        })
        .unwrap_or_else(|| panic!("{openmetrics}"));
    assert!(
        confirmed.contains(&format!(
            "}} 1 # {{trace_id=\"{}\",span_id=\"{}\"}} 1 ",
            diag[0].trace_id, diag[0].span_id
        )),
        "{confirmed}"
    );
    let a = attrs(&diag[0].attributes);
    assert_eq!(
        (
            a["lmperf.diagnosis.cause"].as_str(),
            a["lmperf.target"].is_empty()
        ),
        ("load_surge", false),
        "{a:?}"
    );
    assert!(
        diag[0].kind.to_lowercase().contains("internal"),
        "{}",
        diag[0].kind
    );
    // Linked to the incident's kept canaries: those spike mode kept, or, where the diagnosis
    // confirmed before spike mode entered (its detector is the stricter), those kept by chance
    // since the onset.
    let entered_s: Vec<f64> = spans
        .iter()
        .flat_map(|s| &s.events)
        .filter(|e| e.name == "lmperf.spike.entered")
        .map(|e| e.time_unix_nano as f64 / 1e9 - unix(fault_at))
        .collect();
    assert!(
        !diag[0].links.is_empty(),
        "no links; the diagnosis span ended {:.1} s after the slowdown, spike mode entered at {entered_s:?} s",
        diag[0].end_time_unix_nano as f64 / 1e9 - unix(fault_at)
    );
    let kept: std::collections::HashSet<&str> = spans.iter().map(|s| s.trace_id.as_str()).collect();
    for l in &diag[0].links {
        assert!(
            kept.contains(l.trace_id.as_str()),
            "link to a trace not exported: {}",
            l.trace_id
        );
    }
}
