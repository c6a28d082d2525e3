//! The atomics and the sleep/wake primitive the ring is written against: the standard
//! library's atomics and a process-shared futex normally, loom's atomics and a model of
//! a futex (a mutex and a condition variable) under `--cfg loom`, so that the model
//! checker runs the ring's own code.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64};

#[cfg(not(loom))]
use std::time::Duration;

/// Sleeps while `word` holds `expected`, until [`wake`] on the same word, `timeout`, or
/// a spurious wake-up (the caller re-checks what it waits for). The futex is not
/// process-private: the word lives in memory other processes map.
#[cfg(not(any(loom, miri)))]
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    use rustix::thread::futex;
    let ts = timeout.map(|t| futex::Timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    // EAGAIN (the word changed first), EINTR and ETIMEDOUT all mean "look again".
    let _ = futex::wait(word, futex::Flags::empty(), expected, ts.as_ref());
}

/// Wakes the sleepers of `word` ([`wait`]).
#[cfg(not(any(loom, miri)))]
pub(crate) fn wake(word: &AtomicU32) {
    let _ =
        rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
}

#[cfg(loom)]
pub(crate) use model::{wait, wake};

/// Under Miri, which refuses rustix's `syscall(SYS_futex, ..)` (it passes the word's
/// address as `*const AtomicU32` where Miri's shim wants `*mut u32`): a wait is a
/// yield, i.e. a spurious wake-up, which every caller allows; a wake does nothing.
/// Miri checks the ring's memory accesses, not the kernel's futex.
#[cfg(all(miri, not(loom)))]
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let _ = (word, expected, timeout);
    std::thread::yield_now();
}

/// See the Miri [`wait`].
#[cfg(all(miri, not(loom)))]
pub(crate) fn wake(word: &AtomicU32) {
    let _ = word;
}

/// A futex for the model checker: the kernel checks the word and queues the waiter
/// under one lock (the futex's hash bucket), and a wake takes that lock, which this
/// reproduces with a mutex and a condition variable. One futex in the model (there is
/// one sleep flag), so one global pair serves every word. No timeout: a lost wake-up
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
