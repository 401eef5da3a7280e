//! A testing hook for deterministic crash tests: `KILN_FAULT=kill@<point>[:<n>]` makes the
//! process SIGKILL itself the `n`-th time (default 1) it reaches the named point, so a test can
//! interrupt a run at an exact place (between an epoch's log line and its snapshot, in the
//! middle of an export, …) instead of relying on timing. Several specs may be given separated
//! by commas. The hook is always compiled in and inert unless the variable is set; the variable
//! is read once per process.
//!
//! The points kiln marks are listed in [`POINTS`]; the fault suite (`tests/it/faults_train.rs`)
//! kills at each and checks that `kiln train --resume` reaches the uninterrupted result.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The environment variable that arms the hook.
pub const ENV: &str = "KILN_FAULT";

/// Every point kiln marks, in the order a run reaches them.
pub const POINTS: &[&str] = &[
    // Session::open of a resumed run: state restored, logs lined up, no step taken yet.
    "during-resume",
    // After each optimizer step (use `:<n>` to choose the step).
    "during-step",
    // After an epoch's line is appended to epochs.jsonl, before its snapshot.
    "after-epoch-log",
    // A snapshot directory is complete but LATEST does not point at it yet.
    "before-snapshot-latest",
    // LATEST was switched; older snapshots are not removed yet.
    "after-snapshot-latest",
    // `numeric_bins: auto`: the chosen candidate's snapshot and step log are copied into
    // the run, LATEST not yet written.
    "during-adopt",
    // The latency benchmark of the trained model is running (before its export).
    "during-latency",
    // Inside the export's temporary directory: weights written, manifest not yet.
    "during-export",
    // Everything is done but run.json does not say `finished` yet.
    "before-finished",
    // `kiln promote`: the promotion is recorded as `installing` and the candidate's files
    // are copied into `.promote.tmp-<pid>-<v>`, not yet renamed to the version.
    "during-promote-install",
];

struct Spec {
    point: String,
    nth: usize,
    hits: AtomicUsize,
}

fn specs() -> &'static [Spec] {
    static SPECS: OnceLock<Vec<Spec>> = OnceLock::new();
    SPECS.get_or_init(|| match std::env::var(ENV) {
        Ok(v) => parse(&v),
        Err(_) => Vec::new(),
    })
}

/// Parse `kill@point[:n],…`; malformed entries are reported on stderr and ignored.
fn parse(text: &str) -> Vec<Spec> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parsed = item.strip_prefix("kill@").and_then(|rest| {
            let (point, nth) = match rest.rsplit_once(':') {
                Some((p, n)) => (p, n.parse::<usize>().ok().filter(|&n| n >= 1)?),
                None => (rest, 1),
            };
            POINTS.contains(&point).then(|| Spec {
                point: point.to_string(),
                nth,
                hits: AtomicUsize::new(0),
            })
        });
        match parsed {
            Some(s) => out.push(s),
            None => eprintln!(
                "{ENV}: ignoring {item:?} (expected kill@<point>[:<n>], point one of {})",
                POINTS.join(", ")
            ),
        }
    }
    out
}

/// Mark a point: kills the process (SIGKILL, no cleanup of any kind) when `KILN_FAULT` asks
/// for it here and this is the chosen hit; otherwise does nothing.
pub fn point(name: &str) {
    let specs = specs();
    if specs.is_empty() {
        return;
    }
    for s in specs {
        if s.point == name && s.hits.fetch_add(1, Ordering::SeqCst) + 1 == s.nth {
            eprintln!("{ENV}: killing the process at {name} (hit {})", s.nth);
            // SAFETY: getpid and kill have no preconditions; SIGKILL cannot be caught.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_reject_unknown_points() {
        let s = parse("kill@after-epoch-log:3, kill@during-export,kill@nowhere,kill@during-step:0");
        let got: Vec<(&str, usize)> = s.iter().map(|s| (s.point.as_str(), s.nth)).collect();
        assert_eq!(got, vec![("after-epoch-log", 3), ("during-export", 1)]);
    }
}
