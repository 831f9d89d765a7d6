//! The load layer shared by `lmperf run` ([`crate::bench`]) and `lmperf ctl inject`
//! ([`crate::control`]): what is sent, not how it is measured. One direction, each module
//! importing only those before it: datasets and traces ([`dataset`], [`datasets`], [`trace`]) →
//! workloads and arrival schedules ([`workload`], [`profile`], [`shared_prefix`], [`images`]) → tokenizers ([`tokens`]) →
//! chat templates ([`chat_template`]) → prompts ([`prompts`]); the benchmark's feed
//! (`load::feed`: items and send times) and the agent's injected loads (`control::load`) consume them. Neither
//! `bench` nor `control` is imported here.

pub mod arrival;
pub mod chat_template;
pub mod dataset;
pub mod datasets;
pub mod error;
pub mod feed;
pub mod images;
pub mod profile;
pub mod prompts;
pub mod shared_prefix;
pub mod tokens;
pub mod trace;
pub mod workload;

pub use error::LoadError;
