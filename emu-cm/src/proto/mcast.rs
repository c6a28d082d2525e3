//! Multicast through the CM (manual 4.2.27 `rdma_join_multicast`, 4.2.28
//! `rdma_leave_multicast`): on RoCE there is no SA to join through (IBTA Annex A16/A17:
//! the group is the IP multicast group), so a join attaches the id's UD QP to the group's
//! MGID (the IPv4-mapped group address as the kernel's rdma_cm makes it, or an IPv6
//! group's address itself), and reports
//! `MULTICAST_JOIN` with the UD parameters that reach the group (QPN 0xFFFFFF, the
//! RDMA_PS_UDP Q_Key), or `MULTICAST_ERROR` with the attach's negative errno (and the
//! group's MGID in the address vector). `rdma_resolve_addr` to a group resolves at once
//! (`State::resolve_addr`).

use std::net::SocketAddr;

use verbs_api::{CmEventParam, CmEventType, CmId, Error, QpParams, Result, UdParam};

use super::{einval, State, RDMA_UDP_QKEY};

/// The destination QPN of every multicast datagram (IBTA 9.2: the multicast QPN, 0xFFFFFF).
pub(crate) const MCAST_QPN: u32 = 0x00FF_FFFF;

impl State {
    pub(crate) fn join_multicast(&mut self, id: CmId, addr: SocketAddr) -> Result<()> {
        let a = addr;
        if !a.ip().is_multicast() {
            return Err(einval("not a multicast address"));
        }
        let i = self.id(id)?;
        if i.ps.qp_type() != Some(verbs_api::QpType::Ud) {
            return Err(einval("multicast needs a UD port space (RDMA_PS_UDP)"));
        }
        let dev = i.dev.ok_or(Error::NoDevice(
            "bind or resolve the id to a device first".into(),
        ))?;
        if i.mcast.iter().any(|(m, _)| *m == a) {
            return Err(Error::from_errno(98, "the id joined this group already"));
        }
        let mgid = emu_core::nic::gid_of(a.ip());
        // As librdmacm, the QP the id has now is attached; one created later is not.
        let qpn = i.qpn;
        let attached = match qpn {
            Some(qpn) => self.agents[dev].dev.attach_mcast(qpn, &mgid, 0),
            None => Ok(()),
        };
        let ch = id.0;
        match attached {
            Ok(()) => {
                self.id(id)?.mcast.push((a, qpn));
                let ah = QpParams::default().ah_attr(mgid);
                let param = CmEventParam::Ud(UdParam {
                    private_data: Vec::new(),
                    ah_attr: ah,
                    qp_num: MCAST_QPN,
                    qkey: RDMA_UDP_QKEY,
                });
                self.emit(ch, CmEventType::MulticastJoin, 0, param);
            }
            // The error names its group too (the MGID in the address vector), so a
            // caller with several joins knows which one failed.
            Err(e) => self.emit(
                ch,
                CmEventType::MulticastError,
                -e.errno(),
                CmEventParam::Ud(UdParam {
                    private_data: Vec::new(),
                    ah_attr: QpParams::default().ah_attr(mgid),
                    qp_num: 0,
                    qkey: 0,
                }),
            ),
        }
        Ok(())
    }

    pub(crate) fn leave_multicast(&mut self, id: CmId, addr: SocketAddr) -> Result<()> {
        let a = addr;
        let i = self.id(id)?;
        let Some(at) = i.mcast.iter().position(|(m, _)| *m == a) else {
            // librdmacm: a group the id did not join is EADDRNOTAVAIL.
            return Err(Error::from_errno(99, "the id did not join this group"));
        };
        let (_, attached) = i.mcast.remove(at);
        if let (Some(qpn), Some(dev)) = (attached, i.dev) {
            let mgid = emu_core::nic::gid_of(a.ip());
            self.agents[dev].dev.detach_mcast(qpn, &mgid, 0)?;
        }
        Ok(())
    }
}
