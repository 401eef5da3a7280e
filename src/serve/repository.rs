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

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime};

use super::batcher::{Batcher, BatcherConfig};
use super::metrics::{Metrics, ModelMetrics, VersionMetrics};
use super::model::{LoadError, ModelSpec, build_instance, load_spec};

/// Repository settings.
#[derive(Debug, Clone)]
pub struct RepositoryConfig {
    /// The repository root.
    pub root: PathBuf,
    /// The engine name for regression models.
    pub engine: String,
    /// Batching and instances.
    pub batcher: BatcherConfig,
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

/// The served models.
pub struct Repository {
    config: RepositoryConfig,
    metrics: Arc<Metrics>,
    models: RwLock<BTreeMap<String, Arc<ModelSlot>>>,
    scanned: AtomicBool,
    reload_lock: Mutex<()>,
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

fn subdirs(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if e.path().is_dir() {
            out.push((name, e.path()));
        }
    }
    Ok(out)
}

impl Repository {
    /// An empty repository; [`Repository::reload`] loads it.
    pub fn new(config: RepositoryConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            config,
            metrics,
            models: RwLock::default(),
            scanned: AtomicBool::new(false),
            reload_lock: Mutex::new(()),
        }
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

    /// Ready: the first scan has finished and every model serves a version.
    pub fn ready(&self) -> bool {
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
        // Unload models whose directory is gone.
        let names: Vec<String> = models.iter().map(|(n, _)| n.clone()).collect();
        let gone: Vec<String> = self
            .models
            .read()
            .expect("repository lock")
            .keys()
            .filter(|k| !names.contains(k))
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
            let versions: BTreeMap<u64, PathBuf> = match subdirs(&dir) {
                Ok(v) => v
                    .into_iter()
                    .filter_map(|(n, p)| n.parse::<u64>().ok().map(|v| (v, p)))
                    .collect(),
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
                    let old = slot.swap(Some(Arc::new(loaded)));
                    let m = &slot.metrics;
                    m.loaded_version.store(version as i64, Ordering::Relaxed);
                    m.ready.store(true, Ordering::Relaxed);
                    m.reloads.fetch_add(1, Ordering::Relaxed);
                    {
                        let mut st = slot.state.lock().expect("slot lock");
                        st.failed.remove(&version);
                        st.last_error = None;
                    }
                    tracing::info!(
                        model = %slot.name,
                        version,
                        previous = ?old.as_ref().map(|o| o.version),
                        elapsed = ?t0.elapsed(),
                        "version loaded, warmed and serving"
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
                        serving = ?served,
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
        let engine = self.config.engine.clone();
        let threads = self.config.batcher.threads_per_instance;
        let spec_for = spec.clone();
        let buckets = super::model::buckets(self.config.batcher.max_batch_size);
        let factory = Arc::new(move || build_instance(&spec_for, &engine, threads, &buckets));
        let mm = self.metrics.model(model);
        let vm = mm.version(version);
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
