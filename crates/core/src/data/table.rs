//! CSV → named columns, with errors that name the file, line and column.

pub use super::column::{Column, ReadLimits, bytes_text};
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
    /// Reading the file would pass one of the [`ReadLimits`] (inflated or materialised
    /// bytes, one line, one value, the number of columns); the message names the limit and
    /// the environment variable that raises it.
    #[error("{path}: {message}")]
    Limit {
        /// The file.
        path: PathBuf,
        /// Which limit, where, and how to raise it.
        message: String,
    },
    /// A generic, already-located problem (dataset derivation).
    #[error("{0}")]
    Other(String),
}

/// A CSV (or Parquet) file held column by column, with the line number of each row. Cells
/// are stored compactly, never as one `String` each: a column whose every cell is empty or
/// the shortest text of an `f32` (`0.25`, `2017`, `-3`) as that `f32` (4 bytes a cell),
/// any other column as one text buffer with the end of each cell (8 bytes a cell plus its
/// text). [`CsvTable::cell`] gives back exactly the text that was read.
#[derive(Debug, Clone)]
pub struct CsvTable {
    /// Where it was read from (for messages).
    pub path: PathBuf,
    /// The header.
    pub header: Vec<String>,
    /// The cells, one entry per header column (empty for a column not read).
    columns: Vec<Column>,
    /// Per header column, whether it was read (a projected read skips the rest: see
    /// [`CsvTable::read_file_columns`]).
    loaded: Vec<bool>,
    /// The 1-based line of each row.
    pub lines: Vec<u64>,
}

pub use super::column::Projection;

/// Which limit a stream passed (carried inside an `io::Error` through the CSV reader).
#[derive(Debug)]
enum LimitHit {
    /// The text grew past `max_bytes`.
    Inflated(u64),
    /// Line `line` grew past `max_line_bytes`.
    Line { line: u64, limit: u64 },
}

impl std::fmt::Display for LimitHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for LimitHit {}

/// A text stream that counts its bytes and lines, refusing to go past the table and line
/// limits; it remembers where its recent newlines are so that a record's byte offset gives
/// its line.
struct Tracked<R> {
    inner: R,
    offset: u64,
    line_start: u64,
    newlines_total: u64,
    prev_cr: bool,
    /// Newline offsets not yet passed by a line query, with whether a CR precedes each.
    pending: std::collections::VecDeque<(u64, bool)>,
    /// Newlines before the oldest pending one.
    counted: u64,
    limits: ReadLimits,
}

impl<R: std::io::Read> Tracked<R> {
    fn new(inner: R, limits: ReadLimits) -> Self {
        Self {
            inner,
            offset: 0,
            line_start: 0,
            newlines_total: 0,
            prev_cr: false,
            pending: Default::default(),
            counted: 0,
            limits,
        }
    }

    /// The 1-based line of a record starting at byte `at` (a record reported at the LF of
    /// a CRLF starts after it). Queries come in increasing order.
    fn line_at(&mut self, at: u64) -> u64 {
        while let Some(&(off, cr)) = self.pending.front() {
            if off < at || (off == at && cr) {
                self.pending.pop_front();
                self.counted += 1;
            } else {
                break;
            }
        }
        self.counted + 1
    }
}

impl<R: std::io::Read> std::io::Read for Tracked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        for (i, &b) in buf[..n].iter().enumerate() {
            if b == b'\n' {
                let at = self.offset + i as u64;
                self.pending.push_back((at, self.prev_cr));
                self.newlines_total += 1;
                self.line_start = at + 1;
            }
            self.prev_cr = b == b'\r';
        }
        self.offset += n as u64;
        if self.offset > self.limits.max_bytes {
            return Err(std::io::Error::other(LimitHit::Inflated(
                self.limits.max_bytes,
            )));
        }
        if self.offset - self.line_start > self.limits.max_line_bytes {
            return Err(std::io::Error::other(LimitHit::Line {
                line: self.newlines_total + 1,
                limit: self.limits.max_line_bytes,
            }));
        }
        Ok(n)
    }
}

/// Whether the file at `path` looks like Parquet: `PAR1` at both ends.
fn file_is_parquet(file: &mut std::fs::File) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let len = file.seek(SeekFrom::End(0))?;
    if len < 8 {
        file.seek(SeekFrom::Start(0))?;
        return Ok(false);
    }
    let (mut head, mut tail) = ([0u8; 4], [0u8; 4]);
    file.seek(SeekFrom::Start(0))?;
    file.read_exact(&mut head)?;
    file.seek(SeekFrom::End(-4))?;
    file.read_exact(&mut tail)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(&head == b"PAR1" && &tail == b"PAR1")
}

/// A file that hashes (SHA-256) every byte read from it, when asked to.
struct Hashing<R> {
    inner: R,
    hash: Option<sha2::Sha256>,
}

impl<R: std::io::Read> std::io::Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = &mut self.hash {
            sha2::Digest::update(h, &buf[..n]);
        }
        Ok(n)
    }
}

impl<R: std::io::Read> Hashing<R> {
    /// Read the rest and return the hex digest (`None` when not hashing).
    fn finish(mut self) -> std::io::Result<Option<String>> {
        if self.hash.is_none() {
            return Ok(None);
        }
        std::io::copy(&mut self, &mut std::io::sink())?;
        Ok(self.hash.map(|h| {
            sha2::Digest::finalize(h)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        }))
    }
}

impl CsvTable {
    /// Read a whole table: a Parquet file (by its `.parquet`/`.pq` extension or its `PAR1`
    /// magic bytes) or a CSV file with a header row, within the [`ReadLimits`] of the
    /// environment.
    pub fn read(path: &Path) -> Result<Self, DataError> {
        Ok(Self::read_inner(path, None, None, false, None)?.0)
    }

    /// Read a table file as [`CsvTable::read`] does, with a given `format` and `delimiter`
    /// (`None`: by extension/magic bytes, and sniffed), also returning the SHA-256 (hex) of
    /// the file's bytes. The file is opened once and streamed, never held whole in memory
    /// (CSV: hashed as it is read; Parquet: one pass to hash, then read in place).
    pub fn read_file(
        path: &Path,
        format: Option<crate::config::DataFormat>,
        delimiter: Option<u8>,
    ) -> Result<(Self, String), DataError> {
        Self::read_file_columns(path, format, delimiter, None)
    }

    /// [`CsvTable::read_file`] keeping only the columns `keep` names (every column when
    /// `None`): the others are parsed past (CSV) or never decoded (Parquet), are not held,
    /// and count against no limit but the line and table-size ones of the text itself. The
    /// header stays whole, so a missing column is still named with every column the file has;
    /// asking for a column that was not kept is an error, never a silent empty column.
    pub fn read_file_columns(
        path: &Path,
        format: Option<crate::config::DataFormat>,
        delimiter: Option<u8>,
        keep: Projection<'_>,
    ) -> Result<(Self, String), DataError> {
        let (table, sha) = Self::read_inner(path, format, delimiter, true, keep)?;
        Ok((table, sha.unwrap_or_default()))
    }

    fn read_inner(
        path: &Path,
        format: Option<crate::config::DataFormat>,
        delimiter: Option<u8>,
        hash: bool,
        keep: Projection<'_>,
    ) -> Result<(Self, Option<String>), DataError> {
        use crate::config::DataFormat;
        use std::io::{Seek, SeekFrom};
        let limits = ReadLimits::from_env().map_err(DataError::Other)?;
        let io = |source| DataError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let parquet = match format {
            Some(f) => f == DataFormat::Parquet,
            None => {
                // A pipe or other stream cannot be sniffed at both ends without reading it
                // twice: only a regular file is; a stream is CSV unless its name says Parquet.
                DataFormat::of(path, None) == DataFormat::Parquet
                    || (file.metadata().map_err(io)?.is_file()
                        && file_is_parquet(&mut file).map_err(io)?)
            }
        };
        if parquet {
            let sha = if hash {
                let sha = Hashing {
                    inner: &mut file,
                    hash: Some(Default::default()),
                }
                .finish()
                .map_err(io)?;
                file.seek(SeekFrom::Start(0)).map_err(io)?;
                sha
            } else {
                None
            };
            let table =
                Self::from_parquet(super::parquet::read_file_columns(file, &limits, keep), path)?;
            return Ok((table, sha));
        }
        let mut raw = std::io::BufReader::with_capacity(
            1 << 16,
            Hashing {
                inner: file,
                hash: hash.then(Default::default),
            },
        );
        let table = Self::from_reader_columns(&mut raw, path, delimiter, &limits, keep)?;
        let sha = raw.into_inner().finish().map_err(io)?;
        Ok((table, sha))
    }

    fn from_parquet(
        cells: Result<super::parquet::ProjectedCells, String>,
        path: &Path,
    ) -> Result<Self, DataError> {
        let (header, columns, loaded) = cells.map_err(|message| DataError::Format {
            path: path.to_path_buf(),
            message,
        })?;
        let n = columns
            .iter()
            .zip(&loaded)
            .find(|(_, l)| **l)
            .map_or(0, |(c, _)| c.len());
        let mut table = Self::empty(path, header);
        table.columns = columns;
        table.loaded = loaded;
        for c in &mut table.columns {
            c.shrink();
        }
        table.lines = (1..=n as u64).collect();
        Ok(table)
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
            let limits = ReadLimits::from_env().map_err(DataError::Other)?;
            Self::from_parquet(
                super::parquet::read_with(bytes, &limits).map(|(h, c)| {
                    let loaded = vec![true; h.len()];
                    (h, c, loaded)
                }),
                path,
            )
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
        Self::from_reader(
            bytes,
            path,
            delimiter,
            &ReadLimits::from_env().map_err(DataError::Other)?,
        )
    }

    /// Parse a CSV stream (gzip-compressed when it starts with the gzip magic bytes) within
    /// `limits`, streaming: the text is never held whole; `path` is only used in messages.
    pub fn from_reader(
        raw: impl std::io::BufRead,
        path: &Path,
        delimiter: Option<u8>,
        limits: &ReadLimits,
    ) -> Result<Self, DataError> {
        Self::from_reader_columns(raw, path, delimiter, limits, None)
    }

    /// [`CsvTable::from_reader`] keeping only the columns `keep` names (see
    /// [`CsvTable::read_file_columns`]).
    pub fn from_reader_columns(
        mut raw: impl std::io::BufRead,
        path: &Path,
        delimiter: Option<u8>,
        limits: &ReadLimits,
        keep: Projection<'_>,
    ) -> Result<Self, DataError> {
        use std::io::Read;
        let gz = raw
            .fill_buf()
            .map_err(|source| DataError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .starts_with(&[0x1f, 0x8b]);
        let text: Box<dyn Read + '_> = if gz {
            Box::new(flate2::bufread::MultiGzDecoder::new(raw))
        } else {
            Box::new(raw)
        };
        let mut tracked = Tracked::new(text, *limits);
        let limit_error = |hit: &LimitHit| match *hit {
            LimitHit::Inflated(limit) => DataError::Limit {
                path: path.to_path_buf(),
                message: format!(
                    "{} past the {} limit (KILN_MAX_TABLE_BYTES); raise it or read fewer rows",
                    if gz { "inflates" } else { "is larger than" },
                    bytes_text(limit)
                ),
            },
            LimitHit::Line { line, limit } => DataError::Limit {
                path: path.to_path_buf(),
                message: format!(
                    "line {line} is longer than the {} limit (KILN_MAX_LINE_BYTES); is this a CSV file?",
                    bytes_text(limit)
                ),
            },
        };
        let io_error = |e: &std::io::Error, line: u64| -> DataError {
            if let Some(hit) = e.get_ref().and_then(|x| x.downcast_ref::<LimitHit>()) {
                return limit_error(hit);
            }
            if gz {
                DataError::Csv {
                    path: path.to_path_buf(),
                    line,
                    message: format!("not a readable gzip file: {e}"),
                }
            } else {
                DataError::Io {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(e.kind(), e.to_string()),
                }
            }
        };
        // The first 64 KiB, to sniff the delimiter from; then the rest of the stream.
        let mut head = Vec::new();
        (&mut tracked)
            .take(1 << 16)
            .read_to_end(&mut head)
            .map_err(|e| io_error(&e, 0))?;
        let delimiter = delimiter.unwrap_or_else(|| sniff_delimiter(&head));
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .delimiter(delimiter)
            .trim(csv::Trim::All)
            .from_reader(std::io::Cursor::new(head).chain(tracked));
        // The line of a byte offset. csv's own line count is one too high after a CRLF
        // record end (it counts the LF when it starts the next record), so lines are counted
        // by the stream from the byte offsets, which are exact.
        let csv_err = |e: csv::Error, reader: &mut csv::Reader<_>| {
            let line = match e.position() {
                Some(p) => line_of(reader, p.byte()),
                None => reader.get_ref().get_ref().1.newlines_total + 1,
            };
            let message = match e.kind() {
                csv::ErrorKind::Io(e) => return io_error(e, line),
                csv::ErrorKind::UnequalLengths {
                    expected_len, len, ..
                } => format!("expected {expected_len} fields, found {len}"),
                csv::ErrorKind::Utf8 { .. } => {
                    "invalid UTF-8 (is this a CSV file? A Parquet file is read by its .parquet extension, its PAR1 magic bytes or data.format: parquet)".to_string()
                }
                _ => e.to_string(),
            };
            DataError::Csv {
                path: path.to_path_buf(),
                line,
                message,
            }
        };
        let header = reader
            .headers()
            .map(|h| h.iter().map(|s| s.to_string()).collect::<Vec<String>>());
        let header = match header {
            Ok(h) => h,
            Err(e) => return Err(csv_err(e, &mut reader)),
        };
        if header.len() > limits.max_columns {
            return Err(DataError::Limit {
                path: path.to_path_buf(),
                message: format!(
                    "the header has {} columns, past the {} limit (KILN_MAX_COLUMNS)",
                    header.len(),
                    limits.max_columns
                ),
            });
        }
        // What a cell costs at most beyond its text (the end offset of a text column), and a
        // row beyond its cells (its line).
        let (cell_cost, row_cost) = (8u64, 8u64);
        let mut held = 0u64;
        let mut table = Self::empty(path, header);
        if let Some(keep) = keep {
            table.loaded = table.header.iter().map(|h| keep(h)).collect();
        }
        let header = &table.header;
        let loaded = &table.loaded;
        let mut columns = std::mem::take(&mut table.columns);
        let mut lines = Vec::new();
        let mut record = csv::StringRecord::new();
        loop {
            match reader.read_record(&mut record) {
                Ok(true) => {
                    let line = record
                        .position()
                        .map(|p| line_of(&mut reader, p.byte()))
                        .unwrap_or(0);
                    held += row_cost;
                    for (j, cell) in record.iter().enumerate() {
                        if !loaded.get(j).copied().unwrap_or(false) {
                            continue;
                        }
                        if cell.len() as u64 > limits.max_cell_bytes {
                            return Err(DataError::Limit {
                                path: path.to_path_buf(),
                                message: format!(
                                    "line {line}, column `{}`: a value of {} bytes, past the {} limit (KILN_MAX_CELL_BYTES)",
                                    header.get(j).map_or("?", |h| h.as_str()),
                                    cell.len(),
                                    bytes_text(limits.max_cell_bytes)
                                ),
                            });
                        }
                        held += cell_cost + cell.len() as u64;
                    }
                    if held > limits.max_bytes {
                        return Err(DataError::Limit {
                            path: path.to_path_buf(),
                            message: format!(
                                "the table needs more than the {} limit (KILN_MAX_TABLE_BYTES) once read (at line {line}); raise it or read fewer rows",
                                bytes_text(limits.max_bytes)
                            ),
                        });
                    }
                    lines.push(line);
                    for ((col, cell), _) in columns
                        .iter_mut()
                        .zip(record.iter())
                        .zip(loaded)
                        .filter(|(_, l)| **l)
                    {
                        col.push(cell);
                    }
                }
                Ok(false) => break,
                Err(e) => return Err(csv_err(e, &mut reader)),
            }
        }
        for c in &mut columns {
            c.shrink();
        }
        lines.shrink_to_fit();
        table.columns = columns;
        table.lines = lines;
        Ok(table)
    }

    /// A table with `header` and no rows.
    fn empty(path: &Path, header: Vec<String>) -> Self {
        Self {
            path: path.to_path_buf(),
            columns: header.iter().map(|_| Column::new()).collect(),
            loaded: vec![true; header.len()],
            header,
            lines: Vec::new(),
        }
    }

    /// A table of given rows (each as long as `header`) and their lines.
    pub fn from_rows(
        path: &Path,
        header: Vec<String>,
        rows: impl IntoIterator<Item = Vec<String>>,
        lines: Vec<u64>,
    ) -> Self {
        let mut t = Self::empty(path, header);
        for row in rows {
            for (col, cell) in t.columns.iter_mut().zip(&row) {
                col.push(cell);
            }
        }
        t.lines = lines;
        t
    }

    /// The rows `keep` says yes to (by row index), in order.
    pub fn retain_rows(&self, mut keep: impl FnMut(usize) -> bool) -> Self {
        let kept: Vec<usize> = (0..self.n_rows()).filter(|&r| keep(r)).collect();
        let mut t = Self::empty(&self.path, self.header.clone());
        t.loaded.clone_from(&self.loaded);
        for (j, col) in t.columns.iter_mut().enumerate() {
            if !self.loaded[j] {
                continue;
            }
            for &r in &kept {
                col.push(&self.columns[j].get(r));
            }
        }
        t.lines = kept.iter().map(|&r| self.lines[r]).collect();
        t
    }

    /// The number of data rows.
    pub fn n_rows(&self) -> usize {
        self.lines.len()
    }

    /// The text of row `r`'s cell in column `j` (both from 0), exactly as read.
    pub fn cell(&self, r: usize, j: usize) -> std::borrow::Cow<'_, str> {
        self.columns[j].get(r)
    }

    /// The cells of column `j`, in row order.
    pub fn column_cells(&self, j: usize) -> impl Iterator<Item = std::borrow::Cow<'_, str>> + '_ {
        (0..self.columns[j].len()).map(move |r| self.columns[j].get(r))
    }

    /// Whether row `r`'s cell in column `j` is missing ([`is_missing`]), without
    /// materialising its text.
    pub fn is_missing_at(&self, r: usize, j: usize) -> bool {
        match &self.columns[j] {
            Column::F32(v) => v[r].is_nan(),
            c => is_missing(&c.get(r)),
        }
    }

    /// Row `r`'s cell in column `j` parsed as [`CsvTable::parse_cell_f32`] does (the value
    /// and every error the same), without materialising text for a numeric column.
    pub fn f32_at(&self, r: usize, j: usize, column: &str) -> Result<f32, DataError> {
        match &self.columns[j] {
            Column::F32(v) if !v[r].is_nan() => Ok(v[r]),
            c => self.parse_cell_f32(&c.get(r), self.lines[r], column),
        }
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
        if !self.loaded[first] {
            return Err(DataError::Other(format!(
                "{}: column `{name}` was not read (only the columns the config uses are)",
                self.path.display()
            )));
        }
        Ok(first)
    }

    /// A column parsed as finite numbers.
    pub fn numeric_column(&self, name: &str) -> Result<Vec<f64>, DataError> {
        let idx = self.column_index(name)?;
        (0..self.n_rows())
            .map(|r| self.parse_cell(&self.cell(r, idx), self.lines[r], name))
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
        let mut out = Vec::with_capacity(self.n_rows() * names.len());
        for r in 0..self.n_rows() {
            for (&i, name) in idx.iter().zip(names) {
                out.push(self.f32_at(r, i, name)?);
            }
        }
        Ok(out)
    }
}

/// The line of a record starting at byte `at` of the CSV stream.
fn line_of<R: std::io::Read>(
    reader: &mut csv::Reader<std::io::Chain<std::io::Cursor<Vec<u8>>, Tracked<R>>>,
    at: u64,
) -> u64 {
    reader.get_mut().get_mut().1.line_at(at)
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
    fn a_projected_read_keeps_only_the_named_columns() {
        let big = "x".repeat(2000);
        let text = format!("id,a,note,b\n1,2,{big},3\n4,5,{big},6\n7,8,,9\n");
        let limits = ReadLimits {
            max_cell_bytes: 100,
            ..ReadLimits::default()
        };
        let read = |keep: Projection<'_>| {
            CsvTable::from_reader_columns(
                text.as_bytes(),
                Path::new("rows.csv"),
                None,
                &limits,
                keep,
            )
        };
        // Every column: the long value in `note` is past the cell limit.
        let e = read(None).unwrap_err().to_string();
        assert!(
            e.contains("column `note`") && e.contains("KILN_MAX_CELL_BYTES"),
            "{e}"
        );
        // Only `a` and `b`: `note` is parsed past, neither held nor limited.
        let keep = |c: &str| c == "a" || c == "b";
        let tab = read(Some(&keep)).unwrap();
        assert_eq!(
            tab.header,
            ["id", "a", "note", "b"],
            "the header stays whole"
        );
        assert_eq!(tab.lines, vec![2, 3, 4]);
        assert_eq!(tab.numeric_column("a").unwrap(), vec![2.0, 5.0, 8.0]);
        assert_eq!(tab.numeric_column("b").unwrap(), vec![3.0, 6.0, 9.0]);
        let e = tab.column_index("note").unwrap_err().to_string();
        assert!(e.contains("column `note` was not read"), "{e}");
        // A column the file lacks is named with every column it has.
        let e = tab.column_index("c").unwrap_err().to_string();
        assert!(e.contains("id,a,note,b"), "{e}");
        // Row selection keeps the projection.
        let odd = tab.retain_rows(|r| r != 1);
        assert_eq!(odd.numeric_column("b").unwrap(), vec![3.0, 9.0]);
        assert!(odd.column_index("note").is_err());
        // A ragged row is still an error, in a skipped column too.
        let ragged = "a,b,c\n1,2,3\n4,5\n";
        let e = CsvTable::from_reader_columns(
            ragged.as_bytes(),
            Path::new("rows.csv"),
            None,
            &limits,
            Some(&keep),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("rows.csv:3: malformed CSV"), "{e}");
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
        assert_eq!(tab.cell(0, 0), "x\r\ny");
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
        assert_eq!([tab.cell(0, 0), tab.cell(0, 1)], ["1,5", "x;y"]);
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
    fn limits_come_from_the_environment_with_units() {
        let l = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            ReadLimits::from_lookup(move |k| {
                pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
            })
        };
        assert_eq!(l(&[]).unwrap(), ReadLimits::default());
        let got = l(&[
            ("KILN_MAX_TABLE_BYTES", "4g"),
            ("KILN_MAX_LINE_BYTES", "512MiB"),
            ("KILN_MAX_CELL_BYTES", "1048576"),
            ("KILN_MAX_COLUMNS", "12"),
        ])
        .unwrap();
        assert_eq!(
            (
                got.max_bytes,
                got.max_line_bytes,
                got.max_cell_bytes,
                got.max_columns
            ),
            (4 << 30, 512 << 20, 1 << 20, 12)
        );
        for bad in ["lots", "0", "-1", "9999999999999999999g"] {
            let e = l(&[("KILN_MAX_TABLE_BYTES", bad)]).unwrap_err().to_string();
            assert!(
                e.starts_with("KILN_MAX_TABLE_BYTES: expected a positive"),
                "{e}"
            );
        }
        assert_eq!(bytes_text(4 << 30), "4 GiB");
        assert_eq!(bytes_text(1536 << 10), "1536 KiB");
        assert_eq!(bytes_text(17), "17 B");
    }

    #[test]
    fn each_limit_ends_the_read_with_an_error_naming_file_and_limit() {
        let small = ReadLimits {
            max_bytes: 1 << 20,
            max_line_bytes: 100,
            max_cell_bytes: 20,
            max_columns: 3,
        };
        let read = |bytes: &[u8], limits: &ReadLimits| {
            CsvTable::from_reader(bytes, Path::new("t.csv"), None, limits)
                .unwrap_err()
                .to_string()
        };
        // A line with no end: refused at the line limit, with its line number.
        let mut text = b"a,b\n1,2\n".to_vec();
        text.extend(std::iter::repeat_n(b'0', 1000));
        assert_eq!(
            read(&text, &small),
            "t.csv: line 3 is longer than the 100 B limit (KILN_MAX_LINE_BYTES); is this a CSV file?"
        );
        // A value past the cell limit names its line and column.
        let e = read(b"a,b\n1,2\n3,123456789012345678901234\n", &small);
        assert!(
            e.starts_with("t.csv: line 3, column `b`: a value of 24 bytes, past the 20 B limit (KILN_MAX_CELL_BYTES)"),
            "{e}"
        );
        let e = read(b"a,b,c,d\n1,2,3,4\n", &small);
        assert_eq!(
            e,
            "t.csv: the header has 4 columns, past the 3 limit (KILN_MAX_COLUMNS)"
        );
        // Materialised bytes: many short rows.
        let rows: String = "a,b\n".to_string() + &"1,2\n".repeat(200_000);
        let e = read(rows.as_bytes(), &small);
        assert!(
            e.starts_with("t.csv: the table needs more than the 1 MiB limit (KILN_MAX_TABLE_BYTES) once read (at line "),
            "{e}"
        );
        // A gzip bomb: blank lines inflate past the limit without a single row.
        use std::io::Write;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(b"a,b\n").unwrap();
        z.write_all(&vec![b'\n'; 4 << 20]).unwrap();
        let gz = z.finish().unwrap();
        assert!(gz.len() < 64 << 10);
        let limits = ReadLimits {
            max_line_bytes: 1 << 20,
            ..small
        };
        let e = CsvTable::from_reader(&gz[..], Path::new("t.csv.gz"), None, &limits)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "t.csv.gz: inflates past the 1 MiB limit (KILN_MAX_TABLE_BYTES); raise it or read fewer rows"
        );
        // Within the limits the same reader reads, with exact lines across read boundaries.
        let mut text = String::from("a,b\r\n");
        for i in 0..5000 {
            text.push_str(&format!("{i},{}\r\n", i * 2));
        }
        let t = CsvTable::from_reader(
            std::io::BufReader::with_capacity(7, text.as_bytes()),
            Path::new("t.csv"),
            None,
            &ReadLimits::default(),
        )
        .unwrap();
        assert_eq!(t.lines.len(), 5000);
        assert!(t.lines.iter().enumerate().all(|(i, &l)| l == i as u64 + 2));
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
