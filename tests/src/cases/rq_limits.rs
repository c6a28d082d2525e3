//! The limits of receive queues and SRQs (manual 3.6.4 ibv_post_recv, 3.4.5
//! ibv_create_srq, 3.4.6 ibv_modify_srq, 3.6.6 ibv_post_srq_recv; IBTA 10.2.9, 11.2.3,
//! 11.4.1.2): a full queue refuses the next WR with ENOMEM and names it in bad_wr, a
//! completed receive frees its slot, a WR with more SGEs than the queue allows is EINVAL
//! and the WRs before it stay posted; an SRQ may reach but not pass the device's
//! `max_srq_wr` and `max_srq_sge`, and resizing it keeps the WRs it holds, refuses a
//! size below them or above the device, and leaves it as it was when refused.
//!
//! google/rdma-unit-test's `SrqTest` (`ExceedsMaxWrInfinitePost`, `ExceedsMaxSge`,
//! `ExceedsDeviceCap`) and rdma-core's pyverbs `test_srq.py` (resize) check the same.

use verbs_api::{QpState as S, QpType, RecvWr, SendWr, SrqAttr, SrqAttrMask, SrqId, WcStatus};

use super::{
    assert_errno,
    errno::{EINVAL, ENOMEM},
};
use crate::env::{default_cap, Pair, PairSpec};
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("rq_limits::recv_queue_full_is_enomem", "manual 3.4.3 cap.max_recv_wr (the receive queue's size), 3.6.4 ibv_post_recv (processing stops at the first WR refused, bad_wr names it): a list one longer than the queue posts max_recv_wr WRs and refuses the next with ENOMEM; moving to ERR flushes exactly those posted", rq_full).wc(WcStatus::WrFlushErr));
    v.push(Case::new("rq_limits::completed_receive_frees_its_slot", "manual 3.4.3 max_recv_wr (outstanding receive WRs: a completed one no longer counts), 3.6.4: on a full receive queue one message completes one receive, after which exactly one more WR can be posted (ENOMEM for the next)", freed_slot).wc(WcStatus::Success));
    v.push(Case::new("rq_limits::recv_more_sges_than_max_is_einval", "manual 3.4.3 max_recv_sge, 3.6.4 (the list is processed up to the first WR refused): a receive WR with one more SGE than max_recv_sge is refused with EINVAL and bad_wr names it; the WR before it was posted and takes the next message", recv_too_many_sges).wc(WcStatus::Success));
    v.push(Case::new("rq_limits::srq_full_is_enomem", "manual 3.4.5 (max_wr is the SRQ's size, returned as allocated), 3.6.6 ibv_post_srq_recv (bad_wr names the first WR refused): a list one longer than max_wr posts max_wr WRs and refuses the next with ENOMEM; the QP on the SRQ then takes exactly those, in order", srq_full).wc(WcStatus::Success));
    v.push(Case::new("rq_limits::srq_more_sges_than_max_is_einval", "manual 3.4.5 max_sge (SGEs per WR of the SRQ), 3.6.6: a WR with one more SGE than the SRQ's max_sge is refused with EINVAL and bad_wr names it; the WR before it was posted", srq_too_many_sges));
    v.push(Case::param("rq_limits::srq_max_wr_beyond_device_is_einval", "manual 3.4.5 ibv_create_srq (max_wr may not exceed the device's max_srq_wr, 3.3.1), IBTA 11.2.3.1: EINVAL (google/rdma-unit-test SrqTest.ExceedsDeviceCap)", srq_beyond_device, 0));
    v.push(Case::param("rq_limits::srq_max_sge_beyond_device_is_einval", "manual 3.4.5 ibv_create_srq (max_sge may not exceed the device's max_srq_sge, 3.3.1), IBTA 11.2.3.1: EINVAL (google/rdma-unit-test SrqTest.ExceedsDeviceCap)", srq_beyond_device, 1));
    v.push(Case::new("rq_limits::srq_at_device_limits_is_granted", "manual 3.4.5 (the SRQ gets at least the max_wr and max_sge asked for, up to the device's max_srq_wr and max_srq_sge): an SRQ at both limits is created, reports them, and a receive WR with max_srq_sge SGEs scatters a message over all of them", srq_at_limits).wc(WcStatus::Success));
    v.push(Case::new("rq_limits::srq_resize_grows_and_keeps_its_wrs", "manual 3.4.6 ibv_modify_srq IBV_SRQ_MAX_WR (resize, where the device sets IBV_DEVICE_SRQ_RESIZE), IBTA 11.2.3.3 Modify SRQ: a full SRQ grown to twice its size keeps the WRs it holds, takes as many again, and hands all of them out in posting order", srq_grow).wc(WcStatus::Success));
    v.push(Case::new("rq_limits::srq_resize_below_its_wrs_is_einval", "IBTA 11.2.3.3 Modify SRQ (the new size may not be smaller than the WRs the SRQ holds), manual 3.4.6 (if any attribute is invalid none is modified): resizing an SRQ holding 20 WRs to 10 fails with EINVAL and its size is unchanged", srq_shrink_below));
    v.push(Case::new("rq_limits::srq_resize_beyond_device_is_einval", "manual 3.4.6 (max_wr is bounded by the device's max_srq_wr, 3.3.1; an invalid attribute modifies nothing): resizing past max_srq_wr fails with EINVAL and the SRQ keeps its size", srq_grow_beyond));
}

/// A pair with `cap` whose b is left in `b_upto`.
fn pair(env: &Env, cap: verbs_api::QpCap, b_upto: S) -> Pair {
    let spec = PairSpec {
        b_upto,
        ..PairSpec::default()
    };
    env.pair_spec(QpType::Rc, &env.params(), cap, 256, &spec)
}

/// A pair whose b takes its receives from an SRQ of `max_wr` WRs and `max_sge` SGEs.
fn srq_pair(env: &Env, max_wr: u32, max_sge: u32) -> (Pair, SrqId) {
    let spec = PairSpec {
        b_srq: Some(SrqAttr {
            max_wr,
            max_sge,
            srq_limit: 0,
        }),
        ..PairSpec::default()
    };
    let p = env.pair_spec(QpType::Rc, &env.params(), default_cap(), 256, &spec);
    let srq = p.srq.expect("the pair's SRQ");
    (p, srq)
}

/// Receive WRs `ids`, each over 64 bytes of b's buffer at its own place.
fn recvs(p: &Pair, ids: std::ops::Range<u64>) -> Vec<RecvWr> {
    ids.map(|i| RecvWr::new(i, vec![p.b.sge(i * 64, 64)]))
        .collect()
}

/// Sends `n` 8-byte messages from a and checks that b's receives `ids` take them, in
/// order.
fn deliver(env: &Env, p: &Pair, ids: std::ops::Range<u64>) {
    for id in ids {
        env.post_send(
            p.a.qpn,
            SendWr::send(1000 + id, vec![p.a.sge(0, 8)]).signaled(),
        );
        let wc = env.poll_one(p.a.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (1000 + id, WcStatus::Success),
            "{wc:?}"
        );
        let wc = env.poll_one(p.b.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (id, WcStatus::Success, 8),
            "{wc:?}"
        );
    }
}

fn max_recv_wr(env: &Env, qpn: u32) -> u64 {
    u64::from(env.dev.query_qp(qpn).expect("query_qp").1.cap.max_recv_wr)
}

fn small_rq() -> verbs_api::QpCap {
    verbs_api::QpCap {
        max_recv_wr: 4,
        ..default_cap()
    }
}

fn rq_full(env: &Env) -> Outcome {
    let p = pair(env, small_rq(), S::Init);
    let n = max_recv_wr(env, p.b.qpn);
    let e = env
        .dev
        .post_recv(p.b.qpn, &recvs(&p, 0..n + 1))
        .expect_err("more receive WRs than the queue holds were posted");
    assert_eq!((e.index as u64, e.error.errno()), (n, ENOMEM), "{e:?}");
    let e = env
        .dev
        .post_recv(p.b.qpn, &recvs(&p, n..n + 1))
        .expect_err("a WR was posted to a full receive queue");
    assert_eq!((e.index, e.error.errno()), (0, ENOMEM), "{e:?}");
    env.set_state(p.b.qpn, S::Err);
    for id in 0..n {
        let wc = env.poll_one(p.b.cq);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::WrFlushErr), "{wc:?}");
    }
    env.assert_no_completion(p.b.cq, std::time::Duration::from_millis(20));
    Outcome::Pass
}

fn freed_slot(env: &Env) -> Outcome {
    let p = pair(env, small_rq(), S::Rts);
    let n = max_recv_wr(env, p.b.qpn);
    env.dev
        .post_recv(p.b.qpn, &recvs(&p, 0..n))
        .expect("filling the receive queue");
    deliver(env, &p, 0..1);
    env.dev
        .post_recv(p.b.qpn, &recvs(&p, n..n + 1))
        .expect("posting into the slot the completed receive freed");
    let e = env
        .dev
        .post_recv(p.b.qpn, &recvs(&p, n + 1..n + 2))
        .expect_err("a WR was posted to a full receive queue");
    assert_eq!((e.index, e.error.errno()), (0, ENOMEM), "{e:?}");
    deliver(env, &p, 1..n + 1);
    Outcome::Pass
}

fn recv_too_many_sges(env: &Env) -> Outcome {
    let cap = verbs_api::QpCap {
        max_recv_sge: 2,
        ..default_cap()
    };
    let p = pair(env, cap, S::Rts);
    let max = u64::from(
        env.dev
            .query_qp(p.b.qpn)
            .expect("query_qp")
            .1
            .cap
            .max_recv_sge,
    );
    let wide: Vec<verbs_api::Sge> = (0..=max).map(|i| p.b.sge(4096 + i * 64, 64)).collect();
    let wrs = [RecvWr::new(0, vec![p.b.sge(0, 64)]), RecvWr::new(1, wide)];
    let e = env
        .dev
        .post_recv(p.b.qpn, &wrs)
        .expect_err("a receive WR with more SGEs than max_recv_sge was posted");
    assert_eq!((e.index, e.error.errno()), (1, EINVAL), "{e:?}");
    deliver(env, &p, 0..1);
    Outcome::Pass
}

fn srq_max_wr(env: &Env, srq: SrqId) -> u64 {
    u64::from(env.dev.query_srq(srq).expect("query_srq").max_wr)
}

fn srq_full(env: &Env) -> Outcome {
    let (p, srq) = srq_pair(env, 8, 1);
    let n = srq_max_wr(env, srq);
    let e = env
        .dev
        .post_srq_recv(srq, &recvs(&p, 0..n + 1))
        .expect_err("more WRs than the SRQ holds were posted");
    assert_eq!((e.index as u64, e.error.errno()), (n, ENOMEM), "{e:?}");
    deliver(env, &p, 0..n);
    env.assert_no_completion(p.b.cq, std::time::Duration::from_millis(20));
    Outcome::Pass
}

fn srq_too_many_sges(env: &Env) -> Outcome {
    let (p, srq) = srq_pair(env, 8, 1);
    let max = u64::from(env.dev.query_srq(srq).expect("query_srq").max_sge);
    let wide: Vec<verbs_api::Sge> = (0..=max).map(|i| p.b.sge(4096 + i * 64, 64)).collect();
    let wrs = [RecvWr::new(0, vec![p.b.sge(0, 64)]), RecvWr::new(1, wide)];
    let e = env
        .dev
        .post_srq_recv(srq, &wrs)
        .expect_err("an SRQ WR with more SGEs than max_sge was posted");
    assert_eq!((e.index, e.error.errno()), (1, EINVAL), "{e:?}");
    deliver(env, &p, 0..1);
    Outcome::Pass
}

/// An SRQ asking for one more WR (`which` 0) or SGE (1) than the device allows.
fn srq_beyond_device(env: &Env, which: u64) -> Outcome {
    let dev = env.dev.query_device().expect("query_device");
    let mut attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    if which == 0 {
        attr.max_wr = dev.max_srq_wr + 1;
    } else {
        attr.max_sge = dev.max_srq_sge + 1;
    }
    let pd = env.pd();
    assert_errno(env.dev.create_srq(pd, &attr), EINVAL);
    Outcome::Pass
}

fn srq_at_limits(env: &Env) -> Outcome {
    let dev = env.dev.query_device().expect("query_device");
    let (p, srq) = srq_pair(env, dev.max_srq_wr, dev.max_srq_sge);
    let got = env.dev.query_srq(srq).expect("query_srq");
    assert!(
        got.max_wr >= dev.max_srq_wr && got.max_sge >= dev.max_srq_sge,
        "asked for {} WRs of {} SGEs, got {got:?}",
        dev.max_srq_wr,
        dev.max_srq_sge
    );
    let n = u64::from(dev.max_srq_sge);
    scatter_check(env, &p, n, vec![p.a.sge(0, 8 * n as u32)], |wr| {
        env.dev
            .post_srq_recv(srq, &[wr])
            .expect("post_srq_recv with max_srq_sge SGEs")
    });
    Outcome::Pass
}

/// Sends `n` pieces of 8 bytes (piece i holds bytes i + 1) from the start of a's buffer,
/// gathered by `gather`, into a receive WR 9 that `post` posts and that scatters them
/// over `n` SGEs of 8 bytes, 64 bytes apart, in b's buffer; checks both completions and
/// every piece.
pub(super) fn scatter_check(
    env: &Env,
    p: &Pair,
    n: u64,
    gather: Vec<verbs_api::Sge>,
    post: impl FnOnce(RecvWr),
) {
    let data: Vec<u8> = (0..8 * n).map(|i| (i / 8) as u8 + 1).collect();
    p.a.buf.write(0, &data).unwrap();
    post(RecvWr::new(
        9,
        (0..n)
            .map(|i| p.b.sge(i * 64, 8))
            .collect::<Vec<verbs_api::Sge>>(),
    ));
    env.post_send(p.a.qpn, SendWr::send(1, gather).signaled());
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, u64::from(wc.byte_len)),
        (9, WcStatus::Success, 8 * n),
        "{wc:?}"
    );
    for i in 0..n {
        let mut got = [0u8; 8];
        p.b.buf.read((i * 64) as usize, &mut got).unwrap();
        assert_eq!(got, [i as u8 + 1; 8], "scatter SGE {i}");
    }
}

/// Resizes `srq` to `max_wr` WRs.
fn resize(env: &Env, srq: SrqId, max_wr: u32) -> verbs_api::Result<()> {
    let attr = SrqAttr {
        max_wr,
        max_sge: 0,
        srq_limit: 0,
    };
    env.dev.modify_srq(srq, &attr, SrqAttrMask::MAX_WR)
}

/// Skips where the device cannot resize SRQs (manual 3.4.6).
fn can_resize(env: &Env) -> Option<Outcome> {
    let flags = env
        .dev
        .query_device()
        .expect("query_device")
        .device_cap_flags;
    (!flags.contains(verbs_api::DeviceCapFlags::SRQ_RESIZE))
        .then(|| Outcome::Skip("the device does not set IBV_DEVICE_SRQ_RESIZE".into()))
}

fn srq_grow(env: &Env) -> Outcome {
    if let Some(skip) = can_resize(env) {
        return skip;
    }
    let (p, srq) = srq_pair(env, 4, 1);
    let n = srq_max_wr(env, srq);
    env.dev
        .post_srq_recv(srq, &recvs(&p, 0..n))
        .expect("filling the SRQ");
    resize(env, srq, 2 * n as u32).expect("resize to twice the size");
    assert!(srq_max_wr(env, srq) >= 2 * n, "the SRQ did not grow");
    env.dev
        .post_srq_recv(srq, &recvs(&p, n..2 * n))
        .expect("posting into the grown SRQ");
    deliver(env, &p, 0..2 * n);
    Outcome::Pass
}

fn srq_shrink_below(env: &Env) -> Outcome {
    if let Some(skip) = can_resize(env) {
        return skip;
    }
    let (p, srq) = srq_pair(env, 64, 1);
    let n = srq_max_wr(env, srq);
    env.dev
        .post_srq_recv(srq, &recvs(&p, 0..20))
        .expect("post_srq_recv");
    assert_errno(resize(env, srq, 10), EINVAL);
    assert_eq!(srq_max_wr(env, srq), n, "a refused resize changed the size");
    deliver(env, &p, 0..20);
    Outcome::Pass
}

fn srq_grow_beyond(env: &Env) -> Outcome {
    if let Some(skip) = can_resize(env) {
        return skip;
    }
    let max = env.dev.query_device().expect("query_device").max_srq_wr;
    let (p, srq) = srq_pair(env, 16, 1);
    let n = srq_max_wr(env, srq);
    env.dev
        .post_srq_recv(srq, &recvs(&p, 0..2))
        .expect("post_srq_recv");
    assert_errno(resize(env, srq, max + 1), EINVAL);
    assert_eq!(srq_max_wr(env, srq), n, "a refused resize changed the size");
    deliver(env, &p, 0..2);
    Outcome::Pass
}
