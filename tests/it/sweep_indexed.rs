//! A sweep as an indexed job: `kiln sweep plan` gives stable ids, N independent
//! `kiln sweep run --index I` processes share one registry (SQLite, and PostgreSQL when
//! `KILN_TEST_POSTGRES_URL` is set — see `.ci/postgres.sh`), one of them is killed mid-run and
//! its index re-run (resumed, not restarted), a finished index is not run twice, and
//! `kiln sweep summarize` reaches the same right-sizing answer as `kiln sweep` in one process.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::{kiln, kiln_env, stderr};
use kiln::track::registry::Registry;

/// A tiny config writing under `dir`, and a 2 × 2 sweep of it.
fn sweep_in(dir: &Path) -> PathBuf {
    let cfg = crate::common::tiny_config(dir, &dir.join("out"), &[]);
    let sweep = dir.join("sizes.yaml");
    std::fs::write(
        &sweep,
        format!(
            "base: {}\nparallel: 1\nthreads_per_run: 1\ntolerance: 0.05\nset:\n  stages[1].epochs: 1\ngrid:\n  model.hidden: [[4], [16]]\n  model.activation: [relu, tanh]\n",
            cfg.display()
        ),
    )
    .unwrap();
    sweep
}

/// (best index, right-sized index, per-index params and validation loss) of a sweep's JSON.
type Answer = (u64, u64, Vec<(i64, f64)>);

fn answer(v: &serde_json::Value) -> Answer {
    let runs = v["runs"].as_array().unwrap();
    let by_index: Vec<(i64, f64)> = runs
        .iter()
        .map(|r| {
            (
                r["params"].as_i64().unwrap(),
                r["val_metric"].as_f64().unwrap(),
            )
        })
        .collect();
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(
            r["index"].as_u64(),
            Some(i as u64),
            "members in index order"
        );
    }
    (
        v["best_index"].as_u64().expect("a best run"),
        v["right_sized_index"].as_u64().expect("a right-sized run"),
        by_index,
    )
}

/// The whole indexed flow against the registry at `registry`; returns summarize's answer.
fn indexed_flow(sweep: &Path, registry: &str) -> Answer {
    let file = sweep.to_str().unwrap();
    let plan = kiln(&["sweep", "plan", file, "--json"]);
    assert!(plan.status.success(), "{}", stderr(&plan));
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let n = plan["runs"].as_array().unwrap().len();
    assert_eq!(n, 4);

    // Every index in its own process, at once; index 1 dies (SIGKILL) after its 2nd epoch.
    let killed = 1;
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (file, registry) = (file.to_string(), registry.to_string());
            std::thread::spawn(move || {
                let fault = if i == killed {
                    vec![("KILN_FAULT", "kill@after-epoch-log:2")]
                } else {
                    vec![]
                };
                kiln_env(
                    &[
                        "sweep",
                        "run",
                        &file,
                        "--index",
                        &i.to_string(),
                        "--registry",
                        &registry,
                    ],
                    &fault,
                )
            })
        })
        .collect();
    let outs: Vec<Output> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, o) in outs.iter().enumerate() {
        if i == killed {
            assert_eq!(o.status.code(), None, "killed by its fault: {}", stderr(o));
        } else {
            assert!(o.status.success(), "index {i}: {}", stderr(o));
        }
    }
    // Not finished yet: summarize says so (the killed run is reaped as killed).
    let partial = kiln(&["sweep", "summarize", file, "--registry", registry, "--json"]);
    assert_eq!(partial.status.code(), Some(1), "{}", stderr(&partial));
    let v: serde_json::Value = serde_json::from_slice(&partial.stdout).unwrap();
    assert_eq!(v["failed"], 1);
    let why = v["runs"][killed]["error"].as_str().unwrap();
    assert!(why.contains("killed"), "{why}");

    // Re-running the killed index resumes its run (same run id).
    let killed_run = {
        let reg = Registry::open(Path::new(registry)).unwrap();
        let id = reg
            .sweep_member(plan["sweep_id"].as_str().unwrap(), killed)
            .unwrap()
            .expect("the member was claimed before it trained")
            .run_id;
        assert_eq!(reg.get(&id).unwrap().status, "killed");
        id
    };
    let again = kiln(&[
        "sweep",
        "run",
        file,
        "--index",
        &killed.to_string(),
        "--registry",
        registry,
    ]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stderr(&again).contains("resumed"), "{}", stderr(&again));
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), killed_run);

    // A finished index is not run twice.
    let rows_before = Registry::open(Path::new(registry))
        .unwrap()
        .list()
        .unwrap()
        .len();
    let twice = kiln(&["sweep", "run", file, "--index", "0", "--registry", registry]);
    assert!(twice.status.success(), "{}", stderr(&twice));
    assert!(
        stderr(&twice).contains("already finished"),
        "{}",
        stderr(&twice)
    );
    let reg = Registry::open(Path::new(registry)).unwrap();
    assert_eq!(reg.list().unwrap().len(), rows_before);
    assert_eq!(rows_before, n, "one run per index, the killed one resumed");
    let bad = kiln(&["sweep", "run", file, "--index", "4", "--registry", registry]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));

    let done = kiln(&["sweep", "summarize", file, "--registry", registry, "--json"]);
    assert!(done.status.success(), "{}", stderr(&done));
    answer(&serde_json::from_slice(&done.stdout).unwrap())
}

#[test]
fn an_indexed_sweep_reaches_the_one_process_answer() {
    indexed_sweep(false);
}

#[test]
#[ignore = "needs PostgreSQL: KILN_TEST_POSTGRES_URL (.ci/postgres.sh)"]
fn an_indexed_sweep_on_postgres_reaches_the_one_process_answer() {
    indexed_sweep(true);
}

/// Plan, reference answer from one process, then the indexed flow on SQLite or (`postgres`)
/// on the PostgreSQL server `KILN_TEST_POSTGRES_URL` names.
fn indexed_sweep(postgres: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = sweep_in(tmp.path());
    let file = sweep.to_str().unwrap();

    // Stable plan: the same ids every time, one per member, in expansion order.
    let a = kiln(&["sweep", "plan", file]);
    let b = kiln(&["sweep", "plan", file]);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout);
    let text = String::from_utf8_lossy(&a.stdout);
    assert!(text.starts_with("sweep sizes-"), "{text}");
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(text.lines().nth(1).unwrap().contains("model.hidden=[4]"));

    // The reference: the whole sweep from one process.
    let one = tmp.path().join("one.db");
    let o = kiln(&["sweep", file, "--registry", one.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let reference = answer(&serde_json::from_slice(&o.stdout).unwrap());

    let same = |got: &Answer, backend: &str| {
        assert_eq!(got.0, reference.0, "{backend}: best run");
        assert_eq!(got.1, reference.1, "{backend}: right-sized run");
        for (i, (g, r)) in got.2.iter().zip(&reference.2).enumerate() {
            assert_eq!(g.0, r.0, "{backend}: params of index {i}");
            assert!(
                (g.1 - r.1).abs() <= 1e-9 * r.1.abs(),
                "{backend}: validation loss of index {i}: {} vs {}",
                g.1,
                r.1
            );
        }
    };

    if !postgres {
        let sqlite = format!("sqlite://{}", tmp.path().join("shared.db").display());
        same(&indexed_flow(&sweep, &sqlite), "SQLite");
        return;
    }
    {
        let base = crate::common::required_env(
            "KILN_TEST_POSTGRES_URL",
            "a PostgreSQL server (.ci/postgres.sh)",
        );
        {
            let db = format!("kiln_sweep_{}", std::process::id());
            let mut client = postgres::Client::connect(&base, postgres::NoTls).unwrap();
            // One statement per call: CREATE DATABASE cannot run inside a transaction block.
            client
                .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
                .unwrap();
            client
                .batch_execute(&format!("CREATE DATABASE {db}"))
                .unwrap();
            let (main, query) = base.split_once('?').unwrap_or((&base, ""));
            let authority_end = main[main.find("://").unwrap() + 3..]
                .find('/')
                .map(|i| main.find("://").unwrap() + 3 + i)
                .unwrap_or(main.len());
            let url = format!(
                "{}/{db}{}",
                &main[..authority_end],
                if query.is_empty() {
                    String::new()
                } else {
                    format!("?{query}")
                }
            );
            same(&indexed_flow(&sweep, &url), "PostgreSQL");
        }
    }
}

#[test]
fn sweep_run_set_places_a_member_without_changing_the_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = sweep_in(tmp.path());
    let file = sweep.to_str().unwrap();
    let plan = kiln(&["sweep", "plan", file, "--json"]);
    assert!(plan.status.success(), "{}", stderr(&plan));
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let sweep_id = plan["sweep_id"].as_str().unwrap();
    let registry = tmp.path().join("reg.db");
    let registry = registry.to_str().unwrap();
    // A writable place elsewhere (what the Kubernetes Job mounts at /work).
    let moved = tmp.path().join("mounted/checkpoints");
    let set = format!("export.dir={}", moved.display());
    let o = kiln(&[
        "sweep",
        "run",
        file,
        "--index",
        "0",
        "--registry",
        registry,
        "--set",
        &set,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run_id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    // The run directory is under the moved root, not the base config's export.dir …
    assert!(moved.join("runs").join(&run_id).is_dir(), "{run_id}");
    assert!(!tmp.path().join("out/runs").join(&run_id).exists());
    // … and the member is the same member of the same sweep (placement is not identity).
    let member = Registry::open(Path::new(registry))
        .unwrap()
        .sweep_member(sweep_id, 0)
        .unwrap()
        .expect("claimed");
    assert_eq!(member.run_id, run_id);
    let again = kiln(&["sweep", "run", file, "--index", "0", "--registry", registry]);
    assert!(
        stderr(&again).contains("already finished"),
        "{}",
        stderr(&again)
    );

    // A key the sweep file sets for its members is refused (bad input, naming the key),
    // as is a malformed override; nothing runs.
    for (bad, key) in [
        ("model.activation=relu", "model.activation"),
        ("stages[1].epochs=3", "stages[1].epochs"),
        ("export.dir", "export.dir"),
    ] {
        let o = kiln(&[
            "sweep",
            "run",
            file,
            "--index",
            "1",
            "--registry",
            registry,
            "--set",
            bad,
        ]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains(key), "{bad}: {}", stderr(&o));
    }
    let reg = Registry::open(Path::new(registry)).unwrap();
    assert!(reg.sweep_member(sweep_id, 1).unwrap().is_none());
}
