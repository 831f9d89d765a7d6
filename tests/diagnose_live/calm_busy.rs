//! The calm run on scripted busy servers (issue 28, item 0): the agent's Poisson canaries and
//! its 1 s scrape against five vLLM-style servers kept 40–60 % busy by background traffic of
//! varied prompt and output lengths ([`lmperf_e2e::busy_server`]: the default shape of the
//! synthetic busy controls and the four heavier ones), nothing injected, for
//! `LMPERF_DIAGNOSE_CALM_S` seconds (`cargo xtask diagnose-eval --calm 10m` runs it beside the
//! real server's calm run). A canary now and then waits behind ordinary traffic; that is the
//! servers' ordinary tail and must never be a page: the test fails on any `root_confirmed` or
//! WARN `Diagnosis:` line, and prints each server's busy share, the canaries it served and the
//! share of them that waited.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lmperf::analyze::busy::BusyConfig;
use lmperf_e2e::agent::Agent;
use lmperf_e2e::busy_server::BusyServer;
use lmperf_e2e::temp;
use serde_json::Value;

/// The servers: (target name, shape).
fn shapes() -> Vec<(String, BusyConfig)> {
    let mut v = vec![("busy-default".to_owned(), BusyConfig::default())];
    for variant in 1..=4 {
        v.push((format!("busy-heavy-{variant}"), BusyConfig::heavy(variant)));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_calm_busy_scripted_servers_are_never_diagnosed() {
    let Some(secs) = std::env::var("LMPERF_DIAGNOSE_CALM_S")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        eprintln!("skipped: set LMPERF_DIAGNOSE_CALM_S=N (cargo xtask diagnose-eval --calm 10m)");
        return;
    };
    let mut servers = Vec::new();
    for (i, (name, shape)) in shapes().into_iter().enumerate() {
        let shape = BusyConfig {
            duration_s: secs as f64 + 120.0,
            ..shape
        };
        servers.push((
            name,
            BusyServer::start(&shape, 0x6361_6c6d ^ i as u64).await,
        ));
    }
    let dir = temp::dir("diag-calm-busy");
    let mut cfg = String::from(
        "[canary]\nrate = 2.0\narrival = \"poisson\"\nmax_tokens = 32\nmodel = \"m\"\nmetrics_interval = \"1s\"\n\n[gpu]\nenabled = false\n\n[net]\nenabled = false\n",
    );
    for (name, s) in &servers {
        cfg.push_str(&format!(
            "\n[[target]]\nurl = \"{}\"\nname = \"{name}\"\n",
            s.server.url()
        ));
    }
    let path = dir.join("agent.toml");
    std::fs::write(&path, cfg).unwrap();
    let path = path.display().to_string();
    let agent =
        tokio::task::spawn_blocking(move || Agent::spawn(&["--config", &path, "--no-otlp"], &[]))
            .await
            .unwrap();
    // Per target: polls not idle, warnings seen, transitions into root_confirmed.
    let mut seen: BTreeMap<String, (usize, usize, usize, bool)> = BTreeMap::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (_, body) = agent.get("/api/v1/diagnosis");
        let Ok(v) = serde_json::from_str::<Value>(&body) else {
            continue;
        };
        for tv in v["targets"].as_array().into_iter().flatten() {
            let name = tv["target"].as_str().unwrap_or("?").to_owned();
            let state = tv["state"].as_str().unwrap_or("");
            let e = seen.entry(name.clone()).or_default();
            e.0 += usize::from(state != "idle");
            if state == "warning" && e.1 == 0 {
                eprintln!(
                    "calm busy: {name} warning at +{:.0} s: {}",
                    t.elapsed().as_secs_f64(),
                    tv["summary"]
                );
            }
            e.1 += usize::from(state == "warning");
            let confirmed = state == "root_confirmed";
            if confirmed && !e.3 {
                e.2 += 1;
                eprintln!(
                    "calm busy: {name} root_confirmed at +{:.0} s: {}",
                    t.elapsed().as_secs_f64(),
                    tv["summary"]
                );
            }
            e.3 = confirmed;
        }
    }
    let status = agent.status();
    let warn_lines = super::diagnosis_lines(&agent);
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
    let mut confirmations = 0;
    for (name, s) in &servers {
        let (busy, canaries, waited) = s.figures();
        let (not_idle, warnings, confirmed, _) = seen.get(name).copied().unwrap_or_default();
        let skipped = status["targets"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["name"] == name.as_str()))
            .map_or(f64::NAN, |t| {
                t["skipped_share"].as_f64().unwrap_or(f64::NAN)
            });
        println!(
            "diagnose-calm-busy: {name}: slots {:.0} % busy, {canaries} canaries served, {:.0} % of them waited for a slot, {:.1} % skipped at max_in_flight; {not_idle} polls not idle, {warnings} warning, {confirmed} root_confirmed",
            busy * 100.0,
            waited * 100.0,
            skipped * 100.0
        );
        confirmations += confirmed;
    }
    println!(
        "diagnose-calm-busy: {secs} s, {} servers, {confirmations} root_confirmed, {warn_lines} WARN `Diagnosis:` lines",
        servers.len()
    );
    assert_eq!(
        (confirmations, warn_lines),
        (0, 0),
        "diagnoses in a calm run of busy servers"
    );
}
