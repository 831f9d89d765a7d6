//! Exemplars of the GenAI client histograms: for each series and bucket, the newest canary
//! in that bucket whose trace the sampler kept (and whose span entered the export queue), so
//! that every exemplar on `/metrics` leads to a trace that exists.
//!
//! Metrics are recorded for every request before sampling; the store is fed after the
//! decision ([`super::Telemetry::record_labeled`]), only for kept traces. Bounded: one
//! exemplar per bucket and series, at most [`MAX_SERIES`] series per metric (further series
//! get none, counted in [`ExemplarStore::series_refused`]). Pure: callers pass the time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanId, TraceId};

use super::names as n;

/// The most series per metric that keep exemplars (the histograms' own series count is
/// bounded by targets × models × error types; this only guards memory).
pub const MAX_SERIES: usize = 4096;

/// One exemplar: a kept canary's ids, its value in the metric's unit, and when it ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exemplar {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub value: f64,
    /// Unix time of the observation (the end of the request), seconds.
    pub unix_s: f64,
}

/// A series' labels as Prometheus shows them: sanitized names (as `opentelemetry-prometheus`
/// does: every character but ASCII letters, digits and `:` becomes `_`), sorted by name.
pub type SeriesKey = Vec<(String, String)>;

/// The histograms that carry exemplars: OpenTelemetry name, Prometheus family name, bucket
/// boundaries.
pub const HISTOGRAMS: [(&str, &str, &[f64]); 3] = [
    (
        n::METRIC_OPERATION_DURATION,
        "gen_ai_client_operation_duration_seconds",
        n::BUCKETS_OPERATION_DURATION,
    ),
    (
        n::METRIC_TIME_TO_FIRST_CHUNK,
        "gen_ai_client_operation_time_to_first_chunk_seconds",
        n::BUCKETS_TIME_TO_FIRST_CHUNK,
    ),
    (
        n::METRIC_TIME_PER_OUTPUT_CHUNK,
        "gen_ai_client_operation_time_per_output_chunk_seconds",
        n::BUCKETS_TIME_PER_OUTPUT_CHUNK,
    ),
];

/// Per metric (index into [`HISTOGRAMS`]), per series: one slot per bucket (the last is +Inf).
type Slots = HashMap<SeriesKey, Vec<Option<Exemplar>>>;

/// The Prometheus name of the `lmperf.diagnosis.confirmed` counter's samples: its exemplar is
/// the series' latest `lmperf.diagnosis` span.
pub const DIAGNOSIS_CONFIRMED_FAMILY: &str = "lmperf_diagnosis_confirmed_total";

/// The exemplar store.
#[derive(Debug, Default)]
pub struct ExemplarStore {
    metrics: Mutex<[Slots; 3]>,
    /// Counters: (sample name, series) → the newest exemplar.
    counters: Mutex<HashMap<(String, SeriesKey), Exemplar>>,
    refused: AtomicU64,
}

/// The series key of metric attributes.
pub fn series_key(attrs: &[KeyValue]) -> SeriesKey {
    let mut key: SeriesKey = attrs
        .iter()
        .map(|kv| (sanitize_label(kv.key.as_str()), kv.value.to_string()))
        .collect();
    key.sort();
    key
}

/// A label name as `opentelemetry-prometheus` writes it.
pub fn sanitize_label(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The index of the bucket `value` falls in: the first boundary ≥ value (upper bounds are
/// inclusive, in OpenTelemetry as in Prometheus' `le`), else `boundaries.len()` (+Inf).
pub fn bucket_index(boundaries: &[f64], value: f64) -> usize {
    boundaries.partition_point(|b| *b < value)
}

fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One canary whose trace was kept, as [`ExemplarStore::offer_request`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct KeptRequest {
    /// Its trace and span: what the exemplar links to.
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// When the request ended (the exemplar's timestamp).
    pub end: SystemTime,
    /// Its operation duration (E2E latency).
    pub e2e: Duration,
    /// Its time to first chunk, where one came.
    pub ttft: Option<Duration>,
}

impl ExemplarStore {
    /// Offers one kept canary's observations: its operation duration, TTFT and the gaps
    /// between its output chunks (per bucket, the largest gap of the canary in it), with the
    /// attributes its histogram points were recorded with.
    pub fn offer_request(
        &self,
        attrs: &[KeyValue],
        req: KeptRequest,
        chunk_gaps: impl Iterator<Item = Duration>,
    ) {
        let KeptRequest {
            trace_id,
            span_id,
            end,
            e2e,
            ttft,
        } = req;
        let key = series_key(attrs);
        let ts = unix_s(end);
        let ex = |v: Duration| Exemplar {
            trace_id,
            span_id,
            value: v.as_secs_f64(),
            unix_s: ts,
        };
        let Ok(mut metrics) = self.metrics.lock() else {
            return;
        };
        self.put(&mut metrics[0], &key, HISTOGRAMS[0].2, ex(e2e));
        if let Some(t) = ttft {
            self.put(&mut metrics[1], &key, HISTOGRAMS[1].2, ex(t));
        }
        let b = HISTOGRAMS[2].2;
        let mut largest: Vec<Option<Duration>> = vec![None; b.len() + 1];
        for g in chunk_gaps {
            let i = bucket_index(b, g.as_secs_f64());
            if largest[i].is_none_or(|l| g > l) {
                largest[i] = Some(g);
            }
        }
        for g in largest.into_iter().flatten() {
            self.put(&mut metrics[2], &key, b, ex(g));
        }
    }

    fn put(&self, slots: &mut Slots, key: &SeriesKey, boundaries: &[f64], ex: Exemplar) {
        if !slots.contains_key(key) && slots.len() >= MAX_SERIES {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let row = slots
            .entry(key.clone())
            .or_insert_with(|| vec![None; boundaries.len() + 1]);
        let i = bucket_index(boundaries, ex.value);
        if let Some(slot) = row.get_mut(i) {
            // The newest kept canary wins (an older end time never replaces a newer one).
            if slot.is_none_or(|old| old.unix_s <= ex.unix_s) {
                *slot = Some(ex);
            }
        }
    }

    /// The exemplars of one series of a Prometheus histogram family (by its family name, e.g.
    /// `gen_ai_client_operation_duration_seconds`), one slot per bucket, +Inf last; `None`
    /// when the family carries no exemplars or the series has none yet.
    pub fn for_series(&self, family: &str, key: &SeriesKey) -> Option<Vec<Option<Exemplar>>> {
        let i = HISTOGRAMS.iter().position(|(_, f, _)| *f == family)?;
        let metrics = self.metrics.lock().ok()?;
        metrics[i].get(key).cloned()
    }

    /// Offers the exemplar of one counter increment (`value`, e.g. 1) whose trace was kept and
    /// queued, for the series of `attrs` of the counter whose samples are named `family`
    /// (`…_total`). The newest replaces the older.
    pub fn offer_counter(
        &self,
        family: &str,
        attrs: &[KeyValue],
        trace_id: TraceId,
        span_id: SpanId,
        at: SystemTime,
        value: f64,
    ) {
        let Ok(mut c) = self.counters.lock() else {
            return;
        };
        let key = (family.to_owned(), series_key(attrs));
        if !c.contains_key(&key) && c.len() >= MAX_SERIES {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        c.insert(
            key,
            Exemplar {
                trace_id,
                span_id,
                value,
                unix_s: unix_s(at),
            },
        );
    }

    /// The exemplar of one counter series (samples named `family`, e.g.
    /// `lmperf_diagnosis_confirmed_total`), if any.
    pub fn for_counter(&self, family: &str, key: &SeriesKey) -> Option<Exemplar> {
        let c = self.counters.lock().ok()?;
        c.get(&(family.to_owned(), key.clone())).copied()
    }

    /// Removes every exemplar naming `trace_id` (its span was evicted from the export queue,
    /// so the trace will never exist). Scans at most 3 × [`MAX_SERIES`] rows: called only on an
    /// eviction, when the queue is full.
    pub fn forget_trace(&self, trace_id: TraceId) {
        if let Ok(mut metrics) = self.metrics.lock() {
            for slot in metrics.iter_mut().flat_map(|m| m.values_mut()).flatten() {
                if slot.is_some_and(|e| e.trace_id == trace_id) {
                    *slot = None;
                }
            }
        }
        if let Ok(mut c) = self.counters.lock() {
            c.retain(|_, e| e.trace_id != trace_id);
        }
    }

    /// Exemplars not stored because a metric already had [`MAX_SERIES`] series.
    pub fn series_refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u8) -> (TraceId, SpanId) {
        (TraceId::from(u128::from(n)), SpanId::from(u64::from(n)))
    }

    fn attrs() -> Vec<KeyValue> {
        vec![
            KeyValue::new("lmperf.target", "a"),
            KeyValue::new("gen_ai.request.model", "m"),
        ]
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn bucket_upper_bounds_are_inclusive() {
        let b = [0.1, 0.5, 1.0];
        assert_eq!(bucket_index(&b, 0.05), 0);
        assert_eq!(bucket_index(&b, 0.1), 0);
        assert_eq!(bucket_index(&b, 0.10001), 1);
        assert_eq!(bucket_index(&b, 1.0), 2);
        assert_eq!(bucket_index(&b, 7.0), 3);
    }

    #[test]
    fn newest_kept_per_bucket_and_series() {
        let s = ExemplarStore::default();
        let (t1, s1) = ids(1);
        let (t2, s2) = ids(2);
        let (t3, s3) = ids(3);
        let none = std::iter::empty();
        // Two canaries in the 0.16 s bucket of the operation duration, the second newer.
        s.offer_request(
            &attrs(),
            KeptRequest {
                trace_id: t1,
                span_id: s1,
                end: at(10),
                e2e: Duration::from_millis(150),
                ttft: None,
            },
            none,
        );
        let gaps = [30, 40, 180].map(Duration::from_millis).into_iter();
        s.offer_request(
            &attrs(),
            KeptRequest {
                trace_id: t2,
                span_id: s2,
                end: at(11),
                e2e: Duration::from_millis(120),
                ttft: Some(Duration::from_millis(15)),
            },
            gaps,
        );
        // An older one arriving late does not replace it.
        let none = std::iter::empty();
        s.offer_request(
            &attrs(),
            KeptRequest {
                trace_id: t3,
                span_id: s3,
                end: at(9),
                e2e: Duration::from_millis(100),
                ttft: None,
            },
            none,
        );
        let key = series_key(&attrs());
        assert_eq!(
            key,
            vec![
                ("gen_ai_request_model".to_owned(), "m".to_owned()),
                ("lmperf_target".to_owned(), "a".to_owned())
            ]
        );
        let d = s
            .for_series("gen_ai_client_operation_duration_seconds", &key)
            .unwrap();
        assert_eq!(d.len(), n::BUCKETS_OPERATION_DURATION.len() + 1);
        let i = bucket_index(n::BUCKETS_OPERATION_DURATION, 0.15);
        assert_eq!(n::BUCKETS_OPERATION_DURATION[i], 0.16);
        let e = d[i].unwrap();
        assert_eq!(
            (e.trace_id, e.span_id, e.value, e.unix_s),
            (t2, s2, 0.12, 11.0)
        );
        assert_eq!(d.iter().flatten().count(), 1, "one bucket, one exemplar");
        // TTFT: only the canary that had one.
        let t = s
            .for_series("gen_ai_client_operation_time_to_first_chunk_seconds", &key)
            .unwrap();
        assert_eq!(
            t.iter().flatten().map(|e| e.value).collect::<Vec<_>>(),
            [0.015]
        );
        // Chunk gaps: 30 ms and 40 ms share the 0.05 bucket (the larger stays), 180 ms is in 0.2.
        let c = s
            .for_series(
                "gen_ai_client_operation_time_per_output_chunk_seconds",
                &key,
            )
            .unwrap();
        assert_eq!(
            c.iter().flatten().map(|e| e.value).collect::<Vec<_>>(),
            [0.04, 0.18]
        );
        // Another series, another family: none.
        assert!(
            s.for_series(
                "gen_ai_client_operation_duration_seconds",
                &SeriesKey::new()
            )
            .is_none()
        );
        assert!(s.for_series("gen_ai_client_token_usage", &key).is_none());
    }

    #[test]
    fn an_evicted_trace_loses_its_exemplars() {
        let s = ExemplarStore::default();
        let (t1, s1) = ids(1);
        let (t2, s2) = ids(2);
        let gaps = [20, 300].map(Duration::from_millis).into_iter();
        let ttft = Some(Duration::from_millis(50));
        s.offer_request(
            &attrs(),
            KeptRequest {
                trace_id: t1,
                span_id: s1,
                end: at(1),
                e2e: Duration::from_millis(400),
                ttft,
            },
            gaps,
        );
        let none = std::iter::empty();
        s.offer_request(
            &attrs(),
            KeptRequest {
                trace_id: t2,
                span_id: s2,
                end: at(2),
                e2e: Duration::from_secs(3),
                ttft: None,
            },
            none,
        );
        s.offer_counter(DIAGNOSIS_CONFIRMED_FAMILY, &attrs(), t1, s1, at(1), 1.0);
        s.forget_trace(t1);
        let key = series_key(&attrs());
        for (_, family, _) in HISTOGRAMS {
            let left: Vec<TraceId> = s
                .for_series(family, &key)
                .unwrap_or_default()
                .into_iter()
                .flatten()
                .map(|e| e.trace_id)
                .collect();
            let want = if family.ends_with("duration_seconds") {
                vec![t2]
            } else {
                vec![]
            };
            assert_eq!(left, want, "{family}");
        }
        assert_eq!(s.for_counter(DIAGNOSIS_CONFIRMED_FAMILY, &key), None);
    }

    #[test]
    fn series_are_bounded() {
        let s = ExemplarStore::default();
        let (t, sp) = ids(1);
        for i in 0..MAX_SERIES + 3 {
            let a = [KeyValue::new("lmperf.target", i.to_string())];
            s.offer_request(
                &a,
                KeptRequest {
                    trace_id: t,
                    span_id: sp,
                    end: at(1),
                    e2e: Duration::from_millis(5),
                    ttft: None,
                },
                std::iter::empty(),
            );
        }
        assert_eq!(s.series_refused(), 3);
    }
}
