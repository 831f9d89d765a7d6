//! `cargo xtask arch-check`: the architecture's invariants, checked from the source text alone
//! (no compilation, well under a second, so CI runs it first).
//!
//! 1. **No import cycles.** The module tree of `daemon/src` is walked from `lib.rs` along its
//!    `mod` declarations (`#[cfg(test)]` modules and everything under them left out). Every
//!    `crate::a::…` and `super::…` path in code (comments and string literals left out) is an
//!    edge from the module that writes it to the module it names; an edge counts at the level
//!    where the two paths part (`crate::bench::report` → `crate::bench::server` is the edge
//!    `report → server` among the children of `bench`). Any strongly connected component of
//!    more than one module, at any level, fails the check: each is listed with one file:line
//!    per edge, so it says what to move.
//! 2. **clap only in the CLI layer:** no path through `clap` in `daemon/src` outside
//!    [`CLI_LAYER`]; domain modules take plain structs that the CLI converts its flags into.
//! 3. **Pure crates stay pure.** Every crate under `daemon/crates/` must be listed in
//!    [`PURE_CRATES`] with the dependencies it may have; its `Cargo.toml` may name no other
//!    (in `[dependencies]`; `[dev-dependencies]` may add test-only crates, never an IO one),
//!    and its `src/` may not use [`FORBIDDEN_IN_PURE`] (IO, sockets, clocks, async runtimes).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The pure crates (directory under `daemon/crates/`) and the dependencies each may have.
/// `lmperf-*` path dependencies must themselves be pure crates listed here.
pub const PURE_CRATES: &[(&str, &[&str])] = &[
    ("fmt", &[]),
    ("measure", &["serde", "serde_json", "thiserror", "httpdate"]),
    ("server-page", &["serde", "serde_json", "thiserror"]),
    (
        "diagnosis",
        &[
            "serde",
            "serde_json",
            "thiserror",
            "lmperf-fmt",
            "lmperf-measure",
            "lmperf-server-page",
        ],
    ),
];

/// The files of `daemon/src` that may use clap: the binary and its command line.
pub const CLI_LAYER: &[&str] = &["main.rs", "cli.rs", "cli/"];

/// Crates that no pure crate may depend on, not even for its tests.
const FORBIDDEN_DEPS: &[&str] = &[
    "tokio",
    "tokio-util",
    "tokio-stream",
    "reqwest",
    "hyper",
    "hyper-util",
    "axum",
    "tonic",
    "tower",
    "aya",
    "nvml-wrapper",
    "opentelemetry",
    "opentelemetry_sdk",
    "opentelemetry-otlp",
    "clap",
    "notify",
];

/// Paths a pure crate's code may not name: IO, sockets, clocks and async runtimes. Matched
/// against the token stream, so a mention in a comment or a string does not count.
pub const FORBIDDEN_IN_PURE: &[&[&str]] = &[
    &["std", "::", "fs"],
    &["std", "::", "net"],
    &["std", "::", "process"],
    &["SystemTime", "::", "now"],
    &["Instant", "::", "now"],
    &["tokio"],
    &["reqwest"],
    &["hyper"],
];

pub fn run(args: &[String]) -> Result<()> {
    // `--root DIR`: check another checkout (e.g. `git archive main | tar -x -C DIR`).
    let root = match args {
        [] => crate::root(),
        [flag, dir] if flag == "--root" => PathBuf::from(dir),
        [a, ..] if a == "-h" || a == "--help" => {
            println!(
                "usage: cargo xtask arch-check [--root DIR]   (import cycles of daemon/src, clap in the CLI layer, pure crates)"
            );
            return Ok(());
        }
        [a, ..] => bail!("unexpected argument {a:?}"),
    };
    let started = std::time::Instant::now();
    let mut report = String::new();
    let mut failures = 0usize;

    let tree = ModuleTree::load(&root.join("daemon/src"))?;
    let graphs = tree.edges();
    let mut edge_count = 0usize;
    for (parent, edges) in &graphs {
        edge_count += edges.len();
        for scc in cycles(edges) {
            failures += 1;
            let level = if parent.is_empty() {
                "top-level modules of daemon/src".to_owned()
            } else {
                format!("children of `{}`", parent.join("::"))
            };
            let _ = writeln!(
                report,
                "cycle among {level} ({} modules): {}",
                scc.len(),
                scc.iter().cloned().collect::<Vec<_>>().join(" ")
            );
            for ((from, to), at) in edges {
                if scc.contains(from) && scc.contains(to) {
                    let _ = writeln!(report, "    {from} -> {to}   ({at})");
                }
            }
        }
    }
    println!(
        "arch-check: {} modules in {} files, {} import edges between siblings",
        tree.modules.len(),
        tree.files.len(),
        edge_count
    );
    if let Some(top) = graphs.get(&Vec::new()) {
        let mut out: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (from, to) in top.keys() {
            out.entry(from).or_default().insert(to);
        }
        println!("top-level import graph (module -> modules it imports):");
        for (from, tos) in out {
            println!(
                "    {from} -> {}",
                tos.into_iter().collect::<Vec<_>>().join(" ")
            );
        }
    }

    if let Some(top) = graphs.get(&Vec::new()) {
        failures += check_layers(top, &mut report);
    }
    failures += check_cli_layer(&root.join("daemon/src"), &tree, &mut report)?;
    failures += check_pure_crates(&root, &mut report)?;

    if failures > 0 {
        eprint!("{report}");
        bail!("arch-check: {failures} violation(s) (see above)");
    }
    println!(
        "arch-check: ok, no import cycle, load shared by bench and control (neither imports the other), clap only in the CLI layer, pure crates pure ({:.0} ms)",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tokens: just enough of Rust's lexer to tell code from comments, strings and char literals.

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
    Str(String),
}

struct Token {
    tok: Tok,
    line: usize,
}

fn tokenize(src: &str) -> Vec<Token> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    while i < b.len() {
        let c = b[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && b.get(i + 1) == Some(&'/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && b.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if (c == 'r' || c == 'b') && raw_string_start(&b, i).is_some() {
            let (hashes, body) = raw_string_start(&b, i).unwrap_or((0, i));
            let start_line = line;
            let mut j = body;
            let mut s = String::new();
            'raw: while j < b.len() {
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break 'raw;
                }
                if b[j] == '\n' {
                    line += 1;
                }
                s.push(b[j]);
                j += 1;
            }
            out.push(Token {
                tok: Tok::Str(s),
                line: start_line,
            });
            i = j;
        } else if c == '"' || (c == 'b' && b.get(i + 1) == Some(&'"')) {
            let start_line = line;
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            let mut s = String::new();
            while j < b.len() && b[j] != '"' {
                if b[j] == '\\' {
                    j += 1;
                }
                if j < b.len() {
                    if b[j] == '\n' {
                        line += 1;
                    }
                    s.push(b[j]);
                }
                j += 1;
            }
            out.push(Token {
                tok: Tok::Str(s),
                line: start_line,
            });
            i = j + 1;
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if b.get(i + 1) == Some(&'\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let mut j = i;
            while j < b.len() && (b[j].is_alphanumeric() || b[j] == '_') {
                j += 1;
            }
            let word: String = b[i..j].iter().collect();
            let word = word.strip_prefix("r#").unwrap_or(&word).to_owned();
            out.push(Token {
                tok: Tok::Ident(word),
                line,
            });
            i = j;
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '.') {
                if b[i] == '.' && b.get(i + 1) == Some(&'.') {
                    break;
                }
                i += 1;
            }
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push(Token {
                tok: Tok::PathSep,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        }
    }
    out
}

/// `r"…"`, `r#"…"#`, `br"…"`: the number of `#` and the index of the body's first char.
fn raw_string_start(b: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if b[j] == 'b' {
        j += 1;
    }
    if b.get(j) != Some(&'r') {
        return None;
    }
    // An identifier ending in r/br (e.g. `for`, `ptr`) is not a raw string.
    if i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (b.get(j) == Some(&'"')).then_some((hashes, j + 1))
}

fn is_ident(t: Option<&Token>, s: &str) -> bool {
    matches!(t, Some(Token { tok: Tok::Ident(w), .. }) if w == s)
}

fn is_punct(t: Option<&Token>, c: char) -> bool {
    matches!(t, Some(Token { tok: Tok::Punct(p), .. }) if *p == c)
}

/// The index just past the item starting at `i`: its `;` or its `{ … }` block, whichever
/// comes first at nesting depth 0.
fn skip_item(toks: &[Token], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < toks.len() {
        match &toks[i].tok {
            Tok::Punct('(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth -= 1,
            Tok::Punct(';') if depth == 0 => return i + 1,
            Tok::Punct('{') if depth == 0 => return matching_brace(toks, i) + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// The index of the `}` closing the `{` at `open`.
fn matching_brace(toks: &[Token], open: usize) -> usize {
    let mut depth = 0;
    for (k, t) in toks.iter().enumerate().skip(open) {
        match t.tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

/// Whether the attribute at `i` (`#[...]`) is `#[cfg(test)]`, and its end.
fn attribute(toks: &[Token], i: usize) -> Option<(usize, Attr)> {
    if !is_punct(toks.get(i), '#') {
        return None;
    }
    let mut j = i + 1;
    if is_punct(toks.get(j), '!') {
        j += 1;
    }
    if !is_punct(toks.get(j), '[') {
        return None;
    }
    let mut depth = 0;
    let start = j;
    while j < toks.len() {
        match toks[j].tok {
            Tok::Punct('[') => depth += 1,
            Tok::Punct(']') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            _ => {}
        }
        j += 1;
    }
    let inner = &toks[start + 1..j.min(toks.len())];
    let words: Vec<&Tok> = inner.iter().map(|t| &t.tok).collect();
    let attr = match words.as_slice() {
        [
            Tok::Ident(c),
            Tok::Punct('('),
            Tok::Ident(t),
            Tok::Punct(')'),
        ] if c == "cfg" && t == "test" => Attr::CfgTest,
        [Tok::Ident(p), Tok::Punct('='), Tok::Str(s)] if p == "path" => Attr::Path(s.clone()),
        _ => Attr::Other,
    };
    Some((j + 1, attr))
}

enum Attr {
    CfgTest,
    Path(String),
    Other,
}

// ---------------------------------------------------------------------------------------------
// The module tree and its edges.

struct SourceFile {
    path: PathBuf,
    /// The module this file is (`[]` for lib.rs).
    module: Vec<String>,
    /// Whether child `mod x;` files live in `dir/x.rs` (lib.rs, mod.rs) or `dir/<stem>/x.rs`.
    children_dir: PathBuf,
}

/// One path reference: the module that writes it, the path it names (absolute, from the
/// crate root), where.
struct Reference {
    from: Vec<String>,
    to: Vec<String>,
    at: String,
}

struct ModuleTree {
    files: Vec<SourceFile>,
    modules: BTreeSet<Vec<String>>,
    refs: Vec<Reference>,
}

impl ModuleTree {
    fn load(src: &Path) -> Result<Self> {
        let mut tree = ModuleTree {
            files: Vec::new(),
            modules: BTreeSet::new(),
            refs: Vec::new(),
        };
        tree.modules.insert(Vec::new());
        let mut queue = vec![SourceFile {
            path: src.join("lib.rs"),
            module: Vec::new(),
            children_dir: src.to_path_buf(),
        }];
        while let Some(file) = queue.pop() {
            let text = std::fs::read_to_string(&file.path)
                .with_context(|| format!("reading {}", file.path.display()))?;
            let toks = tokenize(&text);
            let rel = file
                .path
                .strip_prefix(src.parent().and_then(Path::parent).unwrap_or(src))
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
    fn scan(&mut self, file: &SourceFile, toks: &[Token], rel: &str, queue: &mut Vec<SourceFile>) {
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
                    let mut base = here.clone();
                    let mut j = i;
                    while is_ident(toks.get(j), "super")
                        && matches!(toks.get(j + 1).map(|t| &t.tok), Some(Tok::PathSep))
                    {
                        base.pop();
                        j += 2;
                    }
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
    fn resolve(&self, path: &[String]) -> Vec<String> {
        (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| self.modules.contains(p))
            .unwrap_or_default()
    }

    /// Per parent module, the edges among its children: `(from, to) -> first file:line`.
    fn edges(&self) -> BTreeMap<Vec<String>, BTreeMap<(String, String), String>> {
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

/// The paths named from `i` on, after a `crate::` or `super::` whose module is `base`:
/// `a::b::C` gives `base/a/b/C`; a group `{a::X, b}` gives one path per member.
fn path_targets(toks: &[Token], i: usize, base: Vec<String>) -> Vec<Vec<String>> {
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

/// The strongly connected components of more than one node (Tarjan), each sorted.
fn cycles(edges: &BTreeMap<(String, String), String>) -> Vec<BTreeSet<String>> {
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

// ---------------------------------------------------------------------------------------------
// clap in the CLI layer only.

/// Top-level imports forbidden beyond the acyclic rule, `(from, to, why)`: the load layer
/// (`load`) is shared by `lmperf run` (`bench`) and `lmperf ctl inject` (`control`), which
/// must not reach into each other, and it imports neither.
const FORBIDDEN_EDGES: &[(&str, &str, &str)] = &[
    (
        "control",
        "bench",
        "the agent must not depend on the benchmark (shared: `load`)",
    ),
    (
        "bench",
        "control",
        "the benchmark must not depend on the agent (shared: `load`)",
    ),
    ("load", "bench", "`load` sits below `bench`"),
    ("load", "control", "`load` sits below `control`"),
];

/// Counts (and reports) the top-level edges in [`FORBIDDEN_EDGES`].
fn check_layers(top: &BTreeMap<(String, String), String>, report: &mut String) -> usize {
    let mut failures = 0;
    for (from, to, why) in FORBIDDEN_EDGES {
        if let Some(at) = top.get(&((*from).to_owned(), (*to).to_owned())) {
            failures += 1;
            let _ = writeln!(report, "forbidden import {from} -> {to} ({at}): {why}");
        }
    }
    failures
}

fn check_cli_layer(src: &Path, tree: &ModuleTree, report: &mut String) -> Result<usize> {
    let mut failures = 0;
    for file in &tree.files {
        let rel = file.path.strip_prefix(src).unwrap_or(&file.path);
        let rel_s = rel.to_string_lossy();
        if CLI_LAYER
            .iter()
            .any(|c| rel_s == *c || (c.ends_with('/') && rel_s.starts_with(c)))
        {
            continue;
        }
        let text = std::fs::read_to_string(&file.path)?;
        for t in without_tests(tokenize(&text)) {
            if t.tok == Tok::Ident("clap".to_owned()) {
                failures += 1;
                let _ = writeln!(
                    report,
                    "daemon/src/{rel_s}:{}: clap outside the CLI layer ({}): take a plain struct, let the CLI convert",
                    t.line,
                    CLI_LAYER.join(", ")
                );
                break;
            }
        }
    }
    Ok(failures)
}

// ---------------------------------------------------------------------------------------------
// Pure crates.

fn check_pure_crates(root: &Path, report: &mut String) -> Result<usize> {
    let dir = root.join("daemon/crates");
    let mut failures = 0;
    let mut found = BTreeSet::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            if e.path().join("Cargo.toml").exists() {
                found.insert(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    let declared: BTreeSet<String> = PURE_CRATES.iter().map(|(d, _)| (*d).to_owned()).collect();
    for missing in declared.difference(&found) {
        failures += 1;
        let _ = writeln!(
            report,
            "pure crate daemon/crates/{missing} is missing (declared in xtask/src/arch_check.rs)"
        );
    }
    for extra in found.difference(&declared) {
        failures += 1;
        let _ = writeln!(
            report,
            "daemon/crates/{extra} is not declared in PURE_CRATES (xtask/src/arch_check.rs): list its allowed dependencies"
        );
    }
    let pure_names: BTreeSet<String> = found.iter().map(|d| format!("lmperf-{d}")).collect();
    for (name, allowed) in PURE_CRATES {
        let crate_dir = dir.join(name);
        let Ok(manifest) = std::fs::read_to_string(crate_dir.join("Cargo.toml")) else {
            continue;
        };
        for (section, dep) in manifest_deps(&manifest) {
            let bad = if FORBIDDEN_DEPS.contains(&dep.as_str()) {
                true
            } else if section == "dependencies" {
                !(allowed.contains(&dep.as_str()) || pure_names.contains(&dep))
                    || (dep.starts_with("lmperf") && !allowed.contains(&dep.as_str()))
            } else {
                false
            };
            if bad {
                failures += 1;
                let _ = writeln!(
                    report,
                    "daemon/crates/{name}/Cargo.toml: [{section}] {dep} is not allowed (allowed: {})",
                    if allowed.is_empty() {
                        "none".to_owned()
                    } else {
                        allowed.join(", ")
                    }
                );
            }
        }
        // The crate's compiled code: its module tree from lib.rs, `#[cfg(test)]` modules and
        // items left out (a test may read its fixture files).
        let tree = ModuleTree::load(&crate_dir.join("src"))?;
        for file in &tree.files {
            let f = &file.path;
            let text = std::fs::read_to_string(f)?;
            let toks = without_tests(tokenize(&text));
            for (k, t) in toks.iter().enumerate() {
                for pat in FORBIDDEN_IN_PURE {
                    let hit = pat.iter().enumerate().all(|(o, p)| {
                        toks.get(k + o).is_some_and(|x| match &x.tok {
                            Tok::Ident(w) => w == p,
                            Tok::PathSep => *p == "::",
                            _ => false,
                        })
                    });
                    if hit {
                        failures += 1;
                        let _ = writeln!(
                            report,
                            "{}:{}: `{}` in a pure crate",
                            f.strip_prefix(root).unwrap_or(f).display(),
                            t.line,
                            pat.concat()
                        );
                    }
                }
            }
        }
    }
    Ok(failures)
}

/// `toks` without its `#[cfg(test)]` items.
fn without_tests(toks: Vec<Token>) -> Vec<Token> {
    let mut keep = vec![true; toks.len()];
    let mut i = 0;
    while i < toks.len() {
        match attribute(&toks, i) {
            Some((end, Attr::CfgTest)) => {
                let mut j = end;
                while let Some((e, _)) = attribute(&toks, j) {
                    j = e;
                }
                let stop = skip_item(&toks, j);
                keep[i..stop.min(toks.len())].fill(false);
                i = stop;
            }
            Some((end, _)) => i = end,
            None => i += 1,
        }
    }
    toks.into_iter()
        .zip(keep)
        .filter_map(|(t, k)| k.then_some(t))
        .collect()
}

/// `(section, dependency name)` of every dependency in a Cargo.toml (the `[dependencies]`,
/// `[dev-dependencies]`, `[build-dependencies]` tables and their `[x.dependencies.name]` forms).
fn manifest_deps(manifest: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in manifest.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(h) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = h.trim().to_owned();
            if let Some((s, dep)) = section.clone().rsplit_once('.')
                && s.ends_with("dependencies")
            {
                out.push((s.rsplit('.').next().unwrap_or(s).to_owned(), dep.to_owned()));
            }
            continue;
        }
        if section.ends_with("dependencies")
            && !section.contains('.')
            && let Some((dep, _)) = line.split_once('=')
        {
            let dep = dep.trim().split('.').next().unwrap_or("").trim();
            if !dep.is_empty() {
                out.push((section.clone(), dep.to_owned()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(src: &str, module: &[&str]) -> Vec<Vec<String>> {
        let mut tree = ModuleTree {
            files: Vec::new(),
            modules: BTreeSet::new(),
            refs: Vec::new(),
        };
        let file = SourceFile {
            path: PathBuf::from("/nonexistent/x.rs"),
            module: module.iter().map(|s| (*s).to_owned()).collect(),
            children_dir: PathBuf::from("/nonexistent/x"),
        };
        tree.scan(&file, &tokenize(src), "x.rs", &mut Vec::new());
        tree.refs.into_iter().map(|r| r.to).collect()
    }

    fn p(s: &str) -> Vec<String> {
        s.split('/')
            .filter(|x| !x.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn paths_groups_super_comments_strings_and_tests() {
        let src = r##"
            use crate::{a::X, b::{c, d::Y}, e};
            // use crate::commented;
            /* use crate::block; /* nested */ */
            const S: &str = "crate::in_string";
            const R: &str = r#"crate::raw"#;
            fn f<'a>(x: &'a str) -> char { let _ = super::sib::f(); 'c' }
            pub(crate) fn g() { crate::h::call(); }
            #[cfg(test)]
            mod tests { use crate::test_only::Z; }
            #[cfg(test)]
            use crate::test_use;
        "##;
        assert_eq!(
            refs(src, &["top", "file"]),
            vec![
                p("a/X"),
                p("b/c"),
                p("b/d/Y"),
                p("e"),
                p("top/sib/f"),
                p("h/call")
            ]
        );
    }

    #[test]
    fn test_items_are_left_out_of_the_pure_scan() {
        let src = "fn a() {}\n#[cfg(test)]\nmod tests { use std::fs; }\n#[cfg(test)]\n#[allow(x)]\nfn t() { std::fs::read(\"x\"); }\nfn b() { std::net::X; }";
        let words: Vec<String> = without_tests(tokenize(src))
            .into_iter()
            .filter_map(|t| match t.tok {
                Tok::Ident(w) => Some(w),
                _ => None,
            })
            .collect();
        assert_eq!(words, ["fn", "a", "fn", "b", "std", "net", "X"]);
    }

    #[test]
    fn tarjan_finds_each_cycle() {
        let mut e = BTreeMap::new();
        for (a, b) in [
            ("a", "b"),
            ("b", "a"),
            ("c", "d"),
            ("d", "e"),
            ("e", "c"),
            ("e", "f"),
        ] {
            e.insert((a.to_owned(), b.to_owned()), String::new());
        }
        let c = cycles(&e);
        assert_eq!(c.len(), 2);
        assert!(c.iter().any(|s| s.len() == 2 && s.contains("a")));
        assert!(c.iter().any(|s| s.len() == 3 && s.contains("e")));
    }

    #[test]
    fn manifest_sections() {
        let m = "[package]\nname = \"x\"\n[dependencies]\nserde = { workspace = true }\nthiserror.workspace = true\n[dev-dependencies]\nproptest = \"1\"\n[target.'cfg(unix)'.dependencies.tokio]\nversion = \"1\"\n";
        let d = manifest_deps(m);
        assert!(d.contains(&("dependencies".into(), "serde".into())));
        assert!(d.contains(&("dependencies".into(), "thiserror".into())));
        assert!(d.contains(&("dev-dependencies".into(), "proptest".into())));
        assert!(d.iter().any(|(_, n)| n == "tokio"));
    }
}
