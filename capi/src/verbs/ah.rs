//! Address handles and multicast.
//! (Safety argument: the parent module's.)

use super::*;

/// `ibv_create_ah`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_ah_attr,
) -> *mut sys::ibv_ah {
    let (p, ctx) = live_or!(Pd, pd, |_e| null(EINVAL));
    if attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = convert::ah_attr_from_c(unsafe { &*attr });
    match ctx.dev.create_ah(p.id, &a) {
        Ok(id) => {
            let h = into_ptr::<_, Ah>(Ah {
                raw: sys::ibv_ah {
                    context: p.raw.context,
                    pd,
                    handle: id.0,
                },
                id,
            });
            ctx.record(Kind::Ah, id.0, h);
            h
        }
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_destroy_ah`: ENOENT (also in errno) for an AH whose handle or context is not
/// one of this process's.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut sys::ibv_ah) -> c_int {
    let (a, ctx) = live_or!(Ah, ah, |e| {
        set_errno(e);
        e
    });
    match ctx.dev.destroy_ah(a.id) {
        Ok(()) => {
            ctx.forget(Kind::Ah, a.id.0);
            // SAFETY: made by ibv_create_ah; destroyed once (it left the table).
            unsafe { free::<_, Ah>(ah) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_init_ah_from_wc`: the reply path of a received UD message (its GRH, which
/// every RoCEv2 packet carries, gives the source GID). The GRH is read in either
/// layout, as libibverbs does: the IPv4 one (20 zero bytes, then the IPv4 header: what
/// the emulator and kernel rxe write for IPv4 RoCEv2) or an IPv6 header (the device's
/// `Device::init_ah_from_wc`). EINVAL when the GRH is neither or is not addressed to
/// one of the port's GIDs.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut sys::ibv_context,
    port_num: u8,
    wc: *mut sys::ibv_wc,
    grh: *mut sys::ibv_grh,
    ah_attr: *mut sys::ibv_ah_attr,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    if wc.is_null() || grh.is_null() || ah_attr.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's completion and GRH (the first 40 bytes of its buffer).
    let (w, g) = unsafe { (&*wc, std::slice::from_raw_parts(grh.cast::<u8>(), 40)) };
    // Without IBV_WC_GRH, libibverbs fills a local vector from the completion (the
    // source LID, SL and path bits, is_global 0) and succeeds; the device does the same.
    let completion = verbs_api::WorkCompletion {
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
        wc_flags: if w.wc_flags & sys::IBV_WC_GRH == 0 {
            verbs_api::WcFlags::empty()
        } else {
            verbs_api::WcFlags::GRH
        },
        ..verbs_api::WorkCompletion::default()
    };
    match ctx.dev.init_ah_from_wc(port_num, &completion, g) {
        Ok(attr) => {
            out!(ah_attr, convert::ah_attr_to_c(&attr));
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_create_ah_from_wc`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut sys::ibv_pd,
    wc: *mut sys::ibv_wc,
    grh: *mut sys::ibv_grh,
    port_num: u8,
) -> *mut sys::ibv_ah {
    let (p, _) = live_or!(Pd, pd, |_e| null(EINVAL));
    let mut attr = sys::ibv_ah_attr::default();
    // SAFETY: module safety argument.
    let r = unsafe { ibv_init_ah_from_wc(p.raw.context, port_num, wc, grh, &mut attr) };
    if r != 0 {
        return null(r);
    }
    // SAFETY: module safety argument.
    unsafe { ibv_create_ah(pd, &mut attr) }
}

fn mcast(qp: *mut sys::ibv_qp, gid: *const sys::ibv_gid, lid: u16, attach: bool) -> c_int {
    let (q, ctx) = live_or!(Qp, qp, |_e| EINVAL);
    if gid.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's GID.
    let g: Gid = convert::gid_from_c(unsafe { &*gid });
    let qpn = q.raw.qp_base.qp_num;
    status(if attach {
        ctx.dev.attach_mcast(qpn, &g, lid)
    } else {
        ctx.dev.detach_mcast(qpn, &g, lid)
    })
}

/// `ibv_attach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut sys::ibv_qp,
    gid: *const sys::ibv_gid,
    lid: u16,
) -> c_int {
    mcast(qp, gid, lid, true)
}

/// `ibv_detach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut sys::ibv_qp,
    gid: *const sys::ibv_gid,
    lid: u16,
) -> c_int {
    mcast(qp, gid, lid, false)
}
