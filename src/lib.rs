//! kiln — a training-and-serving framework for compact regression networks, built on Burn.
//!
//! Modules are layered; a module imports only modules at or below its own level, and
//! `tests/architecture.rs` checks it (no import cycles, no upward imports):
//!
//! | level | modules |
//! |---|---|
//! | 0 leaves | [`util`], [`rng`], [`records`], [`simd`] |
//! | 1 | [`config`], [`backend`] |
//! | 2 | [`data`], [`model`], [`doctor`] |
//! | 3 | [`train`], [`artifact`] |
//! | 4 | [`infer`], [`predict`], [`bench`], [`pick`], [`export`] |
//! | 5 | [`run`], [`sweep`], `serve` |
//! | beside | [`observe`]: imports only leaves and `config`; everyone may call it |
//!
//! Cargo features: the default build is the full CLI. `default-features = false` gives the
//! library core — config, data, model, train, artifact, infer, predict, bench, pick, run —
//! without the HTTP server, the SQLite registry, the plotter, the MLflow client or the ONNX
//! exporter; `serve`, `registry`, `plots`, `mlflow` and `onnx` add them back one by one.

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
#[cfg(feature = "registry")]
pub mod promote;
pub mod records;
pub mod rng;
pub mod run;
#[cfg(feature = "serve")]
pub mod serve;
pub mod simd;
#[cfg(feature = "registry")]
pub mod sweep;
pub mod train;
pub mod util;

/// `tracing`, re-exported for [`prof_span!`] so that crates using the macro need no
/// dependency of their own.
#[doc(hidden)]
pub use tracing as __tracing;

/// The Burn version kiln was built against (Cargo.lock's when kiln is the root package,
/// else the version kiln's manifest pins).
pub const BURN_VERSION: &str = env!("KILN_BURN_VERSION");
/// The rustc that compiled kiln.
pub const RUSTC_VERSION: &str = env!("KILN_RUSTC_VERSION");
