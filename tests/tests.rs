//! lmperf's end-to-end tests: one test binary (as ripgrep's `tests/tests.rs`), one module per
//! area, so that an edit relinks one binary instead of one per file. Support code (scripted
//! servers, the agent as a child process, the real peers, temp dirs, Prometheus text, the
//! shared lock) is the `lmperf_e2e` library in `support/`.
//!
//! Tests run several at a time (`cargo xtask ci` sets the thread count). A test that starts the
//! real llama.cpp server, or whose assertions time work on this machine's CPUs, holds
//! [`lmperf_e2e::serial`]'s lock for its whole run, so that no two of them overlap.
//!
//! Run one area: `cargo test -p lmperf-e2e --test e2e sse_cases::`.

mod admin_router;
mod agent_e2e;
mod alerts;
mod analyze;
mod capacity;
mod capacity_fast;
mod chat_prompts;
mod chunk_invariance;
mod control;
mod dashboards;
mod dashboards_live;
mod deploy;
mod diagnose_live;
mod diagnosis;
mod discovery;
mod exemplars;
mod export;
mod faults;
mod gpu;
mod gpu_nvml;
mod gpu_pods;
mod k8s_discovery;
mod k8s_kubelet;
mod launch;
mod logs_json;
mod net;
mod outage;
mod outputs;
mod profiling;
mod reasoning_ttfo;
mod report_view;
mod run;
mod run_workloads;
mod sampling;
mod server_signals;
mod serving_path;
mod spike;
mod sse_cases;
mod summary_csv;
mod support_checks;
mod traffic;
mod vllm_router;
mod workload;
