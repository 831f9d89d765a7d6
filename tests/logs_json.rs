//! `--log-format json` (issue 26): every stderr line is one JSON object with `timestamp`,
//! `level`, `message` and the fields at the top level; a line about a request carries the
//! request's `trace_id` and `span_id` (those it sent in `traceparent`); `log_format` in the
//! config file does the same; a bad value is a configuration error (exit 2). The diagnosis
//! WARN line's ids are checked against its span in `tests/diagnosis.rs`.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lmperf_e2e::agent::{Agent, lmperf_bin};
use lmperf_e2e::scripted::{Reply, ScriptedServer};
use serde_json::Value;

fn parse_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            assert!(v.is_object(), "{l}");
            for k in ["timestamp", "level", "message"] {
                assert!(v[k].is_string(), "no {k}: {l}");
            }
            // RFC 3339, UTC.
            let ts = v["timestamp"].as_str().unwrap();
            assert!(
                ts.len() >= 20 && ts.as_bytes()[10] == b'T' && ts.ends_with('Z'),
                "{l}"
            );
            assert!(v.get("fields").is_none(), "fields are flattened: {l}");
            v
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn json_lines_with_the_request_trace_ids() {
    // traceparent span id by trace id, as the server saw them.
    let seen: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let s = seen.clone();
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path != "/v1/chat/completions" {
            return Reply::json(404, r#"{"error":"not found"}"#);
        }
        if let Some(tp) = req.header("traceparent") {
            let parts: Vec<&str> = tp.split('-').collect();
            s.lock()
                .unwrap()
                .insert(parts[1].to_owned(), parts[2].to_owned());
        }
        Reply::json(503, r#"{"error":"overloaded"}"#)
    }))
    .await;
    let url = server.url();
    let agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(
            &[
                "--log-format",
                "json",
                "--target",
                &url,
                "--model",
                "m",
                "--interval",
                "100ms",
                "--no-otlp",
            ],
            &[("RUST_LOG", "info,lmperf=debug")],
        )
    })
    .await
    .unwrap();
    let t = Instant::now();
    while seen.lock().unwrap().len() < 5 && t.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, agent) = agent.stop(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0), "{}", agent.stderr_text());
    let lines = parse_lines(&agent.stderr_text());
    let started = lines
        .iter()
        .find(|l| l["message"] == "Agent started.")
        .expect("Agent started.");
    assert_eq!(started["level"], "INFO");
    assert_eq!(started["admin"], agent.admin.to_string());
    let failed: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "Request failed.")
        .collect();
    assert!(failed.len() >= 5, "{} failed-request lines", failed.len());
    let seen = seen.lock().unwrap();
    for l in failed {
        assert_eq!(l["level"], "DEBUG");
        assert_eq!(l["error_type"], "503", "{l}");
        let trace = l["trace_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no trace_id: {l}"));
        let span = l["span_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no span_id: {l}"));
        assert_eq!((trace.len(), span.len()), (32, 16), "{l}");
        assert_eq!(
            seen.get(trace).map(String::as_str),
            Some(span),
            "{l}: not the traceparent the server got"
        );
    }
}

#[test]
fn log_format_in_the_config_file_and_bad_values() {
    let dir = std::env::temp_dir().join(format!("lmperf-logs-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("a.toml");
    std::fs::write(&cfg, "log_format = \"xml\"\n").unwrap();
    let out = Command::new(lmperf_bin())
        .args(["agent", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("log_format = \"xml\": one of text, json"),
        "{stderr}"
    );

    let out = Command::new(lmperf_bin())
        .args(["--log-format", "yaml", "agent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A config given as a pipe (`--config <(…)`, here a FIFO) is read once for both its log
/// format and the rest: its unknown key is named (read twice, the second read found nothing
/// and said "no target").
#[test]
fn a_config_through_a_pipe_is_read_whole() {
    let dir = std::env::temp_dir().join(format!("lmperf-logs-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("config.toml");
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            std::fs::write(&fifo, "log_format = \"json\"\nbogus = 1\n").unwrap();
        })
    };
    let mut child = Command::new(lmperf_bin())
        .args(["agent", "--config", fifo.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read twice, a FIFO's second open waits for a writer that never comes: bounded here.
    let t = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = child.kill();
        panic!("the agent still waits on its config after 20 s: read twice");
    }
    writer.join().unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown field `bogus`"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn config_file_log_format_json() {
    let server = ScriptedServer::start(Arc::new(|_, _| Reply::json(503, r#"{"error":"x"}"#))).await;
    let dir = std::env::temp_dir().join(format!("lmperf-logs-json-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("a.toml");
    std::fs::write(&cfg, format!("log_format = \"json\"\n[canary]\nmodel = \"m\"\ninterval = \"1s\"\n[[target]]\nurl = \"{}\"\n", server.url())).unwrap();
    let c = cfg.clone();
    let agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(&["--config", c.to_str().unwrap(), "--no-otlp"], &[])
    })
    .await
    .unwrap();
    let (code, agent) = agent.stop(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0), "{}", agent.stderr_text());
    let lines = parse_lines(&agent.stderr_text());
    assert!(lines.iter().any(|l| l["message"] == "Agent started."));
    let _ = std::fs::remove_dir_all(&dir);
}
