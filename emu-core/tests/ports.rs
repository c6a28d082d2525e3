//! The port model and the management operations (manual 6.1.9-6.1.19): port state,
//! GID/P_Key/LID/SM changes, device failure and SRQ failure, each event checked with
//! the element it is affiliated with, and the WC statuses faults produce (`FATAL_ERR`,
//! `REM_ABORT_ERR`).

mod util;

use std::time::Duration;

use emu_core::engine::{Engine, EIO};
use emu_wire::Opcode;
use util::*;
use verbs_api::{
    AsyncEvent, AsyncEventType, EventElement, Gid, PortState, QpState, WcOpcode, WcStatus,
};

fn ev(event_type: AsyncEventType, element: EventElement) -> AsyncEvent {
    AsyncEvent {
        event_type,
        element,
    }
}

fn port_ev(t: AsyncEventType) -> AsyncEvent {
    ev(t, EventElement::Port(1))
}

fn drain_events(e: &mut Engine) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

#[test]
fn port_down_loses_every_packet_and_rc_retries_run_out() {
    let cfg = Config {
        timeout: 8,
        retry_cnt: 2,
        ..Config::default()
    };
    let (mut p, a, b) = connected(cfg);
    b.post_recv(&mut p, 1, 0, 4096);
    p.a.set_port_state(PortState::Down).unwrap();
    assert_eq!(drain_events(&mut p.a), [port_ev(AsyncEventType::PortErr)]);
    assert_eq!(p.a.query_port(1).unwrap().state, PortState::Down);
    a.post_send(&mut p, send(7, a.sge(0, 100)));
    p.drive();
    // Nothing ever left A; its three transmissions (first try + 2 retries) were lost.
    assert!(p.log.is_empty(), "{:?}", p.trace());
    assert_eq!(p.a.counters().tx_port_down, 3);
    let wcs = a.poll(&mut p);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (7, WcStatus::RetryExcErr));
    assert!(b.poll(&mut p).is_empty());
    p.a.set_port_state(PortState::Active).unwrap();
    assert_eq!(
        drain_events(&mut p.a),
        [port_ev(AsyncEventType::PortActive)]
    );
}

#[test]
fn a_receiver_port_that_comes_back_in_time_loses_nothing() {
    let cfg = Config {
        timeout: 8,
        retry_cnt: 7,
        ..Config::default()
    };
    let (mut p, a, b) = connected(cfg);
    b.post_recv(&mut p, 1, 0, 4096);
    a.write_bytes(0, &pattern(3000, 3));
    p.b.set_port_state(PortState::Init).unwrap();
    a.post_send(&mut p, send(7, a.sge(0, 3000)));
    // Two ACK timeouts' worth of virtual time with B deaf.
    p.advance(Duration::from_micros(2500));
    assert!(p.b.counters().rx_port_down >= 3);
    assert!(b.poll(&mut p).is_empty());
    p.b.set_port_state(PortState::Active).unwrap();
    p.drive();
    let wcs = a.poll(&mut p);
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
    let wcs = b.poll(&mut p);
    assert_eq!((wcs[0].status, wcs[0].byte_len), (WcStatus::Success, 3000));
    assert_eq!(b.read_bytes(0, 3000), pattern(3000, 3));
    assert_eq!(
        drain_events(&mut p.b),
        [
            port_ev(AsyncEventType::PortErr),
            port_ev(AsyncEventType::PortActive)
        ]
    );
}

#[test]
fn tables_lid_and_sm_changes_raise_port_events_and_show_in_queries() {
    let mut e = Engine::default();
    e.set_gid(gid(Side::A));
    let own = Gid::from_ipv4([10, 0, 0, 1].into());
    e.set_gid(own);
    // The driver saying where the device lives is not a change.
    assert!(drain_events(&mut e).is_empty());
    let extra = Gid::from_ipv4([10, 0, 1, 1].into());
    e.set_gid_entry(3, extra).unwrap();
    assert_eq!(e.query_gid(1, 3).unwrap(), extra);
    assert_eq!(e.query_gid(1, 0).unwrap(), own);
    e.set_gid_entry(3, Gid::ZERO).unwrap();
    assert_eq!(e.query_gid(1, 3).unwrap(), Gid::ZERO);
    assert_eq!(e.set_gid_entry(16, extra).unwrap_err().errno(), 22);
    assert_eq!(e.query_pkey(1, 0).unwrap(), 0xFFFF);
    e.set_pkey_entry(1, 0x8123).unwrap();
    assert_eq!(e.query_pkey(1, 1).unwrap(), 0x8123);
    assert_eq!(e.query_pkey(1, 64).unwrap_err().errno(), 2);
    e.set_lid(0x17).unwrap();
    e.set_sm(0x01, 3).unwrap();
    e.client_reregister().unwrap();
    let port = e.query_port(1).unwrap();
    assert_eq!((port.lid, port.sm_lid, port.sm_sl), (0x17, 0x01, 3));
    assert!(port
        .cap_flags()
        .contains(verbs_api::PortCapFlags::CLIENT_REG_SUP));
    use AsyncEventType::*;
    assert_eq!(
        drain_events(&mut e),
        [
            GidChange,
            GidChange,
            PkeyChange,
            LidChange,
            SmChange,
            ClientReregister
        ]
        .map(port_ev)
        .to_vec()
    );
    // No change, no event.
    e.set_lid(0x17).unwrap();
    e.set_pkey_entry(1, 0x8123).unwrap();
    assert!(drain_events(&mut e).is_empty());
    assert_eq!(e.query_port(2).unwrap_err().errno(), 22);
}

/// A 3-packet SEND from A to B whose last packet is lost: B holds a receive WQE with
/// a message in progress, A a started send WQE waiting for its ACK.
fn message_in_progress(cfg: Config) -> (Engines, Node, Node) {
    let (mut p, a, b) = connected(cfg);
    if cfg.srq {
        b.post_srq_recv(&mut p, 1, 0, 4096);
        b.post_srq_recv(&mut p, 2, 4096, 4096);
    } else {
        b.post_recv(&mut p, 1, 0, 4096);
        b.post_recv(&mut p, 2, 4096, 4096);
    }
    p.set_rule(|side, repr, _| {
        if side == Side::A && repr.bth.opcode == Opcode::RcSendLast {
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    a.post_send(&mut p, send(10, a.sge(0, 3000)));
    a.post_send(&mut p, send(11, a.sge(0, 10)));
    // Less than one ACK timeout: the message stays half delivered.
    p.advance(Duration::from_micros(100));
    assert!(a.poll(&mut p).is_empty() && b.poll(&mut p).is_empty());
    (p, a, b)
}

#[test]
fn device_failure_is_fatal_for_the_sender_and_aborts_the_receiver() {
    let (mut p, a, b) = message_in_progress(Config::default());
    let now = p.now;
    p.a.fail_device(now);
    p.b.fail_device(now);
    for (node, e) in [(&a, &mut p.a), (&b, &mut p.b)] {
        assert_eq!(
            drain_events(e),
            [ev(AsyncEventType::DeviceFatal, EventElement::Device)]
        );
        assert_eq!(e.query_qp(node.qpn).unwrap().0.qp_state, QpState::Err);
        assert_eq!(e.check_alive().unwrap_err().errno(), EIO);
        assert_eq!(e.set_lid(3).unwrap_err().errno(), EIO);
        assert_eq!(e.query_port(1).unwrap().state, PortState::Down);
    }
    let wcs = a.poll(&mut p);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, [(10, WcStatus::FatalErr), (11, WcStatus::WrFlushErr)]);
    let wcs = b.poll(&mut p);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::RemAbortErr, WcOpcode::Recv),
            (2, WcStatus::WrFlushErr, WcOpcode::Recv)
        ]
    );
    // A failed device moves no packet: not what A retransmits, not what arrives.
    let sent = p.log.len();
    p.drive();
    assert_eq!(p.log.len(), sent);
    // A second failure changes nothing.
    p.a.fail_device(now);
    assert!(drain_events(&mut p.a).is_empty());
}

#[test]
fn a_user_modify_to_err_flushes_the_message_in_progress() {
    // The contrast with a fault: IBTA 10.3.1, every WQE is flushed.
    let (mut p, _a, b) = message_in_progress(Config::default());
    let now = p.now;
    let attr = verbs_api::QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    p.b.modify_qp(now, b.qpn, &attr, verbs_api::QpAttrMask::STATE)
        .unwrap();
    let st: Vec<_> = b.poll(&mut p).iter().map(|w| w.status).collect();
    assert_eq!(st, [WcStatus::WrFlushErr, WcStatus::WrFlushErr]);
}

#[test]
fn srq_failure_takes_its_qps_to_err_with_qp_fatal() {
    let cfg = Config {
        srq: true,
        ..Config::default()
    };
    let (mut p, _a, b) = message_in_progress(cfg);
    let srq = b.srq.unwrap();
    let now = p.now;
    p.b.fail_srq(now, srq).unwrap();
    assert_eq!(
        drain_events(&mut p.b),
        [
            ev(AsyncEventType::SrqErr, EventElement::Srq(srq.0)),
            ev(AsyncEventType::QpFatal, EventElement::Qp(b.qpn)),
            ev(AsyncEventType::QpLastWqeReached, EventElement::Qp(b.qpn)),
        ]
    );
    assert_eq!(b.state(&mut p), QpState::Err);
    let wcs = b.poll(&mut p);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    // The WQE the message was being placed in is aborted; the one still in the SRQ
    // is not the QP's and stays there.
    assert_eq!(got, [(1, WcStatus::RemAbortErr)]);
    assert_eq!(p.b.srq_len(srq), 1);
    assert_eq!(
        p.b.fail_srq(now, verbs_api::SrqId(999))
            .unwrap_err()
            .errno(),
        22
    );
}

#[test]
fn an_adapter_qp_error_completes_the_wqe_under_way_with_its_status() {
    let (mut p, a, b) = message_in_progress(Config::default());
    let now = p.now;
    for bad in [WcStatus::Success, WcStatus::WrFlushErr] {
        assert_eq!(p.a.fail_qp(now, a.qpn, bad).unwrap_err().errno(), 22);
    }
    assert_eq!(
        p.a.fail_qp(now, 0x00AB_CDEF, WcStatus::GeneralErr)
            .unwrap_err()
            .errno(),
        22
    );
    p.a.fail_qp(now, a.qpn, WcStatus::GeneralErr).unwrap();
    // A completion error, not a catastrophe: no async event (IBTA 10.8).
    assert!(drain_events(&mut p.a).is_empty());
    assert_eq!(a.state(&mut p), QpState::Err);
    let got: Vec<_> = a.poll(&mut p).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [(10, WcStatus::GeneralErr), (11, WcStatus::WrFlushErr)]
    );
    // On a QP already in ERR it does nothing; the peer is untouched.
    p.a.fail_qp(now, a.qpn, WcStatus::RespTimeoutErr).unwrap();
    assert!(a.poll(&mut p).is_empty());
    assert_eq!(b.state(&mut p), QpState::Rts);
}

/// The GID table: entries 0 and 1 both hold the device's address (programs written
/// for kernel rxe, whose index 1 is the IPv4 address, and programs that use index 0
/// both reach it); an empty entry named as a source GID is ENODATA, as the kernel
/// refuses it, in `create_ah` and in `modify_qp`.
#[test]
fn gid_indices_0_and_1_are_the_address_and_empty_ones_are_enodata() {
    let (mut p, a, _b) = connected(Config::default());
    let e = p.engine(a.side);
    let g0 = e.query_gid(1, 0).unwrap();
    assert_ne!(g0, Gid::ZERO);
    assert_eq!(e.query_gid(1, 1).unwrap(), g0);
    assert_eq!(e.query_gid(1, 2).unwrap(), Gid::ZERO);
    let pd = e.alloc_pd().unwrap();
    let mut ah = ah_attr_to(g0);
    ah.grh.sgid_index = 1;
    assert!(e.create_ah(pd, &ah).is_ok());
    ah.grh.sgid_index = 2;
    assert_eq!(e.create_ah(pd, &ah).unwrap_err().errno(), 61);
}
