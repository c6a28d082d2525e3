//! UD (IBTA 9.8, 10.2.5): a message is one packet, so one larger than the MTU is a
//! local length error; a datagram whose Q_Key is not the receiver's is dropped.

use emu_core::engine::GRH_LEN;
use verbs_api::{Ah, QpAttr, QpAttrMask, QpParams, QpState, QpType, SendWr, UdDest, WcStatus};

use super::recovery::{count, statuses};
use super::{ensure, expect_eq, Check, Scenario};
use crate::pair::{pair, Host, PairConfig};
use crate::Fabric;

/// The Q_Key both QPs were given (`connect_qp` brings UD QPs up with `QpParams`'s).
fn qkey() -> u32 {
    QpParams::default().qkey
}

/// Two UD hosts and, on `a`, an address handle that reaches `b`.
fn ud_pair(f: &Fabric) -> Result<(Host, Host, Ah), String> {
    let cfg = PairConfig {
        qp_type: QpType::Ud,
        ..PairConfig::default()
    };
    let (a, b) = pair(f, &cfg);
    let gid = b.ctx.device().query_gid(1, 0).map_err(|e| e.to_string())?;
    let ah =
        a.pd.create_ah(&QpParams::default().ah_attr(gid))
            .map_err(|e| e.to_string())?;
    Ok((a, b, ah))
}

/// A UD SEND of `len` bytes from `a`'s memory at `offset`, to `b` with `qkey`.
fn ud_send(wr_id: u64, a: &Host, offset: u64, len: u32, ah: &Ah, b: &Host, qkey: u32) -> SendWr {
    SendWr::send(wr_id, vec![a.sge(offset, len)]).with_ud(UdDest {
        ah: ah.id(),
        remote_qpn: b.qp.qpn(),
        remote_qkey: qkey,
    })
}

pub(crate) const UD_OVER_MTU: Scenario = Scenario {
    name: "ud-message-over-mtu",
    description: "a UD SEND one byte larger than the port MTU completes LOC_LEN_ERR and sends nothing, the next WR is flushed and the QP is in SQE; back to RTS, a SEND of exactly the MTU goes (a UD message is one packet: manual 2.3.6, IBTA 10.2.5)",
    run: ud_over_mtu,
};

fn ud_over_mtu(f: &Fabric) -> Check {
    let e = |e: verbs_api::Error| e.to_string();
    let (a, b, ah) = ud_pair(f)?;
    let mtu = a.ctx.device().query_port(1).map_err(e)?.active_mtu.bytes();
    b.post_recv(1, 0, mtu + GRH_LEN as u32);
    a.post(&[
        ud_send(1, &a, 0, mtu + 1, &ah, &b, qkey()),
        ud_send(2, &a, 0, 8, &ah, &b, qkey()),
    ]);
    expect_eq(
        "a's completions",
        statuses(&a.wait(2)),
        vec![(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)],
    )?;
    expect_eq("packets sent", f.trace().packets.len(), 0)?;
    expect_eq("a's QP state", a.state(), QpState::Sqe)?;
    // SQE -> RTS (IBTA 10.3.1: the send queue error state is left by modify_qp).
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    a.qp.modify(&rts, QpAttrMask::STATE).map_err(e)?;
    a.mem
        .write(0, &vec![0x5A; mtu as usize])
        .map_err(|e| e.to_string())?;
    a.post(&[ud_send(3, &a, 0, mtu, &ah, &b, qkey())]);
    expect_eq(
        "a's completion at the MTU",
        statuses(&a.wait(1)),
        vec![(3, WcStatus::Success)],
    )?;
    let r = b.wait(1);
    expect_eq("b's completion", statuses(&r), vec![(1, WcStatus::Success)])?;
    expect_eq(
        "bytes received (GRH + MTU)",
        r[0].byte_len,
        mtu + GRH_LEN as u32,
    )?;
    expect_eq("packets sent", f.trace().packets.len(), 1)
}

pub(crate) const QKEY_MISMATCH: Scenario = Scenario {
    name: "qkey-mismatch",
    description: "a UD SEND with the wrong Q_Key is dropped by the receiver and counted (the sender completes successfully); the receive WQE stays for the next datagram, whose Q_Key is right (IBTA 10.2.5, 9.6.1.2)",
    run: qkey_mismatch,
};

fn qkey_mismatch(f: &Fabric) -> Check {
    let (a, b, ah) = ud_pair(f)?;
    b.post_recv(1, 0, 1024);
    a.mem.write(0, b"bad!good").map_err(|e| e.to_string())?;
    a.post(&[ud_send(1, &a, 0, 4, &ah, &b, 0x0BAD)]);
    expect_eq(
        "a's completion (the sender cannot know)",
        statuses(&a.wait(1)),
        vec![(1, WcStatus::Success)],
    )?;
    ensure(b.wait(1).is_empty(), || {
        "b completed the bad datagram".into()
    })?;
    expect_eq("Q_Key violations", b.dev.counters().qkey_violations, 1)?;
    expect_eq("UD received", b.dev.counters().ud_received, 0)?;
    a.post(&[ud_send(2, &a, 4, 4, &ah, &b, qkey())]);
    expect_eq(
        "a's second completion",
        statuses(&a.wait(1)),
        vec![(2, WcStatus::Success)],
    )?;
    let r = b.wait(1);
    expect_eq("b's completion", statuses(&r), vec![(1, WcStatus::Success)])?;
    expect_eq("src_qp", r[0].src_qp, a.qp.qpn())?;
    let mut got = [0u8; 4];
    b.mem.read(GRH_LEN, &mut got).map_err(|e| e.to_string())?;
    expect_eq("payload after the GRH", &got, b"good")?;
    expect_eq("Q_Key violations", b.dev.counters().qkey_violations, 1)?;
    expect_eq(
        "datagrams on the wire",
        count(&f.trace(), |p| p.repr.is_some_and(|r| r.deth.is_some())),
        2,
    )
}
