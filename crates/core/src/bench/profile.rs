//! `kiln profile infer`: inference profiled on fixed, seeded inputs with the same scheduled
//! profiler as training, writing a Chrome trace and a key-averages table.

use std::path::{Path, PathBuf};

use super::BenchError;
use crate::artifact::{Checkpoint, HostWeights};
use crate::data::ColumnStats;
use crate::infer::build_engine;
use crate::model::RegressionNetConfig;
use crate::observe::profiler::{Options, ProfileOutputs, StepProfiler};
use crate::observe::schedule::Schedule;
use crate::predict::{Prediction, Predictor};
use crate::rng::SplitMix64;

/// Options of `kiln profile infer`.
#[derive(Debug, Clone)]
pub struct ProfileInferOptions {
    /// Checkpoint (export or run directory); `None` = the reference network.
    pub checkpoint: Option<PathBuf>,
    /// The engine.
    pub engine: crate::records::EngineKind,
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
) -> Result<(HostWeights, Vec<ColumnStats>, Vec<ColumnStats>), BenchError> {
    match checkpoint {
        Some(dir) => {
            let c = Checkpoint::load(dir)?;
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
                        transform: Default::default(),
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
pub fn profile_infer(args: &ProfileInferOptions) -> Result<ProfileOutputs, BenchError> {
    if args.batch == 0 || args.iters == 0 {
        return Err(BenchError::Invalid(format!(
            "batch and iters must be ≥ 1, got batch {} and iters {}",
            args.batch, args.iters
        )));
    }
    let (weights, features, targets) = network(args.checkpoint.as_deref())?;
    let engine = build_engine(args.engine, &weights, args.threads)?;
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
        if let Some(o) = prof.on_step(it).map_err(|source| BenchError::Io {
            path: args.out.clone(),
            source,
        })? {
            return Ok(o);
        }
        let _s = crate::prof_span!("infer_step", shape = ?[args.batch, features.len()]).entered();
        predictor.predict_into(&x, args.batch, &mut out)?;
    }
    prof.finish()
        .map_err(|source| BenchError::Io {
            path: args.out.clone(),
            source,
        })?
        .ok_or_else(|| BenchError::Invalid("the profiler recorded nothing".into()))
}
