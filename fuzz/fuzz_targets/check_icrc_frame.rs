//! Any bytes as an Ethernet frame: splitting it and checking its ICRC never panics; any
//! bytes as an IPv4 datagram (what the interop mode's raw socket reads) split to Ok or
//! Err, and what splits lies within the input; any bytes as a GRH parse to Ok or Err.
#![no_main]

use emu_wire::{GrhPacket, GrhRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = emu_wire::check_icrc_frame(data);
    if let Ok(p) = emu_wire::split_ipv4(data) {
        assert_eq!(p.ip_header.len(), 20);
        assert!(28 + p.udp_payload.len() <= data.len());
    }
    if let Ok(grh) = GrhRepr::parse(&GrhPacket::new_unchecked(data)) {
        // what parses re-emits to a GRH that parses the same
        let mut buf = [0u8; 40];
        grh.emit(&mut GrhPacket::new_unchecked(&mut buf[..]));
        assert_eq!(GrhRepr::parse(&GrhPacket::new_unchecked(&buf[..])), Ok(grh));
    }
});
