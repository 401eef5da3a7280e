//! Instrumentation end to end: the scheduled profiler inside a real training run, inference
//! profiling and diffs, the resource trace and the verdict stored with the run, `kiln doctor`.

use crate::common::root;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use kiln::bench::profile::{ProfileInferOptions, profile_infer};
use kiln::config;
use kiln::observe::profiler::{KeyAverages, diff};
use kiln::train::train_cpu;

/// The profiler is process-wide: tests that record take turns.
static PROFILER: Mutex<()> = Mutex::new(());

fn events(trace: &Path) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(trace).unwrap()).unwrap();
    v["traceEvents"].as_array().unwrap().clone()
}

#[test]
fn training_profile_records_the_scheduled_steps_with_module_paths() {
    let _g = PROFILER.lock().unwrap_or_else(|e| e.into_inner());
    kiln::observe::install_subscriber();
    let tmp = tempfile::tempdir().unwrap();
    let mut loaded = config::load(&root().join("configs/tiny.yaml")).unwrap();
    let sets = [
        "profile.enabled=true".to_string(),
        "profile.wait=2".to_string(),
        "profile.warmup=1".to_string(),
        "profile.active=3".to_string(),
        "profile.record_shapes=true".to_string(),
        "profile.profile_memory=true".to_string(),
        "profile.with_stack=true".to_string(),
    ];
    let (c, text) = config::apply_overrides(&loaded.config, &sets, &loaded.path).unwrap();
    loaded.config = c;
    loaded.text = text;
    loaded.config.export.dir = tmp.path().to_path_buf();
    let out = train_cpu(&loaded, tmp.path()).unwrap().outcome;
    let run = out.run.clone();

    // Chrome trace: complete events, module paths, the step's phases, steps 3..=5 only.
    let all = events(&run.path.join("profile/trace.json"));
    let phase = |ph: &str| -> Vec<serde_json::Value> {
        all.iter().filter(|e| e["ph"] == ph).cloned().collect()
    };
    let ev = phase("X");
    assert!(!ev.is_empty());
    assert_eq!(
        ev.len() + phase("M").len() + phase("C").len(),
        all.len(),
        "only complete, metadata and counter events"
    );
    let names: Vec<&str> = ev.iter().map(|e| e["name"].as_str().unwrap()).collect();
    for n in [
        "train_step",
        "data_wait",
        "h2d",
        "forward",
        "loss",
        "backward",
        "clip",
        "optimizer_step",
        "RegressionNet",
        "RegressionNet/backbone/0",
        "RegressionNet/mean_head",
        "RegressionNet/logvar_head",
        "load_batch",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    assert_eq!(names.iter().filter(|n| **n == "train_step").count(), 3);
    let mut steps: Vec<u64> = ev
        .iter()
        .map(|e| e["args"]["step"].as_u64().unwrap())
        .collect();
    steps.sort();
    steps.dedup();
    assert_eq!(steps, vec![3, 4, 5]);
    for e in &ev {
        assert_eq!(e["ph"], "X");
        assert!(e["dur"].as_f64().unwrap() >= 0.0);
    }
    let module = ev
        .iter()
        .find(|e| e["name"] == "RegressionNet/backbone/0")
        .unwrap();
    assert_eq!(module["args"]["shape"], "[64, 10]");
    assert!(
        module["args"]["source"]
            .as_str()
            .unwrap()
            .contains("regression.rs:")
    );
    assert!(
        module["args"].get("rss_delta_kb").is_none(),
        "memory is a counter"
    );

    // Metadata names the process and every thread; the loader's workers (num_workers: 2)
    // record their batches on their own threads, beside the training thread.
    let meta = phase("M");
    let process = meta.iter().find(|e| e["name"] == "process_name").unwrap();
    assert_eq!(process["args"]["name"], "kiln (train_step)");
    let thread_name = |tid: &serde_json::Value| -> String {
        meta.iter()
            .find(|e| e["name"] == "thread_name" && &e["tid"] == tid)
            .and_then(|e| e["args"]["name"].as_str())
            .unwrap_or_else(|| panic!("no thread_name for tid {tid}"))
            .to_string()
    };
    for e in &ev {
        thread_name(&e["tid"]);
    }
    let train_tid = &ev.iter().find(|e| e["name"] == "train_step").unwrap()["tid"];
    let workers: Vec<&serde_json::Value> =
        ev.iter().filter(|e| e["name"] == "load_batch").collect();
    assert!(
        workers
            .iter()
            .all(|e| &e["tid"] != train_tid && thread_name(&e["tid"]).starts_with("kiln-loader-")),
        "{workers:?}"
    );
    // Memory: counter events with numeric values on the RSS track, in time order.
    let rss: Vec<f64> = phase("C")
        .iter()
        .filter(|e| e["name"] == "RSS (MiB)")
        .map(|e| e["args"]["MiB"].as_f64().unwrap())
        .collect();
    assert!(
        rss.len() >= 2 * 3,
        "a reading per span boundary: {}",
        rss.len()
    );
    assert!(rss.iter().all(|v| *v > 1.0), "{rss:?}");
    // Children lie within their parents: every module span inside a forward span.
    let within = |c: &serde_json::Value, p: &serde_json::Value| {
        let (cs, cd) = (c["ts"].as_f64().unwrap(), c["dur"].as_f64().unwrap());
        let (ps, pd) = (p["ts"].as_f64().unwrap(), p["dur"].as_f64().unwrap());
        c["tid"] == p["tid"] && cs >= ps - 1e-3 && cs + cd <= ps + pd + 1e-3
    };
    for m in ev
        .iter()
        .filter(|e| e["name"] == "RegressionNet/backbone/0")
    {
        assert!(ev.iter().any(|f| f["name"] == "forward" && within(m, f)));
    }
    // The table: totals add up.
    let t = KeyAverages::load(&run.path.join("profile/key_averages.json")).unwrap();
    assert_eq!(t.steps, 3);
    for r in &t.rows {
        assert!(r.self_us <= r.total_us + 1e-6, "{r:?}");
    }
    let total = |n: &str| -> f64 {
        t.rows
            .iter()
            .filter(|r| r.name == n)
            .map(|r| r.total_us)
            .sum()
    };
    let step = total("train_step");
    let phases: f64 = [
        "data_wait",
        "h2d",
        "forward",
        "loss",
        "backward",
        "clip",
        "optimizer_step",
    ]
    .iter()
    .map(|n| total(n))
    .sum();
    assert!(
        phases <= step + 1e-3 && phases > 0.5 * step,
        "phases {phases} vs step {step}"
    );
    assert!(total("RegressionNet/backbone/0") <= total("forward") + 1e-3);
    assert!(
        std::fs::read_to_string(run.path.join("profile/key_averages.txt"))
            .unwrap()
            .contains("% step")
    );

    // Resource trace and verdict come with every run.
    for f in ["resources.csv", "resources.svg", "resources.png"] {
        assert!(run.path.join(f).is_file(), "{f}");
    }
    let csv = std::fs::read_to_string(run.path.join("resources.csv")).unwrap();
    assert!(csv.starts_with("t_s,cpu_pct,cpu_pct_per_core,rss_mb"));
    assert!(csv.lines().count() >= 2, "at least the final sample");
    let svg = std::fs::read_to_string(run.path.join("resources.svg")).unwrap();
    let samples = csv.lines().count() - 1;
    assert!(
        svg.contains("too few samples") == (samples < kiln::observe::resources::MIN_CHART_SAMPLES),
        "{samples} samples"
    );
    let verdict = out.verdict.unwrap();
    assert!(["input-bound", "compute-bound", "overhead-bound"].contains(&verdict.bound.label()));
    let m = out.manifest.unwrap();
    assert!(m.metrics["bottleneck"]["advice"].is_string());
}

#[test]
fn inference_profiles_on_identical_inputs_and_diff() {
    let _g = PROFILER.lock().unwrap_or_else(|e| e.into_inner());
    kiln::observe::install_subscriber();
    let tmp = tempfile::tempdir().unwrap();
    let args = |batch: usize, out: &str| ProfileInferOptions {
        checkpoint: None,
        engine: "burn".into(),
        batch,
        iters: 20,
        warmup: 5,
        threads: 1,
        out: tmp.path().join(out),
        seed: 1,
        record_shapes: false,
        profile_memory: false,
        with_stack: false,
    };
    let a = profile_infer(&args(1, "a")).unwrap();
    let b = profile_infer(&args(512, "b")).unwrap();
    assert_eq!(a.averages.steps, 20);
    assert_eq!(b.averages.steps, 20);
    let names: Vec<&str> = a.averages.rows.iter().map(|r| r.name.as_str()).collect();
    for n in [
        "infer_step",
        "normalize",
        "engine_forward",
        "denormalize",
        "RegressionNet/backbone/1",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    let d = diff(&a.averages, &b.averages);
    assert_eq!(
        d[0].name, "infer_step",
        "the step itself regresses most per step"
    );
    assert!(d[0].ratio > 1.0);
    // The CLI reads the saved tables.
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["profile", "diff"])
        .arg(tmp.path().join("a"))
        .arg(tmp.path().join("b"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("RegressionNet/backbone/0") && text.contains("Δ µs/step"),
        "{text}"
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "profile",
            "diff",
            "/nonexistent/a.json",
            "/nonexistent/b.json",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn doctor_json_has_every_field() {
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in [
        "kiln_version",
        "burn_version",
        "rustc",
        "target",
        "features",
        "backends",
        "default_device",
        "cpu_model",
        "logical_cores",
        "rayon_threads",
        "os",
        "cuda",
    ] {
        assert!(v.get(k).is_some(), "{k}");
    }
    assert_eq!(v["burn_version"], "0.21.0");
}
