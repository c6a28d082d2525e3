//! `libibverbs.so.1` over the emulator: unmodified C verbs programs (`ibv_rc_pingpong`,
//! perftest, your own) run on [`EmuDevice`](emu_core::nic::EmuDevice) with
//! `LD_LIBRARY_PATH` pointing at this library. See `capi/README.md`.
//!
//! The library replaces rdma-core's `libibverbs.so.1` (a provider inside rdma-core's
//! library would need the kernel's `/dev/infiniband/uverbs*`). It is a thin layer: each
//! verb converts its C structs and calls the [`verbs_api::Device`] verb of an
//! `EmuDevice`. Modules, one concern each:
//!
//! * [`config`]: which devices exist (environment, config file, defaults).
//! * `sys`: the C structs, generated from `<infiniband/verbs.h>` by bindgen, and
//!   `convert` (C structs to and from `verbs_api` values): both from the `verbs_ffi`
//!   crate, which `hw-backend` shares.
//! * `objects`: the objects behind the pointers the program holds.
//! * `memory`: registered C memory as a `MemBuf`.
//! * `verbs`: the exported verbs and the `ctx->ops` / `verbs_context` operations, one
//!   submodule per kind of object (`device`, `mr`, `cq`, `qp`, `srq`, `ah`, `mw`,
//!   `event`, `misc`) under one safety argument (`verbs/mod.rs`).
//! * `cq_ex`, `qp_ex`: the extended CQ polling and `ibv_wr_*` send verbs.
//! * `rdmacm`: the `rdma_*` calls of `librdmacm.so.1` over the emulator's connection
//!   manager, on the same objects.
//! * `rsocket`: rsockets (`rsocket`, `rsend`, `rpoll`, ...), librdmacm's socket API,
//!   in rsockets' own protocol on the emulator's QPs and CM.
//! * `stubs`: exports that fail cleanly (EOPNOTSUPP / ENOSYS) and the rate helpers.
//!
//! `unsafe` is denied in the crate and allowed only in `memory`, `objects`, `verbs`,
//! `rdmacm`, `rsocket`, `cq_ex` and `qp_ex`, each with its safety argument in its module
//! documentation.

#![deny(unsafe_code)]

pub mod config;
mod cq_ex;
mod memory;
mod objects;
mod qp_ex;
mod rdmacm;
mod rsocket;
mod stubs;
mod verbs;

/// The C structs the exports take (`verbs_ffi::sys`), for the tests that drive the
/// exports as a C program does.
#[doc(hidden)]
pub use verbs_ffi::sys;

pub use rdmacm::*;
pub use rsocket::*;
pub use stubs::*;
pub use verbs::*;
