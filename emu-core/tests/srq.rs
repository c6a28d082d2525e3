//! Shared receive queues: the SRQ verbs (manual 3.4.5-3.4.7, 3.6.2, 3.6.6), QPs that
//! draw their receive WQEs from one SRQ, the SRQ limit event and the Last WQE Reached
//! event (manual 6.1.16, 6.1.17; IBTA 10.2.9, 11.6.3).

mod util;

use std::time::Duration;

use emu_core::engine::{Engine, SrqAttr, SrqAttrMask};
use util::*;
use verbs_api::{
    AsyncEvent, AsyncEventType, EventElement, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr,
    SendFlags, SendWr, Sge, WcOpcode, WcStatus, WrOperation,
};
use verbs_api::{QpInitAttr, SrqId};

const EINVAL: i32 = 22;
const ENOMEM: i32 = 12;
const EBUSY: i32 = 16;

fn recv(wr_id: u64, sg_list: Vec<Sge>) -> RecvWr {
    RecvWr::new(wr_id, sg_list)
}

fn srq_cfg() -> Config {
    Config {
        srq: true,
        ..Config::default()
    }
}

/// A second QP on `node`'s engine, sharing its PD, CQ, buffer and SRQ (if any).
fn second_qp(p: &mut Engines, node: &Node, cfg: &Config) -> Node {
    let qpn = p
        .engine(node.side)
        .create_qp(QpInitAttr::new(node.pd, node.cq, cfg.qp_type, cfg.cap).srq(node.srq))
        .unwrap();
    Node {
        qpn,
        ..node.clone()
    }
}

/// Two connections A1<->B1 and A2<->B2; B1 and B2 receive from one SRQ.
fn two_on_one_srq() -> (Engines, [Node; 2], [Node; 2]) {
    let cfg = srq_cfg();
    let (mut p, a1, b1) = connected(cfg);
    let a_cfg = Config { srq: false, ..cfg };
    let a2 = second_qp(&mut p, &a1, &a_cfg);
    let b2 = second_qp(&mut p, &b1, &cfg);
    let now = p.now;
    let to_b2 = Remote {
        qpn: b2.qpn,
        gid: gid(Side::B),
        psn: cfg.sq_psn[1],
    };
    let to_a2 = Remote {
        qpn: a2.qpn,
        gid: gid(Side::A),
        psn: cfg.sq_psn[0],
    };
    bring_up(&mut p.a, now, a2.qpn, to_b2, cfg.sq_psn[0], &a_cfg);
    bring_up(&mut p.b, now, b2.qpn, to_a2, cfg.sq_psn[1], &cfg);
    (p, [a1, a2], [b1, b2])
}

fn srq_events(events: &[AsyncEvent]) -> Vec<AsyncEvent> {
    events
        .iter()
        .filter(|e| matches!(e.element, EventElement::Srq(_)))
        .copied()
        .collect()
}

fn limit_event(srq: SrqId) -> AsyncEvent {
    AsyncEvent {
        event_type: AsyncEventType::SrqLimitReached,
        element: EventElement::Srq(srq.0),
    }
}

/// Manual 3.4.5 and 3.6.6: receive WQEs posted to an SRQ are consumed by whichever
/// associated QP needs one next, oldest first; each completion names the QP that
/// consumed the WQE (`qp_num`) and the sender (`src_qp`), and goes to that QP's CQ.
#[test]
fn two_qps_take_wqes_from_one_srq_in_posting_order() {
    let (mut p, [a1, a2], [b1, b2]) = two_on_one_srq();
    let srq = b1.srq.unwrap();
    for i in 0..4u64 {
        b1.post_srq_recv(&mut p, 10 + i, 1000 * i, 64);
    }
    assert_eq!(p.b.srq_len(srq), 4);
    // Alternate senders, one message at a time so the order is the arrival order.
    let senders = [(&a1, b1.qpn), (&a2, b2.qpn), (&a2, b2.qpn), (&a1, b1.qpn)];
    for (i, (a, _)) in senders.iter().enumerate() {
        let msg = format!("message {i}");
        a.write_bytes(100 * i, msg.as_bytes());
        a.post_send(
            &mut p,
            send(i as u64, a.sge(100 * i as u64, msg.len() as u32)),
        );
        p.drive();
    }
    let wcs = b1.poll(&mut p);
    assert_eq!(wcs.len(), 4);
    for (i, wc) in wcs.iter().enumerate() {
        let (a, qpn) = senders[i];
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.qp_num, wc.src_qp),
            (10 + i as u64, WcStatus::Success, WcOpcode::Recv, qpn, a.qpn),
            "completion {i}"
        );
        let msg = format!("message {i}");
        assert_eq!(wc.byte_len, msg.len() as u32);
        assert_eq!(b1.read_bytes(1000 * i, msg.len()), msg.as_bytes());
    }
    assert_eq!(p.b.srq_len(srq), 0);
}

/// IBTA 9.7.5.2.8 with an SRQ (manual 3.6.6): an RDMA WRITE with immediate takes a
/// receive WQE from the SRQ for its completion, as a SEND does; a plain WRITE takes
/// none.
#[test]
fn write_with_immediate_consumes_an_srq_wqe() {
    let (mut p, a, b) = connected(srq_cfg());
    let srq = b.srq.unwrap();
    b.post_srq_recv(&mut p, 77, 0, 16);
    b.post_srq_recv(&mut p, 78, 0, 16);
    a.write_bytes(0, b"written");
    let write = |wr_id, imm: Option<u32>| SendWr {
        wr_id,
        sg_list: vec![a.sge(0, 7)].into(),
        op: match imm {
            Some(imm_data) => WrOperation::RdmaWriteWithImm {
                remote_addr: b.mr.addr + 500,
                rkey: b.mr.rkey,
                imm_data,
            },
            None => WrOperation::RdmaWrite {
                remote_addr: b.mr.addr + 500,
                rkey: b.mr.rkey,
            },
        },
        send_flags: SendFlags::SIGNALED,
        ud: None,
        xrc_remote_srqn: None,
    };
    a.post_send(&mut p, write(1, None));
    p.drive();
    assert_eq!(p.b.srq_len(srq), 2, "a plain WRITE takes no receive WQE");
    a.post_send(&mut p, write(2, Some(0x1234)));
    p.drive();
    let wcs = b.poll(&mut p);
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].opcode, wcs[0].imm_data, wcs[0].qp_num),
        (77, WcOpcode::RecvRdmaWithImm, 0x1234, b.qpn)
    );
    assert_eq!(b.read_bytes(500, 7), b"written");
    assert_eq!(p.b.srq_len(srq), 1);
}

/// IBTA 9.7.5.2.8: an RC responder whose SRQ is empty answers a SEND with an RNR
/// NAK; once a WQE is posted to the SRQ the requester's retry succeeds.
#[test]
fn empty_srq_gives_rnr_nak_then_success_after_post_srq_recv() {
    let (mut p, a, b) = connected(Config {
        min_rnr_timer: 14,
        ..srq_cfg()
    });
    a.post_send(&mut p, send(1, a.sge(0, 8)));
    p.drive_for(Duration::from_micros(100));
    assert_eq!(
        p.trace(),
        [
            "A->B RC_SEND_ONLY psn=100",
            "B->A RC_ACKNOWLEDGE psn=100 aeth=0x2e"
        ]
    );
    assert_eq!(p.b.counters().rnr_naks_sent, 1);
    b.post_srq_recv(&mut p, 9, 0, 64);
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    let wc = b.poll(&mut p);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].qp_num),
        (9, WcStatus::Success, b.qpn)
    );
}

/// UC over an SRQ (manual 3.4.5 puts no transport restriction on SRQ users; UC has
/// no RNR: a SEND with the SRQ empty is dropped, IBTA 9.8).
#[test]
fn uc_receives_from_an_srq() {
    let (mut p, a, b) = connected(Config {
        qp_type: QpType::Uc,
        ..srq_cfg()
    });
    a.post_send(&mut p, send(1, a.sge(0, 8)));
    p.drive();
    assert!(b.poll(&mut p).is_empty(), "no WQE: the message is dropped");
    b.post_srq_recv(&mut p, 5, 0, 64);
    a.post_send(&mut p, send(2, a.sge(0, 8)));
    p.drive();
    let wc = b.poll(&mut p);
    assert_eq!(
        (wc.len(), wc[0].wr_id, wc[0].qp_num),
        (1, 5, b.qpn),
        "{wc:?}"
    );
}

/// Manual 3.4.6 and 6.1.16, 3.6.2: setting `srq_limit` arms the SRQ; when the number
/// of WQEs drops below the limit, one `SRQ_LIMIT_REACHED` event is raised and the
/// limit reads 0 again (disarmed); more consumption raises nothing until it is
/// re-armed.
#[test]
fn srq_limit_fires_exactly_once_per_arming() {
    let (mut p, a, b) = connected(srq_cfg());
    let srq = b.srq.unwrap();
    for i in 0..8 {
        b.post_srq_recv(&mut p, i, 64 * i, 64);
    }
    let arm = |p: &mut Engines, limit| {
        p.b.modify_srq(
            srq,
            &SrqAttr {
                srq_limit: limit,
                ..SrqAttr::default()
            },
            SrqAttrMask::LIMIT,
        )
        .unwrap();
    };
    let one_message = |p: &mut Engines| {
        a.post_send(p, send(0, a.sge(0, 4)));
        p.drive();
        srq_events(&b.events(p))
    };
    assert!(one_message(&mut p).is_empty(), "not armed: no event");
    // 7 WQEs left. Arm at 6: 7 -> 6 is not below 6; 6 -> 5 is.
    arm(&mut p, 6);
    assert_eq!(p.b.query_srq(srq).unwrap().srq_limit, 6);
    assert!(one_message(&mut p).is_empty(), "6 WQEs: not below 6");
    assert_eq!(one_message(&mut p), [limit_event(srq)], "5 < 6");
    assert_eq!(p.b.query_srq(srq).unwrap().srq_limit, 0, "disarmed");
    assert!(one_message(&mut p).is_empty(), "disarmed: 4 raises nothing");
    assert!(one_message(&mut p).is_empty(), "disarmed: 3 raises nothing");
    // Re-arm at 3: 3 -> 2 fires again, once.
    arm(&mut p, 3);
    assert_eq!(one_message(&mut p), [limit_event(srq)]);
    assert!(one_message(&mut p).is_empty());
    assert_eq!(p.b.srq_len(srq), 1);
    assert_eq!(b.poll(&mut p).len(), 7);
}

/// Manual 3.6.6: `ibv_post_srq_recv` stops at the first WR it cannot post and reports
/// it; ENOMEM when the SRQ holds `max_wr` WQEs, EINVAL for more than `max_sge` SGEs.
#[test]
fn post_srq_recv_errors_name_the_first_rejected_wr() {
    let mut e = Engine::default();
    e.set_gid(gid(Side::A));
    let now = std::time::Instant::now();
    let pd = e.alloc_pd().unwrap();
    let srq = e
        .create_srq(
            pd,
            SrqAttr {
                max_wr: 2,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let sge = Sge {
        addr: 0x1000,
        length: 8,
        lkey: 1,
    };
    let err = e
        .post_srq_recv(now, srq, &[recv(1, vec![sge]), recv(2, vec![sge, sge])])
        .unwrap_err();
    assert_eq!((err.index, err.error.errno()), (1, EINVAL));
    assert_eq!(e.srq_len(srq), 1, "the WR before the bad one is posted");
    let err = e
        .post_srq_recv(now, srq, &[recv(3, vec![sge]), recv(4, vec![sge])])
        .unwrap_err();
    assert_eq!((err.index, err.error.errno()), (1, ENOMEM));
    assert_eq!(e.srq_len(srq), 2);
    let err = e
        .post_srq_recv(now, SrqId(999), &[recv(5, vec![])])
        .unwrap_err();
    assert_eq!((err.index, err.error.errno()), (0, EINVAL));
}

/// Manual 3.4.5-3.4.6, 3.6.2: create checks the sizes against the device limits and
/// ignores `srq_limit`; modify is all or nothing (resize: not below the WQEs held;
/// limit: not above `max_wr`); query returns the current values.
#[test]
fn create_modify_query_srq_attribute_rules() {
    let mut e = Engine::default();
    e.set_gid(gid(Side::A));
    let now = std::time::Instant::now();
    let l = *e.limits();
    let pd = e.alloc_pd().unwrap();
    let attr = |max_wr, max_sge| SrqAttr {
        max_wr,
        max_sge,
        srq_limit: 0,
    };
    for bad in [
        attr(0, 1),
        attr(l.max_srq_wr + 1, 1),
        attr(4, 0),
        attr(4, l.max_srq_sge + 1),
    ] {
        assert_eq!(
            e.create_srq(pd, bad).unwrap_err().errno(),
            EINVAL,
            "{bad:?}"
        );
    }
    let other_pd = e.alloc_pd().unwrap();
    e.dealloc_pd(other_pd).unwrap();
    assert_eq!(
        e.create_srq(other_pd, attr(4, 1)).unwrap_err().errno(),
        EINVAL
    );
    let srq = e
        .create_srq(
            pd,
            SrqAttr {
                max_wr: 4,
                max_sge: 2,
                srq_limit: 3,
            },
        )
        .unwrap();
    assert_eq!(e.query_srq(srq).unwrap(), attr(4, 2), "created unarmed");
    let sge = Sge {
        addr: 0,
        length: 0,
        lkey: 0,
    };
    e.post_srq_recv(
        now,
        srq,
        &[recv(1, vec![sge]), recv(2, vec![sge]), recv(3, vec![sge])],
    )
    .unwrap();
    let set = |max_wr, srq_limit| SrqAttr {
        max_wr,
        max_sge: 99, // never modified
        srq_limit,
    };
    let both = SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT;
    // Resize below the 3 WQEs held: EINVAL, and the valid limit in the same call is
    // not applied either.
    assert_eq!(
        e.modify_srq(srq, &set(2, 1), both).unwrap_err().errno(),
        EINVAL
    );
    assert_eq!(e.query_srq(srq).unwrap(), attr(4, 2));
    // A limit above max_wr: EINVAL.
    assert_eq!(
        e.modify_srq(srq, &set(0, 5), SrqAttrMask::LIMIT)
            .unwrap_err()
            .errno(),
        EINVAL
    );
    assert_eq!(
        e.modify_srq(srq, &set(l.max_srq_wr + 1, 0), SrqAttrMask::MAX_WR)
            .unwrap_err()
            .errno(),
        EINVAL
    );
    // Grow and arm in one call.
    e.modify_srq(srq, &set(8, 5), both).unwrap();
    assert_eq!(
        e.query_srq(srq).unwrap(),
        SrqAttr {
            max_wr: 8,
            max_sge: 2,
            srq_limit: 5
        }
    );
    // Shrinking below an armed limit is refused (as kernel rxe); to the WQEs held is fine
    // once disarmed.
    assert_eq!(
        e.modify_srq(srq, &set(4, 0), SrqAttrMask::MAX_WR)
            .unwrap_err()
            .errno(),
        EINVAL
    );
    e.modify_srq(srq, &set(3, 0), both).unwrap();
    assert_eq!(e.query_srq(srq).unwrap(), attr(3, 2));
    let err = e
        .post_srq_recv(now, srq, &[recv(4, vec![sge])])
        .unwrap_err();
    assert_eq!(
        err.error.errno(),
        ENOMEM,
        "resized to exactly what it holds"
    );
    assert_eq!(e.query_srq(SrqId(999)).unwrap_err().errno(), EINVAL);
}

/// Manual 3.4.1 (`srq` in `ibv_qp_init_attr`) and 3.6.4: a QP created on an SRQ has
/// no receive queue of its own, so `ibv_post_recv` on it is EINVAL (kernel rxe
/// refuses the same); its receive capacities read back as 0. create_qp refuses an
/// unknown SRQ, and takes one of another PD (IBTA 10.2.9; kernel rxe too).
#[test]
fn post_recv_on_a_qp_with_an_srq_is_einval() {
    let (mut p, _a, b) = connected(srq_cfg());
    let now = p.now;
    let err =
        p.b.post_recv(now, b.qpn, &[recv(1, vec![b.sge(0, 8)])])
            .unwrap_err();
    assert_eq!((err.index, err.error.errno()), (0, EINVAL));
    let (attr, init) = p.b.query_qp(b.qpn).unwrap();
    assert_eq!(init.srq, b.srq);
    assert_eq!((attr.cap.max_recv_wr, attr.cap.max_recv_sge), (0, 0));
    assert_eq!(attr.cap.max_send_wr, Config::default().cap.max_send_wr);

    let mut init = QpInitAttr::new(b.pd, b.cq, QpType::Rc, QpCap::default()).srq(SrqId(999));
    assert_eq!(
        p.b.create_qp(init).unwrap_err().errno(),
        EINVAL,
        "unknown SRQ"
    );
    init.pd = p.b.alloc_pd().unwrap();
    init.srq = b.srq;
    let other = p.b.create_qp(init).expect("an SRQ of another PD");
    assert_eq!(p.b.query_qp(other).unwrap().1.srq, b.srq);
}

/// Manual 3.4.7: `ibv_destroy_srq` fails while a QP is associated with the SRQ (EBUSY,
/// as `ibv_destroy_cq`); and the SRQ keeps its PD alive (manual 3.3.6).
#[test]
fn destroy_srq_with_a_qp_attached_is_ebusy() {
    let (mut p, _a, b) = connected(srq_cfg());
    let srq = b.srq.unwrap();
    assert_eq!(p.b.destroy_srq(srq).unwrap_err().errno(), EBUSY);
    p.b.destroy_qp(b.qpn).unwrap();
    p.b.dereg_mr(b.mr.lkey).unwrap();
    assert_eq!(
        p.b.dealloc_pd(b.pd).unwrap_err().errno(),
        EBUSY,
        "the SRQ uses it"
    );
    p.b.destroy_srq(srq).unwrap();
    assert_eq!(p.b.destroy_srq(srq).unwrap_err().errno(), EINVAL);
    p.b.dealloc_pd(b.pd).unwrap();
}

fn to_err(p: &mut Engines, node: &Node) {
    let now = p.now;
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    p.engine(node.side)
        .modify_qp(now, node.qpn, &attr, QpAttrMask::STATE)
        .unwrap();
}

fn last_wqe(qpn: u32) -> AsyncEvent {
    AsyncEvent {
        event_type: AsyncEventType::QpLastWqeReached,
        element: EventElement::Qp(qpn),
    }
}

/// Manual 6.1.17 (IBTA 11.6.3, Last WQE Reached): a QP on an SRQ that enters the
/// error state raises `QP_LAST_WQE_REACHED` once it holds no receive WQE — at once
/// when it had none in progress. The WQEs in the SRQ are not the QP's: none is
/// flushed, and the other QP keeps receiving from them.
#[test]
fn qp_to_err_raises_last_wqe_reached_and_leaves_the_srq_to_the_other_qp() {
    let (mut p, [_a1, a2], [b1, b2]) = two_on_one_srq();
    let srq = b1.srq.unwrap();
    for i in 0..3 {
        b1.post_srq_recv(&mut p, i, 100 * i, 64);
    }
    to_err(&mut p, &b1);
    assert_eq!(b1.events(&mut p), [last_wqe(b1.qpn)]);
    assert!(b1.poll(&mut p).is_empty(), "nothing of B1's to flush");
    assert_eq!(p.b.srq_len(srq), 3);
    // Once only: ERR -> ERR raises nothing more.
    to_err(&mut p, &b1);
    assert!(b1.events(&mut p).is_empty());

    a2.post_send(&mut p, send(1, a2.sge(0, 8)));
    p.drive();
    let wc = b2.poll(&mut p);
    assert_eq!(
        (wc.len(), wc[0].wr_id, wc[0].status, wc[0].qp_num),
        (1, 0, WcStatus::Success, b2.qpn)
    );
    assert_eq!(p.b.srq_len(srq), 2);
}

/// Manual 6.1.17 and IBTA 10.3.1 (flush): a QP on an SRQ that enters the error state
/// in the middle of a message flushes the one receive WQE it took from the SRQ (with
/// its own QP number), then raises `QP_LAST_WQE_REACHED`; the SRQ's other WQEs stay
/// and serve the other QP in order.
#[test]
fn qp_to_err_mid_message_flushes_only_its_wqe() {
    let (mut p, [a1, a2], [b1, b2]) = two_on_one_srq();
    let srq = b1.srq.unwrap();
    for i in 0..3 {
        b1.post_srq_recv(&mut p, i, 4096 * i, 4096);
    }
    // A 3-packet SEND whose LAST packet is lost: B1 holds WQE 0 in progress.
    p.set_rule(|side, repr, _| {
        if side == Side::A && repr.bth.opcode == emu_wire::Opcode::RcSendLast {
            util::Action::Drop
        } else {
            util::Action::Deliver
        }
    });
    a1.post_send(&mut p, send(1, a1.sge(0, 2500)));
    p.drive_for(Duration::from_micros(200));
    p.clear_rule();
    assert_eq!(p.b.srq_len(srq), 2, "B1 took WQE 0");
    assert!(b1.poll(&mut p).is_empty());

    to_err(&mut p, &b1);
    let wc = b1.poll(&mut p);
    assert_eq!(
        wc.iter()
            .map(|w| (w.wr_id, w.status, w.qp_num))
            .collect::<Vec<_>>(),
        [(0, WcStatus::WrFlushErr, b1.qpn)]
    );
    assert_eq!(b1.events(&mut p), [last_wqe(b1.qpn)]);
    assert_eq!(p.b.srq_len(srq), 2);

    a2.post_send(&mut p, send(2, a2.sge(0, 10)));
    p.drive_for(Duration::from_millis(5));
    let wc = b2.poll(&mut p);
    assert_eq!(
        (wc.len(), wc[0].wr_id, wc[0].status, wc[0].qp_num),
        (1, 1, WcStatus::Success, b2.qpn)
    );
    assert_eq!(p.b.srq_len(srq), 1);
}

/// Manual 6.1.17: the event also follows an error the responder detects itself (here
/// a WRITE beyond the R_Key's region: IBTA 9.7.4.1, remote access error), after the
/// QP's own access error event.
#[test]
fn responder_error_on_an_srq_qp_raises_last_wqe_reached() {
    let (mut p, a, b) = connected(srq_cfg());
    b.post_srq_recv(&mut p, 1, 0, 64);
    a.post_send(
        &mut p,
        SendWr {
            wr_id: 1,
            sg_list: vec![a.sge(0, 8)].into(),
            op: WrOperation::RdmaWrite {
                remote_addr: b.mr.addr + b.mr.length,
                rkey: b.mr.rkey,
            },
            send_flags: SendFlags::SIGNALED,
            ud: None,
            xrc_remote_srqn: None,
        },
    );
    p.drive_for(Duration::from_millis(5));
    assert_eq!(b.state(&mut p), QpState::Err);
    let events: Vec<_> = b.events(&mut p).iter().map(|e| e.event_type).collect();
    assert_eq!(
        events,
        [
            AsyncEventType::QpAccessErr,
            AsyncEventType::QpLastWqeReached
        ]
    );
    assert_eq!(
        p.b.srq_len(b.srq.unwrap()),
        1,
        "the SRQ's WQE is not flushed"
    );
}
