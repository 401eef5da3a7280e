//! What a checkpoint's manifest records of the run that made it (`Manifest::metrics`): the
//! evaluation tables, the stages' summaries, the bottleneck verdict, the int8 accuracy change
//! and the pick evaluation, as types. Every field has a serde default, so manifests and
//! registry rows written by earlier releases still load; keys this release does not know are
//! kept ([`ManifestMetrics::other`]) and written back unchanged.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::StepPhases;
use kiln_observe::verdict::Verdict;

/// `Manifest::metrics`: everything a checkpoint records of how its model did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ManifestMetrics {
    /// The test split's evaluation table (after recalibration, when one was fitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<EvalReport>,
    /// The validation split's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<EvalReport>,
    /// Per-stage summaries.
    #[serde(default)]
    pub stages: Vec<StageSummary>,
    /// Whether the model beats every baseline on every test target.
    #[serde(default)]
    pub beats_all_baselines: bool,
    /// The bottleneck verdict of the training run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<Verdict>,
    /// A refit run: what the selection pass chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refit: Option<RefitProvenance>,
    /// The test table before recalibration (only when one was fitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_before_calibration: Option<EvalReport>,
    /// A distilled model's teacher(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<TeacherInfo>,
    /// The teacher's own test table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher_test: Option<EvalReport>,
    /// The int8 engine's accuracy change on the test split (absent, or `null` in older
    /// manifests, when it could not be measured: the check is advisory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int8_test_delta: Option<Int8AccuracyReport>,
    /// An imported checkpoint (`kiln import pytorch`): where its weights came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported: Option<ImportInfo>,
    /// The pick probabilities against the test outcomes (advisory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pick_evaluation: Option<PickEvaluation>,
    /// Training-seed noise, measured (`seed_spread: K` in the config): the same config
    /// trained under K seeds on the same rows, each seed's test MSE per target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_spread: Option<SeedSpread>,
    /// How `data.numeric_bins: auto` chose the bins the model reads: each candidate's
    /// validation loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numeric_bins: Option<NumericBinsChoice>,
    /// Keys this release does not know (written by a later one, or by hand): kept as they are.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// How `data.numeric_bins: auto` chose: the config's stages up to its deciding one trained
/// with and without bins on the same rows, the lower best validation loss of the deciding
/// stage kept (a tie keeps fewer bins).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NumericBinsChoice {
    /// The bins per numeric feature the exported model reads (0: the values alone).
    pub chosen: usize,
    /// The deciding stage (the config's last `mse` stage, else its last).
    pub stage: String,
    /// Each candidate, in the order trained.
    pub candidates: Vec<BinsCandidate>,
}

/// One candidate of a [`NumericBinsChoice`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BinsCandidate {
    /// Bins per numeric feature (0: none).
    pub bins: usize,
    /// The deciding stage's best validation loss (`null`: none was finite).
    pub validation_loss: Option<f64>,
    /// Where its run is (`<run>/numeric-bins/bins-<n>`).
    pub run: String,
}

impl BinsCandidate {
    /// `no bins`, `8 bins`: how kiln names a bin count in its output.
    pub fn label(bins: usize) -> String {
        match bins {
            0 => "no bins".to_string(),
            n => format!("{n} bins"),
        }
    }
}

impl NumericBinsChoice {
    /// Choose among `candidates`: the lowest finite loss, a tie to fewer bins; none finite:
    /// the values alone.
    pub fn decide(stage: String, candidates: Vec<BinsCandidate>) -> Self {
        let chosen = candidates
            .iter()
            .filter_map(|c| {
                c.validation_loss
                    .filter(|v| v.is_finite())
                    .map(|v| (v, c.bins))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map_or(0, |(_, bins)| bins);
        Self {
            chosen,
            stage,
            candidates,
        }
    }

    /// One line: `numeric_bins auto: 8 bins kept, best validation loss of stage mean 0.18420
    /// (against no bins 0.42331)`.
    pub fn describe(&self) -> String {
        if self.candidates.is_empty() {
            return "numeric_bins auto: no feature takes bins, so there is nothing to choose"
                .to_string();
        }
        let bins = BinsCandidate::label;
        let others: Vec<String> = self
            .candidates
            .iter()
            .filter(|c| c.bins != self.chosen)
            .map(|c| format!("{} {}", bins(c.bins), loss(c.validation_loss)))
            .collect();
        let own = self
            .candidates
            .iter()
            .find(|c| c.bins == self.chosen)
            .map_or("n/a".to_string(), |c| loss(c.validation_loss));
        format!(
            "numeric_bins auto: {} kept, best validation loss of stage {} {own} (against {})",
            bins(self.chosen),
            self.stage,
            others.join(", ")
        )
    }
}

fn loss(v: Option<f64>) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v:.5}"))
}

impl ManifestMetrics {
    /// Per target, the test MSE of the model's mean (empty without a test table).
    pub fn test_mse(&self) -> Vec<(String, f64)> {
        self.test
            .iter()
            .flat_map(|r| &r.targets)
            .map(|t| (t.target.clone(), t.mse_model))
            .collect()
    }
}

/// The same config trained under several seeds on the same rows (`seed_spread: K`): how much
/// the test MSE moves with nothing but the seed (weight initialisation and shuffling). The
/// exported model is the run's own seed (the first); the others are trained only to measure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SeedSpread {
    /// The seeds, the exported model's first.
    #[serde(default)]
    pub seeds: Vec<u64>,
    /// The target names, in order.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Per seed (in `seeds` order), per target: the test MSE of the mean.
    #[serde(default)]
    pub test_mse: Vec<Vec<f64>>,
    /// Where the other seeds' runs are (`<run>/seeds/seed-<s>`).
    #[serde(default)]
    pub runs: Vec<String>,
}

impl SeedSpread {
    /// Per target: (mean, sample standard deviation) of the test MSE over the seeds.
    pub fn mean_sd(&self) -> Vec<(f64, f64)> {
        (0..self.targets.len())
            .map(|t| {
                let v: Vec<f64> = self
                    .test_mse
                    .iter()
                    .filter_map(|r| r.get(t).copied())
                    .collect();
                let n = v.len() as f64;
                let mean = v.iter().sum::<f64>() / n.max(1.0);
                let sd = if v.len() > 1 {
                    (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
                } else {
                    0.0
                };
                (mean, sd)
            })
            .collect()
    }

    /// Per target: the seed-to-seed standard deviation as a fraction of the mean test MSE.
    pub fn relative_sd(&self) -> Vec<f64> {
        self.mean_sd()
            .into_iter()
            .map(|(m, sd)| if m > 0.0 { sd / m } else { 0.0 })
            .collect()
    }

    /// One line: `seed spread over 3 seeds (7, 8, 9): test MSE sd hr_rate 1.2 %, …`.
    pub fn describe(&self) -> String {
        let seeds: Vec<String> = self.seeds.iter().map(u64::to_string).collect();
        let per: Vec<String> = self
            .targets
            .iter()
            .zip(self.relative_sd())
            .map(|(t, r)| format!("{t} {:.2} %", 100.0 * r))
            .collect();
        format!(
            "seed spread over {} seeds ({}): test MSE standard deviation {} of the mean",
            self.seeds.len(),
            seeds.join(", "),
            per.join(", ")
        )
    }
}

/// A refit run's record of its selection pass (`refit: train+validation`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RefitProvenance {
    /// What the exported model was trained on (`train+validation`).
    #[serde(default)]
    pub trained_on: String,
    /// The selection pass's run directory.
    #[serde(default)]
    pub selection_run: String,
    /// Epochs per stage of the refit pass (the selection pass's best).
    #[serde(default)]
    pub epochs: Vec<usize>,
    /// The selection pass's stage summaries.
    #[serde(default)]
    pub selection_stages: Vec<StageSummary>,
    /// The selection pass's test table (its model was selected on the validation split).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection_test: Option<EvalReport>,
}

/// Where an imported checkpoint's weights came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImportInfo {
    /// The source format (`pytorch-safetensors`).
    pub from: String,
    /// The weights file.
    pub weights: String,
    /// Its SHA-256.
    pub weights_sha256: String,
    /// The import config.
    pub config: String,
    /// The key-renaming rules applied.
    pub maps: Vec<String>,
}

/// The teacher(s) of a distilled model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TeacherInfo {
    /// The engine the teachers answered with: the name as written (text, not
    /// [`EngineKind`](super::EngineKind), so that a record naming an engine this build lacks
    /// still loads).
    #[serde(default)]
    pub engine: String,
    /// How many teachers (an ensemble's members are averaged).
    #[serde(default)]
    pub ensemble: usize,
    /// The first member's parameter count.
    #[serde(default)]
    pub parameter_count: Option<usize>,
    /// Each member.
    #[serde(default)]
    pub members: Vec<TeacherMember>,
}

/// One teacher checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TeacherMember {
    /// Its run.
    #[serde(default)]
    pub run_id: String,
    /// Its parameter count.
    #[serde(default)]
    pub parameter_count: usize,
    /// Its checkpoint directory.
    #[serde(default)]
    pub dir: String,
    /// Its weights' SHA-256.
    #[serde(default)]
    pub weights_sha256: String,
}

/// One target's row of the evaluation table (original units).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TargetReport {
    /// Target column.
    pub target: String,
    /// MSE of the model's mean.
    pub mse_model: f64,
    /// MSE of predicting last season's value (feature `<target>_l1`), when that feature exists.
    pub mse_persistence: Option<f64>,
    /// MSE of predicting the training mean.
    pub mse_train_mean: f64,
    /// Mean Gaussian NLL of the model's mean and variance.
    pub nll_model: f64,
    /// Mean Gaussian NLL with the model's mean and one constant variance per target (the
    /// training split's mean squared residual).
    pub nll_constant_variance: f64,
    /// Root mean squared error of the model's mean.
    pub rmse_model: f64,
    /// RMSE of persistence, when `<target>_l1` exists.
    pub rmse_persistence: Option<f64>,
    /// RMSE of the training mean.
    pub rmse_train_mean: f64,
    /// Mean absolute error of the model's mean.
    pub mae_model: f64,
    /// MAE of persistence, when `<target>_l1` exists.
    pub mae_persistence: Option<f64>,
    /// MAE of the training mean.
    pub mae_train_mean: f64,
    /// R² of the model's mean against the split's own mean.
    pub r2_model: f64,
    /// Mean CRPS of the model's Gaussian.
    pub crps_model: f64,
    /// Mean CRPS with the model's mean and the constant variance.
    pub crps_constant_variance: f64,
    /// Observed coverage of the model's central 50 % interval.
    pub coverage_50: f64,
    /// … 80 %.
    pub coverage_80: f64,
    /// … 90 %.
    pub coverage_90: f64,
    /// … 95 %.
    pub coverage_95: f64,
    /// Miscalibration area of the model's PIT (see `kiln_core::train::uncertainty`).
    pub calibration_error: f64,
    /// Miscalibration area with the constant variance.
    pub calibration_error_constant_variance: f64,
    /// Mean predicted standard deviation.
    pub sharpness: f64,
    /// The constant variance's standard deviation (its sharpness).
    pub sharpness_constant_variance: f64,
    /// The model's PIT histogram (`kiln_core::train::uncertainty::PIT_BINS` fractions).
    pub pit_histogram: Vec<f64>,
    /// (nominal, observed) coverage at `kiln_core::train::uncertainty::CURVE_LEVELS`: the reliability
    /// diagram.
    pub coverage_curve: Vec<(f64, f64)>,
}

impl TargetReport {
    /// Whether the model beats every baseline on this target.
    pub fn beats_all(&self) -> bool {
        self.baselines().iter().all(|(_, beaten)| *beaten)
    }

    /// The baselines that exist for this target and whether the model beats each: the
    /// training mean and persistence on MSE, the constant variance on NLL.
    pub fn baselines(&self) -> Vec<(Baseline, bool)> {
        let mut v = vec![(Baseline::TrainMean, self.mse_model < self.mse_train_mean)];
        if let Some(p) = self.mse_persistence {
            v.push((Baseline::Persistence, self.mse_model < p));
        }
        v.push((
            Baseline::ConstantVariance,
            self.nll_model < self.nll_constant_variance,
        ));
        v
    }

    /// Observed coverage at `kiln_core::train::uncertainty::COVERAGE_LEVELS`.
    pub fn coverage(&self) -> [f64; 4] {
        [
            self.coverage_50,
            self.coverage_80,
            self.coverage_90,
            self.coverage_95,
        ]
    }
}

/// A baseline the model is judged against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Baseline {
    /// The training split's mean (MSE).
    TrainMean,
    /// Last season's value, feature `<target>_l1` (MSE).
    Persistence,
    /// The model's mean with one constant variance per target (NLL).
    ConstantVariance,
}

impl Baseline {
    /// Its name in tables.
    pub fn label(self) -> &'static str {
        match self {
            Self::TrainMean => "training mean",
            Self::Persistence => "persistence",
            Self::ConstantVariance => "constant variance",
        }
    }
}

/// The evaluation table on one split.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalReport {
    /// `test`, `validation`, …
    pub split: String,
    /// Rows evaluated.
    pub rows: usize,
    /// One row per target.
    pub targets: Vec<TargetReport>,
    /// SHA-256 of the split's rows (features, targets and seasons, in order): two reports are
    /// comparable when these agree.
    pub rows_sha256: String,
}

impl EvalReport {
    /// Whether the model beats every baseline on every target.
    pub fn beats_all(&self) -> bool {
        self.targets.iter().all(TargetReport::beats_all)
    }

    /// The data of the calibration figures ([`crate::observe::calibration`]).
    pub fn calibration_data(&self) -> Vec<crate::observe::calibration::TargetCalibration> {
        self.targets
            .iter()
            .map(|t| crate::observe::calibration::TargetCalibration {
                target: t.target.clone(),
                coverage: t.coverage_curve.clone(),
                pit_histogram: t.pit_histogram.clone(),
            })
            .collect()
    }

    /// The verdict line: for each baseline that exists on some target, whether the model
    /// beats it on every target that has it, naming the targets where it does not.
    pub fn verdict(&self) -> String {
        let mut parts = Vec::new();
        for b in [
            Baseline::Persistence,
            Baseline::TrainMean,
            Baseline::ConstantVariance,
        ] {
            let judged: Vec<(&str, bool)> = self
                .targets
                .iter()
                .filter_map(|t| {
                    t.baselines()
                        .into_iter()
                        .find(|(x, _)| *x == b)
                        .map(|(_, beaten)| (t.target.as_str(), beaten))
                })
                .collect();
            if judged.is_empty() {
                continue;
            }
            let lost: Vec<&str> = judged.iter().filter(|(_, w)| !w).map(|(t, _)| *t).collect();
            parts.push(if lost.is_empty() {
                format!("{} yes", b.label())
            } else {
                format!("{} NO ({})", b.label(), lost.join(", "))
            });
        }
        format!("beats on every target: {}", parts.join("; "))
    }

    /// The uncertainty table: proper scores, coverage against nominal, calibration error and
    /// sharpness, each next to the constant-variance baseline.
    pub fn uncertainty_table(&self) -> String {
        let mut s = format!(
            "{:<12} {:>9} {:>9} {:>9} {:>9} {:>23} {:>13} {:>10}\n",
            "target", "rmse", "mae", "r2", "crps", "coverage 50/80/90/95", "cal.err", "sharpness"
        );
        for t in &self.targets {
            let c = t.coverage();
            s.push_str(&format!(
                "{:<12} {:>9.3e} {:>9.3e} {:>9.4} {:>9.3e} {:>23} {:>13} {:>10.3e}\n",
                t.target,
                t.rmse_model,
                t.mae_model,
                t.r2_model,
                t.crps_model,
                format!("{:.2}/{:.2}/{:.2}/{:.2}", c[0], c[1], c[2], c[3]),
                format!(
                    "{:.3} ({:.3})",
                    t.calibration_error, t.calibration_error_constant_variance
                ),
                t.sharpness
            ));
        }
        s.push_str(
            "(cal.err: PIT miscalibration area, constant variance in brackets; 0 = calibrated)\n",
        );
        s
    }

    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{} split ({} rows), original units\n{:<12} {:>12} {:>12} {:>12} {:>10} {:>10} {:>8}\n",
            self.split,
            self.rows,
            "target",
            "mse model",
            "persistence",
            "train mean",
            "nll model",
            "nll const",
            "beats"
        );
        for t in &self.targets {
            s.push_str(&format!(
                "{:<12} {:>12.4e} {:>12} {:>12.4e} {:>10.4} {:>10.4} {:>8}\n",
                t.target,
                t.mse_model,
                t.mse_persistence
                    .map(|p| format!("{p:.4e}"))
                    .unwrap_or_else(|| "n/a".into()),
                t.mse_train_mean,
                t.nll_model,
                t.nll_constant_variance,
                if t.beats_all() { "yes" } else { "NO" }
            ));
        }
        s
    }
}

/// Per-stage throughput summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StageSummary {
    /// Stage name.
    pub name: String,
    /// Epochs run.
    pub epochs: usize,
    /// Optimizer steps.
    pub steps: u64,
    /// Samples per second over the stage's steps.
    pub samples_per_s: f64,
    /// Fraction of step time waiting for data.
    pub data_wait_frac: f64,
    /// Best validation loss (restored at the end of the stage).
    pub best_val_loss: f64,
    /// The epoch (1-based) it came from.
    pub best_epoch: usize,
    /// Mean microseconds per step by phase (zero for epochs recorded before phases were).
    pub step_us: StepPhases,
}

/// One bin of a reliability table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReliabilityBin {
    /// Lower edge of predicted probability.
    pub lo: f64,
    /// Upper edge.
    pub hi: f64,
    /// Picks in the bin.
    pub count: usize,
    /// Their mean predicted probability.
    pub mean_p: f64,
    /// Their observed hit rate.
    pub hit_rate: f64,
}

/// Scores of one set of probabilities against outcomes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProbabilityScores {
    /// Picks scored.
    pub n: usize,
    /// Mean `(p − hit)²`.
    pub brier: f64,
    /// Mean `−[hit·ln p + (1 − hit)·ln(1 − p)]`.
    pub log_loss: f64,
    /// Mean predicted probability.
    pub mean_p: f64,
    /// Observed hit rate.
    pub hit_rate: f64,
    /// Ten equal-width bins of predicted probability (empty bins left out).
    pub reliability: Vec<ReliabilityBin>,
}

/// A kind of pick and its probability sets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PickKindReport {
    /// `single legs` or `k-leg picks`.
    pub kind: String,
    /// Legs left out because the outcome equals the line.
    pub pushes: usize,
    /// The checkpoint's probabilities (multi-leg: with the residual correlation).
    pub model: ProbabilityScores,
    /// Multi-leg only: the product of the legs' probabilities.
    pub independence: Option<ProbabilityScores>,
    /// The constant probability used as baseline (the baseline rows' hit rate).
    pub constant_p: f64,
    /// That constant scored on the same picks.
    pub constant: ProbabilityScores,
}

impl PickKindReport {
    /// Multi-leg picks: which pricing scores better by Brier on these outcomes, the residual
    /// correlation (the model's) or the independence assumption, e.g. `independence wins
    /// (Brier 0.09466 vs 0.09510 with the residual correlation)`; `None` for single legs.
    pub fn correlation_verdict(&self) -> Option<String> {
        let ind = self.independence.as_ref()?;
        let (m, i) = (self.model.brier, ind.brier);
        Some(if m < i {
            format!("the residual correlation wins (Brier {m:.5} vs {i:.5} if independent)")
        } else if i < m {
            format!("independence wins (Brier {i:.5} vs {m:.5} with the residual correlation)")
        } else {
            format!("a tie (Brier {m:.5} either way)")
        })
    }
}

/// The whole evaluation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PickEvaluation {
    /// The split scored.
    pub split: String,
    /// Rows of it.
    pub rows: usize,
    /// Per target, where its line comes from (`persistence (<t>_l1)` or `training median …`).
    pub lines: Vec<String>,
    /// Single legs, then multi-leg picks.
    pub kinds: Vec<PickKindReport>,
}

impl PickEvaluation {
    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "pick probabilities against outcomes, {} split ({} rows)\nlines: {}\n{:<16} {:>6} {:>7} {:<28} {:>9} {:>9} {:>8} {:>8}\n",
            self.split,
            self.rows,
            self.lines.join("; "),
            "kind",
            "picks",
            "pushes",
            "probabilities",
            "brier",
            "log loss",
            "mean p",
            "hit rate"
        );
        for k in &self.kinds {
            let mut rows = vec![("model".to_string(), &k.model)];
            if let Some(i) = &k.independence {
                rows[0].0 = "model (residual corr.)".into();
                rows.push(("independence".into(), i));
            }
            let c = format!("constant {:.4}", k.constant_p);
            rows.push((c, &k.constant));
            for (name, sc) in rows {
                s.push_str(&format!(
                    "{:<16} {:>6} {:>7} {:<28} {:>9.5} {:>9.5} {:>8.4} {:>8.4}\n",
                    k.kind, sc.n, k.pushes, name, sc.brier, sc.log_loss, sc.mean_p, sc.hit_rate
                ));
            }
        }
        for v in self.kinds.iter().filter_map(|k| {
            k.correlation_verdict()
                .map(|v| format!("{}: {v}\n", k.kind))
        }) {
            s.push_str(&v);
        }
        for k in &self.kinds {
            s.push_str(&format!(
                "reliability, {} (model): predicted → observed (count)\n",
                k.kind
            ));
            for b in &k.model.reliability {
                s.push_str(&format!(
                    "  [{:.1}, {:.1})  {:.3} → {:.3}  ({})\n",
                    b.lo, b.hi, b.mean_p, b.hit_rate, b.count
                ));
            }
        }
        s
    }
}

/// The test-split effect of int8 inference, per target, against the f32 model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Int8AccuracyReport {
    /// Rows evaluated.
    pub rows: usize,
    /// The int8 path that ran (`avx512` = VNNI, `avx2`, `portable`).
    pub kernel: String,
    /// One entry per target.
    pub targets: Vec<Int8TargetDelta>,
    /// Largest |int8 − f32| of the mean head over all rows and targets (normalised units).
    pub max_abs_diff_mean: f64,
    /// Largest |int8 − f32| of the log-variance head (normalised units).
    pub max_abs_diff_log_var: f64,
}

/// One target's metrics under f32 and int8 (original units).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Int8TargetDelta {
    /// Target column.
    pub target: String,
    /// MSE of the f32 model's mean.
    pub mse_f32: f64,
    /// MSE of the int8 model's mean.
    pub mse_int8: f64,
    /// `(mse_int8 − mse_f32) / mse_f32`.
    pub mse_rel_change: f64,
    /// Mean Gaussian NLL (with the constant) of the f32 model.
    pub nll_f32: f64,
    /// Mean Gaussian NLL of the int8 model.
    pub nll_int8: f64,
}

/// Latency percentiles at one batch size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchLatency {
    /// Rows per call.
    pub batch: usize,
    /// Timed calls.
    pub iters: usize,
    /// Median µs per call.
    pub p50_us: f64,
    /// 95th percentile µs.
    pub p95_us: f64,
    /// 99th percentile µs.
    pub p99_us: f64,
}

/// Latency of one model on one engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencyReport {
    /// The engine measured: the name as written (text, not
    /// [`EngineKind`](super::EngineKind), so that a manifest naming an engine this build lacks,
    /// e.g. a CUDA one, still loads).
    pub engine: String,
    /// The CPU path it ran (`avx512`, `avx2`, `portable`; absent in older manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// One entry per batch size.
    pub batches: Vec<BatchLatency>,
}

impl LatencyReport {
    /// The median at `batch`, if measured.
    pub fn p50(&self, batch: usize) -> Option<f64> {
        self.batches
            .iter()
            .find(|b| b.batch == batch)
            .map(|b| b.p50_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bins_choice_keeps_the_lowest_finite_loss_and_a_tie_keeps_fewer_bins() {
        let c = |bins, validation_loss| BinsCandidate {
            bins,
            validation_loss,
            run: format!("r/bins-{bins}"),
        };
        let pick = |cands| NumericBinsChoice::decide("mean".into(), cands).chosen;
        assert_eq!(pick(vec![c(8, Some(0.2)), c(0, Some(0.3))]), 8);
        assert_eq!(pick(vec![c(8, Some(0.3)), c(0, Some(0.2))]), 0);
        assert_eq!(pick(vec![c(8, Some(0.2)), c(0, Some(0.2))]), 0);
        assert_eq!(pick(vec![c(8, Some(f64::NAN)), c(0, Some(0.9))]), 0);
        assert_eq!(pick(vec![c(8, Some(0.9)), c(0, None)]), 8);
        assert_eq!(pick(vec![c(8, None), c(0, None)]), 0);
        assert_eq!(pick(vec![]), 0);
        let d = NumericBinsChoice::decide("mean".into(), vec![c(8, Some(0.1842)), c(0, None)]);
        assert_eq!(
            d.describe(),
            "numeric_bins auto: 8 bins kept, best validation loss of stage mean 0.18420 (against no bins n/a)"
        );
        assert_eq!(
            NumericBinsChoice::decide("mean".into(), vec![]).describe(),
            "numeric_bins auto: no feature takes bins, so there is nothing to choose"
        );
    }

    #[test]
    fn the_correlation_verdict_names_the_lower_brier() {
        let scores = |brier| ProbabilityScores {
            brier,
            ..Default::default()
        };
        let mut k = PickKindReport {
            kind: "3-leg picks".into(),
            model: scores(0.09510),
            independence: Some(scores(0.09466)),
            ..Default::default()
        };
        assert_eq!(
            k.correlation_verdict().unwrap(),
            "independence wins (Brier 0.09466 vs 0.09510 with the residual correlation)"
        );
        k.model = scores(0.09);
        assert!(
            k.correlation_verdict()
                .unwrap()
                .starts_with("the residual correlation wins")
        );
        k.independence = None;
        assert_eq!(k.correlation_verdict(), None, "single legs have no verdict");
    }
}
