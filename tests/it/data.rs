//! Bring your own table: `kiln config check` against the data, relative windows, missing
//! values from training through `kiln predict`.

use std::path::Path;

use crate::common::{kiln, root, tiny_config};
use crate::common::{stderr, stdout};

#[test]
fn config_check_and_train_refuse_bad_data_before_any_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("out");
    let cases = [
        (
            ("features: [age,", "features: [nope, age,"),
            "missing column `nope`",
        ),
        (
            ("test: {from: 2017, to: 2019}", "test: {from: 2030}"),
            "the test split (≥ 2030) selects no rows",
        ),
        (
            ("features: [age,", "features: [player_id, age,"),
            "column `player_id`: expected a number, got",
        ),
        (
            ("test: {from: 2017, to: 2019}", "test: {from: 2017-01-01}"),
            "one split column has one kind",
        ),
    ];
    for ((a, b), expected) in cases {
        let cfg = tiny_config(tmp.path(), &export, &[(a, b)]);
        for args in [
            vec!["config", "check", cfg.to_str().unwrap()],
            vec!["train", cfg.to_str().unwrap(), "-q"],
        ] {
            let o = kiln(&args);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
            assert!(stderr(&o).contains(expected), "{args:?}: {}", stderr(&o));
            assert!(!export.exists(), "{args:?} left {}", export.display());
        }
    }
    // A good config prints the data summary.
    let cfg = tiny_config(tmp.path(), &export, &[]);
    let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("2874 train / 564 validation / 820 test rows")
            && out.contains("outside every split")
            && out.contains("missing cells: none"),
        "{out}"
    );
    assert!(!export.exists());
}

/// The baseball table with a few cells blanked: `age` (a feature) and `hr_rate` (a target).
fn with_holes(dir: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(root().join("datasets/baseball.csv")).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let (age, hr) = (
        header.iter().position(|h| *h == "age").unwrap(),
        header.iter().position(|h| *h == "hr_rate").unwrap(),
    );
    for (i, line) in lines.iter_mut().enumerate().skip(1) {
        let mut cells: Vec<String> = line.split(',').map(String::from).collect();
        if i % 7 == 0 {
            cells[age] = ["", "NA", "NaN", "null"][i / 7 % 4].to_string();
        }
        if i % 50 == 3 {
            cells[hr] = String::new();
        }
        *line = cells.join(",");
    }
    // CRLF, as Excel writes it.
    let p = dir.join("holes.csv");
    std::fs::write(&p, lines.join("\r\n") + "\r\n").unwrap();
    p
}

#[test]
fn missing_values_are_imputed_in_training_and_in_predict() {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("out");
    let data = with_holes(tmp.path());
    // Without a policy: the first hole is named by line (CRLF counted right) and column.
    let cfg = tiny_config(
        tmp.path(),
        &export,
        &[(
            "path: datasets/baseball.csv",
            &format!("path: {}", data.display()),
        )],
    );
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    // Line 8 is data row 7 (the first with a hole), inside the 2005–2019 splits or not:
    // the first hole inside a split is reported.
    assert!(
        err.contains("holes.csv:") && err.contains("column `age`: missing value"),
        "{err}"
    );
    let line: u64 = err
        .split("holes.csv:")
        .nth(1)
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!((line - 1) % 7, 0, "line {line} is a row with a hole: {err}");
    assert!(!export.exists());

    let cfg = tiny_config(
        tmp.path(),
        &export,
        &[
            (
                "path: datasets/baseball.csv",
                &format!("path: {}", data.display()),
            ),
            (
                "  split:\n",
                "  missing:\n    columns:\n      age: {impute: median, indicator: true}\n  split:\n",
            ),
        ],
    );
    let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("imputed cells: age:"), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("missing target `hr_rate` (train):"),
        "{}",
        stdout(&o)
    );
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = stdout(&o).lines().last().unwrap().trim().to_string();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(Path::new(&ckpt).join("manifest.json")).unwrap())
            .unwrap();
    let pre = &manifest["preprocessing"];
    let age = &pre["inputs"][0];
    assert_eq!(age["name"], "age");
    assert_eq!(age["indicator"], true);
    let median = age["impute"].as_f64().unwrap();
    assert!((25.0..35.0).contains(&median), "{median}");
    assert!(pre["imputed"]["age"].as_u64().unwrap() > 100, "{pre}");
    assert!(
        pre["dropped"]["missing target `hr_rate` (train)"]
            .as_u64()
            .unwrap()
            > 10
    );
    let names: Vec<&str> = manifest["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.last(), Some(&"age_missing"));

    // `kiln predict` reads raw columns: a missing age is imputed, a given one is not.
    let cols = [
        "age",
        "experience",
        "pa_l1",
        "hr_rate_l1",
        "bb_rate_l1",
        "so_rate_l1",
        "pa_l2",
        "hr_rate_l2",
        "bb_rate_l2",
        "so_rate_l2",
    ];
    let rest = "5,600,0.03,0.08,0.15,580,0.03,0.08,0.16";
    let input = tmp.path().join("rows.csv");
    std::fs::write(
        &input,
        format!(
            "id,{}\nhole,,{rest}\nmedian,{median},{rest}\nold,38,{rest}\n",
            cols.join(",")
        ),
    )
    .unwrap();
    let out = tmp.path().join("pred.csv");
    let o = crate::common::predict(&ckpt, &input, &out);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    let rows: Vec<Vec<f64>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').skip(1).map(|c| c.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert!(rows.iter().flatten().all(|v| v.is_finite()), "{text}");
    // The indicator makes "missing" differ from "given as the median".
    assert_ne!(rows[0], rows[1], "{text}");
    assert_ne!(rows[1], rows[2], "{text}");
}
