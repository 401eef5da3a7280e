//! The serving tier watches its model: input drift against the checkpoint's training sketches
//! (PSI, KS, out of range per feature; the live mean predicted std against the test split's),
//! the latency watch against the checkpoint's recorded latency, and the shipped Prometheus
//! alert rules (checked and unit-tested by a real promtool, their metric names checked
//! against a live /metrics).

use std::time::Duration;

use kiln::loadgen::client::HttpClient;
use kiln::serve::metrics::sample;
use serde_json::{Value, json};

use crate::common::client;
use crate::common::{repository_of, root, serve, serve_config, tiny_config, trained};

/// The tiny model's training and test rows (raw network inputs).
fn splits() -> (Vec<f32>, Vec<f32>, usize) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tiny_config(tmp.path(), &tmp.path().join("out"), &[]);
    let loaded = kiln::config::load(&path).unwrap();
    let data = kiln::data::Dataset::load(&loaded.config.data).unwrap();
    (data.train.x, data.test.x, data.features.len())
}

/// `n` rows drawn with replacement from `x` (seeded).
fn bootstrap(x: &[f32], f: usize, n: usize, seed: u64) -> Vec<f32> {
    let rows = x.len() / f;
    let mut s = seed;
    let mut out = Vec::with_capacity(n * f);
    for _ in 0..n {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let r = ((s >> 33) as usize) % rows;
        out.extend_from_slice(&x[r * f..(r + 1) * f]);
    }
    out
}

async fn send(c: &mut HttpClient, x: &[f32], f: usize) {
    for chunk in x.chunks(50 * f) {
        let body = json!({"inputs": [{
            "name": "features", "datatype": "FP32",
            "shape": [chunk.len() / f, f], "data": chunk,
        }]});
        let r = c.post_json("/v2/models/tiny/infer", &body).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

async fn drift(c: &mut HttpClient) -> Value {
    let r = c.get("/v2/models/tiny/drift").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn feature<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["drift"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["feature"] == name)
        .unwrap_or_else(|| panic!("no feature {name} in {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drifted_stream_moves_exactly_the_drifted_features_and_an_undrifted_one_none() {
    let (train, test, f) = splits();
    let manifest = kiln::artifact::Checkpoint::load(trained())
        .unwrap()
        .manifest;
    let names = manifest.feature_names();
    let reference = manifest
        .drift
        .clone()
        .expect("the checkpoint has its sketches");
    assert_eq!(reference.columns.len(), f);
    let repo = repository_of(trained());
    // A short window: a read after it has passed starts a new window at the previous read.
    let mut config = serve_config(repo.path(), "auto");
    config.watch.drift_window = Duration::from_millis(300);
    let h = serve(config).await;
    let mut c = client(&h);
    let settle = || tokio::time::sleep(Duration::from_millis(350));

    // The test split, once: the live mean predicted std is the test split's.
    send(&mut c, &test, f).await;
    let d = drift(&mut c).await;
    for (t, want) in d["drift"]["prediction_std"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&reference.prediction_std)
    {
        let live = t["live_mean"].as_f64().unwrap();
        assert!(
            (live - want).abs() <= 1e-4 * want,
            "{}: live {live} vs test split {want}",
            t["target"]
        );
    }

    // Undrifted: rows drawn from the training split. Every PSI stays far under 0.2.
    send(&mut c, &bootstrap(&train, f, 3000, 7), f).await;
    settle().await;
    let d = drift(&mut c).await;
    assert_eq!(
        d["drift"]["rows"], 3000,
        "the window starts at the last read"
    );
    for n in &names {
        let x = feature(&d, n);
        assert_eq!(x["values"], 3000);
        assert!(x["psi"].as_f64().unwrap() < 0.05, "{n}: {x}");
        assert!(x["ks"].as_f64().unwrap() < 0.05, "{n}: {x}");
        assert!(x["out_of_range_ratio"].as_f64().unwrap() < 0.01, "{n}: {x}");
        assert_eq!(x["drifted"], false);
    }
    assert_eq!(d["drift"]["drifted"], 0);
    assert_eq!(d["drift"]["table_drift"], false);

    // Drifted: the first feature shifted by one training standard deviation, the second
    // past the training maximum; the others as before.
    let mut x = bootstrap(&train, f, 3000, 11);
    let (shift, above) = (manifest.features[0].std, reference.columns[1].max);
    for row in x.chunks_exact_mut(f) {
        row[0] += shift as f32;
        row[1] = (above + 1.0 + row[1].abs() as f64) as f32;
    }
    send(&mut c, &x, f).await;
    settle().await;
    let d = drift(&mut c).await;
    let (a, b) = (feature(&d, &names[0]), feature(&d, &names[1]));
    assert!(a["psi"].as_f64().unwrap() > 0.2, "{a}");
    assert!(a["ks"].as_f64().unwrap() > 0.2, "{a}");
    assert_eq!(a["drifted"], true);
    assert!(b["psi"].as_f64().unwrap() > 1.0, "{b}");
    assert_eq!(b["out_of_range_ratio"], 1.0, "{b}");
    for n in &names[2..] {
        let x = feature(&d, n);
        assert!(x["psi"].as_f64().unwrap() < 0.05, "{n}: {x}");
        assert_eq!(x["drifted"], false);
    }
    assert_eq!(d["drift"]["drifted"], 2);

    // /metrics says the same.
    let text = c.get("/metrics").await.unwrap().text();
    let series = |family: &str, n: &str| {
        sample(
            &text,
            &format!("{family}{{model=\"tiny\",version=\"1\",feature=\"{n}\"}}"),
        )
        .unwrap_or_else(|| panic!("{family} of {n} missing from /metrics"))
    };
    // The scrape is a read too, within the window of the last one: the same window.
    assert_eq!(series("kiln_drift_window_values", &names[0]), 3000.0);
    assert!(series("kiln_drift_psi", &names[0]) > 0.2);
    assert!(series("kiln_drift_psi", &names[2]) < 0.05);
    assert_eq!(series("kiln_drift_out_of_range_ratio", &names[1]), 1.0);
    assert_eq!(
        sample(&text, "kiln_drift_features{model=\"tiny\",version=\"1\"}"),
        Some(f as f64)
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowed_engine_trips_the_latency_watch_and_the_recorded_one_does_not() {
    // The checkpoint records its latency on the serving engine (`auto`), as every run does.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    crate::common::copy_dir(crate::common::trained_measured(), &dir);
    let (train, _, f) = splits();
    let rows = bootstrap(&train, f, 300, 3);
    let mut flagged = Vec::new();
    for engine in ["auto", "burn"] {
        let repo = repository_of(&dir);
        let mut config = serve_config(repo.path(), engine);
        // Below the default 20 µs floor, so that generic Burn (≥ 7 µs a row, 25× the fused
        // engine) trips it; above the few µs a cold, preempted fused call costs on a loaded
        // CI machine (2.2 µs was seen against a hot-loop baseline of 0.28 µs).
        config.watch.latency_min_delta = Duration::from_micros(4);
        let h = serve(config).await;
        let mut c = client(&h);
        // One row per request, one after the other: 300 batches of one row.
        for row in rows.chunks(f) {
            send(&mut c, row, f).await;
        }
        let d = drift(&mut c).await;
        let buckets = d["latency"].as_array().expect("the watch is on").clone();
        let b1 = buckets.iter().find(|b| b["batch"] == 1).expect("bucket 1");
        flagged.push((engine, b1["regressed"] == true, b1.clone()));
        let text = c.get("/metrics").await.unwrap().text();
        assert!(
            sample(
                &text,
                "kiln_latency_regression{model=\"tiny\",version=\"1\",batch=\"1\"}"
            )
            .is_some()
        );
        h.shutdown().await.unwrap();
    }
    assert!(
        !flagged[0].1,
        "the recorded engine is not a regression: {flagged:?}"
    );
    assert!(flagged[1].1, "Burn's generic engine is: {flagged:?}");
}

/// The shipped alert rules: promtool accepts them and their unit tests pass, and every
/// `kiln_*` metric they name is one a serving kiln exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs promtool (source .ci/promtool.sh)"]
async fn the_alert_rules_pass_promtool_and_name_exported_metrics() {
    let promtool = crate::common::required_env(
        "KILN_TEST_PROMTOOL",
        "Prometheus' promtool (source .ci/promtool.sh)",
    );
    let dir = root().join("deploy/prometheus");
    for (verb, file) in [
        ("check", "kiln-alerts.yaml"),
        ("test", "kiln-alerts.test.yaml"),
    ] {
        let o = std::process::Command::new(&promtool)
            .args([verb, "rules"])
            .arg(dir.join(file))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "promtool {verb} rules {file}:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let rules = std::fs::read_to_string(dir.join("kiln-alerts.yaml")).unwrap();
    let mut names: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("kiln_"))
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 8, "{names:?}");

    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    crate::common::copy_dir(crate::common::trained_measured(), &ckpt);
    let repo = repository_of(&ckpt);
    let h = serve(serve_config(repo.path(), "auto")).await;
    let mut c = client(&h);
    let (train, _, f) = splits();
    for row in bootstrap(&train, f, 100, 5).chunks(f) {
        send(&mut c, row, f).await;
    }
    let text = c.get("/metrics").await.unwrap().text();
    for n in names {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{n}{{"))),
            "the rules name `{n}`, which /metrics does not export"
        );
    }
    h.shutdown().await.unwrap();
}
