//! `rdma_cm_id` pointers are checked before they are read: a destroyed id, or
//! memory that never was an id, gets -1/EINVAL instead of a crash. perftest 4.5-0.17
//! passes freed ids when it retries a rejected connection (`rdma_cm_destroy_cma`
//! frees its node array, then the retry reads the ids from it).

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::ptr::null_mut;

use rdma_emu_ibverbs::sys::rdma as r;
use rdma_emu_ibverbs::*;

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

#[test]
fn stale_and_foreign_id_pointers_get_einval() {
    // Read once, at the first call of the process.
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { std::env::set_var("RDMA_EMU_DEVICES", "emu0=127.0.0.23") };
    unsafe {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let mut id = null_mut();
        assert_eq!(rdma_create_id(ch, &mut id, null_mut(), r::RDMA_PS_TCP), 0);
        let mut a = sin([127, 0, 0, 23], 7990);
        assert_eq!(rdma_bind_addr(id, (&raw mut a).cast()), 0);
        assert_ne!(rdma_get_src_port(id), 0);
        assert_eq!(rdma_destroy_id(id), 0);

        // The destroyed id: every call refuses it.
        let mut dst = sin([127, 0, 0, 23], 7991);
        assert_eq!(
            rdma_resolve_addr(id, null_mut(), (&raw mut dst).cast(), 100),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_listen(id, 1), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_destroy_id(id), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_get_src_port(id), 0);
        rdma_destroy_qp(id);

        // Bytes that never were an id (what a freed array holds: heap garbage).
        let mut junk = vec![0xA5u8; 4096];
        let fake = junk.as_mut_ptr().cast::<r::rdma_cm_id>();
        assert_eq!(rdma_resolve_route(fake, 100), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_get_dst_port(fake), 0);
        // A pointer into no mapping at all (reading it would be SIGSEGV).
        let wild = std::ptr::without_provenance_mut::<r::rdma_cm_id>(0x10);
        assert_eq!(rdma_resolve_route(wild, 100), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_connect(wild, null_mut()), -1);
        assert_eq!(rdma_destroy_id(wild), -1);

        // A live id still works, and the channel is free again.
        let mut id2 = null_mut();
        assert_eq!(rdma_create_id(ch, &mut id2, null_mut(), r::RDMA_PS_TCP), 0);
        assert_eq!(rdma_bind_addr(id2, (&raw mut a).cast()), 0);
        assert_eq!(rdma_listen(id2, 1), 0);
        // A listener with a channel gets its requests as events: rdma_get_request is
        // for synchronous ids only (EINVAL, as librdmacm; it would wait forever).
        let mut child = null_mut();
        assert_eq!(rdma_get_request(id2, &mut child), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert!(child.is_null());
        // rdma_destroy_ep on an id with no QP (rdma_server's listener) destroys the
        // id and is no error: errno untouched.
        *libc::__errno_location() = 0;
        rdma_destroy_ep(id2);
        assert_eq!(errno(), 0);
        assert_eq!(rdma_destroy_id(id2), -1);
        assert_eq!(errno(), libc::EINVAL);
        rdma_destroy_event_channel(ch);
    }
}
