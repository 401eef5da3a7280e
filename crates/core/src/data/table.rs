//! CSV → named columns, with errors that name the file, line and column.

use std::path::{Path, PathBuf};

/// A relative path with the directory it was resolved from, so that a config run from the
/// wrong directory says where it looked.
fn with_base(path: &Path) -> String {
    match std::env::current_dir() {
        Ok(cwd) if path.is_relative() => {
            format!("{} (relative to {})", path.display(), cwd.display())
        }
        _ => path.display().to_string(),
    }
}

/// Errors from reading tabular data or building datasets from it.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("cannot read {}: {source}", with_base(path))]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not well-formed CSV (e.g. a row with the wrong number of fields).
    #[error("{path}:{line}: malformed CSV: {message}")]
    Csv {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// What was wrong.
        message: String,
    },
    /// A required column is not in the header.
    #[error("{path}: missing column `{column}` (the header has: {available})")]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The missing column.
        column: String,
        /// The header, comma-separated.
        available: String,
    },
    /// A column that is needed appears more than once in the header, so which copy to use
    /// would be a guess.
    #[error(
        "{path}: column `{column}` appears twice in the header (columns {first} and {second}, counting from 1); remove or rename one of them"
    )]
    DuplicateColumn {
        /// The file.
        path: PathBuf,
        /// The column name.
        column: String,
        /// 1-based position of the first copy.
        first: usize,
        /// 1-based position of the second copy.
        second: usize,
    },
    /// A cell in a numeric column does not parse as a number.
    #[error("{path}:{line}: column `{column}`: expected a number, got {value:?}")]
    NotNumeric {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// The column.
        column: String,
        /// The cell text.
        value: String,
    },
    /// A cell is NaN or infinite.
    #[error("{path}:{line}: column `{column}`: expected a finite number, got {value:?}")]
    NonFinite {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// The column.
        column: String,
        /// The cell text.
        value: String,
    },
    /// A cell is finite as f64 but not as the f32 the model computes in (|x| > f32::MAX).
    #[error(
        "{path}:{line}: column `{column}`: expected a number within f32's range (|x| ≤ 3.4028235e38), got {value:?} (infinite in f32)"
    )]
    OutOfF32Range {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// The column.
        column: String,
        /// The cell text.
        value: String,
    },
    /// The file has a header but no data rows.
    #[error("{path}: no data rows")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A split selects no rows.
    #[error("{path}: the {split} split ({range}) selects no rows of column `{column}`")]
    EmptySplit {
        /// The file.
        path: PathBuf,
        /// `train`, `validation` or `test`.
        split: &'static str,
        /// The season range.
        range: String,
        /// The season column.
        column: String,
    },
    /// A generic, already-located problem (dataset derivation).
    #[error("{0}")]
    Other(String),
}

/// A CSV file held as text cells, with the line number of each row.
#[derive(Debug, Clone)]
pub struct CsvTable {
    /// Where it was read from (for messages).
    pub path: PathBuf,
    /// The header.
    pub header: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
    /// The 1-based line of each row.
    pub lines: Vec<u64>,
}

impl CsvTable {
    /// Read a whole CSV file with a header row.
    pub fn read(path: &Path) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes, path)
    }

    /// Parse CSV bytes; `path` is only used in messages.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self, DataError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .trim(csv::Trim::All)
            .from_reader(bytes);
        let csv_err = |e: csv::Error| {
            let line = e.position().map(|p| p.line()).unwrap_or(0);
            DataError::Csv {
                path: path.to_path_buf(),
                line,
                message: match e.kind() {
                    csv::ErrorKind::UnequalLengths {
                        expected_len, len, ..
                    } => format!("expected {expected_len} fields, found {len}"),
                    csv::ErrorKind::Utf8 { .. } => "invalid UTF-8".to_string(),
                    _ => e.to_string(),
                },
            }
        };
        let header: Vec<String> = reader
            .headers()
            .map_err(csv_err)?
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut rows = Vec::new();
        let mut lines = Vec::new();
        let mut record = csv::StringRecord::new();
        loop {
            match reader.read_record(&mut record) {
                Ok(true) => {
                    lines.push(record.position().map(|p| p.line()).unwrap_or(0));
                    rows.push(record.iter().map(|s| s.to_string()).collect());
                }
                Ok(false) => break,
                Err(e) => return Err(csv_err(e)),
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            header,
            rows,
            lines,
        })
    }

    /// The index of a column, or an error listing the header (or naming both positions when
    /// the column appears twice).
    pub fn column_index(&self, name: &str) -> Result<usize, DataError> {
        let mut at = self
            .header
            .iter()
            .enumerate()
            .filter(|(_, h)| *h == name)
            .map(|(i, _)| i);
        let first = at.next().ok_or_else(|| DataError::MissingColumn {
            path: self.path.clone(),
            column: name.to_string(),
            available: self.header.join(","),
        })?;
        if let Some(second) = at.next() {
            return Err(DataError::DuplicateColumn {
                path: self.path.clone(),
                column: name.to_string(),
                first: first + 1,
                second: second + 1,
            });
        }
        Ok(first)
    }

    /// A column parsed as finite numbers.
    pub fn numeric_column(&self, name: &str) -> Result<Vec<f64>, DataError> {
        let idx = self.column_index(name)?;
        self.rows
            .iter()
            .zip(&self.lines)
            .map(|(row, &line)| self.parse_cell(&row[idx], line, name))
            .collect()
    }

    /// Parse one cell as a finite number.
    pub fn parse_cell(&self, cell: &str, line: u64, column: &str) -> Result<f64, DataError> {
        parse_finite(cell).map_err(|finite| {
            let (path, column, value) = (self.path.clone(), column.to_string(), cell.to_string());
            if finite {
                DataError::NotNumeric {
                    path,
                    line,
                    column,
                    value,
                }
            } else {
                DataError::NonFinite {
                    path,
                    line,
                    column,
                    value,
                }
            }
        })
    }

    /// Parse one cell as a number that is finite after conversion to f32 (3.5e38 is finite
    /// in f64 but infinite in f32: [`DataError::OutOfF32Range`]).
    pub fn parse_cell_f32(&self, cell: &str, line: u64, column: &str) -> Result<f32, DataError> {
        let v = self.parse_cell(cell, line, column)? as f32;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(DataError::OutOfF32Range {
                path: self.path.clone(),
                line,
                column: column.to_string(),
                value: cell.to_string(),
            })
        }
    }

    /// Several columns parsed as numbers, stored row-major as f32 (`rows × names.len()`);
    /// a value that is finite but not in f32 ([`DataError::OutOfF32Range`]) is refused.
    pub fn numeric_matrix(&self, names: &[String]) -> Result<Vec<f32>, DataError> {
        let idx: Vec<usize> = names
            .iter()
            .map(|n| self.column_index(n))
            .collect::<Result<_, _>>()?;
        let mut out = Vec::with_capacity(self.rows.len() * names.len());
        for (row, &line) in self.rows.iter().zip(&self.lines) {
            for (&i, name) in idx.iter().zip(names) {
                out.push(self.parse_cell_f32(&row[i], line, name)?);
            }
        }
        Ok(out)
    }
}

/// Parse a finite number. `Err(true)` = not a number at all, `Err(false)` = NaN or ±∞.
pub fn parse_finite(cell: &str) -> Result<f64, bool> {
    match cell.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(false),
        Err(_) => Err(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Result<CsvTable, DataError> {
        CsvTable::from_bytes(s.as_bytes(), Path::new("rows.csv"))
    }

    #[test]
    fn errors_name_file_line_and_column() {
        let tab = t("a,b\n1,2\n3,x\n").unwrap();
        assert_eq!(tab.numeric_column("a").unwrap(), vec![1.0, 3.0]);
        let e = tab.numeric_column("b").unwrap_err().to_string();
        assert_eq!(e, "rows.csv:3: column `b`: expected a number, got \"x\"");
        let e = tab.numeric_column("c").unwrap_err().to_string();
        assert!(e.contains("missing column `c`") && e.contains("a,b"), "{e}");
        let tab = t("a,b\n1,NaN\n").unwrap();
        let e = tab.numeric_column("b").unwrap_err().to_string();
        assert!(
            e.contains("rows.csv:2: column `b`: expected a finite number"),
            "{e}"
        );
        let tab = t("a,b\n1,2\n3.5e38,1\n").unwrap();
        let e = tab.numeric_matrix(&["b".into(), "a".into()]).unwrap_err();
        assert!(matches!(e, DataError::OutOfF32Range { line: 3, .. }), "{e}");
        let e = e.to_string();
        assert!(
            e.starts_with("rows.csv:3: column `a`: expected a number within f32's range")
                && e.contains("\"3.5e38\""),
            "{e}"
        );
        let tab = t("a,b\n1,\n").unwrap();
        assert!(matches!(
            tab.numeric_column("b").unwrap_err(),
            DataError::NotNumeric { line: 2, .. }
        ));
    }

    #[test]
    fn a_needed_column_given_twice_names_both_positions() {
        let tab = t("id,a,b,a\n1,2,3,4\n").unwrap();
        let e = tab.numeric_column("a").unwrap_err();
        assert!(
            matches!(
                e,
                DataError::DuplicateColumn {
                    first: 2,
                    second: 4,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("rows.csv: column `a` appears twice in the header (columns 2 and 4"),
            "{e}"
        );
        // A duplicate the caller does not use is not an error.
        assert_eq!(tab.numeric_column("b").unwrap(), vec![3.0]);
    }

    #[test]
    fn ragged_rows_are_located() {
        let e = t("a,b\n1,2\n3\n").unwrap_err().to_string();
        assert!(
            e.starts_with("rows.csv:3: malformed CSV: expected 2 fields, found 1"),
            "{e}"
        );
    }
}
