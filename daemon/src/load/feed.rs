//! What one benchmark sends and when, made as it goes rather than all up front, so a run's
//! memory does not grow with `--num-prompts`: its items ([`ItemSource`], prompts and output
//! lengths) and its send offsets ([`Schedule`]).
//!
//! - **Items.** Item `i` is drawn from `--seed` and `i` alone (lengths and file order from
//!   seeded streams drawn in index order), so a run gives the same items whether they are
//!   made early or late. [`ItemSource::start`] makes the first [`AHEAD`] items before the
//!   benchmark's clock starts (a run of at most that many requests makes all of them first,
//!   as before), then keeps at most [`AHEAD`] more ready, made [`PARALLEL`] at a time (prompt
//!   calibration calls the tokenizer: with the server's `/tokenize`, a long run's later
//!   prompts are calibrated while it runs). An item not ready at its send time delays the
//!   send: that shows as its `dispatch_delay_ms`.
//! - **Offsets.** Computed one at a time from the seed: a steady rate's random gaps are drawn
//!   twice (a first pass finds the scale that puts the last send at exactly `(n − 1) / rate`,
//!   see [`RunArrival`]), a ramp's follow its integral, a trace's are its own.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand_distr::{Distribution as _, Exp, Gamma};
use tokio::sync::mpsc;

use super::LoadError;
use super::arrival::RunArrival;
use super::dataset::PromptSet;
use super::images::SyntheticImages;
use super::prompts::{self, Prompt, TokenizeClient};
use super::shared_prefix::{Place, SharedPrefix};
use super::workload::{LengthDist, Ramp, RampOver, TraceReplay, Workload};

/// What the feed needs of a run: its workload, prompt count, output length and arrivals
/// (`lmperf run`'s `RunSpec::feed`, `lmperf ctl inject`'s load).
#[derive(Debug, Clone, Copy)]
pub struct FeedSpec<'a> {
    /// Length distributions, ramp, trace replay, prompt file, shared prefixes, images.
    pub workload: &'a Workload,
    /// Prompts per benchmark (`--num-prompts`): sizes the shared-prefix groups.
    pub num_prompts: usize,
    /// Output tokens asked of each request when no output distribution is set.
    pub output_len: u32,
    /// Requests per second; `None`: all at once.
    pub request_rate: Option<f64>,
    /// Gaps between scheduled sends.
    pub arrival: RunArrival,
}

/// Items made before a benchmark starts, and at most kept ready ahead of its sends after.
pub const AHEAD: usize = 1024;
/// Items made at once (each may wait for `/tokenize` calls).
pub const PARALLEL: usize = 8;

const INPUT_STREAM: u64 = 0x1A2B_3C4D_5E6F_7081;
const OUTPUT_STREAM: u64 = 0x5DEE_CE66_D1CE_4E5B;
const FILE_STREAM: u64 = 0x2545_F491_4F6C_DD1D;

/// One unit of work: a prompt and its output length, and for a multi-turn conversation the
/// later user turns (sent each after the previous answer, with the history).
#[derive(Debug, Clone)]
pub struct Item {
    pub prompt: Prompt,
    /// `max_tokens` (and `min_tokens` with ignore-EOS).
    pub max_tokens: u32,
    /// Later user turns with their token counts.
    pub next_turns: Vec<(String, u32)>,
    /// Multi-turn: counts each later turn's whole request (history and template) before it
    /// is sent; `None` otherwise.
    pub history_counter: Option<Arc<TokenizeClient>>,
    /// Images, a dataset row's own messages, the shared-prefix group.
    pub extras: Extras,
}

/// What a workload adds to an item beyond its prompt text.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// Image URLs (`data:` URLs of synthetic images, or a dataset row's), sent with the
    /// first user turn as `image_url` parts (chat).
    pub images: Vec<String>,
    /// Encoded bytes of the synthetic images.
    pub image_bytes: Option<u64>,
    /// `WxH` of the synthetic images.
    pub image_size: Option<String>,
    /// A dataset row's own chat messages, sent as they are.
    pub messages: Option<Vec<serde_json::Value>>,
    /// `--prefix-groups`: (group, first of its group, prefix tokens).
    pub prefix: Option<(u32, bool, u32)>,
}

impl Extras {
    /// The first user message with `text` and the images (`content` parts when there are
    /// images, else the text).
    pub fn user_message(&self, text: &str) -> serde_json::Value {
        serde_json::json!({ "role": "user", "content": self.content(text) })
    }

    fn content(&self, text: &str) -> serde_json::Value {
        if self.images.is_empty() {
            return serde_json::Value::from(text);
        }
        let mut parts = vec![serde_json::json!({ "type": "text", "text": text })];
        parts.extend(
            self.images
                .iter()
                .map(|u| serde_json::json!({ "type": "image_url", "image_url": { "url": u } })),
        );
        serde_json::Value::Array(parts)
    }

    /// The `messages` of a chat request of a single turn when the workload sets them (a
    /// dataset row's messages, with the images on its last user message; or one user message
    /// with images); `None`: the request's own one user message with `text`.
    pub fn chat_messages(&self, text: &str) -> Option<serde_json::Value> {
        match &self.messages {
            Some(m) => {
                let mut m = m.clone();
                if !self.images.is_empty()
                    && let Some(last) = m.iter_mut().rev().find(|x| x["role"] == "user")
                {
                    let t = last["content"].as_str().unwrap_or_default().to_owned();
                    last["content"] = self.content(&t);
                }
                Some(serde_json::Value::Array(m))
            }
            None if !self.images.is_empty() => {
                Some(serde_json::Value::Array(vec![self.user_message(text)]))
            }
            None => None,
        }
    }
}

impl Item {
    /// The prompt of a later turn `text` (`text_tokens`: its own count) sent with `messages`
    /// (the history and this turn): its `tokens` are the whole request's by the run's
    /// counting ([`TokenizeClient::count_messages`]), else the turn's own count.
    pub async fn next_turn_prompt(
        &self,
        messages: &[serde_json::Value],
        text: String,
        text_tokens: u32,
    ) -> Prompt {
        let counted = match &self.history_counter {
            Some(tok) => tok
                .count_messages(messages)
                .await
                .map(|n| (n, tok.source())),
            None => None,
        };
        let (tokens, source) =
            counted.unwrap_or((text_tokens, prompts::PromptTokensSource::TextOnly));
        Prompt {
            text,
            target_tokens: tokens,
            tokens,
            source,
        }
    }
}

/// Text of Mooncake blocks already made: (hash id, tokens) → (text, tokens by the tokenizer).
type Blocks = HashMap<(u64, u32), (String, u32)>;

/// What every item of a source shares.
struct Shared {
    tok: TokenizeClient,
    /// Multi-turn chat: the counter of later turns (see [`Item::history_counter`]).
    history_counter: Option<Arc<TokenizeClient>>,
    trace: Option<TraceReplay>,
    file: Option<Arc<PromptSet>>,
    blocks: Mutex<Blocks>,
    seed: u64,
    /// `--prefix-len`: the workload and its requests per group.
    prefix: Option<(SharedPrefix, usize)>,
    images: Option<SyntheticImages>,
}

/// What item `i` is, decided in index order (cheap); [`make`] then makes it.
enum Plan {
    /// A synthetic prompt of this many tokens.
    Synthetic(u32),
    /// The trace's request `i`.
    Trace,
    /// This conversation of the prompt file.
    File(usize),
    /// A shared-prefix prompt of this many tokens in all, at this place.
    Prefixed(u32, Place),
}

/// The items of one benchmark, `n` of them (for a trace: its first `n` requests), from `seed`.
pub struct ItemSource {
    shared: Arc<Shared>,
    /// Global index of the first item, of the next, and one past the last.
    start: usize,
    next: usize,
    end: usize,
    input_len: u32,
    output_len: u32,
    input_dist: Option<(LengthDist, SmallRng)>,
    output_dist: Option<(LengthDist, SmallRng)>,
    order: Vec<usize>,
}

impl ItemSource {
    /// The source of `n` items of `spec`'s workload (`input_len` for fixed lengths).
    pub fn new(
        spec: &FeedSpec<'_>,
        tok: &TokenizeClient,
        n: usize,
        input_len: u32,
        seed: u64,
    ) -> Self {
        let w = spec.workload;
        let n = match &w.trace {
            Some(t) => n.min(t.trace.requests.len()),
            None => n,
        };
        let mut order = Vec::new();
        if let Some(f) = w.prompt_file.as_ref().filter(|_| w.trace.is_none()) {
            // A seeded shuffle of the file, cycled when more prompts are wanted than it holds.
            order = (0..f.conversations.len()).collect();
            order.shuffle(&mut SmallRng::seed_from_u64(seed ^ FILE_STREAM));
        }
        Self {
            shared: Arc::new(Shared {
                tok: tok.clone(),
                history_counter: (w.multi_turn && tok.chat.is_some())
                    .then(|| Arc::new(tok.clone())),
                trace: w.trace.clone(),
                file: w.prompt_file.clone(),
                blocks: Mutex::new(Blocks::new()),
                seed,
                prefix: w
                    .shared_prefix
                    .filter(|_| w.trace.is_none() && w.prompt_file.is_none())
                    .map(|p| (p, p.per_group(spec.num_prompts))),
                images: w.images,
            }),
            start: 0,
            next: 0,
            end: n,
            input_len,
            output_len: spec.output_len,
            input_dist: w
                .input_dist
                .map(|d| (d, SmallRng::seed_from_u64(seed ^ INPUT_STREAM))),
            output_dist: w
                .output_dist
                .map(|d| (d, SmallRng::seed_from_u64(seed ^ OUTPUT_STREAM))),
            order,
        }
    }

    /// Items the source makes in all.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether it makes none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Leaves out the first `k` items (those of the warm-up, drawn from the same seed): the
    /// rest are the items they would have been with the warm-up's.
    pub fn skip(mut self, k: usize) -> Self {
        for _ in 0..k {
            if self.plan().is_none() {
                break;
            }
        }
        self.start = self.next;
        self
    }

    /// The next item's plan, its global index and `max_tokens`; `None` after the last.
    fn plan(&mut self) -> Option<(usize, Plan, u32)> {
        if self.next >= self.end {
            return None;
        }
        let i = self.next;
        self.next += 1;
        let sh = &self.shared;
        let (plan, trace_output) = if let Some(t) = &sh.trace {
            (
                Plan::Trace,
                t.trace.requests.get(i).map(|r| r.output_tokens),
            )
        } else if !self.order.is_empty() {
            let c = self.order[i % self.order.len()];
            // A dataset row's own output length.
            let row_output = sh
                .file
                .as_ref()
                .and_then(|f| f.conversations.get(c))
                .and_then(|c| c.output_len);
            (Plan::File(c), row_output)
        } else if let Some((d, rng)) = &mut self.input_dist {
            (
                Plan::Synthetic(
                    d.sample_n(rng, 1)
                        .first()
                        .copied()
                        .unwrap_or(self.input_len),
                ),
                None,
            )
        } else {
            (Plan::Synthetic(self.input_len), None)
        };
        let plan = match (plan, sh.prefix) {
            (Plan::Synthetic(len), Some((p, per_group))) => {
                Plan::Prefixed(len, p.place(i, per_group))
            }
            (plan, _) => plan,
        };
        let max_tokens = match (&mut self.output_dist, trace_output) {
            // A dataset row's output length wins over --output-dist.
            (Some(_), Some(t)) if matches!(plan, Plan::File(_)) => t,
            (Some((d, rng)), _) => d
                .sample_n(rng, 1)
                .first()
                .copied()
                .unwrap_or(self.output_len),
            (None, Some(t)) => t,
            (None, None) => self.output_len,
        };
        Some((i, plan, max_tokens))
    }

    /// Starts making the items: returns once the first [`AHEAD`] (or all) are made; the rest
    /// are made on the runtime while the benchmark runs, at most [`AHEAD`] ahead of it.
    pub async fn start(mut self) -> Feed {
        let n = self.len();
        let (tx, mut rx) = mpsc::channel::<Item>(AHEAD);
        let producer = tokio::spawn(async move {
            let mut making: VecDeque<tokio::task::JoinHandle<Item>> =
                VecDeque::with_capacity(PARALLEL);
            loop {
                while making.len() < PARALLEL
                    && let Some((i, plan, max_tokens)) = self.plan()
                {
                    making.push_back(tokio::spawn(make(self.shared.clone(), i, plan, max_tokens)));
                }
                let Some(next) = making.pop_front() else {
                    return;
                };
                let Ok(item) = next.await else { return };
                if tx.send(item).await.is_err() {
                    making.iter().for_each(tokio::task::JoinHandle::abort);
                    return;
                }
            }
        });
        let mut ready = VecDeque::with_capacity(n.min(AHEAD));
        while ready.len() < n.min(AHEAD) {
            match rx.recv().await {
                Some(item) => ready.push_back(item),
                None => break,
            }
        }
        Feed {
            n,
            ready,
            rx,
            producer,
        }
    }
}

/// Makes the item of `plan` (calibrating prompts with the tokenizer).
async fn make(sh: Arc<Shared>, i: usize, plan: Plan, max_tokens: u32) -> Item {
    let mut extras = Extras::default();
    let (prompt, next_turns) = match plan {
        Plan::Synthetic(len) => (one_prompt(&sh.tok, len, sh.seed, i).await, Vec::new()),
        Plan::Prefixed(len, place) => {
            let (p, prefix_tokens) = prefix_prompt(&sh, len, place, i).await;
            extras.prefix = Some((place.group, place.first, prefix_tokens));
            (p, Vec::new())
        }
        Plan::Trace => {
            let Some(t) = &sh.trace else {
                return Item {
                    prompt: empty(0),
                    max_tokens,
                    next_turns: Vec::new(),
                    history_counter: None,
                    extras,
                };
            };
            let len = t.trace.requests.get(i).map_or(1, |r| r.input_tokens);
            let p = match t.trace.hash_ids.get(i).filter(|h| !h.is_empty()) {
                Some(ids) => block_prompt(&sh, ids, len, i).await,
                None => one_prompt(&sh.tok, len, sh.seed, i).await,
            };
            (p, Vec::new())
        }
        Plan::File(c) => {
            let conversation = sh.file.as_ref().and_then(|f| f.conversations.get(c));
            let turns_text = conversation.map(|c| c.turns.clone()).unwrap_or_default();
            if let Some(conv) = conversation {
                extras.images.clone_from(&conv.images);
                // A row's own messages are one chat request (counted with its template).
                if let (Some(m), Some(_)) = (&conv.messages, &sh.tok.chat) {
                    extras.messages = Some(m.clone());
                    let text = turns_text.join("\n");
                    let (tokens, source) = match sh.tok.count_messages(m).await {
                        Some(n) => (n, sh.tok.source()),
                        None => (
                            prompts::estimated_count(&text),
                            prompts::PromptTokensSource::Estimate,
                        ),
                    };
                    let prompt = Prompt {
                        text,
                        target_tokens: tokens,
                        tokens,
                        source,
                    };
                    return finish(&sh, i, prompt, max_tokens, Vec::new(), extras);
                }
            }
            let mut turns = Vec::with_capacity(turns_text.len());
            for t in turns_text {
                let c = sh.tok.count(&t).await.unwrap_or(0);
                turns.push((t, c));
            }
            if turns.is_empty() {
                (empty(0), turns)
            } else {
                let (text, _) = turns.remove(0);
                // The whole first request (for chat: with its template).
                let (tokens, source) = match sh.tok.count_prompt(&text).await {
                    Some(n) => (n, sh.tok.source()),
                    None => (
                        prompts::estimated_count(&text),
                        prompts::PromptTokensSource::Estimate,
                    ),
                };
                (
                    Prompt {
                        text,
                        target_tokens: tokens,
                        tokens,
                        source,
                    },
                    turns,
                )
            }
        }
    };
    finish(&sh, i, prompt, max_tokens, next_turns, extras)
}

/// The item, with `--images-per-request` synthetic images added.
fn finish(
    sh: &Shared,
    i: usize,
    prompt: Prompt,
    max_tokens: u32,
    next_turns: Vec<(String, u32)>,
    mut extras: Extras,
) -> Item {
    if let Some(img) = &sh.images {
        let mut bytes = 0u64;
        for k in 0..img.per_request {
            // A valid size always encodes; an image that did not is left out (the row's
            // `images` counts those sent).
            if let Ok(e) = img.image(sh.seed, i, k) {
                bytes += e.bytes as u64;
                extras.images.push(e.data_url);
            }
        }
        extras.image_bytes = Some(bytes);
        extras.image_size = Some(img.size_label());
    }
    Item {
        prompt,
        max_tokens,
        next_turns,
        history_counter: sh.history_counter.clone(),
        extras,
    }
}

/// Key space of the shared prefixes' text in [`Shared::blocks`] (apart from Mooncake ids).
const PREFIX_KEY: u64 = 0x5348_4152_4544_0000;

/// A shared-prefix prompt of `len` tokens in all (for chat, with the template): its group's
/// prefix of [`SharedPrefix::len`] tokens (the same text for every request of the group, made
/// from the seed and the group alone), then a suffix of this request alone. Returns the
/// prompt and the prefix's tokens as the tokenizer counts them.
async fn prefix_prompt(sh: &Shared, len: u32, place: Place, i: usize) -> (Prompt, u32) {
    let tok = &sh.tok;
    let n = sh.prefix.map_or(1, |(p, _)| p.len);
    let key = (PREFIX_KEY ^ u64::from(place.group), n);
    let known = sh.blocks.lock().ok().and_then(|b| b.get(&key).cloned());
    let (prefix, prefix_tokens) = match known {
        Some(b) => b,
        None => {
            let seed =
                sh.seed ^ PREFIX_KEY ^ u64::from(place.group).wrapping_mul(0xA24B_AED4_963E_E407);
            let p = one_prompt(tok, n, seed, 0).await;
            if let Ok(mut b) = sh.blocks.lock() {
                b.insert(key, (p.text.clone(), p.tokens));
            }
            (p.text, p.tokens)
        }
    };
    let overhead = if tok.chat.is_some() {
        tok.count_prompt("").await.unwrap_or(0)
    } else {
        0
    };
    let rest = len.saturating_sub(overhead + prefix_tokens).max(1);
    let suffix = one_prompt(tok, rest, sh.seed, i).await;
    let text = format!("{prefix} {}", suffix.text);
    let (tokens, source) = match tok.count_prompt(&text).await {
        Some(n) => (n, tok.source()),
        None => (
            prompts::estimated_count(&text),
            prompts::PromptTokensSource::Estimate,
        ),
    };
    (
        Prompt {
            text,
            target_tokens: len,
            tokens,
            source,
        },
        prefix_tokens,
    )
}

fn empty(len: u32) -> Prompt {
    Prompt {
        text: String::new(),
        target_tokens: len,
        tokens: 0,
        source: prompts::PromptTokensSource::Estimate,
    }
}

/// A Mooncake request's prompt from its `hash_ids`: block k is the text of hash id `ids[k]`
/// ([`super::trace::MOONCAKE_BLOCK_TOKENS`] tokens, the last block the rest of `len`), the
/// same text wherever that id appears in the replay (made from the seed and the id alone, so
/// two items made at once agree), so requests that share ids share a prompt prefix and a
/// server's prefix cache hits as in the real trace. Tokens beyond the ids' blocks (a trace
/// whose ids are short) come from a prompt of this request alone.
async fn block_prompt(sh: &Shared, ids: &[u64], len: u32, i: usize) -> Prompt {
    let tok = &sh.tok;
    // Chat: the template's own tokens come off the last block (or the rest), so the whole
    // request has the trace's length; the blocks are text (counted without the template).
    let overhead = if tok.chat.is_some() {
        tok.count_prompt("").await.unwrap_or(0)
    } else {
        0
    };
    let (mut text, mut tokens, mut left) =
        (String::new(), 0u32, len.saturating_sub(overhead).max(1));
    for &id in ids {
        if left == 0 {
            break;
        }
        let n = left.min(super::trace::MOONCAKE_BLOCK_TOKENS);
        left -= n;
        let known = sh.blocks.lock().ok().and_then(|b| b.get(&(id, n)).cloned());
        let (t, c) = match known {
            Some(b) => b,
            None => {
                let p = one_prompt(
                    &sh.tok,
                    n,
                    sh.seed ^ id.wrapping_mul(0x9FB2_1C65_1E98_DF25),
                    0,
                )
                .await;
                if let Ok(mut b) = sh.blocks.lock() {
                    b.insert((id, n), (p.text.clone(), p.tokens));
                }
                (p.text, p.tokens)
            }
        };
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&t);
        tokens += c;
    }
    if left > 0 {
        let rest = one_prompt(&sh.tok, left, sh.seed, i).await;
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&rest.text);
        tokens += rest.tokens;
    }
    let mut source = tok.source();
    if tok.chat.is_some() {
        // The whole templated request, counted as it is sent.
        match tok.count_prompt(&text).await {
            Some(n) => tokens = n,
            None => source = prompts::PromptTokensSource::Estimate,
        }
    }
    Prompt {
        text,
        target_tokens: len,
        tokens,
        source,
    }
}

/// One synthetic prompt of `len` tokens, distinct per `(seed, i)`.
async fn one_prompt(tok: &TokenizeClient, len: u32, seed: u64, i: usize) -> Prompt {
    let s = seed
        ^ (i as u64)
            .wrapping_mul(0xD134_2543_DE82_EF95)
            .rotate_left(17);
    let mut p = prompts::synthetic(tok, 1, len, s).await;
    p.pop().unwrap_or_else(|| empty(len))
}

/// The items of a running benchmark, in order; dropped, it stops making them.
pub struct Feed {
    n: usize,
    ready: VecDeque<Item>,
    rx: mpsc::Receiver<Item>,
    producer: tokio::task::JoinHandle<()>,
}

impl Feed {
    /// Items in all.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The next item, waiting for it (call off the runtime: the dispatcher thread); `None`
    /// after the last.
    pub fn next_blocking(&mut self) -> Option<Item> {
        self.ready.pop_front().or_else(|| self.rx.blocking_recv())
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.producer.abort();
    }
}

/// Gaps between arrivals, in seconds (of the steady rate, or of the ramp's integral).
#[derive(Debug, Clone, Copy)]
enum Gap {
    Constant(f64),
    Exp(Exp<f64>),
    Gamma(Gamma<f64>),
}

impl Gap {
    fn sample(&self, rng: &mut SmallRng) -> f64 {
        match self {
            Gap::Constant(g) => *g,
            Gap::Exp(e) => e.sample(rng),
            Gap::Gamma(g) => g.sample(rng),
        }
    }
}

#[derive(Debug, Clone)]
enum Shape {
    /// Every offset 0: all at once (closed loop), the warm-up.
    Zero,
    Trace(TraceReplay),
    /// Steady rate: `t += gap`, scaled by `scale`.
    Steady {
        gap: Gap,
        rng: SmallRng,
        t: Duration,
        scale: Option<f64>,
    },
    /// Rate ramp: the time at which the ramp's integral reaches `x`, `x += gap`.
    Ramp {
        ramp: Ramp,
        gap: Gap,
        rng: SmallRng,
        x: f64,
    },
}

/// The send offsets of one benchmark, from its start, one at a time (an iterator of `n`).
#[derive(Debug, Clone)]
pub struct Schedule {
    shape: Shape,
    n: usize,
    i: usize,
    closed_loop: bool,
}

impl Schedule {
    /// `n` offsets of 0 (everything due at once: each request waits for a free slot).
    pub fn zero(n: usize) -> Self {
        Self {
            shape: Shape::Zero,
            n,
            i: 0,
            closed_loop: true,
        }
    }

    /// The offsets of a measured benchmark of `n` items: the trace's, the rate ramp's, or the
    /// steady rate's (`--request-rate`, `--arrival`; none: all at once).
    ///
    /// # Errors
    /// A rate or gamma shape the distributions refuse (names `--request-rate`).
    pub fn new(spec: &FeedSpec<'_>, n: usize, seed: u64) -> Result<Self, LoadError> {
        if let Some(t) = &spec.workload.trace {
            let closed_loop = t
                .trace
                .requests
                .iter()
                .take(n)
                .all(|r| r.at_speedup(t.speedup).is_zero());
            return Ok(Self {
                shape: Shape::Trace(t.clone()),
                n,
                i: 0,
                closed_loop,
            });
        }
        if let Some(r) = spec.workload.ramp.filter(|r| r.over == RampOver::Rate) {
            return Ok(Self::ramp(r, spec.arrival, n, seed));
        }
        match spec.request_rate {
            Some(rate) => Self::steady(rate, spec.arrival, n, seed),
            None => Ok(Self::zero(n)),
        }
    }

    /// `n` offsets at `rate` requests per second with `arrival` gaps.
    ///
    /// # Errors
    /// A rate or gamma shape the distributions refuse (names `--request-rate`).
    pub fn steady(rate: f64, arrival: RunArrival, n: usize, seed: u64) -> Result<Self, LoadError> {
        let invalid = |e: String| LoadError::Invalid {
            field: "--request-rate",
            value: rate.to_string(),
            reason: e,
        };
        let exp = Exp::new(rate).map_err(|e| invalid(e.to_string()))?;
        let gap = match arrival {
            RunArrival::Constant => Gap::Constant(1.0 / rate),
            RunArrival::Poisson => Gap::Exp(exp),
            RunArrival::Gamma(shape) => Gap::Gamma(
                Gamma::new(shape, 1.0 / (rate * shape)).map_err(|e| invalid(e.to_string()))?,
            ),
        };
        let mut s = Self {
            shape: Shape::Steady {
                gap,
                rng: SmallRng::seed_from_u64(seed),
                t: Duration::ZERO,
                scale: None,
            },
            n,
            i: 0,
            closed_loop: n <= 1,
        };
        // Random gaps: scale them so the last send is at exactly (n − 1) / rate. For Poisson
        // this is the Poisson process conditioned on n arrivals in that time (its arrival
        // times are then uniform order statistics and its gaps still exponential), so the
        // run's rate is the requested one, not a sample of it (±1/√n).
        if !matches!(gap, Gap::Constant(_)) && n > 1 {
            let last = s.clone().last().unwrap_or_default();
            s.closed_loop = last.is_zero();
            if !last.is_zero() {
                let want = (n - 1) as f64 / rate;
                if let Shape::Steady { scale, .. } = &mut s.shape {
                    *scale = Some(want / last.as_secs_f64());
                }
            }
        }
        Ok(s)
    }

    /// `n` offsets of a rate ramp: the i-th send where the ramp's integral reaches the i-th
    /// arrival of a unit-rate process with `arrival` gaps ([`Ramp`]).
    pub fn ramp(ramp: Ramp, arrival: RunArrival, n: usize, seed: u64) -> Self {
        let gap = match arrival {
            RunArrival::Constant => Gap::Constant(1.0),
            RunArrival::Poisson => Exp::new(1.0).map_or(Gap::Constant(1.0), Gap::Exp),
            RunArrival::Gamma(k) => Gamma::new(k, 1.0 / k).map_or(Gap::Constant(1.0), Gap::Gamma),
        };
        Self {
            shape: Shape::Ramp {
                ramp,
                gap,
                rng: SmallRng::seed_from_u64(seed),
                x: 0.0,
            },
            n,
            i: 0,
            closed_loop: n <= 1,
        }
    }

    /// Every offset is 0 (no rate, no trace times): requests go as slots free (closed loop).
    pub fn closed_loop(&self) -> bool {
        self.closed_loop
    }

    /// Offsets in all.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

impl Iterator for Schedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.i >= self.n {
            return None;
        }
        let i = self.i;
        self.i += 1;
        Some(match &mut self.shape {
            Shape::Zero => Duration::ZERO,
            Shape::Trace(t) => t
                .trace
                .requests
                .get(i)
                .map_or(Duration::ZERO, |r| r.at_speedup(t.speedup)),
            Shape::Steady { gap, rng, t, scale } => {
                if i > 0 {
                    *t += Duration::from_secs_f64(gap.sample(rng));
                }
                scale.map_or(*t, |k| t.mul_f64(k))
            }
            Shape::Ramp { ramp, gap, rng, x } => {
                if i > 0 {
                    *x += gap.sample(rng);
                }
                Duration::from_secs_f64(ramp.inverse(*x).max(0.0))
            }
        })
    }
}

impl Ramp {
    /// Send offsets of `n` requests with `arrival` gaps (in units of the ramp's integral).
    pub fn offsets(&self, n: usize, arrival: RunArrival, seed: u64) -> Vec<Duration> {
        Schedule::ramp(*self, arrival, n, seed).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steady(
        rate: Option<f64>,
        arrival: RunArrival,
        n: usize,
        seed: u64,
    ) -> Result<Schedule, LoadError> {
        match rate {
            Some(r) => Schedule::steady(r, arrival, n, seed),
            None => Ok(Schedule::zero(n)),
        }
    }

    #[test]
    fn steady_offsets_end_at_the_rate_and_repeat_from_the_seed() {
        for arrival in [
            RunArrival::Poisson,
            RunArrival::Gamma(0.5),
            RunArrival::Constant,
        ] {
            let s = steady(Some(200.0), arrival, 1001, 7).unwrap();
            assert!(!s.closed_loop());
            let v: Vec<Duration> = s.collect();
            assert_eq!(v.len(), 1001);
            assert_eq!(v[0], Duration::ZERO);
            assert!(v.windows(2).all(|w| w[0] <= w[1]), "{arrival:?}");
            assert!(
                (v[1000].as_secs_f64() - 5.0).abs() < 1e-6,
                "{arrival:?}: last at {:?}",
                v[1000]
            );
            assert_eq!(
                v,
                steady(Some(200.0), arrival, 1001, 7)
                    .unwrap()
                    .collect::<Vec<_>>()
            );
        }
        let a: Vec<Duration> = steady(Some(200.0), RunArrival::Poisson, 50, 1)
            .unwrap()
            .collect();
        let b: Vec<Duration> = steady(Some(200.0), RunArrival::Poisson, 50, 2)
            .unwrap()
            .collect();
        assert_ne!(a, b);
        let z = steady(None, RunArrival::Poisson, 3, 1).unwrap();
        assert!(z.closed_loop());
        assert_eq!(z.collect::<Vec<_>>(), [Duration::ZERO; 3]);
        assert!(
            steady(Some(5.0), RunArrival::Poisson, 1, 1)
                .unwrap()
                .closed_loop(),
            "one send at 0"
        );
        let e = steady(Some(-1.0), RunArrival::Poisson, 3, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--request-rate"), "{e}");
    }

    /// A long schedule is an iterator, not a vector of its offsets.
    #[test]
    fn a_long_schedule_is_not_stored() {
        let s = steady(Some(2000.0), RunArrival::Poisson, 1_000_000, 3).unwrap();
        assert!(std::mem::size_of_val(&s) < 512);
        let last = s.last().unwrap();
        assert!(
            (last.as_secs_f64() - 999_999.0 / 2000.0).abs() < 1e-3,
            "{last:?}"
        );
    }
}
