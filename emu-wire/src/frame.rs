//! Ethernet II + IPv4/IPv6 + UDP framing around a RoCEv2 UDP payload: splitting captured
//! frames, and building the frames the pcap writer records.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::error::{Error, Result};
use crate::icrc::{Ipv4Endpoints, Ipv6Endpoints};

/// The RoCEv2 UDP destination port, assigned by IANA (IBTA Annex A17, RoCEv2).
pub const ROCEV2_PORT: u16 = 4791;

/// The parts of a captured frame that the ICRC covers.
#[derive(Clone, Copy, Debug)]
pub struct FrameParts<'a> {
    /// The IP header (20 bytes IPv4 without options, 40 bytes IPv6).
    pub ip_header: &'a [u8],
    /// The 8-byte UDP header.
    pub udp_header: &'a [u8],
    /// The UDP payload (BTH through ICRC), its length taken from the UDP header.
    pub udp_payload: &'a [u8],
    /// Whether the frame is IPv6.
    pub ipv6: bool,
}

/// Splits an Ethernet II frame (no VLAN tag) carrying IPv4 (no options) or IPv6 (no
/// extension headers) and UDP. Lengths come from the IP total length and the UDP
/// length, so frames shorter than the Ethernet minimum (captured before padding) and
/// padded ones both work. Errors: [`Error::Truncated`] when a header does not fit,
/// [`Error::BadVersion`] for an IP version that disagrees with the EtherType, and
/// [`Error::BadLength`] for another EtherType or protocol, options, a fragment, or
/// lengths larger than the frame.
pub fn split_frame(frame: &[u8]) -> Result<FrameParts<'_>> {
    if frame.len() < 14 {
        return Err(Error::Truncated);
    }
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let ip = &frame[14..];
    match ethertype {
        0x0800 => split_ipv4(ip),
        0x86DD => {
            if ip.len() < 40 {
                return Err(Error::Truncated);
            }
            if ip[0] >> 4 != 6 {
                return Err(Error::BadVersion(ip[0] >> 4));
            }
            // No extension headers: UDP must follow the fixed header.
            let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            if ip[6] != 17 || 40 + plen > ip.len() {
                return Err(Error::BadLength);
            }
            split_udp(&ip[..40], &ip[40..40 + plen], true)
        }
        _ => Err(Error::BadLength),
    }
}

/// Splits an IPv4 datagram (IP header first, as a raw IP socket returns it) carrying
/// UDP: the IPv4 arm of [`split_frame`], with the same errors. RoCEv2 senders use no
/// IPv4 options (the ICRC covers exactly 20 bytes of IP header, Annex A17.4), and a
/// fragment is not a whole UDP datagram.
pub fn split_ipv4(ip: &[u8]) -> Result<FrameParts<'_>> {
    if ip.len() < 20 {
        return Err(Error::Truncated);
    }
    if ip[0] >> 4 != 4 {
        return Err(Error::BadVersion(ip[0] >> 4));
    }
    let ihl = usize::from(ip[0] & 0xF) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    // More-fragments set or a non-zero fragment offset.
    let fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x3FFF != 0;
    if ihl != 20 || ip[9] != 17 || fragment || total < ihl || total > ip.len() {
        return Err(Error::BadLength);
    }
    split_udp(&ip[..20], &ip[20..total], false)
}

/// The UDP header and payload of `l4` (the IP payload), the payload's length taken
/// from the UDP header.
fn split_udp<'a>(ip_header: &'a [u8], l4: &'a [u8], ipv6: bool) -> Result<FrameParts<'a>> {
    if l4.len() < 8 {
        return Err(Error::Truncated);
    }
    let ulen = usize::from(u16::from_be_bytes([l4[4], l4[5]]));
    if ulen < 8 || ulen > l4.len() {
        return Err(Error::BadLength);
    }
    Ok(FrameParts {
        ip_header,
        udp_header: &l4[..8],
        udp_payload: &l4[8..ulen],
        ipv6,
    })
}

/// The IPv4 header checksum of `hdr` (its checksum field counted as zero).
pub fn ipv4_checksum(hdr: &[u8]) -> u16 {
    let mut sum = 0u32;
    for (i, w) in hdr.chunks(2).enumerate() {
        if i == 5 {
            continue;
        }
        let hi = u32::from(w[0]) << 8;
        sum += hi | u32::from(*w.get(1).unwrap_or(&0));
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// The IPv4 header a Linux sender with DF set and TTL 64 puts before `udp_len` bytes of
/// UDP (header included).
pub fn ipv4_header(ep: &Ipv4Endpoints, udp_len: usize) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
    h[4..6].copy_from_slice(&ep.ip_id.to_be_bytes());
    h[6] = 0x40;
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&ep.src.octets());
    h[16..20].copy_from_slice(&ep.dst.octets());
    let c = ipv4_checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

/// The UDP header (checksum 0, as kernel rxe sends) before `payload_len` bytes.
pub fn udp_header(ep: &Ipv4Endpoints, payload_len: usize) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[0..2].copy_from_slice(&ep.src_port.to_be_bytes());
    h[2..4].copy_from_slice(&ep.dst_port.to_be_bytes());
    h[4..6].copy_from_slice(&((8 + payload_len) as u16).to_be_bytes());
    h
}

/// The IPv6 fixed header a Linux sender puts before `udp_len` bytes of UDP (header
/// included): traffic class 0, flow label 0, next header UDP (17), hop limit 64, no
/// extension headers.
pub fn ipv6_header(ep: &Ipv6Endpoints, udp_len: usize) -> [u8; 40] {
    let mut h = [0u8; 40];
    h[0] = 0x60;
    h[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    h[6] = 17;
    h[7] = 64;
    h[8..24].copy_from_slice(&ep.src.octets());
    h[24..40].copy_from_slice(&ep.dst.octets());
    h
}

/// [`udp_header`] for a packet sent over IPv6 (checksum 0 here too: the ICRC masks it,
/// and the pcap writer's frames are read by decoders that do not check it).
pub fn udp_header_v6(ep: &Ipv6Endpoints, payload_len: usize) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[0..2].copy_from_slice(&ep.src_port.to_be_bytes());
    h[2..4].copy_from_slice(&ep.dst_port.to_be_bytes());
    h[4..6].copy_from_slice(&((8 + payload_len) as u16).to_be_bytes());
    h
}

/// A locally administered MAC derived from an IPv6 address: 02:00 and its last four
/// bytes.
pub fn mac_for_v6(ip: Ipv6Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x02, 0x00, o[12], o[13], o[14], o[15]]
}

/// A whole Ethernet II + IPv6 + UDP frame around `udp_payload`.
pub fn build_frame_v6(ep: &Ipv6Endpoints, udp_payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + 48 + udp_payload.len());
    f.extend_from_slice(&mac_for_v6(ep.dst));
    f.extend_from_slice(&mac_for_v6(ep.src));
    f.extend_from_slice(&0x86DDu16.to_be_bytes());
    f.extend_from_slice(&ipv6_header(ep, 8 + udp_payload.len()));
    f.extend_from_slice(&udp_header_v6(ep, udp_payload.len()));
    f.extend_from_slice(udp_payload);
    f
}

/// A locally administered MAC derived from an IPv4 address: 02:00:a:b:c:d.
pub fn mac_for(ip: Ipv4Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

/// A whole Ethernet II + IPv4 + UDP frame around `udp_payload`.
pub fn build_frame(ep: &Ipv4Endpoints, udp_payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + 28 + udp_payload.len());
    f.extend_from_slice(&mac_for(ep.dst));
    f.extend_from_slice(&mac_for(ep.src));
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&ipv4_header(ep, 8 + udp_payload.len()));
    f.extend_from_slice(&udp_header(ep, udp_payload.len()));
    f.extend_from_slice(udp_payload);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep() -> Ipv4Endpoints {
        Ipv4Endpoints {
            src: Ipv4Addr::new(10, 9, 0, 2),
            dst: Ipv4Addr::new(10, 9, 0, 1),
            ip_id: 0xb96c,
            src_port: 49441,
            dst_port: ROCEV2_PORT,
        }
    }

    #[test]
    fn build_and_split_agree_and_padding_is_ignored() {
        let payload = [7u8; 20];
        let mut f = build_frame(&ep(), &payload);
        assert_eq!(f.len(), 14 + 20 + 8 + 20);
        assert_eq!(&f[..6], &[0x02, 0x00, 10, 9, 0, 1]);
        assert_eq!(&f[6..12], &[0x02, 0x00, 10, 9, 0, 2]);
        // a correct header checksum: the one's complement sum over the header is 0xFFFF
        let ip = &f[14..34];
        let sum: u32 = ip
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        assert_eq!((sum & 0xFFFF) + (sum >> 16), 0xFFFF);
        assert_eq!((ip[6], ip[8], ip[9]), (0x40, 64, 17));
        f.extend_from_slice(&[0u8; 10]); // Ethernet padding after the datagram
        let p = split_frame(&f).unwrap();
        assert!(!p.ipv6);
        assert_eq!(p.ip_header.len(), 20);
        assert_eq!(p.udp_header, &udp_header(&ep(), 20)[..]);
        assert_eq!(p.udp_payload, &payload[..]);
    }

    #[test]
    fn malformed_frames_are_errors() {
        let f = build_frame(&ep(), &[0u8; 20]);
        for n in 0..f.len() {
            assert!(split_frame(&f[..n]).is_err(), "{n} bytes");
        }
        let mut g = f.clone();
        g[12..14].copy_from_slice(&[0x86, 0xDD]); // IPv6 EtherType, IPv4 inside
        g.extend_from_slice(&[0u8; 40]);
        assert_eq!(split_frame(&g).unwrap_err(), Error::BadVersion(4));
        let mut g = f.clone();
        g[14] = 0x46; // IPv4 options
        assert_eq!(split_frame(&g).unwrap_err(), Error::BadLength);
        let mut g = f.clone();
        g[14 + 9] = 6; // TCP
        assert_eq!(split_frame(&g).unwrap_err(), Error::BadLength);
        let mut g = f.clone();
        g[14 + 20 + 5] = 7; // UDP length below its header
        assert_eq!(split_frame(&g).unwrap_err(), Error::BadLength);
        for frag in [[0x20, 0x00], [0x40, 0x01]] {
            // more fragments, or a later fragment: not a whole datagram
            let mut g = f.clone();
            g[14 + 6..14 + 8].copy_from_slice(&frag);
            assert_eq!(split_frame(&g).unwrap_err(), Error::BadLength);
        }
    }

    #[test]
    fn an_ipv6_frame_builds_and_splits() {
        let ep = Ipv6Endpoints {
            src: "fd00::a".parse().unwrap(),
            dst: "fd00::b".parse().unwrap(),
            src_port: 50000,
            dst_port: ROCEV2_PORT,
        };
        let mut f = build_frame_v6(&ep, &[9u8; 24]);
        assert_eq!(f.len(), 14 + 40 + 8 + 24);
        assert_eq!(&f[12..14], &[0x86, 0xDD]);
        f.extend_from_slice(&[0u8; 6]);
        let p = split_frame(&f).unwrap();
        assert!(p.ipv6);
        assert_eq!(p.ip_header, &ipv6_header(&ep, 32)[..]);
        assert_eq!(p.udp_header, &udp_header_v6(&ep, 24)[..]);
        assert_eq!(p.udp_payload, &[9u8; 24][..]);
        for n in 0..14 + 48 {
            assert!(split_frame(&f[..n]).is_err(), "{n} bytes");
        }
    }

    #[test]
    fn an_ipv4_datagram_splits_as_its_frame_does() {
        let f = build_frame(&ep(), &[5u8; 12]);
        let (a, b) = (split_frame(&f).unwrap(), split_ipv4(&f[14..]).unwrap());
        assert_eq!(
            (a.ip_header, a.udp_header, a.udp_payload, a.ipv6),
            (b.ip_header, b.udp_header, b.udp_payload, b.ipv6)
        );
    }
}
