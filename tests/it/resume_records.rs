//! What a killed and resumed run leaves in its records: `resources.csv` keeps the killed
//! process's trace and continues it (not the resumed process's samples alone), and a run
//! whose process is gone is not `running` forever — `kiln runs list` (the registry's reaper)
//! marks its `run.json` as killed, with why.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use crate::common::only_run;
use crate::common::{kiln, tiny_config};

fn status(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap()
}

#[test]
fn a_resumed_run_keeps_the_killed_processes_resource_trace_and_its_run_json_is_marked() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    // Enough epochs before the kill that the resource monitor (a first sample at 50 ms) has
    // sampled however fast the machine: the tiny stage's 3 epochs once all fitted in less.
    let cfg = tiny_config(tmp.path(), &out, &[("    epochs: 3", "    epochs: 60")]);
    let cfg = cfg.to_str().unwrap();
    // Killed after the 40th epoch's log line.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["train", cfg, "-q"])
        .current_dir(crate::common::root())
        .env("KILN_FAULT", "kill@after-epoch-log:40")
        .env_remove("KILN_LOG")
        .output()
        .unwrap();
    assert_eq!(
        o.status.signal(),
        Some(9),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let run = only_run(&out);
    let killed_pid = status(&run)["pid"].as_u64().unwrap();
    assert_eq!(
        status(&run)["status"],
        "running",
        "as the killed process left it"
    );

    // The trace so far is on disk.
    let before = std::fs::read_to_string(run.join("resources.csv"))
        .expect("a killed run leaves its resource trace");
    let before: Vec<&str> = before.lines().collect();
    assert!(
        before.len() >= 2,
        "header and at least one sample: {before:?}"
    );
    let last_t: f64 = before
        .last()
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();

    // Listing the runs reaps it: registry row and run.json alike.
    let db = out.join("runs.db");
    let o = kiln(&["runs", "--registry", db.to_str().unwrap(), "list"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = status(&run);
    assert_eq!(st["status"], "killed", "{st}");
    assert_eq!(st["pid"].as_u64(), Some(killed_pid));
    assert!(
        st["reason"].as_str().unwrap().contains("abandoned") && st["ended_at"].is_string(),
        "{st}"
    );

    let o = kiln(&["train", cfg, "--resume", run.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(status(&run)["status"], "finished");
    let after = std::fs::read_to_string(run.join("resources.csv")).unwrap();
    let after: Vec<&str> = after.lines().collect();
    assert_eq!(
        after[..before.len()],
        before[..],
        "the killed process's samples come first, unchanged"
    );
    assert!(
        after.len() > before.len(),
        "the resumed process's samples follow"
    );
    let t: Vec<f64> = after[1..]
        .iter()
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert!(t.windows(2).all(|w| w[0] <= w[1]), "time runs on: {t:?}");
    assert!(t[before.len() - 1] >= last_t);
    assert!(
        after.last().unwrap().ends_with(",variance"),
        "{:?}",
        after.last()
    );
}
