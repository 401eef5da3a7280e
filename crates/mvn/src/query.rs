//! Host-side queries (what the CPU path takes) and their validation.
//!
//! A query asks for P(lower ≤ X ≤ upper) with X ~ N(mean, cov). Upper limits may be +∞, lower
//! limits −∞ (the default when `lower` is absent), the mean defaults to 0. Validation turns a
//! query into centred limits (limit − mean) and a symmetric covariance, or into an
//! [`MvnError`] that names the query, the argument and the coordinate.

use serde::{Deserialize, Serialize};

use super::error::MvnError;

/// Relative tolerance for `cov[i][j] == cov[j][i]`, scaled by √(cov[i][i]·cov[j][j]).
pub const SYMMETRY_TOLERANCE: f64 = 1e-6;

/// One query of any dimension d, with owned vectors (the unit of a mixed-dimension batch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MvnQuery {
    /// Upper limits, length d; `f64::INFINITY` for unbounded.
    pub upper: Vec<f64>,
    /// Lower limits, length d; `None` means −∞ everywhere.
    pub lower: Option<Vec<f64>>,
    /// Mean, length d; `None` means 0.
    pub mean: Option<Vec<f64>>,
    /// Covariance, d × d row-major.
    pub cov: Vec<f64>,
}

impl MvnQuery {
    /// P(X ≤ upper) for X ~ N(0, cov), `cov` row-major d × d.
    pub fn new(upper: Vec<f64>, cov: Vec<f64>) -> Self {
        Self {
            upper,
            lower: None,
            mean: None,
            cov,
        }
    }

    /// Sets the lower limits.
    pub fn with_lower(mut self, lower: Vec<f64>) -> Self {
        self.lower = Some(lower);
        self
    }

    /// Sets the mean.
    pub fn with_mean(mut self, mean: Vec<f64>) -> Self {
        self.mean = Some(mean);
        self
    }

    /// The dimension d (the number of upper limits).
    pub fn dim(&self) -> usize {
        self.upper.len()
    }
}

/// A batch of queries that may have different dimensions (2-leg, 3-leg, 5-leg picks in one
/// call). The CPU path groups them by dimension and answers in input order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MvnQueryBatch {
    /// The queries, in the order the answers come back.
    pub queries: Vec<MvnQuery>,
}

impl MvnQueryBatch {
    /// A batch from its queries.
    pub fn new(queries: Vec<MvnQuery>) -> Self {
        Self { queries }
    }
}

/// A batch of B queries of one dimension d in flat host slices (f32 or f64):
///
/// * `upper`: B × d (row-major); +∞ allowed.
/// * `lower`: B × d, or `None` for −∞.
/// * `mean`: B × d, or d (shared by every query), or `None` for 0.
/// * `cov`: d × d (shared) or B × d × d (one per query).
///
/// B is `upper.len() / dim`.
#[derive(Debug, Clone, Copy)]
pub struct MvnSlices<'a, T> {
    /// The dimension d.
    pub dim: usize,
    /// Upper limits, B × d.
    pub upper: &'a [T],
    /// Lower limits, B × d.
    pub lower: Option<&'a [T]>,
    /// Means, B × d or d.
    pub mean: Option<&'a [T]>,
    /// Covariances, d × d or B × d × d.
    pub cov: &'a [T],
}

impl<'a, T> MvnSlices<'a, T> {
    /// Upper limits and a shared covariance; no lower limits, zero mean.
    pub fn new(dim: usize, upper: &'a [T], cov: &'a [T]) -> Self {
        Self {
            dim,
            upper,
            lower: None,
            mean: None,
            cov,
        }
    }

    /// Sets the lower limits (B × d).
    pub fn with_lower(mut self, lower: &'a [T]) -> Self {
        self.lower = Some(lower);
        self
    }

    /// Sets the means (B × d, or d shared).
    pub fn with_mean(mut self, mean: &'a [T]) -> Self {
        self.mean = Some(mean);
        self
    }
}

/// A host float type the CPU path accepts (`f32` or `f64`); values are widened to f64.
pub trait HostFloat: Copy + Send + Sync {
    /// The value as f64.
    fn to_f64(self) -> f64;
}

impl HostFloat for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl HostFloat for f64 {
    fn to_f64(self) -> f64 {
        self
    }
}

/// One answer: the probability and its standard error (from the spread of the independent
/// randomisations; 0 when the answer is exact, e.g. d = 1 with the Genz method).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MvnEstimate {
    /// The estimated probability, in [0, 1].
    pub p: f64,
    /// Its standard error.
    pub se: f64,
}

/// A validated query: centred limits and a symmetric covariance, all f64.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Prepared {
    /// The dimension.
    pub d: usize,
    /// lower − mean (may be −∞).
    pub a: Vec<f64>,
    /// upper − mean (may be +∞).
    pub b: Vec<f64>,
    /// The covariance, symmetrised, d × d row-major.
    pub cov: Vec<f64>,
}

/// Validates one query given as accessors, so that slices and owned vectors share the code.
///
/// `upper`, `lower`, `mean` have length d when present; `cov` has length d².
pub(crate) fn prepare<T: HostFloat>(
    query: usize,
    max_dim: usize,
    upper: &[T],
    lower: Option<&[T]>,
    mean: Option<&[T]>,
    cov: &[T],
) -> Result<Prepared, MvnError> {
    let d = upper.len();
    if d == 0 {
        return Err(MvnError::EmptyQuery { query });
    }
    if d > max_dim {
        return Err(MvnError::DimensionTooLarge {
            query,
            dim: d,
            max_dim,
        });
    }
    if let Some(lower) = lower
        && lower.len() != d
    {
        return Err(MvnError::shape(
            query,
            "lower",
            format!("length {}", lower.len()),
            format!("length {d} (the length of `upper`)"),
        ));
    }
    if let Some(mean) = mean
        && mean.len() != d
    {
        return Err(MvnError::shape(
            query,
            "mean",
            format!("length {}", mean.len()),
            format!("length {d} (the length of `upper`)"),
        ));
    }
    if cov.len() != d * d {
        return Err(MvnError::shape(
            query,
            "cov",
            format!("{} entries", cov.len()),
            format!(
                "{} entries ({d} × {d}, the length of `upper` squared)",
                d * d
            ),
        ));
    }

    let mut a = vec![f64::NEG_INFINITY; d];
    let mut b = vec![0.0; d];
    for i in 0..d {
        let hi = upper[i].to_f64();
        if hi.is_nan() {
            return Err(not_finite(
                query,
                "upper",
                format!("[{i}]"),
                hi,
                LIMIT_EXPECTED,
            ));
        }
        b[i] = hi;
        if let Some(lower) = lower {
            let lo = lower[i].to_f64();
            if lo.is_nan() {
                return Err(not_finite(
                    query,
                    "lower",
                    format!("[{i}]"),
                    lo,
                    LIMIT_EXPECTED,
                ));
            }
            if lo > hi {
                return Err(MvnError::LowerAboveUpper {
                    query,
                    index: i,
                    lower: lo,
                    upper: hi,
                });
            }
            a[i] = lo;
        }
    }
    if let Some(mean) = mean {
        for i in 0..d {
            let m = mean[i].to_f64();
            if !m.is_finite() {
                return Err(not_finite(
                    query,
                    "mean",
                    format!("[{i}]"),
                    m,
                    "a finite number",
                ));
            }
            a[i] -= m;
            b[i] -= m;
        }
    }

    let mut c = vec![0.0; d * d];
    for i in 0..d {
        for j in 0..d {
            let v = cov[i * d + j].to_f64();
            if !v.is_finite() {
                return Err(not_finite(
                    query,
                    "cov",
                    format!("[{i}][{j}]"),
                    v,
                    "a finite number",
                ));
            }
            c[i * d + j] = v;
        }
    }
    for i in 0..d {
        let v = c[i * d + i];
        if v < 0.0 {
            return Err(MvnError::NegativeVariance {
                query,
                index: i,
                value: v,
            });
        }
    }
    for i in 0..d {
        for j in (i + 1)..d {
            let x = c[i * d + j];
            let y = c[j * d + i];
            let scale = (c[i * d + i] * c[j * d + j]).sqrt();
            if (x - y).abs() > SYMMETRY_TOLERANCE * scale {
                return Err(MvnError::NotSymmetric {
                    query,
                    row: i,
                    col: j,
                    a: x,
                    b: y,
                    tolerance: SYMMETRY_TOLERANCE,
                });
            }
            let avg = 0.5 * (x + y);
            c[i * d + j] = avg;
            c[j * d + i] = avg;
        }
    }
    Ok(Prepared { d, a, b, cov: c })
}

const LIMIT_EXPECTED: &str = "a number (±infinity allowed for unbounded)";

fn not_finite(
    query: usize,
    argument: &'static str,
    position: String,
    value: f64,
    expected: &'static str,
) -> MvnError {
    MvnError::NotFinite {
        query,
        argument,
        position,
        value,
        expected,
    }
}

/// Validates every query of a [`MvnSlices`] batch.
pub(crate) fn prepare_slices<T: HostFloat>(
    s: &MvnSlices<'_, T>,
    max_dim: usize,
) -> Result<Vec<Prepared>, MvnError> {
    let d = s.dim;
    if d == 0 {
        return Err(MvnError::batch_shape(
            "dim",
            "0",
            "a dimension of at least 1",
        ));
    }
    if d > max_dim {
        return Err(MvnError::DimensionTooLarge {
            query: 0,
            dim: d,
            max_dim,
        });
    }
    if !s.upper.len().is_multiple_of(d) {
        return Err(MvnError::batch_shape(
            "upper",
            format!("{} values", s.upper.len()),
            format!("a multiple of dim = {d} (B × d)"),
        ));
    }
    let batch = s.upper.len() / d;
    if let Some(lower) = s.lower
        && lower.len() != s.upper.len()
    {
        return Err(MvnError::batch_shape(
            "lower",
            format!("{} values", lower.len()),
            format!("{} values (B × d = {batch} × {d}, like `upper`)", batch * d),
        ));
    }
    let mean_shared = match s.mean {
        None => false,
        Some(m) if m.len() == batch * d => false,
        Some(m) if m.len() == d => true,
        Some(m) => {
            return Err(MvnError::batch_shape(
                "mean",
                format!("{} values", m.len()),
                format!(
                    "{d} (shared) or {} (B × d = {batch} × {d}) values",
                    batch * d
                ),
            ));
        }
    };
    let cov_shared = if s.cov.len() == batch * d * d {
        false
    } else if s.cov.len() == d * d {
        true
    } else {
        return Err(MvnError::batch_shape(
            "cov",
            format!("{} values", s.cov.len()),
            format!(
                "{} (one shared {d} × {d} matrix) or {} (B × d × d = {batch} × {d} × {d}) values",
                d * d,
                batch * d * d
            ),
        ));
    };
    (0..batch)
        .map(|q| {
            let row = q * d..(q + 1) * d;
            let mean = s
                .mean
                .map(|m| if mean_shared { m } else { &m[row.clone()] });
            let cov = if cov_shared {
                s.cov
            } else {
                &s.cov[q * d * d..(q + 1) * d * d]
            };
            prepare(
                q,
                max_dim,
                &s.upper[row.clone()],
                s.lower.map(|l| &l[row.clone()]),
                mean,
                cov,
            )
        })
        .collect()
}

/// Validates every query of a mixed-dimension batch.
pub(crate) fn prepare_queries(
    queries: &[MvnQuery],
    max_dim: usize,
) -> Result<Vec<Prepared>, MvnError> {
    queries
        .iter()
        .enumerate()
        .map(|(q, query)| {
            prepare(
                q,
                max_dim,
                &query.upper,
                query.lower.as_deref(),
                query.mean.as_deref(),
                &query.cov,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn centres_limits_and_symmetrises() {
        let p = prepare(
            0,
            4,
            &[1.0f64, f64::INFINITY],
            Some(&[-1.0, 0.0]),
            Some(&[0.5, 1.0]),
            &[1.0, 0.3, 0.3000001, 2.0],
        )
        .unwrap();
        assert_eq!(p.a, vec![-1.5, -1.0]);
        assert_eq!(p.b, vec![0.5, f64::INFINITY]);
        assert_eq!(p.cov[1], p.cov[2]);
    }

    #[test]
    fn errors_name_query_argument_and_position() {
        let e = prepare(3, 4, &[1.0f64, f64::NAN], None, None, &[1.0, 0.0, 0.0, 1.0]).unwrap_err();
        assert!(
            e.to_string().contains("query 3") && e.to_string().contains("upper[1]"),
            "{e}"
        );
        let e = prepare(
            0,
            4,
            &[1.0f64, 1.0],
            None,
            Some(&[0.0, f64::NAN]),
            &[1.0, 0.0, 0.0, 1.0],
        )
        .unwrap_err();
        assert!(e.to_string().contains("mean[1]"), "{e}");
        let e = prepare(0, 4, &[1.0f64, 1.0], None, None, &[1.0, 0.5, 0.4, 1.0]).unwrap_err();
        assert!(e.to_string().contains("not symmetric"), "{e}");
        let e = prepare(0, 4, &[1.0f64, 1.0], None, None, &[1.0, 0.0, 1.0]).unwrap_err();
        assert!(e.to_string().contains("`cov`"), "{e}");
        let e = prepare(0, 1, &[1.0f64, 1.0], None, None, &[1.0, 0.0, 0.0, 1.0]).unwrap_err();
        assert!(matches!(
            e,
            MvnError::DimensionTooLarge {
                dim: 2,
                max_dim: 1,
                ..
            }
        ));
        let e = prepare(0, 4, &[0.0f64], Some(&[1.0]), None, &[1.0]).unwrap_err();
        assert!(matches!(e, MvnError::LowerAboveUpper { .. }));
        let e = prepare(0, 4, &[0.0f64], None, None, &[-1.0]).unwrap_err();
        assert!(matches!(e, MvnError::NegativeVariance { .. }));
    }

    #[test]
    fn slices_accept_shared_and_per_query_shapes() {
        let upper = [0.0f32, 0.0, 1.0, 1.0];
        let cov = [1.0f32, 0.5, 0.5, 1.0];
        let s = MvnSlices::new(2, &upper, &cov).with_mean(&[0.0, 1.0]);
        let p = prepare_slices(&s, 8).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].b, vec![1.0, 0.0]);
        let bad = MvnSlices::new(2, &upper, &cov[..3]);
        let e = prepare_slices(&bad, 8).unwrap_err();
        assert!(e.to_string().contains("`cov`"), "{e}");
    }
}
