//! The module tree of one crate (walked from its root file along `mod` declarations) and the
//! path references between its modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::tokens::{
    Attr, Tok, Token, attribute, is_ident, is_punct, matching_brace, skip_item, tokenize,
};

pub(super) struct SourceFile {
    pub(super) path: PathBuf,
    /// The module this file is (`[]` for lib.rs).
    pub(super) module: Vec<String>,
    /// Whether child `mod x;` files live in `dir/x.rs` (lib.rs, mod.rs) or `dir/<stem>/x.rs`.
    pub(super) children_dir: PathBuf,
}

/// One path reference: the module that writes it, the path it names (absolute, from the
/// crate root), where.
pub(super) struct Reference {
    pub(super) from: Vec<String>,
    pub(super) to: Vec<String>,
    pub(super) at: String,
}

pub(super) struct ModuleTree {
    pub(super) files: Vec<SourceFile>,
    pub(super) modules: BTreeSet<Vec<String>>,
    pub(super) refs: Vec<Reference>,
}

impl ModuleTree {
    /// The tree of the crate whose `lib.rs` is in `src` (see [`ModuleTree::load_from`]).
    pub(super) fn load(src: &Path) -> Result<Self> {
        let repo = src.parent().and_then(Path::parent).unwrap_or(src);
        Self::load_from(&src.join("lib.rs"), repo)
    }

    /// The tree of the crate whose root file (`lib.rs`, `main.rs`) is `root_file`; file:line
    /// references are written relative to `shown_from`.
    pub(super) fn load_from(root_file: &Path, shown_from: &Path) -> Result<Self> {
        let src = root_file.parent().unwrap_or(root_file);
        let mut tree = ModuleTree {
            files: Vec::new(),
            modules: BTreeSet::new(),
            refs: Vec::new(),
        };
        tree.modules.insert(Vec::new());
        let mut queue = vec![SourceFile {
            path: root_file.to_path_buf(),
            module: Vec::new(),
            children_dir: src.to_path_buf(),
        }];
        while let Some(file) = queue.pop() {
            let text = std::fs::read_to_string(&file.path)
                .with_context(|| format!("reading {}", file.path.display()))?;
            let toks = tokenize(&text);
            let rel = file
                .path
                .strip_prefix(shown_from)
                .unwrap_or(&file.path)
                .display()
                .to_string();
            tree.scan(&file, &toks, &rel, &mut queue);
            tree.modules.insert(file.module.clone());
            tree.files.push(file);
        }
        Ok(tree)
    }

    /// Walks one file's tokens: child modules (files queued, inline ones tracked), and path
    /// references, `#[cfg(test)]` items skipped.
    pub(super) fn scan(
        &mut self,
        file: &SourceFile,
        toks: &[Token],
        rel: &str,
        queue: &mut Vec<SourceFile>,
    ) {
        // Inline modules open at the given brace depth.
        let mut inline: Vec<(String, i32)> = Vec::new();
        let mut depth = 0i32;
        let mut pending_path: Option<String> = None;
        let mut i = 0;
        while i < toks.len() {
            if let Some((end, attr)) = attribute(toks, i) {
                match attr {
                    Attr::CfgTest => {
                        // Skip the attributes that follow, then the item.
                        let mut j = end;
                        while let Some((e, _)) = attribute(toks, j) {
                            j = e;
                        }
                        i = skip_item(toks, j);
                        pending_path = None;
                        continue;
                    }
                    Attr::Path(p) => pending_path = Some(p),
                    Attr::Other => {}
                }
                i = end;
                continue;
            }
            let here: Vec<String> = file
                .module
                .iter()
                .cloned()
                .chain(inline.iter().map(|(m, _)| m.clone()))
                .collect();
            match &toks[i].tok {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                }
                Tok::Ident(w) if w == "mod" => {
                    if let (
                        Some(Token {
                            tok: Tok::Ident(name),
                            ..
                        }),
                        next,
                    ) = (toks.get(i + 1), toks.get(i + 2))
                    {
                        if is_punct(next, ';') {
                            let mut module = here.clone();
                            module.push(name.clone());
                            let dir = self.dir_of(file, &inline);
                            let path = match pending_path.take() {
                                Some(p) => file
                                    .path
                                    .parent()
                                    .map(|d| d.join(&p))
                                    .unwrap_or_else(|| PathBuf::from(&p)),
                                None => {
                                    let flat = dir.join(format!("{name}.rs"));
                                    if flat.exists() {
                                        flat
                                    } else {
                                        dir.join(name).join("mod.rs")
                                    }
                                }
                            };
                            queue.push(SourceFile {
                                children_dir: dir.join(name),
                                path,
                                module,
                            });
                            i += 3;
                            continue;
                        } else if is_punct(next, '{') {
                            inline.push((name.clone(), depth));
                            depth += 1;
                            let mut module = here.clone();
                            module.push(name.clone());
                            self.modules.insert(module);
                            i += 3;
                            continue;
                        }
                    }
                }
                Tok::Ident(w)
                    if w == "crate"
                        && matches!(toks.get(i + 1).map(|t| &t.tok), Some(Tok::PathSep)) =>
                {
                    // `$crate::` in a macro is this crate too; `pub(crate)` has no `::`.
                    let line = toks[i].line;
                    for to in path_targets(toks, i + 2, Vec::new()) {
                        self.refs.push(Reference {
                            from: here.clone(),
                            to,
                            at: format!("{rel}:{line}"),
                        });
                    }
                }
                Tok::Ident(w) if w == "super" && !is_punct(toks.get(i.wrapping_sub(1)), '(') => {
                    let line = toks[i].line;
                    let (base, j) = after_supers(toks, i, &here);
                    if j > i {
                        for to in path_targets(toks, j, base) {
                            self.refs.push(Reference {
                                from: here.clone(),
                                to,
                                at: format!("{rel}:{line}"),
                            });
                        }
                        i = j;
                        continue;
                    }
                }
                _ => {}
            }
            pending_path = None;
            i += 1;
        }
    }

    fn dir_of(&self, file: &SourceFile, inline: &[(String, i32)]) -> PathBuf {
        let mut dir = file.children_dir.clone();
        for (m, _) in inline {
            dir = dir.join(m);
        }
        dir
    }

    /// The module a path names: its longest prefix that is a known module.
    pub(super) fn resolve(&self, path: &[String]) -> Vec<String> {
        (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| self.modules.contains(p))
            .unwrap_or_default()
    }

    /// Per parent module, the edges among its children: `(from, to) -> first file:line`.
    pub(super) fn edges(&self) -> BTreeMap<Vec<String>, BTreeMap<(String, String), String>> {
        let mut graphs: BTreeMap<Vec<String>, BTreeMap<(String, String), String>> = BTreeMap::new();
        for r in &self.refs {
            let to = self.resolve(&r.to);
            let common = r.from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if let (Some(a), Some(b)) = (r.from.get(common), to.get(common)) {
                graphs
                    .entry(r.from[..common].to_vec())
                    .or_default()
                    .entry((a.clone(), b.clone()))
                    .or_insert_with(|| r.at.clone());
            }
        }
        graphs
    }
}

/// The module that the `super::super::…` starting at `i` names from `module`, and the index of
/// the token after the last `super::`.
pub(super) fn after_supers(toks: &[Token], i: usize, module: &[String]) -> (Vec<String>, usize) {
    let mut base = module.to_vec();
    let mut j = i;
    while is_ident(toks.get(j), "super")
        && matches!(toks.get(j + 1).map(|t| &t.tok), Some(Tok::PathSep))
    {
        base.pop();
        j += 2;
    }
    (base, j)
}

/// The paths named from `i` on, after a `crate::` or `super::` whose module is `base`:
/// `a::b::C` gives `base/a/b/C`; a group `{a::X, b}` gives one path per member.
pub(super) fn path_targets(toks: &[Token], i: usize, base: Vec<String>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut path = base;
    let mut j = i;
    loop {
        match toks.get(j).map(|t| &t.tok) {
            Some(Tok::Ident(w)) => {
                if w != "self" {
                    path.push(w.clone());
                }
                if matches!(toks.get(j + 1).map(|t| &t.tok), Some(Tok::PathSep)) {
                    j += 2;
                    continue;
                }
                out.push(path);
                return out;
            }
            Some(Tok::Punct('{')) => {
                // Each member of the group starts after `{` or a `,` at this group's depth.
                let close = matching_brace(toks, j);
                let mut k = j + 1;
                while k < close {
                    out.extend(path_targets(toks, k, path.clone()));
                    // Move to the next member at depth 0 of this group.
                    let mut depth = 0;
                    while k < close {
                        match toks[k].tok {
                            Tok::Punct('{') => depth += 1,
                            Tok::Punct('}') => depth -= 1,
                            Tok::Punct(',') if depth == 0 => break,
                            _ => {}
                        }
                        k += 1;
                    }
                    k += 1;
                }
                return out;
            }
            _ => {
                // `super::*` and the like: the module itself.
                out.push(path);
                return out;
            }
        }
    }
}
