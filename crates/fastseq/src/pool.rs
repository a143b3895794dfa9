//! The thread pool the core's parallel work runs on: one per process.
//!
//! A process that forks after using a rayon pool (Python's multiprocessing does, by
//! default on Linux) hands its child a pool whose threads stayed in the parent: any
//! parallel work in the child then waits forever. So the pool is tied to the process id,
//! and a forked child builds its own on first use. The parent's pool, unusable there, is
//! left as it is (freeing it would wait for threads that do not exist).
use std::sync::atomic::{AtomicPtr, Ordering};

use rayon::{ThreadPool, ThreadPoolBuilder};

struct Pool {
    pid: u32,
    pool: ThreadPool,
}

static CURRENT: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());

fn current() -> &'static ThreadPool {
    let pid = std::process::id();
    let seen = CURRENT.load(Ordering::Acquire);
    // SAFETY: pools are leaked, never freed: a non-null pointer stays valid for the process.
    if let Some(p) = unsafe { seen.as_ref() } {
        if p.pid == pid {
            return &p.pool;
        }
    }
    let pool = ThreadPoolBuilder::new()
        .thread_name(|i| format!("fastseq-{i}"))
        .build()
        .expect("cannot start threads for fastseq's thread pool");
    let mine = Box::into_raw(Box::new(Pool { pid, pool }));
    match CURRENT.compare_exchange(seen, mine, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `mine` was just leaked from a Box and is now published for good.
        Ok(_) => unsafe { &(*mine).pool },
        Err(_) => {
            // Another thread of this process got there first: use its pool.
            // SAFETY: `mine` was never published; the winner's pointer is valid for good.
            drop(unsafe { Box::from_raw(mine) });
            current()
        }
    }
}

/// Runs `f` on this process's pool: rayon's parallel iterators, `join` and `spawn` inside
/// it use that pool.
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    current().install(f)
}

/// Runs `f` in the background on this process's pool (used to free large models off the
/// caller's path).
pub fn spawn(f: impl FnOnce() + Send + 'static) {
    current().spawn(f)
}
