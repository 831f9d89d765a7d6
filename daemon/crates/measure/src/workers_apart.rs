//! One worker behind a router apart from the others (issue 53): from the canaries sent
//! straight to each worker, the slowest worker's TTFT (the median of its last
//! [`MIN_ANSWERED`] answers) against the other workers', and the workers whose last
//! [`MIN_FAILED`] direct canaries failed while another answered. A router that still sends
//! requests to a slow or failing worker slows or fails its routed canaries; these say which
//! worker it is, two or three direct canaries after it changed (a minute's median would say it
//! half a minute later). Times are given (Unix seconds), never read.

use super::path::p50;

/// A worker's last answers (successful direct canaries in the window) whose median is its
/// TTFT: one slow outlier among them moves nothing.
pub const MIN_ANSWERED: usize = 3;
/// A worker's last direct canaries, every one failed, that make it failing.
pub const MIN_FAILED: usize = 2;
/// The least a worker's time must exceed the other workers' median by, ms, to count as
/// slower (its ratio otherwise at most 1): below it the ratio of two small times is the
/// node's scheduling jitter (seen live on Dynamo 1.6.1's mockers: prefills of 3 to 9 ms), not
/// a worker apart. A worker half as fast as its peers adds its whole prefill (≥ 10 ms of a
/// short prompt on a GPU).
pub const MIN_EXCESS_MS: f64 = 10.0;
/// The window the results are read from, seconds: a worker that has not answered in it says
/// nothing of its speed.
pub const WINDOW_S: f64 = 60.0;

/// One direct canary's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DirectResult {
    /// When it ended, Unix seconds.
    pub at_unix_s: f64,
    /// Its TTFT, ms; `None` when it failed (an error, a refused connection, a timeout).
    pub ttft_ms: Option<f64>,
}

/// The workers apart from the others over one window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkersApart {
    /// The worker with the highest TTFT (its last [`MIN_ANSWERED`] answers' median) and that
    /// TTFT ÷ the median of the other workers' (1 when all answer alike); `None` with fewer
    /// than 2 workers of [`MIN_ANSWERED`] answers each in the window.
    pub slowest: Option<(String, f64)>,
    /// The workers whose last [`MIN_FAILED`] direct canaries in the window all failed, while
    /// another worker answered one: not the whole pool down.
    pub failing: Vec<String>,
    /// Each worker of [`MIN_ANSWERED`] answers, not failing, and its TTFT ÷ the median of the
    /// other such workers' (the slowest's is [`WorkersApart::slowest`]), by name; empty with
    /// fewer than 2. A failing worker's answers are from before it failed: compared, they
    /// would make the one left look slow (seen live: a rolling restart's killed worker, still
    /// registered for its lease, made the new one 5.8 × "slower").
    pub ratios: Vec<(String, f64)>,
}

/// The workers apart over the `window_s` seconds ending at `now_unix_s`, from each worker's
/// direct results (`workers`: its name and results, any order).
pub fn workers_apart<'a>(
    workers: impl IntoIterator<Item = (&'a str, &'a [DirectResult])>,
    now_unix_s: f64,
    window_s: f64,
) -> WorkersApart {
    let from = now_unix_s - window_s;
    let mut p50s: Vec<(&str, f64)> = Vec::new();
    let mut failing = Vec::new();
    let mut any_answered = false;
    for (name, results) in workers {
        let mut recent: Vec<&DirectResult> = results
            .iter()
            .filter(|r| r.at_unix_s > from && r.at_unix_s <= now_unix_s)
            .collect();
        recent.sort_by(|a, b| a.at_unix_s.total_cmp(&b.at_unix_s));
        let answers: Vec<f64> = recent
            .iter()
            .filter_map(|r| r.ttft_ms)
            .filter(|v| v.is_finite())
            .collect();
        any_answered |= !answers.is_empty();
        if recent.len() >= MIN_FAILED
            && recent[recent.len() - MIN_FAILED..]
                .iter()
                .all(|r| r.ttft_ms.is_none())
        {
            // Its answers are from before it failed: no speed of it now to compare.
            failing.push(name.to_owned());
            continue;
        }
        if answers.len() >= MIN_ANSWERED
            && let Some(m) = p50(answers[answers.len() - MIN_ANSWERED..].to_vec())
        {
            p50s.push((name, m));
        }
    }
    if !any_answered {
        failing.clear();
    }
    failing.sort();
    let ratios: Vec<(String, f64)> = if p50s.len() >= 2 {
        p50s.iter()
            .enumerate()
            .filter_map(|(i, &(name, mine))| {
                let others: Vec<f64> = p50s
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .map(|(_, &(_, v))| v)
                    .collect();
                let mid = p50(others).filter(|m| *m > 0.0)?;
                let ratio = mine / mid;
                Some((
                    name.to_owned(),
                    if mine - mid < MIN_EXCESS_MS {
                        ratio.min(1.0)
                    } else {
                        ratio
                    },
                ))
            })
            .collect()
    } else {
        Vec::new()
    };
    let slowest = ratios.iter().max_by(|a, b| a.1.total_cmp(&b.1)).cloned();
    WorkersApart {
        slowest,
        failing,
        ratios,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(at: f64, ttft: f64) -> DirectResult {
        DirectResult {
            at_unix_s: at,
            ttft_ms: Some(ttft),
        }
    }

    fn failed(at: f64) -> DirectResult {
        DirectResult {
            at_unix_s: at,
            ttft_ms: None,
        }
    }

    /// Three workers: one answers at 3 × the others' TTFT; one failed its last two canaries
    /// (an earlier success is outside the window); the slowest is named with its ratio; a
    /// worker's answers before its last three count no more.
    #[test]
    fn the_slowest_and_the_failing_worker() {
        let a = [ok(10.0, 40.0), ok(20.0, 42.0), ok(30.0, 38.0)];
        let b = [ok(10.0, 120.0), ok(20.0, 126.0), ok(30.0, 130.0)];
        let c = [
            ok(10.0, 500.0),
            ok(20.0, 44.0),
            ok(30.0, 40.0),
            ok(40.0, 41.0),
        ];
        let dead = [ok(-40.0, 40.0), failed(15.0), failed(25.0)];
        let w = workers_apart(
            [
                ("http://a", &a[..]),
                ("http://b", &b[..]),
                ("http://c", &c[..]),
                ("http://dead", &dead[..]),
            ],
            40.0,
            60.0,
        );
        let (name, ratio) = w.slowest.expect("three workers answered");
        assert_eq!(name, "http://b");
        // b's 126 ÷ the median of a's 40 and c's 41 (its 500 before its last three; nearest
        // rank: 40).
        assert!((ratio - 126.0 / 40.0).abs() < 1e-9, "{ratio}");
        assert_eq!(w.failing, ["http://dead"]);
        // Each answering worker against the others: a 40 ÷ median(41, 126) = 40 ÷ 41.
        assert_eq!(w.ratios.len(), 3);
        let a_ratio = w.ratios.iter().find(|r| r.0 == "http://a").map(|r| r.1);
        assert!(
            a_ratio.is_some_and(|r| (r - 40.0 / 41.0).abs() < 1e-9),
            "{a_ratio:?}"
        );
    }

    /// Two small times apart by less than [`MIN_EXCESS_MS`] are not a worker apart, however
    /// large their ratio (4 against 9 ms: 2.25 ×, read 1); beyond it the ratio stands.
    #[test]
    fn a_small_excess_is_no_slowdown() {
        let fast = [ok(1.0, 4.0), ok(2.0, 4.0), ok(3.0, 4.0)];
        let jitter = [ok(1.0, 9.0), ok(2.0, 9.0), ok(3.0, 9.0)];
        let slow = [ok(1.0, 30.0), ok(2.0, 30.0), ok(3.0, 30.0)];
        let w = workers_apart([("f", &fast[..]), ("j", &jitter[..])], 3.0, 60.0);
        assert_eq!(w.slowest, Some(("j".to_owned(), 1.0)));
        let w = workers_apart([("f", &fast[..]), ("s", &slow[..])], 3.0, 60.0);
        assert_eq!(w.slowest, Some(("s".to_owned(), 7.5)));
    }

    /// Even workers read about 1; a failure followed by an answer is not failing; a whole
    /// pool failing names no worker (an outage, not one worker); one worker says nothing.
    #[test]
    fn even_partial_whole_and_alone() {
        let a = [ok(1.0, 40.0), ok(2.0, 41.0), failed(3.0), ok(4.0, 40.0)];
        let b = [ok(1.0, 41.0), ok(2.0, 40.0), ok(3.0, 42.0)];
        let w = workers_apart([("a", &a[..]), ("b", &b[..])], 5.0, 60.0);
        let (_, ratio) = w.slowest.expect("two answered");
        assert!((1.0..1.1).contains(&ratio), "{ratio}");
        assert!(w.failing.is_empty());
        let f1 = [failed(1.0), failed(2.0)];
        let f2 = [failed(1.5), failed(2.5)];
        let down = workers_apart([("a", &f1[..]), ("b", &f2[..])], 5.0, 60.0);
        assert_eq!(down, WorkersApart::default());
        let alone = workers_apart([("a", &a[..])], 5.0, 60.0);
        assert_eq!(alone.slowest, None);
        // A worker that answered fast, then failed its last two (killed, still listed): it
        // is failing, and its old answers do not make the one left look slow.
        let killed = [
            ok(1.0, 4.0),
            ok(1.5, 4.0),
            ok(2.0, 4.0),
            failed(3.0),
            failed(4.0),
        ];
        let w = workers_apart([("a", &a[..]), ("killed", &killed[..])], 5.0, 60.0);
        assert_eq!((w.slowest, w.failing), (None, vec!["killed".to_owned()]));
    }
}
