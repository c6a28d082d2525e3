//! UD multicast between devices on IPv6 addresses, end to end over a veth pair: a UD
//! QP sends to an `ff05::` group (its MGID is the group's address, IBTA 4.1.1), the two
//! receiving devices' QPs attached to it each get the datagram with a GRH in the IPv6
//! layout (IBTA 8.3, Annex A17.4.5.1: SGID the sender's address, DGID the group), a
//! QP that detaches gets no more (manual 3.6.14 ibv_detach_mcast), and a device whose
//! last QP leaves leaves the group without taking it from another device.
//!
//! Linux's `lo` carries no IPv6 multicast (a send out of it is ENETUNREACH), so this
//! runs in a child process inside new, unprivileged user and network namespaces
//! (`unshare -Urn`), where a veth pair carries the group: the sender's address on one
//! end, the receivers' on the other. It skips, saying so, where namespaces cannot be
//! had.

use std::net::Ipv6Addr;

use emu_core::nic::EmuDevice;
use verbs_api::*;

mod device_util;
mod netns_util;
use device_util::{send_ud, sh, ud_side, wait_one, Side};

const QKEY: u32 = 0x6666_0001;
const PORT: u16 = 4791;

fn open(name: &str, ip: Ipv6Addr) -> EmuDevice {
    device_util::open(name, ip, PORT)
}

/// A UD QP in RTS with a registered 8 KiB buffer.
fn ud_qp(d: &EmuDevice) -> Side {
    ud_side(d, QKEY, 8192)
}

/// Posts a receive of 1 KiB at `slot` KiB into the buffer, `wr_id` the slot.
fn post_recv(d: &EmuDevice, q: &Side, slot: u64) {
    device_util::post_recv(d, q, slot, slot * 1024, 1024);
}

/// Sends `text` from `from` through `ah` to `remote_qpn` and waits for its completion.
fn send(d: &EmuDevice, from: &Side, ah: AhId, remote_qpn: u32, text: &[u8]) {
    let dest = UdDest {
        ah,
        remote_qpn,
        remote_qkey: QKEY,
    };
    send_ud(d, from, 4096, dest, text);
}

/// Waits for `q`'s next receive and checks it came from `src_qp` with an IPv6 GRH from
/// `sgid` to `dgid` and payload `text`.
fn expect(d: &EmuDevice, q: &Side, src_qp: u32, sgid: Ipv6Addr, dgid: Ipv6Addr, text: &[u8]) {
    let wc = wait_one(d, q.cq);
    assert_eq!(
        (wc.status, wc.src_qp, wc.byte_len as usize),
        (WcStatus::Success, src_qp, 40 + text.len()),
        "{wc:?}"
    );
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    let mut got = vec![0u8; 40 + text.len()];
    q.buf.read(wc.wr_id as usize * 1024, &mut got).unwrap();
    // IPv6 layout: version 6, next header UDP, then the two addresses.
    assert_eq!(got[0] >> 4, 6, "IP version");
    assert_eq!(got[6], 17, "next header");
    assert_eq!(&got[8..24], &sgid.octets(), "GRH SGID");
    assert_eq!(&got[24..40], &dgid.octets(), "GRH DGID");
    assert_eq!(&got[40..], text);
}

#[test]
fn ud_multicast_over_ipv6_reaches_attached_qps_only() {
    if netns_util::is_child() {
        return in_namespaces();
    }
    let Some((ok, text)) =
        netns_util::run_child("ud_multicast_over_ipv6_reaches_attached_qps_only", false)
    else {
        return;
    };
    assert!(
        ok && text.contains("ipv6_multicast: all checks passed"),
        "{text}"
    );
}

fn in_namespaces() {
    // v6a holds the sender's address, v6b the two receivers'; nodad: usable at once.
    sh("ip link set lo up");
    sh("ip link add v6a type veth peer name v6b");
    sh("ip link set v6a up && ip link set v6b up");
    sh("ip -6 addr add fd00:77::1/64 dev v6a nodad");
    sh("ip -6 addr add fd00:77::2/64 dev v6b nodad");
    sh("ip -6 addr add fd00:77::3/64 dev v6b nodad");
    let (a_ip, b_ip, c_ip): (Ipv6Addr, Ipv6Addr, Ipv6Addr) = (
        "fd00:77::1".parse().unwrap(),
        "fd00:77::2".parse().unwrap(),
        "fd00:77::3".parse().unwrap(),
    );
    let group: Ipv6Addr = "ff05::77:1".parse().unwrap();
    let mgid = Gid::from_ipv6(group);
    let (da, db, dc) = (
        open("v6mca", a_ip),
        open("v6mcb", b_ip),
        open("v6mcc", c_ip),
    );
    let a = ud_qp(&da);
    // B's device has one QP in the group, C's two (each on a CQ of its own).
    let (b, c1, c2) = (ud_qp(&db), ud_qp(&dc), ud_qp(&dc));
    let members = [(&db, &b), (&dc, &c1), (&dc, &c2)];
    for (d, q) in members {
        d.attach_mcast(q.qpn, &mgid, 0).unwrap();
        for slot in 0..4 {
            post_recv(d, q, slot);
        }
    }
    let to_group = da
        .create_ah(
            a.pd,
            &AhAttr {
                grh: GlobalRoute {
                    dgid: mgid,
                    hop_limit: 1,
                    ..GlobalRoute::default()
                },
                is_global: true,
                port_num: 1,
                ..AhAttr::default()
            },
        )
        .unwrap();

    // Every attached QP gets each datagram.
    for text in [&b"to the group"[..], b"once more"] {
        send(&da, &a, to_group, 0xFF_FFFF, text);
        for (d, q) in members {
            expect(d, q, a.qpn, a_ip, group, text);
        }
    }

    // C1 leaves: the next datagram reaches B and C2 only. C's device hands a datagram
    // to all its attached QPs at once, so once C2 has it, C1 would have it too.
    dc.detach_mcast(c1.qpn, &mgid, 0).unwrap();
    send(&da, &a, to_group, 0xFF_FFFF, b"after C1 left");
    expect(&db, &b, a.qpn, a_ip, group, b"after C1 left");
    expect(&dc, &c2, a.qpn, a_ip, group, b"after C1 left");
    let mut more = Vec::new();
    dc.poll_cq(c1.cq, 1, &mut more).unwrap();
    assert!(more.is_empty(), "C1 received after leaving: {more:?}");

    // C2 leaves too, and with it C's device leaves the group on its interface: B, on
    // the same interface, still hears the group.
    dc.detach_mcast(c2.qpn, &mgid, 0).unwrap();
    send(&da, &a, to_group, 0xFF_FFFF, b"B alone");
    expect(&db, &b, a.qpn, a_ip, group, b"B alone");
    for d in [&da, &db, &dc] {
        assert_eq!(
            d.link_counters()
                .icrc_errors
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }
    println!("ipv6_multicast: all checks passed");
}
