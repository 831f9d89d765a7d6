//! The episode format, the AC@k arithmetic, and a short subset of the corpus through the engine
//! (the whole corpus: `cargo xtask diagnose-eval`).

use super::episode::{Episode, EpisodeError, FORMAT, Outcome, replay};
use super::eval::{report, table};
use super::synth::{self, Control, Magnitude};
use crate::diagnosis::{Cause, EngineConfig};

#[test]
fn an_episode_survives_its_file_and_bad_files_name_the_field() {
    let ep = synth::fault(Cause::Network, Magnitude::Mild, 1);
    let text = serde_json::to_string(&ep).unwrap();
    let back = Episode::parse(&text, "x.json").unwrap();
    assert_eq!(back, ep);
    assert_eq!(
        back.onset_unix_s(),
        Some(synth::START_UNIX_S + synth::CALM_S)
    );
    // The signals carry their stable names.
    let s = &back.series[synth::TARGET];
    assert!(
        s.contains_key("net_srtt") && s.contains_key("error_5xx"),
        "{:?}",
        s.keys()
    );

    let bad = text.replacen(FORMAT, "lmperf-episode/9", 1);
    let e = Episode::parse(&bad, "x.json").unwrap_err();
    assert!(matches!(e, EpisodeError::Format { .. }));
    assert_eq!(
        e.to_string(),
        "x.json: format = \"lmperf-episode/9\": expected \"lmperf-episode/1\""
    );
    let bad = text.replacen("\"net_srtt\"", "\"net_rtt\"", 1);
    assert_eq!(
        Episode::parse(&bad, "x.json").unwrap_err().to_string(),
        "x.json: series.vllm-0.net_rtt: not a signal name (see diagnosis::Signal)"
    );
    let bad = text.replacen("\"target\":\"vllm-0\"", "\"target\":\"vllm-9\"", 1);
    assert_eq!(
        Episode::parse(&bad, "x.json").unwrap_err().to_string(),
        "x.json: target = \"vllm-9\": no series for it"
    );
}

fn outcome(name: &str, cause: Option<Cause>, ranking: &[Cause], ttd: Option<f64>) -> Outcome {
    Outcome {
        name: name.to_owned(),
        cause,
        magnitude: None,
        ranking: ranking.to_vec(),
        time_to_confirmed_s: ttd,
        confirmed_evaluations: usize::from(ttd.is_some()),
        triggered_evaluations: usize::from(!ranking.is_empty()),
        warning_evaluations: 0,
        time_to_warning_s: None,
        onset_error_s: None,
        first_confirmed: None,
        top_lead_s: None,
        root_onset_errors_s: Vec::new(),
        first_evidence: None,
        canary_gap_s: None,
        held_back: Default::default(),
    }
}

#[test]
fn ac_at_k_counts_the_rank_of_the_injected_cause() {
    use Cause::*;
    let outs = vec![
        outcome("a", Some(Network), &[Network, ErrorBurst], Some(20.0)),
        outcome(
            "b",
            Some(Network),
            &[ErrorBurst, LoadSurge, Network],
            Some(40.0),
        ),
        outcome("c", Some(Network), &[], None),
        outcome(
            "d",
            Some(LoadSurge),
            &[ServerQueueing, LoadSurge],
            Some(10.0),
        ),
        outcome("e", None, &[], None),
        outcome("f", None, &[Unknown], Some(5.0)),
    ];
    let r = report(&outs);
    let net = r.rows.iter().find(|x| x.cause == Some(Network)).unwrap();
    assert_eq!((net.episodes, net.confirmed), (3, 2));
    assert!((net.ac1 - 1.0 / 3.0).abs() < 1e-12);
    assert!((net.ac3 - 2.0 / 3.0).abs() < 1e-12);
    // Avg@5 = (1/3 + 1/3 + 2/3 + 2/3 + 2/3) / 5.
    assert!((net.avg5 - 8.0 / 15.0).abs() < 1e-12);
    assert_eq!(net.median_time_to_confirmed_s, Some(30.0));
    assert_eq!(r.total.episodes, 4);
    assert!((r.total.ac1 - 0.25).abs() < 1e-12);
    assert!((r.total.ac3 - 0.75).abs() < 1e-12);
    assert_eq!(r.total.median_time_to_confirmed_s, Some(20.0));
    assert_eq!(
        (r.controls, r.control_diagnoses, r.control_triggered),
        (2, 1, 1)
    );
    let t = table(&r);
    assert!(
        t.contains("network                       3   0.33   0.67"),
        "{t}"
    );
    assert!(t.contains("controls: 2 episodes, 1 diagnosed"), "{t}");
    assert!(t.contains("  c → nothing"), "{t}");
}

/// A short subset: one episode per latency part (TTFT: network; both: load; errors: a GPU
/// fault) and a calm control; the engine must name each cause first within 60 s and stay idle
/// in the control.
#[test]
fn the_engine_names_the_injected_cause_on_a_corpus_subset() {
    let cfg = EngineConfig::default();
    for (cause, m) in [
        (Cause::Network, Magnitude::Strong),
        (Cause::LoadSurge, Magnitude::Strong),
        (Cause::GpuFault, Magnitude::Mild),
    ] {
        let o = replay(&synth::fault(cause, m, 1), cfg);
        assert_eq!(o.rank(), Some(1), "{o:?}");
        let ttd = o.time_to_confirmed_s.unwrap_or(f64::INFINITY);
        assert!((0.0..=60.0).contains(&ttd), "{o:?}");
    }
    let o = replay(&synth::control(Control::Calm, 1), cfg);
    assert_eq!(
        (o.triggered_evaluations, o.confirmed_evaluations),
        (0, 0),
        "{o:?}"
    );
}

/// A run directory of two benchmarks, 1 request/s for 10 min: `calm`, and `burst` whose server
/// answers 503 to 60 % of the requests from 360 s on. (At 40 % the engine concludes `unknown`:
/// it compares per-second medians, and the median of a 0/1 flag under 50 % is 0.)
fn write_run(dir: &std::path::Path) {
    use std::fmt::Write as _;
    let mut s = String::new();
    let mut x: u64 = 0x2545_f491;
    let mut noise = || {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        0.9 + 0.2 * ((x >> 11) as f64 / (1u64 << 53) as f64)
    };
    for bench in ["calm", "burst"] {
        for i in 0..600 {
            let send = f64::from(i) * 1000.0;
            let failed = bench == "burst" && i >= 360 && i % 5 < 3;
            let line = if failed {
                serde_json::json!({"schema_version": 1, "benchmark": bench, "index": i, "repeat": 0,
                    "send_ms": send, "e2el_ms": 4.0 * noise(), "ttft_ms": null, "tpot_ms": null,
                    "outcome": "error", "error_type": "503", "http_status": 503, "prompt_tokens": 100})
            } else {
                let (ttft, tpot) = (60.0 * noise(), 12.0 * noise());
                serde_json::json!({"schema_version": 1, "benchmark": bench, "index": i, "repeat": 0,
                    "send_ms": send, "e2el_ms": ttft + 31.0 * tpot, "ttft_ms": ttft, "tpot_ms": tpot,
                    "outcome": "ok", "http_status": 200, "prompt_tokens": 100, "input_tokens": 100})
            };
            let _ = writeln!(s, "{line}");
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("requests.jsonl"), s).unwrap();
}

#[test]
fn analyze_names_the_error_burst_of_a_run_and_draws_its_scorecard() {
    let dir = std::env::temp_dir().join(format!("lmperf-analyze-{}", std::process::id()));
    write_run(&dir);
    let a = super::offline::analyze_run(&dir, None).unwrap();
    let by = |n: &str| a.diagnosis.targets.iter().find(|t| t.target == n).unwrap();
    let calm = by("calm");
    assert_eq!(
        calm.state,
        crate::diagnosis::report::State::Idle,
        "{calm:?}"
    );
    let burst = by("burst");
    assert_eq!(burst.state.as_str(), "root_confirmed", "{burst:?}");
    let top = &burst.causes[0];
    assert_eq!(top.cause, Cause::ErrorBurst, "{burst:?}");
    let ev = top
        .evidence
        .iter()
        .find(|e| e.signal == crate::diagnosis::Signal::Error)
        .unwrap();
    assert_eq!(ev.before, 0.0);
    // The onset is the 360th second of the run (within the engine's CUSUM slack).
    let onset =
        burst.onset_unix_s.unwrap() - a.series["burst"][&crate::diagnosis::Signal::Ttft][0][0];
    assert!(
        (340.0..=375.0).contains(&onset),
        "onset {onset} s into the run"
    );
    // The heatmap has 30 s slices with the error group hot after the onset, none before.
    let slices = &a.timeline["burst"];
    assert_eq!(slices.len(), 21, "{slices:?}"); // 600 s and the last second
    assert!(slices[..11].iter().all(|s| s.scores.is_empty()));
    assert!(
        slices[13].scores[&Cause::ErrorBurst] >= 0.75,
        "{:?}",
        slices[13]
    );
    let html = super::html::render(&a);
    assert!(
        html.contains(
            r#"<section class="target" data-target="burst" data-state="root_confirmed">"#
        )
    );
    assert!(html.contains(r#"<tr data-cause="error_burst""#), "{html}");
    assert!(html.contains(r#"<td class="hm top" data-cause="error_burst""#));
    assert!(html.contains("top-3 bottleneck heatmap") && html.contains("<svg"));
    assert!(!html.contains("<script"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Recorded live episodes the engine does not diagnose yet (issue 28), kept in the corpus as
/// the misses they are, checked to still miss so that a fix shows here and the entry goes. None
/// now: the CPU hog on a node whose PSI was already at its ceiling is named by the server's own
/// CPU wait (`server_cpu_wait`), the surge on llama.cpp by its queue (`diagnosis::backlog`).
const KNOWN_LIVE_MISSES: [&str; 0] = [];

/// Recorded live episodes of two faults (issue 28, item 3), by the start of their names: the
/// episode's `cause` injected first, then this second cause. A surge on llama.cpp (no request
/// counter: its queue says the arrivals, `diagnosis::backlog`) and 503s that reach the
/// detector first, while the surge's canaries still queue.
const CONCURRENT_LIVE: [(&str, Cause); 1] = [(
    "live-load_surge-then-error_burst-llamacpp-",
    Cause::ErrorBurst,
)];

/// Seconds after the onset a concurrent episode's two roots must be confirmed within.
const CONCURRENT_WITHIN_S: f64 = 90.0;

/// A concurrent episode: the first cause in the top three at the first `root_confirmed` (AC@3),
/// and within [`CONCURRENT_WITHIN_S`] both confirmed as roots, in causal order, leading the
/// ranking.
fn assert_concurrent(ep: &Episode, o: &Outcome, second: Cause) {
    let first = ep.cause.expect("a fault episode");
    assert!(o.rank().is_some_and(|r| r <= 3), "{o:?}");
    let onset = ep.onset_unix_s().expect("an onset");
    let mut both: Option<f64> = None;
    super::episode::replay_with(ep, EngineConfig::default(), |off, d| {
        let since = ep.start_unix_s + off - onset;
        for t in d.targets.iter().filter(|t| t.target == ep.target) {
            let lead: Vec<Cause> = t.causes.iter().take(2).map(|c| c.cause).collect();
            if both.is_none()
                && (0.0..=CONCURRENT_WITHIN_S).contains(&since)
                && t.roots == [first, second]
                && lead == [first, second]
            {
                both = Some(since);
            }
        }
    });
    assert!(
        both.is_some(),
        "{}: {first:?} then {second:?} never both roots in causal order within {CONCURRENT_WITHIN_S} s: {o:?}",
        ep.name
    );
}

/// The recorded live episodes of `tests/fixtures/episodes/` (`cargo xtask diagnose-eval
/// --live`): the engine names each injected cause first, within 60 s of the onset, and never
/// leaves idle in a control; [`KNOWN_LIVE_MISSES`] aside, and [`CONCURRENT_LIVE`] as
/// [`assert_concurrent`] says.
#[test]
fn recorded_live_episodes_are_diagnosed() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/episodes");
    let eps = Episode::load_dir(&dir).unwrap();
    let live: Vec<_> = eps.iter().filter(|e| e.source == "live").collect();
    assert!(!live.is_empty(), "no live episode in {}", dir.display());
    let mut concurrent = 0;
    for ep in live {
        let o = replay(ep, EngineConfig::default());
        if ep.cause.is_none() {
            assert_eq!(
                (o.triggered_evaluations, o.confirmed_evaluations),
                (0, 0),
                "{o:?}"
            );
            continue;
        }
        if KNOWN_LIVE_MISSES.contains(&ep.name.as_str()) {
            assert_ne!(o.rank(), Some(1), "a known miss is diagnosed now: {o:?}");
            continue;
        }
        if let Some((_, second)) = CONCURRENT_LIVE
            .iter()
            .find(|(prefix, _)| ep.name.starts_with(prefix))
        {
            assert_concurrent(ep, &o, *second);
            concurrent += 1;
            continue;
        }
        assert_eq!(o.rank(), Some(1), "{o:?}");
        let ttd = o.time_to_confirmed_s.unwrap_or(f64::INFINITY);
        assert!((0.0..=60.0).contains(&ttd), "{o:?}");
    }
    assert!(concurrent >= 1, "no concurrent live episode");
}

/// A run of one benchmark, 1 request/s for 10 min, whose client TTFT goes from 60 ms to
/// 600 ms at 360 s while the server's queue fills (waiting 0 → 25, queue time 10 ms → 500 ms)
/// at a steady request and token rate; `server_samples.jsonl` as `lmperf run` writes it
/// (a scrape a second, through `write_samples`).
fn write_queued_run(dir: &std::path::Path, with_server: bool) {
    use std::fmt::Write as _;
    use std::time::{Duration, SystemTime};
    let mut s = String::new();
    let mut rows = Vec::new();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_500_000);
    for i in 0..600u32 {
        let send = f64::from(i) * 1000.0;
        let late = i >= 360;
        let ttft = if late { 600.0 } else { 60.0 } + f64::from(i % 7);
        let tpot = 12.0 + f64::from(i % 3) * 0.1;
        let line = serde_json::json!({"schema_version": 1, "benchmark": "queued", "index": i, "repeat": 0,
            "send_ms": send, "e2el_ms": ttft + 31.0 * tpot, "ttft_ms": ttft, "tpot_ms": tpot,
            "outcome": "ok", "http_status": 200, "prompt_tokens": 100, "input_tokens": 100});
        let _ = writeln!(s, "{line}");
        let lat = |mean: f64| crate::server::LatencyStats {
            mean: Some(mean),
            p50: Some(mean),
            p99: Some(mean * 1.5),
            count: 1.0,
            ..Default::default()
        };
        rows.push(crate::bench::server::ServerSampleRow {
            schema_version: 1,
            benchmark: "queued".into(),
            t_ms: send,
            sample: crate::server::ServerSample {
                at: t0 + Duration::from_secs(u64::from(i)),
                requests_waiting: Some(if late { 25.0 } else { 0.0 }),
                requests_running: Some(8.0),
                kv_cache_usage: Some(0.4),
                preemptions_per_s: Some(0.0),
                prefix_cache_hit_ratio: None,
                prompt_tokens_per_s: Some(100.0),
                generation_tokens_per_s: Some(32.0),
                requests_per_s: Some(1.0),
                ttft: lat(if late { 0.55 } else { 0.05 }),
                itl: lat(0.012),
                queue: lat(if late { 0.5 } else { 0.01 }),
                prefill: lat(0.04),
                decode: lat(0.012),
                router_kv_hit_rate: Default::default(),
                router_kv_transfer: Default::default(),
                router_picks: Vec::new(),
                picker_pool: None,
                pool_load: None,
                interval_s: Some(1.0),
                reset: false,
            },
        });
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("requests.jsonl"), s).unwrap();
    if with_server {
        crate::bench::server::write_samples(dir, &rows).unwrap();
    }
}

#[test]
fn analyze_feeds_a_runs_server_samples_to_the_engine() {
    use crate::diagnosis::Signal;
    let base = std::env::temp_dir().join(format!("lmperf-analyze-server-{}", std::process::id()));
    let (with, without) = (base.join("with"), base.join("without"));
    write_queued_run(&with, true);
    write_queued_run(&without, false);
    let a = super::offline::analyze_run(&with, None).unwrap();
    // The scrapes are on the benchmark's timeline, one a second, as written.
    let waiting = &a.series["queued"][&Signal::ServerRequestsWaiting];
    assert_eq!(waiting.len(), 600);
    let t0 = a.series["queued"][&Signal::Ttft][0][0];
    assert_eq!(
        (waiting[360][0] - waiting[0][0], waiting[360][1]),
        (360.0, 25.0)
    );
    // Requests are placed at their end (send + E2EL: 60 + 31 × 12 ms for the first), scrapes
    // at their read.
    assert!(
        (waiting[0][0] - t0 + 0.432).abs() < 1e-6,
        "{} vs {t0}",
        waiting[0][0]
    );
    let d = a
        .diagnosis
        .targets
        .iter()
        .find(|t| t.target == "queued")
        .unwrap();
    let top = &d.causes[0];
    assert_eq!(top.cause, Cause::ServerQueueing, "{d:?}");
    assert!(
        top.evidence
            .iter()
            .any(|e| e.signal == Signal::ServerRequestsWaiting
                || e.signal == Signal::ServerQueueTime),
        "{top:?}"
    );
    // Without the file, the same requests cannot name the server's queue.
    let b = super::offline::analyze_run(&without, None).unwrap();
    assert!(!b.series["queued"].contains_key(&Signal::ServerRequestsWaiting));
    let d = b
        .diagnosis
        .targets
        .iter()
        .find(|t| t.target == "queued")
        .unwrap();
    assert!(
        d.causes
            .first()
            .is_none_or(|c| c.cause != Cause::ServerQueueing),
        "{d:?}"
    );
    // A broken line names the file, the line and the field.
    let mut text = std::fs::read_to_string(with.join("server_samples.jsonl")).unwrap();
    text.push_str("{\"schema_version\":1,\"benchmark\":\"queued\",\"t_ms\":5}\n");
    std::fs::write(with.join("server_samples.jsonl"), text).unwrap();
    let e = super::offline::analyze_run(&with, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("server_samples.jsonl:601") && e.contains("`at`"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// `lmperf run` writes the GPU samples of each benchmark (`gpu_samples.jsonl`); analyze feeds
/// them to the engine: a run whose decode slowed while GPU memory filled names
/// `gpu_memory_pressure`, the same requests without the file do not.
#[test]
fn analyze_feeds_a_runs_gpu_samples_to_the_engine() {
    use crate::diagnosis::Signal;
    use std::fmt::Write as _;
    let base = std::env::temp_dir().join(format!("lmperf-analyze-gpu-{}", std::process::id()));
    let (with, without) = (base.join("with"), base.join("without"));
    let mut s = String::new();
    let mut rows = Vec::new();
    for i in 0..600u32 {
        let send = f64::from(i) * 1000.0;
        let late = i >= 360;
        let ttft = 60.0 + f64::from(i % 7);
        let tpot = if late { 30.0 } else { 12.0 } + f64::from(i % 3) * 0.1;
        let line = serde_json::json!({"schema_version": 1, "benchmark": "b", "index": i, "repeat": 0,
            "send_ms": send, "e2el_ms": ttft + 31.0 * tpot, "ttft_ms": ttft, "tpot_ms": tpot,
            "outcome": "ok", "http_status": 200, "prompt_tokens": 100, "input_tokens": 100});
        let _ = writeln!(s, "{line}");
        let signals = [
            ("gpu_memory_utilization", if late { 0.99 } else { 0.60 }),
            ("gpu_sm_clock", 1.98e9),
            ("gpu_throttle", 0.0),
            ("gpu_foreign_processes", 1.0),
            ("gpu_fault", 0.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        rows.push(crate::bench::vram::GpuSampleRow {
            schema_version: 1,
            benchmark: "b".into(),
            t_ms: send,
            signals,
        });
    }
    for dir in [&with, &without] {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("requests.jsonl"), &s).unwrap();
    }
    crate::bench::vram::write_samples(&with, &rows).unwrap();
    let a = super::offline::analyze_run(&with, None).unwrap();
    let mem = &a.series["b"][&Signal::GpuMemoryUtilization];
    assert_eq!((mem.len(), mem[0][1], mem[599][1]), (600, 0.60, 0.99));
    let d = a
        .diagnosis
        .targets
        .iter()
        .find(|t| t.target == "b")
        .unwrap();
    assert_eq!(d.causes[0].cause, Cause::GpuMemoryPressure, "{d:?}");
    let b = super::offline::analyze_run(&without, None).unwrap();
    assert!(!b.series["b"].contains_key(&Signal::GpuMemoryUtilization));
    let d = b
        .diagnosis
        .targets
        .iter()
        .find(|t| t.target == "b")
        .unwrap();
    assert!(
        d.causes
            .first()
            .is_none_or(|c| c.cause != Cause::GpuMemoryPressure),
        "{d:?}"
    );
    // A broken line names the file and the line.
    std::fs::write(with.join("gpu_samples.jsonl"), "{\"schema_version\":1}\n").unwrap();
    let e = super::offline::analyze_run(&with, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gpu_samples.jsonl:1") && e.contains("not a GPU sample"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&base);
}

#[tokio::test]
async fn an_agent_that_refuses_says_so_and_what_to_check() {
    // A port nothing listens on: bind, note the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let e = super::offline::analyze_agent(&addr, None)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "agent {addr}: GET http://{addr}/api/v1/diagnosis: connection refused; is the agent running, with admin_addr there? (--agent HOST:PORT names another)"
        )
    );
}

#[test]
fn a_busy_server_without_a_request_counter_is_never_a_load_surge() {
    // Issue 28: on a server without a request counter (llama.cpp) the arrivals are read from
    // its queue (`diagnosis::backlog`); a busy server's ordinary queueing, with its throughput
    // as ever, must not read as more arrivals. The busy and heavy controls with their
    // `server_request_rate` removed: no confirmation, `load_surge` never 0.5.
    use super::busy::{self, BusyConfig};
    let mut eps: Vec<Episode> = (1..=3)
        .map(|v| busy::episode(&BusyConfig::default(), v))
        .collect();
    eps.extend((1..=8).map(busy::heavy_episode));
    for mut ep in eps {
        for sigs in ep.series.values_mut() {
            assert!(sigs.remove("server_request_rate").is_some(), "{}", ep.name);
        }
        let mut surge = 0.0_f64;
        super::episode::replay_with(&ep, EngineConfig::default(), |_, d| {
            for t in &d.targets {
                for c in t.causes.iter().filter(|c| c.cause == Cause::LoadSurge) {
                    surge = surge.max(c.score);
                }
            }
        });
        let o = replay(&ep, EngineConfig::default());
        assert_eq!(
            o.confirmed_evaluations, 0,
            "{}: {:?}",
            ep.name, o.first_confirmed
        );
        assert!(surge < 0.5, "{}: load_surge {surge}", ep.name);
    }
}

#[test]
fn a_calm_busy_server_is_never_diagnosed() {
    // Issue 28, item 0: a server kept about half busy by background traffic queues a canary now
    // and then (10 ms → 0.5 s); two or three such blips in a row read as a 40 × jump and
    // `unknown 1.00` was confirmed 2 s after triggering. No evaluation may confirm a cause.
    use super::busy::{self, BusyConfig};
    let cfg = BusyConfig::default();
    let mut queued_all = 0;
    for variant in 1..=5 {
        let (share, skipped) = busy::busy_share(&cfg, variant);
        assert!((0.4..=0.6).contains(&share), "busy share {share:.2}");
        assert!(skipped < 0.2, "skipped {skipped:.2}");
        let ep = busy::episode(&cfg, variant);
        // The scenario holds the blips the issue describes: canaries queued ≥ 10 × the median.
        let mut ttft: Vec<f64> = ep.series[synth::TARGET]["ttft"]
            .iter()
            .map(|p| p[1])
            .collect();
        ttft.sort_by(f64::total_cmp);
        let median = ttft[ttft.len() / 2];
        queued_all += ttft.iter().filter(|&&v| v >= 10.0 * median).count();
        let o = replay(&ep, EngineConfig::default());
        assert_eq!(
            o.confirmed_evaluations, 0,
            "{}: confirmed {:?} ({} evaluations not idle)",
            ep.name, o.first_confirmed, o.triggered_evaluations
        );
    }
    assert!(queued_all >= 20, "{queued_all} queued canaries in 5 runs");
    // Heavier busy servers (few slots held by long answers or prompts, queues of seconds): the
    // queue and the full batch are their ordinary tail, never a root (6 of 15 confirmed
    // `server_queueing` or `load_surge` before the ordinary-tail checks).
    for variant in 1..=8 {
        let cfg = BusyConfig::heavy(variant);
        let ep = busy::heavy_episode(variant);
        let waits = ep.series[synth::TARGET]["server_requests_waiting"]
            .iter()
            .filter(|p| p[1] >= 1.0)
            .count();
        assert!(waits >= 5, "{}: {waits} scrapes with a queue", ep.name);
        let o = replay(&ep, EngineConfig::default());
        assert_eq!(
            o.confirmed_evaluations, 0,
            "{} ({} slots, {} rps): confirmed {:?}",
            ep.name, cfg.slots, cfg.background_rps, o.first_confirmed
        );
    }
}

#[test]
fn analyze_names_a_fault_on_most_of_a_nodes_targets_once_at_node_scope() {
    // Issue 28, item 4, offline: node n1 runs three targets, two of them slowed by a node CPU
    // hog at the same second; node n2 runs two, one slowed alone. n1's fault is one node-level
    // diagnosis linked to its two targets; n2's stays its target's (1 of 2 < 2/3).
    use std::collections::BTreeMap;

    use super::offline::analyze_episode_placed;
    use crate::diagnosis::node_scope::Placement;
    use crate::diagnosis::report::{Scope, State};
    let hog = |v| synth::fault(Cause::NodeCpuPressure, Magnitude::Strong, v);
    let calm = synth::control(Control::Calm, 1);
    let of = |e: &Episode| e.series[synth::TARGET].clone();
    let mut ep = hog(1);
    ep.series = BTreeMap::from([
        ("n1/a".to_owned(), of(&hog(1))),
        ("n1/b".to_owned(), of(&hog(2))),
        ("n1/c".to_owned(), of(&calm)),
        ("n2/d".to_owned(), of(&hog(3))),
        ("n2/e".to_owned(), of(&calm)),
    ]);
    let place = |t: &str| Placement {
        node: t.split_once('/').map(|(n, _)| n.to_owned()),
        gpus: None,
    };
    let a = analyze_episode_placed(&ep, None, "test".to_owned(), &place);
    let d = &a.diagnosis;
    assert_eq!(d.nodes.len(), 1, "{:#?}", d.nodes);
    let n = &d.nodes[0];
    assert_eq!(
        (
            n.node.as_str(),
            n.scope,
            n.state,
            n.cause,
            n.targets.clone(),
            n.node_targets
        ),
        (
            "n1",
            Scope::Node,
            State::RootConfirmed,
            Cause::NodeCpuPressure,
            vec!["n1/a".to_owned(), "n1/b".to_owned()],
            3
        )
    );
    assert!(n.score >= 0.75, "{n:#?}");
    let onset = n.onset_unix_s.unwrap() - (synth::START_UNIX_S + synth::CALM_S);
    assert!((-5.0..=10.0).contains(&onset), "node onset {onset:+.0} s");
    let t = |name: &str| d.targets.iter().find(|t| t.target == name).unwrap();
    for name in ["n1/a", "n1/b"] {
        assert_eq!(
            (t(name).scope, t(name).node.as_deref(), t(name).state),
            (Scope::Node, Some("n1"), State::RootConfirmed),
            "{name}"
        );
    }
    assert_eq!(
        (t("n1/c").scope, t("n1/c").state),
        (Scope::Target, State::Idle)
    );
    let d2 = t("n2/d");
    assert_eq!(
        (d2.scope, d2.node.as_deref(), d2.state, d2.causes[0].cause),
        (
            Scope::Target,
            None,
            State::RootConfirmed,
            Cause::NodeCpuPressure
        )
    );
    // In the JSON and the text.
    let json = serde_json::to_value(d).unwrap();
    assert_eq!(json["nodes"][0]["scope"], "node");
    assert_eq!(json["nodes"][0]["targets"][1], "n1/b");
    let linked: Vec<&str> = json["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["scope"] == "node")
        .map(|t| t["target"].as_str().unwrap())
        .collect();
    assert_eq!(linked, ["n1/a", "n1/b"]);
    let text = crate::diagnosis::scorecard::text(d);
    assert!(
        text.starts_with("node n1  root_confirmed  node_cpu_pressure 0.")
            && text.contains("on 2 of 3 targets (n1/a, n1/b)"),
        "{text}"
    );
}

#[test]
fn the_40ms_network_episodes_leave_every_other_episode_in_its_half() {
    use super::eval::{Half, split};
    // The network group of the corpus (2 variants per magnitude) and its recorded episodes.
    let existing = [
        "network-mild-1",
        "network-mild-2",
        "network-strong-1",
        "network-strong-2",
        "live-network-delaylink-60ms-1",
        "live-network-delaylink-80ms-1",
    ];
    let added: Vec<String> = synth::NETWORK_DELAY_VARIANTS
        .iter()
        .map(|v| synth::network_delay(synth::NETWORK_DELAY_40MS_S, *v).name)
        .collect();
    let before = split(&existing, |n| (*n, Some(Cause::Network)));
    let all: Vec<&str> = existing
        .iter()
        .copied()
        .chain(added.iter().map(String::as_str))
        .collect();
    let after = split(&all, |n| (*n, Some(Cause::Network)));
    assert_eq!(&after[..existing.len()], &before[..], "{all:?}");
    let holdout = after[existing.len()..]
        .iter()
        .filter(|h| **h == Half::Holdout)
        .count();
    assert_eq!(holdout, added.len() / 2, "{added:?}: {after:?}");
}

#[test]
fn a_40ms_round_trip_is_confirmed_as_network_within_30_s() {
    // The kernel RTT +40 ms on a kept-alive connection: the canary TTFT +40 ms, under the 50 ms
    // floor and under 1.5 × its p99 (issue 28's held-back kind).
    let ep = synth::network_delay(synth::NETWORK_DELAY_40MS_S, 1);
    let o = replay(&ep, EngineConfig::default());
    assert_eq!(o.rank(), Some(1), "{o:?}");
    let ttd = o.time_to_confirmed_s.expect("confirmed");
    assert!(ttd <= 30.0, "confirmed {ttd} s after the delay");
    let err = o.onset_error_s.expect("onset");
    assert!(err.abs() <= 5.0, "onset error {err} s");
    assert!(
        o.held_back.contradicted_max.is_none_or(|c| c.0 < 0.5),
        "{o:?}"
    );
}

/// The eval's reasons next to an onset outside 5 s: the first sample outside its calm range
/// (a mild error burst's first error came 7 s after the injection) and the span in which no
/// canary ended (every slot held by canaries queued behind a surge).
#[test]
fn an_onset_outside_the_tolerance_says_when_the_fault_first_showed() {
    let mut ep = synth::fault(Cause::ErrorBurst, Magnitude::Mild, 1);
    let on = ep.onset_offset_s.expect("a fault");
    let s = ep.series.get_mut(synth::TARGET).expect("target");
    // Keep only the canaries' error flags: 0 before, one error 7.2 s after, 0 after it; no
    // canary ends between +0.5 and +7.2.
    s.retain(|k, _| k == "error");
    let flags = s.get_mut("error").expect("error");
    flags.retain(|p| p[0] < on + 0.5 || p[0] >= on + 7.2);
    for p in flags.iter_mut() {
        p[1] = if (p[0] - (on + 7.2)).abs() < 0.6 {
            1.0
        } else {
            0.0
        };
    }
    flags.push([on + 7.2, 1.0]);
    flags.sort_by(|a, b| a[0].total_cmp(&b[0]));
    let (signal, at) = ep.first_evidence().expect("the first error");
    assert_eq!(signal, "error");
    assert!((7.0..7.8).contains(&at), "{at}");
    let (from, to) = ep.canary_gap().expect("a gap");
    assert!(from < 0.5 && (7.0..7.8).contains(&to), "{from} {to}");
    // A control has neither.
    let c = synth::control(Control::Calm, 1);
    assert_eq!((c.first_evidence(), c.canary_gap()), (None, None));
    // Printed next to the onset error.
    let mut o = outcome(
        "error_burst-mild-1",
        Some(Cause::ErrorBurst),
        &[Cause::ErrorBurst],
        Some(17.0),
    );
    o.onset_error_s = Some(7.0);
    o.first_evidence = Some((signal, at));
    let lines = super::eval::onset_lines(&[o]);
    assert!(
        lines.contains("outside: error_burst-mild-1 onset error +7 s (the first sample outside its calm range: error at +7."),
        "{lines}"
    );
}
