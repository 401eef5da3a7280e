//! `kiln doctor --gpu`: the GPU readiness check, one command on a machine with an NVIDIA GPU.
//!
//! 1. Looks for the CUDA driver library (`libcuda`) and NVRTC (`libnvrtc`) in the places
//!    [`kiln::doctor::cuda_search_dirs`] lists — `LD_LIBRARY_PATH`, the toolkit, the system
//!    directories, `ldconfig -p` and the `nvidia/*/lib` directories of Python site-packages —
//!    and opens what it finds with the dynamic loader. When a library was found only outside
//!    the loader's search path, the check runs itself again once with that directory added to
//!    `LD_LIBRARY_PATH` (Burn's CUDA backend loads the libraries by name).
//! 2. Creates the CUDA device.
//! 3. The bf16/f32 agreement check: `cuda-bf16` (within 1e-2 relative) and `cuda-f32` (1e-3)
//!    against the Burn f32 CPU forward of the reference network, at 1 to 70,000 rows.
//! 4. `bench infer` on `fused`, `cuda-f32` and `cuda-bf16` (reference network, batches 1,
//!    1,024 and 65,536).
//! 5. A short bf16 training run (`configs/tiny.yaml` with `device: cuda`, `precision: bf16`).
//!
//! Prints one JSON document on stdout (every step's result, the files looked for and where,
//! `warnings`), and exits 0 only when every step passed. Each step runs guarded: an error *or
//! a panic* in it (a CubeCL device thread's, a backend's) becomes that step's entry in
//! `steps` (`{"step", "ok", "error"}`), the later steps that do not depend on it still run, and
//! the JSON always comes out. When a step fails (no `cuda` feature, no driver, no device, a
//! failed agreement or training) the first failure is said in one line on stderr
//! (`failed_step` in the JSON) and the exit code is 1. A CUDA toolkit's `stubs/libcuda.so`
//! that the loader would take (from `LD_LIBRARY_PATH`) is warned about (`warnings`, and a
//! `warning:` line on stderr): cubecl fails with a bare `RecvError` then.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{CliError, CliResult};

/// Why a build without the `cuda` feature cannot run the check.
const NO_CUDA_FEATURE: &str = "this kiln was built without the `cuda` feature (rebuild with \
                               `cargo build --release --features cuda`)";

/// Set on the re-run with the library directories added to `LD_LIBRARY_PATH`.
const REEXEC_ENV: &str = "KILN_GPU_CHECK_LIBRARY_PATH";

/// Options of `kiln doctor --gpu` (read by the steps that need the `cuda` feature).
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct GpuCheckArgs {
    /// The training config of step 5.
    pub config: PathBuf,
    /// Minimum measured time per `bench infer` setting, seconds.
    pub bench_seconds: f64,
}

/// A failed step: the JSON so far on stdout, the one-line reason as the error.
fn fail(mut report: Value, step: &str, why: String) -> CliResult {
    report["ok"] = json!(false);
    report["failed_step"] = json!(step);
    report["error"] = json!(why);
    println!("{}", serde_json::to_string_pretty(&report)?);
    Err(CliError {
        code: 1,
        error: anyhow::anyhow!("kiln doctor --gpu: {why}"),
    })
}

/// Run the check.
pub fn run(args: &GpuCheckArgs) -> CliResult {
    let var = |k: &str| std::env::var(k).ok();
    let dirs = kiln::doctor::cuda_search_dirs(&var);
    let libraries = kiln::doctor::find_cuda_libraries(&dirs);
    let warnings = kiln::doctor::cuda_stub_warnings(
        &std::env::var("LD_LIBRARY_PATH").unwrap_or_default(),
        &libraries,
    );
    for w in &warnings {
        eprintln!("warning: kiln doctor --gpu: {w}");
    }
    let report = json!({
        "check": "kiln doctor --gpu",
        "doctor": kiln::doctor::report(),
        "libraries": libraries,
        "warnings": warnings,
        "steps": [],
    });
    if !cfg!(feature = "cuda") {
        return fail(report, "build", NO_CUDA_FEATURE.into());
    }
    for lib in &libraries {
        let names = lib.names.join(", ");
        match (&lib.found, &lib.loadable) {
            (None, _) => {
                return fail(
                    report,
                    "libraries",
                    format!(
                        "{} not found: looked for {names} in {} directories (listed under \
                         \"libraries\" in the JSON on stdout)",
                        lib.library,
                        lib.dirs.len()
                    ),
                );
            }
            (Some(path), Some(Err(e))) => {
                return fail(
                    report,
                    "libraries",
                    format!("{} found at {path} but cannot be loaded: {e}", lib.library),
                );
            }
            _ => {}
        }
    }
    if let Some(code) = rerun_with_library_path(&libraries)? {
        std::process::exit(code);
    }
    checks(args, report)
}

/// When a found library's directory is not on `LD_LIBRARY_PATH`, run this command again with
/// it added (once); its exit code.
fn rerun_with_library_path(
    libraries: &[kiln::doctor::LibrarySearch],
) -> Result<Option<i32>, CliError> {
    if std::env::var_os(REEXEC_ENV).is_some() {
        return Ok(None);
    }
    let current = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let on_path: Vec<&str> = current.split(':').filter(|d| !d.is_empty()).collect();
    let mut missing: Vec<String> = Vec::new();
    for lib in libraries {
        let Some(dir) = lib
            .found
            .as_deref()
            .and_then(|f| Path::new(f).parent())
            .map(|d| d.display().to_string())
        else {
            continue;
        };
        if !on_path.contains(&dir.as_str()) && !missing.contains(&dir) {
            missing.push(dir);
        }
    }
    if missing.is_empty() {
        return Ok(None);
    }
    let mut path = missing.join(":");
    if !current.is_empty() {
        path = format!("{path}:{current}");
    }
    eprintln!("kiln doctor --gpu: running again with LD_LIBRARY_PATH={path}");
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", &path)
        .env(REEXEC_ENV, "1")
        .status()?;
    Ok(Some(status.code().unwrap_or(1)))
}

#[cfg(not(feature = "cuda"))]
fn checks(_args: &GpuCheckArgs, report: Value) -> CliResult {
    fail(report, "build", NO_CUDA_FEATURE.into())
}

/// Run `f` as the step `name` of `report`: its value under `report[name]`, an entry in
/// `report["steps"]`; an error or a panic is the step's failure (the first one is
/// `failed_step`), never the end of the check. Whether it passed.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn step(report: &mut Value, name: &str, f: impl FnOnce() -> Result<Value, String>) -> bool {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(prev);
    let outcome = outcome.unwrap_or_else(|p| {
        Err(format!(
            "{name} panicked: {}",
            kiln::backend::panic_text(&*p)
        ))
    });
    let entry = match outcome {
        Ok(v) => {
            report[name] = v;
            json!({"step": name, "ok": true})
        }
        Err(e) => {
            if report.get("failed_step").is_none() {
                report["failed_step"] = json!(name);
                report["error"] = json!(e);
            }
            json!({"step": name, "ok": false, "error": e})
        }
    };
    let ok = entry["ok"] == true;
    if let Some(steps) = report["steps"].as_array_mut() {
        steps.push(entry);
    }
    ok
}

/// A step not run because an earlier one it needs failed.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn skipped(report: &mut Value, name: &str, because: &str) {
    if let Some(steps) = report["steps"].as_array_mut() {
        steps.push(json!({"step": name, "ok": false, "skipped": because}));
    }
}

/// Print the report; exit 1 with its first failure unless every step passed.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn finish(mut report: Value) -> CliResult {
    let ok = report.get("failed_step").is_none();
    report["ok"] = json!(ok);
    println!("{}", serde_json::to_string_pretty(&report)?);
    if ok {
        return Ok(());
    }
    let why = report["error"]
        .as_str()
        .unwrap_or("a step failed")
        .to_string();
    Err(CliError {
        code: 1,
        error: anyhow::anyhow!("kiln doctor --gpu: {why}"),
    })
}

#[cfg(feature = "cuda")]
fn checks(args: &GpuCheckArgs, mut report: Value) -> CliResult {
    let device_ok = step(&mut report, "device", || {
        kiln::backend::cuda_probe()
            .map(|d| json!(format!("{d:?}")))
            .map_err(|e| e.to_string())
    });
    if !device_ok {
        for s in ["agreement", "bench_infer", "train_bf16"] {
            skipped(&mut report, s, "no usable CUDA device");
        }
        return finish(report);
    }
    step(&mut report, "agreement", || {
        let (v, passed) = agreement()?;
        if passed {
            Ok(v)
        } else {
            Err(format!(
                "a CUDA engine disagrees with the f32 CPU forward beyond its bound: {v}"
            ))
        }
    });
    step(&mut report, "bench_infer", || {
        let weights = kiln::infer::reference_weights(7);
        let opts = kiln::bench::infer::InferBenchOptions {
            batches: vec![1, 1024, 65536],
            threads: 1,
            min_time: std::time::Duration::from_secs_f64(args.bench_seconds),
            min_samples: 20,
            ..Default::default()
        };
        let engines: Vec<String> = ["fused", "cuda-f32", "cuda-bf16"]
            .iter()
            .map(|e| e.to_string())
            .collect();
        let results =
            kiln::bench::infer::run_infer(&weights, &engines, &opts).map_err(|e| e.to_string())?;
        serde_json::to_value(results).map_err(|e| e.to_string())
    });
    step(&mut report, "train_bf16", || train_bf16(&args.config));
    finish(report)
}

/// `cuda-bf16` and `cuda-f32` against the Burn f32 CPU forward; (report, all within bound).
#[cfg(feature = "cuda")]
fn agreement() -> Result<(Value, bool), String> {
    use kiln::infer::{EngineKind, HeadOutput, build_engine};
    let w = kiln::infer::reference_weights(2);
    let nf = w.arch.n_features;
    let mut cpu = build_engine(EngineKind::Burn, &w, 1).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut all = true;
    for (name, rel) in [(EngineKind::CudaBf16, 1e-2f32), (EngineKind::CudaF32, 1e-3)] {
        let mut e = build_engine(name, &w, 1).map_err(|e| format!("{name}: {e}"))?;
        let mut worst_frac = 0f32;
        for rows in [1usize, 7, 1000, 9000, 70000] {
            let x = kiln::bench::infer::inputs(rows, nf, rows as u64);
            let (mut got, mut want) = (HeadOutput::default(), HeadOutput::default());
            e.forward(&x, rows, &mut got).map_err(|e| e.to_string())?;
            cpu.forward(&x, rows, &mut want)
                .map_err(|e| e.to_string())?;
            let scale = want
                .mean
                .iter()
                .chain(&want.log_var)
                .fold(0f32, |m, v| m.max(v.abs()))
                .max(1e-3);
            for (a, b) in got
                .mean
                .iter()
                .chain(&got.log_var)
                .zip(want.mean.iter().chain(&want.log_var))
            {
                if !a.is_finite() {
                    return Err(format!("{name}: a non-finite output at batch {rows}"));
                }
                let bound = (rel * b.abs()).max(rel * scale);
                worst_frac = worst_frac.max((a - b).abs() / bound);
            }
        }
        let passed = worst_frac <= 1.0;
        all &= passed;
        out.push(json!({
            "engine": name,
            "relative_bound": rel,
            "worst_fraction_of_bound": worst_frac,
            "passed": passed,
        }));
    }
    Ok((Value::Array(out), all))
}

/// A short bf16 training run of `config` on the GPU; its epochs' throughput.
#[cfg(feature = "cuda")]
fn train_bf16(config: &Path) -> Result<Value, String> {
    use kiln::run::{RunOptions, TrainingRun};
    let tmp = std::env::temp_dir().join(format!("kiln-gpu-check-{}", std::process::id()));
    let set = [
        "device=cuda".to_string(),
        "precision=bf16".to_string(),
        format!("export.dir={}", tmp.join("out").display()),
    ];
    let loaded = kiln::config::load_with_overrides(config, &set).map_err(|e| e.to_string())?;
    let batch = loaded.config.loader.batch_size;
    let options = RunOptions {
        measure: false,
        ..RunOptions::default()
    };
    let result = TrainingRun::new(loaded, options)
        .and_then(TrainingRun::execute)
        .map_err(|e| e.to_string())
        .and_then(|summary| {
            let epochs = std::fs::read_to_string(summary.outcome.run.path.join("epochs.jsonl"))
                .map_err(|e| e.to_string())?;
            Ok((summary, epochs))
        });
    let _ = std::fs::remove_dir_all(&tmp);
    let (summary, epochs) = result?;
    let epochs: Vec<Value> = epochs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|r| {
            let sps = r["samples_per_s"].as_f64().unwrap_or(0.0);
            json!({
                "stage": r["stage"],
                "epoch": r["epoch"],
                "samples_per_s": sps,
                "steps_per_s": sps / batch as f64,
                "val_loss": r["val_loss"],
                "data_wait_frac": r["data_wait_frac"],
            })
        })
        .collect();
    Ok(json!({
        "config": config.display().to_string(),
        "batch_size": batch,
        "wall_s": summary.outcome.wall.as_secs_f64(),
        "epochs": epochs,
    }))
}
