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
//! `promotions` table, except in a dry run, which only measures and compares. A promotion is
//! recorded as `installing` *before* its version is renamed into place and settled as
//! `promoted` after, so a promoter killed in between never leaves a version without a row:
//! the next promotion of the model settles such a row (`promoted` when the version holds the
//! candidate, else `abandoned`) and removes the temporaries of promoters that are gone.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::artifact::{ArtifactError, Checkpoint, resolve_dir};
use crate::bench::latency::serving_engine;
use crate::config::{self, ConfigError};
use crate::data::{DataError, Dataset, Subset};
use crate::infer::{EngineKind, InferError, build_engine};
use crate::predict::{Prediction, Predictor};
use crate::registry::{PromotionRow, Registry, RegistryError};
use crate::rng::SplitMix64;
use crate::train::uncertainty;
use crate::util;

// The gate's records, with the gate that makes them.
pub use crate::promotion::{
    BatchP50, Check, Decision, Gates, Measurement, MlflowRegistration, Outcome, PromotionDecision,
    PromotionDetails, Quality, RowLosses, TargetQuality,
};

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
        let promoted = checks.iter().all(|c| c.passed);
        return Decision {
            promoted,
            outcome: if promoted {
                Outcome::Promoted
            } else {
                Outcome::Refused
            },
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
            "the candidate's weights are the served version's: nothing to do".into()
        } else {
            "new weights".into()
        },
    });
    if identical {
        return Decision {
            promoted: false,
            outcome: Outcome::NothingToDo,
            checks,
        };
    }
    let paired = match (&candidate.rows, &inc.rows) {
        (Some(c), Some(i)) if c.rows() == i.rows() && c.rows() > 0 => Some((c, i)),
        _ => None,
    };
    let units = paired.map(|(c, _)| crate::paired::units(c.rows(), c.groups.as_deref()));
    let k = q.targets.len();
    let conf = gates.confidence;
    for (j, t) in q.targets.iter().enumerate() {
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
        let tol = gates.max_mse_increase;
        let limit = it.mse * (1.0 + tol);
        let (passed, detail) = match (paired, &units) {
            (Some((c, i)), Some(u)) => {
                let r = crate::paired::compare(
                    &c.target(j, k),
                    &i.target(j, k),
                    u,
                    crate::paired::Scale::Relative,
                    conf,
                    gates.resamples,
                    0x6a7e ^ j as u64,
                );
                let v = r.verdict(tol);
                (
                    v != crate::paired::Verdict::Worse,
                    format!(
                        "test MSE of {} {:.6} vs served {:.6}: {:+.2} % [{:+.2}, {:+.2}] at {:.0} % over {} {} — {} (refused when the lower bound exceeds {:+.2} %)",
                        t.target,
                        t.mse,
                        it.mse,
                        r.estimate * 100.0,
                        r.lower * 100.0,
                        r.upper * 100.0,
                        conf * 100.0,
                        r.units,
                        if c.groups.is_some() { "groups" } else { "rows" },
                        v.word(),
                        tol * 100.0
                    ),
                )
            }
            _ => {
                let change = (t.mse / it.mse - 1.0) * 100.0;
                (
                    t.mse <= limit,
                    format!(
                        "test MSE of {} {:.6} vs served {:.6} ({change:+.2} %, limit {:+.2} %; point estimate, no per-row losses)",
                        t.target,
                        t.mse,
                        it.mse,
                        tol * 100.0
                    ),
                )
            }
        };
        checks.push(Check {
            name: format!("mse {}", t.target),
            candidate: t.mse,
            incumbent: Some(it.mse),
            limit: Some(limit),
            passed,
            detail,
        });
    }
    let tol = gates.max_nll_increase;
    let limit = inc.quality.nll + tol;
    let (passed, detail) = match (paired, &units) {
        (Some((c, i)), Some(u)) => {
            let r = crate::paired::compare(
                &c.nll,
                &i.nll,
                u,
                crate::paired::Scale::Absolute,
                conf,
                gates.resamples,
                0x6a7e_0011,
            );
            let v = r.verdict(tol);
            (
                v != crate::paired::Verdict::Worse,
                format!(
                    "test NLL {:.4} vs served {:.4}: {:+.4} [{:+.4}, {:+.4}] at {:.0} % over {} {} — {} (refused when the lower bound exceeds {:+.4})",
                    q.nll,
                    inc.quality.nll,
                    r.estimate,
                    r.lower,
                    r.upper,
                    conf * 100.0,
                    r.units,
                    if c.groups.is_some() { "groups" } else { "rows" },
                    v.word(),
                    tol
                ),
            )
        }
        _ => (
            q.nll <= limit,
            format!(
                "test NLL {:.4} vs served {:.4} ({:+.4}, limit {:+.4}; point estimate)",
                q.nll,
                inc.quality.nll,
                q.nll - inc.quality.nll,
                tol
            ),
        ),
    };
    checks.push(Check {
        name: "nll".into(),
        candidate: q.nll,
        incumbent: Some(inc.quality.nll),
        limit: Some(limit),
        passed,
        detail,
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
    let promoted = checks.iter().all(|c| c.passed);
    Decision {
        promoted,
        outcome: if promoted {
            Outcome::Promoted
        } else {
            Outcome::Refused
        },
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
    Ok(quality_and_rows(predictor, targets, split)?.0)
}

/// Test metrics of `predictor` on `split` and its per-row losses (for the paired comparison).
pub fn quality_and_rows(
    predictor: &mut Predictor,
    targets: &[String],
    split: &Subset,
) -> Result<(Quality, RowLosses), InferError> {
    quality_and_rows_on(predictor, targets, &split.x, &split.y)
}

/// Test metrics and per-row losses of `predictor` on network inputs `x` (rows × its
/// features) and targets `y` (rows × targets, original units).
pub fn quality_and_rows_on(
    predictor: &mut Predictor,
    targets: &[String],
    x: &[f32],
    y: &[f32],
) -> Result<(Quality, RowLosses), InferError> {
    let rows = y.len() / targets.len().max(1);
    let mut per_row = RowLosses {
        sq: Vec::with_capacity(rows * targets.len()),
        nll: vec![0.0; rows],
        groups: None,
    };
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
        predictor.predict_into(&x[start * nf..end * nf], end - start, &mut out)?;
        for (i, (&m, &s)) in out.mean.iter().zip(&out.std).enumerate() {
            let j = i % k;
            let y = y[start * k + i] as f64;
            let (m, s) = (m as f64, s as f64);
            let (se, nll) = (
                (y - m).powi(2),
                util::HALF_LN_2PI + util::gaussian_nll(y, m, 2.0 * s.ln()),
            );
            sse[j] += se;
            snll[j] += nll;
            per_row.sq.push(se);
            per_row.nll[start + i / k] += nll / k as f64;
            cols[j][0].push(y);
            cols[j][1].push(m);
            cols[j][2].push(s);
        }
    }
    let n = rows.max(1) as f64;
    let q = Quality {
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
    };
    Ok((q, per_row))
}

/// Median latencies of two predictors measured side by side: at each batch size each sees
/// seeded inputs drawn from its own features' statistics (`features[i]` for predictor `i`: the
/// two may have different inputs, e.g. one more category), both are warmed up, then timed in
/// `rounds` alternating rounds (the order flips every round) of about `budget / rounds` each,
/// so both share the machine's state.
pub fn latency_side_by_side(
    predictors: &mut [&mut Predictor],
    features: &[&[crate::data::ColumnStats]],
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
        let xs: Vec<Vec<f32>> = (0..predictors.len())
            .map(|i| {
                let stats = features.get(i).or(features.first()).copied().unwrap_or(&[]);
                let mut r = SplitMix64::derive(0x1a7e, &[batch as u64]);
                (0..batch)
                    .flat_map(|_| {
                        stats
                            .iter()
                            .map(|f| (f.mean + f.std * r.normal()) as f32)
                            .collect::<Vec<_>>()
                    })
                    .collect()
            })
            .collect();
        for (p, x) in predictors.iter_mut().zip(&xs) {
            for _ in 0..20 {
                p.predict_into(x, batch, &mut pred)?;
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
                    predictors[i].predict_into(&xs[i], batch, &mut pred)?;
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

/// Whether the served version can be compared with the candidate on the raw columns of
/// `table`: it reads every column it needs (a column gone is one short line naming it) and no
/// column changed between numeric and categorical. Extra columns of the candidate, and
/// categories either model never saw (the other's unknown bucket), are fine.
pub fn compatible_on_raw_columns(
    version: u64,
    served: &crate::artifact::Manifest,
    candidate: &crate::artifact::Manifest,
    table: &crate::data::table::CsvTable,
) -> Result<(), PromoteError> {
    let (st, ct) = (served.target_names(), candidate.target_names());
    if st != ct {
        let differ: Vec<&String> = st
            .iter()
            .filter(|t| !ct.contains(t))
            .chain(ct.iter().filter(|t| !st.contains(t)))
            .collect();
        return Err(PromoteError::Incompatible(format!(
            "served version {version} and the candidate predict different targets (differing: {}): they cannot be compared",
            differ
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let (sp, cp) = (
        served.input_preprocessing(),
        candidate.input_preprocessing(),
    );
    let kind = |c: &crate::data::preprocess::InputColumn| {
        if c.categories.is_some() {
            "categorical"
        } else if c.date.is_some() {
            "date"
        } else {
            "numeric"
        }
    };
    for c in &sp.inputs {
        if !table.header.iter().any(|h| h == &c.name) {
            return Err(PromoteError::Incompatible(format!(
                "column `{}` is gone: served version {version} reads it, {} has no such column",
                c.name,
                table.path.display()
            )));
        }
        if let Some(n) = cp.inputs.iter().find(|n| n.name == c.name)
            && kind(n) != kind(c)
        {
            return Err(PromoteError::Incompatible(format!(
                "column `{}` changed type: served version {version} reads it as {}, the candidate as {}",
                c.name,
                kind(c),
                kind(n)
            )));
        }
    }
    Ok(())
}

/// Network inputs of the rows `rows` of `table`, through `pre` (a model's own preprocessing).
/// An error names the file, line and column, and whose preprocessing refused the cell.
pub fn raw_inputs(
    pre: &crate::data::preprocess::Preprocessing,
    table: &crate::data::table::CsvTable,
    rows: &[usize],
    who: &str,
) -> Result<Vec<f32>, PromoteError> {
    let idx: Vec<usize> = pre
        .inputs
        .iter()
        .map(|c| {
            table.column_index(&c.name).map_err(|_| {
                PromoteError::Incompatible(format!(
                    "column `{}` is gone: {who} reads it, {} has no such column",
                    c.name,
                    table.path.display()
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(rows.len() * pre.n_features());
    let mut owned = Vec::with_capacity(idx.len());
    for &r in rows {
        owned.clear();
        owned.extend(idx.iter().map(|&i| table.cell(r, i)));
        let cells: Vec<&str> = owned.iter().map(|c| &**c).collect();
        let line = table.lines.get(r).copied().unwrap_or(r as u64 + 2);
        let locate = |col: &str, msg: String| {
            PromoteError::Incompatible(format!(
                "{}:{line}: column `{col}`: {msg} ({who}'s preprocessing)",
                table.path.display()
            ))
        };
        pre.push_row(&cells, &mut out, &locate)?;
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
    remove_dead_temporaries(model_dir);
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
        util::fault::point("during-promote-install");
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

/// Remove the temporaries (`.promote.tmp-<pid>-<v>`, `.pruned-<v>-<pid>`) that promoters
/// killed mid-way left in `model_dir`: those whose process is no longer running. A live
/// promoter's are left alone. Returns the names removed.
pub fn remove_dead_temporaries(model_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(model_dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = if let Some(rest) = name.strip_prefix(".promote.tmp-") {
            rest.split('-').next()
        } else if let Some(rest) = name.strip_prefix(".pruned-") {
            rest.rsplit('-').next()
        } else {
            None
        };
        let Some(pid) = pid.and_then(|p| p.parse::<i64>().ok()) else {
            continue;
        };
        if pid as u32 == std::process::id() || util::process_alive(pid, None) {
            continue;
        }
        match std::fs::remove_dir_all(e.path()) {
            Ok(()) => {
                tracing::info!(
                    "{}: removed the temporary of a promoter that is gone (pid {pid})",
                    e.path().display()
                );
                removed.push(name);
            }
            Err(err) => tracing::warn!("{}: cannot remove: {err}", e.path().display()),
        }
    }
    removed
}

/// Settle the `installing` rows of `model` in `repository` whose promoter is gone (killed
/// between recording and finishing): `promoted` when its version directory holds the
/// candidate's weights (the rename happened), else `abandoned` with no version. Returns
/// how many rows were settled.
pub fn reconcile_installing(
    registry: &Registry,
    repository: &Path,
    model: &str,
) -> Result<usize, PromoteError> {
    let repo = repository.display().to_string();
    let mut n = 0;
    for row in registry.promotions(Some(model))? {
        if row.decision != PromotionDecision::Installing || row.repository != repo {
            continue;
        }
        let pid = row.details.pid.map_or(0, i64::from);
        if pid as u32 == std::process::id() || util::process_alive(pid, row.details.pid_start) {
            continue;
        }
        let sha = row
            .details
            .candidate
            .as_ref()
            .map(|c| c.weights_sha256.as_str());
        let installed = row.version.filter(|&v| {
            v > 0
                && crate::artifact::read_manifest(&repository.join(model).join(v.to_string()))
                    .is_ok_and(|m| Some(m.weights.sha256.as_str()) == sha)
        });
        let mut details = row.details.clone();
        details.reconciled = Some(format!(
            "the promoter (pid {pid}) stopped before settling this row; settled by pid {}",
            std::process::id()
        ));
        let decision = if installed.is_some() {
            PromotionDecision::Promoted
        } else {
            PromotionDecision::Abandoned
        };
        registry.settle_promotion(row.id, decision, installed, &details)?;
        tracing::warn!(
            "promotion {} of {model}: its promoter is gone; recorded as {decision}{}",
            row.id,
            installed.map_or(String::new(), |v| format!(" (version {v} is in place)"))
        );
        n += 1;
    }
    Ok(n)
}

/// The decision of a promotion recorded before its version is renamed into place.
pub const INSTALLING: PromotionDecision = PromotionDecision::Installing;

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
    pub engine: Option<EngineKind>,
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
    /// Evaluate on this data file instead of the one the candidate was trained on (whose
    /// SHA-256 must otherwise still match the candidate's manifest).
    pub data: Option<PathBuf>,
    /// Resample the test rows by this column's value (e.g. `player_id`) in the paired
    /// bootstrap, so that correlated rows of one group count once.
    pub group: Option<String>,
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
            data: None,
            group: None,
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
    pub engine: EngineKind,
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
    /// The registration in MLflow's Model Registry (a promoted version with
    /// `MLFLOW_TRACKING_URI` set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<MlflowRegistration>,
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
        let nothing = self.decision.outcome == Outcome::NothingToDo;
        for c in &self.decision.checks {
            s.push_str(&format!(
                "  {} {:<22} {}\n",
                match (c.passed, nothing) {
                    (true, _) => "ok  ",
                    // Not a failure: the reason there is nothing to do.
                    (false, true) => "same",
                    (false, false) => "FAIL",
                },
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
            (false, _, _) if self.decision.outcome == Outcome::NothingToDo => {
                format!("nothing to do: {}", self.decision.reasons().join("; "))
            }
            (false, false, _) => format!("refused: {}", self.decision.reasons().join("; ")),
        };
        s.push_str(&verdict);
        if !self.pruned.is_empty() {
            s.push_str(&format!(" · pruned versions {:?}", self.pruned));
        }
        s.push('\n');
        if let Some(m) = &self.mlflow {
            match (&m.registered, &m.error) {
                (Some(r), _) => s.push_str(&format!(
                    "MLflow: registered model {} version {} (alias {}, source {}) at {}\n",
                    r.name, r.version, r.alias, r.source, m.tracking_uri
                )),
                (None, e) => s.push_str(&format!(
                    "MLflow: not registered at {}: {}\n",
                    m.tracking_uri,
                    e.as_deref().unwrap_or("unknown error")
                )),
            }
        }
        s
    }
}

/// With MLflow tracking configured (`MLFLOW_TRACKING_URI`, MLflow's own variables), register
/// version `version` of `model`, installed at `version_dir`, in MLflow's Model Registry
/// ([`crate::mlflow::model_registry`]), linked to the training run's MLflow run when its run
/// directory `run_dir` says it was mirrored to the same server. `None` without MLflow; a
/// failure is a warning and an `error` in the result, never an error of the promotion.
pub fn register_in_mlflow(
    model: &str,
    version_dir: &Path,
    version: u64,
    checkpoint: &Checkpoint,
    run_dir: Option<&Path>,
) -> Option<MlflowRegistration> {
    use crate::mlflow::{Client, ClientOptions, MirrorState, model_registry};
    let uri = std::env::var("MLFLOW_TRACKING_URI")
        .ok()
        .filter(|u| !u.trim().is_empty())?;
    let mut out = MlflowRegistration {
        tracking_uri: uri.clone(),
        ..MlflowRegistration::default()
    };
    let client = match ClientOptions::from_env().and_then(|o| Client::with_options(&uri, &o)) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("MLflow: version {version} of {model} is not registered: {e}");
            out.error = Some(e.to_string());
            return Some(out);
        }
    };
    // The training run's MLflow run, when it was mirrored to this server.
    let mirrored = run_dir
        .and_then(MirrorState::read)
        .filter(|s| s.tracking_uri.trim_end_matches('/') == client.base_url());
    let absolute = std::path::absolute(version_dir).unwrap_or_else(|_| version_dir.to_path_buf());
    let alias = model_registry::alias_from_env();
    let registration = model_registry::Registration {
        name: model,
        repository_path: &absolute,
        repository_version: version,
        checkpoint_sha256: &checkpoint.manifest.weights.sha256,
        kiln_run_id: &checkpoint.manifest.run_id,
        mlflow_run_id: mirrored.as_ref().map(|s| s.run_id.as_str()),
        alias: &alias,
    };
    match model_registry::register(&client, &registration) {
        Ok(r) => out.registered = Some(r),
        Err(e) => {
            tracing::warn!(
                "MLflow: version {version} of {model} is promoted but not registered in the model registry: {e}"
            );
            out.error = Some(e.to_string());
        }
    }
    Some(out)
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

/// A night that failed before the gate decided, as `kiln runs promotions` lists it (a
/// `failed` row): which step, its exit code and why.
#[derive(Debug, Clone, PartialEq)]
pub struct NightFailure {
    /// The model repository root.
    pub repository: PathBuf,
    /// The model.
    pub model: String,
    /// The candidate, when there was one (empty when training failed).
    pub candidate: Option<PathBuf>,
    /// The run, when known.
    pub run_id: Option<String>,
    /// The step that failed: `train` or `promote`.
    pub step: String,
    /// Its exit code (what the nightly script exits with).
    pub exit_code: u8,
    /// Why, in one line.
    pub reason: String,
}

/// Record a failed night in the registry's `promotions` table; returns the row id.
pub fn record_failure(registry: &Registry, f: &NightFailure) -> Result<i64, PromoteError> {
    check_model_name(&f.model)?;
    let me = std::process::id();
    let row = PromotionRow {
        id: 0,
        at: util::rfc3339(util::unix_now()),
        repository: f.repository.display().to_string(),
        model: f.model.clone(),
        candidate: f
            .candidate
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        run_id: f.run_id.clone(),
        incumbent_version: served_version(&f.repository.join(&f.model))
            .ok()
            .flatten()
            .map(|(v, _)| v as i64),
        version: None,
        decision: PromotionDecision::Failed,
        details: PromotionDetails {
            step: Some(f.step.clone()),
            exit_code: Some(f.exit_code),
            reason: Some(f.reason.clone()),
            pid: Some(me),
            ..PromotionDetails::default()
        },
    };
    Ok(registry.record_promotion(&row)?)
}

/// The registry a promotion records in: `--registry`, else the config's (`--config`, else the
/// `config.yaml` beside the candidate's export). `None` when neither can be found.
pub fn registry_for(opts: &PromoteOptions) -> Option<PathBuf> {
    if let Some(r) = &opts.registry {
        return Some(r.clone());
    }
    let config = opts.config.clone().or_else(|| {
        resolve_dir(&opts.candidate)
            .parent()
            .map(|p| p.join("config.yaml"))
            .filter(|p| p.is_file())
    })?;
    config::load(&config).ok().map(|l| l.config.registry_path())
}

/// Compare, decide, and (unless a dry run or refused) install the candidate; record the
/// decision. A refusal is an `Ok` [`Promotion`] whose decision is not `promoted`. A promotion
/// that fails before deciding (bad input: exit 2; a runtime error: exit 1) is recorded too,
/// as a `failed` row with the error (not in a dry run; not when the registry itself failed).
pub fn promote(opts: &PromoteOptions) -> Result<Promotion, PromoteError> {
    check_model_name(&opts.model)?;
    let mut recorded = false;
    let result = promote_and_record(opts, &mut recorded);
    if let Err(e) = &result
        && !opts.dry_run
        && !recorded
        && !matches!(e, PromoteError::Registry(_))
    {
        let failure = NightFailure {
            repository: opts.repository.clone(),
            model: opts.model.clone(),
            candidate: Some(resolve_dir(&opts.candidate)),
            run_id: None,
            step: "promote".into(),
            exit_code: if e.is_input() { 2 } else { 1 },
            reason: e.to_string(),
        };
        match registry_for(opts).map(|p| Registry::open(&p)) {
            Some(Ok(reg)) => {
                if let Err(re) = record_failure(&reg, &failure) {
                    tracing::warn!("the failed promotion could not be recorded: {re}");
                }
            }
            Some(Err(re)) => tracing::warn!("the failed promotion could not be recorded: {re}"),
            None => tracing::warn!(
                "the failed promotion is not recorded: no registry (pass --registry or --config)"
            ),
        }
    }
    result
}

fn promote_and_record(
    opts: &PromoteOptions,
    recorded: &mut bool,
) -> Result<Promotion, PromoteError> {
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
        && g.confidence > 0.5
        && g.confidence < 1.0
        && g.resamples >= 100
        && [g.max_crps_increase, g.max_calibration_error_increase]
            .iter()
            .flatten()
            .all(|v| v.is_finite() && *v >= 0.0);
    if !valid {
        return Err(PromoteError::Invalid(format!(
            "gate thresholds must be finite and non-negative (latency ratio positive, confidence in (0.5, 1), at least 100 resamples): {g:?}"
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
    let mut data_cfg = loaded
        .config
        .data
        .as_trained(cand.manifest.preprocessing.as_ref());
    match &opts.data {
        Some(p) => data_cfg.path = p.clone(),
        None => {
            // The path as the run recorded it: relative to the working directory of `kiln
            // train`, which the manifest records resolved. Prefer the resolved one when the
            // relative one does not exist from here.
            let recorded = PathBuf::from(&cand.manifest.dataset.path);
            if !data_cfg.path.exists() && recorded.is_absolute() && recorded.exists() {
                data_cfg.path = recorded;
            }
        }
    }
    // One read: the rows tested, the hash checked and the group column all come from it.
    let (data, table) = Dataset::load_with_table(&data_cfg)?;
    if opts.data.is_none() && data.sha256 != cand.manifest.dataset.sha256 {
        return Err(PromoteError::Invalid(format!(
            "{}: the data file changed since run {} trained on it (SHA-256 {} now, {} recorded): the gate would test on other rows than the run held out; retrain, or pass --data FILE to evaluate on a file explicitly",
            data_cfg.path.display(),
            cand.manifest.run_id,
            &data.sha256[..12.min(data.sha256.len())],
            &cand.manifest.dataset.sha256[..12.min(cand.manifest.dataset.sha256.len())]
        )));
    }
    let groups = match &opts.group {
        None => None,
        Some(col) => {
            let idx = table.column_index(col)?;
            Some(
                data.test
                    .source_rows
                    .iter()
                    .map(|&r| {
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        std::hash::Hash::hash(&*table.cell(r, idx), &mut h);
                        std::hash::Hasher::finish(&h)
                    })
                    .collect::<Vec<u64>>(),
            )
        }
    };
    let ct = cand.manifest.target_names();
    if ct != data.targets {
        return Err(PromoteError::Incompatible(format!(
            "the candidate predicts {} but {} names the targets {}",
            ct.join(", "),
            config_path.display(),
            data.targets.join(", ")
        )));
    }
    let model_dir = opts.repository.join(&opts.model);
    let existing = versions(&model_dir)?;
    let served = served_version(&model_dir)?;
    if let Some((v, inc)) = &served {
        compatible_on_raw_columns(*v, &inc.manifest, &cand.manifest, &table)?;
    }
    // Each model reads the test rows' raw cells through its own preprocessing (imputation,
    // one-hot codes): a category the served version never saw is its unknown bucket.
    let cand_x = raw_inputs(
        &cand.manifest.input_preprocessing(),
        &table,
        &data.test.source_rows,
        "the candidate",
    )?;
    let engine = opts.engine.unwrap_or_else(serving_engine);
    let mut cand_pred = Predictor::for_checkpoint(&cand, build_engine(engine, &cand.weights, 1)?);
    let (cand_quality, mut cand_rows) =
        quality_and_rows_on(&mut cand_pred, &ct, &cand_x, &data.test.y)?;
    cand_rows.groups = groups.clone();
    let mut inc_pred = match &served {
        Some((_, inc)) => Some(Predictor::for_checkpoint(
            inc,
            build_engine(engine, &inc.weights, 1)?,
        )),
        None => None,
    };
    let inc_quality = match (inc_pred.as_mut(), &served) {
        (Some(p), Some((v, inc))) => {
            let x = raw_inputs(
                &inc.manifest.input_preprocessing(),
                &table,
                &data.test.source_rows,
                &format!("served version {v}"),
            )?;
            let (q, mut r) = quality_and_rows_on(p, &ct, &x, &data.test.y)?;
            r.groups = groups;
            Some((q, r))
        }
        _ => None,
    };
    let mut preds: Vec<&mut Predictor> = vec![&mut cand_pred];
    if let Some(p) = inc_pred.as_mut() {
        preds.push(p);
    }
    let mut stats: Vec<&[crate::data::ColumnStats]> = vec![&cand.manifest.features];
    if let Some((_, inc)) = &served {
        stats.push(&inc.manifest.features);
    }
    let mut lat = latency_side_by_side(&mut preds, &stats, &opts.batches, opts.latency_budget, 10)?
        .into_iter();
    let cand_m = Measurement {
        quality: cand_quality,
        latency: lat.next().unwrap_or_default(),
        weights_sha256: cand.manifest.weights.sha256.clone(),
        rows: Some(cand_rows),
    };
    let inc_m = match (&served, inc_quality) {
        (Some((_, inc)), Some((q, r))) => Some(Measurement {
            quality: q,
            latency: lat.next().unwrap_or_default(),
            weights_sha256: inc.manifest.weights.sha256.clone(),
            rows: Some(r),
        }),
        _ => None,
    };
    // "No new data" needs no rule of its own: training is deterministic, so the same data and
    // config reproduce the served weights, which `decide` answers with nothing to do. Other
    // weights from the same data and config (a kiln upgrade, a hand-made variant) are judged.
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
        mlflow: None,
    };
    if opts.dry_run {
        return Ok(promotion);
    }
    let registry_path = opts
        .registry
        .clone()
        .unwrap_or_else(|| loaded.config.registry_path());
    let registry = Registry::open(&registry_path)?;
    reconcile_installing(&registry, &opts.repository, &opts.model)?;
    remove_dead_temporaries(&model_dir);
    let details = |p: &Promotion| {
        let me = std::process::id();
        PromotionDetails {
            engine: p.engine.to_string(),
            gates: opts.gates.clone(),
            checks: p.decision.checks.clone(),
            candidate: Some(p.candidate_measurement.clone()),
            incumbent: p.incumbent_measurement.clone(),
            pruned: p.pruned.clone(),
            pid: Some(me),
            pid_start: util::process_start(me),
            mlflow: p.mlflow.clone(),
            ..PromotionDetails::default()
        }
    };
    let mut row = PromotionRow {
        id: 0,
        at: util::rfc3339(util::unix_now()),
        repository: opts.repository.display().to_string(),
        model: opts.model.clone(),
        candidate: cand_dir.display().to_string(),
        run_id: Some(promotion.run_id.clone()),
        incumbent_version: incumbent_version.map(|v| v as i64),
        version: promotion.version.map(|v| v as i64),
        decision: promotion.decision.outcome.into(),
        details: details(&promotion),
    };
    *recorded = true;
    if !promotion.decision.promoted {
        promotion.registry_id = Some(registry.record_promotion(&row)?);
        return Ok(promotion);
    }
    // Recorded before the version appears, settled after: a promoter killed in between
    // leaves an `installing` row that the next promotion settles (reconcile_installing),
    // never a version without a row.
    let next = existing.last().map_or(1, |(v, _)| v + 1);
    row.decision = INSTALLING;
    row.version = Some(next as i64);
    let id = registry.record_promotion(&row)?;
    promotion.registry_id = Some(id);
    let v = match install_version(&model_dir, &cand_dir, next) {
        Ok(v) => v,
        Err(e) => {
            let d = PromotionDetails {
                error: Some(e.to_string()),
                ..details(&promotion)
            };
            registry.settle_promotion(id, PromotionDecision::Abandoned, None, &d)?;
            return Err(e);
        }
    };
    promotion.version = Some(v);
    if let Some(keep) = opts.keep {
        let mut protect = vec![v];
        protect.extend(incumbent_version);
        promotion.pruned = prune(&model_dir, keep, &protect)?;
    }
    promotion.mlflow = register_in_mlflow(
        &opts.model,
        &model_dir.join(v.to_string()),
        v,
        &cand,
        cand_dir.parent(),
    );
    registry.settle_promotion(
        id,
        PromotionDecision::Promoted,
        Some(v as i64),
        &details(&promotion),
    )?;
    Ok(promotion)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A measurement of one target whose per-row squared errors are `sq` (NLL 0 per row, so
    /// only the MSE check can refuse), with latency 10 µs.
    fn measured(sq: Vec<f64>, sha: &str) -> Measurement {
        let n = sq.len();
        let mse = sq.iter().sum::<f64>() / n as f64;
        Measurement {
            quality: Quality {
                rows: n,
                targets: vec![TargetQuality {
                    target: "y".into(),
                    mse,
                    nll: 0.0,
                    crps: 0.0,
                    calibration_error: 0.0,
                }],
                nll: 0.0,
            },
            latency: vec![BatchP50 {
                batch: 1,
                p50_us: 10.0,
                iters: 100,
            }],
            weights_sha256: sha.into(),
            rows: Some(RowLosses {
                sq,
                nll: vec![0.0; n],
                groups: None,
            }),
        }
    }

    /// Squared residuals of a model on `n` rows: the irreducible noise `noise[i]` plus this
    /// model's own error (a seed's: independent per row, `spread` its size).
    fn residuals(noise: &[f64], rng: &mut SplitMix64, spread: f64) -> Vec<f64> {
        noise
            .iter()
            .map(|e| (e + spread * rng.normal()).powi(2))
            .collect()
    }

    fn mse_check(d: &Decision) -> &Check {
        d.checks.iter().find(|c| c.name == "mse y").unwrap()
    }

    /// The default margin is 2 %: a candidate whose every row is 3 % worse than the served
    /// version's (on a window large enough to tell, 4,000 rows) is refused as worse beyond
    /// noise by more than the margin, even with row-level jitter.
    #[test]
    fn a_candidate_degraded_by_three_percent_is_refused() {
        assert_eq!(Gates::default().max_mse_increase, 0.02);
        let mut rng = SplitMix64::new(7);
        let noise: Vec<f64> = (0..4000).map(|_| rng.normal()).collect();
        let served = residuals(&noise, &mut rng, 0.3);
        let worse: Vec<f64> = served
            .iter()
            .map(|v| v * 1.03 * (1.0 + 0.02 * rng.normal()))
            .collect();
        let d = decide(
            &Gates::default(),
            &measured(worse, "b"),
            Some(&measured(served, "a")),
        );
        let c = mse_check(&d);
        assert!(!c.passed && d.outcome == Outcome::Refused, "{d:?}");
        assert!(c.detail.contains("— worse"), "{}", c.detail);
        assert!(
            c.detail.contains("+2.00 %"),
            "the margin is stated: {}",
            c.detail
        );
    }

    /// An improvement of 5 % is called better, not "within noise", and promoted.
    #[test]
    fn an_improvement_is_called_better() {
        let mut rng = SplitMix64::new(8);
        let noise: Vec<f64> = (0..4000).map(|_| rng.normal()).collect();
        let served = residuals(&noise, &mut rng, 0.3);
        let better: Vec<f64> = served
            .iter()
            .map(|v| v * 0.95 * (1.0 + 0.02 * rng.normal()))
            .collect();
        let d = decide(
            &Gates::default(),
            &measured(better, "b"),
            Some(&measured(served, "a")),
        );
        let c = mse_check(&d);
        assert!(c.passed && d.promoted, "{d:?}");
        assert!(c.detail.contains("— better"), "{}", c.detail);
        assert!(!c.detail.contains("within noise"), "{}", c.detail);
    }

    /// Seed-only candidates: two models whose errors differ only by their own (seed) part on
    /// 600 rows — exchangeable, so neither is better in expectation — compared 200 times at the
    /// default gates. The one-sided 95 % rule with a 2 % margin refuses at most the stated
    /// 5 % (binomial band: at most 18 of 200), and calls as few better.
    #[test]
    fn seed_only_candidates_pass_at_the_stated_rate() {
        let mut rng = SplitMix64::new(9);
        let (mut refused, mut better, trials) = (0, 0, 200);
        for t in 0..trials {
            let noise: Vec<f64> = (0..600).map(|_| rng.normal()).collect();
            let a = residuals(&noise, &mut rng, 0.3);
            let b = residuals(&noise, &mut rng, 0.3);
            let gates = Gates {
                resamples: 400,
                ..Gates::default()
            };
            let d = decide(
                &gates,
                &measured(b, &format!("b{t}")),
                Some(&measured(a, "a")),
            );
            let c = mse_check(&d);
            refused += usize::from(!c.passed);
            better += usize::from(c.detail.contains("— better"));
        }
        assert!(
            refused <= 18,
            "{refused} of {trials} seed-only candidates refused"
        );
        assert!(better <= 18, "{better} of {trials} called better");
    }
}
