//! vllm-router's own clock on one request (issue 52.4): with `VLLM_ROUTER_STAGES=1` the router
//! (0.1.17: `routers::http::router::insert_router_stages` in the installed binary) answers every
//! request with an `x-router-stages` header (and, on a stream, a `: router-stages {…}` SSE
//! comment), a JSON object of the worker leg's timings in ms, checked on a live 0.1.17:
//! `{"path":"http_proxy","http_ttfb_ms":5.45,"http_first_sse_ms":5.45,"xfer_ms":5.45,
//! "first_token_ms":6.13,"engine_ms":0.68}`: `http_ttfb_ms` the worker's response headers,
//! `http_first_sse_ms` its first SSE bytes, `first_token_ms` its first token, `engine_ms` the
//! first token after the first bytes. A field absent, `null`, negative or not finite is absent
//! here, never 0.

use serde::Serialize;

/// The response header that carries the stages.
pub const HEADER: &str = "x-router-stages";

/// The router's account of one request, ms on its clock; `None` where it did not say.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RouterStages {
    pub http_ttfb_ms: Option<f64>,
    pub http_first_sse_ms: Option<f64>,
    pub first_token_ms: Option<f64>,
    pub engine_ms: Option<f64>,
}

impl RouterStages {
    /// The stages of a header's value; `None` when it is not a JSON object or says none.
    pub fn parse(value: &str) -> Option<RouterStages> {
        let v: serde_json::Value = serde_json::from_str(value).ok()?;
        let f = |k: &str| v.get(k)?.as_f64().filter(|x| x.is_finite() && *x >= 0.0);
        let s = RouterStages {
            http_ttfb_ms: f("http_ttfb_ms"),
            http_first_sse_ms: f("http_first_sse_ms"),
            first_token_ms: f("first_token_ms"),
            engine_ms: f("engine_ms"),
        };
        let any = [
            s.http_ttfb_ms,
            s.http_first_sse_ms,
            s.first_token_ms,
            s.engine_ms,
        ]
        .iter()
        .any(Option::is_some);
        any.then_some(s)
    }

    /// The client's TTFT minus the router's first token: the time outside the router's clock
    /// (the network between client and router, the router's own work before its timer), ms.
    pub fn outside_ms(&self, client_ttft_ms: f64) -> Option<f64> {
        self.first_token_ms.map(|r| client_ttft_ms - r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_header_and_bad_ones() {
        let s = RouterStages::parse(
            r#"{"path":"http_proxy","http_ttfb_ms":5.4528490000000005,"http_first_sse_ms":6.130735,"xfer_ms":5.45,"first_token_ms":6.130735,"engine_ms":0.6778859999999991}"#,
        )
        .expect("stages");
        assert_eq!(s.http_ttfb_ms, Some(5.4528490000000005));
        assert_eq!(s.first_token_ms, Some(6.130735));
        assert_eq!(s.engine_ms, Some(0.6778859999999991));
        assert_eq!(s.outside_ms(10.0), Some(10.0 - 6.130735));
        assert_eq!(RouterStages::parse("not json"), None);
        assert_eq!(RouterStages::parse(r#"{"path":"x"}"#), None);
        let partial =
            RouterStages::parse(r#"{"first_token_ms":null,"http_ttfb_ms":-1,"engine_ms":2}"#)
                .expect("one field");
        assert_eq!(
            (
                partial.first_token_ms,
                partial.http_ttfb_ms,
                partial.engine_ms
            ),
            (None, None, Some(2.0))
        );
        assert_eq!(partial.outside_ms(10.0), None);
    }
}
