//! UD between EmuDevices over real UDP on loopback, through the `Device` trait: a
//! unicast SEND and a multicast SEND that reaches every attached QP of two devices
//! (IP multicast on the loopback interface).

use std::net::Ipv4Addr;

use emu_core::nic::EmuDevice;
use verbs_api::*;

mod device_util;
use device_util::{post_recv, send_ud, ud_side, wait_one, Side};

const QKEY: u32 = 0x1111_1111;

fn port() -> u16 {
    // Away from udp.rs's ports (20000..40000) and the examples' (40000..64000).
    10000 + (std::process::id() % 9000) as u16
}

fn open(host: u8) -> EmuDevice {
    device_util::open(&format!("ud{host}"), Ipv4Addr::new(127, 0, 9, host), port())
}

/// A UD QP in RTS with a 4 KiB buffer and a receive posted at its start.
fn ud_qp(d: &EmuDevice) -> Side {
    let s = ud_side(d, QKEY, 4096);
    post_recv(d, &s, 1, 0, 1024);
    s
}

fn send(d: &EmuDevice, from: &Side, ah: AhId, remote_qpn: u32, text: &[u8]) {
    let dest = UdDest {
        ah,
        remote_qpn,
        remote_qkey: QKEY,
    };
    send_ud(d, from, 2048, dest, text);
}

#[test]
fn ud_unicast_and_multicast_over_udp() {
    let (da, db) = (open(1), open(2));
    let a = ud_qp(&da);
    let (b1, b2) = (ud_qp(&db), ud_qp(&db));
    let a2 = ud_qp(&da);

    // Unicast.
    let attr = AhAttr {
        grh: GlobalRoute {
            dgid: db.gid(),
            hop_limit: 64,
            ..GlobalRoute::default()
        },
        is_global: true,
        port_num: 1,
        ..AhAttr::default()
    };
    let ah = da.create_ah(a.pd, &attr).unwrap();
    send(&da, &a, ah, b1.qpn, b"unicast");
    let wc = wait_one(&db, b1.cq);
    assert_eq!(
        (wc.status, wc.byte_len, wc.src_qp),
        (WcStatus::Success, 47, a.qpn)
    );
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    let mut got = [0u8; 47];
    b1.buf.read(0, &mut got).unwrap();
    assert_eq!(&got[32..36], &[127, 0, 9, 1], "GRH source address");
    assert_eq!(&got[40..], b"unicast");
    db.post_recv(
        b1.qpn,
        &[RecvWr::new(1, vec![Sge::new(b1.mr.addr, 1024, b1.mr.lkey)])],
    )
    .unwrap();

    // Multicast: B's two QPs and A's second QP join; A's first QP sends once.
    let group = Gid::from_ipv4(Ipv4Addr::new(
        239,
        9,
        9,
        (std::process::id() % 250) as u8 + 1,
    ));
    db.attach_mcast(b1.qpn, &group, 0).unwrap();
    db.attach_mcast(b2.qpn, &group, 0).unwrap();
    da.attach_mcast(a2.qpn, &group, 0).unwrap();
    let mattr = AhAttr {
        grh: GlobalRoute {
            dgid: group,
            hop_limit: 1,
            ..GlobalRoute::default()
        },
        ..attr
    };
    let mah = da.create_ah(a.pd, &mattr).unwrap();
    send(&da, &a, mah, 0xFF_FFFF, b"to the group");
    for (d, q) in [(&db, &b1), (&db, &b2), (&da, &a2)] {
        let wc = wait_one(d, q.cq);
        assert_eq!((wc.status, wc.src_qp), (WcStatus::Success, a.qpn));
        let mut got = [0u8; 52];
        q.buf.read(0, &mut got).unwrap();
        assert_eq!(
            &got[36..40],
            &group.to_ipv4().unwrap().octets(),
            "GRH destination"
        );
        assert_eq!(&got[40..], b"to the group");
    }
    assert_eq!(
        db.link_counters()
            .icrc_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // Errnos through the trait.
    assert_eq!(db.destroy_qp(b1.qpn).unwrap_err().errno(), 16);
    db.detach_mcast(b1.qpn, &group, 0).unwrap();
    assert_eq!(db.detach_mcast(b1.qpn, &group, 0).unwrap_err().errno(), 22);
    db.destroy_qp(b1.qpn).unwrap();
    assert_eq!(da.dealloc_pd(a.pd).unwrap_err().errno(), 16);
    da.destroy_ah(ah).unwrap();
    assert_eq!(da.destroy_ah(ah).unwrap_err().errno(), 22);
}
