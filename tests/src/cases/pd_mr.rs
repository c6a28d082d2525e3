//! Protection domains and memory regions (manual 3.3.5-3.3.6, 3.4.1-3.4.2; IBTA 10.6).

use verbs_api::{AccessFlags as A, MemBuf, QpCap, QpType, RecvWr, SendWr, WcStatus};

use super::{
    assert_errno,
    errno::{EBUSY, EINVAL, EOPNOTSUPP},
};
use crate::env::{all_access, default_cap};
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new(
        "pd::alloc_and_dealloc",
        "manual 3.3.5-3.3.6 ibv_alloc_pd/ibv_dealloc_pd",
        alloc_dealloc,
    ));
    v.push(Case::new(
        "pd::dealloc_twice_is_einval",
        "manual 3.3.6: the PD must exist",
        dealloc_twice,
    ));
    v.push(Case::new(
        "pd::dealloc_with_mr_is_ebusy",
        "manual 3.3.6: ibv_dealloc_pd fails while any other object uses the PD (EBUSY)",
        dealloc_with_mr,
    ));
    v.push(Case::new(
        "pd::dealloc_with_qp_is_ebusy",
        "manual 3.3.6: ibv_dealloc_pd fails while a QP uses the PD (EBUSY)",
        dealloc_with_qp,
    ));
    v.push(Case::new(
        "pd::many_pds_are_distinct",
        "manual 3.3.5: each ibv_alloc_pd returns a new PD",
        many_pds,
    ));
    for (name, access) in [
        ("local_read_only", A::empty()),
        ("local_write", A::LOCAL_WRITE),
        ("remote_read", A::REMOTE_READ),
        ("remote_write", A::LOCAL_WRITE | A::REMOTE_WRITE),
        ("remote_atomic", A::LOCAL_WRITE | A::REMOTE_ATOMIC),
        ("every_remote_access", all_access()),
    ] {
        v.push(Case::param(format!("mr::reg_with_{name}"), "manual 3.4.1 ibv_reg_mr: any combination of access flags that respects IBTA 10.6.3.1 is accepted", reg_with_access, u64::from(access.bits())));
    }
    v.push(Case::new(
        "mr::remote_write_without_local_write_is_einval",
        "manual 3.4.1: IBV_ACCESS_REMOTE_WRITE requires IBV_ACCESS_LOCAL_WRITE (IBTA 10.6)",
        remote_write_needs_local,
    ));
    v.push(Case::new(
        "mr::remote_atomic_without_local_write_is_einval",
        "manual 3.4.1: IBV_ACCESS_REMOTE_ATOMIC requires IBV_ACCESS_LOCAL_WRITE",
        remote_atomic_needs_local,
    ));
    v.push(Case::new(
        "mr::beyond_the_buffer_is_einval",
        "manual 3.4.1: the region must lie in memory the process owns",
        beyond_buffer,
    ));
    v.push(Case::new("mr::zero_based_is_eopnotsupp", "IBTA 10.6.3 (zero-based virtual addresses belong to fast-registered regions and type 2 windows, not to the Register Memory Region verb); kernel rxe's reg_user_mr: IBV_ACCESS_ZERO_BASED is refused with EOPNOTSUPP and nothing is registered", zero_based));
    v.push(Case::new("mr::zero_length_region_carries_empty_messages", "manual 3.4.1 ibv_reg_mr (a length of 0 is a region: kernel rxe registers it); IBTA 9.7.4.1 (C9-88): a zero-length SEND, RDMA WRITE and RDMA READ through it succeed, and a zero-length RDMA access checks no R_Key", zero_length).wc(WcStatus::Success));
    v.push(Case::new(
        "mr::dereg_twice_is_einval",
        "manual 3.4.2 ibv_dereg_mr: the MR must exist",
        dereg_twice,
    ));
    v.push(Case::new(
        "mr::keys_are_distinct",
        "IBTA 10.6.3: each registration has its own L_Key and R_Key",
        keys_distinct,
    ));
    v.push(Case::new(
        "mr::overlapping_registrations_both_work",
        "IBTA 10.6.2: a range may be registered several times, each region usable on its own",
        overlapping,
    ));
    v.push(Case::new(
        "mr::dereg_with_no_user_then_pd_goes",
        "manual 3.3.6/3.4.2: once its MRs are gone the PD can be freed",
        dereg_then_pd,
    ));
    v.push(Case::new("mr::rereg_access_keeps_keys_changes_rights", "man page ibv_rereg_mr(3) IBV_REREG_MR_CHANGE_ACCESS: the region keeps its memory and its keys (as kernel rxe and mlx5 do; the man page allows new ones), and the new rights apply (a WRITE is refused once REMOTE_WRITE is gone)", rereg_access).wc(WcStatus::RemAccessErr));
    v.push(Case::new("mr::rereg_translation_moves_the_region", "man page ibv_rereg_mr(3) IBV_REREG_MR_CHANGE_TRANSLATION: the region now covers the new memory; a WRITE through its new rkey lands there", rereg_translation));
    v.push(
        Case::new(
            "mr::deregistered_lkey_fails_locally",
            "IBTA 10.6, manual 6.2.5: an invalid L_Key in a work request completes with LOC_PROT_ERR",
            deregistered_lkey,
        )
        .wc(WcStatus::LocProtErr),
    );
    v.push(
        Case::new(
            "mr::deregistered_rkey_fails_remotely",
            "IBTA 9.7.4.1: an R_Key that no longer names a region is a remote access error",
            deregistered_rkey,
        )
        .wc(WcStatus::RemAccessErr),
    );
}

fn alloc_dealloc(env: &Env) -> Outcome {
    let pd = env.pd();
    env.dev.dealloc_pd(pd).expect("dealloc_pd");
    Outcome::Pass
}

fn dealloc_twice(env: &Env) -> Outcome {
    let pd = env.pd();
    env.dev.dealloc_pd(pd).expect("dealloc_pd");
    assert_errno(env.dev.dealloc_pd(pd), EINVAL);
    Outcome::Pass
}

fn dealloc_with_mr(env: &Env) -> Outcome {
    let pd = env.pd();
    let (_b, mr) = env.mr(pd, 4096, A::LOCAL_WRITE);
    assert_errno(env.dev.dealloc_pd(pd), EBUSY);
    env.dev.dereg_mr(mr.lkey).expect("dereg_mr");
    env.dev.dealloc_pd(pd).expect("dealloc_pd after dereg");
    Outcome::Pass
}

fn dealloc_with_qp(env: &Env) -> Outcome {
    let pd = env.pd();
    let cq = env.cq(16);
    let qpn = env.qp(pd, cq, QpType::Rc, default_cap());
    assert_errno(env.dev.dealloc_pd(pd), EBUSY);
    env.dev.destroy_qp(qpn).expect("destroy_qp");
    env.dev.dealloc_pd(pd).expect("dealloc_pd after destroy_qp");
    Outcome::Pass
}

fn many_pds(env: &Env) -> Outcome {
    let pds: Vec<_> = (0..32).map(|_| env.pd()).collect();
    let mut sorted = pds.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), pds.len());
    for pd in pds {
        env.dev.dealloc_pd(pd).expect("dealloc_pd");
    }
    Outcome::Pass
}

fn reg_with_access(env: &Env, bits: u64) -> Outcome {
    let access = A::from_bits_truncate(bits as u32);
    let pd = env.pd();
    let buf = MemBuf::new(8192);
    let mr = env.dev.reg_mr(pd, &buf, 0, 8192, access).expect("reg_mr");
    assert_eq!(mr.addr, buf.addr());
    assert_eq!(mr.length, 8192);
    env.dev.dereg_mr(mr.lkey).expect("dereg_mr");
    Outcome::Pass
}

fn remote_write_needs_local(env: &Env) -> Outcome {
    let pd = env.pd();
    let buf = MemBuf::new(4096);
    assert_errno(env.dev.reg_mr(pd, &buf, 0, 4096, A::REMOTE_WRITE), EINVAL);
    Outcome::Pass
}

fn remote_atomic_needs_local(env: &Env) -> Outcome {
    let pd = env.pd();
    let buf = MemBuf::new(4096);
    assert_errno(env.dev.reg_mr(pd, &buf, 0, 4096, A::REMOTE_ATOMIC), EINVAL);
    Outcome::Pass
}

fn beyond_buffer(env: &Env) -> Outcome {
    let pd = env.pd();
    let buf = MemBuf::new(4096);
    assert_errno(env.dev.reg_mr(pd, &buf, 1, 4096, A::LOCAL_WRITE), EINVAL);
    Outcome::Pass
}

fn dereg_twice(env: &Env) -> Outcome {
    let pd = env.pd();
    let (_b, mr) = env.mr(pd, 4096, A::LOCAL_WRITE);
    env.dev.dereg_mr(mr.lkey).expect("dereg_mr");
    assert_errno(env.dev.dereg_mr(mr.lkey), EINVAL);
    Outcome::Pass
}

fn keys_distinct(env: &Env) -> Outcome {
    let pd = env.pd();
    let buf = MemBuf::new(4096);
    let mut lkeys = Vec::new();
    let mut rkeys = Vec::new();
    for _ in 0..16 {
        let mr = env
            .dev
            .reg_mr(pd, &buf, 0, 4096, all_access())
            .expect("reg_mr");
        lkeys.push(mr.lkey);
        rkeys.push(mr.rkey);
    }
    lkeys.sort_unstable();
    lkeys.dedup();
    rkeys.sort_unstable();
    rkeys.dedup();
    assert_eq!((lkeys.len(), rkeys.len()), (16, 16));
    Outcome::Pass
}

fn overlapping(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    // A second region over part of b's buffer, written through its own rkey.
    let second = env
        .dev
        .reg_mr(p.pd, &p.b.buf, 4096, 4096, all_access())
        .expect("second reg_mr over the same memory");
    p.a.buf.write(0, &[7u8; 64]).unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 64)], second.addr + 100, second.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    let mut got = [0u8; 64];
    p.b.buf.read(4096 + 100, &mut got).unwrap();
    assert_eq!(got, [7u8; 64]);
    // And the first region still works over the same bytes.
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(2, vec![p.a.sge(0, 8)], p.b.addr(4096), p.b.mr.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    Outcome::Pass
}

fn dereg_then_pd(env: &Env) -> Outcome {
    let pd = env.pd();
    let mrs: Vec<_> = (0..4).map(|_| env.mr(pd, 4096, A::LOCAL_WRITE)).collect();
    for (_, mr) in &mrs {
        env.dev.dereg_mr(mr.lkey).expect("dereg_mr");
    }
    env.dev.dealloc_pd(pd).expect("dealloc_pd");
    Outcome::Pass
}

fn deregistered_lkey(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let (_buf, mr) = env.mr(p.pd, 4096, A::LOCAL_WRITE);
    env.dev.dereg_mr(mr.lkey).expect("dereg_mr");
    let sge = verbs_api::Sge {
        addr: mr.addr,
        length: 16,
        lkey: mr.lkey,
    };
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![p.b.sge(0, 64)]));
    env.post_send(p.a.qpn, SendWr::send(1, vec![sge]).signaled());
    let wc = env.poll_one(p.a.cq);
    assert_eq!(wc.status, WcStatus::LocProtErr, "{wc:?}");
    Outcome::Pass
}

fn deregistered_rkey(env: &Env) -> Outcome {
    let cap = QpCap {
        max_inline_data: 0,
        ..default_cap()
    };
    let p = env.pair_with(QpType::Rc, &env.params(), cap, 64);
    let (_buf, target) = env.mr(p.pd, 4096, all_access());
    env.dev.dereg_mr(target.lkey).expect("dereg_mr");
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 16)], target.addr, target.rkey).signaled(),
    );
    let wc = env.poll_one(p.a.cq);
    assert_eq!(wc.status, WcStatus::RemAccessErr, "{wc:?}");
    Outcome::Pass
}

/// Reregisters b's region with `flags`; a device without `ibv_rereg_mr` skips.
fn rereg(
    env: &Env,
    lkey: u32,
    flags: verbs_api::ReregMrFlags,
    range: Option<(&MemBuf, usize, usize)>,
    access: A,
) -> Result<verbs_api::MrInfo, Outcome> {
    match env.dev.rereg_mr(lkey, flags, None, range, access) {
        Ok(m) => Ok(m),
        Err(e) if e.errno() == 95 && !env.emulator => Err(Outcome::Skip(
            "the device does not implement ibv_rereg_mr (EOPNOTSUPP)".into(),
        )),
        Err(e) => panic!("rereg_mr: {e:?}"),
    }
}

fn rereg_access(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let access = A::LOCAL_WRITE | A::REMOTE_READ;
    let m = match rereg(
        env,
        p.b.mr.lkey,
        verbs_api::ReregMrFlags::CHANGE_ACCESS,
        None,
        access,
    ) {
        Ok(m) => m,
        Err(skip) => return skip,
    };
    assert_eq!((m.addr, m.length), (p.b.mr.addr, p.b.mr.length));
    assert_eq!(m.rkey, p.b.mr.rkey, "the region keeps its keys");
    p.b.buf.write(0, b"kept").unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_read(1, vec![p.a.sge(0, 4)], m.addr, m.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    let mut got = [0u8; 4];
    p.a.buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"kept", "the region kept its memory");
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(2, vec![p.a.sge(0, 4)], m.addr, m.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::RemAccessErr);
    Outcome::Pass
}

fn rereg_translation(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let fresh = MemBuf::new(8192);
    let m = match rereg(
        env,
        p.b.mr.lkey,
        verbs_api::ReregMrFlags::CHANGE_TRANSLATION,
        Some((&fresh, 0, 8192)),
        A::empty(), // the access stays: only CHANGE_ACCESS may name it
    ) {
        Ok(m) => m,
        Err(skip) => return skip,
    };
    assert_eq!((m.addr, m.length), (fresh.addr(), 8192));
    p.a.buf.write(0, b"moved").unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 5)], m.addr + 100, m.rkey).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    let mut got = [0u8; 5];
    fresh.read(100, &mut got).unwrap();
    assert_eq!(&got, b"moved");
    Outcome::Pass
}

fn zero_based(env: &Env) -> Outcome {
    let pd = env.pd();
    let buf = MemBuf::new(4096);
    let access = all_access() | A::ZERO_BASED;
    assert_errno(env.dev.reg_mr(pd, &buf, 0, 4096, access), EOPNOTSUPP);
    // Nothing was registered: the PD has no user left.
    env.dev.dealloc_pd(pd).expect("dealloc_pd");
    Outcome::Pass
}

fn zero_length(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let (a0, b0) = (
        env.dev
            .reg_mr(p.pd, &p.a.buf, 4096, 0, all_access())
            .expect("reg_mr of 0 bytes"),
        env.dev
            .reg_mr(p.pd, &p.b.buf, 4096, 0, all_access())
            .expect("reg_mr of 0 bytes"),
    );
    assert_eq!((a0.length, b0.length), (0, 0));
    let empty = |mr: &verbs_api::MrInfo| verbs_api::Sge {
        addr: mr.addr,
        length: 0,
        lkey: mr.lkey,
    };
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![empty(&b0)]));
    env.post_send(p.a.qpn, SendWr::send(1, vec![empty(&a0)]).signaled());
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 0),
        "{wc:?}"
    );
    for (wr_id, rkey) in [(2, b0.rkey), (3, b0.rkey ^ 0x5500)] {
        let write = SendWr::rdma_write(wr_id, vec![empty(&a0)], b0.addr, rkey);
        env.post_send(p.a.qpn, write.signaled());
        let wc = env.poll_one(p.a.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (wr_id, WcStatus::Success),
            "WRITE {wc:?}"
        );
        let read = SendWr::rdma_read(wr_id + 10, vec![empty(&a0)], b0.addr, rkey);
        env.post_send(p.a.qpn, read.signaled());
        let wc = env.poll_one(p.a.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (wr_id + 10, WcStatus::Success),
            "READ {wc:?}"
        );
    }
    assert!(
        p.b.buf.to_vec().iter().all(|&x| x == 0),
        "bytes were written"
    );
    env.dev.dereg_mr(a0.lkey).expect("dereg_mr");
    env.dev.dereg_mr(b0.lkey).expect("dereg_mr");
    Outcome::Pass
}
