//! The span export path: one bounded two-lane queue and one export task.
//!
//! Lanes: *priority* spans (kept for an error, an SLO breach or a spike) and *healthy* spans
//! (kept by chance). The queue holds at most `capacity` spans in all. When it is full, a new
//! healthy span is dropped (the newest healthy span goes first); a new priority span evicts
//! the newest healthy span, and is itself dropped only when the queue holds nothing but
//! priority spans. Every drop is counted by the dropped span's sampling reason.
//!
//! `enqueue` never blocks on IO: a short mutex section and a notify. The task takes a batch
//! (priority lane first, so a spike's spans still queued go first when a collector comes
//! back), exports it with a timeout, and after a failure waits with exponential backoff and
//! jitter ([`BACKOFF_MIN`]…[`BACKOFF_MAX`]) while the queue keeps absorbing (and, when full,
//! dropping) spans. A failed batch is counted (`failed`) and not retried, so memory stays
//! bounded. Warnings are rate-limited to one per [`WARN_EVERY`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use rand::Rng;
use serde::Serialize;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::sampler::adaptive::Reason;

/// Longest wait for a batch to fill.
pub const BATCH_DELAY: Duration = Duration::from_millis(200);
pub const BACKOFF_MIN: Duration = Duration::from_millis(500);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
pub const WARN_EVERY: Duration = Duration::from_secs(30);

/// Counters of the export path, shared with `/api/v1/status` and the self-metrics.
#[derive(Debug, Default)]
pub struct ExportStats {
    pub enqueued: AtomicU64,
    pub exported: AtomicU64,
    /// Dropped because the queue was full, by the dropped span's [`Reason`] index.
    pub dropped: [AtomicU64; Reason::ALL.len()],
    pub failed: AtomicU64,
    pub export_errors: AtomicU64,
    /// Spans taken from the queue and being batched or exported now.
    pub exporting: AtomicU64,
    last_error: Mutex<Option<String>>,
    warned_full: AtomicBool,
}

impl ExportStats {
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().map(|d| d.load(Ordering::Relaxed)).sum()
    }

    fn set_error(&self, e: String) {
        if let Ok(mut g) = self.last_error.lock() {
            *g = Some(e);
        }
    }
}

/// A point-in-time copy of [`ExportStats`] plus the queue's fill.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ExportSnapshot {
    pub enabled: bool,
    pub queue_len: usize,
    pub queue_priority: usize,
    pub queue_capacity: usize,
    /// Spans being batched or exported now (enqueued = queue_len + exporting + exported +
    /// failed + spans evicted from the queue).
    pub exporting: u64,
    pub enqueued: u64,
    pub exported: u64,
    pub dropped_queue_full: u64,
    /// Drops by the sampling reason of the dropped span.
    pub dropped_by_reason: std::collections::BTreeMap<&'static str, u64>,
    pub failed: u64,
    pub export_errors: u64,
    pub last_error: Option<String>,
}

#[derive(Debug, Default)]
struct Lanes {
    priority: VecDeque<(SpanData, Reason)>,
    healthy: VecDeque<(SpanData, Reason)>,
}

impl Lanes {
    fn len(&self) -> usize {
        self.priority.len() + self.healthy.len()
    }

    /// Up to `n` spans, priority lane first.
    fn take(&mut self, n: usize, into: &mut Vec<SpanData>) {
        while into.len() < n {
            match self
                .priority
                .pop_front()
                .or_else(|| self.healthy.pop_front())
            {
                Some((s, _)) => into.push(s),
                None => break,
            }
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    lanes: Mutex<Lanes>,
    ready: Notify,
    /// Shutdown: export what is queued until `deadline`, then stop.
    stop: CancellationToken,
    deadline: Mutex<Option<Instant>>,
    /// Last export warning, shared by the export tasks (rate limit).
    last_warn: Mutex<Option<Instant>>,
}

/// The sending side, held by the pipeline.
#[derive(Debug, Clone)]
pub struct SpanQueue {
    shared: Option<Arc<Shared>>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    capacity: usize,
    pub stats: Arc<ExportStats>,
}

/// What [`SpanQueue::enqueue`] did with a span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Enqueued {
    /// The span is in the queue.
    pub queued: bool,
    /// The trace of the healthy span evicted to make room for it (never exported).
    pub evicted: Option<opentelemetry::trace::TraceId>,
}

impl SpanQueue {
    /// A queue that exports nothing (export disabled); counts nothing as dropped.
    pub fn disabled() -> Self {
        Self {
            shared: None,
            tasks: Arc::default(),
            capacity: 0,
            stats: Arc::default(),
        }
    }

    /// Starts one export task on the current tokio runtime.
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        capacity: usize,
        batch_size: usize,
        export_timeout: Duration,
    ) -> Self {
        Self::start_many(vec![exporter], capacity, batch_size, export_timeout)
    }

    /// Starts one export task per exporter, all taking batches from the same queue, so that
    /// several batches can be in flight to a collector whose round trip is slow.
    pub fn start_many<E: SpanExporter + 'static>(
        exporters: Vec<E>,
        capacity: usize,
        batch_size: usize,
        export_timeout: Duration,
    ) -> Self {
        let shared = Arc::new(Shared::default());
        let stats = Arc::new(ExportStats::default());
        let tasks = exporters
            .into_iter()
            .map(|exporter| {
                let task = ExportTask {
                    exporter,
                    shared: shared.clone(),
                    batch_size,
                    export_timeout,
                    stats: stats.clone(),
                };
                tokio::spawn(crate::cost::metered(&crate::cost::EXPORT, task.run()))
            })
            .collect();
        Self {
            shared: Some(shared),
            tasks: Arc::new(Mutex::new(tasks)),
            capacity,
            stats,
        }
    }

    /// Queues a span kept for `reason`; when the queue is full, drops per the lane rules and
    /// counts the drop. Says whether this span is queued (not when it was dropped, or export is
    /// off) and which healthy span's trace was evicted for it.
    pub fn enqueue(&self, span: SpanData, reason: Reason) -> Enqueued {
        let mut evicted_trace = None;
        let Some(shared) = &self.shared else {
            return Enqueued::default();
        };
        let dropped = {
            let Ok(mut lanes) = shared.lanes.lock() else {
                return Enqueued::default();
            };
            if lanes.len() < self.capacity {
                if reason.is_priority() {
                    lanes.priority.push_back((span, reason))
                } else {
                    lanes.healthy.push_back((span, reason))
                }
                None
            } else if reason.is_priority() {
                match lanes.healthy.pop_back() {
                    Some((old, evicted)) => {
                        evicted_trace = Some(old.span_context.trace_id());
                        lanes.priority.push_back((span, reason));
                        Some(evicted)
                    }
                    None => Some(reason),
                }
            } else {
                Some(reason)
            }
        };
        self.stats.enqueued.fetch_add(1, Ordering::Relaxed);
        // Queued unless the span itself was the one dropped (a priority span that evicted a
        // healthy one is queued).
        let queued = dropped.is_none_or(|r| reason.is_priority() && r != reason);
        match dropped {
            None => shared.ready.notify_one(),
            Some(r) => {
                if reason.is_priority() && r != reason {
                    shared.ready.notify_one();
                }
                self.stats.dropped[r.index()].fetch_add(1, Ordering::Relaxed);
                if !self.stats.warned_full.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        capacity = self.capacity,
                        "Span export queue is full; dropping the newest healthy spans first (counted in lmperf.export.spans)."
                    );
                }
            }
        }
        Enqueued {
            queued,
            evicted: evicted_trace,
        }
    }

    pub fn snapshot(&self) -> ExportSnapshot {
        let s = &self.stats;
        let (queue_len, queue_priority) = self
            .shared
            .as_ref()
            .and_then(|sh| sh.lanes.lock().ok().map(|l| (l.len(), l.priority.len())))
            .unwrap_or((0, 0));
        ExportSnapshot {
            enabled: self.shared.is_some(),
            queue_len,
            queue_priority,
            queue_capacity: self.capacity,
            exporting: s.exporting.load(Ordering::Relaxed),
            enqueued: s.enqueued.load(Ordering::Relaxed),
            exported: s.exported.load(Ordering::Relaxed),
            dropped_queue_full: s.dropped_total(),
            dropped_by_reason: Reason::ALL
                .iter()
                .map(|r| (r.as_str(), s.dropped[r.index()].load(Ordering::Relaxed)))
                .collect(),
            failed: s.failed.load(Ordering::Relaxed),
            export_errors: s.export_errors.load(Ordering::Relaxed),
            last_error: s.last_error.lock().ok().and_then(|g| g.clone()),
        }
    }

    /// Exports what is queued, within `timeout`, and stops the tasks.
    pub async fn shutdown(&self, timeout: Duration) {
        let Some(shared) = &self.shared else { return };
        let deadline = Instant::now() + timeout;
        if let Ok(mut d) = shared.deadline.lock() {
            *d = Some(deadline);
        }
        shared.stop.cancel();
        let tasks = self
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for t in tasks {
            let _ = tokio::time::timeout_at(deadline, t).await;
        }
    }
}

struct ExportTask<E> {
    exporter: E,
    shared: Arc<Shared>,
    batch_size: usize,
    export_timeout: Duration,
    stats: Arc<ExportStats>,
}

impl<E: SpanExporter> ExportTask<E> {
    fn take(&self, into: &mut Vec<SpanData>) {
        if let Ok(mut lanes) = self.shared.lanes.lock() {
            lanes.take(self.batch_size, into);
        }
        self.stats
            .exporting
            .fetch_add(into.len() as u64, Ordering::Relaxed);
    }

    fn queued(&self) -> usize {
        self.shared.lanes.lock().map(|l| l.len()).unwrap_or(0)
    }

    async fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        let mut batch = Vec::with_capacity(self.batch_size);
        loop {
            // Wait for spans (or a shutdown), then give a batch a short while to fill.
            if self.queued() == 0 {
                tokio::select! {
                    biased;
                    _ = self.shared.stop.cancelled() => return self.stop().await,
                    _ = self.shared.ready.notified() => {}
                }
            }
            // Give a batch up to BATCH_DELAY to fill; under load it is full at once.
            let fill_until = Instant::now() + BATCH_DELAY;
            while self.queued() < self.batch_size {
                tokio::select! {
                    biased;
                    _ = self.shared.stop.cancelled() => return self.stop().await,
                    _ = self.shared.ready.notified() => {}
                    _ = tokio::time::sleep_until(fill_until) => break,
                }
            }
            self.take(&mut batch);
            if batch.is_empty() {
                continue;
            }
            let n = batch.len() as u64;
            let result = self
                .export(std::mem::take(&mut batch), self.export_timeout)
                .await;
            self.stats.exporting.fetch_sub(n, Ordering::Relaxed);
            match result {
                Ok(()) => {
                    self.stats.exported.fetch_add(n, Ordering::Relaxed);
                    backoff = BACKOFF_MIN;
                }
                Err(e) => {
                    self.stats.failed.fetch_add(n, Ordering::Relaxed);
                    self.warn(&e, backoff);
                    let wait = backoff.mul_f64(rand::rng().random_range(0.5..=1.0));
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    tokio::select! {
                        biased;
                        _ = self.shared.stop.cancelled() => return self.stop().await,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    async fn stop(&mut self) {
        let deadline = self
            .shared
            .deadline
            .lock()
            .ok()
            .and_then(|d| *d)
            .unwrap_or_else(Instant::now);
        self.drain(deadline).await;
    }

    async fn export(&self, batch: Vec<SpanData>, timeout: Duration) -> Result<(), String> {
        match tokio::time::timeout(timeout, self.exporter.export(batch)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("export timed out after {timeout:?}")),
        }
    }

    fn warn(&self, error: &str, backoff: Duration) {
        self.stats.export_errors.fetch_add(1, Ordering::Relaxed);
        self.stats.set_error(error.to_owned());
        let now = Instant::now();
        let due = match self.shared.last_warn.lock() {
            Ok(mut last) if last.is_none_or(|t| now - t >= WARN_EVERY) => {
                *last = Some(now);
                true
            }
            _ => false,
        };
        if due {
            tracing::warn!(error = %error, retry_in = ?backoff, "Span export failed; spans of the failed batch are counted as failed.");
        }
    }

    /// Exports everything queued until `deadline`; what is left then is counted as failed.
    async fn drain(&mut self, deadline: Instant) {
        loop {
            let mut batch = Vec::with_capacity(self.batch_size);
            self.take(&mut batch);
            if batch.is_empty() {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let n = batch.len() as u64;
            let result = if left.is_zero() {
                Err("shutdown deadline passed".to_owned())
            } else {
                self.export(batch, left.min(self.export_timeout)).await
            };
            self.stats.exporting.fetch_sub(n, Ordering::Relaxed);
            match result {
                Ok(()) => {
                    self.stats.exported.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.failed.fetch_add(n, Ordering::Relaxed);
                    self.warn(&e, Duration::ZERO);
                    if Instant::now() >= deadline {
                        let rest = self.queued() as u64;
                        self.stats.failed.fetch_add(rest, Ordering::Relaxed);
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::error::OTelSdkResult;

    /// An exporter that fails until told otherwise and records what it got.
    #[derive(Debug, Default, Clone)]
    struct Switch {
        up: Arc<AtomicBool>,
        got: Arc<Mutex<Vec<String>>>,
    }

    impl SpanExporter for Switch {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if !self.up.load(Ordering::SeqCst) {
                return Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                    "down".into(),
                ));
            }
            if let Ok(mut g) = self.got.lock() {
                g.extend(batch.into_iter().map(|s| s.name.into_owned()));
            }
            Ok(())
        }
    }

    fn span(name: &str) -> SpanData {
        use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
        SpanData {
            span_context: SpanContext::empty_context(),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Client,
            name: name.to_owned().into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn enqueue_says_what_was_queued_and_evicted() {
        use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
        let with_trace = |n: u128| {
            let mut sp = span("x");
            sp.span_context = SpanContext::new(
                TraceId::from(n),
                SpanId::from(1_u64),
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            );
            sp
        };
        let off = SpanQueue::disabled();
        assert_eq!(
            off.enqueue(with_trace(1), Reason::Error),
            Enqueued::default()
        );
        let ex = Switch::default(); // down: nothing leaves the queue
        let q = SpanQueue::start(ex.clone(), 2, 10, Duration::from_secs(60));
        let queued = |evicted| Enqueued {
            queued: true,
            evicted,
        };
        assert_eq!(q.enqueue(with_trace(1), Reason::Base), queued(None));
        assert_eq!(q.enqueue(with_trace(2), Reason::Base), queued(None));
        // Full: a healthy span is dropped; a priority one evicts the newest healthy (trace 2).
        assert_eq!(q.enqueue(with_trace(3), Reason::Base), Enqueued::default());
        assert_eq!(
            q.enqueue(with_trace(4), Reason::Error),
            queued(Some(TraceId::from(2_u128)))
        );
        assert_eq!(
            q.enqueue(with_trace(5), Reason::Spike),
            queued(Some(TraceId::from(1_u128)))
        );
        assert_eq!(q.enqueue(with_trace(6), Reason::Spike), Enqueued::default());
    }

    #[tokio::test(start_paused = true)]
    async fn full_queue_drops_newest_healthy_first_and_spikes_go_first() {
        let ex = Switch::default();
        let q = SpanQueue::start(ex.clone(), 4, 10, Duration::from_secs(1));
        // Collector down: the first spans fail, then the queue fills.
        q.enqueue(span("h0"), Reason::Base);
        tokio::time::sleep(Duration::from_millis(300)).await; // h0 exported (failed)
        for i in 1..=4 {
            q.enqueue(span(&format!("h{i}")), Reason::Base);
        }
        q.enqueue(span("h5"), Reason::Base); // full: the new healthy span is dropped
        q.enqueue(span("s0"), Reason::Spike); // full: evicts the newest healthy (h4)
        q.enqueue(span("e0"), Reason::Error); // evicts h3
        let snap = q.snapshot();
        assert_eq!((snap.queue_len, snap.queue_priority), (4, 2));
        assert_eq!(snap.dropped_by_reason["base"], 3);
        assert_eq!(snap.dropped_by_reason["spike"], 0);
        // Only priority spans left and full: a new priority span is dropped, counted as such.
        q.enqueue(span("s1"), Reason::Spike);
        q.enqueue(span("s2"), Reason::Spike);
        q.enqueue(span("s3"), Reason::Spike);
        assert_eq!(q.snapshot().dropped_by_reason["spike"], 1);
        // The collector comes back: the priority lane goes first, without a restart.
        ex.up.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(60)).await;
        let got = ex.got.lock().unwrap().clone();
        assert_eq!(got, vec!["s0", "e0", "s1", "s2"]);
        let snap = q.snapshot();
        assert_eq!(snap.failed, 1);
        assert_eq!(snap.exported, 4);
        assert_eq!(
            snap.enqueued,
            snap.exported + snap.failed + snap.dropped_queue_full + snap.queue_len as u64
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_flushes_what_is_queued() {
        let ex = Switch::default();
        ex.up.store(true, Ordering::SeqCst);
        let q = SpanQueue::start(ex.clone(), 100, 10, Duration::from_secs(1));
        for i in 0..25 {
            q.enqueue(span(&format!("x{i}")), Reason::Base);
        }
        q.shutdown(Duration::from_secs(2)).await;
        assert_eq!(ex.got.lock().unwrap().len(), 25);
    }
}
