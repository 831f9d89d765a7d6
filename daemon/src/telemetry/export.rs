//! The span export path: a bounded queue and one export task.
//!
//! `enqueue` never blocks and never allocates beyond the queue's bound: when the queue is full
//! the span is dropped and counted (`dropped_queue_full`). The task takes up to `batch_size`
//! spans (or what arrived within [`BATCH_DELAY`]), exports them with a timeout, and after a
//! failure waits with exponential backoff and jitter ([`BACKOFF_MIN`]…[`BACKOFF_MAX`]) before
//! the next attempt, while the queue keeps absorbing (and, when full, dropping) new spans. A
//! failed batch is counted (`failed`) and not retried, so memory stays bounded. Warnings are
//! rate-limited to one per [`WARN_EVERY`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use rand::Rng;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Longest wait for a batch to fill.
pub const BATCH_DELAY: Duration = Duration::from_millis(500);
pub const BACKOFF_MIN: Duration = Duration::from_millis(500);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
pub const WARN_EVERY: Duration = Duration::from_secs(30);

/// Counters of the export path, shared with `/api/v1/status` and the self-metrics.
#[derive(Debug, Default)]
pub struct ExportStats {
    pub enqueued: AtomicU64,
    pub exported: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub failed: AtomicU64,
    pub export_errors: AtomicU64,
    /// Spans taken from the queue and being exported now.
    pub exporting: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// A point-in-time copy of [`ExportStats`] plus the queue's fill.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ExportSnapshot {
    pub enabled: bool,
    pub queue_len: usize,
    pub queue_capacity: usize,
    /// Spans in the batch being filled or exported now (enqueued = queue_len + exporting + exported +
    /// failed, once dropped spans are left out).
    pub exporting: u64,
    pub enqueued: u64,
    pub exported: u64,
    pub dropped_queue_full: u64,
    pub failed: u64,
    pub export_errors: u64,
    pub last_error: Option<String>,
}

impl ExportStats {
    fn set_error(&self, e: String) {
        if let Ok(mut g) = self.last_error.lock() {
            *g = Some(e);
        }
    }
}

enum Control {
    /// Export everything queued, then stop; reply when done or at the deadline.
    Shutdown { deadline: Instant, done: oneshot::Sender<()> },
}

/// The sending side, held by the pipeline.
#[derive(Debug, Clone)]
pub struct SpanQueue {
    tx: Option<mpsc::Sender<SpanData>>,
    control: Option<mpsc::Sender<ControlMsg>>,
    capacity: usize,
    pub stats: Arc<ExportStats>,
}

/// Wrapper so `Control` stays private while `SpanQueue` is `Debug`.
pub struct ControlMsg(Control);

impl std::fmt::Debug for ControlMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControlMsg")
    }
}

impl SpanQueue {
    /// A queue that drops everything (export disabled); counts nothing as dropped.
    pub fn disabled() -> Self {
        Self { tx: None, control: None, capacity: 0, stats: Arc::default() }
    }

    /// Starts the export task on the current tokio runtime.
    pub fn start<E: SpanExporter + 'static>(exporter: E, capacity: usize, batch_size: usize, export_timeout: Duration) -> Self {
        let (tx, rx) = mpsc::channel(capacity);
        let (ctl_tx, ctl_rx) = mpsc::channel(1);
        let stats = Arc::new(ExportStats::default());
        let task = ExportTask { exporter, rx, control: ctl_rx, batch_size, export_timeout, stats: stats.clone(), last_warn: None };
        tokio::spawn(task.run());
        Self { tx: Some(tx), control: Some(ctl_tx), capacity, stats }
    }

    /// Queues a span for export; drops and counts it when the queue is full.
    pub fn enqueue(&self, span: SpanData) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(span) {
            Ok(()) => {
                self.stats.enqueued.fetch_add(1, Ordering::Relaxed);
            }
            Err(mpsc::error::TrySendError::Full(_)) | Err(mpsc::error::TrySendError::Closed(_)) => {
                let n = self.stats.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
                if n == 0 {
                    tracing::warn!(capacity = self.capacity, "Span export queue is full; dropping spans (counted in lmperf.export.spans).");
                }
            }
        }
    }

    pub fn snapshot(&self) -> ExportSnapshot {
        let s = &self.stats;
        ExportSnapshot {
            enabled: self.tx.is_some(),
            queue_len: self.tx.as_ref().map_or(0, |tx| tx.max_capacity() - tx.capacity()),
            queue_capacity: self.capacity,
            exporting: s.exporting.load(Ordering::Relaxed),
            enqueued: s.enqueued.load(Ordering::Relaxed),
            exported: s.exported.load(Ordering::Relaxed),
            dropped_queue_full: s.dropped_queue_full.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            export_errors: s.export_errors.load(Ordering::Relaxed),
            last_error: s.last_error.lock().ok().and_then(|g| g.clone()),
        }
    }

    /// Exports what is queued, within `timeout`, and stops the task.
    pub async fn shutdown(&self, timeout: Duration) {
        let Some(control) = &self.control else { return };
        let (done, wait) = oneshot::channel();
        let deadline = Instant::now() + timeout;
        if control.send(ControlMsg(Control::Shutdown { deadline, done })).await.is_ok() {
            let _ = tokio::time::timeout_at(deadline, wait).await;
        }
    }
}

struct ExportTask<E> {
    exporter: E,
    rx: mpsc::Receiver<SpanData>,
    control: mpsc::Receiver<ControlMsg>,
    batch_size: usize,
    export_timeout: Duration,
    stats: Arc<ExportStats>,
    last_warn: Option<Instant>,
}

impl<E: SpanExporter> ExportTask<E> {
    async fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        let mut batch = Vec::with_capacity(self.batch_size);
        loop {
            // Wait for the first span or a shutdown.
            tokio::select! {
                biased;
                msg = self.control.recv() => {
                    if let Some(ControlMsg(Control::Shutdown { deadline, done })) = msg {
                        self.drain(deadline).await;
                        let _ = done.send(());
                    }
                    return;
                }
                span = self.rx.recv() => match span {
                    Some(s) => {
                        batch.push(s);
                        self.stats.exporting.store(1, Ordering::Relaxed);
                    }
                    None => return,
                },
            }
            // Fill the batch for a short while.
            let fill_until = Instant::now() + BATCH_DELAY;
            while batch.len() < self.batch_size {
                match tokio::time::timeout_at(fill_until, self.rx.recv()).await {
                    Ok(Some(s)) => {
                        batch.push(s);
                        self.stats.exporting.store(batch.len() as u64, Ordering::Relaxed);
                    }
                    _ => break,
                }
            }
            let n = batch.len() as u64;
            match self.export(std::mem::take(&mut batch), self.export_timeout).await {
                Ok(()) => {
                    self.stats.exported.fetch_add(n, Ordering::Relaxed);
                    backoff = BACKOFF_MIN;
                }
                Err(e) => {
                    self.stats.failed.fetch_add(n, Ordering::Relaxed);
                    self.warn(&e, backoff);
                    // Back off, but stay responsive to shutdown.
                    let jitter = rand::rng().random_range(0.5..=1.0);
                    let wait = backoff.mul_f64(jitter);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    tokio::select! {
                        biased;
                        msg = self.control.recv() => {
                            if let Some(ControlMsg(Control::Shutdown { deadline, done })) = msg {
                                self.drain(deadline).await;
                                let _ = done.send(());
                            }
                            return;
                        }
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    async fn export(&self, batch: Vec<SpanData>, timeout: Duration) -> Result<(), String> {
        self.stats.exporting.store(batch.len() as u64, Ordering::Relaxed);
        let result = match tokio::time::timeout(timeout, self.exporter.export(batch)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("export timed out after {timeout:?}")),
        };
        self.stats.exporting.store(0, Ordering::Relaxed);
        result
    }

    fn warn(&mut self, error: &str, backoff: Duration) {
        self.stats.export_errors.fetch_add(1, Ordering::Relaxed);
        self.stats.set_error(error.to_owned());
        let now = Instant::now();
        if self.last_warn.is_none_or(|t| now - t >= WARN_EVERY) {
            self.last_warn = Some(now);
            tracing::warn!(error = %error, retry_in = ?backoff, "Span export failed; spans of the failed batch are counted as failed.");
        }
    }

    /// Exports everything queued until `deadline`.
    async fn drain(&mut self, deadline: Instant) {
        loop {
            let mut batch = Vec::with_capacity(self.batch_size);
            while batch.len() < self.batch_size {
                match self.rx.try_recv() {
                    Ok(s) => batch.push(s),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.stats.failed.fetch_add(batch.len() as u64, Ordering::Relaxed);
                return;
            }
            let n = batch.len() as u64;
            match self.export(batch, left.min(self.export_timeout)).await {
                Ok(()) => {
                    self.stats.exported.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.failed.fetch_add(n, Ordering::Relaxed);
                    self.warn(&e, Duration::ZERO);
                }
            }
        }
    }
}
