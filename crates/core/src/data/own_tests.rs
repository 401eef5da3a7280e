//! Tests of categorical columns, sample weights and Parquet files through
//! [`Dataset::from_table`] / [`Dataset::load`] on tables made here.

use std::path::Path;

use super::Dataset;
use super::preprocess::{Preprocessing, RawValue};
use super::table::{CsvTable, DataError};
use crate::config::{DataConfig, parse};

const SEASONS: &str = "  split:\n    train: {to: 2001}\n    validation: {from: 2002, to: 2002}\n    test: {from: 2003}\n";

fn cfg(data: &str) -> DataConfig {
    let text = format!(
        "data:\n  path: t.csv\n{data}{SEASONS}stages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 1\n"
    );
    parse(&text, Path::new("t.yaml"))
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .data
}

fn load(data: &str, text: &str) -> Result<Dataset, DataError> {
    let t = CsvTable::from_bytes(text.as_bytes(), Path::new("t.csv")).unwrap();
    Dataset::from_table(&cfg(data), &t, String::new())
}

#[test]
fn categorical_columns_are_one_hot_from_the_training_vocabulary() {
    let text = "season,team,a,y\n2000,NYA,1,1\n2000,BOS,2,2\n2001,NYA,3,3\n2001,7,4,4\n2002,SEA,5,5\n2002,BOS,6,6\n2003,NYA,7,7\n";
    let d = load(
        "  features: [team, a]\n  categorical: [team]\n  targets: [y]\n  predict_missing: refuse\n",
        text,
    )
    .unwrap();
    // Sorted training values; integer codes are categories like any text.
    assert_eq!(d.features, vec!["team=7", "team=BOS", "team=NYA", "a"]);
    assert_eq!(
        d.train.x,
        vec![
            0.0, 0.0, 1.0, 1.0, //
            0.0, 1.0, 0.0, 2.0, //
            0.0, 0.0, 1.0, 3.0, //
            1.0, 0.0, 0.0, 4.0,
        ]
    );
    // SEA is not in the vocabulary: the unknown bucket, counted.
    assert_eq!(d.validation.x, vec![0.0, 0.0, 0.0, 5.0, 0.0, 1.0, 0.0, 6.0]);
    assert_eq!(d.preprocessing.unknown["team"], 1);
    assert!(
        d.summary().contains("unknown categories"),
        "{}",
        d.summary()
    );
    let report = d.check_report();
    assert!(
        report.contains("features: team categorical (3 values), a numeric"),
        "{report}"
    );
    // The stored preprocessing reads the same raw values the same way, whatever they arrive as.
    let pre: Preprocessing =
        serde_json::from_str(&serde_json::to_string(&d.preprocessing).unwrap()).unwrap();
    let none = |c: &str, m: String| DataError::Other(format!("{c}: {m}"));
    let mut out = Vec::new();
    pre.push_values(
        &[RawValue::Text("BOS"), RawValue::Number(2.0)],
        &mut out,
        &none,
        None,
    )
    .unwrap();
    pre.push_values(
        &[RawValue::Number(7.0), RawValue::Text("4")],
        &mut out,
        &none,
        None,
    )
    .unwrap();
    assert_eq!(out, vec![0.0, 1.0, 0.0, 2.0, 1.0, 0.0, 0.0, 4.0]);
    // No imputation: a missing category is an error naming the column.
    let e = pre
        .push_values(
            &[RawValue::Missing, RawValue::Number(1.0)],
            &mut out,
            &none,
            None,
        )
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("team: missing category"), "{e}");
    assert_eq!(out.len(), 8, "nothing appended on an error");
}

#[test]
fn a_missing_category_goes_to_the_unknown_bucket_when_imputing() {
    let text = "season,team,y\n2000,A,1\n2000,,2\n2001,B,3\n2002,NA,5\n2003,A,7\n";
    let d = load(
        "  features: [team]\n  categorical: [team]\n  targets: [y]\n  missing:\n    default: {impute: median, indicator: true}\n",
        text,
    )
    .unwrap();
    assert_eq!(d.features, vec!["team=A", "team=B", "team_missing"]);
    assert_eq!(d.train.x, vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
    assert_eq!(d.validation.x, vec![0.0, 0.0, 1.0]);
    assert_eq!(d.preprocessing.imputed["team"], 2);
    // Under the default policy the same table stops at the first missing cell.
    let e = load(
        "  features: [team]\n  categorical: [team]\n  targets: [y]\n",
        text,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("t.csv:3: column `team`: missing value"),
        "{e}"
    );
}

#[test]
fn the_cardinality_guard_and_a_text_feature_say_what_to_do() {
    let mut text = String::from("season,id,a,y\n");
    for i in 0..30 {
        text.push_str(&format!("{},p{i},{i},{i}\n", 2000 + i % 4));
    }
    let e = load(
        "  features: [id, a]\n  categorical: [id]\n  max_categories: 10\n  targets: [y]\n",
        &text,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("categorical column `id` has 16 distinct values in the training split")
            && e.contains("more than data.max_categories (10)"),
        "{e}"
    );
    let e = load("  features: [id, a]\n  targets: [y]\n", &text)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("t.csv:2: column `id`: expected a number, got \"p0\"")
            && e.contains("list it under data.categorical"),
        "{e}"
    );
    // A categorical column must be a feature; a weight column is neither feature nor target.
    for (data, key) in [
        (
            "  features: [a]\n  categorical: [id]\n  targets: [y]\n",
            "data.categorical[0]",
        ),
        (
            "  features: [a]\n  weight: a\n  targets: [y]\n",
            "data.weight",
        ),
    ] {
        let text = format!(
            "data:\n  path: t.csv\n{data}{SEASONS}stages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 1\n"
        );
        match parse(&text, Path::new("t.yaml")) {
            Err(crate::config::ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
            other => panic!("expected invalid {key}, got {other:?}"),
        }
    }
}

#[test]
fn sample_weights_are_read_checked_and_drop_rows_without_one() {
    let text =
        "season,a,w,y\n2000,1,1,1\n2000,2,,2\n2001,3,0.5,3\n2002,5,2,5\n2003,7,0,7\n2003,8,1,8\n";
    let d = load("  features: [a]\n  weight: w\n  targets: [y]\n", text).unwrap();
    assert_eq!(d.train.w, vec![1.0, 0.5]);
    assert_eq!(d.train.weights(), Some(&[1.0, 0.5][..]));
    assert_eq!(d.test.w, vec![0.0, 1.0]);
    assert_eq!(d.preprocessing.dropped["missing weight `w`"], 1);
    assert_eq!(d.preprocessing.weight.as_deref(), Some("w"));
    assert!(d.check_report().contains("sample weights `w`"));
    let e = load(
        "  features: [a]\n  weight: w\n  targets: [y]\n",
        "season,a,w,y\n2000,1,-1,1\n2002,5,2,5\n2003,7,1,7\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("t.csv:2: column `w`: a sample weight is negative"),
        "{e}"
    );
    let e = load(
        "  features: [a]\n  weight: w\n  targets: [y]\n",
        "season,a,w,y\n2000,1,1,1\n2002,5,0,5\n2003,7,1,7\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("the validation split's sample weights (column `w`) are all 0"),
        "{e}"
    );
    // Unweighted tables have no weights, and the same statistics as before.
    let d = load("  features: [a]\n  targets: [y]\n", text).unwrap();
    assert!(d.train.weights().is_none());
    let names = vec!["a".to_string()];
    let m = [1.0f32, 2.0, 3.0, 10.0];
    let plain = super::dataset::fit_stats(&names, &m);
    let ones = super::dataset::fit_stats_weighted(&names, &m, Some(&[1.0; 4]));
    assert_eq!(plain, ones);
    // A weight of 0 takes the row out of the normalisation.
    let w = super::dataset::fit_stats_weighted(&names, &m, Some(&[1.0, 1.0, 1.0, 0.0]));
    assert_eq!((w[0].mean, w[0].std), (2.0, (2.0f64 / 3.0).sqrt()));
}

#[cfg(feature = "parquet")]
mod parquet_files {
    use super::*;
    use std::sync::Arc;

    use parquet::data_type::{
        ByteArray, ByteArrayType, DoubleType, FloatType, Int32Type, Int64Type,
    };
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    /// A small Parquet file: optional columns with nulls, a dictionary-encoded string, a
    /// date, a timestamp, f32 and f64, in two row groups.
    fn write(path: &Path) {
        let schema = Arc::new(
            parse_message_type(
                "message t {
                   required int32 season;
                   optional binary team (STRING);
                   optional int32 day (DATE);
                   optional int64 at (TIMESTAMP(MICROS,true));
                   optional float a;
                   required double y;
                   optional int64 n;
                 }",
            )
            .unwrap(),
        );
        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(parquet::basic::Compression::SNAPPY)
                .build(),
        );
        let file = std::fs::File::create(path).unwrap();
        let mut w = SerializedFileWriter::new(file, schema, props).unwrap();
        let groups: [&[usize]; 2] = [&[0, 1, 2], &[3, 4]];
        let season = [2000, 2000, 2001, 2002, 2003];
        let team = [Some("NYA"), None, Some("BOS"), Some("NYA"), Some("SEA")];
        let day = [Some(11_000), Some(11_001), None, Some(11_800), Some(12_000)];
        let at = [
            Some(1_500_000i64),
            None,
            Some(0),
            Some(-1),
            Some(86_400_000_000),
        ];
        let a = [
            Some(0.1f32),
            Some(f32::NAN),
            None,
            Some(3.5),
            Some(1.0 / 3.0),
        ];
        let y = [1.0, 2.5, 3.25, 4.0, 5.0];
        let n = [Some(-7i64), Some(1 << 40), None, Some(0), Some(3)];
        for rows in groups {
            let mut g = w.next_row_group().unwrap();
            macro_rules! col {
                ($t:ty, $vals:expr) => {{
                    let mut c = g.next_column().unwrap().unwrap();
                    let vals: Vec<Option<_>> = rows.iter().map(|&r| $vals[r]).collect();
                    let defs: Vec<i16> = vals.iter().map(|v| v.is_some() as i16).collect();
                    let dense: Vec<_> = vals.into_iter().flatten().collect();
                    c.typed::<$t>()
                        .write_batch(&dense, Some(&defs), None)
                        .unwrap();
                    c.close().unwrap();
                }};
            }
            {
                let mut c = g.next_column().unwrap().unwrap();
                let v: Vec<i32> = rows.iter().map(|&r| season[r]).collect();
                c.typed::<Int32Type>().write_batch(&v, None, None).unwrap();
                c.close().unwrap();
            }
            {
                let mut c = g.next_column().unwrap().unwrap();
                let vals: Vec<Option<&str>> = rows.iter().map(|&r| team[r]).collect();
                let defs: Vec<i16> = vals.iter().map(|v| v.is_some() as i16).collect();
                let dense: Vec<ByteArray> =
                    vals.into_iter().flatten().map(ByteArray::from).collect();
                c.typed::<ByteArrayType>()
                    .write_batch(&dense, Some(&defs), None)
                    .unwrap();
                c.close().unwrap();
            }
            col!(Int32Type, day);
            col!(Int64Type, at);
            col!(FloatType, a);
            {
                let mut c = g.next_column().unwrap().unwrap();
                let v: Vec<f64> = rows.iter().map(|&r| y[r]).collect();
                c.typed::<DoubleType>().write_batch(&v, None, None).unwrap();
                c.close().unwrap();
            }
            col!(Int64Type, n);
            g.close().unwrap();
        }
        w.close().unwrap();
    }

    #[test]
    fn parquet_reads_as_the_text_cells_a_csv_would_give() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.parquet");
        write(&p);
        let t = CsvTable::read(&p).unwrap();
        assert_eq!(t.header, vec!["season", "team", "day", "at", "a", "y", "n"]);
        assert_eq!(t.lines, vec![1, 2, 3, 4, 5]);
        let col = |name: &str| {
            let j = t.column_index(name).unwrap();
            t.column_cells(j).map(|c| c.into_owned()).collect::<Vec<_>>()
        };
        assert_eq!(col("season"), vec!["2000", "2000", "2001", "2002", "2003"]);
        assert_eq!(col("team"), vec!["NYA", "", "BOS", "NYA", "SEA"]);
        assert_eq!(
            col("day"),
            vec!["2000-02-13", "2000-02-14", "", "2002-04-23", "2002-11-09"]
        );
        assert_eq!(
            col("at"),
            vec![
                "1970-01-01T00:00:01.5Z",
                "",
                "1970-01-01T00:00:00Z",
                "1969-12-31T23:59:59.999999Z",
                "1970-01-02T00:00:00Z"
            ]
        );
        assert_eq!(col("n"), vec!["-7", "1099511627776", "", "0", "3"]);
        // f32 values read back to the same f32; NaN is a missing cell.
        let a = col("a");
        assert_eq!(a[0].parse::<f64>().unwrap() as f32, 0.1f32);
        assert_eq!(a[1], "");
        assert_eq!(a[4].parse::<f64>().unwrap() as f32, 1.0f32 / 3.0);
        // The same table as CSV text gives the same dataset, bit for bit.
        let data = "  features: [team, a]\n  categorical: [team]\n  targets: [y]\n  missing:\n    default: {impute: mean, indicator: true}\n";
        let text = format!(
            "season,team,a,y\n2000,NYA,{},1\n2000,,,2.5\n2001,BOS,,3.25\n2002,NYA,3.5,4\n2003,SEA,{},5\n",
            0.1f32 as f64,
            (1.0f32 / 3.0) as f64
        );
        let from_csv = load(data, &text).unwrap();
        let mut c = cfg(data);
        c.path = p.clone();
        let from_parquet = Dataset::load(&c).unwrap();
        assert_eq!(from_parquet.train.x, from_csv.train.x);
        assert_eq!(from_parquet.test.x, from_csv.test.x);
        assert_eq!(from_parquet.features, from_csv.features);
        assert_eq!(
            from_parquet.preprocessing.inputs,
            from_csv.preprocessing.inputs
        );
        // A split on the date column.
        let mut c = cfg("  features: [a]\n  targets: [y]\n  missing:\n    default: drop_row\n");
        c.path = p.clone();
        c.split = parse(
            "data:\n  path: x\n  features: [a]\n  targets: [y]\n  split:\n    column: day\n    train: {to: 2000-12-31}\n    validation: {from: 2002-01-01, to: 2002-06-30}\n    test: {from: 2002-07-01}\nstages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 1\n",
            Path::new("t.yaml"),
        )
        .unwrap()
        .data
        .split;
        let d = Dataset::load(&c).unwrap();
        assert_eq!(
            (d.train.rows(), d.validation.rows(), d.test.rows()),
            (1, 1, 1)
        );
        // Damage is a clear error.
        let bytes = std::fs::read(&p).unwrap();
        let cut = dir.path().join("cut.parquet");
        std::fs::write(&cut, &bytes[..bytes.len() - 20]).unwrap();
        let e = CsvTable::read(&cut).unwrap_err().to_string();
        assert!(
            e.contains("cut.parquet: not a readable Parquet file"),
            "{e}"
        );
    }
}
