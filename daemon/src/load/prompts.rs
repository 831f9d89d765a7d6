//! Synthetic prompts of an exact token length.
//!
//! Text is drawn from a fixed word list with a seeded generator (same seed, same prompts), with
//! a per-prompt random head so prompts share no prefix (no prefix-cache hits). The length is
//! calibrated against the model's tokenizer, searching the word count whose token count equals
//! the target: a local `tokenizer.json` when `--tokenizer` names one (Hugging Face `tokenizers`),
//! else the server's own `POST /tokenize` (llama.cpp: `{"content"}`; vLLM / SGLang:
//! `{"model", "prompt"}`). Without either the length is an estimate (0.75 words per token) and
//! the summary says so.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

pub use super::tokens::{
    LocalTokenizer, PromptTokensSource, TokenizeClient, Tokenizer, estimated_count,
};

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
            (estimated_count(&t), t)
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
                estimated_count(&text).abs_diff(tokens) <= 1,
                "{tokens}: {}",
                estimated_count(&text)
            );
        }
        assert_eq!(estimated(200, 1), estimated(200, 1));
        assert_ne!(estimated(200, 1), estimated(200, 2));
    }
}
