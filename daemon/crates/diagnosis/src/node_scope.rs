//! Node-wide vs target (issue 28, item 4): on a node with several targets, one fault that hits
//! most of them at once through a signal they share (the node's CPU or memory pressure, the
//! node's network, a GPU they share) is one node-level diagnosis, not one incident per
//! target; a fault that hits one target (its GPU, its queue) stays that target's.
//!
//! The rule, per node with at least 2 targets: the targets with a symptom (triggered,
//! propagating or root_confirmed) whose causes rank a node-shared cause at
//! [`MIN_CAUSE_SCORE`] or more, with that cause's signal shared ([`shared`]), and whose onsets
//! lie within one symptom bucket of each other, must be at least [`MIN_SHARE`] of the node's
//! targets (and 2). The cause with the most such targets (then the highest mean score) is the
//! node's; each member target is marked `scope: node` with its node's name, and its summary
//! says so. Pure: the caller says where each target runs ([`Placement`]).

use std::collections::{BTreeMap, BTreeSet};

use super::report::{
    Cause, Evidence, NodeDiagnosis, Scope, State, TargetDiagnosis, clock, fmt_value,
};
use super::signal::Signal;

/// The node of targets the caller placed nowhere (the agent's own node).
pub const LOCAL_NODE: &str = "local";
/// The share of a node's targets a node-level diagnosis needs.
pub const MIN_SHARE: f64 = 2.0 / 3.0;
/// The score the shared cause needs on each member target.
pub const MIN_CAUSE_SCORE: f64 = 0.5;

/// The causes a node's targets can share.
pub const NODE_CAUSES: [Cause; 6] = [
    Cause::NodeCpuPressure,
    Cause::MemoryPressure,
    Cause::Network,
    Cause::GpuThrottling,
    Cause::GpuMemoryPressure,
    Cause::GpuFault,
];

/// Where a target runs: its node and the GPUs it reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// Its node's name; `None`: the agent's own ([`LOCAL_NODE`]).
    pub node: Option<String>,
    /// The GPUs (`hw.id`) it reads: its pod's, where the kubelet's pod-resources API tells
    /// them; `None`: every GPU of its node (a plain host).
    pub gpus: Option<BTreeSet<String>>,
}

impl Placement {
    fn node(&self) -> &str {
        self.node.as_deref().unwrap_or(LOCAL_NODE)
    }
}

/// Whether two targets read a common GPU: both read every GPU of the node, or their known GPUs
/// overlap (one known and one unknown is not a shared GPU).
fn share_gpu(a: &Placement, b: &Placement) -> bool {
    match (&a.gpus, &b.gpus) {
        (None, None) => true,
        (Some(x), Some(y)) => !x.is_disjoint(y),
        _ => false,
    }
}

fn is_gpu(c: Cause) -> bool {
    matches!(
        c,
        Cause::GpuThrottling | Cause::GpuMemoryPressure | Cause::GpuFault
    )
}

/// Whether `cause` on `t` rests on a signal the node's targets share: the node's PSI (memory
/// pressure only through its node PSI evidence: a cgroup's OOM kill is the target's own), the
/// kernel's RTT, the GPU signals (shared GPUs are checked by the caller).
pub fn shared(cause: Cause, t: &TargetDiagnosis) -> bool {
    match cause {
        Cause::NodeCpuPressure | Cause::Network => true,
        Cause::MemoryPressure => t
            .causes
            .iter()
            .filter(|c| c.cause == cause)
            .flat_map(|c| &c.evidence)
            .any(|e| e.signal == Signal::NodeMemoryPressure),
        c => is_gpu(c),
    }
}

fn symptomatic(t: &TargetDiagnosis) -> bool {
    matches!(
        t.state,
        State::Triggered | State::Propagating | State::RootConfirmed
    ) && t.onset_unix_s.is_some()
}

fn score_of(t: &TargetDiagnosis, cause: Cause) -> f64 {
    t.causes
        .iter()
        .find(|c| c.cause == cause)
        .map_or(0.0, |c| c.score)
}

/// The largest set of `(index, onset)` whose onsets lie within `width` seconds of each other.
fn densest(mut v: Vec<(usize, f64)>, width: f64) -> Vec<usize> {
    v.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut best: &[(usize, f64)] = &[];
    let mut start = 0;
    for end in 0..v.len() {
        while v[end].1 - v[start].1 > width {
            start += 1;
        }
        if end + 1 - start > best.len() {
            best = &v[start..=end];
        }
    }
    best.iter().map(|&(i, _)| i).collect()
}

/// Groups `targets` by node and returns the node-level diagnoses, marking their member targets
/// (`scope`, `node`, summary). `placement` says where a target runs; `bucket_s` is the symptom
/// bucket (the onsets' tolerance).
pub fn group(
    targets: &mut [TargetDiagnosis],
    placement: &dyn Fn(&str) -> Placement,
    bucket_s: f64,
) -> Vec<NodeDiagnosis> {
    let places: Vec<Placement> = targets.iter().map(|t| placement(&t.target)).collect();
    let mut nodes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, p) in places.iter().enumerate() {
        nodes.entry(p.node()).or_default().push(i);
    }
    let mut found: Vec<(String, Cause, Vec<usize>)> = Vec::new();
    for (node, members) in &nodes {
        let n = members.len();
        if n < 2 {
            continue;
        }
        let need = ((MIN_SHARE * n as f64) - 1e-9).ceil().max(2.0) as usize;
        let mut best: Option<(Cause, Vec<usize>, f64)> = None;
        for cause in NODE_CAUSES {
            let mut cands: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&i| {
                    let t = &targets[i];
                    symptomatic(t) && score_of(t, cause) >= MIN_CAUSE_SCORE && shared(cause, t)
                })
                .collect();
            if is_gpu(cause) {
                let all = cands.clone();
                cands.retain(|&i| {
                    all.iter()
                        .any(|&j| j != i && share_gpu(&places[i], &places[j]))
                });
            }
            let onsets = cands
                .iter()
                .filter_map(|&i| Some((i, targets[i].onset_unix_s?)))
                .collect();
            let hit = densest(onsets, bucket_s);
            if hit.len() < need {
                continue;
            }
            let mean = hit
                .iter()
                .map(|&i| score_of(&targets[i], cause))
                .sum::<f64>()
                / hit.len() as f64;
            if best
                .as_ref()
                .is_none_or(|(_, b, m)| hit.len() > b.len() || (hit.len() == b.len() && mean > *m))
            {
                best = Some((cause, hit, mean));
            }
        }
        if let Some((cause, hit, _)) = best {
            found.push(((*node).to_owned(), cause, hit));
        }
    }
    found
        .into_iter()
        .map(|(node, cause, mut hit)| {
            hit.sort_by(|&a, &b| targets[a].target.cmp(&targets[b].target));
            let n = nodes.get(node.as_str()).map_or(0, Vec::len);
            diagnose(targets, node, cause, &hit, n)
        })
        .collect()
}

/// The node-level diagnosis of `cause` over the targets `hit` (indices), marking them.
fn diagnose(
    targets: &mut [TargetDiagnosis],
    node: String,
    cause: Cause,
    hit: &[usize],
    node_targets: usize,
) -> NodeDiagnosis {
    let score = hit
        .iter()
        .map(|&i| score_of(&targets[i], cause))
        .sum::<f64>()
        / hit.len() as f64;
    let score = (score * 1000.0).round() / 1000.0;
    let top = hit
        .iter()
        .copied()
        .max_by(|&a, &b| score_of(&targets[a], cause).total_cmp(&score_of(&targets[b], cause)));
    let evidence: Vec<Evidence> = top
        .and_then(|i| targets[i].causes.iter().find(|c| c.cause == cause))
        .map(|c| c.evidence.clone())
        .unwrap_or_default();
    let onset = hit
        .iter()
        .filter_map(|&i| targets[i].onset_unix_s)
        .reduce(f64::min);
    let state = if hit
        .iter()
        .any(|&i| targets[i].state == State::RootConfirmed)
    {
        State::RootConfirmed
    } else {
        State::Propagating
    };
    let names: Vec<String> = hit.iter().map(|&i| targets[i].target.clone()).collect();
    let mut summary = format!(
        "node {node}: {} {score:.2} on {} of {node_targets} targets ({})",
        cause.as_str(),
        hit.len(),
        names.join(", ")
    );
    if let Some(e) = evidence.first() {
        summary.push_str(&format!(
            ": {} {} → {}",
            e.signal.words(),
            fmt_value(e.signal, e.before),
            fmt_value(e.signal, e.peak.max(e.after))
        ));
        if let Some(at) = e.changed_at_unix_s {
            summary.push_str(&format!(" from {}", clock(at)));
        }
    }
    summary.push_str("; one node-wide fault, not an incident per target");
    for &i in hit {
        let t = &mut targets[i];
        t.scope = Scope::Node;
        t.node = Some(node.clone());
        let own = t.summary.take().unwrap_or_default();
        t.summary = Some(format!(
            "node-wide ({} on {} of {node_targets} targets of node {node}): {own}",
            cause.as_str(),
            hit.len()
        ));
    }
    NodeDiagnosis {
        node,
        scope: Scope::Node,
        state,
        cause,
        score,
        onset_unix_s: onset,
        targets: names,
        node_targets,
        evidence,
        summary,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::announce::{Announcement, Announcer};
    use crate::{Engine, EngineConfig};

    const T0: u64 = 1_700_000_000;
    const ONSET: u32 = 600;

    fn at(s: f64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs_f64(T0 as f64 + s)
    }

    /// How one target's world looks at a second.
    #[derive(Clone, Copy)]
    struct World {
        ttft: f64,
        tpot: f64,
        waiting: f64,
        queue_time: f64,
    }

    const CALM: World = World {
        ttft: 0.1,
        tpot: 0.02,
        waiting: 0.0,
        queue_time: 0.005,
    };

    /// 10 min calm, then `fault(target)` and the node PSI cpu `psi` from [`ONSET`] for 2 min,
    /// on `targets` (one node); every evaluation's announcements, and the last diagnosis.
    fn episode(
        targets: &[&str],
        fault: impl Fn(&str) -> World,
        psi: f64,
        place: impl Fn(&str) -> Placement,
    ) -> (Vec<(u32, Announcement)>, crate::Diagnosis) {
        let mut e = Engine::new(EngineConfig::default());
        for t in targets {
            e.place(t, place(t));
        }
        let mut announcer = Announcer::default();
        let mut said = Vec::new();
        let mut last = None;
        for s in 0..(ONSET + 120) {
            let faulty = s >= ONSET;
            for (k, t) in targets.iter().enumerate() {
                let w = if faulty { fault(t) } else { CALM };
                // A deterministic wobble of ±10 %, different per target.
                let wobble = 1.0 + 0.1 * (f64::from((s + k as u32 * 3) % 7) - 3.0) / 3.0;
                for half in [0.0, 0.5] {
                    let x = f64::from(s) + half;
                    e.observe(t, Signal::Ttft, at(x), w.ttft * wobble);
                    e.observe(t, Signal::Tpot, at(x), w.tpot * wobble);
                    e.observe(t, Signal::E2e, at(x), w.ttft * wobble + 15.0 * w.tpot);
                    e.observe(t, Signal::Error, at(x), 0.0);
                }
                let x = f64::from(s) + 0.25;
                e.observe(t, Signal::ServerRequestsWaiting, at(x), w.waiting);
                e.observe(t, Signal::ServerQueueTime, at(x), w.queue_time);
                e.observe(t, Signal::ServerRequestsRunning, at(x), 1.0);
                e.observe(t, Signal::ServerRequestRate, at(x), 2.0 * wobble);
                e.observe(
                    t,
                    Signal::NodeCpuPressure,
                    at(x),
                    if faulty { psi } else { 0.05 } * wobble,
                );
                e.observe(t, Signal::AgentCpu, at(x), 0.01);
            }
            let d = e.evaluate(at(f64::from(s) + 1.0));
            let neighbours = |t: &str| e.has_neighbours(t);
            for a in announcer.step(&d, &neighbours) {
                said.push((s, a));
            }
            last = Some(d);
        }
        (said, last.expect("evaluated"))
    }

    #[test]
    fn one_slowed_target_is_diagnosed_for_itself_only() {
        // Target a's own queue fills (its server slowed); b stays calm; the node is calm.
        let (said, d) = episode(
            &["a", "b"],
            |t| {
                if t == "a" {
                    World {
                        ttft: 0.6,
                        waiting: 8.0,
                        queue_time: 0.4,
                        ..CALM
                    }
                } else {
                    CALM
                }
            },
            0.05,
            |_| Placement::default(),
        );
        assert!(d.nodes.is_empty(), "{:#?}", d.nodes);
        assert_eq!(said.len(), 1, "{said:#?}");
        let Announcement::Target(t) = &said[0].1 else {
            panic!("{said:#?}")
        };
        assert_eq!((t.target.as_str(), t.scope), ("a", Scope::Target));
        assert_eq!(t.causes[0].cause, Cause::ServerQueueing, "{:#?}", t.causes);
        let b = d.targets.iter().find(|t| t.target == "b").expect("b");
        assert_eq!(b.state, State::Idle);
    }

    #[test]
    fn both_slowed_with_node_cpu_pressure_is_one_node_level_diagnosis() {
        // A CPU hog on the node: PSI cpu 5 % → 70 %, both targets' TTFT and TPOT up.
        let slowed = |_: &str| World {
            ttft: 0.35,
            tpot: 0.035,
            ..CALM
        };
        let (said, d) = episode(&["a", "b"], slowed, 0.7, |_| Placement::default());
        assert_eq!(said.len(), 1, "one incident: {said:#?}");
        let (when, Announcement::Node(n)) = &said[0] else {
            panic!("{said:#?}")
        };
        assert!(
            (ONSET..=ONSET + 60).contains(when),
            "said {} s after the onset",
            when - ONSET
        );
        assert_eq!(n.cause, Cause::NodeCpuPressure, "{n:#?}");
        assert_eq!((n.node.as_str(), n.scope), (LOCAL_NODE, Scope::Node));
        assert_eq!(n.targets, ["a", "b"]);
        assert_eq!((n.node_targets, n.state), (2, State::RootConfirmed));
        assert!(n.score >= 0.75, "{n:#?}");
        let psi = n
            .evidence
            .iter()
            .find(|e| e.signal == Signal::NodeCpuPressure)
            .expect("PSI evidence");
        assert!(psi.before < 0.1 && psi.after > 0.5, "{psi:?}");
        assert!(
            n.summary.starts_with("node local: node_cpu_pressure"),
            "{}",
            n.summary
        );
        // Each target links to it.
        assert_eq!(d.nodes.len(), 1);
        for t in &d.targets {
            assert_eq!(
                (t.scope, t.node.as_deref()),
                (Scope::Node, Some(LOCAL_NODE))
            );
            assert!(
                t.summary
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("node-wide (node_cpu_pressure"),
                "{:?}",
                t.summary
            );
        }
        let v = serde_json::to_value(&d).expect("json");
        assert_eq!(v["nodes"][0]["scope"], "node");
        assert_eq!(v["targets"][0]["scope"], "node");
        assert_eq!(v["targets"][1]["node"], "local");
        let text = crate::scorecard::text(&d);
        assert!(
            text.contains("node local  root_confirmed  node_cpu_pressure"),
            "{text}"
        );
    }

    #[test]
    fn a_gpu_fault_is_node_level_only_for_targets_that_share_the_gpu() {
        let mut a = TargetDiagnosis {
            target: "a".into(),
            state: State::RootConfirmed,
            since_unix_s: None,
            onset_unix_s: Some(100.0),
            symptom: None,
            causes: vec![crate::CauseScore {
                cause: Cause::GpuThrottling,
                score: 0.9,
                evidence: Vec::new(),
            }],
            ttft_decomposition: None,
            summary: None,
            baseline_wait: None,
            down: None,
            roots: Vec::new(),
            root_onsets_unix_s: Vec::new(),
            canaries_skipped_share: None,
            scope: Scope::Target,
            node: None,
            worker: None,
            pool: None,
            worker_pod: None,
            profile: None,
        };
        let mut b = a.clone();
        b.target = "b".into();
        b.onset_unix_s = Some(104.0);
        let gpus = |ids: &[&str]| Placement {
            node: Some("n1".into()),
            gpus: Some(ids.iter().map(|s| (*s).to_owned()).collect()),
        };
        // Their own GPUs: two incidents.
        let mut v = vec![a.clone(), b.clone()];
        let nodes = group(
            &mut v,
            &|t| {
                if t == "a" {
                    gpus(&["GPU-0"])
                } else {
                    gpus(&["GPU-1"])
                }
            },
            10.0,
        );
        assert!(nodes.is_empty());
        assert!(v.iter().all(|t| t.scope == Scope::Target));
        // One GPU shared: one node-level diagnosis.
        let mut v = vec![a.clone(), b.clone()];
        let nodes = group(&mut v, &|_| gpus(&["GPU-0"]), 10.0);
        assert_eq!(nodes.len(), 1);
        assert_eq!(
            (nodes[0].node.as_str(), nodes[0].cause),
            ("n1", Cause::GpuThrottling)
        );
        // Onsets 30 s apart: not one fault.
        b.onset_unix_s = Some(130.0);
        let mut v = vec![a.clone(), b];
        assert!(group(&mut v, &|_| gpus(&["GPU-0"]), 10.0).is_empty());
        // 1 of 3 targets: under 2/3.
        a.causes[0].cause = Cause::NodeCpuPressure;
        let mut c = a.clone();
        c.target = "c".into();
        c.state = State::Idle;
        let mut d = c.clone();
        d.target = "d".into();
        let mut v = vec![a.clone(), c.clone(), d];
        assert!(group(&mut v, &|_| Placement::default(), 10.0).is_empty());
        // 2 of 3: node-level.
        c.state = State::Propagating;
        let mut e = a.clone();
        e.target = "e".into();
        e.state = State::Idle;
        let mut v = vec![a, c, e];
        let nodes = group(&mut v, &|_| Placement::default(), 10.0);
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].targets, ["a", "c"]);
        assert_eq!(nodes[0].node_targets, 3);
    }
}
