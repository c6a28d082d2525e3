//! Queue pairs: create, modify, query, destroy, and posting work requests.
//! (Safety argument: the parent module's.)

use super::*;

use smallvec::SmallVec;

/// The work requests of one post, converted, or their C pointers: a post of up to four
/// (every perftest latency post, most programs' single WRs) allocates nothing.
type Wrs<T> = SmallVec<[T; 4]>;

fn qp_type_of(t: sys::ibv_qp_type) -> Result<QpType, c_int> {
    match QpType::try_from(t) {
        Ok(q @ (QpType::Rc | QpType::Uc | QpType::Ud | QpType::XrcSend)) => Ok(q),
        // An XRC receive QP is made with ibv_create_qp_ex and an XRC domain.
        Ok(QpType::XrcRecv) => Err(EINVAL),
        _ => Err(unsupported("a QP type other than RC, UC, UD and XRC")),
    }
}

/// The context and `verbs_api` attributes of `ibv_qp_init_attr`'s objects.
pub(crate) unsafe fn qp_init_of<'a>(
    pd: *mut sys::ibv_pd,
    a: &sys::ibv_qp_init_attr,
) -> Result<(&'a Context, QpInitAttr), c_int> {
    let (p, ctx) = live_or!(Pd, pd, |_e| Err(EINVAL));
    let (scq, _) = live_or!(Cq, a.send_cq, |_e| Err(EINVAL));
    // An XRC send QP has no receive side: its receive CQ may be NULL.
    let rcq_ptr = if a.qp_type == sys::IBV_QPT_XRC_SEND && a.recv_cq.is_null() {
        a.send_cq
    } else {
        a.recv_cq
    };
    let (rcq, _) = live_or!(Cq, rcq_ptr, |_e| Err(EINVAL));
    let s = if a.srq.is_null() {
        None
    } else {
        Some(live_or!(Srq, a.srq, |_e| Err(EINVAL)).0.id)
    };
    let init = QpInitAttr {
        pd: p.id,
        send_cq: scq.id,
        recv_cq: rcq.id,
        qp_type: qp_type_of(a.qp_type)?,
        cap: convert::cap_from_c(&a.cap),
        sq_sig_all: a.sq_sig_all != 0,
        srq: s,
    };
    Ok((ctx, init))
}

/// The `ibv_qp` object of the device QP `qpn`, made from `a` on `pd` (by
/// `ibv_create_qp` or by the connection manager); `a.cap` becomes what it got.
pub(crate) fn wrap_qp(
    ctx: &Context,
    qpn: u32,
    pd: *mut sys::ibv_pd,
    a: &mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    wrap_qp_as(ctx, qpn, qpn, pd, a)
}

/// [`wrap_qp`] with the object's `handle` given: the QP number, except for a second
/// object of one XRC receive QP in one context (`ibv_open_qp`), which takes a handle
/// of its own so that both stay in the context's table.
pub(crate) fn wrap_qp_as(
    ctx: &Context,
    qpn: u32,
    handle: u32,
    pd: *mut sys::ibv_pd,
    a: &mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    let qp_type = a.qp_type;
    if let Ok((_, actual)) = ctx.dev.query_qp(qpn) {
        a.cap = convert::cap_to_c(&actual.cap);
    }
    let mut raw = sys::ibv_qp_ex {
        qp_base: sys::ibv_qp {
            context: ctx.as_ptr(),
            qp_context: a.qp_context,
            pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle,
            qp_num: qpn,
            state: sys::IBV_QPS_RESET,
            qp_type,
            ..Default::default()
        },
        ..Default::default()
    };
    crate::qp_ex::install(&mut raw);
    let ptr = into_ptr::<sys::ibv_qp_ex, Qp>(Qp {
        raw,
        wr_flush: Some(crate::qp_ex::wr_flush),
        building: Mutex::default(),
        sq_cap: a.cap.max_send_wr,
        rq_cap: a.cap.max_recv_wr,
    });
    ctx.record(Kind::Qp, handle, ptr);
    ptr.cast()
}

/// Frees the object of a QP whose device QP is gone.
///
/// # Safety
///
/// `qp` came from [`wrap_qp`] and is not used again.
pub(crate) unsafe fn unwrap_qp(ctx: &Context, qp: *mut sys::ibv_qp) {
    // SAFETY: caller's contract.
    let handle = unsafe { (*qp).handle };
    ctx.forget(Kind::Qp, handle);
    // SAFETY: made by wrap_qp; freed once (caller's contract).
    unsafe { free::<_, Qp>(qp) };
}

/// Creates a QP from the common attributes of `ibv_qp_init_attr(_ex)`.
pub(crate) unsafe fn create_qp_common(
    pd: *mut sys::ibv_pd,
    a: &mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    // SAFETY: module safety argument.
    let (ctx, init) = match unsafe { qp_init_of(pd, a) } {
        Ok(x) => x,
        Err(e) => return null(e),
    };
    match ctx.dev.create_qp(&init) {
        Ok(qpn) => wrap_qp(ctx, qpn, pd, a),
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_create_qp`: `init_attr->cap` is updated to what the QP got.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut sys::ibv_pd,
    init_attr: *mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    if init_attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *init_attr };
    // SAFETY: module safety argument.
    unsafe { create_qp_common(pd, a) }
}

pub(super) unsafe extern "C" fn vctx_create_qp_ex(
    context: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> *mut sys::ibv_qp {
    let _ = ctx_or!(context, null(EINVAL));
    if attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let known = sys::IBV_QP_INIT_ATTR_PD
        | sys::IBV_QP_INIT_ATTR_XRCD
        | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
        | sys::IBV_QP_INIT_ATTR_CREATE_FLAGS;
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        return null(unsupported(
            "ibv_create_qp_ex with create_flags (scatter FCS, CVLAN stripping, ...)",
        ));
    }
    if a.comp_mask & !known != 0 {
        return null(unsupported(
            "ibv_create_qp_ex with RSS, TSO or other extended attributes",
        ));
    }
    if a.qp_type == sys::IBV_QPT_XRC_RECV {
        // SAFETY: module safety argument.
        return unsafe { xrc::create_xrc_recv_qp(a) };
    }
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_PD == 0 {
        return null(EINVAL);
    }
    // The ibv_wr_* operations the emulator has (TSO is not).
    let ops = sys::IBV_QP_EX_WITH_RDMA_WRITE
        | sys::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
        | sys::IBV_QP_EX_WITH_SEND
        | sys::IBV_QP_EX_WITH_SEND_WITH_IMM
        | sys::IBV_QP_EX_WITH_RDMA_READ
        | sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
        | sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
        | sys::IBV_QP_EX_WITH_LOCAL_INV
        | sys::IBV_QP_EX_WITH_BIND_MW
        | sys::IBV_QP_EX_WITH_SEND_WITH_INV
        | sys::IBV_QP_EX_WITH_ATOMIC_WRITE
        | crate::qp_ex::IBV_QP_EX_WITH_FLUSH;
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0
        && a.send_ops_flags & !u64::from(ops) != 0
    {
        return null(unsupported(
            "ibv_create_qp_ex with send_ops_flags TSO or other unknown operations",
        ));
    }
    let mut basic = sys::ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    // SAFETY: module safety argument.
    let qp = unsafe { create_qp_common(a.pd, &mut basic) };
    a.cap = basic.cap;
    qp
}

/// `ibv_qp_to_qp_ex`: every QP is an `ibv_qp_ex`.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut sys::ibv_qp) -> *mut sys::ibv_qp_ex {
    qp.cast()
}

/// `ibv_modify_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    let (q, ctx) = live_or!(Qp, qp, |_e| EINVAL);
    if attr.is_null() {
        return EINVAL;
    }
    let mask = QpAttrMask::from_bits_retain(attr_mask as u32);
    // SAFETY: the caller's attributes.
    let a = match convert::qp_attr_from_c(unsafe { &*attr }, mask) {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    match ctx.dev.modify_qp(q.raw.qp_base.qp_num, &a, mask) {
        Ok(()) => {
            if mask.contains(QpAttrMask::STATE) {
                // SAFETY: the program's QP object; `state` is the field it reads.
                unsafe { (*qp).state = a.qp_state.as_u32() };
            }
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_query_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    let (q, ctx) = live_or!(Qp, qp, |_e| EINVAL);
    match ctx.dev.query_qp(q.raw.qp_base.qp_num) {
        Ok((a, i)) => {
            out!(attr, convert::qp_attr_to_c(&a));
            let b = &q.raw.qp_base;
            out!(
                init_attr,
                sys::ibv_qp_init_attr {
                    qp_context: b.qp_context,
                    send_cq: b.send_cq,
                    recv_cq: b.recv_cq,
                    srq: b.srq,
                    cap: convert::cap_to_c(&i.cap),
                    qp_type: b.qp_type,
                    sq_sig_all: c_int::from(i.sq_sig_all),
                }
            );
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_destroy_qp`: ENOENT for a QP whose handle or context is not one of this
/// process's.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut sys::ibv_qp) -> c_int {
    let (q, ctx) = live_or!(Qp, qp, |e| e);
    if let Some(r) = crate::rdmacm::destroy_cm_qp(qp) {
        return r;
    }
    let qpn = q.raw.qp_base.qp_num;
    match ctx.dev.destroy_qp(qpn) {
        Ok(()) => {
            // SAFETY: made by ibv_create_qp; destroyed once.
            unsafe { unwrap_qp(ctx, qp) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// Reads the SGE list of a work request.
unsafe fn sges(list: *const sys::ibv_sge, n: c_int) -> Result<verbs_api::SgList, c_int> {
    let n = usize::try_from(n).map_err(|_| EINVAL)?;
    if n == 0 {
        return Ok(verbs_api::SgList::new());
    }
    if list.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: the caller's SGE array has num_sge entries.
    Ok(unsafe { std::slice::from_raw_parts(list, n) }
        .iter()
        .map(convert::sge_from_c)
        .collect())
}

/// Converts one `ibv_send_wr` of QP `q`.
unsafe fn send_wr(q: &Qp, w: &sys::ibv_send_wr) -> Result<verbs_api::SendWr, c_int> {
    // SAFETY: module safety argument.
    let sg = unsafe { sges(w.sg_list, w.num_sge) }?;
    let ud = if q.raw.qp_base.qp_type == sys::IBV_QPT_UD {
        let (ah, qpn, qkey) = convert::ud_fields(w);
        let ah = obj_or!(Ah, ah, Err(EINVAL));
        Some((ah.id, qpn, qkey))
    } else {
        None
    };
    let mut wr = convert::send_wr_from_c(w, sg, ud).map_err(|e| e.errno())?;
    if q.raw.qp_base.qp_type == sys::IBV_QPT_XRC_SEND {
        // SAFETY: union of plain fields; an XRC send WR carries its remote SRQ number.
        wr.xrc_remote_srqn = Some(unsafe { w.qp_type.xrc.remote_srqn });
    }
    if let WrOperation::BindMw {
        mw_rkey, bind_info, ..
    } = &mut wr.op
    {
        // SAFETY: union of plain fields (verbs_ffi::convert).
        let b = unsafe { w.__bindgen_anon_2.bind_mw };
        *mw_rkey = obj_or!(Mw, b.mw, Err(EINVAL)).raw.rkey;
        bind_info.mr_lkey = obj_or!(Mr, b.bind_info.mr, Err(EINVAL)).raw.lkey;
    }
    Ok(wr)
}

/// Posts send WRs of `q`. INLINE data may sit in memory the program never registered
/// (libibverbs copies it at post time and ignores its keys), while the engine takes
/// INLINE bytes from registered memory: so each INLINE WR's bytes are copied here into
/// a private region registered for the call and deregistered once the engine has
/// copied them (it does so while posting).
pub(crate) fn post_send_staged(
    ctx: &Context,
    q: &Qp,
    wrs: &mut [verbs_api::SendWr],
) -> Result<(), verbs_api::PostError> {
    if wrs.is_empty() {
        return Ok(());
    }
    let mut staged = Vec::new();
    let fail_at = |index, error| verbs_api::PostError { index, error };
    for (i, w) in wrs.iter_mut().enumerate() {
        if !w.send_flags.contains(SendFlags::INLINE) || w.sg_list.iter().all(|s| s.length == 0) {
            continue;
        }
        let mut bytes = Vec::new();
        for sge in &w.sg_list {
            if sge.length == 0 {
                continue;
            }
            if sge.addr == 0 {
                return Err(fail_at(
                    i,
                    Error::InvalidArgument("INLINE data at address 0"),
                ));
            }
            // SAFETY: the ibv_post_send contract: INLINE data is readable during the call.
            bytes.extend_from_slice(unsafe {
                std::slice::from_raw_parts(sge.addr as *const u8, sge.length as usize)
            });
        }
        // SAFETY: module safety argument.
        let Some(pd) = (unsafe { from_ptr::<_, Pd>(q.raw.qp_base.pd) }) else {
            return Err(fail_at(i, Error::InvalidArgument("QP without a PD")));
        };
        let buf = MemBuf::from_slice(&bytes);
        let mr = ctx
            .dev
            .reg_mr(pd.id, &buf, 0, bytes.len(), AccessFlags::LOCAL_WRITE)
            .map_err(|e| fail_at(i, e))?;
        w.sg_list = verbs_api::Sge::new(buf.addr(), bytes.len() as u32, mr.lkey).into();
        staged.push(mr.lkey);
    }
    let r = ctx.dev.post_send(q.raw.qp_base.qp_num, wrs);
    for lkey in staged {
        let _ = ctx.dev.dereg_mr(lkey);
    }
    r
}

pub(super) unsafe extern "C" fn op_post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad_wr: *mut *mut sys::ibv_send_wr,
) -> c_int {
    let q = obj_or!(Qp, qp, EINVAL);
    let ctx = ctx_fast!(q.raw.qp_base.context, EINVAL);
    let mut wrs: Wrs<verbs_api::SendWr> = SmallVec::new();
    let mut ptrs: Wrs<*mut sys::ibv_send_wr> = SmallVec::new();
    let mut bad = None;
    let mut p = wr;
    while !p.is_null() {
        if wrs.len() == q.sq_cap as usize {
            // More than the queue holds (a list that never ends among them): the
            // rest does not fit, as a provider finds the queue full.
            bad = Some((p, libc::ENOMEM));
            break;
        }
        // SAFETY: the caller's linked list of work requests.
        let w = unsafe { &*p };
        // SAFETY: as above.
        match unsafe { send_wr(q, w) } {
            Ok(x) => {
                wrs.push(x);
                ptrs.push(p);
            }
            Err(e) => {
                bad = Some((p, e));
                break;
            }
        }
        p = w.next;
    }
    let r = post_send_staged(ctx, q, &mut wrs);
    let posted = r
        .as_ref()
        .err()
        .map_or(ptrs.len(), |e| e.index.min(ptrs.len()));
    for &p in &ptrs[..posted] {
        // SAFETY: the caller's work requests, read above.
        let w = unsafe { &*p };
        if w.opcode == sys::IBV_WR_BIND_MW {
            // SAFETY: union of plain fields (verbs_ffi::convert); the program's window.
            unsafe {
                let b = w.__bindgen_anon_2.bind_mw;
                mw::note_type2_bind(b.mw, b.rkey);
            }
        }
    }
    if let Err(e) = r {
        out!(bad_wr, ptrs[e.index.min(ptrs.len().saturating_sub(1))]);
        return e.error.errno();
    }
    if let Some((p, e)) = bad {
        out!(bad_wr, p);
        return e;
    }
    0
}

/// Converts a chain of `ibv_recv_wr`; the first bad one ends the chain, and so does
/// the WR after the first `cap` (ENOMEM: more than the queue holds).
unsafe fn recv_wrs(
    wr: *mut sys::ibv_recv_wr,
    cap: u32,
) -> (
    Wrs<verbs_api::RecvWr>,
    Wrs<*mut sys::ibv_recv_wr>,
    Option<(*mut sys::ibv_recv_wr, c_int)>,
) {
    let mut wrs = SmallVec::new();
    let mut ptrs = SmallVec::new();
    let mut p = wr;
    while !p.is_null() {
        if wrs.len() == cap as usize {
            return (wrs, ptrs, Some((p, libc::ENOMEM)));
        }
        // SAFETY: the caller's linked list of work requests.
        let w = unsafe { &*p };
        // SAFETY: as above.
        match unsafe { sges(w.sg_list, w.num_sge) } {
            Ok(sg) => {
                wrs.push(convert::recv_wr(w.wr_id, sg));
                ptrs.push(p);
            }
            Err(e) => return (wrs, ptrs, Some((p, e))),
        }
        p = w.next;
    }
    (wrs, ptrs, None)
}

fn finish_recv(
    r: Result<(), verbs_api::PostError>,
    ptrs: &[*mut sys::ibv_recv_wr],
    bad: Option<(*mut sys::ibv_recv_wr, c_int)>,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    if let Err(e) = r {
        out!(bad_wr, ptrs[e.index.min(ptrs.len() - 1)]);
        return e.error.errno();
    }
    if let Some((p, e)) = bad {
        out!(bad_wr, p);
        return e;
    }
    0
}

pub(super) unsafe extern "C" fn op_post_recv(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    let q = obj_or!(Qp, qp, EINVAL);
    let ctx = ctx_fast!(q.raw.qp_base.context, EINVAL);
    // A QP that takes its receives from an SRQ, and an XRC QP, has no receive queue to
    // be full: the device refuses the post (EINVAL), where the queue's bound (0) would
    // say ENOMEM.
    let base = &q.raw.qp_base;
    let cap = if base.srq.is_null()
        && base.qp_type != sys::IBV_QPT_XRC_SEND
        && base.qp_type != sys::IBV_QPT_XRC_RECV
    {
        q.rq_cap
    } else {
        u32::MAX
    };
    // SAFETY: module safety argument.
    let (wrs, ptrs, bad) = unsafe { recv_wrs(wr, cap) };
    finish_recv(
        ctx.dev.post_recv(q.raw.qp_base.qp_num, &wrs),
        &ptrs,
        bad,
        bad_wr,
    )
}

pub(super) unsafe extern "C" fn op_post_srq_recv(
    srq: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    let s = obj_or!(Srq, srq, EINVAL);
    let ctx = ctx_fast!(s.raw.context, EINVAL);
    let cap = s.max_wr.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: module safety argument.
    let (wrs, ptrs, bad) = unsafe { recv_wrs(wr, cap) };
    finish_recv(ctx.dev.post_srq_recv(s.id, &wrs), &ptrs, bad, bad_wr)
}
