//! MLflow's Model Registry for `kiln promote`: the version that went live in the kiln model
//! repository is registered as a version of an MLflow registered model, so an MLflow user
//! sees which model is served, where it lives and which run made it.
//!
//! [`register`] makes three REST calls:
//!
//! 1. `POST /api/2.0/mlflow/registered-models/create` (`RESOURCE_ALREADY_EXISTS` is fine);
//! 2. `POST /api/2.0/mlflow/model-versions/create` with the source, the training run's MLflow
//!    run id when known, and the tags below;
//! 3. `POST /api/2.0/mlflow/registered-models/alias`: the alias (default `champion`,
//!    `KILN_MLFLOW_MODEL_ALIAS`) moves to the new version.
//!
//! The source: an MLflow server refuses a local path as a model version's source unless it
//! lies inside the run's own artifact directory, and it cannot read a kiln repository on a
//! cluster volume anyway. So when the training run was mirrored (its run directory has
//! `mlflow.json`), the source is `runs:/<mlflow run>/export` — the same checkpoint, uploaded
//! by the mirror, downloadable through MLflow; otherwise it is the repository directory as a
//! `kiln-repository:` URI (`kiln-repository:/models/baseball/3`), which MLflow stores as
//! given. Either way the tag `kiln.repository_path` holds the installed directory.
//!
//! | tag | value |
//! |---|---|
//! | `kiln.repository_path` | `<repository>/<model>/<version>`, absolute |
//! | `kiln.repository_version` | the kiln repository's version number |
//! | `kiln.checkpoint_sha256` | the weights' SHA-256 (the manifest's) |
//! | `kiln.run_id` | kiln's run id |
//! | `kiln.version` | the kiln release that promoted it |

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Client, MlflowError};

/// The environment variable naming the alias of the served version.
pub const ENV_ALIAS: &str = "KILN_MLFLOW_MODEL_ALIAS";
/// The alias of the served version when [`ENV_ALIAS`] is unset.
pub const DEFAULT_ALIAS: &str = "champion";

/// What to register.
#[derive(Debug, Clone)]
pub struct Registration<'a> {
    /// The registered model's name (kiln's `--model`).
    pub name: &'a str,
    /// The installed version's directory in the kiln repository.
    pub repository_path: &'a Path,
    /// The kiln repository's version number.
    pub repository_version: u64,
    /// The weights' SHA-256.
    pub checkpoint_sha256: &'a str,
    /// kiln's run id.
    pub kiln_run_id: &'a str,
    /// The training run's MLflow run id, when it was mirrored.
    pub mlflow_run_id: Option<&'a str>,
    /// The alias to point at this version.
    pub alias: &'a str,
}

/// A registered version, as recorded in the promotion's details.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegisteredVersion {
    /// The registered model.
    pub name: String,
    /// MLflow's version number (a string, as MLflow's API has it).
    pub version: String,
    /// The alias now pointing at it.
    pub alias: String,
    /// The version's source.
    pub source: String,
    /// The MLflow run it links to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// The alias from [`ENV_ALIAS`] (unset or empty: [`DEFAULT_ALIAS`]).
pub fn alias_from_env() -> String {
    std::env::var(ENV_ALIAS)
        .ok()
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| DEFAULT_ALIAS.to_string())
}

/// The source of a version: `runs:/<run>/export` when the MLflow run is known, else the
/// repository directory as a `kiln-repository:` URI (see the module documentation).
pub fn source_of(r: &Registration<'_>) -> String {
    match r.mlflow_run_id {
        Some(run) => format!("runs:/{run}/export"),
        None => format!("kiln-repository:{}", r.repository_path.display()),
    }
}

/// Register `r` (see the module documentation); the first failing call's error is returned.
pub fn register(client: &Client, r: &Registration<'_>) -> Result<RegisteredVersion, MlflowError> {
    let create = "/api/2.0/mlflow/registered-models/create";
    match client.post(
        create,
        &json!({
            "name": r.name,
            "description": "Registered by kiln promote: each version is one the kiln model repository served.",
        }),
    ) {
        Ok(_) => {}
        Err(MlflowError::Status {
            error_code: Some(code),
            ..
        }) if code == "RESOURCE_ALREADY_EXISTS" => {}
        Err(e) => return Err(e),
    }
    let source = source_of(r);
    let tags = [
        (
            "kiln.repository_path",
            r.repository_path.display().to_string(),
        ),
        ("kiln.repository_version", r.repository_version.to_string()),
        ("kiln.checkpoint_sha256", r.checkpoint_sha256.to_string()),
        ("kiln.run_id", r.kiln_run_id.to_string()),
        ("kiln.version", env!("CARGO_PKG_VERSION").to_string()),
    ];
    let mut body = json!({
        "name": r.name,
        "source": source,
        "tags": tags
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect::<Vec<_>>(),
        "description": format!(
            "kiln run {} installed as version {} at {}",
            r.kiln_run_id,
            r.repository_version,
            r.repository_path.display()
        ),
    });
    if let Some(run) = r.mlflow_run_id {
        body["run_id"] = json!(run);
    }
    let path = "/api/2.0/mlflow/model-versions/create";
    let created = client.post(path, &body)?;
    let version = client.field(
        &created,
        "/model_version/version",
        "model_version.version",
        "POST",
        path,
    )?;
    client.post(
        "/api/2.0/mlflow/registered-models/alias",
        &json!({"name": r.name, "alias": r.alias, "version": version}),
    )?;
    Ok(RegisteredVersion {
        name: r.name.to_string(),
        version,
        alias: r.alias.to_string(),
        source,
        run_id: r.mlflow_run_id.map(str::to_string),
    })
}
