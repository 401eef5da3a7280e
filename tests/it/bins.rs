//! Piecewise-linear bins (`data.numeric_bins`): each numeric feature enters beside its value
//! as one input per bin at the training split's quantiles. The network's features are named
//! `<column>.bin<i>`, `kiln predict` encodes raw rows the same way training did (its test
//! RMSE is the manifest's), `kiln serve` answers raw columns as `kiln predict` does, ONNX
//! export refuses a binned feature by name, and a bad value is refused by key.

use std::path::{Path, PathBuf};

use serde_json::Value;

use serde_json::json;

use crate::common::{client, copy_dir, kiln, serve, serve_config, stderr, stdout};
use crate::ensemble::{config, predicted, table};

fn binned(dir: &Path, data: &Path, bins: &str) -> PathBuf {
    let cfg = config(dir, data, "  hidden: [16, 16]");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "  targets: [y]",
        &format!("  targets: [y]\n  numeric_bins: {bins}"),
    );
    std::fs::write(&cfg, text).unwrap();
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binned_features_train_predict_and_serve_like_training_and_are_refused_by_onnx() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("t.csv");
    let rows = table(&data, 600);
    let cfg = binned(tmp.path(), &data, "4");
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = PathBuf::from(stdout(&o).lines().last().unwrap().trim());

    // The network sees each value and its four bins.
    let loaded = kiln::artifact::Checkpoint::load(&ckpt).unwrap();
    let pre = loaded.manifest.input_preprocessing();
    assert_eq!(
        pre.network_features(),
        [
            "a", "a.bin0", "a.bin1", "a.bin2", "a.bin3", "b", "b.bin0", "b.bin1", "b.bin2",
            "b.bin3"
        ]
    );
    assert_eq!(loaded.weights.arch.n_features, 10);
    let edges = pre.inputs[0].bins.as_ref().unwrap();
    assert_eq!(edges.len(), 5);
    assert!(edges.windows(2).all(|w| w[0] < w[1]), "{edges:?}");
    // The edges are the training split's: its smallest and largest `a`.
    let train_a: Vec<f64> = rows.iter().filter(|r| r.0 == 0).map(|r| r.1).collect();
    let (lo, hi) = train_a
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
    assert!(
        (edges[0] - lo).abs() < 1e-5 && (edges[4] - hi).abs() < 1e-5,
        "{edges:?}"
    );

    // `kiln predict` on raw test rows gives the manifest's test RMSE.
    let test: Vec<_> = rows.iter().filter(|r| r.0 == 2).collect();
    let p = predicted(tmp.path(), &ckpt, &test);
    let rmse = (p.iter().map(|(y, m, _)| (y - m).powi(2)).sum::<f64>() / p.len() as f64).sqrt();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("manifest.json")).unwrap()).unwrap();
    let reported = manifest["metrics"]["test"]["targets"][0]["rmse_model"]
        .as_f64()
        .unwrap();
    assert!(
        (reported / rmse - 1.0).abs() < 1e-3,
        "manifest test RMSE {reported} vs {rmse} from kiln predict"
    );
    assert!(rmse < 0.3, "test RMSE {rmse}");

    // kiln serve takes the raw columns and bins them as kiln predict did.
    let repo = tempfile::tempdir().unwrap();
    copy_dir(&ckpt, &repo.path().join("binned").join("1"));
    let h = serve(serve_config(repo.path(), "fused")).await;
    let mut c = client(&h);
    let first: Vec<_> = test.iter().take(4).collect();
    let body = json!({"inputs": [
        {"name": "a", "datatype": "FP32", "shape": [4], "data": first.iter().map(|r| format!("{:.5}", r.1).parse::<f64>().unwrap()).collect::<Vec<_>>()},
        {"name": "b", "datatype": "FP32", "shape": [4], "data": first.iter().map(|r| format!("{:.5}", r.2).parse::<f64>().unwrap()).collect::<Vec<_>>()},
    ]});
    let r = c.post_json("/v2/models/binned/infer", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let served = crate::common::output_data(&r.json(), "mean");
    assert_eq!(served.len(), 4);
    for (s, (_, m, _)) in served.iter().zip(&p) {
        assert!(
            (s - m).abs() <= 1e-6 * m.abs().max(1.0),
            "served {s} vs predicted {m}"
        );
    }
    h.shutdown().await.unwrap();

    crate::common::onnx_refused(
        ckpt.to_str().unwrap(),
        tmp.path(),
        "feature `a` is binned (data.numeric_bins)",
    );

    // `--set` reaches the key in a config that leaves it out.
    let plain = config(tmp.path(), &data, "  hidden: [16, 16]");
    let o = kiln(&[
        "config",
        "check",
        plain.to_str().unwrap(),
        "--set",
        "data.numeric_bins=8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for bad in ["1", "65"] {
        let cfg = binned(tmp.path(), &data, bad);
        let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!(
                "invalid value for `data.numeric_bins`: expected 0 (no bins) or 2 to 64 bins, got {bad}"
            )),
            "{}",
            stderr(&o)
        );
    }
}
