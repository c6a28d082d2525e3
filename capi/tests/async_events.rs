//! Two contexts of one device (UCX opens a device more than once): they share the
//! device's async event queue, and an event of one context's CQ must not reach the
//! other with a null element (UCX dereferenced it and died with SIGSEGV).

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::ptr::null_mut;

use rdma_emu_ibverbs::sys::*;
use rdma_emu_ibverbs::*;

mod common;

#[test]
fn another_contexts_event_never_arrives_with_a_null_element() {
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { std::env::set_var("RDMA_EMU_DEVICES", "emu0=127.0.0.73") };
    unsafe {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        assert_eq!(n, 1);
        let a = ibv_open_device(*list);
        let b = ibv_open_device(*list);
        ibv_free_device_list(list);
        assert!(!a.is_null() && !b.is_null());
        // A: a one-entry CQ, overrun by two flushed receives (CQ_ERR, manual 6.1.1).
        let pd = ibv_alloc_pd(a);
        let cq = ibv_create_cq(a, 1, null_mut(), null_mut(), 0);
        assert!(!pd.is_null() && !cq.is_null());
        let qp = common::rc_qp_in_init(pd, cq);
        let post_recv = (*a).ops.post_recv.unwrap();
        for id in 0..3 {
            let mut wr = ibv_recv_wr {
                wr_id: id,
                ..Default::default()
            };
            let mut bad = null_mut();
            assert_eq!(post_recv(qp, &mut wr, &mut bad), 0);
        }
        let mut err = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..Default::default()
        };
        assert_eq!(ibv_modify_qp(qp, &mut err, IBV_QP_STATE as i32), 0);
        // B, not waiting: every event it is given names an object (none is B's).
        let fd = (*b).async_fd;
        let flags = libc::fcntl(fd, libc::F_GETFL);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK), 0);
        for _ in 0..8 {
            let mut ev = ibv_async_event::default();
            if ibv_get_async_event(b, &mut ev) != 0 {
                break;
            }
            let element = ev.element.cq as *const u8;
            assert!(
                !element.is_null() || ev.event_type == IBV_EVENT_DEVICE_FATAL,
                "event {} with a null element",
                ev.event_type
            );
            ibv_ack_async_event(&mut ev);
        }
        assert_eq!(ibv_destroy_qp(qp), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_close_device(b), 0);
        assert_eq!(ibv_close_device(a), 0);
    }
}
