//! Unreliable datagram (IBTA 9.8, 10.2.5, 11.4; manual 2.3.6, 3.6.13-3.6.14): the UD
//! receive path, the destination a UD send WQE carries, and multicast groups.
//!
//! - A UD message is one packet: SEND_ONLY or SEND_ONLY_WITH_IMMEDIATE with a DETH
//!   (Q_Key, source QP). A message larger than the port's active MTU (a UD QP's path
//!   MTU) completes with `LOC_LEN_ERR` and nothing is sent (IBTA; kernel rxe instead
//!   completes it successfully and sends nothing). The send side shares the requester
//!   with RC and UC; a local send error moves the QP to SQE, as for UC.
//! - The Q_Key of a send comes from the WR, or from the QP when the WR's Q_Key has its
//!   high bit set (IBTA 10.2.5). A packet whose Q_Key is not the receiving QP's is
//!   dropped silently and counted (IBTA 10.9: "Q_Key violation").
//! - No ACKs, no RNR: a packet that finds no receive WQE is dropped and counted.
//! - The receive buffer gets the 40-byte GRH first (for IPv4 the IPv4 header in its
//!   last 20 bytes, as kernel rxe writes it; see [`ah`](super::ah)), then the payload;
//!   it must hold both, else the WQE completes with `LOC_LEN_ERR` and the QP goes to the
//!   error state. The completion has `IBV_WC_GRH`, the byte count including the 40
//!   bytes, and `src_qp` from the DETH.
//! - Multicast (manual 3.6.13): a UD QP attached to a multicast GID receives every packet
//!   sent to that GID with destination QP 0xFFFFFF; each attached QP of the device gets
//!   its own copy. Attaching needs a UD QP and a multicast GID (EINVAL otherwise);
//!   attaching twice is no error; detaching a QP that is not attached is EINVAL; a QP
//!   that is attached cannot be destroyed (EBUSY, as the IB core's `usecnt` rule).

use std::collections::{BTreeSet, HashMap};

use emu_wire::PacketRepr;
use verbs_api::{Error, Gid, QpState, QpType, Result, WcFlags, WcOpcode, WcStatus, WorkCompletion};

use super::ah::is_multicast;
use super::ctx::Ctx;
use super::qp::QueuePair;
use verbs_api::PdId;

/// The destination QP number of a multicast packet (IBTA 9.2: "QP 0xFFFFFF").
pub const MULTICAST_QPN: u32 = 0x00FF_FFFF;

/// The GRH at the start of every UD receive buffer (IBTA 11.4, manual 2.3.7).
pub const GRH_LEN: usize = 40;

/// The destination a UD send WQE copied from its WR and address handle at post time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UdDestination {
    pub(crate) dgid: Gid,
    pub(crate) remote_qpn: u32,
    /// The Q_Key of the WR (the QP's is used when its high bit is set).
    pub(crate) remote_qkey: u32,
    /// The PD of the address handle (it must be the QP's).
    pub(crate) ah_pd: PdId,
    /// The address handle's traffic class.
    pub(crate) traffic_class: u8,
    /// The address handle's source GID index: the address the datagram leaves from.
    pub(crate) sgid_index: u8,
}

impl UdDestination {
    /// IBTA 10.2.5: a Q_Key with its high bit set means "use the QP's Q_Key".
    pub(crate) fn qkey(&self, qp_qkey: u32) -> u32 {
        if self.remote_qkey & 0x8000_0000 != 0 {
            qp_qkey
        } else {
            self.remote_qkey
        }
    }
}

/// The multicast groups of a device: which QPs are attached to which GID.
#[derive(Debug, Default)]
pub(crate) struct McastTable {
    groups: HashMap<Gid, BTreeSet<u32>>,
    /// QP attachments over all groups.
    attachments: usize,
}

impl McastTable {
    /// `ibv_attach_mcast` checks (manual 3.6.13; the IB core's `ib_attach_mcast`), and
    /// the device's multicast limits (ENOMEM past `max_mcast_grp` groups,
    /// `max_mcast_qp_attach` QPs in a group or `max_total_mcast_qp_attach` in all, as
    /// kernel rxe). Attaching a QP that is attached already succeeds and changes nothing.
    pub(crate) fn attach(
        &mut self,
        qp_type: QpType,
        qpn: u32,
        gid: &Gid,
        limits: &super::Limits,
    ) -> Result<()> {
        if qp_type != QpType::Ud {
            return Err(Error::InvalidArgument("only UD QPs join multicast groups"));
        }
        if !is_multicast(gid) {
            return Err(Error::InvalidArgument("not a multicast GID"));
        }
        let members = self.groups.get(gid);
        if members.is_some_and(|m| m.contains(&qpn)) {
            return Ok(());
        }
        if members.is_none() && self.groups.len() >= limits.max_mcast_grp as usize {
            return Err(Error::NoMemory("max_mcast_grp groups have members"));
        }
        if members.is_some_and(|m| m.len() >= limits.max_mcast_qp_attach as usize) {
            return Err(Error::NoMemory("max_mcast_qp_attach QPs are in the group"));
        }
        if self.attachments >= limits.max_total_mcast_qp_attach as usize {
            return Err(Error::NoMemory("max_total_mcast_qp_attach reached"));
        }
        self.groups.entry(*gid).or_default().insert(qpn);
        self.attachments += 1;
        Ok(())
    }

    /// `ibv_detach_mcast` (manual 3.6.14): EINVAL when the QP is not attached.
    pub(crate) fn detach(&mut self, qpn: u32, gid: &Gid) -> Result<()> {
        let members = self
            .groups
            .get_mut(gid)
            .filter(|m| m.contains(&qpn))
            .ok_or(Error::InvalidArgument(
                "the QP is not attached to this group",
            ))?;
        members.remove(&qpn);
        self.attachments -= 1;
        if members.is_empty() {
            self.groups.remove(gid);
        }
        Ok(())
    }

    /// Whether the QP is attached to any group.
    pub(crate) fn is_attached(&self, qpn: u32) -> bool {
        self.groups.values().any(|m| m.contains(&qpn))
    }

    /// The QPs attached to `gid`, in QP number order.
    pub(crate) fn members(&self, gid: &Gid) -> Vec<u32> {
        self.groups
            .get(gid)
            .map(|m| m.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The groups `qpn` is attached to.
    pub(crate) fn groups_of(&self, qpn: u32) -> Vec<Gid> {
        self.groups
            .iter()
            .filter(|(_, m)| m.contains(&qpn))
            .map(|(g, _)| *g)
            .collect()
    }

    /// The groups with at least one member (a driver joins them on its link).
    pub(crate) fn groups(&self) -> impl Iterator<Item = &Gid> {
        self.groups.keys()
    }

    /// Whether `gid` has a member.
    pub(crate) fn has_group(&self, gid: &Gid) -> bool {
        self.groups.contains_key(gid)
    }
}

impl QueuePair {
    /// A UD SEND (ONLY, with or without immediate) addressed to this QP, with the GRH
    /// the receive buffer gets first.
    pub(crate) fn handle_ud_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        repr: &PacketRepr,
        payload: &[u8],
        grh: &[u8; GRH_LEN],
    ) {
        if !matches!(
            self.state(),
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            ctx.counters.rx_dropped += 1;
            return;
        }
        let Some(deth) = repr.deth else {
            ctx.counters.rx_malformed += 1;
            return;
        };
        // IBTA 10.2.5: a Q_Key that is not the QP's drops the packet silently.
        if deth.qkey != self.attr.qkey {
            ctx.counters.qkey_violations += 1;
            return;
        }
        // IBTA 9.8: a UD packet longer than the port's MTU is malformed.
        if payload.len() > ctx.port.link.active_mtu.bytes() as usize {
            ctx.counters.rx_dropped += 1;
            return;
        }
        // No RNR on UD: without a receive WQE the message is lost (IBTA 9.8).
        if !self.recv_available(ctx) {
            ctx.counters.ud_no_recv_drops += 1;
            return;
        }
        let wqe = self.take_recv(ctx).expect("checked above");
        let mut segs = Vec::with_capacity(wqe.sges.len());
        let mut status = None;
        let pd = self.recv_pd(ctx);
        for sge in wqe.sges.iter().filter(|s| s.length > 0) {
            match ctx
                .mrs
                .resolve_local(pd, sge.lkey, sge.addr, sge.length, true)
            {
                Ok(seg) => segs.push(seg),
                Err(s) => {
                    status = Some(s);
                    break;
                }
            }
        }
        let byte_len = GRH_LEN + payload.len();
        if status.is_none() && wqe.length < byte_len as u64 {
            status = Some(WcStatus::LocLenErr);
        }
        if let Some(status) = status {
            // The receive WQE completes in error and the QP enters the error state;
            // not a byte is written (IBTA 10.8).
            let wc = WorkCompletion::new(wqe.wr_id, status, WcOpcode::Recv, self.qpn);
            ctx.complete(self.init.recv_cq, wc, true);
            self.enter_error(ctx);
            return;
        }
        super::mr::scatter(&segs, 0, grh);
        super::mr::scatter(&segs, GRH_LEN, payload);
        let mut wc = WorkCompletion::new(wqe.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
        wc.byte_len = byte_len as u32;
        wc.src_qp = deth.src_qp;
        wc.wc_flags = WcFlags::GRH;
        // IBTA A17.4.5.1: a RoCEv2 UD completion says whether the frame was IPv4 or
        // IPv6. libibverbs has no field for it; RoCE devices put it in `sl` as
        // Mellanox's PRM defines it (bit 3: a UDP header, i.e. RoCEv2; bits 2-0: 2
        // for IPv4, 1 for IPv6), and UCX's UD transport reads it there to find the
        // destination address in the GRH area. An IPv6 header starts with version 6;
        // the IPv4 layout starts with 20 zero bytes (then the IPv4 header).
        wc.sl = if grh[0] >> 4 == 6 {
            0x8 | 0x1
        } else {
            0x8 | 0x2
        };
        if let Some(imm) = repr.imm_dt {
            wc.imm_data = imm;
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
        ctx.counters.ud_received += 1;
        // UD establishes no connection, so no COMM_EST (IBTA 11.6.3).
        ctx.complete(self.init.recv_cq, wc, repr.bth.solicited);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Limits;

    #[test]
    fn qkey_high_bit_takes_the_qps() {
        let d = UdDestination {
            dgid: Gid::ZERO,
            sgid_index: 0,
            remote_qpn: 5,
            remote_qkey: 0x8000_0001,
            ah_pd: PdId(1),
            traffic_class: 0,
        };
        assert_eq!(d.qkey(0x1234), 0x1234);
        let d = UdDestination {
            remote_qkey: 0x7FFF_FFFF,
            ..d
        };
        assert_eq!(d.qkey(0x1234), 0x7FFF_FFFF);
    }

    #[test]
    fn groups_attach_detach() {
        let l = Limits::default();
        let g = Gid::from_ipv4([239, 0, 0, 1].into());
        let mut t = McastTable::default();
        assert!(t.attach(QpType::Rc, 0x11, &g, &l).is_err());
        assert!(t
            .attach(QpType::Ud, 0x11, &Gid::from_ipv4([10, 0, 0, 1].into()), &l)
            .is_err());
        t.attach(QpType::Ud, 0x12, &g, &l).unwrap();
        t.attach(QpType::Ud, 0x11, &g, &l).unwrap();
        t.attach(QpType::Ud, 0x11, &g, &l).unwrap();
        assert_eq!(t.members(&g), [0x11, 0x12]);
        assert!(t.is_attached(0x11));
        t.detach(0x11, &g).unwrap();
        assert!(t.detach(0x11, &g).is_err());
        assert!(!t.is_attached(0x11));
        t.detach(0x12, &g).unwrap();
        assert_eq!(t.groups().count(), 0);
    }

    #[test]
    fn multicast_limits_are_enomem() {
        let l = Limits {
            max_mcast_grp: 2,
            max_mcast_qp_attach: 2,
            max_total_mcast_qp_attach: 3,
            ..Limits::default()
        };
        let g = |n: u8| Gid::from_ipv4([239, 0, 0, n].into());
        let mut t = McastTable::default();
        t.attach(QpType::Ud, 1, &g(1), &l).unwrap();
        t.attach(QpType::Ud, 2, &g(1), &l).unwrap();
        // A third QP in a full group; a member again is fine.
        assert_eq!(t.attach(QpType::Ud, 3, &g(1), &l).unwrap_err().errno(), 12);
        t.attach(QpType::Ud, 2, &g(1), &l).unwrap();
        t.attach(QpType::Ud, 3, &g(2), &l).unwrap();
        // A third group, then a fourth attachment in all.
        assert_eq!(t.attach(QpType::Ud, 4, &g(3), &l).unwrap_err().errno(), 12);
        assert_eq!(t.attach(QpType::Ud, 4, &g(2), &l).unwrap_err().errno(), 12);
        // Detaching frees room.
        t.detach(1, &g(1)).unwrap();
        t.attach(QpType::Ud, 4, &g(2), &l).unwrap();
        assert_eq!(t.members(&g(2)), [3, 4]);
    }
}
