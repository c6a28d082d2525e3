//! An empty `poll_cq` on UDP receives in the caller's thread, a system call; after
//! one found nothing, the polls of the device's other CQs skip theirs for a while
//! (`nic/empty_polls.rs`), and the polls of one CQ in a loop never do. Then a
//! completion still comes to whichever CQ is polled.

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use device_util::{connect, post_recv, side};
use emu_core::nic::{EmuConfig, EmuDevice, SameHost};
use verbs_api::{
    AccessFlags, CqId, Device, QpParams, QpType, SendWr, Sge, WcStatus, WorkCompletion,
};

mod device_util;

/// A device on 127.0.97.`host`, on the first free port from 47000.
fn open(name: &str, host: u8) -> EmuDevice {
    (0..64u16)
        .find_map(|i| {
            EmuDevice::open(EmuConfig {
                name: name.into(),
                ip: Ipv4Addr::new(127, 0, 97, host).into(),
                port: 47000 + i,
                ..EmuConfig::default()
            })
            .ok()
        })
        .expect("a free port")
}

fn skipped(dev: &EmuDevice) -> u64 {
    dev.link_counters().skipped_receives.load(Ordering::Relaxed)
}

#[test]
fn other_cqs_skip_the_receive_after_an_empty_one() {
    let dev = open("emptypolls0", 1);
    let cqs: Vec<_> = (0..8).map(|_| dev.create_cq(16, None).unwrap()).collect();
    let mut out = Vec::new();

    // One CQ polled in a loop reads the socket every time.
    for _ in 0..200 {
        assert_eq!(dev.poll_cq(cqs[0], 16, &mut out).unwrap(), 0);
    }
    assert_eq!(skipped(&dev), 0);

    // Eight in turn: the turns that run within the span skip seven receives each.
    // A turn the scheduler stretches past it receives more, so count the turns
    // that skipped all seven and ask for most of them.
    let mut whole = 0;
    for _ in 0..200 {
        let before = skipped(&dev);
        for &cq in &cqs {
            assert_eq!(dev.poll_cq(cq, 16, &mut out).unwrap(), 0);
        }
        if skipped(&dev) - before == 7 {
            whole += 1;
        }
    }
    assert!(whole >= 100, "{whole} of 200 turns skipped seven receives");
}

/// Polls every CQ of `cqs` in turn until one gives a completion: its index and the
/// completion.
fn poll_turns(dev: &EmuDevice, cqs: &[CqId]) -> (usize, WorkCompletion) {
    let mut out = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        for (i, &cq) in cqs.iter().enumerate() {
            if dev.poll_cq(cq, 1, &mut out).unwrap() > 0 {
                return (i, out.remove(0));
            }
        }
    }
    panic!("no completion in 10 s");
}

#[test]
fn a_completion_comes_to_the_cq_polled_after_the_skipping_ones() {
    let (da, db) = (open("emptypolls1", 2), open("emptypolls2", 3));
    let (a, b) = (
        side(&da, QpType::Rc, 64, AccessFlags::LOCAL_WRITE),
        side(&db, QpType::Rc, 64, AccessFlags::LOCAL_WRITE),
    );
    connect(&da, &a, &db, &b, QpType::Rc, &QpParams::default());
    post_recv(&db, &b, 7, 0, 64);
    // B's receive CQ is the last of four it polls in turn.
    let mut cqs: Vec<CqId> = (0..3).map(|_| db.create_cq(16, None).unwrap()).collect();
    cqs.push(b.cq);
    // B polls them in turn before anything comes: its polls skip.
    let mut out = Vec::new();
    for _ in 0..50 {
        for &cq in &cqs {
            assert_eq!(db.poll_cq(cq, 1, &mut out).unwrap(), 0);
        }
    }
    assert!(skipped(&db) > 0);
    a.buf.write(0, b"skipped").unwrap();
    let wr = SendWr::send(1, vec![Sge::new(a.mr.addr, 7, a.mr.lkey)]);
    da.post_send(a.qpn, &[wr]).unwrap();
    let (i, wc) = poll_turns(&db, &cqs);
    assert_eq!(
        (i, wc.wr_id, wc.status, wc.byte_len),
        (3, 7, WcStatus::Success, 7)
    );
    let mut got = [0u8; 7];
    b.buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"skipped");
}

/// An auto device whose peer sends through the shared-memory rings: an empty receive
/// is a read of memory then (the UDP socket is read only now and then), so no poll
/// skips it, whatever CQ it polls.
#[test]
fn an_auto_device_with_rings_skips_no_receive() {
    let open_auto = |name: &str, host: u8, port: u16| {
        EmuDevice::open(EmuConfig {
            name: name.into(),
            ip: Ipv4Addr::new(127, 0, 97, host).into(),
            port,
            same_host: SameHost::Auto,
            ..EmuConfig::default()
        })
    };
    let (da, db) = (0..64u16)
        .find_map(|i| {
            let port = 47100 + i;
            Some((
                open_auto("emptypolls3", 4, port).ok()?,
                open_auto("emptypolls4", 5, port).ok()?,
            ))
        })
        .expect("a free port");
    let (a, b) = (
        side(&da, QpType::Rc, 64, AccessFlags::LOCAL_WRITE),
        side(&db, QpType::Rc, 64, AccessFlags::LOCAL_WRITE),
    );
    connect(&da, &a, &db, &b, QpType::Rc, &QpParams::default());
    post_recv(&db, &b, 7, 0, 64);
    let wr = SendWr::send(1, vec![Sge::new(a.mr.addr, 7, a.mr.lkey)]);
    da.post_send(a.qpn, &[wr]).unwrap();
    let (_, wc) = poll_turns(&db, &[b.cq]);
    assert_eq!(wc.status, WcStatus::Success);
    let through_rings = db.link_counters().shm_packets.load(Ordering::Relaxed);
    assert!(through_rings > 0, "the SEND came through the rings");
    let cqs: Vec<_> = (0..8).map(|_| db.create_cq(16, None).unwrap()).collect();
    let mut out = Vec::new();
    for _ in 0..200 {
        for &cq in &cqs {
            assert_eq!(db.poll_cq(cq, 16, &mut out).unwrap(), 0);
        }
    }
    assert_eq!(skipped(&db), 0);
}
