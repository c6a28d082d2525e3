//! Protection domains and memory regions.
//! (Safety argument: the parent module's.)

use super::*;

/// `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut sys::ibv_context) -> *mut sys::ibv_pd {
    let ctx = ctx_or!(context, null(EINVAL));
    match ctx.dev.alloc_pd() {
        Ok(id) => {
            let p = into_ptr(Pd {
                raw: sys::ibv_pd {
                    context,
                    handle: id.0,
                },
                id,
            });
            ctx.record(Kind::Pd, id.0, p);
            p
        }
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_dealloc_pd`: EBUSY while objects use it; ENOENT for a PD whose handle or
/// context is not one of this process's.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut sys::ibv_pd) -> c_int {
    let (p, ctx) = live_or!(Pd, pd, |e| e);
    match ctx.dev.dealloc_pd(p.id) {
        Ok(()) => {
            ctx.forget(Kind::Pd, p.id.0);
            // SAFETY: made by ibv_alloc_pd; destroyed once (it left the table).
            unsafe { free::<_, Pd>(pd) };
            0
        }
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
    let (p, ctx) = live_or!(Pd, pd, |_e| null(EINVAL));
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
        Ok(info) => {
            let m = into_ptr(Mr {
                raw: sys::ibv_mr {
                    context: p.raw.context,
                    pd,
                    addr,
                    length,
                    handle: info.lkey,
                    lkey: info.lkey,
                    rkey: info.rkey,
                },
            });
            ctx.record(Kind::Mr, info.lkey, m);
            m
        }
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
    let (m, ctx) = live_or!(Mr, mr, |e| {
        set_errno(e);
        e
    });
    let lkey = m.raw.lkey;
    match ctx.dev.dereg_mr(lkey) {
        Ok(()) => {
            ctx.forget(Kind::Mr, lkey);
            // SAFETY: made by ibv_reg_mr; destroyed once (it left the table).
            unsafe { free::<_, Mr>(mr) };
            0
        }
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
    let (m, ctx) = live_or!(Mr, mr, |_e| sys::IBV_REREG_MR_ERR_INPUT);
    let flags = ReregMrFlags::from_bits_retain(flags as u32);
    let new_pd = if flags.contains(ReregMrFlags::CHANGE_PD) {
        Some(live_or!(Pd, pd, |_e| sys::IBV_REREG_MR_ERR_INPUT).0.id)
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
            ctx.forget(Kind::Mr, m.raw.lkey);
            ctx.record(Kind::Mr, info.lkey, mr);
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
