//! A small HTTP/1.1 client for the load generator and the tests, built on hyper's
//! connection-pooling client (`hyper_util::client::legacy::Client` over an
//! [`HttpConnector`]): keep-alive connections, chunked and length-delimited bodies, a
//! per-request timeout. It speaks to loopback addresses only (see [`loopback_addr`]).
//!
//! [`HttpClient`] is async; [`BlockingClient`] wraps it in a current-thread runtime for
//! synchronous callers.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A URL or host the client refuses.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// Not an `http://` URL.
    #[error("URL `{0}` must start with http://")]
    Scheme(String),
    /// `[` without `]`.
    #[error("URL `{0}`: unclosed [ in host")]
    UnclosedBracket(String),
    /// The port does not parse.
    #[error("URL `{url}`: port `{port}` is not a number")]
    Port {
        /// The URL.
        url: String,
        /// The port as written.
        port: String,
    },
    /// A host outside 127.0.0.0/8, ::1 and localhost.
    #[error(
        "host `{host}`{} is not a loopback address; the load generator only targets 127.0.0.0/8, ::1 or localhost",
        .ip.map(|ip| format!(" ({ip})")).unwrap_or_default()
    )]
    NotLoopback {
        /// The host as written.
        host: String,
        /// The address it resolved to, when it was a name.
        ip: Option<IpAddr>,
    },
    /// `localhost` did not resolve.
    #[error("cannot resolve {host}")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The host resolved to nothing.
    #[error("{0} resolves to no address")]
    NoAddress(String),
}

/// A request that got no (complete) response.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The method, a header or the path is not valid HTTP.
    #[error("{method} {url}: cannot build the request")]
    InvalidRequest {
        /// The method.
        method: String,
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: hyper::http::Error,
    },
    /// No connection could be opened.
    #[error("{method} {url}: cannot connect to {addr}")]
    Connect {
        /// The method.
        method: String,
        /// The URL.
        url: String,
        /// The server's address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: Box<hyper_util::client::legacy::Error>,
    },
    /// Sending the request or reading the response head failed.
    #[error("{method} {url}: the exchange with {addr} failed")]
    Request {
        /// The method.
        method: String,
        /// The URL.
        url: String,
        /// The server's address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: Box<hyper_util::client::legacy::Error>,
    },
    /// Reading the response body failed.
    #[error("{method} {url}: reading the response body from {addr} failed")]
    Body {
        /// The method.
        method: String,
        /// The URL.
        url: String,
        /// The server's address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: hyper::Error,
    },
    /// No complete response within the timeout.
    #[error("{method} {url}: no complete response from {addr} within {timeout:?}")]
    Timeout {
        /// The method.
        method: String,
        /// The URL.
        url: String,
        /// The server's address.
        addr: SocketAddr,
        /// The timeout.
        timeout: Duration,
    },
    /// The blocking client could not start its runtime.
    #[error("cannot start the blocking HTTP client's runtime")]
    Runtime(#[source] std::io::Error),
}

impl ClientError {
    /// Whether the request ran out of time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ClientError::Timeout { .. })
    }
}

/// A response.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON part of the body (all of it, unless `Inference-Header-Content-Length` says
    /// less).
    fn json_part(&self) -> &[u8] {
        let n = self
            .header(kiln_serve::protocol::HEADER_LENGTH)
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.body.len());
        &self.body[..n.min(self.body.len())]
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(self.json_part()).unwrap_or(serde_json::Value::Null)
    }

    /// The body read into one of the server's records (`kiln_serve::records`: metadata, the
    /// model configuration, statistics), or why it is not one.
    pub fn record<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(self.json_part())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A parsed `http://host:port/prefix` URL.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseUrl {
    /// The host as written.
    pub host: String,
    /// The resolved loopback address.
    pub addr: SocketAddr,
    /// Path prefix without a trailing slash.
    pub prefix: String,
}

/// Resolve `host:port` and insist that every address is loopback.
pub fn loopback_addr(host: &str, port: u16) -> Result<SocketAddr, UrlError> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = match h.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) if h.eq_ignore_ascii_case("localhost") => (h, port)
            .to_socket_addrs()
            .map_err(|source| UrlError::Resolve {
                host: h.to_string(),
                source,
            })?
            .collect(),
        Err(_) => {
            return Err(UrlError::NotLoopback {
                host: host.to_string(),
                ip: None,
            });
        }
    };
    match addrs.iter().find(|a| !a.ip().is_loopback()) {
        Some(a) => Err(UrlError::NotLoopback {
            host: host.to_string(),
            ip: Some(a.ip()),
        }),
        None => addrs
            .into_iter()
            .next()
            .ok_or_else(|| UrlError::NoAddress(host.to_string())),
    }
}

impl BaseUrl {
    /// Parse `http://host[:port][/prefix]` (loopback hosts only).
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| UrlError::Scheme(url.to_string()))?;
        let (hostport, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, p) = h
                .split_once(']')
                .ok_or_else(|| UrlError::UnclosedBracket(url.to_string()))?;
            (h.to_string(), p.strip_prefix(':').unwrap_or("80"))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p),
                None => (hostport.to_string(), "80"),
            }
        };
        let port: u16 = port.parse().map_err(|_| UrlError::Port {
            url: url.to_string(),
            port: port.to_string(),
        })?;
        let addr = loopback_addr(&host, port)?;
        Ok(Self {
            host,
            addr,
            prefix: prefix.to_string(),
        })
    }
}

/// An async client for one server address. Connections are kept alive and reused; with one
/// request at a time (the load generator's model) it holds a single connection, reopened
/// when the server closes it.
#[derive(Clone)]
pub struct HttpClient {
    addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("addr", &self.addr)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// A client for a loopback address (default timeout 30 s).
    pub fn new(addr: SocketAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Self {
            addr,
            client,
            timeout: Duration::from_secs(30),
        }
    }

    /// Per-request timeout: connecting, sending and reading the whole response.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// GET a path.
    pub async fn get(&mut self, path: &str) -> Result<HttpResponse, ClientError> {
        self.request("GET", path, &[], &[]).await
    }

    /// POST a JSON body.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<HttpResponse, ClientError> {
        let b = serde_json::to_vec(body).expect("a JSON value serialises");
        self.request("POST", path, &[("Content-Type", "application/json")], &b)
            .await
    }

    /// Send a request (`path` starts with `/`) and read the whole response, within the
    /// timeout.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<HttpResponse, ClientError> {
        let url = format!("http://{}{path}", self.addr);
        let mut req = hyper::Request::builder().method(method).uri(&url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(|source| ClientError::InvalidRequest {
                method: method.to_string(),
                url: url.clone(),
                source,
            })?;
        let addr = self.addr;
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|source| {
                if source.is_connect() {
                    ClientError::Connect {
                        method: method.to_string(),
                        url: url.clone(),
                        addr,
                        source: Box::new(source),
                    }
                } else {
                    ClientError::Request {
                        method: method.to_string(),
                        url: url.clone(),
                        addr,
                        source: Box::new(source),
                    }
                }
            })?;
            let (head, body) = resp.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|source| ClientError::Body {
                    method: method.to_string(),
                    url: url.clone(),
                    addr,
                    source,
                })?
                .to_bytes();
            Ok(HttpResponse {
                status: head.status.as_u16(),
                headers: head
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_string(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect(),
                body: body.to_vec(),
            })
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout {
                method: method.to_string(),
                url,
                addr,
                timeout: self.timeout,
            }),
        }
    }
}

/// A synchronous [`HttpClient`] on its own current-thread runtime. Do not call it from
/// inside an async runtime (tokio refuses to block there).
#[derive(Debug)]
pub struct BlockingClient {
    runtime: tokio::runtime::Runtime,
    inner: HttpClient,
}

impl BlockingClient {
    /// A client for a loopback address (default timeout 30 s).
    pub fn new(addr: SocketAddr) -> Result<Self, ClientError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ClientError::Runtime)?;
        Ok(Self {
            runtime,
            inner: HttpClient::new(addr),
        })
    }

    /// Per-request timeout: connecting, sending and reading the whole response.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.inner = self.inner.with_timeout(t);
        self
    }

    /// GET a path.
    pub fn get(&mut self, path: &str) -> Result<HttpResponse, ClientError> {
        self.runtime.block_on(self.inner.get(path))
    }

    /// POST a JSON body.
    pub fn post_json(
        &mut self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<HttpResponse, ClientError> {
        self.runtime.block_on(self.inner.post_json(path, body))
    }

    /// Send a request and read the whole response, within the timeout.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<HttpResponse, ClientError> {
        self.runtime
            .block_on(self.inner.request(method, path, headers, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn only_loopback_urls_are_accepted() {
        assert!(BaseUrl::parse("http://127.0.0.1:8000").is_ok());
        assert!(BaseUrl::parse("http://[::1]:8000/").is_ok());
        assert!(BaseUrl::parse("http://localhost:9").is_ok());
        let e = BaseUrl::parse("http://10.0.0.1:8000")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`10.0.0.1`") && e.contains("not a loopback"),
            "{e}"
        );
        let e = BaseUrl::parse("http://example.com:80")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a loopback"), "{e}");
        let e = BaseUrl::parse("https://127.0.0.1").unwrap_err().to_string();
        assert!(e.contains("must start with http://"), "{e}");
        let e = BaseUrl::parse("http://127.0.0.1:x/")
            .unwrap_err()
            .to_string();
        assert!(e.contains("port `x`"), "{e}");
        let u = BaseUrl::parse("http://127.0.0.1:8000/kiln/").unwrap();
        assert_eq!((u.addr.port(), u.prefix.as_str()), (8000, "/kiln"));
    }

    /// How the test server answers.
    #[derive(Clone, Copy)]
    enum Reply {
        /// A chunked body (two chunks, one with an extension) naming the request.
        Chunked,
        /// A length-delimited body naming the request.
        Length,
        /// Nothing: read the request and hold the connection open.
        Silent,
    }

    /// A raw HTTP/1.1 server on a std thread (so async and blocking clients can both use
    /// it): every connection is kept alive and counted.
    fn server(reply: Reply) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(AtomicUsize::new(0));
        let n = conns.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { return };
                n.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || serve_connection(s, reply));
            }
        });
        (addr, conns)
    }

    fn serve_connection(s: TcpStream, reply: Reply) {
        let mut out = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let target = line.split(' ').nth(1).unwrap_or("").to_string();
            let method = line.split(' ').next().unwrap_or("").to_string();
            let mut length = 0;
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 {
                    return;
                }
                if h.trim_end().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    length = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            r.read_exact(&mut body).unwrap();
            let text = format!("{method} {target} {}", String::from_utf8_lossy(&body));
            let msg = match reply {
                Reply::Chunked => {
                    let (a, b) = text.split_at(text.len() / 2);
                    format!(
                        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Test: yes\r\n\r\n\
                         {:x}\r\n{a}\r\n{:x};ext=1\r\n{b}\r\n0\r\n\r\n",
                        a.len(),
                        b.len()
                    )
                }
                Reply::Length => format!(
                    "HTTP/1.1 201 Created\r\nContent-Length: {}\r\n\r\n{text}",
                    text.len()
                ),
                Reply::Silent => {
                    // Hold the connection until the client goes away.
                    let _ = r.read_line(&mut String::new());
                    return;
                }
            };
            if out.write_all(msg.as_bytes()).is_err() {
                return;
            }
        }
    }

    #[tokio::test]
    async fn reads_a_chunked_response() {
        let (addr, _) = server(Reply::Chunked);
        let mut c = HttpClient::new(addr);
        let r = c
            .post_json("/v2/echo", &serde_json::json!({"a": 1}))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "POST /v2/echo {\"a\":1}");
        assert_eq!(r.header("x-test"), Some("yes"));
        assert_eq!(r.header("Transfer-Encoding"), Some("chunked"));
    }

    #[tokio::test]
    async fn reuses_one_keep_alive_connection() {
        for reply in [Reply::Length, Reply::Chunked] {
            let (addr, conns) = server(reply);
            let mut c = HttpClient::new(addr);
            for i in 0..5 {
                let r = c
                    .request("PUT", &format!("/r/{i}"), &[("X-A", "b")], b"xyz")
                    .await
                    .unwrap();
                assert_eq!(r.text(), format!("PUT /r/{i} xyz"));
            }
            assert_eq!(conns.load(Ordering::SeqCst), 1, "connections opened");
        }
    }

    #[tokio::test]
    async fn a_timeout_names_the_address() {
        let (addr, _) = server(Reply::Silent);
        let mut c = HttpClient::new(addr).with_timeout(Duration::from_millis(200));
        let t0 = std::time::Instant::now();
        let e = c.get("/slow").await.unwrap_err();
        assert!(t0.elapsed() >= Duration::from_millis(200));
        assert!(e.is_timeout(), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains(&addr.to_string()) && msg.contains("/slow") && msg.contains("200ms"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_address() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = HttpClient::new(addr).get("/").await.unwrap_err();
        assert!(matches!(e, ClientError::Connect { .. }), "{e:?}");
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }

    #[test]
    fn the_blocking_client_keeps_its_connection() {
        let (addr, conns) = server(Reply::Chunked);
        let mut c = BlockingClient::new(addr)
            .unwrap()
            .with_timeout(Duration::from_secs(10));
        for _ in 0..3 {
            assert_eq!(c.get("/b").unwrap().text(), "GET /b ");
        }
        assert_eq!(conns.load(Ordering::SeqCst), 1);
        let e = c.request("BAD METHOD", "/", &[], &[]).unwrap_err();
        assert!(matches!(e, ClientError::InvalidRequest { .. }), "{e:?}");
    }
}
