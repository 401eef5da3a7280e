//! `kiln promote --checkpoint RUN_OR_EXPORT --repository DIR --model NAME`: the gate between a retraining
//! run and the model repository `kiln serve` polls (behaviour in `kiln::track::promote`).

use std::path::PathBuf;
use std::time::Duration;

use super::{CliError, CliResult};
use kiln::track::promote::{
    Gates, NightFailure, Outcome, PromoteOptions, parse_fraction, promote, record_failure,
};

/// Compare a candidate checkpoint with the version served from `DIR/NAME/` (the highest that
/// loads) on the candidate's test split — the rows the run held out, from the data file it
/// trained on (its SHA-256 is checked) — and on the same latency benchmark (same engine, this
/// machine, now, interleaved). Quality is compared paired, row by row, with a bootstrap
/// confidence interval: a target's MSE or the mean NLL refuses the candidate only when it is
/// worse with --confidence beyond a small practical margin (--max-mse-increase, default 2 %;
/// --max-nll-increase), so test-set noise does not flip the decision and a real regression
/// of a few per cent is refused; the median latency at batch 1 and 128 must stay
/// below --max-latency-ratio times the served one's. A promoted candidate is written to
/// `DIR/NAME/<next>/` atomically (a polling server never sees part of it). The decision and
/// its numbers are printed and recorded in the run registry's `promotions` table (`kiln runs
/// promotions`).
///
/// Exit codes: 0 promoted (or would be, with --dry-run), 3 refused (worse beyond noise, slower,
/// or not finite), 4 nothing to do (the served weights again — what a rerun on unchanged data
/// reproduces: a scheduled job treats it as success), 2 bad input (including a data file that changed since
/// the run), 1 failure.
#[derive(clap::Args, Debug, Clone)]
pub struct PromoteArgs {
    /// The candidate: a run directory (with `export/` and `config.yaml`) or an export
    /// directory (`--checkpoint`, as `kiln predict`, `pick` and `export` spell it).
    #[arg(
        long = "checkpoint",
        value_name = "DIR",
        required_unless_present = "candidate_arg",
        value_parser = path_or_empty
    )]
    pub candidate: Option<PathBuf>,
    /// The candidate, positionally (the older spelling; hidden).
    #[arg(
        value_name = "RUN_OR_EXPORT",
        hide = true,
        conflicts_with = "candidate"
    )]
    pub candidate_arg: Option<PathBuf>,
    /// The model repository served by `kiln serve --repository DIR`.
    #[arg(long, value_name = "DIR")]
    pub repository: PathBuf,
    /// The model's name: versions live in `DIR/NAME/<version>/`.
    #[arg(long, value_name = "NAME")]
    pub model: String,
    /// The config whose data and test split to compare on (default: the run's config.yaml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Engine to measure both models with (default: the serving default).
    #[arg(long, value_parser = super::parse_engine)]
    pub engine: Option<kiln::records::EngineKind>,
    /// The practical margin on any target's test MSE: `2%` or `0.02`. Refused only when the
    /// increase's lower confidence bound exceeds it (worse beyond noise by more than this).
    #[arg(long, default_value = "2%", value_parser = parse_fraction, value_name = "FRACTION")]
    pub max_mse_increase: f64,
    /// Tolerated increase of the mean test Gaussian NLL (nats per value), in the same way.
    #[arg(long, default_value_t = 0.02, value_name = "NATS")]
    pub max_nll_increase: f64,
    /// One-sided confidence of the paired bootstrap bounds: `95%` or `0.95`.
    #[arg(long, default_value = "95%", value_parser = parse_fraction, value_name = "FRACTION")]
    pub confidence: f64,
    /// Resample the test rows by this column (e.g. `player_id`): rows of one group move
    /// together in the bootstrap.
    #[arg(long, value_name = "COLUMN")]
    pub group: Option<String>,
    /// Evaluate on this data file instead of the one the candidate trained on (whose SHA-256
    /// must otherwise be unchanged).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Refused when the candidate's median latency is this many times the served one's or
    /// more, at batch 1 or 128.
    #[arg(long, default_value_t = 1.5, value_name = "RATIO")]
    pub max_latency_ratio: f64,
    /// Refuse when any target's test CRPS is worse than the served one's by more than this
    /// (`5%` or `0.05`; default: the row is shown, not enforced).
    #[arg(long, value_parser = parse_fraction, value_name = "FRACTION")]
    pub max_crps_increase: Option<f64>,
    /// Refuse when any target's test calibration error (PIT miscalibration area) exceeds the
    /// served one's by more than this (absolute, e.g. 0.02; default: shown, not enforced).
    #[arg(long, value_name = "DELTA")]
    pub max_calibration_error_increase: Option<f64>,
    /// Timed milliseconds per model and batch size.
    #[arg(long, default_value_t = 400, value_name = "MS")]
    pub latency_ms: u64,
    /// Measure and compare only: write no version and record nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// After promoting keep the N newest versions (the served and the new one always stay).
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,
    /// Run registry to record the decision in: an SQLite file, `sqlite:///path` or
    /// `postgres://…` (default: the config's).
    #[arg(long, value_name = "REGISTRY")]
    pub registry: Option<PathBuf>,
    /// Print the decision as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Print only the verdict line (the checks stay in the registry).
    #[arg(short, long, conflicts_with = "json")]
    pub quiet: bool,
    /// The exit code of the `kiln train` that was to produce --checkpoint (the nightly
    /// script passes `$?`). Not 0: the night failed in training — nothing is compared, one
    /// `failed` row with the code and the reason (the last line of --train-log) goes into
    /// `kiln runs promotions`, and `kiln promote` exits with CODE, so the script keeps the
    /// training step's exit code. --checkpoint may then be empty.
    #[arg(long, value_name = "CODE", default_value_t = 0)]
    pub train_exit: u8,
    /// With a failed --train-exit: the training step's log (its stderr); its last line is the
    /// recorded reason.
    #[arg(long, value_name = "FILE")]
    pub train_log: Option<PathBuf>,
}

/// A path, or empty (what `$(kiln train …)` gives when training failed).
fn path_or_empty(text: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(text))
}

impl PromoteArgs {
    /// The candidate, however it was given (clap requires one of the two).
    pub fn candidate_path(&self) -> &std::path::Path {
        self.candidate
            .as_deref()
            .or(self.candidate_arg.as_deref())
            .unwrap_or(std::path::Path::new("."))
    }
}

/// The last non-empty line of a training log (the error `kiln train` ended with).
fn last_line(path: &std::path::Path) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    String::from_utf8_lossy(&text)
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

/// A failed `--train-exit CODE`: record the failed night, then exit with its code.
fn record_train_failure(a: &PromoteArgs, code: u8) -> CliResult {
    let registry = match (&a.registry, &a.config) {
        (Some(r), _) => r.clone(),
        (None, Some(c)) => kiln::config::load(c)
            .map_err(CliError::input)?
            .config
            .registry_path(),
        (None, None) => {
            return Err(CliError::input(anyhow::anyhow!(
                "--train-exit {code}: recording the failed night needs the registry: pass --registry or --config"
            )));
        }
    };
    let reason = a
        .train_log
        .as_deref()
        .and_then(last_line)
        .unwrap_or_else(|| format!("kiln train exited with {code}"));
    let reg = kiln::track::registry::Registry::open(&registry)?;
    let failure = NightFailure {
        repository: a.repository.clone(),
        model: a.model.clone(),
        candidate: None,
        run_id: None,
        step: "train".into(),
        exit_code: code,
        reason: reason.trim().to_string(),
    };
    let id = record_failure(&reg, &failure).map_err(CliError::input)?;
    Err(CliError {
        code,
        error: anyhow::anyhow!(
            "night failed in kiln train (exit {code}), recorded as promotion {id} of {}: {}",
            a.model,
            failure.reason
        ),
    })
}

/// Run the gate and print the decision.
pub fn run(a: &PromoteArgs) -> CliResult {
    if a.train_exit != 0 {
        return record_train_failure(a, a.train_exit);
    }
    if a.candidate_path().as_os_str().is_empty() {
        return Err(CliError::input(anyhow::anyhow!(
            "--checkpoint is empty (did the training step fail? pass its exit code with --train-exit)"
        )));
    }
    let opts = PromoteOptions {
        config: a.config.clone(),
        engine: a.engine,
        gates: Gates {
            max_mse_increase: a.max_mse_increase,
            max_nll_increase: a.max_nll_increase,
            max_latency_ratio: a.max_latency_ratio,
            max_crps_increase: a.max_crps_increase,
            max_calibration_error_increase: a.max_calibration_error_increase,
            confidence: a.confidence,
            ..Gates::default()
        },
        data: a.data.clone(),
        group: a.group.clone(),
        latency_budget: Duration::from_millis(a.latency_ms.max(1)),
        dry_run: a.dry_run,
        keep: a.keep,
        registry: a.registry.clone(),
        ..PromoteOptions::new(a.candidate_path(), &a.repository, &a.model)
    };
    let p = promote(&opts).map_err(|e| {
        if e.is_input() {
            CliError::input(e)
        } else {
            CliError::from(e)
        }
    })?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&p).expect("promotion serialises")
        );
    } else if a.quiet {
        let report = p.report();
        println!("{}", report.lines().last().unwrap_or_default());
    } else {
        print!("{}", p.report());
    }
    match p.decision.outcome {
        Outcome::Promoted => Ok(()),
        Outcome::NothingToDo => Err(CliError {
            code: Outcome::NothingToDo.exit_code(),
            error: anyhow::anyhow!(
                "nothing to do for {}: {}",
                p.candidate.display(),
                p.decision.reasons().join("; ")
            ),
        }),
        Outcome::Refused => Err(CliError {
            code: Outcome::Refused.exit_code(),
            error: anyhow::anyhow!(
                "promotion of {} refused: {}",
                p.candidate.display(),
                p.decision.reasons().join("; ")
            ),
        }),
    }
}
