//! Ping-pong through two rings between two threads, busy-polling and sleeping on the
//! futex, beside the same ping-pong over two UDP sockets on 127.0.0.1 busy-polling: the
//! half round trip each way, to judge what a same-host link could give
//! (`cargo run --release -p shm-ring --example pingpong -- [ROUNDS] [SIZE]`).

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use shm_ring::{pair, Consumer, Error, Producer};

fn ring_pong(mut rx: Consumer, mut tx: Producer, rounds: usize, sleep: bool) {
    let mut buf = vec![0; rx.max_len()];
    for _ in 0..rounds {
        let n = loop {
            match rx.pop(&mut buf).unwrap() {
                Some(n) => break n,
                None if sleep => rx.wait(Some(Duration::from_millis(100))).unwrap(),
                None => std::hint::spin_loop(),
            }
        };
        while let Err(Error::Full) = tx.push(&buf[..n]) {}
    }
}

fn rings(rounds: usize, size: usize, sleep: bool) -> Duration {
    let (tx_a, rx_a) = pair(1 << 20, 4224).unwrap();
    let (tx_b, rx_b) = pair(1 << 20, 4224).unwrap();
    let t = std::thread::spawn(move || ring_pong(rx_a, tx_b, rounds, sleep));
    let (mut tx, mut rx) = (tx_a, rx_b);
    let msg = vec![1u8; size];
    let mut buf = vec![0; 4224];
    let start = Instant::now();
    for _ in 0..rounds {
        tx.push(&msg).unwrap();
        loop {
            match rx.pop(&mut buf).unwrap() {
                Some(_) => break,
                None if sleep => rx.wait(Some(Duration::from_millis(100))).unwrap(),
                None => std::hint::spin_loop(),
            }
        }
    }
    let d = start.elapsed();
    t.join().unwrap();
    d
}

fn udp(rounds: usize, size: usize) -> Duration {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    a.connect(b.local_addr().unwrap()).unwrap();
    b.connect(a.local_addr().unwrap()).unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let t = std::thread::spawn(move || {
        let mut buf = vec![0; 65536];
        for _ in 0..rounds {
            let n = loop {
                if let Ok(n) = b.recv(&mut buf) {
                    break n;
                }
            };
            b.send(&buf[..n]).unwrap();
        }
    });
    let msg = vec![1u8; size];
    let mut buf = vec![0; 65536];
    let start = Instant::now();
    for _ in 0..rounds {
        a.send(&msg).unwrap();
        while a.recv(&mut buf).is_err() {}
    }
    let d = start.elapsed();
    t.join().unwrap();
    d
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(100_000, |a| a.parse().unwrap());
    let size: usize = args.next().map_or(64, |a| a.parse().unwrap());
    let half = |d: Duration| d.as_secs_f64() * 1e6 / rounds as f64 / 2.0;
    let spin = half(rings(rounds, size, false));
    let sleep = half(rings(rounds / 10, size, true));
    let udp = half(udp(rounds, size));
    println!("{size}-byte ping-pong, half round trip: rings busy-poll {spin:.3} us, rings with futex sleep {sleep:.3} us, UDP busy-poll {udp:.3} us; rings/UDP busy {:.2}x", spin / udp);
}
