//! Tests of splits and missing values through [`Dataset::from_table`] on tables made here and
//! on the shipped baseball data.

use std::collections::BTreeSet;
use std::path::Path;

use super::Dataset;
use super::preprocess::EncodeTable;
use super::table::{CsvTable, DataError};
use crate::config::{DataConfig, parse};

/// A config whose `data:` section is `data` (indented two spaces by the caller).
fn cfg(data: &str) -> DataConfig {
    let text = format!(
        "data:\n  path: t.csv\n{data}\nstages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 1\n"
    );
    parse(&text, Path::new("t.yaml"))
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .data
}

fn table(text: &str) -> CsvTable {
    CsvTable::from_bytes(text.as_bytes(), Path::new("t.csv")).unwrap()
}

fn load(data: &str, text: &str) -> Result<Dataset, DataError> {
    Dataset::from_table(&cfg(data), &table(text), String::new())
}

fn baseball() -> CsvTable {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets/baseball.csv");
    CsvTable::read(&path).unwrap()
}

/// The baseball table with only the seasons up to `last`.
fn baseball_until(full: &CsvTable, last: i64) -> CsvTable {
    let s = full.column_index("season").unwrap();
    full.retain_rows(|r| full.cell(r, s).parse::<i64>().unwrap() <= last)
}

const BASEBALL: &str = "  features: [age, pa_l1, hr_rate_l1]\n  targets: [hr_rate]\n";

#[test]
fn todays_season_ranges_work_unchanged() {
    let d = load(
        "  features: [a]\n  targets: [y]\n  split:\n    train: {to: 2001}\n    validation: {from: 2002, to: 2002}\n    test: {from: 2003}\n",
        "season,a,y\n2000,1,1\n2001,2,2\n2002,3,3\n2003,4,4\n1999,0,0\n",
    )
    .unwrap();
    assert_eq!(d.train.x, vec![1.0, 2.0, 0.0]);
    assert_eq!(d.validation.x, vec![3.0]);
    assert_eq!(d.test.season, vec![2003]);
    assert_eq!(d.unused_rows, 0);
    assert_eq!(d.split_describe[0], "≤ 2001");
    assert_eq!(d.features, vec!["a"]);
}

#[test]
fn rows_outside_every_split_are_counted() {
    let d = load(
        "  features: [a]\n  targets: [y]\n  split:\n    train: {from: 2000, to: 2000}\n    validation: {from: 2001, to: 2001}\n    test: {from: 2002, to: 2002}\n",
        "season,a,y\n2000,1,1\n2001,2,2\n2002,3,3\n1990,4,4\n2050,5,5\n2000,6,6\n",
    )
    .unwrap();
    assert_eq!(d.unused_rows, 2);
    assert_eq!(d.preprocessing.rows_outside, 2);
    assert_eq!(d.preprocessing.dropped["outside every split"], 2);
    assert!(
        d.summary().contains("outside every split: 2"),
        "{}",
        d.summary()
    );
    // A missing cell outside every split does not stop anything.
    load(
        "  features: [a]\n  targets: [y]\n  split:\n    train: {from: 2000, to: 2000}\n    validation: {from: 2001, to: 2001}\n    test: {from: 2002, to: 2002}\n",
        "season,a,y\n2000,1,1\n2001,2,2\n2002,3,3\n1990,,NA\n",
    )
    .unwrap();
}

#[test]
fn fractional_split_values_are_an_error_not_truncated() {
    let e = load(
        "  features: [a]\n  targets: [y]\n  split:\n    train: {to: 2001}\n    validation: {from: 2002, to: 2002}\n    test: {from: 2003}\n",
        "season,a,y\n2000,1,1\n2001.5,2,2\n2002,3,3\n2003,4,4\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("t.csv:3: column `season`: expected an integer"),
        "{e}"
    );
    assert!(e.contains("2001.5"), "{e}");
}

#[test]
fn date_ranges_select_by_day_and_datetime() {
    let text = "when,a,y\n2021-01-01,1,1\n2021-01-31T23:00:00Z,2,2\n2021-02-01,3,3\n2021-02-15T08:00:00,4,4\n2021-03-01,5,5\n";
    let d = load(
        "  features: [a]\n  targets: [y]\n  split:\n    column: when\n    train: {to: 2021-01-31}\n    validation: {from: 2021-02-01, to: 2021-02-28}\n    test: {from: \"2021-03-01\"}\n",
        text,
    )
    .unwrap();
    // A date-only `to` includes the whole day.
    assert_eq!(d.train.x, vec![1.0, 2.0]);
    assert_eq!(d.validation.x, vec![3.0, 4.0]);
    assert_eq!(d.test.x, vec![5.0]);
    // An integer bound on a date column is refused with the key.
    let e = load(
        "  features: [a]\n  targets: [y]\n  split:\n    column: when\n    train: {to: 2020}\n    validation: {from: 2021, to: 2021}\n    test: {from: 2022}\n",
        text,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("data.split.train") && e.contains("holds dates"),
        "{e}"
    );
    // A cell that is not a date is located.
    let e = load(
        "  features: [a]\n  targets: [y]\n  split:\n    column: when\n    validation: {last: 1}\n    test: {last: 1}\n",
        "when,a,y\n2021-01-01,1,1\n2021-01-02,2,2\n2021-13-02,3,3\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("t.csv:4: column `when`: expected an ISO 8601 date"),
        "{e}"
    );
}

#[test]
fn relative_windows_move_as_the_baseball_data_grows() {
    let full = baseball();
    let split = "  split:\n    validation: {last: 2}\n    test: {last: 1}\n";
    let data = format!("{BASEBALL}{split}");
    let season_rows = |t: &CsvTable, from: i64, to: i64| {
        let s = t.column_index("season").unwrap();
        t.column_cells(s)
            .filter(|c| (from..=to).contains(&c.parse::<i64>().unwrap()))
            .count()
    };
    for last in [2016, 2018, 2020] {
        let t = baseball_until(&full, last);
        let d = Dataset::from_table(&cfg(&data), &t, String::new()).unwrap();
        assert_eq!(
            d.test.season.iter().collect::<BTreeSet<_>>(),
            [last].iter().collect()
        );
        assert_eq!(
            d.validation.season.iter().collect::<BTreeSet<_>>(),
            [last - 2, last - 1].iter().collect()
        );
        assert!(d.train.season.iter().all(|&s| s <= last - 3));
        assert_eq!(d.test.rows(), season_rows(&t, last, last));
        assert_eq!(d.validation.rows(), season_rows(&t, last - 2, last - 1));
        assert_eq!(d.train.rows(), season_rows(&t, 0, last - 3));
        assert_eq!(d.unused_rows, 0);
        assert_eq!(d.split_describe[2], format!("last 1 ({last})"));
        assert_eq!(
            d.split_describe[1],
            format!("last 2 ({}–{})", last - 2, last - 1)
        );
    }
    // A train range still bounds the oldest seasons.
    let data = format!(
        "{BASEBALL}  split:\n    train: {{from: 2000}}\n    validation: {{last: 2}}\n    test: {{last: 1}}\n"
    );
    let d = Dataset::from_table(&cfg(&data), &full, String::new()).unwrap();
    assert!(d.train.season.iter().all(|&s| (2000..=2017).contains(&s)));
    assert_eq!(d.unused_rows, season_rows(&full, 0, 1999));
}

#[test]
fn relative_windows_on_dates_by_count_and_duration() {
    let mut text = String::from("day,a,y\n");
    // 40 daily rows from 2021-01-01, in shuffled order.
    for i in [5u32, 0, 39, 12, 38, 1, 20, 37, 30, 9] {
        let (m, d) = if i < 31 { (1, i + 1) } else { (2, i - 30) };
        text.push_str(&format!("2021-{m:02}-{d:02},{i},{i}\n"));
    }
    let d = load(
        "  features: [a]\n  targets: [y]\n  split:\n    column: day\n    validation: {last: \"7d\"}\n    test: {last: 2d}\n",
        &text,
    )
    .unwrap();
    // Newest 2021-02-09 (day 39): test (02-07, 02-09] = days 38, 39; validation (01-31, 02-07] = 37.
    let days = |x: &[f32]| x.iter().map(|&v| v as u32).collect::<BTreeSet<_>>();
    assert_eq!(days(&d.test.x), [38, 39].into());
    assert_eq!(days(&d.validation.x), [37].into());
    assert_eq!(days(&d.train.x), [0, 1, 5, 9, 12, 20, 30].into());
    assert_eq!(d.split_describe[2], "last 2d (2021-02-08–2021-02-09)");
    // Counts of distinct dates.
    let d = load(
        "  features: [a]\n  targets: [y]\n  split:\n    column: day\n    validation: {last: 3}\n    test: {last: 1}\n",
        &text,
    )
    .unwrap();
    assert_eq!(days(&d.test.x), [39].into());
    assert_eq!(days(&d.validation.x), [30, 37, 38].into());
    // A duration on an integer column is refused.
    let e = load(
        "  features: [a]\n  targets: [y]\n  split:\n    validation: {last: 7d}\n    test: {last: 1}\n",
        "season,a,y\n1,1,1\n2,2,2\n3,3,3\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("needs a date column"), "{e}");
    // Too few distinct values for the windows.
    let e = load(
        "  features: [a]\n  targets: [y]\n  split:\n    validation: {last: 2}\n    test: {last: 1}\n",
        "season,a,y\n1,1,1\n2,2,2\n3,3,3\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("validation window {last: 2} needs more than 2 distinct values"),
        "{e}"
    );
}

fn numbered(n: usize, groups: usize) -> String {
    let mut s = String::from("id,g,a,y\n");
    for i in 0..n {
        s.push_str(&format!("{i},p{},{i},{i}\n", i % groups));
    }
    s
}

#[test]
fn random_split_has_the_fractions_and_depends_only_on_the_seed() {
    let text = numbered(1000, 1);
    let data = |seed: u64| {
        format!(
            "  features: [a]\n  targets: [y]\n  split:\n    by: random\n    seed: {seed}\n    validation: 0.2\n    test: 0.1\n"
        )
    };
    let a = load(&data(7), &text).unwrap();
    assert_eq!(
        [a.train.rows(), a.validation.rows(), a.test.rows()],
        [700, 200, 100]
    );
    let b = load(&data(7), &text).unwrap();
    assert_eq!(a.test.x, b.test.x);
    assert_eq!(a.validation.x, b.validation.x);
    let c = load(&data(8), &text).unwrap();
    assert_ne!(a.test.x, c.test.x);
    let mut all: Vec<u32> = [&a.train, &a.validation, &a.test]
        .iter()
        .flat_map(|s| s.x.iter().map(|&v| v as u32))
        .collect();
    all.sort();
    assert_eq!(all, (0..1000).collect::<Vec<_>>());
    // A train fraction leaves the rest outside, counted.
    let d = load(
        "  features: [a]\n  targets: [y]\n  split:\n    by: random\n    train: 0.5\n    validation: 0.2\n    test: 0.1\n",
        &text,
    )
    .unwrap();
    assert_eq!(d.train.rows(), 500);
    assert_eq!(d.unused_rows, 200);
}

#[test]
fn group_split_keeps_each_group_in_one_split() {
    let text = numbered(600, 37);
    let data = |seed: u64| {
        format!(
            "  features: [a]\n  targets: [y]\n  split:\n    by: group\n    column: g\n    seed: {seed}\n    validation: 0.2\n    test: 0.2\n"
        )
    };
    let d = load(&data(3), &text).unwrap();
    let group_of =
        |s: &super::Subset| -> BTreeSet<u32> { s.x.iter().map(|&v| v as u32 % 37).collect() };
    let (tr, va, te) = (
        group_of(&d.train),
        group_of(&d.validation),
        group_of(&d.test),
    );
    assert!(tr.is_disjoint(&va) && tr.is_disjoint(&te) && va.is_disjoint(&te));
    assert_eq!(tr.len() + va.len() + te.len(), 37);
    assert_eq!([va.len(), te.len()], [7, 7]);
    assert_eq!(d.train.rows() + d.validation.rows() + d.test.rows(), 600);
    let again = load(&data(3), &text).unwrap();
    assert_eq!(again.test.x, d.test.x);
    assert_ne!(load(&data(4), &text).unwrap().test.x, d.test.x);
    // Row order does not matter: groups, not rows, are drawn.
    let mut lines: Vec<&str> = text.lines().skip(1).collect();
    lines.reverse();
    let reversed = format!("id,g,a,y\n{}\n", lines.join("\n"));
    let r = load(&data(3), &reversed).unwrap();
    assert_eq!(group_of(&r.test), te);
}

#[test]
fn split_configs_are_checked() {
    let text = |split: &str| {
        format!(
            "data:\n  path: t.csv\n  features: [a]\n  targets: [y]\n  split:\n{split}\nstages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 1\n"
        )
    };
    for (split, key) in [
        (
            "    validation: {last: 2}\n    test: {from: 2019}",
            "data.split.validation",
        ),
        (
            "    validation: 0.2\n    test: 0.1",
            "data.split.validation",
        ),
        (
            "    by: random\n    validation: 0.6\n    test: 0.5",
            "data.split",
        ),
        (
            "    by: group\n    validation: 0.2\n    test: 0.1",
            "data.split.column",
        ),
        (
            "    by: random\n    validation: {last: 1}\n    test: 0.1",
            "data.split.validation",
        ),
        (
            "    train: {to: 2019-01-01}\n    validation: {from: 2015, to: 2016}\n    test: {from: 2017}",
            "data.split.train",
        ),
        (
            "    train: {from: 2019-02-01, to: 2019-01-01}\n    validation: {last: 1}\n    test: {last: 1}",
            "data.split.train",
        ),
    ] {
        match parse(&text(split), Path::new("t.yaml")) {
            Err(crate::config::ConfigError::Invalid { key: k, .. }) => {
                assert_eq!(k, key, "{split}")
            }
            other => panic!("{split}: expected invalid {key}, got {other:?}"),
        }
    }
    let e = parse(
        &text("    validation: {last: 0}\n    test: {last: 1}"),
        Path::new("t.yaml"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("positive integer"), "{e}");
    let e = parse(
        &text("    validation: {last: soon}\n    test: {last: 1}"),
        Path::new("t.yaml"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("duration"), "{e}");
}

const SEASONS: &str = "  split:\n    train: {to: 2001}\n    validation: {from: 2002, to: 2002}\n    test: {from: 2003}\n";

#[test]
fn missing_feature_is_an_error_by_default_naming_line_and_column() {
    let e = load(
        &format!("  features: [a, b]\n  targets: [y]\n{SEASONS}"),
        "season,a,b,y\n2000,1,1,1\n2001,NA,2,2\n2002,3,3,3\n2003,4,4,4\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("t.csv:3: column `a`: missing value \"NA\""),
        "{e}"
    );
    assert!(e.contains("data.missing"), "{e}");
}

#[test]
fn drop_row_and_missing_targets_are_counted_per_reason() {
    let d = load(
        &format!("  features: [a, b]\n  targets: [y]\n  missing:\n    default: drop_row\n{SEASONS}"),
        "season,a,b,y\n2000,1,1,1\n2001,,2,2\n2000,5,null,5\n2001,6,6,NaN\n2002,3,3,3\n2002,7,7,\n2003,4,4,4\n",
    )
    .unwrap();
    assert_eq!(d.train.x, vec![1.0, 1.0]);
    assert_eq!(d.validation.rows(), 1);
    let dropped = &d.preprocessing.dropped;
    assert_eq!(dropped["missing feature `a` (drop_row)"], 1);
    assert_eq!(dropped["missing feature `b` (drop_row)"], 1);
    assert_eq!(dropped["missing target `y` (train)"], 1);
    assert_eq!(dropped["missing target `y` (validation)"], 1);
    assert!(
        d.summary().contains("missing target `y` (validation): 1"),
        "{}",
        d.summary()
    );
    // Dropping every row of a split says why it is empty.
    let e = load(
        &format!("  features: [a]\n  targets: [y]\n  missing:\n    default: drop_row\n{SEASONS}"),
        "season,a,y\n2000,1,1\n2002,,3\n2003,4,4\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("validation split") && e.contains("after dropping rows"),
        "{e}"
    );
}

#[test]
fn imputation_uses_training_statistics_only_and_adds_indicators() {
    let data = format!(
        "  features: [a, b, c]\n  targets: [y]\n  missing:\n    default: {{impute: mean}}\n    columns:\n      b: {{impute: median, indicator: true}}\n      c: {{impute: constant, value: -1}}\n{SEASONS}"
    );
    // Training a: 1, 3 (mean 2); b: 1, 2, 10 (median 2); the validation/test values (100)
    // must not leak into the statistics.
    let text = "season,a,b,c,y\n2000,1,1,5,1\n2000,3,2,,1\n2001,,10,5,1\n2001,3,NaN,5,1\n2002,100,,100,1\n2003,,100,,1\n";
    let d = load(&data, text).unwrap();
    assert_eq!(d.features, vec!["a", "b", "c", "b_missing"]);
    let row = |s: &super::Subset, i: usize| s.x[i * 4..(i + 1) * 4].to_vec();
    assert_eq!(row(&d.train, 1), vec![3.0, 2.0, -1.0, 0.0]);
    assert_eq!(row(&d.train, 2), vec![7.0 / 3.0, 10.0, 5.0, 0.0]);
    assert_eq!(row(&d.train, 3), vec![3.0, 2.0, 5.0, 1.0]);
    assert_eq!(row(&d.validation, 0), vec![100.0, 2.0, 100.0, 1.0]);
    assert_eq!(row(&d.test, 0), vec![7.0 / 3.0, 100.0, -1.0, 0.0]);
    let pre = &d.preprocessing;
    assert_eq!(pre.inputs[0].impute, Some(7.0 / 3.0));
    assert_eq!(pre.inputs[1].impute, Some(2.0));
    assert!(pre.inputs[1].indicator && !pre.inputs[0].indicator);
    assert_eq!(pre.imputed["a"], 2);
    assert_eq!(pre.imputed["b"], 2);
    assert_eq!(pre.imputed["c"], 2);
    // The stored preprocessing reads raw rows exactly as training did.
    let t = table(text);
    let m = pre.matrix(&t).unwrap();
    assert_eq!(&m[4..8], row(&d.train, 1).as_slice());
    assert_eq!(&m[20..24], row(&d.test, 0).as_slice());
    // A checkpoint without imputation refuses a missing cell, naming line and column.
    let plain = super::preprocess::Preprocessing::plain(&["a".to_string()]);
    let e = plain.matrix(&t).unwrap_err().to_string();
    assert!(e.starts_with("t.csv:4: column `a`"), "{e}");
    // The constant needs a value; mean takes none; listed columns are features.
    for (m, key) in [
        ("    default: {impute: constant}\n", "data.missing.default"),
        (
            "    default: {impute: mean, value: 3}\n",
            "data.missing.default",
        ),
        (
            "    columns:\n      y: drop_row\n",
            "data.missing.columns.y",
        ),
    ] {
        let text = format!(
            "data:\n  path: t.csv\n  features: [a]\n  targets: [y]\n  missing:\n{m}{SEASONS}stages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 1\n"
        );
        match parse(&text, Path::new("t.yaml")) {
            Err(crate::config::ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
            other => panic!("expected invalid {key}, got {other:?}"),
        }
    }
}
