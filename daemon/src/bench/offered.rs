//! What a benchmark's schedule offered against what went out (`summary.json` `offered`):
//! requests due within the run, sent, sent late, never sent, and why (issue 54: a profile run
//! of 30 s showed 90 requests and nothing of the ~150 due that never went out). GuideLLM
//! reports over-saturation the same way; `vllm bench serve` hides the client's wait
//! (vllm #54101).
//!
//! The dispatcher counts ([`Dispatch`]) as it sends; a request is due when its scheduled
//! time falls within the run (its `--duration`, or every request without one); it is never
//! sent when the run ended before a slot freed for it; it is late when it went out more than
//! the bound after its scheduled time (an open-loop schedule only: a closed loop sends each
//! request when a slot frees, so it is never late). Why: the concurrency cap when it waited
//! for a slot, the client when it was late with a slot free (its pacer or its CPU behind).

use serde::Serialize;
use tokio::time::Instant;

/// The least lateness bound, ms: a send this much after its time is late whatever the rate.
pub const LATE_FLOOR_MS: f64 = 100.0;

/// [`late_bound_ms`] as a duration.
pub fn late_bound(closed_loop: bool, rate: Option<f64>) -> Option<std::time::Duration> {
    late_bound_ms(closed_loop, rate).map(|ms| std::time::Duration::from_secs_f64(ms / 1000.0))
}

/// The lateness bound of a schedule, ms ([`Offered::late_bound_ms`]): the mean gap at
/// `rate`, at least [`LATE_FLOOR_MS`]; `None` for a closed loop.
pub fn late_bound_ms(closed_loop: bool, rate: Option<f64>) -> Option<f64> {
    (!closed_loop).then(|| rate.map_or(LATE_FLOOR_MS, |r| (1000.0 / r).max(LATE_FLOOR_MS)))
}

/// The dispatcher's counts of one benchmark run (summed over `--repeat` runs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dispatch {
    /// Scheduled within the run.
    pub due: usize,
    /// Due, never sent: the run ended first.
    pub never_sent: usize,
    /// Sent late while waiting for a slot (the concurrency cap held them back).
    pub late_for_a_slot: usize,
    /// Sent late with a slot free (the client could not keep the schedule).
    pub late_with_a_slot: usize,
}

impl Dispatch {
    /// One send: due at `due`, a slot asked for at `asked`, freed at `free_since`, out at
    /// `sent`; counted late beyond `bound` (`None`: a closed loop, never late), for a slot
    /// when it waited for one.
    pub fn sent(
        &mut self,
        (due, asked, free_since, sent): (Instant, Instant, Instant, Instant),
        bound: Option<std::time::Duration>,
    ) {
        if bound.is_some_and(|b| sent.duration_since(due) > b) {
            if free_since > asked {
                self.late_for_a_slot += 1;
            } else {
                self.late_with_a_slot += 1;
            }
        }
    }

    /// The next request of the schedule is due; when the run has `ended`, it is never sent
    /// (returns true: skip it).
    pub fn due_unless_ended(&mut self, ended: bool) -> bool {
        self.due += 1;
        self.unsent_if(ended)
    }

    /// A due request found the run `ended` (its slot came too late): never sent (returns
    /// true: skip it).
    pub fn unsent_if(&mut self, ended: bool) -> bool {
        self.never_sent += usize::from(ended);
        ended
    }

    /// Adds `other` (another repeat).
    pub fn add(&mut self, other: Dispatch) {
        self.due += other.due;
        self.never_sent += other.never_sent;
        self.late_for_a_slot += other.late_for_a_slot;
        self.late_with_a_slot += other.late_with_a_slot;
    }
}

/// `summary.json` `offered`: the schedule against the sends.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Offered {
    /// Requests scheduled within the run.
    pub due: usize,
    /// Of those, sent.
    pub sent: usize,
    /// Of those, never sent: the run ended before a slot freed for them.
    pub never_sent: usize,
    /// Sent more than `late_bound_ms` after their scheduled time.
    pub late: usize,
    /// The lateness bound, ms: the mean gap between sends at the offered rate, at least
    /// 100 ms; `null` for a closed loop (never late).
    pub late_bound_ms: Option<f64>,
    /// Why the schedule was not kept, when it was not: `concurrency cap` (requests waited
    /// for a slot), `client` (late with a slot free), `server backpressure` (the server
    /// refused with 429 or 503).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_back_by: Option<&'static str>,
}

impl Offered {
    /// From the dispatcher's counts, `late_bound_ms`, and whether the server pushed back
    /// (answers 429 or 503).
    pub fn of(d: Dispatch, late_bound_ms: Option<f64>, backpressure: bool) -> Self {
        let late = d.late_for_a_slot + d.late_with_a_slot;
        let behind = d.never_sent > 0 || late > 0;
        let held_back_by = if !behind {
            None
        } else if backpressure {
            Some("server backpressure")
        } else if d.late_for_a_slot >= d.late_with_a_slot || d.never_sent > late {
            Some("concurrency cap")
        } else {
            Some("client")
        };
        Offered {
            due: d.due,
            sent: d.due - d.never_sent.min(d.due),
            never_sent: d.never_sent,
            late,
            late_bound_ms,
            held_back_by,
        }
    }

    /// The warning line when the schedule was not kept; `None` when it was.
    pub fn warning(&self, benchmark: &str, concurrency: usize) -> Option<String> {
        let why = self.held_back_by?;
        let what = match why {
            "concurrency cap" => {
                format!("the concurrency cap ({concurrency}) held them back: raise --batch-sizes")
            }
            "server backpressure" => {
                "the server refused requests (429 or 503): it is saturated".to_owned()
            }
            _ => "the client could not keep the schedule (its CPU or pacer behind)".to_owned(),
        };
        let late = match self.late_bound_ms {
            Some(b) if self.late > 0 => format!(
                ", {} sent more than {} late",
                self.late,
                crate::fmt::duration_ms(b)
            ),
            _ => String::new(),
        };
        Some(format!(
            "lmperf run: warning: {benchmark}: {} of {} due requests sent, {} never sent{late}: {what}",
            self.sent, self.due, self.never_sent
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cap that held 150 of 240 back; a client late with slots free; a kept schedule.
    #[test]
    fn the_reason_follows_the_counts() {
        let capped = Offered::of(
            Dispatch {
                due: 240,
                never_sent: 150,
                late_for_a_slot: 80,
                late_with_a_slot: 0,
            },
            Some(100.0),
            false,
        );
        assert_eq!(
            (capped.sent, capped.late, capped.held_back_by),
            (90, 80, Some("concurrency cap"))
        );
        assert_eq!(
            capped.warning("profile", 1).as_deref(),
            Some(
                "lmperf run: warning: profile: 90 of 240 due requests sent, 150 never sent, 80 sent more than 100 ms late: the concurrency cap (1) held them back: raise --batch-sizes"
            )
        );
        let client = Offered::of(
            Dispatch {
                due: 100,
                never_sent: 0,
                late_for_a_slot: 1,
                late_with_a_slot: 9,
            },
            Some(100.0),
            false,
        );
        assert_eq!(client.held_back_by, Some("client"));
        let refused = Offered::of(
            Dispatch {
                due: 100,
                never_sent: 3,
                ..Dispatch::default()
            },
            None,
            true,
        );
        assert_eq!(refused.held_back_by, Some("server backpressure"));
        let kept = Offered::of(
            Dispatch {
                due: 100,
                ..Dispatch::default()
            },
            Some(100.0),
            false,
        );
        assert_eq!((kept.sent, kept.held_back_by), (100, None));
        assert_eq!(kept.warning("c1", 1), None);
    }
}
