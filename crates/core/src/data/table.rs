//! CSV → named columns, with errors that name the file, line and column.

pub use kiln_model::preprocess::{is_missing, parse_finite};
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
    /// A cell that is not what its column's role needs.
    #[error("{path}:{line}: column `{column}`: {message}")]
    Cell {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// The column.
        column: String,
        /// What was wrong and what was expected.
        message: String,
    },
    /// The split cannot be resolved on this data.
    #[error("{path}: {message}")]
    Split {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The file is not readable in its format (e.g. a damaged Parquet file).
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
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
    /// Read a whole table: a Parquet file (by its `.parquet`/`.pq` extension or its `PAR1`
    /// magic bytes) or a CSV file with a header row.
    pub fn read(path: &Path) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_file_bytes(bytes, path, None, None)
    }

    /// A file's bytes as a table: `format` when given, else Parquet for a `.parquet`/`.pq`
    /// extension or `PAR1` magic bytes, else CSV (with `delimiter`, or sniffed).
    pub fn from_file_bytes(
        bytes: Vec<u8>,
        path: &Path,
        format: Option<crate::config::DataFormat>,
        delimiter: Option<u8>,
    ) -> Result<Self, DataError> {
        use crate::config::DataFormat;
        let parquet = match format {
            Some(f) => f == DataFormat::Parquet,
            None => {
                DataFormat::of(path, None) == DataFormat::Parquet
                    || super::parquet::is_parquet(&bytes)
            }
        };
        if parquet {
            let (header, rows) =
                super::parquet::read(bytes).map_err(|message| DataError::Format {
                    path: path.to_path_buf(),
                    message,
                })?;
            Ok(Self {
                path: path.to_path_buf(),
                header,
                lines: (1..=rows.len() as u64).collect(),
                rows,
            })
        } else {
            Self::from_bytes_with(&bytes, path, delimiter)
        }
    }

    /// Parse CSV bytes; `path` is only used in messages. The delimiter is sniffed from the
    /// header (see [`sniff_delimiter`]); gzip-compressed bytes are decompressed first.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self, DataError> {
        Self::from_bytes_with(bytes, path, None)
    }

    /// Like [`CsvTable::from_bytes`] with a given delimiter (`None`: sniffed).
    pub fn from_bytes_with(
        bytes: &[u8],
        path: &Path,
        delimiter: Option<u8>,
    ) -> Result<Self, DataError> {
        let inflated;
        let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
            use std::io::Read;
            let mut out = Vec::new();
            flate2::read::MultiGzDecoder::new(bytes)
                .read_to_end(&mut out)
                .map_err(|e| DataError::Csv {
                    path: path.to_path_buf(),
                    line: 0,
                    message: format!("not a readable gzip file: {e}"),
                })?;
            inflated = out;
            &inflated[..]
        } else {
            bytes
        };
        let delimiter = delimiter.unwrap_or_else(|| sniff_delimiter(bytes));
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .delimiter(delimiter)
            .trim(csv::Trim::All)
            .from_reader(bytes);
        // The line of a byte offset. csv's own line count is one too high after a CRLF
        // record end (it counts the LF when it starts the next record), so lines are counted
        // here from the byte offsets, which are exact.
        let mut lines_seen = (0usize, 1u64);
        let mut line_at = |offset: u64| -> u64 {
            let mut at = (offset as usize).min(bytes.len());
            // A record reported at the LF of a CRLF starts after it.
            if bytes.get(at) == Some(&b'\n') && at > 0 && bytes[at - 1] == b'\r' {
                at += 1;
            }
            let (from, line) = lines_seen;
            let line = if at >= from {
                line + bytes[from..at].iter().filter(|&&b| b == b'\n').count() as u64
            } else {
                1 + bytes[..at].iter().filter(|&&b| b == b'\n').count() as u64
            };
            lines_seen = (at, line);
            line
        };
        let csv_err = |e: csv::Error, line_at: &mut dyn FnMut(u64) -> u64| {
            let line = e.position().map(|p| line_at(p.byte())).unwrap_or(0);
            DataError::Csv {
                path: path.to_path_buf(),
                line,
                message: match e.kind() {
                    csv::ErrorKind::UnequalLengths {
                        expected_len, len, ..
                    } => format!("expected {expected_len} fields, found {len}"),
                    csv::ErrorKind::Utf8 { .. } => {
                        "invalid UTF-8 (is this a CSV file? A Parquet file is read by its .parquet extension, its PAR1 magic bytes or data.format: parquet)".to_string()
                    }
                    _ => e.to_string(),
                },
            }
        };
        let header: Vec<String> = match reader.headers() {
            Ok(h) => h.iter().map(|s| s.to_string()).collect(),
            Err(e) => return Err(csv_err(e, &mut line_at)),
        };
        let mut rows = Vec::new();
        let mut lines = Vec::new();
        let mut record = csv::StringRecord::new();
        loop {
            match reader.read_record(&mut record) {
                Ok(true) => {
                    lines.push(record.position().map(|p| line_at(p.byte())).unwrap_or(0));
                    rows.push(record.iter().map(|s| s.to_string()).collect());
                }
                Ok(false) => break,
                Err(e) => return Err(csv_err(e, &mut line_at)),
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

/// The delimiter of a CSV text: whichever of comma, tab and semicolon occurs most often
/// outside quotes in its first line (comma when none does).
pub fn sniff_delimiter(bytes: &[u8]) -> u8 {
    let mut counts = [0usize; 3];
    let mut quoted = false;
    for &b in bytes.iter().take(1 << 16) {
        match b {
            b'"' => quoted = !quoted,
            b'\n' | b'\r' if !quoted => break,
            b',' if !quoted => counts[0] += 1,
            b'\t' if !quoted => counts[1] += 1,
            b';' if !quoted => counts[2] += 1,
            _ => {}
        }
    }
    let best = (0..3).max_by_key(|&i| (counts[i], 3 - i)).unwrap_or(0);
    if counts[best] == 0 {
        b','
    } else {
        [b',', b'\t', b';'][best]
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

    #[test]
    fn crlf_files_have_the_right_line_numbers() {
        let text = "a,b\r\n1,2\r\n3,4\r\n5,x\r\n";
        let tab = t(text).unwrap();
        assert_eq!(tab.lines, vec![2, 3, 4]);
        let e = tab.numeric_column("b").unwrap_err().to_string();
        assert_eq!(e, "rows.csv:4: column `b`: expected a number, got \"x\"");
        let e = t("a,b\r\n1,2\r\n3\r\n").unwrap_err().to_string();
        assert!(e.starts_with("rows.csv:3: malformed CSV"), "{e}");
        // A quoted field spanning lines moves the next record's line on.
        let tab = t("a,b\r\n\"x\r\ny\",2\r\n3,4\r\n").unwrap();
        assert_eq!(tab.lines, vec![2, 4]);
        assert_eq!(tab.rows[0][0], "x\r\ny");
    }

    #[test]
    fn delimiters_are_sniffed_and_quotes_respected() {
        for (text, d) in [
            ("a\tb\n1\t2\n", b'\t'),
            ("a;b\n1,5;2\n", b';'),
            ("\"a;x\",b\n1,2\n", b','),
            ("a\n1\n", b','),
        ] {
            assert_eq!(sniff_delimiter(text.as_bytes()), d, "{text:?}");
        }
        let tab = t("a;b\n1,5;\"x;y\"\n").unwrap();
        assert_eq!(tab.header, vec!["a", "b"]);
        assert_eq!(tab.rows[0], vec!["1,5", "x;y"]);
        let tab = CsvTable::from_bytes_with(b"a|b\n1|2\n", Path::new("p.csv"), Some(b'|')).unwrap();
        assert_eq!(tab.numeric_column("b").unwrap(), vec![2.0]);
    }

    #[test]
    fn gzip_files_are_read() {
        use std::io::Write;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(b"a,b\n1,2\n3,4\n").unwrap();
        let gz = z.finish().unwrap();
        let tab = CsvTable::from_bytes(&gz, Path::new("rows.csv.gz")).unwrap();
        assert_eq!(tab.numeric_column("b").unwrap(), vec![2.0, 4.0]);
        assert_eq!(tab.lines, vec![2, 3]);
        let e = CsvTable::from_bytes(&gz[..gz.len() / 2], Path::new("rows.csv.gz"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a readable gzip file"), "{e}");
    }

    #[test]
    fn missing_tokens() {
        for c in ["", "  ", "NaN", "nan", "NA", "na", "null", "NULL"] {
            assert!(is_missing(c), "{c:?}");
        }
        for c in ["0", "inf", "N/A?", "none"] {
            assert!(!is_missing(c), "{c:?}");
        }
    }
}
