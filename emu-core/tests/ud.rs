//! UD (IBTA 9.8, 10.2.5): one-packet SENDs with a DETH, Q_Key checks, the GRH in the
//! receive buffer, address handles and multicast, on the two-engine harness.

mod util;

use emu_core::engine::{init_ah_from_wc, GRH_LEN, MULTICAST_QPN};
use emu_wire::Opcode::*;
use util::*;
use verbs_api::{
    AhId, Gid, QpAttr, QpAttrMask, QpState, QpType, SendWr, UdDest, WcFlags, WcOpcode, WcStatus,
    WrOperation,
};

const QKEY: u32 = 0x1111_2222;

/// A ping and its answer: DETH, GRH (IPv4 layout) in the buffer, WC flags and src_qp,
/// and an AH made from the completion answers the sender.
#[test]
fn ud_ping_pong_with_grh_and_src_qp() {
    let (mut p, a, b) = ud_pair(ud_config(), QKEY);
    let data = pattern(300, 3);
    a.write_bytes(0, &data);
    b.post_recv(&mut p, 7, 0, 1024);
    let ah = a.create_ah(&mut p, gid(Side::B));
    a.post_send(
        &mut p,
        ud_send(1, vec![a.sge(0, 300)], ah, b.qpn, QKEY).with_imm(0xC0FFEE),
    );
    p.drive();
    assert_eq!(p.opcodes(Side::A), [UdSendOnlyWithImmediate]);
    let wc = a.poll(&mut p);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    assert_eq!(wc[0].opcode, WcOpcode::Send);

    let wc = b.poll(&mut p);
    assert_eq!(wc.len(), 1);
    let wc = wc[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (7, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(wc.byte_len, 340);
    assert_eq!(wc.wc_flags, WcFlags::GRH | WcFlags::WITH_IMM);
    // IBTA A17.4.5.1, in `sl` as RoCE devices report it: RoCEv2 (UDP) over IPv4.
    assert_eq!(wc.sl, 0x8 | 0x2);
    assert_eq!(
        (wc.src_qp, wc.qp_num, wc.imm_data),
        (a.qpn, b.qpn, 0xC0FFEE)
    );
    // The GRH: 20 zero bytes, then the IPv4 header from 10.0.0.1 to 10.0.0.2.
    let grh = b.read_bytes(0, GRH_LEN);
    assert!(grh[..20].iter().all(|&x| x == 0));
    assert_eq!(grh[20], 0x45);
    assert_eq!(grh[29], 17, "UDP");
    assert_eq!(&grh[32..36], &[10, 0, 0, 1]);
    assert_eq!(&grh[36..40], &[10, 0, 0, 2]);
    // IPv4 total length: IP + UDP + BTH + DETH + ImmDt + payload + ICRC
    assert_eq!(
        u16::from_be_bytes([grh[22], grh[23]]),
        20 + 8 + 12 + 8 + 4 + 300 + 4
    );
    assert_eq!(b.read_bytes(GRH_LEN, 300), data);

    // Answer through an AH built from the completion.
    let attr = init_ah_from_wc(1, &wc, &grh, &[gid(Side::B)]).unwrap();
    assert_eq!(attr.grh.dgid, gid(Side::A));
    let back = p.b.create_ah_from_wc(b.pd, &wc, &grh).unwrap();
    assert_eq!(p.b.ah_attr(back).unwrap().grh.dgid, gid(Side::A));
    a.post_recv(&mut p, 8, 4096, 1024);
    b.write_bytes(2048, b"pong");
    b.post_send(
        &mut p,
        ud_send(2, vec![b.sge(2048, 4)], back, wc.src_qp, QKEY),
    );
    p.drive();
    let wc = a.poll(&mut p);
    assert_eq!((wc[0].wr_id, wc[0].byte_len, wc[0].src_qp), (8, 44, b.qpn));
    assert_eq!(wc[0].wc_flags, WcFlags::GRH);
    assert_eq!(a.read_bytes(4096 + GRH_LEN, 4), b"pong");
}

/// A message larger than the port's active MTU: LOC_LEN_ERR, nothing on the wire, the
/// QP in SQE; SQE -> RTS resumes sending.
#[test]
fn oversize_message_is_a_local_length_error_and_sends_nothing() {
    let (mut p, a, b) = ud_pair(ud_config(), QKEY);
    let mtu = p.a.limits().active_mtu.bytes();
    let ah = a.create_ah(&mut p, gid(Side::B));
    b.post_recv(&mut p, 1, 0, 8192);
    a.post_send(&mut p, ud_send(1, vec![a.sge(0, mtu + 1)], ah, b.qpn, QKEY));
    a.post_send(&mut p, ud_send(2, vec![a.sge(0, 8)], ah, b.qpn, QKEY));
    p.drive();
    assert!(p.log.is_empty(), "nothing sent: {:?}", p.trace());
    let wc = a.poll(&mut p);
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(a.state(&mut p), QpState::Sqe);
    assert!(b.poll(&mut p).is_empty());
    // Exactly one MTU is fine.
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
    a.post_send(&mut p, ud_send(3, vec![a.sge(0, mtu)], ah, b.qpn, QKEY));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(b.poll(&mut p)[0].byte_len, mtu + GRH_LEN as u32);
}

/// A Q_Key that is not the receiver's: dropped silently and counted; the receive WQE
/// stays for the next good packet. A WR Q_Key with the high bit set takes the QP's.
#[test]
fn qkey_mismatch_is_dropped_and_counted() {
    let (mut p, a, b) = ud_pair(ud_config(), QKEY);
    let ah = a.create_ah(&mut p, gid(Side::B));
    b.post_recv(&mut p, 1, 0, 1024);
    a.write_bytes(0, b"bad!good");
    a.post_send(&mut p, ud_send(1, vec![a.sge(0, 4)], ah, b.qpn, 0x0BAD));
    p.drive();
    // The sender cannot know: its WR succeeded.
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert!(b.poll(&mut p).is_empty());
    assert_eq!(p.b.counters().qkey_violations, 1);
    assert_eq!(p.b.counters().ud_received, 0);
    // High bit set: the QP's own Q_Key (QKEY) goes in the DETH.
    a.post_send(
        &mut p,
        ud_send(2, vec![a.sge(4, 4)], ah, b.qpn, 0x8000_0000),
    );
    p.drive();
    let wc = b.poll(&mut p);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    assert_eq!(b.read_bytes(GRH_LEN, 4), b"good");
    assert_eq!(p.b.counters().qkey_violations, 1);
}

/// A send to a QP number that names no QP (google/rdma-unit-test uses 0xDEADBEEF, more
/// than the BTH's 24 bits): sent with the low 24 bits, dropped by the receiver and
/// counted; the sender's WR succeeds (it cannot know) and its QP goes on working.
#[test]
fn send_to_a_missing_qpn_is_dropped_and_counted() {
    let (mut p, a, b) = ud_pair(ud_config(), QKEY);
    let ah = a.create_ah(&mut p, gid(Side::B));
    b.post_recv(&mut p, 1, 0, 1024);
    a.write_bytes(0, b"lost");
    a.post_send(&mut p, ud_send(1, vec![a.sge(0, 4)], ah, 0xDEAD_BEEF, QKEY));
    p.drive();
    let wc = a.poll(&mut p);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    assert!(p.log.iter().any(|r| r.opcode == UdSendOnly), "sent");
    assert!(b.poll(&mut p).is_empty());
    assert_eq!(p.b.counters().rx_unknown_qp, 1);
    a.post_send(&mut p, ud_send(2, vec![a.sge(0, 4)], ah, b.qpn, QKEY));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(b.poll(&mut p)[0].wr_id, 1);
}

/// The address handle's traffic class goes with the datagram (the IPv4 TOS byte, IBTA
/// Annex A17.4.5) and the receiver's GRH shows the TOS the datagram came with.
#[test]
fn traffic_class_travels_and_shows_in_the_grh() {
    let (mut p, a, b) = ud_pair(ud_config(), QKEY);
    let mut attr = ah_attr_to(gid(Side::B));
    attr.grh.traffic_class = 0xFC;
    let ah = p.a.create_ah(a.pd, &attr).unwrap();
    b.post_recv(&mut p, 1, 0, 1024);
    a.post_send(&mut p, ud_send(1, vec![a.sge(0, 4)], ah, b.qpn, QKEY));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::Success);
    let sent: Vec<u8> = p.log.iter().map(|r| r.traffic_class).collect();
    assert_eq!(sent, [0xFC]);
    let grh = b.read_bytes(0, GRH_LEN);
    assert_eq!(
        (grh[20], grh[21]),
        (0x45, 0xFC),
        "the IPv4 layout's TOS byte"
    );
}

/// A receive buffer without room for the GRH and the payload: LOC_LEN_ERR, not a byte
/// written, the QP in error. A packet with no receive WQE is dropped and counted.
#[test]
fn short_receive_buffer_and_missing_receive() {
    let (mut p, a, b) = ud_pair(ud_config(), QKEY);
    let ah = a.create_ah(&mut p, gid(Side::B));
    a.write_bytes(0, &pattern(100, 1));
    a.post_send(&mut p, ud_send(1, vec![a.sge(0, 100)], ah, b.qpn, QKEY));
    p.drive();
    assert_eq!(p.b.counters().ud_no_recv_drops, 1);
    assert!(b.poll(&mut p).is_empty());

    b.write_bytes(0, &[0xEE; 200]);
    b.post_recv(&mut p, 5, 0, 139); // 100 + 40 needed
    a.post_send(&mut p, ud_send(2, vec![a.sge(0, 100)], ah, b.qpn, QKEY));
    p.drive();
    let wc = b.poll(&mut p);
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::LocLenErr));
    assert_eq!(
        b.read_bytes(0, 200),
        vec![0xEE; 200],
        "not one byte written"
    );
    assert_eq!(b.state(&mut p), QpState::Err);
}

/// Multicast: two QPs of one device attached to a group each get the packet sent to the
/// group (destination QP 0xFFFFFF); a detached or unattached QP does not.
#[test]
fn multicast_reaches_every_attached_qp() {
    let cfg = ud_config();
    let (mut p, a, b) = ud_pair(cfg, QKEY);
    let b2 = setup(&mut p.b, Side::B, &cfg);
    let b3 = setup(&mut p.b, Side::B, &cfg);
    let now = p.now;
    ud_bring_up(&mut p.b, now, b2.qpn, QKEY, 0);
    ud_bring_up(&mut p.b, now, b3.qpn, QKEY, 0);
    let group = Gid::from_ipv4([239, 1, 2, 3].into());
    p.b.attach_mcast(b.qpn, &group, 0).unwrap();
    p.b.attach_mcast(b2.qpn, &group, 0).unwrap();
    assert_eq!(p.b.mcast_groups(), [group]);
    for n in [&b, &b2, &b3] {
        n.post_recv(&mut p, 1, 0, 1024);
        n.post_recv(&mut p, 2, 1024, 1024);
    }
    let ah = a.create_ah(&mut p, group);
    a.write_bytes(0, b"to all");
    a.post_send(
        &mut p,
        ud_send(1, vec![a.sge(0, 6)], ah, MULTICAST_QPN, QKEY),
    );
    p.drive();
    assert_eq!(p.log.len(), 1, "one packet on the wire");
    for n in [&b, &b2] {
        let wc = n.poll(&mut p);
        assert_eq!(
            (wc.len(), wc[0].status, wc[0].src_qp),
            (1, WcStatus::Success, a.qpn)
        );
        assert_eq!(n.read_bytes(GRH_LEN, 6), b"to all");
        // The GRH names the group as the destination.
        assert_eq!(n.read_bytes(36, 4), [239, 1, 2, 3]);
    }
    assert!(b3.poll(&mut p).is_empty());
    assert_eq!(p.b.counters().ud_received, 2);

    p.b.detach_mcast(b.qpn, &group, 0).unwrap();
    a.post_send(
        &mut p,
        ud_send(2, vec![a.sge(0, 6)], ah, MULTICAST_QPN, QKEY),
    );
    p.drive();
    assert!(b.poll(&mut p).is_empty());
    assert_eq!(b2.poll(&mut p).len(), 1);
    // Unicast to QP 0xFFFFFF at a unicast address: dropped.
    let uni = a.create_ah(&mut p, gid(Side::B));
    let dropped = p.b.counters().rx_dropped;
    a.post_send(
        &mut p,
        ud_send(3, vec![a.sge(0, 6)], uni, MULTICAST_QPN, QKEY),
    );
    p.drive();
    assert_eq!(p.b.counters().rx_dropped, dropped + 1);
}

/// The errnos of the UD verbs, as libibverbs returns them.
#[test]
fn ud_verb_errors() {
    let (mut p, a, b) = ud_pair(ud_config(), QKEY);
    let now = p.now;
    let ah = a.create_ah(&mut p, gid(Side::B));
    let ud = UdDest {
        ah: AhId(ah.0),
        remote_qpn: b.qpn,
        remote_qkey: QKEY,
    };
    let errno = |r: Result<(), verbs_api::PostError>| r.unwrap_err().error.errno();
    // Only SEND and SEND with immediate.
    for op in [
        WrOperation::RdmaWrite {
            remote_addr: 0,
            rkey: 1,
        },
        WrOperation::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        },
        WrOperation::SendWithInv { invalidate_rkey: 1 },
    ] {
        let wr = SendWr::new(1, vec![a.sge(0, 8)], op).with_ud(ud);
        assert_eq!(errno(p.a.post_send(now, a.qpn, &[wr])), 22);
    }
    // No destination, an unknown AH.
    assert_eq!(
        errno(p.a.post_send(now, a.qpn, &[SendWr::send(1, vec![a.sge(0, 8)])])),
        22
    );
    let bad_ah = UdDest {
        ah: AhId(999),
        ..ud
    };
    let wr = SendWr::send(1, vec![a.sge(0, 8)]).with_ud(bad_ah);
    assert_eq!(errno(p.a.post_send(now, a.qpn, &[wr])), 22);

    // Address handles: unknown PD, no GRH, bad GID index; EBUSY on the PD while one
    // exists; EINVAL for a second destroy.
    let mut attr = ah_attr_to(gid(Side::B));
    assert_eq!(
        p.a.create_ah(verbs_api::PdId(99), &attr)
            .unwrap_err()
            .errno(),
        22
    );
    attr.is_global = false;
    assert_eq!(p.a.create_ah(a.pd, &attr).unwrap_err().errno(), 22);
    attr = ah_attr_to(gid(Side::B));
    attr.grh.sgid_index = 200;
    assert_eq!(p.a.create_ah(a.pd, &attr).unwrap_err().errno(), 22);
    let pd2 = p.a.alloc_pd().unwrap();
    let ah2 = p.a.create_ah(pd2, &ah_attr_to(gid(Side::B))).unwrap();
    assert_eq!(p.a.dealloc_pd(pd2).unwrap_err().errno(), 16);
    // An AH of another PD: the WR fails with LOC_QP_OP_ERR, the QP goes to SQE.
    let wr = SendWr::send(9, vec![a.sge(0, 8)])
        .signaled()
        .with_ud(UdDest {
            ah: AhId(ah2.0),
            ..ud
        });
    p.a.post_send(now, a.qpn, &[wr]).unwrap();
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::LocQpOpErr);
    assert_eq!(a.state(&mut p), QpState::Sqe);
    p.a.destroy_ah(ah2).unwrap();
    assert_eq!(p.a.destroy_ah(ah2).unwrap_err().errno(), 22);
    p.a.dealloc_pd(pd2).unwrap();

    // Multicast: UD only, multicast GIDs only, EBUSY on destroy while attached, EINVAL
    // to detach what is not attached.
    let group = Gid::from_ipv4([224, 0, 0, 9].into());
    let rc = setup(&mut p.a, Side::A, &Config::default());
    assert_eq!(p.a.attach_mcast(rc.qpn, &group, 0).unwrap_err().errno(), 22);
    assert_eq!(
        p.a.attach_mcast(a.qpn, &gid(Side::B), 0)
            .unwrap_err()
            .errno(),
        22
    );
    assert_eq!(p.a.detach_mcast(a.qpn, &group, 0).unwrap_err().errno(), 22);
    p.a.attach_mcast(a.qpn, &group, 0).unwrap();
    assert_eq!(p.a.destroy_qp(a.qpn).unwrap_err().errno(), 16);
    p.a.detach_mcast(a.qpn, &group, 0).unwrap();
    p.a.destroy_qp(a.qpn).unwrap();

    // The state machine: Q_Key required at INIT, no path attributes at RTR.
    let q = setup(&mut p.a, Side::A, &ud_config()).qpn;
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    assert_eq!(p.a.modify_qp(now, q, &init, m).unwrap_err().errno(), 22);
    p.a.modify_qp(now, q, &init, m | QpAttrMask::QKEY).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: ah_attr_to(gid(Side::B)),
        ..init
    };
    assert_eq!(
        p.a.modify_qp(now, q, &rtr, QpAttrMask::STATE | QpAttrMask::AV)
            .unwrap_err()
            .errno(),
        22
    );
    p.a.modify_qp(now, q, &rtr, QpAttrMask::STATE).unwrap();
    let (attr, init_attr) = p.a.query_qp(q).unwrap();
    assert_eq!(init_attr.qp_type, QpType::Ud);
    assert_eq!(attr.path_mtu, p.a.limits().active_mtu);
    // Posting before RTS is EINVAL.
    let wr = SendWr::send(1, vec![a.sge(0, 8)]).with_ud(ud);
    assert_eq!(errno(p.a.post_send(now, q, &[wr])), 22);
}

/// An AH destroyed after a WR that uses it was posted: the WR keeps its copy.
#[test]
fn posted_wr_outlives_its_address_handle() {
    let (mut p, a, b) = ud_pair(ud_config(), QKEY);
    let ah = a.create_ah(&mut p, gid(Side::B));
    b.post_recv(&mut p, 1, 0, 1024);
    a.post_send(&mut p, ud_send(1, vec![a.sge(0, 16)], ah, b.qpn, QKEY));
    p.a.destroy_ah(ah).unwrap();
    p.drive();
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::Success);
}
