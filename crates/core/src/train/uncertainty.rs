//! The maths that judges a Gaussian regression head: point errors (RMSE, MAE, R²), proper
//! scores (Gaussian NLL, CRPS), central-interval coverage, the probability integral transform
//! (PIT) and its calibration error, sharpness, and the post-hoc variance scale.
//!
//! Every function takes optional per-row weights (`None` = every row weighs 1); a weighted
//! mean is `Σ wᵢ vᵢ / Σ wᵢ`. Values are in whatever units the caller passes (kiln passes
//! original units).
//!
//! **Calibration error** is the miscalibration area of the PIT: with `uᵢ = Φ((yᵢ − μᵢ)/σᵢ)`,
//! the mean over the levels `p = 0.01, 0.02, …, 0.99` of `|F̂(p) − p|`, where `F̂(p)` is the
//! weighted fraction of rows with `uᵢ ≤ p`. 0 is perfectly calibrated; a head whose σ is far
//! too small (or far too large) approaches 0.25, one whose mean is far off approaches 0.5.

use kiln_mvn::normal::{norm_cdf, norm_ppf};

use crate::util::HALF_LN_2PI;

/// Nominal central-interval coverages reported (50, 80, 90 and 95 %).
pub const COVERAGE_LEVELS: [f64; 4] = [0.5, 0.8, 0.9, 0.95];

/// Nominal levels of the reliability curve (central-interval coverage).
pub const CURVE_LEVELS: [f64; 11] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99];

/// Bins of the PIT histogram.
pub const PIT_BINS: usize = 10;

/// 1/√π.
const FRAC_1_SQRT_PI: f64 = 0.564_189_583_547_756_3;

/// The standard normal density φ(z).
pub fn norm_pdf(z: f64) -> f64 {
    (-0.5 * z * z - HALF_LN_2PI).exp()
}

fn weight(w: Option<&[f64]>, i: usize) -> f64 {
    w.map_or(1.0, |w| w[i])
}

/// Weighted mean of `f(i)` over `n` rows (NaN when the weights sum to zero).
fn wmean(n: usize, w: Option<&[f64]>, f: impl Fn(usize) -> f64) -> f64 {
    let (mut s, mut sw) = (0.0, 0.0);
    for i in 0..n {
        let wi = weight(w, i);
        s += wi * f(i);
        sw += wi;
    }
    if sw > 0.0 { s / sw } else { f64::NAN }
}

/// Mean squared error of `pred` against `y`.
pub fn mse(y: &[f64], pred: &[f64], w: Option<&[f64]>) -> f64 {
    wmean(y.len(), w, |i| (y[i] - pred[i]).powi(2))
}

/// Root mean squared error of `pred` against `y`.
pub fn rmse(y: &[f64], pred: &[f64], w: Option<&[f64]>) -> f64 {
    mse(y, pred, w).sqrt()
}

/// Mean absolute error of `pred` against `y`.
pub fn mae(y: &[f64], pred: &[f64], w: Option<&[f64]>) -> f64 {
    wmean(y.len(), w, |i| (y[i] - pred[i]).abs())
}

/// Coefficient of determination `1 − Σw(y − ŷ)² / Σw(y − ȳ)²` with the (weighted) mean of
/// `y` on the same rows; NaN when `y` is constant.
pub fn r2(y: &[f64], pred: &[f64], w: Option<&[f64]>) -> f64 {
    let ybar = wmean(y.len(), w, |i| y[i]);
    let ss_res = wmean(y.len(), w, |i| (y[i] - pred[i]).powi(2));
    let ss_tot = wmean(y.len(), w, |i| (y[i] - ybar).powi(2));
    if ss_tot > 0.0 {
        1.0 - ss_res / ss_tot
    } else {
        f64::NAN
    }
}

/// Gaussian negative log-likelihood of one observation, with the ½·ln 2π constant.
pub fn nll_one(y: f64, mu: f64, sd: f64) -> f64 {
    let z = (y - mu) / sd;
    HALF_LN_2PI + sd.ln() + 0.5 * z * z
}

/// CRPS of `N(μ, σ²)` at `y`, closed form: `σ·(z·(2Φ(z) − 1) + 2φ(z) − 1/√π)`, `z = (y − μ)/σ`.
pub fn crps_one(y: f64, mu: f64, sd: f64) -> f64 {
    let z = (y - mu) / sd;
    sd * (z * (2.0 * norm_cdf(z) - 1.0) + 2.0 * norm_pdf(z) - FRAC_1_SQRT_PI)
}

/// Mean Gaussian NLL.
pub fn nll(y: &[f64], mu: &[f64], sd: &[f64], w: Option<&[f64]>) -> f64 {
    wmean(y.len(), w, |i| nll_one(y[i], mu[i], sd[i]))
}

/// Mean CRPS.
pub fn crps(y: &[f64], mu: &[f64], sd: &[f64], w: Option<&[f64]>) -> f64 {
    wmean(y.len(), w, |i| crps_one(y[i], mu[i], sd[i]))
}

/// The PIT `Φ((y − μ)/σ)` of each row.
pub fn pit(y: &[f64], mu: &[f64], sd: &[f64]) -> Vec<f64> {
    (0..y.len())
        .map(|i| norm_cdf((y[i] - mu[i]) / sd[i]))
        .collect()
}

/// Observed coverage of the central `level` interval `μ ± Φ⁻¹((1 + level)/2)·σ`, from the PIT:
/// the weighted fraction of rows with `|u − ½| ≤ level/2`.
pub fn coverage(pit: &[f64], level: f64, w: Option<&[f64]>) -> f64 {
    wmean(pit.len(), w, |i| {
        if (pit[i] - 0.5).abs() <= 0.5 * level {
            1.0
        } else {
            0.0
        }
    })
}

/// Weighted PIT histogram over [`PIT_BINS`] equal bins of [0, 1], as fractions (sums to 1).
pub fn pit_histogram(pit: &[f64], w: Option<&[f64]>) -> Vec<f64> {
    let mut h = vec![0.0; PIT_BINS];
    let mut sw = 0.0;
    for (i, &u) in pit.iter().enumerate() {
        let b = ((u * PIT_BINS as f64) as usize).min(PIT_BINS - 1);
        h[b] += weight(w, i);
        sw += weight(w, i);
    }
    if sw > 0.0 {
        h.iter_mut().for_each(|v| *v /= sw);
    }
    h
}

/// Miscalibration area of the PIT (see the module documentation).
pub fn calibration_error(pit: &[f64], w: Option<&[f64]>) -> f64 {
    let mut order: Vec<usize> = (0..pit.len()).collect();
    order.sort_by(|&a, &b| pit[a].total_cmp(&pit[b]));
    let total: f64 = (0..pit.len()).map(|i| weight(w, i)).sum();
    if total <= 0.0 {
        return f64::NAN;
    }
    let (mut cum, mut k, mut area) = (0.0, 0, 0.0);
    for step in 1..100 {
        let p = step as f64 / 100.0;
        while k < order.len() && pit[order[k]] <= p {
            cum += weight(w, order[k]);
            k += 1;
        }
        area += (cum / total - p).abs();
    }
    area / 99.0
}

/// Mean predicted standard deviation.
pub fn sharpness(sd: &[f64], w: Option<&[f64]>) -> f64 {
    wmean(sd.len(), w, |i| sd[i])
}

/// The variance scale `s² = mean(r²/σ²)` that minimises the mean NLL of `N(μ, s²σ²)` (set the
/// derivative of `½ln(s²σ²) + r²/(2s²σ²)` to zero). Multiply σ by `s`.
pub fn variance_scale(y: &[f64], mu: &[f64], sd: &[f64], w: Option<&[f64]>) -> f64 {
    wmean(y.len(), w, |i| ((y[i] - mu[i]) / sd[i]).powi(2))
}

/// Everything about one predictive distribution on one target's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct GaussianScores {
    /// Mean NLL.
    pub nll: f64,
    /// Mean CRPS.
    pub crps: f64,
    /// Observed coverage at [`COVERAGE_LEVELS`].
    pub coverage: [f64; 4],
    /// Miscalibration area of the PIT.
    pub calibration_error: f64,
    /// Mean σ.
    pub sharpness: f64,
    /// PIT histogram (fractions).
    pub pit_histogram: Vec<f64>,
    /// (nominal, observed) coverage at [`CURVE_LEVELS`].
    pub coverage_curve: Vec<(f64, f64)>,
}

/// Score a transformed target in original units: `z` holds the transformed observations
/// `f(y)`, modelled as `N(μᵢ, σᵢ²)`. The NLL is the density of `y` (the NLL of `z` minus
/// `ln |dz/dy|`), the CRPS is `y`'s (by quantile decomposition over 200 levels), sharpness is
/// the mean predictive σ of `y`; the PIT, coverage and calibration error are those of `z`,
/// which a monotone transform leaves unchanged.
pub fn transformed_scores(
    z: &[f64],
    mu: &[f64],
    sd: &[f64],
    t: kiln_model::stats::TargetTransform,
    w: Option<&[f64]>,
) -> GaussianScores {
    const M: usize = 200;
    let levels: Vec<(f64, f64)> = (0..M)
        .map(|i| {
            let tau = (i as f64 + 0.5) / M as f64;
            (tau, norm_ppf(tau))
        })
        .collect();
    let mut s = gaussian_scores(z, mu, sd, w);
    let n = z.len();
    s.nll = wmean(n, w, |i| {
        nll_one(z[i], mu[i], sd[i]) - t.log_jacobian(t.inverse(z[i]))
    });
    s.crps = wmean(n, w, |i| {
        let y = t.inverse(z[i]);
        // CRPS = 2∫ (1{y < q_τ} − τ)(q_τ − y) dτ, the midpoint rule over τ.
        2.0 * levels
            .iter()
            .map(|&(tau, q)| {
                let qy = t.inverse(mu[i] + sd[i] * q);
                (if y < qy { 1.0 } else { 0.0 } - tau) * (qy - y)
            })
            .sum::<f64>()
            / M as f64
    });
    s.sharpness = wmean(n, w, |i| t.moments(mu[i], sd[i]).1);
    s
}

/// Score `N(μᵢ, σᵢ²)` against `y`.
pub fn gaussian_scores(y: &[f64], mu: &[f64], sd: &[f64], w: Option<&[f64]>) -> GaussianScores {
    let u = pit(y, mu, sd);
    GaussianScores {
        nll: nll(y, mu, sd, w),
        crps: crps(y, mu, sd, w),
        coverage: COVERAGE_LEVELS.map(|l| coverage(&u, l, w)),
        calibration_error: calibration_error(&u, w),
        sharpness: sharpness(sd, w),
        pit_histogram: pit_histogram(&u, w),
        coverage_curve: CURVE_LEVELS
            .iter()
            .map(|&l| (l, coverage(&u, l, w)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crps_matches_closed_form_and_numeric_integral() {
        // CRPS of N(0,1) at 0 = 2φ(0) − 1/√π = (√2 − 1)/√π.
        let want = (2f64.sqrt() - 1.0) / std::f64::consts::PI.sqrt();
        assert!((crps_one(0.0, 0.0, 1.0) - want).abs() < 1e-15);
        assert!((want - 0.233_695_0).abs() < 1e-7);
        // Scale and shift: CRPS(N(μ, σ²), y) = σ·CRPS(N(0,1), (y − μ)/σ).
        assert!((crps_one(5.0, 3.0, 2.0) - 2.0 * crps_one(1.0, 0.0, 1.0)).abs() < 1e-14);
        // Against the definition ∫ (F(x) − 1{x ≥ y})² dx: the midpoint rule on each side of
        // the jump at y (so the indicator is smooth on every piece).
        let midpoint = |a: f64, b: f64, f: &dyn Fn(f64) -> f64| {
            let n = 200_000;
            let h = (b - a) / n as f64;
            (0..n).map(|i| f(a + (i as f64 + 0.5) * h)).sum::<f64>() * h
        };
        for &(y, mu, sd) in &[(0.7, 0.0, 1.0), (-2.5, 1.0, 0.5), (10.0, 9.0, 3.0)] {
            let f = |x: f64| norm_cdf((x - mu) / sd);
            let (lo, hi) = (mu.min(y) - 12.0 * sd, mu.max(y) + 12.0 * sd);
            let num =
                midpoint(lo, y, &|x| f(x).powi(2)) + midpoint(y, hi, &|x| (1.0 - f(x)).powi(2));
            assert!(
                (crps_one(y, mu, sd) - num).abs() < 1e-8,
                "{y} {mu} {sd}: {num}"
            );
        }
    }

    #[test]
    fn point_errors_by_hand() {
        let y = [1.0, 2.0, 3.0, 4.0];
        let p = [1.0, 3.0, 3.0, 2.0];
        assert!((rmse(&y, &p, None) - (5.0f64 / 4.0).sqrt()).abs() < 1e-15);
        assert_eq!(mae(&y, &p, None), 0.75);
        // ȳ = 2.5, Σ(y − ȳ)² = 5, Σr² = 5 → R² = 0.
        assert!(r2(&y, &p, None).abs() < 1e-15);
        assert_eq!(r2(&y, &y, None), 1.0);
        // Weights: a weight of 2 on a row counts it twice.
        let w = [2.0, 1.0, 1.0, 1.0];
        let (y2, p2) = ([1.0, 1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 3.0, 3.0, 2.0]);
        assert!((mae(&y, &p, Some(&w)) - mae(&y2, &p2, None)).abs() < 1e-15);
        assert!((rmse(&y, &p, Some(&w)) - rmse(&y2, &p2, None)).abs() < 1e-15);
        assert!((r2(&y, &p, Some(&w)) - r2(&y2, &p2, None)).abs() < 1e-15);
    }

    #[test]
    fn transformed_scores_are_the_original_units_ones() {
        use kiln_model::stats::TargetTransform as T;
        let z = [0.3, -1.0, 2.0, 0.9];
        let mu = [0.0, -0.5, 1.5, 1.0];
        let sd = [1.0, 0.5, 2.0, 0.7];
        // No transform: the quantile CRPS is the closed form's within 0.5 %.
        let g = gaussian_scores(&z, &mu, &sd, None);
        let t = transformed_scores(&z, &mu, &sd, T::None, None);
        assert!(
            (t.crps / g.crps - 1.0).abs() < 0.005,
            "{} {}",
            t.crps,
            g.crps
        );
        assert_eq!(t.nll, g.nll);
        // Log: the NLL is the log-normal density's; coverage is unchanged.
        let l = transformed_scores(&z, &mu, &sd, T::Log, None);
        let lognormal = |y: f64, m: f64, s: f64| {
            let d = (y.ln() - m) / s;
            y.ln() + s.ln() + 0.5 * (2.0 * std::f64::consts::PI).ln() + 0.5 * d * d
        };
        let want = (0..4)
            .map(|i| lognormal(z[i].exp(), mu[i], sd[i]))
            .sum::<f64>()
            / 4.0;
        assert!((l.nll - want).abs() < 1e-9, "{} {want}", l.nll);
        assert_eq!(l.coverage, g.coverage);
        assert!(l.crps > 0.0 && l.sharpness > 0.0);
    }

    #[test]
    fn nll_is_the_gaussian_log_density() {
        let want = HALF_LN_2PI + 2f64.ln() + 0.5;
        assert!((nll_one(3.0, 1.0, 2.0) - want).abs() < 1e-15);
    }

    #[test]
    fn coverage_on_constructed_residuals() {
        // z-scores placed around the 80 % half-width 1.2816: inside, inside, outside, outside.
        let z = [0.0, 1.28, 1.29, -3.0, -1.0];
        let y: Vec<f64> = z.iter().map(|z| 10.0 + 2.0 * z).collect();
        let mu = [10.0; 5];
        let sd = [2.0; 5];
        let u = pit(&y, &mu, &sd);
        assert_eq!(coverage(&u, 0.8, None), 3.0 / 5.0);
        // |z| ≤ 0.6745 for 50 %: only 0.0.
        assert_eq!(coverage(&u, 0.5, None), 1.0 / 5.0);
        // |z| ≤ 1.96 for 95 %: all but −3.
        assert_eq!(coverage(&u, 0.95, None), 4.0 / 5.0);
        let w = [1.0, 1.0, 1.0, 7.0, 0.0];
        assert_eq!(coverage(&u, 0.95, Some(&w)), 3.0 / 10.0);
    }

    #[test]
    fn calibration_error_of_uniform_and_degenerate_pits() {
        // PIT exactly on the bin midpoints 0.005, 0.015, …: F̂(p) = p at every level.
        let u: Vec<f64> = (0..100).map(|i| (i as f64 + 0.5) / 100.0).collect();
        assert!(calibration_error(&u, None) < 1e-12);
        let h = pit_histogram(&u, None);
        assert!(h.iter().all(|v| (v - 0.1).abs() < 1e-12));
        // All PIT at ½ (σ far too large): F̂ = 0 below ½ and 1 from ½ on → mean |F̂ − p| = 0.25.
        let half = vec![0.5; 10];
        let want = (1..100)
            .map(|s| {
                let p = s as f64 / 100.0;
                if p >= 0.5 { 1.0 - p } else { p }
            })
            .sum::<f64>()
            / 99.0;
        assert!((calibration_error(&half, None) - want).abs() < 1e-12);
        assert!((want - 0.2525).abs() < 1e-3);
    }

    #[test]
    fn variance_scale_minimises_nll() {
        let y = [1.0, -2.0, 0.5, 3.0, -1.5];
        let mu = [0.0; 5];
        let sd = [0.5, 1.0, 0.25, 2.0, 1.0];
        let s2 = variance_scale(&y, &mu, &sd, None);
        let at = |s: f64| {
            let sc: Vec<f64> = sd.iter().map(|v| v * s).collect();
            nll(&y, &mu, &sc, None)
        };
        let best = at(s2.sqrt());
        for f in [0.9, 0.99, 1.01, 1.1] {
            assert!(at(s2.sqrt() * f) > best);
        }
        // After scaling the standardised residuals have unit mean square.
        let sc: Vec<f64> = sd.iter().map(|v| v * s2.sqrt()).collect();
        assert!((variance_scale(&y, &mu, &sc, None) - 1.0).abs() < 1e-12);
    }
}
