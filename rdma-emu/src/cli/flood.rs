//! `rdma-emu bench flood`: how a device takes junk, against what the host can do.
//!
//! 1. **Discard rate**: one thread sends datagrams of random bytes (`--size` bytes,
//!    default 1024) to a socket as fast as it can for two seconds, first to a raw
//!    `recvmmsg` loop (quinn-udp's, 16 slots, GRO on: what a program that only drains
//!    its socket does), then to an emulated device; each side's rate is what it took
//!    off its socket, and what the kernel dropped for the device is shown beside
//!    (`rx_overflow`). Target: the device at >= 0.5x the raw loop.
//! 2. **RC under junk**: RC WRITE bandwidth (64 KiB messages, every byte checked) and
//!    RDMA WRITE ping-pong latency (8 bytes), each quiet and then with junk arriving at
//!    the server's device at half the raw loop's rate, paced every millisecond.
//!    Targets: bandwidth >= 0.5x the quiet run's, latency within 2x. Beside them, the
//!    bandwidth with the same junk sent to a socket of its own on 127.0.0.3, drained
//!    by a raw loop: what the host pays for the junk, with no device in its way.
//!
//! The devices run at default settings (timeout 14, retry count 7). `--rounds N`
//! repeats part 2 (quiet and junk back to back in each round) and reports the median.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use quinn_udp::{RecvMeta, UdpSockRef, UdpSocketState};
use rand::{Rng, SeedableRng};

use super::bench::{self, BenchOpts, Test};

/// How long each discard measurement sends.
const SEND_FOR: Duration = Duration::from_secs(2);

/// Datagrams of random bytes to `to`, as fast as one thread can (`rate` None) or
/// `rate` a second, until `stop`; returns how many were sent.
fn junk(to: SocketAddrV4, size: usize, rate: Option<f64>, stop: &AtomicBool) -> u64 {
    let Ok(s) = UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 9), 0)) else {
        return 0;
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(size as u64);
    let mut bufs: Vec<Vec<u8>> = (0..64)
        .map(|_| (0..size).map(|_| rng.gen()).collect())
        .collect();
    // A few short ones too: truncated headers.
    bufs[0].truncate(7);
    let start = Instant::now();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if let Some(r) = rate {
            let due = (start.elapsed().as_secs_f64() * r) as u64;
            if sent >= due {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        }
        if s.send_to(&bufs[(sent % 64) as usize], to).is_ok() {
            sent += 1;
        }
    }
    sent
}

/// Sends junk from a thread while `f` runs; returns `f`'s result and what was sent.
fn with_junk<R>(
    to: SocketAddrV4,
    size: usize,
    rate: Option<f64>,
    f: impl FnOnce() -> R,
) -> (R, u64) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sender = scope.spawn(|| junk(to, size, rate, &stop));
        let r = f();
        stop.store(true, Ordering::Relaxed);
        (r, sender.join().unwrap_or(0))
    })
}

/// Takes datagrams off `sock` with `recvmmsg` until `stop`, counting them into
/// `drained` (a GRO run counts as its datagrams).
fn drain(sock: &UdpSocket, stop: &AtomicBool, drained: &AtomicU64) -> Result<(), String> {
    let state = UdpSocketState::new(UdpSockRef::from(sock)).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .map_err(|e| e.to_string())?;
    let _ = socket2::SockRef::from(sock).set_recv_buffer_size(8 << 20);
    let mut slots = vec![vec![0u8; 64 << 10]; 16];
    let mut meta = vec![RecvMeta::default(); 16];
    loop {
        let mut iov: Vec<std::io::IoSliceMut<'_>> = slots
            .iter_mut()
            .map(|s| std::io::IoSliceMut::new(s))
            .collect();
        match state.recv(UdpSockRef::from(sock), &mut iov, &mut meta) {
            Ok(n) => {
                let d: usize = meta[..n]
                    .iter()
                    .map(|m| m.len.div_ceil(m.stride.max(1)))
                    .sum();
                drained.fetch_add(d as u64, Ordering::Relaxed);
            }
            Err(_) if stop.load(Ordering::Relaxed) => return Ok(()),
            Err(_) => {}
        }
    }
}

/// Runs `f` while junk goes at `rate` a second to a socket of its own on 127.0.0.3,
/// drained by a raw `recvmmsg` loop: what the host pays for the junk itself, with no
/// emulated device in its way.
fn with_junk_at_sink<R>(
    port: u16,
    size: usize,
    rate: f64,
    f: impl FnOnce() -> R,
) -> Result<R, String> {
    let addr = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 3), port);
    let sock = UdpSocket::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    let drained = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let drainer = scope.spawn(|| drain(&sock, &stop, &drained));
        let (r, _) = with_junk(addr, size, Some(rate), f);
        stop.store(true, Ordering::Relaxed);
        drainer.join().unwrap_or(Ok(())).map(|()| r)
    })
}

/// Datagrams per second a raw `recvmmsg` loop takes off a socket flooded by one
/// sender, and the sender's rate.
fn raw_rate(port: u16, size: usize) -> Result<(f64, f64), String> {
    let addr = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 3), port);
    let sock = UdpSocket::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    let drained = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let (_, sent) = std::thread::scope(|scope| {
        let drainer = scope.spawn(|| drain(&sock, &stop, &drained));
        let r = with_junk(addr, size, None, || std::thread::sleep(SEND_FOR));
        stop.store(true, Ordering::Relaxed);
        let _ = drainer.join();
        r
    });
    let secs = SEND_FOR.as_secs_f64();
    Ok((
        drained.load(Ordering::Relaxed) as f64 / secs,
        sent as f64 / secs,
    ))
}

/// What `dev` dropped as junk so far: bad ICRCs, malformed packets, unknown QPs.
fn discarded(dev: &EmuDevice) -> u64 {
    let (c, l) = (dev.counters(), dev.link_counters());
    l.icrc_errors.load(Ordering::Relaxed) + c.rx_malformed + c.rx_unknown_qp
}

/// The same flood at an emulated device: what it discarded a second, what the kernel
/// dropped for it, and the sender's rate.
fn device_rate(port: u16, size: usize) -> Result<(f64, u64, f64), String> {
    let ip = Ipv4Addr::new(127, 0, 0, 4);
    let dev = EmuDevice::open(EmuConfig {
        name: "flood".into(),
        ip: ip.into(),
        port,
        ..EmuConfig::default()
    })
    .map_err(|e| format!("open the device on {ip}:{port}: {e}"))?;
    let (_, sent) = with_junk(SocketAddrV4::new(ip, port), size, None, || {
        std::thread::sleep(SEND_FOR)
    });
    // Let it finish what is queued, and read the kernel's count (once a second).
    let mut last = discarded(&dev);
    loop {
        std::thread::sleep(Duration::from_millis(1200));
        let now = discarded(&dev);
        if now == last {
            break;
        }
        last = now;
    }
    let kernel = dev.link_counters().rx_overflow.load(Ordering::Relaxed);
    let secs = SEND_FOR.as_secs_f64();
    Ok((last as f64 / secs, kernel, sent as f64 / secs))
}

/// The flood bench's own rules, after the ones every test shares (`bench::check`):
/// a junk datagram's size, and no option it would ignore.
pub(crate) fn check(o: &BenchOpts) -> Result<(), String> {
    let size = o.size.unwrap_or(1024);
    if !(1..=65_507).contains(&size) {
        return Err(format!("--size {size}: a junk datagram is 1..=65507 bytes"));
    }
    // Part 2 runs one QP, on UDP, byte-exact, polled; it has no baseline of its own
    // and no JSON line.
    for (given, option) in [
        (o.qps != 1, "--qps"),
        (o.fabric, "--fabric"),
        (o.link != bench::LinkKind::Udp, "--link"),
        (o.two_processes, "--two-processes"),
        (o.events, "--events"),
        (o.wait_send, "--wait-send"),
        (o.no_baseline, "--no-baseline"),
        (o.json, "--json"),
    ] {
        if given {
            return Err(format!("{option} is not for flood"));
        }
    }
    bench::check_queues(o)
}

/// Runs the flood bench (see the module docs); `o` has passed [`check`].
pub(crate) fn run(o: &BenchOpts) -> Result<(), String> {
    let size = o.size.unwrap_or(1024) as usize;
    let port = o
        .port
        .unwrap_or(20000 + (std::process::id() % 20000) as u16);
    println!("{}", bench::line());
    println!("                    Junk flood");
    println!(" Junk            : {size}-byte datagrams of random bytes, one sender");
    bench::print_build();
    println!("{}", bench::line());
    let (raw, raw_sent) = raw_rate(port, size)?;
    let (dev, kernel, dev_sent) = device_rate(port, size)?;
    println!(" raw recvmmsg loop: {raw:.0} datagrams/s taken (sender {raw_sent:.0}/s)");
    println!(
        " device         : {dev:.0} datagrams/s discarded, {kernel} dropped by the kernel (sender {dev_sent:.0}/s)"
    );
    println!(" ratio (higher is better, target 0.5): {:.2}x", dev / raw);
    println!("{}", bench::line());

    // RC WRITE bandwidth and latency, quiet and under junk at half the raw rate; each
    // round measures both back to back, and the median round is reported.
    let rate = raw / 2.0;
    let server = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), port);
    let mut bw = o.clone();
    bw.test = Test::WriteBw;
    bw.size = Some(65536);
    bw.verify = true;
    let iters = o.iters.unwrap_or(8192);
    let mut lat = o.clone();
    lat.test = Test::WriteLat;
    lat.size = Some(8);
    let mut bws = Vec::new();
    let mut sinks = Vec::new();
    let mut lats = Vec::new();
    for round in 1..=o.rounds {
        let quiet = bench::measure_bw(&bw, iters)?;
        let (loud, sent) = with_junk(server, size, Some(rate), || bench::measure_bw(&bw, iters));
        let loud = loud?;
        let sink = with_junk_at_sink(port, size, rate, || bench::measure_bw(&bw, iters))??;
        let q = bench::measure_lat(&lat, 5000)?.typical;
        let (l, lsent) = with_junk(server, size, Some(rate), || bench::measure_lat(&lat, 5000));
        let l = l?.typical;
        println!(
            " round {round}: RC WRITE 64 KiB, byte-exact, quiet {quiet:.0} MB/s, under junk {loud:.0} MB/s ({sent} sent): {:.2}x, junk to a raw sink beside it {sink:.0} MB/s: {:.2}x; WRITE ping-pong quiet {q:.2} usec, under junk {l:.2} usec ({lsent} sent): {:.2}x",
            loud / quiet,
            sink / quiet,
            l / q
        );
        sinks.push(sink / quiet);
        bws.push(loud / quiet);
        lats.push(l / q);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(" junk at {rate:.0} datagrams/s (half the raw loop's rate)");
    println!(
        " RC WRITE bandwidth with the same junk at a raw sink / quiet (what the host pays for the junk): {:.2}x",
        median(&mut sinks)
    );
    println!(
        " RC WRITE bandwidth under junk / quiet (higher is better, target 0.5): {:.2}x",
        median(&mut bws)
    );
    println!(
        " WRITE ping-pong latency under junk / quiet (lower is better, target 2): {:.2}x",
        median(&mut lats)
    );
    println!("{}", bench::line());
    Ok(())
}
