//! Packed ensembles (`model.ensemble: K`): K independent networks trained at once, exported
//! as the one plain network every engine serves. The export's between-member weights are
//! zero, its test metrics are those of `kiln predict` on the same rows, a run killed midway
//! and resumed exports the uninterrupted run's weights bit for bit, and bad values are refused
//! by key.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{exported, kiln, kiln_env, only_run, resume, stderr, stdout};

/// Rows: `part` (0 train, 1 validation, 2 test), features `a`, `b`, and `y = sin(3a) + b² +
/// noise`.
pub(crate) fn table(path: &Path, rows: usize) -> Vec<(usize, f64, f64, f64)> {
    let mut next = crate::common::uniforms(4242);
    let mut out = Vec::with_capacity(rows);
    let mut text = String::from("part,a,b,y\n");
    for i in 0..rows {
        let part = match i % 10 {
            0 | 1 => 2,
            2 | 3 => 1,
            _ => 0,
        };
        let (a, b) = (2.0 * next() - 1.0, 2.0 * next() - 1.0);
        let y = (3.0 * a).sin() + b * b + 0.1 * (next() - 0.5);
        text.push_str(&format!("{part},{a:.5},{b:.5},{y:.5}\n"));
        out.push((part, a, b, y));
    }
    std::fs::write(path, text).unwrap();
    out
}

pub(crate) fn config(dir: &Path, data: &Path, model: &str) -> PathBuf {
    let text = format!(
        "name: members
seed: 9
data:
  path: {}
  features: [a, b]
  targets: [y]
  split:
    column: part
    train: {{to: 0}}
    validation: {{from: 1, to: 1}}
    test: {{from: 2, to: 2}}
model:
{model}
loader:
  batch_size: 32
  num_workers: 0
stages:
  - name: mean
    trainable: [backbone, mean_head]
    loss: mse
    epochs: 12
    optimizer: {{lr: 1.0e-2}}
    schedule: {{kind: cosine, warmup: 0.05}}
  - name: variance
    trainable: [logvar_head]
    loss: gaussian_nll
    epochs: 4
    optimizer: {{lr: 1.0e-2, weight_decay: 0.0}}
export:
  dir: {}
",
        data.display(),
        dir.join("out").display()
    );
    let p = dir.join("members.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

const THREE: &str = "  hidden: [16, 8]\n  ensemble: 3";

#[test]
fn a_packed_ensemble_exports_one_plain_network_that_serves_its_members_mean() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("t.csv");
    let rows = table(&data, 600);
    let cfg = config(tmp.path(), &data, THREE);
    let o = kiln(&["train", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("2 → 3 × [16, 8] packed as [48, 24] → 2×1"),
        "{}",
        stderr(&o)
    );
    let ckpt = exported(&o);

    // One plain network three times as wide; member m owns columns 16m.. and 8m.. and the
    // weights between members are zero, those within a member are not.
    let loaded = kiln::artifact::Checkpoint::load(&ckpt).unwrap();
    assert_eq!(loaded.weights.arch.hidden, vec![48, 24]);
    let l1 = &loaded.weights.backbone[1];
    assert_eq!((l1.fan_in, l1.fan_out), (48, 24));
    for r in 0..48 {
        for c in 0..24 {
            let w = l1.w[r * 24 + c];
            match r / 16 == c / 8 {
                true => assert!(w != 0.0, "member weight ({r}, {c}) is zero"),
                false => assert_eq!(w, 0.0, "between-member weight ({r}, {c})"),
            }
        }
    }

    // The manifest's test metrics are what `kiln predict` serves on the same rows.
    let test = tmp.path().join("test.csv");
    let mut text = String::from("a,b\n");
    let test_rows: Vec<_> = rows.iter().filter(|r| r.0 == 2).collect();
    for r in &test_rows {
        text.push_str(&format!("{:.5},{:.5}\n", r.1, r.2));
    }
    std::fs::write(&test, text).unwrap();
    let pred = tmp.path().join("pred.csv");
    let o = crate::common::predict(ckpt.to_str().unwrap(), &test, &pred);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&pred).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "y_mean").unwrap();
    let se: f64 = lines
        .zip(&test_rows)
        .map(|(l, r)| (l.split(',').nth(col).unwrap().parse::<f64>().unwrap() - r.3).powi(2))
        .sum();
    let rmse = (se / test_rows.len() as f64).sqrt();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("manifest.json")).unwrap()).unwrap();
    let report = &manifest["metrics"]["test"]["targets"][0];
    let reported = report["rmse_model"].as_f64().unwrap();
    assert!(
        (reported / rmse - 1.0).abs() < 1e-3,
        "manifest test RMSE {reported} vs {rmse} from kiln predict"
    );
    // It learned: far below the target's spread (sd ≈ 0.8).
    assert!(rmse < 0.3, "test RMSE {rmse}");
}

/// `kiln predict` on `rows` of `t.csv`: (y, predicted mean, predicted std) per row.
pub(crate) fn predicted(
    dir: &Path,
    ckpt: &Path,
    rows: &[&(usize, f64, f64, f64)],
) -> Vec<(f64, f64, f64)> {
    let input = dir.join("rows.csv");
    let mut text = String::from("a,b\n");
    for r in rows {
        text.push_str(&format!("{:.5},{:.5}\n", r.1, r.2));
    }
    std::fs::write(&input, text).unwrap();
    let out = dir.join("rows-pred.csv");
    let o = crate::common::predict(ckpt.to_str().unwrap(), &input, &out);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (m, s) = (at("y_mean"), at("y_std"));
    lines
        .zip(rows)
        .map(|(l, r)| {
            let c: Vec<f64> = l.split(',').map(|v| v.parse().unwrap()).collect();
            (r.3, c[m], c[s])
        })
        .collect()
}

/// The variance stage starts at the constant-variance solution of the (ensemble) mean's
/// training residuals: with a learning rate too small to move it, every row's σ² is the mean
/// squared training residual of the served mean.
#[test]
fn the_variance_stage_starts_at_the_constant_variance_of_the_training_residuals() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("t.csv");
    let rows = table(&data, 400);
    let cfg = config(tmp.path(), &data, THREE);
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "optimizer: {lr: 1.0e-2, weight_decay: 0.0}",
        "optimizer: {lr: 1.0e-12, weight_decay: 0.0}",
    );
    std::fs::write(&cfg, text).unwrap();
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = exported(&o);
    let train: Vec<_> = rows.iter().filter(|r| r.0 == 0).collect();
    let p = predicted(tmp.path(), &ckpt, &train);
    let mse = p.iter().map(|(y, m, _)| (y - m).powi(2)).sum::<f64>() / p.len() as f64;
    for (_, _, sd) in &p {
        assert!(
            (sd * sd / mse - 1.0).abs() < 1e-3,
            "σ² {} against the mean squared training residual {mse}",
            sd * sd
        );
    }
}

#[test]
fn a_packed_ensemble_killed_midway_resumes_to_the_same_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("t.csv");
    table(&data, 400);
    let export = |dir: &str| {
        let d = tmp.path().join(dir);
        std::fs::create_dir_all(&d).unwrap();
        config(&d, &data, THREE)
    };
    let whole = export("whole");
    let o = kiln(&["train", whole.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let reference = kiln::artifact::Checkpoint::load(&exported(&o))
        .unwrap()
        .weights;

    let cut = export("cut");
    let o = kiln_env(
        &["train", cut.to_str().unwrap(), "-q"],
        &[("KILN_FAULT", "kill@after-epoch-log:5")],
    );
    assert!(!o.status.success(), "the planted kill did not happen");
    let run = only_run(&tmp.path().join("cut/out"));
    let o = resume(&cut, &run);
    assert!(o.status.success(), "{}", stderr(&o));
    let resumed = kiln::artifact::Checkpoint::load(&exported(&o))
        .unwrap()
        .weights;
    assert_eq!(resumed, reference);
}

#[test]
fn ensemble_values_are_refused_by_key() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("t.csv");
    table(&data, 100);
    for (model, want) in [
        (
            "  hidden: [16]\n  ensemble: 0",
            "invalid value for `model.ensemble`: expected 1 to 16 members, got 0",
        ),
        (
            "  hidden: [16]\n  ensemble: 17",
            "invalid value for `model.ensemble`: expected 1 to 16 members, got 17",
        ),
        (
            "  hidden: [16]\n  ensemble: 2\ndistill:\n  checkpoints: [nowhere]",
            "invalid value for `model.ensemble`: a distilled student is one network",
        ),
        (
            "  hidden: [1152921504606846976]\n  ensemble: 16",
            "invalid value for `model.hidden[0]`: expected a width in 1..=4096 (16 ensemble members side by side), got 1152921504606846976",
        ),
        (
            "  hidden: [8000]\n  ensemble: 16",
            "invalid value for `model.hidden[0]`: expected a width in 1..=4096 (16 ensemble members side by side), got 8000",
        ),
    ] {
        let cfg = config(tmp.path(), &data, model);
        let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{model}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{model}: {}", stderr(&o));
    }
    let cfg = config(tmp.path(), &data, THREE);
    let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("hidden 3 members × [16, 8]"),
        "{}",
        stdout(&o)
    );
}
