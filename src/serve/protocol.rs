//! Open Inference Protocol v2 (KServe / Triton REST) request parsing and response encoding,
//! with Triton's binary tensor data extension.
//!
//! A request body is JSON, optionally followed by raw little-endian tensor bytes: the
//! `Inference-Header-Content-Length` header says how many leading bytes are JSON, and each
//! input with `parameters.binary_data_size = n` takes the next `n` bytes in input order.
//! A response carries each output either as JSON `data` or, when the request asked for it
//! (`parameters.binary_data` per output, or `parameters.binary_data_output` for all), as raw
//! bytes after the JSON with `parameters.binary_data_size` set and the same header.
//!
//! This layer knows tensors, not models: [`InferRequest`] holds validated names, datatypes,
//! shapes and undecoded data; the model layer ([`super::model`]) checks them against its
//! inputs and decodes them with the typed accessors of [`InputTensor`].

use std::fmt;

use axum::body::Bytes;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The header that gives the length of the JSON part of a binary request or response.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// A request that cannot be served as sent (HTTP 400), with a message naming the problem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ProtocolError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(msg.into()))
}

/// A tensor element type of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datatype {
    /// 1-byte boolean.
    Bool,
    /// Unsigned integers.
    U8,
    /// Unsigned integers.
    U16,
    /// Unsigned integers.
    U32,
    /// Unsigned integers.
    U64,
    /// Signed integers.
    I8,
    /// Signed integers.
    I16,
    /// Signed integers.
    I32,
    /// Signed integers.
    I64,
    /// Half precision.
    Fp16,
    /// Single precision.
    Fp32,
    /// Double precision.
    Fp64,
    /// Byte strings.
    Bytes,
}

impl Datatype {
    /// Every datatype with its protocol name.
    pub const ALL: [(Datatype, &'static str); 13] = [
        (Datatype::Bool, "BOOL"),
        (Datatype::U8, "UINT8"),
        (Datatype::U16, "UINT16"),
        (Datatype::U32, "UINT32"),
        (Datatype::U64, "UINT64"),
        (Datatype::I8, "INT8"),
        (Datatype::I16, "INT16"),
        (Datatype::I32, "INT32"),
        (Datatype::I64, "INT64"),
        (Datatype::Fp16, "FP16"),
        (Datatype::Fp32, "FP32"),
        (Datatype::Fp64, "FP64"),
        (Datatype::Bytes, "BYTES"),
    ];

    /// The protocol name (`FP32`, …).
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(d, _)| *d == self)
            .map(|(_, n)| *n)
            .expect("every datatype is listed")
    }

    /// Parse a protocol name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().find(|(_, n)| *n == s).map(|(d, _)| *d)
    }

    /// Bytes per element in the binary encoding (`None` for BYTES, which is length-prefixed).
    pub fn size(self) -> Option<usize> {
        Some(match self {
            Datatype::Bool | Datatype::U8 | Datatype::I8 => 1,
            Datatype::U16 | Datatype::I16 | Datatype::Fp16 => 2,
            Datatype::U32 | Datatype::I32 | Datatype::Fp32 => 4,
            Datatype::U64 | Datatype::I64 | Datatype::Fp64 => 8,
            Datatype::Bytes => return None,
        })
    }

    /// The Triton model-configuration name (`TYPE_FP32`, …).
    pub fn config_name(self) -> String {
        match self {
            Datatype::Bytes => "TYPE_STRING".into(),
            other => format!("TYPE_{}", other.name()),
        }
    }
}

impl fmt::Display for Datatype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// JSON tensor data flattened in row-major order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JsonData {
    /// The values (booleans as 0/1).
    pub values: Vec<f64>,
    /// Whether any element was a boolean.
    pub has_bool: bool,
    /// Whether any element was a number.
    pub has_number: bool,
}

impl<'de> Deserialize<'de> for JsonData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Flatten<'a>(&'a mut JsonData);
        impl<'de> de::DeserializeSeed<'de> for Flatten<'_> {
            type Value = ();
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                d.deserialize_any(self)
            }
        }
        impl<'de> Visitor<'de> for Flatten<'_> {
            type Value = ();
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("numbers or booleans, flat or in nested arrays")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
                if let Some(n) = seq.size_hint() {
                    self.0.values.reserve(n);
                }
                while seq.next_element_seed(Flatten(&mut *self.0))?.is_some() {}
                Ok(())
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
                self.0.has_number = true;
                self.0.values.push(v);
                Ok(())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
                self.visit_f64(v as f64)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
                self.visit_f64(v as f64)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
                self.0.has_bool = true;
                self.0.values.push(if v { 1.0 } else { 0.0 });
                Ok(())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
                Err(E::custom(
                    "string elements (BYTES tensors) are not supported; send numbers",
                ))
            }
            fn visit_unit<E: de::Error>(self) -> Result<(), E> {
                Err(E::custom("null is not a tensor element; send numbers"))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
                Err(de::Error::custom(
                    "an object is not a tensor element; send numbers in (nested) arrays",
                ))
            }
        }
        let mut out = JsonData::default();
        de::DeserializeSeed::deserialize(Flatten(&mut out), d)?;
        Ok(out)
    }
}

#[derive(Deserialize)]
struct RawRequest {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    inputs: Vec<RawInput>,
    #[serde(default)]
    outputs: Option<Vec<RawOutput>>,
}

#[derive(Deserialize)]
struct RawInput {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    #[serde(default)]
    data: Option<JsonData>,
}

#[derive(Deserialize)]
struct RawOutput {
    name: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
}

/// The data of one input tensor, not yet decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum InputData {
    /// From the JSON `data` field.
    Json(JsonData),
    /// Raw little-endian bytes from the binary part of the body.
    Binary(Bytes),
}

/// One input tensor of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct InputTensor {
    /// Its name.
    pub name: String,
    /// Its declared datatype.
    pub datatype: Datatype,
    /// Its declared shape.
    pub shape: Vec<usize>,
    /// Its data, whose element count already matches the shape.
    pub data: InputData,
}

/// One requested output.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestedOutput {
    /// Its name.
    pub name: String,
    /// `parameters.binary_data`, when given.
    pub binary: Option<bool>,
}

/// A parsed inference request.
#[derive(Debug, Clone, PartialEq)]
pub struct InferRequest {
    /// The request id, echoed in the response.
    pub id: Option<String>,
    /// The inputs in request order.
    pub inputs: Vec<InputTensor>,
    /// The outputs asked for (`None`: all).
    pub outputs: Option<Vec<RequestedOutput>>,
    /// `parameters.binary_data_output`: every output as binary unless it says otherwise.
    pub binary_data_output: bool,
}

fn param_bool(
    p: &Option<Map<String, Value>>,
    key: &str,
    what: &str,
) -> Result<Option<bool>, ProtocolError> {
    match p.as_ref().and_then(|m| m.get(key)) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => err(format!(
            "{what} parameter `{key}` is {other}; expected true or false"
        )),
    }
}

fn json_error_message(e: &serde_json::Error, json: &[u8]) -> String {
    let what = if e.is_eof() {
        "the JSON ends early"
    } else if e.is_syntax() {
        "malformed JSON"
    } else {
        "invalid inference request"
    };
    let mut msg = format!("{what} at line {} column {}: {e}", e.line(), e.column());
    if json.is_empty() {
        msg = "empty request body; expected an inference request in JSON".into();
    }
    msg
}

impl InferRequest {
    /// Parse a request body. `header_length` is the `Inference-Header-Content-Length` value
    /// (`None`: the whole body is JSON).
    pub fn parse(body: Bytes, header_length: Option<&str>) -> Result<Self, ProtocolError> {
        let json_len = match header_length {
            None => body.len(),
            Some(h) => {
                let n: usize = h.trim().parse().map_err(|_| {
                    ProtocolError(format!(
                        "header Inference-Header-Content-Length is `{h}`; expected a byte count"
                    ))
                })?;
                if n > body.len() {
                    return err(format!(
                        "header Inference-Header-Content-Length is {n} but the body has only {} bytes",
                        body.len()
                    ));
                }
                n
            }
        };
        let json = body.slice(..json_len);
        let raw: RawRequest = serde_json::from_slice(&json)
            .map_err(|e| ProtocolError(json_error_message(&e, &json)))?;
        let id = match raw.id {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => return err(format!("request `id` is {other}; expected a string")),
        };
        let binary_data_output =
            param_bool(&raw.parameters, "binary_data_output", "request")?.unwrap_or(false);
        if raw.inputs.is_empty() {
            return err("request has no inputs");
        }
        let mut offset = json_len;
        let mut inputs = Vec::with_capacity(raw.inputs.len());
        for input in raw.inputs {
            let name = input.name;
            if inputs.iter().any(|i: &InputTensor| i.name == name) {
                return err(format!("input `{name}` is given more than once"));
            }
            let datatype = Datatype::parse(&input.datatype).ok_or_else(|| {
                ProtocolError(format!(
                    "input `{name}` has unknown datatype `{}`; expected one of {}",
                    input.datatype,
                    Datatype::ALL.map(|(_, n)| n).join(", ")
                ))
            })?;
            let mut shape = Vec::with_capacity(input.shape.len());
            for &d in &input.shape {
                if d < 0 {
                    return err(format!(
                        "input `{name}` has shape {:?}; dimensions must be >= 0 in a request",
                        input.shape
                    ));
                }
                shape.push(d as usize);
            }
            let count = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| {
                    ProtocolError(format!("input `{name}` shape {shape:?} is too large"))
                })?;
            let binary_size = match input
                .parameters
                .as_ref()
                .and_then(|p| p.get("binary_data_size"))
            {
                None => None,
                Some(v) => Some(v.as_u64().ok_or_else(|| {
                    ProtocolError(format!(
                        "input `{name}` parameter binary_data_size is {v}; expected a byte count"
                    ))
                })? as usize),
            };
            let data = match (input.data, binary_size) {
                (Some(_), Some(_)) => {
                    return err(format!(
                        "input `{name}` has both JSON `data` and binary_data_size; send one"
                    ));
                }
                (None, None) => {
                    return err(format!(
                        "input `{name}` has no data: expected a `data` array or parameters.binary_data_size"
                    ));
                }
                (Some(d), None) => {
                    if d.values.len() != count {
                        return err(format!(
                            "input `{name}` has {} data elements but shape {shape:?} needs {count}",
                            d.values.len()
                        ));
                    }
                    InputData::Json(d)
                }
                (None, Some(n)) => {
                    if datatype == Datatype::Bytes {
                        return err(format!("input `{name}`: BYTES tensors are not supported"));
                    }
                    let size = datatype.size().expect("fixed-size datatype");
                    if n != count * size {
                        return err(format!(
                            "input `{name}` has binary_data_size {n} but shape {shape:?} of {datatype} needs {} bytes",
                            count * size
                        ));
                    }
                    if offset + n > body.len() {
                        return err(format!(
                            "input `{name}` needs {n} bytes of binary data at offset {offset}, but the body has {} bytes (is the Inference-Header-Content-Length header set?)",
                            body.len()
                        ));
                    }
                    let b = body.slice(offset..offset + n);
                    offset += n;
                    InputData::Binary(b)
                }
            };
            inputs.push(InputTensor {
                name,
                datatype,
                shape,
                data,
            });
        }
        if offset != body.len() {
            return err(format!(
                "the body has {} bytes after the JSON that no input's binary_data_size accounts for",
                body.len() - offset
            ));
        }
        let outputs = match raw.outputs {
            None => None,
            Some(outs) => {
                let mut v: Vec<RequestedOutput> = Vec::with_capacity(outs.len());
                for o in outs {
                    if v.iter().any(|x| x.name == o.name) {
                        return err(format!("output `{}` is requested more than once", o.name));
                    }
                    if o.parameters
                        .as_ref()
                        .is_some_and(|p| p.contains_key("classification"))
                    {
                        return err(format!(
                            "output `{}`: the classification extension is not supported",
                            o.name
                        ));
                    }
                    let binary = param_bool(
                        &o.parameters,
                        "binary_data",
                        &format!("output `{}`", o.name),
                    )?;
                    v.push(RequestedOutput {
                        name: o.name,
                        binary,
                    });
                }
                Some(v)
            }
        };
        Ok(Self {
            id,
            inputs,
            outputs,
            binary_data_output,
        })
    }
}

impl InputTensor {
    /// Element count.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn expect_type(&self, want: Datatype) -> Result<(), ProtocolError> {
        if self.datatype != want {
            return err(format!(
                "input `{}` has datatype {}; expected {want}",
                self.name, self.datatype
            ));
        }
        Ok(())
    }

    fn json_numbers(&self, d: &JsonData) -> Result<(), ProtocolError> {
        if d.has_bool {
            return err(format!(
                "input `{}` of datatype {} has boolean elements; expected numbers",
                self.name, self.datatype
            ));
        }
        Ok(())
    }

    fn non_finite(&self, i: usize, v: f64) -> ProtocolError {
        ProtocolError(format!(
            "input `{}` element {i} (row {}) is {v} after conversion to {}; expected a finite number",
            self.name,
            i / self.shape.last().copied().unwrap_or(1).max(1),
            self.datatype
        ))
    }

    /// Decode an FP32 tensor; every element must be finite.
    pub fn to_f32(&self) -> Result<Vec<f32>, ProtocolError> {
        self.expect_type(Datatype::Fp32)?;
        let v: Vec<f32> = match &self.data {
            InputData::Json(d) => {
                self.json_numbers(d)?;
                d.values.iter().map(|&x| x as f32).collect()
            }
            InputData::Binary(b) => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        };
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(self.non_finite(i, v[i] as f64));
        }
        Ok(v)
    }

    /// Decode an FP64 tensor; every element must be finite.
    pub fn to_f64(&self) -> Result<Vec<f64>, ProtocolError> {
        self.expect_type(Datatype::Fp64)?;
        let v: Vec<f64> = match &self.data {
            InputData::Json(d) => {
                self.json_numbers(d)?;
                d.values.clone()
            }
            InputData::Binary(b) => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        };
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(self.non_finite(i, v[i]));
        }
        Ok(v)
    }

    /// Decode an INT32 tensor.
    pub fn to_i32(&self) -> Result<Vec<i32>, ProtocolError> {
        self.expect_type(Datatype::I32)?;
        match &self.data {
            InputData::Json(d) => {
                self.json_numbers(d)?;
                d.values
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        if x.fract() != 0.0 || x < i32::MIN as f64 || x > i32::MAX as f64 {
                            err(format!(
                                "input `{}` element {i} is {x}; expected an INT32 integer",
                                self.name
                            ))
                        } else {
                            Ok(x as i32)
                        }
                    })
                    .collect()
            }
            InputData::Binary(b) => Ok(b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()),
        }
    }

    /// Decode a BOOL tensor.
    pub fn to_bool(&self) -> Result<Vec<bool>, ProtocolError> {
        self.expect_type(Datatype::Bool)?;
        match &self.data {
            InputData::Json(d) => {
                if d.has_number {
                    return err(format!(
                        "input `{}` of datatype BOOL has numeric elements; expected true or false",
                        self.name
                    ));
                }
                Ok(d.values.iter().map(|&x| x != 0.0).collect())
            }
            InputData::Binary(b) => b
                .iter()
                .enumerate()
                .map(|(i, &x)| match x {
                    0 => Ok(false),
                    1 => Ok(true),
                    _ => err(format!(
                        "input `{}` element {i} is byte {x}; a BOOL is 0 or 1",
                        self.name
                    )),
                })
                .collect(),
        }
    }
}

/// Output tensor data.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputData {
    /// FP32 values.
    F32(Vec<f32>),
    /// FP64 values.
    F64(Vec<f64>),
}

impl OutputData {
    /// The datatype.
    pub fn datatype(&self) -> Datatype {
        match self {
            OutputData::F32(_) => Datatype::Fp32,
            OutputData::F64(_) => Datatype::Fp64,
        }
    }

    fn to_le_bytes(&self, out: &mut Vec<u8>) {
        match self {
            OutputData::F32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            OutputData::F64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
    }

    fn byte_len(&self) -> usize {
        match self {
            OutputData::F32(v) => v.len() * 4,
            OutputData::F64(v) => v.len() * 8,
        }
    }
}

/// One output tensor of a response.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputTensor {
    /// Its name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its data.
    pub data: OutputData,
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<BinaryParams>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<JsonValues<'a>>,
}

#[derive(Serialize)]
struct BinaryParams {
    binary_data_size: usize,
}

#[derive(Serialize)]
#[serde(untagged)]
enum JsonValues<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
}

#[derive(Serialize)]
struct JsonResponse<'a> {
    model_name: &'a str,
    model_version: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    outputs: Vec<JsonOutput<'a>>,
}

/// An encoded response body.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedResponse {
    /// JSON, followed by binary output data when `header_length` is set.
    pub body: Vec<u8>,
    /// The JSON length when binary data follows (the `Inference-Header-Content-Length`).
    pub header_length: Option<usize>,
}

/// Encode the outputs (already selected and ordered) with a binary flag each.
pub fn encode_response(
    model_name: &str,
    model_version: &str,
    id: Option<&str>,
    outputs: &[(OutputTensor, bool)],
) -> EncodedResponse {
    let json = JsonResponse {
        model_name,
        model_version,
        id,
        outputs: outputs
            .iter()
            .map(|(t, binary)| JsonOutput {
                name: &t.name,
                datatype: t.data.datatype().name(),
                shape: &t.shape,
                parameters: binary.then(|| BinaryParams {
                    binary_data_size: t.data.byte_len(),
                }),
                data: (!binary).then(|| match &t.data {
                    OutputData::F32(v) => JsonValues::F32(v),
                    OutputData::F64(v) => JsonValues::F64(v),
                }),
            })
            .collect(),
    };
    let mut body = serde_json::to_vec(&json).expect("response serialises");
    let any_binary = outputs.iter().any(|(_, b)| *b);
    if !any_binary {
        return EncodedResponse {
            body,
            header_length: None,
        };
    }
    let header_length = body.len();
    for (t, binary) in outputs {
        if *binary {
            t.data.to_le_bytes(&mut body);
        }
    }
    EncodedResponse {
        body,
        header_length: Some(header_length),
    }
}

/// Select the outputs a request asked for (all, in model order, when it named none) with
/// their binary flags. `available` is in model order.
pub fn select_outputs(
    request: &InferRequest,
    available: Vec<OutputTensor>,
) -> Result<Vec<(OutputTensor, bool)>, ProtocolError> {
    match &request.outputs {
        None => Ok(available
            .into_iter()
            .map(|t| (t, request.binary_data_output))
            .collect()),
        Some(wanted) => {
            let mut available: Vec<Option<OutputTensor>> =
                available.into_iter().map(Some).collect();
            let mut out = Vec::with_capacity(wanted.len());
            for w in wanted {
                let slot = available
                    .iter_mut()
                    .find(|t| t.as_ref().is_some_and(|t| t.name == w.name));
                match slot {
                    Some(t) => out.push((
                        t.take().expect("found above"),
                        w.binary.unwrap_or(request.binary_data_output),
                    )),
                    None => return err(format!("unknown output `{}` requested", w.name)),
                }
            }
            Ok(out)
        }
    }
}

/// A decoded output: name, shape, data.
pub type DecodedOutput = (String, Vec<usize>, OutputData);

/// Parse a response body (JSON, optionally followed by binary outputs) into named outputs —
/// the client side of [`encode_response`], used by the load generator and the tests.
pub fn decode_response(
    body: &[u8],
    header_length: Option<usize>,
) -> Result<(Value, Vec<DecodedOutput>), String> {
    let json_len = header_length.unwrap_or(body.len());
    if json_len > body.len() {
        return Err(format!(
            "header length {json_len} exceeds the body ({} bytes)",
            body.len()
        ));
    }
    let v: Value = serde_json::from_slice(&body[..json_len]).map_err(|e| e.to_string())?;
    let mut offset = json_len;
    let mut out = Vec::new();
    for o in v["outputs"].as_array().ok_or("no outputs array")? {
        let name = o["name"].as_str().ok_or("output without name")?.to_string();
        let shape: Vec<usize> = o["shape"]
            .as_array()
            .ok_or("output without shape")?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize).ok_or("bad dimension"))
            .collect::<Result<_, _>>()?;
        let dt = o["datatype"].as_str().ok_or("output without datatype")?;
        let data = if let Some(n) = o["parameters"]["binary_data_size"].as_u64() {
            let n = n as usize;
            let b = body
                .get(offset..offset + n)
                .ok_or("binary output beyond the body")?;
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
                other => return Err(format!("unsupported datatype {other}")),
            }
        } else {
            let data = o["data"].as_array().ok_or("output without data")?;
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
                other => return Err(format!("unsupported datatype {other}")),
            }
        };
        out.push((name, shape, data));
    }
    Ok((v, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<InferRequest, ProtocolError> {
        InferRequest::parse(Bytes::from(s.to_string()), None)
    }

    #[test]
    fn flat_and_nested_json_parse_the_same() {
        let flat = parse(r#"{"id":"a","inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2,3.5,4]}]}"#).unwrap();
        let nested = parse(r#"{"id":"a","inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3.5,4]]}]}"#).unwrap();
        assert_eq!(flat, nested);
        assert_eq!(flat.inputs[0].to_f32().unwrap(), vec![1.0, 2.0, 3.5, 4.0]);
        assert_eq!(flat.id.as_deref(), Some("a"));
    }

    #[test]
    fn binary_inputs_are_cut_from_the_body_in_order() {
        let json = r#"{"inputs":[{"name":"a","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}},{"name":"b","shape":[1],"datatype":"INT32","parameters":{"binary_data_size":4}}]}"#;
        let mut body = json.as_bytes().to_vec();
        body.extend(1.5f32.to_le_bytes());
        body.extend((-2.0f32).to_le_bytes());
        body.extend(7i32.to_le_bytes());
        let r = InferRequest::parse(Bytes::from(body), Some(&json.len().to_string())).unwrap();
        assert_eq!(r.inputs[0].to_f32().unwrap(), vec![1.5, -2.0]);
        assert_eq!(r.inputs[1].to_i32().unwrap(), vec![7]);
    }

    #[test]
    fn binary_bool_and_fp64_decode_and_bad_bools_are_refused() {
        let json = r#"{"inputs":[{"name":"b","shape":[3],"datatype":"BOOL","parameters":{"binary_data_size":3}},{"name":"d","shape":[1],"datatype":"FP64","parameters":{"binary_data_size":8}}]}"#;
        let mut body = json.as_bytes().to_vec();
        body.extend([1u8, 0, 1]);
        body.extend(0.125f64.to_le_bytes());
        let r =
            InferRequest::parse(Bytes::from(body.clone()), Some(&json.len().to_string())).unwrap();
        assert_eq!(r.inputs[0].to_bool().unwrap(), vec![true, false, true]);
        assert_eq!(r.inputs[1].to_f64().unwrap(), vec![0.125]);
        let e = r.inputs[1].to_f32().unwrap_err();
        assert!(e.0.contains("datatype FP64; expected FP32"), "{e}");
        body[json.len() + 1] = 7;
        let r = InferRequest::parse(Bytes::from(body), Some(&json.len().to_string())).unwrap();
        assert!(r.inputs[0].to_bool().unwrap_err().0.contains("byte 7"));
        let j = parse(r#"{"inputs":[{"name":"b","shape":[2],"datatype":"BOOL","data":[true,1]}]}"#)
            .unwrap();
        assert!(
            j.inputs[0]
                .to_bool()
                .unwrap_err()
                .0
                .contains("numeric elements")
        );
        let j = parse(r#"{"inputs":[{"name":"i","shape":[2],"datatype":"INT32","data":[1,2.5]}]}"#)
            .unwrap();
        assert!(
            j.inputs[0]
                .to_i32()
                .unwrap_err()
                .0
                .contains("expected an INT32")
        );
    }

    #[test]
    fn bad_requests_name_the_problem() {
        let cases = [
            (r#"{"inputs": [}"#, "malformed JSON"),
            (
                r#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]}"#,
                "has 2 data elements but shape [3] needs 3",
            ),
            (
                r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP99","data":[1]}]}"#,
                "unknown datatype `FP99`",
            ),
            (
                r#"{"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[1]}]}"#,
                "dimensions must be >= 0",
            ),
            (
                r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32"}]}"#,
                "has no data",
            ),
            (
                r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":["a"]}]}"#,
                "string elements",
            ),
            (r#"{"inputs":[]}"#, "no inputs"),
            (
                r#"{"id":3,"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#,
                "expected a string",
            ),
        ];
        for (body, want) in cases {
            let e = parse(body).unwrap_err();
            assert!(e.0.contains(want), "{body}: {e}");
        }
        let big = parse(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1e39]}]}"#)
            .unwrap();
        let e = big.inputs[0].to_f32().unwrap_err();
        assert!(e.0.contains("inf after conversion to FP32"), "{e}");
    }

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
}
