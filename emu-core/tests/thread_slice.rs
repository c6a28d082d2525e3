//! A device's thread asks the scheduler for the shortest time slice (`thread-slice`),
//! so that, woken by a packet, it preempts a program spinning on its core: checked in
//! what the kernel reports of the thread (`se.slice` in `/proc/self/task/TID/sched`),
//! where the kernel takes slices from threads at all (Linux 6.12 on).

use std::net::Ipv4Addr;
use std::time::Duration;

use emu_core::nic::{EmuConfig, EmuDevice};

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

#[test]
fn the_device_thread_asks_for_the_shortest_slice() {
    if !kernel_takes_slices() {
        eprintln!("skipped: this kernel does not take a slice from a thread");
        return;
    }
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
    // The thread names itself and asks for its slice as it starts: give it the moment.
    let mut slice = None;
    for _ in 0..500 {
        slice = thread_named("slice0-nic").and_then(|tid| reported_slice(&tid));
        if slice == Some(thread_slice::SHORTEST.as_nanos() as u64) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(slice, Some(thread_slice::SHORTEST.as_nanos() as u64));
    drop(dev);
}
