//! The 40-byte GRH a UD receiver finds at the start of its buffer (IBTA 8.3; RoCEv2,
//! Annex A17.4.5.1: over IPv4 the first 20 bytes are zero and the last 20 hold the
//! IPv4 header).

use std::net::Ipv4Addr;

use crate::error::{Error, Result};

/// GRH length in bytes.
pub const HEADER_LEN: usize = 40;

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

fn mapped(a: Ipv4Addr) -> [u8; 16] {
    a.to_ipv6_mapped().octets()
}

impl GrhRepr {
    /// The GRH of a RoCEv2 packet that arrived over IPv4 from `src` to `dst`, with
    /// `ip_total_len` the IPv4 total length (DF set, TTL 64, TOS 0, as kernel rxe sends).
    pub fn for_ipv4(src: Ipv4Addr, dst: Ipv4Addr, ip_total_len: u16) -> GrhRepr {
        GrhRepr {
            ip_version: 4,
            traffic_class: 0,
            flow_label: 0,
            payload_len: ip_total_len,
            next_header: 17,
            hop_limit: 64,
            sgid: mapped(src),
            dgid: mapped(dst),
        }
    }

    /// Reads a GRH of 40 bytes.
    pub fn parse(b: &[u8]) -> Result<GrhRepr> {
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if b[20] >> 4 == 4 && b[..20].iter().all(|&x| x == 0) {
            let ip = &b[20..40];
            let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            return Ok(GrhRepr {
                ip_version: 4,
                traffic_class: ip[1],
                flow_label: 0,
                payload_len: u16::from_be_bytes([ip[2], ip[3]]),
                next_header: ip[9],
                hop_limit: ip[8],
                sgid: mapped(src),
                dgid: mapped(dst),
            });
        }
        if b[0] >> 4 != 6 {
            return Err(Error::BadVersion(b[0] >> 4));
        }
        let w = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let mut sgid = [0u8; 16];
        let mut dgid = [0u8; 16];
        sgid.copy_from_slice(&b[8..24]);
        dgid.copy_from_slice(&b[24..40]);
        Ok(GrhRepr {
            ip_version: 6,
            traffic_class: ((w >> 20) & 0xFF) as u8,
            flow_label: w & 0xF_FFFF,
            payload_len: u16::from_be_bytes([b[4], b[5]]),
            next_header: b[6],
            hop_limit: b[7],
            sgid,
            dgid,
        })
    }

    /// Writes the 40 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..HEADER_LEN];
        b.fill(0);
        if self.ip_version == 4 {
            let ip = &mut b[20..40];
            ip[0] = 0x45;
            ip[1] = self.traffic_class;
            ip[2..4].copy_from_slice(&self.payload_len.to_be_bytes());
            ip[6] = 0x40; // DF
            ip[8] = self.hop_limit;
            ip[9] = self.next_header;
            ip[12..16].copy_from_slice(&self.sgid[12..16]);
            ip[16..20].copy_from_slice(&self.dgid[12..16]);
            let sum = crate::frame::ipv4_checksum(ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
        } else {
            let w =
                (6u32 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0xF_FFFF);
            b[0..4].copy_from_slice(&w.to_be_bytes());
            b[4..6].copy_from_slice(&self.payload_len.to_be_bytes());
            b[6] = self.next_header;
            b[7] = self.hop_limit;
            b[8..24].copy_from_slice(&self.sgid);
            b[24..40].copy_from_slice(&self.dgid);
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
        g.emit(&mut b);
        assert!(b[..20].iter().all(|&x| x == 0));
        assert_eq!(GrhRepr::parse(&b).unwrap(), g);
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
        g6.emit(&mut b);
        assert_eq!(GrhRepr::parse(&b).unwrap(), g6);
        assert!(GrhRepr::parse(&b[..39]).is_err());
    }
}
