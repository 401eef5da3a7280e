//! What a training session is asked to do and what it reports: the job, its observers'
//! hooks, the outcome and the errors. The loop itself is in `session`; the entry points in
//! [`super::trainer`].
//!
//! The staged training loop:
//!
//! Each stage freezes the parts it does not train (their parameters stop requiring
//! gradients, so the backward pass skips them), builds a **new** AdamW over its trainable
//! parameters only, and steps a cosine-with-warm-restarts schedule once per optimizer step.
//! Gradients are clipped by their global L2 norm. After every epoch the model is validated and
//! a resumable snapshot is written; at the end of a stage the stage's best epoch (by validation
//! loss) is restored, so the export holds the best epoch of the last stage on top of the best
//! epoch of the earlier ones.

use std::path::{Path, PathBuf};
use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;

use super::evaluate::EvalReport;
use super::progress::ProgressMode;
use super::state::StateError;
use crate::artifact::{ArtifactError, Manifest};
use crate::config::{ExperimentConfig, LoadedConfig};
use crate::data::{DataError, Dataset};
use crate::model::RegressionNet;
use crate::observe::verdict::Verdict;
use crate::records::{EpochRecord, RunDir, RunObserver, StepPhases};

/// Errors that end a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The dataset could not be read.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A checkpoint or export file could not be written.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// The resumable state could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// A file could not be written (the message names it).
    #[error(transparent)]
    File(#[from] std::io::Error),
    /// A file of the run directory could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The loss became NaN or infinite.
    #[error(
        "training diverged in stage {stage} ({name}) epoch {epoch} step {step}: loss is {value} (lower the learning rate or set clip_norm)"
    )]
    Diverged {
        /// Stage index.
        stage: usize,
        /// Stage name.
        name: String,
        /// Epoch (1-based).
        epoch: usize,
        /// Step in the stage.
        step: u64,
        /// The loss value.
        value: f64,
    },
    /// The config distils from a teacher that is missing or does not answer.
    #[error("distillation: {0}")]
    Distill(String),
    /// The recalibration could not be fitted (the message says which target and why).
    #[error("calibration: {0}")]
    Calibration(String),
    /// A measurement of the trained model before its export failed (the serving engine's
    /// latency; the advisory measurements are left out instead).
    #[error("measuring the trained model before its export: {0}")]
    Measure(#[source] super::measure::MeasureError),
    /// `--resume` was given a run that cannot be continued.
    #[error("cannot resume {run}: {reason}")]
    Resume {
        /// The run directory.
        run: PathBuf,
        /// Why.
        reason: String,
    },
}

/// What a training run is asked to do.
pub struct TrainJob<'a> {
    /// Who follows the training loop (its epochs, stage ends and the export; the run layer
    /// passes one that forwards to the registry, the MLflow mirror, …). Failures are the
    /// observer's to report; they never stop training.
    pub observer: Option<&'a dyn RunObserver>,
    /// The teacher of a distillation run (config `distill:`); the run layer provides it.
    pub teacher: Option<&'a dyn super::distill::Teacher>,
    /// The experiment.
    pub config: &'a LoadedConfig,
    /// The run directory (fresh, or the one being resumed).
    pub run: RunDir,
    /// Continue from the run's saved state.
    pub resume: bool,
    /// Progress display.
    pub progress: ProgressMode,
    /// Stop after this many epochs in total (tests use it to simulate an interruption).
    pub stop_after_epochs: Option<usize>,
    /// The dataset, already read from `config.data` (e.g. by the command's input check);
    /// `None`: training reads it. Either way the file is read once per run, refit or not.
    pub data: Option<&'a Dataset>,
    /// What to measure of the trained model before its export (int8 accuracy change,
    /// latency, pick evaluation; the run layer provides it); `None`: nothing.
    pub measure: Option<&'a dyn super::measure::Measure>,
}

pub use kiln_model::records::metrics::StageSummary;

/// The result of a finished run.
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    /// The run directory.
    pub run: RunDir,
    /// The export directory (absent when the run was stopped early).
    pub export_dir: Option<PathBuf>,
    /// The test-split table.
    pub report: Option<EvalReport>,
    /// Per-stage summaries.
    pub stages: Vec<StageSummary>,
    /// Parameter count.
    pub parameter_count: usize,
    /// The manifest written.
    pub manifest: Option<Manifest>,
    /// Wall time of the run in this process.
    pub wall: Duration,
    /// The bottleneck verdict (absent when the run was stopped early).
    pub verdict: Option<Verdict>,
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A finished run and its final (best) model without autodiff.
pub struct Trained<B: AutodiffBackend> {
    /// What happened.
    pub outcome: TrainOutcome,
    /// The exported model (absent when the run was stopped early).
    pub model: Option<RegressionNet<B::InnerBackend>>,
}

/// Per-stage throughput and best epoch from the history.
pub fn summarise(cfg: &ExperimentConfig, history: &[EpochRecord]) -> Vec<StageSummary> {
    cfg.stages
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let h: Vec<&EpochRecord> = history.iter().filter(|r| r.stage == i).collect();
            let steps: u64 = h.iter().map(|r| r.steps).sum();
            let time: f64 = h.iter().map(|r| r.data_wait_s + r.compute_s).sum();
            let wait: f64 = h.iter().map(|r| r.data_wait_s).sum();
            let samples: f64 = h
                .iter()
                .map(|r| r.samples_per_s * (r.data_wait_s + r.compute_s))
                .sum();
            let best = h
                .iter()
                .min_by(|a, b| a.val_loss.total_cmp(&b.val_loss))
                .map(|r| (r.val_loss, r.epoch + 1))
                .unwrap_or((f64::NAN, 0));
            let phases = h
                .iter()
                .fold(StepPhases::default(), |acc, r| acc.plus(r.phase_s));
            StageSummary {
                step_us: phases.scaled(1e6 / steps.max(1) as f64),
                name: s.name.clone(),
                epochs: h.len(),
                steps,
                samples_per_s: samples / time.max(1e-12),
                data_wait_frac: wait / time.max(1e-12),
                best_val_loss: best.0,
                best_epoch: best.1,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(stage: usize, epoch: usize, steps: u64, phase_s: StepPhases) -> EpochRecord {
        EpochRecord {
            stage,
            stage_name: format!("s{stage}"),
            epoch,
            steps,
            train_loss: 1.0,
            val_loss: 1.0 - epoch as f64 * 0.1,
            lr: 1e-3,
            grad_norm_mean: 1.0,
            grad_norm_max: 1.0,
            clipped_frac: 0.0,
            samples_per_s: 100.0,
            data_wait_frac: 0.1,
            data_wait_s: phase_s.data,
            compute_s: 1.0,
            validation_s: 0.1,
            phase_s,
        }
    }

    #[test]
    fn a_stage_summary_gives_mean_microseconds_per_step_by_phase() {
        let cfg = crate::config::parse(
            include_str!("../../../../configs/tiny.yaml"),
            std::path::Path::new("configs/tiny.yaml"),
        )
        .unwrap();
        let p = |data: f64, forward: f64, optimizer: f64| StepPhases {
            data,
            forward,
            optimizer,
            ..StepPhases::default()
        };
        // Stage 0: 10 + 30 steps, 0.4 s of forward → 10,000 µs a step; stage 1 apart.
        let history = [
            record(0, 0, 10, p(0.1, 0.1, 0.02)),
            record(0, 1, 30, p(0.3, 0.3, 0.06)),
            record(1, 0, 5, p(0.0, 1.0, 0.5)),
        ];
        let s = summarise(&cfg, &history);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.abs().max(1.0);
        assert!(close(s[0].step_us.forward, 10_000.0), "{:?}", s[0].step_us);
        assert!(close(s[0].step_us.data, 10_000.0), "{:?}", s[0].step_us);
        assert!(close(s[0].step_us.optimizer, 2_000.0), "{:?}", s[0].step_us);
        assert_eq!(s[0].step_us.backward, 0.0);
        assert!(close(s[1].step_us.forward, 200_000.0), "{:?}", s[1].step_us);
        assert!(
            close(s[1].step_us.optimizer, 100_000.0),
            "{:?}",
            s[1].step_us
        );
        // Epochs written before phases were recorded read as zero phases, not an error.
        let old: EpochRecord = serde_json::from_value({
            let mut v = serde_json::to_value(record(0, 0, 4, p(0.1, 0.1, 0.1))).unwrap();
            v.as_object_mut().unwrap().remove("phase_s");
            v
        })
        .unwrap();
        assert_eq!(old.phase_s, StepPhases::default());
    }
}
