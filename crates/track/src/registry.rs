//! The run registry: every `kiln train` run in a database, an embedded SQLite file (the
//! default) or a shared PostgreSQL server (`--registry postgres://…`).
//!
//! A run is registered when it starts (`running`), gets one row per epoch as it trains, and
//! is updated when it ends (`finished`, or `failed` with the reason). While it runs, a
//! background thread refreshes its heartbeat every [`HEARTBEAT_PERIOD`] (30 s). A row left
//! `running` by a run that is gone is marked `killed` by whoever looks next (the next run to
//! start, `kiln runs …`, `kiln sweep run`): on the same host when its process no longer exists
//! (PID and process start time), on any host when its heartbeat is older than
//! [`HEARTBEAT_TIMEOUT`] (120 s; hosts' clocks must agree to well within that, as NTP gives).
//! SQLite is in WAL mode with a busy timeout, so several processes (a sweep's parallel runs,
//! a cron job and a developer) can write at once without losing rows; PostgreSQL lets pods on
//! different machines share one registry.
//!
//! Both backends share every statement and migration (see [`backend`] for the few places
//! they differ).

pub mod backend;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use backend::{Db, DbError, Location, Value};

use crate::promotion::{PromotionDecision, PromotionDetails};
use crate::records::metrics::{LatencyReport, ManifestMetrics};
use crate::records::{EpochRecord, RunEnvironment, RunState};

/// How often a running run refreshes its heartbeat.
pub const HEARTBEAT_PERIOD: Duration = Duration::from_secs(30);

/// A `running` row whose heartbeat is older than this is reaped as `killed` (from any host).
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors from the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The database failed.
    #[error("registry {path}: {source}")]
    Sql {
        /// The database file, or the server's URL without its password.
        path: PathBuf,
        /// The underlying error.
        source: DbError,
    },
    /// The directory could not be created.
    #[error("registry {path}: {source}")]
    Io {
        /// The database file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// No run matches an id (prefix).
    #[error("no run matches {0:?} (see `kiln runs list`)")]
    NotFound(String),
    /// An id prefix matches several runs.
    #[error("{0:?} matches several runs: {1}")]
    Ambiguous(String, String),
    /// A stored value this release cannot read (a status word it does not know: corrupt, or
    /// written by a later release).
    #[error("registry {path}: table {table}, row {row}, column {column}: {message}")]
    Unreadable {
        /// The database file, or the server's URL without its password.
        path: PathBuf,
        /// The table.
        table: &'static str,
        /// The row's id.
        row: String,
        /// The column.
        column: &'static str,
        /// What is wrong with the value.
        message: String,
    },
}

/// The schema, one migration per version (written once for both backends: SQLite type names,
/// which [`backend::pg_ddl`] maps for PostgreSQL).
const MIGRATIONS: &[&str] = &[
    // v1
    "CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        status TEXT NOT NULL,
        reason TEXT,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        pid_start INTEGER,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        run_dir TEXT NOT NULL,
        config_text TEXT NOT NULL,
        config_sha256 TEXT NOT NULL,
        git_commit TEXT,
        dataset_sha256 TEXT,
        param_count INTEGER,
        artifact_path TEXT,
        environment TEXT,
        final_metrics TEXT,
        val_metric REAL,
        latency TEXT,
        latency_b1_p50_us REAL,
        latency_b128_p50_us REAL
    );
    CREATE TABLE epochs (
        run_id TEXT NOT NULL REFERENCES runs(id),
        stage INTEGER NOT NULL,
        stage_name TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        steps INTEGER NOT NULL,
        train_loss REAL,
        val_loss REAL,
        lr REAL,
        grad_norm_mean REAL,
        grad_norm_max REAL,
        clipped_frac REAL,
        samples_per_s REAL,
        data_wait_frac REAL,
        PRIMARY KEY (run_id, stage, epoch)
    );
    CREATE INDEX runs_started ON runs(started_at);",
    // v2: the epoch's time split (rows written before v2 read back as NaN, shown as null).
    "ALTER TABLE epochs ADD COLUMN data_wait_s REAL;
    ALTER TABLE epochs ADD COLUMN compute_s REAL;
    ALTER TABLE epochs ADD COLUMN validation_s REAL;",
    // v3: heartbeats (liveness across hosts) and the members of indexed sweeps.
    "ALTER TABLE runs ADD COLUMN heartbeat_at REAL;
    CREATE TABLE sweep_members (
        sweep_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        run_dir TEXT NOT NULL,
        claimed_at TEXT NOT NULL,
        PRIMARY KEY (sweep_id, idx)
    );",
    // v4: `kiln promote` decisions (self-contained: one table, one index).
    "CREATE TABLE promotions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        repository TEXT NOT NULL,
        model TEXT NOT NULL,
        candidate TEXT NOT NULL,
        run_id TEXT,
        incumbent_version INTEGER,
        version INTEGER,
        decision TEXT NOT NULL,
        details TEXT NOT NULL
    );
    CREATE INDEX promotions_model ON promotions(model, id);",
];

/// One `kiln promote` decision as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromotionRow {
    /// Row id (ignored when recording).
    pub id: i64,
    /// When it was decided (RFC 3339).
    pub at: String,
    /// The model repository root.
    pub repository: String,
    /// The model name.
    pub model: String,
    /// The candidate's export directory.
    pub candidate: String,
    /// The run that produced the candidate.
    pub run_id: Option<String>,
    /// The served version it was compared with.
    pub incumbent_version: Option<i64>,
    /// The version written (None when refused).
    pub version: Option<i64>,
    /// Promoted, refused, nothing to do, or (while its version is being installed, or when
    /// that failed) installing, abandoned.
    pub decision: PromotionDecision,
    /// The numbers: checks, measurements, gates, the promoter's process (serialised with its
    /// keys in alphabetical order, as stored).
    #[serde(serialize_with = "sorted_keys")]
    pub details: PromotionDetails,
}

/// A record serialised as a JSON object with its keys in alphabetical order (what the
/// registry stores and `kiln runs promotions --json` has always printed).
fn sorted_keys<T: Serialize, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(v)
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    /// Run id.
    pub id: String,
    /// Config name.
    pub name: String,
    /// Running, finished, failed or killed.
    pub status: RunState,
    /// Why it failed or was killed.
    pub reason: Option<String>,
    /// Host that ran it.
    pub host: String,
    /// Process id.
    pub pid: i64,
    /// Start time (RFC 3339).
    pub started_at: String,
    /// End time.
    pub ended_at: Option<String>,
    /// Run directory.
    pub run_dir: String,
    /// The effective config.
    pub config_text: String,
    /// Its SHA-256.
    pub config_sha256: String,
    /// `git rev-parse HEAD` where the run started, when inside a repository.
    pub git_commit: Option<String>,
    /// Dataset SHA-256.
    pub dataset_sha256: Option<String>,
    /// Parameter count.
    pub param_count: Option<i64>,
    /// Export directory.
    pub artifact_path: Option<String>,
    /// Versions, CPU, threads, backend, device.
    pub environment: Option<RunEnvironment>,
    /// Final metrics (the exported checkpoint's manifest's).
    pub final_metrics: Option<ManifestMetrics>,
    /// The validation metric used for right-sizing (stage-1 best validation loss).
    pub val_metric: Option<f64>,
    /// Latency measurements.
    pub latency: Option<LatencyReport>,
    /// Batch-1 median latency, µs.
    pub latency_b1_p50_us: Option<f64>,
    /// Batch-128 median latency, µs.
    pub latency_b128_p50_us: Option<f64>,
    /// Last heartbeat (Unix seconds) while running.
    pub heartbeat_at: Option<f64>,
}

/// The columns of [`RunRow`], in the order [`Registry::row`] reads them.
const RUN_COLUMNS: &str = "id, name, status, reason, host, pid, started_at, ended_at, run_dir, \
    config_text, config_sha256, git_commit, dataset_sha256, param_count, artifact_path, \
    environment, final_metrics, val_metric, latency, latency_b1_p50_us, latency_b128_p50_us, \
    heartbeat_at";

/// A member of an indexed sweep as claimed in the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepMemberRow {
    /// The sweep's id.
    pub sweep_id: String,
    /// Position in the sweep's expansion.
    pub index: i64,
    /// The run that holds the member.
    pub run_id: String,
    /// Its run directory.
    pub run_dir: String,
    /// When it was claimed (RFC 3339).
    pub claimed_at: String,
}

pub use crate::records::{NewRun, RunEnd};

/// The registry.
pub struct Registry {
    // First: dropped (its thread stopped) before the main connection closes.
    heartbeat: Mutex<Option<Heartbeat>>,
    db: Db,
    location: Location,
    path: PathBuf,
}

/// The background thread refreshing one run's heartbeat over its own connection.
struct Heartbeat {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    fn start(location: Location, run_id: String) -> Self {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kiln-heartbeat".into())
            .spawn(move || {
                let period = heartbeat_period();
                let mut db = Db::connect(&location);
                let (lock, cvar) = &*flag;
                let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                let mut failing = false;
                loop {
                    // Checked before waiting: a stop that came while connecting is not missed.
                    if *stopped {
                        break;
                    }
                    let (guard, _) = cvar
                        .wait_timeout(stopped, period)
                        .unwrap_or_else(|p| p.into_inner());
                    stopped = guard;
                    if *stopped {
                        break;
                    }
                    // A connection that could not be opened is tried again at every beat (a
                    // PostgreSQL connection lost later reopens itself, see `backend::PgConn`).
                    if db.is_err() {
                        db = Db::connect(&location);
                    }
                    let beat = db
                        .as_ref()
                        .map_err(|e| e.to_string())
                        .and_then(|db| beat(db, &run_id).map_err(|e| e.to_string()));
                    match beat {
                        Err(e) if !failing => {
                            failing = true;
                            tracing::warn!("run registry heartbeat of {run_id}: {e}");
                        }
                        Err(_) => {}
                        Ok(revived) => {
                            if failing {
                                tracing::info!("run registry heartbeat of {run_id}: back");
                            }
                            failing = false;
                            if revived {
                                tracing::warn!(
                                    "run registry: run {run_id} had been marked killed while it was still training (no heartbeat reached the registry for a while); it is marked running again"
                                );
                            }
                        }
                    }
                }
            })
            .ok();
        Self { stop, thread }
    }
}

/// The heartbeat period: [`HEARTBEAT_PERIOD`], or `KILN_HEARTBEAT_PERIOD_S` seconds when set
/// (shorter in tests; a value that is not a positive number is ignored).
fn heartbeat_period() -> Duration {
    std::env::var("KILN_HEARTBEAT_PERIOD_S")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(HEARTBEAT_PERIOD, |s| Duration::from_secs_f64(s.min(3600.0)))
}

/// One heartbeat of `run_id` from its own, live process. A row that another host's reaper
/// marked `killed` while this process could not reach the registry (the heartbeat is the only
/// sign of life it sees) is marked `running` again: the process beating is the proof.
/// Returns whether the row was revived.
fn beat(db: &Db, run_id: &str) -> Result<bool, DbError> {
    let now = crate::util::unix_now();
    let running = RunState::Running.as_str();
    let n = db.execute(
        "UPDATE runs SET heartbeat_at = ?2 WHERE id = ?1 AND status = ?3",
        &[run_id.into(), now.into(), running.into()],
    )?;
    if n > 0 {
        return Ok(false);
    }
    let pid = i64::from(std::process::id());
    let revived = db.execute(
        "UPDATE runs SET status = ?3, reason = NULL, ended_at = NULL, heartbeat_at = ?2
         WHERE id = ?1 AND status = ?4 AND host = ?5 AND pid = ?6",
        &[
            run_id.into(),
            now.into(),
            running.into(),
            RunState::Killed.as_str().into(),
            hostname().into(),
            pid.into(),
        ],
    )?;
    Ok(revived > 0)
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        let (lock, cvar) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cvar.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub use crate::util::{hostname, process_alive, process_start};

/// The git commit of the working directory (`-dirty` appended for a dirty tree), when inside
/// a repository.
pub fn git_commit() -> Option<String> {
    crate::util::git_commit().map(|c| c.describe())
}

/// The WAL file of a database (`<db>-wal`).
fn wal_file(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// A path as the path part of an SQLite `file:` URI (bytes outside a safe set %-escaped).
fn uri_path(path: &Path) -> String {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = String::new();
    for &b in abs.to_string_lossy().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A time column: NaN for rows recorded before the column existed (JSON `null`).
fn seconds(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::NAN)
}

/// A record as the JSON text of a registry column.
fn json_text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("a record serialises")
}

impl Registry {
    /// Open (creating and migrating as needed) the registry at `path`: an SQLite file, or —
    /// when the path is a URL — `sqlite:///file` or `postgres://…` (see [`Location::parse`]).
    pub fn open(path: &Path) -> Result<Self, RegistryError> {
        Self::open_location(Location::from_path(path))
    }

    /// Open (creating and migrating as needed) the registry at `location`.
    pub fn open_location(location: Location) -> Result<Self, RegistryError> {
        let shown = PathBuf::from(location.display());
        if let Location::Sqlite(path) = &location
            && let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent).map_err(|source| RegistryError::Io {
                path: shown.clone(),
                source,
            })?;
        }
        let sql = |source| RegistryError::Sql {
            path: shown.clone(),
            source,
        };
        let mut db = Db::connect(&location).map_err(sql)?;
        db.migrate(MIGRATIONS).map_err(sql)?;
        Ok(Self {
            db,
            location,
            path: shown,
            heartbeat: Mutex::new(None),
        })
    }

    /// Open for reading only: no migration, no write to the database. For SQLite, SQLite may
    /// still create its `-shm`/`-wal` companions where the directory allows, as for any WAL
    /// reader; on a read-only mount, when SQLite cannot set up WAL shared memory there (no
    /// `-shm` file and no way to create one), the database is opened as immutable, which is
    /// exact because a cleanly closed WAL database has no `-wal` content left (with a
    /// non-empty `-wal` the open fails rather than miss rows). For PostgreSQL, the session is
    /// read-only. For the read-only commands (`kiln runs …`).
    pub fn open_read_only(path: &Path) -> Result<Self, RegistryError> {
        let location = Location::from_path(path);
        let shown = PathBuf::from(location.display());
        let sql = |source| RegistryError::Sql {
            path: shown.clone(),
            source,
        };
        let db = match &location {
            Location::Postgres(url) => Db::connect_pg_read_only(url).map_err(sql)?,
            Location::Sqlite(file) if !file.is_file() => {
                return Err(RegistryError::Io {
                    path: shown,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no such registry file",
                    ),
                });
            }
            Location::Sqlite(file) => Self::sqlite_read_only(file).map_err(sql)?,
        };
        let reg = Self {
            db,
            location,
            path: shown.clone(),
            heartbeat: Mutex::new(None),
        };
        let version = reg.schema_version()?;
        if version != MIGRATIONS.len() as i64 {
            return Err(RegistryError::Io {
                path: shown,
                source: std::io::Error::other(format!(
                    "schema version {version}, this kiln reads version {}; open it once with a kiln that may write to it (e.g. `kiln train`) to migrate",
                    MIGRATIONS.len()
                )),
            });
        }
        Ok(reg)
    }

    fn sqlite_read_only(path: &Path) -> Result<Db, DbError> {
        use rusqlite::{Connection, OpenFlags};
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let check = |conn: Connection| -> Result<Connection, rusqlite::Error> {
            conn.busy_timeout(Duration::from_secs(30))?;
            let _: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            Ok(conn)
        };
        match Connection::open_with_flags(path, flags).and_then(check) {
            Ok(conn) => Ok(Db::Sqlite(conn)),
            Err(first) => {
                let wal = wal_file(path);
                if wal.metadata().is_ok_and(|m| m.len() > 0) {
                    // Immutable mode would ignore the committed rows still in the WAL.
                    return Err(first.into());
                }
                let uri = format!("file:{}?immutable=1", uri_path(path));
                Connection::open_with_flags(&uri, flags)
                    .and_then(check)
                    .map(Db::Sqlite)
                    .map_err(|_| first.into())
            }
        }
    }

    /// Where this registry lives.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The open connection, for statements beyond this API (tests planting rows, tools).
    pub fn db(&self) -> &Db {
        &self.db
    }

    fn err(&self) -> impl Fn(DbError) -> RegistryError + '_ {
        move |source| RegistryError::Sql {
            path: self.path.clone(),
            source,
        }
    }

    fn execute(&self, sql: &str, params: &[Value]) -> Result<usize, RegistryError> {
        self.db.execute(sql, params).map_err(self.err())
    }

    fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, RegistryError> {
        self.db.query(sql, params).map_err(self.err())
    }

    /// The schema version.
    pub fn schema_version(&self) -> Result<i64, RegistryError> {
        self.db.schema_version().map_err(self.err())
    }

    /// Mark `running` rows whose run is gone as `killed`: on this host, when the process no
    /// longer exists; on any host, when the heartbeat is older than [`HEARTBEAT_TIMEOUT`].
    /// Returns how many.
    pub fn reap_stale(&self) -> Result<usize, RegistryError> {
        self.reap_stale_at(crate::util::unix_now(), HEARTBEAT_TIMEOUT)
    }

    /// [`Registry::reap_stale`] as of `now` (Unix seconds) with a given heartbeat timeout.
    pub fn reap_stale_at(&self, now: f64, timeout: Duration) -> Result<usize, RegistryError> {
        let host = hostname();
        let rows = self.query(
            "SELECT id, host, pid, pid_start, heartbeat_at, run_dir FROM runs WHERE status = ?1",
            &[RunState::Running.as_str().into()],
        )?;
        let mut n = 0;
        for row in rows {
            let id = row[0].text().unwrap_or_default();
            let run_host = row[1].text().unwrap_or_default();
            let pid = row[2].int().unwrap_or(0);
            let beat = row[4].real();
            let reason = if run_host == host {
                // Same host: the process table is the truth (a live process is alive even
                // when its heartbeat lags; a gone one is dead even with a fresh heartbeat).
                (!process_alive(pid, row[3].int()))
                    .then(|| format!("process {pid} on {host} disappeared without finishing"))
            } else {
                beat.filter(|b| now - b > timeout.as_secs_f64()).map(|b| {
                    format!(
                        "no heartbeat from process {pid} on {run_host} for {:.0} s (timeout {} s)",
                        now - b,
                        timeout.as_secs()
                    )
                })
            };
            if let Some(reason) = reason {
                if run_host == host {
                    // The run's own run.json says `running` too: mark it as well.
                    let dir = crate::records::RunDir {
                        id: id.clone(),
                        path: PathBuf::from(row[5].text().unwrap_or_default()),
                    };
                    if let Err(e) = dir.mark_if_abandoned() {
                        tracing::warn!(
                            "{}: cannot mark the run abandoned: {e}",
                            dir.path.display()
                        );
                    }
                }
                n += self.execute(
                    "UPDATE runs SET status = ?4, reason = ?2, ended_at = ?3
                     WHERE id = ?1 AND status = ?5",
                    &[
                        id.into(),
                        reason.into(),
                        crate::util::rfc3339(crate::util::unix_now()).into(),
                        RunState::Killed.as_str().into(),
                        RunState::Running.as_str().into(),
                    ],
                )?;
            }
        }
        Ok(n)
    }

    /// Register a starting run (or re-register a resumed one as running), and start its
    /// heartbeat.
    pub fn start_run(&self, r: &NewRun<'_>) -> Result<(), RegistryError> {
        let pid = std::process::id();
        self.execute(
            "INSERT INTO runs (id, name, status, host, pid, pid_start, started_at, run_dir,
                               config_text, config_sha256, git_commit, environment, heartbeat_at)
             VALUES (?1, ?2, ?13, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
             ON CONFLICT(id) DO UPDATE SET status = excluded.status, reason = NULL, ended_at = NULL,
                 host = excluded.host, pid = excluded.pid, pid_start = excluded.pid_start,
                 heartbeat_at = excluded.heartbeat_at",
            &[
                r.id.into(),
                r.name.into(),
                hostname().into(),
                i64::from(pid).into(),
                process_start(pid).into(),
                r.started_at.into(),
                r.run_dir.display().to_string().into(),
                r.config_text.into(),
                r.config_sha256.into(),
                git_commit().into(),
                r.environment.to_json_line().into(),
                crate::util::unix_now().into(),
                RunState::Running.as_str().into(),
            ],
        )?;
        let mut hb = self.heartbeat.lock().unwrap_or_else(|p| p.into_inner());
        *hb = Some(Heartbeat::start(self.location.clone(), r.id.to_string()));
        Ok(())
    }

    /// Record one epoch (idempotent per run, stage and epoch).
    pub fn log_epoch(&self, run_id: &str, e: &EpochRecord) -> Result<(), RegistryError> {
        self.execute(
            "INSERT INTO epochs (run_id, stage, stage_name, epoch, steps, train_loss,
                 val_loss, lr, grad_norm_mean, grad_norm_max, clipped_frac, samples_per_s, data_wait_frac,
                 data_wait_s, compute_s, validation_s)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
             ON CONFLICT(run_id, stage, epoch) DO UPDATE SET stage_name = excluded.stage_name,
                 steps = excluded.steps, train_loss = excluded.train_loss,
                 val_loss = excluded.val_loss, lr = excluded.lr,
                 grad_norm_mean = excluded.grad_norm_mean, grad_norm_max = excluded.grad_norm_max,
                 clipped_frac = excluded.clipped_frac, samples_per_s = excluded.samples_per_s,
                 data_wait_frac = excluded.data_wait_frac, data_wait_s = excluded.data_wait_s,
                 compute_s = excluded.compute_s, validation_s = excluded.validation_s",
            &[
                run_id.into(),
                (e.stage as i64).into(),
                e.stage_name.as_str().into(),
                (e.epoch as i64).into(),
                (e.steps as i64).into(),
                e.train_loss.into(),
                e.val_loss.into(),
                e.lr.into(),
                e.grad_norm_mean.into(),
                e.grad_norm_max.into(),
                e.clipped_frac.into(),
                e.samples_per_s.into(),
                e.data_wait_frac.into(),
                e.data_wait_s.into(),
                e.compute_s.into(),
                e.validation_s.into(),
            ],
        )?;
        Ok(())
    }

    /// Record how a run ended (and stop its heartbeat).
    pub fn finish_run(&self, run_id: &str, end: &RunEnd) -> Result<(), RegistryError> {
        self.heartbeat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        self.execute(
            "UPDATE runs SET status = ?2, reason = ?3, ended_at = ?4,
                 dataset_sha256 = COALESCE(?5, dataset_sha256), param_count = COALESCE(?6, param_count),
                 artifact_path = COALESCE(?7, artifact_path), final_metrics = COALESCE(?8, final_metrics),
                 val_metric = COALESCE(?9, val_metric), latency = COALESCE(?10, latency),
                 latency_b1_p50_us = COALESCE(?11, latency_b1_p50_us),
                 latency_b128_p50_us = COALESCE(?12, latency_b128_p50_us)
             WHERE id = ?1",
            &[
                run_id.into(),
                end.status.as_str().into(),
                end.reason.as_deref().into(),
                crate::util::rfc3339(crate::util::unix_now()).into(),
                end.dataset_sha256.as_deref().into(),
                end.param_count.into(),
                end.artifact_path.as_deref().into(),
                end.final_metrics.as_ref().map(json_text).into(),
                end.val_metric.into(),
                end.latency.as_ref().map(json_text).into(),
                end.latency_b1_p50_us.into(),
                end.latency_b128_p50_us.into(),
            ],
        )?;
        Ok(())
    }

    /// A JSON column as its record: absent when NULL; absent too, with a warning naming the
    /// table, row and column, when it does not parse as one (earlier releases read such a
    /// value as absent, silently).
    fn json_column<T: serde::de::DeserializeOwned>(
        &self,
        text: Option<String>,
        table: &str,
        row: &str,
        column: &str,
    ) -> Option<T> {
        let text = text?;
        match serde_json::from_str(&text) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(
                    "registry {}: table {table}, row {row}, column {column}: {e} (read as absent)",
                    self.path.display()
                );
                None
            }
        }
    }

    /// A stored word (a status, a decision) as its type.
    fn word<T: std::str::FromStr<Err = String>>(
        &self,
        text: Option<String>,
        table: &'static str,
        row: &str,
        column: &'static str,
    ) -> Result<T, RegistryError> {
        text.unwrap_or_default()
            .parse()
            .map_err(|message| RegistryError::Unreadable {
                path: self.path.clone(),
                table,
                row: row.to_string(),
                column,
                message,
            })
    }

    fn row(&self, r: &[Value]) -> Result<RunRow, RegistryError> {
        let text = |i: usize| r[i].text();
        let id = text(0).unwrap_or_default();
        Ok(RunRow {
            name: text(1).unwrap_or_default(),
            status: self.word(text(2), "runs", &id, "status")?,
            reason: text(3),
            host: text(4).unwrap_or_default(),
            pid: r[5].int().unwrap_or(0),
            started_at: text(6).unwrap_or_default(),
            ended_at: text(7),
            run_dir: text(8).unwrap_or_default(),
            config_text: text(9).unwrap_or_default(),
            config_sha256: text(10).unwrap_or_default(),
            git_commit: text(11),
            dataset_sha256: text(12),
            param_count: r[13].int(),
            artifact_path: text(14),
            environment: self.json_column(text(15), "runs", &id, "environment"),
            final_metrics: self.json_column(text(16), "runs", &id, "final_metrics"),
            val_metric: r[17].real(),
            latency: self.json_column(text(18), "runs", &id, "latency"),
            latency_b1_p50_us: r[19].real(),
            latency_b128_p50_us: r[20].real(),
            heartbeat_at: r[21].real(),
            id,
        })
    }

    /// All runs, oldest first.
    pub fn list(&self) -> Result<Vec<RunRow>, RegistryError> {
        self.query(
            &format!("SELECT {RUN_COLUMNS} FROM runs ORDER BY started_at, id"),
            &[],
        )?
        .iter()
        .map(|r| self.row(r))
        .collect()
    }

    /// The run whose id is `id` or starts with it (unique prefix).
    pub fn get(&self, id: &str) -> Result<RunRow, RegistryError> {
        if let Some(r) = self
            .query(
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
                &[id.into()],
            )?
            .first()
        {
            return self.row(r);
        }
        let escaped = id
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        let rows = self
            .query(
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id LIKE ?1 ESCAPE '\\' ORDER BY id"),
                &[format!("{escaped}%").into()],
            )?
            .iter()
            .map(|r| self.row(r))
            .collect::<Result<Vec<RunRow>, _>>()?;
        match rows.len() {
            0 => Err(RegistryError::NotFound(id.to_string())),
            1 => Ok(rows.into_iter().next().expect("one")),
            _ => Err(RegistryError::Ambiguous(
                id.to_string(),
                rows.iter()
                    .map(|r| r.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
        }
    }

    /// Record a promotion decision; returns its row id.
    pub fn record_promotion(&self, p: &PromotionRow) -> Result<i64, RegistryError> {
        let rows = self.query(
            "INSERT INTO promotions (at, repository, model, candidate, run_id,
                 incumbent_version, version, decision, details)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) RETURNING id",
            &[
                (&p.at).into(),
                (&p.repository).into(),
                (&p.model).into(),
                (&p.candidate).into(),
                p.run_id.as_deref().into(),
                p.incumbent_version.into(),
                p.version.into(),
                p.decision.as_str().into(),
                p.details.to_json_text().into(),
            ],
        )?;
        Ok(rows
            .first()
            .and_then(|r| r.first())
            .and_then(Value::int)
            .unwrap_or(0))
    }

    /// Set a recorded promotion's decision, version and details (a promotion is recorded as
    /// `installing` before its version is renamed into place, then settled).
    pub fn settle_promotion(
        &self,
        id: i64,
        decision: PromotionDecision,
        version: Option<i64>,
        details: &PromotionDetails,
    ) -> Result<(), RegistryError> {
        self.execute(
            "UPDATE promotions SET decision = ?1, version = ?2, details = ?3 WHERE id = ?4",
            &[
                decision.as_str().into(),
                version.into(),
                details.to_json_text().into(),
                id.into(),
            ],
        )?;
        Ok(())
    }

    /// Promotion decisions, oldest first; of one model when `model` is given.
    pub fn promotions(&self, model: Option<&str>) -> Result<Vec<PromotionRow>, RegistryError> {
        const COLUMNS: &str = "SELECT id, at, repository, model, candidate, run_id,
                incumbent_version, version, decision, details FROM promotions";
        let rows = match model {
            Some(m) => self.query(
                &format!("{COLUMNS} WHERE model = ?1 ORDER BY id"),
                &[m.into()],
            )?,
            None => self.query(&format!("{COLUMNS} ORDER BY id"), &[])?,
        };
        rows.iter()
            .map(|r| {
                let id = r[0].int().unwrap_or(0);
                let row = id.to_string();
                Ok(PromotionRow {
                    id,
                    at: r[1].text().unwrap_or_default(),
                    repository: r[2].text().unwrap_or_default(),
                    model: r[3].text().unwrap_or_default(),
                    candidate: r[4].text().unwrap_or_default(),
                    run_id: r[5].text(),
                    incumbent_version: r[6].int(),
                    version: r[7].int(),
                    decision: self.word(r[8].text(), "promotions", &row, "decision")?,
                    details: self
                        .json_column(r[9].text(), "promotions", &row, "details")
                        .unwrap_or_default(),
                })
            })
            .collect()
    }

    /// A run's epochs in order.
    pub fn epochs(&self, run_id: &str) -> Result<Vec<EpochRecord>, RegistryError> {
        let rows = self.query(
            "SELECT stage, stage_name, epoch, steps, train_loss, val_loss, lr, grad_norm_mean,
                    grad_norm_max, clipped_frac, samples_per_s, data_wait_frac,
                    data_wait_s, compute_s, validation_s
             FROM epochs WHERE run_id = ?1 ORDER BY stage, epoch",
            &[run_id.into()],
        )?;
        let f = |v: &Value| v.real().unwrap_or(f64::NAN);
        Ok(rows
            .iter()
            .map(|r| EpochRecord {
                stage: r[0].int().unwrap_or(0) as usize,
                stage_name: r[1].text().unwrap_or_default(),
                epoch: r[2].int().unwrap_or(0) as usize,
                steps: r[3].int().unwrap_or(0) as u64,
                train_loss: f(&r[4]),
                val_loss: f(&r[5]),
                lr: f(&r[6]),
                grad_norm_mean: f(&r[7]),
                grad_norm_max: f(&r[8]),
                clipped_frac: f(&r[9]),
                samples_per_s: f(&r[10]),
                data_wait_frac: f(&r[11]),
                data_wait_s: seconds(r[12].real()),
                compute_s: seconds(r[13].real()),
                validation_s: seconds(r[14].real()),
                phase_s: Default::default(),
            })
            .collect())
    }

    /// The run holding member `index` of sweep `sweep_id`, when one was claimed.
    pub fn sweep_member(
        &self,
        sweep_id: &str,
        index: usize,
    ) -> Result<Option<SweepMemberRow>, RegistryError> {
        Ok(self
            .query(
                "SELECT sweep_id, idx, run_id, run_dir, claimed_at FROM sweep_members
                 WHERE sweep_id = ?1 AND idx = ?2",
                &[sweep_id.into(), (index as i64).into()],
            )?
            .first()
            .map(|r| SweepMemberRow {
                sweep_id: r[0].text().unwrap_or_default(),
                index: r[1].int().unwrap_or(0),
                run_id: r[2].text().unwrap_or_default(),
                run_dir: r[3].text().unwrap_or_default(),
                claimed_at: r[4].text().unwrap_or_default(),
            }))
    }

    /// Claim member `index` of sweep `sweep_id` for `run_id` (in `run_dir`): when `previous`
    /// is `None` the member must be unclaimed, otherwise it must still be held by `previous`
    /// (a compare-and-swap, so two processes never both start the same member). Returns
    /// whether the claim succeeded.
    pub fn claim_sweep_member(
        &self,
        sweep_id: &str,
        index: usize,
        run_id: &str,
        run_dir: &Path,
        previous: Option<&str>,
    ) -> Result<bool, RegistryError> {
        let now = crate::util::rfc3339(crate::util::unix_now());
        let dir = run_dir.display().to_string();
        let n = match previous {
            None => self.execute(
                "INSERT INTO sweep_members (sweep_id, idx, run_id, run_dir, claimed_at)
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT(sweep_id, idx) DO NOTHING",
                &[
                    sweep_id.into(),
                    (index as i64).into(),
                    run_id.into(),
                    dir.into(),
                    now.into(),
                ],
            )?,
            Some(prev) => self.execute(
                "UPDATE sweep_members SET run_id = ?3, run_dir = ?4, claimed_at = ?5
                 WHERE sweep_id = ?1 AND idx = ?2 AND run_id = ?6",
                &[
                    sweep_id.into(),
                    (index as i64).into(),
                    run_id.into(),
                    dir.into(),
                    now.into(),
                    prev.into(),
                ],
            )?,
        };
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_run<'a>(id: &'a str, dir: &'a Path) -> NewRun<'a> {
        NewRun {
            id,
            name: "t",
            run_dir: dir,
            config_text: "name: t\n",
            config_sha256: "abc",
            started_at: "2026-11-29T00:00:00Z",
            environment: crate::records::RunEnvironment {
                burn: "0.21.0".into(),
                ..Default::default()
            },
        }
    }

    fn epoch(stage: usize, e: usize) -> EpochRecord {
        EpochRecord {
            stage,
            stage_name: "mean".into(),
            epoch: e,
            steps: 10,
            train_loss: 0.5,
            val_loss: 0.4,
            lr: 1e-3,
            grad_norm_mean: 0.3,
            grad_norm_max: 0.9,
            clipped_frac: 0.0,
            samples_per_s: 1e5,
            data_wait_frac: 0.1,
            data_wait_s: 0.25 + e as f64,
            compute_s: 2.25,
            validation_s: 0.125,
            phase_s: Default::default(),
        }
    }

    #[test]
    fn round_trip_and_migration_from_an_empty_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/runs.db");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"").unwrap(); // an empty file is a valid, empty database
        let reg = Registry::open(&path).unwrap();
        assert_eq!(reg.schema_version().unwrap(), MIGRATIONS.len() as i64);
        reg.start_run(&new_run("r-1", dir.path())).unwrap();
        reg.log_epoch("r-1", &epoch(0, 0)).unwrap();
        reg.log_epoch("r-1", &epoch(0, 1)).unwrap();
        reg.log_epoch("r-1", &epoch(0, 1)).unwrap(); // idempotent
        reg.finish_run(
            "r-1",
            &RunEnd {
                status: kiln_core::records::RunState::Finished,
                param_count: Some(3654),
                val_metric: Some(0.4),
                latency_b1_p50_us: Some(1.5),
                latency: Some(kiln_core::records::metrics::LatencyReport {
                    engine: "fused".into(),
                    cpu: None,
                    batches: vec![kiln_core::records::metrics::BatchLatency {
                        batch: 1,
                        iters: 10,
                        p50_us: 1.5,
                        p95_us: 2.0,
                        p99_us: 2.5,
                    }],
                }),
                ..RunEnd::default()
            },
        )
        .unwrap();
        drop(reg);
        let reg = Registry::open(&path).unwrap(); // reopening does not re-migrate
        let r = reg.get("r-").unwrap();
        assert_eq!(r.status, "finished");
        assert_eq!(r.param_count, Some(3654));
        assert_eq!(r.latency.unwrap().batches[0].p50_us, 1.5);
        assert_eq!(r.environment.unwrap().burn, "0.21.0");
        let epochs = reg.epochs("r-1").unwrap();
        assert_eq!(
            epochs,
            vec![epoch(0, 0), epoch(0, 1)],
            "every field round-trips"
        );
        assert!(matches!(reg.get("zzz"), Err(RegistryError::NotFound(_))));
        reg.start_run(&new_run("r-2", dir.path())).unwrap();
        assert!(matches!(reg.get("r-"), Err(RegistryError::Ambiguous(..))));
    }

    #[test]
    fn read_only_opening_reads_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        assert!(
            Registry::open_read_only(&path).is_err(),
            "no file, no registry"
        );
        let reg = Registry::open(&path).unwrap();
        reg.start_run(&new_run("r-1", dir.path())).unwrap();
        reg.log_epoch("r-1", &epoch(0, 0)).unwrap();
        drop(reg);
        let bytes = std::fs::read(&path).unwrap();
        let ro = Registry::open_read_only(&path).unwrap();
        assert_eq!(ro.list().unwrap().len(), 1);
        assert_eq!(ro.epochs("r-1").unwrap().len(), 1);
        assert!(ro.start_run(&new_run("r-2", dir.path())).is_err());
        assert!(ro.reap_stale().is_ok(), "nothing to reap, nothing written");
        drop(ro);
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        let wal = wal_file(&path);
        assert!(!wal.exists() || std::fs::metadata(&wal).unwrap().len() == 0);
        // An empty file is not a registry a reader can use.
        let empty = dir.path().join("empty.db");
        std::fs::write(&empty, b"").unwrap();
        let e = Registry::open_read_only(&empty).err().unwrap().to_string();
        assert!(e.contains("schema version 0"), "{e}");
    }

    #[test]
    fn a_v1_database_gains_the_epoch_timings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            conn.execute(
                "INSERT INTO runs (id, name, status, host, pid, started_at, run_dir, config_text,
                     config_sha256) VALUES ('old', 't', 'finished', 'h', 1, 'x', '.', '', '')",
                [],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO epochs (run_id, stage, stage_name, epoch, steps, train_loss, val_loss,
                     lr, grad_norm_mean, grad_norm_max, clipped_frac, samples_per_s, data_wait_frac)
                 VALUES ('old', 0, 'mean', 0, 10, 0.5, 0.4, 0.001, 0.3, 0.9, 0.0, 1e5, 0.1)",
                [],
            )
            .unwrap();
        }
        let reg = Registry::open(&path).unwrap();
        assert_eq!(reg.schema_version().unwrap(), MIGRATIONS.len() as i64);
        let old = &reg.epochs("old").unwrap()[0];
        // Not recorded then: NaN (JSON null), never a made-up 0.
        assert!(old.data_wait_s.is_nan() && old.compute_s.is_nan() && old.validation_s.is_nan());
        assert!(serde_json::to_value(old).unwrap()["compute_s"].is_null());
        reg.start_run(&new_run("new", dir.path())).unwrap();
        reg.log_epoch("new", &epoch(1, 3)).unwrap();
        assert_eq!(reg.epochs("new").unwrap(), vec![epoch(1, 3)]);
    }

    #[test]
    fn stale_running_rows_become_killed() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(&dir.path().join("runs.db")).unwrap();
        reg.start_run(&new_run("alive", dir.path())).unwrap();
        reg.start_run(&new_run("dead", dir.path())).unwrap();
        // Pretend "dead" was started by a process that has gone.
        reg.db
            .execute("UPDATE runs SET pid = 999999999 WHERE id = 'dead'", &[])
            .unwrap();
        assert_eq!(reg.reap_stale().unwrap(), 1);
        assert_eq!(reg.get("dead").unwrap().status, "killed");
        assert!(
            reg.get("dead")
                .unwrap()
                .reason
                .unwrap()
                .contains("disappeared")
        );
        assert_eq!(reg.get("alive").unwrap().status, "running");
        // A recycled pid (same number, different start time) is not the original process.
        reg.db
            .execute(
                "UPDATE runs SET pid_start = pid_start + 1 WHERE id = 'alive'",
                &[],
            )
            .unwrap();
        assert_eq!(reg.reap_stale().unwrap(), 1);
    }

    #[test]
    fn unreadable_values_are_named_or_read_as_absent() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(&dir.path().join("runs.db")).unwrap();
        reg.start_run(&new_run("r-1", dir.path())).unwrap();
        // A JSON column that is not the record (here: a metric of the wrong type) reads as
        // absent, as an unparsable one always did; the row still lists.
        reg.db
            .execute(
                "UPDATE runs SET final_metrics = '{\"test\": {\"rows\": \"many\"}}',
                     latency = 'not json' WHERE id = 'r-1'",
                &[],
            )
            .unwrap();
        let r = reg.get("r-1").unwrap();
        assert!(r.final_metrics.is_none() && r.latency.is_none());
        assert_eq!(r.environment.unwrap().burn, "0.21.0");
        // A status this release does not know is an error naming the table, row and column.
        reg.db
            .execute("UPDATE runs SET status = 'paused' WHERE id = 'r-1'", &[])
            .unwrap();
        let e = reg.list().unwrap_err().to_string();
        assert!(
            e.contains("table runs, row r-1, column status") && e.contains("`paused`"),
            "{e}"
        );
        // Likewise a promotion's decision.
        let row = PromotionRow {
            id: 0,
            at: "2026-12-01T00:00:00Z".into(),
            repository: "/models".into(),
            model: "m".into(),
            candidate: "/x".into(),
            run_id: None,
            incumbent_version: None,
            version: None,
            decision: PromotionDecision::Refused,
            details: PromotionDetails::default(),
        };
        let id = reg.record_promotion(&row).unwrap();
        assert_eq!(reg.promotions(None).unwrap(), [PromotionRow { id, ..row }]);
        reg.db
            .execute("UPDATE promotions SET decision = 'kept'", &[])
            .unwrap();
        let e = reg.promotions(None).unwrap_err().to_string();
        assert!(
            e.contains(&format!("table promotions, row {id}, column decision")),
            "{e}"
        );
    }

    #[test]
    fn concurrent_writers_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        Registry::open(&path).unwrap();
        let handles: Vec<_> = (0..6)
            .map(|t| {
                let path = path.clone();
                let d = dir.path().to_path_buf();
                std::thread::spawn(move || {
                    let reg = Registry::open(&path).unwrap();
                    let id = format!("run-{t}");
                    reg.start_run(&new_run(&id, &d)).unwrap();
                    for e in 0..25 {
                        reg.log_epoch(&id, &epoch(0, e)).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let reg = Registry::open(&path).unwrap();
        assert_eq!(reg.list().unwrap().len(), 6);
        for t in 0..6 {
            assert_eq!(reg.epochs(&format!("run-{t}")).unwrap().len(), 25);
        }
    }
}
