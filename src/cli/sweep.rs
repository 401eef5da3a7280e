//! `kiln sweep SWEEP.yaml`: run every configuration as its own `kiln train` process (P at a
//! time, T threads each) through `kiln::track::sweep::run_sweep`, then print the right-sizing answer.
//! `kiln sweep plan | run --index I | summarize` split the same sweep into independent
//! processes sharing one registry (`kiln::track::sweep::{plan, run_index, summarize}`).

use std::path::{Path, PathBuf};

use super::{CliError, CliResult};
use kiln::config;
use kiln::track::sweep::{
    IndexOutcome, Member, ProcessLauncher, SweepError, SweepOptions, SweepReport, SweepSpec,
    run_sweep,
};

/// `kiln sweep plan | run | summarize`.
#[derive(clap::Subcommand)]
pub enum SweepCommand {
    /// Print the expanded runs in their stable order, with the sweep id and each run's index
    /// and id.
    Plan {
        /// The sweep file.
        spec: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Run exactly the I-th member in this process, into the registry. Idempotent: a member
    /// that finished is not run again; one whose run was killed is resumed (`kiln train
    /// --resume`) from its run directory, or restarted when that directory is not reachable.
    Run {
        /// The sweep file.
        spec: PathBuf,
        /// The member's index (default: $JOB_COMPLETION_INDEX, as a Kubernetes Indexed Job
        /// sets it).
        #[arg(long)]
        index: Option<usize>,
        /// Registry: a file, `sqlite:///file` or `postgres://…` (default: the base config's).
        #[arg(long, value_name = "REGISTRY")]
        registry: Option<PathBuf>,
        /// Threads (overrides the file's `threads_per_run`; RAYON_NUM_THREADS wins over both).
        #[arg(long = "threads", alias = "threads-per-run", value_name = "N")]
        threads_per_run: Option<usize>,
        /// `key.path=value` overrides placing this member, applied after its own (as `kiln
        /// train --set`), e.g. `export.dir=/work/checkpoints` for a writable run directory.
        /// Not part of the sweep id; a key the sweep file sets is refused.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// The right-sizing answer from the registry the members ran into (exit 1 while some
    /// member has not finished).
    Summarize {
        /// The sweep file.
        spec: PathBuf,
        /// Registry: a file, `sqlite:///file` or `postgres://…` (default: the base config's).
        #[arg(long, value_name = "REGISTRY")]
        registry: Option<PathBuf>,
        /// JSON output (the shape of `kiln sweep --json`).
        #[arg(long)]
        json: bool,
    },
}

/// The sweep file of `kiln sweep FILE`.
pub fn required(spec: Option<PathBuf>) -> Result<PathBuf, CliError> {
    spec.ok_or_else(|| {
        CliError::input(anyhow::anyhow!(
            "kiln sweep needs a sweep file (or one of plan, run, summarize)"
        ))
    })
}

fn sweep_error(e: SweepError) -> CliError {
    match e {
        SweepError::Config(_) | SweepError::Index { .. } => CliError::input(e),
        other => CliError::from(other),
    }
}

fn registry_of(spec: &SweepSpec, registry: Option<PathBuf>) -> Result<PathBuf, CliError> {
    match registry {
        Some(r) => Ok(r),
        None => Ok(config::load(&spec.base)
            .map_err(CliError::input)?
            .config
            .registry_path()),
    }
}

/// Run a `kiln sweep` subcommand.
pub fn dispatch(command: SweepCommand) -> CliResult {
    match command {
        SweepCommand::Plan { spec: file, json } => {
            let spec = SweepSpec::load(&file).map_err(CliError::input)?;
            let plan = kiln::track::sweep::plan(&spec, &file).map_err(sweep_error)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&plan)?);
            } else {
                println!(
                    "sweep {} ({} runs of {})",
                    plan.sweep_id,
                    plan.runs.len(),
                    plan.base.display()
                );
                for r in &plan.runs {
                    println!("{:>4}  {}  {}", r.index, r.id, r.overrides.join(" "));
                }
            }
            Ok(())
        }
        SweepCommand::Run {
            spec: file,
            index,
            registry,
            threads_per_run,
            set,
        } => {
            let spec = SweepSpec::load(&file).map_err(CliError::input)?;
            let index = match index {
                Some(i) => i,
                None => std::env::var("JOB_COMPLETION_INDEX")
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or_else(|| {
                        CliError::input(anyhow::anyhow!(
                            "kiln sweep run needs --index I (or JOB_COMPLETION_INDEX set to a number)"
                        ))
                    })?,
            };
            let plan = kiln::track::sweep::plan(&spec, &file).map_err(sweep_error)?;
            let set = kiln::track::sweep::placement_overrides(&plan, &set).map_err(sweep_error)?;
            // The default registry follows a moved `export.dir`.
            let registry = match registry {
                Some(r) => r,
                None => config::load_with_overrides(&spec.base, set)
                    .map_err(CliError::input)?
                    .config
                    .registry_path(),
            };
            let threads = threads_per_run.unwrap_or(spec.threads_per_run).max(1);
            let outcome = kiln::track::sweep::run_index(&plan, index, &registry, threads, set)
                .map_err(sweep_error)?;
            match &outcome {
                IndexOutcome::AlreadyFinished { run_id } => eprintln!(
                    "sweep {} index {index}: already finished as {run_id}; nothing to do",
                    plan.sweep_id
                ),
                IndexOutcome::Finished { run_id, resumed } => eprintln!(
                    "sweep {} index {index}: {} {run_id}",
                    plan.sweep_id,
                    if *resumed {
                        "resumed and finished"
                    } else {
                        "finished"
                    }
                ),
            }
            println!("{}", outcome.run_id());
            Ok(())
        }
        SweepCommand::Summarize {
            spec: file,
            registry,
            json,
        } => {
            let spec = SweepSpec::load(&file).map_err(CliError::input)?;
            let registry = registry_of(&spec, registry)?;
            let plan = kiln::track::sweep::plan(&spec, &file).map_err(sweep_error)?;
            let report = kiln::track::sweep::summarize(&plan, spec.tolerance, &registry)
                .map_err(sweep_error)?;
            print_report(&report, json)
        }
    }
}

/// Options of `kiln sweep`.
pub struct SweepArgs<'a> {
    /// The sweep file.
    pub spec: &'a Path,
    /// Registry override.
    pub registry: Option<&'a Path>,
    /// Override the file's `parallel`.
    pub parallel: Option<usize>,
    /// Override the file's `threads_per_run`.
    pub threads: Option<usize>,
    /// JSON output.
    pub json: bool,
}

/// Run the sweep: each member is its own `kiln train` process (isolating thread pools and
/// crashes) through the library's [`ProcessLauncher`].
pub fn run(args: &SweepArgs<'_>) -> CliResult {
    let spec = SweepSpec::load(args.spec).map_err(CliError::input)?;
    let base = config::load(&spec.base).map_err(CliError::input)?;
    let total = spec.expand().len();
    let parallel = args.parallel.unwrap_or(spec.parallel).max(1);
    let threads = args.threads.unwrap_or(spec.threads_per_run).max(1);
    let registry_path: PathBuf = args
        .registry
        .map(Path::to_path_buf)
        .unwrap_or_else(|| base.config.registry_path());
    eprintln!(
        "sweep {}: {} runs of {} ({} concurrent × {} thread(s) each), registry {}",
        args.spec.display(),
        total,
        spec.base.display(),
        parallel,
        threads,
        registry_path.display()
    );
    // With MLFLOW_TRACKING_URI set, the sweep is a parent run and each member its child.
    let parent =
        kiln::track::mlflow::SweepParent::from_env(args.spec, &serde_json::to_value(&spec)?, &base);
    if let Some(p) = &parent {
        eprintln!(
            "MLflow: parent run {} in experiment {:?}",
            p.state.run_id, p.experiment
        );
    }
    let launcher = ProcessLauncher {
        exe: std::env::current_exe()?,
        env: parent.as_ref().map(|p| p.child_env()).unwrap_or_default(),
    };
    let on_done = |n: usize, total: usize, m: &Member| {
        eprintln!(
            "[{n}/{total}] {} {}",
            m.run_id.as_deref().unwrap_or("FAILED"),
            m.error.as_deref().unwrap_or(&m.overrides.join(" "))
        );
        for w in &m.warnings {
            eprintln!("    {w}");
        }
    };
    let report = run_sweep(
        &spec,
        &launcher,
        &SweepOptions {
            parallel,
            threads,
            registry: &registry_path,
            on_done: Some(&on_done),
        },
    )
    .map_err(|e| {
        if let Some(p) = &parent {
            p.finish(total, total, None);
        }
        match e {
            SweepError::Config(_) => CliError::input(e),
            other => CliError::from(other),
        }
    })?;
    if let Some(p) = &parent {
        p.finish(
            report.runs.len(),
            report.failed,
            report.best.and_then(|b| report.runs[b].val_metric),
        );
    }
    print_report(&report, args.json)
}

/// Print a sweep's members and right-sizing answer; an error when some member failed.
fn print_report(report: &SweepReport, json: bool) -> CliResult {
    let members = &report.runs;
    let failed = report.failed;
    let id = |i: Option<usize>| i.and_then(|i| members[i].run_id.clone());
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "runs": members,
                "tolerance": report.tolerance,
                "best": id(report.best),
                "right_sized": id(report.right_sized),
                "best_index": report.best,
                "right_sized_index": report.right_sized,
                "failed": failed,
                "wall_s": report.wall_s,
            }))?
        );
    } else {
        let mut order: Vec<&Member> = members.iter().collect();
        order.sort_by_key(|m| m.params.unwrap_or(i64::MAX));
        println!(
            "{:<42} {:>7} {:>11} {:>9}  overrides",
            "run", "params", "val loss", "b1 µs"
        );
        for m in order {
            println!(
                "{:<42} {:>7} {:>11} {:>9}  {}",
                m.run_id.as_deref().unwrap_or("FAILED"),
                m.params
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "—".into()),
                m.val_metric
                    .map(|v| format!("{v:.5}"))
                    .unwrap_or_else(|| "—".into()),
                m.latency_b1_p50_us
                    .map(|v| format!("{v:.2}"))
                    .unwrap_or_else(|| "—".into()),
                m.overrides.join(" ")
            );
        }
        match (report.best, report.right_sized) {
            (Some(b), Some(c)) => {
                let (b, c) = (&members[b], &members[c]);
                let params = |m: &Member| m.params.unwrap_or(0) as f64;
                println!(
                    "\nright-sizing: best validation loss {:.5} by {} ({} parameters); the smallest model within {:.1}% of it is {} with {} parameters (validation loss {:.5}, {:.1}× fewer parameters)",
                    b.val_metric.unwrap_or(f64::NAN),
                    b.run_id.as_deref().unwrap_or("?"),
                    params(b),
                    report.tolerance * 100.0,
                    c.run_id.as_deref().unwrap_or("?"),
                    params(c),
                    c.val_metric.unwrap_or(f64::NAN),
                    params(b) / params(c).max(1.0)
                )
            }
            _ => println!("\nright-sizing: no run finished"),
        }
        eprintln!(
            "{} runs in {:.1} s, {} failed",
            members.len(),
            report.wall_s,
            failed
        );
    }
    if failed > 0 {
        return Err(CliError::from(anyhow::anyhow!(
            "{failed} of {} sweep runs failed",
            members.len()
        )));
    }
    Ok(())
}
