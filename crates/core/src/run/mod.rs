//! A training run as a library object: [`TrainingRun`] owns the whole run — run directory and
//! status, effective config, resume, dispatch on device/backend/precision, training and the
//! measurements its manifest records ([`measure::RunMeasure`]: int8 accuracy change, latency,
//! pick evaluation — taken on the trained model before its one export) and the summary. The run registry, the MLflow mirror and any program's own
//! bookkeeping observe it through one small trait, [`RunObserver`] (start, epoch, stage end,
//! export, end); each is optional.
//!
//! ```no_run
//! use kiln_core::run::{RunOptions, TrainingRun};
//! let loaded = kiln_core::config::load(std::path::Path::new("configs/baseball.yaml"))?;
//! let run = TrainingRun::new(loaded, RunOptions::default())?;
//! let summary = run.execute()?;
//! println!("exported to {:?}", summary.outcome.export_dir);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `kiln train` is this plus argument parsing, the observers its flags ask for, and printing.

pub mod measure;
pub mod teacher;

use std::path::{Path, PathBuf};

pub use crate::records::{ObserverError, RunObserver};

use crate::artifact::ArtifactError;
use crate::bench::latency::LatencyReport;
use crate::config::{CpuBackend, DeviceKind, LoadedConfig, Loss, Precision};
use crate::data::Dataset;
use crate::data::dataset::sha256_hex;
use crate::records::{EpochRecord, NewRun, RunDir, RunEnd, RunState};
use crate::train::{ProgressMode, TrainError, TrainJob, TrainOutcome, train};
use crate::util;

/// Errors that end a run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Training failed (data, state, divergence, files).
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The run directory or its status file could not be written.
    #[error("run directory {path}: {source}")]
    RunDir {
        /// The directory or file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `--resume` was asked of a run that cannot be resumed.
    #[error("cannot resume {run}: {reason}")]
    Resume {
        /// The run directory.
        run: PathBuf,
        /// Why.
        reason: String,
    },
    /// The config asks for a device/backend/precision this build cannot run.
    #[error(
        "unsupported combination device {device}, backend {backend}, precision {precision} (this build: {build})"
    )]
    Unsupported {
        /// Device.
        device: String,
        /// Backend.
        backend: String,
        /// Precision.
        precision: String,
        /// What this build supports.
        build: String,
    },
    /// A checkpoint (a teacher's) could not be read.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// An observer refused the run's start (e.g. the registry could not record it).
    #[error(transparent)]
    Observer(#[from] ObserverError),
}

impl RunError {
    /// Whether the error is the user's input (config, data, resume target, device choice)
    /// rather than a failure of the machine or of kiln: the CLI exits 2 for these.
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            RunError::Resume { .. }
                | RunError::Unsupported { .. }
                | RunError::Train(
                    TrainError::Data(_) | TrainError::Resume { .. } | TrainError::Distill(_)
                )
        )
    }
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Continue the run in this directory from its last snapshot.
    pub resume: Option<PathBuf>,
    /// Progress display.
    pub progress: ProgressMode,
    /// Stop after this many epochs in total (a simulated interruption, for tests).
    pub stop_after_epochs: Option<usize>,
    /// Measure the trained model's latency, int8 accuracy change and pick evaluation before
    /// its export, for its manifest (on by default).
    pub measure: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            resume: None,
            progress: ProgressMode::Quiet,
            stop_after_epochs: None,
            measure: true,
        }
    }
}

/// What a finished run produced.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The training outcome (export dir, test table, stages, verdict).
    pub outcome: TrainOutcome,
    /// The exported model's latency on its serving engine (batch 1 and 128).
    pub latency: Option<LatencyReport>,
    /// The end-of-run record the observers received.
    pub end: RunEnd,
}

/// One training run; see the module docs.
pub struct TrainingRun {
    loaded: LoadedConfig,
    dir: RunDir,
    options: RunOptions,
    started_at: String,
    observers: Vec<Box<dyn RunObserver>>,
    teacher: std::sync::OnceLock<teacher::EngineTeacher>,
    data: Option<Dataset>,
}

impl TrainingRun {
    /// Prepare a run of `loaded`: a fresh run directory under `<export.dir>/runs/` holding
    /// the effective config, or — with `options.resume` — the existing directory, after
    /// checking that it is unfinished and was started with the same effective config.
    pub fn new(loaded: LoadedConfig, options: RunOptions) -> Result<Self, RunError> {
        let started_at = util::rfc3339(util::unix_now());
        let dir = match &options.resume {
            Some(path) => {
                let refuse = |reason: String| RunError::Resume {
                    run: path.clone(),
                    reason,
                };
                let run = RunDir::open(path).map_err(|e| refuse(e.to_string()))?;
                if run.read_status().is_some_and(|s| s.status == "finished") {
                    return Err(refuse(
                        "the run already finished; a finished run is never modified (start a new run)"
                            .into(),
                    ));
                }
                let saved = std::fs::read_to_string(run.config_file())
                    .map_err(|e| refuse(format!("{}: {e}", run.config_file().display())))?;
                if saved != loaded.text {
                    return Err(refuse(format!(
                        "{} differs from the config the run was started with ({}); resume with the same config",
                        loaded.path.display(),
                        run.config_file().display()
                    )));
                }
                for p in run.remove_stale_temps() {
                    tracing::info!("removed {}, left by the interrupted process", p.display());
                }
                if let Ok(Some(st)) = run.mark_if_abandoned() {
                    tracing::info!(
                        "{}: the interrupted process (pid {}) had left it `running`; resuming",
                        run.status_file().display(),
                        st.pid
                    );
                }
                run
            }
            None => {
                let root = &loaded.config.export.dir;
                let run = RunDir::create(root, &loaded.config.name).map_err(|source| {
                    RunError::RunDir {
                        path: root.join("runs"),
                        source,
                    }
                })?;
                util::write_atomic(&run.config_file(), loaded.text.as_bytes()).map_err(
                    |source| RunError::RunDir {
                        path: run.config_file(),
                        source,
                    },
                )?;
                run
            }
        };
        Ok(Self {
            loaded,
            dir,
            options,
            started_at,
            observers: Vec::new(),
            teacher: std::sync::OnceLock::new(),
            data: None,
        })
    }

    /// Train on `data`, already read from the config's `data` section (e.g. by the command's
    /// input check), instead of reading the file again: the run then reads no data file at
    /// all. A dataset read from another path than the config's is not used.
    pub fn with_data(&mut self, data: Dataset) -> &mut Self {
        if data.path == self.loaded.config.data.path {
            self.data = Some(data);
        } else {
            tracing::warn!(
                "the dataset given ({}) is not the config's ({}): the run reads its own",
                data.path.display(),
                self.loaded.config.data.path.display()
            );
        }
        self
    }

    /// Attach an observer (called in the order attached).
    pub fn observe(&mut self, observer: Box<dyn RunObserver>) -> &mut Self {
        self.observers.push(observer);
        self
    }

    /// The run directory.
    pub fn dir(&self) -> &RunDir {
        &self.dir
    }

    /// The effective config.
    pub fn config(&self) -> &LoadedConfig {
        &self.loaded
    }

    /// Run to the end. The status file says `running` while it runs and `finished` or
    /// `failed` (with the reason) after, whatever fails; observers get `on_end` either way.
    pub fn execute(self) -> Result<RunSummary, RunError> {
        self.mark(RunState::Running, None)?;
        let result = self.start().and_then(|()| self.train());
        match result {
            Ok((outcome, latency)) => {
                let end = run_end(&self.loaded, &outcome, latency.as_ref());
                for o in &self.observers {
                    o.on_end(&self.dir, &end);
                }
                util::fault::point("before-finished");
                self.mark(RunState::Finished, None)?;
                Ok(RunSummary {
                    outcome,
                    latency,
                    end,
                })
            }
            Err(e) => {
                let reason = error_chain(&e);
                let end = RunEnd {
                    status: RunState::Failed,
                    reason: Some(reason.clone()),
                    ..RunEnd::default()
                };
                for o in &self.observers {
                    o.on_end(&self.dir, &end);
                }
                if let Err(me) = self.mark(RunState::Failed, Some(reason)) {
                    tracing::warn!("{me}");
                }
                Err(e)
            }
        }
    }

    fn start(&self) -> Result<(), RunError> {
        let environment = environment(&self.loaded.config);
        let start = NewRun {
            id: &self.dir.id,
            name: &self.loaded.config.name,
            run_dir: &self.dir.path,
            config_text: &self.loaded.text,
            config_sha256: &sha256_hex(self.loaded.text.as_bytes()),
            started_at: &self.started_at,
            environment,
        };
        for o in &self.observers {
            o.on_start(&self.dir, &start)?;
        }
        Ok(())
    }

    fn train(&self) -> Result<(TrainOutcome, Option<LatencyReport>), RunError> {
        if let Some(d) = &self.loaded.config.distill {
            let dirs = teacher::teacher_dirs(d, self.options.progress)?;
            let t = teacher::EngineTeacher::load(&dirs, &self.loaded)?;
            let _ = self.teacher.set(t);
        }
        let fanout = Fanout(&self.observers);
        let measure = measure::RunMeasure::new(self.loaded.config.export.engine_kind());
        let job = TrainJob {
            observer: Some(&fanout),
            teacher: self.teacher.get().map(|t| t as &dyn crate::train::Teacher),
            config: &self.loaded,
            run: self.dir.clone(),
            resume: self.options.resume.is_some(),
            progress: self.options.progress,
            stop_after_epochs: self.options.stop_after_epochs,
            data: self.data.as_ref(),
            measure: self
                .options
                .measure
                .then_some(&measure as &dyn crate::train::Measure),
        };
        let outcome = dispatch(&job)?;
        let latency = outcome.manifest.as_ref().and_then(|m| m.latency.clone());
        Ok((outcome, latency))
    }

    fn mark(&self, status: RunState, reason: Option<String>) -> Result<(), RunError> {
        self.dir
            .mark(status, reason, &self.started_at)
            .map_err(|source| RunError::RunDir {
                path: self.dir.status_file(),
                source,
            })
    }
}

/// The run's observers as the one observer the training loop is given (it reports epochs,
/// stage ends and the export; the run itself reports start and end).
struct Fanout<'a>(&'a [Box<dyn RunObserver>]);

impl RunObserver for Fanout<'_> {
    fn on_epoch(&self, run: &RunDir, record: &EpochRecord) {
        for o in self.0 {
            o.on_epoch(run, record);
        }
    }
    fn on_stage_end(&self, run: &RunDir, index: usize, name: &str) {
        for o in self.0 {
            o.on_stage_end(run, index, name);
        }
    }
    fn on_export(&self, run: &RunDir, dir: &Path) {
        for o in self.0 {
            o.on_export(run, dir);
        }
    }
}

/// Run the training job on the backend the config selects.
pub fn dispatch(job: &TrainJob<'_>) -> Result<TrainOutcome, RunError> {
    let c = &job.config.config;
    let outcome = match (c.device, c.backend, c.precision) {
        (DeviceKind::Cpu, CpuBackend::Flex, Precision::F32) => {
            crate::train::train_job_cpu(job)?.outcome
        }
        (DeviceKind::Cpu, CpuBackend::Ndarray, Precision::F32) => {
            train::<crate::backend::TrainNdArray>(job, &Default::default())?.outcome
        }
        #[cfg(feature = "cuda")]
        (DeviceKind::Cuda, _, precision) => {
            let device = crate::backend::cuda_probe().map_err(|e| RunError::Unsupported {
                device: "cuda".into(),
                backend: format!("{:?}", c.backend),
                precision: format!("{precision:?}"),
                build: format!("no usable GPU: {e}"),
            })?;
            // Burn keeps one default float dtype per device: set it to the run's precision
            // before the model exists, or bf16 silently trains in f32.
            let dtype = match precision {
                Precision::F32 => burn::tensor::DType::F32,
                Precision::Bf16 => burn::tensor::DType::BF16,
            };
            crate::backend::set_float_dtype::<crate::backend::CudaF32>(&device, dtype).map_err(
                |e| RunError::Unsupported {
                    device: "cuda".into(),
                    backend: format!("{:?}", c.backend),
                    precision: format!("{precision:?}"),
                    build: e,
                },
            )?;
            match precision {
                Precision::F32 => {
                    train::<burn::backend::Autodiff<crate::backend::CudaF32>>(job, &device)?.outcome
                }
                Precision::Bf16 => {
                    train::<burn::backend::Autodiff<crate::backend::CudaBf16>>(job, &device)?
                        .outcome
                }
            }
        }
        (device, backend, precision) => {
            return Err(RunError::Unsupported {
                device: format!("{device:?}"),
                backend: format!("{backend:?}"),
                precision: format!("{precision:?}"),
                build: if cfg!(feature = "cuda") {
                    "cpu f32 (flex, ndarray), cuda f32/bf16".into()
                } else {
                    "cpu f32 (flex, ndarray); build with --features cuda for the GPU".into()
                },
            });
        }
    };
    Ok(outcome)
}

/// The environment stored with each run: versions, CPU, threads, device, build features.
pub fn environment(c: &crate::config::ExperimentConfig) -> crate::records::RunEnvironment {
    let d = crate::doctor::report();
    // The config's words (`cpu`, `flex`, `f32`), as the config file spells them.
    let word = |v: serde_json::Value| v.as_str().unwrap_or_default().to_string();
    crate::records::RunEnvironment {
        kiln: d.kiln_version,
        burn: d.burn_version,
        rustc: d.rustc,
        target: d.target,
        cpu: d.cpu_model,
        cores: d.logical_cores,
        rayon_threads: d.rayon_threads,
        thread_env: d.thread_env,
        device: word(serde_json::json!(c.device)),
        backend: word(serde_json::json!(c.backend)),
        precision: word(serde_json::json!(c.precision)),
        features: d.features,
        other: Default::default(),
    }
}

/// The end-of-run record of a finished run.
fn run_end(loaded: &LoadedConfig, o: &TrainOutcome, latency: Option<&LatencyReport>) -> RunEnd {
    let val_metric = loaded
        .config
        .stages
        .iter()
        .position(|s| matches!(s.loss, Loss::Mse | Loss::DistillMse))
        .and_then(|i| o.stages.get(i))
        .map(|s| s.best_val_loss);
    RunEnd {
        status: RunState::Finished,
        reason: None,
        dataset_sha256: o.manifest.as_ref().map(|m| m.dataset.sha256.clone()),
        param_count: Some(o.parameter_count as i64),
        artifact_path: o.export_dir.as_ref().map(|d| d.display().to_string()),
        final_metrics: o.manifest.as_ref().map(|m| m.metrics.clone()),
        val_metric,
        latency: latency.cloned(),
        latency_b1_p50_us: latency.and_then(|l| l.p50(1)),
        latency_b128_p50_us: latency.and_then(|l| l.p50(128)),
    }
}

/// `error: cause: cause` without repeating a source already quoted by its parent.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        src = s.source();
    }
    out
}
