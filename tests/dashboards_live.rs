//! The Grafana dashboards on a real Prometheus (issue 26): Debian's Prometheus 2.42 with
//! exemplar storage scrapes a real agent (OpenMetrics, as it asks) that probes scripted servers
//! (streaming with a vLLM metrics page, 503s, cut streams), reads the scripted NVML library
//! and, as root where the kernel allows, loads the eBPF probes. Then every query of every
//! panel and template variable of both dashboards is evaluated through the HTTP API, with the
//! variables and Grafana's `$__rate_interval` / `$__interval` / `$__range` substituted as
//! Grafana would, and must return data; the panels that cannot have data here are listed
//! with their reason. The agent also discovers one pod through a scripted Kubernetes API
//! server: under All the static targets (no k8s labels) and the pod show side by side; with
//! that namespace / deployment / pod picked, every panel shows that pod's series only. `query_exemplars` must return exemplars whose trace ids are all traces
//! the OTLP receiver got.
//!
//! `cargo xtask ci` installs the `prometheus` package and sets `LMPERF_REQUIRE_PROMETHEUS=1`;
//! without it a machine lacking Prometheus skips (and says so).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use fake_opentelemetry_collector::FakeCollectorServer;
use lmperf_e2e::agent::{Agent, workspace_root};
use lmperf_e2e::fake_nvml;
use lmperf_e2e::pod_resources::{Answer, Held, PodResourcesServer};
use lmperf_e2e::prometheus::{Prometheus, tool};
use lmperf_e2e::scripted::{Frame, Reply, ScriptedServer, chat_stream};
use serde_json::{Value, json};

/// Prometheus scrapes every second; Grafana's datasource "scrape interval" set to match.
const SCRAPE_S: u64 = 1;
/// The UUIDs of the scripted NVML's `two_gpus.json` devices.
const GPU_UUIDS: [&str; 2] = [
    "GPU-0c8f6f54-2d4e-4f1a-9b1e-000000000000",
    "GPU-0c8f6f54-2d4e-4f1a-9b1e-000000000001",
];

/// How long the agent runs under the scrapes before the queries (enough for several
/// `$__rate_interval` windows).
const RUN: Duration = Duration::from_secs(30);

/// Panels that need not have data on this machine, with the reason (matched by title; a
/// listed panel that has data anyway, e.g. a loopback retransmit on a loaded machine, is
/// said so in the printed list).
fn cannot_have_data(ebpf_on: bool) -> Vec<(&'static str, &'static str)> {
    let mut v = vec![
        (
            "TCP retransmits/s by peer",
            "a retransmit on loopback is not guaranteed here (tests/net.rs forces one with a full accept queue)",
        ),
        (
            "Server queue time p99 and token rates",
            "after the restart the scripted vLLM page's queue times all lie in its first bucket (le 0.3 s): the agent says \"below the first bucket\" (p99_below) and publishes no p99; the panel's token-rate queries are still evaluated",
        ),
    ];
    if !ebpf_on {
        v.push((
            "TCP smoothed RTT p99 by peer",
            "the eBPF probes are off here (not root, or the kernel refused them)",
        ));
    }
    v
}

fn dashboards() -> Vec<(String, Value)> {
    let dir = workspace_root().join("dashboards");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).expect("dashboards/") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "json") {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).expect("read"))
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            out.push((p.file_name().unwrap().to_string_lossy().into_owned(), v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

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

/// Grafana's built-in interval variables for a dashboard range of `range_s` seconds and a
/// datasource scrape interval of [`SCRAPE_S`]: `$__interval` is range ÷ max data points
/// (1,000 here), never below the scrape interval; `$__rate_interval` is
/// max(`$__interval` + scrape interval, 4 × scrape interval).
fn builtins(range_s: u64) -> BTreeMap<&'static str, String> {
    let interval_ms = (range_s * 1000 / 1000).max(SCRAPE_S * 1000);
    let rate_ms = (interval_ms + SCRAPE_S * 1000).max(4 * SCRAPE_S * 1000);
    BTreeMap::from([
        ("__rate_interval", format!("{rate_ms}ms")),
        ("__interval", format!("{interval_ms}ms")),
        ("__range", format!("{range_s}s")),
    ])
}

/// Substitutes `$name`, `${name}` and `[[name]]` (longest names first, as Grafana's regex
/// matches whole names).
fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut out = expr.to_owned();
    for n in names {
        let v = &vars[n];
        out = out
            .replace(&format!("${{{n}}}"), v)
            .replace(&format!("[[{n}]]"), v)
            .replace(&format!("${n}"), v);
    }
    out
}

/// A query variable's values: `label_values(series, label)` through the series API, any
/// other query as an instant query's label values.
fn variable_values(p: &Prometheus, query: &str, vars: &BTreeMap<String, String>) -> Vec<String> {
    let q = substitute(query, vars);
    let (series, label) = q
        .trim()
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
        .and_then(|a| a.rsplit_once(','))
        .unwrap_or_else(|| panic!("only label_values() variables are used: {q}"));
    let v = p.api(&format!(
        "/api/v1/series?match[]={}",
        urlencode(series.trim())
    ));
    let mut out: BTreeSet<String> = BTreeSet::new();
    for s in v["data"].as_array().into_iter().flatten() {
        if let Some(x) = s[label.trim()].as_str() {
            out.insert(x.to_owned());
        }
    }
    out.into_iter().collect()
}

fn urlencode(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// The variables as Grafana sets them on first load: a query variable with "All" gets its
/// `allValue` (else the regex of every value), otherwise its first value; a custom one its
/// `current` value.
/// `picked` holds a user's picks: those query variables get the value given (the variables
/// after them follow it). Also each query variable's values.
fn resolve_picked(
    p: &Prometheus,
    dash: &Value,
    problems: &mut Vec<String>,
    file: &str,
    picked: &BTreeMap<&str, &str>,
) -> (BTreeMap<String, String>, BTreeMap<String, Vec<String>>) {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut all_values = BTreeMap::new();
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or("").to_owned();
        match v["type"].as_str() {
            Some("query") => {
                let q = v["query"]["query"]
                    .as_str()
                    .or(v["query"].as_str())
                    .unwrap_or("");
                let values = variable_values(p, q, &vars);
                if values.is_empty() {
                    problems.push(format!("{file}: variable ${name} has no values: {q}"));
                }
                all_values.insert(name.clone(), values.clone());
                if let Some(value) = picked.get(name.as_str()) {
                    if !values.iter().any(|x| x == value) {
                        problems.push(format!(
                            "{file}: ${name} = {value:?} is not among its values {values:?}"
                        ));
                    }
                    vars.insert(name, regex_escape(value));
                    continue;
                }
                let value = if v["includeAll"] == true {
                    v["allValue"]
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| {
                            format!(
                                "({})",
                                values
                                    .iter()
                                    .map(|x| regex_escape(x))
                                    .collect::<Vec<_>>()
                                    .join("|")
                            )
                        })
                } else {
                    values.first().cloned().unwrap_or_default()
                };
                vars.insert(name, value);
            }
            Some("custom") => {
                let cur = v["current"]["value"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| {
                        v["query"]
                            .as_str()
                            .unwrap_or("")
                            .split(',')
                            .next()
                            .unwrap_or("")
                            .trim()
                            .to_owned()
                    });
                vars.insert(name, cur);
            }
            Some("datasource") => {
                vars.insert(name.clone(), name);
            }
            _ => {}
        }
    }
    (vars, all_values)
}

fn regex_escape(s: &str) -> String {
    let mut o = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            o.push('\\');
        }
        o.push(c);
    }
    o
}

/// The values of `label` on the series of a query result.
fn label_values(v: &Value, label: &str) -> BTreeSet<String> {
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["metric"][label].as_str().map(str::to_owned))
        .collect()
}

/// Does a `query_range` result hold at least one finite value?
fn has_data(v: &Value) -> bool {
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| {
            s["values"].as_array().into_iter().flatten().any(|p| {
                p[1].as_str()
                    .and_then(|x| x.parse::<f64>().ok())
                    .is_some_and(f64::is_finite)
            })
        })
}

async fn servers() -> (ScriptedServer, ScriptedServer, ScriptedServer) {
    // The ok target's /metrics: a vLLM page, then another, then the first again (a restart),
    // so the lmperf.server.* series and a change event exist.
    let pages = ["a", "b", "a"].map(|s| {
        std::fs::read_to_string(
            workspace_root().join(format!("tests/fixtures/server/vllm-new.{s}.prom")),
        )
        .expect("fixture page")
    });
    let scrapes = Arc::new(AtomicUsize::new(0));
    let n = Arc::new(AtomicUsize::new(0));
    let ok = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path == "/metrics" {
            let i = scrapes.fetch_add(1, Ordering::SeqCst);
            return Reply::Stream {
                status: 200,
                content_type: "text/plain; version=0.0.4".into(),
                frames: vec![Frame {
                    at: Duration::ZERO,
                    bytes: pages[i.min(2)].clone().into_bytes(),
                }],
                cut: false,
            };
        }
        // Latencies spread over several buckets.
        let k = n.fetch_add(1, Ordering::SeqCst);
        let ms = Duration::from_millis;
        Reply::sse(chat_stream(
            3 + k % 4,
            ms(5 + 40 * (k % 5) as u64),
            ms(5 + 10 * (k % 3) as u64),
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
    (ok, failing, cut)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_and_variable_returns_data_and_exemplars_resolve() {
    let Some(prom_bin) = tool("prometheus") else {
        return;
    };
    let started = Instant::now();
    let (ok, failing, cut) = servers().await;
    let mut collector = FakeCollectorServer::start().await.unwrap();

    // The scripted NVML: two GPUs, one throttled, an XID early on.
    let mut script = fake_nvml::example("two_gpus.json");
    script["devices"][0]["throttle_reasons"] = json!(4);
    script["devices"][0]["xids"] = json!([{ "at": 2, "code": 48 }]);
    let script = fake_nvml::Script::write("dashboards-live", &script);
    let lib = fake_nvml::library(&[]);

    let dir = lmperf_e2e::temp::dir("dashboards-live");
    // The kubelet's pod-resources API (scripted): each GPU held by a pod, so the Node
    // dashboard's `$pod` variable and its by-pod GPU panels have values.
    let pods = PodResourcesServer::start(
        &dir.join("pod-resources"),
        Answer::Pods(vec![
            Held::gpus("ml", "vllm-0", "vllm", &[GPU_UUIDS[0]]),
            Held::gpus("ml", "vllm-1", "vllm", &[GPU_UUIDS[1]]),
        ]),
    )
    .await;
    // A scripted Kubernetes API server with one annotated pod, ml/vllm-0 of Deployment vllm
    // (the holder of GPU 0 above), at the ok server: the k8s variables have values, and the
    // static targets (no k8s labels) must still show under All.
    let (_kube, discovery, kubeconfig) =
        lmperf_e2e::promql::k8s_discovery("dashboards-live-k8s", ok.addr.port()).await;
    // The router target's page: vllm-router's, so the picks panel has data.
    let router = lmperf_e2e::promql::router_page().await;
    let router_page = router.url();
    let frontend = lmperf_e2e::promql::dynamo_pd_frontend().await;
    let frontend_url = frontend.url();
    // The router's direct workers: the ok server under two names (two workers that answer
    // alike) and the failing one, so the workers-apart panel has data.
    let ok_again = ok.url().replace("127.0.0.1", "localhost");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "[canary]\ninterval = \"200ms\"\nmodel = \"m\"\nsampling_ratio = 0.2\n\
             [[target]]\nname = \"ok\"\nurl = \"{}\"\n[[target]]\nname = \"failing\"\nurl = \"{}\"\n[[target]]\nname = \"cut\"\nurl = \"{}\"\n\
             [[target]]\nname = \"router\"\nurl = \"{frontend_url}\"\nkind = \"router\"\nworker_probes = false\nmetrics_url = \"{router_page}/metrics\"\nmetrics_interval = \"1s\"\ndirect_workers = [\"{0}\", \"{ok_again}\", \"{1}\"]\ndirect_interval = \"1s\"\n\
             [gpu]\ninterval = \"500ms\"\nnvml_library = \"{}\"\npod_resources_socket = \"{}\"\n{}",
            ok.url(),
            failing.url(),
            cut.url(),
            lib.display(),
            pods.path.display(),
            std::fs::read_to_string(&discovery).unwrap()
        ),
    )
    .unwrap();
    let endpoint = collector.endpoint();
    let mut env: Vec<(&'static str, String)> = script.env();
    env.push(("KUBECONFIG", kubeconfig.display().to_string()));
    let agent = tokio::task::spawn_blocking(move || {
        let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Agent::spawn(
            &[
                "--config",
                cfg.to_str().unwrap(),
                "--otlp-protocol",
                "grpc",
                "--otlp-endpoint",
                &endpoint,
            ],
            &envs,
        )
    })
    .await
    .unwrap();

    let prom_cfg = format!(
        "global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\nscrape_configs:\n  - job_name: lmperf\n    static_configs:\n      - targets: ['{}']\n",
        agent.admin
    );
    let prom = tokio::task::spawn_blocking(move || {
        Prometheus::start_with(
            &prom_bin,
            &prom_cfg,
            &[],
            &["--enable-feature=exemplar-storage"],
        )
    })
    .await
    .unwrap();
    let run_from = SystemTime::now();

    let mut spans = Vec::new();
    let t = Instant::now();
    while t.elapsed() < RUN {
        spans.extend(
            collector
                .exported_spans(usize::MAX, Duration::from_millis(500))
                .await,
        );
    }
    let status = agent.status();
    let ebpf_on = status["net"]["mode"] == "on";
    let end_unix = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let range_s = SystemTime::now()
        .duration_since(run_from)
        .unwrap()
        .as_secs()
        .max(1);
    let start_unix = end_unix - range_s;

    // The scrape is OpenMetrics and healthy.
    let targets = prom.api("/api/v1/targets");
    let tgt = &targets["data"]["activeTargets"][0];
    assert_eq!(tgt["health"], "up", "{tgt:#}\n{}", prom.log());
    assert_eq!(tgt["lastError"], "", "{tgt:#}");

    let mut problems = Vec::new();
    let mut evaluated = 0;
    let mut without_data: Vec<String> = Vec::new();
    let skip = cannot_have_data(ebpf_on);
    let (_, k8s_ns, k8s_pod, k8s_deployment) = lmperf_e2e::promql::K8S_POD;
    let k8s_target = format!("{k8s_ns}/{k8s_pod}");
    let eval = |dash: &Value, vars: &BTreeMap<String, String>, file: &str| {
        let mut out = Vec::new();
        for p in panels(dash) {
            let title = p["title"].as_str().unwrap_or("").to_owned();
            for target in p["targets"].as_array().into_iter().flatten() {
                let Some(expr) = target["expr"].as_str() else {
                    continue;
                };
                let q = substitute(expr, vars);
                assert!(
                    !q.contains('$'),
                    "{file}: {title}: unsubstituted variable in {q}"
                );
                let r = prom.api(&format!(
                    "/api/v1/query_range?query={}&start={start_unix}&end={end_unix}&step={}",
                    urlencode(&q),
                    vars["__interval"]
                        .trim_end_matches("ms")
                        .parse::<u64>()
                        .unwrap_or(1000) as f64
                        / 1000.0
                ));
                out.push((title.clone(), q, r));
            }
        }
        out
    };
    for (file, dash) in dashboards() {
        // All: every panel has data, static and discovered targets side by side.
        let (mut vars, values) =
            resolve_picked(&prom, &dash, &mut problems, &file, &BTreeMap::new());
        for (k, v) in builtins(range_s) {
            vars.insert(k.to_owned(), v);
        }
        for (name, want) in [
            ("namespace", k8s_ns),
            ("deployment", k8s_deployment),
            ("pod", k8s_pod),
        ] {
            if !values
                .get(name)
                .is_some_and(|v| v.iter().any(|x| x == want))
            {
                problems.push(format!("{file}: ${name} lacks {want:?}: {values:?}"));
            }
        }
        let mut shown: BTreeSet<String> = BTreeSet::new();
        for (title, q, r) in eval(&dash, &vars, &file) {
            evaluated += 1;
            shown.extend(label_values(&r, "lmperf_target"));
            let data = has_data(&r);
            let listed = skip.iter().find(|(t, _)| *t == title);
            if !data && listed.is_none() {
                problems.push(format!("{file}: panel {title:?}: no data:\n    {q}"));
            }
            if !data {
                without_data.push(title);
            }
        }
        for t in ["ok", "failing", "cut", k8s_target.as_str()] {
            if !shown.contains(t) {
                problems.push(format!(
                    "{file}: under All no panel shows target {t:?} (shown: {shown:?})"
                ));
            }
        }

        // One pod picked: every panel shows that pod's series only, the canary panels
        // (through the k8s labels or through $target) and the GPU panels (the GPU it holds).
        let picked = BTreeMap::from([
            ("namespace", k8s_ns),
            ("deployment", k8s_deployment),
            ("pod", k8s_pod),
        ]);
        let (mut vars, values) = resolve_picked(&prom, &dash, &mut problems, &file, &picked);
        for (k, v) in builtins(range_s) {
            vars.insert(k.to_owned(), v);
        }
        if let Some(t) = values.get("target")
            && *t != [k8s_target.clone()]
        {
            problems.push(format!("{file}: $target follows the pod pick: {t:?}"));
        }
        let mut with_data = 0;
        for (title, q, r) in eval(&dash, &vars, &file) {
            evaluated += 1;
            with_data += usize::from(has_data(&r));
            for (label, want) in [
                ("lmperf_target", k8s_target.as_str()),
                ("k8s_pod_name", k8s_pod),
                ("hw_id", GPU_UUIDS[0]),
            ] {
                let got = label_values(&r, label);
                if got.iter().any(|v| v != want) {
                    problems.push(format!(
                        "{file}: panel {title:?} with pod {k8s_pod} picked shows {label} {got:?}:\n    {q}"
                    ));
                }
            }
        }
        if with_data < 3 {
            problems.push(format!(
                "{file}: with pod {k8s_pod} picked only {with_data} queries have data"
            ));
        }
    }

    // Exemplars: stored by Prometheus, each naming a trace the receiver got.
    let mut exemplar_traces: BTreeSet<String> = BTreeSet::new();
    for metric in [
        "gen_ai_client_operation_duration_seconds_bucket",
        "gen_ai_client_operation_time_to_first_chunk_seconds_bucket",
        "gen_ai_client_operation_time_per_output_chunk_seconds_bucket",
    ] {
        let r = prom.api(&format!(
            "/api/v1/query_exemplars?query={metric}&start={start_unix}&end={}",
            end_unix + 1
        ));
        let n: usize = r["data"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                for e in s["exemplars"].as_array().into_iter().flatten() {
                    if let Some(id) = e["labels"]["trace_id"].as_str() {
                        exemplar_traces.insert(id.to_owned());
                    }
                }
                s["exemplars"].as_array().map_or(0, Vec::len)
            })
            .sum();
        if n == 0 {
            problems.push(format!("query_exemplars({metric}) returned none: {r}"));
        }
    }
    let (code, agent) = agent.stop(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0), "{}", agent.stderr_text());
    spans.extend(
        collector
            .exported_spans(usize::MAX, Duration::from_secs(1))
            .await,
    );
    let received: BTreeSet<&str> = spans.iter().map(|s| s.trace_id.as_str()).collect();
    let unresolved: Vec<&String> = exemplar_traces
        .iter()
        .filter(|t| !received.contains(t.as_str()))
        .collect();
    assert!(
        unresolved.is_empty(),
        "{} of {} exemplar trace ids were never received over OTLP: {unresolved:?}",
        unresolved.len(),
        exemplar_traces.len()
    );

    eprintln!(
        "dashboards on Prometheus: {evaluated} queries over {range_s} s, {} exemplar traces (all received, {} spans), eBPF {}",
        exemplar_traces.len(),
        received.len(),
        if ebpf_on { "on" } else { "off" }
    );
    eprintln!("panels that need not have data here:");
    for (title, why) in &skip {
        let had = if without_data.iter().any(|t| t == title) {
            "no data"
        } else {
            "had data this run"
        };
        eprintln!("  {title}: {why} ({had})");
    }
    assert!(evaluated >= 40, "only {evaluated} queries evaluated");
    assert!(
        problems.is_empty(),
        "{}\nwithout data: {without_data:#?}",
        problems.join("\n")
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "took {:?}",
        started.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn latency_panels_show_exemplars() {
    for (file, dash) in dashboards() {
        for p in panels(&dash) {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or("");
                if expr.contains("histogram_quantile(") && expr.contains("gen_ai_client_operation")
                {
                    assert_eq!(t["exemplar"], true, "{file}: {:?}: {expr}", p["title"]);
                }
            }
        }
    }
}

#[test]
fn grafana_interval_variables() {
    let b = builtins(60);
    assert_eq!(
        (
            b["__interval"].as_str(),
            b["__rate_interval"].as_str(),
            b["__range"].as_str()
        ),
        ("1000ms", "4000ms", "60s")
    );
    let b = builtins(3600);
    assert_eq!(
        (b["__interval"].as_str(), b["__rate_interval"].as_str()),
        ("3600ms", "4600ms")
    );
    let vars = BTreeMap::from([
        ("target".to_owned(), ".*".to_owned()),
        ("target_x".to_owned(), "X".to_owned()),
    ]);
    assert_eq!(
        substitute("a{t=~\"$target\",u=\"${target_x}\",v=\"$target_x\"}", &vars),
        "a{t=~\".*\",u=\"X\",v=\"X\"}"
    );
}
