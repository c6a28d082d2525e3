//! riomap / riowrite between two processes (this test binary run twice): the server
//! maps a buffer for the peer's writes, the client writes into it with riowrite and
//! then sends one byte; RC ordering puts the written bytes in place before that byte
//! arrives, so the server checks them as soon as it reads it. The client then exits
//! with its rsocket open, and the server reads EOF (the exit handler's DREQ).

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::ffi::c_void;

use common::rsock::*;
use rdma_emu_ibverbs::*;

mod common;

const ROLE: &str = "RSOCKETS_IOMAP_TEST_ROLE";
const SERVER: [u8; 4] = [127, 0, 0, 33];
const CLIENT: [u8; 4] = [127, 0, 0, 34];
const PORT: u16 = 7392;
/// The mapping's size and where it starts in the offset space.
const LEN: usize = 300_000;
const BASE: i64 = 1 << 20;
/// `SOL_RDMA` / `RDMA_IOMAPSIZE` (`<rdma/rsocket.h>`).
const SOL_RDMA: i32 = 0x10000;
const RDMA_IOMAPSIZE: i32 = 3;

fn pattern() -> Vec<u8> {
    (0..LEN).map(|i| (i * 7 + i / 251) as u8).collect()
}

unsafe fn iomap_size(fd: i32, n: i32) {
    let p = (&raw const n).cast();
    assert_eq!(
        unsafe { rsetsockopt(fd, SOL_RDMA, RDMA_IOMAPSIZE, p, 4) },
        0
    );
}

unsafe fn client() -> ! {
    unsafe {
        let fd = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        iomap_size(fd, 2);
        let a = sin(SERVER, PORT);
        assert_eq!(
            rconnect(fd, (&raw const a).cast(), 16),
            0,
            "errno {}",
            errno()
        );
        // The server's mapping arrives before its first byte.
        let mut c = [0u8; 1];
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 1, 0), 1);
        let data = pattern();
        let mut at = 0usize;
        while at < LEN {
            let n = riowrite(
                fd,
                data[at..].as_ptr().cast(),
                LEN - at,
                BASE + at as i64,
                0,
            );
            assert!(n as isize > 0, "riowrite: errno {}", errno());
            at += n;
        }
        // Past the mapping's end nothing is written.
        assert_eq!(
            riowrite(fd, data.as_ptr().cast(), 16, BASE + LEN as i64, 0),
            0
        );
        assert_eq!(rsend(fd, b"w".as_ptr().cast(), 1, 0), 1);
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 1, 0), 1);
        assert_eq!(c[0], b'k');
        // Exit with the rsocket open: the exit handler ends the connection, as the
        // kernel does when a process's rdma_cm file closes.
        println!("client done");
        std::process::exit(0);
    }
}

#[test]
fn riowrite_lands_in_the_peers_mapping() {
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
        let lfd = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(lfd >= 0);
        iomap_size(lfd, 2);
        bind_listen(lfd, SERVER, PORT);
        let child = spawn_role("riowrite_lands_in_the_peers_mapping", ROLE);
        let fd = accept(lfd);

        let mut buf = vec![0u8; LEN];
        let p = buf.as_mut_ptr().cast::<c_void>();
        // Read-only mappings are not riomap's (librdmacm: PROT_WRITE or PROT_NONE).
        assert_eq!(riomap(fd, p, LEN, libc::PROT_READ, 0, BASE), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(riomap(fd, p, LEN, libc::PROT_WRITE, 0, BASE), BASE);
        // The mapping goes out with this byte.
        assert_eq!(rsend(fd, b"m".as_ptr().cast(), 1, 0), 1);
        let mut c = [0u8; 1];
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 1, 0), 1);
        assert_eq!(c[0], b'w');
        assert!(buf == pattern(), "the riowrite bytes differ");
        assert_eq!(riounmap(fd, p, LEN - 1), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(riounmap(fd, p, LEN), 0);
        // The client exits without rclose: EOF all the same.
        assert_eq!(rsend(fd, b"k".as_ptr().cast(), 1, 0), 1);
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 1, 0), 0);
        assert_eq!(rclose(fd), 0);
        assert_eq!(rclose(lfd), 0);
        expect_done(child, "client done");
    }
}
