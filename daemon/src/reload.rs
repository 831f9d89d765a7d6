//! Config reload in place, as Prometheus and blackbox_exporter do it: on `SIGHUP`, and when the
//! config file changes (a ConfigMap update arrives as a symlink swap of `..data` in the file's
//! directory, so the directory is watched, not the file). The new file is loaded and validated
//! whole; a bad one is refused (the reason in the log and `/api/v1/status` `config_reload`)
//! and the running config stays. The static targets of a good one are applied through the
//! agent's `TargetSet` (a new target starts, a removed one drains and stops, a changed one is
//! restarted with its new settings: one whose URL, model, API and pod are the same keeps its
//! status, counters, diagnosis history and server state, others start again);
//! a change of a section read only at start (admin, OTLP, GPU, eBPF, control, discovery,
//! `log_format`, …) is said, and takes effect at the next restart. `needs_restart` compares
//! the new file with the config the process started with (not with the last reload), so a
//! later no-op reload keeps it and reverting the change clears it; the log line and the
//! status carry the same list.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::log_format::LogFormat;
use crate::config::{AgentConfig, ConfigError, TargetConfig};

/// Loads the config again the way the agent first did (same flags and environment).
pub struct Loader {
    /// The config file watched for changes (`None`: SIGHUP only).
    pub path: Option<PathBuf>,
    pub load: Box<dyn Fn() -> Result<AgentConfig, ConfigError> + Send + Sync>,
    /// The log format resolved again as at start (flag, file's `log_format`, environment).
    pub log_format: Box<dyn Fn() -> Result<LogFormat, ConfigError> + Send + Sync>,
    /// The log format the process runs with (set once at start: a change needs a restart).
    pub running_log_format: LogFormat,
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

/// What a reload to `new` does: the new static targets (when they differ from `current`, the
/// config applied last) and the sections read only at start that differ from `started`, the
/// config the process started with. Pure.
pub fn plan(
    started: &AgentConfig,
    current: &AgentConfig,
    new: &AgentConfig,
) -> (Option<Vec<TargetConfig>>, Vec<&'static str>) {
    let targets = (current.targets != new.targets).then(|| new.targets.clone());
    (targets, restart_sections(started, new))
}

/// The sections of `new` read only at start that differ from `started`. Every field is named
/// (a new one does not compile until it is said to be reloaded or to need a restart).
fn restart_sections(started: &AgentConfig, new: &AgentConfig) -> Vec<&'static str> {
    let AgentConfig {
        // Applied in place through the agent's TargetSet.
        targets: _,
        admin_addr,
        shutdown_timeout,
        console,
        otlp,
        gpu,
        net,
        control,
        discovery,
    } = new;
    let differs =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    let mut restart = Vec::new();
    if started.admin_addr != *admin_addr {
        restart.push("admin_addr");
    }
    if started.shutdown_timeout != *shutdown_timeout {
        restart.push("shutdown_timeout");
    }
    if started.console != *console {
        restart.push("console");
    }
    if differs(&started.otlp, otlp) {
        restart.push("otlp");
    }
    if started.gpu != *gpu {
        restart.push("gpu");
    }
    if differs(&started.net, net) {
        restart.push("net");
    }
    if started.control != *control {
        restart.push("control");
    }
    if differs(&started.discovery.kubernetes, &discovery.kubernetes) {
        restart.push("discovery");
    }
    // The `[canary]` defaults: static targets take them at once (through their own settings);
    // the template discovered targets start from is set at start, so only where discovery runs
    // does a change wait for a restart.
    if discovery.kubernetes.enabled && differs(&started.discovery.template, &discovery.template) {
        restart.push("canary (discovered targets)");
    }
    restart
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
/// `started` is the config the process started with.
pub async fn run(
    loader: Loader,
    started: AgentConfig,
    statics: watch::Sender<Vec<TargetConfig>>,
    status: Arc<ReloadStatus>,
    stop: CancellationToken,
) {
    let mut current = started.clone();
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
        reload_once(&loader, &started, &mut current, &statics, &status, why);
    }
}

/// One reload: loads, refuses (the running config stays) or applies the new static targets on
/// `statics` and records what needs a restart; the log line says the same as the status.
fn reload_once(
    loader: &Loader,
    started: &AgentConfig,
    current: &mut AgentConfig,
    statics: &watch::Sender<Vec<TargetConfig>>,
    status: &ReloadStatus,
    why: &str,
) {
    match (loader.load)().and_then(|c| (loader.log_format)().map(|f| (c, f))) {
        Err(e) => {
            tracing::warn!(trigger = why, error = %e, "Config reload refused; the running config stays.");
            status.record(Err(e.to_string()));
        }
        Ok((new, log_format)) => {
            let (targets, mut restart) = plan(started, current, &new);
            if log_format != loader.running_log_format {
                restart.push("log_format");
            }
            tracing::info!(
                trigger = why,
                targets_changed = targets.is_some(),
                needs_restart = %restart.join(","),
                "Config reloaded."
            );
            if let Some(t) = targets {
                statics.send_replace(t);
            }
            status.record(Ok(restart));
            *current = new;
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
        let plan = |old: &AgentConfig, new: &AgentConfig| plan(old, old, new);
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
        let stop = cfg("shutdown_timeout = \"3s\"\n[[target]]\nurl = \"http://127.0.0.1:8000\"\n");
        assert_eq!(plan(&a, &stop), (None, vec!["shutdown_timeout"]));
    }

    /// A change of `[canary]` alone (here its interval) re-applies the static targets and
    /// needs no restart, unless discovery runs (its template is read at start); discovery
    /// itself is named only when `[discovery]` changed.
    #[test]
    fn a_canary_interval_change_names_only_what_changed() {
        let t = "[[target]]\nurl = \"http://127.0.0.1:8000\"\n";
        let a = cfg(&format!("[canary]\ninterval = \"2s\"\n{t}"));
        let b = cfg(&format!("[canary]\ninterval = \"3s\"\n{t}"));
        let (targets, restart) = plan(&a, &a, &b);
        assert!(
            targets.is_some(),
            "the static target takes the new interval"
        );
        assert_eq!(restart, Vec::<&str>::new());
        let k8s = "[discovery.kubernetes]\nenabled = true\nnode_name = \"n1\"\n";
        let (a, b) = (
            cfg(&format!("[canary]\ninterval = \"2s\"\n{t}{k8s}")),
            cfg(&format!("[canary]\ninterval = \"3s\"\n{t}{k8s}")),
        );
        assert_eq!(plan(&a, &a, &b).1, ["canary (discovered targets)"]);
        let c = cfg(&format!(
            "[canary]\ninterval = \"2s\"\n{t}{k8s}inference_pools = true\n"
        ));
        assert_eq!(plan(&a, &a, &c).1, ["discovery"]);
    }

    #[test]
    fn needs_restart_is_against_the_started_config() {
        let started = cfg("[[target]]\nurl = \"http://127.0.0.1:8000\"\n");
        let gpu = cfg("[[target]]\nurl = \"http://127.0.0.1:8000\"\n[gpu]\nenabled = false\n");
        // The change is pending after its reload and after a no-op one (same file again).
        assert_eq!(super::plan(&started, &started, &gpu).1, ["gpu"]);
        assert_eq!(super::plan(&started, &gpu, &gpu), (None, vec!["gpu"]));
        // Reverting it clears it.
        assert_eq!(super::plan(&started, &gpu, &started), (None, vec![]));
    }

    /// A loader serving `file` (its text set by the test) and the log format `format`.
    fn loader(
        file: Arc<Mutex<String>>,
        format: Arc<Mutex<&'static str>>,
        running: LogFormat,
    ) -> Loader {
        Loader {
            path: None,
            load: Box::new(move || {
                let text = file.lock().map(|g| g.clone()).unwrap_or_default();
                let dir =
                    std::env::temp_dir().join(format!("lmperf-reload-once-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let path = dir.join("lmperf.toml");
                std::fs::write(&path, text).unwrap();
                load(
                    Overrides {
                        config: Some(path),
                        ..Overrides::default()
                    },
                    &NoEnv,
                )
            }),
            log_format: Box::new(move || {
                let f = format.lock().map(|g| *g).unwrap_or("text");
                LogFormat::parse("log_format", f)
            }),
            running_log_format: running,
        }
    }

    #[test]
    fn a_pending_restart_survives_no_op_and_bad_reloads_and_log_format_is_listed() {
        let base = "[[target]]\nurl = \"http://127.0.0.1:8000\"\n";
        let file = Arc::new(Mutex::new(base.to_owned()));
        let format = Arc::new(Mutex::new("text"));
        let l = loader(file.clone(), format.clone(), LogFormat::Text);
        let started = (l.load)().unwrap();
        let mut current = started.clone();
        let (statics, _) = watch::channel(started.targets.clone());
        let status = ReloadStatus::default();
        let set = |text: String| *file.lock().unwrap() = text;

        set(format!("{base}[gpu]\nenabled = false\n"));
        *format.lock().unwrap() = "json";
        reload_once(&l, &started, &mut current, &statics, &status, "SIGHUP");
        let v = status.view();
        assert_eq!(
            (v.last_ok, v.needs_restart.clone()),
            (Some(true), vec!["gpu", "log_format"])
        );
        // The same file again (a no-op SIGHUP): still pending.
        reload_once(&l, &started, &mut current, &statics, &status, "SIGHUP");
        assert_eq!(status.view().needs_restart, ["gpu", "log_format"]);
        // A bad file: refused; still pending.
        set(format!("{base}rate = -1.0\n"));
        reload_once(&l, &started, &mut current, &statics, &status, "file");
        let v = status.view();
        assert_eq!((v.last_ok, v.failures), (Some(false), 1));
        assert!(
            v.last_error.as_deref().is_some_and(|e| e.contains("rate")),
            "{v:?}"
        );
        assert_eq!(v.needs_restart, ["gpu", "log_format"]);
        // A bad log_format is refused too, naming it.
        set(base.to_owned());
        *format.lock().unwrap() = "yaml";
        reload_once(&l, &started, &mut current, &statics, &status, "file");
        let v = status.view();
        assert!(
            v.last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("log_format = \"yaml\"")),
            "{v:?}"
        );
        // Back to the started file and format: nothing pending.
        *format.lock().unwrap() = "text";
        reload_once(&l, &started, &mut current, &statics, &status, "file");
        assert_eq!(status.view().needs_restart, Vec::<&str>::new());
    }
}
