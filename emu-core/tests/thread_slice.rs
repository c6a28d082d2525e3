//! A device's thread asks the scheduler for the shortest time slice (`thread-slice`),
//! so that, woken by a packet, it preempts a program spinning on its core; and for the
//! default while it receives behind a stream, where preempting the sender only slows
//! the stream (`nic/slice.rs`). Checked in what the kernel reports of the thread
//! (`se.slice` in `/proc/self/task/TID/sched`), where the kernel takes slices from
//! threads at all (Linux 6.12 on).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::{AccessFlags, Context, Endpoint, MemBuf, QpParams, QpType, SendWr, WcStatus};

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

/// A device named `name` on 127.0.98.`host`:`port`, if the port is free there.
fn open(name: &str, host: u8, port: u16) -> Option<EmuDevice> {
    EmuDevice::open(EmuConfig {
        name: name.into(),
        ip: Ipv4Addr::new(127, 0, 98, host).into(),
        port,
        ..EmuConfig::default()
    })
    .ok()
}

#[test]
fn the_device_thread_asks_for_the_shortest_slice() {
    if !kernel_takes_slices() {
        eprintln!("skipped: this kernel does not take a slice from a thread");
        return;
    }
    let dev = (0..64u16)
        .find_map(|k| open("slice0", 1, 22_000 + k * 89))
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

/// The slice the kernel reports for the device thread of the device named `name`.
fn device_thread_slice(name: &str) -> Option<u64> {
    thread_named(&format!("{name}-nic")).and_then(|tid| reported_slice(&tid))
}

#[test]
fn a_device_thread_behind_a_stream_takes_the_default_slice_and_round_trips_the_shortest() {
    if !kernel_takes_slices() {
        eprintln!("skipped: this kernel does not take a slice from a thread");
        return;
    }
    let shortest = thread_slice::SHORTEST.as_nanos() as u64;
    let (da, db) = (0..64u16)
        .find_map(|k| {
            let port = 22_011 + k * 89;
            Some((open("slice1", 2, port)?, open("slice2", 3, port)?))
        })
        .expect("a free port");
    let (da, db) = (Arc::new(da), Arc::new(db));
    let (ca, cb) = (Context::new(da.clone()), Context::new(db.clone()));
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (cqa, cqb) = (
        ca.create_cq(1024, None).unwrap(),
        cb.create_cq(16, None).unwrap(),
    );
    let qa = pa.qp(QpType::Rc, &cqa).max_send_wr(512).build().unwrap();
    let qb = pb.qp(QpType::Rc, &cqb).build().unwrap();
    let (bufa, bufb) = (MemBuf::new(64), MemBuf::new(64));
    let mra = pa.reg_mr(&bufa, AccessFlags::LOCAL_WRITE).unwrap();
    let mrb = pb
        .reg_mr(&bufb, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..QpParams::default()
    };
    let to = |ctx: &Context, qpn| Endpoint {
        qpn,
        gid: ctx.gid().unwrap(),
        ..Endpoint::default()
    };
    qa.connect(&params, 0, &to(&cb, qb.qpn())).unwrap();
    qb.connect(&params, 0, &to(&ca, qa.qpn())).unwrap();
    // `batch` WRITEs of 64 bytes to B in one list, every one signaled, then their
    // completions (B's application never polls: its device thread receives them all).
    let write = |batch: usize| {
        let wrs: Vec<SendWr> = (0..batch)
            .map(|i| {
                SendWr::rdma_write(i as u64, mra.sge(0, 64), mrb.addr(0), mrb.rkey()).signaled()
            })
            .collect();
        qa.post_send(&wrs).unwrap();
        for _ in 0..batch {
            let wc = cqa.wait(Duration::from_secs(30)).unwrap();
            assert_eq!(wc.status, WcStatus::Success);
        }
    };
    // A stream: B's device thread finds runs of datagrams at each receive.
    let t0 = Instant::now();
    let mut slice = device_thread_slice("slice2");
    while slice == Some(shortest) || slice.is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "streaming for 30 s left B's device thread at {slice:?} ns"
        );
        write(512);
        slice = device_thread_slice("slice2");
    }
    // Round trips: one WRITE at a time, each received alone.
    let t0 = Instant::now();
    while slice != Some(shortest) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "30 s of single WRITEs left B's device thread at {slice:?} ns"
        );
        write(1);
        slice = device_thread_slice("slice2");
    }
}
