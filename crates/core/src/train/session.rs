//! One training session on one backend: it holds the model, the optimizer state to restore and
//! the progress, and little else.
//!
//! * [`Session::open`]: normalise the data (read once by the caller), build the loader and the
//!   model, restore a resumed run's state, and line the run's logs up with that state;
//! * [`Session::run`]: every remaining stage — freezing, the stage's fresh AdamW, its schedule
//!   and its epochs (each a loop of [`super::step::step`] with its statistics in
//!   [`EpochStats`], then [`Validation`], the epoch's log line and a resumable snapshot) — then
//!   the end: the instruments' verdict, [`super::finish::evaluate`] (every number the
//!   manifest records, measured on the weights in memory) and [`super::finish::seal`] (the
//!   manifest and the one atomic export).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::optim::Optimizer;
use burn::tensor::backend::{AutodiffBackend, Backend};

use super::adamw::stage_optimizer;
use super::distill::widen_targets;
use super::epoch::{EpochStats, Validation};
use super::finish::{self, Ending};
use super::instruments::Instruments;
use super::job::{TrainError, TrainJob, TrainOutcome, Trained, summarise};
use super::logs::RunLogs;
use super::prepare::Prepared;
use super::progress::Reporter;
use super::schedule::LrSchedule;
use super::stage::set_trainable;
use super::state::{self, Progress, Snapshot};
use super::step::{NonFiniteLoss, StageOptimizer, StepAt, StepContext, Trainee, step};
use crate::config::{EpochSelection, Loss, StageConfig};
use crate::data::Dataset;
use crate::data::dataset::{Affine, sha256_hex};
use crate::data::loader::{BatchSource, Loader, LoaderSpec};
use crate::model::RegressionNet;
use crate::records::EpochRecord;

/// How a stage ended.
enum StageEnd {
    /// Every epoch ran; the stage's best epoch is restored.
    Done,
    /// `stop_after_epochs` was reached (tests simulate an interruption with it).
    Stopped,
}

/// The data a session trains on: the prepared splits, their normalisation and the loader.
struct TrainData {
    prep: Prepared,
    x_aff: Affine,
    y_aff: Affine,
    loader: Loader,
}

impl TrainData {
    /// Score `model` on the validation split with a stage's `loss`.
    fn validate<B: Backend>(
        &self,
        model: &RegressionNet<B>,
        loss: Loss,
        device: &B::Device,
    ) -> Validation {
        let split = &self.prep.data.validation;
        Validation::run(model, split, &self.x_aff, &self.y_aff, loss, device)
    }
}

/// A training session; see the module docs.
pub(crate) struct Session<'j, 'a, B: AutodiffBackend> {
    job: &'j TrainJob<'a>,
    device: B::Device,
    data: TrainData,
    trainee: Trainee<B>,
    /// The current stage's best epoch so far.
    best: Option<RegressionNet<B>>,
    /// A resumed stage's optimizer state, loaded when the stage starts.
    pending_optim: Option<PathBuf>,
    progress: Progress,
    logs: RunLogs,
    reporter: Reporter,
    instruments: Instruments,
}

/// What [`restore`] gives back.
struct Restored<B: AutodiffBackend> {
    model: RegressionNet<B>,
    best: Option<RegressionNet<B>>,
    pending_optim: Option<PathBuf>,
    progress: Progress,
}

impl<'j, 'a, B: AutodiffBackend> Session<'j, 'a, B> {
    /// Prepare `data` (read from `job`'s config), the loader and the model; restore a resumed
    /// run; open the run's logs.
    pub(crate) fn open(
        job: &'j TrainJob<'a>,
        data: &Dataset,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        let started = Instant::now();
        let cfg = &job.config.config;
        let reporter = Reporter::new(job.progress);
        let prep = Prepared::from_dataset(cfg, data.clone())?;
        let (x_aff, y_aff) = (Affine::new(&prep.x_stats), Affine::new(&prep.y_stats));
        describe(&reporter, &prep, cfg.model.ensemble);
        let loader = loader(job, &prep, &x_aff, &y_aff, &reporter)?;
        let restored = restore::<B>(job, &prep, device, &reporter)?;
        let logs = RunLogs::open(&job.run, &restored.progress)?;
        if job.resume {
            crate::util::fault::point("during-resume");
        }
        let first_epoch = restored.progress.history.len();
        Ok(Self {
            job,
            device: device.clone(),
            data: TrainData {
                prep,
                x_aff,
                y_aff,
                loader,
            },
            trainee: Trainee::new(restored.model, device),
            best: restored.best,
            pending_optim: restored.pending_optim,
            progress: restored.progress,
            logs,
            reporter,
            instruments: Instruments::start(job, started, first_epoch),
        })
    }

    /// Train every remaining stage, then evaluate and export (see the module docs). A run
    /// stopped by `stop_after_epochs` ends without an export.
    pub(crate) fn run(mut self) -> Result<Trained<B>, TrainError> {
        while self.progress.stage < self.job.config.config.stages.len() {
            if let StageEnd::Stopped = self.run_stage()? {
                return Ok(Trained {
                    outcome: TrainOutcome {
                        run: self.job.run.clone(),
                        export_dir: None,
                        report: None,
                        stages: Vec::new(),
                        parameter_count: self.data.prep.arch.num_params(),
                        manifest: None,
                        wall: self.instruments.wall(),
                        verdict: None,
                    },
                    model: None,
                });
            }
        }
        self.finish()
    }

    /// Run the current stage's remaining epochs; each is followed by a resumable snapshot.
    fn run_stage(&mut self) -> Result<StageEnd, TrainError> {
        let job = self.job;
        let si = self.progress.stage;
        let stage = &job.config.config.stages[si];
        self.instruments.mark_stage(&stage.name);
        if self.progress.epoch == 0 && self.progress.stage_step == 0 && starts_variance(job, si) {
            let start = self.constant_variance_start();
            self.trainee.update(|model| start.apply(model));
        }
        self.trainee
            .update(|model| set_trainable(model, &stage.trainable));
        let mut optim = stage_optimizer::<B, RegressionNet<B>>(stage);
        if let Some(p) = self.pending_optim.take() {
            optim = optim.load_record(state::decode::<B, _>(&p, &self.device)?);
        }
        let stage_steps = (stage.epochs * self.data.loader.batches_per_epoch()) as u64;
        let schedule = LrSchedule::new(&stage.schedule, stage.optimizer.lr, stage_steps);
        while self.progress.epoch < stage.epochs {
            let here = self.instruments.epochs_here(&self.progress.history).len();
            if job.stop_after_epochs.is_some_and(|n| here >= n) {
                self.logs.flush()?;
                return Ok(StageEnd::Stopped);
            }
            self.run_epoch(si, stage, &mut optim, &schedule)?;
            let stopped_early = self.progress.epoch < stage.epochs && self.should_stop(si, stage);
            if stopped_early {
                let es = stage.early_stopping.expect("checked by should_stop");
                self.reporter.line(&format!(
                    "stage {}: early stop after epoch {}/{} (no validation improvement > {} for {} epochs; {})",
                    stage.name,
                    self.progress.epoch,
                    stage.epochs,
                    es.min_delta,
                    es.patience,
                    match stage.select {
                        EpochSelection::Best => format!(
                            "best epoch {} restored",
                            self.progress.best_epoch.map_or(0, |e| e + 1)
                        ),
                        EpochSelection::Last => "last epoch kept".to_string(),
                    },
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

    /// The constant-variance solution on the current mean: the log of each target's mean
    /// squared training residual (normalised units), the log-variance head's start for a
    /// variance stage (see [`starts_variance`]).
    fn constant_variance_start(&self) -> ConstantVariance {
        let prep = &self.data.prep;
        let pred = super::evaluate::predict_split(
            &self.trainee.model().valid(),
            &prep.data.train.x,
            &self.data.x_aff,
            &self.device,
        );
        let var = super::evaluate::residual_variance(&pred, &prep.data.train.y, &prep.y_stats);
        ConstantVariance(
            var.iter()
                .zip(&prep.y_stats)
                .map(|(v, t)| ((v / (t.std * t.std)).max(1e-12)).ln() as f32)
                .collect(),
        )
    }

    /// Whether stage `si`'s early stopping ends it after the epoch just run.
    fn should_stop(&self, si: usize, stage: &StageConfig) -> bool {
        stage.early_stopping.is_some_and(|es| {
            let losses: Vec<f64> = self
                .progress
                .history
                .iter()
                .filter(|r| r.stage == si)
                .map(|r| r.val_loss)
                .collect();
            es.should_stop(&losses)
        })
    }

    /// One epoch: every step, then validation, the epoch's log line and the observers' event.
    fn run_epoch(
        &mut self,
        si: usize,
        stage: &StageConfig,
        optim: &mut StageOptimizer<B>,
        schedule: &LrSchedule,
    ) -> Result<EpochRecord, TrainError> {
        let cfg = &self.job.config.config;
        let alpha = cfg.distill.as_ref().map_or(1.0, |d| d.alpha);
        let model = self.trainee.model();
        let ctx = StepContext::new(&self.device, stage, model, &self.data.prep.arch, alpha);
        let epoch = self.progress.epoch;
        let n_batches = self.data.loader.batches_per_epoch();
        self.reporter
            .epoch_start(&stage.name, epoch, stage.epochs, n_batches);
        let mut stats = EpochStats::default();
        let mut lr = schedule.lr(self.progress.stage_step);
        let mut batches = self.data.loader.epoch(epoch_label(si, epoch));
        loop {
            self.instruments
                .before_step(self.progress.global_step, &self.reporter)?;
            let step_span = crate::prof_span!("train_step").entered();
            let waited = Instant::now();
            let batch = {
                let _s = crate::prof_span!("data_wait").entered();
                batches.next()
            };
            let Some(batch) = batch else { break };
            let wait = waited.elapsed();
            let stage_step = self.progress.stage_step;
            let at = StepAt {
                stage: si,
                epoch,
                stage_step,
            };
            lr = schedule.lr(stage_step);
            let done = step(&ctx, &mut self.trainee, optim, lr, batch)
                .map_err(|e| diverged(at, stage, e))?;
            drop(step_span);
            stats.add(wait, &done, stage.clip_norm);
            self.logs.step(at, lr, &done, wait)?;
            self.progress.stage_step += 1;
            self.progress.global_step += 1;
            crate::util::fault::point("during-step");
            self.reporter
                .step(&stage.name, epoch, n_batches, done.loss, lr, &stats);
        }
        drop(batches);
        self.logs.flush()?;
        let inner = self.trainee.model().valid();
        let validation = self.data.validate(&inner, stage.loss, &self.device);
        let record = stats.record(si, &stage.name, epoch, lr, &validation);
        self.end_epoch(&record, stage.epochs)?;
        Ok(record)
    }

    /// Keep the best epoch, log the epoch's record and tell the observers.
    fn end_epoch(&mut self, record: &EpochRecord, epochs: usize) -> Result<(), TrainError> {
        let val_loss = record.val_loss;
        let improved = val_loss.is_finite() && self.progress.best_val.is_none_or(|b| val_loss < b);
        if improved {
            self.progress.best_val = Some(val_loss);
            self.progress.best_epoch = Some(record.epoch);
            self.best = Some(self.trainee.model().clone());
        }
        self.reporter.epoch_end(record, epochs, improved);
        self.logs.epoch(record)?;
        crate::util::fault::point("after-epoch-log");
        if let Some(h) = self.job.observer {
            h.on_epoch(&self.job.run, record);
        }
        self.progress.history.push(record.clone());
        self.progress.epoch += 1;
        self.progress.steps_csv_len = self.logs.steps_len()?;
        Ok(())
    }

    /// Write the resumable snapshot after an epoch. At the end of a stage the stage's best
    /// epoch is restored first and the counters move to the next stage (no optimizer state:
    /// the next stage builds its own).
    fn snapshot(&mut self, optim: &StageOptimizer<B>, stage_done: bool) -> Result<(), TrainError> {
        self.instruments.save_trace(&self.job.run);
        let snap_dir = self.job.run.state_dir();
        let encode =
            |m: &RegressionNet<B>| state::encode::<B, _>(m.clone().into_record(), &snap_dir);
        let snapshot = if stage_done {
            // The refit pass keeps its last epoch: its validation rows are training rows; so
            // does a stage that selects its last epoch.
            let best = self.best.take();
            let select = self.job.config.config.stages[self.progress.stage].select;
            if let Some(b) = best
                && self.job.config.config.refit_pass.is_none()
                && select == EpochSelection::Best
            {
                self.trainee.set(b);
            }
            let p = &mut self.progress;
            p.stage += 1;
            p.epoch = 0;
            p.stage_step = 0;
            p.best_val = None;
            p.best_epoch = None;
            Snapshot {
                progress: &self.progress,
                model: encode(self.trainee.model())?,
                best: None,
                optim: None,
            }
        } else {
            Snapshot {
                progress: &self.progress,
                model: encode(self.trainee.model())?,
                best: self.best.as_ref().map(encode).transpose()?,
                optim: Some(state::encode::<B, _>(optim.to_record(), &snap_dir)?),
            }
        };
        state::save(&snap_dir, snapshot)?;
        Ok(())
    }

    /// The end: close the instruments (the bottleneck verdict), evaluate the final model and
    /// seal it in the one export.
    fn finish(mut self) -> Result<Trained<B>, TrainError> {
        let workers = self.data.loader.spec().workers;
        let verdict =
            self.instruments
                .close(self.job, &self.progress.history, workers, &self.reporter)?;
        let end = Ending::<B> {
            job: self.job,
            prep: &self.data.prep,
            x_aff: &self.data.x_aff,
            device: &self.device,
            reporter: &self.reporter,
        };
        let stages = summarise(&self.job.config.config, &self.progress.history);
        let evaluation = finish::evaluate(&end, self.trainee.model().valid().folded(), stages)?;
        let mut trained = finish::seal(&end, evaluation, verdict, &self.progress.config_sha256)?;
        trained.outcome.wall = self.instruments.wall();
        Ok(trained)
    }
}

/// Whether stage `si` is the first to fit the log-variance head, on a frozen mean (a
/// `gaussian_nll` stage that trains `logvar_head` alone). Such a stage starts from the
/// constant-variance solution ([`ConstantVariance`]) instead of the head's random weights:
/// random weights over features the mean stage made large give some rows a log-variance far
/// below their residual, and the first steps' loss on them reaches 1e12 (a real table's
/// damaged rows did), so the stage spends its epochs recovering and keeps the epoch the
/// outliers picked. From the constant solution the head can only learn where the variance
/// differs, and its first epoch already scores as a constant variance does.
fn starts_variance(job: &TrainJob<'_>, si: usize) -> bool {
    let stages = &job.config.config.stages;
    let s = &stages[si];
    s.loss == Loss::GaussianNll
        && s.trainable == [crate::config::Part::LogvarHead]
        && !stages[..si]
            .iter()
            .any(|e| e.trainable.contains(&crate::config::Part::LogvarHead))
}

/// A log-variance head that predicts one constant per target: zero weights, the constants as
/// the bias.
struct ConstantVariance(Vec<f32>);

impl ConstantVariance {
    fn apply<B: AutodiffBackend>(self, mut m: RegressionNet<B>) -> RegressionNet<B> {
        use burn::module::Param;
        use burn::tensor::{Tensor, TensorData};
        let head = &m.logvar_head;
        let device = head.weight.device();
        let k = self.0.len();
        let w = Param::initialized(head.weight.id, head.weight.val().zeros_like());
        let b = head.bias.as_ref().map(|b| {
            Param::initialized(
                b.id,
                Tensor::from_data(TensorData::new(self.0, [k]), &device),
            )
        });
        m.logvar_head.weight = w;
        m.logvar_head.bias = b;
        m
    }
}

/// The run's first lines: the network and the data.
fn describe(reporter: &Reporter, prep: &Prepared, members: usize) {
    let (arch, data) = (&prep.arch, &prep.data);
    let hidden = match members {
        1 => format!("{:?}", arch.hidden),
        m => format!(
            "{m} × {:?} packed as {:?}",
            arch.hidden.iter().map(|w| w / m).collect::<Vec<_>>(),
            arch.hidden
        ),
    };
    reporter.line(&format!(
        "RegressionNet {} → {hidden} → 2×{} ({}): {} parameters; {} train / {} validation / {} test rows",
        arch.n_features,
        arch.n_targets,
        arch.activation.name(),
        arch.num_params(),
        data.train.rows(),
        data.validation.rows(),
        data.test.rows()
    ));
    reporter.line(&data.summary());
}

/// The loader over the training split: its targets, or — distilling — the targets widened
/// with the teacher's predictions.
fn loader(
    job: &TrainJob<'_>,
    prep: &Prepared,
    x_aff: &Affine,
    y_aff: &Affine,
    reporter: &Reporter,
) -> Result<Loader, TrainError> {
    let cfg = &job.config.config;
    let (arch, data) = (&prep.arch, &prep.data);
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
    let spec = LoaderSpec {
        batch_size: cfg.loader.batch_size,
        workers: cfg.loader.num_workers.resolve(),
        prefetch: cfg.loader.prefetch,
        shuffle: cfg.loader.shuffle,
        drop_last: cfg.loader.drop_last,
        seed: cfg.seed,
    };
    Ok(Loader::new(source, spec))
}

/// The model and progress to start from: fresh, or a resumed run's last snapshot (after
/// checking that the config and the dataset are the ones it started with).
fn restore<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    prep: &Prepared,
    device: &B::Device,
    reporter: &Reporter,
) -> Result<Restored<B>, TrainError> {
    let (cfg, run, data) = (&job.config.config, &job.run, &prep.data);
    let config_sha = sha256_hex(job.config.text.as_bytes());
    let fresh = Restored {
        model: prep.arch.init_members(cfg.seed, cfg.model.ensemble, device),
        best: None,
        pending_optim: None,
        progress: Progress {
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
        },
    };
    // A run killed before its first snapshot has nothing to restore; since weights and
    // shuffles derive from the seed alone, starting it over in its own directory reaches
    // the same result as an uninterrupted run.
    if !job.resume {
        return Ok(fresh);
    }
    let (dir, saved) = match state::latest(&run.state_dir()) {
        Ok(found) => found,
        Err(state::StateError::Missing { .. }) => {
            reporter.line(&format!(
                "resuming {}: no snapshot was written yet, starting from the first epoch",
                run.id
            ));
            return Ok(fresh);
        }
        Err(e) => return Err(e.into()),
    };
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
    let model = state::load_module(fresh.model, &dir.join("model.bin"), device)?;
    let best = dir.join("best.bin");
    let best = match best.exists() {
        true => Some(state::load_module(model.clone(), &best, device)?),
        false => None,
    };
    let optim = dir.join("optim.bin");
    reporter.line(&format!(
        "resuming {} at stage {} epoch {} (step {})",
        run.id, saved.stage, saved.epoch, saved.global_step
    ));
    Ok(Restored {
        model,
        best,
        pending_optim: optim.exists().then_some(optim),
        progress: saved,
    })
}

/// The error of step `at` of `stage` ending with a non-finite loss.
fn diverged(at: StepAt, stage: &StageConfig, NonFiniteLoss(value): NonFiniteLoss) -> TrainError {
    TrainError::Diverged {
        stage: at.stage,
        name: stage.name.clone(),
        epoch: at.epoch + 1,
        step: at.stage_step,
        value,
    }
}

/// The loader's epoch label: distinct for every (stage, epoch).
fn epoch_label(stage: usize, epoch: usize) -> u64 {
    ((stage as u64) << 32) | epoch as u64
}
