//! The staged training loop.
//!
//! Each stage freezes the parts it does not train (their parameters stop requiring
//! gradients, so the backward pass skips them), builds a **new** AdamW over its trainable
//! parameters only, and steps a cosine-with-warm-restarts schedule once per optimizer step.
//! Gradients are clipped by their global L2 norm. After every epoch the model is validated and
//! a resumable snapshot is written; at the end of a stage the stage's best epoch (by validation
//! loss) is restored, so the export holds the best epoch of the last stage on top of the best
//! epoch of the earlier ones.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::clip::clip_global_norm;
use super::evaluate::{
    EvalReport, evaluate, mse_normalised, nll_normalised, predict_split, residual_correlation,
    residual_variance,
};
use super::progress::{ProgressMode, Reporter};
use super::schedule::LrSchedule;
use super::state::{self, EpochRecord, Progress, Snapshot, StateError};
use crate::artifact::{self, ArtifactError, DatasetInfo, HostWeights, Manifest, WeightsInfo};
use crate::config::{ExperimentConfig, LoadedConfig, Loss, Part, StageConfig};
use crate::data::dataset::{Affine, fit_stats, sha256_hex};
use crate::data::loader::{BatchSource, Loader, LoaderSpec};
use crate::data::{ColumnStats, DataError, Dataset};
use crate::model::{RegressionNet, RegressionNetConfig};
use crate::observe::profiler::{self, SortBy, StepProfiler};
use crate::observe::resources::{self, Monitor};
use crate::observe::schedule::Schedule;
use crate::observe::verdict::{self, Verdict};
use crate::run::{RunDir, RunStatus};
use crate::util;

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
    /// `--resume` was given a run that cannot be continued.
    #[error("cannot resume {run}: {reason}")]
    Resume {
        /// The run directory.
        run: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Callbacks for observers of a run (the run registry, the MLflow mirror). Failures are the
/// observer's to report; they never stop training.
pub trait TrainHooks: Sync {
    /// An epoch ended and its snapshot was written.
    fn on_epoch(&self, _run: &RunDir, _record: &EpochRecord) {}
}

/// What a training run is asked to do.
pub struct TrainJob<'a> {
    /// Observers of the run.
    pub hooks: Option<&'a dyn TrainHooks>,
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
}

/// Per-stage throughput summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageSummary {
    /// Stage name.
    pub name: String,
    /// Epochs run.
    pub epochs: usize,
    /// Optimizer steps.
    pub steps: u64,
    /// Samples per second over the stage's steps.
    pub samples_per_s: f64,
    /// Fraction of step time waiting for data.
    pub data_wait_frac: f64,
    /// Best validation loss (restored at the end of the stage).
    pub best_val_loss: f64,
    /// The epoch (1-based) it came from.
    pub best_epoch: usize,
}

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

/// Sets `require_grad` on every parameter it maps.
struct RequireGrad(bool);

impl<B: Backend> ModuleMapper<B> for RequireGrad {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        param.set_require_grad(self.0)
    }
}

/// Collects parameter ids.
#[derive(Default)]
struct Ids(Vec<ParamId>);

impl<B: Backend> ModuleVisitor<B> for Ids {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(param.id);
    }
}

/// Freeze every part not in `parts` and unfreeze those in it.
pub fn set_trainable<B: AutodiffBackend>(
    mut m: RegressionNet<B>,
    parts: &[Part],
) -> RegressionNet<B> {
    let on = |p: Part| parts.contains(&p);
    m.backbone = m.backbone.map(&mut RequireGrad(on(Part::Backbone)));
    m.mean_head = m.mean_head.map(&mut RequireGrad(on(Part::MeanHead)));
    m.logvar_head = m.logvar_head.map(&mut RequireGrad(on(Part::LogvarHead)));
    m
}

/// The parameter ids of the given parts.
pub fn part_param_ids<B: Backend>(m: &RegressionNet<B>, parts: &[Part]) -> Vec<ParamId> {
    let mut ids = Ids::default();
    for p in parts {
        match p {
            Part::Backbone => m.backbone.visit(&mut ids),
            Part::MeanHead => m.mean_head.visit(&mut ids),
            Part::LogvarHead => m.logvar_head.visit(&mut ids),
        }
    }
    ids.0
}

/// AdamW with the stage's hyper-parameters (decoupled weight decay).
pub fn adamw(stage: &StageConfig) -> AdamWConfig {
    let o = &stage.optimizer;
    AdamWConfig::new()
        .with_beta_1(o.beta1 as f32)
        .with_beta_2(o.beta2 as f32)
        .with_epsilon(o.eps as f32)
        .with_weight_decay(o.weight_decay as f32)
}

/// The stage's loss on a batch (normalised units).
pub fn stage_loss<B: Backend>(
    loss: Loss,
    mean_trainable: bool,
    out: crate::model::RegressionOutput<B>,
    y: Tensor<B, 2>,
) -> Tensor<B, 1> {
    match loss {
        Loss::Mse => (out.mean - y).powi_scalar(2).mean(),
        Loss::GaussianNll => {
            let mean = if mean_trainable {
                out.mean
            } else {
                out.mean.detach()
            };
            let lv = out.log_var;
            (lv.clone() + (y - mean).powi_scalar(2) * lv.neg().exp())
                .mul_scalar(0.5)
                .mean()
        }
    }
}

fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Everything fit from the training split before the first step.
pub struct Prepared {
    /// The data.
    pub data: Dataset,
    /// Feature normalisation.
    pub x_stats: Vec<ColumnStats>,
    /// Target normalisation.
    pub y_stats: Vec<ColumnStats>,
    /// The architecture.
    pub arch: RegressionNetConfig,
}

impl Prepared {
    /// Load the dataset and fit the normalisation on the training split.
    pub fn new(cfg: &ExperimentConfig) -> Result<Self, DataError> {
        let data = Dataset::load(&cfg.data)?;
        let x_stats = fit_stats(&data.features, &data.train.x);
        let y_stats = fit_stats(&data.targets, &data.train.y);
        let arch = RegressionNetConfig {
            n_features: data.n_features(),
            hidden: cfg.model.hidden.clone(),
            n_targets: data.n_targets(),
            activation: cfg.model.activation,
        };
        Ok(Self {
            data,
            x_stats,
            y_stats,
            arch,
        })
    }

    /// For each target, the feature holding last season's value (`<target>_l1`).
    pub fn persistence_features(&self) -> Vec<Option<usize>> {
        self.data
            .targets
            .iter()
            .map(|t| {
                self.data
                    .features
                    .iter()
                    .position(|f| *f == format!("{t}_l1"))
            })
            .collect()
    }
}

/// A finished run and its final (best) model without autodiff.
pub struct Trained<B: AutodiffBackend> {
    /// What happened.
    pub outcome: TrainOutcome,
    /// The exported model (absent when the run was stopped early).
    pub model: Option<RegressionNet<B::InnerBackend>>,
}

/// Train according to `job` on backend `B`.
pub fn train<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    device: &B::Device,
) -> Result<Trained<B>, TrainError> {
    let started = Instant::now();
    let cfg = &job.config.config;
    let run = &job.run;
    let mut reporter = Reporter::new(job.progress);
    let prep = Prepared::new(cfg)?;
    let (x_aff, y_aff) = (Affine::new(&prep.x_stats), Affine::new(&prep.y_stats));
    let arch = prep.arch.clone();
    let data = &prep.data;
    reporter.line(&format!(
        "RegressionNet {} → {:?} → 2×{} ({}): {} parameters; {} train / {} validation / {} test rows",
        arch.n_features,
        arch.hidden,
        arch.n_targets,
        arch.activation.name(),
        arch.num_params(),
        data.train.rows(),
        data.validation.rows(),
        data.test.rows()
    ));

    let config_sha = sha256_hex(job.config.text.as_bytes());
    let workers = cfg.loader.num_workers.resolve();
    let spec = LoaderSpec {
        batch_size: cfg.loader.batch_size,
        workers,
        prefetch: cfg.loader.prefetch,
        shuffle: cfg.loader.shuffle,
        drop_last: cfg.loader.drop_last,
        seed: cfg.seed,
    };
    let source = Arc::new(
        BatchSource::new(
            data.train.x.clone(),
            data.train.y.clone(),
            x_aff.clone(),
            y_aff.clone(),
        )
        .with_transform_passes(cfg.data.transform_passes),
    );
    let mut loader = Loader::new(source, spec);

    let mut model: RegressionNet<B> = arch.init(cfg.seed, device);
    let mut best: Option<RegressionNet<B>> = None;
    let mut pending_optim: Option<PathBuf> = None;
    let mut progress = Progress {
        stage: 0,
        epoch: 0,
        stage_step: 0,
        global_step: 0,
        best_val: None,
        best_epoch: None,
        history: Vec::new(),
        steps_csv_len: 0,
        config_sha256: config_sha.clone(),
        dataset_sha256: data.sha256.clone(),
    };
    if job.resume {
        let (dir, saved) = state::latest(&run.state_dir())?;
        let refuse = |reason: String| TrainError::Resume {
            run: run.path.clone(),
            reason,
        };
        if saved.config_sha256 != config_sha {
            return Err(refuse(
                "the config differs from the one the run started with".into(),
            ));
        }
        if saved.dataset_sha256 != data.sha256 {
            return Err(refuse(format!(
                "the dataset {} changed since the run started (SHA-256 {} → {})",
                data.path.display(),
                saved.dataset_sha256,
                data.sha256
            )));
        }
        model = state::load_module(model, &dir.join("model.bin"), device)?;
        if dir.join("best.bin").exists() {
            best = Some(state::load_module(
                model.clone(),
                &dir.join("best.bin"),
                device,
            )?);
        }
        if dir.join("optim.bin").exists() {
            pending_optim = Some(dir.join("optim.bin"));
        }
        progress = saved;
        reporter.line(&format!(
            "resuming {} at stage {} epoch {} (step {})",
            run.id, progress.stage, progress.epoch, progress.global_step
        ));
    }
    // steps.csv: truncate to the snapshot so a resumed run has no duplicate rows.
    let steps_path = run.steps_file();
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
    let epochs_path = run.epochs_file();
    let mut epochs_done_here = 0usize;

    let (nf, nt) = (arch.n_features, arch.n_targets);
    let monitor = Monitor::start(Duration::from_millis(500));
    let cpu_start = resources::cpu_seconds().unwrap_or(0.0);
    let wall_start = Instant::now();
    let p = &cfg.profile;
    let mut profiler = p.enabled.then(|| {
        let dir = if p.out_dir.is_absolute() {
            p.out_dir.clone()
        } else {
            run.path.join(&p.out_dir)
        };
        StepProfiler::new(
            Schedule {
                wait: p.wait,
                warmup: p.warmup,
                active: p.active,
                repeat: p.repeat,
            },
            profiler::Options {
                record_shapes: p.record_shapes,
                profile_memory: p.profile_memory,
                with_stack: p.with_stack,
            },
            dir,
            "train_step",
        )
    });
    let first_epoch_here = progress.history.len();
    while progress.stage < cfg.stages.len() {
        let si = progress.stage;
        let stage = &cfg.stages[si];
        monitor.mark(&stage.name);
        model = set_trainable(model, &stage.trainable);
        let trainable = part_param_ids(&model, &stage.trainable);
        let mean_trainable = stage.trainable.contains(&Part::MeanHead);
        let mut optim = adamw(stage).init::<B, RegressionNet<B>>();
        if let Some(p) = pending_optim.take() {
            optim = optim.load_record(state::decode::<B, _>(&p, device)?);
        }
        let schedule = LrSchedule::new(&stage.schedule, stage.optimizer.lr);

        while progress.epoch < stage.epochs {
            if job.stop_after_epochs.is_some_and(|n| epochs_done_here >= n) {
                steps_out.flush().map_err(io_err(&steps_path))?;
                return Ok(Trained {
                    outcome: TrainOutcome {
                        run: run.clone(),
                        export_dir: None,
                        report: None,
                        stages: Vec::new(),
                        parameter_count: arch.num_params(),
                        manifest: None,
                        wall: started.elapsed(),
                        verdict: None,
                    },
                    model: None,
                });
            }
            let epoch = progress.epoch;
            let n_batches = loader.batches_per_epoch();
            reporter.epoch_start(&stage.name, epoch, stage.epochs, n_batches);
            let (mut wait, mut compute) = (Duration::ZERO, Duration::ZERO);
            let (mut loss_sum, mut norm_sum, mut norm_max, mut clipped) = (0.0, 0.0, 0.0f64, 0u64);
            let (mut steps, mut samples) = (0u64, 0usize);
            let mut lr = schedule.lr(progress.stage_step);
            let mut batches = loader.epoch(epoch_label(si, epoch));
            loop {
                if let Some(p) = profiler.as_mut()
                    && let Some(out) = p.on_step(progress.global_step)?
                {
                    reporter.line(&format!(
                        "profiler: {} steps recorded → {} (open in Perfetto) and {}\n{}",
                        out.averages.steps,
                        out.trace.display(),
                        out.table_txt.display(),
                        out.averages.table(SortBy::Total, 25)
                    ));
                }
                let step_span = crate::prof_span!("train_step").entered();
                let t0 = Instant::now();
                let batch = {
                    let _s = crate::prof_span!("data_wait").entered();
                    batches.next()
                };
                let Some(batch) = batch else { break };
                let t1 = Instant::now();
                let rows = batch.rows;
                let (x, y) = {
                    let _s = crate::prof_span!("h2d", shape = ?[rows, nf]).entered();
                    let x = Tensor::<B, 2>::from_data(TensorData::new(batch.x, [rows, nf]), device);
                    let y = Tensor::<B, 2>::from_data(TensorData::new(batch.y, [rows, nt]), device);
                    profiler::sync::<B>(device);
                    (x, y)
                };
                let out = {
                    let _s = crate::prof_span!("forward", shape = ?[rows, nf]).entered();
                    let out = model.forward(x);
                    profiler::sync::<B>(device);
                    out
                };
                let (loss, loss_value) = {
                    let _s = crate::prof_span!("loss").entered();
                    let loss = stage_loss(stage.loss, mean_trainable, out, y);
                    let v: f64 = loss.clone().into_scalar().elem::<f64>();
                    (loss, v)
                };
                if !loss_value.is_finite() {
                    return Err(TrainError::Diverged {
                        stage: si,
                        name: stage.name.clone(),
                        epoch: epoch + 1,
                        step: progress.stage_step,
                        value: loss_value,
                    });
                }
                let mut grads = {
                    let _s = crate::prof_span!("backward").entered();
                    let mut g = loss.backward();
                    let grads = GradientsParams::from_params(&mut g, &model, &trainable);
                    profiler::sync::<B>(device);
                    grads
                };
                let norm = {
                    let _s = crate::prof_span!("clip").entered();
                    clip_global_norm::<B, _>(&model, &mut grads, stage.clip_norm)
                };
                lr = schedule.lr(progress.stage_step);
                model = {
                    let _s = crate::prof_span!("optimizer_step").entered();
                    let m = optim.step(lr, model, grads);
                    profiler::sync::<B>(device);
                    m
                };
                drop(step_span);
                let t2 = Instant::now();
                let (dw, dc) = (t1 - t0, t2 - t1);
                wait += dw;
                compute += dc;
                loss_sum += loss_value;
                norm_sum += norm;
                norm_max = norm_max.max(norm);
                if stage.clip_norm.is_some_and(|c| norm > c) {
                    clipped += 1;
                }
                writeln!(
                    steps_out,
                    "{si},{epoch},{},{lr:.6e},{loss_value:.6e},{norm:.6e},{},{}",
                    progress.stage_step,
                    dw.as_micros(),
                    dc.as_micros()
                )
                .map_err(io_err(&steps_path))?;
                progress.stage_step += 1;
                progress.global_step += 1;
                steps += 1;
                samples += rows;
                let elapsed = (wait + compute).as_secs_f64();
                reporter.step(
                    &stage.name,
                    epoch,
                    steps as usize - 1,
                    n_batches,
                    loss_value,
                    lr,
                    samples as f64 / elapsed.max(1e-9),
                    wait.as_secs_f64() / elapsed.max(1e-9),
                );
            }
            drop(batches);
            steps_out.flush().map_err(io_err(&steps_path))?;

            let tv = Instant::now();
            let val_loss = {
                let _s = crate::prof_span!("validation").entered();
                let inner = model.valid();
                let vpred = predict_split(&inner, &data.validation.x, &x_aff, device);
                match stage.loss {
                    Loss::Mse => mse_normalised(&vpred, &data.validation.y, &y_aff),
                    Loss::GaussianNll => nll_normalised(&vpred, &data.validation.y, &y_aff),
                }
            };
            let validation_s = tv.elapsed().as_secs_f64();
            let step_time = (wait + compute).as_secs_f64().max(1e-12);
            let record = EpochRecord {
                stage: si,
                stage_name: stage.name.clone(),
                epoch,
                steps,
                train_loss: loss_sum / steps.max(1) as f64,
                val_loss,
                lr,
                grad_norm_mean: norm_sum / steps.max(1) as f64,
                grad_norm_max: norm_max,
                clipped_frac: clipped as f64 / steps.max(1) as f64,
                samples_per_s: samples as f64 / step_time,
                data_wait_frac: wait.as_secs_f64() / step_time,
                data_wait_s: wait.as_secs_f64(),
                compute_s: compute.as_secs_f64(),
                validation_s,
            };
            let improved = val_loss.is_finite() && progress.best_val.is_none_or(|b| val_loss < b);
            if improved {
                progress.best_val = Some(val_loss);
                progress.best_epoch = Some(epoch);
                best = Some(model.clone());
            }
            reporter.epoch_end(&record, stage.epochs, improved);
            let mut line = serde_json::to_string(&record).expect("record serialises");
            line.push('\n');
            append(&epochs_path, line.as_bytes())?;
            if let Some(h) = job.hooks {
                h.on_epoch(run, &record);
            }
            progress.history.push(record);
            progress.epoch += 1;
            epochs_done_here += 1;
            progress.steps_csv_len = std::fs::metadata(&steps_path)
                .map_err(io_err(&steps_path))?
                .len();

            let stage_done = progress.epoch >= stage.epochs;
            let snap_dir = run.state_dir();
            if stage_done {
                if let Some(b) = best.take() {
                    model = b;
                }
                progress.stage += 1;
                progress.epoch = 0;
                progress.stage_step = 0;
                progress.best_val = None;
                progress.best_epoch = None;
                let model_bytes = state::encode::<B, _>(model.clone().into_record(), &snap_dir)?;
                state::save(
                    &snap_dir,
                    Snapshot {
                        progress: &progress,
                        model: model_bytes,
                        best: None,
                        optim: None,
                    },
                )?;
                break;
            } else {
                let model_bytes = state::encode::<B, _>(model.clone().into_record(), &snap_dir)?;
                let best_bytes = match &best {
                    Some(b) => Some(state::encode::<B, _>(b.clone().into_record(), &snap_dir)?),
                    None => None,
                };
                let optim_bytes = state::encode::<B, _>(optim.to_record(), &snap_dir)?;
                state::save(
                    &snap_dir,
                    Snapshot {
                        progress: &progress,
                        model: model_bytes,
                        best: best_bytes,
                        optim: Some(optim_bytes),
                    },
                )?;
            }
        }
    }
    drop(loader);
    if let Some(p) = profiler.as_mut()
        && let Some(out) = p.finish()?
    {
        reporter.line(&format!(
            "profiler: {} steps recorded → {} and {}",
            out.averages.steps,
            out.trace.display(),
            out.table_txt.display()
        ));
    }
    let trace = monitor.stop();
    let cpu_util = (resources::cpu_seconds().unwrap_or(cpu_start) - cpu_start)
        / (wall_start.elapsed().as_secs_f64() * resources::cores() as f64).max(1e-9);
    resources::write_trace(&trace, &run.path)?;
    let here = &progress.history[first_epoch_here.min(progress.history.len())..];
    let verdict = verdict::verdict(&verdict::Timings {
        data_wait_s: here.iter().map(|r| r.data_wait_s).sum(),
        compute_s: here.iter().map(|r| r.compute_s).sum(),
        cpu_util,
        workers,
        cores: resources::cores(),
        batch_size: cfg.loader.batch_size,
    });
    reporter.line(&format!(
        "bottleneck: {} (data wait {:.0}% of step time, compute {:.0}%, CPU {:.0}% of {} cores, peak RSS {:.0} MiB) — {}",
        verdict.bound.label(),
        verdict.data_wait_frac * 100.0,
        verdict.compute_frac * 100.0,
        verdict.cpu_util * 100.0,
        resources::cores(),
        trace.peak_rss_mb(),
        verdict.advice
    ));

    // Final evaluation and export.
    let stages = summarise(cfg, &progress.history);
    let inner = model.valid();
    let train_pred = predict_split(&inner, &data.train.x, &x_aff, device);
    let const_var = residual_variance(&train_pred, &data.train.y, &prep.y_stats);
    let vpred = predict_split(&inner, &data.validation.x, &x_aff, device);
    let corr = residual_correlation(&vpred, &data.validation.y, &prep.y_stats);
    let tpred = predict_split(&inner, &data.test.x, &x_aff, device);
    let report = evaluate(
        "test",
        &tpred,
        &data.test,
        nf,
        &prep.y_stats,
        &prep.persistence_features(),
        &const_var,
    );
    reporter.line(&report.table());

    let weights = HostWeights::from_model(&inner);
    // The int8 engine's accuracy change on the test split, stored with the checkpoint so the
    // serving tier can decide whether to use it.
    let int8 = crate::infer::int8_accuracy_on(
        &weights,
        &prep.x_stats,
        &prep.y_stats,
        &data.test.x,
        &data.test.y,
    )
    .ok();
    let mut split = std::collections::BTreeMap::new();
    split.insert("train".to_string(), cfg.data.split.train.to_string());
    split.insert(
        "validation".to_string(),
        cfg.data.split.validation.to_string(),
    );
    split.insert("test".to_string(), cfg.data.split.test.to_string());
    let manifest = Manifest {
        format: artifact::FORMAT.into(),
        format_version: artifact::FORMAT_VERSION,
        kiln_version: env!("CARGO_PKG_VERSION").into(),
        burn_version: crate::BURN_VERSION.into(),
        created_at: util::rfc3339(util::unix_now()),
        run_id: run.id.clone(),
        architecture: arch.clone(),
        parameter_count: arch.num_params(),
        features: prep.x_stats.clone(),
        targets: prep.y_stats.clone(),
        residual_correlation: corr,
        metrics: serde_json::json!({
            "test": report,
            "stages": stages,
            "beats_all_baselines": report.beats_all(),
            "bottleneck": verdict,
            "int8_test_delta": int8,
        }),
        dataset: DatasetInfo {
            path: cfg.data.path.display().to_string(),
            sha256: data.sha256.clone(),
            rows: [data.train.rows(), data.validation.rows(), data.test.rows()],
            split,
        },
        weights: WeightsInfo {
            file: String::new(),
            sha256: String::new(),
            dtype: String::new(),
        },
        config_sha256: config_sha,
        latency: None,
    };
    let export_dir = run.export_dir();
    if export_dir.exists() {
        // A previous process finished training and exported, then died before marking the
        // run finished: the export is complete (it is renamed into place atomically).
        std::fs::remove_dir_all(&export_dir).map_err(io_err(&export_dir))?;
    }
    let manifest = artifact::export(&export_dir, manifest, &weights)?;
    Ok(Trained {
        outcome: TrainOutcome {
            run: run.clone(),
            export_dir: Some(export_dir),
            report: Some(report),
            stages,
            parameter_count: arch.num_params(),
            manifest: Some(manifest),
            wall: started.elapsed(),
            verdict: Some(verdict),
        },
        model: Some(inner),
    })
}

/// Train `loaded` on the default CPU backend (flex) in a fresh run directory under `root`,
/// quietly and without observers: the embedding entry point used by tests and benchmarks.
pub fn train_cpu(
    loaded: &LoadedConfig,
    root: &std::path::Path,
) -> Result<Trained<crate::backend::TrainCpu>, TrainError> {
    let run = RunDir::create(root, &loaded.config.name).map_err(io_err(root))?;
    let cfg = run.config_file();
    crate::artifact::write_atomic(&cfg, loaded.text.as_bytes())?;
    let job = TrainJob {
        hooks: None,
        config: loaded,
        run,
        resume: false,
        progress: ProgressMode::Quiet,
        stop_after_epochs: None,
    };
    train::<crate::backend::TrainCpu>(&job, &Default::default())
}

/// The loader's epoch label: distinct for every (stage, epoch).
fn epoch_label(stage: usize, epoch: usize) -> u64 {
    ((stage as u64) << 32) | epoch as u64
}

fn append(path: &std::path::Path, bytes: &[u8]) -> Result<(), TrainError> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(bytes).map_err(io_err(path))
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
            StageSummary {
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

/// Mark a run's status file.
pub fn mark(
    run: &RunDir,
    status: &str,
    reason: Option<String>,
    started_at: &str,
) -> Result<(), ArtifactError> {
    run.write_status(&RunStatus {
        id: run.id.clone(),
        status: status.into(),
        pid: std::process::id(),
        started_at: started_at.into(),
        ended_at: (status != "running").then(|| util::rfc3339(util::unix_now())),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OptimizerConfig, ScheduleConfig};
    use burn::backend::{Autodiff, Flex};
    use burn::nn::Linear;

    type B = Autodiff<Flex>;

    fn stage(lr: f64, wd: f64) -> StageConfig {
        StageConfig {
            name: "s".into(),
            trainable: vec![Part::Backbone, Part::MeanHead],
            loss: Loss::Mse,
            epochs: 1,
            optimizer: OptimizerConfig {
                lr,
                weight_decay: wd,
                ..OptimizerConfig::default()
            },
            schedule: ScheduleConfig::Constant,
            clip_norm: None,
        }
    }

    /// Two AdamW steps on loss = Σ c ⊙ w (constant gradient c) against the closed form:
    /// m_t = (1−β1^t)c, v_t = (1−β2^t)c², m̂ = c, v̂ = c², so each step is
    /// w ← w(1 − lr·wd) − lr·c/(|c| + eps).
    #[test]
    fn adamw_steps_match_the_closed_form() {
        let d = Default::default();
        let (lr, wd, eps) = (0.1f64, 0.01f64, 1e-8f64);
        let w0 = [0.5f32, -1.5, 2.0];
        let c = [0.3f32, -2.0, 1e-3];
        let mut lin: Linear<B> =
            crate::model::regression::linear_from(w0.to_vec(), vec![0.0], 3, 1, &d);
        let st = stage(lr, wd);
        let mut optim = adamw(&st).init::<B, Linear<B>>();
        let mut expect: Vec<f64> = w0.iter().map(|&v| v as f64).collect();
        for _ in 0..2 {
            let ct = Tensor::<B, 2>::from_data(TensorData::new(c.to_vec(), [3, 1]), &d);
            let loss = (lin.weight.val() * ct).sum();
            let grads = GradientsParams::from_params(&mut loss.backward(), &lin, &[lin.weight.id]);
            lin = optim.step(lr, lin, grads);
            for (e, &g) in expect.iter_mut().zip(&c) {
                let g = g as f64;
                *e = *e * (1.0 - lr * wd) - lr * g / (g.abs() + eps);
            }
        }
        let got: Vec<f32> = lin.weight.val().into_data().to_vec().unwrap();
        for (g, e) in got.iter().zip(&expect) {
            assert!((*g as f64 - e).abs() < 1e-6, "{got:?} vs {expect:?}");
        }
        // The bias had no gradient (not in the id list): untouched, no weight decay.
        let b: Vec<f32> = lin
            .bias
            .as_ref()
            .unwrap()
            .val()
            .into_data()
            .to_vec()
            .unwrap();
        assert_eq!(b, vec![0.0]);
    }

    #[test]
    fn freezing_removes_gradients_from_frozen_parts() {
        let d = Default::default();
        let arch = RegressionNetConfig::reference();
        let m = set_trainable(arch.init::<B>(1, &d), &[Part::LogvarHead]);
        let out = m.forward(Tensor::ones([4, 20], &d));
        let y = Tensor::zeros([4, 3], &d);
        let loss = stage_loss(Loss::GaussianNll, false, out, y);
        let mut g = loss.backward();
        let all = part_param_ids(&m, &[Part::Backbone, Part::MeanHead, Part::LogvarHead]);
        let grads = GradientsParams::from_params(&mut g, &m, &all);
        assert_eq!(
            grads.len(),
            2,
            "only the log-variance head's weight and bias get gradients"
        );
        assert_eq!(part_param_ids(&m, &[Part::LogvarHead]).len(), 2);
        assert_eq!(part_param_ids(&m, &[Part::Backbone]).len(), 4);
    }
}
