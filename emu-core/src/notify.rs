//! A queue that wakes waiters two ways: a condition variable for blocking calls
//! (`ibv_get_cq_event`, `ibv_get_async_event`, `rdma_get_cm_event`) and a pipe whose read
//! end is readable while the queue is not empty, for poll/epoll (`ibv_comp_channel.fd`,
//! `async_fd`, `rdma_event_channel.fd`). The device's completion channels and async
//! events use it, and so do the event channels of the CM (`emu-cm`).

use std::collections::VecDeque;
use std::io::{PipeReader, PipeWriter, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use parking_lot::{Condvar, Mutex};
use verbs_api::{Error, Result};

/// A notifying queue of `T`.
#[derive(Debug)]
pub struct Notifier<T> {
    /// The items, and how many bytes the pipe holds for them (see [`Notifier::take`]).
    queue: Mutex<(VecDeque<T>, usize)>,
    cond: Condvar,
    reader: Mutex<PipeReader>,
    /// The read end again (a second descriptor), to poll without the lock.
    watch: PipeReader,
    writer: Mutex<PipeWriter>,
    fd: i32,
}

impl<T> Notifier<T> {
    /// An empty queue and its pipe (`EMFILE` and the like when no pipe can be made).
    pub fn new() -> Result<Self> {
        let (reader, writer) = std::io::pipe().map_err(|e| Error::Os {
            errno: e.raw_os_error().unwrap_or(24),
            context: "pipe",
        })?;
        // The write end is non-blocking: a full pipe (64 KiB of unread items) must not
        // block `push` under the queue lock. The read end keeps its blocking mode: it
        // is the program's fd, whose O_NONBLOCK flag the program sets and the C ABI
        // reads (a blocking `ibv_get_cq_event` unless the program asked otherwise).
        fcntl(&writer, FcntlArg::F_GETFL)
            .and_then(|f| {
                let f = OFlag::from_bits_retain(f) | OFlag::O_NONBLOCK;
                fcntl(&writer, FcntlArg::F_SETFL(f))
            })
            .map_err(|e| Error::Os {
                errno: e as i32,
                context: "pipe",
            })?;
        let fd = reader.as_raw_fd();
        let watch = reader.try_clone().map_err(|e| Error::Os {
            errno: e.raw_os_error().unwrap_or(24),
            context: "dup",
        })?;
        Ok(Notifier {
            queue: Mutex::new((VecDeque::new(), 0)),
            cond: Condvar::new(),
            reader: Mutex::new(reader),
            watch,
            writer: Mutex::new(writer),
            fd,
        })
    }

    /// Queues `item`: one byte goes into the pipe and the waiters wake (each checks
    /// whether the item is one it takes).
    pub fn push(&self, item: T) {
        let mut q = self.queue.lock();
        q.0.push_back(item);
        // A full pipe (64 KiB of unread items) only means the fd stays readable.
        if self.writer.lock().write(&[1]).is_ok() {
            q.1 += 1;
        }
        self.cond.notify_all();
    }

    /// Takes the oldest item, waiting up to `timeout` (forever for `None`).
    pub fn pop(&self, timeout: Option<Duration>) -> Result<T> {
        self.pop_where(&|_| true, timeout)
    }

    /// The oldest item `want` takes, without waiting.
    pub fn try_pop_where(&self, want: &dyn Fn(&T) -> bool) -> Option<T> {
        self.try_pop_where_then(want, &|_| {})
    }

    /// [`Notifier::try_pop_where`], calling `taken` with the item before the queue's
    /// lock is released: a [`Notifier::remove_where`] in another thread either takes
    /// the item itself or runs after `taken`.
    pub fn try_pop_where_then(&self, want: &dyn Fn(&T) -> bool, taken: &dyn Fn(&T)) -> Option<T> {
        let mut q = self.queue.lock();
        let item = self.take(&mut q, want)?;
        taken(&item);
        Some(item)
    }

    /// Takes out every item `want` takes, oldest first, without waiting; the pipe
    /// keeps one byte per item left.
    pub fn remove_where(&self, want: &dyn Fn(&T) -> bool) -> Vec<T> {
        let mut q = self.queue.lock();
        std::iter::from_fn(|| self.take(&mut q, want)).collect()
    }

    /// The oldest item `want` takes, waiting up to `timeout` (forever for `None`).
    pub fn pop_where(&self, want: &dyn Fn(&T) -> bool, timeout: Option<Duration>) -> Result<T> {
        self.pop_where_then(want, timeout, &|_| {})
    }

    /// [`Notifier::pop_where`], calling `taken` as [`Notifier::try_pop_where_then`]
    /// does.
    pub fn pop_where_then(
        &self,
        want: &dyn Fn(&T) -> bool,
        timeout: Option<Duration>,
        taken: &dyn Fn(&T),
    ) -> Result<T> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = self.queue.lock();
        loop {
            if let Some(item) = self.take(&mut q, want) {
                taken(&item);
                return Ok(item);
            }
            match deadline {
                None => self.cond.wait(&mut q),
                Some(d) => {
                    if self.cond.wait_until(&mut q, d).timed_out() {
                        let item = self.take(&mut q, want).ok_or(Error::TimedOut)?;
                        taken(&item);
                        return Ok(item);
                    }
                }
            }
        }
    }

    /// Removes the first item `want` takes. A byte leaves the pipe only while it
    /// holds more bytes than items remain, so it never blocks (the byte is there)
    /// and the fd stays readable while any item waits, even after the pipe filled.
    fn take(&self, q: &mut (VecDeque<T>, usize), want: &dyn Fn(&T) -> bool) -> Option<T> {
        let item = q.0.remove(q.0.iter().position(want)?)?;
        if q.1 > q.0.len() {
            let mut byte = [0u8; 1];
            if matches!(self.reader.lock().read(&mut byte), Ok(1)) {
                q.1 -= 1;
            }
        }
        Some(item)
    }

    /// The read end of the pipe.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// A descriptor readable exactly while items wait, to poll along with others.
    pub(crate) fn watch_fd(&self) -> BorrowedFd<'_> {
        self.watch.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the pipe's read end is readable now.
    fn readable(n: &Notifier<u32>) -> bool {
        let r = n.reader.lock();
        let mut fds = [nix::poll::PollFd::new(
            r.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap() > 0
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

    #[test]
    fn removed_items_take_their_bytes_out_of_the_pipe() {
        let n = Notifier::new().unwrap();
        for i in 0..5 {
            n.push(i);
        }
        assert_eq!(n.remove_where(&|&i| i % 2 == 0), vec![0, 2, 4]);
        assert!(readable(&n));
        assert_eq!(n.remove_where(&|_| true), vec![1, 3]);
        assert!(!readable(&n));
        assert!(n.remove_where(&|_| true).is_empty());
    }

    /// More items than the pipe holds bytes (64 KiB): pushing never blocks, every item
    /// comes out, and the fd stays readable until the last one has.
    #[test]
    fn more_items_than_the_pipe_holds() {
        let n = Notifier::new().unwrap();
        let count = 70_000u32;
        for i in 0..count {
            n.push(i);
        }
        for i in 0..count {
            if i % 10_000 == 0 || i == count - 1 {
                assert!(readable(&n), "{} items wait", count - i);
            }
            assert_eq!(n.pop(Some(Duration::ZERO)).unwrap(), i);
        }
        assert!(!readable(&n));
    }
}
