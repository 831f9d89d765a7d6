//! GPU monitoring end to end on a machine without an NVIDIA driver: the real `lmperf` binary
//! starts, logs once why GPU metrics are off, exports no `hw.*` / `lmperf.gpu.*` series on
//! `/metrics`, says why in `/api/v1/status`, and its canaries run as usual.

use std::time::Duration;

use lmperf_e2e::agent::{Agent, prom_sum};
use lmperf_e2e::temp;

fn gpu_series(metrics: &str) -> Vec<&str> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && (l.starts_with("hw_") || l.starts_with("lmperf_gpu")))
        .collect()
}

fn config_file(extra: &str) -> std::path::PathBuf {
    let port = lmperf_e2e::peers::free_port();
    let text = format!(
        "[canary]\ninterval = \"200ms\"\nmodel = \"m\"\n[[target]]\nurl = \"http://127.0.0.1:{port}\"\n{extra}"
    );
    temp::file("gpu.toml", &text)
}

fn check_off(agent: &Agent, library: &str) {
    let status = agent.wait_status(Duration::from_secs(5), |s| s["gpu"]["mode"] == "off");
    let gpu = &status["gpu"];
    assert_eq!(gpu["mode"], "off", "{gpu}");
    let reason = gpu["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(library),
        "the reason names the library: {reason}"
    );
    assert_eq!(gpu["devices"], serde_json::json!([]));
    // Everything else works: canaries are measured (refused: nothing listens there).
    let status = agent.wait_status(Duration::from_secs(5), |s| {
        s["targets"][0]["requests"].as_u64().unwrap_or(0) >= 3
    });
    assert!(
        status["targets"][0]["requests"].as_u64().unwrap_or(0) >= 3,
        "{status}"
    );
    let (code, metrics) = agent.get("/metrics");
    assert_eq!(code, 200);
    assert!(
        prom_sum(&metrics, "lmperf_canary_requests_total", &[]) >= 3.0,
        "{metrics}"
    );
    assert_eq!(gpu_series(&metrics), Vec::<&str>::new());
    let logged = agent.stderr_text().matches("GPU metrics are off").count();
    assert_eq!(logged, 1, "logged once:\n{}", agent.stderr_text());
}

#[test]
fn agent_without_nvml_library_exports_no_gpu_series_and_says_why() {
    let cfg = config_file(
        "[gpu]\ninterval = \"100ms\"\nnvml_library = \"/nonexistent/libnvidia-ml.so.1\"\n",
    );
    let agent = Agent::spawn(&["--config", cfg.to_str().unwrap(), "--no-otlp"], &[]);
    check_off(&agent, "/nonexistent/libnvidia-ml.so.1");
    let _ = std::fs::remove_file(cfg);
}

/// With the default library lookup: on this CI machine there is no driver, so the same; on a
/// machine with a driver, `hw.gpu.*` series appear instead (run by `cargo xtask gpu-check`).
#[test]
fn agent_with_default_nvml_lookup_matches_the_machine() {
    let cfg = config_file("");
    let agent = Agent::spawn(&["--config", cfg.to_str().unwrap(), "--no-otlp"], &[]);
    let status = agent.wait_status(Duration::from_secs(5), |s| {
        matches!(s["gpu"]["mode"].as_str(), Some("off" | "on"))
    });
    if std::path::Path::new("/dev/nvidiactl").exists() {
        assert_eq!(status["gpu"]["mode"], "on", "{status}");
        let (_, metrics) = agent.get("/metrics");
        assert!(metrics.contains("hw_gpu_memory_usage_bytes{"), "{metrics}");
    } else {
        check_off(&agent, "libnvidia-ml.so.1");
    }
    let _ = std::fs::remove_file(cfg);
}

#[test]
fn gpu_disabled_in_config_is_reported_as_disabled() {
    let cfg = config_file("[gpu]\nenabled = false\n");
    let agent = Agent::spawn(&["--config", cfg.to_str().unwrap(), "--no-otlp"], &[]);
    let gpu = agent.status()["gpu"].clone();
    assert_eq!(gpu["mode"], "disabled", "{gpu}");
    assert!(
        gpu["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("enabled = false")
    );
    assert!(!agent.stderr_text().contains("GPU metrics are off"));
    let (_, metrics) = agent.get("/metrics");
    assert_eq!(gpu_series(&metrics), Vec::<&str>::new());
    let _ = std::fs::remove_file(cfg);
}
