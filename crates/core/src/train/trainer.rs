//! The training entry points: [`train`] on any autodiff backend, [`train_cpu`] on the default
//! CPU backend in a fresh run directory.

use burn::tensor::backend::AutodiffBackend;

use super::job::{TrainError, TrainJob, TrainOutcome, Trained, io_err};
use super::progress::ProgressMode;
use super::session::{Session, StageEnd};
use crate::config::LoadedConfig;
use crate::records::RunDir;

/// Train according to `job` on backend `B`: open the session (data, model, resume), run each
/// stage, then evaluate and export. The run directory's status and the observers of a whole
/// run belong to [`crate::run::TrainingRun`], which calls this.
pub fn train<B: AutodiffBackend>(
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
