//! Gated promotion from a finished run to a served model repository (`kiln promote`).
//!
//! A candidate checkpoint (a run directory or its `export/`) is compared with the version a
//! `kiln serve` of the repository serves for the model — the highest numeric version
//! directory of `DIR/NAME/` that loads, as [`serve::repository`](../serve/repository/index.html)
//! picks it — on the same test split (the candidate's config's data and split) and the same
//! latency benchmark (same engine, this machine, now, the two models timed in interleaved
//! rounds so a load change on the machine hits both alike). It is promoted only when every
//! check passes:
//!
//! * **quality**: no target's test MSE worse than the served one's by more than
//!   [`Gates::max_mse_increase`] (a fraction, `0.05` = 5 %), and the mean Gaussian NLL no
//!   worse by more than [`Gates::max_nll_increase`] (nats per value);
//! * **uncertainty** (rows named `uncertainty …`, kept apart so the rule can become a paired
//!   one): per target, the test CRPS no worse than [`Gates::max_crps_increase`] (relative) and
//!   the PIT calibration error no worse than [`Gates::max_calibration_error_increase`]
//!   (absolute); without a limit the rows are shown and pass;
//! * **latency**: the median at each benchmark batch size (1 and 128) below
//!   [`Gates::max_latency_ratio`] (1.5×, the registry's regression rule) times the served
//!   one's;
//! * the candidate is not byte-for-byte the served version.
//!
//! A first version (no loadable version in `DIR/NAME/`) is promoted after the checks that need
//! no incumbent: the checkpoint verifies, its features and targets match the data, its test
//! metrics are finite and its latency could be measured.
//!
//! A promoted candidate is written to `DIR/NAME/<next>/` atomically: its files are copied into
//! a temporary directory whose name starts with `.` (the server ignores those) on the same
//! filesystem, each file and the directory are fsynced, then the directory is renamed to its
//! version number and the model directory fsynced — a polling server sees no version or the
//! whole version, never part of one. `<next>` is one more than the highest numeric directory
//! (rejected versions included, so a new version is never mistaken for a rejected one).
//! `keep` then prunes the oldest versions, never the served one nor the new one; a pruned
//! version is renamed to a dot-directory first, so it disappears from a scan at once.
//!
//! Every decision (promoted or refused, with the numbers) is recorded in the run registry's
//! `promotions` table, except in a dry run, which only measures and compares.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::artifact::{ArtifactError, Checkpoint, resolve_dir};
use crate::bench::latency::serving_engine;
use crate::config::{self, ConfigError};
use crate::data::{DataError, Dataset, Subset};
use crate::infer::{InferError, build_engine};
use crate::predict::{Prediction, Predictor};
use crate::registry::{PromotionRow, Registry, RegistryError};
use crate::rng::SplitMix64;
use crate::train::uncertainty;
use crate::util;

/// Why a promotion could not be decided or carried out.
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    /// The candidate is not a loadable, verified checkpoint.
    #[error("candidate {path}: {source}")]
    Candidate {
        /// The path given.
        path: PathBuf,
        /// Why it does not load.
        source: ArtifactError,
    },
    /// No config to take the test split from.
    #[error(
        "{dir}: no config.yaml beside the export (is it inside a run directory?); pass --config FILE with the data and split to compare on"
    )]
    NoConfig {
        /// The candidate's export directory.
        dir: PathBuf,
    },
    /// The config does not load.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The data does not load.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The models cannot be compared on one split.
    #[error("{0}")]
    Incompatible(String),
    /// An argument is invalid.
    #[error("{0}")]
    Invalid(String),
    /// The engine could not be built or run.
    #[error(transparent)]
    Engine(#[from] InferError),
    /// A file operation on the repository failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The registry could not record the decision.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl PromoteError {
    /// Bad input (exit code 2) rather than a runtime failure.
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            Self::Candidate { .. }
                | Self::NoConfig { .. }
                | Self::Config(_)
                | Self::Data(_)
                | Self::Incompatible(_)
                | Self::Invalid(_)
                | Self::Engine(_)
        )
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PromoteError + '_ {
    move |source| PromoteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The thresholds of the gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gates {
    /// Largest allowed relative increase of any target's test MSE (0.05 = 5 %).
    pub max_mse_increase: f64,
    /// Largest allowed increase of the mean test Gaussian NLL (nats per value).
    pub max_nll_increase: f64,
    /// The candidate's median latency must stay below this multiple of the served one's at
    /// every benchmark batch size (the registry's regression rule: 1.5).
    pub max_latency_ratio: f64,
    /// Uncertainty gate (absent: the rows are shown, not enforced): largest allowed relative
    /// increase of any target's test CRPS (0.05 = 5 %).
    #[serde(default)]
    pub max_crps_increase: Option<f64>,
    /// Uncertainty gate (absent: shown, not enforced): largest allowed absolute increase of any
    /// target's test calibration error (the PIT miscalibration area, 0 … 0.5).
    #[serde(default)]
    pub max_calibration_error_increase: Option<f64>,
}

impl Default for Gates {
    fn default() -> Self {
        Self {
            max_mse_increase: 0.05,
            max_nll_increase: 0.05,
            max_latency_ratio: 1.5,
            max_crps_increase: None,
            max_calibration_error_increase: None,
        }
    }
}

/// Parse a non-negative fraction written as `5%` or `0.05`.
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (num, per) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 100.0),
        None => (t, 1.0),
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v / per),
        _ => Err(format!(
            "{text:?} is not a non-negative fraction (expected e.g. `5%` or `0.05`)"
        )),
    }
}

/// One target's test metrics (original units).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetQuality {
    /// The target column.
    pub target: String,
    /// Mean squared error of the predicted mean.
    pub mse: f64,
    /// Mean Gaussian NLL of the predicted mean and standard deviation.
    pub nll: f64,
    /// Mean CRPS of the predicted Gaussian.
    #[serde(default)]
    pub crps: f64,
    /// PIT miscalibration area (see `kiln_core::train::uncertainty`).
    #[serde(default)]
    pub calibration_error: f64,
}

/// A model's test metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quality {
    /// Test rows.
    pub rows: usize,
    /// One entry per target.
    pub targets: Vec<TargetQuality>,
    /// Mean Gaussian NLL over every test value.
    pub nll: f64,
}

/// The median latency at one batch size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchP50 {
    /// Rows per call.
    pub batch: usize,
    /// Median µs per call.
    pub p50_us: f64,
    /// Timed calls.
    pub iters: usize,
}

/// What was measured of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Test metrics.
    pub quality: Quality,
    /// Median latency per batch size.
    pub latency: Vec<BatchP50>,
    /// SHA-256 of the weights file.
    pub weights_sha256: String,
}

/// One check of the gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// What is checked, e.g. `mse hr_rate`, `latency b1`.
    pub name: String,
    /// The candidate's value.
    pub candidate: f64,
    /// The served version's value.
    pub incumbent: Option<f64>,
    /// The limit the candidate's value must respect.
    pub limit: Option<f64>,
    /// Whether it passed.
    pub passed: bool,
    /// One line of explanation.
    pub detail: String,
}

/// The gate's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Every check passed.
    pub promoted: bool,
    /// The checks, in order.
    pub checks: Vec<Check>,
}

impl Decision {
    /// The failed checks' explanations.
    pub fn reasons(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.detail.clone())
            .collect()
    }
}

/// Decide from measurements (no I/O, so the rule can be tested with any numbers).
pub fn decide(gates: &Gates, candidate: &Measurement, incumbent: Option<&Measurement>) -> Decision {
    let mut checks = Vec::new();
    let q = &candidate.quality;
    let finite = q.nll.is_finite() && q.targets.iter().all(|t| t.mse.is_finite());
    checks.push(Check {
        name: "finite test metrics".into(),
        candidate: q.nll,
        incumbent: None,
        limit: None,
        passed: finite && q.rows > 0,
        detail: if q.rows == 0 {
            "the test split is empty".into()
        } else if finite {
            format!("test metrics finite on {} rows", q.rows)
        } else {
            "the candidate's test MSE or NLL is not finite".into()
        },
    });
    let measured = !candidate.latency.is_empty()
        && candidate
            .latency
            .iter()
            .all(|b| b.p50_us.is_finite() && b.p50_us > 0.0);
    checks.push(Check {
        name: "latency measured".into(),
        candidate: candidate.latency.first().map_or(f64::NAN, |b| b.p50_us),
        incumbent: None,
        limit: None,
        passed: measured,
        detail: if measured {
            "latency measured".into()
        } else {
            "the candidate's latency could not be measured".into()
        },
    });
    let Some(inc) = incumbent else {
        return Decision {
            promoted: checks.iter().all(|c| c.passed),
            checks,
        };
    };
    let identical = inc.weights_sha256 == candidate.weights_sha256;
    checks.push(Check {
        name: "differs from served".into(),
        candidate: 0.0,
        incumbent: None,
        limit: None,
        passed: !identical,
        detail: if identical {
            "the candidate's weights are the served version's".into()
        } else {
            "new weights".into()
        },
    });
    for t in &q.targets {
        let Some(it) = inc.quality.targets.iter().find(|x| x.target == t.target) else {
            checks.push(Check {
                name: format!("mse {}", t.target),
                candidate: t.mse,
                incumbent: None,
                limit: None,
                passed: false,
                detail: format!("the served version has no target {}", t.target),
            });
            continue;
        };
        let limit = it.mse * (1.0 + gates.max_mse_increase);
        let passed = t.mse <= limit;
        let change = (t.mse / it.mse - 1.0) * 100.0;
        checks.push(Check {
            name: format!("mse {}", t.target),
            candidate: t.mse,
            incumbent: Some(it.mse),
            limit: Some(limit),
            passed,
            detail: format!(
                "test MSE of {} {:.6} vs served {:.6} ({change:+.2} %, limit {:+.2} %)",
                t.target,
                t.mse,
                it.mse,
                gates.max_mse_increase * 100.0
            ),
        });
    }
    let limit = inc.quality.nll + gates.max_nll_increase;
    checks.push(Check {
        name: "nll".into(),
        candidate: q.nll,
        incumbent: Some(inc.quality.nll),
        limit: Some(limit),
        passed: q.nll <= limit,
        detail: format!(
            "test NLL {:.4} vs served {:.4} ({:+.4}, limit {:+.4})",
            q.nll,
            inc.quality.nll,
            q.nll - inc.quality.nll,
            gates.max_nll_increase
        ),
    });
    checks.extend(uncertainty_checks(gates, q, &inc.quality));
    for b in &candidate.latency {
        let Some(ib) = inc.latency.iter().find(|x| x.batch == b.batch) else {
            continue;
        };
        let ratio = b.p50_us / ib.p50_us;
        let passed = ratio.is_finite() && ratio < gates.max_latency_ratio;
        checks.push(Check {
            name: format!("latency b{}", b.batch),
            candidate: b.p50_us,
            incumbent: Some(ib.p50_us),
            limit: Some(ib.p50_us * gates.max_latency_ratio),
            passed,
            detail: format!(
                "p50 latency at batch {} {:.2} µs vs served {:.2} µs ({ratio:.2}×, limit < {:.2}×)",
                b.batch, b.p50_us, ib.p50_us, gates.max_latency_ratio
            ),
        });
    }
    Decision {
        promoted: checks.iter().all(|c| c.passed),
        checks,
    }
}

/// The uncertainty rows of the gate, one per target for CRPS and for calibration error, kept
/// apart from the MSE/NLL rows so that the rule (today a tolerance against the served version)
/// can be switched to a paired one alone. Without a limit a row is shown and passes.
pub fn uncertainty_checks(gates: &Gates, cand: &Quality, inc: &Quality) -> Vec<Check> {
    let mut checks = Vec::new();
    for t in &cand.targets {
        let Some(it) = inc.targets.iter().find(|x| x.target == t.target) else {
            continue;
        };
        let limit = gates.max_crps_increase.map(|f| it.crps * (1.0 + f));
        checks.push(Check {
            name: format!("uncertainty crps {}", t.target),
            candidate: t.crps,
            incumbent: Some(it.crps),
            limit,
            passed: limit.is_none_or(|l| t.crps.is_finite() && t.crps <= l),
            detail: format!(
                "test CRPS of {} {:.6} vs served {:.6} ({:+.2} %, {})",
                t.target,
                t.crps,
                it.crps,
                (t.crps / it.crps - 1.0) * 100.0,
                gates
                    .max_crps_increase
                    .map(|f| format!("limit {:+.2} %", f * 100.0))
                    .unwrap_or_else(|| "no limit: --max-crps-increase".into())
            ),
        });
        let limit = gates
            .max_calibration_error_increase
            .map(|d| it.calibration_error + d);
        checks.push(Check {
            name: format!("uncertainty calibration {}", t.target),
            candidate: t.calibration_error,
            incumbent: Some(it.calibration_error),
            limit,
            passed: limit
                .is_none_or(|l| t.calibration_error.is_finite() && t.calibration_error <= l),
            detail: format!(
                "test calibration error of {} {:.4} vs served {:.4} ({:+.4}, {})",
                t.target,
                t.calibration_error,
                it.calibration_error,
                t.calibration_error - it.calibration_error,
                gates
                    .max_calibration_error_increase
                    .map(|d| format!("limit {d:+.4}"))
                    .unwrap_or_else(|| "no limit: --max-calibration-error-increase".into())
            ),
        });
    }
    checks
}

/// Test metrics of `predictor` on `split` (original units).
pub fn quality(
    predictor: &mut Predictor,
    targets: &[String],
    split: &Subset,
) -> Result<Quality, InferError> {
    let rows = split.rows();
    let nf = predictor.n_features();
    let k = targets.len();
    let mut sse = vec![0.0f64; k];
    let mut snll = vec![0.0f64; k];
    // Per target (y, μ, σ) for the uncertainty scores.
    let mut cols: Vec<[Vec<f64>; 3]> = (0..k).map(|_| [vec![], vec![], vec![]]).collect();
    let mut out = Prediction {
        mean: Vec::new(),
        std: Vec::new(),
    };
    const CHUNK: usize = 1024;
    for start in (0..rows).step_by(CHUNK) {
        let end = (start + CHUNK).min(rows);
        predictor.predict_into(&split.x[start * nf..end * nf], end - start, &mut out)?;
        for (i, (&m, &s)) in out.mean.iter().zip(&out.std).enumerate() {
            let j = i % k;
            let y = split.y[start * k + i] as f64;
            let (m, s) = (m as f64, s as f64);
            sse[j] += (y - m).powi(2);
            snll[j] += util::HALF_LN_2PI + util::gaussian_nll(y, m, 2.0 * s.ln());
            cols[j][0].push(y);
            cols[j][1].push(m);
            cols[j][2].push(s);
        }
    }
    let n = rows.max(1) as f64;
    Ok(Quality {
        rows,
        targets: targets
            .iter()
            .enumerate()
            .map(|(j, t)| {
                let [y, mu, sd] = &cols[j];
                let pit = uncertainty::pit(y, mu, sd);
                TargetQuality {
                    target: t.clone(),
                    mse: sse[j] / n,
                    nll: snll[j] / n,
                    crps: uncertainty::crps(y, mu, sd, None),
                    calibration_error: uncertainty::calibration_error(&pit, None),
                }
            })
            .collect(),
        nll: snll.iter().sum::<f64>() / (n * k.max(1) as f64),
    })
}

/// Median latencies of two predictors measured side by side: at each batch size both see the
/// same seeded inputs, are warmed up, then timed in `rounds` alternating rounds (the order
/// flips every round) of about `budget / rounds` each, so both share the machine's state.
pub fn latency_side_by_side(
    predictors: &mut [&mut Predictor],
    features: &[crate::data::ColumnStats],
    batches: &[usize],
    budget: Duration,
    rounds: usize,
) -> Result<Vec<Vec<BatchP50>>, InferError> {
    let rounds = rounds.max(1);
    let slice = budget / rounds as u32;
    let mut out: Vec<Vec<BatchP50>> = vec![Vec::new(); predictors.len()];
    let mut pred = Prediction {
        mean: Vec::new(),
        std: Vec::new(),
    };
    for &batch in batches {
        let mut r = SplitMix64::derive(0x1a7e, &[batch as u64]);
        let x: Vec<f32> = (0..batch)
            .flat_map(|_| {
                features
                    .iter()
                    .map(|f| (f.mean + f.std * r.normal()) as f32)
                    .collect::<Vec<_>>()
            })
            .collect();
        for p in predictors.iter_mut() {
            for _ in 0..20 {
                p.predict_into(&x, batch, &mut pred)?;
            }
        }
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); predictors.len()];
        for round in 0..rounds {
            let n = predictors.len();
            for step in 0..n {
                let i = if round % 2 == 0 { step } else { n - 1 - step };
                let start = Instant::now();
                let mut calls = 0;
                while calls < 5 || start.elapsed() < slice {
                    let t = Instant::now();
                    predictors[i].predict_into(&x, batch, &mut pred)?;
                    times[i].push(t.elapsed().as_secs_f64() * 1e6);
                    calls += 1;
                    if calls >= 200_000 {
                        break;
                    }
                }
            }
        }
        for (i, mut t) in times.into_iter().enumerate() {
            t.sort_by(f64::total_cmp);
            out[i].push(BatchP50 {
                batch,
                p50_us: util::percentile(&t, 0.5),
                iters: t.len(),
            });
        }
    }
    Ok(out)
}

/// Numeric version directories of a model directory, ascending, by the layout rule the server
/// reads with ([`kiln_core::records::repository`]). A missing directory has none.
pub fn versions(model_dir: &Path) -> Result<Vec<(u64, PathBuf)>, PromoteError> {
    match crate::records::repository::version_dirs(model_dir) {
        Ok(v) => Ok(v),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(model_dir)(e)),
    }
}

/// The version a server of the repository serves: the highest that loads, with its checkpoint.
/// Versions that do not load (a pick model, a broken copy) are skipped with a warning.
pub fn served_version(model_dir: &Path) -> Result<Option<(u64, Checkpoint)>, PromoteError> {
    for (v, dir) in versions(model_dir)?.into_iter().rev() {
        match Checkpoint::load(&dir) {
            Ok(c) => return Ok(Some((v, c))),
            Err(e) => tracing::warn!(
                version = v,
                "{}: not a loadable checkpoint, so not the served version: {e}",
                dir.display()
            ),
        }
    }
    Ok(None)
}

/// Copy the files of `from` into `model_dir/<version>/` atomically (see the module docs);
/// when that version appears meanwhile (another promoter), the next free number is taken.
/// Returns the version written.
pub fn install_version(model_dir: &Path, from: &Path, version: u64) -> Result<u64, PromoteError> {
    let created = !model_dir.exists();
    std::fs::create_dir_all(model_dir).map_err(io(model_dir))?;
    if created && let Some(parent) = model_dir.parent() {
        util::sync_dir(parent).map_err(io(parent))?;
    }
    let tmp = model_dir.join(format!(".promote.tmp-{}-{version}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io(&tmp))?;
    let result = (|| {
        for e in std::fs::read_dir(from).map_err(io(from))? {
            let e = e.map_err(io(from))?;
            if !e.file_type().map_err(io(&e.path()))?.is_file() {
                continue;
            }
            let dest = tmp.join(e.file_name());
            std::fs::copy(e.path(), &dest).map_err(io(&e.path()))?;
            std::fs::File::open(&dest)
                .and_then(|f| f.sync_all())
                .map_err(io(&dest))?;
        }
        util::sync_dir(&tmp).map_err(io(&tmp))?;
        let mut v = version;
        loop {
            let dest = model_dir.join(v.to_string());
            // A rename onto an existing *empty* directory would replace it: never try one.
            if !dest.exists() {
                match std::fs::rename(&tmp, &dest) {
                    Ok(()) => break,
                    Err(e) if dest.exists() => {
                        tracing::debug!("{}: taken meanwhile ({e})", dest.display())
                    }
                    Err(e) => return Err(io(&dest)(e)),
                }
            }
            v += 1;
            if v > version + 1000 {
                return Err(PromoteError::Invalid(format!(
                    "{}: no free version number after {version}",
                    model_dir.display()
                )));
            }
        }
        util::sync_dir(model_dir).map_err(io(model_dir))?;
        Ok(v)
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Remove all but the `keep` highest versions of `model_dir`, never one in `protect`. Each
/// is renamed to a dot-directory first (gone from a scan at once), then deleted. Returns the
/// versions removed.
pub fn prune(model_dir: &Path, keep: usize, protect: &[u64]) -> Result<Vec<u64>, PromoteError> {
    let mut removed = Vec::new();
    let all = versions(model_dir)?;
    let n = all.len();
    for (i, (v, dir)) in all.into_iter().enumerate() {
        if i + keep >= n || protect.contains(&v) {
            continue;
        }
        let hidden = model_dir.join(format!(".pruned-{v}-{}", std::process::id()));
        std::fs::rename(&dir, &hidden).map_err(io(&dir))?;
        std::fs::remove_dir_all(&hidden).map_err(io(&hidden))?;
        removed.push(v);
    }
    if !removed.is_empty() {
        util::sync_dir(model_dir).map_err(io(model_dir))?;
    }
    Ok(removed)
}

/// What to promote where, and how to judge it.
#[derive(Debug, Clone)]
pub struct PromoteOptions {
    /// A run directory or its `export/` checkpoint.
    pub candidate: PathBuf,
    /// The model repository root.
    pub repository: PathBuf,
    /// The model's name (`DIR/NAME/`).
    pub model: String,
    /// The config whose data and split to test on (default: the run's `config.yaml`).
    pub config: Option<PathBuf>,
    /// The engine to measure with (default: the serving default).
    pub engine: Option<String>,
    /// The thresholds.
    pub gates: Gates,
    /// Benchmark batch sizes.
    pub batches: Vec<usize>,
    /// Timed latency per model and batch size.
    pub latency_budget: Duration,
    /// Measure and compare only: write nothing, record nothing.
    pub dry_run: bool,
    /// After a promotion keep this many versions (never removing the served or new one).
    pub keep: Option<usize>,
    /// The registry file (default: the config's `registry.path`, else `<export.dir>/runs.db`).
    pub registry: Option<PathBuf>,
}

impl PromoteOptions {
    /// Default gates and benchmark for a candidate, repository and model.
    pub fn new(candidate: &Path, repository: &Path, model: &str) -> Self {
        Self {
            candidate: candidate.to_path_buf(),
            repository: repository.to_path_buf(),
            model: model.to_string(),
            config: None,
            engine: None,
            gates: Gates::default(),
            batches: vec![1, 128],
            latency_budget: Duration::from_millis(400),
            dry_run: false,
            keep: None,
            registry: None,
        }
    }
}

/// The outcome of `kiln promote`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Promotion {
    /// The model.
    pub model: String,
    /// The repository root.
    pub repository: PathBuf,
    /// The candidate's export directory.
    pub candidate: PathBuf,
    /// The run that produced the candidate.
    pub run_id: String,
    /// The engine measured.
    pub engine: String,
    /// The served version compared against.
    pub incumbent_version: Option<u64>,
    /// The version written (None when refused or in a dry run).
    pub version: Option<u64>,
    /// Versions removed by `keep`.
    pub pruned: Vec<u64>,
    /// The candidate's numbers.
    pub candidate_measurement: Measurement,
    /// The served version's numbers.
    pub incumbent_measurement: Option<Measurement>,
    /// The verdict.
    pub decision: Decision,
    /// Nothing was written.
    pub dry_run: bool,
    /// The registry row's id (None in a dry run).
    pub registry_id: Option<i64>,
}

impl Promotion {
    /// A human-readable report: one line per check, then the verdict.
    pub fn report(&self) -> String {
        let mut s = format!(
            "model {} in {} · candidate {} (run {}) · engine {}\n",
            self.model,
            self.repository.display(),
            self.candidate.display(),
            self.run_id,
            self.engine
        );
        match self.incumbent_version {
            Some(v) => s.push_str(&format!("served version: {v}\n")),
            None => s.push_str("served version: none (first version)\n"),
        }
        for c in &self.decision.checks {
            s.push_str(&format!(
                "  {} {:<22} {}\n",
                if c.passed { "ok  " } else { "FAIL" },
                c.name,
                c.detail
            ));
        }
        let verdict = match (self.decision.promoted, self.dry_run, self.version) {
            (true, true, _) => "would promote (dry run: nothing written)".to_string(),
            (true, false, Some(v)) => format!(
                "promoted: {}",
                self.repository
                    .join(&self.model)
                    .join(v.to_string())
                    .display()
            ),
            (true, false, None) => "promoted".to_string(),
            (false, true, _) => format!(
                "would refuse (dry run): {}",
                self.decision.reasons().join("; ")
            ),
            (false, false, _) => format!("refused: {}", self.decision.reasons().join("; ")),
        };
        s.push_str(&verdict);
        if !self.pruned.is_empty() {
            s.push_str(&format!(" · pruned versions {:?}", self.pruned));
        }
        s.push('\n');
        s
    }
}

fn check_model_name(name: &str) -> Result<(), PromoteError> {
    if name.is_empty()
        || name.starts_with('.')
        || name.contains(['/', '\\'])
        || name.chars().any(char::is_control)
    {
        return Err(PromoteError::Invalid(format!(
            "--model {name:?}: a model name is one directory name (not empty, no `/`, not starting with `.`)"
        )));
    }
    Ok(())
}

/// Compare, decide, and (unless a dry run or refused) install the candidate; record the
/// decision. A refusal is an `Ok` [`Promotion`] whose decision is not `promoted`.
pub fn promote(opts: &PromoteOptions) -> Result<Promotion, PromoteError> {
    check_model_name(&opts.model)?;
    if opts.keep == Some(0) {
        return Err(PromoteError::Invalid(
            "--keep 0 would remove every version; keep at least 1".into(),
        ));
    }
    if opts.batches.is_empty() || opts.batches.contains(&0) {
        return Err(PromoteError::Invalid(
            "benchmark batch sizes must be positive".into(),
        ));
    }
    let g = &opts.gates;
    let valid = g.max_latency_ratio.is_finite()
        && g.max_latency_ratio > 0.0
        && g.max_mse_increase.is_finite()
        && g.max_mse_increase >= 0.0
        && g.max_nll_increase.is_finite()
        && g.max_nll_increase >= 0.0
        && [g.max_crps_increase, g.max_calibration_error_increase]
            .iter()
            .flatten()
            .all(|v| v.is_finite() && *v >= 0.0);
    if !valid {
        return Err(PromoteError::Invalid(format!(
            "gate thresholds must be finite and non-negative (latency ratio positive): {g:?}"
        )));
    }
    let cand_dir = resolve_dir(&opts.candidate);
    let cand = Checkpoint::load(&cand_dir).map_err(|source| PromoteError::Candidate {
        path: opts.candidate.clone(),
        source,
    })?;
    let config_path = match &opts.config {
        Some(p) => p.clone(),
        None => {
            let beside = cand_dir.parent().map(|p| p.join("config.yaml"));
            match beside {
                Some(p) if p.is_file() => p,
                _ => return Err(PromoteError::NoConfig { dir: cand_dir }),
            }
        }
    };
    let loaded = config::load(&config_path)?;
    let data = Dataset::load(&loaded.config.data)?;
    let names = |m: &crate::artifact::Manifest| (m.feature_names(), m.target_names());
    let (cf, ct) = names(&cand.manifest);
    if cf != data.features || ct != data.targets {
        return Err(PromoteError::Incompatible(format!(
            "the candidate's features {cf:?} and targets {ct:?} are not those of {}'s data ({:?}, {:?})",
            config_path.display(),
            data.features,
            data.targets
        )));
    }
    let model_dir = opts.repository.join(&opts.model);
    let existing = versions(&model_dir)?;
    let served = served_version(&model_dir)?;
    if let Some((v, inc)) = &served {
        let (f, t) = names(&inc.manifest);
        if f != cf || t != ct {
            return Err(PromoteError::Incompatible(format!(
                "served version {v} of {} has features {f:?} and targets {t:?}, the candidate {cf:?} and {ct:?}: they cannot be compared on one test split",
                opts.model
            )));
        }
    }
    let engine = opts
        .engine
        .clone()
        .unwrap_or_else(|| serving_engine().to_string());
    let mut cand_pred = Predictor::for_checkpoint(&cand, build_engine(&engine, &cand.weights, 1)?);
    let cand_quality = quality(&mut cand_pred, &ct, &data.test)?;
    let mut inc_pred = match &served {
        Some((_, inc)) => Some(Predictor::for_checkpoint(
            inc,
            build_engine(&engine, &inc.weights, 1)?,
        )),
        None => None,
    };
    let inc_quality = match inc_pred.as_mut() {
        Some(p) => Some(quality(p, &ct, &data.test)?),
        None => None,
    };
    let mut preds: Vec<&mut Predictor> = vec![&mut cand_pred];
    if let Some(p) = inc_pred.as_mut() {
        preds.push(p);
    }
    let mut lat = latency_side_by_side(
        &mut preds,
        &cand.manifest.features,
        &opts.batches,
        opts.latency_budget,
        10,
    )?
    .into_iter();
    let cand_m = Measurement {
        quality: cand_quality,
        latency: lat.next().unwrap_or_default(),
        weights_sha256: cand.manifest.weights.sha256.clone(),
    };
    let inc_m = match (&served, inc_quality) {
        (Some((_, inc)), Some(q)) => Some(Measurement {
            quality: q,
            latency: lat.next().unwrap_or_default(),
            weights_sha256: inc.manifest.weights.sha256.clone(),
        }),
        _ => None,
    };
    let decision = decide(&opts.gates, &cand_m, inc_m.as_ref());
    let incumbent_version = served.as_ref().map(|(v, _)| *v);
    let mut promotion = Promotion {
        model: opts.model.clone(),
        repository: opts.repository.clone(),
        candidate: cand_dir.clone(),
        run_id: cand.manifest.run_id.clone(),
        engine,
        incumbent_version,
        version: None,
        pruned: Vec::new(),
        candidate_measurement: cand_m,
        incumbent_measurement: inc_m,
        decision,
        dry_run: opts.dry_run,
        registry_id: None,
    };
    if opts.dry_run {
        return Ok(promotion);
    }
    if promotion.decision.promoted {
        let next = existing.last().map_or(1, |(v, _)| v + 1);
        let v = install_version(&model_dir, &cand_dir, next)?;
        promotion.version = Some(v);
        if let Some(keep) = opts.keep {
            let mut protect = vec![v];
            protect.extend(incumbent_version);
            promotion.pruned = prune(&model_dir, keep, &protect)?;
        }
    }
    let registry_path = opts
        .registry
        .clone()
        .unwrap_or_else(|| loaded.config.registry_path());
    let registry = Registry::open(&registry_path)?;
    let row = PromotionRow {
        id: 0,
        at: util::rfc3339(util::unix_now()),
        repository: opts.repository.display().to_string(),
        model: opts.model.clone(),
        candidate: cand_dir.display().to_string(),
        run_id: Some(promotion.run_id.clone()),
        incumbent_version: incumbent_version.map(|v| v as i64),
        version: promotion.version.map(|v| v as i64),
        decision: if promotion.decision.promoted {
            "promoted".into()
        } else {
            "refused".into()
        },
        details: serde_json::json!({
            "engine": promotion.engine,
            "gates": opts.gates,
            "checks": promotion.decision.checks,
            "candidate": promotion.candidate_measurement,
            "incumbent": promotion.incumbent_measurement,
            "pruned": promotion.pruned,
        }),
    };
    promotion.registry_id = Some(registry.record_promotion(&row)?);
    Ok(promotion)
}
