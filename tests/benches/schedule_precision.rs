//! How exactly the canary schedule dispatches on the real clock (the figures the
//! `canary::schedule` unit test cannot hold: it runs on tokio's paused clock), printed, not
//! asserted. The case `../shared/cases/sse/06_vllm_21104_arrival_drift.json`: 200 requests a
//! second with 0.45 ms of client work each (serializing a request); the spinning ticker (the
//! one `lmperf run` uses) and the coarse one (the agent's canaries) each dispatch 2,000 ticks on
//! a 2-thread runtime. Printed per ticker: each dispatch's lag behind its due time (p50, p99,
//! max) and the achieved rate (the case asks ±0.5 ms and ≥ 198 req/s; a drifting loop gets
//! 183.5). Figures from an idle machine mean what they say; beside a build they show its noise.
//!
//! `cargo bench -p lmperf-e2e --bench schedule_precision`

use std::time::Duration;

use lmperf::canary::schedule::{Gaps, Ticker};
use lmperf::config::{Arrival, Schedule};
use tokio::time::Instant;

const RATE: f64 = 200.0;
const TICKS: usize = 2000;
const WORK: Duration = Duration::from_micros(450);

/// Lags (ms, sorted) and the achieved rate of `TICKS` dispatches of `ticker`.
async fn dispatch(mut ticker: Ticker, t0: Instant) -> (Vec<f64>, f64) {
    let mut lags = Vec::with_capacity(TICKS);
    let mut last = t0;
    for _ in 0..TICKS {
        let tick = ticker.tick().await;
        last = Instant::now();
        lags.push(tick.lag.as_secs_f64() * 1e3);
        let busy = std::time::Instant::now();
        while busy.elapsed() < WORK {}
    }
    lags.sort_by(f64::total_cmp);
    let rate = (TICKS - 1) as f64 / (last - t0).as_secs_f64();
    (lags, rate)
}

fn at(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let schedule = Schedule::Rate {
        per_second: RATE,
        arrival: Arrival::Constant,
    };
    println!(
        "{TICKS} dispatches at {RATE} req/s, {} µs of client work each:",
        WORK.as_micros()
    );
    for (name, coarse) in [
        ("spinning (lmperf run)", false),
        ("coarse (agent canaries)", true),
    ] {
        let (lags, rate) = rt.block_on(async {
            let t0 = Instant::now() + Duration::from_millis(5);
            let ticker = Ticker::new(Gaps::new(schedule, 1), t0);
            let ticker = if coarse { ticker.coarse() } else { ticker };
            dispatch(ticker, t0).await
        });
        println!(
            "  {name:<24} lag p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; achieved {rate:.1} req/s",
            at(&lags, 0.5),
            at(&lags, 0.99),
            lags.last().copied().unwrap_or(f64::NAN)
        );
    }
}
