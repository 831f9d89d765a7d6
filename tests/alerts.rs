//! The alerting rules of `deploy/alerts/` (issue 16), checked the way Prometheus users check
//! rules, then end to end with the real Prometheus server.
//!
//! - `promtool check rules` on the default rules and on the test render; `promtool test rules`
//!   on `deploy/alerts/tests/*.test.yaml`, which must make every alert fire at least once and
//!   hold a case where a burn-rate alert must not fire.
//! - The rules file is the chart's PrometheusRule rendered with its defaults; SLO thresholds
//!   must be bucket boundaries of the agent's histograms (`telemetry/names.rs`).
//! - Every alert has a severity, a one-line summary naming its subject, a description and a
//!   runbook_url whose anchor is a section of `docs/runbook.md`.
//! - Debian's Prometheus server (loopback, 1 s scrape and evaluation, the windows of
//!   `deploy/alerts/tests/e2e-values.yaml`) scrapes a real agent whose scripted target starts
//!   answering 503: the error-budget page fires, no other alert does, and it resolves after the
//!   target recovers. The times from fault to firing and from recovery to resolved are printed.
//!
//! `cargo xtask ci` installs the `prometheus` package as root and sets
//! `LMPERF_REQUIRE_PROMETHEUS=1`; without it, a machine without the package skips the tests
//! that need it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lmperf_e2e::agent::{Agent, workspace_root};
use lmperf_e2e::prometheus::{Prometheus, promtool, tool};
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
use lmperf_e2e::temp;
use serde_json::Value;

fn alerts_dir() -> PathBuf {
    workspace_root().join("deploy/alerts")
}

fn render_py(args: &[&str]) -> (bool, String, String) {
    let py = workspace_root().join(".venv-peers/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run tests/peers/install.sh (cargo xtask ci does)",
        py.display()
    );
    let out = Command::new(py)
        .arg(workspace_root().join("deploy/tools/render.py"))
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("run render.py");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The first YAML document of `path`, as JSON.
fn yaml(path: &Path) -> Value {
    let p = path.display().to_string();
    let (ok, stdout, stderr) = render_py(&["yaml2json", &p]);
    assert!(ok, "{p} is not YAML:\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).expect("yaml2json JSON");
    v[&p][0].clone()
}

/// The rules file rendered for `values` files (`render.py rules`).
fn rules_text(values: &[&Path]) -> String {
    let mut args = vec!["rules".to_owned()];
    for v in values {
        args.extend(["-f".to_owned(), v.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, stdout, stderr) = render_py(&args);
    assert!(ok, "render.py {args:?} failed:\n{stderr}");
    stdout
}

/// Every rule of a rules document (`{groups: [{rules: [...]}]}`).
fn rules(doc: &Value) -> Vec<Value> {
    doc["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn default_rules() -> Vec<Value> {
    rules(&yaml(&alerts_dir().join("lmperf.rules.yaml")))
}

fn test_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(alerts_dir().join("tests"))
        .expect("deploy/alerts/tests")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no deploy/alerts/tests/*.test.yaml");
    files
}

#[test]
fn rules_file_is_the_chart_rendered_with_its_defaults() {
    let (ok, text, stderr) = render_py(&["alerts-text"]);
    assert!(ok, "{stderr}");
    let file = std::fs::read_to_string(alerts_dir().join("lmperf.rules.yaml"))
        .expect("deploy/alerts/lmperf.rules.yaml");
    assert!(
        file == text,
        "deploy/alerts/lmperf.rules.yaml is stale: run `.venv-peers/bin/python deploy/tools/render.py write-alerts`"
    );
    // The chart's PrometheusRule (full-values turns it on) holds the same groups.
    let full = workspace_root().join("deploy/helm/lmperf/ci/full-values.yaml");
    let (ok, stdout, stderr) = render_py(&[
        "render",
        "--json",
        "--validate",
        "-f",
        &full.display().to_string(),
    ]);
    assert!(ok, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).expect("render JSON");
    let rule = doc["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .find(|m| m["manifest"]["kind"] == "PrometheusRule")
        .expect("a PrometheusRule with alerts.enabled");
    assert_eq!(
        rule["manifest"]["metadata"]["labels"]["release"], "prometheus",
        "alerts.labels reach the PrometheusRule"
    );
    assert_eq!(
        rule["manifest"]["spec"]["groups"],
        yaml(&alerts_dir().join("lmperf.rules.yaml"))["groups"]
    );
}

/// The chart refuses an SLO threshold that is not a bucket boundary (the burn rate would count
/// the wrong requests), and its lists of boundaries are the agent's.
#[test]
fn slo_thresholds_must_be_bucket_boundaries_of_the_agent_histograms() {
    use lmperf::telemetry::names::{BUCKETS_OPERATION_DURATION, BUCKETS_TIME_TO_FIRST_CHUNK};
    let dir = temp::dir("alerts-test");
    for (key, metric, buckets) in [
        (
            "ttft",
            "gen_ai.client.operation.time_to_first_chunk",
            BUCKETS_TIME_TO_FIRST_CHUNK,
        ),
        (
            "e2e",
            "gen_ai.client.operation.duration",
            BUCKETS_OPERATION_DURATION,
        ),
    ] {
        let values = dir.join(format!("{key}.yaml"));
        std::fs::write(
            &values,
            format!("alerts:\n  slo:\n    {key}:\n      threshold: 0.3\n"),
        )
        .expect("write values");
        let (ok, _, stderr) = render_py(&["rules", "-f", &values.display().to_string()]);
        assert!(!ok, "threshold 0.3 for {key} was accepted");
        let msg = stderr
            .lines()
            .find(|l| l.contains("is not a bucket boundary"))
            .unwrap_or_else(|| panic!("{stderr}"));
        assert!(
            msg.contains(&format!("alerts.slo.{key}.threshold 0.3")) && msg.contains(metric),
            "{msg}"
        );
        let listed: Vec<f64> = msg
            .split("use one of ")
            .nth(1)
            .expect("the boundaries")
            .split_whitespace()
            .map(|b| b.parse().expect("a number"))
            .collect();
        assert_eq!(
            listed, buckets,
            "the chart's boundaries of {metric} differ from telemetry/names.rs"
        );
        // Every boundary is accepted and lands in the rule as the agent writes `le`.
        let last = buckets[buckets.len() - 1];
        std::fs::write(
            &values,
            format!("alerts:\n  slo:\n    {key}:\n      threshold: {last}\n"),
        )
        .expect("write values");
        let text = rules_text(&[&values]);
        // Prometheus 3 stores an integer `le` as "10.0", Prometheus 2 as scraped ("10").
        let le = if last.fract() == 0.0 {
            format!("le=~\"{last}|{last}.0\"")
        } else {
            format!("le=\"{last}\"")
        };
        assert!(
            text.contains(&le),
            "{key} threshold {last} not in the rules as {le}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c == ' ' {
                Some('-')
            } else if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c)
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn every_alert_has_severity_summary_description_and_a_runbook_section() {
    let runbook =
        std::fs::read_to_string(workspace_root().join("docs/runbook.md")).expect("docs/runbook.md");
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## ").or(l.strip_prefix("### ")))
        .map(anchor)
        .collect();
    let severities = ["critical", "warning", "info"];
    let mut names = BTreeSet::new();
    for r in default_rules().iter().filter(|r| r.get("alert").is_some()) {
        let name = r["alert"].as_str().expect("alert name");
        names.insert(name.to_owned());
        let sev = r["labels"]["severity"].as_str().unwrap_or("");
        assert!(severities.contains(&sev), "{name}: severity {sev:?}");
        let summary = r["annotations"]["summary"].as_str().unwrap_or("");
        assert!(
            !summary.is_empty() && !summary.contains('\n'),
            "{name}: one-line summary: {summary:?}"
        );
        assert!(
            summary.contains("{{ $labels."),
            "{name}: the summary names its subject: {summary}"
        );
        let description = r["annotations"]["description"].as_str().unwrap_or("");
        assert!(
            description.len() > 40,
            "{name}: description {description:?}"
        );
        let url = r["annotations"]["runbook_url"].as_str().unwrap_or("");
        let (page, frag) = url
            .split_once('#')
            .unwrap_or_else(|| panic!("{name}: runbook_url {url:?} has no #section"));
        assert!(page.ends_with("docs/runbook.md"), "{name}: {url}");
        assert_eq!(
            frag,
            name.to_lowercase(),
            "{name}: the anchor is the alert's name"
        );
        assert!(
            anchors.contains(frag),
            "{name}: docs/runbook.md has no section `## {name}`"
        );
    }
    for must in [
        "LmperfCanaryErrorBudgetBurn",
        "LmperfTtftBudgetBurn",
        "LmperfE2eBudgetBurn",
        "LmperfCanaryAbsent",
        "LmperfTargetUnreachable",
        "LmperfRootCauseConfirmed",
    ] {
        assert!(names.contains(must), "no {must} in {names:?}");
    }
    // The runbook says what every diagnosis cause means (the names are an API boundary of the
    // diagnosis).
    for cause in lmperf::diagnosis::Cause::ALL.map(|c| c.as_str()) {
        assert!(
            anchors.contains(cause),
            "docs/runbook.md has no section for the cause {cause}"
        );
    }
}

#[test]
fn rules_pass_promtool_check_and_every_alert_has_a_unit_test() {
    let Some(bin) = tool("promtool") else { return };
    let dir = alerts_dir();
    let (ok, out) = promtool(&bin, &dir, &["check", "rules", "lmperf.rules.yaml"]);
    assert!(ok && out.contains("SUCCESS"), "{out}");
    let n = default_rules().len();
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");
    // The test render too (other windows, other grouping).
    let e2e = rules_text(&[&dir.join("tests/e2e-values.yaml")]);
    let tmp = temp::file("e2e-rules.yaml", &e2e);
    let (ok, out) = promtool(&bin, &dir, &["check", "rules", &tmp.display().to_string()]);
    let _ = std::fs::remove_file(&tmp);
    assert!(ok, "{out}");

    let files = test_files();
    let args: Vec<String> = ["test".to_owned(), "rules".to_owned()]
        .into_iter()
        .chain(files.iter().map(|f| f.display().to_string()))
        .collect();
    let t = Instant::now();
    let (ok, out) = promtool(
        &bin,
        &dir,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(ok, "promtool test rules failed:\n{out}");
    println!(
        "promtool test rules: {} files in {:.1} s",
        files.len(),
        t.elapsed().as_secs_f64()
    );

    // Coverage: each alert fires in some case, and each burn-rate alert has a case where it
    // must not.
    let mut fired: BTreeMap<String, usize> = BTreeMap::new();
    let mut silent: BTreeSet<String> = BTreeSet::new();
    for f in &files {
        let doc = yaml(f);
        for t in doc["tests"].as_array().into_iter().flatten() {
            for a in t["alert_rule_test"].as_array().into_iter().flatten() {
                let name = a["alertname"].as_str().expect("alertname").to_owned();
                let n = a["exp_alerts"].as_array().map_or(0, Vec::len);
                if n == 0 {
                    silent.insert(name);
                } else {
                    *fired.entry(name).or_default() += n;
                }
            }
        }
    }
    let alerts: BTreeSet<String> = default_rules()
        .iter()
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect();
    for a in &alerts {
        assert!(fired.contains_key(a), "no promtool test makes {a} fire");
    }
    for a in alerts.iter().filter(|a| a.ends_with("BudgetBurn")) {
        assert!(
            silent.contains(a),
            "no promtool test where {a} must not fire"
        );
    }
}

/// Metrics (and labels) the rules may use before the agent emits them, with the issue that adds
/// them; empty since the server change counter (issue 11) and the diagnosis gauges (issue 12)
/// landed. Add an entry only for a metric whose issue is open.
const PENDING: &[(&str, u32)] = &[];
const PENDING_LABELS: &[(&str, u32)] = &[];

/// The GPU series as the agent exports them, from the agent's own instruments over the scripted
/// NVML backend (CI has no GPU): a thermally throttled GPU with an uncorrected ECC error and an
/// XID 79, and a GPU lost.
fn gpu_exposition() -> String {
    use lmperf::gpu::backend::{XidEvent, throttle};
    use lmperf::gpu::fake::FakeHandle;
    use lmperf::gpu::sampler::Sampler;
    use lmperf::gpu::state::{GpuState, Mode};
    struct NoEnv;
    impl lmperf::config::Env for NoEnv {
        fn var(&self, _: &str) -> Option<String> {
            None
        }
    }
    let o = lmperf::config::Overrides {
        targets: vec!["http://127.0.0.1:1".into()],
        no_otlp: true,
        ..Default::default()
    };
    let cfg = lmperf::config::load(o, &NoEnv).expect("config");
    let telemetry = lmperf::telemetry::Telemetry::init(&cfg.otlp, &NoEnv).expect("telemetry");
    let fake = FakeHandle::with_gpus(2);
    let lost = {
        let mut f = fake.lock();
        f.devices[0].throttle = throttle::HW_THERMAL_SLOWDOWN;
        f.devices[0].ecc_uncorrected = 1;
        let uuid = f.devices[0].info.uuid.clone();
        f.pending_xids.push(XidEvent { uuid, code: 79 });
        f.devices[1].info.uuid.clone()
    };
    let state = Arc::new(GpuState::new(Duration::from_secs(1), Mode::Starting));
    lmperf::gpu::metrics::register(&telemetry.meter(), state.clone());
    let mut sampler = Sampler::new(fake.backend(), state, Duration::from_secs(5));
    let (t0, w0) = (Instant::now(), std::time::SystemTime::now());
    assert!(sampler.tick(t0, w0));
    fake.lock().lost.insert(lost);
    assert!(sampler.tick(t0 + Duration::from_secs(1), w0 + Duration::from_secs(1)));
    let mut out = String::new();
    prometheus::TextEncoder::new()
        .encode_utf8(&telemetry.registry.gather(), &mut out)
        .expect("encode");
    out
}

/// Every metric and label in every rule's expression is one the agent exports (a scrape of the
/// real agent, `promql::agent_metrics`, plus the GPU series above), one a recording
/// rule of the file makes, or a [`PENDING`] one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_expressions_name_only_what_the_agent_exports() {
    use lmperf_e2e::prom_text::label_names;
    use lmperf_e2e::promql::{Pending, check_expr, extract};
    let scrape = lmperf_e2e::promql::agent_metrics().await;
    let gpu = gpu_exposition();
    for must in [
        "hw_errors_total",
        "hw_status_ratio",
        "lmperf_gpu_lost_total",
        "lmperf_gpu_xid_errors_total",
        "lmperf_gpu_throttle_ratio",
    ] {
        assert!(
            gpu.contains(must),
            "{must} not in the GPU exposition:\n{gpu}"
        );
    }
    let mut exported = label_names(&scrape);
    for (name, labels) in label_names(&gpu) {
        exported.entry(name).or_default().extend(labels);
    }
    let rules = default_rules();
    for r in &rules {
        if let Some(name) = r["record"].as_str() {
            let refs =
                extract(r["expr"].as_str().unwrap_or("")).unwrap_or_else(|e| panic!("{name}: {e}"));
            exported
                .entry(name.to_owned())
                .or_default()
                .extend(refs.grouping);
        }
    }
    let pending = Pending {
        metrics: PENDING,
        labels: PENDING_LABELS,
    };
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for r in &rules {
        let name = r["alert"].as_str().or(r["record"].as_str()).unwrap_or("?");
        let expr = r["expr"].as_str().unwrap_or("");
        match check_expr(expr, &exported, &pending) {
            Ok(p) => used.extend(p),
            Err(e) => problems.push(format!("{name}: {e}\n    {expr}")),
        }
    }
    assert!(
        problems.is_empty(),
        "rules that name what the agent does not export:\n{}",
        problems.join("\n")
    );
    for (name, issue) in PENDING {
        assert!(
            used.contains(*name),
            "PENDING lists {name} (issue {issue}) but no rule uses it"
        );
    }
}

/// (name, severity, long window) of each active alert in `state`.
fn active(p: &Prometheus, state: &str) -> BTreeSet<(String, String, String)> {
    p.alerts()
        .iter()
        .filter(|a| a["state"] == state)
        .map(|a| {
            let l = &a["labels"];
            (
                l["alertname"].as_str().unwrap_or("").to_owned(),
                l["severity"].as_str().unwrap_or("").to_owned(),
                l["long_window"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_pages_on_503s_from_a_real_agent_and_resolves_after_recovery() {
    let Some(bin) = tool("prometheus") else {
        return;
    };
    let failing = Arc::new(AtomicBool::new(false));
    let f = failing.clone();
    let server = ScriptedServer::start(Arc::new(move |_, _| {
        if f.load(Ordering::Relaxed) {
            Reply::json(
                503,
                r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
            )
        } else {
            Reply::sse(chat_stream(
                3,
                Duration::from_millis(5),
                Duration::from_millis(5),
                4,
            ))
        }
    }))
    .await;
    let url = server.url();
    let rules = rules_text(&[&alerts_dir().join("tests/e2e-values.yaml")]);
    tokio::task::spawn_blocking(move || e2e(&bin, &url, &rules, &failing))
        .await
        .expect("e2e");
    drop(server);
}

const EXPECTED: &str = "LmperfCanaryErrorBudgetBurn";
/// The diagnosis's warning: a confirmed root cause.
const DIAGNOSED: &str = "LmperfRootCauseConfirmed";

fn e2e(bin: &Path, url: &str, rules: &str, failing: &AtomicBool) {
    let agent = Agent::spawn(
        &[
            "--target",
            url,
            "--model",
            "m",
            "--interval",
            "100ms",
            "--no-otlp",
        ],
        &[],
    );
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [lmperf.rules.yaml]\nscrape_configs:\n  - job_name: lmperf\n    static_configs:\n      - targets: ['{}']\n",
        agent.admin
    );
    let prom = Prometheus::start(bin, &config, &[("lmperf.rules.yaml", rules)]);
    let loaded = prom.api("/api/v1/rules")["data"]["groups"]
        .as_array()
        .map_or(0, |g| {
            g.iter()
                .map(|g| g["rules"].as_array().map_or(0, Vec::len))
                .sum::<usize>()
        });
    assert!(
        loaded >= 30,
        "Prometheus loaded {loaded} rules:\n{}",
        prom.log()
    );

    // Baseline: the fast window (40 s) full of healthy canaries, and no alert at all.
    let mut others: BTreeSet<(String, String, String)> = BTreeSet::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(42) {
        others.extend(
            active(&prom, "pending")
                .into_iter()
                .chain(active(&prom, "firing")),
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(others.is_empty(), "alerts while healthy: {others:?}");
    let ok = prom.api(
        "/api/v1/query?query=sum(lmperf_canary_requests_total%7Blmperf_outcome%3D%22ok%22%7D)",
    );
    let healthy: f64 = ok["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(
        healthy >= 100.0,
        "Prometheus saw {healthy} healthy canaries: {ok}\n{}",
        agent.stderr_text()
    );

    // Fault: every canary gets a 503.
    failing.store(true, Ordering::Relaxed);
    let fault = Instant::now();
    let mut firing_at: BTreeMap<(String, String), f64> = BTreeMap::new();
    // The outage is also diagnosed (issue 50: failed canaries in a row are an incident
    // whatever the baseline): the diagnosis's warning names error_burst beside the page.
    let mut diagnosed: BTreeSet<String> = BTreeSet::new();
    while fault.elapsed() < Duration::from_secs(45) {
        let now = fault.elapsed().as_secs_f64();
        diagnosed.extend(
            prom.alerts()
                .into_iter()
                .filter(|a| a["labels"]["alertname"] == DIAGNOSED)
                .map(|a| a["labels"]["cause"].as_str().unwrap_or("").to_owned()),
        );
        others.extend(
            active(&prom, "pending")
                .into_iter()
                .filter(|(n, _, _)| n != EXPECTED && n != DIAGNOSED),
        );
        for (name, sev, window) in active(&prom, "firing") {
            if name == EXPECTED {
                firing_at.entry((sev, window)).or_insert(now);
            } else if name == DIAGNOSED {
                continue;
            } else {
                others.insert((name, sev, window));
            }
        }
        if firing_at.len() == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let fast = firing_at
        .get(&("critical".to_owned(), "40s".to_owned()))
        .copied();
    // The slower tiers' long windows (4 m, 12 m) hold only the baseline's 42 s, so with every
    // canary failing they pass their (lower) thresholds sooner than the fast page.
    println!(
        "fault (503s) -> {EXPECTED} firing: {}",
        firing_at
            .iter()
            .map(|((s, w), t)| format!("{s} {w} window after {t:.1} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let fast = fast.unwrap_or_else(|| {
        panic!(
            "the 14.4x page never fired in 45 s; alerts: {:?}\n{}",
            prom.alerts(),
            prom.log()
        )
    });
    assert!(fast < 30.0, "the fast page took {fast:.1} s");
    assert_eq!(
        diagnosed,
        BTreeSet::from(["error_burst".to_owned()]),
        "the outage diagnosed as error_burst"
    );
    assert!(
        others.is_empty(),
        "other alerts during the fault: {others:?}"
    );
    // The page as the on-call receives it: the target, the burn and a runbook link.
    let page = prom
        .alerts()
        .into_iter()
        .find(|a| a["labels"]["alertname"] == EXPECTED && a["labels"]["long_window"] == "40s")
        .expect("the fast page");
    let summary = page["annotations"]["summary"].as_str().unwrap_or("");
    let target = url.trim_start_matches("http://");
    assert!(
        summary.starts_with(&format!(
            "{target} (m): canary errors burn the 99% budget 14.4×"
        )),
        "{summary}"
    );
    assert_eq!(page["labels"]["severity"], "critical", "{page}");
    assert!(
        page["annotations"]["runbook_url"]
            .as_str()
            .is_some_and(|u| u.ends_with("docs/runbook.md#lmperfcanaryerrorbudgetburn")),
        "{page}"
    );
    println!("page: {summary}");

    // Recovery: every tier resolves once its short window is clean (40 s for the ticket).
    failing.store(false, Ordering::Relaxed);
    let recovery = Instant::now();
    let mut fast_resolved = None;
    loop {
        let active_all: Vec<(String, String, String)> = active(&prom, "firing")
            .into_iter()
            .chain(active(&prom, "pending"))
            .collect();
        others.extend(
            active_all
                .iter()
                .filter(|(n, _, _)| n != EXPECTED && n != DIAGNOSED)
                .cloned(),
        );
        if fast_resolved.is_none() && !active_all.iter().any(|(_, _, w)| w == "40s") {
            fast_resolved = Some(recovery.elapsed().as_secs_f64());
        }
        if active_all.is_empty() {
            break;
        }
        assert!(
            recovery.elapsed() < Duration::from_secs(90),
            "not resolved 90 s after recovery: {active_all:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    println!(
        "recovery -> the fast page resolved after {:.1} s, every alert after {:.1} s",
        fast_resolved.unwrap_or(0.0),
        recovery.elapsed().as_secs_f64()
    );
    assert!(others.is_empty(), "other alerts: {others:?}");
    // The agent measured the fault as 503s (what the runbook's `lmperf ctl recent --outcome
    // error` shows).
    let (_, metrics) = agent.get("/metrics");
    assert!(
        lmperf_e2e::agent::prom_sum(
            &metrics,
            "lmperf_canary_requests_total",
            &["error_type=\"503\""]
        ) >= 50.0,
        "{metrics}"
    );
}
