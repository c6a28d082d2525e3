//! The management handle of an [`EmuDevice`](super::EmuDevice): the port and device
//! events a subnet manager, a cable or a hardware fault causes, driven from outside the
//! verbs (tests, the conformance suite's fault injection, the simulator). Each call runs
//! the engine's management operation (`engine::manage`) under the device lock and
//! hands out the resulting events and completions at once.

use std::sync::Weak;

use verbs_api::{Error, Gid, PortState, Result, SrqId, WcStatus};

use super::Inner;

/// Drives an [`EmuDevice`](super::EmuDevice)'s port and faults. It holds the device
/// weakly: once the device is dropped every call fails with ENODEV.
#[derive(Clone, Debug)]
pub struct Management(pub(super) Weak<Inner>);

impl Management {
    fn run<R>(
        &self,
        f: impl FnOnce(&mut crate::engine::Engine, std::time::Instant) -> Result<R>,
    ) -> Result<R> {
        let inner = self
            .0
            .upgrade()
            .ok_or_else(|| Error::NoDevice("the device is gone".into()))?;
        inner.with_engine(f)
    }

    /// The cable is pulled: the port goes DOWN (`PORT_ERR`). Packets are neither sent
    /// nor received until [`Management::port_up`].
    pub fn port_down(&self) -> Result<()> {
        self.set_port_state(PortState::Down)
    }

    /// The link comes back and the SM activates the port: ACTIVE (`PORT_ACTIVE`).
    pub fn port_up(&self) -> Result<()> {
        self.set_port_state(PortState::Active)
    }

    /// Sets the port's logical state (DOWN, INIT, ARMED, ACTIVE).
    pub fn set_port_state(&self, state: PortState) -> Result<()> {
        self.run(|e, _| e.set_port_state(state))
    }

    /// Sets GID table entry `index` (`Gid::ZERO` removes it): `GID_CHANGE`.
    pub fn set_gid(&self, index: u32, gid: Gid) -> Result<()> {
        self.run(|e, _| e.set_gid_entry(index, gid))
    }

    /// Sets P_Key table entry `index`: `PKEY_CHANGE`.
    pub fn set_pkey(&self, index: u32, pkey: u16) -> Result<()> {
        self.run(|e, _| e.set_pkey_entry(index, pkey))
    }

    /// Sets the port's LID: `LID_CHANGE`.
    pub fn set_lid(&self, lid: u16) -> Result<()> {
        self.run(|e, _| e.set_lid(lid))
    }

    /// A new subnet manager at `sm_lid`, service level `sm_sl`: `SM_CHANGE`.
    pub fn set_sm(&self, sm_lid: u16, sm_sl: u8) -> Result<()> {
        self.run(|e, _| e.set_sm(sm_lid, sm_sl))
    }

    /// The SM asks for client reregistration: `CLIENT_REREGISTER`.
    pub fn client_reregister(&self) -> Result<()> {
        self.run(|e, _| e.client_reregister())
    }

    /// A catastrophic device error: `DEVICE_FATAL`, every QP to ERR, later verbs EIO.
    pub fn fail_device(&self) -> Result<()> {
        self.run(|e, now| {
            e.fail_device(now);
            Ok(())
        })
    }

    /// A catastrophic error of an SRQ: `SRQ_ERR`, its QPs to ERR with `QP_FATAL`.
    pub fn fail_srq(&self, srq: SrqId) -> Result<()> {
        self.run(|e, now| e.fail_srq(now, srq))
    }

    /// An adapter error on a QP: its oldest send WQE completes with `status`, the QP
    /// goes to ERR (`engine::Engine::fail_qp`).
    pub fn fail_qp(&self, qpn: u32, status: WcStatus) -> Result<()> {
        self.run(|e, now| e.fail_qp(now, qpn, status))
    }
}
