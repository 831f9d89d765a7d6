//! Synthetic prompts of an exact token length.
//!
//! Text is drawn from a fixed word list with a seeded generator (same seed, same prompts), with
//! a per-prompt random head so prompts share no prefix (no prefix-cache hits). The length is
//! calibrated against the model's tokenizer, searching the word count whose token count equals
//! the target: a local `tokenizer.json` when `--tokenizer` names one (Hugging Face `tokenizers`),
//! else the server's own `POST /tokenize` (llama.cpp: `{"content"}`; vLLM / SGLang:
//! `{"model", "prompt"}`). Without either the length is an estimate (0.75 words per token) and
//! the summary says so.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::canary::client::Clients;
use crate::config::TargetConfig;

/// How prompt lengths were measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tokenizer {
    /// llama.cpp's `/tokenize` (`content`).
    ServerLlamaCpp,
    /// vLLM / SGLang `/tokenize` (`model`, `prompt`).
    ServerOpenAiStyle,
    /// A local Hugging Face `tokenizer.json` (`--tokenizer`).
    LocalFile,
    /// No tokenizer: 0.75 words per token.
    Estimate,
}

/// What decided a request's `prompt_tokens` (`requests.jsonl` `prompt_tokens_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptTokensSource {
    /// No tokenizer: 0.75 words per token (of the prompt, or of the chat template's rendering).
    #[default]
    Estimate,
    /// The server's `/tokenize` of the prompt text (completions: all the server sees).
    ServerTokenize,
    /// A local `tokenizer.json` on the prompt text.
    LocalTokenizer,
    /// Chat: the server applied its own chat template and the result was counted
    /// ([`super::chat_template`]).
    ServerTemplate,
    /// Chat: a local chat template rendered here, counted by the run's tokenizer.
    LocalTemplate,
    /// Chat without any template: the message text alone, which undercounts.
    TextOnly,
}

/// One generated prompt.
#[derive(Debug, Clone, Serialize)]
pub struct Prompt {
    pub text: String,
    /// Wanted input length in tokens.
    pub target_tokens: u32,
    /// Its length by the tokenizer (the estimate without one); for chat, of the whole
    /// templated request.
    pub tokens: u32,
    /// What counted `tokens`.
    pub source: PromptTokensSource,
}

const WORDS: &[&str] = &[
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "river",
    "garden",
    "music",
    "market",
    "energy",
    "window",
    "paper",
    "light",
    "table",
    "sound",
    "field",
    "picture",
    "language",
    "island",
    "forest",
    "bridge",
    "engine",
    "signal",
    "cloud",
    "winter",
    "summer",
    "letter",
    "answer",
    "number",
    "orange",
    "silver",
    "village",
    "machine",
    "theory",
    "method",
    "quickly",
    "slowly",
    "bright",
    "quiet",
    "simple",
    "careful",
    "ancient",
    "modern",
    "gentle",
    "strong",
    "little",
    "and",
    "the",
    "of",
    "to",
    "in",
    "with",
    "for",
    "on",
    "at",
    "from",
    "by",
    "about",
    "as",
    "into",
    "like",
    "through",
];

/// Short words that are one token in common tokenizers.
const FILLERS: &[&str] = &["the", "and", "of", "to", "in", "a"];

/// A Hugging Face `tokenizer.json` loaded with the `tokenizers` crate.
#[derive(Clone)]
pub struct LocalTokenizer {
    path: std::path::PathBuf,
    tokenizer: std::sync::Arc<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for LocalTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTokenizer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl LocalTokenizer {
    /// Loads `path` (a `tokenizer.json`, or a directory holding one).
    ///
    /// # Errors
    /// One line naming the file and what is wrong with it.
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_owned()
        };
        let tokenizer = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| format!("{}: not a usable tokenizer.json: {e}", file.display()))?;
        Ok(Self {
            path: file,
            tokenizer: std::sync::Arc::new(tokenizer),
        })
    }

    /// Tokens in `text` without special tokens (no BOS), as a server's `/tokenize` with
    /// `add_special: false` counts them.
    pub fn count(&self, text: &str) -> Option<u32> {
        self.tokenizer
            .encode(text, false)
            .ok()
            .map(|e| e.len() as u32)
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// Tokenizer access for calibration.
#[derive(Debug, Clone)]
pub struct TokenizeClient {
    clients: Clients,
    target: TargetConfig,
    pub(super) model: String,
    local: Option<LocalTokenizer>,
    pub kind: Tokenizer,
    /// `--api chat`: how the whole templated request is counted ([`super::chat_template`]);
    /// `None`: the prompt text is all the server sees (completions).
    pub chat: Option<super::chat_template::ChatCounting>,
}

#[derive(serde::Deserialize)]
struct TokenizeReply {
    #[serde(default)]
    tokens: Vec<serde_json::Value>,
    #[serde(default)]
    count: Option<u32>,
}

impl TokenizeClient {
    /// Finds which `/tokenize` the server speaks, if any.
    pub async fn detect(clients: &Clients, target: &TargetConfig, model: &str) -> Self {
        let mut me = Self {
            clients: clients.clone(),
            target: target.clone(),
            model: model.to_owned(),
            local: None,
            kind: Tokenizer::Estimate,
            chat: None,
        };
        for kind in [Tokenizer::ServerLlamaCpp, Tokenizer::ServerOpenAiStyle] {
            me.kind = kind;
            if matches!(me.count("Hello world").await, Some(n) if n > 0) {
                return me;
            }
        }
        me.kind = Tokenizer::Estimate;
        me
    }

    /// Counts with a local `tokenizer.json` (no `/tokenize` calls).
    pub fn local(
        clients: &Clients,
        target: &TargetConfig,
        model: &str,
        local: LocalTokenizer,
    ) -> Self {
        Self {
            clients: clients.clone(),
            target: target.clone(),
            model: model.to_owned(),
            local: Some(local),
            kind: Tokenizer::LocalFile,
            chat: None,
        }
    }

    /// What decides the `prompt_tokens` of this run's prompts.
    pub fn source(&self) -> PromptTokensSource {
        match (&self.chat, self.kind) {
            (Some(c), kind) => c.source(kind),
            (None, Tokenizer::Estimate) => PromptTokensSource::Estimate,
            (None, Tokenizer::LocalFile) => PromptTokensSource::LocalTokenizer,
            (None, _) => PromptTokensSource::ServerTokenize,
        }
    }

    /// Input tokens of a request whose prompt is `text`: the text itself (completions), or one
    /// user message with the chat template applied (chat).
    pub async fn count_prompt(&self, text: &str) -> Option<u32> {
        match &self.chat {
            None => self.count(text).await,
            Some(how) => {
                super::chat_template::count(self, how, &[super::chat_template::user_message(text)])
                    .await
            }
        }
    }

    /// Input tokens of a chat request with these `messages` (the text alone without a chat
    /// counting, see [`Self::count_prompt`]).
    pub async fn count_messages(&self, messages: &[serde_json::Value]) -> Option<u32> {
        match &self.chat {
            Some(how) => super::chat_template::count(self, how, messages).await,
            None => {
                super::chat_template::count(
                    self,
                    &super::chat_template::ChatCounting::TextOnly,
                    messages,
                )
                .await
            }
        }
    }

    /// `POST {base}/{path}` with a JSON body; the JSON reply of a 2xx, else `None`.
    pub(super) async fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Option<serde_json::Value> {
        let url = self.target.base_url.join(path).ok()?;
        let resp = self
            .clients
            .send_idempotent(|c| {
                let req = c
                    .post(url.clone())
                    .json(body)
                    .timeout(Duration::from_secs(10));
                match &self.target.api_key {
                    Some(k) => req.bearer_auth(k.expose()),
                    None => req,
                }
            })
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.json().await.ok()
    }

    /// Tokens in `text` (no special tokens), or the estimate.
    pub async fn count(&self, text: &str) -> Option<u32> {
        let body = match self.kind {
            Tokenizer::LocalFile => return self.local.as_ref().and_then(|t| t.count(text)),
            // Special tokens in the text parsed, as llama.cpp tokenizes prompts (chat templates
            // write their role markers as text).
            Tokenizer::ServerLlamaCpp => {
                serde_json::json!({ "content": text, "add_special": false, "parse_special": true })
            }
            Tokenizer::ServerOpenAiStyle => {
                serde_json::json!({ "model": self.model, "prompt": text, "add_special_tokens": false })
            }
            Tokenizer::Estimate => return Some(estimate(text)),
        };
        let r: TokenizeReply = serde_json::from_value(self.post("tokenize", &body).await?).ok()?;
        Some(r.count.unwrap_or(r.tokens.len() as u32))
    }
}

/// The estimate of `text`'s tokens without a tokenizer: its words ÷ 0.75.
pub fn estimated_count(text: &str) -> u32 {
    estimate(text)
}

fn estimate(text: &str) -> u32 {
    ((text.split_whitespace().count() as f64) / 0.75).round() as u32
}

/// About `tokens` tokens of synthetic text without a tokenizer: `tokens` × 0.75 words (at
/// least one) of the built-in word list, so that [`TokenizeClient::count`]'s estimate gives
/// `tokens` back (± 1); distinct per `seed`, so no two share a prefix cache. For trace replay
/// through the control API, where one request must not wait for `/tokenize` calls.
pub fn estimated(tokens: u32, seed: u64) -> String {
    let n = ((f64::from(tokens) * 0.75).round() as usize).max(1);
    words(&mut SmallRng::seed_from_u64(seed), n)
}

fn words(rng: &mut SmallRng, n: usize) -> String {
    let mut s = String::with_capacity(n * 7);
    for i in 0..n {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    s
}

/// `n` prompts of `target_tokens` tokens each, reproducible from `seed`.
pub async fn synthetic(
    tok: &TokenizeClient,
    n: usize,
    target_tokens: u32,
    seed: u64,
) -> Vec<Prompt> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut rng = SmallRng::seed_from_u64(seed ^ (u64::from(target_tokens) << 32) ^ i as u64);
        // Enough words for any tokenizer, then cut to the target.
        let pool: Vec<&str> = (0..(target_tokens as usize * 2 + 8))
            .map(|_| WORDS[rng.random_range(0..WORDS.len())])
            .collect();
        let head = format!("{} {}:", i, words(&mut rng, 2));
        let text_of = |k: usize| format!("{head} {}", pool[..k.min(pool.len())].join(" "));
        // Search the word count whose token count is closest to the target (counts grow with k).
        let (mut lo, mut hi) = (0usize, pool.len());
        let mut best: Option<(u32, String)> = None;
        while lo <= hi {
            let mid = (lo + hi) / 2;
            let text = text_of(mid);
            let Some(c) = tok.count_prompt(&text).await else {
                break;
            };
            let better = best
                .as_ref()
                .is_none_or(|(b, _)| c.abs_diff(target_tokens) < b.abs_diff(target_tokens));
            if better {
                best = Some((c, text));
            }
            if c == target_tokens {
                break;
            }
            if c < target_tokens {
                lo = mid + 1;
            } else if mid == 0 {
                break;
            } else {
                hi = mid - 1;
            }
        }
        let mut source = tok.source();
        let (mut tokens, mut text) = best.unwrap_or_else(|| {
            // The tokenizer failed: the estimate, said so.
            source = PromptTokensSource::Estimate;
            let k = (target_tokens as f64 * 0.75) as usize;
            let t = text_of(k);
            (estimate(&t), t)
        });
        // Words can be several tokens: finish with single-token steps (drop the last word when
        // over, add a short common word when under).
        for _ in 0..12 {
            if tokens == target_tokens || source == PromptTokensSource::Estimate {
                break;
            }
            let candidate = if tokens > target_tokens {
                match text.rsplit_once(' ') {
                    Some((head, _)) => head.to_owned(),
                    None => break,
                }
            } else {
                format!("{text} {}", FILLERS[(tokens as usize) % FILLERS.len()])
            };
            match tok.count_prompt(&candidate).await {
                Some(c) => {
                    tokens = c;
                    text = candidate;
                }
                None => break,
            }
        }
        out.push(Prompt {
            text,
            target_tokens,
            tokens,
            source,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimated_text_counts_back_to_its_length() {
        for tokens in [1, 7, 110, 4808] {
            let text = estimated(tokens, 3);
            assert!(
                estimate(&text).abs_diff(tokens) <= 1,
                "{tokens}: {}",
                estimate(&text)
            );
        }
        assert_eq!(estimated(200, 1), estimated(200, 1));
        assert_ne!(estimated(200, 1), estimated(200, 2));
    }
}
