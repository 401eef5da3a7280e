//! Optional MLflow mirror: with `MLFLOW_TRACKING_URI` set, each `kiln train` run is also sent
//! to an MLflow tracking server through its REST API — experiment get-by-name/create,
//! runs/create, runs/log-batch (within MLflow's limits of 1,000 metrics and 100 params per
//! request) and runs/update. The registry stays the source of truth: a failing or absent
//! tracking server logs a warning and never fails training.
//!
//! # Environment
//!
//! [`Mirror::from_env`] reads MLflow's own variables (empty values count as unset):
//!
//! | variable | meaning |
//! |---|---|
//! | `MLFLOW_TRACKING_URI` | `http://host[:port][/prefix]` or `https://…`; IPv6 hosts in brackets (`http://[::1]:5000`) |
//! | `MLFLOW_EXPERIMENT_NAME` | experiment to log into (default `kiln-<config name>`), created when missing |
//! | `MLFLOW_TRACKING_USERNAME` + `MLFLOW_TRACKING_PASSWORD` | HTTP basic auth (takes precedence over the token, as in MLflow) |
//! | `MLFLOW_TRACKING_TOKEN` | bearer token |
//! | `MLFLOW_TRACKING_SERVER_CERT_PATH` | PEM bundle of extra CA certificates trusted for `https://` |
//! | `MLFLOW_TRACKING_INSECURE_TLS` | `true` skips certificate verification (not with a cert path) |
//! | `MLFLOW_HTTP_REQUEST_TIMEOUT` | read timeout in seconds (default 15) |
//! | `MLFLOW_HTTP_REQUEST_MAX_RETRIES` | retries after the first try, 0–10 (default 2) |
//! | `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY` | proxies, as the HTTP client reads them |
//!
//! Everything the transport needs is in [`ClientOptions`]; [`ClientOptions::from_env`] is the
//! only place that reads the process environment (through [`ClientOptions::from_lookup`], which
//! takes any lookup function), so a [`Client`] can be built without touching process-wide state.
//!
//! # Transport
//!
//! Requests go through `ureq` (HTTP/1.1, rustls; no OpenSSL). `https://` servers are verified
//! against Mozilla's root store (the `webpki` roots, what MLflow's Python client trusts by
//! default) plus the certificates of `MLFLOW_TRACKING_SERVER_CERT_PATH`. Each request has a
//! connect timeout and a read timeout; connection failures, timeouts and 5xx answers are
//! retried with exponential backoff (by default 3 tries, waiting 250 ms then 500 ms). 4xx
//! answers are not retried: they are reported with MLflow's `error_code` and `message`.
//! Redirects are not followed (a redirect is reported with its target), so credentials never
//! travel to another host.
//!
//! # Config → params
//!
//! The run's config is logged as MLflow params by [`flatten`]ing its JSON form. MLflow accepts
//! only ASCII alphanumerics and `_ - . space : /` in param names, so the flattened keys are
//! built as follows:
//!
//! - object members are joined with `.`: `loader.batch_size`;
//! - elements of arrays that hold objects or arrays are addressed by their index as a
//!   segment: `stages[0].clip_norm` becomes `stages.0.clip_norm`; arrays of scalars stay one
//!   param whose value is the JSON array (`model.hidden` = `[48,48]`);
//! - inside an object key, every character other than ASCII alphanumerics, `_`, `-` and
//!   space — in particular `.`, `:` and `/` — is escaped byte-wise as `:XX` (upper-case hex of
//!   each UTF-8 byte), and an empty key is written as a lone `:`;
//! - JSON `null` values (unset options) are omitted;
//! - strings are logged as they are, other scalars as JSON (`true`, `0.001`); values longer
//!   than [`MAX_PARAM_VALUE`] characters are truncated to that length when logged.
//!
//! - a name longer than MLflow's [`MAX_KEY_LENGTH`] (250 characters) keeps its first 217
//!   characters, followed by `/` and the first 32 hex digits of the SHA-256 of the whole name
//!   ([`fit_name`]).
//!
//! Two different leaves can never share a key: after escaping, a segment contains no `.`
//! and a `:` only as the start of an escape (`:XX`) or as the whole empty-key segment, so a
//! key splits back into its segments and each segment decodes to exactly one object key or
//! index. Where two leaves' paths first differ they sit under the same parent, which is
//! either an object (two different keys, which escape differently) or an array (two
//! different indices); a numeric object key such as `"0"` cannot meet an array index because
//! one parent is never both an object and an array. A `/` never appears in an unshortened
//! name (it is escaped inside keys), so a shortened name cannot meet an unshortened one, and
//! two shortened names meet only if 128 bits of SHA-256 collide.
//!
//! # The mirrored run
//!
//! See [`Mirror`]: the MLflow run id is stored in the run directory (`mlflow.json`), metrics
//! are sent as each epoch ends by a background sender, artifacts go through the proxied
//! artifact store, and sweeps become a parent run with one child per member.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};
use ureq::http;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig, TlsProvider};

mod mirror;
pub mod model_registry;

pub use mirror::{
    DEFAULT_FLUSH_TIMEOUT, ENV_PARENT_RUN_ID, FLUSH_TIMEOUT_ENV, INCOMPLETE_TAG, Mirror,
    MirrorOptions, MirrorReport, MirrorState, STATE_FILE, SweepParent, mark_stale_runs_killed,
};

/// MLflow's per-request limits for runs/log-batch.
pub const MAX_METRICS_PER_BATCH: usize = 1000;
/// Params per runs/log-batch request.
pub const MAX_PARAMS_PER_BATCH: usize = 100;
/// Longest param value MLflow keeps (longer values are cut by the server; kiln cuts them
/// first, by characters).
pub const MAX_PARAM_VALUE: usize = 6000;
/// Longest tag value MLflow accepts.
pub const MAX_TAG_VALUE: usize = 8000;
/// Metrics, params and tags together per runs/log-batch request.
pub const MAX_ENTITIES_PER_BATCH: usize = 1000;
/// Longest param, metric or tag name MLflow accepts.
pub const MAX_KEY_LENGTH: usize = 250;

/// Default limit for establishing a connection (DNS, TCP and TLS handshake).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default limit for sending a request and for each phase of receiving its answer.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(15);
/// Default number of tries per request (the first one included).
pub const DEFAULT_MAX_TRIES: u32 = 3;
/// Default wait before the first retry; it doubles before each further retry.
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(250);

/// Largest `MLFLOW_HTTP_REQUEST_MAX_RETRIES` accepted (keeps a dead server from stalling a run).
const MAX_RETRIES_LIMIT: u32 = 10;

const URI_FORMS: &str = "http://host[:port][/prefix] or https://host[:port][/prefix]";

/// Characters left as they are in a query-string value: RFC 3986's unreserved set.
pub(super) const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// What went wrong while talking to (or preparing to talk to) an MLflow tracking server.
#[derive(Debug, thiserror::Error)]
pub enum MlflowError {
    /// The tracking URI cannot be used.
    #[error("MLflow tracking URI {uri:?}: {problem}; expected {URI_FORMS}")]
    Uri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        problem: String,
    },
    /// An environment variable has a value kiln cannot use.
    #[error("{var}={value:?}: expected {expected}")]
    Env {
        /// The variable's name.
        var: &'static str,
        /// Its value (empty for a missing companion variable; never a password).
        value: String,
        /// What would have been accepted.
        expected: String,
    },
    /// The extra CA bundle cannot be used.
    #[error(
        "CA bundle {origin}: {problem}; expected PEM text with at least one \
         -----BEGIN CERTIFICATE----- block"
    )]
    CaBundle {
        /// Where the bundle came from (a path and variable, or the option).
        origin: String,
        /// What is wrong with it.
        problem: String,
    },
    /// No HTTP answer: connection refused or reset, timeout, DNS or TLS failure, malformed
    /// response.
    #[error(
        "{method} {url}: {error} (after {tries} {}); expected an MLflow tracking server \
         answering there",
        if *tries == 1 { "try" } else { "tries" }
    )]
    Transport {
        /// HTTP method.
        method: String,
        /// Full request URL.
        url: String,
        /// Tries made.
        tries: u32,
        /// The last failure.
        error: ureq::Error,
    },
    /// The server answered with a status other than 2xx.
    #[error(
        "{method} {url}: HTTP {status} {}: {message}; expected a 2xx answer",
        error_code.as_deref().unwrap_or("(no MLflow error_code)")
    )]
    Status {
        /// HTTP method.
        method: String,
        /// Full request URL.
        url: String,
        /// HTTP status code.
        status: u16,
        /// MLflow's `error_code`, when the body carried one.
        error_code: Option<String>,
        /// MLflow's `message`, or the start of the body.
        message: String,
    },
    /// A 2xx answer lacked a field kiln needs.
    #[error("{method} {url}: the answer {body} has no {expected}")]
    Response {
        /// HTTP method.
        method: String,
        /// Full request URL.
        url: String,
        /// The JSON field expected, as a dotted path.
        expected: &'static str,
        /// The answer (shortened).
        body: String,
    },
    /// An artifact could not be uploaded before any request was made.
    #[error("artifact {name}: {problem}")]
    Artifact {
        /// The artifact path.
        name: String,
        /// Why.
        problem: String,
    },
    /// The run's config could not be turned into JSON for the params.
    #[error("cannot serialise the run config into MLflow params: {0}")]
    Config(#[source] serde_json::Error),
}

/// Credentials sent with every request.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum Auth {
    /// No `Authorization` header.
    #[default]
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// `Authorization: Basic base64(username:password)`.
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: String,
    },
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Auth::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
        }
    }
}

impl Auth {
    fn header(&self) -> Option<String> {
        match self {
            Auth::None => None,
            Auth::Bearer(token) => Some(format!("Bearer {token}")),
            Auth::Basic { username, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
            )),
        }
    }
}

/// How a [`Client`] connects: timeouts, retries, credentials and TLS trust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Limit for establishing a connection (DNS, TCP, TLS handshake).
    pub connect_timeout: Duration,
    /// Limit for sending the request and for each phase of receiving the answer.
    pub read_timeout: Duration,
    /// Tries per request, the first included (at least 1 is always made).
    pub max_tries: u32,
    /// Wait before the first retry; doubled before each further one.
    pub backoff: Duration,
    /// Credentials.
    pub auth: Auth,
    /// PEM text of CA certificates trusted in addition to the webpki roots.
    pub extra_ca_pem: Option<Vec<u8>>,
    /// Skip certificate verification entirely (`MLFLOW_TRACKING_INSECURE_TLS=true`).
    pub insecure_tls: bool,
    /// Use the proxies named by `HTTP_PROXY` / `HTTPS_PROXY` / `ALL_PROXY` (and `NO_PROXY`),
    /// read from the process environment when the client is built.
    pub env_proxy: bool,
}

impl Default for ClientOptions {
    /// The defaults of the module docs; no credentials, no extra CAs, no proxy.
    fn default() -> Self {
        Self {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            max_tries: DEFAULT_MAX_TRIES,
            backoff: DEFAULT_BACKOFF,
            auth: Auth::None,
            extra_ca_pem: None,
            insecure_tls: false,
            env_proxy: false,
        }
    }
}

const TOKEN: &str = "MLFLOW_TRACKING_TOKEN";
const USERNAME: &str = "MLFLOW_TRACKING_USERNAME";
const PASSWORD: &str = "MLFLOW_TRACKING_PASSWORD";
const CERT_PATH: &str = "MLFLOW_TRACKING_SERVER_CERT_PATH";
const INSECURE: &str = "MLFLOW_TRACKING_INSECURE_TLS";
const TIMEOUT: &str = "MLFLOW_HTTP_REQUEST_TIMEOUT";
const MAX_RETRIES: &str = "MLFLOW_HTTP_REQUEST_MAX_RETRIES";

impl ClientOptions {
    /// Options from MLflow's environment variables (see the module docs); proxies from the
    /// environment are enabled.
    pub fn from_env() -> Result<Self, MlflowError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Options from the variables `lookup` returns (`None` or an empty value: unset). Reads
    /// the file named by `MLFLOW_TRACKING_SERVER_CERT_PATH`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, MlflowError> {
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let mut options = Self {
            env_proxy: true,
            ..Self::default()
        };
        options.auth = match (get(USERNAME), get(PASSWORD), get(TOKEN)) {
            (Some(username), Some(password), _) => Auth::Basic { username, password },
            (Some(_), None, _) => {
                return Err(MlflowError::Env {
                    var: PASSWORD,
                    value: String::new(),
                    expected: format!("a password, since {USERNAME} is set"),
                });
            }
            (None, Some(_), _) => {
                return Err(MlflowError::Env {
                    var: USERNAME,
                    value: String::new(),
                    expected: format!("a user name, since {PASSWORD} is set"),
                });
            }
            (None, None, Some(token)) => Auth::Bearer(token),
            (None, None, None) => Auth::None,
        };
        if let Some(v) = get(INSECURE) {
            options.insecure_tls = match v.trim().to_ascii_lowercase().as_str() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => {
                    return Err(MlflowError::Env {
                        var: INSECURE,
                        value: v,
                        expected: "true or false".into(),
                    });
                }
            };
        }
        if let Some(path) = get(CERT_PATH) {
            if options.insecure_tls {
                return Err(MlflowError::Env {
                    var: INSECURE,
                    value: "true".into(),
                    expected: format!(
                        "false or unset while {CERT_PATH} is set (verify against the bundle, \
                         or skip verification, not both)"
                    ),
                });
            }
            let origin = format!("{path} ({CERT_PATH})");
            let pem = std::fs::read(&path).map_err(|e| MlflowError::CaBundle {
                origin: origin.clone(),
                problem: format!("cannot read it: {e}"),
            })?;
            parse_ca_pem(&pem).map_err(|problem| MlflowError::CaBundle { origin, problem })?;
            options.extra_ca_pem = Some(pem);
        }
        if let Some(v) = get(TIMEOUT) {
            let secs = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&s| s > 0)
                .ok_or_else(|| MlflowError::Env {
                    var: TIMEOUT,
                    value: v.clone(),
                    expected: "a whole number of seconds, at least 1".into(),
                })?;
            options.read_timeout = Duration::from_secs(secs);
        }
        if let Some(v) = get(MAX_RETRIES) {
            let retries = v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&r| r <= MAX_RETRIES_LIMIT)
                .ok_or_else(|| MlflowError::Env {
                    var: MAX_RETRIES,
                    value: v.clone(),
                    expected: format!("a whole number from 0 to {MAX_RETRIES_LIMIT}"),
                })?;
            options.max_tries = retries + 1;
        }
        Ok(options)
    }
}

/// The certificates of a PEM bundle; an error says why there are none.
fn parse_ca_pem(pem: &[u8]) -> Result<Vec<Certificate<'static>>, String> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(format!("malformed PEM: {e}")),
        }
    }
    if certs.is_empty() {
        return Err("no certificate in it".into());
    }
    Ok(certs)
}

/// The base URL (`scheme://authority[/prefix]`, no trailing `/`) of a tracking URI.
fn parse_base(uri: &str) -> Result<String, MlflowError> {
    let bad = |problem: String| MlflowError::Uri {
        uri: uri.to_string(),
        problem,
    };
    if uri.contains('#') {
        return Err(bad("a fragment (`#…`) is not allowed".into()));
    }
    let uri_text = uri.trim();
    let scheme = match uri_text.split_once(':') {
        Some((s, _))
            if s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
        {
            s.to_ascii_lowercase()
        }
        _ => return Err(bad("no scheme".into())),
    };
    if scheme != "http" && scheme != "https" {
        return Err(bad(format!(
            "kiln's mirror speaks only HTTP(S) to a tracking server, not {scheme:?}"
        )));
    }
    let parsed: http::Uri = uri_text
        .parse()
        .map_err(|e| bad(format!("not a valid URI ({e})")))?;
    let authority = parsed.authority().ok_or_else(|| bad("no host".into()))?;
    if authority.as_str().contains('@') {
        return Err(bad(format!(
            "credentials in the URI are not supported; set {USERNAME} and {PASSWORD} (or \
             {TOKEN}) instead"
        )));
    }
    if authority.host().is_empty() {
        return Err(bad("no host".into()));
    }
    let text = authority.as_str();
    let after_host = text.rfind(']').map_or(text, |i| &text[i + 1..]);
    if let Some((_, port)) = after_host.rsplit_once(':')
        && port.parse::<u16>().is_err()
    {
        return Err(bad(format!(
            "the port {port:?} is not a number from 0 to 65535"
        )));
    }
    if parsed.query().is_some() {
        return Err(bad("a query string (`?…`) is not allowed".into()));
    }
    Ok(format!(
        "{scheme}://{}{}",
        authority.as_str(),
        parsed.path().trim_end_matches('/')
    ))
}

fn tls_config(options: &ClientOptions) -> Result<TlsConfig, MlflowError> {
    let builder = TlsConfig::builder().provider(TlsProvider::Rustls);
    if options.insecure_tls {
        return Ok(builder.disable_verification(true).build());
    }
    let roots = match &options.extra_ca_pem {
        None => RootCerts::WebPki,
        Some(pem) => {
            let extra = parse_ca_pem(pem).map_err(|problem| MlflowError::CaBundle {
                origin: "ClientOptions::extra_ca_pem".into(),
                problem,
            })?;
            webpki_root_certs::TLS_SERVER_ROOT_CERTS
                .iter()
                .map(|der| Certificate::from_der(der.as_ref()))
                .chain(extra)
                .into()
        }
    };
    Ok(builder.root_certs(roots).build())
}

/// Whether a failure without an HTTP answer may go away on its own.
fn is_transient(e: &ureq::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        // TLS failures (an unknown issuer, a bad certificate) arrive as InvalidData.
        ureq::Error::Io(io) => !matches!(
            io.kind(),
            ErrorKind::InvalidData
                | ErrorKind::InvalidInput
                | ErrorKind::Unsupported
                | ErrorKind::PermissionDenied
        ),
        ureq::Error::ConnectionFailed
        | ureq::Error::Timeout(_)
        | ureq::Error::HostNotFound
        | ureq::Error::BodyStalled => true,
        _ => false,
    }
}

/// The first `max` characters of `s`.
pub(super) fn truncate_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// A JSON client for one MLflow tracking server.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    auth_header: Option<String>,
    max_tries: u32,
    backoff: Duration,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("max_tries", &self.max_tries)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for a tracking URI with [`ClientOptions::default`] (no credentials, webpki
    /// roots only); see [`Client::with_options`].
    pub fn new(uri: &str) -> Result<Self, MlflowError> {
        Self::with_options(uri, &ClientOptions::default())
    }

    /// A client for `http://host[:port][/prefix]` or `https://…` (IPv6 hosts in brackets);
    /// request paths are appended to the prefix.
    pub fn with_options(uri: &str, options: &ClientOptions) -> Result<Self, MlflowError> {
        let base = parse_base(uri)?;
        let read = Some(options.read_timeout);
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_resolve(Some(options.connect_timeout))
            .timeout_connect(Some(options.connect_timeout))
            .timeout_send_request(read)
            .timeout_send_body(read)
            .timeout_recv_response(read)
            .timeout_recv_body(read)
            .user_agent(format!("kiln/{}", env!("CARGO_PKG_VERSION")))
            .proxy(if options.env_proxy {
                ureq::Proxy::try_from_env()
            } else {
                None
            })
            .tls_config(tls_config(options)?)
            .build();
        Ok(Self {
            base,
            agent: ureq::Agent::new_with_config(config),
            auth_header: options.auth.header(),
            max_tries: options.max_tries.max(1),
            backoff: options.backoff,
        })
    }

    /// The base URL requests are sent under (`scheme://authority[/prefix]`).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        if path.starts_with('/') {
            format!("{}{path}", self.base)
        } else {
            format!("{}/{path}", self.base)
        }
    }

    /// Send a request (`path` is appended to the base URL, query included, already
    /// percent-encoded) and return the status code and the body: parsed JSON, a JSON string
    /// when the body is not JSON, `null` when it is empty. Connection failures and 5xx
    /// answers are retried; after the last try a 5xx answer is returned like any other.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), MlflowError> {
        let payload = body.map(|b| b.to_string().into_bytes());
        self.call_raw(
            method,
            path,
            payload.as_deref().map(|p| ("application/json", p)),
        )
    }

    /// [`Client::call`] with a body of any content type: `(content type, bytes)`.
    pub fn call_raw(
        &self,
        method: &str,
        path: &str,
        payload: Option<(&str, &[u8])>,
    ) -> Result<(u16, Value), MlflowError> {
        let url = self.url(path);
        let mut tries = 1;
        loop {
            let result = self.send_once(method, &url, payload);
            let transient = match &result {
                Ok((status, _)) => *status >= 500,
                Err(e) => is_transient(e),
            };
            if transient && tries < self.max_tries {
                let wait = self.backoff.saturating_mul(1 << (tries - 1).min(16));
                match &result {
                    Ok((status, _)) => {
                        tracing::debug!("{method} {url}: HTTP {status}; retrying in {wait:?}")
                    }
                    Err(e) => tracing::debug!("{method} {url}: {e}; retrying in {wait:?}"),
                }
                std::thread::sleep(wait);
                tries += 1;
                continue;
            }
            return result.map_err(|error| MlflowError::Transport {
                method: method.to_string(),
                url,
                tries,
                error,
            });
        }
    }

    fn send_once(
        &self,
        method: &str,
        url: &str,
        payload: Option<(&str, &[u8])>,
    ) -> Result<(u16, Value), ureq::Error> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(url)
            .header("accept", "application/json");
        if let Some(auth) = &self.auth_header {
            request = request.header("authorization", auth);
        }
        let mut response = match payload {
            Some((content_type, p)) => self
                .agent
                .run(request.header("content-type", content_type).body(p)?)?,
            None => self.agent.run(request.body(())?)?,
        };
        let status = response.status().as_u16();
        if response.status().is_redirection() {
            let target = response
                .headers()
                .get("location")
                .and_then(|l| l.to_str().ok())
                .unwrap_or("(no Location header)")
                .to_string();
            return Ok((
                status,
                json!({"message": format!(
                    "redirected to {target}; set MLFLOW_TRACKING_URI to the final address"
                )}),
            ));
        }
        let raw = response.body_mut().read_to_vec()?;
        let value = if raw.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(&raw)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&raw).into_owned()))
        };
        Ok((status, value))
    }

    /// A request whose answer must be 2xx.
    pub(super) fn request_ok(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, MlflowError> {
        let (status, v) = self.call(method, path, body)?;
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            Err(status_error(method, self.url(path), status, &v))
        }
    }

    /// A request with a raw body whose answer must be 2xx.
    pub(super) fn request_raw_ok(
        &self,
        method: &str,
        path: &str,
        payload: (&str, &[u8]),
    ) -> Result<Value, MlflowError> {
        let (status, v) = self.call_raw(method, path, Some(payload))?;
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            Err(status_error(method, self.url(path), status, &v))
        }
    }

    pub(super) fn post(&self, path: &str, body: &Value) -> Result<Value, MlflowError> {
        self.request_ok("POST", path, Some(body))
    }

    /// The string at `pointer` in an answer to `method path`.
    pub(super) fn field(
        &self,
        v: &Value,
        pointer: &str,
        expected: &'static str,
        method: &str,
        path: &str,
    ) -> Result<String, MlflowError> {
        v.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| MlflowError::Response {
                method: method.to_string(),
                url: self.url(path),
                expected,
                body: truncate_chars(&v.to_string(), 300).to_string(),
            })
    }

    /// The id of the experiment called `name`, created when it does not exist.
    pub(super) fn experiment_id(&self, name: &str) -> Result<String, MlflowError> {
        let get = format!(
            "/api/2.0/mlflow/experiments/get-by-name?experiment_name={}",
            utf8_percent_encode(name, QUERY_VALUE)
        );
        let found = |v: &Value| {
            self.field(
                v,
                "/experiment/experiment_id",
                "experiment.experiment_id",
                "GET",
                &get,
            )
        };
        let (status, v) = self.call("GET", &get, None)?;
        if (200..300).contains(&status) {
            return found(&v);
        }
        let missing = status == 404 || v["error_code"] == "RESOURCE_DOES_NOT_EXIST";
        if !missing {
            return Err(status_error("GET", self.url(&get), status, &v));
        }
        let create = "/api/2.0/mlflow/experiments/create";
        match self.post(create, &json!({ "name": name })) {
            Ok(v) => self.field(&v, "/experiment_id", "experiment_id", "POST", create),
            // Created by someone else (a parallel sweep run) since the lookup.
            Err(MlflowError::Status {
                error_code: Some(code),
                ..
            }) if code == "RESOURCE_ALREADY_EXISTS" => found(&self.request_ok("GET", &get, None)?),
            Err(e) => Err(e),
        }
    }
}

/// The error for a non-2xx answer, with MLflow's `error_code` and `message` when present.
fn status_error(method: &str, url: String, status: u16, v: &Value) -> MlflowError {
    let error_code = v["error_code"].as_str().map(str::to_string);
    let message = match (&v["message"], v) {
        (Value::String(m), _) => m.clone(),
        (_, Value::Null) => "(empty body)".to_string(),
        (_, Value::String(s)) => truncate_chars(s.trim(), 300).to_string(),
        (_, other) => truncate_chars(&other.to_string(), 300).to_string(),
    };
    MlflowError::Status {
        method: method.to_string(),
        url,
        status,
        error_code,
        message,
    }
}

/// Escape an object key into one param-name segment (see the module docs).
pub(super) fn escape_key(key: &str) -> String {
    if key.is_empty() {
        return ":".into();
    }
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ' ') {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!(":{b:02X}"));
            }
        }
    }
    out
}

/// Flatten a JSON value into `(param name, value)` pairs under `prefix` (an already-flattened
/// name, or `""` at the root), following the mapping of the module docs: `stages[0].epochs`
/// becomes `stages.0.epochs`, `null`s are omitted, values are not truncated here.
pub fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    let join = |segment: &str| {
        if prefix.is_empty() {
            segment.to_string()
        } else {
            format!("{prefix}.{segment}")
        }
    };
    match v {
        Value::Null => {}
        Value::Object(m) => {
            for (k, x) in m {
                flatten(&join(&escape_key(k)), x, out);
            }
        }
        Value::Array(a) if a.iter().any(|x| x.is_object() || x.is_array()) => {
            for (i, x) in a.iter().enumerate() {
                flatten(&join(&i.to_string()), x, out);
            }
        }
        Value::String(s) => out.push((fit_name(prefix), s.clone())),
        other => out.push((fit_name(prefix), other.to_string())),
    }
}

/// A flattened name within MLflow's [`MAX_KEY_LENGTH`]: longer (ASCII) names keep their first
/// `MAX_KEY_LENGTH - 33` characters, then `/` and the first 32 hex digits of the SHA-256 of
/// the whole name (see the module docs).
pub fn fit_name(name: &str) -> String {
    if name.len() <= MAX_KEY_LENGTH {
        return name.to_string();
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(name.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let mut keep = MAX_KEY_LENGTH - 33;
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}/{hex}", &name[..keep])
}

pub(super) fn now_ms() -> i64 {
    (crate::util::unix_now() * 1000.0) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadedConfig;
    use crate::records::{EpochRecord, RunDir, RunEnd};
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    /// One request as a stand-in server saw it.
    #[derive(Debug, Clone)]
    struct Seen {
        method: String,
        path: String,
        headers: Vec<(String, String)>,
        body: Value,
    }

    impl Seen {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        }
    }

    type Log = Arc<Mutex<Vec<Seen>>>;

    /// Read one request (head, then a Content-Length body); `None` on EOF or an I/O error.
    fn read_request(s: &mut impl Read) -> Option<Seen> {
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let n = s.read(&mut tmp).ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&tmp[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let mut first = lines.next()?.split_whitespace();
        let (method, path) = (first.next()?.to_string(), first.next()?.to_string());
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = buf[head_end + 4..].to_vec();
        while body.len() < len {
            let n = s.read(&mut tmp).ok()?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&tmp[..n]);
        }
        Some(Seen {
            method,
            path,
            headers,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        })
    }

    /// A complete JSON response that closes the connection.
    fn response(code: u16, body: &Value) -> Vec<u8> {
        let body = body.to_string();
        format!(
            "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    /// Answers a request (given its index among all requests) with pieces written one by one.
    type Handler = Arc<dyn Fn(&Seen, usize) -> Vec<Vec<u8>> + Send + Sync>;

    fn exchange(s: &mut (impl Read + Write), log: &Log, handler: &Handler) {
        let Some(req) = read_request(s) else { return };
        let n = {
            let mut l = log.lock().unwrap();
            l.push(req.clone());
            l.len() - 1
        };
        for (i, piece) in handler(&req, n).iter().enumerate() {
            if i > 0 {
                // Separate TCP segments, so the client sees the pieces apart.
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = s.write_all(piece);
            let _ = s.flush();
        }
    }

    /// A plain-HTTP stand-in server on `listener`, one request per connection.
    fn serve(
        listener: TcpListener,
        handler: impl Fn(&Seen, usize) -> Vec<Vec<u8>> + Send + Sync + 'static,
    ) -> Log {
        let log: Log = Arc::default();
        let (l2, handler): (Log, Handler) = (Arc::clone(&log), Arc::new(handler));
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                exchange(&mut s, &l2, &handler);
            }
        });
        log
    }

    /// The same over TLS (rustls directly on the std listener).
    fn serve_tls(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
        handler: impl Fn(&Seen, usize) -> Vec<Vec<u8>> + Send + Sync + 'static,
    ) -> Log {
        let log: Log = Arc::default();
        let (l2, handler): (Log, Handler) = (Arc::clone(&log), Arc::new(handler));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(tcp) = stream else { continue };
                let Ok(conn) = rustls::ServerConnection::new(Arc::clone(&config)) else {
                    continue;
                };
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                exchange(&mut tls, &l2, &handler);
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        log
    }

    /// MLflow's answers to the calls the mirror makes.
    fn mlflow_like(req: &Seen, _: usize) -> Vec<Vec<u8>> {
        let (code, reply) = if req.path.contains("get-by-name") {
            (
                404,
                json!({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "No experiment"}),
            )
        } else if req.path.ends_with("experiments/create") {
            (200, json!({"experiment_id": "7"}))
        } else if req.path.ends_with("runs/create") {
            (
                200,
                json!({"run": {"info": {
                    "run_id": "abc123",
                    "artifact_uri": "mlflow-artifacts:/7/abc123/artifacts"
                }}}),
            )
        } else {
            (200, json!({}))
        };
        vec![response(code, &reply)]
    }

    /// A tracking server stand-in on IPv4 loopback: records every request, answers like MLflow.
    fn server() -> (String, Log) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        (uri, serve(listener, mlflow_like))
    }

    /// Short timeouts and backoff, nothing from the environment.
    fn fast() -> ClientOptions {
        ClientOptions {
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(5),
            backoff: Duration::from_millis(10),
            ..ClientOptions::default()
        }
    }

    fn loaded_from(file: &str) -> LoadedConfig {
        let path = format!("{}/../../configs/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let config = crate::config::parse(&text, std::path::Path::new(file)).unwrap();
        LoadedConfig {
            config,
            text,
            path: file.into(),
        }
    }

    fn loaded() -> LoadedConfig {
        loaded_from("tiny.yaml")
    }

    fn epoch(stage: usize, epoch: usize) -> EpochRecord {
        EpochRecord {
            stage,
            stage_name: if stage == 0 { "mean" } else { "variance" }.into(),
            epoch,
            steps: 1,
            train_loss: 1.0,
            val_loss: 0.5,
            lr: 1e-3,
            grad_norm_mean: 0.1,
            grad_norm_max: 0.2,
            clipped_frac: 0.0,
            samples_per_s: 1e5,
            data_wait_frac: 0.1,
            data_wait_s: 0.0,
            compute_s: 0.0,
            validation_s: 0.0,
            phase_s: Default::default(),
        }
    }

    fn options(queue_capacity: usize) -> MirrorOptions {
        MirrorOptions {
            experiment: "kiln tiny".into(),
            parent_run_id: Some("parent1".into()),
            queue_capacity,
            flush_timeout: Duration::from_secs(60),
        }
    }

    fn log_batches<'a>(log: &'a [Seen], field: &str) -> Vec<&'a Vec<Value>> {
        log.iter()
            .filter(|r| r.path.ends_with("log-batch"))
            .filter_map(|r| r.body[field].as_array())
            .filter(|a| !a.is_empty())
            .collect()
    }

    #[test]
    fn mirrors_a_run_through_the_rest_api() {
        let (uri, log) = server();
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path(), "tiny").unwrap();
        std::fs::write(run.config_file(), "name: tiny\n").unwrap();
        let client = Client::with_options(&uri, &fast()).unwrap();
        let m = Mirror::start(client, &options(1024), &run, &loaded()).unwrap();
        assert_eq!(m.run_id().as_deref(), Some("abc123"));
        let stored = MirrorState::read(&run.path).unwrap();
        assert_eq!(stored.run_id, "abc123");
        assert_eq!(stored.experiment_id, "7");
        for e in 0..300 {
            m.log_epoch(&epoch(0, e));
        }
        m.log_epoch(&epoch(1, 0));
        let report = m.finish(
            &run,
            &RunEnd {
                status: kiln_core::records::RunState::Finished,
                val_metric: Some(0.4),
                ..RunEnd::default()
            },
        );
        assert_eq!(report.status.as_deref(), Some("FINISHED"));
        assert_eq!(report.metrics_sent, 301 * 6 + 1, "{report:?}");
        assert!(report.complete(), "{report:?}");
        let log = log.lock().unwrap();
        let paths: Vec<&str> = log.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(
            paths[0],
            "/api/2.0/mlflow/experiments/get-by-name?experiment_name=kiln%20tiny"
        );
        assert_eq!(log[0].method, "GET");
        assert_eq!(paths[1], "/api/2.0/mlflow/experiments/create");
        assert_eq!(log[1].body["name"], "kiln tiny");
        assert_eq!(paths[2], "/api/2.0/mlflow/runs/search");
        assert_eq!(paths[3], "/api/2.0/mlflow/runs/create");
        assert_eq!(log[3].body["experiment_id"], "7");
        assert_eq!(log[3].body["run_name"], run.id.as_str());
        let tags = log[3].body["tags"].as_array().unwrap();
        let tag = |k: &str| {
            tags.iter()
                .find(|t| t["key"] == k)
                .map(|t| t["value"].as_str().unwrap().to_string())
        };
        assert_eq!(tag("mlflow.parentRunId").as_deref(), Some("parent1"));
        assert_eq!(tag("mlflow.source.type").as_deref(), Some("LOCAL"));
        assert_eq!(tag("kiln.run_id").as_deref(), Some(run.id.as_str()));
        assert!(tag("mlflow.user").is_some());
        // Params: the flattened config, at most 100 per request.
        let params = log_batches(&log, "params");
        assert!(!params.is_empty());
        assert!(params.iter().all(|b| b.len() <= MAX_PARAMS_PER_BATCH));
        let all: Vec<&Value> = params.iter().flat_map(|b| b.iter()).collect();
        assert!(
            all.iter()
                .any(|p| p["key"] == "loader.batch_size" && p["value"] == "64")
        );
        assert!(all.iter().any(|p| p["key"] == "stages.0.clip_norm"));
        // Metrics: one request per epoch as it ends, steps continuing across stages (tiny's
        // first stage has 3 epochs), timestamps never decreasing; then the summary.
        let metric_batches = log_batches(&log, "metrics");
        assert_eq!(metric_batches.len(), 302);
        assert!(metric_batches[..301].iter().all(|b| b.len() == 6));
        assert_eq!(metric_batches[300][0]["key"], "variance/train_loss");
        assert_eq!(metric_batches[300][0]["step"], 3);
        assert_eq!(metric_batches[299][0]["step"], 299);
        let stamps: Vec<i64> = metric_batches
            .iter()
            .map(|b| b[0]["timestamp"].as_i64().unwrap())
            .collect();
        assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{stamps:?}");
        assert_eq!(metric_batches[301][0]["key"], "val_metric");
        // The config was uploaded through the proxied artifact store.
        assert!(log.iter().any(|r| r.method == "PUT"
            && r.path == "/api/2.0/mlflow-artifacts/artifacts/7/abc123/artifacts/config.yaml"));
        let last = log.last().unwrap();
        assert_eq!(last.path, "/api/2.0/mlflow/runs/update");
        assert_eq!(last.body["status"], "FINISHED");
        assert_eq!(last.body["run_id"], "abc123");
    }

    #[test]
    fn a_server_failing_mid_run_costs_values_not_the_run() {
        // Fault injection: from the 5th log-batch on, every log-batch answers 500.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let batches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let b2 = Arc::clone(&batches);
        let log = serve(listener, move |req, n| {
            if req.path.ends_with("log-batch")
                && b2.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 4
            {
                return vec![response(500, &json!({"error_code": "INTERNAL_ERROR"}))];
            }
            mlflow_like(req, n)
        });
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path(), "tiny").unwrap();
        let client = Client::with_options(&uri, &fast()).unwrap();
        let m = Mirror::start(client, &options(1024), &run, &loaded()).unwrap();
        for e in 0..10 {
            m.log_epoch(&epoch(0, e));
        }
        let report = m.finish(
            &run,
            &RunEnd {
                status: kiln_core::records::RunState::Failed,
                reason: Some("diverged".into()),
                ..RunEnd::default()
            },
        );
        // 1 params batch + 3 epochs got through; 7 epochs were refused.
        assert_eq!(report.metrics_sent, 3 * 6, "{report:?}");
        assert_eq!(report.metrics_unsent, 7 * 6, "{report:?}");
        assert!(!report.complete());
        assert!(
            report.first_error.as_deref().unwrap().contains("HTTP 500"),
            "{report:?}"
        );
        assert_eq!(report.status.as_deref(), Some("FAILED"));
        let log = log.lock().unwrap();
        assert_eq!(log.last().unwrap().body["status"], "FAILED");
    }

    #[test]
    fn a_full_queue_drops_values_instead_of_blocking_training() {
        // The server holds the first log-batch (the params) until released; meanwhile the
        // queue (1 request) fills and the other epochs are counted, never waited for.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        let log = serve(listener, move |req, n| {
            if req.path.ends_with("log-batch") && !req.body["params"].as_array().unwrap().is_empty()
            {
                let _ = gate.lock().unwrap().recv();
            }
            mlflow_like(req, n)
        });
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path(), "tiny").unwrap();
        let client = Client::with_options(&uri, &fast()).unwrap();
        let m = Mirror::start(client, &options(1), &run, &loaded()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !log
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.path.ends_with("log-batch"))
        {
            assert!(std::time::Instant::now() < deadline, "params never sent");
            std::thread::sleep(Duration::from_millis(5));
        }
        for e in 0..50 {
            m.log_epoch(&epoch(0, e));
        }
        release.send(()).unwrap();
        let report = m.finish(
            &run,
            &RunEnd {
                status: kiln_core::records::RunState::Finished,
                ..RunEnd::default()
            },
        );
        assert_eq!(report.metrics_sent, 6, "{report:?}");
        assert_eq!(report.metrics_unsent, 49 * 6, "{report:?}");
        assert!(
            report
                .first_error
                .as_deref()
                .unwrap()
                .contains("queue was full"),
            "{report:?}"
        );
        // Values are missing, so the MLflow run does not end as if they had arrived.
        assert_eq!(report.status.as_deref(), Some("FAILED"));
    }

    /// A listener that accepts connections and never reads or answers; the number accepted.
    fn silent_server() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let a2 = Arc::clone(&accepted);
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in listener.incoming().flatten() {
                held.push(s);
                a2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        (uri, accepted)
    }

    #[test]
    fn a_server_that_accepts_and_never_answers_never_holds_up_the_run() {
        // Fault injection: the server takes the connection and never answers; the client's
        // read timeout (10 minutes) is far longer than the test, so only the mirror's own
        // design can let the run go on: creating the run happens off the caller's thread,
        // and the end of the run gives up at the flush timeout.
        let (uri, accepted) = silent_server();
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path(), "tiny").unwrap();
        std::fs::write(run.config_file(), "name: tiny\n").unwrap();
        let client = Client::with_options(
            &uri,
            &ClientOptions {
                read_timeout: Duration::from_secs(600),
                ..fast()
            },
        )
        .unwrap();
        let m = Mirror::begin(
            client,
            &MirrorOptions {
                flush_timeout: Duration::from_millis(300),
                ..options(16)
            },
            &run,
            &loaded(),
        );
        // The sender is inside its first request, which the server holds unanswered.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while accepted.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(std::time::Instant::now() < deadline, "no connection made");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(m.state_now().is_none());
        for e in 0..5 {
            m.log_epoch(&epoch(0, e));
        }
        let report = m.finish(
            &run,
            &RunEnd {
                status: kiln_core::records::RunState::Finished,
                val_metric: Some(0.4),
                ..RunEnd::default()
            },
        );
        // finish returned while that request is still unanswered (the read timeout has
        // not passed): it gave up, and says what did not reach the server.
        assert!(report.timed_out, "{report:?}");
        assert_eq!(report.status, None, "{report:?}");
        assert_eq!(report.metrics_sent, 0);
        assert_eq!(report.metrics_unsent, 5 * 6 + 1, "{report:?}");
        assert!(report.artifacts_unsent >= 1, "{report:?}");
        assert!(
            report
                .first_error
                .as_deref()
                .unwrap()
                .contains("flush timeout"),
            "{report:?}"
        );
        assert!(!report.complete());
        assert!(MirrorState::read(&run.path).is_none());
    }

    #[test]
    fn metrics_that_never_arrive_end_the_mlflow_run_failed_and_tagged() {
        // Fault injection: every log-batch that carries metric values answers 500; creating,
        // tagging and updating the run work.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let log = serve(listener, |req, n| {
            let has_metrics = req.body["metrics"]
                .as_array()
                .is_some_and(|m| !m.is_empty());
            if req.path.ends_with("log-batch") && has_metrics {
                return vec![response(
                    500,
                    &json!({"error_code": "INTERNAL_ERROR", "message": "metrics store down"}),
                )];
            }
            mlflow_like(req, n)
        });
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path(), "tiny").unwrap();
        std::fs::write(run.config_file(), "name: tiny\n").unwrap();
        let client = Client::with_options(&uri, &fast()).unwrap();
        let m = Mirror::start(client, &options(64), &run, &loaded()).unwrap();
        for e in 0..5 {
            m.log_epoch(&epoch(0, e));
        }
        let report = m.finish(
            &run,
            &RunEnd {
                status: kiln_core::records::RunState::Finished,
                val_metric: Some(0.4),
                ..RunEnd::default()
            },
        );
        assert_eq!(report.metrics_sent, 0, "{report:?}");
        assert_eq!(report.metrics_unsent, 5 * 6 + 1, "{report:?}");
        assert_eq!(report.other_unsent, 0, "params went through: {report:?}");
        assert!(!report.timed_out);
        // Training finished, but the MLflow run is not marked as if its metrics arrived.
        assert_eq!(report.status.as_deref(), Some("FAILED"), "{report:?}");
        let log = log.lock().unwrap();
        let last = log.last().unwrap();
        assert_eq!(last.path, "/api/2.0/mlflow/runs/update");
        assert_eq!(last.body["status"], "FAILED");
        let incomplete: Vec<&str> = log
            .iter()
            .filter(|r| r.path.ends_with("log-batch"))
            .flat_map(|r| r.body["tags"].as_array().into_iter().flatten())
            .filter(|t| t["key"] == INCOMPLETE_TAG)
            .filter_map(|t| t["value"].as_str())
            .collect();
        assert_eq!(incomplete.len(), 1, "{incomplete:?}");
        assert!(
            incomplete[0].starts_with("31 of 31 metric values,"),
            "{}",
            incomplete[0]
        );
        assert!(
            incomplete[0].contains("metrics store down"),
            "{}",
            incomplete[0]
        );
    }

    #[test]
    fn the_flush_timeout_is_read_in_seconds() {
        assert_eq!(
            mirror::flush_timeout("2.5").unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(mirror::flush_timeout("0").unwrap(), Duration::ZERO);
        for bad in ["-1", "nan", "inf", "soon", "3601"] {
            let e = mirror::flush_timeout(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn an_absent_server_is_an_error_not_a_panic() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path(), "tiny").unwrap();
        let client = Client::with_options(&uri, &fast()).unwrap();
        let err = Mirror::start(client, &options(8), &run, &loaded()).unwrap_err();
        assert!(err.to_string().contains(&uri), "{err}");
        assert!(MirrorState::read(&run.path).is_none());
        let c = Client::new("http://localhost:5000/prefix/").unwrap();
        assert_eq!(c.base_url(), "http://localhost:5000/prefix");
    }

    #[test]
    fn long_names_are_shortened_without_collisions() {
        let a = format!("{}.x", "k".repeat(300));
        let b = format!("{}.y", "k".repeat(300));
        let (fa, fb) = (fit_name(&a), fit_name(&b));
        assert_eq!(fa.len(), MAX_KEY_LENGTH);
        assert_ne!(fa, fb);
        assert!(fa.contains('/'));
        assert_eq!(fit_name("stages.0.epochs"), "stages.0.epochs");
    }

    #[test]
    fn tracking_uris_are_checked() {
        for (uri, base) in [
            (
                "http://localhost:5000/prefix/",
                "http://localhost:5000/prefix",
            ),
            ("https://mlflow.example.com", "https://mlflow.example.com"),
            (
                "HTTPS://mlflow.example.com/a/b",
                "https://mlflow.example.com/a/b",
            ),
            ("http://[::1]:5000", "http://[::1]:5000"),
            ("http://[fe80::1]/mlflow/", "http://[fe80::1]/mlflow"),
        ] {
            assert_eq!(Client::new(uri).unwrap().base_url(), base, "{uri}");
        }
        for (uri, says) in [
            ("ftp://host", "not \"ftp\""),
            ("databricks", "no scheme"),
            ("file:///tmp/mlruns", "not \"file\""),
            ("http://host:99999", "port"),
            ("http://user:pw@host", "MLFLOW_TRACKING_USERNAME"),
            ("http://host/?x=1", "query"),
            ("http://host/#frag", "fragment"),
            ("http://", "URI"),
        ] {
            let e = Client::new(uri).unwrap_err().to_string();
            assert!(e.contains(says), "{uri}: {e}");
            assert!(e.contains("expected http://host"), "{uri}: {e}");
        }
    }

    fn chunk(data: &[u8]) -> Vec<u8> {
        let mut v = format!("{:x}\r\n", data.len()).into_bytes();
        v.extend_from_slice(data);
        v.extend_from_slice(b"\r\n");
        v
    }

    #[test]
    fn a_chunk_boundary_inside_a_utf8_character_is_decoded() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let text = "Zürich ☃ naïve";
        let body = json!({"experiment": {"name": text}}).to_string();
        // Cut inside 'ü' (2 bytes) and inside '☃' (3 bytes).
        let cuts = [body.find('ü').unwrap() + 1, body.find('☃').unwrap() + 2];
        assert!(cuts.iter().all(|&c| !body.is_char_boundary(c)));
        let bytes = body.into_bytes();
        let log = serve(listener, move |_, _| {
            vec![
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec(),
                chunk(&bytes[..cuts[0]]),
                chunk(&bytes[cuts[0]..cuts[1]]),
                chunk(&bytes[cuts[1]..]),
                b"0\r\n\r\n".to_vec(),
            ]
        });
        let client = Client::with_options(&uri, &fast()).unwrap();
        let (status, v) = client.call("GET", "/chunked", None).unwrap();
        assert_eq!(status, 200);
        assert_eq!(v["experiment"]["name"], text);
        assert_eq!(log.lock().unwrap().len(), 1);
    }

    #[test]
    fn https_with_a_self_signed_certificate_trusted_through_the_ca_option() {
        let ck = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ])
        .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![ck.cert.der().clone()], key)
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let uri = format!("https://{addr}/mlflow/");
        let log = serve_tls(listener, Arc::new(config), |_, _| {
            vec![response(
                200,
                &json!({"experiment": {"experiment_id": "42"}}),
            )]
        });

        let trusted = ClientOptions {
            extra_ca_pem: Some(ck.cert.pem().into_bytes()),
            ..fast()
        };
        let client = Client::with_options(&uri, &trusted).unwrap();
        assert_eq!(client.experiment_id("tls ü").unwrap(), "42");
        assert_eq!(
            log.lock().unwrap()[0].path,
            "/mlflow/api/2.0/mlflow/experiments/get-by-name?experiment_name=tls%20%C3%BC"
        );

        // Without the CA the certificate is refused, once: a TLS failure is not retried.
        let untrusted = Client::with_options(&uri, &fast()).unwrap();
        match untrusted.call("GET", "/x", None).unwrap_err() {
            e @ MlflowError::Transport { tries: 1, .. } => {
                assert!(
                    e.to_string().contains(&format!("https://{addr}/mlflow/x")),
                    "{e}"
                )
            }
            e => panic!("expected a TLS failure after one try, got {e}"),
        }
        assert_eq!(log.lock().unwrap().len(), 1);

        // MLFLOW_TRACKING_INSECURE_TLS=true skips verification.
        let insecure = ClientOptions {
            insecure_tls: true,
            ..fast()
        };
        let (status, _) = Client::with_options(&uri, &insecure)
            .unwrap()
            .call("GET", "/x", None)
            .unwrap();
        assert_eq!(status, 200);
    }

    #[test]
    fn an_ipv6_literal_host_works() {
        // IPv6 loopback is part of the platform this runs on; without it the test fails.
        let listener = TcpListener::bind("[::1]:0")
            .unwrap_or_else(|e| panic!("cannot bind the IPv6 loopback [::1]: {e}"));
        let port = listener.local_addr().unwrap().port();
        let log = serve(listener, |_, _| vec![response(200, &json!({"ok": true}))]);
        let client = Client::with_options(&format!("http://[::1]:{port}/prefix"), &fast()).unwrap();
        let v = client
            .post("/api/2.0/mlflow/runs/update", &json!({"a": 1}))
            .unwrap();
        assert_eq!(v["ok"], true);
        let log = log.lock().unwrap();
        assert_eq!(log[0].path, "/prefix/api/2.0/mlflow/runs/update");
        assert_eq!(
            log[0].header("host"),
            Some(format!("[::1]:{port}").as_str())
        );
        assert_eq!(log[0].body, json!({"a": 1}));
    }

    #[test]
    fn a_500_is_retried_and_the_retry_succeeds() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let log = serve(listener, |_, n| {
            if n == 0 {
                vec![response(500, &json!({"error_code": "INTERNAL_ERROR"}))]
            } else {
                vec![response(200, &json!({"ok": true}))]
            }
        });
        let options = ClientOptions {
            auth: Auth::Bearer("tok".into()),
            ..fast()
        };
        let client = Client::with_options(&uri, &options).unwrap();
        let v = client
            .post("/api/2.0/mlflow/runs/update", &json!({"a": 1}))
            .unwrap();
        assert_eq!(v["ok"], true);
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 2);
        for r in log.iter() {
            assert_eq!(r.body, json!({"a": 1}));
            assert_eq!(r.header("authorization"), Some("Bearer tok"));
            assert_eq!(r.header("content-type"), Some("application/json"));
        }
    }

    #[test]
    fn a_persistent_5xx_gives_up_after_max_tries() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let log = serve(listener, |_, _| vec![response(503, &json!({}))]);
        let options = ClientOptions {
            auth: Auth::Basic {
                username: "u".into(),
                password: "p".into(),
            },
            ..fast()
        };
        let client = Client::with_options(&uri, &options).unwrap();
        let e = client.post("/api/x", &json!({})).unwrap_err();
        assert!(matches!(e, MlflowError::Status { status: 503, .. }), "{e}");
        let log = log.lock().unwrap();
        assert_eq!(log.len(), DEFAULT_MAX_TRIES as usize);
        assert_eq!(log[0].header("authorization"), Some("Basic dTpw"));
    }

    #[test]
    fn a_refused_connection_names_the_uri() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}/mlflow", listener.local_addr().unwrap());
        drop(listener);
        let client = Client::with_options(&uri, &fast()).unwrap();
        let e = client.call("GET", "/api/x", None).unwrap_err();
        assert!(matches!(e, MlflowError::Transport { tries: 3, .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("{uri}/api/x")), "{msg}");
        assert!(msg.contains("after 3 tries"), "{msg}");
    }

    #[test]
    fn a_400_is_not_retried_and_its_mlflow_message_is_surfaced() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let log = serve(listener, |_, _| {
            vec![response(
                400,
                &json!({
                    "error_code": "INVALID_PARAMETER_VALUE",
                    "message": "Missing value for required parameter 'experiment_id'."
                }),
            )]
        });
        let client = Client::with_options(&uri, &fast()).unwrap();
        let e = client
            .post("/api/2.0/mlflow/runs/create", &json!({}))
            .unwrap_err();
        match &e {
            MlflowError::Status {
                status, error_code, ..
            } => {
                assert_eq!(*status, 400);
                assert_eq!(error_code.as_deref(), Some("INVALID_PARAMETER_VALUE"));
            }
            other => panic!("expected an HTTP status error, got {other}"),
        }
        let msg = e.to_string();
        assert!(msg.contains("INVALID_PARAMETER_VALUE"), "{msg}");
        assert!(
            msg.contains("Missing value for required parameter"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("{uri}/api/2.0/mlflow/runs/create")),
            "{msg}"
        );
        assert_eq!(log.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_redirect_is_reported_not_followed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let log = serve(listener, |_, _| {
            vec![b"HTTP/1.1 308 Permanent Redirect\r\nLocation: https://elsewhere.example/x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()]
        });
        let client = Client::with_options(&uri, &fast()).unwrap();
        let e = client.post("/x", &json!({})).unwrap_err().to_string();
        assert!(
            e.contains("308") && e.contains("https://elsewhere.example/x"),
            "{e}"
        );
        assert_eq!(log.lock().unwrap().len(), 1);
    }

    #[test]
    fn an_existing_experiment_is_reused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let log = serve(listener, |_, _| {
            vec![response(
                200,
                &json!({"experiment": {"experiment_id": "3"}}),
            )]
        });
        let client = Client::with_options(&uri, &fast()).unwrap();
        assert_eq!(client.experiment_id("a/b c").unwrap(), "3");
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 1);
        assert!(
            log[0].path.ends_with("experiment_name=a%2Fb%20c"),
            "{}",
            log[0].path
        );
    }

    #[test]
    fn a_promoted_version_is_registered_with_its_source_tags_and_alias() {
        use model_registry::{Registration, register};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        // The registered model exists already; the version is 4.
        let log = serve(listener, |req, _| {
            vec![match req.path.as_str() {
                "/api/2.0/mlflow/registered-models/create" => response(
                    400,
                    &json!({"error_code": "RESOURCE_ALREADY_EXISTS", "message": "exists"}),
                ),
                "/api/2.0/mlflow/model-versions/create" => {
                    response(200, &json!({"model_version": {"version": "4"}}))
                }
                _ => response(200, &json!({})),
            }]
        });
        let client = Client::with_options(&uri, &fast()).unwrap();
        let dir = std::path::Path::new("/models/baseball/7");
        let mut r = Registration {
            name: "baseball",
            repository_path: dir,
            repository_version: 7,
            checkpoint_sha256: "abc123",
            kiln_run_id: "baseball-1",
            mlflow_run_id: Some("f00d"),
            alias: "champion",
        };
        let got = register(&client, &r).unwrap();
        assert_eq!(
            (
                got.version.as_str(),
                got.source.as_str(),
                got.alias.as_str()
            ),
            ("4", "runs:/f00d/export", "champion")
        );
        {
            let log = log.lock().unwrap();
            let paths: Vec<&str> = log.iter().map(|s| s.path.as_str()).collect();
            assert_eq!(
                paths,
                [
                    "/api/2.0/mlflow/registered-models/create",
                    "/api/2.0/mlflow/model-versions/create",
                    "/api/2.0/mlflow/registered-models/alias"
                ]
            );
            let v = &log[1].body;
            assert_eq!(v["name"], "baseball");
            assert_eq!(v["source"], "runs:/f00d/export");
            assert_eq!(v["run_id"], "f00d");
            let tags: HashMap<&str, &str> = v["tags"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| (t["key"].as_str().unwrap(), t["value"].as_str().unwrap()))
                .collect();
            assert_eq!(tags["kiln.repository_path"], "/models/baseball/7");
            assert_eq!(tags["kiln.repository_version"], "7");
            assert_eq!(tags["kiln.checkpoint_sha256"], "abc123");
            assert_eq!(tags["kiln.run_id"], "baseball-1");
            assert_eq!(tags["kiln.version"], env!("CARGO_PKG_VERSION"));
            assert_eq!(
                log[2].body,
                json!({"name": "baseball", "alias": "champion", "version": "4"})
            );
        }
        // Without a mirrored run: no run_id, the repository path as the source.
        r.mlflow_run_id = None;
        let got = register(&client, &r).unwrap();
        assert_eq!(got.source, "kiln-repository:/models/baseball/7");
        let log = log.lock().unwrap();
        assert!(log[4].body.get("run_id").is_none(), "{}", log[4].body);
    }

    #[test]
    fn a_registry_failure_is_an_error_naming_the_call() {
        use model_registry::{Registration, register};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let _log = serve(listener, |_, _| {
            vec![response(
                403,
                &json!({"error_code": "PERMISSION_DENIED", "message": "no"}),
            )]
        });
        let client = Client::with_options(&uri, &fast()).unwrap();
        let r = Registration {
            name: "m",
            repository_path: std::path::Path::new("/r/m/1"),
            repository_version: 1,
            checkpoint_sha256: "x",
            kiln_run_id: "k",
            mlflow_run_id: None,
            alias: "champion",
        };
        let e = register(&client, &r).unwrap_err().to_string();
        assert!(
            e.contains("registered-models/create") && e.contains("PERMISSION_DENIED"),
            "{e}"
        );
    }

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn options_from_the_environment() {
        let o = ClientOptions::from_lookup(lookup(&[])).unwrap();
        assert_eq!(
            o,
            ClientOptions {
                env_proxy: true,
                ..ClientOptions::default()
            }
        );

        let o = ClientOptions::from_lookup(lookup(&[(TOKEN, "t0k")])).unwrap();
        assert_eq!(o.auth, Auth::Bearer("t0k".into()));
        assert!(!format!("{o:?}").contains("t0k"));

        // Basic auth wins over the token, as in MLflow; empty values are unset.
        let o = ClientOptions::from_lookup(lookup(&[
            (USERNAME, "ann"),
            (PASSWORD, "secret"),
            (TOKEN, "t0k"),
            (INSECURE, ""),
        ]))
        .unwrap();
        assert_eq!(
            o.auth,
            Auth::Basic {
                username: "ann".into(),
                password: "secret".into()
            }
        );
        assert!(!format!("{o:?}").contains("secret"));
        assert!(!o.insecure_tls);

        let e = ClientOptions::from_lookup(lookup(&[(USERNAME, "ann")])).unwrap_err();
        assert!(e.to_string().contains(PASSWORD), "{e}");
        let e = ClientOptions::from_lookup(lookup(&[(PASSWORD, "secret")])).unwrap_err();
        assert!(
            e.to_string().contains(USERNAME) && !e.to_string().contains("secret"),
            "{e}"
        );

        for (v, want) in [
            ("true", true),
            ("TRUE", true),
            ("1", true),
            ("false", false),
        ] {
            let o = ClientOptions::from_lookup(lookup(&[(INSECURE, v)])).unwrap();
            assert_eq!(o.insecure_tls, want, "{v}");
        }
        let e = ClientOptions::from_lookup(lookup(&[(INSECURE, "yes")])).unwrap_err();
        assert!(e.to_string().contains("expected true or false"), "{e}");

        let o = ClientOptions::from_lookup(lookup(&[(TIMEOUT, "30"), (MAX_RETRIES, "0")])).unwrap();
        assert_eq!(o.read_timeout, Duration::from_secs(30));
        assert_eq!(o.max_tries, 1);
        for (var, bad) in [(TIMEOUT, "0"), (TIMEOUT, "1.5"), (MAX_RETRIES, "11")] {
            let e = ClientOptions::from_lookup(lookup(&[(var, bad)])).unwrap_err();
            assert!(e.to_string().starts_with(var), "{e}");
        }
    }

    #[test]
    fn the_ca_bundle_is_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let pem = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
            .unwrap()
            .cert
            .pem();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, &pem).unwrap();
        let path = good.to_str().unwrap();
        let o = ClientOptions::from_lookup(lookup(&[(CERT_PATH, path)])).unwrap();
        assert_eq!(o.extra_ca_pem.as_deref(), Some(pem.as_bytes()));
        assert!(Client::with_options("https://localhost", &o).is_ok());

        let e = ClientOptions::from_lookup(lookup(&[(CERT_PATH, path), (INSECURE, "true")]))
            .unwrap_err();
        assert!(e.to_string().contains(CERT_PATH), "{e}");

        let missing = dir.path().join("missing.pem");
        let e = ClientOptions::from_lookup(lookup(&[(CERT_PATH, missing.to_str().unwrap())]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("missing.pem") && e.contains("cannot read"),
            "{e}"
        );

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = ClientOptions::from_lookup(lookup(&[(CERT_PATH, empty.to_str().unwrap())]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("empty.pem") && e.contains("no certificate"),
            "{e}"
        );

        let injected = ClientOptions {
            extra_ca_pem: Some(b"junk".to_vec()),
            ..ClientOptions::default()
        };
        let e = Client::with_options("https://localhost", &injected).unwrap_err();
        assert!(e.to_string().contains("extra_ca_pem"), "{e}");
    }

    fn flat(v: &Value) -> Vec<(String, String)> {
        let mut out = Vec::new();
        flatten("", v, &mut out);
        out
    }

    #[test]
    fn flattening_follows_the_documented_mapping() {
        let v = json!({
            "stages": [{"clip_norm": 1.0, "name": "mean"}, {"clip_norm": null}],
            "model": {"hidden": [48, 48]},
            "export": {"engine": null},
            "odd": {"a.b": 1, "a": {"b": 2}, "a:2Eb": 3, "": 4, "x/y é": 5, "0": 6},
        });
        let got = flat(&v);
        let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        let expect = [
            ("stages.0.clip_norm", "1.0"),
            ("stages.0.name", "mean"),
            ("model.hidden", "[48,48]"),
            ("odd.a:2Eb", "1"),
            ("odd.a.b", "2"),
            ("odd.a:3A2Eb", "3"),
            ("odd.:", "4"),
            ("odd.x:2Fy :C3:A9", "5"),
            ("odd.0", "6"),
        ];
        for (k, v) in expect {
            assert!(
                got.contains(&(k.to_string(), v.to_string())),
                "{k}: {got:?}"
            );
        }
        // Nulls are omitted; every key is distinct.
        assert_eq!(got.len(), expect.len(), "{got:?}");
        assert!(
            !keys
                .iter()
                .any(|k| k.contains("engine") || k.starts_with("stages.1"))
        );
    }

    #[test]
    fn every_param_name_of_a_full_config_is_one_mlflow_accepts() {
        for file in ["baseball.yaml", "tiny.yaml"] {
            let v = serde_json::to_value(&loaded_from(file).config).unwrap();
            let params = flat(&v);
            assert!(params.len() > 20, "{file}: {params:?}");
            let mut keys: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
            for k in &keys {
                assert!(
                    !k.is_empty()
                        && k.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "_-. :/".contains(c)),
                    "{file}: {k:?} has a character MLflow rejects"
                );
            }
            let n = keys.len();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), n, "{file}: duplicate param names");
        }
        let v = serde_json::to_value(&loaded_from("baseball.yaml").config).unwrap();
        let params = flat(&v);
        assert!(params.iter().any(|(k, _)| k == "stages.0.clip_norm"));
        assert!(params.iter().any(|(k, _)| k == "stages.1.optimizer.lr"));
    }

    #[test]
    fn long_values_are_truncated_by_characters() {
        let long = "é".repeat(MAX_PARAM_VALUE + 5);
        let t = truncate_chars(&long, MAX_PARAM_VALUE);
        assert_eq!(t.chars().count(), MAX_PARAM_VALUE);
        assert_eq!(truncate_chars("short", MAX_PARAM_VALUE), "short");
    }
}
