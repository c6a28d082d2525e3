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

use std::sync::atomic::Ordering::AcqRel;

/// The low bits of a sleep word (a ring's or a bell's `sleeping`): how many consumer
/// threads are asleep on it or about to be. More than one can be: a device's thread
/// and an application thread waiting for an event both sleep on one bell.
pub(crate) const SLEEPERS: u32 = 0xFFFF;

/// What a producer adds to a sleep word each time it publishes (the high bits count
/// publications): the word then differs from what any sleeper joined with, so a
/// sleeper that has not blocked yet does not block ([`wait`] compares).
const PUBLISHED: u32 = 1 << 16;

/// A consumer thread joins the sleepers of `word` before it looks one last time at
/// what it waits for: returns the value to [`wait`] on. Every write of the word is a
/// read-modify-write (this, [`leave`], [`published`]), so the writes form one chain:
/// if a producer's [`published`] comes first, this reads from the chain its release
/// heads and the last look sees what it published; if after, [`published`] counts
/// this sleeper and the producer wakes it (or changed the word before it blocks).
pub(crate) fn join(word: &AtomicU32) -> u32 {
    word.fetch_add(1, AcqRel).wrapping_add(1)
}

/// A consumer thread that joined leaves the sleepers (after its wait, or instead).
pub(crate) fn leave(word: &AtomicU32) {
    word.fetch_sub(1, AcqRel);
}

/// A producer published (a head, a generation): whether a consumer thread sleeps on
/// `word` and must be woken.
pub(crate) fn published(word: &AtomicU32) -> bool {
    word.fetch_add(PUBLISHED, AcqRel) & SLEEPERS != 0
}

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
/// sleep word, or the bell's that a consumer of several rings sleeps on), so one global
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
