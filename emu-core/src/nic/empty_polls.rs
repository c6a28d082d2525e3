//! Which `poll_cq` of an empty CQ reads the socket.
//!
//! A `poll_cq` that finds its CQ empty receives what waits on the link in the
//! application's thread (`Inner::poll_cq`); on UDP that is a system call, about half
//! a microsecond when nothing waits. A real NIC's empty poll is a read of memory. A
//! program that polls several CQs in turn (send and receive CQs, as UCX does; a CQ per
//! few thousand QPs, as `rdma-emu bench write_bw --qps 100000` has 74 of them) paid one
//! such call per CQ and turn: 1.4 million empty receives in a 100,000-QP run of 10
//! million messages, more than one per ACK it received.
//!
//! A receive takes what waits for every CQ of the device. So after a poll's receive
//! found nothing, the polls of the other CQs skip theirs for [`SPAN`]: one receive per
//! turn over the CQs, made by the CQ that made the last one. A poll of that same CQ
//! always receives (a program that polls one CQ in a loop is unchanged), and so does
//! any poll once [`SPAN`] has passed since the last empty receive (a program that
//! stopped polling that CQ waits at most that long).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use verbs_api::CqId;

/// How long after an empty receive for one CQ the polls of other CQs skip theirs:
/// longer than a turn over many CQs (74 CQs take some microseconds).
pub(crate) const SPAN: Duration = Duration::from_micros(50);

/// The last empty receive of a poll (relaxed atomics: a heuristic, any value is safe).
#[derive(Debug)]
pub(crate) struct EmptyPolls {
    /// The CQ whose poll made it, plus one; 0 when the last receive found datagrams.
    cq: AtomicU64,
    /// When, in nanoseconds since `base`.
    at: AtomicU64,
    base: Instant,
}

impl EmptyPolls {
    pub(crate) fn new() -> EmptyPolls {
        EmptyPolls {
            cq: AtomicU64::new(0),
            at: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    /// Whether a poll that found `cq` empty skips its receive: another CQ's poll
    /// received less than [`SPAN`] ago and found nothing.
    pub(crate) fn skip(&self, cq: CqId) -> bool {
        let last = self.cq.load(Ordering::Relaxed);
        if last == 0 || last == u64::from(cq.0) + 1 {
            return false;
        }
        self.nanos().saturating_sub(self.at.load(Ordering::Relaxed)) < SPAN.as_nanos() as u64
    }

    /// A poll of `cq` received `got` datagrams.
    pub(crate) fn received(&self, cq: CqId, got: usize) {
        if got > 0 {
            self.cq.store(0, Ordering::Relaxed);
        } else {
            self.at.store(self.nanos(), Ordering::Relaxed);
            self.cq.store(u64::from(cq.0) + 1, Ordering::Relaxed);
        }
    }

    fn nanos(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_cqs_skip_after_an_empty_receive_the_same_cq_never_does() {
        let e = EmptyPolls::new();
        let (a, b, c) = (CqId(0), CqId(1), CqId(2));
        assert!(!e.skip(a) && !e.skip(b), "no receive yet");
        e.received(a, 0);
        assert!(!e.skip(a), "a CQ polled in a loop receives every time");
        assert!(e.skip(b) && e.skip(c), "the rest of the turn skips");
        e.received(a, 3);
        assert!(!e.skip(b), "the last receive found datagrams");
        e.received(b, 0);
        assert!(e.skip(a) && !e.skip(b));
        std::thread::sleep(SPAN * 2);
        assert!(!e.skip(a), "a poll receives again once the span passed");
        // The largest CQ number is told from "none".
        e.received(CqId(u32::MAX), 0);
        assert!(!e.skip(CqId(u32::MAX)) && e.skip(a));
    }
}
