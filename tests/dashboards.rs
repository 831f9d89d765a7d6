//! The Grafana dashboards of `dashboards/` against what the agent really exports (issue 7).
//!
//! The test runs the agent against scripted model servers (one target streaming, one answering
//! 503, one cutting its streams, so `error_type` series exist; `promql::agent_metrics`), scrapes its `/metrics`, and checks that every metric name
//! and every label in every panel query and template variable of every dashboard is there, so
//! a rename in `daemon/src/telemetry/names.rs` cannot silently blank a panel. The names are
//! the OTel Prometheus exporter's translation (dots to underscores, unit suffix, `_total` on
//! counters), read from the scrape, never spelled here.
//!
//! Metrics that other issues will add are listed in [`PENDING`] with their issue; any other
//! unknown name fails. Remove an entry when its metric lands (the test then checks it for real).

use std::collections::{BTreeMap, BTreeSet};

use lmperf_e2e::agent::workspace_root;
use lmperf_e2e::prom_text::label_names;
use lmperf_e2e::promql;
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
    // Issue 25: the pod holding a GPU (the kubelet's pod-resources API; none off Kubernetes).
    ("k8s_namespace_name", 25),
    ("k8s_pod_name", 25),
    ("server_address", 5),
    ("server_port", 5),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_label_in_every_panel_is_exported() {
    let scrape = promql::agent_metrics().await;
    let exported = label_names(&scrape);
    // The scrape is the real thing: these must exist or the test setup is wrong.
    for must in [
        "gen_ai_client_operation_duration_seconds_bucket",
        "lmperf_canary_requests_total",
    ] {
        assert!(
            exported.contains_key(must),
            "{must} missing from the scrape:\n{scrape}"
        );
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
    assert!(
        problems.is_empty(),
        "dashboard queries that name what the agent does not export:\n{}",
        problems.join("\n")
    );
    assert!(
        checked >= 20,
        "only {checked} queries found: is the dashboard walker still right?"
    );
    // The Kubernetes variables filter every panel whose series carry the labels.
    let mut unfiltered = Vec::new();
    for (file, dash) in dashboards() {
        unfiltered.extend(
            k8s_filter_problems(&dash, &exported)
                .into_iter()
                .map(|p| format!("{file}: {p}")),
        );
    }
    assert!(
        unfiltered.is_empty(),
        "queries the namespace / deployment / pod variables do not filter:\n{}",
        unfiltered.join("\n")
    );
    // An entry nobody uses is stale: remove it.
    for (name, issue) in PENDING {
        assert!(
            pending_used.contains(*name),
            "PENDING lists {name} (issue {issue}) but no dashboard uses it"
        );
    }
}

fn dashboards() -> Vec<(String, Value)> {
    let dir = workspace_root().join("dashboards");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).expect("read dashboard");
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((
                path.file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned(),
                v,
            ));
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
                out.push((
                    format!("panel {:?}", p["title"].as_str().unwrap_or("")),
                    expr.to_owned(),
                ));
            }
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap_or("");
        let name = format!("variable ${}", v["name"].as_str().unwrap_or(""));
        match q
            .trim()
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
        {
            Some(args) => {
                let (series, label) = args
                    .rsplit_once(',')
                    .unwrap_or_else(|| panic!("{name}: label_values needs a metric: {q}"));
                for series in union_alternatives(series.trim()) {
                    out.push((
                        name.clone(),
                        format!("count by ({}) ({series})", label.trim()),
                    ));
                }
            }
            None => out.push((name, q.to_owned())),
        }
    }
    out
}

/// A union selector `{__name__=~"a|b", l=~"v", …}` as one selector per metric (`a{…}`,
/// `b{…}`), each with the matchers on labels that metric carries ([`UNION_LABELS`]: a
/// matcher on a label a series lacks matches it when the value may be empty, as `.*`
/// does); any other selector as itself.
fn union_alternatives(series: &str) -> Vec<String> {
    let Some(inner) = series
        .strip_prefix("{__name__=~\"")
        .and_then(|r| r.strip_suffix('}'))
    else {
        return vec![series.to_owned()];
    };
    let (names, rest) = inner
        .split_once('"')
        .unwrap_or_else(|| panic!("unterminated __name__ in {series}"));
    let matchers: Vec<&str> = rest
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    let mut out = Vec::new();
    for name in names.split('|') {
        let kept: Vec<&str> = matchers
            .iter()
            .copied()
            .filter(|m| {
                let label = m.split(['=', '!']).next().unwrap_or("").trim();
                UNION_LABELS
                    .iter()
                    .find(|(metric, _)| *metric == name)
                    .is_none_or(|(_, labels)| labels.contains(&label))
            })
            .collect();
        out.push(format!("{name}{{{}}}", kept.join(", ")));
    }
    out
}

/// The labels each metric of a union selector is matched on (the others: absent on that
/// metric, so the union's `=~"$var"` with All = `.*` keeps its series). GPU series carry the
/// holding pod but no owner.
const UNION_LABELS: &[(&str, &[&str])] = &[(
    "hw_gpu_utilization_ratio",
    &["instance", "k8s_namespace_name", "k8s_pod_name"],
)];

/// The Kubernetes template variables and the label each filters on.
const K8S_VARIABLES: [(&str, &str); 3] = [
    ("namespace", "k8s_namespace_name"),
    ("deployment", "k8s_deployment_name"),
    ("pod", "k8s_pod_name"),
];

/// What keeps the Kubernetes variables from filtering a dashboard: a variable missing, not a
/// multi-value query on its label with All = `.*` (so series without the label, static
/// targets and GPUs held by no pod, still show under All); a panel selector of a metric
/// carrying a `k8s_*` label without its `label=~"$var"` matcher; a selector of a per-target
/// metric without k8s labels not filtered by `$target`, or a `$target` whose values do not
/// follow the three variables (its All must be its values, not `.*`).
fn k8s_filter_problems(dash: &Value, exported: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let vars = dash["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    let mut problems = Vec::new();
    for (name, label) in K8S_VARIABLES {
        let Some(v) = var(name) else {
            problems.push(format!("no ${name} variable"));
            continue;
        };
        let q = v["query"]["query"].as_str().unwrap_or("");
        if !(v["type"] == "query"
            && q.starts_with("label_values(")
            && q.trim_end_matches(')').ends_with(label)
            && v["includeAll"] == true
            && v["multi"] == true
            && v["allValue"] == ".*")
        {
            problems.push(format!(
                "${name} must be a multi-value label_values(…, {label}) with All = .*: {v}"
            ));
        }
    }
    let has_target = var("target").is_some();
    if let Some(t) = var("target") {
        let q = t["query"]["query"].as_str().unwrap_or("");
        for (name, label) in K8S_VARIABLES {
            if !q.contains(&format!("{label}=~\"${name}\"")) {
                problems.push(format!("$target's values do not follow ${name}: {q}"));
            }
        }
        if !t["allValue"].is_null() {
            problems.push(format!(
                "$target's All is {} (must be its values, so it follows the k8s variables)",
                t["allValue"]
            ));
        }
    }
    // Labels of a metric: the scrape's; a pending GPU metric (issue 4) carries the pending
    // pod labels of issue 25.
    let labels_of = |metric: &str| -> BTreeSet<String> {
        if let Some(l) = exported.get(metric) {
            return l.clone();
        }
        if PENDING.iter().any(|(m, i)| *m == metric && *i == 4) {
            return PENDING_LABELS
                .iter()
                .filter(|(_, i)| *i == 25)
                .map(|(l, _)| (*l).to_owned())
                .collect();
        }
        BTreeSet::new()
    };
    for p in panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let Some(expr) = t["expr"].as_str() else {
                continue;
            };
            let mut sel = selectors(expr);
            // A metric named without braces has no matchers.
            for s in promql::extract(expr).map(|r| r.series).unwrap_or_default() {
                if !sel.iter().any(|(m, _)| *m == s.name) {
                    sel.push((s.name, String::new()));
                }
            }
            for (metric, matchers) in sel {
                let labels = labels_of(&metric);
                let mut k8s = false;
                for (name, label) in K8S_VARIABLES {
                    if labels.contains(label) {
                        k8s = true;
                        if !matchers.contains(&format!("{label}=~\"${name}\"")) {
                            problems.push(format!(
                                "panel {:?}: {metric} carries {label} but is not filtered by ${name}",
                                p["title"]
                            ));
                        }
                    }
                }
                if !k8s
                    && has_target
                    && labels.contains("lmperf_target")
                    && !matchers.contains("lmperf_target=~\"$target\"")
                {
                    problems.push(format!(
                        "panel {:?}: {metric} is per target but not filtered by $target",
                        p["title"]
                    ));
                }
            }
        }
    }
    problems
}

/// Every `metric{matchers}` selector of an expression: (metric, the text between the braces).
fn selectors(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(open) = expr[i..].find('{').map(|o| o + i) {
        let start = expr[..open]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .map_or(0, |s| s + 1);
        let close = expr[open..].find('}').map_or(b.len(), |c| c + open);
        if start < open {
            out.push((
                expr[start..open].to_owned(),
                expr[open + 1..close].to_owned(),
            ));
        }
        i = close.min(b.len() - 1) + 1;
        if i >= b.len() {
            break;
        }
    }
    out
}

#[test]
fn k8s_filters_are_checked() {
    assert_eq!(
        selectors(r#"sum by (a) (rate(x_total{a="1", b=~"$b"}[5m])) / y{}"#),
        [
            ("x_total".to_owned(), r#"a="1", b=~"$b""#.to_owned()),
            ("y".to_owned(), String::new())
        ]
    );
    assert_eq!(
        union_alternatives(
            r#"{__name__=~"lmperf_canary_requests_total|hw_gpu_utilization_ratio", instance=~"$instance", k8s_deployment_name=~"$deployment"}"#
        ),
        [
            r#"lmperf_canary_requests_total{instance=~"$instance", k8s_deployment_name=~"$deployment"}"#,
            r#"hw_gpu_utilization_ratio{instance=~"$instance"}"#
        ]
    );
    let exported = label_names(
        "# TYPE a_total counter\na_total{lmperf_target=\"t\",k8s_namespace_name=\"n\",k8s_pod_name=\"p\",k8s_deployment_name=\"d\"} 1\nb{lmperf_target=\"t\"} 1\n",
    );
    let dash = |target_q: &str, expr: &str| {
        let v = |name: &str, label: &str| {
            serde_json::json!({"name": name, "type": "query", "multi": true, "includeAll": true,
                "allValue": ".*", "query": {"query": format!("label_values(a_total, {label})")}})
        };
        serde_json::json!({
            "templating": {"list": [v("namespace", "k8s_namespace_name"),
                v("deployment", "k8s_deployment_name"), v("pod", "k8s_pod_name"),
                {"name": "target", "type": "query", "includeAll": true,
                 "query": {"query": target_q}}]},
            "panels": [{"title": "p", "targets": [{"expr": expr}]}]
        })
    };
    let good_target = r#"label_values(a_total{k8s_namespace_name=~"$namespace", k8s_deployment_name=~"$deployment", k8s_pod_name=~"$pod"}, lmperf_target)"#;
    let good = r#"rate(a_total{lmperf_target=~"$target", k8s_namespace_name=~"$namespace", k8s_deployment_name=~"$deployment", k8s_pod_name=~"$pod"}[5m]) / b{lmperf_target=~"$target"}"#;
    assert_eq!(
        k8s_filter_problems(&dash(good_target, good), &exported),
        Vec::<String>::new()
    );
    let p = k8s_filter_problems(
        &dash(good_target, &good.replace(r#", k8s_pod_name=~"$pod""#, "")),
        &exported,
    );
    assert!(
        p.len() == 1 && p[0].contains("not filtered by $pod"),
        "{p:?}"
    );
    let p = k8s_filter_problems(
        &dash(
            good_target,
            &good.replace(r#"b{lmperf_target=~"$target"}"#, "b"),
        ),
        &exported,
    );
    assert!(
        p.len() == 1 && p[0].contains("not filtered by $target"),
        "{p:?}"
    );
    let p = k8s_filter_problems(
        &dash(
            good_target,
            &good.replace(r#"b{lmperf_target=~"$target"}"#, "b{}"),
        ),
        &exported,
    );
    assert!(
        p.len() == 1 && p[0].contains("not filtered by $target"),
        "{p:?}"
    );
    let p = k8s_filter_problems(
        &dash("label_values(a_total, lmperf_target)", good),
        &exported,
    );
    assert_eq!(p.len(), 3, "{p:?}");
}

/// Checks one expression against the scrape; Ok(the pending metrics it uses).
fn check_expr(
    expr: &str,
    exported: &BTreeMap<String, BTreeSet<String>>,
) -> Result<Vec<String>, String> {
    promql::check_expr(
        expr,
        exported,
        &promql::Pending {
            metrics: PENDING,
            labels: PENDING_LABELS,
        },
    )
}

#[test]
fn a_renamed_metric_or_label_fails_the_check() {
    let exported = label_names(
        "# TYPE a_total counter\na_total{lmperf_target=\"t\",error_type=\"x\",otel_scope_name=\"lmperf\"} 1\nb_bucket{le=\"1\",lmperf_target=\"t\"} 1\n",
    );
    assert_eq!(
        exported["a_total"],
        ["error_type", "lmperf_target", "otel_scope_name"]
            .map(String::from)
            .into()
    );
    assert!(
        check_expr(
            r#"sum by (lmperf_target) (rate(a_total{error_type!=""}[5m]))"#,
            &exported
        )
        .is_ok()
    );
    assert!(
        check_expr(
            r#"histogram_quantile(0.9, sum by (le) (rate(b_bucket{instance=~"$i"}[5m])))"#,
            &exported
        )
        .is_ok()
    );
    let e = check_expr("rate(a_count[5m])", &exported).unwrap_err();
    assert!(e.contains("a_count"), "{e}");
    let e = check_expr(r#"rate(a_total{lmperf_tgt="x"}[5m])"#, &exported).unwrap_err();
    assert!(e.contains("lmperf_tgt"), "{e}");
    let e = check_expr(
        "sum by (gen_ai_request_model) (rate(a_total[5m]))",
        &exported,
    )
    .unwrap_err();
    assert!(e.contains("gen_ai_request_model"), "{e}");
    // Pending metrics pass, with their labels; a pending label on a real metric does not.
    assert_eq!(
        check_expr("sum by (hw_id) (hw_gpu_utilization_ratio)", &exported).unwrap(),
        vec!["hw_gpu_utilization_ratio"]
    );
    assert!(check_expr("sum by (hw_id) (rate(a_total[5m]))", &exported).is_err());
}

#[test]
fn dashboards_are_wired_to_prometheus_and_the_trace_backend() {
    for (file, d) in dashboards() {
        let vars = d["templating"]["list"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let var = |name: &str| vars.iter().find(|v| v["name"] == name).cloned();
        let ds = var("datasource").unwrap_or_else(|| panic!("{file}: no $datasource variable"));
        assert_eq!(
            (ds["type"].as_str(), ds["query"].as_str()),
            (Some("datasource"), Some("prometheus")),
            "{file}"
        );
        let traces = var("traces").unwrap_or_else(|| panic!("{file}: no $traces variable"));
        assert_eq!(traces["type"], "datasource", "{file}");
        assert!(
            matches!(traces["query"].as_str(), Some("jaeger" | "tempo")),
            "{file}: $traces is {}",
            traces["query"]
        );
        assert!(
            d["uid"].as_str().is_some_and(|u| u.starts_with("lmperf-")),
            "{file}: uid"
        );
        assert_eq!(
            d["graphTooltip"], 1,
            "{file}: one shared crosshair across panels"
        );
        for p in panels(&d) {
            let title = p["title"].as_str().unwrap_or("");
            if p["type"] == "row" || p["type"] == "text" {
                continue;
            }
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{file}: panel {title:?} must use $datasource"
            );
            for t in p["targets"].as_array().into_iter().flatten() {
                assert_eq!(
                    t["datasource"]["uid"], "${datasource}",
                    "{file}: a target of {title:?}"
                );
            }
            for l in p["fieldConfig"]["defaults"]["links"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let url = l["url"].as_str().unwrap_or("");
                assert!(
                    url.contains("${traces}") && url.contains("${__field.labels.lmperf_target}"),
                    "{file}: {title:?} link {url}"
                );
            }
        }
    }
    let (_, canary) = dashboards()
        .into_iter()
        .find(|(f, _)| f == "llm-canary.json")
        .expect("llm-canary.json");
    let all = panels(&canary);
    let titled = |needle: &str| {
        all.iter()
            .filter(|p| p["title"].as_str().is_some_and(|t| t.contains(needle)))
            .count()
    };
    for needle in [
        "TTFT",
        "ITL",
        "E2E",
        "Error rate by error.type",
        "tokens/s",
        "Goodput",
        "Input length × output length",
    ] {
        assert!(titled(needle) >= 1, "LLM canary has no {needle:?} panel");
    }
    let linked = all
        .iter()
        .filter(|p| {
            p["fieldConfig"]["defaults"]["links"]
                .as_array()
                .is_some_and(|l| !l.is_empty())
        })
        .count();
    assert!(
        linked >= 4,
        "latency and error panels link to their traces ({linked} do)"
    );
    let heatmap = all
        .iter()
        .find(|p| {
            p["title"]
                .as_str()
                .is_some_and(|t| t.contains("Input length × output length"))
        })
        .expect("heatmap");
    assert!(
        heatmap["title"]
            .as_str()
            .is_some_and(|t| t.contains("pending") && t.contains("issue 3")),
        "the placeholder says it is pending"
    );
}
