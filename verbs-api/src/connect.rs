//! Bringing a QP up: RESET -> INIT -> RTR -> RTS with the attributes each transition
//! requires for each transport (manual 3.5.2-3.5.4; IBTA 11.2.4.2 and table 95, the
//! required/optional attribute table of `ibv_modify_qp`).
//!
//! Every program that connects a QP by hand writes the same three `ibv_modify_qp` calls;
//! here they are once. [`QpParams`] holds the choices (MTU, timeouts, retry counts, RDMA
//! read depths, access, Q_Key); [`QpParams::init`], [`QpParams::rtr`] and [`QpParams::rts`]
//! give each transition's attributes and exactly the mask the transport needs, and
//! [`connect_qp`] applies all three through any [`Device`].

use crate::{
    AccessFlags, AhAttr, Device, Gid, GlobalRoute, Mtu, QpAttr, QpAttrMask as M, QpState, QpType,
    Result,
};

/// The peer of a connection, as rdma-core's examples exchange it (`LID:QPN:PSN:GID`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Endpoint {
    /// LID (0 on RoCE, which routes by GID).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// The first PSN the peer sends (our `rq_psn`).
    pub psn: u32,
    /// The peer's GID (on RoCEv2, its IPv4-mapped address).
    pub gid: Gid,
}

/// The choices made when bringing a QP up. The defaults are those of rdma-core's
/// `ibv_rc_pingpong` (MTU 1024, timeout 14, retry_cnt 7, rnr_retry 7, min_rnr_timer 12,
/// one outstanding READ/atomic each way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpParams {
    /// The port (1 is the first).
    pub port_num: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Remote access granted (RC/UC; READ and atomics are RC only).
    pub access: AccessFlags,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Path MTU (RC/UC).
    pub path_mtu: Mtu,
    /// Local ACK timeout, 4.096 us * 2^timeout (RC).
    pub timeout: u8,
    /// Retries after an ACK timeout or a NAK (RC).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK, 7 = infinite (RC).
    pub rnr_retry: u8,
    /// The RNR timer code this QP's responder sends (RC).
    pub min_rnr_timer: u8,
    /// READs/atomics this QP has outstanding as requester (RC).
    pub max_rd_atomic: u8,
    /// READs/atomics this QP accepts as responder (RC).
    pub max_dest_rd_atomic: u8,
    /// Hop limit (TTL) of the address vector.
    pub hop_limit: u8,
    /// Source GID index.
    pub sgid_index: u8,
}

impl Default for QpParams {
    fn default() -> Self {
        QpParams {
            port_num: 1,
            pkey_index: 0,
            access: AccessFlags::LOCAL_WRITE,
            qkey: 0x1111_1111,
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            hop_limit: 64,
            sgid_index: 0,
        }
    }
}

impl QpParams {
    /// The address vector that reaches `gid` from this port.
    pub fn ah_attr(&self, gid: Gid) -> AhAttr {
        AhAttr {
            grh: GlobalRoute {
                dgid: gid,
                hop_limit: self.hop_limit,
                sgid_index: self.sgid_index,
                ..GlobalRoute::default()
            },
            is_global: true,
            port_num: self.port_num,
            ..AhAttr::default()
        }
    }

    /// RESET -> INIT: state, P_Key index, port, and the access flags (RC/UC) or the
    /// Q_Key (UD) (manual 3.5.2).
    pub fn init(&self, qp_type: QpType) -> (QpAttr, M) {
        let attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: self.pkey_index,
            port_num: self.port_num,
            qp_access_flags: self.access,
            qkey: self.qkey,
            ..QpAttr::default()
        };
        let mut mask = M::STATE | M::PKEY_INDEX | M::PORT;
        mask |= if qp_type == QpType::Ud {
            M::QKEY
        } else {
            M::ACCESS_FLAGS
        };
        (attr, mask)
    }

    /// INIT -> RTR: for RC and UC the path to `remote` (address vector, MTU, its QPN and
    /// first PSN), for RC also the responder's READ depth and RNR timer; for UD the
    /// state alone (manual 3.5.3).
    pub fn rtr(&self, qp_type: QpType, remote: &Endpoint) -> (QpAttr, M) {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: self.path_mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            ah_attr: self.ah_attr(remote.gid),
            ..QpAttr::default()
        };
        let mask = match qp_type {
            QpType::Ud => M::STATE,
            // An XRC receive QP is RC's responder side (XRC annex).
            QpType::Rc | QpType::XrcRecv => {
                M::STATE
                    | M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER
            }
            _ => M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
        };
        (attr, mask)
    }

    /// RTR -> RTS: the first PSN this QP sends, and for RC its timeout, retry counts and
    /// READ depth (manual 3.5.4).
    pub fn rts(&self, qp_type: QpType, sq_psn: u32) -> (QpAttr, M) {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            max_rd_atomic: self.max_rd_atomic,
            ..QpAttr::default()
        };
        let mut mask = M::STATE | M::SQ_PSN;
        match qp_type {
            QpType::Rc | QpType::XrcSend => {
                mask |= M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
            }
            // An XRC receive QP sends only responses: the ACK timeout is all it takes.
            QpType::XrcRecv => mask |= M::TIMEOUT,
            _ => {}
        }
        (attr, mask)
    }
}

/// Brings QP `qpn` (of type `qp_type`, in RESET) to RTS, connected to `remote` (RC and
/// UC; UD ignores it), sending from PSN `sq_psn`.
pub fn connect_qp(
    dev: &dyn Device,
    qpn: u32,
    qp_type: QpType,
    params: &QpParams,
    sq_psn: u32,
    remote: &Endpoint,
) -> Result<()> {
    for (attr, mask) in [
        params.init(qp_type),
        params.rtr(qp_type, remote),
        params.rts(qp_type, sq_psn),
    ] {
        dev.modify_qp(qpn, &attr, mask)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_follow_the_transport() {
        let p = QpParams::default();
        let r = Endpoint::default();
        assert!(p.init(QpType::Ud).1.contains(M::QKEY));
        assert!(!p.init(QpType::Rc).1.contains(M::QKEY));
        assert!(p.init(QpType::Uc).1.contains(M::ACCESS_FLAGS));
        assert_eq!(p.rtr(QpType::Ud, &r).1, M::STATE);
        assert!(p.rtr(QpType::Rc, &r).1.contains(M::MIN_RNR_TIMER));
        assert!(!p.rtr(QpType::Uc, &r).1.contains(M::MIN_RNR_TIMER));
        assert!(p.rts(QpType::Rc, 0).1.contains(M::RETRY_CNT));
        assert_eq!(p.rts(QpType::Uc, 0).1, M::STATE | M::SQ_PSN);
    }
}
