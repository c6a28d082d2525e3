//! Options of the UDP link for talking to a real RoCE peer (kernel rxe, a NIC), and the
//! hook through which a test puts faults on the wire toward it.
//!
//! # The ICRC with a real peer (Annex A17.4; measurements in docs/interop.md)
//! The ICRC covers the IPv4 identification field. Every mode computes our datagrams'
//! ICRCs with the ID the kernel gives them (see `ip_id`), so a real peer accepts them
//! in every mode. Kernel rxe sends with its own, incrementing IDs, which a UDP socket
//! does not show: the default mode solves each one from the ICRC (a check of 16 bits
//! fewer, see [`emu_wire::icrc_ip_id`]). With [`LinkOptions::raw_receive`] the link
//! reads its datagrams from a raw IPv4 socket (`SOCK_RAW`, `IPPROTO_UDP`: a copy of
//! every UDP datagram the host receives, IP header included), keeps those addressed to
//! its own address and port, and checks each one's ICRC with the ID it arrived with,
//! whole. That socket needs root or `CAP_NET_RAW`; the default mode needs neither.
//! Interop mode sends one datagram per `sendmsg` from the bound socket (ID 0).
//!
//! # Faults toward the peer
//! A [`PacketHook`] sees every packet the link sends (before its ICRC is computed) and
//! every packet it receives (after its ICRC passed), and says what happens to it: the
//! rules a simulated fabric applies, on a real wire.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

/// How the UDP link of an [`super::EmuDevice`] works; the default is the unprivileged
/// loopback mode.
#[derive(Clone, Default)]
pub struct LinkOptions {
    /// Receive through a raw IPv4 socket, which shows each datagram's IP header, and
    /// check the ICRC with the IP ID it carried (the default mode solves a kernel rxe
    /// peer's IDs from the ICRC instead); send one datagram per system call (no GSO)
    /// from the bound socket, with IP ID 0. Needs root or `CAP_NET_RAW`.
    pub raw_receive: bool,
    /// Sees (and may change) every packet sent and received.
    pub hook: Option<Arc<dyn PacketHook>>,
    /// Strict source checks: an RC or UC QP takes packets only from the UDP source
    /// port its peer first sent from (learnt from the first packet the QP took, and
    /// again after the QP is reset or reconnected); packets from the peer's address and
    /// another port are dropped and counted (`LinkCounters::wrong_source_port`). Off by
    /// default, as in kernel rxe, which accepts any source port: RoCEv2 senders pick
    /// it per QP or per flow (IBTA Annex A17.3.1), and only the address is the peer's.
    /// On, another process on the peer's host cannot inject into a connection; a peer
    /// must then keep its source port for the life of a connection, as kernel rxe
    /// (a hash of the QPNs) and this emulator (one socket per peer) do.
    pub strict_source_port: bool,
    /// Keep the address to this device: binding fails with EADDRINUSE while another
    /// device holds it, and a later device cannot join it. Off by default: devices
    /// that open one address share it, as processes share one kernel rxe device, each
    /// getting the packets of its own QPs (the `share` module; the interop mode, whose
    /// raw socket sees every packet, never shares).
    pub exclusive: bool,
}

impl LinkOptions {
    /// The options for a real RoCE peer: raw receive, no hook.
    pub fn interop() -> LinkOptions {
        LinkOptions {
            raw_receive: true,
            ..LinkOptions::default()
        }
    }
}

impl fmt::Debug for LinkOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkOptions")
            .field("raw_receive", &self.raw_receive)
            .field("hook", &self.hook.as_ref().map(|_| "PacketHook"))
            .field("strict_source_port", &self.strict_source_port)
            .field("exclusive", &self.exclusive)
            .finish()
    }
}

impl PartialEq for LinkOptions {
    fn eq(&self, o: &Self) -> bool {
        self.raw_receive == o.raw_receive
            && self.strict_source_port == o.strict_source_port
            && self.exclusive == o.exclusive
            && match (&self.hook, &o.hook) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

impl Eq for LinkOptions {}

/// What happens to a packet a [`PacketHook`] saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It goes on unchanged.
    Pass,
    /// It is lost.
    Drop,
    /// Sends only: it leaves twice.
    Duplicate,
    /// Sends only: it leaves this much later (from another thread).
    Delay(Duration),
    /// Sends only: these bytes (a whole UDP payload, BTH to ICRC slot) leave instead,
    /// to the same destination; the link computes their ICRC.
    Replace(Vec<u8>),
}

/// Sees every packet of a UDP link. Called on the thread that sends or receives, with
/// no device lock held... except the engine's, on sends: keep it quick, and never call
/// the device from it.
pub trait PacketHook: Send + Sync + fmt::Debug {
    /// A packet (BTH through a zeroed ICRC slot) about to leave for `dst`.
    fn on_send(&self, dst: Ipv4Addr, packet: &[u8]) -> Verdict;
    /// A packet received from `from` whose ICRC was right; `ip_id` is its IPv4
    /// identification when the link sees IP headers ([`LinkOptions::raw_receive`]).
    /// Only [`Verdict::Pass`] and [`Verdict::Drop`] mean anything here.
    fn on_receive(&self, from: SocketAddrV4, ip_id: Option<u16>, packet: &[u8]) -> Verdict;
}

/// The fields of an IPv4/UDP datagram a raw socket hands over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawUdp {
    pub(crate) src: SocketAddrV4,
    pub(crate) dst: SocketAddrV4,
    pub(crate) ip_id: u16,
    /// The TOS byte (the traffic class on RoCEv2, IBTA Annex A17.4.5).
    pub(crate) tos: u8,
    /// Where the UDP payload starts and how long it is.
    pub(crate) payload: std::ops::Range<usize>,
}

/// Parses an IPv4 datagram carrying UDP as a raw socket returns it (IP header first),
/// with [`emu_wire::split_ipv4`]. None for anything else: not IPv4, not UDP, IP
/// options (RoCEv2 senders use none; the ICRC covers 20 bytes of header), a fragment,
/// or truncated.
pub(crate) fn parse_raw_udp(b: &[u8]) -> Option<RawUdp> {
    let p = emu_wire::split_ipv4(b).ok()?;
    let (ip, udp) = (p.ip_header, p.udp_header);
    let at = |a: usize, port: usize| {
        SocketAddrV4::new(
            Ipv4Addr::new(ip[a], ip[a + 1], ip[a + 2], ip[a + 3]),
            u16::from_be_bytes([udp[port], udp[port + 1]]),
        )
    };
    // The header is 20 bytes (no options), then 8 of UDP.
    Some(RawUdp {
        src: at(12, 0),
        dst: at(16, 2),
        ip_id: u16::from_be_bytes([ip[4], ip[5]]),
        tos: ip[1],
        payload: 28..28 + p.udp_payload.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(id: u16, frag: u16, payload: &[u8]) -> Vec<u8> {
        let total = (28 + payload.len()) as u16;
        let mut b = vec![0x45, 0];
        b.extend(total.to_be_bytes());
        b.extend(id.to_be_bytes());
        b.extend(frag.to_be_bytes());
        b.extend([64, 17, 0, 0, 192, 168, 77, 2, 192, 168, 77, 1]);
        b.extend(0xC123u16.to_be_bytes());
        b.extend(4791u16.to_be_bytes());
        b.extend((8 + payload.len() as u16).to_be_bytes());
        b.extend([0, 0]);
        b.extend(payload);
        b
    }

    #[test]
    fn parses_the_header_fields_a_raw_socket_returns() {
        let b = datagram(52212, 0x4000, b"abcd");
        let r = parse_raw_udp(&b).unwrap();
        assert_eq!(r.ip_id, 52212);
        assert_eq!(r.src, "192.168.77.2:49443".parse().unwrap());
        assert_eq!(r.dst, "192.168.77.1:4791".parse().unwrap());
        assert_eq!(&b[r.payload], b"abcd");
    }

    #[test]
    fn rejects_fragments_truncation_and_other_protocols() {
        assert!(parse_raw_udp(&datagram(1, 0x2000, b"abcd")).is_none());
        assert!(parse_raw_udp(&datagram(1, 0x0001, b"abcd")).is_none());
        let b = datagram(1, 0x4000, b"abcd");
        assert!(parse_raw_udp(&b[..b.len() - 1]).is_none());
        let mut t = b.clone();
        t[9] = 6;
        assert!(parse_raw_udp(&t).is_none());
        let mut v6 = b.clone();
        v6[0] = 0x65;
        assert!(parse_raw_udp(&v6).is_none());
        // IP options (IHL 6): no RoCEv2 sender uses them.
        let mut opts = b;
        opts[0] = 0x46;
        opts.splice(20..20, [1u8, 1, 1, 0]);
        assert!(parse_raw_udp(&opts).is_none());
        assert!(parse_raw_udp(&[]).is_none());
    }
}
