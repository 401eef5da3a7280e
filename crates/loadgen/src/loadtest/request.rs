//! What a load test sends: `batch` rows of plausible values for each input a model's metadata
//! lists (within a standard deviation of each feature's training mean when its configuration
//! gives them), as an OIP request body (JSON or the binary extension) or a gRPC
//! `ModelInferRequest`, encoded once.

use bytes::Bytes;
use kiln_serve::records::{ModelConfig, ModelMetadata};
use serde_json::json;

use super::LoadtestError;
use super::pb;

/// A deterministic value stream for request data.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One input's generated values.
struct GenInput {
    name: String,
    datatype: String,
    shape: Vec<usize>,
    values: Vec<f64>,
}

/// `batch` rows of plausible values for each input of a model's metadata (and its
/// configuration, when it gives the features' training statistics: values within a standard
/// deviation of each feature's mean).
fn generate_inputs(
    meta: &ModelMetadata,
    config: Option<&ModelConfig>,
    batch: usize,
) -> Result<Vec<GenInput>, LoadtestError> {
    let mut rng = Rng(7);
    let stats: Vec<(f64, f64)> = config
        .map(|c| c.kiln.features().iter().map(|f| (f.mean, f.std)).collect())
        .unwrap_or_default();
    if meta.inputs.is_empty() {
        return Err(LoadtestError::BadMetadata("it has no inputs".into()));
    }
    let mut out = Vec::new();
    for inp in &meta.inputs {
        let (name, dt) = (inp.name.as_str(), inp.datatype.as_str());
        let shape: Vec<usize> = inp
            .shape
            .iter()
            .enumerate()
            .map(|(i, &d)| match d {
                -1 if i == 0 => batch,
                -1 => 2,
                n => n.max(0) as usize,
            })
            .collect();
        let n: usize = shape.iter().product();
        let cols = shape.last().copied().unwrap_or(1).max(1);
        let values: Vec<f64> = (0..n)
            .map(|i| {
                let u = rng.next();
                match dt {
                    "FP32" | "FP64" => {
                        let (m, s) = stats.get(i % cols).copied().unwrap_or((0.5, 0.3));
                        if name == "std" {
                            0.5 + u
                        } else {
                            m + s * (2.0 * u - 1.0)
                        }
                    }
                    "BOOL" => (u < 0.5) as u8 as f64,
                    _ => 0.0,
                }
            })
            .collect();
        out.push(GenInput {
            name: name.to_string(),
            datatype: dt.to_string(),
            shape,
            values,
        });
    }
    Ok(out)
}

/// Little-endian bytes of generated values.
fn raw_le(inp: &GenInput) -> Result<Vec<u8>, LoadtestError> {
    let mut raw = Vec::new();
    for &v in &inp.values {
        match inp.datatype.as_str() {
            "FP32" => raw.extend_from_slice(&(v as f32).to_le_bytes()),
            "FP64" => raw.extend_from_slice(&v.to_le_bytes()),
            "INT32" => raw.extend_from_slice(&(v as i32).to_le_bytes()),
            "INT64" => raw.extend_from_slice(&(v as i64).to_le_bytes()),
            "BOOL" => raw.push(v as u8),
            other => {
                return Err(LoadtestError::Datatype {
                    input: inp.name.clone(),
                    datatype: other.to_string(),
                });
            }
        }
    }
    Ok(raw)
}

/// Build one request body for a model's metadata (and its configuration, when it gives
/// feature statistics): `batch` rows of plausible values. Returns the body and the
/// `Inference-Header-Content-Length` when binary.
pub fn request_body(
    meta: &ModelMetadata,
    config: Option<&ModelConfig>,
    batch: usize,
    binary: bool,
) -> Result<(Vec<u8>, Option<usize>), LoadtestError> {
    let mut inputs = Vec::new();
    let mut raw = Vec::new();
    for g in generate_inputs(meta, config, batch)? {
        let mut entry = json!({"name": g.name, "datatype": g.datatype, "shape": g.shape});
        if binary {
            let b = raw_le(&g)?;
            entry["parameters"] = json!({"binary_data_size": b.len()});
            raw.extend_from_slice(&b);
        } else {
            let vals = &g.values;
            entry["data"] = match g.datatype.as_str() {
                "BOOL" => json!(vals.iter().map(|&v| v != 0.0).collect::<Vec<_>>()),
                "FP32" => json!(vals.iter().map(|&v| v as f32).collect::<Vec<_>>()),
                "INT32" | "INT64" => json!(vals.iter().map(|&v| v as i64).collect::<Vec<_>>()),
                _ => json!(vals),
            };
        }
        inputs.push(entry);
    }
    let mut req = json!({"inputs": inputs});
    if binary {
        req["parameters"] = json!({"binary_data_output": true});
    }
    let mut body = serde_json::to_vec(&req).expect("JSON serialises");
    if binary {
        let n = body.len();
        body.extend_from_slice(&raw);
        Ok((body, Some(n)))
    } else {
        Ok((body, None))
    }
}

/// The gRPC request for the same inputs: raw contents when `binary` (answered raw), typed
/// contents otherwise (answered typed, as JSON is over HTTP).
pub fn grpc_request(
    model: &str,
    meta: &ModelMetadata,
    config: Option<&ModelConfig>,
    batch: usize,
    binary: bool,
) -> Result<pb::ModelInferRequest, LoadtestError> {
    let mut req = pb::ModelInferRequest {
        model_name: model.to_string(),
        ..Default::default()
    };
    for g in generate_inputs(meta, config, batch)? {
        let mut t = pb::model_infer_request::InferInputTensor {
            name: g.name.clone(),
            datatype: g.datatype.clone(),
            shape: g.shape.iter().map(|&d| d as i64).collect(),
            ..Default::default()
        };
        if binary {
            req.raw_input_contents.push(raw_le(&g)?.into());
        } else {
            let v = &g.values;
            let mut c = pb::InferTensorContents::default();
            match g.datatype.as_str() {
                "FP32" => c.fp32_contents = v.iter().map(|&x| x as f32).collect(),
                "FP64" => c.fp64_contents = v.clone(),
                "INT32" => c.int_contents = v.iter().map(|&x| x as i32).collect(),
                "INT64" => c.int64_contents = v.iter().map(|&x| x as i64).collect(),
                "BOOL" => c.bool_contents = v.iter().map(|&x| x != 0.0).collect(),
                other => {
                    return Err(LoadtestError::Datatype {
                        input: g.name,
                        datatype: other.to_string(),
                    });
                }
            }
            t.contents = Some(c);
        }
        req.inputs.push(t);
    }
    if !binary {
        req.parameters.insert(
            "binary_data_output".into(),
            pb::InferParameter {
                parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(false)),
            },
        );
    }
    Ok(req)
}

/// A gRPC message on the wire: the uncompressed flag, the big-endian length, the protobuf.
pub(super) fn grpc_message(m: &pb::ModelInferRequest) -> Bytes {
    use prost::Message;
    let n = m.encoded_len();
    let mut out = Vec::with_capacity(5 + n);
    out.push(0);
    out.extend_from_slice(&(n as u32).to_be_bytes());
    m.encode(&mut out).expect("a Vec grows as needed");
    Bytes::from(out)
}
