//! Import cycles: the strongly connected components of each level's sibling graph.

use std::collections::{BTreeMap, BTreeSet};

/// The strongly connected components of more than one node (Tarjan), each sorted.
pub(super) fn cycles(edges: &BTreeMap<(String, String), String>) -> Vec<BTreeSet<String>> {
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        adj.entry(a).or_default().push(b);
        adj.entry(b).or_default();
    }
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(v: &'a str, adj: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in adj.get(v).map(Vec::as_slice).unwrap_or(&[]) {
            if !s.index.contains_key(w) {
                visit(w, adj, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).map(|l| {
                    *l = (*l).min(lw);
                    *l
                });
                let _ = lv;
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                if let Some(l) = s.low.get_mut(v) {
                    *l = (*l).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.insert(w.to_owned());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for &v in adj.keys() {
        if !s.index.contains_key(v) {
            visit(v, &adj, &mut s);
        }
    }
    s.out
}
