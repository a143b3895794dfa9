//! The server's one memory budget: every byte a request holds, from its first byte read to
//! its answer's last byte written (its body, its decoded tensors, its share of the joined
//! batch, its answer until the client has read it), is taken from one pool and given back
//! when let go. A request that alone is over the budget is refused (413); one that does not
//! fit now waits for bytes until its deadline (then 503). So memory does not grow with
//! clients, whether they send slowly, read slowly or not at all.
//!
//! What exists already and must be counted (a run's outputs) is taken whether free or not
//! ([`Held::force`]): the pool may be overdrawn for a moment, and later requests wait.
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use crate::error::{RequestError, Status};

/// A pool of bytes.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: AtomicU64,
    waiting: AtomicUsize,
    freed: Notify,
}

/// Bytes taken from a [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget { limit, used: AtomicU64::new(0), waiting: AtomicUsize::new(0), freed: Notify::new() })
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes taken now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Nothing held yet: the start of a request's account.
    pub fn empty(self: &Arc<Self>) -> Held {
        Held { budget: self.clone(), bytes: 0 }
    }

    /// A 413 where `bytes` alone are over the budget (`what` says whose they are).
    pub fn fits(&self, bytes: u64, what: &str) -> Result<(), RequestError> {
        if bytes > self.limit {
            return Err(RequestError::new(
                Status::PayloadTooLarge,
                format!("{what} needs {bytes} bytes, over the server's memory budget of {} bytes", self.limit),
            ));
        }
        Ok(())
    }

    fn try_take(&self, bytes: u64) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            if used.saturating_add(bytes) > self.limit {
                return false;
            }
            match self.used.compare_exchange_weak(used, used + bytes, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.freed.notify_waiters();
        }
    }
}

impl Held {
    /// Takes `bytes` more now, if free.
    pub fn try_grow(&mut self, bytes: u64) -> bool {
        let ok = bytes == 0 || self.budget.try_take(bytes);
        if ok {
            self.bytes += bytes;
        }
        ok
    }

    /// Takes `bytes` more, waiting until they are free or `deadline` passes (a 503); a 413
    /// where they could never be.
    pub async fn grow(&mut self, bytes: u64, deadline: Instant, what: &str) -> Result<(), RequestError> {
        let budget = self.budget.clone();
        budget.fits(self.bytes + bytes, what)?;
        if self.try_grow(bytes) {
            return Ok(());
        }
        budget.waiting.fetch_add(1, Ordering::AcqRel);
        let result = async {
            loop {
                let freed = budget.freed.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                if self.try_grow(bytes) {
                    return Ok(());
                }
                if tokio::time::timeout_at(deadline.into(), freed).await.is_err() {
                    return Err(RequestError::new(
                        Status::Unavailable,
                        format!(
                            "{what} needs {bytes} bytes, and the server's memory budget ({} bytes) is taken by the \
                             requests in progress; try again later",
                            budget.limit
                        ),
                    ));
                }
            }
        }
        .await;
        budget.waiting.fetch_sub(1, Ordering::AcqRel);
        result
    }

    /// Takes `bytes` more whether free or not.
    pub fn force(&mut self, bytes: u64) {
        self.budget.used.fetch_add(bytes, Ordering::AcqRel);
        self.bytes += bytes;
    }

    /// Gives back all but `keep` bytes.
    pub fn shrink(&mut self, keep: u64) {
        if self.bytes > keep {
            self.budget.give_back(self.bytes - keep);
            self.bytes = keep;
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shrink(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_request_waits_for_bytes_given_back_and_a_late_one_is_a_503() {
        let budget = Budget::new(1000);
        let mut a = budget.empty();
        assert!(a.try_grow(800));
        let mut b = budget.empty();
        assert!(!b.try_grow(300));
        let soon = Instant::now() + Duration::from_secs(5);
        let waiter = tokio::spawn(async move { b.grow(300, soon, "a request").await.map(|_| b.bytes()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        a.shrink(500);
        assert_eq!(waiter.await.unwrap(), Ok(300));
        let mut c = budget.empty();
        let err = c.grow(600, Instant::now() + Duration::from_millis(30), "a request").await.unwrap_err();
        assert_eq!(err.status, Status::Unavailable);
        assert_eq!(budget.empty().grow(2000, soon, "a body").await.unwrap_err().status, Status::PayloadTooLarge);
        drop(a);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn forced_bytes_overdraw_and_come_back() {
        let budget = Budget::new(100);
        let mut a = budget.empty();
        a.force(150);
        assert_eq!(budget.used(), 150);
        assert!(!budget.empty().try_grow(1));
        drop(a);
        assert_eq!(budget.used(), 0);
    }
}
