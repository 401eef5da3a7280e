//! The preprocessing that travels with a model: raw input columns → the network's inputs
//! (imputation of missing cells, missing-indicator features, one-hot codes of categorical
//! columns), fit on the training split and stored in the checkpoint's manifest, so that
//! training, `kiln predict`, `kiln pick` and `kiln serve` read raw columns the same way.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The suffix of a missing-indicator feature (`<column>_missing`).
pub const INDICATOR_SUFFIX: &str = "_missing";

/// One raw input column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputColumn {
    /// The column name.
    pub name: String,
    /// The value a missing cell gets (fit on the training split); `None`: a missing cell is
    /// an error. Numeric columns only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impute: Option<f64>,
    /// Numeric columns without `impute` only: the value a missing cell gets at predict and
    /// serve time (the training split's median; training itself had no missing cell in this
    /// column). `None`: a missing cell is an error (`data.missing: refuse`, or an older
    /// checkpoint). Not a network input change: a column with only a fallback stays plain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<f64>,
    /// Whether the network also sees a `<name>_missing` 0/1 feature.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub indicator: bool,
    /// A categorical column's vocabulary (the training split's values, sorted): the network
    /// sees one 0/1 input `<name>=<value>` per entry. `None`: a numeric column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<Vec<String>>,
    /// A categorical column only: a missing cell goes to the unknown bucket (every one-hot
    /// input 0) instead of being an error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub missing_to_unknown: bool,
    /// A categorical column only: values are matched to the vocabulary ignoring case
    /// (`Rain` and `rain` are one category; the vocabulary holds them lower-cased).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub case_insensitive: bool,
    /// A date column (`data.dates`): the text is read as a date and the network sees the
    /// listed parts, one input each (`<name>.<part>`). Its `impute`/`fallback` is a day
    /// (since 1970-01-01) whose parts a missing cell gets. `None`: not a date column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<DateEncoding>,
    /// A numeric column only (`data.numeric_bins`): the edges of its bins (the training
    /// split's quantiles, ascending, distinct, at least 3). Beside the value itself the
    /// network sees its piecewise-linear encoding, one input per bin (`<name>.bin<i>`): 0 below
    /// the bin, 1 above it, the position within it in between (the first bin also goes below 0
    /// and the last above 1, so the encoding still moves outside the training range). `None`:
    /// the value alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bins: Option<Vec<f64>>,
}

/// The piecewise-linear encoding of `x` over bins with `edges` (see [`InputColumn::bins`]),
/// appended to `out`.
pub fn push_bins(edges: &[f64], x: f64, out: &mut Vec<f32>) {
    let last = edges.len().saturating_sub(2);
    for (i, w) in edges.windows(2).enumerate() {
        let t = (x - w[0]) / (w[1] - w[0]);
        let t = match (i == 0, i == last) {
            (true, true) => t,
            (true, false) => t.min(1.0),
            (false, true) => t.max(0.0),
            (false, false) => t.clamp(0.0, 1.0),
        };
        out.push(t as f32);
    }
}

/// Bin edges for `data.numeric_bins: n`: the `0, 1/n, …, 1` quantiles of the training split's
/// values `v` (sorted in place), the repeated ones dropped; `None` when fewer than 3 distinct
/// edges remain (a constant or two-valued column gains nothing from bins).
pub fn bin_edges(v: &mut [f64], n: usize) -> Option<Vec<f64>> {
    if v.is_empty() || n < 2 {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let last = (v.len() - 1) as f64;
    let mut edges: Vec<f64> = (0..=n)
        .map(|k| {
            // Linear interpolation between order statistics (numpy's default).
            let pos = last * k as f64 / n as f64;
            let (lo, frac) = (pos.floor() as usize, pos - pos.floor());
            let hi = (lo + 1).min(v.len() - 1);
            v[lo] + (v[hi] - v[lo]) * frac
        })
        .collect();
    edges.dedup_by(|a, b| *a <= *b);
    (edges.len() >= 3).then_some(edges)
}

/// How a date column becomes network inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DateEncoding {
    /// The order of a date whose year is last (`mdy`, `dmy`); `None`: ISO or year-first dates,
    /// or dates whose fields decide it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<crate::dates::DateOrder>,
    /// The parts the network sees, in order.
    pub parts: Vec<crate::dates::DatePart>,
}

impl DateEncoding {
    /// The day (since 1970-01-01) a cell's text names, or an error message.
    pub fn day(&self, text: &str) -> Result<i64, String> {
        crate::dates::parse_date(text, self.order)
            .map(crate::dates::day_of)
            .ok_or_else(|| {
                format!(
                    "expected a date (YYYY-MM-DD, or {} with an optional time of day), got {text:?}",
                    match self.order {
                        Some(crate::dates::DateOrder::Mdy) => "MM/DD/YYYY",
                        Some(crate::dates::DateOrder::Dmy) => "DD/MM/YYYY or DD.MM.YYYY",
                        None => "YYYY/MM/DD, DD.MM.YYYY, or MM/DD/YYYY where a field above 12 decides the order",
                    }
                )
            })
    }
}

impl InputColumn {
    /// A numeric column read as it is.
    pub fn numeric(name: &str) -> Self {
        Self {
            name: name.to_string(),
            impute: None,
            fallback: None,
            indicator: false,
            categories: None,
            missing_to_unknown: false,
            case_insensitive: false,
            date: None,
            bins: None,
        }
    }

    /// The bins of a binned numeric column (see [`InputColumn::bins`]): how many.
    pub fn bin_count(&self) -> usize {
        self.bins.as_ref().map_or(0, |e| e.len() - 1)
    }

    /// A numeric value and its bins, appended to `out`.
    fn push_number(&self, x: f32, out: &mut Vec<f32>) {
        out.push(x);
        if let Some(e) = &self.bins {
            push_bins(e, f64::from(x), out);
        }
    }

    /// A categorical value's position in the vocabulary (`None`: unknown, or numeric).
    pub fn category_index(&self, value: &str) -> Option<usize> {
        let cats = self.categories.as_ref()?;
        if self.case_insensitive && value.chars().any(char::is_uppercase) {
            let lower = value.to_lowercase();
            cats.binary_search_by(|k| k.as_str().cmp(&lower)).ok()
        } else {
            cats.binary_search_by(|k| k.as_str().cmp(value)).ok()
        }
    }

    /// How many network inputs this column gives (its indicator not counted).
    pub fn width(&self) -> usize {
        match (&self.categories, &self.date) {
            (Some(cats), _) => cats.len(),
            (None, Some(d)) => d.parts.len(),
            (None, None) => 1 + self.bin_count(),
        }
    }

    /// Whether a missing cell is accepted.
    pub fn accepts_missing(&self) -> bool {
        match self.categories {
            Some(_) => self.missing_to_unknown,
            None => self.missing_value().is_some(),
        }
    }

    /// The value a missing numeric cell gets: the imputation, else the serving fallback.
    pub fn missing_value(&self) -> Option<f64> {
        self.impute.or(self.fallback)
    }
}

/// One raw cell, however it arrived (a CSV/Parquet cell, a number or string of a request).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RawValue<'a> {
    /// No value.
    Missing,
    /// A number.
    Number(f64),
    /// Text (a category, or a number still to parse).
    Text(&'a str),
}

impl<'a> RawValue<'a> {
    /// A table cell: missing tokens (empty, `NaN`, `NA`, `null`) are [`RawValue::Missing`].
    pub fn cell(cell: &'a str) -> Self {
        if is_missing(cell) {
            RawValue::Missing
        } else {
            RawValue::Text(cell.trim())
        }
    }
}

/// What encoding rows did, per input column (for reports).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EncodeCounts {
    /// Cells imputed (numeric) or sent to the unknown bucket because missing (categorical).
    pub imputed: Vec<usize>,
    /// Categorical values not in the vocabulary.
    pub unknown: Vec<usize>,
    /// Per input column, up to [`UNKNOWN_EXAMPLES`] distinct unknown values, in the order
    /// first seen (for a summary line naming what was new).
    pub unknown_examples: Vec<Vec<String>>,
}

/// Distinct unknown values [`EncodeCounts`] keeps per column.
pub const UNKNOWN_EXAMPLES: usize = 3;

impl EncodeCounts {
    /// Missing cells of input `i` (imputed, or sent to the unknown bucket).
    pub fn missing(&self, i: usize) -> usize {
        self.imputed.get(i).copied().unwrap_or(0)
    }

    /// Values of input `i` outside the training vocabulary.
    pub fn unknown(&self, i: usize) -> usize {
        self.unknown.get(i).copied().unwrap_or(0)
    }

    /// Whether nothing was missing or unknown.
    pub fn is_empty(&self) -> bool {
        self.imputed.iter().all(|&n| n == 0) && self.unknown.iter().all(|&n| n == 0)
    }

    /// One line per categorical column that met categories the training split did not have:
    /// `column: N rows (e.g. "x", "y")`, joined by `; ` (`None` when there were none).
    pub fn unknown_summary(&self, pre: &Preprocessing) -> Option<String> {
        let parts: Vec<String> = pre
            .inputs
            .iter()
            .enumerate()
            .filter(|&(i, _)| self.unknown(i) > 0)
            .map(|(i, c)| {
                let examples: Vec<String> = self
                    .unknown_examples
                    .get(i)
                    .map(|v| v.iter().map(|e| format!("{e:?}")).collect())
                    .unwrap_or_default();
                format!(
                    "{}: {} row{} (e.g. {})",
                    c.name,
                    self.unknown(i),
                    if self.unknown(i) == 1 { "" } else { "s" },
                    examples.join(", ")
                )
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// The text of an integer-valued number as a category (`3.0` → `"3"`).
fn number_as_category(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The preprocessing of a checkpoint, and what it did to the training data.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Preprocessing {
    /// Raw input columns, in order; the network sees their values (one per numeric column,
    /// the one-hot block of a categorical one), then the indicators of those with
    /// `indicator`, in the same order.
    pub inputs: Vec<InputColumn>,
    /// The sample-weight column training used (weights are not a model input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<String>,
    /// Rows of the file outside every split.
    #[serde(default)]
    pub rows_outside: usize,
    /// Rows left out of training, per reason (outside every split, a missing split value, a
    /// missing target, a missing feature under `drop_row`, a missing weight).
    #[serde(default)]
    pub dropped: BTreeMap<String, usize>,
    /// Imputed cells per column, over all splits.
    #[serde(default)]
    pub imputed: BTreeMap<String, usize>,
    /// Categorical values outside the training vocabulary per column, over the validation
    /// and test splits (they went to the unknown bucket).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, usize>,
}

impl Preprocessing {
    /// No imputation: the network's inputs are these columns as they are.
    pub fn plain(features: &[String]) -> Self {
        Self {
            inputs: features.iter().map(|n| InputColumn::numeric(n)).collect(),
            ..Self::default()
        }
    }

    /// The raw columns read from the input.
    pub fn input_names(&self) -> Vec<String> {
        self.inputs.iter().map(|c| c.name.clone()).collect()
    }

    /// The network's features, in order: each input (`<name>=<value>` per category of a
    /// categorical one), then the indicators.
    pub fn network_features(&self) -> Vec<String> {
        let mut v = Vec::with_capacity(self.n_features());
        for c in &self.inputs {
            match (&c.categories, &c.date) {
                (Some(cats), _) => v.extend(cats.iter().map(|k| format!("{}={k}", c.name))),
                (None, Some(d)) => {
                    v.extend(d.parts.iter().map(|p| format!("{}.{}", c.name, p.name())))
                }
                (None, None) => {
                    v.push(c.name.clone());
                    v.extend((0..c.bin_count()).map(|i| format!("{}.bin{i}", c.name)));
                }
            }
        }
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
        self.inputs.iter().map(InputColumn::width).sum::<usize>()
            + self.inputs.iter().filter(|c| c.indicator).count()
    }

    /// Whether the network's inputs are exactly the raw columns (all numeric, nothing
    /// imputed, no indicators).
    pub fn is_plain(&self) -> bool {
        self.inputs.iter().all(|c| {
            c.impute.is_none()
                && !c.indicator
                && c.categories.is_none()
                && c.date.is_none()
                && c.bins.is_none()
        })
    }

    /// Whether any input is a date column.
    pub fn has_date(&self) -> bool {
        self.inputs.iter().any(|c| c.date.is_some())
    }

    /// Whether any input is categorical.
    pub fn has_categorical(&self) -> bool {
        self.inputs.iter().any(|c| c.categories.is_some())
    }

    /// One row of network inputs from raw values (`values[i]` is input `i`), appended to
    /// `out`; nothing is appended on an error. `locate` names the row in errors (file and
    /// line, or request row); `counts`, when given, counts imputed and unknown values.
    pub fn push_values<E>(
        &self,
        values: &[RawValue<'_>],
        out: &mut Vec<f32>,
        locate: &dyn Fn(&str, String) -> E,
        mut counts: Option<&mut EncodeCounts>,
    ) -> Result<(), E> {
        let start = out.len();
        let fail = |out: &mut Vec<f32>, e: E| {
            out.truncate(start);
            Err(e)
        };
        for (i, (c, v)) in self.inputs.iter().zip(values).enumerate() {
            if let Some(d) = &c.date {
                let day = match *v {
                    RawValue::Missing => match c.missing_value() {
                        Some(x) => {
                            if let Some(n) = counts.as_deref_mut() {
                                bump(&mut n.imputed, i);
                            }
                            x.round() as i64
                        }
                        None => {
                            return fail(
                                out,
                                locate(
                                    &c.name,
                                    "missing date (empty, NaN, NA and null are missing; the model has no imputation for this column — it was trained with data.predict_missing: refuse, or by an older kiln)".into(),
                                ),
                            );
                        }
                    },
                    RawValue::Number(x) => {
                        return fail(
                            out,
                            locate(
                                &c.name,
                                format!(
                                    "expected a date as text (e.g. \"2024-03-01\"), got the number {x}"
                                ),
                            ),
                        );
                    }
                    RawValue::Text(t) => match d.day(t) {
                        Ok(day) => day,
                        Err(m) => return fail(out, locate(&c.name, m)),
                    },
                };
                out.extend(d.parts.iter().map(|p| p.of_day(day) as f32));
                continue;
            }
            match (&c.categories, *v) {
                (None, RawValue::Missing) => match c.missing_value() {
                    Some(x) => {
                        c.push_number(x as f32, out);
                        if let Some(n) = counts.as_deref_mut() {
                            bump(&mut n.imputed, i);
                        }
                    }
                    None => {
                        return fail(
                            out,
                            locate(
                                &c.name,
                                "missing value (empty, NaN, NA and null are missing; the model has no imputation for this column — it was trained with data.predict_missing: refuse, or by an older kiln)".into(),
                            ),
                        );
                    }
                },
                (None, RawValue::Number(x)) => {
                    let f = x as f32;
                    if !f.is_finite() {
                        return fail(out, locate(&c.name, out_of_range(x)));
                    }
                    c.push_number(f, out);
                }
                (None, RawValue::Text(t)) => match parse_finite(t) {
                    Ok(x) if (x as f32).is_finite() => c.push_number(x as f32, out),
                    Ok(x) => return fail(out, locate(&c.name, out_of_range(x))),
                    Err(not_number) => {
                        let m = if not_number {
                            format!("expected a number, got {t:?}")
                        } else {
                            format!("expected a finite number, got {t:?}")
                        };
                        return fail(out, locate(&c.name, m));
                    }
                },
                (Some(cats), value) => {
                    let key: std::borrow::Cow<'_, str> = match value {
                        RawValue::Missing => {
                            if !c.missing_to_unknown {
                                return fail(
                                    out,
                                    locate(
                                        &c.name,
                                        "missing category (empty, NaN, NA and null are missing; the model has no imputation for this column — it was trained with data.predict_missing: refuse, or by an older kiln)".into(),
                                    ),
                                );
                            }
                            if let Some(n) = counts.as_deref_mut() {
                                bump(&mut n.imputed, i);
                            }
                            out.extend(std::iter::repeat_n(0.0, cats.len()));
                            continue;
                        }
                        RawValue::Number(x) => number_as_category(x).into(),
                        RawValue::Text(t) => t.trim().into(),
                    };
                    let at = c.category_index(&key);
                    if at.is_none()
                        && let Some(n) = counts.as_deref_mut()
                    {
                        bump(&mut n.unknown, i);
                        if n.unknown_examples.len() <= i {
                            n.unknown_examples.resize_with(i + 1, Vec::new);
                        }
                        let seen = &mut n.unknown_examples[i];
                        if seen.len() < UNKNOWN_EXAMPLES && !seen.iter().any(|e| *e == *key) {
                            seen.push(key.to_string());
                        }
                    }
                    out.extend((0..cats.len()).map(|k| if Some(k) == at { 1.0 } else { 0.0 }));
                }
            }
        }
        for (c, v) in self.inputs.iter().zip(values) {
            if c.indicator {
                out.push(if matches!(v, RawValue::Missing) {
                    1.0
                } else {
                    0.0
                });
            }
        }
        Ok(())
    }

    /// One row of network inputs from raw cells (`cells[i]` is input `i`), appended to `out`.
    /// `locate` names the row in errors (file and line).
    pub fn push_row<E>(
        &self,
        cells: &[&str],
        out: &mut Vec<f32>,
        locate: &dyn Fn(&str, String) -> E,
    ) -> Result<(), E> {
        self.push_row_counted(cells, out, locate, None)
    }

    /// [`Preprocessing::push_row`], counting missing cells and unknown categories.
    pub fn push_row_counted<E>(
        &self,
        cells: &[&str],
        out: &mut Vec<f32>,
        locate: &dyn Fn(&str, String) -> E,
        counts: Option<&mut EncodeCounts>,
    ) -> Result<(), E> {
        let values: Vec<RawValue<'_>> = cells.iter().map(|c| RawValue::cell(c)).collect();
        self.push_values(&values, out, locate, counts)
    }
}

/// Whether a cell means "no value": empty, `NaN`, `NA` or `null` (any case, surrounding
/// blanks ignored).
pub fn is_missing(cell: &str) -> bool {
    let c = cell.trim();
    c.is_empty()
        || c.eq_ignore_ascii_case("nan")
        || c.eq_ignore_ascii_case("na")
        || c.eq_ignore_ascii_case("null")
}

/// Parse a finite number. `Err(true)` = not a number at all, `Err(false)` = NaN or ±∞.
pub fn parse_finite(cell: &str) -> Result<f64, bool> {
    match cell.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(false),
        Err(_) => Err(true),
    }
}

fn out_of_range(x: f64) -> String {
    format!("expected a number within f32's range (|x| ≤ 3.4028235e38), got {x} (infinite in f32)")
}

fn bump(v: &mut Vec<usize>, i: usize) {
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    v[i] += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn locate(column: &str, message: String) -> String {
        format!("{column}: {message}")
    }

    /// weather (categorical, case-insensitive), store (categorical), price (numeric with a
    /// serving fallback of 4.5).
    fn pre() -> Preprocessing {
        let weather = InputColumn {
            categories: Some(vec!["rain".into(), "sun".into()]),
            case_insensitive: true,
            missing_to_unknown: true,
            ..InputColumn::numeric("weather")
        };
        let store = InputColumn {
            categories: Some(vec!["Harbour".into(), "north".into()]),
            missing_to_unknown: true,
            ..InputColumn::numeric("store")
        };
        let price = InputColumn {
            fallback: Some(4.5),
            ..InputColumn::numeric("price")
        };
        Preprocessing {
            inputs: vec![weather, store, price],
            ..Preprocessing::default()
        }
    }

    #[test]
    fn missing_cells_and_unknown_categories_are_counted_apart() {
        let p = pre();
        let mut counts = EncodeCounts::default();
        let mut out = Vec::new();
        let rows = [
            ["Rain", "north", "3"],
            ["", "depot", ""],
            ["SUN", "", "2"],
            ["hail", "depot", "1"],
            ["RAIN", "harbour", "NA"],
        ];
        for r in rows {
            p.push_row_counted(&r, &mut out, &locate, Some(&mut counts))
                .unwrap();
        }
        // weather: 1 missing, 1 unknown (hail); store: 1 missing, 3 unknown (depot twice and
        // harbour: store is case-sensitive); price: 2 missing (imputed with the fallback).
        assert_eq!((counts.missing(0), counts.unknown(0)), (1, 1));
        assert_eq!((counts.missing(1), counts.unknown(1)), (1, 3));
        assert_eq!((counts.missing(2), counts.unknown(2)), (2, 0));
        assert_eq!(counts.unknown_examples[1], vec!["depot", "harbour"]);
        assert_eq!(
            counts.unknown_summary(&p).unwrap(),
            "weather: 1 row (e.g. \"hail\"); store: 3 rows (e.g. \"depot\", \"harbour\")"
        );
        // `Rain`, `SUN` and `RAIN` are the known categories; a missing price is the fallback.
        let row = |i: usize| &out[i * 5..(i + 1) * 5];
        assert_eq!(row(0), &[1.0, 0.0, 0.0, 1.0, 3.0]);
        assert_eq!(row(1), &[0.0, 0.0, 0.0, 0.0, 4.5]);
        assert_eq!(row(2), &[0.0, 1.0, 0.0, 0.0, 2.0]);
        assert_eq!(row(4), &[1.0, 0.0, 0.0, 0.0, 4.5]);
        assert!(EncodeCounts::default().unknown_summary(&p).is_none());
    }

    #[test]
    fn a_fallback_keeps_a_column_plain_and_without_one_a_missing_cell_is_refused() {
        let mut p = Preprocessing::plain(&["a".into(), "b".into()]);
        p.inputs[0].fallback = Some(2.0);
        assert!(
            p.is_plain(),
            "a serving fallback is not a network input change"
        );
        assert!(p.inputs[0].accepts_missing() && !p.inputs[1].accepts_missing());
        let mut out = Vec::new();
        p.push_row(&["", "1"], &mut out, &locate).unwrap();
        assert_eq!(out, vec![2.0, 1.0]);
        let e = p.push_row(&["1", "NaN"], &mut out, &locate).unwrap_err();
        assert!(
            e.starts_with("b: missing value") && e.contains("predict_missing: refuse"),
            "{e}"
        );
        assert_eq!(out.len(), 2, "nothing appended on an error");
        // The checkpoint keeps the fallback; an older one without it reads as before.
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Preprocessing>(&text).unwrap(), p);
        let old: InputColumn = serde_json::from_str(r#"{"name": "a"}"#).unwrap();
        assert_eq!(old, InputColumn::numeric("a"));
    }

    #[test]
    fn a_binned_column_adds_its_piecewise_linear_bins_after_its_value() {
        // Quantiles of 0..=8 at 0, ¼, ½, ¾, 1: 0, 2, 4, 6, 8; repeated edges are dropped, and
        // a column with fewer than 3 distinct edges gets no bins.
        let mut v: Vec<f64> = (0..=8).rev().map(f64::from).collect();
        assert_eq!(bin_edges(&mut v, 4).unwrap(), vec![0.0, 2.0, 4.0, 6.0, 8.0]);
        let mut v = vec![1.0, 1.0, 1.0, 5.0];
        assert_eq!(bin_edges(&mut v, 4).unwrap(), vec![1.0, 2.0, 5.0]);
        assert_eq!(bin_edges(&mut [3.0, 3.0, 3.0], 8), None);
        assert_eq!(bin_edges(&mut [], 8), None);

        let edges = vec![0.0, 2.0, 4.0, 6.0];
        let enc = |x: f64| {
            let mut out = Vec::new();
            push_bins(&edges, x, &mut out);
            out
        };
        assert_eq!(enc(3.0), vec![1.0, 0.5, 0.0]);
        assert_eq!(enc(0.0), vec![0.0, 0.0, 0.0]);
        // Outside the training range the first bin goes below 0 and the last above 1.
        assert_eq!(enc(-1.0), vec![-0.5, 0.0, 0.0]);
        assert_eq!(enc(9.0), vec![1.0, 1.0, 2.5]);

        // In a row: the value, its bins, then the indicator; a missing cell's imputed value
        // is binned like any other.
        let p = Preprocessing {
            inputs: vec![
                InputColumn {
                    bins: Some(edges.clone()),
                    impute: Some(5.0),
                    indicator: true,
                    ..InputColumn::numeric("x")
                },
                InputColumn::numeric("z"),
            ],
            ..Preprocessing::default()
        };
        assert!(!p.is_plain());
        assert_eq!(p.n_features(), 6);
        assert_eq!(
            p.network_features(),
            vec!["x", "x.bin0", "x.bin1", "x.bin2", "z", "x_missing"]
        );
        let mut out = Vec::new();
        p.push_row(&["3", "7"], &mut out, &locate).unwrap();
        p.push_row(&["", "7"], &mut out, &locate).unwrap();
        assert_eq!(
            out,
            vec![3.0, 1.0, 0.5, 0.0, 7.0, 0.0, 5.0, 1.0, 1.0, 0.5, 7.0, 1.0]
        );
        // The edges travel in the checkpoint; an older checkpoint's column has none.
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Preprocessing>(&text).unwrap(), p);
    }
}
