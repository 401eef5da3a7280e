//! Run directories: one per training run, never reused.
//!
//! ```text
//! <export.dir>/runs/<name>-<UTC stamp>-<4 hex>/
//!   config.yaml      the config text as given
//!   run.json         status (running / finished / failed), pid, times, reason
//!   epochs.jsonl     one line per epoch (losses, lr, gradient norms, samples/s, data wait)
//!   steps.csv        one line per optimizer step
//!   state/           the latest resumable training state (see `train::state`)
//!   export/          the exported checkpoint (see `artifact`)
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix64;
use crate::util;

/// A run's directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    /// The run id (the directory's name).
    pub id: String,
    /// The directory.
    pub path: PathBuf,
}

/// The run's status file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatus {
    /// Run id.
    pub id: String,
    /// `running`, `finished` or `failed`.
    pub status: String,
    /// Process id of the last process that worked on the run.
    pub pid: u32,
    /// RFC 3339 start time.
    pub started_at: String,
    /// RFC 3339 end time.
    #[serde(default)]
    pub ended_at: Option<String>,
    /// Why it failed.
    #[serde(default)]
    pub reason: Option<String>,
}

impl RunDir {
    /// Create a fresh, uniquely named run directory under `<root>/runs/`.
    pub fn create(root: &Path, name: &str) -> std::io::Result<Self> {
        let runs = root.join("runs");
        std::fs::create_dir_all(&runs)?;
        let now = util::unix_now();
        let mut rng = SplitMix64::new((now * 1e9) as u64 ^ (u64::from(std::process::id()) << 32));
        for _ in 0..1000 {
            let id = format!(
                "{name}-{}-{:04x}",
                util::compact_stamp(now),
                rng.next_u64() & 0xffff
            );
            let path = runs.join(&id);
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Self { id, path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other(format!(
            "could not create a unique run directory under {}",
            runs.display()
        )))
    }

    /// Open an existing run directory (for `--resume`).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if !path.join("config.yaml").is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "{} is not a kiln run directory (no config.yaml)",
                    path.display()
                ),
            ));
        }
        let id = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Self {
            id,
            path: path.to_path_buf(),
        })
    }

    /// The config copy.
    pub fn config_file(&self) -> PathBuf {
        self.path.join("config.yaml")
    }
    /// The status file.
    pub fn status_file(&self) -> PathBuf {
        self.path.join("run.json")
    }
    /// Per-epoch metrics.
    pub fn epochs_file(&self) -> PathBuf {
        self.path.join("epochs.jsonl")
    }
    /// Per-step metrics.
    pub fn steps_file(&self) -> PathBuf {
        self.path.join("steps.csv")
    }
    /// The resumable state.
    pub fn state_dir(&self) -> PathBuf {
        self.path.join("state")
    }
    /// The exported checkpoint.
    pub fn export_dir(&self) -> PathBuf {
        self.path.join("export")
    }

    /// Read the status file.
    pub fn read_status(&self) -> Option<RunStatus> {
        let text = std::fs::read_to_string(self.status_file()).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Write the status file atomically.
    pub fn write_status(&self, status: &RunStatus) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(status).expect("status serialises");
        util::write_atomic(&self.status_file(), &json)
    }

    /// Write the status file: `status` (`running`, `finished`, `failed`) by this process,
    /// with the reason of a failure; `ended_at` is set for every status but `running`.
    pub fn mark(
        &self,
        status: &str,
        reason: Option<String>,
        started_at: &str,
    ) -> std::io::Result<()> {
        self.write_status(&RunStatus {
            id: self.id.clone(),
            status: status.into(),
            pid: std::process::id(),
            started_at: started_at.into(),
            ended_at: (status != "running").then(|| util::rfc3339(util::unix_now())),
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_dirs_are_unique_and_never_reused() {
        let root = tempfile::tempdir().unwrap();
        let a = RunDir::create(root.path(), "x").unwrap();
        let b = RunDir::create(root.path(), "x").unwrap();
        assert_ne!(a.path, b.path);
        assert!(a.id.starts_with("x-"));
        assert!(RunDir::open(&a.path).is_err(), "no config yet");
        std::fs::write(a.config_file(), "x").unwrap();
        assert_eq!(RunDir::open(&a.path).unwrap().id, a.id);
    }
}
