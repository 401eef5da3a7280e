//! `kiln profile infer`, `kiln profile diff`, `kiln doctor`.

use std::path::{Path, PathBuf};

use super::{CliError, CliResult};
use crate::artifact::{Checkpoint, HostWeights};
use crate::data::ColumnStats;
use crate::infer::build_engine;
use crate::model::RegressionNetConfig;
use crate::observe::profiler::{self, KeyAverages, Options, ProfileOutputs, SortBy, StepProfiler};
use crate::observe::schedule::Schedule;
use crate::predict::{Prediction, Predictor};
use crate::rng::SplitMix64;

/// Options of `kiln profile infer`.
#[derive(Debug, Clone)]
pub struct ProfileInferArgs {
    /// Checkpoint (export or run directory); `None` = the reference network.
    pub checkpoint: Option<PathBuf>,
    /// Engine name.
    pub engine: String,
    /// Rows per call.
    pub batch: usize,
    /// Recorded iterations.
    pub iters: u64,
    /// Unrecorded warm-up iterations.
    pub warmup: u64,
    /// Threads for the engine (0 = its default).
    pub threads: usize,
    /// Output directory.
    pub out: PathBuf,
    /// Seed of the fixed inputs.
    pub seed: u64,
    /// Record shapes.
    pub record_shapes: bool,
    /// Record RSS deltas.
    pub profile_memory: bool,
    /// Record source locations.
    pub with_stack: bool,
}

/// Weights and normalisation of the network to profile.
pub fn network(
    checkpoint: Option<&Path>,
) -> Result<(HostWeights, Vec<ColumnStats>, Vec<ColumnStats>), CliError> {
    match checkpoint {
        Some(dir) => {
            let c = Checkpoint::load(dir).map_err(CliError::input)?;
            Ok((c.weights, c.manifest.features, c.manifest.targets))
        }
        None => {
            let arch = RegressionNetConfig::reference();
            let model = arch.init::<crate::backend::Cpu>(0, &Default::default());
            let unit = |p: &str, n: usize| -> Vec<ColumnStats> {
                (0..n)
                    .map(|i| ColumnStats {
                        name: format!("{p}{i}"),
                        mean: 0.0,
                        std: 1.0,
                    })
                    .collect()
            };
            Ok((
                HostWeights::from_model(&model),
                unit("f", arch.n_features),
                unit("y", arch.n_targets),
            ))
        }
    }
}

/// Fixed, seeded raw inputs drawn around the features' training means.
pub fn seeded_inputs(features: &[ColumnStats], rows: usize, seed: u64) -> Vec<f32> {
    let mut r = SplitMix64::derive(seed, &[0x1_4e_f0]);
    let mut x = Vec::with_capacity(rows * features.len());
    for _ in 0..rows {
        for f in features {
            x.push((f.mean + f.std * r.normal()) as f32);
        }
    }
    x
}

/// Profile inference on identical inputs and write the trace and table.
pub fn profile_infer_to(args: &ProfileInferArgs) -> Result<ProfileOutputs, CliError> {
    if args.batch == 0 || args.iters == 0 {
        return Err(CliError::input(anyhow::anyhow!(
            "--batch and --iters must be ≥ 1"
        )));
    }
    let (weights, features, targets) = network(args.checkpoint.as_deref())?;
    let engine = build_engine(&args.engine, &weights, args.threads).map_err(CliError::input)?;
    let mut predictor = Predictor::new(engine, &features, &targets);
    let x = seeded_inputs(&features, args.batch, args.seed);
    let mut out = Prediction {
        mean: Vec::new(),
        std: Vec::new(),
    };
    let mut prof = StepProfiler::new(
        Schedule {
            wait: 0,
            warmup: args.warmup,
            active: args.iters,
            repeat: 1,
        },
        Options {
            record_shapes: args.record_shapes,
            profile_memory: args.profile_memory,
            with_stack: args.with_stack,
        },
        args.out.clone(),
        "infer_step",
    );
    let total = args.warmup + args.iters;
    for it in 0..=total {
        if let Some(o) = prof.on_step(it)? {
            return Ok(o);
        }
        let _s = crate::prof_span!("infer_step", shape = ?[args.batch, features.len()]).entered();
        predictor.predict_into(&x, args.batch, &mut out)?;
    }
    prof.finish()?
        .ok_or_else(|| CliError::from(anyhow::anyhow!("nothing was recorded")))
}

/// `kiln profile infer`.
pub fn profile_infer(args: &ProfileInferArgs) -> CliResult {
    let o = profile_infer_to(args)?;
    eprint!("{}", o.averages.table(SortBy::Total, 30));
    println!("{}", o.table_json.display());
    eprintln!(
        "trace: {} (open in https://ui.perfetto.dev or chrome://tracing)",
        o.trace.display()
    );
    Ok(())
}

fn table_path(p: &Path) -> PathBuf {
    if p.is_dir() {
        p.join("key_averages.json")
    } else {
        p.to_path_buf()
    }
}

/// `kiln profile diff A B`.
pub fn profile_diff(a: &Path, b: &Path, json: bool) -> CliResult {
    let ta = KeyAverages::load(&table_path(a)).map_err(|e| CliError::input(anyhow::anyhow!(e)))?;
    let tb = KeyAverages::load(&table_path(b)).map_err(|e| CliError::input(anyhow::anyhow!(e)))?;
    let rows = profiler::diff(&ta, &tb);
    if json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
        println!(
            "A = {} ({} steps, {:.2} µs/step)   B = {} ({} steps, {:.2} µs/step)",
            a.display(),
            ta.steps,
            ta.step_total_us / ta.steps.max(1) as f64,
            b.display(),
            tb.steps,
            tb.step_total_us / tb.steps.max(1) as f64
        );
        print!("{}", profiler::diff_table(&rows));
    }
    Ok(())
}

/// `kiln doctor`.
pub fn doctor(json: bool) -> CliResult {
    let r = crate::observe::doctor::report();
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.text());
    }
    Ok(())
}
