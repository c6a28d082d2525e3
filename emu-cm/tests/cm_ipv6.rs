//! The connection manager on IPv6 (AF_INET6 ids): two hosts on `::1` (each a device and
//! a CM; the devices share the address) bind, listen, resolve and connect by IPv6
//! address and port; the REQ's rdma_cm header carries the IPv6 addresses, the ids'
//! GIDs are the address itself, and a SEND crosses the connection.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use emu_cm::{CmConfig, EmuCm};
use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

struct Host {
    dev: Arc<dyn Device>,
    cm: EmuCm,
    ch: CmChannelId,
}

fn host(name: &str, port: u16) -> Host {
    let dev: Arc<dyn Device> = Arc::new(
        EmuDevice::open(EmuConfig {
            name: name.into(),
            ip: Ipv6Addr::LOCALHOST.into(),
            port,
            ..EmuConfig::default()
        })
        .unwrap(),
    );
    let cfg = CmConfig {
        response_timeout: 12,
        max_retries: 3,
        ..CmConfig::default()
    };
    let cm = EmuCm::open(vec![dev.clone()], cfg).unwrap();
    let ch = cm.create_event_channel().unwrap();
    Host { dev, cm, ch }
}

fn ev(h: &Host, want: CmEventType) -> CmEvent {
    let e = h.cm.get_cm_event(h.ch, WAIT).unwrap();
    assert_eq!(e.event, want, "{e:?}");
    e
}

fn qp_init(dev: &dyn Device) -> QpInitAttr {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16, None).unwrap();
    QpInitAttr::new(pd, cq, QpType::Rc, QpCap::new(8, 8)).sq_sig_all(true)
}

#[test]
fn connect_and_send_over_ipv6() {
    // No other test of this crate binds ::1.
    let port = 40000 + (std::process::id() % 20000) as u16;
    let (s, c) = (host("cm6s", port), host("cm6c", port));
    let lo6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let l = s.cm.create_id(s.ch, PortSpace::Tcp).unwrap();
    s.cm.bind_addr(l, SocketAddr::new(lo6, 7481)).unwrap();
    s.cm.listen(l, 4).unwrap();

    let cid = c.cm.create_id(c.ch, PortSpace::Tcp).unwrap();
    let dst = SocketAddr::new(lo6, 7481);
    c.cm.resolve_addr(cid, None, dst, Duration::from_millis(200))
        .unwrap();
    ev(&c, CmEventType::AddrResolved);
    c.cm.resolve_route(cid, Duration::from_millis(200)).unwrap();
    ev(&c, CmEventType::RouteResolved);
    let info = c.cm.id_info(cid).unwrap();
    assert_eq!(info.dgid, Gid::from_ipv6(Ipv6Addr::LOCALHOST));
    assert_eq!(info.sgid, Gid::from_ipv6(Ipv6Addr::LOCALHOST));
    assert_eq!(info.peer, Some(dst));
    assert!(info.local.is_some_and(|a| a.ip() == lo6));

    c.cm.create_qp(cid, &qp_init(&*c.dev)).unwrap();
    let hello = ConnParam {
        private_data: b"hello over IPv6".to_vec(),
        ..ConnParam::default()
    };
    c.cm.connect(cid, &hello).unwrap();
    let req = s.cm.get_request(l, WAIT).unwrap();
    assert_eq!(&req.param.private_data()[..15], b"hello over IPv6");
    let sid = req.id;
    // The passive side learnt the active side's IPv6 address from the rdma_cm header.
    let peer = s.cm.id_info(sid).unwrap().peer.unwrap();
    assert_eq!(peer.ip(), lo6);
    assert_eq!(s.cm.id_info(sid).unwrap().local.unwrap(), dst);
    s.cm.create_qp(sid, &qp_init(&*s.dev)).unwrap();
    let sbuf = MemBuf::new(4096);
    let smr = reg_msgs(&s.cm, sid, &sbuf, 0, 4096).unwrap();
    post_recv(&s.cm, sid, 7, smr.addr, 64, &smr).unwrap();
    s.cm.accept(sid, &ConnParam::default()).unwrap();
    ev(&c, CmEventType::Established);
    ev(&s, CmEventType::Established);

    let cbuf = MemBuf::from_slice(&[0x66; 4096]);
    let cmr = reg_msgs(&c.cm, cid, &cbuf, 0, 4096).unwrap();
    post_send(&c.cm, cid, 1, cmr.addr, 64, Some(&cmr), SendFlags::SIGNALED).unwrap();
    assert_eq!(
        get_send_comp(&c.cm, cid, WAIT).unwrap().status,
        WcStatus::Success
    );
    let wc = get_recv_comp(&s.cm, sid, WAIT).unwrap();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 64));
    assert_eq!(sbuf.to_vec()[..64], [0x66; 64]);

    c.cm.disconnect(cid).unwrap();
    ev(&s, CmEventType::Disconnected);
    s.cm.disconnect(sid).unwrap();
    ev(&c, CmEventType::Disconnected);
}

#[test]
fn an_ipv4_destination_from_an_ipv6_only_cm_is_eafnosupport() {
    let port = 40000 + (std::process::id() % 20000) as u16 + 1;
    let c = host("cm6x", port);
    let id = c.cm.create_id(c.ch, PortSpace::Tcp).unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], 7482));
    let e =
        c.cm.resolve_addr(id, None, dst, Duration::from_millis(200))
            .unwrap_err();
    assert_eq!(e.errno(), 97);
}
