//! Error flows on RC: remote access violations change no byte, length and protection
//! errors, invalid requests, and what each side completes and raises (IBTA 9.9,
//! manual 4 "work completion status").

mod util;

use util::*;
use verbs_api::{
    AccessFlags, AsyncEventType, EventElement, QpState, SendFlags, SendWr, Sge, WcStatus,
    WrOperation,
};

const CANARY: u8 = 0xA5;

/// Fills B's whole buffer with canaries and returns a checker that every byte is
/// still a canary.
fn canaries(b: &Node) -> impl Fn() {
    b.buf.fill(CANARY);
    let buf = b.buf.clone();
    move || {
        assert!(
            buf.to_vec().iter().all(|&x| x == CANARY),
            "a forbidden access changed memory"
        )
    }
}

/// Runs one forbidden WRITE and checks the outcome on both sides.
fn forbidden_write(remote_addr: u64, rkey: u32, len: u32, cfg: Config) {
    let (mut p, a, b) = connected(cfg);
    let untouched = canaries(&b);
    a.write_bytes(0, &pattern(len as usize, 1));
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::RdmaWrite { remote_addr, rkey },
            vec![a.sge(0, len)],
        ),
    );
    a.post_send(&mut p, signaled(2, WrOperation::Send, vec![a.sge(0, 4)]));
    p.drive();
    untouched();
    let sc = a.poll(&mut p);
    assert_eq!(
        sc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(
        p.log.iter().any(|r| r.syndrome == Some(0x62)),
        "{:#?}",
        p.trace()
    );
    assert_eq!(a.state(&mut p), QpState::Err);
    assert_eq!(b.state(&mut p), QpState::Err);
    let ev = b.events(&mut p);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].event_type, ev[0].element),
        (AsyncEventType::QpAccessErr, EventElement::Qp(b.qpn))
    );
}

/// IBTA 9.7.4.1, 9.7.5.2: bad R_Key -> NAK remote access error; requester REM_ACCESS_ERR,
/// responder QP_ACCESS_ERR; zero bytes written.
#[test]
fn bad_rkey_writes_nothing() {
    let cfg = Config {
        mtu: verbs_api::Mtu::Mtu256,
        ..Config::default()
    };
    let (_, _, b) = connected(cfg);
    forbidden_write(b.mr.addr, b.mr.rkey ^ 0x100, 1000, cfg);
}

/// A range that starts inside and ends outside the region is refused whole.
#[test]
fn write_past_the_end_writes_nothing() {
    let cfg = Config {
        buf_len: 4096,
        ..Config::default()
    };
    let (_, _, b) = connected(cfg);
    forbidden_write(b.mr.addr + 4000, b.mr.rkey, 200, cfg);
}

/// An MR without REMOTE_WRITE refuses WRITEs (and the QP grants it).
#[test]
fn write_to_region_without_remote_write() {
    let (mut p, a, b) = connected(Config::default());
    // Register a second, read-only region over B's buffer.
    let ro =
        p.b.reg_mr(b.pd, &b.buf, 0, 1024, AccessFlags::REMOTE_READ)
            .unwrap();
    let untouched = canaries(&b);
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::RdmaWrite {
                remote_addr: ro.addr,
                rkey: ro.rkey,
            },
            vec![a.sge(0, 64)],
        ),
    );
    p.drive();
    untouched();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
}

/// READ and ATOMIC through bad keys fail the same way, and the atomic target keeps
/// its value.
#[test]
fn bad_rkey_read_and_atomic() {
    let (mut p, a, b) = connected(Config::default());
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::RdmaRead {
                remote_addr: b.mr.addr,
                rkey: 0x00de_ad00,
            },
            vec![a.sge(0, 64)],
        ),
    );
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);

    let (mut p, a, b) = connected(Config::default());
    b.buf.write_u64(0, 77).unwrap();
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::AtomicFetchAndAdd {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey ^ 0x200,
                add: 1,
            },
            vec![a.sge(0, 8)],
        ),
    );
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
    assert_eq!(b.buf.read_u64(0).unwrap(), 77);
}

/// IBTA 9.4.5: an atomic needs an 8-byte aligned target and 8 local bytes; like
/// rdma-core's rxe provider, post_send refuses anything else with EINVAL.
#[test]
fn misaligned_or_short_atomic_is_refused_at_post() {
    let (mut p, a, b) = connected(Config::default());
    let now = p.now;
    let misaligned = signaled(
        1,
        WrOperation::AtomicFetchAndAdd {
            remote_addr: b.mr.addr + 4,
            rkey: b.mr.rkey,
            add: 1,
        },
        vec![a.sge(0, 8)],
    );
    assert_eq!(
        p.a.post_send(now, a.qpn, &[misaligned])
            .unwrap_err()
            .error
            .errno(),
        22
    );
    let short = signaled(
        1,
        WrOperation::AtomicCmpAndSwp {
            remote_addr: b.mr.addr,
            rkey: b.mr.rkey,
            compare: 0,
            swap: 1,
        },
        vec![a.sge(0, 4)],
    );
    assert_eq!(
        p.a.post_send(now, a.qpn, &[short])
            .unwrap_err()
            .error
            .errno(),
        22
    );
}

/// A hostile peer's misaligned atomic still never executes: the responder NAKs it
/// (invalid request) and raises the local access violation event (manual 6.1.4).
#[test]
fn misaligned_atomic_from_the_wire_is_refused() {
    let (mut p, a, b) = connected(Config::default());
    b.buf.write_u64(0, 1).unwrap();
    let mut repr =
        emu_wire::PacketRepr::new(emu_wire::Opcode::RcFetchAdd, b.qpn, emu_wire::Psn::new(100));
    repr.atomic_eth = Some(emu_wire::AtomicEthRepr {
        va: b.mr.addr + 4,
        rkey: b.mr.rkey,
        swap_add: 1,
        compare: 0,
    });
    repr.bth.ack_req = true;
    let mut buf = [0u8; 128];
    let n = repr.emit(&mut buf, &[]);
    let now = p.now;
    p.b.handle_datagram(now, gid(Side::A), &buf[..n]);
    p.drive();
    assert_eq!(b.buf.read_u64(0).unwrap(), 1);
    assert_eq!(b.buf.read_u64(8).unwrap(), 0);
    assert!(p.log.iter().any(|r| r.syndrome == Some(0x61)));
    assert_eq!(b.events(&mut p)[0].event_type, AsyncEventType::QpAccessErr);
    let _ = a;
}

/// A connected QP ignores packets from any address but its peer's (kernel rxe's
/// check_addr): a stranger cannot write into a region even with the right R_Key.
#[test]
fn packets_from_strangers_are_dropped() {
    let (mut p, _a, b) = connected(Config::default());
    let untouched = canaries(&b);
    let mut repr = emu_wire::PacketRepr::new(
        emu_wire::Opcode::RcRdmaWriteOnly,
        b.qpn,
        emu_wire::Psn::new(100),
    );
    repr.reth = Some(emu_wire::RethRepr {
        va: b.mr.addr,
        rkey: b.mr.rkey,
        dma_len: 4,
    });
    let mut buf = [0u8; 128];
    let n = repr.emit(&mut buf, b"evil");
    let now = p.now;
    let stranger = verbs_api::Gid::from_ipv4([10, 9, 9, 9].into());
    p.b.handle_datagram(now, stranger, &buf[..n]);
    p.drive();
    untouched();
    assert_eq!(p.b.counters().rx_dropped, 1);
}

/// A reg_mr region cannot be invalidated (IBTA 10.6, as in kernel rxe): a SEND with
/// Invalidate naming one is a class J error (IBTA 9.9.6.3), never reported as done: the
/// receive completes with MW_BIND_ERR and, unanswered, the SEND runs out of retries.
#[test]
fn send_with_invalidate_of_a_region_is_refused() {
    let (mut p, a, b) = connected(Config::default());
    b.post_recv(&mut p, 1, 0, 64);
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::SendWithInv {
                invalidate_rkey: b.mr.rkey,
            },
            vec![a.sge(0, 8)],
        ),
    );
    p.drive();
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::MwBindErr);
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RetryExcErr);
}

/// The QP's own access flags: a QP that does not grant REMOTE_WRITE answers a WRITE
/// with an invalid request NAK and raises QP_REQ_ERR.
#[test]
fn qp_without_remote_write_refuses_writes() {
    let (mut p, a, b) = connected(Config {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        ..Config::default()
    });
    let untouched = canaries(&b);
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 64)],
        ),
    );
    p.drive();
    untouched();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemInvReqErr);
    assert!(p.log.iter().any(|r| r.syndrome == Some(0x61)));
    assert_eq!(b.events(&mut p)[0].event_type, AsyncEventType::QpReqErr);
}

/// IBTA 9.9.3.1: a SEND larger than the receive buffer: LOC_LEN_ERR at the receiver,
/// REM_INV_REQ_ERR at the sender.
#[test]
fn send_larger_than_receive_buffer() {
    let (mut p, a, b) = connected(Config::default());
    b.post_recv(&mut p, 5, 0, 100);
    b.post_recv(&mut p, 6, 0, 100);
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 101)]));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemInvReqErr);
    let rc = b.poll(&mut p);
    assert_eq!(
        rc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(5, WcStatus::LocLenErr), (6, WcStatus::WrFlushErr)]
    );
}

/// IBTA 10.6.3.1: a bad L_Key in the sender's SGE is a local protection error; nothing
/// goes on the wire.
#[test]
fn bad_lkey_is_local_protection_error() {
    let (mut p, a, _b) = connected(Config::default());
    let bad = Sge {
        addr: a.mr.addr,
        length: 8,
        lkey: a.mr.lkey ^ 0x300,
    };
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![bad]));
    p.drive();
    assert!(p.log.is_empty());
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::LocProtErr);
    assert_eq!(a.state(&mut p), QpState::Err);
}

/// A READ into a region without LOCAL_WRITE is a local protection error.
#[test]
fn read_into_read_only_local_region() {
    let (mut p, a, b) = connected(Config::default());
    let ro =
        p.a.reg_mr(a.pd, &a.buf, 0, 64, AccessFlags::empty())
            .unwrap();
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::RdmaRead {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![Sge {
                addr: ro.addr,
                length: 64,
                lkey: ro.lkey,
            }],
        ),
    );
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::LocProtErr);
}

/// The receiver's own SGE is bad: LOC_PROT_ERR there, REM_OP_ERR at the sender.
#[test]
fn bad_receive_sge() {
    let (mut p, a, b) = connected(Config::default());
    let now = p.now;
    let wr = verbs_api::RecvWr {
        wr_id: 3,
        sg_list: vec![Sge {
            addr: b.mr.addr,
            length: 64,
            lkey: 12345,
        }]
        .into(),
    };
    p.b.post_recv(now, b.qpn, &[wr]).unwrap();
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::LocProtErr);
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemOpErr);
}

/// IBTA 11.6.2: a CQ overrun raises CQ_ERR and moves the QPs on it to error with
/// QP_FATAL.
#[test]
fn cq_overrun() {
    let (mut p, a, b) = connected(Config {
        cq_len: 2,
        ..Config::default()
    });
    for i in 0..3 {
        b.post_recv(&mut p, i, 0, 64);
    }
    for i in 0..3 {
        a.post_send(
            &mut p,
            SendWr {
                wr_id: i,
                sg_list: vec![a.sge(0, 4)].into(),
                op: WrOperation::Send,
                send_flags: SendFlags::empty(),
                ud: None,
                xrc_remote_srqn: None,
            },
        );
    }
    p.drive();
    let ev = b.events(&mut p);
    assert_eq!(ev[0].event_type, AsyncEventType::CqErr);
    assert_eq!(ev[0].element, EventElement::Cq(b.cq.0));
    assert_eq!(ev[1].event_type, AsyncEventType::QpFatal);
    assert_eq!(b.state(&mut p), QpState::Err);
    assert_eq!(p.b.counters().cq_overruns, 1);
}
