//! `HwCm`: the connection manager API ([`verbs_api::ConnectionManager`]) over
//! librdmacm, for the device of an [`HwDevice`].
//!
//! The QP of an id lives in the `HwDevice`'s own context (so every `Device` verb works
//! on it as on any other QP), not in the context librdmacm opened: the ids are used the
//! way librdmacm documents for QPs it did not create (manual 4.2.9, 4.2.12: `qp_num` in
//! the connection parameters). The attributes of each transition come from
//! `rdma_init_qp_attr`; the active side takes the `CONNECT_RESPONSE` that librdmacm
//! reports for such ids, moves the QP to RTR and RTS, calls `rdma_establish` and hands
//! the application `ESTABLISHED`, as it gets for ids with a CM-made QP; the passive side
//! moves its QP before `rdma_accept`; `rdma_disconnect` is followed by the QP's move to
//! ERROR. Events are read and acknowledged at once (private data is copied out), so
//! `rdma_destroy_id` never waits for an unacknowledged event.
//!
//! An `HwCm` serves one device: an id that librdmacm binds to another (by its address)
//! is ENODEV at `create_qp`. A multicast join goes through `rdma_join_multicast`; on
//! its MULTICAST_JOIN the id's UD QP is attached to the group (librdmacm's own step for
//! the QPs it makes), and detached before `rdma_leave_multicast`. Ids take IPv4 and
//! IPv6 addresses; multicast groups are IPv4 (an IPv6 group is `Unsupported`).
//!
//! # Safety argument
//!
//! This module calls librdmacm. Every `rdma_event_channel` and `rdma_cm_id` pointer is
//! stored only after librdmacm returned it non-null / with success, is owned by exactly
//! one table entry, and is freed once (`rdma_destroy_id` when the entry is removed,
//! `rdma_destroy_event_channel` likewise, the rest in `Drop`, ids before channels, which
//! librdmacm requires). All calls on them are made while the tables' lock is held, so no
//! pointer is used after its free. Ids born from a `CONNECT_REQUEST` are entered into the
//! table before the event is acknowledged. An event is read only after its channel's fd
//! is readable (the fd is non-blocking, so a race only gives EAGAIN), its fields and the
//! private data it points to are copied before `rdma_ack_cm_event`, and the `param`
//! union is read through the member the port space selects (`ud` for `RDMA_PS_UDP`,
//! `conn` otherwise). Socket addresses and connection parameters passed in are built on
//! the stack, fully initialised, and outlive the call; private data pointers point into
//! slices that outlive the call and librdmacm copies them.
#![allow(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdma_sys as ffi;
use verbs_api::{
    CmChannelId, CmEvent, CmEventParam, CmEventType, CmId, CmIdInfo, ConnParam, ConnectionManager,
    Device, Endpoint, Error, Gid, PortSpace, QpAttr, QpAttrMask, QpInitAttr, QpParams, QpState,
    QpType, Result,
};

use verbs_ffi::cm;
use verbs_ffi::{convert, sys as c};

use crate::layout::{from_sys, sys_mut};
use crate::{sys, HwDevice};

fn errno_error(context: &'static str) -> Error {
    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    Error::from_errno(if e == 0 { libc::EIO } else { e }, context)
}

fn check(rc: c_int, context: &'static str) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(errno_error(context))
    }
}

struct Chan {
    ptr: *mut ffi::rdma_event_channel,
    pending: VecDeque<CmEvent>,
}

struct IdRec {
    ptr: *mut ffi::rdma_cm_id,
    ch: u32,
    ps: PortSpace,
    qp: Option<(u32, QpType)>,
    /// The multicast groups joined, with the QP HwCm attached to each (librdmacm
    /// attaches only QPs it made; ours live in the HwDevice's context).
    mcast: Vec<(Ipv4Addr, Option<(u32, u16)>)>,
    /// A REP could not bring the QP up and the consumer got CONNECT_ERROR; as
    /// librdmacm (`connect_error`), a later REJECTED or DISCONNECTED is not reported.
    connect_error: bool,
}

#[derive(Default)]
struct Tables {
    chans: HashMap<u32, Chan>,
    ids: HashMap<u32, IdRec>,
    by_ptr: HashMap<usize, u32>,
    next: u32,
}

// SAFETY: the raw pointers are librdmacm objects, which librdmacm lets any thread use;
// they are only touched under the `Mutex` (see the module's safety argument).
unsafe impl Send for Tables {}

/// The connection manager over librdmacm for one [`HwDevice`].
pub struct HwCm {
    dev: Arc<HwDevice>,
    t: Mutex<Tables>,
}

impl std::fmt::Debug for HwCm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwCm")
            .field("device", &self.dev.name())
            .finish()
    }
}

const NO_ID: Error = Error::InvalidArgument("no such CM id");
const NO_CH: Error = Error::InvalidArgument("no such event channel");

impl HwCm {
    /// The CM of `dev`.
    pub fn new(dev: Arc<HwDevice>) -> HwCm {
        HwCm {
            dev,
            t: Mutex::new(Tables {
                next: 1,
                ..Tables::default()
            }),
        }
    }

    fn id_ptr(t: &Tables, id: CmId) -> Result<*mut ffi::rdma_cm_id> {
        t.ids.get(&id.0).map(|r| r.ptr).ok_or(NO_ID)
    }

    /// The attributes librdmacm gives for moving the id's QP to `state`.
    fn init_attr(ptr: *mut ffi::rdma_cm_id, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let mut attr = c::ibv_qp_attr {
            qp_state: state.as_u32(),
            ..Default::default()
        };
        let mut mask: c_int = 0;
        // SAFETY: a live id; both out-pointers point at locals.
        check(
            unsafe { ffi::rdma_init_qp_attr(ptr, sys_mut(&mut attr), &mut mask) },
            "rdma_init_qp_attr",
        )?;
        Ok((
            convert::qp_attr_from_query(&attr),
            QpAttrMask::from_bits_truncate(mask as u32),
        ))
    }

    fn modify_to(&self, ptr: *mut ffi::rdma_cm_id, qpn: u32, state: QpState) -> Result<()> {
        let (attr, mask) = Self::init_attr(ptr, state)?;
        self.dev.modify_qp(qpn, &attr, mask)
    }

    fn to_error(&self, qpn: u32) {
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = self.dev.modify_qp(qpn, &attr, QpAttrMask::STATE);
    }

    /// `p` for `rdma_connect` / `rdma_accept`, naming QP `qpn`. How much private data
    /// the call takes is the kernel's to answer (EINVAL above
    /// `verbs_api::PortSpace::max_private_data`; a failed accept also rejects the
    /// request), so that the conformance cases check that table against it; here only
    /// the C struct's `u8` length is EINVAL when exceeded.
    fn conn_param_c(p: &ConnParam, qpn: u32) -> Result<c::rdma::rdma_conn_param> {
        Ok(c::rdma::rdma_conn_param {
            qp_num: qpn,
            ..cm::conn_param_to_c(p)?
        })
    }

    /// Reads one event of channel `ch` (its fd is readable), translated and acknowledged.
    fn read_event(&self, t: &mut Tables, ch: u32) -> Result<Option<CmEvent>> {
        let chan = t.chans.get(&ch).ok_or(NO_CH)?.ptr;
        let mut ev: *mut ffi::rdma_cm_event = ptr::null_mut();
        // SAFETY: a live channel whose fd is non-blocking; `ev` is a local out-pointer.
        if unsafe { ffi::rdma_get_cm_event(chan, &mut ev) } != 0 {
            let e = errno_error("rdma_get_cm_event");
            return if e.errno() == libc::EAGAIN {
                Ok(None)
            } else {
                Err(e)
            };
        }
        // SAFETY: librdmacm returned a valid event, live until rdma_ack_cm_event.
        let e = unsafe { &*ev };
        // An event type a newer librdmacm added is reported as a failure to connect.
        let kind = cm::cm_event_type_from_c(e.event).unwrap_or(CmEventType::ConnectError);
        let listen_id = t.by_ptr.get(&(e.listen_id as usize)).copied();
        let id = match (kind, listen_id) {
            (CmEventType::ConnectRequest, Some(l)) => {
                let ps = t.ids[&l].ps;
                let n = t.next;
                t.next += 1;
                t.ids.insert(
                    n,
                    IdRec {
                        ptr: e.id,
                        ch,
                        ps,
                        qp: None,
                        mcast: Vec::new(),
                        connect_error: false,
                    },
                );
                t.by_ptr.insert(e.id as usize, n);
                Some(n)
            }
            _ => t.by_ptr.get(&(e.id as usize)).copied(),
        };
        let ps = id.and_then(|i| t.ids.get(&i)).map(|r| r.ps);
        let with_data = matches!(
            kind,
            CmEventType::ConnectRequest
                | CmEventType::ConnectResponse
                | CmEventType::Established
                | CmEventType::Rejected
                | CmEventType::Unreachable
        );
        let mcast = matches!(
            kind,
            CmEventType::MulticastJoin | CmEventType::MulticastError
        );
        let param = if mcast {
            // SAFETY: librdmacm fills `ud` for multicast events; its private_data is
            // the join's context, here the group's IPv4 address (never dereferenced).
            let u = unsafe { e.param.ud };
            let group = Ipv4Addr::from(u.private_data as usize as u32);
            let mut ud = cm::ud_param_from_c(from_sys(&u), &[]);
            if kind == CmEventType::MulticastError {
                // As EmuCm: the error names its group in the address vector.
                ud.ah_attr = QpParams::default().ah_attr(Gid::from_ipv4(group));
            }
            CmEventParam::Ud(ud)
        } else if !with_data {
            CmEventParam::None
        } else if ps.is_some_and(PortSpace::is_ud) {
            // SAFETY: the `ud` member is the one librdmacm fills for the UD port spaces
            // (RDMA_PS_UDP, RDMA_PS_IPOIB: their ids' QPs are UD).
            let u = unsafe { e.param.ud };
            // SAFETY: librdmacm's private data, live until the event is acknowledged.
            let data = unsafe { cm::private_data(u.private_data, u.private_data_len) };
            CmEventParam::Ud(cm::ud_param_from_c(from_sys(&u), data))
        } else {
            // SAFETY: the `conn` member, for connected port spaces.
            let c = unsafe { e.param.conn };
            // SAFETY: as above.
            let data = unsafe { cm::private_data(c.private_data, c.private_data_len) };
            CmEventParam::Conn(cm::conn_param_from_c(from_sys(&c), data))
        };
        let status = e.status;
        // SAFETY: acknowledges the event read above, once; nothing of it is used after.
        unsafe { ffi::rdma_ack_cm_event(ev) };
        let Some(id) = id else { return Ok(None) };
        let mut out = CmEvent {
            id: CmId(id),
            listen_id: if kind == CmEventType::ConnectRequest {
                listen_id.map(CmId)
            } else {
                None
            },
            event: kind,
            status,
            param,
        };
        let rec = &t.ids[&id];
        match (kind, rec.qp) {
            // Ours to finish: RTR, RTS, RTU (manual 4.2.10), then ESTABLISHED.
            (CmEventType::ConnectResponse, Some((qpn, _))) => {
                let ptr = rec.ptr;
                let r = self
                    .modify_to(ptr, qpn, QpState::Rtr)
                    .and_then(|()| self.modify_to(ptr, qpn, QpState::Rts))
                    // SAFETY: a live id.
                    .and_then(|()| check(unsafe { ffi::rdma_establish(ptr) }, "rdma_establish"));
                match r {
                    Ok(()) => out.event = CmEventType::Established,
                    Err(err) => {
                        // librdmacm's ucma_process_conn_resp: the QP to ERROR, no RTU;
                        // destroying the id sends the REJ.
                        self.to_error(qpn);
                        t.ids.get_mut(&id).expect("live").connect_error = true;
                        out.event = CmEventType::ConnectError;
                        out.status = -err.errno();
                    }
                }
            }
            (CmEventType::Rejected | CmEventType::Disconnected, _) if rec.connect_error => {
                return Ok(None);
            }
            (CmEventType::Disconnected, Some((qpn, _))) => self.to_error(qpn),
            // librdmacm's own step for the QPs it makes (ibv_attach_mcast after the
            // join, manual 4.2.27), done here for ours.
            (CmEventType::MulticastJoin, Some((qpn, QpType::Ud))) => {
                let CmEventParam::Ud(u) = &out.param else {
                    unreachable!("multicast events carry UD parameters")
                };
                let (gid, lid) = (u.ah_attr.grh.dgid, u.ah_attr.dlid);
                match self.dev.attach_mcast(qpn, &gid, lid) {
                    Ok(()) => {
                        let rec = t.ids.get_mut(&id).expect("live");
                        if let Some(m) = rec.mcast.iter_mut().find(|m| gid.to_ipv4() == Some(m.0)) {
                            m.1 = Some((qpn, lid));
                        }
                    }
                    Err(err) => {
                        out.event = CmEventType::MulticastError;
                        out.status = -err.errno();
                    }
                }
            }
            _ => {}
        }
        Ok(Some(out))
    }

    fn wait_event(
        &self,
        ch: u32,
        want: &dyn Fn(&CmEvent) -> bool,
        timeout: Option<Duration>,
    ) -> Result<CmEvent> {
        let deadline = sys::deadline(timeout);
        loop {
            let fd = {
                let mut t = self.t.lock();
                let c = t.chans.get_mut(&ch).ok_or(NO_CH)?;
                if let Some(i) = c.pending.iter().position(want) {
                    return Ok(c.pending.remove(i).expect("found"));
                }
                // SAFETY: a live channel.
                unsafe { (*c.ptr).fd }
            };
            if !sys::wait_readable(fd, deadline)? {
                return Err(Error::TimedOut);
            }
            let mut t = self.t.lock();
            if let Some(ev) = self.read_event(&mut t, ch)? {
                if want(&ev) {
                    return Ok(ev);
                }
                if let Some(c) = t.chans.get_mut(&ch) {
                    c.pending.push_back(ev);
                }
            }
        }
    }
}

impl Drop for HwCm {
    fn drop(&mut self) {
        let t = self.t.get_mut();
        for (_, r) in t.ids.drain() {
            // SAFETY: each id is destroyed once, before the channels.
            unsafe { ffi::rdma_destroy_id(r.ptr) };
        }
        for (_, c) in t.chans.drain() {
            // SAFETY: each channel once, after its ids.
            unsafe { ffi::rdma_destroy_event_channel(c.ptr) };
        }
    }
}

impl ConnectionManager for HwCm {
    fn create_event_channel(&self) -> Result<CmChannelId> {
        // SAFETY: no arguments; the result is checked for null.
        let p = unsafe { ffi::rdma_create_event_channel() };
        if p.is_null() {
            return Err(errno_error("rdma_create_event_channel"));
        }
        // SAFETY: a live channel's fd.
        let fd = unsafe { (*p).fd };
        // Non-blocking: events are read only after poll says so (see the safety note).
        // SAFETY: fcntl on an fd librdmacm opened.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        let mut t = self.t.lock();
        let n = t.next;
        t.next += 1;
        t.chans.insert(
            n,
            Chan {
                ptr: p,
                pending: VecDeque::new(),
            },
        );
        Ok(CmChannelId(n))
    }

    fn destroy_event_channel(&self, ch: CmChannelId) -> Result<()> {
        let mut t = self.t.lock();
        if t.ids.values().any(|r| r.ch == ch.0) {
            return Err(Error::Busy("CM ids report to the channel"));
        }
        let c = t.chans.remove(&ch.0).ok_or(NO_CH)?;
        // SAFETY: removed from the table: freed once.
        unsafe { ffi::rdma_destroy_event_channel(c.ptr) };
        Ok(())
    }

    fn event_channel_fd(&self, ch: CmChannelId) -> Result<i32> {
        let t = self.t.lock();
        // SAFETY: a live channel.
        Ok(unsafe { (*t.chans.get(&ch.0).ok_or(NO_CH)?.ptr).fd })
    }

    fn get_cm_event(&self, ch: CmChannelId, timeout: Option<Duration>) -> Result<CmEvent> {
        self.wait_event(ch.0, &|_| true, timeout)
    }

    fn create_id(&self, ch: CmChannelId, ps: PortSpace) -> Result<CmId> {
        let mut t = self.t.lock();
        let chan = t.chans.get(&ch.0).ok_or(NO_CH)?.ptr;
        let mut id: *mut ffi::rdma_cm_id = ptr::null_mut();
        // SAFETY: a live channel, a local out-pointer, no context.
        check(
            unsafe { ffi::rdma_create_id(chan, &mut id, ptr::null_mut(), cm::port_space_to_c(ps)) },
            "rdma_create_id",
        )?;
        let n = t.next;
        t.next += 1;
        t.ids.insert(
            n,
            IdRec {
                ptr: id,
                ch: ch.0,
                ps,
                qp: None,
                mcast: Vec::new(),
                connect_error: false,
            },
        );
        t.by_ptr.insert(id as usize, n);
        Ok(CmId(n))
    }

    fn destroy_id(&self, id: CmId) -> Result<()> {
        let mut t = self.t.lock();
        let r = t.ids.get(&id.0).ok_or(NO_ID)?;
        if r.qp.is_some() {
            return Err(Error::Busy("destroy the id's QP first"));
        }
        let r = t.ids.remove(&id.0).expect("checked");
        t.by_ptr.remove(&(r.ptr as usize));
        for c in t.chans.values_mut() {
            c.pending.retain(|e| e.id != id);
        }
        // SAFETY: removed from the tables: destroyed once; its events were acknowledged.
        check(unsafe { ffi::rdma_destroy_id(r.ptr) }, "rdma_destroy_id")
    }

    fn bind_addr(&self, id: CmId, addr: SocketAddr) -> Result<()> {
        let t = self.t.lock();
        let (mut sa, _) = cm::sockaddr_to_c(addr);
        // SAFETY: a live id and a sockaddr on the stack.
        check(
            unsafe { ffi::rdma_bind_addr(Self::id_ptr(&t, id)?, ptr::from_mut(&mut sa).cast()) },
            "rdma_bind_addr",
        )
    }

    fn resolve_addr(
        &self,
        id: CmId,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let t = self.t.lock();
        let mut s = src.map(|a| cm::sockaddr_to_c(a).0);
        let (mut d, _) = cm::sockaddr_to_c(dst);
        let sp = s
            .as_mut()
            .map_or(ptr::null_mut(), |s| ptr::from_mut(s).cast());
        let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: a live id; both sockaddrs on the stack (or null for no source).
        check(
            unsafe {
                ffi::rdma_resolve_addr(Self::id_ptr(&t, id)?, sp, ptr::from_mut(&mut d).cast(), ms)
            },
            "rdma_resolve_addr",
        )
    }

    fn resolve_route(&self, id: CmId, timeout: Duration) -> Result<()> {
        let t = self.t.lock();
        let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: a live id.
        check(
            unsafe { ffi::rdma_resolve_route(Self::id_ptr(&t, id)?, ms) },
            "rdma_resolve_route",
        )
    }

    fn listen(&self, id: CmId, backlog: u32) -> Result<()> {
        let t = self.t.lock();
        // SAFETY: a live id.
        check(
            unsafe {
                ffi::rdma_listen(
                    Self::id_ptr(&t, id)?,
                    c_int::try_from(backlog).unwrap_or(c_int::MAX),
                )
            },
            "rdma_listen",
        )
    }

    fn get_request(&self, listen: CmId, timeout: Option<Duration>) -> Result<CmEvent> {
        let ch = self.t.lock().ids.get(&listen.0).ok_or(NO_ID)?.ch;
        self.wait_event(
            ch,
            &|e| e.event == CmEventType::ConnectRequest && e.listen_id == Some(listen),
            timeout,
        )
    }

    fn create_qp(&self, id: CmId, init: &QpInitAttr) -> Result<u32> {
        let mut t = self.t.lock();
        let r = t.ids.get(&id.0).ok_or(NO_ID)?;
        if r.qp.is_some() {
            return Err(Error::InvalidArgument("the id has a QP already"));
        }
        if r.ps.qp_type() != Some(init.qp_type) {
            return Err(Error::InvalidArgument(
                "the QP type is not the port space's",
            ));
        }
        let ptr = r.ptr;
        // SAFETY: a live id; `verbs` is null until it is bound to a device.
        let verbs = unsafe { (*ptr).verbs };
        if verbs.is_null() {
            return Err(Error::NoDevice("the id is not bound to a device".into()));
        }
        // SAFETY: a live context of librdmacm, and its device.
        let name = unsafe { std::ffi::CStr::from_ptr((*(*verbs).device).name.as_ptr()) };
        if name.to_bytes() != self.dev.name().as_bytes() {
            return Err(Error::NoDevice(name.to_string_lossy().into_owned()));
        }
        let qpn = self.dev.create_qp(init)?;
        let r = (|| {
            self.modify_to(ptr, qpn, QpState::Init)?;
            if init.qp_type == QpType::Ud {
                let p = QpParams::default();
                for (attr, mask) in [
                    p.rtr(QpType::Ud, &Endpoint::default()),
                    p.rts(QpType::Ud, 0),
                ] {
                    self.dev.modify_qp(qpn, &attr, mask)?;
                }
            }
            Ok(())
        })();
        if let Err(e) = r {
            let _ = self.dev.destroy_qp(qpn);
            return Err(e);
        }
        t.ids.get_mut(&id.0).expect("checked").qp = Some((qpn, init.qp_type));
        Ok(qpn)
    }

    fn destroy_qp(&self, id: CmId) -> Result<()> {
        let mut t = self.t.lock();
        let r = t.ids.get_mut(&id.0).ok_or(NO_ID)?;
        let (qpn, _) = r.qp.ok_or(Error::InvalidArgument("the id has no QP"))?;
        self.dev.destroy_qp(qpn)?;
        r.qp = None;
        Ok(())
    }

    fn connect(&self, id: CmId, param: &ConnParam) -> Result<()> {
        let t = self.t.lock();
        let r = t.ids.get(&id.0).ok_or(NO_ID)?;
        // librdmacm's rdma_connect reads the id's device (its `cma_dev`) without checking
        // it: on an id whose address was never resolved it dereferences null (seen on
        // rxe). Refuse it as the kernel would refuse the state: EINVAL.
        // SAFETY: a live id; `verbs` is null until it is bound to a device.
        if unsafe { (*r.ptr).verbs }.is_null() {
            return Err(Error::InvalidArgument(
                "the id is not bound to a device: resolve its address and route first",
            ));
        }
        let qpn = r.qp.map_or(param.qp_num, |q| q.0);
        let mut c = Self::conn_param_c(param, qpn)?;
        // SAFETY: a live id; `c` and the private data it points to outlive the call.
        check(
            unsafe { ffi::rdma_connect(r.ptr, sys_mut(&mut c)) },
            "rdma_connect",
        )
    }

    fn establish(&self, id: CmId) -> Result<()> {
        let t = self.t.lock();
        // SAFETY: a live id.
        check(
            unsafe { ffi::rdma_establish(Self::id_ptr(&t, id)?) },
            "rdma_establish",
        )
    }

    fn accept(&self, id: CmId, param: &ConnParam) -> Result<()> {
        let t = self.t.lock();
        let r = t.ids.get(&id.0).ok_or(NO_ID)?;
        if let Some((qpn, QpType::Rc | QpType::Uc)) = r.qp {
            self.modify_to(r.ptr, qpn, QpState::Rtr)?;
            self.modify_to(r.ptr, qpn, QpState::Rts)?;
        }
        let qpn = r.qp.map_or(param.qp_num, |q| q.0);
        let mut c = Self::conn_param_c(param, qpn)?;
        // SAFETY: as in connect.
        let done = check(
            unsafe { ffi::rdma_accept(r.ptr, sys_mut(&mut c)) },
            "rdma_accept",
        );
        if let (Err(_), Some((qpn, _))) = (&done, r.qp) {
            // librdmacm's rdma_accept moves the id's QP to ERROR when the kernel refuses
            // the accept (which rejects the request); this QP is ours, not `id->qp`.
            self.to_error(qpn);
        }
        done
    }

    fn reject(&self, id: CmId, private_data: &[u8]) -> Result<()> {
        let t = self.t.lock();
        let r = t.ids.get(&id.0).ok_or(NO_ID)?;
        // The kernel refuses more than the REJ or SIDR REP carries (EINVAL); the length
        // is a u8.
        let len = u8::try_from(private_data.len())
            .map_err(|_| Error::InvalidArgument("private data too long"))?;
        // SAFETY: a live id; the slice outlives the call.
        check(
            unsafe { ffi::rdma_reject(r.ptr, private_data.as_ptr().cast(), len) },
            "rdma_reject",
        )
    }

    fn disconnect(&self, id: CmId) -> Result<()> {
        let t = self.t.lock();
        let r = t.ids.get(&id.0).ok_or(NO_ID)?;
        // SAFETY: a live id.
        let rc = unsafe { ffi::rdma_disconnect(r.ptr) };
        if let Some((qpn, _)) = r.qp {
            self.to_error(qpn);
        }
        check(rc, "rdma_disconnect")
    }

    fn join_multicast(&self, id: CmId, addr: SocketAddr) -> Result<()> {
        let mut t = self.t.lock();
        let (mut sa, _) = cm::sockaddr_to_c(addr);
        let group = *match &addr {
            SocketAddr::V4(a) if a.ip().is_multicast() => a.ip(),
            // Groups are kept by their IPv4 address (the join's context and the key of
            // the attach): IPv6 groups are not supported yet (README).
            SocketAddr::V6(a) if a.ip().is_multicast() => {
                return Err(Error::Unsupported("HwCm joins IPv4 multicast groups only"))
            }
            // The kernel's RoCE join maps any address to an MGID; a unicast one can
            // only fail at the attach. Refused here, as EmuCm does (EINVAL).
            _ => return Err(Error::InvalidArgument("not a multicast address")),
        };
        let r = t.ids.get_mut(&id.0).ok_or(NO_ID)?;
        if r.mcast.iter().any(|m| m.0 == group) {
            return Err(Error::from_errno(
                libc::EADDRINUSE,
                "the id joined this group already",
            ));
        }
        // SAFETY: a live id, a sockaddr on the stack; the context is the group's
        // address as an integer, which librdmacm only hands back.
        check(
            unsafe {
                ffi::rdma_join_multicast(
                    r.ptr,
                    ptr::from_mut(&mut sa).cast(),
                    u32::from(group) as usize as *mut c_void,
                )
            },
            "rdma_join_multicast",
        )?;
        r.mcast.push((group, None));
        Ok(())
    }

    fn leave_multicast(&self, id: CmId, addr: SocketAddr) -> Result<()> {
        let mut t = self.t.lock();
        let (mut sa, _) = cm::sockaddr_to_c(addr);
        // librdmacm's leave waits until every event of the group it reported is
        // acknowledged: the channel's queued events are read (and acknowledged) first,
        // kept for get_cm_event, so it cannot wait on one nobody will read.
        let ch = t.ids.get(&id.0).ok_or(NO_ID)?.ch;
        while let Some(ev) = self.read_event(&mut t, ch)? {
            if let Some(c) = t.chans.get_mut(&ch) {
                c.pending.push_back(ev);
            }
        }
        let r = t.ids.get_mut(&id.0).ok_or(NO_ID)?;
        let group = match addr {
            SocketAddr::V4(a) => Some(*a.ip()),
            SocketAddr::V6(_) => None, // join_multicast takes IPv4 groups only
        };
        let Some(at) = r.mcast.iter().position(|m| Some(m.0) == group) else {
            return Err(Error::from_errno(
                libc::EADDRNOTAVAIL,
                "the id did not join this group",
            ));
        };
        // librdmacm detaches the QPs it made before leaving; ours is detached here.
        if let (group, Some((qpn, lid))) = r.mcast[at] {
            self.dev.detach_mcast(qpn, &Gid::from_ipv4(group), lid)?;
        }
        r.mcast.remove(at);
        // SAFETY: a live id and a sockaddr on the stack.
        check(
            unsafe { ffi::rdma_leave_multicast(r.ptr, ptr::from_mut(&mut sa).cast()) },
            "rdma_leave_multicast",
        )
    }

    fn id_info(&self, id: CmId) -> Result<CmIdInfo> {
        let t = self.t.lock();
        let r = t.ids.get(&id.0).ok_or(NO_ID)?;
        // SAFETY: a live id; the route's address unions are whole sockaddr_storages
        // (sockaddr_from_ptr reads the family's struct, no more), and the IB address
        // member is the GIDs librdmacm fills after resolution.
        let (local, peer, sgid, dgid, device, port_num) = unsafe {
            let i = &*r.ptr;
            let a = &i.route.addr;
            let device = (!i.verbs.is_null()).then(|| {
                std::ffi::CStr::from_ptr((*(*i.verbs).device).name.as_ptr())
                    .to_string_lossy()
                    .into_owned()
            });
            (
                // An address not set yet has family 0: none.
                cm::sockaddr_from_ptr(ptr::from_ref(&a.src_addr_union).cast())
                    .ok()
                    .flatten(),
                cm::sockaddr_from_ptr(ptr::from_ref(&a.dst_addr_union).cast())
                    .ok()
                    .flatten(),
                convert::gid_from_c(from_sys(&a.addr.ibaddr.sgid)),
                convert::gid_from_c(from_sys(&a.addr.ibaddr.dgid)),
                device,
                i.port_num,
            )
        };
        Ok(CmIdInfo {
            ps: r.ps,
            device,
            port_num,
            qp_num: r.qp.map(|q| q.0),
            local,
            peer,
            sgid,
            dgid,
        })
    }

    fn device(&self, id: CmId) -> Result<Arc<dyn Device>> {
        let t = self.t.lock();
        let r = t.ids.get(&id.0).ok_or(NO_ID)?;
        // SAFETY: a live id.
        if unsafe { (*r.ptr).verbs }.is_null() {
            return Err(Error::NoDevice("the id is not bound to a device".into()));
        }
        Ok(self.dev.clone())
    }
}
