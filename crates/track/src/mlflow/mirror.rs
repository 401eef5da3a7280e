//! The MLflow run that mirrors one kiln run, and the parent run of a sweep.
//!
//! # Lifecycle
//!
//! - **Start** ([`Mirror::start`], synchronous, before the first epoch): reap this host's
//!   stale runs ([`mark_stale_runs_killed`]), then create the MLflow run with its tags — or,
//!   when the run directory already holds `mlflow.json` for the same tracking server (a
//!   `--resume`), set that run back to `RUNNING` and continue it. The run's ids are written
//!   to `<run dir>/mlflow.json` ([`MirrorState`]). The config goes out as params.
//! - **Each epoch** ([`Mirror::log_epoch`]): the epoch's metrics, with the wall-clock time the
//!   epoch ended, go into a bounded queue ([`MirrorOptions::queue_capacity`] requests) that a
//!   background sender thread empties. Training never waits: when the queue is full the
//!   values are counted as not sent. A request that fails on the transport (connection
//!   refused, timeout) after its retries pauses the sender for 10 s: what arrives meanwhile
//!   is counted as not sent without being tried, so a dead server costs one timeout, not one
//!   per epoch.
//! - **End** ([`Mirror::finish`]): the summary metrics, the dataset input, the artifacts
//!   (through the proxied artifact store), then — after the sender has drained — the final
//!   status `FINISHED`, `FAILED` or `KILLED`. What could not be sent is reported once, in one
//!   warning, and returned as a [`MirrorReport`].
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
//! | dataset input | the data file: name, digest = first 32 hex digits of its SHA-256 (MLflow allows 36 characters; the full hash is in the profile), context `train` |
//! | artifacts | `config.yaml`, `epochs.jsonl`, `resources.{png,svg,csv}`, `export/…` (weights and manifest), `profile/…` (trace and key averages, when the profiler ran) |
//!
//! Artifacts need a server that proxies its artifact store (`mlflow server
//! --serve-artifacts`, the default since MLflow 2): the run's `artifact_uri` is
//! `mlflow-artifacts:/…`, and files are `PUT` to `/api/2.0/mlflow-artifacts/artifacts/…`.
//! With any other artifact store, artifacts are skipped with the end-of-run warning.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use percent_encoding::utf8_percent_encode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{
    Client, ClientOptions, MAX_ENTITIES_PER_BATCH, MAX_PARAM_VALUE, MAX_PARAMS_PER_BATCH,
    MAX_TAG_VALUE, MlflowError, QUERY_VALUE, escape_key, fit_name, flatten, now_ms, truncate_chars,
};
use crate::config::LoadedConfig;
use crate::records::{EpochRecord, RunDir, RunEnd};
use crate::util;

/// The file in a run directory that names its MLflow run.
pub const STATE_FILE: &str = "mlflow.json";
/// Set by `kiln sweep` for its members: the MLflow run id of the sweep's parent run.
pub const ENV_PARENT_RUN_ID: &str = "KILN_MLFLOW_PARENT_RUN_ID";
/// Default capacity of the sender's queue, in requests.
pub const DEFAULT_QUEUE_CAPACITY: usize = 256;
/// How long the sender stops trying after a transport failure.
const PAUSE_AFTER_TRANSPORT_FAILURE: Duration = Duration::from_secs(10);

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
        }
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
}

impl MirrorReport {
    /// Whether everything reached the server.
    pub fn complete(&self) -> bool {
        self.metrics_unsent == 0
            && self.other_unsent == 0
            && self.artifacts_unsent == 0
            && self.status.is_some()
    }
}

/// A unit of work for the sender thread.
enum Job {
    /// A JSON POST carrying `metrics` metric values and `other` params/tags/inputs.
    Post {
        path: &'static str,
        body: Value,
        metrics: u64,
        other: u64,
    },
    /// An artifact file.
    Upload { name: String, file: PathBuf },
}

impl Job {
    fn count(&self, c: &Counters, sent: bool) {
        let add = |a: &AtomicU64, n: u64| {
            a.fetch_add(n, Ordering::Relaxed);
        };
        match (self, sent) {
            (Job::Post { metrics, .. }, true) => add(&c.metrics_sent, *metrics),
            (Job::Post { metrics, other, .. }, false) => {
                add(&c.metrics_unsent, *metrics);
                add(&c.other_unsent, *other);
            }
            (Job::Upload { .. }, true) => add(&c.artifacts_sent, 1),
            (Job::Upload { .. }, false) => add(&c.artifacts_unsent, 1),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    metrics_sent: AtomicU64,
    metrics_unsent: AtomicU64,
    other_unsent: AtomicU64,
    artifacts_sent: AtomicU64,
    artifacts_unsent: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Counters {
    fn error(&self, e: String) {
        if let Ok(mut f) = self.first_error.lock()
            && f.is_none()
        {
            *f = Some(e);
        }
    }
}

/// The sender thread's state.
struct Worker {
    client: Client,
    artifact_root: Option<String>,
    counters: Arc<Counters>,
    paused_until: Option<Instant>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Job>) {
        for job in rx {
            self.handle(job);
        }
    }

    fn handle(&mut self, job: Job) {
        if self.paused_until.is_some_and(|t| Instant::now() < t) {
            job.count(&self.counters, false);
            return;
        }
        let result = match &job {
            Job::Post { path, body, .. } => self.client.post(path, body).map(|_| ()),
            Job::Upload { name, file } => self.upload(name, file),
        };
        match result {
            Ok(()) => job.count(&self.counters, true),
            Err(e) => {
                job.count(&self.counters, false);
                if matches!(e, MlflowError::Transport { .. }) {
                    self.paused_until = Some(Instant::now() + PAUSE_AFTER_TRANSPORT_FAILURE);
                }
                self.counters.error(e.to_string());
            }
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

/// The background sender: a bounded queue and the thread that empties it.
struct Sender {
    tx: Mutex<Option<SyncSender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    counters: Arc<Counters>,
}

impl Sender {
    fn spawn(client: Client, artifact_root: Option<String>, capacity: usize) -> Self {
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::sync_channel(capacity.max(1));
        let worker = Worker {
            client,
            artifact_root,
            counters: Arc::clone(&counters),
            paused_until: None,
        };
        let thread = std::thread::Builder::new()
            .name("kiln-mlflow".into())
            .spawn(move || worker.run(rx))
            .ok();
        Self {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(thread),
            counters,
        }
    }

    /// Queue without waiting; a full queue (or a stopped sender) counts the job as not sent.
    fn offer(&self, job: Job) {
        let tx = self.tx.lock().ok().and_then(|t| t.clone());
        let Some(tx) = tx else {
            job.count(&self.counters, false);
            return;
        };
        match tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) => {
                job.count(&self.counters, false);
                self.counters.error(
                    "the sender's queue was full (the server is slower than training)".into(),
                );
            }
            Err(TrySendError::Disconnected(job)) => job.count(&self.counters, false),
        }
    }

    /// Queue, waiting for room (only after training, at the end of the run).
    fn push(&self, job: Job) {
        let tx = self.tx.lock().ok().and_then(|t| t.clone());
        match tx {
            Some(tx) => {
                if let Err(mpsc::SendError(job)) = tx.send(job) {
                    job.count(&self.counters, false);
                }
            }
            None => job.count(&self.counters, false),
        }
    }

    /// Close the queue and wait until everything queued was tried.
    fn drain(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
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
) -> Result<MirrorState, MlflowError> {
    let create = "/api/2.0/mlflow/runs/create";
    let created = client.post(
        create,
        &json!({
            "experiment_id": experiment_id,
            "start_time": now_ms(),
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

/// An MLflow run mirroring a kiln run; see the module docs.
pub struct Mirror {
    client: Client,
    state: MirrorState,
    resumed: bool,
    step_offsets: Vec<usize>,
    data_path: PathBuf,
    profile_dir: PathBuf,
    sender: Sender,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("state", &self.state)
            .field("resumed", &self.resumed)
            .finish_non_exhaustive()
    }
}

impl Mirror {
    /// Start mirroring when `MLFLOW_TRACKING_URI` is set, with [`ClientOptions::from_env`] and
    /// [`MirrorOptions::from_env`]; `None` (after one warning) on any failure.
    pub fn from_env(run: &RunDir, loaded: &LoadedConfig) -> Option<Self> {
        let uri = std::env::var("MLFLOW_TRACKING_URI")
            .ok()
            .filter(|u| !u.is_empty())?;
        let started = ClientOptions::from_env()
            .and_then(|options| Client::with_options(&uri, &options))
            .and_then(|client| Self::start(client, &MirrorOptions::from_env(loaded), run, loaded));
        match started {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!("MLflow mirror disabled: {e}");
                None
            }
        }
    }

    /// Create the MLflow run (or continue the one named by `<run dir>/mlflow.json` on the
    /// same server), store its ids in the run directory, start the sender and queue the
    /// config as params.
    pub fn start(
        client: Client,
        options: &MirrorOptions,
        run: &RunDir,
        loaded: &LoadedConfig,
    ) -> Result<Self, MlflowError> {
        let experiment_id = client.experiment_id(&options.experiment)?;
        match mark_stale_runs_killed(&client, &experiment_id) {
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
                        set_status(&client, &s.run_id, "RUNNING")?;
                        // Refresh the process tags so the reaper sees the live process.
                        let tags: Vec<Value> = source_tags(&source_name(loaded))
                            .into_iter()
                            .filter(|t| {
                                t["key"].as_str().is_some_and(|k| k.starts_with("kiln.pid"))
                            })
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
                create_run(&client, &experiment_id, &run.id, tags)?
            }
        };
        if let Err(e) = state.write(&run.path) {
            tracing::warn!(
                "MLflow: cannot record the run id in {}: {e} (a --resume will start a new MLflow run)",
                run.path.join(STATE_FILE).display()
            );
        }
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
        let mirror = Self {
            sender: Sender::spawn(
                client.clone(),
                proxied_root(&state.artifact_uri),
                options.queue_capacity,
            ),
            client,
            state,
            resumed,
            step_offsets,
            data_path: c.data.path.clone(),
            profile_dir,
        };
        let mut params = Vec::new();
        flatten(
            "",
            &serde_json::to_value(c).map_err(MlflowError::Config)?,
            &mut params,
        );
        let params: Vec<Value> = params
            .iter()
            .map(|(k, v)| json!({"key": k, "value": truncate_chars(v, MAX_PARAM_VALUE)}))
            .collect();
        for job in batches(&mirror.state.run_id, params, Vec::new(), Vec::new()) {
            mirror.sender.offer(job);
        }
        Ok(mirror)
    }

    /// The MLflow run.
    pub fn state(&self) -> &MirrorState {
        &self.state
    }

    /// MLflow's run id.
    pub fn run_id(&self) -> &str {
        &self.state.run_id
    }

    /// Whether this mirror continues an MLflow run started by an earlier process.
    pub fn resumed(&self) -> bool {
        self.resumed
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
        for job in batches(&self.state.run_id, Vec::new(), metrics, Vec::new()) {
            self.sender.offer(job);
        }
    }

    /// Send the end-of-run metrics, the dataset input and the artifacts, wait for the sender,
    /// then set the final status. Never fails: what could not be sent is reported once (a
    /// warning) and in the returned report.
    pub fn finish(&self, run: &RunDir, end: &RunEnd) -> MirrorReport {
        let ts = now_ms();
        let run_id = &self.state.run_id;
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
        for split in ["test", "validation", "test_before_calibration"] {
            let targets = end
                .final_metrics
                .as_ref()
                .and_then(|m| m[split]["targets"].as_array());
            for t in targets.into_iter().flatten() {
                let Some(name) = t["target"].as_str() else {
                    continue;
                };
                for (field, v) in t.as_object().into_iter().flatten() {
                    if let Some(v) = v.as_f64().filter(|v| v.is_finite()) {
                        metrics.push(metric(
                            &format!("{split}/{}/{}", escape_key(name), escape_key(field)),
                            v,
                            ts,
                            0,
                        ));
                    }
                }
            }
        }
        let mut tags = Vec::new();
        if let Some(reason) = &end.reason {
            tags.push(tag("kiln.failure_reason", reason));
        }
        for job in batches(run_id, Vec::new(), metrics, tags) {
            self.sender.push(job);
        }
        if let Some(sha) = &end.dataset_sha256 {
            let name = self
                .data_path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "dataset".into());
            let source =
                std::fs::canonicalize(&self.data_path).unwrap_or_else(|_| self.data_path.clone());
            self.sender.push(Job::Post {
                path: "/api/2.0/mlflow/runs/log-inputs",
                body: json!({
                    "run_id": run_id,
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
            });
        }
        for (name, file) in artifact_files(&run.path, &self.profile_dir) {
            self.sender.push(Job::Upload { name, file });
        }
        self.sender.drain();
        let status = match end.status.as_str() {
            "finished" => "FINISHED",
            "killed" => "KILLED",
            _ => "FAILED",
        };
        let c = &self.sender.counters;
        let mut report = MirrorReport {
            metrics_sent: c.metrics_sent.load(Ordering::Relaxed),
            metrics_unsent: c.metrics_unsent.load(Ordering::Relaxed),
            other_unsent: c.other_unsent.load(Ordering::Relaxed),
            artifacts_sent: c.artifacts_sent.load(Ordering::Relaxed),
            artifacts_unsent: c.artifacts_unsent.load(Ordering::Relaxed),
            status: None,
            first_error: c.first_error.lock().ok().and_then(|e| e.clone()),
        };
        match set_status(&self.client, run_id, status) {
            Ok(()) => report.status = Some(status.to_string()),
            Err(e) => {
                if report.first_error.is_none() {
                    report.first_error = Some(e.to_string());
                }
            }
        }
        if !report.complete() {
            tracing::warn!(
                "MLflow mirror of run {} ({}): {} of {} metric values, {} params/tags/inputs and \
                 {} of {} artifact files could not be sent{}; first error: {}",
                run.id,
                self.state.run_id,
                report.metrics_unsent,
                report.metrics_unsent + report.metrics_sent,
                report.other_unsent,
                report.artifacts_unsent,
                report.artifacts_unsent + report.artifacts_sent,
                if report.status.is_none() {
                    format!(", and the final status {status} was not set")
                } else {
                    String::new()
                },
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
/// `resources.{png,svg,csv}`, everything under `export/` and under the profiler's directory
/// (as `profile/…`), when present.
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
        let state = create_run(&client, &experiment_id, &name, tags)?;
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
        for f in ["config.yaml", "epochs.jsonl", "resources.png", "steps.csv"] {
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
                "export/manifest.json",
                "export/sub/w.bin",
                "profile/trace.json"
            ]
        );
    }
}
