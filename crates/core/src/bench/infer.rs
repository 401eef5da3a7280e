//! Inference latency and throughput, measured in-process per call.
//!
//! Method (the same in `benches/pytorch_reference.py`): one engine instance per setting,
//! seeded N(0, 1) inputs built once, warm-up calls first (the engine's `warm_up` plus
//! [`InferBenchOptions::warmup`] of timed-but-discarded calls), then samples until both
//! [`InferBenchOptions::min_time`] and [`InferBenchOptions::min_samples`] are reached. A
//! sample is the wall time of one call measured with [`Instant`]; calls shorter than
//! [`GROUP_TARGET`] are timed in groups (the group's mean is one sample) so the clock's own
//! cost (~20 ns) stays below 1 %. The settings of one run are measured in
//! [`InferBenchOptions::rounds`] interleaved rounds so that a change of machine load during
//! the run affects every engine alike. Reported: p50 and p99 of the samples, `rows_per_s =
//! batch / p50`, the achieved GFLOP/s for the model's FLOP per row, and `floor_frac`: the
//! arithmetic floor (FLOP per row × batch at the core's measured peak FLOP rate, see
//! [`peak_gflops`]) divided by p50.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::BenchError;
use crate::artifact::HostWeights;
use crate::infer::{Engine, FusedEngine, HeadOutput, Int8Engine, Isa, build_engine};
use crate::rng::SplitMix64;
use crate::util::percentile;

/// Calls shorter than this are timed in groups.
pub const GROUP_TARGET: Duration = Duration::from_micros(5);

/// What to measure and for how long.
#[derive(Debug, Clone)]
pub struct InferBenchOptions {
    /// Rows per call.
    pub batches: Vec<usize>,
    /// Threads per call (passed to `build_engine`; 0 = the engine's default).
    pub threads: usize,
    /// Minimum measured time per setting (split over the rounds).
    pub min_time: Duration,
    /// Minimum samples per setting.
    pub min_samples: usize,
    /// Timed-but-discarded calls before measuring, per round.
    pub warmup: Duration,
    /// Interleaved rounds over all settings.
    pub rounds: usize,
    /// Seed of the inputs.
    pub seed: u64,
}

impl Default for InferBenchOptions {
    fn default() -> Self {
        Self {
            batches: vec![1, 32, 1024],
            threads: 1,
            min_time: Duration::from_millis(1500),
            min_samples: 300,
            warmup: Duration::from_millis(50),
            rounds: 3,
            seed: 7,
        }
    }
}

/// One setting's result: a JSON line of `kiln bench infer --json`.
#[derive(Debug, Clone, Serialize)]
pub struct InferResult {
    /// Always `infer`.
    pub bench: &'static str,
    /// The engine's label: its name, or `fused@ISA` / `int8@ISA` for one forced onto an
    /// instruction-set path (text, not an `EngineKind`: the suffix is part of it).
    pub engine: String,
    /// Rows per call.
    pub batch: usize,
    /// Threads per call.
    pub threads: usize,
    /// Median µs per call.
    pub p50_us: f64,
    /// 99th percentile µs per call (of samples; see the module doc for grouped calls).
    pub p99_us: f64,
    /// Mean µs per call.
    pub mean_us: f64,
    /// `batch / p50`.
    pub rows_per_s: f64,
    /// Achieved GFLOP/s at p50 (`flop_per_row × batch / p50`).
    pub gflops: f64,
    /// Arithmetic floor over p50: the share of the measured peak f32 FMA rate of `threads`
    /// cores reached. Integer engines are measured against the same f32 peak, so they can
    /// exceed 1 (AVX-512 VNNI does four times the multiply-adds of f32 FMA per instruction).
    pub floor_frac: f64,
    /// FLOP per row of the network (7,104 for the reference network).
    pub flop_per_row: usize,
    /// The peak the floor is computed from (GFLOP/s of one core, measured in this process).
    pub peak_gflops: f64,
    /// Samples taken.
    pub samples: usize,
    /// Calls per sample (1 unless calls are shorter than 5 µs).
    pub calls_per_sample: usize,
    /// `p50(burn) / p50(this)` when `burn` ran in the same invocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speedup_vs_burn: Option<f64>,
}

/// Seeded N(0, 1) rows.
pub fn inputs(rows: usize, features: usize, seed: u64) -> Vec<f32> {
    let mut r = SplitMix64::derive(seed, &[0x0049_4e50_5554]);
    (0..rows * features).map(|_| r.normal() as f32).collect()
}

struct Samples {
    us: Vec<f64>,
    calls_per_sample: usize,
}

/// Time `engine` on `x` (`batch` rows) for about `time`, appending per-call µs to `samples`.
#[allow(clippy::too_many_arguments)]
fn sample(
    engine: &mut dyn Engine,
    x: &[f32],
    batch: usize,
    out: &mut HeadOutput,
    time: Duration,
    min_samples: usize,
    warmup: Duration,
    samples: &mut Samples,
) -> Result<(), BenchError> {
    let start = Instant::now();
    while start.elapsed() < warmup {
        engine.forward(x, batch, out)?;
    }
    if samples.calls_per_sample == 0 {
        // Estimate the call time from a few calls.
        let t = Instant::now();
        let mut n = 0u32;
        while n < 3 || t.elapsed() < Duration::from_micros(200) {
            engine.forward(x, batch, out)?;
            n += 1;
        }
        let per_call = t.elapsed().as_secs_f64() / n as f64;
        samples.calls_per_sample =
            ((GROUP_TARGET.as_secs_f64() / per_call).ceil() as usize).clamp(1, 1000);
    }
    let g = samples.calls_per_sample;
    let start = Instant::now();
    let mut taken = 0;
    while start.elapsed() < time || taken < min_samples {
        let t = Instant::now();
        for _ in 0..g {
            engine.forward(x, batch, out)?;
        }
        samples.us.push(t.elapsed().as_secs_f64() * 1e6 / g as f64);
        taken += 1;
    }
    Ok(())
}

fn summarise(
    engine: &str,
    batch: usize,
    threads: usize,
    flop_per_row: usize,
    peak: f64,
    s: &mut Samples,
) -> InferResult {
    s.us.sort_by(|a, b| a.total_cmp(b));
    let p50 = percentile(&s.us, 0.5);
    let p99 = percentile(&s.us, 0.99);
    let mean = s.us.iter().sum::<f64>() / s.us.len().max(1) as f64;
    let gflops = flop_per_row as f64 * batch as f64 / (p50 * 1e-6) / 1e9;
    // The floor of a multi-threaded call is that of `threads` cores.
    let peak_total = peak * threads.max(1) as f64;
    InferResult {
        bench: "infer",
        engine: engine.to_string(),
        batch,
        threads,
        p50_us: p50,
        p99_us: p99,
        mean_us: mean,
        rows_per_s: batch as f64 / (p50 * 1e-6),
        gflops,
        floor_frac: gflops / peak_total,
        flop_per_row,
        peak_gflops: peak,
        samples: s.us.len(),
        calls_per_sample: s.calls_per_sample,
        speedup_vs_burn: None,
    }
}

/// Measure one engine at one batch size (single round).
pub fn bench_engine(
    engine: &mut dyn Engine,
    batch: usize,
    opts: &InferBenchOptions,
) -> Result<InferResult, BenchError> {
    let arch = engine.arch().clone();
    let x = inputs(batch, arch.n_features, opts.seed);
    engine.warm_up(&[batch])?;
    let mut out = HeadOutput::default();
    let mut s = Samples {
        us: Vec::new(),
        calls_per_sample: 0,
    };
    sample(
        engine,
        &x,
        batch,
        &mut out,
        opts.min_time,
        opts.min_samples,
        opts.warmup,
        &mut s,
    )?;
    Ok(summarise(
        &engine.name(),
        batch,
        engine.threads(),
        arch.flops_per_row(),
        peak_gflops(),
        &mut s,
    ))
}

/// Measure every engine in `engines` at every batch size of `opts` on `weights`, in
/// interleaved rounds. Results are ordered by batch, then engine as given; when `burn` is
/// among the engines, every result carries its speedup over `burn` at the same batch.
pub fn run_infer(
    weights: &HostWeights,
    engines: &[String],
    opts: &InferBenchOptions,
) -> Result<Vec<InferResult>, BenchError> {
    if opts.batches.contains(&0) {
        return Err(BenchError::Invalid("batch sizes must be at least 1".into()));
    }
    let peak = peak_gflops();
    let mut built: Vec<Box<dyn Engine>> = engines
        .iter()
        .map(|name| build_forced(name, weights, opts.threads))
        .collect::<Result<_, _>>()?;
    for e in built.iter_mut() {
        e.warm_up(&opts.batches)?;
    }
    let nf = weights.arch.n_features;
    let inputs: Vec<Vec<f32>> = opts
        .batches
        .iter()
        .map(|&b| inputs(b, nf, opts.seed))
        .collect();
    let rounds = opts.rounds.max(1);
    let per_round = opts.min_time / rounds as u32;
    let per_round_samples = opts.min_samples.div_ceil(rounds);
    let mut samples: Vec<Vec<Samples>> = opts
        .batches
        .iter()
        .map(|_| {
            built
                .iter()
                .map(|_| Samples {
                    us: Vec::new(),
                    calls_per_sample: 0,
                })
                .collect()
        })
        .collect();
    let mut out = HeadOutput::default();
    for _ in 0..rounds {
        for (bi, &batch) in opts.batches.iter().enumerate() {
            for (ei, e) in built.iter_mut().enumerate() {
                sample(
                    e.as_mut(),
                    &inputs[bi],
                    batch,
                    &mut out,
                    per_round,
                    per_round_samples,
                    opts.warmup,
                    &mut samples[bi][ei],
                )?;
            }
        }
    }
    let flop = weights.arch.flops_per_row();
    let mut results = Vec::new();
    for (bi, &batch) in opts.batches.iter().enumerate() {
        let mut row: Vec<InferResult> = built
            .iter()
            .zip(samples[bi].iter_mut())
            .zip(engines)
            .map(|((e, s), name)| summarise(name, batch, e.threads(), flop, peak, s))
            .collect();
        if let Some(burn) = row.iter().find(|r| r.engine == "burn").map(|r| r.p50_us) {
            for r in row.iter_mut() {
                r.speedup_vs_burn = Some(burn / r.p50_us);
            }
        }
        results.extend(row);
    }
    Ok(results)
}

/// Build engine `name`, or `fused@ISA` / `int8@ISA` (`avx512`, `avx2`, `portable`; `int8@avx512`
/// needs AVX-512 VNNI): an engine forced onto one instruction-set path, to compare the paths
/// of one CPU in the same run.
fn build_forced(
    name: &str,
    weights: &HostWeights,
    threads: usize,
) -> Result<Box<dyn Engine>, BenchError> {
    let Some((base, isa)) = name.split_once('@') else {
        let engine = build_engine(crate::infer::parse_engine(name)?, weights, threads)?;
        if let Some(note) = engine.load_note() {
            // The GPU engines' dtype and measured deviation from `fused`, as at every load.
            eprintln!("{note}");
        }
        return Ok(engine);
    };
    let isa = [Isa::Avx512, Isa::Avx2, Isa::Portable]
        .into_iter()
        .find(|i| i.name() == isa)
        .ok_or_else(|| {
            BenchError::Invalid(format!(
                "engine `{name}`: unknown instruction set `{isa}` (expected avx512, avx2 or portable)"
            ))
        })?;
    match base {
        "fused" => Ok(Box::new(FusedEngine::with_isa(weights, threads, isa)?)),
        "int8" => Ok(Box::new(Int8Engine::with_isa(weights, threads, isa)?)),
        _ => Err(BenchError::Invalid(format!(
            "engine `{name}`: only fused and int8 take an @instruction-set suffix"
        ))),
    }
}

/// One line saying where `int8` was slower than `fused` in `results` (same batch, same
/// `@ISA` suffix, both measured in this run), or `None` when it never was or the pair did
/// not run — so a user is told to prefer `fused` there instead of silently running the
/// slower engine.
pub fn int8_notice(results: &[InferResult]) -> Option<String> {
    let mut slow = Vec::new();
    for r in results {
        let Some(suffix) = r.engine.strip_prefix("int8") else {
            continue;
        };
        let fused = format!("fused{suffix}");
        if let Some(f) = results
            .iter()
            .find(|f| f.engine == fused && f.batch == r.batch)
            .filter(|f| r.rows_per_s < f.rows_per_s)
        {
            slow.push(format!(
                "{} at batch {} ({:.2}× {}'s rows/s)",
                r.engine,
                r.batch,
                r.rows_per_s / f.rows_per_s,
                f.engine
            ));
        }
    }
    (!slow.is_empty()).then(|| {
        format!(
            "note: int8 is slower than fused on this CPU for {}: use fused there",
            slow.join(", ")
        )
    })
}

/// A human-readable table of results.
pub fn format_table(results: &[InferResult]) -> String {
    let mut s = format!(
        "{:<14} {:>6} {:>7} {:>10} {:>10} {:>13} {:>8} {:>7} {:>9}\n",
        "engine", "batch", "threads", "p50 µs", "p99 µs", "rows/s", "GFLOP/s", "floor", "vs burn"
    );
    for r in results {
        s.push_str(&format!(
            "{:<14} {:>6} {:>7} {:>10.3} {:>10.3} {:>13.0} {:>8.1} {:>6.1}% {:>9}\n",
            r.engine,
            r.batch,
            r.threads,
            r.p50_us,
            r.p99_us,
            r.rows_per_s,
            r.gflops,
            r.floor_frac * 100.0,
            r.speedup_vs_burn
                .map(|x| format!("{x:.2}×"))
                .unwrap_or_else(|| "".into())
        ));
    }
    if let Some(r) = results.first() {
        s.push_str(&format!(
            "floor = {} FLOP/row at one core's measured peak of {:.0} GFLOP/s\n",
            r.flop_per_row, r.peak_gflops
        ));
    }
    s
}

/// One core's peak f32 FLOP rate in GFLOP/s, measured once per process: independent FMA
/// chains on the widest vectors the fused engine uses (AVX-512, else AVX2, else the
/// portable lanes), best of several short runs.
pub fn peak_gflops() -> f64 {
    static PEAK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *PEAK.get_or_init(|| {
        let mut best = 0f64;
        for _ in 0..7 {
            best = best.max(crate::simd::measure_peak_gflops(Duration::from_millis(3)));
        }
        best
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(engine: &str, batch: usize, rows_per_s: f64) -> InferResult {
        let mut s = Samples {
            us: vec![batch as f64 / rows_per_s * 1e6],
            calls_per_sample: 1,
        };
        summarise(engine, batch, 1, 7104, 100.0, &mut s)
    }

    #[test]
    fn the_int8_notice_names_exactly_the_batches_where_int8_lost_to_fused() {
        let r = vec![
            result("fused", 1, 6e6),
            result("int8", 1, 2e6),
            result("fused", 32, 14e6),
            result("int8", 32, 16e6),
            result("fused@avx2", 1, 6e6),
            result("int8@avx2", 1, 7e6),
        ];
        let note = int8_notice(&r).unwrap();
        assert_eq!(note.lines().count(), 1, "{note}");
        assert!(note.contains("int8 at batch 1 (0.33×"), "{note}");
        assert!(
            !note.contains("batch 32") && !note.contains("int8@avx2"),
            "{note}"
        );
        // int8 faster everywhere, or no fused to compare with: silence.
        assert_eq!(int8_notice(&r[2..]), None);
        assert_eq!(int8_notice(&[result("int8", 1, 1.0)]), None);
    }

    #[test]
    fn a_forced_path_is_named_and_an_unknown_one_is_refused() {
        let w = crate::infer::reference_weights(1);
        let e = build_forced("fused@portable", &w, 1).unwrap();
        assert_eq!(e.name(), "fused");
        for bad in ["int8@sse9", "burn@avx2"] {
            let err = build_forced(bad, &w, 1).err().unwrap().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
