//! Pivoted Cholesky factorisation with Genz–Bretz variable reordering, in f64.
//!
//! At step i the factorisation picks, among the variables not yet chosen, the one whose
//! conditional interval is narrowest: the smallest Φ(b̃ⱼ) − Φ(ãⱼ), where ãⱼ, b̃ⱼ are its limits
//! minus the conditional mean given the variables already chosen (each set to the mean of its
//! truncated normal), divided by its conditional standard deviation (Genz & Bretz 2009,
//! "Computation of Multivariate Normal and t Probabilities", §4.1.3; the same greedy rule as
//! mvtnorm). Putting the most constraining variables first makes the Genz integrand flatter in
//! the later coordinates, where the point set is weakest.
//!
//! **Semi-definite covariances are handled, not rejected.** When every remaining variable has a
//! residual variance below [`ZERO_PIVOT_REL`] × its variance, those variables are exact linear
//! functions of the ones already chosen (perfectly correlated legs, a zero variance). They are
//! placed last with a zero diagonal in L, and the estimators treat their limits as an indicator
//! on the value the earlier variables determine. A residual variance below −[`NEG_PIVOT_REL`] ×
//! its variance, or a non-zero covariance between two such degenerate variables, means the
//! matrix is not positive semi-definite, and the factorisation fails naming the pivot.

use super::error::MvnError;
use super::factor1::OneFactor;
use super::normal::{interval_mass, norm_cdf, norm_pdf};
use super::query::Prepared;

/// A residual variance at or below this fraction of the original variance counts as zero
/// (the variable is then a deterministic function of the earlier ones).
pub const ZERO_PIVOT_REL: f64 = 1e-10;
/// A residual variance below −(this fraction of the original variance) is an error: the matrix
/// is not positive semi-definite. Between the two thresholds the variance counts as zero (the
/// slack absorbs rounding, e.g. of a correlation of exactly 1 stored in f32).
pub const NEG_PIVOT_REL: f64 = 1e-6;

/// A query after factorisation, in pivot order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Factor {
    /// The dimension.
    pub d: usize,
    /// Lower-triangular L (row-major d × d) with L Lᵀ = P cov Pᵀ.
    pub l: Vec<f64>,
    /// Centred lower limits in pivot order.
    pub a: Vec<f64>,
    /// Centred upper limits in pivot order.
    pub b: Vec<f64>,
    /// `order[i]` is the original coordinate at pivot i.
    pub order: Vec<usize>,
    /// Pivots `0..random` have L[i][i] > 0; pivots `random..d` are deterministic.
    pub random: usize,
    /// The covariance's one-factor structure, with the centred limits in the original
    /// coordinates, when it has one and was asked for (see [`crate::factor1`]; set by
    /// `cpu::factor_all` in the adaptive mode only).
    pub one_factor: Option<(OneFactor, Vec<f64>, Vec<f64>)>,
}

/// Mean of a standard normal truncated to [lo, hi] (lo ≤ hi, either may be infinite).
pub(crate) fn truncated_mean(lo: f64, hi: f64) -> f64 {
    // Work in the lower half so Φ differences keep their precision.
    let (lo_r, hi_r, sign) = if lo > 0.0 {
        (-hi, -lo, -1.0)
    } else {
        (lo, hi, 1.0)
    };
    let mass = norm_cdf(hi_r) - norm_cdf(lo_r);
    let pdf = |x: f64| if x.is_finite() { norm_pdf(x) } else { 0.0 };
    if mass > 1e-300 {
        let m = (pdf(lo_r) - pdf(hi_r)) / mass;
        // The mean lies inside the interval; clamp rounding.
        sign * m.clamp(lo_r.max(-1e300), hi_r.min(1e300))
    } else if lo > 0.0 {
        lo
    } else if hi < 0.0 {
        hi
    } else {
        0.0
    }
}

/// Factorises a validated query (see the module docs); `query` is its index, for errors.
pub(crate) fn factor(query: usize, p: &Prepared) -> Result<Factor, MvnError> {
    let d = p.d;
    let mut work = p.cov.clone(); // the Schur complement of the chosen variables
    let var0: Vec<f64> = (0..d).map(|j| p.cov[j * d + j]).collect();
    let mut chosen = vec![false; d];
    let mut cond_mean = vec![0.0; d];
    let mut order = Vec::with_capacity(d);
    // cols[i] is column i of L in original coordinates.
    let mut cols: Vec<Vec<f64>> = Vec::with_capacity(d);
    let mut random = 0;

    for step in 0..d {
        // Every remaining residual variance must be non-negative (within rounding).
        for j in 0..d {
            if chosen[j] {
                continue;
            }
            let r = work[j * d + j];
            if r < -NEG_PIVOT_REL * var0[j] || (var0[j] == 0.0 && r < 0.0) {
                return Err(MvnError::NotPositiveSemiDefinite {
                    query,
                    pivot: step,
                    variable: j,
                    detail: format!(
                        "the residual variance is {r:e} (variance {:e}); expected >= 0",
                        var0[j]
                    ),
                });
            }
        }
        // The narrowest conditional interval among variables with positive residual variance.
        let mut best: Option<(usize, f64)> = None;
        for j in 0..d {
            if chosen[j] {
                continue;
            }
            let r = work[j * d + j];
            if r <= ZERO_PIVOT_REL * var0[j] || r <= 0.0 {
                continue;
            }
            let s = r.sqrt();
            let width = interval_mass((p.a[j] - cond_mean[j]) / s, (p.b[j] - cond_mean[j]) / s);
            if best.is_none_or(|(_, w)| width < w) {
                best = Some((j, width));
            }
        }
        match best {
            Some((j, _)) => {
                let s = work[j * d + j].sqrt();
                let mut col = vec![0.0; d];
                for k in 0..d {
                    if !chosen[k] {
                        col[k] = work[k * d + j] / s;
                    }
                }
                col[j] = s;
                for k in 0..d {
                    if chosen[k] {
                        continue;
                    }
                    for m in 0..d {
                        if !chosen[m] {
                            work[k * d + m] -= col[k] * col[m];
                        }
                    }
                }
                let y = truncated_mean((p.a[j] - cond_mean[j]) / s, (p.b[j] - cond_mean[j]) / s);
                for k in 0..d {
                    if !chosen[k] {
                        cond_mean[k] += col[k] * y;
                    }
                }
                chosen[j] = true;
                order.push(j);
                cols.push(col);
                random += 1;
            }
            None => {
                // Every remaining variable is deterministic. Their mutual residual covariances
                // must vanish too, or the matrix is not positive semi-definite.
                let rest: Vec<usize> = (0..d).filter(|&j| !chosen[j]).collect();
                for (x, &j) in rest.iter().enumerate() {
                    for &k in &rest[x + 1..] {
                        let c = work[j * d + k];
                        let rj = work[j * d + j].max(0.0);
                        let rk = work[k * d + k].max(0.0);
                        let tol = (rj * rk).sqrt() + NEG_PIVOT_REL * (var0[j] * var0[k]).sqrt();
                        if c.abs() > tol {
                            return Err(MvnError::NotPositiveSemiDefinite {
                                query,
                                pivot: step,
                                variable: j,
                                detail: format!(
                                    "variables {j} and {k} have (residual) variances {rj:e} and \
                                     {rk:e} but covariance {c:e}"
                                ),
                            });
                        }
                    }
                }
                for &j in &rest {
                    order.push(j);
                    cols.push(vec![0.0; d]);
                }
                break;
            }
        }
    }

    let mut l = vec![0.0; d * d];
    for i in 0..d {
        for k in 0..random.min(i + 1) {
            l[i * d + k] = cols[k][order[i]];
        }
    }
    let a = order.iter().map(|&j| p.a[j]).collect();
    let b = order.iter().map(|&j| p.b[j]).collect();
    Ok(Factor {
        d,
        l,
        a,
        b,
        order,
        random,
        one_factor: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::prepare;

    fn prep(upper: &[f64], cov: &[f64]) -> Prepared {
        prepare(0, 16, upper, None, None, cov).unwrap()
    }

    #[test]
    fn reconstructs_permuted_covariance() {
        let cov = [4.0, 1.2, -0.8, 1.2, 2.0, 0.3, -0.8, 0.3, 1.5];
        let f = factor(0, &prep(&[0.5, -1.0, 2.0], &cov)).unwrap();
        assert_eq!(f.random, 3);
        for i in 0..3 {
            for j in 0..3 {
                let llt: f64 = (0..3).map(|k| f.l[i * 3 + k] * f.l[j * 3 + k]).sum();
                let want = cov[f.order[i] * 3 + f.order[j]];
                assert!((llt - want).abs() < 1e-12, "({i},{j}) {llt} vs {want}");
            }
            for j in (i + 1)..3 {
                assert_eq!(f.l[i * 3 + j], 0.0);
            }
        }
        // The tightest limit (−1 on a variance-2 variable) comes first.
        assert_eq!(f.order[0], 1);
    }

    #[test]
    fn perfectly_correlated_variables_become_deterministic() {
        let f = factor(0, &prep(&[0.0, 0.5], &[1.0, 1.0, 1.0, 1.0])).unwrap();
        assert_eq!(f.random, 1);
        assert_eq!(f.order, vec![0, 1]);
        assert_eq!(f.l, vec![1.0, 0.0, 1.0, 0.0]);
        let f = factor(0, &prep(&[1.0, 1.0], &[0.0, 0.0, 0.0, 2.0])).unwrap();
        assert_eq!(f.random, 1);
        assert_eq!(f.order, vec![1, 0]);
    }

    #[test]
    fn indefinite_matrices_fail_naming_the_pivot() {
        let e = factor(0, &prep(&[0.0, 0.0], &[1.0, 2.0, 2.0, 1.0])).unwrap_err();
        match e {
            MvnError::NotPositiveSemiDefinite { pivot, .. } => assert_eq!(pivot, 1),
            other => panic!("{other}"),
        }
        let e = factor(0, &prep(&[0.0, 0.0], &[0.0, 0.5, 0.5, 0.0])).unwrap_err();
        assert!(
            matches!(e, MvnError::NotPositiveSemiDefinite { pivot: 0, .. }),
            "{e}"
        );
    }

    #[test]
    fn truncated_mean_is_inside_and_symmetric() {
        assert_eq!(truncated_mean(f64::NEG_INFINITY, f64::INFINITY), 0.0);
        let m = truncated_mean(0.0, f64::INFINITY);
        assert!((m - (2.0 / std::f64::consts::PI).sqrt()).abs() < 1e-12);
        assert!((truncated_mean(-3.0, -1.0) + truncated_mean(1.0, 3.0)).abs() < 1e-14);
        assert_eq!(truncated_mean(50.0, 60.0), 50.0);
        let m = truncated_mean(8.0, f64::INFINITY);
        assert!(m > 8.0 && m < 8.2, "{m}");
    }
}
