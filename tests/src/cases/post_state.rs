//! Posting work requests in every QP state (IBTA 10.3.1, the QP states; 10.8.2 C10-96:
//! a send WR posted in RESET, INIT or RTR is an immediate error; manual 3.5, 3.6.4,
//! 3.6.5), for RC, UC and UD: a send WR is refused before RTS and never runs, queued but
//! not started in SQD until the QP is back in RTS, flushed in SQE and ERR; a receive WR
//! posted in INIT or RTR waits for a message, one posted in SQD or SQE is taken as in
//! RTS (the receive side works on), one posted in ERR is flushed. A UC or UD QP goes
//! from SQE back to RTS and sends again.
//!
//! google/rdma-unit-test's `QpStateTest` (`PostSendInit`, `PostSendRtr`, `PostSendErr`,
//! `PostRecvInit`, `PostRecvRtr`, `PostRecvErr`) checks the same states. Posting in
//! RESET is in `qp_state` (`qp::*_post_*_in_reset_is_einval`); posting in RTS is what
//! every case of `data` and `ud` does.

use std::time::Duration;

use verbs_api::{QpState as S, QpType, RecvWr, SendWr, Sge, WcStatus};

use super::errno::EINVAL;
use super::qp_state::{name, type_name};
use crate::env::{default_cap, End, Pair, PairSpec};
use crate::{Case, Env, Outcome};

/// What fills memory a message must not reach.
pub(super) const UNTOUCHED: u8 = 0x5A;

/// Bytes of the GRH in front of a UD receive's payload (IBTA 11.4).
const GRH: u32 = 40;

/// The send states a QP of `t` can be put in besides RESET and RTS (SQE is UC/UD only:
/// an RC QP whose send fails goes to ERR, IBTA 10.3.1).
fn states(t: QpType) -> &'static [S] {
    if t == QpType::Rc {
        &[S::Init, S::Rtr, S::Sqd, S::Err]
    } else {
        &[S::Init, S::Rtr, S::Sqd, S::Sqe, S::Err]
    }
}

const TYPES: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];

/// The parameter of a case about a QP of type `t` in state `s`.
pub(super) fn encode(t: QpType, s: S) -> u64 {
    (u64::from(t.as_u32()) << 8) | u64::from(s.as_u32())
}

/// The QP type and state [`encode`] put in `p`.
pub(super) fn decode(p: u64) -> (QpType, S) {
    (
        QpType::try_from((p >> 8) as u32).unwrap(),
        S::try_from((p & 0xFF) as u32).unwrap(),
    )
}

pub(super) fn register(v: &mut Vec<Case>) {
    for t in TYPES {
        for &s in states(t) {
            let (tn, sn) = (type_name(t), name(s));
            let (send, recv) = match s {
                S::Init | S::Rtr => (
                    Case::param(format!("post_state::{tn}_post_send_in_{sn}_is_einval_and_never_runs"), "IBTA 10.8.2 C10-96 (a send WR posted to a QP in RESET, INIT or RTR is an immediate error; google/rdma-unit-test QpStateTest.PostSendInit/PostSendRtr), manual 3.6.5: ibv_post_send fails with EINVAL, bad_wr the WR; once the QP reaches RTS only the WRs posted there run: the refused one never completes nor arrives", post_send_in, encode(t, s)),
                    Case::param(format!("post_state::{tn}_post_recv_in_{sn}_waits_for_a_message"), "IBTA 10.3.1 (INIT and RTR accept receive WRs; a QP receives from RTR on), manual 3.5 (INIT: ready for posting to the receive queue), 3.6.4; google/rdma-unit-test QpStateTest.PostRecvInit/PostRecvRtr: the WR is accepted, nothing completes while no message comes, and the first message the QP takes once it receives lands in it", post_recv_in, encode(t, s)).wc(WcStatus::Success),
                ),
                S::Sqd => (
                    Case::param(format!("post_state::{tn}_post_send_in_sqd_waits_for_rts"), "IBTA 10.3.1 (SQD: send WRs may be posted but are not started until the QP returns to RTS), manual 3.5.1 ibv_modify_qp: a WR posted to a drained QP in SQD is accepted, neither completes nor reaches the peer, and runs to success once SQD->RTS", post_send_in, encode(t, s)).wc(WcStatus::Success),
                    Case::param(format!("post_state::{tn}_post_recv_in_sqd_receives"), "IBTA 10.3.1 (SQD drains the send queue only; the receive queue is processed as in RTS), manual 3.6.4: a receive WR posted in SQD takes the peer's message", post_recv_in, encode(t, s)).wc(WcStatus::Success),
                ),
                S::Sqe => (
                    Case::param(format!("post_state::{tn}_post_send_in_sqe_is_flushed"), "IBTA 10.3.1 (a UC/UD QP whose send WR completes in error enters SQE; send WRs posted there complete with flush error), manual 6.2.6 IBV_WC_WR_FLUSH_ERR: the post succeeds, the WR completes with WR_FLUSH_ERR and nothing reaches the peer", post_send_in, encode(t, s)).wc(WcStatus::WrFlushErr),
                    Case::param(format!("post_state::{tn}_post_recv_in_sqe_receives"), "IBTA 10.3.1 (SQE stops the send queue only; the receive queue keeps working), manual 3.6.4: a receive WR posted to a UC/UD QP in SQE takes the peer's message", post_recv_in, encode(t, s)).wc(WcStatus::Success),
                ),
                _ => (
                    Case::param(format!("post_state::{tn}_post_send_in_err_is_flushed"), "IBTA 10.3.1 (Error: WRs posted to either queue complete with flush error), manual 6.2.6 IBV_WC_WR_FLUSH_ERR; google/rdma-unit-test QpStateTest.PostSendErr: the post succeeds, the WR completes with WR_FLUSH_ERR and nothing reaches the peer", post_send_in, encode(t, s)).wc(WcStatus::WrFlushErr),
                    Case::param(format!("post_state::{tn}_post_recv_in_err_is_flushed"), "IBTA 10.3.1 (Error: WRs posted to either queue complete with flush error), manual 6.2.6; google/rdma-unit-test QpStateTest.PostRecvErr: a receive WR posted in ERR completes with WR_FLUSH_ERR", post_recv_in, encode(t, s)).wc(WcStatus::WrFlushErr),
                ),
            };
            v.push(send);
            v.push(recv);
        }
    }
    for t in [QpType::Uc, QpType::Ud] {
        v.push(Case::param(format!("post_state::{}_sqe_to_rts_sends_again", type_name(t)), "IBTA 10.3.1 (SQE -> RTS, for UC and UD only, resumes the send queue; kernel table ib_modify_qp_is_ok: SQE->RTS needs only the state), manual 3.5.1: after a send error left the QP in SQE, SQE->RTS is accepted and the next SEND completes successfully and arrives", sqe_to_rts, u64::from(t.as_u32())).wc(WcStatus::Success));
    }
}

/// A SEND of `len` bytes of `from`'s buffer to `to_qpn`, signaled (with a destination
/// in `p`'s PD for UD).
pub(super) fn message(
    env: &Env,
    p: &Pair,
    t: QpType,
    from: Sge,
    to_qpn: u32,
    wr_id: u64,
) -> SendWr {
    let wr = SendWr::send(wr_id, vec![from]).signaled();
    if t == QpType::Ud {
        wr.with_ud(env.ud_dest(p.pd, to_qpn))
    } else {
        wr
    }
}

/// Checks that send WR `wr_id` of `from` completes successfully and that receive WR
/// `recv_id` of `to` takes its `len` bytes.
pub(super) fn expect_delivery(
    env: &Env,
    t: QpType,
    (from, wr_id): (&End, u64),
    (to, recv_id): (&End, u64),
    len: u32,
) {
    let wc = env.poll_one(from.cq);
    assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success), "{wc:?}");
    let wc = env.poll_one(to.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.qp_num),
        (recv_id, WcStatus::Success, received(t, len), to.qpn),
        "the receive did not take WR {wr_id}'s {len} bytes: {wc:?}"
    );
}

/// The byte_len of a receive completion for `len` bytes of payload.
fn received(t: QpType, len: u32) -> u32 {
    if t == QpType::Ud {
        len + GRH
    } else {
        len
    }
}

/// A pair of `t` in which `a` is in `s` and `b` in RTS.
fn rig(env: &Env, t: QpType, s: S) -> Pair {
    let upto = if matches!(s, S::Init | S::Rtr) {
        s
    } else {
        S::Rts
    };
    let spec = PairSpec {
        a_upto: upto,
        ..PairSpec::default()
    };
    let p = env.pair_spec(t, &env.params(), default_cap(), 256, &spec);
    match s {
        S::Sqd => env.drain_to_sqd(p.a.qpn),
        S::Sqe => send_error(env, &p, t),
        S::Err => env.set_state(p.a.qpn, S::Err),
        _ => {}
    }
    assert_eq!(env.state_of(p.a.qpn), s);
    p
}

/// Fails a SEND of `a` (its SGE's L_Key names no region): a UC or UD QP goes to SQE
/// (IBTA 10.3.1). Takes the failed WR's completion off a's CQ.
fn send_error(env: &Env, p: &Pair, t: QpType) {
    let bad = Sge {
        lkey: p.a.mr.lkey ^ 0x5500,
        ..p.a.sge(0, 16)
    };
    env.post_send(p.a.qpn, message(env, p, t, bad, p.b.qpn, 100));
    let wc = env.poll_one(p.a.cq);
    assert!(
        wc.wr_id == 100 && wc.status != WcStatus::Success,
        "the SEND with a bad L_Key: {wc:?}"
    );
    env.wait_state(p.a.qpn, S::Sqe);
}

fn post_send_in(env: &Env, param: u64) -> Outcome {
    let (t, s) = decode(param);
    let p = rig(env, t, s);
    p.a.buf.write(0, &[0xC3; 16]).unwrap();
    p.b.buf.fill(UNTOUCHED);
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![p.b.sge(0, 256)]));
    let wr = message(env, &p, t, p.a.sge(0, 16), p.b.qpn, 1);
    let quiet = Duration::from_millis(50);
    match s {
        S::Init | S::Rtr => {
            let e = env
                .dev
                .post_send(p.a.qpn, &[wr])
                .expect_err("post_send before RTS succeeded");
            assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}");
            env.raise_end(&p, t, &env.params(), true, s, S::Rts);
            // Only WR 2, posted in RTS, runs: 8 bytes, where the refused WR had 16.
            env.post_send(p.a.qpn, message(env, &p, t, p.a.sge(0, 8), p.b.qpn, 2));
            expect_delivery(env, t, (&p.a, 2), (&p.b, 9), 8);
            env.assert_no_completion(p.a.cq, quiet);
        }
        S::Sqd => {
            env.post_send(p.a.qpn, wr);
            env.assert_no_completion(p.a.cq, quiet);
            env.assert_no_completion(p.b.cq, quiet);
            env.set_state(p.a.qpn, S::Rts);
            expect_delivery(env, t, (&p.a, 1), (&p.b, 9), 16);
        }
        _ => {
            env.post_send(p.a.qpn, wr);
            let wc = env.poll_one(p.a.cq);
            assert_eq!(
                (wc.wr_id, wc.status, wc.qp_num),
                (1, WcStatus::WrFlushErr, p.a.qpn),
                "{wc:?}"
            );
            env.assert_no_completion(p.b.cq, quiet);
            assert!(
                p.b.buf.to_vec().iter().all(|&b| b == UNTOUCHED),
                "the flushed SEND reached the peer"
            );
        }
    }
    Outcome::Pass
}

fn post_recv_in(env: &Env, param: u64) -> Outcome {
    let (t, s) = decode(param);
    let p = rig(env, t, s);
    env.post_recv(p.a.qpn, RecvWr::new(7, vec![p.a.sge(4096, 256)]));
    if s == S::Err {
        let wc = env.poll_one(p.a.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.qp_num),
            (7, WcStatus::WrFlushErr, p.a.qpn),
            "{wc:?}"
        );
        return Outcome::Pass;
    }
    if matches!(s, S::Init | S::Rtr) {
        env.assert_no_completion(p.a.cq, Duration::from_millis(30));
        if s == S::Init {
            env.raise_end(&p, t, &env.params(), true, s, S::Rtr);
        }
    }
    p.b.buf.write(0, &[0xD4; 24]).unwrap();
    env.post_send(p.b.qpn, message(env, &p, t, p.b.sge(0, 24), p.a.qpn, 3));
    expect_delivery(env, t, (&p.b, 3), (&p.a, 7), 24);
    let off = 4096 + u64::from(received(t, 0));
    let mut got = [0u8; 24];
    p.a.buf.read(off as usize, &mut got).unwrap();
    assert_eq!(got, [0xD4; 24], "the received bytes");
    Outcome::Pass
}

fn sqe_to_rts(env: &Env, param: u64) -> Outcome {
    let t = QpType::try_from(param as u32).unwrap();
    let p = rig(env, t, S::Sqe);
    env.set_state(p.a.qpn, S::Rts);
    assert_eq!(env.state_of(p.a.qpn), S::Rts);
    p.a.buf.write(0, &[0xE5; 32]).unwrap();
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![p.b.sge(0, 256)]));
    env.post_send(p.a.qpn, message(env, &p, t, p.a.sge(0, 32), p.b.qpn, 4));
    expect_delivery(env, t, (&p.a, 4), (&p.b, 9), 32);
    Outcome::Pass
}
