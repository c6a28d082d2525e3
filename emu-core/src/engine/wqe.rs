//! Work queue entries as the engine keeps them once posted.

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
    /// A bind or LOCAL_INV: no packet, run by the requester (see `mw`).
    Local,
}

/// A send queue entry.
#[derive(Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: WrOperation,
    pub(crate) flags: SendFlags,
    /// Generates a completion on success (`SIGNALED` or `sq_sig_all`).
    pub(crate) signaled: bool,
    pub(crate) sges: Sges,
    /// INLINE data, copied at post time (manual 3.6 `IBV_SEND_INLINE`).
    pub(crate) inline: Option<Vec<u8>>,
    /// The message length: the sum of the SGE lengths.
    pub(crate) length: u32,
    /// The local memory the WQE reads from or writes to, resolved when it starts.
    pub(crate) local: Segments,
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
            _ => ReqKind::Atomic,
        }
    }

    pub(crate) fn is_rd_atomic(&self) -> bool {
        matches!(self.kind(), ReqKind::Read | ReqKind::Atomic)
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
