//! The atomics and the sleep/wake primitive the ring is written against: the standard
//! library's atomics and a process-shared futex normally (the system call is in
//! `region`, the crate's one module with `unsafe`; Miri runs it too, through its model
//! of the futex), loom's atomics and a model of a futex (a mutex and a condition
//! variable) under `--cfg loom`, so that the model checker runs the ring's own code.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64};

#[cfg(not(loom))]
use std::time::Duration;

/// Sleeps while `word` holds `expected`, until [`wake`] on the same word, `timeout`, or
/// a spurious wake-up (the caller re-checks what it waits for). The futex is not
/// process-private: the word lives in memory other processes map.
#[cfg(not(loom))]
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    crate::region::futex_wait(word, expected, timeout);
}

/// Wakes the sleepers of `word` ([`wait`]).
#[cfg(not(loom))]
pub(crate) fn wake(word: &AtomicU32) {
    crate::region::futex_wake(word);
}

#[cfg(loom)]
pub(crate) use model::{wait, wake};

/// A futex for the model checker: the kernel checks the word and queues the waiter
/// under one lock (the futex's hash bucket), and a wake takes that lock, which this
/// reproduces with a mutex and a condition variable. One futex in the model (a ring's
/// sleep flag, or the bell's that a consumer of several rings sleeps on), so one global
/// pair serves every word. No timeout: a lost wake-up
/// then shows up as a deadlock, which loom reports.
#[cfg(loom)]
mod model {
    use super::AtomicU32;
    use loom::sync::{Condvar, Mutex};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    loom::lazy_static! {
        static ref BUCKET: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }

    pub(crate) fn wait(word: &AtomicU32, expected: u32, _timeout: Option<Duration>) {
        let (lock, cv) = &*BUCKET;
        let guard = lock.lock().unwrap();
        if word.load(Ordering::SeqCst) == expected {
            drop(cv.wait(guard).unwrap());
        }
    }

    pub(crate) fn wake(word: &AtomicU32) {
        let _ = word;
        let (lock, cv) = &*BUCKET;
        let _guard = lock.lock().unwrap();
        cv.notify_all();
    }
}
