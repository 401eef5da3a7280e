//! `kiln export onnx`: the exported graph, read by an independent implementation (ONNX
//! Runtime from PyPI, through the Python interpreter named by `KILN_TEST_ORT_PYTHON`; set up
//! by `.ci/onnxruntime.sh`), answers like `kiln predict`'s library path (the checkpoint's
//! normalisation around the `burn` engine, the CLI's default) within 1e-5 relative, on the
//! trained tiny model and on the default-shaped network (20 → 48 → 48 → 3 + 3) with every
//! activation kiln supports, at batch 1 and 1,000. That test is `#[ignore]`d (it needs the
//! variable); the structure and CLI tests always run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::artifact::{self, Checkpoint, HostWeights, Manifest};
use kiln::config::Activation;
use kiln::data::ColumnStats;
use kiln::export::onnx;
use kiln::infer::{build_engine, seeded_weights};
use kiln::model::RegressionNetConfig;
use kiln::predict::{Prediction, Predictor};

const ACTIVATIONS: [Activation; 4] = [
    Activation::Relu,
    Activation::Gelu,
    Activation::Tanh,
    Activation::Silu,
];

/// A small deterministic generator (SplitMix64) for statistics and inputs.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next()
    }
}

/// A checkpoint of `weights` with non-trivial normalisation (feature means far from 0,
/// standard deviations far from 1), exported under `dir`; the other manifest fields are the
/// trained tiny model's (so a field added to the manifest needs no change here).
fn synthetic_checkpoint(dir: &Path, weights: &HostWeights, seed: u64) -> Checkpoint {
    let base = Checkpoint::load(crate::common::trained()).unwrap().manifest;
    let mut g = Gen(seed);
    let arch = weights.arch.clone();
    let col = |g: &mut Gen, name: String| ColumnStats {
        name,
        mean: g.uniform(-50.0, 150.0),
        std: g.uniform(0.05, 20.0),
        transform: Default::default(),
    };
    let features = (0..arch.n_features)
        .map(|i| col(&mut g, format!("f{i}")))
        .collect();
    let targets = (0..arch.n_targets)
        .map(|i| col(&mut g, format!("y{i}")))
        .collect();
    let manifest = Manifest {
        run_id: format!("onnx-test-{seed}"),
        architecture: arch.clone(),
        features,
        targets,
        residual_correlation: (0..arch.n_targets)
            .map(|i| (0..arch.n_targets).map(|j| f64::from(i == j)).collect())
            .collect(),
        manifest_sha256: None,
        ..base
    };
    artifact::export(dir, manifest, weights).unwrap();
    Checkpoint::load(dir).unwrap()
}

/// `rows` feature rows in original units: each feature around its mean, ±3 standard
/// deviations.
fn inputs(ckpt: &Checkpoint, rows: usize, seed: u64) -> Vec<f32> {
    let mut g = Gen(seed);
    let f = &ckpt.manifest.features;
    (0..rows * f.len())
        .map(|i| {
            let c = &f[i % f.len()];
            (c.mean + c.std * g.uniform(-3.0, 3.0)) as f32
        })
        .collect()
}

/// `kiln predict`'s library path: the checkpoint's normalisation around the `burn` engine.
fn kiln_predict(ckpt: &Checkpoint, x: &[f32], rows: usize) -> Prediction {
    let engine = build_engine(kiln::records::EngineKind::Burn, &ckpt.weights, 1).unwrap();
    Predictor::for_checkpoint(ckpt, engine)
        .predict(x, rows)
        .unwrap()
}

/// The tiny config trained with `calibration: variance_scaling`: its σ scale lives in the
/// log-variance bias, so the ONNX graph must carry it like every engine.
fn recalibrated(dir: &Path) -> Checkpoint {
    let d = dir.join("recalibrated");
    std::fs::create_dir_all(&d).unwrap();
    let path = crate::common::tiny_config(
        &d,
        &d.join("out"),
        &[("export:", "calibration: variance_scaling\nexport:")],
    );
    let loaded = kiln::config::load(&path).unwrap();
    let export = kiln::train::train_cpu(&loaded, &d.join("out"))
        .unwrap()
        .outcome
        .export_dir
        .unwrap();
    let ckpt = Checkpoint::load(&export).unwrap();
    assert!(ckpt.manifest.calibration.is_some());
    ckpt
}

/// The checkpoints every check runs on: the trained tiny model and the default-shaped
/// network with each activation (seeded weights, synthetic normalisation).
fn checkpoints(dir: &Path) -> Vec<(String, Checkpoint)> {
    let mut v = vec![
        (
            "tiny (trained)".to_string(),
            Checkpoint::load(crate::common::trained()).unwrap(),
        ),
        (
            "tiny (trained, calibration: variance_scaling)".to_string(),
            recalibrated(dir),
        ),
    ];
    for (i, act) in ACTIVATIONS.into_iter().enumerate() {
        let arch = RegressionNetConfig {
            activation: act,
            ..RegressionNetConfig::reference()
        };
        let w = seeded_weights(&arch, 11 + i as u64);
        let d = dir.join(format!("default-{}", act.name()));
        v.push((
            format!("default 20→48→48→3+3 {}", act.name()),
            synthetic_checkpoint(&d, &w, 100 + i as u64),
        ));
    }
    // A deeper, narrower network with GELU (three hidden layers, one target).
    let arch = RegressionNetConfig {
        n_features: 5,
        hidden: vec![7, 6, 5],
        n_targets: 1,
        activation: Activation::Gelu,
    };
    v.push((
        "5→7→6→5→1+1 gelu".into(),
        synthetic_checkpoint(&dir.join("deep"), &seeded_weights(&arch, 5), 200),
    ));
    v
}

#[test]
fn the_graph_declares_the_serving_names_shapes_and_the_checkpoint_metadata() {
    let d = tempfile::tempdir().unwrap();
    for (label, ckpt) in checkpoints(d.path()) {
        let out = d
            .path()
            .join(format!("{}.onnx", label.replace([' ', '→', '+'], "_")));
        let s = onnx::export_file(&ckpt.dir, &out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(s.bytes, bytes.len());
        let m = onnx::decode(&bytes).unwrap();
        assert_eq!(m.ir_version, onnx::IR_VERSION);
        assert_eq!(m.opset_import.len(), 1);
        assert_eq!(m.opset_import[0].domain, "");
        assert!(m.opset_import[0].version >= 17);
        assert_eq!(m.producer_name, "kiln");
        let g = m.graph.as_ref().unwrap();
        assert_eq!(s.nodes, g.node.len());
        // The names of `kiln serve`'s Open Inference Protocol metadata.
        assert_eq!(onnx::FEATURES_INPUT, kiln::serve::model::FEATURES_INPUT);
        let arch = &ckpt.weights.arch;
        let shape = |v: &onnx::proto::ValueInfoProto| {
            let t = v.r#type.as_ref().unwrap().tensor_type.as_ref().unwrap();
            assert_eq!(t.elem_type, 1, "{label}: {} is FLOAT", v.name);
            t.shape
                .as_ref()
                .unwrap()
                .dim
                .iter()
                .map(|d| match (&d.dim_param, d.dim_value) {
                    (Some(p), None) => p.clone(),
                    (None, Some(n)) => n.to_string(),
                    other => panic!("{label}: dimension {other:?}"),
                })
                .collect::<Vec<_>>()
        };
        let names = |v: &[onnx::proto::ValueInfoProto]| {
            v.iter().map(|v| v.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names(&g.input), ["features"]);
        assert_eq!(names(&g.output), ["mean", "std"]);
        let batch_by = |n: usize| vec!["batch".to_string(), n.to_string()];
        assert_eq!(shape(&g.input[0]), batch_by(arch.n_features));
        for o in &g.output {
            assert_eq!(shape(o), batch_by(arch.n_targets));
        }
        // Every node reads only the input, initializers and earlier nodes' outputs; the
        // outputs are produced; every operator exists in opset 17.
        let mut defined: Vec<String> = g.initializer.iter().map(|t| t.name.clone()).collect();
        defined.push("features".into());
        const OPSET17: [&str; 12] = [
            "Sub", "Mul", "Add", "Gemm", "Relu", "Tanh", "Sigmoid", "Erf", "Exp", "Cast", "Div",
            "Sqrt",
        ];
        for n in &g.node {
            assert!(
                OPSET17.contains(&n.op_type.as_str()),
                "{label}: {}",
                n.op_type
            );
            for i in &n.input {
                assert!(
                    defined.contains(i),
                    "{label}: {} reads undefined {i}",
                    n.name
                );
            }
            defined.extend(n.output.iter().cloned());
        }
        assert!(defined.contains(&"mean".into()) && defined.contains(&"std".into()));
        // Initializer sizes match their shapes (raw little-endian data).
        for t in &g.initializer {
            let elems: i64 = t.dims.iter().product();
            let width = if t.data_type == 11 { 8 } else { 4 };
            assert_eq!(
                t.raw_data.len() as i64,
                elems * width,
                "{label}: {}",
                t.name
            );
        }
        let meta: BTreeMap<String, String> = onnx::metadata(&m).into_iter().collect();
        let man = &ckpt.manifest;
        assert_eq!(meta["run_id"], man.run_id);
        assert_eq!(meta["weights_sha256"], man.weights.sha256);
        assert_eq!(meta["kiln_version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(meta["checkpoint_kiln_version"], man.kiln_version);
        assert_eq!(
            serde_json::from_str::<Vec<String>>(&meta["features"]).unwrap(),
            man.feature_names()
        );
        assert_eq!(
            serde_json::from_str::<Vec<String>>(&meta["targets"]).unwrap(),
            man.target_names()
        );
        assert_eq!(
            meta.get("manifest_sha256"),
            man.manifest_sha256.as_ref(),
            "{label}"
        );
        // Deterministic: the same checkpoint gives the same bytes.
        assert_eq!(onnx::to_bytes(&ckpt), bytes);
    }
}

fn kiln_bin(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

#[test]
fn the_cli_writes_the_file_atomically_and_reports_bad_input_clearly() {
    let ckpt = crate::common::trained();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("tiny.onnx");
    let run = kiln_bin(&[
        "export",
        "onnx",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("ONNX opset 17"), "{stdout}");
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes, onnx::to_bytes(&Checkpoint::load(ckpt).unwrap()));
    // Only the file: no temporary left beside it.
    let names: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["tiny.onnx"]);

    // Not a checkpoint: exit 2, naming the directory.
    let run = kiln_bin(&[
        "export",
        "onnx",
        "--checkpoint",
        d.path().to_str().unwrap(),
        "--out",
        d.path().join("x.onnx").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is not a kiln checkpoint"), "{stderr}");
    assert!(stderr.contains(&d.path().display().to_string()), "{stderr}");

    // A corrupt checkpoint is refused like `kiln predict` refuses it.
    let bad = d.path().join("bad");
    crate::common::copy_dir(ckpt, &bad);
    let w = bad.join(artifact::WEIGHTS_FILE);
    let mut wb = std::fs::read(&w).unwrap();
    let last = wb.len() - 1;
    wb[last] ^= 1;
    std::fs::write(&w, wb).unwrap();
    let run = kiln_bin(&[
        "export",
        "onnx",
        "--checkpoint",
        bad.to_str().unwrap(),
        "--out",
        d.path().join("bad.onnx").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("SHA-256 mismatch"), "{stderr}");
    assert!(!d.path().join("bad.onnx").exists());

    // An output directory that does not exist: a runtime error naming the file.
    let missing = d.path().join("no-such-dir").join("m.onnx");
    let run = kiln_bin(&[
        "export",
        "onnx",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--out",
        missing.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write the ONNX file"), "{stderr}");
    assert!(stderr.contains("no-such-dir"), "{stderr}");
}

/// Runs ONNX Runtime (CPU, one thread) on each job: `model`, raw f32 `input` of
/// `rows × features`; writes `<out>.mean`, `<out>.std` (raw f32) and `<out>.json` (the
/// session's view of the model).
const ORT_DRIVER: &str = r#"
import json, sys
import numpy as np
import onnxruntime as ort
for j in json.load(open(sys.argv[1])):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(j["model"], so, providers=["CPUExecutionProvider"])
    x = np.fromfile(j["input"], dtype="<f4").reshape(j["rows"], j["features"])
    mean, std = s.run(["mean", "std"], {"features": x})
    assert mean.dtype == np.float32 and std.dtype == np.float32, (mean.dtype, std.dtype)
    mean.astype("<f4").tofile(j["out"] + ".mean")
    std.astype("<f4").tofile(j["out"] + ".std")
    meta = s.get_modelmeta()
    json.dump({
        "ort": ort.__version__,
        "producer": meta.producer_name,
        "custom": meta.custom_metadata_map,
        "inputs": [[i.name, [str(d) for d in i.shape], i.type] for i in s.get_inputs()],
        "outputs": [[o.name, [str(d) for d in o.shape], o.type] for o in s.get_outputs()],
    }, open(j["out"] + ".json", "w"))
"#;

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
#[ignore = "needs ONNX Runtime: KILN_TEST_ORT_PYTHON (.ci/onnxruntime.sh)"]
fn onnx_runtime_answers_like_kiln_predict_on_every_activation_at_batch_1_and_1000() {
    let python = crate::common::required_env(
        "KILN_TEST_ORT_PYTHON",
        "a Python with onnxruntime and numpy (.ci/onnxruntime.sh)",
    );
    let d = tempfile::tempdir().unwrap();
    let cks = checkpoints(d.path());
    struct Job {
        label: String,
        ckpt: usize,
        rows: usize,
        x: Vec<f32>,
        out: PathBuf,
    }
    let mut jobs = Vec::new();
    let mut spec = Vec::new();
    for (c, (label, ckpt)) in cks.iter().enumerate() {
        let model = d.path().join(format!("m{c}.onnx"));
        onnx::export_file(&ckpt.dir, &model).unwrap();
        for rows in [1usize, 1000] {
            let x = inputs(ckpt, rows, 1_000 + c as u64 * 7 + rows as u64);
            let input = d.path().join(format!("m{c}-{rows}.x"));
            let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(&input, bytes).unwrap();
            let out = d.path().join(format!("m{c}-{rows}"));
            spec.push(serde_json::json!({
                "model": model, "input": input, "rows": rows,
                "features": ckpt.weights.arch.n_features, "out": out,
            }));
            jobs.push(Job {
                label: format!("{label}, batch {rows}"),
                ckpt: c,
                rows,
                x,
                out,
            });
        }
    }
    let spec_path = d.path().join("jobs.json");
    std::fs::write(&spec_path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let run = Command::new(&python)
        .args(["-c", ORT_DRIVER])
        .arg(&spec_path)
        .output()
        .unwrap_or_else(|e| panic!("KILN_TEST_ORT_PYTHON={python:?}: {e}"));
    assert!(
        run.status.success(),
        "ONNX Runtime failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let mut ort_version = String::new();
    for job in &jobs {
        let ckpt = &cks[job.ckpt].1;
        let k = ckpt.weights.arch.n_targets;
        let want = kiln_predict(ckpt, &job.x, job.rows);
        let mean = read_f32(&job.out.with_extension("mean"));
        let std = read_f32(&job.out.with_extension("std"));
        assert_eq!(mean.len(), job.rows * k, "{}", job.label);
        assert_eq!(std.len(), job.rows * k, "{}", job.label);
        // Relative to the value, or to the target's standard deviation where the mean is
        // closer to zero than that (a mean of 1e-3 with σ_y = 10 is not held to 1e-8).
        let (mut worst_mean, mut worst_std) = (0f64, 0f64);
        for i in 0..job.rows * k {
            let t = &ckpt.manifest.targets[i % k];
            let (a, b) = (mean[i] as f64, want.mean[i] as f64);
            let e = (a - b).abs() / b.abs().max(t.std);
            worst_mean = worst_mean.max(e);
            assert!(
                e <= 1e-5,
                "{}: mean[{i}]: ONNX Runtime {a}, kiln predict {b} (relative {e:.2e})",
                job.label
            );
            let (a, b) = (std[i] as f64, want.std[i] as f64);
            let e = (a - b).abs() / b.abs();
            worst_std = worst_std.max(e);
            assert!(
                b > 0.0 && e <= 1e-5,
                "{}: std[{i}]: ONNX Runtime {a}, kiln predict {b} (relative {e:.2e})",
                job.label
            );
        }
        eprintln!(
            "{}: worst relative difference mean {worst_mean:.2e}, std {worst_std:.2e}",
            job.label
        );
        let info: serde_json::Value =
            serde_json::from_slice(&std::fs::read(job.out.with_extension("json")).unwrap())
                .unwrap();
        ort_version = info["ort"].as_str().unwrap_or_default().to_string();
        assert_eq!(info["producer"], "kiln");
        assert_eq!(info["custom"]["run_id"], ckpt.manifest.run_id.as_str());
        assert_eq!(
            info["custom"]["weights_sha256"],
            ckpt.manifest.weights.sha256.as_str()
        );
        let nf = ckpt.weights.arch.n_features.to_string();
        let kk = k.to_string();
        assert_eq!(
            info["inputs"],
            serde_json::json!([["features", ["batch", nf], "tensor(float)"]])
        );
        assert_eq!(
            info["outputs"],
            serde_json::json!([
                ["mean", ["batch", kk], "tensor(float)"],
                ["std", ["batch", kk], "tensor(float)"]
            ])
        );
    }
    eprintln!(
        "ONNX Runtime {ort_version} agreed with kiln predict on {} checkpoints × batch 1 and 1000",
        cks.len()
    );
}
