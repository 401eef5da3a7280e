//! Small plots drawn with the `plotters` crate, rendered identically to SVG and PNG.
//!
//! A [`Figure`] stacks [`Panel`]s vertically; a panel holds line, scatter and step
//! [`Series`] plus labelled dashed vertical markers ([`VLine`]). Adjacent panels with the
//! same x label, log flag and x range share one x axis (union range, tick labels only on
//! the lowest). Either axis may be logarithmic. Ticks are "nice" (1/2/5 × 10^k; decades on a
//! log axis) with compact labels (`1.2k`, `3.4M`). Non-finite points are skipped (a line
//! breaks there), as are values ≤ 0 on a log axis and points or markers outside an explicit
//! range; degenerate ranges are padded. Scatter points may carry a text label drawn beside
//! them and a tooltip: in the SVG each such point's `<circle>` holds a `<title>`, which
//! browsers show on hover.
//! Text is set in DejaVu Sans, embedded from `assets/fonts/` and handed to plotters'
//! `ab_glyph` renderer, so rendering needs no system fonts. Rendering never panics on user
//! data; a figure too small for its panels comes out blank but for its title.
//!
//! ```no_run
//! use kiln_observe::plot::{Color, Figure, Panel, Series};
//! let mem = vec![(0.0, 120.0), (5.0, 340.0)];
//! let fig = Figure::new("training job", 900, 600)
//!     .panel(Panel::new("", "time (s)", "memory (MB)").series(Series::line("rss", Color::BLUE, mem)).vline(2.5, "train"));
//! let (svg_path, png_path) = fig.save(std::path::Path::new("runs/trace"))?; // runs/trace.svg, .png
//! # Ok::<(), std::io::Error>(())
//! ```

use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::{
    BitMapBackend, ChartBuilder, Circle, DashedLineSeries, DrawingArea, DrawingAreaErrorKind,
    DrawingBackend, IntoDrawingArea, IntoFont, PathElement, RGBColor, Ranged, Rectangle,
    SVGBackend, SeriesLabelPosition, Text, TextStyle,
};
use plotters::style::{Color as _, FontStyle, register_font};
use std::io::{Error, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// An sRGB colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Color(pub u8, pub u8, pub u8);

impl Color {
    /// Black.
    pub const BLACK: Color = Color(0, 0, 0);
    /// White (the background).
    pub const WHITE: Color = Color(255, 255, 255);
    /// Blue (matplotlib's first cycle colour).
    pub const BLUE: Color = Color(31, 119, 180);
    /// Red.
    pub const RED: Color = Color(214, 39, 40);
    /// Green.
    pub const GREEN: Color = Color(44, 160, 44);
    /// Orange.
    pub const ORANGE: Color = Color(255, 127, 14);
    /// Purple.
    pub const PURPLE: Color = Color(148, 103, 189);
    /// Mid gray.
    pub const GRAY: Color = Color(127, 127, 127);
}

/// Largest width or height rendered; larger (and zero) sizes are clamped to 1..=MAX_SIDE.
pub const MAX_SIDE: u32 = 8192;

const TEXT: Color = Color(30, 30, 30);
const AXIS: Color = Color(60, 60, 60);
const GRID: Color = Color(232, 232, 232);
const MARKER: Color = Color(90, 90, 90);
const LEGEND_EDGE: Color = Color(170, 170, 170);

/// The family name the embedded font is registered under; SVG viewers fall back to their
/// own sans-serif font.
const FAMILY: &str = "sans-serif";
/// DejaVu Sans (Bitstream Vera licence; see assets/fonts/).
static DEJAVU_SANS: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");

/// How a series is drawn. `Step` draws stairs (horizontal, then vertical) through the
/// points sorted by x, as for a Pareto front.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesKind {
    /// Straight segments joining the points in order.
    Line,
    /// A filled circle per point.
    Scatter,
    /// Stairs through the points sorted by x.
    Step,
}

/// One data series of a panel.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend entry; an empty name keeps the series out of the legend.
    pub name: String,
    /// How the points are drawn.
    pub kind: SeriesKind,
    /// Stroke or fill colour.
    pub color: Color,
    /// The (x, y) data points.
    pub points: Vec<(f64, f64)>,
    /// Scatter point radius in pixels (default 3).
    pub radius: f64,
    /// Line width in pixels (default 2).
    pub width: f64,
    /// Scatter only: hover text per point, by index (SVG `<title>`; empty = none).
    pub tips: Vec<String>,
    /// Scatter only: text drawn beside each point, by index (empty = none).
    pub labels: Vec<String>,
}

impl Series {
    /// A series of the given kind with the default radius and width.
    pub fn new(
        name: impl Into<String>,
        kind: SeriesKind,
        color: Color,
        points: Vec<(f64, f64)>,
    ) -> Self {
        let name = name.into();
        Series {
            name,
            kind,
            color,
            points,
            radius: 3.0,
            width: 2.0,
            tips: Vec::new(),
            labels: Vec::new(),
        }
    }
    /// A [`SeriesKind::Line`] series.
    pub fn line(name: impl Into<String>, color: Color, points: Vec<(f64, f64)>) -> Self {
        Self::new(name, SeriesKind::Line, color, points)
    }
    /// A [`SeriesKind::Scatter`] series.
    pub fn scatter(name: impl Into<String>, color: Color, points: Vec<(f64, f64)>) -> Self {
        Self::new(name, SeriesKind::Scatter, color, points)
    }
    /// A [`SeriesKind::Step`] series.
    pub fn step(name: impl Into<String>, color: Color, points: Vec<(f64, f64)>) -> Self {
        Self::new(name, SeriesKind::Step, color, points)
    }
    /// Sets the scatter point radius in pixels.
    pub fn radius(self, radius: f64) -> Self {
        Series { radius, ..self }
    }
    /// Sets the line width in pixels.
    pub fn width(self, width: f64) -> Self {
        Series { width, ..self }
    }
    /// Sets the hover text of each point (scatter; SVG `<title>`).
    pub fn tips(self, tips: Vec<String>) -> Self {
        Series { tips, ..self }
    }
    /// Sets the text drawn beside each point (scatter).
    pub fn labels(self, labels: Vec<String>) -> Self {
        Series { labels, ..self }
    }
}

/// A labelled, dashed vertical marker (e.g. a stage boundary).
#[derive(Clone, Debug)]
pub struct VLine {
    /// Where the marker stands, in data units.
    pub x: f64,
    /// Text written beside the marker's top.
    pub label: String,
}

/// One plot area with its axes, series, markers and legend.
#[derive(Clone, Debug, Default)]
pub struct Panel {
    /// Caption above the plot area (may be empty).
    pub title: String,
    /// X axis description.
    pub x_label: String,
    /// Y axis description.
    pub y_label: String,
    /// The data, drawn in order (later series on top).
    pub series: Vec<Series>,
    /// Vertical markers.
    pub vlines: Vec<VLine>,
    /// Logarithmic (base 10) x axis; points with x ≤ 0 are skipped.
    pub log_x: bool,
    /// Logarithmic (base 10) y axis; points with y ≤ 0 are skipped.
    pub log_y: bool,
    /// Fixed x range; `None` fits the data (and markers) with 5% padding.
    pub x_range: Option<(f64, f64)>,
    /// Fixed y range; `None` fits the data with 5% padding.
    pub y_range: Option<(f64, f64)>,
}

impl Panel {
    /// An empty panel with a caption and axis descriptions.
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Self {
        let (title, x_label, y_label) = (title.into(), x_label.into(), y_label.into());
        Panel {
            title,
            x_label,
            y_label,
            ..Default::default()
        }
    }
    /// Adds a series.
    pub fn series(mut self, s: Series) -> Self {
        self.series.push(s);
        self
    }
    /// Adds a labelled vertical marker at `x`.
    pub fn vline(mut self, x: f64, label: impl Into<String>) -> Self {
        self.vlines.push(VLine {
            x,
            label: label.into(),
        });
        self
    }
    /// Makes the x axis logarithmic (or linear).
    pub fn log_x(self, log_x: bool) -> Self {
        Panel { log_x, ..self }
    }
    /// Makes the y axis logarithmic (or linear).
    pub fn log_y(self, log_y: bool) -> Self {
        Panel { log_y, ..self }
    }
    /// Fixes the x range.
    pub fn x_range(self, lo: f64, hi: f64) -> Self {
        Panel {
            x_range: Some((lo, hi)),
            ..self
        }
    }
    /// Fixes the y range.
    pub fn y_range(self, lo: f64, hi: f64) -> Self {
        Panel {
            y_range: Some((lo, hi)),
            ..self
        }
    }
}

/// A figure of vertically stacked panels.
#[derive(Clone, Debug)]
pub struct Figure {
    /// Title across the top (may be empty).
    pub title: String,
    /// Width in pixels (clamped to 1..=MAX_SIDE).
    pub width: u32,
    /// Height in pixels (clamped to 1..=MAX_SIDE).
    pub height: u32,
    /// Panels, top to bottom.
    pub panels: Vec<Panel>,
}

impl Figure {
    /// An empty figure of `width × height` pixels.
    pub fn new(title: impl Into<String>, width: u32, height: u32) -> Self {
        Figure {
            title: title.into(),
            width,
            height,
            panels: Vec::new(),
        }
    }
    /// Adds a panel below the existing ones.
    pub fn panel(mut self, p: Panel) -> Self {
        self.panels.push(p);
        self
    }

    /// The figure as a standalone SVG document (empty if rendering fails, which only a
    /// broken embedded font could cause; [`Figure::save`] reports that as an error).
    pub fn to_svg(&self) -> String {
        self.svg().unwrap_or_default()
    }

    /// The figure as an 8-bit RGB PNG of `width × height` (clamped to 1..=MAX_SIDE); empty
    /// if rendering fails (see [`Figure::to_svg`]).
    pub fn to_png(&self) -> Vec<u8> {
        self.png().unwrap_or_default()
    }

    /// Writes `<stem>.svg` and `<stem>.png` (extension appended, not substituted), each
    /// atomically: temp file in the same directory, fsync, rename.
    pub fn save(&self, stem: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
        let with = |ext: &str| {
            let mut s = stem.as_os_str().to_owned();
            s.push(ext);
            PathBuf::from(s)
        };
        let (svg_path, png_path) = (with(".svg"), with(".png"));
        let svg = self.svg().map_err(|e| ctx(&svg_path, "rendering", e))?;
        crate::util::write_atomic(&svg_path, svg.as_bytes())?;
        let png = self.png().map_err(|e| ctx(&png_path, "rendering", e))?;
        crate::util::write_atomic(&png_path, &png)?;
        Ok((svg_path, png_path))
    }

    fn size(&self) -> (u32, u32) {
        (
            self.width.clamp(1, MAX_SIDE),
            self.height.clamp(1, MAX_SIDE),
        )
    }

    fn svg(&self) -> std::io::Result<String> {
        font_ready()?;
        let mut out = String::new();
        let placed = {
            let root = SVGBackend::with_string(&mut out, self.size()).into_drawing_area();
            let placed = self.render(&root).map_err(drawing)?;
            root.present().map_err(drawing)?;
            placed
        };
        let tips: Vec<Option<String>> = placed.into_iter().flat_map(|p| p.tips).collect();
        Ok(with_titles(&out, &tips))
    }

    /// The figure as packed 8-bit RGB rows, and where each panel landed.
    fn pixels(&self) -> std::io::Result<(Vec<u8>, Vec<Placed>)> {
        font_ready()?;
        let (w, h) = self.size();
        let mut buf = vec![0u8; w as usize * h as usize * 3];
        let placed = {
            let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
            let placed = self.render(&root).map_err(drawing)?;
            root.present().map_err(drawing)?;
            placed
        };
        Ok((buf, placed))
    }

    fn png(&self) -> std::io::Result<Vec<u8>> {
        let (w, h) = self.size();
        let (buf, _) = self.pixels()?;
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().map_err(Error::other)?;
        writer.write_image_data(&buf).map_err(Error::other)?;
        writer.finish().map_err(Error::other)?;
        Ok(out)
    }
}

/// Registers the embedded font with plotters (once per process).
fn font_ready() -> std::io::Result<()> {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok = *OK.get_or_init(|| register_font(FAMILY, FontStyle::Normal, DEJAVU_SANS).is_ok());
    ok.then_some(()).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidData,
            "the embedded font assets/fonts/DejaVuSans.ttf is not a TrueType font plotters can load",
        )
    })
}

/// The SVG with the `k`-th `<circle>` (the `k`-th scatter point drawn) holding `tips[k]` as
/// its `<title>`. Left as it is if the circles and the points do not pair up one to one.
fn with_titles(svg: &str, tips: &[Option<String>]) -> String {
    if tips.iter().all(Option::is_none) || svg.matches("<circle").count() != tips.len() {
        return svg.to_string();
    }
    let mut out = String::with_capacity(svg.len() + tips.len() * 64);
    let mut rest = svg;
    for tip in tips {
        let Some(start) = rest.find("<circle") else {
            break;
        };
        let Some(end) = rest[start..].find("/>").map(|e| start + e) else {
            break;
        };
        out.push_str(&rest[..end]);
        match tip {
            Some(t) => {
                out.push_str("><title>");
                out.push_str(&crate::util::escape_xml(t));
                out.push_str("</title></circle>");
            }
            None => out.push_str("/>"),
        }
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    out
}

fn drawing<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> Error {
    Error::other(format!("drawing the plot failed: {e}"))
}

fn ctx(path: &Path, what: &str, e: Error) -> Error {
    Error::new(
        e.kind(),
        format!("{what} plot file {}: {e}", path.display()),
    )
}

// ---------------------------------------------------------------------------------------
// Ticks and labels

/// The "nice" step (1, 2 or 5 × 10^k) closest to `raw` (1 for a non-positive `raw`).
pub fn nice_step(raw: f64) -> f64 {
    if !(raw > 0.0 && raw.is_finite()) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let n = raw / mag;
    let m = [(1.5, 1.0), (3.5, 2.0), (7.5, 5.0)]
        .iter()
        .find(|(lim, _)| n < *lim);
    m.map_or(10.0, |(_, m)| *m) * mag
}

/// Multiples of a nice step inside `[lo, hi]`, aiming at about `target` intervals.
/// Empty for an empty or non-finite range (or one needing over 1000 ticks).
pub fn nice_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi < lo {
        return Vec::new();
    }
    if hi == lo {
        return vec![lo];
    }
    let step = nice_step((hi - lo) / target.max(1) as f64);
    let (k0, k1) = ((lo / step - 1e-9).ceil(), (hi / step + 1e-9).floor());
    if !(k0.is_finite() && k1.is_finite()) || k1 - k0 > 1000.0 {
        return Vec::new();
    }
    let snap = |v: f64| if v.abs() < step * 1e-9 { 0.0 } else { v };
    (0..=(k1 - k0) as usize)
        .map(|i| snap((k0 + i as f64) * step))
        .collect()
}

/// Ticks for a log axis spanning `10^lo_e ..= 10^hi_e`: whole decades when the range spans
/// at least two (every n-th if many), else 1/2/5 × 10^k, else linear nice ticks.
fn log_ticks(lo_e: f64, hi_e: f64, target: usize) -> Vec<f64> {
    if !(lo_e.is_finite() && hi_e.is_finite()) || hi_e < lo_e {
        return Vec::new();
    }
    let (d0, d1) = (lo_e.ceil(), hi_e.floor());
    if d1 - d0 >= 1.0 {
        let every = ((d1 - d0) / target.max(1) as f64).ceil().max(1.0);
        let n = ((d1 - d0) / every).floor() as usize;
        return (0..=n).map(|i| 10f64.powf(d0 + i as f64 * every)).collect();
    }
    let inside = |t: &f64| t.log10() >= lo_e - 1e-9 && t.log10() <= hi_e + 1e-9;
    let v: Vec<f64> = (lo_e.floor() as i32..=hi_e.ceil() as i32)
        .flat_map(|e| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(e)))
        .filter(inside)
        .collect();
    if v.len() >= 2 {
        v
    } else {
        nice_ticks(10f64.powf(lo_e), 10f64.powf(hi_e), target)
    }
}

/// Formats `v` with `sig` significant digits (at least the integer part), trailing zeros
/// trimmed: SI-like suffixes (`k` … `T`) for 1e3 ≤ |v| < 1e15, plain decimals down to 1e-3,
/// `1.5e-7` style beyond. Also returns the value the label denotes.
fn format_sig(v: f64, sig: usize) -> (String, f64) {
    if !v.is_finite() {
        let s = if v.is_nan() {
            "NaN"
        } else if v > 0.0 {
            "inf"
        } else {
            "-inf"
        };
        return (s.into(), v);
    }
    let a = v.abs();
    if a == 0.0 {
        return ("0".into(), 0.0);
    }
    let trim = |s: String| -> String {
        let s = if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.')
        } else {
            &s
        };
        if s == "-0" { "0".into() } else { s.into() }
    };
    if !(1e-3..1e15).contains(&a) {
        // v / 10^e, staying finite for subnormal v (10^-324 underflows to 0).
        let scaled = |e: f64| {
            if e < -300.0 {
                v * 1e300 / 10f64.powf(e + 300.0)
            } else {
                v / 10f64.powf(e)
            }
        };
        let mut e = a.log10().floor();
        let mut s = format!("{:.*}", sig.saturating_sub(1), scaled(e));
        if s.parse::<f64>().is_ok_and(|m| m.abs() >= 10.0) {
            e += 1.0;
            s = format!("{:.*}", sig.saturating_sub(1), scaled(e));
        }
        let denoted = s.parse::<f64>().unwrap_or(f64::NAN) * 10f64.powf(e);
        return (format!("{}e{}", trim(s), e as i64), denoted);
    }
    const UNITS: [(f64, &str); 5] = [(1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T")];
    let mut u = UNITS.iter().rposition(|(f, _)| a >= *f).unwrap_or(0);
    loop {
        let (f, suffix) = UNITS[u];
        let m = v / f;
        let decimals = (sig as i64 - 1 - m.abs().log10().floor() as i64).max(0) as usize;
        let s = format!("{m:.decimals$}");
        let mr = s.parse::<f64>().unwrap_or(m);
        if mr.abs() >= 1000.0 && u + 1 < UNITS.len() {
            u += 1;
            continue;
        }
        return (format!("{}{suffix}", trim(s)), mr * f);
    }
}

/// Compact label with three significant digits: `1.2k`, `3.4M`, `0.5`, `250`, `1.5e-7`.
pub fn format_compact(v: f64) -> String {
    format_sig(v, 3).0
}

/// Labels for a tick sequence: the fewest significant digits that denote every tick to
/// within 0.1% of the tick spacing.
pub fn tick_labels(ticks: &[f64]) -> Vec<String> {
    let gaps = ticks
        .windows(2)
        .map(|w| (w[1] - w[0]).abs())
        .filter(|d| *d > 0.0);
    let spacing = gaps.fold(f64::INFINITY, f64::min);
    let tol = if spacing.is_finite() {
        spacing
    } else {
        ticks.first().map_or(0.0, |v| v.abs())
    };
    let mut best = Vec::new();
    for sig in 1..=15 {
        let ls: Vec<(String, f64)> = ticks.iter().map(|t| format_sig(*t, sig)).collect();
        let exact = ls
            .iter()
            .zip(ticks)
            .all(|((_, a), t)| (a - t).abs() <= tol * 1e-3);
        best = ls.into_iter().map(|(s, _)| s).collect();
        if exact {
            break;
        }
    }
    best
}

// ---------------------------------------------------------------------------------------
// Layout and drawing (plotters)

type Pt = (f64, f64);
/// A box: left, top, right, bottom.
type Bx = (f64, f64, f64, f64);
type DrawResult<T, DB> = Result<T, DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// A rectangle: x0, y0, x1, y1 with x0 ≤ x1 and y0 ≤ y1 (data space for clipping).
#[derive(Clone, Copy, Debug)]
struct Rect(f64, f64, f64, f64);

impl Rect {
    fn contains(&self, (x, y): Pt, slack: f64) -> bool {
        x >= self.0 - slack && x <= self.2 + slack && y >= self.1 - slack && y <= self.3 + slack
    }
}

/// Where a panel landed: its axis ranges (x in log10 space on a log axis) and the pixel
/// limits plotters maps them to (`px` left → right, `py` bottom → top).
#[derive(Clone, Debug, PartialEq)]
struct Placed {
    log_x: bool,
    log_y: bool,
    xr: (f64, f64),
    yr: (f64, f64),
    px: (i32, i32),
    py: (i32, i32),
    x_labels: bool,
    /// The hover text of each scatter point drawn, in drawing order.
    tips: Vec<Option<String>>,
}

impl Placed {
    /// The pixel a data point maps to (NaN where it has none, e.g. x ≤ 0 on a log axis).
    #[cfg(test)]
    fn pixel(&self, (x, y): Pt) -> Pt {
        self.axis_pixel((to_axis(x, self.log_x), to_axis(y, self.log_y)))
    }

    /// The pixel a point in axis space (log10 on a log axis) maps to.
    fn axis_pixel(&self, (x, y): Pt) -> Pt {
        let f = |v: f64, (lo, hi): (f64, f64), (a, b): (i32, i32)| {
            a as f64 + (v - lo) / (hi - lo) * (b - a) as f64
        };
        (f(x, self.xr, self.px), f(y, self.yr, self.py))
    }
}

/// A linear plotters axis over `lo..hi` whose ticks (and grid lines) are exactly the keys
/// given, labelled by the caller's formatter.
#[derive(Clone)]
struct Axis(f64, f64, Vec<f64>);

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        RangedCoordf64::from(self.0..self.1).map(v, limit)
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        match hint.weight().allow_light_points() {
            true => Vec::new(),
            false => self.2.clone(),
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.0..self.1
    }
}

/// An x value in axis space: log10 on a log axis (NaN for x ≤ 0).
fn to_axis(x: f64, log: bool) -> f64 {
    match (log, x > 0.0) {
        (false, _) => x,
        (true, true) => x.log10(),
        (true, false) => f64::NAN,
    }
}

fn rgb(c: Color) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

fn text_style(size: f64, c: Color) -> TextStyle<'static> {
    (FAMILY, size).into_font().color(&rgb(c))
}

fn text_width(s: &str, st: &TextStyle) -> f64 {
    st.font.box_size(s).map_or(0.0, |(w, _)| w as f64)
}

/// `s` with control characters blanked, cut to fit `max_px`, ending in `..` when cut.
fn truncate(s: &str, max_px: f64, st: &TextStyle) -> String {
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text_width(&s, st) <= max_px {
        return s;
    }
    let chars: Vec<char> = s.chars().collect();
    let cut = |n: usize| chars[..n].iter().collect::<String>() + "..";
    let (mut lo, mut hi) = (0, chars.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if text_width(&cut(mid), st) <= max_px {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    if lo == 0 { String::new() } else { cut(lo) }
}

/// Text styles and spacing for one figure size.
struct Metrics {
    /// Scale: 2 for large figures, else 1.
    s: f64,
    body: TextStyle<'static>,
    title: TextStyle<'static>,
    marker: TextStyle<'static>,
    /// Body text height in pixels.
    th: f64,
    /// Outer padding left and at the bottom.
    pad: f64,
    /// Margin above and below each panel.
    margin: f64,
    /// Room right of each plot area (for the last x tick label).
    right: f64,
}

impl Metrics {
    fn new((w, h): (u32, u32)) -> Self {
        let s = if w >= 1400 && h >= 800 { 2.0 } else { 1.0 };
        let body = text_style(13.0 * s, TEXT);
        let th = body
            .font
            .box_size("0Ag")
            .map_or(13.0 * s, |(_, h)| h as f64);
        Metrics {
            s,
            title: text_style(17.0 * s, TEXT),
            marker: text_style(12.0 * s, MARKER),
            body,
            th,
            pad: 8.0 * s,
            margin: 4.0 * s,
            right: 22.0 * s,
        }
    }
}

/// One panel's place in the figure and its axes.
struct PanelLayout {
    top: f64,
    height: f64,
    x_area: f64,
    plot_w: f64,
    xr: (f64, f64),
    yr: (f64, f64),
    x_ticks: Vec<(f64, String)>,
    y_ticks: Vec<(f64, String)>,
    show_x: bool,
}

/// Auto or explicit range of an axis, in transformed (log10 when `log`) space.
fn axis_range(vals: &[f64], log: bool, explicit: Option<(f64, f64)>) -> (f64, f64) {
    let tr = |v: f64| {
        if !log {
            v.clamp(-1e300, 1e300)
        } else if v > 0.0 {
            v.log10()
        } else {
            f64::NAN
        }
    };
    if let Some((a, b)) = explicit.map(|(a, b)| (tr(a), tr(b)))
        && a.is_finite()
        && b.is_finite()
    {
        return pad_range(a.min(b), a.max(b), log, false);
    }
    let t = vals.iter().map(|v| tr(*v)).filter(|v| v.is_finite());
    let (lo, hi) = t.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
        (l.min(v), h.max(v))
    });
    if lo > hi {
        (0.0, 1.0)
    } else {
        pad_range(lo, hi, log, true)
    }
}

/// Widens a degenerate range; with `margin`, adds 5% each side (not below 0 for
/// non-negative linear data). Negated comparisons are deliberate: they also catch NaN.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
fn pad_range(lo: f64, hi: f64, log: bool, margin: bool) -> (f64, f64) {
    let span = hi - lo;
    let (a, b) = if !(span > lo.abs().max(hi.abs()) * 1e-12) {
        let mid = lo / 2.0 + hi / 2.0;
        let p = if log { 0.5 } else { mid.abs() * 0.1 };
        (mid - p, mid + p)
    } else if margin {
        let p = span * 0.05;
        let floor0 = !log && lo >= 0.0 && lo - p < 0.0;
        (if floor0 { 0.0 } else { lo - p }, hi + p)
    } else {
        (lo, hi)
    };
    if b > a && (b - a).is_finite() {
        (a, b)
    } else if lo + 1.0 > lo - 1.0 {
        (lo - 1.0, lo + 1.0)
    } else {
        (lo - lo.abs() * 0.1, lo + lo.abs() * 0.1)
    }
}

/// Whether a point can be drawn: finite, and positive on a log axis.
fn plottable((x, y): Pt, log_x: bool, log_y: bool) -> bool {
    x.is_finite() && y.is_finite() && (!log_x || x > 0.0) && (!log_y || y > 0.0)
}

fn finite_points(s: &Series, log_x: bool, log_y: bool) -> impl Iterator<Item = Pt> + '_ {
    let ok = move |q: &Pt| plottable(*q, log_x, log_y);
    s.points.iter().copied().filter(ok)
}

/// One coordinate of every plottable point of a panel.
fn coords(p: &Panel, f: fn(Pt) -> f64) -> impl Iterator<Item = f64> + '_ {
    p.series
        .iter()
        .flat_map(|s| finite_points(s, p.log_x, p.log_y))
        .map(f)
}

/// Labelled ticks at axis positions `keys` (`values` are what they denote); labels that
/// would collide along the axis are thinned to every n-th. `px` maps a key to pixels.
fn make_ticks(
    keys: Vec<f64>,
    values: Vec<f64>,
    px: impl Fn(f64) -> f64,
    extent: impl Fn(&str) -> f64,
) -> Vec<(f64, String)> {
    let mut labels = tick_labels(&values);
    let fits = |every: usize| {
        let kept: Vec<usize> = (0..keys.len()).step_by(every).collect();
        kept.windows(2).all(|w| {
            let d = (px(keys[w[1]]) - px(keys[w[0]])).abs();
            d >= (extent(&labels[w[0]]) + extent(&labels[w[1]])) / 2.0
        })
    };
    let every = (1..=keys.len().max(1)).find(|e| fits(*e)).unwrap_or(1);
    labels
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| i % every != 0)
        .for_each(|(_, l)| l.clear());
    keys.into_iter().zip(labels).collect()
}

/// The label of the tick at `key` (plotters hands back the keys it was given).
fn label_at(ticks: &[(f64, String)], key: f64) -> String {
    let hit = ticks.iter().find(|(k, _)| *k == key);
    hit.map(|(_, l)| l.clone()).unwrap_or_default()
}

impl Figure {
    /// Places the panels below `top`: equal plot heights, shared x axes, aligned plot
    /// areas. Empty when the figure is too small to hold them.
    fn layout(&self, m: &Metrics, top: f64) -> (Vec<PanelLayout>, f64) {
        let (w, h) = self.size();
        let (w, h) = (w as f64, h as f64);
        let (n, panels) = (self.panels.len(), &self.panels);
        // Panels i and i+1 share an x axis when their x label, log flag and range agree.
        let axis = |p: &Panel| (p.x_label.clone(), p.log_x, p.x_range);
        let show_x: Vec<bool> = (0..n)
            .map(|i| i + 1 == n || axis(&panels[i]) != axis(&panels[i + 1]))
            .collect();
        let caption = |p: &Panel| match p.title.is_empty() {
            true => 0.0,
            false => m.th + 2.0 * (m.th / 2.0).min(5.0).floor(),
        };
        let x_area = |i: usize| match show_x[i] {
            false => 0.0,
            true => {
                let desc = if panels[i].x_label.is_empty() {
                    0.0
                } else {
                    m.th + 4.0 * m.s
                };
                (m.th + 12.0 * m.s + desc).ceil()
            }
        };
        let overhead = |i: usize| (2.0 * m.margin + caption(&panels[i]) + x_area(i)).ceil();
        let fixed: f64 = (0..n).map(overhead).sum();
        let plot_h = ((h - top - m.pad - fixed) / n.max(1) as f64).floor();
        if n == 0 || plot_h < 2.0 * m.th {
            return (Vec::new(), 0.0);
        }
        // Y ranges and ticks per panel.
        let mut ys = Vec::new();
        for p in panels {
            let yv: Vec<f64> = coords(p, |q| q.1).collect();
            let (lo, hi) = axis_range(&yv, p.log_y, p.y_range);
            let target = (plot_h / (m.th * 2.5)).clamp(2.0, 10.0) as usize;
            let values: Vec<f64> = match p.log_y {
                true => log_ticks(lo, hi, target),
                false => nice_ticks(lo, hi, target),
            };
            let values: Vec<f64> = values
                .into_iter()
                .filter(|v| to_axis(*v, p.log_y).is_finite())
                .collect();
            let keys = values.iter().map(|v| to_axis(*v, p.log_y)).collect();
            let px = |v: f64| (v - lo) / (hi - lo) * plot_h;
            let made = make_ticks(keys, values, px, |_| m.th + 2.0);
            ys.push(((lo, hi), made));
        }
        // Horizontal room is shared so that stacked plot areas align.
        let label_w = ys
            .iter()
            .flat_map(|y| &y.1)
            .map(|(_, l)| text_width(l, &m.body))
            .fold(0.0, f64::max);
        let desc = match panels.iter().all(|p| p.y_label.is_empty()) {
            true => 0.0,
            false => m.th + 6.0 * m.s,
        };
        let y_area = (label_w + 10.0 * m.s + desc).ceil();
        let plot_w = w - m.pad - y_area - m.right;
        if plot_w < 2.0 * m.th {
            return (Vec::new(), 0.0);
        }
        // X ranges: union over each shared group (a run of panels ending at a shown axis).
        let mut out = Vec::with_capacity(n);
        let (mut start, mut y) = (0, top);
        for i in (0..n).filter(|i| show_x[*i]) {
            let (group, p) = (&panels[start..=i], &panels[i]);
            let marks = group.iter().flat_map(|p| p.vlines.iter().map(|v| v.x));
            let xv: Vec<f64> = group
                .iter()
                .flat_map(|p| coords(p, |q| q.0))
                .chain(marks)
                .collect();
            let (lo, hi) = axis_range(&xv, p.log_x, p.x_range);
            let target = (plot_w / (70.0 * m.s)).clamp(2.0, 10.0) as usize;
            let values = match p.log_x {
                true => log_ticks(lo, hi, target),
                false => nice_ticks(lo, hi, target),
            };
            let values: Vec<f64> = values
                .into_iter()
                .filter(|v| to_axis(*v, p.log_x).is_finite())
                .collect();
            let keys = values.iter().map(|v| to_axis(*v, p.log_x)).collect();
            let px = |v: f64| (v - lo) / (hi - lo) * plot_w;
            let extent = |l: &str| text_width(l, &m.body) + 8.0 * m.s;
            let x_ticks = make_ticks(keys, values, px, extent);
            for j in start..=i {
                let height = overhead(j) + plot_h;
                out.push(PanelLayout {
                    top: y,
                    height,
                    x_area: x_area(j),
                    plot_w,
                    xr: (lo, hi),
                    yr: ys[j].0,
                    x_ticks: x_ticks.clone(),
                    y_ticks: ys[j].1.clone(),
                    show_x: show_x[j],
                });
                y += height;
            }
            start = i + 1;
        }
        (out, y_area)
    }

    /// Draws the figure onto `root`; returns where each panel's plot area landed.
    fn render<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> DrawResult<Vec<Placed>, DB> {
        root.fill(&rgb(Color::WHITE))?;
        let m = Metrics::new(self.size());
        let w = self.size().0;
        let mut top = 0.0;
        let title = truncate(&self.title, w as f64 - 2.0 * m.pad, &m.title);
        if !title.is_empty() {
            let below = root.titled(&title, m.title.clone())?;
            top = (below.get_base_pixel().1 - root.get_base_pixel().1) as f64;
        }
        let (layouts, y_area) = self.layout(&m, top);
        let mut placed = Vec::with_capacity(layouts.len());
        for (p, l) in self.panels.iter().zip(&layouts) {
            let area = root
                .clone()
                .shrink((0, l.top as i32), (w, l.height.round() as u32));
            placed.push(draw_panel(root, &area, &m, p, l, y_area)?);
        }
        Ok(placed)
    }
}

/// What a panel drew, for placing its legend: pixel points and marker-label boxes.
#[derive(Default)]
struct Drawn {
    points: Vec<Pt>,
    labels: Vec<Bx>,
}

/// Whether boxes (left, top, right, bottom) touch.
fn overlaps(a: Bx, b: Bx) -> bool {
    a.0 <= b.2 && a.2 >= b.0 && a.1 <= b.3 && a.3 >= b.1
}

fn draw_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    m: &Metrics,
    p: &Panel,
    l: &PanelLayout,
    y_area: f64,
) -> DrawResult<Placed, DB> {
    let (xr, yr) = (l.xr, l.yr);
    let mut builder = ChartBuilder::on(area);
    builder
        .margin_top(m.margin as u32)
        .margin_bottom(m.margin as u32)
        .margin_left(m.pad as u32)
        .margin_right(m.right as u32)
        .x_label_area_size(l.x_area as u32)
        .y_label_area_size(y_area as u32);
    let caption = truncate(&p.title, l.plot_w, &m.body);
    if !caption.is_empty() {
        builder.caption(&caption, m.body.clone());
    }
    let key = |t: &[(f64, String)]| t.iter().map(|(k, _)| *k).collect::<Vec<_>>();
    let mut chart = builder.build_cartesian_2d(
        Axis(xr.0, xr.1, key(&l.x_ticks)),
        Axis(yr.0, yr.1, key(&l.y_ticks)),
    )?;
    let (px, py) = chart.plotting_area().get_pixel_range();
    let mut placed = Placed {
        log_x: p.log_x,
        log_y: p.log_y,
        xr,
        yr,
        px: (px.start, px.end - 1),
        py: (py.end - 1, py.start),
        x_labels: l.show_x,
        tips: Vec::new(),
    };
    let (x0, x1, y0, y1) = (
        px.start as f64,
        (px.end - 1) as f64,
        py.start as f64,
        (py.end - 1) as f64,
    );
    // Grid, ticks, tick labels and axis descriptions.
    let x_fmt = |v: &f64| label_at(&l.x_ticks, *v);
    let y_fmt = |v: &f64| label_at(&l.y_ticks, *v);
    let x_desc = truncate(&p.x_label, l.plot_w, &m.body);
    let y_desc = truncate(&p.y_label, y1 - y0, &m.body);
    let mut mesh = chart.configure_mesh();
    mesh.bold_line_style(rgb(GRID))
        .axis_style(rgb(AXIS))
        .label_style(m.body.clone())
        .axis_desc_style(m.body.clone())
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .set_all_tick_mark_size((4.0 * m.s) as u32);
    if l.show_x && !x_desc.is_empty() {
        mesh.x_desc(x_desc);
    }
    if !y_desc.is_empty() {
        mesh.y_desc(y_desc);
    }
    mesh.draw()?;
    let frame = [(xr.0, yr.0), (xr.1, yr.1)];
    chart
        .plotting_area()
        .draw(&Rectangle::new(frame, rgb(AXIS).stroke_width(1)))?;
    // Vertical markers, labels stacked greedily in up to three rows along the top.
    let mut drawn = Drawn::default();
    let rows = ((y1 - y0) / (m.th + 2.0)).clamp(0.0, 3.0) as usize;
    let mut row_end = vec![f64::NEG_INFINITY; rows];
    let mut vl: Vec<(f64, &str)> = p
        .vlines
        .iter()
        .map(|v| (to_axis(v.x, p.log_x), v.label.as_str()))
        .filter(|(t, _)| *t >= xr.0 && *t <= xr.1)
        .collect();
    vl.sort_by(|a, b| a.0.total_cmp(&b.0));
    let dash = rgb(MARKER).stroke_width(1);
    for (t, label) in vl {
        let line = [(t, yr.0), (t, yr.1)];
        let (dl, gap) = ((5.0 * m.s) as i32, (4.0 * m.s) as i32);
        chart.draw_series(DashedLineSeries::new(line, dl, gap, dash))?;
        let x = placed.axis_pixel((t, yr.1)).0;
        let (room_r, room_l) = (x1 - x - 5.0, x - x0 - 5.0);
        let right = text_width(label, &m.marker) <= room_r || room_r >= room_l;
        let text = truncate(label, if right { room_r } else { room_l }, &m.marker);
        let tw = text_width(&text, &m.marker);
        if text.is_empty() || rows == 0 {
            continue;
        }
        let a = if right { x + 3.0 } else { x - 3.0 - tw };
        let least = (0..rows).min_by(|&i, &j| row_end[i].total_cmp(&row_end[j]));
        let row = (0..rows).find(|&k| row_end[k] < a).or(least).unwrap_or(0);
        row_end[row] = a + tw + 6.0 * m.s;
        let y = y0 + 3.0 + row as f64 * (m.th + 2.0);
        root.draw(&Text::new(text, (a as i32, y as i32), m.marker.clone()))?;
        drawn.labels.push((a, y, a + tw, y + m.th));
    }
    // Series, clipped to the axis ranges in data space.
    let bounds = Rect(xr.0, yr.0, xr.1, yr.1);
    let to_px = |q: Pt| placed.axis_pixel(q);
    let mut panel_tips = Vec::new();
    let (sw, legend_dot) = (14.0 * m.s, (m.th / 2.0 - 1.0).max(1.0));
    let mut named = Vec::new();
    for s in &p.series {
        let color = rgb(s.color);
        let width = if s.width.is_finite() {
            s.width.round().clamp(1.0, 32.0)
        } else {
            1.0
        } as u32;
        let radius = if s.radius.is_finite() {
            s.radius.round().clamp(0.0, 64.0)
        } else {
            0.0
        } as u32;
        let on_axis = |(x, y): Pt| (to_axis(x, p.log_x), to_axis(y, p.log_y));
        let anno = match s.kind {
            SeriesKind::Scatter => {
                let shown: Vec<(usize, Pt)> = s
                    .points
                    .iter()
                    .enumerate()
                    .filter(|(_, q)| plottable(**q, p.log_x, p.log_y))
                    .map(|(i, q)| (i, on_axis(*q)))
                    .filter(|(_, q)| bounds.contains(*q, 0.0))
                    .collect();
                let text_of = |v: &[String], i: usize| v.get(i).filter(|t| !t.is_empty()).cloned();
                let tips = shown.iter().map(|(i, _)| text_of(&s.tips, *i));
                panel_tips.extend(tips);
                for (i, q) in &shown {
                    let Some(label) = text_of(&s.labels, *i) else {
                        continue;
                    };
                    // Right of the point, or left of it where the right has less room.
                    let (x, y) = to_px(*q);
                    let gap = radius as f64 + 3.0 * m.s;
                    let (room_r, room_l) = (x1 - x - gap, x - x0 - gap);
                    let right = text_width(&label, &m.marker) <= room_r || room_r >= room_l;
                    let room = if right { room_r } else { room_l };
                    let text = truncate(&label, room.max(0.0), &m.marker);
                    if text.is_empty() {
                        continue;
                    }
                    let tw = text_width(&text, &m.marker);
                    let a = if right { x + gap } else { x - gap - tw };
                    let top = y - m.th / 2.0;
                    root.draw(&Text::new(
                        text.clone(),
                        (a as i32, top as i32),
                        m.marker.clone(),
                    ))?;
                    drawn.labels.push((a, top, a + tw, top + m.th));
                }
                let pts: Vec<Pt> = shown.into_iter().map(|(_, q)| q).collect();
                drawn.points.extend(pts.iter().map(|q| to_px(*q)));
                let dots = pts
                    .into_iter()
                    .map(|q| Circle::new(q, radius, color.filled()));
                let anno = chart.draw_series(dots)?;
                let r = (radius as f64).min(legend_dot) as u32;
                let c = (sw / 2.0) as i32;
                // A square legend swatch: every `<circle>` in the SVG is a data point.
                let r = r.max(1) as i32;
                // Only a named series gets a legend row (plotters draws a row for any
                // series with a swatch, even without a label: a blank entry).
                if !s.name.is_empty() {
                    anno.legend(move |(x, y)| {
                        Rectangle::new([(x + c - r, y - r), (x + c + r, y + r)], color.filled())
                    });
                }
                anno
            }
            kind => {
                let path: Vec<Pt> = if kind == SeriesKind::Line {
                    s.points.iter().map(|q| on_axis(*q)).collect()
                } else {
                    let mut pts: Vec<Pt> =
                        finite_points(s, p.log_x, p.log_y).map(on_axis).collect();
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    let corners = pts.windows(2).flat_map(|w| [(w[1].0, w[0].1), w[1]]);
                    pts.first().copied().into_iter().chain(corners).collect()
                };
                let runs = clip_path(&path, &bounds);
                drawn
                    .points
                    .extend(runs.iter().flatten().map(|q| to_px(*q)));
                let style = color.stroke_width(width);
                let anno =
                    chart.draw_series(runs.into_iter().map(|r| PathElement::new(r, style)))?;
                let (len, lw) = (
                    sw as i32,
                    color.stroke_width(width.min(legend_dot as u32).max(1)),
                );
                if !s.name.is_empty() {
                    anno.legend(move |(x, y)| PathElement::new(vec![(x, y), (x + len, y)], lw));
                }
                anno
            }
        };
        if !s.name.is_empty() {
            let name = truncate(&s.name, ((x1 - x0) * 0.5 - sw - 16.0).max(0.0), &m.body);
            anno.label(name.clone());
            named.push(name);
        }
    }
    // The legend, in whichever plot corner covers the fewest points and marker labels.
    let margin = 6.0 * m.s;
    let legend_w = named
        .iter()
        .map(|n| text_width(n, &m.body))
        .fold(0.0, f64::max);
    let (bw, bh) = (
        legend_w + sw + 8.0 * m.s + 2.0 * margin,
        named.len() as f64 * m.th * 1.25 + 2.0 * margin,
    );
    if !named.is_empty() && bw <= x1 - x0 - 10.0 && bh <= y1 - y0 - 10.0 {
        use SeriesLabelPosition::{LowerLeft, LowerRight, UpperLeft, UpperRight};
        let (left, right, top, bottom) = (x0 + 5.0, x1 - 5.0 - bw, y0 + 5.0, y1 - 5.0 - bh);
        let corners = [
            (UpperRight, right, top),
            (UpperLeft, left, top),
            (LowerRight, right, bottom),
            (LowerLeft, left, bottom),
        ];
        let cost = |(x, y): (f64, f64)| {
            let b = (x, y, x + bw, y + bh);
            let pts = drawn
                .points
                .iter()
                .filter(|q| overlaps((q.0, q.1, q.0, q.1), b));
            pts.count() + 1000 * drawn.labels.iter().filter(|o| overlaps(**o, b)).count()
        };
        let best = corners.into_iter().min_by_key(|c| cost((c.1, c.2)));
        chart
            .configure_series_labels()
            .position(best.map_or(UpperRight, |c| c.0))
            .legend_area_size((sw + 8.0 * m.s) as u32)
            .margin(margin as u32)
            .label_font(m.body.clone())
            .background_style(rgb(Color::WHITE).filled())
            .border_style(rgb(LEGEND_EDGE))
            .draw()?;
    }
    placed.tips = panel_tips;
    Ok(placed)
}

/// Liang–Barsky: the part of segment a→b inside `r`, if any.
fn clip(a: Pt, b: Pt, r: &Rect) -> Option<(Pt, Pt)> {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    for (p, q) in [
        (-dx, a.0 - r.0),
        (dx, r.2 - a.0),
        (-dy, a.1 - r.1),
        (dy, r.3 - a.1),
    ] {
        if p == 0.0 && q < 0.0 {
            return None;
        } else if p < 0.0 {
            t0 = t0.max(q / p);
        } else if p > 0.0 {
            t1 = t1.min(q / p);
        }
    }
    let at = |t: f64| (a.0 + t * dx, a.1 + t * dy);
    (t0 <= t1).then(|| (at(t0), at(t1)))
}

/// Splits a pixel path at non-finite points, clips it to `r` and returns visible runs.
fn clip_path(pts: &[Pt], r: &Rect) -> Vec<Vec<Pt>> {
    let ok = |p: &Pt| p.0.is_finite() && p.1.is_finite();
    let mut runs: Vec<Vec<Pt>> = Vec::new();
    let mut joined = false;
    for w in pts.windows(2) {
        let Some((a, b)) = w.iter().all(ok).then(|| clip(w[0], w[1], r)).flatten() else {
            joined = false;
            continue;
        };
        match runs.last_mut() {
            Some(run) if joined && a == w[0] => run.push(b),
            _ => runs.push(vec![a, b]),
        }
        joined = b == w[1];
    }
    // A lone visible point still shows as a dot.
    match pts {
        [p] if ok(p) && r.contains(*p, 0.0) => vec![vec![*p, *p]],
        _ => runs,
    }
}

#[cfg(test)]
mod tests;
