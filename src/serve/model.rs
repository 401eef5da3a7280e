//! What a served model is: its input and output tensors, how a request's tensors decode into
//! a batchable input, and the per-instance executors that run batches.
//!
//! Two kinds live in a repository:
//! * **regression** — a version directory holding an exported checkpoint
//!   (`manifest.json` + `model.safetensors`). One FP32 input `features` `[B, F]` (the
//!   manifest's features in order, original units) → FP32 `mean` and `std` `[B, k]` in
//!   original units, computed by [`Predictor`] exactly as `kiln predict` does.
//! * **pick** — a version directory holding `pick.json` ([`PickConfig`]). B picks of L legs
//!   → FP64 `p` (P(all legs hit)), `se` (its standard error) and `independent_p`, each `[B]`,
//!   computed by [`pick_probabilities`]. With `"legs_from": "moments"` (the default) the legs
//!   carry their outcome's distribution: FP64 `mean`, `std`, `line`, BOOL `over`, INT32
//!   `target`, INT32 `group`, each `[B, L]`. With `"legs_from": "features"` they carry a row
//!   of features instead, as `kiln pick` does: FP32 `features` `[B, L, F]`, INT32 `target`,
//!   FP64 `line`, BOOL `over` `[B, L]`; the checkpoint's network predicts mean and std, and
//!   legs of a pick with identical feature rows correlate through the residual correlation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::protocol::{Datatype, InputTensor, OutputData, OutputTensor, ProtocolError};
use crate::artifact::{ArtifactError, Checkpoint, MANIFEST_FILE, Manifest};
use crate::infer::{InferError, build_engine};
use crate::model::mvn::{
    HaltonMvnCdf, HaltonMvnCdfConfig, Leg, MvnMethod, PickCorrelation, Side, pick_probabilities,
    pick_query,
};
use crate::predict::{Prediction, Predictor};

/// The file that makes a version directory a pick model.
pub const PICK_FILE: &str = "pick.json";
/// The regression model's input name.
pub const FEATURES_INPUT: &str = "features";

/// Why a version could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The checkpoint is missing, corrupt, or does not match its manifest.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// The engine could not be built.
    #[error(transparent)]
    Engine(#[from] InferError),
    /// The pick model's config is invalid.
    #[error("{path}: {message}")]
    Pick {
        /// The config file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// Warm-up failed.
    #[error("warm-up failed: {0}")]
    Warmup(String),
    /// Reading the directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// A tensor in a model's metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Its name.
    pub name: String,
    /// Its datatype.
    pub datatype: Datatype,
    /// Its shape, -1 for the batch dimension (and any variable dimension).
    pub shape: Vec<i64>,
    /// Extra description (scalars only, as the protocol's parameters allow).
    pub parameters: serde_json::Map<String, Value>,
}

impl TensorSpec {
    fn new(name: &str, datatype: Datatype, shape: &[i64]) -> Self {
        Self {
            name: name.into(),
            datatype,
            shape: shape.to_vec(),
            parameters: Default::default(),
        }
    }

    /// OIP metadata JSON.
    pub fn metadata(&self) -> Value {
        let mut v =
            json!({"name": self.name, "datatype": self.datatype.name(), "shape": self.shape});
        if !self.parameters.is_empty() {
            v["parameters"] = Value::Object(self.parameters.clone());
        }
        v
    }

    /// Triton model-configuration JSON (dims without the batch dimension).
    pub fn config(&self) -> Value {
        json!({"name": self.name, "data_type": self.datatype.config_name(), "dims": &self.shape[1..]})
    }
}

/// The pick model's configuration (`pick.json` in a version directory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PickConfig {
    /// Must be `"pick"`.
    pub kind: String,
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
    /// `genz` or `naive`.
    #[serde(default = "default_method")]
    pub method: String,
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
fn default_method() -> String {
    "genz".into()
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
        if cfg.kind != "pick" {
            return Err(bad(format!("`kind` is {:?}; expected \"pick\"", cfg.kind)));
        }
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
            (None, Some(dir)) => {
                let m = dir.join(MANIFEST_FILE);
                let text = std::fs::read_to_string(&m)
                    .map_err(|e| bad(format!("checkpoint {}: {e}", m.display())))?;
                Some(
                    serde_json::from_str(&text)
                        .map_err(|e| bad(format!("checkpoint {}: {e}", m.display())))?,
                )
            }
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
        let method: MvnMethod = cfg.method.parse().map_err(bad)?;
        let estimator = HaltonMvnCdfConfig::new()
            .with_points(cfg.points)
            .with_randomizations(cfg.randomizations)
            .with_method(method)
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

/// What a loaded version serves.
#[derive(Debug, Clone)]
pub enum ModelKind {
    /// A regression checkpoint.
    Regression(Arc<Checkpoint>),
    /// A pick model.
    Pick(Arc<PickModel>),
}

/// A model version's interface and contents, shared by the HTTP layer and the instances.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// What it serves.
    pub kind: ModelKind,
    /// Inputs in order.
    pub inputs: Vec<TensorSpec>,
    /// Outputs in order.
    pub outputs: Vec<TensorSpec>,
}

/// A request's decoded input: batchable rows.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelInput {
    /// Raw feature rows, `rows × F`.
    Regression {
        /// The values.
        x: Vec<f32>,
        /// Rows.
        rows: usize,
    },
    /// Picks.
    Pick(Vec<Vec<Leg>>),
    /// Picks whose legs carry feature rows.
    PickRows {
        /// Raw features, `picks × legs × F`.
        x: Vec<f32>,
        /// Target per leg.
        target: Vec<usize>,
        /// Line per leg.
        line: Vec<f64>,
        /// Side per leg.
        over: Vec<bool>,
        /// Picks.
        picks: usize,
        /// Legs per pick.
        legs: usize,
    },
}

impl ModelInput {
    /// Batch rows this input contributes.
    pub fn rows(&self) -> usize {
        match self {
            ModelInput::Regression { rows, .. } => *rows,
            ModelInput::Pick(p) => p.len(),
            ModelInput::PickRows { picks, .. } => *picks,
        }
    }
}

/// Detect the kind of a version directory and load it.
pub fn load_spec(dir: &Path) -> Result<ModelSpec, LoadError> {
    if dir.join(PICK_FILE).exists() {
        let pick = PickConfig::load(dir)?;
        Ok(ModelSpec::pick(Arc::new(pick)))
    } else {
        let ckpt = Checkpoint::load(dir)?;
        Ok(ModelSpec::regression(Arc::new(ckpt)))
    }
}

const PICK_FLOAT_INPUTS: [&str; 3] = ["mean", "std", "line"];

impl ModelSpec {
    /// The regression model of a checkpoint.
    pub fn regression(ckpt: Arc<Checkpoint>) -> Self {
        let f = ckpt.manifest.features.len() as i64;
        let k = ckpt.manifest.targets.len() as i64;
        let mut input = TensorSpec::new(FEATURES_INPUT, Datatype::Fp32, &[-1, f]);
        input.parameters.insert(
            "feature_names".into(),
            Value::String(ckpt.manifest.feature_names().join(",")),
        );
        let mut mean = TensorSpec::new("mean", Datatype::Fp32, &[-1, k]);
        let mut std = TensorSpec::new("std", Datatype::Fp32, &[-1, k]);
        let targets = Value::String(ckpt.manifest.target_names().join(","));
        mean.parameters
            .insert("target_names".into(), targets.clone());
        std.parameters.insert("target_names".into(), targets);
        Self {
            kind: ModelKind::Regression(ckpt),
            inputs: vec![input],
            outputs: vec![mean, std],
        }
    }

    /// The pick model.
    pub fn pick(pick: Arc<PickModel>) -> Self {
        let outputs = ["p", "se", "independent_p"]
            .iter()
            .map(|n| TensorSpec::new(n, Datatype::Fp64, &[-1]))
            .collect();
        if let Some(net) = &pick.network {
            let f = net.manifest.features.len() as i64;
            let mut features = TensorSpec::new(FEATURES_INPUT, Datatype::Fp32, &[-1, -1, f]);
            features.parameters.insert(
                "feature_names".into(),
                Value::String(net.manifest.feature_names().join(",")),
            );
            let mut target = TensorSpec::new("target", Datatype::I32, &[-1, -1]);
            target
                .parameters
                .insert("target_names".into(), Value::String(pick.targets.join(",")));
            return Self {
                kind: ModelKind::Pick(pick),
                inputs: vec![
                    features,
                    target,
                    TensorSpec::new("line", Datatype::Fp64, &[-1, -1]),
                    TensorSpec::new("over", Datatype::Bool, &[-1, -1]),
                ],
                outputs,
            };
        }
        let mut inputs: Vec<TensorSpec> = PICK_FLOAT_INPUTS
            .iter()
            .map(|n| TensorSpec::new(n, Datatype::Fp64, &[-1, -1]))
            .collect();
        inputs.push(TensorSpec::new("over", Datatype::Bool, &[-1, -1]));
        let mut target = TensorSpec::new("target", Datatype::I32, &[-1, -1]);
        target
            .parameters
            .insert("target_names".into(), Value::String(pick.targets.join(",")));
        inputs.push(target);
        inputs.push(TensorSpec::new("group", Datatype::I32, &[-1, -1]));
        Self {
            kind: ModelKind::Pick(pick),
            inputs,
            outputs,
        }
    }

    /// The platform string in metadata.
    pub fn platform(&self) -> &'static str {
        match self.kind {
            ModelKind::Regression(_) => "kiln_regression",
            ModelKind::Pick(_) => "kiln_pick",
        }
    }

    /// Extra model-configuration fields (feature names and normalisation, targets, …).
    pub fn describe(&self) -> Value {
        match &self.kind {
            ModelKind::Regression(c) => json!({
                "features": c.manifest.features,
                "targets": c.manifest.targets,
                "architecture": c.manifest.architecture,
                "weights_sha256": c.manifest.weights.sha256,
                "run_id": c.manifest.run_id,
            }),
            ModelKind::Pick(p) => json!({
                "targets": p.targets,
                "target_corr": p.corr.target_corr,
                "cross_row_corr": p.corr.cross_row_corr,
                "points": p.estimator.points,
                "randomizations": p.estimator.randomizations,
                "method": p.estimator.method.name(),
                "max_legs": p.estimator.max_dim,
                "legs_from": if p.network.is_some() { "features" } else { "moments" },
                "features": p.network.as_ref().map(|n| &n.manifest.features),
            }),
        }
    }

    fn take<'a>(
        &self,
        inputs: &'a [InputTensor],
        model: &str,
    ) -> Result<Vec<&'a InputTensor>, ProtocolError> {
        let names = || {
            self.inputs
                .iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        for i in inputs {
            if !self.inputs.iter().any(|s| s.name == i.name) {
                return Err(ProtocolError(format!(
                    "unknown input `{}`; model `{model}` takes: {}",
                    i.name,
                    names()
                )));
            }
        }
        self.inputs
            .iter()
            .map(|s| {
                inputs.iter().find(|i| i.name == s.name).ok_or_else(|| {
                    ProtocolError(format!(
                        "missing input `{}`; model `{model}` takes: {}",
                        s.name,
                        names()
                    ))
                })
            })
            .collect()
    }

    /// Check a request's inputs against this model and decode them.
    pub fn decode(
        &self,
        inputs: &[InputTensor],
        model: &str,
        max_batch: usize,
    ) -> Result<ModelInput, ProtocolError> {
        let given = self.take(inputs, model)?;
        let check_batch = |name: &str, b: usize| {
            if b == 0 {
                Err(ProtocolError(format!(
                    "input `{name}` has batch size 0; expected at least one row"
                )))
            } else if b > max_batch {
                Err(ProtocolError(format!(
                    "input `{name}` has batch size {b}, more than the max_batch_size {max_batch}; split the request"
                )))
            } else {
                Ok(())
            }
        };
        match &self.kind {
            ModelKind::Regression(c) => {
                let t = given[0];
                let f = c.manifest.features.len();
                if t.datatype != Datatype::Fp32 {
                    return Err(ProtocolError(format!(
                        "input `{}` has datatype {}; expected FP32",
                        t.name, t.datatype
                    )));
                }
                if t.shape.len() != 2 || t.shape[1] != f {
                    return Err(ProtocolError(format!(
                        "input `{}` has shape {:?}; expected [-1, {f}] (rows × the {f} features {})",
                        t.name,
                        t.shape,
                        c.manifest.feature_names().join(", ")
                    )));
                }
                check_batch(&t.name, t.shape[0])?;
                Ok(ModelInput::Regression {
                    x: t.to_f32()?,
                    rows: t.shape[0],
                })
            }
            ModelKind::Pick(p) if p.network.is_some() => {
                let f = p.network.as_ref().expect("guarded").manifest.features.len();
                let (feat, rest) = (given[0], &given[1..]);
                if feat.shape.len() != 3 || feat.shape[2] != f {
                    return Err(ProtocolError(format!(
                        "input `{}` has shape {:?}; expected [picks, legs, {f}] (a row of the {f} features per leg)",
                        feat.name, feat.shape
                    )));
                }
                let (b, l) = (feat.shape[0], feat.shape[1]);
                for t in rest {
                    if t.shape != [b, l] {
                        return Err(ProtocolError(format!(
                            "input `{}` has shape {:?}; expected [{b}, {l}] (picks × legs, as `{}`)",
                            t.name, t.shape, feat.name
                        )));
                    }
                }
                check_batch(&feat.name, b)?;
                if l == 0 || l > p.estimator.max_dim {
                    return Err(ProtocolError(format!(
                        "picks have {l} legs; expected 1 to {} legs",
                        p.estimator.max_dim
                    )));
                }
                let target = rest[0].to_i32()?;
                let k = p.corr.targets;
                if let Some(j) = target.iter().position(|&t| t < 0 || t as usize >= k) {
                    return Err(ProtocolError(format!(
                        "pick {} leg {}: target is {}; expected an index from 0 to {}",
                        j / l,
                        j % l,
                        target[j],
                        k - 1
                    )));
                }
                Ok(ModelInput::PickRows {
                    x: feat.to_f32()?,
                    target: target.into_iter().map(|t| t as usize).collect(),
                    line: rest[1].to_f64()?,
                    over: rest[2].to_bool()?,
                    picks: b,
                    legs: l,
                })
            }
            ModelKind::Pick(p) => {
                let shape = &given[0].shape;
                for t in &given {
                    if t.shape.len() != 2 || t.shape != *shape {
                        return Err(ProtocolError(format!(
                            "input `{}` has shape {:?}; expected [picks, legs], the same for every input ({:?} for `{}`)",
                            t.name, t.shape, shape, given[0].name
                        )));
                    }
                }
                let (b, l) = (shape[0], shape[1]);
                check_batch(&given[0].name, b)?;
                if l == 0 || l > p.estimator.max_dim {
                    return Err(ProtocolError(format!(
                        "picks have {l} legs; expected 1 to {} legs",
                        p.estimator.max_dim
                    )));
                }
                let mean = given[0].to_f64()?;
                let std = given[1].to_f64()?;
                let line = given[2].to_f64()?;
                let over = given[3].to_bool()?;
                let target = given[4].to_i32()?;
                let group = given[5].to_i32()?;
                if let Some(j) = target.iter().position(|&t| t < 0) {
                    return Err(ProtocolError(format!(
                        "pick {} leg {}: target is {}; expected an index from 0 to {}",
                        j / l,
                        j % l,
                        target[j],
                        p.corr.targets - 1
                    )));
                }
                let mut picks = Vec::with_capacity(b);
                for i in 0..b {
                    let legs: Vec<Leg> = (i * l..(i + 1) * l)
                        .map(|j| Leg {
                            group: group[j].to_string(),
                            target: target[j] as usize,
                            mean: mean[j],
                            std: std[j],
                            line: line[j],
                            side: if over[j] { Side::Over } else { Side::Under },
                        })
                        .collect();
                    pick_query(&legs, &p.corr)
                        .map_err(|e| ProtocolError(format!("pick {i}: {e}")))?;
                    picks.push(legs);
                }
                Ok(ModelInput::Pick(picks))
            }
        }
    }
}

/// Runs batches on one inference instance (owned by one worker thread).
pub trait Instance: Send {
    /// Run one batch of `rows` placeholder rows, before the model is marked ready.
    fn warm_up(&mut self, rows: usize) -> Result<(), String>;
    /// Run a batch of inputs; one output list per input, in order.
    fn execute(&mut self, inputs: &[&ModelInput]) -> Result<Vec<Vec<OutputTensor>>, String>;
}

/// Build one instance of a model; a regression engine also runs its own warm-up over
/// `buckets` (kernels compiled, buffers sized) before the instance is returned.
pub fn build_instance(
    spec: &ModelSpec,
    engine: &str,
    threads: usize,
    buckets: &[usize],
) -> Result<Box<dyn Instance>, LoadError> {
    match &spec.kind {
        ModelKind::Regression(c) => {
            let mut e = build_engine(engine, &c.weights, threads)?;
            e.warm_up(buckets)?;
            let pad = e.name().starts_with("cuda");
            Ok(Box::new(RegressionInstance {
                predictor: Predictor::new(e, &c.manifest.features, &c.manifest.targets),
                placeholder: c.manifest.features.iter().map(|s| s.mean as f32).collect(),
                k: c.manifest.targets.len(),
                pad_to_bucket: pad,
                x: Vec::new(),
                out: Prediction {
                    mean: Vec::new(),
                    std: Vec::new(),
                },
            }))
        }
        ModelKind::Pick(p) => {
            let device = Default::default();
            let mvn = p
                .estimator
                .init::<crate::backend::Cpu>(&device)
                .map_err(|e| LoadError::Warmup(e.to_string()))?;
            let predictor = match &p.network {
                None => None,
                Some(c) => {
                    let mut e = build_engine(engine, &c.weights, threads)?;
                    e.warm_up(buckets)?;
                    Some(Predictor::new(e, &c.manifest.features, &c.manifest.targets))
                }
            };
            Ok(Box::new(PickInstance {
                model: p.clone(),
                mvn,
                predictor,
            }))
        }
    }
}

/// Batch-size buckets warmed at load: powers of two below `max_batch`, and `max_batch`.
pub fn buckets(max_batch: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut b = 1;
    while b < max_batch {
        v.push(b);
        b *= 2;
    }
    v.push(max_batch.max(1));
    v
}

struct RegressionInstance {
    predictor: Predictor,
    placeholder: Vec<f32>,
    k: usize,
    /// Shape-specialised engines (CUDA) see only warmed bucket sizes.
    pad_to_bucket: bool,
    x: Vec<f32>,
    out: Prediction,
}

impl Instance for RegressionInstance {
    fn warm_up(&mut self, rows: usize) -> Result<(), String> {
        let x: Vec<f32> = self
            .placeholder
            .iter()
            .copied()
            .cycle()
            .take(rows * self.placeholder.len())
            .collect();
        self.predictor
            .predict_into(&x, rows, &mut self.out)
            .map_err(|e| e.to_string())?;
        let bad = self
            .out
            .mean
            .iter()
            .chain(&self.out.std)
            .filter(|v| !v.is_finite())
            .count();
        if bad > 0 {
            return Err(format!(
                "{bad} non-finite outputs for {rows} rows at the training means"
            ));
        }
        Ok(())
    }

    fn execute(&mut self, inputs: &[&ModelInput]) -> Result<Vec<Vec<OutputTensor>>, String> {
        self.x.clear();
        let mut rows = 0;
        for i in inputs {
            match i {
                ModelInput::Regression { x, rows: r } => {
                    self.x.extend_from_slice(x);
                    rows += r;
                }
                ModelInput::Pick(_) | ModelInput::PickRows { .. } => {
                    return Err("a pick input reached a regression model".into());
                }
            }
        }
        let real = rows;
        if self.pad_to_bucket {
            let b = rows.next_power_of_two();
            for _ in rows..b {
                self.x.extend_from_slice(&self.placeholder);
            }
            rows = b;
        }
        self.predictor
            .predict_into(&self.x, rows, &mut self.out)
            .map_err(|e| e.to_string())?;
        let k = self.k;
        let _ = real;
        let mut start = 0;
        Ok(inputs
            .iter()
            .map(|i| {
                let r = i.rows();
                let span = start * k..(start + r) * k;
                start += r;
                vec![
                    OutputTensor {
                        name: "mean".into(),
                        shape: vec![r, k],
                        data: OutputData::F32(self.out.mean[span.clone()].to_vec()),
                    },
                    OutputTensor {
                        name: "std".into(),
                        shape: vec![r, k],
                        data: OutputData::F32(self.out.std[span].to_vec()),
                    },
                ]
            })
            .collect())
    }
}

struct PickInstance {
    model: Arc<PickModel>,
    mvn: HaltonMvnCdf<crate::backend::Cpu>,
    predictor: Option<Predictor>,
}

impl PickInstance {
    /// Legs of feature-row picks: one forward pass for every leg of the batch.
    fn legs_from_rows(&mut self, inputs: &[&ModelInput]) -> Result<Vec<Vec<Leg>>, String> {
        let Some(pred) = self.predictor.as_mut() else {
            return Err("feature rows reached a pick model without a network".into());
        };
        let f = pred.n_features();
        let k = pred.n_targets();
        let mut x = Vec::new();
        let mut n = 0;
        for i in inputs {
            if let ModelInput::PickRows {
                x: xi, picks, legs, ..
            } = i
            {
                x.extend_from_slice(xi);
                n += picks * legs;
            }
        }
        let out = pred.predict(&x, n).map_err(|e| e.to_string())?;
        let mut all = Vec::new();
        let mut row = 0;
        for i in inputs {
            if let ModelInput::PickRows {
                x: xi,
                target,
                line,
                over,
                picks,
                legs,
            } = i
            {
                for p in 0..*picks {
                    let legs: Vec<Leg> = (0..*legs)
                        .map(|j| {
                            let li = p * legs + j;
                            let r = &xi[li * f..(li + 1) * f];
                            // Legs on the same row of features share a group.
                            let g = (0..j)
                                .find(|&m| xi[(p * legs + m) * f..(p * legs + m + 1) * f] == *r)
                                .unwrap_or(j);
                            let o = (row + li) * k + target[li];
                            Leg {
                                group: g.to_string(),
                                target: target[li],
                                mean: out.mean[o] as f64,
                                std: out.std[o] as f64,
                                line: line[li],
                                side: if over[li] { Side::Over } else { Side::Under },
                            }
                        })
                        .collect();
                    all.push(legs);
                }
                row += picks * legs;
            }
        }
        Ok(all)
    }
}

impl Instance for PickInstance {
    fn warm_up(&mut self, rows: usize) -> Result<(), String> {
        let k = self.model.corr.targets;
        let input = match &self.model.network {
            Some(net) => {
                let row: Vec<f32> = net
                    .manifest
                    .features
                    .iter()
                    .map(|c| c.mean as f32)
                    .collect();
                ModelInput::PickRows {
                    x: row.repeat(2 * rows),
                    target: (0..2 * rows).map(|j| j % k).collect(),
                    line: vec![0.0; 2 * rows],
                    over: vec![true; 2 * rows],
                    picks: rows,
                    legs: 2,
                }
            }
            None => {
                let legs: Vec<Leg> = (0..2)
                    .map(|t| Leg {
                        group: "0".into(),
                        target: t % k,
                        mean: 0.0,
                        std: 1.0,
                        line: 0.0,
                        side: Side::Over,
                    })
                    .collect();
                ModelInput::Pick(vec![legs; rows])
            }
        };
        let out = self.execute(&[&input])?;
        let finite = out[0].iter().all(|t| match &t.data {
            OutputData::F64(v) => v.iter().all(|x| x.is_finite()),
            OutputData::F32(v) => v.iter().all(|x| x.is_finite()),
        });
        if !finite {
            return Err("non-finite warm-up probability".into());
        }
        Ok(())
    }

    fn execute(&mut self, inputs: &[&ModelInput]) -> Result<Vec<Vec<OutputTensor>>, String> {
        let from_rows = if inputs
            .iter()
            .any(|i| matches!(i, ModelInput::PickRows { .. }))
        {
            self.legs_from_rows(inputs)?
        } else {
            Vec::new()
        };
        let mut from_rows = from_rows.iter();
        let mut picks: Vec<&[Leg]> = Vec::new();
        for i in inputs {
            match i {
                ModelInput::Pick(p) => picks.extend(p.iter().map(|l| l.as_slice())),
                ModelInput::PickRows { picks: n, .. } => {
                    picks.extend(from_rows.by_ref().take(*n).map(|l| l.as_slice()))
                }
                ModelInput::Regression { .. } => {
                    return Err("a regression input reached a pick model".into());
                }
            }
        }
        let results =
            pick_probabilities(&self.mvn, &picks, &self.model.corr).map_err(|e| e.to_string())?;
        let mut it = results.into_iter();
        Ok(inputs
            .iter()
            .map(|i| {
                let r: Vec<_> = it.by_ref().take(i.rows()).collect();
                let col = |f: fn(&crate::model::mvn::PickResult) -> f64| {
                    OutputData::F64(r.iter().map(f).collect())
                };
                vec![
                    OutputTensor {
                        name: "p".into(),
                        shape: vec![r.len()],
                        data: col(|x| x.p),
                    },
                    OutputTensor {
                        name: "se".into(),
                        shape: vec![r.len()],
                        data: col(|x| x.se),
                    },
                    OutputTensor {
                        name: "independent_p".into(),
                        shape: vec![r.len()],
                        data: col(|x| x.independent_p),
                    },
                ]
            })
            .collect())
    }
}
