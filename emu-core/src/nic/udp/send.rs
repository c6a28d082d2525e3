//! Sending: each datagram sealed with the ICRC of the IP ID it will carry, from the
//! socket connected to its peer or the bound one, runs as one GSO send.

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU8, Ordering};

use emu_wire::{write_icrc, write_icrc_v6, Ipv4Endpoints, Ipv6Endpoints};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use nix::sys::socket::{
    setsockopt, sockopt, ControlMessage, MsgFlags, MultiHeaders, SockaddrIn, SockaddrIn6,
};
use socket2::{Protocol, Socket, Type};

use crate::nic::interop::{PacketHook, Verdict};
use crate::nic::ip_id::{self, IpIds};

use super::{domain, dont_fragment, large_send_buffer, UdpLink};
use crate::nic::link::{Link, Route, Transmit};

/// How many peers get a connected send socket of their own (see the module docs); sends
/// to any further peer leave from the bound socket. A file descriptor each: a process
/// with many fully meshed devices must not run out of them.
pub(super) const MAX_PEER_SOCKETS: usize = 16;

/// A send-only socket connected to one peer's `ip:port` (see the module docs), or
/// `None` where making one failed (the bound socket sends then).
#[derive(Debug)]
pub(super) struct PeerSocket {
    pub(super) dst: IpAddr,
    pub(super) socket: Option<(UdpSocket, u16)>,
    /// The TOS byte the socket sends with now.
    pub(super) tos: AtomicU8,
    /// The IP ID of the socket's next datagram (see `ip_id`).
    pub(super) ids: IpIds,
}

/// Where a datagram leaves from: a socket, the address to give `sendto` (none for a
/// connected socket), and the source port the ICRC covers.
pub(super) struct Out<'a> {
    pub(super) socket: &'a UdpSocket,
    pub(super) to: Option<SocketAddr>,
    pub(super) src_port: u16,
    /// The TOS byte `socket` sends with now (`IP_TOS`).
    pub(super) tos: &'a AtomicU8,
    /// The IP IDs of a connected socket; none for the bound one, which sends with ID 0,
    /// and over IPv6, which has no IP ID.
    pub(super) ids: Option<&'a IpIds>,
}

/// The fields the ICRC of a packet we send covers, for the device's address family:
/// over IPv4 the IP ID is given per packet, over IPv6 there is none.
#[derive(Clone, Copy, Debug)]
pub(super) enum Seal {
    V4(Ipv4Endpoints),
    V6(Ipv6Endpoints),
}

impl Seal {
    /// Writes the ICRC of `p` as sent with IPv4 identification `ip_id` (ignored over
    /// IPv6).
    #[inline]
    pub(super) fn write(&self, ip_id: u16, p: &mut [u8]) {
        match self {
            Seal::V4(ep) => write_icrc(&Ipv4Endpoints { ip_id, ..*ep }, p),
            Seal::V6(ep) => write_icrc_v6(ep, p),
        }
    }
}

/// `sendto` of `buf` from `fd` to `to`, of either family.
fn send_to(fd: i32, buf: &[u8], to: &SocketAddr) -> nix::Result<usize> {
    match to {
        SocketAddr::V4(a) => {
            nix::sys::socket::sendto(fd, buf, &SockaddrIn::from(*a), MsgFlags::empty())
        }
        SocketAddr::V6(a) => {
            nix::sys::socket::sendto(fd, buf, &SockaddrIn6::from(*a), MsgFlags::empty())
        }
    }
}

thread_local! {
    /// The message headers of [`send_pair`], made once per thread: nix fills them in
    /// on every call, and making them allocates.
    static PAIR: RefCell<MultiHeaders<()>> = RefCell::new(MultiHeaders::preallocate(2, None));
}

/// `sendmmsg` of `first`, then `second`, on the connected `socket`: how many left (0
/// on an error). Without addresses (`()`): nix's results read each message's address
/// back, which only a receive writes; an empty one has nothing to read.
fn send_pair(socket: &UdpSocket, first: &[u8], second: &[u8]) -> usize {
    let iov = [[IoSlice::new(first)], [IoSlice::new(second)]];
    PAIR.with_borrow_mut(|headers| {
        nix::sys::socket::sendmmsg(
            socket.as_raw_fd(),
            headers,
            &iov,
            [None::<()>, None],
            [] as [ControlMessage<'_>; 0],
            MsgFlags::empty(),
        )
        .map_or(0, Iterator::count)
    })
}

/// `sendmsg` of a GSO run (`UDP_SEGMENT` of `gso` bytes) from `fd`, to `to` or the
/// connected peer.
fn send_gso(fd: i32, contents: &[u8], gso: u16, to: Option<&SocketAddr>) -> nix::Result<usize> {
    let iov = [IoSlice::new(contents)];
    let cmsg = [ControlMessage::UdpGsoSegments(&gso)];
    match to {
        None => nix::sys::socket::sendmsg::<SockaddrIn>(fd, &iov, &cmsg, MsgFlags::empty(), None),
        Some(SocketAddr::V4(a)) => nix::sys::socket::sendmsg(
            fd,
            &iov,
            &cmsg,
            MsgFlags::empty(),
            Some(&SockaddrIn::from(*a)),
        ),
        Some(SocketAddr::V6(a)) => nix::sys::socket::sendmsg(
            fd,
            &iov,
            &cmsg,
            MsgFlags::empty(),
            Some(&SockaddrIn6::from(*a)),
        ),
    }
}

impl UdpLink {
    /// The bound socket, as the way out to `dst` (interop mode, a hook, multicast).
    pub(super) fn bound_out(&self, dst: IpAddr) -> Out<'_> {
        Out {
            socket: &self.socket,
            to: Some(self.sock_addr(dst, self.port)),
            src_port: self.port,
            tos: &self.bound_tos,
            ids: None,
        }
    }

    /// The way out to `dst` with the connected sockets of `peers` (made on the first
    /// send to a unicast peer; see the module docs).
    pub(super) fn out<'a>(&'a self, peers: &'a mut Vec<PeerSocket>, dst: IpAddr) -> Out<'a> {
        let broadcast = match dst {
            IpAddr::V4(d) => d.is_broadcast(),
            IpAddr::V6(_) => false,
        };
        let direct = !self.interop()
            && self.hook.is_none()
            && !self.ip.is_unspecified()
            && !dst.is_multicast()
            && !broadcast
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
        if let (Some((socket, port)), IpAddr::V4(ip)) = (&peer.socket, self.ip) {
            if peer.ids.next().is_none() {
                // A send failed after the kernel may have numbered it: ask again, or
                // send from the bound socket from now on.
                match ip_id::probe(socket, ip, *port) {
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
                ids: self.ip.is_ipv4().then_some(&peer.ids),
            },
            None => self.bound_out(dst),
        }
    }

    /// A send-only socket on our address (an ephemeral port), connected to `dst` on
    /// the device port, with the bound socket's DF and send buffer; its port and the IP
    /// ID of its first datagram (0 over IPv6, which has none). An error when the kernel
    /// does not tell the ID.
    pub(super) fn connect_to(&self, dst: IpAddr) -> io::Result<(UdpSocket, u16, u16)> {
        let s = Socket::new(domain(self.ip), Type::DGRAM, Some(Protocol::UDP))?;
        if self.ip.is_ipv6() {
            s.set_only_v6(true)?;
        }
        large_send_buffer(&s);
        // Nothing is sent to it: the smallest receive buffer the kernel allows.
        let _ = s.set_recv_buffer_size(1);
        s.bind(&self.sock_addr(self.ip, 0).into())?;
        s.connect(&self.sock_addr(dst, self.port).into())?;
        s.set_nonblocking(true)?;
        let socket: UdpSocket = s.into();
        dont_fragment(&socket, self.ip)?;
        let port = socket.local_addr()?.port();
        let IpAddr::V4(ip) = self.ip else {
            return Ok((socket, port, 0));
        };
        let next = ip_id::probe(&socket, ip, port).ok_or_else(|| {
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
    pub(super) fn seal(&self, out: &Out<'_>, dst: IpAddr, contents: &mut [u8], segment: usize) {
        let first = out.ids.and_then(IpIds::next).unwrap_or(0);
        let seal = self.endpoints(dst, out.src_port);
        for (k, p) in contents.chunks_mut(segment.max(1)).enumerate() {
            seal.write(first.wrapping_add(k as u16), p);
        }
    }

    /// Writes the ICRCs of `contents` and hands it to the kernel through `out` (as GSO
    /// segments of `segment` bytes when it holds more than one); waits for room in the
    /// socket buffer if it is full.
    pub(super) fn transmit(
        &self,
        out: &Out<'_>,
        dst: IpAddr,
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
                send_gso(fd, contents, segment as u16, out.to.as_ref())
            } else if let Some(to) = &out.to {
                send_to(fd, contents, to)
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
                    let mut fds = [PollFd::new(out.socket.as_fd(), PollFlags::POLLOUT)];
                    let _ = nix::poll::poll(&mut fds, 1u8);
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
    /// traffic class). The IPv4 TOS byte and the IPv6 traffic class do not enter the
    /// ICRC (IBTA Annex A17.4.5.1 masks them).
    pub(super) fn apply_tos(&self, out: &Out<'_>) {
        let want = self.tos.load(Ordering::Relaxed);
        if out.tos.load(Ordering::Relaxed) != want {
            let set = match self.ip {
                IpAddr::V4(_) => setsockopt(out.socket, sockopt::Ipv4Tos, &i32::from(want)),
                IpAddr::V6(_) => setsockopt(out.socket, sockopt::Ipv6TClass, &i32::from(want)),
            };
            if set.is_ok() {
                out.tos.store(want, Ordering::Relaxed);
            }
        }
    }

    /// Sends the `segment`-byte packets of `contents` (the last may be shorter) one
    /// datagram each; the last error, if any.
    pub(super) fn transmit_each(
        &self,
        out: &Out<'_>,
        dst: IpAddr,
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
    pub(super) fn send_hooked(
        &self,
        hook: &dyn PacketHook,
        dst: IpAddr,
        packet: &mut [u8],
    ) -> io::Result<()> {
        // A hook sends from the bound socket (see `out`), whose datagrams carry IP ID 0;
        // hooks see IPv4 only (`UdpLink::bind` refuses one on an IPv6 address).
        let IpAddr::V4(dst4) = dst else {
            return Err(io::ErrorKind::Unsupported.into());
        };
        let out = self.bound_out(dst);
        let one = |p: &mut [u8]| self.transmit(&out, dst, p, p.len().max(1));
        match hook.on_send(dst4, packet) {
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
                let sock = UdpSocket::bind(self.sock_addr(self.ip, 0))?;
                dont_fragment(&sock, self.ip)?;
                self.endpoints(dst, sock.local_addr()?.port())
                    .write(0, packet);
                let bytes = packet.to_vec();
                let to = self.sock_addr(dst, self.port);
                std::thread::spawn(move || {
                    std::thread::sleep(d);
                    let _ = sock.send_to(&bytes, to);
                });
                Ok(())
            }
        }
    }

    /// The ICRC fields of a packet we send to `dst` from `src_port` (IP ID 0 until
    /// [`Seal::write`] is given one). A `dst` of the other family never comes here
    /// (`Inner::link_addresses`); it gets all-zero addresses, which no peer checks.
    #[inline]
    pub(super) fn endpoints(&self, dst: IpAddr, src_port: u16) -> Seal {
        match (self.ip, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Seal::V4(Ipv4Endpoints {
                src,
                dst,
                ip_id: 0,
                src_port,
                dst_port: self.port,
            }),
            (src, dst) => Seal::V6(Ipv6Endpoints {
                src: v6_of(src),
                dst: v6_of(dst),
                src_port,
                dst_port: self.port,
            }),
        }
    }

    /// Sends one run: a single packet, or a GSO run from the peer's socket (one by
    /// one where GSO cannot take it, or through the hook or the inbox).
    pub(super) fn send_run(&self, t: &mut Transmit<'_>) -> io::Result<()> {
        let dst = t.route.dst;
        self.tos.store(t.route.tos, Ordering::Relaxed);
        let segment = t.segment_size.max(1);
        if let Some(hook) = &self.hook {
            let mut r = Ok(());
            for p in t.packets() {
                if let Err(e) = self.send_hooked(hook.as_ref(), dst, p) {
                    r = Err(e);
                }
            }
            return r;
        }
        let packets = &mut *t.contents;
        if let Some(r) = self.send_local(dst, packets, segment) {
            return r;
        }
        let mut peers = self.peers.lock();
        let out = self.out(&mut peers, dst);
        // GSO cuts a run into datagrams with the IP ID counting up from the send's;
        // `transmit` computes each segment's ICRC with its own.
        if packets.len() > segment && self.max_segments() == 1 {
            return self.transmit_each(&out, dst, packets, segment);
        }
        self.transmit(&out, dst, packets, segment)
    }

    /// Sends two single packets along `route`, `first` first, in one `sendmmsg`.
    pub(super) fn send_two(
        &self,
        route: Route,
        first: &mut [u8],
        second: &mut [u8],
    ) -> io::Result<()> {
        let dst = route.dst;
        if self.hook.is_some() || (dst == self.ip && self.router.is_some()) {
            let r = self.send_run(&mut Transmit::one(route, first));
            return self.send_run(&mut Transmit::one(route, second)).and(r);
        }
        self.tos.store(route.tos, Ordering::Relaxed);
        let mut peers = self.peers.lock();
        let out = self.out(&mut peers, dst);
        // Two sends: the second takes the ID after the first's.
        let next = out.ids.and_then(IpIds::next).unwrap_or(0);
        let seal = self.endpoints(dst, out.src_port);
        seal.write(next, first);
        let ip_id = if out.ids.is_some() {
            next.wrapping_add(1)
        } else {
            0
        };
        seal.write(ip_id, second);
        self.apply_tos(&out);
        // One system call for both (a ping-pong's answer and the ACK of the question:
        // busy-poll send_lat, see docs/performance.md). The kernel delivers the first on
        // loopback before it takes the second, so the answer waits for nothing. The
        // bound socket (no connected one for this peer) sends them one by one below.
        let sent = match out.to {
            None => send_pair(out.socket, first, second),
            Some(_) => 0,
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
}

/// An address as IPv6 (an IPv4 one IPv4-mapped).
fn v6_of(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}
