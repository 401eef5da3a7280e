//! Export and load of a checkpoint directory — the one place that knows its layout.
//!
//! ```text
//! <export>/
//!   model.safetensors   f32 weights, PyTorch naming and layout: `backbone.0`, `backbone.2`,
//!                       … (an `nn.Sequential` of Linear + activation numbers its linear
//!                       layers so), `mean_head`, `logvar_head`; `<layer>.weight` is
//!                       [out, in], so `load_state_dict` into the obvious PyTorch module
//!                       works unchanged (older files numbered `backbone.0, 1, …` still load)
//!   manifest.json       architecture, feature/target names and normalisation, residual
//!                       correlation, metrics, versions, dataset and weights SHA-256
//! ```
//!
//! An export is written to a temporary sibling directory, fsynced, then renamed into place, so
//! a reader never sees a half-written checkpoint; temporary directories left by a process that
//! died mid-export are removed by the next export beside them. Loading verifies the weights'
//! SHA-256 against the manifest and every tensor's name and shape against the manifest's
//! architecture.
//!
//! The manifest is sealed too: `manifest_sha256` is the SHA-256 of the manifest's canonical
//! form (every key but `manifest_sha256` itself, keys sorted, no whitespace; see
//! [`manifest_digest`]). Since the manifest holds the weights' SHA-256, the seal covers
//! weights and manifest together: editing a target's mean or a feature's scale in
//! `manifest.json` is refused at load like a flipped byte in the weights. A deliberate edit is
//! re-sealed with [`reseal`] (`kiln checkpoint reseal --checkpoint DIR`). A manifest without a seal (written
//! before seals existed) still loads, with a warning.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::model::regression::linear_from;
use crate::model::{RegressionNet, RegressionNetConfig};
use crate::records::metrics::{LatencyReport, ManifestMetrics, TeacherInfo};
use crate::stats::Affine;
use crate::stats::ColumnStats;
use crate::util;
use crate::util::sha256_hex;

/// The weights file inside an export directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The manifest file inside an export directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The manifest `format` tag.
pub const FORMAT: &str = "kiln-checkpoint";
/// The manifest format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Errors from writing or loading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// A file could not be written (the message names it; see [`crate::util::write_atomic`]).
    #[error(transparent)]
    File(#[from] std::io::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The directory has no manifest.
    #[error(
        "{dir} is not a kiln checkpoint: no {MANIFEST_FILE} (expected an export directory or a run directory containing export/)"
    )]
    NotACheckpoint {
        /// The directory.
        dir: PathBuf,
    },
    /// The manifest does not parse.
    #[error("{path}:{line}:{column}: invalid manifest: {message}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What was wrong.
        message: String,
    },
    /// The weights file's hash differs from the manifest's.
    #[error(
        "{path}: weights SHA-256 mismatch: manifest says {expected}, file has {actual} (corrupt or replaced file)"
    )]
    HashMismatch {
        /// The weights file.
        path: PathBuf,
        /// From the manifest.
        expected: String,
        /// Of the file.
        actual: String,
    },
    /// The weights do not match the manifest's architecture.
    #[error("{path}: architecture mismatch: {message}")]
    Architecture {
        /// The weights file.
        path: PathBuf,
        /// Which tensor and what was expected.
        message: String,
    },
    /// The manifest's seal does not match its content: it was edited after export.
    #[error(
        "{path}: manifest SHA-256 mismatch: the seal says {expected}, the content has {actual} (the manifest was edited after export; if the edit is deliberate, re-seal it with `kiln checkpoint reseal --checkpoint {dir}`)",
        dir = path.parent().unwrap_or(Path::new(".")).display()
    )]
    ManifestDigest {
        /// The manifest file.
        path: PathBuf,
        /// `manifest_sha256` as written in the file.
        expected: String,
        /// Of the manifest's canonical form.
        actual: String,
    },
    /// A weight, bias or normalisation statistic is NaN or infinite (or a std is not > 0).
    #[error("{path}: {message}")]
    NotFinite {
        /// The weights file or manifest.
        path: PathBuf,
        /// Which tensor and index, or which statistic, and what was expected.
        message: String,
    },
    /// The safetensors file does not parse.
    #[error("{path}: invalid safetensors file: {message}")]
    Weights {
        /// The weights file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
}

/// One linear layer on the host, Burn layout: `w` is `[fan_in, fan_out]` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostLinear {
    /// Inputs.
    pub fan_in: usize,
    /// Outputs.
    pub fan_out: usize,
    /// Weights, `[fan_in, fan_out]` row-major.
    pub w: Vec<f32>,
    /// Biases, `[fan_out]`.
    pub b: Vec<f32>,
}

/// A network's weights on the host: backbone layers, mean head, log-variance head.
#[derive(Debug, Clone, PartialEq)]
pub struct HostWeights {
    /// The architecture.
    pub arch: RegressionNetConfig,
    /// Backbone layers in order.
    pub backbone: Vec<HostLinear>,
    /// Mean head.
    pub mean_head: HostLinear,
    /// Log-variance head.
    pub logvar_head: HostLinear,
}

fn linear_to_host<B: Backend>(l: &burn::nn::Linear<B>) -> HostLinear {
    let [fan_in, fan_out] = l.weight.dims();
    let w = l
        .weight
        .val()
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 weights");
    let b = match &l.bias {
        Some(b) => b
            .val()
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .expect("f32 bias"),
        None => vec![0.0; fan_out],
    };
    HostLinear {
        fan_in,
        fan_out,
        w,
        b,
    }
}

impl HostWeights {
    /// Copy a network's weights to the host; a packed ensemble's as the plain network that
    /// serves it (see [`RegressionNet::folded`]).
    pub fn from_model<B: Backend>(model: &RegressionNet<B>) -> Self {
        if model.members > 1 {
            return Self::from_model(&model.clone().folded());
        }
        Self {
            arch: model.architecture(),
            backbone: model.backbone.iter().map(linear_to_host).collect(),
            mean_head: linear_to_host(&model.mean_head),
            logvar_head: linear_to_host(&model.logvar_head),
        }
    }

    /// Build a Burn network on `device` from these weights.
    pub fn to_model<B: Backend>(&self, device: &B::Device) -> RegressionNet<B> {
        let mk =
            |l: &HostLinear| linear_from(l.w.clone(), l.b.clone(), l.fan_in, l.fan_out, device);
        RegressionNet {
            backbone: self.backbone.iter().map(mk).collect(),
            mean_head: mk(&self.mean_head),
            logvar_head: mk(&self.logvar_head),
            activation: self.arch.activation,
            members: 1,
        }
    }

    /// `(name, layer)` pairs in file order: `backbone.0`, `backbone.2`, … (see
    /// [`layer_names`]), `mean_head`, `logvar_head`.
    pub fn named(&self) -> Vec<(String, &HostLinear)> {
        let layers = self
            .backbone
            .iter()
            .chain([&self.mean_head, &self.logvar_head]);
        layer_names(self.backbone.len())
            .into_iter()
            .zip(layers)
            .collect()
    }

    /// The named tensors in PyTorch layout (`<layer>.weight` `[out, in]`, `<layer>.bias`
    /// `[out]`), as [`HostWeights::to_safetensors`] writes them.
    pub fn to_tensors(&self) -> BTreeMap<String, HostTensor> {
        let mut tensors = BTreeMap::new();
        for (name, l) in self.named() {
            let mut t = vec![0f32; l.w.len()];
            for i in 0..l.fan_in {
                for o in 0..l.fan_out {
                    t[o * l.fan_in + i] = l.w[i * l.fan_out + o];
                }
            }
            tensors.insert(
                format!("{name}.weight"),
                HostTensor {
                    shape: vec![l.fan_out, l.fan_in],
                    data: t,
                },
            );
            tensors.insert(
                format!("{name}.bias"),
                HostTensor {
                    shape: vec![l.fan_out],
                    data: l.b.clone(),
                },
            );
        }
        tensors
    }

    /// Serialise as safetensors (PyTorch names and `[out, in]` weight layout).
    pub fn to_safetensors(&self) -> Vec<u8> {
        tensors_to_safetensors(&self.to_tensors())
    }

    /// Parse safetensors bytes and check them against `arch`.
    ///
    /// Files of kiln versions before the PyTorch `nn.Sequential` numbering (backbone layers
    /// named `backbone.0`, `backbone.1`, … instead of `backbone.0`, `backbone.2`, …) load too:
    /// a file whose names all fit that older scheme, and not the current one, is renamed on
    /// read.
    pub fn from_safetensors(
        bytes: &[u8],
        arch: &RegressionNetConfig,
        path: &Path,
    ) -> Result<Self, ArtifactError> {
        let st =
            safetensors::SafeTensors::deserialize(bytes).map_err(|e| ArtifactError::Weights {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        let mut tensors = BTreeMap::new();
        for (name, t) in st.tensors() {
            if t.dtype() != safetensors::Dtype::F32 {
                return Err(ArtifactError::Architecture {
                    path: path.to_path_buf(),
                    message: format!("tensor `{name}` has dtype {:?}, expected F32", t.dtype()),
                });
            }
            let data = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            tensors.insert(
                name,
                HostTensor {
                    shape: t.shape().to_vec(),
                    data,
                },
            );
        }
        let current = expected_tensor_names(arch.hidden.len());
        let legacy: Vec<String> = (0..arch.hidden.len())
            .flat_map(|i| [format!("backbone.{i}.weight"), format!("backbone.{i}.bias")])
            .collect();
        let fits = |names: &[String]| tensors.keys().all(|k| names.contains(k));
        if arch.hidden.len() >= 2 && !fits(&current) && fits_legacy(&tensors, &legacy, &current) {
            tensors = tensors
                .into_iter()
                .map(|(k, t)| (legacy_to_current(&k).unwrap_or(k), t))
                .collect();
        }
        Self::from_tensors(tensors, arch, path)
    }

    /// Build weights for `arch` from named tensors in PyTorch layout (`<layer>.weight`
    /// `[out, in]`, `<layer>.bias` `[out]`, layers named by [`layer_names`]). Every missing,
    /// unexpected or misshapen tensor is an [`ArtifactError::Architecture`] naming it (and
    /// both shapes); `path` is only used in messages.
    pub fn from_tensors(
        mut tensors: BTreeMap<String, HostTensor>,
        arch: &RegressionNetConfig,
        path: &Path,
    ) -> Result<Self, ArtifactError> {
        let arch_err = |message: String| ArtifactError::Architecture {
            path: path.to_path_buf(),
            message,
        };
        let shapes = arch.layer_shapes();
        let names = layer_names(arch.hidden.len());
        let expected: Vec<(String, Vec<usize>)> = names
            .iter()
            .zip(&shapes)
            .flat_map(|(n, &(fan_in, fan_out))| {
                [
                    (format!("{n}.weight"), vec![fan_out, fan_in]),
                    (format!("{n}.bias"), vec![fan_out]),
                ]
            })
            .collect();
        let extra: Vec<String> = tensors
            .keys()
            .filter(|k| !expected.iter().any(|(e, _)| e == *k))
            .map(|k| format!("`{k}`"))
            .collect();
        let missing: Vec<String> = expected
            .iter()
            .filter(|(e, _)| !tensors.contains_key(e))
            .map(|(e, shape)| format!("`{e}` with shape {shape:?}"))
            .collect();
        if !extra.is_empty() || !missing.is_empty() {
            let mut parts = Vec::new();
            if !missing.is_empty() {
                parts.push(format!("missing tensor {}", missing.join(", ")));
            }
            if !extra.is_empty() {
                parts.push(format!("unexpected tensor {}", extra.join(", ")));
            }
            return Err(arch_err(format!(
                "{} (the architecture {} → {:?} → {} has layers {})",
                parts.join("; "),
                arch.n_features,
                arch.hidden,
                arch.n_targets,
                names.join(", ")
            )));
        }
        for (name, shape) in &expected {
            let t = &tensors[name];
            if &t.shape != shape {
                return Err(arch_err(format!(
                    "tensor `{name}` has shape {:?}, expected {shape:?}",
                    t.shape
                )));
            }
        }
        for (name, _) in &expected {
            let t = &tensors[name];
            if let Some(message) = non_finite(name, &t.shape, &t.data) {
                return Err(ArtifactError::NotFinite {
                    path: path.to_path_buf(),
                    message,
                });
            }
        }
        let mut layers = Vec::with_capacity(names.len());
        for (name, &(fan_in, fan_out)) in names.iter().zip(&shapes) {
            let t = tensors
                .remove(&format!("{name}.weight"))
                .expect("checked above")
                .data;
            let b = tensors
                .remove(&format!("{name}.bias"))
                .expect("checked above")
                .data;
            let mut w = vec![0f32; t.len()];
            for o in 0..fan_out {
                for i in 0..fan_in {
                    w[i * fan_out + o] = t[o * fan_in + i];
                }
            }
            layers.push(HostLinear {
                fan_in,
                fan_out,
                w,
                b,
            });
        }
        let logvar_head = layers.pop().expect("heads");
        let mean_head = layers.pop().expect("heads");
        Ok(Self {
            arch: arch.clone(),
            backbone: layers,
            mean_head,
            logvar_head,
        })
    }
}

/// `None` when every value is finite, else which one is not: "tensor `NAME` has VALUE at
/// index [i, j] (flat k); …" (the index in `shape`, PyTorch layout).
pub fn non_finite(name: &str, shape: &[usize], data: &[f32]) -> Option<String> {
    let flat = data.iter().position(|v| !v.is_finite())?;
    let mut idx = vec![0; shape.len()];
    let mut rest = flat;
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[d] = rest % n;
            rest /= n;
        }
    }
    let idx: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
    Some(format!(
        "tensor `{name}` has {} at index [{}] (flat {flat}); every weight and bias must be finite",
        data[flat],
        idx.join(", ")
    ))
}

impl HostWeights {
    /// `Err(message)` naming the first tensor and index (PyTorch names and layout) whose
    /// value is NaN or infinite.
    pub fn check_finite(&self) -> Result<(), String> {
        for (name, t) in self.to_tensors() {
            if let Some(m) = non_finite(&name, &t.shape, &t.data) {
                return Err(m);
            }
        }
        Ok(())
    }
}

/// `Err(message)` when a feature's or target's mean is not finite or its std is not finite
/// and > 0 (a std of 0 gives NaN everywhere, a negative one negative standard deviations).
pub fn check_stats(features: &[ColumnStats], targets: &[ColumnStats]) -> Result<(), String> {
    for (kind, list) in [("features", features), ("targets", targets)] {
        for (i, s) in list.iter().enumerate() {
            if !s.mean.is_finite() {
                return Err(format!(
                    "{kind}[{i}] (`{}`): mean is {}, expected a finite number",
                    s.name, s.mean
                ));
            }
            if !(s.std.is_finite() && s.std > 0.0) {
                return Err(format!(
                    "{kind}[{i}] (`{}`): std is {}, expected a finite number > 0",
                    s.name, s.std
                ));
            }
        }
    }
    Ok(())
}

/// A tensor on the host: its shape and f32 values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// The shape (PyTorch's: `[out, in]` for a linear layer's weight).
    pub shape: Vec<usize>,
    /// The values, row-major.
    pub data: Vec<f32>,
}

/// Layer names of a network with `n_hidden` backbone layers, in order: `backbone.0`,
/// `backbone.2`, … — the indices `nn.Sequential(Linear, act, Linear, act, …)` gives its
/// linear layers, the activations taking the odd ones — then `mean_head`, `logvar_head`. A
/// kiln checkpoint loads into the obvious PyTorch module with `load_state_dict`.
pub fn layer_names(n_hidden: usize) -> Vec<String> {
    let mut v: Vec<String> = (0..n_hidden)
        .map(|i| format!("backbone.{}", 2 * i))
        .collect();
    v.push("mean_head".into());
    v.push("logvar_head".into());
    v
}

/// Every tensor name of a network with `n_hidden` backbone layers (`<layer>.weight`,
/// `<layer>.bias` for each of [`layer_names`]).
pub fn expected_tensor_names(n_hidden: usize) -> Vec<String> {
    layer_names(n_hidden)
        .iter()
        .flat_map(|n| [format!("{n}.weight"), format!("{n}.bias")])
        .collect()
}

/// Whether every tensor name fits the pre-`nn.Sequential` numbering (`backbone.{i}`) or the
/// heads, and at least one backbone name fits it but not the current numbering.
fn fits_legacy(
    tensors: &BTreeMap<String, HostTensor>,
    legacy: &[String],
    current: &[String],
) -> bool {
    let heads_or_legacy = |k: &String| {
        legacy.contains(k) || (k.starts_with("mean_head.") || k.starts_with("logvar_head."))
    };
    tensors.keys().all(heads_or_legacy) && tensors.keys().any(|k| !current.contains(k))
}

/// `backbone.{i}.<rest>` → `backbone.{2i}.<rest>` (kiln's older numbering to the current one).
fn legacy_to_current(name: &str) -> Option<String> {
    let rest = name.strip_prefix("backbone.")?;
    let (index, tail) = rest.split_once('.')?;
    let i: usize = index.parse().ok()?;
    Some(format!("backbone.{}.{tail}", 2 * i))
}

/// Serialise named f32 tensors as a safetensors file (names sorted).
pub fn tensors_to_safetensors(tensors: &BTreeMap<String, HostTensor>) -> Vec<u8> {
    let bytes: Vec<(&String, Vec<u8>, &HostTensor)> = tensors
        .iter()
        .map(|(k, t)| (k, le_bytes(&t.data), t))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(k, b, t)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.shape.clone(), b)
                    .expect("consistent tensor view");
            ((*k).clone(), view)
        })
        .collect();
    safetensors::serialize(views, None).expect("serialising in-memory tensors")
}

fn le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Where the dataset came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetInfo {
    /// The CSV path as configured.
    pub path: String,
    /// SHA-256 of the CSV file.
    pub sha256: String,
    /// Rows in the train / validation / test splits.
    pub rows: [usize; 3],
    /// The split as configured, e.g. `{"train": "≤ 2014", …}`.
    pub split: BTreeMap<String, String>,
}

/// The weights file and its hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightsInfo {
    /// File name inside the export directory.
    pub file: String,
    /// SHA-256 of the file.
    pub sha256: String,
    /// Element type.
    pub dtype: String,
}

/// The checkpoint manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// kiln's version.
    pub kiln_version: String,
    /// Burn's version.
    pub burn_version: String,
    /// RFC 3339 UTC creation time.
    pub created_at: String,
    /// The run that produced it.
    pub run_id: String,
    /// The network's architecture.
    pub architecture: RegressionNetConfig,
    /// Parameter count.
    pub parameter_count: usize,
    /// Features in network order with their training-split normalisation.
    pub features: Vec<ColumnStats>,
    /// Targets with their training-split normalisation.
    pub targets: Vec<ColumnStats>,
    /// Correlation of the standardised residuals `(y − μ)/σ` between targets on the
    /// validation split (`k × k`).
    pub residual_correlation: Vec<Vec<f64>>,
    /// Evaluation results (the test-split table, per-stage summaries, the verdict, …).
    pub metrics: ManifestMetrics,
    /// The dataset.
    pub dataset: DatasetInfo,
    /// The weights file.
    pub weights: WeightsInfo,
    /// SHA-256 of the experiment config text.
    pub config_sha256: String,
    /// Inference latency on the serving engine, measured before export.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyReport>,
    /// The teacher(s) of a distilled model: run id, parameter count and directory of each
    /// (absent for ordinary training).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<TeacherInfo>,
    /// Post-hoc recalibration of the variance head, when the config asked for one (absent in
    /// older checkpoints and when none was fitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationInfo>,
    /// The input preprocessing (imputation, missing indicators) and what it did to the
    /// training data; absent in manifests of older kiln versions (plain numeric inputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preprocessing: Option<crate::preprocess::Preprocessing>,
    /// Sketches of the training split's inputs and the test split's mean predicted std, the
    /// serving tier's drift reference (absent in manifests of older kiln versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<crate::drift::DriftReference>,
    /// The seal: SHA-256 of the manifest's canonical form without this key
    /// ([`manifest_digest`]); set by [`seal`]. `None` in manifests of older kiln versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_sha256: Option<String>,
}

/// A fitted recalibration of the predicted standard deviations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationInfo {
    /// The method (`variance_scaling`).
    pub method: String,
    /// The split it was fitted on.
    pub fitted_on: String,
    /// Per target, the factor `s` multiplying the network's standard deviation (the variance
    /// is multiplied by `s²`).
    pub std_scale: Vec<f64>,
    /// Where it is applied: `ln s²` is already added to the log-variance head's bias in the
    /// weights, so every engine and the ONNX export carry it; consumers do nothing more.
    pub applied_in: String,
}

/// The key of the manifest's seal.
pub const SEAL_KEY: &str = "manifest_sha256";

/// Append `v` to `out` in canonical JSON: object keys sorted, no whitespace, numbers and
/// strings as `serde_json` writes them.
fn canonical_json(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).expect("a string serialises"));
                out.push(':');
                canonical_json(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The SHA-256 of a manifest's canonical form: the JSON value without its
/// [`SEAL_KEY`], keys sorted at every level, no whitespace. Reformatting the file or
/// reordering its keys does not change it; changing any value does.
pub fn manifest_digest(manifest: &serde_json::Value) -> String {
    let mut v = manifest.clone();
    if let Some(obj) = v.as_object_mut() {
        obj.remove(SEAL_KEY);
    }
    let mut text = String::new();
    canonical_json(&v, &mut text);
    sha256_hex(text.as_bytes())
}

/// Set `manifest.manifest_sha256` to the digest of the rest of it.
pub fn seal(manifest: &mut Manifest) {
    manifest.manifest_sha256 = None;
    let v = serde_json::to_value(&*manifest).expect("manifest serialises");
    manifest.manifest_sha256 = Some(manifest_digest(&v));
}

/// Seal `manifest` and write it as `dir/manifest.json` atomically (for a checkpoint's owner
/// updating its manifest, e.g. the run layer storing the measured latency).
pub fn write_manifest(dir: &Path, manifest: &mut Manifest) -> Result<(), ArtifactError> {
    seal(manifest);
    let json = serde_json::to_vec_pretty(&*manifest).expect("manifest serialises");
    util::write_atomic(&dir.join(MANIFEST_FILE), &json)?;
    Ok(())
}

/// The outcome of [`reseal`].
#[derive(Debug, Clone, PartialEq)]
pub struct Resealed {
    /// The manifest file.
    pub path: PathBuf,
    /// The seal before (`None`: the manifest had none).
    pub old: Option<String>,
    /// The seal now.
    pub new: String,
}

/// Re-seal a checkpoint whose manifest was edited on purpose: the manifest must still parse,
/// and the checkpoint must pass every other check (weights SHA-256, architecture); then its
/// seal is recomputed and the manifest rewritten atomically. Keys the manifest format does not
/// know are kept and covered by the seal.
pub fn reseal(dir: &Path) -> Result<Resealed, ArtifactError> {
    let dir = resolve_dir(dir);
    let (mpath, value, manifest) = read_manifest_file(&dir)?;
    verify_content(&dir, &mpath, &manifest)?;
    let old = manifest.manifest_sha256.clone();
    let new = manifest_digest(&value);
    let mut value = value;
    if let Some(obj) = value.as_object_mut() {
        obj.insert(SEAL_KEY.into(), serde_json::Value::String(new.clone()));
    }
    if old.as_deref() != Some(new.as_str()) {
        let json = serde_json::to_vec_pretty(&value).expect("manifest serialises");
        util::write_atomic(&mpath, &json)?;
    }
    Ok(Resealed {
        path: mpath,
        old,
        new,
    })
}

/// What a new checkpoint's manifest says of where it came from; [`Manifest::new`] fills in the
/// rest (format, versions, creation time, parameter count; the weights entry and the seal are
/// written by [`export`]).
#[derive(Debug, Clone)]
pub struct ManifestParts {
    /// The run (or import) that produced it.
    pub run_id: String,
    /// The network's architecture.
    pub architecture: RegressionNetConfig,
    /// Features in network order with their normalisation.
    pub features: Vec<ColumnStats>,
    /// Targets with their normalisation.
    pub targets: Vec<ColumnStats>,
    /// Residual correlation between targets (`k × k`).
    pub residual_correlation: Vec<Vec<f64>>,
    /// Evaluation results.
    pub metrics: ManifestMetrics,
    /// The dataset.
    pub dataset: DatasetInfo,
    /// SHA-256 of the experiment config text.
    pub config_sha256: String,
    /// The teacher(s) of a distilled model.
    pub teacher: Option<TeacherInfo>,
}

impl Manifest {
    /// The one constructor of a new checkpoint's manifest (training and import both use it):
    /// this kiln's format, versions and the current time around `parts`.
    pub fn new(parts: ManifestParts) -> Self {
        Self {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            kiln_version: env!("CARGO_PKG_VERSION").into(),
            burn_version: crate::BURN_VERSION.into(),
            created_at: util::rfc3339(util::unix_now()),
            run_id: parts.run_id,
            parameter_count: parts.architecture.num_params(),
            architecture: parts.architecture,
            features: parts.features,
            targets: parts.targets,
            residual_correlation: parts.residual_correlation,
            metrics: parts.metrics,
            dataset: parts.dataset,
            weights: WeightsInfo {
                file: String::new(),
                sha256: String::new(),
                dtype: String::new(),
            },
            config_sha256: parts.config_sha256,
            latency: None,
            teacher: parts.teacher,
            calibration: None,
            preprocessing: None,
            drift: None,
            manifest_sha256: None,
        }
    }

    /// The feature normalisation as an f32 affine map.
    pub fn feature_affine(&self) -> Affine {
        Affine::new(&self.features)
    }

    /// Feature names in network order.
    pub fn feature_names(&self) -> Vec<String> {
        self.features.iter().map(|c| c.name.clone()).collect()
    }

    /// The preprocessing from raw columns to the network's inputs (plain numeric columns for
    /// checkpoints without one).
    pub fn input_preprocessing(&self) -> crate::preprocess::Preprocessing {
        self.preprocessing
            .clone()
            .unwrap_or_else(|| crate::preprocess::Preprocessing::plain(&self.feature_names()))
    }

    /// Target names.
    pub fn target_names(&self) -> Vec<String> {
        self.targets.iter().map(|c| c.name.clone()).collect()
    }
}

/// A loaded, verified checkpoint.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The export directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its weights.
    pub weights: HostWeights,
}

/// Resolve a path given by a user: an export directory, or a run directory holding `export/`.
pub fn resolve_dir(dir: &Path) -> PathBuf {
    if !dir.join(MANIFEST_FILE).exists() && dir.join("export").join(MANIFEST_FILE).exists() {
        dir.join("export")
    } else {
        dir.to_path_buf()
    }
}

/// Read and parse `dir/manifest.json`: its path, JSON value and typed manifest.
fn read_manifest_file(dir: &Path) -> Result<(PathBuf, serde_json::Value, Manifest), ArtifactError> {
    let mpath = dir.join(MANIFEST_FILE);
    if !mpath.exists() {
        return Err(ArtifactError::NotACheckpoint {
            dir: dir.to_path_buf(),
        });
    }
    let text = std::fs::read_to_string(&mpath).map_err(|source| ArtifactError::Io {
        path: mpath.clone(),
        source,
    })?;
    let located = |e: serde_json::Error| ArtifactError::Manifest {
        path: mpath.clone(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    };
    let manifest: Manifest = serde_json::from_str(&text).map_err(located)?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(located)?;
    Ok((mpath, value, manifest))
}

/// Every check of a checkpoint but the seal: format, feature/target counts, the weights'
/// SHA-256, tensor names and shapes. Returns the weights.
fn verify_content(
    dir: &Path,
    mpath: &Path,
    manifest: &Manifest,
) -> Result<HostWeights, ArtifactError> {
    let bad_manifest = |message: String| ArtifactError::Manifest {
        path: mpath.to_path_buf(),
        line: 0,
        column: 0,
        message,
    };
    if manifest.format != FORMAT || manifest.format_version != FORMAT_VERSION {
        return Err(bad_manifest(format!(
            "format {:?} version {} is not {FORMAT:?} version {FORMAT_VERSION}",
            manifest.format, manifest.format_version
        )));
    }
    let arch = &manifest.architecture;
    if manifest.features.len() != arch.n_features || manifest.targets.len() != arch.n_targets {
        return Err(bad_manifest(format!(
            "{} features and {} targets listed, but the architecture has {} and {}",
            manifest.features.len(),
            manifest.targets.len(),
            arch.n_features,
            arch.n_targets
        )));
    }
    check_stats(&manifest.features, &manifest.targets).map_err(|message| {
        ArtifactError::NotFinite {
            path: mpath.to_path_buf(),
            message: format!("invalid normalisation: {message}"),
        }
    })?;
    let wpath = dir.join(&manifest.weights.file);
    let bytes = std::fs::read(&wpath).map_err(|source| ArtifactError::Io {
        path: wpath.clone(),
        source,
    })?;
    let actual = sha256_hex(&bytes);
    if actual != manifest.weights.sha256 {
        return Err(ArtifactError::HashMismatch {
            path: wpath,
            expected: manifest.weights.sha256.clone(),
            actual,
        });
    }
    HostWeights::from_safetensors(&bytes, arch, &wpath)
}

/// Read a checkpoint's manifest and verify its seal (not the weights): for readers that need
/// only the manifest's names, normalisation or correlation. An unsealed (older) manifest is
/// accepted with a warning.
pub fn read_manifest(dir: &Path) -> Result<Manifest, ArtifactError> {
    let dir = resolve_dir(dir);
    let (mpath, value, manifest) = read_manifest_file(&dir)?;
    verify_seal(&mpath, &value, &manifest)?;
    Ok(manifest)
}

/// Check the manifest's seal against its content (a warning when it has none).
fn verify_seal(
    mpath: &Path,
    value: &serde_json::Value,
    manifest: &Manifest,
) -> Result<(), ArtifactError> {
    match &manifest.manifest_sha256 {
        Some(expected) => {
            let actual = manifest_digest(value);
            if &actual != expected {
                return Err(ArtifactError::ManifestDigest {
                    path: mpath.to_path_buf(),
                    expected: expected.clone(),
                    actual,
                });
            }
        }
        None => tracing::warn!(
            "{}: the manifest has no seal (written by an older kiln), so an edit to it would go unnoticed; seal it with `kiln checkpoint reseal --checkpoint {}`",
            mpath.display(),
            mpath.parent().unwrap_or(Path::new(".")).display()
        ),
    }
    Ok(())
}

impl Checkpoint {
    /// Load and verify a checkpoint: the manifest's format, the weights' SHA-256, every
    /// tensor's name and shape, then the manifest's seal (so a manifest that disagrees with
    /// its weights is reported as such, and one edited consistently is still refused).
    pub fn load(dir: &Path) -> Result<Self, ArtifactError> {
        let dir = resolve_dir(dir);
        let (mpath, value, manifest) = read_manifest_file(&dir)?;
        let weights = verify_content(&dir, &mpath, &manifest)?;
        verify_seal(&mpath, &value, &manifest)?;
        Ok(Self {
            dir,
            manifest,
            weights,
        })
    }
}

/// Write `manifest` (its weights hash filled in here) and `weights` as a checkpoint at `dest`,
/// atomically: a temporary sibling directory is written, fsynced and renamed to `dest`.
/// `dest` must not exist.
pub fn export(
    dest: &Path,
    mut manifest: Manifest,
    weights: &HostWeights,
) -> Result<Manifest, ArtifactError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ArtifactError::Io { path, source }
    };
    weights
        .check_finite()
        .map_err(|message| ArtifactError::NotFinite {
            path: dest.join(WEIGHTS_FILE),
            message,
        })?;
    check_stats(&manifest.features, &manifest.targets).map_err(|message| {
        ArtifactError::NotFinite {
            path: dest.join(MANIFEST_FILE),
            message: format!("invalid normalisation: {message}"),
        }
    })?;
    let parent = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "export".into());
    remove_stale_temps(parent, &name);
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io(&tmp))?;
    let result = (|| {
        let bytes = weights.to_safetensors();
        manifest.weights = WeightsInfo {
            file: WEIGHTS_FILE.into(),
            sha256: sha256_hex(&bytes),
            dtype: "F32".into(),
        };
        manifest.parameter_count = weights.arch.num_params();
        manifest.architecture = weights.arch.clone();
        util::write_synced(&tmp.join(WEIGHTS_FILE), &bytes)?;
        util::fault::point("during-export");
        seal(&mut manifest);
        let json = serde_json::to_vec_pretty(&manifest).expect("manifest serialises");
        util::write_synced(&tmp.join(MANIFEST_FILE), &json)?;
        util::sync_dir(&tmp)?;
        std::fs::rename(&tmp, dest).map_err(io(dest))?;
        util::sync_dir(parent)?;
        Ok(manifest)
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Remove `.{name}.tmp-<pid>` directories in `parent` left by exports whose process is gone
/// (killed mid-export). A temporary directory of a live process is left alone.
pub fn remove_stale_temps(parent: &Path, name: &str) {
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = file.strip_prefix(&prefix) else {
            continue;
        };
        let stale = match pid.parse::<u32>() {
            Ok(pid) => pid == std::process::id() || !util::process_exists(pid),
            Err(_) => false,
        };
        if stale && let Err(err) = std::fs::remove_dir_all(e.path()) {
            tracing::warn!(
                "cannot remove a stale temporary export {}: {err}",
                e.path().display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    fn tiny_export(dest: &Path) -> Manifest {
        let arch = RegressionNetConfig {
            n_features: 2,
            hidden: vec![3],
            n_targets: 1,
            activation: crate::model::Activation::Relu,
        };
        let w = HostWeights::from_model(&arch.init::<Flex>(3, &Default::default()));
        let col = |name: &str| ColumnStats {
            name: name.into(),
            mean: 0.5,
            std: 2.0,
            transform: Default::default(),
        };
        let manifest = Manifest {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            kiln_version: "0".into(),
            burn_version: "0.21.0".into(),
            created_at: "2026-12-01T00:00:00Z".into(),
            run_id: "r".into(),
            architecture: arch.clone(),
            parameter_count: 0,
            features: vec![col("a"), col("b")],
            targets: vec![col("y")],
            residual_correlation: vec![vec![1.0]],
            metrics: crate::records::metrics::ManifestMetrics {
                other: [
                    (
                        "custom".to_string(),
                        serde_json::json!({"mse": 0.1, "nan": f64::NAN}),
                    ),
                    ("n".to_string(), serde_json::json!(3)),
                ]
                .into(),
                ..Default::default()
            },
            dataset: DatasetInfo {
                path: "d.csv".into(),
                sha256: "00".into(),
                rows: [1, 2, 3],
                split: BTreeMap::new(),
            },
            weights: WeightsInfo {
                file: String::new(),
                sha256: String::new(),
                dtype: String::new(),
            },
            config_sha256: "11".into(),
            latency: None,
            teacher: None,
            calibration: None,
            preprocessing: None,
            drift: None,
            manifest_sha256: None,
        };
        export(dest, manifest, &w).unwrap()
    }

    #[test]
    fn the_seal_covers_every_manifest_value_but_not_its_layout() {
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("export");
        let m = tiny_export(&dest);
        assert!(m.manifest_sha256.is_some());
        assert_eq!(Checkpoint::load(&dest).unwrap().manifest, m);
        let mpath = dest.join(MANIFEST_FILE);
        let original = std::fs::read_to_string(&mpath).unwrap();
        // Compact, keys in another order: the same manifest.
        let v: serde_json::Value = serde_json::from_str(&original).unwrap();
        let mut compact = String::new();
        canonical_json(&v, &mut compact);
        std::fs::write(&mpath, &compact).unwrap();
        Checkpoint::load(&dest).unwrap();
        // Any value changed: refused, naming the file and the way out.
        for edit in ["\"mean\":0.5", "\"n\":3", "\"std\":2.0"] {
            let changed = compact.replacen(edit, &edit.replace(['5', '3', '2'], "4"), 1);
            assert_ne!(changed, compact, "{edit}");
            std::fs::write(&mpath, &changed).unwrap();
            let e = Checkpoint::load(&dest).unwrap_err();
            assert!(matches!(e, ArtifactError::ManifestDigest { .. }), "{e}");
            assert!(e.to_string().contains("kiln checkpoint reseal"), "{e}");
            assert!(read_manifest(&dest).is_err());
        }
        // A deliberate edit, re-sealed, loads with the edit.
        let r = reseal(&dest).unwrap();
        assert_ne!(r.old, Some(r.new.clone()));
        let back = Checkpoint::load(&dest).unwrap().manifest;
        assert_eq!(back.features[0].std, 4.0);
        assert_eq!(reseal(&dest).unwrap().old, Some(r.new), "idempotent");
        // No seal (an older kiln's manifest): loads.
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&mpath).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove(SEAL_KEY);
        std::fs::write(&mpath, serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(
            Checkpoint::load(&dest).unwrap().manifest.manifest_sha256,
            None
        );
        // write_manifest seals what it writes.
        let mut m = back;
        m.latency = Some(crate::records::metrics::LatencyReport {
            engine: "fused".into(),
            cpu: None,
            batches: Vec::new(),
        });
        write_manifest(&dest, &mut m).unwrap();
        assert_eq!(Checkpoint::load(&dest).unwrap().manifest, m);
    }

    #[test]
    fn an_export_removes_temporaries_of_dead_exporters_only() {
        let d = tempfile::tempdir().unwrap();
        let dead = d.path().join(format!(".export.tmp-{}", u32::MAX));
        let live = d.path().join(".export.tmp-1");
        let other = d.path().join(".other.tmp-7");
        for p in [&dead, &live, &other] {
            std::fs::create_dir(p).unwrap();
            std::fs::write(p.join(WEIGHTS_FILE), b"partial").unwrap();
        }
        tiny_export(&d.path().join("export"));
        assert!(!dead.exists(), "a killed export's temporary is removed");
        assert!(live.exists() && other.exists());
    }

    #[test]
    fn backbone_layers_are_numbered_as_nn_sequential_and_old_files_still_load() {
        let arch = RegressionNetConfig {
            n_features: 3,
            hidden: vec![4, 5, 6],
            n_targets: 2,
            activation: crate::model::Activation::Tanh,
        };
        let w = HostWeights::from_model(&arch.init::<Flex>(9, &Default::default()));
        let bytes = w.to_safetensors();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names = st.names();
        names.sort();
        assert_eq!(
            names,
            [
                "backbone.0.bias",
                "backbone.0.weight",
                "backbone.2.bias",
                "backbone.2.weight",
                "backbone.4.bias",
                "backbone.4.weight",
                "logvar_head.bias",
                "logvar_head.weight",
                "mean_head.bias",
                "mean_head.weight",
            ]
        );
        assert_eq!(st.tensor("backbone.2.weight").unwrap().shape(), &[5, 4]);
        assert_eq!(st.tensor("backbone.4.weight").unwrap().shape(), &[6, 5]);
        assert_eq!(st.tensor("mean_head.weight").unwrap().shape(), &[2, 6]);
        // An older kiln's file numbers the backbone 0, 1, 2: it loads to the same weights.
        let old: BTreeMap<String, HostTensor> = w
            .to_tensors()
            .into_iter()
            .map(|(k, t)| {
                let k = match k.strip_prefix("backbone.") {
                    Some(rest) => {
                        let (i, tail) = rest.split_once('.').unwrap();
                        format!("backbone.{}.{tail}", i.parse::<usize>().unwrap() / 2)
                    }
                    None => k,
                };
                (k, t)
            })
            .collect();
        assert!(old.contains_key("backbone.1.weight"));
        let old_bytes = tensors_to_safetensors(&old);
        let back = HostWeights::from_safetensors(&old_bytes, &arch, Path::new("m")).unwrap();
        assert_eq!(back, w);
        // … and so does an older checkpoint on disk (its manifest hashes the old file).
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("export");
        let mut m = tiny_export(&dest);
        m.architecture = arch.clone();
        m.features.push(m.features[0].clone());
        m.targets.push(m.targets[0].clone());
        m.weights.sha256 = sha256_hex(&old_bytes);
        std::fs::write(dest.join(WEIGHTS_FILE), &old_bytes).unwrap();
        write_manifest(&dest, &mut m).unwrap();
        let ckpt = Checkpoint::load(&dest).unwrap();
        assert_eq!(ckpt.weights, w);
        // A file that fits neither numbering names what is missing and what is extra.
        let mut odd = w.to_tensors();
        let t = odd.remove("backbone.4.bias").unwrap();
        odd.insert("backbone.5.bias".into(), t);
        let e = HostWeights::from_safetensors(&tensors_to_safetensors(&odd), &arch, Path::new("m"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("missing tensor `backbone.4.bias` with shape [6]")
                && e.contains("unexpected tensor `backbone.5.bias`"),
            "{e}"
        );
    }

    #[test]
    fn safetensors_round_trip_uses_pytorch_layout() {
        let arch = RegressionNetConfig {
            n_features: 3,
            hidden: vec![4],
            n_targets: 2,
            activation: crate::model::Activation::Relu,
        };
        let net = arch.init::<Flex>(5, &Default::default());
        let w = HostWeights::from_model(&net);
        let bytes = w.to_safetensors();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("backbone.0.weight").unwrap().shape(), &[4, 3]);
        assert_eq!(st.tensor("mean_head.bias").unwrap().shape(), &[2]);
        let back = HostWeights::from_safetensors(&bytes, &arch, Path::new("m")).unwrap();
        assert_eq!(back, w);
        let wrong = RegressionNetConfig {
            hidden: vec![5],
            ..arch.clone()
        };
        let e = HostWeights::from_safetensors(&bytes, &wrong, Path::new("m")).unwrap_err();
        assert!(
            e.to_string()
                .contains("backbone.0.weight` has shape [4, 3], expected [5, 3]"),
            "{e}"
        );
        let deeper = RegressionNetConfig {
            hidden: vec![4, 4],
            ..arch
        };
        let e = HostWeights::from_safetensors(&bytes, &deeper, Path::new("m")).unwrap_err();
        assert!(e.to_string().contains("architecture mismatch"), "{e}");
    }
}
