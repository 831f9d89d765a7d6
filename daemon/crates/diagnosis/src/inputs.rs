//! What the engine is fed, from the measurements: a canary's record and a model server
//! scrape mapped to [`Signal`] values (in the signal's unit). Pure: the agent
//! (`lmperf::diagnosis_live`) and the offline analysis (`lmperf analyze`) both call them.

use lmperf_measure::{Measured, Outcome};
use lmperf_server_page::ServerSample;

use crate::Signal;

/// The canary signals of one measured request (none for a request the agent cancelled).
pub fn request_signals(m: &Measured) -> Vec<(Signal, f64)> {
    let r = &m.record;
    if r.outcome == Outcome::Cancelled {
        return Vec::new();
    }
    let failed = r.outcome != Outcome::Ok;
    let mut v = vec![
        (Signal::Error, f64::from(u8::from(failed))),
        (
            Signal::Error5xx,
            f64::from(u8::from(r.http_status.is_some_and(|s| s >= 500))),
        ),
        (
            Signal::Error429,
            f64::from(u8::from(r.http_status == Some(429))),
        ),
        (
            Signal::ErrorTimeout,
            f64::from(u8::from(r.outcome == Outcome::Timeout)),
        ),
    ];
    if !failed {
        if let Some(t) = r.ttft {
            v.push((Signal::Ttft, t.as_secs_f64()));
        }
        if let Some(t) = r.tpot {
            v.push((Signal::Tpot, t.as_secs_f64()));
        }
        v.push((Signal::E2e, r.e2e.as_secs_f64()));
    }
    if let Some(tokens) = r.input_tokens {
        v.push((Signal::InputTokens, tokens as f64));
    }
    v
}

/// The diagnosis signals of one model server scrape (fields the server lacks are absent). A
/// counter reset (restart) is not among them: the scraper logs a `restart` change event for
/// each, fed as the server change (counting both read one restart as two changes).
pub fn server_signals(s: &ServerSample) -> Vec<(Signal, f64)> {
    let pairs = [
        (Signal::ServerRequestsWaiting, s.requests_waiting),
        (Signal::ServerRequestsRunning, s.requests_running),
        (Signal::ServerKvUsage, s.kv_cache_usage),
        (Signal::ServerPreemptions, s.preemptions_per_s),
        (Signal::ServerPromptTokensRate, s.prompt_tokens_per_s),
        (
            Signal::ServerGenerationTokensRate,
            s.generation_tokens_per_s,
        ),
        (Signal::ServerRequestRate, s.requests_per_s),
        (Signal::ServerTtft, s.ttft.mean),
        (Signal::ServerQueueTime, s.queue.mean),
        (Signal::ServerPrefillTime, s.prefill.mean),
        (Signal::ServerDecodeTime, s.decode.mean),
    ];
    pairs
        .into_iter()
        .filter_map(|(sig, x)| x.map(|x| (sig, x)))
        .collect()
}
