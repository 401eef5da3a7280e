//! ONNX export of a checkpoint: one self-contained graph that answers like `kiln predict`.
//!
//! ```text
//! features [batch, F] (original units)
//!   ─► Sub(feature mean) ─► Mul(1 / feature std)          the manifest's normalisation, f32
//!   ─► Gemm(backbone.i, transB) ─► activation  (× hidden)  ReLU | GELU (erf) | Tanh | SiLU
//!   ├► Gemm(mean_head)   ─► Cast f64 ─► Mul(target std) ─► Add(target mean) ─► Cast f32 ─► mean [batch, k]
//!   └► Gemm(logvar_head) ─► Cast f64 ─► Mul(½) ─► Exp ─► Mul(target std)   ─► Cast f32 ─► std  [batch, k]
//! ```
//!
//! The input and outputs carry the names of the Open Inference Protocol metadata of
//! `kiln serve` (`features`, `mean`, `std`); the batch dimension is symbolic (`batch`). The
//! normalisation is the f32 `(x − mean) · (1 / std)` of [`crate::data::dataset::Affine`] and
//! the de-normalisation runs in f64 like [`crate::predict::Predictor`]'s, so the graph differs
//! from `kiln predict` only by the order of the matrix products' sums. GELU is the exact (erf)
//! form that Burn and kiln's engines compute, written with `Erf` (opset 17 has no `Gelu`);
//! SiLU is `x · Sigmoid(x)`. Weights are stored in PyTorch's `[out, in]` layout under the
//! checkpoint's tensor names and applied with `Gemm(transB = 1)`, as PyTorch's exporter does.
//!
//! The file is opset 17 (IR version 8), which every ONNX Runtime from 1.12 on loads. Its
//! metadata properties: `kiln_version` (the exporter), `checkpoint_kiln_version`, `run_id`,
//! `features` and `targets` (JSON arrays of names, in network order), `weights_sha256` and,
//! for a sealed manifest, `manifest_sha256`.
//!
//! The messages are declared here with `prost` for the subset of `onnx.proto3` that kiln
//! writes ([`proto`]; field numbers from the ONNX specification), so there is no `protoc`
//! and no build script; the bytes are prost's encoding of those messages.

use std::path::{Path, PathBuf};

use prost::Message as _;

use crate::artifact::{ArtifactError, Checkpoint, HostLinear};
use crate::config::Activation;
use crate::data::preprocess::Preprocessing;

/// The ONNX operator set version the graph uses (default domain).
pub const OPSET_VERSION: i64 = 17;
/// The ONNX IR version written (IR 8 = ONNX 1.12+, the first to know opset 17).
pub const IR_VERSION: i64 = 8;
/// The input: `[batch, F]` f32 features in original units.
pub const FEATURES_INPUT: &str = "features";
/// The first output: `[batch, k]` f32 predicted means in original units.
pub const MEAN_OUTPUT: &str = "mean";
/// The second output: `[batch, k]` f32 predicted standard deviations in original units.
pub const STD_OUTPUT: &str = "std";
/// The symbolic batch dimension.
pub const BATCH_DIM: &str = "batch";

/// `TensorProto.DataType.FLOAT`.
const FLOAT: i32 = 1;
/// `TensorProto.DataType.DOUBLE`.
const DOUBLE: i32 = 11;
/// `AttributeProto.AttributeType.INT`.
const ATTR_INT: i32 = 2;
/// `AttributeProto.AttributeType.INTS`.
const ATTR_INTS: i32 = 7;
/// `AttributeProto.AttributeType.STRINGS`.
const ATTR_STRINGS: i32 = 8;
/// `TensorProto.DataType.INT64`.
const INT64: i32 = 7;
/// `TensorProto.DataType.STRING`.
const STRING: i32 = 8;
/// The traditional-ML operator domain (`LabelEncoder`), for categorical inputs.
pub const ML_DOMAIN: &str = "ai.onnx.ml";
/// Its operator set version (`LabelEncoder`-2: `keys_strings` → `values_int64s`).
pub const ML_OPSET_VERSION: i64 = 2;
/// The texts kiln reads as a missing cell ([`crate::data::table::is_missing`]: empty, `NaN`,
/// `NA`, `null` in any case), spelled out for an exact-match `LabelEncoder`: "" and every
/// upper/lower-case spelling of the three words (the graph does not trim blanks).
fn missing_tokens() -> Vec<String> {
    let mut out = vec![String::new()];
    for word in ["nan", "na", "null"] {
        let n = word.len();
        for mask in 0..(1u32 << n) {
            out.push(
                word.chars()
                    .enumerate()
                    .map(|(i, c)| {
                        if mask & (1 << i) != 0 {
                            c.to_ascii_uppercase()
                        } else {
                            c
                        }
                    })
                    .collect(),
            );
        }
    }
    out
}

/// The subset of `onnx.proto3` kiln writes, as prost messages (field numbers from the ONNX
/// specification). A proto3 `oneof` is declared as optional fields with the same numbers,
/// which is the same encoding.
pub mod proto {
    /// `onnx.ModelProto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ModelProto {
        /// The IR version.
        #[prost(int64, tag = "1")]
        pub ir_version: i64,
        /// Operator sets the graph uses.
        #[prost(message, repeated, tag = "8")]
        pub opset_import: Vec<OperatorSetIdProto>,
        /// The producing tool.
        #[prost(string, tag = "2")]
        pub producer_name: String,
        /// Its version.
        #[prost(string, tag = "3")]
        pub producer_version: String,
        /// Reverse-DNS domain of the model.
        #[prost(string, tag = "4")]
        pub domain: String,
        /// The model's version.
        #[prost(int64, tag = "5")]
        pub model_version: i64,
        /// Free text.
        #[prost(string, tag = "6")]
        pub doc_string: String,
        /// The graph.
        #[prost(message, optional, tag = "7")]
        pub graph: Option<GraphProto>,
        /// Named metadata.
        #[prost(message, repeated, tag = "14")]
        pub metadata_props: Vec<StringStringEntryProto>,
    }

    /// `onnx.OperatorSetIdProto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct OperatorSetIdProto {
        /// The domain (empty = `ai.onnx`).
        #[prost(string, tag = "1")]
        pub domain: String,
        /// The operator set version.
        #[prost(int64, tag = "2")]
        pub version: i64,
    }

    /// `onnx.StringStringEntryProto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StringStringEntryProto {
        /// Key.
        #[prost(string, tag = "1")]
        pub key: String,
        /// Value.
        #[prost(string, tag = "2")]
        pub value: String,
    }

    /// `onnx.GraphProto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GraphProto {
        /// Nodes in topological order.
        #[prost(message, repeated, tag = "1")]
        pub node: Vec<NodeProto>,
        /// The graph's name.
        #[prost(string, tag = "2")]
        pub name: String,
        /// Constant tensors (weights, normalisation).
        #[prost(message, repeated, tag = "5")]
        pub initializer: Vec<TensorProto>,
        /// Free text.
        #[prost(string, tag = "10")]
        pub doc_string: String,
        /// Inputs.
        #[prost(message, repeated, tag = "11")]
        pub input: Vec<ValueInfoProto>,
        /// Outputs.
        #[prost(message, repeated, tag = "12")]
        pub output: Vec<ValueInfoProto>,
        /// Types of intermediate values (optional).
        #[prost(message, repeated, tag = "13")]
        pub value_info: Vec<ValueInfoProto>,
    }

    /// `onnx.NodeProto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeProto {
        /// Input value names.
        #[prost(string, repeated, tag = "1")]
        pub input: Vec<String>,
        /// Output value names.
        #[prost(string, repeated, tag = "2")]
        pub output: Vec<String>,
        /// The node's name.
        #[prost(string, tag = "3")]
        pub name: String,
        /// The operator.
        #[prost(string, tag = "4")]
        pub op_type: String,
        /// Attributes.
        #[prost(message, repeated, tag = "5")]
        pub attribute: Vec<AttributeProto>,
        /// Free text.
        #[prost(string, tag = "6")]
        pub doc_string: String,
        /// The operator's domain (empty = `ai.onnx`).
        #[prost(string, tag = "7")]
        pub domain: String,
    }

    /// `onnx.AttributeProto` (the scalar kinds kiln uses).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AttributeProto {
        /// The attribute's name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// `AttributeType`: 1 FLOAT, 2 INT, 3 STRING, 7 INTS.
        #[prost(int32, tag = "20")]
        pub r#type: i32,
        /// A float value.
        #[prost(float, tag = "2")]
        pub f: f32,
        /// An integer value.
        #[prost(int64, tag = "3")]
        pub i: i64,
        /// A string value.
        #[prost(bytes = "vec", tag = "4")]
        pub s: Vec<u8>,
        /// Integer values.
        #[prost(int64, repeated, tag = "8")]
        pub ints: Vec<i64>,
        /// String values.
        #[prost(bytes = "vec", repeated, tag = "9")]
        pub strings: Vec<Vec<u8>>,
    }

    /// `onnx.TensorProto` (data in `raw_data`, little-endian).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorProto {
        /// Shape.
        #[prost(int64, repeated, tag = "1")]
        pub dims: Vec<i64>,
        /// `DataType`: 1 FLOAT, 11 DOUBLE.
        #[prost(int32, tag = "2")]
        pub data_type: i32,
        /// The tensor's name.
        #[prost(string, tag = "8")]
        pub name: String,
        /// Row-major little-endian elements.
        #[prost(bytes = "vec", tag = "9")]
        pub raw_data: Vec<u8>,
        /// Free text.
        #[prost(string, tag = "12")]
        pub doc_string: String,
    }

    /// `onnx.ValueInfoProto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueInfoProto {
        /// The value's name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Its type.
        #[prost(message, optional, tag = "2")]
        pub r#type: Option<TypeProto>,
        /// Free text.
        #[prost(string, tag = "3")]
        pub doc_string: String,
    }

    /// `onnx.TypeProto` (only the `tensor_type` member of its `oneof value`).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeProto {
        /// A tensor type.
        #[prost(message, optional, tag = "1")]
        pub tensor_type: Option<TensorTypeProto>,
    }

    /// `onnx.TypeProto.Tensor`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorTypeProto {
        /// `DataType` of the elements.
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        /// The shape.
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }

    /// `onnx.TensorShapeProto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorShapeProto {
        /// Dimensions.
        #[prost(message, repeated, tag = "1")]
        pub dim: Vec<Dimension>,
    }

    /// `onnx.TensorShapeProto.Dimension`: a fixed size or a symbolic name (its `oneof value`).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        /// A fixed size.
        #[prost(int64, optional, tag = "1")]
        pub dim_value: Option<i64>,
        /// A symbolic size.
        #[prost(string, optional, tag = "2")]
        pub dim_param: Option<String>,
    }
}

use proto::*;

/// Errors from `kiln export onnx`.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The checkpoint could not be read or verified.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// The output file could not be written (the underlying message names the file).
    #[error("cannot write the ONNX file: {source}")]
    Write {
        /// The output file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file given to [`decode`] is not an ONNX model.
    #[error("not an ONNX model: {0}")]
    Decode(String),
    /// A target is modelled through a transform, which the ONNX graph does not carry.
    #[error(
        "target `{target}` is trained with target_transform `{transform}`: the ONNX graph gives the transformed space's mean and std, not original units, so kiln refuses to export it (serve it with `kiln serve` or `kiln predict`, which apply the inverse, or train without the transform)"
    )]
    TargetTransform {
        /// The target.
        target: String,
        /// The transform's name.
        transform: &'static str,
    },
    /// A feature is a date column, whose text the ONNX graph cannot parse.
    #[error(
        "feature `{0}` is a date column (data.dates): the ONNX graph has no date parser, so kiln refuses to export it (serve it with `kiln serve` or `kiln predict`, or give the model the date parts as numeric columns)"
    )]
    DateFeature(String),
    /// A feature is binned (`data.numeric_bins`), an encoding the graph does not build.
    #[error(
        "feature `{0}` is binned (data.numeric_bins): the ONNX graph does not build the piecewise-linear bins, so kiln refuses to export it (serve it with `kiln serve` or `kiln predict`, or train without data.numeric_bins)"
    )]
    BinnedFeature(String),
}

/// What [`export_file`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct OnnxSummary {
    /// The ONNX file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: usize,
    /// Nodes in the graph.
    pub nodes: usize,
    /// Features (the input's second dimension).
    pub features: usize,
    /// Targets (the outputs' second dimension).
    pub targets: usize,
    /// The hidden activation.
    pub activation: Activation,
    /// The checkpoint's run id.
    pub run_id: String,
    /// The checkpoint's weights SHA-256.
    pub weights_sha256: String,
}

/// Graph under construction.
#[derive(Default)]
struct Builder {
    nodes: Vec<NodeProto>,
    init: Vec<TensorProto>,
}

impl Builder {
    fn tensor(&mut self, name: &str, dims: &[usize], data_type: i32, raw: Vec<u8>) -> String {
        self.init.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type,
            name: name.to_string(),
            raw_data: raw,
            doc_string: String::new(),
        });
        name.to_string()
    }

    fn f32s(&mut self, name: &str, dims: &[usize], v: &[f32]) -> String {
        let raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, dims, FLOAT, raw)
    }

    fn f64s(&mut self, name: &str, dims: &[usize], v: &[f64]) -> String {
        let raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, dims, DOUBLE, raw)
    }

    fn i64s(&mut self, name: &str, dims: &[usize], v: &[i64]) -> String {
        if !self.init.iter().any(|t| t.name == name) {
            let raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.tensor(name, dims, INT64, raw);
        }
        name.to_string()
    }

    /// `LabelEncoder` (ai.onnx.ml): each string of `keys` → its index, anything else →
    /// `default`.
    fn label_encoder(&mut self, x: &str, keys: &[String], default: i64, out: &str) -> String {
        let attr = |name: &str, r#type: i32| AttributeProto {
            name: name.to_string(),
            r#type,
            ..Default::default()
        };
        self.nodes.push(NodeProto {
            input: vec![x.to_string()],
            output: vec![out.to_string()],
            name: format!("{out}/LabelEncoder"),
            op_type: "LabelEncoder".into(),
            attribute: vec![
                AttributeProto {
                    strings: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
                    ..attr("keys_strings", ATTR_STRINGS)
                },
                AttributeProto {
                    ints: (0..keys.len() as i64).collect(),
                    ..attr("values_int64s", ATTR_INTS)
                },
                AttributeProto {
                    i: default,
                    ..attr("default_int64", ATTR_INT)
                },
            ],
            doc_string: String::new(),
            domain: ML_DOMAIN.into(),
        });
        out.to_string()
    }

    /// The preprocessing of a checkpoint whose inputs are raw columns: one graph input per
    /// column (f32 `[batch]`, NaN = missing; string `[batch]` for a categorical one), the
    /// network's `[batch, F]` inputs out (named `out`).
    fn preprocess(&mut self, pre: &Preprocessing, out: &str) -> (String, Vec<ValueInfoProto>) {
        let axes = self.i64s("pre.axes", &[1], &[1]);
        let on_off = "pre.on_off".to_string();
        let mut blocks = Vec::new();
        let mut indicators = Vec::new();
        let mut inputs = Vec::new();
        for (i, c) in pre.inputs.iter().enumerate() {
            let p = format!("pre.{i}");
            match &c.categories {
                None => {
                    inputs.push(ValueInfoProto {
                        name: c.name.clone(),
                        r#type: tensor_type(FLOAT, &batch_by(0)[..1]),
                        doc_string: match c.impute {
                            Some(v) => format!("numeric column; NaN = missing, imputed as {v}"),
                            None => "numeric column (NaN propagates: kiln refuses it)".into(),
                        },
                    });
                    let col = self.node("Unsqueeze", &[&c.name, &axes], &format!("{p}.col"), &[]);
                    let missing = (c.impute.is_some() || c.indicator)
                        .then(|| self.node("IsNaN", &[&col], &format!("{p}.isnan"), &[]));
                    let value = match (c.impute, &missing) {
                        (Some(v), Some(m)) => {
                            let k = self.f32s(&format!("{p}.impute"), &[], &[v as f32]);
                            self.node("Where", &[m, &k, &col], &format!("{p}.value"), &[])
                        }
                        _ => col,
                    };
                    blocks.push(value);
                    if c.indicator {
                        let m = missing.expect("an indicator needs IsNaN");
                        indicators.push(self.node(
                            "Cast",
                            &[&m],
                            &format!("{p}.missing"),
                            &[("to", FLOAT as i64)],
                        ));
                    }
                }
                Some(cats) => {
                    inputs.push(ValueInfoProto {
                        name: c.name.clone(),
                        r#type: tensor_type(STRING, &batch_by(0)[..1]),
                        doc_string: format!(
                            "categorical column, {} values; any other text (and a missing one) sets none of its one-hot inputs",
                            cats.len()
                        ),
                    });
                    if !self.init.iter().any(|t| t.name == on_off) {
                        self.f32s(&on_off, &[2], &[0.0, 1.0]);
                    }
                    let k = cats.len() as i64;
                    let code = self.label_encoder(&c.name, cats, k, &format!("{p}.code"));
                    let depth = self.i64s(&format!("{p}.depth"), &[1], &[k]);
                    blocks.push(self.node(
                        "OneHot",
                        &[&code, &depth, &on_off],
                        &format!("{p}.onehot"),
                        &[("axis", -1)],
                    ));
                    if c.indicator {
                        let tokens = missing_tokens();
                        // Index of a missing token, or len for anything else; ≠ len ⇒ missing.
                        let n = tokens.len() as i64;
                        let m = self.label_encoder(&c.name, &tokens, n, &format!("{p}.token"));
                        let none = self.i64s(&format!("{p}.not_token"), &[], &[n]);
                        let is = self.node("Equal", &[&m, &none], &format!("{p}.present"), &[]);
                        let miss = self.node("Not", &[&is], &format!("{p}.absent"), &[]);
                        let f = self.node(
                            "Cast",
                            &[&miss],
                            &format!("{p}.missing1d"),
                            &[("to", FLOAT as i64)],
                        );
                        indicators.push(self.node(
                            "Unsqueeze",
                            &[&f, &axes],
                            &format!("{p}.missing"),
                            &[],
                        ));
                    }
                }
            }
        }
        blocks.extend(indicators);
        let refs: Vec<&str> = blocks.iter().map(String::as_str).collect();
        let x = self.node("Concat", &refs, out, &[("axis", 1)]);
        (x, inputs)
    }

    /// Add a node with integer attributes; its one output is named `out`.
    fn node(&mut self, op: &str, inputs: &[&str], out: &str, ints: &[(&str, i64)]) -> String {
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.to_string()],
            name: format!("{out}/{op}"),
            op_type: op.to_string(),
            attribute: ints
                .iter()
                .map(|&(name, i)| AttributeProto {
                    name: name.to_string(),
                    r#type: ATTR_INT,
                    i,
                    ..Default::default()
                })
                .collect(),
            doc_string: String::new(),
            domain: String::new(),
        });
        out.to_string()
    }

    /// `Gemm(x, Wᵀ, b)` with the weights in PyTorch's `[out, in]` layout under `name`.
    fn linear(&mut self, x: &str, l: &HostLinear, name: &str) -> String {
        let mut t = vec![0f32; l.w.len()];
        for i in 0..l.fan_in {
            for o in 0..l.fan_out {
                t[o * l.fan_in + i] = l.w[i * l.fan_out + o];
            }
        }
        let w = self.f32s(&format!("{name}.weight"), &[l.fan_out, l.fan_in], &t);
        let b = self.f32s(&format!("{name}.bias"), &[l.fan_out], &l.b);
        self.node("Gemm", &[x, &w, &b], name, &[("transB", 1)])
    }

    /// The hidden activation of `z`, named `out`.
    fn activation(&mut self, z: &str, act: Activation, out: &str) -> String {
        match act {
            Activation::Relu => self.node("Relu", &[z], out, &[]),
            Activation::Tanh => self.node("Tanh", &[z], out, &[]),
            Activation::Silu => {
                let s = self.node("Sigmoid", &[z], &format!("{out}.sigmoid"), &[]);
                self.node("Mul", &[z, &s], out, &[])
            }
            Activation::Gelu => {
                // x · ½ · (1 + erf(x / √2)): the exact GELU of Burn and kiln's engines.
                let c = |b: &mut Self, n: &str, v: f32| {
                    if !b.init.iter().any(|t| t.name == n) {
                        b.f32s(n, &[], &[v]);
                    }
                    n.to_string()
                };
                let inv_sqrt2 = c(self, "gelu.inv_sqrt2", std::f32::consts::FRAC_1_SQRT_2);
                let one = c(self, "gelu.one", 1.0);
                let half = c(self, "gelu.half", 0.5);
                let u = self.node("Mul", &[z, &inv_sqrt2], &format!("{out}.scaled"), &[]);
                let e = self.node("Erf", &[&u], &format!("{out}.erf"), &[]);
                let p = self.node("Add", &[&e, &one], &format!("{out}.erf1"), &[]);
                let q = self.node("Mul", &[z, &p], &format!("{out}.xerf1"), &[]);
                self.node("Mul", &[&q, &half], out, &[])
            }
        }
    }
}

fn tensor_type(elem_type: i32, dims: &[Dimension]) -> Option<TypeProto> {
    Some(TypeProto {
        tensor_type: Some(TensorTypeProto {
            elem_type,
            shape: Some(TensorShapeProto { dim: dims.to_vec() }),
        }),
    })
}

fn batch_by(n: usize) -> [Dimension; 2] {
    [
        Dimension {
            dim_value: None,
            dim_param: Some(BATCH_DIM.into()),
        },
        Dimension {
            dim_value: Some(n as i64),
            dim_param: None,
        },
    ]
}

/// The ONNX model of a loaded checkpoint (see the module documentation for the graph).
pub fn model_proto(ckpt: &Checkpoint) -> ModelProto {
    let m = &ckpt.manifest;
    let w = &ckpt.weights;
    let (nf, k) = (w.arch.n_features, w.arch.n_targets);
    let mut b = Builder::default();

    let pre = m.input_preprocessing();
    let (x_in, graph_inputs) = if pre.is_plain() {
        let input = ValueInfoProto {
            name: FEATURES_INPUT.into(),
            r#type: tensor_type(FLOAT, &batch_by(nf)),
            doc_string: format!(
                "features in original units: {}",
                serde_json::to_string(&m.feature_names()).expect("names serialise")
            ),
        };
        (FEATURES_INPUT.to_string(), vec![input])
    } else {
        b.preprocess(&pre, "pre.features")
    };
    let x_norm = m.feature_affine();
    let shift = b.f32s("normalize.feature_mean", &[nf], &x_norm.shift);
    let scale = b.f32s("normalize.feature_inv_std", &[nf], &x_norm.scale);
    let centred = b.node("Sub", &[&x_in, &shift], "normalize.centred", &[]);
    let mut h = b.node("Mul", &[&centred, &scale], "normalize", &[]);

    // The checkpoint's own tensor names (backbone layers, then the mean and log-variance heads).
    let named = w.named();
    let (backbone, heads) = named.split_at(named.len() - 2);
    for (name, layer) in backbone {
        let z = b.linear(&h, layer, name);
        h = b.activation(&z, w.arch.activation, &format!("{name}.act"));
    }
    let mean_n = b.linear(&h, heads[0].1, &heads[0].0);
    let logvar = b.linear(&h, heads[1].1, &heads[1].0);

    // De-normalisation in f64, as `Predictor` does: mean·σ_y + μ_y and exp(½·logvar)·σ_y.
    let t_std: Vec<f64> = m.targets.iter().map(|t| t.std).collect();
    let t_mean: Vec<f64> = m.targets.iter().map(|t| t.mean).collect();
    let y_std = b.f64s("denormalize.target_std", &[k], &t_std);
    let y_mean = b.f64s("denormalize.target_mean", &[k], &t_mean);
    let half = b.f64s("denormalize.half", &[], &[0.5]);
    let to = |t: i32| [("to", t as i64)];
    let md = b.node("Cast", &[&mean_n], "mean.f64", &to(DOUBLE));
    let ms = b.node("Mul", &[&md, &y_std], "mean.scaled", &[]);
    let mo = b.node("Add", &[&ms, &y_mean], "mean.shifted", &[]);
    b.node("Cast", &[&mo], MEAN_OUTPUT, &to(FLOAT));
    let ld = b.node("Cast", &[&logvar], "logvar.f64", &to(DOUBLE));
    let lh = b.node("Mul", &[&ld, &half], "logvar.half", &[]);
    let sd = b.node("Exp", &[&lh], "std.normalized", &[]);
    let ss = b.node("Mul", &[&sd, &y_std], "std.scaled", &[]);
    b.node("Cast", &[&ss], STD_OUTPUT, &to(FLOAT));

    let names = |cols: &[crate::data::ColumnStats]| {
        serde_json::to_string(&cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>())
            .expect("names serialise")
    };
    let mut props = vec![
        ("kiln_version", env!("CARGO_PKG_VERSION").to_string()),
        ("checkpoint_kiln_version", m.kiln_version.clone()),
        ("run_id", m.run_id.clone()),
        ("features", names(&m.features)),
        ("targets", names(&m.targets)),
        ("weights_sha256", m.weights.sha256.clone()),
    ];
    if let Some(seal) = &m.manifest_sha256 {
        props.push(("manifest_sha256", seal.clone()));
    }
    if !pre.is_plain() {
        props.push((
            "inputs",
            serde_json::to_string(&pre.inputs).expect("inputs serialise"),
        ));
    }
    let mut opset_import = vec![OperatorSetIdProto {
        domain: String::new(),
        version: OPSET_VERSION,
    }];
    if pre.has_categorical() {
        opset_import.push(OperatorSetIdProto {
            domain: ML_DOMAIN.into(),
            version: ML_OPSET_VERSION,
        });
    }
    let doc = format!(
        "kiln regression network {nf} → {:?} → ({k} + {k}), {}: `{FEATURES_INPUT}` [batch, {nf}] \
         f32 in original units; `{MEAN_OUTPUT}` and `{STD_OUTPUT}` [batch, {k}] in original units \
         (std = exp(½·logvar) · target std)",
        w.arch.hidden,
        w.arch.activation.name()
    );
    ModelProto {
        ir_version: IR_VERSION,
        opset_import,
        producer_name: "kiln".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        domain: String::new(),
        model_version: 1,
        doc_string: doc.clone(),
        graph: Some(GraphProto {
            node: b.nodes,
            name: format!("kiln-{}", m.run_id),
            initializer: b.init,
            doc_string: doc,
            input: graph_inputs,
            output: [MEAN_OUTPUT, STD_OUTPUT]
                .iter()
                .map(|&name| ValueInfoProto {
                    name: name.into(),
                    r#type: tensor_type(FLOAT, &batch_by(k)),
                    doc_string: format!("per target, original units: {}", names(&m.targets)),
                })
                .collect(),
            value_info: Vec::new(),
        }),
        metadata_props: props
            .into_iter()
            .map(|(key, value)| StringStringEntryProto {
                key: key.into(),
                value,
            })
            .collect(),
    }
}

/// The ONNX file's bytes for a loaded checkpoint.
pub fn to_bytes(ckpt: &Checkpoint) -> Vec<u8> {
    model_proto(ckpt).encode_to_vec()
}

/// Parse an ONNX file's bytes into the messages kiln declares (fields outside that subset
/// are skipped).
pub fn decode(bytes: &[u8]) -> Result<ModelProto, OnnxError> {
    ModelProto::decode(bytes).map_err(|e| OnnxError::Decode(e.to_string()))
}

/// Load and verify the checkpoint at `checkpoint` (an export directory or a run directory
/// holding `export/`) and write its ONNX model to `out` atomically (temporary file, fsync,
/// rename).
pub fn export_file(checkpoint: &Path, out: &Path) -> Result<OnnxSummary, OnnxError> {
    let ckpt = Checkpoint::load(checkpoint)?;
    if let Some(t) = ckpt
        .manifest
        .targets
        .iter()
        .find(|t| !t.transform.is_none())
    {
        return Err(OnnxError::TargetTransform {
            target: t.name.clone(),
            transform: t.transform.name(),
        });
    }
    if let Some(c) = ckpt
        .manifest
        .input_preprocessing()
        .inputs
        .iter()
        .find(|c| c.date.is_some())
    {
        return Err(OnnxError::DateFeature(c.name.clone()));
    }
    if let Some(c) = ckpt
        .manifest
        .input_preprocessing()
        .inputs
        .iter()
        .find(|c| c.bins.is_some())
    {
        return Err(OnnxError::BinnedFeature(c.name.clone()));
    }
    let model = model_proto(&ckpt);
    let nodes = model.graph.as_ref().map_or(0, |g| g.node.len());
    let bytes = model.encode_to_vec();
    crate::util::write_atomic(out, &bytes).map_err(|source| OnnxError::Write {
        path: out.to_path_buf(),
        source,
    })?;
    Ok(OnnxSummary {
        path: out.to_path_buf(),
        bytes: bytes.len(),
        nodes,
        features: ckpt.weights.arch.n_features,
        targets: ckpt.weights.arch.n_targets,
        activation: ckpt.weights.arch.activation,
        run_id: ckpt.manifest.run_id.clone(),
        weights_sha256: ckpt.manifest.weights.sha256.clone(),
    })
}

/// The metadata properties of a decoded model as `(key, value)` pairs.
pub fn metadata(model: &ModelProto) -> Vec<(String, String)> {
    model
        .metadata_props
        .iter()
        .map(|p| (p.key.clone(), p.value.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    /// The graph's missing-category spellings are exactly what kiln reads as missing.
    #[test]
    fn missing_tokens_are_kilns_missing_cells() {
        let t = super::missing_tokens();
        assert_eq!(t.len(), 1 + 8 + 4 + 16);
        assert!(t.iter().all(|s| crate::data::table::is_missing(s)), "{t:?}");
        for s in ["NaN", "nAn", "NA", "Null", "NULL", ""] {
            assert!(t.iter().any(|x| x == s), "{s}");
        }
        for s in ["None", "N/A", "n/a", "0"] {
            assert!(
                !crate::data::table::is_missing(s) && !t.iter().any(|x| x == s),
                "{s}"
            );
        }
    }
}
