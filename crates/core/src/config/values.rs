//! Values that configs and data share: ISO 8601 date/datetime parsing and formatting (UTC,
//! proleptic Gregorian), the comparable value of a split range's end, and range overlap.
//! They live with the config (the lower layer) because the config validates its split ranges
//! with them; `data::split` re-exports them.

use super::{Bound, SeasonRange};

/// Seconds per day.
pub const DAY: i64 = 86_400;

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
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

/// The comparable value of a range end: the integer, or the date's seconds; a date-only
/// upper end means the end of that day.
pub fn bound_value(b: &Bound, upper: bool) -> i64 {
    match b {
        Bound::Int(v) => *v,
        Bound::Date(s) => match parse_datetime(s) {
            Some(dt) if upper && !dt.has_time => dt.seconds + DAY - 1,
            Some(dt) => dt.seconds,
            None => 0, // rejected when the config is parsed
        },
    }
}

/// The comparable (lowest, highest) values of a range; open ends are the extremes.
pub fn range_ends(r: &SeasonRange) -> (i64, i64) {
    (
        r.from.as_ref().map_or(i64::MIN, |b| bound_value(b, false)),
        r.to.as_ref().map_or(i64::MAX, |b| bound_value(b, true)),
    )
}

/// Whether two ranges share a value.
pub fn ranges_overlap(a: &SeasonRange, b: &SeasonRange) -> bool {
    let (a0, a1) = range_ends(a);
    let (b0, b1) = range_ends(b);
    a0.max(b0) <= a1.min(b1)
}
