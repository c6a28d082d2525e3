//! Ports, management and faults (manual 6.1.7-6.1.19, 6.2.17, 6.2.20; IBTA 17.2.8):
//! what a subnet manager, a cable or a hardware fault does to a device, driven through
//! the backend's fault injection ([`crate::Faults`]), so these cases run on the emulator
//! and are skipped on hardware.

use std::time::Duration;

use verbs_api::{
    AhAttr, AsyncEvent, AsyncEventType as E, EventElement, Gid, GlobalRoute, MigState,
    PortCapFlags, PortState, QpAttr, QpAttrMask as M, QpState, QpType, RecvWr, SendWr, SrqAttr,
    WcStatus, WrOperation,
};

use super::assert_errno;
use crate::{Case, Env, Outcome};

/// EIO, what libibverbs returns for verbs on a device after a fatal error.
const EIO: i32 = 5;

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("ports::port_err_and_port_active", "manual 6.1.10, 6.1.11: a port leaving ACTIVE raises PORT_ERR, one entering it PORT_ACTIVE (the device sets IBV_DEVICE_PORT_ACTIVE_EVENT); ibv_query_port shows the state", port_events).link_faulty().event(E::PortErr).event(E::PortActive));
    v.push(Case::new("ports::port_down_rc_retries_run_out", "manual 6.1.11: a port that is down carries no packet; QPs are not otherwise affected, but an RC send exhausts its retry count (IBTA 9.7.6.1.3)", port_down_retries).faulty().wc(WcStatus::RetryExcErr).event(E::PortErr));
    v.push(Case::new("ports::gid_change", "manual 6.1.19: a change of the port's GID table raises GID_CHANGE; ibv_query_gid shows the new entry", gid_change).faulty().event(E::GidChange));
    v.push(Case::new("ports::pkey_change", "manual 6.1.13: a change of the port's P_Key table raises PKEY_CHANGE; ibv_query_pkey shows the new entry", pkey_change).faulty().event(E::PkeyChange));
    v.push(Case::new("ports::lid_change", "manual 6.1.12: the SM changing the port's LID raises LID_CHANGE; ibv_query_port shows it", lid_change).faulty().event(E::LidChange));
    v.push(
        Case::new(
            "ports::sm_change",
            "manual 6.1.14: a new SM on the port raises SM_CHANGE; ibv_query_port shows its LID",
            sm_change,
        )
        .faulty()
        .event(E::SmChange),
    );
    v.push(Case::new("ports::client_reregister", "manual 6.1.18: an SM reregistration request raises CLIENT_REREGISTER on a port with IBV_PORT_CLIENT_REG_SUP", client_rereg).faulty().event(E::ClientReregister));
    v.push(Case::new("ports::device_fatal", "manual 6.1.9, 6.2.20, 6.2.17: a catastrophic device error raises DEVICE_FATAL; the send in progress completes with FATAL_ERR, the receive a message was being placed in with REM_ABORT_ERR; later verbs fail with EIO", device_fatal).faulty().event(E::DeviceFatal).wc(WcStatus::FatalErr).wc(WcStatus::RemAbortErr));
    v.push(
        Case::new(
            "ports::srq_err",
            "manual 6.1.15: an SRQ error raises SRQ_ERR; its QPs go to ERR with QP_FATAL",
            srq_err,
        )
        .faulty()
        .event(E::SrqErr)
        .event(E::QpFatal),
    );
    v.push(Case::new("ports::explicit_path_migration", "IBTA 17.2.8, manual 6.1.7 and 8.1: with an armed alternate path, setting path_mig_state MIGRATED moves the QP to it and raises PATH_MIG; traffic goes on", explicit_migration).faulty().event(E::PathMig));
    v.push(Case::new("ports::path_migration_error", "IBTA 17.2.8, manual 6.1.8: an alternate path whose source GID was removed cannot be migrated to: PATH_MIG_ERR, the QP stays on its path", migration_error).faulty().event(E::PathMigErr));
}

fn port_event(t: E) -> AsyncEvent {
    AsyncEvent {
        event_type: t,
        element: EventElement::Port(1),
    }
}

fn port_state(env: &Env) -> PortState {
    env.dev.query_port(1).expect("query_port").state
}

/// The next async event that is not a GID_CHANGE: on RoCE the GID table follows the
/// port's network interface, whose addresses (its IPv6 link-local one) may go and come
/// back with the link (manual 6.1.19), as on rxe.
fn next_event_but_gid_change(env: &Env) -> AsyncEvent {
    loop {
        let e = env.next_event();
        if e.event_type != E::GidChange {
            return e;
        }
    }
}

fn port_events(env: &Env) -> Outcome {
    assert_eq!(port_state(env), PortState::Active);
    env.faults().port_down();
    assert_eq!(next_event_but_gid_change(env), port_event(E::PortErr));
    assert_eq!(port_state(env), PortState::Down);
    env.faults().port_up();
    assert_eq!(next_event_but_gid_change(env), port_event(E::PortActive));
    assert_eq!(port_state(env), PortState::Active);
    Outcome::Pass
}

fn port_down_retries(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.post_recv(p.b.qpn, RecvWr::new(1, vec![p.b.sge(0, 64)]));
    env.faults().port_down();
    assert_eq!(env.next_event(), port_event(E::PortErr));
    env.post_send(
        p.a.qpn,
        SendWr::new(7, vec![p.a.sge(0, 64)], WrOperation::Send).signaled(),
    );
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::RetryExcErr));
    env.assert_no_completion(p.b.cq, Duration::from_millis(10));
    Outcome::Pass
}

fn gid_change(env: &Env) -> Outcome {
    let len = env.dev.query_port(1).expect("query_port").gid_tbl_len;
    let index = len - 1;
    let gid = Gid::from_ipv4([198, 51, 100, 7].into());
    env.faults().set_gid(index, gid);
    assert_eq!(env.next_event(), port_event(E::GidChange));
    assert_eq!(env.dev.query_gid(1, index).expect("query_gid"), gid);
    env.faults().set_gid(index, Gid::ZERO);
    assert_eq!(env.next_event(), port_event(E::GidChange));
    assert_eq!(env.dev.query_gid(1, index).expect("query_gid"), Gid::ZERO);
    Outcome::Pass
}

fn pkey_change(env: &Env) -> Outcome {
    env.faults().set_pkey(1, 0x8005);
    assert_eq!(env.next_event(), port_event(E::PkeyChange));
    assert_eq!(env.dev.query_pkey(1, 1).expect("query_pkey"), 0x8005);
    assert_eq!(env.dev.query_pkey(1, 0).expect("query_pkey"), 0xFFFF);
    Outcome::Pass
}

fn lid_change(env: &Env) -> Outcome {
    env.faults().set_lid(0x21);
    assert_eq!(env.next_event(), port_event(E::LidChange));
    assert_eq!(env.dev.query_port(1).expect("query_port").lid, 0x21);
    Outcome::Pass
}

fn sm_change(env: &Env) -> Outcome {
    env.faults().change_sm(0x2);
    assert_eq!(env.next_event(), port_event(E::SmChange));
    assert_eq!(env.dev.query_port(1).expect("query_port").sm_lid, 0x2);
    Outcome::Pass
}

fn client_rereg(env: &Env) -> Outcome {
    let caps = env.dev.query_port(1).expect("query_port").cap_flags();
    assert!(caps.contains(PortCapFlags::CLIENT_REG_SUP));
    env.faults().client_reregister();
    assert_eq!(env.next_event(), port_event(E::ClientReregister));
    Outcome::Pass
}

fn device_fatal(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.faults().drop_send_tails();
    env.post_recv(p.b.qpn, RecvWr::new(1, vec![p.b.sge(0, 8192)]));
    env.post_recv(p.b.qpn, RecvWr::new(2, vec![p.b.sge(8192, 64)]));
    // Two packets at the fast parameters' path MTU: the FIRST arrives, the LAST is lost.
    env.post_send(
        p.a.qpn,
        SendWr::new(9, vec![p.a.sge(0, 5000)], WrOperation::Send).signaled(),
    );
    // A few empty polls (each moves a virtual-time fabric one step; the first
    // delivers the FIRST packet), far less than the retry budget: the message is under
    // way at both ends.
    let mut out = Vec::new();
    for _ in 0..3 {
        env.dev.poll_cq(p.b.cq, 1, &mut out).expect("poll_cq");
    }
    assert!(out.is_empty(), "unexpected completion {out:?}");
    env.faults().fail_device();
    assert_eq!(
        env.next_event(),
        AsyncEvent {
            event_type: E::DeviceFatal,
            element: EventElement::Device
        }
    );
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::FatalErr));
    let wc = env.poll_one(p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemAbortErr));
    let wc = env.poll_one(p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
    for qpn in [p.a.qpn, p.b.qpn] {
        let (attr, _) = env.dev.query_qp(qpn).expect("query_qp");
        assert_eq!(attr.qp_state, QpState::Err);
    }
    assert_errno(env.dev.alloc_pd(), EIO);
    assert_errno(env.dev.create_cq(4, None), EIO);
    let r = env.dev.post_send(
        p.a.qpn,
        &[SendWr::new(10, vec![p.a.sge(0, 8)], WrOperation::Send)],
    );
    assert_eq!(
        r.expect_err("post_send after DEVICE_FATAL").error.errno(),
        EIO
    );
    Outcome::Pass
}

fn srq_err(env: &Env) -> Outcome {
    let pd = env.pd();
    let srq = env
        .dev
        .create_srq(
            pd,
            &SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .expect("create_srq");
    let cq = env.cq(16);
    let qpn = env.srq_qp(pd, cq, srq);
    // A QP in RESET is not affected; one in INIT is.
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    env.dev
        .modify_qp(
            qpn,
            &init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )
        .expect("RESET -> INIT");
    env.faults().fail_srq(srq);
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::SrqErr, EventElement::Srq(srq.0))
    );
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::QpFatal, EventElement::Qp(qpn))
    );
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::QpLastWqeReached, EventElement::Qp(qpn))
    );
    assert_eq!(
        env.dev.query_qp(qpn).expect("query_qp").0.qp_state,
        QpState::Err
    );
    Outcome::Pass
}

/// Loads an alternate path to this device through GID index `sgid_index` and arms it.
fn arm_alternate(env: &Env, qpn: u32, sgid_index: u8) {
    let attr = QpAttr {
        alt_ah_attr: AhAttr {
            grh: GlobalRoute {
                dgid: env.gid(),
                sgid_index,
                hop_limit: 64,
                ..GlobalRoute::default()
            },
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        },
        alt_port_num: 1,
        alt_timeout: 12,
        path_mig_state: MigState::Armed,
        ..QpAttr::default()
    };
    env.dev
        .modify_qp(qpn, &attr, M::ALT_PATH | M::PATH_MIG_STATE)
        .expect("load and arm the alternate path");
}

/// A second GID entry (a copy of the one the QPs use) for the alternate path to leave
/// from; returns its index.
fn second_gid(env: &Env) -> u8 {
    let len = env.dev.query_port(1).expect("query_port").gid_tbl_len;
    let index = (len - 1) as u8;
    env.faults().set_gid(u32::from(index), env.gid());
    assert_eq!(env.next_event(), port_event(E::GidChange));
    index
}

fn explicit_migration(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let alt = second_gid(env);
    arm_alternate(env, p.a.qpn, alt);
    let (attr, _) = env.dev.query_qp(p.a.qpn).expect("query_qp");
    assert_eq!(attr.path_mig_state, MigState::Armed);
    let mig = QpAttr {
        path_mig_state: MigState::Migrated,
        ..QpAttr::default()
    };
    env.dev
        .modify_qp(p.a.qpn, &mig, M::PATH_MIG_STATE)
        .expect("migrate");
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::PathMig, EventElement::Qp(p.a.qpn))
    );
    let (attr, _) = env.dev.query_qp(p.a.qpn).expect("query_qp");
    assert_eq!(attr.path_mig_state, MigState::Migrated);
    assert_eq!(attr.ah_attr.grh.sgid_index, alt);
    assert_eq!(attr.timeout, 12);
    env.post_recv(p.b.qpn, RecvWr::new(1, vec![p.b.sge(0, 64)]));
    env.post_send(
        p.a.qpn,
        SendWr::new(2, vec![p.a.sge(0, 64)], WrOperation::Send).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    assert_eq!(env.poll_one(p.b.cq).status, WcStatus::Success);
    Outcome::Pass
}

fn migration_error(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let alt = second_gid(env);
    arm_alternate(env, p.a.qpn, alt);
    env.faults().set_gid(u32::from(alt), Gid::ZERO);
    assert_eq!(env.next_event(), port_event(E::GidChange));
    let mig = QpAttr {
        path_mig_state: MigState::Migrated,
        ..QpAttr::default()
    };
    env.dev
        .modify_qp(p.a.qpn, &mig, M::PATH_MIG_STATE)
        .expect("the migration request itself is valid");
    let ev = env.next_event();
    assert_eq!(
        (ev.event_type, ev.element),
        (E::PathMigErr, EventElement::Qp(p.a.qpn))
    );
    let (attr, _) = env.dev.query_qp(p.a.qpn).expect("query_qp");
    assert_eq!(attr.ah_attr.grh.sgid_index, env.gid_index);
    assert_eq!(attr.qp_state, QpState::Rts);
    Outcome::Pass
}
