//! The emulated RDMA NIC.
//!
//! - [`engine`]: the sans-IO RoCEv2 transport (QP state machine, requester, responder,
//!   completer, retransmission, RNR) and every verbs object of one device. Pure: no
//!   sockets, no threads, no clock.
//!
//! - [`nic`]: `EmuDevice`, the `verbs_api::Device` implementation that runs the engine on
//!   a UDP socket with a thread of its own.
//!
//! - [`ports`], [`notify`], [`seed`]: what the connection manager (the `emu-cm` crate,
//!   which runs over any `Device`) shares with the devices of this crate: the host-wide
//!   table of bound ports, the event queue with a pollable descriptor, the seed of
//!   per-process numbering.
#![forbid(unsafe_code)]

pub mod engine;
mod host;
pub mod nic;
pub mod notify;
pub mod ports;
pub mod seed;
