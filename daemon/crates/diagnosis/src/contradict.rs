//! What the server's own signals say against a cause: arrivals (not occupancy) for a load
//! surge, the queue for server queueing. A cause its server contradicts scores below 0.5
//! ([`CONTRADICTED_CAP`]) whatever else moved.
//!
//! - `load_surge` is more work **arriving**: the server's request counter or its prompt token
//!   rate up, beyond how much a window of that length ordinarily wanders. Requests running (occupancy) rise as much when the server only
//!   got slower (Little's law: L = λ W, and W grew): a KV squeeze, longer prefills, a slower
//!   decode. Without an arrival rise a load surge is contradicted.
//! - `server_queueing` is requests **waiting** behind a server that got slower: when every
//!   scrape since the onset saw an empty queue (a server refusing everything with 503 queues
//!   nothing), or the batch generated more tokens/s while they waited (a half-busy server's
//!   ordinary congestion, or a surge: queued behind more work), or requests waited only
//!   behind the server's ordinary full batch at its ordinary decode speed ([`full_batch`]: a
//!   busy server with few slots queues whenever they are all held), it is contradicted.
//!
//! - `router_overhead` is the router's own time: when the direct canaries to its workers
//!   slowed as well, the workers did, and the routed − direct difference only lagged
//!   ([`workers_slowed`]); when one worker answered its direct canaries at twice the others'
//!   time or failed them, the routed canaries it serves make the difference
//!   ([`one_worker_apart`]).
//! - `long_prompts` is more prompt tokens per request: when every measure of the prompts'
//!   length held, it is contradicted ([`prompts_held`]).
//! - `prefill_saturation` and `decode_saturation` are one pool short of capacity: when the
//!   other pool's load rose as well, more work came to both or both got slower
//!   ([`other_pool_rose`]).
//!
//! Pure: the caller passes the seconds.

use super::report::Cause;
use super::signal::Signal;
use super::store::EvidenceStore;

/// The highest score a contradicted cause keeps.
pub const CONTRADICTED_CAP: f64 = 0.45;

/// Arrival signals: more of them is more work at the server. The generated tokens/s are not
/// among them: they are the batch's throughput, which rises with the occupancy whenever the
/// batch has room (a random burst of long answers doubles it with no more requests arriving),
/// and falls when the server only got slower.
pub const ARRIVALS: [Signal; 2] = [Signal::ServerRequestRate, Signal::ServerPromptTokensRate];

/// The mean of `s` over `[from, to)`, `None` without a sample.
fn mean_in(store: &EvidenceStore, s: Signal, from: u32, to: u32) -> Option<f64> {
    let (n, sum) = store
        .series(s)?
        .range(from, to)
        .fold((0usize, 0.0), |(n, sum), (_, v)| (n + 1, sum + v));
    (n > 0).then(|| sum / n as f64)
}

/// How many robust standard deviations of the ordinary variation of a window's mean a rise
/// must be: a Poisson stream's own 20 s bursts are one or two, a surge is many.
const RISE_SD: f64 = 3.0;

/// The block the level and spread of an arrival signal are measured in (one symptom bucket).
const BLOCK_S: u32 = 10;

/// The ordinary level and spread of `s` over `[from, to)` for a window of `len` seconds: the
/// median of its 10 s block means (robust to a warm-up burst at the agent's start) and
/// 1.4826 · MAD of them ÷ √(len ÷ 10) (the spread of a window's mean). `None` with fewer
/// than 3 blocks.
fn level_and_spread(
    store: &EvidenceStore,
    s: Signal,
    from: u32,
    to: u32,
    len: u32,
) -> Option<(f64, f64)> {
    let mut means = Vec::new();
    let mut start = from;
    while start.saturating_add(BLOCK_S) <= to {
        if let Some(m) = mean_in(store, s, start, start + BLOCK_S) {
            means.push(m);
        }
        start += BLOCK_S;
    }
    if means.len() < 3 {
        return None;
    }
    let b = super::detector::Baseline::of(&mut means)?;
    let blocks = (f64::from(len) / f64::from(BLOCK_S)).max(1.0);
    Some((b.median, 1.4826 * b.mad / blocks.sqrt()))
}

/// What the arrivals did since `onset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrivals {
    /// An arrival signal's mean rose ≥ 1.25 × and by its floor, or doubled (a small server's
    /// rates sit below the floors, which are a vLLM's), and by [`RISE_SD`] times the ordinary
    /// spread of a window's mean (a random burst of ordinary traffic is not a surge).
    Rose,
    /// Every arrival signal's mean stayed below 1.1 × its mean before: no more work came.
    Flat,
    /// Neither (a bursty counter, a small rise).
    Unclear,
}

/// The arrivals since `onset`: each arrival signal's mean after the onset against its level
/// over the 5 min before ([`level_and_spread`]; means of seconds: llama.cpp counts a request's
/// tokens when it ends, so its seconds are bursts and zeros). `None` when the server exports none of them (the canary alone cannot
/// tell).
pub fn arrivals(store: &EvidenceStore, onset: u32, now: u32) -> Option<Arrivals> {
    // Without a request counter a saturated server admits no more than before: its queue
    // says what arrived ([`super::backlog`]).
    if super::backlog::outgrows_service(store, onset, now).is_some() {
        return Some(Arrivals::Rose);
    }
    let mut seen = false;
    let mut flat = true;
    for s in ARRIVALS {
        let (from, to) = (onset.saturating_sub(300), onset.saturating_sub(5));
        let len = now.saturating_add(1).saturating_sub(onset);
        let (Some((before, spread)), Some(after)) = (
            level_and_spread(store, s, from, to, len),
            mean_in(store, s, onset, now.saturating_add(1)),
        ) else {
            continue;
        };
        seen = true;
        let significant = after - before >= RISE_SD * spread;
        let ratio = if before > 0.0 {
            after / before
        } else if after > 0.0 {
            f64::INFINITY
        } else {
            1.0
        };
        if ratio >= 1.25 && (after - before >= s.floor() || ratio >= 2.0) && significant {
            return Some(Arrivals::Rose);
        }
        if ratio >= 1.1 {
            flat = false;
        }
    }
    seen.then_some(if flat {
        Arrivals::Flat
    } else {
        Arrivals::Unclear
    })
}

/// Whether the batch's throughput (generated tokens/s) was up while requests waited: its mean
/// over the scrapes since `onset` that saw a request waiting (all scrapes since the onset when
/// none did) against its level over the 5 min before, ≥ 1.1 × and [`RISE_SD`] spreads of a
/// window that long. Requests that wait while the server generates more are queued behind more
/// work (a full batch), not behind a server that got slower. `false` without the signal.
pub fn throughput_rose(store: &EvidenceStore, onset: u32, now: u32) -> bool {
    let s = Signal::ServerGenerationTokensRate;
    let Some(gen_series) = store.series(s) else {
        return false;
    };
    let to = now.saturating_add(1);
    let waiting: Vec<u32> = store
        .series(Signal::ServerRequestsWaiting)
        .map(|w| {
            w.range(onset, to)
                .filter(|&(_, v)| v >= 1.0)
                .map(|(t, _)| t)
                .collect()
        })
        .unwrap_or_default();
    let during: Vec<f64> = gen_series
        .range(onset, to)
        .filter(|(t, _)| waiting.is_empty() || waiting.contains(t))
        .map(|(_, v)| v)
        .collect();
    if during.is_empty() {
        return false;
    }
    let after = during.iter().sum::<f64>() / during.len() as f64;
    let len = u32::try_from(during.len()).unwrap_or(u32::MAX);
    let Some((before, spread)) = level_and_spread(
        store,
        s,
        onset.saturating_sub(300),
        onset.saturating_sub(5),
        len,
    ) else {
        return false;
    };
    after >= 1.1 * before && after - before >= RISE_SD * spread
}

/// Whether arrivals rose since `onset` (`None` without arrival signals).
pub fn arrivals_rose(store: &EvidenceStore, onset: u32, now: u32) -> Option<bool> {
    arrivals(store, onset, now).map(|a| a == Arrivals::Rose)
}

/// Why the server contradicts `cause` since `onset`, in words; `None` when it does not (or
/// cannot tell).
pub fn contradiction(cause: Cause, store: &EvidenceStore, onset: u32, now: u32) -> Option<String> {
    match cause {
        Cause::LoadSurge => (arrivals(store, onset, now) == Some(Arrivals::Flat)).then(|| {
            "no more arrivals (server requests/s and prompt tokens/s flat): the server got slower, not busier".to_owned()
        }),
        Cause::ServerQueueing => {
            if throughput_rose(store, onset, now) {
                return Some(
                    "the batch generated more tokens/s while requests waited: queued behind more work, not behind a slower server".to_owned(),
                );
            }
            if let Some(why) = full_batch(store, onset, now) {
                return Some(why);
            }
            let waiting = store.series(Signal::ServerRequestsWaiting)?;
            let mut after = waiting.range(onset, now.saturating_add(1)).peekable();
            after.peek()?;
            after
                .all(|(_, v)| v < 1.0)
                .then(|| "no request waiting at any scrape since the onset".to_owned())
        }
        // The agent never blames the node for itself: when its own CPU use rose by half a core
        // or more since the onset, the node's CPU pressure is (at least partly) the agent's.
        Cause::NodeCpuPressure => {
            let before = mean_in(
                store,
                Signal::AgentCpu,
                onset.saturating_sub(300),
                onset.saturating_sub(5),
            )?;
            let after = mean_in(store, Signal::AgentCpu, onset, now.saturating_add(1))?;
            (after - before >= 0.5).then(|| {
                format!(
                    "the agent's own CPU use rose {before:.2} → {after:.2} cores: the pressure is the agent's"
                )
            })
        }
        // Probes pinned through a router at its CPU quota are late at random: one worker apart
        // then says nothing against the router (seen on Dynamo 1.6.1 with the frontend at 5 % of
        // a core: one worker's probes 20.9 × the other's for 3 comparisons in a row).
        Cause::RouterOverhead => workers_slowed(store, onset, now).or_else(|| {
            if router_quota_rose(store, onset, now) {
                None
            } else {
                one_worker_apart(store, onset, now)
            }
        }),
        // The other way: one worker apart while the router is at its CPU quota is the router's
        // (its pinned probes pass through the starved router); direct canaries, which do not,
        // hold every worker alike then.
        Cause::WorkerOutOfRotation => router_quota_rose(store, onset, now).then(|| {
            "the router's own cgroup is at its CPU quota: requests through it are late at random, not one worker's".to_owned()
        }),
        Cause::LongPrompts => prompts_held(store, onset, now),
        Cause::PrefillSaturation => other_pool_rose(store, Signal::DecodePoolLoad, onset, now),
        Cause::DecodeSaturation => other_pool_rose(store, Signal::PrefillPoolLoad, onset, now),
        _ => None,
    }
}

/// The median of `s` over the 5 min before `onset` and since it, when it rose: at least
/// 1.2 × and by its floor.
fn rose(store: &EvidenceStore, s: Signal, onset: u32, now: u32) -> Option<(f64, f64)> {
    let median_in = |from: u32, to: u32| {
        let mut v: Vec<f64> = store.series(s)?.range(from, to).map(|(_, v)| v).collect();
        super::detector::median(&mut v)
    };
    let before = median_in(onset.saturating_sub(300), onset)?;
    let after = median_in(onset, now.saturating_add(1))?;
    (after >= 1.2 * before && after - before >= s.floor()).then_some((before, after))
}

/// What measures how long the prompts are: the canaries' own input tokens, the server's
/// prompt tokens per generated token and per second.
const PROMPT_LENGTH: [Signal; 3] = [
    Signal::InputTokens,
    Signal::ServerPromptRatio,
    Signal::ServerPromptTokensRate,
];

/// `long_prompts` against the prompts' length: when every measure of it the target has
/// ([`PROMPT_LENGTH`], at least one sampled since the onset) held, the prefill got slower, not
/// the prompts longer (a slower prefill alone is the server's, or its front end's: a
/// CPU-starved Dynamo frontend times its own wait as `prefill_time_ms`, seen on 1.6.1 at 3 ms →
/// 2.3 s). `None` when one rose or none is measured (then the prefill time cannot tell).
fn prompts_held(store: &EvidenceStore, onset: u32, now: u32) -> Option<String> {
    let measured: Vec<Signal> = PROMPT_LENGTH
        .into_iter()
        .filter(|&s| {
            store
                .series(s)
                .is_some_and(|x| x.range(onset, now.saturating_add(1)).next().is_some())
        })
        .collect();
    if measured.is_empty()
        || measured
            .iter()
            .any(|&s| rose(store, s, onset, now).is_some())
    {
        return None;
    }
    let names: Vec<&str> = measured.iter().map(|s| s.words()).collect();
    Some(format!(
        "the prompts are no longer ({} held): the prefill got slower, not the prompts longer",
        names.join(", ")
    ))
}

/// A pool's saturation against the other pool: when its load rose as well, more work came
/// to both (or both got slower), not one pool short of capacity.
fn other_pool_rose(store: &EvidenceStore, other: Signal, onset: u32, now: u32) -> Option<String> {
    let (before, after) = rose(store, other, onset, now)?;
    Some(format!(
        "the other pool's load rose too ({} {before:.0} → {after:.0}): both pools, not one short of capacity",
        other.words()
    ))
}

/// `router_overhead` against the direct canaries: when they slowed too (median since the
/// onset ≥ 1.2 × and + the TTFT floor over the 5 min before), the workers slowed, and the
/// routed − direct difference rose only while the direct window (a minute) caught up.
fn workers_slowed(store: &EvidenceStore, onset: u32, now: u32) -> Option<String> {
    let (before, after) = rose(store, Signal::DirectTtft, onset, now)?;
    Some(format!(
        "the direct canaries to the workers slowed too ({:.0} → {:.0} ms TTFT): the workers, not the router (the routed − direct difference lags the direct window)",
        before * 1e3,
        after * 1e3
    ))
}

/// `router_overhead` against one worker apart: when, since `onset`, one worker answered its
/// direct canaries at twice the others' TTFT or more (the median of [`MIN_COMPARISONS`]
/// consecutive comparisons since; from within 1.5 × before) or failed them, the routed canaries it
/// serves are late or fail, and their difference from the direct canaries' median (which the
/// other workers hold down) is that worker's, not the router's. A worker apart now and then is
/// no worker apart: probes pinned through a starved router are late at random (seen on Dynamo
/// 1.6.1 with the frontend at 5 % of a core: one probe 14 × its peers', the rest alike).
fn one_worker_apart(store: &EvidenceStore, onset: u32, now: u32) -> Option<String> {
    let peak = |s: Signal| {
        store
            .series(s)?
            .range(onset, now.saturating_add(1))
            .map(|(_, v)| v)
            .reduce(f64::max)
    };
    // The highest level it held: the median of each run of consecutive comparisons.
    let level = store.series(Signal::WorkerSlowdown).and_then(|x| {
        let v: Vec<f64> = x
            .range(onset, now.saturating_add(1))
            .map(|(_, v)| v)
            .collect();
        v.windows(MIN_COMPARISONS)
            .filter_map(|w| super::detector::median(&mut w.to_vec()))
            .reduce(f64::max)
    });
    if let Some(p) = level
        && p >= 2.0
        && mean_in(
            store,
            Signal::WorkerSlowdown,
            onset.saturating_sub(300),
            onset,
        )
        .is_none_or(|b| b <= 1.5)
    {
        return Some(format!(
            "one worker behind the router answered its direct canaries at {p:.1} × the others' TTFT: the routed canaries it serves are late, not the router"
        ));
    }
    let failing = peak(Signal::FailingWorkers)?;
    (failing >= 1.0).then(|| {
        format!(
            "{failing:.0} worker(s) behind the router failed their direct canaries: the routed canaries they serve fail or wait for a retry, not the router"
        )
    })
}

/// Whether a router target's own cgroup's throttled share rose by
/// [`THROTTLE_RISE`] since `onset` ([`Signal::RouterCpuThrottled`]): the
/// router at its CPU quota.
pub fn router_quota_rose(store: &EvidenceStore, onset: u32, now: u32) -> bool {
    throttle_rose(store, Signal::RouterCpuThrottled, onset, now).is_some()
}

/// The throttled share `s` (mean of the 5 min before `onset`, mean since), when it rose by
/// [`THROTTLE_RISE`] or more.
pub fn throttle_rose(store: &EvidenceStore, s: Signal, onset: u32, now: u32) -> Option<(f64, f64)> {
    let after = mean_in(store, s, onset, now.saturating_add(1))?;
    let before =
        mean_in(store, s, onset.saturating_sub(300), onset.saturating_sub(5)).unwrap_or(0.0);
    (after - before >= THROTTLE_RISE).then_some((before, after))
}

/// The rise of a cgroup's throttled share (mean since the onset against the 5 min before) that
/// makes a CPU wait the quota's (the signal's floor).
pub const THROTTLE_RISE: f64 = 0.1;

/// Consecutive comparisons of the workers whose median says one worker is apart.
const MIN_COMPARISONS: usize = 3;

/// The share of the baseline's scrapes a batch as large as the one requests waited behind must
/// stay below to count as the server's ordinary full batch (its 95th percentile).
const FULL_BATCH_QUANTILE: f64 = 0.95;

/// The server's ordinary batch before `onset`: the median and the 95th percentile
/// ([`FULL_BATCH_QUANTILE`], its ordinary full batch) of the requests running over the 30 min
/// before. `None` with fewer than 60 scrapes.
pub fn ordinary_batch(store: &EvidenceStore, onset: u32) -> Option<(f64, f64)> {
    let mut before: Vec<f64> = store
        .series(Signal::ServerRequestsRunning)?
        .range(onset.saturating_sub(1800), onset.saturating_sub(5))
        .map(|(_, v)| v)
        .collect();
    if before.len() < 60 {
        return None;
    }
    before.sort_by(f64::total_cmp);
    let pick =
        |q: f64| before[((q * (before.len() - 1) as f64).round() as usize).min(before.len() - 1)];
    Some((pick(0.5), pick(FULL_BATCH_QUANTILE)))
}

/// Whether the requests that waited since `onset` waited behind the server's ordinary full
/// batch: at the scrapes that saw a request waiting, the batch (requests running) at least its
/// 95th percentile over the 30 min before (a batch that varies: above its median there), and
/// the server's decode time per token not up 20 % (the batch no slower than ordinary). A
/// half-busy server with few slots queues whenever its slots are all held by its ordinary
/// traffic: congestion that is ordinary for it. A scheduler that got slower (stuck, a slow
/// tokenizer) queues with its batch at its usual size, a KV squeeze with a smaller one. The
/// words when it does; `None` when not, or without the signals.
pub fn full_batch(store: &EvidenceStore, onset: u32, now: u32) -> Option<String> {
    let to = now.saturating_add(1);
    let waiting: Vec<u32> = store
        .series(Signal::ServerRequestsWaiting)?
        .range(onset, to)
        .filter(|&(_, v)| v >= 1.0)
        .map(|(t, _)| t)
        .collect();
    if waiting.is_empty() {
        return None;
    }
    let running = store.series(Signal::ServerRequestsRunning)?;
    let (median, full) = ordinary_batch(store, onset)?;
    if full <= median {
        return None;
    }
    let mut during: Vec<f64> = running
        .range(onset, to)
        .filter(|(t, _)| waiting.contains(t))
        .map(|(_, v)| v)
        .collect();
    let batch = super::detector::median(&mut during)?;
    if batch < full {
        return None;
    }
    if let (Some(b), Some(a)) = (
        mean_in(
            store,
            Signal::ServerDecodeTime,
            onset.saturating_sub(300),
            onset.saturating_sub(5),
        ),
        mean_in(store, Signal::ServerDecodeTime, onset, to),
    ) && b > 0.0
        && a >= 1.2 * b
    {
        return None;
    }
    Some(format!(
        "requests waited behind a batch of {batch:.0} running, the server's ordinary full batch (its 95th percentile {full:.0}, median {median:.0}) at its ordinary decode speed: a busy server's ordinary congestion"
    ))
}
