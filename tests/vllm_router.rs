//! What a router says about its workers (issue 52.3, 52.5), read from the real vllm-router
//! 0.1.17 (PyPI, Rust; `tests/peers/install-serving.sh` puts it in `.venv-serving`) in front of
//! two scripted workers: each worker's share of the router's picks over the agent's scrape
//! interval, and its share were the workers equal, in `/api/v1/status` and on `/metrics`.
//!
//! Needs `.venv-serving/bin/vllm-router`; without it the test says so and passes, unless
//! `LMPERF_REQUIRE_SERVING=1`.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lmperf_e2e::agent::{Agent, workspace_root};
use lmperf_e2e::peers::{ModelServer, free_port, shared_model_server};
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
use lmperf_e2e::serial;
use lmperf_e2e::temp;

/// The router process; killed when dropped.
struct Router(Child);

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn router_bin() -> Option<std::path::PathBuf> {
    let b = workspace_root().join(".venv-serving/bin/vllm-router");
    if b.is_file() {
        return Some(b);
    }
    assert!(
        std::env::var("LMPERF_REQUIRE_SERVING").as_deref() != Ok("1"),
        "LMPERF_REQUIRE_SERVING=1 but {} is missing: run tests/peers/install-serving.sh",
        b.display()
    );
    eprintln!("skipped: no .venv-serving/bin/vllm-router (tests/peers/install-serving.sh)");
    None
}

/// A worker that streams a short chat answer, or answers 500 to everything once `broken`.
async fn worker(broken: Arc<AtomicBool>) -> ScriptedServer {
    worker_with(broken, 2).await
}

/// [`worker`] with its first token `first_ms` after the request.
async fn worker_with(broken: Arc<AtomicBool>, first_ms: u64) -> ScriptedServer {
    ScriptedServer::start(Arc::new(move |req, _| {
        if broken.load(Ordering::SeqCst) {
            return Reply::json(500, r#"{"error":"worker down"}"#);
        }
        match req.path.as_str() {
            "/v1/models" => Reply::json(200, r#"{"object":"list","data":[{"id":"m"}]}"#),
            p if p.ends_with("/chat/completions") => Reply::sse(chat_stream(
                2,
                Duration::from_millis(first_ms),
                Duration::from_millis(1),
                8,
            )),
            _ => Reply::json(200, "{}"),
        }
    }))
    .await
}

/// Starts vllm-router (`--policy round_robin`, its page on its own port) in front of
/// `workers`, logging to `dir/router.log`, and waits until it routes a model list (at most
/// 60 s). Returns it with its port and its Prometheus port.
async fn start_router(
    bin: &std::path::Path,
    workers: &[String],
    dir: &std::path::Path,
) -> (Router, u16, u16) {
    start_router_with(bin, workers, dir, "round_robin", &[]).await
}

/// [`start_router`] with its `--policy` and more environment (`VLLM_ROUTER_STAGES=1`).
async fn start_router_with(
    bin: &std::path::Path,
    workers: &[String],
    dir: &std::path::Path,
    policy: &str,
    env: &[(&str, &str)],
) -> (Router, u16, u16) {
    let (port, prom) = (free_port(), free_port());
    let log = std::fs::File::create(dir.join("router.log")).unwrap();
    let router = Router(
        lmperf_e2e::peers::vllm_router_command(bin, (port, prom), workers, policy, log)
            .envs(env.iter().copied())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    loop {
        let ok = tokio::process::Command::new("curl")
            .args([
                "-sf",
                "-m",
                "5",
                &format!("http://127.0.0.1:{port}/v1/models"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success());
        if ok {
            return (router, port, prom);
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "vllm-router did not route within 60 s; log in {}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An agent run from `config` (TOML, written to `dir/lmperf.toml`), without OTLP.
async fn spawn_agent(dir: &std::path::Path, config: String) -> Arc<Agent> {
    let cfg = dir.join("lmperf.toml");
    std::fs::write(&cfg, config).unwrap();
    Arc::new(
        tokio::task::spawn_blocking(move || {
            Agent::spawn(&["--config", cfg.to_str().unwrap(), "--no-otlp"], &[])
        })
        .await
        .unwrap(),
    )
}

/// The picks the agent's status says for the router target: worker → its `router_picks` entry.
fn picks(agent: &Agent) -> Vec<serde_json::Value> {
    let st = agent.status();
    st["server"]
        .as_array()
        .and_then(|s| s.iter().find(|t| t["target"] == "vr"))
        .and_then(|t| t["latest"]["router_picks"].as_array().cloned())
        .unwrap_or_default()
}

/// Round-robin: each of two workers gets half the picks of every scrape interval (the agent's
/// 20 canaries a second are the router's traffic), each's share were the workers equal is
/// one half; once worker 2 answers 500s the router opens its circuit breaker and the status
/// says worker 1 is the only one to pick (share were they equal: 1 and 0).
#[tokio::test(flavor = "multi_thread")]
async fn vllm_router_share_of_picks_per_worker() {
    let Some(bin) = router_bin() else {
        return;
    };
    let broken = Arc::new(AtomicBool::new(false));
    let (w1, w2) = (
        worker(Arc::new(AtomicBool::new(false))).await,
        worker(broken.clone()).await,
    );
    let dir = temp::dir("vllm-router");
    let (_router, port, prom) = start_router(&bin, &[w1.url(), w2.url()], &dir).await;
    let agent = spawn_agent(&dir, format!(
        "[canary]\ninterval = \"50ms\"\nmax_tokens = 2\n\n[[target]]\nurl = \"http://127.0.0.1:{port}\"\nname = \"vr\"\nmodel = \"m\"\nkind = \"router\"\nworker_probes = false\nmetrics_url = \"http://127.0.0.1:{prom}/metrics\"\nmetrics_interval = \"2s\"\n"
    ))
    .await;
    let wait = |what: &'static str, pred: fn(&[serde_json::Value], &str, &str) -> bool| {
        let (agent, u1, u2, dir) = (agent.clone(), w1.url(), w2.url(), dir.clone());
        tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            loop {
                let p = picks(&agent);
                if pred(&p, &u1, &u2) {
                    return p;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "{what}: {p:#?}; router log in {}",
                    dir.display()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    // Two workers, an interval with at least 20 picks.
    let calm = wait("both workers' shares over 20 picks", |p, u1, u2| {
        let n: f64 = p.iter().filter_map(|e| e["picks"].as_f64()).sum();
        p.len() == 2
            && n >= 20.0
            && [u1, u2]
                .iter()
                .all(|u| p.iter().any(|e| e["worker"] == *u && e["share"].is_f64()))
    })
    .await
    .unwrap();
    println!("round robin: {calm:#?}");
    for e in &calm {
        let share = e["share"].as_f64().unwrap();
        let n: f64 = calm.iter().filter_map(|e| e["picks"].as_f64()).sum();
        // Round robin alternates: the two counts differ by at most one pick.
        assert!((share - 0.5).abs() <= 1.0 / n + 1e-9, "{e}");
        assert_eq!(e["fair_share"], 0.5, "{e}");
        assert_eq!(e["healthy"], true, "{e}");
        assert_eq!(e["breaker"], "closed", "{e}");
    }
    let (_, metrics) = agent.get("/metrics");
    for u in [w1.url(), w2.url()] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("lmperf_router_worker_pick_share")
                    && l.contains(&format!("lmperf_worker_id=\"{u}\""))),
            "{metrics}"
        );
    }
    broken.store(true, Ordering::SeqCst);
    let open = wait("worker 2's breaker open", |p, u1, u2| {
        let fair = |u: &str| {
            p.iter()
                .find(|e| e["worker"] == u)
                .map(|e| e["fair_share"].clone())
        };
        fair(u2) == Some(0.0.into()) && fair(u1) == Some(1.0.into())
    })
    .await
    .unwrap();
    println!("worker 2 failing: {open:#?}");
    let w2e = open.iter().find(|e| e["worker"] == w2.url()).unwrap();
    assert!(w2e["breaker"] == "open" || w2e["healthy"] == false, "{w2e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A loopback HTTP/1.1 proxy that holds each request `delay_ms` before forwarding it to
/// `upstream` (one request per connection): a router that adds a known time.
fn delaying_proxy(upstream: u16, delay_ms: Arc<std::sync::atomic::AtomicU64>) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            let delay_ms = delay_ms.clone();
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
                let Some(req) = lmperf_e2e::proxy::read_request(&conn) else {
                    return;
                };
                std::thread::sleep(Duration::from_millis(delay_ms.load(Ordering::SeqCst)));
                let mut client = conn;
                lmperf_e2e::proxy::forward(&req, upstream, &mut client);
            });
        }
    });
    port
}

/// Issue 52.2: how much the router adds. vllm-router in front of two scripted workers (20 ms to
/// the first token); the agent's router target finds the workers from the router's own
/// `/list_workers` and sends each a direct canary of the same shape. At rest the routed TTFT
/// p50 is within a few ms of the direct one; with 200 ms added in front of the router (a
/// delaying proxy between the agent and the router) the overhead rises by 200 ms ± 20 % while
/// the direct p50 stays; the figure says what it compares, in the status and on `/metrics`.
#[tokio::test(flavor = "multi_thread")]
async fn vllm_router_path_overhead_routed_minus_direct() {
    const ADDED_MS: u64 = 200;
    let Some(bin) = router_bin() else {
        return;
    };
    let ok = Arc::new(AtomicBool::new(false));
    let (w1, w2) = (worker_with(ok.clone(), 20).await, worker_with(ok, 20).await);
    let dir = temp::dir("vllm-router-path");
    let (_router, port, _) = start_router(&bin, &[w1.url(), w2.url()], &dir).await;
    let delay = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let front = delaying_proxy(port, delay.clone());
    // The router's own list is read at the router's URL, through the proxy.
    let agent = spawn_agent(&dir, format!(
        "[canary]\ninterval = \"200ms\"\nmax_tokens = 2\n\n[[target]]\nurl = \"http://127.0.0.1:{front}\"\nname = \"vr\"\nmodel = \"m\"\nkind = \"router\"\nworker_probes = false\nserver_metrics = \"off\"\ndirect_interval = \"1s\"\n"
    ))
    .await;
    let path = |agent: &Agent| {
        let st = agent.status();
        st["targets"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["name"] == "vr"))
            .map(|t| t["path"].clone())
            .unwrap_or_default()
    };
    let wait = |what: &'static str, pred: Box<dyn Fn(&serde_json::Value) -> bool + Send>| {
        let (agent, dir) = (agent.clone(), dir.clone());
        tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            loop {
                let p = path(&agent);
                if pred(&p) {
                    return p;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(120),
                    "{what}: {p:#}; router log in {}",
                    dir.display()
                );
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };
    let rest = wait(
        "a routed minus direct TTFT at rest",
        Box::new(|p| p["ttft"]["overhead_ms"].is_f64()),
    )
    .await
    .unwrap();
    println!("at rest: {rest:#}");
    assert_eq!(rest["workers_from"], "router", "{rest}");
    let mut urls: Vec<&str> = rest["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["url"].as_str())
        .collect();
    // As the router lists them (in its order).
    urls.sort_unstable();
    let mut want = [w1.url(), w2.url()];
    want.sort();
    assert_eq!(urls, want);
    let at_rest = rest["ttft"]["overhead_ms"].as_f64().unwrap();
    let direct_rest = rest["ttft"]["direct"]["p50_ms"].as_f64().unwrap();
    assert!(
        at_rest.abs() < 25.0,
        "the router adds {at_rest} ms at rest: {rest}"
    );
    assert!(
        rest["ttft"]["says"]
            .as_str()
            .is_some_and(|s| s.starts_with("routed TTFT p50 − direct p50 over the last 60 s, n = ")),
        "{rest}"
    );
    delay.store(ADDED_MS, Ordering::SeqCst);
    let lo = at_rest + 0.8 * ADDED_MS as f64;
    let slow = wait(
        "the added time in the overhead",
        Box::new(move |p| p["ttft"]["overhead_ms"].as_f64().is_some_and(|o| o >= lo)),
    )
    .await
    .unwrap();
    println!("{ADDED_MS} ms added in front of the router: {slow:#}");
    let o = slow["ttft"]["overhead_ms"].as_f64().unwrap();
    assert!(
        o <= at_rest + 1.2 * ADDED_MS as f64,
        "overhead {o} ms for {ADDED_MS} ms added (at rest {at_rest} ms)"
    );
    let direct = slow["ttft"]["direct"]["p50_ms"].as_f64().unwrap();
    assert!(
        (direct - direct_rest).abs() < 0.2 * ADDED_MS as f64,
        "direct p50 {direct_rest} → {direct} ms"
    );
    let (_, metrics) = agent.get("/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lmperf_path_overhead_seconds{")
                && l.contains("lmperf_path_metric=\"ttft\"")
                && l.contains("lmperf_target=\"vr\"")),
        "{metrics}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lmperf run --target-kind router` through vllm-router with `args` more, writing to `out`;
/// returns its stderr (the run must pass).
async fn lmperf_run(port: u16, out: &std::path::Path, args: &[String]) -> String {
    lmperf_run_model(port, "m", out, args).await
}

/// [`lmperf_run`] of `model`.
async fn lmperf_run_model(
    port: u16,
    model: &str,
    out: &std::path::Path,
    args: &[String],
) -> String {
    let (o2, args, model) = (out.to_owned(), args.to_vec(), model.to_owned());
    let o = tokio::task::spawn_blocking(move || {
        Command::new(lmperf_e2e::agent::lmperf_bin())
            .args(["run", "--target", &format!("http://127.0.0.1:{port}")])
            .args([
                "--target-kind",
                "router",
                "--api",
                "chat",
                "--model",
                &model,
            ])
            .args([
                "--batch-sizes",
                "1",
                "--seq-lengths",
                "16",
                "--output-len",
                "2",
            ])
            .args(["--num-prompts", "6", "--output-dir"])
            .arg(&o2)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{err}");
    err
}

/// The first benchmark's `path` block of the run in `out`.
fn bench_path(out: &std::path::Path) -> serde_json::Value {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    s["benchmarks"][0]["path"].clone()
}

/// Issue 52.4: vllm-router's own clock on each request. With `VLLM_ROUTER_STAGES=1` the router
/// answers `x-router-stages` (its worker leg's timings); every row of `lmperf run --target-kind
/// router` through it carries the router's first token (at least the workers' scripted 20 ms)
/// and the client's TTFT minus it, exactly. Issue 52.2 in `lmperf run`: the run finds the
/// workers from the router's own list and sends the benchmark's shape straight to them after
/// it: routed − direct TTFT p50 within a few ms at rest (`benchmarks[].path`, the terminal, the
/// report, `direct.jsonl` with each row's worker); through a proxy adding 200 ms in front of
/// the router, with `--direct-workers` given, the figure is 200 ms more (± 20 %).
#[tokio::test(flavor = "multi_thread")]
async fn vllm_router_stages_on_every_row() {
    const ADDED_MS: u64 = 200;
    let Some(bin) = router_bin() else {
        return;
    };
    let ok = Arc::new(AtomicBool::new(false));
    let (w1, w2) = (worker_with(ok.clone(), 20).await, worker_with(ok, 20).await);
    let dir = temp::dir("vllm-router-stages");
    let (_router, port, _) = start_router_with(
        &bin,
        &[w1.url(), w2.url()],
        &dir,
        "round_robin",
        &[("VLLM_ROUTER_STAGES", "1")],
    )
    .await;
    let out = dir.join("run");
    let err = lmperf_run(port, &out, &[]).await;
    let rows = lmperf_e2e::request_rows(&out);
    assert_eq!(rows.len(), 6);
    for r in &rows {
        assert_eq!(r["outcome"], "ok", "{r}");
        let (ttft, first, outside) = (
            r["ttft_ms"].as_f64().unwrap(),
            r["router_first_token_ms"].as_f64().unwrap_or(-1.0),
            r["router_outside_ms"].as_f64().unwrap_or(f64::NAN),
        );
        assert!(first >= 20.0, "the workers' first token is 20 ms in: {r}");
        assert!((outside - (ttft - first)).abs() < 1e-6, "{r}");
        assert!(outside > -0.5, "the client's TTFT holds the router's: {r}");
    }
    println!("first row: {}", rows[0]);

    // Routed versus direct, the workers from the router's own list.
    let rest = bench_path(&out);
    println!("at rest: {rest:#}");
    assert_eq!(rest["workers_from"], "router", "{rest}");
    let mut listed: Vec<&str> = rest["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    listed.sort_unstable();
    let mut want = [format!("{}/", w1.url()), format!("{}/", w2.url())];
    want.sort();
    assert_eq!(listed, want, "{rest}");
    assert_eq!(
        (
            rest["direct_requests"].as_u64(),
            rest["direct_errors"].as_u64()
        ),
        (Some(6), Some(0)),
        "{rest}"
    );
    let at_rest = rest["ttft"]["overhead_ms"].as_f64().unwrap();
    assert!(at_rest.abs() < 25.0, "the router adds {at_rest} ms at rest");
    let says = rest["ttft"]["says"].as_str().unwrap();
    assert!(
        says.starts_with(
            "routed TTFT p50 − direct p50 over the benchmark and its direct phase, n = 6 vs 6: "
        ),
        "{rest}"
    );
    assert!(err.contains(says), "the terminal says it: {err}");
    let direct = std::fs::read_to_string(out.join("direct.jsonl")).unwrap();
    let mut per_worker = std::collections::BTreeMap::<String, usize>::new();
    for l in direct.lines() {
        let r: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(r["outcome"], "ok", "{r}");
        *per_worker
            .entry(r["endpoint"].as_str().unwrap_or("none").to_owned())
            .or_default() += 1;
    }
    assert_eq!(
        per_worker.values().copied().collect::<Vec<_>>(),
        [3, 3],
        "in turn over the two workers: {per_worker:?}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.contains("<h2>Routed versus direct</h2>")
            && html.contains("data-path-ttft-overhead=\""),
        "the report says it"
    );

    // 200 ms added in front of the router; the workers given.
    let delay = Arc::new(std::sync::atomic::AtomicU64::new(ADDED_MS));
    let front = delaying_proxy(port, delay);
    let slow_out = dir.join("run-slow");
    let _ = lmperf_run(
        front,
        &slow_out,
        &["--direct-workers".to_owned(), w1.url(), w2.url()],
    )
    .await;
    let slow = bench_path(&slow_out);
    println!("{ADDED_MS} ms added in front of the router: {slow:#}");
    assert_eq!(slow["workers_from"], "flag", "{slow}");
    let added = slow["ttft"]["overhead_ms"].as_f64().unwrap() - at_rest;
    assert!(
        (added - ADDED_MS as f64).abs() <= 0.2 * ADDED_MS as f64,
        "the figure grew {added} ms for {ADDED_MS} ms added: {slow}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Consistent hashing with one session key (vllm-router's `x-session-id`): the router sends
/// every request of the key to one worker, and the agent's shares say so (≥ 0.9 of an
/// interval's picks on one worker; its own rare canaries carry no key). Printed.
#[tokio::test(flavor = "multi_thread")]
async fn vllm_router_consistent_hash_one_session_key_goes_to_one_worker() {
    let Some(bin) = router_bin() else {
        return;
    };
    let ok = Arc::new(AtomicBool::new(false));
    let (w1, w2) = (worker(ok.clone()).await, worker(ok).await);
    let dir = temp::dir("vllm-router-hash");
    let (_router, port, prom) =
        start_router_with(&bin, &[w1.url(), w2.url()], &dir, "consistent_hash", &[]).await;
    let agent = spawn_agent(&dir, format!(
        "[canary]\ninterval = \"60s\"\nmax_tokens = 2\n\n[[target]]\nurl = \"http://127.0.0.1:{port}\"\nname = \"vr\"\nmodel = \"m\"\nkind = \"router\"\nworker_probes = false\ndirect_paths = false\nmetrics_url = \"http://127.0.0.1:{prom}/metrics\"\nmetrics_interval = \"1s\"\n"
    ))
    .await;
    // One session's requests, 20 a second, until the agent has read an interval of them.
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    let t = Instant::now();
    let shares = loop {
        for _ in 0..5 {
            let _ = tokio::process::Command::new("curl")
                .args([
                    "-sf",
                    "-m",
                    "5",
                    "-o",
                    "/dev/null",
                    "-H",
                    "x-session-id: one",
                ])
                .args(["-H", "content-type: application/json", "-d", body])
                .arg(format!("http://127.0.0.1:{port}/v1/chat/completions"))
                .status()
                .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let a = agent.clone();
        let p = tokio::task::spawn_blocking(move || picks(&a))
            .await
            .unwrap();
        let n: f64 = p.iter().filter_map(|e| e["picks"].as_f64()).sum();
        if n >= 10.0 {
            break p;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no interval of 10 picks: {p:#?}; router log in {}",
            dir.display()
        );
    };
    println!("consistent hash, one session key: {shares:#?}");
    let top = shares
        .iter()
        .filter_map(|e| e["share"].as_f64())
        .fold(0.0, f64::max);
    assert!(top >= 0.9, "one worker takes the session: {shares:#?}");
    // The other, listed by the router but (nearly) never picked, has its share said too.
    let low = shares
        .iter()
        .filter_map(|e| e["share"].as_f64())
        .fold(1.0, f64::min);
    assert!(shares.len() == 2 && low <= 0.1, "{shares:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 52's real parts: vllm-router 0.1.17 (round robin) in front of two real llama.cpp
/// servers (Gemma 3 270M, one thread each: the tests' shared one and one of this test's own).
/// `lmperf run --target-kind router` finds both workers in the router's own list and sends the
/// benchmark's shape straight to them after it: routed − direct TTFT p50 within a few ms at
/// rest, the router's picks (its `vllm_router_processed_requests_total` per worker) and the
/// direct phase's requests split evenly, as round robin does; through a proxy adding 200 ms in
/// front of the router, the figure is 200 ms more (± 20 %) and the direct p50 stays. Printed.
#[tokio::test(flavor = "multi_thread")]
async fn vllm_router_before_two_llama_cpp_servers() {
    const ADDED_MS: u64 = 200;
    let Some(bin) = router_bin() else {
        return;
    };
    let _serial = serial::lock().await;
    let (one, two) =
        tokio::task::spawn_blocking(|| (shared_model_server().url(), ModelServer::start()))
            .await
            .unwrap();
    let dir = temp::dir("vllm-router-llama");
    let workers = [one.clone(), two.url()];
    let (_router, port, prom) = start_router(&bin, &workers, &dir).await;
    let picks = || {
        let page = lmperf_e2e::agent::http_get(
            std::net::SocketAddr::from(([127, 0, 0, 1], prom)),
            "/metrics",
        )
        .1;
        workers.clone().map(|w| {
            lmperf_e2e::prom_text::sum(
                &page,
                "vllm_router_processed_requests_total",
                &[&format!("worker=\"{w}\"")],
            )
        })
    };
    let before = picks();
    let out = dir.join("run");
    let err = lmperf_run_model(port, "gemma-3-270m", &out, &[]).await;
    let after = picks();
    let routed = [after[0] - before[0], after[1] - before[1]];
    // Every request the router forwards is a pick: the benchmark's, and the run's calls to the
    // server's tokenizer (`/tokenize`, `/apply-template`, which size its prompts exactly).
    println!("the router's picks per worker over the run: {routed:?}");
    assert!(
        routed.iter().all(|&n| n >= 3.0) && (routed[0] - routed[1]).abs() <= 1.0,
        "round robin over {workers:?}: {routed:?}"
    );
    let rows = lmperf_e2e::request_rows(&out);
    assert!(
        rows.len() == 6 && rows.iter().all(|r| r["outcome"] == "ok"),
        "{rows:#?}"
    );
    let rest = bench_path(&out);
    println!("at rest: {rest:#}");
    assert_eq!(rest["workers_from"], "router", "{rest}");
    let mut listed: Vec<&str> = rest["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    listed.sort_unstable();
    let mut want = workers.clone().map(|w| format!("{w}/"));
    want.sort();
    assert_eq!(listed, want, "{rest}");
    assert_eq!(
        (
            rest["direct_requests"].as_u64(),
            rest["direct_errors"].as_u64()
        ),
        (Some(6), Some(0)),
        "{rest}"
    );
    let direct = std::fs::read_to_string(out.join("direct.jsonl")).unwrap();
    let mut per_worker = std::collections::BTreeMap::<String, usize>::new();
    for l in direct.lines() {
        let r: serde_json::Value = serde_json::from_str(l).unwrap();
        *per_worker
            .entry(r["endpoint"].as_str().unwrap_or("none").to_owned())
            .or_default() += 1;
    }
    assert_eq!(
        per_worker.values().copied().collect::<Vec<_>>(),
        [3, 3],
        "{per_worker:?}"
    );
    let at_rest = rest["ttft"]["overhead_ms"].as_f64().unwrap();
    let direct_rest = rest["ttft"]["direct"]["p50_ms"].as_f64().unwrap();
    assert!(
        at_rest.abs() < 25.0,
        "the router adds {at_rest} ms at rest (direct p50 {direct_rest} ms)"
    );
    assert!(
        err.contains(rest["ttft"]["says"].as_str().unwrap()),
        "{err}"
    );

    let front = delaying_proxy(port, Arc::new(std::sync::atomic::AtomicU64::new(ADDED_MS)));
    let slow_out = dir.join("run-slow");
    let _ = lmperf_run_model(front, "gemma-3-270m", &slow_out, &[]).await;
    let slow = bench_path(&slow_out);
    println!("{ADDED_MS} ms added in front of the router: {slow:#}");
    let added = slow["ttft"]["overhead_ms"].as_f64().unwrap() - at_rest;
    assert!(
        (added - ADDED_MS as f64).abs() <= 0.2 * ADDED_MS as f64,
        "the figure grew {added} ms for {ADDED_MS} ms added: {slow}"
    );
    let direct = slow["ttft"]["direct"]["p50_ms"].as_f64().unwrap();
    assert!(
        (direct - direct_rest).abs() < 0.2 * ADDED_MS as f64,
        "direct p50 {direct_rest} → {direct} ms"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The agent's diagnosis of `target` in `/api/v1/diagnosis`.
fn diagnosis_of(agent: &Agent, target: &str) -> serde_json::Value {
    let (code, body) = agent.get("/api/v1/diagnosis");
    assert_eq!(code, 200, "{body}");
    let d: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    d["targets"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["target"] == target))
        .cloned()
        .unwrap_or_default()
}

/// Issue 53: the diagnosis names the router. The real vllm-router in front of two scripted
/// workers (20 ms to the first token), the agent's router target through a proxy in front of
/// the router, direct canaries to the workers from the router's list. After a calm baseline
/// (the engine's 100 s of history) the proxy holds every request 300 ms: within 60 s the agent
/// confirms `router_overhead` first, on the routed − direct TTFT (≈ 0 before, ≈ 300 ms after),
/// its workers' direct TTFT as before; the calm phase confirms nothing.
#[tokio::test(flavor = "multi_thread")]
async fn vllm_router_a_slower_router_is_diagnosed_router_overhead() {
    const ADDED_MS: u64 = 300;
    const CALM_HISTORY_S: f64 = 100.0;
    let Some(bin) = router_bin() else {
        return;
    };
    let ok = Arc::new(AtomicBool::new(false));
    let (w1, w2) = (worker_with(ok.clone(), 20).await, worker_with(ok, 20).await);
    let dir = temp::dir("vllm-router-diagnosis");
    let (_router, port, _) = start_router(&bin, &[w1.url(), w2.url()], &dir).await;
    let delay = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let front = delaying_proxy(port, delay.clone());
    let agent = spawn_agent(&dir, format!(
        "[canary]\ninterval = \"250ms\"\nmax_tokens = 2\nmax_in_flight = 16\n\n[[target]]\nurl = \"http://127.0.0.1:{front}\"\nname = \"vr\"\nmodel = \"m\"\nkind = \"router\"\nworker_probes = false\nserver_metrics = \"off\"\ndirect_interval = \"1s\"\n"
    ))
    .await;
    let a2 = agent.clone();
    let calm_s = tokio::task::spawn_blocking(move || {
        let t0 = Instant::now();
        loop {
            let t = diagnosis_of(&a2, "vr");
            let state = t["state"].as_str().unwrap_or("");
            assert!(
                state == "idle" || state == "warning" || state.is_empty(),
                "calm phase at {:?}: {t:#}",
                t0.elapsed()
            );
            let ready = match t["baseline_wait"]["have_s"].as_f64() {
                Some(have) => have >= CALM_HISTORY_S,
                None => t0.elapsed().as_secs_f64() >= CALM_HISTORY_S + 10.0,
            };
            if ready {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(150),
                "no baseline: {t:#}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    })
    .await
    .unwrap();
    println!("calm phase: {calm_s:?}");
    delay.store(ADDED_MS, Ordering::SeqCst);
    let a2 = agent.clone();
    let (after, t) = tokio::task::spawn_blocking(move || {
        let t1 = Instant::now();
        loop {
            let t = diagnosis_of(&a2, "vr");
            if t["state"] == "root_confirmed" {
                return (t1.elapsed(), t);
            }
            assert!(
                t1.elapsed() < Duration::from_secs(60),
                "not confirmed within 60 s: {t:#}\n{}",
                a2.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    })
    .await
    .unwrap();
    println!("confirmed {after:?} after the router slowed: {t:#}");
    let top = &t["causes"][0];
    assert_eq!(top["cause"], "router_overhead", "{t:#}");
    assert!(top["score"].as_f64() >= Some(0.75), "{t:#}");
    let e = top["evidence"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["signal"] == "path_overhead"))
        .cloned()
        .unwrap_or_default();
    let (before, moved) = (
        e["before"].as_f64().unwrap_or(f64::NAN),
        e["after"].as_f64().unwrap_or(f64::NAN),
    );
    assert!(before.abs() < 0.025, "routed − direct before: {e}");
    let added = ADDED_MS as f64 / 1e3;
    assert!(
        (moved - before - added).abs() <= 0.2 * added,
        "routed − direct after: {e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
