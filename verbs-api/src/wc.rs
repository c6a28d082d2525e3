//! Work completions: what `ibv_poll_cq` returns (manual 3.6.10 ibv_poll_cq,
//! `struct ibv_wc`).
//!
//! Names and numeric values follow libibverbs' `verbs.h`; the `Display` text of
//! [`WcStatus`] is exactly that of `ibv_wc_status_str`.

use core::fmt;

bitflags::bitflags! {
    /// `enum ibv_wc_flags`: which optional fields of a [`WorkCompletion`] are
    /// valid (manual 3.6.10 ibv_poll_cq, "wc_flags").
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: a Global Routing Header is present (UD receives; the
        /// GRH is in the first 40 bytes of the receive buffer).
        const GRH = 1 << 0;
        /// `IBV_WC_WITH_IMM`: [`WorkCompletion::imm_data`] is valid.
        const WITH_IMM = 1 << 1;
        /// `IBV_WC_IP_CSUM_OK`: the hardware verified the IP checksum.
        const IP_CSUM_OK = 1 << 2;
        /// `IBV_WC_WITH_INV`: [`WorkCompletion::invalidated_rkey`] is valid
        /// (a SEND with Invalidate was received).
        const WITH_INV = 1 << 3;
        /// `IBV_WC_TM_SYNC_REQ`: tag matching, sync requested.
        const TM_SYNC_REQ = 1 << 4;
        /// `IBV_WC_TM_MATCH`: tag matching, the message matched a tag.
        const TM_MATCH = 1 << 5;
        /// `IBV_WC_TM_DATA_VALID`: tag matching, the data was placed.
        const TM_DATA_VALID = 1 << 6;
    }
}

verbs_enum! {
    /// `enum ibv_wc_status`: the outcome of a work request (manual 3.6.10
    /// ibv_poll_cq, "status"). Only [`WcStatus::Success`] completions carry
    /// meaningful `opcode`, `byte_len` and flags; for errors only `wr_id`,
    /// `status`, `qp_num` and `vendor_err` are defined.
    pub enum WcStatus ("ibv_wc_status") {
        /// `IBV_WC_SUCCESS`.
        Success = 0,
        /// `IBV_WC_LOC_LEN_ERR`: local length error (e.g. a received message
        /// longer than the receive buffer).
        LocLenErr = 1,
        /// `IBV_WC_LOC_QP_OP_ERR`: local QP operation error.
        LocQpOpErr = 2,
        /// `IBV_WC_LOC_EEC_OP_ERR`: local EE context operation error (RD only).
        LocEecOpErr = 3,
        /// `IBV_WC_LOC_PROT_ERR`: local protection error (bad lkey or access).
        LocProtErr = 4,
        /// `IBV_WC_WR_FLUSH_ERR`: the WR was flushed because the QP is in Error.
        WrFlushErr = 5,
        /// `IBV_WC_MW_BIND_ERR`: memory window bind / memory management error.
        MwBindErr = 6,
        /// `IBV_WC_BAD_RESP_ERR`: unexpected transport response.
        BadRespErr = 7,
        /// `IBV_WC_LOC_ACCESS_ERR`: local access error (e.g. a remote write
        /// into a region without the needed access, seen by the responder).
        LocAccessErr = 8,
        /// `IBV_WC_REM_INV_REQ_ERR`: the responder saw an invalid request.
        RemInvReqErr = 9,
        /// `IBV_WC_REM_ACCESS_ERR`: remote access error (rkey, range or rights).
        RemAccessErr = 10,
        /// `IBV_WC_REM_OP_ERR`: the responder could not complete the operation.
        RemOpErr = 11,
        /// `IBV_WC_RETRY_EXC_ERR`: transport retry counter exceeded.
        RetryExcErr = 12,
        /// `IBV_WC_RNR_RETRY_EXC_ERR`: RNR retry counter exceeded.
        RnrRetryExcErr = 13,
        /// `IBV_WC_LOC_RDD_VIOL_ERR`: local RDD violation (RD only).
        LocRddViolErr = 14,
        /// `IBV_WC_REM_INV_RD_REQ_ERR`: remote invalid RD request.
        RemInvRdReqErr = 15,
        /// `IBV_WC_REM_ABORT_ERR`: the remote side aborted the operation.
        RemAbortErr = 16,
        /// `IBV_WC_INV_EECN_ERR`: invalid EE context number (RD only).
        InvEecnErr = 17,
        /// `IBV_WC_INV_EEC_STATE_ERR`: invalid EE context state (RD only).
        InvEecStateErr = 18,
        /// `IBV_WC_FATAL_ERR`: fatal error.
        FatalErr = 19,
        /// `IBV_WC_RESP_TIMEOUT_ERR`: response timeout.
        RespTimeoutErr = 20,
        /// `IBV_WC_GENERAL_ERR`: general error.
        GeneralErr = 21,
        /// `IBV_WC_TM_ERR`: tag matching error.
        TmErr = 22,
        /// `IBV_WC_TM_RNDV_INCOMPLETE`: tag matching rendezvous left to software.
        TmRndvIncomplete = 23,
    }
}

impl WcStatus {
    /// True for [`WcStatus::Success`].
    #[must_use]
    pub const fn is_success(self) -> bool {
        matches!(self, WcStatus::Success)
    }

    /// The text `ibv_wc_status_str` returns for this status.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
            WcStatus::TmErr => "TM error",
            WcStatus::TmRndvIncomplete => "TM software rendezvous",
        }
    }
}

impl Default for WcStatus {
    /// [`WcStatus::Success`] (value 0).
    fn default() -> Self {
        WcStatus::Success
    }
}

impl fmt::Display for WcStatus {
    /// Exactly `ibv_wc_status_str`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

verbs_enum! {
    /// `enum ibv_wc_opcode`: the operation a successful completion reports
    /// (manual 3.6.10 ibv_poll_cq, "opcode"). Receive-side opcodes have bit 7
    /// (`IBV_WC_RECV`) set; see [`WcOpcode::is_recv`].
    pub enum WcOpcode ("ibv_wc_opcode") {
        /// `IBV_WC_SEND`: a SEND (with or without immediate / invalidate).
        Send = 0,
        /// `IBV_WC_RDMA_WRITE`: an RDMA WRITE (with or without immediate).
        RdmaWrite = 1,
        /// `IBV_WC_RDMA_READ`.
        RdmaRead = 2,
        /// `IBV_WC_COMP_SWAP`: atomic compare and swap.
        CompSwap = 3,
        /// `IBV_WC_FETCH_ADD`: atomic fetch and add.
        FetchAdd = 4,
        /// `IBV_WC_BIND_MW`: memory window bind.
        BindMw = 5,
        /// `IBV_WC_LOCAL_INV`: local invalidate.
        LocalInv = 6,
        /// `IBV_WC_TSO`: TCP segmentation offload send (raw packet QPs).
        Tso = 7,
        /// `IBV_WC_FLUSH`: RDMA FLUSH.
        Flush = 8,
        /// `IBV_WC_ATOMIC_WRITE`: RDMA ATOMIC WRITE.
        AtomicWrite = 9,
        /// `IBV_WC_RECV`: a receive WR consumed by a SEND.
        Recv = 1 << 7,
        /// `IBV_WC_RECV_RDMA_WITH_IMM`: a receive WR consumed by an RDMA WRITE
        /// with immediate.
        RecvRdmaWithImm = (1 << 7) + 1,
        /// `IBV_WC_TM_ADD`: tag matching, tag added.
        TmAdd = (1 << 7) + 2,
        /// `IBV_WC_TM_DEL`: tag matching, tag removed.
        TmDel = (1 << 7) + 3,
        /// `IBV_WC_TM_SYNC`: tag matching, sync.
        TmSync = (1 << 7) + 4,
        /// `IBV_WC_TM_RECV`: tag matching, receive.
        TmRecv = (1 << 7) + 5,
        /// `IBV_WC_TM_NO_TAG`: tag matching, unexpected message without tag.
        TmNoTag = (1 << 7) + 6,
        /// `IBV_WC_DRIVER1`: driver-specific.
        Driver1 = (1 << 7) + 7,
        /// `IBV_WC_DRIVER2`: driver-specific.
        Driver2 = (1 << 7) + 8,
        /// `IBV_WC_DRIVER3`: driver-specific.
        Driver3 = (1 << 7) + 9,
    }
}

impl WcOpcode {
    /// True for receive-side completions (`opcode & IBV_WC_RECV` in C).
    #[must_use]
    pub const fn is_recv(self) -> bool {
        self.as_u32() & WcOpcode::Recv.as_u32() != 0
    }
}

/// `struct ibv_wc`: one completion (manual 3.6.10 ibv_poll_cq).
///
/// Only `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful when
/// `status` is not [`WcStatus::Success`].
///
/// libibverbs overlays `imm_data` and `invalidated_rkey` in a union selected by
/// `wc_flags`; here both are fields and the flag says which one is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The `wr_id` of the completed work request, as given to post_send or
    /// post_recv.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// The operation that completed (valid on success).
    pub opcode: WcOpcode,
    /// Vendor-specific error syndrome.
    pub vendor_err: u32,
    /// Number of bytes transferred (receive completions; also RDMA READ and
    /// atomics on the requester).
    pub byte_len: u32,
    /// Immediate data, valid when `wc_flags` has [`WcFlags::WITH_IMM`]: the 32
    /// bits as carried on the wire, in host order — i.e. `ntohl()` of
    /// libibverbs' `__be32 imm_data`, so `imm_data.to_be_bytes()` are the wire
    /// bytes.
    pub imm_data: u32,
    /// The rkey invalidated by a received SEND with Invalidate; valid when
    /// `wc_flags` has [`WcFlags::WITH_INV`].
    pub invalidated_rkey: u32,
    /// The local QP number this completion belongs to.
    pub qp_num: u32,
    /// The remote QP number (UD receives).
    pub src_qp: u32,
    /// Which optional fields are valid.
    pub wc_flags: WcFlags,
    /// P_Key index (valid only for GSI QPs).
    pub pkey_index: u16,
    /// Source LID (UD receives).
    pub slid: u16,
    /// Service level (UD receives).
    pub sl: u8,
    /// Destination LID path bits (UD receives).
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    /// A completion with the given identity and outcome; every other field is
    /// zero and `wc_flags` is empty.
    #[must_use]
    pub const fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: 0,
            qp_num,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }

    /// The immediate data, if [`WcFlags::WITH_IMM`] is set.
    #[must_use]
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_IMM)
            .then_some(self.imm_data)
    }

    /// The invalidated rkey, if [`WcFlags::WITH_INV`] is set.
    #[must_use]
    pub fn invalidated(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_INV)
            .then_some(self.invalidated_rkey)
    }
}

impl Default for WorkCompletion {
    /// All zero, like a zeroed `struct ibv_wc`: `Success`, opcode `Send`.
    fn default() -> Self {
        WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_match_libibverbs() {
        assert_eq!(WcStatus::ALL.len(), 24);
        for (i, s) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(s.as_u32() as usize, i, "{s:?}");
            assert_eq!(WcStatus::try_from(s.as_u32()), Ok(*s));
            assert_eq!(u32::from(*s), s.as_u32());
        }
        assert_eq!(WcStatus::WrFlushErr as u32, 5);
        assert_eq!(WcStatus::RnrRetryExcErr as u32, 13);
        assert_eq!(WcStatus::GeneralErr as u32, 21);
        assert!(WcStatus::try_from(24).is_err());
        assert!(WcStatus::try_from(u32::MAX).is_err());
    }

    #[test]
    fn status_strings_match_ibv_wc_status_str() {
        assert_eq!(WcStatus::Success.to_string(), "success");
        assert_eq!(WcStatus::LocLenErr.to_string(), "local length error");
        assert_eq!(
            WcStatus::WrFlushErr.to_string(),
            "Work Request Flushed Error"
        );
        assert_eq!(
            WcStatus::MwBindErr.to_string(),
            "memory management operation error"
        );
        assert_eq!(WcStatus::RemAccessErr.to_string(), "remote access error");
        assert_eq!(
            WcStatus::RetryExcErr.to_string(),
            "transport retry counter exceeded"
        );
        assert_eq!(
            WcStatus::RnrRetryExcErr.to_string(),
            "RNR retry counter exceeded"
        );
        assert_eq!(WcStatus::RemAbortErr.to_string(), "aborted error");
        assert_eq!(WcStatus::GeneralErr.to_string(), "general error");
        let mut seen = std::collections::HashSet::new();
        assert!(
            WcStatus::ALL.iter().all(|s| seen.insert(s.as_str())),
            "strings are distinct"
        );
    }

    #[test]
    fn success_predicate() {
        assert!(WcStatus::Success.is_success());
        assert!(WcStatus::ALL[1..].iter().all(|s| !s.is_success()));
    }

    #[test]
    fn opcode_values_match_libibverbs() {
        let expect = [
            (WcOpcode::Send, 0),
            (WcOpcode::RdmaWrite, 1),
            (WcOpcode::RdmaRead, 2),
            (WcOpcode::CompSwap, 3),
            (WcOpcode::FetchAdd, 4),
            (WcOpcode::BindMw, 5),
            (WcOpcode::LocalInv, 6),
            (WcOpcode::Tso, 7),
            (WcOpcode::Flush, 8),
            (WcOpcode::AtomicWrite, 9),
            (WcOpcode::Recv, 128),
            (WcOpcode::RecvRdmaWithImm, 129),
            (WcOpcode::TmAdd, 130),
            (WcOpcode::TmNoTag, 134),
            (WcOpcode::Driver1, 135),
            (WcOpcode::Driver3, 137),
        ];
        for (op, v) in expect {
            assert_eq!(op.as_u32(), v);
        }
        for op in WcOpcode::ALL {
            assert_eq!(WcOpcode::try_from(op.as_u32()), Ok(*op));
            assert_eq!(op.is_recv(), op.as_u32() >= 128);
        }
        assert!(WcOpcode::try_from(10).is_err());
        assert!(WcOpcode::try_from(138).is_err());
    }

    #[test]
    fn flag_values_match_libibverbs() {
        assert_eq!(WcFlags::GRH.bits(), 1);
        assert_eq!(WcFlags::WITH_IMM.bits(), 2);
        assert_eq!(WcFlags::IP_CSUM_OK.bits(), 4);
        assert_eq!(WcFlags::WITH_INV.bits(), 8);
        assert_eq!(WcFlags::TM_SYNC_REQ.bits(), 16);
        assert_eq!(WcFlags::TM_MATCH.bits(), 32);
        assert_eq!(WcFlags::TM_DATA_VALID.bits(), 64);
    }

    #[test]
    fn new_zeroes_the_rest() {
        let wc = WorkCompletion::new(7, WcStatus::Success, WcOpcode::Recv, 0x11);
        assert_eq!(
            (wc.wr_id, wc.qp_num, wc.byte_len, wc.imm_data),
            (7, 0x11, 0, 0)
        );
        assert!(wc.wc_flags.is_empty());
        assert_eq!(wc.imm(), None);
        let wc = WorkCompletion {
            imm_data: 0xdead_beef,
            wc_flags: WcFlags::WITH_IMM,
            ..wc
        };
        assert_eq!(wc.imm(), Some(0xdead_beef));
        assert_eq!(wc.invalidated(), None);
        assert_eq!(
            WorkCompletion::default(),
            WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0)
        );
    }
}
