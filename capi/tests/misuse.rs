//! Programs that misuse the C ABI the way a third-party verbs suite does (google's
//! rdma-unit-test): objects whose `handle` or `context` was overwritten, work-request
//! lists that never end, and the answers rdma-core gives where the emulator once
//! differed. Each case runs in a child process of this test binary (so a crash, an
//! abort or unbounded memory fails the case instead of the run), with its own device
//! address, and checks the child exited cleanly having passed every check.

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::process::Command;
use std::ptr::null_mut;

use rdma_emu_ibverbs::sys::*;
use rdma_emu_ibverbs::*;

const CHILD: &str = "CAPI_MISUSE_CHILD";

/// Runs the test `name` of this binary in a child process on the device `ip` and
/// checks it passed (returning what it printed); in the child, runs `body` instead.
fn in_child(name: &str, ip: &str, body: impl FnOnce()) -> String {
    if std::env::var(CHILD).as_deref() == Ok(name) {
        // Bounded memory: a list that never ends must not take the machine with it.
        let limit = libc::rlimit {
            rlim_cur: 4 << 30,
            rlim_max: 4 << 30,
        };
        // SAFETY: setrlimit with a valid struct.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
        body();
        println!("child {name}: all checks passed");
        return String::new();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, name)
        .env("RDMA_EMU_DEVICES", format!("emu0={ip}"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains(&format!("child {name}: all checks passed")),
        "child {name} failed ({:?}):\n{text}",
        out.status
    );
    text
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The first device, opened.
unsafe fn open() -> *mut ibv_context {
    unsafe {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        assert!(n >= 1);
        let ctx = ibv_open_device(*list);
        ibv_free_device_list(list);
        assert!(!ctx.is_null());
        ctx
    }
}

fn caps(n: u32) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: n,
        max_recv_wr: n,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

unsafe fn rc_qp(pd: *mut ibv_pd, cq: *mut ibv_cq, srq: *mut ibv_srq) -> *mut ibv_qp {
    let mut init = ibv_qp_init_attr {
        send_cq: cq,
        recv_cq: cq,
        srq,
        qp_type: IBV_QPT_RC,
        cap: caps(8),
        ..Default::default()
    };
    unsafe { ibv_create_qp(pd, &mut init) }
}

/// SRQ attributes for `max_wr` one-SGE receives.
fn srq_attr(max_wr: u32) -> ibv_srq_init_attr {
    ibv_srq_init_attr {
        attr: ibv_srq_attr {
            max_wr,
            max_sge: 1,
            srq_limit: 0,
        },
        ..Default::default()
    }
}

/// Overwrites `*handle` for the scope of `f`, as rdma-unit-test's `HandleGarble` does.
unsafe fn garbled<R>(handle: *mut u32, f: impl FnOnce() -> R) -> R {
    unsafe {
        let keep = *handle;
        *handle = keep ^ 0xDEAD_BEEF;
        let r = f();
        *handle = keep;
        r
    }
}

#[test]
fn objects_with_foreign_handles_are_refused() {
    in_child(
        "objects_with_foreign_handles_are_refused",
        "127.0.0.61",
        || unsafe {
            let ctx = open();
            let ops = (*ctx).ops;
            let pd = ibv_alloc_pd(ctx);
            let cq = ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
            let mut buf = vec![0u8; 4096];
            let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND;
            let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), 4096, access as c_int);
            let mut sattr = srq_attr(8);
            let srq = ibv_create_srq(pd, &mut sattr);
            let qp = rc_qp(pd, cq, null_mut());
            let mw = ops.alloc_mw.unwrap()(pd, IBV_MW_TYPE_1);
            let mut gid = ibv_gid::default();
            assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
            let mut ah_attr = ibv_ah_attr {
                is_global: 1,
                port_num: 1,
                ..Default::default()
            };
            ah_attr.grh.dgid = gid;
            let ah = ibv_create_ah(pd, &mut ah_attr);
            for (what, p) in [
                ("pd", pd as usize),
                ("cq", cq as usize),
                ("mr", mr as usize),
                ("srq", srq as usize),
                ("qp", qp as usize),
                ("mw", mw as usize),
                ("ah", ah as usize),
            ] {
                assert_ne!(p, 0, "creating the {what}");
            }

            // A destroy of an object whose handle is not the kernel's: ENOENT, and the
            // object stays (the program's own clean-up frees it later).
            assert_eq!(
                garbled(&mut (*pd).handle, || ibv_dealloc_pd(pd)),
                libc::ENOENT
            );
            assert_eq!(
                garbled(&mut (*cq).handle, || ibv_destroy_cq(cq)),
                libc::ENOENT
            );
            assert_eq!(
                garbled(&mut (*srq).handle, || ibv_destroy_srq(srq)),
                libc::ENOENT
            );
            assert_eq!(
                garbled(&mut (*qp).handle, || ibv_destroy_qp(qp)),
                libc::ENOENT
            );
            assert_eq!(
                garbled(&mut (*mw).handle, || ops.dealloc_mw.unwrap()(mw)),
                libc::ENOENT
            );
            assert_eq!(
                garbled(&mut (*mr).handle, || ibv_dereg_mr(mr)),
                libc::ENOENT
            );
            assert_eq!(errno(), libc::ENOENT);
            assert_eq!(
                garbled(&mut (*ah).handle, || ibv_destroy_ah(ah)),
                libc::ENOENT
            );
            assert_eq!(errno(), libc::ENOENT);

            // Named as another verb's argument: EINVAL (NULL for the create verbs).
            let mut init = ibv_qp_init_attr {
                send_cq: cq,
                recv_cq: cq,
                qp_type: IBV_QPT_RC,
                cap: caps(8),
                ..Default::default()
            };
            assert!(garbled(&mut (*cq).handle, || ibv_create_qp(pd, &mut init)).is_null());
            init.srq = srq;
            assert!(garbled(&mut (*srq).handle, || ibv_create_qp(pd, &mut init)).is_null());
            init.srq = null_mut();
            assert!(garbled(&mut (*pd).handle, || ibv_create_qp(pd, &mut init)).is_null());
            let p = buf.as_mut_ptr().cast();
            assert!(garbled(&mut (*pd).handle, || ibv_reg_mr(pd, p, 64, 1)).is_null());
            assert_eq!(errno(), libc::EINVAL);
            assert!(garbled(&mut (*pd).handle, || ops.alloc_mw.unwrap()(
                pd,
                IBV_MW_TYPE_1
            ))
            .is_null());
            assert!(garbled(&mut (*pd).handle, || ibv_create_ah(pd, &mut ah_attr)).is_null());
            assert!(garbled(&mut (*pd).handle, || ibv_create_srq(pd, &mut sattr)).is_null());
            let mut attr = ibv_qp_attr {
                qp_state: IBV_QPS_INIT,
                port_num: 1,
                ..Default::default()
            };
            let m = (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) as c_int;
            assert_eq!(
                garbled(&mut (*qp).handle, || ibv_modify_qp(qp, &mut attr, m)),
                libc::EINVAL
            );
            let mut init_out = ibv_qp_init_attr::default();
            assert_eq!(
                garbled(&mut (*qp).handle, || ibv_query_qp(
                    qp,
                    &mut attr,
                    0,
                    &mut init_out
                )),
                libc::EINVAL
            );
            assert_eq!(
                garbled(&mut (*cq).handle, || ops.req_notify_cq.unwrap()(cq, 0)),
                libc::EINVAL
            );
            assert_eq!(
                garbled(&mut (*cq).handle, || ibv_resize_cq(cq, 32)),
                libc::EINVAL
            );

            // An object moved to another context (of the same device): ENOENT.
            let other = open();
            (*pd).context = other;
            assert_eq!(ibv_dealloc_pd(pd), libc::ENOENT);
            (*pd).context = ctx;
            // A pointer that is not an open context.
            let mut fake = ibv_context::default();
            assert_eq!(ibv_close_device(&mut fake), libc::EINVAL);
            assert!(ibv_alloc_pd(&mut fake).is_null());

            // With the handles back, everything goes in order, once.
            assert_eq!(ibv_destroy_ah(ah), 0);
            assert_eq!(ops.dealloc_mw.unwrap()(mw), 0);
            assert_eq!(ibv_destroy_qp(qp), 0);
            assert_eq!(ibv_destroy_qp(qp.cast::<u8>().add(0).cast()), libc::ENOENT);
            assert_eq!(ibv_destroy_srq(srq), 0);
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(other), 0);
            assert_eq!(ibv_close_device(ctx), 0);
            assert_eq!(ibv_close_device(ctx), libc::EINVAL);
        },
    );
}

#[test]
fn endless_work_request_lists_stop_at_the_queue() {
    in_child(
        "endless_work_request_lists_stop_at_the_queue",
        "127.0.0.62",
        || unsafe {
            let ctx = open();
            let ops = (*ctx).ops;
            let pd = ibv_alloc_pd(ctx);
            let cq = ibv_create_cq(ctx, 64, null_mut(), null_mut(), 0);
            let mut buf = vec![0u8; 64];
            let mr = ibv_reg_mr(
                pd,
                buf.as_mut_ptr().cast(),
                64,
                IBV_ACCESS_LOCAL_WRITE as c_int,
            );
            let mut sattr = srq_attr(8);
            let srq = ibv_create_srq(pd, &mut sattr);
            let qp = rc_qp(pd, cq, null_mut());
            assert!(!srq.is_null() && !qp.is_null() && !mr.is_null());
            let mut sge = ibv_sge {
                addr: buf.as_mut_ptr() as u64,
                length: 8,
                lkey: (*mr).lkey,
            };

            // A receive WR whose `next` is itself: the queue fills, ENOMEM, bad_wr is
            // the WR that did not fit.
            let mut rwr = ibv_recv_wr {
                wr_id: 1,
                sg_list: &mut sge,
                num_sge: 1,
                ..Default::default()
            };
            rwr.next = &mut rwr;
            let mut bad = null_mut();
            assert_eq!(
                ops.post_srq_recv.unwrap()(srq, &mut rwr, &mut bad),
                libc::ENOMEM
            );
            assert_eq!(bad, &mut rwr as *mut _);
            // Receives may be posted from INIT on (IBTA 10.8.2).
            let mut attr = ibv_qp_attr {
                qp_state: IBV_QPS_INIT,
                port_num: 1,
                ..Default::default()
            };
            let m = (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) as c_int;
            assert_eq!(ibv_modify_qp(qp, &mut attr, m), 0);
            bad = null_mut();
            assert_eq!(ops.post_recv.unwrap()(qp, &mut rwr, &mut bad), libc::ENOMEM);
            assert_eq!(bad, &mut rwr as *mut _);

            // The same list of sends is read no further than the send queue holds;
            // the QP is in INIT, where sends are refused (IBTA 10.8.2), so the post
            // then fails at its first WR.
            let mut swr = ibv_send_wr {
                wr_id: 2,
                sg_list: &mut sge,
                num_sge: 1,
                opcode: IBV_WR_SEND,
                ..Default::default()
            };
            swr.next = &mut swr;
            let mut sbad = null_mut();
            let r = ops.post_send.unwrap()(qp, &mut swr, &mut sbad);
            assert_ne!(r, 0);
            assert_eq!(sbad, &mut swr as *mut _);

            assert_eq!(ibv_destroy_qp(qp), 0);
            assert_eq!(ibv_destroy_srq(srq), 0);
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        },
    );
}

#[test]
fn queries_answer_as_rdma_core_does() {
    in_child(
        "queries_answer_as_rdma_core_does",
        "127.0.0.63",
        || unsafe {
            let ctx = open();

            // The exported ibv_query_port fills libibverbs' compat struct: everything up
            // to `flags`, and not one byte past it.
            let mut raw = [0xABu8; std::mem::size_of::<ibv_port_attr>()];
            let pa = raw.as_mut_ptr().cast::<ibv_port_attr>();
            assert_eq!(ibv_query_port(ctx, 1, pa), 0);
            assert_eq!((*pa).state, IBV_PORT_ACTIVE);
            assert_eq!(u32::from((*pa).link_layer), IBV_LINK_LAYER_ETHERNET);
            assert_eq!((*pa).active_mtu, IBV_MTU_4096);
            // An Ethernet port of unknown speed reports 1X SDR, as kernel rxe on the
            // loopback interface does (zero is not a valid width or speed).
            assert_eq!(((*pa).active_width, (*pa).active_speed), (1, 1));
            let end = std::mem::offset_of!(ibv_port_attr, flags) + 1;
            assert!(raw[end..].iter().all(|&b| b == 0xAB));

            // A completion vector outside num_comp_vectors: EINVAL.
            let n = (*ctx).num_comp_vectors;
            assert!(ibv_create_cq(ctx, 4, null_mut(), null_mut(), n).is_null());
            assert_eq!(errno(), libc::EINVAL);
            assert!(ibv_create_cq(ctx, 4, null_mut(), null_mut(), -1).is_null());
            let vctx = &*(ctx.byte_sub(std::mem::offset_of!(verbs_context, context))
                as *const verbs_context);
            let mut cqx = ibv_cq_init_attr_ex {
                cqe: 4,
                comp_vector: n as u32,
                ..Default::default()
            };
            assert!(vctx.create_cq_ex.unwrap()(ctx, &mut cqx).is_null());
            assert_eq!(errno(), libc::EINVAL);
            let cq = ibv_create_cq(ctx, 4, null_mut(), null_mut(), n - 1);
            assert!(!cq.is_null());

            // GIDs: indices 0 and 1 are the device's address (1 is where kernel rxe
            // lists IPv4), each naming the interface that carries it; an empty slot is
            // ENODATA for the extended query and reads as zero through ibv_query_gid; a
            // table that does not fit is EINVAL.
            let mut e = ibv_gid_entry::default();
            let sz = std::mem::size_of::<ibv_gid_entry>();
            assert_eq!(_ibv_query_gid_ex(ctx, 1, 0, &mut e, 0, sz), 0);
            assert_eq!(e.gid_type, IBV_GID_TYPE_ROCE_V2);
            assert_eq!(e.ndev_ifindex, libc::if_nametoindex(c"lo".as_ptr()));
            let g0 = e.gid;
            assert_eq!(_ibv_query_gid_ex(ctx, 1, 1, &mut e, 0, sz), 0);
            assert_eq!(e.gid.raw, g0.raw);
            assert_eq!(_ibv_query_gid_ex(ctx, 1, 2, &mut e, 0, sz), libc::ENODATA);
            let mut g = ibv_gid::default();
            assert_eq!(ibv_query_gid(ctx, 1, 2, &mut g), 0);
            assert_eq!(g.raw, [0; 16]);
            let mut table = vec![ibv_gid_entry::default(); 16];
            assert_eq!(
                _ibv_query_gid_table(ctx, table.as_mut_ptr(), 0, 0, sz),
                -(libc::EINVAL as isize)
            );
            assert_eq!(_ibv_query_gid_table(ctx, table.as_mut_ptr(), 16, 0, sz), 2);

            // The command fd is a real descriptor (programs duplicate it).
            assert!((*ctx).cmd_fd >= 0);
            assert!(libc::fcntl((*ctx).cmd_fd, libc::F_GETFD) >= 0);

            // A zero-length region registers (kernel rxe accepts them).
            let pd = ibv_alloc_pd(ctx);
            let mut byte = 0u8;
            let empty = ibv_reg_mr(
                pd,
                (&raw mut byte).cast(),
                0,
                IBV_ACCESS_LOCAL_WRITE as c_int,
            );
            assert!(!empty.is_null(), "errno {}", errno());
            assert_eq!(
                ((*empty).length, (*empty).addr),
                (0, (&raw mut byte).cast())
            );
            assert_eq!(ibv_dereg_mr(empty), 0);

            // A provider without the data-in-order query answers 0.
            let qp = rc_qp(pd, cq, null_mut());
            assert_eq!(ibv_query_qp_data_in_order(qp, IBV_WR_RDMA_WRITE, 0), 0);

            // create_qp_ex with CREATE_FLAGS in the mask and no flag set is a plain QP.
            let mut ex = ibv_qp_init_attr_ex {
                send_cq: cq,
                recv_cq: cq,
                qp_type: IBV_QPT_RC,
                cap: caps(4),
                comp_mask: IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
                pd,
                ..Default::default()
            };
            let qp2 = vctx.create_qp_ex.unwrap()(ctx, &mut ex);
            assert!(!qp2.is_null());
            ex.create_flags = IBV_QP_CREATE_SCATTER_FCS;
            assert!(vctx.create_qp_ex.unwrap()(ctx, &mut ex).is_null());

            assert_eq!(ibv_destroy_qp(qp2), 0);
            assert_eq!(ibv_destroy_qp(qp), 0);
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        },
    );
}

/// Brings `qp` to RTS connected to itself (a loopback RC QP).
unsafe fn loopback_rts(ctx: *mut ibv_context, qp: *mut ibv_qp) {
    unsafe {
        let mut gid = ibv_gid::default();
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        let mut at = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            port_num: 1,
            qp_access_flags: IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
            ..Default::default()
        };
        let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        assert_eq!(ibv_modify_qp(qp, &mut at, m as c_int), 0);
        let mut at = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: IBV_MTU_1024,
            dest_qp_num: (*qp).qp_num,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            ..Default::default()
        };
        at.ah_attr.is_global = 1;
        at.ah_attr.grh.dgid = gid;
        at.ah_attr.grh.hop_limit = 64;
        at.ah_attr.port_num = 1;
        let m = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        assert_eq!(ibv_modify_qp(qp, &mut at, m as c_int), 0);
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
        assert_eq!(ibv_modify_qp(qp, &mut at, m as c_int), 0);
    }
}

unsafe fn wait(cq: *mut ibv_cq) -> ibv_wc {
    unsafe {
        let poll = (*(*cq).context).ops.poll_cq.unwrap();
        let mut wc = ibv_wc::default();
        for _ in 0..5_000_000 {
            if poll(cq, 1, &mut wc) == 1 {
                return wc;
            }
        }
        panic!("no completion");
    }
}

/// An RDMA READ of 8 bytes at `base` through `rkey` into `base + 2048` (both in `mr`),
/// on the loopback QP `qp`: its completion status.
unsafe fn read_8(qp: *mut ibv_qp, cq: *mut ibv_cq, mr: *mut ibv_mr, base: u64, rkey: u32) -> u32 {
    unsafe {
        let mut sge = ibv_sge {
            addr: base + 2048,
            length: 8,
            lkey: (*mr).lkey,
        };
        let mut wr = ibv_send_wr {
            wr_id: 9,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: IBV_WR_RDMA_READ,
            send_flags: IBV_SEND_SIGNALED,
            ..Default::default()
        };
        wr.wr.rdma.remote_addr = base;
        wr.wr.rdma.rkey = rkey;
        let mut bad = null_mut();
        let post_send = (*(*qp).context).ops.post_send.unwrap();
        assert_eq!(post_send(qp, &mut wr, &mut bad), 0);
        wait(cq).status
    }
}

#[test]
fn type_2_windows_bind_by_work_request() {
    in_child(
        "type_2_windows_bind_by_work_request",
        "127.0.0.64",
        || unsafe {
            let ctx = open();
            let ops = (*ctx).ops;
            let pd = ibv_alloc_pd(ctx);
            let cq = ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
            let mut buf = vec![0u8; 4096];
            buf[..8].copy_from_slice(b"windowed");
            let access = IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_WRITE
                | IBV_ACCESS_REMOTE_READ
                | IBV_ACCESS_REMOTE_ATOMIC
                | IBV_ACCESS_MW_BIND;
            let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), 4096, access as c_int);
            let qp = rc_qp(pd, cq, null_mut());
            loopback_rts(ctx, qp);
            let window_access =
                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
            let read_through = |rkey: u32| read_8(qp, cq, mr, buf.as_ptr() as u64, rkey);

            // ibv_post_send(IBV_WR_BIND_MW) with a key byte of the consumer's choice
            // (rdma-unit-test passes 1024: key byte 0).
            let mw = ops.alloc_mw.unwrap()(pd, IBV_MW_TYPE_2);
            let index = (*mw).rkey >> 8;
            let mut wr = ibv_send_wr {
                wr_id: 1,
                opcode: IBV_WR_BIND_MW,
                send_flags: IBV_SEND_SIGNALED,
                ..Default::default()
            };
            wr.__bindgen_anon_2.bind_mw.mw = mw;
            wr.__bindgen_anon_2.bind_mw.rkey = 1024;
            wr.__bindgen_anon_2.bind_mw.bind_info = ibv_mw_bind_info {
                mr,
                addr: buf.as_ptr() as u64,
                length: 4096,
                mw_access_flags: window_access,
            };
            let mut bad = null_mut();
            assert_eq!(ops.post_send.unwrap()(qp, &mut wr, &mut bad), 0);
            let wc = wait(cq);
            assert_eq!(
                (wc.status, wc.opcode, wc.wr_id),
                (IBV_WC_SUCCESS, IBV_WC_BIND_MW, 1)
            );
            assert_eq!(
                (*mw).rkey,
                index << 8,
                "the window's index, the consumer's key byte"
            );
            assert_eq!(read_through((*mw).rkey), IBV_WC_SUCCESS);
            assert_eq!(&buf[2048..2056], b"windowed");

            // A bound type 2 window cannot be bound again (IBTA 10.6.7.2.2: it must be
            // invalidated first): MW_BIND_ERR, and the completion does arrive.
            wr.wr_id = 2;
            wr.__bindgen_anon_2.bind_mw.rkey = 1025;
            assert_eq!(ops.post_send.unwrap()(qp, &mut wr, &mut bad), 0);
            let wc = wait(cq);
            assert_eq!((wc.status, wc.wr_id), (IBV_WC_MW_BIND_ERR, 2));
            ibv_destroy_qp(qp);

            // ibv_wr_bind_mw on a fresh QP, with another window.
            let qp = rc_qp(pd, cq, null_mut());
            loopback_rts(ctx, qp);
            let mw2 = ops.alloc_mw.unwrap()(pd, IBV_MW_TYPE_2);
            let qpx = ibv_qp_to_qp_ex(qp);
            let info = ibv_mw_bind_info {
                mr,
                addr: buf.as_ptr() as u64,
                length: 4096,
                mw_access_flags: window_access,
            };
            (*qpx).wr_id = 3;
            (*qpx).wr_flags = IBV_SEND_SIGNALED;
            (*qpx).wr_start.unwrap()(qpx);
            (*qpx).wr_bind_mw.unwrap()(qpx, mw2, 0x77, &info);
            assert_eq!((*qpx).wr_complete.unwrap()(qpx), 0);
            let wc = wait(cq);
            assert_eq!((wc.status, wc.wr_id), (IBV_WC_SUCCESS, 3));
            assert_eq!((*mw2).rkey & 0xFF, 0x77);
            assert_eq!(
                read_8(qp, cq, mr, buf.as_ptr() as u64, (*mw2).rkey),
                IBV_WC_SUCCESS
            );

            assert_eq!(ibv_destroy_qp(qp), 0);
            assert_eq!(ops.dealloc_mw.unwrap()(mw2), 0);
            assert_eq!(ops.dealloc_mw.unwrap()(mw), 0);
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        },
    );
}

#[test]
fn an_address_in_use_names_its_holder() {
    // The parent holds the address the child's device wants.
    let held = std::env::var(CHILD)
        .is_err()
        .then(|| std::net::UdpSocket::bind("127.0.0.65:4791").unwrap());
    let text = in_child(
        "an_address_in_use_names_its_holder",
        "127.0.0.65",
        || unsafe {
            let mut n = 0;
            let list = ibv_get_device_list(&mut n);
            assert!(ibv_open_device(*list).is_null());
            assert_eq!(errno(), libc::EADDRINUSE);
            ibv_free_device_list(list);
        },
    );
    if held.is_none() {
        return;
    }
    let line = format!(
        "127.0.0.65:4791 is already taken by process {} (",
        std::process::id()
    );
    assert!(text.contains(&line), "{text}");
    drop(held);
}

#[test]
fn concurrent_opens_and_closes_of_one_device() {
    in_child(
        "concurrent_opens_and_closes_of_one_device",
        "127.0.0.66",
        || {
            // Threads that each open the device, use it and close it again, as
            // rstest's parallel cases do: the last close takes the NIC down while
            // another thread opens it anew, which must wait for the old socket.
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    std::thread::spawn(|| unsafe {
                        for _ in 0..100 {
                            let mut n = 0;
                            let list = ibv_get_device_list(&mut n);
                            let ctx = ibv_open_device(*list);
                            ibv_free_device_list(list);
                            assert!(!ctx.is_null(), "open failed: errno {}", errno());
                            let pd = ibv_alloc_pd(ctx);
                            assert!(!pd.is_null());
                            assert_eq!(ibv_dealloc_pd(pd), 0);
                            assert_eq!(ibv_close_device(ctx), 0);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        },
    );
}

#[test]
fn events_of_destroyed_qps_are_not_delivered() {
    in_child(
        "events_of_destroyed_qps_are_not_delivered",
        "127.0.0.67",
        || unsafe {
            let ctx = open();
            let fd = (*ctx).async_fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            assert_eq!(libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK), 0);
            let pd = ibv_alloc_pd(ctx);
            let cq = ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
            let mut sattr = srq_attr(8);
            let srq = ibv_create_srq(pd, &mut sattr);
            let to_err = |qp: *mut ibv_qp| {
                let mut attr = ibv_qp_attr {
                    qp_state: IBV_QPS_INIT,
                    port_num: 1,
                    ..Default::default()
                };
                let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
                assert_eq!(ibv_modify_qp(qp, &mut attr, m as c_int), 0);
                attr.qp_state = IBV_QPS_ERR;
                assert_eq!(ibv_modify_qp(qp, &mut attr, IBV_QP_STATE as c_int), 0);
            };
            // A QP on an SRQ that enters ERR raises LAST_WQE_REACHED (IBTA 11.6.3.2);
            // destroyed before the program reads it, the event is gone with it.
            let qp = rc_qp(pd, cq, srq);
            assert!(!qp.is_null());
            to_err(qp);
            assert_eq!(ibv_destroy_qp(qp), 0);
            let mut ev = std::mem::zeroed::<ibv_async_event>();
            assert_eq!(ibv_get_async_event(ctx, &mut ev), -1);
            assert_eq!(errno(), libc::EAGAIN);
            // A live QP's event comes with its pointer.
            let qp = rc_qp(pd, cq, srq);
            to_err(qp);
            assert_eq!(ibv_get_async_event(ctx, &mut ev), 0);
            assert_eq!(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
            assert_eq!(ev.element.qp, qp);
            ibv_ack_async_event(&mut ev);
            assert_eq!(ibv_destroy_qp(qp), 0);
            assert_eq!(ibv_destroy_srq(srq), 0);
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        },
    );
}

/// IBTA 1.5 through the extended QP API: `ibv_wr_atomic_write` (rdma-core 44) lands
/// its 8 bytes, copied at the call; `ibv_wr_flush`, which rdma-core 45 appended to
/// `struct ibv_qp_ex` right after `wr_atomic_write`, is read from there as a program
/// built with those headers reads it; `ibv_create_qp_ex` takes both send operations,
/// and `ibv_query_device_ex` reports both capabilities.
#[test]
fn atomic_write_and_flush_through_the_extended_qp_api() {
    const FLUSH_GLOBAL_ACCESS: u32 = 1 << 8; // IBV_ACCESS_FLUSH_GLOBAL
    const WITH_FLUSH: u64 = 1 << 11; // IBV_QP_EX_WITH_FLUSH
    type WrFlush = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8);
    in_child(
        "atomic_write_and_flush_through_the_extended_qp_api",
        "127.0.0.68",
        || unsafe {
            let ctx = open();
            let vctx = &*(ctx.byte_sub(std::mem::offset_of!(verbs_context, context))
                as *const verbs_context);
            let mut dev = ibv_device_attr_ex::default();
            let size = std::mem::size_of::<ibv_device_attr_ex>();
            assert_eq!(
                vctx.query_device_ex.unwrap()(ctx, null_mut(), &mut dev, size),
                0
            );
            let caps = (1u64 << 38) | (1 << 39) | (1 << 40);
            assert_eq!(dev.device_cap_flags_ex & caps, caps);
            assert_eq!(
                dev.device_cap_flags_ex & u64::from(u32::MAX),
                u64::from(dev.orig_attr.device_cap_flags)
            );

            let pd = ibv_alloc_pd(ctx);
            let cq = ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
            let mut buf = vec![0u8; 4096];
            let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | FLUSH_GLOBAL_ACCESS;
            let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), 4096, access as c_int);
            assert!(!mr.is_null(), "errno {}", errno());
            let mut ex = ibv_qp_init_attr_ex {
                send_cq: cq,
                recv_cq: cq,
                qp_type: IBV_QPT_RC,
                cap: self::caps(8),
                comp_mask: IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                pd,
                send_ops_flags: u64::from(IBV_QP_EX_WITH_ATOMIC_WRITE) | WITH_FLUSH,
                ..Default::default()
            };
            let qp = vctx.create_qp_ex.unwrap()(ctx, &mut ex);
            assert!(!qp.is_null(), "errno {}", errno());
            loopback_rts(ctx, qp);
            let mut at = ibv_qp_attr {
                qp_access_flags: IBV_ACCESS_REMOTE_WRITE | FLUSH_GLOBAL_ACCESS,
                ..Default::default()
            };
            assert_eq!(ibv_modify_qp(qp, &mut at, IBV_QP_ACCESS_FLAGS as c_int), 0);
            let qpx = ibv_qp_to_qp_ex(qp);
            let base = buf.as_ptr() as u64;
            let rkey = (*mr).rkey;

            // ATOMIC WRITE: the 8 bytes are the caller's only during the call.
            let mut value = *b"8 bytes!";
            (*qpx).wr_id = 1;
            (*qpx).wr_flags = IBV_SEND_SIGNALED;
            (*qpx).wr_start.unwrap()(qpx);
            (*qpx).wr_atomic_write.unwrap()(qpx, rkey, base + 64, value.as_ptr().cast());
            value = [0; 8];
            assert_eq!((*qpx).wr_complete.unwrap()(qpx), 0);
            let wc = wait(cq);
            assert_eq!(
                (wc.status, wc.wr_id, wc.opcode),
                (IBV_WC_SUCCESS, 1, IBV_WC_ATOMIC_WRITE)
            );
            assert_eq!(&buf[64..72], b"8 bytes!");
            assert_eq!(value, [0; 8]);

            // FLUSH of the range, through the member past the v44 struct.
            let wr_flush = *(qpx.cast::<u8>())
                .add(std::mem::size_of::<ibv_qp_ex>())
                .cast::<Option<WrFlush>>();
            let wr_flush = wr_flush.expect("wr_flush is set");
            (*qpx).wr_id = 2;
            (*qpx).wr_start.unwrap()(qpx);
            wr_flush(qpx, rkey, base + 64, 8, 1, 0); // IBV_FLUSH_GLOBAL, IBV_FLUSH_RANGE
            assert_eq!((*qpx).wr_complete.unwrap()(qpx), 0);
            let wc = wait(cq);
            assert_eq!((wc.status, wc.wr_id, wc.opcode), (IBV_WC_SUCCESS, 2, 8));

            // A placement type the QP's peer region was not registered for
            // (IBV_FLUSH_PERSISTENT): a remote access error, and the QP goes to ERR.
            (*qpx).wr_id = 3;
            (*qpx).wr_start.unwrap()(qpx);
            wr_flush(qpx, rkey, base + 64, 8, 2, 0);
            assert_eq!((*qpx).wr_complete.unwrap()(qpx), 0);
            let wc = wait(cq);
            assert_ne!(wc.status, IBV_WC_SUCCESS);

            // Malformed calls fail at ibv_wr_complete: a null ATOMIC WRITE value, an
            // unknown selectivity level.
            (*qpx).wr_start.unwrap()(qpx);
            (*qpx).wr_atomic_write.unwrap()(qpx, rkey, base, std::ptr::null());
            assert_eq!((*qpx).wr_complete.unwrap()(qpx), libc::EINVAL);
            (*qpx).wr_start.unwrap()(qpx);
            wr_flush(qpx, rkey, base, 8, 1, 7);
            assert_eq!((*qpx).wr_complete.unwrap()(qpx), libc::EINVAL);

            assert_eq!(ibv_destroy_qp(qp), 0);
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        },
    );
}
