//! The serving path through a real router (issue 36.1): NVIDIA Dynamo 1.6.1's frontend (its
//! KV router) in front of mocker workers on CPU, `--discovery-backend file --request-plane
//! tcp`, aggregated (2 workers) and disaggregated (1 prefill + 1 decode). One frontend serves
//! every test (`lmperf_e2e::dynamo::Frontend`, issue 51), each test its own model from its own namespace, as a
//! frontend serving several models does.
//! `lmperf run --target-kind router` asks each request which worker served it (`nvext`
//! `extra_fields: ["worker_id"]`); every row's worker is checked against the workers' own
//! request log (`request received request_id=… instance_id=…`), and the per-worker blocks sum
//! to the benchmark.
//!
//! Needs `.venv-serving` (`tests/peers/install-serving.sh`); without it the tests say so and
//! pass, unless `LMPERF_REQUIRE_SERVING=1`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::dynamo::{Dynamo, start, wait_serving};
use lmperf_e2e::temp;

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

/// `lmperf run --target-kind router` of 12 requests to `d`'s model, 2 in flight (the KV
/// router's load-only cost then spreads them over two idle workers).
fn run(d: &Dynamo, out: &Path) -> (Vec<serde_json::Value>, String) {
    run_with(d, out, 16, 2)
}

/// [`run`] with prompts of `seq_len` tokens, `concurrency` in flight.
fn run_with(
    d: &Dynamo,
    out: &Path,
    seq_len: u32,
    concurrency: usize,
) -> (Vec<serde_json::Value>, String) {
    let (seq, conc) = (seq_len.to_string(), concurrency.to_string());
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
            &d.model,
            "--batch-sizes",
            &conc,
            "--seq-lengths",
            &seq,
        ])
        .args(["--output-len", "4", "--num-prompts", "12", "--output-dir"])
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{err}");
    (lmperf_e2e::request_rows(out), err)
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
    let cmp = out.with_file_name("compare");
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
        "two in flight over two workers: {per_worker:?}"
    );
    let workers = &summary(&out)["benchmarks"][0]["workers"];
    for (w, n) in &per_worker {
        assert_eq!(workers[w]["num_requests"], *n as u64, "{workers}");
    }
}

/// The disaggregated run's rows: each names its prefill and its decode worker, as the workers'
/// own request logs received it, and the per-worker-pair blocks sum to the benchmark.
fn check_pd_workers(d: &Dynamo, rows: &[serde_json::Value], out: &Path) {
    let log = received(d);
    for r in rows {
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
    let workers = summary(out)["benchmarks"][0]["workers"].clone();
    let total: u64 = workers
        .as_object()
        .unwrap()
        .values()
        .map(|b| b["num_requests"].as_u64().unwrap())
        .sum();
    assert_eq!(total, rows.len() as u64, "{workers}");
}

/// The real Dynamo P/D (1 prefill + 1 decode mocker): every request names its prefill and its
/// decode worker as their own logs received it (issue 36.1), and (issue 51) with a 10×
/// lower `--kv-transfer-bandwidth` (given to both mockers; `nvext.timing` says the transfer as
/// the router's `kv_transfer_estimated_latency_ms`, after 1.6.1's `ttft_ms`) only
/// `transfer_and_first_decode` grows; the frontend, router queue and prefill segments do not.
/// Every request's segments sum to its TTFT within 1 ms (`check_split`).
#[test]
fn dynamo_pd_a_slower_kv_transfer_grows_only_its_segment() {
    let mut means = Vec::new();
    for (bw, name) in [("1.0", "dynamo-pd-10"), ("0.1", "dynamo-pd-01")] {
        // A model per bandwidth on the shared frontend, the first's mockers gone before the
        // second's start.
        let Some(mut d) = start(name, &[]) else {
            return;
        };
        d.add_mocker_with("prefill", 1, &["--kv-transfer-bandwidth", bw]);
        d.add_mocker_with("decode", 1, &["--kv-transfer-bandwidth", bw]);
        wait_serving(&d);
        let out = d.dir.join("run");
        let (rows, err) = run_with(&d, &out, 1024, 1);
        assert!(rows.iter().all(|r| r["outcome"] == "ok"), "{err}");
        check_pd_workers(&d, &rows, &out);
        let m = check_split(&rows, &out, &err);
        println!("--kv-transfer-bandwidth {bw} GB/s: mean segments {m:.2?} ms");
        means.push(m);
    }
    let (a, b) = (means[0], means[1]);
    let grew = b[3] - a[3];
    assert!(
        grew > 30.0 && b[3] > 4.0 * a[3],
        "transfer and first decode {a:?} → {b:?}"
    );
    for (i, name) in ["frontend", "router queue", "prefill"].iter().enumerate() {
        assert!(
            (b[i] - a[i]).abs() < grew / 5.0,
            "{name} moved {:.2} ms with the transfer's {grew:.2} ms: {a:?} → {b:?}",
            b[i] - a[i]
        );
    }
}

/// Issue 51.2 on the live agent: canaries to the real Dynamo frontend (`--target-kind
/// router`) record each TTFT segment per worker on `/metrics`
/// (`lmperf_canary_ttft_segment_duration_seconds`, one series per segment and worker): the
/// four segments counted once per routed canary, for both workers (the KV router breaks the
/// ties of two idle workers at random: both serve within 30 s of canaries every 200 ms).
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
            &d.model,
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
    let workers = |metrics: &str| -> std::collections::BTreeSet<String> {
        metrics
            .lines()
            .filter(|l| l.starts_with("lmperf_canary_ttft_segment_duration_seconds_count{"))
            .filter_map(|l| {
                Some(
                    l.split("lmperf_worker_id=\"")
                        .nth(1)?
                        .split('"')
                        .next()?
                        .to_owned(),
                )
            })
            .collect()
    };
    let t = Instant::now();
    let metrics = loop {
        let (_, m) = agent.get("/metrics");
        if count(&m, "prefill") >= 6.0 && workers(&m).len() >= 2 {
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
    assert_eq!(workers(&metrics).len(), 2, "{metrics}");
}

/// The instance ids mocker process `i` logged receiving requests as (`instance_id=`).
fn instance_ids(d: &Dynamo, i: usize) -> std::collections::BTreeSet<String> {
    let text = std::fs::read_to_string(d.dir.join(format!("mocker{i}.log"))).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("request received"))
        .filter_map(|l| {
            strip_ansi(l).split_whitespace().find_map(|w| {
                w.strip_prefix("instance_id=")
                    .map(|v| v.trim_matches('"').to_owned())
            })
        })
        .collect()
}

/// The agent's workers of its one target (`targets[0].worker_probes.workers`), by id: those of
/// its model (the shared frontend's page lists every test's workers; a probe pinned to
/// another model's is refused 400, and the agent says it `other_model`).
fn probed(agent: &lmperf_e2e::agent::Agent) -> BTreeMap<String, serde_json::Value> {
    agent.status()["targets"][0]["worker_probes"]["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["state"] != "other_model")
        // Another test's worker killed before this agent's probe could tell its model.
        .filter(|w| w["state"] != "gone" || w["probes_ok"].as_u64().unwrap_or(0) > 0)
        .filter_map(|w| Some((w["id"].as_str()?.to_owned(), w.clone())))
        .collect()
}

/// Issue 51.3 on the real Dynamo (KV router, 2 mocker processes of one worker each): the
/// agent probes each worker pinned to it (every probe counted `ok` only when the reply named
/// the pinned worker; the ids are the mockers' own `instance_id`s); a third mocker started
/// later is probed within 30 s; a killed one is said gone (left the router's page) within
/// 30 s, no longer probed, while the agent and the other workers' probes go on. The frontend
/// serves the other tests' models too: their workers, on its page, are never probed as failing.
#[test]
fn dynamo_every_worker_gets_pinned_probes_and_one_killed_is_said_gone() {
    let Some(mut d) = start("dynamo-probes", &[("agg", 1), ("agg", 1)]) else {
        return;
    };
    let dir = temp::dir("dynamo-probes-agent");
    let cfg = dir.join("lmperf.toml");
    std::fs::write(
        &cfg,
        format!(
            "[canary]\ninterval = \"1s\"\nmax_tokens = 4\n\n[[target]]\nurl = \"{}\"\nname = \"dynamo\"\nmodel = \"{}\"\nkind = \"router\"\nmetrics_interval = \"1s\"\nworker_probe_interval = \"2s\"\nworker_probe_max_rate = 4.0\n",
            d.url, d.model
        ),
    )
    .unwrap();
    let agent =
        lmperf_e2e::agent::Agent::spawn(&["--config", cfg.to_str().unwrap(), "--no-otlp"], &[]);
    let ok = |w: &serde_json::Value| w["probes_ok"].as_u64().unwrap_or(0);
    let wait = |what: &str, pred: &dyn Fn(&BTreeMap<String, serde_json::Value>) -> bool| {
        let t = Instant::now();
        loop {
            let w = probed(&agent);
            if pred(&w) {
                return (w, t.elapsed());
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{what}: {w:#?}\n{}",
                agent.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    let (w, took) = wait("both workers probed twice", &|w| {
        w.len() == 2 && w.values().all(|w| ok(w) >= 2)
    });
    println!("both workers probed twice after {took:?}");
    let logged: std::collections::BTreeSet<String> = instance_ids(&d, 0)
        .union(&instance_ids(&d, 1))
        .cloned()
        .collect();
    let ids: std::collections::BTreeSet<String> = w.keys().cloned().collect();
    assert_eq!(
        ids, logged,
        "the workers probed are the mockers' own instances"
    );
    assert!(
        w.values()
            .all(|w| w["state"] == "present" && w["registered"] == true),
        "{w:#?}"
    );

    // A third worker, started later: probed within 30 s.
    let third = d.add_mocker("agg", 1);
    let (w, took) = wait("the third worker probed", &|w| {
        w.len() == 3 && w.values().all(|w| ok(w) >= 1)
    });
    println!("third worker probed {took:?} after its start");
    let new: Vec<&String> = w.keys().filter(|k| !ids.contains(*k)).collect();
    let third_ids = instance_ids(&d, third);
    assert!(
        new.len() == 1 && third_ids.contains(new[0]),
        "{new:?} vs {third_ids:?}"
    );

    // One killed: gone within 30 s, its probes stop, the others' go on.
    let victim = instance_ids(&d, 0).into_iter().next().unwrap();
    let _ = d.children[0].kill();
    let _ = d.children[0].wait();
    let (w, took) = wait("the killed worker gone", &|w| w[&victim]["state"] == "gone");
    println!("killed worker said gone {took:?} after the kill");
    let probes_then = w[&victim]["probes"].as_u64().unwrap_or(0);
    let others_then: u64 = w
        .iter()
        .filter(|(k, _)| **k != victim)
        .map(|(_, w)| ok(w))
        .sum();
    std::thread::sleep(Duration::from_secs(5));
    let w = probed(&agent);
    assert_eq!(
        w[&victim]["probes"].as_u64(),
        Some(probes_then),
        "no probe of a gone worker"
    );
    let others_now: u64 = w
        .iter()
        .filter(|(k, _)| **k != victim)
        .map(|(_, w)| ok(w))
        .sum();
    assert!(
        others_now >= others_then + 2,
        "{others_then} → {others_now}: {w:#?}"
    );
    assert!(
        agent
            .stderr_text()
            .contains("Worker left the router's view"),
        "{}",
        agent.stderr_text()
    );
    // The other tests' workers on the shared frontend (other models) are never failing: a
    // probe pinned to one is refused, and it is said `other_model` (the killed one may fail
    // its probes until it leaves the page).
    let stderr = agent.stderr_text();
    let failing: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("Worker failing its pinned probes"))
        .filter(|l| !l.contains(&format!("worker_id={victim}")))
        .collect();
    assert!(failing.is_empty(), "{failing:#?}");
    let (_, metrics) = agent.get("/metrics");
    assert!(
        metrics.contains("lmperf_worker_probe_requests_total{")
            && metrics.contains(&format!("lmperf_worker_id=\"{victim}\"")),
        "{metrics}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 52.4 (first part): SGLang's model gateway names the worker that served each request in
/// its `x-smg-routed-worker-id` response header (lightseekorg/smg, `docs/reference/api`
/// "Response Headers": the worker's URL, `@<rank>` for a data-parallel worker). A scripted
/// gateway that alternates two workers: every row of `lmperf run --target-kind router` names
/// the worker its reply's header said (attribution `smg_header`), and the per-worker blocks
/// of `summary.json` split the benchmark between them. Issue 52.1: the gateway serves no
/// `/list_workers`, so the run's direct phase goes to the workers the replies named.
#[tokio::test(flavor = "multi_thread")]
async fn smg_gateway_header_attributes_each_request() {
    use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let worker = || {
        ScriptedServer::start(Arc::new(|req, _| {
            if req.path.ends_with("/chat/completions") {
                Reply::sse(chat_stream(
                    3,
                    Duration::from_millis(5),
                    Duration::from_millis(2),
                    16,
                ))
            } else {
                Reply::json(200, r#"{"object":"list","data":[{"id":"m"}]}"#)
            }
        }))
    };
    let (w1, w2) = (worker().await, worker().await);
    let names = [w1.url(), format!("{}@1", w2.url())];
    let n = Arc::new(AtomicUsize::new(0));
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path == "/v1/models" {
            return Reply::json(
                200,
                r#"{"object":"list","data":[{"id":"m","owned_by":"sglang"}]}"#,
            );
        }
        if !req.path.ends_with("/chat/completions") {
            return Reply::json(404, r#"{"error":"not found"}"#);
        }
        let w = &names[n.fetch_add(1, Ordering::SeqCst) % 2];
        Reply::WithHeaders {
            status: 200,
            headers: vec![
                ("Content-Type".into(), "text/event-stream".into()),
                ("x-smg-routed-worker-id".into(), w.clone()),
            ],
            frames: chat_stream(3, Duration::from_millis(5), Duration::from_millis(2), 16),
        }
    }))
    .await;
    let url = server.url();
    let out = temp::dir("smg-gateway");
    let o2 = out.clone();
    let o = tokio::task::spawn_blocking(move || {
        Command::new(lmperf_bin())
            .args([
                "run",
                "--target",
                &url,
                "--target-kind",
                "router",
                "--api",
                "chat",
            ])
            .args(["--model", "m", "--batch-sizes", "1", "--seq-lengths", "16"])
            .args(["--output-len", "3", "--num-prompts", "8", "--output-dir"])
            .arg(&o2)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let rows = lmperf_e2e::request_rows(&out);
    assert_eq!(rows.len(), 8);
    let mut per: BTreeMap<String, u64> = BTreeMap::new();
    for r in &rows {
        assert_eq!(r["worker_attribution"], "smg_header", "{r}");
        assert_eq!(r["worker_role"], "agg", "{r}");
        *per.entry(r["worker_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    // The rank suffix is the worker's data-parallel rank, not part of its id.
    let want: BTreeMap<String, u64> = [(w1.url(), 4), (w2.url(), 4)].into();
    assert_eq!(per, want);
    let workers = &summary(&out)["benchmarks"][0]["workers"];
    for (w, n) in &want {
        assert_eq!(workers[w]["num_requests"], *n, "{workers}");
    }
    // The gateway lists no worker (404): the direct workers are those its replies named.
    let path = &summary(&out)["benchmarks"][0]["path"];
    println!("routed versus direct: {path:#}");
    assert_eq!(path["workers_from"], "replies", "{path}");
    let listed: Vec<&str> = path["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    let mut urls = [format!("{}/", w1.url()), format!("{}/", w2.url())];
    urls.sort();
    assert_eq!(listed, urls, "{path}");
    assert_eq!(
        (
            path["direct_requests"].as_u64(),
            path["direct_errors"].as_u64()
        ),
        (Some(8), Some(0)),
        "{path}"
    );
    assert!(path["ttft"]["overhead_ms"].is_f64(), "{path}");
    assert!(
        err.contains("the router's worker list not read"),
        "said why: {err}"
    );

    // The agent alike: its router target's direct canaries go to the workers the routed
    // canaries' replies named, the list's 404 said beside them.
    let dir = temp::dir("smg-gateway-agent");
    let cfg = dir.join("lmperf.toml");
    std::fs::write(
        &cfg,
        format!(
            "[canary]\ninterval = \"200ms\"\nmax_tokens = 3\n\n[[target]]\nurl = \"{}\"\nname = \"smg\"\nmodel = \"m\"\nkind = \"router\"\nworker_probes = false\nserver_metrics = \"off\"\ndirect_interval = \"1s\"\n",
            server.url()
        ),
    )
    .unwrap();
    let path = tokio::task::spawn_blocking(move || {
        let agent =
            lmperf_e2e::agent::Agent::spawn(&["--config", cfg.to_str().unwrap(), "--no-otlp"], &[]);
        let t = Instant::now();
        loop {
            let p = agent.status()["targets"][0]["path"].clone();
            if p["ttft"]["overhead_ms"].is_f64() {
                return p;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{p:#}\n{}",
                agent.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();
    println!("the agent's routed versus direct: {path:#}");
    assert_eq!(path["workers_from"], "replies", "{path}");
    let mut listed: Vec<&str> = path["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["url"].as_str())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, urls, "{path}");
    assert!(
        path["list_error"]
            .as_str()
            .is_some_and(|e| e.contains("HTTP 404")),
        "{path}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 52.4: llm-d's endpoint picker says why it dropped a request in
/// `x-llm-d-request-dropped-reason` (llm-d/llm-d-router `RequestDroppedReasonHeaderKey`) on
/// its 429 and 503, with the body `inference error: <code> - <message>`. A scripted picker that
/// sheds every canary: the agent's last error names the reason before the body's message, and
/// the error type stays the status. Its page's pool and per-endpoint figures are in the status.
#[tokio::test(flavor = "multi_thread")]
async fn llm_d_dropped_reason_is_named_in_the_canary_error() {
    use lmperf_e2e::scripted::{Frame, Reply, ScriptedServer};
    use std::sync::Arc;
    let picker = ScriptedServer::start(Arc::new(|req, _| {
        if req.path == "/v1/models" {
            return Reply::json(200, r#"{"object":"list","data":[{"id":"m"}]}"#);
        }
        if req.path == "/metrics" {
            return Reply::WithHeaders {
                status: 200,
                headers: vec![("Content-Type".into(), "text/plain; version=0.0.4".into())],
                frames: vec![Frame {
                    at: Duration::ZERO,
                    bytes: include_bytes!("fixtures/server/llm-d-epp.a.prom").to_vec(),
                }],
            };
        }
        Reply::WithHeaders {
            status: 429,
            headers: vec![
                ("Content-Type".into(), "text/plain".into()),
                (
                    "x-llm-d-request-dropped-reason".into(),
                    "rejected-saturated".into(),
                ),
            ],
            frames: vec![Frame {
                at: Duration::ZERO,
                bytes: b"inference error: ResourceExhausted - pool saturated".to_vec(),
            }],
        }
    }))
    .await;
    let url = picker.url();
    let agent = tokio::task::spawn_blocking(move || {
        lmperf_e2e::agent::Agent::spawn(
            &[
                "--target",
                &url,
                "--target-kind",
                "router",
                "--interval",
                "200ms",
                "--no-otlp",
            ],
            &[],
        )
    })
    .await
    .unwrap();
    let (last, st, metrics) = tokio::task::spawn_blocking(move || {
        let t = Instant::now();
        loop {
            let st = agent.status();
            let e = st["targets"][0]["last_error"].clone();
            let (_, m) = agent.get("/metrics");
            if e.is_object()
                && st["server"][0]["latest"]["picker_pool"].is_object()
                && m.contains("lmperf_router_pool_saturation")
            {
                return (e, st, m);
            }
            assert!(t.elapsed() < Duration::from_secs(30), "{st}");
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
    // Issue 52.3: what the picker's own page says (`fixtures/server/llm-d-epp.a.prom`): its
    // flow control queue summed, its pool's saturation, its ready endpoints; each endpoint's
    // queue on the worker its picks name (the older name beside the new one read once).
    let latest = &st["server"][0]["latest"];
    assert_eq!(
        latest["picker_pool"],
        serde_json::json!({"flow_control_queue": 7.0, "saturation": 0.95, "ready_endpoints": 2.0}),
        "{latest}"
    );
    let queues: Vec<(String, f64)> = latest["router_picks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| Some((p["worker"].as_str()?.to_owned(), p["queue"].as_f64()?)))
        .collect();
    assert_eq!(
        queues,
        [
            ("ml/vllm-0:8000".to_owned(), 6.0),
            ("ml/vllm-1:8000".to_owned(), 0.0)
        ],
        "{latest}"
    );
    for (gauge, v) in [
        ("lmperf_router_flow_control_queue", " 7"),
        ("lmperf_router_pool_saturation", " 0.95"),
        ("lmperf_router_ready_endpoints", " 2"),
    ] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(gauge) && l.ends_with(v)),
            "{gauge}: {metrics}"
        );
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lmperf_router_worker_queue")
                && l.contains("ml/vllm-0:8000")
                && l.ends_with(" 6")),
        "{metrics}"
    );
    assert_eq!(last["error_type"], "429", "{last}");
    assert_eq!(last["http_status"], 429, "{last}");
    assert_eq!(
        last["error_message"],
        "dropped by the router: rejected-saturated; inference error: ResourceExhausted - pool saturated",
        "{last}"
    );
}
