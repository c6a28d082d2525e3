//! `rpoll` and `rselect`: rsockets and ordinary descriptors in one call.
//!
//! A round checks every entry without waiting: an rsocket by making progress on its
//! connection (rsocket.c `rs_poll_rs`), an ordinary fd with poll(2). If nothing is
//! ready, the call waits in poll(2) on the ordinary fds together with what stands
//! for each rsocket: its CQ's completion channel (armed) and CM channel when
//! connected, its CM channel (where connection requests arrive) when listening; then
//! it takes the CQ events and checks again.

use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::data::st;
use super::datagram::DSocket;
use super::{lookup, RSocket};
use crate::rdmacm::{cm, err, Cm};

/// The events ready on an rsocket now (progress made, nothing waited for).
fn revents(cm: &Cm, rs: &RSocket, events: i16) -> i16 {
    let mut s = rs.s.lock();
    if s.conn.is_some() {
        s.progress(cm, rs.ch, rs.fd);
        let mut re = 0;
        if events & libc::POLLIN != 0 && s.conn_have_rdata() {
            re |= libc::POLLIN;
        }
        if events & libc::POLLOUT != 0
            && s.state & st::WRITABLE != 0
            && s.conn.as_ref().is_some_and(super::data::Conn::can_send)
        {
            re |= libc::POLLOUT;
        }
        // POLLHUP once the data that came before the disconnect has been read
        // (librdmacm reports it at once, and a program that treats POLLHUP as an
        // error, as rstream's `do_poll` does, loses a race with a peer that closes
        // right after its last send).
        let drained = !s.conn.as_ref().is_some_and(super::data::Conn::have_rdata);
        if s.state == st::DISCONNECTED && drained {
            re |= libc::POLLHUP;
        } else if s.state & st::CONNECTED == 0 && s.state != st::DISCONNECTED {
            re |= libc::POLLERR;
        }
        return re;
    }
    if s.state == st::LISTENING {
        // Readable with a connection request for raccept to answer, or one it
        // answered now established.
        drop(s);
        super::accept_progress(cm, rs, false);
        let ready = super::accept_ready(rs) || fd_ready(rs.fd, libc::POLLIN) != 0;
        return if events & libc::POLLIN != 0 && ready {
            libc::POLLIN
        } else {
            0
        };
    }
    if s.state == st::OPENING {
        super::drive_connect(cm, rs, &mut s);
        if s.state & st::CONNECTED != 0 {
            drop(s);
            return revents(cm, rs, events);
        }
    }
    if s.state == st::CONNECT_ERROR {
        return (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR;
    }
    0
}

/// poll(2) as the kernel has it, reached through `ppoll`: librspreload interposes
/// `poll` (and hands any descriptor it takes for one of its sockets to `rpoll`,
/// through a buffer it shares with the `select` that may have called us), so the
/// waits inside rsockets do not go through it.
///
/// # Safety
/// `fds` is valid for `n` entries.
pub(crate) unsafe fn sys_poll(fds: *mut libc::pollfd, n: libc::nfds_t, ms: c_int) -> c_int {
    let ts = libc::timespec {
        tv_sec: libc::time_t::from(ms.max(0) / 1000),
        tv_nsec: libc::c_long::from(ms.max(0) % 1000) * 1_000_000,
    };
    let t = if ms < 0 {
        std::ptr::null()
    } else {
        &raw const ts
    };
    // SAFETY: the caller's array; our timespec; no signal mask.
    unsafe { libc::ppoll(fds, n, t, std::ptr::null()) }
}

/// poll(2) on one fd without waiting.
pub(crate) fn fd_ready(fd: c_int, events: i16) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd of our own.
    if unsafe { sys_poll(&mut p, 1, 0) } > 0 {
        p.revents
    } else {
        0
    }
}

/// The descriptors that stand for `rs` while waiting (after arming its CQ).
fn wait_fds(rs: &RSocket, out: &mut Vec<libc::pollfd>) {
    let mut s = rs.s.lock();
    let fd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    if let Some(c) = s.conn.as_mut() {
        c.arm();
        if let Ok(f) = c.res.dev.comp_channel_fd(c.comp) {
            out.push(fd(f));
        }
        if s.state & st::CONNECTED != 0 {
            out.push(fd(rs.fd));
        }
    } else if s.state == st::LISTENING {
        drop(s);
        listen_wait_fds(rs, out);
    } else if s.state == st::OPENING {
        // The events of a connection under way.
        out.push(fd(rs.fd));
    }
}

/// What stands for a listener while waiting: its channel (connection requests) and
/// the channels of the connections it answered (their RTU).
pub(crate) fn listen_wait_fds(rs: &RSocket, out: &mut Vec<libc::pollfd>) {
    let fd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    out.push(fd(rs.fd));
    for a in &rs.s.lock().accepting {
        out.push(fd(a.fd));
    }
}

/// What an entry of the caller's array is.
enum Entry {
    Stream(Arc<RSocket>),
    Datagram(Arc<DSocket>),
    Fd,
}

impl Entry {
    fn of(fd: c_int) -> Entry {
        if let Some(rs) = lookup(fd) {
            Entry::Stream(rs)
        } else if let Some(ds) = super::datagram::lookup(fd) {
            Entry::Datagram(ds)
        } else {
            Entry::Fd
        }
    }
}

/// One check of every entry; the number with events.
fn check(cm: &Cm, fds: &mut [libc::pollfd], socks: &[Entry]) -> c_int {
    let mut n = 0;
    for (p, rs) in fds.iter_mut().zip(socks) {
        p.revents = match rs {
            Entry::Stream(rs) => revents(cm, rs, p.events),
            Entry::Datagram(ds) => super::datagram::revents(cm, ds, p.events),
            Entry::Fd => fd_ready(p.fd, p.events),
        };
        if p.revents != 0 {
            n += 1;
        }
    }
    n
}

/// rpoll over `fds` with `timeout` in ms (negative: forever).
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: c_int) -> c_int {
    let socks: Vec<_> = fds.iter().map(|p| Entry::of(p.fd)).collect();
    if socks.iter().all(|e| matches!(e, Entry::Fd)) {
        // SAFETY: the caller's array, as poll(2) takes it.
        return unsafe { sys_poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
    }
    let _in_call = super::InCall::enter();
    let cm = match cm() {
        Ok(c) => c,
        Err(e) => return err(e),
    };
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    loop {
        let n = check(cm, fds, &socks);
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if n > 0 || left == Some(Duration::ZERO) {
            return n;
        }
        let mut waits = Vec::with_capacity(fds.len() + 2);
        for (p, rs) in fds.iter().zip(&socks) {
            match rs {
                Entry::Stream(rs) => wait_fds(rs, &mut waits),
                Entry::Datagram(ds) => super::datagram::poll_wait_fds(ds, &mut waits),
                Entry::Fd => waits.push(libc::pollfd {
                    fd: p.fd,
                    events: p.events,
                    revents: 0,
                }),
            }
        }
        // Armed: what completed meanwhile is seen now, else an event will wake us.
        let n = check(cm, fds, &socks);
        if n > 0 {
            return n;
        }
        // A bounded wait, so a change no descriptor signals (an rsocket's state
        // changed by another thread) is seen too.
        let ms = left.map_or(100, |l| l.as_millis().clamp(1, 100) as c_int);
        // SAFETY: our own array.
        let r = unsafe { sys_poll(waits.as_mut_ptr(), waits.len() as libc::nfds_t, ms) };
        if r < 0 {
            return -1;
        }
        for e in &socks {
            match e {
                Entry::Stream(rs) => {
                    if let Some(c) = rs.s.lock().conn.as_mut() {
                        c.take_events();
                    }
                }
                Entry::Datagram(ds) => super::datagram::poll_take_events(ds),
                Entry::Fd => {}
            }
        }
    }
}

/// `rpoll`: poll(2) over rsockets and ordinary fds.
#[no_mangle]
pub unsafe extern "C" fn rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    if fds.is_null() || nfds == 0 {
        // SAFETY: poll(2) with no entries (a sleep).
        return unsafe { sys_poll(fds, nfds, timeout) };
    }
    // SAFETY: the caller's array of nfds entries (module safety argument).
    let fds = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
    poll(fds, timeout)
}

/// `rselect`: select(2) over rsockets and ordinary fds (through `rpoll`).
#[no_mangle]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY (whole body): the caller's fd_sets and timeval, or null.
    unsafe {
        let isset = |set: *mut libc::fd_set, fd| !set.is_null() && libc::FD_ISSET(fd, set);
        let mut fds = Vec::new();
        for fd in 0..nfds.max(0) {
            let mut events = 0;
            if isset(readfds, fd) {
                events |= libc::POLLIN;
            }
            if isset(writefds, fd) {
                events |= libc::POLLOUT;
            }
            if events != 0 || isset(exceptfds, fd) {
                fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
            }
        }
        let ms = if timeout.is_null() {
            -1
        } else {
            ((*timeout).tv_sec * 1000 + (*timeout).tv_usec / 1000) as c_int
        };
        let n = poll(&mut fds, ms);
        for set in [readfds, writefds, exceptfds] {
            if !set.is_null() {
                libc::FD_ZERO(set);
            }
        }
        if n <= 0 {
            return n;
        }
        let mut cnt = 0;
        for p in &fds {
            if !readfds.is_null() && p.revents & libc::POLLIN != 0 {
                libc::FD_SET(p.fd, readfds);
                cnt += 1;
            }
            if !writefds.is_null() && p.revents & libc::POLLOUT != 0 {
                libc::FD_SET(p.fd, writefds);
                cnt += 1;
            }
            if !exceptfds.is_null() && p.revents & !(libc::POLLIN | libc::POLLOUT) != 0 {
                libc::FD_SET(p.fd, exceptfds);
                cnt += 1;
            }
        }
        cnt
    }
}
