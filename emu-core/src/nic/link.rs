//! Links: what carries an emulated device's packets and tells its time. [`Link`] is
//! the interface (a simulated fabric implements it too); `UdpLink` is the real one: one
//! socket per device, RoCEv2 datagrams with their ICRC computed on send and checked on
//! receive.
//!
//! The ICRC covers the IPv4 header, identification field included (Annex A17.4), which
//! a UDP socket does not choose. Measured on Linux (docs/roce-wire.md): an unconnected
//! UDP socket with `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (DF set) sends every datagram with
//! IP ID 0, so the sender computes the exact on-wire ICRC with ID 0, and a receiver
//! that only sees the UDP payload can recompute it with ID 0. This is exact between
//! emulated devices; a real rxe peer uses non-zero IDs (see the interop issue).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use emu_wire::{check_icrc, write_icrc, Ipv4Endpoints};
use socket2::{Domain, Protocol, Socket, Type};

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

    /// Called when the application found nothing to do: an empty `poll_cq`, or a wait
    /// for a completion event or an async event with nothing queued. A link with
    /// virtual time moves the network on (delivers the next packet, fires the next
    /// timer) and returns true if anything happened; a real link returns false and
    /// the caller waits in real time.
    fn idle(&self) -> bool {
        false
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
    socket: UdpSocket,
    ip: Ipv4Addr,
    port: u16,
    groups: parking_lot::Mutex<Vec<(Ipv4Addr, UdpSocket)>>,
}

impl UdpLink {
    /// Binds `ip:port` with DF set (IP ID 0) and large buffers.
    pub(crate) fn bind(ip: Ipv4Addr, port: u16) -> io::Result<Self> {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        // Large buffers keep a briefly starved device thread from losing datagrams (which
        // costs RC a retransmission and UC a message). SO_*BUFFORCE passes the
        // net.core.*mem_max cap when privileged; otherwise the capped size is used.
        if rustix::net::sockopt::set_socket_recv_buffer_size_force(&s, SOCKET_BUFFER).is_err() {
            let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
        }
        if rustix::net::sockopt::set_socket_send_buffer_size_force(&s, SOCKET_BUFFER).is_err() {
            let _ = s.set_send_buffer_size(SOCKET_BUFFER);
        }
        rustix::net::sockopt::set_ip_mtu_discover(
            &s,
            rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
        )?;
        // Multicast sends leave through our own address's interface, TTL 1, and are
        // looped back to the host's other members.
        if !ip.is_unspecified() {
            s.set_multicast_if_v4(&ip)?;
        }
        s.set_multicast_loop_v4(true)?;
        s.bind(&SocketAddr::V4(SocketAddrV4::new(ip, port)).into())?;
        let socket: UdpSocket = s.into();
        let port = socket.local_addr()?.port();
        Ok(UdpLink {
            socket,
            ip,
            port,
            groups: parking_lot::Mutex::new(Vec::new()),
        })
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

    /// Receives, without blocking, up to `slots.len()` datagrams waiting on the group
    /// sockets; `got` gets (length, source, group) per filled slot.
    pub(crate) fn recv_groups(
        &self,
        slots: &mut [Vec<u8>],
        got: &mut Vec<(usize, SocketAddrV4, Ipv4Addr)>,
    ) {
        let groups = self.groups.lock();
        for (group, sock) in groups.iter() {
            while got.len() < slots.len() {
                match sock.recv_from(&mut slots[got.len()]) {
                    Ok((n, SocketAddr::V4(from))) => got.push((n, from, *group)),
                    _ => break,
                }
            }
        }
    }

    /// The bound port (useful when bound to port 0).
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Fills in the ICRC and sends `packet` to `dst` at the same port as ours (every
    /// device of a deployment uses one port, 4791 unless configured).
    fn send_to(&self, dst: Ipv4Addr, packet: &mut [u8]) -> io::Result<()> {
        let ep = Ipv4Endpoints {
            src: self.ip,
            dst,
            ip_id: 0,
            src_port: self.port,
            dst_port: self.port,
        };
        write_icrc(&ep, packet);
        self.socket
            .send_to(packet, SocketAddrV4::new(dst, self.port))
            .map(|_| ())
    }

    /// Waits up to `timeout` for a datagram; returns its length and source, or `None`
    /// when the time ran out.
    pub(crate) fn recv(
        &self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> io::Result<Option<(usize, SocketAddrV4)>> {
        self.socket
            .set_read_timeout(Some(timeout.max(Duration::from_micros(1))))?;
        self.recv_inner(buf)
    }

    /// A datagram if one is waiting, without blocking.
    pub(crate) fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddrV4)>> {
        self.socket.set_nonblocking(true)?;
        let r = self.recv_inner(buf);
        self.socket.set_nonblocking(false)?;
        r
    }

    fn recv_inner(&self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddrV4)>> {
        match self.socket.recv_from(buf) {
            Ok((n, SocketAddr::V4(from))) => Ok(Some((n, from))),
            Ok((_, SocketAddr::V6(_))) => Ok(None),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the ICRC of a datagram from `from` to `dst` (our address or a group) is
    /// right.
    pub(crate) fn icrc_ok(&self, from: SocketAddrV4, dst: Ipv4Addr, packet: &[u8]) -> bool {
        let ep = Ipv4Endpoints {
            src: *from.ip(),
            dst,
            ip_id: 0,
            src_port: from.port(),
            dst_port: self.port,
        };
        check_icrc(&ep, packet)
    }
}

impl Link for UdpLink {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn send(&self, _src: Ipv4Addr, dst: Ipv4Addr, packet: &mut [u8]) -> io::Result<()> {
        self.send_to(dst, packet)
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
