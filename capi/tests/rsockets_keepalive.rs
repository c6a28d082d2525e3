//! SO_KEEPALIVE: a connected rsocket whose peer dies (SIGKILL: no exit handler, no
//! DREQ) and that sends nothing itself learns of it from its keepalive probe, which
//! completes in error: rpoll reports POLLERR and SO_ERROR says EIO. Without probes it
//! would wait for data forever (the rpoll's 60 s bound then fails the test).

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::io::{BufRead, BufReader};

use common::rsock::*;
use rdma_emu_ibverbs::*;

mod common;

const ROLE: &str = "RSOCKETS_KEEPALIVE_TEST_ROLE";
const SERVER: [u8; 4] = [127, 0, 0, 36];
const CLIENT: [u8; 4] = [127, 0, 0, 37];
const PORT: u16 = 7394;

/// The peer: accepts, says so, and waits to be killed.
unsafe fn server() -> ! {
    unsafe {
        let lfd = listener(SERVER, PORT);
        println!("listening");
        let fd = accept(lfd);
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
        unsafe { use_device(SERVER) };
        // SAFETY: the C ABI as a C program calls it.
        unsafe { server() };
    }
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { use_device(CLIENT) };
    let mut child = spawn_role("keepalive_probes_find_a_dead_peer", ROLE);
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
