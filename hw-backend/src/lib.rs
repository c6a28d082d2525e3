//! `HwDevice`: the verbs API ([`verbs_api::Device`]) over libibverbs, through rdma-sys,
//! for kernel soft-RoCE (rxe) and real NICs (mlx5, ...).
//!
//! Code written against [`verbs_api::Device`] runs on the emulator's `EmuDevice` and,
//! unchanged, on a real device opened with [`HwDevice::open`]:
//!
//! ```no_run
//! use verbs_api::Device;
//! let dev = hw_backend::HwDevice::open(Some("rxe0"))?;
//! println!("{}: {} port(s)", dev.name(), dev.query_device()?.phys_port_cnt);
//! # Ok::<(), verbs_api::Error>(())
//! ```
//!
//! # The `hw` feature
//!
//! libibverbs is linked only with the cargo feature `hw` (the build then needs
//! libibverbs-dev, librdmacm-dev and libclang-dev; at run time libibverbs1 and
//! ibverbs-providers). Without it the crate still builds and exports the same names:
//! [`HwDevice::open`] and [`devices`] return `EOPNOTSUPP` saying the crate was built
//! without the feature, so `cargo test --workspace` needs nothing but Rust.
//!
//! # Modules
//!
//! * `sys` — the only module with `unsafe` code: owned wrappers of the libibverbs
//!   objects and the safety argument for registered memory.
//! * `layout` — hands the C structs of `verbs_ffi::sys`, which `verbs_ffi::convert`
//!   builds from and reads into verbs-api types (one copy, shared with capi), to
//!   rdma-sys's functions as rdma-sys's own structs, by casts whose soundness it checks
//!   at compile time against the installed headers (its own `unsafe`, with its safety
//!   argument).
//! * `cm` — `HwCm`: the connection manager over librdmacm (its own `unsafe`, with its
//!   safety argument).
//! * `device` — [`HwDevice`]: the object tables and the `Device` implementation.
//! * `disabled` — the build without the `hw` feature.
//!
//! # Errors
//!
//! Verbs return the errno libibverbs reports, as [`verbs_api::Error`]. No device at all
//! is ENODEV with a message saying how to create a soft-RoCE device; a named device
//! that does not exist is [`verbs_api::Error::NoDevice`]. Nothing panics on a missing
//! device. (The libibverbs *library* itself is linked dynamically: a binary built with
//! `hw` needs `libibverbs.so.1` to start at all, and the dynamic loader names it when it
//! is missing; without a provider package it finds no device, which is the ENODEV
//! above.)
// `unsafe_code` is denied by the workspace; the FFI modules `sys`, `cm` and `layout`
// allow it. The build without `hw` has no such module and forbids it outright.
#![cfg_attr(not(feature = "hw"), forbid(unsafe_code))]

#[cfg(feature = "hw")]
mod cm;
#[cfg(feature = "hw")]
mod device;
#[cfg(feature = "hw")]
mod layout;
#[cfg(feature = "hw")]
mod sys;

#[cfg(not(feature = "hw"))]
mod disabled;

#[cfg(feature = "hw")]
pub use cm::HwCm;
#[cfg(feature = "hw")]
pub use device::{devices, wait_fd_readable, HwDevice};
#[cfg(not(feature = "hw"))]
pub use disabled::{devices, wait_fd_readable, HwDevice};

/// True when this build links libibverbs (the `hw` feature).
pub const HW_ENABLED: bool = cfg!(feature = "hw");

/// One entry of the device list (`ibv_get_device_list`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceListEntry {
    /// `ibv_get_device_name`, e.g. `rxe0` or `mlx5_0`.
    pub name: String,
    /// `ibv_get_device_guid`, as the big-endian value of the GUID bytes.
    pub guid: u64,
    /// The kernel device name (`uverbsN`).
    pub dev_name: String,
}
