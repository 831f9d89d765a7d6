//! Arrivals read from the queue, on a server without a request counter (issue 28): llama.cpp
//! exports no requests/s, and a saturated server admits no more prompt tokens/s than before, so
//! a surge shows no more arrivals on its counters. The work offered is the work served plus
//! the backlog's growth (arrivals ≈ admissions + dQ/dt): a queue (`requests_waiting`, llama.cpp's
//! `requests_deferred`) that grew while the server's throughput held (generated and prompt
//! tokens/s not falling) means more arrived than it serves at its old pace. A server that merely
//! got slower queues with its throughput falling: its admissions fell, the arrivals did not rise.
//!
//! llama.cpp counts a request's tokens when it ends (its token rates are zeros and bursts), so
//! throughput is compared over windows of at least [`MIN_SPAN_S`], never per scrape.
//!
//! Pure: the caller passes the seconds.

use super::report::Evidence;
use super::signal::Signal;
use super::store::EvidenceStore;

/// Seconds the queue's rise is looked for before the onset (the symptom may be another
/// fault's, found later: errors that reach the detector before the queued canaries end).
pub const LOOKBACK_S: u32 = 60;
/// The window since the queue rose must span this many seconds: token counters that count a
/// request at its end need a few completions in it.
pub const MIN_SPAN_S: u32 = 20;
/// Requests the queue must have grown by over its baseline (and over its ordinary high).
pub const MIN_GROWTH: f64 = 2.0;
/// Throughput holds when the generated tokens/s and the whole token throughput (prompt and
/// generated) since the queue rose are at least this share of their level over the 5 min
/// before (a server that got slower serves less).
pub const THROUGHPUT_HELD: f64 = 0.95;
/// Batches (requests running) the queue must hold over the window, at least.
pub const BATCHES_WAITING: f64 = 2.0;
/// The recent seconds whose median is the queue's present level.
const RECENT_S: u32 = 10;
/// Baseline seconds.
const BASELINE_S: u32 = 300;
/// Seconds before the rise excluded from the baseline.
const GUARD_S: u32 = 5;

/// More work arriving than the server serves: its queue grew while its throughput held.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    /// Unix second the queue rose (the window's start).
    pub since: u32,
    /// Requests waiting: the baseline median, the recent median, the peak.
    pub waiting_before: f64,
    pub waiting_now: f64,
    pub waiting_peak: f64,
    /// Generated tokens/s, mean before and since (when exported).
    pub generation: Option<(f64, f64)>,
    /// Prompt tokens/s, mean before and since (when exported).
    pub prompt: Option<(f64, f64)>,
}

fn values(store: &EvidenceStore, s: Signal, from: u32, to: u32) -> Vec<(u32, f64)> {
    store
        .series(s)
        .map(|x| x.range(from, to).collect())
        .unwrap_or_default()
}

fn median_of(v: &[(u32, f64)]) -> Option<f64> {
    let mut x: Vec<f64> = v.iter().map(|p| p.1).collect();
    super::detector::median(&mut x)
}

/// A rate counted at a request's end (llama.cpp's token counters: zeros, then a request's
/// tokens at once) over `[since, to)`: the tokens counted up to the last second that counted
/// any, over the seconds from `since` to it (the work of a request in progress at `since`,
/// counted in the window, stands for that of one in progress at the end, not yet counted);
/// the window's mean when that span is shorter than half [`MIN_SPAN_S`] (0 when nothing was
/// counted: nothing completed). `None` without a sample.
fn rate_since(v: &[(u32, f64)], since: u32, to: u32) -> Option<f64> {
    v.first()?;
    let sum: f64 = v.iter().map(|p| p.1).sum();
    let last = v.iter().rev().find(|p| p.1 > 0.0).map(|p| p.0);
    let span = last.map_or(0, |l| l + 1 - since.min(l));
    Some(if span >= MIN_SPAN_S / 2 {
        sum / f64::from(span)
    } else {
        sum / f64::from(to.saturating_sub(since).max(1))
    })
}

/// The 10 s blocks of `v` (time-sorted) from `from`, each `f` of its values when it holds half
/// its seconds. One pass.
fn blocks(v: &[(u32, f64)], from: u32, f: impl Fn(&mut Vec<f64>) -> Option<f64>) -> Vec<f64> {
    let mut out = Vec::new();
    let mut cur: Option<u32> = None;
    let mut block: Vec<f64> = Vec::new();
    let mut close = |block: &mut Vec<f64>| {
        if 2 * block.len() >= RECENT_S as usize
            && let Some(m) = f(block)
        {
            out.push(m);
        }
        block.clear();
    };
    for &(t, x) in v.iter().filter(|p| p.0 >= from) {
        let k = (t - from) / RECENT_S;
        if cur != Some(k) {
            close(&mut block);
            cur = Some(k);
        }
        block.push(x);
    }
    close(&mut block);
    out
}

/// The level of a rate over a baseline: the mean of its 10 s block means less the highest and
/// lowest fifth of them (a warm-up burst at the agent's start is no level, and a rate counted
/// at a request's end alternates between empty and full blocks); `None` with fewer than 3
/// blocks.
fn block_level(v: &[(u32, f64)]) -> Option<f64> {
    let mut means = blocks(v, v.first()?.0, |b| {
        (!b.is_empty()).then(|| b.iter().sum::<f64>() / b.len() as f64)
    });
    if means.len() < 3 {
        return None;
    }
    means.sort_by(f64::total_cmp);
    let cut = means.len() / 5;
    let kept = &means[cut..means.len() - cut];
    Some(kept.iter().sum::<f64>() / kept.len() as f64)
}

/// The highest median of the 10 s blocks of `v` (a busy server's queue is empty most seconds
/// and holds a few requests now and then: its ordinary high); `None` with fewer than 6 blocks.
fn ordinary_high(v: &[(u32, f64)]) -> Option<f64> {
    let medians = blocks(v, v.first()?.0, |b| super::detector::median(b));
    (medians.len() >= 6).then(|| medians.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

/// Whether the server's queue outgrew its service since `onset` (or since the queue rose, up
/// to [`LOOKBACK_S`] before it): only on a server without a request counter (one with it
/// says its arrivals directly), with the queue up by [`MIN_GROWTH`] over its baseline and
/// its ordinary high, its window at least [`MIN_SPAN_S`] long, and its generated and total
/// token throughput holding ([`THROUGHPUT_HELD`]). `None` otherwise, or without the signals.
pub fn outgrows_service(store: &EvidenceStore, onset: u32, now: u32) -> Option<Backlog> {
    if store.series(Signal::ServerRequestRate).is_some() {
        return None;
    }
    let to = now.saturating_add(1);
    let waiting = values(
        store,
        Signal::ServerRequestsWaiting,
        onset.saturating_sub(LOOKBACK_S + BASELINE_S),
        to,
    );
    let base_to = onset.saturating_sub(GUARD_S);
    let baseline: Vec<(u32, f64)> = waiting
        .iter()
        .copied()
        .filter(|p| p.0 >= onset.saturating_sub(BASELINE_S) && p.0 < base_to)
        .collect();
    let before = median_of(&baseline)?;
    let risen = |v: f64| v >= before + MIN_GROWTH;
    // The queue's rise: the first second from the onset on that it was up (a queue that
    // rose 15 s after a latency blip's onset did not rise at the onset), back through the
    // seconds it was already up.
    let first = waiting.iter().find(|p| p.0 >= onset && risen(p.1))?.0;
    let mut since = first;
    for &(t, v) in waiting
        .iter()
        .rev()
        .filter(|p| p.0 < first && p.0 >= onset.saturating_sub(LOOKBACK_S))
    {
        if !risen(v) {
            break;
        }
        since = t;
    }
    if to.saturating_sub(since) < MIN_SPAN_S {
        return None;
    }
    // The baseline before the rise.
    let base: Vec<(u32, f64)> = waiting
        .iter()
        .copied()
        .filter(|p| p.0 >= since.saturating_sub(BASELINE_S) && p.0 < since.saturating_sub(GUARD_S))
        .collect();
    let before = median_of(&base)?;
    let high = ordinary_high(&base).unwrap_or(before).max(before);
    let during: Vec<(u32, f64)> = waiting.iter().copied().filter(|p| p.0 >= since).collect();
    let recent: Vec<(u32, f64)> = during
        .iter()
        .copied()
        .filter(|p| p.0 >= to.saturating_sub(RECENT_S))
        .collect();
    let (level, now_level) = (median_of(&during)?, median_of(&recent)?);
    // Both the whole window's level and the recent one beyond the ordinary high: a Poisson
    // burst of a busy server's ordinary traffic fills its queue for a block, not for the
    // window.
    if level < high + MIN_GROWTH || now_level < high + MIN_GROWTH {
        return None;
    }
    // And beyond what the batch turns over: at least [`BATCHES_WAITING`] full batches wait
    // (every request waits two service times). A busy server's burst fills a queue about as
    // deep as its batch for a few seconds; a surge piles up batches.
    let running = values(store, Signal::ServerRequestsRunning, since, to);
    if let Some(batch) = median_of(&running)
        && level < BATCHES_WAITING * batch
    {
        return None;
    }
    let peak = during.iter().map(|p| p.1).fold(0.0, f64::max);
    // Throughput: the token rates (counted at a request's end) as means over windows; the
    // level before is the median of its 10 s block means (a warm-up burst at the agent's
    // start is no level).
    let rate = |s: Signal| -> Option<(f64, f64)> {
        let b = values(
            store,
            s,
            since.saturating_sub(BASELINE_S),
            since.saturating_sub(GUARD_S),
        );
        let a = values(store, s, since, to);
        Some((block_level(&b)?, rate_since(&a, since, to)?))
    };
    let generation = rate(Signal::ServerGenerationTokensRate);
    let prompt = rate(Signal::ServerPromptTokensRate);
    // The decode's throughput must hold (a slower decode serves fewer tokens), and so must the
    // server's whole token throughput (prompt and generated: a slower prefill admits fewer).
    let held = |x: (f64, f64)| x.0 > 0.0 && x.1 >= THROUGHPUT_HELD * x.0;
    let total = [generation, prompt]
        .into_iter()
        .flatten()
        .fold(None, |acc: Option<(f64, f64)>, (b, a)| {
            Some(acc.map_or((b, a), |(x, y)| (x + b, y + a)))
        })?;
    if !held(total) || generation.is_some_and(|g| !held(g)) {
        return None;
    }
    Some(Backlog {
        since,
        waiting_before: before,
        waiting_now: now_level,
        waiting_peak: peak,
        generation,
        prompt,
    })
}

impl Backlog {
    /// The evidence of a load surge: the queue, with the throughput that held in its rule.
    pub fn evidence(&self, onset: u32) -> Evidence {
        let rate = |name: &str, x: Option<(f64, f64)>| {
            x.map(|(b, a)| format!(", {name} {b:.1} → {a:.1}/s"))
                .unwrap_or_default()
        };
        Evidence {
            signal: Signal::ServerRequestsWaiting,
            before: self.waiting_before,
            after: self.waiting_now,
            peak: self.waiting_peak,
            z: 0.0,
            changed_at_unix_s: Some(f64::from(self.since)),
            lead_s: Some(f64::from(onset) - f64::from(self.since)),
            rule: Some(format!(
                "requests waiting {:.0} → {:.0} while the server's throughput held (tokens/s not falling{}{}): more work arrived than it serves (arrivals ≈ admissions + queue growth; the server counts no requests)",
                self.waiting_before,
                self.waiting_now,
                rate("generated", self.generation),
                rate("prompt", self.prompt),
            )),
            hw_ids: Vec::new(),
            source: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detector::DetectorConfig;

    const T0: u32 = 1_700_000_000;
    const ONSET: u32 = T0 + 400;

    /// A llama.cpp-like server (no request counter): 1 s scrapes from T0 to `end`, with
    /// `after(s)` = (waiting, generated tokens/s, prompt tokens/s) from the onset on; calm:
    /// (0, 4, 5). Token rates count at a request's end: from the onset, bursts every `period`
    /// seconds.
    fn store(end: u32, period: u32, after: impl Fn(u32) -> (f64, f64, f64)) -> EvidenceStore {
        let mut s = EvidenceStore::new(DetectorConfig::default(), DetectorConfig::default());
        for t in T0..end {
            let (w, g, p) = if t >= ONSET {
                after(t)
            } else {
                (0.0, 4.0, 5.0)
            };
            // Calm: a canary ends every second.
            let period = if t >= ONSET { period } else { 1 };
            let burst = |rate: f64| {
                if (t - T0).is_multiple_of(period) {
                    rate * f64::from(period)
                } else {
                    0.0
                }
            };
            let at = std::time::Duration::from_secs(u64::from(t));
            s.observe(Signal::ServerRequestsWaiting, at, w);
            s.observe(Signal::ServerGenerationTokensRate, at, burst(g));
            s.observe(Signal::ServerPromptTokensRate, at, burst(p));
            s.roll(t + 1);
        }
        s
    }

    #[test]
    fn a_queue_that_grows_while_throughput_holds_is_more_arrivals() {
        // A surge on a saturated server: the queue climbs one a second, the batch generates a
        // little more (bursts of 96 tokens every 16 s), the prompts admitted as before.
        let s = store(ONSET + 40, 16, |t| {
            (f64::from((t - ONSET).min(16)), 6.0, 5.0)
        });
        let b = outgrows_service(&s, ONSET, ONSET + 35).expect("more arrivals");
        // Dated where the queue rose (by 2 over its baseline), not at the onset passed.
        assert_eq!(b.since, ONSET + 2);
        assert_eq!(b.waiting_before, 0.0);
        assert!(b.waiting_now >= 14.0, "{b:?}");
        let (gb, ga) = b.generation.unwrap();
        assert!((3.9..4.1).contains(&gb) && ga >= 5.0, "{b:?}");
        let e = b.evidence(ONSET + 20);
        assert_eq!(e.lead_s, Some(18.0));
        assert!(e.rule.unwrap().contains("throughput held"));
        // Too soon: the token counters have not counted a completion of the window yet.
        assert_eq!(outgrows_service(&s, ONSET, ONSET + 10), None);
        // The symptom found 30 s later (another fault's): the rise is looked for before it.
        let late = outgrows_service(&s, ONSET + 30, ONSET + 39).expect("rise found before");
        assert_eq!(late.since, ONSET + 2);
        // A latency blip's onset 15 s before the surge: the rise is where the queue rose, not
        // the onset passed (it read "changed 15 s before the fault").
        let early = outgrows_service(&s, ONSET - 15, ONSET + 35).expect("rise found after");
        assert_eq!(early.since, ONSET + 2);
    }

    #[test]
    fn a_slower_server_queues_with_its_throughput_falling() {
        // The same queue, the server a third as fast: it generates and admits less.
        let s = store(ONSET + 40, 4, |t| {
            (f64::from((t - ONSET).min(16)), 4.0 / 3.0, 5.0 / 3.0)
        });
        assert_eq!(outgrows_service(&s, ONSET, ONSET + 35), None);
        // Generation held but admissions fell: still slower.
        let s = store(ONSET + 40, 4, |t| {
            (f64::from((t - ONSET).min(16)), 4.0, 2.0)
        });
        assert_eq!(outgrows_service(&s, ONSET, ONSET + 35), None);
    }

    #[test]
    fn a_queue_within_its_ordinary_high_or_a_request_counter_says_nothing() {
        // The throughput held but the queue reached only 1.
        let s = store(ONSET + 40, 4, |_| (1.0, 4.0, 5.0));
        assert_eq!(outgrows_service(&s, ONSET, ONSET + 35), None);
        // A queue no deeper than its batch (4 running, 5 waiting): a burst the batch absorbs.
        let mut s = store(ONSET + 40, 4, |_| (5.0, 6.0, 5.0));
        for t in T0..ONSET + 40 {
            s.observe(
                Signal::ServerRequestsRunning,
                std::time::Duration::from_secs(u64::from(t)),
                4.0,
            );
            s.roll(t + 1);
        }
        assert_eq!(outgrows_service(&s, ONSET, ONSET + 35), None);
        // A server with a request counter reports its arrivals itself.
        let mut s = store(ONSET + 40, 4, |t| {
            (f64::from((t - ONSET).min(16)), 6.0, 5.0)
        });
        s.observe(
            Signal::ServerRequestRate,
            std::time::Duration::from_secs(u64::from(ONSET + 39)),
            1.0,
        );
        assert_eq!(outgrows_service(&s, ONSET, ONSET + 39), None);
    }
}
