//! The export path against a dead collector: `../shared/cases/other/13_otel_rust_956_collector_down.json`
//! as an automated test, shortened from 10 s to 5 s at the same 20,000 spans/s, alone in its
//! own process (it measures the process).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lmperf::sampler::adaptive::Reason;
use lmperf::telemetry::export::SpanQueue;
use lmperf_e2e::spans::{SpanFactory, cpu_time, rss_kib};
use opentelemetry_otlp::WithExportConfig;

/// Counts WARN lines written by the agent's code.
#[derive(Clone, Default)]
struct Warns(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Warns {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut g) = self.0.lock() {
            g.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort_unstable();
    v[((v.len() as f64 * p).ceil() as usize)
        .saturating_sub(1)
        .min(v.len() - 1)]
}

/// Runs alone in a child process ([`lmperf_e2e::own_process`]): it reads this process's CPU
/// time, RSS and log lines, which tests running beside it in the e2e binary would add to.
#[test]
fn case_13_otel_rust_956_collector_down() {
    if !lmperf_e2e::own_process::here("export::case_13_otel_rust_956_collector_down") {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(collector_down());
}

async fn collector_down() {
    let case = lmperf_e2e::case("other/13_otel_rust_956_collector_down.json");
    let (input, want) = (&case["input"], &case["expected"]);
    let logs = Warns::default();
    let sink = logs.clone();
    let _ = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .try_init();

    let batch = &input["batch"];
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(input["otlp_endpoint"].as_str().unwrap())
        .with_timeout(Duration::from_millis(
            batch["export_timeout_ms"].as_u64().unwrap(),
        ))
        .build()
        .unwrap();
    let capacity = batch["max_queue_size"].as_u64().unwrap() as usize;
    let q = SpanQueue::start(
        exporter,
        capacity,
        batch["max_export_batch_size"].as_u64().unwrap() as usize,
        Duration::from_millis(batch["export_timeout_ms"].as_u64().unwrap()),
    );
    let factory = SpanFactory::default();
    let rate = input["load"]["spans_per_sec"].as_f64().unwrap();
    let duration = Duration::from_secs(5);
    let total = (rate * duration.as_secs_f64()) as usize;

    let rss0 = rss_kib();
    let mut span_end = Vec::with_capacity(total);
    let t0 = Instant::now();
    for i in 0..total {
        // Absolute schedule: span i ends at t0 + i / rate.
        let due = t0 + Duration::from_secs_f64(i as f64 / rate);
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        let s = Instant::now();
        q.enqueue(factory.span(Reason::Base), Reason::Base);
        span_end.push(s.elapsed());
        if i % 1000 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let load_time = t0.elapsed();
    let p99 = pct(span_end, 0.99);
    assert!(
        p99.as_micros() as u64 <= want["span_end_p99_us_max"].as_u64().unwrap(),
        "span end p99 {p99:?}"
    );
    assert!(
        load_time < duration + Duration::from_secs(1),
        "the load kept its rate: {load_time:?}"
    );

    // No busy loop while the collector stays down: the export task idles in backoff.
    let cpu0 = cpu_time();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_cpu = cpu_time() - cpu0;
    assert!(
        idle_cpu < Duration::from_millis(200),
        "{idle_cpu:?} of CPU in 2 s idle: busy loop?"
    );

    let snap = q.snapshot();
    let growth_mb = (rss_kib() as f64 - rss0 as f64) / 1024.0;
    assert!(
        growth_mb < want["rss_growth_mb_max"].as_f64().unwrap(),
        "RSS grew {growth_mb:.1} MB"
    );
    // Scaled from the case's 197,952 of 200,000: every span the queue cannot hold is lost and
    // counted, either dropped at the full queue or failed in a batch sent to the dead port.
    let min_lost = total - capacity;
    let lost = (snap.dropped_queue_full + snap.failed) as usize;
    assert!(lost >= min_lost, "lost {lost} of {total}: {snap:?}");
    assert_eq!(snap.exported, 0);
    assert!(snap.export_errors >= 1 && snap.last_error.is_some());

    let t = Instant::now();
    q.shutdown(Duration::from_secs(5)).await;
    assert!(
        t.elapsed().as_millis() as u64 <= want["shutdown_returns_within_ms"].as_u64().unwrap(),
        "shutdown took {:?}",
        t.elapsed()
    );
    let snap = q.snapshot();
    assert_eq!(
        snap.enqueued,
        snap.dropped_queue_full + snap.failed + snap.exported,
        "every span accounted for: {snap:?}"
    );

    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    let warns = text.lines().filter(|l| l.contains("WARN")).count();
    assert!(
        warns as u64 <= want["warn_logs_max"].as_u64().unwrap(),
        "{warns} warnings:\n{text}"
    );
}
