//! Pod lifecycle as evidence: a container restart (its `restartCount` up) is a server change
//! of kind `restart` carrying the previous termination's reason and exit code; a pod replaced
//! by one of the same owner with another image or other arguments (or a container restarted
//! in place with a new image) is a change of kind `rollout`, old → new image. Pure: the caller
//! feeds each target pod's [`ContainerFacts`] as the watch reports it.

use std::collections::BTreeMap;

use super::pod::ContainerFacts;
use crate::server::{Change, ChangeKind};

/// Owners remembered at most (their last image); the oldest is forgotten beyond it.
pub const MAX_OWNERS: usize = 4096;

/// What the tracker remembers.
#[derive(Debug, Default)]
pub struct Lifecycle {
    /// Per pod uid: the facts last seen.
    pods: BTreeMap<String, ContainerFacts>,
    /// Per owner (`namespace/Kind/name`): the image and arguments of its newest pod, and when
    /// that was recorded (a sequence number, for eviction).
    owners: BTreeMap<String, (String, String, u64)>,
    seq: u64,
}

fn describe(f: &ContainerFacts) -> String {
    match (&f.last_reason, f.last_exit_code) {
        (Some(r), Some(c)) => format!("{r} (exit {c})"),
        (Some(r), None) => r.clone(),
        (None, Some(c)) => format!("exit {c}"),
        (None, None) => "unknown reason".to_owned(),
    }
}

fn rollout(old: (&str, &str), new: &ContainerFacts) -> Option<Change> {
    if old.0 != new.image {
        return Some(Change {
            kind: ChangeKind::Rollout,
            old: Some(old.0.to_owned()),
            new: Some(new.image.clone()),
        });
    }
    (old.1 != new.args).then(|| Change {
        kind: ChangeKind::Rollout,
        old: Some(format!("{} {}", old.0, old.1).trim().to_owned()),
        new: Some(format!("{} {}", new.image, new.args).trim().to_owned()),
    })
}

impl Lifecycle {
    /// The changes `facts` of pod `uid` (owned by `owner`, if known) show against what was seen
    /// before. The first sight of a pod gives none, except a `rollout` when its owner's
    /// previous pod ran another image or other arguments.
    pub fn observe(
        &mut self,
        uid: &str,
        owner: Option<&str>,
        facts: &ContainerFacts,
    ) -> Vec<Change> {
        let mut out = Vec::new();
        match self.pods.get(uid) {
            Some(prev) => {
                if let Some(c) = rollout((&prev.image, &prev.args), facts) {
                    out.push(c);
                } else if facts.restart_count > prev.restart_count {
                    out.push(Change {
                        kind: ChangeKind::Restart,
                        old: Some(format!("restarts {}", prev.restart_count)),
                        new: Some(format!(
                            "restarts {} after {}",
                            facts.restart_count,
                            describe(facts)
                        )),
                    });
                }
            }
            None => {
                if let Some(o) = owner
                    && let Some((image, args, _)) = self.owners.get(o)
                    && let Some(c) = rollout((image, args), facts)
                {
                    out.push(c);
                }
            }
        }
        let first_sight = !self.pods.contains_key(uid);
        self.pods.insert(uid.to_owned(), facts.clone());
        if let Some(o) = owner
            && (first_sight || !out.is_empty())
        {
            self.seq += 1;
            self.owners.insert(
                o.to_owned(),
                (facts.image.clone(), facts.args.clone(), self.seq),
            );
            if self.owners.len() > MAX_OWNERS
                && let Some(oldest) = self
                    .owners
                    .iter()
                    .min_by_key(|(_, v)| v.2)
                    .map(|(k, _)| k.clone())
            {
                self.owners.remove(&oldest);
            }
        }
        out
    }

    /// The pod is gone (its owner's image is kept, for its replacement).
    pub fn forget_pod(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    /// Pods remembered.
    pub fn pods(&self) -> usize {
        self.pods.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(image: &str, restarts: i32, reason: Option<(&str, i32)>) -> ContainerFacts {
        ContainerFacts {
            name: "server".into(),
            image: image.into(),
            args: "--model m".into(),
            restart_count: restarts,
            last_reason: reason.map(|r| r.0.to_owned()),
            last_exit_code: reason.map(|r| r.1),
        }
    }

    #[test]
    fn a_restart_is_one_change_with_the_reason() {
        let mut l = Lifecycle::default();
        let own = Some("llm/Deployment/vllm");
        assert!(l.observe("p1", own, &facts("v1", 0, None)).is_empty());
        assert!(l.observe("p1", own, &facts("v1", 0, None)).is_empty());
        let c = l.observe("p1", own, &facts("v1", 1, Some(("OOMKilled", 137))));
        assert_eq!(
            c,
            vec![Change {
                kind: ChangeKind::Restart,
                old: Some("restarts 0".into()),
                new: Some("restarts 1 after OOMKilled (exit 137)".into()),
            }]
        );
        // The same status again (a resync, a bookmark): nothing new.
        assert!(
            l.observe("p1", own, &facts("v1", 1, Some(("OOMKilled", 137))))
                .is_empty()
        );
    }

    #[test]
    fn a_replacement_with_a_new_image_is_one_rollout() {
        let mut l = Lifecycle::default();
        let own = Some("llm/Deployment/vllm");
        assert!(l.observe("a", own, &facts("vllm:0.9", 3, None)).is_empty());
        l.forget_pod("a");
        let c = l.observe("b", own, &facts("vllm:0.10", 0, None));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].kind, ChangeKind::Rollout);
        assert_eq!(c[0].old.as_deref(), Some("vllm:0.9"));
        assert_eq!(c[0].new.as_deref(), Some("vllm:0.10"));
        // A second new pod of the same rollout adds none; a pod of the same image neither.
        assert!(l.observe("c", own, &facts("vllm:0.10", 0, None)).is_empty());
        // Another owner's first pod is no rollout.
        assert!(
            l.observe("d", Some("llm/Deployment/other"), &facts("x", 0, None))
                .is_empty()
        );
    }

    #[test]
    fn new_arguments_are_a_rollout_too() {
        let mut l = Lifecycle::default();
        let own = Some("ns/StatefulSet/s");
        l.observe("a", own, &facts("img", 0, None));
        let mut f = facts("img", 0, None);
        f.args = "--model m --max-num-seqs 64".into();
        let c = l.observe("b", own, &f);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].new.as_deref(), Some("img --model m --max-num-seqs 64"));
    }
}
