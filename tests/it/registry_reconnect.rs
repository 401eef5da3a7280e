//! The registry survives a lost PostgreSQL connection: a real `kiln train` against a real
//! server whose backends are terminated mid-run (as a restart, a failover or an idle-session
//! killer does) reconnects, loses no epoch row, finishes its row, and a row that another
//! host's reaper marked `killed` meanwhile is marked running again by the live process's
//! heartbeat. When the server stays away, the run still ends (exit 0: the run itself is fine)
//! and its end names exactly the epoch rows the registry is missing.
//!
//! Needs the server `KILN_TEST_POSTGRES_URL` names (`.ci/postgres.sh`; a superuser, which
//! `pg_terminate_backend` and `ALTER DATABASE` need); `#[ignore]`d otherwise, run by `.ci/run`.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{required_env, root, tiny_config};
use crate::registry_conformance::with_database;

const PG_ENV: &str = "KILN_TEST_POSTGRES_URL";

/// A new database on the test server: (its name, its URL, a client on the server's default
/// database for administration).
fn fresh_database(check: &str) -> (String, String, postgres::Client) {
    let base = required_env(PG_ENV, &format!("a PostgreSQL server for `{check}`"));
    let db = format!("kiln_{check}_{}", std::process::id());
    let mut admin = postgres::Client::connect(&base, postgres::NoTls)
        .unwrap_or_else(|e| panic!("{PG_ENV}={base}: {e}"));
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .unwrap();
    let url = with_database(&base, &db);
    (db, url, admin)
}

/// Terminate every session on `db` but the caller's; how many.
fn terminate(admin: &mut postgres::Client, db: &str) -> i64 {
    admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db],
        )
        .unwrap()
        .get(0)
}

/// A training run of the tiny config for `epochs` mean-stage epochs on the registry `url`,
/// its stderr captured.
fn train(dir: &std::path::Path, url: &str, epochs: usize, env: &[(&str, &str)]) -> Child {
    let cfg = tiny_config(
        dir,
        &dir.join("out"),
        &[("    epochs: 3\n", &format!("    epochs: {epochs}\n"))],
    );
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["train", cfg.to_str().unwrap(), "--registry", url])
        .current_dir(root())
        .env_remove("KILN_LOG")
        .env_remove("MLFLOW_TRACKING_URI")
        .env_remove("KILN_FAULT")
        .env("KILN_HEARTBEAT_PERIOD_S", "0.2")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kiln")
}

/// Wait for `child`, at most `limit`; (success, stderr).
fn finish(mut child: Child, limit: Duration) -> (bool, String) {
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).unwrap();
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("kiln train did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.success(), reader.join().unwrap())
}

/// Poll `url` (reconnecting as needed) until `ok` holds for the count `sql` returns.
fn wait_for(url: &str, sql: &str, what: &str, ok: impl Fn(i64) -> bool, child: &mut Child) {
    let t0 = Instant::now();
    loop {
        if let Ok(mut c) = postgres::Client::connect(url, postgres::NoTls)
            && let Ok(row) = c.query_one(sql, &[])
            && ok(row.get(0))
        {
            return;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before {what}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no {what} in 120 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The epochs the run's own log holds (`epochs.jsonl` in its run directory).
fn logged_epochs(dir: &std::path::Path) -> usize {
    let runs = dir.join("out/runs");
    let run = std::fs::read_dir(&runs)
        .unwrap()
        .next()
        .expect("one run directory")
        .unwrap()
        .path();
    std::fs::read_to_string(run.join("epochs.jsonl"))
        .unwrap()
        .lines()
        .count()
}

#[test]
#[ignore = "needs PostgreSQL: KILN_TEST_POSTGRES_URL (.ci/postgres.sh)"]
fn terminated_backends_mid_run_lose_no_row_and_a_live_run_is_not_left_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let (db, url, mut admin) = fresh_database("reconnect");
    let mut child = train(tmp.path(), &url, 150, &[]);
    let count = "SELECT count(*) FROM epochs";
    wait_for(&url, count, "two epoch rows", |n| n >= 2, &mut child);

    // Another host's reaper saw no heartbeat and marked the run killed; then the server
    // drops every session of the database (the training's and its heartbeat's).
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let planted = c
        .execute(
            "UPDATE runs SET status = 'killed', reason = 'planted: no heartbeat for 121 s'",
            &[],
        )
        .unwrap();
    assert_eq!(planted, 1);
    drop(c);
    assert!(
        terminate(&mut admin, &db) >= 1,
        "the run's sessions were open"
    );
    // The live process's heartbeat marks it running again before it ends.
    wait_for(
        &url,
        "SELECT count(*) FROM runs WHERE status = 'running'",
        "the killed row marked running again",
        |n| n == 1,
        &mut child,
    );
    // And once more: reconnecting is not a one-off.
    let n = {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.query_one(count, &[]).unwrap().get::<_, i64>(0)
    };
    wait_for(
        &url,
        count,
        "an epoch row after the first drop",
        |m| m > n,
        &mut child,
    );
    terminate(&mut admin, &db);

    let (ok, err) = finish(child, Duration::from_secs(600));
    assert!(ok, "{err}");
    assert!(err.contains("reconnecting"), "{err}");
    assert!(err.contains("marked running again"), "{err}");
    assert!(!err.contains("missing from the registry"), "{err}");
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let rows: i64 = c.query_one(count, &[]).unwrap().get(0);
    assert_eq!(rows as usize, logged_epochs(tmp.path()), "every epoch row");
    let status: String = c.query_one("SELECT status FROM runs", &[]).unwrap().get(0);
    assert_eq!(status, "finished");
}

#[test]
#[ignore = "needs PostgreSQL: KILN_TEST_POSTGRES_URL (.ci/postgres.sh)"]
fn a_registry_that_stays_away_is_named_with_the_missing_epochs_at_the_end() {
    let tmp = tempfile::tempdir().unwrap();
    let (db, url, mut admin) = fresh_database("away");
    let mut child = train(
        tmp.path(),
        &url,
        40,
        &[("KILN_REGISTRY_RECONNECT_S", "0.3")],
    );
    let count = "SELECT count(*) FROM epochs";
    wait_for(&url, count, "two epoch rows", |n| n >= 2, &mut child);
    admin
        .batch_execute(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS false"))
        .unwrap();
    terminate(&mut admin, &db);
    let (ok, err) = finish(child, Duration::from_secs(600));
    admin
        .batch_execute(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS true"))
        .unwrap();
    // The run itself is fine: exit 0, its own log complete.
    assert!(ok, "{err}");
    let logged = logged_epochs(tmp.path());
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let rows = c.query_one(count, &[]).unwrap().get::<_, i64>(0) as usize;
    assert!(rows < logged, "{rows} of {logged}");
    // The end names how many rows are missing, which, and where they are kept.
    let line = err
        .lines()
        .find(|l| l.contains("missing from the registry"))
        .unwrap_or_else(|| panic!("no missing-rows line in {err}"));
    // Every row the registry lacks is named. One more may be: a row whose statement the
    // server committed as it dropped the connection, before the client saw the answer (the
    // client cannot tell it from a lost one; an upsert would rewrite it if the server came
    // back).
    let named: usize = line
        .split(" epoch row(s)")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line}"));
    assert!(
        named == logged - rows || named == logged - rows + 1,
        "{line} ({rows} of {logged} recorded)"
    );
    assert!(line.contains("stage 0 epoch"), "{line}");
    assert!(line.contains("stage 1 epochs 0–1"), "{line}");
    assert!(line.contains("epochs.jsonl"), "{line}");
    // The row's end could not be written either, and says so.
    assert!(err.contains("the end of run"), "{err}");
}
