//! Headless Chromium (Debian's `chromium`) for the tests that render lmperf's HTML pages.
//!
//! `cargo xtask ci` installs it as root and sets `LMPERF_REQUIRE_CHROMIUM=1`: a required test
//! fails without it; otherwise it says why it skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one Chromium run may take before the test fails.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// Whether the Chromium tests must run (`LMPERF_REQUIRE_CHROMIUM=1`).
pub fn required() -> bool {
    std::env::var("LMPERF_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1")
}

/// The Chromium binary (`LMPERF_CHROMIUM`, else `chromium` / `chromium-browser` on PATH);
/// `None` (after saying why) when there is none and the test is not required to run it.
pub fn find() -> Option<PathBuf> {
    let found = std::env::var_os("LMPERF_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
                .find(|p| p.exists())
        });
    if found.is_none() {
        assert!(
            !required(),
            "Chromium required (LMPERF_REQUIRE_CHROMIUM=1) but not found: apt-get install chromium"
        );
        eprintln!(
            "skipped the Chromium check: no chromium on PATH (cargo xtask ci installs it as root)"
        );
    }
    found
}

/// Runs headless Chromium `bin` on the file `page` with the extra `args` (e.g. `--dump-dom`,
/// `--screenshot=…`) and a fresh profile in `profile`; returns its stdout and the page's
/// console lines (errors, uncaught exceptions, failed loads). Panics after 120 s.
pub fn headless(bin: &Path, page: &Path, args: &[&str], profile: &Path) -> (String, Vec<String>) {
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .args([
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .args(["--enable-logging=stderr", "--v=0"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let read_all = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = read_all(Box::new(child.stdout.take().expect("piped stdout")));
    let err = read_all(Box::new(child.stderr.take().expect("piped stderr")));
    let t = Instant::now();
    while child.try_wait().expect("chromium status").is_none() {
        if t.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            panic!("chromium on {} took over {RUN_LIMIT:?}", page.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    // Page console messages are logged as `…:INFO:CONSOLE:1] "message", source: …`.
    let console = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
        .map(str::to_owned)
        .collect();
    (stdout, console)
}

/// The DOM Chromium builds from `page` (`--dump-dom`), or `None` without Chromium (see
/// [`find`]). Panics on console errors: lmperf's pages hold no failing script.
pub fn dom(page: &Path, profile: &Path) -> Option<String> {
    let bin = find()?;
    let (dom, console) = headless(&bin, page, &["--dump-dom"], profile);
    assert!(
        console.is_empty(),
        "console messages rendering {}: {console:?}",
        page.display()
    );
    Some(dom)
}
