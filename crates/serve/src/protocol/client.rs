//! The client's side of the protocol: encode a request (JSON `data`, or the binary tensor
//! extension) and decode a response into named outputs. The server's counterparts are
//! [`super::request`] and [`super::response`]; the HTTP client, the load generator and the
//! tests speak through these.

use serde_json::{Map, Value, json};

use super::{Datatype, OutputData};

/// Why a response body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The `Inference-Header-Content-Length` is longer than the body.
    #[error("header length {header_length} exceeds the body ({body_len} bytes)")]
    HeaderLength {
        /// The header's value.
        header_length: usize,
        /// The body's length.
        body_len: usize,
    },
    /// The JSON part is not valid JSON.
    #[error("the response's JSON part is invalid: {0}")]
    Json(#[from] serde_json::Error),
    /// The JSON has no `outputs` array.
    #[error("the response has no `outputs` array")]
    NoOutputs,
    /// An output lacks a field, or the field has the wrong type.
    #[error("output {index}: `{field}` is missing or not {expected}")]
    Field {
        /// The output's position in `outputs`.
        index: usize,
        /// The field.
        field: &'static str,
        /// What the field should hold.
        expected: &'static str,
    },
    /// An output's binary data runs past the end of the body.
    #[error(
        "output `{name}` has {size} bytes of binary data at offset {offset}, but the body has {body_len} bytes"
    )]
    BinaryBeyondBody {
        /// The output.
        name: String,
        /// Where its data starts.
        offset: usize,
        /// Its `binary_data_size`.
        size: usize,
        /// The body's length.
        body_len: usize,
    },
    /// An output has a datatype a client does not decode.
    #[error("output `{name}` has datatype {datatype}; expected FP32 or FP64")]
    UnsupportedDatatype {
        /// The output.
        name: String,
        /// Its datatype.
        datatype: String,
    },
}

/// A decoded output: name, shape, data.
pub type DecodedOutput = (String, Vec<usize>, OutputData);

/// Parse a response body (JSON, optionally followed by binary outputs) into named outputs —
/// the client side of [`super::encode_response`], used by the load generator and the tests.
pub fn decode_response(
    body: &[u8],
    header_length: Option<usize>,
) -> Result<(Value, Vec<DecodedOutput>), DecodeError> {
    let json_len = header_length.unwrap_or(body.len());
    if json_len > body.len() {
        return Err(DecodeError::HeaderLength {
            header_length: json_len,
            body_len: body.len(),
        });
    }
    let v: Value = serde_json::from_slice(&body[..json_len])?;
    let mut offset = json_len;
    let mut out = Vec::new();
    let outputs = v["outputs"].as_array().ok_or(DecodeError::NoOutputs)?;
    for (index, o) in outputs.iter().enumerate() {
        let field = |field, expected| DecodeError::Field {
            index,
            field,
            expected,
        };
        let name = o["name"]
            .as_str()
            .ok_or_else(|| field("name", "a string"))?
            .to_string();
        let shape: Vec<usize> = o["shape"]
            .as_array()
            .ok_or_else(|| field("shape", "an array"))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .map(|d| d as usize)
                    .ok_or_else(|| field("shape", "an array of dimensions >= 0"))
            })
            .collect::<Result<_, _>>()?;
        let dt = o["datatype"]
            .as_str()
            .ok_or_else(|| field("datatype", "a string"))?;
        let unsupported = || DecodeError::UnsupportedDatatype {
            name: name.clone(),
            datatype: dt.to_string(),
        };
        let data = if let Some(n) = o["parameters"]["binary_data_size"].as_u64() {
            let n = n as usize;
            let b = body.get(offset..offset.saturating_add(n)).ok_or_else(|| {
                DecodeError::BinaryBeyondBody {
                    name: name.clone(),
                    offset,
                    size: n,
                    body_len: body.len(),
                }
            })?;
            offset += n;
            match dt {
                "FP32" => OutputData::F32(
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                ),
                "FP64" => OutputData::F64(
                    b.chunks_exact(8)
                        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect(),
                ),
                _ => return Err(unsupported()),
            }
        } else {
            let data = o["data"]
                .as_array()
                .ok_or_else(|| field("data", "an array (or binary_data_size)"))?;
            // A non-finite value is serialised as null; it decodes as NaN.
            match dt {
                "FP32" => OutputData::F32(
                    data.iter()
                        .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
                        .collect(),
                ),
                "FP64" => OutputData::F64(
                    data.iter()
                        .map(|x| x.as_f64().unwrap_or(f64::NAN))
                        .collect(),
                ),
                _ => return Err(unsupported()),
            }
        };
        out.push((name, shape, data));
    }
    Ok((v, out))
}

/// The data of a tensor a client sends.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestData {
    /// BOOL values.
    Bool(Vec<bool>),
    /// INT32 values.
    I32(Vec<i32>),
    /// INT64 values.
    I64(Vec<i64>),
    /// FP32 values.
    F32(Vec<f32>),
    /// FP64 values.
    F64(Vec<f64>),
}

impl RequestData {
    /// The datatype.
    pub fn datatype(&self) -> Datatype {
        match self {
            RequestData::Bool(_) => Datatype::Bool,
            RequestData::I32(_) => Datatype::I32,
            RequestData::I64(_) => Datatype::I64,
            RequestData::F32(_) => Datatype::Fp32,
            RequestData::F64(_) => Datatype::Fp64,
        }
    }

    fn to_le_bytes(&self, out: &mut Vec<u8>) {
        match self {
            RequestData::Bool(v) => out.extend(v.iter().map(|&b| b as u8)),
            RequestData::I32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            RequestData::I64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            RequestData::F32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            RequestData::F64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        }
    }

    fn to_json(&self) -> Value {
        match self {
            RequestData::Bool(v) => json!(v),
            RequestData::I32(v) => json!(v),
            RequestData::I64(v) => json!(v),
            RequestData::F32(v) => json!(v),
            RequestData::F64(v) => json!(v),
        }
    }
}

/// One input tensor of a request a client sends.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestTensor {
    /// Its name.
    pub name: String,
    /// Its shape (the server checks it against the element count).
    pub shape: Vec<usize>,
    /// Its data, flat in row-major order.
    pub data: RequestData,
}

/// An encoded request body.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedRequest {
    /// JSON, followed by binary input data when `header_length` is set.
    pub body: Vec<u8>,
    /// The JSON length when binary data follows (send it as
    /// `Inference-Header-Content-Length`).
    pub header_length: Option<usize>,
}

/// Encode a request: inputs as JSON `data`, or with `binary_inputs` as raw little-endian
/// bytes after the JSON; `binary_outputs` asks for every output as binary
/// (`parameters.binary_data_output`).
pub fn encode_request(
    id: Option<&str>,
    inputs: &[RequestTensor],
    binary_inputs: bool,
    binary_outputs: bool,
) -> EncodedRequest {
    let mut raw = Vec::new();
    let entries: Vec<Value> = inputs
        .iter()
        .map(|t| {
            let mut entry = Map::new();
            entry.insert("name".into(), json!(t.name));
            entry.insert("datatype".into(), json!(t.data.datatype().name()));
            entry.insert("shape".into(), json!(t.shape));
            if binary_inputs {
                let before = raw.len();
                t.data.to_le_bytes(&mut raw);
                entry.insert(
                    "parameters".into(),
                    json!({"binary_data_size": raw.len() - before}),
                );
            } else {
                entry.insert("data".into(), t.data.to_json());
            }
            Value::Object(entry)
        })
        .collect();
    let mut req = json!({"inputs": entries});
    if let Some(id) = id {
        req["id"] = json!(id);
    }
    if binary_outputs {
        req["parameters"] = json!({"binary_data_output": true});
    }
    let mut body = serde_json::to_vec(&req).expect("a JSON value serialises");
    if !binary_inputs {
        return EncodedRequest {
            body,
            header_length: None,
        };
    }
    let header_length = body.len();
    body.extend_from_slice(&raw);
    EncodedRequest {
        body,
        header_length: Some(header_length),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Bytes;

    use super::super::{InferRequest, OutputTensor, encode_response};
    use super::*;

    #[test]
    fn response_round_trips_through_decode() {
        let outs = vec![
            (
                OutputTensor {
                    name: "mean".into(),
                    shape: vec![1, 2],
                    data: OutputData::F32(vec![0.1, 2.5]),
                },
                true,
            ),
            (
                OutputTensor {
                    name: "std".into(),
                    shape: vec![1, 2],
                    data: OutputData::F32(vec![0.3, 1e-7]),
                },
                false,
            ),
        ];
        let enc = encode_response("m", "1", Some("x"), &outs);
        let (json, decoded) = decode_response(&enc.body, enc.header_length).unwrap();
        assert_eq!(json["id"], "x");
        assert_eq!(decoded[0].2, outs[0].0.data);
        assert_eq!(decoded[1].2, outs[1].0.data);
    }

    #[test]
    fn bad_responses_name_the_problem() {
        let cases: [(&[u8], Option<usize>, &str); 5] = [
            (b"{}", Some(9), "exceeds the body (2 bytes)"),
            (b"{", None, "JSON part is invalid"),
            (b"{}", None, "no `outputs` array"),
            (
                br#"{"outputs":[{"shape":[1],"datatype":"FP32","data":[1]}]}"#,
                None,
                "output 0: `name` is missing",
            ),
            (
                br#"{"outputs":[{"name":"p","shape":[1],"datatype":"INT8","data":[1]}]}"#,
                None,
                "output `p` has datatype INT8; expected FP32 or FP64",
            ),
        ];
        for (body, hl, want) in cases {
            let e = decode_response(body, hl).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let json = br#"{"outputs":[{"name":"p","shape":[1],"datatype":"FP64","parameters":{"binary_data_size":8}}]}"#;
        let e = decode_response(json, Some(json.len())).unwrap_err();
        assert!(
            matches!(e, DecodeError::BinaryBeyondBody { size: 8, .. }),
            "{e}"
        );
    }

    fn inputs() -> Vec<RequestTensor> {
        let t = |name: &str, shape: &[usize], data| RequestTensor {
            name: name.into(),
            shape: shape.to_vec(),
            data,
        };
        vec![
            t("x", &[2, 2], RequestData::F32(vec![0.5, -1.25, 3.0, 1e-3])),
            t("d", &[2], RequestData::F64(vec![0.1, -2.0])),
            t("t", &[2], RequestData::I32(vec![0, -7])),
            t("o", &[2], RequestData::Bool(vec![true, false])),
        ]
    }

    #[test]
    fn requests_encode_to_what_the_server_parses() {
        for binary in [false, true] {
            let enc = encode_request(Some("r1"), &inputs(), binary, binary);
            assert_eq!(enc.header_length.is_some(), binary);
            let hl = enc.header_length.map(|n| n.to_string());
            let r = InferRequest::parse(Bytes::from(enc.body), hl.as_deref()).unwrap();
            assert_eq!(r.id.as_deref(), Some("r1"));
            assert_eq!(r.binary_data_output, binary);
            assert_eq!(r.inputs[0].shape, vec![2, 2]);
            assert_eq!(r.inputs[0].to_f32().unwrap(), vec![0.5, -1.25, 3.0, 1e-3]);
            assert_eq!(r.inputs[1].to_f64().unwrap(), vec![0.1, -2.0]);
            assert_eq!(r.inputs[2].to_i32().unwrap(), vec![0, -7]);
            assert_eq!(r.inputs[3].to_bool().unwrap(), vec![true, false]);
        }
    }
}
