//! `kiln pick --checkpoint DIR --legs legs.csv` and `kiln pick evaluate --checkpoint DIR`.

use std::path::{Path, PathBuf};

use super::{CliError, CliResult};
use kiln::artifact::Checkpoint;
use kiln::infer::build_engine;
use kiln::model::mvn::{HaltonMvnCdfConfig, MvnMethod};
use kiln::pick::{self, PickError};
use kiln::predict::Predictor;

/// Options of `kiln pick`.
#[derive(Debug, Clone, clap::Args)]
pub struct PickArgs {
    /// Score the checkpoint's pick probabilities against outcomes instead.
    #[command(subcommand)]
    pub action: Option<PickAction>,
    /// An export directory (or a run directory containing export/).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Legs: columns `target`, `line`, `side` (over/under), optional `pick` (legs with the same
    /// value form one pick; without it the file is one pick), and either every feature column
    /// or the key columns of a rows file.
    #[arg(long)]
    pub legs: Option<PathBuf>,
    /// Rows of features, looked up by the key columns (default: the checkpoint's dataset).
    #[arg(long)]
    pub rows: Option<PathBuf>,
    /// Key columns that name a row.
    #[arg(long, value_delimiter = ',', default_value = "player_id,season")]
    pub key: Vec<String>,
    /// Correlation between targets on different rows, as a JSON k×k matrix (default: rows
    /// independent).
    #[arg(long)]
    pub cross_row_corr: Option<String>,
    /// Halton points per randomisation.
    #[arg(long, default_value_t = 8192)]
    pub points: usize,
    /// Randomisations (the standard error comes from their spread).
    #[arg(long, default_value_t = 16)]
    pub randomizations: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Inference engine (default: `auto`, the fastest exact engine, as everywhere).
    #[arg(long, default_value = kiln::records::AUTO_ENGINE, value_parser = super::parse_engine)]
    pub engine: kiln::records::EngineKind,
    /// One JSON line per pick.
    #[arg(long)]
    pub json: bool,
}

/// `kiln pick` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum PickAction {
    /// On the test split's real rows, build single legs (over the persistence value, else the
    /// training median) and multi-leg picks across each row's targets, and score the predicted
    /// P(hit) against outcomes: Brier score, log loss and a reliability table, next to the
    /// independence assumption and a constant probability (the validation split's hit rate).
    Evaluate(EvaluateArgs),
}

/// Options of `kiln pick evaluate`.
#[derive(Debug, Clone, clap::Args)]
pub struct EvaluateArgs {
    /// An export directory (or a run directory containing export/).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The experiment config that trained it (default: the run directory's config.yaml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Halton points per randomisation.
    #[arg(long, default_value_t = 4096)]
    pub points: usize,
    /// Randomisations.
    #[arg(long, default_value_t = 8)]
    pub randomizations: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The whole evaluation as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Run `kiln pick evaluate`.
pub fn evaluate(a: &EvaluateArgs) -> CliResult {
    use kiln::pick::outcomes;
    let ckpt = Checkpoint::load(&a.checkpoint).map_err(CliError::input)?;
    let config_path = match &a.config {
        Some(p) => p.clone(),
        None => {
            let run_dir = ckpt.dir.parent().unwrap_or(Path::new("."));
            let p = run_dir.join("config.yaml");
            if !p.is_file() {
                return Err(CliError::input(anyhow::anyhow!(
                    "{}: no config.yaml beside the checkpoint (expected a run directory's export/); pass --config FILE",
                    run_dir.display()
                )));
            }
            p
        }
    };
    let loaded = kiln::config::load(&config_path).map_err(CliError::input)?;
    let est = outcomes::EstimatorSettings {
        points: a.points,
        randomizations: a.randomizations,
        seed: a.seed,
    };
    let ev =
        outcomes::evaluate_checkpoint(&ckpt, &loaded.config.data, est).map_err(|e| match e {
            PickError::Infer(_) => CliError::from(e),
            other => CliError::input(other),
        })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&ev)?);
    } else {
        print!("{}", ev.table());
    }
    Ok(())
}

/// Run `kiln pick`.
pub fn run(a: &PickArgs) -> CliResult {
    if let Some(PickAction::Evaluate(e)) = &a.action {
        return evaluate(e);
    }
    let (Some(checkpoint), Some(legs_path)) = (&a.checkpoint, &a.legs) else {
        return Err(CliError::input(anyhow::anyhow!(
            "kiln pick needs --checkpoint DIR and --legs FILE (or the `evaluate` subcommand)"
        )));
    };
    let ckpt = Checkpoint::load(checkpoint).map_err(CliError::input)?;
    let m = &ckpt.manifest;
    let (legs, mut rows) = pick::read_legs(legs_path, m, &a.key).map_err(CliError::input)?;
    if rows.is_empty() {
        let path = a
            .rows
            .clone()
            .unwrap_or_else(|| Path::new(&m.dataset.path).to_path_buf());
        let mut wanted: Vec<&String> = legs.iter().map(|l| &l.row).collect();
        wanted.sort();
        wanted.dedup();
        rows = pick::read_rows(&path, m, &a.key, &wanted).map_err(CliError::input)?;
    }
    let cross = match &a.cross_row_corr {
        Some(text) => {
            let v: Vec<Vec<f64>> = serde_json::from_str(text).map_err(|e| {
                CliError::input(anyhow::anyhow!(
                    "--cross-row-corr: expected a JSON k×k matrix: {e}"
                ))
            })?;
            Some(v.into_iter().flatten().collect())
        }
        None => None,
    };
    let corr = pick::correlation(m, cross);
    let max_legs = {
        let mut counts = std::collections::BTreeMap::new();
        for l in &legs {
            *counts.entry(&l.pick).or_insert(0usize) += 1;
        }
        counts.values().copied().max().unwrap_or(1)
    };
    let mvn = HaltonMvnCdfConfig::new()
        .with_max_dim(max_legs.max(1))
        .with_points(a.points)
        .with_randomizations(a.randomizations)
        .with_seed(a.seed)
        .with_method(MvnMethod::Genz)
        .init::<kiln::backend::Cpu>(&Default::default())
        .map_err(CliError::input)?;
    let engine = build_engine(a.engine, &ckpt.weights, 1).map_err(CliError::input)?;
    let mut predictor = Predictor::for_checkpoint(&ckpt, engine);
    let results =
        pick::evaluate(&mut predictor, &mvn, &corr, &rows, &legs).map_err(|e| match e {
            PickError::Infer(_) => CliError::from(e),
            other => CliError::input(other),
        })?;
    for (name, r) in &results {
        if a.json {
            println!(
                "{}",
                serde_json::json!({"pick": name, "p": r.p, "se": r.se, "independent_p": r.independent_p, "leg_p": r.leg_p})
            );
        } else {
            println!(
                "{name}: P(all {} legs hit) = {:.5} ± {:.5} (if independent: {:.5}; legs: {})",
                r.leg_p.len(),
                r.p,
                r.se,
                r.independent_p,
                r.leg_p
                    .iter()
                    .map(|p| format!("{p:.4}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(())
}
