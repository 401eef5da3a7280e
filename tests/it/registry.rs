//! The run registry end to end: concurrent training processes, latency on every run, the
//! `kiln runs` commands, the regression detector's exit code, reports, and sweeps.

use crate::common::root;
use std::path::Path;
use std::process::Command;

use kiln::track::registry::Registry;

/// Held by every test here that trains or measures: the engine drill's latency benchmark must
/// not share the two cores with another test's training (a 0.1 µs batch-1 latency moves by
/// 1.5× when it does, which the regression rule would rightly flag).
static CPU: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cpu() -> std::sync::MutexGuard<'static, ()> {
    CPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

use crate::common::kiln;
use crate::common::{planted_runs, tiny_in};

#[test]
fn concurrent_runs_are_all_registered_with_latency() {
    let _cpu = cpu();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_in(tmp.path());
    let reg = tmp.path().join("runs.db");
    // Three processes write to one registry at the same time.
    let handles: Vec<_> = (0..3)
        .map(|i| {
            let (cfg, reg) = (cfg.clone(), reg.clone());
            std::thread::spawn(move || {
                Command::new(env!("CARGO_BIN_EXE_kiln"))
                    .args([
                        "train",
                        cfg.to_str().unwrap(),
                        "-q",
                        "--registry",
                        reg.to_str().unwrap(),
                    ])
                    .args(["--set", &format!("seed={i}")])
                    .current_dir(root())
                    .output()
                    .unwrap()
            })
        })
        .collect();
    for h in handles {
        let o = h.join().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let r = Registry::open(&reg).unwrap();
    let rows = r.list().unwrap();
    assert_eq!(rows.len(), 3);
    for row in &rows {
        assert_eq!(row.status, "finished", "{row:?}");
        assert_eq!(r.epochs(&row.id).unwrap().len(), 5, "3 + 2 epochs");
        assert!(row.latency_b1_p50_us.unwrap() > 0.0);
        assert!(row.latency_b128_p50_us.unwrap() > row.latency_b1_p50_us.unwrap());
        assert_eq!(row.param_count, Some(10 * 16 + 16 + 2 * (16 * 3 + 3)));
        assert!(row.config_text.contains("seed:"));
        assert!(row.environment.as_ref().unwrap().burn == "0.21.0");
        // The manifest carries the same latency.
        let m: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                Path::new(row.artifact_path.as_ref().unwrap()).join("manifest.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(m["latency"]["batches"][0]["batch"], 1);
        assert_eq!(
            m["latency"]["batches"][0]["p50_us"].as_f64(),
            row.latency_b1_p50_us
        );
    }

    let list = kiln(&[
        "runs",
        "--registry",
        reg.to_str().unwrap(),
        "list",
        "--json",
    ]);
    assert!(list.status.success());
    assert_eq!(String::from_utf8_lossy(&list.stdout).lines().count(), 3);
    let show = kiln(&[
        "runs",
        "--registry",
        reg.to_str().unwrap(),
        "show",
        &rows[0].id,
    ]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("latency") && text.contains("variance"),
        "{text}"
    );
    let cmp = kiln(&[
        "runs",
        "--registry",
        reg.to_str().unwrap(),
        "compare",
        &rows[0].id,
        &rows[2].id,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&cmp.stdout).unwrap();
    assert_eq!(v["config_diff"][0]["key"], "seed");
    let missing = kiln(&["runs", "--registry", reg.to_str().unwrap(), "show", "nope"]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn regressions_exit_non_zero_on_a_planted_band_and_zero_on_a_clean_set() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("band.db");
    planted_runs(&Registry::open(&db).unwrap(), tmp.path(), true);
    let o = kiln(&["runs", "--registry", db.to_str().unwrap(), "regressions"]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    for slow in ["run-03", "run-10", "run-17", "run-24", "run-31"] {
        assert!(text.contains(&format!("REGRESSION {slow}")), "{text}");
    }
    assert_eq!(text.matches("REGRESSION").count(), 5, "{text}");
    assert!(text.contains("nearest normal peer: run-"), "{text}");
    assert!(
        text.contains("model.hidden"),
        "the config difference is shown: {text}"
    );

    let clean = tmp.path().join("clean.db");
    planted_runs(&Registry::open(&clean).unwrap(), tmp.path(), false);
    let o = kiln(&[
        "runs",
        "--registry",
        clean.to_str().unwrap(),
        "regressions",
        "--json",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.stdout.is_empty());

    // Report: two figures in two formats and a page with one row per run.
    let out = tmp.path().join("report");
    let o = kiln(&[
        "runs",
        "--registry",
        db.to_str().unwrap(),
        "report",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(out.join("latency_vs_params.svg")).unwrap();
    assert_eq!(svg.matches("<circle").count(), 34, "one point per run");
    assert!(svg.contains("flagged regression"));
    let png = std::fs::File::open(out.join("metric_vs_params.png")).unwrap();
    let decoder = png::Decoder::new(std::io::BufReader::new(png));
    let reader = decoder.read_info().unwrap();
    assert_eq!(reader.info().width, 960);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert_eq!(html.matches("<tr").count(), 35, "header + one row per run");
    assert_eq!(html.matches("class=\"flag\"").count(), 5);
}

#[test]
fn a_sweep_runs_every_configuration_and_answers_right_sizing() {
    let _cpu = cpu();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_in(tmp.path());
    let sweep = tmp.path().join("sweep.yaml");
    std::fs::write(
        &sweep,
        format!(
            "base: {}\nparallel: 1\nthreads_per_run: 1\ntolerance: 0.05\nset:\n  stages[1].epochs: 1\ngrid:\n  model.hidden: [[4], [16]]\n  model.activation: [relu, tanh]\n",
            cfg.display()
        ),
    )
    .unwrap();
    let reg = tmp.path().join("sweep.db");
    let o = kiln(&[
        "sweep",
        sweep.to_str().unwrap(),
        "--registry",
        reg.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 4);
    assert_eq!(v["failed"], 0);
    let chosen = v["right_sized"].as_str().unwrap();
    let r = Registry::open(&reg).unwrap();
    assert_eq!(r.list().unwrap().len(), 4);
    let best = r.get(v["best"].as_str().unwrap()).unwrap();
    let pick = r.get(chosen).unwrap();
    assert!(pick.val_metric.unwrap() <= best.val_metric.unwrap() * 1.05 + 1e-12);
    assert!(pick.param_count.unwrap() <= best.param_count.unwrap());
    let activations: Vec<String> = r
        .list()
        .unwrap()
        .iter()
        .map(|x| {
            let c = kiln::config::parse(&x.config_text, Path::new("x")).unwrap();
            format!("{:?}{:?}", c.model.hidden, c.model.activation)
        })
        .collect();
    let mut uniq = activations.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), 4, "{activations:?}");
}

#[test]
fn a_real_engine_split_is_flagged_and_attributed_to_its_cause() {
    let _cpu = cpu();
    // Five real runs of one size; one serves on the unfused `burn` engine. The registry must
    // flag exactly that one, show the config key that differs, and profile each run on its
    // own engine so the operator table explains the gap. One run at a time: a latency
    // benchmark that overlapped another run's training would measure the neighbour, not the
    // engine.
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_in(tmp.path());
    let sweep = tmp.path().join("drill.yaml");
    std::fs::write(
        &sweep,
        format!(
            "base: {}\nparallel: 1\nthreads_per_run: 1\nset:\n  stages[1].epochs: 1\n  model.hidden: [16]\ngrid:\n  seed: [1, 2, 3, 4]\nlist:\n  - {{seed: 5, export.engine: burn}}\n",
            cfg.display()
        ),
    )
    .unwrap();
    let reg = tmp.path().join("drill.db");
    let o = kiln(&[
        "sweep",
        sweep.to_str().unwrap(),
        "--registry",
        reg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = Registry::open(&reg).unwrap();
    let slow: Vec<_> = r
        .list()
        .unwrap()
        .into_iter()
        .filter(|x| x.config_text.contains("engine: burn"))
        .collect();
    assert_eq!(slow.len(), 1);
    assert_eq!(slow[0].latency.as_ref().unwrap().engine, "burn");

    let o = kiln(&[
        "runs",
        "--registry",
        reg.to_str().unwrap(),
        "regressions",
        "--attribute",
        "--out",
        tmp.path().join("attr").to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(text.matches("REGRESSION").count(), 1, "{text}");
    assert!(
        text.contains(&format!("REGRESSION {}", slow[0].id)),
        "{text}"
    );
    assert!(
        text.contains("export.engine: null (peer) → burn (flagged)"),
        "{text}"
    );
    assert!(text.contains("A on auto, B on burn"), "{text}");
    // The burn engine's module spans exist only on the flagged side.
    let module_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("RegressionNet "))
        .unwrap_or_else(|| panic!("no RegressionNet row: {text}"));
    assert!(module_line.contains("new"), "{module_line}");
}
