//! The promotion gate's records: its thresholds ([`Gates`]), what it measured of a model
//! ([`Measurement`]), its checks and verdict ([`Check`], [`Decision`]), and what the run
//! registry stores of each decision (the `promotions` table's `decision` word,
//! [`PromotionDecision`], and its `details`, [`PromotionDetails`]). Plain data, below both the
//! registry and the gate ([`crate::promote`] re-exports them).
//!
//! Every stored field has a serde default, so rows written by earlier releases (or by hand)
//! still load; a number stored as JSON `null` (a NaN or infinity: JSON has neither) reads back
//! as NaN; keys this release does not know are kept ([`PromotionDetails::other`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// A number written as JSON `null` (serde_json writes NaN and ±∞ so) reads back as NaN.
fn null_is_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn nan() -> f64 {
    f64::NAN
}

/// The thresholds of the gate.
///
/// Quality is compared *paired*, on the same test rows (the candidate's test split: with
/// rolling windows the newest window, which neither model trained on): per row the
/// candidate's and the served version's squared error (per target) and Gaussian NLL (mean over
/// targets). A check fails only when the candidate is worse **beyond noise** (the one-sided
/// `confidence` lower bound of the paired bootstrap, rows resampled by group when `group` is
/// given) **by more than a practical margin** (`max_mse_increase` relative, `max_nll_increase`
/// in nats). The margin is small — 2 % of a target's test MSE by default — so a real
/// regression such as +4.1 % [+2.1, +6.2] is refused; what it cannot absorb is seed noise of
/// a config whose models differ by more than that from seed to seed (measured in
/// `docs/nightly.md`: 4.7 % of seed-only pairs of `configs/baseball.yaml` are refused at 2 %,
/// none at 3 %): reduce that noise on the training side, or widen the margin for such a
/// config (`--max-mse-increase`).
///
/// A stored record missing a threshold reads it as [`Gates::default`]'s; records written
/// before this default keep the margin they were decided with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Gates {
    /// The practical margin: tolerated relative increase of any target's test MSE beyond
    /// noise (0.02 = 2 %, the default).
    pub max_mse_increase: f64,
    /// Tolerated increase of the mean test Gaussian NLL (nats per value).
    pub max_nll_increase: f64,
    /// The candidate's median latency must stay below this multiple of the served one's at
    /// every benchmark batch size (the registry's regression rule: 1.5).
    pub max_latency_ratio: f64,
    /// One-sided confidence of the paired bootstrap bounds (0.95).
    pub confidence: f64,
    /// Bootstrap resamples (seeded, so a decision is reproducible).
    pub resamples: usize,
    /// Uncertainty gate (absent: the rows are shown, not enforced): largest allowed relative
    /// increase of any target's test CRPS (0.05 = 5 %).
    pub max_crps_increase: Option<f64>,
    /// Uncertainty gate (absent: shown, not enforced): largest allowed absolute increase of any
    /// target's test calibration error (the PIT miscalibration area, 0 … 0.5).
    pub max_calibration_error_increase: Option<f64>,
}

impl Default for Gates {
    fn default() -> Self {
        Self {
            max_mse_increase: 0.02,
            max_nll_increase: 0.02,
            max_latency_ratio: 1.5,
            confidence: 0.95,
            resamples: 2000,
            max_crps_increase: None,
            max_calibration_error_increase: None,
        }
    }
}

/// One target's test metrics (original units).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetQuality {
    /// The target column.
    #[serde(default)]
    pub target: String,
    /// Mean squared error of the predicted mean.
    #[serde(default = "nan", deserialize_with = "null_is_nan")]
    pub mse: f64,
    /// Mean Gaussian NLL of the predicted mean and standard deviation.
    #[serde(default = "nan", deserialize_with = "null_is_nan")]
    pub nll: f64,
    /// Mean CRPS of the predicted Gaussian (0 in records written before it was measured).
    #[serde(default, deserialize_with = "null_is_nan")]
    pub crps: f64,
    /// PIT miscalibration area (see `kiln_core::train::uncertainty`; 0 in records written
    /// before it was measured).
    #[serde(default, deserialize_with = "null_is_nan")]
    pub calibration_error: f64,
}

/// A model's test metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quality {
    /// Test rows.
    #[serde(default)]
    pub rows: usize,
    /// One entry per target.
    #[serde(default)]
    pub targets: Vec<TargetQuality>,
    /// Mean Gaussian NLL over every test value.
    #[serde(default = "nan", deserialize_with = "null_is_nan")]
    pub nll: f64,
}

impl Default for Quality {
    fn default() -> Self {
        Self {
            rows: 0,
            targets: Vec::new(),
            nll: f64::NAN,
        }
    }
}

/// The median latency at one batch size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchP50 {
    /// Rows per call.
    #[serde(default)]
    pub batch: usize,
    /// Median µs per call.
    #[serde(default = "nan", deserialize_with = "null_is_nan")]
    pub p50_us: f64,
    /// Timed calls.
    #[serde(default)]
    pub iters: usize,
}

/// Per-row test losses of one model, for the paired comparison.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RowLosses {
    /// Squared error, `rows × targets`, row-major.
    pub sq: Vec<f64>,
    /// Gaussian NLL per row, averaged over the targets.
    pub nll: Vec<f64>,
    /// The resampling group of each row (a hash of the group column's value), if any.
    pub groups: Option<Vec<u64>>,
}

impl RowLosses {
    /// Rows covered.
    pub fn rows(&self) -> usize {
        self.nll.len()
    }

    /// Target `j`'s squared errors.
    pub fn target(&self, j: usize, k: usize) -> Vec<f64> {
        self.sq.iter().skip(j).step_by(k.max(1)).copied().collect()
    }
}

/// What was measured of one model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Test metrics.
    #[serde(default)]
    pub quality: Quality,
    /// Median latency per batch size.
    #[serde(default)]
    pub latency: Vec<BatchP50>,
    /// SHA-256 of the weights file.
    #[serde(default)]
    pub weights_sha256: String,
    /// Per-row losses (not serialised; absent for numbers given by hand, which are then
    /// compared as point estimates).
    #[serde(skip)]
    pub rows: Option<RowLosses>,
}

/// One check of the gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// What is checked, e.g. `mse hr_rate`, `latency b1`.
    #[serde(default)]
    pub name: String,
    /// The candidate's value (NaN when it could not be measured).
    #[serde(default = "nan", deserialize_with = "null_is_nan")]
    pub candidate: f64,
    /// The served version's value.
    #[serde(default)]
    pub incumbent: Option<f64>,
    /// The limit the candidate's value must respect.
    #[serde(default)]
    pub limit: Option<f64>,
    /// Whether it passed.
    #[serde(default)]
    pub passed: bool,
    /// One line of explanation.
    #[serde(default)]
    pub detail: String,
}

impl Check {
    /// Whether this is one of the quality checks `kiln runs promotions` summarises: a target's
    /// test MSE (`mse <target>`) or the mean test NLL (`nll`).
    pub fn is_quality(&self) -> bool {
        self.name.starts_with("mse ") || self.name == "nll"
    }

    /// The candidate's change against the served version, as `kiln runs promotions` shows
    /// it: in nats for the NLL (`+0.0130`), relative for the rest (`-4.6%`); `None` without
    /// both numbers (or against a served value of 0).
    pub fn change(&self) -> Option<String> {
        let a = Some(self.candidate).filter(|v| v.is_finite())?;
        let b = self.incumbent.filter(|v| v.is_finite())?;
        if self.name == "nll" {
            Some(format!("{:+.4}", a - b))
        } else if b != 0.0 {
            Some(format!("{:+.1}%", (a / b - 1.0) * 100.0))
        } else {
            None
        }
    }
}

/// What the gate decided, as the exit code says it (0, 3, 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every check passed: the candidate is (or would be) the new version. Exit 0.
    Promoted,
    /// A check failed: worse beyond noise, slower, or not finite. Exit 3.
    Refused,
    /// Nothing to do: the candidate's weights are the served version's (a rerun on unchanged
    /// data and config reproduces them bit for bit). Exit 4 (a scheduled job treats it as
    /// success).
    NothingToDo,
}

impl Outcome {
    /// The process exit code of `kiln promote` for this outcome.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Promoted => 0,
            Outcome::Refused => 3,
            Outcome::NothingToDo => 4,
        }
    }

    /// The word recorded in the registry's `promotions.decision`.
    pub fn word(self) -> &'static str {
        PromotionDecision::from(self).as_str()
    }
}

/// The gate's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Every check passed.
    pub promoted: bool,
    /// Promoted, refused or nothing to do.
    #[serde(default = "refused")]
    pub outcome: Outcome,
    /// The checks, in order.
    pub checks: Vec<Check>,
}

fn refused() -> Outcome {
    Outcome::Refused
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

/// A promotion's state as the registry's `promotions.decision` stores it (one lowercase word).
/// A promotion is recorded `installing` before its version is renamed into place, then settled
/// `promoted`, or `abandoned` when its promoter failed or died first; a refusal is recorded
/// `refused` and a candidate identical to the served version `nothing_to_do`. A night whose
/// training or promotion failed before the gate decided is recorded `failed`, with the step,
/// its exit code and the reason in the details ([`PromotionDetails::exit_code`]).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::Display,
    strum::EnumString,
    strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(
    serialize_all = "snake_case",
    parse_err_ty = String,
    parse_err_fn = unknown_decision
)]
pub enum PromotionDecision {
    /// The candidate is the new version.
    Promoted,
    /// A check failed.
    Refused,
    /// The candidate's weights are the served version's.
    NothingToDo,
    /// Recorded before its version is renamed into place; not settled yet (or its promoter
    /// died: the next promotion of the model settles it).
    Installing,
    /// Its promoter failed or died before the version was in place.
    Abandoned,
    /// The night failed before the gate could decide: `kiln train` failed (recorded with
    /// `kiln promote --train-exit CODE`), or `kiln promote` met bad input or a runtime error.
    Failed,
}

impl PromotionDecision {
    /// Every decision, in declaration order.
    pub const ALL: &'static [PromotionDecision] =
        <PromotionDecision as strum::VariantArray>::VARIANTS;

    /// The stored word.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The exit code the nightly script ended with for a row of this decision: 0 promoted, 3
    /// refused, 4 nothing to do; a `failed` row's own code (`details.exit_code`, else 1);
    /// `None` for a promotion still installing or abandoned.
    pub fn exit_code(self, details: &PromotionDetails) -> Option<u8> {
        match self {
            PromotionDecision::Promoted => Some(0),
            PromotionDecision::Refused => Some(3),
            PromotionDecision::NothingToDo => Some(4),
            PromotionDecision::Failed => Some(details.exit_code.unwrap_or(1)),
            PromotionDecision::Installing | PromotionDecision::Abandoned => details.exit_code,
        }
    }
}

/// `PromotionDecision`'s derived `FromStr` error, listing the stored words.
fn unknown_decision(s: &str) -> String {
    let words: Vec<&str> = PromotionDecision::ALL.iter().map(|d| d.as_str()).collect();
    format!("unknown promotion decision `{s}` ({})", words.join(", "))
}

impl From<Outcome> for PromotionDecision {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Promoted => PromotionDecision::Promoted,
            Outcome::Refused => PromotionDecision::Refused,
            Outcome::NothingToDo => PromotionDecision::NothingToDo,
        }
    }
}

impl PartialEq<&str> for PromotionDecision {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The numbers behind one recorded decision (the registry's `promotions.details`): the
/// engine, the thresholds, the checks, both models' measurements, the versions pruned, and
/// the promoter's process (so that a promoter killed mid-way can be told from a live one).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PromotionDetails {
    /// The engine both models were timed on: the name as written (text, not an `EngineKind`,
    /// so that a registry row naming an engine this build lacks still loads).
    #[serde(default)]
    pub engine: String,
    /// The thresholds applied.
    #[serde(default)]
    pub gates: Gates,
    /// The checks, in order.
    #[serde(default)]
    pub checks: Vec<Check>,
    /// The candidate's numbers.
    #[serde(default)]
    pub candidate: Option<Measurement>,
    /// The served version's numbers (`null` for a first version).
    #[serde(default)]
    pub incumbent: Option<Measurement>,
    /// Versions removed by `keep`.
    #[serde(default)]
    pub pruned: Vec<u64>,
    /// The promoter's process id.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Its start time (clock ticks since boot, to tell a recycled pid), when known.
    #[serde(default)]
    pub pid_start: Option<i64>,
    /// Set when another promoter settled this row for one that had died: by whom and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled: Option<String>,
    /// Why installing the version failed (an `abandoned` row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A `failed` night: the step that failed (`train` or `promote`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// A `failed` night: the exit code the step (and the nightly script) ended with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<u8>,
    /// A `failed` night: why, in one line (the step's error message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The version's registration in MLflow's Model Registry (a promotion with MLflow
    /// tracking configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<MlflowRegistration>,
    /// Keys this release does not know (written by a later one, or by hand): kept as they are.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// What registering a promoted version in MLflow's Model Registry did: the version, or why
/// it is missing (MLflow being unreachable never fails a promotion).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MlflowRegistration {
    /// The tracking server.
    pub tracking_uri: String,
    /// The registered version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered: Option<crate::mlflow::model_registry::RegisteredVersion>,
    /// Why it was not registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PromotionDetails {
    /// The record as the JSON text of the registry column (keys in alphabetical order, as
    /// earlier releases wrote it).
    pub fn to_json_text(&self) -> String {
        serde_json::to_value(self)
            .expect("a promotion record serialises")
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_round_trip_as_their_stored_words() {
        for &d in PromotionDecision::ALL {
            assert_eq!(d.as_str().parse::<PromotionDecision>(), Ok(d));
            assert_eq!(
                serde_json::to_value(d).unwrap(),
                serde_json::json!(d.as_str())
            );
        }
        for o in [Outcome::Promoted, Outcome::Refused, Outcome::NothingToDo] {
            assert_eq!(serde_json::to_value(o).unwrap(), o.word());
        }
        let e = "kept".parse::<PromotionDecision>().unwrap_err();
        assert!(e.contains("`kept`") && e.contains("nothing_to_do"), "{e}");
        assert_eq!(format!("{:<9}|", PromotionDecision::Refused), "refused  |");
    }

    #[test]
    fn details_written_by_hand_or_with_null_numbers_load() {
        // A refusal of a candidate whose metrics were not finite: NaN is stored as null.
        let d: PromotionDetails = serde_json::from_str(
            r#"{"checks":[{"name":"finite test metrics","candidate":null,"incumbent":null,
                "limit":null,"passed":false,"detail":"not finite"}],
                "candidate":{"quality":{"rows":3,"nll":null,"targets":[{"target":"y","mse":null,"nll":1.0}]},
                "latency":[{"batch":1,"p50_us":null,"iters":0}],"weights_sha256":"ab"},
                "pid":7,"later":{"x":1}}"#,
        )
        .unwrap();
        assert!(d.checks[0].candidate.is_nan() && !d.checks[0].passed);
        let c = d.candidate.as_ref().unwrap();
        assert!(c.quality.nll.is_nan() && c.quality.targets[0].mse.is_nan());
        assert_eq!(c.quality.targets[0].crps, 0.0, "absent in older records");
        assert!(c.latency[0].p50_us.is_nan());
        assert_eq!((d.pid, d.pid_start), (Some(7), None));
        assert_eq!(d.gates, Gates::default());
        assert_eq!(d.other["later"], serde_json::json!({"x": 1}));
        // Written back and read again: the same record (NaN compares unequal, so by text).
        let again: PromotionDetails = serde_json::from_str(&d.to_json_text()).unwrap();
        assert_eq!(again.to_json_text(), d.to_json_text());
        // Nothing at all.
        let empty: PromotionDetails = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, PromotionDetails::default());
    }

    #[test]
    fn a_checks_change_is_relative_but_in_nats_for_the_nll() {
        let c = |name: &str, candidate: f64, incumbent: Option<f64>| Check {
            name: name.into(),
            candidate,
            incumbent,
            limit: None,
            passed: true,
            detail: String::new(),
        };
        assert_eq!(
            c("mse y", 0.95, Some(1.0)).change().as_deref(),
            Some("-5.0%")
        );
        assert_eq!(
            c("nll", -2.0, Some(-2.013)).change().as_deref(),
            Some("+0.0130")
        );
        assert_eq!(c("mse y", 1.0, Some(0.0)).change(), None);
        assert_eq!(c("mse y", f64::NAN, Some(1.0)).change(), None);
        assert_eq!(c("latency b1", 1.0, None).change(), None);
        assert!(c("mse y", 1.0, None).is_quality() && c("nll", 1.0, None).is_quality());
        assert!(!c("uncertainty crps y", 1.0, None).is_quality());
    }
}
