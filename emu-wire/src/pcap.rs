//! A classic libpcap writer (LINKTYPE_ETHERNET, microsecond timestamps) for RoCEv2 traces.

use core::time::Duration;
use std::io::{self, Write};

use crate::frame::{build_frame, build_frame_v6};
use crate::icrc::{Ipv4Endpoints, Ipv6Endpoints};

/// The largest frame a record may hold.
const SNAPLEN: u32 = 262_144;
/// LINKTYPE_ETHERNET: Ethernet II frames without FCS.
const LINKTYPE_ETHERNET: u32 = 1;

/// Writes packets to a pcap stream that tshark and Wireshark read.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    w: W,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header: magic 0xA1B2C3D4 (microseconds), version 2.4, UTC,
    /// snap length 262144 (what tcpdump uses), LINKTYPE_ETHERNET.
    pub fn new(mut w: W) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&SNAPLEN.to_le_bytes());
        h.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        w.write_all(&h)?;
        Ok(PcapWriter { w })
    }

    /// Writes one whole Ethernet frame (no FCS) captured at `ts` (time since the epoch,
    /// or since any origin the reader should show; seconds wrap at 2^32). A frame
    /// longer than the snap length is an `InvalidInput` error.
    pub fn write_frame(&mut self, ts: Duration, frame: &[u8]) -> io::Result<()> {
        let len = u32::try_from(frame.len())
            .ok()
            .filter(|&l| l <= SNAPLEN)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too long"))?;
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&(ts.as_secs() as u32).to_le_bytes());
        h[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        self.w.write_all(&h)?;
        self.w.write_all(frame)
    }

    /// Frames `udp_payload` (which already holds its ICRC) in Ethernet, IPv4 (DF, TTL 64,
    /// `ep.ip_id`, a correct checksum) and UDP (checksum 0), and writes it.
    pub fn write_roce(
        &mut self,
        ts: Duration,
        ep: &Ipv4Endpoints,
        udp_payload: &[u8],
    ) -> io::Result<()> {
        self.write_frame(ts, &build_frame(ep, udp_payload))
    }

    /// [`PcapWriter::write_roce`] over IPv6 (traffic class 0, flow label 0, hop limit
    /// 64, UDP checksum 0).
    pub fn write_roce_v6(
        &mut self,
        ts: Duration,
        ep: &Ipv6Endpoints,
        udp_payload: &[u8],
    ) -> io::Result<()> {
        self.write_frame(ts, &build_frame_v6(ep, udp_payload))
    }

    /// Gives the stream back.
    pub fn into_inner(self) -> W {
        self.w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_header_and_records() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(Duration::new(3, 4_000_500), &[1, 2, 3])
            .unwrap();
        let ep = Ipv4Endpoints {
            src: [10, 0, 0, 1].into(),
            dst: [10, 0, 0, 2].into(),
            ip_id: 0,
            src_port: 0xC000,
            dst_port: 4791,
        };
        w.write_roce(Duration::from_secs(4), &ep, &[0u8; 20])
            .unwrap();
        assert!(w.write_frame(Duration::ZERO, &vec![0; 262_145]).is_err());
        let b = w.into_inner();
        assert_eq!(&b[..4], &[0xD4, 0xC3, 0xB2, 0xA1]);
        assert_eq!(&b[4..8], &[2, 0, 4, 0]);
        assert_eq!(&b[20..24], &[1, 0, 0, 0]);
        // first record: 3 s, 4000 us, 3 bytes captured and on the wire
        assert_eq!(
            &b[24..40],
            &[3, 0, 0, 0, 0xA0, 0x0F, 0, 0, 3, 0, 0, 0, 3, 0, 0, 0]
        );
        assert_eq!(&b[40..43], &[1, 2, 3]);
        let frame = crate::build_frame(&ep, &[0u8; 20]);
        assert_eq!(&b[43 + 8..43 + 12], &(frame.len() as u32).to_le_bytes());
        assert_eq!(&b[43 + 16..], &frame[..]);
    }
}
