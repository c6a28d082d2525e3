//! The 40-byte GRH a UD receiver finds at the start of its receive buffer (IBTA 8.3
//! GRH). Over RoCEv2 the GRH stands for the IP header the packet arrived with (Annex
//! A17.4.5.1): for IPv6 it is that header; for IPv4 the first 20 bytes are zero and the
//! last 20 hold the IPv4 header, and the GIDs are the IPv4-mapped addresses
//! `::ffff:a.b.c.d`.

use std::net::Ipv4Addr;

use crate::error::{Error, Result};

/// GRH length in bytes.
pub const HEADER_LEN: usize = 40;

/// Where the IPv4 header sits in a GRH built from an IPv4 packet (Annex A17.4.5.1).
const V4: usize = 20;

/// A view of a 40-byte GRH, in either of its two RoCEv2 layouts.
#[derive(Debug, Clone)]
pub struct GrhPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> GrhPacket<T> {
    /// Wraps a buffer without checking its length.
    pub fn new_unchecked(buffer: T) -> Self {
        GrhPacket { buffer }
    }

    /// Wraps a buffer of at least [`HEADER_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = GrhPacket { buffer };
        p.check_len()?;
        Ok(p)
    }

    /// [`Error::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Whether this is the IPv4 layout: 20 zero bytes, then an IPv4 header.
    pub fn is_ipv4(&self) -> bool {
        self.b()[..V4].iter().all(|&x| x == 0) && self.b()[V4] >> 4 == 4
    }

    /// 4 for the IPv4 layout, otherwise the IPv6 version nibble (6 when well formed).
    pub fn ip_version(&self) -> u8 {
        if self.is_ipv4() {
            4
        } else {
            self.b()[0] >> 4
        }
    }

    /// Traffic class (IPv4: the TOS byte).
    pub fn traffic_class(&self) -> u8 {
        if self.is_ipv4() {
            self.b()[V4 + 1]
        } else {
            ((self.word0() >> 20) & 0xFF) as u8
        }
    }

    /// Flow label (IPv4: 0).
    pub fn flow_label(&self) -> u32 {
        if self.is_ipv4() {
            0
        } else {
            self.word0() & 0xF_FFFF
        }
    }

    /// IPv6 payload length, or the IPv4 total length.
    pub fn payload_len(&self) -> u16 {
        let at = if self.is_ipv4() { V4 + 2 } else { 4 };
        u16::from_be_bytes([self.b()[at], self.b()[at + 1]])
    }

    /// Next header / IPv4 protocol.
    pub fn next_header(&self) -> u8 {
        self.b()[if self.is_ipv4() { V4 + 9 } else { 6 }]
    }

    /// Hop limit / IPv4 TTL.
    pub fn hop_limit(&self) -> u8 {
        self.b()[if self.is_ipv4() { V4 + 8 } else { 7 }]
    }

    /// Source GID (IPv4: the mapped source address).
    pub fn sgid(&self) -> [u8; 16] {
        self.gid(V4 + 12, 8)
    }

    /// Destination GID (IPv4: the mapped destination address).
    pub fn dgid(&self) -> [u8; 16] {
        self.gid(V4 + 16, 24)
    }

    fn word0(&self) -> u32 {
        let b = self.b();
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    fn gid(&self, v4_at: usize, v6_at: usize) -> [u8; 16] {
        let b = self.b();
        if self.is_ipv4() {
            Ipv4Addr::new(b[v4_at], b[v4_at + 1], b[v4_at + 2], b[v4_at + 3])
                .to_ipv6_mapped()
                .octets()
        } else {
            let mut g = [0u8; 16];
            g.copy_from_slice(&b[v6_at..v6_at + 16]);
            g
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> GrhPacket<T> {
    /// Writes the IPv4 layout: 20 zero bytes, then an IPv4 header without options (DF
    /// set, identification 0, a correct header checksum).
    pub fn set_ipv4(
        &mut self,
        tos: u8,
        total_len: u16,
        ttl: u8,
        protocol: u8,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) {
        let b = &mut self.buffer.as_mut()[..HEADER_LEN];
        b.fill(0);
        let ip = &mut b[V4..];
        ip[0] = 0x45;
        ip[1] = tos;
        ip[2..4].copy_from_slice(&total_len.to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = ttl;
        ip[9] = protocol;
        ip[12..16].copy_from_slice(&src.octets());
        ip[16..20].copy_from_slice(&dst.octets());
        let sum = crate::frame::ipv4_checksum(ip);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
    }

    /// Writes the IPv6 layout (IBTA 8.3 GRH, the same bytes as an IPv6 header).
    #[allow(clippy::too_many_arguments)]
    pub fn set_ipv6(
        &mut self,
        traffic_class: u8,
        flow_label: u32,
        payload_len: u16,
        next_header: u8,
        hop_limit: u8,
        sgid: &[u8; 16],
        dgid: &[u8; 16],
    ) {
        let b = &mut self.buffer.as_mut()[..HEADER_LEN];
        let w = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0xF_FFFF);
        b[0..4].copy_from_slice(&w.to_be_bytes());
        b[4..6].copy_from_slice(&payload_len.to_be_bytes());
        b[6] = next_header;
        b[7] = hop_limit;
        b[8..24].copy_from_slice(sgid);
        b[24..40].copy_from_slice(dgid);
    }
}

/// The fields of a GRH as a verbs consumer reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrhRepr {
    /// 4 (an IPv4 header in the last 20 bytes) or 6 (an IPv6 header).
    pub ip_version: u8,
    /// Traffic class (IPv4: the TOS byte).
    pub traffic_class: u8,
    /// Flow label (IPv6 only).
    pub flow_label: u32,
    /// Payload length (IPv6) or IPv4 total length.
    pub payload_len: u16,
    /// Next header / protocol (17, UDP).
    pub next_header: u8,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Source GID (IPv4: `::ffff:a.b.c.d`).
    pub sgid: [u8; 16],
    /// Destination GID.
    pub dgid: [u8; 16],
}

impl GrhRepr {
    /// The GRH of a RoCEv2 packet that arrived over IPv4 from `src` to `dst`, with
    /// `ip_total_len` the IPv4 total length (TOS 0, TTL 64, UDP, as kernel rxe sends).
    pub fn for_ipv4(src: Ipv4Addr, dst: Ipv4Addr, ip_total_len: u16) -> GrhRepr {
        GrhRepr {
            ip_version: 4,
            traffic_class: 0,
            flow_label: 0,
            payload_len: ip_total_len,
            next_header: 17,
            hop_limit: 64,
            sgid: src.to_ipv6_mapped().octets(),
            dgid: dst.to_ipv6_mapped().octets(),
        }
    }

    /// Reads a GRH: the IPv4 layout (Annex A17.4.5.1) or an IPv6 header (IBTA 8.3);
    /// [`Error::Truncated`] under 40 bytes, [`Error::BadVersion`] for anything else.
    pub fn parse<T: AsRef<[u8]>>(p: &GrhPacket<T>) -> Result<GrhRepr> {
        p.check_len()?;
        let v = p.ip_version();
        // Either the IPv4 layout or an IPv6 header; a 4 in byte 0 is neither.
        if !(p.is_ipv4() || v == 6) {
            return Err(Error::BadVersion(v));
        }
        Ok(GrhRepr {
            ip_version: v,
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            payload_len: p.payload_len(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            sgid: p.sgid(),
            dgid: p.dgid(),
        })
    }

    /// Writes the 40 bytes: the IPv4 layout when `ip_version` is 4 (from the last 4
    /// bytes of each GID), the IPv6 one otherwise.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`] (as smoltcp's `emit`).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut GrhPacket<T>) {
        if self.ip_version == 4 {
            let a = |g: &[u8; 16]| Ipv4Addr::new(g[12], g[13], g[14], g[15]);
            p.set_ipv4(
                self.traffic_class,
                self.payload_len,
                self.hop_limit,
                self.next_header,
                a(&self.sgid),
                a(&self.dgid),
            );
        } else {
            p.set_ipv6(
                self.traffic_class,
                self.flow_label,
                self.payload_len,
                self.next_header,
                self.hop_limit,
                &self.sgid,
                &self.dgid,
            );
        }
    }

    /// [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_and_ipv6_round_trip() {
        let g = GrhRepr::for_ipv4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 100);
        let mut b = [0xAAu8; 40];
        g.emit(&mut GrhPacket::new_unchecked(&mut b[..]));
        assert!(b[..20].iter().all(|&x| x == 0));
        assert_eq!(b[20], 0x45);
        assert_eq!(
            crate::frame::ipv4_checksum(&b[20..]),
            u16::from_be_bytes([b[30], b[31]])
        );
        let p = GrhPacket::new_checked(&b[..]).unwrap();
        assert!(p.is_ipv4());
        assert_eq!(&p.sgid()[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(GrhRepr::parse(&p).unwrap(), g);
        let g6 = GrhRepr {
            ip_version: 6,
            traffic_class: 3,
            flow_label: 0x12345,
            payload_len: 9,
            next_header: 17,
            hop_limit: 1,
            sgid: [1; 16],
            dgid: [2; 16],
        };
        g6.emit(&mut GrhPacket::new_unchecked(&mut b[..]));
        assert_eq!(b[0], 0x60);
        assert_eq!(
            GrhRepr::parse(&GrhPacket::new_unchecked(&b[..])).unwrap(),
            g6
        );
        assert_eq!(g6.buffer_len(), HEADER_LEN);
    }

    #[test]
    fn short_or_foreign_buffers_are_errors() {
        let b = [0u8; 40];
        assert_eq!(
            GrhPacket::new_checked(&b[..39]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            GrhRepr::parse(&GrhPacket::new_unchecked(&b[..39])),
            Err(Error::Truncated)
        );
        // version 4 in the first byte is not the IPv4 layout (found by the fuzzer)
        let mut v4_at_0 = [0u8; 40];
        v4_at_0[0] = 0x45;
        assert_eq!(
            GrhRepr::parse(&GrhPacket::new_unchecked(&v4_at_0[..])),
            Err(Error::BadVersion(4))
        );
        // all zero: neither layout
        assert_eq!(
            GrhRepr::parse(&GrhPacket::new_unchecked(&b[..])),
            Err(Error::BadVersion(0))
        );
    }
}
