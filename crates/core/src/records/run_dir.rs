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

/// Where a run is in its life: `run.json`'s `status`, the registry's, what observers see at
/// the end. Written in lowercase (`running`, `finished`, `failed`, `killed`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::Display,
    strum::EnumString,
)]
#[serde(rename_all = "lowercase")]
#[strum(
    serialize_all = "lowercase",
    parse_err_ty = String,
    parse_err_fn = unknown_run_state
)]
pub enum RunState {
    /// Training (or stopped without a trace: the registry's reaper calls such runs killed).
    #[default]
    Running,
    /// Finished, exported.
    Finished,
    /// Failed, with a reason.
    Failed,
    /// Its process died without marking it (found by the registry's reaper).
    Killed,
}

impl RunState {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// `RunState`'s derived `FromStr` error.
fn unknown_run_state(s: &str) -> String {
    format!("unknown run status `{s}` (running, finished, failed or killed)")
}

impl PartialEq<&str> for RunState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The run's status file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatus {
    /// Run id.
    pub id: String,
    /// `running`, `finished`, `failed` or `killed`.
    pub status: RunState,
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

    /// Remove what an interrupted process left behind in the run directory and its `state/`:
    /// temporary files of atomic writes (`.<name>.tmp-*`), temporary snapshot directories
    /// (`.s<stage>-e<epoch>.tmp`) and temporary exports (`.export.tmp-<pid>`) of processes that
    /// no longer exist. For `--resume`, whose previous process is gone. Returns what was
    /// removed.
    pub fn remove_stale_temps(&self) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        for dir in [self.path.clone(), self.state_dir()] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(rest) = name.strip_prefix('.') else {
                    continue;
                };
                let path = e.path();
                let stale = if let Some(pid) = rest.strip_prefix("export.tmp-") {
                    pid.parse::<u32>()
                        .is_ok_and(|p| p == std::process::id() || !util::process_exists(p))
                } else {
                    rest.contains(".tmp-") || (dir != self.path && rest.ends_with(".tmp"))
                };
                if !stale {
                    continue;
                }
                let gone = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                match gone {
                    Ok(()) => removed.push(path),
                    Err(err) => tracing::warn!(
                        "cannot remove the stale temporary {}: {err}",
                        path.display()
                    ),
                }
            }
        }
        removed
    }

    /// Read the status file.
    pub fn read_status(&self) -> Option<RunStatus> {
        let text = std::fs::read_to_string(self.status_file()).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Write the status file atomically. On a full disk, where the atomic write has no room
    /// for its temporary copy, the file is overwritten in place instead (truncating it frees
    /// its blocks first), so a run that fails for lack of space still says `failed` rather
    /// than `running` forever.
    pub fn write_status(&self, status: &RunStatus) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(status).expect("status serialises");
        let path = self.status_file();
        match util::write_atomic(&path, &json) {
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                util::write_synced(&path, &json).map_err(|_| e)
            }
            other => other,
        }
    }

    /// When `run.json` says `running` but its recorded process is gone (killed, the machine
    /// restarted), mark it `killed` with why, keeping its pid and start time, so that it does
    /// not say `running` forever. Returns the status written (`None`: nothing to do — no
    /// status file, not running, or its process still alive). Called where runs are listed
    /// and reaped (the registry's reaper) and when a run is resumed.
    pub fn mark_if_abandoned(&self) -> std::io::Result<Option<RunStatus>> {
        let Some(st) = self.read_status() else {
            return Ok(None);
        };
        if st.status != RunState::Running
            || st.pid == std::process::id()
            || util::process_alive(i64::from(st.pid), None)
        {
            return Ok(None);
        }
        let abandoned = RunStatus {
            status: RunState::Killed,
            ended_at: Some(util::rfc3339(util::unix_now())),
            reason: Some(format!(
                "abandoned: its process (pid {}) is gone without marking the run finished or failed",
                st.pid
            )),
            ..st
        };
        self.write_status(&abandoned)?;
        Ok(Some(abandoned))
    }

    /// Write the status file: `status` by this process, with the reason of a failure;
    /// `ended_at` is set for every status but `running`.
    pub fn mark(
        &self,
        status: RunState,
        reason: Option<String>,
        started_at: &str,
    ) -> std::io::Result<()> {
        self.write_status(&RunStatus {
            id: self.id.clone(),
            status,
            pid: std::process::id(),
            started_at: started_at.into(),
            ended_at: (status != RunState::Running).then(|| util::rfc3339(util::unix_now())),
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_states_round_trip_as_lowercase_words() {
        for s in [
            RunState::Running,
            RunState::Finished,
            RunState::Failed,
            RunState::Killed,
        ] {
            assert_eq!(s.as_str().parse::<RunState>(), Ok(s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::json!(s.as_str())
            );
        }
        assert!("done".parse::<RunState>().unwrap_err().contains("`done`"));
        // A table's width applies to the word, as to a string.
        assert_eq!(format!("{:<9}|", RunState::Failed), "failed   |");
    }

    #[test]
    fn a_running_status_whose_process_is_gone_is_marked_killed() {
        let root = tempfile::tempdir().unwrap();
        let run = RunDir::create(root.path(), "x").unwrap();
        assert_eq!(run.mark_if_abandoned().unwrap(), None, "no run.json yet");
        run.mark(RunState::Running, None, "2026-01-01T00:00:00Z")
            .unwrap();
        assert_eq!(run.mark_if_abandoned().unwrap(), None, "our own process");
        let mut st = run.read_status().unwrap();
        st.pid = u32::MAX; // never a live pid
        run.write_status(&st).unwrap();
        let marked = run.mark_if_abandoned().unwrap().expect("marked");
        assert_eq!(marked.status, RunState::Killed);
        assert_eq!(marked.started_at, "2026-01-01T00:00:00Z");
        assert!(marked.ended_at.is_some());
        assert!(
            marked.reason.as_deref().unwrap().contains("abandoned"),
            "{marked:?}"
        );
        assert_eq!(run.read_status().unwrap(), marked);
        assert_eq!(run.mark_if_abandoned().unwrap(), None, "already marked");
    }

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

    #[test]
    fn stale_temporaries_are_removed_and_live_ones_kept() {
        let root = tempfile::tempdir().unwrap();
        let run = RunDir::create(root.path(), "x").unwrap();
        std::fs::create_dir_all(run.state_dir().join(".s0-e2.tmp")).unwrap();
        std::fs::write(run.state_dir().join(".LATEST.tmp-Ab12"), "s0-e2").unwrap();
        std::fs::write(run.path.join(".run.json.tmp-xYz9"), "{").unwrap();
        // u32::MAX is never a pid; our own pid is alive, but its temporaries are ours to clean.
        let dead = run.path.join(".export.tmp-4294967295");
        std::fs::create_dir(&dead).unwrap();
        let live = run.path.join(format!(".export.tmp-{}", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        let parent = run.path.join(".export.tmp-1"); // init: alive, not ours
        std::fs::create_dir(&parent).unwrap();
        std::fs::write(run.config_file(), "x").unwrap();
        std::fs::create_dir(run.state_dir().join("s0-e1")).unwrap();
        let mut removed = run.remove_stale_temps();
        removed.sort();
        assert_eq!(removed.len(), 5, "{removed:?}");
        assert!(parent.exists(), "a live process's export is left alone");
        assert!(run.config_file().exists() && run.state_dir().join("s0-e1").exists());
    }
}
