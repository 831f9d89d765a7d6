//! Shared-prefix workloads (`--prefix-len N --prefix-groups G [--prompts-per-group P]`, as
//! SGLang's `generated-shared-prefix` dataset and GuideLLM's `prefix_tokens`/`prefix_count`):
//! G system prompts of exactly N tokens, each followed by the unique suffixes of its group's
//! requests. Requests are sent group by group (the P requests of group 0, then group 1, …,
//! cycled after G × P), so a server with a prefix cache reuses each group's prefix from the
//! group's second request on: the first request of a group pays for the prefix, the later
//! ones should not. Pure: which group and place item `i` has, and what the workload should
//! make the server take from its cache.

use serde::Serialize;

/// The flags of a shared-prefix workload, validated (`summary.json` `workload.shared_prefix`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SharedPrefix {
    /// Tokens of each group's shared prefix (with the tokenizer, as prompts are counted).
    pub len: u32,
    /// Number of distinct prefixes.
    pub groups: u32,
    /// Requests per group before the next group; `None`: `--num-prompts` spread evenly
    /// ([`SharedPrefix::per_group`]).
    pub prompts_per_group: Option<u32>,
}

/// Where one request falls in the shared-prefix workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Its group (0-based).
    pub group: u32,
    /// Whether it is the first of its group: the server has not seen the prefix before.
    pub first: bool,
}

impl SharedPrefix {
    /// Validates the flags; errors name the flag and value.
    pub fn new(len: u32, groups: u32, prompts_per_group: Option<u32>) -> Result<Self, String> {
        if len == 0 {
            return Err("--prefix-len 0: at least 1 token".into());
        }
        if groups == 0 {
            return Err("--prefix-groups 0: at least 1 group".into());
        }
        if prompts_per_group == Some(0) {
            return Err("--prompts-per-group 0: at least 1 request per group".into());
        }
        Ok(Self {
            len,
            groups,
            prompts_per_group,
        })
    }

    /// Requests per group for a benchmark of `num_prompts` measured requests: the flag, else
    /// `ceil(num_prompts / groups)` (at least 1).
    pub fn per_group(&self, num_prompts: usize) -> usize {
        self.prompts_per_group.map_or_else(
            || num_prompts.div_ceil(self.groups as usize).max(1),
            |p| p as usize,
        )
    }

    /// The place of request `i` (0-based, warm-up requests first) with `per_group` requests
    /// per group: group `(i / per_group) mod groups`; first when `i` starts its group's run
    /// in the first pass over the groups.
    pub fn place(&self, i: usize, per_group: usize) -> Place {
        let per_group = per_group.max(1);
        let group = ((i / per_group) % self.groups as usize) as u32;
        Place {
            group,
            first: i.is_multiple_of(per_group) && i < per_group * self.groups as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_by_group_first_only_in_the_first_pass() {
        let p = SharedPrefix::new(100, 3, None).unwrap();
        assert_eq!(p.per_group(10), 4);
        let places: Vec<(u32, bool)> = (0..14)
            .map(|i| p.place(i, 4))
            .map(|pl| (pl.group, pl.first))
            .collect();
        assert_eq!(
            places,
            [
                (0, true),
                (0, false),
                (0, false),
                (0, false),
                (1, true),
                (1, false),
                (1, false),
                (1, false),
                (2, true),
                (2, false),
                (2, false),
                (2, false),
                (0, false),
                (0, false),
            ]
        );
        assert_eq!(
            SharedPrefix::new(100, 4, Some(2)).unwrap().per_group(100),
            2
        );
        assert!(
            SharedPrefix::new(0, 1, None)
                .unwrap_err()
                .contains("--prefix-len")
        );
        assert!(
            SharedPrefix::new(5, 0, None)
                .unwrap_err()
                .contains("--prefix-groups")
        );
        assert!(
            SharedPrefix::new(5, 1, Some(0))
                .unwrap_err()
                .contains("--prompts-per-group")
        );
    }
}
