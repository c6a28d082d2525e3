//! Unit tests and proptests of the ring (Miri runs the ones on the heap region).

use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use crate::{pair, Bell, Consumer, Error, Producer, Region};

fn packet(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed * 31 + i * 7) as u8).collect()
}

#[test]
fn round_trip_in_order_across_the_wrap() {
    let (mut tx, mut rx) = pair(256, 64).unwrap();
    let mut buf = vec![0; rx.max_len()];
    // 100 packets through a 32-word ring: every record crosses the end some time.
    for i in 0..100 {
        let p = packet(i, i % 65);
        tx.push(&p).unwrap();
        let n = rx.pop(&mut buf).unwrap().unwrap();
        assert_eq!(&buf[..n], &p[..]);
    }
    assert_eq!(rx.pop(&mut buf).unwrap(), None);
}

#[test]
fn full_then_room_again() {
    let (mut tx, mut rx) = pair(128, 24).unwrap();
    // 16 words; a 24-byte packet's record is one line (8 words): two fit, the third
    // does not.
    for i in 0..2 {
        tx.push(&packet(i, 24)).unwrap();
    }
    assert!(matches!(tx.push(&packet(2, 24)), Err(Error::Full)));
    let mut buf = [0; 24];
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(24));
    assert_eq!(buf.to_vec(), packet(0, 24));
    tx.push(&packet(2, 24)).unwrap();
}

#[test]
fn too_big_and_small_buffer() {
    let (mut tx, mut rx) = pair(1024, 100).unwrap();
    assert!(matches!(
        tx.push(&[0; 101]),
        Err(Error::TooBig { len: 101, max: 100 })
    ));
    tx.push(&[7; 50]).unwrap();
    let mut small = [0; 10];
    assert!(matches!(
        rx.pop(&mut small),
        Err(Error::TooBig { len: 50, max: 10 })
    ));
    // The packet stayed.
    let mut buf = [0; 100];
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(50));
    assert_eq!(buf[..50], [7; 50]);
}

#[test]
fn one_producer_one_consumer() {
    let r = Arc::new(Region::heap(1024, 64).unwrap());
    let _tx = Producer::attach(r.clone()).unwrap();
    let _rx = Consumer::attach(r.clone()).unwrap();
    assert!(matches!(Producer::attach(r.clone()), Err(Error::Busy)));
    assert!(matches!(Consumer::attach(r), Err(Error::Busy)));
}

#[test]
fn closed_both_ways() {
    let (mut tx, mut rx) = pair(1024, 64).unwrap();
    tx.push(b"last").unwrap();
    drop(tx);
    let mut buf = [0; 64];
    // What was sent before the producer left is still read, then Closed.
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(4));
    assert!(matches!(rx.pop(&mut buf), Err(Error::Closed)));
    let (mut tx, rx) = pair(1024, 64).unwrap();
    drop(rx);
    assert!(matches!(tx.push(b"x"), Err(Error::Closed)));
}

#[test]
fn bad_geometry_is_refused() {
    assert!(matches!(Region::heap(1024, 0), Err(Error::Invalid(_))));
    assert!(matches!(
        Region::heap(1024, crate::MAX_LEN + 1),
        Err(Error::Invalid(_))
    ));
    // A small capacity grows to hold two of the longest packets.
    let r = Region::heap(8, 4096).unwrap();
    assert!(r.capacity() >= 2 * (4096 + 8));
}

#[test]
fn garbage_in_the_identity_is_refused() {
    let r = Arc::new(Region::heap(1024, 64).unwrap());
    r.header().ident.magic.store(1, Relaxed);
    assert!(matches!(
        Producer::attach(r.clone()),
        Err(Error::Corrupt(_))
    ));
    let r = Arc::new(Region::heap(1024, 64).unwrap());
    r.header().ident.words.store(1 << 40, Relaxed);
    assert!(matches!(
        Consumer::attach(r.clone()),
        Err(Error::Corrupt(_))
    ));
    let r = Arc::new(Region::heap(1024, 64).unwrap());
    r.header().ident.words.store(100, Relaxed);
    assert!(matches!(
        Consumer::attach(r.clone()),
        Err(Error::Corrupt(_))
    ));
    let r = Arc::new(Region::heap(1024, 64).unwrap());
    r.header().ident.max_len.store(1 << 30, Relaxed);
    assert!(matches!(Consumer::attach(r), Err(Error::Corrupt(_))));
}

#[test]
fn impossible_indices_and_lengths_are_corrupt_and_poison() {
    let r = Arc::new(Region::heap(1024, 64).unwrap());
    let mut tx = Producer::attach(r.clone()).unwrap();
    let mut rx = Consumer::attach(r.clone()).unwrap();
    let mut buf = [0; 64];
    // A head more than the ring ahead of the tail.
    r.header().head.store(10_000, SeqCst);
    assert!(matches!(rx.pop(&mut buf), Err(Error::Corrupt(_))));
    // Poisoned: even with the head put back.
    r.header().head.store(0, SeqCst);
    assert!(matches!(rx.pop(&mut buf), Err(Error::Corrupt(_))));
    assert!(matches!(rx.wait(None), Err(Error::Corrupt(_))));
    // A tail ahead of the head, seen when the producer needs room.
    for _ in 0..13 {
        tx.push(&[0; 64]).unwrap_or(());
    }
    r.header().tail.store(u64::MAX, SeqCst);
    let mut err = None;
    for _ in 0..20 {
        if let Err(e) = tx.push(&[0; 64]) {
            err = Some(e);
            break;
        }
    }
    assert!(matches!(err, Some(Error::Corrupt(_))), "{err:?}");

    // A length word above max_len, and one longer than what was published.
    let r = Arc::new(Region::heap(1024, 64).unwrap());
    let mut tx = Producer::attach(r.clone()).unwrap();
    let mut rx = Consumer::attach(r.clone()).unwrap();
    tx.push(&[1; 8]).unwrap();
    r.data()[0].store(65, SeqCst);
    assert!(matches!(rx.pop(&mut buf), Err(Error::Corrupt(_))));
    let r = Arc::new(Region::heap(1024, 64).unwrap());
    let mut tx = Producer::attach(r.clone()).unwrap();
    let mut rx = Consumer::attach(r.clone()).unwrap();
    tx.push(&[1; 8]).unwrap();
    r.data()[0].store(64, SeqCst);
    assert!(matches!(rx.pop(&mut buf), Err(Error::Corrupt(_))));
    r.data()[0].store(1 << 32 | 8, SeqCst);
    assert!(matches!(rx.pop(&mut buf), Err(Error::Corrupt(_))));
}

#[test]
fn threads_with_sleeping_consumer() {
    let (mut tx, mut rx) = pair(4096, 256).unwrap();
    let n = if cfg!(miri) { 50 } else { 20_000 };
    let t = std::thread::spawn(move || {
        let mut buf = vec![0; 256];
        let mut next = 0;
        loop {
            match rx.pop(&mut buf) {
                Ok(Some(len)) => {
                    assert_eq!(buf[..len], packet(next, next % 257)[..]);
                    next += 1;
                }
                Ok(None) => rx.wait(None).unwrap(),
                Err(Error::Closed) => return next,
                Err(e) => panic!("{e}"),
            }
        }
    });
    for i in 0..n {
        let p = packet(i, i % 257);
        loop {
            match tx.push(&p) {
                Ok(()) => break,
                Err(Error::Full) => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        if i % 97 == 0 {
            // Let the consumer fall asleep now and then.
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    drop(tx);
    assert_eq!(t.join().unwrap(), n);
}

#[test]
fn wait_times_out_on_an_empty_ring() {
    let (_tx, mut rx) = pair(1024, 64).unwrap();
    rx.wait(Some(Duration::from_millis(1))).unwrap();
    let mut buf = [0; 64];
    assert_eq!(rx.pop(&mut buf).unwrap(), None);
}

#[test]
#[cfg_attr(miri, ignore = "Miri has no memfd or mmap")]
fn shared_mapping_between_two_opens() {
    // Two mappings of one memfd, as two processes would have them.
    let a = Arc::new(Region::create_shared("test-ring", 64 * 1024, 4224).unwrap());
    let path = a.path().unwrap();
    let b = Arc::new(Region::open_shared(&path).unwrap());
    assert_eq!(a.capacity(), b.capacity());
    let mut tx = Producer::attach(a).unwrap();
    let mut rx = Consumer::attach(b.clone()).unwrap();
    assert!(matches!(Consumer::attach(b), Err(Error::Busy)));
    let mut buf = vec![0; rx.max_len()];
    for i in 0..1000 {
        let p = packet(i, i * 13 % 4225);
        tx.push(&p).unwrap();
        let n = rx.pop(&mut buf).unwrap().unwrap();
        assert_eq!(buf[..n], p[..]);
    }
}

#[test]
#[cfg_attr(miri, ignore = "Miri has no memfd or mmap")]
fn unsealed_or_odd_files_are_refused() {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    use std::os::fd::AsRawFd;
    let fd = memfd_create("unsealed", MFdFlags::MFD_CLOEXEC).unwrap();
    nix::unistd::ftruncate(&fd, 8192).unwrap();
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    assert!(matches!(
        Region::open_shared(path.as_ref()),
        Err(Error::Corrupt(_))
    ));
    assert!(matches!(
        Region::open_shared("/nonexistent/ring".as_ref()),
        Err(Error::Io(_))
    ));
}

/// One step of a proptest run.
#[derive(Clone, Debug)]
enum Op {
    Push(usize),
    Pop,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![(0usize..=300).prop_map(Op::Push), Just(Op::Pop)],
        0..200,
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 256 },
        ..ProptestConfig::default()
    })]

    /// Any sequence of pushes and pops returns the packets pushed, in order, and
    /// refuses a push only when the ring has no room for it.
    #[test]
    fn any_sequence_round_trips_in_order(ops in ops(), cap in 64usize..2048) {
        let (mut tx, mut rx) = pair(cap, 300).unwrap();
        let words = rx.capacity() / 8;
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        let mut used = 0;
        let mut buf = vec![0; 300];
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Push(len) => {
                    let p = packet(i, len);
                    let need = crate::ring::record_words(len);
                    match tx.push(&p) {
                        Ok(()) => { used += need; model.push_back(p); }
                        Err(Error::Full) => prop_assert!(used + need > words),
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                }
                Op::Pop => match rx.pop(&mut buf).unwrap() {
                    Some(n) => {
                        let p = model.pop_front().unwrap();
                        used -= crate::ring::record_words(p.len());
                        prop_assert_eq!(&buf[..n], &p[..]);
                    }
                    None => prop_assert!(model.is_empty()),
                },
            }
        }
    }

    /// A peer that writes garbage into any word of the header or the data while a pair
    /// works never makes either side panic or read out of bounds: each call succeeds
    /// (with a packet no longer than `max_len`) or fails with a ring error, and a side
    /// that saw `Corrupt` stays so.
    #[test]
    fn garbage_from_the_peer_is_an_error(
        steps in prop::collection::vec((0usize..4, any::<u64>(), 0usize..200, 0usize..=100), 0..150),
    ) {
        let r = Arc::new(Region::heap(512, 100).unwrap());
        let mut tx = Producer::attach(r.clone()).unwrap();
        let mut rx = Consumer::attach(r.clone()).unwrap();
        let (mut tx_bad, mut rx_bad) = (false, false);
        let mut buf = vec![0; 100];
        for (kind, value, at, len) in steps {
            match kind {
                0 => match tx.push(&packet(at, len)) {
                    Ok(()) => prop_assert!(!tx_bad),
                    Err(Error::Corrupt(_)) => tx_bad = true,
                    Err(Error::Full) => prop_assert!(!tx_bad),
                    Err(e) => prop_assert!(false, "{e}"),
                },
                1 => match rx.pop(&mut buf) {
                    Ok(Some(n)) => prop_assert!(n <= 100 && !rx_bad),
                    Ok(None) => prop_assert!(!rx_bad),
                    Err(Error::Corrupt(_)) => rx_bad = true,
                    Err(e) => prop_assert!(false, "{e}"),
                },
                2 => {
                    // Scribble on a header word.
                    let h = r.header();
                    match at % 7 {
                        0 => h.head.store(value, SeqCst),
                        1 => h.tail.store(value, SeqCst),
                        2 => h.ident.words.store(value, SeqCst),
                        3 => h.ident.max_len.store(value, SeqCst),
                        4 => h.ident.magic.store(value, SeqCst),
                        5 => h.sleeping.store(value as u32 & 1, SeqCst),
                        _ => h.state.store(value as u32 & !0xC, SeqCst),
                    }
                }
                _ => {
                    let d = r.data();
                    d[at % d.len()].store(value, SeqCst);
                }
            }
        }
    }
}

/// The child side of `two_processes`: does nothing unless run by it.
#[test]
#[cfg_attr(miri, ignore = "Miri has no memfd or mmap")]
fn two_processes_child() {
    let Some(path) = std::env::var_os("SHM_RING_TEST_PEER") else {
        return;
    };
    let r = Arc::new(Region::open_shared(path.as_ref()).unwrap());
    let mut tx = Producer::attach(r.clone()).unwrap();
    for i in 0..2000 {
        let p = packet(i, i % 4000);
        while let Err(e) = tx.push(&p) {
            assert!(matches!(e, Error::Full), "{e}");
            std::thread::yield_now();
        }
    }
    // Once the parent has them all, it turns hostile, and dies without a word.
    while r.header().tail.load(SeqCst) != r.header().head.load(SeqCst) {
        std::thread::yield_now();
    }
    r.header().head.fetch_add(1 << 40, SeqCst);
    std::process::exit(0);
}

/// Two processes: the child maps the parent's ring through its /proc path, sends 2000
/// packets (the parent sleeps on the futex when the ring is empty: the wake-up crosses
/// processes), then writes an impossible head and exits: the parent has every packet,
/// then `Corrupt`, and goes on.
#[test]
#[cfg_attr(miri, ignore = "Miri has no memfd, mmap or processes")]
fn two_processes() {
    let r = Arc::new(Region::create_shared("two-processes", 16 * 1024, 4096).unwrap());
    let mut rx = Consumer::attach(r.clone()).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tests::two_processes_child", "--nocapture", "-q"])
        .env("SHM_RING_TEST_PEER", r.path().unwrap())
        .spawn()
        .unwrap();
    let mut buf = vec![0; rx.max_len()];
    let mut next = 0;
    let end = loop {
        match rx.pop(&mut buf) {
            Ok(Some(n)) => {
                assert_eq!(buf[..n], packet(next, next % 4000)[..]);
                next += 1;
            }
            Ok(None) => rx.wait(Some(Duration::from_millis(100))).unwrap(),
            Err(e) => break e,
        }
    };
    assert!(child.wait().unwrap().success());
    assert_eq!(next, 2000);
    assert!(matches!(end, Error::Corrupt(_)), "{end}");
}

#[test]
fn parts_are_one_packet() {
    let (mut tx, mut rx) = pair(256, 64).unwrap();
    let mut buf = [0; 64];
    // Across the wrap too: 40 rounds through a 32-word ring.
    for i in 0..40 {
        let (a, b, c) = (packet(i, 8), packet(i + 1, 16), packet(i + 2, i % 30));
        tx.push_parts(&[&a, &b, &c]).unwrap();
        let n = rx.pop(&mut buf).unwrap().unwrap();
        assert_eq!(buf[..n], [a, b, c].concat()[..]);
    }
    assert!(matches!(
        tx.push_parts(&[&[1; 7], &[2; 8]]),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        tx.push_parts(&[&[0; 40], &[0; 25]]),
        Err(Error::TooBig { len: 65, max: 64 })
    ));
}

#[test]
fn a_sleeper_tells_a_closed_ring() {
    let (mut tx, mut rx) = pair(1024, 64).unwrap();
    tx.push(b"last").unwrap();
    drop(tx);
    // A packet still to take: not closed, and the wait returns at once.
    let s = rx.sleeper();
    assert!(!s.closed());
    s.wait(None).unwrap();
    let mut buf = [0; 64];
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(4));
    // Drained: closed, and the wait still returns (it would never be woken).
    let s = rx.sleeper();
    assert!(s.closed());
    s.wait(None).unwrap();
}

/// The consumer of several rings that sleeps on their bell, as emu-core's link does:
/// takes what every ring holds, picks up the rings announced in `mailbox` when the
/// generation moves, sleeps on the bell when nothing came; returns each producer's
/// packets (their first word) once `producers` rings were closed.
fn consume_with_bell(
    bell: &Bell,
    mailbox: &std::sync::Mutex<Vec<Consumer>>,
    producers: usize,
) -> Vec<Vec<u64>> {
    let mut got = vec![Vec::new(); producers];
    let mut rings: Vec<Consumer> = Vec::new();
    let (mut seen, mut closed) = (0, 0);
    let mut buf = [0u8; 64];
    while closed < producers {
        let g = bell.generation();
        if g != seen {
            rings.append(&mut mailbox.lock().unwrap());
            seen = g;
        }
        let mut any = false;
        rings.retain_mut(|rx| loop {
            match rx.pop(&mut buf) {
                Ok(Some(n)) => {
                    assert_eq!(n, 16);
                    let k = u64::from_le_bytes(buf[..8].try_into().unwrap());
                    got[k as usize].push(u64::from_le_bytes(buf[8..16].try_into().unwrap()));
                    any = true;
                }
                Ok(None) => return true,
                Err(Error::Closed) => {
                    closed += 1;
                    return false;
                }
                Err(e) => panic!("{e}"),
            }
        });
        if !any && closed < producers {
            let sleepers: Vec<_> = rings.iter().map(Consumer::sleeper).collect();
            bell.wait(&sleepers, seen, None);
        }
    }
    got
}

#[test]
fn several_producers_wake_one_bell() {
    let bell = Bell::heap().unwrap();
    let mailbox = Arc::new(std::sync::Mutex::new(Vec::new()));
    let n: u64 = if cfg!(miri) { 30 } else { 5000 };
    let threads: Vec<_> = (0..3u64)
        .map(|k| {
            let (bell, mailbox) = (bell.clone(), mailbox.clone());
            std::thread::spawn(move || {
                let r = Arc::new(Region::heap(1024, 64).unwrap());
                let mut tx = Producer::attach_with_bell(r.clone(), &bell).unwrap();
                mailbox.lock().unwrap().push(Consumer::attach(r).unwrap());
                bell.announce();
                for i in 0..n {
                    let mut p = [0u8; 16];
                    p[..8].copy_from_slice(&k.to_le_bytes());
                    p[8..].copy_from_slice(&i.to_le_bytes());
                    loop {
                        match tx.push(&p) {
                            Ok(()) => break,
                            Err(Error::Full) => std::thread::yield_now(),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    if i % 89 == k {
                        // Let the consumer fall asleep now and then.
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
            })
        })
        .collect();
    let got = consume_with_bell(&bell, &mailbox, 3);
    for t in threads {
        t.join().unwrap();
    }
    for g in got {
        assert_eq!(g, (0..n).collect::<Vec<_>>());
    }
}

#[test]
fn a_bell_wait_times_out_and_sees_the_generation() {
    let bell = Bell::heap().unwrap();
    let (mut tx, rx) = pair(1024, 64).unwrap();
    let s = [rx.sleeper()];
    bell.wait(&s, 0, Some(Duration::from_millis(1)));
    // A generation not seen, or a packet, returns at once.
    bell.announce();
    assert_eq!(bell.generation(), 1);
    bell.wait(&s, 0, None);
    tx.push(b"x").unwrap();
    assert!(s[0].ready());
    bell.wait(&s, 1, None);
}

#[test]
#[cfg_attr(miri, ignore = "Miri has no memfd or mmap")]
fn bells_and_rings_are_not_mistaken_for_each_other() {
    let bell = Bell::create_shared("test-bell").unwrap();
    let ring = Region::create_shared("test-ring", 4096, 64).unwrap();
    let shared = Bell::open_shared(&bell.path().unwrap()).unwrap();
    shared.announce();
    assert_eq!(bell.generation(), 1);
    assert!(matches!(
        Bell::open_shared(&ring.path().unwrap()),
        Err(Error::Corrupt(_))
    ));
    assert!(matches!(
        Region::open_shared(&bell.path().unwrap()),
        Err(Error::Corrupt(_))
    ));
}

#[test]
fn producers_that_leave_the_wake_up_to_the_caller() {
    // The consumer sleeps in its own blocking call (a channel standing in for the
    // socket it polls); the producer's caller sends on it when a push says so.
    let bell = Bell::heap().unwrap();
    let r = Arc::new(Region::heap(1024, 64).unwrap());
    let mut tx2 = Producer::attach_with_bell(r.clone(), &bell).unwrap();
    let mut rx2 = Consumer::attach(r).unwrap();
    tx2.caller_wakes();
    let (wake, woken) = std::sync::mpsc::channel::<()>();
    let n: u64 = if cfg!(miri) { 20 } else { 2000 };
    let c = {
        let bell = bell.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            let mut next = 0u64;
            while next < n {
                match rx2.pop(&mut buf).unwrap() {
                    Some(8) => {
                        assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), next);
                        next += 1;
                    }
                    Some(len) => panic!("{len}"),
                    None => {
                        let s = [rx2.sleeper()];
                        bell.sleep(&s, 0, || woken.recv().unwrap());
                    }
                }
            }
        })
    };
    for i in 0..n {
        while let Err(Error::Full) = tx2.push(&i.to_le_bytes()) {
            std::thread::yield_now();
        }
        if tx2.wake_owed() {
            wake.send(()).unwrap();
        }
        if i % 97 == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    c.join().unwrap();
}

/// A record is taken on its header alone, before the producer publishes the head: the
/// head then lags the consumer's tail, which is no error; a head ahead of the tail with
/// no header published there is.
#[test]
fn the_header_publishes_and_the_head_may_lag() {
    assert_eq!(crate::ring::past(8, 0, 15), Some(8));
    assert_eq!(
        crate::ring::past(0, 8, 15),
        Some(0),
        "a head one record behind"
    );
    assert_eq!(crate::ring::past(0, 40, 15), None);
    assert_eq!(crate::ring::past(40, 0, 15), None);
    let r = Arc::new(Region::heap(1024, 64).unwrap());
    let mut rx = Consumer::attach(r.clone()).unwrap();
    let mut buf = [0; 64];
    assert_eq!(rx.pop(&mut buf).unwrap(), None);
    // A head that says a record is there, and no header: corrupt, and poisoned.
    r.header().head.store(8, SeqCst);
    assert!(matches!(rx.pop(&mut buf), Err(Error::Corrupt(_))));
    assert!(matches!(rx.pop(&mut buf), Err(Error::Corrupt(_))));
}
