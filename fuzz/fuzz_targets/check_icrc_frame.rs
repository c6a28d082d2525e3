//! Any bytes as an Ethernet frame: splitting it and checking its ICRC never panics; any
//! bytes as an IPv4 datagram (what the interop mode's raw socket reads) split to Ok or
//! Err, and what splits lies within the input; any bytes as a UDP payload give an IP ID
//! solved from their ICRC only if the ICRC is right with it; any bytes as a GRH parse
//! to Ok or Err.
#![no_main]

use emu_wire::{GrhPacket, GrhRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = emu_wire::check_icrc_frame(data);
    if let Ok(p) = emu_wire::split_ipv4(data) {
        assert_eq!(p.ip_header.len(), 20);
        assert!(28 + p.udp_payload.len() <= data.len());
    }
    let ep = emu_wire::Ipv4Endpoints {
        src: std::net::Ipv4Addr::new(10, 0, 0, 1),
        dst: std::net::Ipv4Addr::new(10, 0, 0, 2),
        ip_id: data.first().map_or(0, |b| u16::from(*b) * 257),
        src_port: 49152,
        dst_port: 4791,
    };
    if let Some(ip_id) = emu_wire::icrc_ip_id(&ep, data) {
        assert!(emu_wire::check_icrc(&emu_wire::Ipv4Endpoints { ip_id, ..ep }, data));
    }
    if let Ok(grh) = GrhRepr::parse(&GrhPacket::new_unchecked(data)) {
        // what parses re-emits to a GRH that parses the same
        let mut buf = [0u8; 40];
        grh.emit(&mut GrhPacket::new_unchecked(&mut buf[..]));
        assert_eq!(GrhRepr::parse(&GrhPacket::new_unchecked(&buf[..])), Ok(grh));
    }
});
