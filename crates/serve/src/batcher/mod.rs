//! The dynamic batcher of one model version, with two policies ([`BatchingPolicy`]).
//!
//! **`idle`** (the default): a request launches at once when an instance is idle, and
//! requests accumulate into batches only while every instance is busy. There is no queue
//! thread: the request's own thread claims an idle instance under one short lock and, for an
//! instance that allows it ([`Instance::inline_ok`]) with one thread per instance, runs the
//! batch of one right there — no thread hop, no channel, no wake-up. While every instance is
//! busy, requests go into a shared queue; an instance that finishes takes the queue's head
//! (up to `max_batch_size` rows) on its own worker thread, so batches grow with load exactly
//! as far as the instances are behind. `max_queue_delay` is not used: nothing waits for a
//! fuller batch while an instance is free.
//!
//! **`delay`** (Triton's dynamic batcher): one thread owns the queue (as in
//! text-embeddings-inference's `queue.rs`): requests and worker completions arrive on one
//! channel, and only that thread decides when a batch launches, so the batching logic has no
//! locks. A batch launches on an idle instance as soon as the queued rows reach
//! `max_batch_size`, or when the oldest queued request has waited `max_queue_delay` — never
//! later (the queue thread sleeps with a precise timed wait, not a millisecond timer wheel).
//! While every instance is busy, requests keep accumulating, so batches grow with load.
//!
//! Each instance is a worker thread that owns its engine and runs inside its own rayon pool
//! of `threads_per_instance` threads (Burn's CPU matmul and the MVN estimator use rayon, so
//! the pool bounds their parallelism). Instances are built and warmed — once per batch-size
//! bucket — on their own threads before [`Batcher::start`] returns.
//!
//! Admission is one atomic: a request finding `max_queue_size` requests queued is refused at
//! once (503). Both policies share one queue ([`super::queue`]): a FIFO per priority level
//! (a request's `priority` parameter, Triton's levels: 1 first), with waiting bounded by
//! `priority_max_wait`, past which a request goes ahead of every level. Each request carries
//! a deadline (its `timeout` parameter, capped by the server's request timeout): one that
//! expires in the queue is answered with a timeout at its deadline, leaves the queue and
//! never reaches an engine. A request whose caller goes away (an HTTP client that
//! disconnects, a cancelled gRPC call: the transport drops the request's future) leaves the
//! queue at once. Both are counted per version
//! ([`VersionMetrics::record_dropped`]).
//!
//! Files: this one holds the settings and the [`Batcher`] (start, admission, a request's wait
//! and withdrawal); `idle.rs` the `idle` policy's shared state and worker loop; `delay.rs` the
//! `delay` policy's queue thread and workers; `run.rs` running one batch on an instance and
//! answering its requests.

mod delay;
mod idle;
mod run;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::metrics::{Dropped, VersionMetrics};
use crate::model::{Instance, LoadError, ModelInput, buckets};
use crate::protocol::OutputTensor;
pub use crate::queue::BatchTiming;
use crate::queue::{Job, Queue};
use delay::{Msg, QueueThread, worker_loop};
use idle::{IdleShared, IdleState, Slot};
use run::Batch;

/// When a batch launches.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    strum::IntoStaticStr,
    strum::Display,
    strum::EnumString,
)]
#[strum(
    serialize_all = "lowercase",
    parse_err_ty = String,
    parse_err_fn = unknown_policy
)]
pub enum BatchingPolicy {
    /// Launch at once on an idle instance; accumulate only while every instance is busy.
    #[default]
    Idle,
    /// Triton's dynamic batcher: wait up to `max_queue_delay` for a full batch.
    Delay,
}

impl BatchingPolicy {
    /// The name (`idle`, `delay`), as `--batching` and the model config endpoint spell it.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// `BatchingPolicy`'s derived `FromStr` error.
fn unknown_policy(other: &str) -> String {
    format!("unknown batching policy `{other}`; expected `idle` or `delay`")
}

/// Batching and instance settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BatcherConfig {
    /// When a batch launches.
    pub policy: BatchingPolicy,
    /// Most rows in one batch (1 turns batching off).
    pub max_batch_size: usize,
    /// How long the oldest request may wait for a fuller batch (`delay` policy only).
    pub max_queue_delay: Duration,
    /// Most requests waiting; more are refused with 503.
    pub max_queue_size: usize,
    /// Inference instances (worker threads, each owning an engine).
    pub instances: usize,
    /// Threads per instance.
    pub threads_per_instance: usize,
    /// Priority levels (Triton's `priority_levels`): a request's `priority` parameter picks
    /// one, 1 the highest; 0 or none means `default_priority`.
    pub priority_levels: usize,
    /// The level of a request that names none (1 to `priority_levels`).
    pub default_priority: usize,
    /// The starvation bound: a request queued this long goes ahead of every level.
    pub priority_max_wait: Duration,
    /// Testing hook: every batch sleeps this long before it computes, and no request runs on
    /// its caller's thread, so tests of deadlines, cancellation and priority can load the
    /// queue. Zero in every real configuration; no flag sets it.
    #[doc(hidden)]
    pub fault_compute_delay: Duration,
}

impl Default for BatcherConfig {
    fn default() -> Self {
        Self {
            policy: BatchingPolicy::Idle,
            max_batch_size: 64,
            max_queue_delay: Duration::from_micros(100),
            max_queue_size: 1024,
            instances: 1,
            threads_per_instance: 1,
            priority_levels: 3,
            default_priority: 2,
            priority_max_wait: Duration::from_millis(500),
            fault_compute_delay: Duration::ZERO,
        }
    }
}

impl BatcherConfig {
    /// The 0-based queue level of a request's `priority` parameter, or why it is refused.
    pub fn level(&self, priority: Option<u64>) -> Result<usize, String> {
        match priority {
            None | Some(0) => Ok(self.default_priority.clamp(1, self.priority_levels.max(1)) - 1),
            Some(p) if p <= self.priority_levels as u64 => Ok(p as usize - 1),
            Some(p) => Err(format!(
                "request parameter `priority` is {p}; this server has {} priority levels: \
                 expected 1 (the highest) to {}, or 0 for the default ({})",
                self.priority_levels, self.priority_levels, self.default_priority
            )),
        }
    }
}

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InferFailure {
    /// The queue was full.
    #[error("the queue of model `{model}` is full ({size} requests waiting); retry later")]
    QueueFull {
        /// The model.
        model: String,
        /// The queue limit.
        size: usize,
    },
    /// The deadline passed.
    #[error(
        "the request timed out: its deadline passed after {0:?} without an answer (a request \
         still queued then is dropped and never computed; the deadline is the `timeout` \
         parameter in µs, capped by --request-timeout-ms)"
    )]
    Timeout(Duration),
    /// The engine failed.
    #[error("inference failed: {0}")]
    Internal(String),
}

/// A running batcher. Dropping it lets queued requests finish, then stops its threads.
pub struct Batcher {
    model: String,
    inner: Inner,
    depth: Arc<AtomicUsize>,
    model_depth: Arc<AtomicUsize>,
    max_queue_size: usize,
    next_id: AtomicU64,
    metrics: Arc<VersionMetrics>,
}

enum Inner {
    Delay(mpsc::Sender<Msg>),
    Idle(Arc<IdleShared>),
}

/// Builds one instance; called once on each worker thread, inside its pool.
pub type InstanceFactory = dyn Fn() -> Result<Box<dyn Instance>, LoadError> + Send + Sync;

/// What a worker thread does once its instance is warm.
enum WorkerRole {
    Delay {
        rx: mpsc::Receiver<Batch>,
        done: mpsc::Sender<Msg>,
        metrics: Arc<VersionMetrics>,
        delay: Duration,
    },
    Idle(Arc<IdleShared>),
}

impl Batcher {
    /// Start the instances (each built and warmed on its own thread) and, for the `delay`
    /// policy, the queue thread. Returns once every instance is warm, or the first error.
    pub fn start(
        model: &str,
        config: &BatcherConfig,
        factory: Arc<InstanceFactory>,
        metrics: Arc<VersionMetrics>,
        model_depth: Arc<AtomicUsize>,
    ) -> Result<Self, LoadError> {
        let n = config.instances.max(1);
        let depth = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel::<Msg>();
        let idle = (config.policy == BatchingPolicy::Idle).then(|| {
            Arc::new(IdleShared {
                state: Mutex::new(IdleState {
                    queue: Queue::new(config.priority_levels, config.priority_max_wait),
                    idle: (0..n).rev().collect(),
                    closing: false,
                }),
                slots: (0..n).map(|_| Slot::default()).collect(),
                max_batch: config.max_batch_size.max(1),
                inline_threads: config.threads_per_instance <= 1
                    && config.fault_compute_delay.is_zero(),
                compute_delay: config.fault_compute_delay,
                depth: depth.clone(),
                model_depth: model_depth.clone(),
                metrics: metrics.clone(),
            })
        });
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), LoadError>>();
        let mut workers = Vec::with_capacity(n);
        let buckets = buckets(config.max_batch_size);
        for i in 0..n {
            let role = match &idle {
                Some(shared) => WorkerRole::Idle(shared.clone()),
                None => {
                    let (wtx, wrx) = mpsc::sync_channel::<Batch>(1);
                    workers.push(wtx);
                    WorkerRole::Delay {
                        rx: wrx,
                        done: tx.clone(),
                        metrics: metrics.clone(),
                        delay: config.fault_compute_delay,
                    }
                }
            };
            let factory = factory.clone();
            let ready_tx = ready_tx.clone();
            let buckets = buckets.clone();
            let threads = config.threads_per_instance.max(1);
            let name = format!("kiln-{model}-i{i}");
            let handle = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    let pool = match rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .thread_name(move |t| format!("{name}-t{t}"))
                        .build()
                    {
                        Ok(p) => p,
                        Err(e) => {
                            let _ = ready_tx.send(Err(LoadError::Warmup(format!(
                                "cannot start a pool of {threads} threads: {e}"
                            ))));
                            return;
                        }
                    };
                    pool.install(|| {
                        let instance = factory().and_then(|mut inst| {
                            for &b in &buckets {
                                inst.warm_up(b).map_err(|e| {
                                    LoadError::Warmup(format!("batch size {b}: {e}"))
                                })?;
                            }
                            Ok(inst)
                        });
                        match (instance, role) {
                            (
                                Ok(inst),
                                WorkerRole::Delay {
                                    rx,
                                    done,
                                    metrics,
                                    delay,
                                },
                            ) => {
                                let _ = ready_tx.send(Ok(()));
                                drop(ready_tx);
                                worker_loop(i, inst, rx, done, &metrics, delay);
                            }
                            (Ok(inst), WorkerRole::Idle(shared)) => {
                                let slot = &shared.slots[i];
                                slot.inline.store(inst.inline_ok(), Ordering::Relaxed);
                                *slot.instance.lock().expect("instance lock") = Some(inst);
                                let _ = ready_tx.send(Ok(()));
                                drop(ready_tx);
                                shared.worker_loop(i);
                            }
                            (Err(e), _) => {
                                let _ = ready_tx.send(Err(e));
                            }
                        }
                    })
                })
                .map_err(|e| LoadError::Warmup(format!("cannot start a worker thread: {e}")));
            if let Err(e) = handle {
                if let Some(shared) = &idle {
                    shared.close();
                }
                return Err(e);
            }
        }
        drop(ready_tx);
        let mut first_err = None;
        for _ in 0..n {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(LoadError::Warmup("a worker thread died".into()));
                }
            }
        }
        if let Some(e) = first_err {
            // Closing (idle) or dropping the work senders (delay) stops the warm workers.
            if let Some(shared) = &idle {
                shared.close();
            }
            return Err(e);
        }
        let inner = match idle {
            Some(shared) => Inner::Idle(shared),
            None => {
                let q = QueueThread {
                    rx,
                    workers,
                    config: config.clone(),
                    depth: depth.clone(),
                    model_depth: model_depth.clone(),
                    metrics: metrics.clone(),
                };
                std::thread::Builder::new()
                    .name(format!("kiln-{model}-queue"))
                    .spawn(move || q.run())
                    .map_err(|e| {
                        LoadError::Warmup(format!("cannot start the queue thread: {e}"))
                    })?;
                Inner::Delay(tx)
            }
        };
        Ok(Self {
            model: model.to_string(),
            inner,
            depth,
            model_depth,
            max_queue_size: config.max_queue_size,
            next_id: AtomicU64::new(0),
            metrics,
        })
    }

    /// Requests waiting in this batcher's queue.
    pub fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// Admit one request to the queue, or refuse it when the queue is full.
    fn admit(&self) -> Result<(), InferFailure> {
        let prev = self.depth.fetch_add(1, Ordering::AcqRel);
        if prev >= self.max_queue_size {
            self.depth.fetch_sub(1, Ordering::AcqRel);
            return Err(InferFailure::QueueFull {
                model: self.model.clone(),
                size: self.max_queue_size,
            });
        }
        self.model_depth.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn unadmit(&self) {
        self.depth.fetch_sub(1, Ordering::AcqRel);
        self.model_depth.fetch_sub(1, Ordering::Relaxed);
    }

    /// Queue `input` at priority `level` (0-based, see [`BatcherConfig::level`]) and wait
    /// for its outputs, at most `timeout` in all. Dropping the returned future (the caller
    /// went away) withdraws the request from the queue.
    pub async fn infer(
        &self,
        input: ModelInput,
        level: usize,
        timeout: Duration,
    ) -> Result<(Vec<OutputTensor>, BatchTiming), InferFailure> {
        let now = Instant::now();
        let deadline = now + timeout;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rx = match &self.inner {
            Inner::Idle(shared) => {
                let mut st = shared.lock();
                // An idle instance and nobody ahead: launch at once.
                if st.queue.is_empty()
                    && let Some(&i) = st.idle.last()
                    && shared.inline(i)
                {
                    st.idle.pop();
                    drop(st);
                    let r = shared.run_inline(i, &input, now);
                    shared.release(i);
                    return r.map_err(InferFailure::Internal);
                }
                self.admit()?;
                let (reply, rx) = oneshot::channel();
                st.queue.push(Job {
                    id,
                    level,
                    input,
                    enqueued: now,
                    deadline,
                    reply,
                });
                // An idle instance that does not run inline: its worker takes the job.
                if let Some(i) = st.idle.pop() {
                    drop(st);
                    shared.signal(i);
                }
                rx
            }
            Inner::Delay(tx) => {
                self.admit()?;
                let (reply, rx) = oneshot::channel();
                let job = Job {
                    id,
                    level,
                    input,
                    enqueued: now,
                    deadline,
                    reply,
                };
                if tx.send(Msg::Job(job)).is_err() {
                    self.unadmit();
                    return Err(InferFailure::Internal("the batcher has stopped".into()));
                }
                rx
            }
        };
        let mut waiting = Waiting {
            batcher: self,
            id,
            level,
            armed: true,
        };
        let answer = tokio::time::timeout_at(deadline.into(), rx).await;
        waiting.armed = false;
        match answer {
            Ok(Ok(Ok(out))) => Ok(out),
            Ok(Ok(Err(msg))) => Err(InferFailure::Internal(msg)),
            // Dropped unanswered: it expired in the queue (and was counted there).
            Ok(Err(_)) => Err(InferFailure::Timeout(timeout)),
            Err(_) => {
                self.withdraw(id, level, Dropped::Deadline);
                Err(InferFailure::Timeout(timeout))
            }
        }
    }

    /// Drop request `id` from the queue if it is still there (counted as `why`); a request
    /// that is computing finishes, and its answer goes nowhere.
    fn withdraw(&self, id: u64, level: usize, why: Dropped) {
        match &self.inner {
            Inner::Idle(shared) => {
                let gone = shared.lock().queue.remove(id, level);
                if gone.is_some() {
                    self.unadmit();
                    self.metrics.record_dropped(why);
                }
            }
            Inner::Delay(tx) => {
                let _ = tx.send(Msg::Withdraw { id, level, why });
            }
        }
    }
}

/// A queued request's claim: dropped while armed (the caller's future was dropped before
/// the answer came), it withdraws the request.
struct Waiting<'a> {
    batcher: &'a Batcher,
    id: u64,
    level: usize,
    armed: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.batcher
                .withdraw(self.id, self.level, Dropped::Cancelled);
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        match &self.inner {
            Inner::Delay(tx) => {
                let _ = tx.send(Msg::Close);
            }
            Inner::Idle(shared) => shared.close(),
        }
    }
}
