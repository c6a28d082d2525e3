//! Memory windows (the `ctx->ops` entries the inline MW verbs call).
//! (Safety argument: the parent module's.)

use super::*;

pub(super) unsafe extern "C" fn op_alloc_mw(
    pd: *mut sys::ibv_pd,
    mw_type: sys::ibv_mw_type,
) -> *mut sys::ibv_mw {
    let (p, ctx) = live_or!(Pd, pd, |_e| null(EINVAL));
    let Ok(t) = MwType::try_from(mw_type) else {
        return null(EINVAL);
    };
    match ctx.dev.alloc_mw(p.id, t) {
        Ok(info) => {
            let m = into_ptr::<_, Mw>(Mw {
                raw: sys::ibv_mw {
                    context: p.raw.context,
                    pd,
                    rkey: info.rkey,
                    handle: info.id.0,
                    type_: mw_type,
                },
                id: info.id,
            });
            ctx.record(Kind::Mw, info.id.0, m);
            m
        }
        Err(e) => null(fail(&e)),
    }
}

pub(super) unsafe extern "C" fn op_dealloc_mw(mw: *mut sys::ibv_mw) -> c_int {
    let (m, ctx) = live_or!(Mw, mw, |e| e);
    match ctx.dev.dealloc_mw(m.id) {
        Ok(()) => {
            ctx.forget(Kind::Mw, m.id.0);
            // SAFETY: made by ibv_alloc_mw; destroyed once (it left the table).
            unsafe { free::<_, Mw>(mw) };
            0
        }
        Err(e) => fail(&e),
    }
}

pub(super) unsafe extern "C" fn op_bind_mw(
    qp: *mut sys::ibv_qp,
    mw: *mut sys::ibv_mw,
    bind: *mut sys::ibv_mw_bind,
) -> c_int {
    let (q, ctx) = live_or!(Qp, qp, |e| e);
    let m = obj_or!(Mw, mw, EINVAL);
    if bind.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's bind request.
    let b = unsafe { &*bind };
    let Some(lkey) = bind_lkey(&b.bind_info) else {
        return EINVAL;
    };
    let req = MwBind {
        wr_id: b.wr_id,
        send_flags: SendFlags::from_bits_retain(b.send_flags),
        bind_info: convert::bind_info_from_c(&b.bind_info, lkey),
    };
    match ctx.dev.bind_mw(q.raw.qp_base.qp_num, m.id, &req) {
        Ok(rkey) => {
            // SAFETY: the program's MW object; `rkey` is the field it reads.
            unsafe { (*mw).rkey = rkey };
            0
        }
        Err(e) => fail(&e),
    }
}

/// The L_Key a window bind names: its MR's, or 0 for a zero-length bind, which needs
/// no MR (`ibv_bind_mw` and `ibv_wr_bind_mw`). None for a bind with a length and no
/// MR.
pub(crate) fn bind_lkey(b: &sys::ibv_mw_bind_info) -> Option<u32> {
    if b.length == 0 {
        return Some(0);
    }
    // SAFETY: module safety argument (the program's MR pointer, or null).
    unsafe { from_ptr::<_, Mr>(b.mr) }.map(|mr| mr.raw.lkey)
}

/// Records in the program's `ibv_mw` the R_Key a type 2 window has once the bind work
/// request posted for it succeeds: the window's index with the consumer's key byte
/// (IBTA 10.6.7.2.2: the consumer owns only the key's low eight bits; the rest is the
/// window's), so `mw->rkey` names the window as it is bound, as with hardware
/// providers. Nothing changes for a type 1 window, whose verb writes its key itself.
///
/// # Safety
///
/// `mw` is null or a live window of this library (module safety argument).
pub(crate) unsafe fn note_type2_bind(mw: *mut sys::ibv_mw, new_rkey: u32) {
    // SAFETY: caller's contract.
    if let Some(m) = unsafe { mw.as_mut() } {
        if m.type_ == sys::IBV_MW_TYPE_2 {
            m.rkey = (m.rkey & !0xFF) | (new_rkey & 0xFF);
        }
    }
}
