//! A non-blocking `raccept` says EAGAIN until the connection is established, as
//! librdmacm's does. The peer here is a plain CM id without a QP that sends
//! rsockets' connection data: the CM then stops at CONNECT_RESPONSE (the REP came)
//! and sends the RTU only when the program calls `rdma_establish`, so the moment
//! between the listener's answer and the established connection is held open for
//! as long as the test likes. Meanwhile the listener is not readable in `rpoll`
//! (readable means a request for `raccept` to answer, or an established connection);
//! after `rdma_establish` it is, and `raccept` hands out the connection.

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::ptr::null_mut;

use common::rsock::*;
use rdma_emu_ibverbs::sys::rdma as r;
use rdma_emu_ibverbs::*;

mod common;

const IP: [u8; 4] = [127, 0, 0, 41];
const PORT: u16 = 7398;

/// The next CM event of `ch`, which must be `want`, acknowledged.
unsafe fn expect(ch: *mut r::rdma_event_channel, want: r::rdma_cm_event_type) {
    unsafe {
        let mut ev = null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), 0, "errno {}", errno());
        assert_eq!((*ev).event, want, "status {}", (*ev).status);
        assert_eq!(rdma_ack_cm_event(ev), 0);
    }
}

/// rsockets' connection data (version 1, 16 receive credits, a target SGL and a
/// receive buffer that this peer will never use).
fn conn_data() -> [u8; 40] {
    let mut b = [0u8; 40];
    b[0] = 1;
    b[2..4].copy_from_slice(&16u16.to_be_bytes());
    b[8..16].copy_from_slice(&0x1000u64.to_be_bytes());
    b[20..24].copy_from_slice(&2u32.to_be_bytes());
    b[24..32].copy_from_slice(&0x2000u64.to_be_bytes());
    b[36..40].copy_from_slice(&4096u32.to_be_bytes());
    b
}

#[test]
fn nonblocking_raccept_waits_for_the_established_connection() {
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { use_device(IP) };
    // SAFETY: the C ABI as a C program calls it.
    unsafe {
        let lfd = rsocket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
        assert!(lfd >= 0);
        bind_listen(lfd, IP, PORT);
        assert_eq!(raccept(lfd, null_mut(), null_mut()), -1);
        assert_eq!(errno(), libc::EAGAIN);

        let ch = rdma_create_event_channel();
        let mut id = null_mut();
        assert_eq!(rdma_create_id(ch, &mut id, null_mut(), r::RDMA_PS_TCP), 0);
        let mut dst = sin(IP, PORT);
        assert_eq!(
            rdma_resolve_addr(id, null_mut(), (&raw mut dst).cast(), 2000),
            0
        );
        expect(ch, r::RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!(rdma_resolve_route(id, 2000), 0);
        expect(ch, r::RDMA_CM_EVENT_ROUTE_RESOLVED);
        let data = conn_data();
        let mut param = r::rdma_conn_param {
            private_data: data.as_ptr().cast(),
            private_data_len: data.len() as u8,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0x1234,
        };
        assert_eq!(rdma_connect(id, &mut param), 0, "errno {}", errno());

        // raccept answers the request (rpoll says it is there) but has no connection
        // to hand out while the RTU has not come.
        let mut answered = false;
        for _ in 0..200 {
            assert_eq!(raccept(lfd, null_mut(), null_mut()), -1);
            assert_eq!(errno(), libc::EAGAIN);
            let mut p = [libc::pollfd {
                fd: lfd,
                events: libc::POLLIN,
                revents: 0,
            }];
            rpoll(p.as_mut_ptr(), 1, 5);
            let mut ev = null_mut();
            let mut pf = libc::pollfd {
                fd: (*ch).fd,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut pf, 1, 0) == 1 {
                assert_eq!(rdma_get_cm_event(ch, &mut ev), 0);
                assert_eq!((*ev).event, r::RDMA_CM_EVENT_CONNECT_RESPONSE);
                assert_eq!(rdma_ack_cm_event(ev), 0);
                answered = true;
                break;
            }
        }
        assert!(answered, "no REP for the request");
        // Still not established: still EAGAIN, however often asked, and the
        // listener is not readable.
        for _ in 0..20 {
            assert_eq!(raccept(lfd, null_mut(), null_mut()), -1);
            assert_eq!(errno(), libc::EAGAIN);
            let mut p = [libc::pollfd {
                fd: lfd,
                events: libc::POLLIN,
                revents: 0,
            }];
            assert_eq!(rpoll(p.as_mut_ptr(), 1, 1), 0);
        }

        assert_eq!(rdma_establish(id), 0, "errno {}", errno());
        let mut p = [libc::pollfd {
            fd: lfd,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(
            rpoll(p.as_mut_ptr(), 1, 10_000),
            1,
            "the listener never became readable"
        );
        let mut peer = sin([0; 4], 0);
        let mut pl = 16u32;
        let fd = raccept(lfd, (&raw mut peer).cast(), &mut pl);
        assert!(fd >= 0, "raccept: errno {}", errno());
        assert_eq!(peer.sin_addr.s_addr, u32::from_be_bytes(IP).to_be());
        // Nothing else is waiting.
        assert_eq!(raccept(lfd, null_mut(), null_mut()), -1);
        assert_eq!(errno(), libc::EAGAIN);

        // The peer leaves: the accepted rsocket reads EOF.
        assert_eq!(rdma_disconnect(id), 0);
        assert_eq!(rfcntl(fd, libc::F_SETFL, 0), 0);
        let mut c = [0u8; 1];
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 1, 0), 0);
        assert_eq!(rclose(fd), 0);
        assert_eq!(rclose(lfd), 0);
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}

/// A client that connects, sends three bytes and closes at once: the server, polling
/// its non-blocking listener, accepts, closes the listener, and still reads the
/// bytes and then EOF (ncat's server under librspreload does this).
#[test]
fn an_accepted_connection_keeps_what_came_before_raccept() {
    // SAFETY: set before any call reads it; the other test sets the same value.
    unsafe { use_device(IP) };
    // SAFETY: the C ABI as a C program calls it.
    unsafe {
        let lfd = rsocket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
        assert!(lfd >= 0);
        bind_listen(lfd, IP, PORT + 1);
        let client = std::thread::spawn(|| {
            let fd = connect(IP, PORT + 1);
            send_all(fd, b"abc");
            assert_eq!(rclose(fd), 0);
        });
        // As a program does: rpoll, then raccept, again on EAGAIN (a request the
        // first raccept answered).
        let fd = loop {
            let mut p = [libc::pollfd {
                fd: lfd,
                events: libc::POLLIN,
                revents: 0,
            }];
            assert_eq!(rpoll(p.as_mut_ptr(), 1, 10_000), 1);
            let fd = raccept(lfd, null_mut(), null_mut());
            if fd >= 0 {
                break fd;
            }
            assert_eq!(errno(), libc::EAGAIN);
        };
        assert_eq!(rclose(lfd), 0);
        client.join().unwrap();
        let mut got = Vec::new();
        loop {
            let mut p = [libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            }];
            assert_eq!(rpoll(p.as_mut_ptr(), 1, 10_000), 1, "no data and no EOF");
            let mut b = [0u8; 16];
            let n = rrecv(fd, b.as_mut_ptr().cast(), 16, 0);
            if n == 0 {
                break;
            }
            if n < 0 {
                assert_eq!(errno(), libc::EAGAIN);
                continue;
            }
            got.extend_from_slice(&b[..n as usize]);
        }
        assert_eq!(got, b"abc");
        assert_eq!(rclose(fd), 0);
    }
}
