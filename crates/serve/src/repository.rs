//! The model repository: `ROOT/<model>/<version>/`, the version policy, loading and the
//! atomic swap.
//!
//! Version policy (Triton's `latest` with one version): each model serves its highest
//! numeric version that loads. A reload pass scans the repository and, per model, loads and
//! warms the highest version newer than the served one on the calling (background) thread,
//! then swaps it in with one pointer store. Requests hold an `Arc` of the version they
//! started on, so requests in flight finish on the old version; its batcher stops when the
//! last of them is done. A version that fails to load or warm up is rejected with a log line
//! and `kiln_model_reload_failures_total`, the old version keeps serving, and the rejected
//! version is not retried until its files change (size or modification time), so a version
//! copied in file by file is picked up once complete. Directories whose names start with `.`
//! (for instance the temporary directory of an atomic export) are ignored; a model whose
//! directory disappears is unloaded.
//!
//! Model control ([`ModelControlMode`], Triton's `--model-control-mode`): `poll` is the above,
//! run at start, on every poll tick and on SIGHUP; `none` runs the pass once at start and
//! never again; `explicit` loads nothing until [`Repository::load_model`] names a model, which
//! runs the same pass for that model alone (so a load warms up before the model reports
//! ready, and a version that fails leaves the previous one serving), and
//! [`Repository::unload_model`] takes a model out of service, waits for its requests in
//! flight to finish, then stops its batcher. [`Repository::index`] lists the models on disk
//! with their state, as Triton's repository index does.

use kiln_model::records::EngineKind;
use kiln_model::records::repository::{subdirs, version_dirs};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use crate::batcher::{Batcher, BatcherConfig};
use crate::metrics::{Metrics, ModelMetrics, VersionMetrics};
use crate::model::{LoadError, ModelKind, ModelSpec, build_instance, load_spec};
use crate::monitor::{DriftMonitor, LatencyWatch, WatchConfig};

/// Repository settings.
#[derive(Debug, Clone)]
pub struct RepositoryConfig {
    /// The repository root.
    pub root: PathBuf,
    /// The engine for regression models.
    pub engine: EngineKind,
    /// Batching and instances.
    pub batcher: BatcherConfig,
    /// Drift and latency watch settings.
    pub watch: WatchConfig,
}

/// How models get loaded (Triton's `--model-control-mode`).
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
    parse_err_fn = unknown_control_mode
)]
pub enum ModelControlMode {
    /// Load every model at start; never reload.
    None,
    /// Load every model at start, then reload on each poll tick and on SIGHUP.
    #[default]
    Poll,
    /// Load nothing at start; models are loaded and unloaded through the repository API.
    Explicit,
}

impl ModelControlMode {
    /// The name (`none`, `poll`, `explicit`), as `--model-control-mode` spells it.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// `ModelControlMode`'s derived `FromStr` error.
fn unknown_control_mode(other: &str) -> String {
    format!("unknown model control mode `{other}`; expected `none`, `poll` or `explicit`")
}

/// What kind of failure a repository request met (each protocol maps it to
/// its own status: HTTP 404/400/503, gRPC NOT_FOUND/INVALID_ARGUMENT/UNAVAILABLE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoErrorKind {
    /// No such model or version.
    NotFound,
    /// The request is malformed, or not allowed in this model control mode.
    InvalidArgument,
    /// The model exists but is not serving.
    Unavailable,
    /// Loading failed.
    LoadFailed,
}

/// A failed repository request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RepoError {
    /// Its kind.
    pub kind: RepoErrorKind,
    /// What went wrong, for the client.
    pub message: String,
}

impl RepoError {
    /// A new error.
    pub fn new(kind: RepoErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// One model of the repository index.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IndexEntry {
    /// The model name.
    pub name: String,
    /// The served version, or the highest on disk when none is served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `READY`, `LOADING` or `UNAVAILABLE` (Triton's states).
    pub state: String,
    /// Why it is not ready (empty when ready).
    pub reason: String,
}

/// A loaded, warmed version.
pub struct LoadedVersion {
    /// The model name.
    pub model: String,
    /// The version number.
    pub version: u64,
    /// Its directory.
    pub dir: PathBuf,
    /// Its interface and contents.
    pub spec: ModelSpec,
    /// Its batcher.
    pub batcher: Batcher,
    /// Its metrics.
    pub metrics: Arc<VersionMetrics>,
    /// When it became ready.
    pub ready_at: SystemTime,
}

impl std::fmt::Debug for LoadedVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedVersion")
            .field("model", &self.model)
            .field("version", &self.version)
            .field("dir", &self.dir)
            .finish()
    }
}

type Fingerprint = Vec<(String, u64, Option<SystemTime>)>;

#[derive(Default)]
struct SlotState {
    /// Versions on disk at the last scan.
    available: Vec<u64>,
    /// Rejected versions with the files they had and the reason.
    failed: HashMap<u64, (Fingerprint, String)>,
    /// The last load error.
    last_error: Option<String>,
}

/// One model of the repository.
pub struct ModelSlot {
    /// Its name.
    pub name: String,
    current: RwLock<Option<Arc<LoadedVersion>>>,
    /// Its metrics.
    pub metrics: Arc<ModelMetrics>,
    state: Mutex<SlotState>,
}

impl ModelSlot {
    /// The version being served.
    pub fn current(&self) -> Option<Arc<LoadedVersion>> {
        self.current.read().expect("slot lock").clone()
    }

    /// Versions on disk at the last scan.
    pub fn available(&self) -> Vec<u64> {
        self.state.lock().expect("slot lock").available.clone()
    }

    /// The last load error, if the last attempt failed.
    pub fn last_error(&self) -> Option<String> {
        self.state.lock().expect("slot lock").last_error.clone()
    }

    fn swap(&self, v: Option<Arc<LoadedVersion>>) -> Option<Arc<LoadedVersion>> {
        let mut g = self.current.write().expect("slot lock");
        std::mem::replace(&mut *g, v)
    }
}

/// What a reload pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReloadReport {
    /// Versions loaded and swapped in.
    pub loaded: Vec<(String, u64)>,
    /// Versions rejected, with the reason.
    pub failed: Vec<(String, u64, String)>,
    /// Models unloaded because their directory disappeared.
    pub removed: Vec<String>,
    /// The repository could not be read.
    pub error: Option<String>,
}

/// How the reason of a model whose load failed begins (see [`Repository::rejected`]).
const LOAD_FAILED: &str = "load failed: ";
/// The served models.
pub struct Repository {
    config: RepositoryConfig,
    metrics: Arc<Metrics>,
    models: RwLock<BTreeMap<String, Arc<ModelSlot>>>,
    scanned: AtomicBool,
    reload_lock: Mutex<()>,
    mode: ModelControlMode,
    /// Models loaded through the API (explicit mode).
    explicit: Mutex<BTreeSet<String>>,
    /// Why a model that is not in service is not (explicit mode: unloaded, failed).
    reasons: Mutex<BTreeMap<String, String>>,
}

fn fingerprint(dir: &Path) -> Fingerprint {
    let mut v: Fingerprint = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let m = e.metadata().ok()?;
                    Some((
                        e.file_name().to_string_lossy().into_owned(),
                        m.len(),
                        m.modified().ok(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

impl Repository {
    /// An empty repository in `poll` mode; [`Repository::reload`] loads it.
    pub fn new(config: RepositoryConfig, metrics: Arc<Metrics>) -> Self {
        Self::with_mode(config, metrics, ModelControlMode::Poll)
    }

    /// An empty repository under a model control mode.
    pub fn with_mode(
        config: RepositoryConfig,
        metrics: Arc<Metrics>,
        mode: ModelControlMode,
    ) -> Self {
        Self {
            config,
            metrics,
            models: RwLock::default(),
            // Explicit mode is ready with nothing loaded.
            scanned: AtomicBool::new(mode == ModelControlMode::Explicit),
            reload_lock: Mutex::new(()),
            mode,
            explicit: Mutex::default(),
            reasons: Mutex::default(),
        }
    }

    /// The model control mode.
    pub fn mode(&self) -> ModelControlMode {
        self.mode
    }

    fn explicit_only(&self, what: &str) -> Result<(), RepoError> {
        if self.mode == ModelControlMode::Explicit {
            return Ok(());
        }
        Err(RepoError::new(
            RepoErrorKind::InvalidArgument,
            format!(
                "cannot {what}: model control is `{}`; start kiln serve with \
                 --model-control-mode explicit to load and unload models through the API",
                self.mode
            ),
        ))
    }

    fn model_dir(&self, name: &str) -> Result<PathBuf, RepoError> {
        if name.is_empty() || name.starts_with('.') || name.contains(['/', '\\']) {
            return Err(RepoError::new(
                RepoErrorKind::InvalidArgument,
                format!(
                    "`{}` is not a model name (a directory of the repository)",
                    crate::protocol::clip(name)
                ),
            ));
        }
        let dir = self.config.root.join(name);
        if !dir.is_dir() {
            return Err(RepoError::new(
                RepoErrorKind::NotFound,
                format!(
                    "model `{}` is not in the repository: {} has no directory of that name",
                    crate::protocol::clip(name),
                    self.config.root.display()
                ),
            ));
        }
        Ok(dir)
    }

    /// Whether `name` is a model directory of the repository on disk (loaded or not).
    pub fn on_disk(&self, name: &str) -> bool {
        self.model_dir(name).is_ok()
    }

    /// Load (or reload) a model (explicit mode). Blocking: loads and warms the highest
    /// version that loads (retrying versions that failed before) and returns the version
    /// served. When the new version fails, the one already served keeps serving and the
    /// error says so.
    pub fn load_model(&self, name: &str) -> Result<u64, RepoError> {
        self.explicit_only("load a model")?;
        self.model_dir(name)?;
        let _guard = self.reload_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.explicit
            .lock()
            .expect("repository lock")
            .insert(name.to_string());
        if let Some(slot) = self.get(name) {
            slot.state.lock().expect("slot lock").failed.clear();
        }
        let before = self.get(name).and_then(|s| s.current()).map(|c| c.version);
        let report = self.reload_locked(Some(name));
        let slot = self.get(name);
        let serving = slot.as_ref().and_then(|s| s.current()).map(|c| c.version);
        let failed: Vec<String> = report
            .failed
            .iter()
            .filter(|(m, _, _)| m == name)
            .map(|(_, v, e)| format!("version {v}: {e}"))
            .collect();
        let problem = report
            .error
            .clone()
            .or_else(|| (!failed.is_empty()).then(|| failed.join("; ")))
            .or_else(|| {
                slot.as_ref()
                    .and_then(|s| s.last_error())
                    .filter(|_| serving.is_none())
            });
        match (serving, problem) {
            (Some(v), None) => {
                self.reasons.lock().expect("repository lock").remove(name);
                Ok(v)
            }
            // The load put a version in service, though not the highest on disk: the model
            // is ready, so the load succeeded; the versions it skipped are logged.
            (Some(v), Some(e)) if before != Some(v) => {
                tracing::warn!(model = %name, version = v, "loaded a lower version: {e}");
                self.reasons.lock().expect("repository lock").remove(name);
                Ok(v)
            }
            (Some(v), Some(e)) => Err(RepoError::new(
                RepoErrorKind::LoadFailed,
                format!("failed to load model `{name}`: {e}; version {v} keeps serving"),
            )),
            (None, e) => {
                let e = e.unwrap_or_else(|| "no version loaded".into());
                // Nothing serves: take it out of the repository so the server stays ready.
                self.explicit.lock().expect("repository lock").remove(name);
                self.models.write().expect("repository lock").remove(name);
                self.reasons
                    .lock()
                    .expect("repository lock")
                    .insert(name.to_string(), format!("{LOAD_FAILED}{e}"));
                Err(RepoError::new(
                    RepoErrorKind::LoadFailed,
                    format!("failed to load model `{name}`: {e}"),
                ))
            }
        }
    }

    /// Unload a model (explicit mode). Blocking: new requests for it are refused at once;
    /// requests in flight finish (waiting at most `drain`), then its batcher stops.
    pub fn unload_model(&self, name: &str, drain: Duration) -> Result<(), RepoError> {
        self.explicit_only("unload a model")?;
        let _guard = self.reload_lock.lock().unwrap_or_else(|p| p.into_inner());
        let was_wanted = self.explicit.lock().expect("repository lock").remove(name);
        let slot = self.models.write().expect("repository lock").remove(name);
        let Some(slot) = slot else {
            if was_wanted || self.config.root.join(name).is_dir() {
                return Ok(());
            }
            return Err(RepoError::new(
                RepoErrorKind::NotFound,
                format!(
                    "model `{}` is neither loaded nor in the repository",
                    crate::protocol::clip(name)
                ),
            ));
        };
        let old = slot.swap(None);
        slot.metrics.ready.store(false, Ordering::Relaxed);
        slot.metrics.loaded_version.store(-1, Ordering::Relaxed);
        self.reasons
            .lock()
            .expect("repository lock")
            .insert(name.to_string(), "unloaded".into());
        if let Some(old) = old {
            let until = Instant::now() + drain;
            while Arc::strong_count(&old) > 1 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            if Arc::strong_count(&old) > 1 {
                tracing::warn!(model = %name, "requests still in flight after {drain:?}; unloading anyway (they finish on the old batcher)");
            }
            tracing::info!(model = %name, version = old.version, "model unloaded");
        }
        Ok(())
    }

    /// The repository index: every model directory on disk and every model in service,
    /// with its state (`ready_only`: only models that are ready).
    pub fn index(&self, ready_only: bool) -> Result<Vec<IndexEntry>, RepoError> {
        let on_disk = subdirs(&self.config.root).map_err(|e| {
            RepoError::new(
                RepoErrorKind::Unavailable,
                format!(
                    "cannot read model repository {}: {e}",
                    self.config.root.display()
                ),
            )
        })?;
        let mut names: BTreeMap<String, Option<PathBuf>> =
            self.names().into_iter().map(|n| (n, None)).collect();
        for (n, p) in on_disk {
            names.insert(n, Some(p));
        }
        let reasons = self.reasons.lock().expect("repository lock").clone();
        let mut out = Vec::new();
        for (name, dir) in names {
            let slot = self.get(&name);
            let current = slot.as_ref().and_then(|s| s.current());
            let highest = || {
                dir.as_ref()
                    .and_then(|d| version_dirs(d).ok())
                    .and_then(|v| v.last().map(|(v, _)| *v))
                    .map(|v| v.to_string())
            };
            let entry = match (&slot, current) {
                (_, Some(c)) => IndexEntry {
                    name: name.clone(),
                    version: Some(c.version.to_string()),
                    state: "READY".into(),
                    reason: String::new(),
                },
                (Some(s), None) => match s.last_error() {
                    Some(e) => IndexEntry {
                        name: name.clone(),
                        version: highest(),
                        state: "UNAVAILABLE".into(),
                        reason: e,
                    },
                    None => IndexEntry {
                        name: name.clone(),
                        version: highest(),
                        state: "LOADING".into(),
                        reason: String::new(),
                    },
                },
                (None, None) => IndexEntry {
                    name: name.clone(),
                    version: highest(),
                    state: "UNAVAILABLE".into(),
                    reason: reasons.get(&name).cloned().unwrap_or_else(|| {
                        if self.mode == ModelControlMode::Explicit {
                            "not loaded (explicit model control)".into()
                        } else {
                            "not loaded".into()
                        }
                    }),
                },
            };
            if !ready_only || entry.state == "READY" {
                out.push(entry);
            }
        }
        Ok(out)
    }

    /// The models that have nothing to serve because loading them failed (every version
    /// rejected at load or warm-up), each with the reason. A model not tried yet, still
    /// loading, or unloaded on request is not among them: waiting may still serve those.
    pub fn rejected(&self) -> Vec<(String, String)> {
        let reasons = self.reasons.lock().expect("repository lock").clone();
        let mut out: Vec<(String, String)> = self
            .names()
            .into_iter()
            .filter_map(|n| {
                let slot = self.get(&n)?;
                if slot.current().is_some() {
                    return None;
                }
                slot.last_error().map(|e| (n, e))
            })
            .collect();
        for (n, r) in reasons {
            if r.starts_with(LOAD_FAILED) && self.get(&n).is_none() {
                out.push((n, r));
            }
        }
        out.sort();
        out
    }

    /// The settings.
    pub fn config(&self) -> &RepositoryConfig {
        &self.config
    }

    /// A model by name.
    pub fn get(&self, name: &str) -> Option<Arc<ModelSlot>> {
        self.models
            .read()
            .expect("repository lock")
            .get(name)
            .cloned()
    }

    /// Model names.
    pub fn names(&self) -> Vec<String> {
        self.models
            .read()
            .expect("repository lock")
            .keys()
            .cloned()
            .collect()
    }

    /// Ready: the first scan has finished and every model serves a version (explicit
    /// mode: always; each model reports its own readiness while it loads).
    pub fn ready(&self) -> bool {
        if self.mode == ModelControlMode::Explicit {
            return true;
        }
        self.scanned.load(Ordering::Acquire)
            && self
                .models
                .read()
                .expect("repository lock")
                .values()
                .all(|s| s.current().is_some())
    }

    /// Unload every model (shutdown).
    pub fn clear(&self) {
        let models = std::mem::take(&mut *self.models.write().expect("repository lock"));
        for slot in models.values() {
            slot.swap(None);
            slot.metrics.ready.store(false, Ordering::Relaxed);
        }
    }

    /// Scan the repository and load what changed. Blocking (loads and warms models);
    /// concurrent calls run one after the other.
    pub fn reload(&self) -> ReloadReport {
        let _guard = self.reload_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.reload_locked(None)
    }

    /// The reload pass, under the reload lock: every model (`poll`, `none`), or in explicit
    /// mode those loaded through the API; `only`: that model alone.
    fn reload_locked(&self, only: Option<&str>) -> ReloadReport {
        let mut report = ReloadReport::default();
        let models = match subdirs(&self.config.root) {
            Ok(m) => m,
            Err(e) => {
                let msg = format!(
                    "cannot read model repository {}: {e}",
                    self.config.root.display()
                );
                tracing::error!("{msg}");
                report.error = Some(msg);
                self.scanned.store(true, Ordering::Release);
                return report;
            }
        };
        let models: Vec<(String, PathBuf)> = if self.mode == ModelControlMode::Explicit {
            let wanted = self.explicit.lock().expect("repository lock").clone();
            models
                .into_iter()
                .filter(|(n, _)| wanted.contains(n))
                .collect()
        } else {
            models
        };
        let models: Vec<(String, PathBuf)> = match only {
            Some(o) => models.into_iter().filter(|(n, _)| n == o).collect(),
            None => models,
        };
        // Unload models whose directory is gone.
        let names: Vec<String> = models.iter().map(|(n, _)| n.clone()).collect();
        let gone: Vec<String> = self
            .models
            .read()
            .expect("repository lock")
            .keys()
            .filter(|k| !names.contains(k) && only.is_none_or(|o| o == k.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if let Some(slot) = self.models.write().expect("repository lock").remove(&name) {
                slot.swap(None);
                slot.metrics.ready.store(false, Ordering::Relaxed);
                slot.metrics.loaded_version.store(-1, Ordering::Relaxed);
                tracing::info!(model = %name, "model directory removed; model unloaded");
                report.removed.push(name);
            }
        }
        for (name, dir) in models {
            let versions: BTreeMap<u64, PathBuf> = match version_dirs(&dir) {
                Ok(v) => v.into_iter().collect(),
                Err(e) => {
                    tracing::warn!(model = %name, "cannot read {}: {e}", dir.display());
                    continue;
                }
            };
            let slot = {
                let mut models = self.models.write().expect("repository lock");
                models
                    .entry(name.clone())
                    .or_insert_with(|| {
                        Arc::new(ModelSlot {
                            name: name.clone(),
                            current: RwLock::new(None),
                            metrics: self.metrics.model(&name),
                            state: Mutex::default(),
                        })
                    })
                    .clone()
            };
            slot.state.lock().expect("slot lock").available = versions.keys().copied().collect();
            if versions.is_empty() {
                let mut st = slot.state.lock().expect("slot lock");
                if st.last_error.is_none() {
                    tracing::warn!(model = %name, "{} has no numeric version directories", dir.display());
                }
                st.last_error = Some(format!(
                    "{} has no numeric version directories (expected {}/<version>/)",
                    dir.display(),
                    dir.display()
                ));
                continue;
            }
            self.update_model(&slot, &versions, &mut report);
        }
        self.scanned.store(true, Ordering::Release);
        report
    }

    fn update_model(
        &self,
        slot: &Arc<ModelSlot>,
        versions: &BTreeMap<u64, PathBuf>,
        report: &mut ReloadReport,
    ) {
        loop {
            let served = slot.current().map(|c| c.version);
            let floor = served.filter(|s| versions.contains_key(s));
            let candidate = versions.iter().rev().find(|(v, p)| {
                if floor.is_some_and(|f| **v <= f) || Some(**v) == served {
                    return false;
                }
                let st = slot.state.lock().expect("slot lock");
                st.failed.get(v).is_none_or(|(fp, _)| *fp != fingerprint(p))
            });
            let Some((&version, path)) = candidate else {
                return;
            };
            let fp = fingerprint(path);
            let t0 = Instant::now();
            tracing::info!(model = %slot.name, version, "loading {}", path.display());
            match self.load_version(&slot.name, version, path) {
                Ok(loaded) => {
                    let loaded = Arc::new(loaded);
                    let old = slot.swap(Some(loaded.clone()));
                    let m = &slot.metrics;
                    m.loaded_version.store(version as i64, Ordering::Relaxed);
                    m.ready.store(true, Ordering::Relaxed);
                    m.reloads.fetch_add(1, Ordering::Relaxed);
                    {
                        let mut st = slot.state.lock().expect("slot lock");
                        st.failed.remove(&version);
                        st.last_error = None;
                    }
                    // At the default log level (target `kiln::serve::live`): the one line
                    // an operator needs when the nightly job's version goes live.
                    tracing::info!(
                        target: "kiln::serve::live",
                        model = %slot.name,
                        version,
                        run = %loaded.spec.run_id().unwrap_or("?"),
                        previous = %old.as_ref().map_or("none".into(), |o| o.version.to_string()),
                        load_and_warm_ms = t0.elapsed().as_millis() as u64,
                        "version live"
                    );
                    report.loaded.push((slot.name.clone(), version));
                    // `old` drops here; requests still holding it finish on it.
                }
                Err(e) => {
                    let msg = e.to_string();
                    slot.metrics.reload_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        model = %slot.name,
                        version,
                        serving = %served.map_or("none".into(), |v: u64| v.to_string()),
                        "version rejected: {msg}"
                    );
                    let mut st = slot.state.lock().expect("slot lock");
                    st.failed.insert(version, (fp, msg.clone()));
                    st.last_error = Some(format!("version {version}: {msg}"));
                    report.failed.push((slot.name.clone(), version, msg));
                }
            }
        }
    }

    fn load_version(
        &self,
        model: &str,
        version: u64,
        dir: &Path,
    ) -> Result<LoadedVersion, LoadError> {
        let spec = load_spec(dir)?;
        let engine = self.config.engine;
        let threads = self.config.batcher.threads_per_instance;
        let spec_for = spec.clone();
        let buckets = crate::model::buckets(self.config.batcher.max_batch_size);
        let factory = Arc::new(move || build_instance(&spec_for, engine, threads, &buckets));
        let mm = self.metrics.model(model);
        // Statistics are cumulative since load (as Triton's): a version loaded again starts
        // from zero. The version being loaded is never the one serving.
        let vm = mm.fresh_version(version);
        attach_watches(
            &vm,
            &spec,
            &self.config.watch,
            self.config.engine,
            &crate::model::buckets(self.config.batcher.max_batch_size),
            &format!("model `{model}` version {version}"),
        );
        let batcher = Batcher::start(
            model,
            &self.config.batcher,
            factory,
            vm.clone(),
            mm.queue_depth.clone(),
        )?;
        Ok(LoadedVersion {
            model: model.to_string(),
            version,
            dir: dir.to_path_buf(),
            spec,
            batcher,
            metrics: vm,
            ready_at: SystemTime::now(),
        })
    }
}

/// Set up the drift monitor and the latency watch of a version being loaded, from what its
/// checkpoint carries (older checkpoints without sketches or latency get neither; a note
/// says so). Pick models are not watched.
fn attach_watches(
    vm: &VersionMetrics,
    spec: &ModelSpec,
    config: &WatchConfig,
    engine: EngineKind,
    buckets: &[usize],
    label: &str,
) {
    let ModelKind::Regression(ckpt) = &spec.kind else {
        return;
    };
    let m = &ckpt.manifest;
    let pre = m.input_preprocessing();
    match m
        .drift
        .clone()
        .filter(|_| config.drift)
        .map(|d| d.bind(&pre))
    {
        None if !config.drift => tracing::info!("{label}: drift monitoring off (--no-drift-watch)"),
        Some(Ok(reference)) => {
            let _ = vm.drift.set(DriftMonitor::new(
                reference,
                pre.n_features(),
                m.target_names(),
                config,
            ));
        }
        Some(Err(e)) => tracing::warn!("{label}: drift monitoring off: {e}"),
        None => tracing::info!(
            "{label}: drift monitoring off: the checkpoint has no training sketches (exported by an older kiln)"
        ),
    }
    let report = m.latency.clone();
    let serving = format!("{engine} ({})", kiln_model::simd::Isa::detect().name());
    match report.and_then(|r| LatencyWatch::new(&r, buckets, serving, label.to_string(), config)) {
        Some(w) => {
            let _ = vm.latency.set(w);
        }
        None => tracing::info!("{label}: latency watch off: the checkpoint records no latency"),
    }
}
