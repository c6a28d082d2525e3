//! UC (IBTA 9.8): SEND and RDMA WRITE without acknowledgements. A lost packet makes the
//! receiver drop the rest of that message silently and resynchronise on the next FIRST
//! or ONLY packet; the sender completes regardless.

mod util;

use emu_wire::Opcode::*;
use emu_wire::PacketRepr;
use util::*;
use verbs_api::{
    AccessFlags, Mtu, QpAttr, QpAttrMask, QpState, QpType, Sge, WcStatus, WrOperation,
};

fn uc() -> Config {
    Config {
        qp_type: QpType::Uc,
        mtu: Mtu::Mtu1024,
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..Config::default()
    }
}

/// UC packets use the 0x20 opcodes, never ask for an ACK, and none comes back.
#[test]
fn uc_send_and_write_have_no_acks() {
    let (mut p, a, b) = connected(uc());
    let data = pattern(2500, 6);
    a.write_bytes(0, &data);
    b.post_recv(&mut p, 1, 0, 4096);
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::SendWithImm { imm_data: 9 },
            vec![a.sge(0, 2500)],
        ),
    );
    a.post_send(
        &mut p,
        signaled(
            2,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr + 8192,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 2500)],
        ),
    );
    p.drive();
    assert_eq!(
        p.opcodes(Side::A),
        [
            UcSendFirst,
            UcSendMiddle,
            UcSendLastWithImmediate,
            UcRdmaWriteFirst,
            UcRdmaWriteMiddle,
            UcRdmaWriteLast
        ]
    );
    assert!(p.opcodes(Side::B).is_empty(), "no ACKs on UC");
    assert!(p.log.iter().all(|r| !r.ack_req));
    assert_eq!(b.read_bytes(0, 2500), data);
    assert_eq!(b.read_bytes(8192, 2500), data);
    let rc = b.poll(&mut p);
    assert_eq!(
        (rc[0].status, rc[0].byte_len, rc[0].imm_data),
        (WcStatus::Success, 2500, 9)
    );
    assert_eq!(
        a.poll(&mut p).iter().map(|w| w.status).collect::<Vec<_>>(),
        [WcStatus::Success; 2]
    );
}

/// A lost middle packet drops exactly that message; the next message arrives, in the
/// receive WQE the damaged one would have used.
#[test]
fn uc_loss_drops_exactly_the_damaged_message() {
    let (mut p, a, b) = connected(uc());
    a.write_bytes(0, &pattern(3000, 1));
    a.write_bytes(4096, &pattern(3000, 2));
    b.post_recv(&mut p, 1, 0, 4096);
    b.post_recv(&mut p, 2, 4096, 4096);
    p.set_rule(|_, repr: &PacketRepr, _| {
        if repr.bth.opcode == UcSendMiddle && repr.bth.psn.value() == 101 {
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 3000)]));
    a.post_send(
        &mut p,
        signaled(2, WrOperation::Send, vec![a.sge(4096, 3000)]),
    );
    p.drive();
    assert_eq!(
        a.poll(&mut p)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let rc = b.poll(&mut p);
    assert_eq!(rc.len(), 1, "only the undamaged message completes");
    assert_eq!(
        (rc[0].wr_id, rc[0].byte_len),
        (1, 3000),
        "it took the first receive WQE"
    );
    assert_eq!(b.read_bytes(0, 3000), pattern(3000, 2));
    assert_eq!(p.b.counters().uc_dropped_messages, 1);
    assert_eq!(b.state(&mut p), QpState::Rts);
}

/// UC refuses READ, atomics and SEND with invalidate at post time (EINVAL).
#[test]
fn uc_refuses_read_and_atomics() {
    let (mut p, a, b) = connected(uc());
    let now = p.now;
    for op in [
        WrOperation::RdmaRead {
            remote_addr: b.mr.addr,
            rkey: b.mr.rkey,
        },
        WrOperation::AtomicFetchAndAdd {
            remote_addr: b.mr.addr,
            rkey: b.mr.rkey,
            add: 1,
        },
        WrOperation::SendWithInv { invalidate_rkey: 1 },
    ] {
        let err =
            p.a.post_send(now, a.qpn, &[signaled(1, op, vec![a.sge(0, 8)])])
                .unwrap_err();
        assert_eq!(err.error.errno(), 22);
    }
}

/// A bad R_Key on UC drops the message silently: no NAK, no error state, nothing written,
/// and the next message is delivered.
#[test]
fn uc_bad_rkey_is_dropped_silently() {
    let (mut p, a, b) = connected(uc());
    b.buf.fill(0x5A);
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey ^ 0x100,
            },
            vec![a.sge(0, 64)],
        ),
    );
    a.write_bytes(0, b"ok");
    a.post_send(
        &mut p,
        signaled(
            2,
            WrOperation::RdmaWrite {
                remote_addr: b.mr.addr + 100,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 2)],
        ),
    );
    p.drive();
    assert_eq!(b.read_bytes(0, 100), vec![0x5A; 100]);
    assert_eq!(b.read_bytes(100, 2), b"ok");
    assert_eq!(b.state(&mut p), QpState::Rts);
    assert!(b.events(&mut p).is_empty());
    assert_eq!(a.poll(&mut p).len(), 2);
}

/// No receive WQE on UC: the SEND is dropped (there is no RNR on UC).
#[test]
fn uc_send_without_receive_is_dropped() {
    let (mut p, a, b) = connected(uc());
    a.post_send(&mut p, signaled(1, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    assert_eq!(p.log.len(), 1);
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    b.post_recv(&mut p, 5, 0, 64);
    a.post_send(&mut p, signaled(2, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    assert_eq!(b.poll(&mut p)[0].wr_id, 5);
}

/// A local error on a UC send queue moves the QP to SQE, not ERR: the receive side keeps
/// working, and SQE -> RTS resumes sending (IBTA 10.3).
#[test]
fn uc_local_error_goes_to_sqe_and_back() {
    let (mut p, a, b) = connected(uc());
    a.post_recv(&mut p, 7, 0, 64);
    a.post_send(
        &mut p,
        signaled(
            1,
            WrOperation::Send,
            vec![Sge {
                addr: a.mr.addr,
                length: 8,
                lkey: 999,
            }],
        ),
    );
    a.post_send(&mut p, signaled(2, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    assert_eq!(
        a.poll(&mut p).iter().map(|w| w.status).collect::<Vec<_>>(),
        [WcStatus::LocProtErr, WcStatus::WrFlushErr]
    );
    assert_eq!(a.state(&mut p), QpState::Sqe);
    // the receive side still works
    b.post_send(&mut p, signaled(3, WrOperation::Send, vec![b.sge(0, 4)]));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].wr_id, 7);
    // and SQE -> RTS resumes
    let now = p.now;
    p.a.modify_qp(
        now,
        a.qpn,
        &QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    b.post_recv(&mut p, 8, 0, 64);
    a.post_send(&mut p, signaled(4, WrOperation::Send, vec![a.sge(0, 8)]));
    p.drive();
    let wcs = b.poll(&mut p);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(3, WcStatus::Success), (8, WcStatus::Success)]
    );
}
