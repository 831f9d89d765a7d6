//! A small PromQL reader and the check of a query's names against an agent's `/metrics`: the
//! dashboards (tests/dashboards.rs) and the alerting rules (tests/alerts.rs) may only name
//! metrics and labels the agent exports, or ones listed as pending with the issue that adds them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::Agent;
use crate::scripted::{Reply, ScriptedServer, chat_stream};

/// Labels Prometheus adds at scrape time (`instance`, `job`) or the chart's ServiceMonitor
/// adds by relabelling (`node`): never on `/metrics` itself.
pub const SCRAPE_LABELS: &[&str] = &["instance", "job", "node"];

/// A real agent's `/metrics` once every series the dashboards and rules name has samples: the
/// agent probes three static scripted servers (streaming; 503; a stream cut after its first
/// tokens, a failed request with a TTFT, so the latency histograms carry `error_type` too), a
/// router target in front of the streaming one with a direct path to it (the serving path), and
/// one pod it discovers through the scripted Kubernetes API server ([`K8S_POD`], at the
/// streaming server), so the `k8s_*` labels of discovered targets are in the scrape.
/// A router's `/metrics`: vllm-router 0.1.17's page (`tests/fixtures/server/vllm-router.a.prom`,
/// both workers healthy), its pick counters grown by the page's own counts at each scrape, so
/// every interval has picks (2 and 3: shares 0.4 and 0.6) and each worker's share exists; and
/// Dynamo's two pool gauges of a disaggregated frontend (a prefill and a decode worker), so the
/// pools' load is exported too.
pub async fn router_page() -> ScriptedServer {
    let page = std::fs::read_to_string(
        crate::agent::workspace_root().join("tests/fixtures/server/vllm-router.a.prom"),
    )
    .expect("fixture page");
    let scrapes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    ScriptedServer::start(Arc::new(move |_, _| {
        let n = scrapes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let text: String = page
            .lines()
            .map(|l| match l.rsplit_once(' ') {
                Some((series, v)) if series.starts_with("vllm_router_processed_requests_total") => {
                    let v: f64 = v.parse().unwrap_or(0.0);
                    format!("{series} {}\n", v * n as f64)
                }
                _ => format!("{l}\n"),
            })
            .chain([
                // A disaggregated router's pools, as Dynamo's frontend says them.
                "dynamo_frontend_worker_active_prefill_tokens{dp_rank=\"0\",worker_id=\"1\",worker_type=\"prefill\"} 120\n".to_owned(),
                "dynamo_frontend_worker_active_decode_blocks{dp_rank=\"0\",worker_id=\"2\",worker_type=\"decode\"} 40\n".to_owned(),
            ])
            .collect();
        Reply::Stream {
            status: 200,
            content_type: "text/plain; version=0.0.4".into(),
            frames: vec![crate::scripted::Frame {
                at: Duration::ZERO,
                bytes: text.into_bytes(),
            }],
            cut: false,
        }
    }))
    .await
}

/// A Dynamo frontend in front of prefill/decode workers, as its replies look: a short chat
/// stream whose last chunk before the usage carries `nvext.timing` with a KV transfer
/// (`kv_transfer_estimated_latency_ms`), so a router target's TTFT split (and its
/// `transfer_and_first_decode` segment) exists.
pub async fn dynamo_pd_frontend() -> ScriptedServer {
    ScriptedServer::start(Arc::new(|_, _| {
        let mut frames = chat_stream(3, Duration::from_millis(20), Duration::from_millis(2), 4);
        let timing = crate::scripted::Frame {
            at: Duration::from_millis(24),
            bytes: br#"data: {"id":"chatcmpl-s","model":"scripted","choices":[],"nvext":{"timing":{"prefill_wait_time_ms":2.0,"prefill_time_ms":4.0,"ttft_ms":8.0,"total_time_ms":30.0,"kv_transfer_estimated_latency_ms":9.0}}}

"#
            .to_vec(),
        };
        let last = frames.len() - 1;
        frames.insert(last, timing);
        Reply::sse(frames)
    }))
    .await
}

pub async fn agent_metrics() -> String {
    // Its /metrics is a vLLM page (tests/fixtures/server): a, b, then a again (a restart), so
    // the lmperf.server.* gauges, counters, latencies and a change event all have samples.
    let pages = ["a", "b", "a"].map(|s| {
        std::fs::read_to_string(
            crate::agent::workspace_root().join(format!("tests/fixtures/server/vllm-new.{s}.prom")),
        )
        .expect("fixture page")
    });
    let scrapes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ok = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path == "/metrics" {
            let i = scrapes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Reply::Stream {
                status: 200,
                content_type: "text/plain; version=0.0.4".into(),
                frames: vec![crate::scripted::Frame {
                    at: Duration::ZERO,
                    bytes: pages[i.min(2)].clone().into_bytes(),
                }],
                cut: false,
            };
        }
        Reply::sse(chat_stream(
            3,
            Duration::from_millis(5),
            Duration::from_millis(5),
            4,
        ))
    }))
    .await;
    let failing = ScriptedServer::start(Arc::new(|_, _| {
        Reply::json(503, r#"{"error":"overloaded"}"#)
    }))
    .await;
    let cut = ScriptedServer::start(Arc::new(|_, _| {
        let mut frames = chat_stream(3, Duration::from_millis(5), Duration::from_millis(5), 4);
        frames.truncate(2);
        Reply::Stream {
            status: 200,
            content_type: "text/event-stream".into(),
            frames,
            cut: true,
        }
    }))
    .await;
    let router_page = router_page().await;
    let frontend = dynamo_pd_frontend().await;
    let (api, config, kubeconfig) = k8s_discovery("dashboards-k8s", ok.addr.port()).await;
    // The static targets in the file beside the discovery (flags would replace the file's),
    // and a router target in front of the streaming server with direct paths to it (twice,
    // by two names) and to the failing one, so the serving-path series (routed − direct, the
    // workers apart) are in the scrape.
    let mut file = std::fs::read_to_string(&config).expect("discovery config");
    for u in [ok.url(), failing.url(), cut.url()] {
        file.push_str(&format!("\n[[target]]\nurl = \"{u}\"\n"));
    }
    file.push_str(&format!(
        "\n[[target]]\nurl = \"{2}\"\nname = \"router\"\nkind = \"router\"\nworker_probes = false\nmetrics_url = \"{1}/metrics\"\nmetrics_interval = \"1s\"\ndirect_workers = [\"{0}\", \"{3}\", \"{4}\"]\ndirect_interval = \"1s\"\n",
        ok.url(),
        router_page.url(),
        frontend.url(),
        // The streaming server again under another name (two workers that answer alike) and
        // the one answering 503 (a failing worker): the workers-apart gauges have series.
        ok.url().replace("127.0.0.1", "localhost"),
        failing.url()
    ));
    std::fs::write(&config, file).expect("write config");
    let scrape = tokio::task::spawn_blocking(move || {
        let mut args: Vec<&str> = Vec::new();
        let config = config.display().to_string();
        args.extend(["--config", &config]);
        args.extend(["--model", "m", "--interval", "200ms", "--no-otlp"]);
        let kubeconfig = kubeconfig.display().to_string();
        let agent = Agent::spawn(&args, &[("KUBECONFIG", &kubeconfig)]);
        let wanted = [
            r#"k8s_deployment_name="vllm""#,
            r#"lmperf_outcome="ok""#,
            r#"lmperf_outcome="error""#,
            "gen_ai_client_operation_time_per_output_chunk_seconds_bucket",
            "gen_ai_client_operation_time_to_first_chunk_seconds_bucket{error_type=",
            r#"gen_ai_token_type="output""#,
            "lmperf_sampling_spike",
            "lmperf_server_requests_waiting",
            "lmperf_server_latency_seconds",
            "lmperf_server_preemptions_total",
            "lmperf_server_changes_total",
            "lmperf_path_overhead_seconds",
            "lmperf_path_direct_requests_total",
            "lmperf_router_worker_pick_share",
            "lmperf_router_worker_slowdown",
            "lmperf_router_worker_failing",
            "lmperf_canary_ttft_segment_duration_seconds_bucket",
        ];
        let t = Instant::now();
        loop {
            let (code, body) = agent.get("/metrics");
            assert_eq!(code, 200, "{body}");
            if wanted.iter().all(|w| body.contains(w)) {
                return body;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the scrape never had {wanted:?}:\n{body}\nagent stderr:\n{}",
                agent.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .expect("scrape");
    drop(api);
    scrape
}

/// The node, namespace, pod and deployment of the pod that [`k8s_discovery`] serves.
pub const K8S_POD: (&str, &str, &str, &str) = ("node-1", "ml", "vllm-0", "vllm");

/// A scripted API server holding [`K8S_POD`] (annotated, Ready, at 127.0.0.1:`port`), a
/// kubeconfig pointing at it and an agent config turning discovery on for its node, both in a
/// fresh temp dir `name`: (server, config path, kubeconfig path).
pub async fn k8s_discovery(
    name: &str,
    port: u16,
) -> (
    crate::kube_api::KubeApi,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let (node, ns, pod, deployment) = K8S_POD;
    let api = crate::kube_api::KubeApi::start().await;
    api.add_replicaset(ns, &format!("{deployment}-5c6b8d"), deployment);
    api.apply(crate::kube_api::pod(
        ns,
        pod,
        node,
        deployment,
        port,
        true,
        "vllm/vllm-openai:v0.9.0",
    ));
    let dir = crate::temp::dir(name);
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let config = dir.join("discovery.toml");
    std::fs::write(
        &config,
        format!("[discovery.kubernetes]\nenabled = true\nnode_name = \"{node}\"\n"),
    )
    .expect("write config");
    (api, config, kubeconfig)
}

/// Metrics (Prometheus names) that another issue will add, with its number, and the labels
/// they will carry: checked only in queries that use a pending metric.
#[derive(Debug, Clone, Copy)]
pub struct Pending<'a> {
    pub metrics: &'a [(&'a str, u32)],
    pub labels: &'a [(&'a str, u32)],
}

/// Checks one expression against the scrape (`exported`, from
/// [`crate::prom_text::label_names`]); Ok(the
/// pending metrics it uses). Names and labels a scrape lacks are errors unless `pending` lists
/// them or Prometheus adds them ([`SCRAPE_LABELS`]).
pub fn check_expr(
    expr: &str,
    exported: &BTreeMap<String, BTreeSet<String>>,
    pending_list: &Pending<'_>,
) -> Result<Vec<String>, String> {
    let refs = extract(expr)?;
    if refs.series.is_empty() {
        return Err("no metric in the query".into());
    }
    let pending_label = |l: &str| pending_list.labels.iter().any(|(p, _)| *p == l);
    let scrape_label = |l: &str| SCRAPE_LABELS.contains(&l);
    let mut errors = Vec::new();
    let mut pending = Vec::new();
    let mut known_labels: BTreeSet<&str> = BTreeSet::new();
    for s in &refs.series {
        if pending_list.metrics.iter().any(|(p, _)| *p == s.name) {
            pending.push(s.name.clone());
        }
        match exported.get(&s.name) {
            Some(labels) => {
                known_labels.extend(labels.iter().map(String::as_str));
                for l in &s.labels {
                    if !labels.contains(l) && !scrape_label(l) {
                        errors.push(format!(
                            "label {l:?} is not on {} (it has {labels:?})",
                            s.name
                        ));
                    }
                }
            }
            None if pending_list.metrics.iter().any(|(p, _)| *p == s.name) => {
                if s.name.ends_with("_bucket") {
                    known_labels.insert("le");
                }
                for l in &s.labels {
                    if !pending_label(l) && !scrape_label(l) {
                        errors.push(format!("label {l:?} on pending {} is neither in PENDING_LABELS nor a scrape label", s.name));
                    }
                }
            }
            None => errors.push(format!(
                "metric {:?} is not exported (nor listed as PENDING)",
                s.name
            )),
        }
    }
    for l in &refs.grouping {
        let ok = known_labels.contains(l.as_str())
            || scrape_label(l)
            || (!pending.is_empty() && pending_label(l));
        if !ok {
            errors.push(format!(
                "grouping label {l:?} is on none of the query's metrics"
            ));
        }
    }
    if errors.is_empty() {
        Ok(pending)
    } else {
        Err(errors.join("; "))
    }
}

/// A series selector: the metric name and the labels its `{...}` matches on.
#[derive(Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: Vec<String>,
}

#[derive(Debug, Default, PartialEq)]
pub struct Refs {
    pub series: Vec<Series>,
    /// Labels in `by`, `without`, `on`, `ignoring`, `group_left`, `group_right` lists and in
    /// matchers of a selector without a name.
    pub grouping: Vec<String>,
}

const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
const FUNCTIONS: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_avg",
    "histogram_count",
    "histogram_fraction",
    "histogram_quantile",
    "histogram_stddev",
    "histogram_stdvar",
    "histogram_sum",
    "holt_winters",
    "double_exponential_smoothing",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "ln",
    "log2",
    "log10",
    "minute",
    "month",
    "predict_linear",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sort_by_label",
    "sort_by_label_desc",
    "sqrt",
    "time",
    "timestamp",
    "vector",
    "year",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "quantile_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "last_over_time",
    "present_over_time",
    "mad_over_time",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "cos",
    "cosh",
    "sin",
    "sinh",
    "tan",
    "tanh",
    "deg",
    "rad",
    "pi",
];
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
const KEYWORDS: &[&str] = &[
    "bool", "and", "or", "unless", "offset", "atan2", "inf", "nan", "start", "end",
];

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str,
    Num,
    Range,
    P(String),
}

/// Grafana variables (`$x`, `${x}`, `${x:fmt}`) become nothing; strings, numbers and
/// durations, and range brackets become opaque tokens.
fn lex(expr: &str) -> Result<Vec<Tok>, String> {
    let c: Vec<char> = expr.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    let ident_start = |ch: char| ch.is_ascii_alphabetic() || ch == '_' || ch == ':';
    let ident_char = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':';
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '$' {
            i += 1;
            if c.get(i) == Some(&'{') {
                while i < c.len() && c[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < c.len() && ident_char(c[i]) {
                    i += 1;
                }
            }
        } else if ch == '"' || ch == '\'' || ch == '`' {
            i += 1;
            while i < c.len() && c[i] != ch {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            if i >= c.len() {
                return Err(format!("unterminated string in {expr:?}"));
            }
            i += 1;
            out.push(Tok::Str);
        } else if ch == '[' {
            while i < c.len() && c[i] != ']' {
                i += 1;
            }
            if i >= c.len() {
                return Err(format!("unterminated [ in {expr:?}"));
            }
            i += 1;
            out.push(Tok::Range);
        } else if ch.is_ascii_digit()
            || (ch == '.' && c.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                i += 1;
            }
            out.push(Tok::Num);
        } else if ident_start(ch) {
            let s = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            out.push(Tok::Ident(c[s..i].iter().collect()));
        } else {
            let two: String = c[i..(i + 2).min(c.len())].iter().collect();
            if ["=~", "!~", "!=", "==", ">=", "<="].contains(&two.as_str()) {
                out.push(Tok::P(two));
                i += 2;
            } else {
                out.push(Tok::P(ch.to_string()));
                i += 1;
            }
        }
    }
    Ok(out)
}

fn is_match_op(t: Option<&Tok>) -> bool {
    matches!(t, Some(Tok::P(p)) if ["=", "=~", "!=", "!~"].contains(&p.as_str()))
}

pub fn extract(expr: &str) -> Result<Refs, String> {
    let toks = lex(expr)?;
    let mut refs = Refs::default();
    let mut i = 0;
    let p = |i: usize, s: &str| matches!(toks.get(i), Some(Tok::P(x)) if x == s);
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(id) if GROUPING.contains(&id.as_str()) => {
                i += 1;
                if p(i, "(") {
                    i += 1;
                    while i < toks.len() && !p(i, ")") {
                        match &toks[i] {
                            Tok::Ident(l) => refs.grouping.push(l.clone()),
                            Tok::P(c) if c == "," => {}
                            t => return Err(format!("unexpected {t:?} in a label list")),
                        }
                        i += 1;
                    }
                    i += 1;
                }
            }
            Tok::Ident(id)
                if AGGREGATIONS.contains(&id.as_str()) || FUNCTIONS.contains(&id.as_str()) =>
            {
                let next = toks.get(i + 1);
                let ok = p(i + 1, "(")
                    || matches!(next, Some(Tok::Ident(n)) if n == "by" || n == "without");
                if !ok {
                    return Err(format!("{id} is a PromQL function; it needs ( after it"));
                }
                i += 1;
            }
            Tok::Ident(id) if KEYWORDS.contains(&id.as_str()) => i += 1,
            Tok::Ident(id) if p(i + 1, "(") => {
                return Err(format!("unknown PromQL function {id:?}"));
            }
            Tok::Ident(id) => {
                let mut s = Series {
                    name: id.clone(),
                    labels: Vec::new(),
                };
                i += 1;
                if p(i, "{") {
                    i = matchers(&toks, i + 1, &mut s.labels)?;
                }
                refs.series.push(s);
            }
            Tok::P(c) if c == "{" => {
                // A selector without a name: its matchers count as grouping labels.
                let mut labels = Vec::new();
                i = matchers(&toks, i + 1, &mut labels)?;
                refs.grouping.extend(labels);
            }
            _ => i += 1,
        }
    }
    Ok(refs)
}

/// Reads `label op "value", ...}` from `i`; returns the index after `}`.
fn matchers(toks: &[Tok], mut i: usize, labels: &mut Vec<String>) -> Result<usize, String> {
    loop {
        match toks.get(i) {
            Some(Tok::P(c)) if c == "}" => return Ok(i + 1),
            Some(Tok::P(c)) if c == "," => i += 1,
            Some(Tok::Ident(l))
                if is_match_op(toks.get(i + 1)) && toks.get(i + 2) == Some(&Tok::Str) =>
            {
                labels.push(l.clone());
                i += 3;
            }
            t => return Err(format!("bad label matcher at {t:?}")),
        }
    }
}
