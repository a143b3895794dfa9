//! An answer's body: its parts in order (a JSON header and binary tensors, say: sent without
//! being copied into one buffer), then gRPC's trailers where it has them. The request's
//! account of the memory budget rides on its last part, so its bytes are counted until hyper
//! has written that part to the socket and let it go, not merely until hyper took it.
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame, SizeHint};

use crate::batching::Held;

pub struct Answer {
    parts: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    size: u64,
}

struct Counted {
    data: Bytes,
    _held: Held,
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

    /// The body whose bytes `held` counts, until its last part is written.
    pub fn counted(parts: Vec<Bytes>, held: Held) -> Answer {
        let mut answer = Answer::new(parts);
        if let Some(last) = answer.parts.pop_back() {
            answer.parts.push_back(Bytes::from_owner(Counted { data: last, _held: held }));
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
        if let Some(part) = me.parts.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(part))));
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
