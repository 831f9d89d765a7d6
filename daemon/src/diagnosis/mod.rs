//! Root-cause diagnosis: what moved with a P99 spike, ranked, with its evidence.
//!
//! - [`detector`]: the robust per-bucket baseline and jump detector, shared by the adaptive
//!   sampler's spike mode and the diagnosis's symptom detection.
//!
//! **Architecture Invariant:** pure, like `measure/`: no clock, no socket, no file. Callers
//! pass the times; everything is testable on recorded series in milliseconds.

pub mod detector;
