//! Resource limits (manual 3.3.1 ibv_query_device: the `max_*` attributes are what the
//! device supports): a device gives every object and every queue size it advertises,
//! and refuses one more. google/rdma-unit-test's `limits_test.cc` and rdma-core's
//! `tests/test_device.py` (`test_query_device*`, the max-object tests) check the same.
//!
//! Where hardware advertises more objects than a case can allocate in reasonable time
//! and memory (kernel rxe: a million PDs, QPs, CQs, MRs and SRQs, and a million WRs per
//! queue), the case allocates up to a bound ([`HW_OBJECTS`], [`HW_WRS`]) and says so;
//! the emulator is always filled to its exact limit, and one past it must fail.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;

use verbs_api::{
    connect_qp, AccessFlags as A, Endpoint, Gid, MemBuf, MwType, QpCap, QpInitAttr, QpType, RecvWr,
    Result, SendFlags, SendWr, SrqAttr, WcOpcode, WcStatus as S,
};

use super::{
    assert_errno,
    errno::{EINVAL, ENOMEM},
};
use crate::env::default_cap;
use crate::{Case, Env, Outcome};

/// Objects of one kind a case allocates at most on hardware whose advertised maximum is
/// larger (allocating rxe's million would take the VM far beyond its time budget).
const HW_OBJECTS: u32 = 512;

/// WRs a case asks of one queue at most on hardware whose `max_qp_wr` / `max_srq_wr` is
/// larger (rxe's million WRs of a queue would take hundreds of MB of the VM's memory).
const HW_WRS: u32 = 4096;

/// The objects whose count the device limits.
const OBJECTS: [&str; 7] = ["pd", "cq", "qp", "mr", "srq", "ah", "mw"];

pub(super) fn register(v: &mut Vec<Case>) {
    for (i, o) in OBJECTS.iter().enumerate() {
        v.push(Case::param(format!("limits::max_{o}_{o}s_then_one_more_fails"), "manual 3.3.1 ibv_query_device (max_pd, max_cq, max_qp, max_mr, max_srq, max_ah, max_mw: the number the device supports): that many objects can be allocated, all distinct; one more is refused with ENOMEM (libibverbs providers; kernel rxe's pools answer EINVAL); freeing them all makes room again. On hardware advertising more than 512 the case allocates 512 and does not try one more", fill_objects, i as u64));
    }
    v.push(Case::new("limits::cq_of_max_cqe_entries_then_resize_past_is_einval", "manual 3.3.1 max_cqe, 3.3.7 ibv_create_cq (cqe up to max_cqe), 3.3.8 ibv_resize_cq: a CQ of max_cqe entries is created and holds max_cqe completions; resizing it to max_cqe + 1 fails with EINVAL", cq_at_max));
    v.push(Case::param("limits::qp_of_max_qp_wr_send_wrs", "manual 3.3.1 max_qp_wr, 3.4.3 ibv_create_qp (cap.max_send_wr up to max_qp_wr): a QP with max_qp_wr send WRs is created and reports at least that many (on hardware advertising more than 4096: 4096)", qp_wr_at_max, 0));
    v.push(Case::param("limits::qp_of_max_qp_wr_recv_wrs_and_one_more_is_einval", "manual 3.3.1 max_qp_wr, 3.4.3 ibv_create_qp: a QP with max_qp_wr receive WRs is created and reports at least that many (on hardware advertising more than 4096: 4096); cap.max_recv_wr = max_qp_wr + 1 fails with EINVAL", qp_wr_at_max, 1));
    v.push(Case::new("limits::recv_queue_full_is_enomem", "manual 3.6.4 ibv_post_recv: the receive queue holds cap.max_recv_wr WRs (as query_qp reports it); one more fails with ENOMEM and bad_wr names it; the posted WRs all complete", rq_full));
    v.push(Case::param("limits::send_of_max_sge_sges_gathers_them_all", "manual 3.3.1 max_sge, 3.4.3 (cap.max_send_sge up to max_sge), 3.6.5 ibv_post_send (num_sge up to max_send_sge): a QP with max_sge send SGEs is created and a SEND gathering max_sge pieces delivers them in order", sge_at_max, 0));
    v.push(Case::param("limits::recv_of_max_sge_sges_scatters_them_all", "manual 3.3.1 max_sge, 3.4.3 (cap.max_recv_sge up to max_sge; max_sge + 1 is EINVAL), 3.6.4 ibv_post_recv: a receive WR of max_sge SGEs scatters a message over all of them in order", sge_at_max, 1));
    v.push(Case::param("limits::srq_of_max_srq_wr_then_one_more_is_einval", "manual 3.3.1 max_srq_wr, 3.4.5 ibv_create_srq (max_wr up to max_srq_wr): an SRQ of max_srq_wr WRs (on hardware advertising more than 4096: 4096) is created and reports at least that many; max_srq_wr + 1 is EINVAL", srq_at_max, 0));
    v.push(Case::param("limits::srq_of_max_srq_sge_then_one_more_is_einval", "manual 3.3.1 max_srq_sge, 3.4.5 ibv_create_srq (max_sge up to max_srq_sge): an SRQ with max_srq_sge SGEs per WR is created and takes a receive WR of that many; max_srq_sge + 1 is EINVAL", srq_at_max, 1));
    v.push(Case::new("limits::srq_full_is_enomem", "manual 3.6.6 ibv_post_srq_recv: an SRQ holds max_wr WRs (as query_srq reports it); one more fails with ENOMEM and bad_wr names it", srq_full));
    v.push(Case::new("limits::largest_inline_size_is_usable", "manual 3.4.3 cap.max_inline_data (the device refuses a size it cannot give: EINVAL), 3.6.5 IBV_SEND_INLINE: the largest max_inline_data create_qp accepts is reported back by query_qp, a SEND of that many inline bytes arrives intact, and one byte more at create_qp is EINVAL", inline_at_max));
    v.push(Case::param("limits::max_rd_atomic_at_device_limit_then_one_more_is_einval", "manual 3.3.1 max_qp_init_rd_atom, 3.5.1 ibv_modify_qp (max_rd_atomic, RTR->RTS): the device's limit is accepted and queried back, twice as many READs as it allows in flight all complete with their data; one more is EINVAL", rd_atomic_at_max, 0));
    v.push(Case::param("limits::max_dest_rd_atomic_at_device_limit_then_one_more_is_einval", "manual 3.3.1 max_qp_rd_atom, 3.5.1 ibv_modify_qp (max_dest_rd_atomic, INIT->RTR): the device's limit is accepted and queried back, and a peer may keep that many READs in flight; one more is EINVAL", rd_atomic_at_max, 1));
    v.push(Case::new("limits::max_mcast_grp_groups_then_one_more_is_enomem", "manual 3.3.1 max_mcast_grp (the multicast groups the device supports), 3.6.13 ibv_attach_mcast: one UD QP joins that many groups (on hardware advertising more than 512: 512), and on the emulator a datagram sent to the last one arrives; one group more is refused with ENOMEM (as kernel rxe's rxe_attach_mcast); leaving one makes room", mcast_groups_at_max));
    v.push(Case::new("limits::max_mcast_qp_attach_then_one_more_is_enomem", "manual 3.3.1 max_mcast_qp_attach, 3.6.13 ibv_attach_mcast: that many UD QPs join one group; one more is refused with ENOMEM (as kernel rxe's rxe_attach_mcast)", mcast_at_max));
}

/// How many objects of a kind whose advertised maximum is `max` a case allocates, and
/// whether that is all of them (so one more must fail).
fn target(env: &Env, max: u32, hw_bound: u32) -> (u32, bool) {
    if env.emulator || max <= hw_bound {
        (max, true)
    } else {
        (hw_bound, false)
    }
}

/// Asserts that `r` is the error of an exhausted resource: ENOMEM, or EINVAL as kernel
/// rxe's object pools answer.
#[track_caller]
fn assert_exhausted<T: Debug>(r: Result<T>, what: &str) {
    match r {
        Err(e) if e.errno() == ENOMEM || e.errno() == EINVAL => {}
        other => panic!("one {what} past the limit: expected ENOMEM or EINVAL, got {other:?}"),
    }
}

/// Allocates `n` objects with `alloc`, checks that they are distinct and, when `exact`,
/// that one more is refused; frees them all with `free`, then checks one more fits.
fn fill<K: Copy + Eq + Hash + Debug>(
    what: &str,
    n: u32,
    exact: bool,
    mut alloc: impl FnMut() -> Result<K>,
    mut free: impl FnMut(K) -> Result<()>,
) {
    let mut got = Vec::with_capacity(n as usize);
    for i in 0..n {
        let k = alloc().unwrap_or_else(|e| {
            panic!(
                "{what} {} of the {n} the device advertises was refused: {e:?}",
                i + 1
            )
        });
        got.push(k);
    }
    let distinct: HashSet<K> = got.iter().copied().collect();
    assert_eq!(distinct.len(), got.len(), "two {what}s share a handle");
    if exact {
        assert_exhausted(alloc(), what);
    }
    for k in got {
        free(k).unwrap_or_else(|e| panic!("freeing {what} {k:?}: {e:?}"));
    }
    let again =
        alloc().unwrap_or_else(|e| panic!("no room for a {what} once all are freed: {e:?}"));
    free(again).expect("free");
}

/// A small QP capacity for cases that create many QPs.
fn tiny_cap() -> QpCap {
    QpCap::new(1, 1)
}

fn fill_objects(env: &Env, which: u64) -> Outcome {
    let a = env.dev.query_device().expect("query_device");
    let dev = &*env.dev;
    // The PD and CQ the children need count against their own limits.
    match OBJECTS[which as usize] {
        "pd" => {
            let (n, exact) = target(env, a.max_pd, HW_OBJECTS);
            fill("PD", n, exact, || dev.alloc_pd(), |pd| dev.dealloc_pd(pd));
        }
        "cq" => {
            let (n, exact) = target(env, a.max_cq, HW_OBJECTS);
            fill(
                "CQ",
                n,
                exact,
                || dev.create_cq(1, None),
                |cq| dev.destroy_cq(cq),
            );
        }
        "qp" => {
            let (pd, cq) = (env.pd(), env.cq(1));
            let init = QpInitAttr::new(pd, cq, QpType::Ud, tiny_cap());
            let (n, exact) = target(env, a.max_qp, HW_OBJECTS);
            fill(
                "QP",
                n,
                exact,
                || dev.create_qp(&init),
                |q| dev.destroy_qp(q),
            );
        }
        "mr" => {
            let pd = env.pd();
            let buf = MemBuf::new(64);
            let (n, exact) = target(env, a.max_mr, HW_OBJECTS);
            let reg = || dev.reg_mr(pd, &buf, 0, 64, A::LOCAL_WRITE).map(|m| m.lkey);
            fill("MR", n, exact, reg, |k| dev.dereg_mr(k));
        }
        "srq" => {
            let pd = env.pd();
            let attr = SrqAttr {
                max_wr: 1,
                max_sge: 1,
                srq_limit: 0,
            };
            let (n, exact) = target(env, a.max_srq, HW_OBJECTS);
            fill(
                "SRQ",
                n,
                exact,
                || dev.create_srq(pd, &attr),
                |s| dev.destroy_srq(s),
            );
        }
        "ah" => {
            let pd = env.pd();
            let ah = env.params().ah_attr(env.gid());
            let (n, exact) = target(env, a.max_ah, HW_OBJECTS);
            fill(
                "AH",
                n,
                exact,
                || dev.create_ah(pd, &ah),
                |h| dev.destroy_ah(h),
            );
        }
        _ => {
            let pd = env.pd();
            let (n, exact) = target(env, a.max_mw, HW_OBJECTS);
            let alloc = || dev.alloc_mw(pd, MwType::Type1).map(|m| m.id);
            fill("MW", n, exact, alloc, |m| dev.dealloc_mw(m));
        }
    }
    Outcome::Pass
}

fn cq_at_max(env: &Env) -> Outcome {
    let max = env.dev.query_device().expect("query_device").max_cqe;
    let cq = env
        .dev
        .create_cq(max, None)
        .unwrap_or_else(|e| panic!("create_cq with max_cqe {max}: {e:?}"));
    assert_errno(env.dev.resize_cq(cq, max + 1), EINVAL);
    // The CQ holds max_cqe completions: fill it with receive flushes (a QP in ERR
    // flushes every WR it holds) and poll them all back.
    let n = max.min(HW_WRS);
    let pd = env.pd();
    let qpn = env.qp(
        pd,
        cq,
        QpType::Rc,
        QpCap {
            max_recv_wr: n,
            ..tiny_cap()
        },
    );
    let (_b, mr) = env.mr(pd, 64, A::LOCAL_WRITE);
    let sge = verbs_api::Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    to_init(env, qpn);
    let wrs: Vec<_> = (0..u64::from(n))
        .map(|i| RecvWr::new(i, vec![sge]))
        .collect();
    env.dev.post_recv(qpn, &wrs).expect("post_recv");
    to_err(env, qpn);
    for i in 0..u64::from(n) {
        let wc = env.poll_one(cq);
        assert_eq!((wc.wr_id, wc.status), (i, S::WrFlushErr), "{wc:?}");
    }
    Outcome::Pass
}

/// Moves RESET QP `qpn` to INIT (RC, default access).
fn to_init(env: &Env, qpn: u32) {
    let (attr, mask) = env.params().init(QpType::Rc);
    env.dev.modify_qp(qpn, &attr, mask).expect("RESET->INIT");
}

/// Moves QP `qpn` to ERR.
fn to_err(env: &Env, qpn: u32) {
    let attr = verbs_api::QpAttr {
        qp_state: verbs_api::QpState::Err,
        ..Default::default()
    };
    env.dev
        .modify_qp(qpn, &attr, verbs_api::QpAttrMask::STATE)
        .expect("to ERR");
}

fn qp_init(env: &Env, cap: QpCap) -> QpInitAttr {
    QpInitAttr::new(env.pd(), env.cq(16), QpType::Rc, cap)
}

fn qp_wr_at_max(env: &Env, recv: u64) -> Outcome {
    let max = env.dev.query_device().expect("query_device").max_qp_wr;
    let (n, _) = target(env, max, HW_WRS);
    let mut cap = tiny_cap();
    if recv == 1 {
        cap.max_recv_wr = n;
    } else {
        cap.max_send_wr = n;
    }
    let qpn = env
        .dev
        .create_qp(&qp_init(env, cap))
        .unwrap_or_else(|e| panic!("create_qp with {cap:?} (max_qp_wr {max}): {e:?}"));
    let got = env.dev.query_qp(qpn).expect("query_qp").1.cap;
    let have = if recv == 1 {
        got.max_recv_wr
    } else {
        got.max_send_wr
    };
    assert!(have >= n, "asked {n} WRs, the QP reports {got:?}");
    if recv == 1 {
        cap.max_recv_wr = max + 1;
        assert_errno(env.dev.create_qp(&qp_init(env, cap)), EINVAL);
    }
    Outcome::Pass
}

fn rq_full(env: &Env) -> Outcome {
    let init = qp_init(
        env,
        QpCap {
            max_recv_wr: 16,
            ..tiny_cap()
        },
    );
    let qpn = env.dev.create_qp(&init).expect("create_qp");
    to_init(env, qpn);
    let actual = env.dev.query_qp(qpn).expect("query_qp").1.cap.max_recv_wr;
    let _buf = overfill(env, init.pd, actual, |wrs| env.dev.post_recv(qpn, wrs));
    to_err(env, qpn);
    for i in 0..u64::from(actual) {
        let wc = env.poll_one(init.send_cq);
        assert_eq!((wc.wr_id, wc.status), (i, S::WrFlushErr), "{wc:?}");
    }
    env.assert_no_completion(init.send_cq, std::time::Duration::from_millis(30));
    Outcome::Pass
}

fn sge_at_max(env: &Env, recv: u64) -> Outcome {
    let max = env.dev.query_device().expect("query_device").max_sge;
    let cap = QpCap {
        max_send_sge: max,
        max_recv_sge: max,
        ..default_cap()
    };
    let p = env.pair_with(QpType::Rc, &env.params(), cap, 64);
    let got = env.dev.query_qp(p.a.qpn).expect("query_qp").1.cap;
    assert!(
        got.max_send_sge >= max && got.max_recv_sge >= max,
        "asked {max} SGEs, the QP reports {got:?}"
    );
    let piece = 8u32;
    let total = piece * max;
    // Piece i is 8 bytes of value i + 1, at a stride of 64 bytes on the scattered side.
    let (send_sges, recv_sges) = if recv == 1 {
        let whole = (0..total)
            .map(|b| (b / piece + 1) as u8)
            .collect::<Vec<_>>();
        p.a.buf.write(0, &whole).unwrap();
        let scattered = (0..u64::from(max))
            .map(|i| p.b.sge(i * 64, piece))
            .collect();
        (vec![p.a.sge(0, total)], scattered)
    } else {
        for i in 0..max {
            p.a.buf.write(i as usize * 64, &[i as u8 + 1; 8]).unwrap();
        }
        let gathered = (0..u64::from(max))
            .map(|i| p.a.sge(i * 64, piece))
            .collect();
        (gathered, vec![p.b.sge(0, total)])
    };
    env.post_recv(p.b.qpn, RecvWr::new(2, recv_sges));
    env.post_send(p.a.qpn, SendWr::send(1, send_sges).signaled());
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::Success), "{wc:?}");
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (2, S::Success, total),
        "{wc:?}"
    );
    for i in 0..max {
        let off = if recv == 1 { i * 64 } else { i * piece };
        let mut got = [0u8; 8];
        p.b.buf.read(off as usize, &mut got).unwrap();
        assert_eq!(got, [i as u8 + 1; 8], "piece {i} of {max}");
    }
    if recv == 1 {
        let cap = QpCap {
            max_recv_sge: max + 1,
            ..tiny_cap()
        };
        assert_errno(env.dev.create_qp(&qp_init(env, cap)), EINVAL);
    }
    Outcome::Pass
}

fn srq_at_max(env: &Env, sge: u64) -> Outcome {
    let a = env.dev.query_device().expect("query_device");
    let pd = env.pd();
    let (n, _) = target(env, a.max_srq_wr, HW_WRS);
    let mut attr = SrqAttr {
        max_wr: if sge == 1 { 4 } else { n },
        max_sge: if sge == 1 { a.max_srq_sge } else { 1 },
        srq_limit: 0,
    };
    let srq = env
        .dev
        .create_srq(pd, &attr)
        .unwrap_or_else(|e| panic!("create_srq {attr:?}: {e:?}"));
    let got = env.dev.query_srq(srq).expect("query_srq");
    assert!(
        got.max_wr >= attr.max_wr && got.max_sge >= attr.max_sge,
        "asked {attr:?}, the SRQ reports {got:?}"
    );
    if sge == 1 {
        let (_b, mr) = env.mr(pd, 4096, A::LOCAL_WRITE);
        let sges: Vec<verbs_api::Sge> = (0..u64::from(a.max_srq_sge))
            .map(|i| verbs_api::Sge {
                addr: mr.addr + i * 8,
                length: 8,
                lkey: mr.lkey,
            })
            .collect();
        env.dev
            .post_srq_recv(srq, &[RecvWr::new(1, sges)])
            .expect("post_srq_recv of max_srq_sge SGEs");
        attr.max_sge = a.max_srq_sge + 1;
    } else {
        attr.max_wr = a.max_srq_wr + 1;
    }
    assert_errno(env.dev.create_srq(pd, &attr), EINVAL);
    Outcome::Pass
}

/// Posts `room + 2` receive WRs of 8 bytes (of a region of `pd`) with `post` and checks
/// that the first `room` are taken and the next is refused with ENOMEM; returns the
/// region's memory, which must live as long as the WRs.
fn overfill(
    env: &Env,
    pd: verbs_api::PdId,
    room: u32,
    post: impl FnOnce(&[RecvWr]) -> std::result::Result<(), verbs_api::PostError>,
) -> MemBuf {
    let (buf, mr) = env.mr(pd, 64, A::LOCAL_WRITE);
    let sge = verbs_api::Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    let wrs: Vec<_> = (0..u64::from(room) + 2)
        .map(|i| RecvWr::new(i, vec![sge]))
        .collect();
    let e = post(&wrs).expect_err("posted past the queue");
    assert_eq!((e.index, e.error.errno()), (room as usize, ENOMEM), "{e:?}");
    buf
}

fn srq_full(env: &Env) -> Outcome {
    let pd = env.pd();
    let attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = env.dev.create_srq(pd, &attr).expect("create_srq");
    let actual = env.dev.query_srq(srq).expect("query_srq").max_wr;
    let _buf = overfill(env, pd, actual, |wrs| env.dev.post_srq_recv(srq, wrs));
    Outcome::Pass
}

fn inline_at_max(env: &Env) -> Outcome {
    let init = |inline: u32| {
        qp_init(
            env,
            QpCap {
                max_inline_data: inline,
                ..default_cap()
            },
        )
    };
    let accepts = |inline: u32| match env.dev.create_qp(&init(inline)) {
        Ok(q) => {
            env.dev.destroy_qp(q).expect("destroy_qp");
            true
        }
        Err(_) => false,
    };
    // The largest size create_qp accepts, by bisection below 64 KiB.
    let (mut lo, mut hi) = (0u32, 1 << 16);
    assert!(accepts(lo), "create_qp refuses max_inline_data 0");
    assert!(!accepts(hi), "create_qp accepts 64 KiB of inline data");
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if accepts(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    assert_errno(env.dev.create_qp(&init(lo + 1)), EINVAL);
    let cap = QpCap {
        max_inline_data: lo,
        ..default_cap()
    };
    let p = env.pair_with(QpType::Rc, &env.params(), cap, 64);
    let got = env.dev.query_qp(p.a.qpn).expect("query_qp").1.cap;
    assert!(got.max_inline_data >= lo, "asked {lo}, got {got:?}");
    let data: Vec<u8> = (0..lo).map(|i| (i % 251) as u8 + 1).collect();
    p.a.buf.write(0, &data).unwrap();
    env.post_recv(p.b.qpn, RecvWr::new(2, vec![p.b.sge(0, lo.max(1))]));
    let wr =
        SendWr::send(1, vec![p.a.sge(0, lo)]).with_flags(SendFlags::INLINE | SendFlags::SIGNALED);
    env.post_send(p.a.qpn, wr);
    // Inline data is copied at post time: the buffer may change at once.
    p.a.buf.fill(0);
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::Success), "{wc:?}");
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (2, S::Success, lo),
        "{wc:?}"
    );
    let mut got = vec![0u8; lo as usize];
    p.b.buf.read(0, &mut got).unwrap();
    assert!(got == data, "the {lo} inline bytes arrived changed");
    Outcome::Pass
}

/// An endpoint no QP answers (for QPs that are only brought up, never used).
fn ghost(env: &Env) -> Endpoint {
    Endpoint {
        lid: 0,
        qpn: 0xFF_FF00,
        psn: 1,
        gid: env.gid(),
    }
}

fn rd_atomic_at_max(env: &Env, dest: u64) -> Outcome {
    let a = env.dev.query_device().expect("query_device");
    let (init_max, dest_max) = (a.max_qp_init_rd_atom, a.max_qp_rd_atom);
    assert!(init_max > 0 && dest_max > 0, "{a:?}");
    // QpParams carries the values as u8 (as libibverbs' ibv_qp_attr).
    let clamp = |v: u32| v.min(255) as u8;
    let mut params = env.params();
    params.max_rd_atomic = clamp(init_max);
    params.max_dest_rd_atomic = clamp(dest_max);
    let cap = QpCap {
        max_send_wr: 2 * u32::from(params.max_rd_atomic.max(params.max_dest_rd_atomic)),
        ..default_cap()
    };
    let p = env.pair_with(QpType::Rc, &params, cap, 1024);
    let (attr, _) = env.dev.query_qp(p.a.qpn).expect("query_qp");
    assert_eq!(
        (attr.max_rd_atomic, attr.max_dest_rd_atomic),
        (params.max_rd_atomic, params.max_dest_rd_atomic),
        "{attr:?}"
    );
    // Twice as many READs as either side lets be in flight, each from its own spot.
    let n = u64::from(cap.max_send_wr);
    for i in 0..n {
        p.b.buf.write_u64(i as usize * 8, 0xA000 + i).unwrap();
    }
    for i in 0..n {
        let wr = SendWr::rdma_read(
            i,
            vec![p.a.sge(4096 + i * 8, 8)],
            p.b.addr(i * 8),
            p.b.mr.rkey,
        );
        env.post_send(p.a.qpn, wr.signaled());
    }
    for i in 0..n {
        let wc = env.poll_one(p.a.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (i, S::Success, WcOpcode::RdmaRead),
            "{wc:?}"
        );
        assert_eq!(p.a.buf.read_u64(4096 + i as usize * 8).unwrap(), 0xA000 + i);
    }
    let max = if dest == 1 { dest_max } else { init_max };
    if max >= 255 {
        return Outcome::Pass;
    }
    let mut over = env.params();
    if dest == 1 {
        over.max_dest_rd_atomic = max as u8 + 1;
    } else {
        over.max_rd_atomic = max as u8 + 1;
    }
    let (pd, cq) = (env.pd(), env.cq(16));
    let qpn = env.qp(pd, cq, QpType::Rc, default_cap());
    assert_errno(
        connect_qp(&*env.dev, qpn, QpType::Rc, &over, 1, &ghost(env)),
        EINVAL,
    );
    Outcome::Pass
}

fn mcast_at_max(env: &Env) -> Outcome {
    let max = env
        .dev
        .query_device()
        .expect("query_device")
        .max_mcast_qp_attach;
    let (n, exact) = target(env, max, HW_OBJECTS);
    let (pd, cq) = (env.pd(), env.cq(1));
    let group = env.mcast_gid(std::net::Ipv4Addr::new(239, 1, 2, 4));
    let mut qps = Vec::new();
    let ud = || {
        let q = env.qp(pd, cq, QpType::Ud, tiny_cap());
        connect_qp(&*env.dev, q, QpType::Ud, &env.params(), 1, &ghost(env)).expect("UD to RTS");
        q
    };
    for i in 0..n {
        let q = ud();
        env.dev
            .attach_mcast(q, &group, 0)
            .unwrap_or_else(|e| panic!("attach {} of {n}: {e:?}", i + 1));
        qps.push(q);
    }
    if exact {
        let q = ud();
        assert_errno(env.dev.attach_mcast(q, &group, 0), ENOMEM);
        // A group's room is per group: another group takes it.
        let other = env.mcast_gid(std::net::Ipv4Addr::new(239, 1, 2, 5));
        env.dev
            .attach_mcast(q, &other, 0)
            .expect("attach to another group");
        // Leaving makes room.
        env.dev.detach_mcast(qps[0], &group, 0).expect("detach");
        env.dev
            .attach_mcast(q, &group, 0)
            .expect("attach after a detach");
    }
    Outcome::Pass
}

/// The multicast GID of group `i` (239.2.x.y, or ff05::239.2.x.y on an IPv6 device).
fn group(env: &Env, i: u32) -> Gid {
    let [_, _, hi, lo] = i.to_be_bytes();
    env.mcast_gid(std::net::Ipv4Addr::new(239, 2, hi, lo))
}

fn mcast_groups_at_max(env: &Env) -> Outcome {
    let max = env.dev.query_device().expect("query_device").max_mcast_grp;
    let (n, exact) = target(env, max, HW_OBJECTS);
    let p = env.pair(QpType::Ud);
    for i in 0..n {
        env.dev
            .attach_mcast(p.b.qpn, &group(env, i), 0)
            .unwrap_or_else(|e| panic!("join group {} of {n}: {e:?}", i + 1));
    }
    // The last group joined delivers. Kernel rxe does not loop a device's multicast
    // back to its own QPs (the deviation of ud::multicast_reaches_every_attached_qp),
    // so only the emulator is asked, where the host delivers multicast.
    let no_delivery = env.no_multicast_delivery();
    if env.emulator && no_delivery.is_none() {
        env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 128)]));
        let d = super::ud::dest(env, &p, env.params().qkey, 0xFF_FFFF, group(env, n - 1));
        env.post_send(
            p.a.qpn,
            SendWr::send(1, vec![p.a.sge(0, 16)]).with_ud(d).signaled(),
        );
        assert_eq!(env.poll_one(p.a.cq).status, S::Success);
        assert_eq!(env.poll_one(p.b.cq).wr_id, 5, "the group's datagram");
    }
    if exact {
        assert_errno(env.dev.attach_mcast(p.b.qpn, &group(env, n), 0), ENOMEM);
        env.dev
            .detach_mcast(p.b.qpn, &group(env, 0), 0)
            .expect("detach");
        env.dev
            .attach_mcast(p.b.qpn, &group(env, n), 0)
            .expect("join after a detach");
    }
    match no_delivery {
        Some(why) => Outcome::Skip(format!("the limit holds; delivery not checked: {why}")),
        None => Outcome::Pass,
    }
}
