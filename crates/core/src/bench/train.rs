//! Stage-1 training throughput through the real training loop.
//!
//! A seeded synthetic table (`features` × `targets`, default 20 × 3) is written as CSV to a
//! scratch directory, an experiment config is built in memory for the reference network
//! (20 → 48 → 48 → 3 + 3, ReLU) with one stage — backbone and mean head, MSE, AdamW with
//! kiln's (PyTorch's) defaults, global-norm clipping at 1.0, batch 128, one epoch — and
//! [`crate::train::train`] runs it once per worker count on the default CPU backend. The
//! numbers are the stage summary's `samples_per_s` and `data_wait_frac`: what `kiln train`
//! reports for the same settings. The synthetic seasons are uniform over 1990–2019; the
//! training split is 1990–2017, and the table is sized so that it holds `rows` rows on
//! average (validation 2018, test 2019).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::BenchError;
use crate::config::{self, LoadedConfig};
use crate::data::synthetic::{self, SyntheticSpec};
use crate::records::StepPhases;
use crate::train::train_cpu;

/// What to run.
#[derive(Debug, Clone)]
pub struct TrainBenchOptions {
    /// Training rows (expected size of the training split).
    pub rows: usize,
    /// Loader worker counts to measure, one training run each.
    pub workers: Vec<usize>,
    /// Batch size.
    pub batch_size: usize,
    /// Epochs of the single stage.
    pub epochs: usize,
    /// Features of the synthetic table.
    pub features: usize,
    /// Targets of the synthetic table.
    pub targets: usize,
    /// Seed of the table and the run.
    pub seed: u64,
    /// Scratch directory (a fresh one under the system temp dir when absent; removed after).
    pub dir: Option<PathBuf>,
}

impl Default for TrainBenchOptions {
    fn default() -> Self {
        Self {
            rows: 200_000,
            workers: vec![0, 1, 2],
            batch_size: 128,
            epochs: 1,
            features: 20,
            targets: 3,
            seed: 42,
            dir: None,
        }
    }
}

/// One training run's throughput: a JSON line of `kiln bench train --json`.
#[derive(Debug, Clone, Serialize)]
pub struct TrainResult {
    /// Always `train`.
    pub bench: &'static str,
    /// Loader worker threads.
    pub workers: usize,
    /// Stage-1 training samples per second.
    pub samples_per_s: f64,
    /// Fraction of step time spent waiting for the next batch.
    pub data_wait_frac: f64,
    /// Rows in the training split.
    pub train_rows: usize,
    /// Batch size.
    pub batch_size: usize,
    /// Epochs.
    pub epochs: usize,
    /// Optimizer steps.
    pub steps: u64,
    /// Wall time of the whole run (data loading, training, validation, export), seconds.
    pub wall_s: f64,
    /// Mean microseconds per step by phase (data wait, tensors, forward, loss, backward,
    /// clipping, optimizer).
    pub step_us: StepPhases,
}

/// The experiment config text for the benchmark.
pub fn config_text(opts: &TrainBenchOptions, csv: &Path, out: &Path, workers: usize) -> String {
    let list = |v: Vec<String>| v.join(", ");
    format!(
        "name: bench-train\n\
         seed: {seed}\n\
         data:\n  path: {csv}\n  features: [{features}]\n  targets: [{targets}]\n  \
         split:\n    train: {{from: 1990, to: 2017}}\n    validation: {{from: 2018, to: 2018}}\n    \
         test: {{from: 2019, to: 2019}}\n\
         model:\n  hidden: [48, 48]\n  activation: relu\n\
         loader:\n  batch_size: {batch}\n  num_workers: {workers}\n  prefetch: 4\n  shuffle: true\n\
         stages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    \
         epochs: {epochs}\n    clip_norm: 1.0\n\
         export:\n  dir: {out}\n",
        seed = opts.seed,
        csv = yaml_path(csv),
        features = list(synthetic::feature_names(opts.features)),
        targets = list(synthetic::target_names(opts.targets)),
        batch = opts.batch_size,
        epochs = opts.epochs,
        out = yaml_path(out),
    )
}

fn yaml_path(p: &Path) -> String {
    serde_json::to_string(&p.to_string_lossy()).expect("a string serialises")
}

/// Run the benchmark once per worker count.
pub fn run_train(opts: &TrainBenchOptions) -> Result<Vec<TrainResult>, BenchError> {
    if opts.rows < opts.batch_size || opts.batch_size == 0 || opts.epochs == 0 {
        return Err(BenchError::Invalid(format!(
            "rows ({}) must be at least the batch size ({}), and batch size and epochs positive",
            opts.rows, opts.batch_size
        )));
    }
    let (dir, owned) = match &opts.dir {
        Some(d) => (d.clone(), false),
        None => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            (
                std::env::temp_dir()
                    .join(format!("kiln-bench-train-{}-{nanos:x}", std::process::id())),
                true,
            )
        }
    };
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BenchError::Io { path, source }
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let result = (|| {
        // 28 of the 30 synthetic seasons are training seasons.
        let total = opts.rows * 30 / 28;
        let csv = dir.join("synthetic.csv");
        let text = synthetic::generate_csv(SyntheticSpec {
            rows: total,
            features: opts.features,
            targets: opts.targets,
            seed: opts.seed,
        });
        std::fs::write(&csv, text).map_err(io(&csv))?;
        let mut results = Vec::new();
        for &w in &opts.workers {
            let out = dir.join(format!("out-w{w}"));
            let text = config_text(opts, &csv, &out, w);
            let path = dir.join(format!("bench-w{w}.yaml"));
            std::fs::write(&path, &text).map_err(io(&path))?;
            let loaded = LoadedConfig {
                config: config::parse(&text, &path)?,
                text,
                path,
            };
            let started = Instant::now();
            let trained = train_cpu(&loaded, &out)?;
            let wall_s = started.elapsed().as_secs_f64();
            let stage =
                trained.outcome.stages.first().ok_or_else(|| {
                    BenchError::Invalid("the training run reported no stage".into())
                })?;
            let train_rows = trained
                .outcome
                .manifest
                .as_ref()
                .map(|m| m.dataset.rows[0])
                .unwrap_or(0);
            results.push(TrainResult {
                bench: "train",
                workers: w,
                samples_per_s: stage.samples_per_s,
                data_wait_frac: stage.data_wait_frac,
                train_rows,
                batch_size: opts.batch_size,
                epochs: stage.epochs,
                steps: stage.steps,
                wall_s,
                step_us: stage.step_us,
            });
        }
        Ok(results)
    })();
    if owned {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_text_is_a_valid_experiment() {
        let opts = TrainBenchOptions::default();
        let text = config_text(&opts, Path::new("/tmp/x y.csv"), Path::new("/tmp/out"), 2);
        let cfg = config::parse(&text, Path::new("bench.yaml")).unwrap();
        assert_eq!(cfg.model.hidden, vec![48, 48]);
        assert_eq!(cfg.loader.batch_size, 128);
        assert_eq!(cfg.stages.len(), 1);
        assert_eq!(cfg.stages[0].clip_norm, Some(1.0));
        assert_eq!(cfg.data.features.len(), 20);
        assert_eq!(cfg.data.path, PathBuf::from("/tmp/x y.csv"));
    }
}
