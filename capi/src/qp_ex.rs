//! Extended send verbs (`ibv_qp_to_qp_ex` + `ibv_wr_*`, man page `ibv_wr_post(3)`):
//! between `ibv_wr_start` and `ibv_wr_complete` each `ibv_wr_<op>` call starts a work
//! request (its `wr_id` and flags are the `ibv_qp_ex` fields at that moment) and the
//! `ibv_wr_set_*` calls complete it; `ibv_wr_complete` posts the batch with the same
//! `Device::post_send` as `ibv_post_send`, `ibv_wr_abort` drops it.
//!
//! Safety argument: the `ibv_qp_ex` pointer is one this library made (every QP is an
//! `ibv_qp_ex`; [`crate::objects`]) and the SGE list and AH pointers follow the
//! `ibv_wr_*` contract ([`crate::verbs`]).

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use verbs_api::{FlushLevel, FlushPlacement, SendFlags, SendWr, Sge, UdDest, WrOperation};

use crate::objects::{from_ptr, Ah, Context, Mw, Qp};
use crate::sys;

/// `IBV_QP_EX_WITH_FLUSH` (rdma-core 45 `enum ibv_qp_create_send_ops_flags`; the v44
/// headers the C structs are generated from stop at `IBV_QP_EX_WITH_ATOMIC_WRITE`).
pub(crate) const IBV_QP_EX_WITH_FLUSH: u32 = 1 << 11;

/// The type of `ibv_qp_ex.wr_flush` (rdma-core 45): `(qp, rkey, remote_addr, len,
/// type, level)`, `type` the `IBV_FLUSH_GLOBAL`/`IBV_FLUSH_PERSISTENT` bits, `level`
/// `IBV_FLUSH_RANGE` (0) or `IBV_FLUSH_MR` (1).
pub(crate) type WrFlushFn =
    Option<unsafe extern "C" fn(*mut sys::ibv_qp_ex, u32, u64, usize, u8, u8)>;

/// The work requests of one `ibv_wr_start` .. `ibv_wr_complete` batch.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    wrs: Vec<SendWr>,
    /// The first error met while building (returned by `ibv_wr_complete`).
    error: Option<c_int>,
    /// Type 2 binds in the batch: (WR index, the `ibv_mw`'s address, the new rkey),
    /// written to the windows once posted (`crate::verbs::mw::note_type2_bind`).
    binds: Vec<(usize, usize, u32)>,
}

/// Fills the `ibv_wr_*` function pointers of a new QP.
pub(crate) fn install(r: &mut sys::ibv_qp_ex) {
    r.wr_start = Some(wr_start);
    r.wr_complete = Some(wr_complete);
    r.wr_abort = Some(wr_abort);
    r.wr_send = Some(wr_send);
    r.wr_send_imm = Some(wr_send_imm);
    r.wr_send_inv = Some(wr_send_inv);
    r.wr_rdma_write = Some(wr_rdma_write);
    r.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    r.wr_rdma_read = Some(wr_rdma_read);
    r.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    r.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    r.wr_local_inv = Some(wr_local_inv);
    r.wr_bind_mw = Some(wr_bind_mw);
    r.wr_send_tso = Some(wr_send_tso);
    r.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    r.wr_atomic_write = Some(wr_atomic_write);
    r.wr_set_sge = Some(wr_set_sge);
    r.wr_set_sge_list = Some(wr_set_sge_list);
    r.wr_set_ud_addr = Some(wr_set_ud_addr);
    r.wr_set_inline_data = Some(wr_set_inline_data);
    r.wr_set_inline_data_list = Some(wr_set_inline_data_list);
}

fn with_batch(qp: *mut sys::ibv_qp_ex, f: impl FnOnce(&mut Batch, &sys::ibv_qp_ex)) {
    // SAFETY: module safety argument.
    if let Some(q) = unsafe { from_ptr::<_, Qp>(qp) } {
        f(&mut q.building.lock(), &q.raw);
    }
}

fn start_wr(qp: *mut sys::ibv_qp_ex, op: WrOperation) {
    with_batch(qp, |b, raw| {
        b.wrs.push(SendWr {
            wr_id: raw.wr_id,
            sg_list: verbs_api::SgList::new(),
            op,
            send_flags: SendFlags::from_bits_retain(raw.wr_flags),
            ud: None,
            xrc_remote_srqn: None,
        });
    });
}

fn fail_batch(qp: *mut sys::ibv_qp_ex, errno: c_int) {
    with_batch(qp, |b, _| {
        b.error.get_or_insert(errno);
    });
}

fn on_last(qp: *mut sys::ibv_qp_ex, f: impl FnOnce(&mut SendWr)) {
    with_batch(qp, |b, _| match b.wrs.last_mut() {
        Some(w) => f(w),
        None => {
            b.error.get_or_insert(libc::EINVAL);
        }
    });
}

unsafe extern "C" fn wr_start(qp: *mut sys::ibv_qp_ex) {
    with_batch(qp, |b, _| *b = Batch::default());
}

unsafe extern "C" fn wr_abort(qp: *mut sys::ibv_qp_ex) {
    with_batch(qp, |b, _| *b = Batch::default());
}

unsafe extern "C" fn wr_complete(qp: *mut sys::ibv_qp_ex) -> c_int {
    // SAFETY: module safety argument.
    let Some(q) = (unsafe { from_ptr::<_, Qp>(qp) }) else {
        return libc::EINVAL;
    };
    let mut batch = std::mem::take(&mut *q.building.lock());
    if let Some(e) = batch.error {
        return e;
    }
    // SAFETY: the QP's context pointer is its live context. Posting is the data path:
    // not looked up among the open contexts (crate::objects).
    let Some(ctx) = (unsafe { Context::from_ptr_unchecked(q.raw.qp_base.context) }) else {
        return libc::EINVAL;
    };
    let r = crate::verbs::post_send_staged(ctx, q, &mut batch.wrs);
    let posted = r.as_ref().err().map_or(usize::MAX, |e| e.index);
    for &(_, mw, rkey) in batch.binds.iter().filter(|b| b.0 < posted) {
        // SAFETY: the program's window, named in this batch.
        unsafe { crate::verbs::mw::note_type2_bind(mw as *mut sys::ibv_mw, rkey) };
    }
    match r {
        Ok(()) => 0,
        Err(e) => e.error.errno(),
    }
}

unsafe extern "C" fn wr_send(qp: *mut sys::ibv_qp_ex) {
    start_wr(qp, WrOperation::Send);
}
unsafe extern "C" fn wr_send_imm(qp: *mut sys::ibv_qp_ex, imm: u32) {
    start_wr(
        qp,
        WrOperation::SendWithImm {
            imm_data: u32::from_be(imm),
        },
    );
}
unsafe extern "C" fn wr_send_inv(qp: *mut sys::ibv_qp_ex, rkey: u32) {
    start_wr(
        qp,
        WrOperation::SendWithInv {
            invalidate_rkey: rkey,
        },
    );
}
unsafe extern "C" fn wr_rdma_write(qp: *mut sys::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    start_wr(qp, WrOperation::RdmaWrite { remote_addr, rkey });
}
unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm: u32,
) {
    start_wr(
        qp,
        WrOperation::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm_data: u32::from_be(imm),
        },
    );
}
unsafe extern "C" fn wr_rdma_read(qp: *mut sys::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    start_wr(qp, WrOperation::RdmaRead { remote_addr, rkey });
}
unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    start_wr(
        qp,
        WrOperation::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        },
    );
}
unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    start_wr(
        qp,
        WrOperation::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        },
    );
}
unsafe extern "C" fn wr_local_inv(qp: *mut sys::ibv_qp_ex, rkey: u32) {
    start_wr(
        qp,
        WrOperation::LocalInv {
            invalidate_rkey: rkey,
        },
    );
}

/// `ibv_wr_bind_mw`: a type 2 window bound by a work request, as `IBV_WR_BIND_MW`
/// through `ibv_post_send` (the window is named by its current rkey, the MR by its
/// lkey; a zero-length bind needs no MR).
unsafe extern "C" fn wr_bind_mw(
    qp: *mut sys::ibv_qp_ex,
    mw: *mut sys::ibv_mw,
    rkey: u32,
    bind_info: *const sys::ibv_mw_bind_info,
) {
    // SAFETY: module safety argument (the caller's MW and bind info).
    let (Some(m), Some(b)) = (unsafe { from_ptr::<_, Mw>(mw) }, unsafe {
        bind_info.as_ref()
    }) else {
        return fail_batch(qp, libc::EINVAL);
    };
    let Some(lkey) = crate::verbs::mw::bind_lkey(b) else {
        return fail_batch(qp, libc::EINVAL);
    };
    start_wr(
        qp,
        WrOperation::BindMw {
            mw_rkey: m.raw.rkey,
            new_rkey: rkey,
            bind_info: verbs_ffi::convert::bind_info_from_c(b, lkey),
        },
    );
    with_batch(qp, |batch, _| {
        if let Some(i) = batch.wrs.len().checked_sub(1) {
            batch.binds.push((i, mw as usize, rkey));
        }
    });
}

unsafe extern "C" fn wr_send_tso(qp: *mut sys::ibv_qp_ex, _: *mut c_void, _: u16, _: u16) {
    crate::verbs::unsupported("ibv_wr_send_tso");
    fail_batch(qp, libc::EOPNOTSUPP);
}
/// `ibv_wr_set_xrc_srqn`: the XRC SRQ at the target of the WR being built.
unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut sys::ibv_qp_ex, remote_srqn: u32) {
    on_last(qp, |w| w.xrc_remote_srqn = Some(remote_srqn));
}
/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` are copied now, as rdma-core's
/// providers copy them into the WQE, so the caller may reuse them at once.
unsafe extern "C" fn wr_atomic_write(
    qp: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    if atomic_wr.is_null() {
        return fail_batch(qp, libc::EINVAL);
    }
    let mut data = [0u8; 8];
    // SAFETY: the caller's 8 bytes (the `ibv_wr_atomic_write` contract).
    data.copy_from_slice(unsafe { std::slice::from_raw_parts(atomic_wr.cast::<u8>(), 8) });
    start_wr(
        qp,
        WrOperation::AtomicWrite {
            remote_addr,
            rkey,
            data,
        },
    );
}

/// `ibv_wr_flush` (rdma-core 45): a FLUSH of `len` bytes at `remote_addr`, or of the
/// whole region with level `IBV_FLUSH_MR`. A length past 32 bits (the RETH's) or an
/// unknown level is EINVAL at `ibv_wr_complete`; the placement type is checked there
/// by the device (EINVAL too).
pub(crate) unsafe extern "C" fn wr_flush(
    qp: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: usize,
    placement: u8,
    level: u8,
) {
    let (Ok(length), Ok(level)) = (u32::try_from(len), FlushLevel::try_from(u32::from(level)))
    else {
        return fail_batch(qp, libc::EINVAL);
    };
    start_wr(
        qp,
        WrOperation::Flush {
            remote_addr,
            rkey,
            length,
            placement: FlushPlacement::from_bits_retain(placement),
            level,
        },
    );
}

unsafe extern "C" fn wr_set_sge(qp: *mut sys::ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    on_last(qp, |w| w.sg_list = Sge::new(addr, length, lkey).into());
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut sys::ibv_qp_ex, n: usize, list: *const sys::ibv_sge) {
    let sges: Vec<Sge> = if n == 0 || list.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller's array of n SGEs.
        unsafe { std::slice::from_raw_parts(list, n) }
            .iter()
            .map(verbs_ffi::convert::sge_from_c)
            .collect()
    };
    on_last(qp, |w| w.sg_list = sges.into());
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut sys::ibv_qp_ex,
    ah: *mut sys::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: module safety argument.
    match unsafe { from_ptr::<_, Ah>(ah) } {
        Some(a) => on_last(qp, |w| {
            w.ud = Some(UdDest {
                ah: a.id,
                remote_qpn,
                remote_qkey,
            });
        }),
        None => fail_batch(qp, libc::EINVAL),
    }
}

/// INLINE data given by pointer: an SGE with key 0 and the INLINE flag, which
/// `post_send_staged` copies at post time.
unsafe extern "C" fn wr_set_inline_data(qp: *mut sys::ibv_qp_ex, addr: *mut c_void, length: usize) {
    let Ok(len) = u32::try_from(length) else {
        return fail_batch(qp, libc::EINVAL);
    };
    on_last(qp, |w| {
        w.sg_list = Sge::new(addr as u64, len, 0).into();
        w.send_flags |= SendFlags::INLINE;
    });
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut sys::ibv_qp_ex,
    n: usize,
    list: *const sys::ibv_data_buf,
) {
    let bufs: &[sys::ibv_data_buf] = if n == 0 || list.is_null() {
        &[]
    } else {
        // SAFETY: the caller's array of n buffers.
        unsafe { std::slice::from_raw_parts(list, n) }
    };
    let sges: Vec<Sge> = bufs
        .iter()
        .map(|b| {
            Sge::new(
                b.addr as u64,
                u32::try_from(b.length).unwrap_or(u32::MAX),
                0,
            )
        })
        .collect();
    on_last(qp, |w| {
        w.sg_list = sges.into();
        w.send_flags |= SendFlags::INLINE;
    });
}
