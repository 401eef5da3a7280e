//! Early stopping per stage (`stages[i].early_stopping: {patience, min_delta}`): the stage ends
//! when the validation loss has not improved by more than `min_delta` for `patience` epochs,
//! the best epoch is restored, and a killed-and-resumed run stops where the uninterrupted one
//! does, with the same weights.

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::artifact::Checkpoint;

use crate::common::only_run;
use crate::common::{kiln, root, tiny_config};

/// The tiny config with its first stage given `epochs` and `early_stopping`.
fn config(dir: &Path, epochs: usize, patience: usize, min_delta: f64) -> PathBuf {
    tiny_config(
        dir,
        &dir.join("out"),
        &[(
            "    epochs: 3\n    optimizer: {lr: 1.0e-2}\n",
            &format!(
                "    epochs: {epochs}\n    early_stopping: {{patience: {patience}, min_delta: {min_delta}}}\n    optimizer: {{lr: 1.0e-2}}\n"
            ),
        )],
    )
}

/// (stage, validation loss) per epoch, from the run's `epochs.jsonl`.
fn epochs(run: &Path) -> Vec<(usize, f64)> {
    std::fs::read_to_string(run.join("epochs.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["stage"].as_u64().unwrap() as usize,
                v["val_loss"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The rule, restated independently of kiln's code: the number of epochs a stage with
/// validation losses `all` (as if it ran every epoch) runs before stopping.
fn expected_epochs(all: &[f64], patience: usize, min_delta: f64) -> usize {
    let mut best = f64::INFINITY;
    let mut last = 0usize;
    for (i, &v) in all.iter().enumerate() {
        if i == 0 || v < best - min_delta {
            best = v;
            last = i;
        }
        if i - last >= patience {
            return i + 1;
        }
    }
    all.len()
}

#[test]
fn a_stage_stops_after_patience_epochs_without_improvement_and_keeps_its_best() {
    let tmp = tempfile::tempdir().unwrap();
    // A min_delta no epoch can beat: epoch 1 sets the reference, epochs 2 and 3 bring no
    // improvement beyond it, so the stage ends after 3 of its 40 epochs.
    let cfg = config(tmp.path(), 40, 2, 1.0e3);
    let o = kiln(&["train", cfg.to_str().unwrap(), "--plain"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run = only_run(&tmp.path().join("out"));
    let e = epochs(&run);
    let stage0: Vec<f64> = e.iter().filter(|r| r.0 == 0).map(|r| r.1).collect();
    let stage1 = e.iter().filter(|r| r.0 == 1).count();
    assert_eq!(stage0.len(), 3, "{e:?}");
    assert_eq!(
        stage1, 2,
        "the second stage (no early stopping) runs its 2 epochs"
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("early stop after epoch 3/40"),
        "the stop is reported: {stderr}"
    );
    // The run still exports and evaluates.
    let ckpt = Checkpoint::load(&run.join("export")).unwrap();
    assert!(ckpt.manifest.weights.sha256.len() == 64);
}

#[test]
fn the_stop_epoch_follows_the_rule_on_real_losses() {
    // Run the stage without early stopping for 12 epochs, then with patience 2 and a small
    // min_delta: the losses are identical epoch for epoch (same seed), so the stop epoch must
    // be the one the rule gives on the full sequence.
    let full_dir = tempfile::tempdir().unwrap();
    let full = tiny_config(
        full_dir.path(),
        &full_dir.path().join("out"),
        &[("    epochs: 3\n", "    epochs: 12\n")],
    );
    let o = kiln(&["train", full.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let all: Vec<f64> = epochs(&only_run(&full_dir.path().join("out")))
        .into_iter()
        .filter(|r| r.0 == 0)
        .map(|r| r.1)
        .collect();
    assert_eq!(all.len(), 12);
    let min_delta = 2.0e-4;
    let want = expected_epochs(&all, 2, min_delta);

    let es_dir = tempfile::tempdir().unwrap();
    let cfg = config(es_dir.path(), 12, 2, min_delta);
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: Vec<f64> = epochs(&only_run(&es_dir.path().join("out")))
        .into_iter()
        .filter(|r| r.0 == 0)
        .map(|r| r.1)
        .collect();
    assert_eq!(got.len(), want, "losses {all:?}");
    assert_eq!(got[..], all[..want], "same seed, same losses");
}

#[test]
fn a_killed_run_resumes_to_the_same_stop_and_weights() {
    let reference = tempfile::tempdir().unwrap();
    let cfg = config(reference.path(), 40, 2, 1.0e3);
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ref_run = only_run(&reference.path().join("out"));
    let want = Checkpoint::load(&ref_run.join("export"))
        .unwrap()
        .manifest
        .weights
        .sha256;

    // Killed right after the stopping epoch's line is written, before its snapshot: the
    // resumed process must replay that epoch and stop at the same place.
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 40, 2, 1.0e3);
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["train", cfg.to_str().unwrap(), "-q"])
        .current_dir(root())
        .env("KILN_FAULT", "kill@after-epoch-log:3")
        .env_remove("MLFLOW_TRACKING_URI")
        .output()
        .unwrap();
    assert!(!o.status.success(), "the run was killed");
    let run = only_run(&tmp.path().join("out"));
    let o = kiln(&[
        "train",
        cfg.to_str().unwrap(),
        "-q",
        "--resume",
        run.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        epochs(&run).iter().filter(|r| r.0 == 0).count(),
        3,
        "{:?}",
        epochs(&run)
    );
    let got = Checkpoint::load(&run.join("export"))
        .unwrap()
        .manifest
        .weights
        .sha256;
    assert_eq!(got, want, "resumed weights equal the uninterrupted run's");
}
