//! `HwDevice`: the verbs API over libibverbs (through rdma-sys) for kernel rxe and real NICs.
//!
//! Not implemented yet (see the README's "What does not work yet"): this crate is the
//! place the design reserves for it, and it exports nothing so that no caller can mistake
//! it for a working backend.
#![forbid(unsafe_code)]
