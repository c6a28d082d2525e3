//! The IPv4 identification each datagram we send carries, so that its ICRC is the one
//! a receiver computes from the wire (IBTA Annex A17.4 covers the identification; only
//! TOS, TTL and the header checksum are masked).
//!
//! Measured on Linux 6.18 (docs/interop.md), for UDP sockets with DF set
//! (`IP_PMTUDISC_DO`):
//! - an unconnected socket gives every datagram ID 0;
//! - a connected socket numbers its datagrams from a random start, one per `sendmsg`
//!   (a GSO send takes one number), whatever the destination of the `sendto`;
//! - GSO cuts a send into segments numbered up from the send's ID (segment `k` carries
//!   `id + k`), in software or in a NIC;
//! - a send refused before the packet is built (`EAGAIN`, `ECONNREFUSED`,
//!   `EMSGSIZE`) takes no number.
//!
//! So the sender knows every ID once it knows a connected socket's next one, which the
//! kernel tells through a software transmit timestamp: with `SO_TIMESTAMPING` and no
//! `SOF_TIMESTAMPING_OPT_TSONLY`, the error queue returns the sent packet, headers
//! included ([`probe`]). The probe is an empty datagram to the socket's own address and
//! port, where no other socket can be (no process but ours sees it; the ICMP error it
//! causes matches no socket). A kernel that withholds the packet
//! (`net.core.tstamp_allow_data = 0`) leaves the connected socket unused: the bound,
//! unconnected socket sends with ID 0.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::poll::{PollFd, PollFlags};
use nix::sys::socket::{
    recvmsg, sendto, setsockopt, sockopt, MsgFlags, SockaddrIn, TimestampingFlag,
};
use nix::sys::time::TimeSpec;

/// [`IpIds::next`]'s value when a send failed in a way that may or may not have taken a
/// number: the socket must be probed again before it sends.
const UNKNOWN: u32 = u32::MAX;

/// The next IP ID of a connected socket, as the kernel will give it.
#[derive(Debug)]
pub(crate) struct IpIds(AtomicU32);

impl IpIds {
    /// Starts at `next` (from [`probe`]).
    pub(crate) fn new(next: u16) -> Self {
        IpIds(AtomicU32::new(u32::from(next)))
    }

    /// The ID of the next datagram, if known.
    pub(crate) fn next(&self) -> Option<u16> {
        u16::try_from(self.0.load(Ordering::Relaxed)).ok()
    }

    /// `sends` datagrams (or GSO sends) left.
    pub(crate) fn advance(&self, sends: u16) {
        if let Some(n) = self.next() {
            self.0
                .store(u32::from(n.wrapping_add(sends)), Ordering::Relaxed);
        }
    }

    /// A send failed after the kernel may have numbered it.
    pub(crate) fn lose_track(&self) {
        self.0.store(UNKNOWN, Ordering::Relaxed);
    }

    /// Knows the next ID again (from [`probe`]).
    pub(crate) fn set(&self, next: u16) {
        self.0.store(u32::from(next), Ordering::Relaxed);
    }
}

/// Sends an empty datagram from `socket` (connected, DF set, bound to `ip:port`) to
/// `ip:port` itself and reads the IP ID the kernel gave it back from the error queue.
/// Returns the ID the socket's next datagram will carry, or `None` if the kernel did
/// not say within 100 ms.
pub(crate) fn probe(socket: &UdpSocket, ip: Ipv4Addr, port: u16) -> Option<u16> {
    let fd = socket.as_raw_fd();
    let on = TimestampingFlag::SOF_TIMESTAMPING_TX_SOFTWARE
        | TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE;
    setsockopt(socket, sockopt::Timestamping, &on).ok()?;
    let me = SockaddrIn::from(SocketAddrV4::new(ip, port));
    let sent = sendto(fd, &[], &me, MsgFlags::empty()).is_ok();
    let id = if sent {
        read_back(socket, me.into(), me.into())
    } else {
        None
    };
    let _ = setsockopt(socket, sockopt::Timestamping, &TimestampingFlag::empty());
    // Anything else queued (a second timestamp of the same packet).
    let mut buf = [0u8; 128];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    while recvmsg::<SockaddrIn>(
        fd,
        &mut iov,
        None,
        MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
    )
    .is_ok()
    {}
    id.map(|id| id.wrapping_add(1))
}

/// Waits for a looped-back packet from `from` to `to` on the error queue and returns
/// its IP ID, found after the link-layer header the device has (14 bytes of Ethernet on
/// `lo`, veth and Ethernet NICs; none on a tun device).
fn read_back(socket: &UdpSocket, from: SocketAddrV4, to: SocketAddrV4) -> Option<u16> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(100);
    let mut buf = [0u8; 128];
    let mut cmsg = nix::cmsg_space!([nix::sys::time::TimeSpec; 3]);
    loop {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let r = recvmsg::<SockaddrIn>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
        );
        match r {
            Ok(r) => {
                let n = r.bytes;
                return [0usize, 14, 16]
                    .into_iter()
                    .find_map(|at| ip_id_of(buf.get(at..n)?, from, to));
            }
            Err(_) => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return None;
                }
                let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLERR)];
                let ts = TimeSpec::new(0, left.as_nanos().min(10_000_000) as i64);
                let _ = nix::poll::ppoll(&mut fds, Some(ts), None);
            }
        }
    }
}

/// The IP ID of `p` if it starts with the IPv4 and UDP headers of a datagram from
/// `from` to `to`.
fn ip_id_of(p: &[u8], from: SocketAddrV4, to: SocketAddrV4) -> Option<u16> {
    let ihl = usize::from(*p.first()? & 0x0F) * 4;
    let ours = p[0] >> 4 == 4
        && ihl >= 20
        && *p.get(9)? == 17
        && p.get(12..16)? == from.ip().octets()
        && p.get(16..20)? == to.ip().octets()
        && p.get(ihl..ihl + 2)? == from.port().to_be_bytes()
        && p.get(ihl + 2..ihl + 4)? == to.port().to_be_bytes();
    ours.then(|| u16::from_be_bytes([p[4], p[5]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe tells the ID the kernel gives the socket's next datagrams (read back
    /// from the kernel itself, as the probe's was), single and GSO sends alike, and
    /// a refused send takes none.
    #[test]
    fn the_probe_tells_the_next_id() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        crate::nic::udp::dont_fragment(&s, Ipv4Addr::LOCALHOST.into()).unwrap();
        let to = match peer.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        s.connect(to).unwrap();
        let port = s.local_addr().unwrap().port();
        let from = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        let Some(next) = probe(&s, Ipv4Addr::LOCALHOST, port) else {
            let allow = std::fs::read_to_string("/proc/sys/net/core/tstamp_allow_data");
            assert_eq!(allow.ok().as_deref().map(str::trim), Some("0"));
            eprintln!("SKIPPED: the kernel withholds timestamped packets");
            return;
        };
        let ids = IpIds::new(next);
        let on = TimestampingFlag::SOF_TIMESTAMPING_TX_SOFTWARE
            | TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE;
        setsockopt(&s, sockopt::Timestamping, &on).unwrap();
        for round in 0..4 {
            let want = ids.next().unwrap();
            if round == 2 {
                // A GSO send of three segments takes one number.
                let gso = 100u16;
                nix::sys::socket::sendmsg::<SockaddrIn>(
                    s.as_raw_fd(),
                    &[std::io::IoSlice::new(&[7u8; 300])],
                    &[nix::sys::socket::ControlMessage::UdpGsoSegments(&gso)],
                    MsgFlags::empty(),
                    None,
                )
                .unwrap();
            } else {
                s.send(&[round as u8; 40]).unwrap();
            }
            assert_eq!(read_back(&s, from, to), Some(want), "send {round}");
            ids.advance(1);
        }
    }
}
