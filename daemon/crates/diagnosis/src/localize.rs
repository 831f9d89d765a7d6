//! Where a detected latency change began (issue 28: onsets within 5 s of the fault).
//!
//! The onset search's CUSUM ([`crate::engine`]) measures its steps in the baseline's scale
//! floored at half the signal's floor (25 ms of TTFT) with an allowance of one such step: right
//! for deciding that a change happened, late for dating it. A fault that ramps in over 10–20 s
//! (clients connecting, a cache filling, a neighbour spinning up) crosses that band seconds after
//! it began, and the change point landed 6–7 s after the injection. Once the change is known,
//! its start is where the series first left its baseline's noise: [`start_of_rise`] walks back
//! from the change point over the seconds whose excess over the baseline, in the baseline's own
//! noise scale, outweighs an allowance of a tenth of the shift (at least half a σ), and keeps the
//! earliest second of the best run (a backward CUSUM; in calm seconds its sum drifts down, so it
//! stops within a second or two of a step).
//!
//! A canary's latency is observed when the canary ends: a canary sent as a surge began that
//! queued 10 s reports at +10 s, and with every in-flight slot held by such canaries none
//! reports before. The server was already slow when that canary was sent: [`sent_by`] dates the
//! first slow canaries at their end less their latency (TTFT and E2E count from the send), no
//! earlier than the last canary that ended at its ordinary latency.
//!
//! Pure: the caller passes the series and the seconds.

use super::store::SecondSeries;

/// Seconds [`start_of_rise`] may walk back from the change point: a ramp's slow start, never a
/// level that crept up a minute before.
pub const LOOKBACK_S: u32 = 15;
/// The allowance of the backward walk: a tenth of the shift, at least half the noise scale.
pub const SHIFT_SHARE: f64 = 0.1;
const MIN_K: f64 = 0.5;
/// Each standardized step is clipped to ±3 (one blip does not carry the walk).
const CAP: f64 = 3.0;
/// Seconds after the change point whose canaries [`sent_by`] dates at their send (one bucket).
pub const SENT_WINDOW_S: u32 = 10;

/// The earliest second of the rise that led to the change point `change` of `series`: the
/// second `τ ∈ [change − LOOKBACK_S, change]` that maximizes
/// `Σ_{t ∈ [τ, change)} (clip((x_t − mu)/sigma) − k)` with `k = max(½, 0.1 · (jumped − mu)/sigma)`
/// (`jumped`: the symptom's bucket value that jumped: a tenth of the jump, so a level that
/// crept up by a σ before a jump of twenty is no part of it), when that sum is positive;
/// `change` otherwise. `mu`, `sigma`: the baseline's median and noise scale (not floored by
/// the signal's floor); increases only (latency).
pub fn start_of_rise(series: &SecondSeries, change: u32, mu: f64, sigma: f64, jumped: f64) -> u32 {
    if !(sigma.is_finite() && sigma > 0.0 && jumped.is_finite()) {
        return change;
    }
    let k = (SHIFT_SHARE * (jumped - mu) / sigma).max(MIN_K);
    let before: Vec<(u32, f64)> = series
        .range(change.saturating_sub(LOOKBACK_S), change)
        .collect();
    let (mut sum, mut best_sum, mut best) = (0.0, 0.0, change);
    for &(t, v) in before.iter().rev() {
        sum += ((v - mu) / sigma).clamp(-CAP, CAP) - k;
        if sum > best_sum {
            best_sum = sum;
            best = t;
        }
    }
    best
}

/// The second by which the server was already slow, read from the canaries that ended in
/// `[change, change + SENT_WINDOW_S]` above `slow` (a latency counted from the send: TTFT or
/// E2E, observed at the canary's end): the earliest `end − latency + mu` (the send, plus the
/// latency an ordinary canary had: it would have been answered by then), not before the last
/// second before `change` whose canary ended at or under `slow`. `None` when no such canary
/// dates earlier than `change`.
pub fn sent_by(series: &SecondSeries, change: u32, mu: f64, slow: f64) -> Option<u32> {
    let floor = series
        .range(change.saturating_sub(300), change)
        .filter(|&(_, v)| v <= slow)
        .map(|(t, _)| t)
        .last()
        .unwrap_or(0);
    let sent = series
        .range(change, change.saturating_add(SENT_WINDOW_S + 1))
        .filter(|&(_, v)| v > slow)
        .map(|(t, v)| f64::from(t) - v + mu)
        .fold(f64::INFINITY, f64::min);
    if !sent.is_finite() {
        return None;
    }
    let at = (sent.floor().max(0.0) as u32).max(floor);
    (at < change).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detector::Aggregate;

    fn series(points: &[(u32, f64)]) -> SecondSeries {
        let mut s = SecondSeries::new(Aggregate::P99);
        for &(t, v) in points {
            s.push(t, v);
        }
        s.roll(points.last().map_or(0, |p| p.0) + 2);
        s
    }

    /// A TTFT of 70 ms ± 5 ms that ramps by 7 ms a second from second 1000 (a load that builds
    /// over 10 s), its CUSUM change point (σ floored at 25 ms) found at 1006.
    #[test]
    fn a_ramp_is_dated_where_it_left_the_noise_not_where_it_crossed_the_band() {
        let noise = [0.004, -0.005, 0.002, -0.003, 0.005, -0.004, 0.001, -0.002];
        let mut pts: Vec<(u32, f64)> = (900..1000)
            .map(|t| (t, 0.070 + noise[t as usize % noise.len()]))
            .collect();
        pts.extend((1000..1040).map(|t| {
            let ramp = 0.007 * f64::from((t - 1000).min(10));
            (t, 0.070 + ramp + noise[t as usize % noise.len()])
        }));
        let s = series(&pts);
        // σ from the noise: 1.4826 · MAD ≈ 5 ms.
        let at = start_of_rise(&s, 1006, 0.070, 0.005, 0.140);
        assert!((1000..=1002).contains(&at), "{at}");
        // A step: kept at its change point (the calm seconds before it drift the walk down).
        let mut step: Vec<(u32, f64)> = (900..1000)
            .map(|t| (t, 0.070 + noise[t as usize % noise.len()]))
            .collect();
        step.extend((1000..1040).map(|t| (t, 0.140)));
        let s = series(&step);
        assert_eq!(start_of_rise(&s, 1000, 0.070, 0.005, 0.140), 1000);
    }

    #[test]
    fn a_creep_below_a_tenth_of_the_shift_is_not_the_rise() {
        // 70 ms, then 76 ms (+1.2 σ, under a tenth of the 700 ms shift) for 15 s, then 770 ms.
        let mut pts: Vec<(u32, f64)> = (900..985).map(|t| (t, 0.070)).collect();
        pts.extend((985..1000).map(|t| (t, 0.076)));
        pts.extend((1000..1030).map(|t| (t, 0.770)));
        let s = series(&pts);
        assert_eq!(start_of_rise(&s, 1000, 0.070, 0.005, 0.770), 1000);
    }

    /// Canaries of 70 ms ending each second until 999; then every slot held by canaries that
    /// queued: the first ends at 1010 after 9.6 s (sent at 1000.4).
    #[test]
    fn slow_canaries_are_dated_at_their_send_not_their_end() {
        let mut pts: Vec<(u32, f64)> = (900..1000).map(|t| (t, 0.070)).collect();
        pts.extend([(1010, 9.6), (1011, 9.2), (1012, 8.4), (1020, 13.0)]);
        let s = series(&pts);
        assert_eq!(sent_by(&s, 1010, 0.070, 0.2), Some(1000));
        // Never before the last canary that ended at its ordinary latency.
        let mut late: Vec<(u32, f64)> = (900..1005).map(|t| (t, 0.070)).collect();
        late.extend([(1010, 9.6)]);
        let s = series(&late);
        assert_eq!(sent_by(&s, 1010, 0.070, 0.2), Some(1004));
        // Canaries that end each second are dated within the second they were sent.
        let mut each: Vec<(u32, f64)> = (900..1000).map(|t| (t, 0.070)).collect();
        each.extend((1000..1020).map(|t| (t, 0.300)));
        let s = series(&each);
        assert_eq!(sent_by(&s, 1000, 0.070, 0.2), Some(999));
        // No slow canary in the window: nothing to date.
        assert_eq!(sent_by(&s, 1000, 0.070, 0.5), None);
    }
}
