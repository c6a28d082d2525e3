//! Links: what carries an emulated device's packets and tells its time. [`Link`] is
//! the interface (a simulated fabric implements it too); `udp::UdpLink` is the real one: one
//! socket per device, RoCEv2 datagrams with their ICRC computed on send and checked on
//! receive.

use std::io;
use std::net::Ipv4Addr;
use std::time::Instant;

/// What carries an emulated device's packets and tells its time: the UDP socket of a
/// real deployment, or a simulated fabric with virtual time (crate `sims`).
///
/// A device drives its engine with [`Link::now`] and hands every packet the engine
/// emits to [`Link::send`]. Packets arrive through the device's thread (UDP) or through
/// its [`super::DeviceDriver`] (a fabric delivers them itself).
pub trait Link: Send + Sync + std::fmt::Debug {
    /// The time now: `Instant::now()` for a real link, the fabric's virtual clock for a
    /// simulated one.
    fn now(&self) -> Instant;

    /// Fills in the ICRC of `packet` (a RoCEv2 UDP payload, BTH to ICRC, from `src` to
    /// `dst`, both on the device port) and sends it.
    fn send(&self, src: Ipv4Addr, dst: Ipv4Addr, packet: &mut [u8]) -> io::Result<()>;

    /// Sends `packets`: consecutive packets of `segment` bytes each (the last may be
    /// shorter), all from `src` to `dst`; fills in each one's ICRC. A link that can
    /// hand the kernel a whole run at once (UDP GSO) does; the default sends them one
    /// by one through [`Link::send`].
    fn send_batch(
        &self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        packets: &mut [u8],
        segment: usize,
    ) -> io::Result<()> {
        let mut r = Ok(());
        for p in packets.chunks_mut(segment.max(1)) {
            if let Err(e) = self.send(src, dst, p) {
                r = Err(e);
            }
        }
        r
    }

    /// Sends `first` and then `second`, one packet each, both from `src` to `dst`, as
    /// two datagrams in that order; fills in both ICRCs. A link that can hand the
    /// kernel both in one call (`sendmmsg`) does; the default sends them one by one
    /// through [`Link::send`].
    fn send_two(
        &self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        first: &mut [u8],
        second: &mut [u8],
    ) -> io::Result<()> {
        let r = self.send(src, dst, first);
        self.send(src, dst, second).and(r)
    }

    /// A buffer at least [`MAX_PACKET`](crate::engine::MAX_PACKET) bytes long for the
    /// device to write its next packet into, if the link keeps the packets it is given
    /// (a simulated fabric queues them): the device then hands the buffer over with
    /// [`Link::send_owned`] and the link stores it instead of copying the packet.
    /// `None` (the default): packets go through [`Link::send`] and
    /// [`Link::send_batch`].
    fn lend(&self) -> Option<Vec<u8>> {
        None
    }

    /// Fills in the ICRC of the packet in `buf[..len]` (as [`Link::send`]) and sends
    /// it, keeping `buf`, which [`Link::lend`] gave.
    fn send_owned(
        &self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        mut buf: Vec<u8>,
        len: usize,
    ) -> io::Result<()> {
        self.send(src, dst, &mut buf[..len])
    }

    /// How many packets [`Link::send_batch`] takes at once (1: no batching).
    fn max_batch(&self) -> usize {
        1
    }

    /// Called when the application found nothing to do: an empty `poll_cq`, or a wait
    /// for a completion event or an async event with nothing queued. A link with
    /// virtual time moves the network on (delivers the next packet, fires the next
    /// timer) and returns true if anything happened; a real link returns false and
    /// the caller waits in real time.
    fn idle(&self) -> bool {
        false
    }

    /// The TOS byte of the IPv4 header of the packets the send methods get from now on,
    /// until the next call: the traffic class of their path
    /// ([`Transmit::traffic_class`](crate::engine::Transmit), IBTA Annex A17.4.5). A
    /// link that cannot set it ignores it (the default).
    fn set_traffic_class(&self, tos: u8) {
        let _ = tos;
    }

    /// Whether the device wants each received datagram's TOS byte: while it has UD QPs,
    /// whose receive buffers show it in the GRH (see
    /// [`DeviceDriver::handle_datagram_tos`](super::DeviceDriver)). A link that cannot
    /// tell it ignores this (the default); its datagrams count as TOS 0.
    fn receive_traffic_class(&self, on: bool) {
        let _ = on;
    }

    /// Makes the link deliver what is sent to the IPv4 multicast `groups` to this
    /// device, and stop delivering any other group: called with the whole set each time
    /// a QP attaches or detaches. A link without multicast says `Unsupported`.
    fn set_multicast_groups(&self, groups: &[Ipv4Addr]) -> io::Result<()> {
        if groups.is_empty() {
            Ok(())
        } else {
            Err(io::ErrorKind::Unsupported.into())
        }
    }
}
