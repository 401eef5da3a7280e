//! The training entry points: [`train`] on any autodiff backend, [`train_job_cpu`] and [`train_cpu`] on the default
//! CPU backend in a fresh run directory.

use std::path::Path;

use burn::tensor::backend::AutodiffBackend;

use super::evaluate::EvalReport;
use super::job::{StageSummary, TrainError, TrainJob, Trained, io_err};
use super::progress::ProgressMode;
use super::session::Session;
use crate::config::{LoadedConfig, Loss, NumericBins, Refit, RefitPass};
use crate::data::Dataset;
use crate::records::RunDir;
use crate::records::metrics::RefitProvenance;
use crate::records::metrics::{BinsCandidate, NumericBinsChoice};

/// Train according to `job` on backend `B`: open the session (data, model, resume), run each
/// stage, then evaluate and export. The data file is read once (or not at all when the job
/// carries the dataset), whatever the passes. The run directory's status and the observers of
/// a whole run belong to [`crate::run::TrainingRun`], which calls this.
pub fn train<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    device: &B::Device,
) -> Result<Trained<B>, TrainError> {
    let cfg = &job.config.config;
    let read;
    let data = match job.data {
        Some(d) => d,
        None => {
            read = Dataset::load(&cfg.data)?;
            &read
        }
    };
    if cfg.data.numeric_bins == NumericBins::Auto && cfg.numeric_bins_pass.is_none() {
        return train_choosing_bins::<B>(job, data, device);
    }
    if cfg.seed_spread > 1 && cfg.seed_spread_pass.is_none() {
        return train_with_seed_spread::<B>(job, data, device);
    }
    if cfg.refit == Refit::TrainValidation && cfg.refit_pass.is_none() {
        return train_with_refit::<B>(job, data, device);
    }
    train_pass::<B>(job, data, device)
}

/// `data.numeric_bins: auto` (see [`NumericBins`]): each candidate bin count trains the
/// config's stages up to the deciding one (its last `mse` stage, else its last), quietly,
/// unobserved and unmeasured, in `<run>/numeric-bins/bins-<n>/` (a finished one, its export
/// sealed, is not trained again on resume; the others resume); then the run itself trains
/// with the bins whose deciding stage reached the lower best validation loss, and records
/// the candidates in its manifest. `data` was read with the most bins; the no-bins candidate
/// drops them ([`Dataset::without_bins`]), so every candidate sees the same rows.
fn train_choosing_bins<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    data: &Dataset,
    device: &B::Device,
) -> Result<Trained<B>, TrainError> {
    let cfg = &job.config.config;
    let reporter = super::progress::Reporter::new(job.progress);
    let decide = cfg
        .stages
        .iter()
        .rposition(|s| s.loss == Loss::Mse)
        .unwrap_or(cfg.stages.len().saturating_sub(1));
    let stage = cfg
        .stages
        .get(decide)
        .map_or(String::new(), |s| s.name.clone());
    // No feature takes bins (all categorical, dates, or too few distinct values): both
    // candidates would be the same network, so there is nothing to choose (and no copy of
    // the rows without bins to make).
    let binnable = data.preprocessing.inputs.iter().any(|c| c.bins.is_some());
    let without = binnable.then(|| data.without_bins());
    let rows = |n: usize| match (n, &without) {
        (0, Some(w)) => w,
        _ => data,
    };
    let candidates_to_train = if binnable {
        NumericBins::AUTO_CANDIDATES.as_slice()
    } else {
        &[]
    };
    let count = NumericBins::AUTO_CANDIDATES.len();
    let mut candidates = Vec::with_capacity(count);
    for (i, &n) in candidates_to_train.iter().enumerate() {
        let mut loaded = job.config.clone();
        let c = &mut loaded.config;
        c.data.numeric_bins = NumericBins::Fixed(n);
        c.stages.truncate(decide + 1);
        c.seed_spread = 1;
        c.refit = Refit::None;
        c.calibration = None;
        let path = job.run.path.join("numeric-bins").join(format!("bins-{n}"));
        let announce = || {
            reporter.line(&format!(
                "numeric_bins auto: candidate {} of {count}, {}, through stage {stage}",
                i + 1,
                BinsCandidate::label(n)
            ))
        };
        let pass = inner_pass::<B>(
            job,
            &path,
            &loaded,
            ProgressMode::Quiet,
            rows(n),
            device,
            announce,
        )?;
        let (manifest, shown, trained_in) = match pass {
            InnerPass::Done {
                manifest,
                shown,
                trained_in,
                ..
            } => (manifest, shown, trained_in),
            // Interrupted (tests' stop_after_epochs): so is the run.
            InnerPass::Interrupted(t) => return Ok(*t),
        };
        let best = manifest.metrics.stages.get(decide);
        if let (Some(s), Some(wall)) = (best, trained_in) {
            reporter.line(&format!(
                "numeric_bins auto: candidate {} of {count}: best validation loss {:.5} (epoch {}) in {:.1} s",
                i + 1,
                s.best_val_loss,
                s.best_epoch,
                wall.as_secs_f64()
            ));
        }
        candidates.push(BinsCandidate {
            bins: n,
            validation_loss: best.map(|s| s.best_val_loss).filter(|v| v.is_finite()),
            run: shown,
        });
    }
    let choice = NumericBinsChoice::decide(stage, candidates);
    reporter.line(&choice.describe());
    let chosen = choice.chosen;
    // The run's stages through the deciding one are the chosen candidate's, step for step
    // (same config text, seed, rows and bins): it goes on from there instead of training
    // them a third time. Not under refit, whose passes train other rows.
    let mut resume = job.resume;
    if cfg.refit == Refit::None {
        let from = job
            .run
            .path
            .join("numeric-bins")
            .join(format!("bins-{chosen}"));
        match adopt(&job.run, &from)? {
            Adopted::Epochs(history) => {
                reporter.line(&format!(
                    "numeric_bins auto: the run goes on from candidate bins-{chosen} after stage {}",
                    choice.stage
                ));
                if let Some(h) = job.observer {
                    for r in &history {
                        h.on_epoch(&job.run, r);
                    }
                    for (si, s) in cfg.stages.iter().enumerate().take(decide + 1) {
                        h.on_stage_end(&job.run, si, &s.name);
                    }
                }
                resume = true;
            }
            Adopted::OwnState => resume = true,
            Adopted::Nothing => {}
        }
    }
    let mut loaded = job.config.clone();
    loaded.config.data.numeric_bins = NumericBins::Fixed(chosen);
    loaded.config.numeric_bins_pass = Some(choice);
    let main = TrainJob {
        config: &loaded,
        run: job.run.clone(),
        data: Some(rows(chosen)),
        resume,
        ..*job
    };
    train::<B>(&main, device)
}

/// What [`adopt`] did.
enum Adopted {
    /// The candidate's state is the run's now; its epochs.
    Epochs(Vec<crate::records::EpochRecord>),
    /// The run has a snapshot of its own (a resumed run that got past this point).
    OwnState,
    /// The candidate left no snapshot: the run trains from the start.
    Nothing,
}

/// Give `run` the finished candidate `from`'s state: its last snapshot (the end of its last
/// stage) and its step log, as if `run` had trained those stages itself; `run`'s own logs
/// are lined up with it when the session resumes. Nothing is copied when `run` has a snapshot
/// of its own already. The snapshot is copied under a temporary name and renamed, and
/// `LATEST` is written last, so a kill in between leaves `run` without a snapshot and the
/// next `--resume` copies again.
fn adopt(run: &RunDir, from: &Path) -> Result<Adopted, TrainError> {
    let state = run.state_dir();
    if super::state::latest(&state).is_ok() {
        return Ok(Adopted::OwnState);
    }
    let Ok((snap, progress)) = super::state::latest(&from.join("state")) else {
        return Ok(Adopted::Nothing);
    };
    let name = snap
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let copy = |src: &Path, dst: &Path| -> Result<(), TrainError> {
        let tmp = dst.with_file_name(format!(
            ".{}.adopt",
            dst.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        ));
        std::fs::copy(src, &tmp).map_err(io_err(src))?;
        std::fs::rename(&tmp, dst).map_err(io_err(dst))
    };
    copy(&from.join("steps.csv"), &run.steps_file())?;
    let tmp = state.join(format!(".{name}.adopt"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    for f in std::fs::read_dir(&snap).map_err(io_err(&snap))? {
        let f = f.map_err(io_err(&snap))?.path();
        if let Some(n) = f.file_name() {
            std::fs::copy(&f, tmp.join(n)).map_err(io_err(&f))?;
        }
    }
    let dst = state.join(&name);
    if dst.exists() {
        std::fs::remove_dir_all(&dst).map_err(io_err(&dst))?;
    }
    std::fs::rename(&tmp, &dst).map_err(io_err(&dst))?;
    crate::util::fault::point("during-adopt");
    crate::util::write_atomic(&state.join("LATEST"), name.as_bytes())?;
    Ok(Adopted::Epochs(progress.history))
}

/// `seed_spread: K`: the config under seeds `seed + 1 … seed + K − 1` first, each an ordinary
/// run (refit included) in `<run>/seeds/seed-<s>/`, quietly, unobserved and unmeasured (a
/// finished one, its export sealed, is not trained again on resume); then the run itself
/// under its own seed, which records every seed's test MSE in its manifest. All passes train
/// on `data`, so they see the same rows and the same split.
fn train_with_seed_spread<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    data: &Dataset,
    device: &B::Device,
) -> Result<Trained<B>, TrainError> {
    let cfg = &job.config.config;
    let reporter = super::progress::Reporter::new(job.progress);
    let mut others = Vec::with_capacity(cfg.seed_spread - 1);
    for i in 1..cfg.seed_spread {
        let seed = cfg.seed.wrapping_add(i as u64);
        let path = job.run.path.join("seeds").join(format!("seed-{seed}"));
        let mut loaded = job.config.clone();
        loaded.config.seed = seed;
        loaded.config.seed_spread = 1;
        let announce = || {
            reporter.line(&format!(
                "seed spread: seed {seed} ({i} of {} more), trained only to measure",
                cfg.seed_spread - 1
            ))
        };
        match inner_pass::<B>(
            job,
            &path,
            &loaded,
            ProgressMode::Quiet,
            data,
            device,
            announce,
        )? {
            InnerPass::Done {
                manifest, shown, ..
            } => {
                let mse = manifest.metrics.test_mse().into_iter().map(|(_, v)| v);
                others.push((seed, shown, mse.collect()));
            }
            // Interrupted (tests' stop_after_epochs): so is the run.
            InnerPass::Interrupted(t) => return Ok(*t),
        }
    }
    let mut loaded = job.config.clone();
    loaded.config.seed_spread_pass = Some(crate::config::SeedSpreadPass { others });
    let main = TrainJob {
        config: &loaded,
        run: job.run.clone(),
        data: Some(data),
        ..*job
    };
    train::<B>(&main, device)
}

/// One training pass (the whole run without refit; either pass of a refit run).
fn train_pass<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    data: &Dataset,
    device: &B::Device,
) -> Result<Trained<B>, TrainError> {
    Session::<B>::open(job, data, device)?.run()
}

/// `refit: train+validation`: the selection pass in `<run>/selection/` (an ordinary run of
/// the same config; resumed when the run is), then the refit pass in the run directory on
/// train + validation for the selection pass's best epochs per stage (see
/// [`crate::config::Refit`]). Both passes train on `data`.
fn train_with_refit<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    data: &Dataset,
    device: &B::Device,
) -> Result<Trained<B>, TrainError> {
    // The selection pass: an ordinary run of the same config in `<run>/selection/`; its
    // export is not what the run delivers, so it is not measured.
    let mut sel_loaded = job.config.clone();
    sel_loaded.config.refit = Refit::None;
    let sel_path = job.run.path.join("selection");
    let (sel_run, manifest) = match inner_pass::<B>(
        job,
        &sel_path,
        &sel_loaded,
        job.progress,
        data,
        device,
        || {},
    )? {
        InnerPass::Done { run, manifest, .. } => (run, manifest),
        // Interrupted (tests' stop_after_epochs): so is the run.
        InnerPass::Interrupted(t) => return Ok(*t),
    };
    let (stages, test) = (manifest.metrics.stages, manifest.metrics.test);
    let refit_loaded = refit_config(job, &sel_run, stages, test);
    let refit_job = TrainJob {
        observer: job.observer,
        teacher: job.teacher,
        config: &refit_loaded,
        run: job.run.clone(),
        resume: job.resume,
        progress: job.progress,
        stop_after_epochs: job.stop_after_epochs,
        data: Some(data),
        measure: job.measure,
    };
    train_pass::<B>(&refit_job, data, device)
}

/// A pass's own run directory `path` inside the run (`<run>/selection`, `<run>/seeds/seed-<s>`),
/// id `<run id>-<name>`: opened when an earlier process began it (its `config.yaml` is there),
/// else created with the run's config. Returns it and whether it resumes.
fn inner_run(job: &TrainJob<'_>, path: &Path, name: &str) -> Result<(RunDir, bool), TrainError> {
    if path.join("config.yaml").is_file() {
        return Ok((RunDir::open(path).map_err(io_err(path))?, true));
    }
    std::fs::create_dir_all(path).map_err(io_err(path))?;
    crate::util::write_atomic(&path.join("config.yaml"), job.config.text.as_bytes())?;
    Ok((
        RunDir {
            id: format!("{}-{name}", job.run.id),
            path: path.to_path_buf(),
        },
        false,
    ))
}

/// How an inner pass ended (see [`inner_pass`]).
enum InnerPass<B: AutodiffBackend> {
    /// Its export is sealed, now or by an earlier process.
    Done {
        /// Its run directory.
        run: RunDir,
        /// That directory, absolute (recorded: a manifest is read from anywhere).
        shown: String,
        /// Its export's manifest.
        manifest: Box<crate::artifact::Manifest>,
        /// How long it trained in this process (`None`: it was finished already).
        trained_in: Option<std::time::Duration>,
    },
    /// It was stopped before its end (tests' `stop_after_epochs`): so is the run.
    Interrupted(Box<Trained<B>>),
}

/// One inner pass of a run — a `seed_spread` seed, a `numeric_bins: auto` candidate, refit's
/// selection pass: `loaded` trained on `data` in its own run directory `path` (opened or
/// created by [`inner_run`]), unobserved and unmeasured, with the run's teacher and
/// interruption. A finished one (its export sealed) is read back, not trained again; an
/// unfinished one resumes. `announce` runs just before training starts.
fn inner_pass<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    path: &Path,
    loaded: &LoadedConfig,
    progress: ProgressMode,
    data: &Dataset,
    device: &B::Device,
    announce: impl FnOnce(),
) -> Result<InnerPass<B>, TrainError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (run, resume) = inner_run(job, path, &name)?;
    let shown = std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string();
    if resume && let Ok(c) = crate::artifact::Checkpoint::load(&run.export_dir()) {
        return Ok(InnerPass::Done {
            run,
            shown,
            manifest: Box::new(c.manifest),
            trained_in: None,
        });
    }
    announce();
    let inner = TrainJob {
        observer: None,
        teacher: job.teacher,
        config: loaded,
        run: run.clone(),
        resume,
        progress,
        stop_after_epochs: job.stop_after_epochs,
        data: Some(data),
        measure: None,
    };
    let mut t = train::<B>(&inner, device)?;
    match t.outcome.manifest.take() {
        Some(manifest) => Ok(InnerPass::Done {
            run,
            shown,
            manifest: Box::new(manifest),
            trained_in: Some(t.outcome.wall),
        }),
        None => Ok(InnerPass::Interrupted(Box::new(t))),
    }
}

/// The refit pass's config: `job`'s, each stage trained for the selection pass's best epoch
/// count without early stopping, on train + validation, with the selection's provenance.
fn refit_config(
    job: &TrainJob<'_>,
    sel_run: &RunDir,
    stages: Vec<StageSummary>,
    test: Option<EvalReport>,
) -> LoadedConfig {
    let epochs: Vec<usize> = job
        .config
        .config
        .stages
        .iter()
        .enumerate()
        .map(|(i, st)| {
            stages
                .get(i)
                .map(|s| {
                    if s.best_epoch > 0 {
                        s.best_epoch
                    } else {
                        s.epochs
                    }
                })
                .unwrap_or(st.epochs)
                .max(1)
        })
        .collect();
    let mut refit_loaded = job.config.clone();
    let c = &mut refit_loaded.config;
    c.refit = Refit::None;
    for (st, &e) in c.stages.iter_mut().zip(&epochs) {
        st.epochs = e;
        st.early_stopping = None;
    }
    let names: Vec<String> = c.stages.iter().map(|s| s.name.clone()).collect();
    super::progress::Reporter::new(job.progress).line(&format!(
        "refit on train + validation: {}",
        names
            .iter()
            .zip(&epochs)
            .map(|(n, e)| format!("{n} {e} epochs"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    c.refit_pass = Some(RefitPass {
        provenance: RefitProvenance {
            trained_on: "train+validation".into(),
            selection_run: sel_run.path.display().to_string(),
            epochs,
            selection_stages: stages,
            selection_test: test,
        },
    });
    refit_loaded
}

/// [`train`] on the default CPU backend (flex), not generic: a caller outside kiln-core (the
/// binary, the integration tests, benchmarks) links the one copy of the training stack compiled
/// here instead of instantiating it again in its own crate.
pub fn train_job_cpu(job: &TrainJob<'_>) -> Result<Trained<crate::backend::TrainCpu>, TrainError> {
    train::<crate::backend::TrainCpu>(job, &Default::default())
}

/// Train `loaded` on the default CPU backend (flex) in a fresh run directory under `root`,
/// quietly and without observers: the embedding entry point used by tests and benchmarks.
pub fn train_cpu(
    loaded: &LoadedConfig,
    root: &std::path::Path,
) -> Result<Trained<crate::backend::TrainCpu>, TrainError> {
    let run = RunDir::create(root, &loaded.config.name).map_err(io_err(root))?;
    let cfg = run.config_file();
    crate::util::write_atomic(&cfg, loaded.text.as_bytes())?;
    let job = TrainJob {
        observer: None,
        teacher: None,
        config: loaded,
        run,
        resume: false,
        progress: ProgressMode::Quiet,
        stop_after_epochs: None,
        data: None,
        measure: None,
    };
    train_job_cpu(&job)
}
