//! Which worker(s) behind a router served a request, from what the router itself returned
//! (issue 36, "Routed targets"). Pure: the HTTP client hands over the response's fields and
//! headers; nothing here guesses: a response that names no worker is
//! [`AttributionSource::Unattributed`].
//!
//! What each stack returns (upstream sources; `docs/serving-path.md` has the full table):
//! - **NVIDIA Dynamo** (frontend with its router): asked with `"nvext": {"extra_fields":
//!   ["worker_id"]}` in the request body, every stream chunk carries
//!   `"nvext": {"worker_id": {"prefill_worker_id": u64, "prefill_dp_rank": u32,
//!   "decode_worker_id": u64, "decode_dp_rank": u32}}` (`WorkerIdInfo` / `NvExtResponse` in
//!   ai-dynamo/dynamo `lib/llm/src/protocols/openai/nvext.rs`; `extra_fields` in
//!   `docs/pages/components/frontend/nvext.md`). An aggregated worker appears as both, with one
//!   id; a disaggregated request names its prefill and its decode worker. The ids are the
//!   workers' instance ids, as their own logs (`instance_id=`) and the frontend's
//!   `dynamo_frontend_worker_*{worker_id=…}` series print them (decimal).
//! - **llm-d** (inference scheduler / EPP, session affinity): the response header
//!   `x-session-token` holds base64(`namespace/pod`) of the decode (or only) pod and
//!   `x-session-token-prefill` that of the prefill pod (llm-d/llm-d-inference-scheduler,
//!   the session-affinity scorer and filter, `headerName` / `encodedEndpointHeaderConfig`);
//!   versions whose scorer sets the `llm-d-session` cookie instead
//!   (`pkg/plugins/scorer/session_affinity.go`: `SessionCookieName`) carry the same value in
//!   `Set-Cookie`. Go's `base64.StdEncoding`: standard alphabet, padded.
//! - **SGLang's model gateway** (lightseekorg/smg, HTTP workers): the response header
//!   `x-smg-routed-worker-id` holds the URL of the worker that served the request, with an
//!   `@<rank>` suffix for a data-parallel worker; for a prefill/decode pair it names the decode
//!   worker (`docs/reference/api` "Response Headers", `docs/concepts/routing/sticky-sessions.md`
//!   "Routed worker header"). The header alone cannot tell an aggregated worker from a decode
//!   worker: it is recorded as [`WorkerRole::Agg`].
//! - **vllm-router** (vllm-project/router): forwards the worker's own response headers
//!   (`src/routers/header_utils.rs`, `preserve_response_headers`) and adds `x-request-id`;
//!   nothing names the worker, so its requests are unattributed.

use serde::{Deserialize, Serialize};

/// The part one worker played in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerRole {
    /// Ran the prefill only (disaggregated serving); another worker decoded.
    Prefill,
    /// Decoded (streamed the tokens) after another worker's prefill.
    Decode,
    /// Ran both prefill and decode (aggregated serving).
    Agg,
}

impl WorkerRole {
    /// The `lmperf.worker.role` value: `prefill`, `decode` or `agg`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerRole::Prefill => "prefill",
            WorkerRole::Decode => "decode",
            WorkerRole::Agg => "agg",
        }
    }
}

/// Where an attribution came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttributionSource {
    /// Dynamo's `nvext.worker_id` in the stream's chunks.
    DynamoNvext,
    /// llm-d's `x-session-token` / `x-session-token-prefill` headers or `llm-d-session` cookie.
    LlmDHeader,
    /// SGLang's model gateway's `x-smg-routed-worker-id` header.
    SmgHeader,
    /// The router's response named no worker.
    Unattributed,
}

impl AttributionSource {
    /// The `lmperf.worker.attribution` value.
    pub fn as_str(self) -> &'static str {
        match self {
            AttributionSource::DynamoNvext => "dynamo_nvext",
            AttributionSource::LlmDHeader => "llm_d_header",
            AttributionSource::SmgHeader => "smg_header",
            AttributionSource::Unattributed => "unattributed",
        }
    }
}

/// One worker that served (part of) a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServedWorker {
    /// The router's name for it: a Dynamo instance id (decimal) or llm-d's `namespace/pod`.
    pub id: String,
    pub role: WorkerRole,
    /// Dynamo's data-parallel rank inside the worker, where it said one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
}

/// The workers a routed request went to, and how that is known. `workers` is empty exactly
/// when `source` is [`AttributionSource::Unattributed`]; otherwise it holds one
/// [`WorkerRole::Agg`] worker, or a [`WorkerRole::Prefill`] and a [`WorkerRole::Decode`]
/// one, or a single prefill or decode worker when the router named only that one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServedBy {
    pub source: AttributionSource,
    pub workers: Vec<ServedWorker>,
}

/// Dynamo's `nvext.worker_id` object (`WorkerIdInfo`), as the chunk carries it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct DynamoWorkerIds {
    #[serde(default)]
    pub prefill_worker_id: Option<u64>,
    #[serde(default)]
    pub prefill_dp_rank: Option<u32>,
    #[serde(default)]
    pub decode_worker_id: Option<u64>,
    #[serde(default)]
    pub decode_dp_rank: Option<u32>,
}

/// An llm-d session token that is not base64 of `namespace/pod`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerTokenError {
    #[error("{header}: {value:?} is not standard base64")]
    NotBase64 { header: &'static str, value: String },
    #[error("{header}: {value:?} decodes to {decoded:?}, not namespace/pod")]
    NotNamespacedName {
        header: &'static str,
        value: String,
        decoded: String,
    },
}

/// llm-d's header naming the decode (or only) pod.
pub const LLM_D_TOKEN_HEADER: &str = "x-session-token";
/// llm-d's header naming the prefill pod of a disaggregated request.
pub const LLM_D_PREFILL_TOKEN_HEADER: &str = "x-session-token-prefill";
/// SGLang's model gateway's routed-worker response header.
pub const SMG_ROUTED_WORKER_HEADER: &str = "x-smg-routed-worker-id";
/// llm-d's session cookie (the scorer versions that set a cookie rather than a header).
pub const LLM_D_SESSION_COOKIE: &str = "llm-d-session";
/// llm-d's endpoint picker's reason for a request it dropped, on its 429 and 503 answers
/// (llm-d/llm-d-router `RequestDroppedReasonHeaderKey`: `rejected-saturated`,
/// `rejected-no-endpoints`, `rejected-ttl-expired`, an `evicted-…` reason after dispatch, …).
pub const LLM_D_DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";

/// Names a router's reason for dropping a request (the value of [`LLM_D_DROPPED_REASON_HEADER`])
/// in its error: the message then starts `dropped by the router: <reason>`, before the body's
/// own message (the status excerpt keeps a message's first 120 characters). An empty or
/// over-long reason (more than 64 bytes: not one of the picker's names) is ignored.
pub fn name_dropped_reason(e: &mut crate::RequestError, reason: &str) {
    let reason = reason.trim();
    if reason.is_empty() || reason.len() > 64 {
        return;
    }
    let said = format!("dropped by the router: {reason}");
    e.message = Some(match e.message.take() {
        Some(m) => format!("{said}; {m}"),
        None => said,
    });
}

impl ServedBy {
    /// Nothing in the response named a worker.
    pub fn unattributed() -> Self {
        Self {
            source: AttributionSource::Unattributed,
            workers: Vec::new(),
        }
    }

    /// From Dynamo's `nvext.worker_id`; `None` when it names no worker. Equal prefill and
    /// decode ids are one aggregated worker.
    pub fn from_dynamo(ids: &DynamoWorkerIds) -> Option<Self> {
        let worker = |id: u64, role, dp_rank| ServedWorker {
            id: id.to_string(),
            role,
            dp_rank,
        };
        let workers = match (ids.prefill_worker_id, ids.decode_worker_id) {
            (None, None) => return None,
            (Some(p), Some(d)) if p == d => {
                vec![worker(d, WorkerRole::Agg, ids.decode_dp_rank)]
            }
            (Some(p), Some(d)) => vec![
                worker(p, WorkerRole::Prefill, ids.prefill_dp_rank),
                worker(d, WorkerRole::Decode, ids.decode_dp_rank),
            ],
            (Some(p), None) => vec![worker(p, WorkerRole::Prefill, ids.prefill_dp_rank)],
            (None, Some(d)) => vec![worker(d, WorkerRole::Decode, ids.decode_dp_rank)],
        };
        Some(Self {
            source: AttributionSource::DynamoNvext,
            workers,
        })
    }

    /// From llm-d's tokens: `decode` is `x-session-token` (or the `llm-d-session` cookie's
    /// value), `prefill` is `x-session-token-prefill`. `Ok(None)` when neither is present.
    /// Without a prefill token (or with one naming the same pod) the pod is
    /// [`WorkerRole::Agg`].
    ///
    /// # Errors
    /// A token that is not base64 of `namespace/pod`, naming its header and value.
    pub fn from_llm_d(
        decode: Option<&str>,
        prefill: Option<&str>,
    ) -> Result<Option<Self>, WorkerTokenError> {
        let decode = decode
            .map(|v| decode_pod_token(LLM_D_TOKEN_HEADER, v))
            .transpose()?;
        let prefill = prefill
            .map(|v| decode_pod_token(LLM_D_PREFILL_TOKEN_HEADER, v))
            .transpose()?;
        let worker = |id: String, role| ServedWorker {
            id,
            role,
            dp_rank: None,
        };
        let workers = match (prefill, decode) {
            (None, None) => return Ok(None),
            (Some(p), Some(d)) if p == d => vec![worker(d, WorkerRole::Agg)],
            (Some(p), Some(d)) => vec![
                worker(p, WorkerRole::Prefill),
                worker(d, WorkerRole::Decode),
            ],
            (Some(p), None) => vec![worker(p, WorkerRole::Prefill)],
            (None, Some(d)) => vec![worker(d, WorkerRole::Agg)],
        };
        Ok(Some(Self {
            source: AttributionSource::LlmDHeader,
            workers,
        }))
    }

    /// From SGLang's model gateway's `x-smg-routed-worker-id` value: the worker's URL, its
    /// data-parallel rank from an `@<rank>` suffix. `None` for an empty value.
    pub fn from_smg(value: &str) -> Option<Self> {
        let value = value.trim();
        let (url, dp_rank) = match value.rsplit_once('@') {
            Some((u, r)) if !u.is_empty() && r.parse::<u32>().is_ok() => (u, r.parse().ok()),
            _ => (value, None),
        };
        (!url.is_empty()).then(|| Self {
            source: AttributionSource::SmgHeader,
            workers: vec![ServedWorker {
                id: url.to_owned(),
                role: WorkerRole::Agg,
                dp_rank,
            }],
        })
    }

    /// One label per path through the router: the worker's id, `PREFILL→DECODE` for a
    /// disaggregated request, `unattributed` when the router named none (per-worker counts).
    pub fn key(&self) -> String {
        match (self.prefill(), self.primary()) {
            (Some(p), Some(d)) => format!("{}→{}", p.id, d.id),
            (None, Some(w)) => w.id.clone(),
            _ => self.source.as_str().to_owned(),
        }
    }

    /// The worker that streamed the tokens (decode or aggregated), else the only one named.
    pub fn primary(&self) -> Option<&ServedWorker> {
        self.workers
            .iter()
            .find(|w| w.role != WorkerRole::Prefill)
            .or_else(|| self.workers.first())
    }

    /// The separate prefill worker of a disaggregated request.
    pub fn prefill(&self) -> Option<&ServedWorker> {
        self.workers
            .iter()
            .find(|w| w.role == WorkerRole::Prefill && self.workers.len() > 1)
    }
}

/// The value of the `llm-d-session` cookie in one `Set-Cookie` header value, if it sets it.
pub fn llm_d_cookie(set_cookie: &str) -> Option<&str> {
    let first = set_cookie.split(';').next()?.trim();
    let (name, value) = first.split_once('=')?;
    (name.trim() == LLM_D_SESSION_COOKIE && !value.is_empty()).then_some(value.trim())
}

/// base64(`namespace/pod`) → `namespace/pod`.
fn decode_pod_token(header: &'static str, value: &str) -> Result<String, WorkerTokenError> {
    let value = value.trim();
    let bytes = base64_std(value).ok_or_else(|| WorkerTokenError::NotBase64 {
        header,
        value: value.to_owned(),
    })?;
    let decoded = String::from_utf8_lossy(&bytes).into_owned();
    match decoded.split_once('/') {
        Some((ns, pod)) if !ns.is_empty() && !pod.is_empty() && !pod.contains('/') => Ok(decoded),
        _ => Err(WorkerTokenError::NotNamespacedName {
            header,
            value: value.to_owned(),
            decoded,
        }),
    }
}

/// RFC 4648 standard base64 with padding (Go's `base64.StdEncoding`); `None` when malformed.
fn base64_std(s: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    }
    let bytes = s.as_bytes();
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let quads = bytes.len() / 4;
    for (qi, quad) in bytes.chunks_exact(4).enumerate() {
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && qi + 1 != quads) {
            return None;
        }
        let mut n = 0u32;
        for &c in &quad[..4 - pad] {
            n = (n << 6) | sextet(c)?;
        }
        n <<= 6 * pad as u32;
        let [_, a, b, c] = n.to_be_bytes();
        out.extend_from_slice(&[a, b, c][..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llm-d's dropped reason leads the error's message; nonsense is not believed.
    #[test]
    fn dropped_reason_named_in_the_error() {
        let mut e =
            crate::RequestError::new("429", Some("inference error: ResourceExhausted".into()));
        name_dropped_reason(&mut e, " rejected-saturated ");
        assert_eq!(
            e.message.as_deref(),
            Some("dropped by the router: rejected-saturated; inference error: ResourceExhausted")
        );
        assert_eq!(e.error_type, "429");
        let mut bare = crate::RequestError::new("503", None);
        name_dropped_reason(&mut bare, &"x".repeat(65));
        assert_eq!(bare.message, None);
        name_dropped_reason(&mut bare, "rejected-no-endpoints");
        assert_eq!(
            bare.message.as_deref(),
            Some("dropped by the router: rejected-no-endpoints")
        );
    }

    fn ids(p: Option<u64>, d: Option<u64>) -> DynamoWorkerIds {
        DynamoWorkerIds {
            prefill_worker_id: p,
            prefill_dp_rank: p.map(|_| 0),
            decode_worker_id: d,
            decode_dp_rank: d.map(|_| 1),
        }
    }

    #[test]
    fn dynamo_same_ids_are_one_aggregated_worker() {
        // As the real frontend sent it for an agg mocker (two mockers, KV router).
        let v: DynamoWorkerIds = serde_json::from_str(
            r#"{"prefill_worker_id":10871860533245687744,"prefill_dp_rank":0,"decode_worker_id":10871860533245687744,"decode_dp_rank":0}"#,
        )
        .unwrap();
        let s = ServedBy::from_dynamo(&v).unwrap();
        assert_eq!(s.source, AttributionSource::DynamoNvext);
        assert_eq!(
            s.workers,
            vec![ServedWorker {
                id: "10871860533245687744".into(),
                role: WorkerRole::Agg,
                dp_rank: Some(0)
            }]
        );
        assert_eq!(s.primary().unwrap().id, "10871860533245687744");
        assert_eq!(s.prefill(), None);
    }

    #[test]
    fn dynamo_disaggregated_names_prefill_and_decode() {
        let s = ServedBy::from_dynamo(&ids(Some(9974008248297793723), Some(6926868861057897543)))
            .unwrap();
        assert_eq!(s.workers.len(), 2);
        assert_eq!(s.workers[0].id, "9974008248297793723");
        assert_eq!(s.workers[0].role, WorkerRole::Prefill);
        assert_eq!(s.workers[0].dp_rank, Some(0));
        assert_eq!(s.workers[1].id, "6926868861057897543");
        assert_eq!(s.workers[1].role, WorkerRole::Decode);
        assert_eq!(s.workers[1].dp_rank, Some(1));
        assert_eq!(s.primary().unwrap().role, WorkerRole::Decode);
        assert_eq!(s.prefill().unwrap().id, "9974008248297793723");
    }

    #[test]
    fn dynamo_one_side_keeps_its_role_and_none_is_none() {
        let d = ServedBy::from_dynamo(&ids(None, Some(7))).unwrap();
        assert_eq!(d.workers[0].role, WorkerRole::Decode);
        assert_eq!(d.primary().unwrap().id, "7");
        let p = ServedBy::from_dynamo(&ids(Some(5), None)).unwrap();
        assert_eq!(p.workers[0].role, WorkerRole::Prefill);
        // A lone prefill worker is the primary one named, not "the separate prefill".
        assert_eq!(p.primary().unwrap().id, "5");
        assert_eq!(p.prefill(), None);
        assert_eq!(ServedBy::from_dynamo(&DynamoWorkerIds::default()), None);
    }

    #[test]
    fn llm_d_tokens_decode_to_namespaced_pods() {
        // base64("default/vllm-decode-0"), base64("default/vllm-prefill-1")
        let d = "ZGVmYXVsdC92bGxtLWRlY29kZS0w";
        let p = "ZGVmYXVsdC92bGxtLXByZWZpbGwtMQ==";
        let s = ServedBy::from_llm_d(Some(d), Some(p)).unwrap().unwrap();
        assert_eq!(s.source, AttributionSource::LlmDHeader);
        assert_eq!(s.workers[0].id, "default/vllm-prefill-1");
        assert_eq!(s.workers[0].role, WorkerRole::Prefill);
        assert_eq!(s.workers[1].id, "default/vllm-decode-0");
        assert_eq!(s.workers[1].role, WorkerRole::Decode);
        let only = ServedBy::from_llm_d(Some(d), None).unwrap().unwrap();
        assert_eq!(only.workers.len(), 1);
        assert_eq!(only.workers[0].role, WorkerRole::Agg);
        let same = ServedBy::from_llm_d(Some(d), Some(d)).unwrap().unwrap();
        assert_eq!(same.workers[0].role, WorkerRole::Agg);
        assert_eq!(ServedBy::from_llm_d(None, None), Ok(None));
    }

    #[test]
    fn smg_header_names_the_worker_url_and_its_rank() {
        let by = ServedBy::from_smg("http://10.0.0.7:8000@3").unwrap();
        assert_eq!(by.source.as_str(), "smg_header");
        assert_eq!(
            by.workers,
            [ServedWorker {
                id: "http://10.0.0.7:8000".into(),
                role: WorkerRole::Agg,
                dp_rank: Some(3),
            }]
        );
        assert_eq!(by.key(), "http://10.0.0.7:8000");
        // No rank suffix; an `@` that is not a rank stays in the id; nothing named.
        let plain = ServedBy::from_smg(" http://w:1 ").unwrap();
        assert_eq!(
            (plain.workers[0].id.as_str(), plain.workers[0].dp_rank),
            ("http://w:1", None)
        );
        let odd = ServedBy::from_smg("http://user@w:1").unwrap();
        assert_eq!(odd.workers[0].id, "http://user@w:1");
        assert_eq!(ServedBy::from_smg("  "), None);
    }

    #[test]
    fn llm_d_bad_tokens_name_the_header_and_value() {
        let e = ServedBy::from_llm_d(Some("not base64!"), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"x-session-token: "not base64!" is not standard base64"#
        );
        // base64("nopod")
        let e = ServedBy::from_llm_d(None, Some("bm9wb2Q=")).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"x-session-token-prefill: "bm9wb2Q=" decodes to "nopod", not namespace/pod"#
        );
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (enc, dec) in [
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(base64_std(enc).as_deref(), Some(dec.as_bytes()), "{enc}");
        }
        for bad in ["", "Zg=", "Zg===", "Z===", "Zg==Zm9v", "Zm9-", "Zm9_"] {
            assert_eq!(base64_std(bad), None, "{bad}");
        }
    }

    #[test]
    fn cookie_value_is_read_from_set_cookie() {
        assert_eq!(
            llm_d_cookie("llm-d-session=ZGVmYXVsdC92bGxtLWRlY29kZS0w; Path=/; HttpOnly"),
            Some("ZGVmYXVsdC92bGxtLWRlY29kZS0w")
        );
        assert_eq!(llm_d_cookie("other=1; Path=/"), None);
        assert_eq!(llm_d_cookie("llm-d-session=; Path=/"), None);
    }
}
