//! kiln's library core: everything between a YAML experiment and an exported, benchmarked
//! checkpoint, with no server, database, plotter or MLflow client in its dependency graph.
//!
//! Modules are layered; a module imports only modules at or below its own level (Cargo
//! enforces the layers between crates; the integration tests' architecture check enforces
//! these, inside this one):
//!
//! | level | modules |
//! |---|---|
//! | 0 leaves | [`util`], [`rng`], [`simd`] (from `kiln-base`), [`records`] |
//! | 1 | [`config`], [`backend`] |
//! | 2 | [`data`], [`model`] (its estimator from `kiln-mvn`), [`doctor`] |
//! | 3 | [`train`], [`artifact`] |
//! | 4 | [`infer`], [`predict`], [`bench`], [`pick`], [`export`], [`import`] |
//! | 5 | [`run`] |
//! | beside | [`observe`] (profiler, resource trace, verdict, plots): imports only leaves and `config`; everyone may call it |
//!
//! Cargo features: none by default. `plots` adds the PNG/SVG figures, `onnx` the ONNX
//! writer, `cuda` the CUDA backend, `no-spans` compiles the profiler's spans out.

#![warn(missing_docs)]

pub mod artifact;
pub mod backend;
pub mod bench;
pub mod config;
pub mod data;
pub mod doctor;
pub mod export;
pub mod import;
pub mod infer;
pub mod model;
pub mod observe;
pub mod pick;
pub mod predict;
pub mod records;
pub mod run;
pub mod train;

/// The leaves every layer uses (`kiln-base`), re-exported so that the crates above name one
/// dependency for them.
pub use kiln_base::{rng, simd, util};

/// `tracing`, re-exported for [`prof_span!`] so that crates using the macro need no
/// dependency of their own.
#[doc(hidden)]
pub use tracing as __tracing;

/// The Burn version kiln was built against (the workspace manifest's exact pin).
pub const BURN_VERSION: &str = env!("KILN_BURN_VERSION");
/// The rustc that compiled kiln.
pub const RUSTC_VERSION: &str = env!("KILN_RUSTC_VERSION");
