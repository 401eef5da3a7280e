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
    /// A target only: the transform the network models the column in (`mean` and `std`
    /// are then the transformed column's); absent in the manifest when none, so older
    /// checkpoints load as untransformed.
    #[serde(default, skip_serializing_if = "TargetTransform::is_none")]
    pub transform: TargetTransform,
}

/// A target transform: the network models `z = f(y)` as `N(μ, σ²)`; predictions, intervals
/// and metrics are mapped back to the original units of `y`.
///
/// - `log`: `z = ln y`, for `y > 0`.
/// - `log1p`: `z = ln(1 + y)`, for `y > −1` (a non-negative target with zeros).
/// - `positive`: `z = ln(eʸ − 1)`, the inverse of softplus, for `y > 0`: like `log` for
///   values well below 1 and nearly the identity above a few units, so it enforces a
///   positive support while leaving large values almost as they are (it depends on the
///   column's units).
///
/// The predicted mean in original units is the predictive mean `E[y]` (for `log`,
/// `exp(μ + σ²/2)`), not the median `exp(μ)`: the mean is what minimises the expected
/// squared error, the metric every comparison reports; the median is the 50 % quantile
/// ([`TargetTransform::quantile`]). Quantiles map through `f⁻¹` exactly (it is monotone),
/// so every interval stays inside the support.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetTransform {
    /// The column as it is.
    #[default]
    None,
    /// `ln y` (`y > 0`).
    Log,
    /// `ln(1 + y)` (`y > −1`).
    Log1p,
    /// The inverse softplus `ln(eʸ − 1)` (`y > 0`).
    Positive,
}

/// Standard-normal nodes of the probability-midpoint rule used for the moments of
/// transforms without a closed form, rescaled so that their second moment is exactly 1.
fn moment_nodes() -> &'static [f64] {
    static NODES: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    NODES.get_or_init(|| {
        const M: usize = 64;
        let z: Vec<f64> = (0..M)
            .map(|i| kiln_mvn::normal::norm_ppf((i as f64 + 0.5) / M as f64))
            .collect();
        let rms = (z.iter().map(|v| v * v).sum::<f64>() / M as f64).sqrt();
        z.iter().map(|v| v / rms).collect()
    })
}

impl TargetTransform {
    /// Whether this is [`TargetTransform::None`].
    pub fn is_none(&self) -> bool {
        *self == TargetTransform::None
    }

    /// The name used in configs and manifests.
    pub fn name(self) -> &'static str {
        match self {
            TargetTransform::None => "none",
            TargetTransform::Log => "log",
            TargetTransform::Log1p => "log1p",
            TargetTransform::Positive => "positive",
        }
    }

    /// The values the transform accepts, in words (for error messages).
    pub fn support(self) -> &'static str {
        match self {
            TargetTransform::None => "any finite number",
            TargetTransform::Log | TargetTransform::Positive => "y > 0",
            TargetTransform::Log1p => "y > -1",
        }
    }

    /// `z = f(y)`; `None` when `y` is outside the support or `z` is not finite.
    pub fn forward(self, y: f64) -> Option<f64> {
        let z = match self {
            TargetTransform::None => y,
            TargetTransform::Log if y > 0.0 => y.ln(),
            TargetTransform::Log1p if y > -1.0 => y.ln_1p(),
            // ln(eʸ − 1) = y + ln(1 − e⁻ʸ), exact for large y too.
            TargetTransform::Positive if y > 0.0 => y + (-(-y).exp_m1()).ln(),
            _ => return None,
        };
        z.is_finite().then_some(z)
    }

    /// `y = f⁻¹(z)`.
    pub fn inverse(self, z: f64) -> f64 {
        match self {
            TargetTransform::None => z,
            TargetTransform::Log => z.exp(),
            TargetTransform::Log1p => z.exp_m1(),
            // softplus, without overflow.
            TargetTransform::Positive => z.max(0.0) + (-z.abs()).exp().ln_1p(),
        }
    }

    /// `ln |dz/dy|` at `y` (inside the support): the density of `y` is the density of
    /// `z = f(y)` times `|dz/dy|`, so an NLL in original units is the NLL of `z` minus this.
    pub fn log_jacobian(self, y: f64) -> f64 {
        match self {
            TargetTransform::None => 0.0,
            TargetTransform::Log => -y.ln(),
            TargetTransform::Log1p => -y.ln_1p(),
            TargetTransform::Positive => -(-(-y).exp_m1()).ln(),
        }
    }

    /// The `p` quantile in original units of `y` when `z ~ N(mu, sd²)`.
    pub fn quantile(self, mu: f64, sd: f64, p: f64) -> f64 {
        self.inverse(mu + sd * kiln_mvn::normal::norm_ppf(p))
    }

    /// The predictive mean and standard deviation of `y` in original units when
    /// `z ~ N(mu, sd²)`: closed forms for `log` and `log1p` (the log-normal moments), a
    /// 64-node probability-midpoint rule for `positive`.
    pub fn moments(self, mu: f64, sd: f64) -> (f64, f64) {
        match self {
            TargetTransform::None => (mu, sd),
            TargetTransform::Log | TargetTransform::Log1p => {
                let s2 = sd * sd;
                let m = (mu + 0.5 * s2).exp();
                let v = s2.exp_m1() * m * m;
                let shift = if self == TargetTransform::Log1p {
                    1.0
                } else {
                    0.0
                };
                (m - shift, v.sqrt())
            }
            TargetTransform::Positive => {
                let nodes = moment_nodes();
                let n = nodes.len() as f64;
                let (mut s, mut s2) = (0.0, 0.0);
                for &q in nodes {
                    let y = self.inverse(mu + sd * q);
                    s += y;
                    s2 += y * y;
                }
                let m = s / n;
                (m, (s2 / n - m * m).max(0.0).sqrt())
            }
        }
    }
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
                transform: TargetTransform::None,
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

    #[test]
    fn target_transforms_invert_and_respect_their_support() {
        use TargetTransform as T;
        for t in [T::None, T::Log, T::Log1p, T::Positive] {
            for y in [1e-3, 0.5, 1.0, 7.0, 250.0, 1e5] {
                let z = t.forward(y).unwrap();
                let back = t.inverse(z);
                assert!(
                    (back - y).abs() <= 1e-9 * y.max(1.0),
                    "{t:?} {y} → {z} → {back}"
                );
                // The Jacobian against a central difference of f.
                let h = 1e-6 * y;
                let d = (t.forward(y + h).unwrap() - t.forward(y - h).unwrap()) / (2.0 * h);
                assert!((t.log_jacobian(y) - d.ln()).abs() < 1e-5, "{t:?} {y}");
            }
        }
        assert_eq!(T::Log.forward(0.0), None);
        assert_eq!(T::Log.forward(-2.0), None);
        assert_eq!(T::Positive.forward(0.0), None);
        assert_eq!(T::Log1p.forward(0.0), Some(0.0));
        assert_eq!(T::Log1p.forward(-1.0), None);
        // Far-out quantiles stay inside the support.
        for t in [T::Log, T::Positive] {
            assert!(t.quantile(-3.0, 4.0, 1e-6) >= 0.0);
            assert!(t.quantile(2.0, 0.5, 0.05) > 0.0);
        }
        assert!(T::Log1p.quantile(-3.0, 4.0, 1e-6) >= -1.0);
    }

    #[test]
    fn moments_are_the_log_normal_ones_and_the_grid_is_exact_for_the_identity() {
        use TargetTransform as T;
        let (m, s) = T::Log.moments(1.0, 0.5);
        assert!((m - (1.0f64 + 0.125).exp()).abs() < 1e-12);
        let v = (0.25f64.exp() - 1.0) * (2.0f64 + 0.25).exp();
        assert!((s - v.sqrt()).abs() < 1e-12);
        let (m1, _) = T::Log1p.moments(1.0, 0.5);
        assert!((m1 - (m - 1.0)).abs() < 1e-12);
        // Far from 0, softplus is the identity: the grid gives back (μ, σ).
        let (m, s) = T::Positive.moments(50.0, 2.0);
        assert!((m - 50.0).abs() < 1e-9 && (s - 2.0).abs() < 1e-9, "{m} {s}");
        // Near 0 the mean is positive and above the median.
        let (m, s) = T::Positive.moments(-1.0, 1.0);
        assert!(m > T::Positive.inverse(-1.0) && s > 0.0);
        // Against the log-normal closed form, the grid is within 1 % for the log transform.
        let nodes = moment_nodes();
        let grid = nodes.iter().map(|q| (1.0 + 0.5 * q).exp()).sum::<f64>() / nodes.len() as f64;
        assert!((grid / T::Log.moments(1.0, 0.5).0 - 1.0).abs() < 0.01);
    }
}
