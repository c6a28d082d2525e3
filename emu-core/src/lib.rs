//! The emulated RDMA NIC.
//!
//! - [`engine`]: the sans-IO RoCEv2 transport (QP state machine, requester, responder,
//!   completer, retransmission, RNR) and every verbs object of one device. Pure: no
//!   sockets, no threads, no clock.
//!
//! The `EmuDevice` that drives the engine on a link (UDP or the in-memory fabric) comes
//! with the Device API (see the README's status section).
#![forbid(unsafe_code)]

pub mod engine;
