//! The device's one port (IBTA 14.2.5.6 PortInfo; manual 3.3.3 ibv_query_port): its
//! logical state, GID table, P_Key table and the LID/SM fields a subnet manager sets,
//! with the management operations a subnet manager or a cable performs on it. Each
//! change raises the port's asynchronous event (manual 6.1.10-6.1.14, 6.1.18, 6.1.19).
//!
//! On RoCEv2 the GID table holds IPv4-mapped addresses (`::ffff:a.b.c.d`, IBTA Annex
//! A17); entry 0 is the device's own address, the others start empty (all zero) and
//! are added or removed through management. LIDs mean nothing on Ethernet, but the
//! fields and their events exist so software written for InfiniBand can be tested.

use std::collections::VecDeque;

use verbs_api::{AsyncEvent, AsyncEventType, Error, EventElement, Gid, Mtu, PortState, Result};

/// The full-member default P_Key (IBTA 10.9), entry 0 of every P_Key table.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// Whether two P_Keys match (IBTA 10.9.3 P_Key matching): the same partition (the
/// low 15 bits), at least one of them a full member (bit 15), and neither the invalid
/// key of that partition (0x0000 / 0x8000, which match nothing). Two limited members
/// of one partition cannot talk to each other.
pub(crate) fn pkey_match(a: u16, b: u16) -> bool {
    a & 0x7FFF == b & 0x7FFF && a & 0x7FFF != 0 && (a | b) & 0x8000 != 0
}

/// State of port 1.
#[derive(Clone, Debug)]
pub(crate) struct Port {
    pub(crate) state: PortState,
    /// The link under the port: the largest IBTA MTU its frames carry, its width and
    /// its speed (IBTA 14.2.5.6 NeighborMTU, LinkWidthActive, LinkSpeedActive). An
    /// Ethernet port takes them from its network interface; 1X SDR is what Linux
    /// reports for an interface of unknown speed (`ib_get_eth_speed`).
    pub(crate) link: PortLink,
    pub(crate) gids: Vec<Gid>,
    pub(crate) pkeys: Vec<u16>,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) sm_sl: u8,
}

/// What the link under the port carries (see `Port::link`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortLink {
    /// The largest IBTA MTU a packet on the link may have.
    pub active_mtu: Mtu,
    /// ActiveWidth, IBTA encoding (1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X).
    pub width: u8,
    /// ActiveSpeed, IBTA encoding (1 = SDR 2.5 Gb/s ... 8 = FDR10, 16 = FDR, 32 = EDR).
    pub speed: u8,
}

/// The port number of the device's only port.
pub const PORT_NUM: u8 = 1;

impl Port {
    /// An ACTIVE port with `gid_tbl_len` empty GID entries and a P_Key table holding
    /// only the default key.
    pub(crate) fn new(gid_tbl_len: u32, pkey_tbl_len: u32, active_mtu: Mtu) -> Port {
        let mut pkeys = vec![0; pkey_tbl_len as usize];
        if let Some(p) = pkeys.first_mut() {
            *p = DEFAULT_PKEY;
        }
        Port {
            state: PortState::Active,
            link: PortLink {
                active_mtu,
                width: 1,
                speed: 1,
            },
            gids: vec![Gid::ZERO; gid_tbl_len as usize],
            pkeys,
            lid: 0,
            sm_lid: 0,
            sm_sl: 0,
        }
    }

    /// Whether packets flow (IBTA 7.2: only an ACTIVE port sends and receives
    /// non-management packets).
    pub(crate) fn is_active(&self) -> bool {
        self.state == PortState::Active
    }

    /// The GID at `index`; ENOENT-like EINVAL outside the table.
    pub(crate) fn gid(&self, index: u32) -> Result<Gid> {
        self.gids
            .get(index as usize)
            .copied()
            .ok_or(Error::InvalidArgument("GID index outside the table"))
    }

    /// The GID at `index` as a packet's source: the entry, or the zero GID outside the
    /// table (a driver then sends from the device's own address). Paths and address
    /// handles are checked against the table when they are set, so this is the entry
    /// in practice.
    pub(crate) fn source_gid(&self, index: u8) -> Gid {
        self.gids
            .get(usize::from(index))
            .copied()
            .unwrap_or(Gid::ZERO)
    }

    /// Whether `index` names a GID entry that holds an address.
    pub(crate) fn gid_valid(&self, index: u8) -> bool {
        self.gids
            .get(usize::from(index))
            .is_some_and(|g| *g != Gid::ZERO)
    }

    /// The P_Key at `index`.
    pub(crate) fn pkey(&self, index: u32) -> Result<u16> {
        self.pkeys
            .get(index as usize)
            .copied()
            .ok_or(Error::NotFound("P_Key index outside the table"))
    }

    /// The P_Key a QP with P_Key index `index` sends with and must match: its table
    /// entry, or the invalid key 0 (which matches nothing) outside the table.
    pub(crate) fn pkey_at(&self, index: u16) -> u16 {
        self.pkeys.get(usize::from(index)).copied().unwrap_or(0)
    }

    /// Whether some entry of the table matches `pkey` (what QP1 accepts, IBTA 10.9.3).
    pub(crate) fn accepts_pkey(&self, pkey: u16) -> bool {
        self.pkeys.iter().any(|&k| pkey_match(k, pkey))
    }

    /// Whether QP `qpn`, with P_Key index `pkey_index`, takes a packet with `pkey`
    /// (IBTA 9.6.1.1, 10.9.3): it must match the QP's own key; QP1 takes any key of
    /// the table.
    pub(crate) fn admits(&self, qpn: u32, pkey_index: u16, pkey: u16) -> bool {
        if qpn == super::GSI_QPN {
            self.accepts_pkey(pkey)
        } else {
            pkey_match(pkey, self.pkey_at(pkey_index))
        }
    }

    /// Changes the logical state. Leaving ACTIVE raises `PORT_ERR` (manual 6.1.11),
    /// entering it `PORT_ACTIVE` (manual 6.1.10). `Nop` is EINVAL.
    pub(crate) fn set_state(
        &mut self,
        state: PortState,
        events: &mut VecDeque<AsyncEvent>,
    ) -> Result<()> {
        if state == PortState::Nop {
            return Err(Error::InvalidArgument("NOP is not a port state"));
        }
        let was = self.is_active();
        self.state = state;
        match (was, self.is_active()) {
            (true, false) => events.push_back(port_event(AsyncEventType::PortErr)),
            (false, true) => events.push_back(port_event(AsyncEventType::PortActive)),
            _ => {}
        }
        Ok(())
    }

    /// Sets GID entry `index` (`Gid::ZERO` removes it). `GID_CHANGE` when the entry
    /// changed (manual 6.1.19).
    pub(crate) fn set_gid(
        &mut self,
        index: u32,
        gid: Gid,
        events: &mut VecDeque<AsyncEvent>,
    ) -> Result<()> {
        let slot = self
            .gids
            .get_mut(index as usize)
            .ok_or(Error::InvalidArgument("GID index outside the table"))?;
        if *slot != gid {
            *slot = gid;
            events.push_back(port_event(AsyncEventType::GidChange));
        }
        Ok(())
    }

    /// Sets P_Key entry `index`. `PKEY_CHANGE` when it changed (manual 6.1.13).
    pub(crate) fn set_pkey(
        &mut self,
        index: u32,
        pkey: u16,
        events: &mut VecDeque<AsyncEvent>,
    ) -> Result<()> {
        let slot = self
            .pkeys
            .get_mut(index as usize)
            .ok_or(Error::InvalidArgument("P_Key index outside the table"))?;
        if *slot != pkey {
            *slot = pkey;
            events.push_back(port_event(AsyncEventType::PkeyChange));
        }
        Ok(())
    }

    /// Sets the port's LID. `LID_CHANGE` when it changed (manual 6.1.12).
    pub(crate) fn set_lid(&mut self, lid: u16, events: &mut VecDeque<AsyncEvent>) {
        if self.lid != lid {
            self.lid = lid;
            events.push_back(port_event(AsyncEventType::LidChange));
        }
    }

    /// A new subnet manager (LID and SL) manages the port: `SM_CHANGE` (manual
    /// 6.1.14), raised whenever the SM is replaced, even by one at the same LID.
    pub(crate) fn set_sm(&mut self, sm_lid: u16, sm_sl: u8, events: &mut VecDeque<AsyncEvent>) {
        self.sm_lid = sm_lid;
        self.sm_sl = sm_sl;
        events.push_back(port_event(AsyncEventType::SmChange));
    }
}

/// An event affiliated with port 1.
pub(crate) fn port_event(event_type: AsyncEventType) -> AsyncEvent {
    AsyncEvent {
        event_type,
        element: EventElement::Port(PORT_NUM),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_changes_raise_events_only_across_active() {
        let mut p = Port::new(4, 2, Mtu::Mtu1024);
        let mut ev = VecDeque::new();
        p.set_state(PortState::Active, &mut ev).unwrap();
        assert!(ev.is_empty());
        p.set_state(PortState::Down, &mut ev).unwrap();
        p.set_state(PortState::Init, &mut ev).unwrap();
        p.set_state(PortState::Active, &mut ev).unwrap();
        let types: Vec<_> = ev.iter().map(|e| e.event_type).collect();
        assert_eq!(types, [AsyncEventType::PortErr, AsyncEventType::PortActive]);
        assert!(p.set_state(PortState::Nop, &mut ev).is_err());
    }

    #[test]
    fn tables_change_with_one_event_per_change() {
        let mut p = Port::new(4, 2, Mtu::Mtu1024);
        let mut ev = VecDeque::new();
        assert_eq!(p.pkey(0).unwrap(), DEFAULT_PKEY);
        let g = Gid::from_ipv4(std::net::Ipv4Addr::new(10, 0, 0, 9));
        p.set_gid(2, g, &mut ev).unwrap();
        p.set_gid(2, g, &mut ev).unwrap();
        assert!(p.gid_valid(2) && !p.gid_valid(1) && !p.gid_valid(9));
        assert!(p.set_gid(4, g, &mut ev).is_err());
        p.set_pkey(1, 0x8001, &mut ev).unwrap();
        assert!(p.set_pkey(2, 1, &mut ev).is_err());
        p.set_lid(7, &mut ev);
        p.set_lid(7, &mut ev);
        p.set_sm(1, 0, &mut ev);
        let types: Vec<_> = ev.iter().map(|e| e.event_type).collect();
        assert_eq!(
            types,
            [
                AsyncEventType::GidChange,
                AsyncEventType::PkeyChange,
                AsyncEventType::LidChange,
                AsyncEventType::SmChange
            ]
        );
        assert!(ev.iter().all(|e| e.element == EventElement::Port(1)));
    }

    #[test]
    fn pkey_matching() {
        assert!(pkey_match(0xFFFF, 0xFFFF));
        assert!(pkey_match(0xFFFF, 0x7FFF), "full and limited member");
        assert!(!pkey_match(0x7FFF, 0x7FFF), "two limited members");
        assert!(!pkey_match(0x8001, 0x8002), "two partitions");
        assert!(!pkey_match(0x8000, 0x8000), "the invalid key");
        assert!(!pkey_match(0, 0x8000));
        let mut p = Port::new(4, 4, Mtu::Mtu1024);
        let mut ev = VecDeque::new();
        p.set_pkey(1, 0x0005, &mut ev).unwrap();
        assert_eq!((p.pkey_at(1), p.pkey_at(9)), (0x0005, 0));
        assert!(p.accepts_pkey(0x8005) && p.accepts_pkey(0x7FFF));
        assert!(!p.accepts_pkey(0x0005) && !p.accepts_pkey(0x8006));
    }
}
