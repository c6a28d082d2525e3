//! `DeviceLink`, the [`Link`] a UDP device sits on: the socket of its address
//! ([`UdpLink`]) with the receive buffers, the share of the address (`share::Member`,
//! whose heartbeat the device thread writes through [`Link::beat`]) and the kernel's
//! drop count of its sockets; on a device on both families also its extra IPv6
//! addresses (`dual::Extra`), each with a socket, buffers and share of its own.
//!
//! Receiving ([`Link::receive`]): whoever holds an address's buffers receives, so
//! datagrams reach the engine in the order they arrived. A receive takes what an
//! earlier one left, alone, or else a batch off the socket ([`UdpLink::recv_batch`]);
//! checks each ICRC with the sender's IP ID solved from it, outside the engine's lock
//! (a bad one is dropped and counted); passes on what belongs to another device of the
//! address (`share`); and hands the rest to the device's [`Inbound`]. A
//! [`Receiver::Poll`] leaves the positive ACKs at the end of a batch to the next
//! receive ([`before_trailing_acks`]); a [`Receiver::Idle`] takes nothing (the device
//! thread receives). The empty `poll_cq` and a waiting thread receive from the first
//! address only; each extra address has a thread of its own ([`DeviceLink::serve_extra`]).

use std::io;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{RxBufs, UdpLink, NOWHERE};
use crate::nic::drops::KernelDrops;
use crate::nic::dual::Extra;
use crate::nic::link::{Link, Receiver, Transmit};
use crate::nic::receive::{before_trailing_acks, is_positive_ack};
use crate::nic::{share, Inbound};

/// The link of a UDP device (see the module's documentation).
#[derive(Debug)]
pub(crate) struct DeviceLink {
    /// The socket of the device's address.
    first: UdpLink,
    /// Its receive buffers.
    rx: Mutex<RxBufs>,
    /// Its share of the address, if it shares it.
    member: Mutex<Option<share::Member>>,
    /// The kernel's drop counts of its sockets.
    drops: Mutex<KernelDrops>,
    /// The extra addresses of a device on both families (`dual`).
    extra: Vec<Extra>,
    /// Their addresses, as [`Link::extra_addresses`] gives them.
    extra_ips: Vec<IpAddr>,
    /// Another device shares the address (was there when this one joined, or joined
    /// since).
    shared: AtomicBool,
}

impl DeviceLink {
    /// The link of a device on `first` (its share `member`), with the `extra`
    /// addresses of a device on both families.
    pub(crate) fn new(first: UdpLink, member: Option<share::Member>, extra: Vec<Extra>) -> Self {
        DeviceLink {
            shared: AtomicBool::new(member.as_ref().is_some_and(|m| m.joined_others)),
            rx: Mutex::new(first.rx_bufs()),
            first,
            member: Mutex::new(member),
            drops: Mutex::new(KernelDrops::default()),
            extra_ips: extra.iter().map(|x| x.ip).collect(),
            extra,
        }
    }

    /// Whether another device shares the device's address, as far as this one knows
    /// (it learns of a device joining at its next heartbeat, [`Link::beat`]).
    pub(crate) fn shared(&self) -> bool {
        self.shared.load(Ordering::Relaxed)
    }

    /// [`Link::wait_readable`] that also wakes for `wake` (an auto device's wake-up
    /// socket).
    pub(crate) fn wait_readable_with(
        &self,
        wake: Option<BorrowedFd<'_>>,
        also: Option<BorrowedFd<'_>>,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        self.first.wait_readable_among([wake, also], timeout)
    }

    /// How many extra addresses the device has.
    pub(crate) fn extras(&self) -> usize {
        self.extra.len()
    }

    /// One turn of the thread of extra address `i`: sleeps on its socket (up to
    /// `timeout`) unless an earlier receive left datagrams, then hands `into` what it
    /// receives; how many datagrams.
    pub(crate) fn serve_extra(&self, i: usize, into: &Inbound<'_>, timeout: Duration) -> usize {
        let Some(x) = self.extra.get(i) else {
            std::thread::sleep(timeout);
            return 0;
        };
        if !x.rx.lock().has_left() {
            x.udp.wait_readable(timeout);
        }
        receive_on(&x.udp, &x.rx, into, Receiver::Thread)
    }

    /// The socket a packet from `src` leaves from: that extra address's, else the
    /// first one.
    fn from(&self, src: IpAddr) -> &UdpLink {
        if self.extra.is_empty() {
            return &self.first;
        }
        match self.extra.iter().find(|x| x.ip == src) {
            Some(x) => &x.udp,
            None => &self.first,
        }
    }
}

/// Receives from `udp` into its buffers `bufs` for `into`, as `by` says (see the
/// module's documentation); how many datagrams it handed over.
fn receive_on(udp: &UdpLink, bufs: &Mutex<RxBufs>, into: &Inbound<'_>, by: Receiver) -> usize {
    let (poll, defer) = match by {
        Receiver::Thread => (false, false),
        Receiver::Poll { defer } => (true, defer),
        Receiver::Idle => return 0,
    };
    let Some(mut rx) = (if poll {
        bufs.try_lock()
    } else {
        Some(bufs.lock())
    }) else {
        return 0;
    };
    let rx = &mut *rx;
    let (start, end) = if rx.has_left() {
        (rx.next, rx.got.len())
    } else {
        let n = udp.recv_batch(rx);
        if n == 0 {
            return 0;
        }
        if poll {
            (
                0,
                before_trailing_acks(n, |i| is_positive_ack(rx.bytes(&rx.got[i]))),
            )
        } else {
            (0, n)
        }
    };
    let mut bad = 0;
    for i in start..end {
        let d = rx.got[i];
        match udp.icrc_ip_id(&d, rx.bytes(&d), rx.guess_ip_id(d.from)) {
            Some(id) => rx.saw_ip_id(d.from, id),
            None => {
                rx.got[i].from = NOWHERE;
                bad += 1;
            }
        }
    }
    let counters = into.counters();
    if bad > 0 {
        counters
            .icrc_errors
            .fetch_add(bad, std::sync::atomic::Ordering::Relaxed);
    }
    let passed = udp.pass_on(rx, start..end);
    if passed > 0 {
        counters
            .passed_on
            .fetch_add(passed, std::sync::atomic::Ordering::Relaxed);
    }
    into.checked(
        rx.got[start..end]
            .iter()
            .filter(|d| !(d.from.port() == 0 && d.from.ip().is_unspecified()))
            .map(|d| (d.from, d.dst, d.tos, rx.bytes(d))),
        defer,
    );
    rx.next = end;
    end - start
}

impl Link for DeviceLink {
    fn now(&self) -> Instant {
        Instant::now()
    }

    /// Every run of one call leaves from one address (the device sends a run, or an
    /// answer with the ACK held for its peer): the socket of the first run's source.
    fn send(&self, runs: &mut [Transmit<'_>]) -> io::Result<()> {
        match runs.first() {
            Some(t) => self.from(t.route.src).send(runs),
            None => Ok(()),
        }
    }

    fn max_segments(&self) -> usize {
        self.first.max_segments()
    }

    fn receive_costs_a_system_call(&self) -> bool {
        true
    }

    fn receive_traffic_class(&self, on: bool) {
        self.first.receive_traffic_class(on);
    }

    fn max_multicast_groups(&self) -> Option<u32> {
        self.first.max_multicast_groups()
    }

    fn join_multicast_group(&self, group: IpAddr) -> io::Result<()> {
        self.first.join_multicast_group(group)
    }

    fn leave_multicast_group(&self, group: IpAddr) {
        self.first.leave_multicast_group(group);
    }

    fn receive(&self, into: &Inbound<'_>, by: Receiver) -> usize {
        receive_on(&self.first, &self.rx, into, by)
    }

    fn pending(&self) -> bool {
        self.rx.lock().has_left()
    }

    fn wait_readable(
        &self,
        also: Option<BorrowedFd<'_>>,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        self.first.wait_readable_or(also, timeout)
    }

    fn waitable(&self) -> bool {
        true
    }

    fn beat(&self, now: Instant) {
        if self.member.lock().as_mut().is_some_and(|m| m.beat(now)) {
            self.shared.store(true, Ordering::Relaxed);
            self.first.member_joined();
        }
        for x in &self.extra {
            if x.member.lock().as_mut().is_some_and(|m| m.beat(now)) {
                x.udp.member_joined();
            }
        }
    }

    fn kernel_drops(&self) -> Option<u64> {
        self.first.kernel_drops(&mut self.drops.lock())
    }

    fn extra_addresses(&self) -> &[IpAddr] {
        &self.extra_ips
    }
}
