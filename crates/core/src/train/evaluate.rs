//! Evaluation on a split: the model against persistence and training-mean baselines, Gaussian
//! NLL against a constant-variance baseline, and the residual correlation between targets.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::data::dataset::Affine;
use crate::data::{ColumnStats, Subset};
use crate::model::RegressionNet;

use crate::util::HALF_LN_2PI;

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

/// Mean squared error of the mean head, normalised units (the stage-1 loss).
pub fn mse_normalised(pred: &SplitPredictions, y_raw: &[f32], y_norm: &Affine) -> f64 {
    let k = y_norm.scale.len();
    let mut sum = 0.0;
    for (i, (&m, &y)) in pred.mean.iter().zip(y_raw).enumerate() {
        let j = i % k;
        let yn = (y - y_norm.shift[j]) * y_norm.scale[j];
        sum += ((m - yn) as f64).powi(2);
    }
    sum / pred.mean.len().max(1) as f64
}

/// Gaussian NLL without the constant, normalised units (the stage-2 loss).
pub fn nll_normalised(pred: &SplitPredictions, y_raw: &[f32], y_norm: &Affine) -> f64 {
    let k = y_norm.scale.len();
    let mut sum = 0.0;
    for (i, ((&m, &lv), &y)) in pred.mean.iter().zip(&pred.log_var).zip(y_raw).enumerate() {
        let j = i % k;
        let yn = ((y - y_norm.shift[j]) * y_norm.scale[j]) as f64;
        let (m, lv) = (m as f64, lv as f64);
        sum += crate::util::gaussian_nll(yn, m, lv);
    }
    sum / pred.mean.len().max(1) as f64
}

/// One target's row of the evaluation table (original units).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetReport {
    /// Target column.
    pub target: String,
    /// MSE of the model's mean.
    pub mse_model: f64,
    /// MSE of predicting last season's value (feature `<target>_l1`), when that feature exists.
    pub mse_persistence: Option<f64>,
    /// MSE of predicting the training mean.
    pub mse_train_mean: f64,
    /// Mean Gaussian NLL of the model's mean and variance.
    pub nll_model: f64,
    /// Mean Gaussian NLL with the model's mean and one constant variance per target (the
    /// training split's mean squared residual).
    pub nll_constant_variance: f64,
}

impl TargetReport {
    /// Whether the model beats every baseline on this target.
    pub fn beats_all(&self) -> bool {
        self.mse_model < self.mse_train_mean
            && self.mse_persistence.is_none_or(|p| self.mse_model < p)
            && self.nll_model < self.nll_constant_variance
    }
}

/// The evaluation table on one split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// `test`, `validation`, …
    pub split: String,
    /// Rows evaluated.
    pub rows: usize,
    /// One row per target.
    pub targets: Vec<TargetReport>,
}

impl EvalReport {
    /// Whether the model beats every baseline on every target.
    pub fn beats_all(&self) -> bool {
        self.targets.iter().all(TargetReport::beats_all)
    }

    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{} split ({} rows), original units\n{:<12} {:>12} {:>12} {:>12} {:>10} {:>10} {:>8}\n",
            self.split,
            self.rows,
            "target",
            "mse model",
            "persistence",
            "train mean",
            "nll model",
            "nll const",
            "beats"
        );
        for t in &self.targets {
            s.push_str(&format!(
                "{:<12} {:>12.4e} {:>12} {:>12.4e} {:>10.4} {:>10.4} {:>8}\n",
                t.target,
                t.mse_model,
                t.mse_persistence
                    .map(|p| format!("{p:.4e}"))
                    .unwrap_or_else(|| "n/a".into()),
                t.mse_train_mean,
                t.nll_model,
                t.nll_constant_variance,
                if t.beats_all() { "yes" } else { "NO" }
            ));
        }
        s
    }
}

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
    let k = targets.len();
    let rows = split.rows();
    let mut reports = Vec::with_capacity(k);
    for j in 0..k {
        let (mut mse, mut mse_p, mut mse_m, mut nll, mut nll_c) = (0.0, 0.0, 0.0, 0.0, 0.0);
        let (ts, tm) = (targets[j].std, targets[j].mean);
        for i in 0..rows {
            let y = split.y[i * k + j] as f64;
            let mu = pred.mean[i * k + j] as f64 * ts + tm;
            let lv = pred.log_var[i * k + j] as f64 + 2.0 * ts.ln();
            let r2 = (y - mu).powi(2);
            mse += r2;
            mse_m += (y - tm).powi(2);
            if let Some(f) = persistence[j] {
                mse_p += (y - split.x[i * n_features + f] as f64).powi(2);
            }
            nll += HALF_LN_2PI + crate::util::gaussian_nll(y, mu, lv);
            let cv = constant_variance[j].max(1e-300);
            nll_c += HALF_LN_2PI + crate::util::gaussian_nll(y, mu, cv.ln());
        }
        let n = rows.max(1) as f64;
        reports.push(TargetReport {
            target: targets[j].name.clone(),
            mse_model: mse / n,
            mse_persistence: persistence[j].map(|_| mse_p / n),
            mse_train_mean: mse_m / n,
            nll_model: nll / n,
            nll_constant_variance: nll_c / n,
        });
    }
    EvalReport {
        split: split_name.to_string(),
        rows,
        targets: reports,
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

    #[test]
    fn perfectly_correlated_residuals_give_unit_correlation() {
        let targets = vec![
            ColumnStats {
                name: "a".into(),
                mean: 0.0,
                std: 1.0,
            },
            ColumnStats {
                name: "b".into(),
                mean: 0.0,
                std: 2.0,
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
        }];
        let split = Subset {
            x: vec![2.0, 0.0],
            y: vec![3.0, 1.0],
            season: vec![2017, 2018],
            source_rows: vec![0, 1],
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
    }
}
