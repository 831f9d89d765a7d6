//! lmperf: the node-resident LLM inference canary agent.
//!
//! Data flows canary → measurement → span/metric → exporter (see `ARCHITECTURE.md`):
//! [`canary`] sends streaming requests on a schedule, [`measure`] turns socket arrival times
//! into TTFT/ITL/TPOT/E2E, [`telemetry`] records GenAI metrics and spans and exports them over
//! OTLP, [`gpu`] samples the node's GPUs through NVML, [`admin`] serves health, Prometheus metrics and status,
//! [`control`] the gRPC control API and its client (`lmperf ctl`).

pub mod admin;
pub mod agent;
pub mod analyze;
pub mod bench;
pub mod canary;
pub mod caps;
pub mod cli;
pub mod config;
pub mod contention;
pub mod control;
pub mod cost;
pub mod diagnosis_live;
pub mod discovery;
pub mod gpu;
pub mod grid;
pub mod heap;
pub mod live_list;
pub mod load;
pub mod logging;
pub mod net;
pub mod node;
pub mod profiler;
pub mod reload;
pub mod sampler;
pub mod server;
pub mod status;
pub mod targets;
pub mod telemetry;
pub mod unix_grpc;

// The pure crates (daemon/crates/), under the module paths they had inside this crate.
pub use lmperf_diagnosis as diagnosis;
pub use lmperf_fmt as fmt;
pub use lmperf_measure as measure;

/// Installs rustls' `ring` crypto provider as the process default (the one TLS stack of
/// lmperf), before any HTTP client is built. Idempotent.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
