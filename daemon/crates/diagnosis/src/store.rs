//! The evidence store of one target: every signal at 1 s resolution (or the scrape's, when
//! coarser) for the last 30 min, plus the 10 s symptom buckets of the shared detector.
//!
//! Memory: a second is 8 bytes (`u32` Unix second, `f32` value); a signal holds at most
//! [`SECONDS`] of them (a `VecDeque` of 2,048 slots: 16 KiB), so at most about 460 KB per target
//! with all 29 signals. Measured (`cargo bench -p lmperf --bench diagnosis_cost`): 363 KB per
//! target fed canaries, GPU and 11 server signals for 30 min.

use std::collections::VecDeque;
use std::time::Duration;

use super::detector::{Aggregate, BucketSeries, DetectorConfig};
use super::signal::Signal;

/// Seconds of evidence kept per signal (30 min).
pub const SECONDS: usize = 1800;

/// One signal at 1 s resolution: one value per second with data.
#[derive(Debug, Clone)]
pub struct SecondSeries {
    aggregate: Aggregate,
    values: VecDeque<(u32, f32)>,
    current: Option<u32>,
    sum: f64,
    max: f64,
    count: u32,
}

impl SecondSeries {
    pub fn new(aggregate: Aggregate) -> Self {
        Self {
            aggregate,
            values: VecDeque::new(),
            current: None,
            sum: 0.0,
            max: f64::NEG_INFINITY,
            count: 0,
        }
    }

    /// Adds a sample at Unix second `sec` (late samples go into the second in progress).
    pub fn push(&mut self, sec: u32, v: f64) {
        if !v.is_finite() {
            return;
        }
        if let Some(cur) = self.current
            && sec > cur
        {
            self.close();
        }
        if self.current.is_none() {
            self.current = Some(sec);
        }
        self.sum += v;
        self.max = self.max.max(v);
        self.count += 1;
    }

    fn close(&mut self) {
        if let Some(cur) = self.current.take()
            && self.count > 0
        {
            // Within a second a P99 is the maximum (a handful of samples at most).
            let v = match self.aggregate {
                Aggregate::P99 | Aggregate::Max => self.max,
                Aggregate::Mean => self.sum / f64::from(self.count),
                Aggregate::Sum => self.sum,
            };
            if self.values.len() == SECONDS {
                self.values.pop_front();
            }
            self.values.push_back((cur, v as f32));
        }
        self.sum = 0.0;
        self.max = f64::NEG_INFINITY;
        self.count = 0;
    }

    /// Closes the second in progress once `now_sec` is past it, and forgets seconds older than
    /// 30 min.
    pub fn roll(&mut self, now_sec: u32) {
        if self.current.is_some_and(|c| now_sec > c) {
            self.close();
        }
        let from = now_sec.saturating_sub(SECONDS as u32);
        while self.values.front().is_some_and(|&(s, _)| s < from) {
            self.values.pop_front();
        }
    }

    /// Values of the seconds in `[from, to)`, oldest first.
    pub fn range(&self, from: u32, to: u32) -> impl Iterator<Item = (u32, f64)> + '_ {
        let start = self.values.partition_point(|&(s, _)| s < from);
        self.values
            .range(start..)
            .take_while(move |&&(s, _)| s < to)
            .map(|&(s, v)| (s, f64::from(v)))
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty() && self.current.is_none()
    }

    pub fn heap_bytes(&self) -> usize {
        self.values.capacity() * std::mem::size_of::<(u32, f32)>()
    }
}

/// Everything known about one target.
#[derive(Debug, Clone)]
pub struct EvidenceStore {
    /// One 1 s series per [`Signal`], created at its first sample.
    pub seconds: Vec<Option<SecondSeries>>,
    /// The 10 s symptom buckets (TTFT, TPOT, E2E p99, error ratio): the shared detector.
    pub ttft: BucketSeries,
    pub tpot: BucketSeries,
    pub e2e: BucketSeries,
    pub errors: BucketSeries,
    /// The newest second seen.
    pub last_sec: u32,
    /// The token rates of the scrape in progress (its second, prompt, generated), paired into
    /// [`Signal::ServerPromptRatio`] once both arrived.
    rates_pending: Option<(u32, Option<f64>, Option<f64>)>,
    /// The paired rates of the last [`PROMPT_RATIO_WINDOW_S`] seconds.
    rates: VecDeque<(u32, f64, f64)>,
    /// What the caller said of an event (its second, its signal, the words): the reason
    /// Kubernetes gave for a kill (`OOMKilled (exit 137)`), newest last, at most [`MAX_NOTES`].
    notes: VecDeque<(u32, Signal, String)>,
    /// Where each signal's latest values came from, as the caller said ([`Self::set_source`]):
    /// e.g. `vllm_metrics (per request)` or `/metrics (histogram mean per scrape)`.
    sources: Vec<Option<&'static str>>,
}

/// Event notes kept per target ([`EvidenceStore::note`]); the oldest is dropped beyond it.
pub const MAX_NOTES: usize = 16;

/// Characters of a note kept (a longer one is cut: a note is a reason, not a log).
pub const MAX_NOTE_CHARS: usize = 120;

/// The window of [`Signal::ServerPromptRatio`]: prompt tokens ÷ generated tokens over this many
/// seconds of scrapes (llama.cpp counts a prompt's tokens when its prefill ends, so one second
/// holds a whole long prompt and the next none).
pub const PROMPT_RATIO_WINDOW_S: u32 = 10;

impl EvidenceStore {
    /// `detector` for the latency buckets, `ratio_detector` for the error ratio's.
    pub fn new(detector: DetectorConfig, ratio_detector: DetectorConfig) -> Self {
        Self {
            seconds: vec![None; Signal::ALL.len()],
            ttft: BucketSeries::new(detector, Aggregate::P99),
            tpot: BucketSeries::new(detector, Aggregate::P99),
            e2e: BucketSeries::new(detector, Aggregate::P99),
            errors: BucketSeries::new(ratio_detector, Aggregate::Mean),
            last_sec: 0,
            rates_pending: None,
            rates: VecDeque::new(),
            notes: VecDeque::new(),
            sources: vec![None; Signal::ALL.len()],
        }
    }

    /// Says where `signal`'s values come from now (the evidence names it).
    pub fn set_source(&mut self, signal: Signal, source: &'static str) {
        if let Some(slot) = self.sources.get_mut(signal.index()) {
            *slot = Some(source);
        }
    }

    /// Where `signal`'s values came from, where the caller said.
    pub fn source(&self, signal: Signal) -> Option<&'static str> {
        self.sources.get(signal.index()).copied().flatten()
    }

    /// Notes the words of an event of `signal` at `at` (since the Unix epoch): why it happened,
    /// as its source said (`OOMKilled (exit 137)`). Cut to [`MAX_NOTE_CHARS`]; at most
    /// [`MAX_NOTES`] are kept, and none older than the store's 30 min.
    pub fn note(&mut self, signal: Signal, at: Duration, words: &str) {
        let sec = u32::try_from(at.as_secs()).unwrap_or(u32::MAX);
        let words: String = words.chars().take(MAX_NOTE_CHARS).collect();
        if words.is_empty() {
            return;
        }
        if self.notes.len() == MAX_NOTES {
            self.notes.pop_front();
        }
        self.notes.push_back((sec, signal, words));
    }

    /// The newest note of `signal` in the seconds `[from, to)`.
    pub fn note_in(&self, signal: Signal, from: u32, to: u32) -> Option<&str> {
        self.notes
            .iter()
            .rev()
            .find(|(t, s, _)| *s == signal && (from..to).contains(t))
            .map(|(_, _, w)| w.as_str())
    }

    /// Adds a sample of `signal` at `at` (since the Unix epoch).
    pub fn observe(&mut self, signal: Signal, at: Duration, value: f64) {
        let sec = u32::try_from(at.as_secs()).unwrap_or(u32::MAX);
        self.last_sec = self.last_sec.max(sec);
        self.seconds[signal.index()]
            .get_or_insert_with(|| SecondSeries::new(signal.aggregate()))
            .push(sec, value);
        match signal {
            Signal::Ttft => self.ttft.push(at, value),
            Signal::Tpot => self.tpot.push(at, value),
            Signal::E2e => self.e2e.push(at, value),
            Signal::Error => self.errors.push(at, value),
            Signal::ServerPromptTokensRate | Signal::ServerGenerationTokensRate => {
                self.pair_rates(signal, sec, value);
            }
            _ => {}
        }
    }

    /// Pairs the prompt and generation token rates of one scrape (same second, any order) and
    /// derives [`Signal::ServerPromptRatio`] over the window: Σ prompt ÷ max(Σ generated, 1);
    /// nothing while the server processed no token at all.
    fn pair_rates(&mut self, signal: Signal, sec: u32, value: f64) {
        if !value.is_finite() {
            return;
        }
        let (mut p, mut g) = match self.rates_pending {
            Some((s, p, g)) if s == sec => (p, g),
            _ => (None, None),
        };
        if signal == Signal::ServerPromptTokensRate {
            p = Some(value);
        } else {
            g = Some(value);
        }
        let (Some(p), Some(g)) = (p, g) else {
            self.rates_pending = Some((sec, p, g));
            return;
        };
        self.rates_pending = None;
        self.rates.push_back((sec, p, g));
        while self
            .rates
            .front()
            .is_some_and(|&(s, _, _)| s + PROMPT_RATIO_WINDOW_S <= sec)
        {
            self.rates.pop_front();
        }
        let (ps, gs) = self
            .rates
            .iter()
            .fold((0.0, 0.0), |(a, b), &(_, p, g)| (a + p, b + g));
        if ps + gs > 0.0 {
            let ratio = Signal::ServerPromptRatio;
            self.seconds[ratio.index()]
                .get_or_insert_with(|| SecondSeries::new(ratio.aggregate()))
                .push(sec, ps / gs.max(1.0));
        }
    }

    /// Closes the seconds before `now_sec` of every signal.
    pub fn roll(&mut self, now_sec: u32) {
        for s in self.seconds.iter_mut().flatten() {
            s.roll(now_sec);
        }
        let from = now_sec.saturating_sub(SECONDS as u32);
        while self.notes.front().is_some_and(|n| n.0 < from) {
            self.notes.pop_front();
        }
    }

    pub fn series(&self, signal: Signal) -> Option<&SecondSeries> {
        self.seconds[signal.index()].as_ref()
    }

    /// Heap bytes held by the store.
    pub fn heap_bytes(&self) -> usize {
        let seconds: usize = self
            .seconds
            .iter()
            .flatten()
            .map(SecondSeries::heap_bytes)
            .sum();
        seconds
            + self.seconds.capacity() * std::mem::size_of::<Option<SecondSeries>>()
            + [&self.ttft, &self.tpot, &self.e2e, &self.errors]
                .iter()
                .map(|b| b.heap_bytes())
                .sum::<usize>()
            + self.notes.iter().map(|n| n.2.capacity()).sum::<usize>()
            + self.notes.capacity() * std::mem::size_of::<(u32, Signal, String)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_aggregate_and_stay_bounded() {
        let mut s = SecondSeries::new(Aggregate::Mean);
        s.push(100, 1.0);
        s.push(100, 3.0);
        s.push(101, 5.0);
        s.roll(102);
        assert_eq!(
            s.range(0, u32::MAX).collect::<Vec<_>>(),
            [(100, 2.0), (101, 5.0)]
        );
        assert_eq!(s.range(101, 102).collect::<Vec<_>>(), [(101, 5.0)]);
        for sec in 0..10_000 {
            s.push(1000 + sec, 1.0);
        }
        s.roll(11_000);
        assert_eq!(s.range(0, u32::MAX).count(), SECONDS);
        assert!(s.heap_bytes() <= 2 * SECONDS * 8, "{}", s.heap_bytes());
    }

    #[test]
    fn notes_are_bounded_cut_and_found_by_signal_and_time() {
        let cfg = DetectorConfig::default();
        let mut st = EvidenceStore::new(cfg, cfg);
        let at = |s: u64| Duration::from_secs(s);
        st.note(Signal::CgroupOomKill, at(1000), "OOMKilled (exit 137)");
        st.note(
            Signal::ServerChange,
            at(1001),
            "restarts 1 after OOMKilled (exit 137)",
        );
        st.note(Signal::CgroupOomKill, at(1002), "");
        assert_eq!(
            st.note_in(Signal::CgroupOomKill, 990, 1010),
            Some("OOMKilled (exit 137)")
        );
        assert_eq!(st.note_in(Signal::CgroupOomKill, 1001, 1010), None);
        st.note(Signal::GpuFault, at(1003), &"x".repeat(500));
        assert_eq!(
            st.note_in(Signal::GpuFault, 0, u32::MAX).map(str::len),
            Some(MAX_NOTE_CHARS)
        );
        for k in 0..40 {
            st.note(Signal::GpuFault, at(1100 + k), "XID 79");
        }
        assert_eq!(st.notes.len(), MAX_NOTES);
        // Older than the store's 30 min: forgotten.
        st.roll(1100 + 39 + SECONDS as u32 + 1);
        assert!(st.notes.is_empty());
    }
}
