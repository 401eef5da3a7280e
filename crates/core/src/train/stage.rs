//! One stage's pieces: which parts train (freezing), the stage's fresh AdamW, and its loss.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::AdamWConfig;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::config::{Loss, Part, StageConfig};
use crate::model::{RegressionNet, RegressionOutput};

/// Sets `require_grad` on every parameter it maps.
struct RequireGrad(bool);

impl<B: Backend> ModuleMapper<B> for RequireGrad {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        param.set_require_grad(self.0)
    }
}

/// Collects parameter ids.
#[derive(Default)]
struct Ids(Vec<ParamId>);

impl<B: Backend> ModuleVisitor<B> for Ids {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(param.id);
    }
}

/// Freeze every part not in `parts` and unfreeze those in it.
pub fn set_trainable<B: AutodiffBackend>(
    mut m: RegressionNet<B>,
    parts: &[Part],
) -> RegressionNet<B> {
    let on = |p: Part| parts.contains(&p);
    m.backbone = m.backbone.map(&mut RequireGrad(on(Part::Backbone)));
    m.mean_head = m.mean_head.map(&mut RequireGrad(on(Part::MeanHead)));
    m.logvar_head = m.logvar_head.map(&mut RequireGrad(on(Part::LogvarHead)));
    m
}

/// The parameter ids of the given parts.
pub fn part_param_ids<B: Backend>(m: &RegressionNet<B>, parts: &[Part]) -> Vec<ParamId> {
    let mut ids = Ids::default();
    for p in parts {
        match p {
            Part::Backbone => m.backbone.visit(&mut ids),
            Part::MeanHead => m.mean_head.visit(&mut ids),
            Part::LogvarHead => m.logvar_head.visit(&mut ids),
        }
    }
    ids.0
}

/// AdamW with the stage's hyper-parameters (decoupled weight decay).
pub fn adamw(stage: &StageConfig) -> AdamWConfig {
    let o = &stage.optimizer;
    AdamWConfig::new()
        .with_beta_1(o.beta1 as f32)
        .with_beta_2(o.beta2 as f32)
        .with_epsilon(o.eps as f32)
        .with_weight_decay(o.weight_decay as f32)
}

/// The mean of per-element losses `l` (`rows × k`), each row weighted by `w` (`rows × 1`,
/// the batch's sample weights normalised to mean 1 over the training split; `None`: equal).
pub fn weighted_mean<B: Backend>(l: Tensor<B, 2>, w: Option<&Tensor<B, 2>>) -> Tensor<B, 1> {
    match w {
        None => l.mean(),
        Some(w) => (l * w.clone()).mean(),
    }
}

/// What a training step's forward pass gives the loss: the mean head's output, and the
/// log-variance head's when the stage's loss reads it ([`Loss::reads_log_var`]; an MSE stage
/// leaves that head's forward out).
#[derive(Debug, Clone)]
pub struct StepOutput<B: Backend> {
    /// Predicted means, `[batch, k]` (a packed ensemble's: the members' mean).
    pub mean: Tensor<B, 2>,
    /// Predicted log-variances, `[batch, k]`, when computed.
    pub log_var: Option<Tensor<B, 2>>,
    /// A packed ensemble's members' means, `[members, batch, k]`: the loss fits each member
    /// on its own error.
    pub members: Option<Tensor<B, 3>>,
}

impl<B: Backend> StepOutput<B> {
    /// The step's forward pass on `model` for a stage with loss `loss`; a packed ensemble's
    /// members' means only when `mean_trainable` (a frozen mean's loss reads the ensemble
    /// mean alone).
    pub fn forward(
        model: &RegressionNet<B>,
        loss: Loss,
        mean_trainable: bool,
        x: Tensor<B, 2>,
    ) -> Self {
        if model.members > 1 && mean_trainable {
            let o = model.forward_members(x, loss.reads_log_var());
            return Self {
                mean: o.mean,
                log_var: o.log_var,
                members: Some(o.members),
            };
        }
        if loss.reads_log_var() {
            model.forward(x).into()
        } else {
            Self {
                mean: model.forward_mean(x),
                log_var: None,
                members: None,
            }
        }
    }

    /// The squared error of the means against `y` (`[batch, k]`), per element; a packed
    /// ensemble's, while its means train, is the members' mean squared error (each member
    /// fitted on its own error, not the ensemble on the mean's). `detach` (a frozen mean):
    /// the ensemble mean's, and no gradient reaches it.
    fn squared_error(
        mean: Tensor<B, 2>,
        members: Option<Tensor<B, 3>>,
        y: Tensor<B, 2>,
        detach: bool,
    ) -> Tensor<B, 2> {
        match members {
            // A frozen mean (a variance stage): a packed ensemble's residual is its mean's,
            // the one the served variance describes.
            _ if detach => (mean.detach() - y).powi_scalar(2),
            None => (mean - y).powi_scalar(2),
            Some(m) => {
                let [_, rows, k] = m.dims();
                (m - y.unsqueeze_dim(0))
                    .powi_scalar(2)
                    .mean_dim(0)
                    .reshape([rows, k])
            }
        }
    }
}

impl<B: Backend> From<RegressionOutput<B>> for StepOutput<B> {
    fn from(o: RegressionOutput<B>) -> Self {
        Self {
            mean: o.mean,
            log_var: Some(o.log_var),
            members: None,
        }
    }
}

/// The stage's loss on a batch (normalised units), rows weighted by `w` (see
/// [`weighted_mean`]). The distillation losses, given no teacher targets (`y` is
/// `rows × k`), reduce to their true-target parts: MSE and Gaussian NLL (see
/// [`super::distill::distill_loss`] for the real thing).
pub fn stage_loss<B: Backend>(
    loss: Loss,
    mean_trainable: bool,
    out: StepOutput<B>,
    y: Tensor<B, 2>,
    w: Option<Tensor<B, 2>>,
) -> Tensor<B, 1> {
    let StepOutput {
        mean,
        log_var,
        members,
    } = out;
    match loss {
        Loss::Mse | Loss::DistillMse => weighted_mean(
            StepOutput::squared_error(mean, members, y, false),
            w.as_ref(),
        ),
        Loss::GaussianNll | Loss::DistillNll => {
            let sq = StepOutput::squared_error(mean, members, y, !mean_trainable);
            let lv =
                log_var.expect("a loss that reads the log-variance head gets its forward pass");
            weighted_mean(
                (lv.clone() + sq * lv.neg().exp()).mul_scalar(0.5),
                w.as_ref(),
            )
        }
    }
}

/// A one-epoch MSE stage of the backbone and the mean head with `optimizer` (the tests'
/// stage).
#[cfg(test)]
pub(crate) fn test_stage(optimizer: crate::config::OptimizerConfig) -> StageConfig {
    use crate::config::ScheduleConfig;
    StageConfig {
        name: "s".into(),
        trainable: vec![Part::Backbone, Part::MeanHead],
        loss: Loss::Mse,
        epochs: 1,
        optimizer,
        schedule: ScheduleConfig::Constant,
        clip_norm: None,
        early_stopping: None,
        select: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OptimizerConfig;
    use crate::model::RegressionNetConfig;
    use burn::backend::{Autodiff, Flex};
    use burn::nn::Linear;
    use burn::optim::{GradientsParams, Optimizer};
    use burn::tensor::TensorData;

    type B = Autodiff<Flex>;

    fn stage(lr: f64, wd: f64) -> StageConfig {
        test_stage(OptimizerConfig {
            lr,
            weight_decay: wd,
            ..OptimizerConfig::default()
        })
    }

    /// Two AdamW steps on loss = Σ c ⊙ w (constant gradient c) against the closed form:
    /// m_t = (1−β1^t)c, v_t = (1−β2^t)c², m̂ = c, v̂ = c², so each step is
    /// w ← w(1 − lr·wd) − lr·c/(|c| + eps).
    #[test]
    fn adamw_steps_match_the_closed_form() {
        let d = Default::default();
        let (lr, wd, eps) = (0.1f64, 0.01f64, 1e-8f64);
        let w0 = [0.5f32, -1.5, 2.0];
        let c = [0.3f32, -2.0, 1e-3];
        let mut lin: Linear<B> =
            crate::model::regression::linear_from(w0.to_vec(), vec![0.0], 3, 1, &d);
        let st = stage(lr, wd);
        let mut optim = super::super::adamw::stage_optimizer::<B, Linear<B>>(&st);
        let mut expect: Vec<f64> = w0.iter().map(|&v| v as f64).collect();
        for _ in 0..2 {
            let ct = Tensor::<B, 2>::from_data(TensorData::new(c.to_vec(), [3, 1]), &d);
            let loss = (lin.weight.val() * ct).sum();
            let grads = GradientsParams::from_params(&mut loss.backward(), &lin, &[lin.weight.id]);
            lin = optim.step(lr, lin, grads);
            for (e, &g) in expect.iter_mut().zip(&c) {
                let g = g as f64;
                *e = *e * (1.0 - lr * wd) - lr * g / (g.abs() + eps);
            }
        }
        let got: Vec<f32> = lin.weight.val().into_data().to_vec().unwrap();
        for (g, e) in got.iter().zip(&expect) {
            assert!((*g as f64 - e).abs() < 1e-6, "{got:?} vs {expect:?}");
        }
        // The bias had no gradient (not in the id list): untouched, no weight decay.
        let b: Vec<f32> = lin
            .bias
            .as_ref()
            .unwrap()
            .val()
            .into_data()
            .to_vec()
            .unwrap();
        assert_eq!(b, vec![0.0]);
    }

    #[test]
    fn freezing_removes_gradients_from_frozen_parts() {
        let d = Default::default();
        let arch = RegressionNetConfig::reference();
        let m = set_trainable(arch.init::<B>(1, &d), &[Part::LogvarHead]);
        let out = m.forward(Tensor::ones([4, 20], &d));
        let y = Tensor::zeros([4, 3], &d);
        let loss = stage_loss(Loss::GaussianNll, false, out.into(), y, None);
        let mut g = loss.backward();
        let all = part_param_ids(&m, &[Part::Backbone, Part::MeanHead, Part::LogvarHead]);
        let grads = GradientsParams::from_params(&mut g, &m, &all);
        assert_eq!(
            grads.len(),
            2,
            "only the log-variance head's weight and bias get gradients"
        );
        assert_eq!(part_param_ids(&m, &[Part::LogvarHead]).len(), 2);
        assert_eq!(part_param_ids(&m, &[Part::Backbone]).len(), 4);
    }
}
