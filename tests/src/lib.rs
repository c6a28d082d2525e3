//! The conformance suite: written once against the `Device` trait of `verbs-api` and
//! instantiated for every backend.
//!
//! Not implemented yet (see the README's "What does not work yet"): the suite needs the
//! `Device` trait and at least one backend. Until then the engine's own scenario tests live
//! in `emu-core/tests/`.
#![forbid(unsafe_code)]
