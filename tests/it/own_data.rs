//! A table kiln did not ship, end to end: categorical columns (text and integer codes), a
//! missing numeric value, a date split with relative windows and sample weights through
//! `kiln config check` → `kiln train` → `kiln predict` → `kiln serve` (HTTP JSON and binary,
//! gRPC typed and raw: one raw input per column, BYTES for categories) → `kiln export onnx`
//! (ONNX Runtime in the ignored test); and the shipped baseball table rewritten as Parquet,
//! with dates, training the bit-identical model.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln::loadgen::client::HttpClient;
use kiln::serve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use kiln::serve::grpc::proto::{self as pb, model_infer_request as mir};
use serde_json::{Value, json};

use crate::common::{bytes_elements, copy_dir, kiln, root, serve};
use crate::common::{stderr, stdout};

const STORES: [&str; 5] = ["north", "south", "east", "west", "depot"];

/// A shop table: one row per store and day for 300 days from 2021-01-01; `units` depends on
/// the store, the kind (integer codes 1–3) and the price; 1 price in 17 and 1 store in 23
/// are missing; weights 1 (2 on Sundays). With `garbage`, every fifth row of the first 240
/// days (the training split) has `units` 1000 and weight 0.
fn shop_table(path: &Path, garbage: bool) {
    let mut s = String::from("day,store,kind,price,w,units\n");
    let mut state = 12345u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as f64) / (1u64 << 31) as f64
    };
    for d in 0..300i64 {
        let day = kiln::config::values::format_datetime((18_628 + d) * 86_400, false);
        for (k, store) in STORES.iter().enumerate() {
            let kind = 1 + (d as usize + k) % 3;
            let price = 1.0 + 9.0 * next();
            let noise = 0.3 * (next() - 0.5);
            let units = 10.0 * k as f64 - 1.5 * price + 4.0 * kind as f64 + noise;
            let price_text = if (d as usize * 5 + k).is_multiple_of(17) {
                String::new()
            } else {
                format!("{price:.3}")
            };
            let (mut w, mut units) = (if d % 7 == 2 { 2 } else { 1 }, units);
            if garbage && d < 240 && (d as usize + 2 * k) % 5 == 3 {
                (w, units) = (0, 1000.0);
            }
            let store = if (d as usize * 5 + k) % 23 == 5 {
                ""
            } else {
                store
            };
            s.push_str(&format!(
                "{day},{store},{kind},{price_text},{w},{units:.4}\n"
            ));
        }
    }
    std::fs::write(path, s).unwrap();
}

fn shop_config(dir: &Path, data: &Path) -> PathBuf {
    let text = format!(
        "name: shop
seed: 3
data:
  path: {}
  features: [store, kind, price]
  categorical: [store, kind]
  targets: [units]
  weight: w
  missing:
    columns:
      store: {{impute: median, indicator: true}}
      price: {{impute: median, indicator: true}}
  split:
    column: day
    validation: {{last: 30}}
    test: {{last: 30}}
model:
  hidden: [16]
loader:
  batch_size: 64
  num_workers: 0
stages:
  - name: mean
    trainable: [backbone, mean_head]
    loss: mse
    epochs: 12
    optimizer: {{lr: 1.0e-2}}
  - name: variance
    trainable: [logvar_head]
    loss: gaussian_nll
    epochs: 3
    optimizer: {{lr: 1.0e-2, weight_decay: 0.0}}
export:
  dir: {}
",
        data.display(),
        dir.join("out").display()
    );
    let p = dir.join("shop.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Rows to predict: every store, a store training never saw, a missing price.
const QUERY: [(&str, &str, &str); 8] = [
    ("north", "1", "2.5"),
    ("south", "2", "2.5"),
    ("east", "3", "7.25"),
    ("west", "1", "9"),
    ("depot", "2", "4"),
    ("harbour", "3", "4"),
    ("east", "2", ""),
    ("", "1", "3"),
];

fn predict_rows(ckpt: &str, dir: &Path) -> Vec<(f32, f32)> {
    let input = dir.join("query.csv");
    let mut text = String::from("id,store,kind,price\n");
    for (i, (s, k, p)) in QUERY.iter().enumerate() {
        text.push_str(&format!("q{i},{s},{k},{p}\n"));
    }
    std::fs::write(&input, text).unwrap();
    let out = dir.join("pred.csv");
    let o = kiln(&[
        "predict",
        "--checkpoint",
        ckpt,
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("id,units_mean,units_std"), "{text}");
    lines
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            (c[1].parse().unwrap(), c[2].parse().unwrap())
        })
        .collect()
}

/// A JSON request with one input per raw column.
fn json_request() -> Value {
    let n = QUERY.len();
    let price: Vec<Value> = QUERY
        .iter()
        .map(|q| json!(q.2.parse::<f32>().unwrap_or(0.0)))
        .collect();
    json!({"inputs": [
        {"name": "store", "datatype": "BYTES", "shape": [n], "data": QUERY.iter().map(|q| q.0).collect::<Vec<_>>()},
        {"name": "kind", "datatype": "BYTES", "shape": [n, 1], "data": QUERY.iter().map(|q| q.1).collect::<Vec<_>>()},
        {"name": "price", "datatype": "FP32", "shape": [n], "data": price},
    ]})
}

/// The prices with NaN for the missing one.
fn prices() -> Vec<f32> {
    QUERY
        .iter()
        .map(|q| q.2.parse::<f32>().unwrap_or(f32::NAN))
        .collect()
}

fn json_outputs(v: &Value) -> Vec<(f32, f32)> {
    let get = |name: &str| -> Vec<f32> {
        v["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["name"] == name)
            .unwrap_or_else(|| panic!("no output {name}: {v}"))["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    get("mean").into_iter().zip(get("std")).collect()
}

fn grpc_outputs(r: &pb::ModelInferResponse) -> Vec<(f32, f32)> {
    let col = |i: usize| -> Vec<f32> {
        match &r.outputs[i].contents {
            Some(c) => c.fp32_contents.clone(),
            None => r.raw_output_contents[i]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        }
    };
    assert_eq!(r.outputs[0].name, "mean");
    col(0).into_iter().zip(col(1)).collect()
}

fn export_dir_of(train_stdout: &str) -> String {
    train_stdout.lines().last().unwrap().trim().to_string()
}

/// Write the shop table and its config into `dir`, train it; the export directory.
fn train_shop(dir: &Path, garbage: bool) -> String {
    let data = dir.join("shop.csv");
    shop_table(&data, garbage);
    let cfg = shop_config(dir, &data);
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    export_dir_of(&stdout(&o))
}

fn export_onnx(ckpt: &str, out: &Path) {
    let o = kiln(&[
        "export",
        "onnx",
        "--checkpoint",
        ckpt,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The store effect (10 units per store index), the kind and the price were learned: the
/// predictions of [`QUERY`]'s rows 0, 3 and 4 are within 3 units of the truth.
fn assert_learned(pred: &[(f32, f32)]) {
    let truth =
        |store: usize, kind: f64, price: f64| 10.0 * store as f64 - 1.5 * price + 4.0 * kind;
    for (row, store, kind, price) in [
        (0usize, 0usize, 1.0, 2.5),
        (3, 3, 1.0, 9.0),
        (4, 4, 2.0, 4.0),
    ] {
        let want = truth(store, kind, price);
        assert!(
            (pred[row].0 as f64 - want).abs() < 3.0,
            "row {row}: predicted {} for truth {want}: {pred:?}",
            pred[row].0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_with_categories_trains_predicts_serves_raw_columns_and_exports() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("shop.csv");
    shop_table(&data, false);
    let cfg = shop_config(tmp.path(), &data);
    let cfg_s = cfg.to_str().unwrap();

    // The check reads the table: kinds, cardinalities, weights, rows per split.
    let o = kiln(&["config", "check", cfg_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report = stdout(&o);
    for want in [
        "features: store categorical (5 values), kind categorical (3 values), price numeric",
        "sample weights `w`",
        "1200 train / 150 validation / 150 test rows",
        "network inputs (11): store=depot, store=east, store=north, store=south, store=west, kind=1, kind=2, kind=3, price, store_missing, price_missing",
    ] {
        assert!(report.contains(want), "{want:?} not in:\n{report}");
    }

    let o = kiln(&["train", cfg_s, "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = export_dir_of(&stdout(&o));
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(Path::new(&ckpt).join("manifest.json")).unwrap())
            .unwrap();
    let inputs = &manifest["preprocessing"]["inputs"];
    assert_eq!(
        inputs[0]["categories"],
        json!(["depot", "east", "north", "south", "west"])
    );
    assert_eq!(inputs[1]["categories"], json!(["1", "2", "3"]));
    assert_eq!(manifest["preprocessing"]["weight"], "w");

    // kiln predict reads raw columns; the store effect (10 units per store index) was learned.
    let pred = predict_rows(&ckpt, tmp.path());
    assert_eq!(pred.len(), QUERY.len());
    assert!(
        pred.iter().all(|(m, s)| m.is_finite() && *s > 0.0),
        "{pred:?}"
    );
    assert_learned(&pred);

    // kiln serve: the metadata lists one input per raw column.
    let repo = tempfile::tempdir().unwrap();
    copy_dir(Path::new(&ckpt), &repo.path().join("shop").join("1"));
    let h = serve(kiln::serve::ServeConfig {
        grpc_port: Some(0),
        ..crate::common::serve_config(repo.path(), "fused")
    })
    .await;
    let mut c = HttpClient::new(h.addr).with_timeout(Duration::from_secs(20));
    let meta = c.get("/v2/models/shop").await.unwrap().json();
    let declared: Vec<(String, String)> = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap().to_string(),
                i["datatype"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        declared,
        vec![
            ("store".to_string(), "BYTES".to_string()),
            ("kind".into(), "BYTES".into()),
            ("price".into(), "FP32".into())
        ],
        "{meta}"
    );

    // HTTP JSON (no NaN in JSON: the missing price is the last row, compared apart).
    let r = c
        .post_json("/v2/models/shop/infer", &json_request())
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let answered = json_outputs(&r.json());
    assert_eq!(
        &answered[..6],
        &pred[..6],
        "HTTP JSON answers like kiln predict"
    );
    assert_eq!(
        answered[7], pred[7],
        "an empty string is a missing category"
    );
    // The other missing spellings of a file are missing over the wire too.
    let mut na = json_request();
    na["inputs"][0]["data"][7] = json!("NA");
    let r = c.post_json("/v2/models/shop/infer", &na).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        json_outputs(&r.json())[7],
        pred[7],
        "NA is a missing category"
    );

    // HTTP binary: BYTES elements length-prefixed, FP32 with NaN for the missing price.
    let (sb, kb) = (
        bytes_elements(&QUERY.map(|q| q.0)),
        bytes_elements(&QUERY.map(|q| q.1)),
    );
    let pb_: Vec<u8> = prices().iter().flat_map(|v| v.to_le_bytes()).collect();
    let n = QUERY.len();
    let r = crate::common::infer_binary(
        &mut c,
        "shop",
        &[
            ("store", "BYTES", n, sb.clone()),
            ("kind", "BYTES", n, kb.clone()),
            ("price", "FP32", n, pb_.clone()),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        json_outputs(&r.json()),
        pred,
        "HTTP binary answers like kiln predict"
    );

    // Wrong kinds and shapes are clear 400s.
    let mut bad = json_request();
    bad["inputs"][0] =
        json!({"name": "store", "datatype": "FP32", "shape": [n], "data": vec![1.0; n]});
    let r = c.post_json("/v2/models/shop/infer", &bad).await.unwrap();
    assert_eq!(r.status, 400);
    assert!(
        r.text().contains("expected BYTES (a categorical column"),
        "{}",
        r.text()
    );
    let mut bad = json_request();
    bad["inputs"][2]["shape"] = json!([n - 1]);
    bad["inputs"][2]["data"] = json!(vec![1.0; n - 1]);
    let r = c.post_json("/v2/models/shop/infer", &bad).await.unwrap();
    assert_eq!(r.status, 400);
    assert!(
        r.text().contains("expected [8] like input `store`"),
        "{}",
        r.text()
    );
    let mut bad = json_request();
    bad["inputs"].as_array_mut().unwrap().pop();
    let r = c.post_json("/v2/models/shop/infer", &bad).await.unwrap();
    assert_eq!(r.status, 400);
    assert!(r.text().contains("missing input `price`"), "{}", r.text());

    // gRPC, typed bytes_contents and raw contents.
    let mut g = GrpcInferenceServiceClient::connect(format!("http://{}", h.grpc_addr.unwrap()))
        .await
        .unwrap();
    let tensor = |name: &str, dt: &str| mir::InferInputTensor {
        name: name.into(),
        datatype: dt.into(),
        shape: vec![n as i64],
        ..Default::default()
    };
    let mut typed = vec![
        tensor("store", "BYTES"),
        tensor("kind", "BYTES"),
        tensor("price", "FP32"),
    ];
    typed[0].contents = Some(pb::InferTensorContents {
        bytes_contents: QUERY.iter().map(|q| q.0.as_bytes().to_vec()).collect(),
        ..Default::default()
    });
    typed[1].contents = Some(pb::InferTensorContents {
        bytes_contents: QUERY.iter().map(|q| q.1.as_bytes().to_vec()).collect(),
        ..Default::default()
    });
    typed[2].contents = Some(pb::InferTensorContents {
        fp32_contents: prices(),
        ..Default::default()
    });
    let r = g
        .model_infer(pb::ModelInferRequest {
            model_name: "shop".into(),
            inputs: typed,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        grpc_outputs(&r),
        pred,
        "gRPC typed answers like kiln predict"
    );
    let r = g
        .model_infer(pb::ModelInferRequest {
            model_name: "shop".into(),
            inputs: vec![
                tensor("store", "BYTES"),
                tensor("kind", "BYTES"),
                tensor("price", "FP32"),
            ],
            raw_input_contents: vec![sb.clone().into(), kb.clone().into(), pb_.clone().into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_outputs(&r), pred, "gRPC raw answers like kiln predict");
    let mut truncated = sb.clone();
    truncated.truncate(sb.len() - 2);
    let e = g
        .model_infer(pb::ModelInferRequest {
            model_name: "shop".into(),
            inputs: vec![
                tensor("store", "BYTES"),
                tensor("kind", "BYTES"),
                tensor("price", "FP32"),
            ],
            raw_input_contents: vec![truncated.into(), kb.into(), pb_.into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message()
            .contains("input `store`: BYTES element 7 has a truncated length prefix"),
        "{}",
        e.message()
    );
    h.shutdown().await.unwrap();

    // ONNX: one graph input per raw column, the preprocessing inside.
    let onnx = tmp.path().join("shop.onnx");
    export_onnx(&ckpt, &onnx);
    let model = kiln::export::onnx::decode(&std::fs::read(&onnx).unwrap()).unwrap();
    let g = model.graph.unwrap();
    let names: Vec<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, vec!["store", "kind", "price"]);
    assert!(
        g.node
            .iter()
            .any(|n| n.op_type == "LabelEncoder" && n.domain == "ai.onnx.ml")
    );
    assert!(model.opset_import.iter().any(|o| o.domain == "ai.onnx.ml"));
}

/// Rows of weight 0 move neither the loss nor the normalisation: with a fifth of the training
/// rows' targets replaced by 1000 at weight 0, the model still learns the table.
#[test]
fn rows_of_weight_zero_do_not_move_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = train_shop(tmp.path(), true);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(Path::new(&ckpt).join("manifest.json")).unwrap())
            .unwrap();
    let units = &manifest["targets"][0];
    // Unweighted, the garbage would put the training mean near 200.
    let mean = units["mean"].as_f64().unwrap();
    assert!((0.0..40.0).contains(&mean), "target mean {mean}: {units}");
    let pred = predict_rows(&ckpt, tmp.path());
    assert_learned(&pred);
}

/// ONNX Runtime runs the exported graph of a categorical model on raw columns (strings, NaN)
/// and answers like `kiln predict`.
#[test]
#[ignore = "needs ONNX Runtime: KILN_TEST_ORT_PYTHON (.ci/onnxruntime.sh)"]
fn onnx_runtime_runs_the_preprocessing_like_kiln_predict() {
    let python = crate::common::required_env(
        "KILN_TEST_ORT_PYTHON",
        "a Python with onnxruntime and numpy (.ci/onnxruntime.sh)",
    );
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = train_shop(tmp.path(), false);
    let pred = predict_rows(&ckpt, tmp.path());
    let onnx = tmp.path().join("shop.onnx");
    export_onnx(&ckpt, &onnx);
    let script = r#"
import json, sys
import numpy as np
import onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
q = json.loads(sys.argv[2])
feeds = {
    "store": np.array([r[0] for r in q], dtype=object),
    "kind": np.array([r[1] for r in q], dtype=object),
    "price": np.array([float(r[2]) if r[2] else float("nan") for r in q], dtype=np.float32),
}
mean, std = s.run(["mean", "std"], feeds)
print(json.dumps([[float(m[0]), float(d[0])] for m, d in zip(mean, std)]))
"#;
    let q: Vec<[&str; 3]> = QUERY.iter().map(|q| [q.0, q.1, q.2]).collect();
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            script,
            onnx.to_str().unwrap(),
            &serde_json::to_string(&q).unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<(f64, f64)> = serde_json::from_slice(&out.stdout).unwrap();
    for (i, ((m, s), (pm, ps))) in got.iter().zip(&pred).enumerate() {
        let tol = |x: f64| 1e-5 * x.abs().max(1.0);
        assert!(
            (m - *pm as f64).abs() < tol(*m) && (s - *ps as f64).abs() < tol(*s),
            "row {i}: ONNX Runtime {m}, {s}; kiln predict {pm}, {ps}"
        );
    }
}

/// tritonclient (http and grpc) sends the raw columns as BYTES and FP32 numpy arrays.
#[test]
#[ignore = "needs tritonclient: KILN_TEST_TRITON_PYTHON (.ci/triton.sh)"]
fn tritonclient_sends_raw_bytes_columns() {
    let python = crate::common::required_env(
        "KILN_TEST_TRITON_PYTHON",
        "a Python with tritonclient[grpc,http] (.ci/triton.sh)",
    );
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = train_shop(tmp.path(), false);
    let pred = predict_rows(&ckpt, tmp.path());
    let repo = tempfile::tempdir().unwrap();
    copy_dir(Path::new(&ckpt), &repo.path().join("shop").join("1"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let h = rt.block_on(serve(kiln::serve::ServeConfig {
        grpc_port: Some(0),
        ..crate::common::serve_config(repo.path(), "fused")
    }));
    let q: Vec<[&str; 3]> = QUERY.iter().map(|q| [q.0, q.1, q.2]).collect();
    let out = std::process::Command::new(python)
        .arg(root().join("tests/triton/raw_columns.py"))
        .arg(format!("127.0.0.1:{}", h.addr.port()))
        .arg(format!("127.0.0.1:{}", h.grpc_addr.unwrap().port()))
        .arg(serde_json::to_string(&q).unwrap())
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in so.lines().filter(|l| l.starts_with('[')) {
        let got: Vec<(f32, f32)> = serde_json::from_str(line).unwrap();
        assert_eq!(got, pred, "{line}");
    }
    assert_eq!(so.lines().filter(|l| l.starts_with('[')).count(), 3, "{so}");
    rt.block_on(h.shutdown()).unwrap();
}

/// Write the rows of a CSV table as Parquet: `player_id` a dictionary-encoded string, the
/// integer columns INT32, the rest DOUBLE, and `opening_day` (`season`-04-01) a DATE.
fn baseball_as_parquet(csv: &Path, out: &Path) {
    use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int32Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::sync::Arc;
    let text = std::fs::read_to_string(csv).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let ints = ["season", "pa", "age", "experience", "pa_l1", "pa_l2"];
    let mut schema = String::from("message baseball {\n");
    for h in &header {
        if *h == "player_id" {
            schema.push_str(&format!("  required binary {h} (STRING);\n"));
        } else if ints.contains(h) {
            schema.push_str(&format!("  required int32 {h};\n"));
        } else {
            schema.push_str(&format!("  required double {h};\n"));
        }
    }
    schema.push_str("  required int32 opening_day (DATE);\n}\n");
    let schema = Arc::new(parse_message_type(&schema).unwrap());
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .set_max_row_group_row_count(Some(4096))
            .build(),
    );
    let mut w =
        SerializedFileWriter::new(std::fs::File::create(out).unwrap(), schema, props).unwrap();
    let season = header.iter().position(|h| *h == "season").unwrap();
    for chunk in rows.chunks(4096) {
        let mut g = w.next_row_group().unwrap();
        for (j, h) in header.iter().enumerate() {
            let mut c = g.next_column().unwrap().unwrap();
            if *h == "player_id" {
                let v: Vec<ByteArray> = chunk.iter().map(|r| ByteArray::from(r[j])).collect();
                c.typed::<ByteArrayType>()
                    .write_batch(&v, None, None)
                    .unwrap();
            } else if ints.contains(h) {
                let v: Vec<i32> = chunk.iter().map(|r| r[j].parse().unwrap()).collect();
                c.typed::<Int32Type>().write_batch(&v, None, None).unwrap();
            } else {
                let v: Vec<f64> = chunk.iter().map(|r| r[j].parse().unwrap()).collect();
                c.typed::<DoubleType>().write_batch(&v, None, None).unwrap();
            }
            c.close().unwrap();
        }
        let mut c = g.next_column().unwrap().unwrap();
        let days: Vec<i32> = chunk
            .iter()
            .map(|r| {
                let y: i64 = r[season].parse().unwrap();
                let s = format!("{y}-04-01");
                (kiln::config::values::parse_datetime(&s).unwrap().seconds / 86_400) as i32
            })
            .collect();
        c.typed::<Int32Type>()
            .write_batch(&days, None, None)
            .unwrap();
        c.close().unwrap();
        g.close().unwrap();
    }
    w.close().unwrap();
}

fn weights_sha(ckpt: &str) -> String {
    let m: Value =
        serde_json::from_slice(&std::fs::read(Path::new(ckpt).join("manifest.json")).unwrap())
            .unwrap();
    m["weights"]["sha256"].as_str().unwrap().to_string()
}

#[test]
fn baseball_as_parquet_with_a_date_split_trains_the_bit_identical_model() {
    let tmp = tempfile::tempdir().unwrap();
    let pq = tmp.path().join("baseball.parquet");
    baseball_as_parquet(&root().join("datasets/baseball.csv"), &pq);
    let abs = crate::common::absolute_data();
    let csv_cfg =
        crate::common::tiny_config(tmp.path(), &tmp.path().join("csv"), &[(abs.0, &abs.1)]);
    let o = kiln(&["train", csv_cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let from_csv = export_dir_of(&stdout(&o));

    let sub = tmp.path().join("pq");
    std::fs::create_dir_all(&sub).unwrap();
    let pq_cfg = crate::common::tiny_config(
        &sub,
        &tmp.path().join("parquet"),
        &[
            (
                "path: datasets/baseball.csv",
                &format!("path: {}", pq.display()),
            ),
            (
                "    train: {from: 2005, to: 2014}\n    validation: {from: 2015, to: 2016}\n    test: {from: 2017, to: 2019}",
                "    column: opening_day\n    train: {from: 2005-01-01, to: 2014-12-31}\n    validation: {from: 2015-01-01, to: 2016-12-31}\n    test: {from: 2017-01-01, to: 2019-12-31}",
            ),
        ],
    );
    let o = kiln(&["config", "check", pq_cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = kiln(&["train", pq_cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let from_parquet = export_dir_of(&stdout(&o));
    assert_eq!(
        weights_sha(&from_csv),
        weights_sha(&from_parquet),
        "CSV (season split) and Parquet (date split) give bit-identical weights"
    );
    // kiln predict reads the Parquet file too, and answers the same.
    let run = |input: &Path, out: &Path| {
        let o = kiln(&[
            "predict",
            "--checkpoint",
            &from_parquet,
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = std::fs::read_to_string(out).unwrap();
        // The model's columns at the end of each row (pass-through columns differ: the
        // Parquet file has `opening_day`).
        text.lines()
            .skip(1)
            .map(|l| l.rsplitn(7, ',').take(6).collect::<Vec<_>>().join(","))
            .collect::<Vec<_>>()
    };
    let a = run(
        &root().join("datasets/baseball.csv"),
        &tmp.path().join("a.csv"),
    );
    let b = run(&pq, &tmp.path().join("b.csv"));
    assert_eq!(a.len(), b.len());
    assert!(a == b, "kiln predict on CSV and Parquet differ");
}
