//! The state of the peer while the local QP sends (IBTA 10.3.1, the QP states: a QP in
//! INIT or ERR drops the packets it is sent, one in RTR receives and answers; 9.7.6
//! and 9.7.5.2.8, the requester's ACK timeout and RNR retries): RC exhausts its retries
//! against a peer in INIT or ERR, UC and UD lose the message silently; a READ posted
//! while its target is still in INIT completes once the target is up; a target in
//! RTR answers WRITE, READ and atomics; with `rnr_retry` 7 the requester retries
//! without end, so a receive posted long after the SEND still takes it.
//!
//! google/rdma-unit-test's `QpStateTest.RtsSendToRtr` and rdma-core's pyverbs RNR tests
//! (`test_rnr_retry`) check the same flows. A peer in RESET is in `errors`
//! (`errors::rc_retry_exceeded_peer_in_reset`), a peer that receives in SQD or SQE in
//! `post_state` (`post_state::*_post_recv_in_sqd_receives`, `..._in_sqe_receives`).

use std::time::Duration;

use verbs_api::{QpState as S, QpType, RecvWr, SendWr, SrqAttr, WcOpcode, WcStatus};

use super::post_state::{decode, encode, expect_delivery, message, UNTOUCHED};
use super::qp_state::{name, type_name};
use crate::env::{default_cap, Pair, PairSpec};
use crate::{Case, Env, Outcome};

/// How a message waits for a late receive: a SEND, an RDMA WRITE with immediate, a SEND
/// to a QP on an SRQ.
const RNR_KINDS: [&str; 3] = ["send", "write_with_imm", "send_to_srq"];

pub(super) fn register(v: &mut Vec<Case>) {
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        for s in [S::Init, S::Err] {
            let (tn, sn) = (type_name(t), name(s));
            let c = if t == QpType::Rc {
                Case::param(format!("peer_state::rc_send_to_peer_in_{sn}_exhausts_retries"), "IBTA 10.3.1 (a QP in INIT or ERR silently drops the packets it is sent), 9.7.6 (the requester retries retry_cnt times after each ACK timeout, then completes with a transport retry counter exceeded error), manual 6.2.13 IBV_WC_RETRY_EXC_ERR: the SEND to a peer in that state completes with RETRY_EXC_ERR; the peer's receive stays unused and its buffer untouched", to_peer_in, encode(t, s)).wc(WcStatus::RetryExcErr)
            } else {
                Case::param(format!("peer_state::{tn}_send_to_peer_in_{sn}_is_lost"), "IBTA 10.3.1 (a QP in INIT or ERR silently drops the packets it is sent), 9.8 / 9.7 (UC and UD have no acknowledgement: the sender completes once the message is sent): the SEND completes successfully, the peer takes nothing; a peer in INIT brought up later receives the next message, not the lost one", to_peer_in, encode(t, s)).wc(WcStatus::Success)
            };
            v.push(c);
        }
    }
    v.push(Case::new("peer_state::rc_read_while_target_comes_up_succeeds", "IBTA 10.3.1 (INIT drops, RTR responds), 9.7.6 (after an ACK timeout the requester resends the READ, up to retry_cnt times), 9.4.4: a READ posted while its target is in INIT gets no answer, the target moves through RTR to RTS, the resent READ is answered and completes successfully with the target's bytes", read_while_coming_up).wc(WcStatus::Success));
    v.push(Case::new("peer_state::rc_target_in_rtr_answers_write_read_and_atomic", "IBTA 10.3.1 (RTR: the responder processes incoming requests and sends their responses; only the send queue is idle), manual 3.5 (RTR: the QP may now receive packets): an RDMA WRITE, a READ and a fetch-and-add to a target left in RTR complete successfully and move the bytes; the target stays in RTR", target_in_rtr).wc(WcStatus::Success));
    for (i, kind) in RNR_KINDS.iter().enumerate() {
        v.push(Case::param(format!("peer_state::rc_infinite_rnr_retry_{kind}_waits_for_a_late_receive"), "IBTA 9.7.5.2.8 (an RNR NAK makes the requester wait the RNR timer and resend), manual 3.5.4 rnr_retry (7 means infinite): with rnr_retry 7 and a receiver without a receive WR, the message is refused over and over far beyond 7 RNR NAKs without the WR completing; a receive posted at last (to the QP, or to its SRQ) takes it and both sides complete successfully", infinite_rnr, i as u64).wc(WcStatus::Success));
    }
}

fn to_peer_in(env: &Env, param: u64) -> Outcome {
    let (t, s) = decode(param);
    let mut params = env.params();
    params.timeout = 8; // ~1 ms per try
    params.retry_cnt = 2;
    let spec = PairSpec {
        b_upto: if s == S::Init { S::Init } else { S::Rts },
        ..PairSpec::default()
    };
    let p = env.pair_spec(t, &params, default_cap(), 64, &spec);
    p.b.buf.fill(UNTOUCHED);
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![p.b.sge(0, 256)]));
    if s == S::Err {
        env.set_state(p.b.qpn, S::Err);
        let wc = env.poll_one(p.b.cq);
        assert_eq!((wc.wr_id, wc.status), (9, WcStatus::WrFlushErr), "{wc:?}");
    }
    p.a.buf.write(0, &[0xC3; 32]).unwrap();
    env.post_send(p.a.qpn, message(env, &p, t, p.a.sge(0, 32), p.b.qpn, 1));
    let wc = env.poll_one(p.a.cq);
    let want = if t == QpType::Rc {
        WcStatus::RetryExcErr
    } else {
        WcStatus::Success
    };
    assert_eq!((wc.wr_id, wc.status), (1, want), "{wc:?}");
    env.assert_no_completion(p.b.cq, Duration::from_millis(100));
    assert!(
        p.b.buf.to_vec().iter().all(|&b| b == UNTOUCHED),
        "the message reached the peer's buffer"
    );
    if s == S::Init && t != QpType::Rc {
        env.raise_end(&p, t, &params, false, S::Init, S::Rts);
        env.post_send(p.a.qpn, message(env, &p, t, p.a.sge(0, 8), p.b.qpn, 2));
        expect_delivery(env, t, (&p.a, 2), (&p.b, 9), 8);
    }
    Outcome::Pass
}

fn read_while_coming_up(env: &Env) -> Outcome {
    let mut params = env.params();
    params.timeout = 14; // 67 ms per try: the target comes up before the first resend
    let spec = PairSpec {
        b_upto: S::Init,
        ..PairSpec::default()
    };
    let p = env.pair_spec(QpType::Rc, &params, default_cap(), 64, &spec);
    p.b.buf.write(0, &[0x77; 64]).unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_read(1, vec![p.a.sge(0, 64)], p.b.addr(0), p.b.mr.rkey).signaled(),
    );
    // The READ reaches the target in INIT and is dropped. On virtual time every empty
    // poll is one step of the fabric (the READ arrives, then the first resend goes
    // out, and so on): a few steps stay well within retry_cnt. On real time the wait
    // is shorter than one ACK timeout.
    if env.virtual_time {
        for _ in 0..4 {
            assert_eq!(env.try_poll(p.a.cq, Duration::ZERO), None);
        }
    } else {
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(env.try_poll(p.a.cq, Duration::ZERO), None);
    }
    env.raise_end(&p, QpType::Rc, &params, false, S::Init, S::Rts);
    let wc = env.poll_one(p.a.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (1, WcStatus::Success, WcOpcode::RdmaRead, 64),
        "{wc:?}"
    );
    let mut got = [0u8; 64];
    p.a.buf.read(0, &mut got).unwrap();
    assert_eq!(got, [0x77; 64], "the READ's bytes");
    Outcome::Pass
}

fn target_in_rtr(env: &Env) -> Outcome {
    let spec = PairSpec {
        b_upto: S::Rtr,
        ..PairSpec::default()
    };
    let p = env.pair_spec(QpType::Rc, &env.params(), default_cap(), 64, &spec);
    p.a.buf.write(0, &[0x11; 64]).unwrap();
    p.b.buf.write(1024, &[0x22; 64]).unwrap();
    p.b.buf.write_u64(2048, 40).unwrap();
    let wrs = [
        SendWr::rdma_write(1, vec![p.a.sge(0, 64)], p.b.addr(0), p.b.mr.rkey),
        SendWr::rdma_read(2, vec![p.a.sge(4096, 64)], p.b.addr(1024), p.b.mr.rkey),
        SendWr::atomic_fetch_add(3, p.a.sge(8192, 8), p.b.addr(2048), p.b.mr.rkey, 2),
    ];
    for wr in wrs {
        env.post_send(p.a.qpn, wr.signaled());
    }
    for id in 1..=3 {
        let wc = env.poll_one(p.a.cq);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    }
    let mut got = [0u8; 64];
    p.b.buf.read(0, &mut got).unwrap();
    assert_eq!(got, [0x11; 64], "the WRITE's bytes");
    p.a.buf.read(4096, &mut got).unwrap();
    assert_eq!(got, [0x22; 64], "the READ's bytes");
    assert_eq!(p.a.buf.read_u64(8192).unwrap(), 40, "the original word");
    assert_eq!(p.b.buf.read_u64(2048).unwrap(), 42, "the added word");
    assert_eq!(env.state_of(p.b.qpn), S::Rtr);
    Outcome::Pass
}

/// Posts the receive that `p`'s b was waiting for: to its SRQ if it has one.
fn late_receive(env: &Env, p: &Pair) {
    let wr = RecvWr::new(9, vec![p.b.sge(0, 256)]);
    match p.srq {
        Some(srq) => env
            .dev
            .post_srq_recv(srq, std::slice::from_ref(&wr))
            .expect("post_srq_recv"),
        None => env.post_recv(p.b.qpn, wr),
    }
}

fn infinite_rnr(env: &Env, kind: u64) -> Outcome {
    let kind = RNR_KINDS[kind as usize];
    let mut params = env.params();
    params.rnr_retry = 7;
    params.min_rnr_timer = 14; // 1.28 ms: the wait below holds ~80 RNR NAKs
    let spec = PairSpec {
        b_srq: (kind == "send_to_srq").then_some(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        }),
        ..PairSpec::default()
    };
    let p = env.pair_spec(QpType::Rc, &params, default_cap(), 64, &spec);
    p.a.buf.write(0, b"waited long").unwrap();
    let wr = if kind == "write_with_imm" {
        SendWr::rdma_write_with_imm(1, vec![p.a.sge(0, 11)], p.b.addr(512), p.b.mr.rkey, 0x1234)
    } else {
        SendWr::send(1, vec![p.a.sge(0, 11)])
    };
    env.post_send(p.a.qpn, wr.signaled());
    env.assert_no_completion(p.a.cq, Duration::from_millis(100));
    assert_eq!(env.state_of(p.a.qpn), S::Rts, "the requester gave up");
    late_receive(env, &p);
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success), "{wc:?}");
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 11),
        "{wc:?}"
    );
    let at = if kind == "write_with_imm" {
        assert_eq!(wc.imm(), Some(0x1234), "{wc:?}");
        512
    } else {
        0
    };
    let mut got = [0u8; 11];
    p.b.buf.read(at, &mut got).unwrap();
    assert_eq!(&got, b"waited long");
    Outcome::Pass
}
