//! Parquet → the same text cells a CSV file gives (the header and rows from which
//! [`CsvTable`](super::table::CsvTable) is built), so that splits, missing
//! values, categorical columns and every message work the same for both formats.
//!
//! Each leaf column is read with Parquet's typed column readers (no Arrow), and each value is
//! written as the text that reads back to exactly the same number: integers in decimal,
//! `FLOAT`/`DOUBLE` as the shortest text of their `f64` value (so a column gives the same
//! f32 inputs as the CSV `pandas` writes of it), dates as `YYYY-MM-DD`, timestamps as
//! `YYYY-MM-DDTHH:MM:SS[.fff…]Z` (UTC), decimals with their scale, strings (plain or
//! dictionary-encoded) as they are. A null is an empty cell, that is, a missing value; so is
//! a floating-point NaN, as in a CSV file. Booleans are `true`/`false` (a categorical
//! column). Repeated (list/map) columns are refused with their name.
//!
//! Parquet has no lines: the "line" of a row in messages (`file.parquet:N`) is its 1-based
//! row number.

use parquet::basic::{ConvertedType, LogicalType, TimeUnit, Type as PhysicalType};
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::DataType;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::ColumnDescPtr;

use super::column::{Column, ReadLimits, bytes_text};
use crate::config::values::format_datetime;

/// Whether `bytes` start like a Parquet file (`PAR1`).
pub fn is_parquet(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes.starts_with(b"PAR1") && bytes.ends_with(b"PAR1")
}

/// The header and columns of a Parquet file.
pub type Cells = (Vec<String>, Vec<Column>);

/// Read a whole Parquet file (its bytes) as text cells: the header (leaf column paths) and
/// the rows; the error says what is wrong (the caller names the file). Within the default
/// [`ReadLimits`].
pub fn read(bytes: Vec<u8>) -> Result<Cells, String> {
    read_with(bytes, &ReadLimits::default())
}

/// [`read`] within `limits`.
pub fn read_with(bytes: Vec<u8>, limits: &ReadLimits) -> Result<Cells, String> {
    read_from(bytes::Bytes::from(bytes), limits, None).map(|(h, c, _)| (h, c))
}

/// [`read`] of an open file, read in place (never loaded whole), within `limits`.
pub fn read_file(file: std::fs::File, limits: &ReadLimits) -> Result<Cells, String> {
    read_from(file, limits, None).map(|(h, c, _)| (h, c))
}

/// The header, the columns and, per column, whether it was read.
pub type ProjectedCells = (Vec<String>, Vec<Column>, Vec<bool>);

/// [`read_file`] decoding only the columns `keep` names (every column when `None`); the
/// others stay empty and are marked not read. When `keep` names none of the file's columns,
/// the first is read anyway: the row count comes from values read, never from the footer.
pub fn read_file_columns(
    file: std::fs::File,
    limits: &ReadLimits,
    keep: crate::data::column::Projection<'_>,
) -> Result<ProjectedCells, String> {
    read_from(file, limits, keep)
}

/// Read any Parquet source. Nothing is sized from the file's own claims (row counts, page
/// sizes, dictionary sizes): values are read in bounded batches and every value is counted
/// against the limits as it is kept, so a footer that lies ends in an error, not a huge
/// allocation; a panic inside the Parquet decoder on a damaged file is an error too.
fn read_from<R: parquet::file::reader::ChunkReader + 'static>(
    source: R,
    limits: &ReadLimits,
    keep: crate::data::column::Projection<'_>,
) -> Result<ProjectedCells, String> {
    let limits = *limits;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        read_bounded(source, &limits, keep)
    })) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("the decoder failed");
            Err(format!("not a readable Parquet file: {what}"))
        }
    }
}

fn read_bounded<R: parquet::file::reader::ChunkReader + 'static>(
    source: R,
    limits: &ReadLimits,
    keep: crate::data::column::Projection<'_>,
) -> Result<ProjectedCells, String> {
    let bad = |e: parquet::errors::ParquetError| {
        let e = e.to_string();
        let hint = if e.contains("Disabled feature") || e.contains("not supported") {
            " (kiln reads Parquet compressed with snappy, gzip, lz4, zstd or uncompressed)"
        } else {
            ""
        };
        format!("not a readable Parquet file: {e}{hint}")
    };
    let reader = SerializedFileReader::new(source).map_err(bad)?;
    let meta = reader.metadata();
    let schema = meta.file_metadata().schema_descr();
    if schema.num_columns() > limits.max_columns {
        return Err(format!(
            "{} columns, past the {} limit (KILN_MAX_COLUMNS)",
            schema.num_columns(),
            limits.max_columns
        ));
    }
    let columns: Vec<ColumnDescPtr> = (0..schema.num_columns())
        .map(|i| schema.column(i))
        .collect();
    let header: Vec<String> = columns.iter().map(|c| c.path().string()).collect();
    let mut loaded: Vec<bool> = match keep {
        Some(keep) => header.iter().map(|h| keep(h)).collect(),
        None => vec![true; header.len()],
    };
    if !loaded.is_empty() && !loaded.contains(&true) {
        loaded[0] = true;
    }
    for (c, _) in columns.iter().zip(&loaded).filter(|(_, l)| **l) {
        if c.max_rep_level() > 0 {
            return Err(format!(
                "column `{}` is a list or map (a repeated Parquet column); kiln reads flat columns of numbers, strings, dates and timestamps",
                c.path().string()
            ));
        }
    }
    let mut budget = Budget {
        held: 0,
        limits: *limits,
    };
    let mut cells: Vec<Column> = columns.iter().map(|_| Column::new()).collect();
    for g in 0..meta.num_row_groups() {
        let group = reader.get_row_group(g).map_err(bad)?;
        let claimed = group.metadata().num_rows();
        let rows =
            usize::try_from(claimed).map_err(|_| format!("row group {g} claims {claimed} rows"))?;
        for (j, descr) in columns.iter().enumerate() {
            if !loaded[j] {
                continue;
            }
            let r = group.get_column_reader(j).map_err(bad)?;
            let before = cells[j].len();
            read_column(r, descr, rows, &mut cells[j], &mut budget).map_err(|e| match e {
                ColumnError::Parquet(e) => bad(e),
                ColumnError::Value(m) => format!("column `{}`: {m}", descr.path().string()),
                ColumnError::Limit(m) => m,
            })?;
            if cells[j].len() - before != rows {
                return Err(format!(
                    "column `{}` has {} values in row group {g}, which claims {rows} rows (a damaged or lying footer)",
                    descr.path().string(),
                    cells[j].len() - before
                ));
            }
        }
    }
    Ok((header, cells, loaded))
}

/// The bytes kept so far, against the limits.
struct Budget {
    held: u64,
    limits: ReadLimits,
}

impl Budget {
    /// Count one kept value of `len` bytes.
    fn keep(&mut self, len: usize) -> Result<(), ColumnError> {
        if len as u64 > self.limits.max_cell_bytes {
            return Err(ColumnError::Value(format!(
                "a value of {len} bytes, past the {} limit (KILN_MAX_CELL_BYTES)",
                bytes_text(self.limits.max_cell_bytes)
            )));
        }
        self.held += 8 + len as u64;
        if self.held > self.limits.max_bytes {
            return Err(ColumnError::Limit(format!(
                "the table needs more than the {} limit (KILN_MAX_TABLE_BYTES) once read; raise it or read fewer rows",
                bytes_text(self.limits.max_bytes)
            )));
        }
        Ok(())
    }
}

/// Records read per call: what one step may hold, whatever a page header claims.
const BATCH: usize = 8192;

enum ColumnError {
    Parquet(parquet::errors::ParquetError),
    Value(String),
    /// A limit was passed (the message is complete).
    Limit(String),
}

impl From<parquet::errors::ParquetError> for ColumnError {
    fn from(e: parquet::errors::ParquetError) -> Self {
        ColumnError::Parquet(e)
    }
}

/// Visit `rows` values of one column chunk in bounded batches, `None` for nulls.
fn values<T: DataType>(
    mut r: ColumnReaderImpl<T>,
    descr: &ColumnDescPtr,
    rows: usize,
    mut visit: impl FnMut(Option<T::T>) -> Result<(), ColumnError>,
) -> Result<(), ColumnError> {
    let max_def = descr.max_def_level();
    let mut defs: Vec<i16> = Vec::new();
    let mut vals: Vec<T::T> = Vec::new();
    let mut read = 0;
    while read < rows {
        defs.clear();
        vals.clear();
        let (records, _, _) =
            r.read_records((rows - read).min(BATCH), Some(&mut defs), None, &mut vals)?;
        if records == 0 {
            break;
        }
        read += records;
        if max_def == 0 {
            for v in vals.drain(..) {
                visit(Some(v))?;
            }
            continue;
        }
        let mut it = vals.drain(..);
        for &d in &defs {
            if d == max_def {
                let v = it
                    .next()
                    .ok_or_else(|| ColumnError::Value("fewer values than levels".into()))?;
                visit(Some(v))?;
            } else {
                visit(None)?;
            }
        }
    }
    Ok(())
}

/// Seconds and the fraction digits of a timestamp `v` in `per_second` units.
fn timestamp(v: i64, per_second: i64) -> String {
    let (s, f) = (v.div_euclid(per_second), v.rem_euclid(per_second));
    let text = format_datetime(s, true);
    if f == 0 {
        return text;
    }
    let digits = per_second.ilog10() as usize;
    let frac = format!("{f:0digits$}");
    let frac = frac.trim_end_matches('0');
    format!("{}.{frac}Z", text.trim_end_matches('Z'))
}

/// A decimal's unscaled value with `scale` digits after the point.
fn decimal(unscaled: i128, scale: i32) -> String {
    if scale <= 0 {
        return format!("{}", unscaled * 10i128.pow((-scale) as u32));
    }
    let sign = if unscaled < 0 { "-" } else { "" };
    let digits = format!(
        "{:0>width$}",
        unscaled.unsigned_abs(),
        width = scale as usize + 1
    );
    let (int, frac) = digits.split_at(digits.len() - scale as usize);
    format!("{sign}{int}.{frac}")
}

/// A big-endian two's-complement integer (Parquet's decimal bytes).
fn be_i128(b: &[u8]) -> Result<i128, ColumnError> {
    if b.len() > 16 {
        return Err(ColumnError::Value(format!(
            "a {}-byte decimal is wider than 128 bits",
            b.len()
        )));
    }
    let mut v: i128 = if b.first().is_some_and(|&x| x & 0x80 != 0) {
        -1
    } else {
        0
    };
    for &x in b {
        v = (v << 8) | x as i128;
    }
    Ok(v)
}

fn float_text(v: f64) -> String {
    if v.is_nan() {
        String::new()
    } else {
        format!("{v}")
    }
}

fn time_unit(u: &TimeUnit) -> i64 {
    match u {
        TimeUnit::MILLIS => 1_000,
        TimeUnit::MICROS => 1_000_000,
        TimeUnit::NANOS => 1_000_000_000,
    }
}

/// Append one column chunk's values as text.
fn read_column(
    r: ColumnReader,
    descr: &ColumnDescPtr,
    rows: usize,
    out: &mut Column,
    budget: &mut Budget,
) -> Result<(), ColumnError> {
    let logical = descr.logical_type_ref().cloned();
    let converted = descr.converted_type();
    let scale = descr.type_scale();
    let mut push = |v: Option<String>| -> Result<(), ColumnError> {
        let v = v.unwrap_or_default();
        budget.keep(v.len())?;
        out.push(&v);
        Ok(())
    };
    match r {
        ColumnReader::BoolColumnReader(r) => {
            values(r, descr, rows, |v| {
                push(v.map(|b| b.to_string()))?;
                Ok(())
            })?;
        }
        ColumnReader::Int32ColumnReader(r) => {
            let unsigned = matches!(&logical, Some(LogicalType::Integer(i)) if !i.is_signed)
                || matches!(
                    converted,
                    ConvertedType::UINT_8 | ConvertedType::UINT_16 | ConvertedType::UINT_32
                );
            let is_date =
                matches!(logical, Some(LogicalType::Date)) || converted == ConvertedType::DATE;
            let is_decimal = matches!(logical, Some(LogicalType::Decimal(_)))
                || converted == ConvertedType::DECIMAL;
            let time = match &logical {
                Some(LogicalType::Time(t)) => Some(time_unit(&t.unit)),
                _ if converted == ConvertedType::TIME_MILLIS => Some(1_000),
                _ => None,
            };
            values(r, descr, rows, |v| {
                push(v.map(|x| {
                    if is_date {
                        format_datetime(x as i64 * 86_400, false)
                    } else if is_decimal {
                        decimal(x as i128, scale)
                    } else if let Some(per) = time {
                        time_of_day(x as i64, per)
                    } else if unsigned {
                        (x as u32).to_string()
                    } else {
                        x.to_string()
                    }
                }))?;
                Ok(())
            })?;
        }
        ColumnReader::Int64ColumnReader(r) => {
            let unsigned = matches!(&logical, Some(LogicalType::Integer(i)) if !i.is_signed)
                || converted == ConvertedType::UINT_64;
            let ts = match &logical {
                Some(LogicalType::Timestamp(t)) => Some(time_unit(&t.unit)),
                _ if converted == ConvertedType::TIMESTAMP_MILLIS => Some(1_000),
                _ if converted == ConvertedType::TIMESTAMP_MICROS => Some(1_000_000),
                _ => None,
            };
            let time = match &logical {
                Some(LogicalType::Time(t)) => Some(time_unit(&t.unit)),
                _ if converted == ConvertedType::TIME_MICROS => Some(1_000_000),
                _ => None,
            };
            let is_decimal = matches!(logical, Some(LogicalType::Decimal(_)))
                || converted == ConvertedType::DECIMAL;
            values(r, descr, rows, |v| {
                push(v.map(|x| {
                    if let Some(per) = ts {
                        timestamp(x, per)
                    } else if let Some(per) = time {
                        time_of_day(x, per)
                    } else if is_decimal {
                        decimal(x as i128, scale)
                    } else if unsigned {
                        (x as u64).to_string()
                    } else {
                        x.to_string()
                    }
                }))?;
                Ok(())
            })?;
        }
        ColumnReader::Int96ColumnReader(r) => {
            values(r, descr, rows, |v| {
                push(v.map(|x| timestamp(x.to_nanos(), 1_000_000_000)))?;
                Ok(())
            })?;
        }
        ColumnReader::FloatColumnReader(r) => {
            values(r, descr, rows, |v| {
                push(v.map(|x| float_text(x as f64)))?;
                Ok(())
            })?;
        }
        ColumnReader::DoubleColumnReader(r) => {
            values(r, descr, rows, |v| {
                push(v.map(float_text))?;
                Ok(())
            })?;
        }
        ColumnReader::ByteArrayColumnReader(r) => {
            let is_decimal = matches!(logical, Some(LogicalType::Decimal(_)))
                || converted == ConvertedType::DECIMAL;
            values(r, descr, rows, |v| {
                let text = match v {
                    None => None,
                    Some(b) if is_decimal => Some(decimal(be_i128(b.data())?, scale)),
                    Some(b) => Some(
                        std::str::from_utf8(b.data())
                            .map_err(|_| {
                                ColumnError::Value(
                                    "a value is not UTF-8 text (a binary column); kiln reads text, numbers, dates and timestamps".into(),
                                )
                            })?
                            .to_string(),
                    ),
                };
                push(text)?;
                Ok(())
            })?;
        }
        ColumnReader::FixedLenByteArrayColumnReader(r) => {
            let is_decimal = matches!(logical, Some(LogicalType::Decimal(_)))
                || converted == ConvertedType::DECIMAL;
            let is_f16 = matches!(logical, Some(LogicalType::Float16));
            if !is_decimal && !is_f16 {
                return Err(ColumnError::Value(format!(
                    "fixed-length binary values ({}) are not read; kiln reads text, numbers, dates and timestamps",
                    PhysicalType::FIXED_LEN_BYTE_ARRAY
                )));
            }
            values(r, descr, rows, |v| {
                let text = match v {
                    None => None,
                    Some(b) if is_decimal => Some(decimal(be_i128(b.data())?, scale)),
                    Some(b) => {
                        let d = b.data();
                        if d.len() != 2 {
                            return Err(ColumnError::Value(
                                "a FLOAT16 value is not 2 bytes".into(),
                            ));
                        }
                        Some(float_text(f16_to_f64(u16::from_le_bytes([d[0], d[1]]))))
                    }
                };
                push(text)?;
                Ok(())
            })?;
        }
    }
    Ok(())
}

/// `HH:MM:SS[.fff…]` of a time of day in `per_second` units.
fn time_of_day(v: i64, per_second: i64) -> String {
    let (s, f) = (v.div_euclid(per_second), v.rem_euclid(per_second));
    let mut t = format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
    if f != 0 {
        let digits = per_second.ilog10() as usize;
        let frac = format!("{f:0digits$}");
        t.push('.');
        t.push_str(frac.trim_end_matches('0'));
    }
    t
}

/// IEEE half precision → f64.
fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f64;
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms() {
        assert_eq!(decimal(12345, 2), "123.45");
        assert_eq!(decimal(-5, 3), "-0.005");
        assert_eq!(decimal(7, 0), "7");
        assert_eq!(decimal(7, -2), "700");
        assert_eq!(be_i128(&[0xff, 0xfe]).ok(), Some(-2));
        assert_eq!(be_i128(&[0x01, 0x00]).ok(), Some(256));
        assert_eq!(timestamp(0, 1000), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(1_500, 1000), "1970-01-01T00:00:01.5Z");
        assert_eq!(timestamp(-1, 1_000_000), "1969-12-31T23:59:59.999999Z");
        assert_eq!(time_of_day(3_723_250, 1000), "01:02:03.25");
        assert_eq!(f16_to_f64(0x3c00), 1.0);
        assert_eq!(f16_to_f64(0xc000), -2.0);
        assert_eq!(float_text(f64::NAN), "");
        // The shortest text of an f32's f64 value reads back to the same f32.
        for x in [0.1f32, 1.0 / 3.0, 3.4e38, -f32::MIN_POSITIVE, 0.011_235] {
            let t = float_text(x as f64);
            assert_eq!(t.parse::<f64>().unwrap() as f32, x, "{t}");
        }
    }

    #[test]
    fn not_parquet_is_a_clear_error() {
        assert!(!is_parquet(b"a,b\n1,2\n"));
        let e = read(b"PAR1 not really PAR1".to_vec()).unwrap_err();
        assert!(e.starts_with("not a readable Parquet file"), "{e}");
    }
}
