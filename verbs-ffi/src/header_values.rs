//! Every numeric value verbs-api gives a libibverbs enum or flag, against the
//! constants bindgen generated from `<infiniband/verbs.h>` (module `sys`, rdma-core 44:
//! the few values newer than that header are named). These values are the C ABI, the
//! same in every rdma-core release that has them, so the conversions of `convert` pass
//! them as plain numbers.

use crate::sys::*;
use verbs_api::{
    AccessFlags, AsyncEventType, AtomicCap, DeviceCapFlags, MigState, Mtu, MwType, NodeType,
    PortState, QpAttrMask, QpState, QpType, ReregMrFlags, SendFlags, SrqAttrMask, WcFlags,
    WcOpcode, WcStatus, WrOpcode,
};

/// The values of `all` that `checked` does not name.
fn missing<T: Copy + PartialEq, V>(all: &[T], checked: &[(T, V)]) -> Vec<T> {
    all.iter()
        .copied()
        .filter(|t| !checked.iter().any(|(k, _)| k == t))
        .collect()
}

#[test]
fn wc_status_matches_verbs_h() {
    let c = [
        (WcStatus::Success, IBV_WC_SUCCESS),
        (WcStatus::LocLenErr, IBV_WC_LOC_LEN_ERR),
        (WcStatus::LocQpOpErr, IBV_WC_LOC_QP_OP_ERR),
        (WcStatus::LocEecOpErr, IBV_WC_LOC_EEC_OP_ERR),
        (WcStatus::LocProtErr, IBV_WC_LOC_PROT_ERR),
        (WcStatus::WrFlushErr, IBV_WC_WR_FLUSH_ERR),
        (WcStatus::MwBindErr, IBV_WC_MW_BIND_ERR),
        (WcStatus::BadRespErr, IBV_WC_BAD_RESP_ERR),
        (WcStatus::LocAccessErr, IBV_WC_LOC_ACCESS_ERR),
        (WcStatus::RemInvReqErr, IBV_WC_REM_INV_REQ_ERR),
        (WcStatus::RemAccessErr, IBV_WC_REM_ACCESS_ERR),
        (WcStatus::RemOpErr, IBV_WC_REM_OP_ERR),
        (WcStatus::RetryExcErr, IBV_WC_RETRY_EXC_ERR),
        (WcStatus::RnrRetryExcErr, IBV_WC_RNR_RETRY_EXC_ERR),
        (WcStatus::LocRddViolErr, IBV_WC_LOC_RDD_VIOL_ERR),
        (WcStatus::RemInvRdReqErr, IBV_WC_REM_INV_RD_REQ_ERR),
        (WcStatus::RemAbortErr, IBV_WC_REM_ABORT_ERR),
        (WcStatus::InvEecnErr, IBV_WC_INV_EECN_ERR),
        (WcStatus::InvEecStateErr, IBV_WC_INV_EEC_STATE_ERR),
        (WcStatus::FatalErr, IBV_WC_FATAL_ERR),
        (WcStatus::RespTimeoutErr, IBV_WC_RESP_TIMEOUT_ERR),
        (WcStatus::GeneralErr, IBV_WC_GENERAL_ERR),
        (WcStatus::TmErr, IBV_WC_TM_ERR),
        (WcStatus::TmRndvIncomplete, IBV_WC_TM_RNDV_INCOMPLETE),
    ];
    assert_eq!(c.len(), WcStatus::ALL.len());
    for (s, v) in c {
        assert_eq!(s.as_u32(), v, "{s:?}");
    }
}

#[test]
fn wc_opcode_and_flags_match_verbs_h() {
    let c = [
        (WcOpcode::Send, IBV_WC_SEND),
        (WcOpcode::RdmaWrite, IBV_WC_RDMA_WRITE),
        (WcOpcode::RdmaRead, IBV_WC_RDMA_READ),
        (WcOpcode::CompSwap, IBV_WC_COMP_SWAP),
        (WcOpcode::FetchAdd, IBV_WC_FETCH_ADD),
        (WcOpcode::BindMw, IBV_WC_BIND_MW),
        (WcOpcode::LocalInv, IBV_WC_LOCAL_INV),
        (WcOpcode::Tso, IBV_WC_TSO),
        (WcOpcode::AtomicWrite, IBV_WC_ATOMIC_WRITE),
        (WcOpcode::Recv, IBV_WC_RECV),
        (WcOpcode::RecvRdmaWithImm, IBV_WC_RECV_RDMA_WITH_IMM),
        (WcOpcode::TmAdd, IBV_WC_TM_ADD),
        (WcOpcode::TmDel, IBV_WC_TM_DEL),
        (WcOpcode::TmSync, IBV_WC_TM_SYNC),
        (WcOpcode::TmRecv, IBV_WC_TM_RECV),
        (WcOpcode::TmNoTag, IBV_WC_TM_NO_TAG),
        (WcOpcode::Driver1, IBV_WC_DRIVER1),
        (WcOpcode::Driver2, IBV_WC_DRIVER2),
        (WcOpcode::Driver3, IBV_WC_DRIVER3),
    ];
    // rdma-core 44 (Debian 12) predates IBV_WC_FLUSH (8): the one value it lacks.
    assert_eq!(missing(WcOpcode::ALL, &c), [WcOpcode::Flush]);
    assert_eq!(WcOpcode::Flush.as_u32(), 8);
    for (o, v) in c {
        assert_eq!(o.as_u32(), v, "{o:?}");
    }
    let f = [
        (WcFlags::GRH, IBV_WC_GRH),
        (WcFlags::WITH_IMM, IBV_WC_WITH_IMM),
        (WcFlags::IP_CSUM_OK, IBV_WC_IP_CSUM_OK),
        (WcFlags::WITH_INV, IBV_WC_WITH_INV),
        (WcFlags::TM_SYNC_REQ, IBV_WC_TM_SYNC_REQ),
        (WcFlags::TM_MATCH, IBV_WC_TM_MATCH),
        (WcFlags::TM_DATA_VALID, IBV_WC_TM_DATA_VALID),
    ];
    assert_eq!(f.len(), WcFlags::all().iter().count());
    for (a, b) in f {
        assert_eq!(a.bits(), b, "{a:?}");
    }
}

#[test]
fn wr_opcode_and_send_flags_match_verbs_h() {
    let c = [
        (WrOpcode::RdmaWrite, IBV_WR_RDMA_WRITE),
        (WrOpcode::RdmaWriteWithImm, IBV_WR_RDMA_WRITE_WITH_IMM),
        (WrOpcode::Send, IBV_WR_SEND),
        (WrOpcode::SendWithImm, IBV_WR_SEND_WITH_IMM),
        (WrOpcode::RdmaRead, IBV_WR_RDMA_READ),
        (WrOpcode::AtomicCmpAndSwp, IBV_WR_ATOMIC_CMP_AND_SWP),
        (WrOpcode::AtomicFetchAndAdd, IBV_WR_ATOMIC_FETCH_AND_ADD),
        (WrOpcode::LocalInv, IBV_WR_LOCAL_INV),
        (WrOpcode::BindMw, IBV_WR_BIND_MW),
        (WrOpcode::SendWithInv, IBV_WR_SEND_WITH_INV),
        (WrOpcode::Tso, IBV_WR_TSO),
        (WrOpcode::Driver1, IBV_WR_DRIVER1),
        (WrOpcode::AtomicWrite, IBV_WR_ATOMIC_WRITE),
    ];
    // rdma-core 44 predates IBV_WR_FLUSH (14): the one value it lacks.
    assert_eq!(missing(WrOpcode::ALL, &c), [WrOpcode::Flush]);
    assert_eq!(WrOpcode::Flush.as_u32(), 14);
    for (o, v) in c {
        assert_eq!(o.as_u32(), v, "{o:?}");
    }
    let f = [
        (SendFlags::FENCE, IBV_SEND_FENCE),
        (SendFlags::SIGNALED, IBV_SEND_SIGNALED),
        (SendFlags::SOLICITED, IBV_SEND_SOLICITED),
        (SendFlags::INLINE, IBV_SEND_INLINE),
        (SendFlags::IP_CSUM, IBV_SEND_IP_CSUM),
    ];
    assert_eq!(f.len(), SendFlags::all().iter().count());
    for (a, b) in f {
        assert_eq!(a.bits(), b, "{a:?}");
    }
}

#[test]
fn event_types_match_verbs_h() {
    let c = [
        (AsyncEventType::CqErr, IBV_EVENT_CQ_ERR),
        (AsyncEventType::QpFatal, IBV_EVENT_QP_FATAL),
        (AsyncEventType::QpReqErr, IBV_EVENT_QP_REQ_ERR),
        (AsyncEventType::QpAccessErr, IBV_EVENT_QP_ACCESS_ERR),
        (AsyncEventType::CommEst, IBV_EVENT_COMM_EST),
        (AsyncEventType::SqDrained, IBV_EVENT_SQ_DRAINED),
        (AsyncEventType::PathMig, IBV_EVENT_PATH_MIG),
        (AsyncEventType::PathMigErr, IBV_EVENT_PATH_MIG_ERR),
        (AsyncEventType::DeviceFatal, IBV_EVENT_DEVICE_FATAL),
        (AsyncEventType::PortActive, IBV_EVENT_PORT_ACTIVE),
        (AsyncEventType::PortErr, IBV_EVENT_PORT_ERR),
        (AsyncEventType::LidChange, IBV_EVENT_LID_CHANGE),
        (AsyncEventType::PkeyChange, IBV_EVENT_PKEY_CHANGE),
        (AsyncEventType::SmChange, IBV_EVENT_SM_CHANGE),
        (AsyncEventType::SrqErr, IBV_EVENT_SRQ_ERR),
        (AsyncEventType::SrqLimitReached, IBV_EVENT_SRQ_LIMIT_REACHED),
        (
            AsyncEventType::QpLastWqeReached,
            IBV_EVENT_QP_LAST_WQE_REACHED,
        ),
        (
            AsyncEventType::ClientReregister,
            IBV_EVENT_CLIENT_REREGISTER,
        ),
        (AsyncEventType::GidChange, IBV_EVENT_GID_CHANGE),
        (AsyncEventType::WqFatal, IBV_EVENT_WQ_FATAL),
    ];
    for (t, v) in c {
        assert_eq!(t.as_u32(), v, "{t:?}");
    }
    // rdma-core 44 (Debian 12) predates IBV_EVENT_DEVICE_SPEED_CHANGE (20); the one
    // verbs-api value the header lacks is that one, and it follows WQ_FATAL.
    assert_eq!(
        missing(AsyncEventType::ALL, &c),
        [AsyncEventType::DeviceSpeedChange]
    );
    assert_eq!(AsyncEventType::DeviceSpeedChange.as_u32(), 20);
}

#[test]
fn qp_enums_and_masks_match_verbs_h() {
    let m = [
        (QpAttrMask::STATE, IBV_QP_STATE),
        (QpAttrMask::CUR_STATE, IBV_QP_CUR_STATE),
        (QpAttrMask::EN_SQD_ASYNC_NOTIFY, IBV_QP_EN_SQD_ASYNC_NOTIFY),
        (QpAttrMask::ACCESS_FLAGS, IBV_QP_ACCESS_FLAGS),
        (QpAttrMask::PKEY_INDEX, IBV_QP_PKEY_INDEX),
        (QpAttrMask::PORT, IBV_QP_PORT),
        (QpAttrMask::QKEY, IBV_QP_QKEY),
        (QpAttrMask::AV, IBV_QP_AV),
        (QpAttrMask::PATH_MTU, IBV_QP_PATH_MTU),
        (QpAttrMask::TIMEOUT, IBV_QP_TIMEOUT),
        (QpAttrMask::RETRY_CNT, IBV_QP_RETRY_CNT),
        (QpAttrMask::RNR_RETRY, IBV_QP_RNR_RETRY),
        (QpAttrMask::RQ_PSN, IBV_QP_RQ_PSN),
        (QpAttrMask::MAX_QP_RD_ATOMIC, IBV_QP_MAX_QP_RD_ATOMIC),
        (QpAttrMask::ALT_PATH, IBV_QP_ALT_PATH),
        (QpAttrMask::MIN_RNR_TIMER, IBV_QP_MIN_RNR_TIMER),
        (QpAttrMask::SQ_PSN, IBV_QP_SQ_PSN),
        (QpAttrMask::MAX_DEST_RD_ATOMIC, IBV_QP_MAX_DEST_RD_ATOMIC),
        (QpAttrMask::PATH_MIG_STATE, IBV_QP_PATH_MIG_STATE),
        (QpAttrMask::CAP, IBV_QP_CAP),
        (QpAttrMask::DEST_QPN, IBV_QP_DEST_QPN),
        (QpAttrMask::RATE_LIMIT, IBV_QP_RATE_LIMIT),
    ];
    assert_eq!(m.len(), QpAttrMask::all().iter().count());
    for (a, b) in m {
        assert_eq!(a.bits(), b, "{a:?}");
    }
    let s = [
        (QpState::Reset, IBV_QPS_RESET),
        (QpState::Init, IBV_QPS_INIT),
        (QpState::Rtr, IBV_QPS_RTR),
        (QpState::Rts, IBV_QPS_RTS),
        (QpState::Sqd, IBV_QPS_SQD),
        (QpState::Sqe, IBV_QPS_SQE),
        (QpState::Err, IBV_QPS_ERR),
        (QpState::Unknown, IBV_QPS_UNKNOWN),
    ];
    assert_eq!(s.len(), QpState::ALL.len());
    for (a, b) in s {
        assert_eq!(a.as_u32(), b, "{a:?}");
    }
    let t = [
        (QpType::Rc, IBV_QPT_RC),
        (QpType::Uc, IBV_QPT_UC),
        (QpType::Ud, IBV_QPT_UD),
        (QpType::RawPacket, IBV_QPT_RAW_PACKET),
        (QpType::XrcSend, IBV_QPT_XRC_SEND),
        (QpType::XrcRecv, IBV_QPT_XRC_RECV),
        (QpType::Driver, IBV_QPT_DRIVER),
    ];
    assert_eq!(t.len(), QpType::ALL.len());
    for (a, b) in t {
        assert_eq!(a.as_u32(), b, "{a:?}");
    }
    let mtu = [
        (Mtu::Mtu256, IBV_MTU_256),
        (Mtu::Mtu512, IBV_MTU_512),
        (Mtu::Mtu1024, IBV_MTU_1024),
        (Mtu::Mtu2048, IBV_MTU_2048),
        (Mtu::Mtu4096, IBV_MTU_4096),
    ];
    for (a, b) in mtu {
        assert_eq!(a.as_u32(), b, "{a:?}");
    }
    for (a, b) in [
        (MigState::Migrated, IBV_MIG_MIGRATED),
        (MigState::Rearm, IBV_MIG_REARM),
        (MigState::Armed, IBV_MIG_ARMED),
    ] {
        assert_eq!(a.as_u32(), b, "{a:?}");
    }
}

#[test]
fn access_mw_srq_rereg_flags_match_verbs_h() {
    let a = [
        (AccessFlags::LOCAL_WRITE, IBV_ACCESS_LOCAL_WRITE),
        (AccessFlags::REMOTE_WRITE, IBV_ACCESS_REMOTE_WRITE),
        (AccessFlags::REMOTE_READ, IBV_ACCESS_REMOTE_READ),
        (AccessFlags::REMOTE_ATOMIC, IBV_ACCESS_REMOTE_ATOMIC),
        (AccessFlags::MW_BIND, IBV_ACCESS_MW_BIND),
        (AccessFlags::ZERO_BASED, IBV_ACCESS_ZERO_BASED),
        (AccessFlags::ON_DEMAND, IBV_ACCESS_ON_DEMAND),
        (AccessFlags::HUGETLB, IBV_ACCESS_HUGETLB),
        (AccessFlags::RELAXED_ORDERING, IBV_ACCESS_RELAXED_ORDERING),
    ];
    // rdma-core 44 predates IBV_ACCESS_FLUSH_GLOBAL / _PERSISTENT (1 << 8, 1 << 9).
    assert_eq!(a.len() + 2, AccessFlags::all().iter().count());
    assert_eq!(AccessFlags::FLUSH_GLOBAL.bits(), 1 << 8);
    assert_eq!(AccessFlags::FLUSH_PERSISTENT.bits(), 1 << 9);
    for (x, y) in a {
        assert_eq!(x.bits(), y, "{x:?}");
    }
    assert_eq!(MwType::Type1.as_u32(), IBV_MW_TYPE_1);
    assert_eq!(MwType::Type2.as_u32(), IBV_MW_TYPE_2);
    assert_eq!(SrqAttrMask::MAX_WR.bits(), IBV_SRQ_MAX_WR);
    assert_eq!(SrqAttrMask::LIMIT.bits(), IBV_SRQ_LIMIT);
    assert_eq!(
        ReregMrFlags::CHANGE_TRANSLATION.bits(),
        IBV_REREG_MR_CHANGE_TRANSLATION
    );
    assert_eq!(ReregMrFlags::CHANGE_PD.bits(), IBV_REREG_MR_CHANGE_PD);
    assert_eq!(
        ReregMrFlags::CHANGE_ACCESS.bits(),
        IBV_REREG_MR_CHANGE_ACCESS
    );
}

#[test]
fn device_and_port_enums_match_verbs_h() {
    for (a, b) in [
        (PortState::Nop, IBV_PORT_NOP),
        (PortState::Down, IBV_PORT_DOWN),
        (PortState::Init, IBV_PORT_INIT),
        (PortState::Armed, IBV_PORT_ARMED),
        (PortState::Active, IBV_PORT_ACTIVE),
        (PortState::ActiveDefer, IBV_PORT_ACTIVE_DEFER),
    ] {
        assert_eq!(a.as_u32(), b, "{a:?}");
    }
    for (a, b) in [
        (AtomicCap::None, IBV_ATOMIC_NONE),
        (AtomicCap::Hca, IBV_ATOMIC_HCA),
        (AtomicCap::Glob, IBV_ATOMIC_GLOB),
    ] {
        assert_eq!(a.as_u32(), b, "{a:?}");
    }
    for (a, b) in [
        (NodeType::Ca, IBV_NODE_CA),
        (NodeType::Switch, IBV_NODE_SWITCH),
        (NodeType::Router, IBV_NODE_ROUTER),
        (NodeType::Rnic, IBV_NODE_RNIC),
        (NodeType::Usnic, IBV_NODE_USNIC),
        (NodeType::UsnicUdp, IBV_NODE_USNIC_UDP),
        (NodeType::Unspecified, IBV_NODE_UNSPECIFIED),
    ] {
        assert_eq!(i64::from(a.as_u32()), i64::from(b), "{a:?}");
    }
    for (a, b) in [
        (DeviceCapFlags::RESIZE_MAX_WR, IBV_DEVICE_RESIZE_MAX_WR),
        (DeviceCapFlags::RC_RNR_NAK_GEN, IBV_DEVICE_RC_RNR_NAK_GEN),
        (DeviceCapFlags::SRQ_RESIZE, IBV_DEVICE_SRQ_RESIZE),
        (DeviceCapFlags::N_NOTIFY_CQ, IBV_DEVICE_N_NOTIFY_CQ),
        (DeviceCapFlags::MEM_WINDOW, IBV_DEVICE_MEM_WINDOW),
        (
            DeviceCapFlags::MEM_MGT_EXTENSIONS,
            IBV_DEVICE_MEM_MGT_EXTENSIONS,
        ),
        (
            DeviceCapFlags::MEM_WINDOW_TYPE_2B,
            IBV_DEVICE_MEM_WINDOW_TYPE_2B,
        ),
        (
            DeviceCapFlags::MANAGED_FLOW_STEERING,
            IBV_DEVICE_MANAGED_FLOW_STEERING,
        ),
    ] {
        assert_eq!(a.bits(), b, "{a:?}");
    }
    assert_eq!(
        verbs_api::PortCapFlags::IP_BASED_GIDS.bits(),
        IBV_PORT_IP_BASED_GIDS
    );
}
