//! The shared parts' tests: the lexer, the module scan, Tarjan, Cargo.toml sections.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::cycles::cycles;
use super::modules::{ModuleTree, SourceFile};
use super::pure::manifest_deps;
use super::tokens::{Tok, tokenize, without_tests};

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
