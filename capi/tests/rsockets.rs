//! Stream rsockets through the C ABI, as a socket program calls them: a server in
//! this process and a client in a second run of this test binary (each process has
//! its own device and CM, as two programs do). Data both ways, byte-checked; O_NONBLOCK
//! (EAGAIN with nothing to read); rpoll over an rsocket and a pipe; EOF after the
//! peer's shutdown(SHUT_WR) and after its rclose; a refused connection; the options.

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::ffi::c_void;

use common::rsock::*;
use rdma_emu_ibverbs::*;

mod common;

const ROLE: &str = "RSOCKETS_TEST_ROLE";
const SERVER: [u8; 4] = [127, 0, 0, 31];
const CLIENT: [u8; 4] = [127, 0, 0, 32];
const PORT: u16 = 7391;
const LEN: usize = 4 << 20;

/// The bytes each side sends: a position-dependent pattern that differs by `seed`.
fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[i % 4] ^ seed)
        .collect()
}

unsafe fn client() -> ! {
    unsafe {
        // A port nobody listens on: the server's CM rejects the request. Blocking,
        // rconnect says so; non-blocking, it is under way (EINPROGRESS, unless the
        // answer was already there) and rpoll then reports the error.
        let fd = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "rsocket: errno {}", errno());
        let a = sin(SERVER, PORT + 1);
        assert_eq!(rconnect(fd, (&raw const a).cast(), 16), -1);
        assert_eq!(errno(), libc::ECONNREFUSED);
        assert_eq!(rclose(fd), 0);
        let fd = rsocket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
        assert!(fd >= 0, "rsocket: errno {}", errno());
        assert_eq!(rconnect(fd, (&raw const a).cast(), 16), -1);
        if errno() == libc::EINPROGRESS {
            let mut w = [libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            }];
            assert_eq!(rpoll(w.as_mut_ptr(), 1, -1), 1);
            assert_ne!(w[0].revents & libc::POLLERR, 0);
        } else {
            assert_eq!(errno(), libc::ECONNREFUSED);
        }
        let (mut v, mut vl) = (0i32, 4u32);
        let pv = (&raw mut v).cast();
        assert_eq!(
            rgetsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, pv, &mut vl),
            0
        );
        assert_eq!(v, libc::ECONNREFUSED);
        assert_eq!(rclose(fd), 0);

        let fd = connect(SERVER, PORT);
        // Written in pieces through the vector call, read back whole by the server.
        let data = pattern(0x5A);
        let (a, b) = data.split_at(LEN / 3);
        let iov = [
            libc::iovec {
                iov_base: a.as_ptr() as *mut c_void,
                iov_len: a.len(),
            },
            libc::iovec {
                iov_base: b.as_ptr() as *mut c_void,
                iov_len: b.len(),
            },
        ];
        assert_eq!(rwritev(fd, iov.as_ptr(), 2), LEN as isize);
        // Once the server's bytes flow, hold them a moment unread: its non-blocking
        // sends then fill our 128 KiB receive ring and meet EAGAIN, however fast the
        // link drains it (the shared-memory link, capi's default between processes of
        // one host, kept up with the sender when this read at once).
        let mut back = recv_all(fd, 1);
        std::thread::sleep(std::time::Duration::from_millis(200));
        back.extend(recv_all(fd, LEN - 1));
        assert!(back == pattern(0xA5), "the server's bytes differ");
        send_all(fd, b"z");
        assert_eq!(rshutdown(fd, libc::SHUT_WR), 0);
        // Sending after SHUT_WR fails; the server's rclose then ends the stream.
        assert_eq!(rsend(fd, b"y".as_ptr().cast(), 1, 0), -1);
        let mut c = [0u8; 8];
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 8, 0), 0);
        assert_eq!(rclose(fd), 0);
        println!("client done");
        std::process::exit(0);
    }
}

#[test]
fn stream_rsockets_move_data_both_ways() {
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
        assert_eq!(rsocket(libc::AF_INET, libc::SOCK_RAW, 0), -1);
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(rrecv(12345, std::ptr::null_mut(), 0, 0), -1);
        assert_eq!(errno(), libc::EBADF);

        let lfd = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(lfd >= 0);
        // The number is a real descriptor (rpoll and librspreload rely on it).
        assert!(libc::fcntl(lfd, libc::F_GETFD) >= 0);
        let one: i32 = 1;
        let p = (&raw const one).cast();
        assert_eq!(
            rsetsockopt(lfd, libc::SOL_SOCKET, libc::SO_REUSEADDR, p, 4),
            0
        );
        assert_eq!(
            rsetsockopt(lfd, libc::IPPROTO_TCP, libc::TCP_NODELAY, p, 4),
            0
        );
        assert_eq!(
            rsetsockopt(lfd, libc::SOL_SOCKET, libc::SO_BROADCAST, p, 4),
            -1
        );
        assert_eq!(errno(), libc::EOPNOTSUPP);
        let buf: i32 = 1 << 16;
        let pb = (&raw const buf).cast();
        assert_eq!(
            rsetsockopt(lfd, libc::SOL_SOCKET, libc::SO_RCVBUF, pb, 4),
            0
        );
        let (mut v, mut vl) = (0i32, 4u32);
        let pv = (&raw mut v).cast();
        assert_eq!(
            rgetsockopt(lfd, libc::SOL_SOCKET, libc::SO_RCVBUF, pv, &mut vl),
            0
        );
        assert_eq!(v, 1 << 17, "SO_RCVBUF is doubled, as librdmacm does");
        assert_eq!(
            rgetsockopt(lfd, libc::IPPROTO_TCP, libc::TCP_NODELAY, pv, &mut vl),
            0
        );
        assert_eq!(v, 1);

        bind_listen(lfd, SERVER, PORT);
        // Non-blocking and nobody connecting: EAGAIN.
        assert_eq!(rfcntl(lfd, libc::F_SETFL, libc::O_NONBLOCK), 0);
        assert_eq!(raccept(lfd, std::ptr::null_mut(), std::ptr::null_mut()), -1);
        assert_eq!(errno(), libc::EAGAIN);
        assert_eq!(rfcntl(lfd, libc::F_SETFL, 0), 0);

        let child = spawn_role("stream_rsockets_move_data_both_ways", ROLE);

        // rpoll says when the connection request is there.
        let mut lp = [libc::pollfd {
            fd: lfd,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(rpoll(lp.as_mut_ptr(), 1, -1), 1);
        assert_eq!(lp[0].revents, libc::POLLIN);
        let mut peer = sin([0; 4], 0);
        let mut plen = 16u32;
        let fd = raccept(lfd, (&raw mut peer).cast(), &mut plen);
        assert!(fd >= 0, "raccept: errno {}", errno());
        assert_eq!(peer.sin_addr.s_addr, u32::from_be_bytes(CLIENT).to_be());
        let mut me = sin([0; 4], 0);
        assert_eq!(rgetsockname(fd, (&raw mut me).cast(), &mut plen), 0);
        assert_eq!(u16::from_be(me.sin_port), PORT);

        let got = recv_all(fd, LEN);
        assert!(got == pattern(0x5A), "the client's bytes differ");

        // The client now waits for our bytes: nothing to read.
        assert_eq!(rfcntl(fd, libc::F_SETFL, libc::O_NONBLOCK), 0);
        assert_eq!(rfcntl(fd, libc::F_GETFL, 0), libc::O_NONBLOCK);
        let mut c = [0u8; 8];
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 8, 0), -1);
        assert_eq!(errno(), libc::EAGAIN);
        // rpoll over the rsocket and a pipe: only what is ready is reported.
        let mut pipe = [0i32; 2];
        assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
        let mut fds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN | libc::POLLOUT,
                revents: 0,
            },
            libc::pollfd {
                fd: pipe[0],
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        assert_eq!(rpoll(fds.as_mut_ptr(), 2, 0), 1);
        assert_eq!(fds[0].revents, libc::POLLOUT);
        assert_eq!(fds[1].revents, 0);
        assert_eq!(libc::write(pipe[1], b"p".as_ptr().cast(), 1), 1);
        fds[0].events = libc::POLLIN;
        assert_eq!(rpoll(fds.as_mut_ptr(), 2, -1), 1);
        assert_eq!((fds[0].revents, fds[1].revents), (0, libc::POLLIN));
        // rselect alike: the pipe is readable, the rsocket is not (but writable).
        let mut rd: libc::fd_set = std::mem::zeroed();
        let mut wr: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(fd, &mut rd);
        libc::FD_SET(pipe[0], &mut rd);
        libc::FD_SET(fd, &mut wr);
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        let n = rselect(
            fd.max(pipe[0]) + 1,
            &mut rd,
            &mut wr,
            std::ptr::null_mut(),
            &mut tv,
        );
        assert_eq!(n, 2);
        assert!(libc::FD_ISSET(pipe[0], &rd) && !libc::FD_ISSET(fd, &rd));
        assert!(libc::FD_ISSET(fd, &wr));

        // Our bytes, non-blocking: what does not fit now waits for rpoll's POLLOUT.
        let data = pattern(0xA5);
        let mut at = 0;
        let mut would_block = 0;
        while at < LEN {
            let k = rsend(fd, data[at..].as_ptr().cast(), LEN - at, 0);
            if k < 0 {
                assert_eq!(errno(), libc::EAGAIN);
                would_block += 1;
                let mut w = [libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                }];
                assert_eq!(rpoll(w.as_mut_ptr(), 1, -1), 1);
                continue;
            }
            at += k as usize;
        }
        assert!(
            would_block > 0,
            "4 MiB went out without filling a 128 KiB ring"
        );
        assert_eq!(rfcntl(fd, libc::F_SETFL, 0), 0);

        // The client's last byte, then its shutdown(SHUT_WR): readable, then EOF.
        fds[1].events = 0;
        assert_eq!(rpoll(fds.as_mut_ptr(), 1, -1), 1);
        assert_eq!(fds[0].revents & libc::POLLIN, libc::POLLIN);
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 8, 0), 1);
        assert_eq!(c[0], b'z');
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 8, 0), 0);
        // Our side still sends: rclose ends the stream for the client.
        assert_eq!(rclose(fd), 0);
        assert_eq!(rclose(lfd), 0);
        assert_eq!(rclose(fd), -1);
        assert_eq!(errno(), libc::EBADF);
        libc::close(pipe[0]);
        libc::close(pipe[1]);

        expect_done(child, "client done");
    }
}
