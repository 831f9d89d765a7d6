//! Profiling: the model server's own profiler called when TPOT regresses, and the
//! comparison of two profiling traces.
//!
//! `client.rs` (vLLM's and SGLang's `/start_profile` / `/stop_profile`, checked against
//! upstream), `live.rs` (per server: the policy, once per regression within `min_interval`,
//! a 404 said once; the agent's registry; stopped on shutdown), `on_fail.rs` (`--profile-on-fail`
//! of `lmperf run` / `compare`: once when a TPOT gate trips), `trace.rs` (**pure**: a
//! Chrome trace JSON as torch.profiler writes it → time per kernel, op and module),
//! `trace_diff.rs` (**pure**: two traces → per-step deltas, top regressions first).

pub mod client;
pub mod live;
pub mod on_fail;
pub mod trace;
pub mod trace_diff;

use crate::diagnosis::report::{Cause, TargetDiagnosis};
use crate::diagnosis::signal::Signal;

/// Whether a confirmed diagnosis is one the server's own profiler can explain: a cause on the
/// server's side (not the network, the clients' load, errors, or a lost GPU) with TPOT up
/// (the symptom, or TPOT evidence above its baseline).
pub fn wants_profile(d: &TargetDiagnosis) -> bool {
    let server_side = d.causes.first().is_some_and(|c| {
        !matches!(
            c.cause,
            Cause::Network | Cause::LoadSurge | Cause::ErrorBurst | Cause::GpuFault
        )
    });
    let tpot_up = d.symptom.as_ref().is_some_and(|s| s.signal == Signal::Tpot)
        || d.causes
            .iter()
            .flat_map(|c| &c.evidence)
            .any(|e| e.signal == Signal::Tpot && e.after > e.before);
    server_side && tpot_up
}
