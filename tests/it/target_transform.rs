//! Target transforms (`data.target_transform`): a price-like, positive, right-skewed target
//! trained as `log(price)` gives no negative prediction or interval bound in `kiln predict`,
//! its test metrics are in original units (they match the predictions written), the
//! transform travels in the checkpoint, ONNX export refuses it, and a value outside the
//! transform's support is an error naming the file, line and column.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{kiln, stderr, stdout};

/// Rows: `part` (0 train, 1 validation, 2 test), features `a`, `b`, and `price`, log-normal
/// around `exp(1 + 2a + b)` (σ 0.5 in log space): most prices are small, a few large.
fn price_table(path: &Path, rows: usize) -> Vec<(usize, f64, f64, f64)> {
    let mut next = crate::common::uniforms(777);
    let mut out = Vec::with_capacity(rows);
    let mut text = String::from("part,a,b,price\n");
    for i in 0..rows {
        let part = match i % 10 {
            0 | 1 => 2,
            2 | 3 => 1,
            _ => 0,
        };
        let (a, b) = (2.0 * next() - 1.0, 2.0 * next() - 1.0);
        // A normal deviate from two uniforms (Box–Muller).
        let n = (-2.0 * next().ln()).sqrt() * (std::f64::consts::TAU * next()).cos();
        let price = (1.0 + 2.0 * a + b + 0.5 * n).exp();
        text.push_str(&format!("{part},{a:.5},{b:.5},{price:.5}\n"));
        out.push((part, a, b, price));
    }
    std::fs::write(path, text).unwrap();
    out
}

fn config(dir: &Path, data: &Path, transform: &str) -> PathBuf {
    let text = format!(
        "name: prices
seed: 5
data:
  path: {}
  features: [a, b]
  targets: [price]
  target_transform: {{price: {transform}}}
  split:
    column: part
    train: {{to: 0}}
    validation: {{from: 1, to: 1}}
    test: {{from: 2, to: 2}}
model:
  hidden: [16]
loader:
  batch_size: 32
  num_workers: 0
stages:
  - name: mean
    trainable: [backbone, mean_head]
    loss: mse
    epochs: 30
    optimizer: {{lr: 1.0e-2}}
  - name: variance
    trainable: [logvar_head]
    loss: gaussian_nll
    epochs: 10
    optimizer: {{lr: 1.0e-2, weight_decay: 0.0}}
export:
  dir: {}
",
        data.display(),
        dir.join("out").display()
    );
    let p = dir.join(format!("prices-{transform}.yaml"));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_log_target_predicts_in_original_units_inside_its_support() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("prices.csv");
    let rows = price_table(&data, 800);
    let cfg = config(tmp.path(), &data, "log");
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = stdout(&o).lines().last().unwrap().trim().to_string();

    // The transform is in the manifest's target statistics; the normalisation is log space's.
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(Path::new(&ckpt).join("manifest.json")).unwrap())
            .unwrap();
    let t = &manifest["targets"][0];
    assert_eq!(t["transform"], "log", "{t}");
    assert!(t["mean"].as_f64().unwrap() < 3.0, "{t}");
    let loaded = kiln::artifact::Checkpoint::load(Path::new(&ckpt)).unwrap();
    assert_eq!(
        loaded.manifest.targets[0].transform,
        kiln::config::TargetTransform::Log
    );

    // kiln predict over the test rows: mean, std and the 90 % interval, all positive.
    let input = tmp.path().join("query.csv");
    let test: Vec<&(usize, f64, f64, f64)> = rows.iter().filter(|r| r.0 == 2).collect();
    let mut q = String::from("a,b\n");
    for r in &test {
        q.push_str(&format!("{:.5},{:.5}\n", r.1, r.2));
    }
    // Far outside the training range too: the bounds stay positive.
    q.push_str("-6,-6\n6,6\n");
    std::fs::write(&input, q).unwrap();
    let out = tmp.path().join("pred.csv");
    let o = crate::common::predict(&ckpt, &input, &out);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("price_mean,price_std,price_q05,price_q95")
    );
    let pred: Vec<[f64; 4]> = lines
        .map(|l| {
            let c: Vec<f64> = l.split(',').map(|v| v.parse().unwrap()).collect();
            [c[0], c[1], c[2], c[3]]
        })
        .collect();
    assert_eq!(pred.len(), test.len() + 2);
    for p in &pred {
        let [mean, std, lo, hi] = *p;
        assert!(lo > 0.0 && lo < hi && mean > lo && std > 0.0, "{p:?}");
    }

    // The test metrics are in original units: the RMSE and the 90 % coverage of the
    // predictions just written, on the same rows.
    let (mut se, mut inside) = (0.0, 0usize);
    for (r, p) in test.iter().zip(&pred) {
        se += (r.3 - p[0]).powi(2);
        inside += usize::from(p[2] <= r.3 && r.3 <= p[3]);
    }
    let rmse = (se / test.len() as f64).sqrt();
    let report = &manifest["metrics"]["test"]["targets"][0];
    let reported = report["rmse_model"].as_f64().unwrap();
    assert!(
        (reported / rmse - 1.0).abs() < 1e-3,
        "manifest test RMSE {reported} vs {rmse} from kiln predict"
    );
    let cov = report["coverage_90"].as_f64().unwrap();
    // (one row exactly on a bound may round either way between f32 and f64)
    assert!(
        (cov * test.len() as f64 - inside as f64).abs() <= 1.0 + 1e-9,
        "coverage {cov} vs {inside}/{}",
        test.len()
    );
    // The model learned: far better than predicting the training mean; the NLL is the
    // density of price (a log-normal's NLL in original units is larger than log space's).
    assert!(
        reported < 0.8 * report["rmse_train_mean"].as_f64().unwrap(),
        "{report}"
    );
    assert!(report["nll_model"].as_f64().unwrap() > 1.0, "{report}");

    // ONNX cannot carry the inverse: export is refused, naming the target and transform.
    crate::common::onnx_refused(
        &ckpt,
        tmp.path(),
        "target `price` is trained with target_transform `log`",
    );
}

#[test]
fn a_value_outside_the_support_is_an_error_naming_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("prices.csv");
    price_table(&data, 60);
    // Row 7 (line 9) gets a zero price.
    let text = std::fs::read_to_string(&data).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut cells: Vec<String> = lines[8].split(',').map(String::from).collect();
    cells[3] = "0".into();
    lines[8] = cells.join(",");
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let cfg = config(tmp.path(), &data, "log");
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains(":9: column `price`: 0 (data row 8, train split): the target transform `log` needs y > 0"),
        "{e}"
    );
    // log1p accepts the zero.
    let cfg = config(tmp.path(), &data, "log1p");
    let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A transform of a column that is not a target is a config error naming the key.
    let bad = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("{price: log1p}", "{a: log}");
    std::fs::write(&cfg, bad).unwrap();
    let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("data.target_transform.a"),
        "{}",
        stderr(&o)
    );
}
