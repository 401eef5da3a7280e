//! Everything fit from the training split before the first step: the data, the feature and
//! target normalisation, and the architecture.

use crate::config::ExperimentConfig;
use crate::data::dataset::fit_stats_weighted;
use crate::data::{ColumnStats, DataError, Dataset};
use crate::model::RegressionNetConfig;
use kiln_model::stats::TargetTransform;

/// Everything fit from the training split before the first step.
pub struct Prepared {
    /// The data.
    pub data: Dataset,
    /// Rows of the training split as the data file's split defines it: all of `data.train`,
    /// except in a refit pass, which appends the validation rows after them.
    pub split_train_rows: usize,
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
        Self::from_dataset(cfg, Dataset::load(&cfg.data)?)
    }

    /// Fit the normalisation on the training split of `data`, already read from `cfg.data`
    /// (a training run reads its data file once, whatever its passes). Targets with a
    /// `data.target_transform` are transformed first (every split), so that training and the
    /// normalisation run in the transformed space; a value outside the transform's support
    /// is an error naming the row.
    pub fn from_dataset(cfg: &ExperimentConfig, mut data: Dataset) -> Result<Self, DataError> {
        let transforms = transform_targets(cfg, &mut data)?;
        let split_train_rows = data.train.rows();
        if cfg.refit_pass.is_some() {
            // The refit pass trains on train + validation (validation stays as it is, for
            // the per-epoch log only: it is no longer held out).
            let v = &data.validation;
            let t = &mut data.train;
            t.x.extend_from_slice(&v.x);
            t.y.extend_from_slice(&v.y);
            t.season.extend_from_slice(&v.season);
            t.source_rows.extend_from_slice(&v.source_rows);
            t.w.extend_from_slice(&v.w);
        }
        let w = data.train.weights();
        let x_stats = fit_stats_weighted(&data.features, &data.train.x, w);
        let mut y_stats = fit_stats_weighted(&data.targets, &data.train.y, w);
        for (s, t) in y_stats.iter_mut().zip(transforms) {
            s.transform = t;
        }
        let arch = RegressionNetConfig {
            n_features: data.n_features(),
            // A packed ensemble is one network `ensemble` times as wide.
            hidden: cfg
                .model
                .hidden
                .iter()
                .map(|w| w * cfg.model.ensemble)
                .collect(),
            n_targets: data.n_targets(),
            activation: cfg.model.activation,
        };
        Ok(Self {
            data,
            split_train_rows,
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

/// Apply `data.target_transform` to the targets of every split in place; returns each
/// target's transform (in `data.targets` order).
fn transform_targets(
    cfg: &ExperimentConfig,
    data: &mut Dataset,
) -> Result<Vec<TargetTransform>, DataError> {
    let transforms: Vec<TargetTransform> = data
        .targets
        .iter()
        .map(|t| {
            cfg.data
                .target_transform
                .get(t)
                .copied()
                .unwrap_or_default()
        })
        .collect();
    let k = transforms.len();
    if transforms.iter().all(TargetTransform::is_none) {
        return Ok(transforms);
    }
    for (split, sub) in [
        ("train", &mut data.train),
        ("validation", &mut data.validation),
        ("test", &mut data.test),
    ] {
        for (o, y) in sub.y.iter_mut().enumerate() {
            let t = transforms[o % k];
            if t.is_none() {
                continue;
            }
            match t.forward(*y as f64) {
                Some(z) if (z as f32).is_finite() => *y = z as f32,
                _ => {
                    let row = sub.source_rows.get(o / k).copied().unwrap_or(o / k);
                    return Err(DataError::Cell {
                        path: cfg.data.path.clone(),
                        line: row as u64 + 2,
                        column: data.targets[o % k].clone(),
                        message: format!(
                            "{} (data row {}, {split} split): the target transform `{}` needs {}; use `log1p` for a target with zeros, or `none`",
                            y,
                            row + 1,
                            t.name(),
                            t.support()
                        ),
                    });
                }
            }
        }
    }
    Ok(transforms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RefitPass, parse};
    use crate::data::table::CsvTable;
    use std::path::Path;

    #[test]
    fn a_refit_pass_trains_on_train_and_validation_rows_with_their_weights() {
        let cfg_text = "data:\n  path: t.csv\n  features: [a]\n  weight: w\n  targets: [y]\n  split:\n    train: {to: 2001}\n    validation: {from: 2002, to: 2002}\n    test: {from: 2003}\nstages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 1\n";
        let mut cfg = parse(cfg_text, Path::new("t.yaml")).unwrap();
        let csv = "season,a,w,y\n2000,1,1,1\n2001,3,0.5,3\n2002,5,2,5\n2002,6,1,6\n2003,7,1,7\n";
        let table = CsvTable::from_bytes(csv.as_bytes(), Path::new("t.csv")).unwrap();
        let data = Dataset::from_table(&cfg.data, &table, String::new()).unwrap();
        let selection = Prepared::from_dataset(&cfg, data.clone()).unwrap();
        assert_eq!(selection.split_train_rows, 2);
        assert_eq!(selection.data.train.rows(), 2);
        cfg.refit_pass = Some(RefitPass {
            provenance: Default::default(),
        });
        let refit = Prepared::from_dataset(&cfg, data).unwrap();
        // The file's training split is still the first two rows; validation's follow them,
        // each with its weight (the loader needs one per row).
        assert_eq!(refit.split_train_rows, 2);
        assert_eq!(refit.data.train.y, vec![1.0, 3.0, 5.0, 6.0]);
        assert_eq!(refit.data.train.w, vec![1.0, 0.5, 2.0, 1.0]);
        assert_eq!(refit.data.validation.rows(), 2);
        assert!(refit.x_stats[0].mean > selection.x_stats[0].mean);
    }
}
