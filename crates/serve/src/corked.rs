//! Corked HTTP/2 connections: every frame one poll of a connection produces leaves in one write.
//!
//! h2 (under hyper's server and as a client) writes a DATA frame of 256 bytes or more from the
//! message's own buffer and must flush before it encodes the next frame. So a gRPC answer of a
//! few hundred bytes or more went out as two writes — its headers and data, then its trailers
//! — and a request of that size as two as well (headers, then data): two TCP segments, two
//! wake-ups of the peer, two passes through its event loop, per call.
//!
//! [`cork`] splits a socket into a [`CorkedStream`] for the connection (reads as the socket;
//! writes, vectored or not, appended to an outbox, and `flush` a no-op) and an [`Outbox`]
//! handle for [`Corked`], the future that polls the connection and writes the outbox once after
//! every poll. Nothing waits longer than the poll that produced it; the frames of all the
//! streams answered by then share one write. Past [`OUTBOX_HIGH_WATER`] buffered bytes a write
//! waits for the socket (backpressure as before); a failed socket write fails every later
//! write and flush of the connection; a shutdown writes what is buffered first.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Past this many buffered bytes a write waits for the socket.
pub const OUTBOX_HIGH_WATER: usize = 256 * 1024;

/// Split `stream` into the connection's side and the outbox [`Corked`] writes.
pub fn cork(stream: TcpStream) -> (CorkedStream, Arc<Outbox>) {
    let (read, write) = stream.into_split();
    let out = Arc::new(Outbox(Mutex::new(OutState {
        write,
        buf: Vec::new(),
        sent: 0,
        failed: None,
    })));
    (
        CorkedStream {
            read,
            out: out.clone(),
        },
        out,
    )
}

/// The connection's side of a corked socket: reads from the socket, writes into the outbox.
pub struct CorkedStream {
    read: OwnedReadHalf,
    out: Arc<Outbox>,
}

/// A corked socket's writing side: the bytes the connection wrote and the socket has not.
pub struct Outbox(Mutex<OutState>);

struct OutState {
    write: OwnedWriteHalf,
    buf: Vec<u8>,
    /// How much of `buf` the socket has taken.
    sent: usize,
    /// The socket's write error, once it failed (every later write fails with it).
    failed: Option<(std::io::ErrorKind, String)>,
}

impl OutState {
    fn error(&self) -> Option<std::io::Error> {
        self.failed
            .as_ref()
            .map(|(kind, msg)| std::io::Error::new(*kind, msg.clone()))
    }
}

impl Outbox {
    fn lock(&self) -> MutexGuard<'_, OutState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes buffered and not yet written.
    pub fn pending(&self) -> usize {
        let o = self.lock();
        o.buf.len() - o.sent
    }

    /// Write everything buffered: `Ready(Ok)` once the outbox is empty, `Pending` (the task is
    /// woken when the socket can take more) while the socket is full.
    pub fn poll_drain(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let mut o = self.lock();
        if let Some(e) = o.error() {
            return Poll::Ready(Err(e));
        }
        let OutState {
            write,
            buf,
            sent,
            failed,
        } = &mut *o;
        while *sent < buf.len() {
            let e = match Pin::new(&mut *write).poll_write(cx, &buf[*sent..]) {
                Poll::Ready(Ok(0)) => std::io::Error::from(std::io::ErrorKind::WriteZero),
                Poll::Ready(Ok(n)) => {
                    *sent += n;
                    continue;
                }
                Poll::Ready(Err(e)) => e,
                Poll::Pending => return Poll::Pending,
            };
            *failed = Some((e.kind(), e.to_string()));
            return Poll::Ready(Err(e));
        }
        buf.clear();
        *sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Buffer `bufs` (all of them, after waiting for room past the high-water mark).
    fn poll_buffer(
        &self,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let mut o = self.lock();
        if o.buf.len() >= OUTBOX_HIGH_WATER {
            drop(o);
            ready!(self.poll_drain(cx))?;
            o = self.lock();
        }
        if let Some(e) = o.error() {
            return Poll::Ready(Err(e));
        }
        let mut n = 0;
        for b in bufs {
            o.buf.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }
}

impl AsyncRead for CorkedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().read).poll_read(cx, buf)
    }
}

impl AsyncWrite for CorkedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.out.poll_buffer(cx, &[std::io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.out.poll_buffer(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Buffered bytes are written by [`Corked`] when the poll that wrote them ends.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.out.lock().error() {
            Some(e) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(())),
        }
    }

    /// Write what is buffered, then shut the writing side down.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        ready!(self.out.poll_drain(cx))?;
        Pin::new(&mut self.out.lock().write).poll_shutdown(cx)
    }
}

/// A connection's future that writes its socket's outbox after every poll. Once the connection
/// is done, it finishes only after the outbox has been written (or the socket failed). Write
/// errors surface through the connection's next write or flush.
pub struct Corked<C: Future> {
    conn: Pin<Box<C>>,
    out: Arc<Outbox>,
    done: Option<C::Output>,
}

impl<C: Future> Corked<C> {
    /// Poll `conn`, writing `out` (from [`cork`] of its socket) after every poll.
    pub fn new(conn: C, out: Arc<Outbox>) -> Self {
        Self {
            conn: Box::pin(conn),
            out,
            done: None,
        }
    }

    /// The connection (e.g. to start its graceful shutdown).
    pub fn conn(&mut self) -> Pin<&mut C> {
        self.conn.as_mut()
    }
}

impl<C: Future> Future for Corked<C>
where
    C::Output: Unpin,
{
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let me = self.get_mut();
        if me.done.is_none()
            && let Poll::Ready(r) = me.conn.as_mut().poll(cx)
        {
            me.done = Some(r);
        }
        let drained = me.out.poll_drain(cx);
        match me.done.take() {
            Some(r) if drained.is_ready() => Poll::Ready(r),
            d => {
                me.done = d;
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Corked, CorkedStream, OUTBOX_HIGH_WATER, Outbox, cork};
    use std::io::IoSlice;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::Poll;
    use tokio::io::{AsyncReadExt, AsyncWrite};
    use tokio::net::{TcpListener, TcpStream};

    /// A connected loopback pair: one side corked (and its outbox), the other plain.
    async fn pair() -> (CorkedStream, Arc<Outbox>, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), l.accept());
        let (g, out) = cork(accepted.unwrap().0);
        (g, out, client.unwrap())
    }

    #[tokio::test]
    async fn one_polls_writes_leave_in_one_write_when_the_poll_ends() {
        let (mut g, out, mut client) = pair().await;
        let peer = &client;
        let conn = std::future::poll_fn(|cx| {
            // h2's pattern for an answer over 256 bytes: headers and data, flush, trailers,
            // flush.
            for part in [&b"headers+data"[..], b"trailers"] {
                let n = Pin::new(&mut g).poll_write_vectored(cx, &[IoSlice::new(part)]);
                assert!(matches!(n, Poll::Ready(Ok(k)) if k == part.len()));
                assert!(Pin::new(&mut g).poll_flush(cx).is_ready());
            }
            // Nothing has reached the peer while the poll runs.
            let mut b = [0u8; 64];
            let e = peer.try_read(&mut b).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
            Poll::Ready(7)
        });
        assert_eq!(Corked::new(conn, out).await, 7);
        let mut got = [0u8; 20];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"headers+datatrailers");
    }

    #[tokio::test]
    async fn a_full_socket_holds_writes_back_and_every_byte_arrives_in_order() {
        let (mut g, out, mut client) = pair().await;
        const TOTAL: usize = 32 << 20;
        let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 16];
            let mut n = 0usize;
            loop {
                let k = client.read(&mut buf).await.unwrap();
                if k == 0 {
                    break;
                }
                for (j, &b) in buf[..k].iter().enumerate() {
                    assert_eq!(b, ((n + j) % (64 * 1024) % 251) as u8, "byte {}", n + j);
                }
                n += k;
            }
            n
        });
        let (mut written, mut waits) = (0usize, 0usize);
        let watched = out.clone();
        let conn = std::future::poll_fn(|cx| {
            while written < TOTAL {
                match Pin::new(&mut g).poll_write(cx, &chunk) {
                    Poll::Ready(Ok(k)) => written += k,
                    Poll::Ready(Err(e)) => panic!("{e}"),
                    Poll::Pending => {
                        waits += 1;
                        return Poll::Pending;
                    }
                }
                // The outbox never grows far past its high-water mark.
                assert!(watched.pending() < OUTBOX_HIGH_WATER + chunk.len());
            }
            match Pin::new(&mut g).poll_shutdown(cx) {
                Poll::Ready(r) => Poll::Ready(r.map(|()| written)),
                Poll::Pending => Poll::Pending,
            }
        });
        let sent = Corked::new(conn, out).await.unwrap();
        assert_eq!(sent, TOTAL);
        assert!(waits > 0, "32 MiB never filled the loopback socket");
        assert_eq!(reader.await.unwrap(), TOTAL);
    }

    #[tokio::test]
    async fn a_write_error_reaches_the_connections_next_write() {
        let (mut g, out, client) = pair().await;
        drop(client);
        let out2 = out.clone();
        let conn = std::future::poll_fn(|cx| {
            // Keep writing until the reset peer's error comes back through a write or flush.
            for _ in 0..1000 {
                if let Poll::Ready(Err(_)) = Pin::new(&mut g).poll_write(cx, &[0u8; 4096]) {
                    return Poll::Ready(true);
                }
                if let Poll::Ready(Err(_)) = Pin::new(&mut g).poll_flush(cx) {
                    return Poll::Ready(true);
                }
                // Let Corked write the outbox (and meet the error) between polls.
                if out.lock().failed.is_none() {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
            Poll::Ready(false)
        });
        let failed =
            tokio::time::timeout(std::time::Duration::from_secs(10), Corked::new(conn, out2))
                .await
                .expect("the error surfaced");
        assert!(failed);
    }
}
