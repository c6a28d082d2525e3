//! RoCEv2 on the wire: everything an RC, UC and UD transport puts in a UDP datagram to
//! port 4791, and how it is checked (IBTA vol. 1 chapter 9, Annex A17).
//!
//! # What this crate owns
//! The bytes, and nothing else: no queues, no timers, no sockets. A RoCEv2 packet is
//! IPv4 or IPv6 / UDP (destination port [`ROCEV2_PORT`]) / BTH ([`bth`], IBTA 9.2) /
//! the extended headers its [`Opcode`] calls for, in IBTA order ([`deth`], [`xrceth`], [`feth`],
//! [`reth`], [`atomic`], [`aeth`], [`imm`]; IBTA 9.3, the XRC annex and, for FLUSH, 1.5) / payload /
//! pad to a multiple of 4 /
//! 4-byte ICRC ([`icrc`], Annex A17.4). [`PacketRepr`] reads and writes that UDP
//! payload as a whole; [`Psn`] is the 24-bit sequence number (IBTA 9.7.1); [`grh`] is
//! the 40-byte GRH a UD receiver sees; [`frame`] splits and builds Ethernet/IP/UDP
//! frames; [`PcapWriter`] records traces that Wireshark decodes. [`mad`] is what QP1
//! carries: the connection manager's MADs (IBTA 12.6) and rdma_cm's private-data header.
//!
//! # Style
//! As smoltcp's `wire` module: each header has a view over bytes
//! (`XxxPacket<T: AsRef<[u8]>>`, with `new_unchecked`, `new_checked`, getters, and
//! setters when `T: AsMut<[u8]>`) and a `XxxRepr` of its fields (`parse`, `emit`,
//! `buffer_len`, and a `HEADER_LEN` constant in its module). No I/O but the pcap
//! writer's `Write`, no `unsafe`, and no input makes a parser panic (a property test
//! and two fuzz targets hold it to that). The ICRC is computed exactly as kernel rxe
//! does and is checked against 51 frames captured from it (`tests/golden.rs`; a 52nd,
//! a FLUSH whose ICRC rxe 6.12 computes wrongly, is rejected).
//!
//! # Example
//! Build a SEND ONLY, seal it with its ICRC, check and parse it back:
//!
//! ```
//! use emu_wire::{Opcode, PacketRepr, Psn, Ipv4Endpoints, write_icrc, check_icrc};
//!
//! let mut repr = PacketRepr::new(Opcode::RcSendOnly, 0x11, Psn::new(7));
//! repr.bth.ack_req = true;
//! let mut buf = [0u8; 64];
//! let n = repr.emit(&mut buf, b"hi");
//! let ep = Ipv4Endpoints { src: [10, 0, 0, 1].into(), dst: [10, 0, 0, 2].into(), ip_id: 0, src_port: 4791, dst_port: 4791 };
//! write_icrc(&ep, &mut buf[..n]);
//! assert!(check_icrc(&ep, &buf[..n]));
//! let (parsed, payload) = PacketRepr::parse(&buf[..n]).unwrap();
//! assert_eq!(parsed.bth.psn, Psn::new(7));
//! assert_eq!(payload, b"hi");
//! ```
#![forbid(unsafe_code)]

#[macro_use]
mod fixed;

pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod deth;
pub mod error;
pub mod feth;
pub mod frame;
pub mod grh;
pub mod icrc;
pub mod imm;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod psn;
pub mod reth;
pub mod xrceth;

pub use aeth::{rnr_timer_duration, AethPacket, AethRepr, NakCode, Syndrome};
pub use atomic::{AtomicAckEthPacket, AtomicAckEthRepr, AtomicEthPacket, AtomicEthRepr};
pub use bth::{pad_count, BthPacket, BthRepr};
pub use deth::{DethPacket, DethRepr};
pub use error::{Error, Result};
pub use feth::{FethPacket, FethRepr};
pub use frame::{build_frame, build_frame_v6, split_frame, split_ipv4, FrameParts, ROCEV2_PORT};
pub use grh::{GrhPacket, GrhRepr};
pub use icrc::{
    check_icrc, check_icrc_frame, check_icrc_v6, icrc_for, icrc_for_v6, icrc_ip_id, icrc_ipv4,
    icrc_ipv6, write_icrc, write_icrc_v6, Ipv4Endpoints, Ipv6Endpoints,
};
pub use imm::{IethPacket, ImmDtPacket};
pub use opcode::{Opcode, Position, Transport};
pub use packet::{PacketRepr, ICRC_LEN};
pub use pcap::PcapWriter;
pub use psn::Psn;
pub use reth::{RethPacket, RethRepr};
pub use xrceth::{XrcEthPacket, XrcEthRepr};
