//! Any bytes as an Ethernet frame: splitting it and checking its ICRC never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = emu_wire::check_icrc_frame(data);
    let _ = emu_wire::GrhRepr::parse(data);
});
