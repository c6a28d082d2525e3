//! Links: what carries an emulated device's packets and tells its time. [`Link`] is
//! the interface (a simulated fabric implements it too); `udp::UdpLink` is the real one: one
//! socket per device, RoCEv2 datagrams with their ICRC computed on send and checked on
//! receive.

use std::io;
use std::net::IpAddr;
use std::time::Instant;

/// What carries an emulated device's packets and tells its time: the UDP socket of a
/// real deployment, or a simulated fabric with virtual time (crate `emu-sims`).
///
/// A device drives its engine with [`Link::now`] and hands every packet the engine
/// emits to [`Link::send`], in runs ([`Transmit`]). Packets arrive through the device's thread (UDP) or through
/// its [`super::DeviceDriver`] (a fabric delivers them itself).
pub trait Link: Send + Sync + std::fmt::Debug {
    /// The time now: `Instant::now()` for a real link, the fabric's virtual clock for a
    /// simulated one.
    fn now(&self) -> Instant;

    /// Sends `runs` in order, filling in every packet's ICRC. A link that can hand the
    /// kernel a whole run at once (UDP GSO) does, and one that can hand it several
    /// single packets in one call (`sendmmsg`: an answer and the ACK held for the same
    /// peer) does that too. The first error is returned after the rest was tried.
    fn send(&self, runs: &mut [Transmit<'_>]) -> io::Result<()>;

    /// How many packets one [`Transmit`] may hold (1: no batching).
    fn max_segments(&self) -> usize {
        1
    }

    /// The link's buffer pool, if it keeps the packets it is given (a simulated fabric
    /// queues them): a buffer at least [`MAX_PACKET`](crate::engine::MAX_PACKET) bytes
    /// long for the device to write its next packet into and hand back with
    /// [`Link::send_owned`], so the packet is never copied. `None` (the default):
    /// packets go through [`Link::send`].
    fn lend(&self) -> Option<Vec<u8>> {
        None
    }

    /// Fills in the ICRC of the packet in `buf[..len]` and sends it along `route`,
    /// keeping `buf`, which [`Link::lend`] gave.
    fn send_owned(&self, route: Route, mut buf: Vec<u8>, len: usize) -> io::Result<()> {
        let mut t = Transmit::one(route, &mut buf[..len]);
        self.send(std::slice::from_mut(&mut t))
    }

    /// Called when the application found nothing to do: an empty `poll_cq`, or a wait
    /// for a completion event or an async event with nothing queued. A link with
    /// virtual time moves the network on (delivers the next packet, fires the next
    /// timer) and returns true if anything happened; a real link returns false and
    /// the caller waits in real time.
    fn idle(&self) -> bool {
        false
    }

    /// Whether the device wants each received datagram's TOS byte: while it has UD QPs,
    /// whose receive buffers show it in the GRH (see
    /// [`DeviceDriver::handle_datagram_tos`](super::DeviceDriver)). A link that cannot
    /// tell it ignores this (the default); its datagrams count as TOS 0.
    fn receive_traffic_class(&self, on: bool) {
        let _ = on;
    }

    /// How many multicast groups the link can deliver at once, if it has a bound of its
    /// own: the device advertises and enforces no more (`max_mcast_grp`).
    fn max_multicast_groups(&self) -> Option<u32> {
        None
    }

    /// Makes the link deliver what is sent to the multicast `group` (of the device's
    /// address family) to this device too: called when the first QP of the device
    /// attaches to it. A link without multicast says `Unsupported`.
    fn join_multicast_group(&self, group: IpAddr) -> io::Result<()> {
        let _ = group;
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Stops delivering `group` to this device: called when its last QP detaches.
    fn leave_multicast_group(&self, group: IpAddr) {
        let _ = group;
    }
}

/// Where packets go: from the device's address to a peer's (both on the device port),
/// with the TOS byte of their IPv4 header (the traffic class of an IPv6 one), the traffic class of their path
/// ([`engine::Transmit::traffic_class`](crate::engine::Transmit), IBTA Annex A17.4.5; a
/// link that cannot set it ignores it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// The device's address.
    pub src: IpAddr,
    /// The peer's address, or a multicast group's (of the same family).
    pub dst: IpAddr,
    /// The IPv4 TOS byte, or the IPv6 traffic class.
    pub tos: u8,
}

/// A run of packets for [`Link::send`], shaped as quinn-udp's `Transmit`: RoCEv2 UDP
/// payloads (BTH to a zeroed ICRC slot) back to back in `contents`, each
/// `segment_size` bytes long but the last, which may be shorter.
#[derive(Debug)]
pub struct Transmit<'a> {
    /// Where they go.
    pub route: Route,
    /// The packets.
    pub contents: &'a mut [u8],
    /// The size of every packet but the last; `contents.len()` for a single packet.
    pub segment_size: usize,
}

impl<'a> Transmit<'a> {
    /// One packet.
    pub fn one(route: Route, packet: &'a mut [u8]) -> Transmit<'a> {
        let segment_size = packet.len();
        Transmit {
            route,
            contents: packet,
            segment_size,
        }
    }

    /// How many packets the run holds.
    #[must_use]
    pub fn count(&self) -> usize {
        self.contents.len().div_ceil(self.segment_size.max(1))
    }

    /// The packets, one slice each.
    pub fn packets(&mut self) -> std::slice::ChunksMut<'_, u8> {
        self.contents.chunks_mut(self.segment_size.max(1))
    }
}
