//! The exported `rdma_*` calls (librdmacm's `rdma_cma.h`), over [`EmuCm`]. Ids made
//! with no event channel are synchronous, as in librdmacm: each call that produces an
//! event waits for it. (Safety argument: the parent module's.)

use std::ffi::{c_char, c_int, c_void};
use std::time::Duration;

use verbs_api::{CmEvent, CmEventParam, CmEventType, ConnParam, QpState};
use verbs_ffi::convert;

use super::*;
use crate::objects::{free, into_ptr, Wraps};
use crate::verbs::{
    ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel, ibv_destroy_cq,
    ibv_destroy_qp, ibv_modify_qp, nonblocking, qp_init_of, unwrap_qp, wrap_qp,
};

/// librdmacm's `RDMA_MAX_RESP_RES` and `RDMA_MAX_INIT_DEPTH` (`rdma_cma.h`): "as many
/// as the device allows".
const MAX_RES: u8 = 0xFF;

// SAFETY: each is #[repr(C)] with the named struct first (parent module).
unsafe impl Wraps<r::rdma_event_channel> for ChannelObj {}
// SAFETY: as above.
unsafe impl Wraps<r::rdma_cm_id> for IdObj {}
// SAFETY: as above.
unsafe impl Wraps<r::rdma_cm_event> for EventObj {}

/// The CM, or return -1 with its errno from the call.
macro_rules! cm_or {
    ($err:expr) => {
        match cm() {
            Ok(c) => c,
            Err(e) => {
                set_errno(e);
                return $err;
            }
        }
    };
}

/// The id object behind a pointer (mutable: the library keeps its public fields
/// up to date), or return -1/EINVAL for null or a pointer that is no live id of ours.
macro_rules! id_or {
    ($cm:expr, $p:expr, $err:expr) => {
        if $p.is_null() || !$cm.ids.lock().is_live($p) {
            set_errno(libc::EINVAL);
            return $err;
        } else {
            // SAFETY: a live id of ours (module safety argument).
            unsafe { &mut *$p.cast::<IdObj>() }
        }
    };
}

/// -1 with errno for a CM error, 0 for success.
fn status(r: verbs_api::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            fail(&e);
            -1
        }
    }
}

/// Brings the public fields of the id (`verbs`, `port_num`, `route.addr`) up to date
/// with the CM's view of it.
fn refresh(cm: &Cm, o: &mut IdObj) {
    let Ok(info) = cm.cm.id_info(o.id) else {
        return;
    };
    if let Some(dev) = &info.device {
        o.raw.verbs = cm.context(dev);
        o.raw.port_num = info.port_num;
        if o.raw.pd.is_null() && !o.raw.verbs.is_null() {
            // librdmacm cma.c `ucma_get_device`: an id bound to a device gets the
            // device's PD (one per device, made at first use).
            o.raw.pd = cm.default_pd(o.raw.verbs);
        }
    }
    let addr = &mut o.raw.route.addr;
    addr.__bindgen_anon_1.src_storage = cm::sockaddr_to_c(info.local.unwrap_or(NO_ADDR)).0;
    addr.__bindgen_anon_2.dst_storage = cm::sockaddr_to_c(info.peer.unwrap_or(NO_ADDR)).0;
    // SAFETY: writing the ibaddr member of the union (plain data).
    unsafe {
        let ib = addr.addr.ibaddr.as_mut();
        ib.sgid = convert::gid_to_c(&info.sgid);
        ib.dgid = convert::gid_to_c(&info.dgid);
        ib.pkey = 0xFFFFu16.to_be();
    }
}

/// A new id object reporting to `channel`.
fn new_id(
    cm: &Cm,
    cid: CmId,
    channel: *mut r::rdma_event_channel,
    context: *mut c_void,
    ps: r::rdma_port_space,
    sync: bool,
    own_channel: bool,
) -> *mut r::rdma_cm_id {
    let p = into_ptr::<r::rdma_cm_id, IdObj>(IdObj {
        raw: r::rdma_cm_id {
            channel,
            context,
            ps,
            qp_type: cm::qp_type_of_port_space(ps),
            ..Default::default()
        },
        id: cid,
        sync,
        own_channel,
        own_cqs: false,
        ep_qp: None,
        destroyed: false,
        mcast: Vec::new(),
        depth: (0, 0),
    });
    cm.ids.lock().insert(cid, p);
    p
}

fn id_ptr(cm: &Cm, id: CmId) -> *mut r::rdma_cm_id {
    cm.ids.lock().get(id)
}

/// The C event of `ev`; a connection request gets its new id here.
fn make_event(cm: &Cm, ev: CmEvent) -> *mut r::rdma_cm_event {
    let listen = ev.listen_id.map_or(std::ptr::null_mut(), |l| id_ptr(cm, l));
    let mut id = id_ptr(cm, ev.id);
    if id.is_null() && ev.event == CmEventType::ConnectRequest && !listen.is_null() {
        // SAFETY: a live id of ours.
        let l = unsafe { &*listen.cast::<IdObj>() };
        id = new_id(
            cm,
            ev.id,
            l.raw.channel,
            l.raw.context,
            l.raw.ps,
            l.sync,
            false,
        );
    }
    let mut ev = ev;
    if !id.is_null() {
        // SAFETY: a live id of ours.
        let o = unsafe { &mut *id.cast::<IdObj>() };
        refresh(cm, o);
        if let (CmEventType::ConnectRequest, CmEventParam::Conn(c)) = (ev.event, &ev.param) {
            // librdmacm cma.c `rdma_get_cm_event`, CONNECT_REQUEST: the id keeps the
            // request's depths for an `rdma_accept` that leaves them to it.
            o.depth = (c.initiator_depth, c.responder_resources);
        }
        if ev.event == CmEventType::ConnectResponse {
            if let Some(qp) = program_qp(cm, o) {
                // librdmacm cma.c `rdma_get_cm_event`, CONNECT_RESPONSE on an id with a
                // QP (`ucma_process_conn_resp`): the QP goes to RTR and RTS, the RTU
                // goes out, and the program sees ESTABLISHED (CONNECT_ERROR if that
                // failed, the QP then in ERROR).
                // SAFETY: the program's QP of the id.
                match unsafe { process_conn_resp(cm, o, qp) } {
                    Ok(()) => ev.event = CmEventType::Established,
                    Err(e) => {
                        ev.event = CmEventType::ConnectError;
                        ev.status = -e;
                    }
                }
            }
        }
    }
    let mut raw = cm::cm_event_to_c(&ev, id, listen).unwrap_or_else(|_| {
        // More private data than a C event can say (a CM MAD carries 216 bytes at
        // most, so never): the event goes without its parameters.
        r::rdma_cm_event {
            id,
            listen_id: listen,
            event: cm::cm_event_type_to_c(ev.event),
            status: ev.status,
            ..Default::default()
        }
    });
    if matches!(
        ev.event,
        CmEventType::MulticastJoin | CmEventType::MulticastError
    ) && !id.is_null()
    {
        if let CmEventParam::Ud(u) = &ev.param {
            // SAFETY: a live id of ours.
            let o = unsafe { &*id.cast::<IdObj>() };
            let group = emu_core::nic::ip_of(&u.ah_attr.grh.dgid);
            let ctx = o.mcast.iter().find(|(a, _)| a.ip() == group);
            // SAFETY: writing the ud member of the param union (plain data).
            unsafe {
                let ud = raw.param.ud.as_mut();
                ud.private_data = ctx.map_or(std::ptr::null(), |(_, c)| *c as *const c_void);
                ud.private_data_len = 0;
            }
        }
    }
    let counted = counted_id(&ev);
    into_ptr::<r::rdma_cm_event, EventObj>(EventObj {
        raw,
        param: ev.param,
        counted,
    })
}

/// The id an event counts against ([`Cm::unacked`]), librdmacm's `evt->id_priv`: a
/// connection request counts against the listening id (the kernel reports it on the
/// listener's context), any other event against its id.
fn counted_id(ev: &CmEvent) -> CmId {
    match (ev.event, ev.listen_id) {
        (CmEventType::ConnectRequest, Some(l)) => l,
        _ => ev.id,
    }
}

/// Counts `ev` as handed out ([`Cm::unacked`]): called by the CM while a
/// `destroy_id` of its id cannot run between taking it and counting it.
fn reported(cm: &Cm) -> impl Fn(&CmEvent) + '_ {
    move |ev| cm.handed_out(counted_id(ev))
}

/// Frees an event handed out (acked by the program, or an id's kept event), counting
/// its ack ([`Cm::unacked`]).
///
/// # Safety
/// `event` was made by [`make_event`] and is freed once.
unsafe fn release_event(cm: &Cm, event: *mut r::rdma_cm_event) {
    // SAFETY: one of our events (caller's contract).
    let counted = unsafe { (*event.cast::<EventObj>()).counted };
    // SAFETY: as above; freed once.
    unsafe { free::<_, EventObj>(event) };
    cm.acked(counted);
}

/// Acks the event the id `o` keeps in `id->event` (a synchronous id's last, or the
/// CONNECT_REQUEST `rdma_get_request` kept), if any.
fn release_kept(cm: &Cm, o: &mut IdObj) {
    let kept = std::mem::replace(&mut o.raw.event, std::ptr::null_mut());
    if !kept.is_null() {
        // SAFETY: an event of ours the id kept, taken out of it above: freed once.
        unsafe { release_event(cm, kept) };
    }
}

/// For a synchronous id, waits for the event its call produces and keeps it in
/// `id->event` until the next call on the id (acking the one kept before), as
/// librdmacm's `ucma_complete` (cma.c) does; an event with a status is -1 with
/// librdmacm's errno: ECONNREFUSED for a reject, else the status (negated when it
/// is a negative errno: ETIMEDOUT for no answer).
fn complete(cm: &Cm, id: *mut r::rdma_cm_id) -> c_int {
    // SAFETY: a live id of ours (the callers checked it).
    let o = unsafe { &mut *id.cast::<IdObj>() };
    if !o.sync {
        return 0;
    }
    release_kept(cm, o);
    // SAFETY: the id's channel is a live channel of ours.
    let ch = unsafe { &*o.raw.channel.cast::<ChannelObj>() };
    match cm.cm.get_cm_event_reported(ch.id, None, &reported(cm)) {
        Err(e) => {
            fail(&e);
            -1
        }
        Ok(ev) => {
            let event = make_event(cm, ev);
            // SAFETY: just made; the id is live (a synchronous id's channel reports
            // its own events only).
            let (kind, status) = unsafe {
                (*id).event = event;
                ((*event).event, (*event).status)
            };
            match status {
                0 => 0,
                _ if kind == CmEventType::Rejected.as_u32() => err(libc::ECONNREFUSED),
                s if s < 0 => err(-s),
                s => err(s),
            }
        }
    }
}

/// The id's QP when the program made it itself (`ibv_create_qp`, stored in
/// `id->qp`): librdmacm moves such a QP with `rdma_init_qp_attr` and `ibv_modify_qp`,
/// while the CM drives the QPs of `rdma_create_qp` itself.
fn program_qp(cm: &Cm, o: &IdObj) -> Option<*mut sys::ibv_qp> {
    if o.raw.qp.is_null() {
        return None;
    }
    let by_cm = cm.cm.id_info(o.id).ok().and_then(|i| i.qp_num);
    // SAFETY: a QP the program stored in the id (the librdmacm contract).
    let qpn = unsafe { (*o.raw.qp).qp_num };
    (by_cm != Some(qpn)).then_some(o.raw.qp)
}

/// The attributes `rdma_init_qp_attr` gives for `state`, changed by `adjust`, applied
/// to `qp` with `ibv_modify_qp`: one step of librdmacm's `ucma_modify_qp_rtr` /
/// `ucma_modify_qp_rts`. The errno on failure.
unsafe fn move_qp(
    cm: &Cm,
    o: &IdObj,
    qp: *mut sys::ibv_qp,
    state: QpState,
    adjust: impl FnOnce(&mut sys::ibv_qp_attr),
) -> Result<(), c_int> {
    let (a, mask) = cm.cm.init_qp_attr(o.id, state).map_err(|e| fail(&e))?;
    let mut c = convert::qp_attr_to_c(&a);
    adjust(&mut c);
    // SAFETY: the program's QP, attributes of our own.
    match unsafe { ibv_modify_qp(qp, &mut c, mask.bits() as c_int) } {
        0 => Ok(()),
        e => {
            set_errno(e);
            Err(e)
        }
    }
}

/// librdmacm's `ucma_modify_qp_rtr` and `ucma_modify_qp_rts`: the program's QP to
/// INIT (again: the access flags of the connection), RTR and RTS, with the
/// responder resources and initiator depth given unless they are `MAX_RES`.
unsafe fn qp_to_rts(
    cm: &Cm,
    o: &IdObj,
    qp: *mut sys::ibv_qp,
    resp_res: u8,
    init_depth: u8,
) -> Result<(), c_int> {
    // SAFETY: the caller's QP.
    unsafe {
        move_qp(cm, o, qp, QpState::Init, |_| {})?;
        move_qp(cm, o, qp, QpState::Rtr, |a| {
            if resp_res != MAX_RES {
                a.max_dest_rd_atomic = resp_res;
            }
        })?;
        move_qp(cm, o, qp, QpState::Rts, |a| {
            if init_depth != MAX_RES {
                a.max_rd_atomic = init_depth;
            }
        })
    }
}

/// librdmacm's `ucma_modify_qp_err`.
unsafe fn qp_to_error(qp: *mut sys::ibv_qp) {
    let mut a = sys::ibv_qp_attr {
        qp_state: sys::IBV_QPS_ERR,
        ..Default::default()
    };
    // SAFETY: the caller's QP.
    unsafe { ibv_modify_qp(qp, &mut a, sys::IBV_QP_STATE as c_int) };
}

/// librdmacm's `ucma_process_conn_resp`: the program's QP to RTS and the RTU sent
/// (`establish`); on failure the QP goes to ERROR. The errno on failure.
unsafe fn process_conn_resp(cm: &Cm, o: &IdObj, qp: *mut sys::ibv_qp) -> Result<(), c_int> {
    // SAFETY: the caller's QP.
    let r = unsafe { qp_to_rts(cm, o, qp, MAX_RES, MAX_RES) }
        .and_then(|()| cm.cm.establish(o.id).map_err(|e| fail(&e)));
    if r.is_err() {
        // SAFETY: as above.
        unsafe { qp_to_error(qp) };
    }
    r
}

/// The device's (max initiator depth, max responder resources), as librdmacm's
/// `cma_dev` keeps them (`max_qp_init_rd_atom`, `max_qp_rd_atom`).
fn device_max(o: &IdObj) -> (u8, u8) {
    // SAFETY: the id's context is one of ours, or null.
    unsafe { Context::from_ptr(o.raw.verbs) }
        .and_then(|c| c.dev.query_device().ok())
        .map_or((1, 1), |a| {
            (
                a.max_qp_init_rd_atom.min(254) as u8,
                a.max_qp_rd_atom.min(254) as u8,
            )
        })
}

/// `rdma_create_event_channel`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut r::rdma_event_channel {
    let cm = cm_or!(std::ptr::null_mut());
    let made = cm
        .cm
        .create_event_channel()
        .and_then(|ch| Ok((ch, cm.cm.event_channel_fd(ch)?)));
    match made {
        Ok((id, fd)) => into_ptr(ChannelObj {
            raw: r::rdma_event_channel { fd },
            id,
        }),
        Err(e) => {
            fail(&e);
            std::ptr::null_mut()
        }
    }
}

/// `rdma_destroy_event_channel`. librdmacm closes the channel's fd whatever ids
/// still report to it (cma.c), and the kernel then destroys those ids
/// (`ucma_close`), telling their peers (a DREP to a peer that disconnected, a DREQ
/// to a connected one, a REJ to a pending request): so do the ids here
/// (`EmuCm::abandon_id`). Their objects stay allocated, as librdmacm leaves them, but
/// are no live ids any more (later calls on them are EINVAL); their QPs are the
/// program's to destroy. qperf's server leaves its connection's id so, and its
/// client waits for that DREP.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut r::rdma_event_channel) {
    let Ok(cm) = cm() else { return };
    if channel.is_null() {
        return;
    }
    // SAFETY: a live channel of ours.
    let ch = unsafe { &*channel.cast::<ChannelObj>() };
    let mut done = cm.cm.destroy_event_channel(ch.id);
    if let Err(Error::Busy(_)) = done {
        let left: Vec<usize> = {
            let ids = cm.ids.lock();
            ids.all()
                .filter(|p| {
                    // SAFETY: the ids in the table are live.
                    unsafe { (*(*p as *const IdObj)).raw.channel == channel }
                })
                .collect()
        };
        for p in left {
            // SAFETY: a live id of ours, reporting to this channel.
            let o = unsafe { &*(p as *const IdObj) };
            if let Err(e) = cm.cm.abandon_id(o.id) {
                eprintln!("rdma-emu librdmacm: rdma_destroy_event_channel: {e}");
            }
            cm.ids.lock().remove(o.id);
        }
        done = cm.cm.destroy_event_channel(ch.id);
    }
    if let Err(e) = done {
        eprintln!("rdma-emu librdmacm: rdma_destroy_event_channel: {e}");
        return;
    }
    // SAFETY: made by rdma_create_event_channel; destroyed once.
    unsafe { free::<_, ChannelObj>(channel) };
}

/// `rdma_get_cm_event`: waits for the next event (EAGAIN at once on a non-blocking fd).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut r::rdma_event_channel,
    event: *mut *mut r::rdma_cm_event,
) -> c_int {
    let cm = cm_or!(-1);
    if channel.is_null() || event.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: a live channel of ours.
    let ch = unsafe { &*channel.cast::<ChannelObj>() };
    let nb = nonblocking(ch.raw.fd);
    match cm
        .cm
        .get_cm_event_reported(ch.id, nb.then_some(Duration::ZERO), &reported(cm))
    {
        Ok(ev) => {
            // SAFETY: the caller's out pointer.
            unsafe { *event = make_event(cm, ev) };
            0
        }
        Err(Error::TimedOut) if nb => err(libc::EAGAIN),
        Err(e) => {
            fail(&e);
            -1
        }
    }
}

/// `rdma_ack_cm_event`: frees the event.
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut r::rdma_cm_event) -> c_int {
    let cm = cm_or!(-1);
    if event.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: made by rdma_get_cm_event; acked once.
    unsafe { release_event(cm, event) };
    0
}

/// `rdma_event_str`.
#[no_mangle]
pub extern "C" fn rdma_event_str(event: r::rdma_cm_event_type) -> *const c_char {
    match CmEventType::try_from(event) {
        // NUL-terminated copies of CmEventType::as_str, made once.
        Ok(e) => {
            static NAMES: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
            let names = NAMES.get_or_init(|| {
                CmEventType::ALL
                    .iter()
                    .map(|e| std::ffi::CString::new(e.as_str()).expect("no NUL"))
                    .collect()
            });
            names[e.as_u32() as usize].as_ptr()
        }
        Err(_) => c"UNKNOWN EVENT".as_ptr(),
    }
}

/// `rdma_create_id`: a NULL channel makes a synchronous id.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut r::rdma_event_channel,
    id: *mut *mut r::rdma_cm_id,
    context: *mut c_void,
    ps: r::rdma_port_space,
) -> c_int {
    let cm = cm_or!(-1);
    if id.is_null() {
        return err(libc::EINVAL);
    }
    let Ok(space) = cm::port_space_from_c(ps) else {
        return err(libc::EINVAL);
    };
    let (channel, own) = if channel.is_null() {
        // SAFETY: no arguments.
        let ch = unsafe { rdma_create_event_channel() };
        if ch.is_null() {
            return -1;
        }
        (ch, true)
    } else {
        (channel, false)
    };
    // SAFETY: a live channel of ours.
    let ch = unsafe { &*channel.cast::<ChannelObj>() };
    match cm.cm.create_id(ch.id, space) {
        Ok(cid) => {
            let p = new_id(cm, cid, channel, context, ps, own, own);
            // SAFETY: the caller's out pointer.
            unsafe { *id = p };
            0
        }
        Err(e) => {
            fail(&e);
            if own {
                // SAFETY: made just above.
                unsafe { rdma_destroy_event_channel(channel) };
            }
            -1
        }
    }
}

/// `rdma_migrate_id`: the id (and, for a listening id, its connection requests)
/// reports to `channel` from now on, with the events it has not taken yet; a null
/// `channel` makes it synchronous on a channel of its own, as librdmacm does. The
/// id's own channel, if it had one, goes (librdmacm `rdma_migrate_id`). libfabric's
/// verbs provider moves its ids this way (`vrb_pep_bind`, `vrb_ep_bind`).
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut r::rdma_cm_id,
    channel: *mut r::rdma_event_channel,
) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    let sync = channel.is_null();
    let channel = if sync {
        // SAFETY: no arguments.
        let ch = unsafe { rdma_create_event_channel() };
        if ch.is_null() {
            return -1;
        }
        ch
    } else {
        channel
    };
    // SAFETY: a channel of ours (the caller's, or made above).
    let ch = unsafe { &*channel.cast::<ChannelObj>() };
    if let Err(e) = cm.cm.migrate_id(o.id, ch.id) {
        if sync {
            // SAFETY: made above, used by nothing.
            unsafe { rdma_destroy_event_channel(channel) };
        }
        fail(&e);
        return -1;
    }
    let (old, old_own) = (o.raw.channel, o.own_channel);
    if o.sync {
        // librdmacm cma.c `rdma_migrate_id`: a synchronous id's kept event is acked.
        release_kept(cm, o);
    }
    o.raw.channel = channel;
    o.sync = sync;
    o.own_channel = sync;
    if old_own && old != channel {
        // SAFETY: the id's own channel, which nothing reports to any more.
        unsafe { rdma_destroy_event_channel(old) };
    }
    // As librdmacm: no event of the id is still being handled from the old channel
    // when the call returns.
    cm.wait_acked(o.id);
    0
}

/// `rdma_destroy_id`. An id whose QP is still there goes when the QP does
/// (`rdma_destroy_qp` or `ibv_destroy_qp`), as the program may destroy them in either
/// order with librdmacm.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut r::rdma_cm_id) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    let later = match cm.cm.destroy_id(o.id) {
        Ok(()) => false,
        Err(Error::Busy(_)) if !o.raw.qp.is_null() => true,
        Err(e) => {
            fail(&e);
            return -1;
        }
    };
    // librdmacm cma.c `rdma_destroy_id`: the event the id kept is acked, then the call
    // waits for the program to ack the others it was handed for the id (another
    // thread may be handling one). A destroyed id gets no more events (one that
    // waits for its QP still may).
    release_kept(cm, o);
    cm.wait_acked(o.id);
    if later {
        o.destroyed = true;
        return 0;
    }
    // SAFETY: the id is gone from the CM; nothing else frees it.
    unsafe { free_id(cm, id) };
    0
}

/// Frees an id object the CM no longer knows, with its kept event and own channel.
unsafe fn free_id(cm: &Cm, id: *mut r::rdma_cm_id) {
    // SAFETY: a live id of ours (caller's contract).
    let o = unsafe { &mut *id.cast::<IdObj>() };
    cm.ids.lock().remove(o.id);
    release_kept(cm, o);
    if o.own_channel {
        // SAFETY: the id's own channel, made by rdma_create_id.
        unsafe { rdma_destroy_event_channel(o.raw.channel) };
    }
    // SAFETY: made by new_id; freed once.
    unsafe { free::<_, IdObj>(id) };
}

/// `rdma_bind_addr`.
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut r::rdma_cm_id, addr: *mut r::sockaddr) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    // SAFETY: the caller's sockaddr.
    let a = match unsafe { sockaddr_arg(addr) } {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    let r = status(cm.cm.bind_addr(o.id, a));
    refresh(cm, o);
    r
}

/// `rdma_resolve_addr`.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut r::rdma_cm_id,
    src_addr: *mut r::sockaddr,
    dst_addr: *mut r::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    // SAFETY: the caller's sockaddrs.
    let (src, dst) = match unsafe { (cm::sockaddr_from_ptr(src_addr), sockaddr_arg(dst_addr)) } {
        (Ok(s), Ok(d)) => (s, d),
        (Err(e), _) => return err(e.errno()),
        (_, Err(e)) => return err(e),
    };
    let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0).max(1));
    if status(cm.cm.resolve_addr(o.id, src, dst, t)) != 0 {
        return -1;
    }
    refresh(cm, o);
    complete(cm, id)
}

/// `rdma_resolve_route`.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut r::rdma_cm_id, timeout_ms: c_int) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
    if status(cm.cm.resolve_route(o.id, t)) != 0 {
        return -1;
    }
    refresh(cm, o);
    complete(cm, id)
}

/// `rdma_listen`.
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut r::rdma_cm_id, backlog: c_int) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    let r = status(cm.cm.listen(o.id, u32::try_from(backlog).unwrap_or(0)));
    refresh(cm, o);
    r
}

/// Creates the CQ (and its completion channel) `rdma_create_qp` makes for an id
/// given none.
unsafe fn own_cq(
    ctx: *mut sys::ibv_context,
    depth: u32,
    id: *mut r::rdma_cm_id,
) -> Option<(*mut sys::ibv_comp_channel, *mut sys::ibv_cq)> {
    // SAFETY: a live context of ours.
    let ch = unsafe { ibv_create_comp_channel(ctx) };
    if ch.is_null() {
        return None;
    }
    let n = c_int::try_from(depth.max(1)).unwrap_or(c_int::MAX);
    // SAFETY: as above; the channel was just made on it.
    let cq = unsafe { ibv_create_cq(ctx, n, id.cast(), ch, 0) };
    if cq.is_null() {
        // SAFETY: made above.
        unsafe { ibv_destroy_comp_channel(ch) };
        return None;
    }
    Some((ch, cq))
}

/// Destroys the CQs and channels `own_cq` made for the id.
unsafe fn drop_own_cqs(o: &mut IdObj) {
    for (cq, ch) in [
        (o.raw.send_cq, o.raw.send_cq_channel),
        (o.raw.recv_cq, o.raw.recv_cq_channel),
    ] {
        if !cq.is_null() {
            // SAFETY: made by own_cq.
            unsafe { ibv_destroy_cq(cq) };
        }
        if !ch.is_null() {
            // SAFETY: made by own_cq.
            unsafe { ibv_destroy_comp_channel(ch) };
        }
    }
    o.raw.send_cq = std::ptr::null_mut();
    o.raw.recv_cq = std::ptr::null_mut();
    o.raw.send_cq_channel = std::ptr::null_mut();
    o.raw.recv_cq_channel = std::ptr::null_mut();
    o.own_cqs = false;
}

/// `rdma_create_qp`: the id's QP, made and driven by the CM, is an ordinary `ibv_qp`
/// of the PD's context. With no PD the id's (or the device's) PD is used; with no
/// CQs, CQs with completion channels are made (`id->send_cq`, `id->recv_cq`).
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut r::rdma_cm_id,
    pd: *mut sys::ibv_pd,
    qp_init_attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    if qp_init_attr.is_null() || !o.raw.qp.is_null() {
        // librdmacm cma.c `rdma_create_qp_ex`: EINVAL for an id that has a QP.
        return err(libc::EINVAL);
    }
    if o.raw.verbs.is_null() {
        return err(libc::EINVAL); // not bound to a device yet
    }
    let pd = if !pd.is_null() {
        pd
    } else if !o.raw.pd.is_null() {
        o.raw.pd
    } else {
        cm.default_pd(o.raw.verbs)
    };
    if pd.is_null() {
        return -1;
    }
    // SAFETY: the caller's attributes.
    let mut a = unsafe { *qp_init_attr };
    // SAFETY: a live PD.
    let ctx_ptr = unsafe { (*pd).context };
    let made_cqs = a.send_cq.is_null() || a.recv_cq.is_null();
    if made_cqs {
        // SAFETY: the PD's context.
        let s = unsafe { own_cq(ctx_ptr, a.cap.max_send_wr, id) };
        // SAFETY: as above.
        let r = unsafe { own_cq(ctx_ptr, a.cap.max_recv_wr, id) };
        o.own_cqs = true;
        if let Some((ch, cq)) = s {
            (o.raw.send_cq_channel, o.raw.send_cq) = (ch, cq);
        }
        if let Some((ch, cq)) = r {
            (o.raw.recv_cq_channel, o.raw.recv_cq) = (ch, cq);
        }
        if s.is_none() || r.is_none() {
            // SAFETY: the id's own CQs.
            unsafe { drop_own_cqs(o) };
            return err(libc::ENOMEM);
        }
        if a.send_cq.is_null() {
            a.send_cq = o.raw.send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = o.raw.recv_cq;
        }
    }
    if a.srq.is_null() {
        a.srq = o.raw.srq;
    }
    // SAFETY: module safety argument.
    let made = unsafe { qp_init_of(pd, &a) }.and_then(|(ctx, init)| {
        // The PD must be on the NIC the id is bound to.
        let same = cm.cm.device(o.id).is_ok_and(|d| {
            std::ptr::addr_eq(std::sync::Arc::as_ptr(&d), std::sync::Arc::as_ptr(&ctx.dev))
        });
        if !same {
            eprintln!("rdma-emu librdmacm: rdma_create_qp: the PD is not on the id's device");
            return Err(libc::EINVAL);
        }
        let qpn = cm.cm.create_qp(o.id, &init).map_err(|e| fail(&e))?;
        Ok(wrap_qp(ctx, qpn, pd, &mut a))
    });
    match made {
        Ok(qp) => {
            o.raw.qp = qp;
            o.raw.pd = pd;
            o.raw.qp_type = a.qp_type;
            if !made_cqs {
                o.raw.send_cq = a.send_cq;
                o.raw.recv_cq = a.recv_cq;
            }
            // SAFETY: the caller's attributes: the capabilities the QP got.
            unsafe { (*qp_init_attr).cap = a.cap };
            0
        }
        Err(e) => {
            if made_cqs {
                // SAFETY: the id's own CQs.
                unsafe { drop_own_cqs(o) };
            }
            err(e)
        }
    }
}

/// `rdma_create_qp_ex`: the attributes `rdma_create_qp` takes (PD, CQs, SRQ, caps);
/// other extended attributes are EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut r::rdma_cm_id,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> c_int {
    if attr.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.comp_mask & !(sys::IBV_QP_INIT_ATTR_PD | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 {
        return unsupported("rdma_create_qp_ex with XRC, RSS, TSO or other extended attributes");
    }
    let pd = if a.comp_mask & sys::IBV_QP_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        std::ptr::null_mut()
    };
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
    let r = unsafe { rdma_create_qp(id, pd, &mut basic) };
    a.cap = basic.cap;
    r
}

/// `rdma_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut r::rdma_cm_id) {
    let Ok(cm) = cm() else { return };
    if id.is_null() || !cm.ids.lock().is_live(id) {
        return;
    }
    if destroy_qp_of(cm, id) != 0 {
        eprintln!(
            "rdma-emu librdmacm: rdma_destroy_qp: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Destroys the id's QP through the CM, its object, and the CQs made for it (and
/// the id, if `rdma_destroy_id` came first); 0 or the errno (as `ibv_destroy_qp`).
pub(crate) fn destroy_qp_of(cm: &Cm, id: *mut r::rdma_cm_id) -> c_int {
    // SAFETY: a live id of ours.
    let o = unsafe { &mut *id.cast::<IdObj>() };
    if o.raw.qp.is_null() {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    }
    if let Some(qp) = program_qp(cm, o) {
        // librdmacm's rdma_destroy_qp destroys whatever QP the id has.
        o.raw.qp = std::ptr::null_mut();
        // SAFETY: the program's QP; no id refers to it any more.
        let r = unsafe { ibv_destroy_qp(qp) };
        if r != 0 {
            o.raw.qp = qp;
            set_errno(r);
        }
        return r;
    }
    if let Err(e) = cm.cm.destroy_qp(o.id) {
        return fail(&e);
    }
    // SAFETY: a live QP of ours; its device QP is gone.
    if let Some(ctx) = unsafe { Context::from_ptr((*o.raw.qp).context) } {
        // SAFETY: made by wrap_qp in rdma_create_qp; freed once.
        unsafe { unwrap_qp(ctx, o.raw.qp) };
    }
    o.raw.qp = std::ptr::null_mut();
    if o.own_cqs {
        // SAFETY: the id's own CQs, no QP uses them any more.
        unsafe { drop_own_cqs(o) };
    }
    if o.destroyed && cm.cm.destroy_id(o.id).is_ok() {
        // SAFETY: the program destroyed the id already; the CM has let it go.
        unsafe { free_id(cm, id) };
    }
    0
}

/// A C `rdma_conn_param` (null: librdmacm's defaults).
unsafe fn conn_param_of(p: *const r::rdma_conn_param) -> ConnParam {
    // SAFETY: the caller's struct or null.
    let Some(c) = (unsafe { p.as_ref() }) else {
        return ConnParam::default();
    };
    // SAFETY: private_data_len bytes of the caller's, or null.
    cm::conn_param_from_c(c, unsafe {
        cm::private_data(c.private_data, c.private_data_len)
    })
}

/// The parameters of `rdma_connect` or `rdma_accept` on id `o`: the caller's
/// `conn_param` (null: librdmacm's defaults), checked as [`valid_param`] checks them
/// (EINVAL), with the depths left to librdmacm (`RDMA_MAX_*`, or no parameters) taken
/// from `depths` (initiator depth, responder resources).
///
/// # Safety
/// `conn_param` is null or the caller's `rdma_conn_param`, whose private data pointer
/// has `private_data_len` readable bytes.
unsafe fn checked_param(
    o: &IdObj,
    conn_param: *const r::rdma_conn_param,
    depths: (u8, u8),
) -> Result<ConnParam, c_int> {
    // SAFETY: the caller's struct or null.
    let given = unsafe { conn_param.as_ref() };
    if !valid_param(o, given) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's parameters.
    let mut p = unsafe { conn_param_of(conn_param) };
    p.initiator_depth = match given {
        Some(g) if g.initiator_depth != MAX_RES => g.initiator_depth,
        _ => depths.0,
    };
    p.responder_resources = match given {
        Some(g) if g.responder_resources != MAX_RES => g.responder_resources,
        _ => depths.1,
    };
    Ok(p)
}

/// librdmacm cma.c `ucma_valid_param`: on `RDMA_PS_TCP`, parameters are needed when
/// the id has no QP, and depths above the device's maxima (other than `MAX_RES`) are
/// EINVAL.
fn valid_param(o: &IdObj, p: Option<&r::rdma_conn_param>) -> bool {
    if o.raw.ps != r::RDMA_PS_TCP {
        return true;
    }
    let Some(p) = p else {
        return !o.raw.qp.is_null();
    };
    let (max_init, max_resp) = device_max(o);
    (p.responder_resources == MAX_RES || p.responder_resources <= max_resp)
        && (p.initiator_depth == MAX_RES || p.initiator_depth <= max_init)
}

/// `rdma_connect`. The QP is the id's (`rdma_create_qp`, or one the program made and
/// stored in `id->qp`: librdmacm moves that one to RTS when the REP comes), or, with
/// none, `conn_param->qp_num` (the program moves it: CONNECT_RESPONSE, then
/// `rdma_establish`). Depths of `RDMA_MAX_INIT_DEPTH` / `RDMA_MAX_RESP_RES`, or no
/// parameters, mean the device's maxima (librdmacm cma.c `rdma_connect`).
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(
    id: *mut r::rdma_cm_id,
    conn_param: *mut r::rdma_conn_param,
) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    // SAFETY: the caller's parameters or null.
    let mut p = match unsafe { checked_param(o, conn_param, device_max(o)) } {
        Ok(p) => p,
        Err(e) => return err(e),
    };
    if !o.raw.qp.is_null() {
        // SAFETY: the id's QP (ours or the program's).
        unsafe {
            p.qp_num = (*o.raw.qp).qp_num;
            p.srq = !(*o.raw.qp).srq.is_null();
        }
    }
    if status(cm.cm.connect(o.id, &p)) != 0 {
        return -1;
    }
    complete(cm, id)
}

/// `rdma_establish`.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut r::rdma_cm_id) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    status(cm.cm.establish(o.id))
}

/// `rdma_accept`. As in librdmacm (cma.c `rdma_accept`): a QP the program made and
/// stored in `id->qp` is moved to RTR and RTS here (with `rdma_init_qp_attr`'s
/// attributes), one named only by `conn_param->qp_num` is the program's to move, and
/// the depths left to librdmacm (`RDMA_MAX_*`, or no parameters) are the request's,
/// capped at the device's maxima.
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(
    id: *mut r::rdma_cm_id,
    conn_param: *mut r::rdma_conn_param,
) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    let (max_init, max_resp) = device_max(o);
    let depths = (o.depth.0.min(max_init), o.depth.1.min(max_resp));
    // SAFETY: the caller's parameters or null.
    let mut p = match unsafe { checked_param(o, conn_param, depths) } {
        Ok(p) => p,
        Err(e) => return err(e),
    };
    let ud = o.raw.qp_type == sys::IBV_QPT_UD;
    let own = program_qp(cm, o);
    if let (false, Some(qp)) = (ud, own) {
        // SAFETY: the program's QP of the id.
        if unsafe { qp_to_rts(cm, o, qp, p.responder_resources, p.initiator_depth) }.is_err() {
            return -1;
        }
    }
    if !o.raw.qp.is_null() {
        // SAFETY: the id's QP (ours or the program's).
        unsafe {
            p.qp_num = (*o.raw.qp).qp_num;
            p.srq = !(*o.raw.qp).srq.is_null();
        }
    }
    if status(cm.cm.accept(o.id, &p)) != 0 {
        if let (false, Some(qp)) = (ud, own) {
            // SAFETY: as above.
            unsafe { qp_to_error(qp) };
        }
        return -1;
    }
    if ud {
        // A SIDR reply completes nothing on this side; librdmacm acks the kept
        // CONNECT_REQUEST of a synchronous id.
        if o.sync {
            release_kept(cm, o);
        }
        return 0;
    }
    complete(cm, id)
}

/// `rdma_reject`.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut r::rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    let data = if private_data.is_null() {
        &[][..]
    } else {
        // SAFETY: private_data_len bytes of the caller's.
        unsafe {
            std::slice::from_raw_parts(private_data.cast::<u8>(), usize::from(private_data_len))
        }
    };
    status(cm.cm.reject(o.id, data))
}

/// `rdma_disconnect`.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut r::rdma_cm_id) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    if let Some(qp) = program_qp(cm, o) {
        // librdmacm cma.c `ucma_shutdown`: the QP to ERROR before the DREQ (the CM
        // does this itself for the QPs of rdma_create_qp).
        // SAFETY: the program's QP of the id.
        unsafe { qp_to_error(qp) };
    }
    if status(cm.cm.disconnect(o.id)) != 0 {
        return -1;
    }
    complete(cm, id)
}

/// `rdma_get_request`: the next connection request of a listening id, as a new id
/// (with its QP when the listener was made by `rdma_create_ep` with QP attributes).
/// EINVAL for an id with an event channel, as librdmacm (cma.c): its requests come
/// as events on the channel.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut r::rdma_cm_id,
    id: *mut *mut r::rdma_cm_id,
) -> c_int {
    let cm = cm_or!(-1);
    let l = id_or!(cm, listen, -1);
    if id.is_null() || !l.sync {
        return err(libc::EINVAL);
    }
    let ev = match cm.cm.get_request_reported(l.id, None, &reported(cm)) {
        Ok(ev) => ev,
        Err(e) => {
            fail(&e);
            return -1;
        }
    };
    let event = make_event(cm, ev);
    // SAFETY: just made.
    let child = unsafe { (*event).id };
    // SAFETY: the new id (make_event made it for the request).
    let c = unsafe { &mut *child.cast::<IdObj>() };
    c.raw.event = event;
    if let Some((mut attr, pd)) = l.ep_qp {
        // SAFETY: module safety argument.
        if unsafe { rdma_create_qp(child, pd as *mut sys::ibv_pd, &mut attr) } != 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL);
            let _ = cm.cm.reject(c.id, &[]);
            // SAFETY: the id made above, not given out.
            unsafe { rdma_destroy_id(child) };
            return err(e);
        }
    }
    // SAFETY: the caller's out pointer.
    unsafe { *id = child };
    0
}

/// `rdma_create_ep`: a synchronous id for `res` (passive: bound, active: address
/// and route resolved), with a QP when `qp_init_attr` is given (passive: each
/// `rdma_get_request` id gets one).
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut r::rdma_cm_id,
    res: *mut r::rdma_addrinfo,
    pd: *mut sys::ibv_pd,
    qp_init_attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the caller's address info.
    let res = unsafe { &*res };
    let ps = if res.ai_port_space == 0 {
        r::RDMA_PS_TCP
    } else {
        res.ai_port_space as r::rdma_port_space
    };
    // librdmacm gives the QP the type of the address info (rdma_create_ep(3)).
    let mut attr = (!qp_init_attr.is_null()).then(|| {
        // SAFETY: the caller's attributes.
        let mut a = unsafe { *qp_init_attr };
        a.qp_type = match res.ai_qp_type {
            0 => cm::qp_type_of_port_space(ps),
            t => t as sys::ibv_qp_type,
        };
        a
    });
    let mut made = std::ptr::null_mut();
    // SAFETY: module safety argument.
    if unsafe { rdma_create_id(std::ptr::null_mut(), &mut made, std::ptr::null_mut(), ps) } != 0 {
        return -1;
    }
    // SAFETY: module safety argument (the caller's sockaddrs).
    let r = unsafe {
        if res.ai_flags & r::RAI_PASSIVE as c_int != 0 {
            let r = rdma_bind_addr(made, res.ai_src_addr);
            if let (0, Some(a)) = (r, attr) {
                (*made.cast::<IdObj>()).ep_qp = Some((a, pd as usize));
            }
            r
        } else {
            let mut r = rdma_resolve_addr(made, res.ai_src_addr, res.ai_dst_addr, 2000);
            if r == 0 {
                r = rdma_resolve_route(made, 2000);
            }
            if let (0, Some(a)) = (r, attr.as_mut()) {
                r = rdma_create_qp(made, pd, a);
                (*qp_init_attr).cap = a.cap;
            }
            r
        }
    };
    if r != 0 {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        // SAFETY: made above, not given out.
        unsafe { rdma_destroy_id(made) };
        return err(e);
    }
    // SAFETY: the caller's out pointer.
    unsafe { *id = made };
    0
}

/// `rdma_destroy_ep`: the QP if the id has one (and the CQs made for it), then the
/// id. A listening id has none (rdma_server's: `rdma_create_ep` keeps the QP
/// attributes for the requests), and as in librdmacm that is no error.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut r::rdma_cm_id) {
    let Ok(cm) = cm() else { return };
    // SAFETY: read only once the id is known to be live.
    let has_qp = !id.is_null() && cm.ids.lock().is_live(id) && unsafe { !(*id).qp.is_null() };
    // SAFETY: module safety argument.
    unsafe {
        if has_qp {
            rdma_destroy_qp(id);
        }
        rdma_destroy_id(id);
    }
}

/// `rdma_get_devices`: the contexts the CM uses, NULL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut sys::ibv_context {
    let cm = cm_or!(std::ptr::null_mut());
    let mut list: Vec<*mut sys::ibv_context> = cm
        .contexts
        .iter()
        .map(|(_, c)| *c as *mut sys::ibv_context)
        .collect();
    if !num_devices.is_null() {
        // SAFETY: the caller's out pointer.
        unsafe { *num_devices = list.len() as c_int };
    }
    list.push(std::ptr::null_mut());
    Box::into_raw(list.into_boxed_slice()).cast()
}

/// `rdma_free_devices`.
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut sys::ibv_context) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: our NULL-terminated list.
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: made by rdma_get_devices with n + 1 entries; freed once.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

/// `rdma_get_src_port` (network byte order, as librdmacm).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut r::rdma_cm_id) -> u16 {
    let Ok(cm) = cm() else { return 0 };
    if !cm.ids.lock().is_live(id) {
        return 0;
    }
    // SAFETY: a live id of ours.
    unsafe { (*id).route.addr.__bindgen_anon_1.src_sin.sin_port }
}

/// `rdma_get_dst_port` (network byte order).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut r::rdma_cm_id) -> u16 {
    let Ok(cm) = cm() else { return 0 };
    if !cm.ids.lock().is_live(id) {
        return 0;
    }
    // SAFETY: a live id of ours.
    unsafe { (*id).route.addr.__bindgen_anon_2.dst_sin.sin_port }
}

/// `rdma_set_option` (the kernel's `ucma_set_option`, which librdmacm passes the call
/// to, decides the errnos): at level `RDMA_OPTION_ID`, `REUSEADDR` and `AFONLY` (an
/// `int`; accepted: the emulator's ports are free as soon as their id is destroyed,
/// and it has IPv4 only), `TOS` (a `u8`: the traffic class of the id's path) and
/// `ACK_TIMEOUT` (a `u8`: the local ACK timeout the id's QP gets, RC ids only); a
/// value of the wrong size is EINVAL, a null value EFAULT. `RDMA_OPTION_IB_PATH`
/// (path records from an SA) is EOPNOTSUPP; other levels and names ENOSYS, as the
/// kernel answers them.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut r::rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    let (level, optname) = (level as u32, optname as u32);
    if level == r::RDMA_OPTION_IB && optname == r::RDMA_OPTION_IB_PATH {
        return unsupported("rdma_set_option RDMA_OPTION_IB_PATH (no SA path records)");
    }
    let size = match (level, optname) {
        (r::RDMA_OPTION_ID, r::RDMA_OPTION_ID_REUSEADDR | r::RDMA_OPTION_ID_AFONLY) => {
            std::mem::size_of::<c_int>()
        }
        (r::RDMA_OPTION_ID, r::RDMA_OPTION_ID_TOS | r::RDMA_OPTION_ID_ACK_TIMEOUT) => 1,
        _ => return err(libc::ENOSYS),
    };
    if optlen != size {
        return err(libc::EINVAL);
    }
    if optval.is_null() {
        return err(libc::EFAULT);
    }
    // SAFETY: optlen (checked) bytes of the caller's.
    let byte = unsafe { *optval.cast::<u8>() };
    match optname {
        r::RDMA_OPTION_ID_TOS => status(cm.cm.set_tos(o.id, byte)),
        r::RDMA_OPTION_ID_ACK_TIMEOUT => status(cm.cm.set_ack_timeout(o.id, byte)),
        _ => 0,
    }
}

/// `rdma_init_qp_attr` (manual 4.2.23): for `qp_attr->qp_state`, the attributes and
/// mask that move a QP the program drives itself for this id's connection, as the
/// kernel gives them (`EmuCm::init_qp_attr`: INIT, RTR and RTS of a connection, the
/// Q_Key of a UD id). The whole of `*qp_attr` is written, as librdmacm copies the
/// kernel's answer over it. EINVAL for a state the id cannot give (before the peer
/// answered, after the connection ended, on a listening or unbound id).
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut r::rdma_cm_id,
    qp_attr: *mut sys::ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    if qp_attr.is_null() || qp_attr_mask.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let Ok(state) = QpState::try_from(unsafe { (*qp_attr).qp_state }) else {
        return err(libc::EINVAL);
    };
    match cm.cm.init_qp_attr(o.id, state) {
        Ok((a, mask)) => {
            // SAFETY: the caller's out parameters.
            unsafe {
                *qp_attr = convert::qp_attr_to_c(&a);
                *qp_attr_mask = mask.bits() as c_int;
            }
            0
        }
        Err(e) => {
            fail(&e);
            -1
        }
    }
}

/// `rdma_join_multicast` (manual 4.2.27): joins the IPv4 group `addr` (the id's UD
/// QP, if it has one now, is attached to it); MULTICAST_JOIN or MULTICAST_ERROR
/// follows, with `context` in `param.ud.private_data`.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut r::rdma_cm_id,
    addr: *mut r::sockaddr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { join(id, addr, context) }
}

/// `rdma_join_multicast_ex`: as `rdma_join_multicast`, with join flags. The address
/// and the flags are required (EINVAL without), other mask bits are ENOTSUP, as in
/// librdmacm. On RoCE a send-only full member is attached like a full member (there
/// is no SA to tell the difference to; librdmacm attaches the QP either way).
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut r::rdma_cm_id,
    attr: *mut r::rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    if attr.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the caller's attribute struct.
    let a = unsafe { &*attr };
    if a.comp_mask >= r::RDMA_CM_JOIN_MC_ATTR_RESERVED {
        return err(libc::ENOTSUP);
    }
    if a.comp_mask & r::RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
        || a.comp_mask & r::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
        || a.join_flags >= r::RDMA_MC_JOIN_FLAG_RESERVED
    {
        return err(libc::EINVAL);
    }
    // SAFETY: as above.
    unsafe { join(id, a.addr, context) }
}

unsafe fn join(id: *mut r::rdma_cm_id, addr: *mut r::sockaddr, context: *mut c_void) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    // SAFETY: the caller's sockaddr.
    let a = match unsafe { sockaddr_arg(addr) } {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    // Known before the CM's event can be read (it may be queued inside the call);
    // taken back if the CM refuses (a group joined twice is its EADDRINUSE).
    o.mcast.push((a, context as usize));
    if status(cm.cm.join_multicast(o.id, a)) != 0 {
        o.mcast.pop();
        return -1;
    }
    complete(cm, id)
}

/// `rdma_leave_multicast` (manual 4.2.28): leaves `addr` (detaching the id's QP);
/// EADDRNOTAVAIL for a group the id did not join.
#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(
    id: *mut r::rdma_cm_id,
    addr: *mut r::sockaddr,
) -> c_int {
    let cm = cm_or!(-1);
    let o = id_or!(cm, id, -1);
    // SAFETY: the caller's sockaddr.
    let a = match unsafe { sockaddr_arg(addr) } {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    let r = status(cm.cm.leave_multicast(o.id, a));
    if r == 0 {
        o.mcast.retain(|(g, _)| *g != a);
    }
    r
}

/// Exports the emulator does not implement: each says so on stderr and fails with
/// -1 and `errno` (the `int`, `ssize_t` and `off_t` calls alike; the arguments are
/// not read).
macro_rules! unsupported_calls {
    ($errno:expr, $what:literal: $($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported (", $what, ").")]
        #[no_mangle]
        pub extern "C" fn $name() -> isize {
            eprintln!(
                "rdma-emu librdmacm: {} is not supported by the emulator ({})",
                stringify!($name),
                $what
            );
            set_errno($errno);
            -1
        }
    )*};
}

unsupported_calls!(libc::EOPNOTSUPP, "not in the emulator's CM":
    rdma_notify);
unsupported_calls!(libc::EOPNOTSUPP, "SRQs through the CM; use ibv_create_srq":
    rdma_create_srq, rdma_create_srq_ex, rdma_destroy_srq);
unsupported_calls!(libc::EOPNOTSUPP, "ECE":
    rdma_get_remote_ece, rdma_reject_ece, rdma_set_local_ece);
