//! Shared receive queues.
//! (Safety argument: the parent module's.)

use super::*;

/// `ibv_create_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut sys::ibv_pd,
    init_attr: *mut sys::ibv_srq_init_attr,
) -> *mut sys::ibv_srq {
    let (p, ctx) = live_or!(Pd, pd, |_e| null(EINVAL));
    if init_attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *init_attr };
    match ctx.dev.create_srq(p.id, &convert::srq_attr_from_c(&a.attr)) {
        Ok(id) => srq_object(ctx, p.raw.context, pd, a.srq_context, &mut a.attr, id),
        Err(e) => null(fail(&e)),
    }
}

/// Makes the `ibv_srq` of the new SRQ `id`, made on `pd` of `ctx` (whose C context is
/// `context`), and records it in `ctx`; the sizes the device granted go back into the
/// caller's `attr`, as libibverbs' providers write them.
pub(super) fn srq_object(
    ctx: &Context,
    context: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
    srq_context: *mut c_void,
    attr: &mut sys::ibv_srq_attr,
    id: verbs_api::SrqId,
) -> *mut sys::ibv_srq {
    if let Ok(actual) = ctx.dev.query_srq(id) {
        attr.max_wr = actual.max_wr;
        attr.max_sge = actual.max_sge;
    }
    let ptr = into_ptr::<_, Srq>(Srq {
        raw: sys::ibv_srq {
            context,
            srq_context,
            pd,
            handle: id.0,
            ..Default::default()
        },
        id,
        max_wr: attr.max_wr.into(),
    });
    ctx.record(Kind::Srq, id.0, ptr);
    ptr
}

/// `ibv_modify_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    let (s, ctx) = live_or!(Srq, srq, |_e| EINVAL);
    if attr.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's attributes.
    let a = convert::srq_attr_from_c(unsafe { &*attr });
    let r = ctx
        .dev
        .modify_srq(s.id, &a, SrqAttrMask::from_bits_retain(mask as u32));
    if r.is_ok() {
        if let Ok(now) = ctx.dev.query_srq(s.id) {
            s.max_wr
                .store(now.max_wr, std::sync::atomic::Ordering::Relaxed);
        }
    }
    status(r)
}

/// `ibv_query_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(
    srq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
) -> c_int {
    let (s, ctx) = live_or!(Srq, srq, |_e| EINVAL);
    match ctx.dev.query_srq(s.id) {
        Ok(a) => {
            out!(attr, convert::srq_attr_to_c(&a));
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_destroy_srq`: ENOENT for an SRQ whose handle or context is not one of this
/// process's.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut sys::ibv_srq) -> c_int {
    let (s, ctx) = live_or!(Srq, srq, |e| e);
    match ctx.dev.destroy_srq(s.id) {
        Ok(()) => {
            ctx.forget(Kind::Srq, s.id.0);
            // SAFETY: made by ibv_create_srq; destroyed once (it left the table).
            unsafe { free::<_, Srq>(srq) };
            0
        }
        Err(e) => fail(&e),
    }
}
