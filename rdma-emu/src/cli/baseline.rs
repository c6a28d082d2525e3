//! The baselines every bench is compared with, measured in the same run on the same
//! path: raw UDP on loopback one datagram per system call ("plain"), raw UDP with GSO
//! on send and GRO on receive (the kernel's fastest UDP path), raw UDP ping-pong
//! (waiting as the latency test waits: spinning, yielding after an empty poll, or
//! blocking) for latency, memcpy for the in-memory fabric, and for the shared-memory
//! link's latency the time a cache line takes between two threads.

use std::io::IoSliceMut;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use nix::sys::socket::{setsockopt, sockopt};
use quinn_udp::{RecvMeta, Transmit, UdpSockRef, UdpSocketState};

/// How long each throughput baseline runs.
const RUN: Duration = Duration::from_millis(400);

/// Bytes the sender may be ahead of the receiver (well under the 8 MiB socket
/// buffers): flow control through shared memory, so no datagram is lost and none
/// costs a system call beyond its own send and receive.
const WINDOW: u64 = 2 << 20;

/// Flow control of a baseline: bytes sent and bytes received.
#[derive(Default)]
struct Flow {
    sent: AtomicU64,
    received: AtomicU64,
    stop: AtomicBool,
}

impl Flow {
    /// Waits until `n` more bytes fit the window.
    fn wait_room(&self, n: u64) {
        while self.sent.load(Ordering::Relaxed) + n > self.received.load(Ordering::Relaxed) + WINDOW
        {
            std::thread::yield_now();
        }
        self.sent.fetch_add(n, Ordering::Relaxed);
    }
}

fn socket(ip: Ipv4Addr) -> std::io::Result<UdpSocket> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    if setsockopt(&s, sockopt::RcvBufForce, &(8 << 20)).is_err() {
        let _ = s.set_recv_buffer_size(8 << 20);
    }
    if setsockopt(&s, sockopt::SndBufForce, &(8 << 20)).is_err() {
        let _ = s.set_send_buffer_size(8 << 20);
    }
    s.bind(&SocketAddr::from((ip, 0)).into())?;
    Ok(s.into())
}

/// Receiver side of a throughput baseline: counts bytes from the first datagram to
/// the moment the sender says it stopped (or 100 ms of silence); MB/s.
fn receive_rate(
    flow: &Flow,
    mut recv: impl FnMut() -> std::io::Result<usize>,
) -> std::io::Result<f64> {
    let mut bytes = 0u64;
    let mut first = None;
    let mut last = Instant::now();
    loop {
        match recv() {
            Ok(n) => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                bytes += n as u64;
                flow.received.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let drained =
                    flow.received.load(Ordering::Relaxed) >= flow.sent.load(Ordering::Relaxed);
                if (flow.stop.load(Ordering::Relaxed) && drained)
                    || last.elapsed() > Duration::from_secs(1)
                {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    Ok(if secs > 0.0 {
        bytes as f64 / secs / 1e6
    } else {
        0.0
    })
}

/// Raw UDP on loopback, `datagram` bytes each, one `sendto` and one `recvfrom` per
/// datagram; what the receiver got, in MB/s.
pub(crate) fn plain_udp(datagram: usize) -> std::io::Result<f64> {
    let rx = socket(Ipv4Addr::LOCALHOST)?;
    let tx = socket(Ipv4Addr::LOCALHOST)?;
    rx.set_read_timeout(Some(Duration::from_millis(20)))?;
    let to = rx.local_addr()?;
    let flow = Arc::new(Flow::default());
    let f2 = flow.clone();
    let sender = std::thread::spawn(move || {
        let buf = vec![0x5Au8; datagram];
        let t = Instant::now();
        while t.elapsed() < RUN {
            for _ in 0..64 {
                f2.wait_room(datagram as u64);
                let _ = tx.send_to(&buf, to);
            }
        }
        f2.stop.store(true, Ordering::Relaxed);
    });
    let mut buf = vec![0u8; 65536];
    let r = receive_rate(&flow, || rx.recv(&mut buf));
    let _ = sender.join();
    r
}

/// Raw UDP with GSO on send (64 KiB runs of `datagram`-byte segments) and GRO on
/// receive (recvmmsg), through the same library the device uses; MB/s received.
pub(crate) fn gso_gro_udp(datagram: usize) -> std::io::Result<f64> {
    let rx = socket(Ipv4Addr::LOCALHOST)?;
    let tx = socket(Ipv4Addr::LOCALHOST)?;
    let rx_state = UdpSocketState::new(UdpSockRef::from(&rx))?;
    let tx_state = UdpSocketState::new(UdpSockRef::from(&tx))?;
    tx.set_nonblocking(false)?;
    let to = rx.local_addr()?;
    let flow = Arc::new(Flow::default());
    let f2 = flow.clone();
    let sender = std::thread::spawn(move || {
        let segs = (65_507 / datagram).clamp(1, tx_state.max_gso_segments().max(1));
        let buf = vec![0x5Au8; datagram * segs];
        let t = Instant::now();
        while t.elapsed() < RUN {
            let tr = Transmit {
                destination: to,
                ecn: None,
                contents: &buf,
                segment_size: (segs > 1).then_some(datagram),
                src_ip: None,
            };
            f2.wait_room(buf.len() as u64);
            if tx_state.try_send(UdpSockRef::from(&tx), &tr).is_err() {
                f2.sent.fetch_sub(buf.len() as u64, Ordering::Relaxed);
            }
        }
        f2.stop.store(true, Ordering::Relaxed);
    });
    let mut slots: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; 65536]).collect();
    let mut meta = vec![RecvMeta::default(); 16];
    let r = receive_rate(&flow, || {
        let mut iov: Vec<IoSliceMut<'_>> = slots.iter_mut().map(|s| IoSliceMut::new(s)).collect();
        let n = match rx_state.recv(UdpSockRef::from(&rx), &mut iov, &mut meta) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Block as the plain receiver does, instead of spinning.
                let mut fds = [PollFd::new(rx.as_fd(), PollFlags::POLLIN)];
                let _ = nix::poll::poll(&mut fds, 20u8);
                return Err(e);
            }
            r => r?,
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(meta[..n].iter().map(|m| m.len).sum())
    });
    let _ = sender.join();
    r
}

/// How a raw ping-pong waits for a datagram, as the latency test it is compared with
/// waits for a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Non-blocking `recv` in a spin loop (`--busy-poll`).
    Busy,
    /// Non-blocking `recv`, yielding the CPU after each empty one (the default).
    Yield,
    /// Blocking `recv` (`--events`: the test blocks on a completion channel).
    Block,
}

impl Wait {
    /// The name the bench prints and puts in its JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Wait::Busy => "busy",
            Wait::Yield => "yield",
            Wait::Block => "blocking",
        }
    }
}

/// Raw UDP ping-pong of `datagram`-byte datagrams between two threads, `iters` round
/// trips, each side waiting for the next datagram as `wait` says; half round trips in
/// microseconds, one per iteration.
pub(crate) fn udp_pingpong(datagram: usize, iters: usize, wait: Wait) -> std::io::Result<Vec<f64>> {
    let a = socket(Ipv4Addr::LOCALHOST)?;
    let b = socket(Ipv4Addr::LOCALHOST)?;
    a.connect(b.local_addr()?)?;
    b.connect(a.local_addr()?)?;
    for s in [&a, &b] {
        if wait == Wait::Block {
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
        } else {
            s.set_nonblocking(true)?;
        }
    }
    fn recv(s: &UdpSocket, buf: &mut [u8], wait: Wait) -> std::io::Result<usize> {
        loop {
            match s.recv(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && wait != Wait::Block => {
                    if wait == Wait::Busy {
                        std::hint::spin_loop()
                    } else {
                        std::thread::yield_now()
                    }
                }
                r => return r,
            }
        }
    }
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = vec![0u8; datagram.max(1)];
        for _ in 0..iters {
            let n = recv(&b, &mut buf, wait)?;
            b.send(&buf[..n])?;
        }
        Ok(())
    });
    let msg = vec![0x5Au8; datagram.max(1)];
    let mut buf = vec![0u8; datagram.max(1)];
    let mut out = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        a.send(&msg)?;
        recv(&a, &mut buf, wait)?;
        out.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    echo.join()
        .map_err(|_| std::io::Error::other("echo thread panicked"))??;
    Ok(out)
}

/// Round trips per timed batch of [`line_pingpong`]: a clock read costs about as much
/// as a line's transfer between two close cores, so one per round trip would be half
/// the measurement.
const LINE_BATCH: usize = 100;

/// A word alone on its cache line (and the next, which some CPUs fetch in pairs).
#[repr(align(128))]
struct LineWord(AtomicU64);

/// Spins until `word` holds `v`. A spinner that has spun for long yields, so that two
/// threads on one core still take turns.
fn spin_until(word: &AtomicU64, v: u64) {
    let mut spins = 0u32;
    while word.load(Ordering::Acquire) != v {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1 << 18) {
            std::thread::yield_now();
        }
    }
}

/// One cache line each way between two threads, `iters` round trips (at least one
/// batch of [`LINE_BATCH`]): each thread stores the round's number into its own line
/// and spins until the other's line shows it. Half round trips in microseconds, one
/// per batch, after a batch of warming up. This is the floor of the shared-memory
/// link, whose packets cross between the two cores in the ring's lines: on a VM it
/// moves with where the host puts the two vCPUs (50 ns or 250 ns here, for minutes
/// at a time).
pub(crate) fn line_pingpong(iters: usize) -> Vec<f64> {
    let batches = iters.div_ceil(LINE_BATCH).max(1);
    let total = ((batches + 1) * LINE_BATCH) as u64;
    let ping = LineWord(AtomicU64::new(0));
    let pong = LineWord(AtomicU64::new(0));
    let mut out = Vec::with_capacity(batches);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for i in 1..=total {
                spin_until(&ping.0, i);
                pong.0.store(i, Ordering::Release);
            }
        });
        let mut i = 0u64;
        for batch in 0..=batches {
            let t = Instant::now();
            for _ in 0..LINE_BATCH {
                i += 1;
                ping.0.store(i, Ordering::Release);
                spin_until(&pong.0, i);
            }
            if batch > 0 {
                out.push(t.elapsed().as_secs_f64() * 1e6 / (2 * LINE_BATCH) as f64);
            }
        }
    });
    out
}

/// memcpy of `size`-byte blocks through a working set of at least 64 MiB: memory
/// bandwidth (6.7 GB/s where the targets were set), not a cache's. The bench's own
/// buffers hold one message per QP (perftest's layout), which for few QPs stays in
/// cache. MB/s; an error if the two working sets are more memory than is available.
pub(crate) fn memcpy(size: usize) -> Result<f64, String> {
    let size = size.max(1);
    let blocks = (64usize << 20).div_ceil(size).max(1);
    let len = (blocks * size).min(1 << 30);
    let blocks = (len / size).max(1);
    super::checks::check_memory("the memcpy baseline", 2 * (blocks * size) as u64)?;
    let src = vec![0x5Au8; blocks * size];
    let mut dst = vec![0u8; blocks * size];
    let mut bytes = 0u64;
    let t = Instant::now();
    let mut i = 0;
    while t.elapsed() < RUN {
        for _ in 0..64 {
            let o = i * size;
            dst[o..o + size].copy_from_slice(&src[o..o + size]);
            std::hint::black_box(&mut dst);
            i = (i + 1) % blocks;
            bytes += size as u64;
        }
    }
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line ping-pong of 250 round trips is timed in three batches (the warm-up
    /// batch left out), each a positive time under a millisecond a half round trip.
    #[test]
    fn the_line_ping_pong_times_whole_batches() {
        let halves = line_pingpong(250);
        assert_eq!(halves.len(), 3, "{halves:?}");
        assert!(halves.iter().all(|&h| h > 0.0 && h < 1000.0), "{halves:?}");
    }
}
