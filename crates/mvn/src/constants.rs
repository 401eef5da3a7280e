//! The estimator's precomputed constants: built once from the config as f32 arrays (the
//! module's tensors are made from them), and the CPU path's host copy in f64, rebuilt from
//! the tensors whenever the module loads a record.

use super::PointSet;
use super::halton::{SplitMix64, scrambled_halton};
use super::normal::{BLOCK, norm_ppf};
use super::sobol::scrambled_sobol;

/// Smallest and largest uniform fed to Φ⁻¹ for the naive quantile table.
const QUANTILE_CLAMP: f64 = 1.0 / 4_294_967_296.0; // 2^-32
/// The largest f32 below 1.
const BELOW_ONE: f32 = 1.0 - f32::EPSILON / 2.0;

/// The constants as plain f32 arrays, row-major.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawConstants {
    /// Number of points n per randomisation.
    pub n: usize,
    /// Number of coordinates (the maximum dimension).
    pub max_dim: usize,
    /// Number of randomisations R.
    pub randomizations: usize,
    /// R independently scrambled Halton (or Sobol') sets, R × n × max_dim, in [0, 1).
    pub points: Vec<f32>,
    /// Φ⁻¹ of the points, R × n × max_dim (naive method only).
    pub quantiles: Option<Vec<f32>>,
}

impl RawConstants {
    /// Draws the R scrambled Halton point sets for a seed.
    #[cfg(test)]
    pub fn generate(
        n: usize,
        max_dim: usize,
        randomizations: usize,
        seed: u64,
        with_quantiles: bool,
    ) -> Self {
        Self::generate_set(
            PointSet::Halton,
            n,
            max_dim,
            randomizations,
            seed,
            with_quantiles,
        )
    }

    /// Draws the R scrambled point sets of `sequence` for a seed.
    pub fn generate_set(
        sequence: PointSet,
        n: usize,
        max_dim: usize,
        randomizations: usize,
        seed: u64,
        with_quantiles: bool,
    ) -> Self {
        let mut rng = SplitMix64::new(seed);
        let mut points = Vec::with_capacity(randomizations * n * max_dim);
        for _ in 0..randomizations {
            let set = match sequence {
                PointSet::Halton => scrambled_halton(n, max_dim, &mut rng),
                PointSet::Sobol => scrambled_sobol(n, max_dim, &mut rng, true),
            };
            points.extend(set.into_iter().map(|v| (v as f32).min(BELOW_ONE)));
        }
        let mut raw = Self {
            n,
            max_dim,
            randomizations,
            points,
            quantiles: None,
        };
        if with_quantiles {
            raw.quantiles = Some(raw.compute_quantiles());
        }
        raw
    }

    /// Φ⁻¹ of every point, R × n × max_dim.
    pub fn compute_quantiles(&self) -> Vec<f32> {
        self.points
            .iter()
            .map(|&u| quantile_of(u as f64) as f32)
            .collect()
    }
}

/// Φ⁻¹(u) with u clamped away from 0 and 1 so the quantile is finite.
pub(crate) fn quantile_of(u: f64) -> f64 {
    norm_ppf(u.clamp(QUANTILE_CLAMP, 1.0 - QUANTILE_CLAMP))
}

/// The CPU path's copy of the constants in f64, laid out per randomisation and coordinate
/// (the point axis contiguous and padded to a multiple of [`BLOCK`]) so the kernels load whole
/// blocks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostConstants {
    /// Number of points n.
    pub n: usize,
    /// n rounded up to a multiple of [`BLOCK`].
    pub n_pad: usize,
    /// Number of coordinates.
    pub max_dim: usize,
    /// Number of randomisations R.
    pub randomizations: usize,
    /// The points, R × max_dim × n_pad; padding holds 0.5.
    u: Vec<f64>,
    /// Their quantiles, same layout; padding holds 0.
    z: Option<Vec<f64>>,
}

impl HostConstants {
    /// Builds the host copy from the f32 constants (exactly the values in the tensors).
    pub fn from_raw(raw: &RawConstants, with_quantiles: bool) -> Self {
        let (n, m, rr) = (raw.n, raw.max_dim, raw.randomizations);
        let n_pad = n.div_ceil(BLOCK) * BLOCK;
        let transpose = |src: &[f32], fill: f64| {
            let mut dst = vec![fill; rr * m * n_pad];
            for r in 0..rr {
                for j in 0..m {
                    let row = &mut dst[(r * m + j) * n_pad..][..n];
                    for (i, v) in row.iter_mut().enumerate() {
                        *v = src[(r * n + i) * m + j] as f64;
                    }
                }
            }
            dst
        };
        let u = transpose(&raw.points, 0.5);
        let z = with_quantiles.then(|| match &raw.quantiles {
            Some(q) => transpose(q, 0.0),
            None => transpose(&raw.compute_quantiles(), 0.0),
        });
        Self {
            n,
            n_pad,
            max_dim: m,
            randomizations: rr,
            u,
            z,
        }
    }

    /// Coordinate `j` of randomisation `r` for all points (length `n_pad`).
    #[inline]
    pub fn u(&self, r: usize, j: usize) -> &[f64] {
        &self.u[(r * self.max_dim + j) * self.n_pad..][..self.n_pad]
    }

    /// Quantiles of coordinate `j` of randomisation `r` (length `n_pad`); `None` when the
    /// module was built for the Genz method.
    #[inline]
    pub fn z(&self, r: usize, j: usize) -> Option<&[f64]> {
        self.z
            .as_ref()
            .map(|z| &z[(r * self.max_dim + j) * self.n_pad..][..self.n_pad])
    }
}
