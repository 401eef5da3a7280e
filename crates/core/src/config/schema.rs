//! The experiment config's types: what a YAML file may say (unknown keys are rejected) and
//! the documented defaults.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize};

/// A full experiment: data, model, loader, training stages, device, export.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// A short name used in run directory names.
    #[serde(default = "default_name")]
    pub name: String,
    /// Master seed: weight initialisation and shuffling derive from it.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// `cpu` (default) or `cuda` (needs the `cuda` cargo feature).
    #[serde(default)]
    pub device: DeviceKind,
    /// CPU backend: `flex` (default) or `ndarray`. Ignored on CUDA.
    #[serde(default)]
    pub backend: CpuBackend,
    /// `f32` (default) or `bf16` (CUDA only; no loss scaler is needed for bf16).
    #[serde(default)]
    pub precision: Precision,
    /// The dataset and its split.
    pub data: DataConfig,
    /// The network architecture.
    #[serde(default)]
    pub model: ModelConfig,
    /// The prefetching data loader.
    #[serde(default)]
    pub loader: LoaderConfig,
    /// The training stages, run in order.
    pub stages: Vec<StageConfig>,
    /// Where run directories and exports go.
    #[serde(default)]
    pub export: ExportConfig,
    /// The scheduled profiler (see `observe::profiler`).
    #[serde(default)]
    pub profile: ProfileConfig,
    /// Run registry settings.
    #[serde(default)]
    pub registry: RegistryConfig,
    /// Distillation from a teacher (absent: ordinary training); see [`DistillConfig`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distill: Option<DistillConfig>,
    /// Refit for production: `train+validation` retrains the exported model on the training
    /// and validation rows with the epochs the validation split chose (see [`Refit`]).
    #[serde(default, skip_serializing_if = "Refit::is_none")]
    pub refit: Refit,
    /// Set by the trainer on the refit pass's own copy of the config (never in YAML).
    #[serde(skip)]
    pub refit_pass: Option<RefitPass>,
    /// Measure training-seed noise: train the config under this many seeds (the run's own
    /// `seed`, then `seed + 1`, …) on the same rows and record each seed's test MSE in the
    /// manifest's `metrics.seed_spread`. The exported model is the run's own seed's, exactly
    /// what it would be without this key; the others are trained in `<run>/seeds/` only to
    /// measure (the run takes this many times as long). 1 (the default): no measurement.
    #[serde(default = "default_seed_spread", skip_serializing_if = "is_one")]
    pub seed_spread: usize,
    /// Set by the trainer on the exported pass's own copy of the config (never in YAML): the
    /// other seeds' test tables.
    #[serde(skip)]
    pub seed_spread_pass: Option<SeedSpreadPass>,
    /// Set by the trainer on the run's own copy of the config (never in YAML) once
    /// `data.numeric_bins: auto` has chosen: the candidates, for the manifest.
    #[serde(skip)]
    pub numeric_bins_pass: Option<kiln_model::records::metrics::NumericBinsChoice>,
    /// Post-hoc recalibration of the variance head on the validation split (absent: none);
    /// see [`Calibration`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
}

/// Whether the exported model is refit on train + validation.
///
/// With `train+validation` a run trains twice: a *selection* pass (in `<run>/selection/`, an
/// ordinary run: its best epoch per stage chosen on validation, restored, evaluated on test),
/// then the *refit* pass in the run directory itself: a fresh model (same seed) trained on the
/// training and validation rows, with the normalisation fit on them, for exactly the selection
/// pass's best number of epochs per stage, keeping the last epoch. The test rows are held out
/// of both, so the test evaluation of the exported (refit) model and the gate's comparisons
/// remain on rows no model was trained on; the manifest's `metrics.refit` keeps the selection
/// pass's test evaluation and the epochs it chose.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum Refit {
    /// Export the model trained on the training split (its best validation epoch).
    #[default]
    #[serde(rename = "none")]
    None,
    /// Refit on train + validation.
    #[serde(rename = "train+validation")]
    TrainValidation,
}

impl Refit {
    /// No refit.
    pub fn is_none(&self) -> bool {
        *self == Refit::None
    }
}

fn default_seed_spread() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

/// `data.numeric_bins`: a bin count, or `auto`.
///
/// `auto` trains the config's stages up to its last `mse` stage (all of them when none is)
/// twice on the same rows, once with [`defaults::NUMERIC_BINS`](super::defaults::NUMERIC_BINS)
/// bins and once without, each in its own run directory (`<run>/numeric-bins/bins-<n>/`);
/// then the run itself trains with whichever reached the lower validation loss (a tie keeps
/// the values alone), and its manifest records both (`metrics.numeric_bins`). Bins help where
/// a feature acts through thresholds and cost accuracy on small near-linear tables, and which
/// one a table is shows on its own validation rows (`benches/quality/README.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumericBins {
    /// This many bins (0: none).
    Fixed(usize),
    /// The validation split chooses between the default bins and none.
    Auto,
}

impl Default for NumericBins {
    /// No bins: a config without the key trains on the values alone.
    fn default() -> Self {
        Self::Fixed(0)
    }
}

impl NumericBins {
    /// The candidates `auto` trains, the bins first.
    pub const AUTO_CANDIDATES: [usize; 2] = [super::defaults::NUMERIC_BINS, 0];

    /// The bins a dataset is read with: the count, or for `auto` the most any candidate
    /// uses (a candidate with fewer drops them, see `Dataset::without_bins`).
    pub fn read_with(self) -> usize {
        match self {
            Self::Fixed(n) => n,
            Self::Auto => Self::AUTO_CANDIDATES[0],
        }
    }
}

impl std::fmt::Display for NumericBins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(n) => write!(f, "{n}"),
            Self::Auto => f.write_str("auto"),
        }
    }
}

impl Serialize for NumericBins {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Fixed(n) => s.serialize_u64(*n as u64),
            Self::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for NumericBins {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = NumericBins;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a bin count (0, or 2 to 64) or `auto`")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<NumericBins, E> {
                usize::try_from(v)
                    .map(NumericBins::Fixed)
                    .map_err(|_| E::custom(format!("{v} bins is too many")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<NumericBins, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(v), &self)),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<NumericBins, E> {
                match v.trim() {
                    "auto" => Ok(NumericBins::Auto),
                    t => match t.parse::<u64>() {
                        Ok(u) => self.visit_u64(u),
                        Err(_) => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                    },
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// What the exported pass of a `seed_spread` run knows of the other seeds' passes.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedSpreadPass {
    /// Each other seed, its run directory and its test MSE per target.
    pub others: Vec<(u64, String, Vec<f64>)>,
}

/// What the refit pass knows of its selection pass.
#[derive(Debug, Clone, PartialEq)]
pub struct RefitPass {
    /// Recorded in the manifest's `metrics.refit`.
    pub provenance: kiln_model::records::metrics::RefitProvenance,
}

/// Post-hoc recalibration of the predicted standard deviations.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Calibration {
    /// One scale per target fitted on the validation split to minimise the Gaussian NLL
    /// (`s² = mean(r²/σ²)`), folded into the log-variance head's bias (`+ ln s²`) so that
    /// every consumer of the checkpoint (predict, serve, pick, the ONNX export) applies it.
    VarianceScaling,
}

fn default_name() -> String {
    "experiment".to_string()
}
fn default_seed() -> u64 {
    42
}

/// Which device family trains the model.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The host CPU.
    #[default]
    Cpu,
    /// An NVIDIA GPU through Burn's CUDA backend.
    Cuda,
}

/// Which Burn CPU backend runs the model on `device: cpu`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CpuBackend {
    /// `burn-flex`: fast at small batch.
    #[default]
    Flex,
    /// `burn-ndarray`.
    Ndarray,
}

/// Floating-point precision of training.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 32-bit floats.
    #[default]
    F32,
    /// bfloat16 (CUDA only).
    Bf16,
}

/// One end of a column range: an integer, or an ISO 8601 date / datetime string
/// (`YYYY-MM-DD`, `YYYY-MM-DDTHH:MM:SS[Z]`) for a date column.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Bound {
    /// An integer value (a season, a fold, a `yyyymmdd`).
    Int(i64),
    /// A date or datetime.
    Date(String),
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::Int(v) => write!(f, "{v}"),
            Bound::Date(s) => f.write_str(s),
        }
    }
}

impl<'de> Deserialize<'de> for Bound {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(v) => Ok(Bound::Int(v)),
                None => Err(D::Error::custom(format!(
                    "expected an integer or an ISO 8601 date (\"YYYY-MM-DD\"), got {n}"
                ))),
            },
            serde_json::Value::String(s) => match super::values::parse_datetime(&s) {
                Some(_) => Ok(Bound::Date(s)),
                None => Err(D::Error::custom(format!(
                    "expected an integer or an ISO 8601 date (\"YYYY-MM-DD\" or \"YYYY-MM-DDTHH:MM:SS\"), got {s:?}"
                ))),
            },
            other => Err(D::Error::custom(format!(
                "expected an integer or an ISO 8601 date, got {other}"
            ))),
        }
    }
}

/// An inclusive range of values of the split column (seasons by default); either end may be
/// open.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SeasonRange {
    /// First value (inclusive); open when absent.
    #[serde(default)]
    pub from: Option<Bound>,
    /// Last value (inclusive); open when absent.
    #[serde(default)]
    pub to: Option<Bound>,
}

impl fmt::Display for SeasonRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.from, &self.to) {
            (Some(a), Some(b)) => write!(f, "{a}–{b}"),
            (Some(a), None) => write!(f, "≥ {a}"),
            (None, Some(b)) => write!(f, "≤ {b}"),
            (None, None) => write!(f, "all"),
        }
    }
}

/// How long a relative window is: a count of distinct values of the split column, or (date
/// columns only) a duration such as `"30d"`, `"2w"` or `"12h"`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum WindowLength {
    /// The newest `n` distinct values.
    Count(u64),
    /// A duration, as written (`<n>d`, `<n>w`, `<n>h`).
    Duration(String),
}

impl WindowLength {
    /// The duration in seconds (`None` for a count).
    pub fn seconds(&self) -> Option<i64> {
        match self {
            WindowLength::Count(_) => None,
            WindowLength::Duration(s) => parse_duration(s),
        }
    }
}

/// Parse `<n>d`, `<n>w` or `<n>h` into seconds.
pub fn parse_duration(s: &str) -> Option<i64> {
    let s = s.trim();
    let unit = s.chars().last()?;
    let n: i64 = s[..s.len() - unit.len_utf8()].trim().parse().ok()?;
    if n <= 0 {
        return None;
    }
    let per = match unit {
        'h' => 3_600,
        'd' => 86_400,
        'w' => 7 * 86_400,
        _ => return None,
    };
    n.checked_mul(per)
}

impl fmt::Display for WindowLength {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WindowLength::Count(n) => write!(f, "last {n}"),
            WindowLength::Duration(s) => write!(f, "last {s}"),
        }
    }
}

/// What one split (train, validation or test) takes.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum SplitPart {
    /// `{from: …, to: …}`: an inclusive range of the split column (`by: column`).
    Range(SeasonRange),
    /// `{last: N}` or `{last: "30d"}`: a window counted back from the newest value present
    /// (`by: column`); the test window is the newest, validation the one just before it.
    Last(WindowLength),
    /// A fraction of the rows (`by: random`) or of the groups (`by: group`).
    Fraction(f64),
    /// Absent (train only): everything the other splits leave (older than the relative
    /// windows, or the remaining rows/groups of a random split).
    #[default]
    Rest,
}

impl SplitPart {
    /// Whether this is [`SplitPart::Rest`] (the default of `train`).
    pub fn is_rest(&self) -> bool {
        matches!(self, SplitPart::Rest)
    }
}

impl fmt::Display for SplitPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitPart::Range(r) => r.fmt(f),
            SplitPart::Last(w) => w.fmt(f),
            SplitPart::Fraction(x) => write!(f, "{x}"),
            SplitPart::Rest => f.write_str("the rest"),
        }
    }
}

impl Serialize for SplitPart {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            SplitPart::Range(r) => r.serialize(s),
            SplitPart::Last(w) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("last", w)?;
                m.end()
            }
            SplitPart::Fraction(x) => s.serialize_f64(*x),
            SplitPart::Rest => s.serialize_unit(),
        }
    }
}

impl<'de> Deserialize<'de> for SplitPart {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        const EXPECTED: &str = "expected {from: …, to: …}, {last: N} (distinct values), {last: \"30d\"} (a duration: h, d or w) or a fraction such as 0.2";
        let v = serde_json::Value::deserialize(d)?;
        match v {
            serde_json::Value::Null => Ok(SplitPart::Rest),
            serde_json::Value::Number(n) => {
                Ok(SplitPart::Fraction(n.as_f64().ok_or_else(|| {
                    D::Error::custom(format!("{EXPECTED}, got {n}"))
                })?))
            }
            serde_json::Value::Object(map) if map.contains_key("last") => {
                if map.len() > 1 {
                    return Err(D::Error::custom(
                        "`last` stands alone: give either {last: …} or {from: …, to: …}",
                    ));
                }
                match &map["last"] {
                    serde_json::Value::Number(n) => match n.as_u64() {
                        Some(k) if k > 0 => Ok(SplitPart::Last(WindowLength::Count(k))),
                        _ => Err(D::Error::custom(format!(
                            "`last` counts distinct values: expected a positive integer, got {n}"
                        ))),
                    },
                    serde_json::Value::String(s) if parse_duration(s).is_some() => {
                        Ok(SplitPart::Last(WindowLength::Duration(s.clone())))
                    }
                    other => Err(D::Error::custom(format!(
                        "`last` expects a positive integer (distinct values) or a duration such as \"30d\", \"2w\", \"12h\", got {other}"
                    ))),
                }
            }
            serde_json::Value::Object(_) => serde_json::from_value::<SeasonRange>(v)
                .map(SplitPart::Range)
                .map_err(|e| D::Error::custom(format!("{EXPECTED}: {e}"))),
            other => Err(D::Error::custom(format!("{EXPECTED}, got {other}"))),
        }
    }
}

/// How rows are assigned to splits.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SplitBy {
    /// By the value of a column (ranges or relative windows); the column is `split.column`,
    /// else `data.season_column`.
    #[default]
    Column,
    /// Rows drawn at random (seeded) in the given fractions.
    Random,
    /// Groups (the distinct values of `split.column`) drawn at random in the given fractions:
    /// a group is never in two splits.
    Group,
}

impl SplitBy {
    /// Whether this is the default, [`SplitBy::Column`].
    pub fn is_column(&self) -> bool {
        *self == SplitBy::Column
    }
}

/// Train / validation / test split: by a column's value (integer or date ranges, or relative
/// windows counted back from the newest value), at random, or at random by group.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SplitConfig {
    /// `column` (default), `random` or `group`.
    #[serde(default, skip_serializing_if = "SplitBy::is_column")]
    pub by: SplitBy,
    /// The split column (`by: column`, default `data.season_column`) or the group column
    /// (`by: group`, required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
    /// Seed of a random or grouped split (default 0); independent of the experiment seed, so
    /// runs with different seeds see the same split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Rows used to fit the model and the normalisation statistics (absent: the rest).
    #[serde(default, skip_serializing_if = "SplitPart::is_rest")]
    pub train: SplitPart,
    /// Rows used to pick the best epoch and the residual correlation.
    pub validation: SplitPart,
    /// Rows used only for the final report.
    pub test: SplitPart,
    /// How the split column's dates with the year last read: `mdy` (US, `03/01/2024` is
    /// 1 March) or `dmy` (EU, 3 January). Needed only when no value decides it (a field
    /// above 12); ISO and `YYYY/MM/DD` dates never need it (see `kiln::data::dates`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date_format: Option<DateOrder>,
}

pub use kiln_model::dates::DateOrder;

/// Where the data comes from and which columns matter.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// The data file: absolute, or relative to the config file's directory (read there when it
    /// exists), else to the working directory.
    pub path: PathBuf,
    /// The column holding the season used for the split.
    #[serde(default = "default_season_column")]
    pub season_column: String,
    /// Feature columns, in the order the network sees them.
    pub features: Vec<String>,
    /// Target columns.
    pub targets: Vec<String>,
    /// Per target column, the transform its network models it in (`log`, `log1p`,
    /// `positive` or `none`; absent: `none`). Training runs in the transformed space;
    /// predictions, intervals and every reported metric are in original units (see
    /// [`kiln_model::stats::TargetTransform`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub target_transform: std::collections::BTreeMap<String, kiln_model::stats::TargetTransform>,
    /// The split (see [`SplitConfig`]).
    pub split: SplitConfig,
    /// The CSV delimiter: `","`, `"\t"`, `";"` or `"|"` (absent: sniffed from the header
    /// line among comma, tab and semicolon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delimiter: Option<char>,
    /// What to do with missing cells (empty, `NaN`, `NA`, `null`) in feature columns; a row
    /// whose target is missing is always dropped from its split.
    #[serde(default, skip_serializing_if = "MissingConfig::is_default")]
    pub missing: MissingConfig,
    /// Which of `features` hold categories (text or integer codes): each becomes one 0/1
    /// input per value seen in the training split (the vocabulary travels in the
    /// checkpoint); a value the training split did not have sets none of them (the unknown
    /// bucket).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categorical: Vec<String>,
    /// Which of `categorical` match their categories ignoring case (`Rain` and `rain` are one
    /// category, in training and at predict/serve time; the vocabulary is stored lower-cased).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub case_insensitive: Vec<String>,
    /// Date features: each listed column (also in `features`) is read as a date (ISO, or US/EU
    /// forms as `split.date_format` or the values decide) and the network sees the listed
    /// parts, one input each (`year`, `month`, `day_of_week`, `day_of_year`,
    /// `elapsed_days`), named `<column>.<part>`. The same reading runs at predict and serve
    /// time, where the column is sent as text.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub dates: std::collections::BTreeMap<String, Vec<kiln_model::dates::DatePart>>,
    /// Piecewise-linear bins for every numeric feature (not categorical, not a date): `n`
    /// bins at the training split's quantiles, each one more network input beside the value
    /// (`<column>.bin<i>`); the same encoding runs at predict and serve time. 0 (the
    /// default): the values alone; `auto`: the validation split chooses (see
    /// [`NumericBins`]). A column with fewer than 3 distinct bin edges keeps its value
    /// alone. Always serialised, so that `--set data.numeric_bins=N` reaches a config that
    /// leaves it out.
    #[serde(default)]
    pub numeric_bins: NumericBins,
    /// A missing feature cell at predict and serve time in a column whose training split had
    /// none (`impute`, the default: the training split's median for a numeric column, the
    /// unknown bucket for a categorical one; `refuse`: an error naming the row and column).
    /// Columns imputed in training (`missing`) always impute.
    #[serde(default, skip_serializing_if = "PredictMissing::is_default")]
    pub predict_missing: PredictMissing,
    /// The most distinct training values a categorical column may have (a guard against an
    /// identifier column listed by mistake).
    #[serde(
        default = "default_max_categories",
        skip_serializing_if = "is_default_max_categories"
    )]
    pub max_categories: usize,
    /// A column of non-negative sample weights, used in the training loss and in every
    /// reported metric (absent: every row weighs the same). A row with a missing weight is
    /// dropped from its split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<String>,
    /// The file format: `csv` or `parquet` (absent: from the extension — `.parquet`/`.pq`
    /// is Parquet, anything else CSV, optionally gzip-compressed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<DataFormat>,
    /// Extra per-sample work in the data path: the number of passes of a real
    /// feature transform (a Box–Cox/Yeo–Johnson style power transform, evaluated and
    /// inverted) applied to each sample when a batch is assembled. 0 (default) disables
    /// it; larger values make the input pipeline measurably expensive, which the
    /// bottleneck verdict is meant to detect.
    #[serde(default)]
    pub transform_passes: u32,
}

impl DataConfig {
    /// The config as it read the rows a checkpoint with `preprocessing` was trained on:
    /// `numeric_bins: auto` becomes the count its run chose (the default bins when any input
    /// is binned, else none); a fixed count stays. Code that re-reads a run's data to feed
    /// its checkpoint (the gate, `kiln pick evaluate`) reads it through this.
    pub fn as_trained(
        &self,
        preprocessing: Option<&kiln_model::preprocess::Preprocessing>,
    ) -> Self {
        let mut cfg = self.clone();
        if cfg.numeric_bins == NumericBins::Auto {
            let binned = preprocessing.is_some_and(|p| p.inputs.iter().any(|c| c.bins.is_some()));
            cfg.numeric_bins = NumericBins::Fixed(if binned {
                NumericBins::AUTO_CANDIDATES[0]
            } else {
                0
            });
        }
        cfg
    }

    /// The columns a training run reads: features, targets, the weight column and the split
    /// column (none for a random split). Every other column of the file is skipped by the
    /// reader (see [`crate::data::table::CsvTable::read_file_columns`]).
    pub fn used_columns(&self) -> std::collections::BTreeSet<String> {
        let mut used: std::collections::BTreeSet<String> = self
            .features
            .iter()
            .chain(&self.targets)
            .chain(&self.weight)
            .cloned()
            .collect();
        match self.split.by {
            SplitBy::Column => {
                used.insert(
                    self.split
                        .column
                        .clone()
                        .unwrap_or_else(|| self.season_column.clone()),
                );
            }
            SplitBy::Group => used.extend(self.split.column.clone()),
            SplitBy::Random => {}
        }
        used
    }
}

/// Missing-value policies: one default and per-column exceptions.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MissingConfig {
    /// The policy of every feature column not listed in `columns` (default `error`).
    #[serde(default)]
    pub default: MissingPolicy,
    /// Per feature column.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub columns: std::collections::BTreeMap<String, MissingPolicy>,
}

impl MissingConfig {
    /// Whether nothing differs from the default (`error` everywhere).
    pub fn is_default(&self) -> bool {
        *self == MissingConfig::default()
    }

    /// The policy of a feature column.
    pub fn policy(&self, column: &str) -> &MissingPolicy {
        self.columns.get(column).unwrap_or(&self.default)
    }
}

/// What a missing cell does at predict and serve time in a column training had no holes in.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PredictMissing {
    /// The training split's median (numeric) or the unknown bucket (categorical).
    #[default]
    Impute,
    /// Refused with the row and column.
    Refuse,
}

impl PredictMissing {
    /// Whether this is the default (`impute`).
    pub fn is_default(&self) -> bool {
        *self == PredictMissing::Impute
    }
}

/// How a value is imputed.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Imputation {
    /// The training split's mean of the column.
    Mean,
    /// The training split's median of the column.
    Median,
    /// A fixed `value`.
    Constant,
}

/// What a missing feature cell does.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum MissingPolicy {
    /// Stop with the file, line and column (the default).
    #[default]
    Error,
    /// Drop the row from its split (counted and reported).
    DropRow,
    /// Fill the cell; statistics come from the training split only and travel in the
    /// checkpoint.
    Impute {
        /// Mean, median or constant.
        with: Imputation,
        /// The constant (`impute: constant` only).
        value: Option<f64>,
        /// Also give the network a `<column>_missing` 0/1 feature.
        indicator: bool,
    },
}

impl Serialize for MissingPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            MissingPolicy::Error => s.serialize_str("error"),
            MissingPolicy::DropRow => s.serialize_str("drop_row"),
            MissingPolicy::Impute {
                with,
                value,
                indicator,
            } => {
                let mut m = s.serialize_map(None)?;
                m.serialize_entry("impute", with)?;
                if let Some(v) = value {
                    m.serialize_entry("value", v)?;
                }
                if *indicator {
                    m.serialize_entry("indicator", indicator)?;
                }
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for MissingPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        const EXPECTED: &str = "expected `error`, `drop_row` or {impute: mean | median | constant, value: …, indicator: true | false}";
        let v = serde_json::Value::deserialize(d)?;
        match &v {
            serde_json::Value::String(s) if s == "error" => Ok(MissingPolicy::Error),
            serde_json::Value::String(s) if s == "drop_row" => Ok(MissingPolicy::DropRow),
            serde_json::Value::Object(map) => {
                if let Some(k) = map
                    .keys()
                    .find(|k| !["impute", "value", "indicator"].contains(&k.as_str()))
                {
                    return Err(D::Error::custom(format!("unknown key `{k}`: {EXPECTED}")));
                }
                let with: Imputation = match map.get("impute") {
                    Some(w) => serde_json::from_value(w.clone())
                        .map_err(|_| D::Error::custom(format!("{EXPECTED}, got impute: {w}")))?,
                    None => {
                        return Err(D::Error::custom(format!("{EXPECTED}: `impute` is missing")));
                    }
                };
                let value = match map.get("value") {
                    None => None,
                    Some(serde_json::Value::Number(n)) => n.as_f64(),
                    Some(other) => {
                        return Err(D::Error::custom(format!(
                            "`value` expects a number, got {other}"
                        )));
                    }
                };
                let indicator = match map.get("indicator") {
                    None => false,
                    Some(serde_json::Value::Bool(b)) => *b,
                    Some(other) => {
                        return Err(D::Error::custom(format!(
                            "`indicator` expects true or false, got {other}"
                        )));
                    }
                };
                Ok(MissingPolicy::Impute {
                    with,
                    value,
                    indicator,
                })
            }
            other => Err(D::Error::custom(format!("{EXPECTED}, got {other}"))),
        }
    }
}

/// The default of `data.max_categories`.
pub const DEFAULT_MAX_CATEGORIES: usize = 100;

fn default_max_categories() -> usize {
    DEFAULT_MAX_CATEGORIES
}

fn is_default_max_categories(n: &usize) -> bool {
    *n == DEFAULT_MAX_CATEGORIES
}

/// A data file's format.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// Delimited text, optionally gzip-compressed.
    Csv,
    /// Apache Parquet.
    Parquet,
}

impl DataFormat {
    /// The format of `path`: `format` when given, else Parquet for a `.parquet` or `.pq`
    /// extension and CSV otherwise.
    pub fn of(path: &std::path::Path, format: Option<DataFormat>) -> DataFormat {
        format.unwrap_or_else(|| {
            match path
                .extension()
                .and_then(|e| e.to_str())
                .map(|e| e.to_ascii_lowercase())
                .as_deref()
            {
                Some("parquet" | "pq") => DataFormat::Parquet,
                _ => DataFormat::Csv,
            }
        })
    }
}

fn default_season_column() -> String {
    "season".to_string()
}

pub use kiln_model::model::Activation;

/// The network architecture.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Backbone hidden widths; the default `[48, 48]` with 20 features and 3 targets gives
    /// 3,654 parameters.
    #[serde(default = "default_hidden")]
    pub hidden: Vec<usize>,
    /// Activation after each hidden layer.
    #[serde(default)]
    pub activation: Activation,
    /// Independent networks of this shape trained at once, packed side by side into one
    /// network (1: a single network). Each member learns from its own error; the served mean
    /// is the members' mean and the served variance comes from one head over all members'
    /// features. The exported network is one plain network `ensemble` times as wide.
    #[serde(default = "one_member")]
    pub ensemble: usize,
}

fn one_member() -> usize {
    1
}

fn default_hidden() -> Vec<usize> {
    vec![48, 48]
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            hidden: default_hidden(),
            activation: Activation::default(),
            ensemble: one_member(),
        }
    }
}

/// `num_workers`: a count, or `auto` = min(4, cores / 2), at least 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WorkerCount {
    /// min(4, cores / 2), at least 1.
    #[default]
    Auto,
    /// Exactly this many worker threads (0 = assemble batches on the training thread).
    Fixed(usize),
}

impl WorkerCount {
    /// The number of worker threads this setting means on this machine.
    pub fn resolve(self) -> usize {
        match self {
            WorkerCount::Fixed(n) => n,
            WorkerCount::Auto => {
                let cores = std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1);
                (cores / 2).clamp(1, 4)
            }
        }
    }
}

impl Serialize for WorkerCount {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            WorkerCount::Auto => s.serialize_str("auto"),
            WorkerCount::Fixed(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for WorkerCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = WorkerCount;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a non-negative integer or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<WorkerCount, E> {
                Ok(WorkerCount::Fixed(v as usize))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<WorkerCount, E> {
                if v < 0 {
                    return Err(E::custom(format!(
                        "num_workers must be ≥ 0 or \"auto\", got {v}"
                    )));
                }
                Ok(WorkerCount::Fixed(v as usize))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<WorkerCount, E> {
                if v == "auto" {
                    Ok(WorkerCount::Auto)
                } else {
                    Err(E::custom(format!(
                        "num_workers must be an integer or \"auto\", got \"{v}\""
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// The prefetching loader.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoaderConfig {
    /// Rows per batch.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Worker threads assembling batches ahead of the training step.
    #[serde(default)]
    pub num_workers: WorkerCount,
    /// Batches in flight (the bounded queue's depth across all workers).
    #[serde(default = "default_prefetch")]
    pub prefetch: usize,
    /// Shuffle each epoch (seeded; identical whatever the number of workers).
    #[serde(default = "default_true")]
    pub shuffle: bool,
    /// Drop a final partial batch.
    #[serde(default)]
    pub drop_last: bool,
}

fn default_batch_size() -> usize {
    128
}
fn default_prefetch() -> usize {
    4
}
fn default_true() -> bool {
    true
}

impl Default for LoaderConfig {
    fn default() -> Self {
        Self {
            batch_size: default_batch_size(),
            num_workers: WorkerCount::Auto,
            prefetch: default_prefetch(),
            shuffle: true,
            drop_last: false,
        }
    }
}

/// A part of the network that a stage can train.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Part {
    /// The hidden layers.
    Backbone,
    /// The mean head.
    MeanHead,
    /// The log-variance head.
    LogvarHead,
}

impl Part {
    /// The snake_case name used in configs.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// The loss a stage minimises (on normalised targets).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Mean squared error of the mean head.
    Mse,
    /// Gaussian negative log-likelihood of the log-variance head; the mean is detached when
    /// the mean head is not trainable in the stage.
    GaussianNll,
    /// Distillation, mean head: `α·MSE(μ, y) + (1 − α)·MSE(μ, μ_teacher)` (needs `distill`).
    DistillMse,
    /// Distillation, variance head: the Gaussian NLL's expectation under the teacher's
    /// predictive distribution `N(μ_T, σ_T²)`, `½·(log σ² + ((μ_T − μ)² + σ_T²)/σ²)` (needs
    /// `distill`); the mean is detached when the mean head is not trainable in the stage.
    DistillNll,
}

impl Loss {
    /// Whether the loss reads the teacher's predictions.
    pub fn is_distill(self) -> bool {
        matches!(self, Loss::DistillMse | Loss::DistillNll)
    }

    /// Whether the loss reads the log-variance head (the NLLs); the MSEs read the mean only.
    pub fn reads_log_var(self) -> bool {
        matches!(self, Loss::GaussianNll | Loss::DistillNll)
    }
}

/// Distillation: the student (this config's network) learns from a teacher's predictions,
/// computed once per run by the fastest inference engine (no autodiff). Several teachers form
/// an ensemble whose predictive distribution is moment matched: mean `μ = avg μ_i`, variance
/// `avg(σ_i² + μ_i²) − μ²`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DistillConfig {
    /// Weight of the true targets in the `distill_mse` loss (`1 − alpha` goes to the
    /// teacher's mean); in [0, 1].
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Teacher checkpoints: export directories or run directories holding `export/`.
    #[serde(default)]
    pub checkpoints: Vec<PathBuf>,
    /// Or a teacher experiment config: for each of `seeds` the latest finished run of it
    /// (same effective config) under its `export.dir` is the teacher, trained first when
    /// there is none.
    #[serde(default)]
    pub config: Option<PathBuf>,
    /// Seeds of the teacher runs of `config` (empty: the config's own seed); three seeds make
    /// an ensemble of three.
    #[serde(default)]
    pub seeds: Vec<u64>,
}

fn default_alpha() -> f64 {
    0.5
}

/// AdamW hyper-parameters. The defaults are PyTorch's (`torch.optim.AdamW`): lr 1e-3,
/// betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2 — Burn's own `AdamWConfig` defaults differ
/// (eps 1e-5, weight_decay 1e-4), so they are written out here.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// Base learning rate (the schedule's maximum).
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// First-moment decay.
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    /// Second-moment decay.
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    /// Added to the square root of the second moment.
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// Decoupled weight decay (multiplies the parameters by 1 − lr·wd each step).
    #[serde(default = "default_wd")]
    pub weight_decay: f64,
}

fn default_lr() -> f64 {
    1e-3
}
fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_eps() -> f64 {
    1e-8
}
fn default_wd() -> f64 {
    1e-2
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            lr: default_lr(),
            beta1: default_beta1(),
            beta2: default_beta2(),
            eps: default_eps(),
            weight_decay: default_wd(),
        }
    }
}

/// Learning-rate schedule, stepped once per optimizer step.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ScheduleConfig {
    /// The base learning rate throughout.
    #[default]
    Constant,
    /// PyTorch's `CosineAnnealingWarmRestarts`.
    CosineWarmRestarts {
        /// Steps in the first period.
        t_0: u64,
        /// Period growth factor after each restart (≥ 1).
        #[serde(default = "default_t_mult")]
        t_mult: u64,
        /// The floor of the learning rate.
        #[serde(default)]
        eta_min: f64,
    },
    /// A linear warmup over the first `warmup` fraction of the stage's optimizer steps, then
    /// half a cosine from the optimizer's lr down to `eta_min` at the stage's last step. The
    /// length is the stage's `epochs` × batches per epoch, so it needs no step count and
    /// fits any table size.
    Cosine {
        /// The fraction of the stage's steps spent warming up linearly from lr/steps (0 ≤ w < 1).
        #[serde(default)]
        warmup: f64,
        /// The floor of the learning rate reached at the stage's end.
        #[serde(default)]
        eta_min: f64,
    },
}

fn default_t_mult() -> u64 {
    1
}

/// One training stage.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// A label for logs.
    pub name: String,
    /// The parts whose parameters this stage updates; the others are frozen.
    pub trainable: Vec<Part>,
    /// The loss minimised.
    pub loss: Loss,
    /// Passes over the training split.
    pub epochs: usize,
    /// A fresh AdamW is built for each stage over its trainable parameters.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// The learning-rate schedule.
    #[serde(default)]
    pub schedule: ScheduleConfig,
    /// Global L2 gradient-norm clipping threshold (`null` disables).
    #[serde(default)]
    pub clip_norm: Option<f64>,
    /// Stop the stage when the validation loss has not improved for `patience` epochs
    /// (absent: run every epoch). With `select: best` the best epoch is restored either way.
    #[serde(default)]
    pub early_stopping: Option<EarlyStopping>,
    /// Which epoch's weights the stage ends with: the one with the lowest validation loss
    /// (`best`, the default) or the last one (`last`: no selection on a noisy validation
    /// curve; natural with a schedule that decays to its floor).
    #[serde(default)]
    pub select: EpochSelection,
}

/// Which epoch of a stage is kept.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EpochSelection {
    /// The epoch with the lowest validation loss.
    #[default]
    Best,
    /// The last epoch run.
    Last,
}

impl EpochSelection {
    /// Whether this is the default, [`EpochSelection::Best`].
    pub fn is_best(&self) -> bool {
        *self == EpochSelection::Best
    }
}

/// Early stopping on the validation loss, per stage.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EarlyStopping {
    /// Epochs without an improvement after which the stage ends (≥ 1).
    pub patience: usize,
    /// An epoch improves only when its validation loss is below the best so far by more than
    /// this (≥ 0, in the loss's units).
    #[serde(default)]
    pub min_delta: f64,
}

impl EarlyStopping {
    /// Whether a stage whose validation losses so far are `losses` (one per epoch, in order)
    /// stops now: the last `patience` epochs brought no improvement beyond `min_delta` over the
    /// best loss before them. Computed from the history alone, so a resumed run decides exactly
    /// as an uninterrupted one.
    pub fn should_stop(&self, losses: &[f64]) -> bool {
        let mut reference = f64::INFINITY;
        let mut last_improvement: Option<usize> = None;
        for (i, &v) in losses.iter().enumerate() {
            if v.is_finite() && (reference.is_infinite() || v < reference - self.min_delta) {
                reference = v;
                last_improvement = Some(i);
            }
        }
        let since = match last_improvement {
            Some(i) => losses.len() - 1 - i,
            None => losses.len(),
        };
        self.patience > 0 && since >= self.patience
    }
}

/// Where runs and exports are written.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    /// Root of run directories (`<dir>/runs/<run-id>/`).
    #[serde(default = "default_out_dir")]
    pub dir: PathBuf,
    /// The inference engine the serving tier will run this model on; the latency logged at
    /// the end of every run is measured on it (`null`: the default serving engine, `auto`).
    /// The name as written: checked at load (a located `export.engine` error listing the
    /// engines), read as [`ExportConfig::engine_kind`].
    #[serde(default)]
    pub engine: Option<String>,
}

impl ExportConfig {
    /// The engine `engine` names (`None`: the serving default). A loaded config's name is
    /// checked at load; a name this build does not know (only in a config never validated)
    /// reads as `None`.
    pub fn engine_kind(&self) -> Option<crate::records::EngineKind> {
        self.engine.as_deref().and_then(|e| e.parse().ok())
    }
}

fn default_out_dir() -> PathBuf {
    PathBuf::from("checkpoints")
}

impl Default for ExportConfig {
    fn default() -> Self {
        Self {
            dir: default_out_dir(),
            engine: None,
        }
    }
}

/// The scheduled profiler (`wait`, `warmup`, `active`, `repeat` in optimizer steps).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProfileConfig {
    /// Whether the profiler fires at all.
    #[serde(default)]
    pub enabled: bool,
    /// Steps skipped before warm-up.
    #[serde(default = "default_one")]
    pub wait: u64,
    /// Steps run with spans enabled but not recorded.
    #[serde(default = "default_one")]
    pub warmup: u64,
    /// Steps recorded.
    #[serde(default = "default_three")]
    pub active: u64,
    /// Cycles of wait/warmup/active (the profiler fires once per job; repeat ≥ 1).
    #[serde(default = "default_one")]
    pub repeat: u64,
    /// Record tensor shapes as span arguments.
    #[serde(default)]
    pub record_shapes: bool,
    /// Record memory deltas per span.
    #[serde(default)]
    pub profile_memory: bool,
    /// Record the source location of each span.
    #[serde(default)]
    pub with_stack: bool,
    /// Output directory, relative to the run directory unless absolute.
    #[serde(default = "default_profile_dir")]
    pub out_dir: PathBuf,
}

fn default_one() -> u64 {
    1
}
fn default_three() -> u64 {
    3
}
fn default_profile_dir() -> PathBuf {
    PathBuf::from("profile")
}

impl Default for ProfileConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            wait: 1,
            warmup: 1,
            active: 3,
            repeat: 1,
            record_shapes: false,
            profile_memory: false,
            with_stack: false,
            out_dir: default_profile_dir(),
        }
    }
}

/// Run registry settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// SQLite file; default `<export.dir>/runs.db`.
    #[serde(default)]
    pub path: Option<PathBuf>,
}
