//! The serving path through a real router (issue 36.1): NVIDIA Dynamo 1.6.1's frontend (its
//! router, round-robin) in front of mocker workers on CPU, `--discovery-backend file
//! --request-plane tcp`, aggregated (2 workers) and disaggregated (1 prefill + 1 decode).
//! `lmperf run --target-kind router` asks each request which worker served it (`nvext`
//! `extra_fields: ["worker_id"]`); every row's worker is checked against the workers' own
//! request log (`request received request_id=… instance_id=…`), and the per-worker blocks sum
//! to the benchmark.
//!
//! Needs `.venv-serving` (`tests/peers/install-serving.sh`); without it the tests say so and
//! pass, unless `LMPERF_REQUIRE_SERVING=1`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lmperf_e2e::agent::{lmperf_bin, workspace_root};
use lmperf_e2e::peers::free_port;
use lmperf_e2e::temp;

/// The Dynamo processes of one test; killed when dropped.
struct Dynamo {
    children: Vec<Child>,
    url: String,
    dir: PathBuf,
}

impl Drop for Dynamo {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn venv() -> Option<PathBuf> {
    let v = workspace_root().join(".venv-serving");
    if v.join("bin/python").is_file() && v.join("model/config.json").is_file() {
        return Some(v);
    }
    assert!(
        std::env::var("LMPERF_REQUIRE_SERVING").as_deref() != Ok("1"),
        "LMPERF_REQUIRE_SERVING=1 but {} is missing: run tests/peers/install-serving.sh",
        v.display()
    );
    eprintln!("skipped: no .venv-serving (tests/peers/install-serving.sh)");
    None
}

/// Starts the frontend and one mocker process per `modes` entry (`agg` with `--num-workers`,
/// `prefill`, `decode`), each logging to its own file, and waits until a chat request passes.
fn start(name: &str, mockers: &[(&str, u32)]) -> Option<Dynamo> {
    let v = venv()?;
    let dir = temp::dir(name);
    let port = free_port();
    let py = v.join("bin/python");
    let spawn = |args: &[&str], log: &str| {
        let out = std::fs::File::create(dir.join(log)).unwrap();
        Command::new(&py)
            .args(args)
            .env("DYN_FILE_KV", dir.join("kv"))
            .env("DYN_LOG", "info")
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap()
    };
    let common = ["--discovery-backend", "file", "--request-plane", "tcp"];
    let port_s = port.to_string();
    let mut children = vec![spawn(
        &[
            &[
                "-m",
                "dynamo.frontend",
                "--http-port",
                &port_s,
                "--router-mode",
                "round-robin",
            ][..],
            &common[..],
        ]
        .concat(),
        "frontend.log",
    )];
    let model = v.join("model");
    for (i, (mode, workers)) in mockers.iter().enumerate() {
        let n = workers.to_string();
        let args = [
            &[
                "-m",
                "dynamo.mocker",
                "--model-path",
                model.to_str().unwrap(),
            ][..],
            &["--model-name", "gemma", "--speedup-ratio", "10"],
            &["--disaggregation-mode", mode, "--num-workers", &n],
            &common[..],
        ]
        .concat();
        children.push(spawn(&args, &format!("mocker{i}.log")));
    }
    let d = Dynamo {
        children,
        url: format!("http://127.0.0.1:{port}"),
        dir,
    };
    let body = r#"{"model":"gemma","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let ok = Command::new("curl")
            .args([
                "-sf",
                "-m",
                "5",
                "-H",
                "content-type: application/json",
                "-d",
                body,
            ])
            .arg(format!("{}/v1/chat/completions", d.url))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(d);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!(
        "Dynamo did not serve within 120 s; logs in {}",
        d.dir.display()
    );
}

/// The workers' own log: request id → the instance id of each worker that received it.
fn received(d: &Dynamo) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in std::fs::read_dir(&d.dir).unwrap().flatten() {
        if !e.file_name().to_string_lossy().starts_with("mocker") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap();
        for line in text.lines().filter(|l| l.contains("request received")) {
            let field = |k: &str| {
                let clean = strip_ansi(line);
                clean
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(k).map(|v| v.trim_matches('"').to_owned()))
            };
            if let (Some(r), Some(i)) = (field("request_id="), field("instance_id=")) {
                m.entry(r).or_default().push(i);
            }
        }
    }
    m
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut esc = false;
    for c in s.chars() {
        match (esc, c) {
            (false, '\u{1b}') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

fn run(d: &Dynamo, out: &Path) -> (Vec<serde_json::Value>, String) {
    let o = Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            &d.url,
            "--target-kind",
            "router",
            "--api",
            "chat",
        ])
        .args([
            "--model",
            "gemma",
            "--batch-sizes",
            "1",
            "--seq-lengths",
            "16",
        ])
        .args(["--output-len", "4", "--num-prompts", "12", "--output-dir"])
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{err}");
    let rows = std::fs::read_to_string(out.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (rows, err)
}

/// Issue 51: every routed row carries Dynamo's own clock (`dynamo_timing`) and its TTFT split,
/// the four segments summing to the client's TTFT within 1 ms; each worker (pair) block holds
/// the split of its requests and the terminal prints it. Returns the rows' mean segments.
fn check_split(rows: &[serde_json::Value], out: &Path, err: &str) -> [f64; 4] {
    const SEGMENTS: [&str; 4] = [
        "ttft_frontend_ms",
        "ttft_router_queue_ms",
        "ttft_prefill_ms",
        "ttft_transfer_and_first_decode_ms",
    ];
    let mut sums = [0.0; 4];
    for r in rows {
        assert_eq!(r["server_timing_source"], "dynamo_timing", "{r}");
        let parts: Vec<f64> = SEGMENTS
            .iter()
            .map(|k| r[k].as_f64().unwrap_or_else(|| panic!("no {k}: {r}")))
            .collect();
        let ttft = r["ttft_ms"].as_f64().unwrap();
        let total: f64 = parts.iter().sum();
        assert!(
            (total - ttft).abs() <= 1.0,
            "{parts:?} sum {total} vs TTFT {ttft}: {r}"
        );
        assert!(
            parts[1] >= 0.0 && parts[2] >= 0.0 && parts[0] > 0.0,
            "{parts:?}: {r}"
        );
        for (s, v) in sums.iter_mut().zip(&parts) {
            *s += v / rows.len() as f64;
        }
    }
    let workers = summary(out)["benchmarks"][0]["workers"].clone();
    let with_split: u64 = workers
        .as_object()
        .unwrap()
        .values()
        .map(|b| b["ttft_split"]["requests"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(with_split, rows.len() as u64, "{workers}");
    assert!(
        err.matches("TTFT split (").count() == workers.as_object().unwrap().len()
            && err.contains("p50 frontend "),
        "{err}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert_eq!(
        html.matches("data-split-requests=").count(),
        workers.as_object().unwrap().len(),
        "one split row per worker (pair) in the report"
    );
    println!(
        "mean TTFT split (frontend, router queue, prefill, transfer and first decode): {sums:.3?} ms"
    );
    sums
}

fn summary(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

/// The row's request id in the workers' log: the response id less `chatcmpl-`.
fn request_id(row: &serde_json::Value) -> String {
    let id = row["response_id"].as_str().unwrap_or_default();
    id.strip_prefix("chatcmpl-").unwrap_or(id).to_owned()
}

#[test]
fn dynamo_agg_every_request_names_the_worker_that_logged_it() {
    let Some(d) = start("dynamo-agg", &[("agg", 2)]) else {
        return;
    };
    let out = d.dir.join("run");
    let (rows, err) = run(&d, &out);
    let log = received(&d);
    assert_eq!(rows.len(), 12);
    check_split(&rows, &out, &err);
    // `lmperf compare` compares the split (a run against itself: every segment unchanged).
    let cmp = d.dir.join("compare");
    let o = Command::new(lmperf_bin())
        .arg("compare")
        .args([&out, &out])
        .arg("--output-dir")
        .arg(&cmp)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cmp.join("compare.json")).unwrap()).unwrap();
    let metrics = c["benchmarks"][0]["metrics"].as_array().unwrap();
    for segment in ["ttft_frontend", "ttft_router_queue", "ttft_prefill"] {
        let m = metrics
            .iter()
            .find(|m| m["metric"] == format!("{segment}_p50"))
            .unwrap_or_else(|| panic!("{segment}_p50 not compared: {c}"));
        assert_eq!(m["verdict"], "unchanged", "{m}");
    }
    let mut per_worker: BTreeMap<String, usize> = BTreeMap::new();
    for r in &rows {
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["worker_attribution"], "dynamo_nvext", "{r}");
        assert_eq!(r["worker_role"], "agg", "{r}");
        let w = r["worker_id"].as_str().unwrap().to_owned();
        assert_eq!(log[&request_id(r)], vec![w.clone()], "{r}");
        *per_worker.entry(w).or_default() += 1;
    }
    assert_eq!(
        per_worker.len(),
        2,
        "round-robin over two workers: {per_worker:?}"
    );
    let workers = &summary(&out)["benchmarks"][0]["workers"];
    for (w, n) in &per_worker {
        assert_eq!(workers[w]["num_requests"], *n as u64, "{workers}");
    }
}

#[test]
fn dynamo_disaggregated_names_the_prefill_and_the_decode_worker() {
    let Some(d) = start("dynamo-pd", &[("prefill", 1), ("decode", 1)]) else {
        return;
    };
    let out = d.dir.join("run");
    let (rows, err) = run(&d, &out);
    let log = received(&d);
    check_split(&rows, &out, &err);
    for r in &rows {
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["worker_role"], "decode", "{r}");
        let (p, w) = (
            r["prefill_worker_id"].as_str().unwrap().to_owned(),
            r["worker_id"].as_str().unwrap().to_owned(),
        );
        assert_ne!(p, w);
        let mut got = log[&request_id(r)].clone();
        got.sort();
        let mut want = vec![p.clone(), w.clone()];
        want.sort();
        assert_eq!(got, want, "{r}");
    }
    let workers = summary(&out)["benchmarks"][0]["workers"].clone();
    let total: u64 = workers
        .as_object()
        .unwrap()
        .values()
        .map(|b| b["num_requests"].as_u64().unwrap())
        .sum();
    assert_eq!(total, rows.len() as u64, "{workers}");
}

/// Issue 51.2 on the live agent: canaries to the real Dynamo frontend (`--target-kind
/// router`) record each TTFT segment per worker on `/metrics`
/// (`lmperf_canary_ttft_segment_duration_seconds`, one series per segment and worker): the
/// four segments counted once per routed canary, for both workers.
#[test]
fn dynamo_agent_records_the_ttft_segments_per_worker() {
    let Some(d) = start("dynamo-agent", &[("agg", 2)]) else {
        return;
    };
    let agent = lmperf_e2e::agent::Agent::spawn(
        &[
            "--target",
            &d.url,
            "--target-kind",
            "router",
            "--api",
            "chat",
            "--model",
            "gemma",
            "--interval",
            "200ms",
            "--max-tokens",
            "4",
            "--otlp-endpoint",
            "http://127.0.0.1:9",
        ],
        &[],
    );
    let count = |metrics: &str, segment: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("lmperf_canary_ttft_segment_duration_seconds_count{")
                    && l.contains(&format!("lmperf_ttft_segment=\"{segment}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let t = Instant::now();
    let metrics = loop {
        let (_, m) = agent.get("/metrics");
        if count(&m, "prefill") >= 6.0 {
            break m;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{m}");
        std::thread::sleep(Duration::from_millis(250));
    };
    let n = count(&metrics, "frontend");
    for segment in ["router_queue", "prefill", "transfer_and_first_decode"] {
        // Read once: the four series of a canary are recorded together.
        assert!(
            (count(&metrics, segment) - n).abs() <= 1.0,
            "{segment}: {metrics}"
        );
    }
    let workers: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("lmperf_canary_ttft_segment_duration_seconds_count{"))
        .filter_map(|l| l.split("lmperf_worker_id=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        workers.len(),
        2,
        "round-robin over two workers: {workers:?}"
    );
}
