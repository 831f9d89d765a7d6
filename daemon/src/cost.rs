//! The agent's own CPU by component, as `/api/v1/status` `agent_cost` reports it: the tasks
//! of the canaries, the page scrapes and the span export run [`metered`], which reads the
//! thread's CPU clock around each poll. The agent runs on one thread (a current-thread
//! runtime), so a poll's CPU is that task's own work; what no meter holds (the runtime, hyper's
//! connection tasks, the kernel's side of each wake-up) is the process's CPU less the sum.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

/// CPU nanoseconds spent in the polls of one component's tasks.
#[derive(Debug, Default)]
pub struct CpuMeter(AtomicU64);

impl CpuMeter {
    pub const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// The CPU time counted so far, in seconds.
    pub fn cpu_s(&self) -> f64 {
        self.0.load(Ordering::Relaxed) as f64 / 1e9
    }
}

/// The canaries' tasks (send, read, measure, record, span).
pub static CANARY: CpuMeter = CpuMeter::new();
/// The server-page scrapers' tasks (fetch, parse, publish).
pub static SCRAPE: CpuMeter = CpuMeter::new();
/// The span export tasks (batching, encoding, sending over OTLP).
pub static EXPORT: CpuMeter = CpuMeter::new();

/// The calling thread's CPU time (user + system) in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`);
/// 0 where the clock cannot be read.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// `future`, with the CPU of each of its polls added to `meter`.
pub fn metered<F: Future>(meter: &'static CpuMeter, future: F) -> Metered<F> {
    Metered {
        meter,
        future: Box::pin(future),
    }
}

/// A future whose polls are counted on a [`CpuMeter`] ([`metered`]).
pub struct Metered<F> {
    meter: &'static CpuMeter,
    future: Pin<Box<F>>,
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let t0 = thread_cpu_ns();
        let out = self.future.as_mut().poll(cx);
        let spent = thread_cpu_ns().saturating_sub(t0);
        self.meter.0.fetch_add(spent, Ordering::Relaxed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that computes for a while is counted at least that long; an idle one barely.
    #[tokio::test]
    async fn a_metered_task_counts_the_cpu_of_its_polls() {
        static BUSY: CpuMeter = CpuMeter::new();
        static IDLE: CpuMeter = CpuMeter::new();
        let spin = std::time::Duration::from_millis(30);
        metered(&BUSY, async {
            let t = std::time::Instant::now();
            while t.elapsed() < spin {
                std::hint::spin_loop();
            }
        })
        .await;
        metered(
            &IDLE,
            tokio::time::sleep(std::time::Duration::from_millis(30)),
        )
        .await;
        // A spin of 30 ms of wall time is at most 30 ms of CPU, and at least what the machine
        // gave it; the sleeping task's polls take microseconds.
        assert!(
            BUSY.cpu_s() > 0.0 && BUSY.cpu_s() <= 0.031,
            "busy {}",
            BUSY.cpu_s()
        );
        assert!(
            IDLE.cpu_s() < BUSY.cpu_s(),
            "idle {} busy {}",
            IDLE.cpu_s(),
            BUSY.cpu_s()
        );
    }
}
