//! What several of capi's test programs set up alike, through the C ABI. Each test
//! binary uses a part of it.

#![allow(dead_code)]

pub(crate) mod rsock;

use rdma_emu_ibverbs::sys::*;
use rdma_emu_ibverbs::*;

/// An RC QP on `pd` with `cq` for both queues (4 WRs of 1 SGE each way), moved to INIT
/// on port 1.
///
/// # Safety
/// `pd` and `cq` are live objects of one context.
pub(crate) unsafe fn rc_qp_in_init(pd: *mut ibv_pd, cq: *mut ibv_cq) -> *mut ibv_qp {
    unsafe {
        let mut init = ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            qp_type: IBV_QPT_RC,
            cap: ibv_qp_cap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..Default::default()
        };
        let qp = ibv_create_qp(pd, &mut init);
        assert!(!qp.is_null());
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            port_num: 1,
            ..Default::default()
        };
        let mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        assert_eq!(ibv_modify_qp(qp, &mut attr, mask as i32), 0);
        qp
    }
}
