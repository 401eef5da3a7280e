//! The hostile set (issue #47 item 1): files built here, at run time, to exhaust a reader —
//! a Parquet footer that lies about its row count, one huge string repeated through a
//! dictionary, a gzip bomb, a sparse multi-GB file, 100k columns, one 10 MB line, invalid
//! UTF-8, a truncated gzip and a truncated Parquet file. Every command that reads the data
//! (`kiln init`, `kiln config check`, `kiln train`, `kiln predict`) must end with exit 2 and
//! a message naming the file: never a panic (101) or an abort (134). A hostile column that
//! no config uses is never read (`config check` and `train` read only the configured
//! columns; `init` and `predict` read every column).

use crate::common::*;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The tiny config's feature columns (all read by train and predict).
const FEATURES: [&str; 10] = [
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

/// A small, valid CSV text in the tiny config's schema (plus `season` and the targets).
fn csv_rows(rows: usize) -> String {
    let mut t = format!("season,{},hr_rate,bb_rate,so_rate\n", FEATURES.join(","));
    for i in 0..rows {
        let season = 2005 + i % 15;
        t.push_str(&format!(
            "{season},{},{},600,0.03,0.08,0.15,580,0.03,0.08,0.16,0.03,0.08,0.15\n",
            25 + i % 10,
            1 + i % 8
        ));
    }
    t
}

/// A valid Parquet file of `rows` rows in the tiny config's schema (all DOUBLE), and when
/// `blob` is given a string column `note` holding it in every row (dictionary-encoded).
fn parquet_rows(path: &Path, rows: usize, blob: Option<&str>) {
    use parquet::data_type::{ByteArray, ByteArrayType, DoubleType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::sync::Arc;
    let mut names = vec!["season"];
    names.extend(FEATURES);
    names.extend(["hr_rate", "bb_rate", "so_rate"]);
    let mut schema = String::from("message t {\n");
    for n in &names {
        schema.push_str(&format!("  required double {n};\n"));
    }
    if blob.is_some() {
        schema.push_str("  required binary note (STRING);\n");
    }
    schema.push_str("}\n");
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .set_dictionary_page_size_limit(8 << 20)
            .set_statistics_enabled(parquet::file::properties::EnabledStatistics::None)
            .build(),
    );
    let schema = Arc::new(parse_message_type(&schema).unwrap());
    let mut w =
        SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
    let mut g = w.next_row_group().unwrap();
    for (j, _) in names.iter().enumerate() {
        let mut c = g.next_column().unwrap().unwrap();
        let v: Vec<f64> = (0..rows)
            .map(|i| {
                if j == 0 {
                    (2005 + i % 15) as f64
                } else {
                    // Values that vary, so that a file a config can train on trains.
                    0.1 + ((i * (j + 3)) % 17) as f64 * 0.01
                }
            })
            .collect();
        c.typed::<DoubleType>().write_batch(&v, None, None).unwrap();
        c.close().unwrap();
    }
    if let Some(blob) = blob {
        let mut c = g.next_column().unwrap().unwrap();
        // One buffer, shared by every row's value.
        let one = ByteArray::from(blob.as_bytes().to_vec());
        let v = vec![one; rows];
        c.typed::<ByteArrayType>()
            .write_batch(&v, None, None)
            .unwrap();
        c.close().unwrap();
    }
    g.close().unwrap();
    w.close().unwrap();
}

/// Thrift compact zigzag varint of `v`.
fn varint(v: i64) -> Vec<u8> {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        if z < 0x80 {
            out.push(z as u8);
            return out;
        }
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

/// A valid 100-row Parquet file whose footer then claims `rows` rows: every i64 field of
/// the footer that said 100 (the file's and the row group's row counts, the column chunks'
/// value counts) is rewritten, and the footer's length updated.
fn lying_parquet(path: &Path, rows: i64) {
    parquet_rows(path, 100, None);
    let bytes = std::fs::read(path).unwrap();
    let n = bytes.len();
    let meta_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let meta_start = n - 8 - meta_len;
    let meta = &bytes[meta_start..n - 8];
    // Field header "i64, id + 1" (0x16) followed by the count.
    let mut from = vec![0x16];
    from.extend(varint(100));
    let mut to = vec![0x16];
    to.extend(varint(rows));
    let mut patched = Vec::new();
    let mut i = 0;
    let mut hits = 0;
    while i < meta.len() {
        if meta[i..].starts_with(&from) {
            patched.extend(&to);
            i += from.len();
            hits += 1;
        } else {
            patched.push(meta[i]);
            i += 1;
        }
    }
    assert!(hits >= 2, "the row counts were not found in the footer");
    let mut out = bytes[..meta_start].to_vec();
    out.extend(&patched);
    out.extend((patched.len() as u32).to_le_bytes());
    out.extend(b"PAR1");
    std::fs::write(path, out).unwrap();
}

fn gzip(text: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(text).unwrap();
    z.finish().unwrap()
}

/// The hostile set: (file, environment for the run).
fn hostile_set(dir: &Path) -> Vec<(PathBuf, Vec<(&'static str, &'static str)>)> {
    let mut set = Vec::new();
    // A Parquet footer claiming 2^61 and 10^9 rows.
    for (name, rows) in [
        ("lie_2e61.parquet", 1i64 << 61),
        ("lie_1e9.parquet", 1_000_000_000),
    ] {
        let p = dir.join(name);
        lying_parquet(&p, rows);
        set.push((p, vec![]));
    }
    // Dictionary amplification: one 1 MiB string in 6,000 rows, in a column `note`: refused
    // by the value limit, and (with that raised) by the table limit, wherever it is read —
    // `init` and `predict` read every column, and the configs below list `note` as a
    // feature (a column no config uses is never read: see the test after this one).
    let blob = "x".repeat(1 << 20);
    let p = dir.join("dictionary.parquet");
    parquet_rows(&p, 6000, Some(&blob));
    assert!(std::fs::metadata(&p).unwrap().len() < 1 << 20);
    set.push((p.clone(), vec![]));
    let p2 = dir.join("dictionary_big_cells.parquet");
    std::fs::copy(&p, &p2).unwrap();
    set.push((
        p2,
        vec![
            ("KILN_MAX_CELL_BYTES", "2m"),
            ("KILN_MAX_TABLE_BYTES", "64m"),
        ],
    ));
    // A gzip bomb: a few KB inflating past a 16 MiB limit (a header, then newlines).
    let mut text = csv_rows(0).into_bytes();
    text.resize(40 << 20, b'\n');
    let p = dir.join("bomb.csv.gz");
    std::fs::write(&p, gzip(&text)).unwrap();
    assert!(std::fs::metadata(&p).unwrap().len() < 1 << 20);
    set.push((p, vec![("KILN_MAX_TABLE_BYTES", "16m")]));
    // A truncated gzip.
    let gz = gzip(csv_rows(2000).as_bytes());
    let p = dir.join("truncated.csv.gz");
    std::fs::write(&p, &gz[..gz.len() / 2]).unwrap();
    set.push((p, vec![]));
    // A sparse 3 GB file: all zeros, no newline.
    let p = dir.join("sparse.csv");
    std::fs::File::create(&p).unwrap().set_len(3 << 30).unwrap();
    set.push((p, vec![]));
    // 100k columns.
    let cols: Vec<String> = (0..100_000).map(|i| format!("c{i}")).collect();
    let p = dir.join("wide.csv");
    std::fs::write(
        &p,
        format!("{}\n{}\n", cols.join(","), vec!["1"; 100_000].join(",")),
    )
    .unwrap();
    set.push((p, vec![]));
    // One 10 MB line (one value).
    let mut t = csv_rows(3);
    t.push_str(&"7".repeat(10 << 20));
    t.push('\n');
    let p = dir.join("long_line.csv");
    std::fs::write(&p, t).unwrap();
    set.push((p, vec![]));
    // Invalid UTF-8 in a value.
    let mut t = csv_rows(3).into_bytes();
    t.extend(b"2010,\xff\xfe,1,600,0.03,0.08,0.15,580,0.03,0.08,0.16,0.03,0.08,0.15\n");
    let p = dir.join("latin1.csv");
    std::fs::write(&p, t).unwrap();
    set.push((p, vec![]));
    // A truncated Parquet file.
    let p = dir.join("truncated.parquet");
    parquet_rows(&p, 2000, None);
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() * 2 / 3]).unwrap();
    set.push((p, vec![]));
    set
}

fn assert_refused(what: &str, file: &Path, o: &std::process::Output) {
    let e = stderr(o);
    let name = file.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{what} on {name}: expected exit 2, got {:?}: {e}",
        o.status
    );
    assert!(
        e.contains(name),
        "{what} on {name}: the error does not name the file: {e}"
    );
    assert!(!e.contains("panicked"), "{what} on {name}: {e}");
}

#[test]
fn every_command_refuses_every_hostile_file_with_exit_2_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = trained();
    for (file, env) in hostile_set(tmp.path()) {
        let f = file.to_str().unwrap();
        let case = tmp.path().join(file.file_stem().unwrap());
        std::fs::create_dir_all(&case).unwrap();
        let o = kiln_env(
            &[
                "init",
                "--data",
                f,
                "--target",
                "hr_rate",
                "--out",
                case.join("init.yaml").to_str().unwrap(),
            ],
            &env,
        );
        assert_refused("init", &file, &o);
        let cfg = config_reading_note(&case, f);
        let cfg = cfg.to_str().unwrap();
        assert_refused(
            "config check",
            &file,
            &kiln_env(&["config", "check", cfg], &env),
        );
        assert_refused("train", &file, &kiln_env(&["train", cfg, "-q"], &env));
        let o = kiln_env(
            &[
                "predict",
                "--checkpoint",
                ckpt.to_str().unwrap(),
                "--input",
                f,
                "--output",
                case.join("pred.csv").to_str().unwrap(),
            ],
            &env,
        );
        assert_refused("predict", &file, &o);
    }
}

/// The tiny config on `file`, with the hostile set's `note` column (where a file has one)
/// as a categorical feature, so that training reads it.
fn config_reading_note(dir: &Path, file: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut subst = vec![("datasets/baseball.csv", file.to_string())];
    if file.contains("dictionary") {
        subst.push(("  features: [age,", "  features: [note, age,".to_string()));
        subst.push((
            "  predict_missing: refuse\n",
            "  predict_missing: refuse\n  categorical: [note]\n".to_string(),
        ));
    }
    let subst: Vec<(&str, &str)> = subst.iter().map(|(a, b)| (*a, b.as_str())).collect();
    tiny_config(dir, &dir.join("out"), &subst)
}

/// A column no config uses is never read: the dictionary file whose 1 MiB string sits in an
/// unused column checks and trains (within a 64 MiB table limit the string alone would pass
/// 90 times over), and a CSV whose unused column holds values past the cell limit checks.
#[test]
fn a_hostile_column_no_config_uses_is_never_read() {
    let tmp = tempfile::tempdir().unwrap();
    let blob = "x".repeat(1 << 20);
    let p = tmp.path().join("dictionary.parquet");
    parquet_rows(&p, 6000, Some(&blob));
    let f = p.to_str().unwrap();
    let cfg = tiny_config(
        tmp.path(),
        &tmp.path().join("out"),
        &[("datasets/baseball.csv", f)],
    );
    let cfg = cfg.to_str().unwrap();
    let env = [("KILN_MAX_TABLE_BYTES", "64m")];
    let o = kiln_env(&["config", "check", cfg], &env);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = kiln_env(&["train", cfg, "-q"], &env);
    assert!(o.status.success(), "{}", stderr(&o));
    // The same file with `note` as a feature is refused, naming it.
    let cfg = config_reading_note(&tmp.path().join("note"), f);
    let o = kiln_env(&["config", "check", cfg.to_str().unwrap()], &env);
    assert_refused("config check", &p, &o);
    assert!(stderr(&o).contains("KILN_MAX_CELL_BYTES"), "{}", stderr(&o));

    // CSV: a 100 KB value (past the 64 KiB cell limit) in an unused last column.
    let mut text = csv_rows(300).replace(",so_rate\n", ",so_rate,note\n");
    text = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == 0 {
                format!("{l}\n")
            } else {
                format!("{l},{}\n", "y".repeat(100_000))
            }
        })
        .collect();
    let p = tmp.path().join("wide_note.csv");
    std::fs::write(&p, text).unwrap();
    std::fs::create_dir_all(tmp.path().join("csv")).unwrap();
    let cfg = tiny_config(
        &tmp.path().join("csv"),
        &tmp.path().join("csv/out"),
        &[("datasets/baseball.csv", p.to_str().unwrap())],
    );
    let o = kiln(&["config", "check", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    // `init` reads every column (it proposes from all of them): refused, naming the limit.
    let o = kiln(&[
        "init",
        "--data",
        p.to_str().unwrap(),
        "--target",
        "hr_rate",
        "--out",
        tmp.path().join("init.yaml").to_str().unwrap(),
    ]);
    assert_refused("init", &p, &o);
    assert!(stderr(&o).contains("KILN_MAX_CELL_BYTES"), "{}", stderr(&o));
}

#[test]
fn the_limits_say_which_limit_and_how_to_raise_it() {
    let tmp = tempfile::tempdir().unwrap();
    let set = hostile_set(tmp.path());
    let find = |n: &str| set.iter().find(|(p, _)| p.ends_with(n)).unwrap();
    let check = |n: &str, want: &str| {
        let (p, env) = find(n);
        let cfg = config_reading_note(tmp.path(), p.to_str().unwrap());
        let o = kiln_env(&["config", "check", cfg.to_str().unwrap()], env);
        let e = stderr(&o);
        assert!(e.contains(want), "{n}: {e}");
    };
    check(
        "bomb.csv.gz",
        "inflates past the 16 MiB limit (KILN_MAX_TABLE_BYTES)",
    );
    check("sparse.csv", "limit (KILN_MAX_LINE_BYTES)");
    check(
        "wide.csv",
        "100000 columns, past the 16384 limit (KILN_MAX_COLUMNS)",
    );
    check(
        "dictionary.parquet",
        "past the 64 KiB limit (KILN_MAX_CELL_BYTES)",
    );
    check(
        "dictionary_big_cells.parquet",
        "64 MiB limit (KILN_MAX_TABLE_BYTES)",
    );
    check("lie_2e61.parquet", "lie_2e61.parquet");
    check("truncated.csv.gz", "not a readable gzip file");
    check("truncated.parquet", "not a readable Parquet file");
    check("latin1.csv", "invalid UTF-8");
    // A bad limit is an error naming the variable.
    let cfg = tiny_config(tmp.path(), &tmp.path().join("out"), &[]);
    let o = kiln_env(
        &["config", "check", cfg.to_str().unwrap()],
        &[("KILN_MAX_TABLE_BYTES", "lots")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("KILN_MAX_TABLE_BYTES"),
        "{}",
        stderr(&o)
    );
}
