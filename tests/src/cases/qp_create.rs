//! Creating a QP (manual 3.4.3 ibv_create_qp, 3.4.4 ibv_destroy_qp, 3.6.1
//! ibv_query_qp; IBTA 11.2.4.1 Create QP): the objects it names must exist, its type
//! must be one the device implements, its capacities may reach but not pass the
//! device's limits, a QP may have no send WRs at all; a destroyed QP's number names
//! nothing and QP numbers stay unique; a fresh QP reports what it was created with;
//! the READ/atomic depths a modify sets may not pass the device's limits.
//!
//! google/rdma-unit-test's `QpTest` (`CreateWithInvalidSendCq`, `CreateWithInvalidRecvCq`,
//! `CreateWithInvalidSrq`, `UnknownType`, `ZeroSendWr`, `ExceedsDeviceCap`,
//! `CreateWithInlineMax`) checks the same conditions. Send WRs and send SGEs beyond the
//! device are in `qp_state` (`qp::max_*_beyond_device_is_einval`).

use std::collections::HashSet;

use verbs_api::{
    QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState as S, QpType, RecvWr, SendWr, SrqAttr,
    WcStatus,
};

use super::rq_limits::scatter_check;
use super::{
    assert_errno,
    errno::{EINVAL, ENOMEM, EOPNOTSUPP},
};
use crate::env::{default_cap, PairSpec, PSN_A, PSN_B};
use crate::{Case, Env, Outcome};

/// What a QP beyond a device limit asks for too much of.
const BEYOND: [&str; 3] = ["max_recv_wr", "max_recv_sge", "max_inline_data"];

/// What `create_qp` is given that does not exist.
const MISSING: [&str; 4] = ["pd", "send_cq", "recv_cq", "srq"];

pub(super) fn register(v: &mut Vec<Case>) {
    for (i, what) in MISSING.iter().enumerate() {
        v.push(Case::param(format!("qp_create::destroyed_{what}_is_einval"), "manual 3.4.3 ibv_create_qp (the PD, the CQs and the SRQ must have been created before; a QP is made on live objects), IBTA 11.2.4.1: a PD, CQ or SRQ that was destroyed is refused with EINVAL (google/rdma-unit-test QpTest.CreateWithInvalidSendCq/RecvCq/Srq)", missing_object, i as u64));
    }
    v.push(Case::new("qp_create::unimplemented_type_is_refused", "manual 3.4.3 qp_type (RC, UC, UD, XRC, RAW_PACKET; a device implements a subset), IBTA 11.2.4.1: a RoCE software device has no raw packet QPs, so ibv_create_qp refuses IBV_QPT_RAW_PACKET (EOPNOTSUPP, or EINVAL for an unknown value) and creates nothing (google/rdma-unit-test QpTest.UnknownType)", unimplemented_type));
    v.push(Case::new("qp_create::zero_send_wrs_makes_a_receive_only_qp", "manual 3.4.3 cap.max_send_wr (the send queue's size; 0 is a size), google/rdma-unit-test QpTest.ZeroSendWr: the QP is created, receives a peer's SEND, and a send WR posted to its empty queue is refused with ENOMEM (manual 3.6.5)", zero_send_wr).wc(WcStatus::Success));
    for (i, what) in BEYOND.iter().enumerate() {
        v.push(Case::param(format!("qp_create::{what}_beyond_device_is_einval"), "manual 3.4.3 struct ibv_qp_cap (the values may not exceed the device's: max_qp_wr, max_sge of ibv_query_device, 3.3.1; inline data is bounded by the device too), IBTA 11.2.4.1: ibv_create_qp fails with EINVAL (google/rdma-unit-test QpTest.ExceedsDeviceCap)", beyond_device, i as u64));
    }
    v.push(Case::param("qp_create::max_wrs_at_device_limit_are_granted", "manual 3.4.3 (cap.max_send_wr and max_recv_wr may reach the device's max_qp_wr, 3.3.1; the QP gets at least what it asked for), 3.6.4: a QP with both queues at max_qp_wr WRs is created, reports at least that, takes max_qp_wr receive WRs in one post, and the first of them takes a message", at_limits, 0).wc(WcStatus::Success));
    v.push(Case::param("qp_create::max_sges_at_device_limit_carry_a_message", "manual 3.4.3 (cap.max_send_sge and max_recv_sge may reach the device's max_sge, 3.3.1), 3.6.4-3.6.5: a QP with both at max_sge is created, reports at least that, and carries a SEND gathered from max_sge SGEs into a receive that scatters it over max_sge SGEs", at_limits, 1).wc(WcStatus::Success));
    v.push(Case::new("qp_create::destroyed_qpn_names_no_qp", "manual 3.4.4 ibv_destroy_qp (the QP is gone), 3.5.1, 3.6.1, 3.6.4-3.6.5: on the number of a destroyed QP, query, modify, post_send, post_recv and a second destroy fail with EINVAL", destroyed_qpn));
    v.push(Case::new("qp_create::qpns_stay_unique_and_reuse_starts_fresh", "IBTA 10.2.4 (a QP number names one QP of the channel adapter), manual 3.4.3-3.4.4: across creating and destroying QPs no two live QPs share a number, and a QP that gets a freed number starts in RESET with its own type and capacities, nothing of the destroyed QP", qpn_reuse));
    v.push(Case::new("qp_create::query_of_a_fresh_qp", "manual 3.4.3 (a created QP is in RESET), 3.6.1 ibv_query_qp: init_attr returns the PD, send and receive CQs, type, sq_sig_all and no SRQ it was created with, cap at least what was asked for, and attr.cap equal to init_attr.cap", query_fresh));
    v.push(Case::param("qp_create::max_rd_atomic_beyond_device_is_einval", "manual 3.5.4 ibv_modify_qp max_rd_atomic (READs/atomics the QP may have outstanding as initiator; bounded by max_qp_init_rd_atom of ibv_query_device, 3.3.1), IBTA 11.2.4.2: RTR->RTS with one more is EINVAL and the QP stays in RTR", rd_atomic_beyond, 0));
    v.push(Case::param("qp_create::max_dest_rd_atomic_beyond_device_is_einval", "manual 3.5.3 ibv_modify_qp max_dest_rd_atomic (READs/atomics the QP answers at once; bounded by max_qp_rd_atom, 3.3.1), IBTA 11.2.4.2: INIT->RTR with one more is EINVAL and the QP stays in INIT", rd_atomic_beyond, 1));
}

fn srq_attr() -> SrqAttr {
    SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    }
}

fn missing_object(env: &Env, which: u64) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let mut init = QpInitAttr::new(pd, cq, QpType::Rc, default_cap());
    match MISSING[which as usize] {
        "pd" => {
            let gone = env.pd();
            env.dev.dealloc_pd(gone).expect("dealloc_pd");
            init.pd = gone;
        }
        "send_cq" | "recv_cq" => {
            let gone = env.cq(16);
            env.dev.destroy_cq(gone).expect("destroy_cq");
            if which == 1 {
                init.send_cq = gone;
            } else {
                init.recv_cq = gone;
            }
        }
        _ => {
            let gone = env.dev.create_srq(pd, &srq_attr()).expect("create_srq");
            env.dev.destroy_srq(gone).expect("destroy_srq");
            init.srq = Some(gone);
        }
    }
    assert_errno(env.dev.create_qp(&init), EINVAL);
    // The refusal left the good objects whole: the same call with them succeeds.
    let qpn = env
        .dev
        .create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, default_cap()))
        .expect("create_qp on the live objects");
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    Outcome::Pass
}

fn unimplemented_type(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    match env
        .dev
        .create_qp(&QpInitAttr::new(pd, cq, QpType::RawPacket, default_cap()))
    {
        Ok(qpn) => panic!("a raw packet QP {qpn:#x} was created"),
        Err(e) => assert!(
            [EOPNOTSUPP, EINVAL].contains(&e.errno()),
            "expected EOPNOTSUPP or EINVAL, got {e:?}"
        ),
    }
    // Nothing of it holds the PD or the CQ.
    env.dev.destroy_cq(cq).expect("destroy_cq");
    env.dev.dealloc_pd(pd).expect("dealloc_pd");
    Outcome::Pass
}

fn zero_send_wr(env: &Env) -> Outcome {
    let params = env.params();
    let spec = PairSpec {
        a_upto: S::Reset,
        b_upto: S::Reset,
        ..PairSpec::default()
    };
    let p = env.pair_spec(QpType::Rc, &params, default_cap(), 64, &spec);
    // b is replaced by a QP with no send queue.
    env.dev.destroy_qp(p.b.qpn).expect("destroy_qp");
    let mut init = QpInitAttr::new(p.pd, p.b.cq, QpType::Rc, default_cap());
    init.cap.max_send_wr = 0;
    let b = env
        .dev
        .create_qp(&init)
        .expect("create_qp with max_send_wr 0");
    let (_, got) = env.dev.query_qp(b).expect("query_qp");
    let (a_ep, b_ep) = (env.endpoint(p.a.qpn, PSN_A), env.endpoint(b, PSN_B));
    env.raise(b, QpType::Rc, &params, PSN_B, &a_ep, S::Reset, S::Rts);
    env.raise(p.a.qpn, QpType::Rc, &params, PSN_A, &b_ep, S::Reset, S::Rts);
    env.post_recv(b, RecvWr::new(9, vec![p.b.sge(0, 64)]));
    p.a.buf.write(0, b"no send queue").unwrap();
    env.post_send(p.a.qpn, SendWr::send(1, vec![p.a.sge(0, 13)]).signaled());
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.qp_num),
        (9, WcStatus::Success, 13, b),
        "{wc:?}"
    );
    if got.cap.max_send_wr == 0 {
        let e = env
            .dev
            .post_send(b, &[SendWr::send(2, vec![p.b.sge(0, 8)])])
            .expect_err("a send WR fit in a send queue of 0 WRs");
        assert_eq!((e.index, e.error.errno()), (0, ENOMEM), "{e:?}");
    }
    Outcome::Pass
}

fn beyond_device(env: &Env, which: u64) -> Outcome {
    let dev = env.dev.query_device().expect("query_device");
    let pd = env.pd();
    let cq = env.cq(16);
    let mut init = QpInitAttr::new(pd, cq, QpType::Rc, default_cap());
    match BEYOND[which as usize] {
        "max_recv_wr" => init.cap.max_recv_wr = dev.max_qp_wr + 1,
        "max_recv_sge" => init.cap.max_recv_sge = dev.max_sge + 1,
        // ibv_query_device has no inline limit: 1 MiB is past every device's.
        _ => init.cap.max_inline_data = 1 << 20,
    }
    assert_errno(env.dev.create_qp(&init), EINVAL);
    Outcome::Pass
}

/// A pair whose queues are at the device's max_qp_wr WRs (`which` 0) or max_sge SGEs
/// (1), used to its limit.
fn at_limits(env: &Env, which: u64) -> Outcome {
    let dev = env.dev.query_device().expect("query_device");
    let cap = if which == 0 {
        QpCap::new(dev.max_qp_wr, dev.max_qp_wr)
    } else {
        QpCap {
            max_send_sge: dev.max_sge,
            max_recv_sge: dev.max_sge,
            max_inline_data: 0,
            ..default_cap()
        }
    };
    let p = env.pair_spec(QpType::Rc, &env.params(), cap, 64, &PairSpec::default());
    for qpn in [p.a.qpn, p.b.qpn] {
        let (attr, init) = env.dev.query_qp(qpn).expect("query_qp");
        let c = init.cap;
        assert!(
            c.max_send_wr >= cap.max_send_wr
                && c.max_recv_wr >= cap.max_recv_wr
                && c.max_send_sge >= cap.max_send_sge
                && c.max_recv_sge >= cap.max_recv_sge,
            "asked for {cap:?}, got {c:?}"
        );
        assert_eq!(attr.cap, c);
    }
    if which == 0 {
        let wrs: Vec<_> = (0..u64::from(dev.max_qp_wr))
            .map(|i| RecvWr::new(i, vec![p.b.sge(0, 64)]))
            .collect();
        env.dev
            .post_recv(p.b.qpn, &wrs)
            .expect("posting max_qp_wr receive WRs");
        p.a.buf.write(0, b"full").unwrap();
        env.post_send(p.a.qpn, SendWr::send(1, vec![p.a.sge(0, 4)]).signaled());
        assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
        let wc = env.poll_one(p.b.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (0, WcStatus::Success, 4),
            "{wc:?}"
        );
    } else {
        // A SEND gathered from max_sge SGEs into a receive scattering it over max_sge.
        let n = u64::from(dev.max_sge);
        let gather = (0..n).map(|i| p.a.sge(i * 8, 8)).collect();
        scatter_check(env, &p, n, gather, |wr| env.post_recv(p.b.qpn, wr));
    }
    Outcome::Pass
}

fn destroyed_qpn(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, QpType::Rc, default_cap());
    let (_b, mr) = env.mr(pd, 64, verbs_api::AccessFlags::LOCAL_WRITE);
    let sge = verbs_api::Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    assert_errno(env.dev.query_qp(qpn), EINVAL);
    let (attr, mask) = env.params().init(QpType::Rc);
    assert_errno(env.dev.modify_qp(qpn, &attr, mask), EINVAL);
    let e = env
        .dev
        .post_send(qpn, &[SendWr::send(1, vec![sge])])
        .expect_err("post_send on a destroyed QP");
    assert_eq!(e.error.errno(), EINVAL, "{e:?}");
    let e = env
        .dev
        .post_recv(qpn, &[RecvWr::new(1, vec![sge])])
        .expect_err("post_recv on a destroyed QP");
    assert_eq!(e.error.errno(), EINVAL, "{e:?}");
    assert_errno(env.dev.destroy_qp(qpn), EINVAL);
    Outcome::Pass
}

fn qpn_reuse(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(64);
    let other_cq = env.cq(64);
    let mut live: Vec<u32> = (0..8)
        .map(|_| env.qp(pd, cq, QpType::Rc, default_cap()))
        .collect();
    // Half of them go, after being used: INIT with receives posted.
    let (_buf, mr) = env.mr(pd, 4096, verbs_api::AccessFlags::LOCAL_WRITE);
    let mut freed = HashSet::new();
    for qpn in live.split_off(4) {
        let (attr, mask) = env.params().init(QpType::Rc);
        env.dev.modify_qp(qpn, &attr, mask).expect("to INIT");
        let sge = verbs_api::Sge {
            addr: mr.addr,
            length: 64,
            lkey: mr.lkey,
        };
        env.post_recv(qpn, RecvWr::new(u64::from(qpn), vec![sge]));
        env.dev.destroy_qp(qpn).expect("destroy_qp");
        freed.insert(qpn);
    }
    let cap = QpCap {
        max_send_wr: 5,
        max_recv_wr: 3,
        ..default_cap()
    };
    for _ in 0..8 {
        let mut init = QpInitAttr::new(pd, other_cq, QpType::Uc, default_cap());
        init.cap = cap;
        let qpn = env.dev.create_qp(&init).expect("create_qp");
        assert!(
            !live.contains(&qpn),
            "QP number {qpn:#x} given to two live QPs"
        );
        let (attr, got) = env.dev.query_qp(qpn).expect("query_qp");
        assert_eq!(
            (attr.qp_state, got.qp_type, got.send_cq, got.recv_cq),
            (S::Reset, QpType::Uc, other_cq, other_cq),
            "QP {qpn:#x} (a reused number: {}) is not a fresh QP: {got:?}",
            freed.contains(&qpn)
        );
        assert!(
            got.cap.max_send_wr >= 5 && got.cap.max_recv_wr >= 3,
            "{got:?}"
        );
        // No receive of the destroyed QP is left in its queue: moving to ERR
        // flushes nothing.
        let (attr, mask) = env.params().init(QpType::Uc);
        env.dev.modify_qp(qpn, &attr, mask).expect("to INIT");
        env.set_state(qpn, S::Err);
        env.assert_no_completion(other_cq, std::time::Duration::from_millis(5));
        live.push(qpn);
    }
    Outcome::Pass
}

fn query_fresh(env: &Env) -> Outcome {
    let pd = env.pd();
    let (scq, rcq) = (env.cq(16), env.cq(16));
    let mut init = QpInitAttr::new(pd, scq, QpType::Rc, default_cap());
    init.recv_cq = rcq;
    init.sq_sig_all = true;
    init.cap = QpCap {
        max_send_wr: 7,
        max_recv_wr: 5,
        max_send_sge: 3,
        max_recv_sge: 2,
        max_inline_data: 16,
    };
    let qpn = env.dev.create_qp(&init).expect("create_qp");
    let (attr, got) = env.dev.query_qp(qpn).expect("query_qp");
    assert_eq!(attr.qp_state, S::Reset);
    assert_eq!(
        (
            got.pd,
            got.send_cq,
            got.recv_cq,
            got.qp_type,
            got.sq_sig_all,
            got.srq
        ),
        (pd, scq, rcq, QpType::Rc, true, None),
        "{got:?}"
    );
    let (c, want) = (got.cap, init.cap);
    assert!(
        c.max_send_wr >= want.max_send_wr
            && c.max_recv_wr >= want.max_recv_wr
            && c.max_send_sge >= want.max_send_sge
            && c.max_recv_sge >= want.max_recv_sge
            && c.max_inline_data >= want.max_inline_data,
        "asked for {want:?}, got {c:?}"
    );
    assert_eq!(attr.cap, c, "attr.cap and init_attr.cap differ");
    Outcome::Pass
}

/// One more outstanding READ/atomic than the device allows, as initiator at
/// RTR->RTS (`which` 0) or as responder at INIT->RTR (1).
fn rd_atomic_beyond(env: &Env, which: u64) -> Outcome {
    let dev = env.dev.query_device().expect("query_device");
    let limit = if which == 0 {
        dev.max_qp_init_rd_atom
    } else {
        dev.max_qp_rd_atom
    };
    let Ok(over) = u8::try_from(limit + 1) else {
        return Outcome::Skip(format!(
            "the device allows {limit}: one more does not fit the u8 of the attribute"
        ));
    };
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, QpType::Rc, default_cap());
    let mut params = env.params();
    let me = env.endpoint(qpn, 1);
    let (from, to) = if which == 0 {
        (S::Rtr, S::Rts)
    } else {
        (S::Init, S::Rtr)
    };
    env.raise(qpn, QpType::Rc, &params, 1, &me, S::Reset, from);
    if which == 0 {
        params.max_rd_atomic = over;
    } else {
        params.max_dest_rd_atomic = over;
    }
    let (attr, mask): (QpAttr, M) = if which == 0 {
        params.rts(QpType::Rc, 1)
    } else {
        params.rtr(QpType::Rc, &me)
    };
    assert_errno(env.dev.modify_qp(qpn, &attr, mask), EINVAL);
    assert_eq!(env.state_of(qpn), from, "a refused modify moved the QP");
    // At the limit itself the modify succeeds.
    if which == 0 {
        params.max_rd_atomic = over - 1;
    } else {
        params.max_dest_rd_atomic = over - 1;
    }
    env.raise(qpn, QpType::Rc, &params, 1, &me, from, to);
    Outcome::Pass
}
