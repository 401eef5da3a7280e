//! Why a server could not start or stopped with an error: the one error type the layers that
//! bind sockets and start threads (the connection runtimes, tracing, the server) share.

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
    /// Binding or serving failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}
