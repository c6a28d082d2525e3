//! Alternate paths and path migration (IBTA 17.2.8; manual 6.1.7, 6.1.8, 8.1) on the
//! two-engine harness: automatic migration when the primary path stops carrying
//! packets, explicit migration, and the two ways migration fails (`PATH_MIG_ERR`).

mod util;

use std::cell::Cell;
use std::rc::Rc;

use util::*;
use verbs_api::QpAttrMask as M;
use verbs_api::{
    AhAttr, AsyncEvent, AsyncEventType, EventElement, Gid, GlobalRoute, MigState, QpAttr, QpState,
    WcStatus,
};

fn av(dgid: Gid, sgid_index: u8) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            dgid,
            sgid_index,
            hop_limit: 64,
            ..GlobalRoute::default()
        },
        is_global: true,
        port_num: 1,
        ..AhAttr::default()
    }
}

/// RTS -> RTS loading an alternate path through `sgid_index` to `dgid`, asking for
/// `mig`.
fn load_alt(
    p: &mut Engines,
    node: &Node,
    dgid: Gid,
    sgid_index: u8,
    mig: MigState,
) -> verbs_api::Result<()> {
    let attr = QpAttr {
        alt_ah_attr: av(dgid, sgid_index),
        alt_port_num: 1,
        alt_timeout: 9,
        path_mig_state: mig,
        ..QpAttr::default()
    };
    let now = p.now;
    p.engine(node.side)
        .modify_qp(now, node.qpn, &attr, M::ALT_PATH | M::PATH_MIG_STATE)
}

fn qp_events(p: &mut Engines, node: &Node) -> Vec<AsyncEventType> {
    node.events(p)
        .into_iter()
        .map(|e: AsyncEvent| {
            assert_eq!(e.element, EventElement::Qp(node.qpn));
            e.event_type
        })
        .collect()
}

fn connected_with_gids(cfg: Config) -> (Engines, Node, Node) {
    let (mut p, a, b) = connected(cfg);
    p.a.set_gid(gid(Side::A));
    p.b.set_gid(gid(Side::B));
    (p, a, b)
}

#[test]
fn retry_exhaustion_on_the_primary_path_migrates_to_the_armed_alternate() {
    let cfg = Config {
        timeout: 8,
        retry_cnt: 1,
        ..Config::default()
    };
    let (mut p, a, b) = connected_with_gids(cfg);
    load_alt(&mut p, &a, gid(Side::B), 0, MigState::Armed).unwrap();
    assert_eq!(
        p.a.query_qp(a.qpn).unwrap().0.path_mig_state,
        MigState::Armed
    );
    // The primary path carries nothing until the migration: the first transmission
    // and the one retry are lost.
    let lost = Rc::new(Cell::new(0));
    let l = lost.clone();
    p.set_rule(move |side, _, _| {
        if side == Side::A && l.get() < 2 {
            l.set(l.get() + 1);
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    b.post_recv(&mut p, 1, 0, 4096);
    a.post_send(&mut p, send(5, a.sge(0, 64)));
    p.drive();
    assert_eq!(lost.get(), 2);
    let wcs = a.poll(&mut p);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (5, WcStatus::Success));
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(qp_events(&mut p, &a), [AsyncEventType::PathMig]);
    let attr = p.a.query_qp(a.qpn).unwrap().0;
    assert_eq!(attr.path_mig_state, MigState::Migrated);
    assert_eq!(
        attr.timeout, 9,
        "the alternate path's timeout is now the QP's"
    );
    // Migrated: nothing is armed, so the next failure is a failure.
    p.set_rule(|side, _, _| {
        if side == Side::A {
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    a.post_send(&mut p, send(6, a.sge(0, 64)));
    p.drive();
    let wcs = a.poll(&mut p);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (6, WcStatus::RetryExcErr));
}

#[test]
fn without_an_armed_alternate_retry_exhaustion_fails_the_wqe() {
    let cfg = Config {
        timeout: 8,
        retry_cnt: 1,
        ..Config::default()
    };
    let (mut p, a, _b) = connected_with_gids(cfg);
    // Loaded but not armed.
    let attr = QpAttr {
        alt_ah_attr: av(gid(Side::B), 0),
        alt_port_num: 1,
        ..QpAttr::default()
    };
    let now = p.now;
    p.a.modify_qp(now, a.qpn, &attr, M::ALT_PATH).unwrap();
    p.set_rule(|_, _, _| Action::Drop);
    a.post_send(&mut p, send(5, a.sge(0, 64)));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RetryExcErr);
    assert!(qp_events(&mut p, &a).is_empty());
}

#[test]
fn explicit_migration_switches_paths_and_raises_path_mig() {
    let (mut p, a, b) = connected_with_gids(Config::default());
    let extra = Gid::from_ipv4([10, 0, 1, 1].into());
    p.a.set_gid_entry(2, extra).unwrap();
    a.events(&mut p);
    load_alt(&mut p, &a, gid(Side::B), 2, MigState::Rearm).unwrap();
    assert_eq!(
        p.a.query_qp(a.qpn).unwrap().0.path_mig_state,
        MigState::Armed
    );
    let attr = QpAttr {
        path_mig_state: MigState::Migrated,
        ..QpAttr::default()
    };
    let now = p.now;
    p.a.modify_qp(now, a.qpn, &attr, M::PATH_MIG_STATE).unwrap();
    assert_eq!(qp_events(&mut p, &a), [AsyncEventType::PathMig]);
    let q = p.a.query_qp(a.qpn).unwrap().0;
    assert_eq!(q.ah_attr.grh.sgid_index, 2);
    assert_eq!(q.path_mig_state, MigState::Migrated);
    // Traffic goes on over the new path.
    b.post_recv(&mut p, 1, 0, 64);
    a.post_send(&mut p, send(1, a.sge(0, 64)));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
}

#[test]
fn an_alternate_path_through_an_empty_gid_entry_cannot_be_armed() {
    let (mut p, a, _b) = connected_with_gids(Config::default());
    load_alt(&mut p, &a, gid(Side::B), 5, MigState::Armed).unwrap();
    assert_eq!(qp_events(&mut p, &a), [AsyncEventType::PathMigErr]);
    assert_eq!(
        p.a.query_qp(a.qpn).unwrap().0.path_mig_state,
        MigState::Rearm
    );
}

#[test]
fn migration_to_an_alternate_whose_gid_was_removed_fails() {
    let cfg = Config {
        timeout: 8,
        retry_cnt: 1,
        ..Config::default()
    };
    let (mut p, a, _b) = connected_with_gids(cfg);
    let extra = Gid::from_ipv4([10, 0, 1, 1].into());
    p.a.set_gid_entry(2, extra).unwrap();
    load_alt(&mut p, &a, gid(Side::B), 2, MigState::Armed).unwrap();
    p.a.set_gid_entry(2, Gid::ZERO).unwrap();
    a.events(&mut p);
    p.set_rule(|_, _, _| Action::Drop);
    a.post_send(&mut p, send(5, a.sge(0, 64)));
    p.drive();
    assert_eq!(qp_events(&mut p, &a), [AsyncEventType::PathMigErr]);
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RetryExcErr);
    assert_eq!(a.state(&mut p), QpState::Err);
}

#[test]
fn bad_alternate_paths_and_arming_without_one_are_einval() {
    let (mut p, a, _b) = connected_with_gids(Config::default());
    let now = p.now;
    let arm = QpAttr {
        path_mig_state: MigState::Armed,
        ..QpAttr::default()
    };
    let e =
        p.a.modify_qp(now, a.qpn, &arm, M::PATH_MIG_STATE)
            .unwrap_err();
    assert_eq!(e.errno(), 22);
    let mut bad = QpAttr {
        alt_ah_attr: av(gid(Side::B), 0),
        alt_port_num: 2,
        ..QpAttr::default()
    };
    assert_eq!(
        p.a.modify_qp(now, a.qpn, &bad, M::ALT_PATH)
            .unwrap_err()
            .errno(),
        22
    );
    bad.alt_port_num = 1;
    bad.alt_ah_attr.is_global = false;
    assert_eq!(
        p.a.modify_qp(now, a.qpn, &bad, M::ALT_PATH)
            .unwrap_err()
            .errno(),
        22
    );
    bad.alt_ah_attr = av(gid(Side::B), 16);
    assert_eq!(
        p.a.modify_qp(now, a.qpn, &bad, M::ALT_PATH)
            .unwrap_err()
            .errno(),
        22
    );
    bad.alt_ah_attr = av(gid(Side::B), 0);
    bad.alt_timeout = 32;
    assert_eq!(
        p.a.modify_qp(now, a.qpn, &bad, M::ALT_PATH)
            .unwrap_err()
            .errno(),
        22
    );
    // Nothing changed.
    assert_eq!(
        p.a.query_qp(a.qpn).unwrap().0.path_mig_state,
        MigState::Migrated
    );
}

/// IBTA 17.2.8: with an armed alternate path, a packet arriving over it (from the
/// alternate destination) moves the responder to that path: `PATH_MIG`, the alternate
/// becomes the primary, and the answers go the new way.
#[test]
fn a_packet_over_the_armed_alternate_migrates_the_responder() {
    let (mut p, a, b) = connected_with_gids(Config::default());
    let a2 = Gid::from_ipv4([10, 0, 1, 1].into());
    load_alt(&mut p, &b, a2, 0, MigState::Armed).unwrap();
    assert!(qp_events(&mut p, &b).is_empty());
    // A's packets now come from its second address (A moved to its own alternate).
    p.set_src(Side::A, a2);
    b.post_recv(&mut p, 1, 0, 64);
    a.post_send(&mut p, send(1, a.sge(0, 64)));
    p.drive();
    assert_eq!(qp_events(&mut p, &b), [AsyncEventType::PathMig]);
    let q = p.b.query_qp(b.qpn).unwrap().0;
    assert_eq!(
        (q.ah_attr.grh.dgid, q.path_mig_state, q.timeout),
        (a2, MigState::Migrated, 9)
    );
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    // Migrated, the responder follows the new path only: the old address is dropped.
    p.set_src(Side::A, gid(Side::A));
    let dropped = p.b.counters().rx_dropped;
    b.post_recv(&mut p, 2, 0, 64);
    a.post_send(&mut p, send(2, a.sge(0, 64)));
    p.drive_for(std::time::Duration::from_millis(1));
    assert!(p.b.counters().rx_dropped > dropped);
    assert!(b.poll(&mut p).is_empty());
}

/// Without an armed alternate, a packet from another address than the QP's peer is not
/// the connection's: dropped and counted, no event, the path unchanged.
#[test]
fn a_packet_from_elsewhere_without_an_armed_alternate_is_dropped() {
    let (mut p, a, b) = connected_with_gids(Config::default());
    let a2 = Gid::from_ipv4([10, 0, 1, 1].into());
    p.set_src(Side::A, a2);
    b.post_recv(&mut p, 1, 0, 64);
    a.post_send(&mut p, send(1, a.sge(0, 64)));
    p.drive_for(std::time::Duration::from_millis(1));
    assert!(p.b.counters().rx_dropped > 0);
    assert!(b.poll(&mut p).is_empty());
    assert!(qp_events(&mut p, &b).is_empty());
    let q = p.b.query_qp(b.qpn).unwrap().0;
    assert_eq!(q.ah_attr.grh.dgid, gid(Side::A));
}
