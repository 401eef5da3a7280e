//! The experiment config: `schema` (the types and defaults), loading with located errors
//! (here), `overrides` (`--set key.path=value`) and `validate` (every value check, one
//! function per section).
//!
//! Every struct rejects unknown keys (`deny_unknown_fields`), so a typo in a YAML file is an
//! error naming the file, line, column and key instead of a silently ignored setting. Value
//! checks (positive sizes, `t_mult ≥ 1`, non-empty target lists, …) live in
//! [`ExperimentConfig::validate`] and report the key path and the expected range.

mod overrides;
mod schema;
mod validate;

pub use overrides::{apply_overrides, load_with_overrides};
pub use schema::*;

use std::path::{Path, PathBuf};

/// Errors from reading or validating a config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The YAML did not parse or did not match the schema (unknown key, wrong type, …).
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line (0 when the parser gave no location).
        line: u64,
        /// 1-based column (0 when the parser gave no location).
        column: u64,
        /// What was wrong.
        message: String,
    },
    /// A value is outside its allowed range.
    #[error("{path}: invalid value for `{key}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key path, e.g. `stages[1].schedule.t_mult`.
        key: String,
        /// What was expected.
        message: String,
    },
}
/// A config together with the text and path it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The parsed, validated config.
    pub config: ExperimentConfig,
    /// The YAML text as read (stored with each run).
    pub text: String,
    /// The file it was read from.
    pub path: PathBuf,
}

impl LoadedConfig {
    /// The file stem, e.g. `baseball` for `configs/baseball.yaml`.
    pub fn stem(&self) -> String {
        self.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "config".to_string())
    }
}

/// Read, parse and validate a config file.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let config = parse(&text, path)?;
    Ok(LoadedConfig {
        config,
        text,
        path: path.to_path_buf(),
    })
}

/// Parse and validate YAML text; `path` is only used in messages.
pub fn parse(text: &str, path: &Path) -> Result<ExperimentConfig, ConfigError> {
    let mut key = String::new();
    let config: ExperimentConfig = serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            key = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| {
        let mut err = yaml_error(&e, path);
        if let ConfigError::Parse { message, .. } = &mut err
            && !key.is_empty()
            && key != "."
            && !key.contains('?')
            && !message.contains(&key)
        {
            *message = format!("at `{key}`: {message}");
        }
        err
    })?;
    config.validate(path)?;
    Ok(config)
}

/// Turn a YAML error into a one-line, located message.
pub fn yaml_error(e: &serde_saphyr::Error, path: &Path) -> ConfigError {
    let (line, column) = e
        .location()
        .map(|l| (l.line(), l.column()))
        .unwrap_or((0, 0));
    let plain = e
        .without_snippet()
        .render_with_options(serde_saphyr::render_options! {
            snippets: serde_saphyr::SnippetMode::Off,
        });
    // Keep the first line, without the location the parser appends (it is in the prefix).
    let first = plain.lines().next().unwrap_or("").trim();
    let message = match first.rfind(" at line ") {
        Some(i) => first[..i].to_string(),
        None => first.to_string(),
    };
    ConfigError::Parse {
        path: path.to_path_buf(),
        line,
        column,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
data:
  path: datasets/x.csv
  features: [a, b]
  targets: [y]
  split:
    train: {to: 2014}
    validation: {from: 2015, to: 2016}
    test: {from: 2017}
stages:
  - name: mean
    trainable: [backbone, mean_head]
    loss: mse
    epochs: 2
"#;

    fn p(text: &str) -> Result<ExperimentConfig, ConfigError> {
        parse(text, Path::new("test.yaml"))
    }

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = p(MINIMAL).unwrap();
        assert_eq!(c.seed, 42);
        assert_eq!(c.model.hidden, vec![48, 48]);
        assert_eq!(c.loader.num_workers, WorkerCount::Auto);
        let o = &c.stages[0].optimizer;
        assert_eq!((o.lr, o.eps, o.weight_decay), (1e-3, 1e-8, 1e-2));
        assert!(WorkerCount::Auto.resolve() >= 1 && WorkerCount::Auto.resolve() <= 4);
    }

    #[test]
    fn unknown_key_names_line_column_and_key() {
        let text = MINIMAL.replace("    epochs: 2", "    epochs: 2\n    epoch_count: 3");
        let e = p(&text).unwrap_err();
        let msg = e.to_string();
        match &e {
            ConfigError::Parse { line, .. } => assert_eq!(*line, 15, "{msg}"),
            other => panic!("expected a parse error, got {other}"),
        }
        assert!(msg.contains("epoch_count"), "{msg}");
        assert!(msg.starts_with("test.yaml:15:"), "{msg}");
    }

    #[test]
    fn bad_values_name_the_key_path_and_range() {
        let cases = [
            (
                MINIMAL.replace("epochs: 2", "epochs: 0"),
                "stages[0].epochs",
            ),
            (
                MINIMAL.replace(
                    "epochs: 2",
                    "epochs: 2\n    schedule: {kind: cosine_warm_restarts, t_0: 10, t_mult: 0}",
                ),
                "stages[0].schedule.t_mult",
            ),
            (
                MINIMAL.replace("targets: [y]", "targets: []"),
                "data.targets",
            ),
            (
                MINIMAL.replace("epochs: 2", "epochs: 2\n    clip_norm: -1"),
                "stages[0].clip_norm",
            ),
            (
                MINIMAL.replace("features: [a, b]", "features: [a, b]\n")
                    + "model:\n  hidden: [48, 0]\n",
                "model.hidden[1]",
            ),
            (
                MINIMAL.replace("test: {from: 2017}", "test: {from: 2016}"),
                "data.split.test",
            ),
            (
                MINIMAL.to_string() + "export:\n  engine: tensorrt\n",
                "export.engine",
            ),
        ];
        for (text, key) in cases {
            let e = p(&text).unwrap_err();
            match &e {
                ConfigError::Invalid { key: k, .. } => assert_eq!(k, key, "{e}"),
                other => panic!("expected invalid {key}, got {other}"),
            }
            assert!(
                e.to_string().contains("expected") || e.to_string().contains("overlap"),
                "{e}"
            );
        }
    }

    #[test]
    fn negative_width_is_a_located_parse_error() {
        let text = MINIMAL.to_string() + "model:\n  hidden: [48, -3]\n";
        let e = p(&text).unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::Parse {
                    line: 16,
                    column: 16,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "test.yaml:16:16: at `model.hidden[1]`: invalid u64"
        );
    }

    #[test]
    fn missing_file_is_an_io_error_naming_it() {
        let e = load(Path::new("/nonexistent/kiln.yaml")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/kiln.yaml"), "{e}");
    }

    #[test]
    fn overrides_apply_by_key_path_and_validate() {
        let c = p(MINIMAL).unwrap();
        let sets = [
            "loader.num_workers=0".to_string(),
            "model.hidden=[32, 16]".to_string(),
            "stages[0].epochs=5".to_string(),
            "stages[0].optimizer.lr=0.01".to_string(),
        ];
        let (o, text) = apply_overrides(&c, &sets, Path::new("t.yaml")).unwrap();
        assert_eq!(o.loader.num_workers, WorkerCount::Fixed(0));
        assert_eq!(o.model.hidden, vec![32, 16]);
        assert_eq!(o.stages[0].epochs, 5);
        assert_eq!(o.stages[0].optimizer.lr, 0.01);
        // The effective text parses back to the same config.
        assert_eq!(p(&text).unwrap(), o);
        let e = apply_overrides(&c, &["loader.workers=1".into()], Path::new("t.yaml")).unwrap_err();
        assert!(e.to_string().contains("unknown key \"workers\""), "{e}");
        let e =
            apply_overrides(&c, &["stages[3].epochs=1".into()], Path::new("t.yaml")).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e =
            apply_overrides(&c, &["stages[0].epochs=0".into()], Path::new("t.yaml")).unwrap_err();
        assert!(e.to_string().contains("stages[0].epochs"), "{e}");
    }

    #[test]
    fn workers_accept_auto_and_integers_only() {
        let t = MINIMAL.to_string() + "loader:\n  num_workers: 3\n";
        assert_eq!(p(&t).unwrap().loader.num_workers, WorkerCount::Fixed(3));
        let t = MINIMAL.to_string() + "loader:\n  num_workers: many\n";
        assert!(matches!(p(&t).unwrap_err(), ConfigError::Parse { .. }));
    }
}
