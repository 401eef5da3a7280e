//! Training: the stage loop, the learning-rate schedule, global-norm clipping, freezing,
//! evaluation, resumable state and progress display.
//!
//! * [`trainer`]: the entry points ([`train`], [`train_cpu`]); [`job`]: their types;
//! * `session`: the loop's parts — open (data, model, resume), stage, epoch, snapshot — over
//!   [`step::step`] (one optimizer step, its phases timed), [`epoch::EpochStats`] and
//!   [`epoch::Validation`]; `logs` (steps.csv, epochs.jsonl) and `instruments` (profiler,
//!   resource trace, bottleneck verdict) beside it;
//! * `finish`: `evaluate` (every number the manifest records, measured in memory, including
//!   the run layer's [`measure::Measure`]) and `seal` (the manifest and the one export);
//! * [`stage`]: freezing, the stage's fresh AdamW, its loss; [`prepare`]: data and
//!   normalisation fit on the training split; [`distill`]: the teacher and the distillation
//!   losses.

pub mod adamw;
pub mod clip;
pub mod distill;
pub mod epoch;
pub mod evaluate;
mod finish;
mod instruments;
pub mod job;
mod logs;
pub mod measure;
pub mod prepare;
pub mod progress;
pub mod schedule;
mod session;
pub mod stage;
pub mod state;
pub mod step;
pub mod trainer;
pub mod uncertainty;

pub use distill::Teacher;
pub use epoch::{EpochStats, Validation};
pub use job::{StageSummary, TrainError, TrainJob, TrainOutcome, Trained, summarise};
pub use measure::{Candidate, Measure, MeasureError, Measurements};
pub use prepare::Prepared;
pub use progress::ProgressMode;
pub use stage::{StepOutput, adamw, part_param_ids, set_trainable, stage_loss};
pub use step::{StepContext, StepStats, step};
pub use trainer::{train, train_cpu, train_job_cpu};
