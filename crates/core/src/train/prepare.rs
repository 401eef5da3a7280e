//! Everything fit from the training split before the first step: the data, the feature and
//! target normalisation, and the architecture.

use crate::config::ExperimentConfig;
use crate::data::dataset::fit_stats_weighted;
use crate::data::{ColumnStats, DataError, Dataset};
use crate::model::RegressionNetConfig;

/// Everything fit from the training split before the first step.
pub struct Prepared {
    /// The data.
    pub data: Dataset,
    /// Feature normalisation.
    pub x_stats: Vec<ColumnStats>,
    /// Target normalisation.
    pub y_stats: Vec<ColumnStats>,
    /// The architecture.
    pub arch: RegressionNetConfig,
}

impl Prepared {
    /// Load the dataset and fit the normalisation on the training split.
    pub fn new(cfg: &ExperimentConfig) -> Result<Self, DataError> {
        let mut data = Dataset::load(&cfg.data)?;
        if cfg.refit_pass.is_some() {
            // The refit pass trains on train + validation (validation stays as it is, for
            // the per-epoch log only: it is no longer held out).
            let v = &data.validation;
            let t = &mut data.train;
            t.x.extend_from_slice(&v.x);
            t.y.extend_from_slice(&v.y);
            t.season.extend_from_slice(&v.season);
            t.source_rows.extend_from_slice(&v.source_rows);
        }
        let w = data.train.weights();
        let x_stats = fit_stats_weighted(&data.features, &data.train.x, w);
        let y_stats = fit_stats_weighted(&data.targets, &data.train.y, w);
        let arch = RegressionNetConfig {
            n_features: data.n_features(),
            hidden: cfg.model.hidden.clone(),
            n_targets: data.n_targets(),
            activation: cfg.model.activation,
        };
        Ok(Self {
            data,
            x_stats,
            y_stats,
            arch,
        })
    }

    /// For each target, the feature holding last season's value (`<target>_l1`).
    pub fn persistence_features(&self) -> Vec<Option<usize>> {
        self.data
            .targets
            .iter()
            .map(|t| {
                self.data
                    .features
                    .iter()
                    .position(|f| *f == format!("{t}_l1"))
            })
            .collect()
    }
}
