//! Small helpers shared across kiln (a leaf: imports nothing of kiln's): UTC timestamps
//! without a date-time dependency, atomic file writes, host and process facts, SHA-256, the one percentile definition, the one
//! Gaussian negative log-likelihood, the one XML/HTML escaper, and the crash-test hook
//! ([`fault`]).

pub mod fault;
mod fs;
mod host;
mod stats;
mod text;

pub use fs::{sync_dir, write_atomic, write_synced};
pub use host::{
    GitCommit, git_commit, hostname, process_alive, process_start, sha256_file, sha256_hex,
};
pub use stats::{HALF_LN_2PI, gaussian_nll, percentile};
pub use text::{count, escape_xml};

use std::time::{SystemTime, UNIX_EPOCH};

/// Civil date `(year, month, day)` of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `(y, m, d, hh, mm, ss)` in UTC for seconds since the Unix epoch.
fn utc_parts(secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400) as u32;
    (y, m, d, s / 3600, (s / 60) % 60, s % 60)
}

/// Whether a process with this id exists (where `/proc` is unavailable: assume it does, so
/// nothing of a live process is ever cleaned up).
pub fn process_exists(pid: u32) -> bool {
    if !std::path::Path::new("/proc/self").exists() {
        return true;
    }
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// RFC 3339 UTC timestamp with seconds, e.g. `2026-11-29T09:33:15Z`.
pub fn rfc3339(unix_secs: f64) -> String {
    let (y, m, d, hh, mm, ss) = utc_parts(unix_secs.floor() as i64);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

/// Compact UTC stamp for directory names, e.g. `20261129T093315Z`.
pub fn compact_stamp(unix_secs: f64) -> String {
    let (y, m, d, hh, mm, ss) = utc_parts(unix_secs.floor() as i64);
    format!("{y:04}{m:02}{d:02}T{hh:02}{mm:02}{ss:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_timestamps() {
        assert_eq!(rfc3339(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400.0), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_944_795.5), "2026-11-29T09:33:15Z");
        assert_eq!(compact_stamp(1_795_944_795.0), "20261129T093315Z");
    }
}
