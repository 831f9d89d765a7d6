//! Standard dataset files for `lmperf run --dataset FORMAT FILE`, in the formats vLLM's and
//! SGLang's benchmarks read:
//!
//! - `sharegpt`: a JSON array of rows `{"conversations": [{"from": "human", "value": …},
//!   {"from": "gpt", "value": …}, …]}` (ShareGPT_V3_unfiltered_cleaned_split.json). A row's
//!   prompt is its first human turn (`from` `human` or `user`); with `--multi-turn` every
//!   human turn, each sent after the previous answer with the history.
//! - `jsonl`: vLLM's `custom` dataset, one JSON object per line with `prompt` (a string) or
//!   `messages` (OpenAI chat messages, sent as they are), an optional `output_len` (or
//!   `output_tokens`: `max_tokens` of that request) and optional `images` (URLs or `data:`
//!   URLs, sent as `image_url` parts).
//!
//! A bad row (not JSON, no usable prompt, a field of the wrong type) does not stop the run: it
//! is skipped and counted ([`BadRow`]: its 1-based line in a JSONL file, its 0-based index in
//! the ShareGPT array). The parsers are pure; [`load`] reads the file.

use std::path::Path;

use serde::Serialize;

use super::dataset::{Conversation, DatasetError, PromptSet};

/// Format of a `--dataset` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetFormat {
    /// vLLM / SGLang ShareGPT JSON.
    Sharegpt,
    /// vLLM `custom` JSONL.
    Jsonl,
}

impl DatasetFormat {
    /// `sharegpt` or `jsonl`; `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "sharegpt" => Some(Self::Sharegpt),
            "jsonl" | "custom" => Some(Self::Jsonl),
            _ => None,
        }
    }
}

/// A skipped row: where it is (`line`: 1-based line of a JSONL file, or 0-based index of a
/// ShareGPT array's row) and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BadRow {
    pub line: usize,
    pub reason: String,
}

/// The rows of a dataset file that can be sent, and those skipped.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parsed {
    pub conversations: Vec<Conversation>,
    pub skipped: Vec<BadRow>,
}

/// A loaded `--dataset`: its prompts (as a prompt file's) and what was skipped.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub format: DatasetFormat,
    pub prompts: PromptSet,
    pub skipped: Vec<BadRow>,
}

/// Skipped rows listed by line in `summary.json` (the count covers them all).
pub const LISTED_BAD_ROWS: usize = 100;

/// `summary.json` `workload.dataset`.
#[derive(Debug, Clone, Serialize)]
pub struct DatasetInfo {
    pub format: DatasetFormat,
    /// File name.
    pub name: String,
    /// Rows (conversations) that can be sent.
    pub rows: usize,
    /// Rows skipped as malformed.
    pub skipped_rows: usize,
    /// Where the "line" of [`BadRow`] counts from: `line` (1-based, JSONL) or `index`
    /// (0-based, the ShareGPT array).
    pub bad_row_position: &'static str,
    /// The first [`LISTED_BAD_ROWS`] skipped rows.
    pub bad_rows: Vec<BadRow>,
}

impl Dataset {
    /// What the summary says about it.
    pub fn info(&self) -> DatasetInfo {
        DatasetInfo {
            format: self.format,
            name: self.prompts.name.clone(),
            rows: self.prompts.conversations.len(),
            skipped_rows: self.skipped.len(),
            bad_row_position: match self.format {
                DatasetFormat::Sharegpt => "index",
                DatasetFormat::Jsonl => "line",
            },
            bad_rows: self.skipped.iter().take(LISTED_BAD_ROWS).cloned().collect(),
        }
    }
}

impl DatasetInfo {
    /// One warning line per skipped row (the first `max`, then how many more).
    pub fn warnings(&self, max: usize) -> Vec<String> {
        let at = if self.bad_row_position == "index" {
            "row"
        } else {
            "line"
        };
        let mut w: Vec<String> = self
            .bad_rows
            .iter()
            .take(max)
            .map(|b| {
                format!(
                    "lmperf run: warning: --dataset {} {at} {}: {} (skipped)",
                    self.name, b.line, b.reason
                )
            })
            .collect();
        if self.skipped_rows > w.len() {
            w.push(format!(
                "lmperf run: warning: --dataset {}: {} more malformed rows skipped ({} in all)",
                self.name,
                self.skipped_rows - w.len(),
                self.skipped_rows
            ));
        }
        w
    }
}

/// Parses ShareGPT JSON text (an array of rows).
///
/// # Errors
/// Text that is not a JSON array (no row can be read).
pub fn parse_sharegpt(text: &str, multi_turn: bool) -> Result<Parsed, String> {
    let rows: Vec<serde_json::Value> = serde_json::from_str(text.trim_start_matches('\u{feff}'))
        .map_err(|e| format!("not a JSON array of ShareGPT rows: {e}"))?;
    let mut out = Parsed::default();
    for (i, row) in rows.iter().enumerate() {
        match sharegpt_row(row, multi_turn) {
            Ok(turns) => out.conversations.push(Conversation {
                turns,
                ..Conversation::default()
            }),
            Err(reason) => out.skipped.push(BadRow { line: i, reason }),
        }
    }
    Ok(out)
}

fn sharegpt_row(row: &serde_json::Value, multi_turn: bool) -> Result<Vec<String>, String> {
    let turns = row
        .get("conversations")
        .or_else(|| row.get("conversation"))
        .and_then(|c| c.as_array())
        .ok_or("no `conversations` array")?;
    let mut human = Vec::new();
    for (k, t) in turns.iter().enumerate() {
        let from = t
            .get("from")
            .or_else(|| t.get("role"))
            .and_then(|f| f.as_str());
        let value = t.get("value").or_else(|| t.get("content"));
        if !matches!(from, Some("human" | "user")) {
            continue;
        }
        let v = value
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("conversations[{k}]: `value` is not a string"))?;
        if !v.trim().is_empty() {
            human.push(v.to_owned());
        }
        if !multi_turn && !human.is_empty() {
            break;
        }
    }
    if human.is_empty() {
        return Err("no human turn with text".into());
    }
    Ok(human)
}

/// Parses vLLM `custom` JSONL text (empty lines ignored).
pub fn parse_jsonl(text: &str) -> Parsed {
    let mut out = Parsed::default();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim().trim_start_matches('\u{feff}');
        if l.is_empty() {
            continue;
        }
        match jsonl_row(l) {
            Ok(c) => out.conversations.push(c),
            Err(reason) => out.skipped.push(BadRow {
                line: i + 1,
                reason,
            }),
        }
    }
    out
}

fn jsonl_row(line: &str) -> Result<Conversation, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let output_len = match obj.get("output_len").or_else(|| obj.get("output_tokens")) {
        None | Some(serde_json::Value::Null) => None,
        Some(n) => Some(
            n.as_u64()
                .filter(|n| (1..=1_000_000).contains(n))
                .map(|n| n as u32)
                .ok_or_else(|| {
                    format!("output_len {n}: a whole number of tokens in 1..=1000000")
                })?,
        ),
    };
    let images = match obj.get("images") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|u| u.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or("images: every image must be a URL string")?,
        Some(_) => return Err("images: an array of URL strings".into()),
    };
    if let Some(p) = obj.get("prompt") {
        let p = p.as_str().ok_or("prompt: not a string")?;
        if p.trim().is_empty() {
            return Err("prompt: empty".into());
        }
        return Ok(Conversation {
            turns: vec![p.to_owned()],
            output_len,
            images,
            messages: None,
        });
    }
    let messages = obj
        .get("messages")
        .ok_or("no `prompt` (string) or `messages` (array)")?
        .as_array()
        .ok_or("messages: not an array")?;
    let mut text = Vec::new();
    for (k, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(|r| r.as_str());
        let content = m.get("content").and_then(|c| c.as_str());
        match (role, content) {
            (Some(_), Some(c)) => text.push(c.to_owned()),
            _ => {
                return Err(format!(
                    "messages[{k}]: needs a string `role` and a string `content`"
                ));
            }
        }
    }
    if text.iter().all(|t| t.trim().is_empty()) {
        return Err("messages: no text".into());
    }
    Ok(Conversation {
        turns: vec![text.join("\n")],
        output_len,
        images,
        messages: Some(messages.clone()),
    })
}

/// Reads a `--dataset` file of `format`.
///
/// # Errors
/// An unreadable file, a ShareGPT file that is not a JSON array, or no usable row at all.
pub fn load(format: DatasetFormat, path: &Path, multi_turn: bool) -> Result<Dataset, DatasetError> {
    let err = |reason: String| DatasetError {
        path: path.display().to_string(),
        line: None,
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let parsed = match format {
        DatasetFormat::Sharegpt => parse_sharegpt(&text, multi_turn).map_err(err)?,
        DatasetFormat::Jsonl => parse_jsonl(&text),
    };
    if parsed.conversations.is_empty() {
        return Err(err(format!(
            "no usable row ({} malformed{})",
            parsed.skipped.len(),
            parsed
                .skipped
                .first()
                .map(|b| format!(", the first at {}: {}", b.line, b.reason))
                .unwrap_or_default()
        )));
    }
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(Dataset {
        format,
        prompts: PromptSet {
            name,
            conversations: parsed.conversations,
        },
        skipped: parsed.skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharegpt_first_human_turn_or_all_and_bad_rows_by_index() {
        let text = r#"[
          {"id":"a","conversations":[{"from":"human","value":"hello there"},{"from":"gpt","value":"hi"},{"from":"human","value":"and again"}]},
          {"id":"b","conversations":[]},
          {"id":"c"},
          7,
          {"id":"e","conversations":[{"from":"system","value":"s"},{"from":"human","value":"second"}]},
          {"id":"f","conversations":[{"from":"human","value":3}]}
        ]"#;
        let p = parse_sharegpt(text, false).unwrap();
        assert_eq!(
            p.conversations
                .iter()
                .map(|c| c.turns.clone())
                .collect::<Vec<_>>(),
            [vec!["hello there".to_owned()], vec!["second".to_owned()]]
        );
        assert_eq!(
            p.skipped.iter().map(|b| b.line).collect::<Vec<_>>(),
            [1, 2, 3, 5]
        );
        assert_eq!(p.skipped[0].reason, "no human turn with text");
        assert_eq!(p.skipped[1].reason, "no `conversations` array");
        assert!(
            p.skipped[3].reason.contains("conversations[0]"),
            "{:?}",
            p.skipped[3]
        );
        let all = parse_sharegpt(text, true).unwrap();
        assert_eq!(all.conversations[0].turns, ["hello there", "and again"]);
        assert!(
            parse_sharegpt("{\"a\":1}", false)
                .unwrap_err()
                .contains("JSON array")
        );
    }

    #[test]
    fn jsonl_prompt_messages_output_len_images_and_bad_lines() {
        let text = "{\"prompt\":\"one two\",\"output_len\":7}\n\
                    not json\n\
                    \n\
                    {\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"hi\"}],\"images\":[\"data:image/png;base64,AAAA\"]}\n\
                    {\"prompt\":\"x\",\"output_len\":0}\n\
                    {\"question\":\"x\"}\n\
                    {\"prompt\":\"y\",\"images\":[1]}\n\
                    [1,2]\n";
        let p = parse_jsonl(text);
        assert_eq!(p.conversations.len(), 2);
        assert_eq!(p.conversations[0].turns, ["one two"]);
        assert_eq!(p.conversations[0].output_len, Some(7));
        let m = &p.conversations[1];
        assert_eq!(m.turns, ["be brief\nhi"]);
        assert_eq!(m.messages.as_ref().map(Vec::len), Some(2));
        assert_eq!(m.images, ["data:image/png;base64,AAAA"]);
        assert_eq!(
            p.skipped.iter().map(|b| b.line).collect::<Vec<_>>(),
            [2, 5, 6, 7, 8]
        );
        assert!(p.skipped[0].reason.starts_with("not JSON"));
        assert!(p.skipped[1].reason.contains("output_len 0"));
        assert!(p.skipped[2].reason.contains("no `prompt`"));
        assert!(p.skipped[3].reason.contains("images"));
        assert_eq!(p.skipped[4].reason, "not a JSON object");
    }
}
