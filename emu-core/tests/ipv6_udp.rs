//! Devices on IPv6 addresses over real UDP (`AF_INET6` sockets): RC, UC and UD traffic
//! between two devices on `::1` (which share the address and its port, as two
//! processes share one kernel rxe device), their GIDs being the address itself, every
//! ICRC computed over the IPv6 header (Annex A17.4) and checked on receive, and a UD
//! receive's GRH in the IPv6 layout (IBTA 8.3, Annex A17.4.5.1).

use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::Ordering;

use emu_core::nic::EmuDevice;
use verbs_api::*;

mod device_util;
use device_util::{open, wait_one, Side};

fn port() -> u16 {
    // No other test binds ::1.
    30000 + (std::process::id() % 20000) as u16
}

/// A QP of `qp_type` with an 8 KiB buffer open to remote reads and writes.
fn side(d: &EmuDevice, qp_type: QpType) -> Side {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    device_util::side(d, qp_type, 8192, access)
}

/// Posts a 4 KiB receive at `at`, `wr_id` `at`.
fn post_recv(d: &EmuDevice, s: &Side, at: u64) {
    device_util::post_recv(d, s, at, at, 4096);
}

fn connect(da: &EmuDevice, a: &Side, db: &EmuDevice, b: &Side, qp_type: QpType) {
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..QpParams::default()
    };
    let params = if qp_type == QpType::Uc {
        QpParams {
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            ..params
        }
    } else {
        params
    };
    device_util::connect(da, a, db, b, qp_type, &params);
}

fn no_icrc_errors(devs: &[&EmuDevice]) {
    for d in devs {
        assert_eq!(d.link_counters().icrc_errors.load(Ordering::Relaxed), 0);
    }
}

#[test]
fn a_device_on_an_ipv6_address_has_it_as_its_gid() {
    let d = open("v6gid", Ipv6Addr::LOCALHOST, port() + 1);
    assert_eq!(d.ip(), IpAddr::V6(Ipv6Addr::LOCALHOST));
    assert_eq!(d.gid(), Gid::from_ipv6(Ipv6Addr::LOCALHOST));
    assert_eq!(d.query_gid(1, 0).unwrap(), d.gid());
}

#[test]
fn rc_and_uc_between_two_devices_on_the_ipv6_loopback() {
    let port = port();
    let (da, db) = (
        open("v6a", Ipv6Addr::LOCALHOST, port),
        open("v6b", Ipv6Addr::LOCALHOST, port),
    );
    for qp_type in [QpType::Rc, QpType::Uc] {
        let (a, b) = (side(&da, qp_type), side(&db, qp_type));
        connect(&da, &a, &db, &b, qp_type);
        // SEND, with a message larger than the path MTU (several packets).
        let text: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
        a.buf.write(4096, &text).unwrap();
        post_recv(&db, &b, 0);
        let wr = SendWr::send(1, vec![Sge::new(a.mr.addr + 4096, 3000, a.mr.lkey)]);
        da.post_send(a.qpn, &[wr]).unwrap();
        assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success, "{qp_type:?}");
        let wc = wait_one(&db, b.cq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 3000));
        let mut got = vec![0u8; 3000];
        b.buf.read(0, &mut got).unwrap();
        assert_eq!(got, text, "{qp_type:?} SEND");
        // RDMA WRITE into B's buffer.
        let wr = SendWr::rdma_write(
            2,
            vec![Sge::new(a.mr.addr + 4096, 2000, a.mr.lkey)],
            b.mr.addr + 5000,
            b.mr.rkey,
        );
        da.post_send(a.qpn, &[wr]).unwrap();
        assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
        if qp_type == QpType::Rc {
            let mut got = vec![0u8; 2000];
            b.buf.read(5000, &mut got).unwrap();
            assert_eq!(got, text[..2000], "RC WRITE");
            // RDMA READ back from B.
            let wr = SendWr::rdma_read(
                3,
                vec![Sge::new(a.mr.addr, 2000, a.mr.lkey)],
                b.mr.addr + 5000,
                b.mr.rkey,
            );
            da.post_send(a.qpn, &[wr]).unwrap();
            assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
            let mut got = vec![0u8; 2000];
            a.buf.read(0, &mut got).unwrap();
            assert_eq!(got, text[..2000], "RC READ");
        }
    }
    no_icrc_errors(&[&da, &db]);
}

#[test]
fn ud_over_ipv6_shows_an_ipv6_grh() {
    let port = port() + 2;
    let (da, db) = (
        open("v6uda", Ipv6Addr::LOCALHOST, port),
        open("v6udb", Ipv6Addr::LOCALHOST, port),
    );
    let (a, b) = (side(&da, QpType::Ud), side(&db, QpType::Ud));
    let params = QpParams {
        qkey: 0x1111,
        ..QpParams::default()
    };
    connect_qp(&da, a.qpn, QpType::Ud, &params, 1, &Endpoint::default()).unwrap();
    connect_qp(&db, b.qpn, QpType::Ud, &params, 2, &Endpoint::default()).unwrap();
    post_recv(&db, &b, 0);
    let attr = AhAttr {
        grh: GlobalRoute {
            dgid: db.gid(),
            hop_limit: 64,
            traffic_class: 0x28,
            ..GlobalRoute::default()
        },
        is_global: true,
        port_num: 1,
        ..AhAttr::default()
    };
    let ah = da.create_ah(a.pd, &attr).unwrap();
    a.buf.write(2048, b"over ipv6").unwrap();
    let wr = SendWr::send(9, vec![Sge::new(a.mr.addr + 2048, 9, a.mr.lkey)]).with_ud(UdDest {
        ah,
        remote_qpn: b.qpn,
        remote_qkey: 0x1111,
    });
    da.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
    let wc = wait_one(&db, b.cq);
    assert_eq!(
        (wc.status, wc.byte_len, wc.src_qp),
        (WcStatus::Success, 49, a.qpn)
    );
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    let mut grh = [0u8; 49];
    b.buf.read(0, &mut grh).unwrap();
    // IPv6 layout: version 6, next header UDP, SGID and DGID the two addresses.
    assert_eq!(grh[0] >> 4, 6, "IP version");
    assert_eq!(grh[6], 17, "next header");
    // The traffic class of A's path (IPV6_TCLASS on send, IPV6_RECVTCLASS on receive).
    assert_eq!(
        ((grh[0] & 0x0F) << 4) | (grh[1] >> 4),
        0x28,
        "traffic class"
    );
    assert_eq!(&grh[8..24], &Ipv6Addr::LOCALHOST.octets(), "SGID");
    assert_eq!(&grh[24..40], &Ipv6Addr::LOCALHOST.octets(), "DGID");
    assert_eq!(&grh[40..], b"over ipv6");
    // The answer's address vector comes from the GRH: back to A's address.
    let gids = [db.gid()];
    let back = emu_core::engine::init_ah_from_wc(1, &wc, &grh[..40], &gids).unwrap();
    assert_eq!(back.grh.dgid, da.gid());
    no_icrc_errors(&[&da, &db]);
}

#[test]
fn a_peer_of_the_other_family_is_not_reached() {
    // An IPv6 device cannot send to an IPv4-mapped GID: the packets have no route, and
    // RC's retries run out.
    let d = open("v6lonely", Ipv6Addr::LOCALHOST, port() + 3);
    let a = side(&d, QpType::Rc);
    let params = QpParams {
        timeout: 1,
        retry_cnt: 1,
        ..QpParams::default()
    };
    let v4 = Endpoint {
        qpn: 0x99,
        psn: 0,
        gid: Gid::from_ipv4(std::net::Ipv4Addr::LOCALHOST),
        ..Endpoint::default()
    };
    connect_qp(&d, a.qpn, QpType::Rc, &params, 0, &v4).unwrap();
    let wr = SendWr::send(1, vec![Sge::new(a.mr.addr, 8, a.mr.lkey)]);
    d.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(wait_one(&d, a.cq).status, WcStatus::RetryExcErr);
}

#[test]
fn ud_qps_join_ipv6_groups_of_their_family_only() {
    // An IPv6 MGID is the group's address (IBTA 4.1.1: multicast GIDs start with 0xFF);
    // the device joins it on the interface of its address (here `lo`). Linux has no
    // IPv6 multicast route on `lo` (sends to the group fail with ENETUNREACH), so
    // delivery is exercised on a veth pair in a network namespace (ipv6_multicast.rs).
    let d = open("v6mc", Ipv6Addr::LOCALHOST, port() + 4);
    let b = side(&d, QpType::Ud);
    let params = QpParams {
        qkey: 0x2222,
        ..QpParams::default()
    };
    connect_qp(&d, b.qpn, QpType::Ud, &params, 2, &Endpoint::default()).unwrap();
    let group: Ipv6Addr = format!("ff12::7e:{:x}", std::process::id() % 0xFFFF)
        .parse()
        .unwrap();
    let mgid = Gid::from_ipv6(group);
    d.attach_mcast(b.qpn, &mgid, 0).unwrap();
    // A group of the other family is refused (EOPNOTSUPP).
    let v4_group = Gid::from_ipv4(std::net::Ipv4Addr::new(239, 1, 2, 3));
    assert_eq!(d.attach_mcast(b.qpn, &v4_group, 0).unwrap_err().errno(), 95);
    d.detach_mcast(b.qpn, &mgid, 0).unwrap();
    assert_eq!(d.detach_mcast(b.qpn, &mgid, 0).unwrap_err().errno(), 22);
}
