//! Conversions between the C structs of `<infiniband/verbs.h>` (module [`sys`]) and
//! the types of `verbs_api`, on values: no pointer is followed here. Fields a mask
//! leaves out are never read, so garbage in them (C programs leave attributes
//! uninitialised) cannot turn into an error.
//!
//! Safety argument for the one kind of `unsafe` here: reading a member of a bindgen
//! union (`ibv_send_wr.wr`, `ibv_wc`'s `imm_data`/`invalidated_rkey`, `ibv_gid`).
//! Every member of those unions is a plain integer or an array or struct of
//! integers, so every bit pattern is a valid value of every member.

#![allow(unsafe_code)]

use std::ffi::c_uint;

use verbs_api::{
    AccessFlags, AhAttr, AhId, AsyncEventType, DeviceAttr, Error, Gid, GlobalRoute, MigState, Mtu,
    MwBindInfo, PortAttr, QpAttr, QpAttrMask, QpCap, QpState, RecvWr, Result, SendFlags, SendWr,
    Sge, SrqAttr, UdDest, WorkCompletion, WrOperation,
};

use crate::sys;

/// `ibv_gid` to [`Gid`].
pub(crate) fn gid_from_c(g: &sys::ibv_gid) -> Gid {
    // SAFETY: a union of byte arrays and integers (module docs).
    Gid(unsafe { g.raw })
}

/// [`Gid`] to `ibv_gid`.
pub(crate) fn gid_to_c(g: &Gid) -> sys::ibv_gid {
    sys::ibv_gid { raw: g.0 }
}

/// `ibv_sge` to [`Sge`].
pub(crate) fn sge_from_c(s: &sys::ibv_sge) -> Sge {
    Sge::new(s.addr, s.length, s.lkey)
}

/// `ibv_ah_attr` to [`AhAttr`].
pub(crate) fn ah_attr_from_c(a: &sys::ibv_ah_attr) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            dgid: gid_from_c(&a.grh.dgid),
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

/// [`AhAttr`] to `ibv_ah_attr`.
pub(crate) fn ah_attr_to_c(a: &AhAttr) -> sys::ibv_ah_attr {
    sys::ibv_ah_attr {
        grh: sys::ibv_global_route {
            dgid: gid_to_c(&a.grh.dgid),
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

/// `ibv_qp_cap` to [`QpCap`].
pub(crate) fn cap_from_c(c: &sys::ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// [`QpCap`] to `ibv_qp_cap`.
pub(crate) fn cap_to_c(c: &QpCap) -> sys::ibv_qp_cap {
    sys::ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `ibv_qp_attr` to [`QpAttr`], reading only what `mask` names (EINVAL for a bad
/// enum value in a named field).
pub(crate) fn qp_attr_from_c(a: &sys::ibv_qp_attr, mask: QpAttrMask) -> Result<QpAttr> {
    let mut q = QpAttr::default();
    if mask.contains(QpAttrMask::STATE) {
        q.qp_state = QpState::try_from(a.qp_state)?;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        q.cur_qp_state = QpState::try_from(a.cur_qp_state)?;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        q.path_mtu = Mtu::try_from(a.path_mtu)?;
    }
    if mask.contains(QpAttrMask::PATH_MIG_STATE) {
        q.path_mig_state = MigState::try_from(a.path_mig_state)?;
    }
    if mask.contains(QpAttrMask::ACCESS_FLAGS) {
        q.qp_access_flags = AccessFlags::from_bits_retain(a.qp_access_flags);
    }
    if mask.contains(QpAttrMask::CAP) {
        q.cap = cap_from_c(&a.cap);
    }
    if mask.contains(QpAttrMask::AV) {
        q.ah_attr = ah_attr_from_c(&a.ah_attr);
    }
    if mask.contains(QpAttrMask::ALT_PATH) {
        q.alt_ah_attr = ah_attr_from_c(&a.alt_ah_attr);
        q.alt_pkey_index = a.alt_pkey_index;
        q.alt_port_num = a.alt_port_num;
        q.alt_timeout = a.alt_timeout;
    }
    q.qkey = a.qkey;
    q.rq_psn = a.rq_psn;
    q.sq_psn = a.sq_psn;
    q.dest_qp_num = a.dest_qp_num;
    q.pkey_index = a.pkey_index;
    q.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.min_rnr_timer = a.min_rnr_timer;
    q.port_num = a.port_num;
    q.timeout = a.timeout;
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    q.rate_limit = a.rate_limit;
    Ok(q)
}

/// [`QpAttr`] to `ibv_qp_attr`.
pub(crate) fn qp_attr_to_c(q: &QpAttr) -> sys::ibv_qp_attr {
    sys::ibv_qp_attr {
        qp_state: q.qp_state.as_u32(),
        cur_qp_state: q.cur_qp_state.as_u32(),
        path_mtu: q.path_mtu.as_u32(),
        path_mig_state: q.path_mig_state.as_u32(),
        qkey: q.qkey,
        rq_psn: q.rq_psn,
        sq_psn: q.sq_psn,
        dest_qp_num: q.dest_qp_num,
        qp_access_flags: q.qp_access_flags.bits(),
        cap: cap_to_c(&q.cap),
        ah_attr: ah_attr_to_c(&q.ah_attr),
        alt_ah_attr: ah_attr_to_c(&q.alt_ah_attr),
        pkey_index: q.pkey_index,
        alt_pkey_index: q.alt_pkey_index,
        en_sqd_async_notify: u8::from(q.en_sqd_async_notify),
        sq_draining: u8::from(q.sq_draining),
        max_rd_atomic: q.max_rd_atomic,
        max_dest_rd_atomic: q.max_dest_rd_atomic,
        min_rnr_timer: q.min_rnr_timer,
        port_num: q.port_num,
        timeout: q.timeout,
        retry_cnt: q.retry_cnt,
        rnr_retry: q.rnr_retry,
        alt_port_num: q.alt_port_num,
        alt_timeout: q.alt_timeout,
        rate_limit: q.rate_limit,
    }
}

/// The operation of an `ibv_send_wr` (its opcode and the matching part of the `wr`
/// union). `ibv_wr_opcode` values from verbs.h.
pub(crate) fn wr_operation_from_c(wr: &sys::ibv_send_wr) -> Result<WrOperation> {
    // SAFETY: unions of integer structs (module docs).
    let (rdma, atomic, imm, inv) = unsafe {
        (
            wr.wr.rdma,
            wr.wr.atomic,
            u32::from_be(wr.__bindgen_anon_1.imm_data),
            wr.__bindgen_anon_1.invalidate_rkey,
        )
    };
    Ok(match wr.opcode {
        sys::IBV_WR_RDMA_WRITE => WrOperation::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        sys::IBV_WR_RDMA_WRITE_WITH_IMM => WrOperation::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm_data: imm,
        },
        sys::IBV_WR_SEND => WrOperation::Send,
        sys::IBV_WR_SEND_WITH_IMM => WrOperation::SendWithImm { imm_data: imm },
        sys::IBV_WR_RDMA_READ => WrOperation::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        sys::IBV_WR_ATOMIC_CMP_AND_SWP => WrOperation::AtomicCmpAndSwp {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        sys::IBV_WR_ATOMIC_FETCH_AND_ADD => WrOperation::AtomicFetchAndAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        sys::IBV_WR_LOCAL_INV => WrOperation::LocalInv {
            invalidate_rkey: inv,
        },
        sys::IBV_WR_SEND_WITH_INV => WrOperation::SendWithInv {
            invalidate_rkey: inv,
        },
        sys::IBV_WR_BIND_MW => {
            // SAFETY: as above.
            let b = unsafe { wr.__bindgen_anon_2.bind_mw };
            // The ibv_mw pointer is resolved by the caller; here only its new rkey.
            WrOperation::BindMw {
                mw_rkey: 0,
                new_rkey: b.rkey,
                bind_info: bind_info_from_c(&b.bind_info, 0),
            }
        }
        _ => {
            return Err(Error::InvalidArgument(
                "unknown or unsupported ibv_wr_opcode",
            ))
        }
    })
}

/// `ibv_mw_bind_info` (the MR is given by its lkey, which the caller reads).
pub(crate) fn bind_info_from_c(b: &sys::ibv_mw_bind_info, mr_lkey: u32) -> MwBindInfo {
    MwBindInfo {
        mr_lkey,
        addr: b.addr,
        length: b.length,
        mw_access_flags: AccessFlags::from_bits_retain(b.mw_access_flags),
    }
}

/// An `ibv_send_wr` whose SGEs and (for UD) address handle the caller has read.
pub(crate) fn send_wr_from_c(
    wr: &sys::ibv_send_wr,
    sg_list: Vec<Sge>,
    ud: Option<(AhId, u32, u32)>,
) -> Result<SendWr> {
    Ok(SendWr {
        wr_id: wr.wr_id,
        sg_list: sg_list.into(),
        op: wr_operation_from_c(wr)?,
        send_flags: SendFlags::from_bits_retain(wr.send_flags),
        ud: ud.map(|(ah, remote_qpn, remote_qkey)| UdDest {
            ah,
            remote_qpn,
            remote_qkey,
        }),
    })
}

/// The UD destination fields of an `ibv_send_wr` (AH pointer, remote QPN, Q_Key).
pub(crate) fn ud_fields(wr: &sys::ibv_send_wr) -> (*mut sys::ibv_ah, u32, u32) {
    // SAFETY: union of integer/pointer structs (module docs).
    let ud = unsafe { wr.wr.ud };
    (ud.ah, ud.remote_qpn, ud.remote_qkey)
}

/// A receive WR from its id and SGEs.
pub(crate) fn recv_wr(wr_id: u64, sg_list: Vec<Sge>) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: sg_list.into(),
    }
}

/// [`WorkCompletion`] to `ibv_wc` (immediate data back to network order).
pub(crate) fn wc_to_c(w: &WorkCompletion) -> sys::ibv_wc {
    let mut c = sys::ibv_wc {
        wr_id: w.wr_id,
        status: w.status.as_u32(),
        opcode: w.opcode.as_u32(),
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits() as c_uint,
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
        ..Default::default()
    };
    if w.wc_flags.contains(verbs_api::WcFlags::WITH_INV) {
        c.__bindgen_anon_1.invalidated_rkey = w.invalidated_rkey;
    } else {
        c.__bindgen_anon_1.imm_data = w.imm_data.to_be();
    }
    c
}

/// The immediate data of a `ibv_wc` as the wire carries it (host order).
#[cfg(test)]
fn wc_imm(c: &sys::ibv_wc) -> u32 {
    // SAFETY: union of integers (module docs).
    u32::from_be(unsafe { c.__bindgen_anon_1.imm_data })
}

/// Copies `s` into a fixed C string buffer, NUL-terminated, truncating.
pub(crate) fn c_string<const N: usize>(s: &str) -> [std::ffi::c_char; N] {
    let mut out = [0 as std::ffi::c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as std::ffi::c_char;
    }
    out
}

/// [`DeviceAttr`] to `ibv_device_attr` (GUIDs in network order, as verbs.h keeps them).
pub(crate) fn device_attr_to_c(d: &DeviceAttr) -> sys::ibv_device_attr {
    sys::ibv_device_attr {
        fw_ver: c_string(&d.fw_ver),
        node_guid: d.node_guid.to_be(),
        sys_image_guid: d.sys_image_guid.to_be(),
        max_mr_size: d.max_mr_size,
        page_size_cap: d.page_size_cap,
        vendor_id: d.vendor_id,
        vendor_part_id: d.vendor_part_id,
        hw_ver: d.hw_ver,
        max_qp: clamp_i32(d.max_qp),
        max_qp_wr: clamp_i32(d.max_qp_wr),
        device_cap_flags: d.device_cap_flags.bits(),
        max_sge: clamp_i32(d.max_sge),
        max_sge_rd: clamp_i32(d.max_sge_rd),
        max_cq: clamp_i32(d.max_cq),
        max_cqe: clamp_i32(d.max_cqe),
        max_mr: clamp_i32(d.max_mr),
        max_pd: clamp_i32(d.max_pd),
        max_qp_rd_atom: clamp_i32(d.max_qp_rd_atom),
        max_ee_rd_atom: clamp_i32(d.max_ee_rd_atom),
        max_res_rd_atom: clamp_i32(d.max_res_rd_atom),
        max_qp_init_rd_atom: clamp_i32(d.max_qp_init_rd_atom),
        max_ee_init_rd_atom: clamp_i32(d.max_ee_init_rd_atom),
        atomic_cap: d.atomic_cap.as_u32(),
        max_ee: clamp_i32(d.max_ee),
        max_rdd: clamp_i32(d.max_rdd),
        max_mw: clamp_i32(d.max_mw),
        max_raw_ipv6_qp: clamp_i32(d.max_raw_ipv6_qp),
        max_raw_ethy_qp: clamp_i32(d.max_raw_ethy_qp),
        max_mcast_grp: clamp_i32(d.max_mcast_grp),
        max_mcast_qp_attach: clamp_i32(d.max_mcast_qp_attach),
        max_total_mcast_qp_attach: clamp_i32(d.max_total_mcast_qp_attach),
        max_ah: clamp_i32(d.max_ah),
        max_fmr: clamp_i32(d.max_fmr),
        max_map_per_fmr: clamp_i32(d.max_map_per_fmr),
        max_srq: clamp_i32(d.max_srq),
        max_srq_wr: clamp_i32(d.max_srq_wr),
        max_srq_sge: clamp_i32(d.max_srq_sge),
        max_pkeys: d.max_pkeys,
        local_ca_ack_delay: d.local_ca_ack_delay,
        phys_port_cnt: d.phys_port_cnt,
    }
}

fn clamp_i32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// [`PortAttr`] to `ibv_port_attr`.
pub(crate) fn port_attr_to_c(p: &PortAttr) -> sys::ibv_port_attr {
    sys::ibv_port_attr {
        state: p.state.as_u32(),
        max_mtu: p.max_mtu.as_u32(),
        active_mtu: p.active_mtu.as_u32(),
        gid_tbl_len: clamp_i32(p.gid_tbl_len),
        port_cap_flags: p.port_cap_flags,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: p.bad_pkey_cntr,
        qkey_viol_cntr: p.qkey_viol_cntr,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        sm_sl: p.sm_sl,
        subnet_timeout: p.subnet_timeout,
        init_type_reply: p.init_type_reply,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state,
        link_layer: p.link_layer.as_u32() as u8,
        flags: 0,
        port_cap_flags2: 0,
    }
}

/// `ibv_srq_attr` to [`SrqAttr`].
pub(crate) fn srq_attr_from_c(a: &sys::ibv_srq_attr) -> SrqAttr {
    SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// [`SrqAttr`] to `ibv_srq_attr`.
pub(crate) fn srq_attr_to_c(a: &SrqAttr) -> sys::ibv_srq_attr {
    sys::ibv_srq_attr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// `ibv_event_type` of an [`AsyncEventType`].
pub(crate) fn event_type_to_c(t: AsyncEventType) -> sys::ibv_event_type {
    t.as_u32()
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::{WcFlags, WcOpcode, WcStatus};

    #[test]
    fn send_wr_opcodes_and_immediate_byte_order() {
        let mut wr = sys::ibv_send_wr {
            wr_id: 7,
            opcode: sys::IBV_WR_RDMA_WRITE_WITH_IMM,
            send_flags: sys::IBV_SEND_SIGNALED,
            ..Default::default()
        };
        wr.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
        wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: 0x1000,
            rkey: 9,
        };
        let s = send_wr_from_c(&wr, vec![], None).unwrap();
        assert_eq!(
            s.op,
            WrOperation::RdmaWriteWithImm {
                remote_addr: 0x1000,
                rkey: 9,
                imm_data: 0x1234_5678
            }
        );
        assert_eq!(s.send_flags, SendFlags::SIGNALED);
        wr.opcode = 99;
        assert_eq!(send_wr_from_c(&wr, vec![], None).unwrap_err().errno(), 22);
    }

    #[test]
    fn opcode_values_match_the_header() {
        use verbs_api::WrOpcode;
        for (c, r) in [
            (sys::IBV_WR_RDMA_WRITE, WrOpcode::RdmaWrite),
            (sys::IBV_WR_SEND, WrOpcode::Send),
            (sys::IBV_WR_RDMA_READ, WrOpcode::RdmaRead),
            (
                sys::IBV_WR_ATOMIC_FETCH_AND_ADD,
                WrOpcode::AtomicFetchAndAdd,
            ),
            (sys::IBV_WR_SEND_WITH_INV, WrOpcode::SendWithInv),
        ] {
            assert_eq!(c, r.as_u32());
        }
        assert_eq!(
            sys::IBV_WC_RECV_RDMA_WITH_IMM,
            WcOpcode::RecvRdmaWithImm.as_u32()
        );
        assert_eq!(sys::IBV_WC_RETRY_EXC_ERR, WcStatus::RetryExcErr.as_u32());
        assert_eq!(sys::IBV_WC_WITH_IMM, WcFlags::WITH_IMM.bits());
        assert_eq!(sys::IBV_QP_RATE_LIMIT, QpAttrMask::RATE_LIMIT.bits());
        assert_eq!(sys::IBV_SEND_INLINE, SendFlags::INLINE.bits());
        assert_eq!(
            sys::IBV_ACCESS_REMOTE_ATOMIC,
            AccessFlags::REMOTE_ATOMIC.bits()
        );
        assert_eq!(
            sys::IBV_EVENT_QP_LAST_WQE_REACHED,
            AsyncEventType::QpLastWqeReached.as_u32()
        );
    }

    #[test]
    fn wc_round_trip() {
        let mut w = WorkCompletion::new(3, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 17);
        w.imm_data = 0xdead_beef;
        w.wc_flags = WcFlags::WITH_IMM;
        w.byte_len = 100;
        let c = wc_to_c(&w);
        assert_eq!((c.wr_id, c.qp_num, c.byte_len), (3, 17, 100));
        assert_eq!(c.opcode, sys::IBV_WC_RECV_RDMA_WITH_IMM);
        assert_eq!(wc_imm(&c), 0xdead_beef);
    }

    #[test]
    fn qp_attr_reads_only_masked_enums() {
        let a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: 77, // garbage, not in the mask
            dest_qp_num: 5,
            ..Default::default()
        };
        let q = qp_attr_from_c(&a, QpAttrMask::STATE | QpAttrMask::DEST_QPN).unwrap();
        assert_eq!(q.qp_state, QpState::Rtr);
        assert_eq!(q.dest_qp_num, 5);
        assert!(qp_attr_from_c(&a, QpAttrMask::PATH_MTU).is_err());
        let back = qp_attr_to_c(&q);
        assert_eq!(back.qp_state, sys::IBV_QPS_RTR);
    }

    #[test]
    fn c_string_truncates_and_terminates() {
        let s: [std::ffi::c_char; 4] = c_string("abcdef");
        assert_eq!(s, [97, 98, 99, 0]);
    }

    use proptest::prelude::*;
    use verbs_api::AhAttr;

    fn any_ah() -> impl Strategy<Value = AhAttr> {
        (
            any::<[u8; 16]>(),
            0u32..(1 << 20),
            any::<(u8, u8, u8, u16, u8, u8, u8, bool, u8)>(),
        )
            .prop_map(
                |(
                    gid,
                    flow_label,
                    (sgid_index, hop_limit, traffic_class, dlid, sl, bits, rate, g, port),
                )| AhAttr {
                    grh: GlobalRoute {
                        dgid: Gid(gid),
                        flow_label,
                        sgid_index,
                        hop_limit,
                        traffic_class,
                    },
                    dlid,
                    sl,
                    src_path_bits: bits,
                    static_rate: rate,
                    is_global: g,
                    port_num: port,
                },
            )
    }

    proptest! {
        /// Every attribute survives C and back when the mask names it.
        #[test]
        fn qp_attr_round_trips(
            state in 0..QpState::ALL.len(),
            mtu in 0..Mtu::ALL.len(),
            nums in any::<(u32, u32, u32, u32, u16)>(),
            small in any::<(u8, u8, u8, u8, u8, u8, u8, bool)>(),
            access in 0u32..(1 << 8),
            ah in any_ah(),
        ) {
            let q = QpAttr {
                qp_state: QpState::ALL[state],
                path_mtu: Mtu::ALL[mtu],
                qkey: nums.0,
                rq_psn: nums.1 & 0xff_ffff,
                sq_psn: nums.2 & 0xff_ffff,
                dest_qp_num: nums.3 & 0xff_ffff,
                pkey_index: nums.4,
                qp_access_flags: AccessFlags::from_bits_retain(access),
                max_rd_atomic: small.0,
                max_dest_rd_atomic: small.1,
                min_rnr_timer: small.2,
                port_num: small.3,
                timeout: small.4,
                retry_cnt: small.5,
                rnr_retry: small.6,
                en_sqd_async_notify: small.7,
                ah_attr: ah,
                ..QpAttr::default()
            };
            let mask = QpAttrMask::all() - QpAttrMask::ALT_PATH - QpAttrMask::CAP;
            let back = qp_attr_from_c(&qp_attr_to_c(&q), mask).unwrap();
            prop_assert_eq!(back, q);
        }

        /// Immediate data is network order in C and host order in Rust, both ways.
        #[test]
        fn immediate_byte_order(imm in any::<u32>(), addr in any::<u64>(), rkey in any::<u32>()) {
            let mut wr = sys::ibv_send_wr { opcode: sys::IBV_WR_SEND_WITH_IMM, ..Default::default() };
            wr.__bindgen_anon_1.imm_data = imm.to_be();
            prop_assert_eq!(wr_operation_from_c(&wr).unwrap(), WrOperation::SendWithImm { imm_data: imm });
            wr.opcode = sys::IBV_WR_RDMA_READ;
            wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: addr, rkey };
            prop_assert_eq!(wr_operation_from_c(&wr).unwrap(), WrOperation::RdmaRead { remote_addr: addr, rkey });
            let mut w = WorkCompletion::new(1, WcStatus::Success, WcOpcode::Recv, 2);
            w.imm_data = imm;
            w.wc_flags = WcFlags::WITH_IMM;
            prop_assert_eq!(wc_imm(&wc_to_c(&w)), imm);
        }

        /// An unknown opcode is EINVAL, never a panic.
        #[test]
        fn unknown_opcodes_are_refused(op in 11u32..u32::MAX) {
            let wr = sys::ibv_send_wr { opcode: op, ..Default::default() };
            prop_assert_eq!(wr_operation_from_c(&wr).unwrap_err().errno(), 22);
        }
    }
}
