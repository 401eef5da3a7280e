//! Pick probabilities from a checkpoint: legs name a row of features, a target, a line and a
//! side; the network's means and standard deviations and the checkpoint's residual correlation
//! between targets make a multivariate normal whose box probability the Halton/Genz estimator
//! answers. Used by `kiln pick` and available to the serving tier.

pub mod outcomes;

use std::collections::BTreeMap;
use std::path::Path;

use crate::artifact::Manifest;
use crate::data::preprocess::EncodeTable;
use crate::data::table::{CsvTable, DataError};
use crate::model::mvn::{
    HaltonMvnCdf, Leg, MvnError, PickCorrelation, PickResult, Side, pick_probabilities,
};
use crate::predict::Predictor;

/// Errors of pick evaluation.
#[derive(Debug, thiserror::Error)]
pub enum PickError {
    /// Reading the legs or rows failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A leg is malformed.
    #[error("{path}:{line}: {message}")]
    Leg {
        /// The legs file.
        path: std::path::PathBuf,
        /// 1-based line.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// The estimator refused the query.
    #[error(transparent)]
    Mvn(#[from] MvnError),
    /// The network failed.
    #[error(transparent)]
    Infer(#[from] crate::infer::InferError),
}

/// A leg as the user writes it: which row, which target, the line and the side.
#[derive(Debug, Clone, PartialEq)]
pub struct LegSpec {
    /// The pick it belongs to.
    pub pick: String,
    /// Key of the row of features.
    pub row: String,
    /// Target index in the checkpoint.
    pub target: usize,
    /// The line.
    pub line: f64,
    /// Over or under.
    pub side: Side,
}

/// The checkpoint's residual correlation as the estimator's pick correlation (legs on
/// different rows independent unless `cross_row` is given).
pub fn correlation(manifest: &Manifest, cross_row: Option<Vec<f64>>) -> PickCorrelation {
    correlation_of(
        manifest.targets.len(),
        &manifest.residual_correlation,
        cross_row,
    )
}

/// [`correlation`] from its parts: `k` targets and their residual correlation (`k × k`), as
/// a manifest holds them (or will: a training run evaluates picks before its export).
pub fn correlation_of(
    k: usize,
    residual_correlation: &[Vec<f64>],
    cross_row: Option<Vec<f64>>,
) -> PickCorrelation {
    PickCorrelation {
        targets: k,
        target_corr: residual_correlation.iter().flatten().copied().collect(),
        cross_row_corr: cross_row,
    }
}

/// Feature rows by key (raw values, manifest order).
pub type Rows = BTreeMap<String, Vec<f32>>;

/// Evaluate picks. `rows` maps a row key to its raw feature values (manifest order).
pub fn evaluate(
    predictor: &mut Predictor,
    mvn: &HaltonMvnCdf<crate::backend::Cpu>,
    corr: &PickCorrelation,
    rows: &Rows,
    legs: &[LegSpec],
) -> Result<Vec<(String, PickResult)>, PickError> {
    // Predict each distinct row once.
    let keys: Vec<&String> = {
        let mut k: Vec<&String> = legs.iter().map(|l| &l.row).collect();
        k.sort();
        k.dedup();
        k
    };
    let nf = predictor.n_features();
    let nt = predictor.n_targets();
    let mut x = Vec::with_capacity(keys.len() * nf);
    for k in &keys {
        x.extend_from_slice(&rows[*k]);
    }
    let pred = predictor.predict(&x, keys.len())?;
    let index: BTreeMap<&String, usize> = keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let mut picks: Vec<(String, Vec<Leg>)> = Vec::new();
    for l in legs {
        let r = index[&l.row];
        let leg = Leg {
            group: l.row.clone(),
            target: l.target,
            mean: pred.mean[r * nt + l.target] as f64,
            std: pred.std[r * nt + l.target] as f64,
            line: l.line,
            side: l.side,
        };
        match picks.iter_mut().find(|(p, _)| *p == l.pick) {
            Some((_, v)) => v.push(leg),
            None => picks.push((l.pick.clone(), vec![leg])),
        }
    }
    let refs: Vec<&[Leg]> = picks.iter().map(|(_, v)| v.as_slice()).collect();
    let results = pick_probabilities(mvn, &refs, corr)?;
    Ok(picks.into_iter().map(|(p, _)| p).zip(results).collect())
}

/// Read a legs file: columns `target`, `line`, `side`, an optional `pick`, and either every
/// feature column (the row is inline) or the key columns of a rows file. Returns the legs and
/// the inline rows (empty when rows come from elsewhere).
pub fn read_legs(
    path: &Path,
    manifest: &Manifest,
    key: &[String],
) -> Result<(Vec<LegSpec>, Rows), PickError> {
    let t = CsvTable::read(path)?;
    let (ti, li, si) = (
        t.column_index("target")?,
        t.column_index("line")?,
        t.column_index("side")?,
    );
    let pi = t.header.iter().position(|h| h == "pick");
    let targets = manifest.target_names();
    let pre = manifest.input_preprocessing();
    let inline = pre.input_names().iter().all(|f| t.header.contains(f));
    let nf = pre.n_features();
    let key_idx: Vec<usize> = if inline {
        Vec::new()
    } else {
        key.iter()
            .map(|k| t.column_index(k))
            .collect::<Result<_, _>>()?
    };
    let x = if inline { pre.matrix(&t)? } else { Vec::new() };
    let mut legs = Vec::new();
    let mut rows = BTreeMap::new();
    for (i, &line) in t.lines.iter().enumerate() {
        let row: Vec<_> = (0..t.header.len()).map(|j| t.cell(i, j)).collect();
        let bad = |message: String| PickError::Leg {
            path: path.to_path_buf(),
            line,
            message,
        };
        let target = targets.iter().position(|n| *n == row[ti]).ok_or_else(|| {
            bad(format!(
                "column `target`: unknown target {:?}; the checkpoint predicts {}",
                row[ti],
                targets.join(", ")
            ))
        })?;
        let value = t.parse_cell(&row[li], line, "line")?;
        let side: Side = row[si]
            .parse()
            .map_err(|e: String| bad(format!("column `side`: {e}")))?;
        let key = if inline {
            let k = format!("line {line}");
            rows.insert(k.clone(), x[i * nf..(i + 1) * nf].to_vec());
            k
        } else {
            key_idx
                .iter()
                .map(|&j| &*row[j])
                .collect::<Vec<_>>()
                .join(":")
        };
        legs.push(LegSpec {
            pick: pi
                .map(|p| row[p].to_string())
                .unwrap_or_else(|| "pick".into()),
            row: key,
            target,
            line: value,
            side,
        });
    }
    if legs.is_empty() {
        return Err(PickError::Leg {
            path: path.to_path_buf(),
            line: 1,
            message: "no legs".into(),
        });
    }
    Ok((legs, rows))
}

/// Look up the feature rows of `keys` in a rows file keyed by the `key` columns.
pub fn read_rows(
    path: &Path,
    manifest: &Manifest,
    key: &[String],
    wanted: &[&String],
) -> Result<Rows, PickError> {
    let t = CsvTable::read(path)?;
    let key_idx: Vec<usize> = key
        .iter()
        .map(|k| t.column_index(k))
        .collect::<Result<_, _>>()?;
    let pre = manifest.input_preprocessing();
    let f_idx: Vec<usize> = pre
        .inputs
        .iter()
        .map(|f| t.column_index(&f.name))
        .collect::<Result<_, _>>()?;
    let mut rows = BTreeMap::new();
    for (i, &line) in t.lines.iter().enumerate() {
        let row: Vec<_> = (0..t.header.len()).map(|j| t.cell(i, j)).collect();
        let k = key_idx
            .iter()
            .map(|&j| &*row[j])
            .collect::<Vec<_>>()
            .join(":");
        if wanted.iter().any(|w| **w == k) {
            let cells: Vec<&str> = f_idx.iter().map(|&j| &*row[j]).collect();
            let mut v = Vec::with_capacity(pre.n_features());
            if pre.is_plain() {
                for (cell, f) in cells.iter().zip(&pre.inputs) {
                    v.push(t.parse_cell_f32(cell, line, &f.name)?);
                }
            } else {
                let locate = |column: &str, message: String| DataError::Cell {
                    path: t.path.clone(),
                    line,
                    column: column.to_string(),
                    message,
                };
                pre.push_row(&cells, &mut v, &locate)?;
                // Finite after conversion to f32 (3.5e38 is finite in f64, inf in f32).
                if let Some(k) = v.iter().position(|x| !x.is_finite()) {
                    let name = pre.network_features().get(k).cloned().unwrap_or_default();
                    return Err(PickError::Data(locate(
                        &name,
                        "the value is not finite once converted to f32 (|v| > 3.4e38)".into(),
                    )));
                }
            }
            rows.insert(k, v);
        }
    }
    if let Some(missing) = wanted.iter().find(|w| !rows.contains_key(**w)) {
        return Err(PickError::Data(DataError::Other(format!(
            "{}: no row with {} = {missing}",
            path.display(),
            key.join(":")
        ))));
    }
    Ok(rows)
}
