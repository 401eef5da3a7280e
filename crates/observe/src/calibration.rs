//! Pictures of a regression head's calibration, per target: a reliability diagram (nominal
//! against observed central-interval coverage, the diagonal is perfect) above a PIT histogram
//! (density per bin; a calibrated head is flat at 1, a ∪ shape means σ too small, ∩ too
//! large). Written as `calibration_<target>.svg` and `.png` into the run directory, and shown
//! by `kiln runs report`.

use std::path::{Path, PathBuf};

/// One target's calibration data (no dependence on the evaluation's types).
#[derive(Debug, Clone, PartialEq)]
pub struct TargetCalibration {
    /// The target column.
    pub target: String,
    /// (nominal, observed) central-interval coverage.
    pub coverage: Vec<(f64, f64)>,
    /// PIT histogram over equal bins of [0, 1], as fractions.
    pub pit_histogram: Vec<f64>,
}

/// The file stem of a target's figure (characters outside `[A-Za-z0-9_-]` become `_`).
pub fn file_stem(target: &str) -> String {
    let safe: String = target
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("calibration_{safe}")
}

impl TargetCalibration {
    /// The mean |observed − nominal| coverage over the curve's levels (`None` without
    /// finite points): one number for how far the reliability curve is from the diagonal.
    pub fn mean_abs_gap(&self) -> Option<f64> {
        let gaps: Vec<f64> = self
            .coverage
            .iter()
            .filter(|(n, o)| n.is_finite() && o.is_finite())
            .map(|(n, o)| (o - n).abs())
            .collect();
        (!gaps.is_empty()).then(|| gaps.iter().sum::<f64>() / gaps.len() as f64)
    }
}

/// A coverage as a percentage with one decimal (`0.9134` → `91.3%`).
pub fn percent(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// The figure of one target. The reliability panel shows its numbers: each level's observed
/// coverage beside its point, and the mean |observed − nominal| in the panel's title.
#[cfg(feature = "plots")]
pub fn figure(split: &str, t: &TargetCalibration) -> super::plot::Figure {
    use super::plot::{Color, Figure, Panel, Series};
    let mut curve = vec![(0.0, 0.0)];
    curve.extend(t.coverage.iter().copied());
    curve.push((1.0, 1.0));
    let title = match t.mean_abs_gap() {
        Some(g) => format!(
            "reliability: central-interval coverage (mean |observed − nominal| {})",
            percent(g)
        ),
        None => "reliability: central-interval coverage".to_string(),
    };
    let labels: Vec<String> = t
        .coverage
        .iter()
        .map(|&(n, o)| format!("{} at {}", percent(o), percent(n)))
        .collect();
    let reliability = Panel::new(title, "nominal coverage", "observed coverage")
        .x_range(0.0, 1.0)
        .y_range(0.0, 1.0)
        .series(Series::line(
            "perfect",
            Color::GRAY,
            vec![(0.0, 0.0), (1.0, 1.0)],
        ))
        .series(Series::line("model", Color::BLUE, curve.clone()))
        .series(Series::scatter("", Color::BLUE, t.coverage.clone()).labels(labels));
    let bins = t.pit_histogram.len().max(1);
    let w = 1.0 / bins as f64;
    // Stairs: each bin's density held across the bin.
    let mut stairs = Vec::with_capacity(2 * bins);
    for (i, f) in t.pit_histogram.iter().enumerate() {
        let d = f * bins as f64;
        stairs.push((i as f64 * w, d));
        stairs.push(((i + 1) as f64 * w, d));
    }
    let top = stairs.iter().map(|p| p.1).fold(2.0f64, f64::max).min(1e6);
    let pit = Panel::new("PIT histogram", "PIT = Φ((y − μ)/σ)", "density")
        .x_range(0.0, 1.0)
        .y_range(0.0, top * 1.05)
        .series(Series::line(
            "uniform",
            Color::GRAY,
            vec![(0.0, 1.0), (1.0, 1.0)],
        ))
        .series(Series::line("model", Color::ORANGE, stairs));
    Figure::new(
        format!("{} — {split} split calibration", t.target),
        640,
        760,
    )
    .panel(reliability)
    .panel(pit)
}

/// Write every target's figure (SVG and PNG) into `dir`; returns the files written (none
/// without the `plots` feature).
pub fn write_figures(
    dir: &Path,
    split: &str,
    targets: &[TargetCalibration],
) -> std::io::Result<Vec<PathBuf>> {
    #[cfg(feature = "plots")]
    {
        let mut out = Vec::new();
        for t in targets {
            let (svg, png) = figure(split, t).save(&dir.join(file_stem(&t.target)))?;
            out.push(svg);
            out.push(png);
        }
        Ok(out)
    }
    #[cfg(not(feature = "plots"))]
    {
        let _ = (dir, split, targets);
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_gap_is_over_finite_levels() {
        let t = TargetCalibration {
            target: "y".into(),
            coverage: vec![(0.5, 0.4), (0.9, 0.95), (0.8, f64::NAN)],
            pit_histogram: vec![],
        };
        assert!((t.mean_abs_gap().unwrap() - 0.075).abs() < 1e-12);
        let empty = TargetCalibration {
            coverage: vec![],
            ..t
        };
        assert_eq!(empty.mean_abs_gap(), None);
        assert_eq!(percent(0.9134), "91.3%");
    }

    #[test]
    fn stems_are_safe_file_names() {
        assert_eq!(file_stem("hr_rate"), "calibration_hr_rate");
        assert_eq!(file_stem("a/b c"), "calibration_a_b_c");
    }

    #[cfg(feature = "plots")]
    #[test]
    fn figures_are_readable_svg_and_png() {
        let t = TargetCalibration {
            target: "hr_rate".into(),
            coverage: vec![(0.5, 0.46), (0.8, 0.79), (0.9, 0.91), (0.95, 0.96)],
            pit_histogram: vec![0.12, 0.1, 0.09, 0.1, 0.1, 0.1, 0.1, 0.09, 0.09, 0.11],
        };
        let t2 = t.clone();
        let dir = tempfile::tempdir().unwrap();
        let files = write_figures(dir.path(), "test", &[t]).unwrap();
        assert_eq!(files.len(), 2);
        let svg = std::fs::read_to_string(dir.path().join("calibration_hr_rate.svg")).unwrap();
        assert!(
            svg.starts_with("<svg") || svg.contains("<svg"),
            "an SVG document"
        );
        for text in [
            "PIT histogram",
            "nominal coverage",
            "test split calibration",
        ] {
            assert!(svg.contains(text), "{text}");
        }
        // The numbers: each level's observed coverage at its nominal, and the mean gap
        // (|0.46−0.5| + |0.79−0.8| + |0.91−0.9| + |0.96−0.95|) / 4 = 0.0175.
        let gap = t2.mean_abs_gap().unwrap();
        assert!((gap - 0.0175).abs() < 1e-12, "{gap}");
        let mean = format!("mean |observed − nominal| {}", percent(gap));
        for text in [
            "46.0% at 50.0%",
            "79.0% at 80.0%",
            "91.0% at 90.0%",
            "96.0% at 95.0%",
            mean.as_str(),
        ] {
            assert!(svg.contains(text), "{text}: {svg}");
        }
        let png = std::fs::read(dir.path().join("calibration_hr_rate.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR width and height.
        let w = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
        let h = u32::from_be_bytes([png[20], png[21], png[22], png[23]]);
        assert_eq!((w, h), (640, 760));
    }
}
