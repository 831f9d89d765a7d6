//! The built-in canary prompts: ten short first-turn questions from MT-Bench
//! (lm-sys/FastChat, `fastchat/llm_judge/data/mt_bench/question.jsonl` at commit
//! 0e6d3e4beaab66f4d3f93db72541a4abab8af28d, Apache-2.0), kept verbatim with their
//! `question_id`. Short prompts keep prefill small, so TTFT tracks the server's health rather
//! than the prompt.

/// One canary prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prompt {
    /// `mtbench-<question_id>`, exported as `lmperf.prompt.id`.
    pub id: &'static str,
    pub text: &'static str,
}

pub const BUILTIN: &[Prompt] = &[
    Prompt {
        id: "mtbench-120",
        text: "Given that f(x) = 4x^3 - 9x - 14, find the value of f(2).",
    },
    Prompt {
        id: "mtbench-117",
        text: "How many integers are in the solution of the inequality |x + 5| < 10",
    },
    Prompt {
        id: "mtbench-159",
        text: "What are some business etiquette norms when doing business in Japan?",
    },
    Prompt {
        id: "mtbench-122",
        text: "Write a C++ program to find the nth Fibonacci number using recursion.",
    },
    Prompt {
        id: "mtbench-152",
        text: "How do the stages of life shape our understanding of time and mortality?",
    },
    Prompt {
        id: "mtbench-108",
        text: "Which word does not belong with the others?\ntyre, steering wheel, car, engine",
    },
    Prompt {
        id: "mtbench-157",
        text: "Describe five key principles in evaluating an argument in analytical writing.",
    },
    Prompt {
        id: "mtbench-107",
        text: "A is the father of B. B is the father of C. What is the relationship between A and C?",
    },
    Prompt {
        id: "mtbench-104",
        text: "David has three sisters. Each of them has one brother. How many brothers does David have?",
    },
    Prompt {
        id: "mtbench-144",
        text: "What is the central dogma of molecular biology? What processes are involved? Who named this?",
    },
];

/// The prompt for the `n`-th canary of a target (round robin).
pub fn nth(n: u64) -> Prompt {
    BUILTIN[(n % BUILTIN.len() as u64) as usize]
}
