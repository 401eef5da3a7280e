//! The `kiln` command line: parse, then call one function per subcommand in `cli` (the
//! binary's own module: it parses and prints; behaviour lives in the `kiln` library).

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use cli::CliResult;
use kiln::data::baseball::BaseballSpec;
use kiln::data::synthetic::SyntheticSpec;
use kiln::train::ProgressMode;

/// kiln — train compact regression networks on a schedule and serve them on a
/// latency-critical path, with Burn.
#[derive(Parser)]
#[command(name = "kiln", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model from a YAML experiment config and export a checkpoint.
    ///
    /// Each run gets a fresh directory under `<export.dir>/runs/`; a rerun of the same
    /// config never overwrites a finished run. The export directory is printed on stdout.
    Train {
        /// The experiment config (e.g. configs/baseball.yaml).
        config: PathBuf,
        /// Continue an interrupted run (its directory) from its last epoch snapshot.
        #[arg(long, value_name = "RUN_DIR")]
        resume: Option<PathBuf>,
        /// Plain log lines instead of progress bars, even on a terminal (and no colour).
        #[arg(long)]
        plain: bool,
        /// Only warnings, errors and the export path.
        #[arg(long, short)]
        quiet: bool,
        /// Override a config value: `--set loader.num_workers=2 --set model.hidden=[32,32]`.
        /// The run directory stores the effective config.
        #[arg(long, value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Run registry: a file, `sqlite:///file` or `postgres://…`; default `registry.path`,
        /// else `<export.dir>/runs.db`.
        #[arg(long, value_name = "REGISTRY")]
        registry: Option<PathBuf>,
    },
    /// Profile inference on fixed inputs, or compare two saved profiles.
    Profile {
        #[command(subcommand)]
        command: ProfileCommand,
    },
    /// Inspect the run registry: list, show, compare, report, regressions, promotions.
    Runs {
        /// Registry: a file, `sqlite:///file` or `postgres://…` (default: the one `--config`
        /// names, else checkpoints/runs.db).
        #[arg(long, global = true, value_name = "REGISTRY")]
        registry: Option<PathBuf>,
        /// Read the registry this experiment config names (`registry.path`, else
        /// `<export.dir>/runs.db`).
        #[arg(long, global = true, value_name = "FILE", conflicts_with = "registry")]
        config: Option<PathBuf>,
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// Run a grid or list of configs in parallel into the registry and answer the
    /// right-sizing question (the smallest model within a tolerance of the best).
    ///
    /// `kiln sweep FILE` runs every member from this process; `plan`, `run --index I` and
    /// `summarize` split it into independent processes (a Kubernetes Indexed Job).
    #[command(args_conflicts_with_subcommands = true)]
    Sweep {
        #[command(subcommand)]
        command: Option<cli::sweep::SweepCommand>,
        /// The sweep file (see configs/sweep.yaml).
        spec: Option<PathBuf>,
        /// Registry (default: the base config's).
        #[arg(long, value_name = "REGISTRY")]
        registry: Option<PathBuf>,
        /// Concurrent runs (overrides the file).
        #[arg(long)]
        parallel: Option<usize>,
        /// Threads per run (overrides the file's `threads_per_run`).
        #[arg(long = "threads", alias = "threads-per-run", value_name = "N")]
        threads_per_run: Option<usize>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Print versions, backends, CPU/GPU and thread settings (the first thing to check).
    Doctor {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// The GPU readiness check: find libcuda/libnvrtc, create the device, check bf16/f32
        /// agreement, bench the CUDA engines, train briefly in bf16; JSON on stdout, exit 1
        /// (one line on stderr) when a step cannot run or fails.
        #[arg(long)]
        gpu: bool,
        /// With --gpu: the config of the bf16 training run.
        #[arg(long, default_value = "configs/tiny.yaml", requires = "gpu")]
        gpu_config: std::path::PathBuf,
        /// With --gpu: seconds measured per `bench infer` setting.
        #[arg(long, default_value_t = 2.0, requires = "gpu")]
        gpu_bench_seconds: f64,
    },
    /// Maintain exported checkpoints.
    Checkpoint {
        #[command(subcommand)]
        command: CheckpointCommand,
    },
    /// Export a checkpoint for other runtimes: `kiln export onnx --checkpoint DIR --out model.onnx`.
    Export {
        #[command(subcommand)]
        command: ExportCommand,
    },
    /// Bring weights trained elsewhere into a kiln checkpoint.
    Import {
        #[command(subcommand)]
        command: ImportCommand,
    },
    /// Write a commented starter config for a table: `kiln init --data FILE --target COL…`.
    Init {
        /// The table: CSV (optionally gzip-compressed) or Parquet.
        #[arg(long)]
        data: PathBuf,
        /// Target columns (repeat or comma-separate).
        #[arg(long = "target", required = true, value_delimiter = ',')]
        targets: Vec<String>,
        /// Where to write the config (refuses to overwrite an existing file).
        #[arg(long, default_value = "kiln.yaml")]
        out: PathBuf,
    },
    /// Inspect experiment configs.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Build datasets.
    Dataset {
        #[command(subcommand)]
        command: DatasetCommand,
    },
    /// Predict mean and standard deviation per target for every row of a CSV file.
    Predict(PredictArgs),
    /// P(all legs of a pick hit) from a checkpoint's predictions and residual correlation;
    /// `kiln pick evaluate` scores those probabilities against the test split's outcomes.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Pick(cli::pick::PickArgs),
    /// Multivariate-normal box probabilities for JSON-lines queries (Halton / Genz).
    Mvn(cli::mvn::MvnArgs),
    /// Benchmarks with JSON output: inference engines, training throughput, the MVN estimator.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Serve a model repository over the Open Inference Protocol (KServe v2 / Triton REST).
    Serve(cli::serve::ServeArgs),
    /// Load-test a kiln (or any OIP v2) server on loopback.
    Loadtest(cli::loadtest::LoadtestArgs),
    /// Promote a run's checkpoint into a model repository if it is no worse than the served
    /// version (test quality and latency, measured now); exit 3 when refused.
    Promote(cli::promote::PromoteArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Inference latency and throughput per engine and batch size.
    Infer(cli::bench::BenchInferArgs),
    /// Stage-1 training samples/s for the reference network on synthetic data.
    Train(cli::bench::BenchTrainArgs),
    /// The MVN estimator's throughput and error on closed-form cases.
    Mvn(cli::mvn::MvnBenchArgs),
    /// The serving path's latency floor, closed-loop maximum and open-loop sweep on loopback.
    Serve(cli::bench::BenchServeArgs),
}

#[derive(Subcommand)]
enum RunsCommand {
    /// One line per run.
    List {
        /// JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Everything about one run (id or unique prefix), with its epochs.
    Show {
        /// Run id or prefix.
        id: String,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Metrics side by side and the config differences.
    Compare {
        /// Run A.
        a: String,
        /// Run B.
        b: String,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Latency and validation loss against parameter count (PNG + SVG) and an HTML page.
    Report {
        /// Output directory.
        #[arg(long, default_value = "checkpoints/report")]
        out: PathBuf,
        /// Latency at batch 1 or 128.
        #[arg(long, default_value_t = 1)]
        batch: usize,
    },
    /// The promotion gate's decisions (`kiln promote`), oldest first, with their numbers and
    /// which run each model's newest version came from.
    Promotions {
        /// Only this model.
        #[arg(long, value_name = "NAME")]
        model: Option<String>,
        /// JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Flag runs whose latency is anomalous for their size; exit code 3 when any is found.
    Regressions {
        /// Latency at batch 1 or 128.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Flag at this multiple of the size peers' median latency.
        #[arg(long, default_value_t = 1.5)]
        ratio: f64,
        /// Peers are runs within this relative distance in parameter count.
        #[arg(long, default_value_t = 0.05)]
        size_tolerance: f64,
        /// ...and only when slower than that median by at least this many µs (the noise floor
        /// of sub-µs batch-1 medians).
        #[arg(long, default_value_t = 0.25)]
        min_delta_us: f64,
        /// Re-profile each flagged run and its peer on identical inputs and print the
        /// operators that explain the gap.
        #[arg(long)]
        attribute: bool,
        /// Where attribution profiles are written.
        #[arg(long, default_value = "checkpoints/attribution")]
        out: PathBuf,
        /// JSON lines.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ProfileCommand {
    /// Profile inference on fixed, seeded inputs: writes a Chrome trace and a key-averages
    /// table (`key_averages.json` is the input of `kiln profile diff`).
    Infer(cli::observe::ProfileInferArgs),
    /// Compare two key-averages tables (files or profile directories), largest regression first.
    Diff {
        /// Baseline.
        a: PathBuf,
        /// Candidate.
        b: PathBuf,
        /// One JSON object per row.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a config (keys, types, value ranges) without training.
    Check {
        /// The config file.
        file: PathBuf,
        /// Override a config value before checking, as `kiln train --set` does:
        /// `--set data.path=other.csv`.
        #[arg(long, value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Write which split every row of the config's table trains, validates or tests on, as
    /// CSV `row,split` (row = index among the data rows, 0 = the first after the header;
    /// rows in no split are left out), so other models can use the same rows.
    Split {
        /// The config file.
        file: PathBuf,
        /// Where to write the CSV (atomically); stdout when absent.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Override config values (`key.path=value`), as `kiln train --set`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
}

#[derive(Subcommand)]
enum CheckpointCommand {
    /// Re-seal a checkpoint whose manifest.json was edited on purpose: checks the weights'
    /// SHA-256 and architecture, then rewrites the manifest's `manifest_sha256`. Without it,
    /// an edited manifest is refused at load.
    Reseal {
        /// An export directory (or a run directory containing export/).
        #[arg(
            long = "checkpoint",
            value_name = "DIR",
            required_unless_present = "dir_arg"
        )]
        dir: Option<PathBuf>,
        /// The same, positionally (the older spelling; hidden).
        #[arg(value_name = "DIR", hide = true, conflicts_with = "dir")]
        dir_arg: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum ExportCommand {
    /// One self-contained ONNX graph (opset 17): `features` [batch, F] in original units in,
    /// `mean` and `std` [batch, k] in original units out, as `kiln predict` computes them.
    Onnx {
        /// An export directory (or a run directory containing export/).
        #[arg(long)]
        checkpoint: PathBuf,
        /// The ONNX file to write (atomically).
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum ImportCommand {
    /// A PyTorch `state_dict` saved as safetensors (`backbone.0`, `backbone.2`, …,
    /// `mean_head`, `logvar_head`; `[out, in]` weights) → a kiln checkpoint that `kiln
    /// predict`, `kiln serve` and every engine load.
    Pytorch(cli::import::PytorchArgs),
}

#[derive(Subcommand)]
enum DatasetCommand {
    /// Derive the player-season table from the Baseball Databank (byte-for-byte reproducible).
    Baseball {
        /// The Databank directory holding Batting.csv and People.csv.
        #[arg(long, default_value = "../shared/datasets/baseballdatabank-2021.2")]
        source: PathBuf,
        /// Output CSV.
        #[arg(long, default_value = "datasets/baseball.csv")]
        out: PathBuf,
        /// Minimum plate appearances in each of seasons t−2, t−1 and t.
        #[arg(long, default_value_t = 100)]
        min_pa: u32,
        /// First season t emitted.
        #[arg(long, default_value_t = 1960)]
        first_season: i64,
    },
    /// Generate a seeded synthetic regression table (id, season, f0.., y0..).
    Synthetic {
        /// Rows.
        #[arg(long)]
        rows: usize,
        /// Feature columns.
        #[arg(long, default_value_t = 20)]
        features: usize,
        /// Target columns.
        #[arg(long, default_value_t = 3)]
        targets: usize,
        /// Seed.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Output CSV.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Args)]
struct PredictArgs {
    /// An export directory (or a run directory containing export/).
    #[arg(long)]
    checkpoint: PathBuf,
    /// CSV with (at least) the checkpoint's feature columns, in any order.
    #[arg(long)]
    input: PathBuf,
    /// Output CSV (stdout when absent). Written atomically. (`--output` is accepted too.)
    #[arg(long = "out", alias = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Inference engine: `auto` (the fastest exact engine on this CPU: a row's answer is
    /// bit-identical whatever the file's size), `burn` (the Burn module itself), `fused`, or
    /// the quantised `int8` / `auto-int8` (explicit only; the measured max |Δ| vs `fused` on
    /// the input rows is printed).
    #[arg(long, default_value = kiln::records::AUTO_ENGINE, value_parser = cli::parse_engine)]
    engine: kiln::records::EngineKind,
}

fn run(cli: Cli) -> CliResult {
    match cli.command {
        Command::Train {
            config,
            resume,
            plain,
            quiet,
            set,
            registry,
        } => cli::train::run(cli::train::TrainArgs {
            set: &set,
            registry: registry.as_deref(),
            config: &config,
            resume: resume.as_deref(),
            progress: if quiet {
                ProgressMode::Quiet
            } else if plain {
                ProgressMode::Plain
            } else {
                ProgressMode::Auto
            },
        }),
        Command::Config {
            command: ConfigCommand::Check { file, set },
        } => cli::config::check(&file, &set),
        Command::Config {
            command: ConfigCommand::Split { file, out, set },
        } => cli::config::split(&file, out.as_deref(), &set),
        Command::Init { data, targets, out } => cli::config::init(&data, &targets, &out),
        Command::Checkpoint {
            command: CheckpointCommand::Reseal { dir, dir_arg },
        } => cli::checkpoint::reseal(&dir.or(dir_arg).unwrap_or_default()),
        Command::Export {
            command: ExportCommand::Onnx { checkpoint, out },
        } => cli::export::onnx(&checkpoint, &out),
        Command::Import {
            command: ImportCommand::Pytorch(a),
        } => cli::import::pytorch(&a),
        Command::Profile { command } => match command {
            ProfileCommand::Infer(a) => cli::observe::profile_infer(&a),
            ProfileCommand::Diff { a, b, json } => cli::observe::profile_diff(&a, &b, json),
        },
        Command::Doctor {
            gpu: true,
            gpu_config,
            gpu_bench_seconds,
            ..
        } => cli::gpu::run(&cli::gpu::GpuCheckArgs {
            config: gpu_config,
            bench_seconds: gpu_bench_seconds,
        }),
        Command::Doctor { json, .. } => cli::observe::doctor(json),
        Command::Runs {
            registry,
            config,
            command,
        } => match cli::runs::registry_of(registry, config.as_deref()) {
            Err(e) => Err(e),
            Ok(registry) => match command {
                RunsCommand::List { json } => cli::runs::list(&registry, json),
                RunsCommand::Promotions { model, json } => {
                    cli::runs::promotions(&registry, model.as_deref(), json)
                }
                RunsCommand::Show { id, json } => cli::runs::show(&registry, &id, json),
                RunsCommand::Compare { a, b, json } => cli::runs::compare(&registry, &a, &b, json),
                RunsCommand::Report { out, batch } => cli::runs::latency_batch(batch)
                    .and_then(|w| cli::runs::report(&registry, &out, w)),
                RunsCommand::Regressions {
                    batch,
                    ratio,
                    size_tolerance,
                    min_delta_us,
                    attribute,
                    out,
                    json,
                } => cli::runs::latency_batch(batch).and_then(|which| {
                    cli::runs::regressions(&cli::runs::RegressionArgs {
                        registry: &registry,
                        which,
                        attribute,
                        json,
                        rule: kiln::track::analysis::RegressionRule {
                            ratio,
                            size_tolerance,
                            min_peers: 2,
                            min_delta_us,
                        },
                        out,
                    })
                }),
            },
        },
        Command::Sweep {
            command: Some(command),
            ..
        } => cli::sweep::dispatch(command),
        Command::Sweep {
            command: None,
            spec,
            registry,
            parallel,
            threads_per_run,
            json,
        } => cli::sweep::run(&cli::sweep::SweepArgs {
            spec: &cli::sweep::required(spec)?,
            registry: registry.as_deref(),
            parallel,
            threads: threads_per_run,
            json,
        }),
        Command::Dataset { command } => match command {
            DatasetCommand::Baseball {
                source,
                out,
                min_pa,
                first_season,
            } => cli::dataset::baseball(
                &source,
                &out,
                BaseballSpec {
                    min_pa,
                    first_season,
                },
            ),
            DatasetCommand::Synthetic {
                rows,
                features,
                targets,
                seed,
                out,
            } => cli::dataset::synthetic(
                &out,
                SyntheticSpec {
                    rows,
                    features,
                    targets,
                    seed,
                },
            ),
        },
        Command::Predict(a) => {
            cli::predict::run(&a.checkpoint, &a.input, a.output.as_deref(), a.engine)
        }
        Command::Pick(a) => cli::pick::run(&a),
        Command::Mvn(a) => cli::mvn::run(&a).map_err(cli::CliError::input),
        Command::Bench { command } => match command {
            BenchCommand::Infer(a) => cli::bench::infer(&a),
            BenchCommand::Train(a) => cli::bench::train(&a),
            BenchCommand::Serve(a) => cli::bench::serve(&a),
            BenchCommand::Mvn(a) => cli::mvn::run_bench(&a).map_err(cli::CliError::input),
        },
        Command::Serve(a) => cli::serve::run(&a),
        Command::Loadtest(a) => cli::loadtest::run(&a),
        Command::Promote(a) => cli::promote::run(&a),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Log lines are coloured only on a terminal, never with `--plain` or `NO_COLOR`.
    let plain = matches!(cli.command, Command::Train { plain: true, .. });
    kiln::observe::install_subscriber_with(plain);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors that already print their source (`"cannot read X: {source}"`) are not
            // followed by the same text again.
            let mut message = String::new();
            for cause in e.error.chain().map(|c| c.to_string()) {
                if message.is_empty() {
                    message = cause;
                } else if !message.ends_with(&cause) {
                    message = format!("{message}: {cause}");
                }
            }
            // Exit 4 ("nothing to do", `kiln promote`) is an outcome, not a failure.
            let label = if e.code == 4 { "note" } else { "error" };
            eprintln!("{label}: {message}");
            ExitCode::from(e.code)
        }
    }
}
