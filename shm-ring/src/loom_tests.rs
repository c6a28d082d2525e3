//! The ring's protocol under loom, which runs every interleaving (within its bounds) of
//! a producer and a consumer thread: no packet is lost, duplicated or reordered, a
//! consumer that sleeps is always woken (a lost wake-up would leave it asleep for ever:
//! loom reports the deadlock), and the producer's leaving is always seen; and the same
//! of two producers on two rings and one consumer that sleeps on their doorbell, one
//! ring announced while the consumer runs; and two threads asleep on one bell at once.
//!
//! `RUSTFLAGS="--cfg loom" cargo test -p shm-ring --release --lib loom`

use loom::thread;

use crate::{pair, Error};

/// The consumer's loop: take what is there, sleep when the ring is empty, stop at
/// `Closed`; returns the packets' first bytes.
fn consume(mut rx: crate::Consumer) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 16];
    loop {
        match rx.pop(&mut buf) {
            Ok(Some(n)) => {
                assert!(buf[..n].iter().all(|b| *b == buf[0]));
                got.push(buf[0]);
            }
            Ok(None) => rx.wait(None).unwrap(),
            Err(Error::Closed) => return got,
            Err(e) => panic!("{e}"),
        }
    }
}

/// The model with at most `bound` preemptions a run (three, as tokio's CI bounds it:
/// the producer's retries on a full ring make the unbounded space too large to walk),
/// or `LOOM_MAX_PREEMPTIONS` if set.
fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(bound);
    }
    b.check(f);
}

#[test]
fn loom_no_lost_packet_or_wake_up() {
    model(3, || {
        // Room for two 8-byte packets (two words each) out of four words: the third
        // push may find the ring full and must wait for the consumer.
        let (mut tx, rx) = pair(32, 8).unwrap();
        let c = thread::spawn(move || consume(rx));
        for i in 1..=3u8 {
            loop {
                match tx.push(&[i; 8]) {
                    Ok(()) => break,
                    Err(Error::Full) => thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
            }
        }
        drop(tx);
        assert_eq!(c.join().unwrap(), vec![1, 2, 3]);
    });
}

#[test]
fn loom_wake_up_without_close() {
    // The consumer must be woken by a push alone (the producer stays).
    model(3, || {
        let (mut tx, mut rx) = pair(32, 8).unwrap();
        let c = thread::spawn(move || {
            let mut buf = [0u8; 8];
            loop {
                match rx.pop(&mut buf).unwrap() {
                    Some(n) => return (n, buf[0]),
                    None => rx.wait(None).unwrap(),
                }
            }
        });
        tx.push(&[9; 5]).unwrap();
        assert_eq!(c.join().unwrap(), (5, 9));
        drop(tx);
    });
}

#[test]
fn loom_two_producers_one_bell() {
    // Two producers, each on its own ring, wake one consumer through its bell: the
    // first ring is there from the start, the second is made and announced by its
    // producer meanwhile.
    // Two preemptions: with three this model walks for eight minutes, a sixth of
    // CI's run; after a change to the bell, run it with `LOOM_MAX_PREEMPTIONS=3`.
    use crate::{Bell, Consumer, Producer, Region};
    use loom::sync::{Arc, Mutex};
    model(2, || {
        let bell = Bell::heap().unwrap();
        let r1 = std::sync::Arc::new(Region::heap(32, 8).unwrap());
        let mut tx1 = Producer::attach_with_bell(r1.clone(), &bell).unwrap();
        let mut rings = vec![Consumer::attach(r1).unwrap()];
        let mailbox = Arc::new(Mutex::new(Vec::new()));
        let p1 = thread::spawn(move || {
            tx1.push(&[1; 8]).unwrap();
        });
        let (b2, m2) = (bell.clone(), mailbox.clone());
        let p2 = thread::spawn(move || {
            let r2 = std::sync::Arc::new(Region::heap(32, 8).unwrap());
            let mut tx2 = Producer::attach_with_bell(r2.clone(), &b2).unwrap();
            m2.lock().unwrap().push(Consumer::attach(r2).unwrap());
            b2.announce();
            tx2.push(&[2; 8]).unwrap();
        });
        // Take packets until both rings are closed (each producer leaves after its
        // packet), sleeping on the bell whenever nothing came.
        let (mut got, mut seen, mut closed) = (Vec::new(), 0, 0);
        let mut buf = [0u8; 8];
        while closed < 2 {
            let g = bell.generation();
            if g != seen {
                rings.append(&mut mailbox.lock().unwrap());
                seen = g;
            }
            let mut any = false;
            rings.retain_mut(|rx| loop {
                match rx.pop(&mut buf) {
                    Ok(Some(n)) => {
                        assert_eq!(n, 8);
                        got.push(buf[0]);
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
            if !any && closed < 2 {
                let sleepers: Vec<_> = rings.iter().map(Consumer::sleeper).collect();
                bell.wait(&sleepers, seen, None);
            }
        }
        got.sort_unstable();
        assert_eq!(got, vec![1, 2]);
        p1.join().unwrap();
        p2.join().unwrap();
    });
}

#[test]
fn loom_two_sleepers_one_bell() {
    // Two threads of one consumer sleep on its bell at once (a device's thread and an
    // application thread waiting for an event); one of them leaves its sleep for
    // another reason (its `poll(2)` returned for a socket) while the other still
    // sleeps: the producer's packet must still wake that one. A flag that the first
    // to leave cleared lost this wake-up.
    use crate::{Bell, Consumer, Producer, Region};
    model(3, || {
        let bell = Bell::heap().unwrap();
        let r = std::sync::Arc::new(Region::heap(32, 8).unwrap());
        let mut tx = Producer::attach_with_bell(r.clone(), &bell).unwrap();
        let rx = Consumer::attach(r).unwrap();
        let (s1, s2) = (rx.sleeper(), rx.sleeper());
        let seen = bell.generation();
        let b1 = bell.clone();
        let a = thread::spawn(move || {
            b1.sleep(std::slice::from_ref(&s1), seen, || {});
        });
        let b2 = bell.clone();
        let b = thread::spawn(move || {
            while !s2.ready() {
                b2.wait(std::slice::from_ref(&s2), seen, None);
            }
        });
        tx.push(&[7; 8]).unwrap();
        a.join().unwrap();
        b.join().unwrap();
        drop(rx);
    });
}
