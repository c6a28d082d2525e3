//! The network interface under a UDP device's port, as kernel rxe follows its netdev:
//! the port's active MTU, its state, width and speed come from the interface that
//! carries the device's address, and follow it when it changes.
//!
//! - Active MTU: the largest IBTA MTU whose packet, with the headers around it, fits
//!   the interface's MTU. rxe subtracts its largest header stack (80 bytes: IPv4 or
//!   the GRH's 40, UDP 8, BTH 12, RETH 16, ICRC 4) before it rounds down
//!   (`eth_mtu_int_to_enum`), so 1500 gives 1024 and 9000 gives 4096; the loopback
//!   interface (65536) keeps 4096.
//! - State: an interface that is down (or whose lower layer is) takes the port down:
//!   `PORT_ERR`, and no packet flows; up again: `PORT_ACTIVE` (manual 6.1.10-11, as
//!   rxe's `rxe_port_down`/`rxe_port_up`).
//! - Width and speed: what Linux maps an Ethernet link's speed to
//!   (`ib_get_eth_speed`); a link of unknown speed counts as 1 Gb/s: 1X SDR.
//!
//! The device thread looks again every [`INTERVAL`] (rxe hears of changes from the
//! kernel's netdev notifier at once; a user process would need netlink for that).
//! Only sysfs and `getifaddrs` are read: no privilege is needed.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use verbs_api::{Mtu, PortState};

use crate::engine::PortLink;

/// How often the device thread reads the interface again.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

/// The bytes rxe reserves for headers below its payload (`RXE_MAX_HDR_LENGTH`).
const HEADERS: u32 = 80;

/// The largest IBTA MTU a packet may have on an interface whose MTU is `netdev_mtu`.
pub(crate) fn ib_mtu(netdev_mtu: u32) -> Mtu {
    let room = netdev_mtu.saturating_sub(HEADERS);
    [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
        .into_iter()
        .find(|m| m.bytes() <= room)
        .unwrap_or(Mtu::Mtu256)
}

/// (ActiveWidth, ActiveSpeed) in IBTA's encoding for an Ethernet link of
/// `speed_mbps` (None: unknown), as Linux's `ib_get_eth_speed` maps it.
pub(crate) fn width_speed(speed_mbps: Option<u32>) -> (u8, u8) {
    const W1X: u8 = 1;
    const W4X: u8 = 2;
    const SDR: u8 = 1;
    const DDR: u8 = 2;
    const FDR10: u8 = 8;
    const EDR: u8 = 32;
    match speed_mbps.unwrap_or(1000) {
        0..=1000 => (W1X, SDR),
        1001..=10_000 => (W1X, FDR10),
        10_001..=20_000 => (W4X, DDR),
        20_001..=25_000 => (W1X, EDR),
        25_001..=40_000 => (W4X, FDR10),
        _ => (W4X, EDR),
    }
}

/// What the interface says now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reading {
    /// The port's link (MTU, width, speed), before the device's own MTU cap.
    pub(crate) link: PortLink,
    /// The port's state: ACTIVE while the interface is up, DOWN otherwise.
    pub(crate) state: PortState,
}

/// The interface that carries `ip`: the one holding exactly that address, else the
/// one whose subnet contains it (`lo`'s 127.0.0.0/8 for every loopback address). An
/// IPv6 address is compared with the interfaces' IPv6 addresses and prefixes.
pub(crate) fn interface_of(ip: IpAddr) -> Option<String> {
    let mut in_subnet = None;
    let want = v6_bytes(ip);
    for ifa in nix::ifaddrs::getifaddrs().ok()? {
        let as_ip = |a: Option<&nix::sys::socket::SockaddrStorage>| -> Option<IpAddr> {
            let a = a?;
            match ip {
                IpAddr::V4(_) => a.as_sockaddr_in().map(|a| IpAddr::V4(a.ip())),
                IpAddr::V6(_) => a.as_sockaddr_in6().map(|a| IpAddr::V6(a.ip())),
            }
        };
        let (Some(addr), Some(mask)) = (as_ip(ifa.address.as_ref()), as_ip(ifa.netmask.as_ref()))
        else {
            continue;
        };
        if addr == ip {
            return Some(ifa.interface_name);
        }
        let (a, m) = (v6_bytes(addr), v6_bytes(mask));
        let same = (0..16).all(|i| a[i] & m[i] == want[i] & m[i]);
        if in_subnet.is_none() && same {
            in_subnet = Some(ifa.interface_name);
        }
    }
    in_subnet
}

/// The 16 bytes of an address (an IPv4 one in the last four; only compared with
/// addresses of its own family).
fn v6_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[12..].copy_from_slice(&v4.octets());
            b
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Reads interface `name` from sysfs; None if it is gone.
pub(crate) fn read(name: &str) -> Option<Reading> {
    let file = |f: &str| std::fs::read_to_string(format!("/sys/class/net/{name}/{f}")).ok();
    let mtu: u32 = file("mtu")?.trim().parse().ok()?;
    // "up", "down", "lowerlayerdown", "dormant", "notpresent", "testing", or "unknown"
    // (the loopback interface, and drivers that do not report it: counted as up).
    let operstate = file("operstate").unwrap_or_default();
    let up = !matches!(
        operstate.trim(),
        "down" | "lowerlayerdown" | "notpresent" | "dormant"
    );
    // Reading `speed` fails (EINVAL) for interfaces without one, such as `lo`.
    let speed = file("speed")
        .and_then(|s| s.trim().parse::<i64>().ok())
        .and_then(|s| u32::try_from(s).ok())
        .filter(|&s| s > 0);
    let (width, speed) = width_speed(speed);
    Some(Reading {
        link: PortLink {
            active_mtu: ib_mtu(mtu),
            width,
            speed,
        },
        state: if up {
            PortState::Active
        } else {
            PortState::Down
        },
    })
}

/// The device thread's view of its interface: what it last applied and when to look
/// again.
#[derive(Debug)]
pub(crate) struct Follower {
    ip: IpAddr,
    name: Option<String>,
    last: Option<Reading>,
    next: Option<Instant>,
}

impl Follower {
    /// Follows the interface that carries `ip` (found at the first look).
    pub(crate) fn new(ip: IpAddr) -> Follower {
        Follower {
            ip,
            name: None,
            last: None,
            next: None,
        }
    }

    /// The interface's reading if it is time to look (`now` past the last look plus
    /// [`INTERVAL`]) and it changed since the last one returned; the interface is
    /// looked up again when it is gone.
    pub(crate) fn poll(&mut self, now: Instant) -> Option<Reading> {
        if self.next.is_some_and(|t| now < t) {
            return None;
        }
        self.next = Some(now + INTERVAL);
        if self.name.is_none() {
            self.name = interface_of(self.ip);
        }
        let reading = match self.name.as_deref().and_then(read) {
            Some(r) => r,
            None => {
                self.name = None;
                return None;
            }
        };
        if self.last == Some(reading) {
            return None;
        }
        self.last = Some(reading);
        Some(reading)
    }

    /// The interface's name, once found.
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn mtus_as_rxe_derives_them() {
        assert_eq!(ib_mtu(1500), Mtu::Mtu1024);
        assert_eq!(ib_mtu(9000), Mtu::Mtu4096);
        assert_eq!(ib_mtu(65536), Mtu::Mtu4096);
        assert_eq!(ib_mtu(4096 + 80), Mtu::Mtu4096);
        assert_eq!(ib_mtu(4096 + 79), Mtu::Mtu2048);
        assert_eq!(ib_mtu(2048 + 80), Mtu::Mtu2048);
        assert_eq!(ib_mtu(1280), Mtu::Mtu1024);
        assert_eq!(ib_mtu(1000), Mtu::Mtu512);
        assert_eq!(ib_mtu(576), Mtu::Mtu256);
        assert_eq!(ib_mtu(0), Mtu::Mtu256);
    }

    #[test]
    fn speeds_as_linux_maps_them() {
        assert_eq!(width_speed(None), (1, 1));
        assert_eq!(width_speed(Some(1000)), (1, 1));
        assert_eq!(width_speed(Some(10_000)), (1, 8));
        assert_eq!(width_speed(Some(25_000)), (1, 32));
        assert_eq!(width_speed(Some(40_000)), (2, 8));
        assert_eq!(width_speed(Some(100_000)), (2, 32));
    }

    #[test]
    fn the_loopback_interface_carries_127_addresses() {
        // Every Linux host (and network namespace) has `lo` with 127.0.0.1/8.
        assert_eq!(
            interface_of(Ipv4Addr::new(127, 0, 0, 9).into()).as_deref(),
            Some("lo")
        );
        let r = read("lo").expect("lo is readable in sysfs");
        assert_eq!(r.link.active_mtu, Mtu::Mtu4096);
        assert_eq!((r.link.width, r.link.speed), (1, 1));
        assert_eq!(r.state, PortState::Active);
        let mut f = Follower::new(Ipv4Addr::LOCALHOST.into());
        let t = Instant::now();
        assert_eq!(f.poll(t), Some(r));
        assert_eq!(f.name(), Some("lo"));
        assert_eq!(f.poll(t + INTERVAL), None, "unchanged: nothing to apply");
    }
}
