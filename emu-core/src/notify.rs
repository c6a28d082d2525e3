//! A queue that wakes waiters two ways: a condition variable for blocking calls
//! (`ibv_get_cq_event`, `ibv_get_async_event`, `rdma_get_cm_event`) and a pipe whose read
//! end is readable while the queue is not empty, for poll/epoll (`ibv_comp_channel.fd`,
//! `async_fd`, `rdma_event_channel.fd`).

use std::collections::VecDeque;
use std::io::{PipeReader, PipeWriter, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use verbs_api::{Error, Result};

/// A notifying queue of `T`.
#[derive(Debug)]
pub(crate) struct Notifier<T> {
    queue: Mutex<VecDeque<T>>,
    cond: Condvar,
    reader: Mutex<PipeReader>,
    writer: Mutex<PipeWriter>,
    fd: i32,
}

impl<T> Notifier<T> {
    pub(crate) fn new() -> Result<Self> {
        let (reader, writer) = std::io::pipe().map_err(|e| Error::Os {
            errno: e.raw_os_error().unwrap_or(24),
            context: "pipe",
        })?;
        // Both ends non-blocking: a full pipe (64 KiB of unread items) must not block
        // `push` under the queue lock, and `take` must not wait for a byte that a
        // full pipe never got.
        for end in [reader.as_fd(), writer.as_fd()] {
            rustix::io::ioctl_fionbio(end, true).map_err(|e| Error::Os {
                errno: e.raw_os_error(),
                context: "pipe",
            })?;
        }
        let fd = reader.as_raw_fd();
        Ok(Notifier {
            queue: Mutex::new(VecDeque::new()),
            cond: Condvar::new(),
            reader: Mutex::new(reader),
            writer: Mutex::new(writer),
            fd,
        })
    }

    /// Queues `item`: one byte goes into the pipe and the waiters wake (each checks
    /// whether the item is one it takes).
    pub(crate) fn push(&self, item: T) {
        let mut q = self.queue.lock();
        q.push_back(item);
        // A full pipe (64 KiB of unread events) only means the fd stays readable.
        let _ = self.writer.lock().write(&[1]);
        self.cond.notify_all();
    }

    /// Takes the oldest item, waiting up to `timeout` (forever for `None`).
    pub(crate) fn pop(&self, timeout: Option<Duration>) -> Result<T> {
        self.pop_where(&|_| true, timeout)
    }

    /// The oldest item `want` takes, without waiting.
    pub(crate) fn try_pop_where(&self, want: &dyn Fn(&T) -> bool) -> Option<T> {
        let mut q = self.queue.lock();
        self.take(&mut q, want)
    }

    /// The oldest item `want` takes, waiting up to `timeout` (forever for `None`).
    pub(crate) fn pop_where(
        &self,
        want: &dyn Fn(&T) -> bool,
        timeout: Option<Duration>,
    ) -> Result<T> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = self.queue.lock();
        loop {
            if let Some(item) = self.take(&mut q, want) {
                return Ok(item);
            }
            match deadline {
                None => self.cond.wait(&mut q),
                Some(d) => {
                    if self.cond.wait_until(&mut q, d).timed_out() {
                        return self.take(&mut q, want).ok_or(Error::TimedOut);
                    }
                }
            }
        }
    }

    fn take(&self, q: &mut VecDeque<T>, want: &dyn Fn(&T) -> bool) -> Option<T> {
        let item = q.remove(q.iter().position(want)?)?;
        let mut byte = [0u8; 1];
        let _ = self.reader.lock().read(&mut byte);
        Some(item)
    }

    /// The read end of the pipe.
    pub(crate) fn fd(&self) -> i32 {
        self.fd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the pipe's read end is readable now.
    fn readable(n: &Notifier<u32>) -> bool {
        let r = n.reader.lock();
        let mut fds = [rustix::event::PollFd::new(
            &*r,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        rustix::event::poll(&mut fds, Some(&zero)).unwrap() > 0
    }

    #[test]
    fn the_fd_is_readable_exactly_while_items_wait() {
        let n = Notifier::new().unwrap();
        assert!(!readable(&n));
        n.push(1);
        n.push(2);
        assert!(readable(&n));
        assert_eq!(n.try_pop_where(&|&i| i == 2), Some(2));
        assert!(readable(&n));
        assert_eq!(n.pop(Some(Duration::ZERO)).unwrap(), 1);
        assert!(!readable(&n));
        assert!(matches!(
            n.pop(Some(Duration::from_millis(1))),
            Err(Error::TimedOut)
        ));
    }

    /// More items than the pipe holds bytes (64 KiB): pushing never blocks and every
    /// item comes out.
    #[test]
    fn more_items_than_the_pipe_holds() {
        let n = Notifier::new().unwrap();
        let count = 70_000u32;
        for i in 0..count {
            n.push(i);
        }
        for i in 0..count {
            assert_eq!(n.pop(Some(Duration::ZERO)).unwrap(), i);
        }
        assert!(!readable(&n));
    }
}
