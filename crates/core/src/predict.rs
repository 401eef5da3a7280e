//! Prediction in original units: [`Predictor`] (the manifest's normalisation around an
//! inference engine, from `kiln-model`) and `kiln predict` over a CSV file.

use std::fmt::Write as _;
use std::path::Path;

use crate::artifact::{ArtifactError, Checkpoint};
use crate::data::preprocess::{EncodeCounts, EncodeTable, Preprocessing};
use crate::data::table::{CsvTable, DataError};
use crate::infer::{EngineKind, InferError};
use crate::util::write_atomic;
pub use kiln_model::predict::{Prediction, Predictor};

/// Errors from `kiln predict`.
#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    /// Reading the checkpoint failed.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// Reading the input failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The engine failed.
    #[error(transparent)]
    Infer(#[from] InferError),
    /// A prediction is NaN or infinite (never written to the output).
    #[error(
        "{path}:{line}: row {row}: the prediction `{column}` is {value} (not finite); nothing was written"
    )]
    NonFiniteOutput {
        /// The input file.
        path: std::path::PathBuf,
        /// 1-based line of the row in the input.
        line: u64,
        /// 1-based data row.
        row: usize,
        /// The output column (`<target>_mean` or `<target>_std`).
        column: String,
        /// The value.
        value: f32,
    },
    /// Writing the output failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// Predict every row of a CSV file: raw input columns go through the checkpoint's
/// preprocessing (imputation, missing indicators). Non-input columns are passed through in front; then
/// `<target>_mean` and `<target>_std` per target, and for a target with a transform its 90 %
/// interval `<target>_q05`, `<target>_q95` (original units). Returns the CSV text and the row
/// count.
pub fn predict_csv(
    predictor: &mut Predictor,
    input: &Path,
    pre: &Preprocessing,
    targets: &[String],
) -> Result<(String, usize), PredictError> {
    predict_csv_counted(predictor, input, pre, targets).map(|(text, rows, _)| (text, rows))
}

/// [`predict_csv`], also returning what encoding the rows met per input column: missing
/// cells (imputed, or the unknown bucket) and categories the training split did not have
/// ([`EncodeCounts::unknown_summary`] is the line `kiln predict` prints).
pub fn predict_csv_counted(
    predictor: &mut Predictor,
    input: &Path,
    pre: &Preprocessing,
    targets: &[String],
) -> Result<(String, usize, EncodeCounts), PredictError> {
    let table = CsvTable::read(input)?;
    let mut counts = EncodeCounts::default();
    let x = pre.matrix_counted(&table, Some(&mut counts))?;
    let inputs = pre.input_names();
    let passthrough: Vec<usize> = (0..table.header.len())
        .filter(|&i| !inputs.contains(&table.header[i]))
        .collect();
    let rows = table.n_rows();
    let k = targets.len();
    let mut text = String::new();
    let mut header: Vec<String> = passthrough
        .iter()
        .map(|&i| table.header[i].clone())
        .collect();
    // A transformed target's interval is asymmetric (and inside its support), so its 5 %
    // and 95 % quantiles are written beside the mean and standard deviation.
    let quantiles: Vec<bool> = (0..targets.len())
        .map(|j| {
            predictor
                .targets()
                .get(j)
                .is_some_and(|t| !t.transform.is_none())
        })
        .collect();
    for (t, &q) in targets.iter().zip(&quantiles) {
        header.push(format!("{t}_mean"));
        header.push(format!("{t}_std"));
        if q {
            header.push(format!("{t}_q05"));
            header.push(format!("{t}_q95"));
        }
    }
    text.push_str(&header.join(","));
    text.push('\n');
    const CHUNK: usize = 4096;
    let nf = pre.n_features();
    let mut pred = Prediction {
        mean: Vec::new(),
        std: Vec::new(),
    };
    let (mut q05, mut q95) = (Vec::new(), Vec::new());
    for start in (0..rows).step_by(CHUNK) {
        let end = (start + CHUNK).min(rows);
        predictor.predict_into(&x[start * nf..end * nf], end - start, &mut pred)?;
        if quantiles.contains(&true) {
            predictor.quantiles_into(0.05, &mut q05);
            predictor.quantiles_into(0.95, &mut q95);
        }
        if let Some(o) =
            (0..pred.mean.len()).find(|&o| !(pred.mean[o].is_finite() && pred.std[o].is_finite()))
        {
            let r = start + o / k;
            let (column, value) = if pred.mean[o].is_finite() {
                (format!("{}_std", targets[o % k]), pred.std[o])
            } else {
                (format!("{}_mean", targets[o % k]), pred.mean[o])
            };
            return Err(PredictError::NonFiniteOutput {
                path: input.to_path_buf(),
                line: table.lines[r],
                row: r + 1,
                column,
                value,
            });
        }
        for r in start..end {
            let mut first = true;
            for &i in &passthrough {
                if !first {
                    text.push(',');
                }
                first = false;
                text.push_str(&csv_field(&table.cell(r, i)));
            }
            for (j, &with_quantiles) in quantiles.iter().enumerate() {
                let o = (r - start) * k + j;
                if !first {
                    text.push(',');
                }
                first = false;
                write!(text, "{},{}", pred.mean[o], pred.std[o]).expect("write to String");
                if with_quantiles {
                    write!(text, ",{},{}", q05[o], q95[o]).expect("write to String");
                }
            }
            text.push('\n');
        }
    }
    Ok((text, rows, counts))
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Which split each row of a loaded table trained, validated or tested on, as CSV
/// `row,split`: `row` is the row's index among the file's data rows (0 = the first row after
/// the header, as pandas and R's 1-based `row - 1` number them) and `split` is `train`,
/// `validation` or `test`. Rows are in file order; a row absent from the output is in no
/// split (outside every split, or dropped: e.g. a missing target). This is exactly the
/// membership training uses, so other models can be fitted and scored on the same rows
/// (`kiln config split`).
pub fn split_membership(data: &crate::data::Dataset) -> String {
    let parts = [&data.train, &data.validation, &data.test];
    let mut rows: Vec<(usize, &str)> = parts
        .iter()
        .zip(crate::data::split::SPLIT_NAMES)
        .flat_map(|(p, name)| p.source_rows.iter().map(move |&r| (r, name)))
        .collect();
    rows.sort_unstable();
    let mut text = String::with_capacity(16 * rows.len() + 10);
    text.push_str("row,split\n");
    for (row, name) in rows {
        let _ = writeln!(text, "{row},{name}");
    }
    text
}

/// Write predictions to a file atomically, or to stdout when `output` is `None`.
pub fn write_output(text: &str, output: Option<&Path>) -> Result<(), PredictError> {
    match output {
        Some(p) => {
            write_atomic(p, text.as_bytes()).map_err(|e| PredictError::from(ArtifactError::from(e)))
        }
        None => {
            use std::io::Write;
            std::io::stdout()
                .write_all(text.as_bytes())
                .map_err(|source| PredictError::Io {
                    path: "<stdout>".into(),
                    source,
                })
        }
    }
}

/// Largest |Δ| between `engine`'s predictions and `fused`'s on every row of `input`, in
/// original units: `(max |Δmean|, max |Δstd|, rows)`. What `kiln predict` prints for a
/// quantised engine (`int8`, `auto-int8`), so that the quantisation is never silent.
pub fn max_delta_vs_fused(
    ckpt: &Checkpoint,
    input: &Path,
    engine: EngineKind,
) -> Result<(f32, f32, usize), PredictError> {
    let table = CsvTable::read(input)?;
    let x = table.numeric_matrix(&ckpt.manifest.feature_names())?;
    let rows = table.n_rows();
    let mut q =
        Predictor::for_checkpoint(ckpt, crate::infer::build_engine(engine, &ckpt.weights, 1)?);
    let mut f = Predictor::for_checkpoint(
        ckpt,
        crate::infer::build_engine(EngineKind::Fused, &ckpt.weights, 1)?,
    );
    let (a, b) = (q.predict(&x, rows)?, f.predict(&x, rows)?);
    let worst = |u: &[f32], v: &[f32]| {
        u.iter()
            .zip(v)
            .map(|(p, r)| (p - r).abs())
            .fold(
                0f32,
                |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
            )
    };
    Ok((worst(&a.mean, &b.mean), worst(&a.std, &b.std), rows))
}

/// The int8 accuracy report of a checkpoint on the test split of `data_cfg` (the dataset
/// and split the checkpoint was trained with), for storing in its manifest at export.
pub fn int8_accuracy_report(
    ckpt: &Checkpoint,
    data_cfg: &crate::config::DataConfig,
) -> Result<crate::infer::Int8AccuracyReport, PredictError> {
    let data =
        crate::data::Dataset::load(&data_cfg.as_trained(ckpt.manifest.preprocessing.as_ref()))?;
    Ok(crate::infer::int8_accuracy_on(
        &ckpt.weights,
        &ckpt.manifest.features,
        &ckpt.manifest.targets,
        &data.test.x,
        &data.test.y,
    )?)
}
