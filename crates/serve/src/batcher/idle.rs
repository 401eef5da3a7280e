//! The `idle` policy: a request claims an idle instance under one short lock and runs on its
//! own thread when the instance allows it; while every instance is busy requests queue, and
//! an instance that finishes serves the queue from its worker thread (see [`super`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::run::{Batch, record_batch, run_batch, run_guarded};
use crate::metrics::VersionMetrics;
use crate::model::{Instance, ModelInput};
use crate::protocol::OutputTensor;
use crate::queue::{BatchTiming, Job, Queue};

/// One instance of the `idle` policy.
#[derive(Default)]
pub(super) struct Slot {
    /// The engine; whoever claimed the instance (off the idle list) locks it, uncontended.
    pub(super) instance: Mutex<Option<Box<dyn Instance>>>,
    /// Whether a request's own thread may run this instance.
    pub(super) inline: AtomicBool,
    /// Set when the worker thread is handed the instance.
    pub(super) go: AtomicBool,
    /// The thread that runs the worker loop.
    pub(super) thread: OnceLock<std::thread::Thread>,
}

/// The queue and the idle list, under one lock.
pub(super) struct IdleState {
    pub(super) queue: Queue,
    /// Instances nobody has claimed.
    pub(super) idle: Vec<usize>,
    pub(super) closing: bool,
}

/// What the `idle` policy's callers and worker threads share. An instance is owned by
/// whoever popped it off `idle`: a request's thread (inline) or its worker thread.
pub(super) struct IdleShared {
    pub(super) state: Mutex<IdleState>,
    pub(super) slots: Vec<Slot>,
    pub(super) max_batch: usize,
    /// One thread per instance: a request's thread may run it without changing parallelism.
    pub(super) inline_threads: bool,
    /// [`BatcherConfig::fault_compute_delay`].
    pub(super) compute_delay: Duration,
    pub(super) depth: Arc<AtomicUsize>,
    pub(super) model_depth: Arc<AtomicUsize>,
    pub(super) metrics: Arc<VersionMetrics>,
}

impl IdleShared {
    pub(super) fn lock(&self) -> MutexGuard<'_, IdleState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn inline(&self, i: usize) -> bool {
        self.inline_threads && self.slots[i].inline.load(Ordering::Relaxed)
    }

    /// Hand instance `i` to its worker thread.
    pub(super) fn signal(&self, i: usize) {
        let slot = &self.slots[i];
        slot.go.store(true, Ordering::Release);
        if let Some(t) = slot.thread.get() {
            t.unpark();
        }
    }

    /// Stop: idle workers wake, drain the queue and exit; busy ones exit when done.
    pub(super) fn close(&self) {
        let idle: Vec<usize> = {
            let mut st = self.lock();
            st.closing = true;
            std::mem::take(&mut st.idle)
        };
        for i in idle {
            self.signal(i);
        }
    }

    /// Give back an instance that ran inline: to its worker when requests queued up
    /// meanwhile, else to the idle list.
    pub(super) fn release(&self, i: usize) {
        let mut st = self.lock();
        if st.queue.is_empty() && !st.closing {
            st.idle.push(i);
        } else {
            drop(st);
            self.signal(i);
        }
    }

    /// Run one request on instance `i`, which this thread has claimed.
    pub(super) fn run_inline(
        &self,
        i: usize,
        input: &ModelInput,
        arrived: Instant,
    ) -> Result<(Vec<OutputTensor>, BatchTiming), String> {
        let mut guard = self.slots[i]
            .instance
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let Some(instance) = guard.as_mut() else {
            return Err("the instance has stopped".into());
        };
        let inputs = {
            let _a = kiln_model::prof_span!("serve_batch_assembly", requests = 1).entered();
            [input]
        };
        let t0 = Instant::now();
        self.metrics.record_queue(t0 - arrived);
        crate::observe::profiler::record_interval("serve_queue_wait", arrived, t0);
        let r = {
            let _c = kiln_model::prof_span!("serve_compute", rows = input.rows()).entered();
            run_guarded(&mut **instance, &inputs)
        };
        let engine = instance.engine_time();
        drop(guard);
        let t1 = Instant::now();
        if let Some(d) = engine.filter(|_| r.is_ok()) {
            self.metrics.record_engine_time(input.rows(), d);
        }
        let timing = BatchTiming {
            taken: t0,
            compute_start: t0,
            compute_end: t1,
            rows: input.rows(),
            requests: 1,
            instance: i,
        };
        let r = r.map(|mut v| (v.swap_remove(0), timing));
        // Nothing to assemble: the request's own thread runs it.
        record_batch(
            &self.metrics,
            i,
            input.rows(),
            1,
            Duration::ZERO,
            t1 - t0,
            t1.elapsed(),
        );
        r
    }

    /// Pop the next batch (up to `max_batch` rows) off the queue, dropping requests whose
    /// caller left or whose deadline passed.
    fn take_batch(&self, st: &mut IdleState) -> (Vec<Job>, Instant) {
        let now = Instant::now();
        let jobs = st.queue.take_batch(now, self.max_batch, &self.metrics, || {
            self.depth.fetch_sub(1, Ordering::AcqRel);
            self.model_depth.fetch_sub(1, Ordering::Relaxed);
        });
        (jobs, now)
    }

    /// Worker thread `i`: wait to be handed the instance, then serve the queue until it is
    /// empty, and go back to the idle list.
    pub(super) fn worker_loop(&self, i: usize) {
        let slot = &self.slots[i];
        // This thread (a pool thread: the loop runs inside the pool) is the one to unpark;
        // a signal sent before this is kept in `go`.
        let _ = slot.thread.set(std::thread::current());
        loop {
            while !slot.go.swap(false, Ordering::Acquire) {
                std::thread::park();
            }
            loop {
                let (jobs, taken) = {
                    let mut st = self.lock();
                    let (jobs, taken) = self.take_batch(&mut st);
                    if jobs.is_empty() {
                        if st.closing {
                            drop(st);
                            // Drop the engine on its own thread.
                            let engine = slot
                                .instance
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .take();
                            drop(engine);
                            return;
                        }
                        st.idle.push(i);
                        break;
                    }
                    (jobs, taken)
                };
                let mut guard = slot.instance.lock().unwrap_or_else(|p| p.into_inner());
                let Some(instance) = guard.as_mut() else {
                    return;
                };
                run_batch(
                    i,
                    &mut **instance,
                    Batch { jobs, taken },
                    &self.metrics,
                    self.compute_delay,
                );
            }
        }
    }
}
