//! The subcommands of `rdma-emu` beyond `scenario`: `devinfo`, `pingpong`, `bench` (with
//! `bench flood`), `exec`.

pub(crate) mod baseline;
pub(crate) mod bench;
pub(crate) mod devinfo;
pub(crate) mod exec;
pub(crate) mod flood;
pub(crate) mod stats;

/// One-line errors and size checks, shared with emu-core's examples.
#[path = "../../../emu-core/examples/common/checks.rs"]
pub(crate) mod checks;
/// rdma-core's ping-pong programs, shared with the `*_pingpong` examples of emu-core
/// (one source file, so the tool and the examples cannot drift apart).
#[path = "../../../emu-core/examples/common/pingpong.rs"]
pub(crate) mod pingpong;
