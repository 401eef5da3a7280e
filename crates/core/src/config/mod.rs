//! The experiment config: `schema` (the types and defaults), loading with located errors
//! (here), `overrides` (`--set key.path=value`) and `validate` (every value check, one
//! function per section).
//!
//! Every struct rejects unknown keys (`deny_unknown_fields`), so a typo in a YAML file is an
//! error naming the file, line, column and key instead of a silently ignored setting. Value
//! checks (positive sizes, `t_mult ≥ 1`, non-empty target lists, …) live in
//! [`ExperimentConfig::validate`] and report the key path and the expected range.

pub mod defaults;
mod overrides;
mod schema;
mod validate;
pub mod values;

pub use kiln_model::stats::TargetTransform;
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
    /// The file is not UTF-8 text.
    #[error(
        "{path}:{line}:{column}: not UTF-8: invalid byte 0x{byte:02x} at byte offset {offset} (save the file as UTF-8)"
    )]
    Encoding {
        /// The file.
        path: PathBuf,
        /// 1-based line of the first invalid byte.
        line: u64,
        /// 1-based column (in characters) of the first invalid byte.
        column: u64,
        /// 0-based byte offset of the first invalid byte in the file.
        offset: usize,
        /// The invalid byte.
        byte: u8,
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

/// Read a text file (a config or sweep file) that must be UTF-8; invalid bytes are reported
/// with their line, column and byte offset.
pub fn read_text(path: &Path) -> Result<String, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    utf8_text(bytes, path)
}

/// Bytes → text, or a located [`ConfigError::Encoding`]; `path` is only used in messages.
pub fn utf8_text(bytes: Vec<u8>, path: &Path) -> Result<String, ConfigError> {
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let offset = e.utf8_error().valid_up_to();
        let valid = std::str::from_utf8(&bytes[..offset]).expect("valid prefix");
        let line_start = valid.rfind('\n').map_or(0, |i| i + 1);
        ConfigError::Encoding {
            path: path.to_path_buf(),
            line: valid.matches('\n').count() as u64 + 1,
            column: valid[line_start..].chars().count() as u64 + 1,
            offset,
            byte: bytes[offset],
        }
    })
}

/// Read, parse and validate a config file.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let text = read_text(path)?;
    let mut config = parse(&text, path)?;
    resolve_inputs(&mut config, path);
    Ok(LoadedConfig {
        config,
        text,
        path: path.to_path_buf(),
    })
}

/// Resolve a config's relative input paths (`data.path`) against the directory of the config
/// file `path`: the file there when it exists, else (a config written for the working
/// directory) the path as it is, relative to the working directory. Absolute paths, and
/// output directories (`export.dir`, …, always relative to the working directory), are left
/// alone.
pub fn resolve_inputs(config: &mut ExperimentConfig, path: &Path) {
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return;
    };
    let data = &mut config.data.path;
    if data.is_relative() {
        let beside = dir.join(&*data);
        if beside.exists() {
            *data = beside;
        }
    }
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
    fn early_stopping_counts_epochs_since_the_last_improvement_beyond_min_delta() {
        let es = EarlyStopping {
            patience: 2,
            min_delta: 0.1,
        };
        assert!(!es.should_stop(&[]));
        assert!(!es.should_stop(&[1.0]));
        assert!(!es.should_stop(&[1.0, 0.95]));
        // 0.95 and 0.92 are within min_delta of 1.0: two epochs without improvement.
        assert!(es.should_stop(&[1.0, 0.95, 0.92]));
        // 0.85 improves on 1.0 by more than 0.1: the count restarts there.
        assert!(!es.should_stop(&[1.0, 0.95, 0.85, 0.8]));
        assert!(es.should_stop(&[1.0, 0.95, 0.85, 0.8, 0.84]));
        // Non-finite losses never improve; a stage that never had a finite loss stops too.
        assert!(es.should_stop(&[f64::NAN, f64::NAN]));
        let strict = EarlyStopping {
            patience: 1,
            min_delta: 0.0,
        };
        assert!(
            strict.should_stop(&[1.0, 1.0]),
            "equal is not an improvement"
        );
        assert!(!strict.should_stop(&[1.0, 0.999]));
    }

    #[test]
    fn early_stopping_is_validated() {
        let with = |es: &str| {
            MINIMAL.replace(
                "    epochs: 2\n",
                &format!("    epochs: 2\n    early_stopping: {es}\n"),
            )
        };
        let c = p(&with("{patience: 3}")).unwrap();
        assert_eq!(
            c.stages[0].early_stopping,
            Some(EarlyStopping {
                patience: 3,
                min_delta: 0.0
            })
        );
        let e = p(&with("{patience: 0}")).unwrap_err().to_string();
        assert!(e.contains("stages[0].early_stopping.patience"), "{e}");
        let e = p(&with("{patience: 2, min_delta: -1}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("early_stopping.min_delta"), "{e}");
        let e = p(&with("{patience: 2, patient: 1}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("patient"), "{e}");
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
    fn a_data_path_is_read_beside_the_config_first_then_from_the_working_directory() {
        let tiny = include_str!("../../../../configs/tiny.yaml");
        let tmp = tempfile::tempdir().unwrap();
        let sub = tmp.path().join("exp");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("rows.csv"), "x\n").unwrap();
        let cfg = sub.join("kiln.yaml");
        // Beside the config: found wherever kiln runs from.
        std::fs::write(
            &cfg,
            tiny.replace("path: datasets/baseball.csv", "path: rows.csv"),
        )
        .unwrap();
        assert_eq!(load(&cfg).unwrap().config.data.path, sub.join("rows.csv"));
        // Not beside it but in the working directory (the crate's, under cargo test): kept,
        // so configs written for the working directory keep working.
        std::fs::write(
            &cfg,
            tiny.replace("path: datasets/baseball.csv", "path: Cargo.toml"),
        )
        .unwrap();
        assert_eq!(
            load(&cfg).unwrap().config.data.path,
            std::path::PathBuf::from("Cargo.toml")
        );
        // Absolute: as it is.
        let abs = sub.join("rows.csv");
        std::fs::write(
            &cfg,
            tiny.replace(
                "path: datasets/baseball.csv",
                &format!("path: {}", abs.display()),
            ),
        )
        .unwrap();
        assert_eq!(load(&cfg).unwrap().config.data.path, abs);
    }

    #[test]
    fn non_utf8_text_names_line_column_and_byte_offset() {
        let mut bytes = b"name: x\nseed: 4\ndata:\n  path: d\xc3\xa9s/\xff.csv\n".to_vec();
        let e = utf8_text(bytes.clone(), Path::new("c.yaml")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "c.yaml:4:13: not UTF-8: invalid byte 0xff at byte offset 35 (save the file as UTF-8)"
        );
        bytes.truncate(20);
        assert_eq!(
            utf8_text(bytes, Path::new("c.yaml")).unwrap(),
            "name: x\nseed: 4\ndata"
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
