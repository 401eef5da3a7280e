//! The observers kiln ships: the run registry and the MLflow mirror, adapted to
//! [`RunObserver`].

use std::sync::Mutex;

use crate::records::{EpochRecord, NewRun, RunDir, RunEnd};
use kiln_core::run::{ObserverError, RunObserver};

/// Records the run in the run registry: its row at start (after reaping stale rows), each
/// epoch, and the end-of-run row. A registry that cannot record the start refuses the run.
/// An epoch row that cannot be written (the server is away longer than the connection's
/// reconnect wait) is kept and written with the next epoch or at the end; what still cannot
/// be written is named at the end, epoch by epoch, with where the run's own log keeps it.
pub struct RegistryObserver {
    registry: Mutex<crate::registry::Registry>,
    /// Epoch rows not yet written, oldest first.
    pending: Mutex<Vec<EpochRecord>>,
}

/// `stage 0 epochs 3–7, stage 1 epoch 0`: the epochs of `records` in ranges.
fn epoch_ranges(records: &[EpochRecord]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < records.len() {
        let (stage, first) = (records[i].stage, records[i].epoch);
        let mut last = first;
        let mut j = i + 1;
        while j < records.len() && records[j].stage == stage && records[j].epoch == last + 1 {
            last = records[j].epoch;
            j += 1;
        }
        out.push(if first == last {
            format!("stage {stage} epoch {first}")
        } else {
            format!("stage {stage} epochs {first}–{last}")
        });
        i = j;
    }
    out.join(", ")
}

impl RegistryObserver {
    /// Observe with `registry`.
    pub fn new(registry: crate::registry::Registry) -> Self {
        Self {
            registry: Mutex::new(registry),
            pending: Mutex::new(Vec::new()),
        }
    }

    /// Write the pending epoch rows in order; the first error stops (the rest stay pending).
    fn flush(&self, run_id: &str) -> Result<(), crate::registry::RegistryError> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mut written = 0;
        let result = self
            .with(|r| {
                for e in pending.iter() {
                    r.log_epoch(run_id, e)?;
                    written += 1;
                }
                Ok(())
            })
            .unwrap_or(Ok(()));
        pending.drain(..written);
        result
    }

    fn with<T>(&self, f: impl FnOnce(&crate::registry::Registry) -> T) -> Option<T> {
        match self.registry.lock() {
            Ok(r) => Some(f(&r)),
            Err(p) => Some(f(&p.into_inner())),
        }
    }
}

impl RunObserver for RegistryObserver {
    fn on_start(&self, _run: &RunDir, start: &NewRun<'_>) -> Result<(), ObserverError> {
        let refuse = |e: crate::registry::RegistryError| ObserverError {
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
        let was_pending = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.push(record.clone());
            pending.len() > 1
        };
        if let Err(e) = self.flush(&run.id) {
            // One warning when rows start to queue, not one per epoch.
            if !was_pending {
                tracing::warn!(
                    "run registry: {e} (epoch rows are kept and written when the registry answers again)"
                );
            }
        }
    }

    fn on_end(&self, run: &RunDir, end: &RunEnd) {
        let flushed = self.flush(&run.id);
        if let Some(Err(e)) = self.with(|r| r.finish_run(&run.id, end)) {
            tracing::warn!(
                "run registry: the end of run {} was not recorded ({e}); its row still says running until a reaper marks it killed; run.json in {} has the outcome",
                run.id,
                run.path.display()
            );
        }
        if let Err(e) = flushed {
            let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            tracing::warn!(
                "run registry: {} epoch row(s) of run {} are missing from the registry ({}): {e}; {} has them",
                pending.len(),
                run.id,
                epoch_ranges(&pending),
                run.path.join("epochs.jsonl").display()
            );
        }
    }
}

/// Mirrors the run to an MLflow tracking server (see [`crate::mlflow::Mirror`]): the
/// MLflow run is created (or, on `--resume`, continued) at the start, each epoch's metrics
/// are queued to a background sender as the epoch ends, and the end sends the summary,
/// dataset input, artifacts and final status, within [`crate::mlflow::MirrorOptions::flush_timeout`].
/// A failing or hung server never stops the run, and costs it at most that timeout at the end.
pub struct MlflowObserver {
    client: crate::mlflow::Client,
    options: crate::mlflow::MirrorOptions,
    loaded: crate::config::LoadedConfig,
    mirror: Mutex<Option<crate::mlflow::Mirror>>,
    report: Mutex<Option<crate::mlflow::MirrorReport>>,
}

impl MlflowObserver {
    /// Observe with `client` and `options`; the MLflow run starts in `on_start`.
    pub fn new(
        client: crate::mlflow::Client,
        options: crate::mlflow::MirrorOptions,
        loaded: &crate::config::LoadedConfig,
    ) -> Self {
        Self {
            client,
            options,
            loaded: loaded.clone(),
            mirror: Mutex::new(None),
            report: Mutex::new(None),
        }
    }

    /// An observer when `MLFLOW_TRACKING_URI` is set (options from MLflow's environment
    /// variables, see [`crate::mlflow`]); `None` when it is unset, or after one
    /// warning when the variables cannot be used.
    pub fn from_env(loaded: &crate::config::LoadedConfig) -> Option<Self> {
        use crate::mlflow::{Client, ClientOptions, MirrorOptions};
        let uri = std::env::var("MLFLOW_TRACKING_URI")
            .ok()
            .filter(|u| !u.is_empty())?;
        match ClientOptions::from_env().and_then(|o| Client::with_options(&uri, &o)) {
            Ok(client) => Some(Self::new(client, MirrorOptions::from_env(loaded), loaded)),
            Err(e) => {
                tracing::warn!("MLflow mirror disabled: {e}");
                None
            }
        }
    }

    /// The MLflow run id, once the sender created the run (never waits for it).
    pub fn run_id(&self) -> Option<String> {
        self.mirror
            .lock()
            .ok()
            .and_then(|m| m.as_ref().and_then(|m| m.state_now()).map(|s| s.run_id))
    }

    /// What was sent and what could not be, once the run ended.
    pub fn report(&self) -> Option<crate::mlflow::MirrorReport> {
        self.report.lock().ok().and_then(|r| r.clone())
    }
}

impl RunObserver for MlflowObserver {
    fn on_start(&self, run: &RunDir, _start: &NewRun<'_>) -> Result<(), ObserverError> {
        // Never waits for the server: the sender thread creates the MLflow run.
        let m = crate::mlflow::Mirror::begin(self.client.clone(), &self.options, run, &self.loaded);
        if let Ok(mut slot) = self.mirror.lock() {
            *slot = Some(m);
        }
        Ok(())
    }

    fn on_epoch(&self, _run: &RunDir, record: &EpochRecord) {
        if let Ok(m) = self.mirror.lock()
            && let Some(m) = m.as_ref()
        {
            m.log_epoch(record);
        }
    }

    fn on_end(&self, run: &RunDir, end: &RunEnd) {
        let mirror = self.mirror.lock().ok().and_then(|mut m| m.take());
        if let Some(m) = mirror {
            let report = m.finish(run, end);
            if let Ok(mut r) = self.report.lock() {
                *r = Some(report);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(stage: usize, epoch: usize) -> EpochRecord {
        EpochRecord {
            stage,
            stage_name: "mean".into(),
            epoch,
            steps: 1,
            train_loss: 1.0,
            val_loss: 1.0,
            lr: 1e-3,
            grad_norm_mean: 0.0,
            grad_norm_max: 0.0,
            clipped_frac: 0.0,
            samples_per_s: 1.0,
            data_wait_frac: 0.0,
            data_wait_s: 0.0,
            compute_s: 1.0,
            validation_s: 0.0,
            phase_s: Default::default(),
        }
    }

    #[test]
    fn missing_epochs_are_named_in_ranges() {
        let r = [
            rec(0, 3),
            rec(0, 4),
            rec(0, 5),
            rec(0, 9),
            rec(1, 0),
            rec(1, 1),
        ];
        assert_eq!(
            epoch_ranges(&r),
            "stage 0 epochs 3–5, stage 0 epoch 9, stage 1 epochs 0–1"
        );
        assert_eq!(epoch_ranges(&[]), "");
    }
}
