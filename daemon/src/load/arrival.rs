//! How a run's sends are spaced in time: the gaps between scheduled sends.

/// Gaps between scheduled sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunArrival {
    Poisson,
    /// Gamma-distributed gaps with this shape (burstiness; 1 = Poisson, < 1 burstier).
    Gamma(f64),
    Constant,
}
