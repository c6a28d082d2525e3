//! The link of a real deployment: RoCEv2 datagrams over UDP, with their ICRC computed
//! on send and checked on receive. `UdpLink` is one bound socket of a device address
//! (a [`Link`] that sends); `DeviceLink` (`device`) is the device's link built on it,
//! with the receive buffers, the share of the address and the extra addresses of a
//! device on both families, and what `Link::receive` does. Receiving off the socket is
//! in `recv`, sending in `send`, and what devices sharing an address pass on to each
//! other in `inbox`.
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
//! one-slot receive are nix's `sendto`, `sendmsg`, `sendmmsg` and `recvmsg`, with no
//! control message but `UDP_SEGMENT`/`UDP_GRO` (quinn-udp adds
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
//! Over IPv6 (a device whose address is IPv6) the sockets are `AF_INET6` (IPv6 only)
//! and the ICRC covers the IPv6 header, which has no identification field: nothing is
//! probed or solved, the ICRC is checked with the addresses and ports alone
//! ([`emu_wire::check_icrc_v6`]). The interop mode's raw socket and the fault hook read
//! and write IPv4 headers only: on an IPv6 address they are `Unsupported`.
//!
//! Sends to a unicast peer leave from a socket of their own, connected to the peer
//! (`peers`; at most [`MAX_PEER_SOCKETS`]): the kernel keeps the route of a connected
//! socket, where an unconnected `sendto` looks it up on every call, a tenth of a
//! loopback half round trip (`bench send_lat`). Its source port is an ephemeral one, as rxe's is a
//! per-QP hash. Where the kernel does not tell a connected socket's IDs, its peer gets
//! the bound socket. Interop mode and a fault hook send every datagram from the bound
//! socket.

mod device;
mod inbox;
mod recv;
mod send;

use std::io::{self};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nix::sys::socket::{setsockopt, sockopt};
use quinn_udp::{UdpSockRef, UdpSocketState};
use socket2::{Domain, Protocol, Socket, Type};

use crate::nic::drops::KernelDrops;
use crate::nic::interop::{LinkOptions, PacketHook};
use crate::nic::share;

use super::link::{Link, Transmit};
pub(crate) use device::DeviceLink;
pub(crate) use recv::RxBufs;
use send::PeerSocket;

/// Socket buffer size asked for (the kernel may cap it at net.core.*mem_max).
const SOCKET_BUFFER: usize = 8 << 20;

/// Asks for a [`SOCKET_BUFFER`] receive buffer: forced past net.core.rmem_max when
/// privileged, else what the cap allows.
fn large_recv_buffer(s: &Socket) {
    if setsockopt(s, sockopt::RcvBufForce, &SOCKET_BUFFER).is_err() {
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    }
}

/// Asks for a [`SOCKET_BUFFER`] send buffer, as [`large_recv_buffer`] does.
fn large_send_buffer(s: &Socket) {
    if setsockopt(s, sockopt::SndBufForce, &SOCKET_BUFFER).is_err() {
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    }
}

/// The sender of a datagram that is no longer to be handed to the engine (a bad ICRC,
/// passed on to another device): `0.0.0.0:0`.
pub(crate) const NOWHERE: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

/// The most UDP payload one GSO send may carry: an IPv4 datagram is at most 65535
/// bytes, less 20 of IP header and 8 of UDP header.
pub(crate) const GSO_MAX_BYTES: usize = 65_535 - 28;

/// Multicast groups one UDP device joins at most. Each takes a socket (an open file) of
/// its own, and a Linux socket joins at most `net.ipv4.igmp_max_memberships` groups (20
/// by default), so sharing sockets would not reach far either; 256 keeps a process with
/// a few devices inside the usual limit of 1,024 open files.
pub(crate) const MAX_GROUPS: u32 = 256;

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
    ip: IpAddr,
    /// The index of the interface that holds `ip` (0 when unknown): the scope of a
    /// link-local IPv6 address, the interface IPv6 multicast groups are joined on.
    ifindex: u32,
    port: u16,
    groups: parking_lot::Mutex<Vec<(IpAddr, UdpSocket)>>,
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
    /// The TOS byte of the run being sent ([`Route::tos`]).
    tos: AtomicU8,
    /// The TOS byte the bound socket sends with now.
    bound_tos: AtomicU8,
    /// Receives tell each datagram's TOS byte ([`Link::receive_traffic_class`]): the
    /// socket has `IP_RECVTOS` on, and every receive is a one-slot `recvmsg`, whose
    /// control messages nix parses (quinn-udp's batched receive keeps only the ECN
    /// bits, and `recvfrom` has no control messages).
    tos_rx: AtomicBool,
}

impl UdpLink {
    /// Binds `ip:port` with DF set (IP ID 0), large buffers, GRO on where the kernel
    /// has it, and non-blocking I/O; with an `inbox`, shares the port with the other
    /// devices of the address (`SO_REUSEPORT`, see `share`); in interop mode
    /// (`opts.raw_receive`) also opens the raw receive socket.
    pub(crate) fn bind(
        ip: IpAddr,
        port: u16,
        opts: &LinkOptions,
        inbox: Option<UdpSocket>,
    ) -> io::Result<Self> {
        if ip.is_ipv6() && (opts.raw_receive || opts.hook.is_some()) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "interop mode and packet hooks read IPv4 headers only",
            ));
        }
        let ifindex = interface_index(ip);
        let s = Socket::new(domain(ip), Type::DGRAM, Some(Protocol::UDP))?;
        if ip.is_ipv6() {
            s.set_only_v6(true)?;
        }
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
        match ip {
            IpAddr::V4(v4) => {
                if !v4.is_unspecified() {
                    s.set_multicast_if_v4(&v4)?;
                }
                s.set_multicast_loop_v4(true)?;
            }
            IpAddr::V6(_) => {
                if ifindex != 0 {
                    s.set_multicast_if_v6(ifindex)?;
                }
                s.set_multicast_loop_v6(true)?;
            }
        }
        s.bind(&sock_addr(ip, port, ifindex).into())?;
        let socket: UdpSocket = s.into();
        // quinn-udp turns GRO on, makes the socket non-blocking, and sets path MTU
        // discovery to "probe"; DF with IP ID 0 needs "do", so set it after (IPv6:
        // no fragmenting on the host either, as an IPv4 DF sender).
        let state = UdpSocketState::new(UdpSockRef::from(&socket))?;
        dont_fragment(&socket, ip)?;
        // quinn-udp also asks for every datagram's TOS byte (for ECN) and destination
        // address, which nothing here reads (a datagram on this socket is for our
        // address; groups have their own sockets): two control messages less for the
        // kernel to write per receive.
        if ip.is_ipv6() {
            accept_zero_checksum(&socket)?;
            let _ = setsockopt(&socket, sockopt::Ipv6RecvTClass, &false);
            let _ = setsockopt(&socket, sockopt::Ipv6RecvPacketInfo, &false);
        } else {
            let _ = setsockopt(&socket, sockopt::IpRecvTos, &false);
            let _ = setsockopt(&socket, sockopt::Ipv4PacketInfo, &false);
        }
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
            ifindex,
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

    /// A non-blocking socket on `group:port` that has joined `group` on the interface
    /// of our address. `Unsupported` for a group of the other family.
    fn join(&self, group: IpAddr) -> io::Result<UdpSocket> {
        let s = Socket::new(domain(group), Type::DGRAM, Some(Protocol::UDP))?;
        s.set_reuse_address(true)?;
        match (group, self.ip) {
            (IpAddr::V4(g), IpAddr::V4(me)) => {
                s.bind(&SocketAddr::V4(SocketAddrV4::new(g, self.port)).into())?;
                s.join_multicast_v4(&g, &me)?;
            }
            (IpAddr::V6(g), IpAddr::V6(_)) => {
                s.set_only_v6(true)?;
                s.bind(&SocketAddr::V6(SocketAddrV6::new(g, self.port, 0, self.ifindex)).into())?;
                s.join_multicast_v6(&g, self.ifindex)?;
                accept_zero_checksum(&s)?;
            }
            _ => return Err(io::ErrorKind::Unsupported.into()),
        }
        s.set_nonblocking(true)?;
        Ok(s.into())
    }

    /// The socket address of `ip` on `port` (a link-local IPv6 address scoped to our
    /// interface).
    pub(super) fn sock_addr(&self, ip: IpAddr, port: u16) -> SocketAddr {
        sock_addr(ip, port, self.ifindex)
    }

    /// The bound port (useful when bound to port 0).
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Link for UdpLink {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn send(&self, runs: &mut [Transmit<'_>]) -> io::Result<()> {
        if let [first, second] = runs {
            if first.count() == 1 && second.count() == 1 && first.route == second.route {
                return self.send_two(first.route, first.contents, second.contents);
            }
        }
        let mut r = Ok(());
        for t in runs {
            if let Err(e) = self.send_run(t) {
                r = Err(e);
            }
        }
        r
    }

    fn max_segments(&self) -> usize {
        // Interop mode and a hook see every datagram on its own.
        if self.interop() || self.hook.is_some() || self.gso_failed.load(Ordering::Relaxed) {
            1
        } else {
            self.state.max_gso_segments()
        }
    }

    fn receive_traffic_class(&self, on: bool) {
        // Interop mode reads the IP header itself.
        if self.interop() || self.tos_rx.load(Ordering::Relaxed) == on {
            return;
        }
        let set = match self.ip {
            IpAddr::V4(_) => setsockopt(&self.socket, sockopt::IpRecvTos, &on),
            IpAddr::V6(_) => setsockopt(&self.socket, sockopt::Ipv6RecvTClass, &on),
        };
        if set.is_ok() {
            self.tos_rx.store(on, Ordering::Relaxed);
        }
    }

    fn max_multicast_groups(&self) -> Option<u32> {
        Some(MAX_GROUPS)
    }

    fn join_multicast_group(&self, group: IpAddr) -> io::Result<()> {
        let mut joined = self.groups.lock();
        if !joined.iter().any(|(g, _)| *g == group) {
            let sock = self.join(group)?;
            joined.push((group, sock));
        }
        Ok(())
    }

    fn leave_multicast_group(&self, group: IpAddr) {
        self.groups.lock().retain(|(g, _)| *g != group);
    }
}

/// The socket domain of `ip`'s family.
fn domain(ip: IpAddr) -> Domain {
    match ip {
        IpAddr::V4(_) => Domain::IPV4,
        IpAddr::V6(_) => Domain::IPV6,
    }
}

/// `ip:port`, with the scope `ifindex` for a link-local IPv6 address (RFC 4007: an
/// `fe80::/10` address means something only on its interface).
pub(super) fn sock_addr(ip: IpAddr, port: u16, ifindex: u32) -> SocketAddr {
    match ip {
        IpAddr::V4(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
        IpAddr::V6(v6) => {
            let scope = if v6.is_unicast_link_local() {
                ifindex
            } else {
                0
            };
            SocketAddr::V6(SocketAddrV6::new(v6, port, 0, scope))
        }
    }
}

/// The index of the interface holding `ip`, 0 when none does (or it cannot be told).
fn interface_index(ip: IpAddr) -> u32 {
    crate::nic::netdev::interface_of(ip)
        .and_then(|name| nix::net::if_::if_nametoindex(name.as_str()).ok())
        .unwrap_or(0)
}

/// Path MTU discovery "do" on `socket`: IPv4 datagrams carry DF (and, unconnected, IP
/// ID 0; see `ip_id`), IPv6 ones are never fragmented by the sending host. A datagram
/// larger than the path is refused with EMSGSIZE, as a RoCE NIC drops it.
pub(super) fn dont_fragment(socket: &UdpSocket, ip: IpAddr) -> io::Result<()> {
    match ip {
        IpAddr::V4(_) => setsockopt(socket, IpMtuDiscover, &libc::IP_PMTUDISC_DO)?,
        IpAddr::V6(_) => setsockopt(socket, Ipv6MtuDiscover, &libc::IPV6_PMTUDISC_DO)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests;

use nix::{setsockopt_impl, sockopt_impl};
// Options nix does not list: `UDP_NO_CHECK6_RX` (udp(7)) and path MTU discovery
// (`IP_MTU_DISCOVER`, ip(7); `IPV6_MTU_DISCOVER`, ipv6(7)). `sockopt_impl!` is nix's
// public way to add an option: it expands to nix's own `setsockopt` call with the
// `c_int` its `SetBool` or `SetStruct<c_int>` holds, the code of every boolean and
// integer option nix ships, so nothing unsafe is written here.
sockopt_impl!(
    /// Accept UDP/IPv6 datagrams whose checksum is 0.
    UdpNoCheck6Rx,
    SetOnly,
    libc::SOL_UDP,
    libc::UDP_NO_CHECK6_RX,
    bool
);
sockopt_impl!(
    /// Path MTU discovery of an IPv4 socket (`IP_PMTUDISC_*`).
    IpMtuDiscover,
    SetOnly,
    libc::IPPROTO_IP,
    libc::IP_MTU_DISCOVER,
    libc::c_int
);
sockopt_impl!(
    /// Path MTU discovery of an IPv6 socket (`IPV6_PMTUDISC_*`).
    Ipv6MtuDiscover,
    SetOnly,
    libc::IPPROTO_IPV6,
    libc::IPV6_MTU_DISCOVER,
    libc::c_int
);

/// Lets `socket` (IPv6) take datagrams with UDP checksum 0, which RFC 8200 section 8.1
/// otherwise makes a receiver drop. Kernel rxe (6.1) sends its RoCEv2 datagrams over
/// IPv6 so (docs/interop.md shows the capture), and so may other RoCE senders:
/// RoCEv2's ICRC covers the datagram end to end (Annex A17.4), and the device checks
/// it on every packet, so a zero checksum loses nothing. Datagrams with a checksum are
/// still checked by the kernel.
fn accept_zero_checksum(socket: &impl AsFd) -> io::Result<()> {
    setsockopt(socket, UdpNoCheck6Rx, &true).map_err(io::Error::from)
}
