//! Address handles (manual 3.4.15-3.4.16, 3.6.11-3.6.12, `ibv_create_ah`, `ibv_destroy_ah`,
//! `ibv_init_ah_from_wc`; IBTA 10.2 address vectors) and the multicast test on GIDs.
//!
//! An address handle names a UD destination: on RoCE a GID, so `is_global` is required
//! (kernel rxe refuses an AH without a GRH on RoCE with EINVAL). A send WQE copies the
//! address vector when it is posted, as kernel rxe copies it into the WQE, so an AH may
//! be destroyed while WRs that used it are still queued. An AH keeps its PD alive
//! (`ibv_dealloc_pd` is EBUSY while AHs exist).

use super::idmap::IdMap;

use emu_wire::{GrhPacket, GrhRepr};
use verbs_api::{AhAttr, Error, Gid, GlobalRoute, Result, WcFlags, WorkCompletion};

use super::mr::MrTable;
use super::Limits;
use verbs_api::{AhId, PdId};

/// One address handle: its PD and its address vector.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AddressHandle {
    pub(crate) pd: PdId,
    pub(crate) attr: AhAttr,
}

/// The device's address handles.
#[derive(Debug, Default)]
pub(crate) struct AhTable {
    ahs: IdMap<AddressHandle>,
    next: u32,
}

/// Checks an address vector for a RoCE port (the checks kernel rxe and the IB core make
/// in `ib_create_ah`/`rxe_av_chk_attr`): a GRH, a source GID index inside the table,
/// port 1.
pub(crate) fn check_ah_attr(attr: &AhAttr, limits: &Limits) -> Result<()> {
    if !attr.is_global {
        return Err(Error::InvalidArgument(
            "RoCE address handles need a GRH (is_global)",
        ));
    }
    if u32::from(attr.grh.sgid_index) >= limits.gid_tbl_len {
        return Err(Error::InvalidArgument("sgid_index outside the GID table"));
    }
    if attr.port_num != 1 {
        return Err(Error::InvalidArgument("ah_attr.port_num must be 1"));
    }
    Ok(())
}

impl AhTable {
    /// Address handles alive.
    pub(crate) fn len(&self) -> usize {
        self.ahs.len()
    }

    /// `ibv_create_ah`: EINVAL for an unknown PD or a bad address vector.
    pub(crate) fn create(
        &mut self,
        mrs: &mut MrTable,
        limits: &Limits,
        pd: PdId,
        attr: &AhAttr,
    ) -> Result<AhId> {
        if !mrs.pd_exists(pd) {
            return Err(Error::InvalidArgument("no such protection domain"));
        }
        check_ah_attr(attr, limits)?;
        self.next = self.next.wrapping_add(1).max(1);
        while self.ahs.contains_key(&self.next) {
            self.next = self.next.wrapping_add(1).max(1);
        }
        self.ahs
            .insert(self.next, AddressHandle { pd, attr: *attr });
        mrs.pd_ref(pd, 1);
        Ok(AhId(self.next))
    }

    /// `ibv_destroy_ah`: EINVAL for an unknown handle.
    pub(crate) fn destroy(&mut self, mrs: &mut MrTable, ah: AhId) -> Result<()> {
        let h = self
            .ahs
            .remove(&ah.0)
            .ok_or(Error::InvalidArgument("no such address handle"))?;
        mrs.pd_ref(h.pd, -1);
        Ok(())
    }

    pub(crate) fn get(&self, ah: AhId) -> Option<&AddressHandle> {
        self.ahs.get(&ah.0)
    }
}

/// Whether `gid` is a multicast address, as the IB core's `rdma_is_multicast_addr`
/// decides: an IPv4-mapped GID in 224.0.0.0/4, or an IPv6 address in ff00::/8 (IBTA
/// 4.1.1: multicast GIDs start with 0xFF).
pub fn is_multicast(gid: &Gid) -> bool {
    match gid.to_ipv4() {
        Some(ip) => ip.is_multicast(),
        None => gid.0[0] == 0xFF,
    }
}

/// The 40 bytes a UD receive buffer starts with (IBTA 8.3, Annex A17.4.5.1) for a
/// packet of `udp_payload_len` bytes (BTH through ICRC) that came from `src` to `dst`
/// with TOS (traffic class) `tos`. Between IPv4-mapped GIDs it is the IPv4 layout, as
/// kernel rxe writes it (20 zero bytes, then the IPv4 header: TOS `tos`, TTL 64, DF,
/// ID 0, protocol UDP, as the emulator's link sends); otherwise an IPv6 header.
pub(crate) fn grh_bytes(src: &Gid, dst: &Gid, tos: u8, udp_payload_len: usize) -> [u8; 40] {
    let mut out = [0u8; 40];
    let repr = match (src.to_ipv4(), dst.to_ipv4()) {
        (Some(s), Some(d)) => GrhRepr {
            traffic_class: tos,
            ..GrhRepr::for_ipv4(s, d, (20 + 8 + udp_payload_len) as u16)
        },
        _ => GrhRepr {
            ip_version: 6,
            traffic_class: tos,
            flow_label: 0,
            payload_len: (8 + udp_payload_len) as u16,
            next_header: 17,
            hop_limit: 64,
            sgid: src.0,
            dgid: dst.0,
        },
    };
    repr.emit(&mut GrhPacket::new_unchecked(&mut out[..]));
    out
}

/// `ibv_init_ah_from_wc` (manual 3.6.11): the address vector that answers the sender of
/// a UD receive completion. `grh` is the first 40 bytes of the receive buffer and
/// `gid_table` the port's GID table (to find the source GID index: the GID the packet
/// was addressed to). As libibverbs does it: without `IBV_WC_GRH` the vector is not
/// global (and cannot make a RoCE AH); with it the GIDs are swapped from the GRH (for
/// the IPv4 layout, the IPv4-mapped source and destination addresses), the traffic
/// class and flow label are copied, and so is the hop limit (IPv4: TTL). EINVAL when
/// the GRH is neither layout or its destination is not in the GID table.
pub fn init_ah_from_wc(
    port_num: u8,
    wc: &WorkCompletion,
    grh: &[u8],
    gid_table: &[Gid],
) -> Result<AhAttr> {
    let mut attr = AhAttr {
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        port_num,
        ..AhAttr::default()
    };
    if !wc.wc_flags.contains(WcFlags::GRH) {
        return Ok(attr);
    }
    let p = GrhPacket::new_checked(grh)
        .map_err(|_| Error::InvalidArgument("GRH shorter than 40 bytes"))?;
    let g = GrhRepr::parse(&p).map_err(|_| Error::InvalidArgument("not a RoCE GRH"))?;
    // For the IPv4 layout the GRH's GIDs are already the IPv4-mapped addresses.
    let (dgid, sgid) = (Gid(g.sgid), Gid(g.dgid));
    let sgid_index = gid_table
        .iter()
        .position(|x| *x == sgid)
        .ok_or(Error::InvalidArgument(
            "the GRH's destination is not in the GID table",
        ))?;
    attr.is_global = true;
    attr.grh = GlobalRoute {
        dgid,
        flow_label: g.flow_label,
        sgid_index: sgid_index as u8,
        hop_limit: g.hop_limit,
        traffic_class: g.traffic_class,
    };
    Ok(attr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use verbs_api::{WcOpcode, WcStatus};

    #[test]
    fn multicast_gids() {
        assert!(is_multicast(&Gid::from_ipv4(Ipv4Addr::new(224, 0, 0, 1))));
        assert!(is_multicast(&Gid::from_ipv4(Ipv4Addr::new(239, 1, 2, 3))));
        assert!(!is_multicast(&Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 1))));
        assert!(!is_multicast(&Gid::from_ipv4(Ipv4Addr::new(240, 0, 0, 1))));
        let mut g = [0u8; 16];
        g[0] = 0xFF;
        g[1] = 0x0E;
        assert!(is_multicast(&Gid(g)));
        g[0] = 0xFE;
        assert!(!is_multicast(&Gid(g)));
    }

    #[test]
    fn ah_from_wc_swaps_the_grh_addresses() {
        let a = Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 1));
        let b = Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 2));
        let grh = grh_bytes(&a, &b, 0, 100);
        assert!(grh[..20].iter().all(|&x| x == 0));
        assert_eq!(grh[20], 0x45);
        let mut wc = WorkCompletion::new(1, WcStatus::Success, WcOpcode::Recv, 0x11);
        wc.wc_flags = WcFlags::GRH;
        let attr = init_ah_from_wc(1, &wc, &grh, &[Gid::ZERO, b]).unwrap();
        assert!(attr.is_global);
        assert_eq!(
            (attr.grh.dgid, attr.grh.sgid_index, attr.grh.hop_limit),
            (a, 1, 64)
        );
        // the destination must be one of ours
        assert!(init_ah_from_wc(1, &wc, &grh, &[a]).is_err());
        assert!(init_ah_from_wc(1, &wc, &[0u8; 40], &[b]).is_err());
        assert!(init_ah_from_wc(1, &wc, &grh[..39], &[b]).is_err());
        wc.wc_flags = WcFlags::empty();
        assert!(!init_ah_from_wc(1, &wc, &grh, &[b]).unwrap().is_global);
        // IPv6 GIDs give the IPv6 layout
        let mut x = [0u8; 16];
        x[0] = 0xFE;
        x[1] = 0x80;
        x[15] = 7;
        let mut y = x;
        y[15] = 8;
        let grh = grh_bytes(&Gid(x), &Gid(y), 0, 10);
        assert_eq!(grh[0] >> 4, 6);
        wc.wc_flags = WcFlags::GRH;
        let attr = init_ah_from_wc(1, &wc, &grh, &[Gid(y)]).unwrap();
        assert_eq!(attr.grh.dgid, Gid(x));
    }
}
