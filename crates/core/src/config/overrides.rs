//! `--set key.path=value` overrides applied to a loaded config.

use std::path::Path;

use super::schema::ExperimentConfig;
use super::{ConfigError, LoadedConfig, load};

/// Read a config file and apply `key.path=value` overrides (see [`apply_overrides`]); the
/// returned text is the effective config a run stores.
pub fn load_with_overrides(path: &Path, set: &[String]) -> Result<LoadedConfig, ConfigError> {
    let mut loaded = load(path)?;
    if !set.is_empty() {
        let (c, text) = apply_overrides(&loaded.config, set, path)?;
        loaded.config = c;
        loaded.text = text;
    }
    Ok(loaded)
}

/// Documented top-level keys a config may leave out, which `--set` may add
/// (`--set refit=train+validation`, `--set calibration.method=…`).
pub const OPTIONAL_TOP_LEVEL: [&str; 4] = ["refit", "calibration", "distill", "seed_spread"];

/// Apply `key.path=value` overrides (values are YAML scalars or flow collections, e.g.
/// `loader.num_workers=2`, `model.hidden=[32,32]`, `stages[0].epochs=5`) and validate.
/// Returns the effective config and its YAML text (what the run directory stores).
pub fn apply_overrides(
    config: &ExperimentConfig,
    overrides: &[String],
    path: &Path,
) -> Result<(ExperimentConfig, String), ConfigError> {
    let bad = |key: &str, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        key: key.to_string(),
        message,
    };
    let mut value = serde_json::to_value(config).expect("config serialises");
    for o in overrides {
        let Some((key, raw)) = o.split_once('=') else {
            return Err(bad(o, "expected --set key.path=value".into()));
        };
        let key = key.trim();
        let new: serde_json::Value = serde_saphyr::from_str(raw.trim()).map_err(|e| {
            bad(
                key,
                format!("value {raw:?} is not valid YAML: {}", e.without_snippet()),
            )
        })?;
        let mut slot = &mut value;
        for (depth, part) in key.split('.').enumerate() {
            let (name, index) = match part.split_once('[') {
                Some((n, rest)) => {
                    let i: usize = rest
                        .trim_end_matches(']')
                        .parse()
                        .map_err(|_| bad(key, format!("bad index in {part:?}")))?;
                    (n, Some(i))
                }
                None => (part, None),
            };
            let obj = slot
                .as_object_mut()
                .ok_or_else(|| bad(key, format!("{name:?} is not inside a mapping")))?;
            if !obj.contains_key(name) && depth == 0 && OPTIONAL_TOP_LEVEL.contains(&name) {
                // A documented top-level key the file leaves out (absent from the serialised
                // config): --set adds it; the schema below checks its value.
                obj.insert(
                    name.to_string(),
                    serde_json::Value::Object(Default::default()),
                );
            }
            if !obj.contains_key(name) {
                let known: Vec<&String> = obj.keys().collect();
                return Err(bad(
                    key,
                    format!("unknown key {name:?} (known here: {known:?})"),
                ));
            }
            slot = obj.get_mut(name).expect("checked");
            if let Some(i) = index {
                let arr = slot
                    .as_array_mut()
                    .ok_or_else(|| bad(key, format!("{name:?} is not a list")))?;
                let len = arr.len();
                slot = arr
                    .get_mut(i)
                    .ok_or_else(|| bad(key, format!("index {i} out of range (length {len})")))?;
            }
        }
        *slot = new;
    }
    let config: ExperimentConfig = serde_json::from_value(value).map_err(|e| {
        bad(
            "--set",
            format!("the overridden config does not fit the schema: {e}"),
        )
    })?;
    config.validate(path)?;
    let text = serde_saphyr::to_string(&config).expect("config serialises to YAML");
    Ok((config, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--set` adds a documented top-level key the file leaves out, and still refuses an
    /// unknown one by name.
    #[test]
    fn set_adds_a_documented_top_level_key() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tiny.yaml");
        let loaded = load(&path).unwrap();
        assert!(loaded.config.refit.is_none());
        let (c, text) =
            apply_overrides(&loaded.config, &["refit=train+validation".into()], &path).unwrap();
        assert!(!c.refit.is_none(), "{text}");
        assert!(text.contains("refit"), "{text}");
        let e = apply_overrides(&loaded.config, &["refitt=train+validation".into()], &path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("refitt"), "{e}");
    }
}
