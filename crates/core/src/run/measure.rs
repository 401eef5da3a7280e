//! The measurements a run stores in its manifest, taken on the trained model in memory before
//! its one export ([`crate::train::Measure`]): the int8 engine's accuracy change on the test
//! split (`metrics.int8_test_delta`, so the serving tier can decide whether int8 is
//! acceptable), the latency on the serving engine (`export.engine`, batch 1 and 128:
//! `latency`) and the pick probabilities against the test outcomes
//! (`metrics.pick_evaluation`). The int8 check and the pick evaluation are advisory: a failure
//! leaves them out with a warning; a failed latency measurement fails the run.

use std::time::Duration;

use crate::bench::latency;
use crate::infer::EngineKind;
use crate::pick::outcomes::{self, ModelParts, OutcomeRows};
use crate::train::{Candidate, Measure, MeasureError, Measurements};

/// The measurements of [`crate::run::TrainingRun`].
#[derive(Debug, Clone)]
pub struct RunMeasure {
    engine: EngineKind,
}

impl RunMeasure {
    /// Measure latency on `engine` (the config's `export.engine`; `None`: the serving
    /// tier's default).
    pub fn new(engine: Option<EngineKind>) -> Self {
        Self {
            engine: engine.unwrap_or(latency::serving_engine()),
        }
    }
}

impl Measure for RunMeasure {
    fn measure(&self, c: &Candidate<'_>) -> Result<Measurements, MeasureError> {
        let (prep, data) = (c.data, &c.data.data);
        let int8 = crate::infer::int8_accuracy_on(
            c.weights,
            &prep.x_stats,
            &prep.y_stats,
            &data.test.x,
            &data.test.y,
        );
        let int8_test_delta = int8
            .inspect_err(|e| tracing::warn!("int8 accuracy check skipped: {e}"))
            .ok();
        let report = latency::measure_model(
            c.weights,
            &prep.x_stats,
            &prep.y_stats,
            self.engine,
            &[1, 128],
            2000,
            Duration::from_millis(250),
        )?;
        let model = ModelParts {
            weights: c.weights,
            features: &prep.x_stats,
            targets: &prep.y_stats,
            residual_correlation: c.residual_correlation,
        };
        // The lines and baselines of the split the data file defines (a refit pass's
        // training rows include validation's).
        let rows = OutcomeRows::of(data, prep.split_train_rows);
        let pick_evaluation = outcomes::evaluate_model(model, rows, Default::default())
            .inspect_err(|e| tracing::warn!("pick evaluation skipped: {e}"))
            .ok();
        Ok(Measurements {
            int8_test_delta,
            pick_evaluation,
            latency: Some(report),
        })
    }
}
