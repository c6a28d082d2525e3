//! Any bytes: the CM MAD decoder (`CmMsg::decode`) and the rdma_cm private-data header
//! parser (`CmaHdr::unwrap`) return a value or an error, never panic; a MAD that decodes
//! re-encodes to bytes that decode to the same message.
#![no_main]

use emu_wire::mad::{CmMsg, CmaHdr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((tid, msg)) = CmMsg::decode(data) {
        let again = CmMsg::decode(&msg.encode(tid)).expect("a re-encoded MAD decodes");
        assert_eq!(again, (tid, msg));
    }
    let _ = CmaHdr::unwrap(data);
});
