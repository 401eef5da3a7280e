//! The control operations' rules, shared by both transports: who may call them (a bearer
//! token, or a loopback client whose request no proxy relayed) and which load parameters a
//! repository load accepts.

use std::net::IpAddr;

use super::{ErrorKind, Service, ServiceError};
use crate::protocol::clip;

/// The request headers (HTTP) or metadata keys (gRPC) a proxy adds: a request carrying any
/// of them was relayed, so its TCP peer says nothing about the client, and without a control
/// token it may not call a control operation.
pub const PROXY_HEADERS: [&str; 3] = ["forwarded", "x-forwarded-for", "x-real-ip"];

/// One parameter of a repository load request (HTTP `parameters`, gRPC
/// `RepositoryModelLoadRequest.parameters`).
#[derive(Debug, Clone, PartialEq)]
pub enum LoadParameter {
    /// A string (or bytes) value.
    Text(String),
    /// Any other value, as text for the message.
    Other(String),
}

/// Which transport asks, for the wording of the control operations' refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// HTTP (the `Authorization` header).
    Http,
    /// gRPC (the `authorization` metadata).
    Grpc,
}

/// Whether an `Authorization` value (HTTP header or gRPC metadata) is `Bearer <token>`,
/// compared in time independent of where the first difference is.
pub fn bearer_matches(authorization: Option<&str>, token: &str) -> bool {
    authorization
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|g| {
            g.len() == token.len()
                && g.bytes()
                    .zip(token.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        })
}

impl Service {
    /// Whether a control operation (repository index, load, unload; profiling) may proceed:
    /// with a control token, the caller must present it as `Bearer <token>`; without one,
    /// only loopback peers may call.
    ///
    /// `proxied` names the proxy header ([`PROXY_HEADERS`]) the request carries, if any: such
    /// a request is not a loopback client's whatever its peer address.
    pub fn authorize_control(
        &self,
        authorization: Option<&str>,
        peer: Option<IpAddr>,
        proxied: Option<&str>,
        transport: Transport,
    ) -> Result<(), ServiceError> {
        let (what, how) = match transport {
            Transport::Http => (
                "control endpoint",
                "`Authorization: Bearer <token>` (the token given to --control-token)",
            ),
            Transport::Grpc => (
                "control RPC",
                "`authorization: Bearer <token>` metadata (the token given to --control-token)",
            ),
        };
        match &self.control_token {
            Some(token) if bearer_matches(authorization, token) => Ok(()),
            Some(_) => Err(ServiceError::new(
                ErrorKind::Unauthenticated,
                format!("this {what} needs {how}"),
            )),
            None => match (peer, proxied) {
                (_, Some(h)) => Err(ServiceError::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "{what}s answer loopback clients only, and this request came through a \
                         proxy (it carries `{h}`), so its client is not known to be local; start \
                         kiln serve with --control-token to allow it with a bearer token"
                    ),
                )),
                (Some(p), None) if p.is_loopback() => Ok(()),
                (peer, None) => Err(ServiceError::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "{what}s answer loopback clients only{}; start kiln serve with \
                         --control-token to allow others with a bearer token",
                        peer.map(|p| format!(" (this client is {p})"))
                            .unwrap_or_default()
                    ),
                )),
            },
        }
    }

    /// Check a load request's parameters before loading: `config` (Triton's model
    /// configuration override, a JSON object) may only restate what this server applies —
    /// its `name` and its `max_batch_size` (set per server by --max-batch-size) — since kiln
    /// has no per-model configuration to override; anything else, malformed JSON, or
    /// another parameter (`file:…` model files) is refused (INVALID_ARGUMENT) rather than
    /// ignored.
    pub fn check_load_parameters(
        &self,
        name: &str,
        params: &[(String, LoadParameter)],
    ) -> Result<(), ServiceError> {
        let bad = |m: String| ServiceError::new(ErrorKind::InvalidArgument, m);
        let max_batch = self.repo.config().batcher.max_batch_size;
        for (key, value) in params {
            if key != "config" {
                return Err(bad(format!(
                    "load parameter `{}` is not supported; kiln loads the model directory as it is on disk (only `config` is understood)",
                    clip(key)
                )));
            }
            let text = match value {
                LoadParameter::Text(t) => t,
                LoadParameter::Other(v) => {
                    return Err(bad(format!(
                        "load parameter `config` must be a string holding a JSON object, not {}",
                        clip(v)
                    )));
                }
            };
            let cfg: serde_json::Value = serde_json::from_str(text).map_err(|e| {
                bad(format!(
                    "load parameter `config` is not valid JSON ({e}); expected a model configuration object such as {{\"max_batch_size\": {max_batch}}}"
                ))
            })?;
            let Some(obj) = cfg.as_object() else {
                return Err(bad(format!(
                    "load parameter `config` must be a JSON object, not {}",
                    clip(text)
                )));
            };
            for (k, v) in obj {
                match k.as_str() {
                    "name" if v.as_str() == Some(name) => {}
                    "max_batch_size" if v.as_u64() == Some(max_batch as u64) => {}
                    "max_batch_size" => {
                        return Err(bad(format!(
                            "load config sets max_batch_size to {}, but this server batches every model up to {max_batch} rows (kiln serve --max-batch-size); restart it with --max-batch-size to change that",
                            clip(&v.to_string())
                        )));
                    }
                    other => {
                        return Err(bad(format!(
                            "load config key `{}` cannot be overridden: kiln has no per-model configuration to apply it to (it accepts `name` and `max_batch_size` when they match the server's)",
                            clip(other)
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}
