//! The server's one memory budget: every byte a request holds, from its first byte read to
//! its answer's last byte written (its body, its decoded tensors, its share of the joined
//! batch and of the run's outputs, its answer until the client has read it), is taken from
//! one pool and given back when let go. A request that alone is over the budget is refused
//! (413); one that does not fit now waits for bytes until its deadline (then 503). So memory
//! does not grow with clients, whether they send slowly, read slowly or not at all.
//!
//! Bodies arriving (the first bytes a request takes, before anything is run) may hold at
//! most half of the pool together, unless they are alone ([`Held::grow_body`]): a request
//! that holds its body and waits for the rest of its cost must find the other half free of
//! other bodies, or every request could hold a body and wait for bytes that only another's
//! end would free, until all of them time out.
//!
//! A body of at most [`SMALL_BODY`] bytes (a 64th of the pool at most) is not held to that half: however many large
//! uploads fill it, a small request (most of them) still finds the rest of the pool, as its
//! run does; otherwise a client with a few stalled large uploads turned every other client
//! away until they timed out.
//!
//! A request that holds bytes and waits for more can still find every byte of the pool held
//! by requests that wait as it does (bodies, each waiting for its run): none would ever be
//! freed. Then the youngest of those that hold bytes gives up at once (a 503), and what it
//! held goes to the older ones: the pool is never overdrawn to end such a wait.
//!
//! What exists already and must be counted (a run's outputs past their estimate) is taken
//! whether free or not ([`Held::force`], [`Held::resize`]): the pool may be overdrawn for a
//! moment, and later requests wait.
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use crate::error::{RequestError, Status};

/// The most bytes a body may hold and still not be held to the bodies' half of the pool (and
/// at most a 64th of the pool).
pub const SMALL_BODY: u64 = 64 << 10;

/// A pool of bytes.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    /// Bytes taken, and of them those of bodies still arriving.
    pool: Mutex<Pool>,
    /// `pool.used`, for readers that take no lock (metrics).
    used: AtomicU64,
    waiting: AtomicUsize,
    freed: Notify,
}

#[derive(Debug, Default)]
struct Pool {
    used: u64,
    bodies: u64,
    /// The requests waiting for bytes, oldest first: what each holds, and whether it waits for
    /// a body's bytes.
    waiters: std::collections::BTreeMap<u64, (u64, bool)>,
    next_waiter: u64,
}

impl Pool {
    /// Every byte taken is held by a request that waits for more (none will be freed), and
    /// `id` is the youngest of those waiting that hold bytes: it should give up.
    fn victim(&self, id: u64) -> bool {
        let waiting: u64 = self.waiters.values().map(|&(held, _)| held).sum();
        self.waiters.len() > 1
            && self.used <= waiting
            && self.waiters.iter().rev().find(|(_, &(held, _))| held > 0).is_some_and(|(&w, _)| w == id)
    }
}

/// Bytes taken from a [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<Budget>,
    bytes: u64,
    /// Of `bytes`, those counted as a body arriving.
    body: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            pool: Mutex::new(Pool::default()),
            used: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
        })
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes taken now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes of bodies arriving now.
    pub fn bodies(&self) -> u64 {
        self.lock().bodies
    }

    /// Nothing held yet: the start of a request's account.
    pub fn empty(self: &Arc<Self>) -> Held {
        Held { budget: self.clone(), bytes: 0, body: 0 }
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

    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `bytes` if free (as a body's where `body`: then, where `capped`, within half the
    /// pool, unless no other body is arriving).
    fn try_take(&self, bytes: u64, body: bool, capped: bool) -> bool {
        let mut pool = self.lock();
        if pool.used.saturating_add(bytes) > self.limit {
            return false;
        }
        if body {
            if capped && pool.bodies > 0 && pool.bodies.saturating_add(bytes) > self.limit / 2 {
                return false;
            }
            pool.bodies += bytes;
        }
        pool.used += bytes;
        self.used.store(pool.used, Ordering::Relaxed);
        true
    }

    fn change(&self, used: i128, bodies: i128) {
        let mut pool = self.lock();
        pool.used = (pool.used as i128 + used).max(0) as u64;
        pool.bodies = (pool.bodies as i128 + bodies).max(0) as u64;
        self.used.store(pool.used, Ordering::Relaxed);
        drop(pool);
        if (used < 0 || bodies < 0) && self.waiting.load(Ordering::Acquire) > 0 {
            self.freed.notify_waiters();
        }
    }
}

impl Held {
    /// Takes `bytes` more now, if free.
    pub fn try_grow(&mut self, bytes: u64) -> bool {
        let ok = bytes == 0 || self.budget.try_take(bytes, false, false);
        if ok {
            self.bytes += bytes;
        }
        ok
    }

    /// Takes `bytes` more, waiting until they are free or `deadline` passes (a 503); a 413
    /// where they could never be.
    pub async fn grow(&mut self, bytes: u64, deadline: Instant, what: &str) -> Result<(), RequestError> {
        self.grow_as(bytes, false, deadline, what).await
    }

    /// As [`Held::grow`], for bytes of a body still arriving: bodies hold at most half the
    /// pool together (unless one is alone), so that requests past their bodies find room.
    pub async fn grow_body(&mut self, bytes: u64, deadline: Instant, what: &str) -> Result<(), RequestError> {
        self.grow_as(bytes, true, deadline, what).await
    }

    async fn grow_as(&mut self, bytes: u64, body: bool, deadline: Instant, what: &str) -> Result<(), RequestError> {
        let budget = self.budget.clone();
        budget.fits(self.bytes + bytes, what)?;
        if bytes == 0 {
            return Ok(());
        }
        // A small body is not held to the bodies' half (see the module's text).
        let capped = body && self.body.saturating_add(bytes) > SMALL_BODY.min(budget.limit / 64);
        let took = |me: &mut Held| {
            if budget.try_take(bytes, body, capped) {
                me.bytes += bytes;
                if body {
                    me.body += bytes;
                }
                true
            } else {
                false
            }
        };
        if took(self) {
            return Ok(());
        }
        budget.waiting.fetch_add(1, Ordering::AcqRel);
        let id = {
            let mut pool = budget.lock();
            let id = pool.next_waiter;
            pool.next_waiter += 1;
            pool.waiters.insert(id, (self.bytes, body));
            id
        };
        // One more waiter may be what makes the pool stuck: the others look again.
        budget.freed.notify_waiters();
        let taken = || {
            RequestError::new(
                Status::Unavailable,
                format!(
                    "{what} needs {bytes} bytes, and the server's memory budget ({} bytes) is taken by the requests \
                     in progress; try again later",
                    budget.limit
                ),
            )
        };
        let result = async {
            loop {
                let freed = budget.freed.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                if took(self) {
                    return Ok(());
                }
                if budget.lock().victim(id) {
                    return Err(taken());
                }
                if tokio::time::timeout_at(deadline.into(), freed).await.is_err() {
                    return Err(taken());
                }
            }
        }
        .await;
        budget.lock().waiters.remove(&id);
        budget.waiting.fetch_sub(1, Ordering::AcqRel);
        budget.freed.notify_waiters();
        result
    }

    /// The body has arrived: its bytes stay held, no longer as a body arriving.
    pub fn arrived(&mut self) {
        if self.body > 0 {
            self.budget.change(0, -(self.body as i128));
            self.body = 0;
        }
    }

    /// Takes `bytes` more whether free or not.
    pub fn force(&mut self, bytes: u64) {
        if bytes > 0 {
            self.budget.change(bytes as i128, 0);
            self.bytes += bytes;
        }
    }

    /// Gives back all but `keep` bytes.
    pub fn shrink(&mut self, keep: u64) {
        if self.bytes > keep {
            // What is kept of a body arriving stays counted as one.
            let body = self.body.min(keep);
            self.budget.change(-((self.bytes - keep) as i128), -((self.body - body) as i128));
            self.bytes = keep;
            self.body = body;
        }
    }

    /// Holds exactly `bytes`: more taken whether free or not, or the rest given back.
    pub fn resize(&mut self, bytes: u64) {
        if bytes > self.bytes {
            self.force(bytes - self.bytes);
        } else {
            self.shrink(bytes);
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

    #[tokio::test]
    async fn a_small_body_is_not_held_behind_large_ones() {
        // Large bodies fill their half of the pool and wait there (their clients stalled): a
        // small body still finds the other half, and its run too.
        let budget = Budget::new(64 << 20);
        let soon = Instant::now() + Duration::from_secs(5);
        let mut large: Vec<Held> = (0..4).map(|_| budget.empty()).collect();
        for h in &mut large {
            h.grow_body(8 << 20, soon, "a large body").await.unwrap();
        }
        assert_eq!(budget.bodies(), 32 << 20);
        let mut more = budget.empty();
        let err = more.grow_body(1 << 20, Instant::now() + Duration::from_millis(30), "a body").await.unwrap_err();
        assert_eq!(err.status, Status::Unavailable);
        let mut small = budget.empty();
        small.grow_body(4 << 10, Instant::now() + Duration::from_millis(30), "a small body").await.unwrap();
        small.grow_body(4 << 10, Instant::now() + Duration::from_millis(30), "a small body").await.unwrap();
        small.arrived();
        small.grow(1 << 20, Instant::now() + Duration::from_millis(30), "its run").await.unwrap();
        // past SMALL_BODY a body is a large one again
        let mut growing = budget.empty();
        growing.grow_body(SMALL_BODY, soon, "a body").await.unwrap();
        assert!(growing.grow_body(1, Instant::now() + Duration::from_millis(30), "a body").await.is_err());
    }

    #[tokio::test]
    async fn bodies_hold_half_the_pool_unless_alone_and_the_rest_is_left_for_runs() {
        let budget = Budget::new(1000);
        let soon = Instant::now() + Duration::from_secs(5);
        let mut a = budget.empty();
        a.grow_body(400, soon, "a body").await.unwrap();
        let mut b = budget.empty();
        // 400 + 200 of bodies is past half the pool: b waits, and is a 503 at its deadline.
        let err = b.grow_body(200, Instant::now() + Duration::from_millis(30), "a body").await.unwrap_err();
        assert_eq!(err.status, Status::Unavailable);
        // a's body arrived: the next body finds the half free, and a its run's bytes.
        a.arrived();
        assert_eq!(budget.bodies(), 0);
        b.grow_body(450, soon, "a body").await.unwrap();
        a.grow(150, soon, "a run").await.unwrap();
        assert_eq!((budget.used(), budget.bodies()), (1000, 450));
        // a body alone may take more than half
        drop(b);
        drop(a);
        let mut c = budget.empty();
        c.grow_body(900, soon, "a body").await.unwrap();
        assert_eq!(budget.bodies(), 900);
        c.resize(100);
        assert_eq!((budget.used(), budget.bodies()), (100, 100));
        c.arrived();
        assert_eq!(budget.bodies(), 0);
        c.resize(300);
        assert_eq!(budget.used(), 300);
        drop(c);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn requests_that_all_hold_and_wait_give_way_youngest_first() {
        // Three requests hold 300 each of a pool of 1000 and each wants 300 more: none would
        // ever be freed. The youngest gives up at once (a 503), and the oldest goes on.
        let budget = Budget::new(1000);
        let soon = Instant::now() + Duration::from_secs(5);
        let mut tasks = Vec::new();
        for k in 0..3u64 {
            let mut h = budget.empty();
            assert!(h.try_grow(300));
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20 * k)).await;
                let r = h.grow(300, soon, "a run").await.map(|_| h.bytes()).map_err(|e| e.status);
                if r.is_ok() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (r, Instant::now())
            }));
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        assert_eq!(results[0].0, Ok(600));
        assert_eq!(results[2].0, Err(Status::Unavailable));
        assert!(results[2].1 < soon - Duration::from_secs(4), "gave way at once, not at its deadline");
        assert_eq!(budget.used(), 0);
        // bytes held by a request that is not waiting (an unread answer) are no deadlock: a
        // request waits for them until its deadline
        let mut answer = budget.empty();
        answer.force(900);
        let mut late = budget.empty();
        assert!(late.try_grow(50));
        let began = Instant::now();
        let err = late.grow(300, Instant::now() + Duration::from_millis(100), "a run").await.unwrap_err();
        assert_eq!(err.status, Status::Unavailable);
        assert!(began.elapsed() >= Duration::from_millis(90));
    }
}
