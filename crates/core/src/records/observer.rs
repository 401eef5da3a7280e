//! The one small trait through which a run is observed: by the run registry, the MLflow
//! mirror, a scheduler — and by the run itself, which hands the training loop one observer
//! that forwards to all of them.

use std::path::Path;

use super::{EpochRecord, NewRun, RunDir, RunEnd};

/// An observer's refusal of a run's start (e.g. the registry could not record the run).
#[derive(Debug, thiserror::Error)]
#[error("{observer}: {message}")]
pub struct ObserverError {
    /// Which observer.
    pub observer: String,
    /// What went wrong.
    pub message: String,
}

/// Something that follows a training run (`kiln_core::run::TrainingRun`): the run registry, the MLflow mirror, a
/// scheduler's own bookkeeping. Methods are called from the training thread in this order:
/// `on_start`, then per epoch `on_epoch`, per stage `on_stage_end`, once `on_export`, and
/// always `on_end` (finished or failed). Only `on_start` can stop a run (an observer that
/// must record every run, like the registry, refuses it when it cannot); every other failure
/// is the observer's to report, and training never waits on it.
pub trait RunObserver: Send + Sync {
    /// The run starts (or resumes) in `run`.
    fn on_start(&self, _run: &RunDir, _start: &NewRun<'_>) -> Result<(), ObserverError> {
        Ok(())
    }
    /// An epoch ended.
    fn on_epoch(&self, _run: &RunDir, _record: &EpochRecord) {}
    /// A stage ended (its best epoch restored).
    fn on_stage_end(&self, _run: &RunDir, _index: usize, _name: &str) {}
    /// The checkpoint was exported to `dir`.
    fn on_export(&self, _run: &RunDir, _dir: &Path) {}
    /// The run ended (`end.status` is `finished` or `failed`).
    fn on_end(&self, _run: &RunDir, _end: &RunEnd) {}
}
