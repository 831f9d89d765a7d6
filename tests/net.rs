//! eBPF network probes (issue 5), as root: run by `cargo xtask ci`, which sets
//! `LMPERF_REQUIRE_EBPF=1` when it runs as root on a kernel with BTF. Without that variable a
//! test whose probes cannot load says so and passes (a developer's unprivileged machine).
//!
//! - acceptance 1: loopback flows inside the test: RTT samples, one connect latency per
//!   connection, a retransmit forced by a full accept queue dropping a SYN;
//! - acceptance 2: canaries across a 20 ms RTT link between two namespaces the test creates
//!   (`support::netns::DelayLink`, 10 ms each way): kernel srtt ≈ 20 ms on the span, TTFT at
//!   least 20 ms above the same link without delay;
//! - acceptance 4: the agent without BPF capabilities runs and says why in the status;
//! - the agent with probes on: `lmperf_tcp_*` series on `/metrics`, `lmperf.net.*` span
//!   attributes on its canaries.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fake_opentelemetry_collector::FakeCollectorServer;
use lmperf::config::NetConfig;
use lmperf::net::event::Kind;
use lmperf::net::state::{Mode, NetState};
use lmperf_e2e::agent::{Agent, prom_sum};
use lmperf_e2e::netns::DelayLink;
use lmperf_e2e::otlp::attrs;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream, with_vllm_metrics};
use lmperf_e2e::serial;
use lmperf_e2e::temp;
use opentelemetry::metrics::MeterProvider as _;

fn required() -> bool {
    std::env::var("LMPERF_REQUIRE_EBPF").is_ok_and(|v| v == "1")
}

/// Starts the probes for `port`; `None` (after saying why) when they cannot load here and
/// the test is not required to run them.
fn probes(port: u16) -> Option<(Arc<NetState>, lmperf::net::loader::NetMonitor)> {
    let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder().build();
    let (state, monitor) = lmperf::net::start(
        &NetConfig {
            enabled: true,
            programs: Default::default(),
        },
        &[port],
        &provider.meter("net-test"),
    );
    if state.mode() != Mode::On {
        let why = state.status().reason.unwrap_or_default();
        assert!(
            !required(),
            "probes required (LMPERF_REQUIRE_EBPF=1) but off: {why}"
        );
        eprintln!("skipped: eBPF probes cannot load here: {why}");
        return None;
    }
    Some((state, monitor))
}

fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

#[test]
fn loopback_flows_report_rtt_connect_latency_and_a_forced_retransmit() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let Some((state, monitor)) = probes(port) else {
        return;
    };
    let from = SystemTime::now();

    // Three connections, 20 request/response round trips each.
    let server = {
        let listener = listener.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..3 {
                let (mut s, _) = listener.accept().unwrap();
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        })
    };
    let mut locals = Vec::new();
    for _ in 0..3 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_nodelay(true).unwrap();
        locals.push(c.local_addr().unwrap());
        let mut buf = [0u8; 5];
        for _ in 0..20 {
            c.write_all(b"hello").unwrap();
            c.read_exact(&mut buf).unwrap();
        }
    }
    server.join().unwrap();

    let client_events = |st: &NetState| {
        st.recent()
            .into_iter()
            .filter(|s| s.server.port() == port && s.at >= from)
            .collect::<Vec<_>>()
    };
    assert!(
        wait_for(Duration::from_secs(2), || {
            let ev = client_events(&state);
            locals.iter().all(|l| {
                ev.iter()
                    .any(|s| s.local == *l && matches!(s.kind, Kind::Connect { .. }))
            })
        }),
        "a connect latency for each connection: {:?}",
        client_events(&state)
    );
    let ev = client_events(&state);
    for l in &locals {
        let connects: Vec<u64> = ev
            .iter()
            .filter(|s| s.local == *l)
            .filter_map(|s| match s.kind {
                Kind::Connect { ns } => Some(ns),
                _ => None,
            })
            .collect();
        assert_eq!(connects.len(), 1, "one connect event for {l}: {connects:?}");
        assert!(
            connects[0] > 0 && connects[0] < 100_000_000,
            "loopback connect took {} ns",
            connects[0]
        );
        let rtts: Vec<u64> = ev
            .iter()
            .filter(|s| s.local == *l)
            .filter_map(|s| match s.kind {
                Kind::Rtt { srtt_us } => Some(srtt_us),
                _ => None,
            })
            .collect();
        assert!(rtts.len() >= 20, "RTT samples for {l}: {rtts:?}");
        assert!(
            rtts.iter().all(|&us| us < 50_000),
            "loopback srtt below 50 ms: {rtts:?}"
        );
    }
    let r = state.request(port, None, from, SystemTime::now());
    eprintln!("loopback: {r:?}");
    assert!(r.srtt_min.is_some() && r.connect.is_some());
    let st = state.status();
    assert!(st.events.rtt >= 120, "both ends sample RTT: {st:?}");
    assert_eq!(st.dropped, 0);

    // A full accept queue drops the next SYN; the client retransmits it after the 1 s
    // initial RTO. The second connection waits in the queue, the third's SYN is dropped.
    drop(listener);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port2 = listener.local_addr().unwrap().port();
    drop(monitor);
    let Some((state, monitor)) = probes(port2) else {
        return;
    };
    // SAFETY: a valid listening socket; listen() again only changes the backlog.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let t = Instant::now();
    let first = TcpStream::connect(("127.0.0.1", port2)).unwrap();
    let late = std::thread::spawn(move || {
        let c = TcpStream::connect_timeout(&([127, 0, 0, 1], port2).into(), Duration::from_secs(5));
        (c.map(|c| c.local_addr().unwrap()), t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let (_a, _) = listener.accept().unwrap(); // room for the retransmitted SYN
    let (late_local, took) = late.join().unwrap();
    let late_local = late_local.expect("the retransmitted SYN connects");
    assert!(
        took >= Duration::from_millis(900),
        "connected after a SYN retransmit: {took:?}"
    );
    assert!(
        wait_for(Duration::from_secs(2), || state
            .recent()
            .iter()
            .any(
                |s| s.local == late_local && matches!(s.kind, Kind::Retransmit { .. })
            )),
        "retransmit seen for {late_local}: {:?}; status {:?}",
        state.recent(),
        state.status()
    );
    let connect = state.recent().iter().find_map(|s| match s.kind {
        Kind::Connect { ns } if s.local == late_local => Some(ns),
        _ => None,
    });
    assert!(
        connect.is_some_and(|ns| ns >= 900_000_000),
        "connect latency includes the SYN retransmit: {connect:?}"
    );
    eprintln!(
        "forced retransmit: connect took {took:?}, kernel connect latency {connect:?} ns, status {:?}",
        state.status().events
    );
    drop(first);
    monitor.stop();
}

/// Twenty echo round trips to `port` on one new connection (served by `listener`).
fn round_trips(listener: &TcpListener, port: u16) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_nodelay(true).unwrap();
    let (mut s, _) = listener.accept().unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let mut buf = [0u8; 5];
    for _ in 0..20 {
        c.write_all(b"hello").unwrap();
        c.read_exact(&mut buf).unwrap();
    }
    drop(c);
    echo.join().unwrap();
}

/// The probes follow the targets (issue 24): a port added after load (a target discovered
/// after start) is reported from then on, and adding it needs no capability: the thread that
/// adds it has dropped every one of its own (Linux >= 6.5 lets a held map fd be updated
/// without one; an older kernel's refusal is said in `ports_refused`).
#[test]
fn a_target_port_added_after_start_is_reported_without_capabilities() {
    let known = TcpListener::bind("127.0.0.1:0").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let Some((state, monitor)) = probes(known.local_addr().unwrap().port()) else {
        return;
    };
    let on_port = |st: &NetState| {
        st.drain_now();
        st.recent()
            .iter()
            .filter(|s| s.server.port() == port)
            .count()
    };
    round_trips(&listener, port);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(on_port(&state), 0, "not a target port yet: not reported");

    let st = state.clone();
    std::thread::spawn(move || {
        lmperf::caps::drop_all().expect("drop this thread's capabilities");
        assert_eq!(lmperf::caps::effective().unwrap(), 0, "no capability left");
        st.follow_ports([port]);
    })
    .join()
    .unwrap();
    let status = state.status();
    assert!(status.ports.contains(&port), "{status:?}");
    if let Some(why) = &status.ports_refused {
        // A kernel before 6.5 with unprivileged BPF disabled: said, and the test says so.
        assert!(!required(), "port not followed: {why}");
        eprintln!("skipped: {why}");
        monitor.stop();
        return;
    }
    round_trips(&listener, port);
    assert!(
        wait_for(Duration::from_secs(2), || on_port(&state) > 0),
        "the new port's flow is reported: {:?}",
        state.recent()
    );
    eprintln!(
        "followed port {port}: {} samples after it was added without capabilities",
        on_port(&state)
    );
    monitor.stop();
}

fn config(extra: &str) -> std::path::PathBuf {
    temp::file(
        "net.toml",
        &format!("[canary]\nsampling_ratio = 1.0\n{extra}"),
    )
}

#[test]
fn agent_without_bpf_capabilities_runs_and_says_why() {
    let cfg = config("");
    // Root without any capability: the bpf() syscall is refused.
    let wrapper = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"];
    let port = lmperf_e2e::peers::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let agent = Agent::spawn_wrapped(
        &wrapper,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--target",
            &url,
            "--model",
            "m",
            "--interval",
            "200ms",
            "--no-otlp",
        ],
        &[],
    );
    let status = agent.wait_status(Duration::from_secs(5), |s| {
        s["targets"][0]["requests"].as_u64().unwrap_or(0) >= 3
    });
    let net = &status["net"];
    assert_eq!(net["mode"], "off", "{net}");
    let reason = net["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("CAP_BPF") || reason.contains("not built"),
        "the reason says what is missing: {reason}"
    );
    assert!(
        status["targets"][0]["requests"].as_u64().unwrap_or(0) >= 3,
        "canaries run: {status}"
    );
    let (code, metrics) = agent.get("/metrics");
    assert_eq!(code, 200);
    assert!(!metrics.contains("lmperf_tcp_rtt"), "{metrics}");
    assert_eq!(
        agent
            .stderr_text()
            .matches("eBPF network probes are off")
            .count(),
        1,
        "{}",
        agent.stderr_text()
    );
    let _ = std::fs::remove_file(cfg);
}

#[test]
fn agent_with_net_disabled_says_so() {
    let cfg = config("[net]\nenabled = false\n");
    let url = format!("http://127.0.0.1:{}", lmperf_e2e::peers::free_port());
    let agent = Agent::spawn(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--target",
            &url,
            "--model",
            "m",
            "--no-otlp",
        ],
        &[],
    );
    let net = agent.status()["net"].clone();
    assert_eq!(net["mode"], "disabled", "{net}");
    let _ = std::fs::remove_file(cfg);
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_exports_tcp_series_and_net_span_attributes() {
    let server = ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(
            3,
            Duration::from_millis(5),
            Duration::from_millis(5),
            4,
        ))
    }))
    .await;
    let mut collector = FakeCollectorServer::start().await.unwrap();
    // Model and provider configured: no discovery request opens the connection before the
    // first canary, so that canary's span carries the connect latency.
    let cfg = config("provider = \"openai\"\n");
    let (url, endpoint) = (server.url(), collector.endpoint());
    let agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(
            &[
                "--config",
                cfg.to_str().unwrap(),
                "--target",
                &url,
                "--model",
                "m",
                "--interval",
                "200ms",
                "--otlp-protocol",
                "grpc",
                "--otlp-endpoint",
                &endpoint,
            ],
            &[],
        )
    })
    .await
    .unwrap();
    let status = agent.status();
    if status["net"]["mode"] != "on" {
        assert!(!required(), "probes required but off: {}", status["net"]);
        eprintln!("skipped: {}", status["net"]);
        return;
    }
    let mut spans = Vec::new();
    let t = Instant::now();
    while spans.len() < 5 && t.elapsed() < Duration::from_secs(10) {
        spans.extend(
            collector
                .exported_spans(usize::MAX, Duration::from_millis(300))
                .await,
        );
    }
    assert!(spans.len() >= 5, "{} spans", spans.len());
    let a: Vec<_> = spans.iter().map(|s| attrs(&s.attributes)).collect();
    for s in &a {
        let samples: u64 = s
            .get("lmperf.net.rtt.samples")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(samples >= 1, "RTT samples during the request: {s:?}");
        let (min, max): (f64, f64) = (
            s["lmperf.net.srtt.min"].parse().unwrap(),
            s["lmperf.net.srtt.max"].parse().unwrap(),
        );
        assert!(
            min > 0.0 && min <= max && max < 0.05,
            "loopback srtt {min}..{max} s"
        );
        assert_eq!(s["lmperf.net.retransmits"], "0");
    }
    let connected = a
        .iter()
        .filter(|s| s.contains_key("lmperf.net.connect.duration"))
        .count();
    assert!(
        connected >= 1,
        "the span of the request that connected carries the connect latency: {a:?}"
    );

    let (code, metrics) = tokio::task::spawn_blocking(move || agent.get("/metrics"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    let port = server
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    let port_label = format!("server_port=\"{port}\"");
    assert!(
        prom_sum(
            &metrics,
            "lmperf_tcp_rtt_seconds_count",
            &[&port_label, "lmperf_tcp_side=\"client\""]
        ) >= 5.0,
        "{metrics}"
    );
    assert!(
        prom_sum(
            &metrics,
            "lmperf_tcp_rtt_seconds_count",
            &[&port_label, "lmperf_tcp_side=\"server\""]
        ) >= 5.0,
        "{metrics}"
    );
    assert!(
        prom_sum(
            &metrics,
            "lmperf_tcp_connect_duration_seconds_count",
            &[&port_label]
        ) >= 1.0,
        "{metrics}"
    );
    assert!(
        prom_sum(
            &metrics,
            "lmperf_tcp_probe_events_total",
            &["lmperf_tcp_event=\"rtt\""]
        ) >= 10.0,
        "{metrics}"
    );
}

/// The DaemonSet's minimal set: CAP_BPF and CAP_PERFMON attach every probe (uid 0, every
/// other capability dropped); CAP_BPF alone loads maps but not tracing programs.
#[test]
fn cap_bpf_and_cap_perfmon_are_enough() {
    let url = format!("http://127.0.0.1:{}", lmperf_e2e::peers::free_port());
    let args = ["--target", url.as_str(), "--model", "m", "--no-otlp"];
    let both = Agent::spawn_wrapped(
        &[
            "setpriv",
            "--inh-caps=-all",
            "--bounding-set=-all,+bpf,+perfmon",
            "--",
        ],
        &args,
        &[],
    );
    let net =
        both.wait_status(Duration::from_secs(5), |s| s["net"]["mode"] != "starting")["net"].clone();
    if net["mode"] != "on" && !required() {
        eprintln!("skipped: {net}");
        return;
    }
    assert_eq!(net["mode"], "on", "{net}");
    assert!(
        net["probes"]
            .as_array()
            .is_some_and(|p| p.len() == 3 && p.iter().all(|p| p["live"] == true)),
        "{net}"
    );
    let bpf_only = Agent::spawn_wrapped(
        &[
            "setpriv",
            "--inh-caps=-all",
            "--bounding-set=-all,+bpf",
            "--",
        ],
        &args,
        &[],
    );
    let net =
        bpf_only.wait_status(Duration::from_secs(5), |s| s["net"]["mode"] != "starting")["net"]
            .clone();
    assert_eq!(net["mode"], "off", "{net}");
    assert!(
        net["reason"]
            .as_str()
            .is_some_and(|r| r.contains("tp_btf/tcp_probe")),
        "{net}"
    );
}

/// The spans of `n` canaries from an agent in namespace `a` to a scripted server in namespace
/// `b`, across a [`DelayLink`] of `one_way` each direction, with the probes on (`probes`) or
/// disabled in the configuration, and the agent's last status; `None` when namespaces or
/// probes cannot be had here (not root) and the test is not required.
fn canaries_across(
    one_way: Duration,
    n: usize,
    probes: bool,
) -> Option<(
    Vec<std::collections::BTreeMap<String, String>>,
    serde_json::Value,
)> {
    let link = match DelayLink::new(one_way) {
        Ok(l) => l,
        Err(e) => {
            assert!(
                !required(),
                "namespaces and TUN required (LMPERF_REQUIRE_EBPF=1): {e}"
            );
            eprintln!("skipped: cannot build a delay link here: {e}");
            return None;
        }
    };
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let bind = std::net::SocketAddr::new(link.addr_b.into(), 0);
    // The first token leaves as soon as the request arrives: TTFT is the link plus the stacks.
    let server = link.b.spawn(move || {
        lmperf_e2e::netns::realtime(); // its response carries the ACK that the client's RTT sample ends on
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let s = ScriptedServer::start_at(
                bind,
                Arc::new(|_, _| {
                    // A vLLM-style server: its own TTFT (0.5 ms) rides on the last chunk.
                    Reply::sse(with_vllm_metrics(
                        chat_stream(3, Duration::ZERO, Duration::from_millis(2), 4),
                        0.5,
                        0.0,
                    ))
                }),
                None,
            )
            .await;
            addr_tx.send(s.addr).unwrap();
            let _ = done_rx.await;
        })
    });
    let server_addr = addr_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let spans = link.a.run(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut collector = rt.block_on(FakeCollectorServer::start()).unwrap();
        let cfg = config(if probes {
            "provider = \"openai\"\n"
        } else {
            "provider = \"openai\"\n[net]\nenabled = false\n"
        });
        let url = format!("http://{server_addr}");
        let endpoint = collector.endpoint();
        let agent = Agent::spawn(
            &[
                "--config",
                cfg.to_str().unwrap(),
                "--target",
                &url,
                "--model",
                "m",
                "--interval",
                "200ms",
                "--otlp-protocol",
                "grpc",
                "--otlp-endpoint",
                &endpoint,
            ],
            &[],
        );
        let net = agent.status()["net"].clone();
        if probes && net["mode"] != "on" {
            assert!(!required(), "probes required but off: {net}");
            eprintln!("skipped: {net}");
            return None;
        }
        let spans = rt.block_on(async {
            let mut spans = Vec::new();
            let t = Instant::now();
            while spans.len() < n && t.elapsed() < Duration::from_secs(15) {
                spans.extend(
                    collector
                        .exported_spans(usize::MAX, Duration::from_millis(300))
                        .await,
                );
            }
            spans
        });
        let _ = std::fs::remove_file(cfg);
        Some((
            spans
                .iter()
                .map(|s| attrs(&s.attributes))
                .collect::<Vec<_>>(),
            agent.status(),
        ))
    });
    let _ = done_tx.send(());
    server.join().unwrap();
    spans
}

fn secs(a: &std::collections::BTreeMap<String, String>, key: &str) -> f64 {
    a.get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} missing: {a:?}"))
}

/// Acceptance 2. The delay is 10 ms each way, so the round trip is 20 ms longer (as
/// `tc netem delay 20ms` on one end would make it): kernel srtt within 20 ± 3 ms on every span
/// and TTFT at least 20 ms above that of the same link without delay (the smallest of 8
/// against the smallest of 24: the floor of each, which a busy machine does not lower).
#[test]
fn canary_across_a_20ms_rtt_link_sees_it_in_kernel_rtt_and_ttft() {
    let _serial = serial::lock_blocking();
    const TTFT: &str = "gen_ai.response.time_to_first_chunk";
    // More canaries without delay: their smallest TTFT is the floor the delayed ones stand on,
    // and a busy machine only ever raises a sample (a floor taken over 8 was 1 ms high once).
    let Some((base, _)) = canaries_across(Duration::ZERO, 24, true) else {
        return;
    };
    let Some((delayed, _)) = canaries_across(Duration::from_millis(10), 8, true) else {
        return;
    };
    assert!(
        base.len() >= 24 && delayed.len() >= 8,
        "{} and {} spans",
        base.len(),
        delayed.len()
    );
    for s in &base {
        assert!(
            secs(s, "lmperf.net.srtt.max") < 0.005,
            "no delay: srtt below 5 ms: {s:?}"
        );
    }
    for s in &delayed {
        assert_eq!(s["lmperf.net.source"], "ebpf");
        let (min, max) = (
            secs(s, "lmperf.net.srtt.min"),
            secs(s, "lmperf.net.srtt.max"),
        );
        assert!(
            (0.017..=0.023).contains(&min) && (0.017..=0.023).contains(&max),
            "kernel srtt {min}..{max} s on a 20 ms RTT link: {s:?}"
        );
    }
    let min = |v: &[std::collections::BTreeMap<String, String>]| {
        v.iter()
            .map(|s| secs(s, TTFT))
            .fold(f64::INFINITY, f64::min)
    };
    let (ttft_base, ttft_delayed) = (min(&base), min(&delayed));
    eprintln!(
        "smallest TTFT {:.2} ms without delay, {:.2} ms across 20 ms RTT; kernel srtt max {:?}",
        ttft_base * 1e3,
        ttft_delayed * 1e3,
        delayed
            .iter()
            .map(|s| &s["lmperf.net.srtt.max"])
            .collect::<Vec<_>>()
    );
    // One round trip more, within the 1 ms the two paths' timers and processing may differ by
    // (seen: +19.993 ms on a 20.0 ms link).
    assert!(
        ttft_delayed - ttft_base >= 0.019,
        "TTFT {ttft_delayed} s vs {ttft_base} s without delay"
    );
    // The server's own TTFT holds (it says 0.5 ms on both paths); the client − server gap
    // takes the round trip.
    for s in base.iter().chain(&delayed) {
        assert_eq!(secs(s, "lmperf.server.request.ttft"), 0.0005, "{s:?}");
    }
    let gap = |v: &[std::collections::BTreeMap<String, String>]| {
        v.iter()
            .map(|s| secs(s, "lmperf.server.request.client_minus_server_ttft"))
            .fold(f64::INFINITY, f64::min)
    };
    let (gap_base, gap_delayed) = (gap(&base), gap(&delayed));
    assert!(
        gap_delayed - gap_base >= 0.019,
        "client − server TTFT {gap_delayed} s vs {gap_base} s without delay"
    );
}

/// The TCP_INFO fallback: with the probes disabled, each span carries one `getsockopt(TCP_INFO)`
/// reading of the canary's own connection (source `tcp_info`), 20 ± 3 ms across the 20 ms
/// RTT link, and the status says where the values come from.
#[test]
fn tcp_info_fallback_reads_the_canary_connection_rtt_when_probes_are_disabled() {
    let _serial = serial::lock_blocking();
    let Some((spans, status)) = canaries_across(Duration::from_millis(10), 4, false) else {
        return;
    };
    assert!(spans.len() >= 4, "{} spans", spans.len());
    eprintln!(
        "TCP_INFO srtt {:?}",
        spans
            .iter()
            .map(|s| &s["lmperf.net.srtt.max"])
            .collect::<Vec<_>>()
    );
    for s in &spans {
        assert_eq!(
            s.get("lmperf.net.source").map(String::as_str),
            Some("tcp_info"),
            "{s:?}"
        );
        assert_eq!(s["lmperf.net.rtt.samples"], "1");
        let srtt = secs(s, "lmperf.net.srtt.max");
        assert!(
            (0.017..=0.023).contains(&srtt),
            "TCP_INFO srtt {srtt} s on a 20 ms RTT link: {s:?}"
        );
        assert!(
            !s.contains_key("lmperf.net.retransmits"),
            "TCP_INFO gives no per-request retransmits: {s:?}"
        );
    }
    let net = &status["net"];
    assert_eq!(net["mode"], "disabled", "{net}");
    assert_eq!(net["source"], "tcp_info", "{net}");
    assert!(net["tcp_info_samples"].as_u64().unwrap_or(0) >= 4, "{net}");
}

fn status_field(pid: u32, task: &str, field: &str) -> String {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/task/{task}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// Item of the issue: after loading the probes the agent drops every capability (all its
/// threads: effective, permitted, ambient empty, `no_new_privs` set), and the probes it
/// attached before keep delivering events.
#[test]
fn agent_drops_its_capabilities_after_start_and_probes_still_deliver() {
    let own = u64::from_str_radix(
        &status_field(
            std::process::id(),
            &std::process::id().to_string(),
            "CapEff:",
        ),
        16,
    )
    .unwrap_or(0);
    if own == 0 {
        assert!(!required(), "root with capabilities required");
        eprintln!("skipped: this test process has no capability to drop");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(
            3,
            Duration::from_millis(2),
            Duration::from_millis(2),
            4,
        ))
    })));
    let cfg = config("provider = \"openai\"\n");
    let agent = Agent::spawn(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--target",
            &server.url(),
            "--model",
            "m",
            "--interval",
            "100ms",
            "--no-otlp",
        ],
        &[],
    );
    let net = agent.wait_status(Duration::from_secs(5), |s| s["net"]["mode"] != "starting")["net"]
        .clone();
    if net["mode"] != "on" {
        assert!(!required(), "probes required but off: {net}");
        eprintln!("skipped: {net}");
        return;
    }
    let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", agent.pid()))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        tasks.len() >= 3,
        "the runtime and probe threads run: {tasks:?}"
    );
    for t in &tasks {
        for f in ["CapEff:", "CapPrm:", "CapInh:", "CapAmb:"] {
            assert_eq!(
                status_field(agent.pid(), t, f),
                "0000000000000000",
                "{f} of thread {t} (ours: {own:x})"
            );
        }
        assert_eq!(
            status_field(agent.pid(), t, "NoNewPrivs:"),
            "1",
            "thread {t}"
        );
    }
    let rtt = |s: &serde_json::Value| s["net"]["events"]["rtt"].as_u64().unwrap_or(0);
    let before = rtt(&agent.status());
    let after = rtt(&agent.wait_status(Duration::from_secs(5), |s| rtt(s) >= before + 20));
    assert!(
        after >= before + 20,
        "RTT events after the drop: {before} then {after}"
    );
    assert!(
        agent.stderr_text().contains("Capabilities dropped"),
        "{}",
        agent.stderr_text()
    );
    let _ = std::fs::remove_file(cfg);
}

/// The classic tracepoint twins (what `programs = "auto"` falls back to, probe by probe, when a
/// kernel refuses `tp_btf`), chosen with `programs = "tracepoint"`, in a private mount namespace
/// with tracefs mounted (they need it): every probe live as `tracepoint/...`, events flow.
#[test]
fn classic_tracepoints_deliver_events_when_chosen() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(
            3,
            Duration::from_millis(2),
            Duration::from_millis(2),
            4,
        ))
    })));
    let cfg = config("provider = \"openai\"\n[net]\nprograms = \"tracepoint\"\n");
    let with_tracefs = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        "mount -t tracefs tracefs /sys/kernel/tracing && exec \"$0\" \"$@\"",
    ];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(!required(), "root required");
        eprintln!("skipped: mounting tracefs needs root");
        return;
    }
    let agent = Agent::spawn_wrapped(
        &with_tracefs,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--target",
            &server.url(),
            "--model",
            "m",
            "--interval",
            "100ms",
            "--no-otlp",
        ],
        &[],
    );
    let net = agent.wait_status(Duration::from_secs(5), |s| s["net"]["mode"] != "starting")["net"]
        .clone();
    if net["mode"] != "on" {
        assert!(!required(), "probes required but off: {net}");
        eprintln!("skipped: {net}");
        return;
    }
    let probes = net["probes"].as_array().cloned().unwrap_or_default();
    assert_eq!(probes.len(), 3, "{net}");
    for p in &probes {
        assert_eq!(p["live"], true, "{net}");
        assert!(
            p["attach"]
                .as_str()
                .is_some_and(|a| a.starts_with("tracepoint/"))
                && p["program"].as_str().is_some_and(|n| n.ends_with("_tp")),
            "{net}"
        );
    }
    let ev = |s: &serde_json::Value, k: &str| s["net"]["events"][k].as_u64().unwrap_or(0);
    let s = agent.wait_status(Duration::from_secs(5), |s| {
        ev(s, "rtt") >= 20 && ev(s, "connect") >= 1
    });
    assert!(
        ev(&s, "rtt") >= 20 && ev(&s, "connect") >= 1,
        "events through the classic tracepoints: {}",
        s["net"]
    );
    let _ = std::fs::remove_file(cfg);
}
