//! Exact reference values and the benchmark grid behind `kiln bench mvn` and `benches/mvn.rs`.
//!
//! Reference values:
//! * bivariate orthant P(X₁ ≤ 0, X₂ ≤ 0) = 1/4 + asin(ρ)/(2π);
//! * trivariate orthant 1/8 + (asin ρ₁₂ + asin ρ₁₃ + asin ρ₂₃)/(4π);
//! * equicorrelated orthant with ρ = ½: 1/(d + 1);
//! * equicorrelated (ρ ≥ 0) with any upper limits b: writing Xᵢ = √ρ·T + √(1−ρ)·Eᵢ,
//!   P(X ≤ b) = ∫ φ(t) Πᵢ Φ((bᵢ − √ρ t)/√(1−ρ)) dt, a one-dimensional integral of an entire
//!   function that the trapezoidal rule on [−12, 12] computes to about 1e−14.

use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::error::MvnError;
use super::halton::SplitMix64;
use super::module::{HaltonMvnCdfConfig, MvnMethod};
use super::normal::{norm_cdf, norm_pdf};
use super::query::MvnQuery;

/// Exact bivariate orthant probability P(X₁ ≤ 0, X₂ ≤ 0) for correlation ρ.
pub fn orthant_bivariate(rho: f64) -> f64 {
    0.25 + rho.asin() / (2.0 * std::f64::consts::PI)
}

/// Exact trivariate orthant probability for correlations ρ₁₂, ρ₁₃, ρ₂₃.
pub fn orthant_trivariate(r12: f64, r13: f64, r23: f64) -> f64 {
    0.125 + (r12.asin() + r13.asin() + r23.asin()) / (4.0 * std::f64::consts::PI)
}

/// P(X ≤ b) for X with unit variances and equal correlation ρ in [0, 1), by the trapezoidal
/// rule on the one-dimensional representation (see the module docs).
pub fn equicorrelated_cdf(b: &[f64], rho: f64) -> f64 {
    let sr = rho.sqrt();
    let sc = (1.0 - rho).sqrt();
    let h = 0.004;
    let steps = (24.0 / h) as i64;
    let mut sum = 0.0;
    for k in 0..=steps {
        let t = -12.0 + k as f64 * h;
        let mut f = norm_pdf(t);
        for &bi in b {
            f *= norm_cdf((bi - sr * t) / sc);
        }
        sum += f;
    }
    sum * h
}

/// A query with its exact answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ClosedFormCase {
    /// The query.
    pub query: MvnQuery,
    /// P for the query.
    pub exact: f64,
}

/// The equicorrelated covariance of dimension d (unit variances).
pub fn equicorrelated_cov(d: usize, rho: f64) -> Vec<f64> {
    let mut c = vec![rho; d * d];
    for i in 0..d {
        c[i * d + i] = 1.0;
    }
    c
}

/// `count` equicorrelated cases of dimension d with correlation ρ: the first is the orthant,
/// the others have upper limits drawn uniformly from [−1, 1.5] (seeded).
pub fn equicorrelated_cases(d: usize, rho: f64, count: usize, seed: u64) -> Vec<ClosedFormCase> {
    let mut rng = SplitMix64::new(seed);
    let cov = equicorrelated_cov(d, rho);
    (0..count)
        .map(|i| {
            let upper: Vec<f64> = if i == 0 {
                vec![0.0; d]
            } else {
                (0..d).map(|_| -1.0 + 2.5 * rng.next_f64()).collect()
            };
            let exact = if i == 0 && (rho - 0.5).abs() < 1e-15 {
                1.0 / (d as f64 + 1.0)
            } else {
                equicorrelated_cdf(&upper, rho)
            };
            ClosedFormCase {
                query: MvnQuery::new(upper, cov.clone()),
                exact,
            }
        })
        .collect()
}

/// One line of `kiln bench mvn --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRecord {
    /// Always `"mvn"`.
    pub bench: String,
    /// `genz` or `naive`.
    pub method: String,
    /// Dimension.
    pub d: usize,
    /// Points per randomisation.
    pub points: usize,
    /// Queries per call.
    pub batch: usize,
    /// Queries answered per second.
    pub evals_per_s: f64,
    /// Largest |estimate − exact| over the batch.
    pub max_abs_err: f64,
    /// Randomisations per query (total points per query = points × randomizations).
    pub randomizations: usize,
    /// Mean reported standard error over the batch.
    pub mean_se: f64,
    /// Share of the time spent validating and factorising (the rest is integration).
    pub setup_share: f64,
    /// Timed calls.
    pub calls: usize,
    /// The adaptive mode's standard-error target (`null`: every query uses all points).
    #[serde(default)]
    pub tolerance: Option<f64>,
    /// Mean points per randomisation a query used (0 for queries answered exactly; equal to
    /// `points` without a tolerance).
    #[serde(default)]
    pub avg_points: f64,
}

/// One benchmark setting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchSetting {
    /// Method.
    pub method: MvnMethod,
    /// Dimension.
    pub d: usize,
    /// Points per randomisation.
    pub points: usize,
    /// Queries per call.
    pub batch: usize,
    /// Randomisations.
    pub randomizations: usize,
    /// Adaptive mode's standard-error target (`None`: all points for every query).
    pub tolerance: Option<f64>,
    /// Adaptive mode's first stage (points per randomisation).
    pub min_points: usize,
}

/// Runs one setting on the CPU path: builds the module, answers the batch of equicorrelated
/// (ρ = ½) cases repeatedly for at least `min_time`, and reports throughput and error.
pub fn run_setting<B: Backend>(
    setting: BenchSetting,
    seed: u64,
    min_time: Duration,
    device: &B::Device,
) -> Result<BenchRecord, MvnError> {
    let model = HaltonMvnCdfConfig::new()
        .with_max_dim(setting.d.max(2))
        .with_points(setting.points)
        .with_randomizations(setting.randomizations)
        .with_seed(seed)
        .with_method(setting.method)
        .with_tolerance(setting.tolerance)
        .with_min_points(setting.min_points)
        .init::<B>(device)?;
    let cases = equicorrelated_cases(setting.d, 0.5, setting.batch, seed ^ 0x5eed);
    let queries: Vec<MvnQuery> = cases.iter().map(|c| c.query.clone()).collect();

    // The first call, with the points each query used.
    let prepared = super::query::prepare_queries(&queries, model.max_dim())?;
    let factors = super::cpu::factor_all(&prepared)?;
    let (first, used) =
        super::cpu::estimate_all_counted(&factors, &*model.host()?, &model.cpu_options());
    let avg_points = used.iter().sum::<usize>() as f64 / used.len().max(1) as f64;
    let max_abs_err = first
        .iter()
        .zip(&cases)
        .map(|(e, c)| (e.p - c.exact).abs())
        .fold(0.0, f64::max);
    let mean_se = first.iter().map(|e| e.se).sum::<f64>() / first.len() as f64;

    // Setup share: validation + factorisation alone (after the warm-up call), timed apart.
    let t0 = Instant::now();
    let prepared = super::query::prepare_queries(&queries, model.max_dim())?;
    let _ = super::cpu::factor_all(&prepared)?;
    let setup = t0.elapsed();

    let start = Instant::now();
    let mut calls = 0usize;
    while calls == 0 || start.elapsed() < min_time {
        let out = model.forward(queries.as_slice())?;
        std::hint::black_box(out);
        calls += 1;
    }
    let per_call = start.elapsed().as_secs_f64() / calls as f64;
    Ok(BenchRecord {
        bench: "mvn".into(),
        method: setting.method.name().into(),
        d: setting.d,
        points: setting.points,
        batch: setting.batch,
        evals_per_s: setting.batch as f64 / per_call,
        max_abs_err,
        randomizations: setting.randomizations,
        mean_se,
        setup_share: (setup.as_secs_f64() / per_call).min(1.0),
        calls,
        tolerance: setting.tolerance,
        avg_points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_agree_with_each_other() {
        for &rho in &[-0.9, -0.3, 0.0, 0.5, 0.95] {
            let want = orthant_bivariate(rho);
            if rho >= 0.0 {
                let got = equicorrelated_cdf(&[0.0, 0.0], rho);
                assert!((got - want).abs() < 1e-13, "ρ={rho}: {got} vs {want}");
            }
        }
        for d in 1..=16 {
            let got = equicorrelated_cdf(&vec![0.0; d], 0.5);
            assert!((got - 1.0 / (d as f64 + 1.0)).abs() < 1e-13, "d={d}: {got}");
        }
        let got = equicorrelated_cdf(&[0.0; 3], 0.3);
        assert!((got - orthant_trivariate(0.3, 0.3, 0.3)).abs() < 1e-13);
        // Independent: product of Φ.
        let b = [0.3, -1.2, 2.0];
        let want: f64 = b.iter().map(|&x| norm_cdf(x)).product();
        assert!((equicorrelated_cdf(&b, 0.0) - want).abs() < 1e-14);
    }
}
