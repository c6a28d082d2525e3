//! Devices on the same-host shared-memory link (`SameHost::Shm`): RC traffic
//! through the rings (SEND across several packets, RDMA WRITE, RDMA READ, every ICRC
//! checked on arrival), and a peer that goes away (closes, or its process is killed):
//! the survivor's QP fails by retry exhaustion, as on a dead link.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use emu_core::nic::{EmuConfig, EmuDevice, SameHost};
use verbs_api::*;

mod device_util;
use device_util::{wait_one, Side};

/// Addresses and a port no other test binary uses at the same time.
fn addrs(n: u8) -> (IpAddr, IpAddr, u16) {
    let pid = std::process::id();
    let a = Ipv4Addr::new(127, 77, n, 1).into();
    let b = Ipv4Addr::new(127, 77, n, 2).into();
    (a, b, 20000 + (pid % 40000) as u16)
}

fn open(name: &str, ip: IpAddr, port: u16, busy_poll: bool) -> EmuDevice {
    EmuDevice::open(EmuConfig {
        name: name.into(),
        ip,
        port,
        busy_poll,
        same_host: SameHost::Shm,
        ..EmuConfig::default()
    })
    .expect("open a device on the shared-memory link")
}

/// An RC QP with an 8 KiB buffer open to remote reads and writes.
fn side(d: &EmuDevice) -> Side {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    device_util::side(d, QpType::Rc, 8192, access)
}

fn connect(da: &EmuDevice, a: &Side, db: &EmuDevice, b: &Side) {
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        // 4.096 us * 2^10 = 4 ms a try, three retries.
        timeout: 10,
        retry_cnt: 3,
        ..QpParams::default()
    };
    device_util::connect(da, a, db, b, QpType::Rc, &params);
}

fn rc_traffic(busy_poll: bool, n: u8) {
    let (ia, ib, port) = addrs(n);
    let (da, db) = (
        open("shma", ia, port, busy_poll),
        open("shmb", ib, port, busy_poll),
    );
    let (a, b) = (side(&da), side(&db));
    connect(&da, &a, &db, &b);
    let text: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
    a.buf.write(4096, &text).unwrap();
    for round in 0..20u64 {
        // SEND, larger than the path MTU (several packets).
        let wr = RecvWr::new(round, vec![Sge::new(b.mr.addr, 4096, b.mr.lkey)]);
        db.post_recv(b.qpn, &[wr]).unwrap();
        let wr = SendWr::send(round, vec![Sge::new(a.mr.addr + 4096, 3000, a.mr.lkey)]);
        da.post_send(a.qpn, &[wr]).unwrap();
        assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
        let wc = wait_one(&db, b.cq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 3000));
        let mut got = vec![0u8; 3000];
        b.buf.read(0, &mut got).unwrap();
        assert_eq!(got, text, "SEND");
    }
    // RDMA WRITE into B, then READ it back.
    let wr = SendWr::rdma_write(
        1,
        vec![Sge::new(a.mr.addr + 4096, 2000, a.mr.lkey)],
        b.mr.addr + 5000,
        b.mr.rkey,
    );
    da.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
    let mut got = vec![0u8; 2000];
    b.buf.read(5000, &mut got).unwrap();
    assert_eq!(got, text[..2000], "WRITE");
    let wr = SendWr::rdma_read(
        2,
        vec![Sge::new(a.mr.addr, 2000, a.mr.lkey)],
        b.mr.addr + 5000,
        b.mr.rkey,
    );
    da.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
    a.buf.read(0, &mut got).unwrap();
    assert_eq!(got, text[..2000], "READ");
    for d in [&da, &db] {
        let c = d.link_counters();
        assert_eq!(c.icrc_errors.load(Ordering::Relaxed), 0);
        assert_eq!(c.send_errors.load(Ordering::Relaxed), 0);
    }
}

#[test]
fn rc_through_the_rings() {
    rc_traffic(false, 1);
}

#[test]
fn rc_through_the_rings_busy_polling() {
    rc_traffic(true, 2);
}

#[test]
fn a_peer_that_goes_away_is_a_dead_link() {
    let (ia, ib, port) = addrs(3);
    let (da, db) = (open("shmc", ia, port, false), open("shmd", ib, port, false));
    let (a, b) = (side(&da), side(&db));
    connect(&da, &a, &db, &b);
    let wr = SendWr::rdma_write(
        1,
        vec![Sge::new(a.mr.addr, 100, a.mr.lkey)],
        b.mr.addr,
        b.mr.rkey,
    );
    da.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
    drop(b);
    drop(db);
    let wr = SendWr::rdma_write(2, vec![Sge::new(a.mr.addr, 100, a.mr.lkey)], 0, 0);
    da.post_send(a.qpn, &[wr]).unwrap();
    let wc = wait_one(&da, a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RetryExcErr));
}

#[test]
fn an_address_offered_by_a_live_device_is_taken_until_it_closes() {
    let (ia, _, port) = addrs(4);
    let d = open("shme", ia, port, false);
    let e = EmuDevice::open(EmuConfig {
        ip: ia,
        port,
        same_host: SameHost::Shm,
        ..EmuConfig::default()
    })
    .unwrap_err();
    assert!(matches!(e, Error::AddressInUse(_)), "{e}");
    drop(d);
    let _again = open("shme", ia, port, false);
}

/// The child side of `a_killed_peer_process_is_a_dead_link`: opens device B, prints its
/// QPN and MR, reads A's QPN, connects, says so, and waits to be killed.
#[test]
fn killed_peer_child() {
    use std::io::{BufRead, Write};
    let Ok(args) = std::env::var("SHM_LINK_TEST_CHILD") else {
        return;
    };
    let mut it = args.split(',');
    let ia: IpAddr = it.next().unwrap().parse().unwrap();
    let ib: IpAddr = it.next().unwrap().parse().unwrap();
    let port: u16 = it.next().unwrap().parse().unwrap();
    let db = open("shmkb", ib, port, false);
    let b = side(&db);
    println!("B {} {} {}", b.qpn, b.mr.addr, b.mr.rkey);
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let a_qpn: u32 = line.trim().parse().unwrap();
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..QpParams::default()
    };
    let to_a = Endpoint {
        qpn: a_qpn,
        psn: 100,
        gid: emu_core::nic::gid_of(ia),
        ..Endpoint::default()
    };
    connect_qp(&db, b.qpn, QpType::Rc, &params, 200, &to_a).unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A peer in another process is killed (SIGKILL: no close, its offer and its ring
/// stay): the survivor's RDMA WRITE fails with RETRY_EXC_ERR, as on a dead link.
#[test]
fn a_killed_peer_process_is_a_dead_link() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let (ia, ib, port) = addrs(5);
    let da = open("shmka", ia, port, false);
    let a = side(&da);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "killed_peer_child", "--nocapture", "-q"])
        .env("SHM_LINK_TEST_CHILD", format!("{ia},{ib},{port}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("B ") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
    }
    let f: Vec<u64> = line[2..]
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let (b_qpn, b_addr, b_rkey) = (f[0] as u32, f[1], f[2] as u32);
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        timeout: 10,
        retry_cnt: 3,
        ..QpParams::default()
    };
    let to_b = Endpoint {
        qpn: b_qpn,
        psn: 200,
        gid: emu_core::nic::gid_of(ib),
        ..Endpoint::default()
    };
    connect_qp(&da, a.qpn, QpType::Rc, &params, 100, &to_b).unwrap();
    writeln!(child.stdin.as_mut().unwrap(), "{}", a.qpn).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let wr = SendWr::rdma_write(1, vec![Sge::new(a.mr.addr, 100, a.mr.lkey)], b_addr, b_rkey);
    da.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
    child.kill().unwrap();
    child.wait().unwrap();
    let wr = SendWr::rdma_write(2, vec![Sge::new(a.mr.addr, 100, a.mr.lkey)], b_addr, b_rkey);
    da.post_send(a.qpn, &[wr]).unwrap();
    let wc = wait_one(&da, a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RetryExcErr));
    // The dead process's offer no longer holds the address.
    drop(da);
    let _b_again = open("shmkb2", ib, port, false);
}
