//! The teacher of a distillation run (config `distill:`): its checkpoints located — or trained
//! first — and wrapped in the fastest exact inference engine (`fused`, no autodiff), handed to
//! the trainer as a [`Teacher`]. Training may not import the engines (see
//! `tests/it/architecture.rs`), so this lives at the run level.

use crate::records::metrics::{TeacherInfo, TeacherMember};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{RunError, RunOptions, TrainingRun};
use crate::artifact::Checkpoint;
use crate::config::{DistillConfig, LoadedConfig};
use crate::predict::Predictor;
use crate::records::RunDir;
use crate::train::distill::moment_match;
use crate::train::{ProgressMode, Teacher, TrainError};

/// The engine the teacher runs on: exact to 1e-5 of the Burn module, and the fastest such.
pub const TEACHER_ENGINE: crate::records::EngineKind = crate::records::EngineKind::Fused;

/// Rows per engine call (bounds the engine's buffers on large splits).
const CHUNK: usize = 4096;

/// One or more teacher checkpoints on the `fused` engine; several are moment matched.
pub struct EngineTeacher {
    members: Vec<Mutex<Predictor>>,
    info: TeacherInfo,
}

fn distill_err(message: String) -> RunError {
    RunError::Train(TrainError::Distill(message))
}

impl EngineTeacher {
    /// Load the teacher checkpoints `dirs` and check that they read the student's features
    /// and predict its targets, in the same order.
    pub fn load(dirs: &[PathBuf], student: &LoadedConfig) -> Result<Self, RunError> {
        let data = &student.config.data;
        let mut members = Vec::new();
        let mut described = Vec::new();
        for dir in dirs {
            let ckpt = Checkpoint::load(dir)?;
            let m = &ckpt.manifest;
            if m.feature_names() != data.features || m.target_names() != data.targets {
                return Err(distill_err(format!(
                    "teacher {} reads features {:?} and predicts {:?}, but the student config {} has {:?} and {:?} (same names, same order)",
                    dir.display(),
                    m.feature_names(),
                    m.target_names(),
                    student.path.display(),
                    data.features,
                    data.targets
                )));
            }
            described.push(TeacherMember {
                run_id: m.run_id.clone(),
                parameter_count: m.parameter_count,
                dir: ckpt.dir.display().to_string(),
                weights_sha256: m.weights.sha256.clone(),
            });
            let engine = crate::infer::build_engine(TEACHER_ENGINE, &ckpt.weights, 0)
                .map_err(|e| distill_err(format!("teacher {}: {e}", dir.display())))?;
            members.push(Mutex::new(Predictor::for_checkpoint(&ckpt, engine)));
        }
        let info = TeacherInfo {
            engine: TEACHER_ENGINE.to_string(),
            ensemble: members.len(),
            parameter_count: described.first().map(|d| d.parameter_count),
            members: described,
        };
        Ok(Self { members, info })
    }
}

impl Teacher for EngineTeacher {
    fn predict(&self, x_raw: &[f32], rows: usize) -> Result<(Vec<f32>, Vec<f32>), String> {
        let mut outs = Vec::with_capacity(self.members.len());
        for m in &self.members {
            let mut p = m
                .lock()
                .map_err(|_| "a teacher engine panicked earlier".to_string())?;
            let nf = p.n_features();
            let (mut mean, mut std) = (Vec::new(), Vec::new());
            for start in (0..rows).step_by(CHUNK) {
                let end = (start + CHUNK).min(rows);
                let pred = p
                    .predict(&x_raw[start * nf..end * nf], end - start)
                    .map_err(|e| e.to_string())?;
                mean.extend(pred.mean);
                std.extend(pred.std);
            }
            outs.push((mean, std));
        }
        Ok(moment_match(&outs))
    }

    fn describe(&self) -> TeacherInfo {
        self.info.clone()
    }
}

/// The teacher checkpoints of `d`: its `checkpoints`, or for each seed the latest finished
/// run of its `config` (trained here first when there is none).
pub fn teacher_dirs(d: &DistillConfig, progress: ProgressMode) -> Result<Vec<PathBuf>, RunError> {
    let Some(config) = &d.config else {
        return Ok(d.checkpoints.clone());
    };
    let seeds: Vec<Option<u64>> = if d.seeds.is_empty() {
        vec![None]
    } else {
        d.seeds.iter().map(|&s| Some(s)).collect()
    };
    seeds
        .into_iter()
        .map(|seed| locate_or_train(config, seed, progress))
        .collect()
}

/// The export of the latest finished run of `config` (with `seed`) under its `export.dir`
/// whose stored config is the same effective text; trained now when there is none.
pub fn locate_or_train(
    config: &Path,
    seed: Option<u64>,
    progress: ProgressMode,
) -> Result<PathBuf, RunError> {
    let set: Vec<String> = seed.map(|s| format!("seed={s}")).into_iter().collect();
    let loaded = crate::config::load_with_overrides(config, &set)
        .map_err(|e| distill_err(format!("teacher config: {e}")))?;
    if loaded.config.distill.is_some() {
        return Err(distill_err(format!(
            "teacher config {} distils from a teacher itself; give a config trained without one",
            config.display()
        )));
    }
    if let Some(found) = latest_finished(&loaded) {
        tracing::info!("distillation: teacher {}", found.display());
        return Ok(found);
    }
    tracing::info!(
        "distillation: no finished run of {}{} under {}: training the teacher first",
        config.display(),
        seed.map(|s| format!(" (seed {s})")).unwrap_or_default(),
        loaded.config.export.dir.display()
    );
    let options = RunOptions {
        progress,
        ..RunOptions::default()
    };
    let summary = TrainingRun::new(loaded, options)?.execute()?;
    summary
        .outcome
        .export_dir
        .ok_or_else(|| distill_err("the teacher run exported nothing".into()))
}

/// The latest (by run id) finished run of exactly `loaded`'s text with an export.
fn latest_finished(loaded: &LoadedConfig) -> Option<PathBuf> {
    let runs = loaded.config.export.dir.join("runs");
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&runs)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let run = RunDir::open(&e.path()).ok()?;
            let finished = run.read_status().is_some_and(|s| s.status == "finished");
            let same = std::fs::read_to_string(run.config_file()).ok()? == loaded.text;
            let export = run.export_dir();
            (finished && same && export.join(crate::artifact::MANIFEST_FILE).is_file())
                .then(|| (run.id.clone(), export))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}
