//! The verbs API: every type a user of RDMA verbs touches, independent of any
//! backend.
//!
//! This crate describes the application-facing side of RDMA: work requests
//! and completions, queue pair and address attributes, memory access flags,
//! asynchronous events, device and port attributes, errors, and the memory
//! that is registered with a NIC. It contains no NIC: the soft-RoCE emulator
//! and any hardware backend implement verbs in terms of these types, and an
//! application written against them does not care which one runs underneath.
//!
//! Names and numeric values follow libibverbs (`infiniband/verbs.h` of
//! rdma-core) with the `ibv_` / `IBV_` prefixes dropped and Rust casing:
//! `IBV_WC_WR_FLUSH_ERR` is [`WcStatus::WrFlushErr`], `struct ibv_qp_attr` is
//! [`QpAttr`], `IBV_QP_PATH_MTU` is [`QpAttrMask::PATH_MTU`]. Every C enum
//! converts to and from its `u32` value, and the `Display` of the enums that
//! libibverbs can print is exactly its text (`ibv_wc_status_str`,
//! `ibv_event_type_str`, `ibv_port_state_str`, `ibv_node_type_str`,
//! `ibv_wr_opcode_str`). Semantics are documented from the Mellanox "RDMA
//! Aware Networks Programming User Manual" (cited as "manual x.y.z") and the
//! InfiniBand Architecture Specification (cited as "IBTA").
//!
//! Where C uses pointers and unions, the Rust types use values: objects are
//! named by number (QP number, CQ handle, keys), per-opcode union members of
//! `ibv_send_wr` are the variants of [`WrOperation`], the element union of
//! `ibv_async_event` is [`EventElement`], `bad_wr` is [`PostError::index`],
//! and registered memory is a [`MemBuf`] (see the [`membuf`] module for the
//! ownership model that makes NIC access sound without `unsafe`).
//!
//! Modules, one per concern (everything is also re-exported at the root):
//!
//! * [`wc`] — work completions (`ibv_poll_cq`).
//! * [`wr`] — send and receive work requests (`ibv_post_send`, `ibv_post_recv`).
//! * [`qp`] — QP types, states, attributes, attribute masks, GIDs, address vectors.
//! * [`mr`] — memory access flags and memory window types.
//! * [`srq`] — shared receive queue attributes.
//! * [`membuf`] — registered memory.
//! * [`event`] — asynchronous events (`ibv_get_async_event`).
//! * [`device`] — device and port attributes (`ibv_query_device`, `ibv_query_port`).
//! * [`error`] — errors and errno values.
//! * [`verbs`] — the [`Device`] trait every backend implements.
//! * [`connect`] — bringing a QP from RESET to RTS with the attributes each transport needs.
//! * [`handles`] — RAII handles over any `Device`: [`Context`], [`Pd`], [`Mr`], [`Cq`], [`Qp`], [`Srq`], [`Ah`], [`Mw`].

#![forbid(unsafe_code)]

#[macro_use]
mod macros;

pub mod cm;
pub mod connect;
pub mod device;
pub mod error;
pub mod event;
pub mod handles;
pub mod membuf;
pub mod mr;
pub mod qp;
pub mod srq;
pub mod verbs;
pub mod wc;
pub mod wr;

pub use cm::*;
pub use connect::*;
pub use device::*;
pub use error::*;
pub use event::*;
pub use handles::*;
pub use membuf::*;
pub use mr::*;
pub use qp::*;
pub use srq::*;
pub use verbs::*;
pub use wc::*;
pub use wr::*;
