//! `librdmacm.so.1` over the emulator's connection manager
//! ([`emu_cm::EmuCm`]): `rping`, `udaddy`, `rdma_server`/`rdma_client` and
//! perftest's `-R` run unmodified.
//!
//! The library file is the one that holds libibverbs (`build-so.sh` installs it under
//! both names, and the dynamic loader maps one file once), so a CM id's `verbs`, `qp`,
//! `pd` and CQs are the very objects the program uses through the `ibv_*` calls.
//!
//! One [`EmuCm`] serves the process: made at the first `rdma_*` call over every
//! configured device, each opened once as a context (`rdma_get_devices`). The C
//! objects follow the libibverbs pattern ([`crate::objects`]): a `#[repr(C)]` struct
//! whose first field is the librdmacm struct the program sees.
//!
//! - `calls`: the exported `rdma_*` functions.
//! - `addrinfo`: `rdma_getaddrinfo` / `rdma_freeaddrinfo`.
//!
//! # Safety argument
//!
//! As for the verbs (`crate::verbs`): every pointer argument is, by the librdmacm
//! contract (its man pages), null (refused with EINVAL) or valid for the documented
//! access: ids, channels, events and address lists this library returned and has not
//! freed, caller-owned attribute structs and `sockaddr`s of the documented type
//! (`sockaddr_in` for AF_INET, `sockaddr_in6` for AF_INET6). The fields of an id the program
//! reads (`verbs`, `qp`, `route.addr`, ...) are written only by this library, while
//! the calls the contract orders before the program reads them run (the same race
//! freedom rdma-core's librdmacm relies on).

#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

mod addrinfo;
mod calls;

pub use addrinfo::*;
pub use calls::*;

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, OnceLock};

use emu_cm::{CmConfig, EmuCm};
use parking_lot::{Condvar, Mutex};
use verbs_api::{CmChannelId, CmEventParam, CmId, ConnectionManager, Device, Error};
use verbs_ffi::cm;

use crate::objects::Context;
use crate::sys;
use crate::sys::rdma as r;
use crate::verbs::{ibv_alloc_pd, ibv_open_device, set_errno};

/// The connection manager of the process and what the C side keeps beside it.
pub(crate) struct Cm {
    pub(crate) cm: EmuCm,
    /// One context per device, as `rdma_get_devices` lists them (names alike).
    pub(crate) contexts: Vec<(String, usize)>,
    /// A PD per context for ids given none (librdmacm's per-device PD).
    pub(crate) pds: Mutex<HashMap<usize, usize>>,
    /// CM id -> its `IdObj`.
    pub(crate) ids: Mutex<IdTable>,
    /// Events handed to the program and not acked yet, by the id each counts against
    /// (librdmacm's `events_completed` against the kernel's `events_reported`: a
    /// CONNECT_REQUEST counts against the listening id). `rdma_destroy_id` and
    /// `rdma_migrate_id` wait until the id has none.
    pub(crate) unacked: Mutex<HashMap<u32, u32>>,
    /// Signalled at each ack.
    pub(crate) acked: Condvar,
}

/// The live ids: by CM id, and the set of their pointers, so a pointer the program
/// passes is checked before it is read (a stale or freed `rdma_cm_id *` gets EINVAL,
/// not a crash; perftest 4.5-0.17's connection retry passes freed ones).
#[derive(Default)]
pub(crate) struct IdTable {
    by_cm: HashMap<u32, usize>,
    ptrs: HashSet<usize>,
}

impl IdTable {
    pub(crate) fn insert(&mut self, id: CmId, p: *mut r::rdma_cm_id) {
        self.by_cm.insert(id.0, p as usize);
        self.ptrs.insert(p as usize);
    }

    pub(crate) fn remove(&mut self, id: CmId) {
        if let Some(p) = self.by_cm.remove(&id.0) {
            self.ptrs.remove(&p);
        }
    }

    pub(crate) fn get(&self, id: CmId) -> *mut r::rdma_cm_id {
        self.by_cm
            .get(&id.0)
            .map_or(std::ptr::null_mut(), |p| *p as *mut r::rdma_cm_id)
    }

    /// Whether `p` is an id this library made and has not freed.
    pub(crate) fn is_live(&self, p: *const r::rdma_cm_id) -> bool {
        self.ptrs.contains(&(p as usize))
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = usize> + '_ {
        self.ptrs.iter().copied()
    }
}

/// The process's CM, made at the first call (errno if no device could be opened).
pub(crate) fn cm() -> Result<&'static Cm, c_int> {
    CM.get_or_init(open).as_ref().map_err(|e| *e)
}

static CM: OnceLock<Result<Cm, c_int>> = OnceLock::new();

/// `ibv_destroy_qp` on the QP of a CM id (rping and perftest destroy it so): the QP
/// goes through the CM, as `rdma_destroy_qp`, so the id forgets it. `None` when the
/// QP is no CM id's.
pub(crate) fn destroy_cm_qp(qp: *mut sys::ibv_qp) -> Option<c_int> {
    let Some(Ok(cm)) = CM.get() else {
        return None;
    };
    if qp.is_null() {
        return None;
    }
    // SAFETY: a live QP of ours (ibv_destroy_qp checked it).
    let qpn = unsafe { (*qp).qp_num };
    let id = cm.ids.lock().all().find(|p| {
        // SAFETY: the ids in the map are live.
        let o = unsafe { &*(*p as *const IdObj) };
        // Only a QP the CM made (`rdma_create_qp`): one the program made itself and
        // stored in `id->qp` is destroyed as any other.
        o.raw.qp == qp && cm.cm.id_info(o.id).is_ok_and(|i| i.qp_num == Some(qpn))
    })?;
    Some(calls::destroy_qp_of(cm, id as *mut r::rdma_cm_id))
}

fn open() -> Result<Cm, c_int> {
    let mut contexts = Vec::new();
    let mut devs: Vec<Arc<dyn Device>> = Vec::new();
    for d in crate::verbs::devices() {
        // SAFETY: a device of our own list (module safety argument).
        let ctx = unsafe { ibv_open_device(std::ptr::from_ref(&d.raw).cast_mut()) };
        // SAFETY: just opened, or null.
        let Some(c) = (unsafe { Context::from_ptr(ctx) }) else {
            eprintln!("rdma-emu librdmacm: cannot open {}", d.cfg.name);
            continue;
        };
        devs.push(c.dev.clone());
        contexts.push((d.cfg.name.clone(), ctx as usize));
    }
    if devs.is_empty() {
        eprintln!("rdma-emu librdmacm: no device (see RDMA_EMU_DEVICES)");
        return Err(libc::ENODEV);
    }
    let cm = EmuCm::open(devs, CmConfig::default()).map_err(|e| {
        eprintln!("rdma-emu librdmacm: cannot start the connection manager: {e}");
        e.errno()
    })?;
    // SAFETY: registers a function of ours with no arguments, run once at exit.
    if unsafe { libc::atexit(at_exit) } != 0 {
        eprintln!("rdma-emu librdmacm: cannot register the exit handler");
    }
    Ok(Cm {
        cm,
        contexts,
        pds: Mutex::default(),
        ids: Mutex::default(),
        unacked: Mutex::default(),
        acked: Condvar::new(),
    })
}

/// At `exit`, the ids still alive go as the kernel destroys them when the process's
/// rdma_cm file closes (`ucma_close`): their peers are told (a DREQ to a connected
/// peer, a DREP to one that disconnected, a REJ to a pending request), so a peer
/// does not wait out its retries for a process that is gone; rsockets' ids alike. A
/// program killed by a signal that skips `exit` still leaves its peers to their
/// timeouts.
extern "C" fn at_exit() {
    let Some(Ok(cm)) = CM.get() else {
        return;
    };
    crate::rsocket::at_exit(cm);
    // A thread of the program may be inside a call holding the table: exit anyway.
    let Some(ids) = cm.ids.try_lock_for(std::time::Duration::from_millis(100)) else {
        return;
    };
    let left: Vec<CmId> = ids
        .all()
        .map(|p| {
            // SAFETY: the ids in the table are live.
            unsafe { (*(p as *const IdObj)).id }
        })
        .collect();
    drop(ids);
    for id in left {
        let _ = cm.cm.abandon_id(id);
    }
}

impl Cm {
    /// The context of the device named `name`.
    pub(crate) fn context(&self, name: &str) -> *mut sys::ibv_context {
        self.contexts
            .iter()
            .find(|(n, _)| n == name)
            .map_or(std::ptr::null_mut(), |(_, c)| *c as *mut sys::ibv_context)
    }

    /// The PD this library keeps for `ctx` (made on first use).
    pub(crate) fn default_pd(&self, ctx: *mut sys::ibv_context) -> *mut sys::ibv_pd {
        let mut pds = self.pds.lock();
        if let Some(p) = pds.get(&(ctx as usize)) {
            return *p as *mut sys::ibv_pd;
        }
        // SAFETY: one of our contexts.
        let pd = unsafe { ibv_alloc_pd(ctx) };
        if !pd.is_null() {
            pds.insert(ctx as usize, pd as usize);
        }
        pd
    }

    /// Counts an event handed out for `id` (see [`Cm::unacked`]).
    pub(crate) fn handed_out(&self, id: CmId) {
        *self.unacked.lock().entry(id.0).or_insert(0) += 1;
    }

    /// Counts the ack of an event handed out for `id`.
    pub(crate) fn acked(&self, id: CmId) {
        let mut unacked = self.unacked.lock();
        if let Some(n) = unacked.get_mut(&id.0) {
            *n -= 1;
            if *n == 0 {
                unacked.remove(&id.0);
            }
        }
        self.acked.notify_all();
    }

    /// Waits until every event handed out for `id` is acked, as librdmacm's
    /// `rdma_destroy_id` and `rdma_migrate_id` wait (`events_completed`): the program
    /// may still be reading `event->id` in another thread. A program that destroys an
    /// id holding an event of it unacked waits forever there too (`rdma_destroy_id(3)`:
    /// "ack all related events" first).
    pub(crate) fn wait_acked(&self, id: CmId) {
        let mut unacked = self.unacked.lock();
        while unacked.contains_key(&id.0) {
            self.acked.wait(&mut unacked);
        }
    }
}

/// An event channel (`rdma_event_channel`).
#[repr(C)]
pub(crate) struct ChannelObj {
    pub(crate) raw: r::rdma_event_channel,
    pub(crate) id: CmChannelId,
}

/// A CM id (`rdma_cm_id`).
#[repr(C)]
pub(crate) struct IdObj {
    pub(crate) raw: r::rdma_cm_id,
    pub(crate) id: CmId,
    /// Synchronous (made with no channel): the calls wait for their own events on a
    /// channel this library made (`raw.channel`).
    pub(crate) sync: bool,
    /// The channel is this id's own (freed with it).
    pub(crate) own_channel: bool,
    /// The CQs and channels `rdma_create_qp` made because the caller gave none.
    pub(crate) own_cqs: bool,
    /// `rdma_create_ep` on a passive id: the QP attributes and PD each
    /// `rdma_get_request` id gets.
    pub(crate) ep_qp: Option<(sys::ibv_qp_init_attr, usize)>,
    /// `rdma_destroy_id` came while the id still had its QP (librdmacm allows it:
    /// the QP is the program's): the id goes when the QP does.
    pub(crate) destroyed: bool,
    /// The multicast groups joined, each with the `context` its join gave (handed
    /// back in `param.ud.private_data` of its MULTICAST_JOIN / MULTICAST_ERROR event,
    /// as librdmacm does).
    pub(crate) mcast: Vec<(SocketAddr, usize)>,
    /// librdmacm's `id_priv->initiator_depth` and `responder_resources`: from the
    /// CONNECT_REQUEST on a passive id, what `rdma_accept` answers with when its
    /// parameters say `RDMA_MAX_INIT_DEPTH` / `RDMA_MAX_RESP_RES` (capped at the
    /// device's maxima).
    pub(crate) depth: (u8, u8),
}

/// An event (`rdma_cm_event`) and the parameters whose private data its `param`
/// points at.
#[repr(C)]
pub(crate) struct EventObj {
    pub(crate) raw: r::rdma_cm_event,
    pub(crate) param: CmEventParam,
    /// The id whose count of events not acked it is in ([`Cm::unacked`]).
    pub(crate) counted: CmId,
}

/// An address list entry (`rdma_addrinfo`) with its addresses.
#[repr(C)]
pub(crate) struct AddrInfoObj {
    pub(crate) raw: r::rdma_addrinfo,
    pub(crate) src: r::sockaddr_storage,
    pub(crate) dst: r::sockaddr_storage,
}

/// What a `sockaddr` this library fills in holds when there is no address: 0.0.0.0:0
/// (`AF_INET`).
pub(crate) const NO_ADDR: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

/// The socket address argument at `sa` ([`cm::sockaddr_from_ptr`]: EINVAL for an
/// unknown family, EAFNOSUPPORT for `AF_IB`), null being EINVAL; the errno on failure.
///
/// # Safety
///
/// As [`cm::sockaddr_from_ptr`]'s.
pub(crate) unsafe fn sockaddr_arg(sa: *const r::sockaddr) -> Result<SocketAddr, c_int> {
    // SAFETY: the caller's contract.
    match unsafe { cm::sockaddr_from_ptr(sa) } {
        Ok(Some(a)) => Ok(a),
        Ok(None) => Err(libc::EINVAL),
        Err(e) => Err(e.errno()),
    }
}

/// The errno of a CM error (and in `errno`), with EOPNOTSUPP said on stderr.
pub(crate) fn fail(e: &Error) -> c_int {
    let n = e.errno();
    if n == libc::EOPNOTSUPP {
        eprintln!("rdma-emu librdmacm: not supported by the emulator: {e}");
    }
    set_errno(n);
    n
}

/// -1 with `errno` (librdmacm's convention for its `int` calls).
pub(crate) fn err(errno: c_int) -> c_int {
    set_errno(errno);
    -1
}

/// Says on stderr that `what` is not supported; -1 with errno EOPNOTSUPP.
pub(crate) fn unsupported(what: &str) -> c_int {
    eprintln!("rdma-emu librdmacm: {what} is not supported by the emulator (EOPNOTSUPP)");
    err(libc::EOPNOTSUPP)
}
