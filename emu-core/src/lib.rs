//! The emulated RDMA NIC.
//!
//! - [`engine`]: the sans-IO RoCEv2 transport (QP state machine, requester, responder,
//!   completer, retransmission, RNR) and every verbs object of one device. Pure: no
//!   sockets, no threads, no clock.
//!
//! - [`nic`]: `EmuDevice`, the `verbs_api::Device` implementation that runs the engine on
//!   a UDP socket with a thread of its own.
//!
//! - [`cm`]: the connection manager (librdmacm's API) over the IB CM protocol on QP1.
#![forbid(unsafe_code)]

pub mod cm;
pub mod engine;
mod host;
pub mod nic;
mod notify;
mod seed;
