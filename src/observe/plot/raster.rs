//! A tiny RGB rasteriser (no anti-aliasing) and PNG encoding through the `png` crate.
//!
//! Pixel `(i, j)` covers `[i, i+1) × [j, j+1)`; a stroke or fill covers the pixels whose
//! centres fall inside it, so coordinates at half-integers give crisp 1 px lines.

use super::{Anchor, Canvas, Color, Pt, font};
use std::io::Error;

pub struct Raster {
    w: u32,
    h: u32,
    buf: Vec<u8>,
}

impl Raster {
    pub fn new(w: u32, h: u32, bg: Color) -> Self {
        let buf = [bg.0, bg.1, bg.2].repeat(w as usize * h as usize);
        Raster { w, h, buf }
    }

    #[cfg(test)]
    pub fn pixel(&self, x: u32, y: u32) -> Option<Color> {
        let i = (y as usize * self.w as usize + x as usize) * 3;
        (x < self.w && y < self.h).then(|| Color(self.buf[i], self.buf[i + 1], self.buf[i + 2]))
    }

    fn put(&mut self, x: i64, y: i64, c: Color) {
        if x >= 0 && y >= 0 && x < self.w as i64 && y < self.h as i64 {
            let i = (y as usize * self.w as usize + x as usize) * 3;
            self.buf[i..i + 3].copy_from_slice(&[c.0, c.1, c.2]);
        }
    }

    /// Fills the pixels whose centres lie in `[x0, x1) × [y0, y1)` (NaN fills nothing).
    fn fill(&mut self, x0: f64, y0: f64, x1: f64, y1: f64, c: Color) {
        let px = |v: f64, hi: u32| (v - 0.5).ceil().clamp(-1.0, hi as f64 + 1.0) as i64;
        let (i0, i1, j0, j1) = (
            px(x0, self.w),
            px(x1, self.w),
            px(y0, self.h),
            px(y1, self.h),
        );
        for j in j0..j1 {
            for i in i0..i1 {
                self.put(i, j, c);
            }
        }
    }

    /// Draws `s` with its text-space pixel (u, v) at (x0 + u, y0 + v), or, `vertical`,
    /// turned a quarter counter-clockwise to (x0 + v, y0 - u) so that it reads upwards.
    fn glyphs(&mut self, (x0, y0): (i64, i64), s: &str, scale: u32, c: Color, vertical: bool) {
        let sc = scale.max(1) as i64;
        for (n, ch) in s.chars().enumerate() {
            let ox = n as i64 * font::ADVANCE as i64 * sc;
            for (row, bits) in font::glyph(ch).iter().enumerate() {
                for col in (0..font::GLYPH_W as i64).filter(|col| bits >> (4 - col) & 1 == 1) {
                    for (dx, dy) in (0..sc).flat_map(|dx| (0..sc).map(move |dy| (dx, dy))) {
                        let (u, v) = (ox + col * sc + dx, row as i64 * sc + dy);
                        match vertical {
                            true => self.put(x0 + v, y0 - u, c),
                            false => self.put(x0 + u, y0 + v, c),
                        }
                    }
                }
            }
        }
    }

    /// Encodes the image as an 8-bit RGB PNG.
    pub fn encode_png(&self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, self.w, self.h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().map_err(Error::other)?;
        writer.write_image_data(&self.buf).map_err(Error::other)?;
        writer.finish().map_err(Error::other)?;
        Ok(out)
    }
}

impl Canvas for Raster {
    fn line(&mut self, a: Pt, b: Pt, c: Color, width: f64, dashed: bool) {
        let w = width.round().clamp(1.0, 16.0);
        let h = w / 2.0;
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        let len = (dx * dx + dy * dy).sqrt();
        if len.is_nan() || len > 1e6 {
            return; // clipping keeps real strokes inside the plot
        }
        // Solid axis-aligned lines are exact rectangles (crisp axes and grid).
        if !dashed && dy == 0.0 {
            return self.fill(a.0.min(b.0), a.1 - h, a.0.max(b.0) + 0.5, a.1 + h, c);
        }
        if !dashed && dx == 0.0 {
            return self.fill(a.0 - h, a.1.min(b.1), a.0 + h, a.1.max(b.1) + 0.5, c);
        }
        // Otherwise stamp a w×w square every half pixel along the line.
        let steps = (len * 2.0).ceil().max(1.0) as usize;
        for k in 0..=steps {
            let t = k as f64 / steps as f64;
            if dashed && (t * len) % (7.0 * w) >= 4.0 * w {
                continue;
            }
            let (x, y) = (a.0 + dx * t, a.1 + dy * t);
            self.fill(x - h, y - h, x + h, y + h, c);
        }
    }

    fn polyline(&mut self, pts: &[Pt], c: Color, width: f64) {
        for s in pts.windows(2) {
            self.line(s[0], s[1], c, width, false);
        }
    }

    fn circle(&mut self, (cx, cy): Pt, r: f64, c: Color) {
        if !(cx.is_finite() && cy.is_finite()) {
            return;
        }
        let r = r.clamp(0.5, 64.0);
        for j in (cy - r).floor() as i64..=(cy + r).ceil() as i64 {
            for i in (cx - r).floor() as i64..=(cx + r).ceil() as i64 {
                let (px, py) = (i as f64 + 0.5 - cx, j as f64 + 0.5 - cy);
                if px * px + py * py <= r * r + 0.25 {
                    self.put(i, j, c);
                }
            }
        }
        // The pixel holding the centre is always set, however small the radius.
        self.put(cx.floor() as i64, cy.floor() as i64, c);
    }

    fn rect(
        &mut self,
        (x, y, w, h): (f64, f64, f64, f64),
        fill: Option<Color>,
        stroke: Option<Color>,
    ) {
        if let Some(f) = fill {
            self.fill(x, y, x + w, y + h, f);
        }
        if let Some(s) = stroke {
            let (x1, y1) = (x + w, y + h);
            for (a, b) in [
                ((x, y), (x1, y)),
                ((x, y1), (x1, y1)),
                ((x, y), (x, y1)),
                ((x1, y), (x1, y1)),
            ] {
                self.line(a, b, s, 1.0, false);
            }
        }
    }

    fn text(&mut self, (x, y): Pt, s: &str, scale: u32, c: Color, anchor: Anchor) {
        let w = font::text_width(s, scale) as f64;
        let shift = [0.0, w / 2.0, w][anchor as usize];
        self.glyphs(
            ((x - shift).round() as i64, y.round() as i64),
            s,
            scale,
            c,
            false,
        );
    }

    fn vtext(&mut self, (x, y): Pt, s: &str, scale: u32, c: Color) {
        let w = font::text_width(s, scale) as f64;
        self.glyphs(
            (x.round() as i64, (y + w / 2.0).round() as i64),
            s,
            scale,
            c,
            true,
        );
    }
}
