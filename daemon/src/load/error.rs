//! The load layer's error: a bad value given for a load setting.

/// A load setting whose value cannot be used; `lmperf run` reports it as
/// `BenchError::Invalid` (same text).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// `field` (a flag such as `--chat-template`) has `value`, unusable for `reason`.
    #[error("bad value {field} = {value:?}: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: String,
    },
}
