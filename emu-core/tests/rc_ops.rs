//! RC operations on a clean wire: each test asserts the packets exchanged and the
//! completions produced (IBTA 9.7; manual 3.6 ibv_post_send opcodes).

mod util;

use emu_wire::Opcode::*;
use util::*;
use verbs_api::{SendFlags, SendWr, WcFlags, WcOpcode, WcStatus, WrOperation};

fn wr(wr_id: u64, op: WrOperation, sges: Vec<verbs_api::Sge>) -> SendWr {
    SendWr {
        wr_id,
        sg_list: sges.into(),
        op,
        send_flags: SendFlags::SIGNALED,
        ud: None,
        xrc_remote_srqn: None,
    }
}

/// Manual 3.6: a SEND consumes a receive WQE; both sides complete.
#[test]
fn send_only_is_acked_and_completes_both_sides() {
    let (mut p, a, b) = connected(Config::default());
    a.write_bytes(0, b"hello, rdma");
    b.post_recv(&mut p, 7, 100, 64);
    a.post_send(&mut p, wr(1, WrOperation::Send, vec![a.sge(0, 11)]));
    p.drive();
    assert_eq!(
        p.trace(),
        [
            "A->B RC_SEND_ONLY psn=100",
            "B->A RC_ACKNOWLEDGE psn=100 aeth=0x1f"
        ]
    );
    let sc = a.poll(&mut p);
    assert_eq!(sc.len(), 1);
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    let rc = b.poll(&mut p);
    assert_eq!(rc.len(), 1);
    assert_eq!(
        (rc[0].wr_id, rc[0].status, rc[0].opcode, rc[0].byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 11)
    );
    assert_eq!(rc[0].qp_num, b.qpn);
    assert_eq!(rc[0].src_qp, a.qpn);
    assert_eq!(b.read_bytes(100, 11), b"hello, rdma");
}

/// IBTA 9.7.1: a message longer than the path MTU goes as FIRST, MIDDLE..., LAST,
/// one PSN each; AckReq only on the last.
#[test]
fn send_is_segmented_by_path_mtu() {
    let (mut p, a, b) = connected(Config::default());
    let data = pattern(3000, 3);
    a.write_bytes(0, &data);
    b.post_recv(&mut p, 1, 0, 4096);
    a.post_send(
        &mut p,
        wr(
            2,
            WrOperation::SendWithImm {
                imm_data: 0xdead_beef,
            },
            vec![a.sge(0, 3000)],
        ),
    );
    p.drive();
    assert_eq!(
        p.opcodes(Side::A),
        [RcSendFirst, RcSendMiddle, RcSendLastWithImmediate]
    );
    let a_recs: Vec<_> = p.log.iter().filter(|r| r.from == Side::A).collect();
    assert_eq!(
        a_recs.iter().map(|r| r.psn).collect::<Vec<_>>(),
        [100, 101, 102]
    );
    assert_eq!(
        a_recs.iter().map(|r| r.ack_req).collect::<Vec<_>>(),
        [false, false, true]
    );
    assert_eq!(
        a_recs.iter().map(|r| r.payload_len).collect::<Vec<_>>(),
        [1024, 1024, 952]
    );
    let rc = b.poll(&mut p);
    assert_eq!(rc[0].byte_len, 3000);
    // As kernel rxe reports an RC receive with immediate: GRH | WITH_IMM (3).
    assert_eq!(rc[0].wc_flags, WcFlags::GRH | WcFlags::WITH_IMM);
    assert_eq!(rc[0].imm_data, 0xdead_beef);
    assert_eq!(b.read_bytes(0, 3000), data);
    // The sender's completion says WITH_IMM too, as kernel rxe's does.
    let wc = a.poll(&mut p);
    assert_eq!(
        (wc[0].status, wc[0].wc_flags),
        (WcStatus::Success, WcFlags::WITH_IMM)
    );
}

/// RDMA WRITE places data with no receive WQE; WRITE with immediate consumes one.
#[test]
fn rdma_write_and_write_with_imm() {
    let (mut p, a, b) = connected(Config::default());
    let data = pattern(2500, 9);
    a.write_bytes(0, &data);
    let remote = b.mr.addr + 4096;
    a.post_send(
        &mut p,
        wr(
            1,
            WrOperation::RdmaWrite {
                remote_addr: remote,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 2500)],
        ),
    );
    p.drive();
    assert_eq!(
        p.opcodes(Side::A),
        [RcRdmaWriteFirst, RcRdmaWriteMiddle, RcRdmaWriteLast]
    );
    assert_eq!(b.read_bytes(4096, 2500), data);
    assert!(b.poll(&mut p).is_empty());
    assert_eq!(a.poll(&mut p)[0].opcode, WcOpcode::RdmaWrite);

    b.post_recv(&mut p, 9, 0, 0);
    a.post_send(
        &mut p,
        wr(
            2,
            WrOperation::RdmaWriteWithImm {
                remote_addr: remote,
                rkey: b.mr.rkey,
                imm_data: 5,
            },
            vec![a.sge(0, 10)],
        ),
    );
    p.drive();
    let rc = b.poll(&mut p);
    assert_eq!(
        (rc[0].wr_id, rc[0].opcode, rc[0].imm_data, rc[0].byte_len),
        (9, WcOpcode::RecvRdmaWithImm, 5, 10)
    );
}

/// RDMA READ: one request consumes as many PSNs as response packets (IBTA 9.7.1.1).
#[test]
fn rdma_read_spans_psns() {
    let (mut p, a, b) = connected(Config::default());
    let data = pattern(3000, 1);
    b.write_bytes(8192, &data);
    a.post_send(
        &mut p,
        wr(
            4,
            WrOperation::RdmaRead {
                remote_addr: b.mr.addr + 8192,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 3000)],
        ),
    );
    a.post_send(&mut p, wr(5, WrOperation::Send, vec![a.sge(0, 1)]));
    b.post_recv(&mut p, 1, 0, 16);
    p.drive();
    let t = p.trace();
    assert_eq!(t[0], "A->B RC_RDMA_READ_REQUEST psn=100");
    assert!(
        t.contains(&"B->A RC_RDMA_READ_RESPONSE_LAST psn=102 aeth=0x1f".to_string()),
        "{t:#?}"
    );
    assert!(
        t.contains(&"A->B RC_SEND_ONLY psn=103".to_string()),
        "{t:#?}"
    );
    assert_eq!(a.read_bytes(0, 3000), data);
    let sc = a.poll(&mut p);
    assert_eq!(
        sc.iter().map(|w| (w.wr_id, w.opcode)).collect::<Vec<_>>(),
        [(4, WcOpcode::RdmaRead), (5, WcOpcode::Send)]
    );
    assert_eq!(sc[0].byte_len, 3000);
}

/// Atomics operate on 8 bytes and return the original value (manual 3.6).
#[test]
fn atomics_return_the_original_value() {
    let (mut p, a, b) = connected(Config::default());
    b.buf.write_u64(64, 40).unwrap();
    a.post_send(
        &mut p,
        wr(
            1,
            WrOperation::AtomicFetchAndAdd {
                remote_addr: b.mr.addr + 64,
                rkey: b.mr.rkey,
                add: 2,
            },
            vec![a.sge(0, 8)],
        ),
    );
    a.post_send(
        &mut p,
        wr(
            2,
            WrOperation::AtomicCmpAndSwp {
                remote_addr: b.mr.addr + 64,
                rkey: b.mr.rkey,
                compare: 42,
                swap: 7,
            },
            vec![a.sge(8, 8)],
        ),
    );
    a.post_send(
        &mut p,
        wr(
            3,
            WrOperation::AtomicCmpAndSwp {
                remote_addr: b.mr.addr + 64,
                rkey: b.mr.rkey,
                compare: 42,
                swap: 9,
            },
            vec![a.sge(16, 8)],
        ),
    );
    p.drive();
    assert_eq!(
        p.opcodes(Side::B),
        [
            RcAtomicAcknowledge,
            RcAtomicAcknowledge,
            RcAtomicAcknowledge
        ]
    );
    assert_eq!(a.buf.read_u64(0).unwrap(), 40);
    assert_eq!(a.buf.read_u64(8).unwrap(), 42);
    assert_eq!(a.buf.read_u64(16).unwrap(), 7);
    assert_eq!(b.buf.read_u64(64).unwrap(), 7);
    let sc = a.poll(&mut p);
    assert_eq!(
        sc.iter().map(|w| w.opcode).collect::<Vec<_>>(),
        [WcOpcode::FetchAdd, WcOpcode::CompSwap, WcOpcode::CompSwap]
    );
    assert!(sc
        .iter()
        .all(|w| w.status == WcStatus::Success && w.byte_len == 8));
}
