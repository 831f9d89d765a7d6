//! Temp dirs of the e2e tests, one helper for all of them: every test runs in one process
//! (the `e2e` binary) and several at a time, so a name alone is not unique.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty directory `$TMPDIR/lmperf-e2e-<pid>-<n>-<name>` (`n` counts the calls of
/// this process, so two tests asking for the same `name` at once get two directories). Any
/// leftover of that path is removed first. Left in place after the test, for a look at what
/// a failing test wrote. Panics if it cannot be created.
pub fn dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "lmperf-e2e-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
    d
}

/// `text` written to `name` inside a fresh [`dir`] named after it: its path.
pub fn file(name: &str, text: &str) -> PathBuf {
    let path = dir(name).join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}
