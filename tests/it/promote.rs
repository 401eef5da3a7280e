//! `kiln promote`: the gate's rule on injected numbers, and the command end to end on the tiny
//! model — a first version, an improvement promoted, a quality regression and a latency
//! regression refused with their numbers, dry run, bad input, `--keep`, and a polling reader
//! that never sees part of a version.
//!
//! The regressions are made deterministically, not by timing luck: a worse model is the trained
//! one with its mean head's bias shifted (every prediction off by a fixed amount), a slower one
//! is a network 2048 units wide where the served one is 16.

use crate::common::trained;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kiln::artifact::{Checkpoint, export};
use kiln::track::promote::{
    BatchP50, Gates, Measurement, Outcome, Quality, TargetQuality, decide, install_version,
    parse_fraction, served_version, versions,
};
use kiln::track::registry::Registry;
use serde_json::Value;

/// The command runs one at a time: each measures latency, which another test's process on
/// the same cores would disturb.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The trained run's config (data and split to compare on).
fn config_of_trained() -> PathBuf {
    trained().parent().unwrap().join("config.yaml")
}

/// A run directory `<dir>/<name>/` holding `export/` (the trained checkpoint with its mean
/// head's biases shifted by `shift`, or a `wide`-unit network with seeded weights) and the
/// trained run's `config.yaml`. Returns the run directory.
fn variant(dir: &Path, name: &str, shift: f32, wide: Option<usize>) -> PathBuf {
    let ckpt = Checkpoint::load(trained()).unwrap();
    let mut weights = match wide {
        Some(w) => {
            let mut arch = ckpt.manifest.architecture.clone();
            arch.hidden = vec![w, w];
            kiln::infer::seeded_weights(&arch, 11)
        }
        None => ckpt.weights.clone(),
    };
    for b in &mut weights.mean_head.b {
        *b += shift;
    }
    let run = dir.join(name);
    std::fs::create_dir_all(&run).unwrap();
    std::fs::copy(config_of_trained(), run.join("config.yaml")).unwrap();
    let mut manifest = ckpt.manifest.clone();
    manifest.run_id = name.to_string();
    export(&run.join("export"), manifest, &weights).unwrap();
    run
}

/// `kiln promote` from the repository root (the config's data path is relative to it).
fn promote(candidate: &Path, repo: &Path, registry: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .current_dir(crate::common::root())
        .args(["promote", "--checkpoint"])
        .arg(candidate)
        .arg("--repository")
        .arg(repo)
        .args(["--model", "tiny", "--latency-ms", "100", "--registry"])
        .arg(registry)
        .args(extra)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn listing(model_dir: &Path) -> Vec<u64> {
    versions(model_dir)
        .unwrap()
        .into_iter()
        .map(|(v, _)| v)
        .collect()
}

fn same_files(a: &Path, b: &Path) {
    for f in ["manifest.json", "model.safetensors"] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
            "{f} of {} and {}",
            a.display(),
            b.display()
        );
    }
}

fn rows(registry: &Path) -> Vec<kiln::track::registry::PromotionRow> {
    Registry::open(registry)
        .unwrap()
        .promotions(Some("tiny"))
        .unwrap()
}

fn m(mse: &[f64], nll: f64, b1: f64, b128: f64, sha: &str) -> Measurement {
    Measurement {
        quality: Quality {
            rows: 100,
            targets: mse
                .iter()
                .enumerate()
                .map(|(i, &mse)| TargetQuality {
                    target: format!("t{i}"),
                    mse,
                    nll,
                    crps: 0.1,
                    calibration_error: 0.02,
                })
                .collect(),
            nll,
        },
        latency: vec![
            BatchP50 {
                batch: 1,
                p50_us: b1,
                iters: 100,
            },
            BatchP50 {
                batch: 128,
                p50_us: b128,
                iters: 100,
            },
        ],
        weights_sha256: sha.into(),
        rows: None,
    }
}

fn failed(d: &kiln::track::promote::Decision) -> Vec<String> {
    d.checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name.clone())
        .collect()
}

#[test]
fn the_uncertainty_gate_refuses_worse_crps_or_calibration_only_when_asked() {
    let served = m(&[1.0, 2.0], 0.50, 10.0, 100.0, "a");
    let mut cand = m(&[1.0, 2.0], 0.50, 10.0, 100.0, "b");
    cand.quality.targets[1].crps = 0.106; // +6 %
    cand.quality.targets[0].calibration_error = 0.05; // +0.03
    // Without limits the rows are shown and pass.
    let d = decide(&Gates::default(), &cand, Some(&served));
    assert!(d.promoted, "{d:?}");
    let row = d
        .checks
        .iter()
        .find(|c| c.name == "uncertainty crps t1")
        .unwrap();
    assert_eq!(
        (row.candidate, row.incumbent, row.limit),
        (0.106, Some(0.1), None)
    );
    assert!(row.detail.contains("no limit"), "{}", row.detail);
    let g = Gates {
        max_crps_increase: Some(0.05),
        max_calibration_error_increase: Some(0.02),
        ..Gates::default()
    };
    let d = decide(&g, &cand, Some(&served));
    assert!(!d.promoted);
    assert_eq!(
        failed(&d),
        ["uncertainty calibration t0", "uncertainty crps t1"]
    );
    // Within the tolerances: promoted.
    cand.quality.targets[1].crps = 0.104;
    cand.quality.targets[0].calibration_error = 0.039;
    assert!(decide(&g, &cand, Some(&served)).promoted);
}

#[test]
fn the_gate_rule_on_injected_numbers() {
    // The rule at a 10 % MSE margin (the default margin is 2 %: checked at the end).
    let g = Gates {
        max_mse_increase: 0.10,
        ..Gates::default()
    };
    let served = m(&[1.0, 2.0], 0.50, 10.0, 100.0, "a");
    // Better everywhere: promoted.
    let d = decide(&g, &m(&[0.9, 1.9], 0.45, 9.0, 90.0, "b"), Some(&served));
    assert!(d.promoted, "{d:?}");
    // Within the tolerances (MSE +9.9 %, NLL +0.019, latency 1.49×): promoted.
    let d = decide(
        &g,
        &m(&[1.099, 2.0], 0.519, 14.9, 149.0, "b"),
        Some(&served),
    );
    assert!(d.promoted, "{d:?}");
    assert_eq!(d.outcome, Outcome::Promoted);
    // One target 11 % worse: refused on that target only.
    let d = decide(&g, &m(&[1.11, 1.0], 0.40, 9.0, 90.0, "b"), Some(&served));
    assert!(!d.promoted);
    assert_eq!(d.outcome, Outcome::Refused);
    assert_eq!(failed(&d), ["mse t0"]);
    // NLL 0.06 worse.
    let d = decide(&g, &m(&[1.0, 2.0], 0.56, 9.0, 90.0, "b"), Some(&served));
    assert_eq!(failed(&d), ["nll"]);
    // 1.5× slower at batch 128 only, then at batch 1 only: refused (the rule is both).
    let d = decide(&g, &m(&[1.0, 2.0], 0.5, 10.0, 150.0, "b"), Some(&served));
    assert_eq!(failed(&d), ["latency b128"]);
    let d = decide(&g, &m(&[1.0, 2.0], 0.5, 15.0, 100.0, "b"), Some(&served));
    assert_eq!(failed(&d), ["latency b1"]);
    let c = d.checks.iter().find(|c| c.name == "latency b1").unwrap();
    assert_eq!(
        (c.candidate, c.incumbent, c.limit),
        (15.0, Some(10.0), Some(15.0))
    );
    // The served weights again: nothing to do (exit 4), not a refusal.
    let d = decide(&g, &m(&[1.0, 2.0], 0.5, 10.0, 100.0, "a"), Some(&served));
    assert_eq!(failed(&d), ["differs from served"]);
    assert_eq!(d.outcome, Outcome::NothingToDo);
    assert_eq!(d.outcome.exit_code(), 4);
    // Looser gates accept what the defaults refuse.
    let loose = Gates {
        max_mse_increase: 0.10,
        max_nll_increase: 0.1,
        max_latency_ratio: 2.0,
        ..Gates::default()
    };
    assert!(
        decide(
            &loose,
            &m(&[1.06, 2.0], 0.56, 15.0, 150.0, "b"),
            Some(&served)
        )
        .promoted
    );
    // No incumbent: only the checks that need none.
    let d = decide(&g, &m(&[100.0], 9.0, 1e4, 1e5, "b"), None);
    assert!(d.promoted, "{d:?}");
    assert_eq!(d.checks.len(), 2);
    let d = decide(&g, &m(&[f64::NAN], 9.0, 1.0, 1.0, "b"), None);
    assert_eq!(failed(&d), ["finite test metrics"]);
    // The default margin: 2 % of a target's MSE (point estimates here: no per-row losses).
    let d = decide(
        &Gates::default(),
        &m(&[1.03, 2.0], 0.5, 10.0, 100.0, "b"),
        Some(&served),
    );
    assert_eq!(failed(&d), ["mse t0"]);
    let d = decide(
        &Gates::default(),
        &m(&[1.019, 2.0], 0.5, 10.0, 100.0, "b"),
        Some(&served),
    );
    assert!(d.promoted, "{d:?}");
    // Fractions as the flags take them.
    assert_eq!(parse_fraction("5%"), Ok(0.05));
    assert_eq!(parse_fraction("0.05"), Ok(0.05));
    assert!(parse_fraction("-1%").is_err());
    assert!(parse_fraction("five").unwrap_err().contains("five"));
}

#[test]
fn a_first_version_is_promoted_and_recorded() {
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (repo, db) = (tmp.path().join("repo"), tmp.path().join("runs.db"));
    let run_dir = trained().parent().unwrap();
    let o = promote(run_dir, &repo, &db, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("first version"), "{}", text(&o));
    assert_eq!(listing(&repo.join("tiny")), [1]);
    same_files(&repo.join("tiny/1"), trained());
    let r = rows(&db);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].decision.as_str(), r[0].version, r[0].incumbent_version),
        ("promoted", Some(1), None)
    );
    assert!(
        r[0].details
            .candidate
            .as_ref()
            .unwrap()
            .quality
            .nll
            .is_finite()
    );
}

#[test]
fn an_improvement_is_promoted_and_a_quality_regression_refused() {
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (repo, db) = (tmp.path().join("repo"), tmp.path().join("runs.db"));
    let worse = variant(tmp.path(), "worse", 1.0, None);
    crate::common::copy_dir(&worse.join("export"), &repo.join("tiny/1"));
    // The trained model is better than the shifted one: promoted as version 2.
    let o = promote(trained(), &repo, &db, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(listing(&repo.join("tiny")), [1, 2]);
    same_files(&repo.join("tiny/2"), trained());
    // Now a shifted model against the trained one: refused, nothing changes, numbers shown.
    let much_worse = variant(tmp.path(), "much-worse", 2.0, None);
    let before = std::fs::read(repo.join("tiny/2/manifest.json")).unwrap();
    let o = promote(&much_worse, &repo, &db, &["--json"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("refused"));
    assert_eq!(listing(&repo.join("tiny")), [1, 2]);
    assert_eq!(
        std::fs::read(repo.join("tiny/2/manifest.json")).unwrap(),
        before
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["incumbent_version"], 2);
    let fails: Vec<&Value> = v["decision"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["passed"] == false)
        .collect();
    assert!(
        fails
            .iter()
            .any(|c| c["name"].as_str().unwrap().starts_with("mse ")),
        "{fails:?}"
    );
    for c in &fails {
        assert!(c["candidate"].as_f64().unwrap() > c["limit"].as_f64().unwrap());
    }
    let r = rows(&db);
    assert_eq!(r.len(), 2);
    assert_eq!(r[1].decision, "refused");
    assert_eq!((r[1].version, r[1].incumbent_version), (None, Some(2)));
    assert_eq!(
        serde_json::to_value(&r[1].details.checks).unwrap(),
        v["decision"]["checks"]
    );
}

#[test]
fn a_latency_regression_is_refused_with_its_numbers() {
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (repo, db) = (tmp.path().join("repo"), tmp.path().join("runs.db"));
    crate::common::copy_dir(trained(), &repo.join("tiny/1"));
    let slow = variant(tmp.path(), "wide", 0.0, Some(2048));
    // Quality gates wide open: only latency can refuse it.
    let o = promote(
        &slow,
        &repo,
        &db,
        &[
            "--json",
            "--max-mse-increase",
            "1e12",
            "--max-nll-increase",
            "1e12",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let fails: Vec<String> = v["decision"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["passed"] == false)
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(fails, ["latency b1", "latency b128"], "{}", text(&o));
    assert_eq!(listing(&repo.join("tiny")), [1]);
    assert_eq!(rows(&db)[0].decision, "refused");
}

#[test]
fn a_dry_run_compares_but_writes_and_records_nothing() {
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (repo, db) = (tmp.path().join("repo"), tmp.path().join("runs.db"));
    let worse = variant(tmp.path(), "worse", 1.0, None);
    crate::common::copy_dir(&worse.join("export"), &repo.join("tiny/1"));
    let o = promote(trained(), &repo, &db, &["--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("would promote"), "{out}");
    assert!(
        out.contains("latency b128") && out.contains("mse hr_rate"),
        "{out}"
    );
    assert_eq!(listing(&repo.join("tiny")), [1]);
    assert!(!db.exists() || rows(&db).is_empty());
}

#[test]
fn bad_input_exits_2_with_a_reason() {
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (repo, db) = (tmp.path().join("repo"), tmp.path().join("runs.db"));
    let check = |o: Output, needle: &str| {
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{needle:?} not in {err}");
    };
    check(promote(&tmp.path().join("nope"), &repo, &db, &[]), "nope");
    check(promote(trained(), &repo, &db, &["--keep", "0"]), "--keep 0");
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .current_dir(crate::common::root())
        .arg("promote")
        .arg(trained()) // the older, positional spelling still works
        .arg("--repository")
        .arg(&repo)
        .args(["--model", "../escape"])
        .output()
        .unwrap();
    check(o, "--model");
    // An export directory outside a run directory needs --config.
    let bare = tmp.path().join("bare");
    crate::common::copy_dir(trained(), &bare);
    check(promote(&bare, &repo, &db, &[]), "--config");
    check(
        promote(trained(), &repo, &db, &["--max-mse-increase", "lots"]),
        "lots",
    );
    assert!(!repo.exists(), "bad input wrote to the repository");
}

#[test]
fn keep_prunes_old_versions_but_never_the_served_or_the_new_one() {
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (repo, db) = (tmp.path().join("repo"), tmp.path().join("runs.db"));
    let worse = variant(tmp.path(), "worse", 1.0, None);
    for v in 1..=3 {
        crate::common::copy_dir(&worse.join("export"), &repo.join(format!("tiny/{v}")));
    }
    // Version 4 does not load, so a server serves 3.
    std::fs::create_dir_all(repo.join("tiny/4")).unwrap();
    std::fs::write(repo.join("tiny/4/manifest.json"), "{").unwrap();
    assert_eq!(served_version(&repo.join("tiny")).unwrap().unwrap().0, 3);
    let o = promote(trained(), &repo, &db, &["--keep", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(listing(&repo.join("tiny")), [3, 5], "{}", text(&o));
    let r = rows(&db);
    assert_eq!(r[0].details.pruned, [1, 2, 4]);
    // Nothing half-removed is left behind.
    let hidden: Vec<_> = std::fs::read_dir(repo.join("tiny"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?}");
}

#[test]
fn a_polling_reader_never_sees_a_partial_version() {
    // A version 24 MiB large, installed 20 times while a reader scans the model directory as
    // the server does: every numeric directory it sees is complete.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    crate::common::copy_dir(trained(), &src);
    let pad: Vec<u8> = (0..24 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(src.join("padding.bin"), &pad).unwrap();
    let want: Vec<(String, u64)> = {
        let mut v: Vec<(String, u64)> = std::fs::read_dir(&src)
            .unwrap()
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().len(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let model_dir = tmp.path().join("repo/tiny");
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (done, model_dir, want) = (done.clone(), model_dir.clone(), want.clone());
        std::thread::spawn(move || {
            let mut seen = 0usize;
            while !done.load(Ordering::Acquire) {
                for (v, dir) in versions(&model_dir).unwrap_or_default() {
                    let mut got: Vec<(String, u64)> = match std::fs::read_dir(&dir) {
                        Ok(rd) => rd
                            .flatten()
                            .filter_map(|e| {
                                Some((
                                    e.file_name().to_string_lossy().into_owned(),
                                    e.metadata().ok()?.len(),
                                ))
                            })
                            .collect(),
                        Err(_) => continue,
                    };
                    got.sort();
                    assert_eq!(got, want, "version {v} seen incomplete");
                    seen += 1;
                }
            }
            seen
        })
    };
    for i in 1..=20u64 {
        assert_eq!(install_version(&model_dir, &src, i).unwrap(), i);
    }
    // A number taken meanwhile is skipped, not overwritten.
    assert_eq!(install_version(&model_dir, &src, 5).unwrap(), 21);
    done.store(true, Ordering::Release);
    let seen = reader.join().unwrap();
    assert!(seen > 0, "the reader never looked");
    assert_eq!(listing(&model_dir), (1..=21).collect::<Vec<_>>());
    let leftovers: Vec<_> = std::fs::read_dir(&model_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(Checkpoint::load(&model_dir.join("21")).is_ok());
}

/// A promoter SIGKILLed after recording the promotion and copying the files, before the
/// rename, leaves its temporary and an `installing` row; the next promotion removes the
/// temporary, settles the row as `abandoned` and installs the version with its own row. A
/// version is never in place without a row.
#[test]
fn a_killed_promotion_is_cleaned_up_and_settled_by_the_next() {
    use std::os::unix::process::ExitStatusExt;
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (repo, db) = (tmp.path().join("repo"), tmp.path().join("runs.db"));
    let run_dir = trained().parent().unwrap();
    let killed = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .current_dir(crate::common::root())
        .args(["promote", "--checkpoint"])
        .arg(run_dir)
        .arg("--repository")
        .arg(&repo)
        .args(["--model", "tiny", "--latency-ms", "100", "--registry"])
        .arg(&db)
        .env("KILN_FAULT", "kill@during-promote-install")
        .output()
        .unwrap();
    assert_eq!(killed.status.signal(), Some(9), "{}", text(&killed));
    let model_dir = repo.join("tiny");
    let temps: Vec<String> = std::fs::read_dir(&model_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        temps.len() == 1 && temps[0].starts_with(".promote.tmp-"),
        "{temps:?}"
    );
    assert_eq!(listing(&model_dir), Vec::<u64>::new());
    let r = rows(&db);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].decision.as_str(), r[0].version),
        ("installing", Some(1))
    );

    let o = promote(run_dir, &repo, &db, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(listing(&model_dir), [1]);
    same_files(&model_dir.join("1"), trained());
    assert!(
        !model_dir.join(&temps[0]).exists(),
        "the dead promoter's temporary is gone"
    );
    let r = rows(&db);
    assert_eq!(r.len(), 2);
    assert_eq!((r[0].decision.as_str(), r[0].version), ("abandoned", None));
    assert!(r[0].details.reconciled.is_some(), "{:?}", r[0].details);
    assert_eq!(
        (r[1].decision.as_str(), r[1].version),
        ("promoted", Some(1))
    );
}

/// A promoter killed after the rename but before settling its row: the next promotion finds
/// the version holding the candidate and settles the row as `promoted`; a live promoter's
/// row and temporary are left alone.
#[test]
fn an_installing_row_whose_version_is_in_place_is_settled_as_promoted() {
    use kiln::track::promote::{INSTALLING, reconcile_installing, remove_dead_temporaries};
    use kiln::track::registry::PromotionRow;
    let tmp = tempfile::tempdir().unwrap();
    let (repo, db) = (tmp.path().join("repo"), tmp.path().join("runs.db"));
    let model_dir = repo.join("tiny");
    install_version(&model_dir, trained(), 1).unwrap();
    let sha = Checkpoint::load(trained()).unwrap().manifest.weights.sha256;
    let reg = Registry::open(&db).unwrap();
    let row = |pid: u32| PromotionRow {
        id: 0,
        at: "2026-01-01T00:00:00Z".into(),
        repository: repo.display().to_string(),
        model: "tiny".into(),
        candidate: trained().display().to_string(),
        run_id: None,
        incumbent_version: None,
        version: Some(1),
        decision: INSTALLING,
        details: serde_json::from_value(
            serde_json::json!({"pid": pid, "candidate": {"weights_sha256": sha}}),
        )
        .unwrap(),
    };
    // A child that has exited: its pid is not alive.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    reg.record_promotion(&row(dead)).unwrap();
    reg.record_promotion(&row(std::process::id())).unwrap();
    std::fs::create_dir(model_dir.join(format!(".promote.tmp-{dead}-2"))).unwrap();
    std::fs::create_dir(model_dir.join(format!(".pruned-3-{dead}"))).unwrap();
    let live = model_dir.join(format!(".promote.tmp-{}-2", std::process::id()));
    std::fs::create_dir(&live).unwrap();

    assert_eq!(reconcile_installing(&reg, &repo, "tiny").unwrap(), 1);
    let r = reg.promotions(Some("tiny")).unwrap();
    assert_eq!(
        (r[0].decision.as_str(), r[0].version),
        ("promoted", Some(1))
    );
    assert_eq!(
        r[1].decision, INSTALLING,
        "a live promoter's row is its own"
    );
    let mut removed = remove_dead_temporaries(&model_dir);
    removed.sort();
    assert_eq!(
        removed,
        [
            format!(".promote.tmp-{dead}-2"),
            format!(".pruned-3-{dead}")
        ]
    );
    assert!(live.exists());
    assert_eq!(listing(&model_dir), [1]);
}

/// Models are compared on raw columns: a category only the candidate knows is fine (the
/// served version's unknown bucket), a column the served version reads that the data lacks,
/// or one that changed between numeric and categorical, is one short line naming it.
#[test]
fn models_are_compared_on_raw_columns() {
    use kiln::data::preprocess::{InputColumn, Preprocessing};
    use kiln::data::table::CsvTable;
    use kiln::track::promote::{PromoteError, compatible_on_raw_columns, raw_inputs};
    let base = Checkpoint::load(trained()).unwrap().manifest;
    let with = |inputs: Vec<InputColumn>| {
        let mut m = base.clone();
        m.preprocessing = Some(Preprocessing {
            inputs,
            ..Preprocessing::default()
        });
        m
    };
    let cat = |name: &str, cats: &[&str]| InputColumn {
        categories: Some(cats.iter().map(|c| c.to_string()).collect()),
        missing_to_unknown: true,
        ..InputColumn::numeric(name)
    };
    let table =
        CsvTable::from_bytes(b"age,dest,y\n30,LEX,1\n31,BOS,2\n", Path::new("night.csv")).unwrap();
    let served = with(vec![InputColumn::numeric("age"), cat("dest", &["BOS"])]);
    let cand = with(vec![
        InputColumn::numeric("age"),
        cat("dest", &["BOS", "LEX"]),
    ]);
    // One more category: comparable; LEX is the served version's unknown bucket.
    compatible_on_raw_columns(3, &served, &cand, &table).unwrap();
    let x = raw_inputs(
        &served.input_preprocessing(),
        &table,
        &[0, 1],
        "served version 3",
    )
    .unwrap();
    assert_eq!(x, [30.0, 0.0, 31.0, 1.0]);
    let x = raw_inputs(
        &cand.input_preprocessing(),
        &table,
        &[0, 1],
        "the candidate",
    )
    .unwrap();
    assert_eq!(x, [30.0, 0.0, 1.0, 31.0, 1.0, 0.0]);
    // A column gone: one line naming it.
    let gone = with(vec![InputColumn::numeric("age"), cat("origin", &["BOS"])]);
    let e = compatible_on_raw_columns(3, &gone, &cand, &table).unwrap_err();
    assert!(matches!(e, PromoteError::Incompatible(_)) && e.is_input());
    let m = e.to_string();
    assert!(
        m.contains("column `origin` is gone") && m.contains("served version 3"),
        "{m}"
    );
    assert!(!m.contains('\n') && m.len() < 160, "{m}");
    // A type change: one line naming the column and both kinds.
    let retyped = with(vec![
        InputColumn::numeric("age"),
        InputColumn::numeric("dest"),
    ]);
    let m = compatible_on_raw_columns(3, &served, &retyped, &table)
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("column `dest` changed type")
            && m.contains("categorical")
            && m.contains("numeric"),
        "{m}"
    );
    assert!(!m.contains('\n') && m.len() < 160, "{m}");
}
