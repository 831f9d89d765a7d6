//! The Grafana dashboards of `dashboards/` against what the agent really exports (issue 7).
//!
//! The test runs the agent against a scripted model server (one target streaming, one answering
//! 503 so `error_type` series exist), scrapes its `/metrics`, and checks that every metric name
//! and every label in every panel query and template variable of every dashboard is there, so
//! a rename in `daemon/src/telemetry/names.rs` cannot silently blank a panel. The names are
//! the OTel Prometheus exporter's translation (dots to underscores, unit suffix, `_total` on
//! counters), read from the scrape, never spelled here.
//!
//! Metrics that other issues will add are listed in [`PENDING`] with their issue; any other
//! unknown name fails. Remove an entry when its metric lands (the test then checks it for real).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lmperf_e2e::agent::{Agent, workspace_root};
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
use serde_json::Value;

/// Metrics the "Node" dashboard shows that a test machine may not export: GPU series need an
/// NVIDIA driver (none in CI), kernel series need the eBPF probes loaded (root) and, for
/// retransmits, a retransmit. When exported they are checked like every other metric; when
/// absent, their labels must be in [`PENDING_LABELS`]. Names are the OTel → Prometheus
/// translation of `telemetry/names.rs`.
const PENDING: &[(&str, u32)] = &[
    // Issue 4: GPU metrics through NVML (hw.gpu.* semantic conventions).
    ("hw_gpu_utilization_ratio", 4),
    ("hw_gpu_memory_usage_bytes", 4),
    ("hw_gpu_memory_limit_bytes", 4),
    ("hw_power_watts", 4),
    ("lmperf_gpu_throttle_ratio", 4),
    ("lmperf_gpu_xid_errors_total", 4),
    // Issue 5: kernel TCP view through eBPF.
    ("lmperf_tcp_rtt_seconds_bucket", 5),
    ("lmperf_tcp_retransmits_total", 5),
];

/// Labels the pending metrics will carry (same issues): checked only in queries that use a
/// pending metric.
const PENDING_LABELS: &[(&str, u32)] = &[
    ("hw_id", 4),
    ("hw_name", 4),
    ("lmperf_gpu_throttle_reason", 4),
    ("lmperf_gpu_xid", 4),
    ("server_address", 5),
    ("server_port", 5),
];

/// Labels Prometheus adds at scrape time (`instance`, `job`) or the chart's ServiceMonitor
/// adds by relabelling (`node`): never on `/metrics` itself.
const SCRAPE_LABELS: &[&str] = &["instance", "job", "node"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_label_in_every_panel_is_exported() {
    let scrape = tokio::task::spawn_blocking(scrape_agent_metrics_blocking_setup()).await.expect("scrape");
    let exported = parse_exposition(&scrape);
    // The scrape is the real thing: these must exist or the test setup is wrong.
    for must in ["gen_ai_client_operation_duration_seconds_bucket", "lmperf_canary_requests_total"] {
        assert!(exported.contains_key(must), "{must} missing from the scrape:\n{scrape}");
    }

    let mut problems = Vec::new();
    let mut checked = 0;
    let mut pending_used = BTreeSet::new();
    for (file, dash) in dashboards() {
        for (where_, expr) in queries(&dash) {
            checked += 1;
            match check_expr(&expr, &exported) {
                Ok(pending) => pending_used.extend(pending),
                Err(e) => problems.push(format!("{file}: {where_}: {e}\n    {expr}")),
            }
        }
    }
    assert!(problems.is_empty(), "dashboard queries that name what the agent does not export:\n{}", problems.join("\n"));
    assert!(checked >= 20, "only {checked} queries found: is the dashboard walker still right?");
    // An entry nobody uses is stale: remove it.
    for (name, issue) in PENDING {
        assert!(pending_used.contains(*name), "PENDING lists {name} (issue {issue}) but no dashboard uses it");
    }
}

/// Starts two scripted servers (streaming; 503) and the agent against both; returns the
/// scrape once both outcomes and every histogram have samples.
fn scrape_agent_metrics_blocking_setup() -> impl FnOnce() -> String {
    let rt = tokio::runtime::Handle::current();
    move || {
        let ok = rt.block_on(ScriptedServer::start(Arc::new(|_, _| {
            Reply::sse(chat_stream(3, Duration::from_millis(5), Duration::from_millis(5), 4))
        })));
        let failing = rt.block_on(ScriptedServer::start(Arc::new(|_, _| Reply::json(503, r#"{"error":"overloaded"}"#))));
        let agent = Agent::spawn(
            &["--target", &ok.url(), "--target", &failing.url(), "--model", "m", "--interval", "200ms", "--no-otlp"],
            &[],
        );
        let wanted = [
            r#"lmperf_outcome="ok""#,
            r#"lmperf_outcome="error""#,
            "gen_ai_client_operation_time_per_output_chunk_seconds_bucket",
            "gen_ai_client_operation_time_to_first_chunk_seconds_bucket",
            r#"gen_ai_token_type="output""#,
            "lmperf_sampling_spike",
        ];
        let t = Instant::now();
        loop {
            let (code, body) = agent.get("/metrics");
            assert_eq!(code, 200, "{body}");
            if wanted.iter().all(|w| body.contains(w)) {
                return body;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "the scrape never had {wanted:?}:\n{body}\nagent stderr:\n{}", agent.stderr_text());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Sample name → the label names seen on it (from the sample lines, so histograms give
/// `_bucket` (with `le`), `_sum` and `_count`).
fn parse_exposition(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..name_end].to_owned()).or_default();
        if line[name_end..].starts_with('{') {
            // name="value",... ; values may hold commas and escaped quotes.
            let mut rest = &line[name_end + 1..];
            while let Some(eq) = rest.find("=\"") {
                labels.insert(rest[..eq].trim_start_matches(',').trim().to_owned());
                let mut i = eq + 2;
                let bytes = rest.as_bytes();
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                rest = &rest[(i + 1).min(rest.len())..];
                if rest.starts_with('}') {
                    break;
                }
            }
        }
    }
    out
}

fn dashboards() -> Vec<(String, Value)> {
    let dir = workspace_root().join("dashboards");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).expect("read dashboard");
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((path.file_name().expect("name").to_string_lossy().into_owned(), v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 2, "dashboards/ holds {} dashboards", out.len());
    out
}

/// Every panel (rows' nested panels too), flattened.
fn panels(dash: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

/// (where, PromQL) of every panel target and every query variable (`label_values(m, l)` is
/// turned into `m` with `l` as a grouping label: `count by (l) (m)`).
fn queries(dash: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push((format!("panel {:?}", p["title"].as_str().unwrap_or("")), expr.to_owned()));
            }
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"].as_str().or(v["query"].as_str()).unwrap_or("");
        let name = format!("variable ${}", v["name"].as_str().unwrap_or(""));
        match q.trim().strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')) {
            Some(args) => {
                let (series, label) = args.rsplit_once(',').unwrap_or_else(|| panic!("{name}: label_values needs a metric: {q}"));
                out.push((name, format!("count by ({}) ({})", label.trim(), series.trim())));
            }
            None => out.push((name, q.to_owned())),
        }
    }
    out
}

/// Checks one expression against the scrape; Ok(the pending metrics it uses).
fn check_expr(expr: &str, exported: &BTreeMap<String, BTreeSet<String>>) -> Result<Vec<String>, String> {
    let refs = promql::extract(expr)?;
    if refs.series.is_empty() {
        return Err("no metric in the query".into());
    }
    let pending_label = |l: &str| PENDING_LABELS.iter().any(|(p, _)| *p == l);
    let scrape_label = |l: &str| SCRAPE_LABELS.contains(&l);
    let mut errors = Vec::new();
    let mut pending = Vec::new();
    let mut known_labels: BTreeSet<&str> = BTreeSet::new();
    for s in &refs.series {
        if PENDING.iter().any(|(p, _)| *p == s.name) {
            pending.push(s.name.clone());
        }
        match exported.get(&s.name) {
            Some(labels) => {
                known_labels.extend(labels.iter().map(String::as_str));
                for l in &s.labels {
                    if !labels.contains(l) && !scrape_label(l) {
                        errors.push(format!("label {l:?} is not on {} (it has {labels:?})", s.name));
                    }
                }
            }
            None if PENDING.iter().any(|(p, _)| *p == s.name) => {
                if s.name.ends_with("_bucket") {
                    known_labels.insert("le");
                }
                for l in &s.labels {
                    if !pending_label(l) && !scrape_label(l) {
                        errors.push(format!("label {l:?} on pending {} is neither in PENDING_LABELS nor a scrape label", s.name));
                    }
                }
            }
            None => errors.push(format!("metric {:?} is not exported (nor listed as PENDING)", s.name)),
        }
    }
    for l in &refs.grouping {
        let ok = known_labels.contains(l.as_str()) || scrape_label(l) || (!pending.is_empty() && pending_label(l));
        if !ok {
            errors.push(format!("grouping label {l:?} is on none of the query's metrics"));
        }
    }
    if errors.is_empty() { Ok(pending) } else { Err(errors.join("; ")) }
}

/// A small PromQL reader: enough to find the series and labels a query names.
mod promql {
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
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
        "limitk", "limit_ratio",
    ];
    const FUNCTIONS: &[&str] = &[
        "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "day_of_month",
        "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor", "histogram_avg",
        "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev", "histogram_stdvar",
        "histogram_sum", "holt_winters", "double_exponential_smoothing", "hour", "idelta", "increase", "irate",
        "label_join", "label_replace", "ln", "log2", "log10", "minute", "month", "predict_linear", "rate", "resets",
        "round", "scalar", "sgn", "sort", "sort_desc", "sort_by_label", "sort_by_label_desc", "sqrt", "time",
        "timestamp", "vector", "year", "avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
        "count_over_time", "quantile_over_time", "stddev_over_time", "stdvar_over_time", "last_over_time",
        "present_over_time", "mad_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin",
        "sinh", "tan", "tanh", "deg", "rad", "pi",
    ];
    const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];
    const KEYWORDS: &[&str] = &["bool", "and", "or", "unless", "offset", "atan2", "inf", "nan", "start", "end"];

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
            } else if ch.is_ascii_digit() || (ch == '.' && c.get(i + 1).is_some_and(char::is_ascii_digit)) {
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
                Tok::Ident(id) if AGGREGATIONS.contains(&id.as_str()) || FUNCTIONS.contains(&id.as_str()) => {
                    let next = toks.get(i + 1);
                    let ok = p(i + 1, "(") || matches!(next, Some(Tok::Ident(n)) if n == "by" || n == "without");
                    if !ok {
                        return Err(format!("{id} is a PromQL function; it needs ( after it"));
                    }
                    i += 1;
                }
                Tok::Ident(id) if KEYWORDS.contains(&id.as_str()) => i += 1,
                Tok::Ident(id) if p(i + 1, "(") => return Err(format!("unknown PromQL function {id:?}")),
                Tok::Ident(id) => {
                    let mut s = Series { name: id.clone(), labels: Vec::new() };
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
                Some(Tok::Ident(l)) if is_match_op(toks.get(i + 1)) && toks.get(i + 2) == Some(&Tok::Str) => {
                    labels.push(l.clone());
                    i += 3;
                }
                t => return Err(format!("bad label matcher at {t:?}")),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn names(r: &Refs) -> Vec<(&str, Vec<&str>)> {
            r.series.iter().map(|s| (s.name.as_str(), s.labels.iter().map(String::as_str).collect())).collect()
        }

        #[test]
        fn quantile_of_a_bucket_rate() {
            let r = extract(r#"histogram_quantile(0.99, sum by (le, lmperf_target) (rate(m_bucket{a=~"$t", b="", c!="x,}y"}[$__rate_interval])))"#).unwrap();
            assert_eq!(names(&r), vec![("m_bucket", vec!["a", "b", "c"])]);
            assert_eq!(r.grouping, vec!["le", "lmperf_target"]);
        }

        #[test]
        fn binary_operators_with_vector_matching() {
            let r = extract(r#"sum by (t, e) (rate(x_total{o!="ok"}[5m])) / ignoring (e) group_left sum(rate(y[${__interval}])) by (t) > bool 0.5"#).unwrap();
            assert_eq!(names(&r), vec![("x_total", vec!["o"]), ("y", vec![])]);
            assert_eq!(r.grouping, vec!["t", "e", "e", "t"]);
        }

        #[test]
        fn a_typo_in_a_function_or_a_matcher_is_an_error() {
            assert!(extract("rat(x[5m])").unwrap_err().contains("rat"));
            assert!(extract(r#"x{a=}"#).is_err());
            assert!(extract(r#"sum x"#).is_err());
        }
    }
}

#[test]
fn a_renamed_metric_or_label_fails_the_check() {
    let exported = parse_exposition(
        "# TYPE a_total counter\na_total{lmperf_target=\"t\",error_type=\"x\",otel_scope_name=\"lmperf\"} 1\nb_bucket{le=\"1\",lmperf_target=\"t\"} 1\n",
    );
    assert_eq!(exported["a_total"], ["error_type", "lmperf_target", "otel_scope_name"].map(String::from).into());
    assert!(check_expr(r#"sum by (lmperf_target) (rate(a_total{error_type!=""}[5m]))"#, &exported).is_ok());
    assert!(check_expr(r#"histogram_quantile(0.9, sum by (le) (rate(b_bucket{instance=~"$i"}[5m])))"#, &exported).is_ok());
    let e = check_expr("rate(a_count[5m])", &exported).unwrap_err();
    assert!(e.contains("a_count"), "{e}");
    let e = check_expr(r#"rate(a_total{lmperf_tgt="x"}[5m])"#, &exported).unwrap_err();
    assert!(e.contains("lmperf_tgt"), "{e}");
    let e = check_expr("sum by (gen_ai_request_model) (rate(a_total[5m]))", &exported).unwrap_err();
    assert!(e.contains("gen_ai_request_model"), "{e}");
    // Pending metrics pass, with their labels; a pending label on a real metric does not.
    assert_eq!(check_expr("sum by (hw_id) (hw_gpu_utilization_ratio)", &exported).unwrap(), vec!["hw_gpu_utilization_ratio"]);
    assert!(check_expr("sum by (hw_id) (rate(a_total[5m]))", &exported).is_err());
}

#[test]
fn dashboards_are_wired_to_prometheus_and_the_trace_backend() {
    for (file, d) in dashboards() {
        let vars = d["templating"]["list"].as_array().cloned().unwrap_or_default();
        let var = |name: &str| vars.iter().find(|v| v["name"] == name).cloned();
        let ds = var("datasource").unwrap_or_else(|| panic!("{file}: no $datasource variable"));
        assert_eq!((ds["type"].as_str(), ds["query"].as_str()), (Some("datasource"), Some("prometheus")), "{file}");
        let traces = var("traces").unwrap_or_else(|| panic!("{file}: no $traces variable"));
        assert_eq!(traces["type"], "datasource", "{file}");
        assert!(matches!(traces["query"].as_str(), Some("jaeger" | "tempo")), "{file}: $traces is {}", traces["query"]);
        assert!(d["uid"].as_str().is_some_and(|u| u.starts_with("lmperf-")), "{file}: uid");
        assert_eq!(d["graphTooltip"], 1, "{file}: one shared crosshair across panels");
        for p in panels(&d) {
            let title = p["title"].as_str().unwrap_or("");
            if p["type"] == "row" || p["type"] == "text" {
                continue;
            }
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{file}: panel {title:?} must use $datasource");
            for t in p["targets"].as_array().into_iter().flatten() {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{file}: a target of {title:?}");
            }
            for l in p["fieldConfig"]["defaults"]["links"].as_array().into_iter().flatten() {
                let url = l["url"].as_str().unwrap_or("");
                assert!(url.contains("${traces}") && url.contains("${__field.labels.lmperf_target}"), "{file}: {title:?} link {url}");
            }
        }
    }
    let (_, canary) = dashboards().into_iter().find(|(f, _)| f == "llm-canary.json").expect("llm-canary.json");
    let all = panels(&canary);
    let titled = |needle: &str| all.iter().filter(|p| p["title"].as_str().is_some_and(|t| t.contains(needle))).count();
    for needle in ["TTFT", "ITL", "E2E", "Error rate by error.type", "tokens/s", "Goodput", "Input length × output length"] {
        assert!(titled(needle) >= 1, "LLM canary has no {needle:?} panel");
    }
    let linked = all.iter().filter(|p| p["fieldConfig"]["defaults"]["links"].as_array().is_some_and(|l| !l.is_empty())).count();
    assert!(linked >= 4, "latency and error panels link to their traces ({linked} do)");
    let heatmap = all.iter().find(|p| p["title"].as_str().is_some_and(|t| t.contains("Input length × output length"))).expect("heatmap");
    assert!(heatmap["title"].as_str().is_some_and(|t| t.contains("pending") && t.contains("issue 3")), "the placeholder says it is pending");
}
