//! Running a sweep: every expanded configuration is handed to a [`Launcher`] (P at a time),
//! all runs land in one registry, and the registry answers the right-sizing question.
//!
//! The CLI launches each run as its own `kiln train` process ([`ProcessLauncher`]): separate
//! processes isolate thread pools (each run gets `RAYON_NUM_THREADS = T`) and crashes. A
//! program embedding kiln can run members in its own process instead ([`InProcessLauncher`]),
//! or submit them to its own scheduler by implementing [`Launcher`].

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use super::SweepSpec;
use crate::RegistryObserver;
use crate::analysis;
use crate::config::{self, ConfigError};
use crate::registry::{Registry, RegistryError};
use crate::run::{RunOptions, TrainingRun};

/// One member for a launcher to run.
#[derive(Debug, Clone)]
pub struct LaunchRequest<'a> {
    /// Position in the expansion.
    pub index: usize,
    /// The base config file.
    pub base: &'a Path,
    /// The member's `key.path=value` overrides.
    pub overrides: &'a [String],
    /// The registry every member records into.
    pub registry: &'a Path,
    /// Threads the member may use.
    pub threads: usize,
}

/// What a launcher reports back.
#[derive(Debug, Clone, Default)]
pub struct Launched {
    /// The run id, when the run finished.
    pub run_id: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// Warnings the run printed (shown by the caller, never dropped).
    pub warnings: Vec<String>,
}

/// Runs one sweep member to its end. Called from several threads at once (P of them).
pub trait Launcher: Sync {
    /// Run `req` and report its run id or its error.
    fn launch(&self, req: &LaunchRequest<'_>) -> Launched;
}

/// Each member is `EXE train BASE -q --registry R --set …` with `RAYON_NUM_THREADS=T` and
/// `env` added to the inherited environment (e.g. the MLflow parent run of the sweep). Every
/// line of the member's stderr that mentions a warning is reported back, whether the member
/// finished or failed.
#[derive(Debug, Clone)]
pub struct ProcessLauncher {
    /// The `kiln` executable.
    pub exe: PathBuf,
    /// Extra environment variables for every member.
    pub env: Vec<(String, String)>,
}

impl Launcher for ProcessLauncher {
    fn launch(&self, req: &LaunchRequest<'_>) -> Launched {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("train")
            .arg(req.base)
            .arg("-q")
            .arg("--registry")
            .arg(req.registry);
        for o in req.overrides {
            cmd.arg("--set").arg(o);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.env("RAYON_NUM_THREADS", req.threads.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match cmd.output() {
            Ok(out) => {
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                let run_id = stdout
                    .lines()
                    .last()
                    .map(PathBuf::from)
                    .as_ref()
                    .and_then(|p| p.parent())
                    .and_then(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned());
                let warnings = stderr
                    .lines()
                    .filter(|l| l.to_ascii_lowercase().contains("warn"))
                    .map(str::to_string)
                    .collect();
                if out.status.success() {
                    Launched {
                        run_id,
                        error: None,
                        warnings,
                    }
                } else {
                    Launched {
                        run_id: None,
                        error: Some(stderr.lines().last().unwrap_or("failed").to_string()),
                        warnings,
                    }
                }
            }
            Err(e) => Launched {
                error: Some(format!("{}: {e}", self.exe.display())),
                ..Launched::default()
            },
        }
    }
}

/// Each member is a [`TrainingRun`] in this process (sharing its thread pool; a panic in one
/// run is not isolated). The registry is the observer, as with `kiln train`.
#[derive(Debug, Clone, Default)]
pub struct InProcessLauncher;

impl Launcher for InProcessLauncher {
    fn launch(&self, req: &LaunchRequest<'_>) -> Launched {
        let fail = |e: String| Launched {
            error: Some(e),
            ..Launched::default()
        };
        let loaded = match config::load_with_overrides(req.base, req.overrides) {
            Ok(l) => l,
            Err(e) => return fail(e.to_string()),
        };
        let registry = match Registry::open(req.registry) {
            Ok(r) => r,
            Err(e) => return fail(e.to_string()),
        };
        let mut run = match TrainingRun::new(loaded, RunOptions::default()) {
            Ok(r) => r,
            Err(e) => return fail(e.to_string()),
        };
        run.observe(Box::new(RegistryObserver::new(registry)));
        let id = run.dir().id.clone();
        match run.execute() {
            Ok(_) => Launched {
                run_id: Some(id),
                ..Launched::default()
            },
            Err(e) => fail(e.to_string()),
        }
    }
}

/// One finished (or failed) sweep member.
#[derive(Debug, Clone, Serialize)]
pub struct Member {
    /// Position in the expansion.
    pub index: usize,
    /// Its overrides.
    pub overrides: Vec<String>,
    /// Run id (when the run finished).
    pub run_id: Option<String>,
    /// Parameter count.
    pub params: Option<i64>,
    /// Validation loss (stage 1).
    pub val_metric: Option<f64>,
    /// Batch-1 p50 latency, µs.
    pub latency_b1_p50_us: Option<f64>,
    /// Why it failed.
    pub error: Option<String>,
    /// Warnings the run printed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The sweep's result: every member in expansion order and the right-sizing answer.
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    /// Members in expansion order.
    pub runs: Vec<Member>,
    /// Relative tolerance of the right-sizing answer.
    pub tolerance: f64,
    /// Index into `runs` of the best validation loss.
    pub best: Option<usize>,
    /// Index into `runs` of the smallest model within `tolerance` of the best.
    pub right_sized: Option<usize>,
    /// Members that failed.
    pub failed: usize,
    /// Wall time of the sweep, seconds.
    pub wall_s: f64,
}

/// Errors that stop a sweep before or after its members run (a member's failure is
/// recorded in its [`Member`], not returned).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The base config or a member's overrides are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The registry could not be opened or read.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// `--index` is outside the sweep.
    #[error("index {index} is outside the sweep's {count} runs (0..{count})")]
    Index {
        /// The index asked for.
        index: usize,
        /// How many runs the sweep has.
        count: usize,
    },
    /// Another live process holds the member.
    #[error("{0}")]
    Busy(String),
    /// The member's run could not be prepared or failed.
    #[error("sweep run {index}: {message}")]
    Member {
        /// The member's index.
        index: usize,
        /// What went wrong.
        message: String,
    },
}

/// Progress callback: (members done, total, the member that just finished).
pub type OnMemberDone = dyn Fn(usize, usize, &Member) + Sync;

/// How to run a sweep.
pub struct SweepOptions<'a> {
    /// Concurrent members (P).
    pub parallel: usize,
    /// Threads per member (T).
    pub threads: usize,
    /// The registry every member records into.
    pub registry: &'a Path,
    /// Called as each member finishes: (members done, total, the member).
    pub on_done: Option<&'a OnMemberDone>,
}

/// Run every member of `spec` through `launcher` and answer the right-sizing question from
/// the registry. Every member's overrides are validated before any member starts.
pub fn run_sweep(
    spec: &SweepSpec,
    launcher: &dyn Launcher,
    options: &SweepOptions<'_>,
) -> Result<SweepReport, SweepError> {
    let base = config::load(&spec.base)?;
    let runs = spec.expand();
    for o in &runs {
        config::apply_overrides(&base.config, o, &spec.base)?;
    }
    Registry::open(options.registry)?; // create and migrate once, before the members race to
    let started = Instant::now();
    let queue: Mutex<VecDeque<(usize, Vec<String>)>> =
        Mutex::new(runs.iter().cloned().enumerate().collect());
    let done: Mutex<Vec<Member>> = Mutex::new(Vec::new());
    let total = runs.len();
    std::thread::scope(|s| {
        for _ in 0..options.parallel.max(1).min(total) {
            s.spawn(|| {
                while let Some((index, overrides)) =
                    queue.lock().ok().and_then(|mut q| q.pop_front())
                {
                    let l = launcher.launch(&LaunchRequest {
                        index,
                        base: &spec.base,
                        overrides: &overrides,
                        registry: options.registry,
                        threads: options.threads.max(1),
                    });
                    let member = Member {
                        index,
                        overrides,
                        run_id: if l.error.is_none() { l.run_id } else { None },
                        params: None,
                        val_metric: None,
                        latency_b1_p50_us: None,
                        error: l.error,
                        warnings: l.warnings,
                    };
                    if let Ok(mut d) = done.lock() {
                        d.push(member.clone());
                        if let Some(f) = options.on_done {
                            f(d.len(), total, &member);
                        }
                    }
                }
            });
        }
    });
    let mut members = done.into_inner().unwrap_or_else(|e| e.into_inner());
    members.sort_by_key(|m| m.index);
    let reg = Registry::open(options.registry)?;
    for m in &mut members {
        if let Some(id) = &m.run_id
            && let Ok(r) = reg.get(id)
        {
            m.params = r.param_count;
            m.val_metric = r.val_metric;
            m.latency_b1_p50_us = r.latency_b1_p50_us;
        }
    }
    Ok(report(
        members,
        spec.tolerance,
        started.elapsed().as_secs_f64(),
    ))
}

/// The right-sizing answer over `members` (those with a validation metric take part).
pub(super) fn report(members: Vec<Member>, tolerance: f64, wall_s: f64) -> SweepReport {
    let ok: Vec<usize> = (0..members.len())
        .filter(|&i| members[i].val_metric.is_some())
        .collect();
    let pts: Vec<(f64, f64)> = ok
        .iter()
        .map(|&i| {
            (
                members[i].params.unwrap_or(0) as f64,
                members[i].val_metric.unwrap_or(f64::NAN),
            )
        })
        .collect();
    let answer = analysis::right_size(&pts, tolerance);
    let failed = members.iter().filter(|m| m.error.is_some()).count();
    SweepReport {
        runs: members,
        tolerance,
        best: answer.map(|(b, _)| ok[b]),
        right_sized: answer.map(|(_, c)| ok[c]),
        failed,
        wall_s,
    }
}
