//! `rsetsockopt`, `rgetsockopt` and `rfcntl`: the options librdmacm's rsockets take
//! (rsocket.c), with its errnos for the others (ENOTSUP).
//!
//! Buffer sizes and queue sizes apply to the connection made after them (SO_RCVBUF
//! and SO_SNDBUF are doubled, as librdmacm does); SO_KEEPALIVE and TCP_KEEPIDLE drive
//! the probes of `keepalive`; SO_REUSEADDR, SO_LINGER, TCP_NODELAY and the like are
//! kept and reported back.

use std::ffi::{c_int, c_void};

use super::data::{st, SNDLOWAT};
use super::lookup;
use crate::rdmacm::err;

/// `SOL_RDMA` (`<rdma/rsocket.h>`) and its options.
pub(crate) const SOL_RDMA: c_int = 0x10000;
pub(crate) const RDMA_SQSIZE: c_int = 0;
pub(crate) const RDMA_RQSIZE: c_int = 1;
pub(crate) const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const QP_MAX: u32 = 0xFFFE;
/// `tcpi_state` values (`<netinet/tcp.h>`).
const TCP_ESTABLISHED: u8 = 1;
const TCP_CLOSE: u8 = 7;

/// Reads the caller's option value as an int (0 when it is shorter).
unsafe fn int_of(v: *const c_void, len: u32) -> Option<c_int> {
    if v.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return None;
    }
    // SAFETY: the caller's value of len bytes (module safety argument).
    Some(unsafe { v.cast::<c_int>().read_unaligned() })
}

/// `rsetsockopt`.
#[no_mangle]
pub unsafe extern "C" fn rsetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: u32,
) -> c_int {
    if let Some(ds) = super::datagram::lookup(socket) {
        // SAFETY: the caller's option value.
        let v = unsafe { int_of(val, len) };
        return match super::datagram::setsockopt(&ds, level, name, val, len, v) {
            Ok(()) => 0,
            Err(e) => err(e),
        };
    }
    let Some(rs) = lookup(socket) else {
        return err(libc::EBADF);
    };
    let mut s = rs.s.lock();
    // SAFETY: the caller's option value.
    let v = match unsafe { int_of(val, len) } {
        Some(v) => v,
        // A name (TCP_CONGESTION) may be shorter than an int.
        None if (level, name) == (libc::IPPROTO_TCP, libc::TCP_CONGESTION) => 0,
        None => return err(libc::EINVAL),
    };
    let bit = |on: bool, set: &mut u64| {
        if on {
            *set |= 1 << name;
        } else {
            *set &= !(1 << name);
        }
    };
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_OOBINLINE) => bit(v != 0, &mut s.so_opts),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => {
            bit(v != 0, &mut s.so_opts);
            if v != 0 {
                if s.keepalive_time == 0 {
                    s.keepalive_time = super::keepalive::default_time();
                }
                s.keepalive_next = None;
                super::keepalive::start();
            }
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            if s.conn.is_none() {
                s.sizes.rbuf_size = (v as u32) << 1;
            }
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            if s.conn.is_none() {
                s.sizes.sbuf_size = ((v as u32) << 1).max(SNDLOWAT << 1);
            }
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            // Kept inverted, as librdmacm does: the default (0) is "on".
            bit(v == 0, &mut s.so_opts)
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => bit(v != 0, &mut s.tcp_opts),
        // librdmacm: not applicable over a reliable connection, accepted.
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG | libc::TCP_CONGESTION,
        ) => {}
        // Kept and reported (librdmacm also gives it to the CM as the id's TOS).
        (libc::IPPROTO_IP, libc::IP_TOS) => s.ip_tos = v,
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
            if v <= 0 {
                return err(libc::EINVAL);
            }
            s.keepalive_time = v as u32;
            s.keepalive_next = None;
        }
        (SOL_RDMA, _) if s.conn.is_some() || s.state & st::CONNECTED != 0 => {
            return err(libc::EINVAL)
        }
        (SOL_RDMA, RDMA_SQSIZE) => s.sizes.sq_size = (v as u32).min(QP_MAX),
        (SOL_RDMA, RDMA_RQSIZE) => s.sizes.rq_size = (v as u32).min(QP_MAX),
        (SOL_RDMA, RDMA_INLINE) => s.sizes.sq_inline = (v as u32).min(QP_MAX),
        (SOL_RDMA, RDMA_IOMAPSIZE) => {
            // Rounded as the connection data will carry it.
            let n = v.clamp(0, i32::from(u16::MAX)) as u16;
            s.sizes.iomap_size =
                super::setup::scale_to_value(super::setup::value_to_scale(n)) as u16;
        }
        _ => return err(libc::EOPNOTSUPP),
    }
    0
}

/// `rgetsockopt`.
#[no_mangle]
pub unsafe extern "C" fn rgetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut u32,
) -> c_int {
    if val.is_null() || len.is_null() {
        return err(libc::EFAULT);
    }
    if let Some(ds) = super::datagram::lookup(socket) {
        return match super::datagram::getsockopt(&ds, level, name, val, len) {
            Ok(Some(v)) => {
                // SAFETY: the caller's buffer of *len bytes.
                unsafe { put(val, len, &v) };
                0
            }
            Ok(None) => 0,
            Err(e) => err(e),
        };
    }
    let Some(rs) = lookup(socket) else {
        return err(libc::EBADF);
    };
    let mut s = rs.s.lock();
    let conn_sizes = s.conn.as_ref().map(|c| (c.rbuf_size, c.sbuf_size));
    let int = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
            c_int::from(s.so_opts & (1 << name) != 0)
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            conn_sizes.map_or(s.sizes.rbuf_size, |c| c.0) as c_int
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            conn_sizes.map_or(s.sizes.sbuf_size, |c| c.1) as c_int
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            let l = libc::linger {
                l_onoff: c_int::from(s.so_opts & (1 << name) == 0),
                l_linger: 0,
            };
            // SAFETY: the caller's buffer of *len bytes.
            unsafe { put(val, len, &l) };
            return 0;
        }
        (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut s.err),
        // librdmacm answers 0 and leaves the value alone.
        (libc::SOL_SOCKET, libc::SO_BROADCAST) => return 0,
        (libc::IPPROTO_IP, libc::IP_TOS) => s.ip_tos,
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            // What librdmacm fills in: the state and, as the congestion window, the
            // send queue size; the rest is zero.
            // SAFETY: tcp_info is plain integers; all zeros is a valid value.
            let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
            info.tcpi_state = if s.state & st::CONNECTED != 0 {
                TCP_ESTABLISHED
            } else {
                TCP_CLOSE
            };
            info.tcpi_snd_cwnd = s
                .conn
                .as_ref()
                .map_or(s.sizes.sq_size, |c| u32::from(c.sq_size));
            // SAFETY: the caller's buffer of *len bytes.
            unsafe { put(val, len, &info) };
            return 0;
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => c_int::from(s.tcp_opts & (1 << name) != 0),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => s.keepalive_time as c_int,
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_CONGESTION) => 1,
        // librdmacm: the path MTU when a route is known, else 2048.
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => 2048,
        (SOL_RDMA, RDMA_SQSIZE) => s.sizes.sq_size as c_int,
        (SOL_RDMA, RDMA_RQSIZE) => s.sizes.rq_size as c_int,
        (SOL_RDMA, RDMA_INLINE) => s.sizes.sq_inline as c_int,
        (SOL_RDMA, RDMA_IOMAPSIZE) => c_int::from(s.sizes.iomap_size),
        _ => return err(libc::EOPNOTSUPP),
    };
    // SAFETY: the caller's buffer of *len bytes.
    unsafe { put(val, len, &int) };
    0
}

/// Copies `v` into the caller's option buffer (truncated to `*len`), `*len` set to
/// its size.
unsafe fn put<T>(val: *mut c_void, len: *mut u32, v: &T) {
    let size = std::mem::size_of::<T>();
    // SAFETY: the caller's buffer of *len bytes.
    unsafe {
        let n = (*len as usize).min(size);
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(v).cast::<u8>(), val.cast(), n);
        *len = size as u32;
    }
}

/// `rfcntl`: F_GETFL / F_SETFL (O_NONBLOCK) and F_GETFD / F_SETFD; others ENOTSUP.
/// (Variadic in C; the one `int` argument arrives as the third register argument.)
#[no_mangle]
pub extern "C" fn rfcntl(socket: c_int, cmd: c_int, arg: c_int) -> c_int {
    if let Some(ds) = super::datagram::lookup(socket) {
        let mut s = ds.s.lock();
        let s = &mut *s;
        // The rsocket's own UDP socket.
        return fcntl_flags(&mut s.fs_flags, &mut s.fd_flags, ds.fd, cmd, arg);
    }
    let Some(rs) = lookup(socket) else {
        return err(libc::EBADF);
    };
    let mut s = rs.s.lock();
    let s = &mut *s;
    // The rsocket's own channel fd.
    fcntl_flags(&mut s.fs_flags, &mut s.fd_flags, rs.fd, cmd, arg)
}

/// `rfcntl`'s commands on an rsocket's file status flags (`fs`), its descriptor flags
/// (`fd_flags`), which also go to `fd`, the rsocket's own descriptor.
fn fcntl_flags(fs: &mut c_int, fd_flags: &mut c_int, fd: c_int, cmd: c_int, arg: c_int) -> c_int {
    match cmd {
        libc::F_GETFL => *fs,
        libc::F_SETFL => {
            *fs = arg;
            0
        }
        libc::F_GETFD => *fd_flags,
        libc::F_SETFD => {
            *fd_flags = arg;
            // SAFETY: fcntl on a descriptor the rsocket owns, with an integer argument.
            unsafe { libc::fcntl(fd, libc::F_SETFD, arg) };
            0
        }
        _ => err(libc::EOPNOTSUPP),
    }
}
