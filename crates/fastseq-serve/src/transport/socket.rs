//! A connection's socket as hyper reads and writes it, with what hyper does not do: an answer
//! that the client does not read within the body timeout ends the connection (so an unread
//! answer's bytes go back to the memory budget), and the socket stays reachable after hyper
//! is done with it, to say 408 to a client whose headers did not arrive in time.
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use std::os::fd::AsRawFd;

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// The socket, shared with the connection's task.
pub struct Socket {
    stream: Arc<TcpStream>,
    write_timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
    refusals: Option<Arc<Refusals>>,
}

/// What an HTTP/1.1 connection says in place of hyper's own answers to a request it could
/// not parse (headers over their limits, a request line that is no HTTP/1.1, HTTP/2 spoken
/// to this port): hyper writes them with an empty body; the protocol answers every failure
/// with its JSON error. The status said, once said, for the connection to count and log.
#[derive(Debug)]
pub struct Refusals {
    pub headers_too_large: String,
    pub said: std::sync::atomic::AtomicU16,
}

impl Refusals {
    pub fn new(max_header_bytes: usize, max_headers: usize) -> Refusals {
        Refusals {
            headers_too_large: format!(
                "the request's headers are over the limit of {max_header_bytes} bytes or {max_headers} headers"
            ),
            said: std::sync::atomic::AtomicU16::new(0),
        }
    }

    /// Our answer in place of `data`, where it is hyper's answer to a request it could not parse.
    fn answer(&self, data: &[u8]) -> Option<Vec<u8>> {
        if data.len() > 1024 || !data.starts_with(b"HTTP/1.1 ") || !data.ends_with(b"\r\n\r\n") {
            return None;
        }
        let head = data.to_ascii_lowercase();
        memchr::memmem::find(&head, b"\r\ncontent-length: 0\r\n")?;
        let (status, reason, message) = match &data[9..12] {
            b"431" => (431, "Request Header Fields Too Large", self.headers_too_large.as_str()),
            b"414" => (414, "URI Too Long", "the request's path is over the limit of the request's headers"),
            b"505" => {
                (400, "Bad Request", "this port speaks HTTP/1.1: KServe v2 over HTTP/2 is gRPC, on the gRPC port")
            }
            b"400" => (400, "Bad Request", "the request is not valid HTTP/1.1"),
            _ => return None,
        };
        self.said.store(status, std::sync::atomic::Ordering::Relaxed);
        let body = crate::protocol::error_json(message);
        let mut out = format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(&body);
        Some(out)
    }
}

impl Socket {
    pub fn new(stream: Arc<TcpStream>, write_timeout: Duration) -> Socket {
        Socket { stream, write_timeout, stalled: None, refusals: None }
    }

    /// An HTTP/1.1 connection's socket, whose hyper answers to unparsable requests are said
    /// as the protocol says failures ([`Refusals`]).
    pub fn http1(stream: Arc<TcpStream>, write_timeout: Duration, refusals: Arc<Refusals>) -> Socket {
        Socket { stream, write_timeout, stalled: None, refusals: Some(refusals) }
    }

    /// Writes `ours` in place of hyper's `len` bytes (best effort: a fresh answer on a socket
    /// whose buffer is empty), and tells hyper they were written.
    fn replace(&mut self, cx: &mut Context<'_>, ours: &[u8], len: usize) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.poll_room(cx))?;
            match self.stream.try_write(ours) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
                Ok(_) => return Poll::Ready(Ok(len)),
            }
        }
    }

    /// Polls for room to write; an error once the client has read nothing for the timeout.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream.poll_write_ready(cx) {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let timeout = self.write_timeout;
                let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                ready!(stalled.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client did not read its answer")))
            }
        }
    }
}

use std::future::Future;

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            // SAFETY: only read(2) writes through it, and only initialised bytes are marked so.
            let unfilled = unsafe { buf.unfilled_mut() };
            let fd = self.stream.as_raw_fd();
            // read(2) into the buffer's unfilled part as it is: hyper hands a fresh, uninitialised
            // view each time, and zeroing it first (ReadBuf::initialize_unfilled) cost a memset
            // of the whole buffer a read.
            let read = self.stream.try_io(Interest::READABLE, || {
                // SAFETY: the pointer and length are the unfilled part of `buf`, which read(2)
                // writes at most `len` bytes into.
                let n = unsafe { libc::read(fd, unfilled.as_mut_ptr().cast(), unfilled.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match read {
                Ok(n) => {
                    // SAFETY: read(2) initialised the first n bytes of the unfilled part.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if let Some(ours) = me.refusals.as_ref().and_then(|r| r.answer(data)) {
            return me.replace(cx, &ours, data.len());
        }
        loop {
            ready!(me.poll_room(cx))?;
            match me.stream.try_write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if let [one] = bufs {
            if let Some(ours) = me.refusals.as_ref().and_then(|r| r.answer(one)) {
                return me.replace(cx, &ours, one.len());
            }
        }
        loop {
            ready!(me.poll_room(cx))?;
            match me.stream.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The socket closes when its last owner drops it; a half-close is not needed to end an answer.
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_own_failures_are_said_with_the_protocols_error() {
        let r = Refusals::new(16384, 64);
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let ours = String::from_utf8(r.answer(hyper).unwrap()).unwrap();
        assert!(
            ours.starts_with("HTTP/1.1 431 ")
                && ours
                    .ends_with("{\"error\":\"the request's headers are over the limit of 16384 bytes or 64 headers\"}"),
            "{ours}"
        );
        assert_eq!(r.said.load(std::sync::atomic::Ordering::Relaxed), 431);
        let h2 = b"HTTP/1.1 505 HTTP Version Not Supported\r\ncontent-length: 0\r\n\r\n";
        assert!(String::from_utf8(r.answer(h2).unwrap()).unwrap().starts_with("HTTP/1.1 400 "));
        // our own answers are left alone: a 503 of the health route, any answer with a body
        assert!(r.answer(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(r.answer(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n").is_none());
    }
}
