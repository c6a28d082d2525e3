//! Device and port attributes (manual 3.2.7 ibv_node_type_str, 3.2.8
//! ibv_port_state_str, 3.3.1 ibv_query_device, 3.3.2 ibv_query_port).

use core::fmt;

use crate::qp::Mtu;

bitflags::bitflags! {
    /// `enum ibv_device_cap_flags`: optional capabilities of a device
    /// (manual 3.3.1 ibv_query_device, "device_cap_flags").
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct DeviceCapFlags: u32 {
        /// `IBV_DEVICE_RESIZE_MAX_WR`: QP queues can be resized.
        const RESIZE_MAX_WR = 1 << 0;
        /// `IBV_DEVICE_BAD_PKEY_CNTR`: bad P_Key counter supported.
        const BAD_PKEY_CNTR = 1 << 1;
        /// `IBV_DEVICE_BAD_QKEY_CNTR`: bad Q_Key counter supported.
        const BAD_QKEY_CNTR = 1 << 2;
        /// `IBV_DEVICE_RAW_MULTI`: raw multicast supported.
        const RAW_MULTI = 1 << 3;
        /// `IBV_DEVICE_AUTO_PATH_MIG`: automatic path migration supported.
        const AUTO_PATH_MIG = 1 << 4;
        /// `IBV_DEVICE_CHANGE_PHY_PORT`: a QP's port can be changed.
        const CHANGE_PHY_PORT = 1 << 5;
        /// `IBV_DEVICE_UD_AV_PORT_ENFORCE`: UD AV port number is enforced.
        const UD_AV_PORT_ENFORCE = 1 << 6;
        /// `IBV_DEVICE_CURR_QP_STATE_MOD`: `cur_qp_state` is honoured by
        /// ibv_modify_qp.
        const CURR_QP_STATE_MOD = 1 << 7;
        /// `IBV_DEVICE_SHUTDOWN_PORT`: ports can be shut down.
        const SHUTDOWN_PORT = 1 << 8;
        /// `IBV_DEVICE_INIT_TYPE`: InitType / InitTypeReply supported.
        const INIT_TYPE = 1 << 9;
        /// `IBV_DEVICE_PORT_ACTIVE_EVENT`: `IBV_EVENT_PORT_ACTIVE` is generated.
        const PORT_ACTIVE_EVENT = 1 << 10;
        /// `IBV_DEVICE_SYS_IMAGE_GUID`: `sys_image_guid` is valid.
        const SYS_IMAGE_GUID = 1 << 11;
        /// `IBV_DEVICE_RC_RNR_NAK_GEN`: RNR NAKs are generated for RC QPs.
        const RC_RNR_NAK_GEN = 1 << 12;
        /// `IBV_DEVICE_SRQ_RESIZE`: SRQs can be resized.
        const SRQ_RESIZE = 1 << 13;
        /// `IBV_DEVICE_N_NOTIFY_CQ`: CQ notification for N completions.
        const N_NOTIFY_CQ = 1 << 14;
        /// `IBV_DEVICE_MEM_WINDOW`: memory windows supported.
        const MEM_WINDOW = 1 << 17;
        /// `IBV_DEVICE_UD_IP_CSUM`: IP checksum offload on UD QPs.
        const UD_IP_CSUM = 1 << 18;
        /// `IBV_DEVICE_XRC`: XRC supported.
        const XRC = 1 << 20;
        /// `IBV_DEVICE_MEM_MGT_EXTENSIONS`: memory management extensions
        /// (fast registration, LOCAL_INV, SEND with Invalidate).
        const MEM_MGT_EXTENSIONS = 1 << 21;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`: type 2A memory windows.
        const MEM_WINDOW_TYPE_2A = 1 << 23;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`: type 2B memory windows.
        const MEM_WINDOW_TYPE_2B = 1 << 24;
        /// `IBV_DEVICE_RC_IP_CSUM`: IP checksum offload on RC QPs.
        const RC_IP_CSUM = 1 << 25;
        /// `IBV_DEVICE_RAW_IP_CSUM`: IP checksum offload on raw packet QPs.
        const RAW_IP_CSUM = 1 << 26;
        /// `IBV_DEVICE_MANAGED_FLOW_STEERING`: managed flow steering.
        const MANAGED_FLOW_STEERING = 1 << 29;
    }
}

bitflags::bitflags! {
    /// The extended capabilities of `ibv_device_attr_ex.device_cap_flags_ex` above
    /// bit 31 (`IB_UVERBS_DEVICE_*` of `<rdma/ib_user_verbs.h>`; the low 32 bits of
    /// that field repeat [`DeviceCapFlags`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct DeviceCapFlagsEx: u64 {
        /// `IB_UVERBS_DEVICE_RAW_SCATTER_FCS`: raw packet QPs can scatter the FCS.
        const RAW_SCATTER_FCS = 1 << 34;
        /// `IB_UVERBS_DEVICE_PCI_WRITE_END_PADDING`: PCI write end padding.
        const PCI_WRITE_END_PADDING = 1 << 36;
        /// `IB_UVERBS_DEVICE_FLUSH_GLOBAL`: RDMA FLUSH to global visibility (IBTA
        /// 1.5), `IBV_FLUSH_GLOBAL`.
        const FLUSH_GLOBAL = 1 << 38;
        /// `IB_UVERBS_DEVICE_FLUSH_PERSISTENT`: RDMA FLUSH to persistence (IBTA
        /// 1.5), `IBV_FLUSH_PERSISTENT`.
        const FLUSH_PERSISTENT = 1 << 39;
        /// `IB_UVERBS_DEVICE_ATOMIC_WRITE`: RDMA ATOMIC WRITE (IBTA 1.5).
        const ATOMIC_WRITE = 1 << 40;
    }
}

verbs_enum! {
    /// `enum ibv_atomic_cap`: the atomicity guarantee of atomic operations
    /// (manual 3.3.1 ibv_query_device, "atomic_cap").
    pub enum AtomicCap ("ibv_atomic_cap") {
        /// `IBV_ATOMIC_NONE`: atomic operations are not supported.
        None = 0,
        /// `IBV_ATOMIC_HCA`: atomic with respect to other atomics through this
        /// device.
        Hca = 1,
        /// `IBV_ATOMIC_GLOB`: atomic with respect to all memory accesses.
        Glob = 2,
    }
}

impl Default for AtomicCap {
    /// [`AtomicCap::None`] (value 0).
    fn default() -> Self {
        AtomicCap::None
    }
}

/// `struct ibv_device_attr` (manual 3.3.1 ibv_query_device). The `max_*`
/// fields are `int` in C; they are never negative, so they are `u32` here.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID. libibverbs stores the GUID bytes in network order in a
    /// `__be64`; here it is their big-endian value, so `node_guid.to_be_bytes()`
    /// are the GUID bytes.
    pub node_guid: u64,
    /// System image GUID (same convention as `node_guid`).
    pub sys_image_guid: u64,
    /// Largest contiguous block that can be registered.
    pub max_mr_size: u64,
    /// Supported page sizes (bit n set = 2^n bytes).
    pub page_size_cap: u64,
    /// Vendor ID, per IEEE.
    pub vendor_id: u32,
    /// Vendor-supplied part ID.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum outstanding WRs on any work queue.
    pub max_qp_wr: u32,
    /// Optional capabilities.
    pub device_cap_flags: DeviceCapFlags,
    /// Extended capabilities (`ibv_query_device_ex`'s `device_cap_flags_ex`, the bits
    /// above [`DeviceCapFlags`]): FLUSH and ATOMIC WRITE.
    pub device_cap_flags_ex: DeviceCapFlagsEx,
    /// Maximum SGEs per WR for non-RD QPs.
    pub max_sge: u32,
    /// Maximum SGEs per WR for RD QPs.
    pub max_sge_rd: u32,
    /// Maximum number of CQs.
    pub max_cq: u32,
    /// Maximum CQEs per CQ.
    pub max_cqe: u32,
    /// Maximum number of MRs.
    pub max_mr: u32,
    /// Maximum number of PDs.
    pub max_pd: u32,
    /// Maximum outstanding RDMA READ and atomic operations per QP as
    /// responder (bounds `max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// Maximum outstanding RDMA READ and atomic operations per EE context.
    pub max_ee_rd_atom: u32,
    /// Maximum resources for incoming RDMA READ and atomic operations.
    pub max_res_rd_atom: u32,
    /// Maximum RDMA READ and atomic operations a QP may initiate (bounds
    /// `max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// Maximum RDMA READ and atomic operations an EE context may initiate.
    pub max_ee_init_rd_atom: u32,
    /// Atomicity guarantee.
    pub atomic_cap: AtomicCap,
    /// Maximum number of EE contexts.
    pub max_ee: u32,
    /// Maximum number of RD domains.
    pub max_rdd: u32,
    /// Maximum number of memory windows.
    pub max_mw: u32,
    /// Maximum raw IPv6 datagram QPs.
    pub max_raw_ipv6_qp: u32,
    /// Maximum ethertype datagram QPs.
    pub max_raw_ethy_qp: u32,
    /// Maximum multicast groups.
    pub max_mcast_grp: u32,
    /// Maximum QPs per multicast group.
    pub max_mcast_qp_attach: u32,
    /// Maximum QPs attached to multicast groups in total.
    pub max_total_mcast_qp_attach: u32,
    /// Maximum number of address handles.
    pub max_ah: u32,
    /// Maximum number of fast memory regions.
    pub max_fmr: u32,
    /// Maximum remaps per FMR before an unmap is required.
    pub max_map_per_fmr: u32,
    /// Maximum number of SRQs.
    pub max_srq: u32,
    /// Maximum WRs per SRQ.
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ WR.
    pub max_srq_sge: u32,
    /// Maximum number of partitions (P_Keys).
    pub max_pkeys: u16,
    /// Local CA ACK delay (exponent, 4.096 µs × 2^n).
    pub local_ca_ack_delay: u8,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
}

verbs_enum! {
    /// `enum ibv_port_state`: logical port state (manual 3.3.2
    /// ibv_query_port, "state").
    pub enum PortState ("ibv_port_state") {
        /// `IBV_PORT_NOP`: no state change.
        Nop = 0,
        /// `IBV_PORT_DOWN`: the link is down.
        Down = 1,
        /// `IBV_PORT_INIT`: the link is up, the SM has not configured the port.
        Init = 2,
        /// `IBV_PORT_ARMED`: configured, waiting to become active.
        Armed = 3,
        /// `IBV_PORT_ACTIVE`: the port can send and receive.
        Active = 4,
        /// `IBV_PORT_ACTIVE_DEFER`: active, transitioning to down.
        ActiveDefer = 5,
    }
}

impl PortState {
    /// The text `ibv_port_state_str` returns (manual 3.2.8): `"no state
    /// change (NOP)"`, `"down"`, `"init"`, `"armed"`, `"active"`,
    /// `"active defer"`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            PortState::Nop => "no state change (NOP)",
            PortState::Down => "down",
            PortState::Init => "init",
            PortState::Armed => "armed",
            PortState::Active => "active",
            PortState::ActiveDefer => "active defer",
        }
    }

    /// The name `ibv_devinfo` prints for the state: `"PORT_NOP"`,
    /// `"PORT_DOWN"`, `"PORT_INIT"`, `"PORT_ARMED"`, `"PORT_ACTIVE"`,
    /// `"PORT_ACTIVE_DEFER"`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            PortState::Nop => "PORT_NOP",
            PortState::Down => "PORT_DOWN",
            PortState::Init => "PORT_INIT",
            PortState::Armed => "PORT_ARMED",
            PortState::Active => "PORT_ACTIVE",
            PortState::ActiveDefer => "PORT_ACTIVE_DEFER",
        }
    }
}

impl fmt::Display for PortState {
    /// Exactly `ibv_port_state_str` (see [`PortState::as_str`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

verbs_enum! {
    /// `IBV_LINK_LAYER_*`: the link layer of a port (`ibv_port_attr.link_layer`).
    pub enum LinkLayer ("ibv_link_layer") {
        /// `IBV_LINK_LAYER_UNSPECIFIED` (reported by old drivers; means
        /// InfiniBand).
        Unspecified = 0,
        /// `IBV_LINK_LAYER_INFINIBAND`.
        InfiniBand = 1,
        /// `IBV_LINK_LAYER_ETHERNET`: RoCE.
        Ethernet = 2,
    }
}

impl Default for LinkLayer {
    /// [`LinkLayer::Unspecified`] (value 0).
    fn default() -> Self {
        LinkLayer::Unspecified
    }
}

impl fmt::Display for LinkLayer {
    /// As `ibv_devinfo` prints it: `"Unknown"`, `"InfiniBand"`, `"Ethernet"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkLayer::Unspecified => "Unknown",
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
        })
    }
}

verbs_enum! {
    /// `enum ibv_node_type` (manual 3.2.7 ibv_node_type_str). libibverbs'
    /// `IBV_NODE_UNKNOWN` (-1) has no variant: it is the failure of
    /// `TryFrom<u32>`.
    pub enum NodeType ("ibv_node_type") {
        /// `IBV_NODE_CA`: an InfiniBand (or RoCE) channel adapter.
        Ca = 1,
        /// `IBV_NODE_SWITCH`.
        Switch = 2,
        /// `IBV_NODE_ROUTER`.
        Router = 3,
        /// `IBV_NODE_RNIC`: an iWARP NIC.
        Rnic = 4,
        /// `IBV_NODE_USNIC`.
        Usnic = 5,
        /// `IBV_NODE_USNIC_UDP`.
        UsnicUdp = 6,
        /// `IBV_NODE_UNSPECIFIED`.
        Unspecified = 7,
    }
}

impl NodeType {
    /// The text `ibv_node_type_str` returns (manual 3.2.7).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            NodeType::Ca => "InfiniBand channel adapter",
            NodeType::Switch => "InfiniBand switch",
            NodeType::Router => "InfiniBand router",
            NodeType::Rnic => "iWARP NIC",
            NodeType::Usnic => "usNIC",
            NodeType::UsnicUdp => "usNIC UDP",
            NodeType::Unspecified => "unspecified",
        }
    }
}

impl fmt::Display for NodeType {
    /// Exactly `ibv_node_type_str`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

bitflags::bitflags! {
    /// `enum ibv_port_cap_flags`: the bits of [`PortAttr::port_cap_flags`]
    /// (IBTA PortInfo:CapabilityMask).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct PortCapFlags: u32 {
        /// `IBV_PORT_SM`: a subnet manager runs on this port.
        const SM = 1 << 1;
        /// `IBV_PORT_NOTICE_SUP`.
        const NOTICE_SUP = 1 << 2;
        /// `IBV_PORT_TRAP_SUP`.
        const TRAP_SUP = 1 << 3;
        /// `IBV_PORT_OPT_IPD_SUP`.
        const OPT_IPD_SUP = 1 << 4;
        /// `IBV_PORT_AUTO_MIGR_SUP`: automatic path migration.
        const AUTO_MIGR_SUP = 1 << 5;
        /// `IBV_PORT_SL_MAP_SUP`.
        const SL_MAP_SUP = 1 << 6;
        /// `IBV_PORT_MKEY_NVRAM`.
        const MKEY_NVRAM = 1 << 7;
        /// `IBV_PORT_PKEY_NVRAM`.
        const PKEY_NVRAM = 1 << 8;
        /// `IBV_PORT_LED_INFO_SUP`.
        const LED_INFO_SUP = 1 << 9;
        /// `IBV_PORT_SYS_IMAGE_GUID_SUP`.
        const SYS_IMAGE_GUID_SUP = 1 << 11;
        /// `IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP`.
        const PKEY_SW_EXT_PORT_TRAP_SUP = 1 << 12;
        /// `IBV_PORT_EXTENDED_SPEEDS_SUP`.
        const EXTENDED_SPEEDS_SUP = 1 << 14;
        /// `IBV_PORT_CAP_MASK2_SUP`.
        const CAP_MASK2_SUP = 1 << 15;
        /// `IBV_PORT_CM_SUP`: a connection manager is supported.
        const CM_SUP = 1 << 16;
        /// `IBV_PORT_SNMP_TUNNEL_SUP`.
        const SNMP_TUNNEL_SUP = 1 << 17;
        /// `IBV_PORT_REINIT_SUP`.
        const REINIT_SUP = 1 << 18;
        /// `IBV_PORT_DEVICE_MGMT_SUP`.
        const DEVICE_MGMT_SUP = 1 << 19;
        /// `IBV_PORT_VENDOR_CLASS_SUP`.
        const VENDOR_CLASS_SUP = 1 << 20;
        /// `IBV_PORT_DR_NOTICE_SUP`.
        const DR_NOTICE_SUP = 1 << 21;
        /// `IBV_PORT_CAP_MASK_NOTICE_SUP`.
        const CAP_MASK_NOTICE_SUP = 1 << 22;
        /// `IBV_PORT_BOOT_MGMT_SUP`.
        const BOOT_MGMT_SUP = 1 << 23;
        /// `IBV_PORT_LINK_LATENCY_SUP`.
        const LINK_LATENCY_SUP = 1 << 24;
        /// `IBV_PORT_CLIENT_REG_SUP`.
        const CLIENT_REG_SUP = 1 << 25;
        /// `IBV_PORT_IP_BASED_GIDS`: GIDs are IP addresses (RoCE).
        const IP_BASED_GIDS = 1 << 26;
    }
}

/// `struct ibv_port_attr` (manual 3.3.2 ibv_query_port).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// Length of the source GID table.
    pub gid_tbl_len: u32,
    /// Supported capabilities ([`PortCapFlags`] bits).
    pub port_cap_flags: u32,
    /// Maximum message size.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// Length of the P_Key table.
    pub pkey_tbl_len: u16,
    /// First LID of the port (InfiniBand only).
    pub lid: u16,
    /// LID of the subnet manager.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Maximum number of virtual lanes.
    pub max_vl_num: u8,
    /// SM service level.
    pub sm_sl: u8,
    /// Subnet propagation delay.
    pub subnet_timeout: u8,
    /// Type of initialization performed by the SM.
    pub init_type_reply: u8,
    /// Active link width (IBTA encoding: 1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x).
    pub active_width: u8,
    /// Active link speed (IBTA encoding).
    pub active_speed: u8,
    /// Physical port state (IBTA encoding: 5 = LinkUp).
    pub phys_state: u8,
    /// Link layer; `Ethernet` for RoCE.
    pub link_layer: LinkLayer,
}

impl PortAttr {
    /// [`PortAttr::port_cap_flags`] as typed flags (unknown bits dropped).
    #[must_use]
    pub const fn cap_flags(&self) -> PortCapFlags {
        PortCapFlags::from_bits_truncate(self.port_cap_flags)
    }
}

impl Default for PortAttr {
    /// A down port with 1024-byte MTUs and every number zero.
    fn default() -> Self {
        PortAttr {
            state: PortState::Down,
            max_mtu: Mtu::Mtu1024,
            active_mtu: Mtu::Mtu1024,
            gid_tbl_len: 0,
            port_cap_flags: 0,
            max_msg_sz: 0,
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
            pkey_tbl_len: 0,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 0,
            sm_sl: 0,
            subnet_timeout: 0,
            init_type_reply: 0,
            active_width: 0,
            active_speed: 0,
            phys_state: 0,
            link_layer: LinkLayer::Unspecified,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_state_values_and_strings() {
        for (i, s) in PortState::ALL.iter().enumerate() {
            assert_eq!(s.as_u32() as usize, i);
            assert_eq!(PortState::try_from(i as u32), Ok(*s));
        }
        assert!(PortState::try_from(6).is_err());
        assert_eq!(PortState::Down.to_string(), "down");
        assert_eq!(PortState::Active.to_string(), "active");
        assert_eq!(PortState::Nop.to_string(), "no state change (NOP)");
        assert_eq!(PortState::ActiveDefer.to_string(), "active defer");
        assert_eq!(PortState::Active.name(), "PORT_ACTIVE");
    }

    #[test]
    fn node_type_and_link_layer() {
        assert_eq!(NodeType::Ca.as_u32(), 1);
        assert_eq!(NodeType::Ca.to_string(), "InfiniBand channel adapter");
        assert_eq!(NodeType::Rnic.to_string(), "iWARP NIC");
        assert!(NodeType::try_from(0).is_err());
        assert_eq!(NodeType::try_from(7), Ok(NodeType::Unspecified));
        assert_eq!(LinkLayer::Ethernet.as_u32(), 2);
        assert_eq!(LinkLayer::try_from(1), Ok(LinkLayer::InfiniBand));
        assert_eq!(LinkLayer::Ethernet.to_string(), "Ethernet");
    }

    #[test]
    fn cap_flag_values_match_libibverbs() {
        assert_eq!(DeviceCapFlags::RC_RNR_NAK_GEN.bits(), 0x1000);
        assert_eq!(DeviceCapFlags::MEM_WINDOW.bits(), 1 << 17);
        assert_eq!(DeviceCapFlags::MEM_MGT_EXTENSIONS.bits(), 1 << 21);
        assert_eq!(DeviceCapFlags::MANAGED_FLOW_STEERING.bits(), 1 << 29);
        assert_eq!(AtomicCap::try_from(1), Ok(AtomicCap::Hca));
        assert_eq!(AtomicCap::default(), AtomicCap::None);
        assert_eq!(PortCapFlags::IP_BASED_GIDS.bits(), 1 << 26);
        let p = PortAttr {
            port_cap_flags: (1 << 26) | (1 << 16) | (1 << 30),
            ..PortAttr::default()
        };
        assert_eq!(
            p.cap_flags(),
            PortCapFlags::IP_BASED_GIDS | PortCapFlags::CM_SUP
        );
    }

    #[test]
    fn defaults() {
        let d = DeviceAttr::default();
        assert_eq!(
            (d.max_qp, d.atomic_cap, d.fw_ver.as_str()),
            (0, AtomicCap::None, "")
        );
        let p = PortAttr::default();
        assert_eq!(
            (p.state, p.active_mtu, p.link_layer),
            (PortState::Down, Mtu::Mtu1024, LinkLayer::Unspecified)
        );
    }
}
