//! `kiln init --data FILE --target COL…`: a commented starter config for a table (CSV or
//! Parquet). Numeric columns become features, text columns with few distinct values
//! categorical features (one with a value on most rows, an identifier, is left out), a date
//! column (if there is one) carries relative windows, else the split is random; missing cells
//! get median imputation (the unknown bucket for a category) with an indicator.

use std::fmt::Write as _;
use std::path::Path;

use super::dates::{ColumnOrder, column_order};
use super::table::{CsvTable, DataError, is_missing, parse_finite};

/// What a column holds, as far as a starter config cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Numeric,
    /// Numbers, but at least one is not finite (`inf`, `NaN`): the first such cell's row.
    NonFinite(usize),
    Date,
    Text,
    Empty,
}

/// A starter config and the choices it made, one line each.
#[derive(Debug, Clone)]
pub struct Starter {
    /// The YAML text.
    pub yaml: String,
    /// What was chosen and why.
    pub notes: Vec<String>,
}

fn kind(table: &CsvTable, j: usize) -> Kind {
    let mut k = Kind::Empty;
    let mut non_finite = None;
    for (i, cell) in table.column_cells(j).enumerate() {
        let c = cell.trim();
        if is_missing(c) {
            continue;
        }
        let number = parse_finite(c);
        if number == Err(false) {
            non_finite.get_or_insert(i);
        }
        let this = if number != Err(true) {
            Kind::Numeric
        } else if super::dates::is_date(c) {
            Kind::Date
        } else {
            return Kind::Text;
        };
        if k == Kind::Empty {
            k = this;
        } else if k != this {
            return Kind::Text;
        }
    }
    match (k, non_finite) {
        (Kind::Numeric, Some(i)) => Kind::NonFinite(i),
        _ => k,
    }
}

/// Where row `i` of `table` is, for a message: its line in a CSV file, else its row number.
fn row_place(table: &CsvTable, i: usize) -> String {
    match table.lines.get(i) {
        Some(line) => format!("line {line}"),
        None => format!("row {}", i + 1),
    }
}

/// A column name as YAML: plain when it is a simple word, else double-quoted.
fn yaml_name(n: &str) -> String {
    let plain = !n.is_empty()
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !n.starts_with(['-', '.'])
        && !["true", "false", "null", "yes", "no", "on", "off", "~"]
            .contains(&n.to_ascii_lowercase().as_str())
        && n.parse::<f64>().is_err();
    if plain {
        n.to_string()
    } else {
        serde_json::to_string(n).expect("a string serialises")
    }
}

/// A column's cells as numbers (`None`: missing or not a finite number).
fn numbers(table: &CsvTable, j: usize) -> Vec<Option<f64>> {
    table
        .column_cells(j)
        .map(|c| parse_finite(&c).ok())
        .collect()
}

/// Whether a column name reads as a time index (`year`, `season`, `period`, …).
fn time_named(name: &str) -> bool {
    let n = name.trim().to_ascii_lowercase();
    // Not month, week or quarter: those cycle, and their newest value is no "latest".
    ["year", "yr", "season", "period", "t", "time", "date"]
        .iter()
        .any(|w| n == *w || n.ends_with(&format!("_{w}")) || n.starts_with(&format!("{w}_")))
}

/// Every cell present and an integer, at least 3 distinct values.
fn integer_index(v: &[Option<f64>]) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    for c in v {
        match *c {
            Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
                seen.insert(x as i64);
            }
            _ => return false,
        }
    }
    seen.len() >= 3
}

/// Why a numeric column looks like a row identifier, if it does: named like an index
/// (`id`, `index`, `row`, `Unnamed: 0`, …; `…_id` when nearly every row has its own value),
/// or one distinct integer per row that is monotone down the file or a shuffled
/// consecutive range.
fn id_like(name: &str, v: &[Option<f64>]) -> Option<String> {
    let n = name.trim().to_ascii_lowercase();
    let present: Vec<f64> = v.iter().flatten().copied().collect();
    let mut sorted_v = present.clone();
    sorted_v.sort_by(f64::total_cmp);
    let distinct = 1 + sorted_v.windows(2).filter(|w| w[0] != w[1]).count();
    if matches!(
        n.as_str(),
        "" | "id"
            | "index"
            | "idx"
            | "row"
            | "rowid"
            | "row_id"
            | "rownames"
            | "row.names"
            | "row_number"
            | "obs"
    ) || n.starts_with("unnamed:")
        || (n.ends_with("_id") && distinct * 2 > v.len())
    {
        return Some("named like a row index".into());
    }
    if present.len() < 10
        || present.len() < v.len()
        || distinct < present.len()
        || present.iter().any(|x| x.fract() != 0.0)
    {
        return None;
    }
    let up = present.windows(2).all(|w| w[0] < w[1]);
    let down = present.windows(2).all(|w| w[0] > w[1]);
    let consecutive = sorted_v[sorted_v.len() - 1] - sorted_v[0] + 1.0 == present.len() as f64;
    if up || down {
        Some("one distinct integer per row, monotone down the file: a row index".into())
    } else if consecutive {
        Some("one distinct integer per row, a shuffled consecutive range: a row id".into())
    } else {
        None
    }
}

/// |Pearson correlation| at or above which one feature alone is called a leak.
const LEAK_CORR: f64 = 0.995;
/// One-feature binned R² at or above which one feature alone is called a leak.
const LEAK_R2: f64 = 0.99;

/// How well `x` alone predicts `y` on the rows where both are present, when it is almost
/// perfect: `|corr| ≥ 0.995`, or a binned fit (the mean of `y` in each of up to 50
/// equal-count bins of `x`, at least 20 rows a bin) with `R² ≥ 0.99`. `None` otherwise, or
/// with fewer than 30 rows.
fn leak_score(x: &[Option<f64>], y: &[Option<f64>]) -> Option<String> {
    let mut pairs: Vec<(f64, f64)> = x
        .iter()
        .zip(y)
        .filter_map(|(a, b)| Some(((*a)?, (*b)?)))
        .collect();
    let n = pairs.len();
    if n < 30 {
        return None;
    }
    let nf = n as f64;
    let (mx, my) = (
        pairs.iter().map(|p| p.0).sum::<f64>() / nf,
        pairs.iter().map(|p| p.1).sum::<f64>() / nf,
    );
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in &pairs {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx).powi(2);
        syy += (b - my).powi(2);
    }
    if sxx <= 0.0 || syy <= 0.0 {
        return None;
    }
    let corr = sxy / (sxx * syy).sqrt();
    if corr.abs() >= LEAK_CORR {
        return Some(format!("|correlation| {:.4}", corr.abs()));
    }
    let bins = (n / 20).min(50);
    if bins < 5 {
        return None;
    }
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut ss_res = 0.0;
    let mut start = 0;
    while start < n {
        // Equal-count bins that never split a run of equal x.
        let mut end = (start + n.div_ceil(bins)).min(n);
        while end < n && pairs[end].0 == pairs[end - 1].0 {
            end += 1;
        }
        let bin = &pairs[start..end];
        let m = bin.iter().map(|p| p.1).sum::<f64>() / bin.len() as f64;
        ss_res += bin.iter().map(|p| (p.1 - m).powi(2)).sum::<f64>();
        start = end;
    }
    let r2 = 1.0 - ss_res / syy;
    (r2 >= LEAK_R2).then(|| format!("one-feature binned R² {r2:.4}"))
}

/// How well the values of a categorical column `x` alone predict `y`, when almost perfectly:
/// the R² of each value's mean of `y` (a missing cell is a value of its own) on the rows where
/// `y` is present is at least [`LEAK_R2`], and the values average at least 20 rows each (with
/// fewer, any column of many values fits). `None` otherwise, or with fewer than 30 rows.
fn category_leak_score(x: &[String], y: &[Option<f64>]) -> Option<String> {
    let mut groups: std::collections::HashMap<&str, (f64, f64)> = Default::default();
    let pairs: Vec<(&str, f64)> = x
        .iter()
        .zip(y)
        .filter_map(|(a, b)| Some((a.as_str(), (*b)?)))
        .collect();
    let n = pairs.len();
    if n < 30 {
        return None;
    }
    for &(a, b) in &pairs {
        let g = groups.entry(a).or_default();
        g.0 += b;
        g.1 += 1.0;
    }
    if groups.len() * 20 > n {
        return None;
    }
    let my = pairs.iter().map(|p| p.1).sum::<f64>() / n as f64;
    let syy: f64 = pairs.iter().map(|p| (p.1 - my).powi(2)).sum();
    if syy <= 0.0 {
        return None;
    }
    let ss_res: f64 = pairs
        .iter()
        .map(|(a, b)| {
            let (sum, count) = groups[a];
            (b - sum / count).powi(2)
        })
        .sum();
    let r2 = 1.0 - ss_res / syy;
    (r2 >= LEAK_R2).then(|| {
        format!(
            "R² {r2:.4} from the mean of each of its {} values",
            groups.len()
        )
    })
}

/// The skewness above which a non-negative target gets a transform.
const SKEWED: f64 = 1.0;

/// A transform for a target column with values `v`, and why: a non-negative target whose
/// sample skewness is above [`SKEWED`] (prices, counts, durations) is modelled as `log`
/// (every value positive) or `log1p` (some are zero), which keeps predictions and
/// intervals non-negative and evens out the residuals of a long right tail.
fn propose_transform(v: &[f64]) -> Option<(&'static str, String)> {
    if v.len() < 3 {
        return None;
    }
    let n = v.len() as f64;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let mean = v.iter().sum::<f64>() / n;
    let m2 = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let m3 = v.iter().map(|x| (x - mean).powi(3)).sum::<f64>() / n;
    if min < 0.0 || m2 <= 0.0 {
        return None;
    }
    let skew = m3 / m2.powf(1.5);
    if skew <= SKEWED {
        return None;
    }
    Some(if min > 0.0 {
        (
            "log",
            format!("positive and right-skewed (skewness {skew:.1}, min {min})"),
        )
    } else {
        (
            "log1p",
            format!("non-negative with zeros and right-skewed (skewness {skew:.1})"),
        )
    })
}

/// Build a starter config for the table at `data` predicting `targets`; `data` is written
/// into the config as given.
pub fn starter_config(data: &Path, targets: &[String]) -> Result<Starter, DataError> {
    let table = CsvTable::read(data)?;
    if table.n_rows() == 0 {
        return Err(DataError::Empty {
            path: data.to_path_buf(),
        });
    }
    let mut notes = Vec::new();
    for t in targets {
        let j = table.column_index(t)?;
        match kind(&table, j) {
            Kind::Numeric => {}
            Kind::NonFinite(i) => {
                return Err(DataError::Other(format!(
                    "{}: target column `{t}` holds `{}` at {} (kiln trains on finite numbers only: fix or drop those rows)",
                    data.display(),
                    table.cell(i, j).trim(),
                    row_place(&table, i)
                )));
            }
            _ => {
                return Err(DataError::Other(format!(
                    "{}: target column `{t}` is not numeric (kiln predicts numbers)",
                    data.display()
                )));
            }
        }
    }
    let transforms: Vec<(String, &'static str, String)> = targets
        .iter()
        .filter_map(|t| {
            let j = table.column_index(t).ok()?;
            let v: Vec<f64> = table
                .column_cells(j)
                .filter_map(|c| parse_finite(&c).ok())
                .collect();
            propose_transform(&v).map(|(tr, why)| (t.clone(), tr, why))
        })
        .collect();
    for (t, tr, why) in &transforms {
        notes.push(format!("target `{t}`: {why}: target_transform {tr}"));
    }
    let mut features = Vec::new();
    let mut categorical = Vec::new();
    let mut date: Option<String> = None;
    // An integer column named like time (year, season, …): the table is a series (or a
    // panel) indexed by it, and gets a split by it.
    let mut time_index: Option<String> = None;
    let mut left_out: Vec<(String, String)> = Vec::new();
    let mut missing = 0usize;
    let mut holes: Vec<String> = Vec::new();
    for (j, name) in table.header.iter().enumerate() {
        if targets.contains(name) {
            continue;
        }
        match kind(&table, j) {
            Kind::Numeric if id_like(name, &numbers(&table, j)).is_some() => {
                let why = id_like(name, &numbers(&table, j)).unwrap_or_default();
                if time_index.is_none() && time_named(name) && integer_index(&numbers(&table, j)) {
                    time_index = Some(name.clone());
                }
                notes.push(format!("`{name}`: {why}, not used (a row id is no feature: it would only memorise rows)"));
                left_out.push((name.clone(), why));
            }
            Kind::Numeric => {
                if time_index.is_none() && time_named(name) && integer_index(&numbers(&table, j)) {
                    time_index = Some(name.clone());
                }
                let n = (0..table.n_rows())
                    .filter(|&r| table.is_missing_at(r, j))
                    .count();

                if n > 0 {
                    holes.push(name.clone());
                }
                missing += n;
                features.push(name.clone());
            }
            Kind::NonFinite(i) => notes.push(format!(
                "`{name}`: numbers, but `{}` at {} is not finite (kiln refuses non-finite values), not used",
                table.cell(i, j).trim(),
                row_place(&table, i)
            )),
            Kind::Date if date.is_none() => date = Some(name.clone()),
            Kind::Date => notes.push(format!("`{name}`: a second date column, not used")),
            Kind::Text => {
                let values: std::collections::BTreeSet<String> = table
                    .column_cells(j)
                    .map(|c| c.trim().to_string())
                    .filter(|c| !is_missing(c))
                    .collect();
                let present = (0..table.n_rows())
                    .filter(|&r| !table.is_missing_at(r, j))
                    .count();
                if values.len() > crate::config::DEFAULT_MAX_CATEGORIES {
                    notes.push(format!(
                        "`{name}`: text with {} distinct values (more than data.max_categories, {}), not used",
                        values.len(),
                        crate::config::DEFAULT_MAX_CATEGORIES
                    ));
                } else if values.len() * 2 > present {
                    notes.push(format!(
                        "`{name}`: text with {} distinct values in {present} rows (an identifier?), not used",
                        values.len()
                    ));
                } else {
                    if present < table.n_rows() {
                        holes.push(name.clone());
                    }
                    missing += table.n_rows() - present;
                    features.push(name.clone());
                    categorical.push(name.clone());
                    notes.push(format!(
                        "`{name}`: categorical, {} values (one-hot)",
                        values.len()
                    ));
                }
            }
            Kind::Empty => notes.push(format!("`{name}`: every cell is missing, not used")),
        }
    }
    let target_values: Vec<Vec<Option<f64>>> = targets
        .iter()
        .map(|t| table.column_index(t).map(|j| numbers(&table, j)))
        .collect::<Result<_, _>>()?;
    features.retain(|f| {
        let Ok(j) = table.column_index(f) else {
            return true;
        };
        let is_category = categorical.contains(f);
        let (x, cells) = match is_category {
            true => (Vec::new(), table.column_cells(j).map(|c| c.trim().to_string()).collect()),
            false => (numbers(&table, j), Vec::new()),
        };
        for (t, y) in targets.iter().zip(&target_values) {
            let score = match is_category {
                true => category_leak_score(&cells, y),
                false => leak_score(&x, y),
            };
            if let Some(score) = score {
                let why = format!(
                    "alone predicts `{t}` almost perfectly ({score}): known only after the outcome, or the outcome in other units?"
                );
                notes.push(format!("`{f}`: {why}, not used"));
                left_out.push((f.clone(), why));
                holes.retain(|h| h != f);
                missing -= (0..table.n_rows())
                    .filter(|&r| table.is_missing_at(r, j))
                    .count();
                return false;
            }
        }
        true
    });
    categorical.retain(|c| features.contains(c));
    if features.is_empty() {
        return Err(DataError::Other(format!(
            "{}: no numeric or categorical column besides the targets to use as a feature",
            data.display()
        )));
    }
    notes.insert(
        0,
        format!("{} features: {}", features.len(), features.join(", ")),
    );
    let name: String = data
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("table")
        .split('.')
        .next()
        .unwrap_or("table")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let list = |v: &[String]| {
        v.iter()
            .map(|n| yaml_name(n))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut y = String::new();
    writeln!(
        y,
        "# Starter config written by `kiln init` for {}.",
        data.display()
    )
    .unwrap();
    writeln!(
        y,
        "# Check it against the data with `kiln config check`, then `kiln train` it."
    )
    .unwrap();
    writeln!(y, "name: {}", if name.is_empty() { "table" } else { &name }).unwrap();
    writeln!(y, "seed: 42").unwrap();
    writeln!(y, "data:").unwrap();
    writeln!(y, "  path: {}", data.display()).unwrap();
    writeln!(y, "  # Input columns, in the order the network sees them.").unwrap();
    if !left_out.is_empty() {
        writeln!(
            y,
            "  # Left out on purpose (add one back only if it is known when you predict):"
        )
        .unwrap();
        for (c, why) in &left_out {
            writeln!(y, "  #   {}: {why}", yaml_name(c)).unwrap();
        }
    }
    writeln!(y, "  features: [{}]", list(&features)).unwrap();
    if !categorical.is_empty() {
        writeln!(
            y,
            "  # Text columns: one 0/1 input per value of the training split; a value it did not\n  # have (or a missing one, with the imputation below) sets none of them."
        )
        .unwrap();
        writeln!(y, "  categorical: [{}]", list(&categorical)).unwrap();
    }
    if let Some(d) = &date {
        // Offered, not switched on: whether a date's parts pay depends on the table (the
        // season repeats, the trend extrapolates), which only a validation run can say.
        writeln!(
            y,
            "  # The date `{d}` can also be a feature: add it to `features` and uncomment this line
  # (parts: year, month, day_of_week, day_of_year, elapsed_days; year and elapsed_days
  # extrapolate past the training dates, the others repeat).
  # dates: {{{}: [month, day_of_week, day_of_year]}}",
            yaml_name(d)
        )
        .unwrap();
    }
    writeln!(y, "  targets: [{}]", list(targets)).unwrap();
    writeln!(
        y,
        "  # At predict and serve time a missing cell gets the training median (a category: the\n  # unknown bucket), even in a column without holes here; `predict_missing: refuse` refuses it."
    )
    .unwrap();
    if !transforms.is_empty() {
        writeln!(
            y,
            "  # Trained as f(y), predicted and scored in original units: no negative prediction or"
        )
        .unwrap();
        writeln!(
            y,
            "  # interval bound. Remove a line to model the column as it is."
        )
        .unwrap();
        writeln!(y, "  target_transform:").unwrap();
        for (t, tr, why) in &transforms {
            writeln!(y, "    # {why}").unwrap();
            writeln!(y, "    {}: {tr}", yaml_name(t)).unwrap();
        }
    }
    if features
        .iter()
        .any(|f| !categorical.contains(f) && Some(f) != date.as_ref())
    {
        let n = crate::config::defaults::NUMERIC_BINS;
        writeln!(
            y,
            "  # `auto`: the mean stage trains twice, with each numeric feature also entering as {n}\n  # piecewise-linear bins at the training split's quantiles (`<column>.bin<i>`: the\n  # thresholds a tree would find) and without; the run goes on from the one with the\n  # lower validation loss. {n} or 0 fixes the choice (and trains once).\n  numeric_bins: auto"
        )
        .unwrap();
    }
    if missing > 0 {
        writeln!(
            y,
            "  # {missing} feature cells are missing (empty, NaN, NA, null): fill them with the"
        )
        .unwrap();
        writeln!(
            y,
            "  # training median (a category: the unknown bucket), and tell the network where they"
        )
        .unwrap();
        writeln!(
            y,
            "  # were in the columns that have holes now. Other policies: error, drop_row."
        )
        .unwrap();
        writeln!(
            y,
            "  missing:\n    default: {{impute: median}}\n    columns:"
        )
        .unwrap();
        for h in &holes {
            writeln!(
                y,
                "      {}: {{impute: median, indicator: true}}",
                yaml_name(h)
            )
            .unwrap();
        }
        notes.push(format!(
            "{missing} missing feature cells: median imputation everywhere, indicators for {}",
            holes.join(", ")
        ));
    }
    writeln!(y, "  split:").unwrap();
    match &date {
        Some(d) => {
            let j = table.column_index(d)?;
            let distinct: std::collections::BTreeSet<String> = table
                .column_cells(j)
                .map(|c| c.trim().to_string())
                .filter(|c| !is_missing(c))
                .collect();
            let k = (distinct.len() / 10).max(1);
            writeln!(
                y,
                "    # Relative windows on `{d}`: test = the newest {k} distinct values, validation"
            )
            .unwrap();
            writeln!(
                y,
                "    # the {k} before, train everything older; they move as the table grows."
            )
            .unwrap();
            writeln!(y, "    # A duration also works: {{last: 30d}}.").unwrap();
            writeln!(
                y,
                "    column: {}\n    validation: {{last: {k}}}\n    test: {{last: {k}}}",
                yaml_name(d)
            )
            .unwrap();
            match column_order(distinct.iter().map(String::as_str)) {
                ColumnOrder::NotNeeded => {}
                ColumnOrder::Decided(o) => {
                    writeln!(
                        y,
                        "    # `{d}` has its year last; its values read {} only.\n    date_format: {}",
                        if o == crate::config::DateOrder::Mdy {
                            "month first (US)"
                        } else {
                            "day first (EU)"
                        },
                        o.name()
                    )
                    .unwrap();
                }
                ColumnOrder::Ambiguous(example) => {
                    writeln!(
                        y,
                        "    # `{d}` has dates like {example} that read month first (US, mdy) or day first\n    # (EU, dmy), and no value decides which: CHECK this guess.\n    date_format: mdy"
                    )
                    .unwrap();
                    notes.push(format!(
                        "`{d}`: dates like {example} are ambiguous; date_format: mdy written, check it"
                    ));
                }
                ColumnOrder::Mixed(a, b) => notes.push(format!(
                    "`{d}`: mixes day-first ({a}) and month-first ({b}) dates; fix the column before training"
                )),
            }
            notes.push(format!(
                "split by date column `{d}`: validation and test the last {k} of {} distinct dates each",
                distinct.len()
            ));
        }
        None if time_index.is_some() => {
            let d = time_index.clone().unwrap_or_default();
            let j = table.column_index(&d)?;
            let distinct: std::collections::BTreeSet<i64> = numbers(&table, j)
                .iter()
                .flatten()
                .map(|v| *v as i64)
                .collect();
            let k = (distinct.len() / 10).max(1);
            writeln!(
                y,
                "    # The rows are ordered by `{d}`, a time index: train on the past, validate and test"
            )
            .unwrap();
            writeln!(
                y,
                "    # on the newest {k} distinct values each (a random split would leak the future)."
            )
            .unwrap();
            writeln!(
                y,
                "    column: {}\n    validation: {{last: {k}}}\n    test: {{last: {k}}}",
                yaml_name(&d)
            )
            .unwrap();
            notes.push(format!(
                "split by time index `{d}`: validation and test the last {k} of {} distinct values each",
                distinct.len()
            ));
        }
        None => {
            writeln!(y, "    # No date column: 70/15/15 at random (by: group keeps a column's values together).").unwrap();
            writeln!(
                y,
                "    by: random\n    seed: 0\n    validation: 0.15\n    test: 0.15"
            )
            .unwrap();
            notes.push("no date column: random split 70/15/15 (seed 0)".into());
        }
    }
    // The training defaults live in config::defaults; the training split is about 70 % of
    // the rows whichever split was chosen above.
    let train_rows = table.n_rows() * 7 / 10;
    y.push_str(&crate::config::defaults::TrainingDefaults::for_rows(train_rows).yaml());
    y.push_str("export:\n  dir: checkpoints\n");
    Ok(Starter { yaml: y, notes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_with_inf_is_named_as_not_finite_not_as_not_numeric() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.csv");
        let mut text = String::from("x,w,y\n");
        for i in 0..30 {
            let w = if i == 7 {
                "inf".to_string()
            } else {
                format!("{i}.25")
            };
            // `x` repeats (a row index 0..29 would now be left out as one).
            text.push_str(&format!("{},{w},{}\n", i % 10, i * 3));
        }
        std::fs::write(&p, &text).unwrap();
        let s = starter_config(&p, &["y".into()]).unwrap();
        assert!(s.yaml.contains("features: [x]"), "{}", s.yaml);
        let note = s.notes.iter().find(|n| n.starts_with("`w`")).unwrap();
        assert!(
            note.contains("`inf` at line 9 is not finite") && !note.contains("not numeric"),
            "{note}"
        );
        // The same value in the target is an error naming it and its line.
        let err = starter_config(&p, &["w".into()]).unwrap_err().to_string();
        assert!(
            err.contains("target column `w` holds `inf` at line 9") && !err.contains("not numeric"),
            "{err}"
        );
    }

    /// A country-by-year panel (sorted by country) with a pandas index column, a row id in
    /// shuffled order, a leak (the target plus a little noise), a legitimate feature and a
    /// bounded nonlinear one.
    fn panel(path: &Path) {
        let mut text = String::from("Unnamed: 0,country,year,rid,gdp,arrival,wave,y\n");
        let mut i = 0usize;
        for c in 0..5 {
            for yr in 1980..2020 {
                let gdp = ((i * 37) % 101) as f64 / 10.0;
                let y = 2.0 * gdp + (yr - 1980) as f64 * 0.1 + (i % 7) as f64;
                let arrival = y + ((i * 13) % 5) as f64 * 0.01;
                let wave = ((i * 29) % 17) as f64;
                let rid = (i * 7919) % 200;
                text.push_str(&format!("{i},c{c},{yr},{rid},{gdp},{arrival},{wave},{y}\n"));
                i += 1;
            }
        }
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn ids_and_leaks_are_left_out_with_the_reason_and_a_time_index_splits() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("panel.csv");
        panel(&p);
        let s = starter_config(&p, &["y".into()]).unwrap();
        assert!(
            s.yaml.contains("features: [country, year, gdp, wave]"),
            "{}",
            s.yaml
        );
        for want in [
            "#   \"Unnamed: 0\": named like a row index",
            "#   rid: one distinct integer per row, a shuffled consecutive range: a row id",
            "#   arrival: alone predicts `y` almost perfectly (|correlation| 1.0000): known only after the outcome",
        ] {
            assert!(s.yaml.contains(want), "{want:?} not in\n{}", s.yaml);
        }
        // The panel is indexed by year: a split by it, the newest 4 of 40 years for test.
        assert!(
            s.yaml
                .contains("column: year\n    validation: {last: 4}\n    test: {last: 4}"),
            "{}",
            s.yaml
        );
        assert!(!s.yaml.contains("by: random"), "{}", s.yaml);
        let cfg = crate::config::parse(&s.yaml, Path::new("init.yaml")).unwrap();
        let d = crate::data::Dataset::load(&cfg.data).unwrap();
        assert_eq!(d.test.rows(), 5 * 4);
        assert!(
            d.test.season.iter().all(|&y| y >= 2016),
            "{:?}",
            d.test.season
        );
        // A monotone row index 0..n-1 under another name is left out too.
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replacen("Unnamed: 0", "n", 1);
        std::fs::write(&p, text).unwrap();
        let s = starter_config(&p, &["y".into()]).unwrap();
        assert!(
            s.yaml.contains(
                "#   n: one distinct integer per row, monotone down the file: a row index"
            ),
            "{}",
            s.yaml
        );
    }

    #[test]
    fn a_category_that_alone_gives_the_target_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("orders.csv");
        // `outcome` is the target's bucket, written after the fact; `region` is honest.
        let mut text = String::from("x,region,outcome,y\n");
        for i in 0..200usize {
            let b = i % 4;
            let y = 10.0 * b as f64 + ((i * 37) % 11) as f64 * 0.01;
            let region = ["n", "s", "e", "w", "c"][(i * 7) % 5];
            text.push_str(&format!(
                "{},{region},{},{y}\n",
                (i * 13) % 17,
                ["lo", "mid", "hi", "top"][b]
            ));
        }
        std::fs::write(&p, text).unwrap();
        let s = starter_config(&p, &["y".into()]).unwrap();
        assert!(s.yaml.contains("features: [x, region]"), "{}", s.yaml);
        assert!(s.yaml.contains("categorical: [region]"), "{}", s.yaml);
        assert!(
            s.yaml.contains("#   outcome: alone predicts `y` almost perfectly (R² 1.0000 from the mean of each of its 4 values)"),
            "{}",
            s.yaml
        );
        crate::config::parse(&s.yaml, Path::new("init.yaml")).unwrap();
        // A category of many values fits any target on few rows each: not called a leak.
        let ids: Vec<String> = (0..200).map(|i| format!("r{}", i / 2)).collect();
        let y: Vec<Option<f64>> = (0..200).map(|i| Some(i as f64)).collect();
        assert_eq!(category_leak_score(&ids, &y), None);
    }

    #[test]
    fn us_and_eu_dates_are_read_as_dates_and_split_the_series() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("daily.csv");
        // A daily series over 100 days from 2021-01-01, US format.
        let mut text = String::from("when,temp,y\n");
        for d in 0..100i64 {
            let iso = crate::config::values::format_datetime((18_628 + d) * 86_400, false);
            let (yr, mo, da) = (&iso[0..4], &iso[5..7], &iso[8..10]);
            text.push_str(&format!("{mo}/{da}/{yr},{},{}\n", d % 17, (d * 7) % 23));
        }
        std::fs::write(&p, &text).unwrap();
        let s = starter_config(&p, &["y".into()]).unwrap();
        assert!(s.yaml.contains("features: [temp]"), "{}", s.yaml);
        assert!(
            s.yaml
                .contains("    column: when\n    validation: {last: 10}\n    test: {last: 10}\n"),
            "{}",
            s.yaml
        );
        assert!(s.yaml.contains("    date_format: mdy\n"), "{}", s.yaml);
        let cfg = crate::config::parse(&s.yaml, Path::new("init.yaml")).unwrap();
        let d = crate::data::Dataset::load(&cfg.data).unwrap();
        assert_eq!(
            (d.train.rows(), d.validation.rows(), d.test.rows()),
            (80, 10, 10)
        );
        // The test split is the newest ten days (2021-04-01 … 2021-04-10).
        let newest = crate::config::values::parse_datetime("2021-04-01")
            .unwrap()
            .seconds;
        assert!(
            d.test.season.iter().all(|&s| s >= newest),
            "{:?}",
            d.test.season
        );

        // EU dates with dots decide themselves; a monthly US series (every day 01) cannot.
        let eu = text
            .lines()
            .map(|l| match l.split_once(',') {
                Some((w, rest)) if w.contains('/') => {
                    let f: Vec<&str> = w.split('/').collect();
                    format!("{}.{}.{},{rest}", f[1], f[0], f[2])
                }
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&p, eu + "\n").unwrap();
        let s = starter_config(&p, &["y".into()]).unwrap();
        assert!(s.yaml.contains("    date_format: dmy\n"), "{}", s.yaml);
        let cfg = crate::config::parse(&s.yaml, Path::new("init.yaml")).unwrap();
        assert_eq!(
            crate::data::Dataset::load(&cfg.data).unwrap().test.rows(),
            10
        );
        let mut monthly = String::from("when,temp,y\n");
        for m in 0..36 {
            monthly.push_str(&format!(
                "{:02}/01/{},{},{}\n",
                m % 12 + 1,
                2019 + m / 12,
                m % 5,
                m % 7
            ));
        }
        std::fs::write(&p, &monthly).unwrap();
        let s = starter_config(&p, &["y".into()]).unwrap();
        assert!(
            s.yaml.contains("CHECK this guess.\n    date_format: mdy\n"),
            "{}",
            s.yaml
        );
        assert!(
            s.notes.iter().any(|n| n.contains("ambiguous")),
            "{:?}",
            s.notes
        );
        // Without the key, training refuses to guess.
        let no_key = s.yaml.replace("    date_format: mdy\n", "");
        let cfg = crate::config::parse(&no_key, Path::new("init.yaml")).unwrap();
        let e = crate::data::Dataset::load(&cfg.data)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("column `when` holds dates like \"01/01/2019\" that read month first (US) or day first (EU)")
                && e.contains("data.split.date_format: mdy or dmy"),
            "{e}"
        );
    }

    #[test]
    fn a_date_listed_as_a_feature_is_not_sent_to_data_categorical() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.csv");
        let rows: String = (1..=10)
            .map(|d| format!("03/{d:02}/2024,{d},{d}\n"))
            .collect();
        std::fs::write(&p, format!("when,a,y\n{rows}")).unwrap();
        let yaml = format!(
            "data:\n  path: {}\n  features: [a, when]\n  targets: [y]\n  split:\n    by: random\n    validation: 0.2\n    test: 0.2\nstages:\n  - name: mean\n    trainable: [backbone, mean_head]\n    loss: mse\n    epochs: 1\n",
            p.display()
        );
        let cfg = crate::config::parse(&yaml, Path::new("t.yaml")).unwrap();
        let e = crate::data::Dataset::load(&cfg.data)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("got the date \"03/") && !e.contains("list it under data.categorical"),
            "{e}"
        );
    }

    #[test]
    fn the_leak_score_needs_an_almost_perfect_fit() {
        let x: Vec<Option<f64>> = (0..1000).map(|i| Some(i as f64 / 100.0)).collect();
        // A deterministic function of x, symmetric on [0, 10]: its correlation with x is 0,
        // the binned R² catches it.
        let y: Vec<Option<f64>> = x.iter().map(|v| Some((v.unwrap() - 5.0).powi(2))).collect();
        let s = leak_score(&x, &y).unwrap();
        assert!(s.starts_with("one-feature binned R² 0.99"), "{s}");
        // Half signal, half noise: no leak.
        let y: Vec<Option<f64>> = (0..1000)
            .map(|i| Some((i as f64 / 200.0).sin() + ((i * 7919 % 1000) as f64 / 500.0 - 1.0)))
            .collect();
        assert_eq!(leak_score(&x, &y), None);
        // Too few rows to judge.
        assert_eq!(leak_score(&x[..20], &x[..20]), None);
    }

    #[test]
    fn a_skewed_non_negative_target_gets_a_transform_and_a_symmetric_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("prices.csv");
        let mut text = String::from("x,price,zeros,sym\n");
        for i in 0..80 {
            let price = (i as f64 / 12.0).exp() * 100.0;
            let zeros = if i % 4 == 0 { 0.0 } else { price };
            text.push_str(&format!(
                "{},{price},{zeros},{}\n",
                i % 10,
                (i % 7) as f64 - 3.0
            ));
        }
        std::fs::write(&p, &text).unwrap();
        let targets: Vec<String> = vec!["price".into(), "zeros".into(), "sym".into()];
        let s = starter_config(&p, &targets).unwrap();
        assert!(s.yaml.contains("    price: log\n"), "{}", s.yaml);
        assert!(s.yaml.contains("    zeros: log1p\n"), "{}", s.yaml);
        assert!(!s.yaml.contains("sym: "), "{}", s.yaml);
        assert!(
            s.notes
                .iter()
                .any(|n| n.starts_with("target `price`: positive and right-skewed")),
            "{:?}",
            s.notes
        );
        let cfg = crate::config::parse(&s.yaml, Path::new("init.yaml")).unwrap();
        use kiln_model::stats::TargetTransform as T;
        assert_eq!(cfg.data.target_transform.get("price"), Some(&T::Log));
        assert_eq!(cfg.data.target_transform.get("zeros"), Some(&T::Log1p));
        assert_eq!(cfg.data.target_transform.get("sym"), None);
    }

    #[test]
    fn a_starter_config_parses_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("shop sales.csv");
        let mut text = String::from("id,day,store,price,promo,units\n");
        for i in 0..60 {
            let promo = if i % 9 == 0 {
                String::new()
            } else {
                (i % 2).to_string()
            };
            text.push_str(&format!(
                "r{i},2021-03-{:02},s{},{}.5,{promo},{}\n",
                i % 28 + 1,
                i % 3,
                i % 7,
                i * 2
            ));
        }
        std::fs::write(&p, text).unwrap();
        let s = starter_config(&p, &["units".into()]).unwrap();
        assert!(
            s.yaml.contains("features: [store, price, promo]"),
            "{}",
            s.yaml
        );
        assert!(s.yaml.contains("categorical: [store]"), "{}", s.yaml);
        assert!(s.yaml.contains("column: day"), "{}", s.yaml);
        assert!(
            s.notes
                .iter()
                .any(|n| n.contains("`id`: text with 60 distinct values in 60 rows")),
            "{:?}",
            s.notes
        );
        let cfg = crate::config::parse(&s.yaml, Path::new("init.yaml")).unwrap();
        assert_eq!(cfg.name, "shop_sales");
        let d = crate::data::Dataset::load(&cfg.data).unwrap();
        // The starter imputes every feature; only the column with holes gets an indicator.
        // `price` (7 values) also gets its bins (8 asked, 6 distinct); the 0/1 `promo` none.
        assert_eq!(cfg.data.numeric_bins, crate::config::NumericBins::Auto);
        assert_eq!(
            d.features,
            vec![
                "store=s0",
                "store=s1",
                "store=s2",
                "price",
                "price.bin0",
                "price.bin1",
                "price.bin2",
                "price.bin3",
                "price.bin4",
                "price.bin5",
                "promo",
                "promo_missing"
            ]
        );
        assert!(d.test.rows() > 0 && d.validation.rows() > 0);
        // `auto` reads the bins; its no-bins candidate drops them and is then exactly what
        // `numeric_bins: 0` reads from the file (the value, then the indicator).
        let mut plain = cfg.data.clone();
        plain.numeric_bins = crate::config::NumericBins::Fixed(0);
        let p0 = crate::data::Dataset::load(&plain).unwrap();
        let w = d.without_bins();
        assert_eq!(w.features, p0.features);
        assert_eq!(w.preprocessing, p0.preprocessing);
        for (a, b) in [
            (&w.train, &p0.train),
            (&w.validation, &p0.validation),
            (&w.test, &p0.test),
        ] {
            assert_eq!((&a.x, &a.y, &a.source_rows), (&b.x, &b.y, &b.source_rows));
        }
        assert_ne!(d.train.x.len(), w.train.x.len());
        // The gate re-reads a run's rows as its checkpoint was trained on them.
        let fixed = |pre| cfg.data.as_trained(Some(pre)).numeric_bins;
        assert_eq!(
            fixed(&d.preprocessing),
            crate::config::NumericBins::Fixed(crate::config::defaults::NUMERIC_BINS)
        );
        assert_eq!(
            fixed(&p0.preprocessing),
            crate::config::NumericBins::Fixed(0)
        );
        // Without a date column the split is random.
        std::fs::write(
            &p,
            "a,b,y\n1,2,3\n4,5,6\n7,8,9\n1,1,1\n2,2,2\n3,3,3\n4,4,4\n",
        )
        .unwrap();
        let s = starter_config(&p, &["y".into()]).unwrap();
        assert!(s.yaml.contains("by: random"), "{}", s.yaml);
        crate::config::parse(&s.yaml, Path::new("init.yaml")).unwrap();
        // Names that are not plain YAML words are quoted.
        std::fs::write(
            &p,
            "unit price,yes,2020,y\n1,2,3,4\n4,5,6,7\n7,8,9,1\n1,1,,1\n2,2,2,2\n3,3,3,3\n4,4,4,4\n",
        )
        .unwrap();
        let s = starter_config(&p, &["y".into()]).unwrap();
        assert!(
            s.yaml
                .contains("features: [\"unit price\", \"yes\", \"2020\"]"),
            "{}",
            s.yaml
        );
        let cfg = crate::config::parse(&s.yaml, Path::new("init.yaml")).unwrap();
        assert_eq!(cfg.data.features, vec!["unit price", "yes", "2020"]);
        assert!(cfg.data.missing.columns.contains_key("2020"));
        let e = starter_config(&p, &["nope".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing column `nope`"), "{e}");
    }
}
