//! Training: the stage loop, the learning-rate schedule, global-norm clipping, freezing,
//! evaluation, resumable state and progress display.

pub mod clip;
pub mod evaluate;
pub mod progress;
pub mod schedule;
pub mod state;
pub mod trainer;

pub use progress::ProgressMode;
pub use trainer::{TrainError, TrainJob, TrainOutcome, Trained, train, train_cpu};
