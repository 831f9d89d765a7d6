//! Watching a load profile's file while it runs: the kernel's file events through the
//! `notify` crate (inotify on Linux), not polling.
//!
//! The file's directory is watched, not the file, so an editor that saves by writing a new
//! file and renaming it over the old one (vim, `sed -i`, Kubernetes ConfigMap updates) is seen
//! like an in-place write. Every event naming the file bumps a generation counter; a change is
//! reported once the file has been quiet for [`SETTLE`] (one save is several events: truncate,
//! writes, close), so the caller never reads a half-written file. When no watch can be set up
//! (no inotify instance left, an unsupported file system) it falls back to comparing the
//! file's modification time every [`POLL_FALLBACK`], and says so once on standard error.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::watch;

/// How long the file must stay quiet after an event before it is read.
pub const SETTLE: Duration = Duration::from_millis(50);
/// Modification-time check interval when the file system cannot be watched.
pub const POLL_FALLBACK: Duration = Duration::from_millis(200);

/// A watch on one file; dropped, it stops watching.
pub struct ProfileWatch {
    /// (events seen, when the last arrived).
    generation: watch::Receiver<(u64, Instant)>,
    /// Generation last reported by [`ProfileWatch::take_change`] / [`ProfileWatch::changed`].
    seen: u64,
    /// Keeps the kernel watch alive (`None`: polling fallback).
    _watcher: Option<notify::RecommendedWatcher>,
    /// Polling fallback: the task that compares modification times.
    poller: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for ProfileWatch {
    fn drop(&mut self) {
        if let Some(p) = &self.poller {
            p.abort();
        }
    }
}

fn same_file(event_path: &Path, file: &Path, name: Option<&std::ffi::OsStr>) -> bool {
    event_path == file || (name.is_some() && event_path.file_name() == name)
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl ProfileWatch {
    /// Starts watching `path` (needs a Tokio runtime for the fallback).
    pub fn start(path: &Path) -> Self {
        let (tx, generation) = watch::channel((0u64, Instant::now()));
        let file: PathBuf = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        let dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_owned);
        let name = file.file_name().map(std::ffi::OsStr::to_owned);
        let (tx_events, file_events) = (tx.clone(), file.clone());
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let Ok(event) = res else { return };
            if event.kind.is_access() {
                return;
            }
            if event
                .paths
                .iter()
                .any(|p| same_file(p, &file_events, name.as_deref()))
            {
                tx_events.send_modify(|(g, at)| (*g, *at) = (*g + 1, Instant::now()));
            }
        })
        .and_then(|mut w| w.watch(&dir, RecursiveMode::NonRecursive).map(|()| w));
        match watcher {
            Ok(w) => Self {
                generation,
                seen: 0,
                _watcher: Some(w),
                poller: None,
            },
            Err(e) => {
                eprintln!(
                    "lmperf: cannot watch {} ({e}); checking its modification time every {} ms instead",
                    dir.display(),
                    POLL_FALLBACK.as_millis()
                );
                let poller = tokio::spawn(async move {
                    let mut last = mtime(&file);
                    loop {
                        tokio::time::sleep(POLL_FALLBACK).await;
                        let now = mtime(&file);
                        if now != last {
                            last = now;
                            tx.send_modify(|(g, at)| (*g, *at) = (*g + 1, Instant::now()));
                            if tx.is_closed() {
                                return;
                            }
                        }
                    }
                });
                Self {
                    generation,
                    seen: 0,
                    _watcher: None,
                    poller: Some(poller),
                }
            }
        }
    }

    /// Whether the file changed since the last report, and has been quiet for [`SETTLE`]
    /// since its last event (else it is still reported as unchanged, and will be later).
    pub fn take_change(&mut self) -> bool {
        let (now, at) = *self.generation.borrow();
        if now == self.seen || at.elapsed() < SETTLE {
            return false;
        }
        self.seen = now;
        true
    }

    /// Waits until the file changes and then stays quiet for [`SETTLE`]; marks it seen.
    pub async fn changed(&mut self) {
        loop {
            if self.generation.borrow_and_update().0 == self.seen
                && self.generation.changed().await.is_err()
            {
                // The watcher is gone: never changes again.
                std::future::pending::<()>().await;
            }
            // Settle: until no event for SETTLE.
            loop {
                let (before, _) = *self.generation.borrow_and_update();
                tokio::time::sleep(SETTLE).await;
                if self.generation.borrow().0 == before {
                    break;
                }
            }
            let now = self.generation.borrow().0;
            if now != self.seen {
                self.seen = now;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lmperf-watch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// In-place writes and replace-by-rename are both seen, once each after they settle;
    /// another file of the directory is not.
    #[tokio::test]
    async fn sees_writes_and_renames_of_the_file_only() {
        let d = dir("events");
        let file = d.join("load.yaml");
        std::fs::write(&file, "profile: a\n").unwrap();
        let mut w = ProfileWatch::start(&file);
        assert!(w._watcher.is_some(), "inotify available here");
        assert!(!w.take_change());
        std::fs::write(&file, "profile: b\n").unwrap();
        assert!(
            tokio::time::timeout(Duration::from_secs(5), w.changed())
                .await
                .is_ok(),
            "an in-place write"
        );
        assert!(!w.take_change(), "reported once");
        let tmp = d.join(".load.yaml.tmp");
        std::fs::write(&tmp, "profile: c\n").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        assert!(
            tokio::time::timeout(Duration::from_secs(5), w.changed())
                .await
                .is_ok(),
            "a replace by rename"
        );
        std::fs::write(d.join("other.yaml"), "x").unwrap();
        tokio::time::sleep(SETTLE * 4).await;
        assert!(!w.take_change(), "another file of the directory");
        let _ = std::fs::remove_dir_all(&d);
    }
}
