//! The ring's protocol under loom, which runs every interleaving (within its bounds) of
//! a producer and a consumer thread: no packet is lost, duplicated or reordered, a
//! consumer that sleeps is always woken (a lost wake-up would leave it asleep for ever:
//! loom reports the deadlock), and the producer's leaving is always seen.
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

/// The model with at most three preemptions a run (as tokio's CI bounds it: the
/// producer's retries on a full ring make the unbounded space too large to walk), or
/// `LOOM_MAX_PREEMPTIONS` if set.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

#[test]
fn loom_no_lost_packet_or_wake_up() {
    model(|| {
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
    model(|| {
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
