//! Partitions (IBTA 9.6.1.1, 10.9): a QP sends with the P_Key its P_Key index names in
//! the port's table, and drops, counting `bad_pkey_cntr`, a packet whose P_Key does not
//! match its own; two limited members of a partition cannot talk, a full and a limited
//! member can.

mod util;

use std::cell::RefCell;
use std::rc::Rc;

use util::*;
use verbs_api::WcStatus;

/// One SEND from A to B with the given P_Key table entry 0 on each side: the status of
/// A's completion, whether B received it, B's bad P_Key count and the P_Keys seen on
/// the wire from each side.
fn exchange(key_a: u16, key_b: u16) -> (WcStatus, bool, u32, Vec<(Side, u16)>) {
    let cfg = Config {
        timeout: 8,
        retry_cnt: 1,
        ..Config::default()
    };
    let (mut p, a, b) = connected(cfg);
    p.a.set_pkey_entry(0, key_a).unwrap();
    p.b.set_pkey_entry(0, key_b).unwrap();
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s = seen.clone();
    p.set_rule(move |side, repr, _| {
        s.borrow_mut().push((side, repr.bth.pkey));
        Action::Deliver
    });
    b.post_recv(&mut p, 1, 0, 4096);
    a.post_send(&mut p, send(7, a.sge(0, 64)));
    p.drive();
    let status = a.poll(&mut p)[0].status;
    let received = !b.poll(&mut p).is_empty();
    let bad = p.b.query_port(1).unwrap().bad_pkey_cntr;
    let seen = seen.borrow().clone();
    (status, received, bad, seen)
}

#[test]
fn packets_carry_the_qps_p_key_and_a_full_member_talks_to_a_limited_one() {
    let (status, received, bad, seen) = exchange(0x8005, 0x0005);
    assert_eq!((status, received, bad), (WcStatus::Success, true, 0));
    assert!(seen.contains(&(Side::A, 0x8005)) && seen.contains(&(Side::B, 0x0005)));
    assert!(seen
        .iter()
        .all(|&(side, k)| k == if side == Side::A { 0x8005 } else { 0x0005 }));
}

#[test]
fn another_partition_is_dropped_and_counted() {
    let (status, received, bad, seen) = exchange(0x8005, 0x8006);
    // Both transmissions (first and one retry) reach B and are dropped there.
    assert_eq!((status, received, bad), (WcStatus::RetryExcErr, false, 2));
    assert!(seen.iter().all(|&(side, _)| side == Side::A), "{seen:?}");
}

#[test]
fn two_limited_members_cannot_talk() {
    let (status, received, bad, _) = exchange(0x0005, 0x0005);
    assert_eq!((status, received, bad), (WcStatus::RetryExcErr, false, 2));
}

#[test]
fn ud_datagrams_of_another_partition_are_dropped_and_counted() {
    const QKEY: u32 = 0x1111_0000;
    let (mut p, a, b) = ud_pair(ud_config(), QKEY);
    let ah = a.create_ah(&mut p, gid(Side::B));
    p.b.set_pkey_entry(0, 0x8006).unwrap();
    b.post_recv(&mut p, 1, 0, 1024);
    a.post_send(&mut p, ud_send(1, vec![a.sge(0, 8)], ah, b.qpn, QKEY));
    p.drive();
    // UD has no acknowledgement: the sender's WR succeeds, the datagram is lost.
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert!(b.poll(&mut p).is_empty());
    assert_eq!(p.b.query_port(1).unwrap().bad_pkey_cntr, 1);
    // Back in A's partition (a limited member talking to A's full member): delivered.
    p.b.set_pkey_entry(0, 0x7FFF).unwrap();
    a.post_send(&mut p, ud_send(2, vec![a.sge(0, 8)], ah, b.qpn, QKEY));
    p.drive();
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(p.b.query_port(1).unwrap().bad_pkey_cntr, 1);
}
