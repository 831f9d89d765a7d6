//! The held-back checks of issue 28 over a replay, printed by `cargo xtask diagnose-eval`
//! ([`super::eval::onset_lines`], [`super::eval::held_back_summary`]):
//!
//! - the onset error: the share of fault episodes whose onset lies within [`ONSET_TOLERANCE_S`]
//!   of the injected fault, and those outside;
//! - no cause scores ≥ 0.5 while a contradicting server signal holds
//!   ([`crate::diagnosis::contradict`]; the cause carries a `contradicted:` evidence): the
//!   highest such score over every evaluation;
//! - the TTFT decomposition's `unexplained_s` ≥ 0, or said why not: the smallest one seen, and
//!   how many decompositions whose parts exceed the extra TTFT carry no note;
//! - the sentence the on-call reads does not put the cause well after the spike it caused:
//!   the first cause's first evidence changed at most [`ONSET_TOLERANCE_S`] after the onset.

use serde::Serialize;

use crate::diagnosis::{Cause, TargetDiagnosis};

/// How far the engine's onset may lie from the injected fault (s).
pub const ONSET_TOLERANCE_S: f64 = 5.0;

/// What one replay showed of the held-back checks, over every evaluation of every target.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HeldBack {
    /// The highest score of a cause that carried a `contradicted:` evidence, its cause and the
    /// episode offset (s) of that evaluation.
    pub contradicted_max: Option<(f64, Cause, f64)>,
    /// TTFT decompositions seen, the smallest `unexplained_s`, those whose parts exceed the
    /// client's extra TTFT, and those of them without a note saying why.
    pub decompositions: usize,
    pub unexplained_min_s: Option<f64>,
    pub over_explained: usize,
    pub over_explained_unsaid: usize,
}

impl HeldBack {
    /// Takes one evaluation of one target at `offset_s` into account.
    pub fn observe(&mut self, t: &TargetDiagnosis, offset_s: f64) {
        for c in &t.causes {
            let contradicted = c.evidence.iter().any(|e| {
                e.rule
                    .as_deref()
                    .is_some_and(|r| r.starts_with("contradicted"))
            });
            if contradicted && self.contradicted_max.is_none_or(|(s, _, _)| c.score > s) {
                self.contradicted_max = Some((c.score, c.cause, offset_s));
            }
        }
        if let Some(d) = &t.ttft_decomposition {
            self.decompositions += 1;
            self.unexplained_min_s = Some(
                self.unexplained_min_s
                    .map_or(d.unexplained_s, |m| m.min(d.unexplained_s)),
            );
            let parts = d.server_queue_s.unwrap_or(0.0)
                + d.server_prefill_s.unwrap_or(0.0)
                + d.network_s.unwrap_or(0.0);
            if parts > d.extra_s {
                self.over_explained += 1;
                if d.note.is_none() {
                    self.over_explained_unsaid += 1;
                }
            }
        }
    }
}
