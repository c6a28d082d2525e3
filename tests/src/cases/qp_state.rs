//! QP creation and the QP state machine (manual 3.4.3-3.4.4, 3.5; IBTA 10.3.1, table 95
//! and 11.2.4.2): every legal and illegal transition between the states a QP can be put
//! in, for RC, UC and UD.

use verbs_api::{
    Endpoint, QpAttr, QpAttrMask as M, QpCap, QpState as S, QpType, RecvWr, SendWr, Sge, WcStatus,
};

use super::{
    assert_errno,
    errno::{EINVAL, ENOMEM},
};
use crate::env::default_cap;
use crate::{Case, Env, Outcome};

const STATES: [S; 6] = [S::Reset, S::Init, S::Rtr, S::Rts, S::Sqd, S::Err];
const TYPES: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];

pub(super) fn name(s: S) -> &'static str {
    match s {
        S::Reset => "reset",
        S::Init => "init",
        S::Rtr => "rtr",
        S::Rts => "rts",
        S::Sqd => "sqd",
        S::Sqe => "sqe",
        S::Err => "err",
        _ => "unknown",
    }
}

pub(super) fn type_name(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "rc",
        QpType::Uc => "uc",
        QpType::Ud => "ud",
        _ => "other",
    }
}

/// IBTA 10.3.1 (figure 124) and the kernel's transition table: which modify is legal.
/// Every state may go to RESET; every state but RESET to ERR.
pub(crate) fn legal(from: S, to: S) -> bool {
    matches!(
        (from, to),
        (_, S::Reset)
            | (S::Init | S::Rtr | S::Rts | S::Sqd | S::Sqe | S::Err, S::Err)
            | (S::Reset, S::Init)
            | (S::Init, S::Init)
            | (S::Init, S::Rtr)
            | (S::Rtr, S::Rts)
            | (S::Rts, S::Rts)
            | (S::Rts, S::Sqd)
            | (S::Sqd, S::Sqd)
            | (S::Sqd, S::Rts)
    )
}

fn encode(t: QpType, from: S, to: S) -> u64 {
    (u64::from(t.as_u32()) << 16) | (u64::from(from.as_u32()) << 8) | u64::from(to.as_u32())
}

fn decode(p: u64) -> (QpType, S, S) {
    (
        QpType::try_from((p >> 16) as u32).unwrap(),
        S::try_from(((p >> 8) & 0xFF) as u32).unwrap(),
        S::try_from((p & 0xFF) as u32).unwrap(),
    )
}

pub(super) fn register(v: &mut Vec<Case>) {
    for t in TYPES {
        for from in STATES {
            for to in STATES {
                let ok = legal(from, to);
                let n = format!(
                    "qp_state::{}_{}_to_{}_{}",
                    type_name(t),
                    name(from),
                    name(to),
                    if ok { "is_legal" } else { "is_einval" }
                );
                v.push(Case::param(n, "IBTA 10.3.1 figure 124 (QP state diagram); manual 3.5.1 ibv_modify_qp: an illegal transition fails with EINVAL and leaves the QP unchanged", transition, encode(t, from, to)));
            }
        }
    }
    for t in TYPES {
        v.push(Case::param(
            format!("qp::{}_create_and_destroy", type_name(t)),
            "manual 3.4.3-3.4.4 ibv_create_qp/ibv_destroy_qp: a new QP is in RESET",
            create_destroy,
            u64::from(t.as_u32()),
        ));
        v.push(Case::param(
            format!("qp::{}_post_send_in_reset_is_einval", type_name(t)),
            "manual 3.6.5; IBTA 10.3: send WRs may be posted only in RTS (and SQD)",
            post_send_in_reset,
            u64::from(t.as_u32()),
        ));
        v.push(Case::param(
            format!("qp::{}_post_recv_in_reset_is_einval", type_name(t)),
            "manual 3.6.4; IBTA 10.3: receive WRs may not be posted in RESET",
            post_recv_in_reset,
            u64::from(t.as_u32()),
        ));
        v.push(Case::param(format!("qp::{}_flush_on_error", type_name(t)), "IBTA 10.3, manual 6.2.6: moving a QP to ERR completes its outstanding receive WRs with WR_FLUSH_ERR", flush_on_error, u64::from(t.as_u32())).wc(WcStatus::WrFlushErr));
    }
    v.push(Case::param(
        "qp::max_send_wr_beyond_device_is_einval",
        "manual 3.4.3: cap.max_send_wr may not exceed max_qp_wr",
        beyond_device_limit,
        0,
    ));
    v.push(Case::param(
        "qp::max_sge_beyond_device_is_einval",
        "manual 3.4.3: cap.max_send_sge may not exceed max_sge",
        beyond_device_limit,
        1,
    ));
    v.push(Case::new(
        "qp::destroy_twice_is_einval",
        "manual 3.4.4: the QP must exist",
        destroy_twice,
    ));
    v.push(Case::new("qp::send_queue_full_is_enomem", "manual 3.6.5: posting beyond cap.max_send_wr outstanding WRs fails (ENOMEM), bad_wr names the first one refused", sq_full));
    v.push(Case::new("qp::rc_rtr_without_dest_qpn_is_einval", "IBTA table 95 / manual 3.5.3: INIT->RTR on RC requires AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER", rtr_missing_attr));
    v.push(Case::new("qp::rc_rts_without_timeout_is_einval", "IBTA table 95 / manual 3.5.4: RTR->RTS on RC requires SQ_PSN, TIMEOUT, RETRY_CNT, RNR_RETRY, MAX_QP_RD_ATOMIC", rts_missing_attr));
    v.push(Case::new(
        "qp::query_returns_what_was_set",
        "manual 3.6.1 ibv_query_qp: the attributes reflect the last modify",
        query_back,
    ));
    v.push(Case::new(
        "qp::ud_init_requires_qkey",
        "IBTA table 95: RESET->INIT on UD requires QKEY",
        ud_init_needs_qkey,
    ));
}

/// Brings a fresh QP of type `t` to `state`.
fn reach(env: &Env, qpn: u32, t: QpType, state: S) {
    let p = env.params();
    let me = Endpoint {
        lid: 0,
        qpn,
        psn: 1,
        gid: env.gid(),
    };
    let steps: &[S] = match state {
        S::Reset => &[],
        S::Init => &[S::Init],
        S::Rtr => &[S::Init, S::Rtr],
        S::Rts => &[S::Init, S::Rtr, S::Rts],
        S::Sqd => &[S::Init, S::Rtr, S::Rts, S::Sqd],
        S::Err => &[S::Init, S::Err],
        _ => unreachable!(),
    };
    for &s in steps {
        let (attr, mask) = attrs_for(t, S::Reset, s, &me, &p);
        let (mut attr, mut mask) = if s == S::Init {
            p.init(t)
        } else {
            (attr, mask)
        };
        if s == S::Sqd {
            // IBTA 10.3.1: SQD -> SQD and SQD -> RTS are allowed once the send queue has
            // drained (kernel rxe refuses them while it drains): ask for the event and
            // wait for it.
            attr.en_sqd_async_notify = true;
            mask |= verbs_api::QpAttrMask::EN_SQD_ASYNC_NOTIFY;
        }
        env.dev
            .modify_qp(qpn, &attr, mask)
            .unwrap_or_else(|e| panic!("reaching {state:?}: to {s:?}: {e:?}"));
        if s == S::Sqd {
            let ev = env.next_event();
            assert_eq!(
                ev.event_type,
                verbs_api::AsyncEventType::SqDrained,
                "{ev:?}"
            );
        }
    }
    assert_eq!(state_of(env, qpn), state);
}

/// The attributes a modify to `to` carries (the ones the transition from its legal
/// source requires).
fn attrs_for(t: QpType, from: S, to: S, me: &Endpoint, p: &verbs_api::QpParams) -> (QpAttr, M) {
    match to {
        S::Init if from == S::Reset => p.init(t),
        S::Init => (
            QpAttr {
                qp_state: S::Init,
                ..QpAttr::default()
            },
            M::STATE,
        ),
        S::Rtr => p.rtr(t, me),
        S::Rts if from == S::Rtr || from == S::Reset || from == S::Init => p.rts(t, 1),
        _ => (
            QpAttr {
                qp_state: to,
                ..QpAttr::default()
            },
            M::STATE,
        ),
    }
}

fn state_of(env: &Env, qpn: u32) -> S {
    env.dev.query_qp(qpn).expect("query_qp").0.qp_state
}

fn transition(env: &Env, param: u64) -> Outcome {
    let (t, from, to) = decode(param);
    let pd = env.pd();
    let cq = env.cq(64);
    let qpn = env.qp(pd, cq, t, default_cap());
    reach(env, qpn, t, from);
    let me = Endpoint {
        lid: 0,
        qpn,
        psn: 1,
        gid: env.gid(),
    };
    let (attr, mask) = attrs_for(t, from, to, &me, &env.params());
    let r = env.dev.modify_qp(qpn, &attr, mask);
    if legal(from, to) {
        r.unwrap_or_else(|e| panic!("{from:?} -> {to:?} refused: {e:?}"));
        assert_eq!(state_of(env, qpn), to);
    } else {
        assert_errno(r, EINVAL);
        assert_eq!(
            state_of(env, qpn),
            from,
            "an illegal modify changed the state"
        );
    }
    Outcome::Pass
}

fn qp_type(p: u64) -> QpType {
    QpType::try_from(p as u32).unwrap()
}

fn create_destroy(env: &Env, p: u64) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, qp_type(p), default_cap());
    assert_eq!(state_of(env, qpn), S::Reset);
    let (_, init) = env.dev.query_qp(qpn).expect("query_qp");
    assert_eq!(init.qp_type, qp_type(p));
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    Outcome::Pass
}

fn post_send_in_reset(env: &Env, p: u64) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, qp_type(p), default_cap());
    let (_b, mr) = env.mr(pd, 64, verbs_api::AccessFlags::LOCAL_WRITE);
    let sge = Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    let r = env.dev.post_send(qpn, &[SendWr::send(1, vec![sge])]);
    let e = r.expect_err("post_send in RESET succeeded");
    assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}");
    Outcome::Pass
}

fn post_recv_in_reset(env: &Env, p: u64) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, qp_type(p), default_cap());
    let (_b, mr) = env.mr(pd, 64, verbs_api::AccessFlags::LOCAL_WRITE);
    let sge = Sge {
        addr: mr.addr,
        length: 64,
        lkey: mr.lkey,
    };
    let e = env
        .dev
        .post_recv(qpn, &[RecvWr::new(1, vec![sge])])
        .expect_err("post_recv in RESET succeeded");
    assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}");
    Outcome::Pass
}

fn flush_on_error(env: &Env, p: u64) -> Outcome {
    let t = qp_type(p);
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, t, default_cap());
    reach(env, qpn, t, S::Init);
    let (_b, mr) = env.mr(pd, 4096, verbs_api::AccessFlags::LOCAL_WRITE);
    for i in 0..3 {
        let sge = Sge {
            addr: mr.addr,
            length: 1024,
            lkey: mr.lkey,
        };
        env.post_recv(qpn, RecvWr::new(10 + i, vec![sge]));
    }
    env.dev
        .modify_qp(
            qpn,
            &QpAttr {
                qp_state: S::Err,
                ..QpAttr::default()
            },
            M::STATE,
        )
        .expect("to ERR");
    for i in 0..3 {
        let wc = env.poll_one(cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.qp_num),
            (10 + i, WcStatus::WrFlushErr, qpn),
            "{wc:?}"
        );
    }
    Outcome::Pass
}

/// A QP asking for one more send WR (`which` 0) or send SGE (1) than the device allows.
fn beyond_device_limit(env: &Env, which: u64) -> Outcome {
    let attr = env.dev.query_device().expect("query_device");
    let pd = env.pd();
    let cq = env.cq(16);
    let mut cap = default_cap();
    if which == 0 {
        cap.max_send_wr = attr.max_qp_wr + 1;
    } else {
        cap.max_send_sge = attr.max_sge + 1;
    }
    assert_errno(
        env.dev
            .create_qp(&verbs_api::QpInitAttr::new(pd, cq, QpType::Rc, cap)),
        EINVAL,
    );
    Outcome::Pass
}

fn destroy_twice(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, QpType::Rc, default_cap());
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    assert_errno(env.dev.destroy_qp(qpn), EINVAL);
    Outcome::Pass
}

fn sq_full(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(256);
    let cap = QpCap {
        max_send_wr: 4,
        ..default_cap()
    };
    let qpn = env.qp(pd, cq, QpType::Rc, cap);
    // Connected to a QP that does not exist: nothing is ever acknowledged, so the
    // send queue only fills.
    let ghost = Endpoint {
        lid: 0,
        qpn: 0xFF_FF00,
        psn: 1,
        gid: env.gid(),
    };
    let mut params = env.params();
    params.timeout = 20; // seconds per try: no retry runs out during the case
    verbs_api::connect_qp(&*env.dev, qpn, QpType::Rc, &params, 1, &ghost).expect("connect");
    let (_b, mr) = env.mr(pd, 4096, verbs_api::AccessFlags::LOCAL_WRITE);
    let sge = Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    let actual = env.dev.query_qp(qpn).expect("query_qp").1.cap.max_send_wr;
    let wrs: Vec<_> = (0..u64::from(actual) + 2)
        .map(|i| SendWr::send(i, vec![sge]))
        .collect();
    let e = env
        .dev
        .post_send(qpn, &wrs)
        .expect_err("more WRs than the queue holds were posted");
    assert_eq!(
        e.index, actual as usize,
        "bad_wr should be the first WR beyond the queue: {e:?}"
    );
    assert_eq!(e.error.errno(), ENOMEM, "{e:?}");
    Outcome::Pass
}

fn rtr_missing_attr(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, QpType::Rc, default_cap());
    reach(env, qpn, QpType::Rc, S::Init);
    let me = Endpoint {
        lid: 0,
        qpn,
        psn: 1,
        gid: env.gid(),
    };
    let (attr, mask) = env.params().rtr(QpType::Rc, &me);
    assert_errno(env.dev.modify_qp(qpn, &attr, mask - M::DEST_QPN), EINVAL);
    assert_eq!(state_of(env, qpn), S::Init);
    Outcome::Pass
}

fn rts_missing_attr(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, QpType::Rc, default_cap());
    reach(env, qpn, QpType::Rc, S::Rtr);
    let (attr, mask) = env.params().rts(QpType::Rc, 1);
    assert_errno(env.dev.modify_qp(qpn, &attr, mask - M::TIMEOUT), EINVAL);
    assert_eq!(state_of(env, qpn), S::Rtr);
    Outcome::Pass
}

fn query_back(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let (attr, init) = env.dev.query_qp(p.a.qpn).expect("query_qp");
    let f = env.params();
    assert_eq!(attr.qp_state, S::Rts);
    assert_eq!(attr.dest_qp_num, p.b.qpn);
    assert_eq!(attr.path_mtu, f.path_mtu);
    assert_eq!(
        (attr.timeout, attr.retry_cnt, attr.rnr_retry),
        (f.timeout, f.retry_cnt, f.rnr_retry)
    );
    assert_eq!(attr.max_rd_atomic, f.max_rd_atomic);
    assert_eq!(attr.qp_access_flags, f.access);
    assert_eq!(init.qp_type, QpType::Rc);
    assert!(init.cap.max_send_wr >= default_cap().max_send_wr);
    Outcome::Pass
}

fn ud_init_needs_qkey(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, QpType::Ud, default_cap());
    let (attr, mask) = env.params().init(QpType::Ud);
    assert_errno(env.dev.modify_qp(qpn, &attr, mask - M::QKEY), EINVAL);
    assert_eq!(state_of(env, qpn), S::Reset);
    Outcome::Pass
}
