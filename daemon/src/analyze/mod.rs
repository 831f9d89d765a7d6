//! Offline diagnosis: the episode corpus and the evaluation of the diagnosis engine on it.
//!
//! - [`episode`]: the episode fixture format (`lmperf-episode/1`: every signal of a target as a
//!   time series, the injected cause and its onset) and its replay through
//!   [`crate::diagnosis::Engine`], evaluated once a second like the agent.
//! - [`synth`]: synthetic episodes per cause at two magnitudes, and no-fault controls.
//! - [`busy`]: a calm, busy server (M/G/c queue with background traffic) as a control episode.
//! - [`eval`]: AC@1 / AC@3 / Avg@5, time to `root_confirmed`, control diagnoses (RCAEval).
//! - [`held_back`]: issue 28's held-back checks over a replay (onset error, contradicted
//!   scores, the TTFT decomposition's rest).
//! - [`offline`]: `lmperf analyze`: the engine over a run's `requests.jsonl`, or a live agent's
//!   `/api/v1/diagnosis`; [`prometheus`]: `--prometheus URL`, the fleet's series and the
//!   fleet view (one node, one model or every node moved); [`html`]: `scorecard.html` (evidence plots, top-3 bottleneck heatmap).
//!
//! **Architecture Invariant:** like the engine, pure apart from [`episode::Episode::load`] and the loaders of [`offline`]:
//! replays run on recorded times, never on the clock.

pub mod busy;
pub mod command;
pub mod episode;
pub mod eval;
pub mod held_back;
pub mod html;
pub mod offline;
pub mod prometheus;
pub mod synth;

#[cfg(test)]
mod tests;
