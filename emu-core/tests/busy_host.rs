//! A busy host is not a lossy network: 32 RC pairs at once, half of them in threads of
//! this process and half in child processes (as `cargo test` runs tests), each writing
//! 16 MiB (`EMU_BUSY_HOST_MIB`) byte-exact at default QP settings (timeout 14, retry count 7), beside CPU
//! hogs that keep every core busy. A hardware NIC is never descheduled; an emulated
//! one is, and that time must not use up a peer's retries.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

const CHILD: &str = "EMU_BUSY_HOST_PAIR";
const PAIRS: u8 = 32;
/// Bytes each pair writes: 16 MiB, or `EMU_BUSY_HOST_MIB` MiB for a longer run.
fn bytes() -> usize {
    std::env::var("EMU_BUSY_HOST_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(16)
        << 20
}
const CHUNK: usize = 64 << 10;

/// Where the pairs start looking for a UDP port: below the kernel's ephemeral range
/// (32768 and up), so that no socket bound to 0.0.0.0 by another test takes it.
fn port() -> u16 {
    12000 + (std::process::id() % 16000) as u16
}

/// The two devices of pair `n` on 127.0.(100 + n).1 and .2, sharing one UDP port: the
/// first from `base` on that both can bind (another test may hold any one port).
fn open_pair(n: u8, base: u16) -> std::result::Result<(EmuDevice, EmuDevice), String> {
    let open = |host: u8, port: u16| {
        EmuDevice::open(EmuConfig {
            name: format!("busy{n}.{host}"),
            ip: Ipv4Addr::new(127, 0, 100 + n, host).into(),
            port,
            ..EmuConfig::default()
        })
    };
    let mut last = None;
    for k in 0..64u16 {
        let port = base.wrapping_add(k * 97).max(1024);
        match open(1, port).and_then(|a| Ok((a, open(2, port)?))) {
            Ok(pair) => return Ok(pair),
            Err(e) if e.errno() == 98 => last = Some(e),
            Err(e) => return Err(format!("pair {n}: open: {e}")),
        }
    }
    Err(format!("pair {n}: open: no shared free port: {last:?}"))
}

/// One RC pair on 127.0.(100 + n).1 and .2: writes [`bytes`] in [`CHUNK`]-byte WRITEs,
/// 8 in flight, and checks the target; the first failure, if any.
fn pair(n: u8, port: u16) -> std::result::Result<(), String> {
    let (da, db) = open_pair(n, port)?;
    let total = bytes();
    let mk = |d: &EmuDevice| -> std::result::Result<(u32, CqId, MemBuf, MrInfo), String> {
        let pd = d.alloc_pd().map_err(|e| e.to_string())?;
        let cq = d.create_cq(64, None).map_err(|e| e.to_string())?;
        let qpn = d
            .create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, QpCap::new(16, 16)).sq_sig_all(true))
            .map_err(|e| e.to_string())?;
        let buf = MemBuf::new(total);
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = d
            .reg_mr(pd, &buf, 0, total, access)
            .map_err(|e| e.to_string())?;
        Ok((qpn, cq, buf, mr))
    };
    let (a, b) = (mk(&da)?, mk(&db)?);
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        path_mtu: Mtu::Mtu4096,
        timeout: 14,
        retry_cnt: 7,
        ..QpParams::default()
    };
    for (d, me, peer, gid) in [(&da, &a, &b, db.gid()), (&db, &b, &a, da.gid())] {
        let remote = Endpoint {
            qpn: peer.0,
            gid,
            ..Endpoint::default()
        };
        connect_qp(d, me.0, QpType::Rc, &params, 0, &remote).map_err(|e| e.to_string())?;
    }
    a.2.with_mut(|m| {
        for (i, x) in m.iter_mut().enumerate() {
            *x = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ n;
        }
    });
    let chunks = total / CHUNK;
    let (mut posted, mut done) = (0, 0);
    let mut wcs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while done < chunks {
        while posted < chunks && posted - done < 8 {
            let off = (posted * CHUNK) as u64;
            let wr = SendWr::new(
                posted as u64,
                vec![Sge::new(a.3.addr + off, CHUNK as u32, a.3.lkey)],
                WrOperation::RdmaWrite {
                    remote_addr: b.3.addr + off,
                    rkey: b.3.rkey,
                },
            );
            da.post_send(a.0, &[wr]).map_err(|e| format!("{e:?}"))?;
            posted += 1;
        }
        wcs.clear();
        da.poll_cq(a.1, 16, &mut wcs).map_err(|e| e.to_string())?;
        if let Some(wc) = wcs.iter().find(|w| w.status != WcStatus::Success) {
            return Err(format!(
                "pair {n}: WRITE {} ended {:?}",
                wc.wr_id, wc.status
            ));
        }
        done += wcs.len();
        if Instant::now() > deadline {
            return Err(format!("pair {n}: stalled at {done} of {chunks}"));
        }
        if wcs.is_empty() {
            std::thread::yield_now();
        }
    }
    if !a.2.with(|x| b.2.with(|y| x == y)) {
        return Err(format!("pair {n}: the target differs from the source"));
    }
    Ok(())
}

#[test]
fn thirty_two_rc_pairs_beside_cpu_hogs_all_complete() {
    if let Ok(n) = std::env::var(CHILD) {
        let n: u8 = n.parse().unwrap();
        let port: u16 = std::env::var("EMU_BUSY_HOST_PORT")
            .unwrap()
            .parse()
            .unwrap();
        if let Err(e) = pair(n, port) {
            panic!("{e}");
        }
        return;
    }
    let port = port();
    let stop = Arc::new(AtomicBool::new(false));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs: Vec<_> = (0..2 * cores)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005) + 1);
                }
            })
        })
        .collect();
    let children: Vec<_> = (PAIRS / 2..PAIRS)
        .map(|n| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "thirty_two_rc_pairs_beside_cpu_hogs_all_complete",
                ])
                .env(CHILD, n.to_string())
                .env("EMU_BUSY_HOST_PORT", port.to_string())
                .output_async()
        })
        .collect();
    let threads: Vec<_> = (0..PAIRS / 2)
        .map(|n| std::thread::spawn(move || pair(n, port)))
        .collect();
    let mut failures: Vec<String> = threads
        .into_iter()
        .filter_map(|t| t.join().unwrap().err())
        .collect();
    for (i, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            let why = text
                .lines()
                .find(|l| l.contains("pair "))
                .unwrap_or("failed")
                .to_owned();
            failures.push(format!("child pair {}: {why}", PAIRS / 2 + i as u8));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `Command::spawn` with the output captured.
trait OutputAsync {
    fn output_async(&mut self) -> std::process::Child;
}

impl OutputAsync for Command {
    fn output_async(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}
