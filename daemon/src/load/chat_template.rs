//! Chat requests counted as the server sees them: with the model's chat template applied.
//!
//! A chat request's input is not its message text: the server renders the messages through the
//! model's chat template (role markers, the generation prompt, sometimes a default system
//! prompt) and tokenizes that. `lmperf run --api chat` counts the same thing, from the first
//! of these that is available ([`detect`]):
//! 1. a local template: `--chat-template FILE`, or the `chat_template` of the
//!    `tokenizer_config.json` beside `--tokenizer` (the user's explicit choice, as `--tokenizer`
//!    wins over the server's `/tokenize`), rendered here with minijinja as Hugging Face
//!    transformers' `apply_chat_template` renders it (as TGI does: `trim_blocks`,
//!    `lstrip_blocks`, `raise_exception`, `strftime_now`, Python string and dict methods), then
//!    counted by the run's tokenizer;
//! 2. the server's own template: llama.cpp `POST /apply-template` (`{"messages"}` → `{"prompt"}`)
//!    then `/tokenize` of that prompt with special tokens parsed; vLLM and SGLang `POST /tokenize`
//!    with `messages` and `add_generation_prompt`;
//! 3. none: the message text alone ([`PromptTokensSource::TextOnly`], or the word estimate),
//!    which undercounts; `prompt_tokens_mismatch` in the summary then shows it.
//!
//! Counts leave out the BOS token the server adds itself (as completions do): a server's
//! `usage.prompt_tokens` is the count or one more.

use std::path::{Path, PathBuf};

use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::json;

/// A Hugging Face chat template (Jinja), ready to render.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Special tokens the template may use (`bos_token`, `eos_token`, …) by name.
    special: Vec<(String, String)>,
    path: PathBuf,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Special tokens of `tokenizer_config.json` passed to the template, as transformers does.
const SPECIAL_TOKENS: &[&str] = &[
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

impl ChatTemplate {
    /// Loads `path`: a `tokenizer_config.json` (its `chat_template`: a string, or a list of
    /// `{name, template}` of which `default` is taken; its special tokens), or a Jinja file
    /// (no special tokens besides those it writes itself).
    ///
    /// # Errors
    /// One line naming the file and what is wrong: unreadable, not JSON, no `chat_template`,
    /// a template that does not compile.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let is_json = path.extension().is_some_and(|e| e == "json");
        if !is_json {
            return Self::from_source(text, Vec::new(), path);
        }
        let config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        let source = template_of(&config).ok_or_else(|| {
            format!(
                "{}: no chat_template (a string, or a list with a \"default\" entry)",
                path.display()
            )
        })?;
        let special = SPECIAL_TOKENS
            .iter()
            .filter_map(|k| token_text(&config[*k]).map(|t| ((*k).to_owned(), t)))
            .collect();
        Self::from_source(source, special, path)
    }

    /// The template of the `tokenizer_config.json` beside a `tokenizer.json` (or in the
    /// directory `tokenizer` names); `Ok(None)` when there is none or it has no `chat_template`.
    ///
    /// # Errors
    /// A config that exists with a `chat_template` that does not load.
    pub fn beside(tokenizer: &Path) -> Result<Option<Self>, String> {
        let dir = if tokenizer.is_dir() {
            tokenizer
        } else {
            tokenizer.parent().unwrap_or(Path::new("."))
        };
        let config = dir.join("tokenizer_config.json");
        let has_template = std::fs::read_to_string(&config)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|c| template_of(&c).is_some());
        if has_template {
            Self::load(&config).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Compiles `source`; `origin` names it in errors and in the summary.
    ///
    /// # Errors
    /// The template does not compile, or does not render one user message with its text
    /// (the message names `origin` and the reason).
    pub fn from_source(
        source: String,
        special: Vec<(String, String)>,
        origin: &Path,
    ) -> Result<Self, String> {
        let mut env = Environment::new();
        // transformers' chat-template environment (ImmutableSandboxedEnvironment(trim_blocks=True,
        // lstrip_blocks=True), loopcontrols, raise_exception, strftime_now).
        let mut syntax = minijinja::syntax::SyntaxConfig::builder();
        syntax.trim_blocks(true).lstrip_blocks(true);
        env.set_syntax(
            syntax
                .build()
                .map_err(|e| format!("{}: {e}", origin.display()))?,
        );
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("the template raised: {msg}"),
            ))
        });
        env.add_function("strftime_now", |format: String| strftime_now(&format));
        env.add_template_owned("chat_template", source)
            .map_err(|e| {
                format!(
                    "{}: the chat template does not compile: {e}",
                    origin.display()
                )
            })?;
        let template = Self {
            env,
            special,
            path: origin.to_owned(),
        };
        // Any text compiles: a chat template must also render a message's text.
        let probe = "Hello world, 1 2 3";
        match template.render(&[user_message(probe)]) {
            Ok(text) if text.contains(probe) => Ok(template),
            Ok(_) => Err(format!(
                "{}: not a chat template (a user message's text does not appear in its rendering)",
                origin.display()
            )),
            Err(e) => Err(format!("one user message does not render: {e}")),
        }
    }

    /// Renders `messages` (OpenAI chat messages) with the generation prompt, as the server
    /// will before tokenizing.
    ///
    /// # Errors
    /// The template fails (e.g. its own `raise_exception` on roles that do not alternate).
    pub fn render(&self, messages: &[serde_json::Value]) -> Result<String, String> {
        let mut ctx = serde_json::Map::new();
        ctx.insert(
            "messages".into(),
            serde_json::Value::Array(messages.to_vec()),
        );
        ctx.insert("add_generation_prompt".into(), true.into());
        for (k, v) in &self.special {
            ctx.insert(k.clone(), v.clone().into());
        }
        let tmpl = self
            .env
            .get_template("chat_template")
            .map_err(|e| e.to_string())?;
        tmpl.render(Value::from(minijinja::value::Serde(&ctx)))
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }

    /// The file it came from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `chat_template` of a `tokenizer_config.json`: a string, or the `default` of a named list.
fn template_of(config: &serde_json::Value) -> Option<String> {
    match &config["chat_template"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_owned),
        _ => None,
    }
}

/// A special token of `tokenizer_config.json`: a string or an `AddedToken` (`{"content"}`).
fn token_text(v: &serde_json::Value) -> Option<String> {
    v.as_str()
        .or_else(|| v["content"].as_str())
        .map(str::to_owned)
}

/// transformers' `strftime_now(format)`: the local time formatted (UTC here) with the
/// directives chat templates use (`%d %b %Y` in Llama 3.x): `%Y %y %m %d %e %B %b %H %M %S %%`.
fn strftime_now(format: &str) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    // "2026-11-30T13:18:05Z"
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let field = |a: usize, b: usize| now.get(a..b).unwrap_or("00");
    let month = field(5, 7).parse::<usize>().unwrap_or(1).clamp(1, 12);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(field(0, 4)),
            Some('y') => out.push_str(field(2, 4)),
            Some('m') => out.push_str(field(5, 7)),
            Some('d') => out.push_str(field(8, 10)),
            Some('e') => out.push_str(&format!("{:>2}", field(8, 10).trim_start_matches('0'))),
            Some('B') => out.push_str(MONTHS[month - 1]),
            Some('b') => out.push_str(&MONTHS[month - 1][..3]),
            Some('H') => out.push_str(field(11, 13)),
            Some('M') => out.push_str(field(14, 16)),
            Some('S') => out.push_str(field(17, 19)),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.map(String::from).unwrap_or_default()
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// One user message, as `lmperf run` sends a prompt to `/v1/chat/completions`.
pub fn user_message(text: &str) -> serde_json::Value {
    json!({ "role": "user", "content": text })
}

/// The warning for `--seq-lengths` shorter than the chat template's own `floor` tokens (such
/// prompts are sent at the floor and more); `None` when every length reaches it.
pub fn short_lengths_warning(lengths: &[u32], floor: u32) -> Option<String> {
    let short: Vec<String> = lengths
        .iter()
        .filter(|&&l| l < floor)
        .map(u32::to_string)
        .collect();
    (!short.is_empty()).then(|| {
        format!(
            "lmperf run: warning: --seq-lengths {} shorter than the chat template's own {floor} tokens (an empty user message): those prompts are sent longer than asked; summary input_len gives the achieved mean",
            short.join(" ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(source: &str, special: &[(&str, &str)]) -> ChatTemplate {
        ChatTemplate::from_source(
            source.to_owned(),
            special
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            Path::new("test.jinja"),
        )
        .unwrap()
    }

    fn msgs(pairs: &[(&str, &str)]) -> Vec<serde_json::Value> {
        pairs
            .iter()
            .map(|(r, c)| json!({ "role": r, "content": c }))
            .collect()
    }

    const FIXTURES: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/chat_templates/"
    );

    /// llama.cpp's fallback template (chatml) as its `/props` reports it for a GGUF without one;
    /// the renderings are what its `/apply-template` returned for the same messages.
    /// `--api chat --seq-lengths 3` under a 23-token template: warned, naming both lengths.
    #[test]
    fn seq_lengths_below_the_template_floor_are_warned() {
        let w = short_lengths_warning(&[3, 64, 10], 23).unwrap();
        assert!(
            w.contains("--seq-lengths 3 10 shorter than the chat template's own 23 tokens"),
            "{w}"
        );
        assert_eq!(short_lengths_warning(&[23, 64], 23), None);
    }

    #[test]
    fn chatml_renders_as_llama_cpp_applies_it() {
        let t = ChatTemplate::load(&PathBuf::from(FIXTURES).join("chatml.jinja")).unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "Hello world")])).unwrap(),
            "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&msgs(&[
                ("system", "Sys"),
                ("user", "Hello world"),
                ("assistant", "Hi"),
                ("user", "Again")
            ]))
            .unwrap(),
            "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\nHi<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    /// Gemma 3's template (google/gemma-3-*-it `tokenizer_config.json`): `bos_token`, `trim`,
    /// `is string`, the system prompt folded into the first user turn, `raise_exception` on
    /// roles that do not alternate.
    #[test]
    fn gemma3_template_from_tokenizer_config() {
        let t = ChatTemplate::load(&PathBuf::from(FIXTURES).join("gemma3/tokenizer_config.json"))
            .unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "  Hello world \n")])).unwrap(),
            "<bos><start_of_turn>user\nHello world<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            t.render(&msgs(&[
                ("system", "Be brief."),
                ("user", "Hi"),
                ("assistant", "Hello!"),
                ("user", "Again")
            ]))
            .unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nAgain<end_of_turn>\n<start_of_turn>model\n"
        );
        let e = t
            .render(&msgs(&[("user", "a"), ("user", "b")]))
            .unwrap_err();
        assert!(
            e.contains("Conversation roles must alternate") && e.contains("tokenizer_config.json"),
            "{e}"
        );
    }

    /// Python methods (pycompat), `namespace`, loop controls, the named-template list and
    /// `AddedToken` special tokens of a `tokenizer_config.json`, `strftime_now`.
    #[test]
    fn python_methods_named_templates_and_dates() {
        let t = template(
            "{%- set ns = namespace(n=0) -%}{%- for m in messages -%}{%- if m.role == 'skip' %}{% continue %}{% endif -%}{%- set ns.n = ns.n + 1 -%}[{{ m.role.upper() }}:{{ m.content.strip() }}{{ '?' if m.content.endswith('?') }}]{%- endfor -%}{{ ns.n }}{{ bos_token }}",
            &[("bos_token", "<s>")],
        );
        assert_eq!(
            t.render(&msgs(&[
                ("user", " why? "),
                ("skip", "x"),
                ("assistant", "ok")
            ]))
            .unwrap(),
            "[USER:why?][ASSISTANT:ok]2<s>"
        );
        let dir = std::env::temp_dir().join(format!("lmperf-chat-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("tokenizer_config.json");
        std::fs::write(&config, r#"{"bos_token": {"content": "<|begin|>", "lstrip": false}, "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}{{ strftime_now('%d %b %Y') }}|{{ messages[0].content }}"}]}"#).unwrap();
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        let t = ChatTemplate::beside(&dir.join("tokenizer.json"))
            .unwrap()
            .expect("a template beside the tokenizer");
        let out = t.render(&msgs(&[("user", "x")])).unwrap();
        let (date, rest) = out
            .strip_prefix("<|begin|>")
            .unwrap()
            .split_once('|')
            .unwrap();
        assert_eq!(rest, "x");
        let parts: Vec<&str> = date.split(' ').collect();
        assert!(
            parts.len() == 3 && parts[0].len() == 2 && parts[1].len() == 3 && parts[2].len() == 4,
            "{date}"
        );
        // No chat_template: nothing beside; a bad one: the file and the reason.
        std::fs::write(&config, r#"{"bos_token": "<s>"}"#).unwrap();
        assert!(ChatTemplate::beside(&dir).unwrap().is_none());
        let e = ChatTemplate::load(&config).unwrap_err();
        assert!(e.contains("tokenizer_config.json: no chat_template"), "{e}");
        std::fs::write(&config, r#"{"chat_template": "{% for m in messages %}"}"#).unwrap();
        let e = ChatTemplate::beside(&dir).unwrap_err();
        assert!(e.contains("does not compile"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
