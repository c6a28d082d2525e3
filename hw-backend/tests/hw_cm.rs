//! `HwCm`, the connection manager over librdmacm, on a real device (in CI: kernel rxe
//! in the VM of `scripts/ci-hw.sh`): both ends on the one device, connected through
//! its own address, as the emulator's conformance cases do (tests/src/cases/cm.rs): its
//! first IPv4 RoCE GID's, or with `$RDMA_GID_INDEX` set that GID's, IPv4 or IPv6
//! (common::cm_ip). Skips, saying why, without a device (unless `REQUIRE_RDMA_DEVICE=1`)
//! or without such an address.
#![cfg(feature = "hw")]
#![forbid(unsafe_code)]

mod common;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hw_backend::{HwCm, HwDevice};
use verbs_api::*;

const T: Option<Duration> = Some(Duration::from_secs(10));

fn setup() -> Option<(Arc<HwDevice>, HwCm, IpAddr)> {
    let dev = Arc::new(common::device()?);
    let Some(ip) = common::cm_ip(&*dev) else {
        eprintln!("SKIP: {} has no IPv4 RoCE GID", dev.name());
        return None;
    };
    eprintln!("connecting through {ip}");
    let cm = HwCm::new(dev.clone());
    Some((dev, cm, ip))
}

fn ev(cm: &HwCm, ch: CmChannelId, want: CmEventType) -> CmEvent {
    let t0 = std::time::Instant::now();
    let e = cm
        .get_cm_event(ch, T)
        .unwrap_or_else(|e| panic!("waiting for {want} on {ch:?}: {e}"));
    eprintln!(
        "{ch:?}: {} (status {}) for {:?} after {:?}",
        e.event,
        e.status,
        e.id,
        t0.elapsed()
    );
    assert_eq!(e.event, want, "{e:?}");
    e
}

fn init(dev: &dyn Device, qp_type: QpType) -> QpInitAttr {
    let cq = dev.create_cq(64, None).unwrap();
    QpInitAttr::new(dev.alloc_pd().unwrap(), cq, qp_type, QpCap::new(16, 16))
}

/// A listener on `ip:port` (server channel) and an id resolved toward it (client
/// channel).
fn ends(cm: &HwCm, ip: IpAddr, port: u16) -> (CmChannelId, CmId, CmChannelId, CmId) {
    let (sch, cch) = (
        cm.create_event_channel().unwrap(),
        cm.create_event_channel().unwrap(),
    );
    let to = SocketAddr::from((ip, port));
    let l = cm.create_id(sch, PortSpace::Tcp).unwrap();
    cm.bind_addr(l, to).unwrap();
    cm.listen(l, 4).unwrap();
    let c = cm.create_id(cch, PortSpace::Tcp).unwrap();
    cm.resolve_addr(c, None, to, Duration::from_secs(2))
        .unwrap();
    ev(cm, cch, CmEventType::AddrResolved);
    cm.resolve_route(c, Duration::from_secs(2)).unwrap();
    ev(cm, cch, CmEventType::RouteResolved);
    (sch, l, cch, c)
}

/// manual 4.2.9-4.2.15, 5.2: connect with private data, SEND, RDMA WRITE, disconnect.
#[test]
fn connect_send_write_disconnect() {
    let Some((dev, cm, ip)) = setup() else { return };
    let (sch, l, cch, c) = ends(&cm, ip, 7481);
    let cqpn = cm.create_qp(c, &init(&*dev, QpType::Rc)).unwrap();
    cm.connect(
        c,
        &ConnParam {
            private_data: b"hw hello".to_vec(),
            ..ConnParam::default()
        },
    )
    .unwrap();
    let req = cm.get_request(l, T).unwrap();
    assert_eq!(&req.param.private_data()[..8], b"hw hello");
    let s = req.id;
    let sqpn = cm.create_qp(s, &init(&*dev, QpType::Rc)).unwrap();
    let sbuf = MemBuf::new(4096);
    let smr = reg_write(&cm, s, &sbuf, 0, 4096).unwrap();
    post_recv(&cm, s, 5, smr.addr, 64, &smr).unwrap();
    cm.accept(
        s,
        &ConnParam {
            private_data: b"hw welcome".to_vec(),
            ..ConnParam::default()
        },
    )
    .unwrap();
    let e = ev(&cm, cch, CmEventType::Established);
    assert_eq!(&e.param.private_data()[..10], b"hw welcome");
    ev(&cm, sch, CmEventType::Established);
    assert_eq!(dev.query_qp(cqpn).unwrap().0.qp_state, QpState::Rts);
    assert_eq!(dev.query_qp(cqpn).unwrap().0.dest_qp_num, sqpn);

    let cbuf = MemBuf::from_slice(&[0x5A; 4096]);
    let cmr = reg_msgs(&cm, c, &cbuf, 0, 4096).unwrap();
    post_send(&cm, c, 1, cmr.addr, 64, Some(&cmr), SendFlags::SIGNALED).unwrap();
    assert_eq!(get_send_comp(&cm, c, T).unwrap().status, WcStatus::Success);
    let wc = get_recv_comp(&cm, s, T).unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (5, WcStatus::Success, 64)
    );
    post_write(
        &cm,
        c,
        2,
        cmr.addr,
        4096,
        &cmr,
        SendFlags::SIGNALED,
        smr.addr,
        smr.rkey,
    )
    .unwrap();
    assert_eq!(get_send_comp(&cm, c, T).unwrap().status, WcStatus::Success);
    assert_eq!(sbuf.to_vec(), vec![0x5A; 4096]);

    // rdma_cm answers a DREQ when the passive side calls rdma_disconnect in turn (the
    // usual reply to DISCONNECTED); only then does the active side get its own.
    cm.disconnect(c).unwrap();
    ev(&cm, sch, CmEventType::Disconnected);
    cm.disconnect(s).unwrap();
    ev(&cm, cch, CmEventType::Disconnected);
    assert_eq!(dev.query_qp(cqpn).unwrap().0.qp_state, QpState::Err);
    cm.destroy_qp(c).unwrap();
    cm.destroy_qp(s).unwrap();
    cm.destroy_id(c).unwrap();
    cm.destroy_id(s).unwrap();
}

/// manual 4.2.13: rdma_reject's private data reaches the active side with REJECTED.
#[test]
fn reject_is_rejected_with_private_data() {
    let Some((dev, cm, ip)) = setup() else { return };
    let (_, l, cch, c) = ends(&cm, ip, 7482);
    cm.create_qp(c, &init(&*dev, QpType::Rc)).unwrap();
    cm.connect(c, &ConnParam::default()).unwrap();
    let req = cm.get_request(l, T).unwrap();
    cm.reject(req.id, b"no thanks").unwrap();
    let e = ev(&cm, cch, CmEventType::Rejected);
    assert_eq!(e.status, REJECT_CONSUMER);
    assert_eq!(&e.param.private_data()[..9], b"no thanks");
}

/// manual 4.2.6: an address nobody answers for is ADDR_ERROR (or refused at once).
#[test]
fn unowned_address_is_addr_error() {
    let Some((_dev, cm, _ip)) = setup() else {
        return;
    };
    let ch = cm.create_event_channel().unwrap();
    let id = cm.create_id(ch, PortSpace::Tcp).unwrap();
    // An address of the device's own subnet (a /24, a /64) that nobody has: its
    // neighbour resolution (ARP, IPv6 neighbour discovery) fails. (An off-subnet
    // address resolves to the gateway, or fails at once without a route.)
    let Some((_, _, ip)) = setup() else { return };
    let to = match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            IpAddr::from([o[0], o[1], o[2], if o[3] == 77 { 78 } else { 77 }])
        }
        IpAddr::V6(v6) => {
            let mut s = v6.segments();
            s[7] = if s[7] == 0x77 { 0x78 } else { 0x77 };
            IpAddr::V6(Ipv6Addr::from(s))
        }
    };
    let to = SocketAddr::from((to, 7483));
    match cm.resolve_addr(id, None, to, Duration::from_millis(500)) {
        Ok(()) => {
            let e = cm.get_cm_event(ch, T).unwrap();
            assert_eq!(e.event, CmEventType::AddrError, "{e:?}");
        }
        Err(e) => eprintln!("resolve_addr refused at once: {e}"),
    }
}

/// manual 4.3.1 RDMA_CM_EVENT_UNREACHABLE, IBTA 12.6.2: a REQ the peer never answers is
/// sent again after each response timeout and the connect ends in UNREACHABLE with
/// -ETIMEDOUT. The peer is `$RDMA_CM_SILENT_PEER`, an address whose node answers ARP
/// but runs no RDMA CM (in the rxe VM: QEMU's DNS address); a closed port on a node with
/// a CM is REJECTED instead. The kernel sends the REQ 16 times (CMA_MAX_CM_RETRIES 15),
/// about 4.4 s apart (CMA_CM_RESPONSE_TIMEOUT 20 plus twice the RoCE packet life time),
/// so this takes about 75 s.
#[test]
fn silent_peer_is_unreachable() {
    let Some((dev, cm, _ip)) = setup() else {
        return;
    };
    let Some(peer) = std::env::var("RDMA_CM_SILENT_PEER")
        .ok()
        .and_then(|v| v.parse::<IpAddr>().ok())
    else {
        eprintln!(
            "SKIP: set RDMA_CM_SILENT_PEER to an address that answers ARP but runs no RDMA CM"
        );
        return;
    };
    let ch = cm.create_event_channel().unwrap();
    let id = cm.create_id(ch, PortSpace::Tcp).unwrap();
    cm.resolve_addr(
        id,
        None,
        SocketAddr::from((peer, 7489)),
        Duration::from_secs(2),
    )
    .unwrap();
    ev(&cm, ch, CmEventType::AddrResolved);
    cm.resolve_route(id, Duration::from_secs(2)).unwrap();
    ev(&cm, ch, CmEventType::RouteResolved);
    let qpn = cm.create_qp(id, &init(&*dev, QpType::Rc)).unwrap();
    cm.connect(id, &ConnParam::default()).unwrap();
    let e = cm
        .get_cm_event(ch, Some(Duration::from_secs(150)))
        .expect("UNREACHABLE within 150 s");
    assert_eq!(
        (e.event, e.id, e.status),
        (CmEventType::Unreachable, id, -110),
        "{e:?}"
    );
    assert_ne!(dev.query_qp(qpn).unwrap().0.qp_state, QpState::Rts);
}
