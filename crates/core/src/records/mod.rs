//! Records shared by several levels of the crate (a leaf: imports only other leaves —
//! `util`, `rng`): the epoch record, the run directory's layout and status, and what a run
//! tells its observers when it starts and ends. The model side's records (the inference
//! engines, the model repository's layout) are `kiln-model`'s, re-exported here.

mod observer;
mod run_dir;
mod run_rows;

pub use observer::{ObserverError, RunObserver};
pub use run_dir::{RunDir, RunState, RunStatus};
pub use run_rows::{NewRun, RunEnd, RunEnvironment};

pub use kiln_model::records::{
    AUTO_ENGINE, AUTO_INT8_ENGINE, CPU_ENGINES, CUDA_ENGINES, EngineKind, EpochRecord, StepPhases,
    UnknownEngine, engine_names, metrics, repository,
};
