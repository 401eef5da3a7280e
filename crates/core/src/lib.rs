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

pub mod bench;
pub mod config;
pub mod data;
pub mod doctor;
pub mod export;
pub mod import;
pub mod pick;
pub mod predict;
pub mod records;
pub mod run;
pub mod train;

/// The leaves every layer uses (`kiln-base`), re-exported so that the crates above name one
/// dependency for them.
pub use kiln_base::{rng, simd, util};

/// The model side (`kiln-model`): network, checkpoints, engines, backends — re-exported under
/// the names the modules of this crate and the crates above use.
pub use kiln_model::{BURN_VERSION, RUSTC_VERSION, artifact, backend, infer, model};
/// Instrumentation (`kiln-observe`): profiler, resource trace, verdict, plots.
pub use kiln_observe::{self as observe, prof_span};
