//! Reasoning models: a server that thinks for ~140 ms (`delta.reasoning_content` chunks)
//! before its first visible text. TTFT counts the first reasoning token; TTFO (time to first
//! visible output) the first text. Both are in `summary.json`, `summary.csv` and the report.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::scripted::{Frame, Reply, ScriptedServer};
use serde_json::Value;

fn frame(ms: u64, json: &str) -> Frame {
    Frame {
        at: Duration::from_millis(ms),
        bytes: format!("data: {json}\n\n").into_bytes(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttfo_is_the_first_visible_text_after_the_reasoning() {
    let server = ScriptedServer::start(Arc::new(|req, _| {
        if req.path == "/tokenize" {
            let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
            let n = body["content"]
                .as_str()
                .map_or(0, |s| s.split_whitespace().count());
            return Reply::json(
                200,
                &serde_json::json!({ "tokens": vec![1; n] }).to_string(),
            );
        }
        if !req.path.ends_with("/completions") {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        let think = r#"{"choices":[{"index":0,"delta":{"reasoning_content":"hmm "}}]}"#;
        let text = r#"{"choices":[{"index":0,"text":"w "}]}"#;
        Reply::sse(vec![
            frame(10, think),
            frame(50, think),
            frame(100, think),
            frame(150, text),
            frame(160, text),
            frame(
                170,
                r#"{"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":5}}"#,
            ),
            frame(170, "[DONE]"),
        ])
    }))
    .await;
    let url = server.url();
    let dir = std::env::temp_dir().join(format!("lmperf-ttfo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.clone();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(lmperf_bin())
            .args(["run", "--output-dir", d.to_str().unwrap()])
            .args(["--target", &url, "--model", "m", "--seq-lengths", "8"])
            .args(["--output-len", "5", "--num-prompts", "6"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .await
    .unwrap();
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let b = &s["benchmarks"][0];
    let (ttft, ttfo) = (
        b["ttft_ms"]["p50"].as_f64().unwrap(),
        b["ttfo_ms"]["p50"].as_f64().unwrap(),
    );
    println!("TTFT p50 {ttft:.1} ms, TTFO p50 {ttfo:.1} ms");
    // The server's own clock: first reasoning at 10 ms, first text at 150 ms (loopback and a
    // loaded machine add a little to both, the same to each).
    assert!((10.0..100.0).contains(&ttft), "TTFT {ttft}");
    assert!((150.0..300.0).contains(&ttfo), "TTFO {ttfo}");
    assert!(ttfo - ttft >= 100.0, "TTFO {ttfo} vs TTFT {ttft}");
    assert_eq!(b["ttfo_ms"]["count"], 6);
    let csv = std::fs::read_to_string(dir.join("summary.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = |c: &str| row[header.iter().position(|h| *h == c).unwrap()];
    assert_eq!(
        serde_json::from_str::<f64>(at("ttfo_ms_p50")).unwrap(),
        ttfo
    );
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        html.contains("TTFO p99") && html.contains("ttfo_ms/p99"),
        "report column"
    );
    // compare: TTFO beside TTFT (a run against itself: the same values, unchanged).
    let cmp = dir.join("cmp");
    let o = Command::new(lmperf_bin())
        .arg("compare")
        .arg(&dir)
        .arg(&dir)
        .arg("--output-dir")
        .arg(&cmp)
        .args(["--fail-on", "ttfo_p99:+5%"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(cmp.join("compare.json")).unwrap()).unwrap();
    let m = c["benchmarks"][0]["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == "ttfo_p50")
        .unwrap_or_else(|| panic!("ttfo_p50 in {c}"))
        .clone();
    let base = m["base"].as_f64().unwrap();
    assert!(
        (base - ttfo).abs() <= 0.01 * ttfo,
        "compare ttfo_p50 {base} vs summary {ttfo}"
    );
    assert_eq!(m["verdict"], "unchanged", "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}
