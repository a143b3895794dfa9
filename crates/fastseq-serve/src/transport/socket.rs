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
}

impl Socket {
    pub fn new(stream: Arc<TcpStream>, write_timeout: Duration) -> Socket {
        Socket { stream, write_timeout, stalled: None }
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
        loop {
            ready!(me.poll_room(cx))?;
            match me.stream.try_write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
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
