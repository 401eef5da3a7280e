//! Assigning rows to the train / validation / test splits: by a column's value (integer or
//! ISO 8601 date ranges, or relative windows counted back from the newest value present), at
//! random, or at random by group.
//!
//! Relative windows stack from the newest value: `test: {last: n}` takes the newest `n`
//! distinct values (or, on a date column, `{last: "30d"}` the values within 30 days of the
//! newest), `validation` the window just before it, and `train` everything older. The same
//! config therefore keeps working as new seasons or days are appended: the windows move.

use std::collections::BTreeSet;
use std::path::Path;

use super::dates::{self, ColumnOrder};
use super::table::{CsvTable, DataError, is_missing};
use crate::config::{Bound, DateOrder, SeasonRange, SplitBy, SplitConfig, SplitPart, WindowLength};
use crate::rng::SplitMix64;

/// Stream label of random and grouped splits (see [`SplitMix64::derive`]).
const SPLIT_STREAM: u64 = 0x5350_4c54;

/// The split names, in order.
pub const SPLIT_NAMES: [&str; 3] = ["train", "validation", "test"];

pub use crate::config::values::{
    DateTime, bound_value, format_datetime, parse_datetime, range_ends, ranges_overlap,
};

/// What a split column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// Integers (seasons, folds).
    Int,
    /// ISO 8601 dates; `with_time` when any value has a time of day.
    Date {
        /// Whether any value has a time of day.
        with_time: bool,
    },
}

impl KeyKind {
    /// A value of this kind as text.
    pub fn format(self, v: i64) -> String {
        match self {
            KeyKind::Int => v.to_string(),
            KeyKind::Date { with_time } => format_datetime(v, with_time),
        }
    }
}

/// Read a split column: integers (a fractional value is an error, never truncated) or ISO
/// 8601 dates, decided by its first non-missing cell. Missing cells are `None`.
pub fn read_key(
    table: &CsvTable,
    column: &str,
    date_format: Option<DateOrder>,
) -> Result<(KeyKind, Vec<Option<i64>>), DataError> {
    let idx = table.column_index(column)?;
    let first = table.column_cells(idx).find(|c| !is_missing(c));
    let numeric = first.is_some_and(|c| c.trim().parse::<f64>().is_ok());
    // Dates with the year last: the column's values, or data.split.date_format, decide
    // whether they are month or day first.
    let order = if numeric {
        None
    } else {
        let cells: Vec<_> = table.column_cells(idx).filter(|c| !is_missing(c)).collect();
        match (
            dates::column_order(cells.iter().map(|c| c.as_ref())),
            date_format,
        ) {
            (ColumnOrder::Ambiguous(example), None) => {
                return Err(split_err(
                    &table.path,
                    format!(
                        "column `{column}` holds dates like {example:?} that read month first (US) or day first (EU), and no value decides which: set data.split.date_format: mdy or dmy"
                    ),
                ));
            }
            (ColumnOrder::Mixed(d, m), None) => {
                return Err(split_err(
                    &table.path,
                    format!(
                        "column `{column}` mixes day-first dates ({d:?}) and month-first ones ({m:?}); one column needs one format"
                    ),
                ));
            }
            (ColumnOrder::Decided(o), None) => Some(o),
            (_, given) => given,
        }
    };
    let mut with_time = false;
    let mut out = Vec::with_capacity(table.n_rows());
    for (r, &line) in table.lines.iter().enumerate() {
        let cell = table.cell(r, idx);
        let cell = cell.trim();
        if is_missing(cell) {
            out.push(None);
            continue;
        }
        let bad = |expected: &str| DataError::Cell {
            path: table.path.clone(),
            line,
            column: column.to_string(),
            message: format!("expected {expected}, got {cell:?}"),
        };
        if numeric {
            let v: f64 = cell
                .parse()
                .map_err(|_| bad("an integer (the split column's first value is a number)"))?;
            if !v.is_finite() || v.fract() != 0.0 || v.abs() > 9.0e15 {
                return Err(bad(
                    "an integer (split values are compared exactly, never truncated)",
                ));
            }
            out.push(Some(v as i64));
        } else {
            let dt = dates::parse_date(cell, order).ok_or_else(|| {
                bad("an ISO 8601 date YYYY-MM-DD or datetime YYYY-MM-DDTHH:MM:SS[Z], or a date MM/DD/YYYY, DD/MM/YYYY, DD.MM.YYYY or YYYY/MM/DD as data.split.date_format says (the split column's first value is not a number)")
            })?;
            with_time |= dt.has_time;
            out.push(Some(dt.seconds));
        }
    }
    let kind = if numeric {
        KeyKind::Int
    } else {
        KeyKind::Date { with_time }
    };
    Ok((kind, out))
}

/// Which split each row went to, and how the splits resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// Per row: `Some(0 | 1 | 2)` (train, validation, test) or `None` (outside every split).
    pub part: Vec<Option<u8>>,
    /// Per row: the split column's value (0 for a random split or a missing value).
    pub key: Vec<i64>,
    /// Each split as resolved, e.g. `last 2 (2017–2018)`.
    pub describe: [String; 3],
    /// Rows outside every split whose split column (or group column) is missing.
    pub missing_key: usize,
}

impl Assignment {
    /// Rows outside every split.
    pub fn outside(&self) -> usize {
        self.part.iter().filter(|p| p.is_none()).count()
    }
}

fn split_err(path: &Path, message: String) -> DataError {
    DataError::Split {
        path: path.to_path_buf(),
        message,
    }
}

/// Assign every row of `table` to a split. `season_column` is the default split column.
pub fn assign(
    table: &CsvTable,
    cfg: &SplitConfig,
    season_column: &str,
) -> Result<Assignment, DataError> {
    match cfg.by {
        SplitBy::Column => by_column(table, cfg, cfg.column.as_deref().unwrap_or(season_column)),
        SplitBy::Random => {
            let n = table.n_rows();
            let order: Vec<usize> = (0..n).collect();
            let slots = draw(order, cfg, n);
            let desc = |p: &SplitPart| match p {
                SplitPart::Fraction(f) => format!("{f} of rows (seed {})", cfg.seed.unwrap_or(0)),
                _ => "the remaining rows".to_string(),
            };
            Ok(Assignment {
                part: slots,
                key: vec![0; n],
                describe: [desc(&cfg.train), desc(&cfg.validation), desc(&cfg.test)],
                missing_key: 0,
            })
        }
        SplitBy::Group => {
            let column = cfg.column.as_deref().unwrap_or(season_column);
            let idx = table.column_index(column)?;
            let groups: BTreeSet<String> = table
                .column_cells(idx)
                .map(|c| c.trim().to_string())
                .filter(|c| !is_missing(c))
                .collect();
            let groups: Vec<String> = groups.into_iter().collect();
            let slots = draw((0..groups.len()).collect(), cfg, groups.len());
            let mut part = Vec::with_capacity(table.n_rows());
            let mut missing_key = 0;
            for cell in table.column_cells(idx) {
                let c = cell.trim();
                if is_missing(c) {
                    missing_key += 1;
                    part.push(None);
                } else {
                    let g = groups
                        .binary_search_by(|g| g.as_str().cmp(c))
                        .expect("every group was collected");
                    part.push(slots[g]);
                }
            }
            let desc = |p: &SplitPart| match p {
                SplitPart::Fraction(f) => format!(
                    "{f} of the {} groups of `{column}` (seed {})",
                    groups.len(),
                    cfg.seed.unwrap_or(0)
                ),
                _ => format!("the remaining groups of `{column}`"),
            };
            Ok(Assignment {
                part,
                key: vec![0; table.n_rows()],
                describe: [desc(&cfg.train), desc(&cfg.validation), desc(&cfg.test)],
                missing_key,
            })
        }
    }
}

/// Shuffle `items` (seeded) and hand out test, then validation, then train by fraction; the
/// slot of item `i` is `slots[i]`.
fn draw(mut items: Vec<usize>, cfg: &SplitConfig, n: usize) -> Vec<Option<u8>> {
    SplitMix64::derive(cfg.seed.unwrap_or(0), &[SPLIT_STREAM]).shuffle(&mut items);
    let count = |p: &SplitPart| match p {
        SplitPart::Fraction(f) => ((n as f64) * f).round() as usize,
        _ => usize::MAX,
    };
    let n_test = count(&cfg.test).min(n);
    let n_val = count(&cfg.validation).min(n - n_test);
    let n_train = count(&cfg.train).min(n - n_test - n_val);
    let mut slots = vec![None; n];
    for (k, &i) in items.iter().enumerate() {
        slots[i] = if k < n_test {
            Some(2)
        } else if k < n_test + n_val {
            Some(1)
        } else if k < n_test + n_val + n_train {
            Some(0)
        } else {
            None
        };
    }
    slots
}

/// A relative window `(lo, hi]` below `hi` (inclusive).
fn window(
    table: &CsvTable,
    column: &str,
    kind: KeyKind,
    values: &[i64],
    hi: i64,
    len: &WindowLength,
    name: &str,
) -> Result<i64, DataError> {
    match len {
        WindowLength::Count(n) => {
            // Distinct values ≤ hi, newest first.
            let below: Vec<i64> = values.iter().rev().copied().filter(|&v| v <= hi).collect();
            let n = *n as usize;
            if below.len() <= n {
                return Err(split_err(
                    &table.path,
                    format!(
                        "the {name} window {{last: {n}}} needs more than {n} distinct values of `{column}` at or before {} (the older ones train), found {}",
                        kind.format(hi),
                        below.len()
                    ),
                ));
            }
            Ok(below[n])
        }
        WindowLength::Duration(text) => {
            if kind == KeyKind::Int {
                return Err(split_err(
                    &table.path,
                    format!(
                        "data.split.{name}: a duration ({text:?}) needs a date column, but `{column}` holds integers; give {{last: N}} distinct values"
                    ),
                ));
            }
            let secs = len.seconds().unwrap_or(0);
            Ok(hi.saturating_sub(secs))
        }
    }
}

fn by_column(table: &CsvTable, cfg: &SplitConfig, column: &str) -> Result<Assignment, DataError> {
    let (kind, keys) = read_key(table, column, cfg.date_format)?;
    // A range's ends must be of the column's kind.
    for (p, name) in [&cfg.train, &cfg.validation, &cfg.test]
        .iter()
        .zip(SPLIT_NAMES)
    {
        if let SplitPart::Range(r) = p {
            for b in [&r.from, &r.to].into_iter().flatten() {
                let int = matches!(b, Bound::Int(_));
                if int != (kind == KeyKind::Int) {
                    return Err(split_err(
                        &table.path,
                        format!(
                            "data.split.{name}: the bound {b} is {} but column `{column}` holds {}",
                            if int { "an integer" } else { "a date" },
                            if kind == KeyKind::Int {
                                "integers"
                            } else {
                                "dates"
                            }
                        ),
                    ));
                }
            }
        }
    }
    let distinct: Vec<i64> = keys
        .iter()
        .flatten()
        .copied()
        .collect::<BTreeSet<i64>>()
        .into_iter()
        .collect();
    // Each split as a predicate on the key.
    type Pred = Box<dyn Fn(i64) -> bool>;
    let range_pred = |r: &SeasonRange| -> Pred {
        let (a, b) = range_ends(r);
        Box::new(move |v| a <= v && v <= b)
    };
    let mut labels: [String; 3] = Default::default();
    // Ranges are described as configured; relative windows add the values they resolved to.
    let mut resolved = [true; 3];
    let preds: [Pred; 3] = match (&cfg.validation, &cfg.test) {
        (SplitPart::Last(lv), SplitPart::Last(lt)) => {
            let newest = *distinct.last().ok_or_else(|| {
                split_err(
                    &table.path,
                    format!("column `{column}` has no values to count relative windows from"),
                )
            })?;
            let t_lo = window(table, column, kind, &distinct, newest, lt, "test")?;
            let v_lo = window(table, column, kind, &distinct, t_lo, lv, "validation")?;
            labels[1] = lv.to_string();
            labels[2] = lt.to_string();
            let train: Pred = match &cfg.train {
                SplitPart::Range(r) => {
                    labels[0] = format!("{r}, older than validation");
                    let inner = range_pred(r);
                    Box::new(move |v| v <= v_lo && inner(v))
                }
                _ => {
                    labels[0] = "older than validation".into();
                    Box::new(move |v| v <= v_lo)
                }
            };
            [
                train,
                Box::new(move |v| v_lo < v && v <= t_lo),
                Box::new(move |v| t_lo < v && v <= newest),
            ]
        }
        (SplitPart::Range(rv), SplitPart::Range(rt)) => {
            resolved = [cfg.train.is_rest(), false, false];
            labels[1] = rv.to_string();
            labels[2] = rt.to_string();
            let (pv, pt) = (range_pred(rv), range_pred(rt));
            let train: Pred = match &cfg.train {
                SplitPart::Range(r) => {
                    labels[0] = r.to_string();
                    range_pred(r)
                }
                _ => {
                    labels[0] = "the rest".into();
                    let (pv, pt) = (range_pred(rv), range_pred(rt));
                    Box::new(move |v| !pv(v) && !pt(v))
                }
            };
            [train, pv, pt]
        }
        _ => {
            return Err(split_err(
                &table.path,
                "data.split: give validation and test both as ranges or both as {last: …}".into(),
            ));
        }
    };
    let mut part = Vec::with_capacity(keys.len());
    let mut key = Vec::with_capacity(keys.len());
    let mut missing_key = 0;
    let mut seen: [Option<(i64, i64)>; 3] = [None; 3];
    for k in &keys {
        match k {
            None => {
                missing_key += 1;
                part.push(None);
                key.push(0);
            }
            Some(v) => {
                let p = preds.iter().position(|f| f(*v));
                if let Some(p) = p {
                    let s = seen[p].get_or_insert((*v, *v));
                    s.0 = s.0.min(*v);
                    s.1 = s.1.max(*v);
                }
                part.push(p.map(|p| p as u8));
                key.push(*v);
            }
        }
    }
    let describe = std::array::from_fn(|i| match seen[i] {
        _ if !resolved[i] => labels[i].clone(),
        Some((a, b)) if a == b => format!("{} ({})", labels[i], kind.format(a)),
        Some((a, b)) => format!("{} ({}–{})", labels[i], kind.format(a), kind.format(b)),
        None => labels[i].clone(),
    });
    Ok(Assignment {
        part,
        key,
        describe,
        missing_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::values::DAY;

    #[test]
    fn dates_round_trip_and_reject_nonsense() {
        for s in ["1970-01-01", "2000-02-29", "2024-12-31", "1899-07-04"] {
            let dt = parse_datetime(s).unwrap();
            assert!(!dt.has_time);
            assert_eq!(format_datetime(dt.seconds, false), s);
        }
        assert_eq!(parse_datetime("1970-01-02").unwrap().seconds, DAY);
        let dt = parse_datetime("2021-03-04T05:06:07Z").unwrap();
        assert!(dt.has_time);
        assert_eq!(format_datetime(dt.seconds, true), "2021-03-04T05:06:07Z");
        assert_eq!(parse_datetime("2021-03-04 05:06:07"), Some(dt));
        for bad in [
            "2021-02-29",
            "2021-13-01",
            "2021-1-01",
            "20210101",
            "2021-01-01T25:00:00",
            "2021-01-01T10:00",
            "x",
            "",
        ] {
            assert_eq!(parse_datetime(bad), None, "{bad}");
        }
    }
}
