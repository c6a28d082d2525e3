//! Both ends of a stream rsocket in one process on one device (a program that
//! connects to itself): connect, data both ways, EOF.

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use common::rsock::*;
use rdma_emu_ibverbs::*;

mod common;

const IP: [u8; 4] = [127, 0, 0, 35];
const PORT: u16 = 7393;

#[test]
fn one_process_connects_to_itself() {
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { use_device(IP) };
    // SAFETY: the C ABI as a C program calls it.
    unsafe {
        let lfd = listener(IP, PORT);
        let server = std::thread::spawn(move || {
            let fd = accept(lfd);
            let mut b = vec![0u8; 100_000];
            let mut at = 0;
            while at < b.len() {
                let n = rrecv(fd, b[at..].as_mut_ptr().cast(), b.len() - at, 0);
                assert!(n > 0);
                at += n as usize;
            }
            b.reverse();
            assert_eq!(rsend(fd, b.as_ptr().cast(), b.len(), 0), b.len() as isize);
            assert_eq!(rclose(fd), 0);
            assert_eq!(rclose(lfd), 0);
        });
        let fd = connect(IP, PORT);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        assert_eq!(
            rsend(fd, data.as_ptr().cast(), data.len(), 0),
            data.len() as isize
        );
        let mut back = vec![0u8; data.len()];
        let mut at = 0;
        while at < back.len() {
            let n = rrecv(fd, back[at..].as_mut_ptr().cast(), back.len() - at, 0);
            assert!(n > 0);
            at += n as usize;
        }
        let mut want = data.clone();
        want.reverse();
        assert!(back == want);
        let mut c = [0u8; 1];
        assert_eq!(rrecv(fd, c.as_mut_ptr().cast(), 1, 0), 0);
        assert_eq!(rclose(fd), 0);
        server.join().unwrap();
    }
}
