//! SO_KEEPALIVE: a connected rsocket whose peer dies (SIGKILL: no exit handler, no
//! DREQ) and that sends nothing itself learns of it from its keepalive probe, which
//! completes in error: rpoll reports POLLERR and SO_ERROR says EIO. Without probes it
//! would wait for data forever (the rpoll's 60 s bound then fails the test).

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use rdma_emu_ibverbs::sys::rdma as r;
use rdma_emu_ibverbs::*;

const ROLE: &str = "RSOCKETS_KEEPALIVE_TEST_ROLE";
const SERVER: [u8; 4] = [127, 0, 0, 36];
const CLIENT: [u8; 4] = [127, 0, 0, 37];
const PORT: u16 = 7394;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn sin(ip: [u8; 4], port: u16) -> r::sockaddr_in {
    r::sockaddr_in {
        sin_family: libc::AF_INET as r::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: r::in_addr {
            s_addr: u32::from_be_bytes(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// The peer: accepts, says so, and waits to be killed.
unsafe fn server() -> ! {
    unsafe {
        let lfd = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        let a = sin(SERVER, PORT);
        assert_eq!(rbind(lfd, (&raw const a).cast(), 16), 0);
        assert_eq!(rlisten(lfd, 1), 0);
        println!("listening");
        let fd = raccept(lfd, std::ptr::null_mut(), std::ptr::null_mut());
        assert!(fd >= 0);
        // One byte each way: each side has sent its credits before the kill.
        assert_eq!(rsend(fd, b"s".as_ptr().cast(), 1, 0), 1);
        let mut c = [0u8; 1];
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 1, 0), 1);
        println!("accepted");
        std::thread::sleep(std::time::Duration::from_secs(120));
        std::process::exit(1);
    }
}

#[test]
fn keepalive_probes_find_a_dead_peer() {
    if std::env::var_os(ROLE).is_some() {
        // SAFETY: the second run of this test binary; read once at the first call.
        unsafe { std::env::set_var("RDMA_EMU_DEVICES", format!("emu0={}", ip(SERVER))) };
        // SAFETY: the C ABI as a C program calls it.
        unsafe { server() };
    }
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { std::env::set_var("RDMA_EMU_DEVICES", format!("emu0={}", ip(CLIENT))) };
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "keepalive_probes_find_a_dead_peer",
            "--nocapture",
        ])
        .env(ROLE, "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut wait_for = |what: &str| loop {
        let l = lines.next().expect("the server ended").unwrap();
        if l.contains(what) {
            break;
        }
    };
    wait_for("listening");
    // SAFETY: the C ABI as a C program calls it.
    unsafe {
        let fd = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let on: i32 = 1;
        let p = (&raw const on).cast();
        assert_eq!(
            rsetsockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, p, 4),
            0
        );
        assert_eq!(
            rsetsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, p, 4),
            0
        );
        let (mut v, mut vl) = (0i32, 4u32);
        let pv = (&raw mut v).cast();
        assert_eq!(
            rgetsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, pv, &mut vl),
            0
        );
        assert_eq!(v, 1);
        let a = sin(SERVER, PORT);
        assert_eq!(
            rconnect(fd, (&raw const a).cast(), 16),
            0,
            "errno {}",
            errno()
        );
        let mut c = [0u8; 1];
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 1, 0), 1);
        assert_eq!(rsend(fd, b"c".as_ptr().cast(), 1, 0), 1);
        // A barrier: rshutdown returns once every send of ours completed, so none is
        // left to fail when the peer dies (the connection stays up for reading).
        assert_eq!(rshutdown(fd, libc::SHUT_WR), 0);
        wait_for("accepted");
        child.kill().unwrap();
        child.wait().unwrap();

        let mut fds = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(rpoll(fds.as_mut_ptr(), 1, 60_000), 1, "no probe failed");
        assert_ne!(
            fds[0].revents & libc::POLLERR,
            0,
            "revents {:#x}",
            fds[0].revents
        );
        assert_eq!(
            rgetsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, pv, &mut vl),
            0
        );
        assert_eq!(v, libc::EIO);
        assert_eq!(rclose(fd), 0);
    }
}

fn ip(a: [u8; 4]) -> String {
    std::net::Ipv4Addr::from(a).to_string()
}
