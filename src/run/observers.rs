//! The observers kiln ships: the run registry and the MLflow mirror, adapted to
//! [`RunObserver`](super::RunObserver).

use std::sync::Mutex;

use super::observer::{ObserverError, RunObserver};
use crate::records::{EpochRecord, NewRun, RunDir, RunEnd};

/// Records the run in the run registry: its row at start (after reaping stale rows), each
/// epoch, and the end-of-run row. A registry that cannot record the start refuses the run.
#[cfg(feature = "registry")]
pub struct RegistryObserver {
    registry: Mutex<crate::observe::registry::Registry>,
}

#[cfg(feature = "registry")]
impl RegistryObserver {
    /// Observe with `registry`.
    pub fn new(registry: crate::observe::registry::Registry) -> Self {
        Self {
            registry: Mutex::new(registry),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&crate::observe::registry::Registry) -> T) -> Option<T> {
        match self.registry.lock() {
            Ok(r) => Some(f(&r)),
            Err(p) => Some(f(&p.into_inner())),
        }
    }
}

#[cfg(feature = "registry")]
impl RunObserver for RegistryObserver {
    fn on_start(&self, _run: &RunDir, start: &NewRun<'_>) -> Result<(), ObserverError> {
        let refuse = |e: crate::observe::registry::RegistryError| ObserverError {
            observer: "run registry".into(),
            message: e.to_string(),
        };
        self.with(|r| {
            let reaped = r.reap_stale().map_err(refuse)?;
            if reaped > 0 {
                tracing::warn!("run registry: marked {reaped} stale running run(s) as killed");
            }
            r.start_run(start).map_err(refuse)
        })
        .unwrap_or(Ok(()))
    }

    fn on_epoch(&self, run: &RunDir, record: &EpochRecord) {
        if let Some(Err(e)) = self.with(|r| r.log_epoch(&run.id, record)) {
            tracing::warn!("run registry: {e}");
        }
    }

    fn on_end(&self, run: &RunDir, end: &RunEnd) {
        if let Some(Err(e)) = self.with(|r| r.finish_run(&run.id, end)) {
            tracing::warn!("run registry: {e}");
        }
    }
}

/// Mirrors the run to an MLflow tracking server at its end (params at start, metrics of
/// every epoch in `epochs.jsonl`, the end status).
#[cfg(feature = "mlflow")]
pub struct MlflowObserver {
    mirror: crate::observe::mlflow::Mirror,
}

#[cfg(feature = "mlflow")]
impl MlflowObserver {
    /// Observe with a started mirror.
    pub fn new(mirror: crate::observe::mlflow::Mirror) -> Self {
        Self { mirror }
    }
}

#[cfg(feature = "mlflow")]
impl RunObserver for MlflowObserver {
    fn on_end(&self, run: &RunDir, end: &RunEnd) {
        let epochs: Vec<EpochRecord> = std::fs::read_to_string(run.epochs_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        self.mirror.finish(&epochs, end);
    }
}
