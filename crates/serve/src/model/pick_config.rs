//! The pick model's configuration: `pick.json` in a version directory, read and resolved
//! (correlations, estimator settings, the optional network) into a [`PickModel`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::LoadError;
use crate::artifact::{Checkpoint, Manifest};
use kiln_model::model::mvn::{HaltonMvnCdfConfig, MvnMethod, PickCorrelation};

/// The file that makes a version directory a pick model.
pub const PICK_FILE: &str = "pick.json";

/// The pick model's configuration (`pick.json` in a version directory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PickConfig {
    /// Must be `"pick"`.
    pub kind: PickKind,
    /// A regression checkpoint (relative to the version directory, or absolute) whose target
    /// names and residual correlation are used when `targets` / `target_corr` are absent.
    #[serde(default)]
    pub checkpoint: Option<PathBuf>,
    /// Target names (their order indexes the correlation matrices).
    #[serde(default)]
    pub targets: Option<Vec<String>>,
    /// k × k correlation between targets on the same row.
    #[serde(default)]
    pub target_corr: Option<Vec<Vec<f64>>>,
    /// k × k correlation between targets on different rows (absent: independent).
    #[serde(default)]
    pub cross_row_corr: Option<Vec<Vec<f64>>>,
    /// Halton points per randomisation.
    #[serde(default = "default_points")]
    pub points: usize,
    /// Randomisations (for the standard error).
    #[serde(default = "default_randomizations")]
    pub randomizations: usize,
    /// The estimator: `genz` or `naive` (in any case; written lowercase).
    #[serde(default = "default_method", with = "method_name")]
    pub method: MvnMethod,
    /// Scrambling seed.
    #[serde(default)]
    pub seed: u64,
    /// Most legs per pick.
    #[serde(default = "default_max_legs")]
    pub max_legs: usize,
    /// What a leg carries: its outcome's `moments` (mean, std) or its row of `features`
    /// (needs `checkpoint`).
    #[serde(default)]
    pub legs_from: LegsFrom,
}

/// What a `pick.json` configures; `"pick"` is the only kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PickKind {
    /// A pick model.
    #[serde(rename = "pick")]
    Pick,
}

/// The spellings `method` accepts (case-insensitively), in the order errors list them.
pub const METHOD_NAMES: &[&str] = &["genz", "naive"];

/// `method` as its lowercase name, parsed by [`MvnMethod`]'s `FromStr`.
mod method_name {
    use serde::de::Error;

    use super::*;

    pub fn serialize<S: Serializer>(m: &MvnMethod, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(m.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<MvnMethod, D::Error> {
        let name = String::deserialize(d)?;
        name.parse()
            .map_err(|_: String| D::Error::unknown_variant(&name, METHOD_NAMES))
    }
}

/// What a pick model's legs carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LegsFrom {
    /// Mean and standard deviation of each leg's outcome.
    #[default]
    Moments,
    /// A row of features per leg; the checkpoint's network predicts the moments.
    Features,
}

fn default_points() -> usize {
    4096
}
fn default_randomizations() -> usize {
    8
}
fn default_method() -> MvnMethod {
    MvnMethod::Genz
}
fn default_max_legs() -> usize {
    16
}

/// A resolved pick model: correlation and estimator settings.
#[derive(Debug, Clone)]
pub struct PickModel {
    /// Target names.
    pub targets: Vec<String>,
    /// The correlations.
    pub corr: PickCorrelation,
    /// The estimator's config.
    pub estimator: HaltonMvnCdfConfig,
    /// The network that predicts legs' moments (`legs_from: features`).
    pub network: Option<Arc<Checkpoint>>,
}

fn flatten_square(name: &str, m: &[Vec<f64>], k: usize) -> Result<Vec<f64>, String> {
    if m.len() != k || m.iter().any(|r| r.len() != k) {
        return Err(format!(
            "`{name}` must be {k} × {k} (one row and column per target)"
        ));
    }
    Ok(m.iter().flatten().copied().collect())
}

impl PickConfig {
    /// Read and resolve `dir/pick.json`.
    pub fn load(dir: &Path) -> Result<PickModel, LoadError> {
        let path = dir.join(PICK_FILE);
        let bad = |message: String| LoadError::Pick {
            path: path.clone(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Io {
            path: path.clone(),
            source,
        })?;
        let cfg: PickConfig = serde_json::from_str(&text).map_err(|e| {
            bad(format!(
                "line {} column {}: invalid pick config: {e}",
                e.line(),
                e.column()
            ))
        })?;
        let ckpt_dir = cfg.checkpoint.as_ref().map(|p| {
            let p = if p.is_absolute() {
                p.clone()
            } else {
                dir.join(p)
            };
            crate::artifact::resolve_dir(&p)
        });
        let network = match (cfg.legs_from, &ckpt_dir) {
            (LegsFrom::Moments, _) => None,
            (LegsFrom::Features, None) => {
                return Err(bad(
                    "`legs_from: features` needs `checkpoint` (the network that predicts the legs)"
                        .into(),
                ));
            }
            (LegsFrom::Features, Some(d)) => Some(Arc::new(Checkpoint::load(d)?)),
        };
        let manifest: Option<Manifest> = match (&network, &ckpt_dir) {
            (Some(n), _) => Some(n.manifest.clone()),
            (None, None) => None,
            (None, Some(dir)) => Some(
                crate::artifact::read_manifest(dir)
                    .map_err(|e| bad(format!("checkpoint {}: {e}", dir.display())))?,
            ),
        };
        let targets = match (&cfg.targets, &manifest) {
            (Some(t), _) => t.clone(),
            (None, Some(m)) => m.target_names(),
            (None, None) => return Err(bad("give `targets` or `checkpoint`".into())),
        };
        let k = targets.len();
        let target_corr = match (&cfg.target_corr, &manifest) {
            (Some(c), _) => flatten_square("target_corr", c, k).map_err(bad)?,
            (None, Some(m)) => flatten_square(
                "the checkpoint's residual_correlation",
                &m.residual_correlation,
                k,
            )
            .map_err(bad)?,
            (None, None) => return Err(bad("give `target_corr` or `checkpoint`".into())),
        };
        let cross_row_corr = cfg
            .cross_row_corr
            .as_ref()
            .map(|c| flatten_square("cross_row_corr", c, k))
            .transpose()
            .map_err(bad)?;
        let corr = PickCorrelation {
            targets: k,
            target_corr,
            cross_row_corr,
        };
        corr.validate().map_err(|e| bad(e.to_string()))?;
        let estimator = HaltonMvnCdfConfig::new()
            .with_points(cfg.points)
            .with_randomizations(cfg.randomizations)
            .with_method(cfg.method)
            .with_seed(cfg.seed)
            .with_max_dim(cfg.max_legs);
        estimator.validate().map_err(|e| bad(e.to_string()))?;
        Ok(PickModel {
            targets,
            corr,
            estimator,
            network,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn parse(v: Value) -> Result<PickConfig, serde_json::Error> {
        serde_json::from_value(v)
    }

    /// Fails to compile when `MvnMethod` gains a variant, so `METHOD_NAMES` stays complete.
    fn listed(m: MvnMethod) -> bool {
        match m {
            MvnMethod::Genz | MvnMethod::Naive => METHOD_NAMES.contains(&m.name()),
        }
    }

    #[test]
    fn every_accepted_spelling_round_trips() {
        assert!(listed(MvnMethod::Genz) && listed(MvnMethod::Naive));
        for &name in METHOD_NAMES {
            let cfg = parse(json!({"kind": "pick", "method": name})).unwrap();
            assert_eq!(cfg.kind, PickKind::Pick);
            assert_eq!(cfg.method.name(), name);
            let back = serde_json::to_value(&cfg).unwrap();
            assert_eq!(back["kind"], "pick");
            assert_eq!(back["method"], name);
            assert_eq!(parse(back).unwrap(), cfg);
            // Today's parser ignores case; the config is written back lowercase.
            let upper = parse(json!({"kind": "pick", "method": name.to_uppercase()})).unwrap();
            assert_eq!(upper.method, cfg.method);
        }
        for (name, want) in [
            ("moments", LegsFrom::Moments),
            ("features", LegsFrom::Features),
        ] {
            let cfg = parse(json!({"kind": "pick", "legs_from": name})).unwrap();
            assert_eq!(cfg.legs_from, want);
            assert_eq!(serde_json::to_value(&cfg).unwrap()["legs_from"], name);
        }
        let cfg = parse(json!({"kind": "pick"})).unwrap();
        assert_eq!(cfg.method, MvnMethod::Genz);
        assert_eq!(cfg.legs_from, LegsFrom::Moments);
    }

    #[test]
    fn a_bad_value_lists_the_accepted_ones() {
        let cases = [
            (
                json!({"kind": "pick", "method": "sobol"}),
                "sobol",
                &["genz", "naive"][..],
            ),
            (json!({"kind": "picks"}), "picks", &["pick"][..]),
            (
                json!({"kind": "pick", "legs_from": "rows"}),
                "rows",
                &["moments", "features"][..],
            ),
        ];
        for (v, bad, accepted) in cases {
            let e = parse(v).unwrap_err().to_string();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
            for a in accepted {
                assert!(e.contains(&format!("`{a}`")), "{e} should list {a}");
            }
        }
        assert!(
            parse(json!({"method": "genz"})).is_err(),
            "kind is required"
        );
    }

    #[test]
    fn load_names_the_file_and_the_accepted_methods() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let cfg =
            json!({"kind": "pick", "targets": ["a"], "target_corr": [[1.0]], "method": "GENZ"});
        std::fs::write(dir.join(PICK_FILE), cfg.to_string()).unwrap();
        let m = PickConfig::load(dir).unwrap();
        assert_eq!(m.estimator.method, MvnMethod::Genz);
        let cfg =
            json!({"kind": "pick", "targets": ["a"], "target_corr": [[1.0]], "method": "qmc"});
        std::fs::write(dir.join(PICK_FILE), cfg.to_string()).unwrap();
        let e = PickConfig::load(dir).unwrap_err().to_string();
        assert!(e.contains(PICK_FILE), "{e}");
        assert!(
            e.contains("`qmc`") && e.contains("`genz`") && e.contains("`naive`"),
            "{e}"
        );
    }
}
