//! Training: the stage loop, the learning-rate schedule, global-norm clipping, freezing,
//! evaluation, resumable state and progress display.
//!
//! * [`trainer`]: the entry points ([`train`], [`train_cpu`]); [`job`]: their types;
//! * `session`: the loop's parts — open (data, model, resume), stage, epoch, snapshot;
//! * `finish`: the verdict, final evaluation and export;
//! * [`stage`]: freezing, the stage's fresh AdamW, its loss; [`prepare`]: data and
//!   normalisation fit on the training split; [`distill`]: the teacher and the distillation
//!   losses.

pub mod adamw;
pub mod clip;
pub mod distill;
pub mod evaluate;
mod finish;
pub mod job;
pub mod prepare;
pub mod progress;
pub mod schedule;
mod session;
pub mod stage;
pub mod state;
pub mod trainer;
pub mod uncertainty;

pub use distill::Teacher;
pub use job::{StageSummary, TrainError, TrainJob, TrainOutcome, Trained, summarise};
pub use prepare::Prepared;
pub use progress::ProgressMode;
pub use stage::{StepOutput, adamw, part_param_ids, set_trainable, stage_loss};
pub use trainer::{train, train_cpu};
