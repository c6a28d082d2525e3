//! Shared receive queue attributes (`struct ibv_srq_attr`, `enum ibv_srq_attr_mask`;
//! manual 3.4.5-3.4.7, IBTA 10.2.9).

/// `struct ibv_srq_attr` (manual 3.4.5): the SRQ's size and its limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SrqAttr {
    /// Work requests the SRQ holds at most.
    pub max_wr: u32,
    /// Scatter elements per work request.
    pub max_sge: u32,
    /// The limit ("low watermark"): 0 when not armed. Ignored by `create_srq` (manual
    /// 3.4.5: "irrelevant for ibv_create_srq"; an SRQ is created unarmed).
    pub srq_limit: u32,
}

bitflags::bitflags! {
    /// `enum ibv_srq_attr_mask` (manual 3.4.6): which attributes `modify_srq` changes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SrqAttrMask: u32 {
        /// `IBV_SRQ_MAX_WR`: resize the SRQ.
        const MAX_WR = 1 << 0;
        /// `IBV_SRQ_LIMIT`: set (arm) or clear the SRQ limit.
        const LIMIT = 1 << 1;
    }
}
