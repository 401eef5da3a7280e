//! One optimizer step as a function over a small context: host → device copy, forward pass,
//! loss, backward pass, global-norm clipping and the optimizer's update, each phase timed and
//! wrapped in its profiler span. Generic over the autodiff backend: the same step runs on
//! Flex, NdArray and CUDA.
//!
//! The epoch loop (`super::session`) owns the data wait, the step's log row and the counters;
//! [`step`] owns only the arithmetic of one batch.

use std::time::{Duration, Instant};

use burn::module::ParamId;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor, TensorData};

use super::adamw::StageAdamW;
use super::clip::clip_global_norm;
use super::distill::distill_loss;
use super::stage::{StepOutput, part_param_ids, stage_loss};
use crate::config::{Part, StageConfig};
use crate::data::loader::HostBatch;
use crate::model::{RegressionNet, RegressionNetConfig};
use crate::observe::profiler;
use crate::records::StepPhases;

/// The optimizer a stage builds afresh.
pub type StageOptimizer<B> = StageAdamW<RegressionNet<B>, B>;

/// What every step of a stage shares: the device, the stage (loss, clipping), the parameters
/// it trains and the shapes of a batch.
pub struct StepContext<'a, B: AutodiffBackend> {
    /// Where the step runs.
    pub device: &'a B::Device,
    /// The stage: its loss, trainable parts and clipping.
    pub stage: &'a StageConfig,
    /// The ids of the stage's trainable parameters (the gradients kept).
    pub trainable: Vec<ParamId>,
    /// The distillation weight of the true targets (1 without a teacher).
    pub alpha: f64,
    /// Features per row.
    pub n_features: usize,
    /// Targets per row (a batch with a teacher's predictions has `3 ×` as many columns).
    pub n_targets: usize,
}

impl<'a, B: AutodiffBackend> StepContext<'a, B> {
    /// The context of `stage`'s steps on `model` of architecture `arch`.
    pub fn new(
        device: &'a B::Device,
        stage: &'a StageConfig,
        model: &RegressionNet<B>,
        arch: &RegressionNetConfig,
        alpha: f64,
    ) -> Self {
        Self {
            device,
            stage,
            trainable: part_param_ids(model, &stage.trainable),
            alpha,
            n_features: arch.n_features,
            n_targets: arch.n_targets,
        }
    }
}

/// The network being trained. The optimizer owns the parameters during its update, so the
/// network is held in an `Option` and taken out meanwhile: the update happens in place (a clone
/// of the model would share the buffers and make every step copy them first), and no
/// placeholder network is ever built. (A 0-feature placeholder used to hold its place: its
/// `[0, 0]` weights are zero-element device tensors, which CubeCL's CUDA runtime rejects with
/// `UnsupportedStrides`, reported at the next read — the loss — so every CUDA run died in its
/// first epoch. [`RegressionNetConfig::init`] now refuses zero-sized layers.)
pub struct Trainee<B: AutodiffBackend> {
    model: Option<RegressionNet<B>>,
}

impl<B: AutodiffBackend> Trainee<B> {
    /// Wrap `model`.
    pub fn new(model: RegressionNet<B>, _device: &B::Device) -> Self {
        Self { model: Some(model) }
    }

    /// The network.
    pub fn model(&self) -> &RegressionNet<B> {
        self.model
            .as_ref()
            .expect("the network is only taken out during an update")
    }

    /// Replace the network (a restored best epoch, a stage's freezing).
    pub fn set(&mut self, model: RegressionNet<B>) {
        self.model = Some(model);
    }

    /// Apply `f` to the network, which it owns meanwhile.
    pub fn update(&mut self, f: impl FnOnce(RegressionNet<B>) -> RegressionNet<B>) {
        let model = self
            .model
            .take()
            .expect("the network is only taken out during an update");
        self.model = Some(f(model));
    }

    /// The network.
    pub fn into_model(self) -> RegressionNet<B> {
        self.model
            .expect("the network is only taken out during an update")
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Rows in the batch.
    pub rows: usize,
    /// The loss before the update.
    pub loss: f64,
    /// The gradients' global norm before clipping.
    pub grad_norm: f64,
    /// Seconds per phase (`data` is the caller's: 0 here).
    pub phases: StepPhases,
    /// Wall time of the whole step.
    pub compute: Duration,
}

/// The loss of a batch was NaN or infinite (the model is left as it was).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFiniteLoss(pub f64);

/// Where a step is: its stage, epoch, and step within the stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepAt {
    /// Stage index.
    pub stage: usize,
    /// Epoch in the stage (0-based).
    pub epoch: usize,
    /// Optimizer steps taken in the stage before this one.
    pub stage_step: u64,
}

/// One optimizer step of `trainee` on `batch` at learning rate `lr`.
pub fn step<B: AutodiffBackend>(
    ctx: &StepContext<'_, B>,
    trainee: &mut Trainee<B>,
    optim: &mut StageOptimizer<B>,
    lr: f64,
    batch: HostBatch,
) -> Result<StepStats, NonFiniteLoss> {
    let start = Instant::now();
    let mut clock = PhaseClock(start);
    let mut phases = StepPhases::default();
    let (device, stage, rows) = (ctx.device, ctx.stage, batch.rows);
    let w = (!batch.w.is_empty())
        .then(|| Tensor::<B, 2>::from_data(TensorData::new(batch.w, [rows, 1]), device));
    let (x, y) = {
        let _s = crate::prof_span!("h2d", shape = ?[rows, ctx.n_features]).entered();
        let x = Tensor::<B, 2>::from_data(TensorData::new(batch.x, [rows, ctx.n_features]), device);
        // `n_targets` targets, or `3·n_targets` with a teacher's predictions beside them.
        let ny = batch.y.len() / rows.max(1);
        let y = Tensor::<B, 2>::from_data(TensorData::new(batch.y, [rows, ny]), device);
        profiler::sync::<B>(device);
        (x, y)
    };
    phases.h2d = clock.lap();
    let mean_trainable = stage.trainable.contains(&Part::MeanHead);
    let out = {
        let _s = crate::prof_span!("forward", shape = ?[rows, ctx.n_features]).entered();
        let out = StepOutput::forward(trainee.model(), stage.loss, mean_trainable, x);
        profiler::sync::<B>(device);
        out
    };
    phases.forward = clock.lap();
    let (loss, loss_value) = {
        let _s = crate::prof_span!("loss").entered();
        let loss = if y.dims()[1] > ctx.n_targets {
            distill_loss(stage.loss, ctx.alpha, mean_trainable, out, y, w)
        } else {
            stage_loss(stage.loss, mean_trainable, out, y, w)
        };
        let v: f64 = loss.clone().into_scalar().elem::<f64>();
        (loss, v)
    };
    phases.loss = clock.lap();
    if !loss_value.is_finite() {
        return Err(NonFiniteLoss(loss_value));
    }
    let mut grads = {
        let _s = crate::prof_span!("backward").entered();
        let mut g = loss.backward();
        let grads = GradientsParams::from_params(&mut g, trainee.model(), &ctx.trainable);
        profiler::sync::<B>(device);
        grads
    };
    phases.backward = clock.lap();
    let grad_norm = {
        let _s = crate::prof_span!("clip").entered();
        clip_global_norm::<B, _>(trainee.model(), &mut grads, stage.clip_norm)
    };
    phases.clip = clock.lap();
    {
        let _s = crate::prof_span!("optimizer_step").entered();
        trainee.update(|model| optim.step(lr, model, grads));
        profiler::sync::<B>(device);
    }
    phases.optimizer = clock.lap();
    Ok(StepStats {
        rows,
        loss: loss_value,
        grad_norm,
        phases,
        compute: start.elapsed(),
    })
}

/// Seconds since the previous lap.
struct PhaseClock(Instant);

impl PhaseClock {
    fn lap(&mut self) -> f64 {
        let now = Instant::now();
        let d = now - self.0;
        self.0 = now;
        d.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{TrainCpu, TrainNdArray};
    use crate::config::{Loss, OptimizerConfig};
    use burn::module::AutodiffModule;

    fn arch() -> RegressionNetConfig {
        RegressionNetConfig {
            n_features: 4,
            hidden: vec![8],
            n_targets: 2,
            activation: crate::model::Activation::Relu,
        }
    }

    /// A batch of `rows` rows (normalised units), every row weighted 1 unless `w` is given.
    fn batch(rows: usize, w: Vec<f32>) -> HostBatch {
        let (nf, nt) = (arch().n_features, arch().n_targets);
        HostBatch {
            index: 0,
            rows,
            x: (0..rows * nf)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0)
                .collect(),
            y: (0..rows * nt)
                .map(|i| ((i * 3 % 5) as f32 - 2.0) / 2.0)
                .collect(),
            row_ids: (0..rows as u32).collect(),
            w,
        }
    }

    /// Two steps of the same stage on backend `B`: their statistics and the weights after.
    fn two_steps<B: AutodiffBackend>(loss: Loss, clip: Option<f64>) -> (Vec<StepStats>, Vec<f32>) {
        let device = Default::default();
        let mut stage = super::super::stage::test_stage(OptimizerConfig {
            lr: 1e-2,
            ..OptimizerConfig::default()
        });
        stage.loss = loss;
        stage.clip_norm = clip;
        if loss == Loss::GaussianNll {
            stage.trainable = vec![Part::LogvarHead];
        }
        let model =
            super::super::stage::set_trainable(arch().init::<B>(3, &device), &stage.trainable);
        let ctx = StepContext::new(&device, &stage, &model, &arch(), 1.0);
        let mut trainee = Trainee::new(model, &device);
        let mut optim = super::super::adamw::stage_optimizer::<B, RegressionNet<B>>(&stage);
        let stats = [batch(16, Vec::new()), batch(5, vec![0.5; 5])]
            .into_iter()
            .map(|b| step(&ctx, &mut trainee, &mut optim, 1e-2, b).unwrap())
            .collect();
        let w = crate::artifact::HostWeights::from_model(&trainee.into_model().valid());
        let flat = w
            .named()
            .iter()
            .flat_map(|(_, l)| l.w.iter().chain(&l.b).copied())
            .collect();
        (stats, flat)
    }

    #[test]
    fn the_same_step_runs_on_every_cpu_backend() {
        for (loss, clip) in [(Loss::Mse, Some(0.1)), (Loss::GaussianNll, None)] {
            let (flex, wf) = two_steps::<TrainCpu>(loss, clip);
            let (nd, wn) = two_steps::<TrainNdArray>(loss, clip);
            for (a, b) in flex.iter().zip(&nd) {
                assert!((a.loss - b.loss).abs() < 1e-5, "{loss:?}: {a:?} vs {b:?}");
                assert!((a.grad_norm - b.grad_norm).abs() < 1e-4, "{a:?} vs {b:?}");
            }
            assert_eq!(flex.iter().map(|s| s.rows).collect::<Vec<_>>(), [16, 5]);
            let p = flex[0].phases;
            assert_eq!(p.data, 0.0, "the data wait is the caller's");
            for v in [p.h2d, p.forward, p.loss, p.backward, p.clip, p.optimizer] {
                assert!(v >= 0.0 && v <= flex[0].compute.as_secs_f64(), "{p:?}");
            }
            let worst = wf
                .iter()
                .zip(&wn)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(worst < 1e-5, "{loss:?}: weights differ by {worst}");
        }
    }

    #[test]
    fn a_non_finite_loss_stops_the_step_before_the_update() {
        type B = TrainCpu;
        let device = Default::default();
        let stage = super::super::stage::test_stage(OptimizerConfig::default());
        let model = arch().init::<B>(1, &device);
        let ctx = StepContext::new(&device, &stage, &model, &arch(), 1.0);
        let before = crate::artifact::HostWeights::from_model(&model.valid());
        let mut trainee = Trainee::new(model, &device);
        let mut optim = super::super::adamw::stage_optimizer::<B, RegressionNet<B>>(&stage);
        let mut b = batch(4, Vec::new());
        b.y[3] = f32::NAN;
        let e = step(&ctx, &mut trainee, &mut optim, 1e-2, b).unwrap_err();
        assert!(e.0.is_nan());
        let after = crate::artifact::HostWeights::from_model(&trainee.model().valid());
        assert_eq!(before, after);
    }
}
