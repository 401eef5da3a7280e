//! Exact box probabilities for one-factor covariances, by one-dimensional quadrature.
//!
//! A covariance is *one-factor* when its off-diagonal part has rank one: with standard
//! deviations s_i and correlations r_ij = λ_i λ_j (i ≠ j, |λ_i| < 1),
//!
//! ```text
//! X_i = s_i (λ_i Z + σ_i ε_i),   σ_i = √(1 − λ_i²),   Z, ε_1 … ε_d independent N(0, 1),
//! P(a ≤ X ≤ b) = ∫ φ(z) Π_i [Φ((b_i/s_i − λ_i z)/σ_i) − Φ((a_i/s_i − λ_i z)/σ_i)] dz.
//! ```
//!
//! Equicorrelated matrices, the Vasicek/Gaussian-copula credit models and the factor families
//! of `benches/mvn_realistic.json` are of this kind; the d-dimensional integral becomes a
//! one-dimensional one whose integrand is analytic and bounded by φ(z), integrated here by
//! globally adaptive Gauss–Kronrod (7/15 points) to an absolute error far below any
//! Monte Carlo tolerance (see [`ONE_FACTOR_ABS_ERR`]). The answer is exact to rounding, so the
//! adaptive mode returns it with a standard error of 0, as it does the bivariate answers.
//!
//! Detection ([`OneFactor::detect`]) solves λ_i² = r_ij r_ik / r_jk on the largest
//! correlations and then checks every off-diagonal entry against λ_i λ_j to 1e−12 (a matrix
//! typed with six decimals is *not* taken for one-factor: the answer would be to a nearby
//! matrix, not the one asked about). Variables with σ_i² below 1e−6 (a near-perfect loading)
//! make the integrand a near step and are left to the general estimator.

use super::normal::interval_mass;
use super::normal::norm_pdf;

/// Largest deviation |r_ij − λ_i λ_j| accepted as one-factor structure.
const MATCH_TOL: f64 = 1e-12;

/// Smallest residual variance σ_i² (as a share of the variance) integrated this way.
const MIN_RESIDUAL: f64 = 1e-6;

/// Absolute error the quadrature aims for (the sum over intervals of |K15 − G7|, which
/// overstates the Kronrod result's error by orders of magnitude on smooth integrands).
pub(crate) const ONE_FACTOR_ABS_ERR: f64 = 1e-13;

/// Integration range: ∫_{|z| > 8.3} φ(z) dz < 1.1e−16.
const Z_MAX: f64 = 8.3;

/// Most intervals the adaptive rule may split into before it gives up (never reached on a
/// one-factor integrand with σ_i² ≥ 1e−6 in the tests; the caller then falls back).
const MAX_INTERVALS: usize = 400;

/// A one-factor covariance: loadings λ_i and residual standard deviations σ_i of the
/// standardised variables, and the standard deviations s_i that standardise the limits.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OneFactor {
    lambda: Vec<f64>,
    sigma: Vec<f64>,
    scale: Vec<f64>,
}

impl OneFactor {
    /// The one-factor structure of a d × d covariance (row-major, symmetric, positive
    /// diagonal), or `None` when it has none to 1e−12 (or d < 3, or every variable is
    /// independent, which the general path answers exactly already).
    pub(crate) fn detect(cov: &[f64], d: usize) -> Option<OneFactor> {
        if d < 3 || cov.len() != d * d {
            return None;
        }
        let scale: Vec<f64> = (0..d).map(|i| cov[i * d + i].sqrt()).collect();
        if scale.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return None;
        }
        let r = |i: usize, j: usize| cov[i * d + j] / (scale[i] * scale[j]);
        // The variable with the largest correlation anchors the signs.
        let mut anchor = (0, 0.0f64);
        for i in 0..d {
            for j in 0..d {
                if i != j && r(i, j).abs() > anchor.1 {
                    anchor = (i, r(i, j).abs());
                }
            }
        }
        if anchor.1 == 0.0 {
            return None;
        }
        let mut lambda = vec![0.0; d];
        for (i, l) in lambda.iter_mut().enumerate() {
            // The two largest correlations of variable i.
            let mut best = [(usize::MAX, 0.0f64); 2];
            for j in (0..d).filter(|&j| j != i) {
                let v = r(i, j).abs();
                if v > best[0].1 {
                    best = [(j, v), best[0]];
                } else if v > best[1].1 {
                    best[1] = (j, v);
                }
            }
            let [(j, _), (k, _)] = best;
            if j == usize::MAX {
                continue; // uncorrelated with everything: λ_i = 0
            }
            if k == usize::MAX || r(j, k) == 0.0 {
                return None;
            }
            let l2 = r(i, j) * r(i, k) / r(j, k);
            if !(0.0..=1.0 - MIN_RESIDUAL).contains(&l2) {
                return None;
            }
            *l = l2.sqrt();
        }
        // Signs: λ_anchor > 0, λ_i takes the sign of r(i, anchor).
        let a = anchor.0;
        for i in (0..d).filter(|&i| i != a) {
            if r(i, a) < 0.0 {
                lambda[i] = -lambda[i];
            }
        }
        for i in 0..d {
            for j in 0..i {
                if (r(i, j) - lambda[i] * lambda[j]).abs() > MATCH_TOL {
                    return None;
                }
            }
        }
        let sigma = lambda.iter().map(|l| (1.0 - l * l).sqrt()).collect();
        Some(OneFactor {
            lambda,
            sigma,
            scale,
        })
    }

    /// P(a ≤ X ≤ b) for centred limits `a`, `b` (in the covariance's coordinates), with the
    /// quadrature's error bound; `None` when the adaptive rule did not converge.
    pub(crate) fn probability(&self, a: &[f64], b: &[f64]) -> Option<(f64, f64)> {
        let d = self.lambda.len();
        let (sa, sb): (Vec<f64>, Vec<f64>) = (0..d)
            .map(|i| (a[i] / self.scale[i], b[i] / self.scale[i]))
            .unzip();
        let f = |z: f64| {
            let mut p = norm_pdf(z);
            for i in 0..d {
                if p == 0.0 {
                    break;
                }
                let (l, s) = (self.lambda[i], self.sigma[i]);
                p *= interval_mass((sa[i] - l * z) / s, (sb[i] - l * z) / s);
            }
            p
        };
        integrate(f, -Z_MAX, Z_MAX, ONE_FACTOR_ABS_ERR)
    }
}

/// Gauss–Kronrod 15-point nodes on [−1, 1] (non-negative half, descending; the odd-indexed
/// ones and 0 are the 7-point Gauss nodes) and weights (Kronrod; Gauss for the Gauss nodes).
const XGK: [f64; 8] = [
    0.991_455_371_120_812_6,
    0.949_107_912_342_758_5,
    0.864_864_423_359_769_1,
    0.741_531_185_599_394_4,
    0.586_087_235_467_691_1,
    0.405_845_151_377_397_2,
    0.207_784_955_007_898_5,
    0.0,
];
const WGK: [f64; 8] = [
    0.022_935_322_010_529_22,
    0.063_092_092_629_978_55,
    0.104_790_010_322_250_18,
    0.140_653_259_715_525_92,
    0.169_004_726_639_267_9,
    0.190_350_578_064_785_4,
    0.204_432_940_075_298_9,
    0.209_482_141_084_727_83,
];
const WG: [f64; 4] = [
    0.129_484_966_168_869_7,
    0.279_705_391_489_276_7,
    0.381_830_050_505_118_9,
    0.417_959_183_673_469_4,
];

/// (Kronrod estimate, |Kronrod − Gauss|) of ∫ f over [lo, hi].
fn kronrod(f: &impl Fn(f64) -> f64, lo: f64, hi: f64) -> (f64, f64) {
    let (c, h) = (0.5 * (lo + hi), 0.5 * (hi - lo));
    let fc = f(c);
    let (mut k, mut g) = (WGK[7] * fc, WG[3] * fc);
    for j in 0..7 {
        let (x1, x2) = (c - h * XGK[j], c + h * XGK[j]);
        let s = f(x1) + f(x2);
        k += WGK[j] * s;
        if j % 2 == 1 {
            g += WG[j / 2] * s;
        }
    }
    (k * h, ((k - g) * h).abs())
}

/// Globally adaptive Gauss–Kronrod: split the interval with the largest error estimate until
/// the estimates sum to at most `tol`; `None` past [`MAX_INTERVALS`].
fn integrate(f: impl Fn(f64) -> f64, lo: f64, hi: f64, tol: f64) -> Option<(f64, f64)> {
    // (lo, hi, value, error); a handful of intervals, so a linear scan beats a heap.
    let mut parts: Vec<(f64, f64, f64, f64)> = Vec::with_capacity(32);
    // Start from eight pieces: the integrand's mass sits near 0 on a range of width ~10.
    let n0 = 8;
    for i in 0..n0 {
        let (a, b) = (
            lo + (hi - lo) * i as f64 / n0 as f64,
            lo + (hi - lo) * (i + 1) as f64 / n0 as f64,
        );
        let (v, e) = kronrod(&f, a, b);
        parts.push((a, b, v, e));
    }
    loop {
        let err: f64 = parts.iter().map(|p| p.3).sum();
        if err <= tol {
            let value = parts.iter().map(|p| p.2).sum::<f64>();
            return Some((value, err));
        }
        if parts.len() >= MAX_INTERVALS {
            return None;
        }
        let (w, _) = parts
            .iter()
            .enumerate()
            .max_by(|x, y| x.1.3.total_cmp(&y.1.3))
            .expect("non-empty");
        let (a, b, _, _) = parts.swap_remove(w);
        let m = 0.5 * (a + b);
        let (v1, e1) = kronrod(&f, a, m);
        let (v2, e2) = kronrod(&f, m, b);
        parts.push((a, m, v1, e1));
        parts.push((m, b, v2, e2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::equicorrelated_cdf;

    #[test]
    fn kronrod_integrates_polynomials_to_degree_23_and_gauss_to_13() {
        for p in 0..=23 {
            let want = if p % 2 == 0 {
                2.0 / (p + 1) as f64
            } else {
                0.0
            };
            let (k, _) = kronrod(&|x: f64| x.powi(p), -1.0, 1.0);
            assert!((k - want).abs() < 1e-14, "x^{p}: {k} vs {want}");
        }
        // The Gauss part is exact to degree 13, so |K − G| vanishes there and not at 14.
        let (_, e13) = kronrod(&|x: f64| x.powi(12) + x.powi(13), -1.0, 1.0);
        let (_, e14) = kronrod(&|x: f64| x.powi(14), -1.0, 1.0);
        assert!(e13 < 1e-14 && e14 > 1e-6, "{e13} {e14}");
    }

    #[test]
    fn adaptive_rule_reaches_its_tolerance_on_a_peaked_integrand() {
        // ∫ φ(z) Φ((1 − 0.999 z)/0.0447) dz over ℝ = P(Z ≤ 1 − ...) form: compare with the
        // bivariate identity P(X ≤ 1) for X = 0.999 Z + 0.0447 ε (variance 1.0000...).
        let (l, s) = (0.999f64, (1.0 - 0.999f64 * 0.999).sqrt());
        let (v, e) = integrate(
            |z| norm_pdf(z) * crate::normal::norm_cdf((1.0 - l * z) / s),
            -Z_MAX,
            Z_MAX,
            1e-13,
        )
        .expect("converges");
        assert!(e <= 1e-13);
        assert!((v - crate::normal::norm_cdf(1.0)).abs() < 1e-13, "{v}");
    }

    fn one_factor_cov(lambda: &[f64], sd: &[f64]) -> Vec<f64> {
        let d = lambda.len();
        let mut c = vec![0.0; d * d];
        for i in 0..d {
            for j in 0..d {
                let r = if i == j { 1.0 } else { lambda[i] * lambda[j] };
                c[i * d + j] = r * sd[i] * sd[j];
            }
        }
        c
    }

    #[test]
    fn detects_loadings_with_their_signs_and_scales() {
        let lambda = [0.9, -0.3, 0.55, 0.0, -0.8];
        let sd = [1.0, 2.0, 0.5, 3.0, 1.5];
        let f = OneFactor::detect(&one_factor_cov(&lambda, &sd), 5).expect("one-factor");
        // Up to a global sign (the anchor, variable 0, is positive here).
        for i in 0..5 {
            assert!((f.lambda[i] - lambda[i]).abs() < 1e-14, "{:?}", f.lambda);
            assert!((f.scale[i] - sd[i]).abs() < 1e-14);
        }
    }

    #[test]
    fn refuses_what_is_not_one_factor() {
        // An AR(1) correlation (rank of the off-diagonal part > 1).
        let d = 4;
        let mut ar = vec![0.0; d * d];
        for i in 0..d {
            for j in 0..d {
                ar[i * d + j] = 0.7f64.powi((i as i32 - j as i32).abs());
            }
        }
        assert!(OneFactor::detect(&ar, d).is_none());
        // One-factor only to six decimals: refused (the answer would be another matrix's).
        // (At d = 3 every matrix with correlations of one sign pattern is one-factor: three
        // equations, three loadings; from d = 4 on the structure is a constraint.)
        let mut c = one_factor_cov(&[0.6, 0.7, 0.8, 0.5], &[1.0; 4]);
        assert!(OneFactor::detect(&c, 4).is_some());
        c[1] += 1e-6;
        c[4] += 1e-6;
        assert!(OneFactor::detect(&c, 4).is_none());
        // A near-perfect loading: a near-step integrand, left to the general path.
        assert!(OneFactor::detect(&one_factor_cov(&[0.9999999, 0.5, 0.5], &[1.0; 3]), 3).is_none());
        // Independent variables and d = 2.
        let mut eye = vec![0.0; 9];
        eye[0] = 1.0;
        eye[4] = 1.0;
        eye[8] = 1.0;
        assert!(OneFactor::detect(&eye, 3).is_none());
        assert!(OneFactor::detect(&[1.0, 0.5, 0.5, 1.0], 2).is_none());
    }

    #[test]
    fn equicorrelated_orthants_match_the_closed_form_reference() {
        // P(X ≤ b) for equicorrelated ρ: the bench's own 1-D reference, and the orthant
        // P(X ≤ 0) = 1/(d+1) at ρ = 1/2.
        let rho = 0.5f64;
        for d in [3usize, 5, 8, 16] {
            let lambda = vec![rho.sqrt(); d];
            let f = OneFactor::detect(&one_factor_cov(&lambda, &vec![1.0; d]), d).unwrap();
            let a = vec![f64::NEG_INFINITY; d];
            let (p0, _) = f.probability(&a, &vec![0.0; d]).unwrap();
            assert!((p0 - 1.0 / (d + 1) as f64).abs() < 1e-13, "d {d}: {p0}");
            let b: Vec<f64> = (0..d).map(|i| -1.0 + 0.3 * i as f64).collect();
            let (p, _) = f.probability(&a, &b).unwrap();
            let want = equicorrelated_cdf(&b, rho);
            assert!((p - want).abs() < 1e-12, "d {d}: {p} vs {want}");
        }
    }

    #[test]
    fn two_sided_limits_and_scales_match_the_bivariate_answer_of_a_margin() {
        // With a variable left unbounded, the box probability is that of the others: a
        // 3-variable one-factor box with x_3 free equals the bivariate box of x_1, x_2.
        let lambda = [0.8, -0.6, 0.5];
        let sd = [2.0, 0.5, 1.0];
        let f = OneFactor::detect(&one_factor_cov(&lambda, &sd), 3).unwrap();
        let (a, b) = ([-1.0, -0.2, f64::NEG_INFINITY], [3.0, 0.4, f64::INFINITY]);
        let (p, _) = f.probability(&a, &b).unwrap();
        let want = crate::bvn::bvn_box(
            [a[0] / sd[0], a[1] / sd[1]],
            [b[0] / sd[0], b[1] / sd[1]],
            lambda[0] * lambda[1],
        );
        assert!((p - want).abs() < 1e-13, "{p} vs {want}");
    }
}
