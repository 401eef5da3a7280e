//! The one percentile definition and the one Gaussian negative log-likelihood of the crate.

/// ½·ln(2π), the constant of the Gaussian negative log-likelihood.
pub const HALF_LN_2PI: f64 = 0.918_938_533_204_672_8;

/// The `q`-quantile (`0 ≤ q ≤ 1`) of ascending `sorted` values by the **nearest-rank**
/// definition: the smallest value with at least `q·n` values at or below it (index
/// `⌈q·n⌉ − 1`, clamped to the sample). Every latency figure kiln reports (training runs,
/// `kiln bench`, `kiln loadtest`) uses this one definition. NaN for an empty sample.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Gaussian negative log-likelihood of `y` under N(`mean`, exp(`log_var`)), **without** the
/// constant ½·ln(2π) (add [`HALF_LN_2PI`] for the full value): ½·(log σ² + (y − μ)²/σ²).
/// The stage-2 training loss is its mean in normalised units.
pub fn gaussian_nll(y: f64, mean: f64, log_var: f64) -> f64 {
    0.5 * (log_var + (y - mean).powi(2) * (-log_var).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[7.0], 0.5), 7.0);
        assert!(percentile(&[], 0.5).is_nan());
        // Nearest rank never interpolates: p50 of two values is the lower one.
        assert_eq!(percentile(&[1.0, 3.0], 0.5), 1.0);
    }

    #[test]
    fn standard_normal_nll_at_the_mean() {
        assert!((gaussian_nll(0.0, 0.0, 0.0) + HALF_LN_2PI - HALF_LN_2PI).abs() < 1e-15);
        // σ² = e: ½(1 + 4/e) at one residual of 2.
        let want = 0.5 * (1.0 + 4.0 / std::f64::consts::E);
        assert!((gaussian_nll(3.0, 1.0, 1.0) - want).abs() < 1e-12);
    }
}
