//! An idle RC QP costs at most 1 KiB beyond its queues (issue #32 item 4: 100,000 RC
//! QPs on one device). Counted by `allocation-counter`'s allocator on this thread (the
//! engine is sans-IO: everything runs here): the bytes the engine holds after creating
//! 100,000 RC QPs and bringing each to RTS against a peer, with no traffic, over the
//! number of QPs. The engine allocates a queue's slots as work requests are posted
//! (an idle QP has none), so every byte counted is beyond the queues; what the slots
//! cost once a QP's queues are full is printed beside it.
//! A memory bound, not a timing: the figure is printed (`--nocapture`).

mod util;

use emu_core::engine::Engine;
use util::*;
use verbs_api::{CqId, PdId, QpCap, QpInitAttr, QpType};

/// QPs on the one engine: the scale.
const QPS: u32 = 100_000;

/// The cap the bench's QPs ask for (`rdma-emu bench write_bw --qps 100000 --tx-depth
/// 800000`: eight WRs a QP, twice that in receives).
const CAP: QpCap = QpCap::new(8, 16);

fn create(e: &mut Engine, pd: PdId, cq: CqId) -> u32 {
    e.create_qp(QpInitAttr::new(pd, cq, QpType::Rc, CAP))
        .unwrap()
}

/// Creates `n` RC QPs on `e` and brings each to RTS towards QP `peer_base + i` of
/// side B; returns their numbers.
fn idle_qps(p: &mut Engines, pd: PdId, cq: CqId, n: u32, peer_base: u32) -> Vec<u32> {
    let cfg = Config {
        cap: CAP,
        timeout: 16,
        ..Config::default()
    };
    let now = p.now;
    (0..n)
        .map(|i| {
            let qpn = create(&mut p.a, pd, cq);
            let remote = Remote {
                qpn: peer_base + i,
                gid: gid(Side::B),
                psn: (i * 7919) & 0xFF_FFFF,
            };
            bring_up(
                &mut p.a,
                now,
                qpn,
                remote,
                (i * 7919) & 0xFF_FFFF ^ 0x5555,
                &cfg,
            );
            qpn
        })
        .collect()
}

#[test]
fn an_idle_rc_qp_costs_at_most_1_kib_beyond_its_queues() {
    let mut p = Engines::default();
    let pd = p.a.alloc_pd().unwrap();
    let cq = p.a.create_cq(1 << 14).unwrap();
    // The counter is live: one box is one allocation of its size.
    let boxed = allocation_counter::measure(|| drop(std::hint::black_box(Box::new(7u64))));
    assert_eq!((boxed.count_total, boxed.bytes_total), (1, 8));
    // Grow what is per engine rather than per QP (the timer index, the scheduler)
    // with one QP first, so that it is not charged to the many.
    idle_qps(&mut p, pd, cq, 1, 0x10);
    let mut qpns = Vec::new();
    let info = allocation_counter::measure(|| {
        qpns = idle_qps(&mut p, pd, cq, QPS, 0x1000);
    });
    // The vector of numbers is the test's, not the engine's.
    let held = info.bytes_current - (qpns.capacity() * std::mem::size_of::<u32>()) as i64;
    // Nothing was sent: the QPs are idle, not drained.
    let mut buf = vec![0u8; emu_core::engine::MAX_PACKET];
    assert!(p.a.poll_transmit(p.now, &mut buf).is_none());
    // What the queues cost once full, for the record: an idle QP holds none of it.
    let full = full_queue_bytes(&mut p, pd, cq);
    let per_qp = held as f64 / f64::from(QPS);
    println!(
        "{QPS} idle RC QPs at RTS: {per_qp:.0} bytes each beyond their queues ({:.2} \
         allocations each); their queues, once full ({} sends, {} receives): {full} bytes",
        info.count_current as f64 / f64::from(QPS),
        CAP.max_send_wr,
        CAP.max_recv_wr,
    );
    assert!(
        per_qp <= 1024.0,
        "an idle RC QP holds {per_qp:.0} bytes beyond its queues (bound: 1024)"
    );
}

/// The bytes one more QP's queues take once filled to the cap.
fn full_queue_bytes(p: &mut Engines, pd: PdId, cq: CqId) -> i64 {
    let qpn = idle_qps(p, pd, cq, 1, 0x20);
    let qpn = qpn[0];
    let buf = verbs_api::MemBuf::new(4096);
    let mr =
        p.a.reg_mr(pd, &buf, 0, 4096, verbs_api::AccessFlags::LOCAL_WRITE)
            .unwrap();
    let sge = verbs_api::Sge {
        addr: mr.addr,
        length: 8,
        lkey: mr.lkey,
    };
    let now = p.now;
    let recvs: Vec<_> = (0..u64::from(CAP.max_recv_wr))
        .map(|i| verbs_api::RecvWr::new(i, vec![sge]))
        .collect();
    let sends: Vec<_> = (0..u64::from(CAP.max_send_wr))
        .map(|i| verbs_api::SendWr::new(i, vec![sge], verbs_api::WrOperation::Send))
        .collect();
    allocation_counter::measure(|| {
        p.a.post_recv(now, qpn, &recvs).unwrap();
        p.a.post_send(now, qpn, &sends).unwrap();
    })
    .bytes_current
}
