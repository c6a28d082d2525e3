//! Loss, duplication and recovery on RC: retransmission after the local ACK timeout,
//! go-back-N after a PSN sequence error, implied NAKs, responder resources replaying
//! READs and ATOMICs, RNR, and the retry budgets (IBTA 9.7.5, 9.7.6).

mod util;

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use emu_wire::Opcode::{self, *};
use util::*;
use verbs_api::{AsyncEventType, QpState, WcStatus, WrOperation};

/// Drops the first packet with `opcode` sent by `from`.
fn drop_first(
    from: Side,
    opcode: Opcode,
) -> impl FnMut(Side, &emu_wire::PacketRepr, usize) -> Action {
    let mut done = false;
    move |side, repr, _| {
        if !done && side == from && repr.bth.opcode == opcode {
            done = true;
            Action::Drop
        } else {
            Action::Deliver
        }
    }
}

/// IBTA 9.7.6.1.3: a lost request is retransmitted when the local ACK timer expires.
#[test]
fn lost_request_is_retransmitted_after_ack_timeout() {
    let (mut p, a, b) = connected(Config::default());
    b.post_recv(&mut p, 1, 0, 64);
    p.set_rule(drop_first(Side::A, RcSendOnly));
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    assert_eq!(
        p.trace(),
        [
            "A->B RC_SEND_ONLY psn=100 [Drop]",
            "A->B RC_SEND_ONLY psn=100",
            "B->A RC_ACKNOWLEDGE psn=100 aeth=0x1f"
        ]
    );
    // timeout 14 = 4.096 us * 2^14 = 67.1 ms
    assert!(p.log[1].at >= Duration::from_micros(67_108));
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(b.poll(&mut p).len(), 1);
    assert_eq!(p.a.counters().ack_timeouts, 1);
}

/// IBTA 9.7.5.1.2: a lost ACK makes the requester resend; the responder sees a
/// duplicate, does not execute it again, and acknowledges it.
#[test]
fn lost_ack_makes_a_duplicate_that_is_reacked_not_reexecuted() {
    let (mut p, a, b) = connected(Config::default());
    b.post_recv(&mut p, 1, 0, 64);
    b.post_recv(&mut p, 2, 0, 64);
    p.set_rule(drop_first(Side::B, RcAcknowledge));
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    assert_eq!(p.b.counters().duplicate_requests, 1);
    assert_eq!(
        b.poll(&mut p).len(),
        1,
        "the duplicate must not consume a second receive"
    );
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
}

/// IBTA 9.7.5.1.1: a gap makes the responder send one PSN sequence error NAK; the
/// requester goes back to the NAK's PSN.
#[test]
fn psn_gap_gets_one_sequence_nak_and_go_back_n() {
    let (mut p, a, b) = connected(Config::default());
    let data = pattern(5000, 4);
    a.write_bytes(0, &data);
    p.set_rule(drop_first(Side::A, RcRdmaWriteMiddle));
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 5000)],
        ),
    );
    p.drive();
    let naks: Vec<_> = p.log.iter().filter(|r| r.syndrome == Some(0x60)).collect();
    assert_eq!(naks.len(), 1, "{:#?}", p.trace());
    assert_eq!(naks[0].psn, 101);
    assert_eq!(b.read_bytes(0, 5000), data);
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert!(p.b.counters().out_of_sequence >= 1);
}

/// IBTA 9.7.5.1.4: a lost READ response is detected by a later ACK (implied NAK) and
/// the READ is retried from the first missing response; the responder replays it from
/// its resources.
#[test]
fn lost_read_response_is_implied_nak_and_replayed() {
    let (mut p, a, b) = connected(Config::default());
    let data = pattern(3000, 8);
    b.write_bytes(0, &data);
    b.post_recv(&mut p, 1, 8192, 64);
    p.set_rule(drop_first(Side::B, RcRdmaReadResponseMiddle));
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::RdmaRead {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 3000)],
        ),
    );
    a.post_send(&mut p, signaled(2, WrOperation::Send, vec![a.sge(0, 4)]));
    p.drive();
    let t = p.trace();
    let retried: Vec<_> = t
        .iter()
        .filter(|l| l.starts_with("A->B RC_RDMA_READ_REQUEST"))
        .collect();
    assert_eq!(
        retried,
        [
            "A->B RC_RDMA_READ_REQUEST psn=100",
            "A->B RC_RDMA_READ_REQUEST psn=101"
        ],
        "{t:#?}"
    );
    assert_eq!(a.read_bytes(0, 3000), data);
    let sc = a.poll(&mut p);
    assert_eq!(
        sc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

/// IBTA 9.7.5.1.2: a duplicate ATOMIC is answered from the saved result, never
/// executed again.
#[test]
fn duplicate_atomic_is_answered_from_saved_result() {
    let (mut p, a, b) = connected(Config::default());
    b.buf.write_u64(0, 10).unwrap();
    p.set_rule(drop_first(Side::B, RcAtomicAcknowledge));
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::AtomicFetchAndAdd {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
                add: 5,
            },
            vec![a.sge(0, 8)],
        ),
    );
    p.drive();
    assert_eq!(b.buf.read_u64(0).unwrap(), 15, "executed once");
    assert_eq!(a.buf.read_u64(0).unwrap(), 10, "the saved original value");
    assert_eq!(p.opcodes(Side::A), [RcFetchAdd, RcFetchAdd]);
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
}

/// IBTA 9.7.5.1: the responder acknowledges only when asked, and ACKs not yet sent
/// coalesce: one ACK covers many messages.
#[test]
fn acks_coalesce() {
    let (mut p, a, b) = connected(Config::default());
    for i in 0..10 {
        a.post_send(
            &mut p,
            signaled(
                i,
                WrOperation::RdmaWrite {
                    remote_addr: b.mr.addr,
                    rkey: b.mr.rkey,
                },
                vec![a.sge(0, 16)],
            ),
        );
    }
    p.drive();
    let acks = p.opcodes(Side::B).len();
    assert_eq!(p.opcodes(Side::A).len(), 10);
    assert_eq!(acks, 1, "{:#?}", p.trace());
    assert_eq!(a.poll(&mut p).len(), 10);
}

/// IBTA 9.7.5.2.8: no receive WQE -> RNR NAK with min_rnr_timer; the requester waits
/// and retries; once a receive is posted the SEND completes.
#[test]
fn rnr_nak_then_success() {
    let (mut p, a, b) = connected(Config {
        min_rnr_timer: 14,
        ..Config::default()
    });
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive_for(Duration::from_micros(100));
    assert_eq!(
        p.trace(),
        [
            "A->B RC_SEND_ONLY psn=100",
            "B->A RC_ACKNOWLEDGE psn=100 aeth=0x2e"
        ]
    );
    b.post_recv(&mut p, 1, 0, 64);
    p.drive();
    // code 14 = 1.28 ms
    let resend = p.log.iter().filter(|r| r.from == Side::A).nth(1).unwrap();
    assert!(resend.at >= Duration::from_micros(1280), "{:?}", resend.at);
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::Success);
}

/// IBTA 9.7.5.2.8: when rnr_retry is spent the WQE completes with RNR_RETRY_EXC_ERR
/// and the QP moves to the error state, flushing the rest.
#[test]
fn rnr_retry_exhausted() {
    let (mut p, a, _b) = connected(Config {
        rnr_retry: 2,
        ..Config::default()
    });
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    a.post_send(&mut p, signaled(2, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    let rnr_naks = p
        .log
        .iter()
        .filter(|r| r.syndrome.is_some_and(|s| s & 0x60 == 0x20))
        .count();
    assert_eq!(rnr_naks, 3, "initial + 2 retries: {:#?}", p.trace());
    let sc = a.poll(&mut p);
    assert_eq!(
        sc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(a.state(&mut p), QpState::Err);
}

/// IBTA 9.7.6.1.4: when every request is lost, retry_cnt retransmissions later the WQE
/// completes with RETRY_EXC_ERR and nothing after it executes.
#[test]
fn retry_exhausted_when_the_peer_is_gone() {
    let (mut p, a, b) = connected(Config {
        retry_cnt: 3,
        ..Config::default()
    });
    b.post_recv(&mut p, 1, 0, 64);
    p.set_rule(|side, _, _| {
        if side == Side::A {
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    a.post_send(&mut p, signaled(2, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    let sends = p.opcodes(Side::A).len();
    assert_eq!(
        sends,
        2 * 4,
        "two packets, sent once and retried 3 times: {:#?}",
        p.trace()
    );
    let sc = a.poll(&mut p);
    assert_eq!(
        sc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(a.state(&mut p), QpState::Err);
    assert!(b.poll(&mut p).is_empty());
    assert!(
        a.events(&mut p).is_empty(),
        "retry exhaustion is reported by the completion only"
    );
}

/// A packet that both acknowledges a SEND and fails the QP reports the SEND as a
/// success and the failure on the WR that failed (IBTA 10.8: in order).
#[test]
fn errors_land_on_the_failing_wr_not_an_acked_one() {
    let (mut p, a, b) = connected(Config {
        retry_cnt: 0,
        ..Config::default()
    });
    b.post_recv(&mut p, 1, 0, 64);
    // Drop B's ACK of the SEND; the READ response then acknowledges the SEND, and
    // arrives missing its first packet so the READ cannot finish.
    p.set_rule(|side, repr, _| {
        if side == Side::B && matches!(repr.bth.opcode, RcAcknowledge | RcRdmaReadResponseFirst) {
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    a.post_send(
        &mut p,
        signaled(
            2,
            WrOperation::RdmaRead {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 3000)],
        ),
    );
    p.drive();
    let sc = a.poll(&mut p);
    assert_eq!(
        sc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::RetryExcErr)]
    );
}

/// Duplicated and delayed packets (reordering) still deliver every message once.
#[test]
fn duplicates_and_reordering_deliver_exactly_once() {
    let (mut p, a, b) = connected(Config {
        mtu: verbs_api::Mtu::Mtu256,
        ..Config::default()
    });
    let data = pattern(4000, 2);
    a.write_bytes(0, &data);
    for i in 0..4 {
        b.post_recv(&mut p, i, i * 4096, 4096);
    }
    let n = Rc::new(Cell::new(0u32));
    let n2 = n.clone();
    p.set_rule(move |_, _, i| {
        n2.set(n2.get() + 1);
        match i % 7 {
            2 => Action::Duplicate,
            5 => Action::Delay(Duration::from_micros(30)),
            _ => Action::Deliver,
        }
    });
    for i in 0..4 {
        a.post_send(&mut p, signaled(i, WrOperation::Send, vec![a.sge(0, 4000)]));
    }
    p.drive();
    let rc = b.poll(&mut p);
    assert_eq!(
        rc.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        (0..4)
            .map(|i| (i, WcStatus::Success, 4000))
            .collect::<Vec<_>>()
    );
    for i in 0..4 {
        assert_eq!(b.read_bytes(i * 4096, 4000), data);
    }
    assert_eq!(a.poll(&mut p).len(), 4);
    assert!(n.get() > 64);
}

/// Manual 3.5: an RTR QP raises COMM_EST when its first packet arrives.
#[test]
fn comm_est_on_first_packet_in_rtr() {
    let cfg = Config::default();
    let mut p = Engines::default();
    let a = setup(&mut p.a, Side::A, &cfg);
    let b = setup(&mut p.b, Side::B, &cfg);
    let now = p.now;
    bring_up(
        &mut p.a,
        now,
        a.qpn,
        Remote {
            qpn: b.qpn,
            gid: gid(Side::B),
            psn: 0,
        },
        0,
        &cfg,
    );
    // B only to RTR.
    let mut attr = verbs_api::QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: cfg.access,
        ..Default::default()
    };
    use verbs_api::QpAttrMask as M;
    p.b.modify_qp(
        now,
        b.qpn,
        &attr,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    attr.qp_state = QpState::Rtr;
    attr.path_mtu = cfg.mtu;
    attr.dest_qp_num = a.qpn;
    attr.max_dest_rd_atomic = 1;
    attr.ah_attr.is_global = true;
    attr.ah_attr.grh.dgid = gid(Side::A);
    p.b.modify_qp(
        now,
        b.qpn,
        &attr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .unwrap();
    b.post_recv(&mut p, 1, 0, 64);
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    let ev = b.events(&mut p);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].event_type, AsyncEventType::CommEst);
    assert_eq!(ev[0].element, verbs_api::EventElement::Qp(b.qpn));
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::Success);
}

/// IBTA 9.7.6.1.3: an ACK that leaves requests outstanding restarts the local ACK
/// timer, so a lost later request is resent one full timeout after that ACK, not at
/// the deadline armed when it was posted; once everything is acknowledged no timer is
/// left (the engine's timer index updates lazily and must still be exact).
#[test]
fn ack_restarts_the_ack_timer_and_the_last_ack_stops_it() {
    let (mut p, a, b) = connected(Config::default());
    for id in 1..=3 {
        b.post_recv(&mut p, id, 0, 64);
    }
    // The third request waits on the wire, then is lost: the first one's ACK comes
    // back while it is outstanding.
    let mut seen = 0;
    p.set_rule(move |side, repr, _| {
        if side == Side::A && repr.bth.opcode == RcSendOnly {
            seen += 1;
            if seen == 3 {
                return Action::Drop;
            }
        }
        Action::Deliver
    });
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    p.advance(Duration::from_millis(20));
    assert_eq!(a.poll(&mut p).len(), 1);
    let armed = p.a.poll_timeout().is_none();
    assert!(armed, "no timer once the only request is acknowledged");
    a.post_send(&mut p, signaled(2, WrOperation::Send, vec![a.sge(0, 8)]));
    a.post_send(&mut p, signaled(3, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    let t: Vec<_> = p.trace();
    assert_eq!(
        t[2..],
        [
            "A->B RC_SEND_ONLY psn=101",
            "A->B RC_SEND_ONLY psn=102 [Drop]",
            "B->A RC_ACKNOWLEDGE psn=101 aeth=0x1f",
            "A->B RC_SEND_ONLY psn=102",
            "B->A RC_ACKNOWLEDGE psn=102 aeth=0x1f"
        ]
    );
    // timeout 14 = 67.108864 ms from the ACK of psn 101 (which arrived one wire
    // latency after psn 101 left), not from the post.
    let ack = p.log[4].at + p.latency;
    let resend = p.log[5].at;
    assert!(
        resend >= ack + Duration::from_nanos(67_108_864),
        "{resend:?} {ack:?}"
    );
    assert!(
        resend < ack + Duration::from_millis(68),
        "{resend:?} {ack:?}"
    );
    assert_eq!(a.poll(&mut p).len(), 2);
    assert_eq!(p.a.poll_timeout(), None);
    assert_eq!(p.b.poll_timeout(), None);
    assert_eq!(p.a.counters().ack_timeouts, 1);
}

/// A QP destroyed with its ACK timer armed leaves no timer behind: its entry in the
/// engine's lazy timer index goes with it, and nothing fires later.
#[test]
fn a_destroyed_qp_takes_its_ack_timer_along() {
    let (mut p, a, b) = connected(Config::default());
    b.post_recv(&mut p, 1, 0, 64);
    // Every request is lost: the ACK timer stays armed.
    p.set_rule(|side, _, _| {
        if side == Side::A {
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    p.advance(Duration::from_millis(1));
    assert!(p.a.poll_timeout().is_some());
    p.a.destroy_qp(a.qpn).unwrap();
    assert_eq!(p.a.poll_timeout(), None);
    p.advance(Duration::from_secs(1));
    assert_eq!(p.a.counters().ack_timeouts, 0);
}
