//! Every stream case of `../shared/cases/sse/` (copied to `tests/fixtures/cases/sse/`),
//! replayed over real loopback HTTP by a scripted server that writes each frame at its
//! `t_ms`, and measured by the agent's own client. Times must match within 5 ms; counts,
//! outcome, finish reason and error type exactly. (Case 06 is a scheduler case, tested in
//! `daemon/src/canary/schedule.rs`; case 07 belongs to `lmperf run`.)

use std::sync::Arc;
use std::time::Duration;

use lmperf::canary::client::{self, CanaryRequest, Clients, Measured};
use lmperf::config::{self, Api, Env, Overrides, TargetConfig, raw::RawCanary};
use lmperf::measure::{Outcome, UsageSource};
use lmperf_e2e::case;
use lmperf_e2e::scripted::{Reply, ScriptedServer, case_frames};
use tokio_util::sync::CancellationToken;

const TOLERANCE_MS: f64 = 5.0;

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

fn target(url: &str) -> TargetConfig {
    let o = Overrides {
        targets: vec![url.to_owned()],
        canary: RawCanary { model: Some("m".into()), ..RawCanary::default() },
        ..Overrides::default()
    };
    config::load(o, &NoEnv).expect("config").targets.remove(0)
}

fn api_of(case: &serde_json::Value) -> Api {
    if case["endpoint"].as_str() == Some("/v1/completions") { Api::Completions } else { Api::Chat }
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
    let req = CanaryRequest { api, model: "m", prompt: "hi", max_tokens: 16, traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", extra_body: None };
    let m = client::execute(&clients, &t, &req, &CancellationToken::new()).await;
    let got = server.requests();
    assert_eq!(got.len(), 1, "one request on the wire");
    assert_eq!(got[0].path, format!("/{}", api.path()));
    m
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[track_caller]
fn close(got: Option<Duration>, want: &serde_json::Value, what: &str) {
    match want.as_f64() {
        Some(w) => {
            let g = got.map(ms).unwrap_or_else(|| panic!("{what}: got none, want {w} ms"));
            assert!((g - w).abs() <= TOLERANCE_MS, "{what}: got {g:.2} ms, want {w} ms");
        }
        None => assert!(got.is_none(), "{what}: got {got:?}, want none"),
    }
}

#[track_caller]
fn close_list(got: &[Duration], want: &serde_json::Value, what: &str) {
    let want: Vec<f64> = want.as_array().expect(what).iter().filter_map(|v| v.as_f64()).collect();
    assert_eq!(got.len(), want.len(), "{what}: got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(&want) {
        assert!((ms(*g) - w).abs() <= TOLERANCE_MS, "{what}: got {got:?}, want {want:?}");
    }
}

async fn single(name: &str) -> (serde_json::Value, Measured) {
    let c = case(&format!("sse/{name}.json"));
    let status = c["http_status"].as_u64().unwrap_or(200) as u16;
    let m = replay(api_of(&c), &c["frames"], status).await;
    (c["expected"].clone(), m)
}

#[tokio::test]
async fn case_01_guidellm_737_reasoning_ttft() {
    let (e, m) = single("01_guidellm_737_reasoning_ttft").await;
    let r = &m.record;
    close(r.ttft, &e["ttft_ms"], "ttft");
    close(r.time_to_first_content, &e["time_to_first_content_ms"], "time to first content");
    close(Some(r.e2e), &e["e2e_ms"], "e2e");
    assert_eq!(r.token_chunk_times.len() as u64, e["token_chunks"].as_u64().unwrap());
    assert_eq!(r.finish_reasons, vec![e["finish_reason"].as_str().unwrap()]);
    assert_eq!(r.outcome == Outcome::Ok, e["success"].as_bool().unwrap());
}

#[tokio::test]
async fn case_02_guidellm_743_http200_error_event() {
    let (e, m) = single("02_guidellm_743_http200_error_event").await;
    let r = &m.record;
    assert_eq!(r.outcome == Outcome::Ok, e["success"].as_bool().unwrap());
    assert_eq!(r.outcome, Outcome::Error);
    let err = r.error.as_ref().expect("error");
    assert_eq!(err.error_type, e["error_type"].as_str().unwrap());
    assert_eq!(err.code.as_deref(), Some(e["error_code"].to_string().as_str()));
    assert_eq!(r.http_status, Some(200));
    close(r.ttft, &e["ttft_ms"], "ttft");
    assert_eq!(r.itl.len() as u64, e["itl_samples"].as_u64().unwrap());
    assert_eq!(r.output_tokens, e["output_tokens"].as_u64());
}

#[tokio::test]
async fn case_03_vllm_27485_multi_token_chunks() {
    let (e, m) = single("03_vllm_27485_multi_token_chunks").await;
    let r = &m.record;
    close(r.ttft, &e["ttft_ms"], "ttft");
    assert_eq!(r.output_tokens, e["output_tokens"].as_u64());
    assert_eq!(r.usage_source, Some(UsageSource::Server));
    close_list(&r.itl, &e["itl_ms"], "itl");
    close(r.itl_mean(), &e["mean_itl_ms"], "mean itl");
    close(r.tpot, &e["tpot_ms"], "tpot");
    assert_eq!(r.finish_reasons, vec![e["finish_reason"].as_str().unwrap()]);
    assert_eq!(r.outcome, Outcome::Ok);
}

#[tokio::test]
async fn case_04_vllm_7242_ttft_in_itl() {
    let (e, m) = single("04_vllm_7242_ttft_in_itl").await;
    let r = &m.record;
    close(r.ttft, &e["ttft_ms"], "ttft");
    close_list(&r.itl, &e["itl_ms"], "itl (TTFT is not an ITL sample)");
    close(r.itl_mean(), &e["mean_itl_ms"], "mean itl");
    assert_eq!(r.outcome, Outcome::Ok);
}

#[tokio::test]
async fn case_05_vllm_6064_zero_ttft_pollutes_percentiles() {
    let c = case("sse/05_vllm_6064_zero_ttft_pollutes_percentiles.json");
    let e = &c["expected"];
    let mut ttfts = Vec::new();
    for req in c["requests"].as_array().unwrap() {
        let m = replay(api_of(&c), &req["frames"], 200).await;
        if req["id"] == "R3" {
            assert_eq!(m.record.outcome == Outcome::Ok, e["R3_success"].as_bool().unwrap());
            let err = m.record.error.as_ref().expect("R3 error");
            assert_eq!(err.error_type.replace('_', " "), e["R3_reason"].as_str().unwrap());
            assert_eq!(m.record.ttft, None, "no TTFT sample from a request without tokens");
        }
        // Only requests that produced a token give a TTFT sample.
        ttfts.extend(m.record.ttft);
    }
    close_list(&ttfts, &e["ttft_samples_ms"], "ttft samples");
    let mean = ttfts.iter().map(|d| ms(*d)).sum::<f64>() / ttfts.len() as f64;
    assert!((mean - e["mean_ttft_ms"].as_f64().unwrap()).abs() <= TOLERANCE_MS, "mean ttft {mean}");
}

#[tokio::test]
async fn case_08_vllm_57082_abort_finish_reason() {
    let (e, m) = single("08_vllm_57082_abort_finish_reason").await;
    let r = &m.record;
    assert_eq!(r.outcome == Outcome::Ok, e["success"].as_bool().unwrap());
    assert_eq!(r.outcome.as_str(), e["outcome"].as_str().unwrap());
    assert_eq!(r.finish_reasons, vec![e["finish_reason"].as_str().unwrap()], "raw finish_reason kept");
    close(r.ttft, &e["ttft_ms"], "ttft");
    assert_eq!(r.output_tokens, e["partial_output_tokens"].as_u64());
}

#[tokio::test]
async fn case_09_llamacpp_16048_usage_chunk_empty_choices() {
    let (e, m) = single("09_llamacpp_16048_usage_chunk_empty_choices").await;
    let r = &m.record;
    assert_eq!(r.outcome == Outcome::Ok, e["success"].as_bool().unwrap());
    close(r.ttft, &e["ttft_ms"], "ttft");
    assert_eq!(r.output_tokens, e["output_tokens"].as_u64());
    assert_eq!(r.input_tokens, e["input_tokens"].as_u64());
    assert_eq!(r.usage_source.map(|s| s.as_str()), e["usage_source"].as_str());
    assert_eq!(r.finish_reasons, vec![e["finish_reason"].as_str().unwrap()]);
    close(r.last_token(), &e["last_token_ms"], "last token");
    close(Some(r.e2e), &e["e2e_ms"], "e2e");
    close(r.tpot, &e["tpot_ms"], "tpot");
}

#[tokio::test]
async fn case_11_inference_perf_564_per_chunk_retokenize() {
    let (e, m) = single("11_inference_perf_564_per_chunk_retokenize").await;
    let r = &m.record;
    assert_eq!(r.output_tokens, e["output_tokens"].as_u64(), "server usage, not a per-chunk sum");
    assert_eq!(r.usage_source.map(|s| s.as_str()), e["usage_source"].as_str());
    assert_eq!(r.outcome, Outcome::Ok);
}
