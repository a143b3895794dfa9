//! An answer's body: its parts in order (a JSON header and binary tensors, say: sent without
//! being copied into one buffer), then gRPC's trailers where it has them. The request's
//! account of the memory budget rides on its last part, so its bytes are counted until hyper
//! has written that part to the socket and let it go, not merely until hyper took it; and
//! the connection's [`Unread`] knows since when, so that an answer left unread past the write
//! timeout ends its connection (HTTP/2's flow control can hold an answer without ever
//! trying the socket, so a write that stalls is not enough to see it).
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame, SizeHint};

use crate::batching::Held;

/// The most bytes a body hands hyper at once. HTTP/1's connection copies what it is handed
/// into its write buffer (it flattens, for pipelining) and asks for more only once that has
/// drained: handed whole, an answer would leave the budget's count (its last part let go) and
/// live on uncounted as hyper's copy; handed in slices of this size, no copy, at most this
/// much is out of the count, and the rest stays with the answer until the client reads it.
pub const CHUNK: usize = 64 << 10;

pub struct Answer {
    parts: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    size: u64,
}

/// A connection's counted answers not yet written, each with when it was ready; and whether
/// it closes with a request body left unread (refused before it was read: then the rest is
/// read and dropped before the socket closes, so that the client, still sending, reads its
/// answer rather than a reset).
#[derive(Debug, Default)]
pub struct Unread {
    next: AtomicU64,
    ready: Mutex<BTreeMap<u64, Instant>>,
    pub linger: std::sync::atomic::AtomicBool,
}

impl Unread {
    fn add(self: &Arc<Self>) -> Ticket {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Instant::now());
        Ticket { unread: self.clone(), id }
    }

    /// When the oldest answer not yet written was ready.
    pub fn oldest(&self) -> Option<Instant> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).values().min().copied()
    }

    /// Returns once an answer has gone unwritten for `timeout` (checked a few times a timeout).
    pub async fn stalled(&self, timeout: Duration) {
        let tick = (timeout / 8).clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            tokio::time::sleep(tick).await;
            if self.oldest().is_some_and(|t| t.elapsed() >= timeout) {
                return;
            }
        }
    }
}

struct Ticket {
    unread: Arc<Unread>,
    id: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.unread.ready.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

struct Counted {
    data: Bytes,
    _held: Held,
    _ticket: Option<Ticket>,
}

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Answer {
    pub fn new(parts: Vec<Bytes>) -> Answer {
        let size = parts.iter().map(|b| b.len() as u64).sum();
        Answer { parts: parts.into_iter().filter(|b| !b.is_empty()).collect(), trailers: None, size }
    }

    pub fn empty() -> Answer {
        Answer::new(Vec::new())
    }

    /// The body whose bytes `held` counts, until its last part is written (`unread`, the
    /// connection's, knows it is waiting to be).
    pub fn counted(parts: Vec<Bytes>, held: Held, unread: Option<&Arc<Unread>>) -> Answer {
        let mut answer = Answer::new(parts);
        if let Some(last) = answer.parts.pop_back() {
            let ticket = unread.map(Unread::add);
            answer.parts.push_back(Bytes::from_owner(Counted { data: last, _held: held, _ticket: ticket }));
        }
        answer
    }

    pub fn with_trailers(mut self, trailers: HeaderMap) -> Answer {
        self.trailers = Some(trailers);
        self
    }

    pub fn len(&self) -> u64 {
        self.size
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let me = self.get_mut();
        if let Some(part) = me.parts.front_mut() {
            let data = if part.len() > CHUNK { part.split_to(CHUNK) } else { me.parts.pop_front().expect("a part") };
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(me.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.trailers.is_some() {
            return SizeHint::default();
        }
        SizeHint::with_exact(self.parts.iter().map(|b| b.len() as u64).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batching::Budget;
    use std::future::poll_fn;

    #[tokio::test]
    async fn an_answer_is_handed_out_in_slices_and_counted_until_its_last_is_let_go() {
        let budget = Budget::new(1 << 30);
        let mut held = budget.empty();
        held.force(300_000);
        let unread = Arc::new(Unread::default());
        let mut answer =
            Answer::counted(vec![Bytes::from_static(b"{}"), Bytes::from(vec![7u8; 300_000])], held, Some(&unread));
        assert!(unread.oldest().is_some());
        let mut sizes = Vec::new();
        let mut last = None;
        while let Some(frame) = poll_fn(|cx| Pin::new(&mut answer).poll_frame(cx)).await {
            let data = frame.unwrap().into_data().unwrap();
            sizes.push(data.len());
            assert_eq!(budget.used(), 300_000, "counted while parts remain");
            last = Some(data);
        }
        assert!(sizes.iter().all(|&n| n <= CHUNK) && sizes.iter().sum::<usize>() == 300_002, "{sizes:?}");
        drop(last);
        assert_eq!(budget.used(), 0);
        assert!(unread.oldest().is_none());
    }
}
