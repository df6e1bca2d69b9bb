//! The benchmarks' statistics over sorted samples.

/// Nearest rank: the smallest sample with at least `p` of them at or below it.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}
