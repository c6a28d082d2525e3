//! Lifetimes under load (manual 3.3.9 ibv_destroy_cq, 3.4.2 ibv_dereg_mr, 3.4.7
//! ibv_destroy_srq; man page ibv_rereg_mr(3); IBTA 10.6.3.1): a region deregistered
//! while work requests still name it, CQs and SRQs destroyed while (or once no longer)
//! in use, re-registrations that fail and leave the region as it was, and access flags
//! that no region may have.
//!
//! google/rdma-unit-test checks the same conditions (`mr_test.cc` OutstandingRecv,
//! OutstandingRead, OutstandingWrite, ReregMrInvalidPermission, ReregMrInvalidBuffer,
//! ReregMrChangePd).

use std::time::Duration;

use verbs_api::{
    AccessFlags as A, MemBuf, MrInfo, PdId, QpInitAttr, QpType, RecvWr, ReregMrFlags as F, SendWr,
    SrqAttr, WcStatus as S,
};

use super::{
    assert_errno, assert_untouched,
    errno::{EBUSY, EINVAL, EOPNOTSUPP},
    UNTOUCHED,
};
use crate::env::{all_access, default_cap, Pair};
use crate::{Case, Env, Outcome};

/// Work requests posted before the region under them is deregistered.
const BATCH: u64 = 32;

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("lifetimes::dereg_mr_under_an_outstanding_recv", "manual 3.4.2 ibv_dereg_mr (the region goes at once; a WR that still names it is the application's to mind), IBTA 10.6.3.1 (the L_Key is checked when the WQE is used), 9.9, manual 6.2.5, 6.2.12: deregistering the region of a posted receive succeeds and completes nothing; a SEND that then lands fails the receive with LOC_PROT_ERR and the SEND with REM_OP_ERR, and the memory is unchanged (google/rdma-unit-test OutstandingRecv)", dereg_recv).wc(S::LocProtErr).wc(S::RemOpErr));
    for (i, op) in ["rdma_read", "rdma_write"].iter().enumerate() {
        v.push(Case::param(format!("lifetimes::dereg_mr_under_outstanding_{op}s"), "manual 3.4.2 ibv_dereg_mr, IBTA 10.6.3.1, 10.8 (a WR completed in error moves the QP to ERR; the WRs behind it are flushed), manual 6.2.5, 6.2.6: deregistering the local region of 32 posted 4 KiB WRs succeeds; each WR completes once, in order: some successfully, then (if the deregistration overtook one) one with LOC_PROT_ERR and the rest with WR_FLUSH_ERR (google/rdma-unit-test OutstandingRead, OutstandingWrite)", dereg_under_load, i as u64));
    }
    v.push(Case::new("lifetimes::destroy_cq_used_as_a_recv_cq_is_ebusy", "manual 3.3.9 ibv_destroy_cq (EBUSY while a QP is associated with the CQ), 3.4.3 (send_cq and recv_cq are separate associations): the receive CQ and the send CQ of one QP are each busy until the QP is destroyed", destroy_recv_cq));
    v.push(Case::new("lifetimes::destroy_cq_holding_completions_succeeds", "manual 3.3.9 ibv_destroy_cq (it fails only while a QP uses the CQ or events are unacknowledged): a CQ whose QP is gone is destroyed with completions still queued, and is gone (poll_cq and a second destroy are EINVAL)", destroy_full_cq));
    v.push(Case::new("lifetimes::destroy_srq_of_a_qp_in_err_is_ebusy", "manual 3.4.7 ibv_destroy_srq (fails while a QP is associated with it), 3.5.2 (a QP in ERR still exists): the SRQ of a QP moved to ERR is busy; once the QP is destroyed the SRQ goes, receives still posted in it", destroy_srq_err_qp));
    v.push(Case::param("mr::rereg_remote_write_without_local_write_is_einval", "man page ibv_rereg_mr(3) (the access flags follow ibv_reg_mr's rules), manual 3.4.1 (REMOTE_WRITE needs LOCAL_WRITE): the rereg fails (EINVAL) and the region keeps its rights: a WRITE through its R_Key still lands (google/rdma-unit-test ReregMrInvalidPermission)", rereg_fails, 0));
    v.push(Case::param("mr::rereg_to_a_range_outside_the_buffer_is_einval", "man page ibv_rereg_mr(3) IBV_REREG_MR_CHANGE_TRANSLATION, manual 3.4.1 (the region must lie in memory the process owns): a new range one byte past the buffer fails (EINVAL) and the region keeps its memory", rereg_fails, 1));
    v.push(Case::param("mr::rereg_to_an_empty_range_is_einval", "man page ibv_rereg_mr(3) (IBV_REREG_MR_ERR_INPUT for CHANGE_TRANSLATION without an address and length): a new range of 0 bytes fails (EINVAL) and the region keeps its memory (google/rdma-unit-test ReregMrInvalidBuffer)", rereg_fails, 2));
    v.push(Case::param("mr::rereg_change_pd_to_a_freed_pd_is_einval", "man page ibv_rereg_mr(3) IBV_REREG_MR_CHANGE_PD (the new PD must be a valid one of the context), manual 3.3.6: CHANGE_PD to a PD already freed fails (EINVAL) and the region stays in its PD", rereg_fails, 3));
    v.push(Case::param("mr::rereg_with_no_flags_is_einval", "man page ibv_rereg_mr(3) (flags names what changes; libibverbs refuses none as IBV_REREG_MR_ERR_INPUT): a rereg that changes nothing fails (EINVAL) and the region is as it was", rereg_fails, 4));
    v.push(Case::param("mr::rereg_of_a_deregistered_region_is_einval", "man page ibv_rereg_mr(3), manual 3.4.2: a deregistered region cannot be re-registered (EINVAL)", rereg_fails, 5));
    v.push(Case::new("mr::rereg_change_pd_moves_the_region", "man page ibv_rereg_mr(3) IBV_REREG_MR_CHANGE_PD, IBTA 10.6.3.1 (an R_Key is valid only for QPs of its region's PD), manual 6.2.11: after CHANGE_PD to a new PD, a QP of the old PD is refused (REM_ACCESS_ERR) and the old PD can be freed, the new one cannot (EBUSY) (google/rdma-unit-test ReregMrChangePd)", rereg_change_pd).wc(S::RemAccessErr));
    v.push(Case::new("mr::reg_with_an_unknown_access_bit_is_einval", "manual 3.4.1 ibv_reg_mr (access is a combination of the IBV_ACCESS_* flags); libibverbs/kernel ib_check_mr_access: a bit that names no flag and lies outside IBV_ACCESS_OPTIONAL_RANGE is refused (EINVAL) and nothing is registered", reg_unknown_bit));
    v.push(Case::new("mr::reg_with_an_optional_access_bit_is_accepted", "manual 3.4.1 ibv_reg_mr; libibverbs verbs.h IBV_ACCESS_OPTIONAL_RANGE (bits 20-29: a device that does not know an optional flag ignores it instead of failing): a region registered with bit 25 set is made and carries a WRITE", reg_optional_bit).wc(S::Success));
}

fn dereg_recv(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let buf = MemBuf::new(4096);
    buf.fill(UNTOUCHED);
    let mr = env
        .dev
        .reg_mr(p.pd, &buf, 0, 4096, A::LOCAL_WRITE)
        .expect("reg_mr");
    let sge = verbs_api::Sge {
        addr: mr.addr,
        length: 4096,
        lkey: mr.lkey,
    };
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![sge]));
    env.dev
        .dereg_mr(mr.lkey)
        .expect("dereg_mr under a posted receive");
    env.assert_no_completion(p.b.cq, Duration::from_millis(30));
    env.send_fails_the_receive(&p);
    assert_untouched(&buf, "the deregistered memory");
    Outcome::Pass
}

/// `op` 0: READs into the region, 1: WRITEs out of it.
fn dereg_under_load(env: &Env, op: u64) -> Outcome {
    let p = env.pair(QpType::Rc);
    let buf = MemBuf::new(4096 * BATCH as usize);
    let mr = env
        .dev
        .reg_mr(p.pd, &buf, 0, buf.len(), A::LOCAL_WRITE)
        .expect("reg_mr");
    let wrs: Vec<SendWr> = (0..BATCH)
        .map(|i| {
            let sge = verbs_api::Sge {
                addr: mr.addr + i * 4096,
                length: 4096,
                lkey: mr.lkey,
            };
            let remote = p.b.addr(i * 4096);
            let wr = if op == 0 {
                SendWr::rdma_read(i, vec![sge], remote, p.b.mr.rkey)
            } else {
                SendWr::rdma_write(i, vec![sge], remote, p.b.mr.rkey)
            };
            wr.signaled()
        })
        .collect();
    env.dev
        .post_send(p.a.qpn, &wrs)
        .unwrap_or_else(|e| panic!("post_send: {e:?}"));
    env.dev
        .dereg_mr(mr.lkey)
        .expect("dereg_mr under outstanding WRs");
    let got: Vec<_> = (0..BATCH)
        .map(|_| {
            let wc = env.poll_one(p.a.cq);
            (wc.wr_id, wc.status)
        })
        .collect();
    env.assert_no_completion(p.a.cq, Duration::from_millis(30));
    let ok = got.iter().take_while(|w| w.1 == S::Success).count();
    let mut want: Vec<_> = (0..BATCH).map(|i| (i, S::Success)).collect();
    for (i, w) in want.iter_mut().enumerate().skip(ok) {
        w.1 = if i == ok {
            S::LocProtErr
        } else {
            S::WrFlushErr
        };
    }
    assert_eq!(got, want, "(wr_id, status) of each WR, in completion order");
    Outcome::Pass
}

fn qp_on(env: &Env, pd: PdId, send_cq: verbs_api::CqId, recv_cq: verbs_api::CqId) -> u32 {
    env.dev
        .create_qp(&QpInitAttr::new(pd, send_cq, QpType::Rc, default_cap()).recv_cq(recv_cq))
        .expect("create_qp")
}

fn destroy_recv_cq(env: &Env) -> Outcome {
    let pd = env.pd();
    let (scq, rcq) = (env.cq(16), env.cq(16));
    let qpn = qp_on(env, pd, scq, rcq);
    assert_errno(env.dev.destroy_cq(rcq), EBUSY);
    assert_errno(env.dev.destroy_cq(scq), EBUSY);
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    env.dev.destroy_cq(rcq).expect("destroy the receive CQ");
    env.dev.destroy_cq(scq).expect("destroy the send CQ");
    Outcome::Pass
}

fn destroy_full_cq(env: &Env) -> Outcome {
    let (ch, cq, qpn, _buf, mr) = env.self_loop();
    env.dev.req_notify_cq(cq, false).expect("req_notify_cq");
    for i in 0..4 {
        let sge = verbs_api::Sge {
            addr: mr.addr,
            length: 8,
            lkey: mr.lkey,
        };
        let wr = SendWr::rdma_write(i, vec![sge], mr.addr + 64, mr.rkey);
        env.post_send(qpn, wr.signaled());
    }
    // The event says a completion is queued; none has been polled.
    let got = env.dev.get_cq_event(ch, Some(crate::env::WAIT));
    assert_eq!(got.expect("a CQ event"), cq);
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    env.dev
        .destroy_cq(cq)
        .expect("destroy a CQ that holds completions");
    assert_errno(env.dev.poll_cq(cq, 4, &mut Vec::new()), EINVAL);
    assert_errno(env.dev.destroy_cq(cq), EINVAL);
    env.dev
        .destroy_comp_channel(ch)
        .expect("destroy_comp_channel once its CQ is gone");
    Outcome::Pass
}

fn destroy_srq_err_qp(env: &Env) -> Outcome {
    let pd = env.pd();
    let attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = env.dev.create_srq(pd, &attr).expect("create_srq");
    let cq = env.cq(16);
    let qpn = env.srq_qp(pd, cq, srq);
    env.connect_self(qpn);
    let (_buf, mr) = env.mr(pd, 4096, A::LOCAL_WRITE);
    for i in 0..4 {
        let sge = verbs_api::Sge {
            addr: mr.addr + i * 256,
            length: 256,
            lkey: mr.lkey,
        };
        env.dev
            .post_srq_recv(srq, &[RecvWr::new(i, vec![sge])])
            .unwrap_or_else(|e| panic!("post_srq_recv: {e:?}"));
    }
    env.to_err(qpn);
    assert_errno(env.dev.destroy_srq(srq), EBUSY);
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    env.dev
        .destroy_srq(srq)
        .expect("destroy_srq with receives posted and no QP");
    assert_errno(env.dev.destroy_srq(srq), EINVAL);
    Outcome::Pass
}

/// A WRITE of 4 bytes through `rkey` at `addr`; returns its status.
fn write4(env: &Env, p: &Pair, addr: u64, rkey: u32) -> S {
    p.a.buf.write(0, b"kept").unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(7, vec![p.a.sge(0, 4)], addr, rkey).signaled(),
    );
    env.poll_one(p.a.cq).status
}

/// The failed re-registrations; `kind` picks one. Each must fail with EINVAL (a device
/// without `ibv_rereg_mr` skips) and leave the region as it was.
fn rereg_fails(env: &Env, kind: u64) -> Outcome {
    let p = env.pair(QpType::Rc);
    let (buf, mr) = env.mr(p.pd, 8192, all_access());
    let fresh = MemBuf::new(4096);
    let freed = env.pd();
    env.dev.dealloc_pd(freed).expect("dealloc_pd");
    let (lkey, flags, pd, range, access) = match kind {
        0 => (mr.lkey, F::CHANGE_ACCESS, None, None, A::REMOTE_WRITE),
        1 => (
            mr.lkey,
            F::CHANGE_TRANSLATION,
            None,
            Some((&fresh, 1, 4096)),
            A::empty(),
        ),
        2 => (
            mr.lkey,
            F::CHANGE_TRANSLATION,
            None,
            Some((&fresh, 0, 0)),
            A::empty(),
        ),
        3 => (mr.lkey, F::CHANGE_PD, Some(freed), None, A::empty()),
        4 => (mr.lkey, F::empty(), None, None, A::empty()),
        _ => {
            let (_b, gone) = env.mr(p.pd, 4096, all_access());
            env.dev.dereg_mr(gone.lkey).expect("dereg_mr");
            (gone.lkey, F::CHANGE_ACCESS, None, None, all_access())
        }
    };
    match env.dev.rereg_mr(lkey, flags, pd, range, access) {
        Err(e) if e.errno() == EOPNOTSUPP && !env.emulator => {
            return Outcome::Skip("the device does not implement ibv_rereg_mr (EOPNOTSUPP)".into())
        }
        Err(e) => assert_eq!(e.errno(), EINVAL, "{e:?}"),
        Ok(m) => panic!("the rereg succeeded: {m:?}"),
    }
    // The region is as it was: its memory, rights and PD still take a WRITE.
    assert_eq!(write4(env, &p, mr.addr + 100, mr.rkey), S::Success);
    let mut got = [0u8; 4];
    buf.read(100, &mut got).unwrap();
    assert_eq!(
        &got, b"kept",
        "the WRITE did not land in the region's memory"
    );
    assert_errno(env.dev.dealloc_pd(p.pd), EBUSY);
    Outcome::Pass
}

fn rereg_change_pd(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let (old, new) = (env.pd(), env.pd());
    let buf = MemBuf::new(4096);
    let mr: MrInfo = env
        .dev
        .reg_mr(old, &buf, 0, 4096, all_access())
        .expect("reg_mr");
    let m = match env
        .dev
        .rereg_mr(mr.lkey, F::CHANGE_PD, Some(new), None, A::empty())
    {
        Ok(m) => m,
        Err(e) if e.errno() == EOPNOTSUPP && !env.emulator => {
            return Outcome::Skip("the device does not implement ibv_rereg_mr (EOPNOTSUPP)".into())
        }
        Err(e) => panic!("rereg_mr CHANGE_PD: {e:?}"),
    };
    assert_eq!((m.addr, m.length), (mr.addr, mr.length));
    env.dev
        .dealloc_pd(old)
        .expect("the old PD has no region left");
    assert_errno(env.dev.dealloc_pd(new), EBUSY);
    // b's QP is in neither PD: the region answers to QPs of `new` only.
    assert_eq!(write4(env, &p, m.addr, m.rkey), S::RemAccessErr);
    assert!(buf.to_vec().iter().all(|&b| b == 0), "bytes were written");
    Outcome::Pass
}

fn reg_unknown_bit(env: &Env) -> Outcome {
    let pd = env.pd();
    let buf = MemBuf::new(4096);
    let access = A::LOCAL_WRITE | A::from_bits_retain(1 << 15);
    assert_errno(env.dev.reg_mr(pd, &buf, 0, 4096, access), EINVAL);
    env.dev
        .dealloc_pd(pd)
        .expect("nothing was registered in the PD");
    Outcome::Pass
}

fn reg_optional_bit(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let buf = MemBuf::new(4096);
    let access = all_access() | A::from_bits_retain(1 << 25);
    let mr = env
        .dev
        .reg_mr(p.pd, &buf, 0, 4096, access)
        .expect("reg_mr with an optional flag");
    assert_eq!(write4(env, &p, mr.addr + 8, mr.rkey), S::Success);
    let mut got = [0u8; 4];
    buf.read(8, &mut got).unwrap();
    assert_eq!(&got, b"kept");
    Outcome::Pass
}
