//! The conformance suite: written once against the [`Device`] trait of `verbs-api` and
//! run on every backend.
//!
//! A [`Case`] is one checked rule: a name, the rule it checks with its citation (manual
//! section or IBTA reference), what it produces (WC statuses and async events, for the
//! coverage matrix) and a function that runs it in an [`Env`]: one opened device on
//! which it creates what it needs (two QPs on one device talk to each other, as on a
//! single real NIC). A case passes, fails (panics, with the reason) or is skipped when
//! the backend cannot produce its condition (it says why).
//!
//! Backends: the emulator over UDP (`tests/conformance_emu_udp.rs`, part of `cargo test`),
//! and any other [`Backend`] the `hw-backend` and `emu-sims` crates provide.
//!
//! [`matrix`] maps every `WcStatus` and every async event type to the cases that
//! produce it, or to the reason none can; a test fails when a variant has no entry.
#![forbid(unsafe_code)]

pub mod backends;
pub mod cases;
pub mod env;
pub mod matrix;

use std::sync::Arc;

use verbs_api::{AsyncEventType, ConnectionManager, Device, WcStatus};

pub use backends::{EmuFabric, EmuUdp};
pub use env::Env;

/// What a case makes the device produce (for the coverage matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Produces {
    /// A work completion with this status.
    Wc(WcStatus),
    /// An asynchronous event of this type.
    Event(AsyncEventType),
}

/// One conformance case.
#[derive(Clone, Debug)]
pub struct Case {
    /// Unique name, `group::what`.
    pub name: String,
    /// The rule checked and where it is written (manual section or IBTA reference).
    pub rule: &'static str,
    /// The statuses and events the case produces.
    pub produces: Vec<Produces>,
    /// Runs the case.
    pub run: Runner,
    /// What the case needs of the fault-injection capability ([`Faults`]); backends
    /// without it skip the case.
    pub needs: FaultNeed,
}

/// What a case needs of a backend's fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultNeed {
    /// Nothing: a healthy device shows the condition.
    Nothing,
    /// Only the link going down and up ([`Faults::port_down`], [`Faults::port_up`]),
    /// which hardware can do by taking the port's network interface down.
    Link,
    /// Any fault.
    Any,
}

/// How a case runs: a plain function, or one with a parameter (for generated families
/// such as every state transition or every message size).
#[derive(Clone, Copy, Debug)]
pub enum Runner {
    /// `fn(&Env) -> Outcome`.
    Plain(fn(&Env) -> Outcome),
    /// `fn(&Env, param) -> Outcome`.
    Param(fn(&Env, u64) -> Outcome, u64),
}

/// What a case that did not fail reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The rule holds.
    Pass,
    /// The backend cannot produce the condition; the reason is printed.
    Skip(String),
}

impl Case {
    /// A case run by `f`.
    pub fn new(name: impl Into<String>, rule: &'static str, f: fn(&Env) -> Outcome) -> Case {
        Case {
            name: name.into(),
            rule,
            produces: Vec::new(),
            run: Runner::Plain(f),
            needs: FaultNeed::Nothing,
        }
    }

    /// A case of a generated family, run by `f` with `param`.
    pub fn param(
        name: impl Into<String>,
        rule: &'static str,
        f: fn(&Env, u64) -> Outcome,
        param: u64,
    ) -> Case {
        Case {
            name: name.into(),
            rule,
            produces: Vec::new(),
            run: Runner::Param(f, param),
            needs: FaultNeed::Nothing,
        }
    }

    /// Declares that the case produces WC `status`.
    pub fn wc(mut self, status: WcStatus) -> Case {
        self.produces.push(Produces::Wc(status));
        self
    }

    /// Declares that the case needs the fault-injection capability.
    pub fn faulty(mut self) -> Case {
        self.needs = FaultNeed::Any;
        self
    }

    /// Declares that the case needs no fault but the link going down and up.
    pub fn link_faulty(mut self) -> Case {
        self.needs = FaultNeed::Link;
        self
    }

    /// Declares that the case produces async event `ev`.
    pub fn event(mut self, ev: AsyncEventType) -> Case {
        self.produces.push(Produces::Event(ev));
        self
    }

    /// Runs the case in `env`.
    pub fn execute(&self, env: &Env) -> Outcome {
        match self.run {
            Runner::Plain(f) => f(env),
            Runner::Param(f, p) => f(env, p),
        }
    }
}

/// Faults a backend can inject on the network of the device it opened, for conditions a
/// healthy device never shows (IBTA error flows that need a misbehaving peer or link).
/// The emulator on the simulated fabric implements it; hardware does not, and cases that
/// need it are skipped there with the reason.
pub trait Faults: Send + Sync {
    /// From now on every RC ACKNOWLEDGE (ACK, NAK, RNR NAK) is lost.
    fn drop_all_acks(&self);
    /// The next RDMA READ RESPONSE arrives `n` bytes short, with a correct ICRC.
    fn truncate_next_read_response(&self, n: usize);
    /// From now on the LAST packet of every SEND is lost: a multi-packet SEND starts
    /// at the responder and never finishes.
    fn drop_send_tails(&self);
    /// The port's cable is pulled: port 1 goes DOWN (`PORT_ERR`).
    fn port_down(&self);
    /// The link comes back and port 1 goes ACTIVE (`PORT_ACTIVE`).
    fn port_up(&self);
    /// The SM sets GID table entry `index` of port 1 (`Gid::ZERO` removes it).
    fn set_gid(&self, index: u32, gid: verbs_api::Gid);
    /// The SM sets P_Key table entry `index` of port 1.
    fn set_pkey(&self, index: u32, pkey: u16);
    /// The SM gives port 1 a new LID.
    fn set_lid(&self, lid: u16);
    /// Another SM (at `sm_lid`) takes over port 1.
    fn change_sm(&self, sm_lid: u16);
    /// The SM asks port 1's clients to reregister.
    fn client_reregister(&self);
    /// From now on every MAD to or from QP1 (the CM's GSI QP) is lost: the CM's peer
    /// never answers.
    fn drop_cm_mads(&self);
    /// The device has a catastrophic error.
    fn fail_device(&self);
    /// SRQ `srq` has a catastrophic error.
    fn fail_srq(&self, srq: verbs_api::SrqId);
    /// Whether only [`Faults::port_down`] and [`Faults::port_up`] work (hardware, where
    /// they take the port's network interface down and up); the other calls panic.
    fn link_only(&self) -> bool {
        false
    }
    /// The adapter fails QP `qpn`: its oldest send WR completes with `status` (an
    /// adapter-only status such as `GENERAL_ERR`), the QP goes to ERR.
    fn fail_qp(&self, qpn: u32, status: verbs_api::WcStatus);
}

/// What a backend opens for one case.
pub struct Opened {
    /// The device.
    pub dev: Arc<dyn Device>,
    /// Its fault-injection capability, if the backend has one.
    pub faults: Option<Arc<dyn Faults>>,
    /// The device runs on virtual time: waiting costs no real time.
    pub virtual_time: bool,
    /// The GID index of port 1 the cases use.
    pub gid_index: u8,
    /// Opens a connection manager for the device, if the backend has one.
    pub cm: Option<CmOpener>,
}

/// Opens the connection manager (manual chapter 4) of the device a backend opened for a
/// case: the emulator's `EmuCm` on the backend's clock, or librdmacm on hardware. Each
/// call opens a new one.
pub type CmOpener = Arc<dyn Fn() -> verbs_api::Result<Arc<dyn ConnectionManager>> + Send + Sync>;

/// A backend the suite runs on: it opens a fresh device for each case.
pub trait Backend: Send + Sync {
    /// Short name for reports (`emu-udp`, `emu-fabric`, `rxe`, ...).
    fn name(&self) -> &str;
    /// Opens a device for one case. Cases may run in parallel: each call returns a
    /// device of its own, or a shared one on which cases do not disturb each other.
    fn open(&self) -> Opened;
    /// Whether the backend is the emulator (which needs no natural fault to show a
    /// condition); hardware cases produce conditions naturally or skip.
    fn is_emulator(&self) -> bool;
}

/// Runs `case` on a fresh device of `backend`, turning a panic into a failure.
pub fn run_case(case: &Case, backend: &dyn Backend) -> matrix::Verdict {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let opened = backend.open();
        match (case.needs, &opened.faults) {
            (FaultNeed::Nothing, _) => {}
            (_, None) => {
                return Outcome::Skip(format!(
                    "needs fault injection, which the {} backend does not have",
                    backend.name()
                ))
            }
            (FaultNeed::Any, Some(f)) if f.link_only() => {
                return Outcome::Skip(format!(
                    "needs fault injection beyond taking the link down, which the {} \
                     backend does not have",
                    backend.name()
                ))
            }
            _ => {}
        }
        case.execute(&Env::from_opened(opened, backend))
    }));
    match r {
        Ok(Outcome::Pass) => matrix::Verdict::Pass,
        Ok(Outcome::Skip(why)) => matrix::Verdict::Skip(why),
        Err(p) => matrix::Verdict::Fail(
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into()),
        ),
    }
}

/// Cases of features the emulator does not have yet (the README lists them as
/// missing): runners report them as ignored until the feature lands.
pub const EMU_PENDING: &[&str] = &[];

/// Cases whose condition the simulated fabric of `emu-sims` cannot carry yet, though the
/// emulator over UDP passes them: runners on the fabric report them as ignored.
pub const FABRIC_PENDING: &[&str] = &[];

/// Every case of the suite, in a stable order.
pub fn all_cases() -> Vec<Case> {
    let mut v = Vec::new();
    cases::register(&mut v);
    v
}
