//! The fabric under programs written against `verbs_api` only: every RC operation,
//! and each fault the fabric offers, checked by what the program and the devices see.

use std::time::Duration;

use emu_sims::pair::{pair, Host, PairConfig};
use emu_sims::{Cause, Fabric, Fate, LinkConfig, Rule};
use emu_wire::Opcode;
use verbs_api::{SendWr, WcOpcode, WcStatus};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn ok(wcs: &[verbs_api::WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// WRITE, SEND, READ, compare-and-swap and fetch-and-add through the Device trait and
/// the RAII handles, byte-exact.
#[test]
fn every_rc_operation_through_the_device_trait() {
    let f = Fabric::new(1);
    let (a, b) = pair(&f, &PairConfig::default());
    let data = pattern(5000, 3);
    a.mem.write(0, &data).unwrap();
    a.post(&[SendWr::rdma_write(
        1,
        vec![a.sge(0, 5000)],
        b.addr(0),
        b.rkey(),
    )]);
    assert_eq!(ok(&a.wait(1)), [(1, WcStatus::Success)]);
    let mut got = vec![0; 5000];
    b.mem.read(0, &mut got).unwrap();
    assert_eq!(got, data);

    b.post_recv(7, 8192, 2000);
    a.post(&[SendWr::send(2, vec![a.sge(100, 1500)])]);
    assert_eq!(ok(&a.wait(1)), [(2, WcStatus::Success)]);
    let r = b.wait(1);
    assert_eq!(ok(&r), [(7, WcStatus::Success)]);
    assert_eq!((r[0].opcode, r[0].byte_len), (WcOpcode::Recv, 1500));
    b.mem.read(8192, &mut got[..1500]).unwrap();
    assert_eq!(got[..1500], data[100..1600]);

    a.post(&[SendWr::rdma_read(
        3,
        vec![a.sge(10_000, 3000)],
        b.addr(1000),
        b.rkey(),
    )]);
    assert_eq!(ok(&a.wait(1)), [(3, WcStatus::Success)]);
    a.mem.read(10_000, &mut got[..3000]).unwrap();
    assert_eq!(got[..3000], data[1000..4000]);

    b.mem.write_u64(20_000, 41).unwrap();
    a.post(&[
        SendWr::atomic_fetch_add(4, a.sge(20_000, 8), b.addr(20_000), b.rkey(), 1),
        SendWr::atomic_cmp_swp(5, a.sge(20_008, 8), b.addr(20_000), b.rkey(), 42, 7),
    ]);
    assert_eq!(
        ok(&a.wait(2)),
        [(4, WcStatus::Success), (5, WcStatus::Success)]
    );
    assert_eq!(a.mem.read_u64(20_000).unwrap(), 41);
    assert_eq!(a.mem.read_u64(20_008).unwrap(), 42);
    assert_eq!(b.mem.read_u64(20_000).unwrap(), 7);
    // Virtual time moved only as far as the packets needed: no timeouts.
    assert!(f.now() < Duration::from_millis(1), "{:?}", f.now());
    assert_eq!(a.dev.counters().ack_timeouts, 0);
}

/// 10 MB through a link that loses, duplicates, reorders and corrupts: RC delivers
/// every byte once; the corrupted packets are caught by the ICRC and counted.
#[test]
fn rc_survives_a_bad_link_and_the_icrc_catches_every_corruption() {
    let f = Fabric::new(42);
    let cfg = PairConfig {
        timeout: 8, // ~1 ms
        ..PairConfig::default()
    };
    let (a, b) = pair(&f, &cfg);
    let bad = LinkConfig {
        loss: 0.02,
        duplicate: 0.02,
        corrupt: 0.02,
        latency: Duration::from_micros(2),
        jitter: Duration::from_micros(3),
        ..LinkConfig::default()
    };
    f.set_link("a", "b", bad).unwrap();
    let data = pattern(60_000, 9);
    a.mem.write(0, &data).unwrap();
    let n = 20;
    for i in 0..n {
        a.post(&[SendWr::rdma_write(
            i,
            vec![a.sge(0, 60_000)],
            b.addr(0),
            b.rkey(),
        )]);
    }
    let wcs = a.wait(n as usize);
    assert_eq!(wcs.len(), n as usize);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let mut got = vec![0; 60_000];
    b.mem.read(0, &mut got).unwrap();
    assert_eq!(got, data);
    let t = f.trace();
    let corrupted_to = |dev: &Host| {
        let idx = t.devices.iter().position(|d| d.name == dev.name).unwrap();
        t.packets
            .iter()
            .filter(|p| p.dst == Some(idx) && matches!(p.fate, Fate::Corrupted(_)))
            .map(|p| p.arrivals.len() as u64)
            .sum::<u64>()
    };
    let (ca, cb) = (corrupted_to(&a), corrupted_to(&b));
    assert!(ca + cb > 0, "the seed should corrupt something");
    assert_eq!(
        a.dev
            .link_counters()
            .icrc_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        ca
    );
    assert_eq!(
        b.dev
            .link_counters()
            .icrc_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        cb
    );
    assert!(t
        .packets
        .iter()
        .any(|p| p.fate == Fate::Dropped(Cause::Random)));
    assert!(t
        .packets
        .iter()
        .any(|p| p.fate == Fate::Duplicated(Cause::Random)));
    // Reordering happened: some packet arrived before one sent earlier on its direction.
    let arrivals: Vec<(u64, Duration)> = t
        .packets
        .iter()
        .filter(|p| p.src == 0 && p.fate == Fate::Delivered && !p.arrivals.is_empty())
        .map(|p| (p.index, p.arrivals[0]))
        .collect();
    assert!(arrivals.windows(2).any(|w| w[1].1 < w[0].1));
    assert!(a.dev.counters().retransmissions > 0);
}

/// Packets over the MTU are dropped (and a path MTU that fits gets through).
#[test]
fn mtu_drops_oversize_packets() {
    let f = Fabric::new(1);
    let (a, b) = pair(
        &f,
        &PairConfig {
            retry_cnt: 1,
            timeout: 4,
            ..PairConfig::default()
        },
    );
    // 1024-byte payload + 12 BTH + 16 RETH + 4 ICRC + 28 = 1084 > 1000.
    f.set_direction(
        "a",
        "b",
        LinkConfig {
            mtu: Some(1000),
            ..LinkConfig::default()
        },
    )
    .unwrap();
    a.post(&[SendWr::rdma_write(
        1,
        vec![a.sge(0, 1024)],
        b.addr(0),
        b.rkey(),
    )]);
    assert_eq!(ok(&a.wait(1)), [(1, WcStatus::RetryExcErr)]);
    let t = f.trace();
    assert!(t
        .packets
        .iter()
        .filter(|p| p.src == 0)
        .all(|p| p.fate == Fate::Dropped(Cause::Mtu)));
    assert_eq!(t.packets.iter().filter(|p| p.src == 0).count(), 2);
}

/// A finite queue at a line rate: a burst beyond it is tail-dropped, and RC recovers.
#[test]
fn bandwidth_queue_tail_drops_a_burst() {
    let f = Fabric::new(1);
    let (a, b) = pair(
        &f,
        &PairConfig {
            timeout: 8,
            ..PairConfig::default()
        },
    );
    f.set_direction(
        "a",
        "b",
        LinkConfig {
            bandwidth: Some(1_000_000_000),
            queue_bytes: 4096,
            ..LinkConfig::default()
        },
    )
    .unwrap();
    a.post(&[SendWr::rdma_write(
        1,
        vec![a.sge(0, 32_768)],
        b.addr(0),
        b.rkey(),
    )]);
    assert_eq!(ok(&a.wait(1)), [(1, WcStatus::Success)]);
    let t = f.trace();
    assert!(t
        .packets
        .iter()
        .any(|p| p.fate == Fate::Dropped(Cause::QueueFull)));
    // 1 Gb/s: the WRITE MIDDLE (1024 + 12 BTH + 4 ICRC + 42 Ethernet/IP/UDP = 1082
    // bytes) leaves one frame time, 8.656 us, after the WRITE FIRST before it.
    let w: Vec<Duration> = t.packets.iter().take(2).map(|p| p.arrivals[0]).collect();
    assert_eq!(w[1] - w[0], Duration::from_nanos(8656));
}

/// Partition: nothing crosses until heal; RC retries across it and completes.
#[test]
fn partition_and_heal() {
    let f = Fabric::new(1);
    let (a, b) = pair(
        &f,
        &PairConfig {
            timeout: 10,
            ..PairConfig::default()
        },
    );
    f.partition("a", "b").unwrap();
    a.post(&[SendWr::rdma_write(
        1,
        vec![a.sge(0, 64)],
        b.addr(0),
        b.rkey(),
    )]);
    f.run_for(Duration::from_millis(10));
    assert!(a.cq.poll(1, &mut Vec::new()).unwrap() == 0);
    f.heal("a", "b").unwrap();
    assert_eq!(ok(&a.wait(1)), [(1, WcStatus::Success)]);
    let t = f.trace();
    assert_eq!(t.packets[0].fate, Fate::Dropped(Cause::Partition));
    assert!(t.packets.last().unwrap().fate == Fate::Delivered);
}

/// Hold a direction, release it: the held packets arrive after the release, in
/// order, and not before.
#[test]
fn hold_and_release() {
    let f = Fabric::new(1);
    let (a, b) = pair(&f, &PairConfig::default());
    f.hold("a", "b").unwrap();
    a.post(&[
        SendWr::rdma_write(1, vec![a.sge(0, 64)], b.addr(0), b.rkey()),
        SendWr::rdma_write(2, vec![a.sge(0, 64)], b.addr(64), b.rkey()),
    ]);
    f.run_for(Duration::from_micros(500));
    let t = f.trace();
    assert_eq!(t.packets.len(), 2);
    assert!(t
        .packets
        .iter()
        .all(|p| p.fate == Fate::Held && p.arrivals.is_empty()));
    f.release("a", "b").unwrap();
    assert_eq!(
        ok(&a.wait(2)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let t = f.trace();
    assert!(t.packets[0].arrivals[0] >= Duration::from_micros(500));
    assert!(t.packets[0].arrivals[0] <= t.packets[1].arrivals[0]);
}

/// The listed per-packet rules, each seen in the trace and by the engine.
#[test]
fn rules_act_on_the_packets_they_name() {
    let f = Fabric::new(1);
    let (a, b) = pair(&f, &PairConfig::default());
    let corrupt = f.add_rule(Rule::corrupt_icrc_of_packet(1));
    a.post(&[SendWr::rdma_write(
        1,
        vec![a.sge(0, 64)],
        b.addr(0),
        b.rkey(),
    )]);
    assert_eq!(ok(&a.wait(1)), [(1, WcStatus::Success)]);
    assert_eq!(f.rule_fired(corrupt), 1);
    assert_eq!(
        b.dev
            .link_counters()
            .icrc_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        a.dev.counters().ack_timeouts,
        1,
        "the corrupted WRITE was resent"
    );

    f.clear_rules();
    let dup = f.add_rule(Rule::duplicate_packet(1));
    a.post(&[SendWr::rdma_write(
        2,
        vec![a.sge(0, 64)],
        b.addr(0),
        b.rkey(),
    )]);
    assert_eq!(ok(&a.wait(1)), [(2, WcStatus::Success)]);
    assert_eq!(f.rule_fired(dup), 1);
    assert_eq!(b.dev.counters().duplicate_requests, 1);

    f.clear_rules();
    let rnr = f.add_rule(Rule::rnr_nak_next_send(a.qp.qpn(), 1));
    b.post_recv(1, 0, 64);
    a.post(&[SendWr::send(3, vec![a.sge(0, 8)])]);
    assert_eq!(ok(&a.wait(1)), [(3, WcStatus::Success)]);
    assert_eq!(f.rule_fired(rnr), 1);
    assert_eq!(a.dev.counters().rnr_naks_received, 1);
    assert_eq!(b.dev.counters().rnr_naks_sent, 0, "the fabric made it up");
    let t = f.trace();
    assert!(t
        .packets
        .iter()
        .any(|p| matches!(p.fate, Fate::Injected(_))));

    f.clear_rules();
    let drop = f.add_rule(Rule::drop_nth(Opcode::RcRdmaWriteMiddle, 2));
    a.post(&[SendWr::rdma_write(
        4,
        vec![a.sge(0, 5000)],
        b.addr(0),
        b.rkey(),
    )]);
    assert_eq!(ok(&a.wait(1)), [(4, WcStatus::Success)]);
    assert_eq!(f.rule_fired(drop), 1);
    assert!(b.dev.counters().seq_naks_sent >= 1);
}

/// Same seed, same program: the same packets at the same virtual times, byte for byte
/// (addresses compared label-relative, see `Trace::canonical_bytes`); another seed
/// gives another trace.
#[test]
fn same_seed_same_trace() {
    let run = |seed| {
        let f = Fabric::new(seed);
        let (a, b) = pair(
            &f,
            &PairConfig {
                timeout: 8,
                ..PairConfig::default()
            },
        );
        f.set_default_link(LinkConfig::default());
        f.set_link(
            "a",
            "b",
            LinkConfig {
                loss: 0.05,
                duplicate: 0.05,
                corrupt: 0.05,
                jitter: Duration::from_micros(4),
                ..LinkConfig::default()
            },
        )
        .unwrap();
        for i in 0..5 {
            b.post_recv(i, 0, 4096);
            a.post(&[
                SendWr::rdma_write(i, vec![a.sge(0, 3000)], b.addr(0), b.rkey()),
                SendWr::send(100 + i, vec![a.sge(0, 2000)]),
                SendWr::rdma_read(200 + i, vec![a.sge(8192, 2500)], b.addr(0), b.rkey()),
            ]);
        }
        assert_eq!(a.wait(15).len(), 15);
        let t = f.trace();
        (t.lines(), t.canonical_bytes())
    };
    let (l1, b1) = run(5);
    let (l2, b2) = run(5);
    assert!(l1.len() > 40);
    assert_eq!(l1, l2);
    assert_eq!(b1, b2);
    assert_ne!(run(6).0, l1);
}
