//! `lmperf ctl`'s flags ([`CtlArgs`], clap) converted into the plain
//! [`crate::control::client::CtlRequest`] the control client runs.

use super::{CtlArgs, CtlCommand};
use crate::control::client::{CtlCall, CtlRequest};

impl From<CtlArgs> for CtlRequest {
    fn from(a: CtlArgs) -> Self {
        let call = match a.command {
            CtlCommand::Status => CtlCall::Status,
            CtlCommand::Diagnose { target, window } => CtlCall::Diagnose { target, window },
            CtlCommand::Recent {
                limit,
                target,
                outcome,
                source,
            } => CtlCall::Recent {
                limit,
                target,
                outcome,
                source,
            },
            CtlCommand::Inject {
                target,
                rate,
                duration,
                concurrency,
                max_requests,
                arrival,
                trace_file,
                trace_speedup,
                trace_format,
                p99_threshold,
                profile,
                output_tokens,
                watch,
            } => CtlCall::Inject {
                target,
                rate,
                duration,
                concurrency,
                max_requests,
                arrival,
                trace_file,
                trace_speedup,
                trace_format,
                p99_threshold,
                profile,
                output_tokens,
                watch,
            },
            CtlCommand::UpdateLoad { id, profile } => CtlCall::UpdateLoad { id, profile },
            CtlCommand::Stop { id } => CtlCall::Stop { id },
        };
        Self {
            addr: a.addr,
            token_file: a.token_file,
            json: a.json,
            call,
        }
    }
}
