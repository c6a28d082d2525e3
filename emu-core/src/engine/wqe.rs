//! Work queue entries as the engine keeps them once posted.

use std::collections::VecDeque;

use emu_wire::Psn;
use smallvec::SmallVec;
use verbs_api::{SendFlags, Sge, WcStatus, WrOperation};

use super::mr::Segment;
use super::mw::BindOrigin;
use super::ud::UdDestination;

/// What kind of request a send WQE makes on the wire.
/// A work request's scatter/gather list. Most have one entry: kept inline, so posting
/// a WR allocates nothing.
pub(crate) type Sges = SmallVec<[Sge; 1]>;

/// The registered memory a WQE's SGEs resolved to (inline for one SGE, as [`Sges`]).
pub(crate) type Segments = SmallVec<[Segment; 1]>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReqKind {
    Send,
    Write,
    Read,
    Atomic,
    /// ATOMIC WRITE (IBTA 1.5): one packet carrying its 8 bytes, answered by a
    /// zero-length READ response.
    AtomicWrite,
    /// FLUSH (IBTA 1.5): one packet without payload, answered by a zero-length READ
    /// response.
    Flush,
    /// A bind or LOCAL_INV: no packet, run by the requester (see `mw`).
    Local,
}

/// A send WQE's local memory: the SGEs as posted until the requester starts the WQE,
/// then what they resolved to. One field for both keeps a WQE within three cache
/// lines, and a send queue is written cold for every message when many QPs take
/// turns.
#[derive(Debug)]
pub(crate) enum Payload {
    /// The WR's scatter/gather list, not resolved yet.
    Posted(Sges),
    /// The registered memory the message reads from or writes to (resolved when the
    /// WQE starts), or its INLINE data (copied at post time, manual 3.6
    /// `IBV_SEND_INLINE`).
    Resolved(Segments),
    /// The local memory of a READ or an atomic failed its L_Key checks with this
    /// status. The request still goes out, and the WQE completes with the status when
    /// its response lands (not a byte of it is written), as kernel rxe checks the
    /// destination only when it copies the response (`do_read`, `do_atomic`): a remote
    /// error found first wins (REM_ACCESS_ERR with both keys bad), and an atomic with
    /// only its L_Key bad still acts on the responder's memory. IBTA 10.7 and 9.9 leave
    /// the order of the two checks open; google/rdma-unit-test expects rxe's.
    Unusable(WcStatus),
}

/// A send queue entry.
#[derive(Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: WrOperation,
    pub(crate) flags: SendFlags,
    /// Generates a completion on success (`SIGNALED` or `sq_sig_all`).
    pub(crate) signaled: bool,
    pub(crate) payload: Payload,
    /// The message length: the sum of the SGE lengths.
    pub(crate) length: u32,
    /// Whether the requester has assigned its PSNs.
    pub(crate) started: bool,
    pub(crate) first_psn: Psn,
    /// PSNs the request consumes: packets for SEND/WRITE, response packets for READ
    /// (IBTA 9.7.1.1), one for an atomic.
    pub(crate) npsn: u32,
    /// The PSN offset (from `first_psn`) of the next packet to transmit.
    pub(crate) next_off: u32,
    /// Set when the WQE is finished: acknowledged, or failed with this status.
    pub(crate) done: Option<WcStatus>,
    /// UD: where the message goes, copied from the WR and its address handle.
    pub(crate) ud: Option<UdDestination>,
    /// A bind: whether the bind verb posted it (type 1) or a BIND_MW WR (type 2).
    pub(crate) bind_origin: Option<BindOrigin>,
    /// XRC send QP: the XRC SRQ at the target its XRCETHs name (module `xrc`).
    pub(crate) xrc_srqn: u32,
}

impl SendWqe {
    pub(crate) fn kind(&self) -> ReqKind {
        match self.op {
            WrOperation::Send
            | WrOperation::SendWithImm { .. }
            | WrOperation::SendWithInv { .. } => ReqKind::Send,
            WrOperation::RdmaWrite { .. } | WrOperation::RdmaWriteWithImm { .. } => ReqKind::Write,
            WrOperation::RdmaRead { .. } => ReqKind::Read,
            WrOperation::LocalInv { .. } | WrOperation::BindMw { .. } => ReqKind::Local,
            WrOperation::AtomicWrite { .. } => ReqKind::AtomicWrite,
            WrOperation::Flush { .. } => ReqKind::Flush,
            WrOperation::AtomicCmpAndSwp { .. } | WrOperation::AtomicFetchAndAdd { .. } => {
                ReqKind::Atomic
            }
        }
    }

    /// Whether the request takes a responder resource, and so counts against
    /// `max_rd_atomic`: READ, the atomics, and (IBTA 1.5) ATOMIC WRITE and FLUSH, which
    /// the responder answers as it answers a READ.
    pub(crate) fn is_rd_atomic(&self) -> bool {
        matches!(
            self.kind(),
            ReqKind::Read | ReqKind::Atomic | ReqKind::AtomicWrite | ReqKind::Flush
        )
    }

    /// Whether the response is a READ response: READ, and (IBTA 1.5; kernel rxe 6.12)
    /// ATOMIC WRITE and FLUSH, answered by a zero-length RDMA READ RESPONSE ONLY.
    pub(crate) fn answered_by_read_response(&self) -> bool {
        matches!(
            self.kind(),
            ReqKind::Read | ReqKind::AtomicWrite | ReqKind::Flush
        )
    }

    /// The last PSN the WQE consumes.
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npsn.saturating_sub(1))
    }

    /// Whether `psn` is one of the WQE's PSNs.
    pub(crate) fn holds_psn(&self, psn: Psn) -> bool {
        let d = psn.distance(self.first_psn);
        d >= 0 && (d as u32) < self.npsn
    }

    /// The memory the WQE resolved to (nothing before it started or when it failed
    /// to resolve).
    pub(crate) fn local(&self) -> &[Segment] {
        match &self.payload {
            Payload::Resolved(segs) => segs,
            Payload::Posted(_) | Payload::Unusable(_) => &[],
        }
    }

    /// The local error a READ or atomic completes with when its response lands.
    pub(crate) fn unusable(&self) -> Option<WcStatus> {
        match self.payload {
            Payload::Unusable(status) => Some(status),
            _ => None,
        }
    }

    pub(crate) fn fully_sent(&self) -> bool {
        self.started && self.next_off >= self.npsn
    }
}

/// A receive queue entry.
#[derive(Clone, Debug)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: Sges,
    /// The buffer's capacity: the sum of the SGE lengths.
    pub(crate) length: u64,
}

/// The buffers of send queues that emptied, lent to the next QP that posts to an
/// empty one. A QP's send queue is written for every message and read again when its
/// ACK comes; with many QPs taking turns (`bench write_bw --qps 100000`), a buffer of
/// its own per QP is cold at every post (100,000 of them, 1.5 KiB each at eight WRs),
/// while the buffer a QP just finished with is still in cache. The last one given back
/// is the first lent (a stack), so the buffers in use stay as few as the QPs with WRs
/// outstanding, and an idle QP holds none. A buffer keeps its capacity: reused, it
/// allocates nothing (a queue that needs more grows it once).
#[derive(Debug, Default)]
pub(crate) struct SendQueuePool(Vec<VecDeque<SendWqe>>);

impl SendQueuePool {
    /// Gives back the buffer of `sq` if it is empty (it keeps none).
    pub(crate) fn give(&mut self, sq: &mut VecDeque<SendWqe>) {
        if sq.is_empty() && sq.capacity() > 0 {
            self.0.push(std::mem::take(sq));
        }
    }

    /// Lends `sq`, empty and without a buffer, the buffer given back last.
    pub(crate) fn lend(&mut self, sq: &mut VecDeque<SendWqe>) {
        if sq.capacity() == 0 {
            if let Some(buf) = self.0.pop() {
                *sq = buf;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget, not a measurement: with many QPs taking turns, every posted WQE is
    /// written to memory no cache holds, a line per 64 bytes. 240 bytes before the
    /// payload became one field.
    #[test]
    fn a_send_wqe_stays_within_three_cache_lines() {
        assert!(std::mem::size_of::<SendWqe>() <= 192);
    }

    fn wqe() -> SendWqe {
        SendWqe {
            wr_id: 1,
            op: WrOperation::Send,
            flags: SendFlags::empty(),
            signaled: false,
            payload: Payload::Posted(Sges::new()),
            length: 0,
            started: false,
            first_psn: Psn::default(),
            npsn: 0,
            next_off: 0,
            done: None,
            ud: None,
            bind_origin: None,
            xrc_srqn: 0,
        }
    }

    #[test]
    fn an_emptied_send_queue_lends_its_buffer_last_given_first_lent() {
        let mut pool = SendQueuePool::default();
        let (mut small, mut big) = (VecDeque::with_capacity(8), VecDeque::with_capacity(64));
        let mut busy = VecDeque::from([wqe()]);
        // A queue with no buffer, or with WQEs in it, keeps what it has.
        pool.give(&mut VecDeque::new());
        pool.give(&mut busy);
        assert_eq!((pool.0.len(), busy.len()), (0, 1));
        pool.give(&mut small);
        pool.give(&mut big);
        assert_eq!((small.capacity(), big.capacity(), pool.0.len()), (0, 0, 2));
        // A queue that has a buffer takes none; an empty one takes the last given.
        pool.lend(&mut busy);
        assert_eq!(pool.0.len(), 2);
        let mut q = VecDeque::new();
        pool.lend(&mut q);
        assert!(q.capacity() >= 64);
        let mut r = VecDeque::new();
        pool.lend(&mut r);
        assert!((8..64).contains(&r.capacity()));
        let mut s: VecDeque<SendWqe> = VecDeque::new();
        pool.lend(&mut s);
        assert_eq!(s.capacity(), 0);
    }
}
