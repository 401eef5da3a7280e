//! `kiln runs report`: latency and validation loss against parameter count as figures (each
//! point's hover text names its run, its config difference and its numbers), the calibration
//! of the newest runs, and a table, in one HTML page.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{LatencyBatch, ReportError, config_value, io, short};
use crate::analysis::{self, Flagged, RegressionRule, RunPoint};
use crate::observe::plot::{Color, Figure, Panel, Series};
use crate::records::RunState;
use crate::registry::RunRow;
use crate::util::{escape_xml, write_atomic};

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

/// An SVG file's markup without its XML declaration, for inlining.
fn inline_svg(svg: &Path) -> Result<String, ReportError> {
    let text = std::fs::read_to_string(svg).map_err(io(svg))?;
    Ok(text
        .trim_start_matches(|c| c != '<')
        .split_once("?>")
        .map(|(_, b)| b)
        .unwrap_or(&text)
        .to_string())
}

/// Write the report of `rows` (from the registry shown as `registry`) into `out`: the two
/// figures (SVG and PNG), the calibration figures of the newest runs, and `report.html`.
/// Returns the files written, the page last.
pub fn write_report(
    rows: &[RunRow],
    registry: &str,
    out: &Path,
    which: LatencyBatch,
) -> Result<Vec<PathBuf>, ReportError> {
    let pts = super::regressions::points(rows, which);
    let flagged = analysis::detect(&pts, &RegressionRule::default());
    let flag_of = |id: &str| flagged.iter().find(|f| f.id == id);
    let is_flagged = |id: &str| flag_of(id).is_some();
    let notes = RunNotes::new(rows);
    std::fs::create_dir_all(out).map_err(io(out))?;

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
    let lat_stem = out.join("latency_vs_params");
    let (lat_svg, lat_png) = lat.save(&lat_stem).map_err(io(&lat_stem))?;

    let finished: Vec<(usize, (f64, f64))> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match (r.status, r.param_count, r.val_metric) {
            (RunState::Finished, Some(p), Some(v)) => Some((i, (p as f64, v))),
            _ => None,
        })
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
    let m_stem = out.join("metric_vs_params");
    let (m_svg, m_png) = metric.save(&m_stem).map_err(io(&m_stem))?;

    let mut html = String::new();
    html.push_str("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>kiln runs report</title>\n<style>body{font-family:sans-serif;margin:24px}table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}tr.flag{background:#fde2e2}</style></head><body>\n");
    let _ = writeln!(
        html,
        "<h1>kiln runs report</h1><p>{} runs in {}; {} flagged as latency regressions (≥ 1.5× the median of runs within ±5 % of their size). Hover over a point for its run, config and numbers.</p>",
        rows.len(),
        escape_xml(registry),
        flagged.len()
    );
    for svg in [&lat_svg, &m_svg] {
        html.push_str("<div>");
        html.push_str(&inline_svg(svg)?);
        html.push_str("</div>\n");
    }
    let calibration = calibration_section(rows, out)?;
    html.push_str("<table><tr><th>run</th><th>status</th><th>params</th><th>val loss</th><th>b1 p50 µs</th><th>b128 p50 µs</th><th>flag</th>");
    for k in &notes.varying {
        let _ = write!(html, "<th>{}</th>", escape_xml(k));
    }
    html.push_str("</tr>\n");
    for (i, r) in rows.iter().enumerate() {
        let f = is_flagged(&r.id);
        let _ = write!(
            html,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            if f { " class=\"flag\"" } else { "" },
            escape_xml(&r.id),
            escape_xml(r.status.as_str()),
            r.param_count.map(|p| p.to_string()).unwrap_or_default(),
            short(r.val_metric, 5),
            short(r.latency_b1_p50_us, 2),
            short(r.latency_b128_p50_us, 1),
            if f { "regression" } else { "" }
        );
        for k in &notes.varying {
            let _ = write!(html, "<td>{}</td>", escape_xml(&notes.value(i, k)));
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</table>\n");
    html.push_str(&calibration.0);
    html.push_str("</body></html>\n");
    let page = out.join("report.html");
    write_atomic(&page, html.as_bytes()).map_err(io(&page))?;
    let mut files = vec![lat_svg, lat_png, m_svg, m_png];
    files.extend(calibration.1);
    files.push(page);
    Ok(files)
}

/// Runs whose calibration the report draws: the newest with a test report.
const CALIBRATION_RUNS: usize = 5;

/// The report's calibration section: for the newest runs with a test report that has a
/// reliability curve, each target's reliability diagram and PIT histogram, drawn from the
/// registry's metrics into `out/calibration/<run>/` and inlined. Returns the HTML and the
/// files written.
fn calibration_section(rows: &[RunRow], out: &Path) -> Result<(String, Vec<PathBuf>), ReportError> {
    use crate::observe::calibration::write_figures;
    let mut html = String::new();
    let mut files = Vec::new();
    let with_data: Vec<(&RunRow, &crate::records::metrics::EvalReport)> = rows
        .iter()
        .filter_map(|r| Some((r, r.final_metrics.as_ref()?.test.as_ref()?)))
        .filter(|(_, t)| {
            t.targets
                .first()
                .is_some_and(|t| !t.coverage_curve.is_empty())
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
    for (r, rep) in newest.iter().rev() {
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
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let written = write_figures(&dir, "test", &rep.calibration_data()).map_err(io(&dir))?;
        let _ = writeln!(html, "<h3>{}</h3><div>", escape_xml(&r.id));
        for svg in written
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "svg"))
        {
            html.push_str("<span style=\"display:inline-block\">");
            html.push_str(&inline_svg(svg)?);
            html.push_str("</span>");
        }
        html.push_str("</div>\n");
        files.extend(written);
    }
    Ok((html, files))
}
