//! The gRPC control API end to end: the real agent binary serving it, the real `lmperf ctl`
//! client calling it, a scripted model server on loopback, a fake OTLP collector.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_opentelemetry_collector::FakeCollectorServer;
use lmperf_e2e::agent::{Agent, lmperf_bin, prom_sum};
use lmperf_e2e::otlp::attrs;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
use lmperf_e2e::temp;
use serde_json::Value;

/// `lmperf ctl ARGS`: (exit code, stdout, stderr). No token unless `envs` gives one.
async fn ctl(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let envs: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(lmperf_bin())
            .arg("ctl")
            .args(&args)
            .env_remove("LMPERF_CONTROL_TOKEN")
            .env_remove("XDG_RUNTIME_DIR")
            .envs(envs)
            .output()
            .expect("run lmperf ctl");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// `lmperf ctl --json ARGS`, which must succeed; the reply.
async fn ctl_json(addr: &str, args: &[&str]) -> Value {
    let mut a = vec!["--addr", addr, "--json"];
    a.extend_from_slice(args);
    let (code, out, err) = ctl(&a, &[]).await;
    assert_eq!(code, 0, "lmperf ctl {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The load of `GetStatus` once it is no longer running (or after 10 s).
async fn load_when_ended(addr: &str) -> Value {
    let t = Instant::now();
    loop {
        let s = ctl_json(addr, &["status"]).await;
        if s["load"]["state"] != "running" || t.elapsed() > Duration::from_secs(10) {
            return s["load"].clone();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn write_config(dir: &Path, target: &str, control: &str) -> PathBuf {
    let path = dir.join("agent.toml");
    let text = format!(
        "[canary]\ninterval = \"300ms\"\nmodel = \"m\"\nprovider = \"openai\"\n\n[[target]]\nurl = \"{target}\"\nname = \"t0\"\n\n[gpu]\nenabled = false\n\n[net]\nenabled = false\n\n[control]\n{control}"
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn spawn(args: Vec<String>, envs: Vec<(String, String)>) -> Agent {
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let e: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Agent::spawn(&a, &e)
    })
    .await
    .unwrap()
}

/// The agent on config file `cfg`, without OTLP.
async fn spawn_config(cfg: &Path) -> Agent {
    let cfg = cfg.to_str().unwrap_or_default().to_owned();
    spawn(vec!["--config".into(), cfg, "--no-otlp".into()], vec![]).await
}

/// The `control=` address of the agent's "Agent started." line (the pump thread may add the
/// line just after `Agent::spawn` returns).
fn control_at(agent: &Agent) -> String {
    let t = Instant::now();
    loop {
        let log = agent.stderr_text();
        if let Some(at) = log
            .lines()
            .filter(|l| l.contains("Agent started."))
            .flat_map(|l| l.split_whitespace())
            .find_map(|w| w.strip_prefix("control="))
        {
            return at.to_owned();
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no control address in {log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The trace ids the model server saw in `traceparent`.
fn server_trace_ids(server: &ScriptedServer) -> Vec<String> {
    server
        .requests()
        .iter()
        .filter_map(|r| {
            r.header("traceparent")
                .and_then(|t| t.split('-').nth(1))
                .map(str::to_owned)
        })
        .collect()
}

fn is_trace_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes().all(|b| b.is_ascii_hexdigit())
        && s != "00000000000000000000000000000000"
}

/// Every RPC over the default kind of listener (a unix socket, no token): status, recent
/// canaries with the trace ids the server received, an injected burst measured, counted and
/// exported as marked spans, refusals beyond the caps, stop, and the ctl exit codes.
#[tokio::test(flavor = "multi_thread")]
async fn every_rpc_end_to_end_over_a_unix_socket() {
    let server = ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(
            3,
            Duration::from_millis(5),
            Duration::from_millis(5),
            4,
        ))
    }))
    .await;
    let mut collector = FakeCollectorServer::start().await.unwrap();
    let dir = temp::dir("ctl-rpc");
    let sock = dir.join("control.sock");
    let addr = format!("unix:{}", sock.display());
    let control = format!(
        "listen = \"{addr}\"\nrecent_requests = 64\nmax_inject_rate = 50.0\nmax_inject_concurrency = 4\nmax_inject_requests = 1000\nmax_inject_duration = \"2m\"\n"
    );
    let cfg = write_config(&dir, &server.url(), &control);
    let args = [
        "--config",
        cfg.to_str().unwrap(),
        "--otlp-protocol",
        "grpc",
        "--otlp-endpoint",
        &collector.endpoint(),
    ]
    .map(str::to_owned)
    .to_vec();
    let mut agent = spawn(args, vec![]).await;
    assert_eq!(control_at(&agent), addr);

    // GetStatus, once a few canaries are in.
    let t = Instant::now();
    let status = loop {
        let s = ctl_json(&addr, &["status"]).await;
        if s["targets"][0]["requests"].as_u64().unwrap_or(0) >= 3
            || t.elapsed() > Duration::from_secs(10)
        {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let t0 = &status["targets"][0];
    assert_eq!(
        (t0["name"].as_str(), t0["model"].as_str()),
        (Some("t0"), Some("m")),
        "{status}"
    );
    assert!(t0["by_outcome"]["ok"].as_u64().unwrap() >= 3, "{status}");
    assert!(
        is_trace_id(t0["last"]["trace_id"].as_str().unwrap()),
        "{status}"
    );
    assert_eq!(status["gpu"]["mode"], "disabled");
    assert_eq!(status["net"]["mode"], "disabled");
    assert_eq!(status["exporter"]["enabled"], true);
    assert_eq!(status["exporter"]["queue_capacity"], 2048);
    assert_eq!(status["caps"]["max_rate_per_second"], 50.0);
    assert_eq!(status["caps"]["max_duration_s"], 120.0);
    assert!(status["load"].is_null(), "{status}");
    let doc: Value = serde_json::from_str(status["status_json"].as_str().unwrap()).unwrap();
    assert_eq!(doc["targets"][0]["name"], "t0");
    // Issue 50.2: the last 5 minutes' TTFT per target, in the status document and over gRPC.
    let latency = &t0["latency"];
    assert!(latency["requests"].as_u64().unwrap() >= 3, "{status}");
    assert_eq!(latency["window_s"], 300.0, "{status}");
    assert!(latency["ttft_p50_ms"].as_f64().unwrap() > 0.0, "{status}");
    assert!(
        latency["ttft_p99_ms"].as_f64() >= latency["ttft_p50_ms"].as_f64(),
        "{status}"
    );
    assert!(doc["targets"][0]["latency"]["requests"].as_u64().unwrap() >= 3);
    let (code, text, _) = ctl(&["--addr", &addr, "status"], &[]).await;
    assert_eq!(code, 0);
    assert!(
        text.contains("  last 5 min: ") && text.contains(" TTFT p50/p99 "),
        "{text}"
    );
    assert!(
        text.contains("target t0")
            && text
                .contains("inject caps: rate<=50/s duration<=120s concurrency<=4 requests<=1000"),
        "{text}"
    );
    // The scripted server answers its SSE on /metrics too: the server section says the
    // scrape fails and why.
    assert_eq!(t0["server"]["mode"], "failing", "{status}");
    assert!(
        t0["server"]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{status}"
    );
    assert!(text.contains("  server: - - model=- failing ("), "{text}");

    // ListRecentRequests: canaries, newest first, with the trace ids the server received.
    let recent = ctl_json(&addr, &["recent", "--limit", "2", "--source", "canary"]).await;
    let reqs = recent["requests"].as_array().unwrap();
    assert_eq!(
        (reqs.len(), recent["capacity"].as_u64()),
        (2, Some(64)),
        "{recent}"
    );
    assert!(
        reqs[0]["at_unix_s"].as_f64() >= reqs[1]["at_unix_s"].as_f64(),
        "{recent}"
    );
    let seen = server_trace_ids(&server);
    for r in reqs {
        assert_eq!(
            (
                r["source"].as_str(),
                r["target"].as_str(),
                r["outcome"].as_str()
            ),
            (Some("canary"), Some("t0"), Some("ok")),
            "{r}"
        );
        assert_eq!(r["output_tokens"], 3);
        assert!(
            r["ttft_ms"].as_f64().unwrap() > 0.0
                && r["e2e_ms"].as_f64().unwrap() >= r["ttft_ms"].as_f64().unwrap(),
            "{r}"
        );
        assert!(
            seen.contains(&r["trace_id"].as_str().unwrap().to_owned()),
            "trace id {} sent in traceparent",
            r["trace_id"]
        );
    }
    let (code, _, err) = ctl(
        &["--addr", &addr, "recent", "--outcome", "timeout", "--json"],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{err}");

    // InjectLoad refused beyond the caps, with the field, the value and the cap.
    let refusals: [(&[&str], &str); 5] = [
        (
            &["--rate", "1000", "--duration", "1s"],
            "INVALID_ARGUMENT: rate_per_second = 1000: above the cap of 50 (control.max_inject_rate)",
        ),
        (
            &["--rate", "5", "--duration", "1h"],
            "INVALID_ARGUMENT: duration_s = 3600: above the cap of 120 (control.max_inject_duration)",
        ),
        (
            &["--rate", "5", "--duration", "1s", "--concurrency", "5"],
            "INVALID_ARGUMENT: concurrency = 5: above the cap of 4 (control.max_inject_concurrency)",
        ),
        (
            &["--rate", "5", "--duration", "1s", "--max-requests", "1001"],
            "INVALID_ARGUMENT: max_requests = 1001: above the cap of 1000 (control.max_inject_requests)",
        ),
        (
            &["--rate", "5", "--duration", "1s", "--target", "nope"],
            "NOT_FOUND: target = \"nope\": not a configured target (t0)",
        ),
    ];
    for (extra, want) in refusals {
        let mut a = vec!["--addr", addr.as_str(), "inject"];
        a.extend_from_slice(extra);
        let (code, _, err) = ctl(&a, &[]).await;
        assert_eq!(
            (code, err.trim()),
            (3, format!("lmperf ctl: {want}").as_str()),
            "{extra:?}"
        );
    }
    let (code, _, err) = ctl(&["--addr", &addr, "stop"], &[]).await;
    assert_eq!(
        (code, err.trim()),
        (3, "lmperf ctl: NOT_FOUND: no load is running")
    );

    // A bounded burst: 20/s for 1 s, constant gaps, measured like canaries.
    let started = ctl_json(
        &addr,
        &[
            "inject",
            "--target",
            "t0",
            "--rate",
            "20",
            "--duration",
            "1s",
            "--concurrency",
            "4",
            "--arrival",
            "constant",
        ],
    )
    .await;
    let id = started["load"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (
            started["load"]["state"].as_str(),
            started["load"]["max_requests"].as_u64()
        ),
        (Some("running"), Some(20)),
        "{started}"
    );
    let (code, _, err) = ctl(
        &["--addr", &addr, "inject", "--rate", "1", "--duration", "1s"],
        &[],
    )
    .await;
    assert_eq!((code, err.trim()), (3, format!("lmperf ctl: ALREADY_EXISTS: load {id} is running; stop it first (`lmperf ctl stop`)").as_str()));
    let load = load_when_ended(&addr).await;
    assert_eq!(
        (
            load["state"].as_str(),
            load["sent"].as_u64(),
            load["skipped"].as_u64(),
            load["in_flight"].as_u64()
        ),
        (Some("done"), Some(20), Some(0), Some(0)),
        "{load}"
    );
    assert_eq!(load["by_outcome"]["ok"], 20, "{load}");
    let elapsed = load["elapsed_s"].as_f64().unwrap();
    assert!(
        (0.95..3.0).contains(&elapsed),
        "20 sends 50 ms apart take about 1 s: {elapsed}"
    );
    println!("inject 20/s × 1 s: elapsed {elapsed:.3} s");

    let recent = ctl_json(&addr, &["recent", "--source", "inject", "--limit", "64"]).await;
    let injected = recent["requests"].as_array().unwrap();
    assert_eq!(injected.len(), 20, "{recent}");
    let seen = server_trace_ids(&server);
    for r in injected {
        assert_eq!(
            (
                r["load_id"].as_str(),
                r["outcome"].as_str(),
                r["target"].as_str()
            ),
            (Some(id.as_str()), Some("ok"), Some("t0")),
            "{r}"
        );
        assert!(
            seen.contains(&r["trace_id"].as_str().unwrap().to_owned()),
            "{r}"
        );
    }
    let inject_ids: Vec<String> = injected
        .iter()
        .map(|r| r["trace_id"].as_str().unwrap().to_owned())
        .collect();

    // Counted apart from the canaries.
    let (code, metrics) = tokio::task::spawn_blocking({
        let admin = agent.admin;
        move || lmperf_e2e::agent::http_get(admin, "/metrics")
    })
    .await
    .unwrap();
    assert_eq!(code, 200);
    assert_eq!(
        prom_sum(
            &metrics,
            "lmperf_inject_requests_total",
            &["lmperf_target=\"t0\"", "lmperf_outcome=\"ok\""]
        ),
        20.0,
        "{metrics}"
    );

    // Exported as spans marked as injected (all of them kept).
    let mut spans = Vec::new();
    let t = Instant::now();
    let marked = |spans: &Vec<BTreeMap<String, String>>| {
        spans
            .iter()
            .filter(|a| a.get("lmperf.request.source").map(String::as_str) == Some("inject"))
            .count()
    };
    while marked(&spans) < 20 && t.elapsed() < Duration::from_secs(10) {
        spans.extend(
            collector
                .exported_spans(usize::MAX, Duration::from_millis(300))
                .await
                .iter()
                .map(|s| attrs(&s.attributes)),
        );
    }
    let inject_spans: Vec<_> = spans
        .iter()
        .filter(|a| a.get("lmperf.request.source").map(String::as_str) == Some("inject"))
        .collect();
    assert_eq!(inject_spans.len(), 20);
    for a in &inject_spans {
        assert_eq!(
            (
                a["lmperf.load.id"].as_str(),
                a["lmperf.sampling.reason"].as_str(),
                a["lmperf.target"].as_str()
            ),
            (id.as_str(), "inject", "t0"),
            "{a:?}"
        );
        assert_eq!(a["lmperf.outcome"], "ok");
    }
    assert!(
        spans
            .iter()
            .filter(|a| !a.contains_key("lmperf.request.source"))
            .all(|a| a["lmperf.sampling.reason"] != "inject"),
        "canary spans are not marked"
    );
    let _ = inject_ids;

    // StopLoad: a long load stopped early; its requests in flight cancelled.
    let started = ctl_json(&addr, &["inject", "--rate", "10", "--duration", "60s"]).await;
    let id2 = started["load"]["id"].as_str().unwrap().to_owned();
    assert_ne!(id2, id);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (code, _, err) = ctl(&["--addr", &addr, "stop", "--id", "load-999"], &[]).await;
    assert_eq!(
        (code, err.trim()),
        (
            3,
            "lmperf ctl: NOT_FOUND: id = \"load-999\": not the running load"
        )
    );
    let stopped = ctl_json(&addr, &["stop"]).await;
    let l = &stopped["load"];
    assert_eq!(
        (
            l["id"].as_str(),
            l["state"].as_str(),
            l["in_flight"].as_u64()
        ),
        (Some(id2.as_str()), Some("stopped"), Some(0)),
        "{stopped}"
    );
    let sent = l["sent"].as_u64().unwrap();
    assert!(
        (1..=30).contains(&sent) && l["elapsed_s"].as_f64().unwrap() < 5.0,
        "stopped within a second or two: {stopped}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = ctl_json(&addr, &["status"]).await;
    assert_eq!(
        (
            after["load"]["state"].as_str(),
            after["load"]["sent"].as_u64()
        ),
        (Some("stopped"), Some(sent)),
        "no send after the stop: {after}"
    );

    // Exit codes of the client itself.
    let (code, _, err) = ctl(
        &[
            "--addr",
            &format!("unix:{}", dir.join("nobody.sock").display()),
            "status",
        ],
        &[],
    )
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot reach the agent"), "{err}");
    let (code, _, err) = ctl(&["--addr", "bogus", "status"], &[]).await;
    assert_eq!(code, 2, "{err}");
    let (code, _, _) = ctl(
        &["--addr", &addr, "inject", "--rate", "x", "--duration", "1s"],
        &[],
    )
    .await;
    assert_eq!(code, 2);

    agent.sigterm();
    let exit = tokio::task::spawn_blocking(move || agent.wait_exit(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(exit.and_then(|s| s.code()), Some(0));
    assert!(!sock.exists(), "socket removed at exit");
    let _ = std::fs::remove_dir_all(&dir);
}

fn trace_fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/traces")
        .join(name)
        .to_str()
        .unwrap()
        .to_owned()
}

/// InjectLoad with a trace: the first 10 requests of the Azure code trace replayed at speedup
/// 0.8 (1.3 s of trace in 1.62 s) reach the server on the trace's schedule, each with
/// max_tokens = its output tokens and a prompt of its input tokens × 0.75 words; the spans
/// are marked as injected; traces beyond the duration or rate cap, or missing, are refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_trace_replay_sends_the_traces_requests_on_its_schedule() {
    // (received at, trace id of traceparent, body) of every request.
    type Log = Arc<std::sync::Mutex<Vec<(Instant, String, Value)>>>;
    let log: Log = Arc::default();
    let server = ScriptedServer::start(Arc::new({
        let log = log.clone();
        move |r: &lmperf_e2e::scripted::Received, _| {
            let id = r
                .header("traceparent")
                .and_then(|t| t.split('-').nth(1))
                .unwrap_or_default()
                .to_owned();
            log.lock().unwrap().push((
                Instant::now(),
                id,
                serde_json::from_slice(&r.body).unwrap_or(Value::Null),
            ));
            Reply::sse(chat_stream(
                3,
                Duration::from_millis(5),
                Duration::from_millis(5),
                4,
            ))
        }
    }))
    .await;
    let mut collector = FakeCollectorServer::start().await.unwrap();
    let dir = temp::dir("ctl-trace");
    let addr = format!("unix:{}", dir.join("control.sock").display());
    let traces = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/traces");
    let control = format!(
        "listen = \"{addr}\"\nmax_inject_rate = 10.0\nmax_inject_concurrency = 4\nmax_inject_requests = 100\nmax_inject_duration = \"10s\"\ntrace_dir = \"{}\"\n",
        traces.display()
    );
    let cfg = write_config(&dir, &server.url(), &control);
    let args = [
        "--config",
        cfg.to_str().unwrap(),
        "--otlp-protocol",
        "grpc",
        "--otlp-endpoint",
        &collector.endpoint(),
    ]
    .map(str::to_owned)
    .to_vec();
    let agent = spawn(args, vec![]).await;
    assert_eq!(control_at(&agent), addr);

    // Refused: the replay beyond the duration cap, the peak beyond the rate cap, a missing file,
    // a file outside control.trace_dir.
    let (burst, arxiv, missing) = (
        trace_fixture("burstgpt_1.head3.csv"),
        trace_fixture("mooncake_arxiv_trace.head20.jsonl"),
        trace_fixture("nope.csv"),
    );
    let outside = format!(
        "not a readable file under control.trace_dir ({})",
        traces.display()
    );
    let refusals = [
        (
            vec!["--trace", burst.as_str()],
            format!(
                "trace_file = {burst:?}: replay duration_s = 113 at trace_speedup 1: above the cap of 10 (control.max_inject_duration)"
            ),
        ),
        (
            vec!["--trace", arxiv.as_str()],
            format!(
                "trace_file = {arxiv:?}: peak rate_per_second = 15 (sends in 1 s at trace_speedup 1): above the cap of 10 (control.max_inject_rate)"
            ),
        ),
        (
            vec![
                "--trace",
                arxiv.as_str(),
                "--trace-speedup",
                "0.1",
                "--trace-format",
                "mooncake",
            ],
            format!(
                "trace_file = {arxiv:?}: replay duration_s = 30.52 at trace_speedup 0.1: above the cap of 10 (control.max_inject_duration)"
            ),
        ),
        (
            vec!["--trace", missing.as_str()],
            format!("trace_file = {missing:?}: {outside}"),
        ),
        (
            vec!["--trace", "/etc/passwd"],
            format!("trace_file = \"/etc/passwd\": {outside}"),
        ),
    ];
    for (extra, want) in refusals {
        let mut a = vec!["--addr", addr.as_str(), "inject"];
        a.extend_from_slice(&extra);
        let (code, _, err) = ctl(&a, &[]).await;
        assert_eq!(
            (code, err.trim()),
            (3, format!("lmperf ctl: INVALID_ARGUMENT: {want}").as_str()),
            "{extra:?}"
        );
    }
    let (code, _, _) = ctl(
        &["--addr", &addr, "inject", "--trace", &burst, "--rate", "5"],
        &[],
    )
    .await;
    assert_eq!(code, 2, "--rate does not go with --trace");

    // Rows 1-10 of the Azure code trace: (offset from the first in ms, input tokens, output tokens).
    let rows: [(f64, u32, u32); 10] = [
        (0.0, 4808, 10),
        (52.0, 3180, 8),
        (98.189, 110, 27),
        (140.684, 7433, 14),
        (444.994, 34, 12),
        (539.187, 374, 14),
        (698.571, 6985, 9),
        (1016.041, 34, 23),
        (1299.312, 1145, 7),
        (1299.337, 201, 24),
    ];
    let azure = trace_fixture("azure_llm_2023_code.head2000.csv");
    let started = ctl_json(
        &addr,
        &[
            "inject",
            "--trace",
            &azure,
            "--trace-speedup",
            "0.8",
            "--max-requests",
            "10",
            "--concurrency",
            "4",
        ],
    )
    .await;
    let l = &started["load"];
    let id = l["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (
            l["trace"].as_str(),
            l["arrival"].as_str(),
            l["max_requests"].as_u64(),
            l["trace_speedup"].as_f64()
        ),
        (
            Some("azure_llm_2023_code.head2000.csv"),
            Some("trace"),
            Some(10),
            Some(0.8)
        ),
        "{started}"
    );
    assert!(
        (l["duration_s"].as_f64().unwrap() - 1.299337 / 0.8).abs() < 1e-6,
        "{started}"
    );
    assert_eq!(l["trace_peak_rate_per_second"], 7.0, "{started}");
    let load = load_when_ended(&addr).await;
    assert_eq!(
        (
            load["state"].as_str(),
            load["sent"].as_u64(),
            load["skipped"].as_u64()
        ),
        (Some("done"), Some(10), Some(0)),
        "{load}"
    );
    assert_eq!(load["by_outcome"]["ok"], 10, "{load}");
    let (code, text, _) = ctl(&["--addr", &addr, "status"], &[]).await;
    assert_eq!(code, 0);
    assert!(
        text.contains(&format!(
            "load: {id} done target=t0 trace=azure_llm_2023_code.head2000.csv speedup=0.8"
        )),
        "{text}"
    );

    // What the server received: the 10 requests of the load (by their trace ids), on the schedule.
    let recent = ctl_json(&addr, &["recent", "--source", "inject", "--limit", "64"]).await;
    let ids: Vec<String> = recent["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["trace_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 10, "{recent}");
    let mut got: Vec<(Instant, Value)> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, t, _)| ids.contains(t))
        .map(|(at, _, b)| (*at, b.clone()))
        .collect();
    assert_eq!(got.len(), 10);
    got.sort_by_key(|g| g.0);
    let words = |b: &Value| {
        b["messages"][0]["content"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count() as u64
    };
    let mut shapes: Vec<(u64, u64)> = got
        .iter()
        .map(|(_, b)| (b["max_tokens"].as_u64().unwrap(), words(b)))
        .collect();
    let mut want: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| (u64::from(r.2), (f64::from(r.1) * 0.75).round() as u64))
        .collect();
    shapes.sort();
    want.sort();
    assert_eq!(shapes, want, "(max_tokens, prompt words) of each request");
    let mut worst: f64 = 0.0;
    for ((at, _), row) in got.iter().zip(&rows) {
        let off_ms = (*at - got[0].0).as_secs_f64() * 1000.0;
        let dev = off_ms - row.0 / 0.8;
        worst = worst.max(dev.abs());
        assert!(
            dev.abs() < 150.0,
            "sent at {off_ms:.1} ms, due at {:.1} ms",
            row.0 / 0.8
        );
    }
    println!(
        "trace replay of 10 requests at speedup 0.8: worst send offset deviation {worst:.2} ms"
    );

    // Exported as spans marked as injected, with the trace's lengths.
    let mut spans = Vec::new();
    let t = Instant::now();
    let marked = |spans: &Vec<BTreeMap<String, String>>| {
        spans
            .iter()
            .filter(|a| a.get("lmperf.load.id") == Some(&id))
            .count()
    };
    while marked(&spans) < 10 && t.elapsed() < Duration::from_secs(10) {
        spans.extend(
            collector
                .exported_spans(usize::MAX, Duration::from_millis(300))
                .await
                .iter()
                .map(|s| attrs(&s.attributes)),
        );
    }
    let mut lengths: Vec<(u64, u64)> = spans
        .iter()
        .filter(|a| a.get("lmperf.load.id") == Some(&id))
        .map(|a| {
            assert_eq!(
                (
                    a["lmperf.request.source"].as_str(),
                    a["lmperf.prompt.id"].as_str(),
                    a["lmperf.outcome"].as_str()
                ),
                ("inject", "synthetic", "ok"),
                "{a:?}"
            );
            (
                a["gen_ai.request.max_tokens"].parse().unwrap(),
                a["lmperf.request.input_tokens_target"].parse().unwrap(),
            )
        })
        .collect();
    lengths.sort();
    let mut want: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| (u64::from(r.2), u64::from(r.1)))
        .collect();
    want.sort();
    assert_eq!(
        lengths, want,
        "(gen_ai.request.max_tokens, lmperf.request.input_tokens_target) of the spans"
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bound to 0.0.0.0 (reached over 127.0.0.1 only), every call needs the token.
#[tokio::test(flavor = "multi_thread")]
async fn a_non_loopback_bind_needs_the_token_on_every_call() {
    let server = ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(
            2,
            Duration::from_millis(2),
            Duration::from_millis(2),
            4,
        ))
    }))
    .await;
    let dir = temp::dir("ctl-token");
    let cfg = write_config(&dir, &server.url(), "listen = \"0.0.0.0:0\"\n");
    let agent = spawn(
        vec![
            "--config".into(),
            cfg.to_str().unwrap().into(),
            "--no-otlp".into(),
        ],
        vec![("LMPERF_CONTROL_TOKEN".into(), "tok-e2e-1".into())],
    )
    .await;
    let at = control_at(&agent);
    let port = at
        .strip_prefix("0.0.0.0:")
        .unwrap_or_else(|| panic!("bound to 0.0.0.0: {at}"));
    let addr = format!("127.0.0.1:{port}");

    let calls: [&[&str]; 4] = [
        &["status"],
        &["recent"],
        &["stop"],
        &["inject", "--rate", "1", "--duration", "1s"],
    ];
    for call in calls {
        let mut a = vec!["--addr", addr.as_str()];
        a.extend_from_slice(call);
        let (code, _, err) = ctl(&a, &[]).await;
        assert_eq!(code, 3, "{call:?} without a token: {err}");
        assert!(
            err.starts_with("lmperf ctl: UNAUTHENTICATED: missing or wrong token"),
            "{err}"
        );
        let (code, _, err) = ctl(&a, &[("LMPERF_CONTROL_TOKEN", "tok-e2e-2")]).await;
        assert_eq!(code, 3, "{call:?} with a wrong token: {err}");
        assert!(err.contains("UNAUTHENTICATED"), "{err}");
    }
    let (code, out, err) = ctl(
        &["--addr", &addr, "--json", "status"],
        &[("LMPERF_CONTROL_TOKEN", "tok-e2e-1")],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let s: Value = serde_json::from_str(&out).unwrap();
    assert!(
        s["load"].is_null(),
        "the unauthenticated inject started nothing: {s}"
    );
    let token_file = dir.join("token");
    std::fs::write(&token_file, "tok-e2e-1\n").unwrap();
    let (code, _, err) = ctl(
        &[
            "--addr",
            &addr,
            "--token-file",
            token_file.to_str().unwrap(),
            "recent",
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A non-loopback bind without a token is a configuration error (exit 2); a loopback port
/// needs none.
#[tokio::test(flavor = "multi_thread")]
async fn non_loopback_without_token_is_refused_at_start() {
    let dir = temp::dir("ctl-notoken");
    let url = format!("http://127.0.0.1:{}", lmperf_e2e::peers::free_port());
    let cfg = write_config(&dir, &url, "listen = \"0.0.0.0:0\"\n");
    let out = tokio::task::spawn_blocking({
        let cfg = cfg.clone();
        move || {
            Command::new(lmperf_bin())
                .args([
                    "agent",
                    "--config",
                    cfg.to_str().unwrap(),
                    "--no-otlp",
                    "--admin-addr",
                    "127.0.0.1:0",
                ])
                .env_remove("LMPERF_CONTROL_TOKEN")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "config error: control.listen = \"0.0.0.0:0\": a non-loopback address needs a token"
        ),
        "{err}"
    );

    let cfg = write_config(&dir, &url, "listen = \"127.0.0.1:0\"\n");
    let agent = spawn(
        vec![
            "--config".into(),
            cfg.to_str().unwrap().into(),
            "--no-otlp".into(),
        ],
        vec![],
    )
    .await;
    let at = control_at(&agent);
    assert!(at.starts_with("127.0.0.1:"), "{at}");
    let (code, out, err) = ctl(&["--addr", &at, "--json", "status"], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"name\": \"t0\""), "{out}");
    drop(agent);

    // No [control] table: the default socket, which `lmperf ctl` finds without --addr.
    let cfg = write_config(&dir, &url, "");
    let agent = spawn(
        vec![
            "--config".into(),
            cfg.to_str().unwrap().into(),
            "--no-otlp".into(),
        ],
        vec![],
    )
    .await;
    let sock = agent.runtime_dir.join("lmperf/control.sock");
    assert_eq!(control_at(&agent), format!("unix:{}", sock.display()));
    let runtime = agent.runtime_dir.to_str().unwrap().to_owned();
    let (code, out, err) = ctl(&["status"], &[("XDG_RUNTIME_DIR", &runtime)]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("target t0"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Replays rows 1-5 of the Azure code trace (speedup 0.8, concurrency 4) through an agent in
/// `dir` against `server`; (max_tokens, words of the message) of each replayed request, sorted.
async fn replayed_prompt_words(server: &ScriptedServer, dir: &Path) -> Vec<(u64, u64)> {
    let addr = format!("unix:{}", dir.join("control.sock").display());
    let traces = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/traces");
    let control = format!(
        "listen = \"{addr}\"\nmax_inject_rate = 10.0\nmax_inject_concurrency = 4\nmax_inject_requests = 100\nmax_inject_duration = \"10s\"\ntrace_dir = \"{}\"\n",
        traces.display()
    );
    let cfg = write_config(dir, &server.url(), &control);
    let agent = spawn_config(&cfg).await;
    assert_eq!(control_at(&agent), addr);
    let azure = trace_fixture("azure_llm_2023_code.head2000.csv");
    ctl_json(
        &addr,
        &[
            "inject",
            "--trace",
            &azure,
            "--trace-speedup",
            "0.8",
            "--max-requests",
            "5",
            "--concurrency",
            "4",
        ],
    )
    .await;
    let load = load_when_ended(&addr).await;
    assert_eq!(load["by_outcome"]["ok"], 5, "{load}");
    let recent = ctl_json(&addr, &["recent", "--source", "inject", "--limit", "64"]).await;
    let ids: Vec<String> = recent["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["trace_id"].as_str().unwrap().to_owned())
        .collect();
    let mut got: Vec<(u64, u64)> = server
        .requests()
        .iter()
        .filter(|r| {
            r.header("traceparent")
                .and_then(|t| t.split('-').nth(1))
                .is_some_and(|id| ids.iter().any(|i| i == id))
        })
        .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap())
        .map(|b| {
            (
                b["max_tokens"].as_u64().unwrap(),
                b["messages"][0]["content"]
                    .as_str()
                    .unwrap()
                    .split_whitespace()
                    .count() as u64,
            )
        })
        .collect();
    got.sort_unstable();
    drop(agent);
    got
}

/// A trace replay through InjectLoad against a server with `/tokenize`: prompts are
/// calibrated to each request's exact input length (here the server counts words), as
/// `lmperf run` makes them, not estimated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_replay_calibrates_prompts_with_tokenize() {
    let server = ScriptedServer::start(Arc::new(|r: &lmperf_e2e::scripted::Received, _| {
        let b: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        if r.path == "/tokenize" {
            let n = b["content"]
                .as_str()
                .map_or(0, |s| s.split_whitespace().count());
            return Reply::json(
                200,
                &serde_json::json!({ "tokens": vec![1; n] }).to_string(),
            );
        }
        Reply::sse(chat_stream(
            2,
            Duration::from_millis(2),
            Duration::from_millis(2),
            4,
        ))
    }))
    .await;
    let dir = temp::dir("ctl-tokenize");
    // Rows 1-5 of the Azure code trace: (max_tokens, input tokens).
    let mut want = vec![(10, 4808), (8, 3180), (27, 110), (14, 7433), (12, 34)];
    want.sort_unstable();
    assert_eq!(
        replayed_prompt_words(&server, &dir).await,
        want,
        "(max_tokens, prompt tokens by the server's /tokenize) of each replayed request"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A chat target's replayed prompts are calibrated with the server's chat template, as
/// `lmperf run` does: a scripted server whose template adds 6 tokens, offered as llama.cpp's
/// `/apply-template` (then `/tokenize` of the prompt) or as vLLM's `/tokenize` with `messages`;
/// its tokenizer counts words. Each request's whole templated input is the trace row's count,
/// so its message holds 6 words fewer.
#[tokio::test(flavor = "multi_thread")]
async fn a_chat_trace_replay_counts_prompts_with_the_servers_chat_template() {
    for server_kind in ["llama.cpp", "vllm"] {
        let server =
            ScriptedServer::start(Arc::new(move |r: &lmperf_e2e::scripted::Received, _| {
                let b: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                let templated = |m: &Value| {
                    format!(
                        "<bos> <start_of_turn> user {} <end_of_turn> <start_of_turn> model",
                        m[0]["content"].as_str().unwrap_or("")
                    )
                };
                let words = |s: &str| s.split_whitespace().count();
                match (r.path.as_str(), server_kind) {
                    ("/apply-template", "llama.cpp") => Reply::json(
                        200,
                        &serde_json::json!({ "prompt": templated(&b["messages"]) }).to_string(),
                    ),
                    ("/tokenize", _) => {
                        let n = match b["messages"].as_array() {
                            Some(_) if server_kind == "vllm" => words(&templated(&b["messages"])),
                            Some(_) => return Reply::json(400, "{}"),
                            None => {
                                words(b["content"].as_str().or(b["prompt"].as_str()).unwrap_or(""))
                            }
                        };
                        Reply::json(
                            200,
                            &serde_json::json!({ "tokens": vec![1; n], "count": n }).to_string(),
                        )
                    }
                    ("/apply-template", _) => Reply::json(404, "{}"),
                    _ => Reply::sse(chat_stream(
                        2,
                        Duration::from_millis(2),
                        Duration::from_millis(2),
                        4,
                    )),
                }
            }))
            .await;
        let dir = temp::dir(&format!("ctl-chat-template-{server_kind}"));
        // Rows 1-5 of the Azure code trace: (max_tokens, input tokens − the template's 6).
        let mut want = vec![(10, 4802), (8, 3174), (27, 104), (14, 7427), (12, 28)];
        want.sort_unstable();
        assert_eq!(
            replayed_prompt_words(&server, &dir).await,
            want,
            "{server_kind}: (max_tokens, message words) of each replayed request"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `lmperf ctl` without an agent to talk to: no socket, a socket left by a killed agent, a port
/// nobody listens on, a server that is not an agent, an agent that was stopped. Each is one
/// line (exit 1) naming the address, the cause once, and what to do; no RPC name.
#[tokio::test(flavor = "multi_thread")]
async fn ctl_without_an_agent_says_what_failed_and_what_to_do_in_one_line() {
    let dir = temp::dir("ctl-unreachable");
    let stale = dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let http = ScriptedServer::start(Arc::new(|_, _| Reply::json(404, "{}"))).await;
    let http_at = http
        .url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let server = ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(
            2,
            Duration::from_millis(2),
            Duration::from_millis(2),
            4,
        ))
    }))
    .await;
    let stopped = format!("unix:{}", dir.join("control.sock").display());
    let cfg = write_config(&dir, &server.url(), &format!("listen = \"{stopped}\"\n"));
    let mut agent = spawn(
        ["--config", cfg.to_str().unwrap(), "--no-otlp"]
            .map(str::to_owned)
            .to_vec(),
        vec![],
    )
    .await;
    assert_eq!(control_at(&agent), stopped);
    agent.sigterm();
    let exited = tokio::task::spawn_blocking(move || agent.wait_exit(Duration::from_secs(15)))
        .await
        .unwrap();
    assert_eq!(
        exited.and_then(|s| s.code()),
        Some(0),
        "the agent stops on SIGTERM"
    );
    let check = "is the agent running, with control.listen there? (--addr unix:PATH or IP:PORT names another)";
    for (addr, args, want) in [
        (
            format!("unix:{}", dir.join("none.sock").display()),
            vec!["status"],
            format!("no socket there; {check}"),
        ),
        (
            format!("unix:{}", stale.display()),
            vec!["stop"],
            format!("connection refused; {check}"),
        ),
        (
            "127.0.0.1:1".to_owned(),
            vec!["inject", "--rate", "1", "--duration", "1s"],
            format!("connection refused; {check}"),
        ),
        (
            stopped.clone(),
            vec!["recent"],
            format!("no socket there; {check}"),
        ),
    ] {
        let mut a = vec!["--addr", addr.as_str()];
        a.extend(args.iter().copied());
        let (code, out, err) = ctl(&a, &[]).await;
        assert_eq!(
            (code, out.as_str(), err.as_str()),
            (
                1,
                "",
                format!("lmperf ctl: cannot reach the agent at {addr}: {want}\n").as_str()
            ),
            "{args:?}"
        );
    }
    // An HTTP/1 server there answers the HTTP/2 preface with HTTP/1 or closes the connection.
    let (code, _, err) = ctl(&["--addr", &http_at, "status"], &[]).await;
    let answered = format!(
        "lmperf ctl: cannot reach the agent at {http_at}: it answers, but not as an lmperf agent's control API (no gRPC over HTTP/2 there); check --addr\n"
    );
    // Or it closes the connection: the call fails while the client reads ("connection
    // closed") or, when the close beats the client's preface, while it writes ("broken pipe");
    // which comes first is the scheduler's choice. Either way one line names the address, the
    // cause and what to check. On a loaded machine the call's own 10 s deadline may come
    // first: said in one line too.
    let timed_out = err
        == format!(
            "lmperf ctl: the connection to {http_at} failed during the call: no answer within 10 s; see the agent's log, or retry\n"
        );
    let closed = err
        .strip_prefix(&format!(
            "lmperf ctl: the connection to {http_at} failed during the call: "
        ))
        .and_then(|rest| rest.strip_suffix("; is the agent still running, and is this its control.listen address? (--addr names another)\n"))
        .is_some_and(|cause| {
            [
                "operation was canceled: connection closed",
                "connection error: stream closed because of a broken pipe",
            ]
            .contains(&cause)
        });
    assert!(
        code == 1 && (err == answered || closed || timed_out),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ctl inject --trace … --p99-threshold`: "reproduce the 3 a.m. scene". A server answering in
/// about 1 s; a 10-request replay against an 850 ms threshold says FIRED (with the windows and
/// the peak p99) and prints the agent's diagnosis of the replay; against 5 s it did not fire.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_with_a_p99_threshold_says_whether_the_alert_fired_and_the_diagnosis() {
    let server = ScriptedServer::start(Arc::new(|_: &lmperf_e2e::scripted::Received, _| {
        Reply::sse(chat_stream(
            3,
            Duration::from_millis(900),
            Duration::from_millis(50),
            4,
        ))
    }))
    .await;
    let dir = temp::dir("ctl-scene");
    let addr = format!("unix:{}", dir.join("control.sock").display());
    let traces = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/traces");
    let control = format!(
        "listen = \"{addr}\"\nmax_inject_rate = 10.0\nmax_inject_concurrency = 10\nmax_inject_requests = 100\nmax_inject_duration = \"10s\"\ntrace_dir = \"{}\"\n",
        traces.display()
    );
    let cfg = write_config(&dir, &server.url(), &control);
    let agent = spawn(
        ["--config", cfg.to_str().unwrap(), "--no-otlp"]
            .map(str::to_owned)
            .to_vec(),
        vec![],
    )
    .await;
    assert_eq!(control_at(&agent), addr);
    let azure = trace_fixture("azure_llm_2023_code.head2000.csv");
    let base = [
        "inject",
        "--trace",
        azure.as_str(),
        "--trace-speedup",
        "0.8",
        "--max-requests",
        "10",
        "--concurrency",
        "10",
        "--p99-threshold",
    ];
    let mut args = base.to_vec();
    args.push("850ms");
    let v = ctl_json(&addr, &args).await;
    let a = &v["p99_alert"];
    assert_eq!(a["fired"], true, "{v}");
    assert_eq!(a["threshold_s"], 0.85, "{v}");
    assert!(a["peak_p99_s"].as_f64().unwrap() >= 0.9, "{v}");
    assert!(a["requests"].as_u64().unwrap() >= 10, "{v}");
    assert_eq!(v["load"]["state"], "done", "{v}");
    assert_eq!(v["diagnosis"]["schema_version"], 1, "{v}");
    assert_eq!(v["diagnosis"]["targets"][0]["target"], "t0", "{v}");
    let mut a = vec!["--addr", addr.as_str()];
    a.extend_from_slice(&base);
    a.push("5s");
    let (code, text, err) = ctl(&a, &[]).await;
    assert_eq!(code, 0, "{err}");
    println!("{text}");
    assert!(
        text.contains("p99 alert (E2E p99 ≥ 5000 ms over 30 s): did not fire"),
        "{text}"
    );
    assert!(text.starts_with("replayed "), "{text}");
    assert!(text.contains("t0"), "{text}");
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ctl inject --profile FILE`: the agent follows the profile (10 req/s of 20-token prompts);
/// `ctl update-load --profile FILE` 2 s in applies the edited profile (30 req/s, 200-token
/// prompts) from the next step while requests are in flight (each lasts ~250 ms): none is
/// dropped, each carries the revision it was sent under (recent requests and spans), the status
/// lists when each revision took effect; a bad edit is refused (exit 3, one line naming the
/// key) and the running revision kept.
#[tokio::test(flavor = "multi_thread")]
async fn an_injected_profile_is_updated_while_it_runs() {
    // (received at, body) of every request.
    type Log = Arc<std::sync::Mutex<Vec<(Instant, Value)>>>;
    let log: Log = Arc::default();
    let server = ScriptedServer::start(Arc::new({
        let log = log.clone();
        move |r: &lmperf_e2e::scripted::Received, _| {
            log.lock().unwrap().push((
                r.arrived,
                serde_json::from_slice(&r.body).unwrap_or(Value::Null),
            ));
            Reply::sse(chat_stream(
                3,
                Duration::from_millis(200),
                Duration::from_millis(20),
                4,
            ))
        }
    }))
    .await;
    let mut collector = FakeCollectorServer::start().await.unwrap();
    let dir = temp::dir("ctl-profile");
    let addr = format!("unix:{}", dir.join("control.sock").display());
    let control = format!(
        "listen = \"{addr}\"\nrecent_requests = 1000\nmax_inject_rate = 40.0\nmax_inject_concurrency = 16\nmax_inject_requests = 1000\nmax_inject_duration = \"10s\"\n"
    );
    let cfg = write_config(&dir, &server.url(), &control);
    let args = [
        "--config",
        cfg.to_str().unwrap(),
        "--otlp-protocol",
        "grpc",
        "--otlp-endpoint",
        &collector.endpoint(),
    ]
    .map(str::to_owned)
    .to_vec();
    let agent = spawn(args, vec![]).await;
    assert_eq!(control_at(&agent), addr);
    let file = dir.join("load.yaml");
    let path = file.to_str().unwrap();
    // 30 output tokens/s ÷ 3 per request = 10 req/s.
    std::fs::write(&file, "profile: steady\nprompt_length: {distribution: fixed, value: 20}\nconcurrency: {ramp: fixed, base: 16}\ntoken_rate: {mode: constant, target: 30/s}\n").unwrap();
    // Beyond the rate cap: 150 ÷ 3 = 50 req/s > 40.
    std::fs::write(
        dir.join("fast.yaml"),
        "token_rate: {mode: constant, target: 150/s}\n",
    )
    .unwrap();
    let fast = dir.join("fast.yaml");
    let (code, _, err) = ctl(
        &[
            "--addr",
            &addr,
            "inject",
            "--profile",
            fast.to_str().unwrap(),
            "--duration",
            "4s",
            "--output-tokens",
            "3",
        ],
        &[],
    )
    .await;
    assert_eq!((code, err.trim()), (3, format!("lmperf ctl: INVALID_ARGUMENT: token_rate ÷ output_tokens = 50 requests/s ({}): above the cap of 40 (control.max_inject_rate)", fast.display()).as_str()));
    let (code, _, _) = ctl(&["--addr", &addr, "inject", "--profile", path], &[]).await;
    assert_eq!(code, 2, "--profile needs --duration");

    let started = ctl_json(
        &addr,
        &[
            "inject",
            "--profile",
            path,
            "--duration",
            "4s",
            "--output-tokens",
            "3",
        ],
    )
    .await;
    let l = &started["load"];
    let id = l["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (
            l["arrival"].as_str(),
            l["profile"].as_str(),
            l["profile_revision"].as_u64(),
            l["rate_per_second"].as_f64()
        ),
        (Some("profile"), Some("steady"), Some(0), Some(10.0)),
        "{started}"
    );
    let t_start = Instant::now();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    // 90 tokens/s = 30 req/s, prompts of 200 tokens.
    std::fs::write(&file, "profile: steady\nprompt_length: {distribution: fixed, value: 200}\nconcurrency: {ramp: fixed, base: 16}\ntoken_rate: {mode: constant, target: 90/s}\n").unwrap();
    let updated = ctl_json(&addr, &["update-load", "--profile", path]).await;
    let t_update = t_start.elapsed().as_secs_f64();
    assert_eq!(updated["revision"], 1, "{updated}");
    // What it does now: the new revision's 30 req/s (90 tokens/s) and its concurrency of 16.
    let u = &updated["load"];
    assert_eq!(
        (
            u["profile_rate_per_second_now"].as_f64(),
            u["profile_token_rate_now"].as_f64(),
            u["profile_concurrency_now"].as_u64()
        ),
        (Some(30.0), Some(90.0), Some(16)),
        "{updated}"
    );
    let (code, text, _) = ctl(&["--addr", &addr, "status"], &[]).await;
    assert_eq!(code, 0);
    assert!(
        text.contains(&format!("profile=steady revision=1 ({path}) [0@0.0s 1@"))
            && text.contains(
                "now: concurrency=16 rate=30.00 req/s (90 tok/s) duration=4s concurrency_cap=16 "
            ),
        "{text}"
    );
    assert!(
        updated["load"]["in_flight"].as_u64().unwrap() >= 1,
        "requests in flight at the update: {updated}"
    );
    let same = ctl_json(&addr, &["update-load", "--profile", path, "--id", &id]).await;
    assert_eq!(
        same["revision"], 1,
        "the same profile again is no new revision"
    );
    std::fs::write(
        dir.join("bad.yaml"),
        "token_rate: {mode: constant, target: 90/s, jiter: 5%}\n",
    )
    .unwrap();
    let bad = dir.join("bad.yaml");
    let (code, _, err) = ctl(
        &[
            "--addr",
            &addr,
            "update-load",
            "--profile",
            bad.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert_eq!(code, 3, "{err}");
    assert!(
        err.trim().lines().count() == 1
            && err.contains(&format!(
                "INVALID_ARGUMENT: {}: token_rate.jiter = \"5%\": unknown key",
                bad.display()
            )),
        "{err}"
    );

    let load = load_when_ended(&addr).await;
    assert_eq!(load["state"], "done", "{load}");
    assert_eq!(
        load["profile_revision"], 1,
        "the bad edit kept revision 1: {load}"
    );
    let revs = load["profile_revisions"].as_array().unwrap();
    assert_eq!(
        (
            revs.len(),
            revs[0]["revision"].as_u64(),
            revs[1]["revision"].as_u64()
        ),
        (2, Some(0), Some(1)),
        "{load}"
    );
    let at = revs[1]["at_s"].as_f64().unwrap();
    assert!(
        (1.5..=t_update + 0.1).contains(&at),
        "revision 1 at {at} s (update sent by {t_update} s)"
    );
    let sent = load["sent"].as_u64().unwrap();
    assert_eq!(
        load["by_outcome"]["ok"].as_u64(),
        Some(sent),
        "every request ok, none cancelled: {load}"
    );
    assert_eq!(load["skipped"], 0, "{load}");

    // Each injected request with its revision: ~10 req/s before, ~30 req/s after.
    let recent = ctl_json(&addr, &["recent", "--source", "inject", "--limit", "1000"]).await;
    let reqs = recent["requests"].as_array().unwrap();
    assert_eq!(reqs.len() as u64, sent, "{recent}");
    let count = |rev: u64| {
        reqs.iter()
            .filter(|r| r["profile_revision"].as_u64() == Some(rev))
            .count() as f64
    };
    let (before, after) = (count(0) / at, count(1) / (4.0 - at));
    assert_eq!(
        count(0) + count(1),
        sent as f64,
        "every request has a revision"
    );
    assert!(
        (8.0..12.5).contains(&before) && (25.0..35.0).contains(&after),
        "{before} req/s then {after} req/s"
    );
    // At the server: 3 output tokens each; 20-token prompts (~15 words), then 200 (~150 words).
    let words: Vec<usize> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, b)| b["max_tokens"] == 3)
        .map(|(_, b)| {
            b["messages"][0]["content"]
                .as_str()
                .unwrap_or("")
                .split_whitespace()
                .count()
        })
        .collect();
    assert_eq!(words.len() as u64, sent);
    assert!(words.iter().all(|w| *w == 15 || *w == 150), "{words:?}");
    assert_eq!(words.iter().filter(|w| **w == 150).count() as f64, count(1));

    // Spans: lmperf.profile.revision on each injected request.
    let (mut spans, t) = (Vec::new(), Instant::now());
    let marked = |spans: &Vec<BTreeMap<String, String>>| {
        spans
            .iter()
            .filter(|a| a.get("lmperf.load.id") == Some(&id))
            .count() as u64
    };
    while marked(&spans) < sent && t.elapsed() < Duration::from_secs(10) {
        spans.extend(
            collector
                .exported_spans(usize::MAX, Duration::from_millis(300))
                .await
                .iter()
                .map(|s| attrs(&s.attributes)),
        );
    }
    let mut revisions: BTreeMap<i64, usize> = BTreeMap::new();
    for a in spans
        .iter()
        .filter(|a| a.get("lmperf.load.id") == Some(&id))
    {
        *revisions
            .entry(
                a.get("lmperf.profile.revision")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(-1),
            )
            .or_default() += 1;
    }
    assert_eq!(
        (revisions.get(&0).copied(), revisions.get(&1).copied()),
        (Some(count(0) as usize), Some(count(1) as usize)),
        "{revisions:?}"
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ctl inject --profile FILE --watch`: ctl stays while the load runs and sends each saved edit
/// of FILE (here a save by rename, as editors do) as `UpdateLoad`; a broken edit is refused
/// and the running revision kept; it exits with the load as it ended.
#[tokio::test(flavor = "multi_thread")]
async fn a_watched_injected_profile_follows_edits_of_its_file() {
    let server = ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(
            3,
            Duration::from_millis(20),
            Duration::from_millis(5),
            4,
        ))
    }))
    .await;
    let dir = temp::dir("ctl-profile-watch");
    let addr = format!("unix:{}", dir.join("control.sock").display());
    let control = format!(
        "listen = \"{addr}\"\nmax_inject_rate = 40.0\nmax_inject_concurrency = 8\nmax_inject_requests = 1000\nmax_inject_duration = \"10s\"\n"
    );
    let cfg = write_config(&dir, &server.url(), &control);
    let agent = spawn(
        ["--config", cfg.to_str().unwrap()]
            .map(str::to_owned)
            .to_vec(),
        vec![],
    )
    .await;
    assert_eq!(control_at(&agent), addr);
    let file = dir.join("load.yaml");
    std::fs::write(
        &file,
        "profile: watched\ntoken_rate: {mode: constant, target: 30/s}\n",
    )
    .unwrap();
    let run = tokio::spawn({
        let (addr, file) = (addr.clone(), file.clone());
        async move {
            ctl(
                &[
                    "--addr",
                    &addr,
                    "--json",
                    "inject",
                    "--profile",
                    file.to_str().unwrap(),
                    "--duration",
                    "3s",
                    "--output-tokens",
                    "3",
                    "--watch",
                ],
                &[],
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let save = |text: &str| {
        let tmp = dir.join(".load.yaml.swp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    save("profile: watched\ntoken_rate: {mode: constant, target: 60/s}\n");
    tokio::time::sleep(Duration::from_millis(700)).await;
    save("profile: watched\ntoken_rate: {mode: constant, target: 60/s, jiter: 5%}\n");
    let (code, out, err) = run.await.unwrap();
    assert_eq!(code, 0, "{err}");
    let load: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (load["state"].as_str(), load["profile_revision"].as_u64()),
        (Some("done"), Some(1)),
        "{load}"
    );
    let at = load["profile_revisions"][1]["at_s"].as_f64().unwrap();
    assert!((0.9..2.0).contains(&at), "revision 1 at {at} s");
    assert!(
        err.contains(&format!("lmperf ctl: revision 1 from {}", file.display())),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "edit refused, the running revision is kept: {}: ",
            file.display()
        )) && err.contains("token_rate.jiter = \"5%\": unknown key"),
        "{err}"
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C on `ctl inject --profile F --watch` ends the watching, says the load goes on and how
/// to end it, and exits 0 with the load as it is; the load keeps running (the new-user walk
/// found it running with no hint).
#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_on_a_watch_says_the_load_goes_on() {
    let server = ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(
            3,
            Duration::from_millis(20),
            Duration::from_millis(5),
            4,
        ))
    }))
    .await;
    let dir = temp::dir("ctl-profile-watch-ctrlc");
    let addr = format!("unix:{}", dir.join("control.sock").display());
    let control = format!(
        "listen = \"{addr}\"\nmax_inject_rate = 40.0\nmax_inject_concurrency = 8\nmax_inject_requests = 1000\nmax_inject_duration = \"30s\"\n"
    );
    let cfg = write_config(&dir, &server.url(), &control);
    let agent = spawn(
        ["--config", cfg.to_str().unwrap()]
            .map(str::to_owned)
            .to_vec(),
        vec![],
    )
    .await;
    assert_eq!(control_at(&agent), addr);
    let file = dir.join("load.yaml");
    std::fs::write(
        &file,
        "profile: watched\ntoken_rate: {mode: constant, target: 10/s}\n",
    )
    .unwrap();
    let child = std::process::Command::new(lmperf_bin())
        .args([
            "ctl",
            "--addr",
            &addr,
            "--json",
            "inject",
            "--profile",
            file.to_str().unwrap(),
            "--duration",
            "20s",
            "--output-tokens",
            "3",
            "--watch",
        ])
        .env_remove("LMPERF_CONTROL_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("lmperf ctl: stopped watching {}", file.display()))
            && err.contains("goes on until its duration (`lmperf ctl stop` ends it)"),
        "{err}"
    );
    let s = ctl_json(&addr, &["status"]).await;
    assert_eq!(s["load"]["state"], "running", "{s}");
    let (code, _, e) = ctl(&["--addr", &addr, "stop"], &[]).await;
    assert_eq!(code, 0, "{e}");
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// On call, `lmperf ctl` shows why a target fails (issue 50): a target answering an HTML page
/// with 200 and one whose `/v1/models` is a proxy's 404 page. `ctl status` says each one's
/// last error with its message, `ctl recent` (text and JSON) carries the message, and no log
/// line carries the page.
#[tokio::test(flavor = "multi_thread")]
async fn ctl_says_why_a_target_fails_and_no_log_line_carries_a_page() {
    let page = format!(
        "<!doctype html>\n<html><head><title>Sign in</title></head><body>{}</body></html>",
        "<p>corporate proxy</p>".repeat(200)
    );
    let not_found = "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n".to_owned();
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        let (status, body) = if req.path == "/v1/models" {
            (404, not_found.clone())
        } else {
            (200, page.clone())
        };
        Reply::Stream {
            status,
            content_type: "text/html".into(),
            frames: vec![lmperf_e2e::scripted::Frame {
                at: Duration::ZERO,
                bytes: body.into_bytes(),
            }],
            cut: false,
        }
    }))
    .await;
    let dir = temp::dir("ctl-why");
    let sock = format!("unix:{}", dir.join("control.sock").display());
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "[canary]\ninterval = \"200ms\"\n\n[[target]]\nurl = \"{u}\"\nname = \"html\"\nmodel = \"m\"\n\n[[target]]\nurl = \"{u}\"\nname = \"nomodel\"\n\n[[target]]\nurl = \"http://127.0.0.1:{dead}\"\nname = \"dead\"\nmodel = \"m\"\n\n[gpu]\nenabled = false\n\n[net]\nenabled = false\n\n[control]\nlisten = \"{sock}\"\n",
            u = server.url(),
            dead = lmperf_e2e::peers::free_port()
        ),
    )
    .unwrap();
    let agent = spawn_config(&cfg).await;
    let t = Instant::now();
    let status = loop {
        let s = ctl_json(&sock, &["status"]).await;
        let failing = |i: usize| s["targets"][i]["last_error"]["error_message"].is_string();
        if failing(0) && failing(1) {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "{s:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let by_name = |name: &str| {
        status["targets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {status:#}"))
            .clone()
    };
    let html = by_name("html");
    assert_eq!(
        html["last_error"]["error_type"], "non_sse_reply",
        "{html:#}"
    );
    let msg = html["last_error"]["error_message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "HTTP 200 text/html, not an event stream: \"<!doctype html> <html><head><title>Sign in"
        ),
        "{msg}"
    );
    assert!(msg.chars().count() <= 121, "one short line: {msg}");
    let nomodel = by_name("nomodel");
    assert_eq!(nomodel["last_error"]["error_type"], "404", "{nomodel:#}");
    assert_eq!(
        nomodel["last_error"]["error_message"],
        "model discovery: 404 Not Found 404 Not Found nginx",
        "the proxy's page as its text: {nomodel:#}"
    );

    let (code, text, err) = ctl(&["--addr", &sock, "status"], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("  last error: ")
            && text.contains("non_sse_reply: HTTP 200 text/html, not an event stream: ")
            && text.contains("404: model discovery: 404 Not Found 404 Not Found nginx"),
        "{text}"
    );
    let (code, text, err) = ctl(&["--addr", &sock, "recent", "--limit", "4"], &[]).await;
    assert_eq!(code, 0, "{err}");
    let rows: Vec<&str> = text.lines().filter(|l| l.contains(" canary ")).collect();
    assert!(
        rows.len() >= 2
            && rows
                .iter()
                .all(|l| l.contains("non_sse_reply: HTTP 200 text/html")
                    || l.contains("404: model discovery: 404 Not Found")
                    || l.contains("connection_refused: ")),
        "{text}"
    );
    let recent = ctl_json(&sock, &["recent", "--limit", "4"]).await;
    assert!(
        recent["requests"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["error_message"].is_string()),
        "{recent:#}"
    );
    // Failing since the start: diagnosed with the first error, not "nothing to diagnose";
    // a WARN line for each target going down.
    let t = Instant::now();
    let text = loop {
        let (code, text, err) = ctl(&["--addr", &sock, "diagnose"], &[]).await;
        assert_eq!(code, 0, "{err}");
        if text
            .matches("canaries failed, none ok since the start")
            .count()
            == 3
        {
            break text;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "{text}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        text.contains("unreachable since ")
            && text.contains("first connection_refused")
            && text.contains("failing since ")
            && text.contains("first non_sse_reply: HTTP 200 text/html, not an event stream")
            && text.contains("first 404: model discovery: 404 Not Found")
            && !text.contains("nothing to diagnose"),
        "{text}"
    );
    let d = ctl_json(&sock, &["diagnose"]).await;
    let dead = d["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["target"] == "dead")
        .unwrap_or_else(|| panic!("{d:#}"))
        .clone();
    assert_eq!(
        (
            dead["down"]["kind"].as_str(),
            dead["down"]["since_start"].as_bool(),
            dead["down"]["first_error"]["error_type"].as_str()
        ),
        (Some("unreachable"), Some(true), Some("connection_refused")),
        "{dead:#}"
    );
    let log = agent.stderr_text();
    for name in ["dead", "html", "nomodel"] {
        assert_eq!(
            log.lines()
                .filter(
                    |l| l.contains("Target down: ") && l.contains(&format!("target_name={name}"))
                )
                .count(),
            1,
            "one WARN line as {name} went down: {log}"
        );
    }
    // The page's first bytes are quoted (what came back), never the page.
    assert!(
        log.lines().all(|l| l.len() < 1000
            && !l.contains("corporate proxy</p><p>corporate proxy")
            && !l.contains("<center>")),
        "a log line carries the page: {log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An outage in the middle of a target's life (issue 50): 503s for a while, then answers
/// again. One WARN line as it goes down (with the first error), `ctl diagnose` says it failing
/// while it lasts, one WARN line when it answers again with how long it was down.
#[tokio::test(flavor = "multi_thread")]
async fn a_target_going_down_and_back_is_said_once_each_way() {
    let outage = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let o = outage.clone();
    let server = ScriptedServer::start(Arc::new(move |_, _| {
        if o.load(std::sync::atomic::Ordering::SeqCst) {
            Reply::json(
                503,
                r#"{"error":{"message":"engine restarting","type":"ServiceUnavailable"}}"#,
            )
        } else {
            Reply::sse(chat_stream(
                2,
                Duration::from_millis(2),
                Duration::from_millis(2),
                4,
            ))
        }
    }))
    .await;
    let dir = temp::dir("ctl-down-up");
    let sock = format!("unix:{}", dir.join("control.sock").display());
    let cfg = write_config(&dir, &server.url(), &format!("listen = \"{sock}\"\n"));
    let agent = spawn_config(&cfg).await;
    let ok = |s: &Value| s["targets"][0]["by_outcome"]["ok"].as_u64().unwrap_or(0);
    let t = Instant::now();
    while ok(&ctl_json(&sock, &["status"]).await) < 3 {
        assert!(t.elapsed() < Duration::from_secs(15), "no canary ok");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    outage.store(true, std::sync::atomic::Ordering::SeqCst);
    let t = Instant::now();
    let text = loop {
        let (code, text, err) = ctl(&["--addr", &sock, "diagnose"], &[]).await;
        assert_eq!(code, 0, "{err}");
        if text.contains("failing since ") {
            break text;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        text.contains("first 503: engine restarting") && !text.contains("none ok since the start"),
        "{text}"
    );
    // Seconds into a fresh agent (no baseline yet), the outage is the incident's root,
    // never "errors flat" (issue 50).
    assert!(
        text.contains("root_confirmed")
            && text.contains("error_burst 1.00: target failing since ")
            && !text.contains("errors flat"),
        "{text}"
    );
    outage.store(false, std::sync::atomic::Ordering::SeqCst);
    let t = Instant::now();
    while !agent.stderr_text().contains("Target answers again after") {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{}",
            agent.stderr_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = agent.stderr_text();
    let (down, up): (Vec<&str>, Vec<&str>) = (
        log.lines()
            .filter(|l| l.contains("Target down: "))
            .collect(),
        log.lines()
            .filter(|l| l.contains("Target answers again after"))
            .collect(),
    );
    assert_eq!((down.len(), up.len()), (1, 1), "{log}");
    assert!(
        down[0].contains("WARN")
            && down[0].contains("failing since")
            && down[0].contains("first 503: engine restarting"),
        "{}",
        down[0]
    );
    assert!(
        up[0].contains("WARN") && up[0].contains("s failing ("),
        "{}",
        up[0]
    );
    // The diagnosis announced it once, as the outage with its first error.
    let said: Vec<&str> = log.lines().filter(|l| l.contains("Diagnosis: ")).collect();
    assert!(
        said.len() == 1
            && said[0].contains("Diagnosis: error_burst 1.00: target failing since ")
            && said[0].contains("first 503: engine restarting"),
        "{said:?}"
    );
    // The diagnosis says it at its next evaluation (each second).
    let t = Instant::now();
    loop {
        let (code, text, _) = ctl(&["--addr", &sock, "diagnose"], &[]).await;
        assert_eq!(code, 0);
        if !text.contains("failing since ") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "answers again: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
