//! The training table: features and targets as f32 matrices, split by season, with
//! normalisation statistics fit on the training split only.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::table::{CsvTable, DataError};
use crate::config::DataConfig;

/// Rows of features and targets (row-major), raw units.
#[derive(Debug, Clone, Default)]
pub struct Subset {
    /// `rows × n_features`.
    pub x: Vec<f32>,
    /// `rows × n_targets`.
    pub y: Vec<f32>,
    /// The season of each row.
    pub season: Vec<i64>,
    /// Each row's index among the file's data rows (0 = the first row after the header), so
    /// that other columns of the same rows can be read back (e.g. the gate's group column).
    pub source_rows: Vec<usize>,
}

impl Subset {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.season.len()
    }
}

/// A dataset read from a CSV file and split by season.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The CSV file.
    pub path: PathBuf,
    /// SHA-256 of the file's bytes (hex).
    pub sha256: String,
    /// Feature column names, in network order.
    pub features: Vec<String>,
    /// Target column names.
    pub targets: Vec<String>,
    /// Training rows.
    pub train: Subset,
    /// Validation rows.
    pub validation: Subset,
    /// Test rows.
    pub test: Subset,
    /// Rows in the file outside every split.
    pub unused_rows: usize,
}

impl Dataset {
    /// Read `cfg.path`, select the configured columns and split by season.
    pub fn load(cfg: &DataConfig) -> Result<Self, DataError> {
        let bytes = std::fs::read(&cfg.path).map_err(|source| DataError::Io {
            path: cfg.path.clone(),
            source,
        })?;
        let sha256 = sha256_hex(&bytes);
        let table = CsvTable::from_bytes(&bytes, &cfg.path)?;
        if table.rows.is_empty() {
            return Err(DataError::Empty {
                path: cfg.path.clone(),
            });
        }
        let x = table.numeric_matrix(&cfg.features)?;
        let y = table.numeric_matrix(&cfg.targets)?;
        let seasons = table.numeric_column(&cfg.season_column)?;
        let (nf, nt) = (cfg.features.len(), cfg.targets.len());
        let mut parts = [Subset::default(), Subset::default(), Subset::default()];
        let ranges = [&cfg.split.train, &cfg.split.validation, &cfg.split.test];
        let mut unused = 0;
        for (i, &s) in seasons.iter().enumerate() {
            let season = s as i64;
            match ranges.iter().position(|r| r.contains(season)) {
                Some(p) => {
                    let part = &mut parts[p];
                    part.x.extend_from_slice(&x[i * nf..(i + 1) * nf]);
                    part.y.extend_from_slice(&y[i * nt..(i + 1) * nt]);
                    part.season.push(season);
                    part.source_rows.push(i);
                }
                None => unused += 1,
            }
        }
        let names = ["train", "validation", "test"];
        for (k, part) in parts.iter().enumerate() {
            if part.rows() == 0 {
                return Err(DataError::EmptySplit {
                    path: cfg.path.clone(),
                    split: names[k],
                    range: ranges[k].to_string(),
                    column: cfg.season_column.clone(),
                });
            }
        }
        let [train, validation, test] = parts;
        Ok(Self {
            path: cfg.path.clone(),
            sha256,
            features: cfg.features.clone(),
            targets: cfg.targets.clone(),
            train,
            validation,
            test,
            unused_rows: unused,
        })
    }

    /// Number of features.
    pub fn n_features(&self) -> usize {
        self.features.len()
    }

    /// Number of targets.
    pub fn n_targets(&self) -> usize {
        self.targets.len()
    }
}

pub use crate::util::{sha256_file, sha256_hex};

/// Per-column affine normalisation `(v − mean) / std`, fit on the training split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnStats {
    /// Column name.
    pub name: String,
    /// Training mean.
    pub mean: f64,
    /// Training standard deviation (1 when the column is constant).
    pub std: f64,
}

/// Fit mean and standard deviation of each column of a row-major matrix.
pub fn fit_stats(names: &[String], m: &[f32]) -> Vec<ColumnStats> {
    let k = names.len();
    let n = m.len() / k.max(1);
    names
        .iter()
        .enumerate()
        .map(|(j, name)| {
            let mean = (0..n).map(|i| m[i * k + j] as f64).sum::<f64>() / n.max(1) as f64;
            let var = (0..n)
                .map(|i| {
                    let d = m[i * k + j] as f64 - mean;
                    d * d
                })
                .sum::<f64>()
                / n.max(1) as f64;
            let std = var.sqrt();
            ColumnStats {
                name: name.clone(),
                mean,
                std: if std > 1e-12 { std } else { 1.0 },
            }
        })
        .collect()
}

/// Precomputed f32 scale/shift for fast normalisation of row-major matrices.
#[derive(Debug, Clone, PartialEq)]
pub struct Affine {
    /// `1 / std` per column.
    pub scale: Vec<f32>,
    /// `mean` per column.
    pub shift: Vec<f32>,
}

impl Affine {
    /// Build from column statistics.
    pub fn new(stats: &[ColumnStats]) -> Self {
        Self {
            scale: stats.iter().map(|s| (1.0 / s.std) as f32).collect(),
            shift: stats.iter().map(|s| s.mean as f32).collect(),
        }
    }

    /// Normalise one row in place.
    #[inline]
    pub fn apply_row(&self, row: &mut [f32]) {
        for ((v, &m), &s) in row.iter_mut().zip(&self.shift).zip(&self.scale) {
            *v = (*v - m) * s;
        }
    }

    /// Normalise a row-major matrix in place.
    pub fn apply(&self, m: &mut [f32]) {
        let k = self.scale.len();
        for row in m.chunks_exact_mut(k) {
            self.apply_row(row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_affine_round_trip() {
        let names = vec!["a".to_string(), "b".to_string()];
        let m = vec![1.0, 5.0, 3.0, 5.0];
        let s = fit_stats(&names, &m);
        assert_eq!(s[0].mean, 2.0);
        assert_eq!(s[0].std, 1.0);
        assert_eq!(s[1].std, 1.0, "constant column gets std 1");
        let mut x = m.clone();
        Affine::new(&s).apply(&mut x);
        assert_eq!(x, vec![-1.0, 0.0, 1.0, 0.0]);
    }
}
