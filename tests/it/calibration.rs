//! The uncertainty head judged: `calibration: variance_scaling` on a deliberately
//! mis-calibrated tiny model (the variance stage barely trained) moves test calibration toward
//! nominal, and every consumer — the `Predictor` behind `kiln predict` and `kiln pick`, HTTP
//! and gRPC serving — applies the same scale; `kiln pick evaluate` scores pick probabilities
//! against outcomes, checked here with an independent normal CDF.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln::artifact::Checkpoint;
use kiln::config;
use kiln::infer::build_engine;
use kiln::loadgen::client::HttpClient;
use kiln::predict::Predictor;
use kiln::serve::ServeConfig;
use kiln::serve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use kiln::serve::grpc::proto::{self as pb, model_infer_request as mir};
use kiln::serve::protocol::{OutputData, decode_response};
use kiln::train::train_cpu;
use serde_json::{Value, json};

use crate::common::{kiln, root, tiny_config};

/// The tiny config with a variance stage that hardly moves (one epoch at lr 1e−5: σ stays near
/// its random initial value, far from the residuals) and, when `calibrate`, recalibration. The
/// stage also lists the mean head (which lr 1e−5 leaves as it is), so that it does not start
/// from the constant-variance solution a stage of the log-variance head alone starts from.
fn miscalibrated(dir: &Path, calibrate: bool) -> PathBuf {
    let cal = if calibrate {
        "calibration: variance_scaling\nexport:"
    } else {
        "export:"
    };
    let path = tiny_config(
        dir,
        &dir.join("out"),
        &[
            (
                "    epochs: 2\n    optimizer: {lr: 1.0e-2, weight_decay: 0.0}",
                "    epochs: 1\n    optimizer: {lr: 1.0e-5, weight_decay: 0.0}",
            ),
            (
                "trainable: [logvar_head]",
                "trainable: [mean_head, logvar_head]",
            ),
            ("export:", cal),
        ],
    );
    let loaded = config::load(&path).unwrap();
    train_cpu(&loaded, &dir.join("out"))
        .unwrap()
        .outcome
        .export_dir
        .unwrap()
}

fn sum_over_targets(report: &Value, f: impl Fn(&Value) -> f64) -> f64 {
    report["targets"].as_array().unwrap().iter().map(f).sum()
}

fn le(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn std_output<S>(outs: Vec<(String, S, OutputData)>) -> Vec<f32> {
    outs.into_iter()
        .find(|(n, _, _)| n == "std")
        .map(|(_, _, d)| match d {
            OutputData::F32(v) => v,
            other => panic!("{other:?}"),
        })
        .expect("a std output")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variance_scaling_moves_test_calibration_toward_nominal_in_every_consumer() {
    let tmp = tempfile::tempdir().unwrap();
    let export = miscalibrated(tmp.path(), true);
    let ckpt = Checkpoint::load(&export).unwrap();
    let m = &ckpt.manifest;
    let metrics = serde_json::to_value(&m.metrics).unwrap();
    let before = &metrics["test_before_calibration"];
    let after = &metrics["test"];
    assert!(before["targets"].is_array(), "{metrics}");
    let miss = |r: &Value| {
        sum_over_targets(r, |t| {
            (t["coverage_90"].as_f64().unwrap() - 0.9).abs()
                + (t["coverage_50"].as_f64().unwrap() - 0.5).abs()
        })
    };
    let cal = |r: &Value| sum_over_targets(r, |t| t["calibration_error"].as_f64().unwrap());
    let nll = |r: &Value| sum_over_targets(r, |t| t["nll_model"].as_f64().unwrap());
    assert!(
        miss(after) < miss(before),
        "coverage miss {} → {}",
        miss(before),
        miss(after)
    );
    assert!(cal(after) < cal(before), "{} → {}", cal(before), cal(after));
    assert!(nll(after) < nll(before), "{} → {}", nll(before), nll(after));
    // The mean head is untouched.
    for (b, a) in before["targets"]
        .as_array()
        .unwrap()
        .iter()
        .zip(after["targets"].as_array().unwrap())
    {
        assert_eq!(b["mse_model"], a["mse_model"]);
    }
    let info = m.calibration.as_ref().expect("the manifest records it");
    assert_eq!(info.method, "variance_scaling");
    assert_eq!(info.std_scale.len(), 3);
    assert!(
        info.std_scale
            .iter()
            .all(|s| s.is_finite() && (s - 1.0).abs() > 0.05),
        "a barely trained variance head needs rescaling: {:?}",
        info.std_scale
    );
    assert!(metrics["validation"]["targets"].is_array());
    // The pictures: per target a reliability diagram and PIT histogram, SVG and PNG.
    let run_dir = export.parent().unwrap();
    for t in ["hr_rate", "bb_rate", "so_rate"] {
        let svg = std::fs::read_to_string(run_dir.join(format!("calibration_{t}.svg"))).unwrap();
        assert!(svg.contains("PIT histogram") && svg.contains("nominal coverage"));
        let png = std::fs::read(run_dir.join(format!("calibration_{t}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }

    // The Predictor (kiln predict, kiln pick): σ = s · σ of the uncalibrated network.
    let n = 9;
    let x = crate::common::rows_around_means(&export, n, 5);
    let mut p = Predictor::for_checkpoint(
        &ckpt,
        build_engine(kiln::records::EngineKind::Burn, &ckpt.weights, 1).unwrap(),
    );
    let cal_pred = p.predict(&x, n).unwrap();
    let mut raw = ckpt.weights.clone();
    for (b, s) in raw.logvar_head.b.iter_mut().zip(&info.std_scale) {
        *b = (*b as f64 - (s * s).ln()) as f32;
    }
    let mut pu = Predictor::new(
        build_engine(kiln::records::EngineKind::Burn, &raw, 1).unwrap(),
        &m.features,
        &m.targets,
    );
    let raw_pred = pu.predict(&x, n).unwrap();
    for (i, (&c, &r)) in cal_pred.std.iter().zip(&raw_pred.std).enumerate() {
        let want = r as f64 * info.std_scale[i % 3];
        assert!((c as f64 - want).abs() <= 1e-5 * want, "{c} vs {want}");
    }
    assert_eq!(cal_pred.mean, raw_pred.mean);

    // HTTP and gRPC serving answer the calibrated σ.
    let repo = crate::common::repository_of(&export);
    let cfg = ServeConfig {
        grpc_port: Some(0),
        ..crate::common::serve_config(repo.path(), "burn")
    };
    let h = crate::common::serve(cfg).await;
    let mut c = HttpClient::new(h.addr).with_timeout(Duration::from_secs(20));
    let r = c
        .post_json(
            "/v2/models/tiny/infer",
            &json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [n, 10], "data": x}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let (_, outs) = decode_response(&r.body, None).unwrap();
    assert_eq!(std_output(outs), cal_pred.std, "HTTP vs predict");
    let addr = h.grpc_addr.expect("gRPC is on");
    let mut g = GrpcInferenceServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let req = pb::ModelInferRequest {
        model_name: "tiny".into(),
        inputs: vec![mir::InferInputTensor {
            name: "features".into(),
            datatype: "FP32".into(),
            shape: vec![n as i64, 10],
            ..Default::default()
        }],
        raw_input_contents: vec![le(&x).into()],
        ..Default::default()
    };
    let resp = g.model_infer(req).await.unwrap().into_inner();
    let i = resp.outputs.iter().position(|o| o.name == "std").unwrap();
    let grpc_std: Vec<f32> = resp.raw_output_contents[i]
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(grpc_std, cal_pred.std, "gRPC vs predict");
    h.shutdown().await.unwrap();
}

/// Φ by Abramowitz & Stegun 7.1.26 (|error| < 1.5e−7), independent of kiln's estimator.
fn phi_as(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-z * z).exp();
    if x >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

#[test]
fn pick_evaluate_scores_single_legs_like_an_independent_count() {
    let tmp = tempfile::tempdir().unwrap();
    let export = miscalibrated(tmp.path(), false);
    let o = kiln(&[
        "pick",
        "evaluate",
        "--checkpoint",
        export.to_str().unwrap(),
        "--json",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let ev: Value = serde_json::from_slice(&o.stdout).unwrap();
    let kinds = ev["kinds"].as_array().unwrap();
    assert_eq!(kinds.len(), 2, "{ev}");
    assert_eq!(kinds[1]["kind"], "3-leg picks");
    assert!(kinds[1]["independence"]["brier"].as_f64().is_some());

    // Recompute the single legs: every test row × target, over the persistence line.
    let ckpt = Checkpoint::load(&export).unwrap();
    let loaded = config::load(&export.parent().unwrap().join("config.yaml")).unwrap();
    let mut data_cfg = loaded.config.data.clone();
    data_cfg.path = root().join(&data_cfg.path);
    let data = kiln::data::Dataset::load(&data_cfg).unwrap();
    let mut p = Predictor::for_checkpoint(
        &ckpt,
        build_engine(kiln::records::EngineKind::Burn, &ckpt.weights, 1).unwrap(),
    );
    let rows = data.test.rows();
    let pred = p.predict(&data.test.x, rows).unwrap();
    let nf = data.features.len();
    let (mut brier, mut ll, mut n, mut pushes) = (0.0, 0.0, 0usize, 0usize);
    let (mut hits_val, mut n_val) = (0usize, 0usize);
    for (j, t) in data.targets.iter().enumerate() {
        let f = data
            .features
            .iter()
            .position(|c| *c == format!("{t}_l1"))
            .unwrap();
        for r in 0..rows {
            let (y, line) = (
                data.test.y[r * 3 + j] as f64,
                data.test.x[r * nf + f] as f64,
            );
            if y == line {
                pushes += 1;
                continue;
            }
            let (mu, sd) = (pred.mean[r * 3 + j] as f64, pred.std[r * 3 + j] as f64);
            let q = 1.0 - phi_as((line - mu) / sd);
            let h = if y > line { 1.0 } else { 0.0 };
            brier += (q - h) * (q - h);
            ll -= h * q.max(1e-12).ln() + (1.0 - h) * (1.0 - q).max(1e-12).ln();
            n += 1;
        }
        for r in 0..data.validation.rows() {
            let (y, line) = (
                data.validation.y[r * 3 + j] as f64,
                data.validation.x[r * nf + f] as f64,
            );
            if y != line {
                n_val += 1;
                hits_val += usize::from(y > line);
            }
        }
    }
    let single = &kinds[0];
    assert_eq!(single["model"]["n"].as_u64().unwrap() as usize, n);
    assert_eq!(single["pushes"].as_u64().unwrap() as usize, pushes);
    let got = single["model"]["brier"].as_f64().unwrap();
    assert!(
        (got - brier / n as f64).abs() < 1e-5,
        "{got} vs {}",
        brier / n as f64
    );
    let got = single["model"]["log_loss"].as_f64().unwrap();
    assert!(
        (got - ll / n as f64).abs() < 1e-4,
        "{got} vs {}",
        ll / n as f64
    );
    let c = hits_val as f64 / n_val as f64;
    assert!((single["constant_p"].as_f64().unwrap() - c).abs() < 1e-12);

    // The plain table names the baselines.
    let o = kiln(&["pick", "evaluate", "--checkpoint", export.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    for w in [
        "brier",
        "log loss",
        "independence",
        "constant",
        "reliability",
    ] {
        assert!(out.contains(w), "{w} missing from\n{out}");
    }
}

/// The metric maths through the public API, against closed forms and hand counts (the same
/// cases as the unit tests beside the code, so the release integration binary checks them
/// too).
#[test]
fn metric_maths_against_closed_forms_and_hand_counts() {
    use kiln::pick::outcomes::{brier, log_loss, median, score};
    use kiln::train::uncertainty as u;
    // CRPS of N(0,1) at 0 = 2φ(0) − 1/√π = (√2 − 1)/√π ≈ 0.2336950.
    let c0 = (2f64.sqrt() - 1.0) / std::f64::consts::PI.sqrt();
    assert!((u::crps_one(0.0, 0.0, 1.0) - c0).abs() < 1e-15);
    assert!((c0 - 0.233_695_0).abs() < 1e-7);
    // Scale/shift; and the definition ∫(F − 1{x ≥ y})² dx by the midpoint rule.
    assert!((u::crps_one(5.0, 3.0, 2.0) - 2.0 * u::crps_one(1.0, 0.0, 1.0)).abs() < 1e-14);
    let (y, mu, sd) = (0.7, 0.0, 1.0);
    let n = 200_000;
    let side = |a: f64, b: f64, f: &dyn Fn(f64) -> f64| {
        let h = (b - a) / n as f64;
        (0..n).map(|i| f(a + (i as f64 + 0.5) * h)).sum::<f64>() * h
    };
    let num = side(-12.0, y, &|x| phi_as((x - mu) / sd).powi(2))
        + side(y, 12.0, &|x| (1.0 - phi_as((x - mu) / sd)).powi(2));
    assert!((u::crps_one(y, mu, sd) - num).abs() < 1e-6, "{num}");
    // NLL of N(1, 4) at 3: ½ln2π + ln 2 + ½.
    let want = 0.5 * (2.0 * std::f64::consts::PI).ln() + 2f64.ln() + 0.5;
    assert!((u::nll_one(3.0, 1.0, 2.0) - want).abs() < 1e-15);
    // Point errors by hand, and a weight of 2 counting a row twice.
    let (yy, p) = ([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 3.0, 2.0]);
    assert!((u::rmse(&yy, &p, None) - 1.25f64.sqrt()).abs() < 1e-15);
    assert_eq!(u::mae(&yy, &p, None), 0.75);
    assert!(u::r2(&yy, &p, None).abs() < 1e-15);
    let w = [2.0, 1.0, 1.0, 1.0];
    let (y2, p2) = ([1.0, 1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 3.0, 3.0, 2.0]);
    assert!((u::r2(&yy, &p, Some(&w)) - u::r2(&y2, &p2, None)).abs() < 1e-15);
    // Coverage on constructed z-scores: 80 % half-width is 1.2816.
    let z = [0.0, 1.28, 1.29, -3.0, -1.0];
    let ys: Vec<f64> = z.iter().map(|z| 10.0 + 2.0 * z).collect();
    let pit = u::pit(&ys, &[10.0; 5], &[2.0; 5]);
    assert_eq!(u::coverage(&pit, 0.8, None), 0.6);
    assert_eq!(u::coverage(&pit, 0.5, None), 0.2);
    assert_eq!(u::coverage(&pit, 0.95, None), 0.8);
    // A PIT on the bin midpoints is perfectly calibrated and flat.
    let uni: Vec<f64> = (0..100).map(|i| (i as f64 + 0.5) / 100.0).collect();
    assert!(u::calibration_error(&uni, None) < 1e-12);
    assert!(
        u::pit_histogram(&uni, None)
            .iter()
            .all(|v| (v - 0.1).abs() < 1e-12)
    );
    // The variance scale makes standardised residuals unit.
    let (yv, sv) = ([1.0, -2.0, 0.5, 3.0, -1.5], [0.5, 1.0, 0.25, 2.0, 1.0]);
    let s2 = u::variance_scale(&yv, &[0.0; 5], &sv, None);
    let scaled: Vec<f64> = sv.iter().map(|v| v * s2.sqrt()).collect();
    assert!((u::variance_scale(&yv, &[0.0; 5], &scaled, None) - 1.0).abs() < 1e-12);
    // Brier and log loss by hand.
    let (pp, hh) = ([0.9, 0.2, 0.5, 1.0], [true, true, false, true]);
    assert!((brier(&pp, &hh) - 0.225).abs() < 1e-15);
    let ll = -(0.9f64.ln() + 0.2f64.ln() + 0.5f64.ln() + (1.0f64 - 1e-12).ln()) / 4.0;
    assert!((log_loss(&pp, &hh) - ll).abs() < 1e-15);
    let s = score(&pp, &hh);
    assert_eq!((s.n, s.hit_rate, s.reliability.len()), (4, 0.75, 3));
    assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
}
