//! The records' unit tests: what the server writes is the JSON it always wrote (the same keys
//! and values as the hand-built answers these types replaced), and what a reader gets back —
//! from kiln, from Triton, or from something else — is typed, defaulted or refused.

use kiln_model::model::regression::{Activation, RegressionNetConfig};
use kiln_model::preprocess::InputColumn;
use kiln_model::stats::ColumnStats;
use serde_json::json;

use super::*;

fn column(name: &str, mean: f64, std: f64) -> ColumnStats {
    ColumnStats {
        name: name.into(),
        mean,
        std,
        transform: Default::default(),
    }
}

fn regression() -> RegressionDescription {
    RegressionDescription {
        features: vec![column("a", 1.5, 2.0), column("b", -3.0, 0.5)],
        preprocessing: Some(vec![InputColumn::numeric("a")]),
        targets: vec![column("y", 10.0, 4.0)],
        architecture: RegressionNetConfig {
            n_features: 2,
            hidden: vec![8],
            n_targets: 1,
            activation: Activation::Relu,
        },
        weights_sha256: "ab".repeat(32),
        run_id: "run-1".into(),
    }
}

fn config(kiln: ModelDescription) -> ModelConfig {
    ModelConfig {
        name: "tiny".into(),
        platform: "kiln_regression".into(),
        backend: "kiln".into(),
        version_policy: VersionPolicy {
            latest: Some(LatestPolicy { num_versions: 1 }),
        },
        max_batch_size: 64,
        input: vec![ConfigTensor {
            name: "features".into(),
            data_type: "TYPE_FP32".into(),
            dims: vec![2],
        }],
        output: vec![ConfigTensor {
            name: "mean".into(),
            data_type: "TYPE_FP32".into(),
            dims: vec![1],
        }],
        dynamic_batching: DynamicBatching {
            batching: "idle".into(),
            max_queue_delay_microseconds: 100,
            preferred_batch_size: vec![1, 2, 4, 8, 16, 32, 64],
            default_queue_policy: QueuePolicy {
                max_queue_size: 1024,
                default_timeout_microseconds: 10_000_000,
            },
            other: Default::default(),
        },
        instance_group: vec![InstanceGroup {
            count: 2,
            kind: "KIND_CPU".into(),
            threads: 1,
        }],
        engine: kiln_model::records::EngineKind::Burn,
        engine_choice: None,
        version: 3,
        kiln,
    }
}

#[test]
fn the_model_configuration_writes_the_json_it_always_had() {
    let r = regression();
    // The answer as `GET /v2/models/{m}/config` built it by hand before this type.
    let before = json!({
        "name": "tiny",
        "platform": "kiln_regression",
        "backend": "kiln",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 64,
        "input": [{"name": "features", "data_type": "TYPE_FP32", "dims": [2]}],
        "output": [{"name": "mean", "data_type": "TYPE_FP32", "dims": [1]}],
        "dynamic_batching": {
            "batching": "idle",
            "max_queue_delay_microseconds": 100,
            "preferred_batch_size": [1, 2, 4, 8, 16, 32, 64],
            "default_queue_policy": {
                "max_queue_size": 1024,
                "default_timeout_microseconds": 10_000_000,
            },
        },
        "instance_group": [{"count": 2, "kind": "KIND_CPU", "threads": 1}],
        "engine": "burn",
        "engine_choice": null,
        "version": 3,
        "kiln": {
            "features": r.features,
            "preprocessing": r.preprocessing,
            "targets": r.targets,
            "architecture": r.architecture,
            "weights_sha256": r.weights_sha256,
            "run_id": r.run_id,
        },
    });
    let c = config(ModelDescription::Regression(r.clone()));
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(v, before);
    // Written through a `Value`, the bytes are the same too (keys sorted either way).
    assert_eq!(v.to_string(), before.to_string());
    // And read back into the same record.
    assert_eq!(serde_json::from_value::<ModelConfig>(v).unwrap(), c);
}

#[test]
fn a_pick_models_description_is_its_own_variant() {
    let p = PickDescription {
        targets: vec!["pts".into(), "reb".into()],
        target_corr: vec![1.0, 0.3, 0.3, 1.0],
        cross_row_corr: None,
        points: 4096,
        randomizations: 8,
        method: "genz".into(),
        max_legs: 16,
        legs_from: "moments".into(),
        features: None,
    };
    let v = serde_json::to_value(ModelDescription::Pick(p.clone())).unwrap();
    assert_eq!(
        v,
        json!({
            "targets": ["pts", "reb"],
            "target_corr": [1.0, 0.3, 0.3, 1.0],
            "cross_row_corr": null,
            "points": 4096,
            "randomizations": 8,
            "method": "genz",
            "max_legs": 16,
            "legs_from": "moments",
            "features": null,
        })
    );
    let back: ModelDescription = serde_json::from_value(v).unwrap();
    assert_eq!(back, ModelDescription::Pick(p));
    assert!(back.features().is_empty());
    // A regression description reads as one, with its features.
    let r: ModelDescription = serde_json::from_value(
        serde_json::to_value(ModelDescription::Regression(regression())).unwrap(),
    )
    .unwrap();
    assert_eq!(r.features().len(), 2);
    assert_eq!((r.features()[1].mean, r.features()[1].std), (-3.0, 0.5));
    // Anything else is kept as read, with no features.
    let other: ModelDescription = serde_json::from_value(json!({"future": 1})).unwrap();
    assert_eq!(other, ModelDescription::Other(json!({"future": 1})));
    assert!(other.features().is_empty());
}

#[test]
fn another_servers_configuration_reads_with_defaults_and_keeps_its_batching() {
    // Triton's answer for a model of its own: no `kiln`, more fields than kiln writes.
    let triton = json!({
        "name": "simple",
        "platform": "tensorflow_graphdef",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "format": "FORMAT_NONE", "dims": [16]}],
        "dynamic_batching": {
            "preferred_batch_size": [4, 8],
            "max_queue_delay_microseconds": 100,
            "preserve_ordering": false,
            "default_queue_policy": {"max_queue_size": 0, "timeout_action": "REJECT"},
        },
        "instance_group": [{"name": "simple", "kind": "KIND_CPU", "count": 1, "gpus": []}],
    });
    let c: ModelConfig = serde_json::from_value(triton).unwrap();
    assert_eq!((c.name.as_str(), c.max_batch_size), ("simple", 8));
    assert_eq!(c.input[0].dims, [16]);
    assert_eq!(c.kiln, ModelDescription::default());
    assert!(c.kiln.features().is_empty());
    assert_eq!(c.dynamic_batching.preferred_batch_size, [4, 8]);
    assert_eq!(c.dynamic_batching.other["preserve_ordering"], json!(false));
    assert_eq!(c.instance_group[0].kind, "KIND_CPU");
}

#[test]
fn statistics_read_from_kiln_or_triton_and_refuse_what_is_not_one() {
    let kiln = StatsResponse {
        model_stats: vec![ModelStats {
            name: "m".into(),
            version: "2".into(),
            last_inference: 17,
            inference_count: 12,
            execution_count: 5,
            inference_stats: InferenceStats {
                success: StatDuration { count: 6, ns: 8000 },
                ..Default::default()
            },
            batch_stats: vec![BatchStats {
                batch_size: 4,
                compute_infer: StatDuration { count: 3, ns: 900 },
                ..Default::default()
            }],
        }],
    };
    let v = serde_json::to_value(&kiln).unwrap();
    // Every figure is written, zeros included (cache_hit, cache_miss: kiln has no cache).
    assert_eq!(
        v["model_stats"][0]["inference_stats"]["cache_miss"],
        json!({"count": 0, "ns": 0})
    );
    assert_eq!(serde_json::from_value::<StatsResponse>(v).unwrap(), kiln);
    // Triton's answer carries more (and may leave out what it has not measured).
    let triton = json!({"model_stats": [{
        "name": "m", "version": "1", "inference_count": 3,
        "inference_stats": {"success": {"count": 3, "ns": 30}},
        "response_stats": {}, "memory_usage": [],
    }]});
    let t: StatsResponse = serde_json::from_value(triton).unwrap();
    assert_eq!(
        t.model_stats[0].inference_stats.success,
        StatDuration { count: 3, ns: 30 }
    );
    assert_eq!(
        t.model_stats[0].inference_stats.queue,
        StatDuration::default()
    );
    assert_eq!(t.model_stats[0].execution_count, 0);
    // An error body is not a statistics answer.
    assert!(serde_json::from_value::<StatsResponse>(json!({"error": "x"})).is_err());
}

#[test]
fn metadata_and_readiness_write_what_they_always_did() {
    let m = ModelMetadata {
        name: "tiny".into(),
        versions: vec!["1".into()],
        platform: "kiln_regression".into(),
        inputs: vec![TensorMetadata {
            name: "features".into(),
            datatype: "FP32".into(),
            shape: vec![-1, 2],
            parameters: serde_json::Map::from_iter([("features".to_string(), json!("a,b"))]),
        }],
        outputs: vec![TensorMetadata {
            name: "mean".into(),
            datatype: "FP32".into(),
            shape: vec![-1, 1],
            parameters: Default::default(),
        }],
    };
    let v = serde_json::to_value(&m).unwrap();
    assert_eq!(
        v,
        json!({
            "name": "tiny",
            "versions": ["1"],
            "platform": "kiln_regression",
            "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 2],
                        "parameters": {"features": "a,b"}}],
            // No parameters: no key.
            "outputs": [{"name": "mean", "datatype": "FP32", "shape": [-1, 1]}],
        })
    );
    assert_eq!(serde_json::from_value::<ModelMetadata>(v).unwrap(), m);
    // A tensor without a name is not metadata.
    assert!(
        serde_json::from_value::<ModelMetadata>(
            json!({"inputs": [{"datatype": "FP32", "shape": [1]}]})
        )
        .is_err()
    );
    let ready = ModelReadiness {
        name: "tiny".into(),
        ready: true,
        error: None,
    };
    assert_eq!(
        serde_json::to_value(&ready).unwrap(),
        json!({"name": "tiny", "ready": true})
    );
    assert_eq!(
        serde_json::to_value(ServerMetadata::kiln()).unwrap(),
        json!({
            "name": "kiln",
            "version": env!("CARGO_PKG_VERSION"),
            "extensions": ["binary_tensor_data", "model_configuration", "statistics", "model_repository"],
        })
    );
}
