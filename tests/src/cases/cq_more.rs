//! Completion queues and channels beyond the basics of `cq` (manual 3.3.7-3.3.11
//! ibv_create_cq, ibv_resize_cq, ibv_destroy_cq, ibv_create_comp_channel; 3.6.7-3.6.9
//! ibv_req_notify_cq, ibv_get_cq_event; IBTA 11.4.2): resizing below what a CQ
//! holds, the limits of `cqe`, an overrun of a CQ fed by both queues of a QP, several
//! CQs on one channel, events that pile up, upgrading a solicited-only request, events
//! left unread at destroy, and no events that were not asked for.
//!
//! google/rdma-unit-test checks the same conditions (`cq_test.cc` NegativeCqe, MaxCqe,
//! ShareChannel, CqOverflowTest.SendSharedCqOverflow; `comp_channel_test.cc`
//! MuxOntoSingleChannel, ManyOutstanding, UpgradeRequest, DowngradeRequest,
//! DeleteWithUnacked, NoSpuriousEvents). The cases of `comp_vector` make a CQ on each
//! completion vector the context has, and on vectors past them.

use std::time::Duration;

use verbs_api::{
    AsyncEventType, ChannelId, CqId, EventElement, MrInfo, QpType, RecvWr, SendWr, Sge,
    WcStatus as S,
};

use super::{assert_errno, errno::EINVAL};
use crate::{Case, Env, Outcome};

/// ETIMEDOUT: `get_cq_event` found no event in its time.
const ETIMEDOUT: i32 = 110;

/// How long a case waits to be sure that no event comes.
const QUIET: Duration = Duration::from_millis(50);

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("cq::resize_below_its_queued_completions_is_einval", "manual 3.3.8 ibv_resize_cq (cqe must be at least the number of completions the CQ holds; kernel rxe_cq_chk_attr): resizing a CQ holding 8 completions to 4 fails (EINVAL) and the 8 are still there, in order; once polled, the same resize succeeds", resize_below));
    v.push(Case::new("cq::resize_keeps_its_queued_completions", "manual 3.3.8 ibv_resize_cq (the CQ keeps its completions): shrinking a CQ of 256 holding 8 completions to 16 keeps all 8, in order, and 16 more then fit", resize_keeps));
    v.push(Case::param("cq::resize_to_0_is_einval", "manual 3.3.8 ibv_resize_cq (cqe at least 1, as for ibv_create_cq): resizing to 0 entries fails (EINVAL) and the CQ still works", resize_bad, 0));
    v.push(Case::param("cq::resize_above_max_cqe_is_einval", "manual 3.3.8 ibv_resize_cq, 3.3.1 (max_cqe bounds every CQ): resizing above the device's max_cqe fails (EINVAL) and the CQ still works", resize_bad, 1));
    v.push(Case::new("cq::create_with_max_cqe_succeeds", "manual 3.3.7 ibv_create_cq, 3.3.1 max_cqe (the largest CQ the device makes): a CQ of exactly max_cqe entries is created (google/rdma-unit-test CqTest.MaxCqe)", create_max));
    v.push(Case::new("cq::cqe_of_minus_1_is_einval", "manual 3.3.7 ibv_create_cq (cqe is an int: -1 reaches the device as 0xFFFFFFFF, above max_cqe): the create fails (EINVAL) (google/rdma-unit-test CqTest.NegativeCqe)", create_minus_one));
    v.push(Case::new("cq::every_comp_vector_delivers_events", "manual 3.3.7 ibv_create_cq (comp_vector: any from 0 to the context's num_comp_vectors - 1), 3.6.8 ibv_get_cq_event: the context has at least one vector, and an armed CQ made on each (up to 16) raises its event for a completion", every_vector));
    v.push(Case::param("cq::comp_vector_of_num_comp_vectors_is_einval", "manual 3.3.7 ibv_create_cq (comp_vector must be below num_comp_vectors; the kernel's ib_uverbs_create_cq refuses it with EINVAL): a CQ on vector num_comp_vectors is not made", bad_vector, 0));
    v.push(Case::param("cq::comp_vector_of_minus_1_is_einval", "manual 3.3.7 ibv_create_cq (comp_vector is an int; a negative one names no vector: EINVAL): a CQ on vector -1 is not made", bad_vector, 1));
    v.push(Case::new("cq::overrun_of_a_cq_fed_by_both_queues_raises_cq_err", "manual 6.1.1 IBV_EVENT_CQ_ERR, 3.4.3 (send_cq and recv_cq may be one CQ): a CQ that takes both the send and the receive completions of a QP overruns when they outnumber its entries, and IBV_EVENT_CQ_ERR names it (google/rdma-unit-test CqOverflowTest.SendSharedCqOverflow)", shared_overrun).event(AsyncEventType::CqErr));
    v.push(Case::new("cq::one_channel_serves_several_cqs", "manual 3.3.10 ibv_create_comp_channel (one channel may serve several CQs), 3.6.8 ibv_get_cq_event (it returns the CQ the event is for): four armed CQs on one channel each raise one event naming it, and no fifth comes (google/rdma-unit-test MuxOntoSingleChannel)", several_cqs));
    v.push(Case::new("cq::events_pile_up_until_read", "manual 3.6.7-3.6.9 (each arming yields at most one event, which waits on the channel until read): 100 rounds of arming and completing without reading the channel leave between 1 and 100 events, each naming the CQ, then none (google/rdma-unit-test ManyOutstanding)", many_outstanding));
    v.push(Case::param("cq::solicited_only_request_upgraded_to_any", "manual 3.6.7 ibv_req_notify_cq, IBTA 11.4.2.2 (a request for the next completion includes the solicited ones): a CQ armed solicited-only and then for any completion raises an event for an unsolicited receive (google/rdma-unit-test UpgradeRequest)", notify_change, 0));
    v.push(Case::param("cq::any_request_not_downgraded_by_solicited_only", "manual 3.6.7, IBTA 11.4.2.2 (once armed for the next completion a CQ stays so until it fires): a CQ armed for any completion and then solicited-only still raises an event for an unsolicited receive (google/rdma-unit-test DowngradeRequest; kernel rxe_req_notify_cq keeps IB_CQ_NEXT_COMP)", notify_change, 1));
    v.push(Case::new("cq::solicited_only_fires_on_an_error_completion", "IBTA 11.4.2.2 (a solicited-only request is satisfied by a solicited completion or one in error), manual 3.6.7: a receive flushed by moving its QP to ERR raises the event of a CQ armed solicited-only", solicited_error).wc(S::WrFlushErr));
    v.push(Case::new("cq::destroy_drops_its_unread_event", "manual 3.3.9 ibv_destroy_cq, 3.6.9 ibv_ack_cq_events (only events read from the channel need acknowledging): a CQ whose event was never read is destroyed, its event goes with it (the channel has none), and the channel can then be destroyed (google/rdma-unit-test DeleteWithUnacked)", destroy_unread));
    v.push(Case::new("cq::no_spurious_event_when_rearmed", "manual 3.6.7 (an armed CQ signals the next completion, not the ones before), IBTA 11.4.2.2: after an event is read and a later completion polled unarmed, arming again raises nothing until a new completion, which raises one (google/rdma-unit-test NoSpuriousEvents)", no_spurious));
    v.push(Case::new("cq::arming_over_queued_completions_waits_for_the_next", "manual 3.6.7 ibv_req_notify_cq (the event is for the next completion added to the CQ), IBTA 11.4.2.2: arming a CQ that already holds an unpolled completion raises nothing until another completion arrives", arm_over_queued));
}

/// An 8-byte RDMA WRITE through `mr` (local and remote), wr_id `id`.
fn write(mr: &MrInfo, id: u64) -> SendWr {
    let sge = Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    SendWr::rdma_write(id, vec![sge], mr.addr + 64, mr.rkey).signaled()
}

/// Lets `d` pass: polls a CQ that never gets anything (the virtual clock moves).
fn let_pass(env: &Env, d: Duration) {
    let idle = env.cq(1);
    env.assert_no_completion(idle, d);
    env.dev.destroy_cq(idle).expect("destroy_cq");
}

/// Asserts that the channel has no event within [`QUIET`].
#[track_caller]
fn assert_no_event(env: &Env, ch: ChannelId) {
    assert_errno(env.dev.get_cq_event(ch, Some(QUIET)), ETIMEDOUT);
}

fn next_event(env: &Env, ch: ChannelId) -> CqId {
    env.dev
        .get_cq_event(ch, Some(crate::env::WAIT))
        .expect("a CQ event")
}

/// Posts 8 WRITEs on a pair's requester and waits until their completions are queued
/// (none polled).
fn eight_queued(env: &Env) -> crate::env::Pair {
    let p = env.pair(QpType::Rc);
    for i in 0..8 {
        let wr = SendWr::rdma_write(i, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey);
        env.post_send(p.a.qpn, wr.signaled());
    }
    let_pass(env, Duration::from_millis(200));
    p
}

#[track_caller]
fn poll_ids(env: &Env, cq: CqId, ids: std::ops::Range<u64>) {
    for i in ids {
        let wc = env.poll_one(cq);
        assert_eq!((wc.wr_id, wc.status), (i, S::Success), "{wc:?}");
    }
}

fn resize_below(env: &Env) -> Outcome {
    let p = eight_queued(env);
    assert_errno(env.dev.resize_cq(p.a.cq, 4), EINVAL);
    poll_ids(env, p.a.cq, 0..8);
    env.assert_no_completion(p.a.cq, Duration::from_millis(10));
    env.dev.resize_cq(p.a.cq, 4).expect("resize_cq once empty");
    Outcome::Pass
}

fn resize_keeps(env: &Env) -> Outcome {
    let p = eight_queued(env);
    env.dev.resize_cq(p.a.cq, 16).expect("resize_cq to 16");
    poll_ids(env, p.a.cq, 0..8);
    for i in 8..24 {
        let wr = SendWr::rdma_write(i, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey);
        env.post_send(p.a.qpn, wr.signaled());
    }
    let_pass(env, Duration::from_millis(200));
    poll_ids(env, p.a.cq, 8..24);
    Outcome::Pass
}

fn resize_bad(env: &Env, above: u64) -> Outcome {
    let p = env.pair(QpType::Rc);
    let cqe = if above == 1 {
        let max = env.dev.query_device().expect("query_device").max_cqe;
        max.saturating_add(1)
    } else {
        0
    };
    assert_errno(env.dev.resize_cq(p.a.cq, cqe), EINVAL);
    let wr = SendWr::rdma_write(1, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey);
    env.post_send(p.a.qpn, wr.signaled());
    poll_ids(env, p.a.cq, 1..2);
    Outcome::Pass
}

fn create_max(env: &Env) -> Outcome {
    let max = env.dev.query_device().expect("query_device").max_cqe;
    let cq = env
        .dev
        .create_cq(max, None)
        .expect("create_cq with max_cqe");
    env.dev.destroy_cq(cq).expect("destroy_cq");
    Outcome::Pass
}

fn create_minus_one(env: &Env) -> Outcome {
    assert_errno(env.dev.create_cq(-1i32 as u32, None), EINVAL);
    Outcome::Pass
}

fn shared_overrun(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(8);
    let qpn = env.loop_qp(pd, cq);
    let (_buf, mr) = env.mr(pd, 4096, crate::env::all_access());
    let sge = |off: u64| Sge {
        addr: mr.addr + off,
        length: 8,
        lkey: mr.lkey,
    };
    // 40 receives and 40 signaled SENDs: 80 completions, half from each queue.
    for i in 0..40 {
        let posted = env
            .dev
            .post_recv(qpn, &[RecvWr::new(100 + i, vec![sge(1024 + i * 8)])])
            .and_then(|()| {
                env.dev
                    .post_send(qpn, &[SendWr::send(i, vec![sge(0)]).signaled()])
            });
        if posted.is_err() {
            break; // the QP already went to ERR
        }
    }
    loop {
        let ev = env.next_event();
        match (ev.event_type, ev.element) {
            (AsyncEventType::CqErr, EventElement::Cq(c)) => {
                assert_eq!(c, cq.0, "CQ_ERR of another CQ");
                break;
            }
            (AsyncEventType::QpFatal, EventElement::Qp(q)) => assert_eq!(q, qpn),
            other => panic!("unexpected event {other:?}"),
        }
    }
    Outcome::Pass
}

fn every_vector(env: &Env) -> Outcome {
    let n = env.dev.num_comp_vectors();
    assert!(n >= 1, "num_comp_vectors is {n}");
    let ch = env.dev.create_comp_channel().expect("create_comp_channel");
    let pd = env.pd();
    let (_buf, mr) = env.mr(pd, 4096, crate::env::all_access());
    for v in 0..n.min(16) {
        let cq = env
            .dev
            .create_cq_with_vector(16, Some(ch), v)
            .unwrap_or_else(|e| panic!("create_cq on vector {v} of {n}: {e}"));
        let qpn = env.loop_qp(pd, cq);
        env.dev.req_notify_cq(cq, false).expect("req_notify_cq");
        env.post_send(qpn, write(&mr, u64::from(v)));
        assert_eq!(next_event(env, ch), cq, "the event of the CQ on vector {v}");
        assert_eq!(env.poll_one(cq).status, S::Success);
    }
    assert_no_event(env, ch);
    Outcome::Pass
}

fn bad_vector(env: &Env, which: u64) -> Outcome {
    let v = match which {
        0 => env.dev.num_comp_vectors(),
        _ => -1i32 as u32,
    };
    assert_errno(env.dev.create_cq_with_vector(16, None, v), EINVAL);
    Outcome::Pass
}

fn several_cqs(env: &Env) -> Outcome {
    let ch = env.dev.create_comp_channel().expect("create_comp_channel");
    let pd = env.pd();
    let (_buf, mr) = env.mr(pd, 4096, crate::env::all_access());
    let cqs: Vec<CqId> = (0..4)
        .map(|_| env.dev.create_cq(16, Some(ch)).expect("create_cq"))
        .collect();
    for (i, &cq) in cqs.iter().enumerate() {
        let qpn = env.loop_qp(pd, cq);
        env.dev.req_notify_cq(cq, false).expect("req_notify_cq");
        env.post_send(qpn, write(&mr, i as u64));
    }
    let mut got: Vec<CqId> = (0..4).map(|_| next_event(env, ch)).collect();
    got.sort();
    let mut want = cqs.clone();
    want.sort();
    assert_eq!(got, want, "one event per CQ");
    assert_no_event(env, ch);
    for &cq in &cqs {
        assert_eq!(env.poll_one(cq).status, S::Success);
    }
    Outcome::Pass
}

fn many_outstanding(env: &Env) -> Outcome {
    let (ch, cq, qpn, _buf, mr) = env.self_loop();
    for i in 0..100 {
        env.dev.req_notify_cq(cq, false).expect("req_notify_cq");
        env.post_send(qpn, write(&mr, i));
        assert_eq!(env.poll_one(cq).wr_id, i);
    }
    let mut n = 0;
    while let Ok(c) = env.dev.get_cq_event(ch, Some(QUIET)) {
        assert_eq!(c, cq, "an event for another CQ");
        n += 1;
        assert!(n <= 100, "more events than armings");
    }
    assert!(n >= 1, "no event at all");
    Outcome::Pass
}

/// 0: armed solicited-only, then for any; 1: for any, then solicited-only. An
/// unsolicited receive must raise the event either way.
fn notify_change(env: &Env, order: u64) -> Outcome {
    let (ch, cq, qpn, _buf, mr) = env.self_loop();
    for solicited in [order == 0, order == 1] {
        env.dev.req_notify_cq(cq, solicited).expect("req_notify_cq");
    }
    let sge = |off: u64| Sge {
        addr: mr.addr + off,
        length: 8,
        lkey: mr.lkey,
    };
    env.post_recv(qpn, RecvWr::new(2, vec![sge(1024)]));
    // Unsignaled: only the receive completes.
    env.post_send(qpn, SendWr::send(1, vec![sge(0)]));
    assert_eq!(next_event(env, ch), cq);
    let wc = env.poll_one(cq);
    assert_eq!((wc.wr_id, wc.status), (2, S::Success), "{wc:?}");
    Outcome::Pass
}

fn solicited_error(env: &Env) -> Outcome {
    let (ch, cq, qpn, _buf, mr) = env.self_loop();
    let sge = Sge {
        addr: mr.addr,
        length: 64,
        lkey: mr.lkey,
    };
    env.post_recv(qpn, RecvWr::new(3, vec![sge]));
    env.dev.req_notify_cq(cq, true).expect("req_notify_cq");
    env.to_err(qpn);
    assert_eq!(next_event(env, ch), cq);
    let wc = env.poll_one(cq);
    assert_eq!((wc.wr_id, wc.status), (3, S::WrFlushErr), "{wc:?}");
    Outcome::Pass
}

fn destroy_unread(env: &Env) -> Outcome {
    let (ch, cq, qpn, _buf, mr) = env.self_loop();
    env.dev.req_notify_cq(cq, false).expect("req_notify_cq");
    env.post_send(qpn, write(&mr, 1));
    assert_eq!(env.poll_one(cq).wr_id, 1);
    let_pass(env, Duration::from_millis(20));
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    env.dev
        .destroy_cq(cq)
        .expect("destroy_cq with its event unread");
    assert_no_event(env, ch);
    env.dev
        .destroy_comp_channel(ch)
        .expect("destroy_comp_channel");
    Outcome::Pass
}

fn no_spurious(env: &Env) -> Outcome {
    let (ch, cq, qpn, _buf, mr) = env.self_loop();
    env.dev.req_notify_cq(cq, false).expect("req_notify_cq");
    env.post_send(qpn, write(&mr, 1));
    assert_eq!(env.poll_one(cq).wr_id, 1);
    assert_eq!(next_event(env, ch), cq);
    env.post_send(qpn, write(&mr, 2));
    assert_eq!(env.poll_one(cq).wr_id, 2);
    assert_no_event(env, ch);
    env.dev.req_notify_cq(cq, false).expect("req_notify_cq");
    assert_no_event(env, ch);
    env.post_send(qpn, write(&mr, 3));
    assert_eq!(next_event(env, ch), cq);
    assert_eq!(env.poll_one(cq).wr_id, 3);
    Outcome::Pass
}

fn arm_over_queued(env: &Env) -> Outcome {
    let (ch, cq, qpn, _buf, mr) = env.self_loop();
    env.post_send(qpn, write(&mr, 1));
    let_pass(env, Duration::from_millis(100));
    env.dev.req_notify_cq(cq, false).expect("req_notify_cq");
    assert_no_event(env, ch);
    env.post_send(qpn, write(&mr, 2));
    assert_eq!(next_event(env, ch), cq);
    for id in [1, 2] {
        assert_eq!(env.poll_one(cq).wr_id, id);
    }
    Outcome::Pass
}
