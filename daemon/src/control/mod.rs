//! The gRPC control API (`proto/lmperf/v1/agent.proto`, tonic): `GetStatus`,
//! `ListRecentRequests`, `InjectLoad`, `StopLoad`, and its client (`lmperf ctl`).
//!
//! **API Boundary:** the proto. Off the network by default: a unix socket (owner-only) or a
//! loopback port; a non-loopback `listen` needs a token (the config refuses it otherwise),
//! and a configured token is checked on every call (`authorization: Bearer …`, else
//! `UNAUTHENTICATED`). The server runs on its own task: a failure to listen is logged and
//! leaves the agent's canaries and telemetry running without it.

pub mod client;
pub mod load;
pub mod scene;
mod service;
pub mod status_sections;

/// The messages, the server and the client generated from `proto/lmperf/v1/agent.proto` by
/// `daemon/build.rs`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("lmperf.v1");
}

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::{ControlConfig, ControlListen, Secret};
pub use service::ControlService;

/// Why the control API could not listen.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {path}: {reason}")]
    Socket { path: PathBuf, reason: String },
    #[error("control API cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// A bound listener, before serving.
#[derive(Debug)]
pub enum Listener {
    Unix(tokio::net::UnixListener, PathBuf),
    Tcp(tokio::net::TcpListener),
}

impl Listener {
    /// Where it listens (`unix:/path` or the bound `IP:port`).
    pub fn describe(&self) -> String {
        match self {
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "tcp:?".to_owned()),
        }
    }
}

/// Binds `listen`. A unix socket's directory is created (0700) when missing; a socket file left
/// by a dead agent is replaced, one another process serves is not.
///
/// # Errors
/// [`ControlError`] naming the path or address.
pub async fn bind(listen: &ControlListen) -> Result<Listener, ControlError> {
    match listen {
        ControlListen::Tcp(addr) => tokio::net::TcpListener::bind(addr)
            .await
            .map(Listener::Tcp)
            .map_err(|source| ControlError::Bind {
                addr: *addr,
                source,
            }),
        ControlListen::Unix(path) => bind_unix(path).map(|l| Listener::Unix(l, path.clone())),
    }
}

fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, ControlError> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
    let err = |reason: String| ControlError::Socket {
        path: path.to_owned(),
        reason,
    };
    if let Some(dir) = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(err("exists and is not a socket".to_owned()));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(err("another process serves it (another agent?)".to_owned()));
        }
        std::fs::remove_file(path)
            .map_err(|e| err(format!("stale socket cannot be removed: {e}")))?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| err(e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| err(format!("chmod 600: {e}")))?;
    Ok(listener)
}

/// `authorization: Bearer <token>` check, constant time in the token's length.
fn authorized(token: &Secret, header: Option<&[u8]>) -> bool {
    let want = format!("Bearer {}", token.expose());
    let Some(got) = header else { return false };
    got.len() == want.len()
        && got
            .iter()
            .zip(want.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Serves `service` on `listener` until `stop`; removes a unix socket file afterwards.
/// Errors of the server are logged, never returned: the agent goes on without it.
pub async fn serve(
    listener: Listener,
    service: ControlService,
    token: Option<Secret>,
    stop: CancellationToken,
) {
    use tonic::service::interceptor::InterceptedService;
    let token = token.map(Arc::new);
    let check = move |req: tonic::Request<()>| -> Result<tonic::Request<()>, tonic::Status> {
        match &token {
            Some(t)
                if !authorized(t, req.metadata().get("authorization").map(|v| v.as_bytes())) =>
            {
                Err(tonic::Status::unauthenticated(
                    "missing or wrong token: send `authorization: Bearer <token>` (lmperf ctl: LMPERF_CONTROL_TOKEN or --token-file)",
                ))
            }
            _ => Ok(req),
        }
    };
    let svc = InterceptedService::new(
        proto::agent_control_server::AgentControlServer::new(service),
        check,
    );
    let router = tonic::transport::Server::builder().add_service(svc);
    let shutdown = stop.cancelled_owned();
    let served = match listener {
        Listener::Tcp(l) => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(l),
                    shutdown,
                )
                .await
        }
        Listener::Unix(l, path) => {
            // The socket file goes as the shutdown starts (the server may take longer to drain
            // than the agent waits for it): `lmperf ctl` then says no agent runs there.
            let unlink = path.clone();
            let shutdown = async move {
                shutdown.await;
                let _ = std::fs::remove_file(&unlink);
            };
            let r = router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(l),
                    shutdown,
                )
                .await;
            let _ = std::fs::remove_file(&path);
            r
        }
    };
    if let Err(e) = served {
        tracing::error!(error = %e, "Control API server failed; the agent goes on without it.");
    }
}

/// Binds and spawns the control API as `cfg` says; `None` when disabled or when it cannot
/// listen (logged). Returns where it listens and the server task.
pub async fn start(
    cfg: &ControlConfig,
    service: ControlService,
    stop: CancellationToken,
) -> Option<(String, tokio::task::JoinHandle<()>)> {
    if !cfg.enabled {
        return None;
    }
    match bind(&cfg.listen).await {
        Ok(listener) => {
            let at = listener.describe();
            Some((
                at,
                tokio::spawn(serve(listener, service, cfg.token.clone(), stop)),
            ))
        }
        Err(e) => {
            tracing::warn!(error = %e, "Control API not started; canaries and telemetry go on.");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_must_match_exactly() {
        let t = crate::config::Secret::new("s3cret".to_owned());
        assert!(authorized(&t, Some(b"Bearer s3cret")));
        for bad in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret ",
            b"bearer s3cret",
            b"s3cret",
            b"",
        ] {
            assert!(
                !authorized(&t, Some(bad)),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(!authorized(&t, None));
    }

    #[tokio::test]
    async fn unix_socket_is_owner_only_and_stale_file_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("lmperf-ctl-test-{}", std::process::id()));
        let path = dir.join("sub/control.sock");
        let l = bind_unix(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(path.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        // Live: refused.
        let err = bind_unix(&path).unwrap_err().to_string();
        assert!(err.contains("another process serves it"), "{err}");
        drop(l);
        // Stale (nobody listens): replaced.
        let _l = bind_unix(&path).unwrap();
        std::fs::write(dir.join("plain"), b"x").unwrap();
        let err = bind_unix(&dir.join("plain")).unwrap_err().to_string();
        assert!(err.contains("not a socket"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
