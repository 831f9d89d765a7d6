//! `lmperf run` traffic shapes (issue 27): requests spread over LoRA adapters
//! (`--lora-modules`), one schedule over several endpoints (`--target` repeated), and the
//! agent's canary probes under a benchmark's load (`--probe-rate`), against scripted servers
//! whose own timings are known.

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::scripted::{Frame, Received, Reply, ScriptedServer};
use lmperf_e2e::slot_server::k_slot_server;
use lmperf_e2e::temp;
use serde_json::Value;

fn frame(ms: u64, json: &str) -> Frame {
    Frame {
        at: Duration::from_millis(ms),
        bytes: format!("data: {json}\n\n").into_bytes(),
    }
}

/// A completions stream: first token at `first_ms`, the second and the end at `2 × first_ms`.
fn stream(first_ms: u64) -> Reply {
    let text = r#"{"choices":[{"index":0,"text":"w "}]}"#;
    Reply::sse(vec![
        frame(first_ms, text),
        frame(2 * first_ms, text),
        frame(
            2 * first_ms,
            r#"{"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":2}}"#,
        ),
        frame(2 * first_ms, "[DONE]"),
    ])
}

/// `/tokenize` (words), `/v1/completions` answered by `first_ms(request)`, else 404.
fn server_by(
    first_ms: impl Fn(&Received) -> u64 + Send + Sync + 'static,
) -> lmperf_e2e::scripted::Script {
    Arc::new(move |req, _| {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        if req.path == "/tokenize" {
            let n = body["content"]
                .as_str()
                .map_or(0, |s| s.split_whitespace().count());
            return Reply::json(
                200,
                &serde_json::json!({ "tokens": vec![1; n] }).to_string(),
            );
        }
        if req.path != "/v1/completions" {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        stream(first_ms(req))
    })
}

fn model_of(req: &Received) -> String {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    body["model"].as_str().unwrap_or_default().to_owned()
}

async fn lmperf(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || Command::new(lmperf_bin()).args(&args).output().unwrap())
        .await
        .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn summary(dir: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

fn ok(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two adapters, `slow` answering 2× later than `fast` (first token 120 vs 60 ms): each request
/// names its adapter as `model`, round-robin; each adapter's block has its own requests and
/// latencies, the report a row per adapter, and `compare` the pair `fast vs slow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_adapters_each_have_their_block() {
    let server = ScriptedServer::start(server_by(
        |req| {
            if model_of(req) == "slow" { 120 } else { 60 }
        },
    ))
    .await;
    let dir = temp::dir("lora");
    let d = dir.to_str().unwrap().to_owned();
    let out = lmperf(args(&[
        "run",
        "--target",
        &server.url(),
        "--model",
        "base",
        "--seq-lengths",
        "8",
        "--output-len",
        "2",
        "--num-prompts",
        "8",
        "--batch-sizes",
        "2",
        "--lora-modules",
        "fast",
        "slow",
        "--lora-assignment",
        "round-robin",
        "--output-dir",
        &d,
    ]))
    .await;
    ok(&out);
    let models: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/completions")
        .map(model_of)
        .collect();
    assert_eq!(
        models.iter().filter(|m| *m == "fast").count(),
        4,
        "{models:?}"
    );
    assert_eq!(
        models.iter().filter(|m| *m == "slow").count(),
        4,
        "{models:?}"
    );
    let s = summary(&dir);
    let b = &s["benchmarks"][0];
    let (fast, slow) = (&b["adapters"]["fast"], &b["adapters"]["slow"]);
    assert_eq!(
        (fast["num_requests"].as_u64(), slow["num_requests"].as_u64()),
        (Some(4), Some(4))
    );
    assert_eq!(
        (fast["completed"].as_u64(), slow["completed"].as_u64()),
        (Some(4), Some(4))
    );
    let p50 = |g: &Value, m: &str| g[m]["p50"].as_f64().unwrap();
    let (tf, ts) = (p50(fast, "ttft_ms"), p50(slow, "ttft_ms"));
    let (ef, es) = (p50(fast, "e2el_ms"), p50(slow, "e2el_ms"));
    println!("TTFT p50 fast {tf:.1} ms slow {ts:.1} ms; E2EL p50 fast {ef:.1} slow {es:.1}");
    // The server's clock: 60 vs 120 ms to the first token, 120 vs 240 ms to the end; a loaded
    // machine only adds (a wake-up late by tens of ms).
    assert!((60.0..110.0).contains(&tf), "fast TTFT {tf}");
    assert!((120.0..180.0).contains(&ts), "slow TTFT {ts}");
    assert!(ts - tf > 30.0, "slow {ts} fast {tf}");
    assert!(
        (240.0..320.0).contains(&es) && (120.0..190.0).contains(&ef),
        "{ef} {es}"
    );
    let rows: Vec<Value> = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let named: Vec<&str> = rows
        .iter()
        .map(|r| r["adapter"].as_str().unwrap())
        .collect();
    assert_eq!(
        named,
        [
            "fast", "slow", "fast", "slow", "fast", "slow", "fast", "slow"
        ]
    );
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("<h2>LoRA adapters</h2>"));
    assert!(
        html.contains(r#"data-adapter="slow" data-requests="4""#),
        "report row"
    );
    // compare: the run against itself matches each adapter; the pair fast vs slow shows +60 ms.
    let cdir = temp::dir("lora-compare");
    let c = cdir.to_str().unwrap().to_owned();
    ok(&lmperf(args(&["compare", &d, &d, "--output-dir", &c])).await);
    let cj: Value =
        serde_json::from_str(&std::fs::read_to_string(cdir.join("compare.json")).unwrap()).unwrap();
    let names: Vec<&str> = cj["benchmarks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["benchmark"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"c2_in8 [adapter slow]"), "{names:?}");
    let pair = &cj["adapter_pairs"][0];
    assert_eq!(pair["benchmark"], "c2_in8 [adapter fast vs slow]");
    let ttft = pair["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == "ttft_p50")
        .unwrap();
    let delta = ttft["delta"].as_f64().unwrap();
    assert!((ts - tf - delta).abs() < 1.0 && delta > 30.0, "{delta}");
    assert_eq!(
        (
            pair["base_requests"].as_u64(),
            pair["new_requests"].as_u64()
        ),
        (Some(4), Some(4))
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&cdir);
}

/// Two endpoints, the second 3× slower (first token 150 vs 50 ms): round-robin gives each half
/// of the schedule, the per-endpoint blocks show the slow one and sum to the totals;
/// least-outstanding sends more to the fast one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endpoint_is_visible_in_its_block() {
    let fast = ScriptedServer::start(server_by(|_| 50)).await;
    let slow = ScriptedServer::start(server_by(|_| 150)).await;
    let (fu, su) = (fast.url(), slow.url());
    let dir = temp::dir("endpoints");
    let d = dir.to_str().unwrap().to_owned();
    let base = |policy: &str, d: &str| {
        args(&[
            "run",
            "--target",
            &su,
            "--target",
            &fu,
            "--model",
            "m",
            "--seq-lengths",
            "8",
            "--output-len",
            "2",
            "--num-prompts",
            "12",
            "--batch-sizes",
            "2",
            "--endpoint-policy",
            policy,
            "--output-dir",
            d,
        ])
    };
    ok(&lmperf(base("round-robin", &d)).await);
    let s = summary(&dir);
    let b = &s["benchmarks"][0];
    let (ef, es) = (
        &b["endpoints"][format!("{fu}/")],
        &b["endpoints"][format!("{su}/")],
    );
    assert_eq!(
        (ef["num_requests"].as_u64(), es["num_requests"].as_u64()),
        (Some(6), Some(6)),
        "{b}"
    );
    let completions = |srv: &ScriptedServer| {
        srv.requests()
            .iter()
            .filter(|r| r.path == "/v1/completions")
            .count()
    };
    assert_eq!((completions(&fast), completions(&slow)), (6, 6));
    let n = |g: &Value, k: &str| g[k].as_u64().unwrap();
    assert_eq!(
        n(ef, "num_requests") + n(es, "num_requests"),
        n(b, "num_requests")
    );
    assert_eq!(n(ef, "completed") + n(es, "completed"), n(b, "completed"));
    assert_eq!(
        n(ef, "total_output_tokens") + n(es, "total_output_tokens"),
        n(b, "total_output_tokens")
    );
    let p50 = |g: &Value, m: &str| g[m]["p50"].as_f64().unwrap();
    let (tf, ts) = (p50(ef, "ttft_ms"), p50(es, "ttft_ms"));
    println!("TTFT p50 fast {tf:.1} ms slow {ts:.1} ms");
    assert!((50.0..100.0).contains(&tf), "fast TTFT {tf}");
    assert!((150.0..200.0).contains(&ts), "slow TTFT {ts}");
    assert!((300.0..380.0).contains(&p50(es, "e2el_ms")), "slow E2EL");
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        html.contains("<h2>Endpoints</h2>")
            && html.contains(&format!(r#"data-endpoint="{su}/" data-requests="6""#))
    );
    // Least outstanding: the fast endpoint frees its request 3× sooner and takes more.
    let dir2 = temp::dir("endpoints-lo");
    ok(&lmperf(base("least-outstanding", dir2.to_str().unwrap())).await);
    let s = summary(&dir2);
    let e = &s["benchmarks"][0]["endpoints"];
    let (nf, ns) = (
        n(&e[format!("{fu}/")], "num_requests"),
        n(&e[format!("{su}/")], "num_requests"),
    );
    println!("least-outstanding: fast {nf}, slow {ns}");
    assert_eq!(nf + ns, 12);
    assert!(nf >= ns + 4, "fast {nf} slow {ns}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}

/// Probes at 5/s beside a load against a 4-slot server (200 ms per request): with 16 in
/// flight (12 queued) a probe waits for a slot, with 1 in flight it gets one at once. Probe
/// TTFT p99 is higher under load; the probes are apart from the benchmark's counts; a
/// `probe_` gate trips only under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_under_load_wait_for_a_slot() {
    let (url, _) = k_slot_server(4, Duration::from_millis(200)).await;
    let run = |conc: &str, prompts: &str, d: &std::path::Path| {
        args(&[
            "run",
            "--target",
            &url,
            "--model",
            "m",
            "--seq-lengths",
            "8",
            "--output-len",
            "4",
            "--num-prompts",
            prompts,
            "--batch-sizes",
            conc,
            "--probe-rate",
            "5",
            "--fail-on",
            "probe_ttft_p99_ms>300",
            "--output-dir",
            d.to_str().unwrap(),
        ])
    };
    let idle_dir = temp::dir("probes-idle");
    ok(&lmperf(run("1", "5", &idle_dir)).await);
    let loaded_dir = temp::dir("probes-loaded");
    let out = lmperf(run("16", "32", &loaded_dir)).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (idle, loaded) = (summary(&idle_dir), summary(&loaded_dir));
    let (bi, bl) = (&idle["benchmarks"][0], &loaded["benchmarks"][0]);
    assert_eq!(
        (bi["num_requests"].as_u64(), bl["num_requests"].as_u64()),
        (Some(5), Some(32))
    );
    let probes = |b: &Value| {
        (
            b["probes"]["num_requests"].as_u64().unwrap(),
            b["probes"]["ttft_ms"]["p99"].as_f64().unwrap(),
        )
    };
    let ((ni, pi), (nl, pl)) = (probes(bi), probes(bl));
    println!("probe TTFT p99: idle {pi:.1} ms ({ni} probes), loaded {pl:.1} ms ({nl} probes)");
    // Idle: 1 s of load at 5/s; loaded: 32 requests and the probes over 4 slots of 200 ms,
    // about 2.1 s.
    assert!((4..=9).contains(&ni), "{ni}");
    assert!((7..=20).contains(&nl), "{nl}");
    // Idle: a free slot, first token at once (plus loopback and a busy machine's wake-up).
    assert!(pi < 100.0, "idle probe TTFT p99 {pi}");
    // Loaded: about 12 queued ahead at 4 per 200 ms, the probe waits 400–600 ms.
    assert!(pl > 300.0, "loaded probe TTFT p99 {pl}");
    assert_eq!(idle["failed_gates"].as_array().unwrap().len(), 0);
    assert_eq!(loaded["failed_gates"][0], "probe_ttft_p99_ms>300");
    let rows = std::fs::read_to_string(loaded_dir.join("requests.jsonl")).unwrap();
    let probe_rows = rows
        .lines()
        .filter(|l| l.contains(r#""probe":true"#))
        .count();
    assert_eq!(probe_rows as u64, nl);
    assert_eq!(rows.lines().count() as u64, 32 + nl);
    let html = std::fs::read_to_string(loaded_dir.join("report.html")).unwrap();
    assert!(html.contains("<h2>Probes under load</h2>"));
    let _ = std::fs::remove_dir_all(&idle_dir);
    let _ = std::fs::remove_dir_all(&loaded_dir);
}
