//! The two databases behind [`super::Registry`]: an embedded SQLite file and a PostgreSQL
//! server. Everything above this module is written once: SQL uses SQLite's numbered
//! placeholders (`?1`, `?2`, …) and the portable subset both servers understand (no
//! `INSERT OR REPLACE`, `ON CONFLICT … DO UPDATE` instead; no `||` on parameters), and values
//! travel as [`Value`]. The differences live here, in one place each:
//!
//! | | SQLite | PostgreSQL |
//! |---|---|---|
//! | placeholders | `?N` | `$N` ([`pg_placeholders`]) |
//! | DDL types | `INTEGER`, `REAL` | `BIGINT`, `DOUBLE PRECISION` ([`pg_ddl`]) |
//! | schema version | `PRAGMA user_version` | table `kiln_schema` |
//! | migration lock | `BEGIN IMMEDIATE` | `pg_advisory_xact_lock` |
//! | concurrency | WAL + 30 s busy timeout | MVCC |
//!
//! A new table or method is therefore a migration string and SQL in `registry.rs`, never
//! backend code.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// A value bound to or read from a statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// An integer (SQLite INTEGER, PostgreSQL BIGINT).
    Int(i64),
    /// A float (SQLite REAL, PostgreSQL DOUBLE PRECISION).
    Real(f64),
    /// Text.
    Text(String),
}

impl Value {
    /// The integer, when the value is one.
    pub fn int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Real(f) => Some(*f as i64),
            _ => None,
        }
    }

    /// The number as a float (NULL is `None`).
    pub fn real(&self) -> Option<f64> {
        match self {
            Value::Real(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The text, when the value is some.
    pub fn text(&self) -> Option<String> {
        match self {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Real(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map(Into::into).unwrap_or(Value::Null)
    }
}

/// Where a registry lives: `sqlite:///path`, a plain path, or `postgres://…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL (`postgres://` or `postgresql://`).
    Postgres(String),
}

impl Location {
    /// Parse `--registry` / `registry.path`: `postgres://…` and `postgresql://…` are servers,
    /// `sqlite://PATH` (so `sqlite:///abs/path` and `sqlite://rel/path`) and anything else are
    /// SQLite files.
    pub fn parse(text: &str) -> Self {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Location::Postgres(text.to_string())
        } else if let Some(rest) = text.strip_prefix("sqlite://") {
            Location::Sqlite(PathBuf::from(rest))
        } else {
            Location::Sqlite(PathBuf::from(text))
        }
    }

    /// [`Location::parse`] of a path-typed argument.
    pub fn from_path(path: &Path) -> Self {
        match path.to_str() {
            Some(s) => Self::parse(s),
            None => Location::Sqlite(path.to_path_buf()),
        }
    }

    /// For messages: the file, or the URL with any password replaced by `***`.
    pub fn display(&self) -> String {
        match self {
            Location::Sqlite(p) => p.display().to_string(),
            Location::Postgres(url) => redact(url),
        }
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => match authority[..at].find(':') {
            Some(colon) => format!(
                "{}{}:***{}",
                &url[..scheme_end],
                &authority[..colon],
                &rest[at..]
            ),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// A database error of either backend.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// SQLite failed.
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL failed.
    #[error("{}", pg_message(.0))]
    Postgres(#[from] postgres::Error),
    /// A value of a type the registry does not store.
    #[error("column {0}: unsupported type {1}")]
    Type(usize, String),
}

/// PostgreSQL's own message (with detail) rather than the crate's bare "db error".
fn pg_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(d) => format!("{}: {} ({d})", db.severity(), db.message()),
            None => format!("{}: {}", db.severity(), db.message()),
        },
        None => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                s.push_str(": ");
                s.push_str(&inner.to_string());
                src = inner.source();
            }
            s
        }
    }
}

/// One open connection.
pub enum Db {
    /// SQLite (WAL, 30 s busy timeout).
    Sqlite(rusqlite::Connection),
    /// PostgreSQL (sync client; a mutex because the client needs `&mut`).
    Postgres(Mutex<postgres::Client>),
}

/// `?N` → `$N` (the registry's SQL has no `?` inside string literals).
pub fn pg_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

/// SQLite's DDL type names → PostgreSQL's 64-bit ones (`INTEGER` → `BIGINT`, `REAL` →
/// `DOUBLE PRECISION`), whole upper-case words only.
pub fn pg_ddl(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(match word.as_str() {
            "INTEGER" => "BIGINT",
            "REAL" => "DOUBLE PRECISION",
            w => w,
        });
        word.clear();
    };
    for c in sql.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

fn sqlite_params(params: &[Value]) -> Vec<rusqlite::types::Value> {
    params
        .iter()
        .map(|v| match v {
            Value::Null => rusqlite::types::Value::Null,
            Value::Int(i) => rusqlite::types::Value::Integer(*i),
            Value::Real(f) => rusqlite::types::Value::Real(*f),
            Value::Text(s) => rusqlite::types::Value::Text(s.clone()),
        })
        .collect()
}

/// Bind `v` as the parameter type PostgreSQL inferred for it (a typed NULL included).
fn pg_param(v: &Value, ty: &postgres::types::Type) -> Box<dyn postgres::types::ToSql + Sync> {
    use postgres::types::Type;
    match (v, ty) {
        (Value::Null, &Type::INT8) => Box::new(None::<i64>),
        (Value::Null, &Type::INT4) => Box::new(None::<i32>),
        (Value::Null, &Type::FLOAT8) => Box::new(None::<f64>),
        (Value::Null, &Type::FLOAT4) => Box::new(None::<f32>),
        (Value::Null, _) => Box::new(None::<String>),
        (Value::Int(i), &Type::INT4) => Box::new(*i as i32),
        (Value::Int(i), &Type::FLOAT8) => Box::new(*i as f64),
        (Value::Int(i), &Type::TEXT) => Box::new(i.to_string()),
        (Value::Int(i), _) => Box::new(*i),
        (Value::Real(f), &Type::FLOAT4) => Box::new(*f as f32),
        (Value::Real(f), _) => Box::new(*f),
        (Value::Text(s), _) => Box::new(s.clone()),
    }
}

fn pg_row(row: &postgres::Row) -> Result<Vec<Value>, DbError> {
    use postgres::types::Type;
    let mut out = Vec::with_capacity(row.len());
    for (i, col) in row.columns().iter().enumerate() {
        let v: Value = match *col.type_() {
            Type::INT8 => row.try_get::<_, Option<i64>>(i)?.into(),
            Type::INT4 => row.try_get::<_, Option<i32>>(i)?.map(i64::from).into(),
            Type::INT2 => row.try_get::<_, Option<i16>>(i)?.map(i64::from).into(),
            Type::FLOAT8 => row.try_get::<_, Option<f64>>(i)?.into(),
            Type::FLOAT4 => row.try_get::<_, Option<f32>>(i)?.map(f64::from).into(),
            Type::BOOL => row.try_get::<_, Option<bool>>(i)?.map(i64::from).into(),
            Type::TEXT | Type::VARCHAR | Type::NAME | Type::BPCHAR => {
                row.try_get::<_, Option<String>>(i)?.into()
            }
            ref other => return Err(DbError::Type(i, other.to_string())),
        };
        out.push(v);
    }
    Ok(out)
}

fn sqlite_row(row: &rusqlite::Row<'_>, n: usize) -> rusqlite::Result<Vec<Value>> {
    use rusqlite::types::ValueRef;
    (0..n)
        .map(|i| {
            Ok(match row.get_ref(i)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(x) => Value::Int(x),
                ValueRef::Real(x) => Value::Real(x),
                ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                ValueRef::Blob(b) => Value::Text(String::from_utf8_lossy(b).into_owned()),
            })
        })
        .collect()
}

/// The advisory lock key that serializes migrations on one PostgreSQL database.
const PG_MIGRATION_LOCK: i64 = 0x6b69_6c6e; // "kiln"

impl Db {
    /// Connect (SQLite: create the file's directory and the file; WAL mode).
    pub fn connect(location: &Location) -> Result<Self, DbError> {
        match location {
            Location::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path)?;
                conn.busy_timeout(Duration::from_secs(30))?;
                conn.pragma_update(None, "journal_mode", "WAL")?;
                conn.pragma_update(None, "synchronous", "NORMAL")?;
                Ok(Db::Sqlite(conn))
            }
            Location::Postgres(url) => {
                let client = postgres::Client::connect(url, postgres::NoTls)?;
                Ok(Db::Postgres(Mutex::new(client)))
            }
        }
    }

    /// Connect to a PostgreSQL server for reading: the session refuses writes.
    pub fn connect_pg_read_only(url: &str) -> Result<Self, DbError> {
        let mut client = postgres::Client::connect(url, postgres::NoTls)?;
        client.batch_execute("SET default_transaction_read_only = on")?;
        Ok(Db::Postgres(Mutex::new(client)))
    }

    fn pg(m: &Mutex<postgres::Client>) -> std::sync::MutexGuard<'_, postgres::Client> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run one statement; the number of rows it changed.
    pub fn execute(&self, sql: &str, params: &[Value]) -> Result<usize, DbError> {
        match self {
            Db::Sqlite(c) => Ok(c.execute(sql, rusqlite::params_from_iter(sqlite_params(params)))?),
            Db::Postgres(m) => {
                let mut c = Self::pg(m);
                let stmt = c.prepare(&pg_placeholders(sql))?;
                let bound: Vec<Box<dyn postgres::types::ToSql + Sync>> = params
                    .iter()
                    .zip(stmt.params())
                    .map(|(v, t)| pg_param(v, t))
                    .collect();
                let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    bound.iter().map(|b| b.as_ref()).collect();
                Ok(c.execute(&stmt, &refs)? as usize)
            }
        }
    }

    /// Run a query; every row's columns in the order selected.
    pub fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        match self {
            Db::Sqlite(c) => {
                let mut stmt = c.prepare(sql)?;
                let n = stmt.column_count();
                let rows = stmt
                    .query_map(rusqlite::params_from_iter(sqlite_params(params)), |r| {
                        sqlite_row(r, n)
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            }
            Db::Postgres(m) => {
                let mut c = Self::pg(m);
                let stmt = c.prepare(&pg_placeholders(sql))?;
                let bound: Vec<Box<dyn postgres::types::ToSql + Sync>> = params
                    .iter()
                    .zip(stmt.params())
                    .map(|(v, t)| pg_param(v, t))
                    .collect();
                let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    bound.iter().map(|b| b.as_ref()).collect();
                c.query(&stmt, &refs)?.iter().map(pg_row).collect()
            }
        }
    }

    /// The schema version (0 for an empty database).
    pub fn schema_version(&self) -> Result<i64, DbError> {
        match self {
            Db::Sqlite(c) => Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?),
            Db::Postgres(m) => {
                let mut c = Self::pg(m);
                let exists = c
                    .query_one("SELECT to_regclass('kiln_schema') IS NOT NULL", &[])?
                    .try_get::<_, bool>(0)?;
                if !exists {
                    return Ok(0);
                }
                let rows = c.query("SELECT version FROM kiln_schema", &[])?;
                Ok(match rows.first() {
                    Some(r) => r.try_get::<_, i64>(0)?,
                    None => 0,
                })
            }
        }
    }

    /// Apply the migrations after the stored version, each once, in one transaction that
    /// holds the database's migration lock (concurrent openers wait, then find nothing to do).
    pub fn migrate(&mut self, migrations: &[&str]) -> Result<(), DbError> {
        match self {
            Db::Sqlite(c) => {
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
                for (i, m) in migrations.iter().enumerate().skip(version.max(0) as usize) {
                    tx.execute_batch(m)?;
                    tx.pragma_update(None, "user_version", (i + 1) as i64)?;
                }
                Ok(tx.commit()?)
            }
            Db::Postgres(m) => {
                let mut c = Self::pg(m);
                let mut tx = c.transaction()?;
                tx.query("SELECT pg_advisory_xact_lock($1)", &[&PG_MIGRATION_LOCK])?;
                tx.batch_execute(
                    "CREATE TABLE IF NOT EXISTS kiln_schema (version BIGINT NOT NULL)",
                )?;
                let rows = tx.query("SELECT version FROM kiln_schema", &[])?;
                let version: i64 = match rows.first() {
                    Some(r) => r.try_get(0)?,
                    None => {
                        tx.execute("INSERT INTO kiln_schema (version) VALUES (0)", &[])?;
                        0
                    }
                };
                for (i, m) in migrations.iter().enumerate().skip(version.max(0) as usize) {
                    tx.batch_execute(&pg_ddl(m))?;
                    tx.execute("UPDATE kiln_schema SET version = $1", &[&((i + 1) as i64)])?;
                }
                Ok(tx.commit()?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_passwords_are_redacted() {
        assert_eq!(
            Location::parse("sqlite:///tmp/r.db"),
            Location::Sqlite("/tmp/r.db".into())
        );
        assert_eq!(
            Location::parse("checkpoints/runs.db"),
            Location::Sqlite("checkpoints/runs.db".into())
        );
        let pg = Location::parse("postgresql://kiln:s3cret@db:5432/runs?sslmode=disable");
        assert!(matches!(pg, Location::Postgres(_)));
        assert_eq!(
            pg.display(),
            "postgresql://kiln:***@db:5432/runs?sslmode=disable"
        );
        assert_eq!(
            Location::parse("postgres://kiln@db/runs").display(),
            "postgres://kiln@db/runs"
        );
    }

    #[test]
    fn dialect_translation_touches_only_placeholders_and_type_names() {
        assert_eq!(
            pg_placeholders("UPDATE runs SET a = ?2 WHERE id = ?1 AND b = '?'"),
            "UPDATE runs SET a = $2 WHERE id = $1 AND b = '?'"
        );
        assert_eq!(
            pg_ddl("CREATE TABLE t (pid INTEGER NOT NULL, x REAL, real_name TEXT);"),
            "CREATE TABLE t (pid BIGINT NOT NULL, x DOUBLE PRECISION, real_name TEXT);"
        );
    }
}
