//! The `kiln runs` reports, over the registry's typed rows: the run table (`list`), one run
//! (`show`), two runs side by side (`compare`), the promotion decisions (`promotions`), the
//! latency regressions (`regressions`, in [`regressions`]) and the HTML report with its
//! figures (`report`, in [`html`]). Each returns the text (or JSON value) the command prints;
//! the CLI opens the registry, calls these and prints.

pub mod html;
pub mod regressions;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::records::EpochRecord;
use crate::records::metrics::{EvalReport, TargetReport};
use crate::registry::{PromotionRow, RunRow};

pub use html::write_report;
pub use regressions::{Attribution, Finding, Regressions, attribute, find_regressions};

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file of the report could not be written or read back.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Profiling a run's model for the attribution failed.
    #[error(transparent)]
    Profile(#[from] crate::bench::BenchError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Which latency the analysis reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyBatch {
    /// Batch-1 median.
    One,
    /// Batch-128 median.
    OneTwentyEight,
}

impl LatencyBatch {
    /// From a batch size (runs record latency at batch 1 and 128 only: `None` otherwise).
    pub fn from_batch(b: usize) -> Option<Self> {
        match b {
            1 => Some(Self::One),
            128 => Some(Self::OneTwentyEight),
            _ => None,
        }
    }

    /// A run's median latency at this batch size.
    pub fn of(self, r: &RunRow) -> Option<f64> {
        match self {
            Self::One => r.latency_b1_p50_us,
            Self::OneTwentyEight => r.latency_b128_p50_us,
        }
    }

    /// The batch size.
    pub fn batch(self) -> usize {
        match self {
            Self::One => 1,
            Self::OneTwentyEight => 128,
        }
    }
}

/// A number with `digits` decimals, `—` when absent.
pub fn short(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "—".into())
}

/// A metric of a stored report with `digits` decimals, `—` for one that was not recorded (JSON
/// has no NaN: a NaN is stored as `null` and reads back as NaN).
fn num(v: f64, digits: usize) -> String {
    short(Some(v).filter(|x| x.is_finite()), digits)
}

/// The first 12 characters of a hash, `none` when there is none.
fn hash_prefix<'a>(h: &'a str, none: &'a str) -> &'a str {
    if h.is_empty() {
        return none;
    }
    // At a character boundary, whatever the text (a hash is ASCII; a hand-made row may not be).
    h.char_indices().nth(12).map_or(h, |(i, _)| &h[..i])
}

/// Mean test NLL of a run's final metrics (the test table's `nll_model` averaged over targets;
/// `None` without a test table or when a target's NLL was not recorded).
pub fn test_nll(r: &RunRow) -> Option<f64> {
    let targets = &r.final_metrics.as_ref()?.test.as_ref()?.targets;
    let v: Vec<f64> = targets
        .iter()
        .map(|t| t.nll_model)
        .filter(|x| x.is_finite())
        .collect();
    (!v.is_empty() && v.len() == targets.len()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// For each run id, the `model vN` labels of the newest promoted version of each model (what a
/// polling server serves) whose candidate came from that run.
pub fn served_by_run(promotions: &[PromotionRow]) -> BTreeMap<String, Vec<String>> {
    let mut newest: BTreeMap<(&str, &str), (i64, &str)> = BTreeMap::new();
    for p in promotions {
        if let (Some(v), Some(run)) = (p.version, p.run_id.as_deref())
            && p.decision == crate::promotion::PromotionDecision::Promoted
        {
            let key = (p.repository.as_str(), p.model.as_str());
            if newest.get(&key).is_none_or(|(old, _)| v > *old) {
                newest.insert(key, (v, run));
            }
        }
    }
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for ((_, model), (v, run)) in newest {
        out.entry(run.to_string())
            .or_default()
            .push(format!("{model} v{v}"));
    }
    out
}

/// A run's summary as `kiln runs list --json` and `compare --json` print it.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary<'a> {
    /// Run id.
    pub id: &'a str,
    /// Config name.
    pub name: &'a str,
    /// Its status.
    pub status: crate::records::RunState,
    /// Why it failed or was killed.
    pub reason: Option<&'a str>,
    /// Start time.
    pub started_at: &'a str,
    /// End time.
    pub ended_at: Option<&'a str>,
    /// Parameter count.
    pub param_count: Option<i64>,
    /// Right-sizing metric.
    pub val_metric: Option<f64>,
    /// Batch-1 median latency, µs.
    pub latency_b1_p50_us: Option<f64>,
    /// Batch-128 median latency, µs.
    pub latency_b128_p50_us: Option<f64>,
    /// Export directory.
    pub artifact_path: Option<&'a str>,
    /// Git commit.
    pub git_commit: Option<&'a str>,
}

impl<'a> RunSummary<'a> {
    /// The summary of a row.
    pub fn of(r: &'a RunRow) -> Self {
        Self {
            id: &r.id,
            name: &r.name,
            status: r.status,
            reason: r.reason.as_deref(),
            started_at: &r.started_at,
            ended_at: r.ended_at.as_deref(),
            param_count: r.param_count,
            val_metric: r.val_metric,
            latency_b1_p50_us: r.latency_b1_p50_us,
            latency_b128_p50_us: r.latency_b128_p50_us,
            artifact_path: r.artifact_path.as_deref(),
            git_commit: r.git_commit.as_deref(),
        }
    }
}

/// One line of `kiln runs list --json`: the summary, the test NLL and what the run serves.
#[derive(Debug, Clone, Serialize)]
pub struct ListEntry<'a> {
    /// The run.
    #[serde(flatten)]
    pub run: RunSummary<'a>,
    /// Mean test NLL ([`test_nll`]).
    pub test_nll: Option<f64>,
    /// The `model vN` versions served from it ([`served_by_run`]).
    pub served: Vec<String>,
}

/// A record as one line of JSON, keys in alphabetical order (as `kiln runs` has always
/// printed them).
fn json_line<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .expect("a report serialises")
        .to_string()
}

/// `kiln runs list --json`: one JSON object per run.
pub fn list_json(rows: &[RunRow], promotions: &[PromotionRow]) -> Vec<String> {
    let served = served_by_run(promotions);
    rows.iter()
        .map(|r| {
            json_line(&ListEntry {
                run: RunSummary::of(r),
                test_nll: test_nll(r),
                served: served.get(&r.id).cloned().unwrap_or_default(),
            })
        })
        .collect()
}

/// `kiln runs list`: one line per run with the test NLL and which model versions it serves.
pub fn list_table(rows: &[RunRow], promotions: &[PromotionRow]) -> String {
    let served = served_by_run(promotions);
    let mut s = format!(
        "{:<40} {:<9} {:>7} {:>10} {:>9} {:>9} {:>10} {:<20} served\n",
        "run", "status", "params", "val loss", "test nll", "b1 µs", "b128 µs", "started"
    );
    for r in rows {
        let _ = writeln!(
            s,
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
    s
}

/// A decision's quality checks and failures, as `kiln runs promotions` summarises them
/// (`mse hr_rate -4.6% · nll +0.0130`, `FAIL latency b1`).
///
/// A night that is not a promotion says so without `FAIL`: a `failed` row its exit code, step
/// and reason (`exit 2 · train failed: …`), a `nothing_to_do` row `exit 4 · nothing to do: …`;
/// a refusal starts with `exit 3`.
pub fn promotion_checks(p: &PromotionRow) -> String {
    use crate::promotion::PromotionDecision as D;
    let exit = p.decision.exit_code(&p.details).unwrap_or(1);
    match p.decision {
        D::Failed => {
            let reason = p.details.reason.as_deref().unwrap_or("no reason recorded");
            let first = reason.lines().next().unwrap_or_default();
            let short: String = first.chars().take(160).collect();
            let more = if short.len() < reason.len() {
                "…"
            } else {
                ""
            };
            return format!(
                "exit {exit} · {} failed: {short}{more}",
                p.details.step.as_deref().unwrap_or("night")
            );
        }
        D::NothingToDo => {
            return format!(
                "exit {exit} · nothing to do: the candidate's weights are the served version's"
            );
        }
        _ => {}
    }
    let checks = quality_and_failed_checks(p);
    if p.decision == D::Refused {
        format!("exit {exit} · {checks}")
    } else {
        checks
    }
}

fn quality_and_failed_checks(p: &PromotionRow) -> String {
    p.details
        .checks
        .iter()
        .filter(|c| !c.passed || c.is_quality())
        .map(|c| {
            format!(
                "{}{} {}",
                if c.passed { "" } else { "FAIL " },
                c.name,
                c.change().unwrap_or_default()
            )
            .trim_end()
            .to_string()
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

/// `kiln runs promotions`: every decision of the gate, oldest first (`registry` names the
/// registry when there is none).
pub fn promotions_table(rows: &[PromotionRow], registry: &Path) -> String {
    if rows.is_empty() {
        return format!(
            "no promotion decisions recorded in {}\n",
            registry.display()
        );
    }
    let mut s = format!(
        "{:>4} {:<20} {:<12} {:<13} {:<9} {:<40} checks\n",
        "id", "at", "model", "decision", "version", "run"
    );
    for p in rows {
        let version = match (p.incumbent_version, p.version) {
            (Some(a), Some(b)) => format!("{a}→{b}"),
            (None, Some(b)) => format!("→{b}"),
            (Some(a), None) => format!("{a}"),
            (None, None) => "—".into(),
        };
        let _ = writeln!(
            s,
            "{:>4} {:<20} {:<12} {:<13} {:<9} {:<40} {}",
            p.id,
            p.at,
            p.model,
            p.decision,
            version,
            p.run_id.as_deref().unwrap_or("—"),
            promotion_checks(p)
        );
    }
    s
}

/// `kiln runs promotions --json`: one JSON object per decision (the row's fields in order,
/// the details' keys in alphabetical order).
pub fn promotions_json(rows: &[PromotionRow]) -> Vec<String> {
    rows.iter()
        .map(|p| serde_json::to_string(p).expect("a promotion serialises"))
        .collect()
}

/// `kiln runs show --json`: the row and its epochs.
pub fn show_json(r: &RunRow, epochs: &[EpochRecord]) -> serde_json::Value {
    #[derive(Serialize)]
    struct Shown<'a> {
        #[serde(flatten)]
        run: &'a RunRow,
        epochs: &'a [EpochRecord],
    }
    serde_json::to_value(Shown { run: r, epochs }).expect("a run serialises")
}

/// `kiln runs show`: one run, its latency, environment, evaluation tables and epochs.
pub fn show_text(r: &RunRow, epochs: &[EpochRecord]) -> String {
    let or_dash = |v: Option<&str>| v.unwrap_or("—").to_string();
    let mut s = String::new();
    let _ = writeln!(s, "run        {}", r.id);
    let _ = writeln!(
        s,
        "status     {}{}",
        r.status,
        r.reason
            .as_ref()
            .map(|x| format!(" ({x})"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        s,
        "started    {}  ended {}",
        r.started_at,
        or_dash(r.ended_at.as_deref())
    );
    let _ = writeln!(s, "host/pid   {} / {}", r.host, r.pid);
    let _ = writeln!(s, "run dir    {}", r.run_dir);
    let _ = writeln!(s, "artifact   {}", or_dash(r.artifact_path.as_deref()));
    let _ = writeln!(s, "git        {}", or_dash(r.git_commit.as_deref()));
    let _ = writeln!(s, "config     sha256 {}", r.config_sha256);
    let _ = writeln!(
        s,
        "dataset    sha256 {}",
        or_dash(r.dataset_sha256.as_deref())
    );
    let _ = writeln!(
        s,
        "params     {}",
        r.param_count
            .map(|p| p.to_string())
            .unwrap_or_else(|| "—".into())
    );
    let _ = writeln!(s, "val loss   {}", short(r.val_metric, 6));
    if let Some(l) = &r.latency {
        let engine = if l.engine.is_empty() { "?" } else { &l.engine };
        for b in &l.batches {
            let _ = writeln!(
                s,
                "latency    {engine} batch {}: p50 {:.2} µs  p95 {:.2} µs  p99 {:.2} µs",
                b.batch, b.p50_us, b.p95_us, b.p99_us
            );
        }
    }
    if let Some(env) = &r.environment {
        let _ = writeln!(s, "env        {}", env.to_json_line());
    }
    if let Some(m) = &r.final_metrics {
        for (split, report) in [("validation", &m.validation), ("test", &m.test)] {
            if let Some(t) = report {
                let _ = writeln!(s, "\n{}", uncertainty_table(split, t));
            }
        }
    }
    let _ = writeln!(
        s,
        "\n{:<10} {:>5} {:>7} {:>11} {:>11} {:>10} {:>9} {:>11} {:>7}",
        "stage", "epoch", "steps", "train", "val", "lr", "|g| mean", "samples/s", "wait %"
    );
    for e in epochs {
        let _ = writeln!(
            s,
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
    s
}

/// Per-target point and uncertainty metrics of one split's report, as a small table (no
/// trailing newline).
pub fn uncertainty_table(split: &str, rep: &EvalReport) -> String {
    let mut s = format!(
        "{split} ({} rows, rows sha256 {})\n{:<12} {:>10} {:>10} {:>8} {:>9} {:>10} {:>23} {:>8} {:>10}",
        rep.rows,
        hash_prefix(&rep.rows_sha256, "—"),
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
    for t in &rep.targets {
        let _ = write!(
            s,
            "\n{:<12} {:>10} {:>10} {:>8} {:>9} {:>10} {:>23} {:>8} {:>10}",
            if t.target.is_empty() { "?" } else { &t.target },
            num(t.rmse_model, 4),
            num(t.mae_model, 4),
            num(t.r2_model, 4),
            num(t.nll_model, 4),
            num(t.crps_model, 4),
            format!(
                "{}/{}/{}/{}",
                num(t.coverage_50, 2),
                num(t.coverage_80, 2),
                num(t.coverage_90, 2),
                num(t.coverage_95, 2)
            ),
            num(t.calibration_error, 3),
            num(t.sharpness, 4),
        );
    }
    s
}

/// A metric of a target's row.
type TargetMetric = fn(&TargetReport) -> f64;

/// The metrics `kiln runs compare` puts side by side, per target.
const COMPARED: [(&str, TargetMetric); 8] = [
    ("rmse_model", |t| t.rmse_model),
    ("mae_model", |t| t.mae_model),
    ("r2_model", |t| t.r2_model),
    ("nll_model", |t| t.nll_model),
    ("crps_model", |t| t.crps_model),
    ("coverage_90", |t| t.coverage_90),
    ("calibration_error", |t| t.calibration_error),
    ("sharpness", |t| t.sharpness),
];

/// The test metrics of two runs side by side — only when both were evaluated on the same rows
/// (the reports' `rows_sha256` agree); otherwise a line saying why they are not compared (no
/// trailing newline).
pub fn compare_evaluation(a: &RunRow, b: &RunRow) -> String {
    fn test(r: &RunRow) -> Option<&EvalReport> {
        r.final_metrics.as_ref()?.test.as_ref()
    }
    let (Some(ta), Some(tb)) = (test(a), test(b)) else {
        return "test metrics: not compared (a run has no test report)".into();
    };
    if ta.rows_sha256 != tb.rows_sha256 || ta.rows_sha256.is_empty() {
        return format!(
            "test metrics: not compared — evaluated on different rows (rows sha256 {} vs {})",
            hash_prefix(&ta.rows_sha256, "unknown"),
            hash_prefix(&tb.rows_sha256, "unknown")
        );
    }
    let mut s = format!(
        "test metrics (same {} rows):\n{:<12} {:<18} {:>12} {:>12}",
        ta.rows, "target", "metric", "A", "B"
    );
    for t in &ta.targets {
        let Some(u) = tb.targets.iter().find(|u| u.target == t.target) else {
            continue;
        };
        let name = if t.target.is_empty() { "?" } else { &t.target };
        for (f, value) in COMPARED {
            let _ = write!(
                s,
                "\n{name:<12} {f:<18} {:>12} {:>12}",
                num(value(t), 5),
                num(value(u), 5)
            );
        }
    }
    s
}

/// A run's effective config as JSON (`null` when its text no longer parses).
pub fn config_value(r: &RunRow) -> serde_json::Value {
    crate::config::parse(&r.config_text, Path::new(&r.run_dir))
        .ok()
        .and_then(|c| serde_json::to_value(c).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// One config difference: `(key, a, b)` with keys in `--set` syntax.
pub type ConfigDifference = (String, String, String);

/// The config differences from run `a` to run `b`.
pub fn config_diff(a: &RunRow, b: &RunRow) -> Vec<ConfigDifference> {
    crate::analysis::config_diff(&config_value(a), &config_value(b))
}

/// `kiln runs compare A B --json`.
pub fn compare_json(a: &RunRow, b: &RunRow) -> serde_json::Value {
    #[derive(Serialize)]
    struct Difference<'a> {
        key: &'a str,
        a: &'a str,
        b: &'a str,
    }
    #[derive(Serialize)]
    struct Compared<'a> {
        a: RunSummary<'a>,
        b: RunSummary<'a>,
        config_diff: Vec<Difference<'a>>,
    }
    let diff = config_diff(a, b);
    serde_json::to_value(Compared {
        a: RunSummary::of(a),
        b: RunSummary::of(b),
        config_diff: diff
            .iter()
            .map(|(key, a, b)| Difference { key, a, b })
            .collect(),
    })
    .expect("a comparison serialises")
}

/// `kiln runs compare A B`: sizes, losses and latencies with their ratios, the test metrics
/// side by side, and the config differences.
pub fn compare_text(a: &RunRow, b: &RunRow) -> String {
    let metric = |r: &RunRow| {
        [
            ("params", r.param_count.map(|p| p as f64)),
            ("val loss", r.val_metric),
            ("latency b1 p50 µs", r.latency_b1_p50_us),
            ("latency b128 p50 µs", r.latency_b128_p50_us),
        ]
    };
    let mut s = format!("A = {}\nB = {}\n\n", a.id, b.id);
    let _ = writeln!(s, "{:<22} {:>14} {:>14} {:>9}", "", "A", "B", "B/A");
    for ((name, x), (_, y)) in metric(a).into_iter().zip(metric(b)) {
        let ratio = match (x, y) {
            (Some(x), Some(y)) if x != 0.0 => format!("{:.3}", y / x),
            _ => "—".into(),
        };
        let _ = writeln!(
            s,
            "{name:<22} {:>14} {:>14} {ratio:>9}",
            short(x, 4),
            short(y, 4)
        );
    }
    let _ = writeln!(s, "\n{}", compare_evaluation(a, b));
    s.push_str("\nconfig differences:\n");
    let diff = config_diff(a, b);
    if diff.is_empty() {
        s.push_str("  (none)\n");
    }
    for (k, x, y) in diff {
        let _ = writeln!(s, "  {k}: {x} → {y}");
    }
    s
}
