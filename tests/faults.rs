//! Faults: each gets the right outcome and `error.type`, and none panics. Per-request faults
//! go through the agent's client over real loopback sockets; the ones about scheduling,
//! exporting and shutdown run the real `lmperf` binary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lmperf::canary::client::{self, CanaryRequest, Clients, Measured};
use lmperf::config::{self, Api, Env, Overrides, TargetConfig, raw::RawCanary};
use lmperf::measure::Outcome;
use lmperf_e2e::agent::{Agent, prom_sum};
use lmperf_e2e::scripted::{Frame, Reply, ScriptedServer, chat_stream};
use lmperf_e2e::temp;
use tokio_util::sync::CancellationToken;

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

fn target(url: &str, timeout: Duration) -> TargetConfig {
    let o = Overrides {
        targets: vec![url.to_owned()],
        canary: RawCanary {
            model: Some("m".into()),
            timeout: Some(timeout),
            ..RawCanary::default()
        },
        ..Overrides::default()
    };
    config::load(o, &NoEnv).expect("config").targets.remove(0)
}

const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

async fn one(clients: &Clients, t: &TargetConfig) -> Measured {
    let req = CanaryRequest {
        api: Api::Chat,
        model: "m",
        prompt: "hi",
        max_tokens: 8,
        traceparent: TP,
        extra_body: None,
    };
    client::execute(clients, t, &req, &CancellationToken::new()).await
}

async fn measure(reply: Reply, timeout: Duration) -> Measured {
    let server = ScriptedServer::start(Arc::new(move |_, _| reply.clone())).await;
    let t = target(&server.url(), timeout);
    one(&Clients::new(t.connect_timeout).unwrap(), &t).await
}

fn error_type(m: &Measured) -> &str {
    m.record
        .error
        .as_ref()
        .map(|e| e.error_type.as_str())
        .unwrap_or("-")
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

#[tokio::test]
async fn target_refuses_connections() {
    let port = lmperf_e2e::peers::free_port();
    let t = target(&format!("http://127.0.0.1:{port}"), Duration::from_secs(5));
    let m = one(&Clients::new(t.connect_timeout).unwrap(), &t).await;
    assert_eq!(
        (m.record.outcome, error_type(&m)),
        (Outcome::Error, "connection_refused")
    );
    assert_eq!(m.retries, 0, "a refused connection is not a stale one");
}

#[tokio::test]
async fn target_accepts_and_never_answers_times_out() {
    let m = measure(Reply::Hang, ms(800)).await;
    assert_eq!(
        (m.record.outcome, error_type(&m)),
        (Outcome::Timeout, "timeout")
    );
    let e2e = m.record.e2e.as_secs_f64();
    assert!(
        (0.75..1.5).contains(&e2e),
        "timed out after {e2e} s, deadline 0.8 s"
    );
}

#[tokio::test]
async fn http_429_500_503_with_json_error_body() {
    for (status, body) in [
        (
            429,
            r#"{"error":{"message":"Rate limit reached","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#,
        ),
        (
            500,
            r#"{"error":{"code":500,"message":"CUDA error: out of memory","type":"server_error"}}"#,
        ),
        (
            503,
            r#"{"object":"error","message":"The server is overloaded","type":"ServiceUnavailableError","code":503}"#,
        ),
    ] {
        let m = measure(Reply::json(status, body), Duration::from_secs(5)).await;
        let e = m.record.error.as_ref().expect("error");
        assert_eq!(
            (m.record.outcome, e.error_type.as_str()),
            (Outcome::Error, status.to_string().as_str())
        );
        assert_eq!(m.record.http_status, Some(status));
        let want = serde_json::from_str::<serde_json::Value>(body).unwrap();
        let want_msg = want.get("error").unwrap_or(&want)["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(e.message.as_deref(), Some(want_msg.as_str()));
        assert_eq!(m.record.ttft, None);
    }
}

#[tokio::test]
async fn stream_cut_midway() {
    let mut frames = chat_stream(6, ms(20), ms(10), 5);
    frames.truncate(3); // role + 2 tokens, then the connection closes mid-body
    let m = measure(
        Reply::Stream {
            status: 200,
            content_type: "text/event-stream".into(),
            frames,
            cut: true,
        },
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        (m.record.outcome, error_type(&m)),
        (Outcome::Error, "stream_truncated")
    );
    assert_eq!(
        m.record.token_chunk_times.len(),
        2,
        "the partial measurement is kept"
    );
    assert!(m.record.ttft.is_some());
}

#[tokio::test]
async fn invalid_json_in_a_chunk() {
    let mut frames = chat_stream(3, ms(20), ms(10), 5);
    frames.insert(
        2,
        Frame {
            at: ms(25),
            bytes: b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"\n\n".to_vec(),
        },
    );
    let m = measure(Reply::sse(frames), Duration::from_secs(5)).await;
    assert_eq!(
        (m.record.outcome, error_type(&m)),
        (Outcome::Error, "invalid_chunk")
    );
    assert_eq!(
        m.record.token_chunk_times.len(),
        3,
        "reading went on after the bad chunk"
    );
}

/// A 10 MiB event (a long text piece, a large tool argument) is legitimate: under the default
/// 16 MiB cap it is measured like any other (issue 14).
#[tokio::test]
async fn a_10_mib_event_is_measured_under_the_default_cap() {
    let big = "x".repeat(10 << 20);
    let mut frames = chat_stream(2, ms(20), ms(10), 5);
    frames.insert(
        1,
        Frame {
            at: ms(22),
            bytes: format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{big}\"}}}}]}}\n\n")
                .into_bytes(),
        },
    );
    let m = measure(Reply::sse(frames), Duration::from_secs(10)).await;
    assert_eq!((m.record.outcome, error_type(&m)), (Outcome::Ok, "-"));
    assert_eq!(
        m.record.token_chunk_times.len(),
        3,
        "the big event is one token chunk"
    );
}

/// Over the cap (lowered to 1 MiB here), the request fails as `sse_event_too_large`, reading
/// stops there, and the TTFT and tokens before the event are kept.
#[tokio::test]
async fn an_event_over_the_cap_is_refused_keeping_ttft_and_tokens() {
    let big = "x".repeat(2 << 20);
    let mut frames = chat_stream(3, ms(20), ms(10), 5);
    frames.insert(
        3,
        Frame {
            at: ms(35),
            bytes: format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{big}\"}}}}]}}\n\n")
                .into_bytes(),
        },
    );
    let server = ScriptedServer::start(Arc::new(move |_, _| Reply::sse(frames.clone()))).await;
    let mut t = target(&server.url(), Duration::from_secs(10));
    t.max_event_bytes = 1 << 20;
    let m = one(&Clients::new(t.connect_timeout).unwrap(), &t).await;
    assert_eq!(
        (m.record.outcome, error_type(&m)),
        (Outcome::Error, "sse_event_too_large")
    );
    assert!(
        m.record.ttft.is_some_and(|t| t >= ms(20)),
        "TTFT kept: {:?}",
        m.record.ttft
    );
    assert_eq!(
        m.record.token_chunk_times.len(),
        2,
        "the two tokens before the event kept"
    );
    assert!(
        m.record.e2e < Duration::from_secs(5),
        "reading stopped at the limit: {:?}",
        m.record.e2e
    );
}

/// The server closes a kept-alive connection just as the next canary is written on it (the
/// race of llama.cpp's `Keep-Alive: timeout=5`): the canary is re-sent once on a fresh
/// connection, says so, and is not reported as a server failure.
#[tokio::test]
async fn server_closing_an_idle_keepalive_connection_is_no_false_failure() {
    let server = ScriptedServer::start(Arc::new(|req, _| {
        if req.on_connection > 0 {
            Reply::CloseWithoutResponse
        } else {
            Reply::sse(chat_stream(3, ms(5), ms(5), 4))
        }
    }))
    .await;
    let t = target(&server.url(), Duration::from_secs(5));
    let clients = Clients::new(t.connect_timeout).unwrap();
    let mut retries = 0;
    for i in 0..5 {
        let m = one(&clients, &t).await;
        assert_eq!(
            m.record.outcome,
            Outcome::Ok,
            "canary {i}: {:?}",
            m.record.error
        );
        retries += m.retries;
        tokio::time::sleep(ms(50)).await;
    }
    assert!(
        retries >= 1,
        "the stale connection was reused and the retry recorded"
    );

    // And a server that closes idle connections on a timer, canaries at about that period.
    let server = ScriptedServer::start_with(
        Arc::new(|_, _| Reply::sse(chat_stream(2, ms(5), ms(5), 4))),
        Some(ms(300)),
    )
    .await;
    let t = target(&server.url(), Duration::from_secs(5));
    let clients = Clients::new(t.connect_timeout).unwrap();
    for i in 0..8 {
        let m = one(&clients, &t).await;
        assert_eq!(
            m.record.outcome,
            Outcome::Ok,
            "canary {i}: {:?}",
            m.record.error
        );
        tokio::time::sleep(ms(290 + 5 * i)).await;
    }
}

/// A dead target (accepts, never answers) does not delay another target's canaries.
#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_target_does_not_delay_another() {
    let good = ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(3, ms(10), ms(5), 4))
    }))
    .await;
    let dead = ScriptedServer::start(Arc::new(|_, _| Reply::Hang)).await;
    let (g, d) = (good.url(), dead.url());
    let agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(
            &[
                "--target",
                &g,
                "--target",
                &d,
                "--model",
                "m",
                "--interval",
                "200ms",
                "--timeout",
                "1500ms",
                "--no-otlp",
            ],
            &[],
        )
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = agent.status();
    let (good_s, dead_s) = (&s["targets"][0], &s["targets"][1]);
    let good_ok = good_s["by_outcome"]["ok"].as_u64().unwrap_or(0);
    // 4 s at 200 ms (±10 % jitter, random first offset): about 19 ticks.
    assert!(good_ok >= 15, "good target kept its schedule: {good_s}");
    assert_eq!(
        good_s["requests"], good_s["by_outcome"]["ok"],
        "no failures on the good target: {good_s}"
    );
    assert!(
        dead_s["by_outcome"]["timeout"].as_u64().unwrap_or(0) >= 1,
        "dead target timed out: {dead_s}"
    );
    assert!(
        dead_s["skipped"].as_u64().unwrap_or(0) >= 1,
        "dead target's extra ticks skipped at max_in_flight: {dead_s}"
    );
}

/// Collector down for the whole run (a shortened `13_otel_rust_956_collector_down`): canaries
/// keep their schedule, spans are dropped and counted, memory stays flat, shutdown is quick.
#[tokio::test(flavor = "multi_thread")]
async fn collector_down_13_otel_rust_956_collector_down() {
    let case = lmperf_e2e::case("other/13_otel_rust_956_collector_down.json");
    let good =
        ScriptedServer::start(Arc::new(|_, _| Reply::sse(chat_stream(2, ms(2), ms(2), 4)))).await;
    let dir = temp::dir("13");
    let cfg = dir.join("agent.toml");
    std::fs::write(&cfg, "[otlp]\nqueue_size = 64\nbatch_size = 16\nexport_timeout = \"500ms\"\nexport_interval = \"500ms\"\n").unwrap();
    let url = good.url();
    let endpoint = case["input"]["otlp_endpoint"].as_str().unwrap().to_owned();
    let mut agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(
            &[
                "--config",
                cfg.to_str().unwrap(),
                "--target",
                &url,
                "--model",
                "m",
                "--rate",
                "50",
                "--arrival",
                "constant",
                "--otlp-endpoint",
                &endpoint,
                "--otlp-protocol",
                "grpc",
            ],
            &[],
        )
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_start = agent.rss_kib().unwrap();
    let t0 = Instant::now();
    let n0 = agent.status()["targets"][0]["requests"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = agent.status();
    let n1 = s["targets"][0]["requests"].as_u64().unwrap();
    let rate = (n1 - n0) as f64 / t0.elapsed().as_secs_f64();
    assert!(
        rate > 45.0,
        "canaries kept their 50/s schedule: {rate:.1}/s"
    );
    assert_eq!(
        s["targets"][0]["by_outcome"]["ok"].as_u64(),
        Some(n1),
        "no canary failed because of the collector"
    );
    let e = &s["exporter"];
    let lost = e["dropped_queue_full"].as_u64().unwrap() + e["failed"].as_u64().unwrap();
    assert!(
        lost > 0 && e["exported"] == 0,
        "spans dropped/failed and counted: {e}"
    );
    let (_, metrics) = agent.get("/metrics");
    assert!(
        prom_sum(
            &metrics,
            "lmperf_export_spans_total",
            &["dropped_queue_full"]
        ) + prom_sum(&metrics, "lmperf_export_spans_total", &["failed"])
            > 0.0,
        "drops exported as a metric"
    );
    let rss_end = agent.rss_kib().unwrap();
    let growth_mb = (rss_end as f64 - rss_start as f64) / 1024.0;
    assert!(
        growth_mb < case["expected"]["rss_growth_mb_max"].as_f64().unwrap() / 4.0,
        "RSS grew {growth_mb:.1} MB"
    );
    let warns = agent
        .stderr_text()
        .lines()
        .filter(|l| l.contains("WARN"))
        .count();
    assert!(
        warns as u64 <= case["expected"]["warn_logs_max"].as_u64().unwrap(),
        "{warns} warnings:\n{}",
        agent.stderr_text()
    );
    let t = Instant::now();
    agent.sigterm();
    let status = tokio::task::spawn_blocking(move || agent.wait_exit(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    assert!(
        t.elapsed().as_millis() as u64
            <= case["expected"]["shutdown_returns_within_ms"]
                .as_u64()
                .unwrap(),
        "shutdown took {:?}",
        t.elapsed()
    );
}

/// A 200 that is an HTML page (a proxy's sign-in form), not a stream: the canary's error is
/// `non_sse_reply` naming the content type and the page's first bytes, never the whole page;
/// model discovery says the same of `/v1/models` ("not JSON"). A 200 JSON error document keeps
/// the server's own type.
#[tokio::test]
async fn an_html_200_is_named_as_what_came_back_in_canaries_and_model_discovery() {
    let page = format!(
        "<!doctype html>\n<html><head><title>Sign in</title></head><body>{}</body></html>",
        "<p>corporate proxy</p>".repeat(200)
    );
    let html = Reply::Stream {
        status: 200,
        content_type: "text/html; charset=utf-8".into(),
        frames: vec![Frame {
            at: Duration::ZERO,
            bytes: page.clone().into_bytes(),
        }],
        cut: false,
    };
    let server = ScriptedServer::start(Arc::new(move |_, _| html.clone())).await;
    let t = target(&server.url(), Duration::from_secs(5));
    let clients = Clients::new(t.connect_timeout).unwrap();
    let m = one(&clients, &t).await;
    assert_eq!(
        (m.record.outcome, error_type(&m)),
        (Outcome::Error, "non_sse_reply")
    );
    let msg = m.record.error.as_ref().unwrap().message.clone().unwrap();
    assert!(
        msg.starts_with("HTTP 200 text/html; charset=utf-8, not an event stream: \"<!doctype html> <html><head><title>Sign in"),
        "{msg}"
    );
    assert!(msg.len() < 220 && msg.ends_with("…\""), "{msg}");
    let d = client::discover_model(&clients, &t).await.unwrap_err();
    let e = d.error.unwrap();
    assert_eq!(e.error_type, "non_sse_reply");
    let msg = e.message.unwrap();
    assert!(
        msg.starts_with(
            "model discovery: HTTP 200 text/html; charset=utf-8, not JSON: \"<!doctype html>"
        ),
        "{msg}"
    );
    assert!(msg.len() < 240, "{msg}");
    // A JSON error document with 200 keeps the server's type.
    let m = measure(
        Reply::json(
            200,
            r#"{"error":{"message":"model overloaded","type":"overloaded_error"}}"#,
        ),
        Duration::from_secs(5),
    )
    .await;
    assert_ne!(error_type(&m), "non_sse_reply", "{:?}", m.record.error);
}
