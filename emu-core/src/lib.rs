//! The emulated RDMA NIC.
//!
//! - [`engine`]: the sans-IO RoCEv2 transport (QP state machine, requester, responder,
//!   completer, retransmission, RNR) and every verbs object of one device. Pure: no
//!   sockets, no threads, no clock.
//!
//! - [`nic`]: `EmuDevice`, the `verbs_api::Device` implementation that runs the engine on
//!   a UDP socket with a thread of its own.
#![forbid(unsafe_code)]

pub mod engine;
pub mod nic;
