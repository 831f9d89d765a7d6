//! `lmperf analyze`: the diagnosis engine over a finished run (`requests.jsonl` of `lmperf
//! run`, and its `server_samples.jsonl` when the server's metrics were read) or a live agent's
//! diagnosis (`/api/v1/diagnosis`), as text, JSON or `scorecard.html`.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::episode::{Episode, FORMAT, replay_placed};
use crate::diagnosis::node_scope::Placement;
use crate::diagnosis::report::{NodeDiagnosis, SCHEMA_VERSION, Scope, State, TargetDiagnosis};
use crate::diagnosis::{Cause, Diagnosis, EngineConfig, Signal};

/// Seconds per row of the bottleneck heatmap.
pub const SLICE_S: f64 = 30.0;

/// What `lmperf analyze` found.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    /// Where the data came from (`run ./results/x`, `agent 127.0.0.1:9464`).
    pub source: String,
    /// Per target, the diagnosis the on-call would have seen: the first `root_confirmed` of the
    /// window, else its last non-idle evaluation, else the last one.
    pub diagnosis: Diagnosis,
    /// Per target, 30 s slices of the highest score of each cause (the heatmap's rows).
    pub timeline: BTreeMap<String, Vec<Slice>>,
    /// Per target, the series replayed (Unix seconds, value), for the evidence plots.
    #[serde(skip)]
    pub series: BTreeMap<String, BTreeMap<Signal, Vec<[f64; 2]>>>,
}

/// One 30 s slice of a target's evaluations.
#[derive(Debug, Clone, Serialize)]
pub struct Slice {
    /// Unix seconds of the slice's start.
    pub start_unix_s: f64,
    /// The highest state reached in the slice.
    pub state: State,
    /// Highest score of each cause in the slice (causes that scored).
    pub scores: BTreeMap<Cause, f64>,
}

/// Why a run could not be analyzed.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {msg}")]
    Line {
        path: String,
        line: usize,
        msg: String,
    },
    #[error("{path}: no requests")]
    Empty { path: String },
    #[error("agent {addr}: {msg}")]
    Agent { addr: String, msg: String },
    #[error("prometheus {url}: {msg}")]
    Prometheus { url: String, msg: String },
}

fn state_rank(s: State) -> u8 {
    s.code()
}

/// Reads a run's `requests.jsonl` into an episode without ground truth: one target per
/// benchmark (and per repeat: `name#2`), its requests at their end time. The run records
/// offsets only, so wall time is anchored on the file's modification time (its last write).
pub fn run_episode(dir: &Path) -> Result<Episode, AnalyzeError> {
    let path = dir.join("requests.jsonl");
    let p = path.display().to_string();
    let io = |source| AnalyzeError::Io {
        path: p.clone(),
        source,
    };
    let file = std::fs::File::open(&path).map_err(io)?;
    let mtime = file
        .metadata()
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut series: BTreeMap<String, BTreeMap<String, Vec<[f64; 2]>>> = BTreeMap::new();
    let mut last = 0.0_f64;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |msg: String| AnalyzeError::Line {
            path: p.clone(),
            line: i + 1,
            msg,
        };
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let num = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
        let benchmark = v
            .get("benchmark")
            .and_then(|x| x.as_str())
            .ok_or_else(|| bad("benchmark: missing".to_owned()))?;
        let send = num("send_ms").ok_or_else(|| bad("send_ms: missing".to_owned()))?;
        let e2el = num("e2el_ms").unwrap_or(0.0);
        let outcome = v.get("outcome").and_then(|x| x.as_str()).unwrap_or("ok");
        if outcome == "cancelled" {
            continue;
        }
        let repeat = num("repeat").unwrap_or(0.0) as u64;
        let target = if repeat == 0 {
            benchmark.to_owned()
        } else {
            format!("{benchmark}#{}", repeat + 1)
        };
        let t = (send + e2el) / 1000.0;
        last = last.max(t);
        let s = series.entry(target).or_default();
        let mut push = |sig: Signal, val: f64| {
            s.entry(sig.as_str().to_owned()).or_default().push([t, val]);
        };
        let failed = outcome != "ok";
        let status = num("http_status").unwrap_or(0.0);
        push(Signal::Error, f64::from(u8::from(failed)));
        push(
            Signal::Error5xx,
            f64::from(u8::from(failed && (500.0..600.0).contains(&status))),
        );
        push(
            Signal::Error429,
            f64::from(u8::from(failed && status == 429.0)),
        );
        push(
            Signal::ErrorTimeout,
            f64::from(u8::from(outcome == "timeout")),
        );
        push(Signal::E2e, e2el / 1000.0);
        if let Some(x) = num("ttft_ms") {
            push(Signal::Ttft, x / 1000.0);
        }
        if let Some(x) = num("tpot_ms") {
            push(Signal::Tpot, x / 1000.0);
        }
        if let Some(x) = num("input_tokens").or_else(|| num("prompt_tokens")) {
            push(Signal::InputTokens, x);
        }
    }
    let Some(target) = series.keys().next().cloned() else {
        return Err(AnalyzeError::Empty { path: p });
    };
    last = last.max(add_server_samples(dir, &mut series)?);
    last = last.max(add_gpu_samples(dir, &mut series)?);
    for sigs in series.values_mut() {
        for pts in sigs.values_mut() {
            pts.sort_by(|a, b| a[0].total_cmp(&b[0]));
        }
    }
    let end = crate::diagnosis::report::unix_s(mtime);
    Ok(Episode {
        format: FORMAT.to_owned(),
        name: dir.display().to_string(),
        source: "run".to_owned(),
        cause: None,
        magnitude: None,
        target,
        start_unix_s: (end - last).floor(),
        duration_s: last.ceil() + 1.0,
        onset_offset_s: None,
        notes: String::new(),
        series,
    })
}

/// Adds a run's `server_samples.jsonl` (none: nothing) to `series`: each scrape's signals as
/// the live agent feeds them ([`crate::diagnosis_live::server_signals`]), on its benchmark's
/// target at its offset from the benchmark's start. Returns the last offset, s.
fn add_server_samples(
    dir: &Path,
    series: &mut BTreeMap<String, BTreeMap<String, Vec<[f64; 2]>>>,
) -> Result<f64, AnalyzeError> {
    add_rows(
        dir,
        crate::bench::server::SAMPLES_FILE,
        "a server sample",
        series,
        |row: crate::bench::server::ServerSampleRow| {
            let signals = crate::diagnosis_live::server_signals(&row.sample)
                .into_iter()
                .map(|(sig, v)| (sig.as_str().to_owned(), v))
                .collect();
            (row.benchmark, row.t_ms, signals)
        },
    )
}

/// Adds a run's `gpu_samples.jsonl` (none: nothing) to `series`: each GPU sample's signals
/// (already the diagnosis's names, [`crate::bench::vram::GpuSampleRow`]) on its benchmark's
/// target. Returns the last offset, s.
fn add_gpu_samples(
    dir: &Path,
    series: &mut BTreeMap<String, BTreeMap<String, Vec<[f64; 2]>>>,
) -> Result<f64, AnalyzeError> {
    add_rows(
        dir,
        crate::bench::vram::GPU_SAMPLES_FILE,
        "a GPU sample",
        series,
        |row: crate::bench::vram::GpuSampleRow| {
            let signals = row
                .signals
                .into_iter()
                .filter(|(name, v)| Signal::parse(name).is_some() && v.is_finite())
                .collect();
            (row.benchmark, row.t_ms, signals)
        },
    )
}

/// Reads the JSON lines of `dir/file` (absent: nothing) as `R`, each turned by `signals` into
/// (benchmark, offset ms, [(signal name, value)]) and added to `series`. Errors name the file,
/// the line and what is wrong. Returns the last offset, s.
fn add_rows<R: serde::de::DeserializeOwned>(
    dir: &Path,
    file: &str,
    what: &str,
    series: &mut BTreeMap<String, BTreeMap<String, Vec<[f64; 2]>>>,
    signals: impl Fn(R) -> (String, f64, Vec<(String, f64)>),
) -> Result<f64, AnalyzeError> {
    let path = dir.join(file);
    let p = path.display().to_string();
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0.0),
        Err(source) => return Err(AnalyzeError::Io { path: p, source }),
    };
    let mut last = 0.0_f64;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| AnalyzeError::Io {
            path: p.clone(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let row: R = serde_json::from_str(&line).map_err(|e| AnalyzeError::Line {
            path: p.clone(),
            line: i + 1,
            msg: format!("not {what}: {e}"),
        })?;
        let (benchmark, t_ms, values) = signals(row);
        let t = t_ms / 1000.0;
        if !t.is_finite() || t < 0.0 {
            return Err(AnalyzeError::Line {
                path: p.clone(),
                line: i + 1,
                msg: format!("t_ms: {t_ms} is not an offset"),
            });
        }
        last = last.max(t);
        let s = series.entry(benchmark).or_default();
        for (sig, v) in values {
            s.entry(sig).or_default().push([t, v]);
        }
    }
    Ok(last)
}

/// Runs the engine over `ep` (once a second) and keeps, per target, the diagnosis of the last
/// `window` (all of it when `None`) and the heatmap slices. Every target shares one node (a
/// run's benchmarks, a recorded episode's targets): see [`analyze_episode_placed`].
pub fn analyze_episode(ep: &Episode, window: Option<Duration>, source: String) -> Analysis {
    analyze_episode_placed(ep, window, source, &|_| Placement::default())
}

/// [`analyze_episode`] with each target placed on its node by `placement`: the node-level
/// diagnoses (a symptom on ≥ 2/3 of a node's targets within one bucket with a shared cause
/// signal, [`crate::diagnosis::node_scope`]) are kept like the targets' (the first
/// `root_confirmed` of the window, else the last), in [`Diagnosis::nodes`], and each member
/// target's diagnosis says `scope: node` and its node.
pub fn analyze_episode_placed(
    ep: &Episode,
    window: Option<Duration>,
    source: String,
    placement: &dyn Fn(&str) -> Placement,
) -> Analysis {
    let from = window.map_or(f64::NEG_INFINITY, |w| ep.duration_s - w.as_secs_f64());
    let mut shown: BTreeMap<String, TargetDiagnosis> = BTreeMap::new();
    let mut nodes: BTreeMap<String, NodeDiagnosis> = BTreeMap::new();
    let mut timeline: BTreeMap<String, Vec<Slice>> = BTreeMap::new();
    let mut evaluated = ep.start_unix_s;
    replay_placed(ep, EngineConfig::default(), placement, |off, d| {
        evaluated = d.evaluated_at_unix_s;
        if off >= from {
            for n in &d.nodes {
                let keep = nodes
                    .get(&n.node)
                    .is_none_or(|prev| prev.state != State::RootConfirmed);
                if keep {
                    nodes.insert(n.node.clone(), n.clone());
                }
            }
        }
        for t in &d.targets {
            let slices = timeline.entry(t.target.clone()).or_default();
            let start = ep.start_unix_s + (off / SLICE_S).floor() * SLICE_S;
            if slices.last().is_none_or(|s| s.start_unix_s < start) {
                slices.push(Slice {
                    start_unix_s: start,
                    state: State::Idle,
                    scores: BTreeMap::new(),
                });
            }
            if let Some(s) = slices.last_mut() {
                if state_rank(t.state) > state_rank(s.state) {
                    s.state = t.state;
                }
                for c in &t.causes {
                    let e = s.scores.entry(c.cause).or_insert(0.0);
                    *e = e.max(c.score);
                }
            }
            if off < from {
                continue;
            }
            let keep = match shown.get(&t.target) {
                None => true,
                Some(prev) if prev.state == State::RootConfirmed => false,
                Some(prev) => t.state != State::Idle || prev.state == State::Idle,
            };
            if keep {
                shown.insert(t.target.clone(), t.clone());
            }
        }
    });
    let series = ep
        .series
        .iter()
        .map(|(t, sigs)| {
            let sigs = sigs
                .iter()
                .filter_map(|(n, pts)| {
                    let s = Signal::parse(n)?;
                    let pts = pts.iter().map(|&[o, v]| [ep.start_unix_s + o, v]).collect();
                    Some((s, pts))
                })
                .collect();
            (t.clone(), sigs)
        })
        .collect();
    // Each node diagnosis links its members: their shown diagnoses say so even when kept from
    // another second than the node's.
    for n in nodes.values() {
        for t in &n.targets {
            if let Some(d) = shown
                .get_mut(t)
                .filter(|d| d.state != State::Idle && d.causes.iter().any(|c| c.cause == n.cause))
            {
                d.scope = Scope::Node;
                d.node = Some(n.node.clone());
            }
        }
    }
    Analysis {
        source,
        diagnosis: Diagnosis {
            schema_version: SCHEMA_VERSION,
            evaluated_at_unix_s: evaluated,
            targets: shown.into_values().collect(),
            nodes: nodes.into_values().collect(),
        },
        timeline,
        series,
    }
}

/// `lmperf analyze RUN_DIR`.
pub fn analyze_run(dir: &Path, window: Option<Duration>) -> Result<Analysis, AnalyzeError> {
    let ep = run_episode(dir)?;
    Ok(analyze_episode(
        &ep,
        window,
        format!("run {}", dir.display()),
    ))
}

/// `lmperf analyze --agent ADDR`: the agent's `/api/v1/diagnosis` (admin address,
/// `host:port` or a URL), with `window` passed on.
/// Why the agent's admin address did not answer, with what to check (like `lmperf ctl`): from
/// the innermost io error of `e`'s chain, else its chain once.
fn agent_unreachable(e: &(dyn std::error::Error + 'static)) -> String {
    const CHECK: &str =
        "is the agent running, with admin_addr there? (--agent HOST:PORT names another)";
    let mut io = None;
    let mut chain: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(i) = c.downcast_ref::<std::io::Error>() {
            io = Some(i.kind());
        }
        let text = c.to_string();
        if !chain.iter().any(|s| s.contains(&text)) {
            chain.push(text);
        }
        cur = c.source();
    }
    match io {
        Some(std::io::ErrorKind::ConnectionRefused) => format!("connection refused; {CHECK}"),
        Some(std::io::ErrorKind::TimedOut) => format!("no answer within 10 s; {CHECK}"),
        Some(k) => format!("{k}; {CHECK}"),
        None if chain.iter().any(|s| s.contains("timed out")) => {
            format!("no answer within 10 s; {CHECK}")
        }
        None => format!("{}; {CHECK}", chain.join(": ")),
    }
}

pub async fn analyze_agent(addr: &str, window: Option<Duration>) -> Result<Analysis, AnalyzeError> {
    let base = if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.trim_end_matches('/').to_owned()
    } else {
        format!("http://{addr}")
    };
    let mut url = format!("{base}/api/v1/diagnosis");
    if let Some(w) = window {
        url.push_str(&format!("?window={}s", w.as_secs()));
    }
    let err = |msg: String| AnalyzeError::Agent {
        addr: addr.to_owned(),
        msg,
    };
    crate::install_tls_provider();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| err(e.to_string()))?;
    let resp = client
        .get(&url)
        .send()
        .await
        .map_err(|e| err(format!("GET {url}: {}", agent_unreachable(&e))))?;
    if !resp.status().is_success() {
        return Err(err(format!("GET {url}: HTTP {}", resp.status())));
    }
    let diagnosis: Diagnosis = resp
        .json()
        .await
        .map_err(|e| err(format!("GET {url}: not a Diagnosis document: {e}")))?;
    let timeline = diagnosis
        .targets
        .iter()
        .map(|t| {
            let slice = Slice {
                start_unix_s: diagnosis.evaluated_at_unix_s,
                state: t.state,
                scores: t.causes.iter().map(|c| (c.cause, c.score)).collect(),
            };
            (t.target.clone(), vec![slice])
        })
        .collect();
    Ok(Analysis {
        source: format!("agent {addr}"),
        diagnosis,
        timeline,
        series: BTreeMap::new(),
    })
}
