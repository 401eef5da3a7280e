//! The dynamic batcher of one model version.
//!
//! One thread owns the queue (as in text-embeddings-inference's `queue.rs`): requests and
//! worker completions arrive on one channel, and only that thread decides when a batch
//! launches, so the batching logic has no locks. A batch launches on an idle instance as soon
//! as the queued rows reach `max_batch_size`, or when the oldest queued request has waited
//! `max_queue_delay` — never later (the queue thread sleeps with a precise timed wait, not a
//! millisecond timer wheel). While every instance is busy, requests keep accumulating, so
//! batches grow with load.
//!
//! Each instance is a worker thread that owns its engine and runs inside its own rayon pool
//! of `threads_per_instance` threads (Burn's CPU matmul and the MVN estimator use rayon, so
//! the pool bounds their parallelism). Instances are built and warmed — once per batch-size
//! bucket — on their own threads before [`Batcher::start`] returns.
//!
//! Admission is one atomic: a request finding `max_queue_size` requests queued is refused at
//! once (503). Each request carries a deadline; one that expires in the queue is dropped
//! before it reaches an engine.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::metrics::VersionMetrics;
use super::model::{Instance, LoadError, ModelInput, buckets};
use super::protocol::OutputTensor;

/// Batching and instance settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BatcherConfig {
    /// Most rows in one batch (1 turns batching off).
    pub max_batch_size: usize,
    /// How long the oldest request may wait for a fuller batch.
    pub max_queue_delay: Duration,
    /// Most requests waiting; more are refused with 503.
    pub max_queue_size: usize,
    /// Inference instances (worker threads, each owning an engine).
    pub instances: usize,
    /// Threads per instance.
    pub threads_per_instance: usize,
}

impl Default for BatcherConfig {
    fn default() -> Self {
        Self {
            max_batch_size: 64,
            max_queue_delay: Duration::from_micros(100),
            max_queue_size: 1024,
            instances: 1,
            threads_per_instance: 1,
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
    #[error("the request timed out after {0:?} (queued or computing)")]
    Timeout(Duration),
    /// The engine failed.
    #[error("inference failed: {0}")]
    Internal(String),
}

type Reply = oneshot::Sender<Result<Vec<OutputTensor>, String>>;

struct Job {
    input: ModelInput,
    enqueued: Instant,
    deadline: Instant,
    reply: Reply,
}

enum Msg {
    Job(Job),
    Done(usize),
    Close,
}

struct Batch {
    jobs: Vec<Job>,
}

/// A running batcher. Dropping it lets queued requests finish, then stops its threads.
pub struct Batcher {
    model: String,
    tx: mpsc::Sender<Msg>,
    depth: Arc<AtomicUsize>,
    model_depth: Arc<AtomicUsize>,
    max_queue_size: usize,
}

/// Builds one instance; called once on each worker thread, inside its pool.
pub type InstanceFactory = dyn Fn() -> Result<Box<dyn Instance>, LoadError> + Send + Sync;

impl Batcher {
    /// Start the instances (each built and warmed on its own thread) and the queue thread.
    /// Returns once every instance is warm, or the first error.
    pub fn start(
        model: &str,
        config: &BatcherConfig,
        factory: Arc<InstanceFactory>,
        metrics: Arc<VersionMetrics>,
        model_depth: Arc<AtomicUsize>,
    ) -> Result<Self, LoadError> {
        let (tx, rx) = mpsc::channel::<Msg>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), LoadError>>();
        let mut workers = Vec::with_capacity(config.instances);
        let buckets = buckets(config.max_batch_size);
        for i in 0..config.instances.max(1) {
            let (wtx, wrx) = mpsc::sync_channel::<Batch>(1);
            workers.push(wtx);
            let factory = factory.clone();
            let ready_tx = ready_tx.clone();
            let done_tx = tx.clone();
            let metrics = metrics.clone();
            let buckets = buckets.clone();
            let threads = config.threads_per_instance.max(1);
            let name = format!("kiln-{model}-i{i}");
            std::thread::Builder::new()
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
                        match instance {
                            Ok(inst) => {
                                let _ = ready_tx.send(Ok(()));
                                drop(ready_tx);
                                worker_loop(i, inst, wrx, done_tx, &metrics);
                            }
                            Err(e) => {
                                let _ = ready_tx.send(Err(e));
                            }
                        }
                    })
                })
                .map_err(|e| LoadError::Warmup(format!("cannot start a worker thread: {e}")))?;
        }
        drop(ready_tx);
        let mut first_err = None;
        for _ in 0..workers.len() {
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
            // Dropping the work senders stops the warm workers.
            return Err(e);
        }
        let depth = Arc::new(AtomicUsize::new(0));
        let q = QueueThread {
            rx,
            workers,
            config: config.clone(),
            depth: depth.clone(),
            model_depth: model_depth.clone(),
            metrics,
        };
        std::thread::Builder::new()
            .name(format!("kiln-{model}-queue"))
            .spawn(move || q.run())
            .map_err(|e| LoadError::Warmup(format!("cannot start the queue thread: {e}")))?;
        Ok(Self {
            model: model.to_string(),
            tx,
            depth,
            model_depth,
            max_queue_size: config.max_queue_size,
        })
    }

    /// Requests waiting in this batcher's queue.
    pub fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// Queue `input` and wait for its outputs, at most `timeout` in all.
    pub async fn infer(
        &self,
        input: ModelInput,
        timeout: Duration,
    ) -> Result<Vec<OutputTensor>, InferFailure> {
        let prev = self.depth.fetch_add(1, Ordering::AcqRel);
        if prev >= self.max_queue_size {
            self.depth.fetch_sub(1, Ordering::AcqRel);
            return Err(InferFailure::QueueFull {
                model: self.model.clone(),
                size: self.max_queue_size,
            });
        }
        self.model_depth.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let deadline = now + timeout;
        let (reply, rx) = oneshot::channel();
        let job = Job {
            input,
            enqueued: now,
            deadline,
            reply,
        };
        if self.tx.send(Msg::Job(job)).is_err() {
            self.depth.fetch_sub(1, Ordering::AcqRel);
            self.model_depth.fetch_sub(1, Ordering::Relaxed);
            return Err(InferFailure::Internal("the batcher has stopped".into()));
        }
        match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(Ok(Ok(out))) => Ok(out),
            Ok(Ok(Err(msg))) => Err(InferFailure::Internal(msg)),
            // Dropped unanswered: it expired in the queue.
            Ok(Err(_)) | Err(_) => Err(InferFailure::Timeout(timeout)),
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Close);
    }
}

fn worker_loop(
    id: usize,
    mut instance: Box<dyn Instance>,
    rx: mpsc::Receiver<Batch>,
    done: mpsc::Sender<Msg>,
    metrics: &VersionMetrics,
) {
    while let Ok(batch) = rx.recv() {
        let rows: usize = batch.jobs.iter().map(|j| j.input.rows()).sum();
        let t0 = Instant::now();
        let inputs: Vec<&ModelInput> = batch.jobs.iter().map(|j| &j.input).collect();
        let result = run_guarded(&mut *instance, &inputs);
        let results = match result {
            Ok(r) => r.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(_) if inputs.len() > 1 => {
                // Isolate the failing request: run each alone.
                inputs
                    .iter()
                    .map(|i| run_guarded(&mut *instance, &[*i]).map(|mut v| v.remove(0)))
                    .collect()
            }
            Err(e) => vec![Err(e)],
        };
        let elapsed = t0.elapsed();
        metrics.compute.observe_duration(elapsed);
        metrics.exec_count.fetch_add(1, Ordering::Relaxed);
        metrics
            .inference_count
            .fetch_add(rows as u64, Ordering::Relaxed);
        metrics.batch_size.observe(rows as u64);
        tracing::trace!(
            instance = id,
            rows,
            requests = batch.jobs.len(),
            ?elapsed,
            "batch computed"
        );
        for (job, r) in batch.jobs.into_iter().zip(results) {
            let _ = job.reply.send(r);
        }
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
        let mut pending: VecDeque<Job> = VecDeque::new();
        let mut pending_rows = 0usize;
        let mut idle: Vec<usize> = (0..n).rev().collect();
        let mut closing = false;
        loop {
            // Launch every batch that is due on every idle instance.
            while !pending.is_empty() && !idle.is_empty() {
                let now = Instant::now();
                let oldest = pending.front().expect("non-empty").enqueued;
                if !(closing || pending_rows >= max_batch || now >= oldest + delay) {
                    break;
                }
                let mut jobs = Vec::new();
                let mut rows = 0;
                while let Some(j) = pending.front() {
                    let r = j.input.rows();
                    if !jobs.is_empty() && rows + r > max_batch {
                        break;
                    }
                    let j = pending.pop_front().expect("front exists");
                    pending_rows -= r;
                    self.depth.fetch_sub(1, Ordering::AcqRel);
                    self.model_depth.fetch_sub(1, Ordering::Relaxed);
                    if j.reply.is_closed() || now >= j.deadline {
                        // The caller gave up or timed out: do not compute it.
                        continue;
                    }
                    self.metrics.queue.observe_duration(now - j.enqueued);
                    rows += r;
                    jobs.push(j);
                }
                if jobs.is_empty() {
                    continue;
                }
                let w = idle.pop().expect("an idle instance");
                if self.workers[w].send(Batch { jobs }).is_err() {
                    tracing::error!("inference instance {w} stopped");
                }
            }
            if closing && pending.is_empty() && idle.len() == n {
                break;
            }
            let msg = if !pending.is_empty() && !idle.is_empty() && !closing {
                let due = pending.front().expect("non-empty").enqueued + delay;
                match self
                    .rx
                    .recv_timeout(due.saturating_duration_since(Instant::now()))
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
                    Msg::Job(j) => {
                        pending_rows += j.input.rows();
                        pending.push_back(j);
                    }
                    Msg::Done(w) => idle.push(w),
                    Msg::Close => closing = true,
                }
                next = self.rx.try_recv().ok();
            }
        }
        // Dropping the work senders ends the worker threads.
    }
}
