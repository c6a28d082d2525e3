//! Shared receive queues.
//! (Safety argument: the parent module's.)

use super::*;

/// `ibv_create_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut sys::ibv_pd,
    init_attr: *mut sys::ibv_srq_init_attr,
) -> *mut sys::ibv_srq {
    let p = obj_or!(Pd, pd, null(EINVAL));
    let ctx = ctx_or!(p.raw.context, null(EINVAL));
    if init_attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *init_attr };
    match ctx.dev.create_srq(p.id, &convert::srq_attr_from_c(&a.attr)) {
        Ok(id) => {
            if let Ok(actual) = ctx.dev.query_srq(id) {
                a.attr.max_wr = actual.max_wr;
                a.attr.max_sge = actual.max_sge;
            }
            let ptr = into_ptr::<_, Srq>(Srq {
                raw: sys::ibv_srq {
                    context: p.raw.context,
                    srq_context: a.srq_context,
                    pd,
                    handle: id.0,
                    ..Default::default()
                },
                id,
            });
            ctx.srqs.lock().insert(id.0, ptr as usize);
            ptr
        }
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_modify_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    let s = obj_or!(Srq, srq, EINVAL);
    let ctx = ctx_or!(s.raw.context, EINVAL);
    if attr.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's attributes.
    let a = convert::srq_attr_from_c(unsafe { &*attr });
    status(
        ctx.dev
            .modify_srq(s.id, &a, SrqAttrMask::from_bits_retain(mask as u32)),
    )
}

/// `ibv_query_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(
    srq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
) -> c_int {
    let s = obj_or!(Srq, srq, EINVAL);
    let ctx = ctx_or!(s.raw.context, EINVAL);
    match ctx.dev.query_srq(s.id) {
        Ok(a) => {
            out!(attr, convert::srq_attr_to_c(&a));
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_destroy_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut sys::ibv_srq) -> c_int {
    let s = obj_or!(Srq, srq, EINVAL);
    let ctx = ctx_or!(s.raw.context, EINVAL);
    match ctx.dev.destroy_srq(s.id) {
        Ok(()) => {
            ctx.srqs.lock().remove(&s.id.0);
            // SAFETY: made by ibv_create_srq; destroyed once.
            unsafe { free::<_, Srq>(srq) };
            0
        }
        Err(e) => fail(&e),
    }
}
