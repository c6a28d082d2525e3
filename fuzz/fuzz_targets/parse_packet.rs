//! Any bytes (RC, UC, UD and XRC opcodes, so DETH, XRCETH, FETH and the rest):
//! `PacketRepr::parse` returns Ok or Err, never panics; what parses re-emits
//! to bytes that parse to the same repr and payload.
#![no_main]

use emu_wire::PacketRepr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((repr, payload)) = PacketRepr::parse(data) {
        let mut buf = vec![0u8; repr.buffer_len(payload.len())];
        let n = repr.emit(&mut buf, payload);
        let (again, payload2) = PacketRepr::parse(&buf[..n]).expect("re-emitted packet parses");
        let mut expected = repr;
        expected.bth.pad_count = emu_wire::pad_count(payload.len());
        assert_eq!(again, expected);
        assert_eq!(payload2, payload);
    }
});
