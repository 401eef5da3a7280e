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
//!
//! * [`request`] — the server parses a request body into an [`InferRequest`] (the JSON
//!   with a single-pass reader for the usual shape, `fast_json`, and serde_json for the rest);
//! * [`tensor`] — a request's input tensors and their typed decoders;
//! * [`response`] — the server selects and encodes the outputs;
//! * [`client`] — the other side: encoding requests and decoding responses, for the HTTP
//!   client, the load generator and the tests.
//!
//! This file holds what every side shares: the datatypes, the output tensors and the
//! protocol error.

use std::fmt;

pub mod client;
mod fast_json;
mod raw;
pub mod request;
pub mod response;
pub mod tensor;

pub use client::{
    DecodeError, DecodedOutput, EncodedRequest, RequestData, RequestTensor, decode_response,
    encode_request,
};
pub use request::{InferRequest, JsonReader, RequestedOutput};
pub use response::{EncodedResponse, encode_response, select_outputs};
pub use tensor::{InputData, InputTensor, JsonData};

/// The header that gives the length of the JSON part of a binary request or response.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// Most input tensors one inference request may carry (HTTP and gRPC). A kiln model takes
/// one or a few; more are refused at once, before any per-input work.
pub const MAX_INPUTS: usize = 64;

/// Most outputs one inference request may ask for (HTTP and gRPC).
pub const MAX_OUTPUTS: usize = 64;

/// Longest tensor (input or output) name a request may use, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// How much of a client's string an error message echoes, in characters.
pub const ECHO_CHARS: usize = 64;

/// Longest error message a client gets, in bytes (a safety net under [`clip`]: gRPC carries
/// the message in a header, which clients cap).
pub const MAX_MESSAGE_BYTES: usize = 2048;

/// A client-supplied string as error messages echo it: at most [`ECHO_CHARS`] characters,
/// with the full length said when it was cut.
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(ECHO_CHARS) {
        None => s.to_string(),
        Some((at, _)) => format!("{}… ({} bytes)", &s[..at], s.len()),
    }
}

/// An error message cut to [`MAX_MESSAGE_BYTES`] (at a character boundary).
pub fn bound_message(mut m: String) -> String {
    if m.len() > MAX_MESSAGE_BYTES {
        // Room for the suffix: "… (message of N bytes cut)" is at most 47 bytes.
        let mut at = MAX_MESSAGE_BYTES - 64;
        while !m.is_char_boundary(at) {
            at -= 1;
        }
        let total = m.len();
        m.truncate(at);
        m.push_str(&format!("… (message of {total} bytes cut)"));
    }
    m
}

/// Refuse a tensor name longer than [`MAX_NAME_BYTES`] (`what`: `input` or `output`).
pub fn check_name(what: &str, name: &str) -> Result<(), ProtocolError> {
    if name.len() > MAX_NAME_BYTES {
        return err(format!(
            "{what} name `{}` is {} bytes long; at most {MAX_NAME_BYTES} are accepted",
            clip(name),
            name.len()
        ));
    }
    Ok(())
}

/// Refuse more than [`MAX_INPUTS`] inputs or [`MAX_OUTPUTS`] requested outputs.
pub fn check_counts(inputs: usize, outputs: usize) -> Result<(), ProtocolError> {
    if inputs > MAX_INPUTS {
        return err(format!(
            "the request has {inputs} inputs; at most {MAX_INPUTS} are accepted per request"
        ));
    }
    if outputs > MAX_OUTPUTS {
        return err(format!(
            "the request asks for {outputs} outputs; at most {MAX_OUTPUTS} are accepted per request"
        ));
    }
    Ok(())
}

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

impl OutputTensor {
    /// The first element that is not finite, as a message naming the output, the row (the
    /// first dimension) and the column; `None` when every element is finite. A server never
    /// answers such a value (JSON would carry it as `null`).
    pub fn non_finite(&self) -> Option<String> {
        let (at, value) = match &self.data {
            OutputData::F32(v) => v
                .iter()
                .position(|x| !x.is_finite())
                .map(|i| (i, v[i] as f64)),
            OutputData::F64(v) => v.iter().position(|x| !x.is_finite()).map(|i| (i, v[i])),
        }?;
        let per_row: usize = self.shape.iter().skip(1).product::<usize>().max(1);
        Some(format!(
            "the model computed a non-finite value ({value}) for output `{}` at row {} column {} \
             (the row's inputs overflow the model's arithmetic); no answer is sent for it",
            self.name,
            at / per_row,
            at % per_row
        ))
    }
}
