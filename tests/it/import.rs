//! `kiln import pytorch`: a PyTorch-layout safetensors file (written here, no Python) becomes a
//! kiln checkpoint whose every engine answers like a Burn module built from the same numbers,
//! and a checkpoint's own weights load into the PyTorch layout's names; bad files are clear
//! errors naming the tensor and both shapes.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Tensor, TensorData};
use kiln::artifact::{Checkpoint, HostTensor, tensors_to_safetensors};
use kiln::backend::Cpu;
use kiln::config::Activation;
use kiln::import::{ImportError, KeyMap, PytorchImport};
use kiln::infer::int8::{INT8_ABS_TOL, INT8_REL_TOL};
use kiln::infer::{HeadOutput, build_engine, cpu_engine_names};
use kiln::model::RegressionNet;
use kiln::predict::Predictor;
use kiln::rng::SplitMix64;

const FEATURES: [&str; 3] = ["a", "b", "c"];
const TARGETS: [&str; 2] = ["y1", "y2"];
const HIDDEN: [usize; 3] = [8, 7, 6];

/// A config as a user would pass it: a whole training config (keys the import ignores) plus
/// the normalisation section.
fn config_text(normalization: bool) -> String {
    let mut s = String::from(
        "name: torch\nseed: 3\ndata:\n  path: datasets/none.csv\n  features: [a, b, c]\n  targets: [y1, y2]\n  split:\n    train: {to: 2014}\n    validation: {from: 2015, to: 2016}\n    test: {from: 2017}\nmodel:\n  hidden: [8, 7, 6]\n  activation: gelu\nstages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 2\n",
    );
    if normalization {
        s.push_str("normalization:\n  features:\n    a: {mean: 10.0, std: 4.0}\n    c: {mean: -1.5, std: 0.5}\n  targets:\n    y2: {mean: 0.25, std: 0.1}\n");
    }
    s
}

/// A PyTorch `state_dict` in the article's layout, `[out, in]` weights, seeded numbers.
fn torch_state_dict(seed: u64) -> BTreeMap<String, HostTensor> {
    let mut rng = SplitMix64::new(seed);
    let mut t = BTreeMap::new();
    let mut fan_in = FEATURES.len();
    let mut layer = |t: &mut BTreeMap<String, HostTensor>, name: String, i: usize, o: usize| {
        let b = 1.0 / (i as f64).sqrt();
        let w = (0..o * i).map(|_| rng.uniform(-b, b) as f32).collect();
        let bias = (0..o).map(|_| rng.uniform(-b, b) as f32).collect();
        t.insert(
            format!("{name}.weight"),
            HostTensor {
                shape: vec![o, i],
                data: w,
            },
        );
        t.insert(
            format!("{name}.bias"),
            HostTensor {
                shape: vec![o],
                data: bias,
            },
        );
    };
    for (j, &h) in HIDDEN.iter().enumerate() {
        layer(&mut t, format!("backbone.{}", 2 * j), fan_in, h);
        fan_in = h;
    }
    layer(&mut t, "mean_head".into(), fan_in, TARGETS.len());
    layer(&mut t, "logvar_head".into(), fan_in, TARGETS.len());
    t
}

/// The Burn module built directly from the `[out, in]` numbers (transposed by Burn itself).
fn burn_reference(sd: &BTreeMap<String, HostTensor>) -> RegressionNet<Cpu> {
    let dev = Default::default();
    let linear = |name: &str| {
        let w = &sd[&format!("{name}.weight")];
        let b = &sd[&format!("{name}.bias")];
        let wt = Tensor::<Cpu, 2>::from_data(
            TensorData::new(w.data.clone(), [w.shape[0], w.shape[1]]),
            &dev,
        )
        .transpose();
        Linear {
            weight: Param::from_tensor(wt),
            bias: Some(Param::from_tensor(Tensor::from_data(
                TensorData::new(b.data.clone(), [b.shape[0]]),
                &dev,
            ))),
        }
    };
    RegressionNet {
        backbone: (0..HIDDEN.len())
            .map(|j| linear(&format!("backbone.{}", 2 * j)))
            .collect(),
        mean_head: linear("mean_head"),
        logvar_head: linear("logvar_head"),
        activation: Activation::Gelu,
        members: 1,
    }
}

fn write_inputs(dir: &Path, sd: &BTreeMap<String, HostTensor>, normalization: bool) {
    std::fs::write(dir.join("w.safetensors"), tensors_to_safetensors(sd)).unwrap();
    std::fs::write(dir.join("cfg.yaml"), config_text(normalization)).unwrap();
}

fn job(dir: &Path, out: &str, maps: Vec<KeyMap>) -> PytorchImport {
    PytorchImport {
        weights: dir.join("w.safetensors"),
        config: dir.join("cfg.yaml"),
        out: dir.join(out),
        maps,
    }
}

#[test]
fn a_pytorch_state_dict_answers_like_the_burn_module_in_every_engine() {
    let d = tempfile::tempdir().unwrap();
    let sd = torch_state_dict(11);
    write_inputs(d.path(), &sd, true);
    let m = job(d.path(), "ckpt", vec![]).run().unwrap();
    assert_eq!(m.architecture.hidden, HIDDEN);
    assert_eq!(
        m.parameter_count,
        3 * 8 + 8 + 8 * 7 + 7 + 7 * 6 + 6 + 2 * (6 * 2 + 2)
    );
    assert!(m.manifest_sha256.is_some());
    let ckpt = Checkpoint::load(&d.path().join("ckpt")).unwrap();
    // The file kiln wrote holds the same tensors under the same names.
    let bytes = std::fs::read(d.path().join("ckpt/model.safetensors")).unwrap();
    let back = kiln::import::read_state_dict(&bytes, Path::new("x"), &[]).unwrap();
    assert_eq!(back, sd, "a kiln checkpoint is the PyTorch state_dict");

    let rows = 33;
    let mut rng = SplitMix64::new(5);
    let x_norm: Vec<f32> = (0..rows * 3)
        .map(|_| rng.uniform(-2.0, 2.0) as f32)
        .collect();
    let net = burn_reference(&sd);
    let out = net.forward(Tensor::from_data(
        TensorData::new(x_norm.clone(), [rows, 3]),
        &Default::default(),
    ));
    let ref_mean = out.mean.into_data().to_vec::<f32>().unwrap();
    let ref_lv = out.log_var.into_data().to_vec::<f32>().unwrap();

    for name in cpu_engine_names() {
        let mut e = build_engine(name.parse().unwrap(), &ckpt.weights, 1).unwrap();
        let mut h = HeadOutput::default();
        e.forward(&x_norm, rows, &mut h).unwrap();
        for (got, want) in [(&h.mean, &ref_mean), (&h.log_var, &ref_lv)] {
            for (g, w) in got.iter().zip(want.iter()) {
                let tol = if name == "int8" {
                    INT8_ABS_TOL + INT8_REL_TOL * w.abs()
                } else {
                    1e-5
                };
                assert!((g - w).abs() <= tol, "{name}: {g} vs {w}");
            }
        }
    }

    // In original units: features de-normalised by the config's statistics (b identity),
    // targets scaled back (y1 identity).
    let x_raw: Vec<f32> = x_norm
        .chunks(3)
        .flat_map(|r| [r[0] * 4.0 + 10.0, r[1], r[2] * 0.5 - 1.5])
        .collect();
    let mut p = Predictor::for_checkpoint(
        &ckpt,
        build_engine(kiln::records::EngineKind::Burn, &ckpt.weights, 1).unwrap(),
    );
    let pred = p.predict(&x_raw, rows).unwrap();
    for i in 0..rows * 2 {
        let (mu, sd) = if i % 2 == 0 { (0.0, 1.0) } else { (0.25, 0.1) };
        let want_mean = ref_mean[i] as f64 * sd + mu;
        let want_std = (0.5 * ref_lv[i] as f64).exp() * sd;
        assert!((pred.mean[i] as f64 - want_mean).abs() < 1e-5, "row {i}");
        assert!((pred.std[i] as f64 - want_std).abs() < 1e-5 * want_std.max(1.0));
    }
}

#[test]
fn other_layer_names_map_and_other_float_types_convert() {
    let d = tempfile::tempdir().unwrap();
    let sd = torch_state_dict(12);
    // `net.{0,2,4}`, `mu`, `logvar_head` kept, stored as F64.
    let renamed: BTreeMap<String, HostTensor> = sd
        .iter()
        .map(|(k, t)| {
            let k = k.replace("backbone.", "net.").replace("mean_head.", "mu.");
            (k, t.clone())
        })
        .collect();
    let bytes_f64: Vec<(String, Vec<u8>, Vec<usize>)> = renamed
        .iter()
        .map(|(k, t)| {
            let b = t
                .data
                .iter()
                .flat_map(|&v| (v as f64).to_le_bytes())
                .collect();
            (k.clone(), b, t.shape.clone())
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes_f64
        .iter()
        .map(|(k, b, s)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F64, s.clone(), b)
                .unwrap();
            (k.clone(), v)
        })
        .collect();
    std::fs::write(
        d.path().join("w.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    std::fs::write(d.path().join("cfg.yaml"), config_text(false)).unwrap();

    // Without a map: every missing and unexpected tensor is named.
    let e = job(d.path(), "a", vec![]).run().unwrap_err().to_string();
    assert!(
        e.contains("missing tensor `backbone.0.weight` with shape [8, 3]")
            && e.contains("unexpected tensor `mu.bias`")
            && e.contains("`net.4.weight`"),
        "{e}"
    );
    assert!(!d.path().join("a").exists());
    let maps = vec![
        KeyMap::parse("net.=backbone.").unwrap(),
        KeyMap::parse("mu.=mean_head.").unwrap(),
    ];
    job(d.path(), "b", maps).run().unwrap();
    let ckpt = Checkpoint::load(&d.path().join("b")).unwrap();
    assert_eq!(ckpt.weights.to_tensors(), sd);
    assert_eq!(ckpt.manifest.features[1].std, 1.0, "identity normalisation");
    // An existing --out is refused, not overwritten.
    let e = job(
        d.path(),
        "b",
        vec![KeyMap::parse("net.=backbone.").unwrap()],
    )
    .run()
    .unwrap_err();
    assert!(matches!(e, ImportError::Exists { .. }), "{e}");
}

#[test]
fn a_shape_that_does_not_fit_the_config_names_the_tensor_and_both_shapes() {
    let d = tempfile::tempdir().unwrap();
    let mut sd = torch_state_dict(13);
    sd.insert(
        "backbone.2.weight".into(),
        HostTensor {
            shape: vec![9, 8],
            data: vec![0.0; 72],
        },
    );
    write_inputs(d.path(), &sd, false);
    let e = job(d.path(), "c", vec![]).run().unwrap_err().to_string();
    assert!(e.contains("w.safetensors"), "{e}");
    assert!(
        e.contains("tensor `backbone.2.weight` has shape [9, 8], expected [7, 8]"),
        "{e}"
    );
    // A normalisation entry for a column the config does not have is a located error.
    std::fs::write(
        d.path().join("cfg.yaml"),
        config_text(false) + "normalization:\n  features:\n    z: {mean: 1.0, std: 2.0}\n",
    )
    .unwrap();
    let e = job(d.path(), "c", vec![]).run().unwrap_err().to_string();
    assert!(
        e.contains("normalization.features.z") && e.contains("not in data.features"),
        "{e}"
    );
}

fn kiln(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(dir)
        .env_remove("KILN_LOG")
        .output()
        .expect("run kiln")
}

#[test]
fn kiln_import_pytorch_then_kiln_predict_with_every_engine() {
    let d = tempfile::tempdir().unwrap();
    write_inputs(d.path(), &torch_state_dict(14), true);
    let o = kiln(
        &[
            "import",
            "pytorch",
            "--weights",
            "w.safetensors",
            "--config",
            "cfg.yaml",
            "--out",
            "imported",
        ],
        d.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The printed path is absolute (it is handed on from other directories).
    let printed = std::path::PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    assert!(printed.is_absolute(), "{}", printed.display());
    assert_eq!(
        std::fs::canonicalize(&printed).unwrap(),
        std::fs::canonicalize(d.path().join("imported")).unwrap()
    );
    std::fs::write(
        d.path().join("in.csv"),
        "id,a,b,c\n1,10.0,0.5,-1.0\n2,3.0,-1.0,-2.0\n",
    )
    .unwrap();
    let mut answers = Vec::new();
    for engine in cpu_engine_names() {
        let o = kiln(
            &[
                "predict",
                "--checkpoint",
                "imported",
                "--input",
                "in.csv",
                "--engine",
                engine,
            ],
            d.path(),
        );
        assert!(
            o.status.success(),
            "{engine}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let text = String::from_utf8(o.stdout).unwrap();
        assert!(
            text.starts_with("id,y1_mean,y1_std,y2_mean,y2_std"),
            "{text}"
        );
        answers.push(text.lines().count());
    }
    assert_eq!(answers, vec![3; cpu_engine_names().len()]);
    // A bad map is a usage error (exit 2) naming the rule.
    let o = kiln(
        &[
            "import",
            "pytorch",
            "--weights",
            "w.safetensors",
            "--config",
            "cfg.yaml",
            "--out",
            "x",
            "--map",
            "nonsense",
        ],
        d.path(),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--map nonsense"));
}

#[test]
fn a_weight_that_is_not_finite_is_refused_naming_the_tensor_and_index() {
    for (value, shown) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "inf"),
        (f32::NEG_INFINITY, "-inf"),
    ] {
        let d = tempfile::tempdir().unwrap();
        let mut sd = torch_state_dict(15);
        // PyTorch layout [out, in]: output 4, input 2 of the second backbone layer.
        let t = sd.get_mut("backbone.2.weight").unwrap();
        let fan_in = t.shape[1];
        t.data[4 * fan_in + 2] = value;
        write_inputs(d.path(), &sd, false);
        let e = job(d.path(), "c", vec![]).run().unwrap_err().to_string();
        assert!(
            e.contains("w.safetensors")
                && e.contains(&format!(
                    "tensor `backbone.2.weight` has {shown} at index [4, 2]"
                )),
            "{e}"
        );
        assert!(!d.path().join("c").exists(), "nothing sealed");
        // The command says so too, with exit 2.
        let o = kiln(
            &[
                "import",
                "pytorch",
                "--weights",
                "w.safetensors",
                "--config",
                "cfg.yaml",
                "--out",
                "imported",
            ],
            d.path(),
        );
        assert_eq!(
            o.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("backbone.2.weight"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
