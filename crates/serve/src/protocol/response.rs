//! The server's side of a response: pick the outputs a request asked for, then encode them
//! as JSON `data` or as raw little-endian bytes after the JSON (the binary extension).

use serde::Serialize;

use super::request::InferRequest;
use super::{OutputData, OutputTensor, ProtocolError, err};

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

#[cfg(test)]
mod tests {
    use super::super::request::RequestedOutput;
    use super::*;

    fn out(name: &str, v: f64) -> OutputTensor {
        OutputTensor {
            name: name.into(),
            shape: vec![1],
            data: OutputData::F64(vec![v]),
        }
    }

    fn request(outputs: Option<Vec<(&str, Option<bool>)>>, all_binary: bool) -> InferRequest {
        InferRequest {
            id: None,
            inputs: Vec::new(),
            outputs: outputs.map(|o| {
                o.into_iter()
                    .map(|(name, binary)| RequestedOutput {
                        name: name.into(),
                        binary,
                    })
                    .collect()
            }),
            binary_data_output: all_binary,
            priority: None,
            timeout_us: None,
        }
    }

    #[test]
    fn outputs_are_selected_in_request_order_with_their_binary_flags() {
        let available = || vec![out("p", 0.5), out("se", 0.01)];
        let all = select_outputs(&request(None, true), available()).unwrap();
        let names: Vec<_> = all.iter().map(|(t, b)| (t.name.as_str(), *b)).collect();
        assert_eq!(names, [("p", true), ("se", true)]);
        let some = request(Some(vec![("se", Some(true)), ("p", None)]), false);
        let picked = select_outputs(&some, available()).unwrap();
        let names: Vec<_> = picked.iter().map(|(t, b)| (t.name.as_str(), *b)).collect();
        assert_eq!(names, [("se", true), ("p", false)]);
        let e = select_outputs(&request(Some(vec![("q", None)]), false), available());
        assert!(e.unwrap_err().0.contains("unknown output `q`"));
    }

    #[test]
    fn binary_outputs_follow_the_json_in_order() {
        let outs = [(out("p", 0.5), true), (out("se", 0.25), false)];
        let enc = encode_response("m", "2", None, &outs);
        let n = enc
            .header_length
            .expect("a binary output sets the header length");
        assert_eq!(&enc.body[n..], 0.5f64.to_le_bytes());
        let json: serde_json::Value = serde_json::from_slice(&enc.body[..n]).unwrap();
        assert_eq!(json["outputs"][0]["parameters"]["binary_data_size"], 8);
        assert_eq!(json["outputs"][1]["data"][0], 0.25);
        let plain = encode_response("m", "2", None, &[(out("p", 0.5), false)]);
        assert_eq!(plain.header_length, None);
    }
}
