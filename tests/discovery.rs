//! Model discovery follows the server: after `/v1/models` changes from `llama-a` to `llama-b`
//! (and the old name answers 404), canaries switch to the new model without an agent restart,
//! and `/api/v1/status` shows it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lmperf_e2e::agent::Agent;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};

fn model_of(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["model"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn canaries_follow_a_model_change_of_the_server() {
    let switched = Arc::new(AtomicBool::new(false));
    let sw = switched.clone();
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        let current = if sw.load(Ordering::SeqCst) { "llama-b" } else { "llama-a" };
        if req.path == "/v1/models" {
            return Reply::json(200, &format!(r#"{{"object":"list","data":[{{"id":"{current}","owned_by":"vllm"}}]}}"#));
        }
        if model_of(&req.body) != current {
            return Reply::json(404, r#"{"error":{"message":"The model does not exist.","type":"NotFoundError","code":"model_not_found"}}"#);
        }
        Reply::sse(chat_stream(3, Duration::from_millis(5), Duration::from_millis(5), 4))
    }))
    .await;
    let url = server.url();
    let mut agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(&["--target", &url, "--interval", "200ms"], &[])
    })
    .await
    .unwrap();
    let s = agent.wait_status(Duration::from_secs(20), |s| {
        s["targets"][0]["requests"].as_u64().unwrap_or(0) >= 3
    });
    assert_eq!(s["targets"][0]["model"], "llama-a", "{s}");
    switched.store(true, Ordering::SeqCst);
    let before = server.requests().len();
    // One 404 marks the model stale: the next canary re-discovers (well within the 60 s period).
    let s = agent.wait_status(Duration::from_secs(10), |s| {
        s["targets"][0]["model"] == "llama-b"
    });
    assert_eq!(s["targets"][0]["model"], "llama-b", "{s}");
    std::thread::sleep(Duration::from_secs(1));
    agent.sigterm();
    let _ = tokio::task::spawn_blocking(move || agent.wait_exit(Duration::from_secs(10)))
        .await
        .unwrap();

    let after: Vec<String> = server.requests()[before..]
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| model_of(&r.body))
        .collect();
    let old = after.iter().take_while(|m| *m == "llama-a").count();
    assert!(
        old <= 2,
        "at most the canaries in flight and the one that got 404 use the old name: {after:?}"
    );
    assert!(
        after.len() >= old + 3 && after[old..].iter().all(|m| m == "llama-b"),
        "{after:?}"
    );
    assert!(
        server.requests()[before..]
            .iter()
            .any(|r| r.path == "/v1/models"),
        "re-discovered"
    );
}
