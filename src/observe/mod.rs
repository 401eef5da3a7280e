//! Observability: the scheduled profiler (on `tracing` spans), the resource trace, the
//! bottleneck verdict, the run registry, the MLflow mirror, and plots. Called from every stage; calls none of them.

pub mod analysis;
#[cfg(feature = "mlflow")]
pub mod mlflow;
#[cfg(feature = "plots")]
pub mod plot;
pub mod profiler;
#[cfg(feature = "registry")]
pub mod registry;
pub mod resources;
pub mod schedule;
pub mod verdict;

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Install the process-wide subscriber: log lines on stderr filtered by `KILN_LOG`
/// (default `warn`), plus the profiler layer (inert until a recording is armed). Safe to call
/// more than once (later calls do nothing).
pub fn install_subscriber() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KILN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let prof = profiler::ProfilerLayer.with_filter(tracing_subscriber::filter::filter_fn(
        profiler::profiler_filter,
    ));
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(prof)
        .try_init();
}
