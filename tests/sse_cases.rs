//! Every stream case of `../shared/cases/sse/` (copied to `tests/fixtures/cases/sse/`),
//! checked twice:
//! - **exactly, on the pure measurement**: the case's frames fed to `lmperf_measure`'s
//!   `StreamMeasurer` at their own `t_ms` (no socket, no clock): every time within
//!   [`EXACT_MS`], counts, outcome, finish reason and error type exactly. This says which byte
//!   is the first token and which frames count, whatever the machine's load.
//! - **over real loopback HTTP**, by a scripted server that writes each frame at its `t_ms`,
//!   measured by the agent's own client: the same counts, outcome and types exactly; each time
//!   no earlier than the server really sent it (less the 5 ms tolerance), and no later than
//!   that plus [`LOADED_MS`], a bound that holds with a build running beside the tests (a
//!   descheduled client once read a 40 ms frame at 109 ms, case 21: the measurement was
//!   right).
//!
//! (Case 06 is a scheduler case, tested in
//! `daemon/src/canary/schedule.rs`; case 07 belongs to `lmperf run`.) Cases 16 and later go
//! through one generic check of every value their `expected` states, per request of a
//! multi-request case (served in POST order by `scripted::case_server`), and run-level values.

use std::sync::Arc;
use std::time::Duration;

use lmperf::canary::client::{self, CanaryRequest, Clients, Measured};
use lmperf::config::{self, Api, Env, Overrides, TargetConfig, raw::RawCanary};
use lmperf::measure::{Outcome, RequestRecord, StreamEnd, StreamMeasurer, UsageSource};
use lmperf_e2e::case;
use lmperf_e2e::scripted::{Reply, ScriptedServer, case_frames};
use lmperf_e2e::serial;
use lmperf_e2e::temp;
use tokio_util::sync::CancellationToken;

const TOLERANCE_MS: f64 = 5.0;
/// What a loaded 2-core machine adds to a time measured over a socket beyond the server's own
/// lateness: the test thread descheduled between the server's write and the client's read
/// (the server and the client share it). Seen: 22 ms over the script on case 19's 1 MiB event
/// at load average 10, 69 ms on case 21 with the CI's build beside the tests. Only late times
/// get it: a time measured early (the wrong, earlier event) still fails at the tolerance; and
/// the exact time is checked on the pure measurement.
const LOADED_MS: f64 = 250.0;
/// The exact check's tolerance on the pure measurement (the case's times are whole or
/// tenth milliseconds; this is float rounding).
const EXACT_MS: f64 = 1e-6;

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

fn target(url: &str) -> TargetConfig {
    let o = Overrides {
        targets: vec![url.to_owned()],
        canary: RawCanary {
            model: Some("m".into()),
            ..RawCanary::default()
        },
        ..Overrides::default()
    };
    config::load(o, &NoEnv).expect("config").targets.remove(0)
}

fn api_of(case: &serde_json::Value) -> Api {
    if case["endpoint"].as_str() == Some("/v1/completions") {
        Api::Completions
    } else {
        Api::Chat
    }
}

/// Replays `frames` for one request and measures it.
async fn replay(api: Api, frames: &serde_json::Value, status: u16) -> Measured {
    let frames = case_frames(frames);
    let server = ScriptedServer::start(Arc::new(move |_, _| Reply::Stream {
        status,
        content_type: "text/event-stream".into(),
        frames: frames.clone(),
        cut: false,
    }))
    .await;
    let t = target(&server.url());
    let clients = Clients::new(t.connect_timeout).expect("clients");
    let req = CanaryRequest {
        api,
        model: "m",
        prompt: "hi",
        max_tokens: 16,
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        extra_body: None,
    };
    let sent = std::time::Instant::now();
    let m = client::execute(&clients, &t, &req, &CancellationToken::new()).await;
    let got = server.requests();
    assert_eq!(got.len(), 1, "one request on the wire");
    set_slack(sent, &got[0]);
    assert_eq!(got[0].path, format!("/{}", api.path()));
    m
}

/// What the scripted server's own clock says of one request, in ms: how long after the
/// client's clock started the server had it (connect and send), and how late the server wrote
/// its frames at most ([`lmperf_e2e::scripted::Received::lateness`]).
#[derive(Debug, Clone, Copy, Default)]
struct Slack {
    send_offset_ms: f64,
    late_ms: f64,
    /// The record is the pure measurement's, at the case's own times: exact.
    exact: bool,
}

impl Slack {
    /// The larger of each, for samples that mix requests.
    fn max(self, o: Slack) -> Slack {
        Slack {
            send_offset_ms: self.send_offset_ms.max(o.send_offset_ms),
            late_ms: self.late_ms.max(o.late_ms),
            exact: self.exact && o.exact,
        }
    }

    fn total_ms(self) -> f64 {
        self.send_offset_ms + self.late_ms
    }
}

thread_local! {
    /// The [`Slack`] of the request being checked. A case's times count from the request's
    /// arrival at the server, so a measured time may exceed the case's by the send offset (on
    /// a loaded 2-core machine running a debug build it reached 2.4 ms, half the tolerance);
    /// and where the server wrote a frame late (a busy machine wakes its timer late: case 22's
    /// 8 ms error body took 14.7 ms once), the measurement follows the real send, not the
    /// script.
    static SLACK: std::cell::Cell<Slack> = const {
        std::cell::Cell::new(Slack { send_offset_ms: 0.0, late_ms: 0.0, exact: false })
    };
}

/// Records the slack of the request sent at `sent` that the server received as `r`.
fn set_slack(sent: std::time::Instant, r: &lmperf_e2e::scripted::Received) {
    SLACK.with(|o| {
        o.set(Slack {
            send_offset_ms: ms(r.arrived.saturating_duration_since(sent)),
            late_ms: ms(r.lateness()),
            exact: false,
        })
    });
}

fn slack() -> Slack {
    SLACK.with(std::cell::Cell::get)
}

/// The checks that follow read a record of the pure measurement: times exact.
fn set_exact() {
    SLACK.with(|o| {
        o.set(Slack {
            exact: true,
            ..Slack::default()
        })
    });
}

/// `got` matches the case's `want` (ms from the request's arrival at the server), checked
/// against the server's own send times: no earlier than `want` less the tolerance (less the
/// server's lateness, for a gap between two frames), no later than `want` plus the send
/// offset, the lateness, the tolerance and [`LOADED_MS`]; on the pure measurement, within
/// [`EXACT_MS`].
fn near(got: f64, want: f64) -> bool {
    let s = slack();
    if s.exact {
        return (got - want).abs() <= EXACT_MS;
    }
    got >= want - s.late_ms - TOLERANCE_MS
        && got <= want + s.send_offset_ms + s.late_ms + TOLERANCE_MS + LOADED_MS
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[track_caller]
fn close(got: Option<Duration>, want: &serde_json::Value, what: &str) {
    match want.as_f64() {
        Some(w) => {
            let g = got
                .map(ms)
                .unwrap_or_else(|| panic!("{what}: got none, want {w} ms"));
            assert!(
                near(g, w),
                "{what}: got {g:.2} ms, want {w} ms ({:?})",
                slack()
            );
        }
        None => assert!(got.is_none(), "{what}: got {got:?}, want none"),
    }
}

#[track_caller]
fn close_list(got: &[Duration], want: &serde_json::Value, what: &str) {
    let want: Vec<f64> = want
        .as_array()
        .expect(what)
        .iter()
        .filter_map(|v| v.as_f64())
        .collect();
    assert_eq!(got.len(), want.len(), "{what}: got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(&want) {
        assert!(
            near(ms(*g), *w),
            "{what}: got {got:?}, want {want:?} ({:?})",
            slack()
        );
    }
}

/// One case measured both ways: the pure measurement (exact) and the agent's client over a
/// socket (bounded), each checked by the same closure under its own [`Slack`].
struct Runs {
    pure: RequestRecord,
    socket: RequestRecord,
    socket_slack: Slack,
}

impl Runs {
    #[track_caller]
    fn each(&self, check: impl Fn(&RequestRecord)) {
        set_exact();
        check(&self.pure);
        SLACK.with(|o| o.set(self.socket_slack));
        check(&self.socket);
    }
}

/// The pure measurement of one case request: its frames fed to `StreamMeasurer` at their own
/// `t_ms`, the stream ending with the last frame (the scripted server closes the body after
/// it; the client's end is that read). `None` for a reply that the client does not measure as
/// a stream (a status other than 200, or the case's own response headers): those are checked
/// over the socket only.
fn pure_record(request: &serde_json::Value, default_status: u16) -> Option<RequestRecord> {
    let status = request["http_status"]
        .as_u64()
        .map_or(default_status, |s| s as u16);
    if status != 200 || request["response_headers"].is_object() {
        return None;
    }
    let mut m = StreamMeasurer::new(status, lmperf::config::DEFAULT_MAX_EVENT_BYTES).keep_text();
    let mut end = Duration::ZERO;
    for f in case_frames(&request["frames"]) {
        end = end.max(f.at);
        if !m.on_bytes(f.at, &f.bytes) {
            break;
        }
    }
    Some(m.finish(StreamEnd::Eof, end))
}

async fn single(name: &str) -> (serde_json::Value, Runs) {
    let c = case(&format!("sse/{name}.json"));
    let status = c["http_status"].as_u64().unwrap_or(200) as u16;
    let m = replay(api_of(&c), &c["frames"], status).await;
    let pure = pure_record(&c, status).expect("a 200 stream");
    let runs = Runs {
        pure,
        socket: m.record,
        socket_slack: slack(),
    };
    (c["expected"].clone(), runs)
}

#[tokio::test]
async fn case_01_guidellm_737_reasoning_ttft() {
    let _serial = serial::lock().await;
    let (e, runs) = single("01_guidellm_737_reasoning_ttft").await;
    runs.each(|r| {
        close(r.ttft, &e["ttft_ms"], "ttft");
        close(
            r.time_to_first_content,
            &e["time_to_first_content_ms"],
            "time to first content",
        );
        close(Some(r.e2e), &e["e2e_ms"], "e2e");
        assert_eq!(
            r.token_chunk_times.len() as u64,
            e["token_chunks"].as_u64().unwrap()
        );
        assert_eq!(r.finish_reasons, vec![e["finish_reason"].as_str().unwrap()]);
        assert_eq!(r.outcome == Outcome::Ok, e["success"].as_bool().unwrap());
    });
}

#[tokio::test]
async fn case_02_guidellm_743_http200_error_event() {
    let _serial = serial::lock().await;
    let (e, runs) = single("02_guidellm_743_http200_error_event").await;
    runs.each(|r| {
        assert_eq!(r.outcome == Outcome::Ok, e["success"].as_bool().unwrap());
        assert_eq!(r.outcome, Outcome::Error);
        let err = r.error.as_ref().expect("error");
        assert_eq!(err.error_type, e["error_type"].as_str().unwrap());
        assert_eq!(
            err.code.as_deref(),
            Some(e["error_code"].to_string().as_str())
        );
        assert_eq!(r.http_status, Some(200));
        close(r.ttft, &e["ttft_ms"], "ttft");
        assert_eq!(r.itl.len() as u64, e["itl_samples"].as_u64().unwrap());
        assert_eq!(r.output_tokens, e["output_tokens"].as_u64());
    });
}

#[tokio::test]
async fn case_03_vllm_27485_multi_token_chunks() {
    let _serial = serial::lock().await;
    let (e, runs) = single("03_vllm_27485_multi_token_chunks").await;
    runs.each(|r| {
        close(r.ttft, &e["ttft_ms"], "ttft");
        assert_eq!(r.output_tokens, e["output_tokens"].as_u64());
        assert_eq!(r.usage_source, Some(UsageSource::Server));
        close_list(&r.itl, &e["itl_ms"], "itl");
        close(r.itl_mean(), &e["mean_itl_ms"], "mean itl");
        close(r.tpot, &e["tpot_ms"], "tpot");
        assert_eq!(r.finish_reasons, vec![e["finish_reason"].as_str().unwrap()]);
        assert_eq!(r.outcome, Outcome::Ok);
    });
}

#[tokio::test]
async fn case_04_vllm_7242_ttft_in_itl() {
    let _serial = serial::lock().await;
    let (e, runs) = single("04_vllm_7242_ttft_in_itl").await;
    runs.each(|r| {
        close(r.ttft, &e["ttft_ms"], "ttft");
        close_list(&r.itl, &e["itl_ms"], "itl (TTFT is not an ITL sample)");
        close(r.itl_mean(), &e["mean_itl_ms"], "mean itl");
        assert_eq!(r.outcome, Outcome::Ok);
    });
}

#[tokio::test]
async fn case_05_vllm_6064_zero_ttft_pollutes_percentiles() {
    let _serial = serial::lock().await;
    let c = case("sse/05_vllm_6064_zero_ttft_pollutes_percentiles.json");
    let e = &c["expected"];
    // Exactly, on the pure measurement: only requests that produced a token give a sample.
    let pure: Vec<Duration> = c["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|req| pure_record(req, 200).expect("a 200 stream").ttft)
        .collect();
    set_exact();
    close_list(&pure, &e["ttft_samples_ms"], "ttft samples (pure)");
    let mut ttfts = Vec::new();
    let mut run = Slack::default();
    for req in c["requests"].as_array().unwrap() {
        let m = replay(api_of(&c), &req["frames"], 200).await;
        run = run.max(slack());
        if req["id"] == "R3" {
            assert_eq!(
                m.record.outcome == Outcome::Ok,
                e["R3_success"].as_bool().unwrap()
            );
            let err = m.record.error.as_ref().expect("R3 error");
            assert_eq!(
                err.error_type.replace('_', " "),
                e["R3_reason"].as_str().unwrap()
            );
            assert_eq!(
                m.record.ttft, None,
                "no TTFT sample from a request without tokens"
            );
        }
        // Only requests that produced a token give a TTFT sample.
        ttfts.extend(m.record.ttft);
    }
    // The samples mix requests: the largest offset and lateness of any.
    SLACK.with(|o| o.set(run));
    close_list(&ttfts, &e["ttft_samples_ms"], "ttft samples");
    let mean = ttfts.iter().map(|d| ms(*d)).sum::<f64>() / ttfts.len() as f64;
    assert!(
        (mean - e["mean_ttft_ms"].as_f64().unwrap()).abs()
            <= TOLERANCE_MS + run.total_ms() + LOADED_MS,
        "mean ttft {mean} ({run:?})"
    );
}

#[tokio::test]
async fn case_08_vllm_57082_abort_finish_reason() {
    let _serial = serial::lock().await;
    let (e, runs) = single("08_vllm_57082_abort_finish_reason").await;
    runs.each(|r| {
        assert_eq!(r.outcome == Outcome::Ok, e["success"].as_bool().unwrap());
        assert_eq!(r.outcome.as_str(), e["outcome"].as_str().unwrap());
        assert_eq!(
            r.finish_reasons,
            vec![e["finish_reason"].as_str().unwrap()],
            "raw finish_reason kept"
        );
        close(r.ttft, &e["ttft_ms"], "ttft");
        assert_eq!(r.output_tokens, e["partial_output_tokens"].as_u64());
    });
}

#[tokio::test]
async fn case_09_llamacpp_16048_usage_chunk_empty_choices() {
    let _serial = serial::lock().await;
    let (e, runs) = single("09_llamacpp_16048_usage_chunk_empty_choices").await;
    runs.each(|r| {
        assert_eq!(r.outcome == Outcome::Ok, e["success"].as_bool().unwrap());
        close(r.ttft, &e["ttft_ms"], "ttft");
        assert_eq!(r.output_tokens, e["output_tokens"].as_u64());
        assert_eq!(r.input_tokens, e["input_tokens"].as_u64());
        assert_eq!(
            r.usage_source.map(|s| s.as_str()),
            e["usage_source"].as_str()
        );
        assert_eq!(r.finish_reasons, vec![e["finish_reason"].as_str().unwrap()]);
        close(r.last_token(), &e["last_token_ms"], "last token");
        close(Some(r.e2e), &e["e2e_ms"], "e2e");
        close(r.tpot, &e["tpot_ms"], "tpot");
    });
}

#[tokio::test]
async fn case_11_inference_perf_564_per_chunk_retokenize() {
    let _serial = serial::lock().await;
    let (e, runs) = single("11_inference_perf_564_per_chunk_retokenize").await;
    runs.each(|r| {
        assert_eq!(
            r.output_tokens,
            e["output_tokens"].as_u64(),
            "server usage, not a per-chunk sum"
        );
        assert_eq!(
            r.usage_source.map(|s| s.as_str()),
            e["usage_source"].as_str()
        );
        assert_eq!(r.outcome, Outcome::Ok);
    });
}

// ---- Cases 16 and later (`../shared/cases/README.md`, "Additions"): one generic check of
// every `expected` value a case states, per request, and its run-level values. ----

/// The case's `request_extra` (sent in the body, e.g. `n`).
fn extra_of(c: &serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    c["request_extra"].as_object().cloned().unwrap_or_default()
}

/// Serves the whole case and measures each of its requests in POST order (text kept); with
/// each, when it was sent and the request as the server received it (see [`set_slack`]).
async fn measure_case(
    c: &serde_json::Value,
) -> Vec<(Measured, std::time::Instant, lmperf_e2e::scripted::Received)> {
    let server = lmperf_e2e::scripted::case_server(c).await;
    let t = target(&server.url());
    let clients = Clients::new(t.connect_timeout).expect("clients");
    let extra = extra_of(c);
    let n = c["requests"].as_array().map_or(1, Vec::len);
    let mut out = Vec::with_capacity(n);
    let mut sent = Vec::with_capacity(n);
    for _ in 0..n {
        let req = CanaryRequest {
            api: api_of(c),
            model: "m",
            prompt: "hi",
            max_tokens: 16,
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            extra_body: Some(&extra),
        };
        sent.push(std::time::Instant::now());
        out.push(client::execute_with(&clients, &t, &req, &CancellationToken::new(), true).await);
    }
    let got = server.requests();
    assert_eq!(got.len(), n, "one POST per case request");
    for r in &got {
        let body: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON body");
        for (k, v) in &extra {
            assert_eq!(&body[k], v, "request_extra {k} sent");
        }
    }
    out.into_iter()
        .zip(sent)
        .zip(got)
        .map(|((m, s), r)| (m, s, r))
        .collect()
}

fn opt_ms(v: Option<Duration>) -> Option<f64> {
    v.map(ms)
}

/// Checks every value of `e` (one request's expectations) that the record can state; fails on
/// an expectation it does not know, so a new case field is never silently skipped.
#[track_caller]
fn check_request(id: &str, e: &serde_json::Value, r: &RequestRecord) {
    let err = r.failure();
    for (k, want) in e.as_object().expect("expected object") {
        let what = format!("{id}: {k}");
        match k.as_str() {
            "success" => assert_eq!(
                r.outcome == Outcome::Ok,
                want.as_bool().unwrap(),
                "{what}: {:?}",
                r.error
            ),
            "outcome" => assert_eq!(
                r.outcome.as_str(),
                want.as_str().unwrap(),
                "{what}: {:?}",
                r.error
            ),
            // The server's own type where it gave one, else lmperf's class (status, kind).
            "error_type" => assert_eq!(err.map(|e| e.reason()), want.as_str(), "{what}: {err:?}"),
            "error_code" => assert_eq!(
                err.and_then(|e| e.code.clone()),
                Some(want.to_string().trim_matches('"').to_owned()),
                "{what}"
            ),
            "error_message_contains" | "error_body_snippet" => {
                let msg = err.and_then(|e| e.message.as_deref()).unwrap_or_default();
                assert!(
                    msg.contains(want.as_str().unwrap()),
                    "{what}: message {msg:?}"
                );
            }
            "retry_after_ms" => close(err.and_then(|e| e.retry_after), want, &what),
            "http_status" => assert_eq!(r.http_status.map(u64::from), want.as_u64(), "{what}"),
            "ttft_ms" => close(r.ttft, want, &what),
            "e2e_ms" => close(Some(r.e2e), want, &what),
            "tpot_ms" => match want.as_f64() {
                // Sub-millisecond TPOTs (case 19: 200 ms over 32768 tokens): the tolerance of
                // its two times, spread over the tokens.
                Some(w) if w < 1.0 => {
                    let g = opt_ms(r.tpot).expect("tpot");
                    let tokens = r.output_tokens.unwrap_or(2).max(2) as f64;
                    assert!(
                        (g - w).abs()
                            <= (2.0 * TOLERANCE_MS + slack().late_ms + LOADED_MS) / (tokens - 1.0),
                        "{what}: got {g}, want {w} ({:?})",
                        slack()
                    );
                }
                _ => close(r.tpot, want, &what),
            },
            "last_token_ms" => close(r.last_token(), want, &what),
            "token_chunk_ms" => close_list(&r.token_chunk_times, want, &what),
            "itl_ms" => close_list(&r.itl, want, &what),
            "output_tokens" => assert_eq!(r.output_tokens, want.as_u64(), "{what}"),
            "usage_source" => {
                assert_eq!(r.usage_source.map(|s| s.as_str()), want.as_str(), "{what}")
            }
            "finish_reason" => assert_eq!(
                r.finish_reasons.last().map(String::as_str),
                want.as_str(),
                "{what}"
            ),
            "finish_reasons" => assert_eq!(serde_json::json!(r.finish_reasons), *want, "{what}"),
            "generated_text" | "partial_text" => {
                assert_eq!(r.output_text.as_deref(), want.as_str(), "{what}")
            }
            "generated_text_bytes" => assert_eq!(
                r.output_text.as_ref().map(|t| t.len() as u64),
                want.as_u64(),
                "{what}"
            ),
            "partial_token_chunks" => assert_eq!(
                r.token_chunk_times.len() as u64,
                want.as_u64().unwrap(),
                "{what}"
            ),
            "done_marker_seen" => assert_eq!(r.done_marker_seen, want.as_bool().unwrap(), "{what}"),
            "parse_errors" => assert_eq!(
                u64::from(err.is_some_and(|e| e.error_type == "invalid_chunk")),
                want.as_u64().unwrap(),
                "{what}"
            ),
            // 1000 / TPOT: within 2 tokens/s, or, where the server sent late (a busy machine
            // can bunch its frames), the TPOT checked as every time is, against its send times.
            "decode_tokens_per_s" => {
                let tpot = opt_ms(r.tpot).expect("tpot");
                let (g, w) = (1000.0 / tpot, want.as_f64().unwrap());
                assert!(
                    (g - w).abs() <= 2.0 || (slack().late_ms > 0.0 && near(tpot, 1000.0 / w)),
                    "{what}: got {g} ({:?})",
                    slack()
                );
            }
            "tool_calls" => {
                let got: Vec<serde_json::Value> = r
                    .tool_calls
                    .iter()
                    .map(|t| serde_json::json!({ "index": t.index, "id": t.id, "name": t.name, "arguments": t.arguments }))
                    .collect();
                assert_eq!(
                    serde_json::Value::Array(got),
                    *want,
                    "{what}: reassembled by index"
                );
            }
            "choices" => {
                let want = want.as_array().unwrap();
                assert_eq!(r.choices.len(), want.len(), "{what}");
                for (c, w) in r.choices.iter().zip(want) {
                    assert_eq!(u64::from(c.index), w["index"].as_u64().unwrap(), "{what}");
                    assert_eq!(c.text.as_deref(), w["text"].as_str(), "{what} {}", c.index);
                    assert_eq!(
                        c.finish_reason.as_deref(),
                        w["finish_reason"].as_str(),
                        "{what} {}",
                        c.index
                    );
                    close(
                        c.first_token,
                        &w["first_token_ms"],
                        &format!("{what} {} first token", c.index),
                    );
                    close(
                        c.last_token,
                        &w["last_token_ms"],
                        &format!("{what} {} last token", c.index),
                    );
                }
            }
            "itl_ms_per_choice" => {
                for (idx, w) in want.as_object().unwrap() {
                    let c = r
                        .choices
                        .iter()
                        .find(|c| c.index.to_string() == *idx)
                        .unwrap_or_else(|| panic!("{what}: no choice {idx}"));
                    close_list(&c.itl, w, &format!("{what} {idx}"));
                }
            }
            // A legitimate event: within the default cap, 16 MiB.
            "largest_event_bytes" => assert!(
                want.as_u64().unwrap() < lmperf::config::DEFAULT_MAX_EVENT_BYTES as u64,
                "{what}"
            ),
            "wrong" | "note" => {}
            other => panic!("{id}: expectation {other:?} not checked"),
        }
    }
}

/// Run-level values of a multi-request case, from its records: only successful requests feed
/// latency samples.
#[track_caller]
fn check_run(e: &serde_json::Value, ms_all: &[RequestRecord]) {
    let ok: Vec<&RequestRecord> = ms_all.iter().filter(|m| m.outcome == Outcome::Ok).collect();
    let sorted = |mut v: Vec<Duration>| {
        v.sort();
        v
    };
    for (k, want) in e.as_object().unwrap() {
        match k.as_str() {
            "success_count" => assert_eq!(ok.len() as u64, want.as_u64().unwrap(), "{k}"),
            "error_count" => assert_eq!(
                (ms_all.len() - ok.len()) as u64,
                want.as_u64().unwrap(),
                "{k}"
            ),
            "error_rate" => assert!(
                ((ms_all.len() - ok.len()) as f64 / ms_all.len() as f64 - want.as_f64().unwrap())
                    .abs()
                    < 1e-9,
                "{k}"
            ),
            "ttft_samples_ms" => {
                close_list(&sorted(ok.iter().filter_map(|m| m.ttft).collect()), want, k)
            }
            "e2e_success_samples_ms" => {
                close_list(&sorted(ok.iter().map(|m| m.e2e).collect()), want, k)
            }
            "output_tokens_total_success" => assert_eq!(
                ok.iter().filter_map(|m| m.output_tokens).sum::<u64>(),
                want.as_u64().unwrap(),
                "{k}"
            ),
            "errors_by_status" => {
                let mut got = std::collections::BTreeMap::<String, u64>::new();
                for m in ms_all.iter().filter(|m| m.outcome != Outcome::Ok) {
                    *got.entry(m.http_status.map_or("none".into(), |s| s.to_string()))
                        .or_default() += 1;
                }
                assert_eq!(serde_json::json!(got), *want, "{k}");
            }
            "per_request" | "wrong" | "note" => {}
            other => panic!("run-level expectation {other:?} not checked"),
        }
    }
}

/// Measures case `name` (a path under `tests/fixtures/cases/`) and checks all it expects:
/// exactly on the pure measurement (the requests it measures as streams; the run-level values
/// when it measures them all), then within bounds over the socket.
async fn check_case(name: &str) -> Vec<Measured> {
    let c = case(name);
    let e = &c["expected"];
    let status = c["http_status"].as_u64().map_or(200, |s| s as u16);
    let requests: Vec<&serde_json::Value> = match c["requests"].as_array() {
        Some(reqs) => reqs.iter().collect(),
        None => vec![&c],
    };
    let pure: Vec<Option<RequestRecord>> =
        requests.iter().map(|r| pure_record(r, status)).collect();
    let measured = measure_case(&c).await;
    let ms_all: Vec<Measured> = measured.iter().map(|(m, _, _)| m.clone()).collect();
    let socket: Vec<RequestRecord> = ms_all.iter().map(|m| m.record.clone()).collect();
    match e["per_request"].as_object() {
        Some(per) => {
            let ids: Vec<&str> = requests.iter().map(|r| r["id"].as_str().unwrap()).collect();
            assert_eq!(per.len(), ids.len(), "an expectation per request");
            set_exact();
            for (id, r) in ids.iter().zip(&pure) {
                if let Some(r) = r {
                    check_request(id, &per[*id], r);
                }
            }
            if let Some(all) = pure.iter().cloned().collect::<Option<Vec<_>>>() {
                check_run(e, &all);
            }
            let mut run = Slack::default();
            for (id, (m, sent, r)) in ids.iter().zip(&measured) {
                set_slack(*sent, r);
                run = run.max(slack());
                check_request(id, &per[*id], &m.record);
            }
            // Run-level samples mix requests: the largest offset and lateness of any.
            SLACK.with(|o| o.set(run));
            check_run(e, &socket);
        }
        None => {
            set_exact();
            if let Some(r) = &pure[0] {
                check_request(name, e, r);
            }
            let (m, sent, r) = &measured[0];
            set_slack(*sent, r);
            check_request(name, e, &m.record);
        }
    }
    ms_all
}

#[tokio::test]
async fn case_18_evalscope_1638_half_event_coalesced() {
    let _serial = serial::lock().await;
    check_case("sse/18_evalscope_1638_half_event_coalesced.json").await;
}

#[tokio::test]
async fn case_19_inference_perf_283_one_mib_event() {
    let _serial = serial::lock().await;
    let m = check_case("sse/19_inference_perf_283_one_mib_event.json").await;
    assert!(m[0].record.error.is_none());
}

#[tokio::test]
async fn case_21_llamacpp_16104_error_outside_data_field() {
    let _serial = serial::lock().await;
    check_case("sse/21_llamacpp_16104_error_outside_data_field.json").await;
}

#[tokio::test]
async fn case_22_llamacpp_16486_non200_error_bodies() {
    let _serial = serial::lock().await;
    let m = check_case("sse/22_llamacpp_16486_non200_error_bodies.json").await;
    // error.type stays the status; the server's type is kept beside it.
    let e = m[0].record.error.as_ref().unwrap();
    assert_eq!(
        (e.error_type.as_str(), e.server_type.as_deref()),
        ("400", Some("exceed_context_size_error"))
    );
}

#[tokio::test]
async fn case_23_aiperf_804_tool_call_only_stream() {
    let _serial = serial::lock().await;
    check_case("sse/23_aiperf_804_tool_call_only_stream.json").await;
}

#[tokio::test]
async fn case_24_langfuse_16998_n2_interleaved_choices() {
    let _serial = serial::lock().await;
    check_case("sse/24_langfuse_16998_n2_interleaved_choices.json").await;
}

#[tokio::test]
async fn case_25_ik_llamacpp_467_no_done_marker() {
    let _serial = serial::lock().await;
    check_case("sse/25_ik_llamacpp_467_no_done_marker.json").await;
}

#[tokio::test]
async fn case_26_vllm_55508_usage_tail_tpot() {
    let _serial = serial::lock().await;
    check_case("sse/26_vllm_55508_usage_tail_tpot.json").await;
}

/// Case 22 through `lmperf run`: requests.jsonl keeps the server's reason (type, code, message,
/// Retry-After) and summary.json groups the errors by status and server type; latency samples
/// come from the one success only.
#[tokio::test(flavor = "multi_thread")]
async fn case_22_llamacpp_16486_non200_error_bodies_in_lmperf_run() {
    let _serial = serial::lock().await;
    let c = case("sse/22_llamacpp_16486_non200_error_bodies.json");
    let e = &c["expected"];
    let server = lmperf_e2e::scripted::case_server(&c).await;
    let dir = temp::dir("case22");
    let spec = lmperf::bench::RunSpec {
        num_prompts: 5,
        input_lengths: vec![8],
        output_len: 4,
        ignore_eos: false,
        ..lmperf::bench::RunSpec::new(target(&server.url()), dir.clone())
    };
    let summary = lmperf::bench::run(spec).await.expect("run");
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 5);
    let per = &e["per_request"];
    for (row, id) in rows.iter().zip(["R1", "R2", "R3", "R4", "R5"]) {
        let want = &per[id];
        assert_eq!(row["outcome"], want["outcome"], "{id}");
        assert_eq!(
            row["http_status"],
            want["http_status"]
                .as_u64()
                .map_or(serde_json::json!(200), |s| serde_json::json!(s)),
            "{id}"
        );
        if want["outcome"] == "error" {
            let server_type = row["error_server_type"]
                .as_str()
                .or(row["error_type"].as_str());
            assert_eq!(server_type, want["error_type"].as_str(), "{id}");
            assert_eq!(
                row["error_type"],
                row["http_status"].to_string().as_str(),
                "{id}: error.type stays the status"
            );
            assert!(
                row["error_message"].as_str().is_some_and(|m| !m.is_empty()),
                "{id}: message kept"
            );
        }
        if let Some(code) = want["error_code"].as_u64() {
            assert_eq!(row["error_code"], code.to_string().as_str(), "{id}");
        }
        assert_eq!(
            row["retry_after_ms"].as_f64(),
            want["retry_after_ms"].as_f64(),
            "{id}"
        );
    }
    assert!(
        rows[0]["error_message"]
            .as_str()
            .unwrap()
            .contains("exceeds the available context size")
    );
    assert!(
        rows[3]["error_message"].as_str().unwrap().contains(
            e["per_request"]["R4"]["error_body_snippet"]
                .as_str()
                .unwrap()
        )
    );
    let b = &summary.benchmarks[0];
    assert_eq!(b.completed as u64, e["success_count"].as_u64().unwrap());
    assert_eq!(serde_json::json!(b.errors_by_status), e["errors_by_status"]);
    assert_eq!(
        serde_json::json!(b.errors_by_status_and_type),
        serde_json::json!({"400": {"BadRequestError": 1, "exceed_context_size_error": 1}, "429": {"rate_limit_exceeded": 1}, "503": {"503": 1}})
    );
    let ttft = b.ttft_ms.as_ref().expect("ttft of the success");
    assert_eq!(ttft.count, 1, "failed requests give no latency sample");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- Inputs of our own beyond the shared cases (issue 14), over loopback too. ----

fn own_frames(frames: &[(u64, &str)]) -> serde_json::Value {
    serde_json::Value::Array(
        frames
            .iter()
            .map(|(t, b)| serde_json::json!({ "t_ms": t, "bytes": b }))
            .collect(),
    )
}

const OWN_TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";

#[tokio::test]
async fn own_event_error_stream() {
    let _serial = serial::lock().await;
    let f = own_frames(&[
        (20, OWN_TOKEN),
        (
            40,
            "event: error\ndata: {\"error\":{\"message\":\"engine overloaded\",\"type\":\"overloaded_error\",\"code\":529}}\n\n",
        ),
        (41, "data: [DONE]\n\n"),
    ]);
    let r = replay(Api::Chat, &f, 200).await.record;
    assert_eq!(r.outcome, Outcome::Error);
    let e = r.error.as_ref().unwrap();
    assert_eq!(
        (
            e.error_type.as_str(),
            e.server_type.as_deref(),
            e.code.as_deref(),
            e.message.as_deref()
        ),
        (
            "overloaded_error",
            Some("overloaded_error"),
            Some("529"),
            Some("engine overloaded")
        )
    );
    // Times: the token's (its frame at 20 ms, on the server's own clock), before the error's
    // end; exact times are the shared cases' business.
    assert_eq!(r.token_chunk_times.len(), 1, "{:?}", r.token_chunk_times);
    assert!(
        r.ttft.is_some_and(|t| near(ms(t), 20.0) && t < r.e2e),
        "TTFT kept: {:?} ({:?})",
        r.ttft,
        slack()
    );
    assert!(
        r.e2e >= Duration::from_millis(41),
        "E2E at [DONE]: {:?}",
        r.e2e
    );
}

#[tokio::test]
async fn own_bare_json_error_after_tokens() {
    let _serial = serial::lock().await;
    let f = own_frames(&[
        (20, OWN_TOKEN),
        (30, OWN_TOKEN),
        (
            45,
            "{\"error\":{\"code\":500,\"message\":\"CUDA error: out of memory\",\"type\":\"server_error\"}}",
        ),
    ]);
    let r = replay(Api::Chat, &f, 200).await.record;
    assert_eq!(r.outcome, Outcome::Error);
    let e = r.error.as_ref().unwrap();
    assert_eq!(
        (e.error_type.as_str(), e.code.as_deref()),
        ("server_error", Some("500"))
    );
    assert!(
        e.message
            .as_deref()
            .is_some_and(|m| m.contains("out of memory"))
    );
    assert_eq!(r.token_chunk_times.len(), 2);
    assert!(
        r.e2e >= Duration::from_millis(45),
        "E2E at the end of the body: {:?}",
        r.e2e
    );
}

#[tokio::test]
async fn own_n3_on_completions() {
    let _serial = serial::lock().await;
    let c = |t: &str| format!("data: {{\"object\":\"text_completion\",\"choices\":[{t}]}}\n\n");
    let (a, b, d, e) = (
        c(
            r#"{"index":0,"text":"A","finish_reason":null},{"index":2,"text":"C","finish_reason":null}"#,
        ),
        c(r#"{"index":1,"text":"B","finish_reason":null}"#),
        c(
            r#"{"index":2,"text":"c","finish_reason":"stop"},{"index":0,"text":"a","finish_reason":null},{"index":1,"text":"b","finish_reason":"length"}"#,
        ),
        c(r#"{"index":0,"text":"!","finish_reason":"length"}"#),
    );
    let f = own_frames(&[
        (50, &a),
        (70, &b),
        (90, &d),
        (130, &e),
        (
            131,
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n",
        ),
    ]);
    let r = replay(Api::Completions, &f, 200).await.record;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error);
    // The first token of any choice (choices 0 and 2 in the 50 ms frame, choice 1 at 70 ms):
    // the earliest of the choices' first tokens, exactly, whatever the machine's load; and
    // no earlier than the frame that carried it was written.
    let firsts: Vec<Duration> = r.choices.iter().filter_map(|c| c.first_token).collect();
    assert_eq!(firsts.len(), 3, "{:?}", r.choices);
    assert_eq!(
        r.ttft,
        firsts.iter().min().copied(),
        "TTFT: first token of any choice"
    );
    let choice1 = r
        .choices
        .iter()
        .find(|c| c.index == 1)
        .and_then(|c| c.first_token);
    assert!(
        r.ttft < choice1,
        "TTFT from the 50 ms frame, not choice 1's at 70 ms: {:?} vs {choice1:?}",
        r.ttft
    );
    assert!(
        r.ttft.map(ms).is_some_and(|t| near(t, 50.0)),
        "TTFT {:?} ({:?})",
        r.ttft,
        slack()
    );
    assert_eq!(r.tpot, None, "no request-level TPOT across choices");
    assert_eq!(r.finish_reasons, vec!["length", "length", "stop"]);
    let per: Vec<(u32, usize, Option<&str>)> = r
        .choices
        .iter()
        .map(|c| (c.index, c.token_chunks, c.finish_reason.as_deref()))
        .collect();
    assert_eq!(
        per,
        vec![
            (0, 3, Some("length")),
            (1, 2, Some("length")),
            (2, 2, Some("stop"))
        ]
    );
    let (c0, c1) = (&r.choices[0], &r.choices[1]);
    assert!(
        c1.first_token > c0.first_token,
        "choice 1 starts with its own first token"
    );
    assert_eq!(
        c0.tpot,
        c0.last_token.zip(c0.first_token).map(|(l, f)| (l - f) / 2),
        "per-choice TPOT over its 3 chunks"
    );
    assert_eq!(r.choices[2].itl.len(), 1);
}

/// Case 24 through `lmperf run --n 2`: `n` is sent, and requests.jsonl gives each choice its own
/// TTFT, ITL and finish reason, with no request-level TPOT.
#[tokio::test(flavor = "multi_thread")]
async fn case_24_langfuse_16998_n2_interleaved_choices_in_lmperf_run() {
    let _serial = serial::lock().await;
    let c = case("sse/24_langfuse_16998_n2_interleaved_choices.json");
    let server = lmperf_e2e::scripted::case_server(&c).await;
    let dir = temp::dir("case24");
    let spec = lmperf::bench::RunSpec {
        num_prompts: 2,
        input_lengths: vec![8],
        output_len: 4,
        ignore_eos: false,
        n: 2,
        ..lmperf::bench::RunSpec::new(target(&server.url()), dir.clone())
    };
    lmperf::bench::run(spec).await.expect("run");
    let posts: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .collect();
    assert_eq!(posts.len(), 2);
    for p in &posts {
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&p.body).unwrap()["n"],
            2,
            "--n is sent"
        );
    }
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let want = &c["expected"];
    // Times against the server's own clock: how late it wrote its frames (the send offset, a
    // connect and a write, is within LOADED_MS).
    SLACK.with(|o| {
        o.set(Slack {
            send_offset_ms: 0.0,
            late_ms: posts.iter().map(|p| ms(p.lateness())).fold(0.0, f64::max),
            exact: false,
        })
    });
    for row in &rows {
        assert_eq!(row["outcome"], "ok");
        assert!(
            row["tpot_ms"].is_null(),
            "no request-level TPOT across choices"
        );
        let choices = row["choices"].as_array().expect("choices");
        assert_eq!(choices.len(), 2);
        for (got, w) in choices.iter().zip(want["choices"].as_array().unwrap()) {
            assert_eq!(
                (got["index"].clone(), got["finish_reason"].clone()),
                (w["index"].clone(), w["finish_reason"].clone())
            );
            let (t, want_t) = (
                got["ttft_ms"].as_f64().unwrap(),
                w["first_token_ms"].as_f64().unwrap(),
            );
            assert!(
                near(t, want_t),
                "choice TTFT {t} ms, case {want_t} ms ({:?})",
                slack()
            );
            assert_eq!(
                got["itl_ms"].as_array().unwrap().len(),
                want["itl_ms_per_choice"][w["index"].to_string()]
                    .as_array()
                    .unwrap()
                    .len()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
