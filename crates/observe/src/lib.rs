//! kiln's instrumentation: the scheduled profiler (on `tracing` spans), the resource trace,
//! the bottleneck verdict, calibration data and plots. Every other kiln crate may call it; it
//! calls none of them (it depends only on `kiln-base`). The run registry, the MLflow mirror
//! and the regression analysis are tracking, not instrumentation: they live in `kiln-track`.
//!
//! Cargo features: `plots` (PNG/SVG figures), `cuda` (GPU memory through NVML), `no-spans`
//! (the profiler's spans compiled out).

#![warn(missing_docs)]

use kiln_base::util;

/// `tracing`, re-exported for [`prof_span!`] so that crates using the macro need no
/// dependency of their own.
#[doc(hidden)]
pub use tracing as __tracing;

pub mod calibration;
#[cfg(feature = "plots")]
pub mod plot;
pub mod profiler;
pub mod resources;
pub mod schedule;
pub mod verdict;

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Whether log lines on stderr may carry ANSI colour codes: only when stderr is a terminal,
/// `NO_COLOR` is unset or empty (<https://no-color.org>), and the caller did not ask for
/// plain output (`kiln train --plain`).
pub fn log_colour(plain: bool) -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    colour_allowed(plain, no_color, std::io::stderr().is_terminal())
}

fn colour_allowed(plain: bool, no_color: bool, terminal: bool) -> bool {
    terminal && !plain && !no_color
}

/// The log filter without `KILN_LOG`: warnings and errors, plus the server's one line per
/// version that goes live (target `kiln::serve::live`).
pub const DEFAULT_LOG: &str = "warn,kiln::serve::live=info";

/// Install the process-wide subscriber: log lines on stderr filtered by `KILN_LOG`
/// (default [`DEFAULT_LOG`]), coloured only as [`log_colour`] allows, plus the profiler layer
/// (inert until a recording is armed). Safe to call more than once (later calls do nothing).
pub fn install_subscriber() {
    install_subscriber_with(false);
}

/// [`install_subscriber`], with `plain` forcing uncoloured log lines.
pub fn install_subscriber_with(plain: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KILN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(log_colour(plain))
        .with_filter(filter);
    let prof = profiler::ProfilerLayer.with_filter(tracing_subscriber::filter::filter_fn(
        profiler::profiler_filter,
    ));
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(prof)
        .try_init();
}

#[cfg(test)]
mod tests {
    #[test]
    fn colour_only_on_a_terminal_without_plain_or_no_color() {
        assert!(super::colour_allowed(false, false, true));
        assert!(
            !super::colour_allowed(false, false, false),
            "a pipe or file"
        );
        assert!(!super::colour_allowed(true, false, true), "--plain");
        assert!(!super::colour_allowed(false, true, true), "NO_COLOR");
    }
}
