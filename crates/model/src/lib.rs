//! kiln's model side: everything between a trained network and an answer, without the trainer.
//! `kiln-serve` depends on this crate and not on `kiln-core`, so a training edit does not
//! rebuild the server.
//!
//! | module | holds |
//! |---|---|
//! | [`model`] | `RegressionNet` (backbone, mean head, log-variance head) and its fused training op; the MVN estimator (`kiln-mvn`) |
//! | [`stats`], [`preprocess`], [`drift`] | normalisation, raw columns → network inputs, the training inputs' drift sketches |
//! | [`artifact`] | checkpoint export and load (the one place that knows the layout), the manifest and its seal |
//! | [`infer`], [`predict`] | the inference engines behind one trait; the manifest's normalisation around one |
//! | [`latency`] | the serving-engine latency a run stores in its manifest |
//! | [`records`] | the inference engines as one enum; the model repository's layout |
//! | [`backend`] | Burn backend aliases (Flex by default, NdArray, CUDA behind `cuda`) |
//!
//! Cargo features: `cuda` adds the CUDA engines.

#![warn(missing_docs)]

pub mod artifact;
pub mod backend;
pub mod dates;
pub mod drift;
pub mod infer;
pub mod latency;
pub mod model;
pub mod predict;
pub mod preprocess;
pub mod records;
pub mod stats;

/// The leaves every layer uses (`kiln-base`), re-exported so that the crates above name one
/// dependency for them.
pub use kiln_base::{rng, simd, util};
/// Instrumentation (`kiln-observe`), re-exported for the same reason.
pub use kiln_observe as observe;
pub use kiln_observe::prof_span;

/// The Burn version kiln was built against (the workspace manifest's exact pin).
pub const BURN_VERSION: &str = env!("KILN_BURN_VERSION");
/// The rustc that compiled kiln.
pub const RUSTC_VERSION: &str = env!("KILN_RUSTC_VERSION");
/// The target triple kiln was built for.
pub const TARGET: &str = env!("KILN_TARGET");
/// The Cargo profile kiln was built with.
pub const BUILD_PROFILE: &str = env!("KILN_PROFILE");
