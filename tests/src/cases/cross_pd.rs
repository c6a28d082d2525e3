//! Objects of one protection domain used with objects of another (manual 2.3.8: a PD's
//! components "can interact with only each other"; 3.3.5: PDs limit which memory
//! regions can be accessed by which QPs, and associate UD QPs with address handles;
//! IBTA 10.6.3.1, 10.6.7, 10.2.9): keys, address handles and memory windows of another
//! PD are refused when the WR runs, an SRQ may belong to another PD, and a PD cannot be
//! freed while anything of it lives.
//!
//! google/rdma-unit-test's `cases/pd_test.cc` checks the same conditions
//! (`PdRcLoopbackMrTest`, `PdUdLoopbackTest.SendAhOnOtherPd`, `PdBindTest`,
//! `PdSrqTest.CreateSrq`).

use std::time::Duration;

use verbs_api::{
    AccessFlags as A, MemBuf, MrInfo, MwBindInfo, MwType, QpState, QpType, RecvWr, SendWr, Sge,
    SrqAttr, UdDest, WcStatus as S, WrOperation,
};

use super::{
    assert_errno, assert_untouched,
    errno::{EBUSY, EINVAL},
    UNTOUCHED,
};
use crate::env::{all_access, default_cap, Pair};
use crate::{Case, Env, Outcome};

/// The remote operations of the R_Key cases.
const REMOTE_OPS: [&str; 3] = ["rdma_write", "rdma_read", "fetch_add"];

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("cross_pd::send_sge_in_another_pds_mr_is_loc_prot_err", "manual 2.3.8, 3.3.5 (a QP reaches only the regions of its own PD), IBTA 10.6.3.1 (an L_Key is valid only for QPs of its region's PD), manual 6.2.5 IBV_WC_LOC_PROT_ERR: a SEND whose gather SGE names a region of another PD completes with LOC_PROT_ERR, nothing is sent (google/rdma-unit-test SendMrOtherPdLocal)", send_sge_other_pd).wc(S::LocProtErr));
    v.push(Case::new("cross_pd::read_sge_in_another_pds_mr_is_loc_prot_err", "manual 2.3.8, 3.3.5, IBTA 10.6.3.1, manual 6.2.5: an RDMA READ whose scatter SGE names a region of another PD completes with LOC_PROT_ERR and not a byte lands in that region (google/rdma-unit-test BasicReadMrOtherPdLocal)", read_sge_other_pd).wc(S::LocProtErr));
    v.push(Case::new("cross_pd::recv_sge_in_another_pds_mr_is_loc_prot_err", "manual 2.3.8, 3.3.5, IBTA 10.6.3.1, 9.9 (the responder's local error is a remote operational error for the requester), manual 6.2.5, 6.2.12: a receive WR whose SGE names a region of another PD completes with LOC_PROT_ERR, the SEND with REM_OP_ERR, and the region is unchanged (google/rdma-unit-test SendMrOtherPdRemote)", recv_sge_other_pd).wc(S::LocProtErr).wc(S::RemOpErr));
    for (i, op) in REMOTE_OPS.iter().enumerate() {
        v.push(Case::param(format!("cross_pd::{op}_with_rkey_of_another_pd_is_rem_access_err"), "manual 2.3.8, 3.3.5, IBTA 9.7.4.1, 10.6.3.1 (an R_Key is valid only for QPs of its region's PD), manual 6.2.11 IBV_WC_REM_ACCESS_ERR: an access through the R_Key of a region of another PD than the target QP's is NAKed; not one byte of the target changes, nor of the requester's buffer (google/rdma-unit-test Basic*MrOtherPdRemote)", rkey_other_pd, i as u64).wc(S::RemAccessErr));
    }
    v.push(Case::new("cross_pd::ud_send_through_ah_of_another_pd_is_loc_qp_op_err", "manual 2.3.8, 3.3.5 (PDs associate UD QPs with address handles), IBTA C10-10 (as google/rdma-unit-test's SendAhOnOtherPd cites it: the WR completes with a local QP operation error); kernel rxe's rxe_get_av refuses an AH whose PD is not the QP's and completes the WR with LOC_QP_OP_ERR: nothing reaches the destination", ah_other_pd).wc(S::LocQpOpErr));
    v.push(Case::new("cross_pd::type2_bind_through_qp_of_another_pd_is_mw_bind_err", "IBTA 10.6.7, C10-72 (a type 2 window is bound only through a QP of its own PD; kernel rxe's rxe_check_bind_mw cites it), manual 6.2.7 IBV_WC_MW_BIND_ERR (the window and the QP belong to different PDs): the bind completes with MW_BIND_ERR and the QP goes to ERR (google/rdma-unit-test PdBindTest.MwOnOtherPd)", bind_qp_other_pd).wc(S::MwBindErr));
    v.push(Case::new("cross_pd::type2_bind_to_mr_of_another_pd_is_mw_bind_err", "manual 2.3.8 (a PD's objects interact only with each other), IBTA 10.6.7, manual 6.2.7 IBV_WC_MW_BIND_ERR (the window may not be bound to that region): binding a type 2 window of the QP's PD to a region of another PD completes with MW_BIND_ERR and the QP goes to ERR (google/rdma-unit-test PdBindTest.MrOnOtherPd)", bind_mr_other_pd).wc(S::MwBindErr));
    v.push(Case::new("cross_pd::srq_of_another_pd_is_accepted_at_create_qp", "IBTA 10.2.9 (an SRQ has a PD of its own; QPs of other PDs may take their receives from it; google/rdma-unit-test PdSrqTest.CreateSrq), manual 3.4.3 ibv_create_qp: the QP is created on the SRQ and each PD stays busy with its own object (manual 3.3.6)", srq_other_pd));
    v.push(Case::new(
        "cross_pd::dealloc_pd_with_srq_is_ebusy",
        "manual 3.3.6 ibv_dealloc_pd: EBUSY while an SRQ uses the PD; it succeeds once the SRQ is destroyed",
        dealloc_with_srq,
    ));
    v.push(Case::new("cross_pd::dealloc_pd_with_mw_is_ebusy", "manual 3.3.6 ibv_dealloc_pd: EBUSY while a memory window (type 1 or type 2) uses the PD; it succeeds once both are deallocated", dealloc_with_mw));
    v.push(Case::new("cross_pd::dealloc_pd_waits_for_every_child", "manual 3.3.6 ibv_dealloc_pd: with an MR, a QP, an AH, an SRQ and an MW in the PD, each freed in turn, the PD stays busy (EBUSY) until the last is gone, a refused dealloc leaves the PD usable, and then it is freed (a second free is EINVAL)", dealloc_every_child));
}

/// A region of `len` bytes in `pd`, every byte [`UNTOUCHED`].
fn untouched_mr(env: &Env, pd: verbs_api::PdId, len: usize, access: A) -> (MemBuf, MrInfo) {
    let (buf, mr) = env.mr(pd, len, access);
    buf.fill(UNTOUCHED);
    (buf, mr)
}

fn sge(mr: &MrInfo, off: u64, len: u32) -> Sge {
    Sge {
        addr: mr.addr + off,
        length: len,
        lkey: mr.lkey,
    }
}

fn send_sge_other_pd(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let other = env.pd();
    let (_src, src_mr) = untouched_mr(env, other, 4096, all_access());
    p.b.buf.fill(UNTOUCHED);
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![p.b.sge(0, 256)]));
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![sge(&src_mr, 0, 64)]).signaled(),
    );
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::LocProtErr), "{wc:?}");
    env.assert_no_completion(p.b.cq, Duration::from_millis(50));
    assert_untouched(&p.b.buf, "the receive buffer");
    Outcome::Pass
}

fn read_sge_other_pd(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let other = env.pd();
    let (dst, dst_mr) = untouched_mr(env, other, 4096, all_access());
    p.b.buf.write(0, &[0xC3; 64]).unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_read(1, vec![sge(&dst_mr, 0, 64)], p.b.addr(0), p.b.mr.rkey).signaled(),
    );
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::LocProtErr), "{wc:?}");
    assert_untouched(&dst, "the other PD's region");
    Outcome::Pass
}

fn recv_sge_other_pd(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let other = env.pd();
    let (dst, dst_mr) = untouched_mr(env, other, 4096, all_access());
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![sge(&dst_mr, 0, 256)]));
    p.a.buf.write(0, &[0xC3; 64]).unwrap();
    env.send_fails_the_receive(&p);
    assert_untouched(&dst, "the other PD's region");
    Outcome::Pass
}

fn rkey_other_pd(env: &Env, op: u64) -> Outcome {
    let p = env.pair(QpType::Rc);
    let other = env.pd();
    // The target: a region of another PD than b's, granting every access.
    let (target, t) = untouched_mr(env, other, 4096, all_access());
    p.a.buf.fill(UNTOUCHED);
    let wr = match REMOTE_OPS[op as usize] {
        "rdma_write" => SendWr::rdma_write(1, vec![p.a.sge(0, 64)], t.addr, t.rkey),
        "rdma_read" => SendWr::rdma_read(1, vec![p.a.sge(0, 64)], t.addr, t.rkey),
        _ => SendWr::atomic_fetch_add(1, p.a.sge(0, 8), t.addr + 64, t.rkey, 1),
    };
    env.post_send(p.a.qpn, wr.signaled());
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::RemAccessErr), "{wc:?}");
    assert_untouched(&target, "the target region");
    assert_untouched(&p.a.buf, "the requester's buffer");
    Outcome::Pass
}

fn ah_other_pd(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    let other = env.pd();
    let ah = env
        .dev
        .create_ah(other, &env.params().ah_attr(env.gid()))
        .expect("create_ah in another PD");
    p.b.buf.fill(UNTOUCHED);
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![p.b.sge(0, 256)]));
    let d = UdDest {
        ah,
        remote_qpn: p.b.qpn,
        remote_qkey: env.params().qkey,
    };
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 32)]).with_ud(d).signaled(),
    );
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::LocQpOpErr), "{wc:?}");
    env.assert_no_completion(p.b.cq, Duration::from_millis(50));
    assert_untouched(&p.b.buf, "the receive buffer");
    Outcome::Pass
}

/// Posts a BIND_MW WR for type 2 window `mw` (R_Key `mw_rkey`) over `mr` on b's QP and
/// returns the bind's completion status; checks that a failed bind moved the QP to ERR.
fn bind_type2(env: &Env, p: &Pair, mw_rkey: u32, mr: &MrInfo) -> S {
    let info = MwBindInfo {
        mr_lkey: mr.lkey,
        addr: mr.addr,
        length: 4096,
        mw_access_flags: A::REMOTE_READ | A::REMOTE_WRITE,
    };
    let new_rkey = (mw_rkey & !0xFF) | (mw_rkey.wrapping_add(1) & 0xFF);
    let wr = SendWr::new(
        60,
        vec![],
        WrOperation::BindMw {
            mw_rkey,
            new_rkey,
            bind_info: info,
        },
    );
    env.post_send(p.b.qpn, wr.signaled());
    let wc = env.poll_one(p.b.cq);
    assert_eq!(wc.wr_id, 60, "{wc:?}");
    if wc.status != S::Success {
        // IBTA 10.8: a WR completed in error moves the QP to ERR (kernel rxe moves it
        // just after it writes the completion, so the state is polled).
        env.wait_state(p.b.qpn, QpState::Err);
    }
    wc.status
}

fn bind_qp_other_pd(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let other = env.pd();
    let mw = env
        .dev
        .alloc_mw(other, MwType::Type2)
        .expect("alloc_mw type 2");
    let (_buf, mr) = env.mr(p.pd, 8192, all_access() | A::MW_BIND);
    assert_eq!(bind_type2(env, &p, mw.rkey, &mr), S::MwBindErr);
    Outcome::Pass
}

fn bind_mr_other_pd(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let other = env.pd();
    let mw = env
        .dev
        .alloc_mw(p.pd, MwType::Type2)
        .expect("alloc_mw type 2");
    let (_buf, mr) = env.mr(other, 8192, all_access() | A::MW_BIND);
    assert_eq!(bind_type2(env, &p, mw.rkey, &mr), S::MwBindErr);
    Outcome::Pass
}

fn srq_attr() -> SrqAttr {
    SrqAttr {
        max_wr: 16,
        max_sge: 2,
        srq_limit: 0,
    }
}

fn srq_other_pd(env: &Env) -> Outcome {
    let (qp_pd, srq_pd) = (env.pd(), env.pd());
    let srq = env.dev.create_srq(srq_pd, &srq_attr()).expect("create_srq");
    let cq = env.cq(16);
    let qpn = env.srq_qp(qp_pd, cq, srq);
    let (_, init) = env.dev.query_qp(qpn).expect("query_qp");
    assert_eq!((init.pd, init.srq), (qp_pd, Some(srq)), "{init:?}");
    assert_errno(env.dev.dealloc_pd(qp_pd), EBUSY);
    assert_errno(env.dev.dealloc_pd(srq_pd), EBUSY);
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    env.dev
        .dealloc_pd(qp_pd)
        .expect("dealloc_pd of the QP's PD");
    assert_errno(env.dev.dealloc_pd(srq_pd), EBUSY);
    env.dev.destroy_srq(srq).expect("destroy_srq");
    env.dev
        .dealloc_pd(srq_pd)
        .expect("dealloc_pd of the SRQ's PD");
    Outcome::Pass
}

fn dealloc_with_srq(env: &Env) -> Outcome {
    let pd = env.pd();
    let srq = env.dev.create_srq(pd, &srq_attr()).expect("create_srq");
    assert_errno(env.dev.dealloc_pd(pd), EBUSY);
    env.dev.destroy_srq(srq).expect("destroy_srq");
    env.dev
        .dealloc_pd(pd)
        .expect("dealloc_pd after destroy_srq");
    Outcome::Pass
}

fn dealloc_with_mw(env: &Env) -> Outcome {
    let pd = env.pd();
    let t1 = env
        .dev
        .alloc_mw(pd, MwType::Type1)
        .expect("alloc_mw type 1");
    let t2 = env
        .dev
        .alloc_mw(pd, MwType::Type2)
        .expect("alloc_mw type 2");
    assert_errno(env.dev.dealloc_pd(pd), EBUSY);
    env.dev.dealloc_mw(t1.id).expect("dealloc_mw type 1");
    assert_errno(env.dev.dealloc_pd(pd), EBUSY);
    env.dev.dealloc_mw(t2.id).expect("dealloc_mw type 2");
    env.dev.dealloc_pd(pd).expect("dealloc_pd after dealloc_mw");
    Outcome::Pass
}

fn dealloc_every_child(env: &Env) -> Outcome {
    let pd = env.pd();
    let (_buf, mr) = env.mr(pd, 4096, A::LOCAL_WRITE);
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, QpType::Rc, default_cap());
    let ah = env
        .dev
        .create_ah(pd, &env.params().ah_attr(env.gid()))
        .expect("create_ah");
    let srq = env.dev.create_srq(pd, &srq_attr()).expect("create_srq");
    let mw = env.dev.alloc_mw(pd, MwType::Type1).expect("alloc_mw");
    assert_errno(env.dev.dealloc_pd(pd), EBUSY);
    // The refused free left the PD whole: it still takes a registration.
    let (_b2, mr2) = env.mr(pd, 4096, A::LOCAL_WRITE);
    env.dev.dereg_mr(mr2.lkey).expect("dereg_mr");
    let children = ["the MW", "the AH", "the QP", "the SRQ", "the MR"];
    for (i, what) in children.iter().enumerate() {
        if i > 0 {
            let r = env.dev.dealloc_pd(pd);
            assert!(
                matches!(&r, Err(e) if e.errno() == EBUSY),
                "dealloc_pd with {} children left: {r:?}",
                children.len() - i
            );
        }
        match i {
            0 => env.dev.dealloc_mw(mw.id),
            1 => env.dev.destroy_ah(ah),
            2 => env.dev.destroy_qp(qpn),
            3 => env.dev.destroy_srq(srq),
            _ => env.dev.dereg_mr(mr.lkey),
        }
        .unwrap_or_else(|e| panic!("freeing {what}: {e:?}"));
    }
    env.dev
        .dealloc_pd(pd)
        .expect("dealloc_pd once every child is gone");
    assert_errno(env.dev.dealloc_pd(pd), EINVAL);
    Outcome::Pass
}
