//! Links: what carries an emulated device's packets and tells its time. [`Link`] is
//! the interface (a simulated fabric implements it too); `UdpLink` is the real one: one
//! socket per device, RoCEv2 datagrams with their ICRC computed on send and checked on
//! receive.
//!
//! The UDP link batches: a run of equal-sized packets to one peer leaves in one
//! `sendmsg` with `UDP_SEGMENT` (generic segmentation offload: the kernel cuts it into
//! datagrams, or on loopback hands it whole to a receiver that asked for `UDP_GRO`),
//! and receives take `UDP_GRO` runs, up to 64 KiB of coalesced datagrams per slot,
//! split again by the segment size the kernel reports; once receives in a row keep
//! finding datagrams, `recvmmsg` takes many runs per call. GRO is switched off while
//! traffic is quiet (see `gro`): a lone datagram is then read with the cheaper
//! `recvfrom`. Kernels without GSO or GRO
//! get one datagram per slot and per send (quinn-udp probes and falls back). Two
//! single packets to one peer (an answer and the ACK held for that peer) leave in one
//! `sendmmsg`, the answer first. The batched receive is quinn-udp's; sends and the
//! one-slot receive are nix's `sendto`, `sendmsg` and `recvmsg` and rustix's
//! `sendmmsg`, with no control message but `UDP_SEGMENT`/`UDP_GRO` (quinn-udp adds
//! the TOS byte on send and asks for the destination address on receive, which a
//! ping-pong pays on every half round trip). All wrap the system calls safely, so this
//! crate keeps no `unsafe`.
//!
//! The ICRC covers the IPv4 header, identification field included (Annex A17.4), which
//! a UDP socket neither chooses nor shows. Every datagram's ICRC is computed with the
//! IP ID the kernel gives it (`ip_id`): 0 from the bound socket (unconnected, DF set),
//! a connected socket's own count otherwise, and for a GSO run the send's ID plus the
//! segment's index. A receive through the UDP socket solves the sender's ID from the
//! ICRC ([`emu_wire::icrc_ip_id`]); the interop mode of [`super::interop`] reads it
//! from the IP header (a raw receive socket) and also runs the fault hook.
//!
//! Sends to a unicast peer leave from a socket of their own, connected to the peer
//! (`peers`; at most [`MAX_PEER_SOCKETS`]): the kernel keeps the route of a connected
//! socket, where an unconnected `sendto` looks it up on every call (0.4 us of a 3.9 us
//! loopback half round trip here). Its source port is an ephemeral one, as rxe's is a
//! per-QP hash. Where the kernel does not tell a connected socket's IDs, its peer gets
//! the bound socket. Interop mode and a fault hook send every datagram from the bound
//! socket.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_wire::{check_icrc, icrc_ip_id, write_icrc, Ipv4Endpoints};
use nix::errno::Errno;
use nix::sys::socket::{
    setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags, SockaddrIn,
};
use quinn_udp::{RecvMeta, UdpSockRef, UdpSocketState};
use rustix::event::{PollFd, PollFlags};
use rustix::net::addr::SocketAddrArg;
use rustix::net::{MMsgHdr, SendAncillaryBuffer};
use socket2::{Domain, Protocol, SockRef, Socket, Type};

use super::drops::KernelDrops;
use super::gro::Gro;
use super::interop::{parse_raw_udp, LinkOptions, PacketHook, Verdict};
use super::ip_id::{self, IpIds};
use super::share;

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

/// Socket buffer size asked for (the kernel may cap it at net.core.*mem_max).
const SOCKET_BUFFER: usize = 8 << 20;

/// Asks for a [`SOCKET_BUFFER`] receive buffer: forced past net.core.rmem_max when
/// privileged, else what the cap allows.
fn large_recv_buffer(s: &Socket) {
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(s, SOCKET_BUFFER).is_err() {
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    }
}

/// Asks for a [`SOCKET_BUFFER`] send buffer, as [`large_recv_buffer`] does.
fn large_send_buffer(s: &Socket) {
    if rustix::net::sockopt::set_socket_send_buffer_size_force(s, SOCKET_BUFFER).is_err() {
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    }
}

/// How many peers get a connected send socket of their own (see the module docs); sends
/// to any further peer leave from the bound socket. A file descriptor each: a process
/// with many fully meshed devices must not run out of them.
const MAX_PEER_SOCKETS: usize = 16;

/// A send-only socket connected to one peer's `ip:port` (see the module docs), or
/// `None` where making one failed (the bound socket sends then).
#[derive(Debug)]
struct PeerSocket {
    dst: Ipv4Addr,
    socket: Option<(UdpSocket, u16)>,
    /// The TOS byte the socket sends with now.
    tos: AtomicU8,
    /// The IP ID of the socket's next datagram (see `ip_id`).
    ids: IpIds,
}

/// Where a datagram leaves from: a socket, the address to give `sendto` (none for a
/// connected socket), and the source port the ICRC covers.
struct Out<'a> {
    socket: &'a UdpSocket,
    to: Option<SockaddrIn>,
    src_port: u16,
    /// The TOS byte `socket` sends with now (`IP_TOS`).
    tos: &'a AtomicU8,
    /// The IP IDs of a connected socket; none for the bound one, which sends with ID 0.
    ids: Option<&'a IpIds>,
}

/// The most UDP payload one GSO send may carry: an IPv4 datagram is at most 65535
/// bytes, less 20 of IP header and 8 of UDP header.
pub(crate) const GSO_MAX_BYTES: usize = 65_535 - 28;

/// Receives in a row that must find datagrams before the next one is batched (see
/// `RxBufs::found`).
const BATCH_AFTER: u8 = 3;
/// Receives that stay one-slot after a batched receive found no backlog (see
/// `RxBufs::backoff`).
const BATCH_BACKOFF: u8 = 64;

/// Receive slots per `recvmmsg` call, each large enough for one GRO-coalesced run.
const RX_SLOTS: usize = 16;
/// Bytes per receive slot: a whole coalesced run (64 KiB) when GRO is on.
const RX_SLOT_GRO: usize = 64 << 10;
/// Bytes per receive slot without GRO (a RoCEv2 packet is at most 4096 + 128 bytes;
/// anything larger is truncated and then fails its ICRC).
const RX_SLOT_PLAIN: usize = 9216;

/// A bound RoCEv2 UDP socket, and one socket per multicast group the device joined.
///
/// Multicast is IP multicast: a send to a multicast GID goes to the IPv4 group address
/// on the device port, out of the interface of the device's own address with
/// loopback on (so devices on one host, in one process or several, hear it); a device
/// with a QP attached to a group binds a second socket to `group:port`
/// (`SO_REUSEADDR`, so every device of the host can) and joins the group on the
/// interface of its own address. On loopback that is `lo`, which Linux lets join groups
/// although it lacks the MULTICAST flag.
#[derive(Debug)]
pub(crate) struct UdpLink {
    /// Non-blocking; waits go through `poll(2)`.
    socket: UdpSocket,
    state: UdpSocketState,
    /// A GSO send failed with EIO (the route's device cannot checksum the segments):
    /// runs leave one datagram per send from then on, as quinn-udp does.
    gso_failed: AtomicBool,
    ip: Ipv4Addr,
    port: u16,
    groups: parking_lot::Mutex<Vec<(Ipv4Addr, UdpSocket)>>,
    /// Where other devices sharing the address pass on datagrams for this one's QPs
    /// (`share`); none for a device that keeps its address to itself.
    inbox: Option<UdpSocket>,
    /// Its port (0: none).
    inbox_port: u16,
    /// Another device shares the address: receives look in the inbox too (alone, a
    /// device spares its receives that system call), and packets to the address go
    /// straight to their device's inbox.
    inbox_active: AtomicBool,
    /// Where the datagrams for other devices' QPs go (`share`), on a device that
    /// shares its address. Taken after the engine's lock, never before it.
    router: Option<parking_lot::Mutex<share::Router>>,
    /// Connected send sockets, one per unicast peer (see the module docs).
    peers: parking_lot::Mutex<Vec<PeerSocket>>,
    /// Interop mode: the raw socket datagrams are read from (IP header included).
    raw: Option<Socket>,
    hook: Option<Arc<dyn PacketHook>>,
    /// The TOS byte the packets being sent should carry ([`Link::set_traffic_class`]).
    tos: AtomicU8,
    /// The TOS byte the bound socket sends with now.
    bound_tos: AtomicU8,
    /// Receives tell each datagram's TOS byte ([`Link::receive_traffic_class`]): the
    /// socket has `IP_RECVTOS` on, and every receive is a one-slot `recvmsg`, whose
    /// control messages nix parses (quinn-udp's batched receive keeps only the ECN
    /// bits, and `recvfrom` has no control messages).
    tos_rx: AtomicBool,
}

/// One datagram taken off the socket: where it sits in the receive buffers, who sent
/// it, and to which address (ours or a multicast group).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rx {
    slot: usize,
    start: usize,
    len: usize,
    /// The sender.
    pub(crate) from: SocketAddrV4,
    /// Our address or a group's.
    pub(crate) dst: Ipv4Addr,
    /// The IPv4 identification it carried, when the link sees IP headers (interop
    /// mode); 0 otherwise (a UDP socket does not tell it; see the module docs).
    pub(crate) ip_id: u16,
    /// Its IPv4 TOS byte, when the link reads it (interop mode, or
    /// [`Link::receive_traffic_class`]); 0 otherwise.
    pub(crate) tos: u8,
    /// Another device of the address passed it on (`share`): it is not passed on
    /// again.
    pub(crate) passed_on: bool,
}

/// The receive buffers of a device, allocated once: no heap allocation per packet.
#[derive(Debug)]
pub(crate) struct RxBufs {
    slots: Vec<Vec<u8>>,
    meta: Vec<RecvMeta>,
    /// The datagrams of the last [`UdpLink::recv_batch`], GRO runs already split.
    pub(crate) got: Vec<Rx>,
    /// How many of `got` the engine has had; the rest (positive ACKs that an inline
    /// receive left behind a completion) go to it before the next receive.
    pub(crate) next: usize,
    mslots: Vec<Vec<u8>>,
    mcast: Vec<(usize, SocketAddrV4, Ipv4Addr)>,
    /// How many receives in a row found datagrams (at most [`BATCH_AFTER`]). Until
    /// that many did, a receive asks for one slot only (a whole GRO run): a
    /// busy-polling caller mostly finds nothing, a ping-pong one datagram at a time
    /// (its answer, then the ACK behind it), and the batched receive builds and zeroes
    /// a header table for every slot on each call (about 700 instructions per call,
    /// callgrind). A stream of separate datagrams gets the batched one from the fourth
    /// receive on.
    found: u8,
    /// Receives left that ask for one slot whatever `found` says: set to
    /// [`BATCH_BACKOFF`] by a batched receive that took one datagram or GRO run (no
    /// backlog). A ping-pong on two busy cores finds datagrams many receives in a row
    /// (the ACK of its question, then the answer; streaks of 16 and more), and a
    /// batched receive costs more than a one-slot one when one datagram waits: `recvmmsg`
    /// tries the next slot too, and the header table is built for all of them (2.3 us
    /// against 1.2 us a call, with the ACK and the answer on the critical path
    /// together). Busy-poll send_lat, interleaved rounds: 1.39x against 1.50x the raw
    /// ping-pong; a stream's batches take several datagrams each and keep batching.
    backoff: u8,
    /// Room for the `UDP_GRO` control message of a one-slot receive.
    cmsg: Vec<u8>,
    /// Whether the socket has `UDP_GRO` on, switched with the traffic (see `gro`).
    gro: Gro,
    /// The sender and IP ID of the last datagram whose ICRC was right (see
    /// [`RxBufs::guess_ip_id`]).
    last_ip_id: (SocketAddrV4, u16),
}

impl RxBufs {
    /// Whether datagrams of the last batch still wait for the engine.
    pub(crate) fn has_left(&self) -> bool {
        self.next < self.got.len()
    }

    /// The IP ID the next datagram from `from` most likely carries, to be tried first
    /// ([`emu_wire::icrc_ip_id`]): the one after the last one from there (a connected
    /// socket and a GSO run number them), 0 after a 0 (an unconnected socket sends
    /// every datagram with 0) and from another sender.
    pub(crate) fn guess_ip_id(&self, from: SocketAddrV4) -> u16 {
        match self.last_ip_id {
            (f, id) if f == from && id != 0 => id.wrapping_add(1),
            _ => 0,
        }
    }

    /// A datagram from `from` carried IP ID `id`.
    pub(crate) fn saw_ip_id(&mut self, from: SocketAddrV4, id: u16) {
        self.last_ip_id = (from, id);
    }

    /// The bytes of a received datagram.
    pub(crate) fn bytes(&self, rx: &Rx) -> &[u8] {
        let slot = if rx.slot < self.slots.len() {
            &self.slots[rx.slot]
        } else {
            &self.mslots[rx.slot - self.slots.len()]
        };
        &slot[rx.start..rx.start + rx.len]
    }
}

impl UdpLink {
    /// Whether a device with `opts` on `port` shares its address with other devices
    /// (`share`): not in interop mode, not when asked to keep it, not on a port the
    /// kernel picks (nobody else could name it).
    pub(crate) fn shares(port: u16, opts: &LinkOptions) -> bool {
        port != 0 && !opts.exclusive && !opts.raw_receive
    }

    /// The inbox of a device that shares its address: a non-blocking socket on the
    /// address and a port of the kernel's choice (`share`).
    pub(crate) fn open_inbox(ip: Ipv4Addr) -> io::Result<UdpSocket> {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        large_recv_buffer(&s);
        s.bind(&SocketAddr::V4(SocketAddrV4::new(ip, 0)).into())?;
        s.set_nonblocking(true)?;
        Ok(s.into())
    }

    /// Binds `ip:port` with DF set (IP ID 0), large buffers, GRO on where the kernel
    /// has it, and non-blocking I/O; with an `inbox`, shares the port with the other
    /// devices of the address (`SO_REUSEPORT`, see `share`); in interop mode
    /// (`opts.raw_receive`) also opens the raw receive socket.
    pub(crate) fn bind(
        ip: Ipv4Addr,
        port: u16,
        opts: &LinkOptions,
        inbox: Option<UdpSocket>,
    ) -> io::Result<Self> {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        if inbox.is_some() {
            s.set_reuse_port(true)?;
        }
        // Large buffers keep a briefly starved device thread from losing datagrams (which
        // costs RC a retransmission and UC a message). SO_*BUFFORCE passes the
        // net.core.*mem_max cap when privileged; otherwise the capped size is used.
        large_recv_buffer(&s);
        large_send_buffer(&s);
        // Multicast sends leave through our own address's interface, TTL 1, and are
        // looped back to the host's other members.
        if !ip.is_unspecified() {
            s.set_multicast_if_v4(&ip)?;
        }
        s.set_multicast_loop_v4(true)?;
        s.bind(&SocketAddr::V4(SocketAddrV4::new(ip, port)).into())?;
        let socket: UdpSocket = s.into();
        // quinn-udp turns GRO on, makes the socket non-blocking, and sets path MTU
        // discovery to "probe"; DF with IP ID 0 needs "do", so set it after.
        let state = UdpSocketState::new(UdpSockRef::from(&socket))?;
        rustix::net::sockopt::set_ip_mtu_discover(
            &socket,
            rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
        )?;
        // quinn-udp also asks for every datagram's TOS byte (for ECN) and destination
        // address, which nothing here reads (a datagram on this socket is for our
        // address; groups have their own sockets): two control messages less for the
        // kernel to write per receive (about 60 ns each of a 1 us receive on loopback).
        let _ = rustix::net::sockopt::set_ip_recvtos(&socket, false);
        let _ = nix::sys::socket::setsockopt(
            &socket,
            nix::sys::socket::sockopt::Ipv4PacketInfo,
            &false,
        );
        let port = socket.local_addr()?.port();
        let raw = if opts.raw_receive {
            let r = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("interop mode needs a raw socket (root or CAP_NET_RAW): {e}"),
                )
            })?;
            large_recv_buffer(&r);
            r.set_nonblocking(true)?;
            Some(r)
        } else {
            None
        };
        Ok(UdpLink {
            socket,
            state,
            gso_failed: AtomicBool::new(false),
            ip,
            port,
            groups: parking_lot::Mutex::new(Vec::new()),
            inbox_port: inbox
                .as_ref()
                .and_then(|s| s.local_addr().ok())
                .map_or(0, |a| a.port()),
            inbox,
            inbox_active: AtomicBool::new(false),
            router: None,
            peers: parking_lot::Mutex::new(Vec::new()),
            raw,
            hook: opts.hook.clone(),
            tos: AtomicU8::new(0),
            bound_tos: AtomicU8::new(0),
            tos_rx: AtomicBool::new(false),
        })
    }

    /// What the kernel dropped of the datagrams for this link's receive sockets (the
    /// bound one and the groups') since the last call (see `drops`).
    pub(crate) fn kernel_drops(&self, d: &mut KernelDrops) -> Option<u64> {
        let groups = self.groups.lock();
        let mut socks: Vec<BorrowedFd<'_>> = vec![self.socket.as_fd()];
        socks.extend(groups.iter().map(|(_, s)| s.as_fd()));
        socks.extend(self.inbox.as_ref().map(AsFd::as_fd));
        d.since_last(&socks)
    }

    /// Interop mode: the link reads IP headers and sends one datagram per call.
    fn interop(&self) -> bool {
        self.raw.is_some()
    }

    /// Receive buffers sized for this socket (GRO or not).
    pub(crate) fn rx_bufs(&self) -> RxBufs {
        let size = if self.state.gro_segments() > 1 && !self.interop() {
            RX_SLOT_GRO
        } else {
            RX_SLOT_PLAIN
        };
        let n = RX_SLOTS.min(quinn_udp::BATCH_SIZE.max(1));
        RxBufs {
            slots: (0..n).map(|_| vec![0u8; size]).collect(),
            meta: vec![RecvMeta::default(); n],
            got: Vec::with_capacity(n * 64 + 8),
            mslots: (0..8).map(|_| vec![0u8; RX_SLOT_PLAIN]).collect(),
            mcast: Vec::with_capacity(8),
            found: BATCH_AFTER,
            backoff: 0,
            next: 0,
            cmsg: nix::cmsg_space!(i32, i32),
            gro: Gro::new(self.state.gro_segments() > 1),
            last_ip_id: (SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), 0),
        }
    }

    /// A non-blocking socket on `group:port` that has joined `group` on the interface
    /// of our address.
    fn join(&self, group: Ipv4Addr) -> io::Result<UdpSocket> {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        s.set_reuse_address(true)?;
        s.bind(&SocketAddr::V4(SocketAddrV4::new(group, self.port)).into())?;
        s.join_multicast_v4(&group, &self.ip)?;
        s.set_nonblocking(true)?;
        Ok(s.into())
    }

    /// The bound port (useful when bound to port 0).
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Makes the device the member in `slot` of its address (`share`), routing what
    /// belongs to the others; `joined_others`: it found others there.
    pub(crate) fn join_address(&mut self, slot: u8, joined_others: bool) {
        if self.inbox.is_some() {
            self.router = Some(parking_lot::Mutex::new(share::Router::new(
                self.ip, self.port, slot,
            )));
            if joined_others {
                self.activate_inbox();
            }
        }
    }

    /// Another device shares the address (`share`): receives look in the inbox from
    /// now on, and packets to the address go straight to their device's inbox.
    pub(crate) fn activate_inbox(&self) {
        if self.inbox.is_some() && !self.inbox_active.load(Ordering::Relaxed) {
            self.inbox_active.store(true, Ordering::Relaxed);
        }
    }

    /// Another device joined the address (its heartbeat says so, `share::Member::beat`):
    /// receives look in the inbox, and the router reads the members again.
    pub(crate) fn member_joined(&self) {
        self.activate_inbox();
        if let Some(r) = &self.router {
            r.lock().forget();
        }
    }

    /// Passes the datagrams of `range` in `rx` that belong to another device of the
    /// address on to it (`share`), each behind the header naming its sender, and
    /// takes them out of the batch (their sender becomes 0.0.0.0:0, as a bad ICRC's).
    /// What another device passed on stays here whatever the router says (no datagram
    /// goes round in circles). Returns how many went.
    pub(crate) fn pass_on(&self, rx: &mut RxBufs, range: std::ops::Range<usize>) -> u64 {
        let Some(router) = &self.router else {
            return 0;
        };
        let mut router = router.lock();
        let now = Instant::now();
        let mut passed = 0;
        for i in range {
            let d = rx.got[i];
            if d.passed_on || (d.from.port() == 0 && d.from.ip().is_unspecified()) {
                continue;
            }
            if let share::Route::To(to) = router.route(rx.bytes(&d), d.dst, now) {
                // One that cannot leave is lost, as on a link.
                self.relay(to, d.from, d.tos, rx.bytes(&d));
                rx.got[i].from = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
                passed += 1;
            }
        }
        if passed > 0 {
            // The device it went to may answer through this one's inbox.
            self.activate_inbox();
        }
        passed
    }

    /// Sends `bytes` behind the header naming `from` (and its TOS byte) to the inbox
    /// `to` of a device of the address, from the bound socket. Returns whether it left.
    fn relay(&self, to: SocketAddrV4, from: SocketAddrV4, tos: u8, bytes: &[u8]) -> bool {
        let hdr = share::relay_header(from, tos);
        let iov = [IoSlice::new(&hdr), IoSlice::new(bytes)];
        SockRef::from(&self.socket)
            .send_to_vectored(&iov, &SocketAddr::V4(to).into())
            .is_ok()
    }

    /// Sends the `segment`-byte `packets` (the last may be shorter) that go to the
    /// device's own address while other devices share it: each straight to the inbox
    /// of the device that holds its QP (this one's included), sealed as if it left the
    /// bound socket. None goes through the kernel's pick among the address's sockets,
    /// whose queue a device takes with it when its process ends (a REJ sent just before
    /// its sender exited was lost that way). `None` when the address is not shared.
    fn send_local(
        &self,
        dst: Ipv4Addr,
        packets: &mut [u8],
        segment: usize,
    ) -> Option<io::Result<()>> {
        let router = self.router.as_ref()?;
        if dst != self.ip || !self.inbox_active.load(Ordering::Relaxed) {
            return None;
        }
        let ep = self.endpoints(dst, self.port);
        let from = SocketAddrV4::new(self.ip, self.port);
        let own = SocketAddrV4::new(self.ip, self.inbox_port);
        let tos = self.tos.load(Ordering::Relaxed);
        let now = Instant::now();
        let mut router = router.lock();
        let mut r = Ok(());
        for p in packets.chunks_mut(segment.max(1)) {
            write_icrc(&ep, p);
            let to = match router.route(p, dst, now) {
                share::Route::To(to) => to,
                share::Route::Here => own,
            };
            if !self.relay(to, from, tos, p) {
                r = Err(io::Error::last_os_error());
            }
        }
        Some(r)
    }

    /// Waits up to `timeout` for the socket to become readable; true if it is.
    pub(crate) fn wait_readable(&self, timeout: Duration) -> bool {
        self.wait_readable_or(None, Some(timeout))
    }

    /// Waits up to `timeout` (forever for `None`) for the socket or `other` to become
    /// readable; true if one is.
    pub(crate) fn wait_readable_or(
        &self,
        other: Option<BorrowedFd<'_>>,
        timeout: Option<Duration>,
    ) -> bool {
        let ts = timeout.and_then(|t| rustix::event::Timespec::try_from(t).ok());
        // The UDP socket gets a copy of what the raw one shows: it is drained too.
        let socket = PollFd::new(&self.socket, PollFlags::IN);
        let mut fds = [socket.clone(), socket.clone(), socket.clone(), socket];
        let mut n = 1;
        for fd in [
            self.raw.as_ref().map(AsFd::as_fd),
            self.inbox.as_ref().map(AsFd::as_fd),
            other,
        ]
        .into_iter()
        .flatten()
        {
            fds[n] = PollFd::from_borrowed_fd(fd, PollFlags::IN);
            n += 1;
        }
        matches!(rustix::event::poll(&mut fds[..n], ts.as_ref()), Ok(k) if k > 0)
    }

    /// Interop mode's receive: drains the UDP socket and the group sockets (their
    /// datagrams are the raw socket's copies), then reads the raw socket into the
    /// slots, keeping what is addressed to our address or a joined group on our port.
    fn recv_raw(&self, raw: &Socket, rx: &mut RxBufs) -> usize {
        let RxBufs { slots, got, .. } = rx;
        got.clear();
        let mut sink = [0u8; 64];
        while self.socket.recv_from(&mut sink).is_ok() {}
        let groups: Vec<Ipv4Addr> = {
            let g = self.groups.lock();
            for (_, s) in g.iter() {
                while s.recv_from(&mut sink).is_ok() {}
            }
            g.iter().map(|(a, _)| *a).collect()
        };
        let mut reader = raw;
        for (slot, buf) in slots.iter_mut().enumerate() {
            let n = loop {
                match reader.read(buf) {
                    Ok(n) => match parse_raw_udp(&buf[..n]) {
                        Some(d)
                            if d.dst.port() == self.port
                                && (*d.dst.ip() == self.ip || groups.contains(d.dst.ip())) =>
                        {
                            break Some(d)
                        }
                        // Someone else's UDP: not ours to count.
                        _ => continue,
                    },
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break None,
                }
            };
            let Some(d) = n else { break };
            got.push(Rx {
                slot,
                start: d.payload.start,
                len: d.payload.len(),
                from: d.src,
                dst: *d.dst.ip(),
                ip_id: d.ip_id,
                tos: d.tos,
                passed_on: false,
            });
        }
        got.len()
    }

    /// Applies the hook to what was received: drops what it drops.
    fn hook_received(&self, rx: &mut RxBufs) {
        let Some(hook) = &self.hook else { return };
        let raw = self.interop();
        let mut got = std::mem::take(&mut rx.got);
        got.retain(|d| {
            hook.on_receive(d.from, raw.then_some(d.ip_id), rx.bytes(d)) == Verdict::Pass
        });
        rx.got = got;
    }

    /// Takes every datagram waiting (up to the buffers' capacity) without blocking,
    /// unicast and multicast, into `rx.got`, coalesced runs split into datagrams.
    /// Returns how many.
    pub(crate) fn recv_batch(&self, rx: &mut RxBufs) -> usize {
        rx.next = 0;
        if let Some(raw) = &self.raw {
            self.recv_raw(raw, rx);
            self.hook_received(rx);
            return rx.got.len();
        }
        let n = self.recv_plain(rx);
        if self.hook.is_some() {
            self.hook_received(rx);
            return rx.got.len();
        }
        n
    }

    /// Sets `UDP_GRO` on the receive socket as `gro` asked (see `gro`). Off only if
    /// nothing was queued by the time it went off (else back on: a run queued while
    /// it was on could no longer be split).
    fn switch_gro(&self, gro: &mut Gro, on: bool) {
        if setsockopt(&self.socket, sockopt::UdpGroSegment, &on).is_err() {
            return;
        }
        if on || rustix::io::ioctl_fionread(&self.socket).is_ok_and(|n| n == 0) {
            gro.switched(on, true);
        } else if setsockopt(&self.socket, sockopt::UdpGroSegment, &true).is_ok() {
            gro.switched(true, false);
        }
    }

    /// The default mode's receive (see [`UdpLink::recv_batch`]).
    fn recv_plain(&self, rx: &mut RxBufs) -> usize {
        let RxBufs {
            slots,
            meta,
            got,
            mslots,
            mcast,
            found,
            backoff,
            next: _,
            cmsg,
            gro,
            last_ip_id: _,
        } = rx;
        got.clear();
        let n = slots.len();
        let tos_rx = self.tos_rx.load(Ordering::Relaxed);
        let ask = if tos_rx {
            1
        } else if *found < BATCH_AFTER || *backoff > 0 {
            *backoff = backoff.saturating_sub(1);
            1
        } else {
            n
        };
        let mut tos = 0;
        let sock = UdpSockRef::from(&self.socket);
        let r = if ask == 1 {
            // A busy poll mostly finds nothing: no slot table to build for it, and the
            // one datagram (or GRO run) it may find is read with `recvmsg`, or with
            // `recvfrom` when no run can be queued.
            let plain = gro.plain() && !tos_rx;
            recv_one(
                &self.socket,
                &mut slots[0],
                cmsg,
                &mut meta[0],
                &mut tos,
                plain,
            )
        } else {
            let mut iov: [IoSliceMut<'_>; RX_SLOTS] =
                std::array::from_fn(|_| IoSliceMut::new(&mut []));
            for (v, s) in iov.iter_mut().zip(slots.iter_mut()) {
                *v = IoSliceMut::new(s);
            }
            self.state.recv(sock, &mut iov[..ask], &mut meta[..ask])
        };
        if let Ok(k) = r {
            for (slot, m) in meta.iter().enumerate().take(k) {
                let SocketAddr::V4(from) = m.addr else {
                    continue;
                };
                let stride = m.stride.max(1);
                let mut start = 0;
                if m.len == 0 {
                    // An empty datagram is one too (it fails its ICRC and is counted).
                    got.push(Rx {
                        slot,
                        start: 0,
                        len: 0,
                        from,
                        dst: self.ip,
                        ip_id: 0,
                        tos,
                        passed_on: false,
                    });
                }
                while start < m.len {
                    let len = stride.min(m.len - start);
                    got.push(Rx {
                        slot,
                        start,
                        len,
                        from,
                        dst: self.ip,
                        ip_id: 0,
                        tos,
                        passed_on: false,
                    });
                    start += len;
                }
            }
        }
        // (An error says nothing about what is queued.)
        if let Ok(k) = r {
            if ask > 1 && k == 1 {
                // A batch that found no backlog.
                *backoff = BATCH_BACKOFF;
            }
            if let Some(on) = gro.after_receive(k, got.len()) {
                self.switch_gro(gro, on);
            }
        }
        *found = if got.is_empty() {
            0
        } else {
            (*found + 1).min(BATCH_AFTER)
        };
        // Multicast datagrams wait on the group sockets.
        mcast.clear();
        {
            let groups = self.groups.lock();
            for (group, sock) in groups.iter() {
                while mcast.len() < mslots.len() {
                    match sock.recv_from(&mut mslots[mcast.len()]) {
                        Ok((len, SocketAddr::V4(from))) => mcast.push((len, from, *group)),
                        _ => break,
                    }
                }
            }
        }
        for (i, &(len, from, dst)) in mcast.iter().enumerate() {
            got.push(Rx {
                slot: n + i,
                start: 0,
                len,
                from,
                dst,
                ip_id: 0,
                tos: 0,
                passed_on: false,
            });
        }
        // What other devices of the address passed on (`share`): from their bound
        // socket only, each behind the header naming its sender.
        if let Some(inbox) = self
            .inbox
            .as_ref()
            .filter(|_| self.inbox_active.load(Ordering::Relaxed))
        {
            let member = SocketAddrV4::new(self.ip, self.port);
            for slot in n + mcast.len()..n + mslots.len() {
                let buf = &mut mslots[slot - n];
                let Ok((len, SocketAddr::V4(by))) = inbox.recv_from(buf) else {
                    break;
                };
                let Some((from, tos)) = share::parse_relay_header(&buf[..len]) else {
                    continue;
                };
                if by != member {
                    continue;
                }
                got.push(Rx {
                    slot,
                    start: share::RELAY_HEADER,
                    len: len - share::RELAY_HEADER,
                    from,
                    dst: self.ip,
                    ip_id: 0,
                    tos,
                    passed_on: true,
                });
            }
        }
        got.len()
    }

    /// The IP ID of a received datagram if its ICRC is right: in interop mode the ID
    /// it carried (the raw socket sees it); otherwise the ID the ICRC was computed with
    /// (a UDP socket does not tell it: solved from the ICRC, `guess` tried first, see
    /// [`emu_wire::icrc_ip_id`]). `None` when the ICRC is wrong.
    pub(crate) fn icrc_ip_id(&self, d: &Rx, packet: &[u8], guess: u16) -> Option<u16> {
        let ep = Ipv4Endpoints {
            src: *d.from.ip(),
            dst: d.dst,
            ip_id: if self.interop() { d.ip_id } else { guess },
            src_port: d.from.port(),
            dst_port: self.port,
        };
        if self.interop() {
            check_icrc(&ep, packet).then_some(d.ip_id)
        } else {
            icrc_ip_id(&ep, packet)
        }
    }

    /// The bound socket, as the way out to `dst` (interop mode, a hook, multicast).
    fn bound_out(&self, dst: Ipv4Addr) -> Out<'_> {
        Out {
            socket: &self.socket,
            to: Some(SockaddrIn::from(SocketAddrV4::new(dst, self.port))),
            src_port: self.port,
            tos: &self.bound_tos,
            ids: None,
        }
    }

    /// The way out to `dst` with the connected sockets of `peers` (made on the first
    /// send to a unicast peer; see the module docs).
    fn out<'a>(&'a self, peers: &'a mut Vec<PeerSocket>, dst: Ipv4Addr) -> Out<'a> {
        let direct = !self.interop()
            && self.hook.is_none()
            && !self.ip.is_unspecified()
            && !dst.is_multicast()
            && !dst.is_broadcast()
            && !dst.is_unspecified();
        if !direct {
            return self.bound_out(dst);
        }
        let i = match peers.iter().position(|p| p.dst == dst) {
            Some(i) => i,
            None if peers.len() < MAX_PEER_SOCKETS => {
                let (socket, ids) = match self.connect_to(dst) {
                    Ok((s, port, next)) => (Some((s, port)), IpIds::new(next)),
                    Err(_) => (None, IpIds::new(0)),
                };
                peers.push(PeerSocket {
                    dst,
                    socket,
                    tos: AtomicU8::new(0),
                    ids,
                });
                peers.len() - 1
            }
            None => return self.bound_out(dst),
        };
        let peer = &mut peers[i];
        if let Some((socket, port)) = &peer.socket {
            if peer.ids.next().is_none() {
                // A send failed after the kernel may have numbered it: ask again, or
                // send from the bound socket from now on.
                match ip_id::probe(socket, self.ip, *port) {
                    Some(next) => peer.ids.set(next),
                    None => peer.socket = None,
                }
            }
        }
        let peer = &peers[i];
        match &peer.socket {
            Some((socket, port)) => Out {
                socket,
                to: None,
                src_port: *port,
                tos: &peer.tos,
                ids: Some(&peer.ids),
            },
            None => self.bound_out(dst),
        }
    }

    /// A send-only socket on our address (an ephemeral port), connected to `dst` on
    /// the device port, with the bound socket's DF and send buffer; its port and the IP
    /// ID of its first datagram. An error when the kernel does not tell the ID.
    fn connect_to(&self, dst: Ipv4Addr) -> io::Result<(UdpSocket, u16, u16)> {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        large_send_buffer(&s);
        // Nothing is sent to it: the smallest receive buffer the kernel allows.
        let _ = s.set_recv_buffer_size(1);
        s.bind(&SocketAddr::V4(SocketAddrV4::new(self.ip, 0)).into())?;
        s.connect(&SocketAddr::V4(SocketAddrV4::new(dst, self.port)).into())?;
        s.set_nonblocking(true)?;
        let socket: UdpSocket = s.into();
        rustix::net::sockopt::set_ip_mtu_discover(
            &socket,
            rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
        )?;
        let port = socket.local_addr()?.port();
        let next = ip_id::probe(&socket, self.ip, port).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel did not tell the IP ID",
            )
        })?;
        Ok((socket, port, next))
    }

    /// Writes the ICRC of each `segment`-byte packet of `contents` (the last may be
    /// shorter) for the IP ID the kernel will give it when `out` sends `contents` in one
    /// call: the socket's next ID, counting up per GSO segment (see `ip_id`).
    fn seal(&self, out: &Out<'_>, dst: Ipv4Addr, contents: &mut [u8], segment: usize) {
        let first = out.ids.and_then(IpIds::next).unwrap_or(0);
        let ep = self.endpoints(dst, out.src_port);
        for (k, p) in contents.chunks_mut(segment.max(1)).enumerate() {
            let ip_id = first.wrapping_add(k as u16);
            write_icrc(&Ipv4Endpoints { ip_id, ..ep }, p);
        }
    }

    /// Writes the ICRCs of `contents` and hands it to the kernel through `out` (as GSO
    /// segments of `segment` bytes when it holds more than one); waits for room in the
    /// socket buffer if it is full.
    fn transmit(
        &self,
        out: &Out<'_>,
        dst: Ipv4Addr,
        contents: &mut [u8],
        segment: usize,
    ) -> io::Result<()> {
        self.apply_tos(out);
        self.seal(out, dst, contents, segment);
        let fd = out.socket.as_raw_fd();
        // A full send buffer: wait for room, a bounded number of times (the receiver
        // is on this host or the datagram can be dropped: RC retransmits).
        for _ in 0..1000 {
            let r = if contents.len() > segment {
                // GSO: one control message, UDP_SEGMENT (nix builds it in a small
                // buffer per call: per run of packets, not per packet).
                let gso = segment as u16;
                nix::sys::socket::sendmsg(
                    fd,
                    &[IoSlice::new(contents)],
                    &[ControlMessage::UdpGsoSegments(&gso)],
                    MsgFlags::empty(),
                    out.to.as_ref(),
                )
            } else if let Some(to) = &out.to {
                nix::sys::socket::sendto(fd, contents, to, MsgFlags::empty())
            } else {
                nix::sys::socket::send(fd, contents, MsgFlags::empty())
            };
            // Refused before the packet was built: no IP ID taken (see `ip_id`).
            match r {
                Ok(_) => {
                    if let Some(i) = out.ids {
                        i.advance(1);
                    }
                    return Ok(());
                }
                Err(Errno::EAGAIN) => {
                    let mut fds = [PollFd::new(out.socket, PollFlags::OUT)];
                    let ts = rustix::event::Timespec {
                        tv_sec: 0,
                        tv_nsec: 1_000_000,
                    };
                    let _ = rustix::event::poll(&mut fds, Some(&ts));
                }
                // A connected socket reports an earlier datagram's ICMP error (the
                // peer's port closed) on the next send, which did not go: once told,
                // the error is cleared, so send again (UDP loses what the peer missed).
                Err(Errno::EINTR | Errno::ECONNREFUSED) => {}
                Err(Errno::EIO) if contents.len() > segment => {
                    // The device under the route cannot segment (the packet was built,
                    // with an IP ID): send this run and every later one datagram by
                    // datagram.
                    if let Some(i) = out.ids {
                        i.advance(1);
                    }
                    self.gso_failed.store(true, Ordering::Relaxed);
                    return self.transmit_each(out, dst, contents, segment);
                }
                Err(Errno::EMSGSIZE) => return Err(Errno::EMSGSIZE.into()),
                Err(e) => {
                    if let Some(i) = out.ids {
                        i.lose_track();
                    }
                    return Err(e.into());
                }
            }
        }
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Gives `out`'s socket the TOS byte the packets being sent should carry, when it
    /// sends with another (one `setsockopt` per change: traffic mostly keeps one
    /// traffic class). The IPv4 TOS byte does not enter the ICRC (IBTA Annex A17.4.5.1
    /// masks it).
    fn apply_tos(&self, out: &Out<'_>) {
        let want = self.tos.load(Ordering::Relaxed);
        if out.tos.load(Ordering::Relaxed) != want
            && rustix::net::sockopt::set_ip_tos(out.socket, want).is_ok()
        {
            out.tos.store(want, Ordering::Relaxed);
        }
    }

    /// Sends the `segment`-byte packets of `contents` (the last may be shorter) one
    /// datagram each; the last error, if any.
    fn transmit_each(
        &self,
        out: &Out<'_>,
        dst: Ipv4Addr,
        contents: &mut [u8],
        segment: usize,
    ) -> io::Result<()> {
        let mut r = Ok(());
        for p in contents.chunks_mut(segment) {
            if let Err(e) = self.transmit(out, dst, p, segment) {
                r = Err(e);
            }
        }
        r
    }

    /// Sends one packet through the hook's verdict.
    fn send_hooked(
        &self,
        hook: &dyn PacketHook,
        dst: Ipv4Addr,
        packet: &mut [u8],
    ) -> io::Result<()> {
        // A hook sends from the bound socket (see `out`), whose datagrams carry IP ID 0.
        let out = self.bound_out(dst);
        let one = |p: &mut [u8]| self.transmit(&out, dst, p, p.len().max(1));
        match hook.on_send(dst, packet) {
            Verdict::Pass => one(packet),
            Verdict::Drop => Ok(()),
            Verdict::Duplicate => {
                one(packet)?;
                one(packet)
            }
            Verdict::Replace(mut p) => one(&mut p),
            Verdict::Delay(d) => {
                // From a socket of its own (unconnected, DF: IP ID 0): a copy of the
                // bound one kept the device's address taken after the device closed,
                // until the delay ran out, so reopening it failed with EADDRINUSE.
                let sock = UdpSocket::bind(SocketAddrV4::new(self.ip, 0))?;
                rustix::net::sockopt::set_ip_mtu_discover(
                    &sock,
                    rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
                )?;
                write_icrc(&self.endpoints(dst, sock.local_addr()?.port()), packet);
                let bytes = packet.to_vec();
                let to = SocketAddrV4::new(dst, self.port);
                std::thread::spawn(move || {
                    std::thread::sleep(d);
                    let _ = sock.send_to(&bytes, to);
                });
                Ok(())
            }
        }
    }

    /// The ICRC fields of a packet we send to `dst` from `src_port`.
    fn endpoints(&self, dst: Ipv4Addr, src_port: u16) -> Ipv4Endpoints {
        Ipv4Endpoints {
            src: self.ip,
            dst,
            ip_id: 0,
            src_port,
            dst_port: self.port,
        }
    }
}

/// One non-blocking `recvmsg` into `buf`, with room in `cmsg` for the `UDP_GRO`
/// and `IP_TOS` control messages, or a `recvfrom` if `plain` (no run can be queued
/// and no TOS wanted): fills `meta` as quinn-udp's receive would (length, sender, and
/// the segment size of a coalesced run as its stride) and `tos` with the TOS byte if
/// the socket reports it (`IP_RECVTOS`; the datagrams of a run share it, as GRO
/// coalesces only datagrams with one TOS). Ok(0) when nothing waits.
fn recv_one(
    socket: &UdpSocket,
    buf: &mut [u8],
    cmsg: &mut Vec<u8>,
    meta: &mut RecvMeta,
    tos: &mut u8,
    plain: bool,
) -> io::Result<usize> {
    let (len, stride, from) = if plain {
        match nix::sys::socket::recvfrom::<SockaddrIn>(socket.as_raw_fd(), buf) {
            Ok((len, from)) => (len, len, from),
            Err(Errno::EAGAIN | Errno::EINTR) => return Ok(0),
            Err(e) => return Err(e.into()),
        }
    } else {
        let mut iov = [IoSliceMut::new(buf)];
        let r = match nix::sys::socket::recvmsg::<SockaddrIn>(
            socket.as_raw_fd(),
            &mut iov,
            Some(cmsg.as_mut_slice()),
            MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(r) => r,
            Err(Errno::EAGAIN | Errno::EINTR) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let mut stride = r.bytes;
        // A truncated control message (MSG_CTRUNC) leaves the stride whole: the run
        // then fails its ICRC check and is counted, as any malformed datagram.
        if let Ok(cmsgs) = r.cmsgs() {
            for c in cmsgs {
                match c {
                    ControlMessageOwned::UdpGroSegments(s) => {
                        stride = usize::try_from(s).unwrap_or(r.bytes);
                    }
                    ControlMessageOwned::Ipv4Tos(t) => *tos = t,
                    _ => {}
                }
            }
        }
        (r.bytes, stride, r.address)
    };
    let Some(from) = from else {
        return Ok(0);
    };
    meta.len = len;
    meta.stride = stride;
    meta.addr = SocketAddr::V4(SocketAddrV4::from(from));
    Ok(1)
}

impl Link for UdpLink {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn send(&self, _src: Ipv4Addr, dst: Ipv4Addr, packet: &mut [u8]) -> io::Result<()> {
        if let Some(hook) = &self.hook {
            return self.send_hooked(hook.as_ref(), dst, packet);
        }
        let n = packet.len();
        if let Some(r) = self.send_local(dst, packet, n) {
            return r;
        }
        let mut peers = self.peers.lock();
        let out = self.out(&mut peers, dst);
        self.transmit(&out, dst, packet, n.max(1))
    }

    fn send_batch(
        &self,
        _src: Ipv4Addr,
        dst: Ipv4Addr,
        packets: &mut [u8],
        segment: usize,
    ) -> io::Result<()> {
        let segment = segment.max(1);
        if self.hook.is_some() {
            let mut r = Ok(());
            for p in packets.chunks_mut(segment) {
                if let Err(e) = self.send(_src, dst, p) {
                    r = Err(e);
                }
            }
            return r;
        }
        if let Some(r) = self.send_local(dst, packets, segment) {
            return r;
        }
        let mut peers = self.peers.lock();
        let out = self.out(&mut peers, dst);
        // GSO cuts a run into datagrams with the IP ID counting up from the send's;
        // `transmit` computes each segment's ICRC with its own.
        if packets.len() <= segment || self.max_batch() == 1 {
            return self.transmit_each(&out, dst, packets, segment);
        }
        self.transmit(&out, dst, packets, segment)
    }

    fn send_two(
        &self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        first: &mut [u8],
        second: &mut [u8],
    ) -> io::Result<()> {
        if self.hook.is_some() || (dst == self.ip && self.router.is_some()) {
            let r = self.send(src, dst, first);
            return self.send(src, dst, second).and(r);
        }
        let mut peers = self.peers.lock();
        let out = self.out(&mut peers, dst);
        // Two sends: the second takes the ID after the first's.
        let next = out.ids.and_then(IpIds::next).unwrap_or(0);
        let ep = self.endpoints(dst, out.src_port);
        write_icrc(&Ipv4Endpoints { ip_id: next, ..ep }, first);
        let ip_id = if out.ids.is_some() {
            next.wrapping_add(1)
        } else {
            0
        };
        write_icrc(&Ipv4Endpoints { ip_id, ..ep }, second);
        self.apply_tos(&out);
        // One system call for both (a ping-pong's answer and the ACK of the question:
        // busy-poll send_lat, see docs/performance.md). The kernel delivers the first on
        // loopback before it takes the second, so the answer waits for nothing.
        let sent = {
            let iov = [[IoSlice::new(first)], [IoSlice::new(second)]];
            let (mut c0, mut c1) = (
                SendAncillaryBuffer::default(),
                SendAncillaryBuffer::default(),
            );
            let to = out.to.map(|a| SocketAddrV4::from(a).as_any());
            let mut msgs = match &to {
                Some(to) => [
                    MMsgHdr::new_with_addr(to, &iov[0], &mut c0),
                    MMsgHdr::new_with_addr(to, &iov[1], &mut c1),
                ],
                None => [
                    MMsgHdr::new(&iov[0], &mut c0),
                    MMsgHdr::new(&iov[1], &mut c1),
                ],
            };
            rustix::net::sendmmsg(out.socket, &mut msgs, rustix::net::SendFlags::empty())
                .unwrap_or(0)
        };
        if let Some(i) = out.ids {
            i.advance(sent as u16);
        }
        // What did not go (a full send buffer, an earlier datagram's ICMP error) goes
        // the way a single send does, which waits for room and sends again.
        let mut r = Ok(());
        if sent < 1 {
            r = self.transmit(&out, dst, first, first.len().max(1));
        }
        if sent < 2 {
            r = self.transmit(&out, dst, second, second.len().max(1)).and(r);
        }
        r
    }

    fn max_batch(&self) -> usize {
        // Interop mode and a hook see every datagram on its own.
        if self.interop() || self.hook.is_some() || self.gso_failed.load(Ordering::Relaxed) {
            1
        } else {
            self.state.max_gso_segments()
        }
    }

    fn set_traffic_class(&self, tos: u8) {
        self.tos.store(tos, Ordering::Relaxed);
    }

    fn receive_traffic_class(&self, on: bool) {
        // Interop mode reads the IP header itself.
        if self.interop() || self.tos_rx.load(Ordering::Relaxed) == on {
            return;
        }
        if rustix::net::sockopt::set_ip_recvtos(&self.socket, on).is_ok() {
            self.tos_rx.store(on, Ordering::Relaxed);
        }
    }

    fn set_multicast_groups(&self, groups: &[Ipv4Addr]) -> io::Result<()> {
        let mut joined = self.groups.lock();
        joined.retain(|(g, _)| groups.contains(g));
        for g in groups {
            if !joined.iter().any(|(j, _)| j == g) {
                let sock = self.join(*g)?;
                joined.push((*g, sock));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two links on one port, on 127.0.0.1 and 127.0.0.2.
    fn pair() -> (UdpLink, UdpLink) {
        let opts = LinkOptions::default();
        let a = UdpLink::bind(Ipv4Addr::new(127, 0, 0, 1), 0, &opts, None).unwrap();
        let b = UdpLink::bind(Ipv4Addr::new(127, 0, 0, 2), a.port(), &opts, None).unwrap();
        (a, b)
    }

    /// What `receive` got: (length, ICRC right, bytes) per datagram.
    type Got = Vec<(usize, bool, Vec<u8>)>;

    /// The source port of `a`'s datagrams to `dst`: its connected socket's, once it
    /// has sent there, or the bound one.
    fn sent_from(a: &UdpLink, dst: Ipv4Addr) -> u16 {
        a.peers
            .lock()
            .iter()
            .find(|p| p.dst == dst)
            .and_then(|p| p.socket.as_ref())
            .map_or(a.port(), |s| s.1)
    }

    /// Waits for `want` datagrams from 127.0.0.1 and receives them through `b`, with
    /// the one-slot receive of an idle poll or the batched one; also how many
    /// receives it took. Each must come from port `from`.
    fn receive(b: &UdpLink, idle: bool, want: usize, from: u16) -> (Got, usize) {
        let mut rx = b.rx_bufs();
        let mut out = Vec::new();
        let mut calls = 0;
        while out.len() < want {
            calls += 1;
            assert!(b.wait_readable(Duration::from_secs(2)), "nothing arrived");
            rx.found = if idle { 0 } else { BATCH_AFTER };
            b.recv_batch(&mut rx);
            for d in &rx.got {
                assert_eq!(*d.from.ip(), Ipv4Addr::new(127, 0, 0, 1));
                assert_eq!(d.from.port(), from);
                let bytes = rx.bytes(d);
                out.push((
                    bytes.len(),
                    b.icrc_ip_id(d, bytes, 0).is_some(),
                    bytes.to_vec(),
                ));
            }
        }
        (out, calls)
    }

    /// A run of three packets leaves as one GSO send (the last shorter) and comes back
    /// as three datagrams, whichever receive takes it, each with its ICRC right.
    #[test]
    fn a_gso_run_arrives_as_its_datagrams() {
        for idle in [true, false] {
            let (a, b) = pair();
            // Three "packets": 100, 100 and 60 bytes, ICRC slots included.
            let mut run: Vec<u8> = (0..260u32).map(|i| (i % 251) as u8).collect();
            a.send_batch(a.ip, b.ip, &mut run, 100).unwrap();
            let (got, calls) = receive(&b, idle, 3, sent_from(&a, b.ip));
            if a.max_batch() > 1 && b.state.gro_segments() > 1 {
                // GSO and GRO on: one receive took the whole run and split it by the
                // segment size the kernel reported.
                assert_eq!(calls, 1, "idle {idle}");
            }
            let lens: Vec<usize> = got.iter().map(|g| g.0).collect();
            assert_eq!(lens, [100, 100, 60], "idle {idle}");
            assert!(got.iter().all(|g| g.1), "ICRC, idle {idle}");
            let joined: Vec<u8> = got.iter().flat_map(|g| g.2.clone()).collect();
            assert_eq!(joined, run, "idle {idle}");
        }
    }

    /// A lone packet leaves with `sendto` and arrives whole, ICRC right; a corrupted
    /// byte fails the check.
    #[test]
    fn a_single_datagram_arrives_with_its_icrc() {
        let (a, b) = pair();
        let mut p = vec![7u8; 40];
        a.send(a.ip, b.ip, &mut p).unwrap();
        let (got, _) = receive(&b, true, 1, sent_from(&a, b.ip));
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0, got[0].1), (40, true));
        let mut rx = b.rx_bufs();
        let mut q = vec![9u8; 40];
        a.send(a.ip, b.ip, &mut q).unwrap();
        assert!(b.wait_readable(Duration::from_secs(2)));
        rx.found = 0;
        assert_eq!(b.recv_batch(&mut rx), 1);
        let d = rx.got[0];
        let mut bytes = rx.bytes(&d).to_vec();
        bytes[3] ^= 1;
        assert!(b.icrc_ip_id(&d, &bytes, 0).is_none());
    }

    /// Nothing waiting: the one-slot receive returns nothing and does not block.
    #[test]
    fn an_idle_receive_finds_nothing() {
        let (_a, b) = pair();
        let mut rx = b.rx_bufs();
        rx.found = 0;
        assert_eq!(b.recv_batch(&mut rx), 0);
        assert_eq!(rx.found, 0);
    }

    /// Datagrams sent one by one are read one slot at a time until three receives in
    /// a row found one; the fourth takes all that wait in one batched call.
    #[test]
    fn receives_batch_only_once_datagrams_keep_coming() {
        let (a, b) = pair();
        for n in 0..5u8 {
            let mut p = vec![n; 40];
            a.send(a.ip, b.ip, &mut p).unwrap();
        }
        let mut rx = b.rx_bufs();
        rx.found = 0;
        let mut counts = Vec::new();
        while counts.iter().sum::<usize>() < 5 {
            assert!(b.wait_readable(Duration::from_secs(2)), "nothing arrived");
            counts.push(b.recv_batch(&mut rx));
        }
        assert_eq!(counts, [1, 1, 1, 2]);
        assert_eq!(b.recv_batch(&mut rx), 0);
        assert_eq!(rx.found, 0, "an empty receive starts over");
    }

    /// Whether the socket has `UDP_GRO` on, as the kernel says.
    fn gro_on(l: &UdpLink) -> bool {
        nix::sys::socket::getsockopt(&l.socket, sockopt::UdpGroSegment).unwrap()
    }

    /// Receives until `want` datagrams came, one receive per wake-up; their lengths
    /// (each ICRC checked) and how many receives found something.
    fn take(b: &UdpLink, rx: &mut RxBufs, want: usize) -> (Vec<usize>, usize) {
        let mut lens = Vec::new();
        let mut calls = 0;
        while lens.len() < want {
            assert!(b.wait_readable(Duration::from_secs(2)), "nothing arrived");
            if b.recv_batch(rx) > 0 {
                calls += 1;
            }
            for d in &rx.got {
                assert!(
                    b.icrc_ip_id(d, rx.bytes(d), 0).is_some(),
                    "ICRC of datagram {}",
                    lens.len()
                );
                lens.push(d.len);
            }
        }
        (lens, calls)
    }

    /// Quiet traffic turns GRO off; once a receive found the socket empty, one-slot
    /// receives read with `recvfrom`, and a run sent then arrives as its datagrams
    /// (the kernel splits it). A backlog turns GRO back on, and a run then arrives in
    /// one receive again.
    #[test]
    fn gro_follows_the_traffic() {
        let (a, b) = pair();
        if b.state.gro_segments() <= 1 {
            return; // a kernel without UDP_GRO: nothing switches
        }
        let mut rx = b.rx_bufs();
        rx.found = 0;
        assert!(gro_on(&b) && rx.gro.on());
        for _ in 0..super::super::gro::QUIET - 1 {
            assert_eq!(b.recv_batch(&mut rx), 0);
        }
        assert!(gro_on(&b));
        assert_eq!(b.recv_batch(&mut rx), 0);
        assert!(!gro_on(&b) && !rx.gro.on());
        assert!(rx.gro.plain(), "the socket was empty at the switch");
        let mut p = vec![3u8; 40];
        a.send(a.ip, b.ip, &mut p).unwrap();
        assert_eq!(take(&b, &mut rx, 1), (vec![40], 1));
        assert_eq!(rx.got[0].from.port(), sent_from(&a, b.ip));
        assert_eq!(rx.bytes(&rx.got[0])[..36], p[..36]);
        let mut run: Vec<u8> = (0..260u32).map(|i| (i % 251) as u8).collect();
        a.send_batch(a.ip, b.ip, &mut run, 100).unwrap();
        rx.found = 0;
        assert_eq!(take(&b, &mut rx, 3).0, [100, 100, 60]);
        // A backlog: runs split into twelve datagrams, taken by one batched receive.
        for _ in 0..4 {
            let mut run: Vec<u8> = vec![5u8; 300];
            a.send_batch(a.ip, b.ip, &mut run, 100).unwrap();
        }
        rx.found = BATCH_AFTER;
        rx.backoff = 0;
        assert_eq!(take(&b, &mut rx, 12), (vec![100; 12], 1));
        assert!(gro_on(&b) && rx.gro.on() && !rx.gro.plain());
        let mut run: Vec<u8> = vec![6u8; 260];
        a.send_batch(a.ip, b.ip, &mut run, 100).unwrap();
        rx.found = 0;
        assert_eq!(take(&b, &mut rx, 3), (vec![100, 100, 60], 1));
    }

    /// A run queued while GRO was on cannot be split once it is off (the kernel then
    /// reports no segment size): turning GRO off with anything queued turns it back
    /// on, and the run is read right.
    #[test]
    fn gro_stays_on_while_something_is_queued() {
        let (a, b) = pair();
        if b.state.gro_segments() <= 1 {
            return;
        }
        let mut rx = b.rx_bufs();
        rx.found = 0;
        let mut run: Vec<u8> = (0..260u32).map(|i| (i % 251) as u8).collect();
        a.send_batch(a.ip, b.ip, &mut run, 100).unwrap();
        assert!(b.wait_readable(Duration::from_secs(2)));
        b.switch_gro(&mut rx.gro, false);
        assert!(gro_on(&b) && rx.gro.on() && !rx.gro.plain());
        assert_eq!(take(&b, &mut rx, 3), (vec![100, 100, 60], 1));
        b.switch_gro(&mut rx.gro, false);
        assert!(!gro_on(&b) && rx.gro.plain(), "empty now: off");
    }

    /// A batched receive that takes a single datagram (no backlog) makes the next
    /// [`BATCH_BACKOFF`] receives one-slot, however many in a row find datagrams;
    /// then batching resumes.
    #[test]
    fn a_batch_without_backlog_backs_off() {
        let (a, b) = pair();
        let mut rx = b.rx_bufs();
        let send = |n: u8| {
            for i in 0..n {
                let mut p = vec![i; 40];
                a.send(a.ip, b.ip, &mut p).unwrap();
            }
        };
        send(1);
        assert!(b.wait_readable(Duration::from_secs(2)));
        rx.found = BATCH_AFTER;
        assert_eq!(b.recv_batch(&mut rx), 1);
        assert_eq!(rx.backoff, BATCH_BACKOFF);
        send(5);
        let mut counts = Vec::new();
        while counts.iter().sum::<usize>() < 5 {
            assert!(b.wait_readable(Duration::from_secs(2)), "nothing arrived");
            counts.push(b.recv_batch(&mut rx));
        }
        assert_eq!(counts, [1, 1, 1, 1, 1]);
        assert_eq!(rx.backoff, BATCH_BACKOFF - 5);
        // Once the backoff has run out, the streak (still going) batches again.
        rx.backoff = 0;
        send(5);
        let mut counts = Vec::new();
        while counts.iter().sum::<usize>() < 5 {
            assert!(b.wait_readable(Duration::from_secs(2)), "nothing arrived");
            counts.push(b.recv_batch(&mut rx));
        }
        assert_eq!(counts, [5]);
    }

    /// `send_two` delivers two datagrams in order, each with its own ICRC, from the
    /// peer's connected socket.
    #[test]
    fn send_two_sends_both_in_order() {
        let (a, b) = pair();
        let mut first = vec![1u8; 40];
        let mut second = vec![2u8; 28];
        a.send_two(a.ip, b.ip, &mut first, &mut second).unwrap();
        let (got, _) = receive(&b, true, 2, sent_from(&a, b.ip));
        let lens: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(lens, [40, 28]);
        assert!(got.iter().all(|g| g.1), "ICRC");
        assert_eq!(got[0].2[..36], [1u8; 36]);
        assert_eq!(got[1].2[..24], [2u8; 24]);
    }

    /// Sends to a peer leave from one connected socket of their own (an ephemeral
    /// port, which the ICRC covers); with a hook they leave from the bound socket.
    #[test]
    fn sends_to_a_peer_leave_from_its_connected_socket() {
        let (a, b) = pair();
        for n in 0..3u8 {
            let mut p = vec![n; 40];
            a.send(a.ip, b.ip, &mut p).unwrap();
        }
        let port = sent_from(&a, b.ip);
        assert_ne!(port, a.port());
        let (got, _) = receive(&b, true, 3, port);
        assert!(got.iter().all(|g| g.1), "ICRC");
        assert_eq!(a.peers.lock().len(), 1);

        #[derive(Debug)]
        struct Pass;
        impl PacketHook for Pass {
            fn on_send(&self, _: Ipv4Addr, _: &[u8]) -> Verdict {
                Verdict::Pass
            }
            fn on_receive(&self, _: SocketAddrV4, _: Option<u16>, _: &[u8]) -> Verdict {
                Verdict::Pass
            }
        }
        let opts = LinkOptions {
            hook: Some(Arc::new(Pass)),
            ..LinkOptions::default()
        };
        let h = UdpLink::bind(Ipv4Addr::new(127, 0, 0, 1), 0, &opts, None).unwrap();
        let c = UdpLink::bind(Ipv4Addr::new(127, 0, 0, 2), h.port(), &opts, None).unwrap();
        let mut p = vec![1u8; 40];
        h.send(h.ip, c.ip, &mut p).unwrap();
        let (got, _) = receive(&c, true, 1, h.port());
        assert!(got[0].1, "ICRC");
        assert!(h.peers.lock().is_empty());
    }

    /// A peer whose port closed: the connected socket reports the ICMP error on a
    /// later send, which the link sends again; once the peer is back, datagrams arrive.
    #[test]
    fn a_closed_peer_port_loses_only_datagrams() {
        let opts = LinkOptions::default();
        let a = UdpLink::bind(Ipv4Addr::new(127, 0, 0, 1), 0, &opts, None).unwrap();
        let gone = Ipv4Addr::new(127, 0, 0, 3);
        for _ in 0..3 {
            let mut p = vec![5u8; 40];
            a.send(a.ip, gone, &mut p).unwrap();
            // Let the port unreachable come back before the next send.
            std::thread::sleep(Duration::from_millis(20));
        }
        let c = UdpLink::bind(gone, a.port(), &opts, None).unwrap();
        let mut p = vec![6u8; 40];
        a.send(a.ip, gone, &mut p).unwrap();
        let mut rx = c.rx_bufs();
        assert!(c.wait_readable(Duration::from_secs(2)), "nothing arrived");
        rx.found = 0;
        assert_eq!(c.recv_batch(&mut rx), 1);
        let d = rx.got[0];
        assert_eq!(d.from.port(), sent_from(&a, gone));
        assert!(c.icrc_ip_id(&d, rx.bytes(&d), 0).is_some());
    }

    /// At most `MAX_PEER_SOCKETS` peers get a socket of their own; the rest are sent
    /// to from the bound socket.
    /// The receive guesses the ID after the last one from the same sender (a connected
    /// socket, a GSO run), 0 after a 0 (an unconnected socket) or from another sender.
    #[test]
    fn the_next_ip_id_is_guessed_from_the_last() {
        let (a, _) = pair();
        let mut rx = a.rx_bufs();
        let (x, y) = (
            SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 9), 1000),
            SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 9), 1001),
        );
        assert_eq!(rx.guess_ip_id(x), 0);
        rx.saw_ip_id(x, 41);
        assert_eq!((rx.guess_ip_id(x), rx.guess_ip_id(y)), (42, 0));
        rx.saw_ip_id(x, 0xFFFF);
        assert_eq!(rx.guess_ip_id(x), 0);
        rx.saw_ip_id(y, 0);
        assert_eq!((rx.guess_ip_id(y), rx.guess_ip_id(x)), (0, 0));
    }

    /// A packet a hook delays still leaves after its link closed, and the link's
    /// address can be bound again at once (the delayed send does not hold it).
    #[test]
    fn a_delayed_packet_does_not_keep_the_address() {
        #[derive(Debug)]
        struct Later;
        impl PacketHook for Later {
            fn on_send(&self, _: Ipv4Addr, _: &[u8]) -> Verdict {
                Verdict::Delay(Duration::from_millis(300))
            }
            fn on_receive(&self, _: SocketAddrV4, _: Option<u16>, _: &[u8]) -> Verdict {
                Verdict::Pass
            }
        }
        let opts = LinkOptions {
            hook: Some(Arc::new(Later)),
            ..LinkOptions::default()
        };
        let ip = Ipv4Addr::new(127, 0, 0, 71);
        let peer = UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 72), 0)).unwrap();
        let a = UdpLink::bind(ip, peer.local_addr().unwrap().port(), &opts, None).unwrap();
        let port = a.port();
        let mut p = vec![0u8; 64];
        let n = emu_wire::PacketRepr::new(emu_wire::Opcode::UdSendOnly, 1, emu_wire::Psn::new(0))
            .emit(&mut p, b"late");
        p.truncate(n);
        a.send(ip, Ipv4Addr::new(127, 0, 0, 72), &mut p).unwrap();
        drop(a);
        let again = UdpLink::bind(ip, port, &opts, None);
        assert!(again.is_ok(), "{:?}", again.err());
        let mut buf = [0u8; 128];
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        let SocketAddr::V4(from) = from else { panic!() };
        let ep = Ipv4Endpoints {
            src: ip,
            dst: Ipv4Addr::new(127, 0, 0, 72),
            ip_id: 0,
            src_port: from.port(),
            dst_port: peer.local_addr().unwrap().port(),
        };
        assert!(check_icrc(&ep, &buf[..n]), "the delayed packet's ICRC");
    }

    #[test]
    fn peer_sockets_are_capped() {
        let a = UdpLink::bind(
            Ipv4Addr::new(127, 0, 0, 1),
            0,
            &LinkOptions::default(),
            None,
        )
        .unwrap();
        let n = MAX_PEER_SOCKETS as u8 + 4;
        for i in 1..=n {
            let mut p = vec![i; 40];
            a.send(a.ip, Ipv4Addr::new(127, 0, 1, i), &mut p).unwrap();
        }
        assert_eq!(a.peers.lock().len(), MAX_PEER_SOCKETS);
        assert_ne!(sent_from(&a, Ipv4Addr::new(127, 0, 1, 1)), a.port());
        assert_eq!(sent_from(&a, Ipv4Addr::new(127, 0, 1, n)), a.port());
    }
}
