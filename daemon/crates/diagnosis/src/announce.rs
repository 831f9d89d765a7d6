//! What the agent says once per incident (the WARN line, the `lmperf.diagnosis` span, the
//! confirmed counter): a node-level diagnosis once for the node, a target's own once for the
//! target, never both for one fault (issue 28, item 4).
//!
//! A target confirmed with a cause its node's targets can share ([`NODE_CAUSES`]) while it has
//! neighbours is held up to [`NODE_HOLD_S`]: the neighbours' symptoms are detected a bucket or
//! two later, and once they are the fault is said once, for the node. Pure: the caller passes
//! each evaluation.

use std::collections::{BTreeMap, BTreeSet};

use super::node_scope::NODE_CAUSES;
use super::report::{Cause, Diagnosis, NodeDiagnosis, Scope, State, TargetDiagnosis};

/// How long a target's confirmation of a node-shared cause waits for its neighbours, s (two
/// symptom buckets).
pub const NODE_HOLD_S: f64 = 20.0;

/// One thing to say.
#[derive(Debug, Clone, PartialEq)]
pub enum Announcement {
    /// A target's own root cause.
    Target(Box<TargetDiagnosis>),
    /// One node-level fault over several targets.
    Node(NodeDiagnosis),
}

impl Announcement {
    /// The target diagnosis, for a target's announcement.
    pub fn into_target(self) -> Option<TargetDiagnosis> {
        match self {
            Announcement::Target(t) => Some(*t),
            Announcement::Node(_) => None,
        }
    }
}

/// The announcements' memory between evaluations.
#[derive(Debug, Clone, Default)]
pub struct Announcer {
    /// Targets whose confirmation was said (alone or in their node's).
    said: BTreeSet<String>,
    /// Node diagnoses said, (node, cause), with their member targets.
    said_nodes: BTreeMap<(String, Cause), Vec<String>>,
    /// Targets held until this Unix second.
    held: BTreeMap<String, f64>,
}

impl Announcer {
    /// What to say after the evaluation `d`. `has_neighbours(target)`: whether other targets
    /// share its node.
    pub fn step(
        &mut self,
        d: &Diagnosis,
        has_neighbours: &dyn Fn(&str) -> bool,
    ) -> Vec<Announcement> {
        let now = d.evaluated_at_unix_s;
        let confirmed = |name: &str| {
            d.targets
                .iter()
                .any(|t| t.target == name && t.state == State::RootConfirmed)
        };
        self.said
            .retain(|name| d.targets.iter().any(|t| &t.target == name));
        self.held
            .retain(|name, _| d.targets.iter().any(|t| &t.target == name));
        // A node's fault stays said while one of its targets is still confirmed.
        self.said_nodes
            .retain(|_, members| members.iter().any(|m| confirmed(m)));
        let mut out = Vec::new();
        for n in d.nodes.iter().filter(|n| n.state == State::RootConfirmed) {
            let key = (n.node.clone(), n.cause);
            if self.said_nodes.contains_key(&key) {
                continue;
            }
            self.said_nodes.insert(key, n.targets.clone());
            for t in &n.targets {
                self.said.insert(t.clone());
                self.held.remove(t);
            }
            out.push(Announcement::Node(n.clone()));
        }
        for t in &d.targets {
            if t.state != State::RootConfirmed {
                self.said.remove(&t.target);
                self.held.remove(&t.target);
                continue;
            }
            if self.said.contains(&t.target) {
                continue;
            }
            if t.scope == Scope::Node {
                self.said.insert(t.target.clone());
                continue;
            }
            let shareable = t
                .causes
                .first()
                .is_some_and(|c| NODE_CAUSES.contains(&c.cause));
            if shareable && has_neighbours(&t.target) {
                let until = *self
                    .held
                    .entry(t.target.clone())
                    .or_insert(now + NODE_HOLD_S);
                if now < until {
                    continue;
                }
            }
            self.held.remove(&t.target);
            self.said.insert(t.target.clone());
            out.push(Announcement::Target(Box::new(t.clone())));
        }
        out
    }
}
