//! Work requests: what ibv_post_send and ibv_post_recv take (manual 2.1
//! Available Communication Operations, 2.3.1 Send Request, 2.3.2 Receive
//! Request, 2.3.10 Scatter Gather, 3.6.4 ibv_post_recv, 3.6.5 ibv_post_send).
//!
//! libibverbs' `struct ibv_send_wr` has an `opcode` and a union of per-opcode
//! fields (`wr.rdma`, `wr.atomic`, `wr.ud`, `bind_mw`, `invalidate_rkey`,
//! `imm_data`). Here the opcode and its fields are one enum, [`WrOperation`],
//! so a WR cannot carry fields its opcode does not use; [`WrOpcode`] is still
//! available through [`WrOperation::opcode`]. The UD destination, which
//! libibverbs keeps in the same union, is [`SendWr::ud`].

use crate::mr::AccessFlags;
use crate::wc::WcOpcode;

/// `struct ibv_sge`: one scatter/gather element (manual 3.6.4 ibv_post_recv,
/// 2.3.10 Scatter Gather).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Start address, a virtual address inside a registered memory region.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region (from ibv_reg_mr).
    pub lkey: u32,
}

impl Sge {
    /// An SGE of `length` bytes at `addr` in the region with `lkey`.
    #[must_use]
    pub const fn new(addr: u64, length: u32, lkey: u32) -> Sge {
        Sge { addr, length, lkey }
    }
}

/// The total length in bytes of a scatter/gather list, as a `u64` so that it
/// cannot overflow (a message is limited to 2^31 bytes by IBTA; checking that
/// is the device's job).
#[must_use]
pub fn sg_total_len(sg_list: &[Sge]) -> u64 {
    sg_list.iter().map(|s| u64::from(s.length)).sum()
}

bitflags::bitflags! {
    /// `enum ibv_send_flags` (manual 3.6.5 ibv_post_send, "send flags").
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE`: wait for earlier RDMA READ and atomic operations
        /// to complete before starting this WR.
        const FENCE = 1 << 0;
        /// `IBV_SEND_SIGNALED`: generate a completion for this WR (only
        /// meaningful when the QP was created with `sq_sig_all` = 0).
        const SIGNALED = 1 << 1;
        /// `IBV_SEND_SOLICITED`: set the solicited event indicator.
        const SOLICITED = 1 << 2;
        /// `IBV_SEND_INLINE`: copy the data of `sg_list` at post time; the
        /// buffers may be reused as soon as the post call returns and need no
        /// lkey check.
        const INLINE = 1 << 3;
        /// `IBV_SEND_IP_CSUM`: offload the IP checksum (UD / raw packet).
        const IP_CSUM = 1 << 4;
    }
}

verbs_enum! {
    /// `enum ibv_wr_opcode` (manual 3.6.5 ibv_post_send, "opcode").
    pub enum WrOpcode ("ibv_wr_opcode") {
        /// `IBV_WR_RDMA_WRITE`.
        RdmaWrite = 0,
        /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
        RdmaWriteWithImm = 1,
        /// `IBV_WR_SEND`.
        Send = 2,
        /// `IBV_WR_SEND_WITH_IMM`.
        SendWithImm = 3,
        /// `IBV_WR_RDMA_READ`.
        RdmaRead = 4,
        /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
        AtomicCmpAndSwp = 5,
        /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
        AtomicFetchAndAdd = 6,
        /// `IBV_WR_LOCAL_INV`.
        LocalInv = 7,
        /// `IBV_WR_BIND_MW`.
        BindMw = 8,
        /// `IBV_WR_SEND_WITH_INV`.
        SendWithInv = 9,
        /// `IBV_WR_TSO`.
        Tso = 10,
        /// `IBV_WR_DRIVER1`.
        Driver1 = 11,
        /// `IBV_WR_FLUSH`.
        Flush = 14,
        /// `IBV_WR_ATOMIC_WRITE`.
        AtomicWrite = 15,
    }
}

impl WrOpcode {
    /// The text `ibv_wr_opcode_str` returns, e.g. `"rdma-write-with-imm"`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            WrOpcode::RdmaWrite => "rdma-write",
            WrOpcode::RdmaWriteWithImm => "rdma-write-with-imm",
            WrOpcode::Send => "send",
            WrOpcode::SendWithImm => "send-with-imm",
            WrOpcode::RdmaRead => "rdma-read",
            WrOpcode::AtomicCmpAndSwp => "atomic-cmp-and-swp",
            WrOpcode::AtomicFetchAndAdd => "atomic-fetch-and-add",
            WrOpcode::LocalInv => "local-inv",
            WrOpcode::BindMw => "bind-mw",
            WrOpcode::SendWithInv => "send-with-inv",
            WrOpcode::Tso => "tso",
            WrOpcode::Driver1 => "driver1",
            WrOpcode::Flush => "flush",
            WrOpcode::AtomicWrite => "atomic-write",
        }
    }
}

impl core::fmt::Display for WrOpcode {
    /// Exactly `ibv_wr_opcode_str`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

bitflags::bitflags! {
    /// `enum ibv_placement_type`: what an RDMA FLUSH makes of the data it covers
    /// (IBTA 1.5, FETH placement type; the `type` of `ibv_wr_flush`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct FlushPlacement: u8 {
        /// `IBV_FLUSH_GLOBAL`: globally visible. The target memory region needs
        /// [`AccessFlags::FLUSH_GLOBAL`](crate::AccessFlags::FLUSH_GLOBAL).
        const GLOBAL = 1 << 0;
        /// `IBV_FLUSH_PERSISTENT`: persistent. The target memory region needs
        /// [`AccessFlags::FLUSH_PERSISTENT`](crate::AccessFlags::FLUSH_PERSISTENT).
        const PERSISTENT = 1 << 1;
    }
}

verbs_enum! {
    /// `enum ibv_selectivity_level`: what an RDMA FLUSH covers (IBTA 1.5, FETH
    /// selectivity level; the `level` of `ibv_wr_flush`).
    pub enum FlushLevel ("ibv_selectivity_level") {
        /// `IBV_FLUSH_RANGE`: the range `[remote_addr, remote_addr + length)`.
        Range = 0,
        /// `IBV_FLUSH_MR`: the whole memory region the rkey names; the address and
        /// length are not looked at.
        Mr = 1,
    }
}

/// `struct ibv_mw_bind_info`: what a type 2 memory window is bound to (the
/// `bind_mw.bind_info` of a BIND_MW work request; manual 2.3.5 Memory Window).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MwBindInfo {
    /// lkey of the MR the window lies in (libibverbs passes the `ibv_mr`).
    pub mr_lkey: u32,
    /// Start address of the window.
    pub addr: u64,
    /// Length of the window in bytes (0 unbinds).
    pub length: u64,
    /// Access the window grants (REMOTE_* flags, ZERO_BASED).
    pub mw_access_flags: AccessFlags,
}

/// The operation of a send work request and the fields it uses: libibverbs'
/// `opcode` together with the matching part of the `wr` union, `imm_data` and
/// `invalidate_rkey` (manual 2.1, 3.6.5 ibv_post_send).
///
/// Immediate data is the 32-bit value as carried on the wire, in host order
/// (`ntohl()` of libibverbs' `__be32 imm_data`); it arrives unchanged in the
/// receiver's [`crate::WorkCompletion::imm_data`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WrOperation {
    /// `IBV_WR_SEND`: consumes a receive WR at the peer (manual 2.1.1).
    Send,
    /// `IBV_WR_SEND_WITH_IMM`: SEND plus 32 bits of immediate data.
    SendWithImm {
        /// Immediate data.
        imm_data: u32,
    },
    /// `IBV_WR_SEND_WITH_INV`: SEND that also invalidates `invalidate_rkey`
    /// at the responder.
    SendWithInv {
        /// The remote key to invalidate.
        invalidate_rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE`: write into remote memory (manual 2.1.4).
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: RDMA WRITE that also consumes a receive
    /// WR at the peer and delivers immediate data.
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm_data: u32,
    },
    /// `IBV_WR_RDMA_READ`: read remote memory into the local SGEs
    /// (manual 2.1.3).
    RdmaRead {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: if the remote 64-bit word equals
    /// `compare`, replace it with `swap`; the original value is returned into
    /// the (8-byte) local SGE (manual 2.1.5).
    AtomicCmpAndSwp {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to compare with.
        compare: u64,
        /// Value to store if equal.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: add `add` to the remote 64-bit word;
    /// the original value is returned into the local SGE (manual 2.1.5).
    AtomicFetchAndAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add (wrapping).
        add: u64,
    },
    /// `IBV_WR_LOCAL_INV`: invalidate a local MR or MW key.
    LocalInv {
        /// The key to invalidate.
        invalidate_rkey: u32,
    },
    /// `IBV_WR_BIND_MW`: bind a type 2 memory window.
    BindMw {
        /// Names the window: an rkey of it, of which the index (the upper 24 bits)
        /// counts (libibverbs passes the `ibv_mw`, whose `rkey` it reads).
        mw_rkey: u32,
        /// The rkey the window has after the bind. Of a type 2 window's, only the low
        /// byte (the key the consumer owns) counts: the index stays the window's (IBTA
        /// 10.6.7.2; kernel rxe, mlx5 and irdma take the low 8 bits).
        new_rkey: u32,
        /// What the window is bound to.
        bind_info: MwBindInfo,
    },
    /// `IBV_WR_ATOMIC_WRITE` (`ibv_wr_atomic_write`, IBTA 1.5): write 8 bytes to an
    /// 8-byte aligned remote address as one unit, with remote write access. The data
    /// travel in the request; the WR's scatter/gather list must be empty.
    AtomicWrite {
        /// Remote virtual address (8-byte aligned, checked by the responder).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// The 8 bytes, in the order they land in remote memory.
        data: [u8; 8],
    },
    /// `IBV_WR_FLUSH` (`ibv_wr_flush`, IBTA 1.5): make earlier writes to a remote range
    /// or region globally visible or persistent; completes once they are. The WR's
    /// scatter/gather list must be empty.
    Flush {
        /// Remote virtual address (not looked at with [`FlushLevel::Mr`]).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Length of the range (not looked at with [`FlushLevel::Mr`]).
        length: u32,
        /// What to make of the data: one or both of the placement types.
        placement: FlushPlacement,
        /// Over what.
        level: FlushLevel,
    },
}

impl WrOperation {
    /// The libibverbs opcode of this operation.
    #[must_use]
    pub const fn opcode(&self) -> WrOpcode {
        match self {
            WrOperation::Send => WrOpcode::Send,
            WrOperation::SendWithImm { .. } => WrOpcode::SendWithImm,
            WrOperation::SendWithInv { .. } => WrOpcode::SendWithInv,
            WrOperation::RdmaWrite { .. } => WrOpcode::RdmaWrite,
            WrOperation::RdmaWriteWithImm { .. } => WrOpcode::RdmaWriteWithImm,
            WrOperation::RdmaRead { .. } => WrOpcode::RdmaRead,
            WrOperation::AtomicCmpAndSwp { .. } => WrOpcode::AtomicCmpAndSwp,
            WrOperation::AtomicFetchAndAdd { .. } => WrOpcode::AtomicFetchAndAdd,
            WrOperation::LocalInv { .. } => WrOpcode::LocalInv,
            WrOperation::BindMw { .. } => WrOpcode::BindMw,
            WrOperation::AtomicWrite { .. } => WrOpcode::AtomicWrite,
            WrOperation::Flush { .. } => WrOpcode::Flush,
        }
    }

    /// The opcode of the requester-side completion of this operation (what
    /// ibv_poll_cq reports for the send WR; manual 3.6.10).
    #[must_use]
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            WrOperation::Send
            | WrOperation::SendWithImm { .. }
            | WrOperation::SendWithInv { .. } => WcOpcode::Send,
            WrOperation::RdmaWrite { .. } | WrOperation::RdmaWriteWithImm { .. } => {
                WcOpcode::RdmaWrite
            }
            WrOperation::RdmaRead { .. } => WcOpcode::RdmaRead,
            WrOperation::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
            WrOperation::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
            WrOperation::LocalInv { .. } => WcOpcode::LocalInv,
            WrOperation::BindMw { .. } => WcOpcode::BindMw,
            WrOperation::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            WrOperation::Flush { .. } => WcOpcode::Flush,
        }
    }

    /// The immediate data, for the `*WithImm` operations.
    #[must_use]
    pub const fn imm_data(&self) -> Option<u32> {
        match self {
            WrOperation::SendWithImm { imm_data }
            | WrOperation::RdmaWriteWithImm { imm_data, .. } => Some(*imm_data),
            _ => None,
        }
    }

    /// The remote address and rkey, for RDMA and atomic operations.
    #[must_use]
    pub const fn remote(&self) -> Option<(u64, u32)> {
        match self {
            WrOperation::RdmaWrite { remote_addr, rkey }
            | WrOperation::RdmaWriteWithImm {
                remote_addr, rkey, ..
            }
            | WrOperation::RdmaRead { remote_addr, rkey }
            | WrOperation::AtomicCmpAndSwp {
                remote_addr, rkey, ..
            }
            | WrOperation::AtomicFetchAndAdd {
                remote_addr, rkey, ..
            }
            | WrOperation::AtomicWrite {
                remote_addr, rkey, ..
            }
            | WrOperation::Flush {
                remote_addr, rkey, ..
            } => Some((*remote_addr, *rkey)),
            _ => None,
        }
    }

    /// True for SEND, SEND with immediate / invalidate: operations that
    /// consume a receive WR at the peer and carry data from the SGEs.
    #[must_use]
    pub const fn is_send(&self) -> bool {
        matches!(
            self,
            WrOperation::Send | WrOperation::SendWithImm { .. } | WrOperation::SendWithInv { .. }
        )
    }

    /// True for the two atomic operations.
    #[must_use]
    pub const fn is_atomic(&self) -> bool {
        matches!(
            self,
            WrOperation::AtomicCmpAndSwp { .. } | WrOperation::AtomicFetchAndAdd { .. }
        )
    }

    /// True for operations that take a responder resource and so count against
    /// `max_rd_atomic` / `max_dest_rd_atomic`: RDMA READ, the atomics, and (IBTA
    /// 1.5) ATOMIC WRITE and FLUSH, which are answered by a READ response.
    #[must_use]
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            WrOperation::RdmaRead { .. }
                | WrOperation::AtomicWrite { .. }
                | WrOperation::Flush { .. }
        ) || self.is_atomic()
    }

    /// True if the operation consumes a receive WR at the responder (SENDs and
    /// RDMA WRITE with immediate).
    #[must_use]
    pub const fn consumes_recv_wr(&self) -> bool {
        self.is_send() || matches!(self, WrOperation::RdmaWriteWithImm { .. })
    }
}

/// The destination of a UD send: libibverbs' `wr.ud` (manual 3.6.5
/// ibv_post_send).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct UdDest {
    /// The address handle of the destination (`Device::create_ah`).
    pub ah: crate::AhId,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Q_Key to put in the DETH (if its top bit is set, the QP's own Q_Key is
    /// used instead, per IBTA Vol 1).
    pub remote_qkey: u32,
}

/// A scatter/gather list: up to one element inline (a WR with one SGE, the common
/// case, allocates nothing), more on the heap. Made from one [`Sge`], an array, or a
/// `Vec`: `SendWr::send(1, mr.sge(0, 64))`, `RecvWr::new(2, vec![a, b])`.
pub type SgList = smallvec::SmallVec<[Sge; 1]>;

impl From<Sge> for SgList {
    fn from(sge: Sge) -> SgList {
        smallvec::smallvec![sge]
    }
}

/// `struct ibv_send_wr` (manual 3.6.5 ibv_post_send). A list of these is
/// posted as a slice; the index of the first rejected WR is reported in
/// [`crate::PostError::index`] (libibverbs' `bad_wr`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SendWr {
    /// User-chosen identifier, returned in the completion.
    pub wr_id: u64,
    /// Gather list (data to send or write; destination of READ and atomic
    /// results).
    pub sg_list: SgList,
    /// The operation and its fields.
    pub op: WrOperation,
    /// Send flags.
    pub send_flags: SendFlags,
    /// Destination for UD QPs; `None` for connected QPs.
    pub ud: Option<UdDest>,
    /// The XRC SRQ number at the target (`wr.qp_type.xrc.remote_srqn`,
    /// `ibv_wr_set_xrc_srqn`); needed on an XRC send QP, ignored on the others.
    pub xrc_remote_srqn: Option<u32>,
}

impl SendWr {
    /// A WR with the given operation, no flags and no UD destination.
    #[must_use]
    pub fn new(wr_id: u64, sg_list: impl Into<SgList>, op: WrOperation) -> SendWr {
        SendWr {
            wr_id,
            sg_list: sg_list.into(),
            op,
            send_flags: SendFlags::empty(),
            ud: None,
            xrc_remote_srqn: None,
        }
    }

    /// A SEND.
    #[must_use]
    pub fn send(wr_id: u64, sg_list: impl Into<SgList>) -> SendWr {
        SendWr::new(wr_id, sg_list, WrOperation::Send)
    }

    /// A SEND with immediate data.
    #[must_use]
    pub fn send_with_imm(wr_id: u64, sg_list: impl Into<SgList>, imm_data: u32) -> SendWr {
        SendWr::new(wr_id, sg_list, WrOperation::SendWithImm { imm_data })
    }

    /// The same WR addressed to XRC SRQ `srqn` at the target (for an XRC send QP).
    #[must_use]
    pub fn with_xrc_srqn(mut self, srqn: u32) -> SendWr {
        self.xrc_remote_srqn = Some(srqn);
        self
    }

    /// An RDMA WRITE of the gather list to `remote_addr` under `rkey`.
    #[must_use]
    pub fn rdma_write(
        wr_id: u64,
        sg_list: impl Into<SgList>,
        remote_addr: u64,
        rkey: u32,
    ) -> SendWr {
        SendWr::new(wr_id, sg_list, WrOperation::RdmaWrite { remote_addr, rkey })
    }

    /// An RDMA WRITE with immediate data.
    #[must_use]
    pub fn rdma_write_with_imm(
        wr_id: u64,
        sg_list: impl Into<SgList>,
        remote_addr: u64,
        rkey: u32,
        imm_data: u32,
    ) -> SendWr {
        SendWr::new(
            wr_id,
            sg_list,
            WrOperation::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm_data,
            },
        )
    }

    /// An RDMA READ from `remote_addr` under `rkey` into the scatter list.
    #[must_use]
    pub fn rdma_read(
        wr_id: u64,
        sg_list: impl Into<SgList>,
        remote_addr: u64,
        rkey: u32,
    ) -> SendWr {
        SendWr::new(wr_id, sg_list, WrOperation::RdmaRead { remote_addr, rkey })
    }

    /// An atomic compare-and-swap; `result` receives the original value.
    #[must_use]
    pub fn atomic_cmp_swp(
        wr_id: u64,
        result: Sge,
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    ) -> SendWr {
        SendWr::new(
            wr_id,
            result,
            WrOperation::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            },
        )
    }

    /// An atomic fetch-and-add; `result` receives the original value.
    #[must_use]
    pub fn atomic_fetch_add(
        wr_id: u64,
        result: Sge,
        remote_addr: u64,
        rkey: u32,
        add: u64,
    ) -> SendWr {
        SendWr::new(
            wr_id,
            result,
            WrOperation::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add,
            },
        )
    }

    /// An ATOMIC WRITE (IBTA 1.5) of `data` to `remote_addr`; no local memory.
    #[must_use]
    pub fn atomic_write(wr_id: u64, remote_addr: u64, rkey: u32, data: [u8; 8]) -> SendWr {
        SendWr::new(
            wr_id,
            SgList::new(),
            WrOperation::AtomicWrite {
                remote_addr,
                rkey,
                data,
            },
        )
    }

    /// A FLUSH (IBTA 1.5) of `length` bytes at `remote_addr` (or of the whole region
    /// with [`FlushLevel::Mr`]); no local memory.
    #[must_use]
    pub fn flush(
        wr_id: u64,
        remote_addr: u64,
        rkey: u32,
        length: u32,
        placement: FlushPlacement,
        level: FlushLevel,
    ) -> SendWr {
        SendWr::new(
            wr_id,
            SgList::new(),
            WrOperation::Flush {
                remote_addr,
                rkey,
                length,
                placement,
                level,
            },
        )
    }

    /// Replaces the send flags.
    #[must_use]
    pub fn with_flags(mut self, flags: SendFlags) -> SendWr {
        self.send_flags = flags;
        self
    }

    /// Adds [`SendFlags::SIGNALED`].
    #[must_use]
    pub fn signaled(mut self) -> SendWr {
        self.send_flags |= SendFlags::SIGNALED;
        self
    }

    /// Adds immediate data: SEND becomes SEND with immediate and RDMA WRITE
    /// becomes RDMA WRITE with immediate; on a `*WithImm` operation the value
    /// is replaced. Other operations carry no immediate data and are returned
    /// unchanged.
    #[must_use]
    pub fn with_imm(mut self, imm: u32) -> SendWr {
        self.op = match self.op {
            WrOperation::Send | WrOperation::SendWithImm { .. } => {
                WrOperation::SendWithImm { imm_data: imm }
            }
            WrOperation::RdmaWrite { remote_addr, rkey }
            | WrOperation::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } => WrOperation::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm_data: imm,
            },
            other => other,
        };
        self
    }

    /// Sets the UD destination.
    #[must_use]
    pub fn with_ud(mut self, ud: UdDest) -> SendWr {
        self.ud = Some(ud);
        self
    }

    /// The total length of the gather list in bytes.
    #[must_use]
    pub fn total_len(&self) -> u64 {
        sg_total_len(&self.sg_list)
    }
}

/// `struct ibv_recv_wr` (manual 3.6.4 ibv_post_recv): a receive buffer for
/// one incoming SEND or RDMA WRITE with immediate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecvWr {
    /// User-chosen identifier, returned in the completion.
    pub wr_id: u64,
    /// Scatter list the incoming message is written to.
    pub sg_list: SgList,
}

impl RecvWr {
    /// A receive WR.
    #[must_use]
    pub fn new(wr_id: u64, sg_list: impl Into<SgList>) -> RecvWr {
        RecvWr {
            wr_id,
            sg_list: sg_list.into(),
        }
    }

    /// The total length of the scatter list in bytes.
    #[must_use]
    pub fn total_len(&self) -> u64 {
        sg_total_len(&self.sg_list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ops() -> Vec<WrOperation> {
        vec![
            WrOperation::Send,
            WrOperation::SendWithImm { imm_data: 1 },
            WrOperation::SendWithInv { invalidate_rkey: 2 },
            WrOperation::RdmaWrite {
                remote_addr: 3,
                rkey: 4,
            },
            WrOperation::RdmaWriteWithImm {
                remote_addr: 3,
                rkey: 4,
                imm_data: 5,
            },
            WrOperation::RdmaRead {
                remote_addr: 3,
                rkey: 4,
            },
            WrOperation::AtomicCmpAndSwp {
                remote_addr: 8,
                rkey: 4,
                compare: 1,
                swap: 2,
            },
            WrOperation::AtomicFetchAndAdd {
                remote_addr: 8,
                rkey: 4,
                add: 1,
            },
            WrOperation::LocalInv { invalidate_rkey: 9 },
            WrOperation::BindMw {
                mw_rkey: 1,
                new_rkey: 2,
                bind_info: MwBindInfo::default(),
            },
            WrOperation::AtomicWrite {
                remote_addr: 8,
                rkey: 4,
                data: [1; 8],
            },
            WrOperation::Flush {
                remote_addr: 8,
                rkey: 4,
                length: 16,
                placement: FlushPlacement::GLOBAL,
                level: FlushLevel::Range,
            },
        ]
    }

    #[test]
    fn opcode_values_match_libibverbs() {
        for (i, op) in WrOpcode::ALL[..12].iter().enumerate() {
            assert_eq!(op.as_u32() as usize, i);
        }
        assert_eq!(WrOpcode::Flush.as_u32(), 14);
        assert_eq!(WrOpcode::AtomicWrite.as_u32(), 15);
        for op in WrOpcode::ALL {
            assert_eq!(WrOpcode::try_from(op.as_u32()), Ok(*op));
        }
        assert!(WrOpcode::try_from(12).is_err());
        assert!(WrOpcode::try_from(16).is_err());
        assert_eq!(
            WrOpcode::RdmaWriteWithImm.to_string(),
            "rdma-write-with-imm"
        );
        assert_eq!(
            WrOpcode::AtomicFetchAndAdd.to_string(),
            "atomic-fetch-and-add"
        );
    }

    #[test]
    fn send_flag_values() {
        assert_eq!(SendFlags::FENCE.bits(), 1);
        assert_eq!(SendFlags::SIGNALED.bits(), 2);
        assert_eq!(SendFlags::SOLICITED.bits(), 4);
        assert_eq!(SendFlags::INLINE.bits(), 8);
        assert_eq!(SendFlags::IP_CSUM.bits(), 16);
    }

    #[test]
    fn operation_opcodes() {
        let expect = [
            (WrOpcode::Send, WcOpcode::Send),
            (WrOpcode::SendWithImm, WcOpcode::Send),
            (WrOpcode::SendWithInv, WcOpcode::Send),
            (WrOpcode::RdmaWrite, WcOpcode::RdmaWrite),
            (WrOpcode::RdmaWriteWithImm, WcOpcode::RdmaWrite),
            (WrOpcode::RdmaRead, WcOpcode::RdmaRead),
            (WrOpcode::AtomicCmpAndSwp, WcOpcode::CompSwap),
            (WrOpcode::AtomicFetchAndAdd, WcOpcode::FetchAdd),
            (WrOpcode::LocalInv, WcOpcode::LocalInv),
            (WrOpcode::BindMw, WcOpcode::BindMw),
            (WrOpcode::AtomicWrite, WcOpcode::AtomicWrite),
            (WrOpcode::Flush, WcOpcode::Flush),
        ];
        for (op, (wr, wc)) in all_ops().iter().zip(expect) {
            assert_eq!((op.opcode(), op.wc_opcode()), (wr, wc), "{op:?}");
        }
    }

    #[test]
    fn operation_predicates() {
        let ops = all_ops();
        let count = |f: fn(&WrOperation) -> bool| ops.iter().filter(|o| f(o)).count();
        assert_eq!(count(WrOperation::is_send), 3);
        assert_eq!(count(WrOperation::is_atomic), 2);
        assert_eq!(count(WrOperation::is_read_or_atomic), 5);
        assert_eq!(count(WrOperation::consumes_recv_wr), 4);
        assert_eq!(
            ops.iter()
                .filter_map(WrOperation::imm_data)
                .collect::<Vec<_>>(),
            [1, 5]
        );
        assert_eq!(ops.iter().filter(|o| o.remote().is_some()).count(), 7);
    }

    #[test]
    fn constructors() {
        let sge = Sge::new(0x1000, 64, 7);
        let wr = SendWr::send(1, vec![sge, sge]).signaled().with_imm(0xabcd);
        assert_eq!(wr.op, WrOperation::SendWithImm { imm_data: 0xabcd });
        assert_eq!(wr.send_flags, SendFlags::SIGNALED);
        assert_eq!(wr.total_len(), 128);
        assert_eq!(wr.ud, None);
        let wr = SendWr::rdma_write(2, vec![sge], 0x2000, 9)
            .with_imm(5)
            .with_flags(SendFlags::INLINE);
        assert_eq!(
            wr.op,
            WrOperation::RdmaWriteWithImm {
                remote_addr: 0x2000,
                rkey: 9,
                imm_data: 5
            }
        );
        assert_eq!(wr.send_flags, SendFlags::INLINE);
        let rd = SendWr::rdma_read(3, vec![sge], 0x3000, 9).with_imm(5);
        assert_eq!(
            rd.op,
            WrOperation::RdmaRead {
                remote_addr: 0x3000,
                rkey: 9
            }
        );
        let fa = SendWr::atomic_fetch_add(4, Sge::new(0, 8, 1), 0x40, 2, 3);
        assert_eq!(fa.op.wc_opcode(), WcOpcode::FetchAdd);
        assert_eq!(RecvWr::new(5, vec![sge]).total_len(), 64);
        let big = vec![Sge::new(0, u32::MAX, 0); 3];
        assert_eq!(sg_total_len(&big), 3 * u64::from(u32::MAX));
    }

    #[test]
    fn one_sge_constructors_do_not_allocate() {
        let sge = Sge {
            addr: 0x1000,
            length: 8,
            lkey: 7,
        };
        for wr in [
            SendWr::send(1, sge),
            SendWr::rdma_write(2, sge, 0x2000, 3),
            SendWr::rdma_read(3, sge, 0x2000, 3),
            SendWr::atomic_fetch_add(4, sge, 0x2000, 3, 1),
            SendWr::atomic_cmp_swp(5, sge, 0x2000, 3, 1, 2),
        ] {
            assert!(!wr.sg_list.spilled(), "{wr:?}");
            assert_eq!(&wr.sg_list[..], &[sge]);
        }
        assert!(!RecvWr::new(6, sge).sg_list.spilled());
    }
}
