//! Protection domains and memory regions.
//! (Safety argument: the parent module's.)

use super::*;

/// `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut sys::ibv_context) -> *mut sys::ibv_pd {
    let ctx = ctx_or!(context, null(EINVAL));
    match ctx.dev.alloc_pd() {
        Ok(id) => into_ptr(Pd {
            raw: sys::ibv_pd {
                context,
                handle: id.0,
            },
            id,
        }),
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_dealloc_pd`: EBUSY while objects use it.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut sys::ibv_pd) -> c_int {
    let p = obj_or!(Pd, pd, EINVAL);
    let ctx = ctx_or!(p.raw.context, EINVAL);
    match ctx.dev.dealloc_pd(p.id) {
        // SAFETY: made by ibv_alloc_pd; destroyed once.
        Ok(()) => unsafe {
            free::<_, Pd>(pd);
            0
        },
        Err(e) => fail(&e),
    }
}

fn user_membuf(addr: *mut c_void, length: usize) -> Option<MemBuf> {
    // SAFETY: the ibv_reg_mr contract (crate::memory).
    let mem = unsafe { UserMemory::new(addr.cast(), length) }?;
    Some(MemBuf::from_external(Box::new(mem)))
}

/// `ibv_reg_mr_iova2`: the emulator registers memory at its own address, so `iova`
/// must equal `addr` (EOPNOTSUPP otherwise).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut sys::ibv_mr {
    let p = obj_or!(Pd, pd, null(EINVAL));
    let ctx = ctx_or!(p.raw.context, null(EINVAL));
    if iova != addr as u64 {
        return null(unsupported(
            "ibv_reg_mr_iova with an iova other than the address",
        ));
    }
    let Some(buf) = user_membuf(addr, length) else {
        return null(EINVAL);
    };
    match ctx
        .dev
        .reg_mr(p.id, &buf, 0, length, AccessFlags::from_bits_retain(access))
    {
        Ok(info) => into_ptr(Mr {
            raw: sys::ibv_mr {
                context: p.raw.context,
                pd,
                addr,
                length,
                handle: info.lkey,
                lkey: info.lkey,
                rkey: info.rkey,
            },
        }),
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut sys::ibv_mr {
    // SAFETY: same contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}

/// `ibv_reg_mr_iova`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut sys::ibv_mr {
    // SAFETY: same contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}

/// `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut sys::ibv_mr) -> c_int {
    let m = obj_or!(Mr, mr, EINVAL);
    let ctx = ctx_or!(m.raw.context, EINVAL);
    match ctx.dev.dereg_mr(m.raw.lkey) {
        // SAFETY: made by ibv_reg_mr; destroyed once.
        Ok(()) => unsafe {
            free::<_, Mr>(mr);
            0
        },
        Err(e) => fail(&e),
    }
}

/// `ibv_rereg_mr`: 0, or the IBV_REREG_MR_ERR_* code libibverbs gives.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut sys::ibv_mr,
    flags: c_int,
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let m = obj_or!(Mr, mr, sys::IBV_REREG_MR_ERR_INPUT);
    let ctx = ctx_or!(m.raw.context, sys::IBV_REREG_MR_ERR_INPUT);
    let flags = ReregMrFlags::from_bits_retain(flags as u32);
    let new_pd = if flags.contains(ReregMrFlags::CHANGE_PD) {
        Some(obj_or!(Pd, pd, sys::IBV_REREG_MR_ERR_INPUT).id)
    } else {
        None
    };
    let range = if flags.contains(ReregMrFlags::CHANGE_TRANSLATION) {
        match user_membuf(addr, length) {
            Some(b) => Some(b),
            None => return sys::IBV_REREG_MR_ERR_INPUT,
        }
    } else {
        None
    };
    let r = ctx.dev.rereg_mr(
        m.raw.lkey,
        flags,
        new_pd,
        range.as_ref().map(|b| (b, 0, length)),
        AccessFlags::from_bits_retain(access as u32),
    );
    match r {
        Ok(info) => {
            // SAFETY: the program's own MR object, which it does not use during the call.
            let raw = unsafe { &mut *mr };
            raw.lkey = info.lkey;
            raw.rkey = info.rkey;
            raw.handle = info.lkey;
            if new_pd.is_some() {
                raw.pd = pd;
            }
            if range.is_some() {
                raw.addr = addr;
                raw.length = length;
            }
            0
        }
        Err(e) => {
            fail(&e);
            sys::IBV_REREG_MR_ERR_CMD
        }
    }
}
