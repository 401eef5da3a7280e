//! Calendar dates, shared by the trainer and the serving tier: ISO 8601 dates and datetimes
//! (UTC, proleptic Gregorian), and the common forms beyond it — US `03/01/2024`, EU
//! `01/03/2024` and `01.03.2024`, `2024/03/01`, each optionally followed by a time of day
//! (`HH:MM` or `HH:MM:SS`, after a space or `T`). A `/` date with the year last reads month
//! first (`mdy`) or day first (`dmy`): a column's order is decided by its values when one of
//! them has a first or second field above 12, else by the config (`data.split.date_format`);
//! a `.` date is day first (the European convention). A date feature's parts
//! ([`DatePart`]) are what the network sees of a date.

use serde::{Deserialize, Serialize};

/// Seconds per day.
pub const DAY: i64 = 86_400;

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Days from 1970-01-01 to `y-m-d`; `None` when that is no calendar date (month 13, 30
/// February, day 0). The one date check of ISO values here and of `data::dates`.
pub fn civil_days(y: i64, m: u32, d: u32) -> Option<i64> {
    let days_in = [
        31,
        if leap(y) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&m) || d == 0 || d > days_in[m as usize - 1] {
        return None;
    }
    Some(days_from_civil(y, m, d))
}

/// A parsed ISO 8601 date or datetime: seconds since 1970-01-01T00:00:00Z, and whether a
/// time of day was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTime {
    /// Seconds since the Unix epoch (UTC).
    pub seconds: i64,
    /// Whether the text had a time of day.
    pub has_time: bool,
}

/// Parse `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM:SS` or `YYYY-MM-DDTHH:MM:SSZ` (a space may stand
/// for the `T`; fractions of a second, `SS.fff`, are accepted and dropped). Times without `Z`
/// are read as UTC.
pub fn parse_datetime(s: &str) -> Option<DateTime> {
    let s = s.trim();
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (y, m, d) = (num(0..4)?, num(5..7)? as u32, num(8..10)? as u32);
    let day = civil_days(y, m, d)? * DAY;
    if b.len() == 10 {
        return Some(DateTime {
            seconds: day,
            has_time: false,
        });
    }
    let rest = s.get(10..)?;
    let rest = rest.strip_suffix('Z').unwrap_or(rest);
    // Fractions of a second (`.250`, Parquet timestamps) are read and dropped.
    let rest = match rest.split_once('.') {
        Some((whole, frac)) if !frac.is_empty() && frac.bytes().all(|c| c.is_ascii_digit()) => {
            whole
        }
        Some(_) => return None,
        None => rest,
    };
    let rb = rest.as_bytes();
    if rb.len() != 9 || !(rb[0] == b'T' || rb[0] == b' ') || rb[3] != b':' || rb[6] != b':' {
        return None;
    }
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if hh > 23 || mm > 59 || ss > 59 {
        return None;
    }
    Some(DateTime {
        seconds: day + hh * 3600 + mm * 60 + ss,
        has_time: true,
    })
}

/// Format seconds since the epoch as `YYYY-MM-DD` (or with the time, when `with_time`).
pub fn format_datetime(seconds: i64, with_time: bool) -> String {
    let (y, m, d) = civil_from_days(seconds.div_euclid(DAY));
    if !with_time {
        return format!("{y:04}-{m:02}-{d:02}");
    }
    let t = seconds.rem_euclid(DAY);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// The field order of a date whose year is last (`data.split.date_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DateOrder {
    /// Month, day, year (US: `03/01/2024` is 1 March).
    Mdy,
    /// Day, month, year (EU: `03/01/2024` is 3 January).
    Dmy,
}

impl DateOrder {
    /// The name used in configs.
    pub fn name(self) -> &'static str {
        match self {
            DateOrder::Mdy => "mdy",
            DateOrder::Dmy => "dmy",
        }
    }
}

/// What the network sees of a date feature (`data.dates`): each part is one numeric input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatePart {
    /// The year (e.g. 2024).
    Year,
    /// The month, 1–12.
    Month,
    /// The day of the week, 0 (Monday) – 6 (Sunday).
    DayOfWeek,
    /// The day of the year, 1–366.
    DayOfYear,
    /// Days since 1970-01-01 (a trend; extrapolates past the training dates).
    ElapsedDays,
}

impl DatePart {
    /// Every part, in the order a config lists them by default.
    pub const ALL: [DatePart; 5] = [
        DatePart::Year,
        DatePart::Month,
        DatePart::DayOfWeek,
        DatePart::DayOfYear,
        DatePart::ElapsedDays,
    ];

    /// The name used in configs and in network feature names (`<column>.<part>`).
    pub fn name(self) -> &'static str {
        match self {
            DatePart::Year => "year",
            DatePart::Month => "month",
            DatePart::DayOfWeek => "day_of_week",
            DatePart::DayOfYear => "day_of_year",
            DatePart::ElapsedDays => "elapsed_days",
        }
    }

    /// This part of the day `days` (since 1970-01-01).
    pub fn of_day(self, days: i64) -> f64 {
        let (y, m, _) = civil_from_days(days);
        match self {
            DatePart::Year => y as f64,
            DatePart::Month => f64::from(m),
            // 1970-01-01 was a Thursday (3 when Monday is 0).
            DatePart::DayOfWeek => (days + 3).rem_euclid(7) as f64,
            DatePart::DayOfYear => (days - days_from_civil(y, 1, 1) + 1) as f64,
            DatePart::ElapsedDays => days as f64,
        }
    }
}

/// The day (since 1970-01-01) of a parsed date or datetime (its time of day dropped).
pub fn day_of(dt: DateTime) -> i64 {
    dt.seconds.div_euclid(DAY)
}

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
    let days = civil_days(y, u32::try_from(m).ok()?, u32::try_from(d).ok()?)?;
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
    fn date_parts_of_known_days() {
        let day = |s: &str| day_of(parse_datetime(s).unwrap());
        let d = day("2024-03-01");
        assert_eq!(DatePart::Year.of_day(d), 2024.0);
        assert_eq!(DatePart::Month.of_day(d), 3.0);
        assert_eq!(DatePart::DayOfWeek.of_day(d), 4.0, "a Friday");
        assert_eq!(DatePart::DayOfYear.of_day(d), 61.0, "2024 is a leap year");
        assert_eq!(DatePart::ElapsedDays.of_day(d), 19_783.0);
        assert_eq!(DatePart::DayOfWeek.of_day(0), 3.0, "1970-01-01, a Thursday");
        let before = day("1969-12-28");
        assert_eq!(DatePart::DayOfWeek.of_day(before), 6.0, "a Sunday");
        assert_eq!(DatePart::DayOfYear.of_day(before), 362.0);
        assert_eq!(DatePart::DayOfYear.of_day(day("2023-12-31")), 365.0);
        assert_eq!(day_of(parse_datetime("2024-03-01T23:59:59Z").unwrap()), d);
        let names: Vec<&str> = DatePart::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(
            names,
            [
                "year",
                "month",
                "day_of_week",
                "day_of_year",
                "elapsed_days"
            ]
        );
    }

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
