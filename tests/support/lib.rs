//! Test support for lmperf's end-to-end tests (the `e2e` binary, `tests.rs`): a scripted SSE
//! server, the agent as a child process, the real peers (model server, OTLP collector), temp
//! dirs, Prometheus text, and the lock of the tests that must not overlap ([`serial`]).

pub mod agent;
pub mod busy_server;
pub mod chromium;
pub mod dynamo;
pub mod fake_nvml;
pub mod kube_api;
pub mod kubelet_pods;
pub mod netns;
pub mod openmetrics;
pub mod otlp;
pub mod own_process;
pub mod peers;
pub mod pod_resources;
pub mod proc_cpu;
pub mod prom_text;
pub mod prometheus;
pub mod promql;
pub mod proxy;
pub mod scripted;
pub mod serial;
pub mod slot_server;
pub mod spans;
pub mod stream_server;
pub mod targets;
pub mod temp;

/// The shared cases copied into `tests/fixtures/cases` (from `../shared/cases`).
pub fn case(name: &str) -> serde_json::Value {
    let path = agent::workspace_root()
        .join("tests/fixtures/cases")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of `out/requests.jsonl` (an `lmperf run` output directory), parsed.
///
/// # Panics
/// When the file is missing or a row is not JSON.
pub fn request_rows(out: &std::path::Path) -> Vec<serde_json::Value> {
    let path = out.join("requests.jsonl");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// numpy's default (linear) percentile of `v` at `q` in [0, 1], written independently of the
/// daemon's, for recomputing `summary.json` from `requests.jsonl`.
pub fn np_percentile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let pos = q * (s.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
}
