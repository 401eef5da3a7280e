//! What users of kiln's observability see, through the binary: `runs show --json` epoch
//! timings from a real training run, log lines without colour codes on a pipe and each warning
//! once, `profile diff` marking new and gone operators and warning on mismatched profile
//! kinds, and the runs report's hover text, labels, log axis and config columns.

use crate::common::root;
use std::path::Path;

use kiln::observe::profiler::{KeyAverage, KeyAverages};
use kiln::track::registry::{NewRun, Registry, RunEnd};

/// The binary with stdout and stderr on pipes (not terminals) and no logging settings
/// inherited from the caller.
use crate::common::kiln;
use crate::common::tiny_in;

fn new_run<'a>(id: &'a str, dir: &'a Path, config_text: &'a str) -> NewRun<'a> {
    NewRun {
        id,
        name: "baseball",
        run_dir: dir,
        config_text,
        config_sha256: "x",
        started_at: "2026-12-01T10:00:00Z",
        environment: Default::default(),
    }
}

#[test]
fn runs_show_json_has_the_epoch_timings_and_logs_are_plain_with_each_warning_once() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_in(tmp.path());
    let db = tmp.path().join("runs.db");
    // A run left `running` by a process that is gone: the next run warns that it reaped it.
    {
        let reg = Registry::open(&db).unwrap();
        reg.start_run(&new_run("stale", tmp.path(), "name: t\n"))
            .unwrap();
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute("UPDATE runs SET pid = 999999999 WHERE id = 'stale'", [])
            .unwrap();
    }
    let o = kiln(&[
        "train",
        cfg.to_str().unwrap(),
        "--plain",
        "--registry",
        db.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");

    // Logs on a pipe: no ANSI escape codes, and every warning once.
    assert!(
        !stderr.contains("\x1b["),
        "colour codes on a pipe:\n{stderr:?}"
    );
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("warn"))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("marked 1 stale running run(s) as killed")),
        "{stderr}"
    );
    for w in &warnings {
        let message = w.rsplit("WARN").next().unwrap_or(w).trim();
        let times = stderr.matches(message).count();
        assert_eq!(times, 1, "{message:?} printed {times} times:\n{stderr}");
    }

    // `runs show --json` reports the timings `epochs.jsonl` has.
    let reg = Registry::open(&db).unwrap();
    let run = reg
        .list()
        .unwrap()
        .into_iter()
        .find(|r| r.status == "finished")
        .expect("the finished run");
    let o = kiln(&[
        "runs",
        "--registry",
        db.to_str().unwrap(),
        "show",
        &run.id,
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let shown = shown["epochs"].as_array().unwrap();
    let file: Vec<serde_json::Value> =
        std::fs::read_to_string(Path::new(&run.run_dir).join("epochs.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert_eq!(shown.len(), 5, "3 + 2 epochs");
    assert_eq!(shown.len(), file.len());
    for (s, f) in shown.iter().zip(&file) {
        for k in ["data_wait_s", "compute_s", "validation_s"] {
            let (a, b) = (s[k].as_f64().unwrap(), f[k].as_f64().unwrap());
            assert_eq!(a, b, "{k} of stage {} epoch {}", s["stage"], s["epoch"]);
        }
        assert!(s["compute_s"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["validation_s"].as_f64().unwrap() > 0.0, "{s}");
    }
}

fn table(step_name: &str, rows: &[(&str, f64)]) -> KeyAverages {
    KeyAverages {
        step_name: step_name.into(),
        steps: 10,
        step_total_us: 100.0,
        rows: rows
            .iter()
            .map(|&(name, total_us)| KeyAverage {
                name: name.into(),
                shapes: None,
                calls: 10,
                total_us,
                self_us: total_us,
                avg_us: total_us / 10.0,
                pct_of_step: 0.0,
            })
            .collect(),
    }
}

#[test]
fn profile_diff_marks_new_and_gone_operators_and_warns_on_mismatched_kinds() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, t: &KeyAverages| {
        let p = tmp.path().join(name);
        std::fs::write(&p, serde_json::to_vec(t).unwrap()).unwrap();
        p.to_str().unwrap().to_string()
    };
    let train = write(
        "train.json",
        &table("train_step", &[("forward", 40.0), ("backward", 30.0)]),
    );
    let infer_a = write(
        "infer_a.json",
        &table("infer_step", &[("forward", 40.0), ("normalize", 5.0)]),
    );
    let infer_b = write(
        "infer_b.json",
        &table("infer_step", &[("forward", 80.0), ("denormalize", 5.0)]),
    );

    let o = kiln(&["profile", "diff", &infer_a, &infer_b]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let line = |n: &str| {
        text.lines()
            .find(|l| l.starts_with(n))
            .unwrap_or_else(|| panic!("{n} missing:\n{text}"))
            .to_string()
    };
    assert!(line("forward").contains("2.00×"), "{text}");
    assert!(line("normalize").contains(" gone "), "{text}");
    assert!(line("denormalize").contains(" new "), "{text}");
    assert!(!text.contains("0.00×"), "{text}");
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("warning"),
        "same kinds: no warning"
    );

    let o = kiln(&["profile", "diff", &train, &infer_b, "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("warning:") && stderr.contains("training") && stderr.contains("inference"),
        "{stderr}"
    );
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let presence = |n: &str| rows.iter().find(|r| r["name"] == n).unwrap()["presence"].clone();
    assert_eq!(presence("backward"), "gone");
    assert_eq!(presence("denormalize"), "new");
    assert_eq!(presence("forward"), "both");
}

/// A registry of seven runs of one config family: three identical fast runs, three others
/// of nearly the same size, and one 15× slower run (flagged).
fn planted(db: &Path) {
    let reg = Registry::open(db).unwrap();
    let base = std::fs::read_to_string(root().join("configs/baseball.yaml")).unwrap();
    let runs: [(&str, &str, i64, f64, f64); 7] = [
        ("run-a", "[46, 48]", 3750, 600.0, 0.41),
        ("run-b", "[46, 48]", 3750, 600.0, 0.41),
        ("run-c", "[46, 48]", 3750, 600.0, 0.41),
        ("run-d", "[47, 48]", 3760, 610.0, 0.40),
        ("run-e", "[47, 48]", 3770, 620.0, 0.405),
        ("run-f", "[45, 48]", 3780, 590.0, 0.402),
        ("run-slow", "[49, 49]", 3790, 9000.0, 0.39),
    ];
    for (id, hidden, params, lat, loss) in runs {
        let text = base.replace("hidden: [48, 48]", &format!("hidden: {hidden}"));
        assert_ne!(text, base, "the planted config changes model.hidden");
        reg.start_run(&new_run(id, db.parent().unwrap(), &text))
            .unwrap();
        reg.finish_run(
            id,
            &RunEnd {
                status: kiln::records::RunState::Finished,
                param_count: Some(params),
                val_metric: Some(loss),
                latency_b1_p50_us: Some(lat),
                latency_b128_p50_us: Some(lat * 20.0),
                ..RunEnd::default()
            },
        )
        .unwrap();
    }
}

/// Whether the SVG draws `text` as a text element of its own.
fn has_text(svg: &str, text: &str) -> bool {
    svg.contains(&format!(">\n{text}\n</text>"))
}

#[test]
fn runs_report_has_hover_text_labels_a_log_axis_and_config_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("runs.db");
    planted(&db);
    let out = tmp.path().join("report");
    let o = kiln(&[
        "runs",
        "--registry",
        db.to_str().unwrap(),
        "report",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(out.join("latency_vs_params.svg")).unwrap();

    // The three identical runs are one point labelled ×3: five points for seven runs.
    assert_eq!(svg.matches("<circle").count(), 5, "{svg}");
    assert!(has_text(&svg, "×3"), "count label");
    // Every point has hover text naming its run(s), config difference, latency and loss.
    assert_eq!(svg.matches("<title>").count(), 5);
    assert!(svg.contains("3 identical runs at this point"));
    for id in [
        "run-a", "run-b", "run-c", "run-d", "run-e", "run-f", "run-slow",
    ] {
        assert!(
            svg.contains(&format!("<title>{id}\n")) || svg.contains(&format!("\n{id}\n")),
            "{id}"
        );
    }
    let slow = svg
        .split("<title>")
        .find(|t| t.starts_with("run-slow"))
        .unwrap();
    assert!(slow.contains("config: model.hidden=[49,49]"), "{slow}");
    assert!(slow.contains("latency b1 p50: 9000.00 µs"), "{slow}");
    assert!(slow.contains("val loss: 0.39000"), "{slow}");
    assert!(slow.contains("FLAGGED"), "{slow}");
    // The flagged run is labelled on the chart.
    assert!(has_text(&svg, "run-slow"), "flag label");
    // 590 µs .. 9000 µs spans more than 10×: a log latency axis.
    assert!(svg.contains("log scale"), "log axis");

    // The metric chart groups the identical runs too.
    let metric = std::fs::read_to_string(out.join("metric_vs_params.svg")).unwrap();
    assert!(has_text(&metric, "×3"));

    // The table has a column per config key that varies across runs, and only those.
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<th>model.hidden</th>"), "{html}");
    assert!(!html.contains("<th>seed</th>") && !html.contains("<th>name</th>"));
    assert!(html.contains("<td>[49,49]</td>"), "{html}");
    assert_eq!(html.matches("<tr").count(), 8, "header + one row per run");
}

#[test]
fn runs_report_keeps_a_linear_axis_within_a_decade() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("runs.db");
    let reg = Registry::open(&db).unwrap();
    for (i, lat) in [600.0, 900.0, 1200.0].into_iter().enumerate() {
        let id = format!("run-{i}");
        reg.start_run(&new_run(&id, tmp.path(), "name: t\n"))
            .unwrap();
        reg.finish_run(
            &id,
            &RunEnd {
                status: kiln::records::RunState::Finished,
                param_count: Some(1000 * (i as i64 + 1)),
                val_metric: Some(0.5),
                latency_b1_p50_us: Some(lat),
                ..RunEnd::default()
            },
        )
        .unwrap();
    }
    let out = tmp.path().join("report");
    let o = kiln(&[
        "runs",
        "--registry",
        db.to_str().unwrap(),
        "report",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(out.join("latency_vs_params.svg")).unwrap();
    assert!(!svg.contains("log scale"));
    assert_eq!(svg.matches("<title>").count(), 3);
    assert!(svg.contains("same config as every other run"));
}
