//! Completion queues and completion channels (manual 3.3.7-3.3.10, 3.6.7-3.6.10).

use std::time::Duration;

use verbs_api::{AsyncEventType, EventElement, QpCap, QpType, RecvWr, SendFlags, SendWr, WcStatus};

use super::{
    assert_errno,
    errno::{EBUSY, EINVAL},
};
use crate::env::default_cap;
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new(
        "cq::create_and_destroy",
        "manual 3.3.7/3.3.9 ibv_create_cq/ibv_destroy_cq",
        create_destroy,
    ));
    v.push(Case::new(
        "cq::zero_entries_is_einval",
        "manual 3.3.7: cqe must be at least 1",
        zero_entries,
    ));
    v.push(Case::new(
        "cq::more_than_max_cqe_is_einval",
        "manual 3.3.7: cqe may not exceed the device's max_cqe",
        too_many,
    ));
    v.push(Case::new(
        "cq::destroy_with_qp_is_ebusy",
        "manual 3.3.9: a CQ in use by a QP cannot be destroyed (EBUSY)",
        destroy_busy,
    ));
    v.push(Case::new(
        "cq::poll_empty_returns_nothing",
        "manual 3.6.10 ibv_poll_cq: returns 0 when the CQ is empty",
        poll_empty,
    ));
    v.push(Case::new(
        "cq::resize_grows",
        "manual 3.3.8 ibv_resize_cq: the CQ can grow while in use",
        resize_grows,
    ));
    v.push(Case::new("cq::completions_come_in_order", "IBTA 11.4.2.1: completions of one work queue are returned in the order the WRs were posted", in_order));
    v.push(Case::new(
        "cq::poll_many_returns_up_to_max",
        "manual 3.6.10: ibv_poll_cq returns at most num_entries completions",
        poll_many,
    ));
    v.push(Case::new("cq::notify_wakes_the_channel", "manual 3.6.7-3.6.8: after ibv_req_notify_cq the next completion raises an event on the channel", notify_wakes));
    v.push(Case::new(
        "cq::no_event_without_notify",
        "manual 3.6.7: the CQ raises an event only when armed",
        no_event_unarmed,
    ));
    v.push(Case::param("cq::solicited_only_ignores_unsolicited", "manual 3.6.7: with solicited_only, only a solicited (or error) completion raises the event", solicited_only, 0));
    v.push(Case::param("cq::solicited_only_fires_on_solicited", "manual 3.6.7; IBTA 11.4.2.2: a SEND with the solicited event bit wakes a solicited-only CQ", solicited_only, 1));
    v.push(Case::new(
        "cq::channel_destroy_while_used_is_ebusy",
        "manual 3.3.11 ibv_destroy_comp_channel: fails while a CQ uses the channel",
        channel_busy,
    ));
    v.push(
        Case::param(
            "cq::overrun_raises_cq_err",
            "manual 6.1.1 IBV_EVENT_CQ_ERR: a CQ overrun is reported on the CQ",
            overrun,
            0,
        )
        .event(AsyncEventType::CqErr),
    );
    v.push(
        Case::param(
            "cq::overrun_makes_its_qps_fatal",
            "manual 6.1.1: all the QPs associated with an overrun CQ also get IBV_EVENT_QP_FATAL",
            overrun,
            1,
        )
        .event(AsyncEventType::QpFatal),
    );
}

fn create_destroy(env: &Env) -> Outcome {
    let cq = env.cq(16);
    env.dev.destroy_cq(cq).expect("destroy_cq");
    assert_errno(env.dev.destroy_cq(cq), EINVAL);
    Outcome::Pass
}

fn zero_entries(env: &Env) -> Outcome {
    assert_errno(env.dev.create_cq(0, None), EINVAL);
    Outcome::Pass
}

fn too_many(env: &Env) -> Outcome {
    let max = env.dev.query_device().expect("query_device").max_cqe;
    assert_errno(env.dev.create_cq(max.saturating_add(1), None), EINVAL);
    Outcome::Pass
}

fn destroy_busy(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, QpType::Rc, default_cap());
    assert_errno(env.dev.destroy_cq(cq), EBUSY);
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    env.dev.destroy_cq(cq).expect("destroy_cq after destroy_qp");
    Outcome::Pass
}

fn poll_empty(env: &Env) -> Outcome {
    let cq = env.cq(4);
    let mut out = Vec::new();
    assert_eq!(env.dev.poll_cq(cq, 4, &mut out).expect("poll_cq"), 0);
    assert!(out.is_empty());
    Outcome::Pass
}

fn resize_grows(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.dev.resize_cq(p.a.cq, 1024).expect("resize_cq");
    for i in 0..8 {
        env.post_send(
            p.a.qpn,
            SendWr::rdma_write(i, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey).signaled(),
        );
    }
    for i in 0..8 {
        let wc = env.poll_one(p.a.cq);
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    Outcome::Pass
}

fn in_order(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    for i in 0..32 {
        env.post_send(
            p.a.qpn,
            SendWr::rdma_write(i, vec![p.a.sge(i * 8, 8)], p.b.addr(i * 8), p.b.mr.rkey).signaled(),
        );
    }
    for i in 0..32 {
        assert_eq!(env.poll_one(p.a.cq).wr_id, i);
    }
    Outcome::Pass
}

fn poll_many(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    for i in 0..6 {
        env.post_send(
            p.a.qpn,
            SendWr::rdma_write(i, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey).signaled(),
        );
    }
    // Wait until all six are there, then take them three at a time.
    let deadline = std::time::Instant::now() + crate::env::WAIT;
    let mut seen = Vec::new();
    while seen.len() < 6 {
        let mut out = Vec::new();
        let n = env.dev.poll_cq(p.a.cq, 3, &mut out).expect("poll_cq");
        assert!(n <= 3 && out.len() == n, "poll_cq returned {n} with max 3");
        seen.extend(out.iter().map(|w| w.wr_id));
        assert!(
            std::time::Instant::now() < deadline,
            "only {seen:?} completed"
        );
        if n == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    assert_eq!(seen, (0..6).collect::<Vec<_>>());
    Outcome::Pass
}

fn notify_wakes(env: &Env) -> Outcome {
    let (ch, cq, qpn, _buf, mr) = env.self_loop();
    let sge = verbs_api::Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    env.dev.req_notify_cq(cq, false).expect("req_notify_cq");
    env.post_send(
        qpn,
        SendWr::rdma_write(1, vec![sge], mr.addr + 64, mr.rkey).signaled(),
    );
    assert_eq!(
        env.dev
            .get_cq_event(ch, Some(crate::env::WAIT))
            .expect("a CQ event"),
        cq
    );
    assert_eq!(env.poll_one(cq).wr_id, 1);
    Outcome::Pass
}

fn no_event_unarmed(env: &Env) -> Outcome {
    let ch = env.dev.create_comp_channel().expect("create_comp_channel");
    let cq = env
        .dev
        .create_cq(16, Some(ch))
        .expect("create_cq on channel");
    let pd = env.pd();
    let qpn = env.qp(pd, cq, QpType::Rc, default_cap());
    let gid = env.gid();
    let params = env.params();
    let me = verbs_api::Endpoint {
        lid: 0,
        qpn,
        psn: 1,
        gid,
    };
    // A QP connected to itself: its WRITE completes on its own CQ.
    verbs_api::connect_qp(&*env.dev, qpn, QpType::Rc, &params, 1, &me).expect("connect");
    let (buf, mr) = env.mr(pd, 4096, crate::env::all_access());
    let _ = buf;
    let sge = verbs_api::Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    env.post_send(
        qpn,
        SendWr::rdma_write(1, vec![sge], mr.addr + 64, mr.rkey).signaled(),
    );
    assert_eq!(env.poll_one(cq).status, WcStatus::Success);
    assert_errno(
        env.dev.get_cq_event(ch, Some(Duration::from_millis(50))),
        110,
    );
    Outcome::Pass
}

/// A CQ armed solicited-only receives a SEND with (`solicited` 1) or without (0) the
/// solicited event bit: the channel gets an event only for the first.
fn solicited_only(env: &Env, solicited: u64) -> Outcome {
    let (ch, cq, qpn, _buf, mr) = env.self_loop();
    let sge = |off: u64, length: u32| verbs_api::Sge {
        addr: mr.addr + off,
        length,
        lkey: mr.lkey,
    };
    env.dev
        .req_notify_cq(cq, true)
        .expect("req_notify_cq(solicited)");
    env.post_recv(qpn, RecvWr::new(2, vec![sge(1024, 64)]));
    let flags = if solicited == 1 {
        SendFlags::SOLICITED
    } else {
        SendFlags::empty()
    };
    env.post_send(qpn, SendWr::send(1, vec![sge(0, 8)]).with_flags(flags));
    if solicited == 1 {
        let got = env.dev.get_cq_event(ch, Some(crate::env::WAIT));
        assert_eq!(got.expect("a CQ event"), cq);
    }
    assert_eq!(env.poll_one(cq).wr_id, 2);
    if solicited == 0 {
        let got = env.dev.get_cq_event(ch, Some(Duration::from_millis(50)));
        assert_errno(got, 110);
    }
    Outcome::Pass
}

fn channel_busy(env: &Env) -> Outcome {
    let ch = env.dev.create_comp_channel().expect("create_comp_channel");
    let cq = env.dev.create_cq(4, Some(ch)).expect("create_cq");
    assert_errno(env.dev.destroy_comp_channel(ch), EBUSY);
    env.dev.destroy_cq(cq).expect("destroy_cq");
    env.dev
        .destroy_comp_channel(ch)
        .expect("destroy_comp_channel");
    Outcome::Pass
}

/// `want_fatal` 0: CQ_ERR is enough; 1: QP_FATAL must follow too.
fn overrun(env: &Env, want_fatal: u64) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(1);
    let cap = QpCap {
        max_send_wr: 64,
        ..default_cap()
    };
    let qpn = env.qp(pd, cq, QpType::Rc, cap);
    let me = verbs_api::Endpoint {
        lid: 0,
        qpn,
        psn: 1,
        gid: env.gid(),
    };
    verbs_api::connect_qp(&*env.dev, qpn, QpType::Rc, &env.params(), 1, &me).expect("connect");
    let (_buf, mr) = env.mr(pd, 4096, crate::env::all_access());
    let sge = verbs_api::Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    // Whatever the device rounds a 1-entry CQ up to, 64 completions overrun it.
    for i in 0..64 {
        if env
            .dev
            .post_send(
                qpn,
                &[SendWr::rdma_write(i, vec![sge], mr.addr + 64, mr.rkey).signaled()],
            )
            .is_err()
        {
            break; // the QP already went to the error state
        }
    }
    let mut cq_err = false;
    let mut qp_fatal = want_fatal == 0;
    while !(cq_err && qp_fatal) {
        let ev = env.next_event();
        match (ev.event_type, ev.element) {
            (AsyncEventType::CqErr, EventElement::Cq(c)) => {
                assert_eq!(c, cq.0);
                cq_err = true;
            }
            (AsyncEventType::QpFatal, EventElement::Qp(q)) => {
                assert_eq!(q, qpn);
                qp_fatal = true;
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    Outcome::Pass
}
