//! One training session on one backend, split along the loop's natural parts:
//!
//! * [`Session::open`]: load and normalise the data, build the loader and the model, restore a
//!   resumed run's state, and line the run's logs up with that state;
//! * [`Session::run_stage`]: one stage — freezing, the stage's fresh AdamW, its schedule, and
//!   its epochs ([`Session::run_epoch`] steps, validates and logs one epoch; the snapshot
//!   follows it);
//! * [`Session::finish`]: the profiler's and resource monitor's outputs, the bottleneck
//!   verdict, and the final evaluation and export (`super::finish`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor, TensorData};

use super::adamw::{StageAdamW, stage_optimizer};
use super::clip::clip_global_norm;
use super::distill::{distill_loss, widen_targets};
use super::evaluate::{mse_normalised, nll_normalised, predict_split};
use super::job::{TrainError, TrainJob, io_err};
use super::prepare::Prepared;
use super::progress::Reporter;
use super::schedule::LrSchedule;
use super::stage::{StepOutput, part_param_ids, set_trainable, stage_loss};
use super::state::{self, Progress, Snapshot};
use crate::config::{Loss, Part, StageConfig};
use crate::data::dataset::{Affine, sha256_hex};
use crate::data::loader::{BatchSource, Loader, LoaderSpec};
use crate::model::{RegressionNet, RegressionNetConfig};
use crate::observe::profiler::{self, SortBy, StepProfiler};
use crate::observe::resources::{self, Monitor};
use crate::observe::schedule::Schedule;
use crate::records::{EpochRecord, StepPhases};

/// The optimizer a stage builds afresh.
type StageOptimizer<B> = StageAdamW<RegressionNet<B>, B>;

/// How a stage ended.
pub(crate) enum StageEnd {
    /// Every epoch ran; the stage's best epoch is restored.
    Done,
    /// `stop_after_epochs` was reached (tests simulate an interruption with it).
    Stopped,
}

/// The state of a training session between its parts.
pub(crate) struct Session<'j, 'a, B: AutodiffBackend> {
    pub(crate) job: &'j TrainJob<'a>,
    pub(crate) device: B::Device,
    pub(crate) started: Instant,
    pub(crate) reporter: Reporter,
    pub(crate) prep: Prepared,
    pub(crate) x_aff: Affine,
    pub(crate) y_aff: Affine,
    pub(crate) workers: usize,
    pub(crate) config_sha: String,
    loader: Loader,
    pub(crate) model: RegressionNet<B>,
    /// An empty network (no elements) that holds `model`'s place while the optimizer owns
    /// the parameters, so that it updates their buffers in place: a clone of `model`
    /// would share them and make every step copy them first.
    stand_in: RegressionNet<B>,
    best: Option<RegressionNet<B>>,
    pending_optim: Option<PathBuf>,
    pub(crate) progress: Progress,
    steps_path: PathBuf,
    steps_out: std::io::BufWriter<std::fs::File>,
    epochs_done_here: usize,
    pub(crate) first_epoch_here: usize,
    pub(crate) monitor: Option<Monitor>,
    /// The resource trace of the run's earlier processes (a resumed run continues it).
    pub(crate) earlier_trace: Option<resources::Trace>,
    pub(crate) cpu_start: f64,
    pub(crate) wall_start: Instant,
    profiler: Option<StepProfiler>,
}

impl<'j, 'a, B: AutodiffBackend> Session<'j, 'a, B> {
    /// Prepare the data, loader and model; restore a resumed run; open the run's logs.
    pub(crate) fn open(job: &'j TrainJob<'a>, device: &B::Device) -> Result<Self, TrainError> {
        let started = Instant::now();
        let cfg = &job.config.config;
        let run = &job.run;
        let reporter = Reporter::new(job.progress);
        let prep = Prepared::new(cfg)?;
        let (x_aff, y_aff) = (Affine::new(&prep.x_stats), Affine::new(&prep.y_stats));
        let arch = &prep.arch;
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
        reporter.line(&data.summary());
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
        let (train_y, train_y_aff) = match &cfg.distill {
            None => (data.train.y.clone(), y_aff.clone()),
            Some(d) => {
                let teacher = job.teacher.ok_or_else(|| {
                    TrainError::Distill(
                        "the config has a `distill:` section but the trainer was given no teacher (train through kiln::run::TrainingRun, as `kiln train` does)"
                            .into(),
                    )
                })?;
                let rows = data.train.rows();
                let (t_mean, t_std) = teacher
                    .predict(&data.train.x, rows)
                    .map_err(TrainError::Distill)?;
                if t_mean.len() != rows * arch.n_targets || t_std.len() != t_mean.len() {
                    return Err(TrainError::Distill(format!(
                        "the teacher answered {} means and {} standard deviations for {rows} rows × {} targets",
                        t_mean.len(),
                        t_std.len(),
                        arch.n_targets
                    )));
                }
                reporter.line(&format!(
                    "distillation: teacher predictions for {rows} training rows, alpha {}",
                    d.alpha
                ));
                let (wide, stats) = widen_targets(&data.train.y, &t_mean, &t_std, &prep.y_stats);
                (wide, Affine::new(&stats))
            }
        };
        let source = Arc::new(
            BatchSource::new(data.train.x.clone(), train_y, x_aff.clone(), train_y_aff)
                .with_transform_passes(cfg.data.transform_passes)
                .with_weights(data.train.weights()),
        );
        let loader = Loader::new(source, spec);
        let mut model: RegressionNet<B> = arch.init(cfg.seed, device);
        let mut best = None;
        let mut pending_optim = None;
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
        // A run killed before its first snapshot has nothing to restore; since weights and
        // shuffles derive from the seed alone, starting it over in its own directory reaches
        // the same result as an uninterrupted run.
        let saved = if !job.resume {
            None
        } else {
            match state::latest(&run.state_dir()) {
                Ok(found) => Some(found),
                Err(state::StateError::Missing { .. }) => {
                    reporter.line(&format!(
                        "resuming {}: no snapshot was written yet, starting from the first epoch",
                        run.id
                    ));
                    None
                }
                Err(e) => return Err(e.into()),
            }
        };
        if let Some((dir, saved)) = saved {
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
        let (steps_path, steps_out) = open_logs(run.steps_file(), &run.epochs_file(), &progress)?;
        if job.resume {
            crate::util::fault::point("during-resume");
        }
        let p = &cfg.profile;
        let profiler = p.enabled.then(|| {
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
        Ok(Self {
            job,
            device: device.clone(),
            started,
            reporter,
            prep,
            x_aff,
            y_aff,
            workers,
            config_sha,
            loader,
            stand_in: RegressionNetConfig {
                n_features: 0,
                hidden: Vec::new(),
                n_targets: 0,
                activation: model.activation,
            }
            .init(0, device),
            model,
            best,
            pending_optim,
            progress,
            steps_path,
            steps_out,
            epochs_done_here: 0,
            first_epoch_here,
            monitor: Some(Monitor::start(Duration::from_millis(500))),
            earlier_trace: if job.resume {
                resources::read_trace(&job.run.path)
            } else {
                None
            },
            cpu_start: resources::cpu_seconds().unwrap_or(0.0),
            wall_start: Instant::now(),
            profiler,
        })
    }

    /// Run the current stage's remaining epochs; each is followed by a resumable snapshot.
    pub(crate) fn run_stage(&mut self) -> Result<StageEnd, TrainError> {
        let job = self.job;
        let cfg = &job.config.config;
        let si = self.progress.stage;
        let stage = &cfg.stages[si];
        if let Some(m) = &self.monitor {
            m.mark(&stage.name);
        }
        self.model = set_trainable(self.model.clone(), &stage.trainable);
        let mut optim = stage_optimizer::<B, RegressionNet<B>>(stage);
        if let Some(p) = self.pending_optim.take() {
            optim = optim.load_record(state::decode::<B, _>(&p, &self.device)?);
        }
        let schedule = LrSchedule::new(&stage.schedule, stage.optimizer.lr);
        while self.progress.epoch < stage.epochs {
            if self
                .job
                .stop_after_epochs
                .is_some_and(|n| self.epochs_done_here >= n)
            {
                self.steps_out.flush().map_err(io_err(&self.steps_path))?;
                return Ok(StageEnd::Stopped);
            }
            self.run_epoch(si, stage, &mut optim, &schedule)?;
            let stopped_early = self.progress.epoch < stage.epochs
                && stage.early_stopping.is_some_and(|es| {
                    let losses: Vec<f64> = self
                        .progress
                        .history
                        .iter()
                        .filter(|r| r.stage == si)
                        .map(|r| r.val_loss)
                        .collect();
                    es.should_stop(&losses)
                });
            if stopped_early {
                let es = stage.early_stopping.expect("checked above");
                self.reporter.line(&format!(
                    "stage {}: early stop after epoch {}/{} (no validation improvement > {} for {} epochs; best epoch {} restored)",
                    stage.name,
                    self.progress.epoch,
                    stage.epochs,
                    es.min_delta,
                    es.patience,
                    self.progress.best_epoch.map_or(0, |e| e + 1),
                ));
            }
            let stage_done = stopped_early || self.progress.epoch >= stage.epochs;
            self.snapshot(&optim, stage_done)?;
            if stage_done {
                if let Some(h) = job.observer {
                    h.on_stage_end(&job.run, si, &stage.name);
                }
                break;
            }
        }
        Ok(StageEnd::Done)
    }

    /// One epoch: every step, then validation, the epoch's log line and the observers' event.
    fn run_epoch(
        &mut self,
        si: usize,
        stage: &StageConfig,
        optim: &mut StageOptimizer<B>,
        schedule: &LrSchedule,
    ) -> Result<EpochRecord, TrainError> {
        let (nf, nt) = (self.prep.arch.n_features, self.prep.arch.n_targets);
        let device = self.device.clone();
        let trainable = part_param_ids(&self.model, &stage.trainable);
        let mean_trainable = stage.trainable.contains(&Part::MeanHead);
        let alpha = self
            .job
            .config
            .config
            .distill
            .as_ref()
            .map_or(1.0, |d| d.alpha);
        let epoch = self.progress.epoch;
        let n_batches = self.loader.batches_per_epoch();
        self.reporter
            .epoch_start(&stage.name, epoch, stage.epochs, n_batches);
        let (mut wait, mut compute) = (Duration::ZERO, Duration::ZERO);
        let mut phases = StepPhases::default();
        let (mut loss_sum, mut norm_sum, mut norm_max, mut clipped) = (0.0, 0.0, 0.0f64, 0u64);
        let (mut steps, mut samples) = (0u64, 0usize);
        let mut lr = schedule.lr(self.progress.stage_step);
        let mut batches = self.loader.epoch(epoch_label(si, epoch));
        loop {
            if let Some(p) = self.profiler.as_mut()
                && let Some(out) = p.on_step(self.progress.global_step)?
            {
                self.reporter.line(&format!(
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
            let w = (!batch.w.is_empty())
                .then(|| Tensor::<B, 2>::from_data(TensorData::new(batch.w, [rows, 1]), &device));
            let mut clock = PhaseClock(t1);
            let (x, y) = {
                let _s = crate::prof_span!("h2d", shape = ?[rows, nf]).entered();
                let x = Tensor::<B, 2>::from_data(TensorData::new(batch.x, [rows, nf]), &device);
                // `nt` targets, or `3·nt` with a teacher's predictions beside them.
                let ny = batch.y.len() / rows.max(1);
                let y = Tensor::<B, 2>::from_data(TensorData::new(batch.y, [rows, ny]), &device);
                profiler::sync::<B>(&device);
                (x, y)
            };
            phases.h2d += clock.lap();
            let out = {
                let _s = crate::prof_span!("forward", shape = ?[rows, nf]).entered();
                let out = StepOutput::forward(&self.model, stage.loss, x);
                profiler::sync::<B>(&device);
                out
            };
            phases.forward += clock.lap();
            let (loss, loss_value) = {
                let _s = crate::prof_span!("loss").entered();
                let loss = if y.dims()[1] > nt {
                    distill_loss(stage.loss, alpha, mean_trainable, out, y, w)
                } else {
                    stage_loss(stage.loss, mean_trainable, out, y, w)
                };
                let v: f64 = loss.clone().into_scalar().elem::<f64>();
                (loss, v)
            };
            phases.loss += clock.lap();
            if !loss_value.is_finite() {
                return Err(TrainError::Diverged {
                    stage: si,
                    name: stage.name.clone(),
                    epoch: epoch + 1,
                    step: self.progress.stage_step,
                    value: loss_value,
                });
            }
            let mut grads = {
                let _s = crate::prof_span!("backward").entered();
                let mut g = loss.backward();
                let grads = GradientsParams::from_params(&mut g, &self.model, &trainable);
                profiler::sync::<B>(&device);
                grads
            };
            phases.backward += clock.lap();
            let norm = {
                let _s = crate::prof_span!("clip").entered();
                clip_global_norm::<B, _>(&self.model, &mut grads, stage.clip_norm)
            };
            phases.clip += clock.lap();
            lr = schedule.lr(self.progress.stage_step);
            self.model = {
                let _s = crate::prof_span!("optimizer_step").entered();
                let model = std::mem::replace(&mut self.model, self.stand_in.clone());
                let m = optim.step(lr, model, grads);
                profiler::sync::<B>(&device);
                m
            };
            phases.optimizer += clock.lap();
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
                self.steps_out,
                "{si},{epoch},{},{lr:.6e},{loss_value:.6e},{norm:.6e},{},{}",
                self.progress.stage_step,
                dw.as_micros(),
                dc.as_micros()
            )
            .map_err(io_err(&self.steps_path))?;
            self.progress.stage_step += 1;
            self.progress.global_step += 1;
            crate::util::fault::point("during-step");
            steps += 1;
            samples += rows;
            let elapsed = (wait + compute).as_secs_f64();
            self.reporter.step(
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
        self.steps_out.flush().map_err(io_err(&self.steps_path))?;

        let tv = Instant::now();
        let val_loss = {
            let _s = crate::prof_span!("validation").entered();
            let data = &self.prep.data;
            let inner = self.model.valid();
            let vpred = predict_split(&inner, &data.validation.x, &self.x_aff, &device);
            // Against the true targets, also in distillation stages.
            match stage.loss {
                Loss::Mse | Loss::DistillMse => mse_normalised(
                    &vpred,
                    &data.validation.y,
                    &self.y_aff,
                    data.validation.weights(),
                ),
                Loss::GaussianNll | Loss::DistillNll => nll_normalised(
                    &vpred,
                    &data.validation.y,
                    &self.y_aff,
                    data.validation.weights(),
                ),
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
            phase_s: StepPhases {
                data: wait.as_secs_f64(),
                ..phases
            },
        };
        let improved = val_loss.is_finite() && self.progress.best_val.is_none_or(|b| val_loss < b);
        if improved {
            self.progress.best_val = Some(val_loss);
            self.progress.best_epoch = Some(epoch);
            self.best = Some(self.model.clone());
        }
        self.reporter.epoch_end(&record, stage.epochs, improved);
        let mut line = serde_json::to_string(&record).expect("record serialises");
        line.push('\n');
        append(&self.job.run.epochs_file(), line.as_bytes())?;
        crate::util::fault::point("after-epoch-log");
        if let Some(h) = self.job.observer {
            h.on_epoch(&self.job.run, &record);
        }
        self.progress.history.push(record.clone());
        self.progress.epoch += 1;
        self.epochs_done_here += 1;
        self.progress.steps_csv_len = std::fs::metadata(&self.steps_path)
            .map_err(io_err(&self.steps_path))?
            .len();
        Ok(record)
    }

    /// Write the resumable snapshot after an epoch. At the end of a stage the stage's best
    /// epoch is restored first and the counters move to the next stage (no optimizer state:
    /// the next stage builds its own).
    /// The run's whole resource trace: its earlier processes' (when resumed), then this one's.
    pub(crate) fn full_trace(&self, here: resources::Trace) -> resources::Trace {
        match &self.earlier_trace {
            Some(e) => e.followed_by(&here),
            None => here,
        }
    }

    fn snapshot(&mut self, optim: &StageOptimizer<B>, stage_done: bool) -> Result<(), TrainError> {
        // Keep resources.csv current, so that a run killed from here on leaves its trace
        // for `--resume` to continue (not a trace of the resumed process alone).
        if let Some(m) = &self.monitor {
            let trace = self.full_trace(m.current());
            if let Err(e) = resources::write_trace_csv(&trace, &self.job.run.path) {
                tracing::warn!(
                    "{}: cannot write the resource trace: {e}",
                    self.job.run.path.display()
                );
            }
        }
        let snap_dir = self.job.run.state_dir();
        if stage_done {
            // The refit pass keeps its last epoch: its validation rows are training rows.
            let best = self.best.take();
            if let Some(b) = best
                && self.job.config.config.refit_pass.is_none()
            {
                self.model = b;
            }
            let p = &mut self.progress;
            p.stage += 1;
            p.epoch = 0;
            p.stage_step = 0;
            p.best_val = None;
            p.best_epoch = None;
            let model_bytes = state::encode::<B, _>(self.model.clone().into_record(), &snap_dir)?;
            state::save(
                &snap_dir,
                Snapshot {
                    progress: &self.progress,
                    model: model_bytes,
                    best: None,
                    optim: None,
                },
            )?;
        } else {
            let model_bytes = state::encode::<B, _>(self.model.clone().into_record(), &snap_dir)?;
            let best_bytes = match &self.best {
                Some(b) => Some(state::encode::<B, _>(b.clone().into_record(), &snap_dir)?),
                None => None,
            };
            let optim_bytes = state::encode::<B, _>(optim.to_record(), &snap_dir)?;
            state::save(
                &snap_dir,
                Snapshot {
                    progress: &self.progress,
                    model: model_bytes,
                    best: best_bytes,
                    optim: Some(optim_bytes),
                },
            )?;
        }
        Ok(())
    }

    /// Stop the loader and write the profiler's last recording (if one is open).
    pub(crate) fn close_instruments(&mut self) -> Result<(), TrainError> {
        if let Some(p) = self.profiler.as_mut()
            && let Some(out) = p.finish()?
        {
            self.reporter.line(&format!(
                "profiler: {} steps recorded → {} and {}",
                out.averages.steps,
                out.trace.display(),
                out.table_txt.display()
            ));
        }
        Ok(())
    }

    /// The epochs this process ran (a resumed run's verdict covers only its own epochs).
    pub(crate) fn epochs_here(&self) -> &[EpochRecord] {
        let h = &self.progress.history;
        &h[self.first_epoch_here.min(h.len())..]
    }
}

/// Line the run's logs up with the state being resumed (or start them): `steps.csv` is
/// truncated to the snapshot's length, and `epochs.jsonl` is rewritten from the snapshot's
/// history, so a run killed between an epoch's log line and its snapshot has no duplicate rows
/// after `--resume`. Returns the steps file and a buffered appender on it.
fn open_logs(
    steps_path: PathBuf,
    epochs_path: &Path,
    progress: &Progress,
) -> Result<(PathBuf, std::io::BufWriter<std::fs::File>), TrainError> {
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
        crate::util::write_atomic(epochs_path, text.as_bytes())?;
    }
    Ok((steps_path, steps_out))
}

/// Seconds since the previous lap.
struct PhaseClock(Instant);

impl PhaseClock {
    fn lap(&mut self) -> f64 {
        let now = Instant::now();
        let d = now - self.0;
        self.0 = now;
        d.as_secs_f64()
    }
}

/// The loader's epoch label: distinct for every (stage, epoch).
fn epoch_label(stage: usize, epoch: usize) -> u64 {
    ((stage as u64) << 32) | epoch as u64
}

fn append(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(bytes).map_err(io_err(path))
}
