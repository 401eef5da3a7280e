//! `kiln runs regressions`: the runs whose latency is far above that of runs of their size
//! ([`crate::analysis::detect`]), each with its config difference from its nearest normal
//! peer, and optionally an attribution (both models profiled on identical inputs).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{ConfigDifference, LatencyBatch, ReportError, config_diff};
use crate::analysis::{self, Flagged, RegressionRule, RunPoint};
use crate::registry::RunRow;

/// The finished runs with a latency at `which` and a parameter count, as analysis points.
pub fn points(rows: &[RunRow], which: LatencyBatch) -> Vec<RunPoint> {
    rows.iter()
        .filter(|r| r.status == crate::records::RunState::Finished)
        .filter_map(|r| {
            Some(RunPoint {
                id: r.id.clone(),
                params: r.param_count? as f64,
                latency_us: which.of(r)?,
            })
        })
        .collect()
}

/// One flagged run.
#[derive(Debug, Clone)]
pub struct Finding<'a> {
    /// What the detector found.
    pub flagged: Flagged,
    /// The flagged run's row.
    pub run: Option<&'a RunRow>,
    /// Its nearest normal peer's row.
    pub peer: Option<&'a RunRow>,
    /// The config differences from the peer to the flagged run.
    pub config_diff: Vec<ConfigDifference>,
}

impl Finding<'_> {
    /// The finding as `kiln runs regressions` prints it.
    pub fn text(&self) -> String {
        let f = &self.flagged;
        let mut s = format!(
            "REGRESSION {}: {:.2} µs at {:.0} parameters = {:.2}× the median ({:.2} µs) of {} runs of similar size\n",
            f.id, f.latency_us, f.params, f.ratio, f.peer_median_us, f.peers
        );
        match &f.nearest_normal_peer {
            Some(p) => {
                let _ = writeln!(s, "  nearest normal peer: {p}");
                if self.config_diff.is_empty() {
                    s.push_str(
                        "  config difference: none (same config — suspect the machine or build)\n",
                    );
                }
                for (k, x, y) in &self.config_diff {
                    let _ = writeln!(s, "  config difference: {k}: {x} (peer) → {y} (flagged)");
                }
            }
            None => s.push_str("  no unflagged peer of similar size\n"),
        }
        s
    }

    /// The finding as one line of `kiln runs regressions --json`.
    pub fn json(&self) -> String {
        #[derive(Serialize)]
        struct Difference<'a> {
            key: &'a str,
            peer: &'a str,
            flagged: &'a str,
        }
        #[derive(Serialize)]
        struct Line<'a> {
            flagged: &'a Flagged,
            config_diff_from_peer: Vec<Difference<'a>>,
        }
        serde_json::to_value(Line {
            flagged: &self.flagged,
            config_diff_from_peer: self
                .config_diff
                .iter()
                .map(|(key, peer, flagged)| Difference { key, peer, flagged })
                .collect(),
        })
        .expect("a finding serialises")
        .to_string()
    }
}

/// What the detector found among a registry's runs.
#[derive(Debug, Clone)]
pub struct Regressions<'a> {
    /// The runs judged (finished, with a latency at the batch size and a parameter count).
    pub judged: usize,
    /// The batch size whose latency was judged.
    pub which: LatencyBatch,
    /// The rule applied.
    pub rule: RegressionRule,
    /// The flagged runs.
    pub findings: Vec<Finding<'a>>,
}

impl Regressions<'_> {
    /// The summary line (`N run(s) with latency at batch B; K flagged (rule: …)`).
    pub fn summary(&self) -> String {
        format!(
            "{} run(s) with latency at batch {}; {} flagged (rule: ≥ {:.2}× and ≥ {} µs above the median of ≥ {} runs within ±{:.0}% of their parameter count)",
            self.judged,
            self.which.batch(),
            self.findings.len(),
            self.rule.ratio,
            self.rule.min_delta_us,
            self.rule.min_peers,
            self.rule.size_tolerance * 100.0
        )
    }
}

/// Flag the runs among `rows` whose latency at `which` breaks `rule`, each with its config
/// difference from its nearest normal peer.
pub fn find_regressions<'a>(
    rows: &'a [RunRow],
    which: LatencyBatch,
    rule: &RegressionRule,
) -> Regressions<'a> {
    let pts = points(rows, which);
    let by_id = |id: &str| rows.iter().find(|r| r.id == id);
    let findings = analysis::detect(&pts, rule)
        .into_iter()
        .map(|flagged| {
            let run = by_id(&flagged.id);
            let peer = flagged.nearest_normal_peer.as_deref().and_then(by_id);
            let config_diff = match (run, peer) {
                (Some(a), Some(b)) => config_diff(b, a),
                _ => Vec::new(),
            };
            Finding {
                flagged,
                run,
                peer,
                config_diff,
            }
        })
        .collect();
    Regressions {
        judged: pts.len(),
        which,
        rule: *rule,
        findings,
    }
}

/// The outcome of attributing a regression.
#[derive(Debug, Clone, PartialEq)]
pub enum Attribution {
    /// A run has no exported model to profile (its id).
    NoArtifact(String),
    /// The profiles' difference, indented, as `kiln runs regressions --attribute` prints it.
    Table(String),
}

/// Profile the flagged run's model and its peer's on identical inputs, each on the engine its
/// latency was measured on (when those differ, that difference is part of what the table has
/// to explain), writing the profiles under `out/<flagged id>-{peer,flagged}`.
pub fn attribute(
    slow: &RunRow,
    peer: &RunRow,
    which: LatencyBatch,
    out: &Path,
) -> Result<Attribution, ReportError> {
    let engine_of = |r: &RunRow| {
        r.latency
            .as_ref()
            .map(|l| l.engine.clone())
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| crate::bench::latency::serving_engine().to_string())
    };
    let engines = [engine_of(peer), engine_of(slow)];
    let mut tables = Vec::new();
    for ((label, r), engine) in [("peer", peer), ("flagged", slow)]
        .into_iter()
        .zip(&engines)
    {
        let Some(artifact) = &r.artifact_path else {
            return Ok(Attribution::NoArtifact(r.id.clone()));
        };
        // The record's engine name is text (it may predate this build's engines).
        let engine = crate::infer::parse_engine(engine).map_err(crate::bench::BenchError::from)?;
        let o =
            crate::bench::profile::profile_infer(&crate::bench::profile::ProfileInferOptions {
                checkpoint: Some(PathBuf::from(artifact)),
                engine,
                batch: which.batch(),
                iters: 2000,
                warmup: 200,
                threads: 1,
                out: out.join(format!("{}-{label}", slow.id)),
                seed: 0,
                record_shapes: false,
                profile_memory: false,
                with_stack: false,
            })?;
        tables.push(o.averages);
    }
    let rows = crate::observe::profiler::diff(&tables[0], &tables[1]);
    let engines = if engines[0] == engines[1] {
        engines[0].clone()
    } else {
        format!("A on {}, B on {}", engines[0], engines[1])
    };
    let mut s = format!(
        "  attribution ({engines}, batch {}, identical inputs; A = peer, B = flagged):\n",
        which.batch()
    );
    for line in crate::observe::profiler::diff_table(&rows).lines().take(12) {
        let _ = writeln!(s, "    {line}");
    }
    Ok(Attribution::Table(s))
}
