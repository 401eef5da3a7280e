//! Hand-written SVG output. Text uses a monospace font sized so that its advance matches
//! the bitmap font (0.6 em = 6 px per scale), so layouts agree between SVG and PNG.

use super::{Anchor, Canvas, Color, Pt, font};
use std::fmt::Write;

pub struct Svg {
    out: String,
}

const FONTS: &str = "DejaVu Sans Mono, Menlo, Consolas, monospace";

impl Svg {
    pub fn new(w: u32, h: u32, bg: Color) -> Self {
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let ns = "http://www.w3.org/2000/svg";
        let view = format!(r#"width="{w}" height="{h}" viewBox="0 0 {w} {h}""#);
        let _ = writeln!(out, r#"<svg xmlns="{ns}" {view} font-family="{FONTS}">"#);
        let _ = writeln!(
            out,
            r#"<rect width="{w}" height="{h}" fill="{}"/>"#,
            hex(bg)
        );
        Svg { out }
    }

    pub fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }

    /// `y` is the top of the text box; SVG places text by its baseline.
    fn text_el(&mut self, (x, y): Pt, s: &str, scale: u32, c: Color, anchor: &str, extra: &str) {
        if s.is_empty() {
            return;
        }
        let (size, base) = (10 * scale, y + (font::ASCENT * scale) as f64);
        let attrs = format!(
            r#"font-size="{size}" fill="{}" text-anchor="{anchor}""#,
            hex(c)
        );
        let _ = writeln!(
            self.out,
            r#"<text x="{x:.1}" y="{base:.1}" {attrs}{extra}>{}</text>"#,
            escape(s)
        );
    }

    fn line_el(&mut self, a: Pt, b: Pt, c: Color, width: f64, extra: &str) {
        let (c, w) = (hex(c), width.round().clamp(1.0, 16.0));
        let xy = format!(
            r#"x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}""#,
            a.0, a.1, b.0, b.1
        );
        let _ = writeln!(
            self.out,
            r#"<line {extra}{xy} stroke="{c}" stroke-width="{w}"/>"#
        );
    }
}

pub fn hex(c: Color) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// Escapes text for XML content and attributes; characters XML 1.0 forbids become `?`.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            '\t' | '\n' | '\r' => o.push(ch),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => o.push('?'),
            c => o.push(c),
        }
    }
    o
}

impl Canvas for Svg {
    fn line(&mut self, a: Pt, b: Pt, c: Color, width: f64, dashed: bool) {
        self.line_el(
            a,
            b,
            c,
            width,
            if dashed {
                r#"stroke-dasharray="4 3" "#
            } else {
                ""
            },
        );
    }

    /// Markers carry `class="vline"` so that they can be found (and styled).
    fn vline_marker(&mut self, a: Pt, b: Pt, c: Color) {
        self.line_el(a, b, c, 1.0, r#"class="vline" stroke-dasharray="4 3" "#);
    }

    /// A fully rounded square, so that `<circle>` elements are exactly the data points.
    fn legend_dot(&mut self, (cx, cy): Pt, r: f64, c: Color) {
        let (r, c) = (r.clamp(0.5, 64.0), hex(c));
        let (x, y, d) = (cx - r, cy - r, 2.0 * r);
        let xy = format!(r#"x="{x:.1}" y="{y:.1}" width="{d:.1}" height="{d:.1}""#);
        let _ = writeln!(self.out, r#"<rect {xy} rx="{r:.1}" fill="{c}"/>"#);
    }

    fn polyline(&mut self, pts: &[Pt], c: Color, width: f64) {
        let p: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let (c, w) = (hex(c), width.round().clamp(1.0, 16.0));
        let style = format!(
            r#"stroke="{c}" stroke-width="{w}" stroke-linejoin="round" stroke-linecap="round""#
        );
        let _ = writeln!(
            self.out,
            r#"<polyline points="{}" fill="none" {style}/>"#,
            p.join(" ")
        );
    }

    fn circle(&mut self, (cx, cy): Pt, r: f64, c: Color) {
        let (r, c) = (r.clamp(0.5, 64.0), hex(c));
        let _ = writeln!(
            self.out,
            r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="{r:.1}" fill="{c}"/>"#
        );
    }

    fn rect(
        &mut self,
        (x, y, w, h): (f64, f64, f64, f64),
        fill: Option<Color>,
        stroke: Option<Color>,
    ) {
        let f = fill.map_or("none".to_string(), hex);
        let s = stroke.map_or(String::new(), |s| format!(r#" stroke="{}""#, hex(s)));
        let (w, h) = (w.max(0.0), h.max(0.0));
        let xy = format!(r#"x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}""#);
        let _ = writeln!(self.out, r#"<rect {xy} fill="{f}"{s}/>"#);
    }

    fn text(&mut self, at: Pt, s: &str, scale: u32, c: Color, anchor: Anchor) {
        let a = ["start", "middle", "end"][anchor as usize];
        self.text_el(at, s, scale, c, a, "");
    }

    fn vtext(&mut self, (x, y): Pt, s: &str, scale: u32, c: Color) {
        // Rotating -90° about (x, y) turns "down" into "right": the box's top edge is at x.
        let rot = format!(r#" transform="rotate(-90 {x:.1} {y:.1})""#);
        self.text_el((x, y), s, scale, c, "middle", &rot);
    }
}
