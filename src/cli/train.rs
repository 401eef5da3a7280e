//! `kiln train CONFIG [--resume RUN_DIR]`.

use std::path::Path;

use std::sync::Mutex;
use std::time::Duration;

use super::{CliError, CliResult};
use crate::artifact::{Checkpoint, write_atomic};
use crate::config::{self, CpuBackend, DeviceKind, LoadedConfig, Loss, Precision};
use crate::data::dataset::sha256_hex;
use crate::observe::latency::{self, LatencyReport};
use crate::observe::registry::{NewRun, Registry, RunEnd};
use crate::run::RunDir;
use crate::train::state::EpochRecord;
use crate::train::trainer::{TrainHooks, mark};
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
    /// `key.path=value` overrides.
    pub set: &'a [String],
    /// Registry file (overrides `registry.path`).
    pub registry: Option<&'a Path>,
}

/// Records each epoch in the registry.
struct RegistryHooks {
    registry: Mutex<Registry>,
}

impl TrainHooks for RegistryHooks {
    fn on_epoch(&self, run: &RunDir, record: &EpochRecord) {
        if let Ok(reg) = self.registry.lock()
            && let Err(e) = reg.log_epoch(&run.id, record)
        {
            tracing::warn!("run registry: {e}");
        }
    }
}

/// The environment stored with each run.
pub fn environment(c: &crate::config::ExperimentConfig) -> serde_json::Value {
    let d = crate::observe::doctor::report();
    serde_json::json!({
        "kiln": d.kiln_version,
        "burn": d.burn_version,
        "rustc": d.rustc,
        "target": d.target,
        "cpu": d.cpu_model,
        "cores": d.logical_cores,
        "rayon_threads": d.rayon_threads,
        "thread_env": d.thread_env,
        "device": c.device,
        "backend": c.backend,
        "precision": c.precision,
        "features": d.features,
    })
}

/// Load a config and apply `--set` overrides; the returned text is the effective config.
pub fn load_with_overrides(path: &Path, set: &[String]) -> Result<LoadedConfig, CliError> {
    let mut loaded = config::load(path).map_err(CliError::input)?;
    if !set.is_empty() {
        let (c, text) =
            config::apply_overrides(&loaded.config, set, path).map_err(CliError::input)?;
        loaded.config = c;
        loaded.text = text;
    }
    Ok(loaded)
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
    let loaded = load_with_overrides(args.config, args.set)?;
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
    let registry_path = args
        .registry
        .map(Path::to_path_buf)
        .unwrap_or_else(|| loaded.config.registry_path());
    let registry = Registry::open(&registry_path)?;
    let reaped = registry.reap_stale()?;
    if reaped > 0 {
        tracing::warn!("run registry: marked {reaped} stale running run(s) as killed");
    }
    registry.start_run(&NewRun {
        id: &run.id,
        name: &loaded.config.name,
        run_dir: &run.path,
        config_text: &loaded.text,
        config_sha256: &sha256_hex(loaded.text.as_bytes()),
        started_at: &started_at,
        environment: environment(&loaded.config),
    })?;
    let hooks = RegistryHooks {
        registry: Mutex::new(registry),
    };
    let mlflow = crate::observe::mlflow::Mirror::from_env(&run, &loaded);
    let job = TrainJob {
        hooks: Some(&hooks),
        config: &loaded,
        run: run.clone(),
        resume: args.resume.is_some(),
        progress: args.progress,
        stop_after_epochs: None,
    };
    let result = dispatch(&job).and_then(|outcome| {
        let latency = measure_latency(&outcome, loaded.config.export.engine.as_deref())?;
        Ok((outcome, latency))
    });
    let registry = hooks
        .registry
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    match result {
        Ok((outcome, latency)) => {
            let end = run_end(&loaded.config, &outcome, latency.as_ref());
            registry.finish_run(&run.id, &end)?;
            if let Some(m) = &mlflow {
                m.finish(&registry.epochs(&run.id).unwrap_or_default(), &end);
            }
            mark(&run, "finished", None, &started_at)?;
            print_summary(&outcome, args.progress == ProgressMode::Quiet);
            if let Some(l) = &latency
                && args.progress != ProgressMode::Quiet
            {
                for b in &l.batches {
                    eprintln!(
                        "latency ({}, batch {}): p50 {:.2} µs, p95 {:.2} µs, p99 {:.2} µs",
                        l.engine, b.batch, b.p50_us, b.p95_us, b.p99_us
                    );
                }
            }
            Ok(())
        }
        Err(e) => {
            let reason = format!("{:#}", e.error);
            let end = RunEnd {
                status: "failed".into(),
                reason: Some(reason.clone()),
                ..RunEnd::default()
            };
            if let Err(re) = registry.finish_run(&run.id, &end) {
                tracing::warn!("run registry: {re}");
            }
            if let Some(m) = &mlflow {
                m.finish(&registry.epochs(&run.id).unwrap_or_default(), &end);
            }
            let _ = mark(&run, "failed", Some(reason), &started_at);
            Err(e)
        }
    }
}

/// Benchmark the exported model on its serving engine (`export.engine`, batch 1 and 128) and
/// store the result in its manifest.
fn measure_latency(
    outcome: &TrainOutcome,
    engine: Option<&str>,
) -> Result<Option<LatencyReport>, CliError> {
    let Some(dir) = &outcome.export_dir else {
        return Ok(None);
    };
    let ckpt = Checkpoint::load(dir)?;
    let report = latency::measure(
        &ckpt,
        engine.unwrap_or(latency::serving_engine()),
        &[1, 128],
        2000,
        Duration::from_millis(250),
    )?;
    let mut manifest = ckpt.manifest.clone();
    manifest.latency = Some(serde_json::to_value(&report)?);
    write_atomic(
        &dir.join(crate::artifact::MANIFEST_FILE),
        &serde_json::to_vec_pretty(&manifest)?,
    )?;
    Ok(Some(report))
}

/// The registry's end-of-run row.
fn run_end(
    c: &crate::config::ExperimentConfig,
    o: &TrainOutcome,
    latency: Option<&LatencyReport>,
) -> RunEnd {
    let val_metric = c
        .stages
        .iter()
        .position(|s| s.loss == Loss::Mse)
        .and_then(|i| o.stages.get(i))
        .map(|s| s.best_val_loss);
    RunEnd {
        status: "finished".into(),
        reason: None,
        dataset_sha256: o.manifest.as_ref().map(|m| m.dataset.sha256.clone()),
        param_count: Some(o.parameter_count as i64),
        artifact_path: o.export_dir.as_ref().map(|d| d.display().to_string()),
        final_metrics: o.manifest.as_ref().map(|m| m.metrics.clone()),
        val_metric,
        latency: latency.and_then(|l| serde_json::to_value(l).ok()),
        latency_b1_p50_us: latency.and_then(|l| l.p50(1)),
        latency_b128_p50_us: latency.and_then(|l| l.p50(128)),
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
