//! A signal handler and a blocking `ibv_get_cq_event`, as libibverbs' read(2) of the
//! channel behaves (signal(7)): a handler installed without `SA_RESTART` ends the wait
//! with `EINTR` (qperf's timed tests end so: their `SIGALRM` breaks the wait for a
//! message that will never come), one with `SA_RESTART` does not. Its own test binary:
//! signal dispositions belong to the whole process.

// This test plays the C program: raw pointers and signal handlers are its whole point.
#![allow(unsafe_code)]

use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use rdma_emu_ibverbs::sys::*;
use rdma_emu_ibverbs::*;

mod common;

static HANDLED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_alarm(_: libc::c_int) {
    HANDLED.fetch_add(1, Ordering::SeqCst);
}

/// Installs `on_alarm` for SIGALRM with `flags`.
unsafe fn handle_sigalrm(flags: libc::c_int) {
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as libc::sighandler_t;
        act.sa_flags = flags;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGALRM, &act, null_mut()), 0);
    }
}

/// Sends SIGALRM to thread `target` after `after`, from another thread.
fn alarm_thread(target: libc::pthread_t, after: Duration) -> std::thread::JoinHandle<()> {
    // pthread_t is an integer on Linux: it crosses to the other thread by value.
    std::thread::spawn(move || {
        std::thread::sleep(after);
        // SAFETY: `target` is the test's thread, alive until it joins this one.
        assert_eq!(unsafe { libc::pthread_kill(target, libc::SIGALRM) }, 0);
    })
}

/// The test's QP, handed to helper threads (it outlives them: they are joined first).
#[derive(Clone, Copy)]
struct Qp(*mut ibv_qp);
// SAFETY: the QP is thread-safe, as libibverbs' are; see `Qp`.
unsafe impl Send for Qp {}

/// Makes a completion on the QP's CQ: the QP (in INIT) goes to ERR and a receive is
/// posted, which is flushed (IBTA 10.3.1: WRs posted in ERR complete with
/// WR_FLUSH_ERR).
fn flush_a_receive(qp: Qp) {
    let mut err = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    let mut wr = ibv_recv_wr {
        wr_id: 7,
        ..Default::default()
    };
    let mut bad = null_mut();
    // SAFETY: a live QP (see `Qp`); post_recv is what the inline ibv_post_recv calls.
    unsafe {
        assert_eq!(ibv_modify_qp(qp.0, &mut err, IBV_QP_STATE as i32), 0);
        let post_recv = (*(*qp.0).context).ops.post_recv.unwrap();
        assert_eq!(post_recv(qp.0, &mut wr, &mut bad), 0);
    }
}

/// Flushes a receive after `after` unless told first through the sender.
fn rescue_after(after: Duration, qp: Qp) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        if rx.recv_timeout(after).is_err() {
            flush_a_receive(qp);
        }
    });
    (tx, t)
}

#[test]
fn a_handler_without_sa_restart_interrupts_get_cq_event_and_one_with_it_does_not() {
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { std::env::set_var("RDMA_EMU_DEVICES", "emu0=127.0.0.72") };
    unsafe {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        assert_eq!(n, 1);
        let ctx = ibv_open_device(*list);
        ibv_free_device_list(list);
        assert!(!ctx.is_null());
        let ch = ibv_create_comp_channel(ctx);
        let cq = ibv_create_cq(ctx, 8, null_mut(), ch, 0);
        let pd = ibv_alloc_pd(ctx);
        assert!(!ch.is_null() && !cq.is_null() && !pd.is_null());
        let qp = common::rc_qp_in_init(pd, cq);
        let qp = Qp(qp);
        let req_notify = (*ctx).ops.req_notify_cq.unwrap();
        assert_eq!(req_notify(cq, 0), 0);
        let me = libc::pthread_self();
        let (mut ecq, mut ectx) = (null_mut(), null_mut());

        // Without SA_RESTART: the wait ends with EINTR, soon after the signal.
        handle_sigalrm(0);
        let t = alarm_thread(me, Duration::from_millis(100));
        // Were the signal ignored, an event after 5 s ends the wait (and the test).
        let (done, rescuer) = rescue_after(Duration::from_secs(5), qp);
        let rc = ibv_get_cq_event(ch, &mut ecq, &mut ectx);
        let errno = *libc::__errno_location();
        let _ = done.send(());
        t.join().unwrap();
        rescuer.join().unwrap();
        assert_eq!((rc, errno), (-1, libc::EINTR));
        assert_eq!(HANDLED.load(Ordering::SeqCst), 1);

        // With SA_RESTART: the handler runs and the wait goes on until the event.
        handle_sigalrm(libc::SA_RESTART);
        let t = alarm_thread(me, Duration::from_millis(100));
        let poster = std::thread::spawn(move || {
            while HANDLED.load(Ordering::SeqCst) < 2 {
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(100));
            flush_a_receive(qp);
        });
        let rc = ibv_get_cq_event(ch, &mut ecq, &mut ectx);
        t.join().unwrap();
        poster.join().unwrap();
        assert_eq!(rc, 0, "errno {}", *libc::__errno_location());
        assert_eq!(ecq, cq);
        assert_eq!(HANDLED.load(Ordering::SeqCst), 2);
        ibv_ack_cq_events(cq, 1);
        let poll_cq = (*ctx).ops.poll_cq.unwrap();
        let mut wc = ibv_wc::default();
        assert_eq!(poll_cq(cq, 1, &mut wc), 1);
        assert_eq!((wc.wr_id, wc.status), (7, IBV_WC_WR_FLUSH_ERR));

        assert_eq!(ibv_destroy_qp(qp.0), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_destroy_comp_channel(ch), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}
