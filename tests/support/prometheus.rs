//! Debian's Prometheus (`prometheus`, `promtool`, 2.42) for the alerting tests: the tools on
//! PATH, and a server on loopback with a temporary data directory, killed when dropped.
//!
//! `cargo xtask ci` installs the `prometheus` package as root and sets
//! `LMPERF_REQUIRE_PROMETHEUS=1`; without that variable a test on a machine without the
//! package says so and passes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::agent::http_get;
use crate::peers::free_port;

fn required() -> bool {
    std::env::var("LMPERF_REQUIRE_PROMETHEUS").is_ok_and(|v| v == "1")
}

/// `name` (`promtool`, `prometheus`) on PATH; `None` (after saying why) when it is missing and
/// the test is not required to run it.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|p| p.exists())
    });
    if found.is_none() {
        assert!(
            !required(),
            "{name} required (LMPERF_REQUIRE_PROMETHEUS=1) but not on PATH: apt-get install prometheus"
        );
        eprintln!(
            "skipped: no {name} on PATH (cargo xtask ci installs Debian's prometheus package as root)"
        );
    }
    found
}

/// Runs `promtool ARGS` in `dir`: (success, stdout + stderr).
pub fn promtool(bin: &Path, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A Prometheus server on `127.0.0.1:<free port>` with its own data directory; killed and its
/// directory removed when dropped.
pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
}

impl Prometheus {
    /// Starts `bin` with `prometheus.yml` (written into a new temp directory, beside the
    /// `rules` files given as (file name, text)) and waits for `/-/ready` (30 s at most).
    pub fn start(bin: &Path, config: &str, rules: &[(&str, &str)]) -> Prometheus {
        Self::start_with(bin, config, rules, &[])
    }

    /// [`Prometheus::start`] with more flags (e.g. `--enable-feature=exemplar-storage`).
    pub fn start_with(
        bin: &Path,
        config: &str,
        rules: &[(&str, &str)],
        flags: &[&str],
    ) -> Prometheus {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("lmperf-prometheus-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).expect("prometheus temp dir");
        std::fs::write(dir.join("prometheus.yml"), config).expect("write prometheus.yml");
        for (name, text) in rules {
            std::fs::write(dir.join(name), text).expect("write rules");
        }
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .args(flags)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let p = Prometheus {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            dir,
        };
        let t = Instant::now();
        loop {
            if std::net::TcpStream::connect_timeout(&p.addr, Duration::from_millis(200)).is_ok()
                && http_get(p.addr, "/-/ready").0 == 200
            {
                return p;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "prometheus not ready in 30 s:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `GET path` as JSON (`{"status": "success", "data": …}`).
    pub fn api(&self, path: &str) -> serde_json::Value {
        let (code, body) = http_get(self.addr, path);
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// The active alerts (pending and firing) of `/api/v1/alerts`.
    pub fn alerts(&self) -> Vec<serde_json::Value> {
        self.api("/api/v1/alerts")["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The server's log (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
