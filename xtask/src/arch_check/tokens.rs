//! Just enough of Rust's lexer to tell code from comments, strings and char literals, and
//! to find attributes, items and `#[cfg(test)]` code.

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
    Str(String),
}

pub(super) struct Token {
    pub(super) tok: Tok,
    /// 1-based.
    pub(super) line: usize,
}

pub(super) fn tokenize(src: &str) -> Vec<Token> {
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

pub(super) fn is_ident(t: Option<&Token>, s: &str) -> bool {
    matches!(t, Some(Token { tok: Tok::Ident(w), .. }) if w == s)
}

pub(super) fn is_punct(t: Option<&Token>, c: char) -> bool {
    matches!(t, Some(Token { tok: Tok::Punct(p), .. }) if *p == c)
}

/// The index just past the item starting at `i`: its `;` or its `{ … }` block, whichever
/// comes first at nesting depth 0.
pub(super) fn skip_item(toks: &[Token], mut i: usize) -> usize {
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
pub(super) fn matching_brace(toks: &[Token], open: usize) -> usize {
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
pub(super) fn attribute(toks: &[Token], i: usize) -> Option<(usize, Attr)> {
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

pub(super) enum Attr {
    CfgTest,
    Path(String),
    Other,
}

/// `toks` without its `#[cfg(test)]` items.
pub(super) fn without_tests(toks: Vec<Token>) -> Vec<Token> {
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
