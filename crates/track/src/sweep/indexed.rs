//! A sweep as an indexed job: [`plan`] gives every member a stable index and the sweep a
//! stable id, [`run_index`] runs exactly one member (what one pod of a Kubernetes Indexed Job
//! does with its `JOB_COMPLETION_INDEX`), and [`summarize`] answers the right-sizing question
//! from the shared registry once every index has run.
//!
//! The registry's `sweep_members` table maps (sweep id, index) to the run holding the member,
//! claimed before the run trains (a compare-and-swap, so two processes never both start one
//! member). Running an index again is idempotent: a finished member is not run twice; a member
//! whose run was killed (or failed) is resumed from its run directory (`kiln train --resume`)
//! when that directory is reachable (a shared volume across pods), and restarted as a new run
//! when it is not; a member whose run is still alive is refused.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Member, SweepError, SweepReport, SweepSpec};
use crate::RegistryObserver;
use crate::config;
use crate::records::{RunDir, RunState};
use crate::registry::Registry;
use crate::run::{RunOptions, TrainingRun};

/// One member of a planned sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedRun {
    /// Its index (0-based, the order of [`SweepSpec::expand`]).
    pub index: usize,
    /// `<sweep id>-<index>`.
    pub id: String,
    /// Its `--set` overrides.
    pub overrides: Vec<String>,
}

/// A sweep's expansion with stable ids.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepPlan {
    /// `<sweep file stem>-<12 hex>`: a hash of the sweep (its expanded members and tolerance)
    /// and the base config's text, so editing either starts a new sweep.
    pub sweep_id: String,
    /// The base config file.
    pub base: PathBuf,
    /// Every member in order.
    pub runs: Vec<PlannedRun>,
}

/// Expand `spec` (read from `file`) into its members, validating every member's overrides
/// against the base config.
pub fn plan(spec: &SweepSpec, file: &Path) -> Result<SweepPlan, SweepError> {
    use sha2::Digest as _;
    let base = config::load(&spec.base)?;
    let runs = spec.expand();
    for o in &runs {
        config::apply_overrides(&base.config, o, &spec.base)?;
    }
    let mut h = sha2::Sha256::new();
    h.update(base.text.as_bytes());
    h.update([0u8]);
    h.update(
        serde_json::to_string(&(&runs, spec.tolerance))
            .unwrap_or_default()
            .as_bytes(),
    );
    let digest = h.finalize();
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sweep".into());
    let sweep_id = format!("{stem}-{hex}");
    Ok(SweepPlan {
        runs: runs
            .into_iter()
            .enumerate()
            .map(|(index, overrides)| PlannedRun {
                index,
                id: format!("{sweep_id}-{index}"),
                overrides,
            })
            .collect(),
        sweep_id,
        base: spec.base.clone(),
    })
}

/// What [`run_index`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum IndexOutcome {
    /// The member had already finished; nothing ran.
    AlreadyFinished {
        /// Its run.
        run_id: String,
    },
    /// The member ran to its end now.
    Finished {
        /// Its run.
        run_id: String,
        /// Whether an interrupted run was resumed (rather than a new run started).
        resumed: bool,
    },
}

impl IndexOutcome {
    /// The member's run id.
    pub fn run_id(&self) -> &str {
        match self {
            IndexOutcome::AlreadyFinished { run_id } | IndexOutcome::Finished { run_id, .. } => {
                run_id
            }
        }
    }
}

/// Check placement overrides (`kiln sweep run --set`) against `plan`: each must be
/// `key=value` and name no key the sweep file sets for any member, since placement overrides
/// are outside the sweep's id and must not change what a member trains. Returns them
/// unchanged.
pub fn placement_overrides<'a>(
    plan: &SweepPlan,
    extra: &'a [String],
) -> Result<&'a [String], SweepError> {
    let key_of = |o: &str| o.split_once('=').map(|(k, _)| k.trim().to_string());
    for o in extra {
        let Some(key) = key_of(o) else {
            return Err(crate::config::ConfigError::Invalid {
                path: plan.base.clone(),
                key: o.clone(),
                message: "expected --set key.path=value".into(),
            }
            .into());
        };
        let owned = plan
            .runs
            .iter()
            .flat_map(|r| &r.overrides)
            .any(|m| key_of(m).as_deref() == Some(key.as_str()));
        if owned {
            return Err(crate::config::ConfigError::Invalid {
                path: plan.base.clone(),
                key,
                message: "the sweep file sets this key for its members; `kiln sweep run --set` only places a member (paths, workers), it may not change what the sweep trains".into(),
            }
            .into());
        }
    }
    Ok(extra)
}

/// Run member `index` of `plan` into the registry at `registry` (a path or URL), in this
/// process, with a global thread pool of `threads` threads when `RAYON_NUM_THREADS` does not
/// say otherwise. `extra` are placement overrides (e.g. `export.dir=/work/checkpoints`, where
/// a pod can write), applied after the member's own and checked by
/// [`placement_overrides`]; they are not part of the sweep id, so every pod of one sweep
/// still agrees on it. Idempotent (see the module documentation).
pub fn run_index(
    plan: &SweepPlan,
    index: usize,
    registry: &Path,
    threads: usize,
    extra: &[String],
) -> Result<IndexOutcome, SweepError> {
    let Some(member) = plan.runs.get(index) else {
        return Err(SweepError::Index {
            index,
            count: plan.runs.len(),
        });
    };
    let extra = placement_overrides(plan, extra)?;
    let reg = Registry::open(registry)?;
    let reaped = reg.reap_stale()?;
    if reaped > 0 {
        tracing::warn!("run registry: marked {reaped} stale running run(s) as killed");
    }
    let claimed = reg.sweep_member(&plan.sweep_id, index)?;
    let mut resume: Option<PathBuf> = None;
    if let Some(c) = &claimed {
        let row = reg.get(&c.run_id).ok();
        let dir = RunDir::open(Path::new(&c.run_dir)).ok();
        let dir_finished = dir
            .as_ref()
            .and_then(RunDir::read_status)
            .is_some_and(|s| s.status == RunState::Finished);
        match row.as_ref().map(|r| r.status) {
            Some(RunState::Finished) => {
                return Ok(IndexOutcome::AlreadyFinished {
                    run_id: c.run_id.clone(),
                });
            }
            Some(RunState::Running) => {
                let r = row.as_ref().expect("a row");
                return Err(SweepError::Busy(format!(
                    "sweep {} index {index} is being run by {} (process {} on {}); it is reaped as killed once its process is gone (same host) or its heartbeat is older than {} s",
                    plan.sweep_id,
                    r.id,
                    r.pid,
                    r.host,
                    crate::registry::HEARTBEAT_TIMEOUT.as_secs()
                )));
            }
            _ => {}
        }
        if dir.is_some() && !dir_finished {
            resume = Some(PathBuf::from(&c.run_dir));
        }
    }
    if threads > 0 && std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // Fails only when the pool already exists (an embedding program made its own).
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global();
    }
    let overrides: Vec<String> = member.overrides.iter().chain(extra).cloned().collect();
    let loaded = config::load_with_overrides(&plan.base, &overrides)?;
    let resumed = resume.is_some();
    let run = TrainingRun::new(
        loaded,
        RunOptions {
            resume,
            progress: crate::train::ProgressMode::Quiet,
            ..RunOptions::default()
        },
    )
    .map_err(|e| SweepError::Member {
        index,
        message: e.to_string(),
    })?;
    let run_id = run.dir().id.clone();
    if !resumed {
        let prev = claimed.as_ref().map(|c| c.run_id.as_str());
        if !reg.claim_sweep_member(&plan.sweep_id, index, &run_id, &run.dir().path, prev)? {
            let _ = std::fs::remove_dir_all(&run.dir().path);
            return Err(SweepError::Busy(format!(
                "sweep {} index {index} was claimed by another process meanwhile",
                plan.sweep_id
            )));
        }
    }
    let mut run = run;
    run.observe(Box::new(RegistryObserver::new(reg)));
    run.execute().map_err(|e| SweepError::Member {
        index,
        message: e.to_string(),
    })?;
    Ok(IndexOutcome::Finished { run_id, resumed })
}

/// The right-sizing answer of `plan` from the registry at `registry`: every member's run as
/// claimed there (a member not run yet, or not finished, is reported failed with the reason).
pub fn summarize(
    plan: &SweepPlan,
    tolerance: f64,
    registry: &Path,
) -> Result<SweepReport, SweepError> {
    let reg = match Registry::open(registry) {
        Ok(r) => {
            let _ = r.reap_stale();
            r
        }
        Err(_) => Registry::open_read_only(registry)?,
    };
    let mut members = Vec::with_capacity(plan.runs.len());
    for p in &plan.runs {
        let mut m = Member {
            index: p.index,
            overrides: p.overrides.clone(),
            run_id: None,
            params: None,
            val_metric: None,
            latency_b1_p50_us: None,
            error: None,
            warnings: Vec::new(),
        };
        match reg.sweep_member(&plan.sweep_id, p.index)? {
            None => m.error = Some("not run yet".into()),
            Some(c) => match reg.get(&c.run_id) {
                Ok(r) if r.status == RunState::Finished => {
                    m.run_id = Some(r.id.clone());
                    m.params = r.param_count;
                    m.val_metric = r.val_metric;
                    m.latency_b1_p50_us = r.latency_b1_p50_us;
                }
                Ok(r) => {
                    m.error = Some(format!(
                        "run {} is {}{}",
                        r.id,
                        r.status,
                        r.reason.map(|x| format!(": {x}")).unwrap_or_default()
                    ))
                }
                Err(_) => m.error = Some(format!("run {} never started", c.run_id)),
            },
        }
        members.push(m);
    }
    Ok(super::runner::report(members, tolerance, 0.0))
}
