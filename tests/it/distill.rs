//! Distillation with tiny configs: the student's run trains (or finds) its teacher, learns
//! from the teacher's engine predictions, and records the teacher in its manifest and metrics;
//! the config's distillation keys are checked with located errors.

use crate::common::root;
use std::path::{Path, PathBuf};

use kiln::artifact::Checkpoint;
use kiln::config::{self, ConfigError};
use kiln::run::{RunError, RunOptions, TrainingRun};

/// `configs/tiny.yaml` with its runs under `out`, its data path absolute.
fn tiny_text(out: &Path) -> String {
    std::fs::read_to_string(root().join("configs/tiny.yaml"))
        .unwrap()
        .replace("  dir: checkpoints", &format!("  dir: {}", out.display()))
        .replace(
            "path: datasets/baseball.csv",
            &format!("path: {}", root().join("datasets/baseball.csv").display()),
        )
}

/// A student of `teacher` (a config file): one hidden layer of 2, distillation losses.
fn student_text(out: &Path, distill: &str) -> String {
    tiny_text(out)
        .replace("name: tiny", "name: student")
        .replace("  hidden: [16]", "  hidden: [2]")
        .replace("loss: mse", "loss: distill_mse")
        .replace("loss: gaussian_nll", "loss: distill_nll")
        + distill
}

fn runs_named(out: &Path, name: &str) -> usize {
    std::fs::read_dir(out.join("runs"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(name))
                .count()
        })
        .unwrap_or(0)
}

fn train(path: &Path) -> Result<kiln::run::RunSummary, RunError> {
    let loaded = config::load(path).unwrap();
    let options = RunOptions {
        measure: false,
        ..RunOptions::default()
    };
    TrainingRun::new(loaded, options)?.execute()
}

#[test]
fn a_student_trains_its_teacher_once_and_records_it() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let teacher_cfg = d.path().join("teacher.yaml");
    std::fs::write(&teacher_cfg, tiny_text(&out)).unwrap();
    let student_cfg = d.path().join("student.yaml");
    let distill = format!(
        "distill:\n  config: {}\n  alpha: 0.3\n",
        teacher_cfg.display()
    );
    std::fs::write(&student_cfg, student_text(&out, &distill)).unwrap();

    // No teacher yet: it is trained first.
    let s = train(&student_cfg).unwrap();
    assert_eq!(runs_named(&out, "tiny-"), 1, "the teacher was trained");
    let export = s.outcome.export_dir.clone().unwrap();
    let ckpt = Checkpoint::load(&export).unwrap();
    let m = &ckpt.manifest;
    let teacher = m
        .teacher
        .as_ref()
        .expect("the manifest records the teacher");
    let member = &teacher.members[0];
    let tdir = PathBuf::from(&member.dir);
    let tm = Checkpoint::load(&tdir).unwrap().manifest;
    assert_eq!(member.run_id, tm.run_id);
    assert_eq!(member.parameter_count, tm.parameter_count);
    assert_eq!(teacher.ensemble, 1);
    assert_eq!(tm.parameter_count, 10 * 16 + 16 + 2 * (16 * 3 + 3));
    assert_eq!(m.parameter_count, 10 * 2 + 2 + 2 * (2 * 3 + 3));
    assert!(tm.parameter_count >= 4 * m.parameter_count);
    // The registry row keeps the metrics: the teacher and its test table are there.
    assert_eq!(m.metrics.teacher.as_ref(), Some(teacher));
    let tt = &m.metrics.teacher_test.as_ref().unwrap().targets;
    assert_eq!(tt.len(), 3);
    assert!(tt[0].mse_model.is_finite());
    assert_eq!(
        s.end.final_metrics.as_ref().unwrap().teacher.as_ref(),
        Some(teacher)
    );
    assert!(
        s.end.val_metric.is_some(),
        "distill_mse is the right-sizing metric"
    );
    for t in &s.outcome.report.as_ref().unwrap().targets {
        assert!(t.mse_model.is_finite() && t.nll_model.is_finite(), "{t:?}");
    }

    // A second student finds the same teacher instead of training another.
    let s2 = train(&student_cfg).unwrap();
    assert_eq!(
        runs_named(&out, "tiny-"),
        1,
        "the finished teacher is reused"
    );
    let m2 = Checkpoint::load(&s2.outcome.export_dir.unwrap())
        .unwrap()
        .manifest;
    assert_eq!(m2.teacher.unwrap().members[0].run_id, tm.run_id);

    // The same teacher named by its checkpoint; a teacher of other features is refused.
    let by_dir = d.path().join("by_dir.yaml");
    let text = student_text(
        &out,
        &format!("distill:\n  checkpoints: [{}]\n", tdir.display()),
    );
    std::fs::write(&by_dir, &text).unwrap();
    train(&by_dir).unwrap();
    let other = d.path().join("other.yaml");
    std::fs::write(
        &other,
        text.replace(
            "targets: [hr_rate, bb_rate, so_rate]",
            "targets: [hr_rate, so_rate]",
        ),
    )
    .unwrap();
    let e = train(&other).unwrap_err();
    assert!(e.is_input(), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("distillation: teacher") && msg.contains("same names, same order"),
        "{msg}"
    );

    // An ensemble of two seeds of the teacher config: two more teachers, moment matched.
    let ens = d.path().join("ens.yaml");
    let distill = format!(
        "distill:\n  config: {}\n  seeds: [1, 2]\n",
        teacher_cfg.display()
    );
    std::fs::write(&ens, student_text(&out, &distill)).unwrap();
    let s3 = train(&ens).unwrap();
    assert_eq!(runs_named(&out, "tiny-"), 3, "one teacher per seed");
    let t3 = Checkpoint::load(&s3.outcome.export_dir.unwrap())
        .unwrap()
        .manifest
        .teacher
        .unwrap();
    assert_eq!(t3.ensemble, 2);
    assert_ne!(t3.members[0].run_id, t3.members[1].run_id);
}

#[test]
fn distillation_keys_are_checked_with_the_key_named() {
    let out = Path::new("/nonexistent");
    let check = |text: String| match config::parse(&text, Path::new("s.yaml")) {
        Err(ConfigError::Invalid { key, message, .. }) => format!("{key}: {message}"),
        other => panic!("expected an invalid value, got {other:?}"),
    };
    // A distillation loss without a teacher.
    let e = check(student_text(out, ""));
    assert!(
        e.starts_with("stages[0].loss") && e.contains("distill:"),
        "{e}"
    );
    let e = check(student_text(
        out,
        "distill:\n  config: t.yaml\n  alpha: 1.5\n",
    ));
    assert!(e.starts_with("distill.alpha"), "{e}");
    let e = check(student_text(out, "distill:\n  alpha: 0.5\n"));
    assert!(e.starts_with("distill: name the teacher"), "{e}");
    let e = check(student_text(
        out,
        "distill:\n  config: t.yaml\n  checkpoints: [c]\n",
    ));
    assert!(e.contains("not both"), "{e}");
    // A teacher no stage uses.
    let e = check(tiny_text(out) + "distill:\n  config: t.yaml\n");
    assert!(e.contains("no stage uses the teacher"), "{e}");
    // The shipped config is valid.
    config::load(&root().join("configs/distill.yaml")).unwrap();
}
