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

/// Held while a serial test runs; dropping it lets the next one start.
pub type Guard = tokio::sync::MutexGuard<'static, ()>;

static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// In a `#[tokio::test]`: waits until no other serial test runs.
pub async fn lock() -> Guard {
    LOCK.lock().await
}

/// In a plain `#[test]` (outside any async runtime: tokio panics otherwise): blocks until no
/// other serial test runs.
pub fn lock_blocking() -> Guard {
    LOCK.blocking_lock()
}
