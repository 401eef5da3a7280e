//! Derive the player-season table from the Baseball Databank (CC BY-SA 3.0).
//!
//! One row per (player, season t) for batters with at least `min_pa` plate appearances in
//! each of seasons t−2, t−1 and t. Features describe seasons t−1 and t−2 (plate appearances
//! and eight per-plate-appearance rates each) plus age in season t and years since the
//! player's first season; targets are season t's HR, BB and SO rates per plate appearance.
//! Stints with several teams in one season are summed. The output is sorted by
//! (season, player) and numbers are printed with fixed precision, so the derivation is
//! byte-for-byte reproducible.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use super::table::{CsvTable, DataError};

/// Settings of the derivation (defaults produce the shipped `datasets/baseball.csv`).
#[derive(Debug, Clone, Copy)]
pub struct BaseballSpec {
    /// Minimum plate appearances in each of t−2, t−1 and t.
    pub min_pa: u32,
    /// First season t emitted (older seasons lack SF/IBB/HBP records).
    pub first_season: i64,
}

impl Default for BaseballSpec {
    fn default() -> Self {
        Self {
            min_pa: 100,
            first_season: 1960,
        }
    }
}

/// Counting stats of one player-season (all stints summed).
#[derive(Debug, Clone, Copy, Default)]
struct Season {
    ab: f64,
    h: f64,
    double: f64,
    triple: f64,
    hr: f64,
    bb: f64,
    so: f64,
    hbp: f64,
    sh: f64,
    sf: f64,
    sb: f64,
}

impl Season {
    fn pa(&self) -> f64 {
        self.ab + self.bb + self.hbp + self.sh + self.sf
    }

    fn rates(&self) -> [f64; 8] {
        let pa = self.pa();
        [
            self.h,
            self.double,
            self.triple,
            self.hr,
            self.bb,
            self.so,
            self.hbp,
            self.sb,
        ]
        .map(|v| v / pa)
    }
}

const RATE_NAMES: [&str; 8] = [
    "h_rate",
    "double_rate",
    "triple_rate",
    "hr_rate",
    "bb_rate",
    "so_rate",
    "hbp_rate",
    "sb_rate",
];

/// The feature columns of the derived table, in order (20).
pub fn feature_names() -> Vec<String> {
    let mut v = vec!["age".to_string(), "experience".to_string()];
    for lag in ["l1", "l2"] {
        v.push(format!("pa_{lag}"));
        for r in RATE_NAMES {
            v.push(format!("{r}_{lag}"));
        }
    }
    v
}

/// The target columns of the derived table, in order (3).
pub fn target_names() -> Vec<String> {
    vec!["hr_rate".into(), "bb_rate".into(), "so_rate".into()]
}

/// Read `Batting.csv` and `People.csv` from `source` and return the derived CSV text and
/// its row count.
pub fn derive(source: &Path, spec: BaseballSpec) -> Result<(String, usize), DataError> {
    let batting = CsvTable::read(&source.join("Batting.csv"))?;
    let people = CsvTable::read(&source.join("People.csv"))?;

    // Birth year and month per player.
    let pid = people.column_index("playerID")?;
    let by = people.column_index("birthYear")?;
    let bm = people.column_index("birthMonth")?;
    let mut birth: HashMap<String, (i64, i64)> = HashMap::new();
    for (r, &line) in people.lines.iter().enumerate() {
        let row = |j: usize| people.cell(r, j);
        if row(by).is_empty() {
            continue; // unknown birth year: the player's rows are skipped below
        }
        let year = people.parse_cell(&row(by), line, "birthYear")? as i64;
        let month = if row(bm).is_empty() {
            1
        } else {
            people.parse_cell(&row(bm), line, "birthMonth")? as i64
        };
        birth.insert(row(pid).into_owned(), (year, month));
    }

    // Season totals per player, and each player's first season.
    let col = |name: &str| batting.column_index(name);
    let (c_player, c_year) = (col("playerID")?, col("yearID")?);
    let counted = [
        "AB", "H", "2B", "3B", "HR", "BB", "SO", "HBP", "SH", "SF", "SB",
    ];
    let idx: Vec<usize> = counted.iter().map(|c| col(c)).collect::<Result<_, _>>()?;
    let mut seasons: BTreeMap<(String, i64), Season> = BTreeMap::new();
    let mut first: HashMap<String, i64> = HashMap::new();
    for (r, &line) in batting.lines.iter().enumerate() {
        let row = |j: usize| batting.cell(r, j);
        let player = row(c_player).into_owned();
        let year = batting.parse_cell(&row(c_year), line, "yearID")? as i64;
        let mut v = [0.0f64; 11];
        for (k, (&i, name)) in idx.iter().zip(counted).enumerate() {
            // Empty cells mean "not recorded" (old seasons); they count as zero.
            let cell = row(i);
            if !cell.is_empty() {
                v[k] = batting.parse_cell(&cell, line, name)?;
            }
        }
        let s = seasons.entry((player.clone(), year)).or_default();
        s.ab += v[0];
        s.h += v[1];
        s.double += v[2];
        s.triple += v[3];
        s.hr += v[4];
        s.bb += v[5];
        s.so += v[6];
        s.hbp += v[7];
        s.sh += v[8];
        s.sf += v[9];
        s.sb += v[10];
        if v[0] + v[5] + v[7] + v[8] + v[9] > 0.0 {
            let f = first.entry(player).or_insert(year);
            *f = (*f).min(year);
        }
    }

    let min_pa = spec.min_pa as f64;
    let mut out_rows: Vec<(i64, &str, String)> = Vec::new();
    for ((player, t), cur) in &seasons {
        let (player, t) = (player.as_str(), *t);
        if t < spec.first_season || cur.pa() < min_pa {
            continue;
        }
        let (Some(l1), Some(l2)) = (
            seasons.get(&(player.to_string(), t - 1)),
            seasons.get(&(player.to_string(), t - 2)),
        ) else {
            continue;
        };
        if l1.pa() < min_pa || l2.pa() < min_pa {
            continue;
        }
        let Some(&(birth_year, birth_month)) = birth.get(player) else {
            continue;
        };
        // Baseball age: age on July 1 of the season.
        let age = t - birth_year - i64::from(birth_month >= 7);
        let experience = t - first.get(player).copied().unwrap_or(t);
        let mut line = String::with_capacity(256);
        write!(line, "{player},{t},{},{age},{experience}", cur.pa() as i64).unwrap();
        for s in [l1, l2] {
            write!(line, ",{}", s.pa() as i64).unwrap();
            for r in s.rates() {
                write!(line, ",{r:.6}").unwrap();
            }
        }
        let r = cur.rates();
        write!(line, ",{:.6},{:.6},{:.6}", r[3], r[4], r[5]).unwrap();
        out_rows.push((t, player, line));
    }
    out_rows.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));

    let mut text = String::new();
    text.push_str("player_id,season,pa");
    for f in feature_names() {
        text.push(',');
        text.push_str(&f);
    }
    for t in target_names() {
        text.push(',');
        text.push_str(&t);
    }
    text.push('\n');
    for (_, _, line) in &out_rows {
        text.push_str(line);
        text.push('\n');
    }
    Ok((text, out_rows.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn derives_rows_with_lags_stints_and_age() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "People.csv",
            "playerID,birthYear,birthMonth\nab01,1980,8\ncd01,,\n",
        );
        let mut b = String::from("playerID,yearID,stint,AB,H,2B,3B,HR,BB,SO,HBP,SH,SF,SB\n");
        for (y, ab) in [(1999, 50), (2000, 200), (2001, 300), (2002, 150)] {
            b.push_str(&format!("ab01,{y},1,{ab},50,10,1,5,20,40,2,1,2,3\n"));
        }
        b.push_str("ab01,2002,2,100,25,5,0,5,10,20,0,0,0,0\n"); // second stint
        for y in 2000..2003 {
            b.push_str(&format!("cd01,{y},1,400,100,20,2,10,40,80,5,0,5,1\n"));
        }
        write(dir.path(), "Batting.csv", &b);
        let spec = BaseballSpec {
            min_pa: 100,
            first_season: 1990,
        };
        let (text, n) = derive(dir.path(), spec).unwrap();
        // ab01: 1999 has 75 PA (< 100), so only 2002 (lags 2001, 2000) qualifies;
        // cd01 has no birth year.
        assert_eq!(n, 1, "{text}");
        let row: Vec<&str> = text.lines().nth(1).unwrap().split(',').collect();
        let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
        assert_eq!(header.len(), 3 + 20 + 3);
        assert_eq!(&row[..5], &["ab01", "2002", "285", "21", "3"]);
        // Season 2002: HR 10 / PA 285 (two stints summed).
        assert_eq!(
            row[header.iter().position(|h| *h == "hr_rate").unwrap()],
            "0.035088"
        );
        assert_eq!(
            row[header.iter().position(|h| *h == "pa_l1").unwrap()],
            "325"
        );
    }

    #[test]
    fn bad_cell_is_located() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "People.csv",
            "playerID,birthYear,birthMonth\nab01,1980,8\n",
        );
        write(
            dir.path(),
            "Batting.csv",
            "playerID,yearID,stint,AB,H,2B,3B,HR,BB,SO,HBP,SH,SF,SB\nab01,2000,1,x,1,1,1,1,1,1,1,1,1,1\n",
        );
        let e = derive(dir.path(), BaseballSpec::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("Batting.csv:2: column `AB`: expected a number, got \"x\""),
            "{e}"
        );
    }
}
