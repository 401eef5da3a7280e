//! On-demand profiling of a live server (`POST /v2/profile?duration_ms=…`): arm the
//! profiler (`crate::observe::profiler`) for a bounded window while the server keeps
//! serving, then write the same Chrome trace and key-averages table as `kiln profile infer`
//! (`trace.json`, `key_averages.txt`, `key_averages.json`) into a new directory.
//!
//! The serving path's phases, each a profiler span or interval:
//! * `serve_request` — a successful request, arrival to encoded answer (the table's step);
//! * `serve_decode` — parsing and decoding the request (HTTP);
//! * `serve_queue_wait` — time in the batcher's queue (ended by the thread that takes it);
//! * `serve_batch_assembly` — gathering a batch's inputs for the instance;
//! * `serve_compute` — the instance's execution (engine);
//! * `serve_encode` — encoding the response.
//!
//! Outside a window every span site costs one cached-interest check and every interval one
//! atomic load, as for the training profiler. The process holds one recording at a time: a
//! second request while one runs is refused.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::observe::profiler::{DEFAULT_MAX_BYTES, Options, ProfileOutputs, StepProfiler};
use crate::observe::schedule::Schedule;

/// The longest window one request may ask for.
pub const MAX_WINDOW: Duration = Duration::from_secs(60);

/// Most events one recording keeps (and, separately, most memory samples). A request's
/// spans number about ten, so this holds some 20,000 requests; under heavier load the rest
/// of the window is counted (`dropped_events` in the answer) but not kept, so a recording
/// stays within tens of MiB whatever the load, and its memory is returned when the answer
/// has been written.
pub const MAX_EVENTS: usize = 200_000;

/// Most bytes one recording holds by its own accounting (the profiler's
/// [`DEFAULT_MAX_BYTES`], 64 MiB): whichever of the two caps is reached first ends what is
/// kept; the rest is counted as dropped.
pub const MAX_BYTES: usize = DEFAULT_MAX_BYTES;

/// The step span of a serving profile.
pub const STEP_NAME: &str = "serve_request";

static BUSY: AtomicBool = AtomicBool::new(false);

/// Why a profile was not written.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The window is out of range.
    #[error("{0}")]
    Invalid(String),
    /// Another recording is running.
    #[error("a profile is already being recorded; retry when it is done")]
    Busy,
    /// Nothing was recorded in the window (no requests, or no profiler in this process).
    #[error(
        "nothing was recorded in {0:?}: no request was served in the window (or this process \
         has no profiler layer installed)"
    )]
    Empty(Duration),
    /// Writing the outputs failed.
    #[error("cannot write the profile into {dir}: {source}")]
    Io {
        /// The output directory.
        dir: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// A written profile.
#[derive(Debug, Clone)]
pub struct LiveProfile {
    /// The directory holding it.
    pub dir: PathBuf,
    /// Its files and table.
    pub outputs: ProfileOutputs,
    /// Spans recorded.
    pub events: usize,
    /// Spans (and memory samples) not kept because the window reached its event or byte
    /// cap.
    pub dropped: u64,
    /// The most bytes the recording held (the profiler's own accounting), at most its cap.
    pub bytes: usize,
}

struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        BUSY.store(false, Ordering::Release);
    }
}

/// Check a requested window (`duration_ms`).
pub fn window(duration_ms: u64) -> Result<Duration, ProfileError> {
    let d = Duration::from_millis(duration_ms);
    if d.is_zero() || d > MAX_WINDOW {
        return Err(ProfileError::Invalid(format!(
            "duration_ms is {duration_ms}; expected 1 to {}",
            MAX_WINDOW.as_millis()
        )));
    }
    Ok(d)
}

/// Record the profiler's spans for `window` while the server serves, then write the
/// outputs into a new directory under `root` (`serve-<unix ms>`).
pub async fn record(root: &Path, window: Duration) -> Result<LiveProfile, ProfileError> {
    record_capped(root, window, MAX_EVENTS).await
}

/// [`record`] with an event cap of `max_events` (tests use small caps).
pub async fn record_capped(
    root: &Path,
    window: Duration,
    max_events: usize,
) -> Result<LiveProfile, ProfileError> {
    record_bounded(root, window, max_events, MAX_BYTES).await
}

/// [`record`] with an event cap of `max_events` and a byte cap of `max_bytes`.
pub async fn record_bounded(
    root: &Path,
    window: Duration,
    max_events: usize,
    max_bytes: usize,
) -> Result<LiveProfile, ProfileError> {
    if BUSY
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(ProfileError::Busy);
    }
    let _release = Release;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let dir = root.join(format!("serve-{stamp}"));
    let schedule = Schedule {
        wait: 0,
        warmup: 0,
        active: 1,
        repeat: 1,
    };
    let mut prof = StepProfiler::new(schedule, Options::default(), dir.clone(), STEP_NAME)
        .with_max_events(max_events)
        .with_max_bytes(max_bytes);
    let io = |source| ProfileError::Io {
        dir: dir.clone(),
        source,
    };
    prof.on_step(0).map_err(io)?;
    tokio::time::sleep(window).await;
    let (written, dropped, bytes) = tokio::task::spawn_blocking(move || {
        let w = prof.finish();
        (w, prof.dropped(), prof.bytes())
    })
    .await
    .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    let outputs = written.map_err(io)?.ok_or(ProfileError::Empty(window))?;
    let events = outputs.averages.rows.iter().map(|r| r.calls as usize).sum();
    Ok(LiveProfile {
        dir,
        outputs,
        events,
        dropped,
        bytes,
    })
}
