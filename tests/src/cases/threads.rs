//! Concurrency: one device used from several threads at once. libibverbs objects are
//! safe for multi-threaded access (ibv_alloc_td(3): "By default all verbs objects are
//! safe for multi-threaded access"), and the `Device` trait is `Send + Sync`: posting to
//! one QP or many, creating and destroying objects, polling one CQ and destroying what
//! another thread uses must neither lose nor duplicate a completion, deadlock nor
//! crash. rdma-core's `tests/test_mlx5_*` multi-thread tests and google/rdma-unit-test's
//! `threaded_test.cc` exercise the same.
//!
//! Every wait is bounded ([`Env::on_threads`], [`Env::poll_one`]): a deadlock fails the
//! case instead of hanging the suite.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use verbs_api::{
    AccessFlags as A, Device, MemBuf, MwType, QpCap, QpInitAttr, QpType, RecvWr, SendWr, Sge,
    SrqAttr, WcStatus as S, WorkCompletion,
};

use crate::env::{all_access, default_cap, Pair, WAIT};
use crate::{Case, Env, Outcome};

// The device and the environment a case hands its threads must be shareable; the
// emulator's device is, and `Device` requires it of every backend (hw-backend's
// `HwDevice` implements `Device`, so it is too).
const _: fn() = || {
    fn shareable<T: ?Sized + Send + Sync>() {}
    shareable::<dyn Device>();
    shareable::<emu_core::nic::EmuDevice>();
    shareable::<Env>();
};

/// Threads a case runs at once.
const THREADS: usize = 4;

/// WRs each thread posts in the one-QP cases.
const PER_THREAD: u64 = 64;

/// How long the threads of a case may take in all.
const THREADS_WAIT: Duration = Duration::from_secs(60);

/// The operations of the one-QP posting cases.
const OPS: [&str; 3] = ["send", "rdma_write", "rdma_read"];

/// The objects of the create-and-destroy cases.
const OBJECTS: [&str; 7] = ["pd", "mr", "cq", "qp", "ah", "srq", "mw"];

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("threads::queries_from_threads_agree", "ibv_alloc_td(3) (verbs objects are safe for multi-threaded access), manual 3.3.1-3.3.4: the device, port, GID and P_Key queried from four threads at once read the same as from one", queries));
    for (i, op) in OPS.iter().enumerate() {
        v.push(Case::param(format!("threads::{op}s_posted_from_threads_to_one_qp_complete_once"), "ibv_alloc_td(3) (verbs objects are safe for multi-threaded access), manual 3.6.5 ibv_post_send, IBTA 10.8.3 (every signaled WR completes once), 9.5 (an RC send queue completes in posting order): four threads post 64 signaled WRs each to one RC QP at once; every WR completes exactly once with success, each thread's in its posting order, and every byte lands where its WR put it", post_from_threads, i as u64).wc(S::Success));
    }
    v.push(Case::new("threads::recvs_posted_from_threads_to_one_qp_complete_once", "ibv_alloc_td(3), manual 3.6.4 ibv_post_recv, IBTA 10.8.3, 9.5 (receive WRs are consumed in posting order): four threads post 64 receives each to one RC QP at once; 256 SENDs consume every one exactly once, the receive queue's order holds, and the n-th receive completed holds the n-th message", recv_from_threads).wc(S::Success));
    v.push(Case::new("threads::posting_and_polling_race_on_one_qp", "ibv_alloc_td(3), manual 3.6.5, 3.6.10 ibv_poll_cq: one thread posts WRITEs to an RC QP while another polls its CQ, which is smaller than the WRs posted; every WR completes once, in posting order, and the CQ never overruns", post_poll_race).wc(S::Success));
    v.push(Case::new("threads::many_qps_one_thread_each", "ibv_alloc_td(3), manual 3.4.3, 3.6.5: eight threads each create a connected RC pair on one device and run SENDs, WRITEs and READs on it at once; every completion and every byte is each thread's own", many_qps).wc(S::Success));
    for (i, o) in OBJECTS.iter().enumerate() {
        v.push(Case::param(format!("threads::create_and_destroy_{o}s_from_threads"), "ibv_alloc_td(3) (verbs objects are safe for multi-threaded access), manual 3.3.5-3.4.16 (alloc/create and dealloc/destroy of PDs, MRs, CQs, QPs, AHs, SRQs, MWs): four threads create and destroy 160 objects each at once; no two live objects share a handle, every destroy succeeds, and the parent PD and CQ are free of children afterwards (dealloc_pd, destroy_cq succeed: manual 3.3.6, 3.3.9)", create_destroy, i as u64));
    }
    v.push(Case::new("threads::destroy_qp_while_another_thread_posts", "manual 3.4.4 ibv_destroy_qp, ibv_alloc_td(3): a QP destroyed while another thread posts to it and polls its CQ: posts after the destroy fail with EINVAL, no completion comes twice or for a WR never accepted, nothing hangs, and the device goes on working", destroy_qp_while_posting).wc(S::Success));
    v.push(Case::new("threads::qp_to_err_while_another_thread_posts", "manual 3.5.1 ibv_modify_qp (to ERR), IBTA 10.3.1, 10.8 (in ERR every outstanding and newly posted WR completes with WR_FLUSH_ERR), manual 6.2.6: a QP moved to ERR while another thread posts WRITEs to it: every accepted WR completes exactly once, in order, the successes first and flushes after, and no WR posted after the modify returned succeeds", err_while_posting).wc(S::WrFlushErr));
    v.push(Case::new("threads::resize_cq_while_another_thread_polls", "manual 3.3.8 ibv_resize_cq (the CQ keeps its completions), ibv_alloc_td(3): a CQ resized again and again while one thread polls it and another posts WRITEs whose completions it takes: every completion comes exactly once, in order", resize_while_polling).wc(S::Success));
    v.push(Case::param("threads::dereg_local_mr_while_another_thread_posts_through_it", "manual 3.4.2 ibv_dereg_mr, IBTA 10.6.3.1 (an L_Key is invalid once its region is deregistered), manual 6.2.5, 6.2.6, IBTA 10.8: WRITEs gathering from a region another thread deregisters: WRs posted after the deregistration returned never succeed, the first to fail completes with LOC_PROT_ERR and the rest flush; every accepted WR completes exactly once", dereg_while_posting, 0).wc(S::LocProtErr).wc(S::WrFlushErr));
    v.push(Case::param("threads::dereg_remote_mr_while_another_thread_writes_to_it", "manual 3.4.2 ibv_dereg_mr, IBTA 10.6.3.1, 9.7.4.1 (an R_Key is invalid once its region is deregistered), manual 6.2.11, 6.2.6: WRITEs into a region another thread deregisters: WRs posted after the deregistration returned never succeed, the first to fail completes with REM_ACCESS_ERR and the rest flush; every accepted WR completes exactly once", dereg_while_posting, 1).wc(S::RemAccessErr).wc(S::WrFlushErr));
    v.push(Case::new("threads::threads_poll_one_cq", "ibv_alloc_td(3), manual 3.6.10 ibv_poll_cq (a completion is taken from the CQ once), IBTA 11.4.2.1 (a CQ returns the completions of a work queue in order): four threads poll one CQ fed by two QPs; every completion is taken by exactly one thread, and each thread sees each QP's completions in posting order", poll_from_threads).wc(S::Success));
    v.push(Case::new("threads::srq_loopback_from_threads", "ibv_alloc_td(3), manual 3.6.6 ibv_post_srq_recv, IBTA 10.2.9 (an SRQ serves every QP attached to it): four threads each post receives to one SRQ and SENDs through their own RC pair whose responder is on the SRQ; every message is received exactly once, intact", srq_from_threads).wc(S::Success));
}

/// Completions of `cq` until `n` came (panics after [`WAIT`] without one).
fn poll_n(env: &Env, cq: verbs_api::CqId, n: usize) -> Vec<WorkCompletion> {
    (0..n).map(|_| env.poll_one(cq)).collect()
}

/// The 64 bytes that WR `k` of thread `t` carries.
fn pattern(t: usize, k: u64) -> [u8; 64] {
    let mut p = [(t as u8).wrapping_mul(31).wrapping_add(k as u8) | 1; 64];
    p[0] = t as u8;
    p[1] = k as u8;
    p
}

/// The wr_id of WR `k` of thread `t`.
fn wr_id(t: usize, k: u64) -> u64 {
    (t as u64) << 32 | k
}

/// Asserts that every WR of every thread completed exactly once with success, each
/// thread's in posting order.
#[track_caller]
fn assert_each_once(wcs: &[WorkCompletion], threads: usize, per_thread: u64) {
    let mut next = vec![0u64; threads];
    for wc in wcs {
        assert_eq!(wc.status, S::Success, "{wc:?}");
        let (t, k) = ((wc.wr_id >> 32) as usize, wc.wr_id & 0xFFFF_FFFF);
        assert!(t < threads, "a completion for no WR: {wc:?}");
        assert_eq!(
            k, next[t],
            "thread {t}'s WRs completed out of order: {wc:?}"
        );
        next[t] += 1;
    }
    assert!(
        next.iter().all(|&n| n == per_thread),
        "completions per thread: {next:?}"
    );
}

fn queries(env: &Env) -> Outcome {
    let want = (
        env.dev.query_device().expect("query_device"),
        env.dev.query_port(1).expect("query_port"),
        env.gid(),
        env.dev.query_pkey(1, 0).expect("query_pkey"),
    );
    let got = env.on_threads(THREADS, THREADS_WAIT, |env, _| {
        (0..200)
            .map(|_| {
                (
                    env.dev.query_device().expect("query_device"),
                    env.dev.query_port(1).expect("query_port"),
                    env.gid(),
                    env.dev.query_pkey(1, 0).expect("query_pkey"),
                )
            })
            .collect::<Vec<_>>()
    });
    for (t, all) in got.iter().enumerate() {
        for g in all {
            assert_eq!(g.0, want.0, "thread {t}: query_device");
            assert_eq!(g.1.state, want.1.state, "thread {t}: query_port");
            assert_eq!((g.2, g.3), (want.2, want.3), "thread {t}: GID, P_Key");
        }
    }
    Outcome::Pass
}

/// A pair whose queues hold every WR of [`THREADS`] threads at once.
fn wide_pair(env: &Env) -> Pair {
    let n = THREADS as u32 * PER_THREAD as u32;
    let cap = QpCap {
        max_send_wr: n,
        max_recv_wr: n,
        ..default_cap()
    };
    env.pair_with(QpType::Rc, &env.params(), cap, 2 * n)
}

/// Where WR `k` of thread `t` reads or writes its 64 bytes.
fn slot(t: usize, k: u64) -> u64 {
    (t as u64 * PER_THREAD + k) * 64
}

fn post_from_threads(env: &Env, op: u64) -> Outcome {
    let p = wide_pair(env);
    let n = THREADS * PER_THREAD as usize;
    // SENDs land in receives from 64 KiB on, in arrival order.
    let recv_base = 64 << 10;
    for i in 0..n as u64 {
        env.post_recv(
            p.b.qpn,
            RecvWr::new(i, vec![p.b.sge(recv_base + i * 64, 64)]),
        );
    }
    for t in 0..THREADS {
        for k in 0..PER_THREAD {
            let (src, other) = if op == 2 { (&p.b, &p.a) } else { (&p.a, &p.b) };
            src.buf.write(slot(t, k) as usize, &pattern(t, k)).unwrap();
            other.buf.write(slot(t, k) as usize, &[0; 64]).unwrap();
        }
    }
    let pp = p.clone();
    env.on_threads(THREADS, THREADS_WAIT, move |env, t| {
        for k in 0..PER_THREAD {
            let (id, s) = (wr_id(t, k), slot(t, k));
            let sge = vec![pp.a.sge(s, 64)];
            let wr = match op {
                0 => SendWr::send(id, sge),
                1 => SendWr::rdma_write(id, sge, pp.b.addr(s), pp.b.mr.rkey),
                _ => SendWr::rdma_read(id, sge, pp.b.addr(s), pp.b.mr.rkey),
            };
            env.post_send(pp.a.qpn, wr.signaled());
        }
    });
    assert_each_once(&poll_n(env, p.a.cq, n), THREADS, PER_THREAD);
    let mut seen = HashSet::new();
    if op == 0 {
        for (i, wc) in poll_n(env, p.b.cq, n).iter().enumerate() {
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (i as u64, S::Success, 64),
                "{wc:?}"
            );
            let mut got = [0u8; 64];
            p.b.buf.read(recv_base as usize + i * 64, &mut got).unwrap();
            let (t, k) = (got[0] as usize, u64::from(got[1]));
            assert!(
                t < THREADS && got == pattern(t, k),
                "receive {i} holds {got:?}"
            );
            assert!(
                seen.insert((t, k)),
                "message of thread {t} WR {k} received twice"
            );
        }
    } else {
        let dst = if op == 2 { &p.a } else { &p.b };
        for t in 0..THREADS {
            for k in 0..PER_THREAD {
                let mut got = [0u8; 64];
                dst.buf.read(slot(t, k) as usize, &mut got).unwrap();
                assert_eq!(got, pattern(t, k), "thread {t} WR {k}'s bytes");
            }
        }
    }
    env.assert_no_completion(p.a.cq, Duration::from_millis(20));
    Outcome::Pass
}

fn recv_from_threads(env: &Env) -> Outcome {
    let p = wide_pair(env);
    let n = THREADS as u64 * PER_THREAD;
    let pp = p.clone();
    env.on_threads(THREADS, THREADS_WAIT, move |env, t| {
        for k in 0..PER_THREAD {
            let wr = RecvWr::new(wr_id(t, k), vec![pp.b.sge(slot(t, k), 64)]);
            env.post_recv(pp.b.qpn, wr);
        }
    });
    // Message i: 64 bytes of a pattern naming i, from its own spot.
    for i in 0..n {
        let m = pattern(99, i);
        p.a.buf.write(i as usize * 64, &m).unwrap();
        p.a.buf
            .write(i as usize * 64 + 2, &(i as u16).to_le_bytes())
            .unwrap();
        env.post_send(
            p.a.qpn,
            SendWr::send(i, vec![p.a.sge(i * 64, 64)]).signaled(),
        );
    }
    let sends = poll_n(env, p.a.cq, n as usize);
    assert!(sends.iter().all(|w| w.status == S::Success), "{sends:?}");
    let recvs = poll_n(env, p.b.cq, n as usize);
    assert_each_once(&recvs, THREADS, PER_THREAD);
    for (i, wc) in recvs.iter().enumerate() {
        let (t, k) = ((wc.wr_id >> 32) as usize, wc.wr_id & 0xFFFF_FFFF);
        let mut got = [0u8; 64];
        p.b.buf.read(slot(t, k) as usize, &mut got).unwrap();
        let idx = u16::from_le_bytes([got[2], got[3]]) as usize;
        assert_eq!(idx, i, "receive {i} ({wc:?}) holds message {idx}");
    }
    Outcome::Pass
}

fn post_poll_race(env: &Env) -> Outcome {
    const WINDOW: u64 = 16;
    let total: u64 = if env.emulator { 2000 } else { 400 };
    let cap = QpCap {
        max_send_wr: WINDOW as u32,
        ..default_cap()
    };
    // The CQ holds two windows: the poller must keep up for it not to overrun.
    let p = env.pair_with(QpType::Rc, &env.params(), cap, 2 * WINDOW as u32);
    let done = Arc::new(AtomicU64::new(0));
    let got = env.on_threads(2, THREADS_WAIT, move |env, role| {
        let deadline = Instant::now() + THREADS_WAIT;
        if role == 0 {
            for i in 0..total {
                while i - done.load(SeqCst) >= WINDOW {
                    assert!(Instant::now() < deadline, "the poller stopped at {i}");
                    std::thread::yield_now();
                }
                let off = (i % 1024) * 8;
                let wr = SendWr::rdma_write(i, vec![p.a.sge(off, 8)], p.b.addr(off), p.b.mr.rkey);
                env.post_send(p.a.qpn, wr.signaled());
            }
            Vec::new()
        } else {
            let mut ids = Vec::new();
            for _ in 0..total {
                let wc = env.poll_one(p.a.cq);
                assert_eq!(wc.status, S::Success, "{wc:?}");
                ids.push(wc.wr_id);
                done.fetch_add(1, SeqCst);
            }
            ids
        }
    });
    assert_eq!(got[1], (0..total).collect::<Vec<_>>(), "completion order");
    Outcome::Pass
}

fn many_qps(env: &Env) -> Outcome {
    env.on_threads(8, THREADS_WAIT, |env, t| {
        let p = env.pair(QpType::Rc);
        for r in 0..20u64 {
            let m = pattern(t, r);
            p.a.buf.write(0, &m).unwrap();
            p.b.buf.write(4096, &pattern(t + 8, r)).unwrap();
            env.post_recv(p.b.qpn, RecvWr::new(r, vec![p.b.sge(0, 64)]));
            let wrs = [
                SendWr::send(1, vec![p.a.sge(0, 64)]),
                SendWr::rdma_write(2, vec![p.a.sge(0, 64)], p.b.addr(8192), p.b.mr.rkey),
                SendWr::rdma_read(3, vec![p.a.sge(1024, 64)], p.b.addr(4096), p.b.mr.rkey),
            ];
            for wr in wrs {
                env.post_send(p.a.qpn, wr.signaled());
            }
            // a and b have CQs of their own; a's three completions, then b's receive.
            for id in 1..=3 {
                let wc = env.poll_one(p.a.cq);
                assert_eq!(
                    (wc.wr_id, wc.status, wc.qp_num),
                    (id, S::Success, p.a.qpn),
                    "{wc:?}"
                );
            }
            let wc = env.poll_one(p.b.cq);
            assert_eq!(
                (wc.wr_id, wc.status, wc.qp_num),
                (r, S::Success, p.b.qpn),
                "{wc:?}"
            );
            let mut got = [0u8; 64];
            for (buf, off, want) in [
                (&p.b.buf, 0, m),
                (&p.b.buf, 8192, m),
                (&p.a.buf, 1024, pattern(t + 8, r)),
            ] {
                buf.read(off, &mut got).unwrap();
                assert_eq!(got, want, "thread {t} round {r} offset {off}");
            }
        }
    });
    Outcome::Pass
}

fn create_destroy(env: &Env, which: u64) -> Outcome {
    const ROUNDS: usize = 20;
    const BATCH: usize = 8;
    let kind = OBJECTS[which as usize];
    let (pd, cq) = (env.pd(), env.cq(4));
    let live = Arc::new(Mutex::new(HashSet::new()));
    let l = live.clone();
    env.on_threads(THREADS, THREADS_WAIT, move |env, _| {
        let dev = &*env.dev;
        let buf = MemBuf::new(4096);
        let ah_attr = env.params().ah_attr(env.gid());
        let init = QpInitAttr::new(pd, cq, QpType::Rc, default_cap());
        let srq_attr = SrqAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        };
        for _ in 0..ROUNDS {
            let mut mine = Vec::with_capacity(BATCH);
            for _ in 0..BATCH {
                let h = match kind {
                    "pd" => dev.alloc_pd().map(|x| u64::from(x.0)),
                    "mr" => dev
                        .reg_mr(pd, &buf, 0, 4096, all_access())
                        .map(|m| u64::from(m.lkey)),
                    "cq" => dev.create_cq(4, None).map(|x| u64::from(x.0)),
                    "qp" => dev.create_qp(&init).map(u64::from),
                    "ah" => dev.create_ah(pd, &ah_attr).map(|x| u64::from(x.0)),
                    "srq" => dev.create_srq(pd, &srq_attr).map(|x| u64::from(x.0)),
                    _ => dev.alloc_mw(pd, MwType::Type1).map(|m| u64::from(m.id.0)),
                }
                .unwrap_or_else(|e| panic!("creating a {kind}: {e:?}"));
                assert!(l.lock().unwrap().insert(h), "{kind} handle {h} given twice");
                mine.push(h);
            }
            for h in mine {
                // Off the live set first: once destroyed the handle may be reused.
                assert!(l.lock().unwrap().remove(&h));
                let id = h as u32;
                match kind {
                    "pd" => dev.dealloc_pd(verbs_api::PdId(id)),
                    "mr" => dev.dereg_mr(id),
                    "cq" => dev.destroy_cq(verbs_api::CqId(id)),
                    "qp" => dev.destroy_qp(id),
                    "ah" => dev.destroy_ah(verbs_api::AhId(id)),
                    "srq" => dev.destroy_srq(verbs_api::SrqId(id)),
                    _ => dev.dealloc_mw(verbs_api::MwId(id)),
                }
                .unwrap_or_else(|e| panic!("destroying {kind} {h}: {e:?}"));
            }
        }
    });
    assert!(live.lock().unwrap().is_empty());
    env.dev
        .destroy_cq(cq)
        .expect("destroy_cq once every QP is gone");
    env.dev
        .dealloc_pd(pd)
        .expect("dealloc_pd once every child is gone");
    Outcome::Pass
}

/// What the posting thread of the destroy and dereg cases saw.
#[derive(Debug, Default)]
struct Posted {
    /// The wr_ids accepted, in order.
    accepted: Vec<u64>,
    /// The completions polled.
    wcs: Vec<WorkCompletion>,
    /// The error that stopped the posts, if one did.
    refused: Option<verbs_api::PostError>,
    /// The first wr_id posted after the other thread's destroy or dereg had returned.
    first_after: Option<u64>,
}

/// Runs `act` once the poster has seen 32 completions (counted in `completed`), then
/// sets `done`.
fn when_under_way(completed: &AtomicU64, done: &AtomicBool, act: impl FnOnce()) {
    let deadline = Instant::now() + WAIT;
    while completed.load(SeqCst) < 32 {
        assert!(Instant::now() < deadline, "the poster made no progress");
        std::thread::yield_now();
    }
    act();
    done.store(true, SeqCst);
}

/// Polls what `cq` has now into `out`.
fn drain(env: &Env, cq: verbs_api::CqId, out: &mut Vec<WorkCompletion>) {
    env.dev.poll_cq(cq, 64, out).expect("poll_cq");
}

fn destroy_qp_while_posting(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let destroyed = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicU64::new(0));
    let (pp, d, c) = (p.clone(), destroyed.clone(), completed.clone());
    let got = env.on_threads(2, THREADS_WAIT, move |env, role| {
        let mut seen = Posted::default();
        if role == 1 {
            when_under_way(&c, &d, || env.dev.destroy_qp(pp.a.qpn).expect("destroy_qp"));
            return seen;
        }
        let deadline = Instant::now() + THREADS_WAIT;
        for i in 0.. {
            assert!(Instant::now() < deadline, "posts never failed");
            let after = d.load(SeqCst);
            let wr = SendWr::rdma_write(i, vec![pp.a.sge(0, 64)], pp.b.addr(0), pp.b.mr.rkey);
            match env.dev.post_send(pp.a.qpn, &[wr.signaled()]) {
                Ok(()) => seen.accepted.push(i),
                Err(e) if e.error.errno() == super::errno::ENOMEM => {}
                Err(e) => {
                    seen.refused = Some(e);
                    break;
                }
            }
            if after && seen.first_after.is_none() {
                seen.first_after = Some(i);
            }
            let before = seen.wcs.len();
            drain(env, pp.a.cq, &mut seen.wcs);
            c.fetch_add((seen.wcs.len() - before) as u64, SeqCst);
            if !env.virtual_time && seen.wcs.len() == before {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        // What is left on the CQ (it outlives the QP).
        let quiet = Instant::now() + Duration::from_millis(30);
        while Instant::now() < quiet {
            drain(env, pp.a.cq, &mut seen.wcs);
        }
        seen
    });
    let seen = &got[0];
    let e = seen.refused.as_ref().expect("a post was refused");
    assert_eq!(
        e.error.errno(),
        super::errno::EINVAL,
        "post after destroy: {e:?}"
    );
    let accepted: HashSet<_> = seen.accepted.iter().copied().collect();
    let mut once = HashSet::new();
    for wc in &seen.wcs {
        assert!(
            accepted.contains(&wc.wr_id),
            "a completion for no accepted WR: {wc:?}"
        );
        assert!(once.insert(wc.wr_id), "WR {} completed twice", wc.wr_id);
    }
    // The device goes on: the CQ can go, and a new pair works.
    let q = env.pair(QpType::Rc);
    env.post_send(
        q.a.qpn,
        SendWr::rdma_write(7, vec![q.a.sge(0, 8)], q.b.addr(0), q.b.mr.rkey).signaled(),
    );
    let wc = env.poll_one(q.a.cq);
    assert_eq!((wc.wr_id, wc.status), (7, S::Success), "{wc:?}");
    env.dev.destroy_qp(p.b.qpn).expect("destroy the peer");
    env.dev.dereg_mr(p.a.mr.lkey).expect("dereg_mr");
    env.dev
        .destroy_cq(p.a.cq)
        .expect("destroy_cq of the destroyed QP");
    Outcome::Pass
}

fn dereg_while_posting(env: &Env, remote: u64) -> Outcome {
    let p = env.pair(QpType::Rc);
    // The region the other thread deregisters: over a's buffer (gathered from) or over
    // b's (written to).
    let (victim_buf, victim) = if remote == 1 {
        env.mr(p.pd, 4096, all_access())
    } else {
        env.mr(p.pd, 4096, A::LOCAL_WRITE)
    };
    let pp = p.clone();
    let wr = move |i| {
        if remote == 1 {
            SendWr::rdma_write(i, vec![pp.a.sge(0, 64)], victim.addr, victim.rkey)
        } else {
            let sge = Sge {
                addr: victim.addr,
                length: 64,
                lkey: victim.lkey,
            };
            SendWr::rdma_write(i, vec![sge], pp.b.addr(0), pp.b.mr.rkey)
        }
    };
    let seen = &post_until_failure(env, &p, wr, move |env| {
        env.dev.dereg_mr(victim.lkey).expect("dereg_mr")
    });
    drop(victim_buf);
    assert_eq!(
        seen.wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        seen.accepted,
        "every accepted WR completes once, in order"
    );
    env.assert_no_completion(p.a.cq, Duration::from_millis(20));
    let first_bad = seen
        .wcs
        .iter()
        .position(|w| w.status != S::Success)
        .expect("a WR failed");
    let want = if remote == 1 {
        S::RemAccessErr
    } else {
        S::LocProtErr
    };
    assert_eq!(
        seen.wcs[first_bad].status, want,
        "{:?}",
        seen.wcs[first_bad]
    );
    for wc in &seen.wcs[first_bad + 1..] {
        assert_eq!(wc.status, S::WrFlushErr, "{wc:?}");
    }
    if let Some(after) = seen.first_after {
        let ok_after = seen.wcs[..first_bad]
            .iter()
            .filter(|w| w.wr_id >= after)
            .count();
        assert_eq!(ok_after, 0, "a WR posted after dereg_mr returned succeeded");
    }
    Outcome::Pass
}

fn poll_from_threads(env: &Env) -> Outcome {
    let n = THREADS as u32 * PER_THREAD as u32;
    let cq = env.cq(2 * n);
    let pd = env.pd();
    let cap = QpCap {
        max_send_wr: n,
        ..default_cap()
    };
    let (q1, q2) = (
        env.qp(pd, cq, QpType::Rc, cap),
        env.qp(pd, cq, QpType::Rc, cap),
    );
    let gid = env.gid();
    let ep = |qpn, psn| verbs_api::Endpoint {
        lid: 0,
        qpn,
        psn,
        gid,
    };
    verbs_api::connect_qp(&*env.dev, q1, QpType::Rc, &env.params(), 1, &ep(q2, 2))
        .expect("connect");
    verbs_api::connect_qp(&*env.dev, q2, QpType::Rc, &env.params(), 2, &ep(q1, 1))
        .expect("connect");
    let (_buf, mr) = env.mr(pd, 1 << 16, all_access());
    let total = Arc::new(AtomicU64::new(0));
    let want = u64::from(n);
    let t2 = total.clone();
    let got = env.on_threads(THREADS + 1, THREADS_WAIT, move |env, t| {
        if t == THREADS {
            // The poster: WRITEs alternately on the two QPs.
            for i in 0..want {
                let (q, off) = if i % 2 == 0 { (q1, 0) } else { (q2, 4096) };
                let sge = Sge {
                    addr: mr.addr + off,
                    length: 8,
                    lkey: mr.lkey,
                };
                let wr = SendWr::rdma_write(i, vec![sge], mr.addr + off + 8192, mr.rkey);
                env.post_send(q, wr.signaled());
            }
            return Vec::new();
        }
        let deadline = Instant::now() + WAIT;
        let mut mine = Vec::new();
        let mut out = Vec::new();
        while t2.load(SeqCst) < want {
            assert!(
                Instant::now() < deadline,
                "completions stopped at {}",
                t2.load(SeqCst)
            );
            out.clear();
            env.dev.poll_cq(cq, 4, &mut out).expect("poll_cq");
            t2.fetch_add(out.len() as u64, SeqCst);
            mine.extend(out.iter().cloned());
            if out.is_empty() && !env.virtual_time {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        mine
    });
    let mut all = HashSet::new();
    for (t, mine) in got.iter().enumerate().take(THREADS) {
        let mut last = [None::<u64>; 2];
        for wc in mine {
            assert_eq!(wc.status, S::Success, "{wc:?}");
            assert!(all.insert(wc.wr_id), "WR {} taken twice", wc.wr_id);
            let q = usize::from(wc.qp_num == q2);
            assert_eq!(wc.wr_id % 2, q as u64, "{wc:?} on the wrong QP");
            assert!(
                last[q] < Some(wc.wr_id),
                "thread {t}: QP {} out of order at {wc:?}",
                wc.qp_num
            );
            last[q] = Some(wc.wr_id);
        }
    }
    assert_eq!(all.len() as u64, want, "completions taken");
    Outcome::Pass
}

fn srq_from_threads(env: &Env) -> Outcome {
    let pd = env.pd();
    let per = PER_THREAD as u32;
    let srq = env
        .dev
        .create_srq(
            pd,
            &SrqAttr {
                max_wr: THREADS as u32 * per,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .expect("create_srq");
    let cap = QpCap {
        max_send_wr: per,
        ..default_cap()
    };
    let pairs: Vec<Pair> = (0..THREADS)
        .map(|_| env.pair_on_srq(pd, srq, cap, 2 * per))
        .collect();
    let got = env.on_threads(THREADS, THREADS_WAIT, move |env, t| {
        let p = &pairs[t];
        // Receives into this thread's b buffer; any QP on the SRQ may consume them.
        let wrs: Vec<_> = (0..PER_THREAD)
            .map(|k| RecvWr::new(wr_id(t, k), vec![p.b.sge(k * 64, 64)]))
            .collect();
        for wr in wrs {
            env.dev.post_srq_recv(srq, &[wr]).expect("post_srq_recv");
        }
        for k in 0..PER_THREAD {
            p.a.buf.write(k as usize * 64, &pattern(t, k)).unwrap();
            env.post_send(
                p.a.qpn,
                SendWr::send(k, vec![p.a.sge(k * 64, 64)]).signaled(),
            );
        }
        let sent = poll_n(env, p.a.cq, PER_THREAD as usize);
        assert!(sent.iter().all(|w| w.status == S::Success), "{sent:?}");
        (p.b.clone(), poll_n(env, p.b.cq, PER_THREAD as usize))
    });
    let bufs: Vec<_> = got.iter().map(|(b, _)| b.buf.clone()).collect();
    let mut taken = HashSet::new();
    let mut messages = HashSet::new();
    for (t, (b, wcs)) in got.iter().enumerate() {
        for wc in wcs {
            assert_eq!(
                (wc.status, wc.qp_num, wc.byte_len),
                (S::Success, b.qpn, 64),
                "thread {t}: {wc:?}"
            );
            assert!(
                taken.insert(wc.wr_id),
                "receive {:#x} consumed twice",
                wc.wr_id
            );
            let (owner, k) = ((wc.wr_id >> 32) as usize, wc.wr_id & 0xFFFF_FFFF);
            let mut m = [0u8; 64];
            bufs[owner].read(k as usize * 64, &mut m).unwrap();
            assert!(
                m == pattern(m[0] as usize, u64::from(m[1])),
                "receive {:#x} holds {m:?}",
                wc.wr_id
            );
            assert_eq!(
                m[0] as usize, t,
                "a message of thread {} arrived on QP {}",
                m[0], b.qpn
            );
            assert!(
                messages.insert((m[0], m[1])),
                "message {:?} received twice",
                (m[0], m[1])
            );
        }
    }
    assert_eq!(messages.len(), THREADS * PER_THREAD as usize);
    Outcome::Pass
}

/// Posts `wr(i)`, signaled, for i = 0, 1, ... on `p.a` until a completion is not a
/// success, polling as it goes, while `act` runs on another thread once 32 completed;
/// then polls every accepted WR's completion. Returns what the poster saw.
fn post_until_failure(
    env: &Env,
    p: &Pair,
    wr: impl Fn(u64) -> SendWr + Send + Sync + 'static,
    act: impl Fn(&Env) + Send + Sync + 'static,
) -> Posted {
    let done = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicU64::new(0));
    let (pp, d, c) = (p.clone(), done.clone(), completed.clone());
    let mut got = env.on_threads(2, THREADS_WAIT, move |env, role| {
        let mut seen = Posted::default();
        if role == 1 {
            when_under_way(&c, &d, || act(env));
            return seen;
        }
        let deadline = Instant::now() + THREADS_WAIT;
        for i in 0.. {
            assert!(Instant::now() < deadline, "no WR failed");
            if seen.wcs.iter().any(|wc| wc.status != S::Success) {
                break;
            }
            let after = d.load(SeqCst);
            match env.dev.post_send(pp.a.qpn, &[wr(i).signaled()]) {
                Ok(()) => {
                    seen.accepted.push(i);
                    if after && seen.first_after.is_none() {
                        seen.first_after = Some(i);
                    }
                }
                Err(e) if e.error.errno() == super::errno::ENOMEM => {}
                Err(e) => panic!("post {i}: {e:?}"),
            }
            let before = seen.wcs.len();
            drain(env, pp.a.cq, &mut seen.wcs);
            c.fetch_add((seen.wcs.len() - before) as u64, SeqCst);
            if !env.virtual_time && seen.wcs.len() == before {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        while seen.wcs.len() < seen.accepted.len() {
            let wc = env.poll_one(pp.a.cq);
            seen.wcs.push(wc);
        }
        seen
    });
    got.swap_remove(0)
}

fn err_while_posting(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let qpn = p.a.qpn;
    let pp = p.clone();
    let wr = move |i| SendWr::rdma_write(i, vec![pp.a.sge(0, 8)], pp.b.addr(0), pp.b.mr.rkey);
    let seen = post_until_failure(env, &p, wr, move |env| {
        let attr = verbs_api::QpAttr {
            qp_state: verbs_api::QpState::Err,
            ..Default::default()
        };
        env.dev
            .modify_qp(qpn, &attr, verbs_api::QpAttrMask::STATE)
            .expect("modify_qp to ERR");
    });
    let ids: Vec<_> = seen.wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(
        ids, seen.accepted,
        "every accepted WR completes once, in order"
    );
    env.assert_no_completion(p.a.cq, Duration::from_millis(20));
    let first = seen
        .wcs
        .iter()
        .position(|w| w.status != S::Success)
        .expect("a WR was flushed");
    for wc in &seen.wcs[first..] {
        assert_eq!(wc.status, S::WrFlushErr, "{wc:?}");
    }
    // The poster may have seen the flush before it posted again.
    if let Some(after) = seen.first_after {
        assert!(
            seen.wcs[..first].iter().all(|w| w.wr_id < after),
            "a WR posted after the QP went to ERR succeeded"
        );
    }
    Outcome::Pass
}

fn resize_while_polling(env: &Env) -> Outcome {
    let total: u64 = if env.emulator { 2000 } else { 400 };
    const WINDOW: u64 = 16;
    let cap = QpCap {
        max_send_wr: WINDOW as u32,
        ..default_cap()
    };
    let p = env.pair_with(QpType::Rc, &env.params(), cap, 2 * WINDOW as u32);
    let done = Arc::new(AtomicU64::new(0));
    let got = env.on_threads(3, THREADS_WAIT, move |env, role| {
        let deadline = Instant::now() + THREADS_WAIT;
        match role {
            0 => {
                for i in 0..total {
                    while i - done.load(SeqCst) >= WINDOW {
                        assert!(Instant::now() < deadline, "the poller stopped at {i}");
                        std::thread::yield_now();
                    }
                    let wr = SendWr::rdma_write(i, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey);
                    env.post_send(p.a.qpn, wr.signaled());
                }
                Vec::new()
            }
            1 => (0..total)
                .map(|_| {
                    let wc = env.poll_one(p.a.cq);
                    assert_eq!(wc.status, S::Success, "{wc:?}");
                    done.fetch_add(1, SeqCst);
                    wc.wr_id
                })
                .collect(),
            _ => {
                // Sizes from two windows up, never below what may be queued.
                let mut k = 0u32;
                while done.load(SeqCst) < total {
                    assert!(Instant::now() < deadline, "the poller stopped");
                    let cqe = 2 * WINDOW as u32 + (k % 8) * 16;
                    env.dev.resize_cq(p.a.cq, cqe).expect("resize_cq");
                    k += 1;
                    std::thread::yield_now();
                }
                vec![u64::from(k)]
            }
        }
    });
    assert_eq!(got[1], (0..total).collect::<Vec<_>>(), "completion order");
    assert!(got[2][0] > 0, "the CQ was never resized");
    Outcome::Pass
}
