//! Prompt files for `lmperf run --prompt-file`: JSONL with a `prompt` (or `text`) field per
//! line, or CSV with a `prompt` column (RFC 4180 quoting, CRLF or LF, e.g.
//! `awesome-chatgpt-prompts`' `prompts.csv`); and MT-Bench style multi-turn files (JSONL with a
//! `turns` array of user messages, FastChat's `question.jsonl`) for `--multi-turn`.

use std::path::Path;

/// One conversation of a prompt file: its user turns, in order (one for a plain prompt).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Conversation {
    pub turns: Vec<String>,
    /// `max_tokens` of its requests, from the row (`--dataset jsonl` `output_len`); `None`:
    /// the run's `--output-len` / `--output-dist`.
    pub output_len: Option<u32>,
    /// Image URLs (`http(s):` or `data:`) sent with the first turn as `image_url` parts
    /// (`--dataset jsonl` `images`; chat only).
    pub images: Vec<String>,
    /// The row's own chat messages (`--dataset jsonl` `messages`), sent as they are in one
    /// request (`turns` then holds their text joined, for `--api completions`).
    pub messages: Option<Vec<serde_json::Value>>,
}

/// The prompts of a file.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSet {
    /// File name (no directory), as the summary names it.
    pub name: String,
    pub conversations: Vec<Conversation>,
}

/// A prompt file that cannot be used; the message names the file, line and field.
#[derive(Debug, thiserror::Error)]
#[error("{path}{}: {reason}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct DatasetError {
    pub path: String,
    pub line: Option<usize>,
    pub reason: String,
}

/// One CSV record: its 1-based first line and its fields.
pub type CsvRecord = (usize, Vec<String>);

/// Splits CSV text into records of fields: RFC 4180 (fields in double quotes may hold commas,
/// line breaks and `""` for a quote), CRLF or LF line ends, a UTF-8 BOM and a missing final
/// line end tolerated, empty lines skipped. Returns each record with its 1-based first line.
///
/// # Errors
/// A quoted field still open at the end of the text (its line in the message).
pub fn parse_csv(text: &str) -> Result<Vec<CsvRecord>, (usize, String)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut records = Vec::new();
    let (mut record, mut field) = (Vec::new(), String::new());
    let (mut line, mut record_line, mut quoted_from) = (1usize, 1usize, None::<usize>);
    let mut chars = text.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if quoted_from.is_some() {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted_from = None,
                '\n' => {
                    line += 1;
                    field.push('\n');
                }
                '\r' if chars.peek() == Some(&'\n') => {}
                c => field.push(c),
            }
            continue;
        }
        match c {
            '"' if field.is_empty() => {
                quoted_from = Some(line);
                any = true;
            }
            ',' => {
                record.push(std::mem::take(&mut field));
                any = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' => {
                if any || !field.is_empty() {
                    record.push(std::mem::take(&mut field));
                    records.push((record_line, std::mem::take(&mut record)));
                }
                any = false;
                line += 1;
                record_line = line;
            }
            c => field.push(c),
        }
    }
    if let Some(from) = quoted_from {
        return Err((from, "a quoted field is never closed".to_owned()));
    }
    if any || !field.is_empty() {
        record.push(field);
        records.push((record_line, record));
    }
    Ok(records)
}

/// Index of the column named one of `names` (case-insensitive, surrounding spaces ignored).
pub fn column(header: &[String], names: &[&str]) -> Option<usize> {
    header
        .iter()
        .position(|h| names.iter().any(|n| h.trim().eq_ignore_ascii_case(n)))
}

fn is_jsonl(text: &str) -> bool {
    text.trim_start_matches('\u{feff}')
        .trim_start()
        .starts_with('{')
}

/// Reads a prompt file. JSONL lines need `turns` (array of strings), `prompt` or `text` (string);
/// CSV needs a `prompt` (or `text`) column. `multi_turn` keeps every turn of a `turns` array;
/// otherwise only the first turn of each line is a prompt.
///
/// # Errors
/// Unreadable file, bad JSON, a line or row without a usable prompt, or no prompt at all.
pub fn load(path: &Path, multi_turn: bool) -> Result<PromptSet, DatasetError> {
    let err = |line: Option<usize>, reason: String| DatasetError {
        path: path.display().to_string(),
        line,
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(None, e.to_string()))?;
    let mut conversations = Vec::new();
    if is_jsonl(&text) {
        for (i, l) in text.lines().enumerate() {
            let l = l.trim().trim_start_matches('\u{feff}');
            if l.is_empty() {
                continue;
            }
            let v: serde_json::Value =
                serde_json::from_str(l).map_err(|e| err(Some(i + 1), format!("not JSON: {e}")))?;
            let turns: Vec<String> = if let Some(turns) = v.get("turns").and_then(|t| t.as_array())
            {
                turns
                    .iter()
                    .map(|t| t.as_str().map(str::to_owned))
                    .collect::<Option<_>>()
                    .ok_or_else(|| err(Some(i + 1), "turns: every turn must be a string".into()))?
            } else if let Some(p) = v
                .get("prompt")
                .or_else(|| v.get("text"))
                .and_then(|p| p.as_str())
            {
                vec![p.to_owned()]
            } else {
                return Err(err(
                    Some(i + 1),
                    "no string field `prompt`, `text` or `turns`".into(),
                ));
            };
            push(&mut conversations, turns, multi_turn);
        }
    } else {
        let records = parse_csv(&text).map_err(|(line, reason)| err(Some(line), reason))?;
        let Some(((_, header), rows)) = records.split_first() else {
            return Err(err(None, "empty file".into()));
        };
        let col = column(header, &["prompt", "text"]).ok_or_else(|| {
            err(
                Some(1),
                format!("CSV header {header:?} has no `prompt` or `text` column"),
            )
        })?;
        for (line, r) in rows {
            let p = r.get(col).ok_or_else(|| {
                err(
                    Some(*line),
                    format!("{} fields, the prompt is field {}", r.len(), col + 1),
                )
            })?;
            push(&mut conversations, vec![p.clone()], multi_turn);
        }
    }
    if conversations.is_empty() {
        return Err(err(None, "no prompt in the file".into()));
    }
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(PromptSet {
        name,
        conversations,
    })
}

fn push(out: &mut Vec<Conversation>, mut turns: Vec<String>, multi_turn: bool) {
    turns.retain(|t| !t.trim().is_empty());
    if !multi_turn {
        turns.truncate(1);
    }
    if !turns.is_empty() {
        out.push(Conversation {
            turns,
            ..Conversation::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_crlf_and_no_final_newline() {
        let text = "\u{feff}act,prompt\r\n\"A, B\",\"say \"\"hi\"\"\r\nthen go\"\r\n\r\nC,plain";
        let r = parse_csv(text).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0], (1, vec!["act".to_owned(), "prompt".to_owned()]));
        assert_eq!(
            r[1],
            (2, vec!["A, B".to_owned(), "say \"hi\"\nthen go".to_owned()])
        );
        assert_eq!(r[2], (5, vec!["C".to_owned(), "plain".to_owned()]));
        assert_eq!(parse_csv("a,\"open\nb").unwrap_err().0, 1);
    }

    fn shared(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/traces")
            .join(name)
    }

    #[test]
    fn awesome_chatgpt_prompts_csv() {
        let p = load(&shared("awesome_chatgpt_prompts.csv"), false).unwrap();
        assert_eq!(p.conversations.len(), 218, "218 prompts (PROVENANCE.md)");
        assert!(
            p.conversations[0].turns[0]
                .starts_with("Imagine you are an experienced Ethereum developer")
        );
        assert!(
            p.conversations
                .iter()
                .all(|c| c.turns.len() == 1 && !c.turns[0].contains('\r'))
        );
    }

    #[test]
    fn mt_bench_two_turns() {
        let p = load(&shared("mt_bench_questions.jsonl"), true).unwrap();
        assert_eq!(p.conversations.len(), 80);
        assert!(p.conversations.iter().all(|c| c.turns.len() == 2));
        assert!(p.conversations[0].turns[1].starts_with("Rewrite your previous response"));
        let single = load(&shared("mt_bench_questions.jsonl"), false).unwrap();
        assert!(single.conversations.iter().all(|c| c.turns.len() == 1));
    }

    #[test]
    fn bad_files_name_the_line() {
        let dir = std::env::temp_dir().join(format!("lmperf-dataset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("bad.jsonl");
        std::fs::write(&f, "{\"prompt\":\"ok\"}\n{\"question\":\"x\"}\n").unwrap();
        let e = load(&f, false).unwrap_err().to_string();
        assert!(
            e.contains("bad.jsonl line 2") && e.contains("prompt"),
            "{e}"
        );
        let f = dir.join("bad.csv");
        std::fs::write(&f, "act,question\nA,B\n").unwrap();
        let e = load(&f, false).unwrap_err().to_string();
        assert!(e.contains("no `prompt`"), "{e}");
    }
}
