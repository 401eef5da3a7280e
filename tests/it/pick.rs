//! `kiln pick` end to end on a freshly trained tiny checkpoint.

use crate::common::root;
use std::process::Command;

use kiln::config;
use kiln::train::train_cpu;

fn pick(args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("pick")
        .args(args)
        .current_dir(root())
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The standard normal CDF: Simpson's rule on the density from -12 (the mass below is under
/// 1e-32) to `z`, 20,000 intervals (error far below 1e-9 for the slopes here).
fn normal_cdf(z: f64) -> f64 {
    let a = -12.0;
    if z <= a {
        return 0.0;
    }
    let n = 20_000;
    let h = (z - a) / n as f64;
    let f = |x: f64| (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let mut sum = f(a) + f(z);
    for i in 1..n {
        let w = if i % 2 == 1 { 4.0 } else { 2.0 };
        sum += w * f(a + i as f64 * h);
    }
    sum * h / 3.0
}

/// The raw features (in `features`' order) of the dataset's row for `player` in `season`.
fn dataset_row(features: &[String], player: &str, season: &str) -> Vec<f32> {
    let table = std::fs::read_to_string(root().join("datasets/baseball.csv")).unwrap();
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (p, s) = (col("player_id"), col("season"));
    let rows: Vec<Vec<&str>> = lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|r| r[p] == player && r[s] == season)
        .collect();
    assert_eq!(rows.len(), 1, "{player}:{season}");
    features
        .iter()
        .map(|f| rows[0][col(f)].parse().unwrap())
        .collect()
}

#[test]
fn pick_probabilities_from_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let mut loaded = config::load(&root().join("configs/tiny.yaml")).unwrap();
    loaded.config.export.dir = tmp.path().to_path_buf();
    let export = train_cpu(&loaded, tmp.path())
        .unwrap()
        .outcome
        .export_dir
        .unwrap();
    let ckpt = export.to_str().unwrap();
    let legs = tmp.path().join("legs.csv");
    std::fs::write(
        &legs,
        "pick,player_id,season,target,line,side\n\
         single,troutmi01,2018,hr_rate,0.05,over\n\
         same_row,troutmi01,2018,hr_rate,0.05,over\n\
         same_row,troutmi01,2018,so_rate,0.25,under\n\
         two_rows,troutmi01,2018,hr_rate,0.05,over\n\
         two_rows,bettsmo01,2018,bb_rate,0.08,over\n",
    )
    .unwrap();
    let (code, out, err) = pick(&[
        "--checkpoint",
        ckpt,
        "--legs",
        legs.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let get = |n: &str| lines.iter().find(|v| v["pick"] == n).unwrap().clone();
    for v in &lines {
        let p = v["p"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&p));
    }
    // The expected probabilities, computed here: the model's mean and std for each row
    // (the library's predictor on the dataset's row, found by its key), and Φ by numerical
    // integration of the normal density.
    let checkpoint = kiln::artifact::Checkpoint::load(&export).unwrap();
    let engine =
        kiln::infer::build_engine(kiln::records::EngineKind::Burn, &checkpoint.weights, 1).unwrap();
    let mut predictor = kiln::predict::Predictor::for_checkpoint(&checkpoint, engine);
    let targets = checkpoint.manifest.target_names();
    let mut leg = |player: &str, target: &str, line: f64, over: bool| -> f64 {
        let x = dataset_row(&checkpoint.manifest.feature_names(), player, "2018");
        let pred = predictor.predict(&x, 1).unwrap();
        let k = targets.iter().position(|t| t == target).unwrap();
        let (mean, std) = (pred.mean[k] as f64, pred.std[k] as f64);
        let below = normal_cdf((line - mean) / std);
        if over { 1.0 - below } else { below }
    };
    let trout_hr = leg("troutmi01", "hr_rate", 0.05, true);
    let trout_so = leg("troutmi01", "so_rate", 0.25, false);
    let betts_bb = leg("bettsmo01", "bb_rate", 0.08, true);
    // One leg is Φ of its standardised line.
    let single = get("single");
    let p1 = single["p"].as_f64().unwrap();
    assert!(
        (p1 - trout_hr).abs() < 1e-5,
        "{p1} vs Φ = {trout_hr}: {single}"
    );
    assert!(
        (single["leg_p"][0].as_f64().unwrap() - trout_hr).abs() < 1e-5,
        "{single}"
    );
    // Different rows are independent: the product of the legs.
    let two = get("two_rows");
    let product = trout_hr * betts_bb;
    assert!(
        (two["p"].as_f64().unwrap() - product).abs() < 1e-5,
        "{product}: {two}"
    );
    // Same row: the residual correlation moves the answer away from the product.
    let same = get("same_row");
    let product = trout_hr * trout_so;
    assert!(
        (same["independent_p"].as_f64().unwrap() - product).abs() < 1e-5,
        "{product}: {same}"
    );
    assert!(
        (same["p"].as_f64().unwrap() - product).abs() > 1e-4,
        "{product}: {same}"
    );

    std::fs::write(&legs, "player_id,season,target,line,side\ntroutmi01,2018,hr_rate,0.05,over\ntroutmi01,2018,xbh_rate,0.1,over\n").unwrap();
    let (code, _, err) = pick(&["--checkpoint", ckpt, "--legs", legs.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("legs.csv:3: column `target`: unknown target \"xbh_rate\""),
        "{err}"
    );
    std::fs::write(
        &legs,
        "player_id,season,target,line,side\nnobody,2018,hr_rate,0.05,over\n",
    )
    .unwrap();
    let (code, _, err) = pick(&["--checkpoint", ckpt, "--legs", legs.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("no row with player_id:season = nobody:2018"),
        "{err}"
    );
    std::fs::write(
        &legs,
        "player_id,season,target,line,side\ntroutmi01,2018,hr_rate,0.05,sideways\n",
    )
    .unwrap();
    let (code, _, err) = pick(&["--checkpoint", ckpt, "--legs", legs.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(err.contains("column `side`"), "{err}");
}

/// `kiln train` prints the pick lines (and which pricing wins) only for a table whose targets
/// have persistence features (`<target>_l1`): the tiny baseball config does, an ordinary
/// regression table does not (its evaluation stays in the manifest).
#[test]
fn train_prints_pick_lines_only_where_picks_apply() {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("out");
    let (from, to) = crate::common::absolute_data();
    let tiny = crate::common::tiny_config(dir.path(), &export, &[(from, &to)]);
    let o = crate::common::kiln(&["train", "--plain", tiny.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    assert!(err.contains("picks vs test outcomes, single legs"), "{err}");
    let verdict = err
        .lines()
        .find(|l| l.starts_with("picks vs test outcomes, 3-leg picks: "))
        .unwrap_or_else(|| panic!("no verdict line in {err}"));
    assert!(
        verdict.contains("wins (Brier") || verdict.contains("a tie"),
        "{verdict}"
    );

    let mut csv = String::from("x,z,y\n");
    for i in 0..120 {
        csv.push_str(&format!("{i},{},{}\n", i % 5, (i % 9) as f64 * 0.5));
    }
    let data = dir.path().join("plain.csv");
    std::fs::write(&data, csv).unwrap();
    let cfg = dir.path().join("plain.yaml");
    std::fs::write(
        &cfg,
        format!(
            "name: plain\ndata:\n  path: {}\n  features: [x, z]\n  targets: [y]\n  split: {{by: random, validation: 0.2, test: 0.2}}\nmodel:\n  hidden: [4]\nstages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 2\nexport:\n  dir: {}\n",
            data.display(),
            export.display()
        ),
    )
    .unwrap();
    let o = crate::common::kiln(&["train", "--plain", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("picks vs test"), "{err}");
}
