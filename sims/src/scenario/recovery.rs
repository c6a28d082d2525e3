//! RC recovery: RNR, timeouts, retry budgets, go-back-N, implied NAKs, responder
//! resources, corruption (IBTA 9.7.5, 9.7.6).

use std::time::Duration;

use emu_wire::{NakCode, Opcode, Syndrome};
use verbs_api::{QpState, SendWr, WcStatus, WorkCompletion};

use super::{ensure, expect_eq, hello, Check, Scenario};
use crate::pair::{pair, PairConfig};
use crate::trace::{Fate, PacketRecord, Trace};
use crate::{Fabric, LinkConfig, Rule};

pub(crate) fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn opcode(p: &PacketRecord) -> Option<Opcode> {
    p.repr.map(|r| r.bth.opcode)
}

fn syn(p: &PacketRecord) -> Option<Syndrome> {
    p.repr.and_then(|r| r.aeth).map(|a| a.syndrome)
}

pub(crate) fn count(t: &Trace, f: impl Fn(&PacketRecord) -> bool) -> usize {
    t.packets.iter().filter(|p| f(p)).count()
}

pub(crate) const RNR_NAK_THEN_SUCCESS: Scenario = Scenario {
    name: "rnr-nak-then-success",
    description: "a SEND finds no receive WQE: RNR NAK, the requester waits the RNR timer, retries and succeeds (IBTA 9.7.5.2.8)",
    run: rnr_nak_then_success,
};

fn rnr_nak_then_success(f: &Fabric) -> Check {
    // min_rnr_timer 14: the responder asks for 1.28 ms.
    let cfg = PairConfig {
        min_rnr_timer: 14,
        ..PairConfig::default()
    };
    let (a, b) = pair(f, &cfg);
    a.post(&[SendWr::send(1, vec![hello(&a)?])]);
    // b posts its receive only 100 us later.
    f.run_for(Duration::from_micros(100));
    b.post_recv(7, 0, 64);
    expect_eq(
        "a's completion",
        statuses(&a.wait(1)),
        vec![(1, WcStatus::Success)],
    )?;
    expect_eq(
        "b's completion",
        statuses(&b.wait(1)),
        vec![(7, WcStatus::Success)],
    )?;
    let t = f.trace();
    let nak = t
        .packets
        .iter()
        .find(|p| syn(p) == Some(Syndrome::RnrNak { timer: 14 }))
        .ok_or("no RNR NAK with timer 14")?;
    let resend = t
        .packets
        .iter()
        .filter(|p| opcode(p) == Some(Opcode::RcSendOnly))
        .nth(1)
        .ok_or("the SEND was not retried")?;
    ensure(
        resend.sent >= nak.arrivals[0] + Duration::from_micros(1280),
        || format!("retried at {:?}, before the 1.28 ms RNR wait", resend.sent),
    )?;
    expect_eq("RNR NAKs received", a.dev.counters().rnr_naks_received, 1)
}

pub(crate) const RNR_RETRY_EXHAUSTED: Scenario = Scenario {
    name: "rnr-retry-exhausted",
    description: "no receive is ever posted: after rnr_retry (2) retries the SEND fails with RNR_RETRY_EXC_ERR and the next WR is flushed",
    run: rnr_retry_exhausted,
};

fn rnr_retry_exhausted(f: &Fabric) -> Check {
    let cfg = PairConfig {
        rnr_retry: 2,
        min_rnr_timer: 1,
        ..PairConfig::default()
    };
    let (a, _b) = pair(f, &cfg);
    let text = hello(&a)?;
    a.post(&[SendWr::send(1, vec![text]), SendWr::send(2, vec![text])]);
    expect_eq(
        "a's completions",
        statuses(&a.wait(2)),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)],
    )?;
    let t = f.trace();
    let naks = count(&t, |p| matches!(syn(p), Some(Syndrome::RnrNak { .. })));
    expect_eq("RNR NAKs (first try + 2 retries)", naks, 3)?;
    expect_eq("a's QP state", a.state(), QpState::Err)
}

pub(crate) const ACK_TIMEOUT_RETRANSMIT: Scenario = Scenario {
    name: "ack-timeout-retransmit",
    description: "the first SEND is lost: nothing comes back, the local ACK timer (timeout 14 = 67 ms) expires and the SEND is retransmitted (IBTA 9.7.6.1.3)",
    run: ack_timeout_retransmit,
};

fn ack_timeout_retransmit(f: &Fabric) -> Check {
    let (a, b) = pair(f, &PairConfig::default());
    f.add_rule(Rule::drop_nth(Opcode::RcSendOnly, 1));
    b.post_recv(1, 0, 64);
    a.post(&[SendWr::send(1, vec![hello(&a)?])]);
    expect_eq(
        "a's completion",
        statuses(&a.wait(1)),
        vec![(1, WcStatus::Success)],
    )?;
    expect_eq(
        "b's completion",
        statuses(&b.wait(1)),
        vec![(1, WcStatus::Success)],
    )?;
    let t = f.trace();
    let sends: Vec<&PacketRecord> = t
        .packets
        .iter()
        .filter(|p| opcode(p) == Some(Opcode::RcSendOnly))
        .collect();
    expect_eq("SENDs on the wire", sends.len(), 2)?;
    // 4.096 us * 2^14 = 67.108864 ms.
    ensure(
        sends[1].sent - sends[0].sent >= Duration::from_nanos(67_108_864),
        || format!("retransmitted after {:?}", sends[1].sent - sends[0].sent),
    )?;
    expect_eq("ACK timeouts", a.dev.counters().ack_timeouts, 1)
}

pub(crate) const RETRY_EXHAUSTED: Scenario = Scenario {
    name: "retry-exhausted",
    description: "the peer is cut off: each request is sent once and retried retry_cnt (3) times, then RETRY_EXC_ERR, the QP errs and the rest flush (IBTA 9.7.6.1.4)",
    run: retry_exhausted,
};

fn retry_exhausted(f: &Fabric) -> Check {
    let cfg = PairConfig {
        retry_cnt: 3,
        timeout: 10,
        ..PairConfig::default()
    };
    let (a, b) = pair(f, &cfg);
    b.post_recv(1, 0, 64);
    f.partition("a", "b").map_err(|e| e.to_string())?;
    let text = hello(&a)?;
    a.post(&[SendWr::send(1, vec![text]), SendWr::send(2, vec![text])]);
    expect_eq(
        "a's completions",
        statuses(&a.wait(2)),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)],
    )?;
    let t = f.trace();
    expect_eq("requests sent (2 x (1 + 3))", t.packets.len(), 8)?;
    expect_eq("a's QP state", a.state(), QpState::Err)?;
    ensure(
        b.cq.poll(1, &mut Vec::new()).map_err(|e| e.to_string())? == 0,
        || "b received something through the partition".into(),
    )
}

pub(crate) const PSN_SEQUENCE_ERROR: Scenario = Scenario {
    name: "psn-sequence-error",
    description: "a WRITE MIDDLE is lost: the responder sees a PSN gap, sends one PSN sequence error NAK, and the requester goes back to that PSN (go-back-N, IBTA 9.7.5.1.1)",
    run: psn_sequence_error,
};

fn psn_sequence_error(f: &Fabric) -> Check {
    let (a, b) = pair(f, &PairConfig::default());
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    a.mem.write(0, &data).map_err(|e| e.to_string())?;
    f.add_rule(Rule::drop_nth(Opcode::RcRdmaWriteMiddle, 1));
    a.post(&[SendWr::rdma_write(
        1,
        vec![a.sge(0, 5000)],
        b.addr(0),
        b.rkey(),
    )]);
    expect_eq(
        "a's completion",
        statuses(&a.wait(1)),
        vec![(1, WcStatus::Success)],
    )?;
    let t = f.trace();
    let naks: Vec<u32> = t
        .packets
        .iter()
        .filter(|p| syn(p) == Some(Syndrome::Nak(NakCode::PsnSequenceError)))
        .filter_map(|p| p.repr.map(|r| r.bth.psn.value()))
        .collect();
    expect_eq("sequence NAKs (PSN)", naks, vec![101])?;
    let mut got = vec![0; 5000];
    b.mem.read(0, &mut got).map_err(|e| e.to_string())?;
    ensure(got == data, || {
        "b's memory differs from what was written".into()
    })
}

pub(crate) const LOST_READ_RESPONSE: Scenario = Scenario {
    name: "lost-read-response",
    description: "a READ RESPONSE MIDDLE is lost: the next response's PSN implies a NAK and the requester re-reads from the missing PSN (IBTA 9.7.5.1.4)",
    run: lost_read_response,
};

fn lost_read_response(f: &Fabric) -> Check {
    let (a, b) = pair(f, &PairConfig::default());
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    b.mem.write(0, &data).map_err(|e| e.to_string())?;
    f.add_rule(Rule::drop_nth(Opcode::RcRdmaReadResponseMiddle, 1));
    a.post(&[SendWr::rdma_read(
        1,
        vec![a.sge(0, 3000)],
        b.addr(0),
        b.rkey(),
    )]);
    expect_eq(
        "a's completion",
        statuses(&a.wait(1)),
        vec![(1, WcStatus::Success)],
    )?;
    let t = f.trace();
    let reads: Vec<u32> = t
        .packets
        .iter()
        .filter(|p| opcode(p) == Some(Opcode::RcRdmaReadRequest))
        .filter_map(|p| p.repr.map(|r| r.bth.psn.value()))
        .collect();
    expect_eq("READ requests (PSN)", reads, vec![100, 101])?;
    let mut got = vec![0; 3000];
    a.mem.read(0, &mut got).map_err(|e| e.to_string())?;
    ensure(got == data, || "a read back other bytes".into())
}

pub(crate) const DUPLICATE_READ: Scenario = Scenario {
    name: "duplicate-read-replayed",
    description: "the only READ RESPONSE is lost: the requester times out and asks again; the responder replays the READ from its responder resources (IBTA 9.7.5.1.2)",
    run: duplicate_read,
};

fn duplicate_read(f: &Fabric) -> Check {
    let (a, b) = pair(
        f,
        &PairConfig {
            timeout: 10,
            ..PairConfig::default()
        },
    );
    b.mem.write(0, b"replayed").map_err(|e| e.to_string())?;
    f.add_rule(Rule::drop_nth(Opcode::RcRdmaReadResponseOnly, 1));
    a.post(&[SendWr::rdma_read(1, vec![a.sge(0, 8)], b.addr(0), b.rkey())]);
    expect_eq(
        "a's completion",
        statuses(&a.wait(1)),
        vec![(1, WcStatus::Success)],
    )?;
    let t = f.trace();
    expect_eq(
        "READ requests",
        count(&t, |p| opcode(p) == Some(Opcode::RcRdmaReadRequest)),
        2,
    )?;
    expect_eq("duplicates at b", b.dev.counters().duplicate_requests, 1)?;
    let mut got = [0u8; 8];
    a.mem.read(0, &mut got).map_err(|e| e.to_string())?;
    expect_eq("bytes read", &got, b"replayed")
}

pub(crate) const DUPLICATE_ATOMIC: Scenario = Scenario {
    name: "duplicate-atomic-saved-result",
    description: "the ATOMIC ACKNOWLEDGE of a FETCH_ADD is lost: the retried FETCH_ADD is answered from the saved result, not executed twice (IBTA 9.7.5.1.2)",
    run: duplicate_atomic,
};

fn duplicate_atomic(f: &Fabric) -> Check {
    let (a, b) = pair(
        f,
        &PairConfig {
            timeout: 10,
            ..PairConfig::default()
        },
    );
    b.mem.write_u64(0, 10).map_err(|e| e.to_string())?;
    f.add_rule(Rule::drop_nth(Opcode::RcAtomicAcknowledge, 1));
    a.post(&[SendWr::atomic_fetch_add(
        1,
        a.sge(0, 8),
        b.addr(0),
        b.rkey(),
        5,
    )]);
    expect_eq(
        "a's completion",
        statuses(&a.wait(1)),
        vec![(1, WcStatus::Success)],
    )?;
    expect_eq("b's counter (added once)", b.mem.read_u64(0).ok(), Some(15))?;
    expect_eq("original value returned", a.mem.read_u64(0).ok(), Some(10))?;
    let t = f.trace();
    expect_eq(
        "FETCH_ADDs on the wire",
        count(&t, |p| opcode(p) == Some(Opcode::RcFetchAdd)),
        2,
    )
}

pub(crate) const ICRC_CORRUPTION: Scenario = Scenario {
    name: "icrc-corruption",
    description: "one bit of a WRITE's ICRC is flipped in flight: the receiver drops it and counts it, and the ACK timeout resends it (IBTA Annex A17.4)",
    run: icrc_corruption,
};

fn icrc_corruption(f: &Fabric) -> Check {
    let (a, b) = pair(
        f,
        &PairConfig {
            timeout: 8,
            ..PairConfig::default()
        },
    );
    f.add_rule(Rule::corrupt_icrc_of_packet(1));
    a.post(&[SendWr::rdma_write(
        1,
        vec![a.sge(0, 64)],
        b.addr(0),
        b.rkey(),
    )]);
    expect_eq(
        "a's completion",
        statuses(&a.wait(1)),
        vec![(1, WcStatus::Success)],
    )?;
    let bad = b
        .dev
        .link_counters()
        .icrc_errors
        .load(std::sync::atomic::Ordering::Relaxed);
    expect_eq("ICRC errors counted at b", bad, 1)?;
    let t = f.trace();
    expect_eq(
        "corrupted packets",
        count(&t, |p| matches!(p.fate, Fate::Corrupted(_))),
        1,
    )?;
    expect_eq("ACK timeouts", a.dev.counters().ack_timeouts, 1)
}

pub(crate) const LOSSY_LINK: Scenario = Scenario {
    name: "lossy-link",
    description: "a link that loses 10% and reorders (jitter): RC still delivers four 4 KiB WRITEs exactly, by timeouts, NAKs and go-back-N",
    run: lossy_link,
};

fn lossy_link(f: &Fabric) -> Check {
    let (a, b) = pair(
        f,
        &PairConfig {
            timeout: 6,
            ..PairConfig::default()
        },
    );
    let bad = LinkConfig {
        loss: 0.1,
        jitter: Duration::from_micros(2),
        ..LinkConfig::default()
    };
    f.set_link("a", "b", bad).map_err(|e| e.to_string())?;
    let data: Vec<u8> = (0..16384u32).map(|i| (i * 31 + 7) as u8).collect();
    a.mem.write(0, &data).map_err(|e| e.to_string())?;
    let wrs: Vec<SendWr> = (0..4)
        .map(|i| SendWr::rdma_write(i, vec![a.sge(4096 * i, 4096)], b.addr(4096 * i), b.rkey()))
        .collect();
    a.post(&wrs);
    let wcs = a.wait(4);
    ensure(
        wcs.len() == 4 && wcs.iter().all(|w| w.status == WcStatus::Success),
        || format!("completions {:?}", statuses(&wcs)),
    )?;
    let mut got = vec![0; 16384];
    b.mem.read(0, &mut got).map_err(|e| e.to_string())?;
    ensure(got == data, || "b's memory differs".into())
}

pub(crate) const ACK_COALESCING: Scenario = Scenario {
    name: "ack-coalescing",
    description: "four WRITEs posted together arrive in one burst: the responder answers them with one ACK, which acknowledges every PSN up to its own (IBTA 9.7.5.1.1), and all four complete",
    run: ack_coalescing,
};

fn ack_coalescing(f: &Fabric) -> Check {
    let (a, b) = pair(f, &PairConfig::default());
    let wrs: Vec<SendWr> = (0..4)
        .map(|i| {
            SendWr::rdma_write(i + 1, vec![a.sge(i * 64, 64)], b.addr(i * 64), b.rkey()).signaled()
        })
        .collect();
    a.post(&wrs);
    expect_eq(
        "a's completions",
        statuses(&a.wait(4)),
        (1..=4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
    )?;
    let t = f.trace();
    let acks: Vec<&PacketRecord> = t
        .packets
        .iter()
        .filter(|p| opcode(p) == Some(Opcode::RcAcknowledge))
        .collect();
    expect_eq("ACKs sent", acks.len(), 1)?;
    let last_write = t
        .packets
        .iter()
        .rev()
        .filter(|p| opcode(p).is_some_and(|o| o.is_write()))
        .find_map(|p| p.repr.map(|r| r.bth.psn))
        .ok_or("no WRITE")?;
    let ack_psn = acks[0].repr.map(|r| r.bth.psn).ok_or("undecodable ACK")?;
    expect_eq("the ACK's PSN", ack_psn, last_write)
}
