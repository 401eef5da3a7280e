//! `kiln mvn` (multivariate-normal probabilities for JSON-lines queries) and `kiln bench mvn`.
//!
//! Input: one query per line,
//! `{"cov": [[...]], "upper": [...], "lower": [...]?, "mean": [...]?}` — or `"corr"` (with an
//! optional `"std"`) instead of `"cov"`; `null` in a limit means unbounded. Blank lines are
//! skipped. Output: one line `{"p": ..., "se": ...}` per query, in input order. Queries of
//! different dimensions may be mixed; they are read and answered in batches.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use burn::backend::Flex;
use clap::Args;
use serde_json::{Map, Value};

use kiln::model::mvn::bench::{BenchSetting, run_setting};
use kiln::model::mvn::{HaltonMvnCdfConfig, MvnMethod, MvnQuery};

fn parse_method(s: &str) -> Result<MvnMethod, String> {
    s.parse()
}

/// A standard-error target for the adaptive mode, or none (every query uses all points).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance(pub Option<f64>);

fn parse_tolerance(s: &str) -> Result<Tolerance, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "none" | "off" | "fixed" => Ok(Tolerance(None)),
        other => match other.parse::<f64>() {
            Ok(t) if t.is_finite() && t > 0.0 => Ok(Tolerance(Some(t))),
            _ => Err(format!(
                "`{s}` is not a tolerance; expected a standard error > 0 (e.g. 2e-6) or `none`"
            )),
        },
    }
}

/// Arguments of `kiln mvn`.
#[derive(Debug, Clone, Args)]
pub struct MvnArgs {
    /// JSON-lines file with one query per line; standard input when absent.
    #[arg(long, short = 'i', value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Estimator: `genz` (separation of variables; accurate) or `naive` (fraction of points in
    /// the box; rough).
    #[arg(long, default_value = "genz", value_parser = parse_method)]
    pub method: MvnMethod,
    /// Halton points per randomisation (the work per query is points × randomisations).
    #[arg(long, default_value_t = 4096)]
    pub points: usize,
    /// Independent randomisations; the standard error comes from their spread (at least 2).
    #[arg(long, default_value_t = 8)]
    pub randomizations: usize,
    /// Seed of the point-set scrambling (same seed, same answers).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Queries read and answered per batch (bounds memory on long inputs).
    #[arg(long, default_value_t = 4096)]
    pub batch: usize,
    /// Adaptive mode (genz): stop each query once its standard error is at most this, using
    /// at most --points points per randomisation (e.g. 2e-6 for absolute errors below 1e-5);
    /// `none` uses all points for every query.
    #[arg(long, default_value = "none", value_parser = parse_tolerance)]
    pub tolerance: Tolerance,
    /// Adaptive mode: points per randomisation of the first stage.
    #[arg(long, default_value_t = 256)]
    pub min_points: usize,
}

/// Runs `kiln mvn`: reads queries, writes one `{"p":..,"se":..}` line per query.
///
/// A line that is not a valid query stops the run with an error naming the line and the field;
/// answers to earlier batches have then already been written.
pub fn run(args: &MvnArgs) -> anyhow::Result<()> {
    let reader: Box<dyn BufRead> = match &args.input {
        Some(path) => Box::new(BufReader::new(
            File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
        )),
        None => Box::new(BufReader::new(io::stdin())),
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    run_stream(args, reader, &mut out)?;
    out.flush()?;
    Ok(())
}

/// The body of [`run`] on any reader and writer (used by tests).
pub fn run_stream<R: BufRead, W: Write>(
    args: &MvnArgs,
    reader: R,
    out: &mut W,
) -> anyhow::Result<()> {
    if args.batch == 0 {
        bail!("--batch is 0; expected at least 1");
    }
    let mut queries: Vec<MvnQuery> = Vec::new();
    let mut lines: Vec<usize> = Vec::new();
    let mut model = None;
    let mut answered = 0usize;
    let mut flush =
        |queries: &mut Vec<MvnQuery>, lines: &mut Vec<usize>, out: &mut W| -> anyhow::Result<()> {
            if queries.is_empty() {
                return Ok(());
            }
            let max_d = queries.iter().map(|q| q.dim()).max().unwrap_or(1).max(1);
            let model = match &model {
                Some(m) if kiln::model::mvn::HaltonMvnCdf::<Flex>::max_dim(m) >= max_d => m,
                _ => {
                    let m = HaltonMvnCdfConfig::new()
                        .with_max_dim(max_d.max(16))
                        .with_points(args.points)
                        .with_randomizations(args.randomizations)
                        .with_seed(args.seed)
                        .with_method(args.method)
                        .with_tolerance(args.tolerance.0)
                        .with_min_points(args.min_points)
                        .init::<Flex>(&Default::default())
                        .map_err(|e| anyhow!("{e}"))?;
                    model = Some(m);
                    model.as_ref().expect("just set")
                }
            };
            let offset = answered;
            let estimates = model.forward(queries.as_slice()).map_err(|e| {
                let line = e_query(&e).map(|q| lines[q]);
                let e = e.map_query(|q| q + offset);
                match line {
                    Some(line) => anyhow!("line {line}: {e}"),
                    None => anyhow!("{e}"),
                }
            })?;
            for est in estimates {
                writeln!(out, "{}", serde_json::json!({"p": est.p, "se": est.se}))?;
            }
            answered += queries.len();
            queries.clear();
            lines.clear();
            Ok(())
        };
    for (index, line) in reader.lines().enumerate() {
        let number = index + 1;
        let line = line.with_context(|| format!("line {number}: cannot read the input"))?;
        if line.trim().is_empty() {
            continue;
        }
        let query = parse_query(&line).map_err(|e| anyhow!("line {number}: {e}"))?;
        queries.push(query);
        lines.push(number);
        if queries.len() == args.batch {
            flush(&mut queries, &mut lines, out)?;
        }
    }
    flush(&mut queries, &mut lines, out)?;
    Ok(())
}

/// The query index an estimator error refers to, if any.
fn e_query(e: &kiln::model::mvn::MvnError) -> Option<usize> {
    use kiln::model::mvn::MvnError::*;
    match e {
        EmptyQuery { query }
        | DimensionTooLarge { query, .. }
        | NotFinite { query, .. }
        | LowerAboveUpper { query, .. }
        | NotSymmetric { query, .. }
        | NegativeVariance { query, .. }
        | NotPositiveSemiDefinite { query, .. } => Some(*query),
        _ => None,
    }
}

/// Parses one JSON line into a query; the error names the field.
pub fn parse_query(line: &str) -> Result<MvnQuery, String> {
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

/// Arguments of `kiln bench mvn`.
#[derive(Debug, Clone, Args)]
pub struct MvnBenchArgs {
    /// Print one JSON line per setting instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Methods to run (comma-separated: genz, naive).
    #[arg(long, value_delimiter = ',', default_value = "genz,naive", value_parser = parse_method)]
    pub method: Vec<MvnMethod>,
    /// Dimensions (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,12")]
    pub d: Vec<usize>,
    /// Points per randomisation (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
    pub points: Vec<usize>,
    /// Queries per call (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,1024")]
    pub batch: Vec<usize>,
    /// Adaptive mode's standard-error targets (comma-separated; `none` = all points for
    /// every query, then --points is the fixed count; otherwise --points is the maximum).
    #[arg(long, value_delimiter = ',', default_value = "none", value_parser = parse_tolerance)]
    pub tolerance: Vec<Tolerance>,
    /// Adaptive mode: points per randomisation of the first stage.
    #[arg(long, default_value_t = 256)]
    pub min_points: usize,
    /// Randomisations per query.
    #[arg(long, default_value_t = 8)]
    pub randomizations: usize,
    /// Seed of the scrambling and of the test cases.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Minimum timed seconds per setting (each setting runs at least one call).
    #[arg(long, default_value_t = 1.0)]
    pub min_time: f64,
}

/// Runs `kiln bench mvn`: every (method, d, points, batch) of the grid on the CPU path, on
/// equicorrelated (ρ = ½) cases with exact answers; one line per setting as it finishes.
pub fn run_bench(args: &MvnBenchArgs) -> anyhow::Result<()> {
    if !(args.min_time.is_finite() && args.min_time >= 0.0) {
        bail!(
            "--min-time is {}; expected a number of seconds >= 0",
            args.min_time
        );
    }
    let stdout = io::stdout();
    let mut out = stdout.lock();
    if !args.json {
        writeln!(
            out,
            "{:<6} {:>3} {:>7} {:>8} {:>6} {:>12} {:>12} {:>11} {:>9} {:>7}",
            "method",
            "d",
            "points",
            "tol",
            "batch",
            "evals/s",
            "max_abs_err",
            "mean_se",
            "avg_pts",
            "setup"
        )?;
    }
    let device = Default::default();
    let mut grid = Vec::new();
    for &method in &args.method {
        for &d in &args.d {
            for &points in &args.points {
                for &Tolerance(tolerance) in &args.tolerance {
                    for &batch in &args.batch {
                        grid.push(BenchSetting {
                            method,
                            d,
                            points,
                            batch,
                            randomizations: args.randomizations,
                            tolerance,
                            min_points: args.min_points,
                        });
                    }
                }
            }
        }
    }
    for setting in grid {
        let BenchSetting {
            method,
            d,
            points,
            batch,
            ..
        } = setting;
        let record = run_setting::<Flex>(
            setting,
            args.seed,
            Duration::from_secs_f64(args.min_time),
            &device,
        )
        .map_err(|e| anyhow!("{} d={d} points={points} batch={batch}: {e}", method.name()))?;
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&record)?)?;
        } else {
            let tol = match record.tolerance {
                Some(t) => format!("{t:.1e}"),
                None => "none".into(),
            };
            writeln!(
                out,
                "{:<6} {:>3} {:>7} {:>8} {:>6} {:>12.1} {:>12.2e} {:>11.2e} {:>9.0} \
                 {:>6.1}%",
                record.method,
                record.d,
                record.points,
                tol,
                record.batch,
                record.evals_per_s,
                record.max_abs_err,
                record.mean_se,
                record.avg_points,
                100.0 * record.setup_share
            )?;
        }
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mvn_command_reads_json_lines_and_names_bad_fields() {
        let q = parse_query(r#"{"corr": [[1, 0.5], [0.5, 1]], "std": [2, 1], "upper": [0, null], "lower": [null, -1], "mean": [0, 0]}"#).unwrap();
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
        ] {
            let e = parse_query(line).unwrap_err();
            assert!(e.contains(needle), "{line}: {e}");
        }
        let args = MvnArgs {
            input: None,
            method: MvnMethod::Genz,
            points: 512,
            randomizations: 8,
            seed: 0,
            batch: 2,
            tolerance: Tolerance(None),
            min_points: 256,
        };
        let input = "{\"cov\": [[1]], \"upper\": [0]}\n\n{\"corr\": [[1, 0.5], [0.5, 1]], \"upper\": [0, 0]}\n{\"cov\": [[1]], \"upper\": [null]}\n";
        let mut out = Vec::new();
        run_stream(&args, input.as_bytes(), &mut out).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["p"].as_f64(), Some(0.5));
        assert!((lines[1]["p"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-6);
        assert_eq!(lines[2]["p"].as_f64(), Some(1.0));
        let bad =
            "{\"cov\": [[1]], \"upper\": [0]}\n{\"cov\": [[1, 2], [2, 1]], \"upper\": [0, 0]}\n";
        let e = run_stream(&args, bad.as_bytes(), &mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2") && e.contains("not positive semi-definite"),
            "{e}"
        );
        let e = run_stream(
            &args,
            "{\"cov\": [[1]], \"upper\": 3}\n".as_bytes(),
            &mut Vec::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 1") && e.contains("`upper`"), "{e}");
    }
}
