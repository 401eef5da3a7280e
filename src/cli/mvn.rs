//! `kiln mvn` (multivariate-normal probabilities for JSON-lines queries) and `kiln bench mvn`.
//!
//! Input: one query per line,
//! `{"cov": [[...]], "upper": [...], "lower": [...]?, "mean": [...]?}` — or `"corr"` (with an
//! optional `"std"`) instead of `"cov"`; `null` in a limit means unbounded. Blank lines are
//! skipped. Output: one line `{"p": ..., "se": ...}` per query, in input order, or
//! `{"error": "line N: ...", "line": N}` in place of a line that is not a valid query. Queries
//! of different dimensions may be mixed; they are read and answered in batches. The parsing
//! and answering live in `kiln::model::mvn::lines`; this file parses flags and prints.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use burn::backend::Flex;
use clap::Args;

use kiln::model::mvn::bench::{
    AnchorRecord, BenchSetting, RealisticSetting, compare_with_anchor, load_realistic,
    run_realistic, run_setting,
};
use kiln::model::mvn::lines::{LinesSummary, answer_lines};
use kiln::model::mvn::{HaltonMvnCdfConfig, MvnMethod, PointSet};
use kiln::simd::Isa;

/// A forced vector path, or `None` for the best this CPU has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IsaChoice(pub Option<Isa>);

fn parse_isa(s: &str) -> Result<IsaChoice, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "best" | "auto" => Ok(IsaChoice(None)),
        "avx512" => Ok(IsaChoice(Some(Isa::Avx512))),
        "avx2" => Ok(IsaChoice(Some(Isa::Avx2))),
        "portable" => Ok(IsaChoice(Some(Isa::Portable))),
        _ => Err(format!(
            "`{s}` is not a vector path; expected best, avx512, avx2 or portable"
        )),
    }
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
    #[arg(long, default_value = "genz")]
    pub method: MvnMethod,
    /// Points per randomisation (the work per query is points × randomisations).
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
    /// Point sets: `halton` (scrambled Halton), `sobol` (scrambled Sobol': nets at powers of
    /// two, so the adaptive stages double; the same accuracy from fewer points on the
    /// realistic families) or `auto`: Sobol' with --tolerance, Halton without (the fixed
    /// mode's answers stay those of earlier releases).
    #[arg(long, default_value = "auto", value_parser = parse_sequence_or_auto)]
    pub sequence: Sequence,
}

/// `--sequence`: a point set, or `auto` (`None`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sequence(pub Option<PointSet>);

impl Sequence {
    /// The point set for a run with (or without) a tolerance.
    pub fn resolve(self, tolerance: Option<f64>) -> PointSet {
        self.0.unwrap_or(if tolerance.is_some() {
            PointSet::Sobol
        } else {
            PointSet::Halton
        })
    }
}

fn parse_sequence_or_auto(s: &str) -> Result<Sequence, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(Sequence(None));
    }
    s.parse().map(|p| Sequence(Some(p))).map_err(|e: String| {
        e.replace(
            "expected `halton` or `sobol`",
            "expected `halton`, `sobol` or `auto`",
        )
    })
}

/// Runs `kiln mvn`: reads queries, writes one line per query: `{"p":..,"se":..}`, or
/// `{"error": "line N: ...", "line": N}` for a line that is not a valid query. Every line is
/// answered; the run fails (exit status 2) when any line did.
pub fn run(args: &MvnArgs) -> anyhow::Result<()> {
    let reader: Box<dyn BufRead> = match &args.input {
        Some(path) => Box::new(BufReader::new(
            File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
        )),
        None => Box::new(BufReader::new(io::stdin())),
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let summary = run_stream(args, reader, &mut out)?;
    out.flush()?;
    if summary.failed > 0 {
        bail!(
            "{} of {} queries failed; their output lines hold {{\"error\": ..., \"line\": N}}",
            summary.failed,
            summary.failed + summary.answered
        );
    }
    Ok(())
}

/// The body of [`run`] on any reader and writer (used by tests).
pub fn run_stream<R: BufRead, W: Write>(
    args: &MvnArgs,
    reader: R,
    out: &mut W,
) -> anyhow::Result<LinesSummary> {
    if args.batch == 0 {
        bail!("--batch is 0; expected at least 1");
    }
    let config = HaltonMvnCdfConfig::new()
        .with_points(args.points)
        .with_randomizations(args.randomizations)
        .with_seed(args.seed)
        .with_method(args.method)
        .with_tolerance(args.tolerance.0)
        .with_min_points(args.min_points)
        .with_sequence(args.sequence.resolve(args.tolerance.0));
    Ok(answer_lines::<Flex, _, _>(
        &config,
        &Default::default(),
        args.batch,
        reader,
        out,
    )?)
}

/// Arguments of `kiln bench mvn`.
#[derive(Debug, Clone, Args)]
pub struct MvnBenchArgs {
    /// Print one JSON line per setting instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Methods to run (comma-separated: genz, naive).
    #[arg(long, value_delimiter = ',', default_value = "genz,naive")]
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
    /// Point sets (comma-separated: halton, sobol), each a separate setting.
    #[arg(long, value_delimiter = ',', default_value = "halton")]
    pub sequence: Vec<PointSet>,
    /// Randomisations per query.
    #[arg(long, default_value_t = 8)]
    pub randomizations: usize,
    /// Seed of the scrambling and of the test cases.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Minimum timed seconds per setting (each setting runs at least one call).
    #[arg(long, default_value_t = 1.0)]
    pub min_time: f64,
    /// Realistic families from this fixture (benches/mvn_realistic.json) instead of the
    /// equicorrelated grid: per-query time percentiles (p50, p99, max) per family and d, the
    /// errors against the fixture's references, and each d's mix throughput. Uses --d (pass
    /// 2,4,8,12,16 for all), --points, --tolerance, --randomizations, --min-time (mix).
    #[arg(long, value_name = "FILE")]
    pub realistic: Option<PathBuf>,
    /// Realistic mode: identical copies of a query per timed call.
    #[arg(long, default_value_t = 32)]
    pub copies: usize,
    /// Realistic mode: timed rounds; a query's time is its median over them.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Realistic mode: thread counts (comma-separated), each a separate run.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    pub threads: Vec<usize>,
    /// Realistic mode: vector path (best, avx512, avx2, portable).
    #[arg(long, default_value = "best", value_parser = parse_isa)]
    pub isa: IsaChoice,
    /// Realistic mode: also run R mvtnorm's `pmvnorm` on the same queries through this script
    /// (benches/r_mvn_reference.R, with `Rscript` from PATH; Debian's r-cran-mvtnorm and
    /// r-cran-jsonlite) and print, per d and thread count, the fastest kiln setting of this run
    /// whose RMS error is at most R's: one `mvn-vs-r` line each, with the ratio.
    #[arg(long, value_name = "SCRIPT", requires = "realistic")]
    pub anchor_r: Option<PathBuf>,
    /// With --anchor-r: the mvtnorm algorithm (`default`: GenzBretz(abseps = 1e-3), as R
    /// users call it; `tight`: abseps = 1e-6, maxpts = 1e6).
    #[arg(long, default_value = "default", value_parser = ["default", "tight"])]
    pub anchor_r_algorithm: String,
    /// Realistic mode: also run SciPy's `multivariate_normal.cdf` at its defaults on the same
    /// queries through this script (benches/scipy_mvn_reference.py, with --anchor-python)
    /// and print the same matched-accuracy comparison: one `mvn-vs-scipy` line per d and
    /// thread count.
    #[arg(long, value_name = "SCRIPT", requires = "realistic")]
    pub anchor_scipy: Option<PathBuf>,
    /// With --anchor-scipy: a Python interpreter with numpy and scipy.
    #[arg(
        long,
        value_name = "PYTHON",
        default_value = "python3",
        requires = "anchor_scipy"
    )]
    pub anchor_python: PathBuf,
}

/// Runs an anchor's script (`flag`: `--anchor-r` or `--anchor-scipy`) as `program script
/// args…` and reads its JSON lines.
fn run_anchor(
    flag: &str,
    program: &std::path::Path,
    script: &std::path::Path,
    args: &[String],
    install: &str,
) -> anyhow::Result<Vec<AnchorRecord>> {
    let shown = format!("{} {}", program.display(), script.display());
    let out = std::process::Command::new(program)
        .arg(script)
        .args(args)
        .output()
        .with_context(|| format!("{flag}: cannot run `{shown}` ({install})"))?;
    if !out.status.success() {
        bail!(
            "{flag}: `{shown}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| {
                format!(
                    "{flag}: line {} of the script's output is not a record: {l}",
                    i + 1
                )
            })
        })
        .collect()
}

/// The anchors `--anchor-r` and `--anchor-scipy` ask for, on the fixture's queries of --d.
fn run_anchors(
    args: &MvnBenchArgs,
    fixture: &std::path::Path,
) -> anyhow::Result<Vec<AnchorRecord>> {
    let dims = args
        .d
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let common = [
        "--fixture".to_string(),
        fixture.display().to_string(),
        "--d".into(),
        dims,
        "--rounds".into(),
        args.rounds.max(1).to_string(),
    ];
    let mut all = Vec::new();
    if let Some(script) = &args.anchor_r {
        let mut a = common.to_vec();
        a.extend(["--algorithm".into(), args.anchor_r_algorithm.clone()]);
        all.extend(run_anchor(
            "--anchor-r",
            std::path::Path::new("Rscript"),
            script,
            &a,
            "install Debian's r-base, r-cran-mvtnorm and r-cran-jsonlite",
        )?);
    }
    if let Some(script) = &args.anchor_scipy {
        let mut a = vec!["time".to_string()];
        a.extend(common);
        all.extend(run_anchor(
            "--anchor-scipy",
            &args.anchor_python,
            script,
            &a,
            "pass --anchor-python, an interpreter with numpy and scipy",
        )?);
    }
    Ok(all)
}

/// `kiln bench mvn --realistic FILE`: one line per (threads, points, tolerance, d, family).
fn run_realistic_bench(args: &MvnBenchArgs, path: &std::path::Path) -> anyhow::Result<()> {
    let cases: Vec<_> = load_realistic(path)?
        .into_iter()
        .filter(|c| args.d.contains(&c.d))
        .collect();
    if cases.is_empty() {
        bail!(
            "{}: no case has a dimension in --d {:?}",
            path.display(),
            args.d
        );
    }
    if args.threads.contains(&0) {
        bail!("--threads has 0; expected at least 1");
    }
    // The anchors first: a missing R or SciPy fails before minutes of kiln runs, not after.
    let anchors = run_anchors(args, path)?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut all = Vec::new();
    if !args.json {
        writeln!(
            out,
            "{:<12} {:>3} {:>3} {:>6} {:>8} {:>9} {:>9} {:>9} {:>7} {:>10} {:>9} {:>9}",
            "family",
            "d",
            "thr",
            "points",
            "tol",
            "p50_us",
            "p99_us",
            "max_us",
            "p99/50",
            "evals/s",
            "max_err",
            "mean_err"
        )?;
    }
    let mut grid = Vec::new();
    for &threads in &args.threads {
        for &sequence in &args.sequence {
            for &points in &args.points {
                for &Tolerance(tolerance) in &args.tolerance {
                    grid.push((threads, sequence, points, tolerance));
                }
            }
        }
    }
    for (threads, sequence, points, tolerance) in grid {
        {
            {
                let setting = RealisticSetting {
                    points,
                    randomizations: args.randomizations,
                    tolerance,
                    min_points: args.min_points,
                    sequence,
                    copies: args.copies,
                    rounds: args.rounds,
                    threads,
                    isa: args.isa.0,
                    min_time: Duration::from_secs_f64(args.min_time),
                };
                let records =
                    run_realistic::<Flex>(&cases, &setting, args.seed, &Default::default())
                        .map_err(|e| {
                            anyhow!(
                                "realistic {} points={points} threads={threads}: {e}",
                                sequence.name()
                            )
                        })?;
                for r in records {
                    all.push(r.clone());
                    if args.json {
                        writeln!(out, "{}", serde_json::to_string(&r)?)?;
                    } else {
                        let tol = match r.tolerance {
                            Some(t) => format!("{t:.1e}"),
                            None => "none".into(),
                        };
                        writeln!(
                            out,
                            "{:<12} {:>3} {:>3} {:>6} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>7.2} \
                             {:>10.1} {:>9.2e} {:>9.2e}",
                            r.family,
                            r.d,
                            r.threads,
                            r.points,
                            tol,
                            r.us_p50,
                            r.us_p99,
                            r.us_max,
                            r.p99_over_p50,
                            r.evals_per_s,
                            r.max_abs_err,
                            r.mean_abs_err
                        )?;
                    }
                }
                out.flush()?;
            }
        }
    }
    for c in compare_with_anchor(&all, &anchors) {
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&c)?)?;
            continue;
        }
        let a = &c.anchor;
        let head = format!(
            "vs {}: d {:>2}, {} thr: {} {:.1} µs (RMS {:.2e})",
            a.label(),
            c.d,
            c.threads,
            if a.bench == "scipy-mvn" { "SciPy" } else { "R" },
            a.ms_per_query_mean * 1e3,
            a.rms_err
        );
        match (&c.kiln, c.ratio) {
            (Some(k), Some(ratio)) => writeln!(
                out,
                "{head}, kiln {:.1} µs (RMS {:.2e}, {}, tolerance {}), {ratio:.1}×",
                k.us_mean,
                k.rms_err,
                k.sequence,
                k.tolerance.map_or("none".into(), |t| format!("{t:.1e}"))
            )?,
            _ => writeln!(
                out,
                "{head}: no kiln setting of this run was as accurate; add a tighter --tolerance"
            )?,
        }
    }
    Ok(())
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
    if let Some(path) = &args.realistic {
        return run_realistic_bench(args, path);
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
        for &sequence in &args.sequence {
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
                                sequence,
                            });
                        }
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
    fn mvn_command_answers_every_line_and_counts_failures() {
        let args = MvnArgs {
            input: None,
            method: MvnMethod::Genz,
            points: 512,
            randomizations: 8,
            seed: 0,
            batch: 2,
            tolerance: Tolerance(None),
            min_points: 256,
            sequence: Sequence(None),
        };
        let input = "{\"cov\": [[1]], \"upper\": [0]}\n\n{\"corr\": [[1, 0.5], [0.5, 1]], \"upper\": [0, 0]}\n{\"cov\": [[1]], \"upper\": [null]}\n";
        let mut out = Vec::new();
        let s = run_stream(&args, input.as_bytes(), &mut out).unwrap();
        assert_eq!((s.answered, s.failed), (3, 0));
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
        let mut out = Vec::new();
        let s = run_stream(&args, bad.as_bytes(), &mut out).unwrap();
        assert_eq!((s.answered, s.failed), (1, 1));
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("line 2: ") && text.contains("not positive semi-definite"),
            "{text}"
        );
        let e = run_stream(
            &MvnArgs { batch: 0, ..args },
            "".as_bytes(),
            &mut Vec::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--batch"), "{e}");
    }

    #[test]
    fn sequence_flag_parses_and_auto_follows_the_tolerance() {
        assert_eq!(parse_sequence_or_auto("auto"), Ok(Sequence(None)));
        assert_eq!(
            parse_sequence_or_auto("Sobol"),
            Ok(Sequence(Some(PointSet::Sobol)))
        );
        assert_eq!(
            parse_sequence_or_auto("halton"),
            Ok(Sequence(Some(PointSet::Halton)))
        );
        let e = parse_sequence_or_auto("lattice").unwrap_err();
        assert!(
            e.contains("`lattice`") && e.contains("`halton`, `sobol` or `auto`"),
            "{e}"
        );
        assert_eq!(Sequence(None).resolve(None), PointSet::Halton);
        assert_eq!(Sequence(None).resolve(Some(1e-6)), PointSet::Sobol);
        assert_eq!(
            Sequence(Some(PointSet::Halton)).resolve(Some(1e-6)),
            PointSet::Halton
        );
    }

    #[test]
    fn both_point_sets_answer_within_their_standard_errors() {
        // An AR(1) box in d = 4 (not one-factor, so the adaptive mode integrates it too):
        // P(X ≤ 0.3) against a tight Sobol' reference, each setting within 5 standard errors.
        let corr = |i: i32, j: i32| 0.6f64.powi((i - j).abs());
        let rows: Vec<String> = (0..4)
            .map(|i| {
                let r: Vec<String> = (0..4).map(|j| corr(i, j).to_string()).collect();
                format!("[{}]", r.join(", "))
            })
            .collect();
        let line = format!(
            "{{\"corr\": [{}], \"upper\": [0.3, 0.3, 0.3, 0.3]}}\n",
            rows.join(", ")
        );
        let answer = |sequence: Option<PointSet>, points: usize, tolerance: Option<f64>| {
            let args = MvnArgs {
                input: None,
                method: MvnMethod::Genz,
                points,
                randomizations: 8,
                seed: 3,
                batch: 1,
                tolerance: Tolerance(tolerance),
                min_points: 64,
                sequence: Sequence(sequence),
            };
            let mut out = Vec::new();
            run_stream(&args, line.as_bytes(), &mut out).unwrap();
            let v: serde_json::Value =
                serde_json::from_str(String::from_utf8(out).unwrap().trim()).unwrap();
            (v["p"].as_f64().unwrap(), v["se"].as_f64().unwrap())
        };
        let (reference, ref_se) = answer(Some(PointSet::Sobol), 65536, None);
        assert!(ref_se < 2e-7, "{ref_se}");
        for sequence in [None, Some(PointSet::Halton), Some(PointSet::Sobol)] {
            for tolerance in [None, Some(1e-5)] {
                let (p, se) = answer(sequence, 4096, tolerance);
                assert!(se > 0.0 && se < 2e-5, "{sequence:?} {tolerance:?}: se {se}");
                assert!(
                    (p - reference).abs() <= 5.0 * se + 5.0 * ref_se,
                    "{sequence:?} {tolerance:?}: {p} ± {se} vs {reference}"
                );
            }
        }
    }
}
