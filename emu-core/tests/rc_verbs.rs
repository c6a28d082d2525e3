//! Verb-level rules: QP state transitions and their attributes, the errno of every
//! refused call, send-queue drain, flush and reset, FENCE, max_rd_atomic, INLINE,
//! unsignaled WRs, PSN wrap (manual 3.5-3.6, IBTA 10.3).

mod util;

use std::time::Duration;

use emu_core::engine::Engine;
use util::*;
use verbs_api::QpAttrMask as M;
use verbs_api::QpInitAttr;
use verbs_api::{
    AccessFlags, AsyncEventType, MemBuf, Mtu, QpAttr, QpCap, QpState, QpType, RecvWr, SendFlags,
    SendWr, Sge, WcStatus, WrOperation,
};

fn fresh_qp(e: &mut Engine) -> u32 {
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(16).unwrap();
    e.create_qp(QpInitAttr::new(
        pd,
        cq,
        QpType::Rc,
        QpCap {
            max_send_wr: 2,
            max_recv_wr: 2,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 16,
        },
    ))
    .unwrap()
}

/// IBTA 10.3.1 / manual 3.5: a missing required attribute, an attribute the transition
/// does not allow, or an illegal transition is EINVAL and changes nothing.
#[test]
fn modify_qp_rules() {
    let mut e = Engine::default();
    e.set_gid(gid(Side::A));
    let now = std::time::Instant::now();
    let qpn = fresh_qp(&mut e);
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    // RESET -> INIT without ACCESS_FLAGS
    let err = e
        .modify_qp(now, qpn, &init, M::STATE | M::PKEY_INDEX | M::PORT)
        .unwrap_err();
    assert_eq!(err.errno(), 22);
    assert_eq!(e.query_qp(qpn).unwrap().0.qp_state, QpState::Reset);
    // RESET -> INIT with a forbidden attribute (QKEY is for UD)
    let err = e
        .modify_qp(
            now,
            qpn,
            &init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS | M::QKEY,
        )
        .unwrap_err();
    assert_eq!(err.errno(), 22);
    // RESET -> RTR is illegal
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..init
    };
    assert_eq!(
        e.modify_qp(now, qpn, &rtr, M::STATE).unwrap_err().errno(),
        22
    );
    // bad values
    let bad_port = QpAttr {
        port_num: 2,
        ..init
    };
    assert!(e
        .modify_qp(
            now,
            qpn,
            &bad_port,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS
        )
        .is_err());
    assert_eq!(e.query_qp(qpn).unwrap().0.qp_state, QpState::Reset);
    e.modify_qp(
        now,
        qpn,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    // INIT -> RTR without MIN_RNR_TIMER (required for RC)
    let mut rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: 5,
        ..init
    };
    rtr.ah_attr.is_global = true;
    let need = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC;
    assert_eq!(e.modify_qp(now, qpn, &rtr, need).unwrap_err().errno(), 22);
    // AV without a GRH is refused on RoCE
    let mut no_grh = rtr;
    no_grh.ah_attr.is_global = false;
    assert!(e
        .modify_qp(now, qpn, &no_grh, need | M::MIN_RNR_TIMER)
        .is_err());
    // timeout out of range on RTR->RTS
    e.modify_qp(now, qpn, &rtr, need | M::MIN_RNR_TIMER)
        .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 32,
        ..rtr
    };
    let need =
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    assert!(e.modify_qp(now, qpn, &rts, need).is_err());
    assert_eq!(e.query_qp(qpn).unwrap().0.qp_state, QpState::Rtr);
    let rts = QpAttr { timeout: 31, ..rts };
    e.modify_qp(now, qpn, &rts, need).unwrap();
    // CUR_STATE must match
    let wrong = QpAttr {
        cur_qp_state: QpState::Sqd,
        ..rts
    };
    assert!(e
        .modify_qp(now, qpn, &wrong, M::STATE | M::CUR_STATE)
        .is_err());
    // no STATE in the mask = RTS -> RTS with an allowed attribute
    let rnr = QpAttr {
        min_rnr_timer: 12,
        ..rts
    };
    e.modify_qp(now, qpn, &rnr, M::MIN_RNR_TIMER).unwrap();
    assert_eq!(e.query_qp(qpn).unwrap().0.min_rnr_timer, 12);
    // ... but not one it does not allow
    assert!(e.modify_qp(now, qpn, &rnr, M::PATH_MTU).is_err());
    // ERR -> RTS is illegal; ERR -> RESET -> INIT works
    let err = QpAttr {
        qp_state: QpState::Err,
        ..rts
    };
    e.modify_qp(now, qpn, &err, M::STATE).unwrap();
    assert!(e.modify_qp(now, qpn, &rts, M::STATE).is_err());
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..rts
    };
    e.modify_qp(now, qpn, &reset, M::STATE).unwrap();
    e.modify_qp(
        now,
        qpn,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
}

/// Manual 3.6: post_send before RTS and post_recv in RESET are EINVAL; a full queue is
/// ENOMEM; too many SGEs and oversize INLINE are EINVAL; `bad_wr` is the first refused.
#[test]
fn post_errors() {
    let mut e = Engine::default();
    e.set_gid(gid(Side::A));
    let now = std::time::Instant::now();
    let qpn = fresh_qp(&mut e);
    let send = signaled(1, WrOperation::Send, vec![]);
    assert_eq!(
        e.post_send(now, qpn, std::slice::from_ref(&send))
            .unwrap_err()
            .error
            .errno(),
        22
    );
    let recv = RecvWr {
        wr_id: 1,
        sg_list: vec![].into(),
    };
    assert_eq!(
        e.post_recv(now, qpn, std::slice::from_ref(&recv))
            .unwrap_err()
            .error
            .errno(),
        22
    );
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    e.modify_qp(
        now,
        qpn,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    assert_eq!(
        e.post_send(now, qpn, &[send]).unwrap_err().error.errno(),
        22,
        "INIT cannot send"
    );
    let err = e
        .post_recv(now, qpn, &[recv.clone(), recv.clone(), recv.clone()])
        .unwrap_err();
    assert_eq!((err.index, err.error.errno()), (2, 12));
    let two = RecvWr {
        wr_id: 9,
        sg_list: vec![
            Sge {
                addr: 0,
                length: 1,
                lkey: 0
            };
            2
        ]
        .into(),
    };
    assert_eq!(e.post_recv(now, qpn, &[two]).unwrap_err().error.errno(), 22);
    let missing = e.post_send(now, 0xABCDE, &[]).unwrap_err();
    assert_eq!(missing.error.errno(), 22);
}

/// Send-side checks that need an RTS QP: SGE count, INLINE size, unsupported ops.
#[test]
fn post_send_checks_in_rts() {
    let cfg = Config {
        cap: QpCap {
            max_send_wr: 2,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 16,
        },
        ..Config::default()
    };
    let (mut p, a, _b) = connected(cfg);
    let now = p.now;
    let two_sges = signaled(1, WrOperation::Send, vec![a.sge(0, 1), a.sge(1, 1)]);
    assert_eq!(
        p.a.post_send(now, a.qpn, &[two_sges])
            .unwrap_err()
            .error
            .errno(),
        22
    );
    let big_inline = SendWr {
        send_flags: SendFlags::INLINE,
        ..signaled(1, WrOperation::Send, vec![a.sge(0, 17)])
    };
    assert_eq!(
        p.a.post_send(now, a.qpn, &[big_inline])
            .unwrap_err()
            .error
            .errno(),
        22
    );
    // LOCAL_INV and BIND_MW are accepted on RC: tests/mw.rs.
    let ok = signaled(1, WrOperation::Send, vec![a.sge(0, 1)]);
    let err =
        p.a.post_send(now, a.qpn, &[ok.clone(), ok.clone(), ok])
            .unwrap_err();
    assert_eq!((err.index, err.error.errno()), (2, 12));
}

/// IBTA 10.3.1: ERR flushes every outstanding WR with WR_FLUSH_ERR; WRs posted in ERR
/// are flushed at once; RESET empties the queues.
#[test]
fn error_state_flushes_everything() {
    let (mut p, a, _b) = connected(Config::default());
    a.post_recv(&mut p, 10, 0, 8);
    a.post_recv(&mut p, 11, 0, 8);
    p.set_rule(|_, _, _| Action::Drop);
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    let now = p.now;
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    p.a.modify_qp(now, a.qpn, &err, M::STATE).unwrap();
    a.post_send(&mut p, signaled(2, WrOperation::Send, vec![a.sge(0, 8)]));
    a.post_recv(&mut p, 12, 0, 8);
    let wcs = a.poll(&mut p);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::WrFlushErr),
            (10, WcStatus::WrFlushErr),
            (11, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (12, WcStatus::WrFlushErr)
        ]
    );
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    p.a.modify_qp(now, a.qpn, &reset, M::STATE).unwrap();
    assert_eq!(a.state(&mut p), QpState::Reset);
    p.drive();
    assert!(a.poll(&mut p).is_empty());
}

/// IBTA 10.3.1: RTS->SQD finishes the started WRs, holds new ones, raises SQ_DRAINED;
/// SQD->RTS resumes.
#[test]
fn sqd_drains_and_resumes() {
    let (mut p, a, b) = connected(Config::default());
    for i in 0..2 {
        a.post_send(
            &mut p,
            signaled(
                i,
                WrOperation::RdmaWrite {
                    remote_addr: b.mr.addr,
                    rkey: b.mr.rkey,
                },
                vec![a.sge(0, 3000)],
            ),
        );
    }
    let now = p.now;
    p.drive_for(Duration::from_nanos(1)); // the first packets leave
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    p.a.modify_qp(now, a.qpn, &sqd, M::STATE | M::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
    a.post_send(
        &mut p,
        signaled(
            9,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 8)],
        ),
    );
    p.drive();
    let done: Vec<_> = a.poll(&mut p).iter().map(|w| w.wr_id).collect();
    assert!(!done.contains(&9), "a WR posted in SQD waits: {done:?}");
    let ev = a.events(&mut p);
    assert_eq!(
        ev.iter()
            .filter(|e| e.event_type == AsyncEventType::SqDrained)
            .count(),
        1
    );
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    let now = p.now;
    p.a.modify_qp(now, a.qpn, &rts, M::STATE).unwrap();
    p.drive();
    assert_eq!(
        a.poll(&mut p).iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [9]
    );
}

/// Manual 3.6 IBV_SEND_FENCE: a fenced WR waits for earlier READs to complete.
#[test]
fn fence_waits_for_earlier_reads() {
    let (mut p, a, b) = connected(Config::default());
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::RdmaRead {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 2048)],
        ),
    );
    let fenced = SendWr {
        send_flags: SendFlags::SIGNALED | SendFlags::FENCE,
        ..signaled(
            2,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 8)],
        )
    };
    a.post_send(&mut p, fenced);
    p.drive();
    let t = p.trace();
    let write_at = t
        .iter()
        .position(|l| l.contains("RC_RDMA_WRITE_ONLY"))
        .unwrap();
    let last_resp = t.iter().rposition(|l| l.contains("READ_RESPONSE")).unwrap();
    assert!(write_at > last_resp, "{t:#?}");
}

/// Without FENCE a WRITE overtakes nothing but goes right after the READ request.
#[test]
fn unfenced_write_does_not_wait() {
    let (mut p, a, b) = connected(Config::default());
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::RdmaRead {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 2048)],
        ),
    );
    a.post_send(
        &mut p,
        signaled(
            2,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 8)],
        ),
    );
    p.drive();
    assert_eq!(p.trace()[1], "A->B RC_RDMA_WRITE_ONLY psn=102");
}

/// max_rd_atomic bounds the READ/ATOMIC requests in flight.
#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let (mut p, a, b) = connected(Config {
        max_rd_atomic: 2,
        ..Config::default()
    });
    for i in 0..5 {
        a.post_send(
            &mut p,
            signaled(
                i,
                WrOperation::RdmaRead {
                    remote_addr: b.mr.addr,
                    rkey: b.mr.rkey,
                },
                vec![a.sge(0, 8)],
            ),
        );
    }
    p.drive();
    let mut outstanding = 0i32;
    let mut max = 0;
    for r in &p.log {
        match r.opcode {
            emu_wire::Opcode::RcRdmaReadRequest => outstanding += 1,
            emu_wire::Opcode::RcRdmaReadResponseOnly => outstanding -= 1,
            _ => {}
        }
        max = max.max(outstanding);
    }
    assert_eq!(max, 2, "{:#?}", p.trace());
    assert_eq!(a.poll(&mut p).len(), 5);
}

/// Unsignaled successful WRs produce no completion; errors always do.
#[test]
fn unsignaled_wrs_complete_silently() {
    let (mut p, a, b) = connected(Config::default());
    let quiet = |id| SendWr {
        send_flags: SendFlags::empty(),
        ..signaled(
            id,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 8)],
        )
    };
    a.post_send(&mut p, quiet(1));
    a.post_send(
        &mut p,
        signaled(
            2,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 8)],
        ),
    );
    a.post_send(
        &mut p,
        SendWr {
            send_flags: SendFlags::empty(),
            ..signaled(
                3,
                WrOperation::RdmaWrite {
                    remote_addr: b.mr.addr,
                    rkey: 1,
                },
                vec![a.sge(0, 8)],
            )
        },
    );
    p.drive();
    let wcs = a.poll(&mut p);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(2, WcStatus::Success), (3, WcStatus::RemAccessErr)]
    );
}

/// sq_sig_all makes every WR signaled.
#[test]
fn sq_sig_all() {
    let (mut p, a, b) = connected(Config {
        sq_sig_all: true,
        ..Config::default()
    });
    a.post_send(
        &mut p,
        SendWr {
            send_flags: SendFlags::empty(),
            ..signaled(
                1,
                WrOperation::RdmaWrite {
                    remote_addr: b.mr.addr,
                    rkey: b.mr.rkey,
                },
                vec![a.sge(0, 8)],
            )
        },
    );
    p.drive();
    assert_eq!(a.poll(&mut p).len(), 1);
}

/// INLINE data is copied at post time: changing the buffer afterwards does not change
/// what is sent.
#[test]
fn inline_data_is_copied_at_post() {
    let (mut p, a, b) = connected(Config::default());
    a.write_bytes(0, b"inline!!");
    let wr = SendWr {
        send_flags: SendFlags::SIGNALED | SendFlags::INLINE,
        ..signaled(
            1,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![Sge {
                addr: a.mr.addr,
                length: 8,
                lkey: 0,
            }],
        )
    };
    a.post_send(&mut p, wr);
    a.write_bytes(0, b"changed!");
    p.drive();
    assert_eq!(b.read_bytes(0, 8), b"inline!!");
}

/// Scatter/gather: several SGEs make one message.
#[test]
fn gather_list() {
    let (mut p, a, b) = connected(Config::default());
    a.write_bytes(0, b"abc");
    a.write_bytes(100, b"defg");
    b.post_recv(&mut p, 1, 0, 64);
    a.post_send(
        &mut p,
        signaled(1, WrOperation::Send, vec![a.sge(0, 3), a.sge(100, 4)]),
    );
    p.drive();
    assert_eq!(b.read_bytes(0, 7), b"abcdefg");
    assert_eq!(b.poll(&mut p)[0].byte_len, 7);
}

/// IBTA 9.7.1: PSNs wrap from 0xFFFFFF to 0 inside a message.
#[test]
fn psn_wraps_inside_a_message() {
    let (mut p, a, b) = connected(Config {
        sq_psn: [0xFF_FFFE, 5],
        ..Config::default()
    });
    let data = pattern(4000, 5);
    a.write_bytes(0, &data);
    b.post_recv(&mut p, 1, 0, 4096);
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 4000)]));
    p.drive();
    let psns: Vec<_> = p
        .log
        .iter()
        .filter(|r| r.from == Side::A)
        .map(|r| r.psn)
        .collect();
    assert_eq!(psns, [0xFF_FFFE, 0xFF_FFFF, 0, 1]);
    assert_eq!(b.read_bytes(0, 4000), data);
}

/// Manual 3.4: resources in use cannot be destroyed (EBUSY).
#[test]
fn destroy_order_is_enforced() {
    let mut e = Engine::default();
    e.set_gid(gid(Side::A));
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(4).unwrap();
    let qpn = e
        .create_qp(QpInitAttr::new(pd, cq, QpType::Rc, QpCap::default()))
        .unwrap();
    let buf = MemBuf::new(64);
    let mr = e.reg_mr(pd, &buf, 0, 64, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(e.dealloc_pd(pd).unwrap_err().errno(), 16);
    assert_eq!(e.destroy_cq(cq).unwrap_err().errno(), 16);
    e.destroy_qp(qpn).unwrap();
    e.destroy_cq(cq).unwrap();
    assert_eq!(e.dealloc_pd(pd).unwrap_err().errno(), 16);
    e.dereg_mr(mr.lkey).unwrap();
    e.dealloc_pd(pd).unwrap();
    assert_eq!(e.create_cq(0).unwrap_err().errno(), 22);
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(4).unwrap();
    let raw = QpInitAttr::new(pd, cq, QpType::RawPacket, QpCap::default());
    assert_eq!(
        e.create_qp(raw).unwrap_err().errno(),
        95,
        "raw packet QPs are not emulated"
    );
}

/// `cq_armed` (what keeps the device thread on the socket) follows the notification
/// requests: set by `req_notify_cq` however often it is called, cleared by the
/// completion that fires the event, and by destroying an armed CQ.
#[test]
fn cq_armed_follows_requests_events_and_destruction() {
    let (mut p, a, b) = connected(Config::default());
    assert!(!p.b.cq_armed());
    p.b.req_notify_cq(b.cq, false).unwrap();
    p.b.req_notify_cq(b.cq, true).unwrap();
    assert!(p.b.cq_armed());
    b.post_recv(&mut p, 1, 0, 64);
    a.post_send(&mut p, send(7, a.sge(0, 8)));
    p.drive();
    assert_eq!(p.b.poll_cq_event(), Some(b.cq));
    assert!(!p.b.cq_armed());
    let spare = p.b.create_cq(4).unwrap();
    p.b.req_notify_cq(spare, false).unwrap();
    assert!(p.b.cq_armed());
    p.b.destroy_cq(spare).unwrap();
    assert!(!p.b.cq_armed());
}

/// QP1's CQ, which the CM agent keeps armed, does not keep the device on the socket:
/// an application polling its own CQs still receives inline (an armed QP1 CQ tripled
/// `ib_send_lat -R`'s latency). Arming it before or after QP1 exists is the same.
#[test]
fn an_armed_qp1_cq_does_not_count_as_armed() {
    let mut e = Engine::new(Default::default());
    let pd = e.alloc_pd().unwrap();
    let early = e.create_cq(16).unwrap();
    let late = e.create_cq(16).unwrap();
    e.req_notify_cq(early, false).unwrap();
    assert!(e.cq_armed());
    e.create_qp(
        QpInitAttr::new(pd, early, QpType::Driver, QpCap::new(2, 2))
            .recv_cq(late)
            .sq_sig_all(true),
    )
    .unwrap();
    assert!(!e.cq_armed());
    e.req_notify_cq(late, false).unwrap();
    assert!(!e.cq_armed());
    let other = e.create_cq(16).unwrap();
    e.req_notify_cq(other, true).unwrap();
    assert!(e.cq_armed());
}

/// Moving a QP to RESET takes its completions not yet polled out of its CQs (as
/// libmlx4/libmlx5 clean them), so the flush completions of its last life are not
/// polled as the first of its next one.
#[test]
fn reset_removes_the_qps_unpolled_completions() {
    let (mut p, a, b) = connected(Config::default());
    a.post_recv(&mut p, 1, 0, 16);
    a.post_recv(&mut p, 2, 0, 16);
    // b sends one message: a's first receive completes; the second is flushed below.
    b.write_bytes(0, b"before");
    b.post_send(&mut p, send(7, b.sge(0, 6)));
    p.drive();
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::Success);
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    let now = p.now;
    p.a.modify_qp(now, a.qpn, &err, M::STATE).unwrap();
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    p.a.modify_qp(now, a.qpn, &reset, M::STATE).unwrap();
    assert!(
        a.poll(&mut p).is_empty(),
        "the success and the flush both went"
    );
    // Without the RESET the flush would be there (control).
    b.post_recv(&mut p, 3, 0, 16);
    p.b.modify_qp(now, b.qpn, &err, M::STATE).unwrap();
    let wcs = b.poll(&mut p);
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::WrFlushErr));
}
