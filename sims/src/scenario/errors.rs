//! UC loss, errors, events and ordering: UC message loss, rkey violations, CQ overrun,
//! the SRQ limit, fences, QP error and flush.

use std::net::Ipv4Addr;
use std::time::Duration;

use emu_wire::{NakCode, Opcode, Syndrome};
use verbs_api::{
    AsyncEventType, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendFlags,
    SendWr, SrqAttr, SrqAttrMask, WcStatus,
};

use super::recovery::{count, statuses};
use super::{ensure, expect_eq, hello, Check, Scenario};
use crate::pair::{connect_qp, pair, Host, PairConfig};
use crate::{Action, Fabric, Kind, Match, Rule};

pub(crate) const UC_MESSAGE_LOST: Scenario = Scenario {
    name: "uc-message-lost",
    description: "UC: the FIRST packet of a two-packet SEND is lost; the responder drops the rest of that message and the next message lands in the first receive (no ACKs, no retries)",
    run: uc_message_lost,
};

fn uc_message_lost(f: &Fabric) -> Check {
    let cfg = PairConfig {
        qp_type: QpType::Uc,
        ..PairConfig::default()
    };
    let (a, b) = pair(f, &cfg);
    b.post_recv(1, 0, 4096);
    b.post_recv(2, 4096, 4096);
    a.mem.write(0, &[1u8; 2000]).map_err(|e| e.to_string())?;
    a.mem.write(2000, &[2u8; 2000]).map_err(|e| e.to_string())?;
    f.add_rule(Rule::drop_nth(Opcode::UcSendFirst, 1));
    a.post(&[
        SendWr::send(10, vec![a.sge(0, 2000)]),
        SendWr::send(11, vec![a.sge(2000, 2000)]),
    ]);
    expect_eq(
        "a's completions (UC completes on send)",
        statuses(&a.wait(2)),
        vec![(10, WcStatus::Success), (11, WcStatus::Success)],
    )?;
    let r = b.wait(2);
    expect_eq(
        "b's completions",
        statuses(&r),
        vec![(1, WcStatus::Success)],
    )?;
    expect_eq("bytes received", r[0].byte_len, 2000)?;
    let mut got = [0u8; 2000];
    b.mem.read(0, &mut got).map_err(|e| e.to_string())?;
    ensure(got.iter().all(|x| *x == 2), || {
        "the first receive does not hold the second message".into()
    })?;
    expect_eq("ACKs", count(&f.trace(), |p| p.src == 1), 0)
}

pub(crate) const RKEY_VIOLATION: Scenario = Scenario {
    name: "rkey-violation",
    description: "a WRITE names a wrong rkey: the responder NAKs it (remote access error), writes not one byte, and the requester completes REM_ACCESS_ERR (IBTA 9.7.5.1.3)",
    run: rkey_violation,
};

fn rkey_violation(f: &Fabric) -> Check {
    let (a, b) = pair(f, &PairConfig::default());
    a.mem.write(0, &[0xAB; 64]).map_err(|e| e.to_string())?;
    a.post(&[SendWr::rdma_write(
        1,
        vec![a.sge(0, 64)],
        b.addr(0),
        b.rkey() ^ 0x100,
    )]);
    expect_eq(
        "a's completion",
        statuses(&a.wait(1)),
        vec![(1, WcStatus::RemAccessErr)],
    )?;
    let t = f.trace();
    expect_eq(
        "remote access NAKs",
        count(&t, |p| {
            p.repr.and_then(|r| r.aeth).map(|x| x.syndrome)
                == Some(Syndrome::Nak(NakCode::RemoteAccessError))
        }),
        1,
    )?;
    let mut got = [0u8; 64];
    b.mem.read(0, &mut got).map_err(|e| e.to_string())?;
    ensure(got == [0; 64], || "b's memory was written".into())?;
    expect_eq("a's QP state", a.state(), QpState::Err)
}

pub(crate) const CQ_OVERRUN: Scenario = Scenario {
    name: "cq-overrun",
    description: "three SENDs complete into a receive CQ of two entries nobody polls: CQ_ERR, then QP_FATAL and the QP in error (IBTA 11.6.2)",
    run: cq_overrun,
};

fn cq_overrun(f: &Fabric) -> Check {
    let cfg = PairConfig {
        cq_size: 2,
        sq_sig_all: false,
        timeout: 8,
        retry_cnt: 1,
        ..PairConfig::default()
    };
    let (a, b) = pair(f, &cfg);
    for i in 0..3 {
        b.post_recv(i, 64 * i, 64);
    }
    let text = hello(&a)?;
    let wrs: Vec<SendWr> = (0..3).map(|i| SendWr::send(i, vec![text])).collect();
    a.post(&wrs);
    f.run(Duration::from_secs(1));
    let ev: Vec<AsyncEventType> = b.events().iter().map(|e| e.event_type).collect();
    expect_eq(
        "b's events",
        ev,
        vec![AsyncEventType::CqErr, AsyncEventType::QpFatal],
    )?;
    expect_eq("b's QP state", b.state(), QpState::Err)?;
    expect_eq("CQ overruns", b.dev.counters().cq_overruns, 1)
}

pub(crate) const SRQ_LIMIT: Scenario = Scenario {
    name: "srq-limit",
    description: "an SRQ armed at limit 2 holds 4 receives: the third SEND takes it below 2 and SRQ_LIMIT_REACHED fires, once (manual 3.4.6)",
    run: srq_limit,
};

fn srq_limit(f: &Fabric) -> Check {
    let cfg = PairConfig::default();
    let a = Host::new(f, "a", Ipv4Addr::new(192, 0, 2, 1), &cfg);
    let b = Host::new(f, "b", Ipv4Addr::new(192, 0, 2, 2), &cfg);
    let dev = b.ctx.device();
    let e = |e: verbs_api::Error| e.to_string();
    let srq = dev
        .create_srq(
            b.pd.id(),
            &SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .map_err(e)?;
    let qpn = dev
        .create_qp(
            &QpInitAttr::new(b.pd.id(), b.cq.id(), QpType::Rc, QpCap::new(16, 0))
                .srq(srq)
                .sq_sig_all(true),
        )
        .map_err(e)?;
    let gid = |h: &Host| h.ctx.device().query_gid(1, 0);
    connect_qp(a.ctx.device(), a.qp.qpn(), gid(&b).map_err(e)?, qpn, &cfg);
    connect_qp(dev, qpn, gid(&a).map_err(e)?, a.qp.qpn(), &cfg);
    let recvs: Vec<RecvWr> = (0..4)
        .map(|i| RecvWr::new(i, vec![b.sge(64 * i, 64)]))
        .collect();
    dev.post_srq_recv(srq, &recvs)
        .map_err(|e| format!("{e:?}"))?;
    let arm = SrqAttr {
        srq_limit: 2,
        ..SrqAttr::default()
    };
    dev.modify_srq(srq, &arm, SrqAttrMask::LIMIT).map_err(e)?;
    let limit_events = |b: &Host| {
        b.events()
            .iter()
            .filter(|e| e.event_type == AsyncEventType::SrqLimitReached)
            .count()
    };
    let text = hello(&a)?;
    for i in 0..2 {
        a.post(&[SendWr::send(i, vec![text])]);
        a.wait(1);
    }
    expect_eq("limit events with 2 receives left", limit_events(&b), 0)?;
    a.post(&[SendWr::send(2, vec![text])]);
    a.wait(1);
    expect_eq("limit events with 1 left", limit_events(&b), 1)?;
    expect_eq(
        "limit after the event (disarmed)",
        dev.query_srq(srq).map_err(e)?.srq_limit,
        0,
    )?;
    let wcs = b.wait(3);
    expect_eq("b's receives", wcs.len(), 3)?;
    ensure(wcs.iter().all(|w| w.qp_num == qpn), || {
        "a completion names another QP".into()
    })?;
    dev.destroy_qp(qpn).map_err(e)?;
    dev.destroy_srq(srq).map_err(e)
}

pub(crate) const FENCE: Scenario = Scenario {
    name: "fence",
    description: "a WRITE posted with FENCE after a READ waits until the READ's response is back, even though the response is 200 us late (manual 3.6.5, IBV_SEND_FENCE)",
    run: fence,
};

fn fence(f: &Fabric) -> Check {
    let (a, b) = pair(f, &PairConfig::default());
    f.add_rule(Rule::new(
        "delay READ responses 200 us",
        Match::any().kind(Kind::ReadResponse),
        Action::Delay(Duration::from_micros(200)),
    ));
    a.post(&[
        SendWr::rdma_read(1, vec![a.sge(0, 8)], b.addr(0), b.rkey()),
        SendWr::rdma_write(2, vec![a.sge(64, 8)], b.addr(64), b.rkey())
            .with_flags(SendFlags::FENCE | SendFlags::SIGNALED),
    ]);
    expect_eq(
        "a's completions",
        statuses(&a.wait(2)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)],
    )?;
    let t = f.trace();
    let resp = t
        .packets
        .iter()
        .find(|p| p.repr.is_some_and(|r| r.bth.opcode.is_read_response()))
        .ok_or("no READ response")?;
    let write = t
        .packets
        .iter()
        .find(|p| p.repr.is_some_and(|r| r.bth.opcode.is_write()))
        .ok_or("no WRITE")?;
    let back = *resp
        .arrivals
        .first()
        .ok_or("the READ response never arrived")?;
    ensure(write.sent >= back, || {
        format!(
            "the fenced WRITE left at {:?}, before the READ response arrived at {back:?}",
            write.sent
        )
    })
}

pub(crate) const QP_ERROR_FLUSH: Scenario = Scenario {
    name: "qp-error-flush",
    description: "a QP moved to the error state flushes its outstanding receives with WR_FLUSH_ERR, and so does a receive posted afterwards (IBTA 10.3.1)",
    run: qp_error_flush,
};

fn qp_error_flush(f: &Fabric) -> Check {
    let (a, b) = pair(f, &PairConfig::default());
    for i in 0..3 {
        b.post_recv(i, 64 * i, 64);
    }
    a.post(&[SendWr::send(10, vec![hello(&a)?])]);
    expect_eq(
        "a's completion",
        statuses(&a.wait(1)),
        vec![(10, WcStatus::Success)],
    )?;
    expect_eq(
        "b's first receive",
        statuses(&b.wait(1)),
        vec![(0, WcStatus::Success)],
    )?;
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    b.qp.modify(&err, QpAttrMask::STATE)
        .map_err(|e| e.to_string())?;
    expect_eq(
        "flushed receives",
        statuses(&b.wait(2)),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)],
    )?;
    b.post_recv(3, 0, 64);
    expect_eq(
        "a receive posted in error",
        statuses(&b.wait(1)),
        vec![(3, WcStatus::WrFlushErr)],
    )?;
    Ok(())
}
