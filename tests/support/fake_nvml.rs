//! The scripted `libnvidia-ml.so.1` of `tests/support/fake_nvml/` (C, built with the system
//! `cc` by its `build.sh`), for tests of the real NVML path (nvml-wrapper loading a shared
//! library) on machines without a GPU. The script format is in `fake_nvml/README.md`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use crate::agent::workspace_root;

/// Builds the library once per test process and per `omit` set (exported symbols left out, to
/// play an older driver) into `target/fake-nvml/<set>/libnvidia-ml.so.1`; returns its path.
/// Panics with the compiler's output when `cc` fails.
pub fn library(omit: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<Vec<String>, PathBuf>>> = OnceLock::new();
    let key: Vec<String> = omit.iter().map(|s| (*s).to_owned()).collect();
    let mut built = BUILT
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(p) = built.get(&key) {
        return p.clone();
    }
    let name = if omit.is_empty() {
        "full".to_owned()
    } else {
        format!("without-{}", omit.join("-"))
    };
    // Rebuilt once per test process (the sources may have changed); build.sh replaces the file
    // atomically, so test processes building at once never load a half-written library.
    let dir = workspace_root().join("target/fake-nvml").join(name);
    let out = Command::new("sh")
        .arg(workspace_root().join("tests/support/fake_nvml/build.sh"))
        .arg(&dir)
        .args(omit)
        .output()
        .expect("run sh build.sh");
    assert!(
        out.status.success(),
        "building the fake NVML failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = dir.join("libnvidia-ml.so.1");
    built.insert(key, lib.clone());
    lib
}

/// A script file and the fake's log (its first `nvmlInit` time), in a temp dir of their own.
pub struct Script {
    pub dir: PathBuf,
    pub path: PathBuf,
    pub log: PathBuf,
}

impl Script {
    /// Writes `json` as the script under a fresh temp dir named after `tag`.
    pub fn write(tag: &str, json: &serde_json::Value) -> Script {
        let dir =
            std::env::temp_dir().join(format!("lmperf-fake-nvml-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("script dir");
        let path = dir.join("script.json");
        std::fs::write(&path, serde_json::to_vec_pretty(json).expect("script JSON"))
            .expect("write script");
        Script {
            log: dir.join("fake-nvml.log"),
            path,
            dir,
        }
    }

    /// The environment a process loading the fake needs: the script and the log.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("LMPERF_FAKE_NVML_SCRIPT", self.path.display().to_string()),
            ("LMPERF_FAKE_NVML_LOG", self.log.display().to_string()),
        ]
    }

    /// When the fake's script clock started (the process's first `nvmlInit`), once it has.
    pub fn t0(&self) -> Option<SystemTime> {
        let text = std::fs::read_to_string(&self.log).ok()?;
        let us: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("init_unix_us "))?
            .trim()
            .parse()
            .ok()?;
        Some(SystemTime::UNIX_EPOCH + Duration::from_micros(us))
    }

    /// Waits up to `timeout` for [`Script::t0`].
    pub fn wait_t0(&self, timeout: Duration) -> SystemTime {
        let until = std::time::Instant::now() + timeout;
        loop {
            if let Some(t) = self.t0() {
                return t;
            }
            assert!(
                std::time::Instant::now() < until,
                "the fake NVML was not initialized within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `examples/NAME` under `tests/support/fake_nvml/`, parsed.
pub fn example(name: &str) -> serde_json::Value {
    let p = workspace_root()
        .join("tests/support/fake_nvml/examples")
        .join(name);
    serde_json::from_str(
        &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Seconds between `t0` and `t` (negative before).
pub fn since(t0: SystemTime, t: SystemTime) -> f64 {
    match t.duration_since(t0) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}
