//! Runs one e2e test alone in a child process of the test binary, for the few tests whose
//! assertions read process-wide figures (CPU time, RSS, the global log subscriber): in the one
//! `e2e` binary other tests run beside them in the same process and would count as theirs.
//!
//! ```ignore
//! #[test]
//! fn measures_process_cpu() {
//!     if !lmperf_e2e::own_process::here("export::measures_process_cpu") {
//!         return; // the parent: the child ran the body and passed
//!     }
//!     // the body, alone in its process
//! }
//! ```

use std::process::Command;

/// The environment variable that tells the child which test is its own.
const OWN_PROCESS_ENV: &str = "LMPERF_E2E_OWN_PROCESS";

/// `true` in the child process, which then runs the test body. In the parent (any other
/// process), runs `test` (its full path inside the binary, e.g. `export::case_13_…`) as the
/// only test of a child process of this binary, holding the serial lock while it runs (the
/// callers time CPU work), and returns `false` once the child passed.
///
/// # Panics
/// When the child cannot start or its test fails; the child's output is in the message.
pub fn here(test: &str) -> bool {
    if std::env::var(OWN_PROCESS_ENV).as_deref() == Ok(test) {
        return true;
    }
    let _serial = crate::serial::lock_blocking();
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let out = Command::new(&exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(OWN_PROCESS_ENV, test)
        .output()
        .unwrap_or_else(|e| panic!("cannot start {} for {test}: {e}", exe.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{test} in its own process failed ({}):\n{text}",
        out.status
    );
    assert!(
        text.contains("1 passed"),
        "{test} in its own process ran no test (is the path right?):\n{text}"
    );
    false
}
