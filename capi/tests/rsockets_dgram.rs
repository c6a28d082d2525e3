//! Datagram rsockets through the C ABI: a server in this process and a client in a
//! second run of this test binary, each with its own device. The client connects
//! (its first datagram goes over UDP, which tells the server its QP; the answers
//! then go as UD SENDs), datagrams go both ways byte-checked with their source
//! addresses, a burst queues up to be read, rpoll reports readiness, MSG_PEEK
//! leaves a datagram in place, a long one is EMSGSIZE, non-blocking receives say
//! EAGAIN, and the options go where librdmacm puts them.

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use common::rsock::*;
use rdma_emu_ibverbs::sys::rdma as r;
use rdma_emu_ibverbs::*;

mod common;

const ROLE: &str = "RSOCKETS_DGRAM_TEST_ROLE";
const SERVER: [u8; 4] = [127, 0, 0, 38];
const CLIENT: [u8; 4] = [127, 0, 0, 39];
const PORT: u16 = 7395;
/// Datagrams of the burst (fewer than the receive queue holds).
const BURST: usize = 40;

/// Datagram `i` of `len` bytes.
fn dgram(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 31 + i * 7) as u8).collect()
}

unsafe fn recv_from(fd: i32, buf: &mut [u8]) -> (usize, r::sockaddr_in) {
    let mut from = sin([0; 4], 0);
    let mut fl = std::mem::size_of::<r::sockaddr_in>() as u32;
    let n = unsafe {
        rrecvfrom(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            (&raw mut from).cast(),
            &mut fl,
        )
    };
    assert!(n >= 0, "rrecvfrom: errno {}", errno());
    assert_eq!(fl, 16);
    (n as usize, from)
}

unsafe fn client() -> ! {
    unsafe {
        let fd = rsocket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0, "rsocket: errno {}", errno());
        // Not connected yet: no peer, and rsend has nowhere to go.
        let mut a = sin([0; 4], 0);
        let mut al = 16u32;
        assert_eq!(rgetpeername(fd, (&raw mut a).cast(), &mut al), -1);
        assert_eq!(errno(), libc::ENOTCONN);
        assert_eq!(rsend(fd, b"x".as_ptr().cast(), 1, 0), -1);
        assert_eq!(errno(), libc::EDESTADDRREQ);
        let srv = sin(SERVER, PORT);
        assert_eq!(rconnect(fd, (&raw const srv).cast(), 16), 0, "{}", errno());
        // The UDP socket was bound to this process's device address.
        assert_eq!(rgetsockname(fd, (&raw mut a).cast(), &mut al), 0);
        assert_eq!(a.sin_addr.s_addr, u32::from_be_bytes(CLIENT).to_be());
        assert_ne!(a.sin_port, 0);
        assert_eq!(rgetpeername(fd, (&raw mut a).cast(), &mut al), 0);
        assert_eq!(u16::from_be(a.sin_port), PORT);

        // Ping-pong: every size up to the largest datagram.
        let mut buf = vec![0u8; 4096];
        for (i, len) in [1usize, 64, 1000, 2040].into_iter().enumerate() {
            let d = dgram(i, len);
            assert_eq!(rsend(fd, d.as_ptr().cast(), len, 0), len as isize);
            let (n, from) = recv_from(fd, &mut buf);
            assert_eq!(u16::from_be(from.sin_port), PORT);
            assert_eq!(from.sin_addr.s_addr, u32::from_be_bytes(SERVER).to_be());
            let mut want = d.clone();
            want.reverse();
            assert!(buf[..n] == want[..], "echo of {len} bytes differs");
        }
        // One byte more than a message slot holds.
        let big = dgram(0, 2041);
        assert_eq!(rsend(fd, big.as_ptr().cast(), big.len(), 0), -1);
        assert_eq!(errno(), libc::EMSGSIZE);

        // A burst, then the server's one answer.
        for i in 0..BURST {
            let d = dgram(i, 100 + i);
            assert_eq!(rsend(fd, d.as_ptr().cast(), d.len(), 0), d.len() as isize);
        }
        let mut p = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(rpoll(p.as_mut_ptr(), 1, -1), 1);
        assert_eq!(p[0].revents, libc::POLLIN);
        let mut c = [0u8; 8];
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 8, 0), 2);
        assert_eq!(&c[..2], b"ok");
        assert_eq!(rclose(fd), 0);
        println!("client done");
        std::process::exit(0);
    }
}

#[test]
fn datagram_rsockets_exchange_datagrams() {
    if std::env::var_os(ROLE).is_some() {
        // SAFETY: the second run of this test binary; read once at the first call.
        unsafe { use_device(CLIENT) };
        // SAFETY: the C ABI as a C program calls it.
        unsafe { client() };
    }
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { use_device(SERVER) };
    // SAFETY: the C ABI as a C program calls it.
    unsafe {
        // What librdmacm refuses.
        assert_eq!(
            rsocket(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_TCP),
            -1
        );
        assert_eq!(errno(), libc::EOPNOTSUPP);
        let fd = rsocket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0, "rsocket: errno {}", errno());
        // The number is the UDP socket's descriptor.
        assert!(libc::fcntl(fd, libc::F_GETFD) >= 0);
        assert_eq!(rlisten(fd, 1), -1);
        assert_eq!(errno(), libc::EOPNOTSUPP);
        // The stream-only calls.
        let mut m = [0u8; 64];
        assert_eq!(
            riomap(fd, m.as_mut_ptr().cast(), 64, libc::PROT_WRITE, 0, -1),
            -1
        );
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(raccept(fd, std::ptr::null_mut(), std::ptr::null_mut()), -1);
        assert_eq!(errno(), libc::EOPNOTSUPP);
        // SO_RCVBUF as rsockets keeps it (doubled); SOL_RDMA's queue sizes.
        let v: i32 = 1 << 16;
        let pv = (&raw const v).cast();
        assert_eq!(rsetsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, pv, 4), 0);
        let (mut g, mut gl) = (0i32, 4u32);
        let pg = (&raw mut g).cast();
        assert_eq!(
            rgetsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, pg, &mut gl),
            0
        );
        assert_eq!(g, 1 << 17);
        let a = sin(SERVER, PORT);
        assert_eq!(rbind(fd, (&raw const a).cast(), 16), 0, "{}", errno());
        // 128 KiB of 2 KiB slots: 64 receives.
        assert_eq!(rgetsockopt(fd, 0x10000, 1, pg, &mut gl), 0);
        assert_eq!(g, 64);
        // Non-blocking and nothing there: EAGAIN.
        let mut buf = vec![0u8; 4096];
        assert_eq!(
            rrecv(fd, buf.as_mut_ptr().cast(), 8, libc::MSG_DONTWAIT),
            -1
        );
        assert_eq!(errno(), libc::EAGAIN);

        let child = spawn_role("datagram_rsockets_exchange_datagrams", ROLE);
        let mut peer = None;
        for i in 0..4 {
            // The first one looked at, then read.
            let mut pk = [0u8; 1];
            let n = rrecv(fd, pk.as_mut_ptr().cast(), 1, libc::MSG_PEEK);
            assert_eq!(n, 1, "errno {}", errno());
            let (n, from) = recv_from(fd, &mut buf);
            assert_eq!(from.sin_addr.s_addr, u32::from_be_bytes(CLIENT).to_be());
            assert_eq!(pk[0], buf[0]);
            assert!(buf[..n] == dgram(i, n)[..], "datagram {i} differs");
            assert!(peer.is_none_or(|p: r::sockaddr_in| p.sin_port == from.sin_port));
            peer = Some(from);
            let mut back = buf[..n].to_vec();
            back.reverse();
            let sent = rsendto(fd, back.as_ptr().cast(), n, 0, (&raw const from).cast(), 16);
            assert_eq!(sent, n as isize);
        }
        // The burst: every datagram, in order; a short buffer truncates one.
        let peer = peer.unwrap();
        for i in 0..BURST {
            let len = if i == 3 { 10 } else { buf.len() };
            let (n, from) = recv_from(fd, &mut buf[..len]);
            assert_eq!(from.sin_port, peer.sin_port);
            let want = dgram(i, 100 + i);
            assert!(buf[..n] == want[..n.min(want.len())], "burst {i} differs");
            assert_eq!(n, if i == 3 { 10 } else { want.len() });
        }
        let sent = rsendto(
            fd,
            b"ok".as_ptr().cast(),
            2,
            0,
            (&raw const peer).cast(),
            16,
        );
        assert_eq!(sent, 2);
        expect_done(child, "client done");
        assert_eq!(rclose(fd), 0);
        assert_eq!(rclose(fd), -1);
        assert_eq!(errno(), libc::EBADF);
    }
}
