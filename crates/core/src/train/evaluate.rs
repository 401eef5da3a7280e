//! Evaluation on a split: the model against persistence and training-mean baselines, Gaussian
//! NLL against a constant-variance baseline, and the residual correlation between targets.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::data::dataset::Affine;
use crate::data::{ColumnStats, Subset};
use crate::model::RegressionNet;

/// Network outputs for a split, normalised units, row-major `rows × k`.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitPredictions {
    /// Means.
    pub mean: Vec<f32>,
    /// Log-variances.
    pub log_var: Vec<f32>,
}

/// Run the network (no autodiff) over raw rows `x` (`rows × nf`) in chunks.
pub fn predict_split<B: Backend>(
    model: &RegressionNet<B>,
    x_raw: &[f32],
    x_norm: &Affine,
    device: &B::Device,
) -> SplitPredictions {
    let nf = x_norm.scale.len();
    let rows = x_raw.len() / nf;
    let mut x = x_raw.to_vec();
    x_norm.apply(&mut x);
    let mut mean = Vec::with_capacity(rows * 4);
    let mut log_var = Vec::with_capacity(rows * 4);
    const CHUNK: usize = 8192;
    for start in (0..rows).step_by(CHUNK) {
        let end = (start + CHUNK).min(rows);
        let t = Tensor::<B, 2>::from_data(
            TensorData::new(x[start * nf..end * nf].to_vec(), [end - start, nf]),
            device,
        );
        let out = model.forward(t);
        mean.extend(to_vec(out.mean));
        log_var.extend(to_vec(out.log_var));
    }
    SplitPredictions { mean, log_var }
}

fn to_vec<B: Backend>(t: Tensor<B, 2>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 tensor data")
}

/// Mean squared error of the mean head, normalised units (the stage-1 loss), weighted by
/// `w` (one weight per row; `None`: equal).
pub fn mse_normalised(
    pred: &SplitPredictions,
    y_raw: &[f32],
    y_norm: &Affine,
    w: Option<&[f64]>,
) -> f64 {
    let k = y_norm.scale.len();
    let (mut sum, mut total) = (0.0, 0.0);
    for (i, (&m, &y)) in pred.mean.iter().zip(y_raw).enumerate() {
        let j = i % k;
        let wi = w.map_or(1.0, |w| w[i / k]);
        let yn = (y - y_norm.shift[j]) * y_norm.scale[j];
        sum += wi * ((m - yn) as f64).powi(2);
        total += wi;
    }
    sum / if total > 0.0 { total } else { 1.0 }
}

/// Gaussian NLL without the constant, normalised units (the stage-2 loss), weighted by `w`
/// (one weight per row; `None`: equal).
pub fn nll_normalised(
    pred: &SplitPredictions,
    y_raw: &[f32],
    y_norm: &Affine,
    w: Option<&[f64]>,
) -> f64 {
    let k = y_norm.scale.len();
    let (mut sum, mut total) = (0.0, 0.0);
    for (i, ((&m, &lv), &y)) in pred.mean.iter().zip(&pred.log_var).zip(y_raw).enumerate() {
        let j = i % k;
        let wi = w.map_or(1.0, |w| w[i / k]);
        let yn = ((y - y_norm.shift[j]) * y_norm.scale[j]) as f64;
        let (m, lv) = (m as f64, lv as f64);
        sum += wi * crate::util::gaussian_nll(yn, m, lv);
        total += wi;
    }
    sum / if total > 0.0 { total } else { 1.0 }
}

pub use kiln_model::records::metrics::{Baseline, EvalReport, TargetReport};

/// Per-target mean squared residual of the model's mean on a split, original units.
pub fn residual_variance(
    pred: &SplitPredictions,
    y_raw: &[f32],
    targets: &[ColumnStats],
) -> Vec<f64> {
    let k = targets.len();
    let mut acc = vec![0.0; k];
    let rows = y_raw.len() / k;
    for (i, (&m, &y)) in pred.mean.iter().zip(y_raw).enumerate() {
        let j = i % k;
        let mu = m as f64 * targets[j].std + targets[j].mean;
        acc[j] += (y as f64 - mu).powi(2);
    }
    acc.iter().map(|a| a / rows.max(1) as f64).collect()
}

/// Build the evaluation table for `split` rows.
///
/// `persistence[j]` is the index of the feature holding last season's value of target `j`.
pub fn evaluate(
    split_name: &str,
    pred: &SplitPredictions,
    split: &Subset,
    n_features: usize,
    targets: &[ColumnStats],
    persistence: &[Option<usize>],
    constant_variance: &[f64],
) -> EvalReport {
    evaluate_weighted(
        split_name,
        pred,
        split,
        n_features,
        targets,
        persistence,
        constant_variance,
        None,
    )
}

/// SHA-256 of a split's rows (features, targets, seasons), hex.
pub fn rows_sha256(split: &Subset) -> String {
    let mut bytes = Vec::with_capacity(8 + 4 * (split.x.len() + split.y.len()) + 8 * split.rows());
    bytes.extend((split.rows() as u64).to_le_bytes());
    for v in split.x.iter().chain(&split.y) {
        bytes.extend(v.to_bits().to_le_bytes());
    }
    for v in &split.season {
        bytes.extend(v.to_le_bytes());
    }
    for v in &split.w {
        bytes.extend(v.to_bits().to_le_bytes());
    }
    crate::util::sha256_hex(&bytes)
}

/// One target's column of a split in original units: observations, the model's means and
/// standard deviations.
pub fn target_columns(
    pred: &SplitPredictions,
    y_raw: &[f32],
    targets: &[ColumnStats],
    j: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let k = targets.len();
    let rows = y_raw.len() / k;
    let (ts, tm) = (targets[j].std, targets[j].mean);
    let y = (0..rows).map(|i| y_raw[i * k + j] as f64).collect();
    let mu = (0..rows)
        .map(|i| pred.mean[i * k + j] as f64 * ts + tm)
        .collect();
    let sd = (0..rows)
        .map(|i| (0.5 * pred.log_var[i * k + j] as f64).exp() * ts)
        .collect();
    (y, mu, sd)
}

/// [`evaluate`] with per-row weights (`None` = equal; the MSE and NLL columns too).
#[allow(clippy::too_many_arguments)]
pub fn evaluate_weighted(
    split_name: &str,
    pred: &SplitPredictions,
    split: &Subset,
    n_features: usize,
    targets: &[ColumnStats],
    persistence: &[Option<usize>],
    constant_variance: &[f64],
    weights: Option<&[f64]>,
) -> EvalReport {
    use super::uncertainty as u;
    let k = targets.len();
    let rows = split.rows();
    let w = weights;
    let mut reports = Vec::with_capacity(k);
    for j in 0..k {
        let (tm, tr) = (targets[j].mean, targets[j].transform);
        let (y, mu, sd) = target_columns(pred, &split.y, targets, j);
        let cv_sd = vec![constant_variance[j].max(1e-300).sqrt(); rows];
        // A transformed target (`y`, `mu`, `sd` are then in the transformed space) is scored
        // in original units: the point prediction is the predictive mean, the training-mean
        // baseline the mean of the training split's fitted transformed normal.
        let (y, mu, model, constant, train_mean) = if tr.is_none() {
            let model = u::gaussian_scores(&y, &mu, &sd, w);
            let constant = u::gaussian_scores(&y, &mu, &cv_sd, w);
            (y, mu, model, constant, vec![tm; rows])
        } else {
            let model = u::transformed_scores(&y, &mu, &sd, tr, w);
            let constant = u::transformed_scores(&y, &mu, &cv_sd, tr, w);
            let point: Vec<f64> = (0..rows).map(|i| tr.moments(mu[i], sd[i]).0).collect();
            let y: Vec<f64> = y.iter().map(|&z| tr.inverse(z)).collect();
            let base = tr.moments(tm, targets[j].std).0;
            (y, point, model, constant, vec![base; rows])
        };
        let persist: Option<Vec<f64>> = persistence[j].map(|f| {
            (0..rows)
                .map(|i| split.x[i * n_features + f] as f64)
                .collect()
        });
        let mse = u::mse(&y, &mu, w);
        let mse_p = persist.as_ref().map(|p| u::mse(&y, p, w));
        let mse_m = u::mse(&y, &train_mean, w);
        reports.push(TargetReport {
            target: targets[j].name.clone(),
            mse_model: mse,
            mse_persistence: mse_p,
            mse_train_mean: mse_m,
            nll_model: model.nll,
            nll_constant_variance: constant.nll,
            rmse_model: mse.sqrt(),
            rmse_persistence: mse_p.map(f64::sqrt),
            rmse_train_mean: mse_m.sqrt(),
            mae_model: u::mae(&y, &mu, w),
            mae_persistence: persist.as_ref().map(|p| u::mae(&y, p, w)),
            mae_train_mean: u::mae(&y, &train_mean, w),
            r2_model: u::r2(&y, &mu, w),
            crps_model: model.crps,
            crps_constant_variance: constant.crps,
            coverage_50: model.coverage[0],
            coverage_80: model.coverage[1],
            coverage_90: model.coverage[2],
            coverage_95: model.coverage[3],
            calibration_error: model.calibration_error,
            calibration_error_constant_variance: constant.calibration_error,
            sharpness: model.sharpness,
            sharpness_constant_variance: constant.sharpness,
            pit_histogram: model.pit_histogram,
            coverage_curve: model.coverage_curve,
        });
    }
    EvalReport {
        split: split_name.to_string(),
        rows,
        targets: reports,
        rows_sha256: rows_sha256(split),
    }
}

/// Per-target variance scales `s²_j = mean(r²/σ²)` fitted on a split (the NLL-minimising
/// multiplier of each target's predicted variance; see [`super::uncertainty::variance_scale`]).
pub fn variance_scales(
    pred: &SplitPredictions,
    y_raw: &[f32],
    targets: &[ColumnStats],
    weights: Option<&[f64]>,
) -> Vec<f64> {
    (0..targets.len())
        .map(|j| {
            let (y, mu, sd) = target_columns(pred, y_raw, targets, j);
            super::uncertainty::variance_scale(&y, &mu, &sd, weights)
        })
        .collect()
}

/// `pred` with each target's variance multiplied by `scales[j]` (log-variance + ln s²).
pub fn scale_variance(pred: &SplitPredictions, scales: &[f64]) -> SplitPredictions {
    let k = scales.len();
    SplitPredictions {
        mean: pred.mean.clone(),
        log_var: pred
            .log_var
            .iter()
            .enumerate()
            .map(|(i, &lv)| (lv as f64 + scales[i % k].ln()) as f32)
            .collect(),
    }
}

/// Pearson correlation of the standardised residuals `(y − μ)/σ` between targets.
pub fn residual_correlation(
    pred: &SplitPredictions,
    y_raw: &[f32],
    targets: &[ColumnStats],
) -> Vec<Vec<f64>> {
    let k = targets.len();
    let rows = y_raw.len() / k;
    let mut z = vec![0.0f64; rows * k];
    for i in 0..rows {
        for j in 0..k {
            let yn = (y_raw[i * k + j] as f64 - targets[j].mean) / targets[j].std;
            let m = pred.mean[i * k + j] as f64;
            let sd = (0.5 * pred.log_var[i * k + j] as f64).exp();
            z[i * k + j] = (yn - m) / sd;
        }
    }
    let means: Vec<f64> = (0..k)
        .map(|j| (0..rows).map(|i| z[i * k + j]).sum::<f64>() / rows.max(1) as f64)
        .collect();
    let mut cov = vec![vec![0.0; k]; k];
    for i in 0..rows {
        for a in 0..k {
            for b in 0..k {
                cov[a][b] += (z[i * k + a] - means[a]) * (z[i * k + b] - means[b]);
            }
        }
    }
    let mut corr = vec![vec![0.0; k]; k];
    for a in 0..k {
        for b in 0..k {
            let d = (cov[a][a] * cov[b][b]).sqrt();
            corr[a][b] = if a == b {
                1.0
            } else if d > 0.0 {
                (cov[a][b] / d).clamp(-1.0, 1.0)
            } else {
                0.0
            };
        }
    }
    corr
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::HALF_LN_2PI;

    #[test]
    fn perfectly_correlated_residuals_give_unit_correlation() {
        let targets = vec![
            ColumnStats {
                name: "a".into(),
                mean: 0.0,
                std: 1.0,
                transform: Default::default(),
            },
            ColumnStats {
                name: "b".into(),
                mean: 0.0,
                std: 2.0,
                transform: Default::default(),
            },
        ];
        let y = vec![1.0, 2.0, -1.0, -2.0, 0.5, 1.0];
        let pred = SplitPredictions {
            mean: vec![0.0; 6],
            log_var: vec![0.0; 6],
        };
        let c = residual_correlation(&pred, &y, &targets);
        assert!((c[0][1] - 1.0).abs() < 1e-12 && c[1][0] == c[0][1]);
    }

    #[test]
    fn evaluation_against_hand_values() {
        let targets = vec![ColumnStats {
            name: "hr_rate".into(),
            mean: 1.0,
            std: 2.0,
            transform: Default::default(),
        }];
        let split = Subset {
            x: vec![2.0, 0.0],
            y: vec![3.0, 1.0],
            season: vec![2017, 2018],
            source_rows: vec![0, 1],
            w: Vec::new(),
        };
        // Normalised mean 0.5 → original 2.0; residuals 1 and −1.
        let pred = SplitPredictions {
            mean: vec![0.5, 0.5],
            log_var: vec![0.0, 0.0],
        };
        let r = evaluate("test", &pred, &split, 1, &targets, &[Some(0)], &[1.0]);
        let t = &r.targets[0];
        assert_eq!(t.mse_model, 1.0);
        assert_eq!(t.mse_persistence, Some(1.0));
        assert_eq!(t.mse_train_mean, 2.0);
        // σ² = 4 in original units (log-variance 0 in units of std 2).
        let nll = HALF_LN_2PI + 0.5 * (4f64.ln() + 0.25);
        assert!((t.nll_model - nll).abs() < 1e-12);
        assert!((t.nll_constant_variance - (HALF_LN_2PI + 0.5)).abs() < 1e-12);
        assert_eq!(t.rmse_model, 1.0);
        assert_eq!(t.mae_model, 1.0);
        assert_eq!(t.mae_persistence, Some(1.0));
        // ȳ = 2 on the split, residuals ±1 around ŷ = 2: Σr² = Σ(y − ȳ)² → R² = 0.
        assert_eq!(t.r2_model, 0.0);
        // σ = 2, |z| = ½ on both rows: inside the 50 % interval (half-width 0.674σ).
        assert_eq!(t.coverage(), [1.0; 4]);
        assert_eq!(t.sharpness, 2.0);
        let crps = 2.0 * super::super::uncertainty::crps_one(0.5, 0.0, 1.0);
        assert!((t.crps_model - crps).abs() < 1e-12);
        assert_eq!(r.rows_sha256, rows_sha256(&split));
        assert_eq!(r.rows_sha256.len(), 64);
    }

    fn target(name: &str, mse: f64, persistence: Option<f64>, nll: f64) -> TargetReport {
        let mut t: TargetReport = serde_json::from_value(serde_json::json!({
            "target": name, "mse_model": mse, "mse_persistence": persistence,
            "mse_train_mean": 1.0, "nll_model": nll, "nll_constant_variance": 1.0,
        }))
        .expect("an old report (without the uncertainty fields) still deserialises");
        t.rmse_model = mse.sqrt();
        t
    }

    #[test]
    fn verdict_names_the_baseline_and_skips_missing_ones() {
        let r = EvalReport {
            split: "test".into(),
            rows: 1,
            targets: vec![target("a", 0.5, None, 0.5), target("b", 0.5, None, 2.0)],
            rows_sha256: String::new(),
        };
        let v = r.verdict();
        assert!(!v.contains("persistence"), "{v}");
        assert!(v.contains("training mean yes"), "{v}");
        assert!(v.contains("constant variance NO (b)"), "{v}");
        assert!(!r.beats_all());
        let r = EvalReport {
            targets: vec![
                target("a", 0.5, Some(0.4), 0.5),
                target("b", 0.5, None, 0.5),
            ],
            ..r
        };
        let v = r.verdict();
        assert!(v.contains("persistence NO (a)"), "{v}");
        assert!(v.contains("constant variance yes"), "{v}");
    }

    #[test]
    fn variance_scales_make_standardised_residuals_unit() {
        let targets = vec![ColumnStats {
            name: "y".into(),
            mean: 0.0,
            std: 3.0,
            transform: Default::default(),
        }];
        // Residuals ±2 in original units with σ = 3·exp(0) = 3 → s² = 4/9.
        let pred = SplitPredictions {
            mean: vec![0.0, 0.0],
            log_var: vec![0.0, 0.0],
        };
        let s2 = variance_scales(&pred, &[2.0, -2.0], &targets, None);
        assert!((s2[0] - 4.0 / 9.0).abs() < 1e-12);
        let scaled = scale_variance(&pred, &s2);
        let again = variance_scales(&scaled, &[2.0, -2.0], &targets, None);
        assert!((again[0] - 1.0).abs() < 1e-6);
    }
}
