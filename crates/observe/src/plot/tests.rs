use super::*;

/// Minimal XML well-formedness check: properly nested tags, one root, quoted attributes,
/// no `<`, bare `&`, unknown entity or control character in text or attribute values
/// (the XML declaration is optional).
fn check_xml(doc: &str) -> Result<(), String> {
    let text_ok = |t: &str| {
        let ents = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"];
        let amps_ok = t
            .match_indices('&')
            .all(|(i, _)| ents.iter().any(|e| t[i..].starts_with(e)));
        amps_ok && !t.contains('<') && !t.chars().any(|c| c < ' ' && !"\t\n\r".contains(c))
    };
    let doc = doc.trim();
    let body = doc
        .strip_prefix(r#"<?xml version="1.0" encoding="UTF-8"?>"#)
        .unwrap_or(doc);
    let (mut stack, mut roots, mut rest) = (Vec::new(), 0, body.trim_start());
    while let Some(lt) = rest.find('<') {
        if !text_ok(&rest[..lt]) || (stack.is_empty() && !rest[..lt].trim().is_empty()) {
            return Err(format!("bad text {:?}", &rest[..lt]));
        }
        let gt = rest[lt..].find('>').ok_or("unterminated tag")? + lt;
        let tag = &rest[lt + 1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            if stack.pop() != Some(name) {
                return Err(format!("mismatched </{name}>"));
            }
            continue;
        }
        let (tag, closed) = tag.strip_suffix('/').map_or((tag, false), |t| (t, true));
        let (name, mut attrs) = tag.split_once(' ').unwrap_or((tag, ""));
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("bad tag name {name:?}"));
        }
        while let Some((key, v)) = attrs.trim_start().split_once("=\"") {
            let end = v.find('"').ok_or("unterminated attribute")?;
            if key.is_empty() || key.contains(char::is_whitespace) || !text_ok(&v[..end]) {
                return Err(format!("bad attribute {key}={:?}", &v[..end]));
            }
            attrs = &v[end + 1..];
        }
        if !attrs.trim().is_empty() {
            return Err(format!("junk in <{name}>: {attrs:?}"));
        }
        roots += stack.is_empty() as usize;
        if !closed {
            stack.push(name);
        }
    }
    match (stack.is_empty(), roots, rest.trim().is_empty()) {
        (true, 1, true) => Ok(()),
        _ => Err(format!(
            "unclosed {stack:?}, {roots} roots, trailing {rest:?}"
        )),
    }
}

fn decode(png_bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    let mut reader = png::Decoder::new(std::io::Cursor::new(png_bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    (info.width, info.height, buf)
}

fn resource_trace() -> Figure {
    let t: Vec<f64> = (0..=120).map(|i| i as f64 * 0.5).collect();
    let mem = t
        .iter()
        .map(|&s| (s, 800.0 + 12.0 * s + 60.0 * (s / 3.0).sin()))
        .collect();
    let cpu = t
        .iter()
        .map(|&s| (s, 45.0 + 40.0 * (s / 7.0).cos().abs()))
        .collect();
    let mem = Panel::new("memory", "time (s)", "memory (MB)").series(Series::line(
        "rss",
        Color::BLUE,
        mem,
    ));
    let cpu =
        Panel::new("cpu", "time (s)", "CPU (%)").series(Series::line("cpu", Color::ORANGE, cpu));
    Figure::new("train job 42: resources", 900, 560)
        .panel(
            mem.vline(0.0, "load")
                .vline(12.5, "stage 1: warmup")
                .vline(40.0, "stage 2: fine-tune & <eval>"),
        )
        .panel(cpu.vline(12.5, "warmup").vline(40.0, "fine-tune"))
}

fn latency_scatter() -> Figure {
    let pts: Vec<Pt> = (0..12)
        .map(|i| {
            (
                10f64.powf(3.0 + i as f64 * 0.4),
                20.0 + 3.0 * (i * i) as f64,
            )
        })
        .collect();
    let flagged = Series::scatter("regression", Color::RED, vec![pts[3], pts[8]]).radius(5.0);
    let panel = Panel::new("", "parameters", "median latency (µs)").log_x(true);
    let panel = panel
        .series(Series::scatter("engines", Color::BLUE, pts))
        .series(flagged);
    Figure::new("median inference latency vs size", 800, 500).panel(panel)
}

fn pareto() -> Figure {
    let pts = vec![
        (1.2e3, 0.61),
        (5e3, 0.70),
        (2e4, 0.68),
        (8e4, 0.81),
        (3e5, 0.79),
        (1.1e6, 0.86),
    ];
    let front = vec![pts[0], pts[1], pts[3], pts[5]];
    let panel = Panel::new("pareto", "parameters", "val metric").log_x(true);
    let panel = panel
        .series(Series::scatter("models", Color::GRAY, pts))
        .series(Series::step("front", Color::GREEN, front));
    Figure::new("validation R² vs parameters", 700, 450).panel(panel)
}

#[test]
fn nice_ticks_table() {
    let cases: &[(f64, f64, usize, &[f64])] = &[
        (0.0, 10.0, 5, &[0.0, 2.0, 4.0, 6.0, 8.0, 10.0]),
        (0.0, 1.0, 5, &[0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0.0, 100.0, 4, &[0.0, 20.0, 40.0, 60.0, 80.0, 100.0]),
        (-1.0, 1.0, 4, &[-1.0, -0.5, 0.0, 0.5, 1.0]),
        (3.0, 97.0, 5, &[20.0, 40.0, 60.0, 80.0]),
        (0.013, 0.057, 4, &[0.02, 0.03, 0.04, 0.05]),
        (1e6, 5e6, 4, &[1e6, 2e6, 3e6, 4e6, 5e6]),
        (-7.0, -2.0, 5, &[-7.0, -6.0, -5.0, -4.0, -3.0, -2.0]),
        (5.0, 5.0, 5, &[5.0]),
        (1.0, f64::NAN, 5, &[]),
        (2.0, 1.0, 5, &[]),
    ];
    for &(lo, hi, n, want) in cases {
        let got = nice_ticks(lo, hi, n);
        let close = got
            .iter()
            .zip(want)
            .all(|(g, w)| (g - w).abs() <= 1e-9 * w.abs().max(1e-9));
        assert!(got.len() == want.len() && close, "{lo}..{hi}: {got:?}");
    }
    for (raw, step) in [
        (0.13, 0.1),
        (0.3, 0.2),
        (4.0, 5.0),
        (8.0, 10.0),
        (1.5e7, 2e7),
    ] {
        assert!((nice_step(raw) - step).abs() < 1e-12 * step, "{raw}");
    }
    assert_eq!(
        log_ticks(0.0, 6.0, 6),
        [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]
    );
    assert_eq!(log_ticks(0.0, 12.0, 4), [1.0, 1e3, 1e6, 1e9, 1e12]);
    assert_eq!(log_ticks(0.0, 2f64.log10() + 0.5, 5), [1.0, 2.0, 5.0]);
}

#[test]
fn label_formatting() {
    let cases = [
        (0.0, "0"),
        (-0.0, "0"),
        (0.5, "0.5"),
        (250.0, "250"),
        (1200.0, "1.2k"),
        (1234.0, "1.23k"),
        (3.4e6, "3.4M"),
        (-3.4e6, "-3.4M"),
        (999.9996, "1k"),
        (999_999.0, "1M"),
        (7.5e9, "7.5G"),
        (2e12, "2T"),
        (1.5e-7, "1.5e-7"),
        (0.001, "0.001"),
        (0.00025, "2.5e-4"),
        (4.2e18, "4.2e18"),
        (5e-324, "4.94e-324"),
        (f64::MIN, "-1.8e308"),
        (f64::NAN, "NaN"),
        (f64::NEG_INFINITY, "-inf"),
    ];
    for (v, want) in cases {
        assert_eq!(format_compact(v), want, "{v}");
    }
    assert_eq!(
        tick_labels(&[1000.0, 1200.0, 1400.0]),
        ["1k", "1.2k", "1.4k"]
    );
    assert_eq!(tick_labels(&[0.0, 0.2, 0.4]), ["0", "0.2", "0.4"]);
    assert_eq!(tick_labels(&[100_000.0, 100_200.0]), ["100k", "100.2k"]);
    assert_eq!(tick_labels(&[0.30000000000000004, 0.4]), ["0.3", "0.4"]);
    assert_eq!(tick_labels(&[1e6, 1e6 + 50.0]), ["1M", "1.00005M"]);
    font_ready().unwrap();
    let st = text_style(13.0, TEXT);
    assert_eq!(truncate("hello world", 1000.0, &st), "hello world");
    let cut = truncate("hello world", 40.0, &st);
    assert!(cut.ends_with("..") && cut.len() < 11, "{cut}");
    assert!(text_width(&cut, &st) <= 40.0 && text_width(&cut, &st) > 0.0);
    assert_eq!(truncate("hello", 0.0, &st), "");
    assert_eq!(truncate("a\u{0}b\nc", 1000.0, &st), "a b c");
}

/// Whether `c` appears within `r` pixels of `(x, y)` in a packed RGB image of width `w`.
fn colour_near(buf: &[u8], w: u32, (x, y): Pt, r: i64, c: Color) -> bool {
    let h = buf.len() as i64 / (3 * w as i64);
    let (x, y) = (x.round() as i64, y.round() as i64);
    (-r..=r)
        .flat_map(|dy| (-r..=r).map(move |dx| (x + dx, y + dy)))
        .any(|(x, y)| {
            let i = ((y * w as i64 + x) * 3) as usize;
            x >= 0 && y >= 0 && x < w as i64 && y < h && Color(buf[i], buf[i + 1], buf[i + 2]) == c
        })
}

#[test]
fn svg_is_well_formed_and_holds_title_legend_and_escaped_text() {
    let mut fig = latency_scatter();
    fig.panels[0].series[0]
        .points
        .extend([(f64::NAN, 3.0), (-5.0, 3.0), (f64::INFINITY, 1.0)]); // not plottable
    let svg = fig.to_svg();
    check_xml(&svg).unwrap();
    assert!(svg.contains("<svg"));
    assert!(svg.contains("median inference latency vs size"));
    for name in ["engines", "regression", "parameters", "median latency (µs)"] {
        assert!(svg.contains(name), "{name}");
    }
    // One circle per plottable point (legend swatches are squares).
    assert_eq!(svg.matches("<circle").count(), 12 + 2);
    let svg = resource_trace().to_svg();
    check_xml(&svg).unwrap();
    assert!(svg.contains("train job 42: resources"));
    assert!(svg.contains("fine-tune &amp; &lt;eval&gt;"), "{svg}");
    assert!(svg.contains("stage 1: warmup") && svg.contains(">\nrss\n<"));
    assert!(!svg.contains("<circle"));
    let svg = pareto().to_svg();
    check_xml(&svg).unwrap();
    assert!(svg.contains("validation R² vs parameters") && svg.contains("front"));
    assert_eq!(svg.matches("<circle").count(), 6);
    for bad in [
        "<a><b></a></b>",
        "<a x=\"1 & 2\"/>",
        "<a/><b/>",
        "<a>x<y</a>",
    ] {
        assert!(
            check_xml(&format!(r#"<?xml version="1.0" encoding="UTF-8"?>{bad}"#)).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn log_axis_ticks_are_decades_with_compact_labels() {
    let fig = latency_scatter(); // x from 1e3 to about 4e7
    let m = Metrics::new(fig.size());
    let (layout, _) = fig.layout(&m, 30.0);
    let keys: Vec<f64> = layout[0].x_ticks.iter().map(|t| t.0).collect();
    assert_eq!(keys, [3.0, 4.0, 5.0, 6.0, 7.0]);
    let labels: Vec<&str> = layout[0].x_ticks.iter().map(|t| t.1.as_str()).collect();
    assert_eq!(labels, ["1k", "10k", "100k", "1M", "10M"]);
    let svg = fig.to_svg();
    for l in labels {
        assert!(svg.contains(&format!(">\n{l}\n<")), "{l}");
    }
    // Less than a decade: 1/2/5 steps.
    let narrow = Panel::new("", "x", "y").log_x(true).series(Series::line(
        "",
        Color::BLUE,
        vec![(1.5, 1.0), (9.0, 2.0)],
    ));
    let fig = Figure::new("", 600, 400).panel(narrow);
    let (layout, _) = fig.layout(&Metrics::new(fig.size()), 0.0);
    let labels: Vec<&str> = layout[0].x_ticks.iter().map(|t| t.1.as_str()).collect();
    assert_eq!(labels, ["2", "5"]);
}

#[test]
fn png_decodes_to_size_and_series_are_drawn_in_their_colours() {
    for fig in [latency_scatter(), resource_trace(), pareto()] {
        let (w, h, buf) = decode(&fig.to_png());
        assert_eq!(
            (w, h, buf.len()),
            (fig.width, fig.height, (fig.width * fig.height * 3) as usize)
        );
        // The title is rendered from the embedded font: dark pixels in the top band.
        let band = &buf[..(w * 24 * 3) as usize];
        assert!(band.chunks(3).any(|p| p.iter().all(|c| *c < 128)));
    }
    let fig = latency_scatter();
    let (buf, placed) = fig.pixels().unwrap();
    let (w, l) = (fig.width, &placed[0]);
    // The flagged series is drawn last, so its centres are red; the other points blue.
    let series = &fig.panels[0].series;
    for p in &series[1].points {
        assert!(colour_near(&buf, w, l.pixel(*p), 0, Color::RED), "{p:?}");
    }
    for (i, p) in series[0].points.iter().enumerate() {
        if i != 3 && i != 8 {
            assert!(
                colour_near(&buf, w, l.pixel(*p), 0, Color::BLUE),
                "{i}: {p:?}"
            );
        }
    }
    // A line passes through its vertices; a step line through its corners.
    let fig = resource_trace();
    let (buf, placed) = fig.pixels().unwrap();
    let p = fig.panels[1].series[0].points[30];
    assert!(colour_near(
        &buf,
        fig.width,
        placed[1].pixel(p),
        1,
        Color::ORANGE
    ));
    let fig = pareto();
    let (buf, placed) = fig.pixels().unwrap();
    let front = &fig.panels[0].series[1].points;
    let corner = (front[2].0, front[1].1);
    assert!(colour_near(
        &buf,
        fig.width,
        placed[0].pixel(corner),
        1,
        Color::GREEN
    ));
}

#[test]
fn stacked_panels_share_the_x_axis() {
    let fig = resource_trace();
    let (_, placed) = fig.pixels().unwrap();
    assert_eq!(placed.len(), 2);
    let (a, b) = (&placed[0], &placed[1]);
    assert_eq!((a.xr, a.px), (b.xr, b.px));
    assert!(!a.x_labels && b.x_labels && a.py.0 < b.py.1, "{a:?} {b:?}");
    assert!(
        (a.py.0 - a.py.1 - (b.py.0 - b.py.1)).abs() <= 2,
        "{a:?} {b:?}"
    );
}

#[test]
fn degenerate_inputs_do_not_panic() {
    let long = "a very long label that cannot possibly fit in the space given to it ".repeat(8);
    let p = |t: &str| Panel::new(t, "x", "y");
    let nan = vec![
        (f64::NAN, 1.0),
        (1.0, f64::INFINITY),
        (2.0, 3.0),
        (f64::NEG_INFINITY, 0.0),
        (3.0, 4.0),
    ];
    let huge = vec![(-1e308, 1e308), (1e308, -1e308), (f64::MAX, f64::MIN)];
    let tiny = vec![(5e-324, 1e-310), (1e-300, 2e-310), (1.0 + 1e-15, 1.0)];
    let panels = vec![
        Panel::new("", "", ""),
        p("").series(Series::line("", Color::BLUE, vec![])),
        p("empty").series(Series::scatter("empty", Color::BLUE, vec![])),
        p("one").series(Series::line("one", Color::BLUE, vec![(1.0, 1.0)])),
        p("flat").series(Series::scatter("flat", Color::RED, vec![(2.0, 0.0); 5])),
        p("nan").series(Series::line("nan", Color::GREEN, nan)),
        p("huge")
            .series(Series::scatter("huge", Color::BLUE, huge.clone()))
            .series(Series::line("huge line", Color::RED, huge))
            .vline(1e307, "far"),
        p("tiny").series(Series::step("tiny", Color::BLUE, tiny)),
        p("log").log_x(true).series(Series::scatter(
            "neg",
            Color::BLUE,
            vec![(-1.0, 1.0), (0.0, 2.0)],
        )),
        p("ranges")
            .x_range(5.0, 5.0)
            .y_range(f64::NAN, 3.0)
            .series(Series::line(
                "out",
                Color::BLUE,
                vec![(-1e9, 0.0), (1e9, 1.0), (6.0, 1e12)],
            ))
            .vline(f64::NAN, "nan")
            .vline(1e9, "outside"),
        Panel::new(&long, &long, &long)
            .series(
                Series::scatter(&long, Color::RED, vec![(0.0, 0.0), (1.0, 1.0)])
                    .radius(f64::NAN)
                    .width(-3.0),
            )
            .vline(0.5, &long)
            .vline(0.5, "\u{0}\u{7}ctrl <&>\"' µs ✓"),
        p("log range")
            .log_x(true)
            .x_range(-1.0, 0.0)
            .series(Series::step("s", Color::BLUE, vec![(1.0, 2.0)])),
    ];
    for (w, h) in [(0, 0), (1, 1), (7, 3), (120, 90), (640, 2000), (1600, 900)] {
        let all = Figure {
            panels: panels.clone(),
            ..Figure::new(&long, w, h)
        };
        let single = panels
            .iter()
            .map(|p| Figure::new("", w, h).panel(p.clone()));
        for fig in single.chain([all, Figure::new("", w, h)]) {
            check_xml(&fig.to_svg())
                .unwrap_or_else(|e| panic!("{w}x{h} {:?}: {e}", fig.panels.first()));
            assert_eq!(decode(&fig.to_png()).0, w.max(1));
        }
    }
}

#[test]
fn save_writes_both_files_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let (svg, png_path) = resource_trace().save(&dir.path().join("trace.v1")).unwrap();
    assert_eq!(
        (svg.file_name().unwrap(), png_path.file_name().unwrap()),
        ("trace.v1.svg".as_ref(), "trace.v1.png".as_ref())
    );
    check_xml(&std::fs::read_to_string(&svg).unwrap()).unwrap();
    assert_eq!(decode(&std::fs::read(&png_path).unwrap()).0, 900);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "temp files left behind"
    );
    let err = resource_trace()
        .save(&dir.path().join("missing/x"))
        .unwrap_err();
    assert!(err.to_string().contains("missing/x.svg"), "{err}");
    // KILN_PLOT_DEMO_DIR=dir writes the demo figures there for a look.
    if let Some(d) = std::env::var_os("KILN_PLOT_DEMO_DIR").map(PathBuf::from) {
        let big = Figure {
            width: 1600,
            height: 900,
            ..resource_trace()
        };
        for (name, fig) in [
            ("resources", resource_trace()),
            ("latency", latency_scatter()),
            ("pareto", pareto()),
            ("big", big),
        ] {
            fig.save(&d.join(name)).unwrap();
        }
    }
}

#[test]
fn a_log_y_axis_has_decade_ticks_and_maps_points_in_log_space() {
    let pts = vec![(1.0, 10.0), (2.0, 100.0), (3.0, 10_000.0), (4.0, -5.0)];
    let panel = Panel::new("", "x", "latency").log_y(true).series(
        Series::scatter("runs", Color::BLUE, pts)
            .tips(vec![
                "a <1>".into(),
                String::new(),
                "c & d".into(),
                "gone".into(),
            ])
            .labels(vec![String::new(), String::new(), "slow".into()]),
    );
    let fig = Figure::new("log y", 600, 400).panel(panel);
    let (layout, _) = fig.layout(&Metrics::new(fig.size()), 30.0);
    let labels: Vec<&str> = layout[0].y_ticks.iter().map(|t| t.1.as_str()).collect();
    assert_eq!(labels, ["10", "100", "1k", "10k"]);
    let (_, placed) = fig.pixels().unwrap();
    // Equal ratios are equal pixel distances (y grows downwards in pixels).
    let y = |v: f64| placed[0].pixel((1.0, v)).1;
    assert!((y(10.0) - y(100.0) - (y(100.0) - y(1000.0))).abs() < 1e-6);
    assert!(y(10.0) > y(10_000.0));
    // The point at y ≤ 0 is skipped; the others are drawn, two with hover text, one labelled.
    let svg = fig.to_svg();
    check_xml(&svg).unwrap();
    assert_eq!(svg.matches("<circle").count(), 3);
    assert_eq!(svg.matches("<title>").count(), 2);
    assert!(svg.contains("<title>a &lt;1&gt;</title></circle>"));
    assert!(svg.contains("<title>c &amp; d</title></circle>"));
    assert!(!svg.contains("gone"));
    assert!(svg.contains(">\nslow\n</text>"));
}

#[test]
fn titles_are_left_out_when_circles_and_points_do_not_pair_up() {
    let svg = "<svg><circle r=\"1\"/>\n<circle r=\"2\"/>\n</svg>";
    let one = [Some("a".to_string())];
    assert_eq!(with_titles(svg, &one), svg, "two circles, one point");
    let two = [None, Some("b".to_string())];
    assert_eq!(
        with_titles(svg, &two),
        "<svg><circle r=\"1\"/>\n<circle r=\"2\"><title>b</title></circle>\n</svg>"
    );
}

#[test]
fn an_unnamed_series_has_no_legend_entry() {
    let pts = vec![(0.1, 0.2), (0.5, 0.4), (0.9, 0.95)];
    let named = Panel::new("", "x", "y").series(Series::line("model", Color::BLUE, pts.clone()));
    let with_unnamed = Panel::new("", "x", "y")
        .series(Series::line("model", Color::BLUE, pts.clone()))
        .series(Series::scatter("", Color::ORANGE, pts.clone()))
        .series(Series::line("", Color::GREEN, pts.clone()));
    let a = Figure::new("legend", 640, 480).panel(named).to_svg();
    let b = Figure::new("legend", 640, 480).panel(with_unnamed).to_svg();
    check_xml(&b).unwrap();
    // The unnamed scatter adds its points (circles) but no square swatch, and the unnamed
    // line no legend stroke: the legend is the same box with the same one row.
    assert_eq!(b.matches("<circle").count(), 3);
    assert_eq!(a.matches("<rect").count(), b.matches("<rect").count());
    assert_eq!(
        a.matches("<polyline").count() + 1,
        b.matches("<polyline").count(),
        "only the unnamed line's own stroke is added"
    );
    let named_scatter = Figure::new("legend", 640, 480)
        .panel(
            Panel::new("", "x", "y")
                .series(Series::line("model", Color::BLUE, pts.clone()))
                .series(Series::scatter("points", Color::ORANGE, pts)),
        )
        .to_svg();
    // A named scatter does get one (the check above can see a swatch).
    assert!(named_scatter.matches("<rect").count() > a.matches("<rect").count());
}
