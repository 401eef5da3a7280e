//! What watches a training session without changing it: the step profiler, the resource
//! monitor (continuing a resumed run's trace), the CPU and wall clocks, and the bottleneck
//! verdict they give at the end.

use std::time::{Duration, Instant};

use super::job::{TrainError, TrainJob};
use super::progress::Reporter;
use crate::observe::profiler::{self, SortBy, StepProfiler};
use crate::observe::resources::{self, Monitor};
use crate::observe::schedule::Schedule;
use crate::observe::verdict::{self, Verdict};
use crate::records::{EpochRecord, RunDir};

/// A session's instruments.
pub(crate) struct Instruments {
    /// When the session started opening (the outcome's wall time).
    started: Instant,
    /// When training could start (the verdict's CPU utilisation is over this span).
    wall_start: Instant,
    cpu_start: f64,
    monitor: Option<Monitor>,
    /// The resource trace of the run's earlier processes (a resumed run continues it).
    earlier_trace: Option<resources::Trace>,
    profiler: Option<StepProfiler>,
    /// The first epoch this process ran (its verdict covers only its own epochs).
    first_epoch: usize,
}

impl Instruments {
    /// Start the instruments of `job`'s session, which began at `started` and resumes after
    /// `first_epoch` epochs.
    pub(crate) fn start(job: &TrainJob<'_>, started: Instant, first_epoch: usize) -> Self {
        let p = &job.config.config.profile;
        let profiler = p.enabled.then(|| {
            let dir = if p.out_dir.is_absolute() {
                p.out_dir.clone()
            } else {
                job.run.path.join(&p.out_dir)
            };
            StepProfiler::new(
                Schedule {
                    wait: p.wait,
                    warmup: p.warmup,
                    active: p.active,
                    repeat: p.repeat,
                },
                profiler::Options {
                    record_shapes: p.record_shapes,
                    profile_memory: p.profile_memory,
                    with_stack: p.with_stack,
                },
                dir,
                "train_step",
            )
        });
        Self {
            started,
            monitor: Some(Monitor::start(Duration::from_millis(500))),
            earlier_trace: job
                .resume
                .then(|| resources::read_trace(&job.run.path))
                .flatten(),
            cpu_start: resources::cpu_seconds().unwrap_or(0.0),
            wall_start: Instant::now(),
            profiler,
            first_epoch,
        }
    }

    /// Wall time since the session started opening.
    pub(crate) fn wall(&self) -> Duration {
        self.started.elapsed()
    }

    /// The epochs of `history` this process ran.
    pub(crate) fn epochs_here<'h>(&self, history: &'h [EpochRecord]) -> &'h [EpochRecord] {
        &history[self.first_epoch.min(history.len())..]
    }

    /// Mark the start of a stage in the resource trace.
    pub(crate) fn mark_stage(&self, name: &str) {
        if let Some(m) = &self.monitor {
            m.mark(name);
        }
    }

    /// Before the step `global_step`: let the profiler open or close a recording.
    pub(crate) fn before_step(
        &mut self,
        global_step: u64,
        reporter: &Reporter,
    ) -> Result<(), TrainError> {
        if let Some(p) = self.profiler.as_mut()
            && let Some(out) = p.on_step(global_step)?
        {
            reporter.line(&format!(
                "profiler: {} steps recorded → {} (open in Perfetto) and {}\n{}",
                out.averages.steps,
                out.trace.display(),
                out.table_txt.display(),
                out.averages.table(SortBy::Total, 25)
            ));
        }
        Ok(())
    }

    /// Keep `resources.csv` current, so that a run killed from here on leaves its trace for
    /// `--resume` to continue (not a trace of the resumed process alone).
    pub(crate) fn save_trace(&self, run: &RunDir) {
        if let Some(m) = &self.monitor {
            let trace = self.full_trace(m.current());
            if let Err(e) = resources::write_trace_csv(&trace, &run.path) {
                tracing::warn!(
                    "{}: cannot write the resource trace: {e}",
                    run.path.display()
                );
            }
        }
    }

    /// The run's whole resource trace: its earlier processes' (when resumed), then this one's.
    fn full_trace(&self, here: resources::Trace) -> resources::Trace {
        match &self.earlier_trace {
            Some(e) => e.followed_by(&here),
            None => here,
        }
    }

    /// Write the profiler's last recording (if one is open) and the resource trace, and judge
    /// the bottleneck from this process's epochs of `history` (`workers` loader threads).
    pub(crate) fn close(
        &mut self,
        job: &TrainJob<'_>,
        history: &[EpochRecord],
        workers: usize,
        reporter: &Reporter,
    ) -> Result<Verdict, TrainError> {
        if let Some(p) = self.profiler.as_mut()
            && let Some(out) = p.finish()?
        {
            reporter.line(&format!(
                "profiler: {} steps recorded → {} and {}",
                out.averages.steps,
                out.trace.display(),
                out.table_txt.display()
            ));
        }
        let here = self
            .monitor
            .take()
            .expect("the resource monitor runs until the session closes")
            .stop();
        let trace = self.full_trace(here);
        let cpu_util = (resources::cpu_seconds().unwrap_or(self.cpu_start) - self.cpu_start)
            / (self.wall_start.elapsed().as_secs_f64() * resources::cores() as f64).max(1e-9);
        resources::write_trace(&trace, &job.run.path)?;
        let here = self.epochs_here(history);
        let verdict = verdict::verdict(&verdict::Timings {
            data_wait_s: here.iter().map(|r| r.data_wait_s).sum(),
            compute_s: here.iter().map(|r| r.compute_s).sum(),
            cpu_util,
            workers,
            cores: resources::cores(),
            batch_size: job.config.config.loader.batch_size,
        });
        reporter.line(&format!(
            "bottleneck: {} (data wait {:.0}% of step time, compute {:.0}%, CPU {:.0}% of {} cores, peak RSS {:.0} MiB) — {}",
            verdict.bound.label(),
            verdict.data_wait_frac * 100.0,
            verdict.compute_frac * 100.0,
            verdict.cpu_util * 100.0,
            resources::cores(),
            trace.peak_rss_mb(),
            verdict.advice
        ));
        Ok(verdict)
    }
}
