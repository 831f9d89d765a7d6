//! The live diagnosis harness (issue 12): the real agent binary with canaries against a
//! scripted model server, a fault injected after a calm baseline, the verdict read from
//! `/api/v1/diagnosis`, and the canaries the agent measured recorded as an episode
//! (`tests/fixtures/episodes/README.md`) from `lmperf ctl recent --json`.
//!
//! Runs when `LMPERF_DIAGNOSE_LIVE=1` (`cargo xtask diagnose-eval --live` sets it; about 3 min
//! per episode); `LMPERF_EPISODE_DIR=DIR` also writes each recorded episode there. Episodes:
//! `error_burst` (the server answers 503 to 3 requests in 5 from the onset on) and a no-fault
//! control. Not yet: the
//! llama.cpp load and long-prompt episodes, KV pressure, DelayLink, server change and the
//! scripted-NVML GPU faults (see the report of the branch `analyze`).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use lmperf_e2e::agent::{Agent, lmperf_bin};
use lmperf_e2e::scripted::{Received, Reply, ScriptedServer, chat_stream};
use serde_json::Value;

/// Seconds of calm before the fault (the engine needs 8 baseline buckets of 10 s).
const CALM_S: u64 = 110;
/// At most this long for `root_confirmed` after the onset.
const CONFIRM_WITHIN_S: u64 = 90;

fn enabled() -> bool {
    let on = std::env::var("LMPERF_DIAGNOSE_LIVE").is_ok_and(|v| v == "1");
    if !on {
        eprintln!("skipped: set LMPERF_DIAGNOSE_LIVE=1 (cargo xtask diagnose-eval --live)");
    }
    on
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The canaries of `target` the agent kept (`lmperf ctl recent --json`), as episode series.
fn recorded(agent: &Agent, target: &str, start: f64) -> BTreeMap<String, Vec<[f64; 2]>> {
    let out = Command::new(lmperf_bin())
        .args([
            "ctl", "--json", "recent", "--limit", "4096", "--target", target,
        ])
        .env("XDG_RUNTIME_DIR", &agent.runtime_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut s: BTreeMap<String, Vec<[f64; 2]>> = BTreeMap::new();
    let mut push = |name: &str, t: f64, x: f64| s.entry(name.to_owned()).or_default().push([t, x]);
    for r in v["requests"].as_array().unwrap() {
        if r["source"] != "canary" || r["outcome"] == "cancelled" {
            continue;
        }
        let e2e = r["e2e_ms"].as_f64().unwrap_or(0.0) / 1000.0;
        let t = r["at_unix_s"].as_f64().unwrap() + e2e - start;
        let failed = r["outcome"] != "ok";
        let status = r["http_status"].as_u64().unwrap_or(0);
        push("error", t, f64::from(u8::from(failed)));
        push(
            "error_5xx",
            t,
            f64::from(u8::from(failed && (500..600).contains(&status))),
        );
        push("error_429", t, f64::from(u8::from(failed && status == 429)));
        push(
            "error_timeout",
            t,
            f64::from(u8::from(r["outcome"] == "timeout")),
        );
        push("e2e", t, e2e);
        if let Some(x) = r["ttft_ms"].as_f64() {
            push("ttft", t, x / 1000.0);
        }
        if let Some(x) = r["tpot_ms"].as_f64() {
            push("tpot", t, x / 1000.0);
        }
        if let Some(x) = r["input_tokens"].as_u64() {
            push("input_tokens", t, x as f64);
        }
    }
    for pts in s.values_mut() {
        pts.sort_by(|a, b| a[0].total_cmp(&b[0]));
    }
    s
}

/// What one live episode saw.
struct Run {
    /// The first `/api/v1/diagnosis` of `t0` in `root_confirmed` after the onset.
    confirmed: Option<Value>,
    /// Seconds from the onset to it.
    ttd_s: f64,
    /// Evaluations polled (once a second) in which `t0` was not idle.
    not_idle: usize,
}

/// Runs one live episode: the agent's canaries (2/s) against a scripted server, calm for
/// `CALM_S`, then `fault` set (when `cause` is given) for up to `CONFIRM_WITHIN_S`; records
/// the episode as `name` when `LMPERF_EPISODE_DIR` is set.
async fn episode(name: &str, cause: Option<&str>, notes: &str) -> Run {
    let fault = Arc::new(AtomicBool::new(false));
    let f = fault.clone();
    let server = ScriptedServer::start(Arc::new(move |r: &Received, i: usize| {
        if !r.path.ends_with("/chat/completions") {
            return Reply::json(
                200,
                r#"{"object":"list","data":[{"id":"m","object":"model"}]}"#,
            );
        }
        if f.load(Ordering::SeqCst) && i % 5 < 3 {
            return Reply::json(
                503,
                r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
            );
        }
        Reply::sse(chat_stream(
            16,
            Duration::from_millis(40 + (i % 7) as u64 * 3),
            Duration::from_millis(10),
            20,
        ))
    }))
    .await;
    let dir = std::env::temp_dir().join(format!("lmperf-diag-live-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "[canary]\ninterval = \"500ms\"\nmodel = \"m\"\n\n[[target]]\nurl = \"{}\"\nname = \"t0\"\n\n[gpu]\nenabled = false\n\n[net]\nenabled = false\n\n[control]\nrecent_requests = 4096\n",
            server.url()
        ),
    )
    .unwrap();
    let cfg_s = cfg.to_str().unwrap().to_owned();
    let agent =
        tokio::task::spawn_blocking(move || Agent::spawn(&["--config", &cfg_s, "--no-otlp"], &[]))
            .await
            .unwrap();
    let start = unix_now().floor();
    let mut run = Run {
        confirmed: None,
        ttd_s: f64::INFINITY,
        not_idle: 0,
    };
    let poll = |run: &mut Run| {
        let (_, body) = agent.get("/api/v1/diagnosis?target=t0");
        let v: Value = serde_json::from_str(&body).unwrap();
        if v["targets"][0]["state"] != "idle" {
            run.not_idle += 1;
        }
        v
    };
    for _ in 0..CALM_S {
        tokio::time::sleep(Duration::from_secs(1)).await;
        poll(&mut run);
    }
    if cause.is_some() {
        fault.store(true, Ordering::SeqCst);
    }
    let onset = unix_now();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(CONFIRM_WITHIN_S) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let v = poll(&mut run);
        if cause.is_some() && v["targets"][0]["state"] == "root_confirmed" {
            run.ttd_s = t.elapsed().as_secs_f64();
            run.confirmed = Some(v);
            break;
        }
    }
    let series = recorded(&agent, "t0", start);
    drop(agent);
    let episode = serde_json::json!({
        "format": "lmperf-episode/1",
        "name": name,
        "source": "live",
        "cause": cause,
        "magnitude": cause.map(|_| "503 on 60 % of requests"),
        "target": "t0",
        "start_unix_s": start,
        "duration_s": (unix_now() - start).ceil(),
        "onset_offset_s": cause.map(|_| (onset - start).round()),
        "notes": notes,
        "series": {"t0": series},
    });
    if let Ok(out) = std::env::var("LMPERF_EPISODE_DIR") {
        let p = std::path::Path::new(&out).join(format!("{name}.json"));
        std::fs::write(&p, serde_json::to_vec(&episode).unwrap()).unwrap();
        eprintln!("recorded {}", p.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_error_burst_is_diagnosed_and_recorded() {
    if !enabled() {
        return;
    }
    let run = episode(
        "live-error_burst-503-1",
        Some("error_burst"),
        "tests/diagnose_live.rs: the agent's canaries (2/s) against a scripted server that answers 503 to 3 requests in 5 from the onset",
    )
    .await;
    let v = run
        .confirmed
        .unwrap_or_else(|| panic!("not root_confirmed within {CONFIRM_WITHIN_S} s of the onset"));
    let top = &v["targets"][0]["causes"][0];
    eprintln!(
        "live error_burst: {} {} after {:.0} s",
        top["cause"], top["score"], run.ttd_s
    );
    assert_eq!(top["cause"], "error_burst", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_control_is_never_diagnosed() {
    if !enabled() {
        return;
    }
    let run = episode(
        "live-control-1",
        None,
        "tests/diagnose_live.rs: the agent's canaries (2/s) against a steady scripted server, no fault",
    )
    .await;
    eprintln!(
        "live control: {} of {} evaluations not idle",
        run.not_idle,
        CALM_S + CONFIRM_WITHIN_S
    );
    assert_eq!(run.not_idle, 0, "the control left idle");
}
