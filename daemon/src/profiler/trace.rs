//! One profiling trace (Chrome trace JSON as `torch.profiler` writes it) → time per kernel,
//! per op and per module. **Pure**: bytes in (already decompressed), figures out; no IO.
//!
//! The shape read is the one of torch's `export_chrome_trace` (kineto's
//! `libkineto/src/output_json.cpp`, checked against a real torch 2.15 trace:
//! `tests/fixtures/torch_traces/`): `{"traceEvents": [...]}` (a bare array is accepted too),
//! complete events `ph: "X"` with `cat`, `name`, `ts` and `dur` in µs, `pid`, `tid` (a number
//! or a string), `args`. The categories used:
//! - `kernel`, `gpu_memcpy`, `gpu_memset`: device work, by name (time per kernel);
//! - `cpu_op`: the aten ops, by name, self time (its time less that of the ops it called);
//! - `python_function` named `nn.Module: <Class>_<n>` (torch records each eager module call
//!   so with `with_stack=True`, vLLM's `--profiler-config` default) and `user_annotation`
//!   (`record_function` scopes): the module scopes, named by their path of enclosing scopes
//!   (`Model_0/DecoderLayer_2/Attention_2`);
//! - `cuda_runtime` / `cuda_driver` launches, whose `args.correlation` ties a kernel to the
//!   host scope it was launched from: a trace with kernels times its modules by the device
//!   time of the kernels they launched, one without by host time.
//!
//! Steps: `user_annotation` events named `ProfilerStep#N` (torch.profiler's schedule) or
//! `execute_context_…` (vLLM's per-iteration annotation, `vllm/v1/worker/gpu_worker.py`
//! `annotate_profile`); without them the trace is one step as long as its events' span.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Prefix torch gives an eager module call's `python_function` event.
const MODULE_PREFIX: &str = "nn.Module: ";
/// Step annotations: torch.profiler's schedule, vLLM's engine iteration.
const STEP_PREFIXES: [&str; 2] = ["ProfilerStep#", "execute_context_"];

/// A trace that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("not a Chrome trace JSON ({0})")]
    Json(#[from] serde_json::Error),
    #[error("no complete (ph \"X\") event with a duration: not a profiling trace")]
    Empty,
}

/// Time of one name (kernel, op or module) over the trace, in µs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    /// Calls (events) of this name.
    pub count: u64,
    /// Time inside it, its children included (µs).
    pub total_us: f64,
    /// Time inside it less its children's (µs): an op's less the ops it called, a module's
    /// less its child modules'. A kernel's equals its total.
    pub self_us: f64,
}

/// Where a trace's module times come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleTime {
    /// The device time of the kernels each module launched (a trace with kernels).
    Device,
    /// The host time spent inside each module (a CPU-only trace).
    Host,
}

/// What one trace holds, aggregated.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceProfile {
    /// Steps found (at least 1).
    pub steps: u64,
    /// Mean step time (µs): the step annotations' mean duration, else the events' span.
    pub step_us: f64,
    /// Device kernels (and memcpy / memset) by name.
    pub kernels: BTreeMap<String, Stat>,
    /// Host ops (`cpu_op`) by name.
    pub ops: BTreeMap<String, Stat>,
    /// Module and annotation scopes by path.
    pub modules: BTreeMap<String, Stat>,
    pub module_time: ModuleTime,
}

#[derive(Deserialize)]
struct Doc {
    #[serde(rename = "traceEvents", default)]
    trace_events: Vec<Event>,
}

#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    ph: String,
    #[serde(default)]
    cat: String,
    #[serde(default)]
    name: String,
    ts: Option<f64>,
    dur: Option<f64>,
    #[serde(default)]
    pid: serde_json::Value,
    #[serde(default)]
    tid: serde_json::Value,
    #[serde(default)]
    args: Args,
}

#[derive(Deserialize, Default)]
struct Args {
    correlation: Option<u64>,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Kernel,
    Op,
    Scope,
    Launch,
    Step,
}

struct Span {
    kind: Kind,
    name: String,
    ts: f64,
    dur: f64,
    lane: (String, String),
    correlation: Option<u64>,
}

fn kind_of(cat: &str, name: &str) -> Option<Kind> {
    match cat {
        "kernel" | "gpu_memcpy" | "gpu_memset" => Some(Kind::Kernel),
        "cpu_op" => Some(Kind::Op),
        "cuda_runtime" | "cuda_driver" => Some(Kind::Launch),
        "user_annotation" if STEP_PREFIXES.iter().any(|p| name.starts_with(p)) => Some(Kind::Step),
        "user_annotation" => Some(Kind::Scope),
        "python_function" if name.starts_with(MODULE_PREFIX) => Some(Kind::Scope),
        _ => None,
    }
}

fn id_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Reads one trace.
///
/// # Errors
/// [`TraceError::Json`] when the bytes are not a Chrome trace (an object with
/// `traceEvents`, or an array of events); [`TraceError::Empty`] without a complete event.
pub fn parse(bytes: &[u8]) -> Result<TraceProfile, TraceError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    let events: Vec<Event> = if first == Some(&b'[') {
        serde_json::from_slice(bytes)?
    } else {
        serde_json::from_slice::<Doc>(bytes)?.trace_events
    };
    let spans: Vec<Span> = events
        .into_iter()
        .filter(|e| e.ph == "X")
        .filter_map(|e| {
            let kind = kind_of(&e.cat, &e.name)?;
            let (ts, dur) = (e.ts?, e.dur?);
            (ts.is_finite() && dur.is_finite() && dur >= 0.0).then(|| Span {
                kind,
                ts,
                dur,
                lane: (id_text(&e.pid), id_text(&e.tid)),
                correlation: e.args.correlation,
                name: e.name,
            })
        })
        .collect();
    if spans.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(aggregate(spans))
}

fn aggregate(mut spans: Vec<Span>) -> TraceProfile {
    // Time order within a lane; an enclosing event (same start, longer) before its children.
    spans.sort_by(|a, b| {
        a.lane
            .cmp(&b.lane)
            .then(a.ts.total_cmp(&b.ts))
            .then(b.dur.total_cmp(&a.dur))
    });
    let mut ops = BTreeMap::new();
    let mut host_modules = BTreeMap::new();
    let mut launched_from: HashMap<u64, String> = HashMap::new();
    for lane in spans.chunk_by(|a, b| a.lane == b.lane) {
        walk_lane(lane, &mut ops, &mut host_modules, &mut launched_from);
    }
    let mut kernels: BTreeMap<String, Stat> = BTreeMap::new();
    let mut device_modules: BTreeMap<String, Stat> = BTreeMap::new();
    for k in spans.iter().filter(|s| s.kind == Kind::Kernel) {
        add(&mut kernels, &k.name, k.dur, k.dur);
        let Some(path) = k.correlation.and_then(|c| launched_from.get(&c)) else {
            continue;
        };
        // Self: the innermost scope that launched it; total: it and every enclosing scope.
        let mut prefix = String::new();
        for (i, seg) in path.split('/').enumerate() {
            if i > 0 {
                prefix.push('/');
            }
            prefix.push_str(seg);
            let own = if prefix.len() == path.len() {
                k.dur
            } else {
                0.0
            };
            let s = device_modules.entry(prefix.clone()).or_default();
            s.total_us += k.dur;
            s.self_us += own;
        }
    }
    let (modules, module_time) = if kernels.is_empty() {
        (host_modules, ModuleTime::Host)
    } else {
        // Calls counted from the host scopes.
        for (path, s) in &mut device_modules {
            s.count = host_modules.get(path).map_or(0, |h| h.count);
        }
        (device_modules, ModuleTime::Device)
    };
    let step_durs: Vec<f64> = spans
        .iter()
        .filter(|s| s.kind == Kind::Step)
        .map(|s| s.dur)
        .collect();
    let (steps, step_us) = if step_durs.is_empty() {
        let start = spans.iter().map(|s| s.ts).fold(f64::INFINITY, f64::min);
        let end = spans.iter().map(|s| s.ts + s.dur).fold(0.0, f64::max);
        (1, (end - start).max(0.0))
    } else {
        let n = step_durs.len();
        (n as u64, step_durs.iter().sum::<f64>() / n as f64)
    };
    TraceProfile {
        steps,
        step_us,
        kernels,
        ops,
        modules,
        module_time,
    }
}

fn add(map: &mut BTreeMap<String, Stat>, name: &str, total: f64, own: f64) {
    let s = map.entry(name.to_owned()).or_default();
    s.count += 1;
    s.total_us += total;
    s.self_us += own;
}

/// One lane (a pid/tid), in time order: ops and scopes each nest among their own kind.
fn walk_lane(
    lane: &[Span],
    ops: &mut BTreeMap<String, Stat>,
    modules: &mut BTreeMap<String, Stat>,
    launched_from: &mut HashMap<u64, String>,
) {
    // Open ops: (end, name, time of direct children); open scopes: (end, path, children).
    let mut op_stack: Vec<(f64, &str, f64, f64)> = Vec::new();
    let mut scope_stack: Vec<(f64, String, f64, f64)> = Vec::new();
    fn close<N: AsRef<str>>(
        stack: &mut Vec<(f64, N, f64, f64)>,
        until: f64,
        into: &mut BTreeMap<String, Stat>,
    ) {
        while let Some(top) = stack.last() {
            if top.0 > until {
                break;
            }
            if let Some((_, name, dur, children)) = stack.pop() {
                add(into, name.as_ref(), dur, (dur - children).max(0.0));
            }
        }
    }
    for s in lane {
        match s.kind {
            Kind::Op => {
                close(&mut op_stack, s.ts, ops);
                if let Some(parent) = op_stack.last_mut() {
                    parent.3 += s.dur;
                }
                op_stack.push((s.ts + s.dur, &s.name, s.dur, 0.0));
            }
            Kind::Scope => {
                close(&mut scope_stack, s.ts, modules);
                let seg = s.name.strip_prefix(MODULE_PREFIX).unwrap_or(&s.name);
                let path = match scope_stack.last_mut() {
                    Some(parent) => {
                        parent.3 += s.dur;
                        format!("{}/{seg}", parent.1)
                    }
                    None => seg.to_owned(),
                };
                scope_stack.push((s.ts + s.dur, path, s.dur, 0.0));
            }
            Kind::Launch => {
                close(&mut scope_stack, s.ts, modules);
                if let (Some(c), Some(scope)) = (s.correlation, scope_stack.last()) {
                    launched_from.insert(c, scope.1.clone());
                }
            }
            Kind::Kernel | Kind::Step => {}
        }
    }
    close(&mut op_stack, f64::INFINITY, ops);
    close(&mut scope_stack, f64::INFINITY, modules);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(cat: &str, name: &str, ts: f64, dur: f64) -> serde_json::Value {
        serde_json::json!({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1})
    }

    #[test]
    fn ops_and_modules_get_self_time_from_their_own_kind() {
        let doc = serde_json::json!({"traceEvents": [
            x("user_annotation", "ProfilerStep#1", 0.0, 100.0),
            x("python_function", "nn.Module: Model_0", 0.0, 90.0),
            x("python_function", "nn.Module: Attention_0", 10.0, 50.0),
            x("python_function", "nn.Module: Linear_0", 20.0, 10.0),
            x("cpu_op", "aten::linear", 21.0, 8.0),
            x("cpu_op", "aten::addmm", 22.0, 6.0),
            x("cpu_op", "aten::matmul", 40.0, 15.0),
            x("python_function", "helper.py(3): f", 40.0, 15.0),
        ]});
        let p = parse(doc.to_string().as_bytes()).unwrap();
        assert_eq!((p.steps, p.step_us), (1, 100.0));
        assert_eq!(p.module_time, ModuleTime::Host);
        let m = |k: &str| p.modules[k].clone();
        assert_eq!(m("Model_0").self_us, 40.0);
        assert_eq!(m("Model_0/Attention_0").total_us, 50.0);
        assert_eq!(m("Model_0/Attention_0").self_us, 40.0);
        assert_eq!(m("Model_0/Attention_0/Linear_0").self_us, 10.0);
        assert_eq!(p.ops["aten::linear"].self_us, 2.0);
        assert_eq!(p.ops["aten::addmm"].self_us, 6.0);
        assert_eq!(p.ops["aten::matmul"].total_us, 15.0);
        assert!(!p.modules.contains_key("helper.py(3): f"));
    }

    #[test]
    fn kernels_time_the_modules_that_launched_them() {
        let launch = |ts: f64, c: u64| {
            serde_json::json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                "ts": ts, "dur": 1.0, "pid": 1, "tid": 1, "args": {"correlation": c}})
        };
        let kernel = |name: &str, ts: f64, dur: f64, c: u64| {
            serde_json::json!({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
                "pid": 0, "tid": "stream 7", "args": {"correlation": c}})
        };
        let doc = serde_json::json!([
            x("python_function", "nn.Module: Layer_0", 0.0, 30.0),
            x("python_function", "nn.Module: Attention_0", 5.0, 10.0),
            launch(6.0, 1),
            launch(20.0, 2),
            kernel("flash_fwd", 50.0, 400.0, 1),
            kernel("gemm", 460.0, 100.0, 2),
            kernel("orphan", 600.0, 7.0, 99),
        ]);
        let p = parse(doc.to_string().as_bytes()).unwrap();
        assert_eq!(p.module_time, ModuleTime::Device);
        assert_eq!(p.kernels["flash_fwd"].total_us, 400.0);
        assert_eq!(p.kernels["orphan"].count, 1);
        assert_eq!(p.modules["Layer_0/Attention_0"].self_us, 400.0);
        assert_eq!(p.modules["Layer_0"].total_us, 500.0);
        assert_eq!(p.modules["Layer_0"].self_us, 100.0);
        assert_eq!(p.modules["Layer_0"].count, 1);
        // No step annotation: one step over the events' span (0 .. 607 µs).
        assert_eq!((p.steps, p.step_us), (1, 607.0));
    }

    #[test]
    fn vllm_iterations_are_steps_and_bad_input_is_an_error() {
        let doc = serde_json::json!({"traceEvents": [
            x("user_annotation", "execute_context_1(16)_generation_0(0)", 0.0, 30.0),
            x("user_annotation", "execute_context_0(0)_generation_1(1)", 40.0, 10.0),
            x("cpu_op", "aten::mm", 1.0, 2.0),
        ]});
        let p = parse(doc.to_string().as_bytes()).unwrap();
        assert_eq!((p.steps, p.step_us), (2, 20.0));
        assert!(p.modules.is_empty());
        assert!(matches!(
            parse(b"{\"traceEvents\": []}"),
            Err(TraceError::Empty)
        ));
        assert!(matches!(parse(b"not json"), Err(TraceError::Json(_))));
    }
}
