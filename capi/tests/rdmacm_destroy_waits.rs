//! `rdma_destroy_id` as librdmacm's: it waits until the program has acked every event
//! it was handed for the id (another thread may still be reading `event->id`), and
//! the events of the id not handed out yet go with it, so no later
//! `rdma_get_cm_event` names a freed id. rping (rdma-core 44) destroys its ids and
//! channel while its CM thread handles the last DISCONNECTED event.

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::rsock::{errno, sin};
use rdma_emu_ibverbs::sys::rdma as r;
use rdma_emu_ibverbs::*;

mod common;

/// Waits until the channel's fd is readable: an event is queued, not handed out.
unsafe fn wait_queued(ch: *mut r::rdma_event_channel) {
    let mut p = libc::pollfd {
        // SAFETY: a live channel (caller's contract).
        fd: unsafe { (*ch).fd },
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 10_000) }, 1, "no event came");
}

/// An id on `ch` resolving the address of a listener on `port`, its ADDR_RESOLVED
/// event queued.
unsafe fn resolving(ch: *mut r::rdma_event_channel, port: u16) -> *mut r::rdma_cm_id {
    let mut id = null_mut();
    // SAFETY: a live channel; `id` is written.
    unsafe {
        assert_eq!(rdma_create_id(ch, &mut id, null_mut(), r::RDMA_PS_TCP), 0);
        let mut dst = sin([127, 0, 0, 24], port);
        assert_eq!(
            rdma_resolve_addr(id, null_mut(), (&raw mut dst).cast(), 2000),
            0
        );
        wait_queued(ch);
    }
    id
}

#[test]
fn destroy_waits_for_the_ack_and_drops_the_events_not_handed_out() {
    // Read once, at the first call of the process.
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { std::env::set_var("RDMA_EMU_DEVICES", "emu0=127.0.0.24") };
    unsafe {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let mut listen = null_mut();
        assert_eq!(
            rdma_create_id(ch, &mut listen, null_mut(), r::RDMA_PS_TCP),
            0
        );
        let mut a = sin([127, 0, 0, 24], 7992);
        assert_eq!(rdma_bind_addr(listen, (&raw mut a).cast()), 0);
        assert_eq!(rdma_listen(listen, 1), 0);

        // Handed out, not acked: the destroy in another thread waits for the ack.
        let id = resolving(ch, 7992);
        let mut event = null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut event), 0);
        assert_eq!((*event).event, r::RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!((*event).id, id);
        let (started, done) = (AtomicBool::new(false), AtomicBool::new(false));
        std::thread::scope(|s| {
            let id = id as usize;
            let (started, done) = (&started, &done);
            let destroyer = s.spawn(move || {
                started.store(true, Ordering::SeqCst);
                // SAFETY: the live id made above, destroyed once.
                let r = rdma_destroy_id(id as *mut r::rdma_cm_id);
                done.store(true, Ordering::SeqCst);
                r
            });
            while !started.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(200));
            assert!(
                !done.load(Ordering::SeqCst),
                "rdma_destroy_id returned with an event of the id not acked"
            );
            // The program still reads the event's id, then acks.
            assert_eq!((*(*event).id).ps, r::RDMA_PS_TCP);
            assert_eq!(rdma_ack_cm_event(event), 0);
            assert_eq!(destroyer.join().unwrap(), 0);
        });

        // Queued, not handed out: it goes with the id, and the channel is empty.
        let id = resolving(ch, 7992);
        assert_eq!(rdma_destroy_id(id), 0);
        let flags = libc::fcntl((*ch).fd, libc::F_GETFL);
        assert_eq!(
            libc::fcntl((*ch).fd, libc::F_SETFL, flags | libc::O_NONBLOCK),
            0
        );
        let mut event = null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut event), -1);
        assert_eq!(errno(), libc::EAGAIN);

        assert_eq!(rdma_destroy_id(listen), 0);
        rdma_destroy_event_channel(ch);
    }
}
