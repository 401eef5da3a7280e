//! The server's side of a request: parse the body (JSON, optionally followed by binary
//! tensor data) into an [`InferRequest`] of validated inputs and requested outputs.

use std::collections::HashSet;

use axum::body::Bytes;
use serde_json::{Map, Value};

use super::raw::RawRequest;
use super::tensor::{InputData, InputTensor, JsonData, parse_bytes_elements};
use super::{Datatype, ProtocolError, check_counts, check_name, err};

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
    /// `parameters.priority` (Triton's): 1 is the highest level, 0 or absent the server's
    /// default level.
    pub priority: Option<u64>,
    /// `parameters.timeout` (Triton's): the request's deadline in µs, queue and compute
    /// together; 0 or absent: the server's request timeout, which also caps it.
    pub timeout_us: Option<u64>,
}

/// The scheduling parameters a request may carry: `priority` and `timeout` (µs).
pub const SCHEDULING_PARAMETERS: [&str; 2] = ["priority", "timeout"];

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

/// A request parameter that must be a non-negative integer (`priority`, `timeout`).
fn param_u64(p: &Option<Map<String, Value>>, key: &str) -> Result<Option<u64>, ProtocolError> {
    match p.as_ref().and_then(|m| m.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(other) => err(format!(
            "request parameter `{key}` is {}; expected a non-negative integer{}",
            super::clip(&other.to_string()),
            if key == "timeout" { " (µs)" } else { "" }
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

/// Which reader turns a request's JSON into fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonReader {
    /// The single-pass reader for the usual request shape, with serde_json for the rest
    /// (what the server uses).
    Fast,
    /// serde_json alone (the reference, for benchmarks and tests).
    Serde,
}

/// The JSON part of a body read into fields, with serde's message on malformed input.
fn read_json(json: &[u8], reader: JsonReader) -> Result<RawRequest, ProtocolError> {
    if reader == JsonReader::Fast
        && let Some(raw) = super::fast_json::request(json)
    {
        return Ok(raw);
    }
    serde_json::from_slice(json).map_err(|e| ProtocolError(json_error_message(&e, json)))
}

impl InferRequest {
    /// Parse a request body. `header_length` is the `Inference-Header-Content-Length` value
    /// (`None`: the whole body is JSON).
    pub fn parse(body: Bytes, header_length: Option<&str>) -> Result<Self, ProtocolError> {
        Self::parse_with(body, header_length, JsonReader::Fast)
    }

    /// [`Self::parse`] with the given JSON reader; both give the same request or error.
    pub fn parse_with(
        body: Bytes,
        header_length: Option<&str>,
        reader: JsonReader,
    ) -> Result<Self, ProtocolError> {
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
        let raw = read_json(&json, reader)?;
        let id = match raw.id {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => return err(format!("request `id` is {other}; expected a string")),
        };
        let binary_data_output =
            param_bool(&raw.parameters, "binary_data_output", "request")?.unwrap_or(false);
        let priority = param_u64(&raw.parameters, "priority")?;
        let timeout_us = param_u64(&raw.parameters, "timeout")?;
        if raw.inputs.is_empty() {
            return err("request has no inputs");
        }
        check_counts(raw.inputs.len(), raw.outputs.as_ref().map_or(0, Vec::len))?;
        let mut offset = json_len;
        let mut inputs = Vec::with_capacity(raw.inputs.len());
        let mut seen = HashSet::with_capacity(raw.inputs.len());
        for input in raw.inputs {
            let name = input.name;
            let (datatype, shape, count) =
                input_header(&name, &input.datatype, &input.shape, &mut seen)?;
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
                    if d.len() != count {
                        return err(format!(
                            "input `{name}` has {} data elements but shape {shape:?} needs {count}",
                            d.len()
                        ));
                    }
                    json_input(&name, datatype, d)?
                }
                (None, Some(n)) => {
                    // BYTES elements carry their own lengths; fixed-size types must fill
                    // the shape exactly.
                    if let Some(size) = datatype.size()
                        && n != count * size
                    {
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
                    binary_input(&name, datatype, b, count)?
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
                let mut seen = HashSet::with_capacity(outs.len());
                for o in outs {
                    check_name("output", &o.name)?;
                    if !seen.insert(o.name.clone()) {
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
            priority,
            timeout_us,
        })
    }
}

/// A tensor's binary data (HTTP's binary extension, gRPC's `raw_input_contents`) as input
/// data: a BYTES tensor's length-prefixed elements parsed into `count` strings, any other
/// datatype's bytes kept as they are (the caller checked their size).
pub(crate) fn binary_input(
    name: &str,
    datatype: Datatype,
    b: Bytes,
    count: usize,
) -> Result<InputData, ProtocolError> {
    Ok(match datatype.size() {
        None => InputData::Strings(parse_bytes_elements(name, &b, count)?),
        Some(_) => InputData::Binary(b),
    })
}

/// A JSON (or typed gRPC) tensor's elements as input data: a BYTES tensor must hold only
/// strings, any other datatype none.
pub(crate) fn json_input(
    name: &str,
    datatype: Datatype,
    d: JsonData,
) -> Result<InputData, ProtocolError> {
    if datatype == Datatype::Bytes {
        if !d.values.is_empty() {
            return err(format!(
                "input `{name}` of datatype BYTES has number or boolean elements; expected strings"
            ));
        }
        return Ok(InputData::Strings(d.strings));
    }
    if !d.strings.is_empty() {
        return err(format!(
            "input `{name}` of datatype {datatype} has string elements; expected numbers"
        ));
    }
    Ok(InputData::Json(d))
}

/// The checks every input tensor's header gets, whichever protocol carried it (JSON here,
/// gRPC in `serve::grpc`): a name of at most [`super::MAX_NAME_BYTES`] not among the names
/// `seen` so far (a hash set: linear time over the request), a known datatype, no negative
/// dimension, an element count that fits. Returns the datatype, the shape and the element
/// count.
pub(crate) fn input_header(
    name: &str,
    datatype: &str,
    shape: &[i64],
    seen: &mut HashSet<String>,
) -> Result<(Datatype, Vec<usize>, usize), ProtocolError> {
    check_name("input", name)?;
    if !seen.insert(name.to_string()) {
        return err(format!("input `{name}` is given more than once"));
    }
    let datatype = &super::clip(datatype);
    let dt = Datatype::parse(datatype).ok_or_else(|| {
        ProtocolError(format!(
            "input `{name}` has unknown datatype `{datatype}`; expected one of {}",
            Datatype::ALL.map(|(_, n)| n).join(", ")
        ))
    })?;
    let mut dims = Vec::with_capacity(shape.len());
    for &d in shape {
        if d < 0 {
            return err(format!(
                "input `{name}` has shape {shape:?}; dimensions must be >= 0 in a request"
            ));
        }
        dims.push(d as usize);
    }
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| ProtocolError(format!("input `{name}` shape {dims:?} is too large")))?;
    Ok((dt, dims, count))
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
        let names_over = format!(
            r#"{{"inputs":[{{"name":"{}","shape":[1],"datatype":"FP32","data":[1]}}]}}"#,
            "n".repeat(super::super::MAX_NAME_BYTES + 1)
        );
        let e = parse(&names_over).unwrap_err();
        assert!(e.0.contains("at most 256") && e.0.len() < 200, "{e}");
        let big = parse(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1e39]}]}"#)
            .unwrap();
        let e = big.inputs[0].to_f32().unwrap_err();
        assert!(e.0.contains("inf after conversion to FP32"), "{e}");
    }

    #[test]
    fn input_and_output_counts_are_capped_and_duplicates_found_in_linear_time() {
        use super::super::{MAX_INPUTS, MAX_OUTPUTS};
        let input =
            |k: usize| format!(r#"{{"name":"x{k}","shape":[1],"datatype":"FP32","data":[1]}}"#);
        let body = |n: usize, outs: usize| {
            let inputs: Vec<String> = (0..n).map(input).collect();
            let outputs: Vec<String> = (0..outs).map(|k| format!(r#"{{"name":"o{k}"}}"#)).collect();
            format!(
                r#"{{"inputs":[{}],"outputs":[{}]}}"#,
                inputs.join(","),
                outputs.join(",")
            )
        };
        assert!(parse(&body(MAX_INPUTS, MAX_OUTPUTS)).is_ok());
        let e = parse(&body(MAX_INPUTS + 1, 1)).unwrap_err();
        assert!(e.0.contains("has 65 inputs; at most 64"), "{e}");
        let e = parse(&body(1, MAX_OUTPUTS + 1)).unwrap_err();
        assert!(e.0.contains("asks for 65 outputs; at most 64"), "{e}");
        let dup = format!(r#"{{"inputs":[{},{}]}}"#, input(3), input(3));
        assert!(
            parse(&dup)
                .unwrap_err()
                .0
                .contains("`x3` is given more than once")
        );
        let dup_out = format!(
            r#"{{"inputs":[{}],"outputs":[{{"name":"m"}},{{"name":"m"}}]}}"#,
            input(0)
        );
        assert!(
            parse(&dup_out)
                .unwrap_err()
                .0
                .contains("`m` is requested more than once")
        );
    }

    #[test]
    fn echoed_strings_and_messages_are_clipped() {
        use super::super::{ECHO_CHARS, MAX_MESSAGE_BYTES, bound_message, clip};
        assert_eq!(clip("short"), "short");
        let long = "é".repeat(20_000);
        let c = clip(&long);
        assert!(
            c.starts_with(&"é".repeat(ECHO_CHARS)) && c.ends_with("… (40000 bytes)"),
            "{c}"
        );
        let m = bound_message("x".repeat(100_000));
        assert!(m.len() <= MAX_MESSAGE_BYTES && m.ends_with("(message of 100000 bytes cut)"));
        assert_eq!(bound_message("ok".into()), "ok");
    }
}
