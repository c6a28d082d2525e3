//! Error flows (manual 3.6.10 and chapter 6's WC statuses and async events; IBTA
//! 9.7.5.1-9.7.5.2, 9.9, 10.8.3, 11.6): each error completes with the right status at the
//! right end, moves nothing it should not, and raises the right event.

use std::time::Duration;

use verbs_api::{
    AccessFlags as A, AsyncEventType as E, EventElement, QpAttr, QpAttrMask as M, QpCap, QpState,
    QpType, RecvWr, SendFlags, SendWr, WcStatus as S,
};

use super::errno::EINVAL;
use crate::env::{default_cap, Pair};
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("errors::rc_write_bad_rkey", "IBTA 9.7.4.1, 9.7.5.2: an invalid R_Key is a remote access error (NAK), manual 3.6.10 IBV_WC_REM_ACCESS_ERR; not one byte is written", write_bad_rkey).wc(S::RemAccessErr));
    v.push(
        Case::new(
            "errors::rc_read_bad_rkey",
            "IBTA 9.7.4.1, manual 6.2.11: READ with an invalid R_Key completes with REM_ACCESS_ERR",
            read_bad_rkey,
        )
        .wc(S::RemAccessErr),
    );
    v.push(Case::new("errors::rc_read_bad_lkey_and_bad_rkey_is_rem_access_err", "IBTA 9.7.4.1, 9.9, 10.7: a READ whose R_Key and L_Key are both bad completes with REM_ACCESS_ERR (the responder's NAK arrives before the local buffer is touched, as kernel rxe orders it); the local buffer is unchanged", read_both_keys_bad).wc(S::RemAccessErr));
    v.push(Case::new("errors::rc_read_bad_lkey_is_loc_prot_err", "IBTA 10.6.3.1, manual 3.6.10: a READ whose local SGE has an invalid L_Key completes with LOC_PROT_ERR (found when the response lands, as kernel rxe); not a byte is written", read_bad_lkey).wc(S::LocProtErr));
    v.push(Case::new("errors::rc_atomic_bad_lkey_and_bad_rkey_is_rem_access_err", "IBTA 9.7.4.1, 9.9, 10.7: an atomic whose R_Key and L_Key are both bad completes with REM_ACCESS_ERR; both words are unchanged", atomic_both_keys_bad).wc(S::RemAccessErr));
    v.push(Case::new("errors::rc_atomic_bad_lkey_is_loc_prot_err", "IBTA 10.6.3.1, 10.7: an atomic whose local SGE has an invalid L_Key completes with LOC_PROT_ERR and its local buffer is unchanged; as in kernel rxe the L_Key is checked when the response lands, so the remote word has changed", atomic_bad_lkey).wc(S::LocProtErr));
    v.push(Case::new("errors::rc_atomic_local_buffer_not_8_bytes_is_loc_len_err", "IBTA 9.4.5, 10.7, manual 3.6.10: an atomic returns one 64-bit word into a local buffer of exactly 8 bytes; a 16-byte one completes with LOC_LEN_ERR before anything is sent (the remote word is unchanged)", atomic_not_8_bytes).wc(S::LocLenErr));
    v.push(Case::new("errors::rc_atomic_bad_rkey", "IBTA 9.7.4.1, manual 6.2.11: an atomic with an invalid R_Key completes with REM_ACCESS_ERR and the word is unchanged", atomic_bad_rkey).wc(S::RemAccessErr));
    v.push(
        Case::new(
            "errors::rc_write_beyond_region",
            "IBTA 9.7.4.1, 10.6: an access outside the region's bounds is a remote access error",
            write_beyond,
        )
        .wc(S::RemAccessErr),
    );
    v.push(
        Case::new(
            "errors::rc_write_without_remote_write_access",
            "IBTA 10.6.3.1: the region must grant REMOTE_WRITE",
            write_no_access,
        )
        .wc(S::RemAccessErr),
    );
    v.push(
        Case::new(
            "errors::rc_read_without_remote_read_access",
            "IBTA 10.6.3.1: the region must grant REMOTE_READ",
            read_no_access,
        )
        .wc(S::RemAccessErr),
    );
    v.push(
        Case::new(
            "errors::rc_atomic_without_remote_atomic_access",
            "IBTA 10.6.3.1: the region must grant REMOTE_ATOMIC",
            atomic_no_access,
        )
        .wc(S::RemAccessErr),
    );
    v.push(Case::new("errors::responder_gets_qp_access_err", "manual 6.1.4 IBV_EVENT_QP_ACCESS_ERR (IBTA 11.6): the responder's QP reports a remote access violation and goes to ERR", responder_access_event).event(E::QpAccessErr));
    v.push(Case::new("errors::rc_atomic_misaligned", "IBTA 9.4.5, manual 6.2.10: an atomic's address must be 8-byte aligned; the responder answers a misaligned one with an Invalid Request NAK (REM_INV_REQ_ERR); a device may refuse it at post time (EINVAL) instead", atomic_misaligned));
    v.push(Case::new("errors::rc_write_to_qp_without_remote_write", "IBTA 9.7.4.1, manual 6.1.3: the responder QP's access flags must allow RDMA WRITE; else Invalid Request, and the responder QP reports IBV_EVENT_QP_REQ_ERR", qp_no_write).wc(S::RemInvReqErr).event(E::QpReqErr));
    v.push(Case::new("errors::rc_send_longer_than_recv", "IBTA 9.7.5.2, manual 6.2.2: a SEND longer than the receive buffer: LOC_LEN_ERR at the responder, REM_INV_REQ_ERR at the requester", send_too_long).wc(S::LocLenErr).wc(S::RemInvReqErr));
    v.push(Case::new("errors::rc_recv_with_bad_lkey", "IBTA 9.7.5.2, manual 6.2.5, 6.2.12: a receive WR with an invalid L_Key: LOC_PROT_ERR at the responder, remote operational error (REM_OP_ERR) at the requester", recv_bad_lkey).wc(S::LocProtErr).wc(S::RemOpErr));
    v.push(Case::new("errors::rc_rnr_retry_exceeded", "IBTA 9.7.5.2.8, manual 3.5.4 rnr_retry: with no receive posted and rnr_retry 0 the SEND completes with RNR_RETRY_EXC_ERR", rnr_exceeded).wc(S::RnrRetryExcErr));
    v.push(Case::new("errors::rc_rnr_then_success", "IBTA 9.7.5.2.8: after an RNR NAK the requester retries; a receive posted meanwhile lets the SEND succeed", rnr_then_success));
    v.push(Case::new("errors::rc_retry_exceeded_peer_in_reset", "IBTA 9.7.6, manual 3.5.4 retry_cnt: with the peer QP in RESET no ACK comes; after retry_cnt retries: RETRY_EXC_ERR", retry_exceeded).wc(S::RetryExcErr));
    v.push(Case::new("errors::rc_read_with_max_rd_atomic_0", "IBTA 9.7, manual 3.5.4 (max_rd_atomic = 0: the QP may not initiate READ/atomics); the WR fails locally with LOC_QP_OP_ERR", read_no_credits).wc(S::LocQpOpErr));
    v.push(Case::new("errors::error_flushes_the_rest", "IBTA 10.8, manual 3.6.10 IBV_WC_WR_FLUSH_ERR: after an error completion the WRs behind it are flushed", flush_rest).wc(S::WrFlushErr));
    v.push(Case::new(
        "errors::post_more_sges_than_max_is_einval",
        "manual 3.6.5: num_sge may not exceed the QP's max_send_sge",
        too_many_sges,
    ));
    v.push(Case::new(
        "errors::inline_larger_than_max_is_einval",
        "manual 3.6.5 IBV_SEND_INLINE: the data may not exceed max_inline_data",
        inline_too_big,
    ));
    v.push(Case::new(
        "errors::uc_read_is_einval",
        "manual 2.2 (the table of operations per transport mode): UC has no RDMA READ",
        uc_read,
    ));
    v.push(Case::new(
        "errors::uc_atomic_is_einval",
        "manual 2.2: UC has no atomics",
        uc_atomic,
    ));
    v.push(Case::new("errors::rc_short_read_response_is_bad_resp", "IBTA 9.9: a READ response whose length does not fit its position is a bad response: BAD_RESP_ERR (manual 3.6.10)", short_read_response).wc(S::BadRespErr).faulty());
    v.push(Case::new("errors::rc_lost_acks_exhaust_retries", "IBTA 9.7.6: a requester that never sees an ACK retries retry_cnt times, then RETRY_EXC_ERR", lost_acks).wc(S::RetryExcErr).faulty());
    v.push(Case::new("events::comm_est_on_first_packet_in_rtr", "manual 6.1.5 IBV_EVENT_COMM_EST; IBTA 11.6.3: the first packet received by a QP in RTR", comm_est).event(E::CommEst));
    v.push(Case::new("events::sq_drained_after_sqd", "manual 6.1.6 IBV_EVENT_SQ_DRAINED; IBTA 11.6.3: RTS->SQD with en_sqd_async_notify raises it once the send queue is drained", sq_drained).event(E::SqDrained));
}

fn write_bad_rkey(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.b.buf.fill(0);
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 64)], p.b.addr(0), p.b.mr.rkey ^ 0x5500).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    assert!(
        p.b.buf.to_vec().iter().all(|&b| b == 0),
        "bytes were written"
    );
    Outcome::Pass
}

fn read_bad_rkey(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.post_send(
        p.a.qpn,
        SendWr::rdma_read(1, vec![p.a.sge(0, 64)], p.b.addr(0), p.b.mr.rkey ^ 0x5500).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    Outcome::Pass
}

fn atomic_bad_rkey(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.b.buf.write_u64(64, 7).unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::atomic_fetch_add(1, p.a.sge(0, 8), p.b.addr(64), p.b.mr.rkey ^ 0x5500, 1)
            .signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    assert_eq!(p.b.buf.read_u64(64).unwrap(), 7);
    Outcome::Pass
}

/// An SGE over `len` bytes of a's buffer with an L_Key that names no region.
fn bad_lkey_sge(p: &Pair, len: u32) -> verbs_api::Sge {
    verbs_api::Sge {
        lkey: p.a.mr.lkey ^ 0x5500,
        ..p.a.sge(0, len)
    }
}

fn read_both_keys_bad(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.b.buf.write(0, &[0x77; 64]).unwrap();
    let rkey = p.b.mr.rkey ^ 0x5500;
    let read = SendWr::rdma_read(1, vec![bad_lkey_sge(&p, 64)], p.b.addr(0), rkey);
    env.post_send(p.a.qpn, read.signaled());
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    assert!(
        p.a.buf.to_vec().iter().all(|&x| x == 0),
        "bytes were written"
    );
    Outcome::Pass
}

fn read_bad_lkey(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.b.buf.write(0, &[0x77; 64]).unwrap();
    let read = SendWr::rdma_read(1, vec![bad_lkey_sge(&p, 64)], p.b.addr(0), p.b.mr.rkey);
    env.post_send(p.a.qpn, read.signaled());
    assert_eq!(env.poll_one(p.a.cq).status, S::LocProtErr);
    assert!(
        p.a.buf.to_vec().iter().all(|&x| x == 0),
        "bytes were written"
    );
    Outcome::Pass
}

fn atomic_both_keys_bad(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.a.buf.write_u64(0, 1).unwrap();
    p.b.buf.write_u64(64, 2).unwrap();
    let rkey = p.b.mr.rkey ^ 0x5500;
    let wr = SendWr::atomic_fetch_add(1, bad_lkey_sge(&p, 8), p.b.addr(64), rkey, 1);
    env.post_send(p.a.qpn, wr.signaled());
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    assert_eq!(p.a.buf.read_u64(0).unwrap(), 1);
    assert_eq!(p.b.buf.read_u64(64).unwrap(), 2);
    Outcome::Pass
}

fn atomic_bad_lkey(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.a.buf.write_u64(0, 1).unwrap();
    p.b.buf.write_u64(64, 2).unwrap();
    let wr = SendWr::atomic_fetch_add(1, bad_lkey_sge(&p, 8), p.b.addr(64), p.b.mr.rkey, 1);
    env.post_send(p.a.qpn, wr.signaled());
    assert_eq!(env.poll_one(p.a.cq).status, S::LocProtErr);
    assert_eq!(
        p.a.buf.read_u64(0).unwrap(),
        1,
        "the local word was written"
    );
    assert_eq!(
        p.b.buf.read_u64(64).unwrap(),
        3,
        "the remote add did not run"
    );
    Outcome::Pass
}

fn atomic_not_8_bytes(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.a.buf.write_u64(0, 1).unwrap();
    p.b.buf.write_u64(64, 2).unwrap();
    let wr = SendWr::atomic_cmp_swp(1, p.a.sge(0, 16), p.b.addr(64), p.b.mr.rkey, 2, 3);
    env.post_send(p.a.qpn, wr.signaled());
    assert_eq!(env.poll_one(p.a.cq).status, S::LocLenErr);
    assert_eq!(p.a.buf.read_u64(0).unwrap(), 1);
    assert_eq!(p.b.buf.read_u64(64).unwrap(), 2, "the compare-and-swap ran");
    Outcome::Pass
}

/// A pair whose responder has an extra 4 KiB region with `access`: (pair, mr, buf).
fn with_region(env: &Env, access: A) -> (Pair, verbs_api::MrInfo, verbs_api::MemBuf) {
    let p = env.pair(QpType::Rc);
    let (buf, mr) = env.mr(p.pd, 4096, access);
    (p, mr, buf)
}

fn write_beyond(env: &Env) -> Outcome {
    let (p, mr, buf) = with_region(env, crate::env::all_access());
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 64)], mr.addr + 4096 - 32, mr.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    assert!(buf.to_vec().iter().all(|&b| b == 0), "bytes were written");
    Outcome::Pass
}

fn write_no_access(env: &Env) -> Outcome {
    let (p, mr, buf) = with_region(env, A::LOCAL_WRITE | A::REMOTE_READ);
    p.a.buf.fill(1);
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 64)], mr.addr, mr.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    assert!(buf.to_vec().iter().all(|&b| b == 0), "bytes were written");
    Outcome::Pass
}

fn read_no_access(env: &Env) -> Outcome {
    let (p, mr, _buf) = with_region(env, A::LOCAL_WRITE | A::REMOTE_WRITE);
    env.post_send(
        p.a.qpn,
        SendWr::rdma_read(1, vec![p.a.sge(0, 64)], mr.addr, mr.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    Outcome::Pass
}

fn atomic_no_access(env: &Env) -> Outcome {
    let (p, mr, buf) = with_region(env, A::LOCAL_WRITE | A::REMOTE_WRITE | A::REMOTE_READ);
    env.post_send(
        p.a.qpn,
        SendWr::atomic_fetch_add(1, p.a.sge(0, 8), mr.addr, mr.rkey, 1).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    assert_eq!(buf.read_u64(0).unwrap(), 0);
    Outcome::Pass
}

fn responder_access_event(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 64)], p.b.addr(0), p.b.mr.rkey ^ 0x5500).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::QpAccessErr, EventElement::Qp(p.b.qpn))
    );
    Outcome::Pass
}

fn atomic_misaligned(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let wr = SendWr::atomic_fetch_add(1, p.a.sge(0, 8), p.b.addr(66), p.b.mr.rkey, 1).signaled();
    match env.dev.post_send(p.a.qpn, &[wr]) {
        Err(e) => assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}"),
        Ok(()) => assert_eq!(env.poll_one(p.a.cq).status, S::RemInvReqErr),
    }
    assert_eq!(p.b.buf.read_u64(64).unwrap(), 0);
    Outcome::Pass
}

fn qp_no_write(env: &Env) -> Outcome {
    let mut params = env.params();
    params.access = A::LOCAL_WRITE | A::REMOTE_READ;
    let p = env.pair_with(QpType::Rc, &params, default_cap(), 64);
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 64)], p.b.addr(0), p.b.mr.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RemInvReqErr);
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::QpReqErr, EventElement::Qp(p.b.qpn))
    );
    Outcome::Pass
}

fn send_too_long(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.post_recv(p.b.qpn, RecvWr::new(2, vec![p.b.sge(0, 100)]));
    env.post_send(p.a.qpn, SendWr::send(1, vec![p.a.sge(0, 200)]).signaled());
    assert_eq!(env.poll_one(p.b.cq).status, S::LocLenErr);
    assert_eq!(env.poll_one(p.a.cq).status, S::RemInvReqErr);
    Outcome::Pass
}

fn recv_bad_lkey(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let mut sge = p.b.sge(0, 100);
    sge.lkey ^= 0x5500;
    env.post_recv(p.b.qpn, RecvWr::new(2, vec![sge]));
    env.post_send(p.a.qpn, SendWr::send(1, vec![p.a.sge(0, 50)]).signaled());
    assert_eq!(env.poll_one(p.b.cq).status, S::LocProtErr);
    assert_eq!(env.poll_one(p.a.cq).status, S::RemOpErr);
    Outcome::Pass
}

fn rnr_exceeded(env: &Env) -> Outcome {
    let mut params = env.params();
    params.rnr_retry = 0;
    let p = env.pair_with(QpType::Rc, &params, default_cap(), 64);
    env.post_send(p.a.qpn, SendWr::send(1, vec![p.a.sge(0, 8)]).signaled());
    assert_eq!(env.poll_one(p.a.cq).status, S::RnrRetryExcErr);
    Outcome::Pass
}

fn rnr_then_success(env: &Env) -> Outcome {
    let mut params = env.params();
    params.min_rnr_timer = 14; // 1.28 ms between tries
    let p = env.pair_with(QpType::Rc, &params, default_cap(), 64);
    p.a.buf.write(0, b"late").unwrap();
    env.post_send(p.a.qpn, SendWr::send(1, vec![p.a.sge(0, 4)]).signaled());
    std::thread::sleep(Duration::from_millis(5));
    env.post_recv(p.b.qpn, RecvWr::new(2, vec![p.b.sge(0, 64)]));
    assert_eq!(env.poll_one(p.a.cq).status, S::Success);
    assert_eq!(env.poll_one(p.b.cq).byte_len, 4);
    Outcome::Pass
}

fn retry_exceeded(env: &Env) -> Outcome {
    let mut params = env.params();
    params.timeout = 8; // ~1 ms per try
    params.retry_cnt = 2;
    let p = env.pair_with(QpType::Rc, &params, default_cap(), 64);
    env.dev
        .modify_qp(
            p.b.qpn,
            &QpAttr {
                qp_state: QpState::Reset,
                ..QpAttr::default()
            },
            M::STATE,
        )
        .expect("peer to RESET");
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RetryExcErr);
    Outcome::Pass
}

fn read_no_credits(env: &Env) -> Outcome {
    let mut params = env.params();
    params.max_rd_atomic = 0;
    let p = env.pair_with(QpType::Rc, &params, default_cap(), 64);
    let r = env.dev.post_send(
        p.a.qpn,
        &[SendWr::rdma_read(1, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey).signaled()],
    );
    if let Err(e) = r {
        // Refusing at post time is the other reading of the rule.
        assert_eq!(e.error.errno(), EINVAL, "{e:?}");
        return Outcome::Skip("the device refuses the READ at post time (EINVAL) instead".into());
    }
    assert_eq!(env.poll_one(p.a.cq).status, S::LocQpOpErr);
    Outcome::Pass
}

fn flush_rest(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey ^ 0x5500).signaled(),
    );
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(2, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey).signaled(),
    );
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(3, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    for id in [2, 3] {
        let wc = env.poll_one(p.a.cq);
        assert_eq!((wc.wr_id, wc.status), (id, S::WrFlushErr), "{wc:?}");
    }
    Outcome::Pass
}

fn too_many_sges(env: &Env) -> Outcome {
    let cap = QpCap {
        max_send_sge: 2,
        ..default_cap()
    };
    let p = env.pair_with(QpType::Rc, &env.params(), cap, 64);
    let actual = env
        .dev
        .query_qp(p.a.qpn)
        .expect("query_qp")
        .1
        .cap
        .max_send_sge as u64;
    let sges: Vec<verbs_api::Sge> = (0..=actual).map(|i| p.a.sge(i * 8, 8)).collect();
    let e = env
        .dev
        .post_send(
            p.a.qpn,
            &[SendWr::rdma_write(1, sges, p.b.addr(0), p.b.mr.rkey)],
        )
        .expect_err("posted");
    assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}");
    Outcome::Pass
}

fn inline_too_big(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let max = env
        .dev
        .query_qp(p.a.qpn)
        .expect("query_qp")
        .1
        .cap
        .max_inline_data;
    let wr = SendWr::rdma_write(1, vec![p.a.sge(0, max + 1)], p.b.addr(0), p.b.mr.rkey)
        .with_flags(SendFlags::INLINE);
    let e = env.dev.post_send(p.a.qpn, &[wr]).expect_err("posted");
    assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}");
    Outcome::Pass
}

fn uc_read(env: &Env) -> Outcome {
    let p = env.pair(QpType::Uc);
    let e = env
        .dev
        .post_send(
            p.a.qpn,
            &[SendWr::rdma_read(
                1,
                vec![p.a.sge(0, 8)],
                p.b.addr(0),
                p.b.mr.rkey,
            )],
        )
        .expect_err("posted");
    assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}");
    Outcome::Pass
}

fn uc_atomic(env: &Env) -> Outcome {
    let p = env.pair(QpType::Uc);
    let e = env
        .dev
        .post_send(
            p.a.qpn,
            &[SendWr::atomic_fetch_add(
                1,
                p.a.sge(0, 8),
                p.b.addr(0),
                p.b.mr.rkey,
                1,
            )],
        )
        .expect_err("posted");
    assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}");
    Outcome::Pass
}

fn comm_est(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let a = env.qp(pd, cq, QpType::Rc, default_cap());
    let b = env.qp(pd, cq, QpType::Rc, default_cap());
    let (buf, mr) = env.mr(pd, 4096, crate::env::all_access());
    let _ = buf;
    let gid = env.gid();
    let params = env.params();
    let ea = verbs_api::Endpoint {
        lid: 0,
        qpn: a,
        psn: 1,
        gid,
    };
    let eb = verbs_api::Endpoint {
        lid: 0,
        qpn: b,
        psn: 2,
        gid,
    };
    verbs_api::connect_qp(&*env.dev, a, QpType::Rc, &params, 1, &eb).expect("connect a");
    // b stops at RTR.
    for (attr, mask) in [params.init(QpType::Rc), params.rtr(QpType::Rc, &ea)] {
        env.dev.modify_qp(b, &attr, mask).expect("b to RTR");
    }
    let sge = verbs_api::Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    env.post_recv(
        b,
        RecvWr::new(
            2,
            vec![verbs_api::Sge {
                addr: mr.addr + 512,
                length: 64,
                lkey: mr.lkey,
            }],
        ),
    );
    env.post_send(a, SendWr::send(1, vec![sge]));
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::CommEst, EventElement::Qp(b))
    );
    assert_eq!(env.poll_one(cq).wr_id, 2);
    Outcome::Pass
}

fn sq_drained(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    for i in 0..4 {
        env.post_send(
            p.a.qpn,
            SendWr::rdma_write(i, vec![p.a.sge(0, 4096)], p.b.addr(0), p.b.mr.rkey),
        );
    }
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    env.dev
        .modify_qp(p.a.qpn, &attr, M::STATE | M::EN_SQD_ASYNC_NOTIFY)
        .expect("RTS->SQD");
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::SqDrained, EventElement::Qp(p.a.qpn))
    );
    Outcome::Pass
}

fn short_read_response(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.faults().truncate_next_read_response(8);
    env.post_send(
        p.a.qpn,
        SendWr::rdma_read(1, vec![p.a.sge(0, 64)], p.b.addr(0), p.b.mr.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::BadRespErr);
    Outcome::Pass
}

fn lost_acks(env: &Env) -> Outcome {
    let mut params = env.params();
    params.retry_cnt = 3;
    let p = env.pair_with(QpType::Rc, &params, default_cap(), 64);
    env.faults().drop_all_acks();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::RetryExcErr);
    // The responder executed the WRITE once: its bytes are there.
    Outcome::Pass
}
