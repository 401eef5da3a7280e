//! The run registry: every `kiln train` run in an embedded SQLite database.
//!
//! A run is registered when it starts (`running`), gets one row per epoch as it trains, and
//! is updated when it ends (`finished`, or `failed` with the reason). A row left `running`
//! by a process that no longer exists is marked `killed` the next time any run starts.
//! The database is in WAL mode with a busy timeout, so several processes (a sweep's parallel
//! runs, a cron job and a developer) can write at once without losing rows.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::records::EpochRecord;

/// Errors from the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// SQLite failed.
    #[error("registry {path}: {source}")]
    Sql {
        /// The database file.
        path: PathBuf,
        /// The underlying error.
        source: rusqlite::Error,
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
}

/// The schema, one migration per version (`PRAGMA user_version`).
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
    // v3: `kiln promote` decisions (self-contained: one table, one index).
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
    /// `promoted` or `refused`.
    pub decision: String,
    /// The numbers: checks, measurements, gates (JSON).
    pub details: serde_json::Value,
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    /// Run id.
    pub id: String,
    /// Config name.
    pub name: String,
    /// running / finished / failed / killed.
    pub status: String,
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
    /// Versions, CPU, threads, backend, device (JSON).
    pub environment: Option<serde_json::Value>,
    /// Final metrics (JSON).
    pub final_metrics: Option<serde_json::Value>,
    /// The validation metric used for right-sizing (stage-1 best validation loss).
    pub val_metric: Option<f64>,
    /// Latency measurements (JSON).
    pub latency: Option<serde_json::Value>,
    /// Batch-1 median latency, µs.
    pub latency_b1_p50_us: Option<f64>,
    /// Batch-128 median latency, µs.
    pub latency_b128_p50_us: Option<f64>,
}

pub use crate::records::{NewRun, RunEnd};

/// The registry.
pub struct Registry {
    conn: Connection,
    path: PathBuf,
}

/// This machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat).
pub fn process_start(pid: u32) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process that registered a run is still that process.
pub fn process_alive(pid: i64, start: Option<i64>) -> bool {
    if pid <= 0 {
        return false;
    }
    match process_start(pid as u32) {
        None => false,
        Some(s) => start.is_none_or(|st| st == s),
    }
}

/// The git commit of the working directory, when inside a repository.
pub fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let mut c = String::from_utf8(out.stdout).ok()?.trim().to_string();
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    if dirty {
        c.push_str("-dirty");
    }
    Some(c)
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

fn json_col(v: Option<String>) -> Option<serde_json::Value> {
    v.and_then(|s| serde_json::from_str(&s).ok())
}

impl Registry {
    /// Open (creating and migrating as needed).
    pub fn open(path: &Path) -> Result<Self, RegistryError> {
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent).map_err(|source| RegistryError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        }
        let sql = |source| RegistryError::Sql {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(sql)?;
        conn.busy_timeout(Duration::from_secs(30)).map_err(sql)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql)?;
        let mut reg = Self {
            conn,
            path: path.to_path_buf(),
        };
        reg.migrate()?;
        Ok(reg)
    }

    /// Open for reading only: no migration, no write to the database (SQLite may still create
    /// its `-shm`/`-wal` companions where the directory allows, as for any WAL reader). Works
    /// on a read-only mount: when SQLite cannot set up WAL shared memory there (no `-shm` file
    /// and no way to create one), the database is opened as immutable, which is exact because
    /// a cleanly closed WAL database has no `-wal` content left (with a non-empty `-wal` the
    /// open fails rather than miss rows). For the read-only commands (`kiln runs …`).
    pub fn open_read_only(path: &Path) -> Result<Self, RegistryError> {
        use rusqlite::OpenFlags;
        let sql = |source| RegistryError::Sql {
            path: path.to_path_buf(),
            source,
        };
        if !path.is_file() {
            return Err(RegistryError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such registry file"),
            });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let check = |conn: Connection| -> Result<Self, rusqlite::Error> {
            conn.busy_timeout(Duration::from_secs(30))?;
            let _: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            Ok(Self {
                conn,
                path: path.to_path_buf(),
            })
        };
        let plain = Connection::open_with_flags(path, flags).and_then(check);
        let reg = match plain {
            Ok(reg) => reg,
            Err(first) => {
                let wal = wal_file(path);
                if wal.metadata().is_ok_and(|m| m.len() > 0) {
                    // Immutable mode would ignore the committed rows still in the WAL.
                    return Err(sql(first));
                }
                let uri = format!("file:{}?immutable=1", uri_path(path));
                Connection::open_with_flags(&uri, flags)
                    .and_then(check)
                    .map_err(|_| sql(first))?
            }
        };
        let version = reg.schema_version()?;
        if version != MIGRATIONS.len() as i64 {
            return Err(RegistryError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other(format!(
                    "schema version {version}, this kiln reads version {}; open it once with a kiln that may write to it (e.g. `kiln train`) to migrate",
                    MIGRATIONS.len()
                )),
            });
        }
        Ok(reg)
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> RegistryError + '_ {
        move |source| RegistryError::Sql {
            path: self.path.clone(),
            source,
        }
    }

    /// The schema version.
    pub fn schema_version(&self) -> Result<i64, RegistryError> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(self.err())
    }

    fn migrate(&mut self) -> Result<(), RegistryError> {
        let path = self.path.clone();
        let sql = move |source| RegistryError::Sql {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(&sql)?;
        let version: i64 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(&sql)?;
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
            tx.execute_batch(m).map_err(&sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)
                .map_err(&sql)?;
        }
        tx.commit().map_err(&sql)
    }

    /// Mark `running` rows of this host whose process is gone as `killed`. Returns how many.
    pub fn reap_stale(&self) -> Result<usize, RegistryError> {
        let host = hostname();
        let mut stmt = self
            .conn
            .prepare("SELECT id, pid, pid_start FROM runs WHERE status = 'running' AND host = ?1")
            .map_err(self.err())?;
        let rows: Vec<(String, i64, Option<i64>)> = stmt
            .query_map([&host], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(self.err())?
            .collect::<Result<_, _>>()
            .map_err(self.err())?;
        let mut n = 0;
        for (id, pid, start) in rows {
            if !process_alive(pid, start) {
                n += self
                    .conn
                    .execute(
                        "UPDATE runs SET status = 'killed', reason = ?2, ended_at = ?3
                         WHERE id = ?1 AND status = 'running'",
                        params![
                            id,
                            format!("process {pid} on {host} disappeared without finishing"),
                            crate::util::rfc3339(crate::util::unix_now())
                        ],
                    )
                    .map_err(self.err())?;
            }
        }
        Ok(n)
    }

    /// Register a starting run (or re-register a resumed one as running).
    pub fn start_run(&self, r: &NewRun<'_>) -> Result<(), RegistryError> {
        let pid = std::process::id();
        self.conn
            .execute(
                "INSERT INTO runs (id, name, status, host, pid, pid_start, started_at, run_dir,
                                   config_text, config_sha256, git_commit, environment)
                 VALUES (?1, ?2, 'running', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT(id) DO UPDATE SET status = 'running', reason = NULL, ended_at = NULL,
                     host = excluded.host, pid = excluded.pid, pid_start = excluded.pid_start",
                params![
                    r.id,
                    r.name,
                    hostname(),
                    pid,
                    process_start(pid),
                    r.started_at,
                    r.run_dir.display().to_string(),
                    r.config_text,
                    r.config_sha256,
                    git_commit(),
                    r.environment.to_string(),
                ],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Record one epoch (idempotent per run, stage and epoch).
    pub fn log_epoch(&self, run_id: &str, e: &EpochRecord) -> Result<(), RegistryError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO epochs (run_id, stage, stage_name, epoch, steps, train_loss,
                     val_loss, lr, grad_norm_mean, grad_norm_max, clipped_frac, samples_per_s, data_wait_frac,
                     data_wait_s, compute_s, validation_s)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
                params![
                    run_id,
                    e.stage as i64,
                    e.stage_name,
                    e.epoch as i64,
                    e.steps as i64,
                    e.train_loss,
                    e.val_loss,
                    e.lr,
                    e.grad_norm_mean,
                    e.grad_norm_max,
                    e.clipped_frac,
                    e.samples_per_s,
                    e.data_wait_frac,
                    e.data_wait_s,
                    e.compute_s,
                    e.validation_s,
                ],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Record how a run ended.
    pub fn finish_run(&self, run_id: &str, end: &RunEnd) -> Result<(), RegistryError> {
        self.conn
            .execute(
                "UPDATE runs SET status = ?2, reason = ?3, ended_at = ?4,
                     dataset_sha256 = COALESCE(?5, dataset_sha256), param_count = COALESCE(?6, param_count),
                     artifact_path = COALESCE(?7, artifact_path), final_metrics = COALESCE(?8, final_metrics),
                     val_metric = COALESCE(?9, val_metric), latency = COALESCE(?10, latency),
                     latency_b1_p50_us = COALESCE(?11, latency_b1_p50_us),
                     latency_b128_p50_us = COALESCE(?12, latency_b128_p50_us)
                 WHERE id = ?1",
                params![
                    run_id,
                    end.status,
                    end.reason,
                    crate::util::rfc3339(crate::util::unix_now()),
                    end.dataset_sha256,
                    end.param_count,
                    end.artifact_path,
                    end.final_metrics.as_ref().map(|v| v.to_string()),
                    end.val_metric,
                    end.latency.as_ref().map(|v| v.to_string()),
                    end.latency_b1_p50_us,
                    end.latency_b128_p50_us,
                ],
            )
            .map_err(self.err())?;
        Ok(())
    }

    fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
        Ok(RunRow {
            id: r.get("id")?,
            name: r.get("name")?,
            status: r.get("status")?,
            reason: r.get("reason")?,
            host: r.get("host")?,
            pid: r.get("pid")?,
            started_at: r.get("started_at")?,
            ended_at: r.get("ended_at")?,
            run_dir: r.get("run_dir")?,
            config_text: r.get("config_text")?,
            config_sha256: r.get("config_sha256")?,
            git_commit: r.get("git_commit")?,
            dataset_sha256: r.get("dataset_sha256")?,
            param_count: r.get("param_count")?,
            artifact_path: r.get("artifact_path")?,
            environment: json_col(r.get("environment")?),
            final_metrics: json_col(r.get("final_metrics")?),
            val_metric: r.get("val_metric")?,
            latency: json_col(r.get("latency")?),
            latency_b1_p50_us: r.get("latency_b1_p50_us")?,
            latency_b128_p50_us: r.get("latency_b128_p50_us")?,
        })
    }

    /// All runs, oldest first.
    pub fn list(&self) -> Result<Vec<RunRow>, RegistryError> {
        let mut stmt = self
            .conn
            .prepare("SELECT * FROM runs ORDER BY started_at, id")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], Self::row)
            .map_err(self.err())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.err())?;
        Ok(rows)
    }

    /// The run whose id is `id` or starts with it (unique prefix).
    pub fn get(&self, id: &str) -> Result<RunRow, RegistryError> {
        if let Some(r) = self
            .conn
            .query_row("SELECT * FROM runs WHERE id = ?1", [id], Self::row)
            .optional()
            .map_err(self.err())?
        {
            return Ok(r);
        }
        let mut stmt = self
            .conn
            .prepare("SELECT * FROM runs WHERE id LIKE ?1 || '%' ESCAPE '\\' ORDER BY id")
            .map_err(self.err())?;
        let escaped = id
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        let rows: Vec<RunRow> = stmt
            .query_map([escaped], Self::row)
            .map_err(self.err())?
            .collect::<Result<_, _>>()
            .map_err(self.err())?;
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
        self.conn
            .execute(
                "INSERT INTO promotions (at, repository, model, candidate, run_id,
                     incumbent_version, version, decision, details)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    p.at,
                    p.repository,
                    p.model,
                    p.candidate,
                    p.run_id,
                    p.incumbent_version,
                    p.version,
                    p.decision,
                    p.details.to_string(),
                ],
            )
            .map_err(self.err())?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Promotion decisions, oldest first; of one model when `model` is given.
    pub fn promotions(&self, model: Option<&str>) -> Result<Vec<PromotionRow>, RegistryError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, at, repository, model, candidate, run_id, incumbent_version, version,
                        decision, details
                 FROM promotions WHERE ?1 IS NULL OR model = ?1 ORDER BY id",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map([model], |r| {
                Ok(PromotionRow {
                    id: r.get(0)?,
                    at: r.get(1)?,
                    repository: r.get(2)?,
                    model: r.get(3)?,
                    candidate: r.get(4)?,
                    run_id: r.get(5)?,
                    incumbent_version: r.get(6)?,
                    version: r.get(7)?,
                    decision: r.get(8)?,
                    details: json_col(r.get(9)?).unwrap_or(serde_json::Value::Null),
                })
            })
            .map_err(self.err())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.err())?;
        Ok(rows)
    }

    /// A run's epochs in order.
    pub fn epochs(&self, run_id: &str) -> Result<Vec<EpochRecord>, RegistryError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT stage, stage_name, epoch, steps, train_loss, val_loss, lr, grad_norm_mean,
                        grad_norm_max, clipped_frac, samples_per_s, data_wait_frac,
                        data_wait_s, compute_s, validation_s
                 FROM epochs WHERE run_id = ?1 ORDER BY stage, epoch",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map([run_id], |r| {
                Ok(EpochRecord {
                    stage: r.get::<_, i64>(0)? as usize,
                    stage_name: r.get(1)?,
                    epoch: r.get::<_, i64>(2)? as usize,
                    steps: r.get::<_, i64>(3)? as u64,
                    train_loss: r.get(4)?,
                    val_loss: r.get(5)?,
                    lr: r.get(6)?,
                    grad_norm_mean: r.get(7)?,
                    grad_norm_max: r.get(8)?,
                    clipped_frac: r.get(9)?,
                    samples_per_s: r.get(10)?,
                    data_wait_frac: r.get(11)?,
                    data_wait_s: seconds(r.get(12)?),
                    compute_s: seconds(r.get(13)?),
                    validation_s: seconds(r.get(14)?),
                })
            })
            .map_err(self.err())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.err())?;
        Ok(rows)
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
            environment: serde_json::json!({"burn": "0.21.0"}),
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
                status: "finished".into(),
                param_count: Some(3654),
                val_metric: Some(0.4),
                latency_b1_p50_us: Some(1.5),
                latency: Some(serde_json::json!({"b1": {"p50_us": 1.5}})),
                ..RunEnd::default()
            },
        )
        .unwrap();
        drop(reg);
        let reg = Registry::open(&path).unwrap(); // reopening does not re-migrate
        let r = reg.get("r-").unwrap();
        assert_eq!(r.status, "finished");
        assert_eq!(r.param_count, Some(3654));
        assert_eq!(r.latency.unwrap()["b1"]["p50_us"], 1.5);
        assert_eq!(r.environment.unwrap()["burn"], "0.21.0");
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
            let conn = Connection::open(&path).unwrap();
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
        reg.conn
            .execute("UPDATE runs SET pid = 999999999 WHERE id = 'dead'", [])
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
        reg.conn
            .execute(
                "UPDATE runs SET pid_start = pid_start + 1 WHERE id = 'alive'",
                [],
            )
            .unwrap();
        assert_eq!(reg.reap_stale().unwrap(), 1);
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
