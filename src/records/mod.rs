//! Records shared by several levels of the crate (a leaf: imports only other leaves —
//! `util`, `rng`): the epoch record, the run directory's layout and status, what a run tells
//! its observers when it starts and ends, and the names of the inference engines.

mod epoch;
mod run_dir;
mod run_rows;

pub use epoch::EpochRecord;
pub use run_dir::{RunDir, RunStatus};
pub use run_rows::{NewRun, RunEnd};

/// The CPU inference engines (the default set of `kiln bench infer`).
pub const CPU_ENGINES: [&str; 4] = ["burn", "burn-ndarray", "fused", "int8"];

/// The CUDA inference engines (built with the `cuda` feature).
pub const CUDA_ENGINES: [&str; 2] = ["cuda-bf16", "cuda-f32"];

/// The engine that picks the fastest CPU engine per batch size at load (`kiln::infer::auto`):
/// the default of `kiln serve`, `kiln predict` and `export.engine: null`.
pub const AUTO_ENGINE: &str = "auto";

/// Engine names this build knows: the CPU engines, `auto`, then (with the `cuda` feature) the
/// CUDA ones. A name listed here may still be unavailable on this machine (no GPU).
pub fn engine_names() -> Vec<&'static str> {
    let mut v = CPU_ENGINES.to_vec();
    v.push(AUTO_ENGINE);
    if cfg!(feature = "cuda") {
        v.extend(CUDA_ENGINES);
    }
    v
}
