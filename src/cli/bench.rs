//! `kiln bench infer`, `kiln bench train` and `kiln bench serve`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args};

use crate::cli::{CliError, CliResult};
use kiln::artifact::Checkpoint;
use kiln::bench::{self, BenchError, InferBenchOptions, TrainBenchOptions};
use kiln::infer::{InferError, REFERENCE_SEED, cpu_engine_names, reference_weights};

/// Inference latency and throughput per engine and batch size.
///
/// Each setting is measured in-process: warm-up, then per-call wall times (calls under 5 µs
/// timed in groups) over `--min-time` seconds split into interleaved rounds across engines.
/// Prints one JSON line per setting with `--json`, else a table; when `burn` is among the
/// engines every line carries the speedup over it measured in the same run.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("model").required(true).args(["checkpoint", "reference"])))]
pub struct BenchInferArgs {
    /// An export directory (or a run directory containing export/).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// The reference network: 20 → 48 → 48 → (3 + 3), ReLU, 3,654 parameters, seeded weights.
    #[arg(long)]
    pub reference: bool,
    /// Seed of the reference network's weights.
    #[arg(long, default_value_t = REFERENCE_SEED, requires = "reference")]
    pub seed: u64,
    /// Engines, comma-separated (default: every CPU engine: burn, burn-ndarray, fused, int8);
    /// `fused@ISA` / `int8@ISA` force one path (avx512, avx2, portable).
    #[arg(long, value_delimiter = ',', value_name = "E[,E2…]")]
    pub engine: Vec<String>,
    /// Rows per call, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,32,1024",
        value_name = "N[,N2…]"
    )]
    pub batch: Vec<usize>,
    /// Threads per call (the fused and int8 engines split batches of ≥ 2,048 rows).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// One JSON line per setting instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Minimum measured seconds per setting.
    #[arg(long, default_value_t = 1.5, value_name = "SECONDS")]
    pub min_time: f64,
    /// Minimum samples per setting.
    #[arg(long, default_value_t = 300)]
    pub iters: usize,
    /// Interleaved rounds over all settings.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

/// Stage-1 training throughput of the reference network on a synthetic table.
///
/// Runs the real training loop (`kiln train`'s) once per worker count: 20 features, 3
/// targets, 20 → 48 → 48 → 3 + 3, batch 128, AdamW, global clipping at 1.0, one epoch.
#[derive(Debug, Clone, Args)]
pub struct BenchTrainArgs {
    /// Loader worker counts, comma-separated (one training run each).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,1,2",
        value_name = "W[,W2…]"
    )]
    pub workers: Vec<usize>,
    /// Rows of the training split.
    #[arg(long, default_value_t = 200_000)]
    pub rows: usize,
    /// Batch size.
    #[arg(long, default_value_t = 128)]
    pub batch_size: usize,
    /// Epochs.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Seed of the synthetic table and the run.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// One JSON line per worker count instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The serving path on loopback, in one run.
///
/// Starts a server on the repository in-process (or measures the one at `--url`), then
/// reports: round trips at concurrency 1 over keep-alive (health endpoint; inference JSON
/// and binary per `--batch`; the pick model with `--pick-model`) with p50/p90/p99 and each
/// infer p50 minus the health p50; the closed-loop maximum over `--connections`; an
/// open-loop sweep at `--fractions` of it with service-side p50/p99; and the in-process cost
/// of each request stage. Client and server threads are pinned to different CPUs where the
/// machine has two or more (the JSON says what was done).
#[derive(Debug, Clone, Args)]
pub struct BenchServeArgs {
    /// The model repository.
    #[arg(long, value_name = "DIR", required_unless_present = "url")]
    pub repository: Option<PathBuf>,
    /// The regression model to call.
    #[arg(long)]
    pub model: String,
    /// A pick model in the same repository to call too.
    #[arg(long, value_name = "NAME")]
    pub pick_model: Option<String>,
    /// Measure the server at this loopback URL instead of starting one.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Engine of the in-process server.
    #[arg(long, value_parser = super::parse_serve_engine)]
    pub engine: Option<kiln::records::EngineKind>,
    /// Batching policy of the in-process server.
    #[arg(long, default_value = "idle", value_name = "idle|delay")]
    pub batching: kiln::serve::BatchingPolicy,
    /// Instances of the in-process server.
    #[arg(long, default_value_t = 2)]
    pub instances: usize,
    /// Queue delay (µs) of the in-process server (`--batching delay`).
    #[arg(long, default_value_t = 100)]
    pub max_queue_delay_us: u64,
    /// Tokio worker threads of the in-process server (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    pub server_workers: usize,
    /// Rows per request at concurrency 1, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,64",
        value_name = "N[,N2…]"
    )]
    pub batch: Vec<usize>,
    /// Measured requests per series at concurrency 1.
    #[arg(long, default_value_t = 3000)]
    pub requests: usize,
    /// Interleaved rounds over the series.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Connections of the closed-loop and open-loop runs.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Seconds of the closed-loop run.
    #[arg(long, default_value_t = 5.0)]
    pub closed_seconds: f64,
    /// Fractions of the closed-loop maximum for the open-loop sweep, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.5,0.7,0.9")]
    pub fractions: Vec<f64>,
    /// Seconds of each open-loop point.
    #[arg(long, default_value_t = 5.0)]
    pub sweep_seconds: f64,
    /// Calls per stage for the in-process stage costs.
    #[arg(long, default_value_t = 2000)]
    pub stage_iters: usize,
    /// Do not pin client and server threads to different CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// One JSON line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `kiln bench serve`.
pub fn serve(args: &BenchServeArgs) -> CliResult {
    use kiln::loadgen::bench::{
        ServeBenchError, ServeBenchOptions, format_report, run_serve_bench,
    };
    let secs = |name: &str, v: f64| {
        if v.is_finite() && v > 0.0 && v <= 3600.0 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(CliError::input(anyhow::anyhow!(
                "--{name} is {v}; expected seconds in (0, 3600]"
            )))
        }
    };
    let opts = ServeBenchOptions {
        repository: args.repository.clone().unwrap_or_default(),
        model: args.model.clone(),
        pick_model: args.pick_model.clone(),
        url: args.url.clone(),
        engine: args.engine,
        batcher: kiln::serve::BatcherConfig {
            policy: args.batching,
            instances: args.instances,
            max_queue_delay: Duration::from_micros(args.max_queue_delay_us),
            ..Default::default()
        },
        server_workers: args.server_workers,
        batches: args.batch.clone(),
        requests: args.requests,
        rounds: args.rounds,
        connections: args.connections,
        closed_duration: secs("closed-seconds", args.closed_seconds)?,
        fractions: args.fractions.clone(),
        sweep_duration: secs("sweep-seconds", args.sweep_seconds)?,
        stage_iters: args.stage_iters,
        pin: !args.no_pin,
    };
    let report = run_serve_bench(&opts).map_err(|e| match e {
        ServeBenchError::Invalid(_) | ServeBenchError::Url(_) | ServeBenchError::Serve(_) => {
            CliError::input(e)
        }
        other => CliError::from(anyhow::Error::from(other)),
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", format_report(&report));
    }
    Ok(())
}

fn bench_error(e: BenchError) -> CliError {
    match e {
        BenchError::Infer(InferError::Unknown(..)) | BenchError::Invalid(_) => CliError::input(e),
        other => other.into(),
    }
}

/// `kiln bench infer`.
pub fn infer(args: &BenchInferArgs) -> CliResult {
    let weights = match (&args.checkpoint, args.reference) {
        (Some(dir), _) => Checkpoint::load(dir).map_err(CliError::input)?.weights,
        (None, _) => reference_weights(args.seed),
    };
    if !(args.min_time.is_finite() && args.min_time >= 0.0) {
        return Err(CliError::input(anyhow::anyhow!(
            "--min-time must be a non-negative number of seconds, got {}",
            args.min_time
        )));
    }
    let engines: Vec<String> = if args.engine.is_empty() {
        cpu_engine_names().into_iter().map(String::from).collect()
    } else {
        args.engine.clone()
    };
    let opts = InferBenchOptions {
        batches: args.batch.clone(),
        threads: args.threads,
        min_time: Duration::from_secs_f64(args.min_time),
        min_samples: args.iters,
        rounds: args.rounds,
        ..InferBenchOptions::default()
    };
    let results = bench::run_infer(&weights, &engines, &opts).map_err(bench_error)?;
    if args.json {
        for r in &results {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
        print!("{}", bench::format_table(&results));
    }
    if let Some(note) = bench::infer::int8_notice(&results) {
        eprintln!("{note}");
    }
    Ok(())
}

/// `kiln bench train`.
pub fn train(args: &BenchTrainArgs) -> CliResult {
    let opts = TrainBenchOptions {
        rows: args.rows,
        workers: args.workers.clone(),
        batch_size: args.batch_size,
        epochs: args.epochs,
        seed: args.seed,
        ..TrainBenchOptions::default()
    };
    let results = bench::run_train(&opts).map_err(bench_error)?;
    if args.json {
        for r in &results {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
        println!(
            "{:>7} {:>14} {:>10} {:>10} {:>8} {:>8}   µs per step: {:>6} {:>6} {:>7} {:>6} {:>8} {:>6} {:>9}",
            "workers",
            "samples/s",
            "data wait",
            "rows",
            "steps",
            "wall s",
            "data",
            "h2d",
            "forward",
            "loss",
            "backward",
            "clip",
            "optimizer"
        );
        for r in &results {
            let p = &r.step_us;
            println!(
                "{:>7} {:>14.0} {:>9.1}% {:>10} {:>8} {:>8.1}                {:>6.1} {:>6.1} {:>7.1} {:>6.1} {:>8.1} {:>6.1} {:>9.1}",
                r.workers,
                r.samples_per_s,
                r.data_wait_frac * 100.0,
                r.train_rows,
                r.steps,
                r.wall_s,
                p.data,
                p.h2d,
                p.forward,
                p.loss,
                p.backward,
                p.clip,
                p.optimizer
            );
        }
    }
    Ok(())
}
