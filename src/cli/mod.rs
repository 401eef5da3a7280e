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

/// `--engine E` of the commands that build an engine: an engine this build names, or the
/// engines' own message (`unknown engine "E" (expected one of: …)`).
pub fn parse_engine(s: &str) -> Result<kiln::records::EngineKind, String> {
    kiln::infer::parse_engine(s).map_err(|e| e.to_string())
}

/// `--engine E` of the commands that start a server (`kiln serve`, `kiln bench loadtest`):
/// an engine this build has, or the server's message (`unknown engine `E`; expected one of:
/// …`).
pub fn parse_serve_engine(s: &str) -> Result<kiln::records::EngineKind, String> {
    s.parse::<kiln::records::EngineKind>()
        .ok()
        .filter(|k| k.is_built())
        .ok_or_else(|| kiln::serve::server::unknown_engine(s))
}

/// A path as printed for scripts: absolute (resolved against the working directory), so that
/// it can be handed on from another directory.
pub fn printed(p: &std::path::Path) -> std::path::PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}
