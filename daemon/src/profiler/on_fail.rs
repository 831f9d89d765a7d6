//! `--profile-on-fail FILE` of `lmperf run` and `lmperf compare`: when a `--fail-on` gate on
//! TPOT trips, the server's profiler is called once (the file's `[profiling]` table, with
//! `on` naming `tpot_regression`) and its record goes into `summary.json` / `compare.json`
//! `server_profile` and the command's last line.

use url::Url;

use super::live::ServerProfiler;
use crate::config::profiling::{ProfilingConfig, Trigger};
use crate::diagnosis::report::ServerProfile;

/// The first tripped gate that is about TPOT (`tpot_*`, `probe_tpot_*`), by its text.
pub fn tpot_gate(tripped: &[String]) -> Option<&str> {
    tripped
        .iter()
        .map(String::as_str)
        .find(|g| g.starts_with("tpot") || g.starts_with("probe_tpot"))
}

/// Calls the profiler of the server at `target` (or the file's `url`) for `gate` and waits
/// for the outcome; `None` when `on` does not list `tpot_regression`.
pub async fn call(cfg: ProfilingConfig, target: &Url, gate: &str) -> Option<ServerProfile> {
    let p = ServerProfiler::new("lmperf", cfg, target);
    let out = p
        .call(Trigger::TpotRegression, &format!("gate {gate} tripped"))
        .await;
    p.shutdown().await;
    out
}

/// The record in one line: `profiler vllm http://…: done (stopped after 10 s); trace in /traces
/// on the server`.
pub fn line(p: &ServerProfile) -> String {
    format!(
        "profiler {} {}: {} ({}); trace in {} on the server",
        p.kind,
        p.server,
        p.outcome,
        p.detail,
        p.output_dir.as_deref().unwrap_or("its default directory")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_tpot_gate_asks_for_a_profile() {
        let g = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            tpot_gate(&g(&["ttft_p99:+5%", "tpot_mean:+5%"])),
            Some("tpot_mean:+5%")
        );
        assert_eq!(
            tpot_gate(&g(&["probe_tpot_p99_ms>40"])),
            Some("probe_tpot_p99_ms>40")
        );
        assert_eq!(tpot_gate(&g(&["ttft_p99_ms>500", "error_rate>0.01"])), None);
    }
}
