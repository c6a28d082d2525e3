//! No heap allocation per packet on the data path (issue #5): once two engines are
//! connected and warmed up, posting RDMA WRITEs and SENDs, moving every packet
//! (requests and ACKs) between them and polling the completions allocates nothing.
//! Counted by `allocation-counter`'s allocator on this thread (the engine is sans-IO:
//! everything runs here).

mod util;

use emu_core::engine::Engine;
use util::*;
use verbs_api::{Mtu, RecvWr, SendWr, WcStatus, WorkCompletion, WrOperation};

/// Moves every packet either engine has to send to the other until both are quiet.
fn pump(p: &mut Engines, buf: &mut [u8]) -> usize {
    let now = p.now;
    let mut moved = 0;
    loop {
        let mut any = false;
        for (from, to) in [(Side::A, Side::B), (Side::B, Side::A)] {
            while let Some(t) = p.engine(from).poll_transmit(now, buf) {
                p.engine(to).handle_datagram(now, gid(from), &buf[..t.size]);
                moved += 1;
                any = true;
            }
        }
        if !any {
            return moved;
        }
    }
}

fn drain(e: &mut Engine, node: &Node, wcs: &mut Vec<WorkCompletion>) -> usize {
    wcs.clear();
    e.poll_cq(node.cq, 64, wcs).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    wcs.len()
}

#[test]
fn the_data_path_allocates_nothing_per_packet() {
    let cfg = Config {
        mtu: Mtu::Mtu1024,
        ..Config::default()
    };
    let (mut p, a, b) = connected(cfg);
    // Built once: the application's WRs (a WRITE of 4 packets, a SEND of 2), reposted.
    let write =
        [SendWr::rdma_write(1, vec![a.sge(0, 4096)], b.mr.addr + 8192, b.mr.rkey).signaled()];
    let send = [SendWr::new(2, vec![a.sge(0, 2000)], WrOperation::Send).signaled()];
    let recv = [RecvWr::new(3, vec![b.sge(0, 4096)])];
    let mut buf = vec![0u8; 8192];
    let mut wcs = Vec::with_capacity(64);
    let round = |p: &mut Engines, wcs: &mut Vec<WorkCompletion>, buf: &mut [u8]| {
        let now = p.now;
        p.b.post_recv(now, b.qpn, &recv).unwrap();
        p.a.post_send(now, a.qpn, &write).unwrap();
        p.a.post_send(now, a.qpn, &send).unwrap();
        let moved = pump(p, buf);
        let done = drain(&mut p.a, &a, wcs) + drain(&mut p.b, &b, wcs);
        assert_eq!(done, 3, "two sends and one receive complete");
        moved
    };
    // The counter is live: one box is one allocation.
    let boxed = allocation_counter::measure(|| drop(std::hint::black_box(Box::new(7u64))));
    assert_eq!(boxed.count_total, 1);
    // Warm-up: queues, maps and CQ rings reach their working sizes.
    for _ in 0..200 {
        round(&mut p, &mut wcs, &mut buf);
    }
    let mut packets = 0;
    let info = allocation_counter::measure(|| {
        for _ in 0..1000 {
            packets += round(&mut p, &mut wcs, &mut buf);
        }
    });
    assert!(packets >= 6000, "{packets} packets moved");
    assert_eq!(
        info.count_total, 0,
        "{} allocations for {packets} packets",
        info.count_total
    );
}
