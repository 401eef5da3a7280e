//! Unit tests of the gRPC rooms: the `grpc-timeout` header, the records' protobuf mappings.

use super::conn::grpc_timeout;
use std::time::Duration;
use tonic::codegen::http::{HeaderMap, HeaderValue};

fn timeout(v: &str) -> Result<Option<Duration>, String> {
    let mut h = HeaderMap::new();
    h.insert("grpc-timeout", HeaderValue::from_str(v).unwrap());
    grpc_timeout(&h)
}

#[test]
fn grpc_timeout_reads_every_unit() {
    assert_eq!(grpc_timeout(&HeaderMap::new()), Ok(None));
    let cases = [
        ("2H", Duration::from_secs(7200)),
        ("3M", Duration::from_secs(180)),
        ("10S", Duration::from_secs(10)),
        ("250m", Duration::from_millis(250)),
        ("75u", Duration::from_micros(75)),
        ("99999999n", Duration::from_nanos(99_999_999)),
        ("0S", Duration::ZERO),
        ("00000001m", Duration::from_millis(1)),
    ];
    for (text, want) in cases {
        assert_eq!(timeout(text), Ok(Some(want)), "{text}");
    }
}

#[test]
fn grpc_timeout_refuses_what_the_spec_does_not_allow() {
    // No unit, no digits, nine digits, an unknown unit, a sign, a space, a decimal point.
    for text in [
        "",
        "5",
        "S",
        "123456789S",
        "10x",
        "10s",
        "-1S",
        "1 S",
        "1.5S",
    ] {
        assert_eq!(timeout(text), Err(text.to_string()), "{text:?}");
    }
    // A long header is echoed clipped, with its length.
    let long = "9".repeat(5000) + "S";
    let echoed = timeout(&long).unwrap_err();
    assert!(
        echoed.len() < 100 && echoed.ends_with("(5001 bytes)"),
        "{echoed}"
    );
}

mod records_on_the_wire {
    use serde_json::json;

    use super::super::proto::{self as pb, DataType};
    use crate::protocol::Datatype;
    use crate::records::{
        BatchStats, ConfigTensor, DynamicBatching, InferenceStats, InstanceGroup, LatestPolicy,
        ModelConfig, ModelDescription, ModelStats, QueuePolicy, StatDuration, StatsResponse,
        VersionPolicy,
    };

    fn config() -> ModelConfig {
        ModelConfig {
            name: "tiny".into(),
            platform: "kiln_regression".into(),
            backend: "kiln".into(),
            version_policy: VersionPolicy {
                latest: Some(LatestPolicy { num_versions: 1 }),
            },
            max_batch_size: 64,
            input: Datatype::ALL
                .iter()
                .map(|(d, n)| ConfigTensor {
                    name: n.to_string(),
                    data_type: d.config_name(),
                    dims: vec![3],
                })
                .collect(),
            output: vec![ConfigTensor {
                name: "mean".into(),
                data_type: "TYPE_FP32".into(),
                dims: vec![2],
            }],
            dynamic_batching: DynamicBatching {
                batching: "delay".into(),
                max_queue_delay_microseconds: 250,
                preferred_batch_size: vec![1, 2, 4],
                default_queue_policy: QueuePolicy {
                    max_queue_size: 9,
                    default_timeout_microseconds: 5_000,
                },
                other: Default::default(),
            },
            instance_group: vec![InstanceGroup {
                count: 2,
                kind: "KIND_CPU".into(),
                threads: 3,
            }],
            engine: kiln_model::records::EngineKind::Fused,
            engine_choice: None,
            version: 4,
            kiln: ModelDescription::Other(json!({"z": 1, "a": [2]})),
        }
    }

    #[test]
    fn every_datatype_is_tritons_enum_value() {
        let p = pb::ModelConfig::from(&config());
        let want = [
            DataType::TypeBool,
            DataType::TypeUint8,
            DataType::TypeUint16,
            DataType::TypeUint32,
            DataType::TypeUint64,
            DataType::TypeInt8,
            DataType::TypeInt16,
            DataType::TypeInt32,
            DataType::TypeInt64,
            DataType::TypeFp16,
            DataType::TypeFp32,
            DataType::TypeFp64,
            DataType::TypeString,
        ];
        let got: Vec<i32> = p.input.iter().map(|t| t.data_type).collect();
        assert_eq!(got, want.map(|d| d as i32));
    }

    #[test]
    fn the_configuration_maps_onto_protobuf_and_back() {
        let c = config();
        let p = pb::ModelConfig::from(&c);
        assert_eq!(p.max_batch_size, 64);
        assert_eq!(p.instance_group[0].count, 2);
        assert_eq!(
            p.instance_group[0].kind,
            pb::model_instance_group::Kind::Cpu as i32
        );
        // kiln's description: its JSON with sorted keys, as the HTTP answer writes it.
        assert_eq!(p.parameters["kiln"].string_value, r#"{"a":[2],"z":1}"#);
        assert_eq!(p.parameters["engine"].string_value, "fused");
        assert_eq!(p.parameters["batching"].string_value, "delay");
        match &p.scheduling_choice {
            Some(pb::model_config::SchedulingChoice::DynamicBatching(d)) => {
                assert_eq!(d.preferred_batch_size, [1, 2, 4]);
                assert_eq!(d.max_queue_delay_microseconds, 250);
                let q = d.default_queue_policy.unwrap();
                assert_eq!(
                    (q.max_queue_size, q.default_timeout_microseconds),
                    (9, 5_000)
                );
            }
            None => panic!("no dynamic batching"),
        }
        // Back: everything the message carries; threads, the engine choice and the version
        // do not travel.
        let back = ModelConfig::from(&p);
        let mut want = c.clone();
        want.instance_group[0].threads = 0;
        want.version = 0;
        assert_eq!(back, want);
    }

    #[test]
    fn statistics_map_onto_protobuf_and_back() {
        let d = |count, ns| StatDuration { count, ns };
        let s = StatsResponse {
            model_stats: vec![ModelStats {
                name: "m".into(),
                version: "1".into(),
                last_inference: 99,
                inference_count: 10,
                execution_count: 4,
                inference_stats: InferenceStats {
                    success: d(5, 500),
                    fail: d(1, 7),
                    queue: d(5, 50),
                    compute_input: d(5, 5),
                    compute_infer: d(5, 250),
                    compute_output: d(5, 6),
                    cache_hit: d(0, 0),
                    cache_miss: d(0, 0),
                },
                batch_stats: vec![BatchStats {
                    batch_size: 2,
                    compute_input: d(4, 1),
                    compute_infer: d(4, 2),
                    compute_output: d(4, 3),
                }],
            }],
        };
        let p = pb::ModelStatisticsResponse::from(s.clone());
        let i = p.model_stats[0].inference_stats.unwrap();
        assert_eq!(i.compute_infer.unwrap().ns, 250);
        assert_eq!(
            p.model_stats[0].batch_stats[0]
                .compute_output
                .unwrap()
                .count,
            4
        );
        assert_eq!(StatsResponse::from(&p), s);
        // A message without durations reads as zeros.
        let bare = pb::ModelStatisticsResponse {
            model_stats: vec![pb::ModelStatistics {
                name: "m".into(),
                ..Default::default()
            }],
        };
        assert_eq!(
            StatsResponse::from(&bare).model_stats[0].inference_stats,
            InferenceStats::default()
        );
    }
}
