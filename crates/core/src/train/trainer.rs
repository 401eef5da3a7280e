//! The training entry points: [`train`] on any autodiff backend, [`train_cpu`] on the default
//! CPU backend in a fresh run directory.

use burn::tensor::backend::AutodiffBackend;

use super::job::{TrainError, TrainJob, TrainOutcome, Trained, io_err};
use super::progress::ProgressMode;
use super::session::{Session, StageEnd};
use crate::config::{LoadedConfig, Refit, RefitPass};
use crate::records::RunDir;
use crate::records::metrics::RefitProvenance;

/// Train according to `job` on backend `B`: open the session (data, model, resume), run each
/// stage, then evaluate and export. The run directory's status and the observers of a whole
/// run belong to [`crate::run::TrainingRun`], which calls this.
pub fn train<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    device: &B::Device,
) -> Result<Trained<B>, TrainError> {
    let cfg = &job.config.config;
    if cfg.refit == Refit::TrainValidation && cfg.refit_pass.is_none() {
        return train_with_refit::<B>(job, device);
    }
    train_pass::<B>(job, device)
}

/// One training pass (the whole run without refit; either pass of a refit run).
fn train_pass<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    device: &B::Device,
) -> Result<Trained<B>, TrainError> {
    let mut session = Session::<B>::open(job, device)?;
    while session.progress.stage < job.config.config.stages.len() {
        if let StageEnd::Stopped = session.run_stage()? {
            return Ok(Trained {
                outcome: TrainOutcome {
                    run: job.run.clone(),
                    export_dir: None,
                    report: None,
                    stages: Vec::new(),
                    parameter_count: session.prep.arch.num_params(),
                    manifest: None,
                    wall: session.started.elapsed(),
                    verdict: None,
                },
                model: None,
            });
        }
    }
    session.finish()
}

/// `refit: train+validation`: the selection pass in `<run>/selection/` (an ordinary run of
/// the same config; resumed when the run is), then the refit pass in the run directory on
/// train + validation for the selection pass's best epochs per stage (see
/// [`crate::config::Refit`]).
fn train_with_refit<B: AutodiffBackend>(
    job: &TrainJob<'_>,
    device: &B::Device,
) -> Result<Trained<B>, TrainError> {
    let sel_path = job.run.path.join("selection");
    let mut sel_loaded = job.config.clone();
    sel_loaded.config.refit = Refit::None;
    let resume_sel = sel_path.join("config.yaml").is_file();
    let sel_run = if resume_sel {
        RunDir::open(&sel_path).map_err(io_err(&sel_path))?
    } else {
        std::fs::create_dir_all(&sel_path).map_err(io_err(&sel_path))?;
        crate::util::write_atomic(&sel_path.join("config.yaml"), job.config.text.as_bytes())?;
        RunDir {
            id: format!("{}-selection", job.run.id),
            path: sel_path.clone(),
        }
    };
    let sel_export = sel_run.export_dir();
    // A finished selection pass (its export is sealed) is not run again on resume.
    let (stages, test) = match crate::artifact::Checkpoint::load(&sel_export) {
        Ok(c) if resume_sel => (c.manifest.metrics.stages, c.manifest.metrics.test),
        _ => {
            let sel_job = TrainJob {
                observer: None,
                teacher: job.teacher,
                config: &sel_loaded,
                run: sel_run.clone(),
                resume: resume_sel,
                progress: job.progress,
                stop_after_epochs: job.stop_after_epochs,
            };
            let sel = train_pass::<B>(&sel_job, device)?;
            if sel.outcome.export_dir.is_none() {
                // Interrupted (tests' stop_after_epochs): so is the run.
                return Ok(sel);
            }
            let test = sel.outcome.manifest.and_then(|m| m.metrics.test);
            (sel.outcome.stages, test)
        }
    };
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
    c.refit_pass = Some(RefitPass {
        provenance: RefitProvenance {
            trained_on: "train+validation".into(),
            selection_run: sel_run.path.display().to_string(),
            epochs: epochs.clone(),
            selection_stages: stages,
            selection_test: test,
        },
    });
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
    let refit_job = TrainJob {
        observer: job.observer,
        teacher: job.teacher,
        config: &refit_loaded,
        run: job.run.clone(),
        resume: job.resume,
        progress: job.progress,
        stop_after_epochs: job.stop_after_epochs,
    };
    train_pass::<B>(&refit_job, device)
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
    };
    train::<crate::backend::TrainCpu>(&job, &Default::default())
}
