//! `kiln train CONFIG [--resume RUN_DIR]`: parse, build a [`kiln::run::TrainingRun`], attach
//! the observers the flags ask for, print the summary.

use std::path::Path;

use super::{CliError, CliResult};
use kiln::config::{self, LoadedConfig};
use kiln::run::{RunError, RunOptions, RunSummary, TrainingRun};
use kiln::track::RegistryObserver;
use kiln::track::registry::Registry;
use kiln::train::ProgressMode;

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

/// Load a config and apply `--set` overrides; the returned text is the effective config.
pub fn load_with_overrides(path: &Path, set: &[String]) -> Result<LoadedConfig, CliError> {
    config::load_with_overrides(path, set).map_err(CliError::input)
}

fn run_error(e: RunError) -> CliError {
    if e.is_input() {
        CliError::input(e)
    } else {
        CliError::from(e)
    }
}

/// `kiln train`.
pub fn run(args: TrainArgs<'_>) -> CliResult {
    let loaded = load_with_overrides(args.config, args.set)?;
    // The same data check as `kiln config check`, before any run directory or registry row
    // exists: a missing column, a wrong kind or an empty split leaves nothing behind. The run
    // trains on this dataset: the file is read once.
    let data = kiln::data::Dataset::load(&loaded.config.data).map_err(CliError::input)?;
    // The registry opens before the run directory exists, so a registry that cannot be opened
    // leaves no run behind that claims to be running.
    let registry_path = args
        .registry
        .map(Path::to_path_buf)
        .unwrap_or_else(|| loaded.config.registry_path());
    let registry = Registry::open(&registry_path)?;
    let options = RunOptions {
        resume: args.resume.map(Path::to_path_buf),
        progress: args.progress,
        ..RunOptions::default()
    };
    let mut run = TrainingRun::new(loaded, options).map_err(run_error)?;
    run.with_data(data);
    run.observe(Box::new(RegistryObserver::new(registry)));
    if let Some(mirror) = kiln::track::MlflowObserver::from_env(run.config()) {
        run.observe(Box::new(mirror));
    }
    let summary = run.execute().map_err(run_error)?;
    print_summary(&summary, args.progress == ProgressMode::Quiet);
    Ok(())
}

fn print_summary(s: &RunSummary, quiet: bool) {
    let o = &s.outcome;
    if let Some(d) = &o.export_dir {
        // Absolute: a nightly script hands it to `kiln promote` or `kiln serve` from another
        // working directory.
        println!("{}", super::printed(d).display());
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
        eprintln!("{}", r.verdict());
    }
    if let Some(spread) = o
        .manifest
        .as_ref()
        .and_then(|m| m.metrics.seed_spread.as_ref())
    {
        eprintln!("{}", spread.describe());
    }
    // Pick lines only where picks mean something: a target with a persistence feature
    // (`<target>_l1`, the line a pick is over). Ordinary tables keep the evaluation in the
    // manifest but print none of it.
    let pick_lines = o.manifest.as_ref().is_some_and(|m| {
        let features = m.feature_names();
        m.target_names()
            .iter()
            .any(|t| features.contains(&format!("{t}_l1")))
    });
    if let Some(pe) = o
        .manifest
        .as_ref()
        .filter(|_| pick_lines)
        .and_then(|m| m.metrics.pick_evaluation.as_ref())
    {
        for k in &pe.kinds {
            let ind = k
                .independence
                .as_ref()
                .map(|i| format!(", independence {:.5}", i.brier))
                .unwrap_or_default();
            eprintln!(
                "picks vs test outcomes, {} ({}): Brier {:.5} (constant {:.5}{ind}), log loss {:.5} (constant {:.5})",
                k.kind,
                k.model.n,
                k.model.brier,
                k.constant.brier,
                k.model.log_loss,
                k.constant.log_loss,
            );
            if let Some(v) = k.correlation_verdict() {
                eprintln!("picks vs test outcomes, {}: {v}", k.kind);
            }
        }
    }
    eprintln!(
        "run {} finished in {:.1} s; {} parameters",
        o.run.id,
        o.wall.as_secs_f64(),
        o.parameter_count
    );
    if let Some(l) = &s.latency {
        for b in &l.batches {
            eprintln!(
                "latency ({}, batch {}): p50 {:.2} µs, p95 {:.2} µs, p99 {:.2} µs",
                l.engine, b.batch, b.p50_us, b.p95_us, b.p99_us
            );
        }
    }
}
