//! Halton multivariate-normal CDF estimator (issue 3), as a parameter-free Burn module.
//!
//! [`HaltonMvnCdf`] estimates P(lower ≤ X ≤ upper) for X ~ N(mean, cov), for a batch of
//! queries at once, with a standard error per query. It is a Burn [`Module`](burn::module::Module)
//! without trainable parameters: its state is the precomputed constants (R independently
//! scrambled Halton or Sobol' point sets, and for the naive method the normal quantiles of the
//! points),
//! which move with the module between devices and are saved and loaded with its record.
//!
//! ```no_run
//! use burn::backend::Flex;
//! use kiln_mvn::{HaltonMvnCdfConfig, MvnMethod, MvnSlices};
//!
//! let model = HaltonMvnCdfConfig::new()
//!     .with_points(4096)
//!     .with_method(MvnMethod::Genz)
//!     .init::<Flex>(&Default::default())
//!     .unwrap();
//! // Bivariate orthant with correlation 0.5: exact value 1/4 + asin(0.5)/(2π) = 1/3.
//! let est = model
//!     .forward(MvnSlices::new(2, &[0.0f64, 0.0], &[1.0, 0.5, 0.5, 1.0]))
//!     .unwrap();
//! assert!((est[0].p - 1.0 / 3.0).abs() < 1e-6);
//! ```
//!
//! # One `forward`, two paths
//! [`HaltonMvnCdf::forward`] dispatches on its input type ([`MvnInput`]):
//! * host arrays — [`MvnSlices`] (f32 or f64 slices of one dimension), [`MvnQueryBatch`] or
//!   `&[MvnQuery]` (mixed dimensions) — run on the **CPU path**: plain Rust in f64, rayon over
//!   queries (or over randomisations and point ranges when there are few queries), SIMD
//!   kernels chosen at run time, no Burn tensors. Returns `Vec<MvnEstimate>`.
//! * Burn tensors — [`MvnTensorBatch`] — run on the **tensor path**: Burn operations only, on
//!   whatever backend the module lives on. Returns [`MvnTensorEstimates`]. [`OnDevice`] sends a
//!   mixed-dimension host batch through the tensor path, grouped by dimension.
//!
//! Both paths integrate over the same points and agree within 1e-6 on the same f32 inputs.
//!
//! # Methods: when to use which
//! * [`MvnMethod::Genz`] (default): Genz's separation of variables with Genz–Bretz variable
//!   reordering. The integrand is smooth, so the quasi-Monte Carlo error falls almost like 1/n;
//!   it reaches 1e-5 … 1e-7 with a few thousand points for d ≤ 10, keeps relative accuracy
//!   for small probabilities, and is exact for d = 1 and independent coordinates. Use it
//!   whenever accuracy matters, and for everything on the CPU.
//! * [`MvnMethod::Naive`]: the fraction of points x = μ + L z (z = √2·erfinv(2u − 1), fixed
//!   quantiles) that land in the box. The integrand is an indicator, so the error falls only
//!   like n^(−1/2 … −3/4) and probabilities below about 1/(R·n) come out as 0; but each point
//!   costs only a matrix–vector product and two comparisons, with no Φ or Φ⁻¹ per query.
//!   Preferable for rough answers (errors around 1e-3) on large batches on a GPU, or as an
//!   independent check of the Genz answers.
//!
//! # Point sets
//! [`PointSet::Halton`] (the default; see [`halton`]) or [`PointSet::Sobol`] (Joe–Kuo
//! direction numbers; see [`sobol`]). Sobol' points are (t, m, s)-nets only at powers of two,
//! so the adaptive mode's stages double on them; measured on the realistic families they reach
//! the same errors from fewer points in the adaptive mode and at 1,024 fixed points, which is
//! why `kiln mvn` picks them when it is given a tolerance. The fixed mode keeps Halton by
//! default, so its answers stay those of earlier releases.
//!
//! # Exact answers
//! Besides d = 1, independent coordinates and degenerate boxes (always exact), the adaptive
//! mode answers bivariate queries with Genz's BVNU (to about 1e-15, `bvn`) and queries whose
//! correlation has one-factor structure (off-diagonal ρᵢⱼ = λᵢλⱼ to 1e-12, d ≥ 3) by a
//! one-dimensional adaptive Gauss–Kronrod quadrature over the factor to 1e-13 (`factor1`):
//! conditional on the factor the coordinates are independent. These answers report a standard
//! error of 0. The fixed mode integrates every query over its points, so a fixed-mode answer
//! never depends on which structure was detected.
//!
//! # Standard errors
//! The module holds R independent randomisations of the point set (random linear digit
//! scrambling with a digital shift). Each gives an unbiased estimate; the answer
//! is their mean and the standard error their standard deviation over √R. (One scrambled set
//! with R Cranley–Patterson shifts, the other classic choice, was measured 1.3–2× less accurate
//! at equal cost.) Exact answers (Genz with d = 1, independent
//! coordinates, degenerate boxes) report a standard error of 0.
//!
//! # Semi-definite covariances
//! Handled, not rejected: a variable whose residual variance vanishes (perfectly correlated
//! legs, a zero variance) becomes a deterministic function of the others, and its limits an
//! indicator; see [`cholesky`](self::cholesky) for the thresholds. A matrix that is not
//! positive semi-definite is an error naming the query and the pivot.
//!
//! # Errors
//! Every problem with the input is an [`MvnError`] that names the query, the argument and the
//! coordinate, never a panic: NaN limits, non-finite means or covariances, lower > upper,
//! asymmetric or indefinite covariances, shapes that disagree, d above the module's maximum.
//!
//! # Files
//! `halton` and `sobol` (point sets), `bvn` and `factor1` (exact bivariate and one-factor
//! answers), `normal` (Φ, Φ⁻¹, erfinv in f64, scalar and SIMD block forms), `tensor_normal` (the same on tensors), `query` (host inputs and validation), `cholesky`
//! (pivoted factorisation), `genz` and `naive` (CPU kernels), `cpu` (batching and rayon),
//! `tensor_path`, `constants` (point set as f32 arrays and the host copy), `module` (config,
//! module, `forward`), `pick` (pick probabilities), `bench` (closed-form cases and the
//! benchmark grid), `lines` (JSON-lines queries and answers, as `kiln mvn` reads and writes
//! them), `error`.

#![warn(missing_docs)]

// The seeded generator, under the name the estimator's files use.
use kiln_base::rng;

pub mod bench;
mod bvn;
pub mod cholesky;
mod constants;
mod cpu;
pub mod error;
mod factor1;
mod genz;
pub mod halton;
pub mod lines;
mod module;
mod naive;
pub mod normal;
pub mod pick;
mod query;
mod simd;
pub mod sobol;
mod tensor_normal;
mod tensor_path;

pub use error::MvnError;
pub use module::{
    HaltonMvnCdf, HaltonMvnCdfConfig, MAX_POINTS, MAX_RANDOMIZATIONS, MvnConstants,
    MvnConstantsRecord, MvnInput, MvnMethod, PointSet,
};
pub use pick::{
    Leg, PickCorrelation, PickResult, Side, leg_probability, pick_probabilities, pick_probability,
    pick_query,
};
pub use query::{HostFloat, MvnEstimate, MvnQuery, MvnQueryBatch, MvnSlices, SYMMETRY_TOLERANCE};
pub use tensor_path::{
    MvnTensorBatch, MvnTensorEstimates, NEG_PIVOT_REL_F32, OnDevice, ZERO_PIVOT_REL_F32,
};
