//! Queue pair types and attributes: QP type and state, path MTU, the
//! ibv_modify_qp attribute mask, GIDs and address vectors (manual 2.3.6
//! Address Vector, 2.3.7 GRH, 3.3.3 ibv_query_gid, 3.4.3 ibv_create_qp, 3.4.15
//! ibv_create_ah, 3.5 Queue Pair Bringup, 3.6.1 ibv_query_qp).

use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::mr::AccessFlags;

verbs_enum! {
    /// `enum ibv_qp_type`: the transport service of a QP (manual 2.2
    /// Transport Modes, 3.4.3 ibv_create_qp).
    pub enum QpType ("ibv_qp_type") {
        /// `IBV_QPT_RC`: Reliable Connection.
        Rc = 2,
        /// `IBV_QPT_UC`: Unreliable Connection.
        Uc = 3,
        /// `IBV_QPT_UD`: Unreliable Datagram.
        Ud = 4,
        /// `IBV_QPT_RAW_PACKET`: raw Ethernet packets.
        RawPacket = 8,
        /// `IBV_QPT_XRC_SEND`: XRC initiator.
        XrcSend = 9,
        /// `IBV_QPT_XRC_RECV`: XRC target.
        XrcRecv = 10,
        /// `IBV_QPT_DRIVER`: driver-specific.
        Driver = 0xff,
    }
}

impl fmt::Display for QpType {
    /// The short transport name: `"RC"`, `"UC"`, `"UD"`, `"RAW_PACKET"`,
    /// `"XRC_SEND"`, `"XRC_RECV"`, `"DRIVER"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::RawPacket => "RAW_PACKET",
            QpType::XrcSend => "XRC_SEND",
            QpType::XrcRecv => "XRC_RECV",
            QpType::Driver => "DRIVER",
        })
    }
}

verbs_enum! {
    /// `enum ibv_qp_state`: the QP state machine (manual 3.5 Queue Pair
    /// Bringup; the QP state diagram of IBTA Vol 1 chapter 10).
    pub enum QpState ("ibv_qp_state") {
        /// `IBV_QPS_RESET`: newly created; no WRs are processed.
        Reset = 0,
        /// `IBV_QPS_INIT`: receive WRs may be posted, none processed.
        Init = 1,
        /// `IBV_QPS_RTR`: Ready To Receive.
        Rtr = 2,
        /// `IBV_QPS_RTS`: Ready To Send.
        Rts = 3,
        /// `IBV_QPS_SQD`: Send Queue Drain(ed).
        Sqd = 4,
        /// `IBV_QPS_SQE`: Send Queue Error (UC/UD only).
        Sqe = 5,
        /// `IBV_QPS_ERR`: Error; outstanding WRs are flushed.
        Err = 6,
        /// `IBV_QPS_UNKNOWN`.
        Unknown = 7,
    }
}

impl Default for QpState {
    /// [`QpState::Reset`] (value 0).
    fn default() -> Self {
        QpState::Reset
    }
}

impl fmt::Display for QpState {
    /// The IBTA state name in upper case: `"RESET"`, `"INIT"`, `"RTR"`,
    /// `"RTS"`, `"SQD"`, `"SQE"`, `"ERR"`, `"UNKNOWN"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
            QpState::Unknown => "UNKNOWN",
        })
    }
}

verbs_enum! {
    /// `enum ibv_mig_state`: automatic path migration state (manual 3.5.1
    /// ibv_modify_qp, `path_mig_state`).
    pub enum MigState ("ibv_mig_state") {
        /// `IBV_MIG_MIGRATED`: migrated (or no alternate path armed).
        Migrated = 0,
        /// `IBV_MIG_REARM`: the alternate path is being re-armed.
        Rearm = 1,
        /// `IBV_MIG_ARMED`: the alternate path is armed.
        Armed = 2,
    }
}

impl Default for MigState {
    /// [`MigState::Migrated`] (value 0).
    fn default() -> Self {
        MigState::Migrated
    }
}

verbs_enum! {
    /// `enum ibv_mtu`: path MTU, i.e. the maximum payload of one packet
    /// (manual 3.3.2 ibv_query_port, 3.5.3 INIT to RTR).
    pub enum Mtu ("ibv_mtu") {
        /// `IBV_MTU_256`.
        Mtu256 = 1,
        /// `IBV_MTU_512`.
        Mtu512 = 2,
        /// `IBV_MTU_1024`.
        Mtu1024 = 3,
        /// `IBV_MTU_2048`.
        Mtu2048 = 4,
        /// `IBV_MTU_4096`.
        Mtu4096 = 5,
    }
}

impl Mtu {
    /// The MTU in bytes: 256, 512, 1024, 2048 or 4096 (`128 << value`).
    #[must_use]
    pub const fn bytes(self) -> u32 {
        128 << self.as_u32()
    }

    /// The `Mtu` of exactly `bytes` bytes, or `None` if `bytes` is not one of
    /// the five IB MTUs.
    #[must_use]
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Mtu::ALL.iter().copied().find(|m| m.bytes() == bytes)
    }

    /// The largest `Mtu` not exceeding `bytes` (e.g. the IB MTU that fits an
    /// Ethernet MTU after headers), or `None` below 256.
    #[must_use]
    pub fn largest_within(bytes: u32) -> Option<Mtu> {
        Mtu::ALL.iter().rev().copied().find(|m| m.bytes() <= bytes)
    }
}

impl fmt::Display for Mtu {
    /// The size in bytes, e.g. `"1024"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

bitflags::bitflags! {
    /// `enum ibv_qp_attr_mask`: which [`QpAttr`] fields an ibv_modify_qp call
    /// sets, or an ibv_query_qp call asks for (manual 3.5.1 ibv_modify_qp;
    /// required and optional attributes per transition in 3.5.2–3.5.4 and the
    /// QP state transition table of IBTA Vol 1 chapter 10).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`: `qp_state`.
        const STATE = 1 << 0;
        /// `IBV_QP_CUR_STATE`: `cur_qp_state`.
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`: `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`: `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`: `port_num`.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`: `qkey`.
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`: `ah_attr`.
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`: `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`: `timeout`.
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`: `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`: `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`: `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`: `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`: `alt_ah_attr`, `alt_pkey_index`, `alt_port_num`,
        /// `alt_timeout`.
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`: `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`: `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`: `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`: `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`: `cap`.
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`: `dest_qp_num`.
        const DEST_QPN = 1 << 20;
        /// `IBV_QP_RATE_LIMIT`: `rate_limit`. (Bits 21–24 were used by old
        /// kernels and never exposed by libibverbs.)
        const RATE_LIMIT = 1 << 25;
    }
}

/// `union ibv_gid`: a 128-bit Global Identifier (manual 3.3.3 ibv_query_gid,
/// 2.3.7 GRH), stored in network byte order.
///
/// A GID is formatted like an IPv6 address. On RoCEv2 the GID *is* the
/// interface's IP address; an IPv4 address is carried IPv4-mapped,
/// `::ffff:a.b.c.d` (IBTA Vol 1 Annex A17 RoCEv2).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID.
    pub const ZERO: Gid = Gid([0; 16]);

    /// The RoCEv2 GID of an IPv4 address: `::ffff:a.b.c.d`.
    #[must_use]
    pub const fn from_ipv4(ip: Ipv4Addr) -> Gid {
        Gid(ip.to_ipv6_mapped().octets())
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), else `None`.
    #[must_use]
    pub const fn to_ipv4(&self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }

    /// The GID with the 16 bytes of an IPv6 address.
    #[must_use]
    pub const fn from_ipv6(ip: Ipv6Addr) -> Gid {
        Gid(ip.octets())
    }

    /// The 16 bytes as an IPv6 address.
    #[must_use]
    pub const fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from_bits(u128::from_be_bytes(self.0))
    }

    /// True for the all-zero GID (an unset or invalid GID table entry).
    #[must_use]
    pub const fn is_zero(&self) -> bool {
        u128::from_be_bytes(self.0) == 0
    }

    /// The upper 64 bits (`ibv_gid.global.subnet_prefix`), as a number.
    #[must_use]
    pub const fn subnet_prefix(&self) -> u64 {
        (u128::from_be_bytes(self.0) >> 64) as u64
    }

    /// The lower 64 bits (`ibv_gid.global.interface_id`), as a number.
    #[must_use]
    pub const fn interface_id(&self) -> u64 {
        u128::from_be_bytes(self.0) as u64
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Gid {
        Gid::from_ipv4(ip)
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(ip: Ipv6Addr) -> Gid {
        Gid::from_ipv6(ip)
    }
}

impl From<[u8; 16]> for Gid {
    fn from(raw: [u8; 16]) -> Gid {
        Gid(raw)
    }
}

impl fmt::Display for Gid {
    /// As an IPv6 address; IPv4-mapped GIDs print as `::ffff:a.b.c.d`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_ipv6(), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// `struct ibv_global_route`: the GRH part of an address vector (manual 3.4.15
/// ibv_create_ah, 2.3.7 Global Routing Header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Index of the source GID in the port's GID table.
    pub sgid_index: u8,
    /// Hop limit (IPv6) / TTL (IPv4).
    pub hop_limit: u8,
    /// Traffic class (IPv6) / DSCP+ECN (IPv4).
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`: an address vector (manual 2.3.6 Address Vector,
/// 3.4.15 ibv_create_ah). On RoCE there are no LIDs, so `is_global` must be
/// set and `grh` addresses the peer (IBTA Vol 1 Annex A16/A17).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AhAttr {
    /// Global route; used when `is_global` is set.
    pub grh: GlobalRoute,
    /// Destination LID (InfiniBand only).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits (InfiniBand only).
    pub src_path_bits: u8,
    /// Static rate (`enum ibv_rate`; 0 = port rate).
    pub static_rate: u8,
    /// Use `grh` (required on RoCE).
    pub is_global: bool,
    /// Local port to send from (1 is the first port).
    pub port_num: u8,
}

/// `struct ibv_qp_cap`: queue sizes of a QP (manual 3.4.3 ibv_create_qp).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct QpCap {
    /// Maximum outstanding send WRs.
    pub max_send_wr: u32,
    /// Maximum outstanding receive WRs.
    pub max_recv_wr: u32,
    /// Maximum SGEs per send WR.
    pub max_send_sge: u32,
    /// Maximum SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Maximum bytes of inline data per send WR.
    pub max_inline_data: u32,
}

impl QpCap {
    /// Queues of `max_send_wr` send and `max_recv_wr` receive WRs, one SGE per WR
    /// each way and no inline data: the sizes most QPs are created with. Set the
    /// other fields (`QpCap { max_send_sge: 4, ..QpCap::new(16, 16) }`) for more.
    #[must_use]
    pub const fn new(max_send_wr: u32, max_recv_wr: u32) -> Self {
        QpCap {
            max_send_wr,
            max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// `struct ibv_qp_attr`: QP attributes for ibv_modify_qp and ibv_query_qp
/// (manual 3.5.1 ibv_modify_qp, 3.6.1 ibv_query_qp). Which fields matter is
/// given by a [`QpAttrMask`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpAttr {
    /// Target state (`IBV_QP_STATE`).
    pub qp_state: QpState,
    /// Assumed current state (`IBV_QP_CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU (`IBV_QP_PATH_MTU`; RC/UC, set at INIT→RTR).
    pub path_mtu: Mtu,
    /// Path migration state (`IBV_QP_PATH_MIG_STATE`).
    pub path_mig_state: MigState,
    /// Q_Key (`IBV_QP_QKEY`; UD).
    pub qkey: u32,
    /// Expected PSN of the first incoming packet (`IBV_QP_RQ_PSN`, 24 bits).
    pub rq_psn: u32,
    /// PSN of the first outgoing packet (`IBV_QP_SQ_PSN`, 24 bits).
    pub sq_psn: u32,
    /// Remote QP number (`IBV_QP_DEST_QPN`; RC/UC).
    pub dest_qp_num: u32,
    /// Remote access allowed on this QP (`IBV_QP_ACCESS_FLAGS`; only the
    /// REMOTE_* flags matter).
    pub qp_access_flags: AccessFlags,
    /// Queue sizes (`IBV_QP_CAP`).
    pub cap: QpCap,
    /// Primary path address vector (`IBV_QP_AV`).
    pub ah_attr: AhAttr,
    /// Alternate path address vector (`IBV_QP_ALT_PATH`).
    pub alt_ah_attr: AhAttr,
    /// Primary P_Key index (`IBV_QP_PKEY_INDEX`).
    pub pkey_index: u16,
    /// Alternate P_Key index (`IBV_QP_ALT_PATH`).
    pub alt_pkey_index: u16,
    /// Generate `IBV_EVENT_SQ_DRAINED` on entering SQD
    /// (`IBV_QP_EN_SQD_ASYNC_NOTIFY`).
    pub en_sqd_async_notify: bool,
    /// Query only: the send queue is still draining (in SQD).
    pub sq_draining: bool,
    /// Outstanding RDMA READ / atomic operations this QP may initiate
    /// (`IBV_QP_MAX_QP_RD_ATOMIC`, initiator depth).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ / atomic operations this QP accepts as responder
    /// (`IBV_QP_MAX_DEST_RD_ATOMIC`, responder resources).
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer code (`IBV_QP_MIN_RNR_TIMER`; encoding per IBTA Vol 1 RNR NAK timer table).
    pub min_rnr_timer: u8,
    /// Primary port (`IBV_QP_PORT`).
    pub port_num: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout, 0 = infinite
    /// (`IBV_QP_TIMEOUT`).
    pub timeout: u8,
    /// Transport retry count, 0..=7 (`IBV_QP_RETRY_CNT`).
    pub retry_cnt: u8,
    /// RNR retry count, 0..=7, 7 = infinite (`IBV_QP_RNR_RETRY`).
    pub rnr_retry: u8,
    /// Alternate port (`IBV_QP_ALT_PATH`).
    pub alt_port_num: u8,
    /// Alternate path ACK timeout (`IBV_QP_ALT_PATH`).
    pub alt_timeout: u8,
    /// Rate limit in kbps (`IBV_QP_RATE_LIMIT`; 0 = unlimited).
    pub rate_limit: u32,
}

impl Default for QpAttr {
    /// Everything zero/empty like a zeroed `struct ibv_qp_attr`, except
    /// `path_mtu`, which has no zero value and defaults to 1024.
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            path_mig_state: MigState::Migrated,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            alt_ah_attr: AhAttr::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_cap_new_is_one_sge_each_way_and_no_inline_data() {
        assert_eq!(
            QpCap::new(16, 8),
            QpCap {
                max_send_wr: 16,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            }
        );
    }

    #[test]
    fn enum_values_match_libibverbs() {
        let types = [
            (QpType::Rc, 2),
            (QpType::Uc, 3),
            (QpType::Ud, 4),
            (QpType::RawPacket, 8),
        ];
        for (t, v) in types {
            assert_eq!(t.as_u32(), v);
        }
        assert_eq!(
            (
                QpType::XrcSend as u32,
                QpType::XrcRecv as u32,
                QpType::Driver as u32
            ),
            (9, 10, 255)
        );
        for (i, s) in QpState::ALL.iter().enumerate() {
            assert_eq!(s.as_u32() as usize, i);
            assert_eq!(QpState::try_from(i as u32), Ok(*s));
        }
        for t in QpType::ALL {
            assert_eq!(QpType::try_from(t.as_u32()), Ok(*t));
        }
        assert!(QpType::try_from(5).is_err());
        assert_eq!(MigState::try_from(2), Ok(MigState::Armed));
        assert!(MigState::try_from(3).is_err());
    }

    #[test]
    fn state_names() {
        let names: Vec<String> = QpState::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN"]
        );
        assert_eq!(QpType::Rc.to_string(), "RC");
    }

    #[test]
    fn mtu_bytes() {
        let bytes: Vec<u32> = Mtu::ALL.iter().map(|m| m.bytes()).collect();
        assert_eq!(bytes, [256, 512, 1024, 2048, 4096]);
        assert_eq!(Mtu::Mtu256.as_u32(), 1);
        assert_eq!(Mtu::Mtu4096.as_u32(), 5);
        for m in Mtu::ALL {
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(*m));
            assert_eq!(Mtu::try_from(m.as_u32()), Ok(*m));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from_bytes(0), None);
        assert!(Mtu::try_from(0).is_err());
        assert!(Mtu::try_from(6).is_err());
        assert_eq!(Mtu::largest_within(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::largest_within(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::largest_within(255), None);
        assert_eq!(Mtu::Mtu2048.to_string(), "2048");
    }

    #[test]
    fn attr_mask_values_match_libibverbs() {
        assert_eq!(QpAttrMask::STATE.bits(), 1);
        assert_eq!(QpAttrMask::AV.bits(), 0x80);
        assert_eq!(QpAttrMask::PATH_MTU.bits(), 0x100);
        assert_eq!(QpAttrMask::MAX_QP_RD_ATOMIC.bits(), 0x2000);
        assert_eq!(QpAttrMask::SQ_PSN.bits(), 0x1_0000);
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 0x10_0000);
        assert_eq!(QpAttrMask::RATE_LIMIT.bits(), 0x200_0000);
        assert_eq!(QpAttrMask::all().bits(), 0x21f_ffff);
    }

    #[test]
    fn gid_from_ipv4_is_v4_mapped() {
        let g = Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(g.0, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]);
        assert_eq!(g.to_ipv4(), Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(g.to_string(), "::ffff:10.0.0.1");
        assert_eq!(format!("{g:?}"), "Gid(::ffff:10.0.0.1)");
        assert_eq!(g.subnet_prefix(), 0);
        assert_eq!(g.interface_id(), 0x0000_ffff_0a00_0001);
        assert!(!g.is_zero());
        assert_eq!(Gid::from(Ipv4Addr::new(10, 0, 0, 1)), g);
    }

    #[test]
    fn gid_ipv6_and_zero() {
        let ip: Ipv6Addr = "fe80::1234:5678".parse().unwrap();
        let g = Gid::from_ipv6(ip);
        assert_eq!(g.to_ipv6(), ip);
        assert_eq!(g.to_ipv4(), None);
        assert_eq!(g.to_string(), "fe80::1234:5678");
        assert_eq!(g.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert!(Gid::default().is_zero());
        assert_eq!(Gid::default(), Gid::ZERO);
        assert_eq!(Gid::ZERO.to_string(), "::");
    }

    #[test]
    fn attr_defaults() {
        let a = QpAttr::default();
        assert_eq!(
            (a.qp_state, a.path_mtu, a.path_mig_state),
            (QpState::Reset, Mtu::Mtu1024, MigState::Migrated)
        );
        assert!(a.qp_access_flags.is_empty());
        assert!(!a.ah_attr.is_global);
        assert_eq!(a.cap, QpCap::default());
    }
}
