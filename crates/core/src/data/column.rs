//! A table's column store and the reading limits: typed columns as they are read (an `f32`
//! per cell where the text is exactly an `f32`'s shortest form, else one text buffer), and the
//! byte, line, cell and column caps every reader (CSV, gzip, Parquet) enforces. Below both
//! readers ([`super::table`], [`super::parquet`]), so neither imports the other's internals.

/// The cells of one column of a [`CsvTable`](super::table::CsvTable) (opaque: read them with [`CsvTable::cell`](super::table::CsvTable::cell)).
#[derive(Debug, Clone)]
pub enum Column {
    #[doc(hidden)]
    /// Every cell so far is empty (NaN here) or exactly the text `format!("{x}")` of an
    /// `f32` `x` that its text parses back to (through `f64`, as [`parse_finite`] reads).
    F32(Vec<f32>),
    /// Any text: the cells one after another, and where each ends.
    #[doc(hidden)]
    Text {
        /// The cells' text, concatenated.
        text: String,
        /// The end (exclusive) of each cell in `text`.
        ends: Vec<u64>,
    },
}

/// A fixed buffer that `f32` text is written into without allocating.
struct Digits {
    buf: [u8; 64],
    len: usize,
}

impl std::fmt::Write for Digits {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// The `f32` a cell is stored as, when its text is exactly that value's shortest text and
/// reads back (through `f64`) to it; NaN for an empty cell.
pub(super) fn exact_f32(cell: &str) -> Option<f32> {
    use std::fmt::Write;
    if cell.is_empty() {
        return Some(f32::NAN);
    }
    let first = cell.as_bytes()[0];
    if !(first.is_ascii_digit() || first == b'-') {
        return None;
    }
    let x = cell.parse::<f64>().ok()? as f32;
    if !x.is_finite() {
        return None;
    }
    let mut d = Digits {
        buf: [0; 64],
        len: 0,
    };
    write!(d, "{x}").ok()?;
    (&d.buf[..d.len] == cell.as_bytes()).then_some(x)
}

impl Default for Column {
    fn default() -> Self {
        Self::new()
    }
}

impl Column {
    /// An empty column.
    pub fn new() -> Self {
        Column::F32(Vec::new())
    }

    /// Its number of cells.
    pub fn len(&self) -> usize {
        match self {
            Column::F32(v) => v.len(),
            Column::Text { ends, .. } => ends.len(),
        }
    }

    /// Whether it has no cells.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Append a cell.
    pub fn push(&mut self, cell: &str) {
        if let Column::F32(v) = self {
            if let Some(x) = exact_f32(cell) {
                v.push(x);
                return;
            }
            let mut text = String::new();
            let mut ends = Vec::with_capacity(v.len() + 1);
            for &x in v.iter() {
                if !x.is_nan() {
                    use std::fmt::Write;
                    let _ = write!(text, "{x}");
                }
                ends.push(text.len() as u64);
            }
            *self = Column::Text { text, ends };
        }
        if let Column::Text { text, ends } = self {
            text.push_str(cell);
            ends.push(text.len() as u64);
        }
    }

    pub(super) fn get(&self, r: usize) -> std::borrow::Cow<'_, str> {
        use std::borrow::Cow;
        match self {
            Column::F32(v) if v[r].is_nan() => Cow::Borrowed(""),
            Column::F32(v) => Cow::Owned(format!("{}", v[r])),
            Column::Text { text, ends } => {
                let from = if r == 0 { 0 } else { ends[r - 1] as usize };
                Cow::Borrowed(&text[from..ends[r] as usize])
            }
        }
    }

    /// Give back spare capacity.
    pub fn shrink(&mut self) {
        match self {
            Column::F32(v) => v.shrink_to_fit(),
            Column::Text { text, ends } => {
                text.shrink_to_fit();
                ends.shrink_to_fit();
            }
        }
    }
}

/// Bounds on what reading one table may take, so that a hostile or damaged file (a gzip
/// bomb, a sparse file without newlines, a Parquet footer that lies about its size, one huge
/// value repeated through a dictionary) ends in a clear error naming the file and the limit
/// instead of exhausting memory. Each is read from an environment variable (see
/// docs/data.md, "Limits"); sizes accept a `k`/`m`/`g` (binary) suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// Bytes of text a CSV file may inflate to (after gzip), and bytes the table may hold
    /// once read (`KILN_MAX_TABLE_BYTES`, default 4 GiB).
    pub max_bytes: u64,
    /// Bytes of one CSV line (`KILN_MAX_LINE_BYTES`, default 16 MiB).
    pub max_line_bytes: u64,
    /// Bytes of one value, CSV or Parquet (`KILN_MAX_CELL_BYTES`, default 64 KiB).
    pub max_cell_bytes: u64,
    /// Columns of one table (`KILN_MAX_COLUMNS`, default 16,384).
    pub max_columns: usize,
}

impl Default for ReadLimits {
    fn default() -> Self {
        Self {
            max_bytes: 4 << 30,
            max_line_bytes: 16 << 20,
            max_cell_bytes: 64 << 10,
            max_columns: 16_384,
        }
    }
}

/// `n` bytes in the largest binary unit that keeps it whole (`4 GiB`, `1536 KiB`, `17 B`).
pub fn bytes_text(n: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} B")
}

fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let lower = lower.trim_end_matches("ib").trim_end_matches('b');
    let (digits, shift) = match lower.chars().last()? {
        'k' => (&lower[..lower.len() - 1], 10),
        'm' => (&lower[..lower.len() - 1], 20),
        'g' => (&lower[..lower.len() - 1], 30),
        _ => (lower, 0),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(1 << shift)
}

impl ReadLimits {
    /// The limits from `KILN_MAX_TABLE_BYTES`, `KILN_MAX_LINE_BYTES`, `KILN_MAX_CELL_BYTES`
    /// and `KILN_MAX_COLUMNS` (each unset: its default); a value that is not a positive size
    /// is an error naming the variable.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`ReadLimits::from_env`] over any lookup (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let d = Self::default();
        let size = |key: &str, default: u64| -> Result<u64, String> {
            match get(key) {
                None => Ok(default),
                Some(v) => parse_size(&v).filter(|&n| n > 0).ok_or_else(|| {
                    format!(
                        "{key}: expected a positive number of bytes (e.g. 4g, 512m, 1048576), got {v:?}"
                    )
                }),
            }
        };
        Ok(Self {
            max_bytes: size("KILN_MAX_TABLE_BYTES", d.max_bytes)?,
            max_line_bytes: size("KILN_MAX_LINE_BYTES", d.max_line_bytes)?,
            max_cell_bytes: size("KILN_MAX_CELL_BYTES", d.max_cell_bytes)?,
            max_columns: size("KILN_MAX_COLUMNS", d.max_columns as u64)? as usize,
        })
    }
}

/// Which columns a read keeps, by name (`None`: every column).
pub type Projection<'a> = Option<&'a dyn Fn(&str) -> bool>;
