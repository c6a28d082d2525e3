//! An event channel: CM events queued for blocking waiters (a condition variable) and
//! for poll/epoll (a pipe whose read end is readable while an event is queued).

use std::collections::VecDeque;
use std::io::{PipeReader, PipeWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use verbs_api::{CmEvent, Error, Result};

/// The queue of one `rdma_event_channel`.
#[derive(Debug)]
pub(crate) struct EventQueue {
    queue: Mutex<VecDeque<CmEvent>>,
    cond: Condvar,
    reader: Mutex<PipeReader>,
    writer: Mutex<PipeWriter>,
    fd: i32,
}

impl EventQueue {
    pub(crate) fn new() -> Result<Self> {
        let (reader, writer) = std::io::pipe().map_err(|e| Error::Os {
            errno: e.raw_os_error().unwrap_or(24),
            context: "pipe",
        })?;
        let fd = reader.as_raw_fd();
        Ok(EventQueue {
            queue: Mutex::new(VecDeque::new()),
            cond: Condvar::new(),
            reader: Mutex::new(reader),
            writer: Mutex::new(writer),
            fd,
        })
    }

    pub(crate) fn push(&self, ev: CmEvent) {
        let mut q = self.queue.lock();
        q.push_back(ev);
        let _ = self.writer.lock().write(&[1]);
        self.cond.notify_all();
    }

    /// The oldest event `want` takes, without waiting.
    pub(crate) fn try_pop(&self, want: &dyn Fn(&CmEvent) -> bool) -> Option<CmEvent> {
        let mut q = self.queue.lock();
        self.take(&mut q, want)
    }

    fn take(&self, q: &mut VecDeque<CmEvent>, want: &dyn Fn(&CmEvent) -> bool) -> Option<CmEvent> {
        let at = q.iter().position(want)?;
        let ev = q.remove(at);
        let mut byte = [0u8; 1];
        let _ = self.reader.lock().read(&mut byte);
        ev
    }

    /// The oldest event `want` takes, waiting up to `timeout` (forever for `None`).
    pub(crate) fn pop(
        &self,
        want: &dyn Fn(&CmEvent) -> bool,
        timeout: Option<Duration>,
    ) -> Result<CmEvent> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = self.queue.lock();
        loop {
            if let Some(ev) = self.take(&mut q, want) {
                return Ok(ev);
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

    pub(crate) fn fd(&self) -> i32 {
        self.fd
    }
}
