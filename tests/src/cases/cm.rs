//! The connection manager (manual chapter 4; IBTA chapter 12): both ends of a
//! connection on the one device of the case, connected through the CM by the device's
//! own address. The backend opens the CM ([`Env::cm`]): the emulator's `EmuCm` on the
//! clock the backend runs on, librdmacm on hardware.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use std::sync::Arc;

use emu_cm::RDMA_UDP_QKEY;
use verbs_api::{
    CmChannelId, CmEvent, CmEventParam, CmEventType, CmId, ConnParam, ConnectionManager, Gid,
    PortSpace, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType, REJECT_CONSUMER,
};

use super::assert_errno;
use super::errno::{EBUSY, EINVAL};
use crate::env::WAIT;
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("cm::connect_establish_disconnect", "manual 4.2.9-4.2.15, IBTA 12.6.5-12.6.11: REQ/REP/RTU give CONNECT_REQUEST (with the client's private data) and ESTABLISHED on both ids with both QPs in RTS; DREQ gives the peer DISCONNECTED, its rdma_disconnect the DREP and the first side's DISCONNECTED, both QPs in ERROR, then TIMEWAIT_EXIT", connect_disconnect));
    v.push(Case::new("cm::id_without_qp_gets_connect_response", "manual 4.2.11 rdma_connect (qp_num of the application's own QP), man page rdma_get_cm_event(3): an active id with no QP of the CM's gets CONNECT_RESPONSE with the peer's QP number; rdma_establish then gives the passive side ESTABLISHED", connect_response));
    v.push(Case::new("cm::unusable_rep_is_connect_error", "librdmacm rdma_get_cm_event(3) RDMA_CM_EVENT_CONNECT_ERROR, manual 4.3.1: a REP that cannot bring the active QP to RTR/RTS (the QP was moved to ERROR) gives CONNECT_ERROR with a negative status and leaves the QP in ERROR; destroying the active id then rejects the connection (REJ 'consumer defined', 28) and the passive id gets REJECTED", connect_error));
    v.push(Case::new("cm::reject_is_rejected_with_private_data", "manual 4.2.13, IBTA 12.6.7: rdma_reject sends REJ 'consumer reject' (28) with private data; the active id gets REJECTED", reject));
    v.push(Case::new("cm::no_listener_is_rejected", "IBTA 12.6.7 table 108: a REQ for a service ID nobody listens on is answered with REJ 'invalid service ID' (8): REJECTED", no_listener));
    v.push(Case::new(
        "cm::unowned_address_is_addr_error",
        "manual 4.2.6: address resolution toward an address no device owns ends in ADDR_ERROR",
        addr_error,
    ));
    v.push(Case::new("cm::silent_peer_is_unreachable", "manual 4.3.1 RDMA_CM_EVENT_UNREACHABLE, IBTA 12.6.2: a REQ the peer's CM never answers is sent again after each response timeout; after the last retry the connect ends in UNREACHABLE with -ETIMEDOUT (hardware: hw-backend's hw_cm, toward $RDMA_CM_SILENT_PEER)", silent_peer).faulty());
    v.push(Case::new("cm::udp_without_listener_is_unreachable", "manual 4.3.1, IBTA 12.11.2 table 117: a SIDR_REQ for a service ID nobody listens on is answered with SIDR_REP status 1 (service ID not supported): the UD connect ends in UNREACHABLE with that status", udp_no_listener));
    v.push(Case::new("cm::udp_resolves_qpn_and_qkey", "manual 4.2.9, IBTA 12.11: an RDMA_PS_UDP connect (SIDR) gives ESTABLISHED with the peer's QPN and Q_Key (RDMA_UDP_QKEY) in the UD parameters", udp));
    v.push(Case::new("cm::multicast_join_and_leave", "manual 4.2.27-4.2.28, 4.3.1: rdma_join_multicast on a bound RDMA_PS_UDP id with a UD QP gives MULTICAST_JOIN with the UD parameters of the group (its MGID, QPN 0xFFFFFF, the RDMA_PS_UDP Q_Key); a unicast address is EINVAL; leaving a group not joined is EADDRNOTAVAIL", multicast));
    v.push(Case::new("cm::join_past_the_attach_limit_is_multicast_error", "librdmacm rdma_get_cm_event(3) RDMA_CM_EVENT_MULTICAST_ERROR, manual 4.2.27: librdmacm attaches the id's UD QP when the join completes; with max_mcast_qp_attach QPs in the group already (manual 3.3.1) the attach fails and the join is reported as MULTICAST_ERROR with a negative status and the group's MGID", multicast_error));
    v.push(Case::new("cm::removed_address_is_addr_change", "librdmacm man page rdma_get_cm_event(3), RDMA_CM_EVENT_ADDR_CHANGE: the address an id is bound to leaves the device's GID table: ADDR_CHANGE on each id bound to it, and the id lives on", addr_change).faulty());
    v.push(Case::new("cm::dead_device_is_device_removal", "librdmacm man page rdma_get_cm_event(3), RDMA_CM_EVENT_DEVICE_REMOVAL, manual 6.1.9: after a fatal device error (its verbs return EIO) every id on the device gets DEVICE_REMOVAL and can be destroyed", device_removal).faulty());
    v.push(Case::new("cm::down_port_is_route_error", "librdmacm man page rdma_get_cm_event(3), RDMA_CM_EVENT_ROUTE_ERROR: route resolution on a port that is DOWN fails; with the port ACTIVE again it succeeds", route_error).faulty());
    v.push(Case::new("cm::udp_private_data_limits", "IBTA 12.11.1-12.11.2, manual 4.2.9, 4.2.12: on RDMA_PS_UDP, rdma_connect sends a SIDR_REQ: 181 bytes of private data are EINVAL (its 216 less rdma_cm's 36-byte header), 180 reach the listener's CONNECT_REQUEST; rdma_accept sends a SIDR_REP, whose 136 bytes reach the active id's ESTABLISHED", udp_private_data_limits));
    v.push(Case::new("cm::udp_reject_carries_a_sidr_reps_private_data", "IBTA 12.11.2 (SIDR_REP: 136 bytes of private data, status 2 'rejected'), manual 4.2.13: rdma_reject on an RDMA_PS_UDP id answers with a SIDR_REP, not a REJ (148): 137 bytes are EINVAL and send nothing, 136 go, and the active id gets UNREACHABLE with status 2 and those bytes", udp_reject_private_data));
    v.push(Case::new("cm::accept_with_too_much_private_data_rejects", "kernel rdma_cm (rdma_accept: a REP or SIDR_REP it cannot send moves the id's QP to ERROR and rejects), IBTA 12.6.8 (REP: 196 bytes), 12.11.2 (SIDR_REP: 136): rdma_accept with 197 bytes on RDMA_PS_TCP is EINVAL, its QP goes to ERROR and the active id gets REJECTED 'consumer defined' (28); with 137 on RDMA_PS_UDP it is EINVAL and the active id gets UNREACHABLE with SIDR status 2", accept_too_long));
    v.push(Case::new("cm::wrong_calls_fail", "manual 4.2.5, 4.2.9 (librdmacm errnos): connect before route resolution EINVAL, a bound port bound again EADDRINUSE, a channel with ids EBUSY, private data over 56 bytes EINVAL", wrong_calls));
}

/// The port of the cases' addresses that no id binds (toward an address nobody owns).
const ANY_PORT: u16 = 7400;

type Cm = Arc<dyn ConnectionManager>;

fn open_cm(env: &Env) -> Result<Cm, Outcome> {
    let Some(open) = &env.cm else {
        return Err(Outcome::Skip(
            "the backend has no connection manager".into(),
        ));
    };
    Ok(open().expect("open the CM over the case's device"))
}

macro_rules! cm_or_skip {
    ($env:expr) => {
        match open_cm($env) {
            Ok(cm) => cm,
            Err(o) => return o,
        }
    };
}

/// The device's address: the IPv4 address of an IPv4-mapped GID, else the GID as an
/// IPv6 address (a device on IPv6: `conformance --ip ::1`).
fn ip(env: &Env) -> IpAddr {
    env.ip()
}

fn ev(cm: &Cm, ch: CmChannelId, want: CmEventType) -> CmEvent {
    let e = cm.get_cm_event(ch, Some(WAIT)).expect("a CM event");
    assert_eq!(e.event, want, "{e:?}");
    e
}

fn init(env: &Env, qp_type: QpType) -> QpInitAttr {
    QpInitAttr::new(env.pd(), env.cq(64), qp_type, crate::env::default_cap())
}

/// Binds `id` to the device's address and a port the CM picks (port 0: no port of
/// another process's CM is taken, as the CM's ports are the host's), and returns the
/// address it got.
fn bind_any(env: &Env, cm: &Cm, id: CmId) -> SocketAddr {
    cm.bind_addr(id, SocketAddr::from((ip(env), 0))).unwrap();
    let at = cm.id_info(id).unwrap().local.expect("a bound id's address");
    assert_ne!(at.port(), 0, "the CM picked a port");
    at
}

/// An address of the device on which nobody listens: a port the CM picked for an id
/// that is then destroyed.
fn unheard(env: &Env, cm: &Cm, ch: CmChannelId, ps: PortSpace) -> SocketAddr {
    let id = cm.create_id(ch, ps).unwrap();
    let at = bind_any(env, cm, id);
    cm.destroy_id(id).unwrap();
    at
}

/// A listener on the device's address and an active id resolved toward it.
fn ends(env: &Env, cm: &Cm, ch: CmChannelId, ps: PortSpace) -> (CmId, CmId) {
    let l = cm.create_id(ch, ps).unwrap();
    let to = bind_any(env, cm, l);
    cm.listen(l, 0).unwrap();
    (l, resolved(cm, ch, ps, to))
}

/// A listener and an active id with a QP (UD on a UD port space, else RC) that
/// connected to it without private data; returns the active id and the listener's
/// CONNECT_REQUEST.
fn requested(env: &Env, cm: &Cm, ch: CmChannelId, ps: PortSpace) -> (CmId, CmEvent) {
    let (_, a) = ends(env, cm, ch, ps);
    let qp_type = if ps.is_ud() { QpType::Ud } else { QpType::Rc };
    cm.create_qp(a, &init(env, qp_type)).unwrap();
    cm.connect(a, &ConnParam::default()).unwrap();
    (a, ev(cm, ch, CmEventType::ConnectRequest))
}

/// A new id of `ps` with its address and route resolved toward `to`.
fn resolved(cm: &Cm, ch: CmChannelId, ps: PortSpace, to: SocketAddr) -> CmId {
    let a = cm.create_id(ch, ps).unwrap();
    cm.resolve_addr(a, None, to, Duration::from_secs(1))
        .unwrap();
    ev(cm, ch, CmEventType::AddrResolved);
    cm.resolve_route(a, Duration::from_secs(1)).unwrap();
    ev(cm, ch, CmEventType::RouteResolved);
    a
}

fn connect_disconnect(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let (l, a) = ends(env, &cm, ch, PortSpace::Tcp);
    let aq = cm.create_qp(a, &init(env, QpType::Rc)).unwrap();
    let pd = b"from the active side".to_vec();
    let param = ConnParam {
        private_data: pd.clone(),
        ..ConnParam::default()
    };
    cm.connect(a, &param).unwrap();
    let req = ev(&cm, ch, CmEventType::ConnectRequest);
    assert_eq!(req.listen_id, Some(l));
    assert_eq!(&req.param.private_data()[..pd.len()], &pd[..]);
    let p = cm.id_info(req.id).unwrap();
    assert_eq!(p.peer.map(|s| s.ip()), Some(ip(env)));
    let pq = cm.create_qp(req.id, &init(env, QpType::Rc)).unwrap();
    cm.accept(req.id, &ConnParam::default()).unwrap();
    let mut both = [
        ev(&cm, ch, CmEventType::Established).id,
        ev(&cm, ch, CmEventType::Established).id,
    ];
    both.sort();
    let mut want = [a, req.id];
    want.sort();
    assert_eq!(both, want);
    assert_eq!(env.dev.query_qp(aq).unwrap().0.qp_state, QpState::Rts);
    assert_eq!(env.dev.query_qp(pq).unwrap().0.qp_state, QpState::Rts);
    assert_eq!(env.dev.query_qp(aq).unwrap().0.dest_qp_num, pq);
    cm.disconnect(a).unwrap();
    assert_eq!(ev(&cm, ch, CmEventType::Disconnected).id, req.id);
    // The passive side answers with rdma_disconnect, which sends the DREP.
    cm.disconnect(req.id).unwrap();
    assert_eq!(ev(&cm, ch, CmEventType::Disconnected).id, a);
    assert_eq!(env.dev.query_qp(aq).unwrap().0.qp_state, QpState::Err);
    assert_eq!(env.dev.query_qp(pq).unwrap().0.qp_state, QpState::Err);
    ev(&cm, ch, CmEventType::TimewaitExit);
    ev(&cm, ch, CmEventType::TimewaitExit);
    Outcome::Pass
}

fn reject(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let (a, req) = requested(env, &cm, ch, PortSpace::Tcp);
    cm.reject(req.id, b"not today").unwrap();
    let e = ev(&cm, ch, CmEventType::Rejected);
    assert_eq!((e.id, e.status), (a, REJECT_CONSUMER));
    assert_eq!(&e.param.private_data()[..9], b"not today");
    Outcome::Pass
}

fn no_listener(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let to = unheard(env, &cm, ch, PortSpace::Tcp);
    let a = resolved(&cm, ch, PortSpace::Tcp, to);
    cm.create_qp(a, &init(env, QpType::Rc)).unwrap();
    cm.connect(a, &ConnParam::default()).unwrap();
    assert_eq!(ev(&cm, ch, CmEventType::Rejected).status, 8);
    Outcome::Pass
}

/// An address no node owns. The emulator's CM probes the address itself, so any
/// address nobody serves will do (TEST-NET-3, IPv6 documentation space). The kernel
/// resolves an address to its next hop's link address, and an off-link address resolves
/// to the default gateway's (correct IP routing; on IPv6 too, where a router advertises
/// one), so on hardware it is an address of the device's own subnet (a /24, a /64 is
/// assumed) that no neighbour answers for (ARP, neighbour discovery).
fn unowned(env: &Env) -> IpAddr {
    match ip(env) {
        IpAddr::V4(_) if env.emulator => IpAddr::V4(Ipv4Addr::new(203, 0, 113, 77)),
        // RFC 3849.
        IpAddr::V6(_) if env.emulator => {
            IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x77))
        }
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            IpAddr::V4(Ipv4Addr::new(a, b, c, if d == 77 { 78 } else { 77 }))
        }
        IpAddr::V6(v6) => {
            let mut s = v6.segments();
            s[7] = if s[7] == 0x77 { 0x78 } else { 0x77 };
            IpAddr::V6(s.into())
        }
    }
}

fn addr_error(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let a = cm.create_id(ch, PortSpace::Tcp).unwrap();
    let to = SocketAddr::from((unowned(env), ANY_PORT));
    cm.resolve_addr(a, None, to, Duration::from_millis(500))
        .unwrap();
    assert_eq!(ev(&cm, ch, CmEventType::AddrError).status, -110);
    Outcome::Pass
}

fn silent_peer(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let faults = env.faults.as_ref().expect("a faulty case runs with faults");
    let ch = cm.create_event_channel().unwrap();
    // The device's own listener, whose CM never hears the REQs.
    let (_, a) = ends(env, &cm, ch, PortSpace::Tcp);
    faults.drop_cm_mads();
    let aq = cm.create_qp(a, &init(env, QpType::Rc)).unwrap();
    cm.connect(a, &ConnParam::default()).unwrap();
    let e = ev(&cm, ch, CmEventType::Unreachable);
    assert_eq!((e.id, e.status), (a, -110));
    // The connection never came up: the QP did not reach RTS.
    assert_ne!(env.dev.query_qp(aq).unwrap().0.qp_state, QpState::Rts);
    Outcome::Pass
}

fn udp_no_listener(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let to = unheard(env, &cm, ch, PortSpace::Udp);
    let a = resolved(&cm, ch, PortSpace::Udp, to);
    cm.create_qp(a, &init(env, QpType::Ud)).unwrap();
    cm.connect(a, &ConnParam::default()).unwrap();
    let e = ev(&cm, ch, CmEventType::Unreachable);
    // IBTA 12.11.2 table 117: SIDR_REP status 1, "service ID not supported".
    assert_eq!((e.id, e.status), (a, 1));
    Outcome::Pass
}

fn udp(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let (a, req) = requested(env, &cm, ch, PortSpace::Udp);
    let pq = cm.create_qp(req.id, &init(env, QpType::Ud)).unwrap();
    cm.accept(req.id, &ConnParam::default()).unwrap();
    let e = ev(&cm, ch, CmEventType::Established);
    let CmEventParam::Ud(ud) = e.param else {
        panic!("{e:?}")
    };
    assert_eq!((e.id, ud.qp_num, ud.qkey), (a, pq, RDMA_UDP_QKEY));
    assert_eq!(env.dev.query_qp(pq).unwrap().0.qkey, RDMA_UDP_QKEY);
    Outcome::Pass
}

/// `n` bytes of private data that differ from their neighbours' (and from zero
/// padding).
fn pattern(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(1))
        .collect()
}

fn udp_private_data_limits(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let (_, a) = ends(env, &cm, ch, PortSpace::Udp);
    cm.create_qp(a, &init(env, QpType::Ud)).unwrap();
    let data = pattern(181);
    let too_long = ConnParam {
        private_data: data.clone(),
        ..ConnParam::default()
    };
    assert_errno(cm.connect(a, &too_long), EINVAL);
    // The failed connect left the id as it was: it connects with 180 bytes.
    let most = ConnParam {
        private_data: data[..180].to_vec(),
        ..ConnParam::default()
    };
    cm.connect(a, &most).unwrap();
    let req = ev(&cm, ch, CmEventType::ConnectRequest);
    assert_eq!(req.param.private_data(), &data[..180]);
    cm.create_qp(req.id, &init(env, QpType::Ud)).unwrap();
    let reply = pattern(136);
    let accept = ConnParam {
        private_data: reply.clone(),
        ..ConnParam::default()
    };
    cm.accept(req.id, &accept).unwrap();
    let e = ev(&cm, ch, CmEventType::Established);
    assert_eq!(e.id, a);
    assert_eq!(e.param.private_data(), &reply[..]);
    Outcome::Pass
}

fn udp_reject_private_data(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let (a, req) = requested(env, &cm, ch, PortSpace::Udp);
    let data = pattern(137);
    // A REJ's 148 bytes would fit; a SIDR_REP's 136 do not.
    assert_errno(cm.reject(req.id, &data), EINVAL);
    cm.reject(req.id, &data[..136]).unwrap();
    let e = ev(&cm, ch, CmEventType::Unreachable);
    // IBTA 12.11.2 table 117: SIDR_REP status 2, "rejected".
    assert_eq!((e.id, e.status), (a, 2));
    assert_eq!(e.param.private_data(), &data[..136]);
    Outcome::Pass
}

fn accept_too_long(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let (a, req) = requested(env, &cm, ch, PortSpace::Tcp);
    let pq = cm.create_qp(req.id, &init(env, QpType::Rc)).unwrap();
    let long = ConnParam {
        private_data: pattern(197),
        ..ConnParam::default()
    };
    assert_errno(cm.accept(req.id, &long), EINVAL);
    let e = ev(&cm, ch, CmEventType::Rejected);
    assert_eq!((e.id, e.status), (a, REJECT_CONSUMER));
    assert_eq!(env.dev.query_qp(pq).unwrap().0.qp_state, QpState::Err);
    let (u, req) = requested(env, &cm, ch, PortSpace::Udp);
    cm.create_qp(req.id, &init(env, QpType::Ud)).unwrap();
    let long = ConnParam {
        private_data: pattern(137),
        ..ConnParam::default()
    };
    assert_errno(cm.accept(req.id, &long), EINVAL);
    let e = ev(&cm, ch, CmEventType::Unreachable);
    assert_eq!((e.id, e.status), (u, 2));
    Outcome::Pass
}

fn wrong_calls(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let a = cm.create_id(ch, PortSpace::Tcp).unwrap();
    assert_errno(cm.connect(a, &ConnParam::default()), EINVAL);
    let at = bind_any(env, &cm, a);
    let b = cm.create_id(ch, PortSpace::Tcp).unwrap();
    assert_errno(cm.bind_addr(b, at), 98);
    assert_errno(cm.destroy_event_channel(ch), EBUSY);
    let (_, c) = ends(env, &cm, ch, PortSpace::Tcp);
    cm.create_qp(c, &init(env, QpType::Rc)).unwrap();
    let long = ConnParam {
        private_data: vec![1; 57],
        ..ConnParam::default()
    };
    assert_errno(cm.connect(c, &long), EINVAL);
    Outcome::Pass
}

fn multicast(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let id = cm.create_id(ch, PortSpace::Udp).unwrap();
    bind_any(env, &cm, id);
    cm.create_qp(id, &init(env, QpType::Ud)).unwrap();
    let group = SocketAddr::from((env.mcast_ip(Ipv4Addr::new(239, 7, 4, 1)), 0));
    match cm.join_multicast(id, group) {
        Err(verbs_api::Error::Unsupported(why)) => return Outcome::Skip(why.into()),
        r => r.unwrap(),
    }
    let e = ev(&cm, ch, CmEventType::MulticastJoin);
    let CmEventParam::Ud(ud) = e.param else {
        panic!("{e:?}")
    };
    assert_eq!((e.id, ud.qp_num, ud.qkey), (id, 0xFF_FFFF, RDMA_UDP_QKEY));
    assert_eq!(
        ud.ah_attr.grh.dgid,
        env.mcast_gid(Ipv4Addr::new(239, 7, 4, 1))
    );
    assert_errno(
        cm.join_multicast(id, SocketAddr::from((ip(env), 0))),
        EINVAL,
    );
    cm.leave_multicast(id, group).unwrap();
    assert_errno(cm.leave_multicast(id, group), 99);
    Outcome::Pass
}

fn addr_change(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let faults = env.faults.as_ref().expect("a faulty case runs with faults");
    let ch = cm.create_event_channel().unwrap();
    let (l, a) = ends(env, &cm, ch, PortSpace::Tcp);
    // The address leaves the port: every GID entry that holds it.
    let addr = env.dev.query_gid(1, u32::from(env.gid_index)).unwrap();
    let len = env.dev.query_port(1).unwrap().gid_tbl_len;
    for i in 0..len {
        if env.dev.query_gid(1, i).is_ok_and(|g| g == addr) {
            faults.set_gid(i, Gid::ZERO);
        }
    }
    let mut got = [0u8; 2].map(|_| {
        let e = ev(&cm, ch, CmEventType::AddrChange);
        assert_eq!(e.status, 0);
        e.id
    });
    got.sort();
    let mut want = [l, a];
    want.sort();
    assert_eq!(got, want);
    // The ids are not destroyed.
    assert!(cm.id_info(a).is_ok());
    cm.destroy_id(a).unwrap();
    cm.destroy_id(l).unwrap();
    Outcome::Pass
}

fn device_removal(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let faults = env.faults.as_ref().expect("a faulty case runs with faults");
    let ch = cm.create_event_channel().unwrap();
    let (l, a) = ends(env, &cm, ch, PortSpace::Tcp);
    faults.fail_device();
    let mut got = [0u8; 2].map(|_| ev(&cm, ch, CmEventType::DeviceRemoval).id);
    got.sort();
    let mut want = [l, a];
    want.sort();
    assert_eq!(got, want);
    cm.destroy_id(a).unwrap();
    cm.destroy_id(l).unwrap();
    Outcome::Pass
}

fn route_error(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let faults = env.faults.as_ref().expect("a faulty case runs with faults");
    let ch = cm.create_event_channel().unwrap();
    let to = unheard(env, &cm, ch, PortSpace::Tcp);
    let a = cm.create_id(ch, PortSpace::Tcp).unwrap();
    cm.resolve_addr(a, None, to, Duration::from_secs(1))
        .unwrap();
    ev(&cm, ch, CmEventType::AddrResolved);
    faults.port_down();
    cm.resolve_route(a, Duration::from_secs(1)).unwrap();
    let e = ev(&cm, ch, CmEventType::RouteError);
    assert_eq!((e.id, e.status), (a, -101)); // -ENETUNREACH
    faults.port_up();
    cm.resolve_route(a, Duration::from_secs(1)).unwrap();
    ev(&cm, ch, CmEventType::RouteResolved);
    Outcome::Pass
}

fn connect_response(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let (_l, a) = ends(env, &cm, ch, PortSpace::Tcp);
    // The QP is the application's own, named by number.
    let qpn = env.dev.create_qp(&init(env, QpType::Rc)).unwrap();
    cm.connect(
        a,
        &ConnParam {
            qp_num: qpn,
            ..ConnParam::default()
        },
    )
    .unwrap();
    let req = ev(&cm, ch, CmEventType::ConnectRequest);
    let pq = cm.create_qp(req.id, &init(env, QpType::Rc)).unwrap();
    cm.accept(req.id, &ConnParam::default()).unwrap();
    let e = ev(&cm, ch, CmEventType::ConnectResponse);
    assert_eq!(e.id, a);
    let CmEventParam::Conn(p) = &e.param else {
        panic!("{e:?}")
    };
    assert_eq!(p.qp_num, pq);
    cm.establish(a).unwrap();
    assert_eq!(ev(&cm, ch, CmEventType::Established).id, req.id);
    Outcome::Pass
}

fn connect_error(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let ch = cm.create_event_channel().unwrap();
    let (_l, a) = ends(env, &cm, ch, PortSpace::Tcp);
    let aq = cm.create_qp(a, &init(env, QpType::Rc)).unwrap();
    cm.connect(a, &ConnParam::default()).unwrap();
    // Behind the CM's back the QP goes to ERROR, from which INIT is not a transition
    // (IBTA 10.3.1): the REP cannot be used.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    env.dev.modify_qp(aq, &err, QpAttrMask::STATE).unwrap();
    let req = ev(&cm, ch, CmEventType::ConnectRequest);
    cm.create_qp(req.id, &init(env, QpType::Rc)).unwrap();
    cm.accept(req.id, &ConnParam::default()).unwrap();
    let e = ev(&cm, ch, CmEventType::ConnectError);
    assert_eq!(e.id, a, "{e:?}");
    assert!(e.status < 0, "{e:?}");
    assert_eq!(env.dev.query_qp(aq).unwrap().0.qp_state, QpState::Err);
    cm.destroy_qp(a).unwrap();
    cm.destroy_id(a).unwrap();
    let e = ev(&cm, ch, CmEventType::Rejected);
    assert_eq!((e.id, e.status), (req.id, REJECT_CONSUMER));
    Outcome::Pass
}

fn multicast_error(env: &Env) -> Outcome {
    let cm = cm_or_skip!(env);
    let n = env.dev.query_device().unwrap().max_mcast_qp_attach as usize;
    if n == 0 || n > 1024 {
        return Outcome::Skip(format!("max_mcast_qp_attach is {n}"));
    }
    let ch = cm.create_event_channel().unwrap();
    let group = SocketAddr::from((env.mcast_ip(Ipv4Addr::new(239, 7, 4, 30)), 0));
    let mut ids = Vec::new();
    for _ in 0..=n {
        let id = cm.create_id(ch, PortSpace::Udp).unwrap();
        cm.bind_addr(id, SocketAddr::from((ip(env), 0))).unwrap();
        cm.create_qp(id, &init(env, QpType::Ud)).unwrap();
        match cm.join_multicast(id, group) {
            Err(verbs_api::Error::Unsupported(why)) => return Outcome::Skip(why.into()),
            r => r.unwrap(),
        }
        ids.push(id);
    }
    // The first n joins attach their QPs; the one past the limit cannot.
    for _ in 0..n {
        ev(&cm, ch, CmEventType::MulticastJoin);
    }
    let e = ev(&cm, ch, CmEventType::MulticastError);
    assert!(e.status < 0, "{e:?}");
    let CmEventParam::Ud(ud) = &e.param else {
        panic!("{e:?}")
    };
    assert_eq!(
        ud.ah_attr.grh.dgid,
        env.mcast_gid(Ipv4Addr::new(239, 7, 4, 30))
    );
    let failed = e.id;
    for id in ids {
        if id != failed {
            cm.leave_multicast(id, group).unwrap();
        }
        cm.destroy_qp(id).unwrap();
        cm.destroy_id(id).unwrap();
    }
    Outcome::Pass
}
