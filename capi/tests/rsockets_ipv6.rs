//! rsockets over IPv6: a device on ::1, both ends of a stream rsocket in one process
//! (AF_INET6: connect, accept with the peer's `sockaddr_in6`, data both ways, EOF),
//! then two datagram rsockets exchanging datagrams with `sockaddr_in6` sources.

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use common::rsock::*;
use rdma_emu_ibverbs::*;

mod common;

const PORT: u16 = 7397;
const LEN6: u32 = std::mem::size_of::<libc::sockaddr_in6>() as u32;

#[test]
fn rsockets_run_over_ipv6() {
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { std::env::set_var("RDMA_EMU_DEVICES", "emu0=::1") };
    // SAFETY: the C ABI as a C program calls it.
    unsafe {
        let lfd = rsocket(libc::AF_INET6, libc::SOCK_STREAM, 0);
        assert!(lfd >= 0, "rsocket: errno {}", errno());
        let a = sin6_loopback(PORT);
        assert_eq!(rbind(lfd, (&raw const a).cast(), LEN6), 0, "{}", errno());
        assert_eq!(rlisten(lfd, 1), 0);
        let server = std::thread::spawn(move || {
            let mut peer = sin6_loopback(0);
            let mut pl = LEN6;
            let fd = raccept(lfd, (&raw mut peer).cast(), &mut pl);
            assert!(fd >= 0, "raccept: errno {}", errno());
            assert_eq!(pl, LEN6);
            assert_eq!(c_int_of(peer.sin6_family), libc::AF_INET6);
            assert_eq!(
                peer.sin6_addr.s6_addr,
                std::net::Ipv6Addr::LOCALHOST.octets()
            );
            let mut b = recv_all(fd, 50_000);
            b.reverse();
            send_all(fd, &b);
            assert_eq!(rclose(fd), 0);
            assert_eq!(rclose(lfd), 0);
        });
        let fd = rsocket(libc::AF_INET6, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        assert_eq!(rconnect(fd, (&raw const a).cast(), LEN6), 0, "{}", errno());
        let mut me = sin6_loopback(0);
        let mut ml = LEN6;
        assert_eq!(rgetpeername(fd, (&raw mut me).cast(), &mut ml), 0);
        assert_eq!((ml, u16::from_be(me.sin6_port)), (LEN6, PORT));
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        send_all(fd, &data);
        let back = recv_all(fd, data.len());
        let mut want = data.clone();
        want.reverse();
        assert!(back == want, "the echo differs");
        let mut c = [0u8; 1];
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 1, 0), 0);
        assert_eq!(rclose(fd), 0);
        server.join().unwrap();

        // Datagrams: b learns a's address from the first one and answers it.
        let da = rsocket(libc::AF_INET6, libc::SOCK_DGRAM, 0);
        let db = rsocket(libc::AF_INET6, libc::SOCK_DGRAM, 0);
        assert!(da >= 0 && db >= 0, "rsocket: errno {}", errno());
        let (aa, ab) = (sin6_loopback(PORT + 1), sin6_loopback(PORT + 2));
        assert_eq!(rbind(da, (&raw const aa).cast(), LEN6), 0, "{}", errno());
        assert_eq!(rbind(db, (&raw const ab).cast(), LEN6), 0, "{}", errno());
        let mut buf = [0u8; 64];
        for i in 0..3u8 {
            let m = [i; 20];
            let n = rsendto(
                da,
                m.as_ptr().cast(),
                m.len(),
                0,
                (&raw const ab).cast(),
                LEN6,
            );
            assert_eq!(n, 20, "rsendto: errno {}", errno());
            let mut from = sin6_loopback(0);
            let mut fl = LEN6;
            let n = rrecvfrom(
                db,
                buf.as_mut_ptr().cast(),
                64,
                0,
                (&raw mut from).cast(),
                &mut fl,
            );
            assert_eq!(n, 20, "rrecvfrom: errno {}", errno());
            assert_eq!(&buf[..20], &m);
            assert_eq!((fl, u16::from_be(from.sin6_port)), (LEN6, PORT + 1));
            let r = [i + 100; 7];
            let n = rsendto(db, r.as_ptr().cast(), 7, 0, (&raw const from).cast(), fl);
            assert_eq!(n, 7, "rsendto back: errno {}", errno());
            let n = rrecvfrom(
                da,
                buf.as_mut_ptr().cast(),
                64,
                0,
                (&raw mut from).cast(),
                &mut fl,
            );
            assert_eq!(n, 7);
            assert_eq!(&buf[..7], &r);
            assert_eq!(u16::from_be(from.sin6_port), PORT + 2);
        }
        assert_eq!(rclose(da), 0);
        assert_eq!(rclose(db), 0);
    }
}

fn c_int_of(f: libc::sa_family_t) -> i32 {
    i32::from(f)
}
