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

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::metrics::{Dropped, VersionMetrics};
use super::model::{Instance, LoadError, ModelInput, buckets};
use super::protocol::OutputTensor;
use super::queue::{Job, Queue};

/// When a batch launches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
        match self {
            BatchingPolicy::Idle => "idle",
            BatchingPolicy::Delay => "delay",
        }
    }
}

impl std::fmt::Display for BatchingPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BatchingPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "idle" => Ok(BatchingPolicy::Idle),
            "delay" => Ok(BatchingPolicy::Delay),
            other => Err(format!(
                "unknown batching policy `{other}`; expected `idle` or `delay`"
            )),
        }
    }
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

/// When and how a request's batch ran (for its trace spans).
#[derive(Debug, Clone, Copy)]
pub struct BatchTiming {
    /// The batch left the queue (for a request run at once: when it claimed the instance).
    pub taken: Instant,
    /// The engine started.
    pub compute_start: Instant,
    /// The engine returned.
    pub compute_end: Instant,
    /// Rows in the batch.
    pub rows: usize,
    /// Requests in the batch.
    pub requests: usize,
    /// The instance that ran it.
    pub instance: usize,
}

enum Msg {
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

struct Batch {
    jobs: Vec<Job>,
    /// When the batch left the queue (its assembly starts).
    taken: Instant,
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

/// One instance of the `idle` policy.
#[derive(Default)]
struct Slot {
    /// The engine; whoever claimed the instance (off the idle list) locks it, uncontended.
    instance: Mutex<Option<Box<dyn Instance>>>,
    /// Whether a request's own thread may run this instance.
    inline: AtomicBool,
    /// Set when the worker thread is handed the instance.
    go: AtomicBool,
    /// The thread that runs the worker loop.
    thread: OnceLock<std::thread::Thread>,
}

struct IdleState {
    queue: Queue,
    /// Instances nobody has claimed.
    idle: Vec<usize>,
    closing: bool,
}

/// What the `idle` policy's callers and worker threads share. An instance is owned by
/// whoever popped it off `idle`: a request's thread (inline) or its worker thread.
struct IdleShared {
    state: Mutex<IdleState>,
    slots: Vec<Slot>,
    max_batch: usize,
    /// One thread per instance: a request's thread may run it without changing parallelism.
    inline_threads: bool,
    /// [`BatcherConfig::fault_compute_delay`].
    compute_delay: Duration,
    depth: Arc<AtomicUsize>,
    model_depth: Arc<AtomicUsize>,
    metrics: Arc<VersionMetrics>,
}

impl IdleShared {
    fn lock(&self) -> MutexGuard<'_, IdleState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn inline(&self, i: usize) -> bool {
        self.inline_threads && self.slots[i].inline.load(Ordering::Relaxed)
    }

    /// Hand instance `i` to its worker thread.
    fn signal(&self, i: usize) {
        let slot = &self.slots[i];
        slot.go.store(true, Ordering::Release);
        if let Some(t) = slot.thread.get() {
            t.unpark();
        }
    }

    /// Stop: idle workers wake, drain the queue and exit; busy ones exit when done.
    fn close(&self) {
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
    fn release(&self, i: usize) {
        let mut st = self.lock();
        if st.queue.is_empty() && !st.closing {
            st.idle.push(i);
        } else {
            drop(st);
            self.signal(i);
        }
    }

    /// Run one request on instance `i`, which this thread has claimed.
    fn run_inline(
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
    fn worker_loop(&self, i: usize) {
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

fn record_batch(
    metrics: &VersionMetrics,
    id: usize,
    rows: usize,
    requests: usize,
    input: Duration,
    infer: Duration,
    output: Duration,
) {
    metrics.record_execution(rows, requests, input, infer, output);
    tracing::trace!(instance = id, rows, requests, ?infer, "batch computed");
}

/// Compute one batch and answer its requests.
fn run_batch(
    id: usize,
    instance: &mut dyn Instance,
    batch: Batch,
    metrics: &VersionMetrics,
    delay: Duration,
) {
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let rows: usize = batch.jobs.iter().map(|j| j.input.rows()).sum();
    let inputs: Vec<&ModelInput> = {
        let _a =
            kiln_model::prof_span!("serve_batch_assembly", requests = batch.jobs.len()).entered();
        batch.jobs.iter().map(|j| &j.input).collect()
    };
    let t0 = Instant::now();
    let result = {
        let _c = kiln_model::prof_span!("serve_compute", rows = rows).entered();
        run_guarded(instance, &inputs)
    };
    if result.is_ok()
        && let Some(d) = instance.engine_time()
    {
        metrics.record_engine_time(rows, d);
    }
    let results = match result {
        Ok(r) => r.into_iter().map(Ok).collect::<Vec<_>>(),
        Err(_) if inputs.len() > 1 => {
            // Isolate the failing request: run each alone.
            inputs
                .iter()
                .map(|i| run_guarded(instance, &[*i]).map(|mut v| v.remove(0)))
                .collect()
        }
        Err(e) => vec![Err(e)],
    };
    let t1 = Instant::now();
    let timing = BatchTiming {
        taken: batch.taken,
        compute_start: t0,
        compute_end: t1,
        rows,
        requests: batch.jobs.len(),
        instance: id,
    };
    record_batch(
        metrics,
        id,
        rows,
        timing.requests,
        t0.saturating_duration_since(batch.taken),
        t1 - t0,
        t1.elapsed(),
    );
    for (job, r) in batch.jobs.into_iter().zip(results) {
        let _ = job.reply.send(r.map(|o| (o, timing)));
    }
}

fn worker_loop(
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

fn run_guarded(
    instance: &mut dyn Instance,
    inputs: &[&ModelInput],
) -> Result<Vec<Vec<OutputTensor>>, String> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| instance.execute(inputs))) {
        Ok(r) => {
            let r = r?;
            if r.len() != inputs.len() {
                return Err(format!(
                    "the instance answered {} of {} requests",
                    r.len(),
                    inputs.len()
                ));
            }
            Ok(r)
        }
        Err(p) => Err(format!(
            "the engine panicked: {}",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)")
        )),
    }
}

struct QueueThread {
    rx: mpsc::Receiver<Msg>,
    workers: Vec<mpsc::SyncSender<Batch>>,
    config: BatcherConfig,
    depth: Arc<AtomicUsize>,
    model_depth: Arc<AtomicUsize>,
    metrics: Arc<VersionMetrics>,
}

impl QueueThread {
    fn run(self) {
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

#[cfg(test)]
mod tests {
    use std::sync::Condvar;

    use super::super::metrics::Metrics;
    use super::super::model::InstanceError;
    use super::super::protocol::OutputData;
    use super::*;

    /// Echoes its inputs; records each batch's request count and blocks while the gate is
    /// closed.
    struct Gated {
        batches: Arc<Mutex<Vec<usize>>>,
        gate: Arc<(Mutex<bool>, Condvar)>,
    }

    impl Instance for Gated {
        fn warm_up(&mut self, _rows: usize) -> Result<(), InstanceError> {
            Ok(())
        }

        fn execute(
            &mut self,
            inputs: &[&ModelInput],
        ) -> Result<Vec<Vec<OutputTensor>>, InstanceError> {
            self.batches.lock().unwrap().push(inputs.len());
            let (open, cv) = &*self.gate;
            let mut g = open.lock().unwrap();
            while !*g {
                g = cv.wait(g).unwrap();
            }
            Ok(inputs
                .iter()
                .map(|i| match i {
                    ModelInput::Regression { x, rows } => vec![OutputTensor {
                        name: "y".into(),
                        shape: vec![*rows],
                        data: OutputData::F32(x.clone()),
                    }],
                    _ => Vec::new(),
                })
                .collect())
        }
    }

    type Gate = Arc<(Mutex<bool>, Condvar)>;
    /// The batcher, the request count of each batch, the gate and the metrics.
    type Started = (Batcher, Arc<Mutex<Vec<usize>>>, Gate, Arc<VersionMetrics>);

    fn input(v: f32) -> ModelInput {
        ModelInput::Regression {
            x: vec![v],
            rows: 1,
        }
    }

    fn start(policy: BatchingPolicy, open: bool) -> Started {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new((Mutex::new(open), Condvar::new()));
        let (b, g) = (batches.clone(), gate.clone());
        let factory: Arc<InstanceFactory> = Arc::new(move || {
            Ok(Box::new(Gated {
                batches: b.clone(),
                gate: g.clone(),
            }) as Box<dyn Instance>)
        });
        let metrics = Metrics::default().model("m").version(1);
        let config = BatcherConfig {
            policy,
            // Far above any scheduling noise: a request that waited for it would show.
            max_queue_delay: Duration::from_secs(30),
            ..BatcherConfig::default()
        };
        let batcher = Batcher::start(
            "m",
            &config,
            factory,
            metrics.clone(),
            Arc::new(AtomicUsize::new(0)),
        )
        .unwrap();
        (batcher, batches, gate, metrics)
    }

    fn poll_until(what: &str, mut cond: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < until, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_policy_launches_a_lone_request_at_once() {
        let (batcher, batches, _gate, metrics) = start(BatchingPolicy::Idle, true);
        for v in [1.0, 2.0] {
            let out = batcher
                .infer(input(v), 1, Duration::from_secs(60))
                .await
                .unwrap();
            assert_eq!(out.0[0].data, OutputData::F32(vec![v]));
        }
        // Two batches of one request each, neither queued (the delay is 30 s).
        assert_eq!(*batches.lock().unwrap(), [1, 1]);
        assert_eq!(metrics.batch_size.count(), 2);
        assert_eq!(metrics.queue.count(), 2);
        assert!(
            metrics.queue.sum() < 1_000_000,
            "queued {} µs",
            metrics.queue.sum()
        );
        assert_eq!(batcher.queue_depth(), 0);
    }

    #[test]
    fn idle_policy_batches_what_queued_while_the_instance_was_busy() {
        let (batcher, batches, gate, metrics) = start(BatchingPolicy::Idle, false);
        let batcher = Arc::new(batcher);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        // The first request finds the instance idle and holds it (the gate is closed).
        let b = batcher.clone();
        let first = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(b.infer(input(0.0), 1, Duration::from_secs(60)))
        });
        poll_until("the first request computes", || {
            batches.lock().unwrap().len() == 1
        });
        // Five more arrive while it is busy: they queue.
        let rest: Vec<_> = (1..=5)
            .map(|i| {
                let b = batcher.clone();
                rt.spawn(async move { b.infer(input(i as f32), 1, Duration::from_secs(60)).await })
            })
            .collect();
        poll_until("five requests are queued", || batcher.queue_depth() == 5);
        {
            let (open, cv) = &*gate;
            *open.lock().unwrap() = true;
            cv.notify_all();
        }
        assert_eq!(
            first.join().unwrap().unwrap().0[0].data,
            OutputData::F32(vec![0.0])
        );
        for (i, r) in rest.into_iter().enumerate() {
            let out = rt.block_on(r).unwrap().unwrap();
            assert_eq!(out.0[0].data, OutputData::F32(vec![(i + 1) as f32]));
        }
        // One batch of one, then the five queued ones together.
        assert_eq!(*batches.lock().unwrap(), [1, 5]);
        assert_eq!(metrics.exec_count.load(Ordering::Relaxed), 2);
        assert_eq!(batcher.queue_depth(), 0);
    }

    #[test]
    fn policies_are_parsed_and_named() {
        assert_eq!("idle".parse::<BatchingPolicy>(), Ok(BatchingPolicy::Idle));
        assert_eq!("delay".parse::<BatchingPolicy>(), Ok(BatchingPolicy::Delay));
        let e = "fast".parse::<BatchingPolicy>().unwrap_err();
        assert!(
            e.contains("`fast`") && e.contains("`idle` or `delay`"),
            "{e}"
        );
        assert_eq!(BatchingPolicy::default().to_string(), "idle");
    }
}
