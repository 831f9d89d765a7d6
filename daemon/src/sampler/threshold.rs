//! Sampling probability as the OpenTelemetry `tracestate` threshold (`ot=th:`), from the
//! OpenTelemetry specification "TraceState: Probability Sampling": a span is kept when the
//! 56 random bits of its trace id (the last 7 bytes, W3C Trace Context Level 2 random flag)
//! are ≥ the rejection threshold `T = (1 − p) × 2^56`, written as up to 14 hex digits with
//! trailing zeros removed (`th:0` = always kept).

/// 2^56: the size of the randomness space.
pub const MAX_THRESHOLD: u64 = 1 << 56;

/// Rejection threshold for keep probability `p` (clamped to [0, 1]).
pub fn threshold(p: f64) -> u64 {
    let p = p.clamp(0.0, 1.0);
    // Subtract the kept share from 2^56: exact for small p, where (1 − p) × 2^56 would lose bits.
    let kept = (p * MAX_THRESHOLD as f64).round() as u64;
    (MAX_THRESHOLD - kept.min(MAX_THRESHOLD)).min(MAX_THRESHOLD - 1)
}

/// The `th` value: 14 hex digits, trailing zeros removed, `0` for "always".
pub fn encode(t: u64) -> String {
    if t == 0 {
        return "0".to_owned();
    }
    let s = format!("{t:014x}");
    s.trim_end_matches('0').to_owned()
}

/// The 56 random bits of a trace id.
pub fn randomness(trace_id: u128) -> u64 {
    (trace_id as u64) & (MAX_THRESHOLD - 1)
}

/// Whether a trace is kept at probability `p`, consistently with its threshold.
pub fn keeps(trace_id: u128, p: f64) -> bool {
    randomness(trace_id) >= threshold(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_examples() {
        // 100 % → th:0, 50 % → th:8, 25 % → th:c (the spec's examples); 10 % and 1 % as 14 digits.
        assert_eq!(encode(threshold(1.0)), "0");
        assert_eq!(encode(threshold(0.5)), "8");
        assert_eq!(encode(threshold(0.25)), "c");
        assert_eq!(encode(threshold(0.1)), "e6666666666666");
        assert_eq!(encode(threshold(0.01)), "fd70a3d70a3d71");
    }

    #[test]
    fn keeps_about_p_of_random_ids() {
        let mut x: u128 = 0x1234_5678_9abc_def0_0fed_cba9_8765_4321;
        let mut kept = 0;
        for _ in 0..100_000 {
            x = x
                .wrapping_mul(0x2360_ED05_1FC6_5DA4_4385_DF64_9FCC_F645)
                .wrapping_add(0x5851_F42D_4C95_7F2D_1405_7B7E_F767_814F);
            kept += keeps(x, 0.1) as u32;
        }
        assert!((9_500..10_500).contains(&kept), "kept {kept}");
    }
}
