//! GPU metrics through NVML, tied to the canaries.
//!
//! [`sampler`] reads every GPU (and MIG instance) each interval on its own thread through a
//! [`backend::GpuBackend`] — [`nvml`] for the real library, [`fake`] for tests and the
//! benchmark — and publishes a snapshot to [`state::GpuState`]; [`metrics`] exports it with
//! the OpenTelemetry hardware conventions; [`state::GpuState::request_attributes`] gives each
//! canary span its `lmperf.gpu.*` attributes; [`procs`] names the processes on a GPU;
//! [`pod_resources`] asks the kubelet which pod holds which GPU and [`pods`] maps the answer
//! (the `k8s.*` labels of the series, the GPUs each target reads).
//!
//! **Architecture Invariant:** nothing outside `sampler` calls the GPU library, and the
//! sampler never runs on the async runtime: a slow or hung NVML call delays only GPU samples.

#[cfg(test)]
mod attribution_tests;
pub mod backend;
pub mod fake;
pub mod metrics;
pub mod nvml;
pub mod pod_resources;
pub mod pods;
pub mod procs;
pub mod sampler;
pub mod state;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::config::GpuConfig;
use sampler::GpuMonitor;
use state::{GpuState, Mode};

/// Starts GPU monitoring as configured and registers its instruments on `meter`. Never
/// fails the agent: without a driver the state says why metrics are off.
pub fn start(
    cfg: &GpuConfig,
    meter: &opentelemetry::metrics::Meter,
) -> (Arc<GpuState>, GpuMonitor) {
    if !cfg.enabled {
        return (
            Arc::new(GpuState::new(cfg.interval, Mode::Disabled)),
            GpuMonitor::none(),
        );
    }
    let state = Arc::new(GpuState::new(cfg.interval, Mode::Starting));
    metrics::register(meter, state.clone());
    let backend = nvml::NvmlBackend::new(cfg.nvml_library.clone().map(Into::into));
    match sampler::spawn(backend, state.clone(), sampler::DEFAULT_REDISCOVER) {
        Ok(m) => (state, m),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot start the GPU sampling thread; GPU metrics are off.");
            state.set_mode(
                Mode::Off,
                Some(format!("cannot start the sampling thread: {e}")),
            );
            (state, GpuMonitor::none())
        }
    }
}
