//! The `delay` policy (Triton's dynamic batcher): one thread owns the queue; requests and
//! worker completions arrive on one channel, and only that thread decides when a batch
//! launches (see [`super`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::BatcherConfig;
use super::run::{Batch, run_batch};
use crate::metrics::{Dropped, VersionMetrics};
use crate::model::Instance;
use crate::queue::{Job, Queue};

/// What the queue thread receives.
pub(super) enum Msg {
    Job(Job),
    Done(usize),
    /// The request's caller left or its deadline passed: drop it if it is still queued.
    Withdraw {
        id: u64,
        level: usize,
        why: Dropped,
    },
    Close,
}

/// The queue thread's state.
pub(super) struct QueueThread {
    pub(super) rx: mpsc::Receiver<Msg>,
    pub(super) workers: Vec<mpsc::SyncSender<Batch>>,
    pub(super) config: BatcherConfig,
    pub(super) depth: Arc<AtomicUsize>,
    pub(super) model_depth: Arc<AtomicUsize>,
    pub(super) metrics: Arc<VersionMetrics>,
}

impl QueueThread {
    /// Serve until closed and drained.
    pub(super) fn run(self) {
        let n = self.workers.len();
        let max_batch = self.config.max_batch_size.max(1);
        let delay = self.config.max_queue_delay;
        let mut pending = Queue::new(self.config.priority_levels, self.config.priority_max_wait);
        let mut idle: Vec<usize> = (0..n).rev().collect();
        let mut closing = false;
        let left = || {
            self.depth.fetch_sub(1, Ordering::AcqRel);
            self.model_depth.fetch_sub(1, Ordering::Relaxed);
        };
        loop {
            // Launch every batch that is due on every idle instance.
            while !idle.is_empty()
                && let Some(oldest) = pending.oldest()
            {
                let now = Instant::now();
                if !(closing || pending.rows() >= max_batch || now >= oldest + delay) {
                    break;
                }
                let jobs = pending.take_batch(now, max_batch, &self.metrics, left);
                if jobs.is_empty() {
                    continue;
                }
                let w = idle.pop().expect("an idle instance");
                if self.workers[w].send(Batch { jobs, taken: now }).is_err() {
                    tracing::error!("inference instance {w} stopped");
                }
            }
            if closing && pending.is_empty() && idle.len() == n {
                break;
            }
            let due = pending.oldest().filter(|_| !idle.is_empty() && !closing);
            let msg = if let Some(oldest) = due {
                match self
                    .rx
                    .recv_timeout((oldest + delay).saturating_duration_since(Instant::now()))
                {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        closing = true;
                        None
                    }
                }
            } else {
                match self.rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => {
                        closing = true;
                        if idle.len() < n {
                            // Workers hold senders, so this means they are gone.
                            break;
                        }
                        None
                    }
                }
            };
            let mut next = msg;
            while let Some(m) = next {
                match m {
                    Msg::Job(j) => pending.push(j),
                    Msg::Done(w) => idle.push(w),
                    Msg::Withdraw { id, level, why } => {
                        if pending.remove(id, level).is_some() {
                            left();
                            self.metrics.record_dropped(why);
                        }
                    }
                    Msg::Close => closing = true,
                }
                next = self.rx.try_recv().ok();
            }
        }
        // Dropping the work senders ends the worker threads.
    }
}

/// A worker thread: run each batch it is handed, then report back.
pub(super) fn worker_loop(
    id: usize,
    mut instance: Box<dyn Instance>,
    rx: mpsc::Receiver<Batch>,
    done: mpsc::Sender<Msg>,
    metrics: &VersionMetrics,
    delay: Duration,
) {
    while let Ok(batch) = rx.recv() {
        run_batch(id, &mut *instance, batch, metrics, delay);
        if done.send(Msg::Done(id)).is_err() {
            break;
        }
    }
}
