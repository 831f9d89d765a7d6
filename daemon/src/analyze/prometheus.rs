//! `lmperf analyze --prometheus URL`: the diagnosis engine over the fleet's lmperf series in
//! Prometheus (`/api/v1/query_range`), one engine target per node × lmperf target × model,
//! and the fleet view: whether one node, one model or every node moved.
//!
//! Signals (PromQL, `K` = `node, instance, lmperf_target, gen_ai_request_model`, `R` the rate
//! window): canary TTFT / TPOT / E2E p99 from the GenAI histograms
//! (`histogram_quantile(0.99, sum by (K, le) (rate(…_bucket[R])))`), the error ratio from
//! `lmperf_canary_requests_total` (error | timeout | aborted ÷ all but cancelled), the server's
//! queue, batch, KV usage, preemption and token rates and changes (`lmperf_server_*`), GPU
//! throttle, SM clock and XIDs (`lmperf_gpu_*`), kernel RTT p50 and retransmits
//! (`lmperf_tcp_*`) where present. A series without `lmperf_target` (GPU: a node's devices)
//! joins every target of its node. The node is the `node` label (the chart's relabelling),
//! else the scrape's `instance`.
//!
//! The p99 of a rate window is fed as one sample per step: the engine's 10 s buckets then hold
//! a p99 of p99s, close to the p99 when the step is a few seconds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::episode::{Episode, FORMAT};
use super::offline::{Analysis, AnalyzeError, analyze_episode_placed};
use crate::diagnosis::node_scope::Placement;
use crate::diagnosis::{Cause, Signal, State};

/// How `lmperf analyze --prometheus` queries.
#[derive(Debug, Clone)]
pub struct PromQuery {
    /// Prometheus base URL (`http://prometheus:9090`).
    pub url: String,
    /// How far back from now (default 30 min).
    pub window: Duration,
    /// Resolution of `query_range`.
    pub step: Duration,
    /// Range of `rate()` / `increase()` (≥ 4 scrape intervals).
    pub rate_window: Duration,
}

/// One series key: a node's target (and its model).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Member {
    pub node: String,
    pub target: String,
    pub model: String,
}

impl Member {
    /// The engine's target name: `node/target`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.node, self.target)
    }
}

/// The fleet view: which members moved, and what that points at.
#[derive(Debug, Clone, Serialize)]
pub struct Fleet {
    /// `none` | `one_node` | `one_model` | `every_node` | `several`.
    pub scope: String,
    /// The verdict in words.
    pub verdict: String,
    pub nodes: usize,
    pub models: usize,
    /// Members whose diagnosis left `idle` in the window, with their top cause.
    pub moved: Vec<Moved>,
    /// Members that stayed idle.
    pub calm: Vec<Member>,
}

/// A member that moved.
#[derive(Debug, Clone, Serialize)]
pub struct Moved {
    #[serde(flatten)]
    pub member: Member,
    pub state: State,
    pub cause: Option<Cause>,
    pub score: Option<f64>,
}

const KEY: &str = "node, instance, lmperf_target, gen_ai_request_model";

/// The queries: (signal, PromQL) with `{R}` and `{S}` (step) to fill.
fn queries(r: &str, s: &str) -> Vec<(Signal, String)> {
    let p99 = |h: &str, sel: &str| {
        format!("histogram_quantile(0.99, sum by ({KEY}, le) (rate({h}_bucket{sel}[{r}])))")
    };
    let total = format!(
        "sum by ({KEY}) (rate(lmperf_canary_requests_total{{lmperf_outcome!=\"cancelled\"}}[{r}]))"
    );
    let failed = format!(
        "sum by ({KEY}) (rate(lmperf_canary_requests_total{{lmperf_outcome=~\"error|timeout|aborted\"}}[{r}]))"
    );
    vec![
        (
            Signal::Ttft,
            p99("gen_ai_client_operation_time_to_first_chunk_seconds", ""),
        ),
        (
            Signal::Tpot,
            p99("gen_ai_client_operation_time_per_output_chunk_seconds", ""),
        ),
        (
            Signal::E2e,
            p99(
                "gen_ai_client_operation_duration_seconds",
                "{error_type=\"\"}",
            ),
        ),
        (
            Signal::Error,
            format!("({failed} or {total} * 0) / ({total} > 0)"),
        ),
        (
            Signal::ServerRequestsWaiting,
            format!("max by ({KEY}) (lmperf_server_requests_waiting)"),
        ),
        (
            Signal::ServerRequestsRunning,
            format!("max by ({KEY}) (lmperf_server_requests_running)"),
        ),
        (
            Signal::ServerKvUsage,
            format!("max by ({KEY}) (lmperf_server_kv_cache_usage_ratio)"),
        ),
        (
            Signal::ServerPreemptions,
            format!("sum by ({KEY}) (rate(lmperf_server_preemptions_total[{r}]))"),
        ),
        (
            Signal::ServerGenerationTokensRate,
            format!("sum by ({KEY}) (rate(lmperf_server_generation_tokens_total[{r}]))"),
        ),
        (
            Signal::ServerChange,
            format!("clamp_max(sum by ({KEY}) (increase(lmperf_server_changes_total[{s}])), 1)"),
        ),
        (
            Signal::GpuThrottle,
            format!("max by ({KEY}) (lmperf_gpu_throttle_ratio)"),
        ),
        (
            Signal::GpuSmClock,
            format!(
                "min by ({KEY}) ({{__name__=~\"lmperf_gpu_clock_frequency.*\", lmperf_gpu_clock=\"sm\"}})"
            ),
        ),
        (
            Signal::GpuFault,
            format!("sum by ({KEY}) (increase(lmperf_gpu_xid_errors_total[{s}]))"),
        ),
        (
            Signal::NetSrtt,
            format!(
                "histogram_quantile(0.5, sum by ({KEY}, le) (rate(lmperf_tcp_rtt_seconds_bucket[{r}])))"
            ),
        ),
        (
            Signal::NetRetransmits,
            format!("sum by ({KEY}) (rate(lmperf_tcp_retransmits_total[{r}]))"),
        ),
    ]
}

fn prom_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// One `query_range` result row: labels and points.
type Rows = Vec<(BTreeMap<String, String>, Vec<[f64; 2]>)>;

/// Parses a `query_range` answer (`{"status":"success","data":{"resultType":"matrix",…}}`).
pub fn parse_matrix(v: &serde_json::Value) -> Result<Rows, String> {
    if v["status"] != "success" {
        return Err(format!(
            "{}: {}",
            v["errorType"].as_str().unwrap_or("error"),
            v["error"].as_str().unwrap_or("no status")
        ));
    }
    let mut rows = Vec::new();
    for r in v["data"]["result"].as_array().into_iter().flatten() {
        let labels = r["metric"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let pts = r["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let t = p.get(0)?.as_f64()?;
                let x: f64 = p.get(1)?.as_str()?.parse().ok()?;
                x.is_finite().then_some([t, x])
            })
            .collect();
        rows.push((labels, pts));
    }
    Ok(rows)
}

fn member(labels: &BTreeMap<String, String>) -> Member {
    let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
    let node = Some(get("node"))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| get("instance"));
    Member {
        node,
        target: get("lmperf_target"),
        model: get("gen_ai_request_model"),
    }
}

/// Builds the episode of the fleet from the answers of [`queries`] (`start`..`end`, Unix s).
pub fn fleet_episode(
    answers: &[(Signal, Rows)],
    start: f64,
    end: f64,
    name: &str,
) -> (Episode, BTreeMap<String, Member>) {
    let mut members: BTreeMap<String, Member> = BTreeMap::new();
    let mut node_level: Vec<(String, Signal, &Vec<[f64; 2]>)> = Vec::new();
    let mut series: BTreeMap<String, BTreeMap<String, Vec<[f64; 2]>>> = BTreeMap::new();
    for (sig, rows) in answers {
        for (labels, pts) in rows {
            let m = member(labels);
            if m.target.is_empty() {
                node_level.push((m.node, *sig, pts));
                continue;
            }
            let key = m.key();
            let s = series
                .entry(key.clone())
                .or_default()
                .entry(sig.as_str().to_owned())
                .or_default();
            s.extend(pts.iter().map(|&[t, x]| [t - start, x]));
            members.entry(key).or_insert(m);
        }
    }
    for (node, sig, pts) in node_level {
        for (key, m) in &members {
            if m.node == node {
                let s = series
                    .entry(key.clone())
                    .or_default()
                    .entry(sig.as_str().to_owned())
                    .or_default();
                s.extend(pts.iter().map(|&[t, x]| [t - start, x]));
            }
        }
    }
    for sigs in series.values_mut() {
        for pts in sigs.values_mut() {
            pts.sort_by(|a, b| a[0].total_cmp(&b[0]));
        }
    }
    let ep = Episode {
        format: FORMAT.to_owned(),
        name: name.to_owned(),
        source: "prometheus".to_owned(),
        cause: None,
        magnitude: None,
        target: members.keys().next().cloned().unwrap_or_default(),
        start_unix_s: start,
        duration_s: (end - start).max(1.0),
        onset_offset_s: None,
        notes: String::new(),
        series,
    };
    (ep, members)
}

/// The fleet view of `a` over `members`.
pub fn fleet_view(a: &Analysis, members: &BTreeMap<String, Member>) -> Fleet {
    let mut moved = Vec::new();
    let mut calm = Vec::new();
    for (key, m) in members {
        let t = a.diagnosis.targets.iter().find(|t| &t.target == key);
        match t {
            Some(t) if t.state != State::Idle => moved.push(Moved {
                member: m.clone(),
                state: t.state,
                cause: t.causes.first().map(|c| c.cause),
                score: t.causes.first().map(|c| c.score),
            }),
            _ => calm.push(m.clone()),
        }
    }
    let nodes: BTreeSet<&str> = members.values().map(|m| m.node.as_str()).collect();
    let models: BTreeSet<&str> = members.values().map(|m| m.model.as_str()).collect();
    let moved_nodes: BTreeSet<&str> = moved.iter().map(|m| m.member.node.as_str()).collect();
    let moved_models: BTreeSet<&str> = moved.iter().map(|m| m.member.model.as_str()).collect();
    let calm_models: BTreeSet<&str> = calm.iter().map(|m| m.model.as_str()).collect();
    let causes: BTreeSet<&str> = moved
        .iter()
        .filter_map(|m| m.cause.map(Cause::as_str))
        .collect();
    let causes = causes.into_iter().collect::<Vec<_>>().join(", ");
    let list = |s: &BTreeSet<&str>| s.iter().copied().collect::<Vec<_>>().join(", ");
    let (scope, verdict) = if moved.is_empty() {
        (
            "none",
            format!("no node moved ({} nodes calm)", nodes.len()),
        )
    } else if calm.is_empty() && nodes.len() > 1 {
        (
            "every_node",
            format!(
                "every node moved ({} of {}; {causes}): a shared cause (network, upstream, a rollout), not one GPU",
                moved_nodes.len(),
                nodes.len()
            ),
        )
    } else if moved_nodes.len() == 1 {
        let node = list(&moved_nodes);
        (
            "one_node",
            format!(
                "one node moved: {node} ({causes}); {} other node(s) calm: local to that node (its GPU, server or host)",
                nodes.len() - 1
            ),
        )
    } else if moved_models.len() == 1 && moved_models.is_disjoint(&calm_models) {
        (
            "one_model",
            format!(
                "one model moved: {} on {} nodes ({causes}); other models calm: the model's rollout or its servers",
                list(&moved_models),
                moved_nodes.len()
            ),
        )
    } else {
        (
            "several",
            format!(
                "{} of {} nodes moved ({}; {causes})",
                moved_nodes.len(),
                nodes.len(),
                list(&moved_nodes)
            ),
        )
    };
    Fleet {
        scope: scope.to_owned(),
        verdict,
        nodes: nodes.len(),
        models: models.len(),
        moved,
        calm,
    }
}

/// The fleet view as text, after the scorecard.
pub fn fleet_text(f: &Fleet) -> String {
    let mut s = format!("fleet: {}\n", f.verdict);
    for m in &f.moved {
        s.push_str(&format!(
            "  moved  {} {} {}: {} {}\n",
            m.member.node,
            m.member.target,
            m.member.model,
            m.cause.map_or("-", Cause::as_str),
            m.score.map_or(String::new(), |x| format!("{x:.2}")),
        ));
    }
    for m in &f.calm {
        s.push_str(&format!("  calm   {} {} {}\n", m.node, m.target, m.model));
    }
    s
}

/// `lmperf analyze --prometheus URL`: the analysis and the fleet view.
pub async fn analyze_prometheus(q: &PromQuery) -> Result<(Analysis, Fleet), AnalyzeError> {
    let base = q.url.trim_end_matches('/').to_owned();
    let err = |msg: String| AnalyzeError::Prometheus {
        url: base.clone(),
        msg,
    };
    let end = crate::diagnosis::report::unix_s(SystemTime::now()).floor();
    let start = end - q.window.as_secs_f64();
    crate::install_tls_provider();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| err(e.to_string()))?;
    let url = format!("{base}/api/v1/query_range");
    let step = format!("{}", q.step.as_secs_f64().max(0.001));
    let mut answers = Vec::new();
    for (sig, expr) in queries(&prom_duration(q.rate_window), &prom_duration(q.step)) {
        let u = reqwest::Url::parse_with_params(
            &url,
            &[
                ("query", expr.as_str()),
                ("start", &format!("{start}")),
                ("end", &format!("{end}")),
                ("step", &step),
            ],
        )
        .map_err(|e| err(format!("{url}: {e}")))?;
        let resp = client
            .get(u)
            .send()
            .await
            .map_err(|e| err(format!("GET {url}: {}", e.without_url())))?;
        let v: serde_json::Value = resp
            .json()
            .await
            .map_err(|e| err(format!("GET {url} ({}): not JSON: {e}", sig.as_str())))?;
        let rows = parse_matrix(&v).map_err(|e| err(format!("{}: {e}: {expr}", sig.as_str())))?;
        answers.push((sig, rows));
    }
    let (ep, members) = fleet_episode(&answers, start, end, &base);
    if members.is_empty() {
        return Err(err(format!(
            "no lmperf canary series in the last {} s",
            q.window.as_secs()
        )));
    }
    // Each engine target is `node/target`: placed on its node, for node-level diagnoses.
    let a = analyze_episode_placed(&ep, None, format!("prometheus {base}"), &|t| Placement {
        node: t.split_once('/').map(|(n, _)| n.to_owned()),
        gpus: None,
    });
    let fleet = fleet_view(&a, &members);
    Ok((a, fleet))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::Diagnosis;

    fn row(node: &str, target: &str, model: &str, pts: &[[f64; 2]]) -> serde_json::Value {
        let mut m = serde_json::json!({"instance": format!("{node}:9464"), "node": node});
        if !target.is_empty() {
            m["lmperf_target"] = target.into();
            m["gen_ai_request_model"] = model.into();
        }
        let values: Vec<_> = pts
            .iter()
            .map(|[t, x]| serde_json::json!([t, x.to_string()]))
            .collect();
        serde_json::json!({"metric": m, "values": values})
    }

    fn matrix(rows: Vec<serde_json::Value>) -> Rows {
        parse_matrix(&serde_json::json!({"status": "success",
            "data": {"resultType": "matrix", "result": rows}}))
        .unwrap()
    }

    #[test]
    fn matrix_rows_become_members_and_node_series_join_every_target_of_their_node() {
        let ttft = matrix(vec![
            row("a", "chat", "m1", &[[100.0, 0.05], [102.0, 0.06]]),
            row("b", "chat", "m1", &[[100.0, 0.05]]),
        ]);
        let gpu = matrix(vec![row("a", "", "", &[[101.0, 1.0]])]);
        let (ep, members) = fleet_episode(
            &[(Signal::Ttft, ttft), (Signal::GpuThrottle, gpu)],
            100.0,
            200.0,
            "p",
        );
        assert_eq!(members.len(), 2);
        assert_eq!(members["a/chat"].model, "m1");
        assert_eq!(ep.series["a/chat"]["ttft"], vec![[0.0, 0.05], [2.0, 0.06]]);
        assert_eq!(ep.series["a/chat"]["gpu_throttle"], vec![[1.0, 1.0]]);
        assert!(!ep.series["b/chat"].contains_key("gpu_throttle"));
        assert_eq!(ep.duration_s, 100.0);
        let bad = parse_matrix(&serde_json::json!({"status": "error",
            "errorType": "bad_data", "error": "parse error"}));
        assert_eq!(bad.unwrap_err(), "bad_data: parse error");
    }

    fn analysis(states: &[(&str, &str, Option<&str>)]) -> Analysis {
        let targets: Vec<_> = states
            .iter()
            .map(|(t, s, c)| {
                let causes: Vec<_> = c
                    .iter()
                    .map(|c| serde_json::json!({"cause": c, "score": 0.9, "evidence": []}))
                    .collect();
                serde_json::json!({"target": t, "state": s, "since_unix_s": null,
                    "onset_unix_s": null, "symptom": null, "causes": causes,
                    "ttft_decomposition": null, "summary": null})
            })
            .collect();
        let d: Diagnosis = serde_json::from_value(serde_json::json!({"schema_version": 1,
            "evaluated_at_unix_s": 0.0, "targets": targets}))
        .unwrap();
        Analysis {
            source: "p".into(),
            diagnosis: d,
            timeline: BTreeMap::new(),
            series: BTreeMap::new(),
        }
    }

    fn members(list: &[(&str, &str, &str)]) -> BTreeMap<String, Member> {
        list.iter()
            .map(|(n, t, m)| {
                let m = Member {
                    node: (*n).into(),
                    target: (*t).into(),
                    model: (*m).into(),
                };
                (m.key(), m)
            })
            .collect()
    }

    #[test]
    fn the_fleet_view_tells_one_node_from_one_model_and_every_node() {
        let ms = members(&[
            ("a", "chat", "m1"),
            ("a", "code", "m2"),
            ("b", "chat", "m1"),
            ("b", "code", "m2"),
        ]);
        // The members `moved` (key, state) with `cause`; every other one idle.
        let view = |moved: &[(&str, &str)], cause: &'static str| {
            let states: Vec<_> = ms
                .keys()
                .map(|k| match moved.iter().find(|(m, _)| m == k) {
                    Some((_, state)) => (k.as_str(), *state, Some(cause)),
                    None => (k.as_str(), "idle", None),
                })
                .collect();
            fleet_view(&analysis(&states), &ms)
        };
        let f = view(
            &[("a/chat", "root_confirmed"), ("a/code", "propagating")],
            "gpu_throttling",
        );
        assert_eq!(f.scope, "one_node", "{}", f.verdict);
        assert!(f.verdict.contains("one node moved: a (gpu_throttling)"));
        let f = view(
            &[("a/chat", "root_confirmed"), ("b/chat", "root_confirmed")],
            "server_change",
        );
        assert_eq!(f.scope, "one_model", "{}", f.verdict);
        assert!(f.verdict.contains("m1 on 2 nodes"));
        let all: Vec<(&str, &str)> = ms.keys().map(|k| (k.as_str(), "root_confirmed")).collect();
        let f = view(&all, "network");
        assert_eq!(f.scope, "every_node", "{}", f.verdict);
        let f = fleet_view(&analysis(&[]), &ms);
        assert_eq!(f.scope, "none");
        assert_eq!(f.calm.len(), 4);
        let text = fleet_text(&fleet_view(
            &analysis(&[("a/chat", "root_confirmed", Some("network"))]),
            &ms,
        ));
        assert!(text.contains("  moved  a chat m1: network 0.90"), "{text}");
    }
}
