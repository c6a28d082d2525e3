//! Receiving: datagrams off the bound socket (GRO runs split again, `recvmmsg` once
//! receives keep finding datagrams, a one-slot `recvmsg` or `recvfrom` otherwise), the
//! group sockets, the inbox, and in interop mode the raw socket.

use std::io::{self, IoSliceMut, Read};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

use emu_wire::{check_icrc, check_icrc_v6, icrc_ip_id, Ipv4Endpoints, Ipv6Endpoints};
use nix::errno::Errno;
use nix::sys::socket::{
    setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrIn, SockaddrIn6, SockaddrLike,
};
use quinn_udp::{RecvMeta, UdpSockRef};
use socket2::Socket;

use crate::nic::gro::Gro;
use crate::nic::interop::{parse_raw_udp, Verdict};
use crate::nic::link::wait_readable_fds;
use crate::nic::share;

use super::{UdpLink, NOWHERE};

/// Receives in a row that must find datagrams before the next one is batched (see
/// `RxBufs::found`).
pub(super) const BATCH_AFTER: u8 = 3;
/// Receives that stay one-slot after a batched receive found no backlog (see
/// `RxBufs::backoff`).
pub(super) const BATCH_BACKOFF: u8 = 64;

/// Receive slots per `recvmmsg` call, each large enough for one GRO-coalesced run.
pub(super) const RX_SLOTS: usize = 16;
/// Bytes per receive slot: a whole coalesced run (64 KiB) when GRO is on.
pub(super) const RX_SLOT_GRO: usize = 64 << 10;
/// Bytes per receive slot without GRO (a RoCEv2 packet is at most 4096 + 128 bytes;
/// anything larger is truncated and then fails its ICRC).
pub(super) const RX_SLOT_PLAIN: usize = 9216;

/// One datagram taken off the socket: where it sits in the receive buffers, who sent
/// it, and to which address (ours or a multicast group).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rx {
    pub(super) slot: usize,
    pub(super) start: usize,
    pub(super) len: usize,
    /// The sender.
    pub(crate) from: SocketAddr,
    /// Our address or a group's.
    pub(crate) dst: IpAddr,
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
    pub(super) slots: Vec<Vec<u8>>,
    pub(super) meta: Vec<RecvMeta>,
    /// The datagrams of the last [`UdpLink::recv_batch`], GRO runs already split.
    pub(crate) got: Vec<Rx>,
    /// How many of `got` the engine has had; the rest (positive ACKs that an inline
    /// receive left behind a completion) go to it before the next receive.
    pub(crate) next: usize,
    pub(super) mslots: Vec<Vec<u8>>,
    pub(super) mcast: Vec<(usize, SocketAddr, IpAddr)>,
    /// How many receives in a row found datagrams (at most [`BATCH_AFTER`]). Until
    /// that many did, a receive asks for one slot only (a whole GRO run): a
    /// busy-polling caller mostly finds nothing, a ping-pong one datagram at a time
    /// (its answer, then the ACK behind it), and the batched receive builds and zeroes
    /// a header table for every slot on each call (about 700 instructions per call,
    /// callgrind). A stream of separate datagrams gets the batched one from the fourth
    /// receive on.
    pub(super) found: u8,
    /// Receives left that ask for one slot whatever `found` says: set to
    /// [`BATCH_BACKOFF`] by a batched receive that took one datagram or GRO run (no
    /// backlog). A ping-pong on two busy cores finds datagrams many receives in a row
    /// (the ACK of its question, then the answer; streaks of 16 and more), and a
    /// batched receive costs more than a one-slot one when one datagram waits: `recvmmsg`
    /// tries the next slot too, and the header table is built for all of them, with
    /// the ACK and the answer on the critical path together (`bench send_lat
    /// --busy-poll`); a stream's batches take several datagrams each and keep batching.
    pub(super) backoff: u8,
    /// Room for the `UDP_GRO` control message of a one-slot receive.
    pub(super) cmsg: Vec<u8>,
    /// Whether the socket has `UDP_GRO` on, switched with the traffic (see `gro`).
    pub(super) gro: Gro,
    /// The sender and IP ID of the last datagram whose ICRC was right (see
    /// [`RxBufs::guess_ip_id`]).
    pub(super) last_ip_id: (SocketAddr, u16),
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
    pub(crate) fn guess_ip_id(&self, from: SocketAddr) -> u16 {
        match self.last_ip_id {
            (f, id) if f == from && id != 0 => id.wrapping_add(1),
            _ => 0,
        }
    }

    /// A datagram from `from` carried IP ID `id`.
    pub(crate) fn saw_ip_id(&mut self, from: SocketAddr, id: u16) {
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
            last_ip_id: (NOWHERE, 0),
        }
    }

    /// Waits up to `timeout` for the socket to become readable; true if it is (false
    /// also when a signal handler cut the wait short).
    pub(crate) fn wait_readable(&self, timeout: Duration) -> bool {
        self.wait_readable_or(None, Some(timeout)).unwrap_or(false)
    }

    /// Waits up to `timeout` (forever for `None`) for the socket or `other` to become
    /// readable; true if one is. An `Interrupted` error when a signal handler ran meanwhile:
    /// poll(2) is never restarted after a handler, and a caller that blocks on behalf
    /// of a program (`ibv_get_cq_event`) owes it that interruption.
    pub(crate) fn wait_readable_or(
        &self,
        other: Option<BorrowedFd<'_>>,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        self.wait_readable_among([other, None], timeout)
    }

    /// [`UdpLink::wait_readable_or`] with up to two other descriptors (an auto
    /// device's wake-up socket, beside a completion channel's).
    pub(crate) fn wait_readable_among(
        &self,
        others: [Option<BorrowedFd<'_>>; 2],
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        // The UDP socket gets a copy of what the raw one shows: it is drained too.
        let [other, another] = others;
        let fds = [
            Some(self.socket.as_fd()),
            self.raw.as_ref().map(AsFd::as_fd),
            self.inbox.as_ref().map(AsFd::as_fd),
            other,
            another,
        ];
        wait_readable_fds(fds.into_iter().flatten(), timeout)
    }

    /// Interop mode's receive: drains the UDP socket and the group sockets (their
    /// datagrams are the raw socket's copies), then reads the raw socket into the
    /// slots, keeping what is addressed to our address or a joined group on our port.
    pub(super) fn recv_raw(&self, raw: &Socket, rx: &mut RxBufs) -> usize {
        let RxBufs { slots, got, .. } = rx;
        got.clear();
        let mut sink = [0u8; 64];
        while self.socket.recv_from(&mut sink).is_ok() {}
        let groups: Vec<IpAddr> = {
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
                                && (IpAddr::V4(*d.dst.ip()) == self.ip
                                    || groups.contains(&IpAddr::V4(*d.dst.ip()))) =>
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
                from: SocketAddr::V4(d.src),
                dst: IpAddr::V4(*d.dst.ip()),
                ip_id: d.ip_id,
                tos: d.tos,
                passed_on: false,
            });
        }
        got.len()
    }

    /// Applies the hook to what was received: drops what it drops.
    pub(super) fn hook_received(&self, rx: &mut RxBufs) {
        let Some(hook) = &self.hook else { return };
        let raw = self.interop();
        let mut got = std::mem::take(&mut rx.got);
        // Hooks are IPv4 only (`UdpLink::bind`).
        got.retain(|d| match d.from {
            SocketAddr::V4(from) => {
                hook.on_receive(from, raw.then_some(d.ip_id), rx.bytes(d)) == Verdict::Pass
            }
            SocketAddr::V6(_) => false,
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
    pub(super) fn switch_gro(&self, gro: &mut Gro, on: bool) {
        if setsockopt(&self.socket, sockopt::UdpGroSegment, &on).is_err() {
            return;
        }
        if on || nothing_queued(&self.socket) {
            gro.switched(on, true);
        } else if setsockopt(&self.socket, sockopt::UdpGroSegment, &true).is_ok() {
            gro.switched(true, false);
        }
    }

    /// The default mode's receive (see [`UdpLink::recv_batch`]).
    pub(super) fn recv_plain(&self, rx: &mut RxBufs) -> usize {
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
            match self.ip {
                IpAddr::V4(_) => recv_one::<SockaddrIn>(
                    &self.socket,
                    &mut slots[0],
                    cmsg,
                    &mut meta[0],
                    &mut tos,
                    plain,
                ),
                IpAddr::V6(_) => recv_one::<SockaddrIn6>(
                    &self.socket,
                    &mut slots[0],
                    cmsg,
                    &mut meta[0],
                    &mut tos,
                    plain,
                ),
            }
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
                let from = m.addr;
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
                        Ok((len, from)) => mcast.push((len, from, *group)),
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
            let member = self.sock_addr(self.ip, self.port);
            for slot in n + mcast.len()..n + mslots.len() {
                let buf = &mut mslots[slot - n];
                let Ok((len, by)) = inbox.recv_from(buf) else {
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
    /// Over IPv6 there is no ID: `Some(0)` when the ICRC is right.
    pub(crate) fn icrc_ip_id(&self, d: &Rx, packet: &[u8], guess: u16) -> Option<u16> {
        let (from, dst) = match (d.from, d.dst) {
            (SocketAddr::V4(from), IpAddr::V4(dst)) => (from, dst),
            (SocketAddr::V6(from), IpAddr::V6(dst)) => {
                let ep = Ipv6Endpoints {
                    src: *from.ip(),
                    dst,
                    src_port: from.port(),
                    dst_port: self.port,
                };
                return check_icrc_v6(&ep, packet).then_some(0);
            }
            _ => return None,
        };
        let ep = Ipv4Endpoints {
            src: *from.ip(),
            dst,
            ip_id: if self.interop() { d.ip_id } else { guess },
            src_port: from.port(),
            dst_port: self.port,
        };
        if self.interop() {
            check_icrc(&ep, packet).then_some(d.ip_id)
        } else {
            icrc_ip_id(&ep, packet)
        }
    }
}

/// One non-blocking `recvmsg` into `buf`, with room in `cmsg` for the `UDP_GRO`
/// and `IP_TOS` control messages, or a `recvfrom` if `plain` (no run can be queued
/// and no TOS wanted): fills `meta` as quinn-udp's receive would (length, sender, and
/// the segment size of a coalesced run as its stride) and `tos` with the TOS byte if
/// the socket reports it (`IP_RECVTOS`, or the traffic class with `IPV6_RECVTCLASS`;
/// the datagrams of a run share it, as GRO coalesces only datagrams with one TOS).
/// `A` is the socket's address type (`SockaddrIn` or `SockaddrIn6`). Ok(0) when
/// nothing waits.
fn recv_one<A: SockaddrLike + Copy + SenderAddr>(
    socket: &UdpSocket,
    buf: &mut [u8],
    cmsg: &mut Vec<u8>,
    meta: &mut RecvMeta,
    tos: &mut u8,
    plain: bool,
) -> io::Result<usize> {
    let (len, stride, from) = if plain {
        match nix::sys::socket::recvfrom::<A>(socket.as_raw_fd(), buf) {
            Ok((len, from)) => (len, len, from),
            Err(Errno::EAGAIN | Errno::EINTR) => return Ok(0),
            Err(e) => return Err(e.into()),
        }
    } else {
        let mut iov = [IoSliceMut::new(buf)];
        let r = match nix::sys::socket::recvmsg::<A>(
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
                    ControlMessageOwned::Ipv6TClass(t) => *tos = t as u8,
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
    meta.addr = from.socket_addr();
    Ok(1)
}

/// Whether no datagram waits on `socket`: a non-blocking peek finds none. (FIONREAD
/// tells the same, as the first datagram's length, but nix has no safe call for it.)
fn nothing_queued(socket: &UdpSocket) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        nix::sys::socket::recv(
            socket.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ),
        Err(Errno::EAGAIN)
    )
}

/// A `nix` socket address a receive reports its sender in, as a std one.
trait SenderAddr {
    fn socket_addr(self) -> SocketAddr;
}

impl SenderAddr for SockaddrIn {
    #[inline]
    fn socket_addr(self) -> SocketAddr {
        SocketAddr::V4(self.into())
    }
}

impl SenderAddr for SockaddrIn6 {
    #[inline]
    fn socket_addr(self) -> SocketAddr {
        SocketAddr::V6(self.into())
    }
}
