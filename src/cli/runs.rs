//! `kiln runs list | show | compare | report | regressions`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{CliError, CliResult};
use kiln::config;
use kiln::observe::plot::{Color, Figure, Panel, Series};
use kiln::track::analysis::{self, Flagged, RegressionRule, RunPoint};
use kiln::track::registry::{Location, Registry, RunRow};
use kiln::util::write_atomic;

/// Which latency the analysis reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyBatch {
    /// Batch-1 median.
    One,
    /// Batch-128 median.
    OneTwentyEight,
}

impl LatencyBatch {
    /// From a batch size given on the command line.
    pub fn from_batch(b: usize) -> Result<Self, CliError> {
        match b {
            1 => Ok(Self::One),
            128 => Ok(Self::OneTwentyEight),
            other => Err(CliError::input(anyhow::anyhow!(
                "--batch {other}: runs record latency at batch 1 and 128 only"
            ))),
        }
    }

    fn of(self, r: &RunRow) -> Option<f64> {
        match self {
            Self::One => r.latency_b1_p50_us,
            Self::OneTwentyEight => r.latency_b128_p50_us,
        }
    }

    fn batch(self) -> usize {
        match self {
            Self::One => 1,
            Self::OneTwentyEight => 128,
        }
    }
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

fn short(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "—".into())
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

/// Mean test NLL of a run's final metrics (the test table's `nll_model` averaged over targets).
fn test_nll(r: &RunRow) -> Option<f64> {
    let targets = r.final_metrics.as_ref()?["test"]["targets"]
        .as_array()?
        .clone();
    let v: Vec<f64> = targets
        .iter()
        .filter_map(|t| t["nll_model"].as_f64())
        .collect();
    (!v.is_empty() && v.len() == targets.len()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// For each run id, the `model vN` labels of the newest promoted version of each model (what a
/// polling server serves) whose candidate came from that run.
fn served_by_run(reg: &Registry) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut newest: std::collections::BTreeMap<(String, String), (i64, String)> =
        Default::default();
    for p in reg.promotions(None).unwrap_or_default() {
        if let (Some(v), Some(run)) = (p.version, p.run_id.clone())
            && p.decision == "promoted"
        {
            let key = (p.repository.clone(), p.model.clone());
            if newest.get(&key).is_none_or(|(old, _)| v > *old) {
                newest.insert(key, (v, run));
            }
        }
    }
    let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for ((_, model), (v, run)) in newest {
        out.entry(run).or_default().push(format!("{model} v{v}"));
    }
    out
}

/// `kiln runs list` (with the test NLL and which model versions each run is serving).
pub fn list(registry: &Path, json: bool) -> CliResult {
    let reg = open(registry)?;
    let rows = reg.list()?;
    let served = served_by_run(&reg);
    if json {
        for r in &rows {
            let mut v = summary(r);
            v["test_nll"] = serde_json::json!(test_nll(r));
            v["served"] = serde_json::json!(served.get(&r.id).cloned().unwrap_or_default());
            println!("{}", serde_json::to_string(&v)?);
        }
        return Ok(());
    }
    println!(
        "{:<40} {:<9} {:>7} {:>10} {:>9} {:>9} {:>10} {:<20} served",
        "run", "status", "params", "val loss", "test nll", "b1 µs", "b128 µs", "started"
    );
    for r in &rows {
        println!(
            "{:<40} {:<9} {:>7} {:>10} {:>9} {:>9} {:>10} {:<20} {}",
            r.id,
            r.status,
            r.param_count
                .map(|p| p.to_string())
                .unwrap_or_else(|| "—".into()),
            short(r.val_metric, 5),
            short(test_nll(r), 4),
            short(r.latency_b1_p50_us, 2),
            short(r.latency_b128_p50_us, 1),
            r.started_at,
            served.get(&r.id).map(|v| v.join(", ")).unwrap_or_default()
        );
    }
    Ok(())
}

/// `kiln runs promotions`: every decision of the gate, oldest first.
pub fn promotions(registry: &Path, model: Option<&str>, json: bool) -> CliResult {
    let reg = open(registry)?;
    let rows = reg.promotions(model)?;
    if json {
        for p in &rows {
            println!("{}", serde_json::to_string(p)?);
        }
        return Ok(());
    }
    if rows.is_empty() {
        println!("no promotion decisions recorded in {}", registry.display());
        return Ok(());
    }
    println!(
        "{:>4} {:<20} {:<12} {:<13} {:<9} {:<40} checks",
        "id", "at", "model", "decision", "version", "run"
    );
    for p in &rows {
        let version = match (p.incumbent_version, p.version) {
            (Some(a), Some(b)) => format!("{a}→{b}"),
            (None, Some(b)) => format!("→{b}"),
            (Some(a), None) => format!("{a}"),
            (None, None) => "—".into(),
        };
        let checks: Vec<String> = p.details["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| {
                c["passed"] == false
                    || c["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("mse ") || n == "nll")
            })
            .map(|c| {
                let (cand, inc) = (c["candidate"].as_f64(), c["incumbent"].as_f64());
                let change = match (cand, inc) {
                    (Some(a), Some(b)) if c["name"] == "nll" => format!("{:+.4}", a - b),
                    (Some(a), Some(b)) if b != 0.0 => format!("{:+.1}%", (a / b - 1.0) * 100.0),
                    _ => String::new(),
                };
                format!(
                    "{}{} {}",
                    if c["passed"] == false { "FAIL " } else { "" },
                    c["name"].as_str().unwrap_or("?"),
                    change
                )
                .trim_end()
                .to_string()
            })
            .collect();
        println!(
            "{:>4} {:<20} {:<12} {:<13} {:<9} {:<40} {}",
            p.id,
            p.at,
            p.model,
            p.decision,
            version,
            p.run_id.clone().unwrap_or_else(|| "—".into()),
            checks.join(" · ")
        );
    }
    Ok(())
}

fn summary(r: &RunRow) -> serde_json::Value {
    serde_json::json!({
        "id": r.id, "name": r.name, "status": r.status, "reason": r.reason,
        "started_at": r.started_at, "ended_at": r.ended_at, "param_count": r.param_count,
        "val_metric": r.val_metric, "latency_b1_p50_us": r.latency_b1_p50_us,
        "latency_b128_p50_us": r.latency_b128_p50_us, "artifact_path": r.artifact_path,
        "git_commit": r.git_commit,
    })
}

/// `kiln runs show ID`.
pub fn show(registry: &Path, id: &str, json: bool) -> CliResult {
    let reg = open(registry)?;
    let r = reg.get(id).map_err(CliError::input)?;
    let epochs = reg.epochs(&r.id)?;
    if json {
        let mut v = serde_json::to_value(&r)?;
        v["epochs"] = serde_json::to_value(&epochs)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("run        {}", r.id);
    println!(
        "status     {}{}",
        r.status,
        r.reason
            .as_ref()
            .map(|x| format!(" ({x})"))
            .unwrap_or_default()
    );
    println!(
        "started    {}  ended {}",
        r.started_at,
        r.ended_at.clone().unwrap_or_else(|| "—".into())
    );
    println!("host/pid   {} / {}", r.host, r.pid);
    println!("run dir    {}", r.run_dir);
    println!(
        "artifact   {}",
        r.artifact_path.clone().unwrap_or_else(|| "—".into())
    );
    println!(
        "git        {}",
        r.git_commit.clone().unwrap_or_else(|| "—".into())
    );
    println!("config     sha256 {}", r.config_sha256);
    println!(
        "dataset    sha256 {}",
        r.dataset_sha256.clone().unwrap_or_else(|| "—".into())
    );
    println!(
        "params     {}",
        r.param_count
            .map(|p| p.to_string())
            .unwrap_or_else(|| "—".into())
    );
    println!("val loss   {}", short(r.val_metric, 6));
    if let Some(l) = &r.latency {
        for b in l["batches"].as_array().into_iter().flatten() {
            println!(
                "latency    {} batch {}: p50 {:.2} µs  p95 {:.2} µs  p99 {:.2} µs",
                l["engine"].as_str().unwrap_or("?"),
                b["batch"],
                b["p50_us"].as_f64().unwrap_or(f64::NAN),
                b["p95_us"].as_f64().unwrap_or(f64::NAN),
                b["p99_us"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    if let Some(env) = &r.environment {
        println!("env        {env}");
    }
    for split in ["validation", "test"] {
        if let Some(t) = split_metrics(&r, split) {
            println!("\n{}", uncertainty_lines(split, t));
        }
    }
    println!(
        "\n{:<10} {:>5} {:>7} {:>11} {:>11} {:>10} {:>9} {:>11} {:>7}",
        "stage", "epoch", "steps", "train", "val", "lr", "|g| mean", "samples/s", "wait %"
    );
    for e in &epochs {
        println!(
            "{:<10} {:>5} {:>7} {:>11.5} {:>11.5} {:>10.2e} {:>9.3} {:>11.0} {:>6.1}%",
            e.stage_name,
            e.epoch + 1,
            e.steps,
            e.train_loss,
            e.val_loss,
            e.lr,
            e.grad_norm_mean,
            e.samples_per_s,
            e.data_wait_frac * 100.0
        );
    }
    Ok(())
}

/// The evaluation report of `split` in a run's final metrics.
fn split_metrics<'a>(r: &'a RunRow, split: &str) -> Option<&'a serde_json::Value> {
    r.final_metrics
        .as_ref()
        .map(|m| &m[split])
        .filter(|t| t["targets"].is_array())
}

fn num(v: &serde_json::Value, digits: usize) -> String {
    v.as_f64()
        .map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "—".into())
}

/// Per-target point and uncertainty metrics of one split's report, as a small table.
fn uncertainty_lines(split: &str, rep: &serde_json::Value) -> String {
    let mut s = format!(
        "{split} ({} rows, rows sha256 {})\n{:<12} {:>10} {:>10} {:>8} {:>9} {:>10} {:>23} {:>8} {:>10}",
        rep["rows"],
        rep["rows_sha256"]
            .as_str()
            .map(|h| &h[..h.len().min(12)])
            .unwrap_or("—"),
        "target",
        "rmse",
        "mae",
        "r2",
        "nll",
        "crps",
        "coverage 50/80/90/95",
        "cal.err",
        "sharpness"
    );
    for t in rep["targets"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "\n{:<12} {:>10} {:>10} {:>8} {:>9} {:>10} {:>23} {:>8} {:>10}",
            t["target"].as_str().unwrap_or("?"),
            num(&t["rmse_model"], 4),
            num(&t["mae_model"], 4),
            num(&t["r2_model"], 4),
            num(&t["nll_model"], 4),
            num(&t["crps_model"], 4),
            format!(
                "{}/{}/{}/{}",
                num(&t["coverage_50"], 2),
                num(&t["coverage_80"], 2),
                num(&t["coverage_90"], 2),
                num(&t["coverage_95"], 2)
            ),
            num(&t["calibration_error"], 3),
            num(&t["sharpness"], 4),
        ));
    }
    s
}

/// The test metrics of two runs side by side — only when both were evaluated on the same rows
/// (the reports' `rows_sha256` agree); otherwise a line saying why they are not compared.
fn compare_evaluation(a: &RunRow, b: &RunRow) -> String {
    let (Some(ta), Some(tb)) = (split_metrics(a, "test"), split_metrics(b, "test")) else {
        return "test metrics: not compared (a run has no test report)".into();
    };
    let (ha, hb) = (ta["rows_sha256"].as_str(), tb["rows_sha256"].as_str());
    match (ha, hb) {
        (Some(x), Some(y)) if x == y && !x.is_empty() => {}
        _ => {
            return format!(
                "test metrics: not compared — evaluated on different rows (rows sha256 {} vs {})",
                ha.map(|h| &h[..h.len().min(12)]).unwrap_or("unknown"),
                hb.map(|h| &h[..h.len().min(12)]).unwrap_or("unknown")
            );
        }
    }
    let mut s = format!(
        "test metrics (same {} rows):\n{:<12} {:<18} {:>12} {:>12}",
        ta["rows"], "target", "metric", "A", "B"
    );
    let tb_targets = tb["targets"].as_array().cloned().unwrap_or_default();
    for t in ta["targets"].as_array().into_iter().flatten() {
        let name = t["target"].as_str().unwrap_or("?");
        let Some(u) = tb_targets.iter().find(|u| u["target"] == t["target"]) else {
            continue;
        };
        for f in [
            "rmse_model",
            "mae_model",
            "r2_model",
            "nll_model",
            "crps_model",
            "coverage_90",
            "calibration_error",
            "sharpness",
        ] {
            s.push_str(&format!(
                "\n{name:<12} {f:<18} {:>12} {:>12}",
                num(&t[f], 5),
                num(&u[f], 5)
            ));
        }
    }
    s
}

fn config_value(r: &RunRow) -> serde_json::Value {
    config::parse(&r.config_text, Path::new(&r.run_dir))
        .ok()
        .and_then(|c| serde_json::to_value(c).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// `kiln runs compare A B`.
pub fn compare(registry: &Path, a: &str, b: &str, json: bool) -> CliResult {
    let reg = open(registry)?;
    let (ra, rb) = (
        reg.get(a).map_err(CliError::input)?,
        reg.get(b).map_err(CliError::input)?,
    );
    let diff = analysis::config_diff(&config_value(&ra), &config_value(&rb));
    let metric = |r: &RunRow| {
        [
            ("params", r.param_count.map(|p| p as f64)),
            ("val loss", r.val_metric),
            ("latency b1 p50 µs", r.latency_b1_p50_us),
            ("latency b128 p50 µs", r.latency_b128_p50_us),
        ]
    };
    if json {
        let v = serde_json::json!({
            "a": summary(&ra),
            "b": summary(&rb),
            "config_diff": diff.iter().map(|(k, x, y)| serde_json::json!({"key": k, "a": x, "b": y})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("A = {}\nB = {}\n", ra.id, rb.id);
    println!("{:<22} {:>14} {:>14} {:>9}", "", "A", "B", "B/A");
    for ((name, x), (_, y)) in metric(&ra).into_iter().zip(metric(&rb)) {
        let ratio = match (x, y) {
            (Some(x), Some(y)) if x != 0.0 => format!("{:.3}", y / x),
            _ => "—".into(),
        };
        println!(
            "{name:<22} {:>14} {:>14} {ratio:>9}",
            short(x, 4),
            short(y, 4)
        );
    }
    println!("\n{}", compare_evaluation(&ra, &rb));
    println!("\nconfig differences:");
    if diff.is_empty() {
        println!("  (none)");
    }
    for (k, x, y) in diff {
        println!("  {k}: {x} → {y}");
    }
    Ok(())
}

fn points(rows: &[RunRow], which: LatencyBatch) -> Vec<RunPoint> {
    rows.iter()
        .filter(|r| r.status == "finished")
        .filter_map(|r| {
            Some(RunPoint {
                id: r.id.clone(),
                params: r.param_count? as f64,
                latency_us: which.of(r)?,
            })
        })
        .collect()
}

/// What the report says about each run: its config values for the keys that vary across
/// runs, and its hover text.
struct RunNotes<'a> {
    rows: &'a [RunRow],
    /// Config keys whose values differ between runs.
    varying: Vec<String>,
    /// Each run's flattened config, by position in `rows`.
    configs: Vec<std::collections::BTreeMap<String, String>>,
}

impl<'a> RunNotes<'a> {
    fn new(rows: &'a [RunRow]) -> Self {
        let configs: Vec<_> = rows
            .iter()
            .map(|r| analysis::config_values(&config_value(r)))
            .collect();
        let varying = analysis::varying_keys(&configs);
        Self {
            rows,
            varying,
            configs,
        }
    }

    fn index(&self, id: &str) -> Option<usize> {
        self.rows.iter().position(|r| r.id == id)
    }

    /// `key=value` for the varying keys.
    fn difference(&self, i: usize) -> String {
        if self.varying.is_empty() {
            return "same config as every other run".into();
        }
        self.varying
            .iter()
            .map(|k| format!("{k}={}", self.value(i, k)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn value(&self, i: usize, key: &str) -> String {
        self.configs[i]
            .get(key)
            .cloned()
            .unwrap_or_else(|| "—".into())
    }

    /// Hover text of one run: id, config difference, latency, loss (and the flag).
    fn tip(&self, i: usize, which: LatencyBatch, flag: Option<&Flagged>) -> String {
        let r = &self.rows[i];
        let mut t = format!(
            "{}\nconfig: {}\nlatency b{} p50: {} µs\nval loss: {}\nparams: {}",
            r.id,
            self.difference(i),
            which.batch(),
            short(which.of(r), 2),
            short(r.val_metric, 5),
            r.param_count
                .map(|p| p.to_string())
                .unwrap_or_else(|| "—".into())
        );
        if let Some(f) = flag {
            let _ = write!(
                t,
                "\nFLAGGED: {:.2}× the median ({:.2} µs) of {} runs of similar size",
                f.ratio, f.peer_median_us, f.peers
            );
        }
        t
    }
}

/// One scatter series of a report chart: identical points drawn once, labelled `×N`
/// (flagged runs by their id), each with the hover text of every run it holds.
fn report_series(
    name: &str,
    color: Color,
    radius: f64,
    runs: &[(usize, (f64, f64))],
    tip: &dyn Fn(usize) -> String,
    label: &dyn Fn(usize) -> Option<String>,
) -> Series {
    let pts: Vec<(f64, f64)> = runs.iter().map(|(_, p)| *p).collect();
    let groups = analysis::group_identical(&pts);
    let mut points = Vec::with_capacity(groups.len());
    let (mut tips, mut labels) = (Vec::new(), Vec::new());
    for (p, members) in groups {
        let idx: Vec<usize> = members.iter().map(|&m| runs[m].0).collect();
        points.push(p);
        let mut t = idx.iter().map(|&i| tip(i)).collect::<Vec<_>>().join("\n\n");
        let mut l: Vec<String> = idx.iter().filter_map(|&i| label(i)).collect();
        if idx.len() > 1 {
            t = format!("{} identical runs at this point:\n\n{t}", idx.len());
            l.push(format!("×{}", idx.len()));
        }
        tips.push(t);
        labels.push(l.join(" "));
    }
    Series::scatter(name, color, points)
        .radius(radius)
        .tips(tips)
        .labels(labels)
}

/// `kiln runs report`: figures and an HTML page.
pub fn report(registry: &Path, out: &Path, which: LatencyBatch) -> CliResult {
    let reg = open(registry)?;
    let rows = reg.list()?;
    let pts = points(&rows, which);
    let flagged = analysis::detect(&pts, &RegressionRule::default());
    let flag_of = |id: &str| flagged.iter().find(|f| f.id == id);
    let is_flagged = |id: &str| flag_of(id).is_some();
    let notes = RunNotes::new(&rows);
    std::fs::create_dir_all(out)?;

    let tip = |i: usize| notes.tip(i, which, flag_of(&rows[i].id));
    let label = |i: usize| is_flagged(&rows[i].id).then(|| rows[i].id.clone());
    let no_label = |_: usize| None;
    let located = |p: &RunPoint| notes.index(&p.id).map(|i| (i, (p.params, p.latency_us)));
    let normal: Vec<(usize, (f64, f64))> = pts
        .iter()
        .filter(|p| !is_flagged(&p.id))
        .filter_map(located)
        .collect();
    let slow: Vec<(usize, (f64, f64))> = pts
        .iter()
        .filter(|p| is_flagged(&p.id))
        .filter_map(located)
        .collect();
    // One slow outlier would squeeze every other run into a line: log scale past 10×.
    let latencies: Vec<f64> = pts.iter().map(|p| p.latency_us).collect();
    let log_latency = analysis::spans_a_decade(&latencies);
    let lat = Figure::new(
        format!(
            "Median inference latency (batch {}) vs parameter count, {} runs",
            which.batch(),
            pts.len()
        ),
        960,
        600,
    )
    .panel(
        Panel::new(
            "",
            "parameters",
            if log_latency {
                "p50 latency (µs, log scale)"
            } else {
                "p50 latency (µs)"
            },
        )
        .log_y(log_latency)
        .series(report_series(
            "runs",
            Color::BLUE,
            4.0,
            &normal,
            &tip,
            &no_label,
        ))
        .series(report_series(
            "flagged regression",
            Color::RED,
            5.0,
            &slow,
            &tip,
            &label,
        )),
    );
    let (lat_svg, lat_png) = lat.save(&out.join("latency_vs_params"))?;

    let finished: Vec<(usize, (f64, f64))> = rows
        .iter()
        .enumerate()
        .filter_map(
            |(i, r)| match (r.status.as_str(), r.param_count, r.val_metric) {
                ("finished", Some(p), Some(v)) => Some((i, (p as f64, v))),
                _ => None,
            },
        )
        .collect();
    let mp: Vec<(f64, f64)> = finished.iter().map(|(_, p)| *p).collect();
    let front = analysis::pareto_front(&mp);
    let metric = Figure::new(
        format!(
            "Validation loss vs parameter count, {} runs (Pareto front marked)",
            mp.len()
        ),
        960,
        600,
    )
    .panel(
        Panel::new(
            "",
            "parameters",
            "validation loss (stage 1, normalised MSE)",
        )
        .series(report_series(
            "runs",
            Color::BLUE,
            4.0,
            &finished,
            &tip,
            &label,
        ))
        .series(Series::step(
            "Pareto front",
            Color::GREEN,
            front.iter().map(|&i| mp[i]).collect(),
        ))
        .series(
            Series::scatter("", Color::GREEN, front.iter().map(|&i| mp[i]).collect())
                .radius(5.0)
                .tips(front.iter().map(|&i| tip(finished[i].0)).collect()),
        ),
    );
    let (m_svg, m_png) = metric.save(&out.join("metric_vs_params"))?;

    let mut html = String::new();
    html.push_str("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>kiln runs report</title>\n<style>body{font-family:sans-serif;margin:24px}table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}tr.flag{background:#fde2e2}</style></head><body>\n");
    let _ = writeln!(
        html,
        "<h1>kiln runs report</h1><p>{} runs in {}; {} flagged as latency regressions (≥ 1.5× the median of runs within ±5 % of their size). Hover over a point for its run, config and numbers.</p>",
        rows.len(),
        kiln::util::escape_xml(&Location::from_path(registry).display()),
        flagged.len()
    );
    for svg in [&lat_svg, &m_svg] {
        let text = std::fs::read_to_string(svg)?;
        html.push_str("<div>");
        html.push_str(
            text.trim_start_matches(|c| c != '<')
                .split_once("?>")
                .map(|(_, b)| b)
                .unwrap_or(&text),
        );
        html.push_str("</div>\n");
    }
    let calibration = calibration_section(&rows, out)?;
    html.push_str("<table><tr><th>run</th><th>status</th><th>params</th><th>val loss</th><th>b1 p50 µs</th><th>b128 p50 µs</th><th>flag</th>");
    for k in &notes.varying {
        let _ = write!(html, "<th>{}</th>", kiln::util::escape_xml(k));
    }
    html.push_str("</tr>\n");
    for (i, r) in rows.iter().enumerate() {
        let f = is_flagged(&r.id);
        let _ = write!(
            html,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            if f { " class=\"flag\"" } else { "" },
            kiln::util::escape_xml(&r.id),
            kiln::util::escape_xml(&r.status),
            r.param_count.map(|p| p.to_string()).unwrap_or_default(),
            short(r.val_metric, 5),
            short(r.latency_b1_p50_us, 2),
            short(r.latency_b128_p50_us, 1),
            if f { "regression" } else { "" }
        );
        for k in &notes.varying {
            let _ = write!(
                html,
                "<td>{}</td>",
                kiln::util::escape_xml(&notes.value(i, k))
            );
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</table>\n");
    html.push_str(&calibration.0);
    html.push_str("</body></html>\n");
    let page = out.join("report.html");
    write_atomic(&page, html.as_bytes())?;
    for p in [&lat_svg, &lat_png, &m_svg, &m_png]
        .into_iter()
        .chain(&calibration.1)
        .chain([&page])
    {
        println!("{}", p.display());
    }
    Ok(())
}

/// Runs whose calibration the report draws: the newest with a test report.
const CALIBRATION_RUNS: usize = 5;

/// The report's calibration section: for the newest finished runs with a test report, each
/// target's reliability diagram and PIT histogram, drawn from the registry's metrics into
/// `out/calibration/<run>/` and inlined. Returns the HTML and the files written.
fn calibration_section(rows: &[RunRow], out: &Path) -> Result<(String, Vec<PathBuf>), CliError> {
    use kiln::observe::calibration::{TargetCalibration, write_figures};
    let mut html = String::new();
    let mut files = Vec::new();
    let with_data: Vec<&RunRow> = rows
        .iter()
        .filter(|r| {
            split_metrics(r, "test").is_some_and(|t| {
                t["targets"][0]["coverage_curve"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty())
            })
        })
        .collect();
    let newest = &with_data[with_data.len().saturating_sub(CALIBRATION_RUNS)..];
    if newest.is_empty() {
        return Ok((html, files));
    }
    let _ = writeln!(
        html,
        "<h2>Calibration of the uncertainty head (test split)</h2><p>Per target: central-interval coverage against nominal (the diagonal is perfect) and the PIT histogram (flat at 1 is calibrated; ∪ means σ too small, ∩ too large). The newest {} runs with a test report.</p>",
        newest.len()
    );
    for r in newest.iter().rev() {
        let rep = split_metrics(r, "test").expect("filtered above");
        let data: Vec<TargetCalibration> = rep["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| TargetCalibration {
                target: t["target"].as_str().unwrap_or("?").to_string(),
                coverage: serde_json::from_value(t["coverage_curve"].clone()).unwrap_or_default(),
                pit_histogram: serde_json::from_value(t["pit_histogram"].clone())
                    .unwrap_or_default(),
            })
            .collect();
        let safe: String =
            r.id.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
        let dir = out.join("calibration").join(safe);
        std::fs::create_dir_all(&dir)?;
        let written = write_figures(&dir, "test", &data)?;
        let _ = writeln!(html, "<h3>{}</h3><div>", kiln::util::escape_xml(&r.id));
        for svg in written
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "svg"))
        {
            let text = std::fs::read_to_string(svg)?;
            html.push_str("<span style=\"display:inline-block\">");
            html.push_str(
                text.trim_start_matches(|c| c != '<')
                    .split_once("?>")
                    .map(|(_, b)| b)
                    .unwrap_or(&text),
            );
            html.push_str("</span>");
        }
        html.push_str("</div>\n");
        files.extend(written);
    }
    Ok((html, files))
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
    let pts = points(&rows, args.which);
    let flagged = analysis::detect(&pts, &args.rule);
    let by_id = |id: &str| rows.iter().find(|r| r.id == id);
    for f in &flagged {
        let peer = f.nearest_normal_peer.as_deref().and_then(by_id);
        let diff = match (by_id(&f.id), peer) {
            (Some(a), Some(b)) => analysis::config_diff(&config_value(b), &config_value(a)),
            _ => Vec::new(),
        };
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "flagged": f,
                    "config_diff_from_peer": diff.iter().map(|(k, x, y)| serde_json::json!({"key": k, "peer": x, "flagged": y})).collect::<Vec<_>>(),
                })
            );
        } else {
            print_flag(f, &diff);
        }
        if args.attribute
            && let (Some(a), Some(b)) = (by_id(&f.id), peer)
        {
            attribute(a, b, args)?;
        }
    }
    if !args.json {
        eprintln!(
            "{} run(s) with latency at batch {}; {} flagged (rule: ≥ {:.2}× and ≥ {} µs above the median of ≥ {} runs within ±{:.0}% of their parameter count)",
            pts.len(),
            args.which.batch(),
            flagged.len(),
            args.rule.ratio,
            args.rule.min_delta_us,
            args.rule.min_peers,
            args.rule.size_tolerance * 100.0
        );
    }
    if flagged.is_empty() {
        Ok(())
    } else {
        Err(CliError {
            code: 3,
            error: anyhow::anyhow!("{} latency regression(s) found", flagged.len()),
        })
    }
}

fn print_flag(f: &Flagged, diff: &[(String, String, String)]) {
    println!(
        "REGRESSION {}: {:.2} µs at {:.0} parameters = {:.2}× the median ({:.2} µs) of {} runs of similar size",
        f.id, f.latency_us, f.params, f.ratio, f.peer_median_us, f.peers
    );
    match &f.nearest_normal_peer {
        Some(p) => {
            println!("  nearest normal peer: {p}");
            if diff.is_empty() {
                println!("  config difference: none (same config — suspect the machine or build)");
            }
            for (k, x, y) in diff {
                println!("  config difference: {k}: {x} (peer) → {y} (flagged)");
            }
        }
        None => println!("  no unflagged peer of similar size"),
    }
}

fn attribute(slow: &RunRow, peer: &RunRow, args: &RegressionArgs<'_>) -> CliResult {
    // Each run is profiled on the engine its latency was measured on: when the engines
    // differ, that difference is part of what the table has to explain.
    let engine_of = |r: &RunRow| {
        r.latency
            .as_ref()
            .and_then(|l| l["engine"].as_str().map(String::from))
            .unwrap_or_else(|| kiln::bench::latency::serving_engine().into())
    };
    let engines = [engine_of(peer), engine_of(slow)];
    let mut tables = Vec::new();
    for ((label, r), engine) in [("peer", peer), ("flagged", slow)]
        .into_iter()
        .zip(&engines)
    {
        let Some(artifact) = &r.artifact_path else {
            eprintln!("  cannot attribute: {} has no artifact", r.id);
            return Ok(());
        };
        let o = kiln::bench::profile::profile_infer(&kiln::bench::profile::ProfileInferOptions {
            checkpoint: Some(PathBuf::from(artifact)),
            engine: engine.clone(),
            batch: args.which.batch(),
            iters: 2000,
            warmup: 200,
            threads: 1,
            out: args.out.join(format!("{}-{label}", slow.id)),
            seed: 0,
            record_shapes: false,
            profile_memory: false,
            with_stack: false,
        })
        .map_err(CliError::from)?;
        tables.push(o.averages);
    }
    let rows = kiln::observe::profiler::diff(&tables[0], &tables[1]);
    let engines = if engines[0] == engines[1] {
        engines[0].clone()
    } else {
        format!("A on {}, B on {}", engines[0], engines[1])
    };
    println!(
        "  attribution ({engines}, batch {}, identical inputs; A = peer, B = flagged):",
        args.which.batch()
    );
    for line in kiln::observe::profiler::diff_table(&rows).lines().take(12) {
        println!("    {line}");
    }
    Ok(())
}
