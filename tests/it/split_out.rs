//! Split membership out (`kiln config split`): the row → split assignment training uses, so
//! that another model can be fitted and scored on exactly the same rows. A column split with
//! a row outside every split and a row whose target is missing (dropped by training, so left
//! out); a random split whose counts equal what training reports.

use std::path::Path;

use crate::common::kiln;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn config(dir: &Path, data: &Path, split: &str) -> std::path::PathBuf {
    write(
        dir,
        "split.yaml",
        &format!(
            "name: split\ndata:\n  path: {}\n  features: [x]\n  targets: [y]\n  split:\n{split}model:\n  hidden: [4]\nstages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 1\n",
            data.display()
        ),
    )
}

#[test]
fn config_split_writes_the_rows_training_uses() {
    let dir = tempfile::tempdir().unwrap();
    // part: 0 train, 1 validation, 2 test, 9 outside every split; row 4 has no target.
    let mut csv = String::from("part,x,y\n");
    let parts = [0, 0, 1, 2, 0, 9, 2, 1, 0, 0];
    for (i, p) in parts.iter().enumerate() {
        let y = if i == 4 {
            String::new()
        } else {
            format!("{}", i as f64 * 0.5)
        };
        csv.push_str(&format!("{p},{i},{y}\n"));
    }
    let data = write(dir.path(), "t.csv", &csv);
    let cfg = config(
        dir.path(),
        &data,
        "    column: part\n    train: {to: 0}\n    validation: {from: 1, to: 1}\n    test: {from: 2, to: 2}\n",
    );
    let out = dir.path().join("membership.csv");
    let o = kiln(&[
        "config",
        "split",
        cfg.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        text,
        "row,split\n0,train\n1,train\n2,validation\n3,test\n6,test\n7,validation\n8,train\n9,train\n"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("4 train, 2 validation, 2 test rows"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Without --out: the same CSV on stdout; --set reaches the split.
    let o = kiln(&[
        "config",
        "split",
        cfg.to_str().unwrap(),
        "--set",
        "data.split.test={from: 2, to: 9}",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("\n5,test\n"));
}

#[test]
fn config_split_of_a_random_split_matches_training_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut csv = String::from("x,y\n");
    for i in 0..200 {
        csv.push_str(&format!("{i},{}\n", (i % 7) as f64));
    }
    let data = write(dir.path(), "r.csv", &csv);
    let cfg = config(
        dir.path(),
        &data,
        "    by: random\n    seed: 3\n    validation: 0.15\n    test: 0.15\n",
    );
    let o = kiln(&["config", "split", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 200, "every row is in a split");
    let count = |s: &str| {
        lines
            .iter()
            .filter(|l| l.ends_with(&format!(",{s}")))
            .count()
    };
    assert_eq!(
        (count("train"), count("validation"), count("test")),
        (140, 30, 30)
    );
    let rows: Vec<usize> = lines
        .iter()
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(rows, (0..200).collect::<Vec<_>>(), "rows in file order");

    // A missing config is a clear error, not a panic.
    let o = kiln(&["config", "split", "no/such.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no/such.yaml"));
}
