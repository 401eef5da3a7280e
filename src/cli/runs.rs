//! `kiln runs list | show | compare | promotions | report | regressions`: the arguments and
//! the registry are handled here; the reports are `kiln::track::report`'s.

use std::path::{Path, PathBuf};

use super::{CliError, CliResult};
use kiln::config;
use kiln::track::analysis::RegressionRule;
use kiln::track::registry::{Location, PromotionRow, Registry};
use kiln::track::report::{self, Attribution};

use kiln::track::report::LatencyBatch;

/// The latency batch of `--batch`.
pub fn latency_batch(b: usize) -> Result<LatencyBatch, CliError> {
    LatencyBatch::from_batch(b).ok_or_else(|| {
        CliError::input(anyhow::anyhow!(
            "--batch {b}: runs record latency at batch 1 and 128 only"
        ))
    })
}

fn open(path: &Path) -> Result<Registry, CliError> {
    // `--registry` is a file, `sqlite:///file` or `postgres://…` (a server has no file to check).
    let location = Location::from_path(path);
    if let Location::Sqlite(file) = &location
        && !file.exists()
    {
        return Err(CliError::input(anyhow::anyhow!(
            "no run registry at {} (train a model first, or pass --registry)",
            file.display()
        )));
    }
    // Reading needs no write access: a registry that cannot be opened for writing (a
    // read-only mount, a file of another user) is read without reaping stale rows.
    match Registry::open(path) {
        Ok(reg) => {
            if let Err(e) = reg.reap_stale() {
                tracing::warn!("{e} (stale running rows not reaped)");
            }
            Ok(reg)
        }
        Err(writable) => Registry::open_read_only(path).map_err(|read_only| {
            CliError::from(anyhow::anyhow!(
                "{writable}; opening it read-only failed too: {read_only}"
            ))
        }),
    }
}

/// The registry `kiln runs` reads: `--registry`, else the one `--config` names, else
/// `checkpoints/runs.db` (the shipped configs' default).
pub fn registry_of(registry: Option<PathBuf>, config: Option<&Path>) -> Result<PathBuf, CliError> {
    match (registry, config) {
        (Some(r), _) => Ok(r),
        (None, Some(c)) => {
            let loaded = config::load(c).map_err(CliError::input)?;
            Ok(loaded.config.registry_path())
        }
        (None, None) => Ok(PathBuf::from("checkpoints/runs.db")),
    }
}

/// Every promotion decision, for the `served` column (a registry whose decisions cannot be
/// read still lists its runs).
fn all_promotions(reg: &Registry) -> Vec<PromotionRow> {
    reg.promotions(None).unwrap_or_else(|e| {
        tracing::warn!("{e} (the served versions are not shown)");
        Vec::new()
    })
}

/// `kiln runs list` (with the test NLL and which model versions each run is serving).
pub fn list(registry: &Path, json: bool) -> CliResult {
    let reg = open(registry)?;
    let rows = reg.list()?;
    let promotions = all_promotions(&reg);
    if json {
        for line in report::list_json(&rows, &promotions) {
            println!("{line}");
        }
    } else {
        print!("{}", report::list_table(&rows, &promotions));
    }
    Ok(())
}

/// `kiln runs promotions`: every decision of the gate, oldest first.
pub fn promotions(registry: &Path, model: Option<&str>, json: bool) -> CliResult {
    let reg = open(registry)?;
    let rows = reg.promotions(model)?;
    if json {
        for line in report::promotions_json(&rows) {
            println!("{line}");
        }
    } else {
        print!("{}", report::promotions_table(&rows, registry));
    }
    Ok(())
}

/// `kiln runs show ID`.
pub fn show(registry: &Path, id: &str, json: bool) -> CliResult {
    let reg = open(registry)?;
    let r = reg.get(id).map_err(CliError::input)?;
    let epochs = reg.epochs(&r.id)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::show_json(&r, &epochs))?
        );
    } else {
        print!("{}", report::show_text(&r, &epochs));
    }
    Ok(())
}

/// `kiln runs compare A B`.
pub fn compare(registry: &Path, a: &str, b: &str, json: bool) -> CliResult {
    let reg = open(registry)?;
    let (ra, rb) = (
        reg.get(a).map_err(CliError::input)?,
        reg.get(b).map_err(CliError::input)?,
    );
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::compare_json(&ra, &rb))?
        );
    } else {
        print!("{}", report::compare_text(&ra, &rb));
    }
    Ok(())
}

/// `kiln runs report`: figures and an HTML page (the files written are printed).
pub fn report(registry: &Path, out: &Path, which: LatencyBatch) -> CliResult {
    let reg = open(registry)?;
    let rows = reg.list()?;
    let shown = Location::from_path(registry).display();
    for p in report::write_report(&rows, &shown, out, which)? {
        println!("{}", super::printed(&p).display());
    }
    Ok(())
}

/// Options of `kiln runs regressions`.
pub struct RegressionArgs<'a> {
    /// Registry file.
    pub registry: &'a Path,
    /// Latency batch size.
    pub which: LatencyBatch,
    /// Re-profile flagged runs and their peers.
    pub attribute: bool,
    /// JSON lines output.
    pub json: bool,
    /// The rule.
    pub rule: RegressionRule,
    /// Where attribution profiles go.
    pub out: PathBuf,
}

/// `kiln runs regressions`: exit code 3 when any run is flagged.
pub fn regressions(args: &RegressionArgs<'_>) -> CliResult {
    let rule = &args.rule;
    for (flag, v, ok) in [
        ("--ratio", rule.ratio, rule.ratio > 0.0),
        (
            "--size-tolerance",
            rule.size_tolerance,
            rule.size_tolerance >= 0.0,
        ),
        (
            "--min-delta-us",
            rule.min_delta_us,
            rule.min_delta_us >= 0.0,
        ),
    ] {
        if !(ok && v.is_finite()) {
            return Err(CliError::input(anyhow::anyhow!(
                "{flag} {v}: expected a finite number{}",
                if flag == "--ratio" {
                    " above 0"
                } else {
                    " ≥ 0"
                }
            )));
        }
    }
    let reg = open(args.registry)?;
    let rows = reg.list()?;
    let found = report::find_regressions(&rows, args.which, rule);
    for f in &found.findings {
        if args.json {
            println!("{}", f.json());
        } else {
            print!("{}", f.text());
        }
        if args.attribute
            && let (Some(slow), Some(peer)) = (f.run, f.peer)
        {
            match report::attribute(slow, peer, args.which, &args.out)? {
                Attribution::NoArtifact(id) => {
                    eprintln!("  cannot attribute: {id} has no artifact");
                }
                Attribution::Table(t) => print!("{t}"),
            }
        }
    }
    if !args.json {
        eprintln!("{}", found.summary());
    }
    if found.findings.is_empty() {
        Ok(())
    } else {
        Err(CliError {
            code: 3,
            error: anyhow::anyhow!("{} latency regression(s) found", found.findings.len()),
        })
    }
}
