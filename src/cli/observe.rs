//! `kiln profile infer`, `kiln profile diff`, `kiln doctor`.

use std::path::{Path, PathBuf};

use super::{CliError, CliResult};
use kiln::bench::BenchError;
use kiln::bench::profile::ProfileInferOptions;
use kiln::observe::profiler::{self, KeyAverages, SortBy};

/// Options of `kiln profile infer`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileInferArgs {
    /// An export or run directory (default: the reference network, seeded weights).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// The reference network 20 → 48 → 48 → 3+3 (the default without --checkpoint).
    #[arg(long, conflicts_with = "checkpoint")]
    pub reference: bool,
    /// Inference engine (default: `auto`, the fastest exact engine, as everywhere; `burn`
    /// shows the network's module spans).
    #[arg(long, default_value = kiln::records::AUTO_ENGINE, value_parser = super::parse_engine)]
    pub engine: kiln::records::EngineKind,
    /// Rows per call.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Recorded iterations.
    #[arg(long, default_value_t = 200)]
    pub iters: u64,
    /// Warm-up iterations (not recorded).
    #[arg(long, default_value_t = 50)]
    pub warmup: u64,
    /// Engine threads (0 = its default).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Output directory.
    #[arg(long, default_value = "profile-infer")]
    pub out: PathBuf,
    /// Seed of the inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Group the table by input shape.
    #[arg(long)]
    pub record_shapes: bool,
    /// Record resident-memory deltas per span.
    #[arg(long)]
    pub profile_memory: bool,
    /// Record each span's source location.
    #[arg(long)]
    pub with_stack: bool,
}

impl ProfileInferArgs {
    fn options(&self) -> ProfileInferOptions {
        ProfileInferOptions {
            checkpoint: self.checkpoint.clone(),
            engine: self.engine,
            batch: self.batch,
            iters: self.iters,
            warmup: self.warmup,
            threads: self.threads,
            out: self.out.clone(),
            seed: self.seed,
            record_shapes: self.record_shapes,
            profile_memory: self.profile_memory,
            with_stack: self.with_stack,
        }
    }
}

/// `kiln profile infer`.
pub fn profile_infer(args: &ProfileInferArgs) -> CliResult {
    let o = kiln::bench::profile::profile_infer(&args.options()).map_err(|e| match e {
        BenchError::Invalid(_) | BenchError::Artifact(_) | BenchError::Infer(_) => {
            CliError::input(e)
        }
        other => CliError::from(other),
    })?;
    eprint!("{}", o.averages.table(SortBy::Total, 30));
    println!("{}", super::printed(&o.table_json).display());
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
    let ta = KeyAverages::load(&table_path(a)).map_err(CliError::input)?;
    let tb = KeyAverages::load(&table_path(b)).map_err(CliError::input)?;
    let rows = profiler::diff(&ta, &tb);
    if let Some(w) = profiler::kind_mismatch(&ta, &tb) {
        eprintln!("warning: {w}");
    }
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
    let r = kiln::doctor::report();
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.text());
    }
    Ok(())
}
