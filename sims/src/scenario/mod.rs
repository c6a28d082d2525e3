//! The scenario library: short programs, written against `verbs_api` and run on a
//! [`Fabric`], that each show one rule of the transport and check that the engine
//! follows it (a scenario fails if the engine misbehaves).
//!
//! Pending until a device on a link can take a batch of datagrams under one engine
//! lock (as its UDP thread does; needs a `DeviceDriver::handle_datagrams` in emu-core):
//! "ACK coalescing" (delivered one at a time, every ACK-requesting packet is answered).

mod errors;
mod mw;
mod recovery;
mod ud;

use verbs_api::Sge;

use crate::pair::Host;
use crate::trace::Trace;
use crate::Fabric;

/// What the SEND scenarios send: readable text of at least 16 bytes. tshark 4.0's
/// RPC-over-RDMA heuristic (on by default) reads the 4-byte word at offset 12 of every
/// RC SEND payload before it checks the length, so a shorter payload ("hello") shows as
/// `[Malformed Packet: RPCoRDMA]`; text there is never an RPC-over-RDMA message type
/// (0 to 4), so the heuristic declines and the payload shows as data.
pub(crate) const HELLO: &[u8] = b"hello from a to b";

/// Writes [`HELLO`] at offset 0 of `h`'s memory and returns the SGE that sends it.
pub(crate) fn hello(h: &Host) -> Result<Sge, String> {
    h.mem.write(0, HELLO).map_err(|e| e.to_string())?;
    Ok(h.sge(0, HELLO.len() as u32))
}

/// What a scenario returns: `Err` names the check that failed.
pub type Check = Result<(), String>;

/// A named scenario.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Its name, for `rdma-emu scenario run NAME`.
    pub name: &'static str,
    /// What it shows, in one line.
    pub description: &'static str,
    /// The program.
    pub run: fn(&Fabric) -> Check,
}

/// A scenario's run: its trace and whether its checks held.
#[derive(Debug)]
pub struct Outcome {
    /// Every packet.
    pub trace: Trace,
    /// `Err` names the first check that failed.
    pub result: Check,
}

/// Every scenario, in teaching order.
pub fn all() -> &'static [Scenario] {
    &[
        recovery::RNR_NAK_THEN_SUCCESS,
        recovery::RNR_RETRY_EXHAUSTED,
        recovery::ACK_TIMEOUT_RETRANSMIT,
        recovery::RETRY_EXHAUSTED,
        recovery::PSN_SEQUENCE_ERROR,
        recovery::LOST_READ_RESPONSE,
        recovery::DUPLICATE_READ,
        recovery::DUPLICATE_ATOMIC,
        recovery::ACK_COALESCING,
        recovery::ICRC_CORRUPTION,
        recovery::LOSSY_LINK,
        errors::UC_MESSAGE_LOST,
        errors::RKEY_VIOLATION,
        errors::CQ_OVERRUN,
        errors::SRQ_LIMIT,
        errors::FENCE,
        errors::QP_ERROR_FLUSH,
        ud::UD_OVER_MTU,
        ud::QKEY_MISMATCH,
        mw::MW_INVALIDATION,
    ]
}

/// The scenario called `name`.
pub fn find(name: &str) -> Option<&'static Scenario> {
    all().iter().find(|s| s.name == name)
}

/// Runs `s` on a fresh fabric seeded with `seed`.
pub fn run(s: &Scenario, seed: u64) -> Outcome {
    let f = Fabric::new(seed);
    let result = (s.run)(&f);
    Outcome {
        trace: f.trace(),
        result,
    }
}

/// `Err(what)` unless `cond`.
pub(crate) fn ensure(cond: bool, what: impl FnOnce() -> String) -> Check {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

/// `Err` unless `got == want`, naming both.
pub(crate) fn expect_eq<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Check {
    ensure(got == want, || {
        format!("{what}: got {got:?}, want {want:?}")
    })
}
