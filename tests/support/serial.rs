//! The one lock of the e2e tests. They run several at a time in one process (the `e2e`
//! binary; `cargo xtask ci` sets the thread count), except those that hold this lock for
//! their whole run, which run one after another:
//! - every test that starts the real llama.cpp server (CPU inference: two at once on a
//!   2-core machine slow each other's tokens by seconds), and
//! - every test whose assertions time work done on this machine's CPUs (request rates held
//!   for seconds, a latency jump against a calm baseline, TTFT against the scripted server's
//!   send times within milliseconds, a packet delay).
//!
//! Other tests may still run beside a holder, so its timing asserts keep the slack of a busy
//! second core. Take the guard first thing in the test, so that its set-up (starting a server)
//! is inside it too. A tokio mutex: a guard may be held across `.await`, and a failing test
//! releases it as it unwinds (no poisoning).

use std::io::Write as _;
use std::time::Instant;

/// Held while a serial test runs; dropping it lets the next one start and, when
/// `LMPERF_SERIAL_LOG` names a file, appends `<test>\t<waited s>\t<held s>` to it (how
/// `cargo xtask ci` reports the serial chain, the floor of the e2e run's wall time).
pub struct Guard {
    _inner: tokio::sync::MutexGuard<'static, ()>,
    test: String,
    waited_s: f64,
    since: Instant,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Ok(path) = std::env::var("LMPERF_SERIAL_LOG") else {
            return;
        };
        let line = format!(
            "{}\t{:.1}\t{:.1}\n",
            self.test,
            self.waited_s,
            self.since.elapsed().as_secs_f64()
        );
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn guard(inner: tokio::sync::MutexGuard<'static, ()>, asked: Instant) -> Guard {
    // `cargo xtask ci` runs its long lock-free tests in a second process (xtask/src/e2e_early.rs),
    // whose lock would guard nothing against the first process's serial tests.
    assert!(
        std::env::var_os("LMPERF_E2E_EARLY").is_none(),
        "this test takes the serial lock, so it cannot be in xtask/src/e2e_early.rs EARLY (LMPERF_E2E_EARLY is set)"
    );
    Guard {
        _inner: inner,
        test: std::thread::current().name().unwrap_or("?").to_owned(),
        waited_s: asked.elapsed().as_secs_f64(),
        since: Instant::now(),
    }
}

/// In a `#[tokio::test]`: waits until no other serial test runs.
pub async fn lock() -> Guard {
    let asked = Instant::now();
    // The test's name is its thread's name in libtest, also on a current-thread runtime.
    let inner = LOCK.lock().await;
    guard(inner, asked)
}

/// In a plain `#[test]` (outside any async runtime: tokio panics otherwise): blocks until no
/// other serial test runs.
pub fn lock_blocking() -> Guard {
    let asked = Instant::now();
    guard(LOCK.blocking_lock(), asked)
}
