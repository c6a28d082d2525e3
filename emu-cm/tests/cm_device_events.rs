//! The connection manager's device events on the simulated fabric (virtual time):
//! what rdma_get_cm_event(3) reports when the device under an id changes.
//! - ADDR_CHANGE: "The network device associated with this ID through address
//!   resolution changed its HW address": the device's address left its GID table.
//! - DEVICE_REMOVAL: "The RDMA device associated with the rdma_cm_id has been
//!   removed": a fatal device error, after which its verbs return EIO.
//! - ROUTE_ERROR: "Resolution of a route failed": the port is DOWN.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use emu_cm::{CmConfig, EmuCm};
use emu_core::nic::EmuDevice;
use emu_sims::Fabric;
use verbs_api::*;

const S: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const C: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);

struct Host {
    dev: Arc<EmuDevice>,
    cm: EmuCm,
    ch: CmChannelId,
}

fn world() -> (Fabric, Host, Host) {
    let fabric = Fabric::new(11);
    let mk = |name: &str, ip| {
        let dev = fabric.add_device(name, ip).unwrap();
        let d: Arc<dyn Device> = dev.clone();
        let cfg = CmConfig {
            response_timeout: 16,
            max_retries: 4,
            ..CmConfig::default()
        };
        let cm = EmuCm::on_fabric(&fabric, vec![d], cfg).unwrap();
        let ch = cm.create_event_channel().unwrap();
        Host { dev, cm, ch }
    };
    let s = mk("server", S);
    let c = mk("client", C);
    (fabric, s, c)
}

fn ev(h: &Host) -> CmEvent {
    h.cm.get_cm_event(h.ch, None).unwrap()
}

/// Nothing is or will be queued (virtual time runs until nothing can happen).
fn quiet(h: &Host) -> bool {
    matches!(
        h.cm.get_cm_event(h.ch, Some(Duration::ZERO)),
        Err(Error::TimedOut)
    )
}

/// A client id with its address resolved toward the server's listener.
fn addr_resolved(s: &Host, c: &Host) -> (CmId, CmId) {
    let l = s.cm.create_id(s.ch, PortSpace::Tcp).unwrap();
    s.cm.bind_addr(l, SocketAddr::from((S, 7000))).unwrap();
    s.cm.listen(l, 0).unwrap();
    let a = c.cm.create_id(c.ch, PortSpace::Tcp).unwrap();
    let to = SocketAddr::from((S, 7000));
    c.cm.resolve_addr(a, None, to, Duration::from_millis(100))
        .unwrap();
    assert_eq!(ev(c).event, CmEventType::AddrResolved);
    (l, a)
}

#[test]
fn a_removed_address_is_addr_change_and_the_id_lives_on() {
    let (f, s, c) = world();
    let (_, a) = addr_resolved(&s, &c);
    // Nothing changed: the CM's tick reports nothing.
    assert!(quiet(&c));
    // The address leaves the device: every GID entry that holds it (0 and 1).
    let set_address = |g: Gid| {
        for i in 0..2 {
            c.dev.management().set_gid(i, g).unwrap();
        }
    };
    set_address(Gid::ZERO);
    let e = ev(&c);
    assert_eq!((e.id, e.event, e.status), (a, CmEventType::AddrChange, 0));
    // Once per change: no second event while the address stays away.
    f.step();
    assert!(quiet(&c));
    // The id is not destroyed: it still resolves its route.
    set_address(Gid::from_ipv4(C));
    c.cm.resolve_route(a, Duration::from_millis(100)).unwrap();
    assert_eq!(ev(&c).event, CmEventType::RouteResolved);
    // The address back, then gone again: a new ADDR_CHANGE.
    set_address(Gid::ZERO);
    assert_eq!(ev(&c).event, CmEventType::AddrChange);
    // The server's id is on another address: it heard nothing.
    assert!(quiet(&s));
}

#[test]
fn a_dead_device_is_device_removal_on_every_id() {
    let (_f, s, c) = world();
    let (l, _) = addr_resolved(&s, &c);
    let other = s.cm.create_id(s.ch, PortSpace::Udp).unwrap();
    s.cm.bind_addr(other, SocketAddr::from((S, 7001))).unwrap();
    let idle = s.cm.create_id(s.ch, PortSpace::Tcp).unwrap();
    s.dev.management().fail_device().unwrap();
    let mut got: Vec<CmId> = (0..2)
        .map(|_| {
            let e = ev(&s);
            assert_eq!((e.event, e.status), (CmEventType::DeviceRemoval, 0));
            e.id
        })
        .collect();
    got.sort();
    assert_eq!(got, vec![l, other]);
    // An id on no device hears nothing; the ids can be destroyed.
    assert!(quiet(&s));
    for id in [l, other, idle] {
        s.cm.destroy_id(id).unwrap();
    }
    // The client's device is fine.
    assert!(quiet(&c));
}

#[test]
fn a_down_port_is_route_error_and_the_route_can_be_tried_again() {
    let (_f, s, c) = world();
    let (_, a) = addr_resolved(&s, &c);
    c.dev.management().port_down().unwrap();
    c.cm.resolve_route(a, Duration::from_millis(100)).unwrap();
    let e = ev(&c);
    assert_eq!(
        (e.id, e.event, e.status),
        (a, CmEventType::RouteError, -101)
    );
    c.dev.management().port_up().unwrap();
    c.cm.resolve_route(a, Duration::from_millis(100)).unwrap();
    assert_eq!(ev(&c).event, CmEventType::RouteResolved);
}
