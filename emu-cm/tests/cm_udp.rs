//! The connection manager over UDP: two hosts (one device and one CM each) on
//! 127.0.x.y connect by address and port, exchange private data, move data with the
//! convenience verbs, disconnect; rejects, unanswered requests and unknown addresses
//! give their events.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use emu_cm::{CmConfig, EmuCm, RDMA_UDP_QKEY};
use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

fn port() -> u16 {
    12000 + (std::process::id() % 20000) as u16
}

fn cfg() -> CmConfig {
    CmConfig {
        response_timeout: 12, // 16.8 ms
        max_retries: 3,
        ..CmConfig::default()
    }
}

struct Host {
    dev: Arc<dyn Device>,
    cm: EmuCm,
    ch: CmChannelId,
    ip: Ipv4Addr,
}

fn host(net: u8, n: u8) -> Host {
    let ip = Ipv4Addr::new(127, 0, net, n);
    let dev: Arc<dyn Device> = Arc::new(
        EmuDevice::open(EmuConfig {
            name: format!("cm{net}.{n}"),
            ip: ip.into(),
            port: port(),
            ..EmuConfig::default()
        })
        .unwrap(),
    );
    let cm = EmuCm::open(vec![dev.clone()], cfg()).unwrap();
    let ch = cm.create_event_channel().unwrap();
    Host { dev, cm, ch, ip }
}

fn ev(h: &Host, want: CmEventType) -> CmEvent {
    let e = h.cm.get_cm_event(h.ch, WAIT).unwrap();
    assert_eq!(e.event, want, "{e:?}");
    e
}

fn qp_init(dev: &dyn Device) -> QpInitAttr {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64, None).unwrap();
    QpInitAttr::new(pd, cq, QpType::Rc, QpCap::new(16, 16)).sq_sig_all(true)
}

/// Client resolves and connects; the server listens on `sport`.
fn resolve(c: &Host, dst: SocketAddr) -> CmId {
    let id = c.cm.create_id(c.ch, PortSpace::Tcp).unwrap();
    c.cm.resolve_addr(id, None, dst, Duration::from_millis(200))
        .unwrap();
    ev(c, CmEventType::AddrResolved);
    c.cm.resolve_route(id, Duration::from_millis(200)).unwrap();
    ev(c, CmEventType::RouteResolved);
    id
}

fn listen(s: &Host, sport: u16) -> CmId {
    let l = s.cm.create_id(s.ch, PortSpace::Tcp).unwrap();
    s.cm.bind_addr(l, SocketAddr::from((s.ip, sport))).unwrap();
    s.cm.listen(l, 4).unwrap();
    l
}

#[test]
fn connect_send_write_disconnect() {
    let (s, c) = (host(9, 1), host(9, 2));
    let l = listen(&s, 7471);
    let cid = resolve(&c, SocketAddr::from((s.ip, 7471)));
    let info = c.cm.id_info(cid).unwrap();
    assert_eq!(info.dgid, Gid::from_ipv4(s.ip));
    assert_eq!(info.sgid, Gid::from_ipv4(c.ip));
    let cqpn = c.cm.create_qp(cid, &qp_init(&*c.dev)).unwrap();
    c.cm.connect(
        cid,
        &ConnParam {
            private_data: b"hello from the client".to_vec(),
            ..ConnParam::default()
        },
    )
    .unwrap();

    let req = s.cm.get_request(l, WAIT).unwrap();
    assert_eq!(req.listen_id, Some(l));
    assert_eq!(&req.param.private_data()[..21], b"hello from the client");
    assert_eq!(req.param.private_data().len(), MAX_CONNECT_PRIVATE_DATA);
    let CmEventParam::Conn(p) = &req.param else {
        panic!("{req:?}")
    };
    assert_eq!(p.qp_num, cqpn);
    let sid = req.id;
    assert_eq!(
        s.cm.id_info(sid).unwrap().peer.unwrap().ip(),
        std::net::IpAddr::V4(c.ip)
    );
    let sqpn = s.cm.create_qp(sid, &qp_init(&*s.dev)).unwrap();
    // The server posts a receive and registers a buffer the client may write.
    let sbuf = MemBuf::new(4096);
    let smr = reg_write(&s.cm, sid, &sbuf, 0, 4096).unwrap();
    post_recv(&s.cm, sid, 7, smr.addr, 64, &smr).unwrap();
    s.cm.accept(
        sid,
        &ConnParam {
            private_data: b"welcome".to_vec(),
            ..ConnParam::default()
        },
    )
    .unwrap();

    let est = ev(&c, CmEventType::Established);
    assert_eq!(&est.param.private_data()[..7], b"welcome");
    let CmEventParam::Conn(p) = &est.param else {
        panic!()
    };
    assert_eq!(p.qp_num, sqpn);
    ev(&s, CmEventType::Established);
    assert_eq!(c.dev.query_qp(cqpn).unwrap().0.qp_state, QpState::Rts);
    assert_eq!(s.dev.query_qp(sqpn).unwrap().0.qp_state, QpState::Rts);

    // SEND and RDMA WRITE with the convenience verbs.
    let cbuf = MemBuf::from_slice(&[0xAB; 4096]);
    let cmr = reg_msgs(&c.cm, cid, &cbuf, 0, 4096).unwrap();
    post_send(&c.cm, cid, 1, cmr.addr, 64, Some(&cmr), SendFlags::SIGNALED).unwrap();
    assert_eq!(
        get_send_comp(&c.cm, cid, WAIT).unwrap().status,
        WcStatus::Success
    );
    let wc = get_recv_comp(&s.cm, sid, WAIT).unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 64)
    );
    post_write(
        &c.cm,
        cid,
        2,
        cmr.addr,
        4096,
        &cmr,
        SendFlags::SIGNALED,
        smr.addr,
        smr.rkey,
    )
    .unwrap();
    assert_eq!(
        get_send_comp(&c.cm, cid, WAIT).unwrap().status,
        WcStatus::Success
    );
    assert_eq!(sbuf.to_vec(), vec![0xAB; 4096]);

    c.cm.disconnect(cid).unwrap();
    ev(&s, CmEventType::Disconnected);
    // The passive side answers DISCONNECTED with disconnect (the DREP), as with rdma_cm.
    s.cm.disconnect(sid).unwrap();
    ev(&c, CmEventType::Disconnected);
    assert_eq!(c.dev.query_qp(cqpn).unwrap().0.qp_state, QpState::Err);
    assert_eq!(s.dev.query_qp(sqpn).unwrap().0.qp_state, QpState::Err);
    ev(&c, CmEventType::TimewaitExit);
    ev(&s, CmEventType::TimewaitExit);
    // A QP still there keeps the id alive (EBUSY), as librdmacm's rule.
    assert_eq!(c.cm.destroy_id(cid).unwrap_err().errno(), 16);
    c.cm.destroy_qp(cid).unwrap();
    c.cm.destroy_id(cid).unwrap();
}

#[test]
fn reject_carries_private_data() {
    let (s, c) = (host(10, 1), host(10, 2));
    let l = listen(&s, 7472);
    let cid = resolve(&c, SocketAddr::from((s.ip, 7472)));
    c.cm.create_qp(cid, &qp_init(&*c.dev)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    let req = s.cm.get_request(l, WAIT).unwrap();
    s.cm.reject(req.id, b"go away").unwrap();
    let e = ev(&c, CmEventType::Rejected);
    assert_eq!(e.status, REJECT_CONSUMER);
    assert_eq!(&e.param.private_data()[..7], b"go away");
}

#[test]
fn nobody_listening_is_rejected_with_invalid_service_id() {
    let (s, c) = (host(11, 1), host(11, 2));
    let cid = resolve(&c, SocketAddr::from((s.ip, 9999)));
    c.cm.create_qp(cid, &qp_init(&*c.dev)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    let e = ev(&c, CmEventType::Rejected);
    assert_eq!(e.status, 8); // IBTA 12.6.7 table 108: invalid service ID
    drop(s);
}

#[test]
fn an_address_no_device_owns_is_addr_error() {
    let c = host(12, 2);
    let id = c.cm.create_id(c.ch, PortSpace::Tcp).unwrap();
    c.cm.resolve_addr(
        id,
        None,
        SocketAddr::from(([127, 0, 12, 77], 1)),
        Duration::from_millis(50),
    )
    .unwrap();
    let e = ev(&c, CmEventType::AddrError);
    assert_eq!(e.status, -110);
    // A source address no device owns is refused at once (EADDRNOTAVAIL).
    let id2 = c.cm.create_id(c.ch, PortSpace::Tcp).unwrap();
    let err =
        c.cm.resolve_addr(
            id2,
            Some(SocketAddr::from(([10, 9, 9, 9], 0))),
            SocketAddr::from(([127, 0, 12, 1], 1)),
            Duration::from_millis(50),
        )
        .unwrap_err();
    assert_eq!(err.errno(), 99);
}

#[test]
fn a_peer_that_never_answers_is_unreachable() {
    let (s, c) = (host(13, 1), host(13, 2));
    let cid = resolve(&c, SocketAddr::from((s.ip, 7473)));
    // The server's CM goes away (its QP1 with it): REQs fall on the floor.
    drop(s);
    c.cm.create_qp(cid, &qp_init(&*c.dev)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    let e = ev(&c, CmEventType::Unreachable);
    assert_eq!(e.status, -110);
    assert_eq!(c.cm.stats().retransmits, 3);
}

#[test]
fn one_device_serves_one_cm() {
    let h = host(14, 1);
    assert_eq!(
        EmuCm::open(vec![h.dev.clone()], cfg()).unwrap_err().errno(),
        16
    );
}

/// mckey's sequence (manual 4.2.27, 4.3.1): each host resolves the group's address
/// (at once: a group has no owner to probe), makes a UD QP and joins; MULTICAST_JOIN
/// gives the group's address vector, QPN 0xFFFFFF and Q_Key, with which the sender's
/// datagram reaches the receiver. After leaving, the receiver's QP gets nothing more.
#[test]
fn multicast_join_send_leave() {
    let (r, s) = (host(15, 1), host(15, 2));
    let group = SocketAddr::from(([239, 0, 15, (std::process::id() % 250) as u8 + 1], 0));
    let mut joined = Vec::new();
    for h in [&r, &s] {
        let id = h.cm.create_id(h.ch, PortSpace::Udp).unwrap();
        let src = SocketAddr::from((h.ip, 0));
        h.cm.resolve_addr(id, Some(src), group, Duration::from_millis(200))
            .unwrap();
        assert_eq!(ev(h, CmEventType::AddrResolved).id, id);
        let init = QpInitAttr {
            qp_type: QpType::Ud,
            ..qp_init(&*h.dev)
        };
        h.cm.create_qp(id, &init).unwrap();
        let buf = MemBuf::new(4096);
        let mr = reg_msgs(&h.cm, id, &buf, 0, 4096).unwrap();
        post_recv(&h.cm, id, 1, mr.addr, 1024, &mr).unwrap();
        h.cm.join_multicast(id, group).unwrap();
        let e = ev(h, CmEventType::MulticastJoin);
        let CmEventParam::Ud(ud) = e.param else {
            panic!("{e:?}")
        };
        assert_eq!((ud.qp_num, ud.qkey), (0xFF_FFFF, RDMA_UDP_QKEY));
        joined.push((id, init.pd, buf, mr, ud));
    }
    let (sid, spd, sbuf, smr, sud) = &joined[1];
    let ah = s.dev.create_ah(*spd, &sud.ah_attr).unwrap();
    let send = |text: &[u8]| {
        sbuf.write(2048, text).unwrap();
        let wr = SendWr::send(
            7,
            vec![Sge::new(smr.addr + 2048, text.len() as u32, smr.lkey)],
        )
        .with_ud(UdDest {
            ah,
            remote_qpn: sud.qp_num,
            remote_qkey: sud.qkey,
        });
        let qpn = s.cm.id_info(*sid).unwrap().qp_num.unwrap();
        s.dev.post_send(qpn, &[wr]).unwrap();
        assert_eq!(
            get_send_comp(&s.cm, *sid, WAIT).unwrap().status,
            WcStatus::Success
        );
    };
    send(b"to the group");
    let (rid, _, rbuf, rmr, _) = &joined[0];
    let wc = get_recv_comp(&r.cm, *rid, WAIT).unwrap();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 40 + 12));
    let mut got = [0u8; 52];
    rbuf.read(0, &mut got).unwrap();
    assert_eq!(&got[40..], b"to the group");
    // Leave: the QP is detached (a second leave is EADDRNOTAVAIL) and hears no more.
    r.cm.leave_multicast(*rid, group).unwrap();
    assert_eq!(r.cm.leave_multicast(*rid, group).unwrap_err().errno(), 99);
    post_recv(&r.cm, *rid, 2, rmr.addr, 1024, rmr).unwrap();
    send(b"again");
    assert!(get_recv_comp(&r.cm, *rid, Some(Duration::from_millis(300))).is_err());
}
