//! Measurement code behind `kiln bench infer` and `kiln bench train` (and the criterion
//! benches in `benches/`).
//!
//! * [`infer`]: per-call latency and throughput of inference engines, in-process, after
//!   warm-up, medians over many calls, several engines interleaved in one run.
//! * [`latency`]: the serving-engine latency every training run stores in its manifest.
//! * [`profile`]: inference under the scheduled profiler (`kiln profile infer`).
//! * [`train`]: stage-1 training throughput of the reference network through the real
//!   training loop on a synthetic table.

pub mod infer;
pub use kiln_model::latency;
pub mod profile;
pub mod train;

pub use infer::{
    InferBenchOptions, InferResult, bench_engine, format_table, peak_gflops, run_infer,
};
pub use train::{TrainBenchOptions, TrainResult, run_train};

/// Errors from a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An engine failed to build or run.
    #[error(transparent)]
    Infer(#[from] crate::infer::InferError),
    /// A checkpoint could not be loaded.
    #[error(transparent)]
    Artifact(#[from] crate::artifact::ArtifactError),
    /// A prediction failed.
    #[error(transparent)]
    Predict(#[from] crate::predict::PredictError),
    /// Training failed.
    #[error(transparent)]
    Train(#[from] crate::train::TrainError),
    /// The generated config was rejected.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A scratch file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An option is out of range.
    #[error("{0}")]
    Invalid(String),
}
