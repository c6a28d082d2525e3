//! The C ABI driven from Rust, the way a C program drives it: through the exported
//! functions and, for the inline verbs of `verbs.h`, through `ctx->ops` and the
//! `verbs_context` found from `abi_compat`. Needs nothing but Rust (the stock tools
//! and a C compiler are exercised by `tests/tools.rs` and `scripts/ci-capi.sh`).

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::ptr::null_mut;

use rdma_emu_ibverbs::sys::*;
use rdma_emu_ibverbs::*;

const SZ: usize = 4096;

struct End {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    mr: *mut ibv_mr,
    buf: Vec<u8>,
    gid: ibv_gid,
}

unsafe fn open(dev: *mut ibv_device) -> End {
    unsafe {
        let ctx = ibv_open_device(dev);
        assert!(!ctx.is_null());
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 32, null_mut(), null_mut(), 0);
        let mut buf = vec![0u8; SZ];
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), SZ, access as i32);
        assert!(!pd.is_null() && !cq.is_null() && !mr.is_null());
        let mut init = ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            qp_type: IBV_QPT_RC,
            cap: ibv_qp_cap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..Default::default()
        };
        let qp = ibv_create_qp(pd, &mut init);
        assert!(!qp.is_null());
        let mut gid = ibv_gid::default();
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        End {
            ctx,
            pd,
            cq,
            qp,
            mr,
            buf,
            gid,
        }
    }
}

unsafe fn connect(a: &End, b: &End) {
    unsafe {
        let mut at = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            port_num: 1,
            qp_access_flags: IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
            ..Default::default()
        };
        let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        assert_eq!(ibv_modify_qp(a.qp, &mut at, m as i32), 0);
        let mut at = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: IBV_MTU_1024,
            dest_qp_num: (*b.qp).qp_num,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            ..Default::default()
        };
        at.ah_attr.is_global = 1;
        at.ah_attr.grh.dgid = b.gid;
        at.ah_attr.grh.hop_limit = 64;
        at.ah_attr.port_num = 1;
        let m = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        assert_eq!(ibv_modify_qp(a.qp, &mut at, m as i32), 0);
        let mut at = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let m = IBV_QP_STATE
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC;
        assert_eq!(ibv_modify_qp(a.qp, &mut at, m as i32), 0);
        assert_eq!((*a.qp).state, IBV_QPS_RTS);
    }
}

/// What the inline `ibv_poll_cq` does: `cq->context->ops.poll_cq(cq, 1, &wc)`.
unsafe fn poll(cq: *mut ibv_cq) -> ibv_wc {
    unsafe {
        let poll_cq = (*(*cq).context).ops.poll_cq.unwrap();
        let mut wc = ibv_wc::default();
        for _ in 0..2_000_000 {
            match poll_cq(cq, 1, &mut wc) {
                1 => return wc,
                0 => {}
                n => panic!("poll_cq returned {n}"),
            }
        }
        panic!("no completion");
    }
}

#[test]
fn a_program_driving_the_c_abi() {
    // Read once, at the first ibv_get_device_list of the process.
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { std::env::set_var("RDMA_EMU_DEVICES", "emu0=127.0.0.21,emu1=127.0.0.22") };
    unsafe {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        assert_eq!(n, 2);
        assert_eq!(
            CStr::from_ptr(ibv_get_device_name(*list.add(1)))
                .to_str()
                .unwrap(),
            "emu1"
        );
        let mut a = open(*list);
        let mut b = open(*list.add(1));
        ibv_free_device_list(list);

        // The extended context, as verbs.h finds it.
        let ctx = &*a.ctx;
        assert_eq!(ctx.abi_compat as usize, usize::MAX);
        let vctx = &*(a.ctx.byte_sub(std::mem::offset_of!(verbs_context, context))
            as *const verbs_context);
        assert!(vctx.sz >= std::mem::size_of::<verbs_context>());
        let mut pa = ibv_port_attr::default();
        assert_eq!(
            vctx.query_port.unwrap()(a.ctx, 1, &mut pa, std::mem::size_of::<ibv_port_attr>()),
            0
        );
        assert_eq!(
            (pa.state, pa.link_layer as u32),
            (IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET)
        );

        connect(&a, &b);
        connect(&b, &a);

        // post_recv / post_send through ctx->ops; the bytes land in b's own Vec.
        let mut rsge = ibv_sge {
            addr: b.buf.as_mut_ptr() as u64,
            length: 64,
            lkey: (*b.mr).lkey,
        };
        let mut rwr = ibv_recv_wr {
            wr_id: 7,
            sg_list: &mut rsge,
            num_sge: 1,
            ..Default::default()
        };
        let mut bad_r = null_mut();
        assert_eq!(
            (*b.ctx).ops.post_recv.unwrap()(b.qp, &mut rwr, &mut bad_r),
            0
        );
        a.buf[..5].copy_from_slice(b"hello");
        let mut sge = ibv_sge {
            addr: a.buf.as_mut_ptr() as u64,
            length: 5,
            lkey: (*a.mr).lkey,
        };
        let mut wr = ibv_send_wr {
            wr_id: 1,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: IBV_WR_SEND,
            send_flags: IBV_SEND_SIGNALED,
            ..Default::default()
        };
        let mut bad = null_mut();
        assert_eq!((*a.ctx).ops.post_send.unwrap()(a.qp, &mut wr, &mut bad), 0);
        let wc = poll(a.cq);
        assert_eq!(
            (wc.status, wc.opcode, wc.wr_id),
            (IBV_WC_SUCCESS, IBV_WC_SEND, 1)
        );
        let wc = poll(b.cq);
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len, wc.wr_id),
            (IBV_WC_SUCCESS, IBV_WC_RECV, 5, 7)
        );
        assert_eq!(&b.buf[..5], b"hello");

        // RDMA WRITE then READ back, by the real addresses and keys.
        a.buf[100..108].copy_from_slice(b"written!");
        *wr.sg_list = ibv_sge {
            addr: a.buf.as_ptr() as u64 + 100,
            length: 8,
            lkey: (*a.mr).lkey,
        };
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: b.buf.as_ptr() as u64 + 2000,
            rkey: (*b.mr).rkey,
        };
        assert_eq!((*a.ctx).ops.post_send.unwrap()(a.qp, &mut wr, &mut bad), 0);
        assert_eq!(poll(a.cq).status, IBV_WC_SUCCESS);
        assert_eq!(&b.buf[2000..2008], b"written!");
        (*wr.sg_list).addr = a.buf.as_ptr() as u64 + 300;
        wr.opcode = IBV_WR_RDMA_READ;
        assert_eq!((*a.ctx).ops.post_send.unwrap()(a.qp, &mut wr, &mut bad), 0);
        assert_eq!(poll(a.cq).opcode, IBV_WC_RDMA_READ);
        assert_eq!(&a.buf[300..308], b"written!");

        // A bad work request: EINVAL and bad_wr points at it.
        wr.opcode = 99;
        bad = null_mut();
        assert_eq!(
            (*a.ctx).ops.post_send.unwrap()(a.qp, &mut wr, &mut bad),
            libc::EINVAL
        );
        assert_eq!(bad, &mut wr as *mut _);

        // Objects in use cannot go; in order they can.
        assert_eq!(ibv_dealloc_pd(a.pd), libc::EBUSY);
        for e in [&mut a, &mut b] {
            assert_eq!(ibv_destroy_qp(e.qp), 0);
            assert_eq!(ibv_destroy_cq(e.cq), 0);
            assert_eq!(ibv_dereg_mr(e.mr), 0);
            assert_eq!(ibv_dealloc_pd(e.pd), 0);
            assert_eq!(ibv_close_device(e.ctx), 0);
        }
        // Unsupported calls fail cleanly.
        assert!(ibv_import_device().is_null());
        assert_eq!(ibv_cmd_get_context(), libc::ENOSYS);
    }
}
