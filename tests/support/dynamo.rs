//! NVIDIA Dynamo 1.6.1 on CPU for the tests (issue 36.1, 51): one frontend per test process
//! (its KV router), each test's model served by its own mocker workers in its own namespace,
//! `--discovery-backend file --request-plane tcp`. Needs `.venv-serving`
//! (`tests/peers/install-serving.sh`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::agent::workspace_root;
use crate::peers::free_port;
use crate::temp;

/// The Dynamo frontend the tests share (issue 51: one start per test binary run): its KV
/// router (`--router-mode kv`, as a Dynamo deployment runs it) with the load-only cost (no
/// prefix-overlap credit, no KV events: each request goes to the least loaded worker, so a
/// benchmark at concurrency 2 spreads over two idle workers), the file discovery under `dir`.
/// Each test serves its own model from its own namespace ([`Dynamo`]), so the tests run side
/// by side on it. Started by the first test that asks, it lives until the test process ends
/// (the kernel kills it then: `PR_SET_PDEATHSIG` from the thread that started it, which never
/// returns).
pub struct Frontend {
    pub url: String,
    pub dir: PathBuf,
    /// The frontend process's pid (its CPU quota is an episode's fault).
    pub pid: u32,
}

/// One test's model on the shared frontend: its mocker processes, in namespace `name`, serving
/// model `name`, each logging to `dir/mocker<N>.log`; killed when dropped.
pub struct Dynamo {
    pub children: Vec<Child>,
    pub url: String,
    pub model: String,
    pub dir: PathBuf,
    pub kv: PathBuf,
    pub frontend: &'static Frontend,
}

impl Drop for Dynamo {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn venv() -> Option<PathBuf> {
    let v = workspace_root().join(".venv-serving");
    if v.join("bin/python").is_file() && v.join("model/config.json").is_file() {
        return Some(v);
    }
    assert!(
        std::env::var("LMPERF_REQUIRE_SERVING").as_deref() != Ok("1"),
        "LMPERF_REQUIRE_SERVING=1 but {} is missing: run tests/peers/install-serving.sh",
        v.display()
    );
    eprintln!("skipped: no .venv-serving (tests/peers/install-serving.sh)");
    None
}

/// A Dynamo process's command line: `python -m <args>`, logging to `log`, with the file
/// discovery under `kv`.
pub fn dynamo_cmd(v: &Path, kv: &Path, args: &[&str], log: &Path) -> Child {
    command(v, kv, args, log).spawn().unwrap()
}

/// [`dynamo_cmd`], the process killed by the kernel when the calling thread ends.
pub fn dynamo_cmd_dying_with_thread(v: &Path, kv: &Path, args: &[&str], log: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = command(v, kv, args, log);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

pub fn command(v: &Path, kv: &Path, args: &[&str], log: &Path) -> Command {
    let out = std::fs::File::create(log).unwrap();
    let mut cmd = Command::new(v.join("bin/python"));
    cmd.args(args)
        .args(["--discovery-backend", "file", "--request-plane", "tcp"])
        .env("DYN_FILE_KV", kv)
        .env("DYN_LOG", "info")
        .current_dir(log.parent().unwrap())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    cmd
}

/// The shared frontend, started once per test process by the first test that asks.
pub fn frontend() -> Option<&'static Frontend> {
    static SHARED: OnceLock<Frontend> = OnceLock::new();
    let v = venv()?;
    Some(SHARED.get_or_init(|| start_frontend(&v)))
}

/// Starts the frontend from a thread that never ends, the frontend to be killed when that
/// thread dies (with the test process).
pub fn start_frontend(v: &Path) -> Frontend {
    let dir = temp::dir("dynamo-frontend");
    let port = free_port();
    let (v, kv, log) = (v.to_owned(), dir.join("kv"), dir.join("frontend.log"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let port_s = port.to_string();
        let child = dynamo_cmd_dying_with_thread(
            &v,
            &kv,
            &[
                "-m",
                "dynamo.frontend",
                "--http-port",
                &port_s,
                "--router-mode",
                "kv",
                "--router-kv-overlap-score-credit",
                "0",
                "--no-router-kv-events",
            ],
            &log,
        );
        let _ = tx.send(child.id());
        let _held = child;
        loop {
            std::thread::park();
        }
    });
    let pid = rx.recv().unwrap_or_default();
    Frontend {
        url: format!("http://127.0.0.1:{port}"),
        dir,
        pid,
    }
}

/// Starts model `name` on the shared frontend: one mocker process per `mockers` entry
/// (`agg` with `--num-workers`, `prefill`, `decode`), and waits until a chat request to it
/// passes.
pub fn start(name: &str, mockers: &[(&str, u32)]) -> Option<Dynamo> {
    let f = frontend()?;
    let mut d = Dynamo {
        children: Vec::new(),
        url: f.url.clone(),
        model: name.to_owned(),
        dir: temp::dir(name),
        kv: f.dir.join("kv"),
        frontend: f,
    };
    for (mode, workers) in mockers {
        d.add_mocker(mode, *workers);
    }
    if !mockers.is_empty() {
        wait_serving(&d);
    }
    Some(d)
}

impl Dynamo {
    /// Stops mocker process `i` as Kubernetes stops a pod: SIGTERM (Dynamo's worker then
    /// leaves the discovery and drains), SIGKILL after `grace` if it has not exited.
    pub fn stop_gracefully(&mut self, i: usize, grace: Duration) {
        let Some(child) = self.children.get_mut(i) else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill(2) on our own child's pid; no memory is touched.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts one more mocker process (`mode`, `workers` of them) logging to `mocker<N>.log`;
    /// returns its index in `children`.
    pub fn add_mocker(&mut self, mode: &str, workers: u32) -> usize {
        self.add_mocker_with(mode, workers, &[])
    }

    /// [`Dynamo::add_mocker`] with more mocker arguments (`--kv-transfer-bandwidth 0.1`).
    pub fn add_mocker_with(&mut self, mode: &str, workers: u32, extra: &[&str]) -> usize {
        let v = workspace_root().join(".venv-serving");
        let model = v.join("model");
        let n = workers.to_string();
        let i = self.children.len();
        let component = if mode == "prefill" {
            "prefill"
        } else {
            "backend"
        };
        let endpoint = format!("dyn://{}.{component}.generate", self.model);
        let args = [
            "-m",
            "dynamo.mocker",
            "--model-path",
            model.to_str().unwrap(),
            "--model-name",
            &self.model,
            "--endpoint",
            &endpoint,
            "--speedup-ratio",
            "10",
            "--disaggregation-mode",
            mode,
            "--num-workers",
            &n,
        ];
        let args = [&args[..], extra].concat();
        let log = self.dir.join(format!("mocker{i}.log"));
        let child = dynamo_cmd(&v, &self.kv, &args, &log);
        self.children.push(child);
        i
    }
}

/// Waits until a chat request to `d`'s model passes (at most 120 s).
pub fn wait_serving(d: &Dynamo) {
    let body = format!(
        r#"{{"model":"{}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":2}}"#,
        d.model
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let ok = Command::new("curl")
            .args([
                "-sf",
                "-m",
                "5",
                "-H",
                "content-type: application/json",
                "-d",
                &body,
            ])
            .arg(format!("{}/v1/chat/completions", d.url))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!(
        "Dynamo did not serve {} within 120 s; logs in {} and {}",
        d.model,
        d.dir.display(),
        d.frontend.dir.display()
    );
}
