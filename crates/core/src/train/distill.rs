//! Distillation: a student learns from a teacher's predictions (config `distill:`, stage
//! losses `distill_mse` and `distill_nll`).
//!
//! The teacher is injected as a [`Teacher`] through [`super::TrainJob::teacher`]: the run
//! layer loads the teacher's checkpoint, wraps the fastest engine and hands it down, so
//! training never loads checkpoints or picks engines itself. The session asks it once for the training split's
//! predictions and carries them beside the targets through the loader: each training row's
//! target vector becomes `[y (k), μ_T (k), σ_T (k)]`, all normalised by the student's target
//! statistics (σ_T by the target's std alone).
//!
//! The losses, on normalised units, per row and target, averaged:
//!
//! * `distill_mse`: `α·(μ − y)² + (1 − α)·(μ − μ_T)²`;
//! * `distill_nll`: `½·(log σ² + ((μ_T − μ)² + σ_T²)/σ²)`, the expectation of the Gaussian
//!   NLL of `y ~ N(μ_T, σ_T²)` — its minimum over σ² is at `σ² = (μ_T − μ)² + σ_T²`, the
//!   teacher's predictive variance plus the student's remaining disagreement with its mean.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::evaluate::{EvalReport, SplitPredictions};
use super::stage::StepOutput;
use crate::config::Loss;
use crate::data::ColumnStats;
#[cfg(test)]
use crate::model::RegressionOutput;

/// A teacher (or an ensemble): predictive mean and standard deviation in original units.
pub trait Teacher: Sync {
    /// Mean and standard deviation (`rows × k` row-major each) for raw feature rows
    /// `x_raw` (`rows × n_features`, the student's feature order and units).
    fn predict(&self, x_raw: &[f32], rows: usize) -> Result<(Vec<f32>, Vec<f32>), String>;
    /// What the manifest records under `teacher`: run ids, parameter counts, directories.
    fn describe(&self) -> crate::records::metrics::TeacherInfo;
}

/// Moment-match an ensemble: `μ = avg μ_i`, `σ² = avg(σ_i² + μ_i²) − μ²` (elementwise).
pub fn moment_match(members: &[(Vec<f32>, Vec<f32>)]) -> (Vec<f32>, Vec<f32>) {
    let n = members.len().max(1) as f64;
    let len = members.first().map_or(0, |m| m.0.len());
    let mut mean = Vec::with_capacity(len);
    let mut std = Vec::with_capacity(len);
    for i in 0..len {
        let mu = members.iter().map(|m| m.0[i] as f64).sum::<f64>() / n;
        let second = members
            .iter()
            .map(|m| (m.1[i] as f64).powi(2) + (m.0[i] as f64).powi(2))
            .sum::<f64>()
            / n;
        mean.push(mu as f32);
        std.push((second - mu * mu).max(0.0).sqrt() as f32);
    }
    (mean, std)
}

/// The training targets with the teacher's predictions beside them: row `i` is
/// `[y_i (k), μ_T,i (k), σ_T,i (k)]` (original units), and the statistics that normalise it.
pub fn widen_targets(
    y: &[f32],
    t_mean: &[f32],
    t_std: &[f32],
    y_stats: &[ColumnStats],
) -> (Vec<f32>, Vec<ColumnStats>) {
    let k = y_stats.len();
    let rows = y.len() / k.max(1);
    let mut out = Vec::with_capacity(rows * 3 * k);
    for i in 0..rows {
        out.extend_from_slice(&y[i * k..(i + 1) * k]);
        out.extend_from_slice(&t_mean[i * k..(i + 1) * k]);
        out.extend_from_slice(&t_std[i * k..(i + 1) * k]);
    }
    let mut stats = y_stats.to_vec();
    stats.extend(y_stats.iter().map(|s| ColumnStats {
        name: format!("{}_teacher_mean", s.name),
        ..s.clone()
    }));
    stats.extend(y_stats.iter().map(|s| ColumnStats {
        name: format!("{}_teacher_std", s.name),
        mean: 0.0,
        std: s.std,
        transform: Default::default(),
    }));
    (out, stats)
}

/// A distillation stage's loss on a batch whose targets are `[y, μ_T, σ_T]` (`rows × 3k`,
/// normalised; see [`widen_targets`]).
pub fn distill_loss<B: Backend>(
    loss: Loss,
    alpha: f64,
    mean_trainable: bool,
    out: StepOutput<B>,
    y_wide: Tensor<B, 2>,
    w: Option<Tensor<B, 2>>,
) -> Tensor<B, 1> {
    use super::stage::weighted_mean;
    let [rows, width] = y_wide.dims();
    let k = width / 3;
    let y = y_wide.clone().slice([0..rows, 0..k]);
    let t_mean = y_wide.clone().slice([0..rows, k..2 * k]);
    let t_std = y_wide.slice([0..rows, 2 * k..3 * k]);
    match loss {
        Loss::DistillMse => {
            let on_y = weighted_mean((out.mean.clone() - y).powi_scalar(2), w.as_ref());
            let on_t = weighted_mean((out.mean - t_mean).powi_scalar(2), w.as_ref());
            on_y.mul_scalar(alpha) + on_t.mul_scalar(1.0 - alpha)
        }
        Loss::DistillNll => {
            let mean = if mean_trainable {
                out.mean
            } else {
                out.mean.detach()
            };
            let lv = out
                .log_var
                .expect("a DistillNll step computes the log-variance head");
            let second = (t_mean - mean).powi_scalar(2) + t_std.powi_scalar(2);
            weighted_mean(
                (lv.clone() + second * lv.neg().exp()).mul_scalar(0.5),
                w.as_ref(),
            )
        }
        other => {
            // An ordinary stage of a distillation run: the true targets only.
            super::stage::stage_loss(other, mean_trainable, out, y, w)
        }
    }
}

/// Predictions in original units (mean, std) as the student's normalised outputs, so the
/// evaluation table can score the teacher like the student.
pub fn normalised_predictions(
    mean: &[f32],
    std: &[f32],
    y_stats: &[ColumnStats],
) -> SplitPredictions {
    let k = y_stats.len();
    SplitPredictions {
        mean: mean
            .iter()
            .enumerate()
            .map(|(i, &m)| ((m as f64 - y_stats[i % k].mean) / y_stats[i % k].std) as f32)
            .collect(),
        log_var: std
            .iter()
            .enumerate()
            .map(|(i, &s)| (2.0 * (s as f64 / y_stats[i % k].std).max(1e-30).ln()) as f32)
            .collect(),
    }
}

/// The test table with student and teacher side by side, beside the baselines.
pub fn side_by_side(student: &EvalReport, teacher: &EvalReport) -> String {
    let mut s = format!(
        "{} split ({} rows), original units: student vs teacher\n{:<12} {:>12} {:>12} {:>12} {:>12} {:>11} {:>11} {:>10}\n",
        student.split,
        student.rows,
        "target",
        "mse student",
        "mse teacher",
        "persistence",
        "train mean",
        "nll student",
        "nll teacher",
        "nll const"
    );
    for (a, b) in student.targets.iter().zip(&teacher.targets) {
        s.push_str(&format!(
            "{:<12} {:>12.4e} {:>12.4e} {:>12} {:>12.4e} {:>11.4} {:>11.4} {:>10.4}\n",
            a.target,
            a.mse_model,
            b.mse_model,
            a.mse_persistence
                .map(|p| format!("{p:.4e}"))
                .unwrap_or_else(|| "n/a".into()),
            a.mse_train_mean,
            a.nll_model,
            b.nll_model,
            a.nll_constant_variance
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    #[test]
    fn an_ensemble_of_one_is_itself_and_of_two_adds_the_spread() {
        let a = (vec![1.0f32, 2.0], vec![0.5f32, 1.0]);
        assert_eq!(moment_match(std::slice::from_ref(&a)), a);
        let b = (vec![3.0f32, 2.0], vec![0.5f32, 1.0]);
        let (m, s) = moment_match(&[a, b]);
        assert_eq!(m, vec![2.0, 2.0]);
        // var = 0.25 + spread 1 → std √1.25; identical members add nothing.
        assert!((s[0] - 1.25f32.sqrt()).abs() < 1e-6 && (s[1] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn the_losses_match_their_formulas() {
        let d = Default::default();
        let t = |v: Vec<f32>, c: usize| {
            Tensor::<Flex, 2>::from_data(TensorData::new(v.clone(), [v.len() / c, c]), &d)
        };
        let out = || {
            StepOutput::from(RegressionOutput {
                mean: t(vec![1.0, 0.0], 1),
                log_var: t(vec![0.0, 2f32.ln()], 1),
            })
        };
        // rows: [y, μ_T, σ_T] = [2, 0, 1], [1, 1, 2]
        let y = || t(vec![2.0, 0.0, 1.0, 1.0, 1.0, 2.0], 3);
        let mse: f32 = distill_loss(Loss::DistillMse, 0.25, true, out(), y(), None).into_scalar();
        // α·mean((1−2)², (0−1)²) + (1−α)·mean((1−0)², (0−1)²) = 0.25 + 0.75
        assert!((mse - 1.0).abs() < 1e-6, "{mse}");
        let nll: f32 = distill_loss(Loss::DistillNll, 0.25, false, out(), y(), None).into_scalar();
        // row 1: ½(0 + (1 + 1)/1) = 1; row 2: ½(ln 2 + (1 + 4)/2) = ½ ln 2 + 1.25
        let want = (1.0 + 0.5 * 2f32.ln() + 1.25) / 2.0;
        assert!((nll - want).abs() < 1e-6, "{nll} vs {want}");
        let plain: f32 = distill_loss(Loss::Mse, 0.25, true, out(), y(), None).into_scalar();
        assert!((plain - 1.0).abs() < 1e-6, "true targets only: {plain}");
        let stats = vec![ColumnStats {
            name: "y".into(),
            mean: 1.0,
            std: 2.0,
            transform: Default::default(),
        }];
        let (w, s) = widen_targets(&[5.0, 6.0], &[4.0, 7.0], &[0.5, 1.5], &stats);
        assert_eq!(w, vec![5.0, 4.0, 0.5, 6.0, 7.0, 1.5]);
        assert_eq!((s[1].mean, s[2].mean, s[2].std), (1.0, 0.0, 2.0));
    }
}
