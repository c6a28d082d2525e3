//! The subcommands of `rdma-emu` beyond `scenario`: `devinfo`, `pingpong`, `bench` (with
//! `bench flood`), `exec`.

pub(crate) mod baseline;
pub(crate) mod bench;
pub(crate) mod devinfo;
pub(crate) mod exec;
pub(crate) mod flood;
pub(crate) mod stats;

// `checks.rs`, `pingpong.rs` and `exec/config.rs` are symbolic links to the files they
// share, so that one source serves both crates and `cargo package` still puts their
// text in this crate's package (a `#[path]` out of the crate would leave it out).

/// One-line errors and size checks, shared with emu-core's examples
/// (`emu-core/examples/common/checks.rs`).
pub(crate) mod checks;
/// rdma-core's ping-pong programs, shared with the `*_pingpong` examples of emu-core
/// (`emu-core/examples/common/pingpong.rs`: one source file, so the tool and the
/// examples cannot drift apart).
pub(crate) mod pingpong;
