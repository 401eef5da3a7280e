//! An epoch's numbers: [`EpochStats`] accumulates its steps (loss, gradient norms, clipping,
//! samples, data wait and compute), [`Validation`] scores the model on the validation split,
//! and the two make the epoch's [`EpochRecord`].

use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;

use super::evaluate::{mse_normalised, nll_normalised, predict_split};
use super::step::StepStats;
use crate::config::Loss;
use crate::data::Subset;
use crate::data::dataset::Affine;
use crate::model::RegressionNet;
use crate::records::{EpochRecord, StepPhases};

/// The running totals of an epoch's steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EpochStats {
    wait: Duration,
    compute: Duration,
    phases: StepPhases,
    loss_sum: f64,
    norm_sum: f64,
    norm_max: f64,
    clipped: u64,
    steps: u64,
    samples: usize,
}

impl EpochStats {
    /// Count a step that waited `wait` for its batch; `clip_norm` is the stage's threshold.
    pub fn add(&mut self, wait: Duration, step: &StepStats, clip_norm: Option<f64>) {
        self.wait += wait;
        self.compute += step.compute;
        self.phases = self.phases.plus(step.phases);
        self.loss_sum += step.loss;
        self.norm_sum += step.grad_norm;
        self.norm_max = self.norm_max.max(step.grad_norm);
        if clip_norm.is_some_and(|c| step.grad_norm > c) {
            self.clipped += 1;
        }
        self.steps += 1;
        self.samples += step.rows;
    }

    /// Steps counted.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Samples a second of step time so far (the progress display's figure).
    pub fn samples_per_s(&self) -> f64 {
        self.samples as f64 / self.elapsed().max(1e-9)
    }

    /// The fraction of step time spent waiting for data so far.
    pub fn wait_frac(&self) -> f64 {
        self.wait.as_secs_f64() / self.elapsed().max(1e-9)
    }

    fn elapsed(&self) -> f64 {
        (self.wait + self.compute).as_secs_f64()
    }

    /// The epoch's record: these steps, then `validation`, at the last step's `lr`.
    pub fn record(
        &self,
        stage: usize,
        stage_name: &str,
        epoch: usize,
        lr: f64,
        validation: &Validation,
    ) -> EpochRecord {
        let steps = self.steps.max(1) as f64;
        let step_time = self.elapsed().max(1e-12);
        EpochRecord {
            stage,
            stage_name: stage_name.to_string(),
            epoch,
            steps: self.steps,
            train_loss: self.loss_sum / steps,
            val_loss: validation.loss,
            lr,
            grad_norm_mean: self.norm_sum / steps,
            grad_norm_max: self.norm_max,
            clipped_frac: self.clipped as f64 / steps,
            samples_per_s: self.samples as f64 / step_time,
            data_wait_frac: self.wait.as_secs_f64() / step_time,
            data_wait_s: self.wait.as_secs_f64(),
            compute_s: self.compute.as_secs_f64(),
            validation_s: validation.seconds,
            phase_s: StepPhases {
                data: self.wait.as_secs_f64(),
                ..self.phases
            },
        }
    }
}

/// The model's loss on the validation split after an epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Validation {
    /// The stage's loss against the true targets (normalised units; in distillation stages
    /// too), weighted like training.
    pub loss: f64,
    /// Wall time it took.
    pub seconds: f64,
}

impl Validation {
    /// Score `model` (no autodiff) on `split` with the stage's `loss`; `x_norm`/`y_norm` are
    /// the training normalisation.
    pub fn run<B: Backend>(
        model: &RegressionNet<B>,
        split: &Subset,
        x_norm: &Affine,
        y_norm: &Affine,
        loss: Loss,
        device: &B::Device,
    ) -> Self {
        let started = Instant::now();
        let loss = {
            let _s = crate::prof_span!("validation").entered();
            let pred = predict_split(model, &split.x, x_norm, device);
            match loss {
                Loss::Mse | Loss::DistillMse => {
                    mse_normalised(&pred, &split.y, y_norm, split.weights())
                }
                Loss::GaussianNll | Loss::DistillNll => {
                    nll_normalised(&pred, &split.y, y_norm, split.weights())
                }
            }
        };
        Self {
            loss,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(rows: usize, loss: f64, grad_norm: f64, compute_ms: u64) -> StepStats {
        StepStats {
            rows,
            loss,
            grad_norm,
            phases: StepPhases {
                forward: compute_ms as f64 / 2e3,
                optimizer: compute_ms as f64 / 2e3,
                ..StepPhases::default()
            },
            compute: Duration::from_millis(compute_ms),
        }
    }

    #[test]
    fn an_epochs_statistics_add_up_its_steps() {
        let mut s = EpochStats::default();
        s.add(
            Duration::from_millis(10),
            &step(64, 1.0, 0.5, 30),
            Some(1.0),
        );
        s.add(
            Duration::from_millis(30),
            &step(64, 3.0, 2.0, 50),
            Some(1.0),
        );
        s.add(Duration::ZERO, &step(8, 2.0, 1.5, 20), Some(1.0));
        assert_eq!(s.steps(), 3);
        let v = Validation {
            loss: 0.25,
            seconds: 0.5,
        };
        let r = s.record(1, "variance", 4, 1e-3, &v);
        assert_eq!(
            (r.stage, r.stage_name.as_str(), r.epoch),
            (1, "variance", 4)
        );
        assert_eq!(r.steps, 3);
        assert_eq!(r.train_loss, 2.0);
        assert_eq!(r.grad_norm_mean, 4.0 / 3.0);
        assert_eq!(r.grad_norm_max, 2.0);
        assert_eq!(r.clipped_frac, 2.0 / 3.0, "two norms above the threshold");
        assert_eq!((r.val_loss, r.validation_s, r.lr), (0.25, 0.5, 1e-3));
        // 136 samples in 0.04 s of wait and 0.1 s of compute.
        assert!((r.samples_per_s - 136.0 / 0.14).abs() < 1e-9, "{r:?}");
        assert!((r.data_wait_frac - 0.04 / 0.14).abs() < 1e-12);
        assert!((r.data_wait_s - 0.04).abs() < 1e-12 && (r.compute_s - 0.1).abs() < 1e-12);
        assert!((r.phase_s.data - 0.04).abs() < 1e-12);
        assert!((r.phase_s.forward - 0.05).abs() < 1e-12, "{:?}", r.phase_s);
        assert_eq!(s.samples_per_s(), r.samples_per_s);
        assert_eq!(s.wait_frac(), r.data_wait_frac);
        // Without clipping nothing counts as clipped; an epoch without steps divides by 1.
        let mut n = EpochStats::default();
        n.add(Duration::ZERO, &step(1, 1.0, 9.0, 1), None);
        assert_eq!(n.record(0, "s", 0, 0.0, &v).clipped_frac, 0.0);
        let empty = EpochStats::default().record(0, "s", 0, 0.0, &v);
        assert_eq!((empty.steps, empty.train_loss), (0, 0.0));
    }
}
