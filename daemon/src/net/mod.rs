//! Kernel-level TCP measurements of the targets' connections through eBPF (issue 5).
//!
//! `ebpf/src/lmperf_net.bpf.c` (BTF tracepoints `tcp_probe`, `inet_sock_set_state`,
//! `tcp_retransmit_skb`) reports smoothed RTT samples, connect latencies and retransmits of
//! the sockets whose local or remote port is a target's port. [`loader`] loads and attaches
//! them with aya and drains the ring buffer on its own thread; [`event`] is the Rust mirror of
//! the event struct; [`filter`] decides which end of a flow is the server; [`state`] keeps a
//! bounded history for the `lmperf.net.*` span attributes and the status section;
//! [`metrics`] records the `lmperf.tcp.*` instruments; [`tcp_info`] is the fallback while the
//! probes are not on (`getsockopt(TCP_INFO)` of the canary's own connection).
//!
//! **Architecture Invariant:** a kernel that refuses the probes (no permission, no BTF, no
//! program type, probes not built) never stops the agent: the state says why, once in the
//! log and in `/api/v1/status`.

pub mod event;
pub mod filter;
pub mod loader;
pub mod metrics;
pub mod state;
pub mod tcp_info;

use std::sync::Arc;

use crate::config::NetConfig;
use loader::NetMonitor;
use state::{Mode, NetState};

/// The probes as loaded by [`load`], not yet drained.
#[derive(Debug)]
pub struct Prepared {
    state: Arc<NetState>,
    enabled: bool,
    loaded: Option<loader::Loaded>,
}

/// The privileged part of the start (run before the agent drops its capabilities): loads
/// and attaches the probes as configured, reporting flows on `ports` (the targets' ports).
/// Never fails the agent: refused probes leave the state off with the reason.
pub fn load(cfg: &NetConfig, ports: &[u16]) -> Prepared {
    let state = Arc::new(NetState::new(filter::PortFilter::new(
        ports.iter().copied(),
    )));
    if !cfg.enabled {
        state.set_mode(
            Mode::Disabled,
            Some("disabled in the configuration ([net] enabled = false)".to_owned()),
        );
        return Prepared {
            state,
            enabled: false,
            loaded: None,
        };
    }
    let loaded = loader::load(&state, cfg.programs)
        .map_err(|e| off(&state, &e))
        .ok();
    Prepared {
        state,
        enabled: true,
        loaded,
    }
}

fn off(state: &NetState, e: &loader::NetError) {
    tracing::warn!(error = %e, "eBPF network probes are off; the agent runs without kernel TCP metrics.");
    state.set_mode(Mode::Off, Some(e.to_string()));
}

impl Prepared {
    /// Registers the instruments on `meter` and starts draining the probes' events.
    pub fn start(self, meter: &opentelemetry::metrics::Meter) -> (Arc<NetState>, NetMonitor) {
        let Prepared {
            state,
            enabled,
            loaded,
        } = self;
        if !enabled {
            return (state, NetMonitor::none());
        }
        let instruments = metrics::NetInstruments::new(meter, state.clone());
        let Some(loaded) = loaded else {
            return (state, NetMonitor::none());
        };
        match loaded.spawn(state.clone(), instruments) {
            Ok(m) => (state, m),
            Err(e) => {
                off(&state, &e);
                (state, NetMonitor::none())
            }
        }
    }
}

/// [`load`] then [`Prepared::start`], for callers that keep their capabilities.
pub fn start(
    cfg: &NetConfig,
    ports: &[u16],
    meter: &opentelemetry::metrics::Meter,
) -> (Arc<NetState>, NetMonitor) {
    load(cfg, ports).start(meter)
}
