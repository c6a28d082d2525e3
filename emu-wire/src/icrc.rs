//! The invariant CRC (IBTA Annex A17.4), exactly as kernel rxe computes and checks it:
//! CRC-32 (zlib polynomial) over 8 bytes of 0xFF (the masked LRH), the IP header with its
//! variant fields set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic
//! class, flow label, hop limit), the UDP header with its checksum set to 0xFFFF, the
//! BTH with byte 4 (FECN, BECN, reserved) set to 0xFF, then the rest of the packet up to
//! the ICRC. Stored little-endian in the last 4 bytes. The IPv4 identification field is
//! not masked: it is part of the ICRC.

use std::net::Ipv4Addr;

use crc32fast::Hasher;

use crate::error::Result;
use crate::frame::{ipv4_header, split_frame, udp_header};
use crate::packet::ICRC_LEN;

/// The IPv4 and UDP fields a RoCEv2 packet's ICRC depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Endpoints {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// IPv4 identification (Linux sends 0 on unconnected DF sockets; see roce-wire.md).
    pub ip_id: u16,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port (4791).
    pub dst_port: u16,
}

fn crc_rest(mut h: Hasher, udp_header: &[u8], udp_payload: &[u8]) -> u32 {
    let mut udp = [0u8; 8];
    udp.copy_from_slice(&udp_header[..8]);
    udp[6] = 0xFF;
    udp[7] = 0xFF;
    h.update(&udp);
    let end = udp_payload.len().saturating_sub(ICRC_LEN);
    let body = &udp_payload[..end];
    if body.len() >= 12 {
        let mut bth = [0u8; 12];
        bth.copy_from_slice(&body[..12]);
        bth[4] = 0xFF;
        h.update(&bth);
        h.update(&body[12..]);
    } else {
        h.update(body);
    }
    h.finalize()
}

/// The ICRC of a packet sent over IPv4: `ip_header` is the 20-byte header, `udp_payload`
/// the BTH through the ICRC slot (whose content is ignored).
pub fn icrc_ipv4(ip_header: &[u8], udp_header: &[u8], udp_payload: &[u8]) -> u32 {
    let mut h = Hasher::new();
    h.update(&[0xFF; 8]);
    let mut ip = [0u8; 20];
    ip.copy_from_slice(&ip_header[..20]);
    ip[1] = 0xFF;
    ip[8] = 0xFF;
    ip[10] = 0xFF;
    ip[11] = 0xFF;
    h.update(&ip);
    crc_rest(h, udp_header, udp_payload)
}

/// The ICRC of a packet sent over IPv6 (`ip_header` the 40-byte header).
pub fn icrc_ipv6(ip_header: &[u8], udp_header: &[u8], udp_payload: &[u8]) -> u32 {
    let mut h = Hasher::new();
    h.update(&[0xFF; 8]);
    let mut ip = [0u8; 40];
    ip.copy_from_slice(&ip_header[..40]);
    ip[0] |= 0x0F;
    ip[1] = 0xFF;
    ip[2] = 0xFF;
    ip[3] = 0xFF;
    ip[7] = 0xFF;
    h.update(&ip);
    crc_rest(h, udp_header, udp_payload)
}

/// The ICRC with the IPv4 and UDP headers a Linux DF sender would build for `ep`.
pub fn icrc_for(ep: &Ipv4Endpoints, udp_payload: &[u8]) -> u32 {
    let ip = ipv4_header(ep, 8 + udp_payload.len());
    let udp = udp_header(ep, udp_payload.len());
    icrc_ipv4(&ip, &udp, udp_payload)
}

/// Computes the ICRC and stores it little-endian in the last 4 bytes.
pub fn write_icrc(ep: &Ipv4Endpoints, udp_payload: &mut [u8]) {
    let crc = icrc_for(ep, udp_payload);
    let n = udp_payload.len();
    if n >= ICRC_LEN {
        udp_payload[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    }
}

fn stored(udp_payload: &[u8]) -> Option<u32> {
    let n = udp_payload.len();
    (n >= ICRC_LEN)
        .then(|| u32::from_le_bytes(udp_payload[n - ICRC_LEN..].try_into().expect("4 bytes")))
}

/// Whether the stored ICRC matches.
pub fn check_icrc(ep: &Ipv4Endpoints, udp_payload: &[u8]) -> bool {
    stored(udp_payload) == Some(icrc_for(ep, udp_payload))
}

/// Checks the ICRC of a whole Ethernet frame (IPv4 or IPv6).
pub fn check_icrc_frame(frame: &[u8]) -> Result<bool> {
    let p = split_frame(frame)?;
    let crc = if p.ipv6 {
        icrc_ipv6(p.ip_header, p.udp_header, p.udp_payload)
    } else {
        icrc_ipv4(p.ip_header, p.udp_header, p.udp_payload)
    };
    Ok(stored(p.udp_payload) == Some(crc))
}
