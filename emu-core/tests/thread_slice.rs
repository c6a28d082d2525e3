//! A device's thread asks the scheduler for the shortest time slice (`thread-slice`)
//! while it holds the socket for an application that waits for it, so that, woken by
//! a packet, it preempts a program spinning on its core, and for the default again
//! after: checked in what the kernel reports of the thread (`se.slice` in
//! `/proc/self/task/TID/sched`), where the kernel takes slices from threads at all
//! (Linux 6.12 on).

use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::Device;

/// The `se.slice` line of a thread's scheduler statistics, in nanoseconds.
fn reported_slice(tid: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/sched")).ok()?;
    let line = text.lines().find(|l| l.starts_with("se.slice"))?;
    line.split(':').nth(1)?.trim().parse().ok()
}

/// The thread of this process named `name`.
fn thread_named(name: &str) -> Option<String> {
    std::fs::read_dir("/proc/self/task").ok()?.find_map(|e| {
        let tid = e.ok()?.file_name().into_string().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
        (comm.trim() == name).then_some(tid)
    })
}

/// Whether this kernel grants a thread the slice it asks for, as it reports it.
fn kernel_takes_slices() -> bool {
    std::thread::spawn(|| {
        let asked = Duration::from_micros(300);
        let tid = nix::unistd::gettid().to_string();
        thread_slice::request(asked).is_ok_and(|set| set)
            && reported_slice(&tid) == Some(asked.as_nanos() as u64)
    })
    .join()
    .unwrap()
}

/// Polls `f` every millisecond until it gives `Some`, for at most `limit`.
fn within<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t0.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_device_thread_asks_for_the_shortest_slice_while_it_holds_the_socket() {
    if !kernel_takes_slices() {
        eprintln!("skipped: this kernel does not take a slice from a thread");
        return;
    }
    let shortest = thread_slice::SHORTEST.as_nanos() as u64;
    // What a thread that asked for nothing reports.
    let default = std::thread::spawn(|| reported_slice(&nix::unistd::gettid().to_string()))
        .join()
        .unwrap();
    let dev = (0..64u16)
        .find_map(|k| {
            EmuDevice::open(EmuConfig {
                name: "slice0".into(),
                ip: Ipv4Addr::new(127, 0, 98, 1).into(),
                port: 22_000 + k * 89,
                ..EmuConfig::default()
            })
            .ok()
        })
        .expect("a free port");
    let tid = within(Duration::from_secs(5), || thread_named("slice0-nic"))
        .expect("the device thread names itself");
    let slice = || reported_slice(&tid);
    // Not asked for while the application leaves the socket to it or takes it.
    assert_eq!(slice(), default);
    let cq = dev.create_cq(16, None).unwrap();
    let peer = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let counters = dev.link_counters();
    let mut out = Vec::new();
    // The application polls (the thread naps), a datagram comes and the polls stop:
    // the thread takes the socket back for the application that waits for it (a hold,
    // 20 ms), and asks for the shortest slice meanwhile. A round in which the thread
    // took the socket otherwise (this thread descheduled for a nap) proves nothing,
    // and the next one runs.
    let mut seen_short = false;
    for _ in 0..100 {
        let holds = counters.socket_holds.load(Ordering::Relaxed);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(2) {
            dev.poll_cq(cq, 1, &mut out).unwrap();
        }
        peer.send_to(&[0u8; 64], (Ipv4Addr::new(127, 0, 98, 1), dev.port()))
            .unwrap();
        let held = within(Duration::from_millis(5), || {
            (counters.socket_holds.load(Ordering::Relaxed) != holds).then_some(())
        });
        if held.is_none() {
            continue;
        }
        if within(Duration::from_millis(15), || {
            (slice() == Some(shortest)).then_some(())
        })
        .is_some()
        {
            seen_short = true;
            break;
        }
    }
    assert!(seen_short, "no hold with the shortest slice in 100 rounds");
    // The hold over, the default again.
    assert!(
        within(Duration::from_secs(2), || (slice() == default)
            .then_some(()))
        .is_some(),
        "the slice stayed {:?} after the hold (default {default:?})",
        slice()
    );
    drop(dev);
}
