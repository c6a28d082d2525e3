//! The deterministic in-memory RoCE fabric (seeded drop, duplicate, reorder, delay,
//! corrupt, partition), the scenario library, ladder-diagram and pcap traces, and the
//! `rdma-emu` command-line tool.
//!
//! Not implemented yet (see the README's "What does not work yet").
#![forbid(unsafe_code)]
