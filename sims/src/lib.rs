//! A deterministic, faulty, in-memory RoCE network for testing RDMA code and for
//! learning how the transports behave.
//!
//! - [`Fabric`]: emulated devices (`emu_core::nic::EmuDevice`) attach to it and are
//!   used through `verbs_api::Device`, unchanged; virtual time; per-direction seeded
//!   faults ([`LinkConfig`]): loss, duplication, latency with jitter (reordering),
//!   corruption, MTU, bandwidth with a finite queue; partition/heal and hold/release;
//!   per-packet [`Rule`]s over decoded headers.
//! - [`RuleHook`]: the same rules on the UDP link of an `EmuDevice` toward a real peer.
//! - [`Trace`]: every packet with its virtual time, direction, headers and fate,
//!   rendered as a ladder diagram in text ([`ladder`]) or SVG ([`svg`]), as a page
//!   that steps through it ([`html`]), or written as pcap ([`pcap`]).
//! - [`scenario`]: a library of short, documented programs that each show one rule of
//!   the transport and check that the engine follows it.
//! - [`script`]: scenario files, the same experiments written as text (TOML): hosts,
//!   QP attributes, fault rules, a program of verbs and the expected outcome, run and
//!   checked without writing Rust.
#![forbid(unsafe_code)]

pub mod chaos;
pub mod fabric;
pub mod fault;
pub mod hook;
pub mod html;
pub mod ladder;
pub mod pair;
pub mod pcap;
mod queue;
pub mod replay;
pub mod rules;
pub mod scenario;
pub mod script;
pub mod svg;
pub mod trace;

pub use fabric::{Fabric, FabricError, FabricStats, Station, Timer};
pub use fault::LinkConfig;
pub use hook::RuleHook;
pub use rules::{Action, Kind, Match, PacketInfo, Rule, Which};
pub use trace::{Cause, Fate, Label, PacketRecord, Trace, TraceDevice, TraceMode};

/// The code blocks of `docs/testing-your-code.md`, run as doctests so the guide stays
/// true.
#[cfg(doctest)]
#[doc = include_str!("../../docs/testing-your-code.md")]
pub struct TestingYourCodeGuide;

/// The Rust code of the README, run as a doctest so the first example a user copies
/// works.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExample;
