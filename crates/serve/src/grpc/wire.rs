//! The wire format: protobuf messages to and from the service's types. A `ModelInferRequest`
//! becomes the protocol layer's [`InferRequest`] (the same checks and messages as a JSON or
//! binary HTTP body), selected outputs become a `ModelInferResponse`, a [`ServiceError`] a
//! gRPC [`Status`]; the service's [`records`](crate::records) (server and model metadata, the
//! model configuration, statistics) map onto their messages, and back where a client reads
//! them (`kiln loadtest --protocol grpc`). The protobuf codec ([`Codec`]) lives here too.

use std::collections::{HashMap, HashSet};

use prost::bytes::Bytes;
use tonic::Status;

use super::proto::*;
use crate::protocol::request::{binary_input, input_header, json_input};
use crate::protocol::{
    Datatype, InferRequest, InputTensor, JsonData, OutputData, OutputTensor, RequestedOutput,
    bound_message, check_counts, check_name,
};
use crate::records;
use crate::repository::{IndexEntry, LoadedVersion};
use crate::service::{ErrorKind, LoadParameter, ServiceError};

/// The protobuf codec of the generated server and client: tonic-prost's, with 1 KiB first
/// buffers instead of its 8 KiB. tonic allocates an encode and a decode buffer per RPC; 8 KiB
/// is past glibc's per-thread cache (1 KiB is not), and a KServe request or answer of a few
/// rows fits in 1 KiB; larger ones grow the buffer as before. Under perf_analyzer at batch 1,
/// concurrency 4 it gave +7 % infer/s (median of three alternating runs, `benches/README.md`).
pub struct Codec<T, U>(std::marker::PhantomData<fn(T) -> U>);

/// First size of [`Codec`]'s buffers.
const CODEC_BUFFER_BYTES: usize = 1024;

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = tonic_prost::ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(codec_buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(codec_buffers())
    }
}

fn codec_buffers() -> tonic::codec::BufferSettings {
    // tonic's own yield threshold (32 KiB): streamed answers are batched into sends as before.
    tonic::codec::BufferSettings::new(CODEC_BUFFER_BYTES, 32 * 1024)
}

/// The gRPC status of a service error.
pub fn status_of(e: ServiceError) -> Status {
    let m = bound_message(e.message);
    match e.kind {
        ErrorKind::InvalidArgument => Status::invalid_argument(m),
        ErrorKind::NotFound => Status::not_found(m),
        ErrorKind::Unavailable => Status::unavailable(m),
        ErrorKind::QueueFull => Status::resource_exhausted(m),
        ErrorKind::Timeout => Status::deadline_exceeded(m),
        ErrorKind::Internal => Status::internal(m),
        ErrorKind::Unauthenticated => Status::unauthenticated(m),
        ErrorKind::PermissionDenied => Status::permission_denied(m),
    }
}

/// An empty version (or id) field as `None`.
pub(super) fn version_of(v: &str) -> Option<&str> {
    (!v.is_empty()).then_some(v)
}

/// The server's metadata as `ServerMetadataResponse`.
impl From<records::ServerMetadata> for ServerMetadataResponse {
    fn from(m: records::ServerMetadata) -> Self {
        Self {
            name: m.name,
            version: m.version,
            extensions: m.extensions,
        }
    }
}

impl From<records::TensorMetadata> for model_metadata_response::TensorMetadata {
    fn from(t: records::TensorMetadata) -> Self {
        Self {
            name: t.name,
            datatype: t.datatype,
            shape: t.shape,
        }
    }
}

/// A model's metadata as `ModelMetadataResponse` (tensor parameters have no field there).
impl From<records::ModelMetadata> for ModelMetadataResponse {
    fn from(m: records::ModelMetadata) -> Self {
        Self {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: m.inputs.into_iter().map(Into::into).collect(),
            outputs: m.outputs.into_iter().map(Into::into).collect(),
        }
    }
}

/// The client's side: a `ModelMetadataResponse` as the record the HTTP answer reads into.
impl From<ModelMetadataResponse> for records::ModelMetadata {
    fn from(m: ModelMetadataResponse) -> Self {
        let tensor = |t: model_metadata_response::TensorMetadata| records::TensorMetadata {
            name: t.name,
            datatype: t.datatype,
            shape: t.shape,
            parameters: Default::default(),
        };
        Self {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: m.inputs.into_iter().map(tensor).collect(),
            outputs: m.outputs.into_iter().map(tensor).collect(),
        }
    }
}

/// A count or size clamped into protobuf's `int32`.
fn int32(n: usize) -> i32 {
    n.min(i32::MAX as usize) as i32
}

/// Triton's `DataType` of a configuration datatype name (`TYPE_FP32`, …).
fn config_datatype(name: &str) -> i32 {
    DataType::from_str_name(name).unwrap_or(DataType::TypeInvalid) as i32
}

/// The model configuration as Triton's protobuf `ModelConfig`. What the message has no field
/// for travels as parameters: kiln's description as the JSON string of `kiln` (the JSON
/// answer's `kiln` object), the engine as `engine`, the batching policy as `batching`; the
/// threads per instance, the `auto` engine's choice and the version are not sent.
impl From<&records::ModelConfig> for ModelConfig {
    fn from(c: &records::ModelConfig) -> Self {
        let b = &c.dynamic_batching;
        let param = |v: String| ModelParameter { string_value: v };
        // Through a `Value`, as the JSON answer: its keys sorted.
        let kiln = serde_json::to_value(&c.kiln)
            .map(|v| v.to_string())
            .unwrap_or_default();
        let parameters = HashMap::from([
            ("kiln".to_string(), param(kiln)),
            ("engine".to_string(), param(c.engine.to_string())),
            ("batching".to_string(), param(b.batching.clone())),
        ]);
        let tensor = |t: &records::ConfigTensor| {
            (
                t.name.clone(),
                config_datatype(&t.data_type),
                t.dims.clone(),
            )
        };
        ModelConfig {
            name: c.name.clone(),
            platform: c.platform.clone(),
            backend: c.backend.clone(),
            version_policy: c.version_policy.latest.map(|l| ModelVersionPolicy {
                policy_choice: Some(model_version_policy::PolicyChoice::Latest(
                    model_version_policy::Latest {
                        num_versions: l.num_versions,
                    },
                )),
            }),
            max_batch_size: int32(c.max_batch_size),
            input: c
                .input
                .iter()
                .map(tensor)
                .map(|(name, data_type, dims)| ModelInput {
                    name,
                    data_type,
                    dims,
                })
                .collect(),
            output: c
                .output
                .iter()
                .map(tensor)
                .map(|(name, data_type, dims)| ModelOutput {
                    name,
                    data_type,
                    dims,
                })
                .collect(),
            instance_group: c
                .instance_group
                .iter()
                .map(|g| ModelInstanceGroup {
                    name: String::new(),
                    count: int32(g.count),
                    kind: model_instance_group::Kind::from_str_name(&g.kind)
                        .unwrap_or(model_instance_group::Kind::Auto)
                        as i32,
                })
                .collect(),
            scheduling_choice: Some(model_config::SchedulingChoice::DynamicBatching(
                ModelDynamicBatching {
                    preferred_batch_size: b
                        .preferred_batch_size
                        .iter()
                        .map(|&n| int32(n))
                        .collect(),
                    max_queue_delay_microseconds: b.max_queue_delay_microseconds,
                    preserve_ordering: false,
                    default_queue_policy: Some(ModelQueuePolicy {
                        timeout_action: 0,
                        default_timeout_microseconds: b
                            .default_queue_policy
                            .default_timeout_microseconds,
                        allow_timeout_override: false,
                        max_queue_size: b.default_queue_policy.max_queue_size.min(u32::MAX as usize)
                            as u32,
                    }),
                },
            )),
            parameters,
        }
    }
}

/// The client's side: a protobuf `ModelConfig` as the record (what the message does not carry
/// — threads per instance, the `auto` engine's choice, the version — stays at its default; a
/// `kiln` parameter that is not kiln's description reads as [`records::ModelDescription::Other`]).
impl From<&ModelConfig> for records::ModelConfig {
    fn from(c: &ModelConfig) -> Self {
        let param = |k: &str| c.parameters.get(k).map(|p| p.string_value.clone());
        let tensor = |name: &str, data_type: i32, dims: &[i64]| records::ConfigTensor {
            name: name.to_string(),
            data_type: DataType::try_from(data_type)
                .unwrap_or(DataType::TypeInvalid)
                .as_str_name()
                .to_string(),
            dims: dims.to_vec(),
        };
        let batching = match &c.scheduling_choice {
            Some(model_config::SchedulingChoice::DynamicBatching(d)) => records::DynamicBatching {
                batching: param("batching").unwrap_or_default(),
                max_queue_delay_microseconds: d.max_queue_delay_microseconds,
                preferred_batch_size: d
                    .preferred_batch_size
                    .iter()
                    .map(|&n| n.max(0) as usize)
                    .collect(),
                default_queue_policy: d
                    .default_queue_policy
                    .map(|q| records::QueuePolicy {
                        max_queue_size: q.max_queue_size as usize,
                        default_timeout_microseconds: q.default_timeout_microseconds,
                    })
                    .unwrap_or_default(),
                other: Default::default(),
            },
            None => records::DynamicBatching::default(),
        };
        let latest = match c
            .version_policy
            .as_ref()
            .and_then(|v| v.policy_choice.as_ref())
        {
            Some(model_version_policy::PolicyChoice::Latest(l)) => Some(records::LatestPolicy {
                num_versions: l.num_versions,
            }),
            _ => None,
        };
        Self {
            name: c.name.clone(),
            platform: c.platform.clone(),
            backend: c.backend.clone(),
            version_policy: records::VersionPolicy { latest },
            max_batch_size: c.max_batch_size.max(0) as usize,
            input: c
                .input
                .iter()
                .map(|t| tensor(&t.name, t.data_type, &t.dims))
                .collect(),
            output: c
                .output
                .iter()
                .map(|t| tensor(&t.name, t.data_type, &t.dims))
                .collect(),
            dynamic_batching: batching,
            instance_group: c
                .instance_group
                .iter()
                .map(|g| records::InstanceGroup {
                    count: g.count.max(0) as usize,
                    kind: model_instance_group::Kind::try_from(g.kind)
                        .unwrap_or(model_instance_group::Kind::Auto)
                        .as_str_name()
                        .to_string(),
                    threads: 0,
                })
                .collect(),
            engine: param("engine")
                .and_then(|e| e.parse().ok())
                .unwrap_or_default(),
            engine_choice: None,
            version: 0,
            kiln: param("kiln")
                .and_then(|k| serde_json::from_str(&k).ok())
                .unwrap_or_default(),
        }
    }
}

fn duration(d: &records::StatDuration) -> Option<StatisticDuration> {
    Some(StatisticDuration {
        count: d.count,
        ns: d.ns,
    })
}

fn stat(d: &Option<StatisticDuration>) -> records::StatDuration {
    d.as_ref()
        .map(|d| records::StatDuration {
            count: d.count,
            ns: d.ns,
        })
        .unwrap_or_default()
}

/// The statistics extension's answer (`GET /v2/models/.../stats`) as protobuf.
impl From<records::StatsResponse> for ModelStatisticsResponse {
    fn from(r: records::StatsResponse) -> Self {
        let model_stats = r
            .model_stats
            .into_iter()
            .map(|m| {
                let i = &m.inference_stats;
                ModelStatistics {
                    name: m.name,
                    version: m.version,
                    last_inference: m.last_inference,
                    inference_count: m.inference_count,
                    execution_count: m.execution_count,
                    inference_stats: Some(InferStatistics {
                        success: duration(&i.success),
                        fail: duration(&i.fail),
                        queue: duration(&i.queue),
                        compute_input: duration(&i.compute_input),
                        compute_infer: duration(&i.compute_infer),
                        compute_output: duration(&i.compute_output),
                        cache_hit: duration(&i.cache_hit),
                        cache_miss: duration(&i.cache_miss),
                    }),
                    batch_stats: m
                        .batch_stats
                        .iter()
                        .map(|b| InferBatchStatistics {
                            batch_size: b.batch_size,
                            compute_input: duration(&b.compute_input),
                            compute_infer: duration(&b.compute_infer),
                            compute_output: duration(&b.compute_output),
                        })
                        .collect(),
                }
            })
            .collect();
        ModelStatisticsResponse { model_stats }
    }
}

/// The client's side: a `ModelStatisticsResponse` as the record the HTTP answer reads into
/// (an absent duration is zero).
impl From<&ModelStatisticsResponse> for records::StatsResponse {
    fn from(r: &ModelStatisticsResponse) -> Self {
        let model_stats = r
            .model_stats
            .iter()
            .map(|m| {
                let i = m.inference_stats.unwrap_or_default();
                records::ModelStats {
                    name: m.name.clone(),
                    version: m.version.clone(),
                    last_inference: m.last_inference,
                    inference_count: m.inference_count,
                    execution_count: m.execution_count,
                    inference_stats: records::InferenceStats {
                        success: stat(&i.success),
                        fail: stat(&i.fail),
                        queue: stat(&i.queue),
                        compute_input: stat(&i.compute_input),
                        compute_infer: stat(&i.compute_infer),
                        compute_output: stat(&i.compute_output),
                        cache_hit: stat(&i.cache_hit),
                        cache_miss: stat(&i.cache_miss),
                    },
                    batch_stats: m
                        .batch_stats
                        .iter()
                        .map(|b| records::BatchStats {
                            batch_size: b.batch_size,
                            compute_input: stat(&b.compute_input),
                            compute_infer: stat(&b.compute_infer),
                            compute_output: stat(&b.compute_output),
                        })
                        .collect(),
                }
            })
            .collect();
        records::StatsResponse { model_stats }
    }
}

/// A load request's parameters as the service checks them (a bytes value as UTF-8 text).
pub(super) fn load_parameters(
    p: HashMap<String, ModelRepositoryParameter>,
) -> Vec<(String, LoadParameter)> {
    use model_repository_parameter::ParameterChoice as C;
    p.into_iter()
        .map(|(k, v)| {
            let p = match v.parameter_choice {
                Some(C::StringParam(t)) => LoadParameter::Text(t),
                Some(C::BytesParam(b)) => {
                    LoadParameter::Text(String::from_utf8_lossy(&b).into_owned())
                }
                other => LoadParameter::Other(format!("{other:?}")),
            };
            (k, p)
        })
        .collect()
}

/// The repository index as `RepositoryIndexResponse`.
pub(super) fn repository_index(entries: Vec<IndexEntry>) -> RepositoryIndexResponse {
    RepositoryIndexResponse {
        models: entries
            .into_iter()
            .map(|e| repository_index_response::ModelIndex {
                name: e.name,
                version: e.version.unwrap_or_default(),
                state: e.state,
                reason: e.reason,
            })
            .collect(),
    }
}

fn bad(msg: impl Into<String>) -> Status {
    Status::invalid_argument(bound_message(msg.into()))
}

fn param_bool(p: &HashMap<String, InferParameter>, key: &str) -> Result<Option<bool>, Status> {
    match p.get(key).and_then(|v| v.parameter_choice.as_ref()) {
        None => Ok(None),
        Some(infer_parameter::ParameterChoice::BoolParam(b)) => Ok(Some(*b)),
        Some(other) => Err(bad(format!(
            "request parameter `{key}` is {other:?}; expected a bool_param"
        ))),
    }
}

/// A request parameter that must be a non-negative integer (`priority`, `timeout`):
/// tritonclient sends `uint64_param` for the priority and `int64_param` for the timeout.
fn param_u64(p: &HashMap<String, InferParameter>, key: &str) -> Result<Option<u64>, Status> {
    use infer_parameter::ParameterChoice as C;
    match p.get(key).and_then(|v| v.parameter_choice.as_ref()) {
        None => Ok(None),
        Some(C::Uint64Param(v)) => Ok(Some(*v)),
        Some(C::Int64Param(v)) if *v >= 0 => Ok(Some(*v as u64)),
        Some(other) => Err(bad(format!(
            "request parameter `{key}` is {other:?}; expected a non-negative uint64_param or int64_param{}",
            if key == "timeout" { " (µs)" } else { "" }
        ))),
    }
}

/// Typed contents as the JSON path holds them: row-major values, booleans as 0/1.
fn typed_values(
    name: &str,
    datatype: Datatype,
    c: InferTensorContents,
) -> Result<JsonData, Status> {
    let nums = |values: Vec<f64>| JsonData {
        values,
        has_bool: false,
        has_number: true,
        strings: Vec::new(),
    };
    Ok(match datatype {
        Datatype::Bool => JsonData {
            values: c
                .bool_contents
                .iter()
                .map(|&b| if b { 1.0 } else { 0.0 })
                .collect(),
            has_bool: true,
            has_number: false,
            strings: Vec::new(),
        },
        Datatype::Fp32 => nums(c.fp32_contents.iter().map(|&x| x as f64).collect()),
        Datatype::Fp64 => nums(c.fp64_contents),
        Datatype::I8 | Datatype::I16 | Datatype::I32 => {
            nums(c.int_contents.iter().map(|&x| x as f64).collect())
        }
        Datatype::I64 => nums(c.int64_contents.iter().map(|&x| x as f64).collect()),
        Datatype::U8 | Datatype::U16 | Datatype::U32 => {
            nums(c.uint_contents.iter().map(|&x| x as f64).collect())
        }
        Datatype::U64 => nums(c.uint64_contents.iter().map(|&x| x as f64).collect()),
        Datatype::Fp16 => {
            return Err(bad(format!(
                "input `{name}`: FP16 has no typed contents; send it in raw_input_contents"
            )));
        }
        Datatype::Bytes => JsonData {
            strings: c
                .bytes_contents
                .into_iter()
                .enumerate()
                .map(|(i, b)| {
                    String::from_utf8(b).map_err(|_| {
                        bad(format!(
                            "input `{name}`: BYTES element {i} is not UTF-8 text"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
            ..JsonData::default()
        },
    })
}

/// The typed-contents field a datatype's values go in (for error messages).
fn contents_field(d: Datatype) -> &'static str {
    match d {
        Datatype::Bool => "bool_contents",
        Datatype::Fp32 => "fp32_contents",
        Datatype::Fp64 => "fp64_contents",
        Datatype::I8 | Datatype::I16 | Datatype::I32 => "int_contents",
        Datatype::I64 => "int64_contents",
        Datatype::U8 | Datatype::U16 | Datatype::U32 => "uint_contents",
        Datatype::U64 => "uint64_contents",
        Datatype::Fp16 | Datatype::Bytes => "bytes_contents",
    }
}

/// A `ModelInferRequest` as the protocol layer's [`InferRequest`]: the same checks as a JSON
/// or binary HTTP body gets, with the same messages where they apply.
pub fn parse_request(r: ModelInferRequest) -> Result<InferRequest, Status> {
    if r.inputs.is_empty() {
        return Err(bad("request has no inputs"));
    }
    let raw = !r.raw_input_contents.is_empty();
    if raw && r.raw_input_contents.len() != r.inputs.len() {
        return Err(bad(format!(
            "raw_input_contents has {} entries but the request has {} inputs; send one per input, in input order",
            r.raw_input_contents.len(),
            r.inputs.len()
        )));
    }
    check_counts(r.inputs.len(), r.outputs.len()).map_err(|e| bad(e.0))?;
    let binary_data_output = param_bool(&r.parameters, "binary_data_output")?.unwrap_or(true);
    let priority = param_u64(&r.parameters, "priority")?;
    let timeout_us = param_u64(&r.parameters, "timeout")?;
    let mut raw_contents = r.raw_input_contents.into_iter();
    let mut inputs: Vec<InputTensor> = Vec::with_capacity(r.inputs.len());
    let mut seen = HashSet::with_capacity(r.inputs.len());
    for input in r.inputs {
        let name = input.name;
        let raw_bytes = raw_contents.next();
        let (datatype, shape, count) =
            input_header(&name, &input.datatype, &input.shape, &mut seen).map_err(|e| bad(e.0))?;
        let data = match (raw_bytes, input.contents) {
            (Some(_), Some(_)) => {
                return Err(bad(format!(
                    "input `{name}` has both typed contents and raw_input_contents; send one"
                )));
            }
            (Some(b), None) => {
                if let Some(size) = datatype.size()
                    && b.len() != count * size
                {
                    return Err(bad(format!(
                        "input `{name}` has {} bytes in raw_input_contents but shape {shape:?} of {datatype} needs {}",
                        b.len(),
                        count * size
                    )));
                }
                binary_input(&name, datatype, b, count).map_err(|e| bad(e.0))?
            }
            (None, Some(c)) => {
                let d = typed_values(&name, datatype, c)?;
                if d.len() != count {
                    return Err(bad(format!(
                        "input `{name}` has {} elements in contents.{} but shape {shape:?} needs {count}",
                        d.len(),
                        contents_field(datatype)
                    )));
                }
                json_input(&name, datatype, d).map_err(|e| bad(e.0))?
            }
            (None, None) => {
                return Err(bad(format!(
                    "input `{name}` has no data: expected typed contents or raw_input_contents"
                )));
            }
        };
        inputs.push(InputTensor {
            name,
            datatype,
            shape,
            data,
        });
    }
    let outputs = if r.outputs.is_empty() {
        None
    } else {
        let mut seen = HashSet::with_capacity(r.outputs.len());
        let mut v = Vec::with_capacity(r.outputs.len());
        for o in r.outputs {
            check_name("output", &o.name).map_err(|e| bad(e.0))?;
            if !seen.insert(o.name.clone()) {
                return Err(bad(format!(
                    "output `{}` is requested more than once",
                    o.name
                )));
            }
            v.push(RequestedOutput {
                name: o.name,
                binary: None,
            });
        }
        Some(v)
    };
    Ok(InferRequest {
        id: version_of(&r.id).map(str::to_string),
        inputs,
        outputs,
        binary_data_output,
        priority,
        timeout_us,
    })
}

fn le_bytes(d: &OutputData) -> Bytes {
    let mut out = Vec::new();
    match d {
        OutputData::F32(v) => {
            out.reserve(v.len() * 4);
            v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        OutputData::F64(v) => {
            out.reserve(v.len() * 8);
            v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
    }
    Bytes::from(out)
}

/// Encode the selected outputs: all raw (`raw_output_contents`) or all typed.
pub fn encode_response(
    lv: &LoadedVersion,
    id: Option<&str>,
    outputs: Vec<(OutputTensor, bool)>,
    raw: bool,
) -> ModelInferResponse {
    let mut resp = ModelInferResponse {
        model_name: lv.model.clone(),
        model_version: lv.version.to_string(),
        id: id.unwrap_or_default().to_string(),
        ..Default::default()
    };
    for (t, _) in outputs {
        let contents = if raw {
            resp.raw_output_contents.push(le_bytes(&t.data));
            None
        } else {
            Some(match &t.data {
                OutputData::F32(v) => InferTensorContents {
                    fp32_contents: v.clone(),
                    ..Default::default()
                },
                OutputData::F64(v) => InferTensorContents {
                    fp64_contents: v.clone(),
                    ..Default::default()
                },
            })
        };
        resp.outputs.push(model_infer_response::InferOutputTensor {
            name: t.name,
            datatype: t.data.datatype().name().to_string(),
            shape: t.shape.iter().map(|&d| d as i64).collect(),
            parameters: Default::default(),
            contents,
        });
    }
    resp
}
