//! The port's verbs (`ibv_query_port`, `ibv_query_gid`, `ibv_query_pkey`) and the
//! management operations a subnet manager, a cable or a hardware fault performs on the
//! device: port state, GID/P_Key tables, LID, SM, client reregistration, device failure
//! and SRQ failure, each with its asynchronous event (manual 6.1).

use std::time::Instant;

use verbs_api::{
    AsyncEvent, AsyncEventType, Error, EventElement, Gid, LinkLayer, PortAttr, PortCapFlags,
    PortState, Result, WcStatus,
};

use super::port::port_event;
use super::Engine;
use verbs_api::SrqId;

/// EIO, what libibverbs returns for verbs on a device that had a fatal error.
pub const EIO: i32 = 5;

impl Engine {
    /// `ibv_query_port` for port 1 (EINVAL for another port number).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port != super::PORT_NUM {
            return Err(Error::InvalidArgument("the device has one port, number 1"));
        }
        let l = &self.limits;
        let p = &self.port;
        Ok(PortAttr {
            state: p.state,
            max_mtu: l.active_mtu,
            active_mtu: p.link.active_mtu,
            gid_tbl_len: l.gid_tbl_len,
            // Manual 6.1.18: CLIENT_REREGISTER is generated only with this bit set.
            port_cap_flags: (PortCapFlags::IP_BASED_GIDS | PortCapFlags::CLIENT_REG_SUP).bits(),
            max_msg_sz: l.max_msg_sz,
            pkey_tbl_len: l.pkey_tbl_len as u16,
            lid: p.lid,
            sm_lid: p.sm_lid,
            sm_sl: p.sm_sl,
            // IBTA 14.2.5.6 PortPhysicalState: 5 LinkUp, 2 Polling (no link partner).
            phys_state: if p.state == PortState::Down { 2 } else { 5 },
            active_width: p.link.width,
            active_speed: p.link.speed,
            link_layer: LinkLayer::Ethernet,
            // The violation counters (IBTA 14.2.5.6: saturating).
            bad_pkey_cntr: u32::try_from(self.counters.bad_pkey).unwrap_or(u32::MAX),
            qkey_viol_cntr: u32::try_from(self.counters.qkey_violations).unwrap_or(u32::MAX),
            ..PortAttr::default()
        })
    }

    /// `ibv_query_gid`: the entry (all zero when empty). EINVAL for another port or an
    /// index outside the table.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        if port != super::PORT_NUM {
            return Err(Error::InvalidArgument("no such port"));
        }
        self.port.gid(index)
    }

    /// `ibv_query_pkey`: libibverbs reads the entry from sysfs, so a port or index with
    /// no entry fails as that open does, with ENOENT.
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        if port != super::PORT_NUM {
            return Err(Error::NotFound("no such port"));
        }
        self.port.pkey(u32::from(index))
    }

    /// Whether the device had a fatal error ([`Engine::fail_device`]).
    pub fn is_fatal(&self) -> bool {
        self.fatal
    }

    /// `Err(EIO)` once the device failed: what the verbs that create, change or post
    /// return then.
    pub fn check_alive(&self) -> Result<()> {
        if self.fatal {
            Err(Error::Os {
                errno: EIO,
                context: "the device had a fatal error",
            })
        } else {
            Ok(())
        }
    }

    // ---- management (what a subnet manager or a cable does) ----

    /// Sets the port's logical state: leaving ACTIVE raises `PORT_ERR`, entering it
    /// `PORT_ACTIVE` (manual 6.1.10-11). While it is not ACTIVE no packet is sent or
    /// received; QPs are not otherwise affected ("this will not affect the QPs ...
    /// although ... the retry count may be exceeded").
    pub fn set_port_state(&mut self, state: PortState) -> Result<()> {
        self.check_alive()?;
        self.port.set_state(state, &mut self.events)
    }

    /// The link under the port changed (an Ethernet port follows its network
    /// interface: MTU, speed). The active MTU is capped by the device's
    /// [`Limits::active_mtu`](super::Limits), which `query_port` reports as the
    /// maximum. QPs keep the path MTU they were given; a later `modify_qp` cannot set
    /// one above the new active MTU, and UD QPs created from now on send with it.
    pub fn set_link(&mut self, link: super::PortLink) -> Result<()> {
        self.check_alive()?;
        let cap = self.limits.active_mtu;
        self.port.link = super::PortLink {
            active_mtu: if link.active_mtu.bytes() > cap.bytes() {
                cap
            } else {
                link.active_mtu
            },
            ..link
        };
        Ok(())
    }

    /// Sets GID table entry `index` (`Gid::ZERO` removes it): `GID_CHANGE` (manual
    /// 6.1.19) if it changed. An alternate path whose source GID entry is removed
    /// can no longer be migrated to.
    pub fn set_gid_entry(&mut self, index: u32, gid: Gid) -> Result<()> {
        self.check_alive()?;
        self.port.set_gid(index, gid, &mut self.events)
    }

    /// Sets P_Key table entry `index`: `PKEY_CHANGE` (manual 6.1.13) if it changed.
    pub fn set_pkey_entry(&mut self, index: u32, pkey: u16) -> Result<()> {
        self.check_alive()?;
        self.port.set_pkey(index, pkey, &mut self.events)
    }

    /// Sets the port's LID: `LID_CHANGE` (manual 6.1.12) if it changed.
    pub fn set_lid(&mut self, lid: u16) -> Result<()> {
        self.check_alive()?;
        self.port.set_lid(lid, &mut self.events);
        Ok(())
    }

    /// A new subnet manager takes over the port: `SM_CHANGE` (manual 6.1.14).
    pub fn set_sm(&mut self, sm_lid: u16, sm_sl: u8) -> Result<()> {
        self.check_alive()?;
        self.port.set_sm(sm_lid, sm_sl, &mut self.events);
        Ok(())
    }

    /// The SM asks the port's clients to register their subscriptions again:
    /// `CLIENT_REREGISTER` (manual 6.1.18; the port advertises `CLIENT_REG_SUP`).
    pub fn client_reregister(&mut self) -> Result<()> {
        self.check_alive()?;
        self.events
            .push_back(port_event(AsyncEventType::ClientReregister));
        Ok(())
    }

    /// A catastrophic device error (manual 6.1.9): `DEVICE_FATAL` (affiliated with the
    /// device), then every QP not in RESET or ERR moves to ERR: the send WQE being
    /// transmitted completes with `FATAL_ERR` (manual 6.2.20), a receive WQE a message
    /// was being placed in with `REM_ABORT_ERR`, the rest are flushed. From then on the
    /// device moves no packet and the verbs that create, change or post fail with EIO
    /// ([`Engine::check_alive`]); polling CQs, reading events and destroying objects
    /// still work, so a program can drain and clean up. A second call does nothing.
    pub fn fail_device(&mut self, now: Instant) {
        if self.fatal {
            return;
        }
        self.fatal = true;
        // "The port ... becomes unusable" (manual 6.1.9); DEVICE_FATAL says so, not
        // PORT_ERR.
        self.port.state = PortState::Down;
        self.events.push_back(AsyncEvent {
            event_type: AsyncEventType::DeviceFatal,
            element: EventElement::Device,
        });
        let mut qpns: Vec<u32> = self.qps.keys().copied().collect();
        qpns.sort_unstable();
        for qpn in qpns {
            self.with_qp(now, qpn, |qp, ctx| qp.abort(ctx, Some(WcStatus::FatalErr)));
        }
        self.ready.clear();
    }

    /// An adapter error on QP `qpn` that completes its oldest send WQE with `status`
    /// (fault injection for a program's error paths). Any error status is accepted,
    /// including the two no IBTA RC/UC/UD rule produces and only adapters report:
    /// `RESP_TIMEOUT_ERR` (manual 6.2.21; e.g. ocrdma's response timeout) and
    /// `GENERAL_ERR` (manual 6.2.22; e.g. a CQE syndrome the driver cannot map). As
    /// after any completion error (IBTA 10.3.1, manual 3.5 "Error" state) the QP goes
    /// to ERR with no async event: the WQE completes with `status` (whether or not its
    /// packets had left), a message being received completes with `REM_ABORT_ERR`, and
    /// the other WQEs are flushed. A QP in RESET or ERR is left alone. EINVAL for an
    /// unknown QP or for `SUCCESS`/`WR_FLUSH_ERR`, which are not adapter errors.
    pub fn fail_qp(&mut self, now: Instant, qpn: u32, status: WcStatus) -> Result<()> {
        self.check_alive()?;
        if matches!(status, WcStatus::Success | WcStatus::WrFlushErr) {
            return Err(Error::InvalidArgument(
                "an injected QP error needs an error status other than WR_FLUSH_ERR",
            ));
        }
        self.with_qp(now, qpn, |qp, ctx| qp.fail(ctx, status))
            .ok_or(Error::InvalidArgument("no such QP"))
    }

    /// A catastrophic error of SRQ `srq` (manual 6.1.15): `SRQ_ERR` (affiliated with
    /// the SRQ), then every QP on it goes to ERR with `QP_FATAL` (a message being
    /// received into one of its WQEs completes with `REM_ABORT_ERR`; the QP then
    /// reports `QP_LAST_WQE_REACHED`, manual 6.1.17). The WQEs still in the SRQ stay
    /// there: QPs reset and reconnected take from it again. EINVAL for an unknown SRQ.
    pub fn fail_srq(&mut self, now: Instant, srq: SrqId) -> Result<()> {
        self.check_alive()?;
        if !self.srqs.contains_key(&srq.0) {
            return Err(Error::InvalidArgument("no such SRQ"));
        }
        self.events.push_back(AsyncEvent {
            event_type: AsyncEventType::SrqErr,
            element: EventElement::Srq(srq.0),
        });
        let mut qpns: Vec<u32> = self
            .qps
            .values()
            .filter(|qp| qp.init.srq == Some(srq))
            .map(|qp| qp.qpn)
            .collect();
        qpns.sort_unstable();
        for qpn in qpns {
            self.with_qp(now, qpn, |qp, ctx| {
                if !matches!(
                    qp.state(),
                    verbs_api::QpState::Reset | verbs_api::QpState::Err
                ) {
                    ctx.qp_event(AsyncEventType::QpFatal, qp.qpn);
                    qp.abort(ctx, None);
                }
            });
        }
        Ok(())
    }
}
