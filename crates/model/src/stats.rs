//! Per-column normalisation fit on the training split, and its fast f32 form: what a
//! checkpoint's manifest stores for its features and targets.

use serde::{Deserialize, Serialize};

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
    fit_stats_weighted(names, m, None)
}

/// [`fit_stats`] with one weight per row (`None`: equal): the weighted mean and standard
/// deviation, so that rows of weight 0 do not move the normalisation either.
pub fn fit_stats_weighted(names: &[String], m: &[f32], w: Option<&[f64]>) -> Vec<ColumnStats> {
    let k = names.len();
    let n = m.len() / k.max(1);
    let wi = |i: usize| w.map_or(1.0, |w| w[i]);
    let total: f64 = (0..n).map(wi).sum::<f64>();
    let total = if total > 0.0 { total } else { 1.0 };
    names
        .iter()
        .enumerate()
        .map(|(j, name)| {
            let mean = (0..n).map(|i| wi(i) * m[i * k + j] as f64).sum::<f64>() / total;
            let var = (0..n)
                .map(|i| {
                    let d = m[i * k + j] as f64 - mean;
                    wi(i) * d * d
                })
                .sum::<f64>()
                / total;
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
