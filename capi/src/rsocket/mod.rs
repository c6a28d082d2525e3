//! rsockets: librdmacm's socket API over RDMA (`rsocket`, `rconnect`, `rsend`,
//! `rpoll`, ...), speaking rsockets' own protocol on RC QPs so a program here talks
//! to librdmacm's rsockets on a real NIC or kernel rxe (rdma-core
//! `librdmacm/docs/rsocket`). `librspreload.so` runs unmodified TCP programs on it.
//!
//! Stream sockets (`SOCK_STREAM`), with `riomap`/`riowrite`, and datagram sockets
//! (`SOCK_DGRAM`) on UD QPs, over IPv4 or IPv6 (AF_INET, AF_INET6).
//!
//! Modules, one concern each:
//!
//! * this one: the socket table and the exported calls (arguments in and out);
//! * `setup`: connection set-up over the CM and the connection data;
//! * `datagram`: datagram rsockets (their own table, protocol and calls; each
//!   exported call here hands a datagram rsocket's number to it);
//! * `data`: the protocol on the QP (data, credits, control messages);
//! * `iomap`: `riomap`, `riounmap`, `riowrite`;
//! * `poll`: `rpoll` and `rselect` over rsockets mixed with ordinary fds;
//! * `opts`: `rsetsockopt`, `rgetsockopt`, `rfcntl`;
//! * `keepalive`: the probes of SO_KEEPALIVE.
//!
//! The objects are Rust ones on the emulator's [`verbs_api::Device`] and the
//! process's CM ([`crate::rdmacm`]): an rsocket's CM id and QP are not visible to
//! the program through `rdma_*` or `ibv_*` calls, as in librdmacm.
//!
//! An rsocket's number is the file descriptor of its own CM event channel (as in
//! librdmacm), a real descriptor, so numbers never collide with the program's files
//! and `rpoll` can wait on them with poll(2). The channel's fd is readable when a
//! connection request waits on a listening rsocket; a connected one waits on its
//! CQ's completion channel.
//!
//! # Safety argument
//!
//! The exported calls take the pointers of the BSD socket calls they stand for
//! (`rsend` is `send(2)`, `rgetsockname` is `getsockname(2)`, ...): each is null
//! where the socket call allows it or valid for the documented access and length
//! (buffers of `len` bytes, `iovec` arrays of `iovcnt` entries each valid for its
//! length, a `sockaddr` of `*addrlen` bytes, `pollfd` arrays of `nfds` entries,
//! `fd_set`s). Nothing is kept past the call.

#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

mod data;
mod datagram;
mod iomap;
mod keepalive;
mod opts;
mod poll;
mod setup;

pub use iomap::*;
pub use opts::*;
pub use poll::*;

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use verbs_api::{CmChannelId, CmEventType, CmId, ConnectionManager, PortSpace};

use crate::rdmacm::{cm, err, sockaddr_arg, Cm, NO_ADDR};
use crate::sys::rdma as r;
use data::{st, Conn};

/// The queue and buffer sizes an endpoint will get (rsocket.c's defaults, changed by
/// the options before the connection).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    pub(crate) sq_size: u32,
    pub(crate) rq_size: u32,
    pub(crate) sq_inline: u32,
    pub(crate) rbuf_size: u32,
    pub(crate) sbuf_size: u32,
    /// Entries of the iomap area (`RDMA_IOMAPSIZE`; librdmacm's default is none).
    pub(crate) iomap_size: u16,
}

impl Default for Sizes {
    /// rsocket.c `def_sqsize`, `def_rqsize`, `def_inline`, `def_mem`, `def_wmem`.
    fn default() -> Self {
        Sizes {
            sq_size: 384,
            rq_size: 384,
            sq_inline: 64,
            rbuf_size: 1 << 17,
            sbuf_size: 1 << 17,
            iomap_size: 0,
        }
    }
}

/// The state of one rsocket, under its lock.
pub(crate) struct Sock {
    pub(crate) id: CmId,
    /// `data::st` bits.
    pub(crate) state: u32,
    /// `O_NONBLOCK` and the rest of F_SETFL.
    pub(crate) fs_flags: c_int,
    /// F_SETFD.
    pub(crate) fd_flags: c_int,
    pub(crate) sizes: Sizes,
    /// SOL_SOCKET options set (bit per option number).
    pub(crate) so_opts: u64,
    /// IPPROTO_TCP options set.
    pub(crate) tcp_opts: u64,
    /// TCP_KEEPIDLE in seconds (0 until set or SO_KEEPALIVE takes the default).
    pub(crate) keepalive_time: u32,
    /// When the next keepalive probe is due.
    pub(crate) keepalive_next: Option<std::time::Instant>,
    /// IP_TOS as set.
    pub(crate) ip_tos: c_int,
    /// The pending error (`SO_ERROR`).
    pub(crate) err: c_int,
    pub(crate) conn: Option<Conn>,
    /// The endpoint of a connection under way (until ESTABLISHED).
    pub(crate) pending: Option<Conn>,
    /// A listener's connections answered and not yet handed out by `raccept` (each
    /// established or waiting for the peer's RTU), in the order they came.
    pub(crate) accepting: Vec<Arc<RSocket>>,
}

impl Sock {
    fn nonblocking(&self, flags: c_int) -> bool {
        self.fs_flags & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
    }

    /// Data to read, or no more will come (rsocket.c `rs_conn_have_rdata`).
    fn conn_have_rdata(&self) -> bool {
        self.conn.as_ref().is_none_or(Conn::have_rdata) || self.state & st::READABLE == 0
    }

    /// A message may go, or none ever will (`rs_conn_can_send`).
    fn conn_can_send(&self) -> bool {
        self.conn.as_ref().is_none_or(Conn::can_send) || self.state & st::WRITABLE == 0
    }

    /// A control slot is free, or the connection is over (`rs_conn_can_send_ctrl`).
    fn conn_can_send_ctrl(&self) -> bool {
        self.conn.as_ref().is_none_or(Conn::ctrl_avail) || self.state & st::CONNECTED == 0
    }

    /// Every send completed, or the connection is over.
    fn conn_all_sends_done(&self) -> bool {
        self.conn.as_ref().is_none_or(Conn::all_sends_done) || self.state & st::CONNECTED == 0
    }

    /// Takes what happened: the CM's events of a connected id (a DREQ from the peer
    /// ends the connection), then the completions, with credits sent before and
    /// after (rsocket.c `rs_process_cq`, one round).
    fn progress(&mut self, cm: &Cm, ch: CmChannelId, fd: c_int) {
        if self.state & st::CONNECTED != 0 && poll::fd_ready(fd, libc::POLLIN) != 0 {
            while let Ok(ev) = cm.cm.get_cm_event(ch, Some(Duration::ZERO)) {
                if ev.event == CmEventType::Disconnected && self.state & st::CONNECTED != 0 {
                    self.state = st::DISCONNECTED;
                }
            }
        }
        let state = self.state;
        let Some(c) = self.conn.as_mut() else {
            return;
        };
        let mut fail = c.update_credits(state).err();
        let p = c.poll_cq(state);
        if let Some(s) = p.state {
            self.state = s;
        }
        if let Some(e) = p.err {
            self.err = e;
        }
        let state = self.state;
        if let Some(c) = self.conn.as_mut() {
            fail = fail.or(c.update_credits(state).err());
        }
        if let Some(e) = fail {
            if self.state & st::CONNECTED != 0 {
                self.state = st::ERROR;
                self.err = e;
            }
        }
    }
}

/// An rsocket: its number (its CM channel's fd), channel and state.
pub(crate) struct RSocket {
    pub(crate) fd: c_int,
    pub(crate) ch: CmChannelId,
    pub(crate) s: Mutex<Sock>,
}

impl RSocket {
    /// Makes progress until `test` holds, waiting on the CQ's channel unless
    /// `nonblock` (then EWOULDBLOCK); returns the locked state.
    fn process(
        &self,
        cm: &Cm,
        nonblock: bool,
        test: fn(&Sock) -> bool,
    ) -> Result<MutexGuard<'_, Sock>, c_int> {
        loop {
            let mut s = self.s.lock();
            s.progress(cm, self.ch, self.fd);
            if test(&s) {
                return Ok(s);
            }
            if nonblock {
                return Err(libc::EWOULDBLOCK);
            }
            let Some(c) = s.conn.as_mut() else {
                return Err(libc::ENOTCONN);
            };
            c.arm();
            let (dev, comp) = (c.res.dev.clone(), c.comp);
            s.progress(cm, self.ch, self.fd);
            if test(&s) {
                return Ok(s);
            }
            drop(s);
            // A bounded wait: another thread of the program may take the event, and
            // a DREQ from the peer arrives on the CM channel, not this one.
            if dev
                .get_cq_event(comp, Some(Duration::from_millis(100)))
                .is_ok()
            {
                if let Some(c) = self.s.lock().conn.as_mut() {
                    c.cq_armed = false;
                }
            }
        }
    }
}

/// The rsockets of the process by number.
static SOCKETS: LazyLock<Mutex<HashMap<c_int, Arc<RSocket>>>> = LazyLock::new(Mutex::default);

/// The rsocket numbered `fd`.
pub(crate) fn lookup(fd: c_int) -> Option<Arc<RSocket>> {
    SOCKETS.lock().get(&fd).cloned()
}

/// A new rsocket on a new channel and CM id; `id` given for an accepted one.
fn new_socket(cm: &Cm, id: Option<CmId>) -> Result<Arc<RSocket>, c_int> {
    let e = |e: verbs_api::Error| e.errno();
    let ch = cm.cm.create_event_channel().map_err(e)?;
    let fd = cm.cm.event_channel_fd(ch).map_err(e)?;
    let id = match id {
        Some(id) => id,
        None => match cm.cm.create_id(ch, PortSpace::Tcp) {
            Ok(id) => id,
            Err(x) => {
                let _ = cm.cm.destroy_event_channel(ch);
                return Err(x.errno());
            }
        },
    };
    let rs = Arc::new(RSocket {
        fd,
        ch,
        s: Mutex::new(Sock {
            id,
            state: 0,
            fs_flags: 0,
            fd_flags: 0,
            sizes: Sizes::default(),
            so_opts: 0,
            tcp_opts: 0,
            keepalive_time: 0,
            keepalive_next: None,
            ip_tos: 0,
            err: 0,
            conn: None,
            pending: None,
            accepting: Vec::new(),
        }),
    });
    SOCKETS.lock().insert(fd, rs.clone());
    Ok(rs)
}

/// The errno of a stream-only call on `socket`, which is no stream rsocket:
/// EOPNOTSUPP for a datagram rsocket (`riomap` and the like), else EBADF.
pub(crate) fn not_stream(socket: c_int) -> c_int {
    if datagram::lookup(socket).is_some() {
        libc::EOPNOTSUPP
    } else {
        libc::EBADF
    }
}

/// Releases an rsocket taken out of the table: its QP, buffers, CM id (a DREQ to a
/// connected peer) and channel (its fd); for a listener, the connections it
/// answered that `raccept` did not hand out.
fn free_socket(cm: &Cm, rs: &RSocket) {
    let accepting = std::mem::take(&mut rs.s.lock().accepting);
    for a in accepting {
        SOCKETS.lock().remove(&a.fd);
        free_socket(cm, &a);
    }
    let mut s = rs.s.lock();
    if s.conn.is_some() || s.pending.is_some() {
        let _ = cm.cm.destroy_qp(s.id);
    }
    s.conn = None;
    s.pending = None;
    let _ = cm.cm.destroy_id(s.id);
    drop(s);
    let _ = cm.cm.destroy_event_channel(rs.ch);
}

/// At `exit` (from the CM's exit handler): the rsockets still open end as the
/// kernel ends them when the process's rdma_cm file closes: each CM id goes, a DREQ
/// telling a connected peer (which then reads EOF), as for the `rdma_*` ids.
pub(crate) fn at_exit(cm: &Cm) {
    // A thread of the program may be inside a call holding the table: exit anyway.
    let Some(table) = SOCKETS.try_lock_for(Duration::from_millis(100)) else {
        return;
    };
    let ids: Vec<CmId> = table
        .values()
        .filter_map(|rs| rs.s.try_lock().map(|s| s.id))
        .collect();
    drop(table);
    for id in ids {
        let _ = cm.cm.abandon_id(id);
    }
}

thread_local! {
    /// How deep this thread is in rsockets calls (see [`InCall`]).
    static IN_CALL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// While alive, the thread is inside an rsockets call. The emulator opens UDP
/// sockets of its own as it goes (a device's socket, one per peer it sends to);
/// under librspreload, which interposes `socket(2)`, those calls come back to
/// [`rsocket`], which must then refuse them (librspreload falls back to a kernel
/// socket) rather than make a datagram rsocket, or take the CM's lock again.
pub(crate) struct InCall;

impl InCall {
    pub(crate) fn enter() -> InCall {
        IN_CALL.with(|d| d.set(d.get() + 1));
        InCall
    }
}

impl Drop for InCall {
    fn drop(&mut self) {
        IN_CALL.with(|d| d.set(d.get() - 1));
    }
}

/// Whether a `socket(2)` that reached [`rsocket`] is the emulator's own: made
/// inside an rsockets call, or on one of the emulator's threads (a device's
/// `NAME-nic`, the CM's `emu-cm`, the keepalive prober).
fn internal_caller() -> bool {
    IN_CALL.with(std::cell::Cell::get) > 0
        || std::thread::current()
            .name()
            .is_some_and(|n| n.ends_with("-nic") || n == "emu-cm" || n == "rsocket-keepalive")
}

/// `cm_or!(cm, ret)`: binds `cm` to the process's CM (or sets errno and returns
/// `ret`), the thread counted as inside an rsockets call until the caller's block
/// ends.
macro_rules! cm_or {
    ($name:ident, $ret:expr) => {
        let _in_call = InCall::enter();
        let $name = match cm() {
            Ok(c) => c,
            Err(e) => {
                crate::verbs::set_errno(e);
                return $ret;
            }
        };
    };
}

macro_rules! rs_or {
    ($fd:expr, $ret:expr) => {
        match lookup($fd) {
            Some(r) => r,
            None => {
                crate::verbs::set_errno(libc::EBADF);
                return $ret;
            }
        }
    };
}

/// `rsocket`: a stream or datagram rsocket, AF_INET or AF_INET6 (AF_IB is
/// EAFNOSUPPORT: the emulator's devices are RoCE).
#[no_mangle]
pub extern "C" fn rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    if internal_caller() {
        return err(libc::EOPNOTSUPP);
    }
    let base = kind & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    if domain != libc::AF_INET && domain != libc::AF_INET6 && domain != libc::AF_IB {
        return err(libc::EOPNOTSUPP);
    }
    if base == libc::SOCK_DGRAM {
        if protocol != 0 && protocol != libc::IPPROTO_UDP {
            return err(libc::EOPNOTSUPP);
        }
        if domain == libc::AF_IB {
            return err(libc::EAFNOSUPPORT);
        }
        cm_or!(cm, -1);
        return match datagram::socket(cm, domain, kind) {
            Ok(fd) => fd,
            Err(e) => err(e),
        };
    }
    if base != libc::SOCK_STREAM || (protocol != 0 && protocol != libc::IPPROTO_TCP) {
        return err(libc::EOPNOTSUPP);
    }
    if domain == libc::AF_IB {
        return err(libc::EAFNOSUPPORT);
    }
    cm_or!(cm, -1);
    match new_socket(cm, None) {
        Ok(rs) => {
            let mut s = rs.s.lock();
            if kind & libc::SOCK_NONBLOCK != 0 {
                s.fs_flags |= libc::O_NONBLOCK;
            }
            if kind & libc::SOCK_CLOEXEC != 0 {
                s.fd_flags = libc::FD_CLOEXEC;
            }
            rs.fd
        }
        Err(e) => err(e),
    }
}

/// `rbind`.
#[no_mangle]
pub unsafe extern "C" fn rbind(socket: c_int, addr: *const r::sockaddr, _len: u32) -> c_int {
    cm_or!(cm, -1);
    // SAFETY: the caller's sockaddr (module safety argument).
    let a = match unsafe { sockaddr_arg(addr) } {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    if let Some(ds) = datagram::lookup(socket) {
        return match datagram::bind(cm, &ds, a) {
            Ok(()) => 0,
            Err(e) => err(e),
        };
    }
    let rs = rs_or!(socket, -1);
    let mut s = rs.s.lock();
    match cm.cm.bind_addr(s.id, a) {
        Ok(()) => {
            s.state = st::BOUND;
            0
        }
        Err(e) => err(e.errno()),
    }
}

/// `rlisten`.
#[no_mangle]
pub extern "C" fn rlisten(socket: c_int, backlog: c_int) -> c_int {
    cm_or!(cm, -1);
    if datagram::lookup(socket).is_some() {
        return err(libc::EOPNOTSUPP);
    }
    let rs = rs_or!(socket, -1);
    let mut s = rs.s.lock();
    if s.state == st::LISTENING {
        return 0;
    }
    match cm.cm.listen(s.id, backlog.max(0) as u32) {
        Ok(()) => {
            s.state = st::LISTENING;
            0
        }
        Err(e) => err(e.errno()),
    }
}

/// Writes `a` to the caller's `sockaddr` of `*len` bytes (a `sockaddr_in` or, for
/// an IPv6 address, a `sockaddr_in6`; truncated as getsockname(2) does) and sets
/// `*len` to its size.
unsafe fn put_addr(a: Option<std::net::SocketAddr>, addr: *mut r::sockaddr, len: *mut u32) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let (c, size) = verbs_ffi::cm::sockaddr_to_c(a.unwrap_or(NO_ADDR));
    // SAFETY: the caller's buffer of *len bytes (module safety argument).
    unsafe {
        let n = (*len as usize).min(size as usize);
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(&c).cast::<u8>(), addr.cast(), n);
        *len = size;
    }
}

/// Moves a listener's connections on without waiting: with `answer`, each
/// connection request waiting on its channel is answered (a new rsocket with its
/// endpoint, the REP sent) and queued; a queued one whose RTU came is established,
/// one that failed is dropped. Only `raccept` answers requests; `rpoll` moves the
/// answered ones on. (Answered from `rpoll`, programs under librspreload, ncat and
/// iperf3, stopped reading their accepted connections although `rpoll` reported
/// them readable; why is not pinned down. Answered here, the new rsocket is made
/// inside the program's `accept`, after librspreload's number for it, as it was
/// when `raccept` blocked.)
fn accept_progress(cm: &Cm, ls: &RSocket, answer: bool) {
    let (sizes, fs, fdf) = {
        let s = ls.s.lock();
        (s.sizes, s.fs_flags, s.fd_flags)
    };
    while let Some(Ok(ev)) = answer.then(|| cm.cm.get_cm_event(ls.ch, Some(Duration::ZERO))) {
        if ev.event != CmEventType::ConnectRequest {
            continue;
        }
        let rs = match new_socket(cm, Some(ev.id)) {
            Ok(rs) => rs,
            Err(_) => {
                let _ = cm.cm.reject(ev.id, &[]);
                let _ = cm.cm.destroy_id(ev.id);
                continue;
            }
        };
        let started = {
            let mut s = rs.s.lock();
            s.sizes = sizes;
            s.fs_flags = fs;
            s.fd_flags = fdf;
            setup::accept_start(cm, rs.ch, &ev, &mut s)
        };
        if started.is_ok() {
            ls.s.lock().accepting.push(rs);
        } else {
            SOCKETS.lock().remove(&rs.fd);
            free_socket(cm, &rs);
        }
    }
    let accepting = ls.s.lock().accepting.clone();
    for rs in accepting {
        let failed = {
            let mut s = rs.s.lock();
            s.state & st::CONNECTED == 0 && setup::accept_poll(cm, rs.ch, &mut s).is_err()
        };
        if failed {
            ls.s.lock().accepting.retain(|a| a.fd != rs.fd);
            SOCKETS.lock().remove(&rs.fd);
            free_socket(cm, &rs);
        }
    }
}

/// The first established connection a listener has queued, taken off its queue.
fn take_accepted(ls: &RSocket) -> Option<Arc<RSocket>> {
    let mut s = ls.s.lock();
    let i = s
        .accepting
        .iter()
        .position(|a| a.s.lock().state & st::CONNECTED != 0)?;
    Some(s.accepting.remove(i))
}

/// Whether a listener has an established connection for `raccept`.
pub(crate) fn accept_ready(ls: &RSocket) -> bool {
    ls.s.lock()
        .accepting
        .iter()
        .any(|a| a.s.lock().state & st::CONNECTED != 0)
}

/// `raccept`: the next connection of a listening rsocket, established when returned.
/// Non-blocking, EAGAIN until one is (as librdmacm's, whose service thread answers
/// the requests meanwhile); blocking, waits on the listener's channel and those of
/// the connections it answered.
#[no_mangle]
pub unsafe extern "C" fn raccept(socket: c_int, addr: *mut r::sockaddr, len: *mut u32) -> c_int {
    cm_or!(cm, -1);
    if datagram::lookup(socket).is_some() {
        return err(libc::EOPNOTSUPP);
    }
    let ls = rs_or!(socket, -1);
    let nonblock = {
        let s = ls.s.lock();
        if s.state != st::LISTENING {
            return err(libc::EINVAL);
        }
        s.fs_flags & libc::O_NONBLOCK != 0
    };
    loop {
        accept_progress(cm, &ls, true);
        if let Some(rs) = take_accepted(&ls) {
            let id = rs.s.lock().id;
            let peer = cm.cm.id_info(id).ok().and_then(|i| i.peer);
            // SAFETY: the caller's address buffer (module safety argument).
            unsafe { put_addr(peer, addr, len) };
            return rs.fd;
        }
        if nonblock {
            return err(libc::EAGAIN);
        }
        let mut fds = Vec::new();
        poll::listen_wait_fds(&ls, &mut fds);
        // Bounded, so a change no descriptor signals is seen too.
        // SAFETY: our own array.
        unsafe { poll::sys_poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
    }
}

/// `rconnect`: connects; on a non-blocking rsocket starts connecting (EINPROGRESS).
#[no_mangle]
pub unsafe extern "C" fn rconnect(socket: c_int, addr: *const r::sockaddr, _len: u32) -> c_int {
    cm_or!(cm, -1);
    // SAFETY: the caller's sockaddr (module safety argument).
    let a = match unsafe { sockaddr_arg(addr) } {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    if let Some(ds) = datagram::lookup(socket) {
        return match datagram::connect(cm, &ds, a) {
            Ok(()) => 0,
            Err(e) => err(e),
        };
    }
    let rs = rs_or!(socket, -1);
    let mut s = rs.s.lock();
    if s.state & st::CONNECTED != 0 {
        return err(libc::EISCONN);
    }
    if s.state == st::OPENING {
        return err(libc::EALREADY);
    }
    if s.state & (st::LISTENING | st::DISCONNECTED | st::ERROR | st::CONNECT_ERROR) != 0 {
        return err(libc::EINVAL);
    }
    let r = if s.fs_flags & libc::O_NONBLOCK != 0 {
        // Non-blocking: started here, driven by rpoll and the data calls
        // (EINPROGRESS, then POLLOUT, then SO_ERROR, as for a TCP socket).
        setup::connect_start(cm, &mut s, a).and_then(|()| {
            match setup::connect_poll(cm, rs.ch, &mut s)? {
                true => Ok(()),
                false => Err(libc::EINPROGRESS),
            }
        })
    } else {
        setup::connect(cm, rs.ch, &mut s, a)
    };
    match r {
        Ok(()) => 0,
        Err(libc::EINPROGRESS) => err(libc::EINPROGRESS),
        Err(e) => {
            s.state = st::CONNECT_ERROR;
            s.err = e;
            err(e)
        }
    }
}

/// Moves a non-blocking connection on with the CM events there now (rsocket.c runs
/// `rs_do_connect` from the data calls and rpoll alike); a failure becomes the
/// rsocket's error (SO_ERROR).
fn drive_connect(cm: &Cm, rs: &RSocket, s: &mut Sock) {
    if s.state != st::OPENING {
        return;
    }
    if let Err(e) = setup::connect_poll(cm, rs.ch, s) {
        s.state = st::CONNECT_ERROR;
        s.err = e;
    }
}

/// Before a data call: a connection under way moves on; still under way is EAGAIN
/// (rsocket.c turns its EINPROGRESS into EAGAIN there), failed is its errno.
fn opening(cm: &Cm, rs: &RSocket) -> Result<(), c_int> {
    let mut s = rs.s.lock();
    if s.state != st::OPENING {
        return Ok(());
    }
    drive_connect(cm, rs, &mut s);
    match s.state {
        st::OPENING => Err(libc::EAGAIN),
        st::CONNECT_ERROR => Err(s.err),
        _ => Ok(()),
    }
}

/// Receives into `buf` (rsocket.c `rrecv`): queued data is still read after the
/// peer disconnected; 0 at the end.
fn recv(socket: c_int, buf: &mut [u8], flags: c_int) -> isize {
    cm_or!(cm, -1);
    if let Some(ds) = datagram::lookup(socket) {
        return match datagram::recv(cm, &ds, buf, flags) {
            Ok((n, _)) => n as isize,
            Err(e) => err(e) as isize,
        };
    }
    let rs = rs_or!(socket, -1);
    if let Err(e) = opening(cm, &rs) {
        return err(e) as isize;
    }
    let nonblock = rs.s.lock().nonblocking(flags);
    let mut done = 0usize;
    loop {
        let mut s = match rs.process(cm, nonblock, Sock::conn_have_rdata) {
            Ok(s) => s,
            Err(e) if done == 0 => return err(e) as isize,
            Err(_) => return done as isize,
        };
        let Some(c) = s.conn.as_mut() else {
            return err(libc::ENOTCONN) as isize;
        };
        let n = c.recv_some(&mut buf[done..], flags & libc::MSG_PEEK != 0);
        done += n;
        let state = s.state;
        if let Some(c) = s.conn.as_mut() {
            let _ = c.update_credits(state);
        }
        if flags & libc::MSG_PEEK != 0
            || done == buf.len()
            || flags & libc::MSG_WAITALL == 0
            || s.state & st::READABLE == 0
            || buf.is_empty()
        {
            return done as isize;
        }
    }
}

/// Sends `data` (rsocket.c `rsend`): blocks until all is queued, or returns what
/// went before the socket would block (EAGAIN if nothing did).
fn send(socket: c_int, data: &[u8], flags: c_int) -> isize {
    cm_or!(cm, -1);
    if let Some(ds) = datagram::lookup(socket) {
        return match datagram::send(cm, &ds, data, flags, None) {
            Ok(n) => n as isize,
            Err(e) => err(e) as isize,
        };
    }
    let rs = rs_or!(socket, -1);
    if let Err(e) = opening(cm, &rs) {
        return err(e) as isize;
    }
    let nonblock = rs.s.lock().nonblocking(flags);
    if let Err(e) = iomap::send_pending(cm, &rs, nonblock) {
        return err(e) as isize;
    }
    let mut done = 0usize;
    while done < data.len() {
        let mut s = match rs.process(cm, nonblock, Sock::conn_can_send) {
            Ok(s) => s,
            Err(e) if done == 0 => return err(e) as isize,
            Err(_) => break,
        };
        if s.state & st::WRITABLE == 0 {
            if done > 0 {
                break;
            }
            return err(if s.conn.is_none() {
                libc::ENOTCONN
            } else {
                libc::ECONNRESET
            }) as isize;
        }
        let Some(c) = s.conn.as_mut() else {
            return err(libc::ENOTCONN) as isize;
        };
        match c.send_some(&data[done..]) {
            Ok(n) => done += n,
            Err(e) => {
                s.state = st::ERROR;
                s.err = e;
                if done == 0 {
                    return err(e) as isize;
                }
                break;
            }
        }
    }
    done as isize
}

/// The caller's buffer as a slice (empty for a null pointer).
unsafe fn slice_mut<'a>(buf: *mut c_void, len: usize) -> &'a mut [u8] {
    if buf.is_null() || len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's buffer of len bytes (module safety argument).
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }
}

/// As [`slice_mut`], read-only.
unsafe fn slice<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
    if buf.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller's buffer of len bytes (module safety argument).
    unsafe { std::slice::from_raw_parts(buf.cast(), len) }
}

/// The bytes of an `iovec` array, gathered.
unsafe fn gather(iov: *const libc::iovec, cnt: c_int) -> Vec<u8> {
    let mut v = Vec::new();
    for i in 0..cnt.max(0) as usize {
        // SAFETY: the caller's array of cnt iovecs, each valid for its length.
        unsafe {
            let e = &*iov.add(i);
            v.extend_from_slice(slice(e.iov_base, e.iov_len));
        }
    }
    v
}

/// Receives into an `iovec` array: the bytes received (scattered), or -1; a
/// datagram's source goes to `name` (a `sockaddr` of `*namelen` bytes, or null).
unsafe fn recv_iov(
    socket: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    flags: c_int,
    name: *mut r::sockaddr,
    namelen: *mut u32,
) -> isize {
    let mut total = 0usize;
    for i in 0..cnt.max(0) as usize {
        // SAFETY: as in `gather`.
        total += unsafe { (*iov.add(i)).iov_len };
    }
    let mut tmp = vec![0u8; total];
    let n = if name.is_null() {
        recv(socket, &mut tmp, flags)
    } else {
        // SAFETY: the caller's buffers.
        unsafe { rrecvfrom(socket, tmp.as_mut_ptr().cast(), total, flags, name, namelen) }
    };
    if n <= 0 {
        return n;
    }
    let mut at = 0usize;
    for i in 0..cnt.max(0) as usize {
        if at == n as usize {
            break;
        }
        // SAFETY: as in `gather`.
        let e = unsafe { &*iov.add(i) };
        let k = e.iov_len.min(n as usize - at);
        // SAFETY: as in `gather`.
        unsafe { slice_mut(e.iov_base, k) }.copy_from_slice(&tmp[at..at + k]);
        at += k;
    }
    n
}

/// `rrecv`.
#[no_mangle]
pub unsafe extern "C" fn rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    // SAFETY: the caller's buffer.
    recv(socket, unsafe { slice_mut(buf, len) }, flags)
}

/// `rread`.
#[no_mangle]
pub unsafe extern "C" fn rread(socket: c_int, buf: *mut c_void, len: usize) -> isize {
    // SAFETY: the caller's buffer.
    recv(socket, unsafe { slice_mut(buf, len) }, 0)
}

/// `rrecvfrom`: on a stream rsocket, `rrecv` and the peer's address; on a datagram
/// one, the next datagram and its source.
#[no_mangle]
pub unsafe extern "C" fn rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut r::sockaddr,
    srclen: *mut u32,
) -> isize {
    if let Some(ds) = datagram::lookup(socket) {
        cm_or!(cm, -1);
        // SAFETY: the caller's buffer.
        let buf = unsafe { slice_mut(buf, len) };
        return match datagram::recv(cm, &ds, buf, flags) {
            Ok((n, from)) => {
                // SAFETY: the caller's address buffer.
                unsafe { put_addr(Some(from), src, srclen) };
                n as isize
            }
            Err(e) => err(e) as isize,
        };
    }
    // SAFETY: the caller's buffer.
    let n = recv(socket, unsafe { slice_mut(buf, len) }, flags);
    if n > 0 && !src.is_null() {
        // SAFETY: the caller's address buffer.
        unsafe { rgetpeername(socket, src, srclen) };
    }
    n
}

/// `rreadv`.
#[no_mangle]
pub unsafe extern "C" fn rreadv(socket: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: the caller's iovecs.
    unsafe {
        recv_iov(
            socket,
            iov,
            cnt,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

/// `rrecvmsg`: the `msghdr`'s iovecs and, for a datagram, its source as the name
/// (no control data).
#[no_mangle]
pub unsafe extern "C" fn rrecvmsg(socket: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    if msg.is_null() {
        return err(libc::EINVAL) as isize;
    }
    // SAFETY: the caller's msghdr.
    unsafe {
        let m = &mut *msg;
        m.msg_controllen = 0;
        m.msg_flags = 0;
        let name = if datagram::lookup(socket).is_some() {
            m.msg_name.cast()
        } else {
            m.msg_namelen = 0;
            std::ptr::null_mut()
        };
        recv_iov(
            socket,
            m.msg_iov,
            m.msg_iovlen as c_int,
            flags,
            name,
            &mut m.msg_namelen,
        )
    }
}

/// `rsend`.
#[no_mangle]
pub unsafe extern "C" fn rsend(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> isize {
    // SAFETY: the caller's buffer.
    send(socket, unsafe { slice(buf, len) }, flags)
}

/// `rwrite`.
#[no_mangle]
pub unsafe extern "C" fn rwrite(socket: c_int, buf: *const c_void, len: usize) -> isize {
    // SAFETY: the caller's buffer.
    send(socket, unsafe { slice(buf, len) }, 0)
}

/// `rsendto`: on a stream rsocket, `rsend` (an address is EISCONN); on a datagram
/// one, a datagram to `dst` (the connected peer when null).
#[no_mangle]
pub unsafe extern "C" fn rsendto(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dst: *const r::sockaddr,
    dstlen: u32,
) -> isize {
    if let Some(ds) = datagram::lookup(socket) {
        cm_or!(cm, -1);
        // SAFETY: the caller's sockaddr (module safety argument).
        let to = match unsafe { verbs_ffi::cm::sockaddr_from_ptr(dst) } {
            Ok(a) => a,
            Err(e) => return err(e.errno()) as isize,
        };
        // SAFETY: the caller's buffer.
        return match datagram::send(cm, &ds, unsafe { slice(buf, len) }, flags, to) {
            Ok(n) => n as isize,
            Err(e) => err(e) as isize,
        };
    }
    if !dst.is_null() || dstlen != 0 {
        return err(libc::EISCONN) as isize;
    }
    // SAFETY: the caller's buffer.
    send(socket, unsafe { slice(buf, len) }, flags)
}

/// `rwritev`.
#[no_mangle]
pub unsafe extern "C" fn rwritev(socket: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: the caller's iovecs.
    let v = unsafe { gather(iov, cnt) };
    send(socket, &v, 0)
}

/// `rsendmsg`: the `msghdr`'s iovecs (control data is ignored, as librdmacm does),
/// to its name on a datagram rsocket.
#[no_mangle]
pub unsafe extern "C" fn rsendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    if msg.is_null() {
        return err(libc::EINVAL) as isize;
    }
    // SAFETY: the caller's msghdr and its iovecs.
    let v = unsafe { gather((*msg).msg_iov, (*msg).msg_iovlen as c_int) };
    // SAFETY: the caller's msghdr.
    let (name, namelen) = unsafe { ((*msg).msg_name, (*msg).msg_namelen) };
    if !name.is_null() && datagram::lookup(socket).is_some() {
        // SAFETY: the caller's name, a sockaddr of namelen bytes.
        return unsafe {
            rsendto(
                socket,
                v.as_ptr().cast(),
                v.len(),
                flags,
                name.cast(),
                namelen,
            )
        };
    }
    send(socket, &v, flags)
}

/// `rshutdown` (rsocket.c): tells the peer (SHUTDOWN for SHUT_WR while still
/// reading, else DISCONNECT) and waits until every send completed.
#[no_mangle]
pub extern "C" fn rshutdown(socket: c_int, how: c_int) -> c_int {
    cm_or!(cm, -1);
    if let Some(ds) = datagram::lookup(socket) {
        return match datagram::shutdown(&ds, how) {
            Ok(()) => 0,
            Err(e) => err(e),
        };
    }
    let rs = rs_or!(socket, -1);
    match shutdown(cm, &rs, how) {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}

fn shutdown(cm: &Cm, rs: &RSocket, how: c_int) -> Result<(), c_int> {
    let mut s = rs.s.lock();
    if s.state & st::CONNECTED == 0 {
        return if s.conn.is_some() {
            Ok(())
        } else {
            Err(libc::ENOTCONN)
        };
    }
    let ctrl = match how {
        libc::SHUT_RDWR => {
            s.state &= !(st::READABLE | st::WRITABLE);
            data::CTRL_DISCONNECT
        }
        libc::SHUT_WR => {
            s.state &= !st::WRITABLE;
            if s.state & st::READABLE != 0 {
                data::CTRL_SHUTDOWN
            } else {
                data::CTRL_DISCONNECT
            }
        }
        libc::SHUT_RD => {
            s.state &= !st::READABLE;
            if s.state & st::WRITABLE != 0 {
                return Ok(());
            }
            data::CTRL_DISCONNECT
        }
        _ => return Err(libc::EINVAL),
    };
    if !s.conn_can_send_ctrl() {
        drop(s);
        s = rs.process(cm, false, Sock::conn_can_send_ctrl)?;
    }
    if s.state & st::CONNECTED != 0 {
        if let Some(c) = s.conn.as_mut() {
            if c.ctrl_avail() {
                c.ctrl_seqno = c.ctrl_seqno.wrapping_add(1);
                c.post_msg(data::msg(data::OP_CTRL, ctrl))?;
            }
        }
    }
    if s.state & st::CONNECTED != 0 {
        drop(s);
        drop(rs.process(cm, false, Sock::conn_all_sends_done)?);
    }
    Ok(())
}

/// `rclose`: shuts a connected rsocket down (SHUT_RDWR) and frees it.
#[no_mangle]
pub extern "C" fn rclose(socket: c_int) -> c_int {
    cm_or!(cm, -1);
    if datagram::lookup(socket).is_some() {
        return match datagram::close(cm, socket) {
            Ok(()) => 0,
            Err(e) => err(e),
        };
    }
    let rs = rs_or!(socket, -1);
    if rs.s.lock().state & st::CONNECTED != 0 {
        let _ = shutdown(cm, &rs, libc::SHUT_RDWR);
    }
    SOCKETS.lock().remove(&socket);
    free_socket(cm, &rs);
    0
}

/// `rgetpeername`.
#[no_mangle]
pub unsafe extern "C" fn rgetpeername(
    socket: c_int,
    addr: *mut r::sockaddr,
    len: *mut u32,
) -> c_int {
    // SAFETY: the caller's address buffer, as `rgetpeername` takes it.
    unsafe { socket_name(socket, addr, len, true) }
}

/// `rgetsockname`.
#[no_mangle]
pub unsafe extern "C" fn rgetsockname(
    socket: c_int,
    addr: *mut r::sockaddr,
    len: *mut u32,
) -> c_int {
    // SAFETY: the caller's address buffer, as `rgetsockname` takes it.
    unsafe { socket_name(socket, addr, len, false) }
}

/// `rgetpeername` (`peer`) or `rgetsockname`: the address of either end of `socket`,
/// stream or datagram, into the caller's buffer.
///
/// # Safety
/// `addr` and `len` are as getpeername(2) takes them: `len` points to the size of the
/// buffer at `addr`.
unsafe fn socket_name(socket: c_int, addr: *mut r::sockaddr, len: *mut u32, peer: bool) -> c_int {
    cm_or!(cm, -1);
    if let Some(ds) = datagram::lookup(socket) {
        return match datagram::name(&ds, peer) {
            // SAFETY: the caller's address buffer.
            Ok(a) => unsafe {
                put_addr(a, addr, len);
                0
            },
            Err(e) => err(e),
        };
    }
    let rs = rs_or!(socket, -1);
    let id = rs.s.lock().id;
    let info = cm.cm.id_info(id).ok();
    let a = info.and_then(|i| if peer { i.peer } else { i.local });
    // SAFETY: the caller's address buffer.
    unsafe { put_addr(a, addr, len) };
    0
}
