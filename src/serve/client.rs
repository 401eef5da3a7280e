//! A small HTTP/1.1 client over one keep-alive TCP connection — enough for the load
//! generator and the tests, with no client-library dependency. It speaks to loopback
//! addresses only (see [`loopback_addr`]).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

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

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        let n = self
            .header(super::protocol::HEADER_LENGTH)
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.body.len());
        serde_json::from_slice(&self.body[..n.min(self.body.len())])
            .unwrap_or(serde_json::Value::Null)
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
pub fn loopback_addr(host: &str, port: u16) -> Result<SocketAddr, String> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = match h.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) if h.eq_ignore_ascii_case("localhost") => (h, port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {h}: {e}"))?
            .collect(),
        Err(_) => {
            return Err(format!(
                "host `{host}` is not a loopback address; the load generator only targets 127.0.0.0/8, ::1 or localhost"
            ));
        }
    };
    match addrs.iter().find(|a| !a.ip().is_loopback()) {
        Some(a) => Err(format!(
            "host `{host}` ({}) is not a loopback address; the load generator only targets 127.0.0.0/8, ::1 or localhost",
            a.ip()
        )),
        None => addrs
            .into_iter()
            .next()
            .ok_or_else(|| format!("{host} resolves to no address")),
    }
}

impl BaseUrl {
    /// Parse `http://host[:port][/prefix]` (loopback hosts only).
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("URL `{url}` must start with http://"))?;
        let (hostport, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, p) = h
                .split_once(']')
                .ok_or_else(|| format!("URL `{url}`: unclosed [ in host"))?;
            (h.to_string(), p.strip_prefix(':').unwrap_or("80"))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p),
                None => (hostport.to_string(), "80"),
            }
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("URL `{url}`: port `{port}` is not a number"))?;
        let addr = loopback_addr(&host, port)?;
        Ok(Self {
            host,
            addr,
            prefix: prefix.to_string(),
        })
    }
}

/// One keep-alive connection, reopened after errors.
pub struct HttpClient {
    addr: SocketAddr,
    host: String,
    conn: Option<BufReader<TcpStream>>,
    timeout: Duration,
}

impl HttpClient {
    /// A client for a loopback address.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            host: addr.to_string(),
            conn: None,
            timeout: Duration::from_secs(30),
        }
    }

    /// Per-request timeout (default 30 s).
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// GET a path.
    pub async fn get(&mut self, path: &str) -> std::io::Result<HttpResponse> {
        self.request("GET", path, &[], &[]).await
    }

    /// POST a JSON body.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: &serde_json::Value,
    ) -> std::io::Result<HttpResponse> {
        let b = serde_json::to_vec(body).expect("JSON serialises");
        self.request("POST", path, &[("Content-Type", "application/json")], &b)
            .await
    }

    /// Send a request and read the response, within the timeout.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<HttpResponse> {
        match tokio::time::timeout(
            self.timeout,
            self.request_inner(method, path, headers, body),
        )
        .await
        {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                self.conn = None;
                Err(e)
            }
            Err(_) => {
                self.conn = None;
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "request timed out",
                ))
            }
        }
    }

    async fn request_inner(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<HttpResponse> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.host,
            body.len()
        );
        for (k, v) in headers {
            head.push_str(k);
            head.push_str(": ");
            head.push_str(v);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        let mut msg = head.into_bytes();
        msg.extend_from_slice(body);
        // A reused connection may have been closed by the server: retry once on a fresh one.
        let reused = self.conn.is_some();
        match self.exchange(&msg).await {
            Ok(r) => Ok(r),
            Err(_) if reused => {
                self.conn = None;
                self.exchange(&msg).await
            }
            Err(e) => Err(e),
        }
    }

    async fn exchange(&mut self, msg: &[u8]) -> std::io::Result<HttpResponse> {
        if self.conn.is_none() {
            let s = TcpStream::connect(self.addr).await?;
            s.set_nodelay(true)?;
            self.conn = Some(BufReader::new(s));
        }
        let conn = self.conn.as_mut().expect("connected");
        conn.get_mut().write_all(msg).await?;
        let r = read_response(conn).await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }
}

fn bad(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

async fn read_response(conn: &mut BufReader<TcpStream>) -> std::io::Result<HttpResponse> {
    let mut line = String::new();
    if conn.read_line(&mut line).await? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if conn.read_line(&mut line).await? == 0 {
            return Err(bad("connection closed in headers"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if let Some(n) = get("content-length") {
        let n: usize = n.parse().map_err(|_| bad("bad content-length"))?;
        body.resize(n, 0);
        conn.read_exact(&mut body).await?;
    } else if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            line.clear();
            conn.read_line(&mut line).await?;
            let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| bad("bad chunk size"))?;
            let mut chunk = vec![0; n + 2];
            conn.read_exact(&mut chunk).await?;
            body.extend_from_slice(&chunk[..n]);
            if n == 0 {
                break;
            }
        }
    } else if status != 204 && status != 304 {
        conn.read_to_end(&mut body).await?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_urls_are_accepted() {
        assert!(BaseUrl::parse("http://127.0.0.1:8000").is_ok());
        assert!(BaseUrl::parse("http://[::1]:8000/").is_ok());
        assert!(BaseUrl::parse("http://localhost:9").is_ok());
        let e = BaseUrl::parse("http://10.0.0.1:8000").unwrap_err();
        assert!(e.contains("not a loopback"), "{e}");
        let e = BaseUrl::parse("http://example.com:80").unwrap_err();
        assert!(e.contains("not a loopback"), "{e}");
        assert!(BaseUrl::parse("https://127.0.0.1").is_err());
    }
}
