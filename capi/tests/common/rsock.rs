//! What the rsockets tests share: errno, socket addresses, a listening rsocket,
//! the second process of a two-process test, and whole-buffer send and receive.

use std::process::{Child, Command, Stdio};

use rdma_emu_ibverbs::sys::rdma as r;
use rdma_emu_ibverbs::*;

/// The calling thread's errno.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `ip:port` as a `sockaddr_in`.
pub(crate) fn sin(ip: [u8; 4], port: u16) -> r::sockaddr_in {
    r::sockaddr_in {
        sin_family: libc::AF_INET as r::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: r::in_addr {
            s_addr: u32::from_be_bytes(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// The dotted form of `a`.
pub(crate) fn ip(a: [u8; 4]) -> String {
    std::net::Ipv4Addr::from(a).to_string()
}

/// Gives this process one device on `a` (read once, at the first call into the
/// library).
///
/// # Safety
/// No other thread of the process reads the environment yet.
pub(crate) unsafe fn use_device(a: [u8; 4]) {
    // SAFETY: the caller's contract.
    unsafe { std::env::set_var("RDMA_EMU_DEVICES", format!("emu0={}", ip(a))) };
}

/// Binds stream rsocket `fd` to `ip:port` and listens (backlog 4).
///
/// # Safety
/// `fd` is an rsocket of this process.
pub(crate) unsafe fn bind_listen(fd: i32, ip: [u8; 4], port: u16) {
    let a = sin(ip, port);
    unsafe {
        assert_eq!(
            rbind(fd, (&raw const a).cast(), 16),
            0,
            "rbind: {}",
            errno()
        );
        assert_eq!(rlisten(fd, 4), 0, "rlisten: {}", errno());
    }
}

/// A new stream rsocket listening on `ip:port`.
///
/// # Safety
/// Calls the C ABI as a program does.
pub(crate) unsafe fn listener(ip: [u8; 4], port: u16) -> i32 {
    unsafe {
        let fd = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "rsocket: errno {}", errno());
        bind_listen(fd, ip, port);
        fd
    }
}

/// The next connection of listening rsocket `lfd` (blocking).
///
/// # Safety
/// `lfd` is a listening rsocket of this process.
pub(crate) unsafe fn accept(lfd: i32) -> i32 {
    let fd = unsafe { raccept(lfd, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert!(fd >= 0, "raccept: errno {}", errno());
    fd
}

/// A connected stream rsocket to `ip:port` (blocking).
///
/// # Safety
/// Calls the C ABI as a program does.
pub(crate) unsafe fn connect(ip: [u8; 4], port: u16) -> i32 {
    unsafe {
        let fd = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "rsocket: errno {}", errno());
        let a = sin(ip, port);
        let r = rconnect(fd, (&raw const a).cast(), 16);
        assert_eq!(r, 0, "rconnect: errno {}", errno());
        fd
    }
}

/// This test binary run again for test `test` only, with `role` set in its
/// environment (so it plays the other process), its stdout piped.
pub(crate) fn spawn_role(test: &str, role: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(role, "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the second process and checks it ended well and printed `done`.
pub(crate) fn expect_done(child: Child, done: &str) {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the other process: {out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(done));
}

/// Receives exactly `n` bytes (blocking rsocket).
///
/// # Safety
/// `fd` is a connected rsocket of this process.
pub(crate) unsafe fn recv_all(fd: i32, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    let mut at = 0;
    while at < n {
        let k = unsafe { rrecv(fd, v[at..].as_mut_ptr().cast(), n - at, 0) };
        assert!(k > 0, "rrecv: {k} errno {}", errno());
        at += k as usize;
    }
    v
}

/// Sends all of `data` (blocking rsocket).
///
/// # Safety
/// `fd` is a connected rsocket of this process.
pub(crate) unsafe fn send_all(fd: i32, data: &[u8]) {
    let mut at = 0;
    while at < data.len() {
        let k = unsafe { rsend(fd, data[at..].as_ptr().cast(), data.len() - at, 0) };
        assert!(k > 0, "rsend: {k} errno {}", errno());
        at += k as usize;
    }
}

/// `[::1]:port` as a `sockaddr_in6`.
pub(crate) fn sin6_loopback(port: u16) -> libc::sockaddr_in6 {
    libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: port.to_be(),
        sin6_flowinfo: 0,
        sin6_addr: libc::in6_addr {
            s6_addr: std::net::Ipv6Addr::LOCALHOST.octets(),
        },
        sin6_scope_id: 0,
    }
}
