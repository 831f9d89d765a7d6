//! `lmperf run --launch`: start the model server, wait until it answers, warm it up, stop it.
//!
//! The server runs as `sh -c 'exec CMD'` in a process group of its own, with stdout and
//! stderr in `server.log` of the output directory. It is stopped (SIGTERM to the group,
//! [`STOP_GRACE`], SIGKILL to the group) at the end of the run, on Ctrl-C / SIGTERM, on any
//! error, and when the [`Server`] is dropped (a panic unwinding); the server also gets
//! `PR_SET_PDEATHSIG` SIGKILL, so even a killed `lmperf` leaves no stray server behind.

use std::io::IsTerminal as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::canary::client::{self, CanaryRequest, Clients};
use crate::config::TargetConfig;
use crate::measure::Outcome;

/// Time between SIGTERM and SIGKILL when the server is stopped.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// Default of `--launch-timeout`: big models load slowly.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// Warm-up requests sent once the server answers (8 output tokens each, not measured).
pub const WARMUP_REQUESTS: usize = 2;
const POLL: Duration = Duration::from_millis(250);

/// Which server `--launch` starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launcher {
    /// `vllm serve {model} --host 127.0.0.1 --port {port}`
    Vllm,
    /// `python3 -m sglang.launch_server --model-path {model} --host 127.0.0.1 --port {port}`
    Sglang,
    /// `llama-server --host 127.0.0.1 --port {port} (-m {model} | -hf {model}) --alias {model}`
    LlamaServer,
    /// A shell command with `{port}` (and usually `{model}`) placeholders.
    Template(String),
}

impl Launcher {
    /// Parses `--launch`: `vllm`, `sglang`, `llama-server` or a command containing `{port}`.
    ///
    /// # Errors
    /// One line naming `--launch` and the value.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "vllm" => Ok(Self::Vllm),
            "sglang" => Ok(Self::Sglang),
            "llama-server" | "llama.cpp" => Ok(Self::LlamaServer),
            t if t.contains("{port}") => Ok(Self::Template(t.to_owned())),
            t => Err(format!(
                "--launch {t:?}: vllm, sglang, llama-server, or a command with {{port}} (and {{model}}) in it"
            )),
        }
    }

    /// `vllm`, `sglang`, `llama-server` or `command`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::LlamaServer => "llama-server",
            Self::Template(_) => "command",
        }
    }

    /// The shell command line for `model` on `port` (the model shell-quoted when needed).
    pub fn command(&self, model: &str, port: u16) -> String {
        let template = match self {
            Self::Vllm => "vllm serve {model} --host 127.0.0.1 --port {port}",
            Self::Sglang => {
                "python3 -m sglang.launch_server --model-path {model} --host 127.0.0.1 --port {port}"
            }
            Self::LlamaServer if model.ends_with(".gguf") || Path::new(model).exists() => {
                "llama-server --host 127.0.0.1 --port {port} -m {model} --alias {model}"
            }
            Self::LlamaServer => {
                "llama-server --host 127.0.0.1 --port {port} -hf {model} --alias {model}"
            }
            Self::Template(t) => t,
        };
        template
            .replace("{model}", &shell_quote(model))
            .replace("{port}", &port.to_string())
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/:-=@+,".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// What `--launch` asks for.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub launcher: Launcher,
    /// `--model`: what the server loads and the requests name.
    pub model: String,
    /// `--launch-timeout`: from the start until the server answers.
    pub timeout: Duration,
}

/// `summary.json` `server`: the launched server.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServerInfo {
    /// `vllm`, `sglang`, `llama-server` or `command`.
    pub launcher: &'static str,
    /// The command line run (`sh -c`).
    pub command: String,
    pub port: u16,
    /// From `GET /version` (vLLM), `/get_server_info` (SGLang) or `/props` `build_info`
    /// (llama.cpp); null when the server says none.
    pub version: Option<String>,
    /// From the start to the first successful `GET /v1/models`, seconds.
    pub startup_s: f64,
    /// The warm-up requests ([`WARMUP_REQUESTS`]), seconds.
    pub warmup_s: f64,
    /// `server.log` (stdout and stderr of the server).
    pub log: PathBuf,
}

/// Why the server could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("--launch: cannot start {command:?}: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error(
        "--launch: the server exited ({status}) before it answered; last line of {log}: {last_line}"
    )]
    Exited {
        status: String,
        log: PathBuf,
        last_line: String,
    },
    #[error(
        "--launch: no answer from the server on port {port} after {waited_s:.0} s (--launch-timeout); see {log}"
    )]
    Timeout {
        port: u16,
        waited_s: f64,
        log: PathBuf,
    },
    #[error("--launch: the warm-up request failed: {0}")]
    Warmup(String),
    #[error("interrupted (Ctrl-C or SIGTERM); the launched server was stopped")]
    Interrupted,
}

/// A started server; stopped on [`Server::stop`] or on drop.
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    pub command: String,
    pub log: PathBuf,
    started: Instant,
}

/// A free loopback port (bound, then released for the server).
///
/// # Errors
/// When no port can be bound.
pub fn free_port() -> std::io::Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()
        .map(|a| a.port())
}

impl Server {
    /// Starts `spec` on `port`, output to `dir/server.log`.
    ///
    /// # Errors
    /// When the log file or the process cannot be made.
    pub fn spawn(spec: &LaunchSpec, port: u16, dir: &Path) -> Result<Self, LaunchError> {
        let command = spec.launcher.command(&spec.model, port);
        let log = dir.join("server.log");
        let spawn_err = |source| LaunchError::Spawn {
            command: command.clone(),
            source,
        };
        let out = std::fs::File::create(&log).map_err(spawn_err)?;
        let err = out.try_clone().map_err(spawn_err)?;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("exec {command}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(spawn_err)?;
        Ok(Self {
            child: Some(child),
            port,
            command,
            log,
            started: Instant::now(),
        })
    }

    /// The base URL of the server.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until `GET /v1/models` answers 2xx (a spinner or a line every 10 s on stderr
    /// when `progress`), the server exits, or `timeout` passes; returns the start-up time.
    ///
    /// # Errors
    /// [`LaunchError::Exited`] or [`LaunchError::Timeout`].
    pub async fn wait_ready(
        &mut self,
        clients: &Clients,
        target: &TargetConfig,
        timeout: Duration,
        progress: bool,
    ) -> Result<Duration, LaunchError> {
        let spinner = (progress && std::io::stderr().is_terminal()).then(|| {
            let s = indicatif::ProgressBar::new_spinner();
            s.set_message(format!("starting the server: {}", self.command));
            s.enable_steady_tick(Duration::from_millis(120));
            s
        });
        if progress && spinner.is_none() {
            eprintln!("lmperf run: starting the server: {}", self.command);
        }
        let mut last_line = Instant::now();
        let result = loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                break Err(LaunchError::Exited {
                    status: status.to_string(),
                    log: self.log.clone(),
                    last_line: last_log_line(&self.log),
                });
            }
            if probe(clients, target).await {
                break Ok(self.started.elapsed());
            }
            let waited = self.started.elapsed();
            if waited >= timeout {
                break Err(LaunchError::Timeout {
                    port: self.port,
                    waited_s: waited.as_secs_f64(),
                    log: self.log.clone(),
                });
            }
            if let Some(s) = &spinner {
                s.set_message(format!(
                    "starting the server ({:.0} s): {}",
                    waited.as_secs_f64(),
                    self.command
                ));
            } else if progress && last_line.elapsed() >= Duration::from_secs(10) {
                eprintln!(
                    "lmperf run: waiting for the server ({:.0} s)",
                    waited.as_secs_f64()
                );
                last_line = Instant::now();
            }
            tokio::time::sleep(POLL).await;
        };
        if let Some(s) = spinner {
            s.finish_and_clear();
        }
        if let (true, Ok(d)) = (progress, &result) {
            eprintln!(
                "lmperf run: the server answered after {:.1} s",
                d.as_secs_f64()
            );
        }
        result
    }

    /// Stops the server: SIGTERM to its process group, up to `grace`, then SIGKILL to the
    /// group. Returns how it ended; idempotent.
    pub fn stop(&mut self, grace: Duration) -> Option<String> {
        let mut child = self.child.take()?;
        let pgid = child.id() as i32;
        let end = |child: &mut Child| child.try_wait().ok().flatten();
        // SAFETY: plain kill(2) on the group this process made for the server.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        let t = Instant::now();
        let mut status = end(&mut child);
        while status.is_none() && t.elapsed() < grace {
            std::thread::sleep(Duration::from_millis(20));
            status = end(&mut child);
        }
        // Whatever is left of the group (workers the server started), then the leader.
        // SAFETY: as above.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let status = status.or_else(|| child.wait().ok());
        status.map(|s| s.to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop(STOP_GRACE);
    }
}

fn last_log_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim().chars().take(300).collect())
        })
        .unwrap_or_else(|| "(empty)".into())
}

/// Whether anything answers `GET /v1/models` with 2xx.
async fn probe(clients: &Clients, target: &TargetConfig) -> bool {
    let Ok(url) = target.base_url.join("v1/models") else {
        return false;
    };
    clients
        .send_idempotent(|c| c.get(url.clone()).timeout(Duration::from_secs(5)))
        .await
        .is_ok_and(|r| r.status().is_success())
}

/// Whether a TCP connection to the target can be made (anything listening). Only a TCP
/// connect: no HTTP request reaches the server.
///
/// # Errors
/// The connect error (refused, unreachable, no answer within the connect timeout), as text.
pub async fn reachable(target: &TargetConfig) -> Result<(), String> {
    let connect = tokio::net::TcpStream::connect((target.host.as_str(), target.port));
    match tokio::time::timeout(target.connect_timeout.max(Duration::from_secs(1)), connect).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no TCP answer within {:?}",
            target.connect_timeout.max(Duration::from_secs(1))
        )),
    }
}

/// The server's version, from the first of `/version`, `/get_server_info`, `/props` that says.
pub async fn version(clients: &Clients, target: &TargetConfig) -> Option<String> {
    for (path, field) in [
        ("version", "version"),
        ("get_server_info", "version"),
        ("props", "build_info"),
    ] {
        let Ok(url) = target.base_url.join(path) else {
            continue;
        };
        let Ok(resp) = clients
            .send_idempotent(|c| c.get(url.clone()).timeout(Duration::from_secs(5)))
            .await
        else {
            continue;
        };
        if !resp.status().is_success() {
            continue;
        }
        if let Ok(v) = resp.json::<serde_json::Value>().await
            && let Some(s) = v.get(field).and_then(|s| {
                s.as_str()
                    .map(str::to_owned)
                    .or_else(|| s.as_u64().map(|n| n.to_string()))
            })
        {
            return Some(s);
        }
    }
    None
}

/// Sends [`WARMUP_REQUESTS`] short requests (8 output tokens); returns their time.
///
/// # Errors
/// The first failure, as one line.
pub async fn warm_up(
    clients: &Clients,
    target: &TargetConfig,
    model: &str,
) -> Result<Duration, LaunchError> {
    let t = Instant::now();
    let cancel = tokio_util::sync::CancellationToken::new();
    for _ in 0..WARMUP_REQUESTS {
        let traceparent = super::export::BenchTelemetry::new_trace().traceparent();
        let req = CanaryRequest {
            api: target.api,
            model,
            prompt: "Say hello.",
            max_tokens: 8,
            traceparent: &traceparent,
            extra_body: None,
        };
        let m = client::execute_with(clients, target, &req, &cancel, false).await;
        if m.record.outcome != Outcome::Ok {
            let e = m
                .record
                .failure()
                .map(|e| {
                    format!(
                        "{}: {}",
                        e.error_type,
                        e.message.clone().unwrap_or_default()
                    )
                })
                .unwrap_or_else(|| m.record.outcome.as_str().to_owned());
            return Err(LaunchError::Warmup(e));
        }
    }
    Ok(t.elapsed())
}

/// Points `target` at the launched server on `port`, its metrics page too when that was on the
/// target's own address (the default `<url>/metrics`); a metrics URL elsewhere stays.
pub fn retarget(target: &mut TargetConfig, port: u16) -> Result<(), String> {
    let m = &target.server.metrics_url;
    if (m.host_str(), m.port_or_known_default())
        == (
            target.base_url.host_str(),
            target.base_url.port_or_known_default(),
        )
    {
        let mut moved = m.clone();
        moved
            .set_host(Some("127.0.0.1"))
            .map_err(|e| e.to_string())?;
        moved
            .set_port(Some(port))
            .map_err(|()| format!("metrics URL {m} cannot take a port"))?;
        moved
            .set_scheme("http")
            .map_err(|()| format!("metrics URL {m} cannot be made http"))?;
        target.server.metrics_url = moved;
    }
    target.base_url =
        url::Url::parse(&format!("http://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
    target.host = "127.0.0.1".into();
    target.port = port;
    target.name = format!("127.0.0.1:{port}");
    Ok(())
}

/// Resolves when the process gets Ctrl-C (SIGINT) or SIGTERM.
pub async fn interrupted() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoEnv;
    impl crate::config::Env for NoEnv {
        fn var(&self, _: &str) -> Option<String> {
            None
        }
    }

    fn target(url: &str, metrics_url: Option<&str>) -> TargetConfig {
        let o = crate::config::Overrides {
            targets: vec![url.to_owned()],
            canary: crate::config::raw::RawCanary {
                model: Some("m".into()),
                metrics_url: metrics_url.map(str::to_owned),
                ..Default::default()
            },
            ..Default::default()
        };
        crate::config::load(o, &NoEnv).unwrap().targets.remove(0)
    }

    #[test]
    fn retarget_moves_the_default_metrics_page_to_the_launched_server() {
        // The new user's `--launch` run read http://127.0.0.1:8000/metrics, not the server's.
        let mut t = target("http://127.0.0.1:8000", None);
        retarget(&mut t, 43_995).unwrap();
        assert_eq!(t.base_url.as_str(), "http://127.0.0.1:43995/");
        assert_eq!(
            t.server.metrics_url.as_str(),
            "http://127.0.0.1:43995/metrics"
        );
        // A metrics page elsewhere (a sidecar exporter, say) stays where it was.
        let mut t = target(
            "http://127.0.0.1:8000",
            Some("http://10.0.0.9:9400/metrics"),
        );
        retarget(&mut t, 43_995).unwrap();
        assert_eq!(
            t.server.metrics_url.as_str(),
            "http://10.0.0.9:9400/metrics"
        );
    }

    #[test]
    fn launchers_parse_and_fill_the_template() {
        assert_eq!(
            Launcher::parse("vllm")
                .unwrap()
                .command("meta-llama/Meta-Llama-3-8B-Instruct", 41_000),
            "vllm serve meta-llama/Meta-Llama-3-8B-Instruct --host 127.0.0.1 --port 41000"
        );
        assert_eq!(
            Launcher::parse("sglang").unwrap().command("m", 1),
            "python3 -m sglang.launch_server --model-path m --host 127.0.0.1 --port 1"
        );
        assert_eq!(
            Launcher::parse("llama-server")
                .unwrap()
                .command("org/repo", 2),
            "llama-server --host 127.0.0.1 --port 2 -hf org/repo --alias org/repo"
        );
        assert_eq!(
            Launcher::parse("llama-server")
                .unwrap()
                .command("/m/x.gguf", 2),
            "llama-server --host 127.0.0.1 --port 2 -m /m/x.gguf --alias /m/x.gguf"
        );
        let t = Launcher::parse("serve --alias {model} --port {port}").unwrap();
        assert_eq!(t.command("it's", 7), r"serve --alias 'it'\''s' --port 7");
        let e = Launcher::parse("serve --model x").unwrap_err();
        assert!(e.starts_with("--launch \"serve --model x\":"), "{e}");
    }

    #[test]
    fn stop_ends_the_whole_group_even_when_sigterm_is_ignored() {
        let dir = std::env::temp_dir().join(format!("lmperf-launch-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // The leader ignores SIGTERM and has a child in its group that does too.
        let spec = LaunchSpec {
            launcher: Launcher::Template(
                "sh -c 'trap \"\" TERM; sleep 60 & echo child $!; trap \"\" TERM; wait' # {port}"
                    .into(),
            ),
            model: "m".into(),
            timeout: DEFAULT_TIMEOUT,
        };
        let mut s = Server::spawn(&spec, 1, &dir).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let log = std::fs::read_to_string(&s.log).unwrap();
        let child: i32 = log.trim().strip_prefix("child ").unwrap().parse().unwrap();
        let t = Instant::now();
        let status = s.stop(Duration::from_millis(300)).unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(300) && t.elapsed() < Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        assert!(status.contains("9"), "killed: {status}");
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: signal 0 only checks that the pid exists.
        let alive = unsafe { libc::kill(child, 0) } == 0
            && !std::fs::read_to_string(format!("/proc/{child}/stat"))
                .unwrap_or_default()
                .contains(") Z");
        assert!(!alive, "the grandchild {child} must be gone");
        assert_eq!(s.stop(Duration::ZERO), None, "idempotent");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
