//! The preprocessing that travels with a model: raw input columns → the network's inputs
//! (imputation of missing cells, missing-indicator features), fit on the training split and
//! stored in the checkpoint's manifest, so that training, `kiln predict`, `kiln pick` and
//! `kiln serve` read raw columns the same way.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::table::{CsvTable, DataError, is_missing, parse_finite};

/// The suffix of a missing-indicator feature (`<column>_missing`).
pub const INDICATOR_SUFFIX: &str = "_missing";

/// One raw input column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputColumn {
    /// The column name.
    pub name: String,
    /// The value a missing cell gets (fit on the training split); `None`: a missing cell is
    /// an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impute: Option<f64>,
    /// Whether the network also sees a `<name>_missing` 0/1 feature.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub indicator: bool,
}

/// The preprocessing of a checkpoint, and what it did to the training data.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Preprocessing {
    /// Raw input columns, in order; the network sees their values, then the indicators of
    /// those with `indicator`, in the same order.
    pub inputs: Vec<InputColumn>,
    /// Rows of the file outside every split.
    #[serde(default)]
    pub rows_outside: usize,
    /// Rows left out of training, per reason (outside every split, a missing split value, a
    /// missing target, a missing feature under `drop_row`).
    #[serde(default)]
    pub dropped: BTreeMap<String, usize>,
    /// Imputed cells per column, over all splits.
    #[serde(default)]
    pub imputed: BTreeMap<String, usize>,
}

impl Preprocessing {
    /// No imputation: the network's inputs are these columns as they are.
    pub fn plain(features: &[String]) -> Self {
        Self {
            inputs: features
                .iter()
                .map(|n| InputColumn {
                    name: n.clone(),
                    impute: None,
                    indicator: false,
                })
                .collect(),
            ..Self::default()
        }
    }

    /// The raw columns read from the input.
    pub fn input_names(&self) -> Vec<String> {
        self.inputs.iter().map(|c| c.name.clone()).collect()
    }

    /// The network's features, in order: the inputs, then the indicators.
    pub fn network_features(&self) -> Vec<String> {
        let mut v = self.input_names();
        v.extend(
            self.inputs
                .iter()
                .filter(|c| c.indicator)
                .map(|c| format!("{}{INDICATOR_SUFFIX}", c.name)),
        );
        v
    }

    /// Number of network features.
    pub fn n_features(&self) -> usize {
        self.inputs.len() + self.inputs.iter().filter(|c| c.indicator).count()
    }

    /// Whether the network's inputs are exactly the raw columns (nothing imputed, no
    /// indicators).
    pub fn is_plain(&self) -> bool {
        self.inputs
            .iter()
            .all(|c| c.impute.is_none() && !c.indicator)
    }

    /// One row of network inputs from raw cells (`cells[i]` is input `i`), appended to `out`.
    /// `locate` names the row in errors (file and line).
    pub fn push_row(
        &self,
        cells: &[&str],
        out: &mut Vec<f32>,
        locate: &dyn Fn(&str, String) -> DataError,
    ) -> Result<(), DataError> {
        let start = out.len();
        for (c, cell) in self.inputs.iter().zip(cells) {
            if is_missing(cell) {
                match c.impute {
                    Some(v) => out.push(v as f32),
                    None => {
                        out.truncate(start);
                        return Err(locate(
                            &c.name,
                            format!(
                                "missing value {cell:?} (empty, NaN, NA and null are missing; the model has no imputation for this column — set data.missing when training)"
                            ),
                        ));
                    }
                }
            } else {
                match parse_finite(cell) {
                    Ok(v) => out.push(v as f32),
                    Err(not_number) => {
                        out.truncate(start);
                        return Err(locate(
                            &c.name,
                            if not_number {
                                format!("expected a number, got {cell:?}")
                            } else {
                                format!("expected a finite number, got {cell:?}")
                            },
                        ));
                    }
                }
            }
        }
        for (c, cell) in self.inputs.iter().zip(cells) {
            if c.indicator {
                out.push(if is_missing(cell) { 1.0 } else { 0.0 });
            }
        }
        Ok(())
    }

    /// The network inputs of every row of a table (`rows × n_features`, row-major).
    pub fn matrix(&self, table: &CsvTable) -> Result<Vec<f32>, DataError> {
        if self.is_plain() {
            // Exactly today's reading (and messages) for models without imputation.
            return table.numeric_matrix(&self.input_names());
        }
        let idx: Vec<usize> = self
            .inputs
            .iter()
            .map(|c| table.column_index(&c.name))
            .collect::<Result<_, _>>()?;
        let mut out = Vec::with_capacity(table.rows.len() * self.n_features());
        let mut cells = Vec::with_capacity(idx.len());
        for (row, &line) in table.rows.iter().zip(&table.lines) {
            cells.clear();
            cells.extend(idx.iter().map(|&i| row[i].as_str()));
            let locate = |column: &str, message: String| DataError::Cell {
                path: table.path.clone(),
                line,
                column: column.to_string(),
                message,
            };
            self.push_row(&cells, &mut out, &locate)?;
        }
        Ok(out)
    }
}

/// The median of finite values (the mean of the middle two for an even count).
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}
