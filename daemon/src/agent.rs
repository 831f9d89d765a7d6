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
use crate::canary::client::Clients;
use crate::canary::{Shutdown, TargetRunner};
use crate::config::{AgentConfig, Env};
use crate::control::ControlService;
use crate::control::load::LoadManager;
use crate::status::{AgentStatus, RecentRequests, TargetState};
use crate::telemetry::{Telemetry, TelemetryError};

/// Total time from the signal to exit, within the 10 s a supervisor allows.
pub const SHUTDOWN_BUDGET: Duration = Duration::from_millis(9500);

/// The agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error("HTTP client for target {target}: {source}")]
    Client {
        target: String,
        source: reqwest::Error,
    },
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
    match crate::caps::drop_all() {
        Ok(before) => {
            tracing::info!(effective_before = %format!("{before:#x}"), "Capabilities dropped: the agent needs none after start.")
        }
        Err(e) => {
            tracing::warn!(error = %e, "Cannot drop capabilities; the agent keeps those it was given.")
        }
    }
    Ok(Privileged { net, admin })
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
) -> Result<(), AgentError> {
    // Polled once now: the signal handlers are installed from here on, so a SIGTERM during
    // start-up is an ordered shutdown (control socket removed…), not the default kill.
    let mut signal = std::pin::pin!(signal);
    let signalled_at_start = futures_util::FutureExt::now_or_never(signal.as_mut()).is_some();
    let telemetry = Arc::new(Telemetry::init(&cfg.otlp, env)?);
    let (gpu, gpu_monitor) = crate::gpu::start(&cfg.gpu, &telemetry.meter());
    gpu.set_server_ports(cfg.targets.iter().map(|t| t.port).collect());
    let states: Vec<Arc<TargetState>> = cfg
        .targets
        .iter()
        .map(|t| Arc::new(TargetState::new(t)))
        .collect();
    telemetry.register_spike_gauge(states.clone());
    let (net, net_monitor) = privileged.net.start(&telemetry.meter());
    let recent = Arc::new(RecentRequests::new(cfg.control.recent_requests));
    let (server, server_monitor) = crate::server::start(&cfg.targets, Some(&telemetry.meter()));
    let diagnosis = Arc::new(crate::diagnosis_live::LiveDiagnosis::new(
        crate::diagnosis::EngineConfig::default(),
        cfg.targets.iter().map(|t| t.name.clone()).collect(),
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
    let mut loops = Vec::new();
    let mut runners = Vec::new();
    for (i, (t, state)) in cfg.targets.iter().zip(&states).enumerate() {
        let clients = Clients::new(t.connect_timeout).map_err(|source| AgentError::Client {
            target: t.name.clone(),
            source,
        })?;
        let runner = TargetRunner::new(
            Arc::new(t.clone()),
            clients,
            telemetry.clone(),
            state.clone(),
            cfg.console,
        )
        .with_gpu(gpu.clone())
        .with_net(net.clone())
        .with_recent(recent.clone())
        .with_diagnosis(diagnosis.clone());
        let runner = match server.targets.get(i) {
            Some(s) => runner.with_server(s.clone()),
            None => runner,
        };
        let seed = rand::random::<u64>() ^ i as u64;
        runners.push(runner.clone());
        loops.push(tokio::spawn(runner.run(
            shutdown.clone(),
            tracker.clone(),
            seed,
        )));
    }
    let loads = Arc::new(LoadManager::new(
        runners,
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
        Some(crate::node::NodeSampler::new(
            std::path::Path::new("/proc"),
            std::path::Path::new("/sys/fs/cgroup"),
            crate::node::targets_of(&cfg.targets),
        )),
        diagnosis_stop.clone(),
    ));
    status.ready.store(true, Ordering::Relaxed);
    tracing::info!(
        admin = %admin_addr,
        control = %control.as_ref().map_or("off", |(at, _)| at.as_str()),
        targets = cfg.targets.len(),
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
    for l in loops {
        let _ = l.await;
    }
    tracker.close();
    if tokio::time::timeout(cfg.shutdown_timeout, tracker.wait())
        .await
        .is_err()
    {
        tracing::info!(
            in_flight = states
                .iter()
                .map(|s| s.in_flight.load(Ordering::Relaxed))
                .sum::<u64>(),
            "Cancelling canaries still in flight."
        );
        shutdown.cancel.cancel();
        let _ = tokio::time::timeout(Duration::from_millis(500), tracker.wait()).await;
    }
    diagnosis_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_millis(200), diagnosis_task).await;
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
