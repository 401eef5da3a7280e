//! `kiln sweep`: a grid or list of config overrides run with task parallelism (P concurrent
//! runs × T threads each), every run in the registry, ending with the right-sizing answer.
//!
//! ```yaml
//! base: configs/baseball.yaml      # the config every run starts from
//! parallel: 2                      # P: concurrent runs
//! threads_per_run: 1               # T: RAYON_NUM_THREADS of each run
//! tolerance: 0.02                  # right-sizing: within 2 % of the best validation loss
//! set:                             # overrides applied to every run (block style:
//!   stages[0].epochs: 10           # `[` cannot appear in a flow-style key)
//! grid:                            # cartesian product (keys in sorted order)
//!   model.hidden: [[16], [32], [48, 48]]
//!   model.activation: [relu, gelu]
//! list:                            # explicit extra runs
//!   - {model.hidden: [8]}
//! ```
//!
//! Besides running every member from one process ([`run_sweep`]), a sweep can run as an
//! indexed job: [`plan`], then [`run_index`] once per index (from as many processes or hosts
//! as wanted, sharing one registry), then [`summarize`].

mod indexed;
mod runner;

pub use indexed::{
    IndexOutcome, PlannedRun, SweepPlan, placement_overrides, plan, run_index, summarize,
};
pub use runner::{
    InProcessLauncher, LaunchRequest, Launched, Launcher, Member, ProcessLauncher, SweepError,
    SweepOptions, SweepReport, run_sweep,
};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// A sweep file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    /// The base config (relative to the working directory).
    pub base: PathBuf,
    /// Concurrent runs.
    #[serde(default = "one")]
    pub parallel: usize,
    /// Threads per run.
    #[serde(default = "one")]
    pub threads_per_run: usize,
    /// Relative tolerance of the right-sizing answer.
    #[serde(default = "default_tolerance")]
    pub tolerance: f64,
    /// Overrides applied to every run.
    #[serde(default)]
    pub set: BTreeMap<String, serde_json::Value>,
    /// Key → values; every combination is one run.
    #[serde(default)]
    pub grid: BTreeMap<String, Vec<serde_json::Value>>,
    /// Explicit runs (override maps), after the grid's.
    #[serde(default)]
    pub list: Vec<BTreeMap<String, serde_json::Value>>,
}

fn one() -> usize {
    1
}
fn default_tolerance() -> f64 {
    0.02
}

impl SweepSpec {
    /// Read and check a sweep file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = crate::config::read_text(path)?;
        let spec: SweepSpec =
            serde_saphyr::from_str(&text).map_err(|e| crate::config::yaml_error(&e, path))?;
        let bad = |key: &str, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key: key.into(),
            message,
        };
        if spec.parallel == 0 || spec.parallel > 256 {
            return Err(bad(
                "parallel",
                format!("expected 1..=256, got {}", spec.parallel),
            ));
        }
        if spec.threads_per_run == 0 || spec.threads_per_run > 1024 {
            return Err(bad(
                "threads_per_run",
                format!("expected 1..=1024, got {}", spec.threads_per_run),
            ));
        }
        if !(spec.tolerance.is_finite() && spec.tolerance >= 0.0) {
            return Err(bad(
                "tolerance",
                format!("expected ≥ 0, got {}", spec.tolerance),
            ));
        }
        if let Some((k, _)) = spec.grid.iter().find(|(_, v)| v.is_empty()) {
            return Err(bad(
                &format!("grid.{k}"),
                "expected at least one value".into(),
            ));
        }
        if spec.grid.is_empty() && spec.list.is_empty() {
            return Err(bad("grid", "a sweep needs a grid or a list of runs".into()));
        }
        Ok(spec)
    }

    /// Every run's `--set` overrides, in order: the grid's combinations (last key varying
    /// fastest), then the list's entries; the common `set` overrides come first in each.
    pub fn expand(&self) -> Vec<Vec<String>> {
        let common: Vec<String> = self.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut runs: Vec<Vec<String>> = Vec::new();
        if !self.grid.is_empty() {
            let axes: Vec<(&String, &Vec<serde_json::Value>)> = self.grid.iter().collect();
            let total: usize = axes.iter().map(|(_, v)| v.len()).product();
            for n in 0..total {
                // Mixed-radix digits of n, the last key varying fastest.
                let mut rest = n;
                let mut picks = vec![0usize; axes.len()];
                for (d, (_, values)) in axes.iter().enumerate().rev() {
                    picks[d] = rest % values.len();
                    rest /= values.len();
                }
                let mut o = common.clone();
                for ((k, values), &i) in axes.iter().zip(&picks) {
                    o.push(format!("{k}={}", values[i]));
                }
                runs.push(o);
            }
        }
        for entry in &self.list {
            let mut o = common.clone();
            o.extend(entry.iter().map(|(k, v)| format!("{k}={v}")));
            runs.push(o);
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_expands_to_the_cartesian_product_then_the_list() {
        let yaml = r#"
base: configs/tiny.yaml
parallel: 2
set:
  stages[0].epochs: 1
grid:
  model.hidden: [[8], [16, 16], [32]]
  model.activation: [relu, gelu]
list:
  - {model.hidden: [4]}
"#;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.yaml");
        std::fs::write(&p, yaml).unwrap();
        let s = SweepSpec::load(&p).unwrap();
        let runs = s.expand();
        assert_eq!(runs.len(), 3 * 2 + 1);
        assert_eq!(
            runs[0],
            vec![
                "stages[0].epochs=1",
                "model.activation=\"relu\"",
                "model.hidden=[8]"
            ]
        );
        assert_eq!(runs[1][2], "model.hidden=[16,16]");
        assert_eq!(runs[3][1], "model.activation=\"gelu\"");
        assert_eq!(runs[6], vec!["stages[0].epochs=1", "model.hidden=[4]"]);
        let mut uniq = runs.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), runs.len());
    }

    #[test]
    fn bad_sweeps_are_rejected_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.yaml");
        std::fs::write(&p, "base: x.yaml\nparallel: 0\ngrid: {seed: [1]}\n").unwrap();
        assert!(
            SweepSpec::load(&p)
                .unwrap_err()
                .to_string()
                .contains("`parallel`")
        );
        std::fs::write(&p, "base: x.yaml\ngrid: {seed: []}\n").unwrap();
        assert!(
            SweepSpec::load(&p)
                .unwrap_err()
                .to_string()
                .contains("grid.seed")
        );
        std::fs::write(&p, "base: x.yaml\ngrdi: {seed: [1]}\n").unwrap();
        assert!(
            SweepSpec::load(&p)
                .unwrap_err()
                .to_string()
                .contains("grdi")
        );
    }
}
