//! The training table: features and targets as f32 matrices, split by season, with
//! normalisation statistics fit on the training split only.

use std::path::PathBuf;

use std::collections::BTreeMap;

use super::preprocess::{
    DateEncoding, EncodeCounts, INDICATOR_SUFFIX, InputColumn, Preprocessing, RawValue, median,
};
use super::split;
use super::table::{CsvTable, DataError, is_missing};
use crate::config::{DataConfig, Imputation, MissingPolicy, PredictMissing};

/// `a 3, b 1` for counts by reason or column.
pub fn describe_counts(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rows of features and targets (row-major), raw units.
#[derive(Debug, Clone, Default)]
pub struct Subset {
    /// `rows × n_features`.
    pub x: Vec<f32>,
    /// `rows × n_targets`.
    pub y: Vec<f32>,
    /// The split column's value of each row (0 for random and grouped splits).
    pub season: Vec<i64>,
    /// Each row's index among the file's data rows (0 = the first row after the header), so
    /// that other columns of the same rows can be read back (e.g. the gate's group column).
    pub source_rows: Vec<usize>,
    /// Sample weights (`data.weight`), one per row; empty when every row weighs the same.
    pub w: Vec<f64>,
}

impl Subset {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.season.len()
    }

    /// The sample weights, or `None` when every row weighs the same.
    pub fn weights(&self) -> Option<&[f64]> {
        (!self.w.is_empty()).then_some(&self.w[..])
    }
}

/// A numeric feature cell that is text: say how to declare the column categorical.
fn categorical_hint(e: DataError, categorical: &[String]) -> DataError {
    match e {
        DataError::NotNumeric {
            path,
            line,
            column,
            value,
        } if !categorical.contains(&column) => DataError::Cell {
            path,
            line,
            message: if super::dates::is_date(&value) {
                format!(
                    "expected a number, got the date {value:?}; a date is neither a number nor a category (as one, every future date would fall in the unknown bucket): declare it a date feature (data.dates: {{{column}: [month, day_of_week, day_of_year]}}), or take it out of data.features and split on it (data.split.column: {column})"
                )
            } else {
                format!(
                    "expected a number, got {value:?}; if `{column}` holds categories, list it under data.categorical"
                )
            },
            column,
        },
        e => e,
    }
}

/// A dataset read from a CSV file and split (see [`super::split`]), with missing values
/// handled as configured (see [`Preprocessing`]).
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The CSV file.
    pub path: PathBuf,
    /// SHA-256 of the file's bytes (hex).
    pub sha256: String,
    /// Feature names, in network order (the configured features, then missing indicators).
    pub features: Vec<String>,
    /// Target column names.
    pub targets: Vec<String>,
    /// Training rows.
    pub train: Subset,
    /// Validation rows.
    pub validation: Subset,
    /// Test rows.
    pub test: Subset,
    /// Rows in the file outside every split.
    pub unused_rows: usize,
    /// Each split as resolved on this data (train, validation, test), e.g.
    /// `last 2 (2017–2018)`.
    pub split_describe: [String; 3],
    /// The preprocessing fit on the training split, with the counts of dropped rows and
    /// imputed cells.
    pub preprocessing: Preprocessing,
    /// Missing cells (empty, `NaN`, `NA`, `null`) per feature and target column, over the
    /// whole file.
    pub missing_cells: BTreeMap<String, usize>,
}

/// How date feature `name` (column `j`) is read, when `data.dates` lists it: its parts, and
/// the order of year-last dates (decided by the column's values, else `split.date_format`;
/// an ambiguous or mixed column is an error naming it).
fn date_encoding(
    cfg: &DataConfig,
    table: &CsvTable,
    name: &str,
    j: usize,
) -> Result<Option<DateEncoding>, DataError> {
    use super::dates::{ColumnOrder, column_order};
    let Some(parts) = cfg.dates.get(name) else {
        return Ok(None);
    };
    let cells: Vec<_> = table.column_cells(j).filter(|c| !is_missing(c)).collect();
    let order = match column_order(cells.iter().map(|c| c.as_ref())) {
        ColumnOrder::NotNeeded => cfg.split.date_format,
        ColumnOrder::Decided(o) => Some(o),
        ColumnOrder::Ambiguous(example) => match cfg.split.date_format {
            Some(o) => Some(o),
            None => {
                return Err(DataError::Other(format!(
                    "{}: date column `{name}` holds dates like {example:?} that read month first (US) or day first (EU), and no value decides which: set data.split.date_format: mdy or dmy",
                    cfg.path.display()
                )));
            }
        },
        ColumnOrder::Mixed(d, m) => {
            return Err(DataError::Other(format!(
                "{}: date column `{name}` mixes day-first dates ({d:?}) and month-first ones ({m:?}); one column needs one format",
                cfg.path.display()
            )));
        }
    };
    Ok(Some(DateEncoding {
        order,
        parts: parts.clone(),
    }))
}

impl Dataset {
    /// Read `cfg.path`, split it, select the configured columns and handle missing values.
    /// Only the columns the config uses ([`DataConfig::used_columns`]) are read: a wide
    /// file's other columns cost neither memory nor limits.
    pub fn load(cfg: &DataConfig) -> Result<Self, DataError> {
        let used = cfg.used_columns();
        let keep = |c: &str| used.contains(c);
        let (table, sha256) = CsvTable::read_file_columns(
            &cfg.path,
            cfg.format,
            cfg.delimiter.map(|c| c as u8),
            Some(&keep),
        )?;
        Self::from_table(cfg, &table, sha256)
    }

    /// [`Dataset::load`], also returning the table it was built from: rows, SHA-256 and any
    /// other column (a group column, raw cells) come from one read of the file, so they
    /// cannot disagree when the file is replaced meanwhile.
    pub fn load_with_table(cfg: &DataConfig) -> Result<(Self, CsvTable), DataError> {
        let (table, sha256) =
            CsvTable::read_file(&cfg.path, cfg.format, cfg.delimiter.map(|c| c as u8))?;
        let data = Self::from_table(cfg, &table, sha256)?;
        Ok((data, table))
    }

    /// Split and select columns of an already-read table.
    pub fn from_table(
        cfg: &DataConfig,
        table: &CsvTable,
        sha256: String,
    ) -> Result<Self, DataError> {
        if table.n_rows() == 0 {
            return Err(DataError::Empty {
                path: cfg.path.clone(),
            });
        }
        let assignment = split::assign(table, &cfg.split, &cfg.season_column)?;
        let f_idx: Vec<usize> = cfg
            .features
            .iter()
            .map(|n| table.column_index(n))
            .collect::<Result<_, _>>()?;
        let t_idx: Vec<usize> = cfg
            .targets
            .iter()
            .map(|n| table.column_index(n))
            .collect::<Result<_, _>>()?;
        let w_idx = cfg
            .weight
            .as_ref()
            .map(|w| table.column_index(w))
            .transpose()?;
        let categorical: Vec<bool> = cfg
            .features
            .iter()
            .map(|f| cfg.categorical.contains(f))
            .collect();
        let policies: Vec<&MissingPolicy> =
            cfg.features.iter().map(|f| cfg.missing.policy(f)).collect();
        let date_enc: Vec<Option<DateEncoding>> = cfg
            .features
            .iter()
            .zip(&f_idx)
            .map(|(name, &j)| date_encoding(cfg, table, name, j))
            .collect::<Result<_, _>>()?;
        for f in &cfg.features {
            if matches!(
                cfg.missing.policy(f),
                MissingPolicy::Impute {
                    indicator: true,
                    ..
                }
            ) {
                let name = format!("{f}{INDICATOR_SUFFIX}");
                if cfg.features.contains(&name) || cfg.targets.contains(&name) {
                    return Err(DataError::Other(format!(
                        "data.missing: the indicator feature of `{f}` would be called `{name}`, which is already a configured column; rename it"
                    )));
                }
            }
        }
        let nt = cfg.targets.len();
        let mut dropped: BTreeMap<String, usize> = BTreeMap::new();
        let outside = assignment.outside();
        if assignment.missing_key > 0 {
            dropped.insert(
                "outside every split: split column missing".into(),
                assignment.missing_key,
            );
        }
        if outside > assignment.missing_key {
            dropped.insert(
                "outside every split".into(),
                outside - assignment.missing_key,
            );
        }
        // Pass 1: which rows each split keeps (targets, weights and numeric cells checked,
        // missing values handled by policy), in file order.
        let mut parts = [Subset::default(), Subset::default(), Subset::default()];
        let mut yrow = Vec::with_capacity(nt);
        'rows: for (i, &line) in table.lines.iter().enumerate() {
            let Some(p) = assignment.part[i] else {
                continue;
            };
            let p = p as usize;
            yrow.clear();
            for (&j, name) in t_idx.iter().zip(&cfg.targets) {
                if table.is_missing_at(i, j) {
                    *dropped
                        .entry(format!(
                            "missing target `{name}` ({})",
                            split::SPLIT_NAMES[p]
                        ))
                        .or_default() += 1;
                    continue 'rows;
                }
                yrow.push(table.f32_at(i, j, name)?);
            }
            let weight = match (w_idx, &cfg.weight) {
                (Some(j), Some(name)) => {
                    let cell = table.cell(i, j);
                    if is_missing(&cell) {
                        *dropped
                            .entry(format!("missing weight `{name}`"))
                            .or_default() += 1;
                        continue 'rows;
                    }
                    let w = table.parse_cell_f32(&cell, line, name)?;
                    if w < 0.0 {
                        return Err(DataError::Cell {
                            path: table.path.clone(),
                            line,
                            column: name.clone(),
                            message: format!(
                                "a sample weight is negative ({cell:?}); expected a number ≥ 0"
                            ),
                        });
                    }
                    Some(w as f64)
                }
                _ => None,
            };
            for ((((&j, name), policy), &cat), date) in f_idx
                .iter()
                .zip(&cfg.features)
                .zip(&policies)
                .zip(&categorical)
                .zip(&date_enc)
            {
                if table.is_missing_at(i, j) {
                    let cell = table.cell(i, j);
                    match policy {
                        MissingPolicy::Error => {
                            return Err(DataError::Cell {
                                path: table.path.clone(),
                                line,
                                column: name.clone(),
                                message: format!(
                                    "missing value {cell:?} (empty, NaN, NA and null are missing); set data.missing (drop_row or {{impute: mean | median | constant}}) to accept missing values"
                                ),
                            });
                        }
                        MissingPolicy::DropRow => {
                            *dropped
                                .entry(format!("missing feature `{name}` (drop_row)"))
                                .or_default() += 1;
                            continue 'rows;
                        }
                        MissingPolicy::Impute { .. } => {}
                    }
                } else if let Some(d) = date {
                    d.day(&table.cell(i, j))
                        .map_err(|message| DataError::Cell {
                            path: table.path.clone(),
                            line,
                            column: name.clone(),
                            message,
                        })?;
                } else if !cat {
                    table
                        .f32_at(i, j, name)
                        .map_err(|e| categorical_hint(e, &cfg.categorical))?;
                }
            }
            let part = &mut parts[p];
            part.y.extend_from_slice(&yrow);
            part.season.push(assignment.key[i]);
            part.source_rows.push(i);
            if let Some(w) = weight {
                part.w.push(w);
            }
        }
        for (k, part) in parts.iter().enumerate() {
            let why = if dropped.keys().any(|r| r.starts_with("missing")) {
                format!(
                    " (after dropping rows with missing values: {})",
                    describe_counts(&dropped)
                )
            } else {
                String::new()
            };
            if part.rows() == 0 {
                return Err(DataError::EmptySplit {
                    path: cfg.path.clone(),
                    split: split::SPLIT_NAMES[k],
                    range: format!("{}{why}", assignment.describe[k]),
                    column: cfg
                        .split
                        .column
                        .clone()
                        .unwrap_or_else(|| cfg.season_column.clone()),
                });
            }
            if let Some(w) = &cfg.weight
                && part.w.iter().sum::<f64>() <= 0.0
            {
                return Err(DataError::Other(format!(
                    "{}: the {} split's sample weights (column `{w}`) are all 0; at least one row must weigh something",
                    cfg.path.display(),
                    split::SPLIT_NAMES[k]
                )));
            }
        }
        // Imputation values and vocabularies from the training split only.
        let impute_at_predict = cfg.predict_missing == PredictMissing::Impute;
        let mut inputs = Vec::with_capacity(cfg.features.len());
        for ((((&j, name), policy), &cat), date) in f_idx
            .iter()
            .zip(&cfg.features)
            .zip(&policies)
            .zip(&categorical)
            .zip(&date_enc)
        {
            let mut col = InputColumn::numeric(name);
            let cells = || {
                parts[0]
                    .source_rows
                    .iter()
                    .map(|&r| table.cell(r, j))
                    .filter(|c| !is_missing(c))
            };
            if let Some(d) = date {
                // A missing date gets a day (the training split's mean or median day), whose
                // parts the network sees.
                let mut days: Vec<f64> = cells()
                    .map(|c| d.day(&c).expect("checked in pass 1") as f64)
                    .collect();
                match policy {
                    MissingPolicy::Impute {
                        with, indicator, ..
                    } => {
                        let v = match with {
                            Imputation::Mean if !days.is_empty() => {
                                days.iter().sum::<f64>() / days.len() as f64
                            }
                            Imputation::Median if !days.is_empty() => {
                                median(&mut days).expect("non-empty")
                            }
                            Imputation::Constant => {
                                return Err(DataError::Other(format!(
                                    "{}: date column `{name}`: impute: constant is for numbers; use impute: median (the training split's median day) or mean",
                                    cfg.path.display()
                                )));
                            }
                            _ => {
                                return Err(DataError::Other(format!(
                                    "{}: date column `{name}`: every training row is missing, so there is no day to impute; drop the feature",
                                    cfg.path.display()
                                )));
                            }
                        };
                        col.impute = Some(v.round());
                        col.indicator = *indicator;
                    }
                    MissingPolicy::Error | MissingPolicy::DropRow if impute_at_predict => {
                        col.fallback = median(&mut days).map(f64::round);
                    }
                    MissingPolicy::Error | MissingPolicy::DropRow => {}
                }
                col.date = Some(d.clone());
                inputs.push(col);
                continue;
            }
            if cat {
                let fold = cfg.case_insensitive.contains(name);
                col.case_insensitive = fold;
                let vocab: std::collections::BTreeSet<String> = cells()
                    .map(|c| {
                        let c = c.trim();
                        if fold {
                            c.to_lowercase()
                        } else {
                            c.to_string()
                        }
                    })
                    .collect();
                if vocab.len() > cfg.max_categories {
                    let examples: Vec<&str> = vocab.iter().take(5).map(String::as_str).collect();
                    return Err(DataError::Other(format!(
                        "{}: categorical column `{name}` has {} distinct values in the training split (e.g. {}), more than data.max_categories ({}); is it an identifier? Raise data.max_categories or leave the column out",
                        cfg.path.display(),
                        vocab.len(),
                        examples.join(", "),
                        cfg.max_categories
                    )));
                }
                col.categories = Some(vocab.into_iter().collect());
                match policy {
                    MissingPolicy::Impute { indicator, .. } => {
                        col.missing_to_unknown = true;
                        col.indicator = *indicator;
                    }
                    // Training had no holes in this column (or dropped them); at predict and
                    // serve time a missing category still goes to the unknown bucket.
                    MissingPolicy::Error | MissingPolicy::DropRow => {
                        col.missing_to_unknown = impute_at_predict;
                    }
                }
            } else if let MissingPolicy::Impute {
                with,
                value,
                indicator,
            } = policy
            {
                let mut seen: Vec<f64> = cells()
                    .map(|c| f64::from(c.trim().parse::<f64>().expect("checked in pass 1") as f32))
                    .collect();
                let v = match with {
                    Imputation::Constant => value.unwrap_or(0.0),
                    Imputation::Mean if !seen.is_empty() => {
                        seen.iter().sum::<f64>() / seen.len() as f64
                    }
                    Imputation::Median if !seen.is_empty() => median(&mut seen).expect("non-empty"),
                    _ => {
                        return Err(DataError::Other(format!(
                            "{}: column `{name}`: every training row is missing, so there is no {} to impute; use impute: constant or drop the feature",
                            cfg.path.display(),
                            if *with == Imputation::Mean {
                                "mean"
                            } else {
                                "median"
                            }
                        )));
                    }
                };
                col.impute = Some(v);
                col.indicator = *indicator;
            } else if impute_at_predict {
                // Training had no holes in this column (or dropped them): at predict and serve
                // time a missing cell gets the training split's median (not a network input
                // change, so the checkpoint's inputs stay plain).
                let mut seen: Vec<f64> = cells()
                    .filter_map(|c| c.trim().parse::<f64>().ok())
                    .map(|v| f64::from(v as f32))
                    .collect();
                col.fallback = median(&mut seen);
            }
            let n_bins = cfg.numeric_bins.read_with();
            if !cat && n_bins > 0 {
                // Bins at the training split's quantiles of the values it has.
                let mut seen: Vec<f64> = cells()
                    .filter_map(|c| c.trim().parse::<f64>().ok())
                    .map(|v| f64::from(v as f32))
                    .collect();
                col.bins = kiln_model::preprocess::bin_edges(&mut seen, n_bins);
            }
            inputs.push(col);
        }
        let mut pre = Preprocessing {
            inputs,
            weight: cfg.weight.clone(),
            rows_outside: outside,
            dropped,
            imputed: BTreeMap::new(),
            unknown: BTreeMap::new(),
        };
        // Pass 2: every kept row through the stored preprocessing, exactly as `kiln predict`
        // and `kiln serve` will read raw rows.
        let n_net = pre.n_features();
        let mut counts = EncodeCounts::default();
        let mut unknown = EncodeCounts::default();
        let mut cells = Vec::with_capacity(f_idx.len());
        for (k, part) in parts.iter_mut().enumerate() {
            let mut x = Vec::with_capacity(part.rows() * n_net);
            for &r in &part.source_rows {
                let line = table.lines[r];
                cells.clear();
                cells.extend(f_idx.iter().map(|&j| table.cell(r, j)));
                let values: Vec<RawValue> = cells.iter().map(|c| RawValue::cell(c)).collect();
                let locate = |column: &str, message: String| DataError::Cell {
                    path: table.path.clone(),
                    line,
                    column: column.to_string(),
                    message,
                };
                let c = if k == 0 { &mut counts } else { &mut unknown };
                pre.push_values(&values, &mut x, &locate, Some(c))?;
            }
            part.x = x;
        }
        for (i, c) in pre.inputs.iter().enumerate() {
            let n = counts.imputed.get(i).copied().unwrap_or(0)
                + unknown.imputed.get(i).copied().unwrap_or(0);
            if n > 0 {
                pre.imputed.insert(c.name.clone(), n);
            }
            if let Some(&n) = unknown.unknown.get(i).filter(|&&n| n > 0) {
                pre.unknown.insert(c.name.clone(), n);
            }
        }
        let mut missing_cells = BTreeMap::new();
        for (&j, name) in f_idx
            .iter()
            .zip(&cfg.features)
            .chain(t_idx.iter().zip(&cfg.targets))
            .chain(w_idx.iter().zip(&cfg.weight))
        {
            let n = (0..table.n_rows())
                .filter(|&r| table.is_missing_at(r, j))
                .count();
            if n > 0 {
                missing_cells.insert(name.clone(), n);
            }
        }
        let [train, validation, test] = parts;
        Ok(Self {
            path: cfg.path.clone(),
            sha256,
            features: pre.network_features(),
            targets: cfg.targets.clone(),
            train,
            validation,
            test,
            unused_rows: outside,
            split_describe: assignment.describe,
            preprocessing: pre,
            missing_cells,
        })
    }

    /// The same rows without piecewise-linear bins: each binned column's `<column>.bin<i>`
    /// inputs dropped and its edges cleared, which is exactly what `data.numeric_bins: 0`
    /// reads from the same file (the bins are the only inputs they add). `numeric_bins: auto`
    /// reads the file once, with bins, and trains its no-bins candidate on this.
    pub fn without_bins(&self) -> Dataset {
        let pre = &self.preprocessing;
        let mut keep = Vec::with_capacity(pre.n_features());
        for c in &pre.inputs {
            let bins = c.bin_count();
            keep.extend(std::iter::repeat_n(true, c.width() - bins));
            keep.extend(std::iter::repeat_n(false, bins));
        }
        keep.resize(pre.n_features(), true);
        let mut out = self.clone();
        for c in &mut out.preprocessing.inputs {
            c.bins = None;
        }
        out.features = out.preprocessing.network_features();
        let n = keep.len();
        for part in [&mut out.train, &mut out.validation, &mut out.test] {
            part.x = part
                .x
                .chunks_exact(n)
                .flat_map(|row| row.iter().zip(&keep).filter(|(_, k)| **k).map(|(v, _)| *v))
                .collect();
        }
        out
    }

    /// What `kiln config check` reports about the data: rows per split, rows left out,
    /// missing and imputed cells.
    pub fn check_report(&self) -> String {
        let mut s = format!(
            "{}: {} train / {} validation / {} test rows, {} outside every split\n  {}",
            self.path.display(),
            self.train.rows(),
            self.validation.rows(),
            self.test.rows(),
            self.unused_rows,
            self.summary()
        );
        s.push_str(&format!(
            "\n  missing cells: {}",
            if self.missing_cells.is_empty() {
                "none".to_string()
            } else {
                describe_counts(&self.missing_cells)
            }
        ));
        let kinds: Vec<String> = self
            .preprocessing
            .inputs
            .iter()
            .map(|c| match (&c.categories, &c.date) {
                (Some(v), _) => format!("{} categorical ({} values)", c.name, v.len()),
                (None, Some(d)) => format!(
                    "{} date ({})",
                    c.name,
                    d.parts
                        .iter()
                        .map(|p| p.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                (None, None) => format!("{} numeric", c.name),
            })
            .collect();
        s.push_str(&format!("\n  features: {}", kinds.join(", ")));
        if !self.preprocessing.unknown.is_empty() {
            s.push_str(&format!(
                "\n  categories the training split lacks (unknown bucket) in validation/test: {}",
                describe_counts(&self.preprocessing.unknown)
            ));
        }
        if let Some(w) = &self.preprocessing.weight {
            let sum = |p: &Subset| p.w.iter().sum::<f64>();
            s.push_str(&format!(
                "\n  sample weights `{w}`: total {:.6} train / {:.6} validation / {:.6} test",
                sum(&self.train),
                sum(&self.validation),
                sum(&self.test)
            ));
        }
        s.push_str(&format!(
            "\n  network inputs ({}): {}",
            self.features.len(),
            self.features.join(", ")
        ));
        s
    }

    /// One line on what the split and the missing-value handling did (printed by training).
    pub fn summary(&self) -> String {
        let mut s = format!(
            "split: train {} · validation {} · test {}",
            self.split_describe[0], self.split_describe[1], self.split_describe[2]
        );
        if !self.preprocessing.dropped.is_empty() {
            s.push_str(&format!(
                "; rows left out: {}",
                describe_counts(&self.preprocessing.dropped)
            ));
        }
        if !self.preprocessing.imputed.is_empty() {
            s.push_str(&format!(
                "; imputed cells: {}",
                describe_counts(&self.preprocessing.imputed)
            ));
        }
        if !self.preprocessing.unknown.is_empty() {
            s.push_str(&format!(
                "; unknown categories (validation/test): {}",
                describe_counts(&self.preprocessing.unknown)
            ));
        }
        s
    }

    /// Number of features.
    pub fn n_features(&self) -> usize {
        self.features.len()
    }

    /// Number of targets.
    pub fn n_targets(&self) -> usize {
        self.targets.len()
    }
}

pub use crate::util::{sha256_file, sha256_hex};

pub use kiln_model::stats::{Affine, ColumnStats, fit_stats, fit_stats_weighted};
