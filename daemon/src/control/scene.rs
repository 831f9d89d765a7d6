//! `lmperf ctl inject --trace FILE --p99-threshold 850ms`: "reproduce the 3 a.m. scene". After
//! the replay starts, the client polls the agent's status until the load is no longer running,
//! then reads the recent requests of the replay's time span (canaries and injected requests of
//! the target) and the agent's diagnosis, and says whether the p99 alert condition held and
//! what the diagnosis was. Client side only: no proto change.
//!
//! The alert condition: the E2E p99 of a sliding 30 s window (stepped every 10 s, at least 5
//! finished requests in it) at or above the threshold, the way a `histogram_quantile(0.99,
//! rate(…[30s]))` rule evaluated every 10 s reads it.

use serde::Serialize;

use super::proto;

/// The alert window and its step, seconds.
pub const WINDOW_S: f64 = 30.0;
pub const STEP_S: f64 = 10.0;
/// Requests a window needs before its p99 counts.
pub const MIN_REQUESTS: usize = 5;

/// Whether the p99 alert condition held during the replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct P99Alert {
    pub threshold_s: f64,
    pub fired: bool,
    /// End of the first window at or above the threshold (Unix s).
    pub first_fired_unix_s: Option<f64>,
    /// The highest windowed p99 (s) and the end of its window.
    pub peak_p99_s: Option<f64>,
    pub peak_unix_s: Option<f64>,
    /// Windows evaluated (with enough requests) and those at or above the threshold.
    pub windows: usize,
    pub windows_fired: usize,
    /// Requests of the span (finished, not cancelled) and those that failed.
    pub requests: usize,
    pub failed: usize,
}

fn p99(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64) * 0.99).ceil() as usize;
    v[i.saturating_sub(1).min(v.len() - 1)]
}

/// Evaluates the condition over the requests of `target` finished in `from..=to` (Unix s).
pub fn p99_alert(
    requests: &[proto::RequestSummary],
    target: &str,
    from: f64,
    to: f64,
    threshold_s: f64,
) -> P99Alert {
    let done: Vec<(f64, f64, bool)> = requests
        .iter()
        .filter(|r| (target.is_empty() || r.target == target) && r.outcome != "cancelled")
        .map(|r| {
            let e2e = r.e2e_ms / 1000.0;
            (r.at_unix_s + e2e, e2e, r.outcome != "ok")
        })
        .filter(|(end, _, _)| (from..=to).contains(end))
        .collect();
    let mut a = P99Alert {
        threshold_s,
        fired: false,
        first_fired_unix_s: None,
        peak_p99_s: None,
        peak_unix_s: None,
        windows: 0,
        windows_fired: 0,
        requests: done.len(),
        failed: done.iter().filter(|d| d.2).count(),
    };
    let mut end = from + STEP_S;
    loop {
        let end_c = end.min(to);
        let mut w: Vec<f64> = done
            .iter()
            .filter(|(t, _, _)| *t > end_c - WINDOW_S && *t <= end_c)
            .map(|d| d.1)
            .collect();
        if w.len() >= MIN_REQUESTS {
            let p = p99(&mut w);
            a.windows += 1;
            if a.peak_p99_s.is_none_or(|x| p > x) {
                a.peak_p99_s = Some(p);
                a.peak_unix_s = Some(end_c);
            }
            if p >= threshold_s {
                a.windows_fired += 1;
                a.fired = true;
                a.first_fired_unix_s.get_or_insert(end_c);
            }
        }
        if end >= to {
            break;
        }
        end += STEP_S;
    }
    a
}

/// The verdict in words.
pub fn text(a: &P99Alert, started: f64) -> String {
    let ms = |s: f64| format!("{:.0} ms", s * 1000.0);
    let peak = a
        .peak_p99_s
        .map_or("no window with enough requests".to_owned(), |p| {
            format!(
                "peak 30 s p99 {} at +{:.0} s",
                ms(p),
                a.peak_unix_s.unwrap_or(started) - started
            )
        });
    let head = if a.fired {
        format!(
            "p99 alert (E2E p99 ≥ {} over 30 s): FIRED at +{:.0} s, {} of {} windows; {peak}",
            ms(a.threshold_s),
            a.first_fired_unix_s.unwrap_or(started) - started,
            a.windows_fired,
            a.windows
        )
    } else {
        format!(
            "p99 alert (E2E p99 ≥ {} over 30 s): did not fire ({} windows; {peak})",
            ms(a.threshold_s),
            a.windows
        )
    };
    format!(
        "{head}\n{} requests during the replay, {} failed\n",
        a.requests, a.failed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(at: f64, e2e_ms: f64, outcome: &str) -> proto::RequestSummary {
        proto::RequestSummary {
            source: "inject".into(),
            target: "t0".into(),
            at_unix_s: at,
            e2e_ms,
            outcome: outcome.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_alert_fires_when_a_30s_window_p99_reaches_the_threshold() {
        // 1 request/s for 60 s: 200 ms, then from +30 s 1.2 s.
        let mut rs: Vec<_> = (0..60)
            .map(|i| {
                let slow = i >= 30;
                req(
                    1000.0 + f64::from(i),
                    if slow { 1200.0 } else { 200.0 },
                    "ok",
                )
            })
            .collect();
        rs.push(req(1001.0, 50.0, "cancelled"));
        rs.push(req(1002.0, 10.0, "error"));
        let a = p99_alert(&rs, "t0", 1000.0, 1062.0, 0.85);
        assert!(a.fired);
        assert_eq!(a.first_fired_unix_s, Some(1040.0));
        assert_eq!(a.peak_p99_s, Some(1.2));
        assert_eq!((a.requests, a.failed), (61, 1));
        let t = text(&a, 1000.0);
        assert!(t.contains("FIRED at +40 s"), "{t}");
        let calm = p99_alert(&rs[..30], "t0", 1000.0, 1031.0, 0.85);
        assert!(!calm.fired);
        assert_eq!(calm.peak_p99_s, Some(0.2));
        assert!(text(&calm, 1000.0).contains("did not fire"));
        // Another target's requests do not count.
        assert_eq!(p99_alert(&rs, "t1", 1000.0, 1062.0, 0.85).requests, 0);
    }
}
