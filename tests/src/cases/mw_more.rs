//! Memory windows beyond the basics of `mw` (IBTA 10.6.7; manual 2.3.5; man pages
//! ibv_alloc_mw(3), ibv_bind_mw(3), ibv_post_send(3) IBV_WR_BIND_MW, IBV_WR_LOCAL_INV,
//! IBV_WR_SEND_WITH_INV): binds on a QP in ERR, windows outliving their QP, rebinding
//! and key reuse, zero-length and zero-based windows, the wrong bind verb, a window
//! used or invalidated through another QP, and SEND with Invalidate that cannot
//! invalidate.
//!
//! google/rdma-unit-test checks the same conditions (`mw_test.cc` MwType1Test,
//! MwType2Test; `rc_test.cc` SendWithInvalidate*).

use std::time::Duration;

use verbs_api::{
    AccessFlags as A, CqId, MemBuf, MrInfo, MwBind, MwBindInfo, MwId, MwInfo, MwType, QpParams,
    QpType, RecvWr, SendFlags, SendWr, WcFlags, WcStatus as S, WrOperation,
};

use super::errno::EINVAL;
use crate::env::{all_access, default_cap, Pair};
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::param("mw::type1_bind_on_a_qp_in_err_is_flushed", "IBTA 10.8, 11.4.1.1 (a WR posted to a QP in ERR completes with a flush error), ibv_bind_mw(3) (the bind is a send WR): a type 1 bind through a QP in ERR completes with WR_FLUSH_ERR and the window stays unbound (google/rdma-unit-test MwType1Test.BindType1WhenQpError)", bind_in_err, 1).wc(S::WrFlushErr));
    v.push(Case::param("mw::type2_bind_on_a_qp_in_err_is_flushed", "IBTA 10.8, 11.4.1.1, ibv_post_send(3) IBV_WR_BIND_MW: a type 2 bind posted to a QP in ERR completes with WR_FLUSH_ERR (google/rdma-unit-test MwType2Test.BindType1WhenQpError)", bind_in_err, 2).wc(S::WrFlushErr));
    v.push(Case::new("mw::destroy_qp_with_a_bound_type2_window", "IBTA o10-2.2.5 (as google/rdma-unit-test's DestroyQpWithType2Bound cites it: the QP may be destroyed while type 2B windows are bound to it), manual 3.4.4: the QP is destroyed; the window is then deallocated and its region deregistered", destroy_qp_type2));
    v.push(Case::new("mw::type1_rebind_retires_the_old_rkey", "ibv_bind_mw(3) (each bind returns the window's new R_Key), IBTA 10.6.7.2: rebinding a bound type 1 window elsewhere gives a new R_Key; the old one is refused (REM_ACCESS_ERR) and the new one grants the new range", type1_rebind).wc(S::RemAccessErr));
    v.push(Case::new("mw::type1_zero_length_bind_unbinds", "ibv_bind_mw(3) (a bind of length 0 unbinds the window), IBTA 10.6.7.2: after a zero-length bind the old R_Key is refused (REM_ACCESS_ERR) and the region, no longer under a window, can be deregistered (google/rdma-unit-test MwType1Test.BindZeroLengthMw)", type1_zero_length).wc(S::RemAccessErr));
    v.push(Case::new("mw::type2_zero_length_bind_is_mw_bind_err", "IBTA 10.6.7.2 (a type 2 window is unbound by invalidation, not by a zero-length bind), manual 6.2.7: a type 2 bind of length 0 completes with MW_BIND_ERR (google/rdma-unit-test MwType2Test.BindZeroLengthMw)", type2_zero_length).wc(S::MwBindErr));
    v.push(Case::new("mw::bind_verb_on_a_type2_window_is_einval", "man page ibv_bind_mw(3) (binds type 1 windows; type 2 windows are bound with IBV_WR_BIND_MW): ibv_bind_mw on a type 2 window is refused (EINVAL) and nothing completes (google/rdma-unit-test MwType2Test.Type1BindOnType2)", type1_verb_on_type2));
    v.push(Case::new("mw::type2_local_inv_from_another_qp_is_mw_bind_err", "IBTA 10.6.7.2 (a type 2 window belongs to the QP it was bound through: only that QP invalidates it), manual 6.2.7: LOCAL_INV of the window's R_Key on another QP of the PD completes with MW_BIND_ERR and the window still grants access (google/rdma-unit-test MwType2Test.CrossQpInvalidate)", cross_qp_local_inv).wc(S::MwBindErr));
    v.push(Case::new("mw::type2_window_is_reached_only_through_its_qp", "IBTA 10.6.7.2, 9.7.4.1 (a type 2 window's R_Key is valid only on the QP it is bound to): a READ through the window's R_Key arriving at another QP of the same PD is refused (REM_ACCESS_ERR) (google/rdma-unit-test MwType2Test.CrossQpRead)", cross_qp_read).wc(S::RemAccessErr));
    v.push(Case::new("mw::type2_zero_based_window_addresses_from_0", "IBTA 10.6.7.2 (a type 2 window may be zero-based: the remote address is an offset into the window), ibv_post_send(3) IBV_ACCESS_ZERO_BASED in bind_info.mw_access_flags: a READ at address 128 of a zero-based window returns the bytes 128 into it; one that runs past its end is refused (REM_ACCESS_ERR) (google/rdma-unit-test MwGeneralTest.ReadZeroBased)", zero_based).wc(S::Success).wc(S::RemAccessErr));
    v.push(Case::new("mw::type2_key_byte_reused_by_two_windows", "IBTA 10.6.7.2 (the consumer owns only the key byte; the index is each window's): two type 2 windows bound with the same key byte get distinct R_Keys and each grants its own range (google/rdma-unit-test MwType2Test.BindRKeyReuse)", key_byte_reuse).wc(S::Success));
    v.push(Case::new("mw::type2_rebind_after_invalidation", "IBTA 10.6.7.2 (a type 2 window is bound again only once invalidated), ibv_post_send(3) IBV_WR_LOCAL_INV: after LOCAL_INV the window binds again with a new key byte; the new R_Key grants access, the old is refused", rebind_after_inv).wc(S::Success).wc(S::RemAccessErr));
    v.push(Case::new("mw::dealloc_of_a_bound_type2_window_revokes_its_rkey", "man page ibv_alloc_mw(3) ibv_dealloc_mw, IBTA 10.6.7: deallocating a bound window revokes its R_Key (REM_ACCESS_ERR, nothing written) and frees its region for deregistration", dealloc_bound).wc(S::RemAccessErr));
    v.push(Case::param("mw::send_with_invalidate_of_an_unknown_rkey_is_class_j", "IBTA 9.4 SEND with Invalidate, 10.6.7.2.4, 9.9.6.3 (an invalidation the responder cannot perform is class J: no NAK; the receive WQE completes in error, the QP goes to ERR): an R_Key that names no window fails the receive with MW_BIND_ERR and the sender, unanswered, with RETRY_EXC_ERR (google/rdma-unit-test SendWithInvalidateBadRkey)", send_inv_fails, 0).wc(S::MwBindErr).wc(S::RetryExcErr));
    v.push(Case::param("mw::send_with_invalidate_of_another_qps_window_is_class_j", "IBTA 10.6.7.2 (only the QP a type 2 window is bound to may invalidate it), 9.9.6.3: a SEND with Invalidate naming a window bound to another QP fails the receive with MW_BIND_ERR, the sender gets RETRY_EXC_ERR, and the window still works (google/rdma-unit-test SendWithInvalidateWrongQp)", send_inv_fails, 1).wc(S::MwBindErr).wc(S::RetryExcErr));
    v.push(Case::new("mw::send_with_invalidate_without_a_receive_is_rnr", "IBTA 9.7.5.2.8 (no receive WQE: RNR NAK), 9.4 (the invalidation belongs to the receive it completes): with no receive posted and rnr_retry 0 a SEND with Invalidate completes with RNR_RETRY_EXC_ERR and the window stays bound (a LOCAL_INV of it then succeeds) (google/rdma-unit-test SendWithInvalidateNoBuffer)", send_inv_no_recv).wc(S::RnrRetryExcErr));
    v.push(Case::new("mw::send_with_invalidate_and_no_sges_invalidates", "IBTA 9.4 SEND with Invalidate (a zero-length SEND carries the IETH too), manual 3.6.10 IBV_WC_WITH_INV: a SEND with Invalidate with an empty SGE list into a receive with none completes with WITH_INV and the R_Key; the window is then refused (google/rdma-unit-test SendWithInvalidateEmptySgl)", send_inv_empty).wc(S::Success).wc(S::RemAccessErr));
}

/// A pair, and on b a region of 8 KiB that allows windows.
fn setup(env: &Env) -> (Pair, MrInfo, MemBuf) {
    let p = env.pair(QpType::Rc);
    let (buf, mr) = env.mr(p.pd, 8192, all_access() | A::MW_BIND);
    (p, mr, buf)
}

fn info(mr: &MrInfo, off: u64, len: u64, access: A) -> MwBindInfo {
    MwBindInfo {
        mr_lkey: mr.lkey,
        addr: mr.addr + off,
        length: len,
        mw_access_flags: access,
    }
}

fn rw() -> A {
    A::REMOTE_READ | A::REMOTE_WRITE
}

fn alloc(env: &Env, p: &Pair, t: MwType) -> MwInfo {
    env.dev.alloc_mw(p.pd, t).expect("alloc_mw")
}

/// Binds type 1 window `mw` through `qpn` (completions on `cq`); returns (R_Key, status).
fn bind1(env: &Env, qpn: u32, cq: CqId, mw: MwId, info: MwBindInfo) -> (u32, S) {
    let bind = MwBind {
        wr_id: 50,
        send_flags: SendFlags::SIGNALED,
        bind_info: info,
    };
    let rkey = env.dev.bind_mw(qpn, mw, &bind).expect("bind_mw");
    let wc = env.poll_one(cq);
    assert_eq!(wc.wr_id, 50, "{wc:?}");
    (rkey, wc.status)
}

/// Binds type 2 window `mw` through `qpn` with key byte `key`; returns (R_Key, status).
fn bind2(env: &Env, qpn: u32, cq: CqId, mw: &MwInfo, key: u8, info: MwBindInfo) -> (u32, S) {
    let new_rkey = (mw.rkey & !0xFF) | u32::from(key);
    let op = WrOperation::BindMw {
        mw_rkey: mw.rkey,
        new_rkey,
        bind_info: info,
    };
    env.post_send(qpn, SendWr::new(60, vec![], op).signaled());
    let wc = env.poll_one(cq);
    assert_eq!(wc.wr_id, 60, "{wc:?}");
    (new_rkey, wc.status)
}

/// LOCAL_INV of `rkey` on `qpn`; returns the status.
fn local_inv(env: &Env, qpn: u32, cq: CqId, rkey: u32) -> S {
    let op = WrOperation::LocalInv {
        invalidate_rkey: rkey,
    };
    env.post_send(qpn, SendWr::new(61, vec![], op).signaled());
    let wc = env.poll_one(cq);
    assert_eq!(wc.wr_id, 61, "{wc:?}");
    wc.status
}

/// An RDMA op of `len` bytes from a to `addr` through `rkey` (READ if `read`); its status.
fn access(env: &Env, p: &Pair, read: bool, addr: u64, rkey: u32, len: u32) -> S {
    p.a.buf.write(0, &vec![0xAB; len as usize]).unwrap();
    let wr = if read {
        SendWr::rdma_read(1, vec![p.a.sge(4096, len)], addr, rkey)
    } else {
        SendWr::rdma_write(1, vec![p.a.sge(0, len)], addr, rkey)
    };
    env.post_send(p.a.qpn, wr.signaled());
    let wc = env.poll_one(p.a.cq);
    assert_eq!(wc.wr_id, 1, "{wc:?}");
    wc.status
}

fn bind_in_err(env: &Env, mw_type: u64) -> Outcome {
    let (p, mr, _buf) = setup(env);
    env.to_err(p.b.qpn);
    let i = info(&mr, 0, 4096, rw());
    let status = if mw_type == 1 {
        let mw = alloc(env, &p, MwType::Type1);
        bind1(env, p.b.qpn, p.b.cq, mw.id, i).1
    } else {
        let mw = alloc(env, &p, MwType::Type2);
        bind2(env, p.b.qpn, p.b.cq, &mw, 7, i).1
    };
    assert_eq!(status, S::WrFlushErr);
    // Unbound: nothing keeps the region.
    env.dev
        .dereg_mr(mr.lkey)
        .expect("dereg_mr of a region with no window bound");
    Outcome::Pass
}

fn destroy_qp_type2(env: &Env) -> Outcome {
    let (p, mr, _buf) = setup(env);
    let mw = alloc(env, &p, MwType::Type2);
    let (_, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 9, info(&mr, 0, 4096, rw()));
    assert_eq!(st, S::Success);
    env.dev
        .destroy_qp(p.b.qpn)
        .expect("destroy_qp with a bound type 2 window");
    env.dev.dealloc_mw(mw.id).expect("dealloc_mw");
    env.dev.dereg_mr(mr.lkey).expect("dereg_mr");
    Outcome::Pass
}

fn type1_rebind(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let mw = alloc(env, &p, MwType::Type1);
    let (old, st) = bind1(env, p.b.qpn, p.b.cq, mw.id, info(&mr, 0, 1024, rw()));
    assert_eq!(st, S::Success);
    let (new, st) = bind1(env, p.b.qpn, p.b.cq, mw.id, info(&mr, 4096, 1024, rw()));
    assert_eq!(st, S::Success);
    assert_ne!(old, new, "the rebind kept the R_Key");
    assert_eq!(access(env, &p, false, mr.addr + 4096, new, 8), S::Success);
    buf.fill(0);
    assert_eq!(access(env, &p, false, mr.addr, old, 8), S::RemAccessErr);
    assert!(buf.to_vec().iter().all(|&b| b == 0), "the old R_Key wrote");
    Outcome::Pass
}

fn type1_zero_length(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let mw = alloc(env, &p, MwType::Type1);
    let (old, st) = bind1(env, p.b.qpn, p.b.cq, mw.id, info(&mr, 0, 4096, rw()));
    assert_eq!(st, S::Success);
    let (_, st) = bind1(env, p.b.qpn, p.b.cq, mw.id, info(&mr, 0, 0, rw()));
    assert_eq!(st, S::Success, "the zero-length bind");
    assert_eq!(access(env, &p, false, mr.addr, old, 8), S::RemAccessErr);
    assert!(buf.to_vec().iter().all(|&b| b == 0), "the old R_Key wrote");
    env.dev
        .dereg_mr(mr.lkey)
        .expect("dereg_mr once the window is unbound");
    Outcome::Pass
}

fn type2_zero_length(env: &Env) -> Outcome {
    let (p, mr, _buf) = setup(env);
    let mw = alloc(env, &p, MwType::Type2);
    let (_, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 3, info(&mr, 0, 0, rw()));
    assert_eq!(st, S::MwBindErr);
    Outcome::Pass
}

fn type1_verb_on_type2(env: &Env) -> Outcome {
    let (p, mr, _buf) = setup(env);
    let mw = alloc(env, &p, MwType::Type2);
    let bind = MwBind {
        wr_id: 50,
        send_flags: SendFlags::SIGNALED,
        bind_info: info(&mr, 0, 4096, rw()),
    };
    let r = env.dev.bind_mw(p.b.qpn, mw.id, &bind);
    assert!(matches!(&r, Err(e) if e.errno() == EINVAL), "{r:?}");
    env.assert_no_completion(p.b.cq, Duration::from_millis(30));
    Outcome::Pass
}

fn cross_qp_local_inv(env: &Env) -> Outcome {
    let (p, mr, _buf) = setup(env);
    let mw = alloc(env, &p, MwType::Type2);
    let (rkey, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 5, info(&mr, 0, 4096, rw()));
    assert_eq!(st, S::Success);
    // The responder's window, invalidated from the requester's QP (same PD).
    assert_eq!(local_inv(env, p.a.qpn, p.a.cq, rkey), S::MwBindErr);
    // b's own LOCAL_INV finds it still bound.
    assert_eq!(local_inv(env, p.b.qpn, p.b.cq, rkey), S::Success);
    Outcome::Pass
}

fn cross_qp_read(env: &Env) -> Outcome {
    let (p, mr, _buf) = setup(env);
    let mw = alloc(env, &p, MwType::Type2);
    let (rkey, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 5, info(&mr, 0, 4096, rw()));
    assert_eq!(st, S::Success);
    // Another connection of the PD reads through the window: q.b is the responder.
    let q = env.pair_in(p.pd, QpType::Rc, &env.params(), default_cap(), 16, false);
    let wr = SendWr::rdma_read(1, vec![q.a.sge(0, 64)], mr.addr, rkey);
    env.post_send(q.a.qpn, wr.signaled());
    let wc = env.poll_one(q.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::RemAccessErr), "{wc:?}");
    // Through b, its own QP, the window works.
    assert_eq!(access(env, &p, true, mr.addr, rkey, 64), S::Success);
    Outcome::Pass
}

fn zero_based(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let data: Vec<u8> = (0..4096).map(|i| (i * 7 + 3) as u8).collect();
    buf.write(0, &data).unwrap();
    let mw = alloc(env, &p, MwType::Type2);
    let i = info(&mr, 2048, 1024, A::REMOTE_READ | A::ZERO_BASED);
    let (rkey, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 0x42, i);
    assert_eq!(st, S::Success, "zero-based bind");
    assert_eq!(access(env, &p, true, 128, rkey, 64), S::Success);
    let mut got = [0u8; 64];
    p.a.buf.read(4096, &mut got).unwrap();
    assert_eq!(
        &got[..],
        &data[2048 + 128..2048 + 192],
        "bytes of the window"
    );
    assert_eq!(access(env, &p, true, 1024 - 32, rkey, 64), S::RemAccessErr);
    Outcome::Pass
}

fn key_byte_reuse(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let (m1, m2) = (alloc(env, &p, MwType::Type2), alloc(env, &p, MwType::Type2));
    let (k1, s1) = bind2(env, p.b.qpn, p.b.cq, &m1, 0x33, info(&mr, 0, 4096, rw()));
    let (k2, s2) = bind2(env, p.b.qpn, p.b.cq, &m2, 0x33, info(&mr, 4096, 4096, rw()));
    assert_eq!((s1, s2), (S::Success, S::Success));
    assert_ne!(k1, k2, "two windows share an R_Key");
    assert_eq!(access(env, &p, false, mr.addr + 8, k1, 8), S::Success);
    assert_eq!(
        access(env, &p, false, mr.addr + 4096 + 8, k2, 8),
        S::Success
    );
    let (mut w1, mut w2) = ([0u8; 8], [0u8; 8]);
    buf.read(8, &mut w1).unwrap();
    buf.read(4096 + 8, &mut w2).unwrap();
    assert_eq!((w1, w2), ([0xAB; 8], [0xAB; 8]));
    Outcome::Pass
}

fn rebind_after_inv(env: &Env) -> Outcome {
    let (p, mr, _buf) = setup(env);
    let mw = alloc(env, &p, MwType::Type2);
    let (old, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 0x10, info(&mr, 0, 4096, rw()));
    assert_eq!(st, S::Success);
    assert_eq!(local_inv(env, p.b.qpn, p.b.cq, old), S::Success);
    let (new, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 0x11, info(&mr, 0, 4096, rw()));
    assert_eq!(st, S::Success, "the bind after invalidation");
    assert_ne!(old, new);
    assert_eq!(access(env, &p, false, mr.addr, new, 8), S::Success);
    assert_eq!(access(env, &p, false, mr.addr, old, 8), S::RemAccessErr);
    Outcome::Pass
}

fn dealloc_bound(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let mw = alloc(env, &p, MwType::Type2);
    let (rkey, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 0x21, info(&mr, 0, 4096, rw()));
    assert_eq!(st, S::Success);
    env.dev
        .dealloc_mw(mw.id)
        .expect("dealloc_mw of a bound window");
    assert_eq!(access(env, &p, false, mr.addr, rkey, 8), S::RemAccessErr);
    assert!(buf.to_vec().iter().all(|&b| b == 0), "bytes were written");
    env.dev
        .dereg_mr(mr.lkey)
        .expect("dereg_mr once the window is gone");
    Outcome::Pass
}

/// A SEND with Invalidate of `rkey` from a, signaled, wr_id 2.
fn send_inv(env: &Env, p: &Pair, rkey: u32, sges: Vec<verbs_api::Sge>) {
    let op = WrOperation::SendWithInv {
        invalidate_rkey: rkey,
    };
    env.post_send(p.a.qpn, SendWr::new(2, sges, op).signaled());
}

/// 0: an R_Key that names no window; 1: the R_Key of a window bound through a.
fn send_inv_fails(env: &Env, which: u64) -> Outcome {
    // Few, short tries: the unanswered sender gives up within milliseconds (kernel rxe
    // retries forever with retry_cnt 7).
    let params = QpParams {
        timeout: 8,
        retry_cnt: 2,
        ..env.params()
    };
    let p = env.pair_with(QpType::Rc, &params, default_cap(), 64);
    let (_buf, mr) = env.mr(p.pd, 8192, all_access() | A::MW_BIND);
    let mw = alloc(env, &p, MwType::Type2);
    let rkey = if which == 0 {
        let (k, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 0x10, info(&mr, 0, 4096, rw()));
        assert_eq!(st, S::Success);
        (k.wrapping_add(10)).wrapping_mul(5)
    } else {
        let (k, st) = bind2(env, p.a.qpn, p.a.cq, &mw, 0x10, info(&mr, 0, 4096, rw()));
        assert_eq!(st, S::Success);
        k
    };
    env.post_recv(p.b.qpn, RecvWr::new(7, vec![p.b.sge(0, 64)]));
    send_inv(env, &p, rkey, vec![p.a.sge(0, 8)]);
    let wc = env.poll_one(p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (7, S::MwBindErr), "receiver: {wc:?}");
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, S::RetryExcErr), "sender: {wc:?}");
    if which == 1 {
        // a's window: a LOCAL_INV on a (in ERR now) is flushed, so check it on the
        // window's own terms: still bound, it keeps its region (EBUSY).
        let r = env.dev.dereg_mr(mr.lkey);
        assert!(
            r.is_err(),
            "the region was freed: the window was invalidated"
        );
    }
    Outcome::Pass
}

fn send_inv_no_recv(env: &Env) -> Outcome {
    let params = QpParams {
        rnr_retry: 0,
        ..env.params()
    };
    let p = env.pair_with(QpType::Rc, &params, default_cap(), 64);
    let (_buf, mr) = env.mr(p.pd, 8192, all_access() | A::MW_BIND);
    let mw = alloc(env, &p, MwType::Type2);
    let (rkey, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 0x10, info(&mr, 0, 4096, rw()));
    assert_eq!(st, S::Success);
    send_inv(env, &p, rkey, vec![p.a.sge(0, 8)]);
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, S::RnrRetryExcErr), "{wc:?}");
    assert_eq!(
        local_inv(env, p.b.qpn, p.b.cq, rkey),
        S::Success,
        "the window was not bound any more"
    );
    Outcome::Pass
}

fn send_inv_empty(env: &Env) -> Outcome {
    let (p, mr, buf) = setup(env);
    let mw = alloc(env, &p, MwType::Type2);
    let (rkey, st) = bind2(env, p.b.qpn, p.b.cq, &mw, 0x10, info(&mr, 0, 4096, rw()));
    assert_eq!(st, S::Success);
    env.post_recv(p.b.qpn, RecvWr::new(7, vec![]));
    send_inv(env, &p, rkey, vec![]);
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, S::Success), "sender: {wc:?}");
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, S::Success, 0),
        "{wc:?}"
    );
    assert!(wc.wc_flags.contains(WcFlags::WITH_INV), "{wc:?}");
    assert_eq!(wc.invalidated_rkey, rkey);
    assert_eq!(access(env, &p, false, mr.addr, rkey, 8), S::RemAccessErr);
    assert!(buf.to_vec().iter().all(|&b| b == 0), "bytes were written");
    Outcome::Pass
}
