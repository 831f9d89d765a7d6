//! Kernel-level TCP measurements of the targets' connections through eBPF (issue 5).
//!
//! `ebpf/src/lmperf_net.bpf.c` (BTF tracepoints `tcp_probe`, `inet_sock_set_state`,
//! `tcp_retransmit_skb`) reports smoothed RTT samples, connect latencies and retransmits of
//! the sockets whose local or remote port is a target's port. [`loader`] loads and attaches
//! them with aya and drains the ring buffer on its own thread; [`event`] is the Rust mirror of
//! the event struct; [`filter`] decides which end of a flow is the server; [`state`] keeps a
//! bounded history for the `lmperf.net.*` span attributes and the status section;
//! [`metrics`] records the `lmperf.tcp.*` instruments.
//!
//! **Architecture Invariant:** a kernel that refuses the probes (no permission, no BTF, no
//! program type, probes not built) never stops the agent: the state says why, once in the
//! log and in `/api/v1/status`.

pub mod event;
pub mod filter;
pub mod loader;
pub mod metrics;
pub mod state;

use std::sync::Arc;

use crate::config::NetConfig;
use loader::NetMonitor;
use state::{Mode, NetState};

/// Starts the probes as configured, reporting flows on `ports` (the targets' ports), and
/// registers the instruments on `meter`. Never fails the agent.
pub fn start(cfg: &NetConfig, ports: &[u16], meter: &opentelemetry::metrics::Meter) -> (Arc<NetState>, NetMonitor) {
    let state = Arc::new(NetState::new(filter::PortFilter::new(ports.iter().copied())));
    if !cfg.enabled {
        state.set_mode(Mode::Disabled, Some("disabled in the configuration ([net] enabled = false)".to_owned()));
        return (state, NetMonitor::none());
    }
    let instruments = metrics::NetInstruments::new(meter, state.clone());
    match loader::start(state.clone(), instruments) {
        Ok(m) => (state, m),
        Err(e) => {
            tracing::warn!(error = %e, "eBPF network probes are off; the agent runs without kernel TCP metrics.");
            state.set_mode(Mode::Off, Some(e.to_string()));
            (state, NetMonitor::none())
        }
    }
}
