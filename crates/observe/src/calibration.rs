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

/// The figure of one target.
#[cfg(feature = "plots")]
pub fn figure(split: &str, t: &TargetCalibration) -> super::plot::Figure {
    use super::plot::{Color, Figure, Panel, Series};
    let mut curve = vec![(0.0, 0.0)];
    curve.extend(t.coverage.iter().copied());
    curve.push((1.0, 1.0));
    let reliability = Panel::new(
        "reliability: central-interval coverage",
        "nominal coverage",
        "observed coverage",
    )
    .x_range(0.0, 1.0)
    .y_range(0.0, 1.0)
    .series(Series::line(
        "perfect",
        Color::GRAY,
        vec![(0.0, 0.0), (1.0, 1.0)],
    ))
    .series(Series::line("model", Color::BLUE, curve.clone()))
    .series(Series::scatter("", Color::BLUE, t.coverage.clone()));
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
        let png = std::fs::read(dir.path().join("calibration_hr_rate.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR width and height.
        let w = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
        let h = u32::from_be_bytes([png[20], png[21], png[22], png[23]]);
        assert_eq!((w, h), (640, 760));
    }
}
