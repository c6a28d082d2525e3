//! Value conversions between the verbs-api types and libibverbs' C structs and enums
//! (safe code: building and reading plain C structs needs no `unsafe`; the few union
//! reads live in [`crate::sys`]).
//!
//! verbs-api gives every libibverbs enum and flag set the numeric values of `verbs.h`,
//! so most conversions are `as_u32()` / `try_from(u32)` / `bits()`. The tests below
//! check every one of those values against the constants bindgen generated from the
//! installed `infiniband/verbs.h`, so a mismatch fails the build's tests, not a run on
//! hardware.

use rdma_sys as ffi;
use verbs_api::{
    AccessFlags, AhAttr, AtomicCap, DeviceAttr, DeviceCapFlags, Gid, GlobalRoute, LinkLayer,
    MigState, Mtu, PortAttr, PortState, QpAttr, QpCap, QpState, Sge, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};

use crate::sys;

/// `struct ibv_ah_attr` from [`AhAttr`].
pub(crate) fn ah_attr_to_c(a: &AhAttr) -> ffi::ibv_ah_attr {
    ffi::ibv_ah_attr {
        grh: ffi::ibv_global_route {
            dgid: ffi::ibv_gid { raw: a.grh.dgid.0 },
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// [`AhAttr`] from `struct ibv_ah_attr`.
pub(crate) fn ah_attr_from_c(a: &ffi::ibv_ah_attr) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            dgid: Gid(sys::gid_bytes(&a.grh.dgid)),
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global != 0,
        port_num: a.port_num,
    }
}

/// `struct ibv_qp_cap` from [`QpCap`].
pub(crate) fn cap_to_c(c: &QpCap) -> ffi::ibv_qp_cap {
    ffi::ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// [`QpCap`] from `struct ibv_qp_cap`.
pub(crate) fn cap_from_c(c: &ffi::ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `struct ibv_sge` from [`Sge`].
pub(crate) fn sge_to_c(s: &Sge) -> ffi::ibv_sge {
    ffi::ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// `struct ibv_qp_attr` from [`QpAttr`]: every field, the mask says which are read.
pub(crate) fn qp_attr_to_c(a: &QpAttr) -> ffi::ibv_qp_attr {
    ffi::ibv_qp_attr {
        qp_state: a.qp_state.as_u32(),
        cur_qp_state: a.cur_qp_state.as_u32(),
        path_mtu: a.path_mtu.as_u32(),
        path_mig_state: a.path_mig_state.as_u32(),
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.bits(),
        cap: cap_to_c(&a.cap),
        ah_attr: ah_attr_to_c(&a.ah_attr),
        alt_ah_attr: ah_attr_to_c(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: u8::from(a.sq_draining),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    }
}

/// [`QpAttr`] from what `ibv_query_qp` filled in. An enum field outside its C range
/// (e.g. a `path_mtu` of 0 that a driver leaves in a QP never moved to RTR) takes
/// `QpAttr::default()`'s value for that field.
pub(crate) fn qp_attr_from_c(a: &ffi::ibv_qp_attr) -> QpAttr {
    let d = QpAttr::default();
    QpAttr {
        qp_state: QpState::try_from(a.qp_state).unwrap_or(QpState::Unknown),
        cur_qp_state: QpState::try_from(a.cur_qp_state).unwrap_or(QpState::Unknown),
        path_mtu: Mtu::try_from(a.path_mtu).unwrap_or(d.path_mtu),
        path_mig_state: MigState::try_from(a.path_mig_state).unwrap_or(d.path_mig_state),
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: AccessFlags::from_bits_retain(a.qp_access_flags),
        cap: cap_from_c(&a.cap),
        ah_attr: ah_attr_from_c(&a.ah_attr),
        alt_ah_attr: ah_attr_from_c(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        sq_draining: a.sq_draining != 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    }
}

/// A [`WorkCompletion`] from the fields of `struct ibv_wc`. `imm_or_inv` is the union
/// word: `imm_data` (network order) when `WITH_IMM` is set, `invalidated_rkey` when
/// `WITH_INV` is. An opcode outside `enum ibv_wc_opcode` (libibverbs leaves it undefined
/// on error completions) reads as `Send`; a status outside `enum ibv_wc_status` reads as
/// `GeneralErr` (`vendor_err` keeps the driver's syndrome).
#[allow(clippy::too_many_arguments)]
pub(crate) fn wc_from_c(
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    imm_or_inv: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
) -> WorkCompletion {
    let flags = WcFlags::from_bits_retain(wc_flags);
    WorkCompletion {
        wr_id,
        status: WcStatus::try_from(status).unwrap_or(WcStatus::GeneralErr),
        opcode: WcOpcode::try_from(opcode).unwrap_or(WcOpcode::Send),
        vendor_err,
        byte_len,
        imm_data: if flags.contains(WcFlags::WITH_IMM) {
            u32::from_be(imm_or_inv)
        } else {
            0
        },
        invalidated_rkey: if flags.contains(WcFlags::WITH_INV) {
            imm_or_inv
        } else {
            0
        },
        qp_num,
        src_qp,
        wc_flags: flags,
        pkey_index,
        slid,
        sl,
        dlid_path_bits,
    }
}

/// `struct ibv_wc` from a [`WorkCompletion`], for the verbs that take one back
/// (`ibv_init_ah_from_wc` reads `wc_flags`, `slid`, `sl` and `dlid_path_bits`). The
/// union word is `imm_data` (network order) when `WITH_IMM` is set, else
/// `invalidated_rkey`, as [`wc_from_c`] reads it.
pub(crate) fn wc_to_c(wc: &WorkCompletion) -> ffi::ibv_wc {
    let imm_or_inv = if wc.wc_flags.contains(WcFlags::WITH_IMM) {
        wc.imm_data.to_be()
    } else {
        wc.invalidated_rkey
    };
    ffi::ibv_wc {
        wr_id: wc.wr_id,
        status: wc.status.as_u32(),
        opcode: wc.opcode.as_u32(),
        vendor_err: wc.vendor_err,
        byte_len: wc.byte_len,
        imm_data_invalidated_rkey_union: ffi::imm_data_invalidated_rkey_union_t {
            invalidated_rkey: imm_or_inv,
        },
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        wc_flags: wc.wc_flags.bits(),
        pkey_index: wc.pkey_index,
        slid: wc.slid,
        sl: wc.sl,
        dlid_path_bits: wc.dlid_path_bits,
    }
}

/// `struct ibv_grh` from the first 40 bytes of a UD receive buffer (fewer are padded
/// with zeros). The fields keep the wire's byte order (`version_tclass_flow` and
/// `paylen` are `__be32`/`__be16` in C), so the struct is the bytes as they were.
pub(crate) fn grh_to_c(bytes: &[u8]) -> ffi::ibv_grh {
    let mut b = [0u8; GRH_LEN];
    let n = bytes.len().min(GRH_LEN);
    b[..n].copy_from_slice(&bytes[..n]);
    let gid = |at: usize| {
        let mut raw = [0u8; 16];
        raw.copy_from_slice(&b[at..at + 16]);
        ffi::ibv_gid { raw }
    };
    ffi::ibv_grh {
        version_tclass_flow: u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        paylen: u16::from_ne_bytes([b[4], b[5]]),
        next_hdr: b[6],
        hop_limit: b[7],
        sgid: gid(8),
        dgid: gid(24),
    }
}

/// Bytes of `struct ibv_grh` (IBTA 8.3: the GRH a UD receive buffer begins with).
pub(crate) const GRH_LEN: usize = 40;

/// `int` counts of `struct ibv_device_attr`, never negative in practice.
fn count(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// [`DeviceAttr`] from `struct ibv_device_attr`.
pub(crate) fn device_attr_from_c(a: &ffi::ibv_device_attr) -> DeviceAttr {
    let fw: Vec<u8> = a
        .fw_ver
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    DeviceAttr {
        fw_ver: String::from_utf8_lossy(&fw).into_owned(),
        node_guid: u64::from_be(a.node_guid),
        sys_image_guid: u64::from_be(a.sys_image_guid),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_qp: count(a.max_qp),
        max_qp_wr: count(a.max_qp_wr),
        device_cap_flags: DeviceCapFlags::from_bits_retain(a.device_cap_flags),
        max_sge: count(a.max_sge),
        max_sge_rd: count(a.max_sge_rd),
        max_cq: count(a.max_cq),
        max_cqe: count(a.max_cqe),
        max_mr: count(a.max_mr),
        max_pd: count(a.max_pd),
        max_qp_rd_atom: count(a.max_qp_rd_atom),
        max_ee_rd_atom: count(a.max_ee_rd_atom),
        max_res_rd_atom: count(a.max_res_rd_atom),
        max_qp_init_rd_atom: count(a.max_qp_init_rd_atom),
        max_ee_init_rd_atom: count(a.max_ee_init_rd_atom),
        atomic_cap: AtomicCap::try_from(a.atomic_cap).unwrap_or(AtomicCap::None),
        max_ee: count(a.max_ee),
        max_rdd: count(a.max_rdd),
        max_mw: count(a.max_mw),
        max_raw_ipv6_qp: count(a.max_raw_ipv6_qp),
        max_raw_ethy_qp: count(a.max_raw_ethy_qp),
        max_mcast_grp: count(a.max_mcast_grp),
        max_mcast_qp_attach: count(a.max_mcast_qp_attach),
        max_total_mcast_qp_attach: count(a.max_total_mcast_qp_attach),
        max_ah: count(a.max_ah),
        max_fmr: count(a.max_fmr),
        max_map_per_fmr: count(a.max_map_per_fmr),
        max_srq: count(a.max_srq),
        max_srq_wr: count(a.max_srq_wr),
        max_srq_sge: count(a.max_srq_sge),
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: a.local_ca_ack_delay,
        phys_port_cnt: a.phys_port_cnt,
    }
}

/// [`PortAttr`] from `struct ibv_port_attr`.
pub(crate) fn port_attr_from_c(a: &ffi::ibv_port_attr) -> PortAttr {
    let d = PortAttr::default();
    PortAttr {
        state: PortState::try_from(a.state).unwrap_or(PortState::Nop),
        max_mtu: Mtu::try_from(a.max_mtu).unwrap_or(d.max_mtu),
        active_mtu: Mtu::try_from(a.active_mtu).unwrap_or(d.active_mtu),
        gid_tbl_len: count(a.gid_tbl_len),
        port_cap_flags: a.port_cap_flags,
        max_msg_sz: a.max_msg_sz,
        bad_pkey_cntr: a.bad_pkey_cntr,
        qkey_viol_cntr: a.qkey_viol_cntr,
        pkey_tbl_len: a.pkey_tbl_len,
        lid: a.lid,
        sm_lid: a.sm_lid,
        lmc: a.lmc,
        max_vl_num: a.max_vl_num,
        sm_sl: a.sm_sl,
        subnet_timeout: a.subnet_timeout,
        init_type_reply: a.init_type_reply,
        active_width: a.active_width,
        active_speed: a.active_speed,
        phys_state: a.phys_state,
        link_layer: LinkLayer::try_from(u32::from(a.link_layer)).unwrap_or(LinkLayer::Unspecified),
    }
}

#[cfg(test)]
mod tests {
    //! Every numeric value verbs-api uses against the installed `verbs.h` (through the
    //! constants bindgen generated from it).
    use super::*;
    use verbs_api::{
        AsyncEventType, MwType, NodeType, QpAttrMask, QpType, ReregMrFlags, SendFlags, SrqAttrMask,
        WrOpcode,
    };

    /// The values of `all` that `checked` does not name.
    fn missing<T: Copy + PartialEq, V>(all: &[T], checked: &[(T, V)]) -> Vec<T> {
        all.iter()
            .copied()
            .filter(|t| !checked.iter().any(|(k, _)| k == t))
            .collect()
    }

    #[test]
    fn wc_status_matches_verbs_h() {
        use ffi::ibv_wc_status::*;
        let c = [
            (WcStatus::Success, IBV_WC_SUCCESS),
            (WcStatus::LocLenErr, IBV_WC_LOC_LEN_ERR),
            (WcStatus::LocQpOpErr, IBV_WC_LOC_QP_OP_ERR),
            (WcStatus::LocEecOpErr, IBV_WC_LOC_EEC_OP_ERR),
            (WcStatus::LocProtErr, IBV_WC_LOC_PROT_ERR),
            (WcStatus::WrFlushErr, IBV_WC_WR_FLUSH_ERR),
            (WcStatus::MwBindErr, IBV_WC_MW_BIND_ERR),
            (WcStatus::BadRespErr, IBV_WC_BAD_RESP_ERR),
            (WcStatus::LocAccessErr, IBV_WC_LOC_ACCESS_ERR),
            (WcStatus::RemInvReqErr, IBV_WC_REM_INV_REQ_ERR),
            (WcStatus::RemAccessErr, IBV_WC_REM_ACCESS_ERR),
            (WcStatus::RemOpErr, IBV_WC_REM_OP_ERR),
            (WcStatus::RetryExcErr, IBV_WC_RETRY_EXC_ERR),
            (WcStatus::RnrRetryExcErr, IBV_WC_RNR_RETRY_EXC_ERR),
            (WcStatus::LocRddViolErr, IBV_WC_LOC_RDD_VIOL_ERR),
            (WcStatus::RemInvRdReqErr, IBV_WC_REM_INV_RD_REQ_ERR),
            (WcStatus::RemAbortErr, IBV_WC_REM_ABORT_ERR),
            (WcStatus::InvEecnErr, IBV_WC_INV_EECN_ERR),
            (WcStatus::InvEecStateErr, IBV_WC_INV_EEC_STATE_ERR),
            (WcStatus::FatalErr, IBV_WC_FATAL_ERR),
            (WcStatus::RespTimeoutErr, IBV_WC_RESP_TIMEOUT_ERR),
            (WcStatus::GeneralErr, IBV_WC_GENERAL_ERR),
            (WcStatus::TmErr, IBV_WC_TM_ERR),
            (WcStatus::TmRndvIncomplete, IBV_WC_TM_RNDV_INCOMPLETE),
        ];
        assert_eq!(c.len(), WcStatus::ALL.len());
        for (s, v) in c {
            assert_eq!(s.as_u32(), v, "{s:?}");
        }
    }

    #[test]
    fn wc_opcode_and_flags_match_verbs_h() {
        use ffi::ibv_wc_opcode::*;
        let c = [
            (WcOpcode::Send, IBV_WC_SEND),
            (WcOpcode::RdmaWrite, IBV_WC_RDMA_WRITE),
            (WcOpcode::RdmaRead, IBV_WC_RDMA_READ),
            (WcOpcode::CompSwap, IBV_WC_COMP_SWAP),
            (WcOpcode::FetchAdd, IBV_WC_FETCH_ADD),
            (WcOpcode::BindMw, IBV_WC_BIND_MW),
            (WcOpcode::LocalInv, IBV_WC_LOCAL_INV),
            (WcOpcode::Tso, IBV_WC_TSO),
            (WcOpcode::AtomicWrite, IBV_WC_ATOMIC_WRITE),
            (WcOpcode::Recv, IBV_WC_RECV),
            (WcOpcode::RecvRdmaWithImm, IBV_WC_RECV_RDMA_WITH_IMM),
            (WcOpcode::TmAdd, IBV_WC_TM_ADD),
            (WcOpcode::TmDel, IBV_WC_TM_DEL),
            (WcOpcode::TmSync, IBV_WC_TM_SYNC),
            (WcOpcode::TmRecv, IBV_WC_TM_RECV),
            (WcOpcode::TmNoTag, IBV_WC_TM_NO_TAG),
            (WcOpcode::Driver1, IBV_WC_DRIVER1),
            (WcOpcode::Driver2, IBV_WC_DRIVER2),
            (WcOpcode::Driver3, IBV_WC_DRIVER3),
        ];
        // rdma-core 44 (Debian 12) predates IBV_WC_FLUSH (8): the one value it lacks.
        assert_eq!(missing(WcOpcode::ALL, &c), [WcOpcode::Flush]);
        assert_eq!(WcOpcode::Flush.as_u32(), 8);
        for (o, v) in c {
            assert_eq!(o.as_u32(), v, "{o:?}");
        }
        let f = [
            (WcFlags::GRH, ffi::ibv_wc_flags::IBV_WC_GRH),
            (WcFlags::WITH_IMM, ffi::ibv_wc_flags::IBV_WC_WITH_IMM),
            (WcFlags::IP_CSUM_OK, ffi::ibv_wc_flags::IBV_WC_IP_CSUM_OK),
            (WcFlags::WITH_INV, ffi::ibv_wc_flags::IBV_WC_WITH_INV),
            (WcFlags::TM_SYNC_REQ, ffi::ibv_wc_flags::IBV_WC_TM_SYNC_REQ),
            (WcFlags::TM_MATCH, ffi::ibv_wc_flags::IBV_WC_TM_MATCH),
            (
                WcFlags::TM_DATA_VALID,
                ffi::ibv_wc_flags::IBV_WC_TM_DATA_VALID,
            ),
        ];
        assert_eq!(f.len(), WcFlags::all().iter().count());
        for (a, b) in f {
            assert_eq!(a.bits(), b.0, "{a:?}");
        }
    }

    #[test]
    fn wr_opcode_and_send_flags_match_verbs_h() {
        use ffi::ibv_wr_opcode::*;
        let c = [
            (WrOpcode::RdmaWrite, IBV_WR_RDMA_WRITE),
            (WrOpcode::RdmaWriteWithImm, IBV_WR_RDMA_WRITE_WITH_IMM),
            (WrOpcode::Send, IBV_WR_SEND),
            (WrOpcode::SendWithImm, IBV_WR_SEND_WITH_IMM),
            (WrOpcode::RdmaRead, IBV_WR_RDMA_READ),
            (WrOpcode::AtomicCmpAndSwp, IBV_WR_ATOMIC_CMP_AND_SWP),
            (WrOpcode::AtomicFetchAndAdd, IBV_WR_ATOMIC_FETCH_AND_ADD),
            (WrOpcode::LocalInv, IBV_WR_LOCAL_INV),
            (WrOpcode::BindMw, IBV_WR_BIND_MW),
            (WrOpcode::SendWithInv, IBV_WR_SEND_WITH_INV),
            (WrOpcode::Tso, IBV_WR_TSO),
            (WrOpcode::Driver1, IBV_WR_DRIVER1),
            (WrOpcode::AtomicWrite, IBV_WR_ATOMIC_WRITE),
        ];
        // rdma-core 44 predates IBV_WR_FLUSH (14): the one value it lacks.
        assert_eq!(missing(WrOpcode::ALL, &c), [WrOpcode::Flush]);
        assert_eq!(WrOpcode::Flush.as_u32(), 14);
        for (o, v) in c {
            assert_eq!(o.as_u32(), v, "{o:?}");
        }
        use ffi::ibv_send_flags as F;
        let f = [
            (SendFlags::FENCE, F::IBV_SEND_FENCE),
            (SendFlags::SIGNALED, F::IBV_SEND_SIGNALED),
            (SendFlags::SOLICITED, F::IBV_SEND_SOLICITED),
            (SendFlags::INLINE, F::IBV_SEND_INLINE),
            (SendFlags::IP_CSUM, F::IBV_SEND_IP_CSUM),
        ];
        assert_eq!(f.len(), SendFlags::all().iter().count());
        for (a, b) in f {
            assert_eq!(a.bits(), b.0, "{a:?}");
        }
    }

    #[test]
    fn event_types_match_verbs_h() {
        use ffi::ibv_event_type as E;
        let c = [
            (AsyncEventType::CqErr, E::IBV_EVENT_CQ_ERR),
            (AsyncEventType::QpFatal, E::IBV_EVENT_QP_FATAL),
            (AsyncEventType::QpReqErr, E::IBV_EVENT_QP_REQ_ERR),
            (AsyncEventType::QpAccessErr, E::IBV_EVENT_QP_ACCESS_ERR),
            (AsyncEventType::CommEst, E::IBV_EVENT_COMM_EST),
            (AsyncEventType::SqDrained, E::IBV_EVENT_SQ_DRAINED),
            (AsyncEventType::PathMig, E::IBV_EVENT_PATH_MIG),
            (AsyncEventType::PathMigErr, E::IBV_EVENT_PATH_MIG_ERR),
            (AsyncEventType::DeviceFatal, E::IBV_EVENT_DEVICE_FATAL),
            (AsyncEventType::PortActive, E::IBV_EVENT_PORT_ACTIVE),
            (AsyncEventType::PortErr, E::IBV_EVENT_PORT_ERR),
            (AsyncEventType::LidChange, E::IBV_EVENT_LID_CHANGE),
            (AsyncEventType::PkeyChange, E::IBV_EVENT_PKEY_CHANGE),
            (AsyncEventType::SmChange, E::IBV_EVENT_SM_CHANGE),
            (AsyncEventType::SrqErr, E::IBV_EVENT_SRQ_ERR),
            (
                AsyncEventType::SrqLimitReached,
                E::IBV_EVENT_SRQ_LIMIT_REACHED,
            ),
            (
                AsyncEventType::QpLastWqeReached,
                E::IBV_EVENT_QP_LAST_WQE_REACHED,
            ),
            (
                AsyncEventType::ClientReregister,
                E::IBV_EVENT_CLIENT_REREGISTER,
            ),
            (AsyncEventType::GidChange, E::IBV_EVENT_GID_CHANGE),
            (AsyncEventType::WqFatal, E::IBV_EVENT_WQ_FATAL),
        ];
        for (t, v) in c {
            assert_eq!(t.as_u32(), v as u32, "{t:?}");
        }
        // rdma-core 44 (Debian 12) predates IBV_EVENT_DEVICE_SPEED_CHANGE (20); the one
        // verbs-api value the header lacks is that one, and it follows WQ_FATAL.
        assert_eq!(
            missing(AsyncEventType::ALL, &c),
            [AsyncEventType::DeviceSpeedChange]
        );
        assert_eq!(AsyncEventType::DeviceSpeedChange.as_u32(), 20);
    }

    #[test]
    fn qp_enums_and_masks_match_verbs_h() {
        use ffi::ibv_qp_attr_mask as M;
        let m = [
            (QpAttrMask::STATE, M::IBV_QP_STATE),
            (QpAttrMask::CUR_STATE, M::IBV_QP_CUR_STATE),
            (
                QpAttrMask::EN_SQD_ASYNC_NOTIFY,
                M::IBV_QP_EN_SQD_ASYNC_NOTIFY,
            ),
            (QpAttrMask::ACCESS_FLAGS, M::IBV_QP_ACCESS_FLAGS),
            (QpAttrMask::PKEY_INDEX, M::IBV_QP_PKEY_INDEX),
            (QpAttrMask::PORT, M::IBV_QP_PORT),
            (QpAttrMask::QKEY, M::IBV_QP_QKEY),
            (QpAttrMask::AV, M::IBV_QP_AV),
            (QpAttrMask::PATH_MTU, M::IBV_QP_PATH_MTU),
            (QpAttrMask::TIMEOUT, M::IBV_QP_TIMEOUT),
            (QpAttrMask::RETRY_CNT, M::IBV_QP_RETRY_CNT),
            (QpAttrMask::RNR_RETRY, M::IBV_QP_RNR_RETRY),
            (QpAttrMask::RQ_PSN, M::IBV_QP_RQ_PSN),
            (QpAttrMask::MAX_QP_RD_ATOMIC, M::IBV_QP_MAX_QP_RD_ATOMIC),
            (QpAttrMask::ALT_PATH, M::IBV_QP_ALT_PATH),
            (QpAttrMask::MIN_RNR_TIMER, M::IBV_QP_MIN_RNR_TIMER),
            (QpAttrMask::SQ_PSN, M::IBV_QP_SQ_PSN),
            (QpAttrMask::MAX_DEST_RD_ATOMIC, M::IBV_QP_MAX_DEST_RD_ATOMIC),
            (QpAttrMask::PATH_MIG_STATE, M::IBV_QP_PATH_MIG_STATE),
            (QpAttrMask::CAP, M::IBV_QP_CAP),
            (QpAttrMask::DEST_QPN, M::IBV_QP_DEST_QPN),
            (QpAttrMask::RATE_LIMIT, M::IBV_QP_RATE_LIMIT),
        ];
        assert_eq!(m.len(), QpAttrMask::all().iter().count());
        for (a, b) in m {
            assert_eq!(a.bits(), b.0, "{a:?}");
        }
        use ffi::ibv_qp_state::*;
        let s = [
            (QpState::Reset, IBV_QPS_RESET),
            (QpState::Init, IBV_QPS_INIT),
            (QpState::Rtr, IBV_QPS_RTR),
            (QpState::Rts, IBV_QPS_RTS),
            (QpState::Sqd, IBV_QPS_SQD),
            (QpState::Sqe, IBV_QPS_SQE),
            (QpState::Err, IBV_QPS_ERR),
            (QpState::Unknown, IBV_QPS_UNKNOWN),
        ];
        assert_eq!(s.len(), QpState::ALL.len());
        for (a, b) in s {
            assert_eq!(a.as_u32(), b, "{a:?}");
        }
        use ffi::ibv_qp_type::*;
        let t = [
            (QpType::Rc, IBV_QPT_RC),
            (QpType::Uc, IBV_QPT_UC),
            (QpType::Ud, IBV_QPT_UD),
            (QpType::RawPacket, IBV_QPT_RAW_PACKET),
            (QpType::XrcSend, IBV_QPT_XRC_SEND),
            (QpType::XrcRecv, IBV_QPT_XRC_RECV),
            (QpType::Driver, IBV_QPT_DRIVER),
        ];
        assert_eq!(t.len(), QpType::ALL.len());
        for (a, b) in t {
            assert_eq!(a.as_u32(), b, "{a:?}");
        }
        use ffi::ibv_mtu::*;
        let mtu = [
            (Mtu::Mtu256, IBV_MTU_256),
            (Mtu::Mtu512, IBV_MTU_512),
            (Mtu::Mtu1024, IBV_MTU_1024),
            (Mtu::Mtu2048, IBV_MTU_2048),
            (Mtu::Mtu4096, IBV_MTU_4096),
        ];
        for (a, b) in mtu {
            assert_eq!(a.as_u32(), b, "{a:?}");
        }
        use ffi::ibv_mig_state::*;
        for (a, b) in [
            (MigState::Migrated, IBV_MIG_MIGRATED),
            (MigState::Rearm, IBV_MIG_REARM),
            (MigState::Armed, IBV_MIG_ARMED),
        ] {
            assert_eq!(a.as_u32(), b, "{a:?}");
        }
    }

    #[test]
    fn access_mw_srq_rereg_flags_match_verbs_h() {
        use ffi::ibv_access_flags as A;
        let a = [
            (AccessFlags::LOCAL_WRITE, A::IBV_ACCESS_LOCAL_WRITE),
            (AccessFlags::REMOTE_WRITE, A::IBV_ACCESS_REMOTE_WRITE),
            (AccessFlags::REMOTE_READ, A::IBV_ACCESS_REMOTE_READ),
            (AccessFlags::REMOTE_ATOMIC, A::IBV_ACCESS_REMOTE_ATOMIC),
            (AccessFlags::MW_BIND, A::IBV_ACCESS_MW_BIND),
            (AccessFlags::ZERO_BASED, A::IBV_ACCESS_ZERO_BASED),
            (AccessFlags::ON_DEMAND, A::IBV_ACCESS_ON_DEMAND),
            (AccessFlags::HUGETLB, A::IBV_ACCESS_HUGETLB),
            (
                AccessFlags::RELAXED_ORDERING,
                A::IBV_ACCESS_RELAXED_ORDERING,
            ),
        ];
        // rdma-core 44 predates IBV_ACCESS_FLUSH_GLOBAL / _PERSISTENT (1 << 8, 1 << 9).
        assert_eq!(a.len() + 2, AccessFlags::all().iter().count());
        assert_eq!(AccessFlags::FLUSH_GLOBAL.bits(), 1 << 8);
        assert_eq!(AccessFlags::FLUSH_PERSISTENT.bits(), 1 << 9);
        for (x, y) in a {
            assert_eq!(x.bits(), y.0, "{x:?}");
        }
        use ffi::ibv_mw_type::*;
        assert_eq!(MwType::Type1.as_u32(), IBV_MW_TYPE_1);
        assert_eq!(MwType::Type2.as_u32(), IBV_MW_TYPE_2);
        use ffi::ibv_srq_attr_mask as S;
        assert_eq!(SrqAttrMask::MAX_WR.bits(), S::IBV_SRQ_MAX_WR.0);
        assert_eq!(SrqAttrMask::LIMIT.bits(), S::IBV_SRQ_LIMIT.0);
        use ffi::ibv_rereg_mr_flags as R;
        assert_eq!(
            ReregMrFlags::CHANGE_TRANSLATION.bits(),
            R::IBV_REREG_MR_CHANGE_TRANSLATION.0
        );
        assert_eq!(ReregMrFlags::CHANGE_PD.bits(), R::IBV_REREG_MR_CHANGE_PD.0);
        assert_eq!(
            ReregMrFlags::CHANGE_ACCESS.bits(),
            R::IBV_REREG_MR_CHANGE_ACCESS.0
        );
    }

    #[test]
    fn device_and_port_enums_match_verbs_h() {
        use ffi::ibv_port_state::*;
        for (a, b) in [
            (PortState::Nop, IBV_PORT_NOP),
            (PortState::Down, IBV_PORT_DOWN),
            (PortState::Init, IBV_PORT_INIT),
            (PortState::Armed, IBV_PORT_ARMED),
            (PortState::Active, IBV_PORT_ACTIVE),
            (PortState::ActiveDefer, IBV_PORT_ACTIVE_DEFER),
        ] {
            assert_eq!(a.as_u32(), b, "{a:?}");
        }
        use ffi::ibv_atomic_cap::*;
        for (a, b) in [
            (AtomicCap::None, IBV_ATOMIC_NONE),
            (AtomicCap::Hca, IBV_ATOMIC_HCA),
            (AtomicCap::Glob, IBV_ATOMIC_GLOB),
        ] {
            assert_eq!(a.as_u32(), b, "{a:?}");
        }
        use ffi::ibv_node_type::*;
        for (a, b) in [
            (NodeType::Ca, IBV_NODE_CA),
            (NodeType::Switch, IBV_NODE_SWITCH),
            (NodeType::Router, IBV_NODE_ROUTER),
            (NodeType::Rnic, IBV_NODE_RNIC),
            (NodeType::Usnic, IBV_NODE_USNIC),
            (NodeType::UsnicUdp, IBV_NODE_USNIC_UDP),
            (NodeType::Unspecified, IBV_NODE_UNSPECIFIED),
        ] {
            assert_eq!(i64::from(a.as_u32()), i64::from(b), "{a:?}");
        }
        use ffi::ibv_device_cap_flags as D;
        for (a, b) in [
            (DeviceCapFlags::RESIZE_MAX_WR, D::IBV_DEVICE_RESIZE_MAX_WR),
            (DeviceCapFlags::RC_RNR_NAK_GEN, D::IBV_DEVICE_RC_RNR_NAK_GEN),
            (DeviceCapFlags::SRQ_RESIZE, D::IBV_DEVICE_SRQ_RESIZE),
            (DeviceCapFlags::N_NOTIFY_CQ, D::IBV_DEVICE_N_NOTIFY_CQ),
            (DeviceCapFlags::MEM_WINDOW, D::IBV_DEVICE_MEM_WINDOW),
            (
                DeviceCapFlags::MEM_MGT_EXTENSIONS,
                D::IBV_DEVICE_MEM_MGT_EXTENSIONS,
            ),
            (
                DeviceCapFlags::MEM_WINDOW_TYPE_2B,
                D::IBV_DEVICE_MEM_WINDOW_TYPE_2B,
            ),
            (
                DeviceCapFlags::MANAGED_FLOW_STEERING,
                D::IBV_DEVICE_MANAGED_FLOW_STEERING,
            ),
        ] {
            assert_eq!(a.bits(), b.0, "{a:?}");
        }
        use ffi::ibv_port_cap_flags as P;
        assert_eq!(
            verbs_api::PortCapFlags::IP_BASED_GIDS.bits(),
            P::IBV_PORT_IP_BASED_GIDS.0
        );
    }

    #[test]
    fn wc_conversion_reads_the_union_by_flag() {
        let imm = 0x1234_5678u32;
        let wc = wc_from_c(7, 0, 0x81, 0, 4, imm.to_be(), 9, 0, 2, 0, 0, 0, 0);
        assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc.imm(), Some(imm));
        assert_eq!(wc.invalidated(), None);
        let wc = wc_from_c(7, 0, 0x80, 0, 4, 0xabcd, 9, 0, 8, 0, 0, 0, 0);
        assert_eq!(wc.invalidated(), Some(0xabcd));
        assert_eq!(wc.imm_data, 0);
        // Error completion with an opcode libibverbs leaves undefined.
        let wc = wc_from_c(1, 5, 0xdead, 0x99, 0, 0, 3, 0, 0, 0, 0, 0, 0);
        assert_eq!(wc.status, WcStatus::WrFlushErr);
        assert_eq!(wc.vendor_err, 0x99);
    }

    #[test]
    fn wc_round_trips_through_c() {
        let mut wc = WorkCompletion::new(3, WcStatus::Success, WcOpcode::Recv, 0x12);
        wc.wc_flags = WcFlags::GRH | WcFlags::WITH_IMM;
        (wc.imm_data, wc.src_qp, wc.byte_len) = (0xdead_beef, 0x34, 56);
        (wc.slid, wc.sl, wc.dlid_path_bits, wc.pkey_index) = (0x0102, 3, 4, 5);
        assert_eq!(sys::wc_from_raw(&wc_to_c(&wc)), wc);
        wc.wc_flags = WcFlags::WITH_INV;
        (wc.imm_data, wc.invalidated_rkey) = (0, 0x1357);
        assert_eq!(sys::wc_from_raw(&wc_to_c(&wc)), wc);
    }

    #[test]
    fn grh_keeps_the_wire_bytes() {
        assert_eq!(std::mem::size_of::<ffi::ibv_grh>(), GRH_LEN);
        let bytes: Vec<u8> = (0..GRH_LEN as u8).collect();
        let g = grh_to_c(&bytes);
        assert_eq!(g.version_tclass_flow.to_ne_bytes(), [0, 1, 2, 3]);
        assert_eq!(g.paylen.to_ne_bytes(), [4, 5]);
        assert_eq!((g.next_hdr, g.hop_limit), (6, 7));
        assert_eq!(sys::gid_bytes(&g.sgid)[..], bytes[8..24]);
        assert_eq!(sys::gid_bytes(&g.dgid)[..], bytes[24..40]);
        // short buffers are padded with zeros
        assert_eq!(sys::gid_bytes(&grh_to_c(&bytes[..30]).dgid)[6..], [0; 10]);
    }

    #[test]
    fn qp_attr_round_trips_through_c() {
        let mut a = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu4096,
            qkey: 0x1111_1111,
            rq_psn: 0x12_3456,
            dest_qp_num: 0x77,
            qp_access_flags: AccessFlags::REMOTE_READ | AccessFlags::LOCAL_WRITE,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 6,
            ..QpAttr::default()
        };
        a.ah_attr.is_global = true;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.dgid = Gid::from(std::net::Ipv4Addr::new(10, 0, 2, 15));
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.grh.sgid_index = 1;
        assert_eq!(qp_attr_from_c(&qp_attr_to_c(&a)), a);
    }
}
