//! Inference latency measured at the end of every training run, on the serving path (the
//! checkpoint's normalisation around the serving engine), with fixed seeded inputs after
//! warm-up — so runs can be compared with each other and regressions caught across runs.

use std::time::{Duration, Instant};

use crate::artifact::{Checkpoint, HostWeights};
use crate::infer::{InferError, build_engine};
use crate::predict::{Prediction, Predictor};
use crate::records::EngineKind;
use crate::rng::SplitMix64;
use crate::stats::ColumnStats;
use crate::util::percentile;

pub use crate::records::metrics::{BatchLatency, LatencyReport};

/// The engine the serving tier uses by default: `auto` (the fastest exact CPU engine, see
/// `crate::infer::auto`).
pub fn serving_engine() -> EngineKind {
    EngineKind::Auto
}

/// Measure `ckpt` on `engine` at each batch size: `warmup` untimed calls, then timed calls
/// until both `min_iters` calls and `min_time` have passed.
pub fn measure(
    ckpt: &Checkpoint,
    engine: EngineKind,
    batches: &[usize],
    min_iters: usize,
    min_time: Duration,
) -> Result<LatencyReport, InferError> {
    let m = &ckpt.manifest;
    measure_model(
        &ckpt.weights,
        &m.features,
        &m.targets,
        engine,
        batches,
        min_iters,
        min_time,
    )
}

/// [`measure`] for a model not (yet) exported: its weights and its features' and targets'
/// normalisation, as its manifest will hold them (a training run measures before its export).
pub fn measure_model(
    weights: &HostWeights,
    feats: &[ColumnStats],
    targets: &[ColumnStats],
    engine: EngineKind,
    batches: &[usize],
    min_iters: usize,
    min_time: Duration,
) -> Result<LatencyReport, InferError> {
    let mut predictor = Predictor::new(build_engine(engine, weights, 1)?, feats, targets);
    let mut out = Prediction {
        mean: Vec::new(),
        std: Vec::new(),
    };
    let mut results = Vec::new();
    for &batch in batches {
        let mut r = SplitMix64::derive(0x1a7e, &[batch as u64]);
        let x: Vec<f32> = (0..batch)
            .flat_map(|_| {
                feats
                    .iter()
                    .map(|f| (f.mean + f.std * r.normal()) as f32)
                    .collect::<Vec<_>>()
            })
            .collect();
        for _ in 0..(min_iters / 4).max(20) {
            predictor.predict_into(&x, batch, &mut out)?;
        }
        crate::util::fault::point("during-latency");
        let mut times = Vec::with_capacity(min_iters);
        let start = Instant::now();
        while times.len() < min_iters || start.elapsed() < min_time {
            let t = Instant::now();
            predictor.predict_into(&x, batch, &mut out)?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
            if times.len() >= 2_000_000 {
                break;
            }
        }
        times.sort_by(f64::total_cmp);
        results.push(BatchLatency {
            batch,
            iters: times.len(),
            p50_us: percentile(&times, 0.50),
            p95_us: percentile(&times, 0.95),
            p99_us: percentile(&times, 0.99),
        });
    }
    Ok(LatencyReport {
        engine: engine.to_string(),
        cpu: Some(kiln_base::simd::Isa::detect().name().to_string()),
        batches: results,
    })
}
