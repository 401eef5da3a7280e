//! `kiln import pytorch`: a PyTorch `state_dict` saved as safetensors becomes a kiln
//! checkpoint (manifest, hashes, seal) that `kiln predict`, `kiln serve` and every engine load.
//!
//! The weights file follows the source article's module layout:
//!
//! ```text
//! backbone.0.weight [h1, F]   backbone.0.bias [h1]      nn.Sequential(Linear, act,
//! backbone.2.weight [h2, h1]  backbone.2.bias [h2]                    Linear, act, …)
//! …
//! mean_head.weight  [k, hL]   mean_head.bias  [k]       nn.Linear
//! logvar_head.weight [k, hL]  logvar_head.bias [k]      nn.Linear
//! ```
//!
//! in PyTorch's `[out, in]` layout, in F32, F64, F16 or BF16 (converted to F32). Other layer
//! names are renamed with [`KeyMap`]s (`--map net.=backbone.`): the first rule whose `from`
//! prefixes a tensor's name replaces that prefix.
//!
//! The network is described by an ordinary kiln experiment config: its `data.features`,
//! `data.targets`, `model.hidden` and `model.activation`; every other key is ignored, so a
//! training config can be passed as it is. The normalisation statistics go in an optional
//! top-level `normalization:` section of that file (read only by the import: `kiln train`
//! would refuse the key, so keep it in the copy you import with):
//!
//! ```yaml
//! normalization:
//!   features:            # x_normalised = (x − mean) / std, per feature
//!     AB: {mean: 412.0, std: 180.5}
//!   targets:             # y = mean + std · y_network (std likewise scaled)
//!     HR: {mean: 11.2, std: 9.8}
//! ```
//!
//! A column not listed is left as it is (mean 0, std 1): without the section, the network
//! takes raw features and answers in raw target units. The checkpoint's residual correlation
//! (used by `kiln pick`) is the identity, since no validation residuals are known.

use crate::records::metrics::{ImportInfo, ManifestMetrics};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::artifact::{self, ArtifactError, DatasetInfo, HostTensor, HostWeights, Manifest};
use crate::config::{Activation, ConfigError, ModelConfig};
use crate::data::ColumnStats;
use crate::data::dataset::sha256_hex;
use crate::model::RegressionNetConfig;

/// Errors from an import.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The config file is unreadable, malformed or has an invalid value (located).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The weights file is not a safetensors file of float tensors.
    #[error("{path}: invalid safetensors file: {message}")]
    Weights {
        /// The weights file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// A `--map` rule is malformed or makes two tensors collide.
    #[error("--map {rule}: {message}")]
    Map {
        /// The rule as given.
        rule: String,
        /// What was wrong.
        message: String,
    },
    /// The tensors do not fit the declared architecture, or the checkpoint could not be
    /// written.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// The output directory exists.
    #[error("{path} already exists: choose a new --out directory (an import never overwrites)")]
    Exists {
        /// The directory.
        path: PathBuf,
    },
}

/// A tensor-name rewrite: a name starting with `from` has that prefix replaced by `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMap {
    /// The prefix in the file.
    pub from: String,
    /// The prefix kiln expects.
    pub to: String,
}

impl KeyMap {
    /// Parse `old_prefix=new_prefix` (`from` must not be empty; `to` may be).
    pub fn parse(rule: &str) -> Result<Self, ImportError> {
        let bad = |message: &str| ImportError::Map {
            rule: rule.to_string(),
            message: message.to_string(),
        };
        let (from, to) = rule
            .split_once('=')
            .ok_or_else(|| bad("expected OLD_PREFIX=NEW_PREFIX, e.g. `net.=backbone.`"))?;
        if from.is_empty() {
            return Err(bad("the prefix to replace (before `=`) is empty"));
        }
        Ok(Self {
            from: from.to_string(),
            to: to.to_string(),
        })
    }

    fn rule(&self) -> String {
        format!("{}={}", self.from, self.to)
    }
}

/// What an import needs to know about the network, read from an experiment config.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSpec {
    /// The architecture.
    pub arch: RegressionNetConfig,
    /// Feature normalisation, in `data.features` order (identity where not given).
    pub features: Vec<ColumnStats>,
    /// Target normalisation, in `data.targets` order (identity where not given).
    pub targets: Vec<ColumnStats>,
    /// `data.path`, when the file has one (recorded in the manifest).
    pub data_path: Option<String>,
    /// SHA-256 of the config text.
    pub config_sha256: String,
}

#[derive(Deserialize)]
struct SpecFile {
    data: SpecData,
    #[serde(default)]
    model: SpecModel,
    #[serde(default)]
    normalization: Normalization,
}

#[derive(Deserialize)]
struct SpecData {
    features: Vec<String>,
    targets: Vec<String>,
    #[serde(default)]
    path: Option<String>,
}

#[derive(Deserialize)]
struct SpecModel {
    #[serde(default = "default_hidden")]
    hidden: Vec<usize>,
    #[serde(default)]
    activation: Activation,
}

fn default_hidden() -> Vec<usize> {
    ModelConfig::default().hidden
}

impl Default for SpecModel {
    fn default() -> Self {
        Self {
            hidden: default_hidden(),
            activation: Activation::default(),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Normalization {
    #[serde(default)]
    features: BTreeMap<String, MeanStd>,
    #[serde(default)]
    targets: BTreeMap<String, MeanStd>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MeanStd {
    mean: f64,
    std: f64,
}

impl ImportSpec {
    /// Read the architecture and optional normalisation from a config file.
    pub fn read(path: &Path) -> Result<Self, ImportError> {
        let text = crate::config::read_text(path)?;
        Self::parse(&text, path)
    }

    /// Parse config text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ImportError> {
        let mut key = String::new();
        let file: SpecFile = serde_saphyr::with_deserializer_from_str(text, |de| {
            serde_path_to_error::deserialize(de).map_err(|e| {
                key = e.path().to_string();
                e.into_inner()
            })
        })
        .map_err(|e| {
            let mut err = crate::config::yaml_error(&e, path);
            if let ConfigError::Parse { message, .. } = &mut err
                && !key.is_empty()
                && key != "."
                && !message.contains(&key)
            {
                *message = format!("at `{key}`: {message}");
            }
            err
        })?;
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key: key.to_string(),
            message,
        };
        for (key, names) in [
            ("data.features", &file.data.features),
            ("data.targets", &file.data.targets),
        ] {
            if names.is_empty() {
                return Err(invalid(key, "must list at least one column".into()).into());
            }
            for (i, n) in names.iter().enumerate() {
                if names[..i].contains(n) {
                    return Err(invalid(key, format!("`{n}` is listed twice")).into());
                }
            }
        }
        if let Some(i) = file.model.hidden.iter().position(|&w| w == 0) {
            return Err(invalid(&format!("model.hidden[{i}]"), "must be ≥ 1".into()).into());
        }
        let stats = |section: &str,
                     names: &[String],
                     given: &BTreeMap<String, MeanStd>|
         -> Result<Vec<ColumnStats>, ConfigError> {
            for (name, s) in given {
                let key = format!("normalization.{section}.{name}");
                if !names.contains(name) {
                    return Err(invalid(
                        &key,
                        format!("`{name}` is not in data.{section} ({})", names.join(", ")),
                    ));
                }
                if !s.mean.is_finite() {
                    return Err(invalid(&format!("{key}.mean"), "must be finite".into()));
                }
                if !(s.std.is_finite() && s.std > 0.0) {
                    return Err(invalid(
                        &format!("{key}.std"),
                        format!("must be finite and > 0, got {}", s.std),
                    ));
                }
            }
            Ok(names
                .iter()
                .map(|n| {
                    let (mean, std) = given.get(n).map_or((0.0, 1.0), |s| (s.mean, s.std));
                    ColumnStats {
                        name: n.clone(),
                        mean,
                        std,
                        transform: Default::default(),
                    }
                })
                .collect())
        };
        let features = stats(
            "features",
            &file.data.features,
            &file.normalization.features,
        )?;
        let targets = stats("targets", &file.data.targets, &file.normalization.targets)?;
        Ok(Self {
            arch: RegressionNetConfig {
                n_features: features.len(),
                hidden: file.model.hidden,
                n_targets: targets.len(),
                activation: file.model.activation,
            },
            features,
            targets,
            data_path: file.data.path,
            config_sha256: sha256_hex(text.as_bytes()),
        })
    }
}

/// Read every tensor of a safetensors file as f32 (F32, F64, F16 and BF16 are converted),
/// renamed by the first matching rule of `maps`.
pub fn read_state_dict(
    bytes: &[u8],
    path: &Path,
    maps: &[KeyMap],
) -> Result<BTreeMap<String, HostTensor>, ImportError> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| ImportError::Weights {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut out: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut source: BTreeMap<String, String> = BTreeMap::new();
    for (name, t) in st.tensors() {
        use safetensors::Dtype;
        let raw = t.data();
        let data: Vec<f32> = match t.dtype() {
            Dtype::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F64 => raw
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
                .collect(),
            Dtype::F16 => raw
                .chunks_exact(2)
                .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            Dtype::BF16 => raw
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            other => {
                return Err(ImportError::Weights {
                    path: path.to_path_buf(),
                    message: format!(
                        "tensor `{name}` has dtype {other:?}; expected a float tensor (F32, F64, F16 or BF16)"
                    ),
                });
            }
        };
        let rule = maps.iter().find(|m| name.starts_with(&m.from));
        let renamed = match rule {
            Some(m) => format!("{}{}", m.to, &name[m.from.len()..]),
            None => name.clone(),
        };
        if let Some(first) = source.get(&renamed) {
            return Err(ImportError::Map {
                rule: rule
                    .or_else(|| maps.first())
                    .map_or(String::new(), KeyMap::rule),
                message: format!("`{first}` and `{name}` both become `{renamed}`"),
            });
        }
        source.insert(renamed.clone(), name);
        out.insert(
            renamed,
            HostTensor {
                shape: t.shape().to_vec(),
                data,
            },
        );
    }
    Ok(out)
}

/// IEEE half precision → f32 (exact).
fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f32;
    match exp {
        0 => sign * frac * 2f32.powi(-24),
        0x1f if frac == 0.0 => sign * f32::INFINITY,
        0x1f => f32::NAN,
        e => sign * (1.0 + frac / 1024.0) * 2f32.powi(e - 15),
    }
}

/// An import of PyTorch weights.
#[derive(Debug, Clone)]
pub struct PytorchImport {
    /// The safetensors file of the `state_dict`.
    pub weights: PathBuf,
    /// The experiment config describing the network (and optional normalisation).
    pub config: PathBuf,
    /// The checkpoint directory to create (must not exist).
    pub out: PathBuf,
    /// Tensor-name rewrites, first match wins.
    pub maps: Vec<KeyMap>,
}

impl PytorchImport {
    /// Read, check and convert the weights, then write the checkpoint atomically. Returns
    /// its manifest.
    pub fn run(&self) -> Result<Manifest, ImportError> {
        if self.out.exists() {
            return Err(ImportError::Exists {
                path: self.out.clone(),
            });
        }
        let spec = ImportSpec::read(&self.config)?;
        let bytes = std::fs::read(&self.weights).map_err(|source| ImportError::Io {
            path: self.weights.clone(),
            source,
        })?;
        let tensors = read_state_dict(&bytes, &self.weights, &self.maps)?;
        let weights = HostWeights::from_tensors(tensors, &spec.arch, &self.weights)?;
        let sha = sha256_hex(&bytes);
        let k = spec.targets.len();
        let manifest = Manifest::new(artifact::ManifestParts {
            run_id: format!("import-{}", &sha[..12]),
            architecture: spec.arch.clone(),
            features: spec.features,
            targets: spec.targets,
            residual_correlation: (0..k)
                .map(|i| (0..k).map(|j| if i == j { 1.0 } else { 0.0 }).collect())
                .collect(),
            metrics: ManifestMetrics {
                imported: Some(ImportInfo {
                    from: "pytorch-safetensors".into(),
                    weights: self.weights.display().to_string(),
                    weights_sha256: sha.clone(),
                    config: self.config.display().to_string(),
                    maps: self.maps.iter().map(KeyMap::rule).collect(),
                }),
                ..ManifestMetrics::default()
            },
            dataset: DatasetInfo {
                path: spec.data_path.unwrap_or_default(),
                sha256: String::new(),
                rows: [0, 0, 0],
                split: BTreeMap::new(),
            },
            config_sha256: spec.config_sha256,
            teacher: None,
        });
        Ok(artifact::export(&self.out, manifest, &weights)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_converts_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    #[test]
    fn key_maps_parse_and_refuse_an_empty_prefix() {
        assert_eq!(
            KeyMap::parse("net.=backbone.").unwrap(),
            KeyMap {
                from: "net.".into(),
                to: "backbone.".into()
            }
        );
        assert!(KeyMap::parse("net.").is_err());
        assert!(KeyMap::parse("=x").is_err());
    }
}
