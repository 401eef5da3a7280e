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

/// Engine names this build knows: the CPU engines, then (with the `cuda` feature) the CUDA
/// ones. A name listed here may still be unavailable on this machine (no GPU).
pub fn engine_names() -> Vec<&'static str> {
    let mut v = CPU_ENGINES.to_vec();
    if cfg!(feature = "cuda") {
        v.extend(CUDA_ENGINES);
    }
    v
}
