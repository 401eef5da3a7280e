//! The checkpoint's preprocessing (`kiln-model`'s [`Preprocessing`]) applied to a whole
//! table read from a file: the network inputs of every row, with errors naming the file, line
//! and column.

use super::table::{CsvTable, DataError};
pub use kiln_model::preprocess::*;

/// Encoding a whole table with a [`Preprocessing`].
pub trait EncodeTable {
    /// The network inputs of every row of a table (`rows × n_features`, row-major).
    fn matrix(&self, table: &CsvTable) -> Result<Vec<f32>, DataError>;

    /// [`EncodeTable::matrix`], counting imputed and unknown values per input.
    fn matrix_counted(
        &self,
        table: &CsvTable,
        counts: Option<&mut EncodeCounts>,
    ) -> Result<Vec<f32>, DataError>;
}

impl EncodeTable for Preprocessing {
    fn matrix(&self, table: &CsvTable) -> Result<Vec<f32>, DataError> {
        self.matrix_counted(table, None)
    }

    fn matrix_counted(
        &self,
        table: &CsvTable,
        mut counts: Option<&mut EncodeCounts>,
    ) -> Result<Vec<f32>, DataError> {
        let holes = || {
            self.inputs.iter().any(|c| {
                c.fallback.is_some()
                    && table
                        .column_index(&c.name)
                        .is_ok_and(|j| (0..table.n_rows()).any(|r| table.is_missing_at(r, j)))
            })
        };
        if self.is_plain() && !holes() {
            // Exactly today's reading (and messages) for models without imputation, unless a
            // missing cell needs the serving fallback.
            return table.numeric_matrix(&self.input_names());
        }
        let idx: Vec<usize> = self
            .inputs
            .iter()
            .map(|c| table.column_index(&c.name))
            .collect::<Result<_, _>>()?;
        let mut out = Vec::with_capacity(table.n_rows() * self.n_features());
        let mut cells = Vec::with_capacity(idx.len());
        for (r, &line) in table.lines.iter().enumerate() {
            cells.clear();
            cells.extend(idx.iter().map(|&i| table.cell(r, i)));
            let values: Vec<RawValue> = cells.iter().map(|c| RawValue::cell(c)).collect();
            let locate = |column: &str, message: String| DataError::Cell {
                path: table.path.clone(),
                line,
                column: column.to_string(),
                message,
            };
            self.push_values(&values, &mut out, &locate, counts.as_deref_mut())?;
        }
        Ok(out)
    }
}
