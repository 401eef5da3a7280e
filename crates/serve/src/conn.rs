//! The connection layer: the accept loop, per-connection HTTP/1.1 on hyper, and the limits
//! that keep slow or malformed clients from holding the server.
//!
//! * **Header timeout** — a request head (request line and headers) must arrive within
//!   [`ConnectionConfig::header_timeout`] of the moment the server starts reading it; the
//!   same clock runs while a keep-alive connection sits idle between requests. A client that
//!   trickles its headers (slow loris) or goes quiet is disconnected.
//! * **Body timeout** — a request body must be complete within
//!   [`ConnectionConfig::body_timeout`] of its head; a handler reading a body that stalls gets
//!   [`BodyTimeout`] and answers 408.
//! * **Connection cap** — at most [`ConnectionConfig::max_connections`] connections are
//!   served at once; one more is answered `503 {"error": ...}` and closed.
//! * **Well-formed errors** — hyper answers requests it cannot parse (a bad request line,
//!   a duplicate or invalid `Content-Length`, a URL over 65,534 bytes, too many or too large
//!   headers) itself, before any handler runs, with an empty body: hyper 1.x
//!   (`proto/h1/role.rs`, `Server::on_error`; `proto/h1/conn.rs`, `on_parse_error`) writes the
//!   bare status line and `content-length: 0` and offers no hook to change it. [`ConnIo`],
//!   the socket wrapper, recognises exactly that response — the last bytes of a write, status
//!   4xx, no header but `content-length: 0`, `connection: close` and `date` (every response
//!   kiln's handlers write carries a `content-type`) — and sends the same status with a
//!   `{"error": ...}` body instead. It then drains what the client still sends for a moment
//!   before closing, so that the answer is not lost to a TCP reset.
//! * `TCP_NODELAY` on every accepted socket.
//!
//! Shutdown: when the shutdown future resolves, the connections already waiting in the
//! listen backlog are accepted, then the listener is closed, and every connection is told to
//! finish the request in flight and close (hyper's graceful shutdown); [`serve`] returns once
//! all have closed. A connection that is between requests but has request bytes waiting
//! (unread in the socket, or read but not yet parsed into a request) is not closed as idle:
//! it is driven until that request has started, and the request is answered (see
//! [`Drain`]). The timeouts bound how long that can take.

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn StdError + Send + Sync>;

/// The longest URL hyper can represent (the `http` crate's limit); longer ones get 414.
pub const MAX_URI_BYTES: usize = 65_534;

/// Largest request head (request line and headers) hyper buffers; larger heads get 431.
pub const MAX_HEAD_BYTES: usize = 400 * 1024;

/// Limits of the connection layer (the `--header-timeout-ms`, `--body-timeout-ms`,
/// `--max-connections` and `--max-headers` flags of `kiln serve`).
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectionConfig {
    /// Time allowed for a request's head to arrive, counted from when the server starts
    /// reading it (for a keep-alive connection: from the end of the previous response).
    pub header_timeout: Duration,
    /// Time allowed for a request's body to arrive, counted from its head.
    pub body_timeout: Duration,
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Most header fields in a request; more are answered 431.
    pub max_headers: usize,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            max_connections: 4096,
            max_headers: 100,
        }
    }
}

impl ConnectionConfig {
    /// Checks the ranges; the message names the flag.
    pub fn validate(&self) -> Result<(), crate::error::ServeError> {
        self.check().map_err(crate::error::ServeError::Config)
    }

    fn check(&self) -> Result<(), String> {
        if self.header_timeout.is_zero() {
            return Err("--header-timeout-ms must be at least 1".into());
        }
        if self.body_timeout.is_zero() {
            return Err("--body-timeout-ms must be at least 1".into());
        }
        if self.max_connections == 0 || self.max_connections > 1 << 20 {
            return Err(format!(
                "--max-connections is {}; expected 1 to {}",
                self.max_connections,
                1 << 20
            ));
        }
        if self.max_headers == 0 || self.max_headers > 10_000 {
            return Err(format!(
                "--max-headers is {}; expected 1 to 10000",
                self.max_headers
            ));
        }
        Ok(())
    }
}

/// A request body that did not arrive within the body timeout.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error(
    "the request body was not complete within {} ms of its headers (--body-timeout-ms)",
    limit.as_millis()
)]
pub struct BodyTimeout {
    /// The limit that passed.
    pub limit: Duration,
}

/// Whether `e` or one of its sources is a [`BodyTimeout`].
pub fn is_body_timeout(mut e: &(dyn StdError + 'static)) -> bool {
    loop {
        if e.is::<BodyTimeout>() {
            return true;
        }
        match e.source() {
            Some(s) => e = s,
            None => return false,
        }
    }
}

/// A body that fails with [`BodyTimeout`] once its deadline passes. The timer is armed only
/// when the body is actually waited for, so a body that is already buffered costs nothing.
pub struct DeadlineBody<B> {
    inner: B,
    deadline: Instant,
    limit: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    expired: bool,
}

impl<B> DeadlineBody<B> {
    /// `inner`, to be complete within `limit` from now.
    pub fn new(inner: B, limit: Duration) -> Self {
        Self {
            inner,
            deadline: Instant::now() + limit,
            limit,
            sleep: None,
            expired: false,
        }
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout { limit: this.limit }))));
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        ready!(sleep.as_mut().poll(cx));
        this.expired = true;
        Poll::Ready(Some(Err(Box::new(BodyTimeout { limit: this.limit }))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The client's address, in every request's extensions (the control endpoints answer only
/// loopback clients unless a token is set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// What the drain needs to know about one connection: requests started on it, and request
/// bytes read since its last write (bytes of a request hyper has not answered yet).
#[derive(Debug, Default)]
struct Drain {
    started: AtomicU64,
    unanswered_input: AtomicU64,
}

impl Drain {
    /// Whether the connection holds the beginning of a request that has not started: bytes
    /// read since the last answer, or bytes waiting in the socket (`fd`).
    fn has_input(&self, fd: Option<i32>) -> bool {
        self.unanswered_input.load(AtomicOrdering::Acquire) > 0 || fd.is_some_and(socket_has_input)
    }
}

/// Whether bytes are waiting to be read on socket `fd` (without reading them).
#[cfg(unix)]
fn socket_has_input(fd: i32) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: `fd` is the open socket of a connection this task still owns; MSG_PEEK leaves
    // the byte in the socket and MSG_DONTWAIT never blocks.
    let n = unsafe {
        libc::recv(
            fd,
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}

#[cfg(not(unix))]
fn socket_has_input(_: i32) -> bool {
    false
}

/// The hyper service: the router, with each request's body under the body timeout.
#[derive(Clone)]
struct App {
    router: TowerToHyperService<Router>,
    body_timeout: Duration,
    peer: Option<std::net::SocketAddr>,
    drain: Arc<Drain>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for App {
    type Response = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<DeadlineBody<Incoming>>,
    >>::Response;
    type Error = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<DeadlineBody<Incoming>>,
    >>::Error;
    type Future = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<DeadlineBody<Incoming>>,
    >>::Future;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        self.drain.started.fetch_add(1, AtomicOrdering::AcqRel);
        let t = self.body_timeout;
        let mut req = req.map(|b| DeadlineBody::new(b, t));
        if let Some(p) = self.peer {
            req.extensions_mut().insert(PeerAddr(p));
        }
        self.router.call(req)
    }
}

/// The text of the JSON error that replaces one of hyper's empty automatic answers.
fn auto_error_message(status: u16, limits: &Limits) -> String {
    match status {
        400 => "malformed HTTP request: the request line, a header, or the body framing \
                (Content-Length, Transfer-Encoding) could not be parsed as HTTP/1.1"
            .into(),
        414 => format!("the URL is too long: at most {MAX_URI_BYTES} bytes are accepted"),
        431 => format!(
            "request header fields too large: at most {} header fields and {} bytes of \
             request line and headers are accepted (--max-headers)",
            limits.max_headers, MAX_HEAD_BYTES
        ),
        s => format!("the request could not be parsed as HTTP/1.1 (status {s})"),
    }
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    max_headers: usize,
}

/// Where one of hyper's automatic error answers starts in `buf`, with its status and its
/// `date` header line: the answer must end the buffer, have status 4xx, and carry no header
/// but `content-length: 0`, `connection: close` and `date`.
fn find_auto_error(buf: &[u8]) -> Option<(usize, u16, Option<&[u8]>)> {
    if !buf.ends_with(b"\r\n\r\n") {
        return None;
    }
    // Such a head is short; look only at the tail.
    let from = buf.len().saturating_sub(256);
    let tail = &buf[from..];
    let start = tail
        .windows(10)
        .rposition(|w| w == b"HTTP/1.1 4" || w == b"HTTP/1.0 4")?;
    let head = &tail[start..];
    let mut lines = head[..head.len() - 4].split(|&b| b == b'\n');
    let status_line = lines.next()?.strip_suffix(b"\r")?;
    let code = status_line.get(9..12)?;
    if !code.iter().all(u8::is_ascii_digit) || status_line.get(12).is_some_and(|&b| b != b' ') {
        return None;
    }
    let status: u16 = std::str::from_utf8(code).ok()?.parse().ok()?;
    let (mut zero_length, mut date) = (false, None);
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let lower = line.to_ascii_lowercase();
        if lower == b"content-length: 0" {
            zero_length = true;
        } else if lower == b"connection: close" {
        } else if lower.starts_with(b"date: ") && line.len() < 64 {
            date = Some(line);
        } else {
            return None;
        }
    }
    zero_length.then_some((from + start, status, date))
}

/// The answer that replaces an automatic one: the same status, a JSON body, and
/// `connection: close` (hyper closes the connection after it).
fn json_error_response(status: u16, date: Option<&[u8]>, message: &str) -> Vec<u8> {
    let body = serde_json::json!({ "error": message }).to_string();
    let reason = axum::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    )
    .into_bytes();
    if let Some(d) = date {
        out.extend_from_slice(d);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.as_bytes());
    out
}

/// How long a connection that was refused or answered an automatic error keeps reading
/// (and discarding) what the client still sends, so that closing it does not reset the
/// answer away.
const LINGER: Duration = Duration::from_millis(500);
/// At most this much is read while lingering.
const LINGER_BYTES: usize = 1 << 20;

/// The socket as hyper sees it: passes everything through, but replaces hyper's empty
/// automatic error answers with JSON ones (see the module docs). Reports no vectored writes
/// so that hyper hands over each response (head and body) as one flat buffer.
pub struct ConnIo {
    stream: Option<TcpStream>,
    /// Bytes of a replaced answer not yet written.
    pending: Vec<u8>,
    written: usize,
    /// An automatic answer was replaced: linger on drop.
    replaced: bool,
    limits: Limits,
    drain: Arc<Drain>,
}

impl ConnIo {
    fn new(stream: TcpStream, limits: Limits, drain: Arc<Drain>) -> Self {
        Self {
            stream: Some(stream),
            pending: Vec::new(),
            written: 0,
            replaced: false,
            limits,
            drain,
        }
    }

    fn stream(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.stream.as_mut().expect("stream present until drop"))
    }

    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let (stream, pending, written) = (
                self.stream.as_mut().expect("stream present until drop"),
                &self.pending,
                self.written,
            );
            let n = ready!(Pin::new(stream).poll_write(cx, &pending[written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        if !self.pending.is_empty() {
            self.pending = Vec::new();
            self.written = 0;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for ConnIo {
    fn drop(&mut self) {
        if !self.replaced {
            return;
        }
        if let (Some(stream), Ok(rt)) = (self.stream.take(), tokio::runtime::Handle::try_current())
        {
            rt.spawn(linger(stream));
        }
    }
}

/// Read and discard what the peer still sends, for at most [`LINGER`], then close.
async fn linger(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let mut buf = vec![0u8; 16 * 1024];
    let mut total = 0;
    let _ = tokio::time::timeout(LINGER, async {
        while total < LINGER_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    })
    .await;
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = self.stream().poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.drain
                .unanswered_input
                .fetch_add(n as u64, AtomicOrdering::AcqRel);
        }
        r
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_drain(cx))?;
        this.drain
            .unanswered_input
            .store(0, AtomicOrdering::Release);
        if let Some((start, status, date)) = find_auto_error(buf) {
            let message = auto_error_message(status, &this.limits);
            let mut out = buf[..start].to_vec();
            out.extend_from_slice(&json_error_response(status, date, &message));
            tracing::debug!(
                status,
                "replaced hyper's automatic answer with a JSON error"
            );
            this.pending = out;
            this.written = 0;
            this.replaced = true;
            // The bytes are ours now; flush or shutdown writes what is left.
            return match this.poll_drain(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Ready(Ok(buf.len())),
            };
        }
        this.stream().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        if self.replaced {
            // `linger` shuts the write side down once the client's input is drained.
            return Poll::Ready(Ok(()));
        }
        self.stream().poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// Answer a connection over the cap with 503 and close it.
async fn refuse(mut stream: TcpStream, max: usize) {
    let resp = json_error_response(
        503,
        None,
        &format!(
            "the server is serving its maximum of {max} connections (--max-connections); \
             retry later"
        ),
    );
    let _ = tokio::time::timeout(LINGER, stream.write_all(&resp)).await;
    linger(stream).await;
}

/// Whether an accept error concerns only that one connection.
pub(super) fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Serve `router` on `listener` until `shutdown` resolves, then drain (see the module docs).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    config: ConnectionConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .max_headers(config.max_headers)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let app = App {
        router: TowerToHyperService::new(router),
        body_timeout: config.body_timeout,
        peer: None,
        drain: Arc::default(),
    };
    let limits = Limits {
        max_headers: config.max_headers,
    };
    let slots = Arc::new(Semaphore::new(config.max_connections));
    // Every connection task holds a receiver; the drain waits until all are gone.
    let (closed_tx, closed_rx) = watch::channel(());
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    let mut listener = Some(listener);
    // At the stop: the listener as a plain non-blocking socket, to take what its backlog
    // still holds (clients that connected before the stop may have sent a request already).
    let mut backlog: Option<std::net::TcpListener> = None;
    let stopping = |b: &Option<std::net::TcpListener>| b.is_some();
    loop {
        let accepted = match (&backlog, &listener) {
            (Some(b), _) => match b.accept() {
                Ok((s, peer)) => s
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(s))
                    .map(|s| (s, peer)),
                Err(_) => break,
            },
            (None, Some(l)) => tokio::select! {
                biased;
                _ = &mut shutdown => {
                    match listener.take().map(TcpListener::into_std) {
                        Some(Ok(std_listener)) => backlog = Some(std_listener),
                        _ => break,
                    }
                    continue;
                }
                r = l.accept() => r,
            },
            (None, None) => break,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) if is_connection_error(&e) => continue,
            Err(_) if stopping(&backlog) => break,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, config.max_connections));
            continue;
        };
        let drain = Arc::new(Drain::default());
        #[cfg(unix)]
        let fd = Some(std::os::fd::AsRawFd::as_raw_fd(&stream));
        #[cfg(not(unix))]
        let fd: Option<i32> = None;
        let mut conn_app = app.clone();
        conn_app.peer = Some(peer);
        conn_app.drain = drain.clone();
        let conn = http.serve_connection(
            TokioIo::new(ConnIo::new(stream, limits, drain.clone())),
            conn_app,
        );
        let mut stop = stop_rx.clone();
        let closed = closed_rx.clone();
        let grace = config.header_timeout;
        tokio::spawn(async move {
            tokio::pin!(conn);
            let stopping = async move {
                let _ = stop.wait_for(|v| *v).await;
            };
            let r = tokio::select! {
                r = conn.as_mut() => Some(r),
                _ = stopping => None,
            };
            let r = match r {
                Some(r) => r,
                None => {
                    // A request whose bytes are here (or on their way through hyper) is
                    // answered: drive the connection until it has started, then shut down
                    // gracefully (hyper then finishes it). Bounded by the header timeout.
                    let started = drain.started.load(AtomicOrdering::Acquire);
                    let until = Instant::now() + grace;
                    let mut done = None;
                    while done.is_none()
                        && drain.started.load(AtomicOrdering::Acquire) == started
                        && drain.has_input(fd)
                        && Instant::now() < until
                    {
                        tokio::select! {
                            r = conn.as_mut() => done = Some(r),
                            _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                        }
                    }
                    match done {
                        Some(r) => r,
                        None => {
                            conn.as_mut().graceful_shutdown();
                            conn.await
                        }
                    }
                }
            };
            if let Err(e) = r {
                tracing::debug!("connection closed: {e}");
            }
            drop(permit);
            drop(closed);
        });
    }
    drop(listener);
    drop(backlog);
    let _ = stop_tx.send(true);
    drop(closed_rx);
    closed_tx.closed().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_only_hypers_automatic_answers() {
        let auto = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\n\r\n";
        let (start, status, date) = find_auto_error(auto).unwrap();
        assert_eq!((start, status), (0, 400));
        assert_eq!(date, Some(&b"date: Tue, 01 Dec 2026 10:00:00 GMT"[..]));
        // After a pipelined answer in the same buffer.
        let mut two =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
                .to_vec();
        let at = two.len();
        two.extend_from_slice(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n",
        );
        assert_eq!(find_auto_error(&two).map(|x| (x.0, x.1)), Some((at, 431)));
        // Not: a handler's answer (it has a content type), a 2xx, a body after the head.
        for other in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nx",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 10\r\n\r\n",
        ] {
            assert!(find_auto_error(other).is_none(), "{}", String::from_utf8_lossy(other));
        }
        let r = json_error_response(414, None, "too long");
        let text = String::from_utf8(r).unwrap();
        assert!(text.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{text}");
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(body).unwrap()["error"],
            "too long"
        );
    }

    #[test]
    fn limits_are_validated_with_the_flag_named() {
        assert!(ConnectionConfig::default().validate().is_ok());
        let e = ConnectionConfig {
            header_timeout: Duration::ZERO,
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("--header-timeout-ms"), "{e}");
        let e = ConnectionConfig {
            max_connections: 0,
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("--max-connections"), "{e}");
    }
}
