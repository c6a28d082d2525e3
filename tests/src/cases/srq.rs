//! Shared receive queues (manual 3.4.5-3.4.7, 3.6.2, 3.6.6; IBTA 10.2.9, 11.2.3).

use verbs_api::{
    AsyncEventType as E, Endpoint, EventElement, QpAttr, QpAttrMask as M, QpInitAttr, QpState,
    QpType, RecvWr, SendWr, SrqAttr, SrqAttrMask, SrqId, WcStatus,
};

use super::{
    assert_errno,
    errno::{EBUSY, EINVAL},
};
use crate::env::{all_access, default_cap};
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("srq::create_query_destroy", "manual 3.4.5, 3.6.2, 3.4.7: ibv_create_srq/ibv_query_srq/ibv_destroy_srq; a new SRQ is unarmed", create_query_destroy));
    v.push(Case::new(
        "srq::destroy_while_used_is_ebusy",
        "manual 3.4.7: an SRQ attached to a QP cannot be destroyed",
        destroy_busy,
    ));
    v.push(Case::new(
        "srq::post_recv_on_srq_qp_is_einval",
        "manual 3.6.4: a QP attached to an SRQ has no receive queue of its own",
        post_recv_on_qp,
    ));
    v.push(Case::new(
        "srq::two_qps_share_the_receives",
        "IBTA 10.2.9: QPs on one SRQ take their receive WRs from it, in order",
        two_qps,
    ));
    v.push(Case::new("srq::limit_reached_fires_once_per_arming", "manual 3.4.6, 6.1.16 IBV_EVENT_SRQ_LIMIT_REACHED: once the SRQ holds fewer WRs than srq_limit, one event, and the SRQ disarms (srq_limit reads 0)", limit_event).event(E::SrqLimitReached));
    v.push(Case::new(
        "srq::limit_above_max_wr_is_einval",
        "manual 3.4.6: srq_limit may not exceed max_wr",
        limit_too_big,
    ));
    v.push(Case::new("srq::last_wqe_reached_on_error", "manual 6.1.17 IBV_EVENT_QP_LAST_WQE_REACHED (IBTA 11.6): a QP on an SRQ that goes to ERR reports its last WQE", last_wqe).event(E::QpLastWqeReached));
    v.push(Case::new("srq::of_another_pd_checks_lkeys_in_its_own", "IBTA 10.2.9 (an SRQ has a PD of its own; a QP of another PD may use it), 10.6.3.1: the L_Keys of the SRQ's receive WRs are checked in the SRQ's PD, so a receive buffer registered there takes the message", srq_other_pd_ok).wc(WcStatus::Success));
    v.push(Case::new("srq::of_another_pd_refuses_lkeys_of_the_qps", "IBTA 10.2.9, 10.6.3.1, 9.9: a receive WR of an SRQ whose buffer is registered in the QP's PD, not the SRQ's, fails its L_Key check: LOC_PROT_ERR for the receive, REM_OP_ERR for the sender", srq_other_pd_bad).wc(WcStatus::LocProtErr).wc(WcStatus::RemOpErr));
    v.push(Case::new("srq::rnr_when_empty", "IBTA 9.7.5.2.8: a SEND to a QP whose SRQ is empty is RNR NAKed; rnr_retry 0 ends in RNR_RETRY_EXC_ERR", rnr_empty).wc(WcStatus::RnrRetryExcErr));
}

fn srq(env: &Env, pd: verbs_api::PdId, max_wr: u32) -> SrqId {
    env.dev
        .create_srq(
            pd,
            &SrqAttr {
                max_wr,
                max_sge: 2,
                srq_limit: 0,
            },
        )
        .expect("create_srq")
}

/// A QP on `srq` connected to a plain RC QP: (sender qpn, sender cq, receiver qpn, receiver cq, mr, buf).
struct Rig {
    sender: u32,
    scq: verbs_api::CqId,
    receiver: u32,
    rcq: verbs_api::CqId,
    mr: verbs_api::MrInfo,
    _buf: verbs_api::MemBuf,
}

fn rig(env: &Env, pd: verbs_api::PdId, srq: SrqId, params: &verbs_api::QpParams) -> Rig {
    let scq = env.cq(64);
    let rcq = env.cq(64);
    let sender = env.qp(pd, scq, QpType::Rc, default_cap());
    let receiver = env
        .dev
        .create_qp(&QpInitAttr::new(pd, rcq, QpType::Rc, default_cap()).srq(srq))
        .expect("create_qp on the SRQ");
    let gid = env.gid();
    let es = Endpoint {
        lid: 0,
        qpn: sender,
        psn: 1,
        gid,
    };
    let er = Endpoint {
        lid: 0,
        qpn: receiver,
        psn: 2,
        gid,
    };
    verbs_api::connect_qp(&*env.dev, sender, QpType::Rc, params, 1, &er).expect("connect sender");
    verbs_api::connect_qp(&*env.dev, receiver, QpType::Rc, params, 2, &es)
        .expect("connect receiver");
    let (buf, mr) = env.mr(pd, 1 << 16, all_access());
    Rig {
        sender,
        scq,
        receiver,
        rcq,
        mr,
        _buf: buf,
    }
}

fn sge(mr: &verbs_api::MrInfo, off: u64, len: u32) -> verbs_api::Sge {
    verbs_api::Sge {
        addr: mr.addr + off,
        length: len,
        lkey: mr.lkey,
    }
}

fn post_srq(env: &Env, srq: SrqId, mr: &verbs_api::MrInfo, ids: std::ops::Range<u64>) {
    let wrs: Vec<_> = ids
        .map(|i| RecvWr::new(i, vec![sge(mr, 4096 + i * 256, 256)]))
        .collect();
    env.dev.post_srq_recv(srq, &wrs).expect("post_srq_recv");
}

fn create_query_destroy(env: &Env) -> Outcome {
    let pd = env.pd();
    let s = srq(env, pd, 16);
    let a = env.dev.query_srq(s).expect("query_srq");
    assert!(a.max_wr >= 16, "{a:?}");
    assert_eq!(a.srq_limit, 0);
    env.dev.destroy_srq(s).expect("destroy_srq");
    assert_errno(env.dev.destroy_srq(s), EINVAL);
    Outcome::Pass
}

fn destroy_busy(env: &Env) -> Outcome {
    let pd = env.pd();
    let s = srq(env, pd, 16);
    let r = rig(env, pd, s, &env.params());
    assert_errno(env.dev.destroy_srq(s), EBUSY);
    env.dev.destroy_qp(r.receiver).expect("destroy_qp");
    env.dev.destroy_srq(s).expect("destroy_srq");
    Outcome::Pass
}

fn post_recv_on_qp(env: &Env) -> Outcome {
    let pd = env.pd();
    let s = srq(env, pd, 16);
    let r = rig(env, pd, s, &env.params());
    let e = env
        .dev
        .post_recv(r.receiver, &[RecvWr::new(1, vec![sge(&r.mr, 0, 64)])])
        .expect_err("posted");
    assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}");
    Outcome::Pass
}

fn two_qps(env: &Env) -> Outcome {
    let pd = env.pd();
    let s = srq(env, pd, 32);
    let r1 = rig(env, pd, s, &env.params());
    let r2 = rig(env, pd, s, &env.params());
    post_srq(env, s, &r1.mr, 0..4);
    env.post_send(
        r1.sender,
        SendWr::send(1, vec![sge(&r1.mr, 0, 10)]).signaled(),
    );
    assert_eq!(env.poll_one(r1.scq).status, WcStatus::Success);
    env.post_send(
        r2.sender,
        SendWr::send(2, vec![sge(&r2.mr, 0, 20)]).signaled(),
    );
    assert_eq!(env.poll_one(r2.scq).status, WcStatus::Success);
    let w1 = env.poll_one(r1.rcq);
    let w2 = env.poll_one(r2.rcq);
    assert_eq!(
        (w1.wr_id, w1.qp_num, w1.byte_len),
        (0, r1.receiver, 10),
        "{w1:?}"
    );
    assert_eq!(
        (w2.wr_id, w2.qp_num, w2.byte_len),
        (1, r2.receiver, 20),
        "{w2:?}"
    );
    Outcome::Pass
}

fn limit_event(env: &Env) -> Outcome {
    let pd = env.pd();
    let s = srq(env, pd, 32);
    let r = rig(env, pd, s, &env.params());
    post_srq(env, s, &r.mr, 0..4);
    env.dev
        .modify_srq(
            s,
            &SrqAttr {
                max_wr: 0,
                max_sge: 0,
                srq_limit: 3,
            },
            SrqAttrMask::LIMIT,
        )
        .expect("arm the limit");
    for i in 0..3 {
        env.post_send(r.sender, SendWr::send(i, vec![sge(&r.mr, 0, 8)]).signaled());
        assert_eq!(env.poll_one(r.scq).status, WcStatus::Success);
    }
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::SrqLimitReached, EventElement::Srq(s.0))
    );
    assert_eq!(
        env.dev.query_srq(s).expect("query_srq").srq_limit,
        0,
        "the SRQ should disarm"
    );
    // No second event without a new arming.
    assert!(env
        .dev
        .get_async_event(Some(std::time::Duration::from_millis(30)))
        .is_err());
    Outcome::Pass
}

fn limit_too_big(env: &Env) -> Outcome {
    let pd = env.pd();
    let s = srq(env, pd, 16);
    let max = env.dev.query_srq(s).expect("query_srq").max_wr;
    assert_errno(
        env.dev.modify_srq(
            s,
            &SrqAttr {
                max_wr: 0,
                max_sge: 0,
                srq_limit: max + 1,
            },
            SrqAttrMask::LIMIT,
        ),
        EINVAL,
    );
    Outcome::Pass
}

fn last_wqe(env: &Env) -> Outcome {
    let pd = env.pd();
    let s = srq(env, pd, 16);
    let r = rig(env, pd, s, &env.params());
    env.dev
        .modify_qp(
            r.receiver,
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            M::STATE,
        )
        .expect("to ERR");
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::QpLastWqeReached, EventElement::Qp(r.receiver))
    );
    Outcome::Pass
}

fn rnr_empty(env: &Env) -> Outcome {
    let pd = env.pd();
    let s = srq(env, pd, 16);
    let mut params = env.params();
    params.rnr_retry = 0;
    let r = rig(env, pd, s, &params);
    env.post_send(r.sender, SendWr::send(1, vec![sge(&r.mr, 0, 8)]).signaled());
    assert_eq!(env.poll_one(r.scq).status, WcStatus::RnrRetryExcErr);
    Outcome::Pass
}

/// A QP of one PD on an SRQ of another, with a receive buffer registered in `recv_pd`
/// posted to the SRQ; sends 16 bytes and returns (sender's, receiver's) completions.
fn other_pd_send(
    env: &Env,
    recv_in_srq_pd: bool,
) -> (verbs_api::WorkCompletion, verbs_api::WorkCompletion) {
    let srq_pd = env.pd();
    let qp_pd = env.pd();
    let s = srq(env, srq_pd, 16);
    let r = rig(env, qp_pd, s, &env.params());
    let (rbuf, rmr) = env.mr(
        if recv_in_srq_pd { srq_pd } else { qp_pd },
        4096,
        all_access(),
    );
    env.dev
        .post_srq_recv(s, &[RecvWr::new(7, vec![sge(&rmr, 0, 64)])])
        .expect("post_srq_recv");
    r._buf.write(0, &[0x5A; 16]).unwrap();
    env.post_send(
        r.sender,
        SendWr::send(1, vec![sge(&r.mr, 0, 16)]).signaled(),
    );
    let sent = env.poll_one(r.scq);
    let got = env.poll_one(r.rcq);
    let mut head = [0u8; 16];
    rbuf.read(0, &mut head).unwrap();
    let expect = if got.status == WcStatus::Success {
        [0x5A; 16]
    } else {
        [0; 16]
    };
    assert_eq!(head, expect, "receive buffer after {got:?}");
    (sent, got)
}

fn srq_other_pd_ok(env: &Env) -> Outcome {
    let (sent, got) = other_pd_send(env, true);
    assert_eq!(sent.status, WcStatus::Success, "{sent:?}");
    assert_eq!(
        (got.wr_id, got.status, got.byte_len),
        (7, WcStatus::Success, 16),
        "{got:?}"
    );
    Outcome::Pass
}

fn srq_other_pd_bad(env: &Env) -> Outcome {
    let (sent, got) = other_pd_send(env, false);
    assert_eq!(sent.status, WcStatus::RemOpErr, "{sent:?}");
    assert_eq!(
        (got.wr_id, got.status),
        (7, WcStatus::LocProtErr),
        "{got:?}"
    );
    Outcome::Pass
}
