//! Dates beyond ISO 8601: US `03/01/2024`, EU `01/03/2024` and `01.03.2024`, `2024/03/01`,
//! each optionally followed by a time of day (`HH:MM` or `HH:MM:SS`, after a space or `T`).
//! A `/` date with the year last reads month first (`mdy`) or day first (`dmy`): a column's
//! order is decided by its values when one of them has a first or second field above 12,
//! else by `data.split.date_format`; a `.` date is day first (the European convention).

pub use crate::config::DateOrder;
use crate::config::values::{DateTime, parse_datetime};

/// A date text split into its fields.
struct Fields {
    /// The three numbers of the date part, in text order.
    n: [i64; 3],
    /// Whether the first field has four digits (`YYYY/MM/DD`).
    year_first: bool,
    /// The date part's separator.
    sep: char,
    /// Seconds into the day, when a time was given.
    time: Option<i64>,
}

fn digits(t: &str) -> Option<i64> {
    if t.is_empty() || t.len() > 4 || !t.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

fn fields(s: &str) -> Option<Fields> {
    let s = s.trim();
    let (date, time) = match s.find([' ', 'T']) {
        Some(i) => (&s[..i], Some(s[i + 1..].trim())),
        None => (s, None),
    };
    let sep = ['/', '.', '-'].into_iter().find(|c| date.contains(*c))?;
    let parts: Vec<&str> = date.split(sep).collect();
    if parts.len() != 3 {
        return None;
    }
    let n = [digits(parts[0])?, digits(parts[1])?, digits(parts[2])?];
    let year_first = parts[0].len() == 4;
    if !year_first && parts[2].len() != 4 {
        return None;
    }
    let time = match time {
        None => None,
        Some(t) => {
            let t = t.strip_suffix('Z').unwrap_or(t);
            let hms: Vec<&str> = t.split(':').collect();
            if !(2..=3).contains(&hms.len()) {
                return None;
            }
            let h = digits(hms[0])?;
            let m = digits(hms[1])?;
            let sec = match hms.get(2) {
                Some(x) => digits(x.split('.').next()?)?,
                None => 0,
            };
            if h > 23 || m > 59 || sec > 60 {
                return None;
            }
            Some(h * 3600 + m * 60 + sec)
        }
    };
    Some(Fields {
        n,
        year_first,
        sep,
        time,
    })
}

/// Parse a date or datetime: ISO 8601 as [`parse_datetime`] reads it, else one of the forms
/// of this module. A `/` date with the year last needs `order` unless one of its first two
/// fields is above 12 (then only one order is a date); a `.` date is day first unless
/// `order` says otherwise. `None`: not a date (or an ambiguous one without `order`).
pub fn parse_date(s: &str, order: Option<DateOrder>) -> Option<DateTime> {
    if let Some(dt) = parse_datetime(s) {
        return Some(dt);
    }
    let f = fields(s)?;
    let [a, b, c] = f.n;
    let (y, m, d) = if f.year_first {
        (a, b, c)
    } else {
        let order = order.or(match (f.sep, a > 12, b > 12) {
            ('.', _, _) => Some(DateOrder::Dmy),
            (_, true, false) => Some(DateOrder::Dmy),
            (_, false, true) => Some(DateOrder::Mdy),
            _ => None,
        })?;
        match order {
            DateOrder::Mdy => (c, a, b),
            DateOrder::Dmy => (c, b, a),
        }
    };
    let days =
        crate::config::values::civil_days(y, u32::try_from(m).ok()?, u32::try_from(d).ok()?)?;
    Some(DateTime {
        seconds: days * 86_400 + f.time.unwrap_or(0),
        has_time: f.time.is_some(),
    })
}

/// Whether a cell reads as a date in either order.
pub fn is_date(s: &str) -> bool {
    parse_date(s, Some(DateOrder::Mdy)).is_some() || parse_date(s, Some(DateOrder::Dmy)).is_some()
}

/// What a column's date texts need to be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnOrder {
    /// ISO or year-first dates only: no order needed.
    NotNeeded,
    /// The values decide the order (a field above 12, or `.` dates).
    Decided(DateOrder),
    /// Every year-last `/` date reads both ways, e.g. the given text.
    Ambiguous(String),
    /// Some values are day first and others month first: not one date format.
    Mixed(String, String),
}

/// How the dates among `cells` (missing cells skipped by the caller) must be read.
pub fn column_order<'a>(cells: impl IntoIterator<Item = &'a str>) -> ColumnOrder {
    let (mut dmy, mut mdy, mut ambiguous): (Option<&str>, Option<&str>, Option<&str>) =
        (None, None, None);
    for c in cells {
        if parse_datetime(c).is_some() {
            continue;
        }
        let Some(f) = fields(c) else { continue };
        if f.year_first {
            continue;
        }
        match (f.sep, f.n[0] > 12, f.n[1] > 12) {
            ('.', _, _) | (_, true, false) => {
                dmy.get_or_insert(c);
            }
            (_, false, true) => {
                mdy.get_or_insert(c);
            }
            _ => {
                ambiguous.get_or_insert(c);
            }
        }
    }
    match (dmy, mdy, ambiguous) {
        (Some(d), Some(m), _) => ColumnOrder::Mixed(d.trim().into(), m.trim().into()),
        (Some(_), None, _) => ColumnOrder::Decided(DateOrder::Dmy),
        (None, Some(_), _) => ColumnOrder::Decided(DateOrder::Mdy),
        (None, None, Some(a)) => ColumnOrder::Ambiguous(a.trim().into()),
        (None, None, None) => ColumnOrder::NotNeeded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn us_eu_and_iso_dates_agree() {
        let iso = parse_datetime("2024-03-01").unwrap();
        assert_eq!(parse_date("03/01/2024", Some(DateOrder::Mdy)), Some(iso));
        assert_eq!(parse_date("01/03/2024", Some(DateOrder::Dmy)), Some(iso));
        assert_eq!(parse_date("01.03.2024", None), Some(iso));
        assert_eq!(parse_date("2024/03/01", None), Some(iso));
        assert_eq!(parse_date("3/1/2024", Some(DateOrder::Mdy)), Some(iso));
        // A field above 12 decides by itself; otherwise the order is needed.
        assert_eq!(parse_date("12/31/1999", None), parse_datetime("1999-12-31"));
        assert_eq!(parse_date("31/12/1999", None), parse_datetime("1999-12-31"));
        assert_eq!(parse_date("03/01/2024", None), None);
        // Times of day.
        let t = parse_date("03/01/2024 13:45", Some(DateOrder::Mdy)).unwrap();
        assert_eq!(t.seconds, iso.seconds + 13 * 3600 + 45 * 60);
        assert!(t.has_time);
        let t = parse_date("01.03.2024 13:45:30", None).unwrap();
        assert_eq!(t.seconds, iso.seconds + 13 * 3600 + 45 * 60 + 30);
        // Before the epoch, leap days.
        assert_eq!(
            parse_date("02/29/1960", Some(DateOrder::Mdy)),
            parse_datetime("1960-02-29")
        );
        for bad in [
            "02/30/2024",
            "13/13/2024",
            "1/2/24",
            "1/2",
            "a/b/2024",
            "2024",
            "1.5",
        ] {
            assert_eq!(parse_date(bad, Some(DateOrder::Mdy)), None, "{bad}");
        }
        assert_eq!(parse_date("29.02.2023", None), None);
    }

    #[test]
    fn a_column_decides_its_order_or_says_it_cannot() {
        assert_eq!(
            column_order(["03/01/2024", "03/15/2024"]),
            ColumnOrder::Decided(DateOrder::Mdy)
        );
        assert_eq!(
            column_order(["03/01/2024", "15/03/2024"]),
            ColumnOrder::Decided(DateOrder::Dmy)
        );
        assert_eq!(
            column_order(["03/01/2024", "04/01/2024"]),
            ColumnOrder::Ambiguous("03/01/2024".into())
        );
        assert_eq!(
            column_order(["2024-03-01", "2024/03/02"]),
            ColumnOrder::NotNeeded
        );
        assert!(matches!(
            column_order(["15/03/2024", "03/15/2024"]),
            ColumnOrder::Mixed(..)
        ));
        assert!(is_date("03/01/2024") && is_date("1.3.2024") && !is_date("3.5"));
    }
}
