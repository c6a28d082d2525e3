//! `ibv_close_device` releases what the context made, as the kernel does when a
//! process closes its verbs file, even while another context of the same device (as
//! librdmacm keeps one) holds the NIC open.

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::ptr::null_mut;

use rdma_emu_ibverbs::sys::*;
use rdma_emu_ibverbs::*;

/// The IPv4-mapped multicast GID of 239.77.x.y.
fn group(i: u32) -> ibv_gid {
    let mut raw = [0u8; 16];
    raw[10] = 0xff;
    raw[11] = 0xff;
    raw[12] = 239;
    raw[13] = 77;
    raw[14..].copy_from_slice(&u16::try_from(i).unwrap().to_be_bytes());
    ibv_gid { raw }
}

/// A UD QP of a new PD and CQ of `ctx`.
unsafe fn ud_qp(ctx: *mut ibv_context) -> *mut ibv_qp {
    unsafe {
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 8, null_mut(), null_mut(), 0);
        assert!(!pd.is_null() && !cq.is_null());
        let mut init = ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            qp_type: IBV_QPT_UD,
            cap: ibv_qp_cap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..Default::default()
        };
        let qp = ibv_create_qp(pd, &mut init);
        assert!(!qp.is_null());
        qp
    }
}

/// A context closed with a QP still attached to every multicast group the device
/// allows (`max_mcast_grp`) gives them all back: a QP of another context of the same
/// device then joins as many. Before, the closed context's QP stayed on the device
/// (attached, so not even destroyable), and the other context's first attach failed
/// with ENOMEM.
#[test]
fn a_closed_context_leaves_its_groups() {
    // Read once, at the first ibv_get_device_list of the process.
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { std::env::set_var("RDMA_EMU_DEVICES", "emu0=127.0.0.91") };
    unsafe {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        assert_eq!(n, 1);
        let keeper = ibv_open_device(*list);
        let ctx = ibv_open_device(*list);
        assert!(!keeper.is_null() && !ctx.is_null());
        let mut attr = ibv_device_attr::default();
        assert_eq!(ibv_query_device(ctx, &mut attr), 0);
        let max = u32::try_from(attr.max_mcast_grp).unwrap();
        assert!(max > 0 && max <= 4096, "max_mcast_grp {max}");

        let qp = ud_qp(ctx);
        for i in 0..max {
            assert_eq!(ibv_attach_mcast(qp, &group(i), 0), 0, "attach {i}");
        }
        assert_eq!(ibv_attach_mcast(qp, &group(max), 0), libc::ENOMEM);
        assert_eq!(ibv_close_device(ctx), 0);

        let other = ud_qp(keeper);
        for i in 0..max {
            assert_eq!(
                ibv_attach_mcast(other, &group(max + i), 0),
                0,
                "attach {i} after the close"
            );
        }
        for i in 0..max {
            assert_eq!(ibv_detach_mcast(other, &group(max + i), 0), 0);
        }
        assert_eq!(ibv_destroy_qp(other), 0);
        assert_eq!(ibv_close_device(keeper), 0);
        ibv_free_device_list(list);
    }
}
