//! What a run measures of its trained model before the one export: the int8 engine's accuracy
//! change, the serving engine's latency and the pick evaluation against the test outcomes.
//!
//! Training (level 3) may not import the inference engines' users (level 4), so, as with the
//! [`super::Teacher`], the run layer implements [`Measure`] and hands it down
//! ([`crate::run::TrainingRun`] does). The session calls it on the final weights in memory and
//! the data it already holds, and writes the answers into the manifest it then seals once: a
//! checkpoint that exists is complete.

use crate::artifact::HostWeights;
use crate::records::metrics::{Int8AccuracyReport, LatencyReport, PickEvaluation};

use super::prepare::Prepared;

/// The model about to be exported, as the measurements see it.
#[derive(Clone, Copy)]
pub struct Candidate<'a> {
    /// Its weights, exactly as they will be exported.
    pub weights: &'a HostWeights,
    /// Residual correlation between targets (`k × k`), as the manifest will hold it.
    pub residual_correlation: &'a [Vec<f64>],
    /// The data it was trained on, with its normalisation (`x_stats`, `y_stats`: the
    /// manifest's features and targets). In a refit pass `data.train` holds the validation
    /// rows too; [`Prepared::split_train_rows`] says where the file's training split ends.
    pub data: &'a Prepared,
}

/// What the measurements found; each goes into the manifest when present.
#[derive(Debug, Clone, Default)]
pub struct Measurements {
    /// `metrics.int8_test_delta`: the int8 engine's accuracy change on the test split.
    pub int8_test_delta: Option<Int8AccuracyReport>,
    /// `metrics.pick_evaluation`: pick probabilities against the test outcomes.
    pub pick_evaluation: Option<PickEvaluation>,
    /// `latency`: the serving engine's latency.
    pub latency: Option<LatencyReport>,
}

/// The error of a measurement that must not fail (the advisory ones leave their entry out).
pub type MeasureError = Box<dyn std::error::Error + Send + Sync>;

/// Measures a trained model before its export.
pub trait Measure: Sync {
    /// Measure `candidate`.
    fn measure(&self, candidate: &Candidate<'_>) -> Result<Measurements, MeasureError>;
}
