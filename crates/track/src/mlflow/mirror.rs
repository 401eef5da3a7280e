//! The MLflow run that mirrors one kiln run, and the parent run of a sweep.
//!
//! # Lifecycle
//!
//! - **Start** ([`Mirror::begin`], returns at once): a background sender thread reaps this
//!   host's stale runs ([`mark_stale_runs_killed`]), then creates the MLflow run with its
//!   tags — or, when the run directory already holds `mlflow.json` for the same tracking
//!   server (a `--resume`), sets that run back to `RUNNING` and continues it — writes the
//!   run's ids to `<run dir>/mlflow.json` ([`MirrorState`]) and sends the config as params.
//!   Training never waits for any of it: a server that accepts connections and never answers
//!   holds up the sender, not the run. ([`Mirror::start`] waits for the run to exist, for
//!   callers that want the error.) When the run cannot be created, one warning says why and
//!   nothing else is sent.
//! - **Each epoch** ([`Mirror::log_epoch`]): the epoch's metrics, with the wall-clock time the
//!   epoch ended, go into a bounded queue ([`MirrorOptions::queue_capacity`] requests) that
//!   the sender empties. Training never waits: when the queue is full the values are counted
//!   as not sent. A request that fails on the transport (connection refused, timeout) after
//!   its retries pauses the sender for 10 s: what arrives meanwhile is counted as not sent
//!   without being tried, so a dead server costs one timeout, not one per epoch. Every
//!   request has the client's connect and read timeouts ([`super::ClientOptions`]).
//! - **End** ([`Mirror::finish`]): the summary metrics, the dataset input, the artifacts
//!   (through the proxied artifact store), then — after everything before was tried — the
//!   final status, all within [`MirrorOptions::flush_timeout`] (default
//!   [`DEFAULT_FLUSH_TIMEOUT`], `KILN_MLFLOW_FLUSH_TIMEOUT` in seconds): then the sender is
//!   abandoned and what it had not sent is counted as not sent. The final status is kiln's
//!   (`FINISHED`, `FAILED`, `KILLED`), except that a run missing any metric value ends
//!   `FAILED`, so an MLflow run is never marked as if metrics arrived that did not; whenever
//!   anything is missing the run also gets the tag [`INCOMPLETE_TAG`] saying what (both on a
//!   best-effort basis: the server may refuse them too). What could not be sent is reported
//!   once, in one warning, and returned as a [`MirrorReport`].
//!
//! # What is logged
//!
//! | MLflow | kiln |
//! |---|---|
//! | params | the effective config, flattened ([`super::flatten`]) |
//! | metric `<stage>/train_loss`, `/val_loss`, `/lr`, `/grad_norm`, `/samples_per_s`, `/data_wait_frac` | each epoch; step = epochs of the earlier stages (as configured) + the epoch's index in its stage; non-finite values are skipped |
//! | metric `val_metric`, `param_count`, `latency_b1_p50_us`, `latency_b128_p50_us` | end of a finished run, step 0 |
//! | metric `test/<target>/<field>` (`mse_model`, `rmse_model`, `mae_model`, `r2_model`, `nll_model`, `crps_model`, `coverage_90`, `calibration_error`, `sharpness`, baselines); `validation/…` and, after recalibration, `test_before_calibration/…` | the evaluation tables, per target |
//! | tags `mlflow.runName` (kiln run id), `mlflow.source.type` (`LOCAL`), `mlflow.source.name` (`kiln train <config>`), `mlflow.source.git.commit`, `mlflow.user`, `mlflow.parentRunId` (sweep members) | at creation |
//! | tags `kiln.run_id`, `kiln.run_dir`, `kiln.config_sha256`, `kiln.host`, `kiln.pid`, `kiln.pid_start`, `kiln.git_dirty`, `kiln.failure_reason` | |
//! | tag `kiln.mirror_incomplete` | at the end, when anything did not reach the server: how many metric values, params/tags/inputs and artifact files, and the first error |
//! | dataset input | the data file: name, digest = first 32 hex digits of its SHA-256 (MLflow allows 36 characters; the full hash is in the profile), context `train` |
//! | artifacts | `config.yaml`, `epochs.jsonl`, `resources.{png,svg,csv}`, `calibration_<target>.{png,svg}` (the reliability diagram and PIT histogram), `export/…` (weights and manifest), `profile/…` (trace and key averages, when the profiler ran) |
//!
//! Artifacts need a server that proxies its artifact store (`mlflow server
//! --serve-artifacts`, the default since MLflow 2): the run's `artifact_uri` is
//! `mlflow-artifacts:/…`, and files are `PUT` to `/api/2.0/mlflow-artifacts/artifacts/…`.
//! With any other artifact store, artifacts are skipped with the end-of-run warning.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use percent_encoding::utf8_percent_encode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{
    Client, ClientOptions, MAX_ENTITIES_PER_BATCH, MAX_PARAM_VALUE, MAX_PARAMS_PER_BATCH,
    MAX_TAG_VALUE, MlflowError, QUERY_VALUE, escape_key, fit_name, flatten, now_ms, truncate_chars,
};
use crate::config::LoadedConfig;
use crate::records::{EpochRecord, RunDir, RunEnd, RunState};
use crate::util;

/// The file in a run directory that names its MLflow run.
pub const STATE_FILE: &str = "mlflow.json";
/// Set by `kiln sweep` for its members: the MLflow run id of the sweep's parent run.
pub const ENV_PARENT_RUN_ID: &str = "KILN_MLFLOW_PARENT_RUN_ID";
/// Default capacity of the sender's queue, in requests.
pub const DEFAULT_QUEUE_CAPACITY: usize = 256;
/// How long the sender stops trying after a transport failure.
const PAUSE_AFTER_TRANSPORT_FAILURE: Duration = Duration::from_secs(10);
/// Default bound on the end-of-run flush ([`MirrorOptions::flush_timeout`]).
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(20);
/// The environment variable that sets [`MirrorOptions::flush_timeout`], in seconds.
pub const FLUSH_TIMEOUT_ENV: &str = "KILN_MLFLOW_FLUSH_TIMEOUT";
/// The tag set on an MLflow run when something did not reach the server; its value says
/// what.
pub const INCOMPLETE_TAG: &str = "kiln.mirror_incomplete";

/// The MLflow run a kiln run is mirrored to, as stored in `<run dir>/mlflow.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MirrorState {
    /// The tracking server's base URL.
    pub tracking_uri: String,
    /// MLflow experiment id.
    pub experiment_id: String,
    /// MLflow run id.
    pub run_id: String,
    /// The run's artifact root as MLflow reports it.
    pub artifact_uri: String,
}

impl MirrorState {
    /// The state stored in run directory `dir`, when there is one.
    pub fn read(dir: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(dir.join(STATE_FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn write(&self, dir: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(self).expect("state serialises");
        util::write_atomic(&dir.join(STATE_FILE), &json)
    }
}

/// Where and how a run is mirrored.
#[derive(Debug, Clone, PartialEq)]
pub struct MirrorOptions {
    /// Experiment name (created when missing).
    pub experiment: String,
    /// Parent run (sweep members): sets the `mlflow.parentRunId` tag.
    pub parent_run_id: Option<String>,
    /// Requests the sender's queue holds; further epochs' metrics are counted as not sent.
    pub queue_capacity: usize,
    /// The most the end of the run waits for the server (summary metrics, artifacts, final
    /// status); what is not sent by then is abandoned and reported.
    pub flush_timeout: Duration,
}

impl MirrorOptions {
    /// `MLFLOW_EXPERIMENT_NAME` (default `kiln-<config name>`) and [`ENV_PARENT_RUN_ID`].
    pub fn from_env(loaded: &LoadedConfig) -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Self {
            experiment: var("MLFLOW_EXPERIMENT_NAME")
                .unwrap_or_else(|| format!("kiln-{}", loaded.config.name)),
            parent_run_id: var(ENV_PARENT_RUN_ID),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            flush_timeout: var(FLUSH_TIMEOUT_ENV).map_or(DEFAULT_FLUSH_TIMEOUT, |v| {
                flush_timeout(&v).unwrap_or_else(|e| {
                    tracing::warn!("{FLUSH_TIMEOUT_ENV}: {e}; using {DEFAULT_FLUSH_TIMEOUT:?}");
                    DEFAULT_FLUSH_TIMEOUT
                })
            }),
        }
    }
}

/// A flush timeout in seconds (a finite number, 0 to one hour).
pub(super) fn flush_timeout(v: &str) -> Result<Duration, String> {
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=3600.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!(
            "{v:?} is not a number of seconds between 0 and 3600"
        )),
    }
}

/// What a mirror sent and could not send, once the run ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MirrorReport {
    /// Metric values the server accepted.
    pub metrics_sent: u64,
    /// Metric values dropped (queue full) or refused.
    pub metrics_unsent: u64,
    /// Params, tags and dataset inputs that could not be sent.
    pub other_unsent: u64,
    /// Artifact files uploaded.
    pub artifacts_sent: u64,
    /// Artifact files that could not be uploaded.
    pub artifacts_unsent: u64,
    /// The final status sent (`FINISHED`, `FAILED`, `KILLED`), or `None` if that failed.
    pub status: Option<String>,
    /// The first failure, when anything could not be sent.
    pub first_error: Option<String>,
    /// Whether the end-of-run flush gave up at [`MirrorOptions::flush_timeout`].
    pub timed_out: bool,
}

impl MirrorReport {
    /// Whether everything reached the server.
    pub fn complete(&self) -> bool {
        self.complete_before_status() && self.status.is_some()
    }

    /// Whether every metric, param, tag, input and artifact reached the server.
    fn complete_before_status(&self) -> bool {
        self.metrics_unsent == 0 && self.other_unsent == 0 && self.artifacts_unsent == 0
    }
}

/// A unit of work for the sender thread.
enum Job {
    /// A JSON POST carrying `metrics` metric values and `other` params/tags/inputs; the
    /// sender sets the body's `run_id` (the MLflow run may not exist yet when it is queued).
    Post {
        path: &'static str,
        body: Value,
        metrics: u64,
        other: u64,
    },
    /// An artifact file.
    Upload { name: String, file: PathBuf },
    /// The final status, queued last: `status` is kiln's (`FINISHED`, `FAILED`, `KILLED`);
    /// the sender ends the MLflow run `FAILED` instead when metric values are missing.
    Status { status: &'static str },
}

impl Job {
    /// Count the job as offered (`sent == false`) or as accepted by the server.
    fn count(&self, c: &Counters, sent: bool) {
        let add = |a: &AtomicU64, n: u64| {
            a.fetch_add(n, Ordering::Relaxed);
        };
        match (self, sent) {
            (Job::Post { metrics, other, .. }, false) => {
                add(&c.metrics_total, *metrics);
                add(&c.other_total, *other);
            }
            (Job::Post { metrics, other, .. }, true) => {
                add(&c.metrics_sent, *metrics);
                add(&c.other_sent, *other);
            }
            (Job::Upload { .. }, false) => add(&c.artifacts_total, 1),
            (Job::Upload { .. }, true) => add(&c.artifacts_sent, 1),
            (Job::Status { .. }, _) => {}
        }
    }
}

/// What was offered to the sender and what the server accepted; what was offered and not
/// accepted (dropped on a full queue, refused, never tried before the flush timeout) is the
/// difference.
#[derive(Debug, Default)]
struct Counters {
    metrics_total: AtomicU64,
    metrics_sent: AtomicU64,
    other_total: AtomicU64,
    other_sent: AtomicU64,
    artifacts_total: AtomicU64,
    artifacts_sent: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// The final status the server accepted.
    status: Mutex<Option<String>>,
}

impl Counters {
    fn error(&self, e: String) {
        if let Ok(mut f) = self.first_error.lock()
            && f.is_none()
        {
            *f = Some(e);
        }
    }

    fn load(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    fn metrics_missing(&self) -> u64 {
        Self::load(&self.metrics_total).saturating_sub(Self::load(&self.metrics_sent))
    }

    fn report(&self) -> MirrorReport {
        let (mt, ms) = (
            Self::load(&self.metrics_total),
            Self::load(&self.metrics_sent),
        );
        let (at, as_) = (
            Self::load(&self.artifacts_total),
            Self::load(&self.artifacts_sent),
        );
        MirrorReport {
            metrics_sent: ms,
            metrics_unsent: mt.saturating_sub(ms),
            other_unsent: Self::load(&self.other_total)
                .saturating_sub(Self::load(&self.other_sent)),
            artifacts_sent: as_,
            artifacts_unsent: at.saturating_sub(as_),
            status: self.status.lock().ok().and_then(|s| s.clone()),
            first_error: self.first_error.lock().ok().and_then(|e| e.clone()),
            timed_out: false,
        }
    }
}

/// Where the MLflow run stands, as the sender thread sets it up.
enum Opened {
    /// The sender is still creating (or finding) the MLflow run.
    Pending,
    /// The run exists.
    Open { state: MirrorState, resumed: bool },
    /// It could not be created; the error (taken by the first waiter that wants it).
    Failed(Option<MlflowError>),
}

/// State shared by the mirror and its sender thread.
struct Shared {
    opened: Mutex<Opened>,
    changed: Condvar,
    /// Set when the end-of-run flush gave up: the sender stops trying what is left.
    abandoned: AtomicBool,
    counters: Counters,
}

impl Shared {
    fn set(&self, o: Opened) {
        if let Ok(mut g) = self.opened.lock() {
            *g = o;
        }
        self.changed.notify_all();
    }

    /// Wait until the run was opened (or failed to); `f` sees the outcome.
    fn wait<T>(&self, f: impl FnOnce(&mut Opened) -> T) -> T {
        let mut g = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        while matches!(*g, Opened::Pending) {
            g = self.changed.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        f(&mut g)
    }

    fn failed_to_open(&self) -> bool {
        self.opened
            .lock()
            .map(|g| matches!(*g, Opened::Failed(_)))
            .unwrap_or(false)
    }
}

/// What the sender needs to create (or continue) the MLflow run.
struct Opening {
    options: MirrorOptions,
    run: RunDir,
    loaded: LoadedConfig,
    /// When the mirror was begun: the MLflow run's start time, so that no epoch (stamped
    /// when it is logged, possibly before the sender thread has created the run) precedes it.
    started_ms: i64,
}

/// The sender thread's state.
struct Worker {
    client: Client,
    run_id: String,
    artifact_root: Option<String>,
    shared: Arc<Shared>,
    paused_until: Option<Instant>,
}

impl Worker {
    fn run(mut self, opening: Opening, rx: Receiver<Job>, _done: mpsc::Sender<()>) {
        match open(
            &self.client,
            &opening.options,
            &opening.run,
            &opening.loaded,
            opening.started_ms,
        ) {
            Ok((state, resumed)) => {
                self.run_id = state.run_id.clone();
                self.artifact_root = proxied_root(&state.artifact_uri);
                self.shared.set(Opened::Open { state, resumed });
                for job in param_jobs(&opening.loaded) {
                    job.count(&self.shared.counters, false);
                    self.handle(job);
                }
            }
            Err(e) => {
                tracing::warn!("MLflow mirror disabled: {e}");
                self.shared.counters.error(e.to_string());
                self.shared.set(Opened::Failed(Some(e)));
                // Nothing can be sent: what is queued stays counted as not sent.
                for _ in rx {}
                return;
            }
        }
        for job in rx {
            if self.shared.abandoned.load(Ordering::Relaxed) {
                continue;
            }
            self.handle(job);
        }
    }

    fn handle(&mut self, job: Job) {
        if let Job::Status { status } = job {
            self.finish(status);
            return;
        }
        if self.paused_until.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let result = match &job {
            Job::Post { path, body, .. } => {
                let mut body = body.clone();
                body["run_id"] = json!(self.run_id);
                self.client.post(path, &body).map(|_| ())
            }
            Job::Upload { name, file } => self.upload(name, file),
            Job::Status { .. } => unreachable!("handled above"),
        };
        match result {
            Ok(()) => job.count(&self.shared.counters, true),
            Err(e) => {
                if matches!(e, MlflowError::Transport { .. }) {
                    self.paused_until = Some(Instant::now() + PAUSE_AFTER_TRANSPORT_FAILURE);
                }
                self.shared.counters.error(e.to_string());
            }
        }
    }

    /// End the MLflow run (everything before was tried). Missing metric values end it
    /// `FAILED` whatever kiln's status, with the tag [`INCOMPLETE_TAG`] saying what is
    /// missing (the tag is tried even if the values were not: the update that sets the
    /// status may still get through); other missing items only add the tag.
    fn finish(&mut self, status: &'static str) {
        let c = &self.shared.counters;
        let r = c.report();
        let missing_metrics = c.metrics_missing();
        let status = if missing_metrics > 0 {
            "FAILED"
        } else {
            status
        };
        if !r.complete_before_status() {
            let what = format!(
                "{} of {} metric values, {} params/tags/inputs and {} of {} artifact files did \
                 not reach MLflow (first error: {}); the kiln run directory has everything",
                r.metrics_unsent,
                r.metrics_unsent + r.metrics_sent,
                r.other_unsent,
                r.artifacts_unsent,
                r.artifacts_unsent + r.artifacts_sent,
                r.first_error.as_deref().unwrap_or("none")
            );
            let body = json!({
                "run_id": self.run_id,
                "params": [],
                "metrics": [],
                "tags": [tag(INCOMPLETE_TAG, &what)],
            });
            if let Err(e) = self.client.post("/api/2.0/mlflow/runs/log-batch", &body) {
                tracing::debug!("MLflow: tagging the run incomplete: {e}");
            }
        }
        match set_status(&self.client, &self.run_id, status) {
            Ok(()) => {
                if let Ok(mut s) = c.status.lock() {
                    *s = Some(status.to_string());
                }
            }
            Err(e) => c.error(e.to_string()),
        }
    }

    fn upload(&self, name: &str, file: &Path) -> Result<(), MlflowError> {
        let Some(root) = &self.artifact_root else {
            return Err(MlflowError::Artifact {
                name: name.to_string(),
                problem: "the server does not proxy its artifact store (the run's artifact_uri \
                          is not mlflow-artifacts:/…); start it with --serve-artifacts"
                    .into(),
            });
        };
        let bytes = std::fs::read(file).map_err(|e| MlflowError::Artifact {
            name: name.to_string(),
            problem: format!("cannot read {}: {e}", file.display()),
        })?;
        let path = format!("{root}/{}", encode_path(name));
        self.client
            .request_raw_ok("PUT", &path, ("application/octet-stream", &bytes))
            .map(|_| ())
    }
}

/// Percent-encode each `/`-separated segment of an artifact path.
fn encode_path(name: &str) -> String {
    name.split('/')
        .map(|s| utf8_percent_encode(s, QUERY_VALUE).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

/// The REST path under which a proxied artifact root (`mlflow-artifacts:/1/<run>/artifacts`,
/// possibly with an authority) accepts files; `None` for any other artifact store.
fn proxied_root(artifact_uri: &str) -> Option<String> {
    let rest = artifact_uri.strip_prefix("mlflow-artifacts:")?;
    let path = match rest.strip_prefix("//") {
        Some(r) => &r[r.find('/')?..],
        None => rest,
    };
    Some(format!(
        "/api/2.0/mlflow-artifacts/artifacts/{}",
        path.trim_matches('/')
    ))
}

/// The background sender: a bounded queue and the thread that creates the MLflow run and
/// then empties the queue.
struct Sender {
    tx: Mutex<Option<SyncSender<Job>>>,
    /// Disconnected once the thread has ended.
    done: Mutex<Option<Receiver<()>>>,
    shared: Arc<Shared>,
}

impl Sender {
    fn spawn(client: Client, opening: Opening, capacity: usize) -> Self {
        let shared = Arc::new(Shared {
            opened: Mutex::new(Opened::Pending),
            changed: Condvar::new(),
            abandoned: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let (tx, rx) = mpsc::sync_channel(capacity.max(1));
        let (done_tx, done_rx) = mpsc::channel();
        let worker = Worker {
            client,
            run_id: String::new(),
            artifact_root: None,
            shared: Arc::clone(&shared),
            paused_until: None,
        };
        let spawned = std::thread::Builder::new()
            .name("kiln-mlflow".into())
            .spawn(move || worker.run(opening, rx, done_tx));
        if let Err(e) = spawned {
            let e = MlflowError::Artifact {
                name: "(sender thread)".into(),
                problem: format!("cannot start the sender thread: {e}"),
            };
            shared.counters.error(e.to_string());
            shared.set(Opened::Failed(Some(e)));
        }
        Self {
            tx: Mutex::new(Some(tx)),
            done: Mutex::new(Some(done_rx)),
            shared,
        }
    }

    /// Queue without waiting; a full queue (or a stopped sender) leaves the job not sent.
    fn offer(&self, job: Job) {
        job.count(&self.shared.counters, false);
        let tx = self.tx.lock().ok().and_then(|t| t.clone());
        let Some(tx) = tx else { return };
        if let Err(TrySendError::Full(_)) = tx.try_send(job) {
            self.shared
                .counters
                .error("the sender's queue was full (the server is slower than training)".into());
        }
    }

    /// Queue, waiting for room until `deadline` (only after training, at the end of the
    /// run); past it the job stays not sent.
    fn push_until(&self, job: Job, deadline: Instant) {
        job.count(&self.shared.counters, false);
        let tx = self.tx.lock().ok().and_then(|t| t.clone());
        let Some(tx) = tx else { return };
        let mut job = job;
        loop {
            match tx.try_send(job) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => return,
                Err(TrySendError::Full(j)) => {
                    if Instant::now() >= deadline {
                        return;
                    }
                    job = j;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    /// Close the queue and wait until everything queued was tried, or until `deadline`:
    /// then the sender is told to stop and left behind. Returns whether it finished.
    fn drain_until(&self, deadline: Instant) -> bool {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let Some(done) = self.done.lock().ok().and_then(|mut d| d.take()) else {
            return true;
        };
        let wait = deadline.saturating_duration_since(Instant::now());
        match done.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {
                self.shared.abandoned.store(true, Ordering::Relaxed);
                false
            }
            _ => true,
        }
    }
}

/// Metric entries for MLflow.
fn metric(key: &str, value: f64, timestamp: i64, step: usize) -> Value {
    json!({"key": fit_name(key), "value": value, "timestamp": timestamp, "step": step})
}

fn tag(key: &str, value: &str) -> Value {
    json!({"key": key, "value": truncate_chars(value, MAX_TAG_VALUE)})
}

/// Split params, metrics and tags into runs/log-batch jobs within MLflow's limits (100 params
/// and 1,000 entries in all per request).
fn batches(run_id: &str, params: Vec<Value>, metrics: Vec<Value>, tags: Vec<Value>) -> Vec<Job> {
    let mut jobs = Vec::new();
    for chunk in params.chunks(MAX_PARAMS_PER_BATCH) {
        jobs.push(Job::Post {
            path: "/api/2.0/mlflow/runs/log-batch",
            body: json!({"run_id": run_id, "params": chunk, "metrics": [], "tags": []}),
            metrics: 0,
            other: chunk.len() as u64,
        });
    }
    for chunk in tags.chunks(MAX_PARAMS_PER_BATCH) {
        jobs.push(Job::Post {
            path: "/api/2.0/mlflow/runs/log-batch",
            body: json!({"run_id": run_id, "params": [], "metrics": [], "tags": chunk}),
            metrics: 0,
            other: chunk.len() as u64,
        });
    }
    for chunk in metrics.chunks(MAX_ENTITIES_PER_BATCH) {
        jobs.push(Job::Post {
            path: "/api/2.0/mlflow/runs/log-batch",
            body: json!({"run_id": run_id, "params": [], "metrics": chunk, "tags": []}),
            metrics: chunk.len() as u64,
            other: 0,
        });
    }
    jobs
}

/// `$USER` (or `$LOGNAME`), else the name of this process's uid in `/etc/passwd`, as
/// MLflow's own client reports it.
fn user() -> String {
    if let Some(u) = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
    {
        return u;
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() }.to_string();
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|p| {
            p.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 2 && f[2] == uid).then(|| f[0].to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The tags every kiln-created run (member or sweep parent) carries.
fn source_tags(source_name: &str) -> Vec<Value> {
    let pid = std::process::id();
    let mut tags = vec![
        tag("mlflow.source.type", "LOCAL"),
        tag("mlflow.source.name", source_name),
        tag("mlflow.user", &user()),
        tag("kiln.host", &crate::util::hostname()),
        tag("kiln.pid", &pid.to_string()),
        tag(
            "kiln.pid_start",
            &crate::util::process_start(pid)
                .map(|s| s.to_string())
                .unwrap_or_default(),
        ),
    ];
    if let Some(crate::util::GitCommit { commit, dirty }) = crate::util::git_commit() {
        tags.push(tag("mlflow.source.git.commit", &commit));
        tags.push(tag("kiln.git_dirty", if dirty { "true" } else { "false" }));
    }
    tags
}

/// Create a run in `experiment_id`; returns its state.
fn create_run(
    client: &Client,
    experiment_id: &str,
    run_name: &str,
    tags: Vec<Value>,
    start_time_ms: i64,
) -> Result<MirrorState, MlflowError> {
    let create = "/api/2.0/mlflow/runs/create";
    let created = client.post(
        create,
        &json!({
            "experiment_id": experiment_id,
            "start_time": start_time_ms,
            "run_name": run_name,
            "user_id": user(),
            "tags": tags,
        }),
    )?;
    let run_id = client.field(
        &created,
        "/run/info/run_id",
        "run.info.run_id",
        "POST",
        create,
    )?;
    let artifact_uri = created["run"]["info"]["artifact_uri"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok(MirrorState {
        tracking_uri: client.base_url().to_string(),
        experiment_id: experiment_id.to_string(),
        run_id,
        artifact_uri,
    })
}

fn set_status(client: &Client, run_id: &str, status: &str) -> Result<(), MlflowError> {
    let mut body = json!({"run_id": run_id, "status": status});
    if status != "RUNNING" {
        body["end_time"] = json!(now_ms());
    }
    client
        .post("/api/2.0/mlflow/runs/update", &body)
        .map(|_| ())
}

/// Mark this host's `RUNNING` kiln runs in `experiment_id` whose process is gone (the
/// `kiln.host`, `kiln.pid` and `kiln.pid_start` tags) as `KILLED`, as the run registry does
/// with its own rows. Returns how many were marked.
pub fn mark_stale_runs_killed(client: &Client, experiment_id: &str) -> Result<usize, MlflowError> {
    let host = crate::util::hostname();
    let search = "/api/2.0/mlflow/runs/search";
    let found = client.post(
        search,
        &json!({
            "experiment_ids": [experiment_id],
            "filter": "attributes.status = 'RUNNING'",
            "max_results": 1000,
        }),
    )?;
    let mut marked = 0;
    for run in found["runs"].as_array().into_iter().flatten() {
        let tags: std::collections::HashMap<&str, &str> = run["data"]["tags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["key"].as_str()?, t["value"].as_str()?)))
            .collect();
        let (Some(&h), Some(pid)) = (
            tags.get("kiln.host"),
            tags.get("kiln.pid").and_then(|p| p.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if h != host {
            continue;
        }
        let start = tags
            .get("kiln.pid_start")
            .and_then(|s| s.parse::<i64>().ok());
        let alive = crate::util::process_alive(i64::from(pid), start);
        let Some(run_id) = run["info"]["run_id"].as_str() else {
            continue;
        };
        if !alive {
            client.post(
                "/api/2.0/mlflow/runs/log-batch",
                &json!({"run_id": run_id, "tags": [tag(
                    "kiln.failure_reason",
                    &format!("process {pid} on {host} disappeared without finishing"),
                )]}),
            )?;
            set_status(client, run_id, "KILLED")?;
            marked += 1;
        }
    }
    Ok(marked)
}

/// Create the MLflow run (or continue the one named by `<run dir>/mlflow.json` on the same
/// server) and store its ids in the run directory; returns the state and whether it was
/// continued. Runs on the sender thread.
fn open(
    client: &Client,
    options: &MirrorOptions,
    run: &RunDir,
    loaded: &LoadedConfig,
    started_ms: i64,
) -> Result<(MirrorState, bool), MlflowError> {
    let experiment_id = client.experiment_id(&options.experiment)?;
    match mark_stale_runs_killed(client, &experiment_id) {
        Ok(0) => {}
        Ok(n) => tracing::info!("MLflow: marked {n} stale running run(s) as KILLED"),
        Err(e) => tracing::debug!("MLflow: looking for stale runs: {e}"),
    }
    let previous = MirrorState::read(&run.path)
        .filter(|s| s.tracking_uri == client.base_url() && s.experiment_id == experiment_id);
    let continued = match previous {
        Some(s) => {
            let get = format!(
                "/api/2.0/mlflow/runs/get?run_id={}",
                utf8_percent_encode(&s.run_id, QUERY_VALUE)
            );
            match client.call("GET", &get, None)? {
                (200, v) if v["run"]["info"]["lifecycle_stage"] == "active" => {
                    set_status(client, &s.run_id, "RUNNING")?;
                    // Refresh the process tags so the reaper sees the live process.
                    let tags: Vec<Value> = source_tags(&source_name(loaded))
                        .into_iter()
                        .filter(|t| t["key"].as_str().is_some_and(|k| k.starts_with("kiln.pid")))
                        .collect();
                    client.post(
                        "/api/2.0/mlflow/runs/log-batch",
                        &json!({"run_id": s.run_id, "tags": tags}),
                    )?;
                    Some(s)
                }
                _ => {
                    tracing::warn!(
                        "MLflow run {} of {} is gone; mirroring the resumed run into a new one",
                        s.run_id,
                        run.path.join(STATE_FILE).display()
                    );
                    None
                }
            }
        }
        None => None,
    };
    let resumed = continued.is_some();
    let state = match continued {
        Some(s) => s,
        None => {
            let mut tags = source_tags(&source_name(loaded));
            tags.push(tag("kiln.run_id", &run.id));
            tags.push(tag("kiln.run_dir", &run.path.display().to_string()));
            tags.push(tag(
                "kiln.config_sha256",
                &crate::util::sha256_hex(loaded.text.as_bytes()),
            ));
            if let Some(p) = &options.parent_run_id {
                tags.push(tag("mlflow.parentRunId", p));
            }
            create_run(client, &experiment_id, &run.id, tags, started_ms)?
        }
    };
    if let Err(e) = state.write(&run.path) {
        tracing::warn!(
            "MLflow: cannot record the run id in {}: {e} (a --resume will start a new MLflow run)",
            run.path.join(STATE_FILE).display()
        );
    }
    Ok((state, resumed))
}

/// The config as params, in runs/log-batch jobs (no run id yet).
fn param_jobs(loaded: &LoadedConfig) -> Vec<Job> {
    let value = match serde_json::to_value(&loaded.config) {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!("MLflow: the config as params: {e}");
            return Vec::new();
        }
    };
    let mut params = Vec::new();
    flatten("", &value, &mut params);
    let params: Vec<Value> = params
        .iter()
        .map(|(k, v)| json!({"key": k, "value": truncate_chars(v, MAX_PARAM_VALUE)}))
        .collect();
    batches("", params, Vec::new(), Vec::new())
}

/// An MLflow run mirroring a kiln run; see the module docs.
pub struct Mirror {
    step_offsets: Vec<usize>,
    data_path: PathBuf,
    profile_dir: PathBuf,
    flush_timeout: Duration,
    sender: Sender,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("state", &self.state_now())
            .finish_non_exhaustive()
    }
}

impl Mirror {
    /// Start mirroring when `MLFLOW_TRACKING_URI` is set, with [`ClientOptions::from_env`] and
    /// [`MirrorOptions::from_env`] ([`Mirror::begin`]: never waits for the server); `None`
    /// (after one warning) when the variables cannot be used.
    pub fn from_env(run: &RunDir, loaded: &LoadedConfig) -> Option<Self> {
        let uri = std::env::var("MLFLOW_TRACKING_URI")
            .ok()
            .filter(|u| !u.is_empty())?;
        match ClientOptions::from_env().and_then(|options| Client::with_options(&uri, &options)) {
            Ok(client) => Some(Self::begin(
                client,
                &MirrorOptions::from_env(loaded),
                run,
                loaded,
            )),
            Err(e) => {
                tracing::warn!("MLflow mirror disabled: {e}");
                None
            }
        }
    }

    /// Start the sender thread, which creates the MLflow run (or continues the one named by
    /// `<run dir>/mlflow.json` on the same server), stores its ids in the run directory and
    /// sends the config as params, then the queued metrics. Returns at once: the caller
    /// (training) never waits for the server. When the run cannot be created, one warning
    /// says why and nothing is sent.
    pub fn begin(
        client: Client,
        options: &MirrorOptions,
        run: &RunDir,
        loaded: &LoadedConfig,
    ) -> Self {
        let c = &loaded.config;
        let mut step_offsets = Vec::with_capacity(c.stages.len());
        let mut sum = 0;
        for s in &c.stages {
            step_offsets.push(sum);
            sum += s.epochs;
        }
        let profile_dir = if c.profile.out_dir.is_absolute() {
            c.profile.out_dir.clone()
        } else {
            run.path.join(&c.profile.out_dir)
        };
        let opening = Opening {
            options: options.clone(),
            run: run.clone(),
            loaded: loaded.clone(),
            started_ms: now_ms(),
        };
        Self {
            sender: Sender::spawn(client, opening, options.queue_capacity),
            step_offsets,
            data_path: c.data.path.clone(),
            profile_dir,
            flush_timeout: options.flush_timeout,
        }
    }

    /// [`Mirror::begin`], then wait until the MLflow run exists; its error when it cannot
    /// be created.
    pub fn start(
        client: Client,
        options: &MirrorOptions,
        run: &RunDir,
        loaded: &LoadedConfig,
    ) -> Result<Self, MlflowError> {
        let m = Self::begin(client, options, run, loaded);
        let failed = m.sender.shared.wait(|o| match o {
            Opened::Failed(e) => Some(e.take().unwrap_or_else(|| MlflowError::Artifact {
                name: "(run)".into(),
                problem: "the MLflow run could not be created".into(),
            })),
            _ => None,
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(m),
        }
    }

    /// The MLflow run, once the sender created it (waits for that); `None` when it could
    /// not be created.
    pub fn state(&self) -> Option<MirrorState> {
        self.sender.shared.wait(|o| match o {
            Opened::Open { state, .. } => Some(state.clone()),
            _ => None,
        })
    }

    /// The MLflow run if it exists already; never waits.
    pub fn state_now(&self) -> Option<MirrorState> {
        match &*self.sender.shared.opened.lock().ok()? {
            Opened::Open { state, .. } => Some(state.clone()),
            _ => None,
        }
    }

    /// MLflow's run id (waits like [`Mirror::state`]).
    pub fn run_id(&self) -> Option<String> {
        self.state().map(|s| s.run_id)
    }

    /// Whether this mirror continues an MLflow run started by an earlier process (waits
    /// like [`Mirror::state`]).
    pub fn resumed(&self) -> bool {
        self.sender
            .shared
            .wait(|o| matches!(o, Opened::Open { resumed: true, .. }))
    }

    /// The step an epoch is logged at: the configured epochs of the earlier stages plus the
    /// epoch's index in its stage.
    pub fn step(&self, record: &EpochRecord) -> usize {
        self.step_offsets.get(record.stage).copied().unwrap_or(0) + record.epoch
    }

    /// Queue an epoch's metrics, stamped now; never waits.
    pub fn log_epoch(&self, record: &EpochRecord) {
        let ts = now_ms();
        let step = self.step(record);
        let s = escape_key(&record.stage_name);
        let metrics: Vec<Value> = [
            ("train_loss", record.train_loss),
            ("val_loss", record.val_loss),
            ("lr", record.lr),
            ("grad_norm", record.grad_norm_mean),
            ("samples_per_s", record.samples_per_s),
            ("data_wait_frac", record.data_wait_frac),
        ]
        .into_iter()
        .filter(|(_, v)| v.is_finite())
        .map(|(k, v)| metric(&format!("{s}/{k}"), v, ts, step))
        .collect();
        for job in batches("", Vec::new(), metrics, Vec::new()) {
            self.sender.offer(job);
        }
    }

    /// Send the end-of-run metrics, the dataset input and the artifacts, wait for the sender,
    /// then set the final status — all within [`MirrorOptions::flush_timeout`], after which
    /// what is left is abandoned. Never fails: what could not be sent is reported once (a
    /// warning) and in the returned report. Missing metric values end the MLflow run `FAILED`
    /// (see the module docs).
    pub fn finish(&self, run: &RunDir, end: &RunEnd) -> MirrorReport {
        let deadline = Instant::now() + self.flush_timeout;
        let ts = now_ms();
        let mut metrics = Vec::new();
        for (k, v) in [
            ("val_metric", end.val_metric),
            ("latency_b1_p50_us", end.latency_b1_p50_us),
            ("latency_b128_p50_us", end.latency_b128_p50_us),
            ("param_count", end.param_count.map(|p| p as f64)),
        ] {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                metrics.push(metric(k, v, ts, 0));
            }
        }
        // Per target and split: point errors, proper scores, coverage, calibration, sharpness.
        if let Some(m) = &end.final_metrics {
            let splits = [
                ("test", &m.test),
                ("validation", &m.validation),
                ("test_before_calibration", &m.test_before_calibration),
            ];
            for (split, report) in splits {
                for t in report.iter().flat_map(|r| &r.targets) {
                    // Every numeric field of the target's row (a field added to the report is
                    // mirrored without a change here).
                    let row = serde_json::to_value(t).expect("a target report serialises");
                    for (field, v) in row.as_object().into_iter().flatten() {
                        if let Some(v) = v.as_f64().filter(|v| v.is_finite()) {
                            metrics.push(metric(
                                &format!("{split}/{}/{}", escape_key(&t.target), escape_key(field)),
                                v,
                                ts,
                                0,
                            ));
                        }
                    }
                }
            }
        }
        let mut tags = Vec::new();
        if let Some(reason) = &end.reason {
            tags.push(tag("kiln.failure_reason", reason));
        }
        for job in batches("", Vec::new(), metrics, tags) {
            self.sender.push_until(job, deadline);
        }
        if let Some(sha) = &end.dataset_sha256 {
            let name = self
                .data_path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "dataset".into());
            let source =
                std::fs::canonicalize(&self.data_path).unwrap_or_else(|_| self.data_path.clone());
            self.sender.push_until(
                Job::Post {
                    path: "/api/2.0/mlflow/runs/log-inputs",
                    body: json!({
                        "datasets": [{
                            "tags": [{"key": "mlflow.data.context", "value": "train"}],
                            "dataset": {
                                "name": name,
                                "digest": &sha[..sha.len().min(32)],
                                "source_type": "local",
                                "source": json!({"uri": source.display().to_string()}).to_string(),
                                "profile": json!({"sha256": sha}).to_string(),
                            },
                        }],
                    }),
                    metrics: 0,
                    other: 1,
                },
                deadline,
            );
        }
        for (name, file) in artifact_files(&run.path, &self.profile_dir) {
            self.sender.push_until(Job::Upload { name, file }, deadline);
        }
        let status = match end.status {
            RunState::Finished => "FINISHED",
            RunState::Killed => "KILLED",
            RunState::Running | RunState::Failed => "FAILED",
        };
        self.sender.push_until(Job::Status { status }, deadline);
        let drained = self.sender.drain_until(deadline);
        let mut report = self.sender.shared.counters.report();
        report.timed_out = !drained;
        if report.timed_out && report.first_error.is_none() {
            report.first_error = Some(format!(
                "the server did not answer within the flush timeout ({:?})",
                self.flush_timeout
            ));
        }
        // A run that could not be created was reported when that failed.
        if !report.complete() && !self.sender.shared.failed_to_open() {
            let run_id = self
                .state_now()
                .map_or_else(|| "not created".to_string(), |s| s.run_id);
            let mut notes = String::new();
            if report.timed_out {
                notes.push_str(&format!(
                    "; gave up waiting for the server after {:?} ({FLUSH_TIMEOUT_ENV})",
                    self.flush_timeout
                ));
            }
            match report.status.as_deref() {
                None => notes.push_str(&format!("; the final status {status} was not set")),
                Some(s) if s != status => notes.push_str(&format!(
                    "; the MLflow run is marked {s} (not {status}) because metric values are \
                     missing (tag {INCOMPLETE_TAG})"
                )),
                Some(_) => {}
            }
            tracing::warn!(
                "MLflow mirror of run {} ({run_id}): {} of {} metric values, {} params/tags/inputs \
                 and {} of {} artifact files were not uploaded{notes}; first error: {}",
                run.id,
                report.metrics_unsent,
                report.metrics_unsent + report.metrics_sent,
                report.other_unsent,
                report.artifacts_unsent,
                report.artifacts_unsent + report.artifacts_sent,
                report.first_error.as_deref().unwrap_or("(none)")
            );
        }
        report
    }
}

fn source_name(loaded: &LoadedConfig) -> String {
    format!("kiln train {}", loaded.path.display())
}

/// The artifact files of a run, as (artifact path, file): `config.yaml`, `epochs.jsonl`,
/// `resources.{png,svg,csv}`, the calibration pictures `calibration_<target>.{png,svg}`,
/// everything under `export/` and under the profiler's directory (as `profile/…`), when
/// present.
pub fn artifact_files(run_dir: &Path, profile_dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for name in [
        "config.yaml",
        "epochs.jsonl",
        "resources.png",
        "resources.svg",
        "resources.csv",
    ] {
        let p = run_dir.join(name);
        if p.is_file() {
            out.push((name.to_string(), p));
        }
    }
    // The calibration pictures (`calibration_<target>.{png,svg}`, written at the end of
    // training beside the run's other files).
    let mut pictures: Vec<(String, PathBuf)> = std::fs::read_dir(run_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let picture = name.starts_with("calibration_")
                && (name.ends_with(".png") || name.ends_with(".svg"));
            (picture && e.path().is_file()).then(|| (name, e.path()))
        })
        .collect();
    pictures.sort();
    out.extend(pictures);
    walk(&run_dir.join("export"), "export", &mut out);
    walk(profile_dir, "profile", &mut out);
    out
}

/// Every file under `dir`, named `prefix/<relative path>`, in sorted order.
fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let Some(name) = p.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let rel = format!("{prefix}/{name}");
        if p.is_dir() {
            walk(&p, &rel, out);
        } else if p.is_file() {
            out.push((rel, p));
        }
    }
}

/// The parent run of a `kiln sweep`: its members are created as its children (the
/// `mlflow.parentRunId` tag, through [`ENV_PARENT_RUN_ID`]) in the same experiment.
#[derive(Debug)]
pub struct SweepParent {
    client: Client,
    /// The experiment name.
    pub experiment: String,
    /// The parent's state.
    pub state: MirrorState,
}

impl SweepParent {
    /// Create the parent run when `MLFLOW_TRACKING_URI` is set (experiment:
    /// `MLFLOW_EXPERIMENT_NAME`, default `kiln-<base config name>`); `None` (after a warning)
    /// on any failure.
    pub fn from_env(sweep_file: &Path, spec: &Value, base: &LoadedConfig) -> Option<Self> {
        let uri = std::env::var("MLFLOW_TRACKING_URI")
            .ok()
            .filter(|u| !u.is_empty())?;
        let experiment = MirrorOptions::from_env(base).experiment;
        let started = ClientOptions::from_env()
            .and_then(|o| Client::with_options(&uri, &o))
            .and_then(|client| Self::start(client, &experiment, sweep_file, spec));
        match started {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!("MLflow mirror of the sweep disabled: {e}");
                None
            }
        }
    }

    /// Create the parent run: the sweep file as params (flattened) and as the artifact
    /// `sweep.yaml`.
    pub fn start(
        client: Client,
        experiment: &str,
        sweep_file: &Path,
        spec: &Value,
    ) -> Result<Self, MlflowError> {
        let experiment_id = client.experiment_id(experiment)?;
        let stem = sweep_file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sweep".into());
        let name = format!("sweep-{stem}-{}", util::compact_stamp(util::unix_now()));
        let mut tags = source_tags(&format!("kiln sweep {}", sweep_file.display()));
        tags.push(tag("kiln.sweep_file", &sweep_file.display().to_string()));
        let state = create_run(&client, &experiment_id, &name, tags, now_ms())?;
        let mut params = Vec::new();
        flatten("", spec, &mut params);
        let params: Vec<Value> = params
            .iter()
            .map(|(k, v)| json!({"key": k, "value": truncate_chars(v, MAX_PARAM_VALUE)}))
            .collect();
        for chunk in params.chunks(MAX_PARAMS_PER_BATCH) {
            client.post(
                "/api/2.0/mlflow/runs/log-batch",
                &json!({"run_id": state.run_id, "params": chunk}),
            )?;
        }
        if let (Some(root), Ok(bytes)) =
            (proxied_root(&state.artifact_uri), std::fs::read(sweep_file))
        {
            client.request_raw_ok(
                "PUT",
                &format!("{root}/sweep.yaml"),
                ("application/octet-stream", &bytes),
            )?;
        }
        Ok(Self {
            client,
            experiment: experiment.to_string(),
            state,
        })
    }

    /// The environment of each member's `kiln train`: the parent run id and the experiment.
    pub fn child_env(&self) -> Vec<(String, String)> {
        vec![
            (ENV_PARENT_RUN_ID.to_string(), self.state.run_id.clone()),
            (
                "MLFLOW_EXPERIMENT_NAME".to_string(),
                self.experiment.clone(),
            ),
        ]
    }

    /// Log the sweep's summary (`members`, `failed`, `best_val_metric`) and end the parent
    /// run: `FINISHED` when every member finished, else `FAILED`. Never fails (one warning).
    pub fn finish(&self, members: usize, failed: usize, best_val_metric: Option<f64>) {
        let ts = now_ms();
        let mut metrics = vec![
            metric("members", members as f64, ts, 0),
            metric("failed", failed as f64, ts, 0),
        ];
        if let Some(v) = best_val_metric.filter(|v| v.is_finite()) {
            metrics.push(metric("best_val_metric", v, ts, 0));
        }
        let status = if failed == 0 { "FINISHED" } else { "FAILED" };
        let result = self
            .client
            .post(
                "/api/2.0/mlflow/runs/log-batch",
                &json!({"run_id": self.state.run_id, "metrics": metrics}),
            )
            .and_then(|_| set_status(&self.client, &self.state.run_id, status));
        if let Err(e) = result {
            tracing::warn!(
                "MLflow mirror of the sweep (parent run {}): {e}",
                self.state.run_id
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxied_artifact_roots_become_rest_paths() {
        assert_eq!(
            proxied_root("mlflow-artifacts:/1/abc/artifacts").as_deref(),
            Some("/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts")
        );
        assert_eq!(
            proxied_root("mlflow-artifacts://host:5000/1/abc/artifacts").as_deref(),
            Some("/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts")
        );
        assert_eq!(proxied_root("/tmp/mlruns/1/abc/artifacts"), None);
        assert_eq!(proxied_root("s3://bucket/1/abc"), None);
        assert_eq!(encode_path("export/a b/é.json"), "export/a%20b/%C3%A9.json");
    }

    #[test]
    fn batches_stay_within_mlflows_limits() {
        let params: Vec<Value> = (0..250)
            .map(|i| json!({"key": format!("p{i}"), "value": "1"}))
            .collect();
        let metrics: Vec<Value> = (0..2500).map(|i| metric("m", 1.0, 1, i)).collect();
        let jobs = batches("r", params, metrics, vec![tag("t", "v")]);
        let mut sizes = Vec::new();
        for j in &jobs {
            let Job::Post { body, .. } = j else { panic!() };
            let n = |k: &str| body[k].as_array().map_or(0, Vec::len);
            assert!(n("params") <= MAX_PARAMS_PER_BATCH && n("tags") <= MAX_PARAMS_PER_BATCH);
            assert!(n("params") + n("metrics") + n("tags") <= MAX_ENTITIES_PER_BATCH);
            sizes.push((n("params"), n("metrics"), n("tags")));
        }
        assert_eq!(
            sizes,
            vec![
                (100, 0, 0),
                (100, 0, 0),
                (50, 0, 0),
                (0, 0, 1),
                (0, 1000, 0),
                (0, 1000, 0),
                (0, 500, 0)
            ]
        );
    }

    #[test]
    fn artifact_files_cover_the_run_directory() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for f in [
            "config.yaml",
            "epochs.jsonl",
            "resources.png",
            "steps.csv",
            "calibration_hr_rate.svg",
            "calibration_hr_rate.png",
            "calibration_notes.txt",
        ] {
            std::fs::write(p.join(f), f).unwrap();
        }
        std::fs::create_dir_all(p.join("export/sub")).unwrap();
        std::fs::write(p.join("export/manifest.json"), "{}").unwrap();
        std::fs::write(p.join("export/sub/w.bin"), "w").unwrap();
        std::fs::create_dir_all(p.join("profile")).unwrap();
        std::fs::write(p.join("profile/trace.json"), "[]").unwrap();
        let names: Vec<String> = artifact_files(p, &p.join("profile"))
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names,
            [
                "config.yaml",
                "epochs.jsonl",
                "resources.png",
                "calibration_hr_rate.png",
                "calibration_hr_rate.svg",
                "export/manifest.json",
                "export/sub/w.bin",
                "profile/trace.json"
            ]
        );
    }
}
