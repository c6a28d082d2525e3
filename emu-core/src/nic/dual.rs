//! A device on both address families, with a GID table laid out as kernel rxe's.
//!
//! Kernel rxe lists the addresses of its netdev in its port's GID table (RoCE v2 only,
//! one entry an address): first the default GID, the interface's IPv6 link-local
//! address (`fe80::` and the interface identifier its MAC gives by EUI-64), then one
//! entry per address of the interface, an IPv4 one as `::ffff:a.b.c.d`. On a host whose
//! interface has `192.168.77.2`, `GID[0]` is `fe80::5054:ff:fe12:3456` and `GID[1]`
//! `::ffff:192.168.77.2`; an IPv6 address added later comes at index 2.
//!
//! A UDP device on an IPv4 address whose interface also has an IPv6 link-local address
//! (a veth or Ethernet interface; not `lo`, which has none) gets the same table:
//! `[0]` the link-local address, `[1]` its IPv4 address, then the interface's other
//! IPv6 addresses, as found when it opens. Each IPv6 entry is an address the device
//! carries traffic on: it binds a socket of its own (an [`Extra`]) to that address on
//! the device's port (4791, or the configured one), with a thread that receives from
//! it. A packet leaves from the address of its source GID (the QP's or address
//! handle's `sgid_index`, [`crate::engine::Transmit::src`]) through that address's
//! socket, to the destination of its family (an IPv4-mapped GID over IPv4, any other
//! over IPv6, a link-local one scoped to the interface); a destination of the other
//! family has no route from that source, and the packet is not sent.
//!
//! Sharing (`share`): devices in several processes open one IPv4 address as they do
//! today, and each also joins its IPv6 addresses, in the **same slot** as on its IPv4
//! address (the slot is the top bits of its QPNs, by which the members of an address
//! pass datagrams on to each other). An IPv6 address whose slot is another device's
//! (a device that opened only that address) is not taken, and not listed: the table
//! lists only addresses traffic flows on. If the link-local address cannot be taken,
//! the device keeps the table of a device on one family (its address at indices 0
//! and 1).
//!
//! What the extra addresses lack beside the first: an application's empty `poll_cq`
//! and a thread waiting for its completion event receive inline from the first
//! address's socket only (an extra address's datagrams come through its thread, a
//! wake-up later: `ibv_rc_pingpong -g 0` takes about twice the round trip of `-g 1`);
//! multicast groups are joined on the first address's family only; the kernel's drop
//! count (`LinkCounters::rx_overflow`) covers the first address's sockets; the table
//! is read once, when the device opens (rxe follows the interface's addresses as
//! they come and go).
//!
//! An address that does not qualify keeps that table too: an IPv6 device, a device on
//! a loopback address, on an address no interface carries, or in interop mode (whose
//! raw socket reads IPv4 headers only, as a packet hook does). A device opened on port
//! 0 binds its extra addresses on the port its first one got.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use verbs_api::Gid;

use super::interop::LinkOptions;
use super::udp::{DeviceLink, RxBufs, UdpLink};
use super::{share, Inbound, Inner};

/// How long the thread of an extra address sleeps on its socket at most between looks
/// at whether the device closed.
const EXTRA_SLEEP: Duration = Duration::from_millis(10);

/// One more address of a device on both families, part of its link
/// (`udp::DeviceLink`): its socket, receive buffers and share of the address.
#[derive(Debug)]
pub(super) struct Extra {
    /// The address (IPv6).
    pub(super) ip: IpAddr,
    pub(super) udp: UdpLink,
    /// Its receive buffers, as the link has the first address's.
    pub(super) rx: Mutex<RxBufs>,
    /// Its slot of the address (the device's slot on its first address), whose
    /// heartbeat the device thread writes.
    pub(super) member: Mutex<Option<share::Member>>,
}

/// The IPv6 addresses of the interface that carries `ip` that a device on `ip` also
/// takes, the link-local one first; empty unless `ip` qualifies (an IPv4 address, not
/// loopback, on an interface with an IPv6 link-local address).
pub(super) fn candidates(ip: IpAddr) -> Vec<Ipv6Addr> {
    let IpAddr::V4(v4) = ip else {
        return Vec::new();
    };
    if v4.is_loopback() || v4.is_unspecified() || v4.is_multicast() {
        return Vec::new();
    }
    let Some(name) = super::netdev::interface_of(ip) else {
        return Vec::new();
    };
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut v6: Vec<Ipv6Addr> = addrs
        .filter(|a| a.interface_name == name)
        .filter_map(|a| a.address.and_then(|s| s.as_sockaddr_in6().map(|s| s.ip())))
        .filter(|a| !a.is_loopback() && !a.is_multicast() && !a.is_unspecified())
        .collect();
    v6.dedup();
    order(v6)
}

/// The first link-local address first, the others (not link-local) after it in the
/// order given; empty without a link-local address.
fn order(v6: Vec<Ipv6Addr>) -> Vec<Ipv6Addr> {
    let Some(ll) = v6.iter().copied().find(Ipv6Addr::is_unicast_link_local) else {
        return Vec::new();
    };
    std::iter::once(ll)
        .chain(v6.into_iter().filter(|a| !a.is_unicast_link_local()))
        .collect()
}

/// Binds the sockets of `addrs` (from [`candidates`]) on `port` (the one the device's
/// first address is bound to), each in share slot
/// `slot`; the addresses that cannot be taken are left out, and all are when the
/// first (the link-local one) cannot be.
pub(super) fn open(addrs: &[Ipv6Addr], port: u16, opts: &LinkOptions, slot: u8) -> Vec<Extra> {
    if opts.raw_receive || opts.hook.is_some() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, a) in addrs.iter().enumerate() {
        let ip = IpAddr::V6(*a);
        match share::bind(ip, port, opts, Some(slot)) {
            Ok((udp, member)) => out.push(Extra {
                ip,
                rx: Mutex::new(udp.rx_bufs()),
                udp,
                member: Mutex::new(member),
            }),
            Err(_) if i == 0 => return Vec::new(),
            Err(_) => {}
        }
    }
    out
}

/// The thread of extra address `i` of `dev`, whose link is `link`: sleeps on that
/// address's socket and hands every datagram to the engine, as the device thread does
/// when it holds its socket. It does not nap for a polling application (whose
/// `poll_cq` receives inline from the device's first address only), keeps no time (the
/// device thread fires the timers) and writes no heartbeat (the device thread writes
/// the extra addresses' too, `Link::beat`).
pub(super) fn run(link: &DeviceLink, i: usize, dev: &Inner) {
    let mut slice = super::slice::Slice::start();
    while !dev.stop.load(Ordering::Relaxed) {
        let got = link.serve_extra(i, &Inbound(dev), EXTRA_SLEEP);
        if got > 0 {
            slice.received(got);
        }
    }
}

/// The GID table of a device on `ip` with the extra addresses `extra` (link-local
/// first): rxe's order, `[extra[0], ip, extra[1..]]`; `[ip, ip]` without them (a
/// device on one family: index 1 for programs written for rxe's IPv4 entry, index 0
/// for the others).
pub(super) fn gid_table(ip: IpAddr, extra: &[IpAddr]) -> Vec<Gid> {
    let me = super::gid_of(ip);
    match extra.split_first() {
        None => vec![me, me],
        Some((ll, rest)) => std::iter::once(super::gid_of(*ll))
            .chain(std::iter::once(me))
            .chain(rest.iter().map(|a| super::gid_of(*a)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn the_link_local_address_comes_first_and_others_after_the_ipv4_one() {
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        let g: Ipv6Addr = "fd00:77::1".parse().unwrap();
        assert_eq!(order(vec![g, ll]), vec![ll, g]);
        assert_eq!(
            order(vec![g]),
            Vec::<Ipv6Addr>::new(),
            "no link-local: none"
        );
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(
            gid_table(v4, &[ll.into(), g.into()]),
            vec![
                Gid::from_ipv6(ll),
                Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 1)),
                Gid::from_ipv6(g)
            ]
        );
        assert_eq!(gid_table(v4, &[]), vec![super::super::gid_of(v4); 2]);
    }

    #[test]
    fn loopback_and_ipv6_devices_stay_on_one_family() {
        assert!(candidates(Ipv4Addr::LOCALHOST.into()).is_empty());
        assert!(candidates(Ipv4Addr::new(127, 0, 0, 2).into()).is_empty());
        assert!(candidates(Ipv6Addr::LOCALHOST.into()).is_empty());
    }
}
