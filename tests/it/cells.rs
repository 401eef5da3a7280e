//! What a served model meets that training did not have: missing cells are imputed at
//! predict and serve time even when the training split had none (the training median, the
//! unknown bucket; `data.predict_missing: refuse` refuses), unseen categories are counted and
//! named (`kiln predict`'s summary line, the drift report and `/metrics` per column), a
//! missing cell is never counted as an unknown category nor as out of range, and
//! `data.case_insensitive` makes `Rain` and `rain` one category.

use std::path::{Path, PathBuf};

use kiln::serve::metrics::sample;
use serde_json::{Value, json};

use crate::common::{bytes_elements, client, copy_dir, kiln, serve, serve_config, stderr, stdout};

const STORES: [&str; 3] = ["north", "south", "east"];
const WEATHER: [&str; 3] = ["Rain", "Sun", "Snow"];

/// 200 days × 3 stores, no missing cell; `units` depends on the store, the weather and the
/// price.
fn table(path: &Path) {
    let mut s = String::from("day,store,weather,price,units\n");
    for d in 0..200usize {
        for (k, store) in STORES.iter().enumerate() {
            let w = (d * 7 + k * 3) % 3;
            let price = 1.0 + ((d * 13 + k * 5) % 17) as f64 * 0.5;
            let units = 5.0 * k as f64 + 2.0 * w as f64 - 0.5 * price;
            s.push_str(&format!(
                "{d},{store},{},{price:.2},{units:.3}\n",
                WEATHER[w]
            ));
        }
    }
    std::fs::write(path, s).unwrap();
}

fn config(dir: &Path, data: &Path, extra: &str) -> PathBuf {
    let text = format!(
        "name: cells
seed: 5
data:
  path: {}
  features: [store, weather, price]
  categorical: [store, weather]
  case_insensitive: [weather]
  targets: [units]
{extra}  split:
    column: day
    validation: {{last: 20}}
    test: {{last: 20}}
model:
  hidden: [8]
loader:
  batch_size: 64
  num_workers: 0
stages:
  - name: mean
    trainable: [backbone, mean_head]
    loss: mse
    epochs: 3
    optimizer: {{lr: 1.0e-2}}
  - name: variance
    trainable: [logvar_head]
    loss: gaussian_nll
    epochs: 1
    optimizer: {{lr: 1.0e-2, weight_decay: 0.0}}
export:
  dir: {}
",
        data.display(),
        dir.join("out").display()
    );
    let p = dir.join("cells.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn predict_missing_refuse_keeps_the_old_refusal_and_the_default_records_the_fallbacks() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("cells.csv");
    table(&data);
    let load = |extra: &str| {
        let cfg = config(tmp.path(), &data, extra);
        let loaded = kiln::config::load(&cfg).unwrap();
        kiln::data::Dataset::load(&loaded.config.data)
            .unwrap()
            .preprocessing
    };
    let imputing = load("");
    let (store, weather, price) = (
        &imputing.inputs[0],
        &imputing.inputs[1],
        &imputing.inputs[2],
    );
    assert!(store.missing_to_unknown && !store.case_insensitive);
    assert!(weather.case_insensitive);
    assert_eq!(
        weather.categories.as_deref().unwrap(),
        ["rain", "snow", "sun"],
        "the vocabulary of a case-insensitive column is lower-cased"
    );
    let fallback = price.fallback.expect("the training median");
    assert!((1.0..=9.0).contains(&fallback), "{fallback}");
    assert!(
        price.impute.is_none() && !price.indicator,
        "no network change"
    );

    let refusing = load("  predict_missing: refuse\n");
    assert!(!refusing.inputs[0].missing_to_unknown);
    assert_eq!(refusing.inputs[2].fallback, None);
    assert!(!refusing.inputs.iter().any(|c| c.accepts_missing()));

    // A case-insensitive column that is not categorical is a located config error.
    let cfg = config(tmp.path(), &data, "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("case_insensitive: [weather]", "case_insensitive: [price]");
    std::fs::write(&cfg, text).unwrap();
    let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("data.case_insensitive[0]") && stderr(&o).contains("\"price\""),
        "{}",
        stderr(&o)
    );
}

fn outputs(v: &Value) -> Vec<f32> {
    v["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "mean")
        .unwrap_or_else(|| panic!("no mean: {v}"))["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unseen_categories_and_missing_cells_are_imputed_named_and_counted_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("cells.csv");
    table(&data);
    let cfg = config(tmp.path(), &data, "");
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = stdout(&o).lines().last().unwrap().trim().to_string();
    let manifest = kiln::artifact::Checkpoint::load(Path::new(&ckpt))
        .unwrap()
        .manifest;
    let fallback = manifest.preprocessing.as_ref().unwrap().inputs[2]
        .fallback
        .unwrap();

    // kiln predict: a missing price is the training median, a missing store the unknown
    // bucket, `rain`/`RAIN` are `Rain`; one summary line names the unseen categories.
    let query = [
        ("north", "Rain", "2.5".to_string()),
        ("north", "rain", "2.5".into()),
        ("north", "RAIN", "2.5".into()),
        ("depot", "Sun", "3".into()),
        ("harbour", "Sun", "3".into()),
        ("south", "hail", "3".into()),
        ("east", "Sun", String::new()),
        ("east", "Sun", format!("{fallback}")),
        ("", "Snow", "4".into()),
        ("harbour", "rain", String::new()),
        ("harbour", "rain", format!("{fallback}")),
    ];
    let input = tmp.path().join("query.csv");
    let mut text = String::from("id,store,weather,price\n");
    for (i, (s, w, p)) in query.iter().enumerate() {
        text.push_str(&format!("q{i},{s},{w},{p}\n"));
    }
    std::fs::write(&input, text).unwrap();
    let out = tmp.path().join("pred.csv");
    let o = crate::common::predict(&ckpt, &input, &out);
    assert!(o.status.success(), "{}", stderr(&o));
    let notes: Vec<String> = stderr(&o)
        .lines()
        .filter(|l| l.contains("categories the training split did not have"))
        .map(str::to_string)
        .collect();
    assert_eq!(
        notes,
        vec![
            "note: categories the training split did not have (predicted as the unknown bucket): store: 4 rows (e.g. \"depot\", \"harbour\"); weather: 1 row (e.g. \"hail\")"
        ],
        "{}",
        stderr(&o)
    );
    let pred: Vec<f32> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(pred.len(), query.len());
    assert_eq!(pred[0], pred[1], "rain is Rain");
    assert_eq!(pred[0], pred[2], "RAIN is Rain");
    assert_eq!(pred[6], pred[7], "a missing price is the training median");
    assert_eq!(pred[9], pred[10]);

    // kiln serve: the same rows over HTTP (binary: NaN is a missing price) answer like
    // kiln predict, and the drift report and /metrics count what they met per column.
    let repo = tempfile::tempdir().unwrap();
    copy_dir(Path::new(&ckpt), &repo.path().join("cells").join("1"));
    let h = serve(serve_config(repo.path(), "fused")).await;
    let mut c = client(&h);
    let stores = ["harbour", "north", "", "north"];
    let weather = ["rain", "RAIN", "hail", "Rain"];
    let prices = [f32::NAN, 2.5, 3.0, 2.5];
    let pb: Vec<u8> = prices.iter().flat_map(|v| v.to_le_bytes()).collect();
    let n = stores.len();
    let r = crate::common::infer_binary(
        &mut c,
        "cells",
        &[
            ("store", "BYTES", n, bytes_elements(&stores)),
            ("weather", "BYTES", n, bytes_elements(&weather)),
            ("price", "FP32", n, pb),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let served = outputs(&r.json());
    assert_eq!(served[0], pred[9], "serve imputes like kiln predict");
    assert_eq!(served[1], pred[0], "RAIN is Rain at serve time too");
    assert_eq!(served[3], pred[0]);

    let d = c.get("/v2/models/cells/drift").await.unwrap();
    assert_eq!(d.status, 200, "{}", d.text());
    let d = d.json();
    let feature = |name: &str| -> Value {
        d["drift"]["features"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["feature"] == name)
            .unwrap_or_else(|| panic!("no {name} in {d}"))
            .clone()
    };
    let (store, weather, price) = (feature("store"), feature("weather"), feature("price"));
    // store: harbour unknown, one missing (not unknown, not out of range).
    assert_eq!(
        (&store["unknown_values"], &store["missing_values"]),
        (&json!(1), &json!(1)),
        "{store}"
    );
    assert_eq!(store["missing_ratio"], 0.25, "{store}");
    assert_eq!(store["unknown_ratio"], 0.25, "{store}");
    assert_eq!(store["out_of_range_ratio"], 0.25, "{store}");
    // weather: hail unknown, RAIN and rain known, nothing missing.
    assert_eq!(
        (&weather["unknown_values"], &weather["missing_values"]),
        (&json!(1), &json!(0)),
        "{weather}"
    );
    // price: one missing, imputed inside the training range.
    assert_eq!(
        (&price["unknown_values"], &price["missing_values"]),
        (&json!(0), &json!(1)),
        "{price}"
    );
    assert_eq!(price["out_of_range_ratio"], 0.0, "{price}");

    let text = c.get("/metrics").await.unwrap().text();
    let series = |family: &str, f: &str| {
        sample(
            &text,
            &format!("{family}{{model=\"cells\",version=\"1\",feature=\"{f}\"}}"),
        )
        .unwrap_or_else(|| panic!("{family} of {f} missing from /metrics:\n{text}"))
    };
    assert_eq!(series("kiln_unknown_category_total", "store"), 1.0);
    assert_eq!(series("kiln_unknown_category_total", "weather"), 1.0);
    assert_eq!(series("kiln_unknown_category_total", "price"), 0.0);
    assert_eq!(series("kiln_missing_value_total", "store"), 1.0);
    assert_eq!(series("kiln_missing_value_total", "weather"), 0.0);
    assert_eq!(series("kiln_missing_value_total", "price"), 1.0);
    // The ratio gauges are over the drift window (which the /drift read above may have
    // moved on): present, and never more than this stream's one cell in four.
    for (family, f) in [
        ("kiln_drift_unknown_ratio", "weather"),
        ("kiln_drift_missing_ratio", "price"),
    ] {
        let v = series(family, f);
        assert!(v == 0.0 || v == 0.25, "{family} of {f}: {v}");
    }
    h.shutdown().await.unwrap();
}
