//! A trace as a pcap file: every packet as its sender put it on the wire (Ethernet,
//! IPv4 with ID 0 and DF, UDP on the fabric's port, the RoCEv2 packet with its ICRC),
//! stamped with its virtual send time. Faults happen after this capture point: a
//! packet the link corrupts appears here intact, one it loses appears here too.
//!
//! Virtual addresses inside a labelled range (RETH and AtomicETH VAs into a `MemBuf`,
//! a heap address) are written label-relative, with the ICRC recomputed (see
//! [`Trace::canonical_bytes`]): the same seeded program writes the same file, byte for
//! byte, on every run.

use std::io::{self, Write};

use emu_wire::{Ipv4Endpoints, PcapWriter};

use crate::trace::Trace;

/// Writes `trace` to `w`. `InvalidInput` if the trace kept no bytes (it was recorded
/// without `TraceMode::Full`).
pub fn write<W: Write>(trace: &Trace, w: W) -> io::Result<W> {
    if trace.packets.iter().any(|p| p.bytes.is_none()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the trace holds no packet bytes (record with TraceMode::Full)",
        ));
    }
    let mut pcap = PcapWriter::new(w)?;
    for (p, bytes) in trace.packets.iter().zip(trace.canonical_bytes()) {
        let ep = Ipv4Endpoints {
            src: trace.devices[p.src].ip,
            dst: p.dst_ip,
            ip_id: 0,
            src_port: trace.port,
            dst_port: trace.port,
        };
        pcap.write_roce(p.sent, &ep, &bytes)?;
    }
    Ok(pcap.into_inner())
}
