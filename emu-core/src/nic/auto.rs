//! The automatic choice of link (`SameHost::Auto`): a UDP device, with its socket, its
//! share of the address and everything a UDP device does, that also offers the
//! same-host shared-memory link (`nic/shm.rs`) and sends to a destination through it
//! when that destination's address has a live offer on this host, else over UDP.
//! Packets are received from both.
//!
//! **Choosing.** Each destination is decided once, at its first packet: through the
//! rings if its address has a live offer then, else over UDP; and kept, so a QP's
//! packets do not switch paths (and reorder) when a peer's offer comes and goes. A
//! destination decided for the rings goes over UDP from the first packet that finds
//! no live offer any more (the peer died; a device that comes back on its address
//! has UDP too). Multicast, and packets from a device's extra IPv6 addresses
//! (`dual`), always go over UDP. CM MADs (QP1) go as any packet: both ends receive
//! from both paths, so they meet whichever way each end chose.
//!
//! **Sleeping.** The device thread sleeps in `poll(2)` on its UDP socket and cannot
//! wait on the bell's futex too, so senders wake it with a byte to a wake-up socket
//! of its own (an abstract unix datagram socket named in its offer) that the same
//! `poll(2)` watches; the bell's sleep-word protocol is unchanged, only the
//! wake-up is (`ShmLink::sleep_polling`, `shm_ring::Producer::caller_wakes`). The
//! wake-up socket is not the UDP socket: no wake-up is taken for a bad packet.
//!
//! **A shared address.** Devices of one address share it (`share`), and a peer's
//! rings would bring one of them the packets of the others' QPs. So a device offers
//! the link only while its address is its own: not at all if another device was
//! there when it opened, and it withdraws its offer (and sends over UDP only) when
//! one joins.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::link::{Link, Receiver, Route, Transmit};
use super::shm::ShmLink;
use super::udp::DeviceLink;
use super::Inbound;

/// The path a destination's packets take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Udp,
    Shm,
}

/// The path decided for each destination, and the last one looked up: a device sends
/// to one peer most of the time, and hashing its address for each run of packets took
/// a tenth of an auto device's CPU in a ping-pong on the rings.
#[derive(Debug, Default)]
struct Paths {
    last: Option<(IpAddr, Via)>,
    all: HashMap<IpAddr, Via>,
}

impl Paths {
    /// The path of `dst`, decided by `decide` the first time.
    fn get_or_insert_with(&mut self, dst: IpAddr, decide: impl FnOnce() -> Via) -> Via {
        match self.last {
            Some((ip, via)) if ip == dst => via,
            _ => {
                let via = *self.all.entry(dst).or_insert_with(decide);
                self.last = Some((dst, via));
                via
            }
        }
    }

    /// Sets the path of `dst`.
    fn insert(&mut self, dst: IpAddr, via: Via) {
        self.all.insert(dst, via);
        if self.last.is_some_and(|(ip, _)| ip == dst) {
            self.last = Some((dst, via));
        }
    }
}

/// The link of an auto device (see the module's documentation).
#[derive(Debug)]
pub(crate) struct AutoLink {
    udp: Arc<DeviceLink>,
    /// The same-host side; none when the address was shared at open or the link
    /// could not be offered (another live process offers the address).
    shm: Option<ShmLink>,
    /// The offer was withdrawn: another device came to share the address.
    withdrawn: AtomicBool,
    /// The device's address (the rings carry packets from it only).
    ip: IpAddr,
    via: Mutex<Paths>,
    /// Polls that received (see [`Link::receive`]).
    polls: AtomicU32,
    /// When a poll's next read of the UDP socket is due, in nanoseconds since
    /// `opened`: at once after a read that found datagrams, [`UDP_QUIET`] after one
    /// that found none.
    udp_due: AtomicU64,
    opened: Instant,
}

/// While peers send through the rings, one poll in this many looks at the clock to
/// see whether the UDP socket is due.
const UDP_EVERY: u32 = 8;

/// While peers send through the rings and the UDP socket had nothing at the last
/// look, a poll reads it again after this long.
const UDP_QUIET: Duration = Duration::from_micros(20);

impl AutoLink {
    /// The link of an auto device on the UDP link `udp` at `ip:port`: offers the
    /// shared-memory link too if the address is the device's alone.
    pub(crate) fn new(udp: Arc<DeviceLink>, ip: IpAddr, port: u16) -> AutoLink {
        let shm = if udp.shared() {
            None
        } else {
            ShmLink::new(ip, port).ok()
        };
        AutoLink {
            udp,
            shm,
            withdrawn: AtomicBool::new(false),
            ip,
            via: Mutex::new(Paths::default()),
            polls: AtomicU32::new(0),
            udp_due: AtomicU64::new(0),
            opened: Instant::now(),
        }
    }

    /// The same-host side, while the device sends through it.
    fn sending_shm(&self) -> Option<&ShmLink> {
        self.shm
            .as_ref()
            .filter(|_| !self.withdrawn.load(Ordering::Relaxed))
    }

    /// The path of a run (decided once per destination, see the module's
    /// documentation).
    fn via(&self, shm: &ShmLink, paths: &mut Paths, route: Route) -> Via {
        let dst = route.dst;
        if route.src != self.ip || dst.is_multicast() {
            return Via::Udp;
        }
        paths.get_or_insert_with(dst, || if shm.offered(dst) { Via::Shm } else { Via::Udp })
    }
}

impl Link for AutoLink {
    fn now(&self) -> Instant {
        Instant::now()
    }

    /// Runs go in order, each group of consecutive runs on one path in one call of
    /// that path's link.
    fn send(&self, runs: &mut [Transmit<'_>]) -> io::Result<()> {
        let Some(shm) = self.sending_shm() else {
            return self.udp.send(runs);
        };
        let mut first = Ok(());
        let mut i = 0;
        while i < runs.len() {
            let mut via = self.via.lock();
            let path = self.via(shm, &mut via, runs[i].route);
            let mut j = i + 1;
            while j < runs.len() && self.via(shm, &mut via, runs[j].route) == path {
                j += 1;
            }
            drop(via);
            let r = match path {
                Via::Udp => self.udp.send(&mut runs[i..j]),
                Via::Shm => {
                    let r = shm.send_runs(&mut runs[i..j]);
                    if r.as_ref()
                        .is_err_and(|e| e.kind() == io::ErrorKind::NotConnected)
                    {
                        // A peer whose offer went (it died): UDP from now on.
                        let mut via = self.via.lock();
                        for t in &runs[i..j] {
                            if !shm.offered(t.route.dst) {
                                via.insert(t.route.dst, Via::Udp);
                            }
                        }
                    }
                    r
                }
            };
            if first.is_ok() {
                first = r;
            }
            i = j;
        }
        first
    }

    fn max_segments(&self) -> usize {
        self.udp.max_segments()
    }

    /// Not to a peer on the rings, whose packets are pushed one by one.
    fn runs_wait_to(&self, route: Route) -> bool {
        self.sending_shm()
            .is_none_or(|shm| self.via(shm, &mut self.via.lock(), route) == Via::Udp)
    }

    /// Not while peers send through the rings: a poll then reads the rings, a read
    /// of memory, and the socket only now and then (see [`AutoLink::receive`]).
    fn receive_costs_a_system_call(&self) -> bool {
        !self.shm.as_ref().is_some_and(ShmLink::has_rings)
    }

    /// The rings, then the UDP socket; but a poll, while peers send through the
    /// rings, reads the socket only one time in [`UDP_EVERY`], and while the socket is
    /// quiet only once [`UDP_QUIET`] passed since the last read. Each read is a system
    /// call (`recvmmsg`, about 1.5 us): once in every poll it doubled a ping-pong's
    /// half round trip through the rings, and once in eight polls it still kept the
    /// poller in the kernel most of the time, where a packet in a ring waited for it.
    /// A datagram then waits up to that long more; the device thread reads both every
    /// time.
    fn receive(&self, into: &Inbound<'_>, by: Receiver) -> usize {
        let Some(shm) = &self.shm else {
            return self.udp.receive(into, by);
        };
        let n = shm.receive_rings(into, by);
        if !matches!(by, Receiver::Poll { .. }) || !shm.has_rings() {
            return n + self.udp.receive(into, by);
        }
        if !self
            .polls
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(UDP_EVERY)
        {
            return n;
        }
        let now = u64::try_from(self.opened.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if now < self.udp_due.load(Ordering::Relaxed) {
            return n;
        }
        let m = self.udp.receive(into, by);
        let wait = if m > 0 {
            0
        } else {
            UDP_QUIET.as_nanos() as u64
        };
        self.udp_due
            .store(now.saturating_add(wait), Ordering::Relaxed);
        n + m
    }

    fn pending(&self) -> bool {
        self.udp.pending()
    }

    /// `poll(2)` on the UDP socket(s), `also` and the wake-up socket, under the bell's
    /// sleep word so that senders through the rings wake it.
    fn wait_readable(
        &self,
        also: Option<BorrowedFd<'_>>,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        let Some(shm) = &self.shm else {
            return self.udp.wait_readable(also, timeout);
        };
        if timeout.is_some_and(|t| t.is_zero()) {
            return Ok(self.udp.wait_readable(also, timeout)? || shm.ready());
        }
        let wake = Some(shm.wake_fd());
        shm.sleep_polling(|| self.udp.wait_readable_with(wake, also, timeout))
    }

    fn waitable(&self) -> bool {
        true
    }

    fn beat(&self, now: Instant) {
        self.udp.beat(now);
        if let Some(shm) = &self.shm {
            if self.udp.shared() && !self.withdrawn.swap(true, Ordering::Relaxed) {
                shm.withdraw();
            }
        }
    }

    fn kernel_drops(&self) -> Option<u64> {
        self.udp.kernel_drops()
    }

    fn extra_addresses(&self) -> &[IpAddr] {
        self.udp.extra_addresses()
    }

    fn receive_traffic_class(&self, on: bool) {
        self.udp.receive_traffic_class(on);
    }

    fn max_multicast_groups(&self) -> Option<u32> {
        self.udp.max_multicast_groups()
    }

    fn join_multicast_group(&self, group: IpAddr) -> io::Result<()> {
        self.udp.join_multicast_group(group)
    }

    fn leave_multicast_group(&self, group: IpAddr) {
        self.udp.leave_multicast_group(group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// Looks up a destination, deciding `Shm` or `Udp` if it has no path yet.
        Get(u8, bool),
        /// Sets a destination's path.
        Set(u8, bool),
    }

    fn via(shm: bool) -> Via {
        if shm {
            Via::Shm
        } else {
            Via::Udp
        }
    }

    proptest! {
        /// The cached last lookup never disagrees with the map: every lookup answers
        /// what a plain map (decided once, then set) holds.
        #[test]
        fn the_last_lookup_agrees_with_the_map(ops in proptest::collection::vec(
            prop_oneof![
                (0u8..4, any::<bool>()).prop_map(|(d, s)| Op::Get(d, s)),
                (0u8..4, any::<bool>()).prop_map(|(d, s)| Op::Set(d, s)),
            ],
            0..64,
        )) {
            let mut paths = Paths::default();
            let mut model: HashMap<IpAddr, Via> = HashMap::new();
            for op in ops {
                match op {
                    Op::Get(d, shm) => {
                        let dst = IpAddr::from([10, 0, 0, d]);
                        let want = *model.entry(dst).or_insert(via(shm));
                        prop_assert_eq!(paths.get_or_insert_with(dst, || via(shm)), want);
                    }
                    Op::Set(d, shm) => {
                        let dst = IpAddr::from([10, 0, 0, d]);
                        model.insert(dst, via(shm));
                        paths.insert(dst, via(shm));
                    }
                }
            }
        }
    }
}
