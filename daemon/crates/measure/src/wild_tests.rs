//! The four kinds of issue 14 on inputs of our own beyond the shared cases: errors however a
//! 200 stream signals them, a 10 MiB event under the default cap (and one over a small cap),
//! `n = 3` on completions.

use std::time::Duration;

use super::DEFAULT_MAX_EVENT_BYTES;
use super::*;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn measure_with(cap: usize, frames: &[(u64, &[u8])], end: StreamEnd) -> RequestRecord {
    let mut m = StreamMeasurer::new(200, cap).keep_text();
    for (t, b) in frames {
        if !m.on_bytes(ms(*t), b) {
            break;
        }
    }
    let last = frames.last().map_or(0, |f| f.0);
    m.finish(end, ms(last))
}

fn measure(frames: &[(u64, &str)]) -> RequestRecord {
    let frames: Vec<(u64, &[u8])> = frames.iter().map(|(t, b)| (*t, b.as_bytes())).collect();
    measure_with(DEFAULT_MAX_EVENT_BYTES, &frames, StreamEnd::Eof)
}

const TOKEN_A: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
const TOKEN_B: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n";

#[track_caller]
fn assert_server_error(r: &RequestRecord, error_type: &str, code: Option<&str>, message: &str) {
    assert_eq!(r.outcome, Outcome::Error, "{r:?}");
    let e = r.error.as_ref().expect("error");
    assert_eq!(e.error_type, error_type);
    assert_eq!(e.server_type.as_deref(), Some(error_type));
    assert_eq!(e.code.as_deref(), code);
    assert!(
        e.message.as_deref().is_some_and(|m| m.contains(message)),
        "message {:?}",
        e.message
    );
}

#[test]
fn event_error_stream_fails_with_the_servers_words() {
    // Before any token, wrapped; after tokens, flat; and in CRLF.
    let r = measure(&[
        (
            10,
            "event: error\ndata: {\"error\":{\"message\":\"engine overloaded\",\"type\":\"overloaded_error\",\"code\":529}}\n\n",
        ),
        (11, "data: [DONE]\n\n"),
    ]);
    assert_server_error(&r, "overloaded_error", Some("529"), "engine overloaded");
    assert_eq!((r.ttft, r.e2e, r.done_marker_seen), (None, ms(11), true));

    let r = measure(&[
        (10, TOKEN_A),
        (20, TOKEN_B),
        (
            30,
            "event: error\r\ndata: {\"message\":\"worker died\",\"type\":\"internal_error\"}\r\n\r\n",
        ),
    ]);
    assert_server_error(&r, "internal_error", None, "worker died");
    assert_eq!(
        (r.ttft, r.token_chunk_times.len()),
        (Some(ms(10)), 2),
        "tokens before the error kept"
    );

    // Plain text data, and no data at all.
    let r = measure(&[
        (10, TOKEN_A),
        (20, "event: error\ndata: upstream timeout\n\n"),
    ]);
    assert_eq!(
        r.error
            .as_ref()
            .map(|e| (e.error_type.as_str(), e.message.as_deref())),
        Some((error_type::STREAM_ERROR, Some("upstream timeout")))
    );
    assert_eq!(
        measure(&[(10, TOKEN_A), (20, "event: error\n\n")]).outcome,
        Outcome::Error
    );
}

#[test]
fn bare_json_error_after_tokens() {
    let bare = "{\"error\":{\"code\":500,\"message\":\"CUDA error: out of memory\",\"type\":\"server_error\"}}";
    // One line at the end of the body, no newline.
    let r = measure(&[(10, TOKEN_A), (20, TOKEN_B), (30, bare)]);
    assert_server_error(&r, "server_error", Some("500"), "out of memory");
    assert_eq!(
        (r.ttft, r.token_chunk_times.len(), r.e2e),
        (Some(ms(10)), 2, ms(30))
    );
    // Pretty-printed over several lines, then the stream goes on.
    let pretty = "{\n  \"error\": {\n    \"message\": \"slot 0 crashed\",\n    \"type\": \"server_error\"\n  }\n}\n";
    let r = measure(&[
        (10, TOKEN_A),
        (20, pretty),
        (
            30,
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
        ),
    ]);
    assert_server_error(&r, "server_error", None, "slot 0 crashed");
    // The flat shape without the wrapper, before tokens.
    let r = measure(&[(
        5,
        "{\"object\":\"error\",\"message\":\"bad prompt\",\"type\":\"BadRequestError\",\"code\":400}\n",
    )]);
    assert_server_error(&r, "BadRequestError", Some("400"), "bad prompt");
    // An `error:` field line after tokens.
    let r = measure(&[
        (10, TOKEN_A),
        (
            20,
            "error: {\"message\":\"context shift disabled\",\"type\":\"invalid_request_error\",\"code\":400}\n\n",
        ),
    ]);
    assert_server_error(&r, "invalid_request_error", Some("400"), "context shift");
    // A data: chunk with an error after tokens.
    let r = measure(&[
        (10, TOKEN_A),
        (
            20,
            "data: {\"error\":{\"message\":\"aborted by engine\",\"type\":\"EngineDeadError\"}}\n\n",
        ),
    ]);
    assert_server_error(&r, "EngineDeadError", None, "aborted by engine");
    // Bare JSON that is no error is ignored as SSE would.
    let r = measure(&[
        (10, "{\"status\":\"warming\"}\n"),
        (20, TOKEN_A),
        (
            30,
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
        ),
    ]);
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error);
}

fn big_event(text_bytes: usize) -> Vec<u8> {
    let mut ev = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"".to_vec();
    ev.extend(std::iter::repeat_n(b'x', text_bytes));
    ev.extend_from_slice(b"\"},\"finish_reason\":null}]}\n\n");
    ev
}

#[test]
fn ten_mib_event_is_measured_under_the_default_cap() {
    let ev = big_event(10 << 20);
    let done = b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n";
    let mut frames: Vec<(u64, &[u8])> = vec![(10, TOKEN_A.as_bytes())];
    // The event arrives in 64 KiB reads from 20 ms to 180 ms; it counts when its last read does.
    let pieces: Vec<&[u8]> = ev.chunks(64 << 10).collect();
    let n = pieces.len() as u64;
    for (i, p) in pieces.iter().enumerate() {
        frames.push((20 + 160 * i as u64 / (n - 1), p));
    }
    frames.push((190, &done[..]));
    let r = measure_with(DEFAULT_MAX_EVENT_BYTES, &frames, StreamEnd::Eof);
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error);
    assert_eq!(r.token_chunk_times, vec![ms(10), ms(180)]);
    assert_eq!(
        r.output_text.as_ref().map(String::len),
        Some(1 + (10 << 20))
    );
    assert_eq!((r.output_tokens, r.e2e), (Some(9), ms(190)));
}

#[test]
fn an_event_over_the_cap_keeps_ttft_and_tokens_so_far() {
    let ev = big_event(8 << 10);
    let r = measure_with(
        4096,
        &[
            (10, TOKEN_A.as_bytes()),
            (20, TOKEN_B.as_bytes()),
            (30, &ev),
            (40, TOKEN_A.as_bytes()),
        ],
        StreamEnd::Eof,
    );
    assert_eq!(r.outcome, Outcome::Error);
    assert_eq!(
        r.error.as_ref().map(|e| e.error_type.as_str()),
        Some(error_type::SSE_EVENT_TOO_LARGE)
    );
    assert_eq!(
        (r.ttft, r.token_chunk_times.len(), r.output_tokens),
        (Some(ms(10)), 2, Some(2))
    );
    assert_eq!(r.output_text.as_deref(), Some("ab"));
}

#[test]
fn n3_completions_are_measured_per_choice() {
    let c = |t: &str| format!("data: {{\"object\":\"text_completion\",\"choices\":[{t}]}}\n\n");
    let r = measure(&[
        (
            50,
            &c(
                r#"{"index":0,"text":"A","finish_reason":null},{"index":2,"text":"C","finish_reason":null}"#,
            ),
        ),
        (70, &c(r#"{"index":1,"text":"B","finish_reason":null}"#)),
        (
            90,
            &c(
                r#"{"index":2,"text":"c","finish_reason":"stop"},{"index":0,"text":"a","finish_reason":null}"#,
            ),
        ),
        (100, &c(r#"{"index":1,"text":"b","finish_reason":null}"#)),
        (
            130,
            &c(
                r#"{"index":0,"text":"!","finish_reason":"length"},{"index":1,"text":"","finish_reason":"stop"}"#,
            ),
        ),
        (
            131,
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n",
        ),
    ]);
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error);
    assert_eq!(r.ttft, Some(ms(50)), "first token of any choice");
    assert_eq!(r.tpot, None, "no request-level TPOT across choices");
    assert_eq!((r.output_tokens, r.e2e), (Some(7), ms(131)));
    assert_eq!(
        r.finish_reasons,
        vec!["length", "stop", "stop"],
        "by choice index"
    );
    let got: Vec<_> = r
        .choices
        .iter()
        .map(|c| {
            (
                c.index,
                c.first_token,
                c.last_token,
                c.token_chunks,
                c.finish_reason.as_deref(),
                c.text.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                0,
                Some(ms(50)),
                Some(ms(130)),
                3,
                Some("length"),
                Some("Aa!")
            ),
            (1, Some(ms(70)), Some(ms(100)), 2, Some("stop"), Some("Bb")),
            (2, Some(ms(50)), Some(ms(90)), 2, Some("stop"), Some("Cc")),
        ]
    );
    assert_eq!(r.choices[0].itl, vec![ms(40), ms(40)]);
    assert_eq!(r.choices[0].tpot, Some(ms(40)));
    assert_eq!(r.choices[1].tpot, Some(ms(30)));
    assert_eq!(
        r.itl,
        vec![ms(40), ms(40), ms(30), ms(40)],
        "per-choice gaps, never across choices"
    );
    assert_eq!(r.output_text.as_deref(), Some("Aa!"), "the lowest index");
}

/// llama.cpp with `n = 2` (recorded from the test model server, trimmed): each choice's finish
/// is followed by a usage chunk with no choices that counts that choice alone (4 + 4 tokens);
/// the request used 8 output tokens, not the last chunk's 4. Its prompt is one prompt (25).
#[test]
fn llamacpp_n2_usage_per_choice_is_summed() {
    let c = |i: u32, text: &str, finish: &str| {
        format!(
            "data: {{\"choices\":[{{\"finish_reason\":{finish},\"index\":{i},\"delta\":{{\"content\":\"{text}\"}}}}],\"object\":\"chat.completion.chunk\"}}\n\n"
        )
    };
    let usage = "data: {\"choices\":[],\"object\":\"chat.completion.chunk\",\"usage\":{\"completion_tokens\":4,\"prompt_tokens\":25,\"total_tokens\":29}}\n\n";
    let frames = [
        (10, c(1, "<", "null")),
        (11, c(0, "<", "null")),
        (20, c(1, "|", "null")),
        (21, c(0, "|", "null")),
        (30, c(1, "im", "null")),
        (31, c(0, "im", "null")),
        (40, c(1, "_", "null")),
        (41, c(1, "", "\"length\"")),
        (42, usage.to_owned()),
        (50, c(0, "_", "null")),
        (51, c(0, "", "\"length\"")),
        (52, format!("{usage}data: [DONE]\n\n")),
    ];
    let frames: Vec<(u64, &str)> = frames.iter().map(|(t, s)| (*t, s.as_str())).collect();
    let r = measure(&frames);
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error);
    assert_eq!((r.output_tokens, r.input_tokens), (Some(8), Some(25)));
    assert_eq!(
        r.choices.iter().map(|c| c.token_chunks).collect::<Vec<_>>(),
        vec![4, 4]
    );
}

/// vLLM with `n = 2`: one usage chunk after the last finish counts the whole request (9); it is
/// taken as it is, not split or added to.
#[test]
fn vllm_n2_single_usage_is_the_request() {
    let c = |i: u32, text: &str, finish: &str| {
        format!(
            "data: {{\"choices\":[{{\"finish_reason\":{finish},\"index\":{i},\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
        )
    };
    let frames = [
        (10, c(0, "a", "null")),
        (11, c(1, "b", "null")),
        (20, c(0, "c", "\"stop\"")),
        (30, c(1, "d", "\"stop\"")),
        (31, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n".to_owned()),
    ];
    let frames: Vec<(u64, &str)> = frames.iter().map(|(t, s)| (*t, s.as_str())).collect();
    let r = measure(&frames);
    assert_eq!((r.output_tokens, r.input_tokens), (Some(9), Some(6)));
}
