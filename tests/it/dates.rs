//! Date features (`data.dates`): a date column's parts (month, day of week, day of year, …)
//! are network inputs, read from the same text at training, `kiln predict` and `kiln serve`
//! time (ISO or US/EU forms), with a missing date imputed and a bad one refused naming its
//! row and column; the ONNX export refuses a date column by name.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::common::{client, copy_dir, kiln, serve, serve_config, stderr, stdout};

/// Three years of days, US dates (`MM/DD/YYYY`), a numeric `x`; `y` depends on the season
/// (day of year), the weekend and `x`.
fn table(path: &Path) {
    let mut s = String::from("day,x,y\n");
    for d in 0..(3 * 365) {
        let days = 19_000 + d; // 2022-01-08 onwards
        let dt = kiln::config::values::format_datetime(days * 86_400, false);
        let (yy, mm, dd) = (&dt[0..4], &dt[5..7], &dt[8..10]);
        let doy = kiln::data::dates::DatePart::DayOfYear.of_day(days);
        let dow = kiln::data::dates::DatePart::DayOfWeek.of_day(days);
        let x = ((d * 37) % 101) as f64 / 101.0;
        let y = 3.0 * (2.0 * std::f64::consts::PI * doy / 365.25).sin()
            + if dow >= 5.0 { 2.0 } else { 0.0 }
            + 0.5 * x;
        s.push_str(&format!("{mm}/{dd}/{yy},{x:.4},{y:.5}\n"));
    }
    std::fs::write(path, s).unwrap();
}

fn config(dir: &Path, data: &Path, dates: bool) -> PathBuf {
    let (features, dates) = if dates {
        (
            "[x, day]",
            "  dates: {day: [month, day_of_week, day_of_year]}\n",
        )
    } else {
        ("[x]", "")
    };
    let text = format!(
        "name: dates
seed: 3
data:
  path: {}
  features: {features}
{dates}  targets: [y]
  split:
    by: random
    validation: 0.15
    test: 0.15
{}",
        data.display(),
        crate::common::model_and_stages("[32, 32]", 32, 30, "3.0e-3", 2, &dir.join("out"))
    );
    let p = dir.join(if dates.is_empty() {
        "plain.yaml"
    } else {
        "dates.yaml"
    });
    std::fs::write(&p, text).unwrap();
    p
}

fn train(cfg: &Path) -> (String, Value) {
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = stdout(&o).lines().last().unwrap().trim().to_string();
    let m: Value =
        serde_json::from_slice(&std::fs::read(Path::new(&ckpt).join("manifest.json")).unwrap())
            .unwrap();
    (ckpt, m)
}

fn test_mse(m: &Value) -> f64 {
    m["metrics"]["test"]["targets"][0]["mse_model"]
        .as_f64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn date_parts_are_features_read_alike_by_train_predict_and_serve() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("days.csv");
    table(&data);
    let (ckpt, m) = train(&config(tmp.path(), &data, true));
    let (_, plain) = train(&config(tmp.path(), &data, false));
    // The network sees the parts, named after the column.
    let names: Vec<&str> = m["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["x", "day.month", "day.day_of_week", "day.day_of_year"],
        "{m}"
    );
    // The season and the weekend are most of `y`: the parts pay.
    assert!(
        test_mse(&m) < 0.5 * test_mse(&plain),
        "with the date's parts {} vs without {}",
        test_mse(&m),
        test_mse(&plain)
    );

    // kiln predict reads US and ISO dates alike; a missing date is imputed; a bad one is
    // refused naming its line and column.
    let input = tmp.path().join("query.csv");
    std::fs::write(
        &input,
        "id,x,day\na,0.5,03/05/2023\nb,0.5,2023-03-05\nc,0.5,\nd,0.5,12/30/2024\n",
    )
    .unwrap();
    let out = tmp.path().join("pred.csv");
    let o = crate::common::predict(&ckpt, &input, &out);
    assert!(o.status.success(), "{}", stderr(&o));
    let pred: Vec<f32> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(pred.len(), 4);
    assert_eq!(pred[0], pred[1], "03/05/2023 is 2023-03-05");
    assert!(pred.iter().all(|p| p.is_finite()));
    let bad = tmp.path().join("bad.csv");
    std::fs::write(&bad, "id,x,day\na,0.5,2023-02-30\n").unwrap();
    let o = crate::common::predict(&ckpt, &bad, &out);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("bad.csv:2")
            && stderr(&o).contains("`day`")
            && stderr(&o).contains("expected a date"),
        "{}",
        stderr(&o)
    );

    // kiln serve: the date arrives as text (BYTES) and answers as kiln predict does.
    let repo = tempfile::tempdir().unwrap();
    copy_dir(Path::new(&ckpt), &repo.path().join("dates").join("1"));
    let h = serve(serve_config(repo.path(), "fused")).await;
    let mut c = client(&h);
    let meta = c.get("/v2/models/dates").await.unwrap().json();
    let day = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "day")
        .unwrap_or_else(|| panic!("{meta}"));
    assert_eq!(day["datatype"], "BYTES", "{meta}");
    let body = json!({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [4], "data": [0.5, 0.5, 0.5, 0.5]},
        {"name": "day", "datatype": "BYTES", "shape": [4], "data": ["03/05/2023", "2023-03-05", "", "12/30/2024"]},
    ]});
    let r = c.post_json("/v2/models/dates/infer", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let served: Vec<f32> = crate::common::output_data(&r.json(), "mean")
        .into_iter()
        .map(|v| v as f32)
        .collect();
    assert_eq!(served, pred, "serve reads dates as kiln predict does");
    let body = json!({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1], "data": [0.5]},
        {"name": "day", "datatype": "BYTES", "shape": [1], "data": ["someday"]},
    ]});
    let r = c.post_json("/v2/models/dates/infer", &body).await.unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("day") && r.text().contains("expected a date"),
        "{}",
        r.text()
    );
    h.shutdown().await.unwrap();

    // ONNX cannot parse a date: refused by name.
    crate::common::onnx_refused(&ckpt, tmp.path(), "feature `day` is a date column");
}

#[test]
fn a_date_feature_config_is_checked_by_key() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("days.csv");
    table(&data);
    let cfg = config(tmp.path(), &data, true);
    for (set, want) in [
        ("data.dates.day=[]", "expected at least one part"),
        (
            "data.dates.day=[month, month]",
            "part month is listed twice",
        ),
        ("data.dates.day=[weekday]", "weekday"),
    ] {
        let o = kiln(&["config", "check", cfg.to_str().unwrap(), "--set", set]);
        assert_eq!(o.status.code(), Some(2), "{set}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{set}: {}", stderr(&o));
    }
    // Listed in data.dates but not a feature.
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("features: [x, day]", "features: [x]");
    std::fs::write(&cfg, text).unwrap();
    let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("data.dates.day"), "{}", stderr(&o));
}
