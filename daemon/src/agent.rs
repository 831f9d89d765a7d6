//! `lmperf agent`: wires config → canary loops → telemetry → admin and control API, and shuts
//! down in order.
//!
//! Shutdown (SIGTERM or SIGINT): `/readyz` turns 503 and no new canary starts; requests in
//! flight get `shutdown_timeout` to finish, then are cancelled (recorded as `cancelled`);
//! spans and metrics are flushed within what is left of a 9.5 s budget; exit 0.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio_util::task::TaskTracker;

use crate::admin::{self, AdminState};
use crate::canary::{Shutdown, TargetRunner};
use crate::config::{AgentConfig, Env, TargetConfig};
use crate::control::ControlService;
use crate::control::load::LoadManager;
use crate::status::{AgentStatus, RecentRequests, TargetState};
use crate::targets::{LiveList, Shared, TargetSet};
use crate::telemetry::{Telemetry, TelemetryError};

/// Total time from the signal to exit, within the 10 s a supervisor allows.
pub const SHUTDOWN_BUDGET: Duration = Duration::from_millis(9500);

/// The agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error("target {target}: {reason}")]
    Target { target: String, reason: String },
    #[error("admin HTTP cannot listen on {addr}: {source}")]
    AdminBind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// What the agent sets up while it holds its capabilities: the eBPF probes and the admin
/// listener (a port below 1024 needs CAP_NET_BIND_SERVICE).
#[derive(Debug)]
pub struct Privileged {
    net: crate::net::Prepared,
    admin: std::net::TcpListener,
    /// The plain-host targets' server processes (target name, pid), found by their port while
    /// the agent could still read other processes' `/proc/PID/fd` (issue 28: without
    /// capabilities a root-owned server's sockets are out of reach; its `/proc/PID/cgroup` is
    /// not).
    node_pids: Vec<(String, u32)>,
}

/// The privileged part of the start: loads the probes, binds the admin listener, then drops
/// every capability ([`crate::caps::drop_all`]). Call it before any other thread exists
/// (capabilities are per thread; later threads inherit the emptied sets).
///
/// # Errors
/// [`AgentError::AdminBind`]. A capability drop that fails is logged, not an error.
pub fn prepare(cfg: &AgentConfig) -> Result<Privileged, AgentError> {
    let ports: Vec<u16> = cfg.targets.iter().map(|t| t.port).collect();
    let net = crate::net::load(&cfg.net, &ports);
    let admin = std::net::TcpListener::bind(cfg.admin_addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| AgentError::AdminBind {
            addr: cfg.admin_addr,
            source,
        })?;
    let node_pids = crate::node::pids_of(
        std::path::Path::new("/proc"),
        &crate::node::targets_of(&cfg.targets),
    );
    // Loading the probes parsed the kernel's BTF (megabytes, freed): give those pages back.
    crate::heap::release_freed();
    match crate::caps::drop_all() {
        Ok(before) => {
            tracing::info!(effective_before = %format!("{before:#x}"), "Capabilities dropped: the agent needs none after start.")
        }
        Err(e) => {
            tracing::warn!(error = %e, "Cannot drop capabilities; the agent keeps those it was given.")
        }
    }
    Ok(Privileged {
        net,
        admin,
        node_pids,
    })
}

/// Runs the agent until `signal` completes, then shuts down. Returns when everything is
/// flushed or the budget is spent.
///
/// # Errors
/// Only start-up failures; nothing that happens to targets or the collector later.
pub async fn run(
    cfg: AgentConfig,
    privileged: Privileged,
    env: &dyn Env,
    signal: impl std::future::Future<Output = ()>,
    reload: Option<crate::reload::Loader>,
) -> Result<(), AgentError> {
    // Polled once now: the signal handlers are installed from here on, so a SIGTERM during
    // start-up is an ordered shutdown (control socket removed…), not the default kill.
    let mut signal = std::pin::pin!(signal);
    let signalled_at_start = futures_util::FutureExt::now_or_never(signal.as_mut()).is_some();
    let telemetry = Arc::new(Telemetry::init(&cfg.otlp, env)?);
    let (gpu, gpu_monitor) = crate::gpu::start(&cfg.gpu, &telemetry.meter());
    // Which pod holds each GPU: the kubelet's pod-resources API, read on the runtime.
    let pods_stop = tokio_util::sync::CancellationToken::new();
    let pods_task = cfg.gpu.enabled.then(|| {
        tokio::spawn(crate::gpu::pod_resources::run(
            cfg.gpu.pod_resources_socket.clone(),
            cfg.gpu.interval,
            gpu.clone(),
            pods_stop.clone(),
        ))
    });
    let states: Arc<LiveList<TargetState>> = Arc::default();
    crate::status::register_spike_gauge(&telemetry.meter(), states.clone());
    let (net, net_monitor) = privileged.net.start(&telemetry.meter());
    let privileged_node_pids = privileged.node_pids;
    let recent = Arc::new(RecentRequests::new(cfg.control.recent_requests));
    let (server, server_monitor) = crate::server::start(&[], Some(&telemetry.meter()));
    let diagnosis = Arc::new(crate::diagnosis_live::LiveDiagnosis::new(
        crate::diagnosis::EngineConfig::default(),
        Vec::new(),
    ));
    crate::diagnosis_live::register_gauges(&telemetry.meter(), diagnosis.clone());
    let status = Arc::new(AgentStatus {
        targets: states.clone(),
        started: SystemTime::now(),
        ready: false.into(),
        gpu: gpu.clone(),
        net: net.clone(),
        recent: recent.clone(),
        server: server.clone(),
        diagnosis: diagnosis.clone(),
        discovery: Default::default(),
        reload: Default::default(),
    });

    let listener = tokio::net::TcpListener::from_std(privileged.admin).map_err(|source| {
        AgentError::AdminBind {
            addr: cfg.admin_addr,
            source,
        }
    })?;
    let admin_addr = listener.local_addr().unwrap_or(cfg.admin_addr);
    let admin_stop = tokio_util::sync::CancellationToken::new();
    let admin_state = AdminState {
        status: status.clone(),
        telemetry: telemetry.clone(),
    };
    let app = admin::router(admin_state.clone());
    let stop = admin_stop.clone();
    let admin_task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "Admin HTTP server failed.");
        }
    });

    let shutdown = Shutdown::default();
    let tracker = TaskTracker::new();
    let runners: Arc<LiveList<TargetRunner>> = Arc::default();
    let mut set = TargetSet::new(Shared {
        telemetry: telemetry.clone(),
        gpu: gpu.clone(),
        net: net.clone(),
        recent: recent.clone(),
        diagnosis: diagnosis.clone(),
        server: server.clone(),
        states: states.clone(),
        runners: runners.clone(),
        console: cfg.console,
        shutdown: shutdown.clone(),
        drain: cfg.shutdown_timeout,
    });
    // Static targets first, through the same path as discovered ones: a static target that
    // cannot start is a start-up error, as before.
    let applied = set.apply(&cfg.targets);
    if let Some((target, reason)) = applied.failed.into_iter().next() {
        return Err(AgentError::Target { target, reason });
    }
    let discovery_stop = tokio_util::sync::CancellationToken::new();
    let discovery = crate::discovery::start(&cfg.discovery, discovery_stop.clone());
    // Without discovery, senders that stay open (and quiet) until shutdown.
    let (quiet_desired, quiet_changes) = (
        tokio::sync::watch::channel(Vec::new()),
        tokio::sync::mpsc::channel(1),
    );
    let (desired, changes, discovery_task) = match discovery {
        Some(d) => {
            if let Ok(mut s) = status.discovery.lock() {
                *s = Some(d.status.clone());
            }
            (d.desired, d.changes, Some(d.task))
        }
        None => (quiet_desired.1, quiet_changes.1, None),
    };
    let (statics_tx, statics) = tokio::sync::watch::channel(cfg.targets.clone());
    let reload_stop = tokio_util::sync::CancellationToken::new();
    let reload_task = reload.map(|loader| {
        tokio::spawn(crate::reload::run(
            loader,
            cfg.clone(),
            statics_tx,
            status.reload.clone(),
            reload_stop.clone(),
        ))
    });
    let reconcile = tokio::spawn(reconcile(
        set,
        Inputs {
            statics,
            desired,
            changes,
        },
        server.clone(),
        shutdown.stop.clone(),
    ));
    let loads = Arc::new(LoadManager::new(
        runners.clone(),
        cfg.control.caps.clone(),
        shutdown.clone(),
        tracker.clone(),
    ));
    let control_stop = tokio_util::sync::CancellationToken::new();
    let control = crate::control::start(
        &cfg.control,
        ControlService {
            admin: admin_state,
            recent,
            loads,
        },
        control_stop.clone(),
    )
    .await;
    let diagnosis_stop = tokio_util::sync::CancellationToken::new();
    let diagnosis_task = tokio::spawn(crate::diagnosis_live::run(
        diagnosis.clone(),
        gpu.clone(),
        server.clone(),
        telemetry.clone(),
        Some(
            crate::node::NodeSampler::new(
                std::path::Path::new("/proc"),
                std::path::Path::new("/sys/fs/cgroup"),
                crate::node::targets_of(&cfg.targets),
            )
            .with_pids(&privileged_node_pids),
        ),
        diagnosis_stop.clone(),
    ));
    status.ready.store(true, Ordering::Relaxed);
    tracing::info!(
        admin = %admin_addr,
        control = %control.as_ref().map_or("off", |(at, _)| at.as_str()),
        targets = states.len(),
        otlp = cfg.otlp.enabled,
        gpu_interval = %(if cfg.gpu.enabled { humantime::format_duration(cfg.gpu.interval).to_string() } else { "disabled".to_owned() }),
        net = ?net.mode(),
        otlp_protocol = ?cfg.otlp.protocol,
        traces_endpoint = %(if cfg.otlp.enabled { cfg.otlp.traces_endpoint.as_str() } else { "-" }),
        "Agent started."
    );

    if !signalled_at_start {
        signal.await;
    }
    let t_signal = tokio::time::Instant::now();
    tracing::info!("Shutting down: no new canaries.");
    status.ready.store(false, Ordering::Relaxed);
    shutdown.stop.cancel();
    discovery_stop.cancel();
    reload_stop.cancel();
    if let Some(t) = reload_task {
        let _ = tokio::time::timeout(Duration::from_millis(200), t).await;
    }
    drop((quiet_desired.0, quiet_changes.0));
    if let Some(t) = discovery_task {
        let _ = tokio::time::timeout(Duration::from_millis(200), t).await;
    }
    match reconcile.await {
        Ok(set) => set.shutdown(cfg.shutdown_timeout).await,
        Err(e) => tracing::warn!(error = %e, "Target reconciliation task failed."),
    }
    // Injected load (control API) runs on the agent's own tracker.
    tracker.close();
    if tokio::time::timeout(Duration::from_millis(500), tracker.wait())
        .await
        .is_err()
    {
        shutdown.cancel.cancel();
        let _ = tokio::time::timeout(Duration::from_millis(500), tracker.wait()).await;
    }
    diagnosis_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(3), diagnosis_task).await;
    pods_stop.cancel();
    if let Some(t) = pods_task {
        let _ = tokio::time::timeout(Duration::from_millis(200), t).await;
    }
    // Stop sampling before the final metric flush; an NVML call in progress is not waited for.
    let _ = tokio::task::spawn_blocking(move || gpu_monitor.stop(Duration::from_millis(200))).await;
    let _ = tokio::task::spawn_blocking(move || net_monitor.stop()).await;
    server_monitor.stop().await;
    let left = SHUTDOWN_BUDGET
        .saturating_sub(t_signal.elapsed())
        .max(Duration::from_millis(500));
    telemetry.shutdown(left).await;
    admin_stop.cancel();
    control_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_millis(200), admin_task).await;
    if let Some((_, task)) = control {
        let _ = tokio::time::timeout(Duration::from_millis(200), task).await;
    }
    let e = telemetry.spans.snapshot();
    tracing::info!(
        exported = e.exported,
        dropped = e.dropped_queue_full,
        failed = e.failed,
        "Agent stopped."
    );
    Ok(())
}

/// What the reconcile task follows: the static targets (the config, then each reload), the
/// discovered ones, and the discovered targets' lifecycle changes.
struct Inputs {
    statics: tokio::sync::watch::Receiver<Vec<TargetConfig>>,
    desired: tokio::sync::watch::Receiver<Vec<TargetConfig>>,
    changes: tokio::sync::mpsc::Receiver<crate::discovery::TargetChange>,
}

/// Applies the static targets with each discovered snapshot until `stop` (a discovered target
/// named like a static one is left out, said once), and the discovered targets' lifecycle
/// changes as server changes (after the snapshot that started their target). Returns the set
/// for the ordered shutdown.
async fn reconcile(
    mut set: TargetSet,
    mut i: Inputs,
    server: Arc<crate::server::ServerState>,
    stop: tokio_util::sync::CancellationToken,
) -> TargetSet {
    let mut shadowed: std::collections::BTreeSet<String> = Default::default();
    let (mut statics_open, mut desired_open, mut changes_open) = (true, true, true);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return set,
            r = i.statics.changed(), if statics_open => {
                if r.is_err() {
                    statics_open = false;
                    continue;
                }
            }
            r = i.desired.changed(), if desired_open => {
                if r.is_err() {
                    desired_open = false;
                    continue;
                }
            }
            c = i.changes.recv(), if changes_open => {
                match c {
                    Some(c) => {
                        if i.desired.has_changed().unwrap_or(false) {
                            // The change may be of a target this snapshot starts.
                            let statics = i.statics.borrow_and_update().clone();
                            let snap = i.desired.borrow_and_update().clone();
                            apply_discovered(&mut set, &statics, snap, &mut shadowed);
                        }
                        server_change(&server, c);
                    }
                    None => changes_open = false,
                }
                continue;
            }
        }
        let statics = i.statics.borrow_and_update().clone();
        let discovered = i.desired.borrow_and_update().clone();
        apply_discovered(&mut set, &statics, discovered, &mut shadowed);
    }
}

/// A discovered target's lifecycle change, with the scraper's log line, span event, counter
/// and status entry (`TargetServer::push_event`).
fn server_change(server: &crate::server::ServerState, c: crate::discovery::TargetChange) {
    let Some(t) = server.target(&c.target) else {
        tracing::debug!(target_name = %c.target, kind = c.change.kind.as_str(), "Server change of a target no longer running.");
        return;
    };
    tracing::warn!(
        target_name = %c.target,
        kind = c.change.kind.as_str(),
        old = c.change.old.as_deref().unwrap_or("-"),
        new = c.change.new.as_deref().unwrap_or("-"),
        source = "kubernetes",
        "Server change."
    );
    t.push_event(c.at, c.change);
}

fn apply_discovered(
    set: &mut TargetSet,
    static_targets: &[TargetConfig],
    discovered: Vec<TargetConfig>,
    shadowed: &mut std::collections::BTreeSet<String>,
) {
    let mut all = static_targets.to_vec();
    for t in discovered {
        if static_targets.iter().any(|s| s.name == t.name) {
            if shadowed.insert(t.name.clone()) {
                tracing::warn!(target_name = %t.name, "Discovered target has a static target's name; the static one is kept.");
            }
            continue;
        }
        all.push(t);
    }
    let applied = set.apply(&all);
    if !applied.is_empty() {
        tracing::debug!(?applied, "Targets reconciled.");
    }
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
