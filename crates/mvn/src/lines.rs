//! JSON-lines queries (what `kiln mvn` reads) and the answering loop: every input line gets
//! one output line, in order, and a bad line does not stop the others.
//!
//! Input: one query per line,
//! `{"cov": [[...]], "upper": [...], "lower": [...]?, "mean": [...]?}` — or `"corr"` (with an
//! optional `"std"`) instead of `"cov"`; `null` in a limit means unbounded. Blank lines are
//! skipped. Output: `{"p": ..., "se": ...}` for a query that was answered, and
//! `{"error": "line N: ...", "line": N}` in its place for a line that is not a valid query
//! (not JSON, a missing or malformed field, a correlation matrix whose diagonal is not 1, a
//! dimension above [`MAX_HALTON_DIM`], a covariance that is not positive semi-definite, ...).

use std::io::{BufRead, Write};

use burn::tensor::backend::Backend;
use serde_json::{Map, Value};

use super::cholesky::factor;
use super::error::MvnError;
use super::halton::MAX_HALTON_DIM;
use super::module::{HaltonMvnCdf, HaltonMvnCdfConfig};
use super::query::{MvnQuery, prepare};

/// How far a correlation matrix's diagonal may be from 1.
pub const CORR_DIAGONAL_TOLERANCE: f64 = 1e-9;

/// Why answering a stream stopped (a bad line does not stop it; only I/O and an invalid
/// estimator configuration do).
#[derive(Debug, thiserror::Error)]
pub enum LinesError {
    /// Reading the input failed.
    #[error("cannot read the input after line {line}")]
    Read {
        /// The last line read.
        line: usize,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Writing an answer failed.
    #[error("cannot write the answers")]
    Write(#[source] std::io::Error),
    /// The estimator configuration is invalid, or `batch` is 0.
    #[error(transparent)]
    Config(#[from] MvnError),
}

/// What a stream held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinesSummary {
    /// Queries answered with a probability.
    pub answered: usize,
    /// Lines answered with an error.
    pub failed: usize,
}

/// Answers every query line of `reader` on `out`, `batch` lines at a time, with estimators
/// built from `config` (its `max_dim` is raised to what each batch needs). Returns how many
/// lines were answered and how many failed; stops early only when reading or writing fails.
pub fn answer_lines<B: Backend, R: BufRead, W: Write>(
    config: &HaltonMvnCdfConfig,
    device: &B::Device,
    batch: usize,
    mut reader: R,
    out: &mut W,
) -> Result<LinesSummary, LinesError> {
    if batch == 0 {
        return Err(MvnError::InvalidConfig {
            field: "batch",
            value: "0".into(),
            expected: "at least 1 query per batch".into(),
        }
        .into());
    }
    config.validate()?;
    let mut summary = LinesSummary::default();
    let mut model: Option<HaltonMvnCdf<B>> = None;
    let mut pending: Vec<(usize, Result<MvnQuery, String>)> = Vec::new();
    let mut buf = Vec::new();
    let mut number = 0usize;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|source| LinesError::Read {
                line: number,
                source,
            })?;
        if n == 0 {
            break;
        }
        number += 1;
        let item = match std::str::from_utf8(&buf) {
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => parse_query_line(line),
            Err(e) => Err(format!(
                "not valid UTF-8 (byte {} of the line); expected one JSON query object",
                e.valid_up_to() + 1
            )),
        };
        pending.push((number, item));
        if pending.len() == batch {
            answer_batch(config, device, &mut model, &mut pending, out, &mut summary)?;
        }
    }
    answer_batch(config, device, &mut model, &mut pending, out, &mut summary)?;
    Ok(summary)
}

/// The message of a query error without its `query 0: ` prefix (the caller names the line).
fn query_message(e: &MvnError) -> String {
    let s = e.to_string();
    s.strip_prefix("query 0: ").map(str::to_string).unwrap_or(s)
}

/// Checks one query the way the estimator will (limits, covariance, factorisation), so that
/// a bad query fails alone instead of failing its batch.
fn check(query: &MvnQuery) -> Result<(), String> {
    let d = query.dim();
    if d > MAX_HALTON_DIM {
        return Err(format!(
            "dimension {d} is larger than the estimator's maximum of {MAX_HALTON_DIM} (the \
             number of coordinates of its Halton point set)"
        ));
    }
    let p = prepare(
        0,
        MAX_HALTON_DIM,
        &query.upper,
        query.lower.as_deref(),
        query.mean.as_deref(),
        &query.cov,
    )
    .map_err(|e| query_message(&e))?;
    factor(0, &p).map_err(|e| query_message(&e))?;
    Ok(())
}

fn answer_batch<B: Backend, W: Write>(
    config: &HaltonMvnCdfConfig,
    device: &B::Device,
    model: &mut Option<HaltonMvnCdf<B>>,
    pending: &mut Vec<(usize, Result<MvnQuery, String>)>,
    out: &mut W,
    summary: &mut LinesSummary,
) -> Result<(), LinesError> {
    if pending.is_empty() {
        return Ok(());
    }
    let mut answers: Vec<Result<(f64, f64), String>> = Vec::with_capacity(pending.len());
    let mut good = Vec::new();
    let mut slots = Vec::new();
    for (i, (_, item)) in pending.iter_mut().enumerate() {
        let checked = match item {
            Ok(q) => check(q).map(|()| std::mem::replace(q, MvnQuery::new(vec![], vec![]))),
            Err(e) => Err(std::mem::take(e)),
        };
        match checked {
            Ok(q) => {
                good.push(q);
                slots.push(i);
                answers.push(Ok((f64::NAN, f64::NAN)));
            }
            Err(e) => answers.push(Err(e)),
        }
    }
    if !good.is_empty() {
        let need = good.iter().map(MvnQuery::dim).max().unwrap_or(1);
        let m = match model.take() {
            Some(m) if m.max_dim() >= need => m,
            _ => config
                .clone()
                .with_max_dim(need.max(config.max_dim).min(MAX_HALTON_DIM))
                .init::<B>(device)?,
        };
        match m.forward(good.as_slice()) {
            Ok(estimates) => {
                for (slot, est) in slots.iter().zip(estimates) {
                    answers[*slot] = Ok((est.p, est.se));
                }
            }
            // Not expected after `check`; answer the queries one by one to place the error.
            Err(_) => {
                for (slot, q) in slots.iter().zip(&good) {
                    answers[*slot] = m
                        .forward(std::slice::from_ref(q))
                        .map(|e| (e[0].p, e[0].se))
                        .map_err(|e| query_message(&e));
                }
            }
        }
        *model = Some(m);
    }
    for ((line, _), answer) in pending.drain(..).zip(answers) {
        let value = match answer {
            Ok((p, se)) => {
                summary.answered += 1;
                serde_json::json!({"p": p, "se": se})
            }
            Err(e) => {
                summary.failed += 1;
                serde_json::json!({"error": format!("line {line}: {e}"), "line": line})
            }
        };
        writeln!(out, "{value}").map_err(LinesError::Write)?;
    }
    Ok(())
}

/// Parses one JSON line into a query; the error names the field (and, for a correlation
/// matrix, the entry).
fn parse_query_line(line: &str) -> Result<MvnQuery, String> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| format!("not valid JSON ({e}); expected one query object"))?;
    let obj = value
        .as_object()
        .ok_or_else(|| format!("expected a JSON object, found {}", kind(&value)))?;
    for key in obj.keys() {
        if !["cov", "corr", "std", "upper", "lower", "mean"].contains(&key.as_str()) {
            return Err(format!(
                "unknown field `{key}`; expected cov or corr, upper, and optionally lower, mean, std"
            ));
        }
    }
    let upper = limits(obj, "upper", f64::INFINITY)?
        .ok_or("missing field `upper`; expected an array of upper limits (null = +infinity)")?;
    let d = upper.len();
    if d == 0 {
        return Err("field `upper` is empty; expected at least one limit".into());
    }
    let lower = limits(obj, "lower", f64::NEG_INFINITY)?;
    check_len("lower", lower.as_ref().map(Vec::len), d)?;
    let mean = numbers(obj, "mean")?;
    check_len("mean", mean.as_ref().map(Vec::len), d)?;
    let cov = match (obj.get("cov"), obj.get("corr")) {
        (Some(_), Some(_)) => {
            return Err("both `cov` and `corr` given; expected one of them".into());
        }
        (None, None) => {
            return Err("missing field `cov` (or `corr`); expected a d × d matrix".into());
        }
        (Some(c), None) => {
            if obj.contains_key("std") {
                return Err("field `std` goes with `corr`, not `cov`".into());
            }
            matrix("cov", c, d)?
        }
        (None, Some(c)) => {
            let mut m = matrix("corr", c, d)?;
            check_correlation(&m, d)?;
            if let Some(std) = numbers(obj, "std")? {
                check_len("std", Some(std.len()), d)?;
                for (i, s) in std.iter().enumerate() {
                    if *s < 0.0 {
                        return Err(format!("field `std[{i}]` is {s}; expected a number >= 0"));
                    }
                }
                for i in 0..d {
                    for j in 0..d {
                        m[i * d + j] *= std[i] * std[j];
                    }
                }
            }
            m
        }
    };
    Ok(MvnQuery {
        upper,
        lower,
        mean,
        cov,
    })
}

/// A correlation matrix has ones on its diagonal and entries in [−1, 1].
fn check_correlation(m: &[f64], d: usize) -> Result<(), String> {
    for i in 0..d {
        let v = m[i * d + i];
        if (v - 1.0).abs() > CORR_DIAGONAL_TOLERANCE {
            return Err(format!(
                "field `corr[{i}][{i}]` is {v}; a correlation matrix has 1 on its diagonal \
                 (give the scales in `std`, or a covariance in `cov`)"
            ));
        }
    }
    for i in 0..d {
        for j in 0..d {
            let v = m[i * d + j];
            if v.abs() > 1.0 + CORR_DIAGONAL_TOLERANCE {
                return Err(format!(
                    "field `corr[{i}][{j}]` is {v}; expected a correlation in [-1, 1]"
                ));
            }
        }
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn check_len(field: &str, len: Option<usize>, d: usize) -> Result<(), String> {
    match len {
        Some(n) if n != d => Err(format!(
            "field `{field}` has {n} entries; expected {d} (the length of `upper`)"
        )),
        _ => Ok(()),
    }
}

fn array<'a>(obj: &'a Map<String, Value>, field: &str) -> Result<Option<&'a Vec<Value>>, String> {
    match obj.get(field) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(other) => Err(format!(
            "field `{field}` is {}; expected an array",
            kind(other)
        )),
    }
}

fn limits(
    obj: &Map<String, Value>,
    field: &str,
    null_means: f64,
) -> Result<Option<Vec<f64>>, String> {
    let Some(a) = array(obj, field)? else {
        return Ok(None);
    };
    a.iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::Null => Ok(null_means),
            Value::Number(n) => n
                .as_f64()
                .ok_or_else(|| format!("field `{field}[{i}]` is not representable as f64")),
            other => Err(format!(
                "field `{field}[{i}]` is {}; expected a number or null (unbounded)",
                kind(other)
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn numbers(obj: &Map<String, Value>, field: &str) -> Result<Option<Vec<f64>>, String> {
    let Some(a) = array(obj, field)? else {
        return Ok(None);
    };
    a.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_f64()
                .ok_or_else(|| format!("field `{field}[{i}]` is {}; expected a number", kind(v)))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn matrix(field: &str, v: &Value, d: usize) -> Result<Vec<f64>, String> {
    let rows = v.as_array().ok_or_else(|| {
        format!(
            "field `{field}` is {}; expected a {d} × {d} array of arrays",
            kind(v)
        )
    })?;
    if rows.len() != d {
        return Err(format!(
            "field `{field}` has {} rows; expected {d} (the length of `upper`)",
            rows.len()
        ));
    }
    let mut out = Vec::with_capacity(d * d);
    for (i, row) in rows.iter().enumerate() {
        let row = row.as_array().ok_or_else(|| {
            format!(
                "field `{field}[{i}]` is {}; expected an array of {d} numbers",
                kind(row)
            )
        })?;
        if row.len() != d {
            return Err(format!(
                "field `{field}[{i}]` has {} entries; expected {d}",
                row.len()
            ));
        }
        for (j, x) in row.iter().enumerate() {
            out.push(x.as_f64().ok_or_else(|| {
                format!(
                    "field `{field}[{i}][{j}]` is {}; expected a number",
                    kind(x)
                )
            })?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    fn run(input: &str, batch: usize) -> (Vec<Value>, LinesSummary) {
        let config = HaltonMvnCdfConfig::new().with_points(512);
        let mut out = Vec::new();
        let s = answer_lines::<Flex, _, _>(
            &config,
            &Default::default(),
            batch,
            input.as_bytes(),
            &mut out,
        )
        .unwrap();
        let lines = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (lines, s)
    }

    #[test]
    fn parses_queries_and_names_bad_fields() {
        let q = parse_query_line(r#"{"corr": [[1, 0.5], [0.5, 1]], "std": [2, 1], "upper": [0, null], "lower": [null, -1], "mean": [0, 0]}"#).unwrap();
        assert_eq!(q.cov, vec![4.0, 1.0, 1.0, 1.0]);
        assert_eq!(q.upper, vec![0.0, f64::INFINITY]);
        assert_eq!(q.lower, Some(vec![f64::NEG_INFINITY, -1.0]));
        for (line, needle) in [
            (r#"{"cov": [[1]], "upper": ["x"]}"#, "upper[0]"),
            (r#"{"cov": [[1, 0], [0]], "upper": [0, 0]}"#, "cov[1]"),
            (r#"{"upper": [0]}"#, "missing field `cov`"),
            (
                r#"{"cov": [[1]], "upper": [0], "colour": 1}"#,
                "unknown field `colour`",
            ),
            (r#"{"cov": [[1]], "corr": [[1]], "upper": [0]}"#, "both"),
            (r#"[1]"#, "expected a JSON object"),
            (
                r#"{"corr": [[2, 0], [0, 1]], "upper": [0, 0]}"#,
                "`corr[0][0]` is 2",
            ),
            (
                r#"{"corr": [[1, 0], [0, 0.5]], "upper": [0, 0]}"#,
                "`corr[1][1]` is 0.5",
            ),
            (
                r#"{"corr": [[1, 1.5], [1.5, 1]], "upper": [0, 0]}"#,
                "`corr[0][1]` is 1.5",
            ),
        ] {
            let e = parse_query_line(line).unwrap_err();
            assert!(e.contains(needle), "{line}: {e}");
        }
    }

    #[test]
    fn every_line_is_answered_in_order_and_bad_lines_say_where() {
        let big = format!(
            "{{\"cov\": {}, \"upper\": {}}}",
            serde_json::to_string(
                &(0..1000)
                    .map(|i| (0..1000).map(|j| (i == j) as u8 as f64).collect::<Vec<_>>())
                    .collect::<Vec<_>>()
            )
            .unwrap(),
            serde_json::to_string(&vec![0.0; 1000]).unwrap()
        );
        let input = [
            r#"{"cov": [[1]], "upper": [0]}"#,
            "",
            r#"{"corr": [[2, 0], [0, 1]], "upper": [0, 0]}"#,
            r#"{"corr": [[1, 0.5], [0.5, 1]], "upper": [0, 0]}"#,
            &big,
            r#"{"cov": [[1, 2], [2, 1]], "upper": [0, 0]}"#,
            "not json",
            r#"{"cov": [[1]], "upper": [null]}"#,
        ]
        .join("\n");
        for batch in [1, 2, 3, 100] {
            let (lines, s) = run(&input, batch);
            assert_eq!(
                s,
                LinesSummary {
                    answered: 3,
                    failed: 4
                },
                "batch {batch}"
            );
            assert_eq!(lines.len(), 7, "batch {batch}");
            assert_eq!(lines[0]["p"].as_f64(), Some(0.5));
            assert_eq!(lines[1]["line"], 3);
            let e = lines[1]["error"].as_str().unwrap();
            assert!(e.starts_with("line 3: ") && e.contains("corr[0][0]"), "{e}");
            assert!((lines[2]["p"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-6);
            assert_eq!(lines[3]["line"], 5);
            let e = lines[3]["error"].as_str().unwrap();
            assert!(
                e.starts_with("line 5: ") && e.contains("dimension 1000"),
                "{e}"
            );
            assert_eq!(lines[4]["line"], 6);
            let e = lines[4]["error"].as_str().unwrap();
            assert!(e.contains("not positive semi-definite"), "{e}");
            assert_eq!(lines[5]["line"], 7);
            assert_eq!(lines[6]["p"].as_f64(), Some(1.0));
        }
        let mut bytes = b"{\"cov\": [[1]], \"upper\": [0]}\n\xff\xfe\n".to_vec();
        bytes.extend_from_slice(b"{\"cov\": [[1]], \"upper\": [0]}\n");
        let config = HaltonMvnCdfConfig::new().with_points(512);
        let mut out = Vec::new();
        let s = answer_lines::<Flex, _, _>(&config, &Default::default(), 8, &bytes[..], &mut out)
            .unwrap();
        assert_eq!(
            s,
            LinesSummary {
                answered: 2,
                failed: 1
            }
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("line 2: not valid UTF-8"), "{text}");
    }
}
