//! Whether a target answers at all, from its canaries' outcomes alone, with no baseline: a
//! latency baseline learns what it sees, so a target failing since the agent started (a dead
//! port, a proxy's HTML page) or an outage inside the baseline's first minutes would read as
//! "nothing to diagnose". [`DOWN_AFTER`] failed canaries in a row, none successful between,
//! make the target down, whenever that happens; the first success brings it back.
//!
//! Pure: the caller passes each canary's end time (Unix seconds) and outcome.

use serde::{Deserialize, Serialize};

use lmperf_measure::error_type;

/// Failed canaries in a row that make a target down. One refused connection is a blip (a
/// restart's last second); three in a row, at any canary rate, are an outage or a target that
/// never worked.
pub const DOWN_AFTER: u64 = 3;

/// One failed canary, as the scorecard and the log say it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorNote {
    /// When the canary ended, Unix seconds.
    pub at_unix_s: f64,
    /// Its `error.type` (`connection_refused`, `timeout`, `503`, `non_sse_reply`, …).
    pub error_type: String,
    /// The reason on one line, where there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ErrorNote {
    /// `connection_refused: connection refused` (the type, then the message if any).
    pub fn words(&self) -> String {
        match &self.message {
            Some(m) => format!("{}: {m}", self.error_type),
            None => self.error_type.clone(),
        }
    }
}

/// How a down target fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DownKind {
    /// Nothing answers: connections refused or broken, requests timing out.
    Unreachable,
    /// It answers, but not with a stream of tokens: HTTP errors, an HTML page, no token.
    Failing,
}

impl DownKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DownKind::Unreachable => "unreachable",
            DownKind::Failing => "failing",
        }
    }

    /// The kind of the failure `error_type`.
    pub fn of(error_type: &str) -> DownKind {
        match error_type {
            error_type::CONNECTION_REFUSED | error_type::CONNECTION_ERROR | error_type::TIMEOUT => {
                DownKind::Unreachable
            }
            _ => DownKind::Failing,
        }
    }
}

/// A down target: since when, how many canaries failed, the first and the last error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Down {
    /// From the last failure's type.
    pub kind: DownKind,
    /// The first failure of the run, Unix seconds.
    pub since_unix_s: f64,
    /// Failed canaries in a row so far.
    pub failed: u64,
    /// No canary of the target has succeeded since the agent started watching it.
    pub since_start: bool,
    pub first_error: ErrorNote,
    pub last_error: ErrorNote,
    /// When it answered again (Unix seconds): set on a past episode, `None` while down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_unix_s: Option<f64>,
}

impl Down {
    /// `unreachable since 01:23:44 UTC (12 canaries failed, none ok since the start): first
    /// connection_refused: …; last …`.
    pub fn words(&self) -> String {
        let start = if self.since_start {
            ", none ok since the start"
        } else {
            ""
        };
        let last = if self.last_error.words() == self.first_error.words() {
            String::new()
        } else {
            format!("; last {}", self.last_error.words())
        };
        let span = match self.recovered_unix_s {
            Some(up) => format!(
                "from {} to {} UTC",
                hh_mm_ss(self.since_unix_s),
                hh_mm_ss(up)
            ),
            None => format!("since {} UTC", hh_mm_ss(self.since_unix_s)),
        };
        format!(
            "{} {span} ({} canaries failed{start}): first {}{last}",
            self.kind.as_str(),
            self.failed,
            self.first_error.words()
        )
    }
}

/// `HH:MM:SS` (UTC) of a Unix time, as the scorecard prints times.
fn hh_mm_ss(unix: f64) -> String {
    let s = unix.max(0.0) as u64 % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// What one canary changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// The target just went down.
    Down(Down),
    /// The first success after `down` (its `recovered_unix_s` set); `at_unix_s`: the last
    /// failure.
    Recovered { down: Down, at_unix_s: f64 },
}

/// One target's reachability, fed every canary in the order they end.
#[derive(Debug, Clone, Default)]
pub struct Reachability {
    ever_ok: bool,
    /// The failures since the last success: the first, the last, how many.
    run: Option<(ErrorNote, ErrorNote, u64)>,
    down: bool,
    /// The last episode that ended (the target answered again).
    last_episode: Option<Down>,
}

impl Reachability {
    /// One canary: `Ok(end)` for a success, `Err(note)` for a failure (the caller leaves out
    /// the agent's own cancellations). Returns the transition, if any.
    /// A success carries its end time (`Ok(at_unix_s)`), a failure its note.
    pub fn observe(&mut self, outcome: Result<f64, ErrorNote>) -> Option<Transition> {
        match outcome {
            Ok(up) => {
                self.ever_ok = true;
                let run = self.run.take();
                let was_down = std::mem::replace(&mut self.down, false);
                match run {
                    Some((first, last, failed)) if was_down => {
                        let at_unix_s = last.at_unix_s;
                        let down = Down {
                            kind: DownKind::of(&last.error_type),
                            since_unix_s: first.at_unix_s,
                            failed,
                            since_start: false,
                            first_error: first,
                            last_error: last,
                            recovered_unix_s: Some(up),
                        };
                        self.last_episode = Some(down.clone());
                        Some(Transition::Recovered { down, at_unix_s })
                    }
                    _ => None,
                }
            }
            Err(note) => {
                let run = match self.run.take() {
                    Some((first, _, n)) => (first, note, n + 1),
                    None => (note.clone(), note, 1),
                };
                self.run = Some(run);
                if !self.down && self.run.as_ref().is_some_and(|r| r.2 >= DOWN_AFTER) {
                    self.down = true;
                    return self.current().map(Transition::Down);
                }
                None
            }
        }
    }

    /// The target's state now: down (with its errors), or `None` while it answers.
    pub fn current(&self) -> Option<Down> {
        if !self.down {
            return None;
        }
        let (first, last, failed) = self.run.clone()?;
        Some(Down {
            kind: DownKind::of(&last.error_type),
            since_unix_s: first.at_unix_s,
            failed,
            since_start: !self.ever_ok,
            first_error: first,
            last_error: last,
            recovered_unix_s: None,
        })
    }

    /// The last episode that ended (`recovered_unix_s` set), if any.
    pub fn last_episode(&self) -> Option<&Down> {
        self.last_episode.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(at: f64, t: &str) -> Result<f64, ErrorNote> {
        Err(ErrorNote {
            at_unix_s: at,
            error_type: t.to_owned(),
            message: Some(format!("{t} at {at}")),
        })
    }

    #[test]
    fn down_after_three_failures_in_a_row_and_back_at_the_first_success() {
        let mut r = Reachability::default();
        // A blip: two failures, then a success: never down.
        assert_eq!(r.observe(fail(1.0, "connection_refused")), None);
        assert_eq!(r.observe(fail(2.0, "connection_refused")), None);
        assert_eq!(r.observe(Ok(3.0)), None);
        assert_eq!(r.current(), None);
        // An outage: down at the third failure, dated from the first.
        r.observe(fail(10.0, "connection_refused"));
        r.observe(fail(12.0, "connection_refused"));
        let Some(Transition::Down(d)) = r.observe(fail(14.0, "timeout")) else {
            panic!("down at the third failure");
        };
        assert_eq!(
            (d.kind, d.since_unix_s, d.failed, d.since_start),
            (DownKind::Unreachable, 10.0, 3, false)
        );
        assert_eq!(d.first_error.error_type, "connection_refused");
        assert_eq!(d.last_error.error_type, "timeout");
        assert_eq!(
            r.observe(fail(16.0, "connection_refused")),
            None,
            "said once"
        );
        assert_eq!(r.current().map(|d| d.failed), Some(4));
        let Some(Transition::Recovered { down, at_unix_s }) = r.observe(Ok(18.0)) else {
            panic!("recovered at the first success");
        };
        assert_eq!(
            (
                down.since_unix_s,
                down.failed,
                at_unix_s,
                down.recovered_unix_s
            ),
            (10.0, 4, 16.0, Some(18.0))
        );
        assert_eq!(r.current(), None);
        assert_eq!(r.last_episode(), Some(&down));
        assert!(
            down.words().starts_with("unreachable from 00:00:10 to 00:00:18 UTC (4 canaries failed): first connection_refused"),
            "{}",
            down.words()
        );
    }

    #[test]
    fn a_target_failing_since_the_start_is_down_with_its_first_error() {
        let mut r = Reachability::default();
        for i in 0..5 {
            r.observe(fail(f64::from(i), "non_sse_reply"));
        }
        let d = r.current().expect("down");
        assert_eq!(
            (d.kind, d.since_start, d.failed, d.first_error.at_unix_s),
            (DownKind::Failing, true, 5, 0.0)
        );
        assert!(
            d.words().starts_with("failing since 00:00:00 UTC (5 canaries failed, none ok since the start): first non_sse_reply: non_sse_reply at 0; last non_sse_reply: non_sse_reply at 4"),
            "{}",
            d.words()
        );
    }
}
