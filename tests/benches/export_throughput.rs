//! How many spans per second the agent's export path sustains to a real local OTLP receiver
//! (rotel, blackhole exporter, gRPC), and the CPU it spends per 1,000 spans (building the
//! spans included). Prints figures; not a test. `cargo bench -p lmperf-e2e --bench export_throughput`.

use std::time::{Duration, Instant};

use lmperf::sampler::adaptive::Reason;
use lmperf::telemetry::export::SpanQueue;
use lmperf_e2e::peers::{QuietCollector, free_port};
use lmperf_e2e::spans::{SpanFactory, cpu_time};
use opentelemetry_otlp::WithExportConfig;

async fn run(grpc: u16, capacity: usize, batch: usize, concurrency: usize, seconds: u64) {
    let exporters = (0..concurrency)
        .map(|_| {
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(format!("http://127.0.0.1:{grpc}"))
                .with_timeout(Duration::from_secs(10))
                .build()
                .expect("exporter")
        })
        .collect();
    let q = SpanQueue::start_many(exporters, capacity, batch, Duration::from_secs(10));
    let factory = SpanFactory::default();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let mut produced = 0u64;
    while t0.elapsed() < Duration::from_secs(seconds) {
        // Keep the queue fed but not overflowing: offer spans only while it has room.
        if q.snapshot().queue_len + 256 <= capacity {
            for _ in 0..256 {
                q.enqueue(factory.span(Reason::Base), Reason::Base);
                produced += 1;
            }
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let elapsed = t0.elapsed();
    q.shutdown(Duration::from_secs(10)).await;
    let cpu = cpu_time() - cpu0;
    let s = q.snapshot();
    println!(
        "queue {capacity:>5} batch {batch:>5} concurrency {concurrency}: exported {:>8} spans in {:.1} s = {:>8.0} spans/s; dropped {}, failed {}; CPU {:.2} s = {:.2} ms per 1,000 spans (produced {produced})",
        s.exported,
        elapsed.as_secs_f64(),
        s.exported as f64 / elapsed.as_secs_f64(),
        s.dropped_queue_full,
        s.failed,
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1000.0 * 1000.0 / s.exported.max(1) as f64,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = std::env::var("LMPERF_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let (grpc, http) = (free_port(), free_port());
    let _collector = tokio::task::spawn_blocking(move || QuietCollector::start(grpc, http))
        .await
        .expect("collector");
    let factory = SpanFactory::default();
    let t = Instant::now();
    let c = cpu_time();
    let n = 100_000;
    for _ in 0..n {
        std::hint::black_box(factory.span(Reason::Base));
    }
    println!(
        "building one span (about 30 attributes): {:.2} µs wall, {:.2} ms CPU per 1,000",
        t.elapsed().as_secs_f64() * 1e6 / n as f64,
        (cpu_time() - c).as_secs_f64() * 1e6 / n as f64
    );
    println!(
        "export path -> rotel (blackhole) over OTLP/gRPC on 127.0.0.1:{grpc}, {seconds} s per configuration, 2 worker threads"
    );
    // The agent's defaults first (2048 / 512 / 2), then larger settings.
    for (capacity, batch, concurrency) in [
        (2048, 512, 1),
        (2048, 512, 2),
        (8192, 2048, 2),
        (8192, 1024, 4),
        (16384, 2048, 4),
    ] {
        run(grpc, capacity, batch, concurrency, seconds).await;
    }
}
