//! Links: what carries an emulated device's packets and tells its time. [`Link`] is
//! the interface (a simulated fabric implements it too); `udp::DeviceLink` is the real
//! one: one socket per device address, RoCEv2 datagrams with their ICRC computed on send
//! and checked on receive; `shm::ShmLink` the same-host one. Sending and receiving both
//! go through [`Link`], whichever link it is: [`Link::send`] and [`Link::receive`], with
//! a [`Receiver`] saying who receives.

use std::io;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use nix::sys::time::TimeSpec;

use super::receive::Inbound;

/// Who receives, which decides how ([`Link::receive`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receiver {
    /// The device thread, a thread waiting for its completion event on the link
    /// ([`Link::wait_readable`]), or the hand-over of what an inline receive left
    /// ([`Link::pending`]): waits for the link's receive lock, hands the device every
    /// datagram taken.
    Thread,
    /// The application's `poll_cq` with nothing to poll: receives only if no other
    /// thread is; a link that takes batches (UDP) leaves the positive ACKs at the end
    /// of one for the next call (see `nic/receive.rs`, `before_trailing_acks`) and,
    /// with `defer`, has the device leave its last partial run of packets for the next
    /// flush. A link with virtual time moves the network on.
    Poll {
        /// Leave the last partial run for the next flush (see `Inner::may_defer`).
        defer: bool,
    },
    /// A thread that waits for an event with nothing queued and cannot wait on the
    /// link (an async event, a channel the link cannot watch): a link with virtual time
    /// moves the network on, a link with a thread that receives leaves it to that
    /// thread (UDP) or takes what is there if no one else is (shared memory).
    Idle,
}

/// What carries an emulated device's packets and tells its time: the UDP socket of a
/// real deployment, or a simulated fabric with virtual time (crate `emu-sims`).
///
/// A device drives its engine with [`Link::now`] and hands every packet the engine
/// emits to [`Link::send`], in runs ([`Transmit`]). Packets arrive through
/// [`Link::receive`], which the device's thread (UDP, shared memory), an empty
/// `poll_cq` and a waiting thread call: the link hands what it takes to the device's
/// [`Inbound`], or, a fabric, delivers it through the device's
/// [`super::DeviceDriver`] as it moves time on.
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

    /// Whether a partial run on `route` gains by waiting for more packets (one send
    /// carries a run: UDP with GSO). False where each packet is pushed on its own
    /// (an auto device's peers on the shared-memory rings): a deferred post's packets
    /// to them leave at once (`Inner::flush`).
    fn runs_wait_to(&self, route: Route) -> bool {
        let _ = route;
        true
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

    /// Receives for the device `into`, as `by` says ([`Receiver`]): takes what waits
    /// for it, hands it over (the engine runs it under one lock, fires its timers and
    /// sends its answers) and returns how many datagrams it handed over; 0 when there
    /// was nothing, or another thread receives. A link with virtual time moves the
    /// network on instead (delivers the next packet through the device's
    /// [`super::DeviceDriver`], fires the next timer) and returns 1 if anything
    /// happened. The default receives nothing: the caller waits in real time.
    fn receive(&self, into: &Inbound<'_>, by: Receiver) -> usize {
        let _ = (into, by);
        0
    }

    /// Whether a [`Link::receive`] that finds nothing costs a system call now (UDP):
    /// the polls of a device's other CQs then skip theirs for a while (see
    /// `nic/empty_polls.rs`). False for links whose empty receive is a read of memory
    /// (shared memory) or that move virtual time (a fabric). Asked when the device
    /// opens (a link that says false then is never asked again) and at each empty
    /// poll.
    fn receive_costs_a_system_call(&self) -> bool {
        false
    }

    /// Whether an earlier [`Link::receive`] took datagrams it did not hand over yet
    /// (the positive ACKs a [`Receiver::Poll`] leaves at the end of a batch): a
    /// [`Receiver::Thread`] receive hands them over without reading the link.
    fn pending(&self) -> bool {
        false
    }

    /// Waits up to `timeout` (forever for `None`) for something to receive, or for
    /// `also` (a completion channel's descriptor) to become readable; true if either
    /// is. `Interrupted` when a signal handler ran meanwhile (a wait on behalf of
    /// `ibv_get_cq_event` owes the program that). A link that cannot wait so (the
    /// default) says `Unsupported`, and [`Link::waitable`] is false.
    fn wait_readable(
        &self,
        also: Option<BorrowedFd<'_>>,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        let _ = (also, timeout);
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Whether [`Link::wait_readable`] works: a thread that waits for its completion
    /// event then receives for itself (see `EmuDevice::wait_receiving`).
    fn waitable(&self) -> bool {
        false
    }

    /// Called by the device thread on every turn of its loop, at `now`: a link that
    /// tells other devices of this host that it runs (the UDP link's heartbeat in its
    /// share of the address, `nic/share.rs`) does it here.
    fn beat(&self, now: Instant) {
        let _ = now;
    }

    /// How many datagrams the host dropped for this link on arrival since the last
    /// call (a UDP socket's full receive buffer), if it tells (see `nic/drops.rs`).
    fn kernel_drops(&self) -> Option<u64> {
        None
    }

    /// The addresses the link also sends from, beside the device's own (the extra
    /// IPv6 addresses of a device on both families, `nic/dual.rs`): a packet whose
    /// source GID names one of them leaves from it.
    fn extra_addresses(&self) -> &[IpAddr] {
        &[]
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

/// Waits in `ppoll(2)` up to `timeout` (forever for `None`) for one of `fds` to become
/// readable; true if one is: [`Link::wait_readable`] for a link whose receiver sleeps
/// on descriptors. `ppoll`, for a timeout of any precision (poll(2) counts
/// milliseconds); one too long for a `timespec` waits forever. `Interrupted` when a
/// signal handler ran meanwhile: poll(2) is never restarted after a handler.
pub(crate) fn wait_readable_fds<'fd>(
    fds: impl IntoIterator<Item = BorrowedFd<'fd>>,
    timeout: Option<Duration>,
) -> io::Result<bool> {
    let ts = timeout.and_then(|t| {
        let secs = i64::try_from(t.as_secs()).ok()?;
        Some(TimeSpec::new(secs, i64::from(t.subsec_nanos())))
    });
    let mut polled: smallvec::SmallVec<[PollFd<'fd>; 5]> = fds
        .into_iter()
        .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
        .collect();
    match nix::poll::ppoll(&mut polled, ts, None) {
        Ok(k) => Ok(k > 0),
        Err(Errno::EINTR) => Err(io::ErrorKind::Interrupted.into()),
        Err(_) => Ok(false),
    }
}
