//! `kiln init --data FILE --target COL…`: a commented starter config for a table (CSV or
//! Parquet). Numeric columns become features, text columns with few distinct values
//! categorical features (one with a value on most rows, an identifier, is left out), a date
//! column (if there is one) carries relative windows, else the split is random; missing cells
//! get median imputation (the unknown bucket for a category) with an indicator.

use std::fmt::Write as _;
use std::path::Path;

use super::split::parse_datetime;
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
        } else if parse_datetime(c).is_some() {
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
    let mut features = Vec::new();
    let mut categorical = Vec::new();
    let mut date: Option<String> = None;
    let mut missing = 0usize;
    let mut holes: Vec<String> = Vec::new();
    for (j, name) in table.header.iter().enumerate() {
        if targets.contains(name) {
            continue;
        }
        match kind(&table, j) {
            Kind::Numeric => {
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
    writeln!(y, "  features: [{}]", list(&features)).unwrap();
    if !categorical.is_empty() {
        writeln!(
            y,
            "  # Text columns: one 0/1 input per value of the training split; a value it did not\n  # have (or a missing one, with the imputation below) sets none of them."
        )
        .unwrap();
        writeln!(y, "  categorical: [{}]", list(&categorical)).unwrap();
    }
    writeln!(y, "  targets: [{}]", list(targets)).unwrap();
    writeln!(
        y,
        "  # At predict and serve time a missing cell gets the training median (a category: the\n  # unknown bucket), even in a column without holes here; `predict_missing: refuse` refuses it."
    )
    .unwrap();
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
            notes.push(format!(
                "split by date column `{d}`: validation and test the last {k} of {} distinct dates each",
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
            text.push_str(&format!("{i},{w},{}\n", i * 3));
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
        assert_eq!(
            d.features,
            vec![
                "store=s0",
                "store=s1",
                "store=s2",
                "price",
                "promo",
                "promo_missing"
            ]
        );
        assert!(d.test.rows() > 0 && d.validation.rows() > 0);
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
