//! The bottleneck verdict: is the step waiting for data, busy computing, or paying fixed
//! per-step overhead? Pure logic over measured fractions, so it is tested on synthetic
//! timings.

use serde::{Deserialize, Serialize};

/// Measurements the verdict is drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Seconds the training loop waited for the next batch.
    pub data_wait_s: f64,
    /// Seconds of compute (copy, forward, backward, clipping, optimizer step).
    pub compute_s: f64,
    /// Process CPU use over the run, as a fraction of all cores (0–1).
    pub cpu_util: f64,
    /// Loader worker threads.
    pub workers: usize,
    /// Logical cores.
    pub cores: usize,
    /// Rows per batch.
    pub batch_size: usize,
}

/// The three outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bound {
    /// The step waits for data.
    InputBound,
    /// The arithmetic saturates the cores.
    ComputeBound,
    /// Neither: fixed per-step costs dominate (dispatch, synchronisation, small batches).
    OverheadBound,
}

impl Bound {
    /// `input-bound`, `compute-bound`, `overhead-bound`.
    pub fn label(self) -> &'static str {
        match self {
            Bound::InputBound => "input-bound",
            Bound::ComputeBound => "compute-bound",
            Bound::OverheadBound => "overhead-bound",
        }
    }
}

/// A verdict with its evidence and advice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The outcome.
    pub bound: Bound,
    /// Fraction of step time spent waiting for data.
    pub data_wait_frac: f64,
    /// Fraction of step time computing.
    pub compute_frac: f64,
    /// CPU use as a fraction of all cores.
    pub cpu_util: f64,
    /// What to do about it.
    pub advice: String,
}

/// Data-wait share above which a run is input-bound.
pub const INPUT_BOUND_WAIT: f64 = 0.25;
/// CPU use (of all cores) above which a run that is not input-bound is compute-bound.
pub const COMPUTE_BOUND_CPU: f64 = 0.6;

/// Decide.
pub fn verdict(t: &Timings) -> Verdict {
    let total = (t.data_wait_s + t.compute_s).max(1e-12);
    let wait = t.data_wait_s / total;
    let compute = t.compute_s / total;
    let (bound, advice) = if wait >= INPUT_BOUND_WAIT {
        let advice = if t.workers == 0 {
            format!(
                "the step waits for data {:.0}% of the time: raise loader.num_workers from 0 to {} so batches are assembled ahead of the step",
                wait * 100.0,
                t.cores.clamp(1, 4).max(2)
            )
        } else if t.workers < t.cores {
            format!(
                "the step waits for data {:.0}% of the time: raise loader.num_workers from {} to {}",
                wait * 100.0,
                t.workers,
                (t.workers * 2).min(t.cores)
            )
        } else {
            format!(
                "the step waits for data {:.0}% of the time with {} workers on {} cores: more workers cannot help; make the per-sample work cheaper (data.transform_passes, feature engineering) or precompute it",
                wait * 100.0,
                t.workers,
                t.cores
            )
        };
        (Bound::InputBound, advice)
    } else if t.cpu_util >= COMPUTE_BOUND_CPU {
        (
            Bound::ComputeBound,
            format!(
                "the step computes {:.0}% of the time and the cores are {:.0}% busy: the model's arithmetic is the limit; train on device: cuda (bf16), or trade width for speed",
                compute * 100.0,
                t.cpu_util * 100.0
            ),
        )
    } else {
        (
            Bound::OverheadBound,
            format!(
                "data arrives in time ({:.0}% wait) yet the cores are only {:.0}% busy: fixed per-step costs dominate; raise loader.batch_size from {} to amortise them",
                wait * 100.0,
                t.cpu_util * 100.0,
                t.batch_size
            ),
        )
    };
    Verdict {
        bound,
        data_wait_frac: wait,
        compute_frac: compute,
        cpu_util: t.cpu_util,
        advice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(wait: f64, compute: f64, cpu: f64, workers: usize) -> Timings {
        Timings {
            data_wait_s: wait,
            compute_s: compute,
            cpu_util: cpu,
            workers,
            cores: 2,
            batch_size: 128,
        }
    }

    #[test]
    fn input_bound_with_worker_advice() {
        let v = verdict(&t(6.0, 4.0, 0.5, 0));
        assert_eq!(v.bound, Bound::InputBound);
        assert!((v.data_wait_frac - 0.6).abs() < 1e-12);
        assert!(
            v.advice.contains("raise loader.num_workers from 0 to 2"),
            "{}",
            v.advice
        );
        let v = verdict(&t(3.0, 7.0, 0.5, 1));
        assert!(v.advice.contains("from 1 to 2"), "{}", v.advice);
        let v = verdict(&t(3.0, 7.0, 0.9, 2));
        assert_eq!(v.bound, Bound::InputBound);
        assert!(
            v.advice.contains("more workers cannot help"),
            "{}",
            v.advice
        );
    }

    #[test]
    fn compute_and_overhead_bound() {
        let v = verdict(&t(0.5, 9.5, 0.95, 2));
        assert_eq!(v.bound, Bound::ComputeBound);
        assert_eq!(v.bound.label(), "compute-bound");
        let v = verdict(&t(0.5, 9.5, 0.15, 2));
        assert_eq!(v.bound, Bound::OverheadBound);
        assert!(v.advice.contains("batch_size from 128"), "{}", v.advice);
        // The boundary itself counts as input-bound.
        assert_eq!(verdict(&t(2.5, 7.5, 0.9, 0)).bound, Bound::InputBound);
        assert_eq!(verdict(&t(0.0, 0.0, 0.0, 0)).bound, Bound::OverheadBound);
    }
}
