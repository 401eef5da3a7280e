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
    let single = get("single");
    let p1 = single["p"].as_f64().unwrap();
    assert!(
        (p1 - single["leg_p"][0].as_f64().unwrap()).abs() < 1e-6,
        "one leg is Φ: {single}"
    );
    for v in &lines {
        let p = v["p"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&p));
    }
    // Different rows are independent: the product of the legs.
    let two = get("two_rows");
    assert!(
        (two["p"].as_f64().unwrap() - two["independent_p"].as_f64().unwrap()).abs() < 1e-6,
        "{two}"
    );
    // Same row: the residual correlation moves the answer away from the product.
    let same = get("same_row");
    assert!(
        (same["p"].as_f64().unwrap() - same["independent_p"].as_f64().unwrap()).abs() > 1e-4,
        "{same}"
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
