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
}
