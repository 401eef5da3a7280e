//! What the service answers about the server and its models, as [`records`](crate::records):
//! built here once, from the loaded version and the server's settings, and mapped onto its
//! wire format by each transport (JSON over HTTP, protobuf over gRPC).

use super::{ErrorKind, Service, ServiceError};
use crate::infer::EngineKind;
use crate::model::buckets;
use crate::protocol::clip;
use crate::records::{
    DynamicBatching, InstanceGroup, LatestPolicy, ModelConfig, ModelMetadata, ModelReadiness,
    QueuePolicy, ServerMetadata, StatsResponse, VersionPolicy,
};
use crate::repository::LoadedVersion;

impl Service {
    /// The server's metadata.
    pub fn server_metadata(&self) -> ServerMetadata {
        ServerMetadata::kiln()
    }

    /// A model's metadata: the version a request names (the served one when `version` is
    /// `None`).
    pub fn model_metadata(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<ModelMetadata, ServiceError> {
        let lv = self.lookup(name, version)?;
        Ok(ModelMetadata {
            name: lv.model.clone(),
            versions: vec![lv.version.to_string()],
            platform: lv.spec.platform().to_string(),
            inputs: lv.spec.inputs.iter().map(|t| t.metadata()).collect(),
            outputs: lv.spec.outputs.iter().map(|t| t.metadata()).collect(),
        })
    }

    /// Whether a model (or one of its versions) is ready. A model that is on disk but not
    /// loaded (explicit model control, or unloaded) is known and not ready, as in Triton; one
    /// that is loading, or whose versions all failed, is not ready either. Anything else the
    /// lookup refuses (an unknown model or version) is the error.
    pub fn model_readiness(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<ModelReadiness, ServiceError> {
        let not_ready = |why: String| ModelReadiness {
            name: name.to_string(),
            ready: false,
            error: Some(why),
        };
        match self.lookup(name, version) {
            Ok(_) => Ok(ModelReadiness {
                name: name.to_string(),
                ready: true,
                error: None,
            }),
            Err(e)
                if e.kind == ErrorKind::NotFound
                    && version.is_none()
                    && self.repo.on_disk(name) =>
            {
                Ok(not_ready(format!(
                    "model `{name}` is in the repository but not loaded"
                )))
            }
            Err(e) if e.kind == ErrorKind::Unavailable => Ok(not_ready(e.message)),
            Err(e) => Err(e),
        }
    }

    /// A model's configuration (see [`ModelConfig`]).
    pub fn model_config(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<ModelConfig, ServiceError> {
        let lv = self.lookup(name, version)?;
        Ok(self.config_of(&lv))
    }

    /// The configuration of a loaded version under this server's settings.
    fn config_of(&self, lv: &LoadedVersion) -> ModelConfig {
        let cfg = self.repo.config();
        let b = &cfg.batcher;
        let preferred = buckets(b.max_batch_size);
        let engine_choice = if cfg.engine == EngineKind::Auto {
            lv.spec.auto_choice(b.threads_per_instance, &preferred)
        } else {
            None
        };
        ModelConfig {
            name: lv.model.clone(),
            platform: lv.spec.platform().to_string(),
            backend: "kiln".into(),
            version_policy: VersionPolicy {
                latest: Some(LatestPolicy { num_versions: 1 }),
            },
            max_batch_size: b.max_batch_size,
            input: lv.spec.inputs.iter().map(|t| t.config()).collect(),
            output: lv.spec.outputs.iter().map(|t| t.config()).collect(),
            dynamic_batching: DynamicBatching {
                batching: b.policy.name().to_string(),
                max_queue_delay_microseconds: b.max_queue_delay.as_micros() as u64,
                preferred_batch_size: preferred,
                default_queue_policy: QueuePolicy {
                    max_queue_size: b.max_queue_size,
                    default_timeout_microseconds: self.request_timeout.as_micros() as u64,
                },
                other: Default::default(),
            },
            instance_group: vec![InstanceGroup {
                count: b.instances,
                kind: "KIND_CPU".into(),
                threads: b.threads_per_instance,
            }],
            engine: cfg.engine,
            engine_choice,
            version: lv.version,
            kiln: lv.spec.describe(),
        }
    }

    /// Statistics of the loaded versions: of every model (`name` None), of one model, or of
    /// one version of it. An unknown model or a version that is not loaded is
    /// [`ErrorKind::NotFound`]; a version that is not a number,
    /// [`ErrorKind::InvalidArgument`].
    pub fn statistics(
        &self,
        name: Option<&str>,
        version: Option<&str>,
    ) -> Result<StatsResponse, ServiceError> {
        let repo = &self.repo;
        let of = |lv: &LoadedVersion| lv.metrics.statistics(&lv.model, lv.version);
        let Some(name) = name else {
            let model_stats = repo
                .names()
                .iter()
                .filter_map(|n| repo.get(n)?.current())
                .map(|lv| of(&lv))
                .collect();
            return Ok(StatsResponse { model_stats });
        };
        let not_found = |m: String| ServiceError::new(ErrorKind::NotFound, m);
        let slot = repo.get(name).ok_or_else(|| {
            not_found(format!("unknown model `{}`: it is not loaded", clip(name)))
        })?;
        let current = slot.current();
        let lv = match version {
            None => {
                current.ok_or_else(|| not_found(format!("model `{name}` has no version loaded")))?
            }
            Some(v) => {
                let Ok(v) = v.parse::<u64>() else {
                    return Err(ServiceError::new(
                        ErrorKind::InvalidArgument,
                        format!(
                            "model `{name}` has no version `{}` (versions are numbers)",
                            clip(v)
                        ),
                    ));
                };
                current
                    .filter(|c| c.version == v)
                    .ok_or_else(|| not_found(format!("model `{name}` version {v} is not loaded")))?
            }
        };
        Ok(StatsResponse {
            model_stats: vec![of(&lv)],
        })
    }
}
