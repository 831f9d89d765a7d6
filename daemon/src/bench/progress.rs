//! Progress of a running benchmark on stderr: a bar (indicatif: requests done / total,
//! errors, current rate) when stderr is a terminal, a plain line every
//! [`PLAIN_INTERVAL`] otherwise (logs, CI).

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Gap between plain progress lines.
pub const PLAIN_INTERVAL: Duration = Duration::from_secs(2);
/// Refresh of the terminal bar (its current rate is over this window).
const BAR_INTERVAL: Duration = Duration::from_millis(250);

/// A plain progress line: `lmperf run: c1_in128: 40/100 done, 1 errors, 19.8 req/s`.
pub fn line(name: &str, done: u64, total: usize, errors: u64, rate: f64) -> String {
    format!("lmperf run: {name}: {done}/{total} done, {errors} errors, {rate:.1} req/s")
}

/// Requests per second between two readings; 0 for an empty window.
pub fn rate(done_before: u64, done_now: u64, window: Duration) -> f64 {
    let s = window.as_secs_f64();
    if s <= 0.0 {
        0.0
    } else {
        done_now.saturating_sub(done_before) as f64 / s
    }
}

/// Counters a benchmark's tasks update.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub done: Arc<AtomicU64>,
    pub errors: Arc<AtomicU64>,
}

/// The progress display of one benchmark; [`Progress::finish`] ends it.
#[derive(Debug)]
pub struct Progress {
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    /// Starts showing `counters` of benchmark `name` (of `total` requests); nothing when
    /// `enabled` is false. A bar when stderr is a terminal, else plain lines.
    pub fn start(name: &str, total: usize, counters: &Counters, enabled: bool) -> Self {
        let stop = CancellationToken::new();
        if !enabled {
            return Self { stop, task: None };
        }
        let (name, c, s) = (name.to_owned(), counters.clone(), stop.clone());
        let task = if std::io::stderr().is_terminal() {
            tokio::spawn(bar(name, total, c, s))
        } else {
            tokio::spawn(plain(name, total, c, s))
        };
        Self {
            stop,
            task: Some(task),
        }
    }

    /// Stops the display (the bar is cleared) and waits for it.
    pub async fn finish(mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

async fn plain(name: String, total: usize, c: Counters, stop: CancellationToken) {
    let mut last = (Instant::now(), 0);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PLAIN_INTERVAL) => {}
        }
        let d = c.done.load(Ordering::Relaxed);
        eprintln!(
            "{}",
            line(
                &name,
                d,
                total,
                c.errors.load(Ordering::Relaxed),
                rate(last.1, d, last.0.elapsed())
            )
        );
        last = (Instant::now(), d);
    }
}

async fn bar(name: String, total: usize, c: Counters, stop: CancellationToken) {
    let pb = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} {elapsed}")
        .map(|s| s.progress_chars("=> "));
    if let Ok(style) = style {
        pb.set_style(style);
    }
    pb.set_prefix(name);
    let mut last = (Instant::now(), 0);
    loop {
        let d = c.done.load(Ordering::Relaxed);
        pb.set_message(format!(
            "errors {}, {:.1} req/s",
            c.errors.load(Ordering::Relaxed),
            rate(last.1, d, last.0.elapsed())
        ));
        pb.set_position(d);
        last = (Instant::now(), d);
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(BAR_INTERVAL) => {}
        }
    }
    pb.finish_and_clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_rate() {
        assert_eq!(
            line("c1_in128", 40, 100, 1, 19.84),
            "lmperf run: c1_in128: 40/100 done, 1 errors, 19.8 req/s"
        );
        assert_eq!(rate(10, 30, Duration::from_secs(2)), 10.0);
        assert_eq!(rate(10, 30, Duration::ZERO), 0.0);
    }
}
