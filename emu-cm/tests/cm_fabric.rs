//! The connection manager on the simulated fabric: virtual time, one thread,
//! deterministic, with faults. A lost REQ is sent again; a peer whose MADs are all lost
//! is UNREACHABLE after the retries; a consumer slow to accept makes its CM send MRAs
//! that keep the active side waiting; UD ids resolve the peer's QPN and Q_Key (SIDR).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use emu_cm::{CmConfig, EmuCm, RDMA_UDP_QKEY};
use emu_sims::{Action, Fabric, Match, Rule};
use verbs_api::*;

const S: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const C: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);

fn cfg() -> CmConfig {
    CmConfig {
        response_timeout: 16, // 268 ms of virtual time
        max_retries: 4,
        mra_service_timeout: 18,
        ..CmConfig::default()
    }
}

struct Host {
    dev: Arc<dyn Device>,
    cm: EmuCm,
    ch: CmChannelId,
}

fn world() -> (Fabric, Host, Host) {
    let fabric = Fabric::new(7);
    let mk = |name: &str, ip| {
        let dev: Arc<dyn Device> = fabric.add_device(name, ip).unwrap();
        let cm = EmuCm::on_fabric(&fabric, vec![dev.clone()], cfg()).unwrap();
        let ch = cm.create_event_channel().unwrap();
        Host { dev, cm, ch }
    };
    let s = mk("server", S);
    let c = mk("client", C);
    (fabric, s, c)
}

fn ev(h: &Host, want: CmEventType) -> CmEvent {
    let e = h.cm.get_cm_event(h.ch, None).unwrap();
    assert_eq!(e.event, want, "{e:?}");
    e
}

fn qp_init(dev: &dyn Device, qp_type: QpType) -> QpInitAttr {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64, None).unwrap();
    QpInitAttr::new(pd, cq, qp_type, QpCap::new(16, 16)).sq_sig_all(true)
}

fn listen(s: &Host, ps: PortSpace, port: u16) -> CmId {
    let l = s.cm.create_id(s.ch, ps).unwrap();
    s.cm.bind_addr(l, SocketAddr::from((S, port))).unwrap();
    s.cm.listen(l, 0).unwrap();
    l
}

fn resolve(c: &Host, ps: PortSpace, port: u16) -> CmId {
    let id = c.cm.create_id(c.ch, ps).unwrap();
    c.cm.resolve_addr(
        id,
        None,
        SocketAddr::from((S, port)),
        Duration::from_millis(100),
    )
    .unwrap();
    ev(c, CmEventType::AddrResolved);
    c.cm.resolve_route(id, Duration::from_millis(100)).unwrap();
    ev(c, CmEventType::RouteResolved);
    id
}

/// The client's MADs to the server's QP1: the 1st is the address probe, the 2nd the REQ.
fn client_mads() -> Match {
    Match::any().dest_qp(1).from("client")
}

#[test]
fn a_lost_req_is_sent_again() {
    let (fabric, s, c) = world();
    let l = listen(&s, PortSpace::Tcp, 5000);
    let drop_req = fabric.add_rule(Rule::new("lose the REQ", client_mads(), Action::Drop).nth(2));
    let cid = resolve(&c, PortSpace::Tcp, 5000);
    c.cm.create_qp(cid, &qp_init(&*c.dev, QpType::Rc)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    let req = s.cm.get_request(l, None).unwrap();
    s.cm.create_qp(req.id, &qp_init(&*s.dev, QpType::Rc))
        .unwrap();
    s.cm.accept(req.id, &ConnParam::default()).unwrap();
    ev(&c, CmEventType::Established);
    ev(&s, CmEventType::Established);
    assert_eq!(fabric.rule_fired(drop_req), 1);
    assert_eq!(c.cm.stats().retransmits, 1);
}

#[test]
fn a_lost_rtu_is_answered_by_the_rep_again() {
    let (fabric, s, c) = world();
    let l = listen(&s, PortSpace::Tcp, 5001);
    // Probe, REQ, RTU: lose the RTU; the server repeats its REP, the client its RTU.
    let drop_rtu = fabric.add_rule(Rule::new("lose the RTU", client_mads(), Action::Drop).nth(3));
    let cid = resolve(&c, PortSpace::Tcp, 5001);
    c.cm.create_qp(cid, &qp_init(&*c.dev, QpType::Rc)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    let req = s.cm.get_request(l, None).unwrap();
    s.cm.create_qp(req.id, &qp_init(&*s.dev, QpType::Rc))
        .unwrap();
    s.cm.accept(req.id, &ConnParam::default()).unwrap();
    ev(&c, CmEventType::Established);
    ev(&s, CmEventType::Established);
    assert_eq!(fabric.rule_fired(drop_rtu), 1);
    assert_eq!(s.cm.stats().retransmits, 1);
}

#[test]
fn a_peer_whose_mads_are_lost_is_unreachable() {
    let (fabric, s, c) = world();
    listen(&s, PortSpace::Tcp, 5002);
    let cid = resolve(&c, PortSpace::Tcp, 5002);
    fabric.add_rule(Rule::new("lose every MAD", client_mads(), Action::Drop));
    c.cm.create_qp(cid, &qp_init(&*c.dev, QpType::Rc)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    let e = ev(&c, CmEventType::Unreachable);
    assert_eq!(e.status, -110);
    assert_eq!(c.cm.stats().retransmits, u64::from(cfg().max_retries));
}

#[test]
fn a_slow_consumer_makes_its_cm_send_mra() {
    let (fabric, s, c) = world();
    let l = listen(&s, PortSpace::Tcp, 5003);
    let cid = resolve(&c, PortSpace::Tcp, 5003);
    c.cm.create_qp(cid, &qp_init(&*c.dev, QpType::Rc)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    let req = s.cm.get_request(l, None).unwrap();
    // The server thinks for a while: the client's REQ times out, is repeated, and the
    // server's CM answers the duplicate with an MRA.
    while s.cm.stats().mra_sent < 2 {
        assert!(fabric.step());
    }
    s.cm.create_qp(req.id, &qp_init(&*s.dev, QpType::Rc))
        .unwrap();
    s.cm.accept(req.id, &ConnParam::default()).unwrap();
    ev(&c, CmEventType::Established);
    ev(&s, CmEventType::Established);
    assert!(c.cm.stats().retransmits >= 2);
}

#[test]
fn disconnect_from_the_passive_side() {
    let (_fabric, s, c) = world();
    let l = listen(&s, PortSpace::Tcp, 5004);
    let cid = resolve(&c, PortSpace::Tcp, 5004);
    c.cm.create_qp(cid, &qp_init(&*c.dev, QpType::Rc)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    let req = s.cm.get_request(l, None).unwrap();
    s.cm.create_qp(req.id, &qp_init(&*s.dev, QpType::Rc))
        .unwrap();
    s.cm.accept(req.id, &ConnParam::default()).unwrap();
    ev(&c, CmEventType::Established);
    ev(&s, CmEventType::Established);
    s.cm.disconnect(req.id).unwrap();
    ev(&c, CmEventType::Disconnected);
    c.cm.disconnect(cid).unwrap();
    ev(&s, CmEventType::Disconnected);
    // Once disconnected, disconnect again is a no-op.
    c.cm.disconnect(cid).unwrap();
    ev(&c, CmEventType::TimewaitExit);
    ev(&s, CmEventType::TimewaitExit);
}

#[test]
fn a_peer_that_never_answers_the_dreq_is_disconnected_after_the_retries() {
    let (_fabric, s, c) = world();
    let l = listen(&s, PortSpace::Tcp, 5007);
    let cid = resolve(&c, PortSpace::Tcp, 5007);
    c.cm.create_qp(cid, &qp_init(&*c.dev, QpType::Rc)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    let req = s.cm.get_request(l, None).unwrap();
    s.cm.create_qp(req.id, &qp_init(&*s.dev, QpType::Rc))
        .unwrap();
    s.cm.accept(req.id, &ConnParam::default()).unwrap();
    ev(&c, CmEventType::Established);
    ev(&s, CmEventType::Established);
    c.cm.disconnect(cid).unwrap();
    ev(&s, CmEventType::Disconnected);
    // The server never calls disconnect: the client repeats its DREQ (the server's CM
    // stays silent: its consumer has not answered), then gives up and is disconnected.
    ev(&c, CmEventType::Disconnected);
    assert_eq!(c.cm.stats().retransmits, u64::from(cfg().max_retries));
}

#[test]
fn ud_ids_resolve_the_peers_qpn_and_qkey() {
    let (_fabric, s, c) = world();
    let l = listen(&s, PortSpace::Udp, 6000);
    let cid = resolve(&c, PortSpace::Udp, 6000);
    let cinit = qp_init(&*c.dev, QpType::Ud);
    let cqpn = c.cm.create_qp(cid, &cinit).unwrap();
    assert_eq!(c.dev.query_qp(cqpn).unwrap().0.qp_state, QpState::Rts);
    c.cm.connect(
        cid,
        &ConnParam {
            private_data: b"ud hello".to_vec(),
            ..ConnParam::default()
        },
    )
    .unwrap();
    let req = s.cm.get_request(l, None).unwrap();
    assert_eq!(&req.param.private_data()[..8], b"ud hello");
    let sinit = qp_init(&*s.dev, QpType::Ud);
    let sqpn = s.cm.create_qp(req.id, &sinit).unwrap();
    let sbuf = MemBuf::new(256);
    let smr = s
        .dev
        .reg_mr(sinit.pd, &sbuf, 0, 256, AccessFlags::LOCAL_WRITE)
        .unwrap();
    post_recv(&s.cm, req.id, 9, smr.addr, 256, &smr).unwrap();
    s.cm.accept(req.id, &ConnParam::default()).unwrap();
    let e = ev(&c, CmEventType::Established);
    let CmEventParam::Ud(ud) = e.param else {
        panic!("{e:?}")
    };
    assert_eq!((ud.qp_num, ud.qkey), (sqpn, RDMA_UDP_QKEY));
    // A datagram to what the event says arrives.
    let ah = c.dev.create_ah(cinit.pd, &ud.ah_attr).unwrap();
    let cbuf = MemBuf::from_slice(b"datagram");
    let cmr = c
        .dev
        .reg_mr(cinit.pd, &cbuf, 0, 8, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let wr = SendWr::send(
        1,
        vec![Sge {
            addr: cmr.addr,
            length: 8,
            lkey: cmr.lkey,
        }],
    )
    .with_ud(UdDest {
        ah,
        remote_qpn: ud.qp_num,
        remote_qkey: ud.qkey,
    });
    c.dev.post_send(cqpn, &[wr]).unwrap();
    let wc = get_recv_comp(&s.cm, req.id, Some(Duration::from_secs(5))).unwrap();
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
    assert_eq!(&sbuf.to_vec()[40..48], b"datagram");
}

#[test]
fn ud_reject_is_unreachable_with_the_sidr_status() {
    let (_fabric, s, c) = world();
    let l = listen(&s, PortSpace::Udp, 6001);
    let cid = resolve(&c, PortSpace::Udp, 6001);
    c.cm.create_qp(cid, &qp_init(&*c.dev, QpType::Ud)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    let req = s.cm.get_request(l, None).unwrap();
    // The SIDR REP carries 136 bytes (IBTA 12.11.2), not a REJ's 148: one more is
    // EINVAL and sends nothing; the id can still reject with all 136.
    let long: Vec<u8> = (0..=136u8).collect();
    let e = s.cm.reject(req.id, &long).unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL);
    s.cm.reject(req.id, &long[..136]).unwrap();
    let e = ev(&c, CmEventType::Unreachable);
    assert_eq!(e.status, 2); // IB_SIDR_REJECT
    assert_eq!(e.param.private_data(), &long[..136]);
}

/// verbs-api's private-data limits are the MAD sizes emu-wire lays out, less the
/// rdma_cm header on the two REQs.
#[test]
fn private_data_limits_are_the_mads() {
    use emu_wire::mad::{pdata, CMA_HDR_LEN};
    assert_eq!(CMA_HDR_LEN, verbs_api::CMA_HDR_LEN);
    for ps in PortSpace::ALL.iter().copied() {
        let (req, rep, rej) = if ps.is_ud() {
            (pdata::SIDR_REQ, pdata::SIDR_REP, pdata::SIDR_REP)
        } else {
            (pdata::REQ, pdata::REP, pdata::REJ)
        };
        assert_eq!(
            ps.max_private_data(PrivateDataUse::Connect),
            req - CMA_HDR_LEN
        );
        assert_eq!(ps.max_private_data(PrivateDataUse::Accept), rep);
        assert_eq!(ps.max_private_data(PrivateDataUse::Reject), rej);
    }
}

#[test]
fn an_id_without_a_qp_gets_connect_response_then_establishes() {
    let (_fabric, s, c) = world();
    let l = listen(&s, PortSpace::Tcp, 5005);
    let cid = resolve(&c, PortSpace::Tcp, 5005);
    // The QP is the application's own, named by number (manual 4.2.9 qp_num).
    let qpn = c.dev.create_qp(&qp_init(&*c.dev, QpType::Rc)).unwrap();
    c.cm.connect(
        cid,
        &ConnParam {
            qp_num: qpn,
            ..ConnParam::default()
        },
    )
    .unwrap();
    let req = s.cm.get_request(l, None).unwrap();
    let CmEventParam::Conn(p) = &req.param else {
        panic!("{req:?}")
    };
    assert_eq!(p.qp_num, qpn);
    let sqpn =
        s.cm.create_qp(req.id, &qp_init(&*s.dev, QpType::Rc))
            .unwrap();
    s.cm.accept(req.id, &ConnParam::default()).unwrap();
    let e = ev(&c, CmEventType::ConnectResponse);
    let CmEventParam::Conn(p) = &e.param else {
        panic!("{e:?}")
    };
    assert_eq!(p.qp_num, sqpn);
    c.cm.establish(cid).unwrap();
    ev(&s, CmEventType::Established);
}

#[test]
fn a_rep_that_cannot_be_used_is_connect_error() {
    let (_fabric, s, c) = world();
    let l = listen(&s, PortSpace::Tcp, 5006);
    let cid = resolve(&c, PortSpace::Tcp, 5006);
    let qpn = c.cm.create_qp(cid, &qp_init(&*c.dev, QpType::Rc)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    // The QP is moved to ERROR behind the CM's back: the REP cannot bring it to RTR
    // (ERROR -> INIT is not a transition, IBTA 10.3.1).
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    c.dev.modify_qp(qpn, &err, QpAttrMask::STATE).unwrap();
    let req = s.cm.get_request(l, None).unwrap();
    s.cm.create_qp(req.id, &qp_init(&*s.dev, QpType::Rc))
        .unwrap();
    s.cm.accept(req.id, &ConnParam::default()).unwrap();
    let e = ev(&c, CmEventType::ConnectError);
    assert!(e.status < 0, "{e:?}");
    assert_eq!(c.dev.query_qp(qpn).unwrap().0.qp_state, QpState::Err);
    // No RTU and no REJ yet: the passive side hears of it when the active id goes
    // (REJ "consumer defined", as the kernel's cm_destroy_id sends from REP_RCVD).
    c.cm.destroy_qp(cid).unwrap();
    c.cm.destroy_id(cid).unwrap();
    let e = ev(&s, CmEventType::Rejected);
    assert_eq!((e.id, e.status), (req.id, REJECT_CONSUMER));
}

/// Retry counts above the REQ's 3 bits connect as 7, as the kernel's `cma_connect_ib`
/// takes min(7, ...) (libfabric asks for 15); the active side's QP gets the same.
#[test]
fn retry_counts_above_7_connect_as_7() {
    let (_fabric, s, c) = world();
    let l = listen(&s, PortSpace::Tcp, 5011);
    let cid = resolve(&c, PortSpace::Tcp, 5011);
    let qpn = c.cm.create_qp(cid, &qp_init(&*c.dev, QpType::Rc)).unwrap();
    let param = ConnParam {
        retry_count: 15,
        rnr_retry_count: 15,
        ..ConnParam::default()
    };
    c.cm.connect(cid, &param).unwrap();
    let req = s.cm.get_request(l, None).unwrap();
    s.cm.create_qp(req.id, &qp_init(&*s.dev, QpType::Rc))
        .unwrap();
    s.cm.accept(req.id, &ConnParam::default()).unwrap();
    ev(&c, CmEventType::Established);
    ev(&s, CmEventType::Established);
    let (attr, _) = c.dev.query_qp(qpn).unwrap();
    assert_eq!((attr.retry_cnt, attr.rnr_retry), (7, 7));
}

/// A listening id destroyed while a connection request waits on its channel, not
/// handed out yet, takes the request's new id with it, as the kernel's
/// `ucma_destroy_id` does: the peer is rejected, and the channel hands out no event
/// naming either id (a C program would get one whose `id` is gone).
#[test]
fn a_destroyed_listener_takes_its_requests_not_handed_out_with_it() {
    let (fabric, s, c) = world();
    let l = listen(&s, PortSpace::Tcp, 5012);
    let cid = resolve(&c, PortSpace::Tcp, 5012);
    c.cm.create_qp(cid, &qp_init(&*c.dev, QpType::Rc)).unwrap();
    c.cm.connect(cid, &ConnParam::default()).unwrap();
    fabric.run_for(Duration::from_millis(10));
    assert_eq!(s.cm.stats().received, 2, "the address probe and the REQ");
    s.cm.destroy_id(l).unwrap();
    assert_eq!(s.cm.stats().rej_sent, 1);
    let e = ev(&c, CmEventType::Rejected);
    assert_eq!((e.id, e.status), (cid, REJECT_CONSUMER));
    let left = s.cm.get_cm_event(s.ch, Some(Duration::ZERO));
    assert!(matches!(left, Err(Error::TimedOut)), "{left:?}");
}
