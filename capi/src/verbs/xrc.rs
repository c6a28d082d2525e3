//! XRC (libibverbs `ibv_open_xrcd(3)`, `ibv_create_srq_ex(3)`, `ibv_get_srq_num(3)`,
//! `ibv_create_qp_ex(3)` with `IBV_QPT_XRC_RECV`, `ibv_open_qp(3)`): the
//! `verbs_context` operations verbs.h's inline XRC verbs call.
//! (Safety argument: the parent module's.)
//!
//! An XRC domain opened with a file's `fd` is keyed by the file's inode (device and
//! inode number) in the emulated NIC, so the opens of one process share it; another
//! process has a NIC of its own and so a domain of its own (the kernel would share it
//! across processes too).

use std::sync::atomic::{AtomicU32, Ordering};

use verbs_api::{SrqAttr, XrcdOpen};

use super::*;

/// Handles of the objects this process made that have no kernel handle of their
/// own: XRC domains, and second objects of one XRC receive QP (see
/// [`qp::wrap_qp_as`]). The top bit keeps the latter away from QP numbers (24 bits).
static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

fn next_handle() -> u32 {
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) | 0x8000_0000
}

/// `ibv_open_xrcd`: `comp_mask` must give `fd` and `oflags` (EINVAL otherwise, as
/// libibverbs' `ibv_cmd_open_xrcd`); `fd` -1 makes a private domain, a file's `fd`
/// opens the domain of its inode (`O_CREAT` makes it, `O_EXCL` refuses an existing
/// one); EBADF for a descriptor that is not open.
pub(super) unsafe extern "C" fn vctx_open_xrcd(
    context: *mut sys::ibv_context,
    attr: *mut sys::ibv_xrcd_init_attr,
) -> *mut sys::ibv_xrcd {
    let ctx = ctx_or!(context, null(EINVAL));
    if attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    if a.comp_mask >= sys::IBV_XRCD_INIT_ATTR_RESERVED {
        return null(EOPNOTSUPP);
    }
    let both = sys::IBV_XRCD_INIT_ATTR_FD | sys::IBV_XRCD_INIT_ATTR_OFLAGS;
    if a.comp_mask & both != both {
        return null(EINVAL);
    }
    let inode = if a.fd == -1 {
        None
    } else {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat writes a stat into the buffer it is given.
        if unsafe { libc::fstat(a.fd, st.as_mut_ptr()) } != 0 {
            return null(libc::EBADF);
        }
        // SAFETY: fstat succeeded, so it filled the struct.
        let st = unsafe { st.assume_init() };
        Some((st.st_dev << 40) ^ st.st_ino)
    };
    let open = XrcdOpen {
        inode,
        create: a.oflags & libc::O_CREAT != 0,
        exclusive: a.oflags & libc::O_EXCL != 0,
    };
    match ctx.dev.open_xrcd(&open) {
        Ok(id) => {
            let handle = next_handle();
            let ptr = into_ptr::<_, Xrcd>(Xrcd {
                raw: sys::ibv_xrcd { context },
                id,
                handle,
            });
            ctx.record(Kind::Xrcd, handle, ptr);
            ptr
        }
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_close_xrcd`: EBUSY while the domain's last reference has XRC SRQs or
/// receive QPs.
pub(super) unsafe extern "C" fn vctx_close_xrcd(xrcd: *mut sys::ibv_xrcd) -> c_int {
    let (x, ctx) = live_or!(Xrcd, xrcd, |e| e);
    match ctx.dev.close_xrcd(x.id) {
        Ok(()) => {
            ctx.forget(Kind::Xrcd, x.handle);
            // SAFETY: made by vctx_open_xrcd; closed once (it left the table).
            unsafe { free::<_, Xrcd>(xrcd) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_create_srq_ex`: a basic SRQ (as `ibv_create_srq`), or with `srq_type`
/// `IBV_SRQT_XRC` an XRC SRQ, which needs the PD, XRC domain and CQ fields
/// (EINVAL without them). Tag-matching SRQs are not supported (EOPNOTSUPP).
pub(super) unsafe extern "C" fn vctx_create_srq_ex(
    context: *mut sys::ibv_context,
    attr: *mut sys::ibv_srq_init_attr_ex,
) -> *mut sys::ibv_srq {
    let ctx = ctx_or!(context, null(EINVAL));
    if attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.comp_mask >= sys::IBV_SRQ_INIT_ATTR_RESERVED {
        return null(EOPNOTSUPP);
    }
    let srq_type = if a.comp_mask & sys::IBV_SRQ_INIT_ATTR_TYPE != 0 {
        a.srq_type
    } else {
        sys::IBV_SRQT_BASIC
    };
    if a.comp_mask & sys::IBV_SRQ_INIT_ATTR_PD == 0 {
        return null(EINVAL);
    }
    match srq_type {
        sys::IBV_SRQT_BASIC => {
            let mut basic = sys::ibv_srq_init_attr {
                srq_context: a.srq_context,
                attr: a.attr,
            };
            // SAFETY: module safety argument.
            let srq = unsafe { ibv_create_srq(a.pd, &mut basic) };
            a.attr = basic.attr;
            srq
        }
        sys::IBV_SRQT_XRC => {
            let need = sys::IBV_SRQ_INIT_ATTR_XRCD | sys::IBV_SRQ_INIT_ATTR_CQ;
            if a.comp_mask & need != need {
                return null(EINVAL);
            }
            let (p, _) = live_or!(Pd, a.pd, |_e| null(EINVAL));
            let (x, _) = live_or!(Xrcd, a.xrcd, |_e| null(EINVAL));
            let (c, _) = live_or!(Cq, a.cq, |_e| null(EINVAL));
            let want = SrqAttr {
                max_wr: a.attr.max_wr,
                max_sge: a.attr.max_sge,
                srq_limit: a.attr.srq_limit,
            };
            match ctx.dev.create_xrc_srq(p.id, x.id, c.id, &want) {
                Ok(id) => srq::srq_object(ctx, context, a.pd, a.srq_context, &mut a.attr, id),
                Err(e) => null(fail(&e)),
            }
        }
        _ => null(unsupported("ibv_create_srq_ex with a tag-matching SRQ")),
    }
}

/// `ibv_get_srq_num`: EINVAL for an SRQ that is not an XRC SRQ.
pub(super) unsafe extern "C" fn vctx_get_srq_num(srq: *mut sys::ibv_srq, num: *mut u32) -> c_int {
    let (s, ctx) = live_or!(Srq, srq, |_e| EINVAL);
    if num.is_null() {
        return EINVAL;
    }
    match ctx.dev.get_srq_num(s.id) {
        Ok(n) => {
            out!(num, n);
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`: needs `IBV_QP_INIT_ATTR_XRCD` and a
/// domain (EINVAL); the QP has no PD, CQs, SRQ or queues (`cap` comes back zero).
pub(super) unsafe fn create_xrc_recv_qp(a: &mut sys::ibv_qp_init_attr_ex) -> *mut sys::ibv_qp {
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_XRCD == 0 {
        return null(EINVAL);
    }
    let (x, ctx) = live_or!(Xrcd, a.xrcd, |_e| null(EINVAL));
    match ctx.dev.create_xrc_recv_qp(x.id) {
        Ok(qpn) => {
            let mut basic = sys::ibv_qp_init_attr {
                qp_context: a.qp_context,
                qp_type: sys::IBV_QPT_XRC_RECV,
                ..Default::default()
            };
            let qp = wrap_qp(ctx, qpn, std::ptr::null_mut(), &mut basic);
            a.cap = sys::ibv_qp_cap::default();
            qp
        }
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_open_qp`: an object for XRC receive QP `qp_num` of domain `xrcd` (both
/// required, and `qp_type` `IBV_QPT_XRC_RECV`: EINVAL otherwise). Destroying it drops
/// this hold; the QP lives while another holder has not.
pub(super) unsafe extern "C" fn vctx_open_qp(
    context: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_open_attr,
) -> *mut sys::ibv_qp {
    let ctx = ctx_or!(context, null(EINVAL));
    if attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    if a.comp_mask >= sys::IBV_QP_OPEN_ATTR_RESERVED {
        return null(EOPNOTSUPP);
    }
    let need = sys::IBV_QP_OPEN_ATTR_NUM | sys::IBV_QP_OPEN_ATTR_XRCD | sys::IBV_QP_OPEN_ATTR_TYPE;
    if a.comp_mask & need != need || a.qp_type != sys::IBV_QPT_XRC_RECV {
        return null(EINVAL);
    }
    let (x, _) = live_or!(Xrcd, a.xrcd, |_e| null(EINVAL));
    if let Err(e) = ctx.dev.open_qp(x.id, a.qp_num) {
        return null(fail(&e));
    }
    let qp_context = if a.comp_mask & sys::IBV_QP_OPEN_ATTR_CONTEXT != 0 {
        a.qp_context
    } else {
        std::ptr::null_mut()
    };
    let mut basic = sys::ibv_qp_init_attr {
        qp_context,
        qp_type: sys::IBV_QPT_XRC_RECV,
        ..Default::default()
    };
    let handle = if ctx.lookup(Kind::Qp, a.qp_num).is_some() {
        next_handle()
    } else {
        a.qp_num
    };
    qp::wrap_qp_as(ctx, a.qp_num, handle, std::ptr::null_mut(), &mut basic)
}
