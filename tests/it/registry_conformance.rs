//! One conformance suite for both registry backends: every check below runs against SQLite
//! (`sqlite:///…` in a temporary directory) and against a real PostgreSQL server (a fresh
//! database per test on the server named by `KILN_TEST_POSTGRES_URL`, which `.ci/run` sets
//! up through `.ci/postgres.sh`; the PostgreSQL half is `#[ignore]`d (`.ci/run` runs it with
//! `--ignored`) and fails when asked for without a server
//! per check).
//!
//! Checks: round trip, migrations from empty, 8 concurrent writer processes losing nothing,
//! heartbeat reaping across hosts, the regression detector and the report.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kiln::records::EpochRecord;
use kiln::track::promotion::PromotionDecision;
use kiln::track::registry::{
    Location, NewRun, PromotionRow, Registry, RegistryError, RunEnd, Value,
};

const PG_ENV: &str = "KILN_TEST_POSTGRES_URL";
const WRITER_ENV: &str = "KILN_TEST_REGISTRY_WRITER";
const WRITERS: usize = 8;
const WRITER_EPOCHS: usize = 20;

#[derive(Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
}

/// `base` with its database name replaced by `db`.
pub(crate) fn with_database(base: &str, db: &str) -> String {
    let (main, query) = match base.split_once('?') {
        Some((m, q)) => (m, format!("?{q}")),
        None => (base, String::new()),
    };
    let after_scheme = main.find("://").map(|i| i + 3).unwrap_or(0);
    let authority_end = main[after_scheme..]
        .find('/')
        .map(|i| after_scheme + i)
        .unwrap_or(main.len());
    format!("{}/{db}{query}", &main[..authority_end])
}

/// A fresh, empty registry location for one check (on PostgreSQL: a new database on the
/// server `KILN_TEST_POSTGRES_URL` names; the PostgreSQL tests are `#[ignore]`d and fail
/// without it).
fn fresh(backend: Backend, dir: &Path, check: &str) -> String {
    match backend {
        Backend::Sqlite => format!("sqlite://{}", dir.join("runs.db").display()),
        Backend::Postgres => {
            let base = crate::common::required_env(
                PG_ENV,
                &format!("a PostgreSQL server for `{check}` (.ci/postgres.sh)"),
            );
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
            let db = format!("kiln_{check}_{}_{nanos}", std::process::id());
            let mut client = postgres::Client::connect(&base, postgres::NoTls)
                .unwrap_or_else(|e| panic!("{PG_ENV}={base}: {e}"));
            client
                .batch_execute(&format!("CREATE DATABASE {db}"))
                .unwrap();
            with_database(&base, &db)
        }
    }
}

fn open(url: &str) -> Registry {
    Registry::open(Path::new(url)).unwrap_or_else(|e| panic!("{e}"))
}

fn new_run<'a>(id: &'a str, dir: &'a Path) -> NewRun<'a> {
    NewRun {
        id,
        name: "t",
        run_dir: dir,
        config_text: "name: t\n",
        config_sha256: "abc",
        started_at: "2026-11-29T00:00:00Z",
        environment: kiln::records::RunEnvironment {
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
        train_loss: 0.5 / (1.0 + e as f64),
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

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn round_trip(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = fresh(backend, dir.path(), "round_trip");
    let reg = open(&url);
    reg.start_run(&new_run("r-1", dir.path())).unwrap();
    reg.log_epoch("r-1", &epoch(0, 0)).unwrap();
    reg.log_epoch("r-1", &epoch(0, 1)).unwrap();
    reg.log_epoch("r-1", &epoch(0, 1)).unwrap(); // idempotent
    reg.log_epoch("r-1", &epoch(1, 0)).unwrap();
    let exact = 0.1 + 0.2; // 0.30000000000000004: floats must survive to the last bit
    reg.finish_run(
        "r-1",
        &RunEnd {
            status: kiln::records::RunState::Finished,
            param_count: Some(1 << 40),
            val_metric: Some(exact),
            latency_b1_p50_us: Some(1.5),
            latency_b128_p50_us: Some(30.25),
            artifact_path: Some("/x/export".into()),
            latency: Some(kiln::records::metrics::LatencyReport {
                engine: "fused".into(),
                cpu: None,
                batches: vec![kiln::records::metrics::BatchLatency {
                    batch: 1,
                    iters: 10,
                    p50_us: 1.5,
                    p95_us: 2.0,
                    p99_us: 2.5,
                }],
            }),
            // A key the metrics type does not know round-trips as it is.
            final_metrics: Some(kiln::records::metrics::ManifestMetrics {
                other: [("nll".to_string(), serde_json::json!(-1.25))].into(),
                ..Default::default()
            }),
            ..RunEnd::default()
        },
    )
    .unwrap();
    drop(reg);
    let reg = open(&url); // reopening does not re-migrate
    let r = reg.get("r-").unwrap();
    assert_eq!(r.status, "finished");
    assert_eq!(r.param_count, Some(1 << 40), "64-bit integers");
    assert_eq!(r.val_metric, Some(exact));
    assert_eq!(r.latency_b128_p50_us, Some(30.25));
    assert_eq!(r.latency.as_ref().unwrap().batches[0].p50_us, 1.5);
    assert_eq!(r.final_metrics.as_ref().unwrap().other["nll"], -1.25);
    assert_eq!(r.environment.as_ref().unwrap().burn, "0.21.0");
    assert_eq!(r.host, kiln::track::registry::hostname());
    assert_eq!(r.pid, i64::from(std::process::id()));
    assert!(r.ended_at.is_some() && r.reason.is_none());
    let beat = r.heartbeat_at.expect("a heartbeat at start");
    assert!((now_s() - beat).abs() < 600.0, "{beat}");
    assert_eq!(
        reg.epochs("r-1").unwrap(),
        vec![epoch(0, 0), epoch(0, 1), epoch(1, 0)],
        "every field round-trips, in order"
    );
    assert!(matches!(reg.get("zzz"), Err(RegistryError::NotFound(_))));
    assert!(
        matches!(reg.get("r_"), Err(RegistryError::NotFound(_))),
        "`_` is not a wildcard"
    );
    reg.start_run(&new_run("r-2", dir.path())).unwrap();
    assert!(matches!(reg.get("r-"), Err(RegistryError::Ambiguous(..))));
    assert_eq!(
        reg.list()
            .unwrap()
            .iter()
            .map(|r| r.id.as_str())
            .collect::<Vec<_>>(),
        ["r-1", "r-2"]
    );
    // A restarted run (resume) is running again with its end cleared.
    reg.start_run(&new_run("r-1", dir.path())).unwrap();
    let again = reg.get("r-1").unwrap();
    assert_eq!(again.status, "running");
    assert!(again.ended_at.is_none());
    assert_eq!(again.param_count, Some(1 << 40), "what was known stays");
    // Sweep members: claimed once, then only by whoever holds them.
    assert!(reg.sweep_member("s", 3).unwrap().is_none());
    assert!(
        reg.claim_sweep_member("s", 3, "r-1", dir.path(), None)
            .unwrap()
    );
    assert!(
        !reg.claim_sweep_member("s", 3, "r-2", dir.path(), None)
            .unwrap(),
        "already claimed"
    );
    assert!(
        !reg.claim_sweep_member("s", 3, "r-2", dir.path(), Some("r-9"))
            .unwrap(),
        "held by another run"
    );
    assert!(
        reg.claim_sweep_member("s", 3, "r-2", dir.path(), Some("r-1"))
            .unwrap()
    );
    assert_eq!(reg.sweep_member("s", 3).unwrap().unwrap().run_id, "r-2");
}

fn migrations_from_empty(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = fresh(backend, dir.path(), "migrations");
    if let Location::Sqlite(file) = Location::parse(&url) {
        std::fs::write(&file, b"").unwrap(); // an empty file is a valid, empty database
    }
    let e = Registry::open_read_only(Path::new(&url))
        .err()
        .expect("an empty database is no registry for a reader")
        .to_string();
    assert!(e.contains("schema version 0"), "{e}");
    let reg = open(&url);
    let version = reg.schema_version().unwrap();
    assert!(version >= 3, "{version}");
    assert!(reg.list().unwrap().is_empty());
    drop(reg);
    // Several openers racing on one database migrate it once.
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || open(&url).schema_version().unwrap())
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), version);
    }
    let ro = Registry::open_read_only(Path::new(&url)).unwrap();
    assert_eq!(ro.schema_version().unwrap(), version);
    assert!(
        ro.start_run(&new_run("x", dir.path())).is_err(),
        "a reader cannot write"
    );
    assert_eq!(
        ro.reap_stale().unwrap(),
        0,
        "nothing to reap, nothing written"
    );
}

fn concurrent_writer_processes(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = fresh(backend, dir.path(), "writers");
    let children: Vec<_> = (0..WRITERS)
        .map(|i| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "registry_conformance::child_writer_entry",
                    "--exact",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(WRITER_ENV, format!("{i} {url}"))
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "a writer process failed");
    }
    let reg = open(&url);
    let rows = reg.list().unwrap();
    assert_eq!(rows.len(), WRITERS);
    for r in &rows {
        assert_eq!(r.status, "finished", "{r:?}");
        assert_eq!(reg.epochs(&r.id).unwrap().len(), WRITER_EPOCHS, "{}", r.id);
        assert_ne!(r.pid, i64::from(std::process::id()), "written by a child");
    }
}

/// The body of one writer process (see `concurrent_writer_processes`).
fn writer(i: usize, url: &str) {
    let reg = open(url);
    let id = format!("writer-{i}");
    let here = std::env::temp_dir();
    reg.start_run(&new_run(&id, &here)).unwrap();
    for e in 0..WRITER_EPOCHS {
        reg.log_epoch(&id, &epoch(0, e)).unwrap();
    }
    reg.finish_run(
        &id,
        &RunEnd {
            status: kiln::records::RunState::Finished,
            param_count: Some(i as i64),
            ..RunEnd::default()
        },
    )
    .unwrap();
}

/// In a writer child: write its run. In the test run itself: check how `--registry` values
/// are read.
#[test]
fn child_writer_entry() {
    if let Ok(v) = std::env::var(WRITER_ENV) {
        let (i, url) = v.split_once(' ').unwrap();
        writer(i.parse().unwrap(), url);
        return;
    }
    assert_eq!(
        Location::parse("sqlite:///tmp/x/runs.db"),
        Location::Sqlite("/tmp/x/runs.db".into())
    );
    assert_eq!(
        Location::parse("runs.db"),
        Location::Sqlite("runs.db".into())
    );
    assert!(matches!(
        Location::from_path(Path::new("postgresql://u:pw@h:5/db")),
        Location::Postgres(_)
    ));
    assert_eq!(
        with_database("postgres://k@127.0.0.1:5432/postgres?x=1", "d"),
        "postgres://k@127.0.0.1:5432/d?x=1"
    );
    assert_eq!(with_database("postgres://k@h", "d"), "postgres://k@h/d");
}

fn heartbeats_reap_runs_of_other_hosts(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = fresh(backend, dir.path(), "heartbeat");
    let reg = open(&url);
    for id in [
        "remote-dead",
        "remote-alive",
        "remote-old",
        "local-dead",
        "local-alive",
    ] {
        reg.start_run(&new_run(id, dir.path())).unwrap();
    }
    let now = now_s();
    let plant = |id: &str, host: &str, pid: i64, beat: Option<f64>| {
        reg.db()
            .execute(
                "UPDATE runs SET host = ?2, pid = ?3, heartbeat_at = ?4 WHERE id = ?1",
                &[id.into(), host.into(), pid.into(), beat.into()],
            )
            .unwrap();
    };
    let here = kiln::track::registry::hostname();
    let timeout = kiln::track::registry::HEARTBEAT_TIMEOUT.as_secs_f64();
    plant("remote-dead", "pod-a", 1, Some(now - timeout - 5.0));
    plant("remote-alive", "pod-b", 1, Some(now - timeout + 30.0));
    plant("remote-old", "pod-c", 1, None); // written before heartbeats: left alone
    // Same host: the process table decides, whatever the heartbeat says.
    plant("local-dead", &here, 999_999_999, Some(now));
    plant(
        "local-alive",
        &here,
        i64::from(std::process::id()),
        Some(now - 10.0 * timeout),
    );
    assert_eq!(reg.reap_stale().unwrap(), 2);
    let status = |id: &str| reg.get(id).unwrap();
    assert_eq!(status("remote-dead").status, "killed");
    let reason = status("remote-dead").reason.unwrap();
    assert!(
        reason.contains("no heartbeat") && reason.contains("pod-a"),
        "{reason}"
    );
    assert_eq!(status("local-dead").status, "killed");
    assert!(status("local-dead").reason.unwrap().contains("disappeared"));
    for alive in ["remote-alive", "remote-old", "local-alive"] {
        assert_eq!(status(alive).status, "running", "{alive}");
    }
    // Whoever looks later sees the remote run's heartbeat age past the timeout.
    assert_eq!(
        reg.reap_stale_at(now + 60.0, Duration::from_secs_f64(timeout))
            .unwrap(),
        1
    );
    assert_eq!(status("remote-alive").status, "killed");
}

use crate::common::{kiln, planted_runs};

fn regression_detector_and_report(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = fresh(backend, dir.path(), "regressions");
    planted_runs(&open(&url), Path::new("/tmp"), true);
    let o = kiln(&["runs", "--registry", &url, "regressions"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for slow in ["run-03", "run-10", "run-17", "run-24", "run-31"] {
        assert!(text.contains(&format!("REGRESSION {slow}")), "{text}");
    }
    assert_eq!(text.matches("REGRESSION").count(), 5, "{text}");
    assert!(text.contains("model.hidden"), "{text}");
    let o = kiln(&["runs", "--registry", &url, "list", "--json"]);
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 34);

    let out = dir.path().join("report");
    let o = kiln(&[
        "runs",
        "--registry",
        &url,
        "report",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(out.join("latency_vs_params.svg")).unwrap();
    assert_eq!(svg.matches("<circle").count(), 34, "one point per run");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert_eq!(html.matches("<tr").count(), 35, "header + one row per run");
    assert_eq!(html.matches("class=\"flag\"").count(), 5);

    // A clean set: nothing flagged, exit 0.
    let clean_dir = tempfile::tempdir().unwrap();
    let clean = fresh(backend, clean_dir.path(), "clean");
    planted_runs(&open(&clean), Path::new("/tmp"), false);
    let o = kiln(&["runs", "--registry", &clean, "regressions", "--json"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.stdout.is_empty());
}

/// A value bound through the shared statement path reads back with its type on either
/// backend (the raw connection is public for tools; this pins its contract).
fn values_keep_their_types(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = fresh(backend, dir.path(), "values");
    let reg = open(&url);
    reg.start_run(&new_run("v", dir.path())).unwrap();
    let rows = reg
        .db()
        .query(
            "SELECT pid, val_metric, name, reason FROM runs WHERE id = ?1",
            &["v".into()],
        )
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][0], Value::Int(i64::from(std::process::id())));
    assert_eq!(rows[0][1], Value::Null);
    assert_eq!(rows[0][2], Value::Text("t".into()));
    assert_eq!(rows[0][3], Value::Null);
}

/// `kiln promote`'s decisions: ids are assigned by the database in order, optional columns
/// stay NULL, the JSON details come back equal, and the filter by model works.
fn promotions_round_trip(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = fresh(backend, dir.path(), "promotions");
    let reg = open(&url);
    let row = |model: &str, version: Option<i64>| PromotionRow {
        id: 0,
        at: "2026-12-01T00:00:00Z".into(),
        repository: "/models".into(),
        model: model.into(),
        candidate: "/runs/x/export".into(),
        run_id: version.map(|v| format!("run-{v}")),
        incumbent_version: None,
        version,
        decision: if version.is_some() {
            PromotionDecision::Promoted
        } else {
            PromotionDecision::Refused
        },
        details: serde_json::from_value(
            serde_json::json!({"latency": {"b1": 0.25, "b128": [1, 2]}, "why": "ok"}),
        )
        .unwrap(),
    };
    let a = reg.record_promotion(&row("m", Some(1))).unwrap();
    let b = reg.record_promotion(&row("m", None)).unwrap();
    let c = reg.record_promotion(&row("other", Some(7))).unwrap();
    assert!(a < b && b < c, "ids {a} {b} {c}");
    let all = reg.promotions(None).unwrap();
    assert_eq!(all.iter().map(|p| p.id).collect::<Vec<_>>(), [a, b, c]);
    let m = reg.promotions(Some("m")).unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(
        m[0],
        PromotionRow {
            id: a,
            ..row("m", Some(1))
        }
    );
    assert_eq!(
        m[1],
        PromotionRow {
            id: b,
            ..row("m", None)
        }
    );
}

macro_rules! on_both_backends {
    ($($check:ident),* $(,)?) => {
        mod on_sqlite {
            $(#[test] fn $check() { super::$check(super::Backend::Sqlite) })*
        }
        mod on_postgres {
            $(
                #[test]
                #[ignore = "needs PostgreSQL: KILN_TEST_POSTGRES_URL (.ci/postgres.sh)"]
                fn $check() { super::$check(super::Backend::Postgres) }
            )*
        }
    };
}

on_both_backends!(
    round_trip,
    migrations_from_empty,
    concurrent_writer_processes,
    heartbeats_reap_runs_of_other_hosts,
    regression_detector_and_report,
    values_keep_their_types,
    promotions_round_trip,
);
