//! A classic libpcap writer (LINKTYPE_ETHERNET, microsecond timestamps) for RoCEv2 traces.

use core::time::Duration;
use std::io::{self, Write};

use crate::frame::build_frame;
use crate::icrc::Ipv4Endpoints;

/// Writes packets to a pcap stream that tshark and Wireshark read.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    w: W,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header.
    pub fn new(mut w: W) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&65535u32.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        w.write_all(&h)?;
        Ok(PcapWriter { w })
    }

    /// Writes one whole Ethernet frame captured at `ts`.
    pub fn write_frame(&mut self, ts: Duration, frame: &[u8]) -> io::Result<()> {
        let len = u32::try_from(frame.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too long"))?;
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

    /// Gives the stream back.
    pub fn into_inner(self) -> W {
        self.w
    }
}
