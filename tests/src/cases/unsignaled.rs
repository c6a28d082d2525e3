//! Unsignaled work requests that fail (manual 3.4.3 sq_sig_all, 3.6.5 IBV_SEND_SIGNALED;
//! IBTA 10.8, 11.4.1.1): the signaled-completion indicator selects completions only for
//! WRs that succeed. A WR that completes in error always returns its completion, the
//! WRs behind it are flushed and each returns one too, and a QP created with
//! `sq_sig_all` returns a completion for every WR whatever its flags.

use std::time::Duration;

use verbs_api::{QpType, RecvWr, SendWr, Sge, WcOpcode, WcStatus as S};

use crate::env::{default_cap, Pair};
use crate::{Case, Env, Outcome};

/// What fills memory a failed WR must not touch.
const UNTOUCHED: u8 = 0x5A;

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("unsignaled::rc_failed_write_completes_with_its_error", "IBTA 10.8, 11.4.1.1 (the signaled-completion indicator selects completions of WRs that succeed; a WR completed in error always generates one), manual 3.6.5 IBV_SEND_SIGNALED, 6.2.11: an RDMA WRITE posted without IBV_SEND_SIGNALED on a QP without sq_sig_all whose R_Key is invalid completes with REM_ACCESS_ERR, its wr_id and QP number, and nothing else completes; not a byte is written", failed_write).wc(S::RemAccessErr));
    v.push(Case::new("unsignaled::rc_failed_read_completes_with_its_error", "IBTA 10.8, 11.4.1.1, 10.6.3.1, manual 3.6.5, 6.2.5: an unsignaled RDMA READ whose local SGE has an invalid L_Key completes with LOC_PROT_ERR (a local error is reported like a remote one) and its buffer is unchanged", failed_read).wc(S::LocProtErr));
    v.push(Case::new("unsignaled::rc_wrs_behind_an_unsignaled_failure_flush", "IBTA 10.8, 10.3.1 (the QP goes to ERR and every outstanding WR completes with flush error, signaled or not), manual 6.2.6 IBV_WC_WR_FLUSH_ERR: after an unsignaled WR fails (REM_ACCESS_ERR), the unsignaled WRs and the signaled one behind it each complete with WR_FLUSH_ERR, in posting order", flush_behind).wc(S::RemAccessErr).wc(S::WrFlushErr));
    v.push(Case::new("unsignaled::sq_sig_all_completes_every_wr", "manual 3.4.3 ibv_create_qp sq_sig_all (set to 1: every send WR generates a completion), 3.6.5 (IBV_SEND_SIGNALED is only meaningful when sq_sig_all is 0): WRITEs, a SEND and a READ posted without IBV_SEND_SIGNALED on a QP with sq_sig_all each complete successfully, in order, with their opcode", sig_all).wc(S::Success));
    v.push(Case::new("unsignaled::sq_sig_all_failure_then_flush", "manual 3.4.3 sq_sig_all; IBTA 10.8, 10.3.1: on a QP with sq_sig_all a failed WR completes with its error and the WRs behind it with WR_FLUSH_ERR, one completion each, as without sq_sig_all", sig_all_failure).wc(S::RemAccessErr).wc(S::WrFlushErr));
}

/// Polls `n` completions of `cq`, then checks that no more come.
fn poll_n(env: &Env, cq: verbs_api::CqId, n: usize) -> Vec<verbs_api::WorkCompletion> {
    let wcs: Vec<_> = (0..n).map(|_| env.poll_one(cq)).collect();
    env.assert_no_completion(cq, Duration::from_millis(30));
    wcs
}

fn bad_rkey_write(p: &Pair, wr_id: u64) -> SendWr {
    SendWr::rdma_write(
        wr_id,
        vec![p.a.sge(0, 64)],
        p.b.addr(0),
        p.b.mr.rkey ^ 0x5500,
    )
}

fn failed_write(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.b.buf.fill(UNTOUCHED);
    env.post_send(p.a.qpn, bad_rkey_write(&p, 1));
    let wcs = poll_n(env, p.a.cq, 1);
    let wc = &wcs[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.qp_num),
        (1, S::RemAccessErr, p.a.qpn),
        "{wc:?}"
    );
    assert!(
        p.b.buf.to_vec().iter().all(|&b| b == UNTOUCHED),
        "bytes were written"
    );
    Outcome::Pass
}

fn failed_read(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.a.buf.fill(UNTOUCHED);
    p.b.buf.write(0, &[0xC3; 64]).unwrap();
    let bad = Sge {
        lkey: p.a.mr.lkey ^ 0x5500,
        ..p.a.sge(0, 64)
    };
    env.post_send(
        p.a.qpn,
        SendWr::rdma_read(1, vec![bad], p.b.addr(0), p.b.mr.rkey),
    );
    let wcs = poll_n(env, p.a.cq, 1);
    let wc = &wcs[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.qp_num),
        (1, S::LocProtErr, p.a.qpn),
        "{wc:?}"
    );
    assert!(
        p.a.buf.to_vec().iter().all(|&b| b == UNTOUCHED),
        "bytes were written"
    );
    Outcome::Pass
}

/// Posts a failing WRITE (wr_id 1), then good WRITEs 2 and 3 and, signaled or not as
/// `last_signaled`, WRITE 4; expects 1 to fail with REM_ACCESS_ERR and 2 to 4 to flush.
fn fail_then_flush(env: &Env, p: &Pair, last_signaled: bool) {
    env.post_send(p.a.qpn, bad_rkey_write(p, 1));
    for id in 2..=4u64 {
        let wr = SendWr::rdma_write(id, vec![p.a.sge(0, 8)], p.b.addr(256), p.b.mr.rkey);
        env.post_send(
            p.a.qpn,
            if id == 4 && last_signaled {
                wr.signaled()
            } else {
                wr
            },
        );
    }
    let got: Vec<_> = poll_n(env, p.a.cq, 4)
        .iter()
        .map(|wc| (wc.wr_id, wc.status, wc.qp_num))
        .collect();
    let want = vec![
        (1, S::RemAccessErr, p.a.qpn),
        (2, S::WrFlushErr, p.a.qpn),
        (3, S::WrFlushErr, p.a.qpn),
        (4, S::WrFlushErr, p.a.qpn),
    ];
    assert_eq!(got, want);
}

fn flush_behind(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    fail_then_flush(env, &p, true);
    Outcome::Pass
}

/// A connected RC pair whose requester `a` has `sq_sig_all` set.
fn sig_all_pair(env: &Env) -> Pair {
    let p = env.pair_signalling(QpType::Rc, &env.params(), default_cap(), 64, true);
    let (_, init) = env.dev.query_qp(p.a.qpn).expect("query_qp");
    assert!(
        init.sq_sig_all,
        "the QP does not report sq_sig_all: {init:?}"
    );
    p
}

fn sig_all(env: &Env) -> Outcome {
    let p = sig_all_pair(env);
    p.a.buf.write(0, &[0x11; 64]).unwrap();
    p.b.buf.write(4096, &[0x22; 64]).unwrap();
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![p.b.sge(8192, 256)]));
    let wrs = [
        SendWr::rdma_write(1, vec![p.a.sge(0, 64)], p.b.addr(0), p.b.mr.rkey),
        SendWr::rdma_write(2, vec![p.a.sge(0, 32)], p.b.addr(128), p.b.mr.rkey),
        SendWr::send(3, vec![p.a.sge(0, 16)]),
        SendWr::rdma_read(4, vec![p.a.sge(1024, 64)], p.b.addr(4096), p.b.mr.rkey),
    ];
    for wr in wrs {
        env.post_send(p.a.qpn, wr);
    }
    let got: Vec<_> = poll_n(env, p.a.cq, 4)
        .iter()
        .map(|wc| (wc.wr_id, wc.status, wc.opcode))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, S::Success, WcOpcode::RdmaWrite),
            (2, S::Success, WcOpcode::RdmaWrite),
            (3, S::Success, WcOpcode::Send),
            (4, S::Success, WcOpcode::RdmaRead),
        ]
    );
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, S::Success, 16),
        "{wc:?}"
    );
    let mut got = [0u8; 64];
    p.a.buf.read(1024, &mut got).unwrap();
    assert_eq!(got, [0x22; 64], "the READ's bytes");
    Outcome::Pass
}

fn sig_all_failure(env: &Env) -> Outcome {
    let p = sig_all_pair(env);
    fail_then_flush(env, &p, false);
    Outcome::Pass
}
