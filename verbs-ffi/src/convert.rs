//! Conversions between the C structs of `<infiniband/verbs.h>` (module [`sys`]) and
//! the types of `verbs_api`, on values: no pointer is followed here.
//!
//! verbs-api gives every libibverbs enum and flag set the numeric values of `verbs.h`
//! (checked against the header's constants by this crate's tests), so enums and flags
//! cross as `as_u32()` / `try_from(u32)` / `bits()`. Two directions read C:
//!
//! * what a C *program* hands the emulator ([`qp_attr_from_c`], [`send_wr_from_c`]):
//!   fields a mask leaves out are never read, so garbage in them (C programs leave
//!   attributes uninitialised) cannot turn into an error, and an enum value outside
//!   its C range in a field the mask names is EINVAL;
//! * what *libibverbs* hands back ([`qp_attr_from_query`], [`wc_from_c`],
//!   [`device_attr_from_c`], [`port_attr_from_c`]): every field is read, and a value
//!   outside its C range (a driver's `path_mtu` of 0 before RTR, an opcode left
//!   undefined on an error completion) takes a documented default instead of failing.
//!
//! Safety argument for the one kind of `unsafe` here: reading a member of a bindgen
//! union (`ibv_send_wr`'s `wr` and immediate/invalidate word, `ibv_wc`'s
//! `imm_data`/`invalidated_rkey`, `ibv_gid`). Every member of those unions is a plain
//! integer, an array of integers or a struct of integers (and, in `ibv_send_wr.wr.ud`,
//! a pointer that is only copied, never followed), so every bit pattern is a valid
//! value of every member.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_uint};

use verbs_api::{
    AccessFlags, AhAttr, AhId, AsyncEventType, AtomicCap, DeviceAttr, DeviceCapFlags,
    DeviceCapFlagsEx, Error, Gid, GlobalRoute, LinkLayer, MigState, Mtu, MwBindInfo, PortAttr,
    PortState, QpAttr, QpAttrMask, QpCap, QpState, RecvWr, Result, SendFlags, SendWr, SgList, Sge,
    SrqAttr, UdDest, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOperation,
};

use crate::sys;

/// `ibv_gid` to [`Gid`].
pub fn gid_from_c(g: &sys::ibv_gid) -> Gid {
    // SAFETY: a union of byte arrays and integers (module docs).
    Gid(unsafe { g.raw })
}

/// [`Gid`] to `ibv_gid`.
pub fn gid_to_c(g: &Gid) -> sys::ibv_gid {
    sys::ibv_gid { raw: g.0 }
}

/// `ibv_sge` to [`Sge`].
pub fn sge_from_c(s: &sys::ibv_sge) -> Sge {
    Sge::new(s.addr, s.length, s.lkey)
}

/// [`Sge`] to `ibv_sge`.
pub fn sge_to_c(s: &Sge) -> sys::ibv_sge {
    sys::ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// `ibv_ah_attr` to [`AhAttr`].
pub fn ah_attr_from_c(a: &sys::ibv_ah_attr) -> AhAttr {
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
pub fn ah_attr_to_c(a: &AhAttr) -> sys::ibv_ah_attr {
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
pub fn cap_from_c(c: &sys::ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// [`QpCap`] to `ibv_qp_cap`.
pub fn cap_to_c(c: &QpCap) -> sys::ibv_qp_cap {
    sys::ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The fields of an `ibv_qp_attr` that are not enums, reading the access flags, the
/// capabilities, the address vector and the alternate path only when `mask` names them
/// (the other plain integers are always read: any value is valid).
fn qp_attr_plain(a: &sys::ibv_qp_attr, mask: QpAttrMask) -> QpAttr {
    let mut q = QpAttr::default();
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
    q
}

/// `ibv_qp_attr` a program hands `ibv_modify_qp` to [`QpAttr`], reading only what
/// `mask` names (EINVAL for a bad enum value in a named field).
pub fn qp_attr_from_c(a: &sys::ibv_qp_attr, mask: QpAttrMask) -> Result<QpAttr> {
    let mut q = qp_attr_plain(a, mask);
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
    Ok(q)
}

/// [`QpAttr`] from what `ibv_query_qp` or `rdma_init_qp_attr` filled in: every field.
/// An enum field outside its C range (e.g. a `path_mtu` of 0 that a driver leaves in a
/// QP never moved to RTR) takes `QpAttr::default()`'s value for that field (a state,
/// `Unknown`).
pub fn qp_attr_from_query(a: &sys::ibv_qp_attr) -> QpAttr {
    let d = QpAttr::default();
    QpAttr {
        qp_state: QpState::try_from(a.qp_state).unwrap_or(QpState::Unknown),
        cur_qp_state: QpState::try_from(a.cur_qp_state).unwrap_or(QpState::Unknown),
        path_mtu: Mtu::try_from(a.path_mtu).unwrap_or(d.path_mtu),
        path_mig_state: MigState::try_from(a.path_mig_state).unwrap_or(d.path_mig_state),
        sq_draining: a.sq_draining != 0,
        ..qp_attr_plain(a, QpAttrMask::all())
    }
}

/// [`QpAttr`] to `ibv_qp_attr`: every field (the mask passed beside it says which are
/// read).
pub fn qp_attr_to_c(q: &QpAttr) -> sys::ibv_qp_attr {
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
/// union). A memory window bind's `mw_rkey` and MR are pointers the caller resolves:
/// here they are 0. EINVAL for an opcode the emulator does not take.
pub fn wr_operation_from_c(wr: &sys::ibv_send_wr) -> Result<WrOperation> {
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

/// `ibv_mw_bind_info` to [`MwBindInfo`] (the MR is given by its lkey, which the caller
/// reads from the MR the struct points to).
pub fn bind_info_from_c(b: &sys::ibv_mw_bind_info, mr_lkey: u32) -> MwBindInfo {
    MwBindInfo {
        mr_lkey,
        addr: b.addr,
        length: b.length,
        mw_access_flags: AccessFlags::from_bits_retain(b.mw_access_flags),
    }
}

/// An `ibv_send_wr` to [`SendWr`], given the SGEs and (for UD) the address handle,
/// remote QPN and Q_Key that the caller has read and resolved.
pub fn send_wr_from_c(
    wr: &sys::ibv_send_wr,
    sg_list: impl Into<SgList>,
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
        xrc_remote_srqn: None,
    })
}

/// The UD destination fields of an `ibv_send_wr` (AH pointer, remote QPN, Q_Key).
pub fn ud_fields(wr: &sys::ibv_send_wr) -> (*mut sys::ibv_ah, u32, u32) {
    // SAFETY: union of integer/pointer structs (module docs); the pointer is copied.
    let ud = unsafe { wr.wr.ud };
    (ud.ah, ud.remote_qpn, ud.remote_qkey)
}

/// A [`RecvWr`] from an `ibv_recv_wr`'s id and the SGEs the caller has read.
pub fn recv_wr(wr_id: u64, sg_list: impl Into<SgList>) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: sg_list.into(),
    }
}

/// [`WorkCompletion`] to `ibv_wc`. The union word is `invalidated_rkey` when
/// `WITH_INV` is set, else `imm_data` back in network order, as [`wc_from_c`] reads it.
pub fn wc_to_c(w: &WorkCompletion) -> sys::ibv_wc {
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
    if w.wc_flags.contains(WcFlags::WITH_INV) {
        c.__bindgen_anon_1.invalidated_rkey = w.invalidated_rkey;
    } else {
        c.__bindgen_anon_1.imm_data = w.imm_data.to_be();
    }
    c
}

/// `ibv_wc` (what `ibv_poll_cq` filled in) to [`WorkCompletion`]. The union word is
/// read as `imm_data` (network order) when `WITH_IMM` is set and as
/// `invalidated_rkey` when `WITH_INV` is. An opcode outside `enum ibv_wc_opcode`
/// (libibverbs leaves it undefined on error completions) reads as `Send`; a status
/// outside `enum ibv_wc_status` reads as `GeneralErr` (`vendor_err` keeps the
/// driver's syndrome).
pub fn wc_from_c(c: &sys::ibv_wc) -> WorkCompletion {
    let flags = WcFlags::from_bits_retain(c.wc_flags);
    // SAFETY: both union members are u32 (module docs); `wc_flags` says which one is
    // meant.
    let word = unsafe { c.__bindgen_anon_1.invalidated_rkey };
    WorkCompletion {
        wr_id: c.wr_id,
        status: WcStatus::try_from(c.status).unwrap_or(WcStatus::GeneralErr),
        opcode: WcOpcode::try_from(c.opcode).unwrap_or(WcOpcode::Send),
        vendor_err: c.vendor_err,
        byte_len: c.byte_len,
        imm_data: if flags.contains(WcFlags::WITH_IMM) {
            u32::from_be(word)
        } else {
            0
        },
        invalidated_rkey: if flags.contains(WcFlags::WITH_INV) {
            word
        } else {
            0
        },
        qp_num: c.qp_num,
        src_qp: c.src_qp,
        wc_flags: flags,
        pkey_index: c.pkey_index,
        slid: c.slid,
        sl: c.sl,
        dlid_path_bits: c.dlid_path_bits,
    }
}

/// Bytes of `struct ibv_grh` (IBTA 8.3: the GRH a UD receive buffer begins with).
pub const GRH_LEN: usize = 40;

/// `struct ibv_grh` from the first 40 bytes of a UD receive buffer (fewer are padded
/// with zeros). The fields keep the wire's byte order (`version_tclass_flow` and
/// `paylen` are `__be32`/`__be16` in C), so the struct is the bytes as they were.
pub fn grh_to_c(bytes: &[u8]) -> sys::ibv_grh {
    let mut b = [0u8; GRH_LEN];
    let n = bytes.len().min(GRH_LEN);
    b[..n].copy_from_slice(&bytes[..n]);
    let gid = |at: usize| {
        let mut raw = [0u8; 16];
        raw.copy_from_slice(&b[at..at + 16]);
        sys::ibv_gid { raw }
    };
    sys::ibv_grh {
        version_tclass_flow: u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        paylen: u16::from_ne_bytes([b[4], b[5]]),
        next_hdr: b[6],
        hop_limit: b[7],
        sgid: gid(8),
        dgid: gid(24),
    }
}

/// Copies `s` into a fixed C string buffer, NUL-terminated, truncating.
pub fn c_string<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

/// The text of a fixed C string buffer, up to its first NUL (all of it if none), with
/// bytes that are not UTF-8 replaced.
pub fn string_from_c(s: &[c_char]) -> String {
    let bytes: Vec<u8> = s
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A `u32` count as the `int` of `struct ibv_device_attr` (saturating).
fn clamp_i32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// An `int` count of `struct ibv_device_attr` as `u32` (never negative in practice:
/// a negative one reads as 0).
fn count(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// [`DeviceAttr`] to `ibv_device_attr` (GUIDs in network order, as verbs.h keeps them;
/// counts above `i32::MAX` saturate).
pub fn device_attr_to_c(d: &DeviceAttr) -> sys::ibv_device_attr {
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

/// The extended capability bits of `ibv_device_attr_ex.device_cap_flags_ex` (the
/// bits above the 32 of `device_cap_flags`; unknown ones are kept).
pub fn device_cap_flags_ex_from_c(flags_ex: u64) -> DeviceCapFlagsEx {
    DeviceCapFlagsEx::from_bits_retain(flags_ex & !u64::from(u32::MAX))
}

/// `device_cap_flags_ex` of `ibv_device_attr_ex`: the 32 bits of `device_cap_flags`
/// and the extended ones above them.
pub fn device_cap_flags_ex_to_c(d: &DeviceAttr) -> u64 {
    u64::from(d.device_cap_flags.bits()) | d.device_cap_flags_ex.bits()
}

/// `ibv_device_attr` to [`DeviceAttr`] (an `atomic_cap` outside its enum reads as
/// `None`).
pub fn device_attr_from_c(a: &sys::ibv_device_attr) -> DeviceAttr {
    DeviceAttr {
        fw_ver: string_from_c(&a.fw_ver),
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
        // Only `ibv_device_attr_ex` has them (see `device_cap_flags_ex_from_c`).
        device_cap_flags_ex: DeviceCapFlagsEx::empty(),
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

/// [`PortAttr`] to `ibv_port_attr` (`flags` and `port_cap_flags2` 0).
pub fn port_attr_to_c(p: &PortAttr) -> sys::ibv_port_attr {
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

/// `ibv_port_attr` to [`PortAttr`] (a state outside its enum reads as `Nop`, an MTU as
/// the default's, a link layer as `Unspecified`).
pub fn port_attr_from_c(a: &sys::ibv_port_attr) -> PortAttr {
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

/// `ibv_srq_attr` to [`SrqAttr`].
pub fn srq_attr_from_c(a: &sys::ibv_srq_attr) -> SrqAttr {
    SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// [`SrqAttr`] to `ibv_srq_attr`.
pub fn srq_attr_to_c(a: &SrqAttr) -> sys::ibv_srq_attr {
    sys::ibv_srq_attr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// `ibv_event_type` of an [`AsyncEventType`].
pub fn event_type_to_c(t: AsyncEventType) -> sys::ibv_event_type {
    t.as_u32()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The immediate data of a `ibv_wc` as the wire carries it (host order).
    fn wc_imm(c: &sys::ibv_wc) -> u32 {
        // SAFETY: union of integers (module docs).
        u32::from_be(unsafe { c.__bindgen_anon_1.imm_data })
    }

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
    fn ud_fields_and_bind_info_read_their_union_members() {
        let mut wr = sys::ibv_send_wr {
            opcode: sys::IBV_WR_SEND,
            ..Default::default()
        };
        wr.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah: std::ptr::null_mut(),
            remote_qpn: 0x12,
            remote_qkey: 0x1111,
        };
        assert_eq!(ud_fields(&wr), (std::ptr::null_mut(), 0x12, 0x1111));
        let b = sys::ibv_mw_bind_info {
            addr: 0x1000,
            length: 64,
            mw_access_flags: sys::IBV_ACCESS_REMOTE_READ,
            ..Default::default()
        };
        let i = bind_info_from_c(&b, 7);
        assert_eq!((i.mr_lkey, i.addr, i.length), (7, 0x1000, 64));
        assert_eq!(i.mw_access_flags, AccessFlags::REMOTE_READ);
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
    fn queried_qp_attr_takes_defaults_for_values_out_of_range() {
        let a = sys::ibv_qp_attr {
            qp_state: 99,
            cur_qp_state: 99,
            path_mtu: 0, // what a driver leaves before RTR
            path_mig_state: 99,
            sq_draining: 1,
            ..Default::default()
        };
        let q = qp_attr_from_query(&a);
        let d = QpAttr::default();
        assert_eq!(
            (q.qp_state, q.cur_qp_state),
            (QpState::Unknown, QpState::Unknown)
        );
        assert_eq!(
            (q.path_mtu, q.path_mig_state),
            (d.path_mtu, d.path_mig_state)
        );
        assert!(q.sq_draining);
    }

    #[test]
    fn wc_reads_the_union_by_flag() {
        let imm = 0x1234_5678u32;
        let mut c = sys::ibv_wc {
            wr_id: 7,
            opcode: sys::IBV_WC_RECV_RDMA_WITH_IMM,
            wc_flags: sys::IBV_WC_WITH_IMM,
            ..Default::default()
        };
        c.__bindgen_anon_1.imm_data = imm.to_be();
        let wc = wc_from_c(&c);
        assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc.imm(), Some(imm));
        assert_eq!(wc.invalidated(), None);
        c.wc_flags = sys::IBV_WC_WITH_INV;
        c.__bindgen_anon_1.invalidated_rkey = 0xabcd;
        let wc = wc_from_c(&c);
        assert_eq!(wc.invalidated(), Some(0xabcd));
        assert_eq!(wc.imm_data, 0);
        // An error completion with an opcode libibverbs leaves undefined.
        let c = sys::ibv_wc {
            status: sys::IBV_WC_WR_FLUSH_ERR,
            opcode: 0xdead,
            vendor_err: 0x99,
            ..Default::default()
        };
        let wc = wc_from_c(&c);
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::WrFlushErr, WcOpcode::Send)
        );
        assert_eq!(wc.vendor_err, 0x99);
        let c = sys::ibv_wc {
            status: 0xdead,
            ..Default::default()
        };
        assert_eq!(wc_from_c(&c).status, WcStatus::GeneralErr);
    }

    #[test]
    fn grh_keeps_the_wire_bytes() {
        assert_eq!(std::mem::size_of::<sys::ibv_grh>(), GRH_LEN);
        let bytes: Vec<u8> = (0..GRH_LEN as u8).collect();
        let g = grh_to_c(&bytes);
        assert_eq!(g.version_tclass_flow.to_ne_bytes(), [0, 1, 2, 3]);
        assert_eq!(g.paylen.to_ne_bytes(), [4, 5]);
        assert_eq!((g.next_hdr, g.hop_limit), (6, 7));
        assert_eq!(gid_from_c(&g.sgid).0[..], bytes[8..24]);
        assert_eq!(gid_from_c(&g.dgid).0[..], bytes[24..40]);
        // short buffers are padded with zeros
        assert_eq!(gid_from_c(&grh_to_c(&bytes[..30]).dgid).0[6..], [0; 10]);
    }

    #[test]
    fn c_strings_truncate_terminate_and_read_back() {
        let s: [c_char; 4] = c_string("abcdef");
        assert_eq!(s, [97, 98, 99, 0]);
        assert_eq!(string_from_c(&s), "abc");
        assert_eq!(string_from_c(&[97, 98]), "ab");
    }

    #[test]
    fn extended_device_caps_round_trip_above_the_32_bits() {
        let d = DeviceAttr {
            device_cap_flags: DeviceCapFlags::MEM_WINDOW,
            device_cap_flags_ex: DeviceCapFlagsEx::ATOMIC_WRITE | DeviceCapFlagsEx::FLUSH_GLOBAL,
            ..DeviceAttr::default()
        };
        let ex = device_cap_flags_ex_to_c(&d);
        assert_eq!(ex, (1 << 17) | (1 << 40) | (1 << 38));
        assert_eq!(device_cap_flags_ex_from_c(ex), d.device_cap_flags_ex);
    }

    #[test]
    fn device_attr_counts_saturate_both_ways() {
        let d = DeviceAttr {
            max_qp: u32::MAX,
            ..DeviceAttr::default()
        };
        assert_eq!(device_attr_to_c(&d).max_qp, i32::MAX);
        let c = sys::ibv_device_attr {
            max_cq: -1,
            ..Default::default()
        };
        assert_eq!(device_attr_from_c(&c).max_cq, 0);
    }

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

    fn any_cap() -> impl Strategy<Value = QpCap> {
        any::<(u32, u32, u32, u32, u32)>().prop_map(|(sw, rw, ss, rs, inl)| QpCap {
            max_send_wr: sw,
            max_recv_wr: rw,
            max_send_sge: ss,
            max_recv_sge: rs,
            max_inline_data: inl,
        })
    }

    fn any_qp_attr() -> impl Strategy<Value = QpAttr> {
        (
            (
                0..QpState::ALL.len(),
                0..QpState::ALL.len(),
                0..Mtu::ALL.len(),
            ),
            any::<(u32, u32, u32, u32, u16, u16, u32)>(),
            any::<(u8, u8, u8, u8, u8, u8, u8, u8, u8)>(),
            (any::<(bool, bool)>(), any::<u32>(), 0..3usize),
            (any_cap(), any_ah(), any_ah()),
        )
            .prop_map(|(enums, nums, small, misc, structs)| QpAttr {
                qp_state: QpState::ALL[enums.0],
                cur_qp_state: QpState::ALL[enums.1],
                path_mtu: Mtu::ALL[enums.2],
                path_mig_state: [MigState::Migrated, MigState::Rearm, MigState::Armed][misc.2],
                qkey: nums.0,
                rq_psn: nums.1 & 0xff_ffff,
                sq_psn: nums.2 & 0xff_ffff,
                dest_qp_num: nums.3 & 0xff_ffff,
                pkey_index: nums.4,
                alt_pkey_index: nums.5,
                rate_limit: nums.6,
                qp_access_flags: AccessFlags::from_bits_retain(misc.1),
                max_rd_atomic: small.0,
                max_dest_rd_atomic: small.1,
                min_rnr_timer: small.2,
                port_num: small.3,
                timeout: small.4,
                retry_cnt: small.5,
                rnr_retry: small.6,
                alt_port_num: small.7,
                alt_timeout: small.8,
                en_sqd_async_notify: misc.0 .0,
                sq_draining: misc.0 .1,
                cap: structs.0,
                ah_attr: structs.1,
                alt_ah_attr: structs.2,
            })
    }

    /// A completion as a device reports one: the immediate data only with `WITH_IMM`,
    /// the invalidated rkey only with `WITH_INV`, never both.
    fn any_wc() -> impl Strategy<Value = WorkCompletion> {
        (
            (0..WcStatus::ALL.len(), 0..WcOpcode::ALL.len(), 0..3u8),
            any::<(u64, u32, u32, u32, u32, u32, u32)>(),
            any::<(u16, u16, u8, u8, bool)>(),
        )
            .prop_map(|((status, opcode, word), n, s)| {
                let mut w =
                    WorkCompletion::new(n.0, WcStatus::ALL[status], WcOpcode::ALL[opcode], n.1);
                (w.vendor_err, w.byte_len, w.src_qp) = (n.2, n.3, n.4);
                (w.pkey_index, w.slid, w.sl, w.dlid_path_bits) = (s.0, s.1, s.2, s.3);
                if s.4 {
                    w.wc_flags |= WcFlags::GRH;
                }
                match word {
                    1 => (w.wc_flags, w.imm_data) = (w.wc_flags | WcFlags::WITH_IMM, n.5),
                    2 => (w.wc_flags, w.invalidated_rkey) = (w.wc_flags | WcFlags::WITH_INV, n.6),
                    _ => {}
                }
                w
            })
    }

    fn any_device_attr() -> impl Strategy<Value = DeviceAttr> {
        (
            "[ -~]{0,63}",
            any::<(u64, u64, u64, u64, u32, u32, u32)>(),
            proptest::collection::vec(0..=i32::MAX as u32, 27),
            (any::<u32>(), 0..3usize, any::<(u16, u8, u8)>()),
        )
            .prop_map(|(fw_ver, ids, c, (caps, atomic, tail))| DeviceAttr {
                fw_ver,
                node_guid: ids.0,
                sys_image_guid: ids.1,
                max_mr_size: ids.2,
                page_size_cap: ids.3,
                vendor_id: ids.4,
                vendor_part_id: ids.5,
                hw_ver: ids.6,
                device_cap_flags: DeviceCapFlags::from_bits_retain(caps),
                device_cap_flags_ex: DeviceCapFlagsEx::empty(),
                atomic_cap: [AtomicCap::None, AtomicCap::Hca, AtomicCap::Glob][atomic],
                max_qp: c[0],
                max_qp_wr: c[1],
                max_sge: c[2],
                max_sge_rd: c[3],
                max_cq: c[4],
                max_cqe: c[5],
                max_mr: c[6],
                max_pd: c[7],
                max_qp_rd_atom: c[8],
                max_ee_rd_atom: c[9],
                max_res_rd_atom: c[10],
                max_qp_init_rd_atom: c[11],
                max_ee_init_rd_atom: c[12],
                max_ee: c[13],
                max_rdd: c[14],
                max_mw: c[15],
                max_raw_ipv6_qp: c[16],
                max_raw_ethy_qp: c[17],
                max_mcast_grp: c[18],
                max_mcast_qp_attach: c[19],
                max_total_mcast_qp_attach: c[20],
                max_ah: c[21],
                max_fmr: c[22],
                max_map_per_fmr: c[23],
                max_srq: c[24],
                max_srq_wr: c[25],
                max_srq_sge: c[26],
                max_pkeys: tail.0,
                local_ca_ack_delay: tail.1,
                phys_port_cnt: tail.2,
            })
    }

    fn any_port_attr() -> impl Strategy<Value = PortAttr> {
        (
            (
                0..PortState::ALL.len(),
                0..Mtu::ALL.len(),
                0..Mtu::ALL.len(),
                0..3usize,
            ),
            (0..=i32::MAX as u32, any::<(u32, u32, u32, u32, u16)>()),
            any::<(u16, u16, u8, u8, u8, u8, u8, u8, u8, u8)>(),
        )
            .prop_map(|(e, (gid_tbl_len, n), s)| PortAttr {
                state: PortState::ALL[e.0],
                max_mtu: Mtu::ALL[e.1],
                active_mtu: Mtu::ALL[e.2],
                link_layer: [
                    LinkLayer::Unspecified,
                    LinkLayer::InfiniBand,
                    LinkLayer::Ethernet,
                ][e.3],
                gid_tbl_len,
                port_cap_flags: n.0,
                max_msg_sz: n.1,
                bad_pkey_cntr: n.2,
                qkey_viol_cntr: n.3,
                pkey_tbl_len: n.4,
                lid: s.0,
                sm_lid: s.1,
                lmc: s.2,
                max_vl_num: s.3,
                sm_sl: s.4,
                subnet_timeout: s.5,
                init_type_reply: s.6,
                active_width: s.7,
                active_speed: s.8,
                phys_state: s.9,
            })
    }

    proptest! {
        /// Every QP attribute survives C and back: through the strict reader with the
        /// whole mask (all but `sq_draining`, which a program never sets), and through
        /// the reader of queried attributes.
        #[test]
        fn qp_attr_round_trips(q in any_qp_attr()) {
            let c = qp_attr_to_c(&q);
            prop_assert_eq!(qp_attr_from_query(&c), q);
            let strict = qp_attr_from_c(&c, QpAttrMask::all()).unwrap();
            prop_assert_eq!(strict, QpAttr { sq_draining: false, ..q });
        }

        /// Address vectors, capabilities, GIDs, SGEs and SRQ attributes, C and back.
        #[test]
        fn small_structs_round_trip(
            ah in any_ah(),
            cap in any_cap(),
            sge in any::<(u64, u32, u32)>(),
            srq in any::<(u32, u32, u32)>(),
        ) {
            prop_assert_eq!(ah_attr_from_c(&ah_attr_to_c(&ah)), ah);
            prop_assert_eq!(cap_from_c(&cap_to_c(&cap)), cap);
            prop_assert_eq!(gid_from_c(&gid_to_c(&ah.grh.dgid)), ah.grh.dgid);
            let s = Sge::new(sge.0, sge.1, sge.2);
            prop_assert_eq!(sge_from_c(&sge_to_c(&s)), s);
            let a = SrqAttr { max_wr: srq.0, max_sge: srq.1, srq_limit: srq.2 };
            prop_assert_eq!(srq_attr_from_c(&srq_attr_to_c(&a)), a);
        }

        /// A completion survives C and back, immediate data in network order in C.
        #[test]
        fn wc_round_trips(w in any_wc()) {
            let c = wc_to_c(&w);
            if w.wc_flags.contains(WcFlags::WITH_IMM) {
                prop_assert_eq!(wc_imm(&c), w.imm_data);
            }
            prop_assert_eq!(wc_from_c(&c), w);
        }

        /// Device and port attributes survive C and back (counts within `int`, an
        /// ASCII firmware version within the 63 bytes before the NUL).
        #[test]
        fn device_and_port_attrs_round_trip(d in any_device_attr(), p in any_port_attr()) {
            prop_assert_eq!(device_attr_from_c(&device_attr_to_c(&d)), d);
            prop_assert_eq!(port_attr_from_c(&port_attr_to_c(&p)), p);
        }

        /// Access and send flags cross as their bits, unknown bits included.
        #[test]
        fn flags_round_trip(bits in any::<u32>()) {
            let q = QpAttr { qp_access_flags: AccessFlags::from_bits_retain(bits), ..QpAttr::default() };
            let back = qp_attr_from_c(&qp_attr_to_c(&q), QpAttrMask::ACCESS_FLAGS).unwrap();
            prop_assert_eq!(back.qp_access_flags.bits(), bits);
            let wr = sys::ibv_send_wr { send_flags: bits, opcode: sys::IBV_WR_SEND, ..Default::default() };
            prop_assert_eq!(send_wr_from_c(&wr, vec![], None).unwrap().send_flags.bits(), bits);
            let w = WorkCompletion {
                wc_flags: WcFlags::from_bits_retain(bits & !(WcFlags::WITH_IMM | WcFlags::WITH_INV).bits()),
                ..WorkCompletion::default()
            };
            prop_assert_eq!(wc_from_c(&wc_to_c(&w)).wc_flags, w.wc_flags);
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
        }

        /// An unknown opcode is EINVAL, never a panic.
        #[test]
        fn unknown_opcodes_are_refused(op in 11u32..u32::MAX) {
            let wr = sys::ibv_send_wr { opcode: op, ..Default::default() };
            prop_assert_eq!(wr_operation_from_c(&wr).unwrap_err().errno(), 22);
        }
    }
}
