//! The per-epoch record: written to `epochs.jsonl`, stored in the registry, sent to MLflow.

use serde::{Deserialize, Serialize};

/// One epoch's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// Stage index.
    pub stage: usize,
    /// Stage name.
    pub stage_name: String,
    /// Epoch within the stage (0-based).
    pub epoch: usize,
    /// Optimizer steps in the epoch.
    pub steps: u64,
    /// Mean training loss over the epoch's steps.
    pub train_loss: f64,
    /// Validation loss after the epoch (the stage's loss, normalised units).
    pub val_loss: f64,
    /// Learning rate of the epoch's last step.
    pub lr: f64,
    /// Mean pre-clip global gradient norm.
    pub grad_norm_mean: f64,
    /// Largest pre-clip global gradient norm.
    pub grad_norm_max: f64,
    /// Fraction of steps whose gradients were clipped.
    pub clipped_frac: f64,
    /// Training samples per second (wall time of the epoch's steps).
    pub samples_per_s: f64,
    /// Fraction of step time spent waiting for the next batch.
    pub data_wait_frac: f64,
    /// Seconds waiting for data.
    pub data_wait_s: f64,
    /// Seconds of compute (host-to-device copy, forward, backward, clipping, optimizer step).
    pub compute_s: f64,
    /// Seconds of validation.
    pub validation_s: f64,
    /// Seconds of the epoch's steps by phase (`data` is `data_wait_s`; the others add up to
    /// `compute_s` but for the bookkeeping between them). Absent in records written before it.
    #[serde(default)]
    pub phase_s: StepPhases,
}

/// Time of training steps by phase: seconds summed over an epoch ([`EpochRecord::phase_s`]),
/// or mean microseconds per step over a stage (`StageSummary::step_us`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepPhases {
    /// Waiting for the loader's next batch.
    pub data: f64,
    /// Building the batch's tensors on the device.
    pub h2d: f64,
    /// The forward pass.
    pub forward: f64,
    /// The loss and reading its value back.
    pub loss: f64,
    /// The backward pass and collecting the trainable gradients.
    pub backward: f64,
    /// Global-norm gradient clipping.
    pub clip: f64,
    /// The optimizer step.
    pub optimizer: f64,
}

impl StepPhases {
    /// Every phase multiplied by `k`.
    pub fn scaled(self, k: f64) -> Self {
        Self {
            data: self.data * k,
            h2d: self.h2d * k,
            forward: self.forward * k,
            loss: self.loss * k,
            backward: self.backward * k,
            clip: self.clip * k,
            optimizer: self.optimizer * k,
        }
    }

    /// The phase-wise sum.
    pub fn plus(self, o: Self) -> Self {
        Self {
            data: self.data + o.data,
            h2d: self.h2d + o.h2d,
            forward: self.forward + o.forward,
            loss: self.loss + o.loss,
            backward: self.backward + o.backward,
            clip: self.clip + o.clip,
            optimizer: self.optimizer + o.optimizer,
        }
    }
}
