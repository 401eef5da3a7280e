//! Values that configs and data share: ISO 8601 date/datetime parsing and formatting (UTC,
//! proleptic Gregorian), the comparable value of a split range's end, and range overlap.
//! They live with the config (the lower layer) because the config validates its split ranges
//! with them; `data::split` re-exports them.

use super::{Bound, SeasonRange};

pub use kiln_model::dates::{
    DAY, DateTime, civil_days, civil_from_days, days_from_civil, format_datetime, parse_datetime,
};

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
