//! Config reload in place, as Prometheus and blackbox_exporter do it: on `SIGHUP`, and when the
//! config file changes (a ConfigMap update arrives as a symlink swap of `..data` in the file's
//! directory, so the directory is watched, not the file). The new file is loaded and validated
//! whole; a bad one is refused (the reason in the log and `/api/v1/status` `config_reload`)
//! and the running config stays. The static targets of a good one are applied through the
//! agent's `TargetSet` (a new target starts, a removed one drains and stops, a changed one is
//! restarted with its new settings: its own histories start again, other targets keep theirs);
//! a change of a section read only at start (admin, OTLP, GPU, eBPF, control, discovery) is
//! said, and takes effect at the next restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{AgentConfig, ConfigError, TargetConfig};

/// Loads the config again the way the agent first did (same flags and environment).
pub struct Loader {
    /// The config file watched for changes (`None`: SIGHUP only).
    pub path: Option<PathBuf>,
    pub load: Box<dyn Fn() -> Result<AgentConfig, ConfigError> + Send + Sync>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader").field("path", &self.path).finish()
    }
}

/// `/api/v1/status` `config_reload`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ReloadView {
    /// Reloads tried (SIGHUP or file change) and those refused.
    pub attempts: u64,
    pub failures: u64,
    /// Whether the last attempt was applied.
    pub last_ok: Option<bool>,
    /// Why the last attempt was refused (the config error, naming the field and value).
    pub last_error: Option<String>,
    pub last_unix_s: Option<f64>,
    /// Sections changed in the file that take effect at the next restart.
    pub needs_restart: Vec<&'static str>,
}

/// Shared reload state.
#[derive(Debug, Default)]
pub struct ReloadStatus(Mutex<ReloadView>);

impl ReloadStatus {
    pub fn view(&self) -> ReloadView {
        self.0.lock().map(|g| g.clone()).unwrap_or_default()
    }

    fn record(&self, ok: Result<Vec<&'static str>, String>) {
        if let Ok(mut v) = self.0.lock() {
            v.attempts += 1;
            v.last_unix_s = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs_f64());
            match ok {
                Ok(restart) => {
                    v.last_ok = Some(true);
                    v.last_error = None;
                    v.needs_restart = restart;
                }
                Err(e) => {
                    v.failures += 1;
                    v.last_ok = Some(false);
                    v.last_error = Some(e);
                }
            }
        }
    }
}

/// What a reload from `old` to `new` does: the new static targets (when they changed) and the
/// sections that changed but are read only at start. Pure.
pub fn plan(
    old: &AgentConfig,
    new: &AgentConfig,
) -> (Option<Vec<TargetConfig>>, Vec<&'static str>) {
    let targets = (old.targets != new.targets).then(|| new.targets.clone());
    let mut restart = Vec::new();
    let differs =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    if old.admin_addr != new.admin_addr {
        restart.push("admin_addr");
    }
    if differs(&old.otlp, &new.otlp) {
        restart.push("otlp");
    }
    if old.gpu != new.gpu {
        restart.push("gpu");
    }
    if differs(&old.net, &new.net) {
        restart.push("net");
    }
    if old.control != new.control {
        restart.push("control");
    }
    if differs(&old.discovery, &new.discovery) {
        restart.push("discovery");
    }
    if old.console != new.console {
        restart.push("console");
    }
    (targets, restart)
}

/// Whether a file event concerns `path` (the file itself, or the `..data` link a ConfigMap
/// volume swaps).
fn concerns(event: &notify::Event, path: &Path) -> bool {
    let name = path.file_name();
    event
        .paths
        .iter()
        .any(|p| p == path || p.file_name() == name || p.file_name().is_some_and(|n| n == "..data"))
}

/// Reloads on SIGHUP and file changes until `stop`; applies new static targets on `statics`.
pub async fn run(
    loader: Loader,
    mut current: AgentConfig,
    statics: watch::Sender<Vec<TargetConfig>>,
    status: Arc<ReloadStatus>,
    stop: CancellationToken,
) {
    let (tx, mut rx) = mpsc::channel::<&'static str>(8);
    let _watcher = loader.path.as_deref().and_then(|path| {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let (p, tx) = (path.to_owned(), tx.clone());
        let mut w = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
            if let Ok(e) = e
                && !e.kind.is_access()
                && concerns(&e, &p)
            {
                let _ = tx.try_send("file");
            }
        })
        .map_err(|e| tracing::warn!(error = %e, "Config file not watched; SIGHUP still reloads."))
        .ok()?;
        notify::Watcher::watch(&mut w, dir, notify::RecursiveMode::NonRecursive)
            .map_err(|e| tracing::warn!(dir = %dir.display(), error = %e, "Config file not watched; SIGHUP still reloads."))
            .ok()?;
        Some(w)
    });
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        let why = tokio::select! {
            _ = stop.cancelled() => return,
            Some(w) = rx.recv() => w,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => "SIGHUP",
        };
        // A save or a symlink swap is several events: settle, then read once.
        tokio::time::sleep(Duration::from_millis(150)).await;
        while rx.try_recv().is_ok() {}
        match (loader.load)() {
            Err(e) => {
                tracing::warn!(trigger = why, error = %e, "Config reload refused; the running config stays.");
                status.record(Err(e.to_string()));
            }
            Ok(new) => {
                let (targets, restart) = plan(&current, &new);
                if targets.is_none() && restart.is_empty() {
                    tracing::debug!(trigger = why, "Config reloaded: nothing changed.");
                } else {
                    tracing::info!(trigger = why, targets_changed = targets.is_some(), needs_restart = ?restart, "Config reloaded.");
                }
                if let Some(t) = targets {
                    statics.send_replace(t);
                }
                status.record(Ok(restart));
                current = new;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Overrides, load};

    struct NoEnv;
    impl crate::config::Env for NoEnv {
        fn var(&self, _: &str) -> Option<String> {
            None
        }
    }

    fn cfg(text: &str) -> AgentConfig {
        let dir = std::env::temp_dir().join(format!("lmperf-reload-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!(
            "{:x}.toml",
            text.len() * 7919 + text.bytes().map(usize::from).sum::<usize>()
        ));
        std::fs::write(&path, text).unwrap();
        load(
            Overrides {
                config: Some(path),
                ..Overrides::default()
            },
            &NoEnv,
        )
        .unwrap()
    }

    #[test]
    fn the_plan_applies_targets_and_names_what_needs_a_restart() {
        let a = cfg("[[target]]\nurl = \"http://127.0.0.1:8000\"\n");
        let same = cfg("[[target]]\nurl = \"http://127.0.0.1:8000\"\n\n");
        assert_eq!(plan(&a, &same), (None, vec![]));
        let more = cfg(
            "[[target]]\nurl = \"http://127.0.0.1:8000\"\n[[target]]\nurl = \"http://127.0.0.1:8001\"\n",
        );
        let (t, r) = plan(&a, &more);
        assert_eq!(t.map(|t| t.len()), Some(2));
        assert!(r.is_empty());
        let rate = cfg("[[target]]\nurl = \"http://127.0.0.1:8000\"\nrate = 3.0\n");
        assert!(
            plan(&a, &rate).0.is_some(),
            "a changed rate re-applies the target"
        );
        let gpu = cfg("[[target]]\nurl = \"http://127.0.0.1:8000\"\n[gpu]\nenabled = false\n");
        assert_eq!(plan(&a, &gpu), (None, vec!["gpu"]));
    }
}
