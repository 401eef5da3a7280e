//! Small, dependency-light plots rendered identically to SVG (hand-written XML) and PNG
//! (an own rasteriser with an embedded 5×9 bitmap font, encoded by the `png` crate).
//!
//! A [`Figure`] stacks [`Panel`]s vertically; a panel holds line, scatter and step
//! [`Series`] plus labelled dashed vertical markers ([`VLine`]). Adjacent panels with the
//! same x label, log flag and x range share one x axis (union range, tick labels only on
//! the lowest). Ticks are "nice" (1/2/5 × 10^k) with compact labels (`1.2k`, `3.4M`).
//! Non-finite points are skipped (a line breaks there), as are x ≤ 0 on a log axis and
//! points or markers outside an explicit range; degenerate ranges are padded. Rendering
//! never panics on user data.
//!
//! ```no_run
//! use kiln::observe::plot::{Color, Figure, Panel, Series};
//! let mem = vec![(0.0, 120.0), (5.0, 340.0)];
//! let fig = Figure::new("training job", 900, 600)
//!     .panel(Panel::new("", "time (s)", "memory (MB)").series(Series::line("rss", Color::BLUE, mem)).vline(2.5, "train"));
//! let (svg_path, png_path) = fig.save(std::path::Path::new("runs/trace"))?; // runs/trace.svg, .png
//! # Ok::<(), std::io::Error>(())
//! ```

mod font;
mod raster;
mod svg;

use Anchor::{End, Middle, Start};
use std::io::{Error, ErrorKind, Write};
use std::path::{Path, PathBuf};

/// An sRGB colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Color(pub u8, pub u8, pub u8);

impl Color {
    pub const BLACK: Color = Color(0, 0, 0);
    pub const WHITE: Color = Color(255, 255, 255);
    pub const BLUE: Color = Color(31, 119, 180);
    pub const RED: Color = Color(214, 39, 40);
    pub const GREEN: Color = Color(44, 160, 44);
    pub const ORANGE: Color = Color(255, 127, 14);
    pub const PURPLE: Color = Color(148, 103, 189);
    pub const GRAY: Color = Color(127, 127, 127);
}

/// Largest width or height rendered; larger (and zero) sizes are clamped to 1..=MAX_SIDE.
pub const MAX_SIDE: u32 = 8192;

const TEXT: Color = Color(30, 30, 30);
const AXIS: Color = Color(60, 60, 60);
const GRID: Color = Color(232, 232, 232);
const MARKER: Color = Color(90, 90, 90);
const LEGEND_EDGE: Color = Color(170, 170, 170);

/// How a series is drawn. `Step` draws stairs (horizontal, then vertical) through the
/// points sorted by x, as for a Pareto front.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesKind {
    Line,
    Scatter,
    Step,
}

#[derive(Clone, Debug)]
pub struct Series {
    /// Legend entry; an empty name keeps the series out of the legend.
    pub name: String,
    pub kind: SeriesKind,
    pub color: Color,
    pub points: Vec<(f64, f64)>,
    /// Scatter point radius in pixels (default 3).
    pub radius: f64,
    /// Line width in pixels (default 2).
    pub width: f64,
}

impl Series {
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
        }
    }
    pub fn line(name: impl Into<String>, color: Color, points: Vec<(f64, f64)>) -> Self {
        Self::new(name, SeriesKind::Line, color, points)
    }
    pub fn scatter(name: impl Into<String>, color: Color, points: Vec<(f64, f64)>) -> Self {
        Self::new(name, SeriesKind::Scatter, color, points)
    }
    pub fn step(name: impl Into<String>, color: Color, points: Vec<(f64, f64)>) -> Self {
        Self::new(name, SeriesKind::Step, color, points)
    }
    pub fn radius(self, radius: f64) -> Self {
        Series { radius, ..self }
    }
    pub fn width(self, width: f64) -> Self {
        Series { width, ..self }
    }
}

/// A labelled, dashed vertical marker (e.g. a stage boundary).
#[derive(Clone, Debug)]
pub struct VLine {
    pub x: f64,
    pub label: String,
}

#[derive(Clone, Debug, Default)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub vlines: Vec<VLine>,
    pub log_x: bool,
    /// Fixed axis ranges; `None` fits the data (and markers) with 5% padding.
    pub x_range: Option<(f64, f64)>,
    pub y_range: Option<(f64, f64)>,
}

impl Panel {
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
    pub fn series(mut self, s: Series) -> Self {
        self.series.push(s);
        self
    }
    pub fn vline(mut self, x: f64, label: impl Into<String>) -> Self {
        self.vlines.push(VLine {
            x,
            label: label.into(),
        });
        self
    }
    pub fn log_x(self, log_x: bool) -> Self {
        Panel { log_x, ..self }
    }
    pub fn x_range(self, lo: f64, hi: f64) -> Self {
        Panel {
            x_range: Some((lo, hi)),
            ..self
        }
    }
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
    pub title: String,
    pub width: u32,
    pub height: u32,
    pub panels: Vec<Panel>,
}

impl Figure {
    pub fn new(title: impl Into<String>, width: u32, height: u32) -> Self {
        Figure {
            title: title.into(),
            width,
            height,
            panels: Vec::new(),
        }
    }
    pub fn panel(mut self, p: Panel) -> Self {
        self.panels.push(p);
        self
    }

    /// The figure as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let (w, h) = self.size();
        let mut c = svg::Svg::new(w, h, Color::WHITE);
        self.draw(&mut c);
        c.finish()
    }

    /// The figure as an 8-bit RGB PNG of `width × height` (clamped to 1..=MAX_SIDE).
    pub fn to_png(&self) -> Vec<u8> {
        self.raster().encode_png().unwrap_or_default()
    }

    fn raster(&self) -> raster::Raster {
        let (w, h) = self.size();
        let mut r = raster::Raster::new(w, h, Color::WHITE);
        self.draw(&mut r);
        r
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
        write_atomic(&svg_path, self.to_svg().as_bytes())?;
        let png = self
            .raster()
            .encode_png()
            .map_err(|e| ctx(&png_path, "encoding", e))?;
        write_atomic(&png_path, &png)?;
        Ok((svg_path, png_path))
    }

    fn size(&self) -> (u32, u32) {
        (
            self.width.clamp(1, MAX_SIDE),
            self.height.clamp(1, MAX_SIDE),
        )
    }
}

fn ctx(path: &Path, what: &str, e: Error) -> Error {
    Error::new(
        e.kind(),
        format!("{what} plot file {}: {e}", path.display()),
    )
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let no_name = || Error::new(ErrorKind::InvalidInput, "path has no file name");
    let name = path
        .file_name()
        .ok_or_else(|| ctx(path, "writing", no_name()))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp_name = format!(
        ".{}.tmp.{}.{seq}",
        name.to_string_lossy(),
        std::process::id()
    );
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(ctx(path, "writing", e));
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all(); // best effort: persist the rename
    }
    Ok(())
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

/// `s` cut to fit `max_px` at `scale`, ending in `..` when cut.
fn truncate(s: &str, max_px: f64, scale: u32) -> String {
    if font::text_width(s, scale) as f64 <= max_px {
        return s.to_string();
    }
    let gap = (font::ADVANCE - font::GLYPH_W) as f64;
    let n = ((max_px / scale as f64 + gap) / font::ADVANCE as f64)
        .floor()
        .max(0.0) as usize;
    if n <= 2 {
        return s.chars().take(n).collect();
    }
    s.chars().take(n - 2).chain("..".chars()).collect()
}

// ---------------------------------------------------------------------------------------
// Drawing surface shared by the SVG writer and the rasteriser

type Pt = (f64, f64);
/// A box: left, top, right, bottom.
type Bx = (f64, f64, f64, f64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Anchor {
    Start,
    Middle,
    End,
}

/// Coordinates in pixels, origin top-left. `text` puts the top of the text box at `y`;
/// `vtext` reads bottom-to-top with its top edge at `x`, centred on `y`.
trait Canvas {
    fn line(&mut self, a: Pt, b: Pt, c: Color, width: f64, dashed: bool);
    fn polyline(&mut self, pts: &[Pt], c: Color, width: f64);
    fn circle(&mut self, center: Pt, r: f64, c: Color);
    fn rect(&mut self, r: (f64, f64, f64, f64), fill: Option<Color>, stroke: Option<Color>);
    fn text(&mut self, at: Pt, s: &str, scale: u32, c: Color, anchor: Anchor);
    fn vtext(&mut self, at: Pt, s: &str, scale: u32, c: Color);
    fn vline_marker(&mut self, a: Pt, b: Pt, c: Color) {
        self.line(a, b, c, 1.0, true);
    }
    fn legend_dot(&mut self, center: Pt, r: f64, c: Color) {
        self.circle(center, r, c);
    }
}

/// Maps data values to pixels; `lo`/`hi` are in log10 space on a log axis.
#[derive(Clone, Copy, Debug)]
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    p0: f64,
    p1: f64,
}

impl Scale {
    fn new(lo: f64, hi: f64, log: bool, p0: f64, p1: f64) -> Self {
        Scale {
            lo,
            hi,
            log,
            p0,
            p1,
        }
    }
    fn map(&self, v: f64) -> f64 {
        let t = if !self.log {
            v
        } else if v > 0.0 {
            v.log10()
        } else {
            f64::NAN
        };
        self.p0 + (t - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)
    }
}

/// Plot-area rectangle: left, top, right, bottom in pixels.
#[derive(Clone, Copy, Debug)]
struct Rect(f64, f64, f64, f64);

impl Rect {
    fn contains(&self, (x, y): Pt, slack: f64) -> bool {
        x >= self.0 - slack && x <= self.2 + slack && y >= self.1 - slack && y <= self.3 + slack
    }
}

/// Text scale (`s` body, `ts` title), character advance and cell height, outer padding.
struct Metrics {
    s: u32,
    ts: u32,
    cw: f64,
    ch: f64,
    pad: f64,
}

/// What a panel drew, for placing its legend: pixel points and label boxes.
#[derive(Default)]
struct Drawn {
    points: Vec<Pt>,
    labels: Vec<Bx>,
}

struct PanelLayout {
    plot: Rect,
    xs: Scale,
    ys: Scale,
    x_ticks: Vec<(f64, String)>,
    y_ticks: Vec<(f64, String)>,
    show_x_labels: bool,
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

fn finite_points(s: &Series, log_x: bool) -> impl Iterator<Item = Pt> + '_ {
    let ok = move |&(x, y): &Pt| x.is_finite() && y.is_finite() && (!log_x || x > 0.0);
    s.points.iter().copied().filter(ok)
}

/// Labelled ticks; labels that would collide along the axis are thinned to every n-th.
fn make_ticks(ticks: Vec<f64>, sc: &Scale, m: &Metrics, horizontal: bool) -> Vec<(f64, String)> {
    let ticks: Vec<f64> = ticks
        .into_iter()
        .filter(|t| sc.map(*t).is_finite())
        .collect();
    let mut labels = tick_labels(&ticks);
    let extent = |i: usize| match horizontal {
        true => font::text_width(&labels[i], m.s) as f64 + m.cw,
        false => m.ch + 2.0,
    };
    let fits = |every: usize| {
        let kept: Vec<usize> = (0..ticks.len()).step_by(every).collect();
        kept.windows(2).all(|w| {
            let d = (sc.map(ticks[w[1]]) - sc.map(ticks[w[0]])).abs();
            d >= (extent(w[0]) + extent(w[1])) / 2.0
        })
    };
    let every = (1..=ticks.len().max(1)).find(|e| fits(*e)).unwrap_or(1);
    labels
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| i % every != 0)
        .for_each(|(_, l)| l.clear());
    ticks.into_iter().zip(labels).collect()
}

impl Figure {
    fn metrics(&self) -> Metrics {
        let (w, h) = self.size();
        let s = if w >= 1400 && h >= 800 { 2 } else { 1 };
        let (cw, ch) = ((font::ADVANCE * s) as f64, (font::GLYPH_H * s) as f64);
        Metrics {
            s,
            ts: if w >= 300 { 2 } else { 1 },
            cw,
            ch,
            pad: 8.0,
        }
    }

    fn layout(&self, m: &Metrics) -> Vec<PanelLayout> {
        let (w, h) = self.size();
        let (n, panels) = (self.panels.len(), &self.panels);
        // Panels i and i+1 share an x axis when their x label, log flag and range agree.
        let axis = |p: &Panel| (p.x_label.clone(), p.log_x, p.x_range);
        let show_x: Vec<bool> = (0..n)
            .map(|i| i + 1 == n || axis(&panels[i]) != axis(&panels[i + 1]))
            .collect();
        // Vertical: fixed overheads per panel, the rest split evenly between plot areas.
        let title_h = |p: &Panel| 4.0 + space(&p.title, m.ch + 2.0);
        let overhead = |i: usize| {
            let x_labels = 13.0 + m.ch + space(&panels[i].x_label, 4.0 + m.ch);
            title_h(&panels[i]) + if show_x[i] { x_labels } else { 10.0 }
        };
        let top = m.pad + space(&self.title, (font::GLYPH_H * m.ts) as f64 + 6.0);
        let fixed: f64 = (0..n).map(overhead).sum();
        let plot_h = ((h as f64 - top - m.pad - fixed) / n.max(1) as f64).max(1.0);
        let mut y = top;
        let mut rows = Vec::new();
        for (i, p) in panels.iter().enumerate() {
            let t = (y + title_h(p)).round() + 0.5;
            rows.push((t, ((t + plot_h).round() + 0.5).max(t + 1.0)));
            y += overhead(i) + plot_h;
        }
        // Y ranges and ticks per panel.
        let mut ys = Vec::new();
        for (p, &(t, b)) in panels.iter().zip(&rows) {
            let (lo, hi) = axis_range(&coords(p, |q| q.1).collect::<Vec<_>>(), false, p.y_range);
            let sc = Scale::new(lo, hi, false, b, t);
            let target = ((b - t) / (m.ch * 3.0)).clamp(2.0, 10.0) as usize;
            ys.push((sc, make_ticks(nice_ticks(lo, hi, target), &sc, m, false)));
        }
        // Horizontal margins are shared so that stacked plot areas align.
        let label_w = ys
            .iter()
            .flat_map(|y| &y.1)
            .map(|(_, l)| font::text_width(l, m.s));
        let y_label = if panels.iter().all(|p| p.y_label.is_empty()) {
            0.0
        } else {
            m.ch + 6.0
        };
        let l = (m.pad + y_label + label_w.max().unwrap_or(0) as f64 + 7.0).round() + 0.5;
        let r = ((w as f64 - m.pad - 3.0 * m.cw).round() + 0.5).max(l + 1.0);
        // X ranges: union over each shared group (a run of panels ending at a shown axis).
        let mut out = Vec::with_capacity(n);
        let mut start = 0;
        for i in (0..n).filter(|i| show_x[*i]) {
            let (group, p) = (&panels[start..=i], &panels[i]);
            let marks = group.iter().flat_map(|p| p.vlines.iter().map(|v| v.x));
            let xv: Vec<f64> = group
                .iter()
                .flat_map(|p| coords(p, |q| q.0))
                .chain(marks)
                .collect();
            let (lo, hi) = axis_range(&xv, p.log_x, p.x_range);
            let xs = Scale::new(lo, hi, p.log_x, l, r);
            let target = ((r - l) / (m.cw * 10.0)).clamp(2.0, 10.0) as usize;
            let raw = if p.log_x {
                log_ticks(lo, hi, target)
            } else {
                nice_ticks(lo, hi, target)
            };
            let x_ticks = make_ticks(raw, &xs, m, true);
            for j in start..=i {
                let (plot, (ys, y_ticks)) = (Rect(l, rows[j].0, r, rows[j].1), ys[j].clone());
                let (x_ticks, show_x_labels) = (x_ticks.clone(), show_x[j]);
                out.push(PanelLayout {
                    plot,
                    xs,
                    ys,
                    x_ticks,
                    y_ticks,
                    show_x_labels,
                });
            }
            start = i + 1;
        }
        out
    }

    fn draw<C: Canvas>(&self, c: &mut C) {
        let m = self.metrics();
        let w = self.size().0 as f64;
        let title = truncate(&self.title, w - 2.0 * m.pad, m.ts);
        c.text((w / 2.0, m.pad), &title, m.ts, TEXT, Middle);
        for (p, l) in self.panels.iter().zip(self.layout(&m)) {
            draw_panel(c, &m, p, &l);
        }
    }
}

/// `v` when `s` is shown (non-empty), else 0: the room a label takes.
fn space(s: &str, v: f64) -> f64 {
    if s.is_empty() { 0.0 } else { v }
}

/// One coordinate of every plottable point of a panel.
fn coords(p: &Panel, f: fn(Pt) -> f64) -> impl Iterator<Item = f64> + '_ {
    p.series
        .iter()
        .flat_map(|s| finite_points(s, p.log_x))
        .map(f)
}

/// Whether boxes (left, top, right, bottom) touch.
fn overlaps(a: Bx, b: Bx) -> bool {
    a.0 <= b.2 && a.2 >= b.0 && a.1 <= b.3 && a.3 >= b.1
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

fn draw_panel<C: Canvas>(c: &mut C, m: &Metrics, p: &Panel, l: &PanelLayout) {
    let Rect(x0, y0, x1, y1) = l.plot;
    let snap = |v: f64| v.floor() + 0.5;
    // Grid, ticks and tick labels.
    for (v, label) in &l.x_ticks {
        let x = snap(l.xs.map(*v));
        if x >= x0 && x <= x1 {
            c.line((x, y0), (x, y1), GRID, 1.0, false);
            c.line((x, y1), (x, y1 + 4.0), AXIS, 1.0, false);
            if l.show_x_labels {
                c.text((x, y1 + 7.0), label, m.s, TEXT, Middle);
            }
        }
    }
    for (v, label) in &l.y_ticks {
        let y = snap(l.ys.map(*v));
        if y >= y0 && y <= y1 {
            c.line((x0, y), (x1, y), GRID, 1.0, false);
            c.line((x0 - 4.0, y), (x0, y), AXIS, 1.0, false);
            let top = y - (font::ASCENT * m.s) as f64 / 2.0;
            c.text((x0 - 7.0, top), label, m.s, TEXT, End);
        }
    }
    c.rect((x0, y0, x1 - x0, y1 - y0), None, Some(AXIS));
    // Vertical markers, labels stacked greedily in up to three rows along the top.
    let mut drawn = Drawn::default();
    let rows = ((y1 - y0) / (m.ch + 2.0)).clamp(0.0, 3.0) as usize;
    let mut row_end = vec![f64::NEG_INFINITY; rows];
    let mut vl: Vec<&VLine> = p.vlines.iter().filter(|v| v.x.is_finite()).collect();
    vl.sort_by(|a, b| a.x.total_cmp(&b.x));
    for v in vl {
        let x = snap(l.xs.map(v.x));
        if !(x >= x0 - 0.5 && x <= x1 + 0.5) {
            continue;
        }
        c.vline_marker((x, y0), (x, y1), MARKER);
        let (room_r, room_l) = (x1 - x - 5.0, x - x0 - 5.0);
        let right = font::text_width(&v.label, m.s) as f64 <= room_r || room_r >= room_l;
        let text = truncate(&v.label, if right { room_r } else { room_l }, m.s);
        let tw = font::text_width(&text, m.s) as f64;
        if text.is_empty() || rows == 0 {
            continue;
        }
        let a = if right { x + 3.0 } else { x - 3.0 - tw };
        let least = (0..rows).min_by(|&i, &j| row_end[i].total_cmp(&row_end[j]));
        let row = (0..rows).find(|&k| row_end[k] < a).or(least).unwrap_or(0);
        row_end[row] = a + tw + m.cw;
        let y = y0 + 3.0 + row as f64 * (m.ch + 2.0);
        c.text((a, y), &text, m.s, MARKER, Start);
        drawn.labels.push((a, y, a + tw, y + m.ch));
    }
    // Series.
    let px = |(x, y): Pt| (l.xs.map(x), l.ys.map(y));
    for s in &p.series {
        let path: Vec<Pt> = match s.kind {
            SeriesKind::Scatter => {
                let pts = finite_points(s, p.log_x).map(px);
                for q in pts.filter(|q| l.plot.contains(*q, 0.5)) {
                    c.circle(q, s.radius, s.color);
                    drawn.points.push(q);
                }
                continue;
            }
            SeriesKind::Line => s.points.iter().map(|q| px(*q)).collect(),
            SeriesKind::Step => {
                let mut pts: Vec<Pt> = finite_points(s, p.log_x).collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let corners = pts.windows(2).flat_map(|w| [(w[1].0, w[0].1), w[1]]);
                pts.first()
                    .copied()
                    .into_iter()
                    .chain(corners)
                    .map(px)
                    .collect()
            }
        };
        for run in clip_path(&path, &l.plot) {
            drawn.points.extend(&run);
            c.polyline(&run, s.color, s.width);
        }
    }
    draw_legend(c, m, p, &l.plot, &drawn);
    // Axis labels and panel title.
    let (mid_x, pw, ph) = ((x0 + x1) / 2.0, x1 - x0, y1 - y0);
    let (x_label, y_label) = (truncate(&p.x_label, pw, m.s), truncate(&p.y_label, ph, m.s));
    if l.show_x_labels {
        c.text((mid_x, y1 + 11.0 + m.ch), &x_label, m.s, TEXT, Middle);
    }
    c.vtext((m.pad, (y0 + y1) / 2.0), &y_label, m.s, TEXT);
    c.text(
        (mid_x, y0 - m.ch - 3.0),
        &truncate(&p.title, pw, m.s),
        m.s,
        TEXT,
        Middle,
    );
}

/// A legend box in whichever plot corner covers the fewest drawn points and marker labels.
fn draw_legend<C: Canvas>(c: &mut C, m: &Metrics, p: &Panel, r: &Rect, drawn: &Drawn) {
    let entries: Vec<&Series> = p.series.iter().filter(|s| !s.name.is_empty()).collect();
    let (sw, row_h) = (14.0 * m.s as f64, m.ch + 3.0);
    let max_text = ((r.2 - r.0) * 0.5 - sw - 16.0).max(0.0);
    let names: Vec<String> = entries
        .iter()
        .map(|s| truncate(&s.name, max_text, m.s))
        .collect();
    let tw = names
        .iter()
        .map(|n| font::text_width(n, m.s))
        .max()
        .unwrap_or(0);
    let (bw, bh) = (
        (sw + tw as f64 + 17.0).round(),
        (entries.len() as f64 * row_h + 5.0).round(),
    );
    if entries.is_empty() || bw > r.2 - r.0 - 8.0 || bh > r.3 - r.1 - 8.0 {
        return;
    }
    let cost = |&(x, y): &Pt| {
        let b = (x, y, x + bw, y + bh);
        let pts = drawn
            .points
            .iter()
            .filter(|q| overlaps((q.0, q.1, q.0, q.1), b))
            .count();
        pts + 1000 * drawn.labels.iter().filter(|o| overlaps(**o, b)).count()
    };
    let (left, right, top, bottom) = (r.0 + 4.0, r.2 - 4.0 - bw, r.1 + 4.0, r.3 - 4.0 - bh);
    let corners = [(right, top), (left, top), (right, bottom), (left, bottom)];
    let (bx, by) = corners.into_iter().min_by_key(cost).unwrap_or(corners[0]);
    let (bx, by) = (bx.floor() + 0.5, by.floor() + 0.5);
    c.rect((bx, by, bw, bh), Some(Color::WHITE), Some(LEGEND_EDGE));
    for (i, (s, name)) in entries.iter().zip(&names).enumerate() {
        let top = by + 4.0 + i as f64 * row_h;
        let (x, mid) = (bx + 6.0, (top + m.ch / 2.0 - 1.0).floor() + 0.5);
        let (dot, lw) = (s.radius.min(row_h / 2.0 - 1.0), s.width.min(row_h / 2.0));
        match s.kind {
            SeriesKind::Scatter => c.legend_dot((x + sw / 2.0, mid), dot, s.color),
            _ => c.line((x, mid), (x + sw, mid), s.color, lw, false),
        }
        c.text((x + sw + 5.0, top), name, m.s, TEXT, Start);
    }
}

#[cfg(test)]
mod tests;
