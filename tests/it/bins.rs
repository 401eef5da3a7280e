//! Piecewise-linear bins (`data.numeric_bins`): each numeric feature enters beside its value
//! as one input per bin at the training split's quantiles. The network's features are named
//! `<column>.bin<i>`, `kiln predict` encodes raw rows the same way training did (its test
//! RMSE is the manifest's), `kiln serve` answers raw columns as `kiln predict` does, ONNX
//! export refuses a binned feature by name, and a bad value is refused by key. `auto` trains
//! the mean stage with bins and without, keeps the lower validation loss, then trains exactly
//! what a config fixing that choice trains; killed midway, it resumes to the same weights.

use std::path::{Path, PathBuf};

use serde_json::Value;

use serde_json::json;

use crate::common::{
    client, copy_dir, exported, kiln, kiln_env, only_run, resume, serve, serve_config, stderr,
    stdout,
};
use crate::ensemble::{config, predicted, table};

fn binned(dir: &Path, data: &Path, bins: &str) -> PathBuf {
    let cfg = config(dir, data, "  hidden: [16, 16]");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "  targets: [y]",
        &format!("  targets: [y]\n  numeric_bins: {bins}"),
    );
    std::fs::write(&cfg, text).unwrap();
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binned_features_train_predict_and_serve_like_training_and_are_refused_by_onnx() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("t.csv");
    let rows = table(&data, 600);
    let cfg = binned(tmp.path(), &data, "4");
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = exported(&o);

    // The network sees each value and its four bins.
    let loaded = kiln::artifact::Checkpoint::load(&ckpt).unwrap();
    let pre = loaded.manifest.input_preprocessing();
    assert_eq!(
        pre.network_features(),
        [
            "a", "a.bin0", "a.bin1", "a.bin2", "a.bin3", "b", "b.bin0", "b.bin1", "b.bin2",
            "b.bin3"
        ]
    );
    assert_eq!(loaded.weights.arch.n_features, 10);
    let edges = pre.inputs[0].bins.as_ref().unwrap();
    assert_eq!(edges.len(), 5);
    assert!(edges.windows(2).all(|w| w[0] < w[1]), "{edges:?}");
    // The edges are the training split's: its smallest and largest `a`.
    let train_a: Vec<f64> = rows.iter().filter(|r| r.0 == 0).map(|r| r.1).collect();
    let (lo, hi) = train_a
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
    assert!(
        (edges[0] - lo).abs() < 1e-5 && (edges[4] - hi).abs() < 1e-5,
        "{edges:?}"
    );

    // `kiln predict` on raw test rows gives the manifest's test RMSE.
    let test: Vec<_> = rows.iter().filter(|r| r.0 == 2).collect();
    let p = predicted(tmp.path(), &ckpt, &test);
    let rmse = (p.iter().map(|(y, m, _)| (y - m).powi(2)).sum::<f64>() / p.len() as f64).sqrt();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("manifest.json")).unwrap()).unwrap();
    let reported = manifest["metrics"]["test"]["targets"][0]["rmse_model"]
        .as_f64()
        .unwrap();
    assert!(
        (reported / rmse - 1.0).abs() < 1e-3,
        "manifest test RMSE {reported} vs {rmse} from kiln predict"
    );
    assert!(rmse < 0.3, "test RMSE {rmse}");

    // kiln serve takes the raw columns and bins them as kiln predict did.
    let repo = tempfile::tempdir().unwrap();
    copy_dir(&ckpt, &repo.path().join("binned").join("1"));
    let h = serve(serve_config(repo.path(), "fused")).await;
    let mut c = client(&h);
    let first: Vec<_> = test.iter().take(4).collect();
    let body = json!({"inputs": [
        {"name": "a", "datatype": "FP32", "shape": [4], "data": first.iter().map(|r| format!("{:.5}", r.1).parse::<f64>().unwrap()).collect::<Vec<_>>()},
        {"name": "b", "datatype": "FP32", "shape": [4], "data": first.iter().map(|r| format!("{:.5}", r.2).parse::<f64>().unwrap()).collect::<Vec<_>>()},
    ]});
    let r = c.post_json("/v2/models/binned/infer", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let served = crate::common::output_data(&r.json(), "mean");
    assert_eq!(served.len(), 4);
    for (s, (_, m, _)) in served.iter().zip(&p) {
        assert!(
            (s - m).abs() <= 1e-6 * m.abs().max(1.0),
            "served {s} vs predicted {m}"
        );
    }
    h.shutdown().await.unwrap();

    crate::common::onnx_refused(
        ckpt.to_str().unwrap(),
        tmp.path(),
        "feature `a` is binned (data.numeric_bins)",
    );

    // `--set` reaches the key in a config that leaves it out.
    let plain = config(tmp.path(), &data, "  hidden: [16, 16]");
    let o = kiln(&[
        "config",
        "check",
        plain.to_str().unwrap(),
        "--set",
        "data.numeric_bins=8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // `auto` says what it will choose between.
    let auto = binned(tmp.path(), &data, "auto");
    let o = kiln(&["config", "check", auto.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("numeric_bins auto: 18 network inputs with 8 bins, 2 without"),
        "{}",
        stdout(&o)
    );
    let range = |bad: &str| {
        format!(
            "invalid value for `data.numeric_bins`: expected 0 (no bins), 2 to 64 bins or `auto`, got {bad}"
        )
    };
    let kind = |what: &str| {
        format!(
            "at `data.numeric_bins`: invalid value: {what}, expected a bin count (0, or 2 to 64) or `auto`"
        )
    };
    for (bad, want) in [
        ("1", range("1")),
        ("65", range("65")),
        ("-3", kind("integer `-3`")),
        ("eight", kind("string \"eight\"")),
    ] {
        let cfg = binned(tmp.path(), &data, bad);
        let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(&want), "{want}: {}", stderr(&o));
    }
}

/// `numeric_bins: auto` on a table: the candidates' run directories (the mean stage only, one
/// with each value's 8 bins, one without), the manifest's record of them, and the choice.
fn auto_run(dir: &Path, data: &Path) -> (PathBuf, Value) {
    std::fs::create_dir_all(dir).unwrap();
    let cfg = binned(dir, data, "auto");
    let o = kiln(&["train", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The mean stage is not trained a third time: the run takes the chosen candidate's.
    assert!(
        stderr(&o).contains("numeric_bins auto: the run goes on from candidate bins-"),
        "{}",
        stderr(&o)
    );
    let ckpt = exported(&o);
    let m: Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("manifest.json")).unwrap()).unwrap();
    (ckpt, m)
}

/// Each of `t.csv`'s candidates trained the mean stage alone on the value (and its 8 bins),
/// and the run kept the lower validation loss, trained as a fixed config would train it, and
/// passes the gate (which re-reads the rows as the checkpoint was trained on them).
fn check_auto(tmp: &Path, data: &Path, name: &str) -> usize {
    let (ckpt, m) = auto_run(&tmp.join(name), data);
    let run = only_run(&tmp.join(name).join("out"));
    let choice = &m["metrics"]["numeric_bins"];
    eprintln!("{name}: {choice}");
    assert_eq!(choice["stage"], "mean", "{choice}");
    let mut losses = Vec::new();
    for (c, bins) in choice["candidates"].as_array().unwrap().iter().zip([8, 0]) {
        assert_eq!(c["bins"], bins, "{choice}");
        let dir = run.join("numeric-bins").join(format!("bins-{bins}"));
        let cand = kiln::artifact::Checkpoint::load(&dir.join("export")).unwrap();
        assert_eq!(cand.weights.arch.n_features, 2 + 2 * bins);
        let stages = &cand.manifest.metrics.stages;
        assert_eq!(
            stages.len(),
            1,
            "a candidate trains through the deciding stage"
        );
        assert_eq!(c["validation_loss"].as_f64(), Some(stages[0].best_val_loss));
        losses.push((stages[0].best_val_loss, bins));
    }
    let best = losses
        .iter()
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
        .unwrap();
    let chosen = choice["chosen"].as_u64().unwrap() as usize;
    assert_eq!(chosen, best.1, "{choice}");
    // The run's own mean stage is the chosen candidate's, epoch for epoch.
    assert_eq!(
        m["metrics"]["stages"][0]["best_val_loss"].as_f64(),
        Some(best.0)
    );
    let auto = kiln::artifact::Checkpoint::load(&ckpt).unwrap();
    assert_eq!(auto.weights.arch.n_features, 2 + 2 * chosen);
    // Its logs hold every epoch of both stages, the candidate's mean stage included.
    let epochs = std::fs::read_to_string(run.join("epochs.jsonl")).unwrap();
    assert_eq!(epochs.lines().count(), 12 + 4);
    // So does the registry: the observers were given the epochs taken over.
    let registry =
        kiln::track::registry::Registry::open(&tmp.join(name).join("out").join("runs.db")).unwrap();
    let id = run.file_name().unwrap().to_str().unwrap();
    let recorded = registry.epochs(id).unwrap();
    assert_eq!(
        recorded
            .iter()
            .map(|r| (r.stage, r.epoch))
            .collect::<Vec<_>>(),
        (0..12)
            .map(|e| (0, e))
            .chain((0..4).map(|e| (1, e)))
            .collect::<Vec<_>>()
    );
    let mean_steps = |dir: &Path| {
        let text = std::fs::read_to_string(dir.join("steps.csv")).unwrap();
        text.lines().filter(|l| l.starts_with("0,")).count()
    };
    let from = run.join("numeric-bins").join(format!("bins-{chosen}"));
    assert!(mean_steps(&from) >= 12);
    assert_eq!(mean_steps(&run), mean_steps(&from));

    // A config fixing the choice trains the same weights.
    let fixed = tmp.join(format!("{name}-fixed"));
    std::fs::create_dir_all(&fixed).unwrap();
    let cfg = binned(&fixed, data, &chosen.to_string());
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let same = kiln::artifact::Checkpoint::load(&exported(&o)).unwrap();
    assert_eq!(same.weights, auto.weights);

    // The gate reads the rows as the checkpoint was trained on them, and each model's rows
    // through its own bins: the second table's run is judged against the first one's served
    // version (same raw columns, other bins), promoted or refused (exit 3), never an error.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["promote", "--checkpoint"])
        .arg(&run)
        .arg("--repository")
        .arg(tmp.join("repo"))
        .args(["--model", "m", "--latency-ms", "1000", "--registry"])
        .arg(tmp.join("registry.db"))
        .output()
        .unwrap();
    assert!(
        matches!(o.status.code(), Some(0 | 3)),
        "{name}: {}",
        stderr(&o)
    );
    chosen
}

#[test]
fn auto_bins_keep_the_lower_validation_loss_and_train_it_as_a_fixed_config_would() {
    let tmp = tempfile::tempdir().unwrap();
    // y = sin(3a) + b²: curved in both features.
    let curved = tmp.path().join("curved.csv");
    table(&curved, 600);
    // y = a − 2b + much noise on 140 training rows: nothing for bins to find but the noise.
    let line = tmp.path().join("line.csv");
    let mut text = String::from("part,a,b,y\n");
    let mut next = crate::common::uniforms(77);
    for i in 0..200 {
        let part = [2, 2, 1, 1, 0, 0, 0, 0, 0, 0][i % 10];
        let (a, b) = (2.0 * next() - 1.0, 2.0 * next() - 1.0);
        let y = a - 2.0 * b + 2.0 * (next() - 0.5);
        text.push_str(&format!("{part},{a:.5},{b:.5},{y:.5}\n"));
    }
    std::fs::write(&line, text).unwrap();
    // Wide margins both ways when written (validation loss 0.0044 with bins against 0.079
    // without on the curved table; 0.163 against 0.135 on the line), so each path runs: the
    // gate also reads a no-bins checkpoint's rows through an `auto` config.
    assert_eq!(check_auto(tmp.path(), &curved, "curved"), 8);
    assert_eq!(check_auto(tmp.path(), &line, "line"), 0);
    // The second gate measured the served 8-bin version on the line table's rows.
    let rows = kiln::track::registry::Registry::open(&tmp.path().join("registry.db"))
        .unwrap()
        .promotions(Some("m"))
        .unwrap();
    assert_eq!(rows.len(), 2);
    let second = rows.iter().find(|r| r.incumbent_version.is_some()).unwrap();
    assert_eq!(second.incumbent_version, Some(1));
    assert!(second.details.incumbent.is_some());
}

#[test]
fn auto_bins_killed_midway_resume_to_the_same_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("t.csv");
    table(&data, 400);
    let (whole, _) = auto_run(&tmp.path().join("whole"), &data);
    let reference = kiln::artifact::Checkpoint::load(&whole).unwrap().weights;

    // Killed in the second candidate (the first runs 12 epochs; the 15th epoch is the
    // second's third), and while the chosen candidate's state is copied into the run.
    for (cut, fault) in [
        ("candidate", "kill@after-epoch-log:15"),
        ("adopt", "kill@during-adopt"),
    ] {
        let dir = tmp.path().join(cut);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = binned(&dir, &data, "auto");
        let o = kiln_env(
            &["train", cfg.to_str().unwrap(), "-q"],
            &[("KILN_FAULT", fault)],
        );
        assert!(
            !o.status.success(),
            "{fault}: the planted kill did not happen"
        );
        let run = only_run(&dir.join("out"));
        assert!(
            run.join("numeric-bins/bins-8/export/manifest.json")
                .is_file()
        );
        assert!(!run.join("state/LATEST").exists(), "{fault}");
        let o = resume(&cfg, &run);
        assert!(o.status.success(), "{fault}: {}", stderr(&o));
        let resumed = kiln::artifact::Checkpoint::load(&exported(&o))
            .unwrap()
            .weights;
        assert_eq!(resumed, reference, "{fault}");
    }
}

/// With `refit: train+validation` the candidates choose on the validation rows; then the
/// selection and refit passes both train from the start with the chosen bins (the refit pass
/// trains on other rows, so nothing is taken over), and the manifest records both choices.
#[test]
fn auto_bins_under_refit_choose_first_then_refit_with_the_choice() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("t.csv");
    table(&data, 400);
    let cfg = binned(tmp.path(), &data, "auto");
    let text = std::fs::read_to_string(&cfg).unwrap() + "refit: train+validation\n";
    std::fs::write(&cfg, text).unwrap();
    let o = kiln(&["train", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("goes on from candidate"),
        "{}",
        stderr(&o)
    );
    let ckpt = exported(&o);
    let m: Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("manifest.json")).unwrap()).unwrap();
    let chosen = m["metrics"]["numeric_bins"]["chosen"].as_u64().unwrap() as usize;
    assert_eq!(m["metrics"]["refit"]["trained_on"], "train+validation");
    let run = only_run(&tmp.path().join("out"));
    for dir in [run.join("selection/export"), ckpt] {
        let c = kiln::artifact::Checkpoint::load(&dir).unwrap();
        assert_eq!(
            c.weights.arch.n_features,
            2 + 2 * chosen,
            "{}",
            dir.display()
        );
    }
}

/// The starter config `kiln init` writes trains as it stands: its `numeric_bins: auto` reads
/// a text column beside the numeric ones, chooses, and the checkpoint predicts raw rows.
#[test]
fn a_kiln_init_config_chooses_its_bins_and_predicts() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("shop.csv");
    let mut next = crate::common::uniforms(5);
    let mut text = String::from("store,price,size,sales\n");
    for i in 0..300 {
        let (price, size) = (10.0 + 20.0 * next(), 1.0 + 4.0 * next());
        let store = ["north", "south", "east"][i % 3];
        let sales = 50.0 + if price > 20.0 { -15.0 } else { 0.0 } + 3.0 * size + 4.0 * next();
        text.push_str(&format!("{store},{price:.3},{size:.3},{sales:.3}\n"));
    }
    std::fs::write(&data, text).unwrap();
    let cfg = tmp.path().join("init.yaml");
    let o = kiln(&[
        "init",
        "--data",
        data.to_str().unwrap(),
        "--target",
        "sales",
        "--out",
        cfg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    assert!(yaml.contains("  numeric_bins: auto\n"), "{yaml}");
    let export = tmp.path().join("checkpoints");
    let o = kiln(&[
        "train",
        cfg.to_str().unwrap(),
        "-q",
        "--set",
        &format!("export.dir={}", export.display()),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = exported(&o);
    let m = kiln::artifact::Checkpoint::load(&ckpt).unwrap().manifest;
    let choice = m.metrics.numeric_bins.as_ref().unwrap();
    let binned = m
        .input_preprocessing()
        .inputs
        .iter()
        .filter(|c| c.bins.is_some())
        .count();
    assert_eq!(binned, if choice.chosen > 0 { 2 } else { 0 }, "{choice:?}");
    let rows = tmp.path().join("rows.csv");
    std::fs::write(&rows, "store,price,size\nnorth,12.5,2\nwest,25,4\n").unwrap();
    let out = tmp.path().join("pred.csv");
    let o = crate::common::predict(ckpt.to_str().unwrap(), &rows, &out);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
}

/// `auto` on a table none of whose features takes bins (a 0/1 column, a category) trains
/// once: there is nothing to choose, and the manifest says so.
#[test]
fn auto_bins_without_a_binnable_feature_train_once() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("t.csv");
    let mut next = crate::common::uniforms(3);
    let mut text = String::from("part,a,b,y\n");
    for i in 0..200 {
        let part = [2, 2, 1, 1, 0, 0, 0, 0, 0, 0][i % 10];
        let a = (next() > 0.5) as u8;
        let b = ["x", "y", "z"][i % 3];
        let y = f64::from(a) + if b == "y" { 1.0 } else { 0.0 } + 0.1 * next();
        text.push_str(&format!("{part},{a},{b},{y:.5}\n"));
    }
    std::fs::write(&data, text).unwrap();
    let cfg = binned(tmp.path(), &data, "auto");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("  targets: [y]", "  categorical: [b]\n  targets: [y]");
    std::fs::write(&cfg, text).unwrap();
    let o = kiln(&["train", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o)
            .contains("numeric_bins auto: no feature takes bins, so there is nothing to choose"),
        "{}",
        stderr(&o)
    );
    let ckpt = exported(&o);
    let m = kiln::artifact::Checkpoint::load(&ckpt).unwrap().manifest;
    let choice = m.metrics.numeric_bins.unwrap();
    assert_eq!((choice.chosen, choice.candidates.len()), (0, 0));
    assert!(
        !only_run(&tmp.path().join("out"))
            .join("numeric-bins")
            .exists()
    );
}
