//! The run's training logs: `steps.csv` (one row per optimizer step, buffered) and
//! `epochs.jsonl` (one line per epoch, appended as it ends), lined up with the resumable state.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::job::{TrainError, io_err};
use super::state::Progress;
use super::step::{StepAt, StepStats};
use crate::records::{EpochRecord, RunDir};

/// The open logs of a run.
pub(crate) struct RunLogs {
    steps_path: PathBuf,
    steps_out: std::io::BufWriter<std::fs::File>,
    epochs_path: PathBuf,
}

impl RunLogs {
    /// Line the run's logs up with the state being resumed (or start them): `steps.csv` is
    /// truncated to the snapshot's length, and `epochs.jsonl` is rewritten from the snapshot's
    /// history, so a run killed between an epoch's log line and its snapshot has no duplicate
    /// rows after `--resume`.
    pub(crate) fn open(run: &RunDir, progress: &Progress) -> Result<Self, TrainError> {
        let steps_path = run.steps_file();
        let epochs_path = run.epochs_file();
        {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&steps_path)
                .map_err(io_err(&steps_path))?;
            f.set_len(progress.steps_csv_len)
                .map_err(io_err(&steps_path))?;
        }
        let mut steps_out = std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .append(true)
                .open(&steps_path)
                .map_err(io_err(&steps_path))?,
        );
        if progress.steps_csv_len == 0 {
            writeln!(
                steps_out,
                "stage,epoch,step,lr,loss,grad_norm,data_wait_us,compute_us"
            )
            .map_err(io_err(&steps_path))?;
        }
        if epochs_path.exists() || !progress.history.is_empty() {
            let mut text = String::new();
            for r in &progress.history {
                text.push_str(&serde_json::to_string(r).expect("record serialises"));
                text.push('\n');
            }
            crate::util::write_atomic(&epochs_path, text.as_bytes())?;
        }
        Ok(Self {
            steps_path,
            steps_out,
            epochs_path,
        })
    }

    /// A step's row of `steps.csv`: the step at learning rate `lr` after waiting `wait`.
    pub(crate) fn step(
        &mut self,
        at: StepAt,
        lr: f64,
        step: &StepStats,
        wait: Duration,
    ) -> Result<(), TrainError> {
        let StepAt {
            stage,
            epoch,
            stage_step,
        } = at;
        writeln!(
            self.steps_out,
            "{stage},{epoch},{stage_step},{lr:.6e},{:.6e},{:.6e},{},{}",
            step.loss,
            step.grad_norm,
            wait.as_micros(),
            step.compute.as_micros()
        )
        .map_err(io_err(&self.steps_path))
    }

    /// Write the buffered step rows out.
    pub(crate) fn flush(&mut self) -> Result<(), TrainError> {
        self.steps_out.flush().map_err(io_err(&self.steps_path))
    }

    /// Append an epoch's line to `epochs.jsonl`.
    pub(crate) fn epoch(&self, record: &EpochRecord) -> Result<(), TrainError> {
        let mut line = serde_json::to_string(record).expect("record serialises");
        line.push('\n');
        append(&self.epochs_path, line.as_bytes())
    }

    /// The length of `steps.csv` (flushed), for the snapshot.
    pub(crate) fn steps_len(&self) -> Result<u64, TrainError> {
        Ok(std::fs::metadata(&self.steps_path)
            .map_err(io_err(&self.steps_path))?
            .len())
    }
}

fn append(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(bytes).map_err(io_err(path))
}
