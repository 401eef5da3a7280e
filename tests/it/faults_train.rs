//! The training side of the fault campaign, kept in the repository and re-runnable: the built
//! `kiln` binary on `configs/tiny.yaml`, interrupted at chosen points with the deterministic
//! kill hook (`KILN_FAULT=kill@<point>[:<n>]`, see `kiln::util::fault`), then `--resume`d;
//! a full disk (a small tmpfs, when running as root); a read-only export directory and
//! registry (a read-only bind mount as root, permissions otherwise); and the input and
//! checkpoint defects found with them (a non-UTF-8 config, a duplicated CSV column, an edited
//! manifest).
//!
//! After every kill and resume: the run finishes, `epochs.jsonl` has exactly one row per
//! epoch with the uninterrupted run's losses, the weights are bit-identical to the
//! uninterrupted run's, no temporary file or directory is left, and no half-written
//! checkpoint is ever loadable.
//!
//! The reduced campaign runs in `cargo test` (a few tiny trainings): every kill point of
//! `kiln::util::fault::POINTS` once (a test checks the cases cover the list exactly). The
//! full campaign — every kill point at several hits, kills during resume, several disk sizes
//! — is one command:
//!
//! ```text
//! KILN_FAULTS_FULL=1 cargo test --release --test it faults_train:: -- --nocapture
//! ```
//!
//! It prints `faults_train: N cases tried, F failures` per part.

use crate::common::root;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::common::{kiln, kiln_env, stderr};
use kiln::artifact::Checkpoint;
use kiln::track::registry::Registry;

/// The signal the hook kills with.
const SIGKILL: i32 = 9;

fn full() -> bool {
    std::env::var_os("KILN_FAULTS_FULL").is_some_and(|v| v != "0" && !v.is_empty())
}

/// `configs/tiny.yaml` with its export directory at `export_dir`, written to `dir/tiny.yaml`.
fn tiny_config(dir: &Path, export_dir: &Path) -> PathBuf {
    crate::common::tiny_config(dir, export_dir, &[])
}

/// The single run directory under `<export>/runs/`.
fn only_run(export: &Path) -> Result<PathBuf, String> {
    let runs: Vec<PathBuf> = std::fs::read_dir(export.join("runs"))
        .map_err(|e| format!("{}: {e}", export.join("runs").display()))?
        .flatten()
        .map(|e| e.path())
        .collect();
    match runs.as_slice() {
        [one] => Ok(one.clone()),
        other => Err(format!("expected one run directory, found {other:?}")),
    }
}

/// (stage, epoch, train loss, validation loss) of every line of `epochs.jsonl`.
type EpochRow = (u64, u64, f64, f64);

fn epoch_rows(run: &Path) -> Result<Vec<EpochRow>, String> {
    let p = run.join("epochs.jsonl");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    text.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).map_err(|e| format!("{}: {e}: {l}", p.display()))?;
            Ok((
                v["stage"].as_u64().unwrap_or(u64::MAX),
                v["epoch"].as_u64().unwrap_or(u64::MAX),
                v["train_loss"].as_f64().unwrap_or(f64::NAN),
                v["val_loss"].as_f64().unwrap_or(f64::NAN),
            ))
        })
        .collect()
}

fn status_of(run: &Path) -> Option<String> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).ok()?).ok()?;
    v["status"].as_str().map(String::from)
}

/// Every path below `dir` whose name marks a temporary (`.<name>.tmp…`).
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.contains(".tmp") {
            out.push(p.clone());
        }
        if p.is_dir() {
            out.extend(temporaries(&p));
        }
    }
    out
}

/// The uninterrupted run every interrupted one must reproduce.
struct Reference {
    _dir: tempfile::TempDir,
    run: PathBuf,
    weights_sha: String,
    epochs: Vec<EpochRow>,
    steps_lines: usize,
}

fn reference() -> &'static Reference {
    static REF: OnceLock<Reference> = OnceLock::new();
    REF.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let cfg = tiny_config(dir.path(), &dir.path().join("out"));
        let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
        assert!(o.status.success(), "reference run: {}", stderr(&o));
        let run = only_run(&dir.path().join("out")).unwrap();
        let ckpt = Checkpoint::load(&run.join("export")).unwrap();
        let epochs = epoch_rows(&run).unwrap();
        assert_eq!(epochs.len(), 5, "tiny.yaml trains 3 + 2 epochs");
        let steps_lines = std::fs::read_to_string(run.join("steps.csv"))
            .unwrap()
            .lines()
            .count();
        Reference {
            weights_sha: ckpt.manifest.weights.sha256.clone(),
            run,
            epochs,
            steps_lines,
            _dir: dir,
        }
    })
}

/// What must hold after a run was interrupted (before it is resumed): any export present is
/// complete — it loads, its seal verifies and its manifest already holds every measurement
/// (latency, int8 accuracy change, pick evaluation: they are taken before the one export,
/// never added after it); no temporary export is loadable. `exported`: whether an export
/// must exist (`Some(true)`), must not (`Some(false)`: killed before the run exported), or
/// either.
fn check_interrupted(run: &Path, exported: Option<bool>) -> Result<(), String> {
    let export = run.join("export");
    if export.exists() {
        let c = Checkpoint::load(&export).map_err(|e| format!("a half-written checkpoint: {e}"))?;
        let m = &c.manifest;
        if m.latency.is_none()
            || m.metrics.int8_test_delta.is_none()
            || m.metrics.pick_evaluation.is_none()
        {
            return Err(format!(
                "a half-measured checkpoint (latency {}, int8 {}, picks {})",
                m.latency.is_some(),
                m.metrics.int8_test_delta.is_some(),
                m.metrics.pick_evaluation.is_some()
            ));
        }
    }
    if exported.is_some_and(|e| e != export.exists()) {
        return Err(format!(
            "an export {} (expected {exported:?})",
            if export.exists() {
                "exists"
            } else {
                "is missing"
            }
        ));
    }
    for e in std::fs::read_dir(run).map_err(|e| e.to_string())?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(".export.tmp") && Checkpoint::load(&e.path()).is_ok() {
            return Err(format!(
                "a temporary export is loadable: {}",
                e.path().display()
            ));
        }
    }
    Ok(())
}

/// What must hold after the run finished, interrupted or not.
fn check_finished(run: &Path, registry: &Path) -> Result<(), String> {
    let r = reference();
    if status_of(run).as_deref() != Some("finished") {
        return Err(format!("run.json says {:?}", status_of(run)));
    }
    let rows = epoch_rows(run)?;
    if rows != r.epochs {
        return Err(format!(
            "epochs.jsonl differs from the uninterrupted run's:\n  got  {rows:?}\n  want {:?}",
            r.epochs
        ));
    }
    let steps = std::fs::read_to_string(run.join("steps.csv"))
        .map_err(|e| e.to_string())?
        .lines()
        .count();
    if steps != r.steps_lines {
        return Err(format!(
            "steps.csv has {steps} lines, the uninterrupted run {}",
            r.steps_lines
        ));
    }
    let ckpt = Checkpoint::load(&run.join("export")).map_err(|e| e.to_string())?;
    if ckpt.manifest.weights.sha256 != r.weights_sha {
        return Err(format!(
            "weights differ from the uninterrupted run's ({} vs {})",
            ckpt.manifest.weights.sha256, r.weights_sha
        ));
    }
    if ckpt.manifest.latency.is_none() {
        return Err("the manifest has no latency".into());
    }
    let m = &ckpt.manifest.metrics;
    if m.int8_test_delta.is_none() || m.pick_evaluation.is_none() {
        return Err("the manifest has no int8 accuracy change or pick evaluation".into());
    }
    let left = temporaries(run);
    if !left.is_empty() {
        return Err(format!("temporaries left: {left:?}"));
    }
    let reg = Registry::open_read_only(registry).map_err(|e| e.to_string())?;
    let id = run.file_name().unwrap().to_string_lossy().into_owned();
    let row = reg.get(&id).map_err(|e| e.to_string())?;
    if row.status != "finished" {
        return Err(format!("registry row says {}", row.status));
    }
    let n = reg.epochs(&id).map_err(|e| e.to_string())?.len();
    if n != 5 {
        return Err(format!("registry has {n} epoch rows"));
    }
    Ok(())
}

/// One kill-and-resume case: `kills[0]` arms the first `kiln train`, each later entry arms a
/// `--resume` that must be killed too, and a final plain `--resume` must finish the run.
fn kill_case(kills: &[&str]) -> Result<(), String> {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("out");
    let cfg = tiny_config(tmp.path(), &export);
    let cfg_s = cfg.to_str().unwrap().to_string();
    let registry = export.join("runs.db");
    let mut run: Option<PathBuf> = None;
    for (i, spec) in kills.iter().enumerate() {
        let fault = format!("kill@{spec}");
        let mut args = vec!["train", cfg_s.as_str(), "-q"];
        let run_s = run.as_ref().map(|r| r.to_string_lossy().into_owned());
        if let Some(r) = &run_s {
            args.extend(["--resume", r.as_str()]);
        }
        let o = kiln_env(&args, &[("KILN_FAULT", &fault)]);
        if o.status.signal() != Some(SIGKILL) {
            return Err(format!(
                "attempt {i} ({fault}) was not killed: {:?}; {}",
                o.status,
                stderr(&o)
            ));
        }
        let r = only_run(&export)?;
        // Killed after the export, or before it (unless an earlier process exported).
        let exported = if point_of(spec) == "before-finished" {
            Some(true)
        } else if kills[..i].iter().any(|k| point_of(k) == "before-finished") {
            None
        } else {
            Some(false)
        };
        check_interrupted(&r, exported)?;
        if status_of(&r).as_deref() == Some("finished") {
            return Err("a killed run says finished".into());
        }
        run = Some(r);
    }
    let r = run.expect("at least one kill");
    let o = kiln(&["train", &cfg_s, "-q", "--resume", r.to_str().unwrap()]);
    if !o.status.success() {
        return Err(format!("resume failed: {}", stderr(&o)));
    }
    check_finished(&r, &registry)
}

/// Run cases, print one line per failure and the counts; fail if any failed.
fn campaign(part: &str, cases: &[Vec<String>]) {
    let mut failures = Vec::new();
    for kills in cases {
        let kills: Vec<&str> = kills.iter().map(String::as_str).collect();
        if let Err(e) = kill_case(&kills) {
            eprintln!("FAILED {kills:?}: {e}");
            failures.push((kills.join(" → "), e));
        }
    }
    eprintln!(
        "faults_train {part}: {} cases tried, {} failures",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

fn case(kills: &[&str]) -> Vec<String> {
    kills.iter().map(|s| s.to_string()).collect()
}

/// The kill-and-resume cases of the default suite: every point of `fault::POINTS` at least
/// once (checked by `the_default_kill_cases_cover_every_fault_point`), each a cheap run of
/// `configs/tiny.yaml`.
fn default_cases() -> Vec<Vec<String>> {
    vec![
        // Before the first snapshot: the resume starts over in the same directory.
        case(&["during-step:3"]),
        // Defect 1: the epoch's line is written, its snapshot is not LATEST yet.
        case(&["after-epoch-log:2"]),
        case(&["before-snapshot-latest:4"]),
        // LATEST switched, the older snapshots not yet removed.
        case(&["after-snapshot-latest:2"]),
        // The measurements before the export: no checkpoint exists yet.
        case(&["during-latency"]),
        // Defect 9: a temporary export directory is left by the killed process.
        case(&["during-export"]),
        // Everything done but run.json: the resume only has to say `finished`.
        case(&["before-finished"]),
        // Killed again while resuming.
        case(&["after-epoch-log:3", "during-resume"]),
    ]
}

/// Kill points of other commands and the test that kills a process there.
const OTHER_KILL_CASES: &[(&str, &str)] = &[
    (
        "during-promote-install",
        "promote::a_killed_promotion_is_cleaned_up_and_settled_by_the_next",
    ),
    (
        "during-adopt",
        "bins::auto_bins_killed_midway_resume_to_the_same_weights",
    ),
];

/// The point a case's `<point>[:<n>]` names.
fn point_of(spec: &str) -> &str {
    spec.split_once(':').map_or(spec, |(p, _)| p)
}

#[test]
fn the_default_kill_cases_cover_every_fault_point() {
    let mut covered: Vec<String> = default_cases()
        .iter()
        .flatten()
        .map(|s| point_of(s).to_string())
        .collect();
    // Points outside training, each killed by its own module's test.
    for (point, test) in OTHER_KILL_CASES {
        assert!(!test.is_empty());
        covered.push(point.to_string());
    }
    covered.sort();
    covered.dedup();
    let mut points: Vec<String> = kiln::util::fault::POINTS
        .iter()
        .map(|p| p.to_string())
        .collect();
    points.sort();
    assert_eq!(
        covered, points,
        "the default kill cases must cover kiln::util::fault::POINTS exactly: add a case for \
         each new point to default_cases()"
    );
}

#[test]
fn kill_at_each_point_then_resume_reaches_the_uninterrupted_run() {
    reference();
    let mut cases = default_cases();
    if full() {
        cases.clear();
        for n in 1..=5 {
            for p in [
                "after-epoch-log",
                "before-snapshot-latest",
                "after-snapshot-latest",
            ] {
                cases.push(vec![format!("{p}:{n}")]);
            }
            cases.push(vec![format!("after-epoch-log:{n}"), "during-resume".into()]);
        }
        let steps = reference().steps_lines - 1;
        for n in [
            1,
            2,
            steps / 7,
            steps / 3,
            steps / 2,
            2 * steps / 3,
            steps - 1,
            steps,
        ] {
            cases.push(vec![format!("during-step:{n}")]);
        }
        // The same step twice (the resumed process counts its own steps from 1).
        cases.push(vec![format!("during-step:{}", steps / 4); 2]);
        for p in [
            "during-export",
            "during-latency:1",
            "during-latency:2",
            "before-finished",
        ] {
            cases.push(vec![p.to_string()]);
        }
        cases.push(case(&["during-export", "during-export", "during-latency"]));
        cases.push(case(&["during-step:5", "during-resume", "before-finished"]));
    }
    campaign("kill-and-resume", &cases);
}

#[test]
fn an_unarmed_or_misspelt_hook_changes_nothing() {
    // An unknown point is reported and ignored; the run finishes like the reference.
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("out");
    let cfg = tiny_config(tmp.path(), &export);
    let o = kiln_env(
        &["train", cfg.to_str().unwrap(), "-q"],
        &[("KILN_FAULT", "kill@nowhere")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("ignoring \"kill@nowhere\""),
        "{}",
        stderr(&o)
    );
    let run = only_run(&export).unwrap();
    check_finished(&run, &export.join("runs.db")).unwrap();
}

// ---------------------------------------------------------------------------------------
// Full disk and read-only file systems.

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn sh(cmd: &str, args: &[&str]) -> Result<(), String> {
    let o = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd} {args:?}: {}", stderr(&o).trim()))
    }
}

/// A mount that is undone on drop.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(at: &Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(at).unwrap();
        sh(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                at.to_str().unwrap(),
            ],
        )?;
        Ok(Self(at.to_path_buf()))
    }

    fn resize(&self, size: &str) -> Result<(), String> {
        sh(
            "mount",
            &[
                "-o",
                &format!("remount,size={size}"),
                self.0.to_str().unwrap(),
            ],
        )
    }

    /// `dir` bind-mounted read-only onto itself.
    fn read_only(dir: &Path) -> Result<Self, String> {
        let d = dir.to_str().unwrap();
        sh("mount", &["--bind", d, d])?;
        let m = Self(dir.to_path_buf());
        sh("mount", &["-o", "remount,bind,ro", d])?;
        Ok(m)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = sh("umount", &["-l", self.0.to_str().unwrap()]);
    }
}

/// Make `dir` read-only: a read-only bind mount as root (permissions do not bind root),
/// file modes otherwise; undone on drop. Panics, naming what failed, when neither works: the
/// read-only cases are never silently left out.
struct ReadOnly {
    _mount: Option<Mount>,
    modes: Option<PathBuf>,
}

impl ReadOnly {
    fn make(dir: &Path) -> Self {
        if is_root() {
            match Mount::read_only(dir) {
                Ok(m) => Self {
                    _mount: Some(m),
                    modes: None,
                },
                Err(e) => panic!(
                    "read-only cases: as root they need a read-only bind mount (CAP_SYS_ADMIN), \
                     which failed: {e}; run as an unprivileged user instead (file modes)"
                ),
            }
        } else {
            match sh("chmod", &["-R", "a-w", dir.to_str().unwrap()]) {
                Ok(()) => Self {
                    _mount: None,
                    modes: Some(dir.to_path_buf()),
                },
                Err(e) => panic!("read-only cases: cannot make {dir:?} read-only: {e}"),
            }
        }
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        if let Some(d) = &self.modes {
            let _ = sh("chmod", &["-R", "u+w", d.to_str().unwrap()]);
        }
    }
}

#[test]
#[ignore = "needs root, to mount a small tmpfs (.ci/run runs it as root)"]
fn a_full_disk_names_the_path_removes_temporaries_and_resumes() {
    assert!(
        is_root(),
        "the full-disk cases need root to mount a small tmpfs; run them as root"
    );
    reference();
    let sizes: &[&str] = if full() {
        &["16k", "48k", "96k", "160k", "240k", "400k"]
    } else {
        &["48k"]
    };
    let (mut tried, mut failures, mut full_disk_errors) = (0, Vec::new(), 0);
    for size in sizes {
        tried += 1;
        let tmp = tempfile::tempdir().unwrap();
        let mnt = tmp.path().join("mnt");
        let m = Mount::tmpfs(&mnt, size)
            .unwrap_or_else(|e| panic!("full-disk cases: cannot mount a tmpfs: {e}"));
        let export = mnt.join("out");
        let cfg = tiny_config(tmp.path(), &export);
        let registry = tmp.path().join("runs.db");
        let reg_s = registry.to_str().unwrap();
        let o = kiln(&["train", cfg.to_str().unwrap(), "-q", "--registry", reg_s]);
        let result = (|| -> Result<(), String> {
            if o.status.success() {
                return Ok(()); // this size was enough; nothing to check
            }
            full_disk_errors += 1;
            let err = stderr(&o);
            if !(err.contains("No space left on device") && err.contains(mnt.to_str().unwrap())) {
                return Err(format!("the error does not name the full path: {err}"));
            }
            let left = temporaries(&mnt);
            if !left.is_empty() {
                return Err(format!("temporaries left on the full disk: {left:?}"));
            }
            let Ok(run) = only_run(&export) else {
                return Ok(()); // not even the run directory fit
            };
            check_interrupted(&run, None)?;
            if status_of(&run).as_deref() != Some("failed") {
                return Err(format!(
                    "run.json says {:?} after the failure",
                    status_of(&run)
                ));
            }
            // With space again, the run resumes to the uninterrupted result.
            m.resize("64m")?;
            if run.join("state/LATEST").exists() {
                let o = kiln(&[
                    "train",
                    cfg.to_str().unwrap(),
                    "-q",
                    "--registry",
                    reg_s,
                    "--resume",
                    run.to_str().unwrap(),
                ]);
                if !o.status.success() {
                    return Err(format!("resume after freeing space: {}", stderr(&o)));
                }
                check_finished(&run, &registry)?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            eprintln!("FAILED full disk {size}: {e}");
            failures.push((size.to_string(), e));
        }
        drop(m);
    }
    eprintln!(
        "faults_train full-disk: {tried} cases tried ({full_disk_errors} ran out of space), {} failures",
        failures.len()
    );
    assert!(full_disk_errors > 0, "no size was small enough to fill up");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Write a registry with one finished run at `path` (closed cleanly, as a healthy registry
/// on a mount would be).
fn healthy_registry(path: &Path) -> String {
    let reg = Registry::open(path).unwrap();
    let id = "tiny-20261201T000000Z-abcd";
    reg.start_run(&kiln::track::registry::NewRun {
        id,
        name: "tiny",
        run_dir: Path::new("/nowhere"),
        config_text: "name: tiny\n",
        config_sha256: "00",
        started_at: "2026-12-01T00:00:00Z",
        environment: Default::default(),
    })
    .unwrap();
    reg.finish_run(
        id,
        &kiln::track::registry::RunEnd {
            status: kiln::records::RunState::Finished,
            param_count: Some(3654),
            ..Default::default()
        },
    )
    .unwrap();
    drop(reg);
    id.to_string()
}

#[test]
fn read_only_export_dir_and_registry_are_named_and_leave_nothing_running() {
    let tmp = tempfile::tempdir().unwrap();
    let ro = tmp.path().join("ro");
    std::fs::create_dir_all(ro.join("out/runs")).unwrap();
    let id = healthy_registry(&ro.join("runs.db"));
    let _guard = ReadOnly::make(&ro);
    let mut tried = 0;

    // Defect 3: the export directory is read-only; the error names it.
    tried += 1;
    let cfg = tiny_config(tmp.path(), &ro.join("out"));
    let ok_registry = tmp.path().join("ok.db");
    let o = kiln(&[
        "train",
        cfg.to_str().unwrap(),
        "-q",
        "--registry",
        ok_registry.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(ro.join("out").to_str().unwrap()),
        "the error names the read-only directory: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    // Defect 2: the registry is on a read-only mount; the run fails at once, names the
    // registry, and no run is left saying `running`.
    tried += 1;
    let export = tmp.path().join("out");
    let cfg = tiny_config(tmp.path(), &export);
    let reg = ro.join("runs.db");
    let o = kiln(&[
        "train",
        cfg.to_str().unwrap(),
        "-q",
        "--registry",
        reg.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(reg.to_str().unwrap()),
        "the error names the registry: {}",
        stderr(&o)
    );
    assert_nothing_running(&export);

    // Defect 10: the read-only commands read it.
    tried += 1;
    let o = kiln(&["runs", "list", "--registry", reg.to_str().unwrap()]);
    assert!(o.status.success(), "runs list: {}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&id));
    let o = kiln(&["runs", "show", &id, "--registry", reg.to_str().unwrap()]);
    assert!(o.status.success(), "runs show: {}", stderr(&o));
    eprintln!("faults_train read-only: {tried} cases tried, 0 failures");
}

/// No run directory under `<export>/runs` claims to be running.
fn assert_nothing_running(export: &Path) {
    for e in std::fs::read_dir(export.join("runs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let s = status_of(&e.path());
        assert!(
            s.as_deref() == Some("failed"),
            "{} is left with status {s:?}",
            e.path().display()
        );
    }
}

#[test]
fn an_unopenable_registry_fails_the_run_before_it_starts() {
    // A directory where the registry file should be: SQLite cannot open it (no root or mount
    // needed). The command fails naming it, and no run is left `running` or half-created.
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("out");
    let cfg = tiny_config(tmp.path(), &export);
    let reg = tmp.path().join("registry-is-a-directory");
    std::fs::create_dir(&reg).unwrap();
    let o = kiln(&[
        "train",
        cfg.to_str().unwrap(),
        "-q",
        "--registry",
        reg.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains(reg.to_str().unwrap()), "{}", stderr(&o));
    let dirs: Vec<_> = std::fs::read_dir(export.join("runs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(dirs.is_empty(), "no run directory is created: {dirs:?}");
}

#[test]
fn an_export_dir_under_a_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let cfg = tiny_config(tmp.path(), &file.join("out"));
    let o = kiln(&[
        "train",
        cfg.to_str().unwrap(),
        "-q",
        "--registry",
        tmp.path().join("r.db").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(file.to_str().unwrap()),
        "{}",
        stderr(&o)
    );
}

// ---------------------------------------------------------------------------------------
// Inputs and checkpoints.

#[test]
fn a_non_utf8_config_is_located_by_line_column_and_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(root().join("configs/tiny.yaml")).unwrap();
    let at = bytes.windows(5).position(|w| w == b"seed:").unwrap();
    let line = bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1;
    bytes.splice(at + 2..at + 2, [0xffu8]); // "se\xffed:"
    let p = tmp.path().join("latin1.yaml");
    std::fs::write(&p, &bytes).unwrap();
    for args in [
        vec!["config", "check", p.to_str().unwrap()],
        vec!["train", p.to_str().unwrap(), "-q"],
    ] {
        let o = kiln(&args);
        assert_eq!(o.status.code(), Some(2));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("latin1.yaml:{line}:3: not UTF-8"))
                && err.contains(&format!("byte offset {}", at + 2))
                && err.contains("0xff"),
            "{err}"
        );
    }
}

fn features_of(export: &Path) -> Vec<String> {
    Checkpoint::load(export).unwrap().manifest.feature_names()
}

#[test]
fn predict_refuses_a_feature_column_given_twice() {
    let export = reference().run.join("export");
    let tmp = tempfile::tempdir().unwrap();
    let features = features_of(&export);
    let mut header = features.clone();
    header.insert(2, "age".into()); // `age` is features[0]
    let row = vec!["1"; header.len()].join(",");
    let input = tmp.path().join("rows.csv");
    std::fs::write(&input, format!("{}\n{row}\n", header.join(","))).unwrap();
    let o = kiln(&[
        "predict",
        "--checkpoint",
        export.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("column `age` appears twice in the header (columns 1 and 3"),
        "{err}"
    );
}

fn predict_csv(export: &Path, input: &Path) -> Output {
    kiln(&[
        "predict",
        "--checkpoint",
        export.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ])
}

#[test]
fn an_edited_manifest_is_refused_until_resealed_and_unsealed_ones_warn() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    let src = reference().run.join("export");
    for f in ["manifest.json", "model.safetensors"] {
        std::fs::copy(src.join(f), ckpt.join(f)).unwrap();
    }
    let features = features_of(&ckpt);
    let input = tmp.path().join("rows.csv");
    std::fs::write(
        &input,
        format!(
            "{}\n{}\n",
            features.join(","),
            vec!["1"; features.len()].join(",")
        ),
    )
    .unwrap();
    let before = predict_csv(&ckpt, &input);
    assert!(before.status.success(), "{}", stderr(&before));

    // Edit a target's mean: every prediction would change silently.
    let mpath = ckpt.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mpath).unwrap()).unwrap();
    let mean = m["targets"][0]["mean"].as_f64().unwrap();
    m["targets"][0]["mean"] = serde_json::json!(mean + 0.25);
    std::fs::write(&mpath, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let o = predict_csv(&ckpt, &input);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("manifest SHA-256 mismatch") && err.contains("kiln checkpoint reseal"),
        "{err}"
    );

    // Re-sealing the deliberate edit makes it loadable, with the edit in effect.
    let o = kiln(&["checkpoint", "reseal", ckpt.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("re-sealed"));
    let after = predict_csv(&ckpt, &input);
    assert!(after.status.success(), "{}", stderr(&after));
    assert_ne!(after.stdout, before.stdout, "the edited mean is used");

    // Reformatting (compact JSON, keys in another order) is not an edit.
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mpath).unwrap()).unwrap();
    std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();
    assert!(predict_csv(&ckpt, &input).status.success());

    // A manifest without a seal (an older kiln's) loads with a warning.
    let mut m = m;
    m.as_object_mut().unwrap().remove("manifest_sha256");
    std::fs::write(&mpath, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let o = predict_csv(&ckpt, &input);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("no seal"), "{}", stderr(&o));
    assert_eq!(o.stdout, after.stdout);

    // Re-sealing refuses a checkpoint whose weights do not match.
    let w = ckpt.join("model.safetensors");
    let mut bytes = std::fs::read(&w).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    std::fs::write(&w, bytes).unwrap();
    let o = kiln(&[
        "checkpoint",
        "reseal",
        "--checkpoint",
        ckpt.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("weights SHA-256 mismatch"),
        "{}",
        stderr(&o)
    );
}
