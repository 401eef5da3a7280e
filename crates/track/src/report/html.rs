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
    html.push_str(&"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>kiln runs report</title>\n<style>body{font-family:sans-serif;margin:24px}table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}tr.flag{background:#fde2e2}div.runs{max-width:{TABLE_MAX_WIDTH_PX}px;overflow-x:auto}table.runs td,table.runs th{overflow-wrap:anywhere}td.other{text-align:left;font-size:90%}table.cal td,table.cal th{padding:1px 6px}</style></head><body>\n".replace("{TABLE_MAX_WIDTH_PX}", &TABLE_MAX_WIDTH_PX.to_string()));
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
    // The config columns: the first few varying keys each get one (abbreviated header and
    // values, the full text on hover); the rest share one wrapped column.
    let (own, rest) = notes
        .varying
        .split_at(notes.varying.len().min(CONFIG_COLUMNS));
    html.push_str("<div class=\"runs\"><table class=\"runs\"><tr><th>run</th><th>status</th><th>params</th><th>val loss</th><th>b1 p50 µs</th><th>b128 p50 µs</th><th>flag</th>");
    for k in own {
        let _ = write!(html, "<th>{}</th>", abbreviated_key(k));
    }
    if !rest.is_empty() {
        html.push_str("<th>other config</th>");
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
        for k in own {
            let _ = write!(
                html,
                "<td>{}</td>",
                abbreviated(&notes.value(i, k), CELL_CHARS)
            );
        }
        if !rest.is_empty() {
            let cells: Vec<String> = rest
                .iter()
                .map(|k| abbreviated(&format!("{k}={}", notes.value(i, k)), OTHER_CELL_CHARS))
                .collect();
            let _ = write!(html, "<td class=\"other\">{}</td>", cells.join("<br>"));
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</table></div>\n");
    html.push_str(&calibration.0);
    html.push_str("</body></html>\n");
    let page = out.join("report.html");
    write_atomic(&page, html.as_bytes()).map_err(io(&page))?;
    let mut files = vec![lat_svg, lat_png, m_svg, m_png];
    files.extend(calibration.1);
    files.push(page);
    Ok(files)
}

/// The run table's width bound in CSS pixels: its container never grows past it (wider
/// content scrolls), and the abbreviations below keep the table's natural width under it
/// (about 7.2 px per character at the page's font plus 16 px of padding per column).
pub const TABLE_MAX_WIDTH_PX: u32 = 1400;
/// Varying config keys shown in their own columns; the rest share the "other config" one.
const CONFIG_COLUMNS: usize = 3;
/// Characters of a config column's header or value before it is abbreviated.
const CELL_CHARS: usize = 16;
/// Characters of one `key=value` line of the "other config" column.
const OTHER_CELL_CHARS: usize = 28;

/// `text` as HTML, cut to `max` characters with `…` (the whole text in a hover title).
fn abbreviated(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return escape_xml(text);
    }
    let cut: String = text.chars().take(max.saturating_sub(1)).collect();
    format!(
        "<span title=\"{}\">{}…</span>",
        escape_xml(text),
        escape_xml(&cut)
    )
}

/// A config key as a column header: its trailing dotted segments that fit in
/// [`CELL_CHARS`] (`stages[1].optimizer.weight_decay` → `…weight_decay`), the whole key in a
/// hover title; a single over-long segment is cut.
fn abbreviated_key(key: &str) -> String {
    if key.chars().count() <= CELL_CHARS {
        return escape_xml(key);
    }
    let mut tail = String::new();
    for part in key.rsplit('.') {
        let next = if tail.is_empty() {
            part.to_string()
        } else {
            format!("{part}.{tail}")
        };
        if next.chars().count() + 1 > CELL_CHARS {
            break;
        }
        tail = next;
    }
    if tail.is_empty() {
        return abbreviated(key, CELL_CHARS);
    }
    format!(
        "<span title=\"{}\">…{}</span>",
        escape_xml(key),
        escape_xml(&tail)
    )
}

/// The coverage numbers of one target beside its figure: each level's nominal and observed
/// coverage and their gap, and the mean |observed − nominal|.
fn coverage_table(t: &crate::observe::calibration::TargetCalibration) -> String {
    use crate::observe::calibration::percent;
    let mut html = format!(
        "<table class=\"cal\"><tr><th>{}: nominal</th><th>observed</th><th>|gap|</th></tr>",
        escape_xml(&t.target)
    );
    for &(n, o) in &t.coverage {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            percent(n),
            percent(o),
            percent((o - n).abs())
        );
    }
    if let Some(g) = t.mean_abs_gap() {
        let _ = write!(
            html,
            "<tr><th>mean |observed − nominal|</th><td></td><td>{}</td></tr>",
            percent(g)
        );
    }
    html.push_str("</table>");
    html
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
        let data = rep.calibration_data();
        let written = write_figures(&dir, "test", &data).map_err(io(&dir))?;
        let _ = writeln!(html, "<h3>{}</h3><div>", escape_xml(&r.id));
        for svg in written
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "svg"))
        {
            html.push_str("<span style=\"display:inline-block\">");
            html.push_str(&inline_svg(svg)?);
            html.push_str("</span>");
        }
        // The numbers beside the figures.
        for t in &data {
            html.push_str("<span style=\"display:inline-block;vertical-align:top\">");
            html.push_str(&coverage_table(t));
            html.push_str("</span>");
        }
        html.push_str("</div>\n");
        files.extend(written);
    }
    Ok((html, files))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::metrics::{EvalReport, ManifestMetrics, TargetReport};

    fn row(id: &str, config_text: String, test: Option<EvalReport>) -> RunRow {
        RunRow {
            id: id.into(),
            name: "baseball".into(),
            status: RunState::Finished,
            reason: None,
            host: "h".into(),
            pid: 1,
            started_at: "2026-12-05T00:00:00Z".into(),
            ended_at: None,
            run_dir: "/nonexistent".into(),
            config_text,
            config_sha256: "x".into(),
            git_commit: None,
            dataset_sha256: None,
            param_count: Some(3000),
            artifact_path: None,
            environment: None,
            final_metrics: test.map(|t| ManifestMetrics {
                test: Some(t),
                ..ManifestMetrics::default()
            }),
            val_metric: Some(0.4),
            latency: None,
            latency_b1_p50_us: Some(600.0),
            latency_b128_p50_us: Some(12000.0),
            heartbeat_at: None,
        }
    }

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn scratch(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("kiln-report-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Scratch(p)
    }

    /// Visible text of an HTML fragment (tags dropped, entities counted as one character),
    /// one entry per `<br>`-separated line.
    fn visible_lines(cell: &str) -> Vec<usize> {
        cell.split("<br>")
            .map(|line| {
                let mut n = 0;
                let mut in_tag = false;
                let mut in_entity = false;
                for c in line.chars() {
                    match c {
                        '<' => in_tag = true,
                        '>' => in_tag = false,
                        _ if in_tag => {}
                        '&' => {
                            in_entity = true;
                            n += 1
                        }
                        ';' if in_entity => in_entity = false,
                        _ if in_entity => {}
                        _ => n += 1,
                    }
                }
                n
            })
            .collect()
    }

    /// The run table's natural width estimate: per column, its longest visible line at
    /// 7.2 px a character plus 16 px padding.
    fn table_width_px(html: &str) -> (f64, usize) {
        let table = html
            .split("<table class=\"runs\">")
            .nth(1)
            .unwrap()
            .split("</table>")
            .next()
            .unwrap();
        let mut widest: Vec<usize> = Vec::new();
        for tr in table.split("<tr").skip(1) {
            let cells = tr
                .split("<t")
                .skip(1)
                .filter(|c| c.starts_with('d') || c.starts_with('h'));
            for (j, c) in cells.enumerate() {
                let body = c.split_once('>').unwrap().1;
                let body = body.rsplit_once("</t").map_or(body, |(b, _)| b);
                let w = visible_lines(body).into_iter().max().unwrap_or(0);
                if widest.len() <= j {
                    widest.resize(j + 1, 0);
                }
                widest[j] = widest[j].max(w);
            }
        }
        (
            widest.iter().map(|&n| n as f64 * 7.2 + 16.0).sum(),
            widest.len(),
        )
    }

    #[test]
    fn the_run_table_stays_within_its_width_bound_when_configs_mix() {
        let base = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/baseball.yaml"),
        )
        .unwrap();
        // Runs that differ in many keys, some long-named with long values.
        let variants = [
            ("hidden: [48, 48]", "hidden: [512, 512, 512, 512, 512, 512]"),
            ("activation: relu", "activation: gelu"),
            ("seed: 42", "seed: 7"),
            ("clip_norm: 1.0", "clip_norm: 0.25"),
            ("engine: null", "engine: fused"),
            ("eta_min: 1.0e-5", "eta_min: 3.0e-7"),
            (
                "dir: checkpoints",
                "dir: /very/long/path/to/a/shared/volume/checkpoints",
            ),
        ];
        let mut rows = Vec::new();
        for (i, _) in variants.iter().enumerate() {
            let mut text = base.clone();
            for (from, to) in variants.iter().skip(i) {
                assert!(text.contains(from), "{from} not in configs/baseball.yaml");
                text = text.replacen(from, to, 1);
            }
            rows.push(row(
                &format!("baseball-20261205T000000Z-{i:06x}"),
                text,
                None,
            ));
        }
        let notes = RunNotes::new(&rows);
        assert!(notes.varying.len() > CONFIG_COLUMNS, "{:?}", notes.varying);
        let dir = scratch("width");
        write_report(&rows, "reg.db", &dir.0, LatencyBatch::One).unwrap();
        let html = std::fs::read_to_string(dir.0.join("report.html")).unwrap();
        let (width, columns) = table_width_px(&html);
        assert!(
            width <= TABLE_MAX_WIDTH_PX as f64,
            "table {width:.0} px wide > {TABLE_MAX_WIDTH_PX}"
        );
        assert_eq!(columns, 7 + CONFIG_COLUMNS + 1);
        // Unabbreviated, the same table would not fit: the bound is what keeps it in.
        let full: usize = notes
            .varying
            .iter()
            .map(|k| {
                (0..rows.len())
                    .map(|i| notes.value(i, k).chars().count())
                    .chain([k.chars().count()])
                    .max()
                    .unwrap()
            })
            .sum();
        assert!(width + full as f64 * 7.2 > TABLE_MAX_WIDTH_PX as f64 + 300.0);
        // Nothing is lost: every varying key and value is on the page (in a cell or a
        // hover title), and the container bounds the rendered width.
        for k in &notes.varying {
            assert!(html.contains(&escape_xml(k)), "{k}");
        }
        for (i, _) in rows.iter().enumerate() {
            for k in &notes.varying {
                let v = escape_xml(&notes.value(i, k));
                assert!(html.contains(&v), "{k}={v}");
            }
        }
        assert!(html.contains(&format!("div.runs{{max-width:{TABLE_MAX_WIDTH_PX}px")));
        assert_eq!(html.matches("<tr").count(), rows.len() + 1);
    }

    #[test]
    fn abbreviations_keep_the_tail_of_a_key_and_the_whole_text_on_hover() {
        assert_eq!(abbreviated_key("model.hidden"), "model.hidden");
        let k = abbreviated_key("stages[1].optimizer.weight_decay");
        assert!(k.contains(">…weight_decay<"), "{k}");
        assert!(
            k.contains("title=\"stages[1].optimizer.weight_decay\""),
            "{k}"
        );
        let v = abbreviated("[512, 512, 512, 512, 512]", 16);
        assert!(v.contains(">[512, 512, 512,…<"), "{v}");
        assert_eq!(abbreviated("a<b", 16), "a&lt;b");
    }

    #[test]
    fn the_calibration_section_shows_its_numbers() {
        let base = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/baseball.yaml"),
        )
        .unwrap();
        let test = EvalReport {
            split: "test".into(),
            rows: 100,
            targets: vec![TargetReport {
                target: "hr_rate".into(),
                // Gaps 4, 1, 1 and 2 points: a mean of 2.0 %.
                coverage_curve: vec![(0.5, 0.46), (0.8, 0.79), (0.9, 0.91), (0.95, 0.97)],
                pit_histogram: vec![0.1; 10],
                ..TargetReport::default()
            }],
            rows_sha256: "x".into(),
        };
        let rows = vec![row("run-a", base, Some(test))];
        let dir = scratch("calibration");
        let files = write_report(&rows, "reg.db", &dir.0, LatencyBatch::One).unwrap();
        let html = std::fs::read_to_string(dir.0.join("report.html")).unwrap();
        let svg = files
            .iter()
            .find(|p| p.ends_with("calibration_hr_rate.svg"))
            .expect("the calibration figure");
        let svg = std::fs::read_to_string(svg).unwrap();
        // On the figure (inlined in the page too) and in the table beside it.
        for text in ["46.0% at 50.0%", "97.0% at 95.0%", "| 2.0%"] {
            assert!(svg.contains(text), "figure: {text}");
            assert!(html.contains(text), "page: {text}");
        }
        let table = html
            .split("<table class=\"cal\">")
            .nth(1)
            .expect("a coverage table");
        for text in [
            "<td>50.0%</td><td>46.0%</td><td>4.0%</td>",
            "<td>95.0%</td><td>97.0%</td><td>2.0%</td>",
            "mean |observed − nominal|</th><td></td><td>2.0%</td>",
        ] {
            assert!(table.contains(text), "{text}: {table}");
        }
    }
}
