//! Command implementations: one function per subcommand, called from `main.rs`.

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod dataset;
pub mod export;
pub mod gpu;
pub mod import;
pub mod loadtest;
pub mod mvn;
pub mod observe;
pub mod pick;
pub mod predict;
pub mod promote;
pub mod runs;
pub mod serve;
pub mod sweep;
pub mod train;

/// An error with the process exit code it should produce.
#[derive(Debug)]
pub struct CliError {
    /// Exit code (2 = bad input or usage, 1 = runtime failure, 3 = a check found a problem).
    pub code: u8,
    /// The one-line reason.
    pub error: anyhow::Error,
}

impl CliError {
    /// Bad input (config, data, arguments).
    pub fn input(error: impl Into<anyhow::Error>) -> Self {
        Self {
            code: 2,
            error: error.into(),
        }
    }
}

impl<E: Into<anyhow::Error>> From<E> for CliError {
    fn from(e: E) -> Self {
        Self {
            code: 1,
            error: e.into(),
        }
    }
}

/// Result of a command.
pub type CliResult = Result<(), CliError>;
