//! `kiln sweep SWEEP.yaml`: run every configuration as its own `kiln train` process (P at a
//! time, T threads each), all into one registry, then answer the right-sizing question.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use super::{CliError, CliResult};
use crate::config;
use crate::observe::analysis;
use crate::observe::registry::Registry;
use crate::sweep::SweepSpec;

/// One finished (or failed) sweep member.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Member {
    /// Position in the expansion.
    pub index: usize,
    /// Its overrides.
    pub overrides: Vec<String>,
    /// Run id (when the run started).
    pub run_id: Option<String>,
    /// Parameter count.
    pub params: Option<i64>,
    /// Validation loss (stage 1).
    pub val_metric: Option<f64>,
    /// Batch-1 p50 latency, µs.
    pub latency_b1_p50_us: Option<f64>,
    /// Why it failed.
    pub error: Option<String>,
}

/// Options of `kiln sweep`.
pub struct SweepArgs<'a> {
    /// The sweep file.
    pub spec: &'a Path,
    /// Registry override.
    pub registry: Option<&'a Path>,
    /// Override the file's `parallel`.
    pub parallel: Option<usize>,
    /// Override the file's `threads_per_run`.
    pub threads: Option<usize>,
    /// JSON output.
    pub json: bool,
}

/// Run the sweep.
pub fn run(args: &SweepArgs<'_>) -> CliResult {
    let spec = SweepSpec::load(args.spec).map_err(CliError::input)?;
    let base = config::load(&spec.base).map_err(CliError::input)?;
    let runs = spec.expand();
    for o in &runs {
        config::apply_overrides(&base.config, o, &spec.base).map_err(CliError::input)?;
    }
    let parallel = args.parallel.unwrap_or(spec.parallel).max(1);
    let threads = args.threads.unwrap_or(spec.threads_per_run).max(1);
    let registry_path: PathBuf = args
        .registry
        .map(Path::to_path_buf)
        .unwrap_or_else(|| base.config.registry_path());
    Registry::open(&registry_path)?; // create and migrate once, before the runs race to
    let exe = std::env::current_exe()?;
    eprintln!(
        "sweep {}: {} runs of {} ({} concurrent × {} thread(s) each), registry {}",
        args.spec.display(),
        runs.len(),
        spec.base.display(),
        parallel,
        threads,
        registry_path.display()
    );
    let started = Instant::now();
    let queue: Mutex<VecDeque<(usize, Vec<String>)>> =
        Mutex::new(runs.iter().cloned().enumerate().collect());
    let done: Mutex<Vec<Member>> = Mutex::new(Vec::new());
    let total = runs.len();
    std::thread::scope(|s| {
        for _ in 0..parallel.min(total) {
            s.spawn(|| {
                while let Some((index, overrides)) =
                    queue.lock().ok().and_then(|mut q| q.pop_front())
                {
                    let mut cmd = Command::new(&exe);
                    cmd.arg("train")
                        .arg(&spec.base)
                        .arg("-q")
                        .arg("--registry")
                        .arg(&registry_path);
                    for o in &overrides {
                        cmd.arg("--set").arg(o);
                    }
                    cmd.env("RAYON_NUM_THREADS", threads.to_string())
                        .stdin(Stdio::null())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped());
                    let member = match cmd.output() {
                        Ok(out) => {
                            let stdout = String::from_utf8_lossy(&out.stdout);
                            let export = stdout.lines().last().map(PathBuf::from);
                            let run_id = export
                                .as_ref()
                                .and_then(|p| p.parent())
                                .and_then(|p| p.file_name())
                                .map(|n| n.to_string_lossy().into_owned());
                            let error = (!out.status.success()).then(|| {
                                String::from_utf8_lossy(&out.stderr)
                                    .lines()
                                    .last()
                                    .unwrap_or("failed")
                                    .to_string()
                            });
                            Member {
                                index,
                                overrides,
                                run_id: if error.is_none() { run_id } else { None },
                                params: None,
                                val_metric: None,
                                latency_b1_p50_us: None,
                                error,
                            }
                        }
                        Err(e) => Member {
                            index,
                            overrides,
                            run_id: None,
                            params: None,
                            val_metric: None,
                            latency_b1_p50_us: None,
                            error: Some(e.to_string()),
                        },
                    };
                    if let Ok(mut d) = done.lock() {
                        d.push(member.clone());
                        eprintln!(
                            "[{}/{total}] {} {}",
                            d.len(),
                            member.run_id.as_deref().unwrap_or("FAILED"),
                            member
                                .error
                                .as_deref()
                                .unwrap_or(&member.overrides.join(" "))
                        );
                    }
                }
            });
        }
    });
    let mut members = done.into_inner().unwrap_or_else(|e| e.into_inner());
    members.sort_by_key(|m| m.index);
    let reg = Registry::open(&registry_path)?;
    for m in &mut members {
        if let Some(id) = &m.run_id
            && let Ok(r) = reg.get(id)
        {
            m.params = r.param_count;
            m.val_metric = r.val_metric;
            m.latency_b1_p50_us = r.latency_b1_p50_us;
        }
    }
    let ok: Vec<&Member> = members.iter().filter(|m| m.val_metric.is_some()).collect();
    let pts: Vec<(f64, f64)> = ok
        .iter()
        .map(|m| {
            (
                m.params.unwrap_or(0) as f64,
                m.val_metric.unwrap_or(f64::NAN),
            )
        })
        .collect();
    let answer = analysis::right_size(&pts, spec.tolerance);
    let failed = members.iter().filter(|m| m.error.is_some()).count();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "runs": members,
                "tolerance": spec.tolerance,
                "best": answer.map(|(b, _)| ok[b].run_id.clone()),
                "right_sized": answer.map(|(_, c)| ok[c].run_id.clone()),
                "failed": failed,
                "wall_s": started.elapsed().as_secs_f64(),
            }))?
        );
    } else {
        let mut order: Vec<&Member> = members.iter().collect();
        order.sort_by_key(|m| m.params.unwrap_or(i64::MAX));
        println!(
            "{:<42} {:>7} {:>11} {:>9}  overrides",
            "run", "params", "val loss", "b1 µs"
        );
        for m in order {
            println!(
                "{:<42} {:>7} {:>11} {:>9}  {}",
                m.run_id.as_deref().unwrap_or("FAILED"),
                m.params
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "—".into()),
                m.val_metric
                    .map(|v| format!("{v:.5}"))
                    .unwrap_or_else(|| "—".into()),
                m.latency_b1_p50_us
                    .map(|v| format!("{v:.2}"))
                    .unwrap_or_else(|| "—".into()),
                m.overrides.join(" ")
            );
        }
        match answer {
            Some((b, c)) => println!(
                "\nright-sizing: best validation loss {:.5} by {} ({} parameters); the smallest model within {:.1}% of it is {} with {} parameters (validation loss {:.5}, {:.1}× fewer parameters)",
                pts[b].1,
                ok[b].run_id.as_deref().unwrap_or("?"),
                pts[b].0,
                spec.tolerance * 100.0,
                ok[c].run_id.as_deref().unwrap_or("?"),
                pts[c].0,
                pts[c].1,
                pts[b].0 / pts[c].0.max(1.0)
            ),
            None => println!("\nright-sizing: no run finished"),
        }
        eprintln!(
            "{} runs in {:.1} s, {} failed",
            members.len(),
            started.elapsed().as_secs_f64(),
            failed
        );
    }
    if failed > 0 {
        return Err(CliError::from(anyhow::anyhow!(
            "{failed} of {} sweep runs failed",
            members.len()
        )));
    }
    Ok(())
}
