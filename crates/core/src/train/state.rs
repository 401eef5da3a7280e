//! The resumable training state, written atomically after every epoch.
//!
//! ```text
//! state/
//!   LATEST                 name of the newest complete snapshot (replaced atomically)
//!   s<stage>-e<epoch>/     a snapshot
//!     progress.json        stage, epoch, step counters, best validation loss, history
//!     model.bin            the current weights (Burn record)
//!     best.bin             the best weights of the current stage so far
//!     optim.bin            the stage's AdamW state (absent at a stage boundary)
//! ```
//!
//! A snapshot directory is written completely and fsynced before `LATEST` is switched to it,
//! and older snapshots are removed only afterwards, so a process killed at any instant
//! (SIGKILL included) leaves a loadable state. Randomness needs no saving: weight
//! initialisation and each epoch's shuffle are pure functions of the seed, stage and epoch.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Record, Recorder};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::artifact::ArtifactError;
pub use crate::records::EpochRecord;
use crate::util::{sync_dir, write_atomic, write_synced};

/// Counters and history that, with the weights and optimizer state, define the run's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Stage being trained (== number of stages when training is done).
    pub stage: usize,
    /// Epochs completed in that stage.
    pub epoch: usize,
    /// Optimizer steps taken in that stage (drives the LR schedule).
    pub stage_step: u64,
    /// Optimizer steps taken in the run.
    pub global_step: u64,
    /// Best validation loss of the current stage.
    pub best_val: Option<f64>,
    /// Epoch that achieved it.
    pub best_epoch: Option<usize>,
    /// Every completed epoch.
    pub history: Vec<EpochRecord>,
    /// Byte length of `steps.csv` at this snapshot (a resumed run truncates to it).
    pub steps_csv_len: u64,
    /// The config's SHA-256 (a resume with a different config is refused).
    pub config_sha256: String,
    /// The dataset's SHA-256 (a resume on different data is refused).
    pub dataset_sha256: String,
}

/// Errors reading or writing the state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// File-level failure.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// A state file could not be written (the message names it).
    #[error(transparent)]
    File(#[from] std::io::Error),
    /// A record could not be encoded or decoded.
    #[error("{path}: {message}")]
    Record {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// No snapshot to resume from.
    #[error(
        "{dir}: no saved training state to resume from (the run was killed before its first epoch ended; start a new run)"
    )]
    Missing {
        /// The state directory.
        dir: PathBuf,
    },
}

fn recorder() -> BinBytesRecorder<FullPrecisionSettings> {
    BinBytesRecorder::<FullPrecisionSettings>::default()
}

/// Encode a record to bytes.
pub fn encode<B: Backend, R: Record<B>>(record: R, path: &Path) -> Result<Vec<u8>, StateError> {
    Recorder::<B>::record(&recorder(), record, ()).map_err(|e| StateError::Record {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Decode a record from a file.
pub fn decode<B: Backend, R: Record<B>>(path: &Path, device: &B::Device) -> Result<R, StateError> {
    let bytes = std::fs::read(path).map_err(|source| ArtifactError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Recorder::<B>::load(&recorder(), bytes, device).map_err(|e| StateError::Record {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// A snapshot's contents, ready to write.
pub struct Snapshot<'a> {
    /// Counters and history.
    pub progress: &'a Progress,
    /// Encoded current weights.
    pub model: Vec<u8>,
    /// Encoded best weights of the stage.
    pub best: Option<Vec<u8>>,
    /// Encoded optimizer state.
    pub optim: Option<Vec<u8>>,
}

/// Write a snapshot and make it the latest.
pub fn save(state_dir: &Path, snap: Snapshot<'_>) -> Result<PathBuf, StateError> {
    std::fs::create_dir_all(state_dir).map_err(|source| ArtifactError::Io {
        path: state_dir.to_path_buf(),
        source,
    })?;
    let name = format!("s{}-e{}", snap.progress.stage, snap.progress.epoch);
    let dir = state_dir.join(&name);
    let tmp = state_dir.join(format!(".{name}.tmp"));
    for d in [&dir, &tmp] {
        if d.exists() {
            std::fs::remove_dir_all(d).map_err(|source| ArtifactError::Io {
                path: d.clone(),
                source,
            })?;
        }
    }
    std::fs::create_dir(&tmp).map_err(|source| ArtifactError::Io {
        path: tmp.clone(),
        source,
    })?;
    let written = (|| -> Result<(), StateError> {
        let json = serde_json::to_vec_pretty(snap.progress).expect("progress serialises");
        write_synced(&tmp.join("progress.json"), &json)?;
        write_synced(&tmp.join("model.bin"), &snap.model)?;
        if let Some(b) = &snap.best {
            write_synced(&tmp.join("best.bin"), b)?;
        }
        if let Some(o) = &snap.optim {
            write_synced(&tmp.join("optim.bin"), o)?;
        }
        sync_dir(&tmp)?;
        std::fs::rename(&tmp, &dir).map_err(|source| ArtifactError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(())
    })();
    if let Err(e) = written {
        // A full disk must not keep a half-written snapshot using space.
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    crate::util::fault::point("before-snapshot-latest");
    write_atomic(&state_dir.join("LATEST"), name.as_bytes())?;
    crate::util::fault::point("after-snapshot-latest");
    // Older snapshots are no longer needed once LATEST points at the new one.
    if let Ok(entries) = std::fs::read_dir(state_dir) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n != name && n != "LATEST" && e.path().is_dir() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(dir)
}

/// The latest snapshot directory and its progress.
pub fn latest(state_dir: &Path) -> Result<(PathBuf, Progress), StateError> {
    let missing = || StateError::Missing {
        dir: state_dir.to_path_buf(),
    };
    let name = std::fs::read_to_string(state_dir.join("LATEST")).map_err(|_| missing())?;
    let dir = state_dir.join(name.trim());
    let ppath = dir.join("progress.json");
    let text = std::fs::read_to_string(&ppath).map_err(|_| missing())?;
    let progress: Progress = serde_json::from_str(&text).map_err(|e| StateError::Record {
        path: ppath,
        message: e.to_string(),
    })?;
    Ok((dir, progress))
}

/// Load a module's record from a snapshot file into `module`.
pub fn load_module<B: Backend, M: Module<B>>(
    module: M,
    path: &Path,
    device: &B::Device,
) -> Result<M, StateError> {
    let record = decode::<B, M::Record>(path, device)?;
    Ok(module.load_record(record))
}
