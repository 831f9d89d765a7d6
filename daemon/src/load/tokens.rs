//! How the server counts a prompt's tokens, and how `lmperf run` counts them the same way: a
//! local `tokenizer.json` ([`LocalTokenizer`]), the server's `POST /tokenize`
//! ([`TokenizeClient`]), the 0.75-words-per-token estimate without either, and for `--api chat`
//! the chat template around the messages ([`ChatCounting`]: a local template of
//! [`super::chat_template`], the server's `/apply-template` or `/tokenize` with `messages`, or
//! the text alone). [`PromptTokensSource`] says which counted a request.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use super::LoadError;
use super::chat_template::{ChatTemplate, user_message};
use crate::canary::client::Clients;
use crate::config::{Api, TargetConfig};

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

/// How a chat request's input tokens are counted (see the module doc).
#[derive(Debug, Clone)]
pub enum ChatCounting {
    /// A local template rendered here, then counted by the run's tokenizer.
    Local(Arc<ChatTemplate>),
    /// llama.cpp: `POST /apply-template`, then the run's tokenizer on its `prompt`.
    ServerApplyTemplate,
    /// vLLM / SGLang: `POST /tokenize` with `messages` (the server applies its template).
    ServerTokenizeMessages,
    /// No template: the text of the messages alone (an undercount).
    TextOnly,
}

impl ChatCounting {
    /// The `prompt_tokens_source` of requests counted this way, with the run's tokenizer.
    pub fn source(&self, tokenizer: Tokenizer) -> PromptTokensSource {
        match self {
            _ if tokenizer == Tokenizer::Estimate => PromptTokensSource::Estimate,
            Self::Local(_) => PromptTokensSource::LocalTemplate,
            Self::ServerApplyTemplate | Self::ServerTokenizeMessages => {
                PromptTokensSource::ServerTemplate
            }
            Self::TextOnly => PromptTokensSource::TextOnly,
        }
    }

    /// `summary.json` `chat_template`: where the template came from, in words.
    pub fn describe(&self) -> String {
        match self {
            Self::Local(t) => format!("local: {}", t.path().display()),
            Self::ServerApplyTemplate => "server: POST /apply-template".to_owned(),
            Self::ServerTokenizeMessages => "server: POST /tokenize with messages".to_owned(),
            Self::TextOnly => "none: message text only (the template is not counted)".to_owned(),
        }
    }
}

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
    /// `--api chat`: how the whole templated request is counted ([`ChatCounting`]);
    /// `None`: the prompt text is all the server sees (completions).
    pub chat: Option<ChatCounting>,
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
            Some(how) => count(self, how, &[user_message(text)]).await,
        }
    }

    /// Input tokens of a chat request with these `messages` (the text alone without a chat
    /// counting, see [`Self::count_prompt`]).
    pub async fn count_messages(&self, messages: &[serde_json::Value]) -> Option<u32> {
        match &self.chat {
            Some(how) => count(self, how, messages).await,
            None => count(self, &ChatCounting::TextOnly, messages).await,
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

/// How the run counts chat requests: `local` when given (`--chat-template`, or beside
/// `--tokenizer`), else the server's template when it offers one and the run has a tokenizer,
/// else the message text only.
pub async fn detect(tok: &TokenizeClient, local: Option<Arc<ChatTemplate>>) -> ChatCounting {
    if let Some(t) = local {
        return ChatCounting::Local(t);
    }
    if tok.kind == Tokenizer::Estimate {
        return ChatCounting::TextOnly;
    }
    let probe = [user_message("Hello world")];
    if apply_template(tok, &probe)
        .await
        .is_some_and(|p| p.contains("Hello world"))
    {
        return ChatCounting::ServerApplyTemplate;
    }
    let text_only = tok.count("Hello world").await.unwrap_or(0);
    if tokenize_messages(tok, &probe)
        .await
        .is_some_and(|n| n > text_only)
    {
        return ChatCounting::ServerTokenizeMessages;
    }
    ChatCounting::TextOnly
}

/// Sets up the run's chat counting (`tok.chat`) for `--api chat`: the local template
/// (`--chat-template`, else beside `--tokenizer`), else [`detect`]s the server's. Completions
/// are left as they are. With `progress`, says on stderr which it is, and warns when the
/// template cannot be counted.
///
/// # Errors
/// `--chat-template` without `--api chat`; a `tokenizer_config.json` beside `--tokenizer`
/// whose `chat_template` does not load.
pub async fn setup(
    mut tok: TokenizeClient,
    chat_template: Option<&Arc<ChatTemplate>>,
    tokenizer: Option<&LocalTokenizer>,
    api: Api,
    progress: bool,
) -> Result<TokenizeClient, LoadError> {
    if api != Api::Chat {
        return match chat_template {
            Some(t) => Err(LoadError::Invalid {
                field: "--chat-template",
                value: t.path().display().to_string(),
                reason: "counts chat requests: it needs --api chat".into(),
            }),
            None => Ok(tok),
        };
    }
    let local = match (chat_template, tokenizer) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(l)) => ChatTemplate::beside(l.path())
            .map_err(|reason| LoadError::Invalid {
                field: "--tokenizer",
                value: l.path().display().to_string(),
                reason: format!("{reason} (give --chat-template FILE instead)"),
            })?
            .map(Arc::new),
        (None, None) => None,
    };
    let how = detect(&tok, local).await;
    if progress {
        match how.source(tok.kind) {
            PromptTokensSource::ServerTemplate | PromptTokensSource::LocalTemplate => eprintln!(
                "lmperf run: chat prompts counted with their chat template ({})",
                how.describe()
            ),
            _ => eprintln!(
                "lmperf run: warning: no chat template to count (the server offers none; give --chat-template FILE, or --tokenizer with a tokenizer_config.json beside it): prompt_tokens count the messages' text alone, not the template the server wraps them in (the server may count more or fewer: summary.json prompt_tokens_mismatch says how many differ)"
            ),
        }
    }
    tok.chat = Some(how);
    Ok(tok)
}

/// Tokens of the chat template around an empty user message: the shortest chat prompt the
/// run can send; `None` without chat counting or when the count failed.
pub async fn template_floor(tok: &TokenizeClient) -> Option<u32> {
    let how = tok.chat.as_ref()?;
    count(tok, how, &[user_message("")])
        .await
        .filter(|&n| n > 0)
}

/// Input tokens of a chat request with `messages`, counted as `how` says; `None` when a count
/// failed (the server's answer, the template).
pub async fn count(
    tok: &TokenizeClient,
    how: &ChatCounting,
    messages: &[serde_json::Value],
) -> Option<u32> {
    match how {
        ChatCounting::Local(t) => tok.count(&t.render(messages).ok()?).await,
        ChatCounting::ServerApplyTemplate => tok.count(&apply_template(tok, messages).await?).await,
        ChatCounting::ServerTokenizeMessages => tokenize_messages(tok, messages).await,
        ChatCounting::TextOnly => {
            let mut n = 0;
            for m in messages {
                n += tok.count(m["content"].as_str().unwrap_or_default()).await?;
            }
            Some(n)
        }
    }
}

/// llama.cpp's `POST /apply-template`: the rendered prompt.
async fn apply_template(tok: &TokenizeClient, messages: &[serde_json::Value]) -> Option<String> {
    let reply = tok
        .post("apply-template", &json!({ "messages": messages }))
        .await?;
    reply["prompt"].as_str().map(str::to_owned)
}

/// vLLM / SGLang `POST /tokenize` with `messages`: the templated count.
async fn tokenize_messages(tok: &TokenizeClient, messages: &[serde_json::Value]) -> Option<u32> {
    let body = json!({ "model": tok.model, "messages": messages, "add_generation_prompt": true, "add_special_tokens": false });
    let reply = tok.post("tokenize", &body).await?;
    reply["count"]
        .as_u64()
        .or_else(|| reply["tokens"].as_array().map(|t| t.len() as u64))
        .and_then(|n| u32::try_from(n).ok())
}
