//! Memory windows (manual 2.3.5; man pages ibv_alloc_mw(3), ibv_bind_mw(3),
//! ibv_post_send(3) IBV_WR_BIND_MW / IBV_WR_LOCAL_INV; IBTA 10.6.7): binding, access
//! through a window, invalidation, and the errors of each.

use std::time::Duration;

use verbs_api::{
    AccessFlags as A, MwBind, MwBindInfo, MwType, QpState, QpType, RecvWr, SendFlags, SendWr,
    WcFlags, WcOpcode, WcStatus as S, WrOperation,
};

use super::errno::{EBUSY, EINVAL};
use crate::env::{all_access, Pair};
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("mw::type1_bind_then_remote_write", "ibv_bind_mw(3); IBTA 10.6.7.2: a bound type 1 window grants its access over its range through its new R_Key", type1_write).wc(S::Success));
    v.push(Case::new("mw::type1_access_outside_window", "IBTA 10.6.7: an access outside the window (though inside the MR) is a remote access error", type1_outside).wc(S::RemAccessErr));
    v.push(Case::new("mw::type1_rights_are_the_windows", "IBTA 10.6.7: the window's access rights apply, not the MR's (a read-only window refuses a WRITE)", type1_rights).wc(S::RemAccessErr));
    v.push(Case::new("mw::bind_on_mr_without_mw_bind_fails", "ibv_bind_mw(3); IBTA 10.6.7, manual 6.2.7: binding to an MR registered without IBV_ACCESS_MW_BIND completes with MW_BIND_ERR", bind_no_mw_bind).wc(S::MwBindErr));
    v.push(
        Case::new(
            "mw::bind_beyond_the_mr_fails",
            "IBTA 10.6.7: a window must lie inside its MR, else MW_BIND_ERR",
            bind_beyond,
        )
        .wc(S::MwBindErr),
    );
    v.push(Case::new(
        "mw::dereg_mr_with_bound_window_is_ebusy",
        "man page ibv_dereg_mr(3): EBUSY while memory windows are bound to the region",
        dereg_busy,
    ));
    v.push(Case::new("mw::type2_bind_local_inv_then_access_fails", "ibv_post_send(3) IBV_WR_BIND_MW / IBV_WR_LOCAL_INV; IBTA 10.6.7: after invalidation the R_Key grants nothing and not a byte is written", type2_local_inv).wc(S::RemAccessErr));
    v.push(Case::new("mw::type2_bind_takes_the_key_byte_of_the_new_rkey", "IBTA 10.6.7.2 (the consumer owns the key byte of a type 2 window's R_Key, the index stays the window's); ibv_post_send(3) IBV_WR_BIND_MW: a bind WR whose new R_Key carries another index (google/rdma-unit-test binds with 1024) binds the window named by bind_mw.mw, and READ and WRITE through index and key byte work; a second bind of the bound window completes with MW_BIND_ERR", type2_key_byte).wc(S::Success).wc(S::MwBindErr));
    v.push(Case::new("mw::bind_of_a_missing_window_completes_with_mw_bind_err", "IBTA 10.6.7.2, manual 6.2.7: a bind whose window does not exist is posted and completes with MW_BIND_ERR (kernel rxe looks the window up when the WQE runs); the QP goes to ERR", bind_missing).wc(S::MwBindErr));
    v.push(Case::new("mw::send_with_invalidate_of_a_type1_rkey_is_class_j", "IBTA 10.6.7.2.4 (type 1 windows cannot be invalidated), 9.9.6.3 (class J: no NAK; the receive WQE completes in error, the QP goes to ERR): the receive completes with MW_BIND_ERR, the sender gets no answer and runs out of retries (RETRY_EXC_ERR)", send_with_inv_type1).wc(S::MwBindErr).wc(S::RetryExcErr));
    v.push(Case::new("mw::send_with_invalidate_invalidates", "IBTA 9.4, 10.6.7 SEND with Invalidate, manual 3.6.10 IBV_WC_WITH_INV: the responder invalidates the R_Key, reports it, and later accesses fail", send_with_inv).wc(S::RemAccessErr));
    v.push(Case::new("errors::rc_write_imm_bad_rkey_fails_the_receive", "IBTA 9.7.4.1, manual 6.2.9, 6.2.11: an RDMA WRITE with immediate that fails its R_Key check fails the receive WQE it would have consumed (LOC_ACCESS_ERR) and the requester gets REM_ACCESS_ERR", write_imm_bad_rkey).wc(S::LocAccessErr).wc(S::RemAccessErr));
}

/// A pair, and on b a region that allows windows.
fn setup(env: &Env) -> (Pair, verbs_api::MrInfo, verbs_api::MemBuf) {
    let p = env.pair(QpType::Rc);
    let (buf, mr) = env.mr(p.pd, 8192, all_access() | A::MW_BIND);
    (p, mr, buf)
}

fn bind_info(mr: &verbs_api::MrInfo, off: u64, len: u64, access: A) -> MwBindInfo {
    MwBindInfo {
        mr_lkey: mr.lkey,
        addr: mr.addr + off,
        length: len,
        mw_access_flags: access,
    }
}

/// Binds a type 1 window over `info` through b's QP; returns (new rkey, bind WC status).
fn bind1(env: &Env, p: &Pair, info: MwBindInfo) -> (u32, S) {
    let mw = env.dev.alloc_mw(p.pd, MwType::Type1).expect("alloc_mw");
    let rkey = env
        .dev
        .bind_mw(
            p.b.qpn,
            mw.id,
            &MwBind {
                wr_id: 50,
                send_flags: SendFlags::SIGNALED,
                bind_info: info,
            },
        )
        .expect("bind_mw");
    let wc = env.poll_one(p.b.cq);
    assert_eq!(wc.wr_id, 50, "{wc:?}");
    if wc.status == S::Success {
        assert_eq!(wc.opcode, WcOpcode::BindMw, "{wc:?}");
    }
    (rkey, wc.status)
}

fn write(env: &Env, p: &Pair, addr: u64, rkey: u32, len: u32) -> S {
    p.a.buf.write(0, &vec![0xAB; len as usize]).unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, len)], addr, rkey).signaled(),
    );
    env.poll_one(p.a.cq).status
}

fn type1_write(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let (rkey, st) = bind1(env, &p, bind_info(&mr, 1024, 1024, A::REMOTE_WRITE));
    assert_eq!(st, S::Success);
    assert_eq!(write(env, &p, mr.addr + 1024, rkey, 64), S::Success);
    let mut got = [0u8; 64];
    buf.read(1024, &mut got).unwrap();
    assert_eq!(got, [0xAB; 64]);
    Outcome::Pass
}

fn type1_outside(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let (rkey, _) = bind1(env, &p, bind_info(&mr, 1024, 1024, A::REMOTE_WRITE));
    assert_eq!(
        write(env, &p, mr.addr + 2048 - 32, rkey, 64),
        S::RemAccessErr
    );
    assert!(buf.to_vec().iter().all(|&b| b == 0), "bytes were written");
    Outcome::Pass
}

fn type1_rights(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let (rkey, _) = bind1(env, &p, bind_info(&mr, 0, 4096, A::REMOTE_READ));
    assert_eq!(write(env, &p, mr.addr, rkey, 64), S::RemAccessErr);
    assert!(buf.to_vec().iter().all(|&b| b == 0), "bytes were written");
    Outcome::Pass
}

fn bind_no_mw_bind(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let (_buf, mr) = env.mr(p.pd, 4096, all_access());
    let (_, st) = bind1(env, &p, bind_info(&mr, 0, 1024, A::REMOTE_WRITE));
    assert_eq!(st, S::MwBindErr);
    Outcome::Pass
}

fn bind_beyond(env: &Env) -> Outcome {
    let (p, mr, _buf) = setup(env);
    let (_, st) = bind1(env, &p, bind_info(&mr, 4096, 8192, A::REMOTE_WRITE));
    assert_eq!(st, S::MwBindErr);
    Outcome::Pass
}

fn dereg_busy(env: &Env) -> Outcome {
    let (p, mr, _buf) = setup(env);
    let (_, st) = bind1(env, &p, bind_info(&mr, 0, 1024, A::REMOTE_WRITE));
    assert_eq!(st, S::Success);
    let e = env
        .dev
        .dereg_mr(mr.lkey)
        .expect_err("deregistered with a window bound");
    assert!(matches!(e.errno(), EBUSY | EINVAL), "{e:?}");
    if env.emulator {
        assert_eq!(e.errno(), EBUSY, "{e:?}");
    }
    // Still registered: a WRITE through the MR's own rkey works.
    assert_eq!(write(env, &p, mr.addr, mr.rkey, 8), S::Success);
    Outcome::Pass
}

/// Binds a type 2 window over `info` with a BIND_MW WR on b's QP; returns its rkey.
fn bind2(env: &Env, p: &Pair, info: MwBindInfo) -> u32 {
    let mw = env
        .dev
        .alloc_mw(p.pd, MwType::Type2)
        .expect("alloc_mw type 2");
    let new_rkey = (mw.rkey & !0xFF) | (mw.rkey.wrapping_add(1) & 0xFF);
    let wr = SendWr::new(
        60,
        vec![],
        WrOperation::BindMw {
            mw_rkey: mw.rkey,
            new_rkey,
            bind_info: info,
        },
    )
    .signaled();
    env.post_send(p.b.qpn, wr);
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (60, S::Success, WcOpcode::BindMw),
        "{wc:?}"
    );
    new_rkey
}

fn type2_local_inv(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let rkey = bind2(env, &p, bind_info(&mr, 0, 4096, A::REMOTE_WRITE));
    assert_eq!(write(env, &p, mr.addr, rkey, 8), S::Success);
    buf.fill(0);
    env.post_send(
        p.b.qpn,
        SendWr::new(
            61,
            vec![],
            WrOperation::LocalInv {
                invalidate_rkey: rkey,
            },
        )
        .signaled(),
    );
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.status, wc.opcode),
        (S::Success, WcOpcode::LocalInv),
        "{wc:?}"
    );
    assert_eq!(write(env, &p, mr.addr, rkey, 8), S::RemAccessErr);
    assert!(
        buf.to_vec().iter().all(|&b| b == 0),
        "bytes were written after invalidation"
    );
    Outcome::Pass
}

fn send_with_inv(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let rkey = bind2(env, &p, bind_info(&mr, 0, 4096, A::REMOTE_WRITE));
    env.post_recv(p.b.qpn, RecvWr::new(7, vec![p.b.sge(0, 64)]));
    let wr = SendWr::new(
        2,
        vec![p.a.sge(0, 8)],
        WrOperation::SendWithInv {
            invalidate_rkey: rkey,
        },
    )
    .signaled();
    env.post_send(p.a.qpn, wr);
    assert_eq!(env.poll_one(p.a.cq).status, S::Success);
    let wc = env.poll_one(p.b.cq);
    assert_eq!(wc.status, S::Success, "{wc:?}");
    assert!(wc.wc_flags.contains(WcFlags::WITH_INV), "{wc:?}");
    assert_eq!(wc.invalidated_rkey, rkey);
    buf.fill(0);
    assert_eq!(write(env, &p, mr.addr, rkey, 8), S::RemAccessErr);
    assert!(
        buf.to_vec().iter().all(|&b| b == 0),
        "bytes were written after invalidation"
    );
    Outcome::Pass
}

fn write_imm_bad_rkey(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.post_recv(p.b.qpn, RecvWr::new(7, vec![]));
    let wr = SendWr::rdma_write_with_imm(
        1,
        vec![p.a.sge(0, 16)],
        p.b.addr(0),
        p.b.mr.rkey ^ 0x5500,
        9,
    );
    env.post_send(p.a.qpn, wr.signaled());
    assert_eq!(env.poll_one(p.a.cq).status, S::RemAccessErr);
    let wc = env.poll_one(p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (7, S::LocAccessErr), "{wc:?}");
    Outcome::Pass
}

fn type2_key_byte(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let mw = env
        .dev
        .alloc_mw(p.pd, MwType::Type2)
        .expect("alloc_mw type 2");
    // rdma-unit-test's R_Key: index 4, key byte 0x00 with the window's index elsewhere.
    let asked = 1024 | ((mw.rkey.wrapping_add(1)) & 0xFF);
    let rkey = (mw.rkey & !0xFF) | (asked & 0xFF);
    let info = bind_info(&mr, 0, 4096, A::REMOTE_READ | A::REMOTE_WRITE);
    let wr = SendWr::new(
        60,
        vec![],
        WrOperation::BindMw {
            mw_rkey: mw.rkey,
            new_rkey: asked,
            bind_info: info,
        },
    );
    env.post_send(p.b.qpn, wr.signaled());
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (60, S::Success, WcOpcode::BindMw),
        "{wc:?}"
    );
    assert_eq!(write(env, &p, mr.addr + 128, rkey, 64), S::Success);
    let mut got = [0u8; 64];
    buf.read(128, &mut got).unwrap();
    assert_eq!(got, [0xAB; 64]);
    buf.write(1024, &[0x3C; 32]).unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_read(2, vec![p.a.sge(512, 32)], mr.addr + 1024, rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::Success);
    let mut got = [0u8; 32];
    p.a.buf.read(512, &mut got).unwrap();
    assert_eq!(got, [0x3C; 32]);
    // Bound already (IBTA 10.6.7.2: invalidate first): the second bind's completion
    // arrives, with MW_BIND_ERR.
    let again = SendWr::new(
        61,
        vec![],
        WrOperation::BindMw {
            mw_rkey: mw.rkey,
            new_rkey: asked.wrapping_add(1),
            bind_info: info,
        },
    );
    env.post_send(p.b.qpn, again.signaled());
    let wc = env.poll_one(p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (61, S::MwBindErr), "{wc:?}");
    Outcome::Pass
}

fn bind_missing(env: &Env) -> Outcome {
    if !env.emulator {
        return Outcome::Skip(
            "libibverbs names a window by its ibv_mw, which is freed with it: a bind of a \
             window that is gone cannot be posted"
                .into(),
        );
    }
    let (p, mr, _buf) = setup(env);
    let mw = env.dev.alloc_mw(p.pd, MwType::Type1).expect("alloc_mw");
    env.dev.dealloc_mw(mw.id).expect("dealloc_mw");
    let info = bind_info(&mr, 0, 1024, A::REMOTE_WRITE);
    let bind = MwBind {
        wr_id: 50,
        send_flags: SendFlags::SIGNALED,
        bind_info: info,
    };
    env.dev
        .bind_mw(p.b.qpn, mw.id, &bind)
        .expect("the bind is posted");
    let wc = env.poll_one(p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (50, S::MwBindErr), "{wc:?}");
    let (attr, _) = env.dev.query_qp(p.b.qpn).expect("query_qp");
    assert_eq!(attr.qp_state, QpState::Err);
    Outcome::Pass
}

fn send_with_inv_type1(env: &Env) -> Outcome {
    let (p, mr, _buf) = setup(env);
    let (rkey, st) = bind1(env, &p, bind_info(&mr, 0, 4096, A::REMOTE_WRITE));
    assert_eq!(st, S::Success);
    env.post_recv(p.b.qpn, RecvWr::new(7, vec![p.b.sge(0, 64)]));
    let wr = SendWr::new(
        2,
        vec![p.a.sge(0, 8)],
        WrOperation::SendWithInv {
            invalidate_rkey: rkey,
        },
    );
    env.post_send(p.a.qpn, wr.signaled());
    let wc = env.poll_one(p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (7, S::MwBindErr), "{wc:?}");
    let (attr, _) = env.dev.query_qp(p.b.qpn).expect("query_qp");
    assert_eq!(attr.qp_state, QpState::Err);
    // No NAK, no ACK: the SEND is retried until the retry count runs out (timeout 10:
    // 4 ms a try, 8 tries).
    let wc = env
        .try_poll(p.a.cq, Duration::from_secs(10))
        .expect("the sender completes once its retries run out");
    assert_eq!((wc.wr_id, wc.status), (2, S::RetryExcErr), "{wc:?}");
    Outcome::Pass
}
