//! A device on both address families, end to end over a veth pair: two devices on
//! 10.77.0.1 and 10.77.0.2, whose veth ends also hold IPv6 link-local addresses (and
//! one end a ULA), list their GIDs as kernel rxe does (`[0]` the link-local address,
//! `[1]` the IPv4 one, then the other IPv6 addresses) and carry RC and UD traffic over
//! GID index 0 (UDP/IPv6, scoped to the veth) and index 1 (UDP/IPv4), each packet
//! leaving from the address its QP's or address handle's `sgid_index` names.
//!
//! A connected QP takes packets only from its peer's GID (kernel rxe's `check_addr`),
//! so RC over index 0 completes only if the requests and ACKs really travel between
//! the link-local addresses; a UD receive's GRH shows which family carried it.
//!
//! Runs in a child process inside new, unprivileged user, network and mount namespaces
//! (`unshare -Urnm`, sysfs remounted for the namespace's interfaces), and skips, saying so, where those cannot be had.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::Ordering;

use emu_core::nic::EmuDevice;
use verbs_api::*;

mod device_util;
mod netns_util;
use device_util::{sh, wait_one, Side};

const QKEY: u32 = 0x7777_0001;
const PORT: u16 = 4791;

fn open(name: &str, ip: Ipv4Addr) -> EmuDevice {
    device_util::open(name, ip, PORT)
}

/// A QP of `qp_type` with a 16 KiB buffer open to remote writes.
fn side(d: &EmuDevice, qp_type: QpType) -> Side {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    device_util::side(d, qp_type, 16384, access)
}

/// Posts a 4 KiB receive at `at`, `wr_id` `at`.
fn post_recv(d: &EmuDevice, s: &Side, at: u64) {
    device_util::post_recv(d, s, at, at, 4096);
}

/// RC between `da` and `db` over GID index `index` of both: a 3000-byte RDMA WRITE and
/// a 3000-byte SEND (several packets each at the veth's 1024-byte path MTU), data
/// checked at B.
fn rc_over(da: &EmuDevice, db: &EmuDevice, index: u8) {
    let (a, b) = (side(da, QpType::Rc), side(db, QpType::Rc));
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        sgid_index: index,
        ..QpParams::default()
    };
    device_util::connect(da, &a, db, &b, QpType::Rc, &params);
    let text: Vec<u8> = (0..3000u32)
        .map(|i| (i * 13 + index as u32) as u8)
        .collect();
    a.buf.write(8192, &text).unwrap();
    let wr = SendWr::rdma_write(
        1,
        vec![Sge::new(a.mr.addr + 8192, 3000, a.mr.lkey)],
        b.mr.addr + 12000,
        b.mr.rkey,
    );
    da.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(
        wait_one(da, a.cq).status,
        WcStatus::Success,
        "WRITE, index {index}"
    );
    let mut got = vec![0u8; 3000];
    b.buf.read(12000, &mut got).unwrap();
    assert_eq!(got, text, "WRITE data, index {index}");
    post_recv(db, &b, 0);
    let wr = SendWr::send(2, vec![Sge::new(a.mr.addr + 8192, 3000, a.mr.lkey)]);
    da.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(
        wait_one(da, a.cq).status,
        WcStatus::Success,
        "SEND, index {index}"
    );
    let wc = wait_one(db, b.cq);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 3000));
    b.buf.read(0, &mut got).unwrap();
    assert_eq!(got, text, "SEND data, index {index}");
}

/// UD from `da` to `db` over GID index `index`: the receive's GRH is in the layout of
/// that index's family, from A's GID to B's at that index.
fn ud_over(da: &EmuDevice, db: &EmuDevice, index: u8) {
    let (a, b) = (side(da, QpType::Ud), side(db, QpType::Ud));
    let params = QpParams {
        qkey: QKEY,
        ..QpParams::default()
    };
    connect_qp(da, a.qpn, QpType::Ud, &params, 1, &Endpoint::default()).unwrap();
    connect_qp(db, b.qpn, QpType::Ud, &params, 1, &Endpoint::default()).unwrap();
    let (sgid, dgid) = (
        da.query_gid(1, u32::from(index)).unwrap(),
        db.query_gid(1, u32::from(index)).unwrap(),
    );
    let ah = da
        .create_ah(
            a.pd,
            &QpParams {
                sgid_index: index,
                ..params
            }
            .ah_attr(dgid),
        )
        .unwrap();
    post_recv(db, &b, 0);
    let text = b"over one family";
    a.buf.write(8192, text).unwrap();
    let wr = SendWr::send(
        3,
        vec![Sge::new(a.mr.addr + 8192, text.len() as u32, a.mr.lkey)],
    )
    .with_ud(UdDest {
        ah,
        remote_qpn: b.qpn,
        remote_qkey: QKEY,
    });
    da.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(wait_one(da, a.cq).status, WcStatus::Success);
    let wc = wait_one(db, b.cq);
    assert_eq!(
        (wc.status, wc.src_qp, wc.byte_len as usize),
        (WcStatus::Success, a.qpn, 40 + text.len()),
        "UD, index {index}: {wc:?}"
    );
    let mut grh = [0u8; 40];
    b.buf.read(0, &mut grh).unwrap();
    match (sgid.to_ipv4(), dgid.to_ipv4()) {
        (Some(s), Some(d)) => {
            // IPv4 layout: 20 zero bytes, then the IPv4 header.
            assert_eq!(grh[20] >> 4, 4, "IPv4 over index {index}");
            assert_eq!(&grh[32..36], &s.octets());
            assert_eq!(&grh[36..40], &d.octets());
        }
        _ => {
            assert_eq!(grh[0] >> 4, 6, "IPv6 over index {index}");
            assert_eq!(&grh[8..24], &sgid.0, "GRH SGID");
            assert_eq!(&grh[24..40], &dgid.0, "GRH DGID");
        }
    }
    // The answer's address handle, made from the receive, names the same index.
    let back = db.init_ah_from_wc(1, &wc, &grh).unwrap();
    assert_eq!(
        (back.grh.dgid, back.grh.sgid_index),
        (sgid, index),
        "ah_from_wc"
    );
    let mut got = vec![0u8; text.len()];
    b.buf.read(40, &mut got).unwrap();
    assert_eq!(got, text);
}

#[test]
fn a_device_on_both_families_lists_and_carries_both() {
    if netns_util::is_child() {
        return in_namespaces();
    }
    let Some((ok, text)) =
        netns_util::run_child("a_device_on_both_families_lists_and_carries_both", true)
    else {
        return;
    };
    assert!(
        ok && text.contains("dual_family: all checks passed"),
        "{text}"
    );
}

fn in_namespaces() {
    // Link-local addresses of our choosing, usable at once (nodad), instead of the
    // kernel's EUI-64 ones, which wait for duplicate address detection.
    // The namespace's own sysfs, where the devices read their interface.
    sh("mount -t sysfs sysfs /sys");
    sh("ip link set lo up");
    sh("ip link add d0 type veth peer name d1");
    sh("ip link set d0 addrgenmode none && ip link set d1 addrgenmode none");
    sh("ip link set d0 up && ip link set d1 up");
    sh("ip addr add 10.77.0.1/24 dev d0 && ip addr add 10.77.0.2/24 dev d1");
    sh("ip -6 addr add fe80::a/64 dev d0 nodad && ip -6 addr add fe80::b/64 dev d1 nodad");
    sh("ip -6 addr add fd00:77::a/64 dev d0 nodad");
    let (da, db) = (
        open("dual0", Ipv4Addr::new(10, 77, 0, 1)),
        open("dual1", Ipv4Addr::new(10, 77, 0, 2)),
    );
    let v6 = |s: &str| Gid::from_ipv6(s.parse::<Ipv6Addr>().unwrap());
    let table = |d: &EmuDevice| -> Vec<Gid> {
        let len = d.query_port(1).unwrap().gid_tbl_len;
        (0..len)
            .map(|i| d.query_gid(1, i).unwrap())
            .filter(|g| *g != Gid::ZERO)
            .collect()
    };
    assert_eq!(
        table(&da),
        vec![
            v6("fe80::a"),
            Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 1)),
            v6("fd00:77::a")
        ]
    );
    assert_eq!(
        table(&db),
        vec![v6("fe80::b"), Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 2))]
    );
    assert_eq!(da.netdev().as_deref(), Some("d0"));
    assert_eq!(db.netdev().as_deref(), Some("d1"));
    // The device's own address is still its IPv4 one.
    assert_eq!(da.gid(), Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 1)));

    for index in [0, 1] {
        rc_over(&da, &db, index);
        ud_over(&da, &db, index);
        ud_over(&db, &da, index);
    }
    for d in [&da, &db] {
        assert_eq!(d.link_counters().icrc_errors.load(Ordering::Relaxed), 0);
    }
    println!("dual_family: all checks passed");
}
