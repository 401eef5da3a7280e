//! `kiln train CONFIG [--resume RUN_DIR]`.

use std::path::Path;

use super::{CliError, CliResult};
use crate::artifact::write_atomic;
use crate::config::{self, CpuBackend, DeviceKind, LoadedConfig, Precision};
use crate::run::RunDir;
use crate::train::trainer::mark;
use crate::train::{ProgressMode, TrainError, TrainJob, TrainOutcome, train};
use crate::util;

/// Options of `kiln train`.
pub struct TrainArgs<'a> {
    /// The config file.
    pub config: &'a Path,
    /// Run directory to resume.
    pub resume: Option<&'a Path>,
    /// Progress display.
    pub progress: ProgressMode,
}

/// Run the training job on the backend the config selects.
pub fn dispatch(job: &TrainJob<'_>) -> Result<TrainOutcome, CliError> {
    let c = &job.config.config;
    let result: Result<TrainOutcome, TrainError> = match (c.device, c.backend, c.precision) {
        (DeviceKind::Cpu, CpuBackend::Flex, Precision::F32) => {
            train::<crate::backend::TrainCpu>(job, &Default::default()).map(|t| t.outcome)
        }
        (DeviceKind::Cpu, CpuBackend::Ndarray, Precision::F32) => {
            train::<crate::backend::TrainNdArray>(job, &Default::default()).map(|t| t.outcome)
        }
        #[cfg(feature = "cuda")]
        (DeviceKind::Cuda, _, precision) => {
            let device =
                crate::backend::cuda_probe().map_err(|e| CliError::from(anyhow::anyhow!(e)))?;
            match precision {
                Precision::F32 => {
                    train::<burn::backend::Autodiff<crate::backend::CudaF32>>(job, &device)
                        .map(|t| t.outcome)
                }
                Precision::Bf16 => {
                    train::<burn::backend::Autodiff<crate::backend::CudaBf16>>(job, &device)
                        .map(|t| t.outcome)
                }
            }
        }
        (device, backend, precision) => {
            return Err(CliError::input(anyhow::anyhow!(
                "unsupported combination device {device:?}, backend {backend:?}, precision {precision:?}"
            )));
        }
    };
    result.map_err(|e| match e {
        TrainError::Data(_) | TrainError::Resume { .. } => CliError::input(e),
        other => CliError::from(other),
    })
}

/// `kiln train`.
pub fn run(args: TrainArgs<'_>) -> CliResult {
    let loaded: LoadedConfig = config::load(args.config).map_err(CliError::input)?;
    let started_at = util::rfc3339(util::unix_now());
    let run = match args.resume {
        Some(dir) => {
            let run = RunDir::open(dir).map_err(CliError::input)?;
            if let Some(s) = run.read_status()
                && s.status == "finished"
            {
                return Err(CliError::input(anyhow::anyhow!(
                    "{} already finished; a finished run is never modified (start a new run)",
                    dir.display()
                )));
            }
            let saved = std::fs::read_to_string(run.config_file())?;
            if saved != loaded.text {
                return Err(CliError::input(anyhow::anyhow!(
                    "{} differs from the config {} was started with ({}); resume with the same config",
                    args.config.display(),
                    dir.display(),
                    run.config_file().display()
                )));
            }
            run
        }
        None => {
            let run = RunDir::create(&loaded.config.export.dir, &loaded.config.name)?;
            write_atomic(&run.config_file(), loaded.text.as_bytes())?;
            run
        }
    };
    mark(&run, "running", None, &started_at)?;
    let job = TrainJob {
        config: &loaded,
        run: run.clone(),
        resume: args.resume.is_some(),
        progress: args.progress,
        stop_after_epochs: None,
    };
    match dispatch(&job) {
        Ok(outcome) => {
            mark(&run, "finished", None, &started_at)?;
            print_summary(&outcome, args.progress == ProgressMode::Quiet);
            Ok(())
        }
        Err(e) => {
            let reason = format!("{:#}", e.error);
            let _ = mark(&run, "failed", Some(reason), &started_at);
            Err(e)
        }
    }
}

fn print_summary(o: &TrainOutcome, quiet: bool) {
    if let Some(d) = &o.export_dir {
        println!("{}", d.display());
    }
    if quiet {
        return;
    }
    for s in &o.stages {
        eprintln!(
            "stage {:<10} {:>3} epochs {:>7} steps  {:>9.0} samples/s  data wait {:>5.1}%  best val {:.5} (epoch {})",
            s.name,
            s.epochs,
            s.steps,
            s.samples_per_s,
            s.data_wait_frac * 100.0,
            s.best_val_loss,
            s.best_epoch
        );
    }
    if let Some(r) = &o.report {
        eprintln!(
            "beats persistence, training mean and constant variance on every target: {}",
            if r.beats_all() { "yes" } else { "NO" }
        );
    }
    eprintln!(
        "run {} finished in {:.1} s; {} parameters",
        o.run.id,
        o.wall.as_secs_f64(),
        o.parameter_count
    );
}
