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
    open_on(name, ip, port, busy_poll, SameHost::Shm)
}

fn open_on(name: &str, ip: IpAddr, port: u16, busy_poll: bool, link: SameHost) -> EmuDevice {
    EmuDevice::open(EmuConfig {
        name: name.into(),
        ip,
        port,
        busy_poll,
        same_host: link,
        ..EmuConfig::default()
    })
    .expect("open a device")
}

/// Packets a device received through the rings.
fn shm_packets(d: &EmuDevice) -> u64 {
    d.link_counters().shm_packets.load(Ordering::Relaxed)
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
    let (ia, ib, port) = addrs(5);
    let da = open("shmka", ia, port, false);
    let a = side(&da);
    let mut child = Child::start(
        "killed_peer_child",
        "SHM_LINK_TEST_CHILD",
        format!("{ia},{ib},{port}"),
    );
    let (b_qpn, b_addr, b_rkey) = (child.qpn, child.addr, child.rkey);
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
    child.send(&a.qpn.to_string());
    assert_eq!(child.line(), "ready");
    let wr = SendWr::rdma_write(1, vec![Sge::new(a.mr.addr, 100, a.mr.lkey)], b_addr, b_rkey);
    da.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
    child.proc.kill().unwrap();
    child.proc.wait().unwrap();
    let wr = SendWr::rdma_write(2, vec![Sge::new(a.mr.addr, 100, a.mr.lkey)], b_addr, b_rkey);
    da.post_send(a.qpn, &[wr]).unwrap();
    let wc = wait_one(&da, a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RetryExcErr));
    // The dead process's offer no longer holds the address.
    drop(da);
    let _b_again = open("shmkb2", ib, port, false);
}

/// RC parameters of the several-process tests: 4.096 us * 2^12 = 16 ms a try, seven
/// retries (a peer that restarts is found again within them).
fn patient() -> QpParams {
    QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        timeout: 12,
        retry_cnt: 7,
        ..QpParams::default()
    }
}

/// The child side of the several-process tests: a device at its own address that
/// connects an RC QP to one of the parent's and then does what the parent's lines on
/// its standard input say:
/// - `write OFFSET FILL`: an RDMA WRITE of 256 bytes of FILL into the parent's buffer
///   at OFFSET; answers `done STATUS`;
/// - `count`: answers `done N`, the packets its device received through the rings;
/// - `garbage`: from now on writes an impossible head into the ring this process
///   sends to the parent through, again and again (through the memfd, as a broken or
///   hostile peer would: the device's own pushes write the true head back); answers
///   `done`.
#[test]
fn peer_child() {
    use std::io::{BufRead, Write};
    let Ok(args) = std::env::var("SHM_LINK_TEST_PEER") else {
        return;
    };
    let mut it = args.split(',');
    let ia: IpAddr = it.next().unwrap().parse().unwrap();
    let ib: IpAddr = it.next().unwrap().parse().unwrap();
    let port: u16 = it.next().unwrap().parse().unwrap();
    let link = match it.next() {
        Some("auto") => SameHost::Auto,
        _ => SameHost::Shm,
    };
    let db = open_on("shmpeer", ib, port, false, link);
    let b = side(&db);
    println!("B {} {} {}", b.qpn, b.mr.addr, b.mr.rkey);
    std::io::stdout().flush().unwrap();
    let mut lines = std::io::stdin().lock().lines();
    let f: Vec<u64> = lines
        .next()
        .unwrap()
        .unwrap()
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let (a_qpn, a_addr, a_rkey) = (f[0] as u32, f[1], f[2] as u32);
    let to_a = Endpoint {
        qpn: a_qpn,
        psn: 100,
        gid: emu_core::nic::gid_of(ia),
        ..Endpoint::default()
    };
    connect_qp(&db, b.qpn, QpType::Rc, &patient(), 200, &to_a).unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut id = 0;
    for line in lines {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["write", offset, fill] => {
                let (offset, fill): (u64, u8) = (offset.parse().unwrap(), fill.parse().unwrap());
                b.buf.write(0, &[fill; 256]).unwrap();
                id += 1;
                let wr = SendWr::rdma_write(
                    id,
                    vec![Sge::new(b.mr.addr, 256, b.mr.lkey)],
                    a_addr + offset,
                    a_rkey,
                );
                db.post_send(b.qpn, &[wr]).unwrap();
                println!("done {:?}", wait_one(&db, b.cq).status);
            }
            ["count"] => println!("done {}", shm_packets(&db)),
            ["garbage"] => {
                let ring = ring_file(ib, ia);
                std::thread::spawn(move || loop {
                    use std::os::unix::fs::FileExt;
                    ring.write_at(&0xdead_beef_dead_beef_u64.to_le_bytes(), 128)
                        .unwrap();
                    std::thread::sleep(Duration::from_micros(20));
                });
                println!("done");
            }
            _ => panic!("unknown command {line}"),
        }
        std::io::stdout().flush().unwrap();
    }
}

/// This process's ring from `src` to `dst`, opened for writing: the memfd named
/// `rdma-emu-SRC-DST` among this process's descriptors (writes through it reach the
/// shared pages; the head is the header's second 128-byte line).
fn ring_file(src: IpAddr, dst: IpAddr) -> std::fs::File {
    let name = format!("/memfd:rdma-emu-{src}-{dst} (deleted)");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        if target == name {
            found.push(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(entry.path())
                    .unwrap(),
            );
        }
    }
    assert_eq!(found.len(), 1, "this process's ring to {dst}");
    found.pop().unwrap()
}

/// A device in a child process (`peer_child`), connected to `a` of device `da`.
struct Child {
    proc: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    qpn: u32,
    addr: u64,
    rkey: u32,
}

impl Child {
    fn spawn(da: &EmuDevice, a: &Side, ia: IpAddr, ib: IpAddr, port: u16) -> Child {
        Child::spawn_on(da, a, ia, ib, port, "shm")
    }

    /// A child on `link`: `shm` or `auto`.
    fn spawn_on(da: &EmuDevice, a: &Side, ia: IpAddr, ib: IpAddr, port: u16, link: &str) -> Child {
        let mut c = Child::start(
            "peer_child",
            "SHM_LINK_TEST_PEER",
            format!("{ia},{ib},{port},{link}"),
        );
        let to_b = Endpoint {
            qpn: c.qpn,
            psn: 200,
            gid: emu_core::nic::gid_of(ib),
            ..Endpoint::default()
        };
        connect_qp(da, a.qpn, QpType::Rc, &patient(), 100, &to_b).unwrap();
        c.send(&format!("{} {} {}", a.qpn, a.mr.addr, a.mr.rkey));
        assert_eq!(c.line(), "ready");
        c
    }

    /// Runs this test binary's test `test` as a child with `var` set to `value`, and
    /// reads the QP number, buffer address and R_Key it prints on its `B ` line.
    fn start(test: &str, var: &str, value: String) -> Child {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        let mut proc = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "-q"])
            .env(var, value)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(proc.stdout.take().unwrap());
        let mut line = String::new();
        while !line.starts_with("B ") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
        }
        let f: Vec<u64> = line[2..]
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        Child {
            proc,
            out,
            qpn: f[0] as u32,
            addr: f[1],
            rkey: f[2] as u32,
        }
    }

    fn send(&mut self, line: &str) {
        use std::io::Write;
        writeln!(self.proc.stdin.as_mut().unwrap(), "{line}").unwrap();
    }

    fn line(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        assert!(
            self.out.read_line(&mut line).unwrap() > 0,
            "the child ended"
        );
        line.trim().to_string()
    }

    /// A WRITE from `a` into the child's buffer; its status.
    fn written_by(&self, da: &EmuDevice, a: &Side, id: u64) -> WcStatus {
        write_status(da, a, self.addr, self.rkey, id)
    }

    fn kill(mut self) {
        self.proc.kill().unwrap();
        self.proc.wait().unwrap();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

fn three_addrs(n: u8) -> (IpAddr, IpAddr, IpAddr, u16) {
    let (a, b, port) = addrs(n);
    (a, b, Ipv4Addr::new(127, 77, n, 3).into(), port)
}

/// Two peers in two other processes send to one device at once, each through its own
/// ring, and it answers both.
#[test]
fn three_processes_two_peers_of_one_device() {
    let (ia, ib, ic, port) = three_addrs(6);
    let da = open("shm3a", ia, port, false);
    let (a1, a2) = (side(&da), side(&da));
    let mut b = Child::spawn(&da, &a1, ia, ib, port);
    let mut c = Child::spawn(&da, &a2, ia, ic, port);
    for round in 0..20u8 {
        // Both at once: each child's WRITE is in flight while the other's is.
        b.send(&format!("write 0 {}", round + 1));
        c.send(&format!("write 0 {}", round + 101));
        assert_eq!(b.line(), "done Success");
        assert_eq!(c.line(), "done Success");
        let mut got = [0u8; 256];
        a1.buf.read(0, &mut got).unwrap();
        assert_eq!(got, [round + 1; 256]);
        a2.buf.read(0, &mut got).unwrap();
        assert_eq!(got, [round + 101; 256]);
    }
    assert_eq!(b.written_by(&da, &a1, 1), WcStatus::Success);
    assert_eq!(c.written_by(&da, &a2, 2), WcStatus::Success);
}

/// A peer process is killed (its ring to us stays, attached), and a new one comes
/// up on its address: it makes a new ring, which the survivor takes, and the survivor
/// sends to it through a new ring of its own.
#[test]
fn a_new_peer_on_a_killed_peers_address() {
    let (ia, ib, port) = addrs(7);
    let da = open("shmra", ia, port, false);
    let (a1, a2) = (side(&da), side(&da));
    let mut b = Child::spawn(&da, &a1, ia, ib, port);
    b.send("write 0 7");
    assert_eq!(b.line(), "done Success");
    assert_eq!(b.written_by(&da, &a1, 1), WcStatus::Success);
    let (addr, rkey) = (b.addr, b.rkey);
    b.kill();
    assert_eq!(write_status(&da, &a1, addr, rkey, 2), WcStatus::RetryExcErr);
    let mut b2 = Child::spawn(&da, &a2, ia, ib, port);
    b2.send("write 0 9");
    assert_eq!(b2.line(), "done Success");
    let mut got = [0u8; 256];
    a2.buf.read(0, &mut got).unwrap();
    assert_eq!(got, [9; 256]);
    assert_eq!(b2.written_by(&da, &a2, 3), WcStatus::Success);
}

/// An RDMA WRITE of 64 bytes from `a` of `da` to `addr`, `rkey`; its status.
fn write_status(da: &EmuDevice, a: &Side, addr: u64, rkey: u32, id: u64) -> WcStatus {
    let wr = SendWr::rdma_write(id, vec![Sge::new(a.mr.addr, 64, a.mr.lkey)], addr, rkey);
    da.post_send(a.qpn, &[wr]).unwrap();
    wait_one(da, a.cq).status
}

/// A peer process writes garbage into its ring to us: that ring is dropped (its
/// packets no longer arrive, so the QP with it fails as on a dead link), and a peer on
/// another ring is not disturbed.
#[test]
fn a_garbage_writing_peer_loses_only_its_own_ring() {
    let (ia, ib, ic, port) = three_addrs(8);
    let (da, db) = (
        open("shmga", ia, port, false),
        open("shmgb", ib, port, false),
    );
    let (a, b) = (side(&da), side(&db));
    connect(&da, &a, &db, &b);
    let ag = side(&da);
    let mut g = Child::spawn(&da, &ag, ia, ic, port);
    g.send("write 0 5");
    assert_eq!(g.line(), "done Success");
    g.send("garbage");
    assert_eq!(g.line(), "done");
    // The survivor reads the impossible head when it next looks at the ring (the
    // child's pushes write the true one back in between: a WRITE may still go
    // through before), and drops the ring: the child's packets are lost from then on.
    let mut fill = 5;
    loop {
        fill += 1;
        g.send(&format!("write 0 {fill}"));
        match g.line().as_str() {
            "done Success" => assert!(fill < 60, "the broken ring is still read"),
            "done RetryExcErr" => break,
            other => panic!("{other}"),
        }
    }
    let mut got = [0u8; 256];
    ag.buf.read(0, &mut got).unwrap();
    assert_eq!(got, [fill - 1; 256]);
    // The survivor's QP with it fails as on a dead link.
    assert_eq!(g.written_by(&da, &ag, 1), WcStatus::RetryExcErr);
    // The in-process peer still works both ways.
    assert_eq!(
        write_status(&da, &a, b.mr.addr, b.mr.rkey, 2),
        WcStatus::Success
    );
    assert_eq!(
        write_status(&db, &b, a.mr.addr, a.mr.rkey, 3),
        WcStatus::Success
    );
}

/// Two auto devices in two processes: their packets go through the rings, both ways
/// (each counts what it received so).
#[test]
fn auto_devices_in_two_processes_use_the_rings() {
    let (ia, ib, port) = addrs(9);
    let da = open_on("autoa", ia, port, false, SameHost::Auto);
    let a = side(&da);
    let mut b = Child::spawn_on(&da, &a, ia, ib, port, "auto");
    for round in 1..=10u8 {
        b.send(&format!("write 0 {round}"));
        assert_eq!(b.line(), "done Success");
        let mut got = [0u8; 256];
        a.buf.read(0, &mut got).unwrap();
        assert_eq!(got, [round; 256]);
        assert_eq!(b.written_by(&da, &a, u64::from(round)), WcStatus::Success);
    }
    assert!(shm_packets(&da) >= 20, "{}", shm_packets(&da));
    b.send("count");
    let n: u64 = b.line()["done ".len()..].parse().unwrap();
    assert!(n >= 20, "{n}");
    assert_eq!(da.link_counters().icrc_errors.load(Ordering::Relaxed), 0);
}

/// An auto device and a UDP device of this host: the UDP one offers no rings, so
/// they talk over UDP (nothing arrives through the rings).
#[test]
fn an_auto_device_and_a_udp_device_talk_over_udp() {
    let (ia, ib, port) = addrs(10);
    let da = open_on("autou", ia, port, false, SameHost::Auto);
    let db = open_on("udpu", ib, port, false, SameHost::Udp);
    let (a, b) = (side(&da), side(&db));
    connect(&da, &a, &db, &b);
    for id in 1..=5 {
        assert_eq!(
            write_status(&da, &a, b.mr.addr, b.mr.rkey, id),
            WcStatus::Success
        );
        assert_eq!(
            write_status(&db, &b, a.mr.addr, a.mr.rkey, id),
            WcStatus::Success
        );
    }
    assert_eq!(shm_packets(&da), 0);
    assert_eq!(shm_packets(&db), 0);
}

/// RC between auto devices when the peer's process dies: the survivor's QP fails as
/// on a dead link, and a new auto device on the dead one's address is reached (over
/// UDP from the survivor, which found the dead offer; through the rings towards it).
#[test]
fn auto_rc_when_the_peer_dies() {
    let (ia, ib, port) = addrs(11);
    let da = open_on("autok", ia, port, false, SameHost::Auto);
    let (a1, a2) = (side(&da), side(&da));
    let mut b = Child::spawn_on(&da, &a1, ia, ib, port, "auto");
    b.send("write 0 4");
    assert_eq!(b.line(), "done Success");
    let (addr, rkey) = (b.addr, b.rkey);
    b.kill();
    assert_eq!(write_status(&da, &a1, addr, rkey, 2), WcStatus::RetryExcErr);
    let before = shm_packets(&da);
    let mut b2 = Child::spawn_on(&da, &a2, ia, ib, port, "auto");
    b2.send("write 0 8");
    assert_eq!(b2.line(), "done Success");
    let mut got = [0u8; 256];
    a2.buf.read(0, &mut got).unwrap();
    assert_eq!(got, [8; 256]);
    assert_eq!(b2.written_by(&da, &a2, 3), WcStatus::Success);
    assert!(shm_packets(&da) > before);
}

/// Two auto devices share an address (as two processes share one rxe device): the
/// second does not offer the rings, the first withdraws its offer once it learns of
/// the second, and a peer reaches the QPs of both (over UDP, the shared address's
/// packets passed on to their owner).
#[test]
fn auto_devices_sharing_an_address_stay_on_udp() {
    let (ia, ib, port) = addrs(12);
    let da1 = open_on("autos1", ia, port, false, SameHost::Auto);
    let da2 = open_on("autos2", ia, port, false, SameHost::Auto);
    let db = open_on("autosb", ib, port, false, SameHost::Auto);
    let (a1, a2) = (side(&da1), side(&da2));
    let (b1, b2) = (side(&db), side(&db));
    for (da, a, b) in [(&da1, &a1, &b1), (&da2, &a2, &b2)] {
        device_util::connect(da, a, &db, b, QpType::Rc, &patient());
    }
    for id in 1..=5 {
        for (da, a, b) in [(&da1, &a1, &b1), (&da2, &a2, &b2)] {
            assert_eq!(
                write_status(da, a, b.mr.addr, b.mr.rkey, id),
                WcStatus::Success
            );
            assert_eq!(
                write_status(&db, b, a.mr.addr, a.mr.rkey, id),
                WcStatus::Success
            );
        }
    }
    assert_eq!(shm_packets(&da2), 0);
}

/// An auto device whose application polls all the time, for traffic through the
/// rings, still receives what a UDP-only peer sends: its polls read the UDP socket
/// less often while the rings are in use, but they read it (its thread leaves the
/// socket to an application that polls).
#[test]
fn an_auto_device_polling_for_its_rings_still_receives_over_udp() {
    let (ia, ib, ic, port) = three_addrs(13);
    let da = open_on("automa", ia, port, true, SameHost::Auto);
    let db = open_on("automb", ib, port, true, SameHost::Auto);
    let dc = open_on("automc", ic, port, true, SameHost::Udp);
    let (a1, a2, b, c) = (side(&da), side(&da), side(&db), side(&dc));
    connect(&da, &a1, &db, &b);
    connect(&da, &a2, &dc, &c);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let rings = s.spawn(|| {
            let mut id = 0;
            while !stop.load(Ordering::Relaxed) {
                id += 1;
                assert_eq!(
                    write_status(&da, &a1, b.mr.addr, b.mr.rkey, id),
                    WcStatus::Success
                );
            }
        });
        for id in 1..=20 {
            let status = write_status(&dc, &c, a2.mr.addr, a2.mr.rkey, id);
            if status != WcStatus::Success {
                stop.store(true, Ordering::Relaxed);
            }
            assert_eq!(status, WcStatus::Success);
        }
        stop.store(true, Ordering::Relaxed);
        rings.join().unwrap();
    });
    assert!(shm_packets(&da) > 0 && shm_packets(&db) > 0);
    assert_eq!(shm_packets(&dc), 0);
}

/// Auto devices whose peer is on the rings: a post leaves at once, also while the
/// application polls and the device thread naps (on UDP a post then waits for the
/// next poll of its device, to leave in one send with the next posts). A program that
/// posts on one device and polls only the other (one thread driving both) gets the
/// message at its first poll, not when the sender's nap ends.
#[test]
fn an_auto_post_to_a_ring_peer_does_not_wait_for_a_poll() {
    let (ia, ib, port) = addrs(14);
    let (da, db) = (
        open_on("shma", ia, port, true, SameHost::Auto),
        open_on("shmb", ib, port, true, SameHost::Auto),
    );
    let (a, b) = (side(&da), side(&db));
    connect(&da, &a, &db, &b);
    let mut out = Vec::new();
    for round in 0..20u64 {
        let wr = RecvWr::new(round, vec![Sge::new(b.mr.addr, 64, b.mr.lkey)]);
        db.post_recv(b.qpn, &[wr]).unwrap();
        // Both device threads nap while the application polls.
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(3) {
            da.poll_cq(a.cq, 4, &mut out).unwrap();
            db.poll_cq(b.cq, 4, &mut out).unwrap();
        }
        out.clear();
        let wr = SendWr::send(round, vec![Sge::new(a.mr.addr, 8, a.mr.lkey)]);
        da.post_send(a.qpn, &[wr]).unwrap();
        assert_eq!(
            db.poll_cq(b.cq, 4, &mut out).unwrap(),
            1,
            "round {round}: the SEND was in the ring when the post returned"
        );
        assert_eq!(out[0].status, WcStatus::Success);
        assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
    }
    assert!(shm_packets(&db) >= 20, "through the rings");
}

/// While the application polls, the device thread on the rings naps a millisecond at a
/// time: no post leaves packets for it to send there, and each wake-up takes a core
/// from a spinning application on a host with none spare. Polling 200 ms takes about
/// 200 naps (a host too busy to run the thread takes fewer); with UDP's 200 us naps,
/// about 1000.
#[test]
fn the_device_thread_naps_long_while_the_application_polls() {
    let (ia, _, port) = addrs(15);
    let d = open("naps", ia, port, true);
    let cq = d.create_cq(16, None).unwrap();
    let naps = || d.link_counters().naps.load(Ordering::Relaxed);
    let mut out = Vec::new();
    let t0 = std::time::Instant::now();
    while naps() == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the thread never napped"
        );
        d.poll_cq(cq, 1, &mut out).unwrap();
    }
    let before = naps();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(200) {
        d.poll_cq(cq, 1, &mut out).unwrap();
    }
    let taken = naps() - before;
    assert!(taken <= 400, "{taken} naps in 200 ms of polling");
}

/// A thread blocked in `get_cq_event` takes the packet that makes its event from the
/// rings itself, as on UDP: it sleeps in `poll(2)` on the link's wake-up socket and the
/// channel's descriptor, and the device thread naps meanwhile. One wake-up per message,
/// where the device thread's wake-up, then the waiter's, took two. Of 20 SENDs waited
/// for so, the device thread took all 20 when the link's sleep was a futex; now it
/// takes none (a few on a host too busy to run it before the packet comes).
#[test]
fn an_event_waiter_takes_its_packets_from_the_rings() {
    let (ia, ib, port) = addrs(16);
    let (da, db) = (open("evta", ia, port, false), open("evtb", ib, port, false));
    let a = side(&da);
    let ch = db.create_comp_channel().unwrap();
    let b = device_util::side_on(&db, QpType::Rc, 8192, AccessFlags::LOCAL_WRITE, Some(ch));
    connect(&da, &a, &db, &b);
    a.buf.write(0, b"event").unwrap();
    let by_thread = || db.link_counters().thread_datagrams.load(Ordering::Relaxed);
    let before = by_thread();
    for round in 0..20u64 {
        device_util::post_recv(&db, &b, round, 0, 64);
        db.req_notify_cq(b.cq, false).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                // Long enough for B's device thread to see the waiter and nap.
                std::thread::sleep(Duration::from_millis(5));
                let wr = SendWr::send(round, vec![Sge::new(a.mr.addr, 5, a.mr.lkey)]);
                da.post_send(a.qpn, &[wr]).unwrap();
            });
            assert_eq!(
                db.get_cq_event(ch, Some(Duration::from_secs(10))).unwrap(),
                b.cq
            );
        });
        let wc = wait_one(&db, b.cq);
        assert_eq!((wc.wr_id, wc.byte_len), (round, 5));
        assert_eq!(wait_one(&da, a.cq).status, WcStatus::Success);
    }
    let taken = by_thread() - before;
    assert!(taken < 10, "the device thread took {taken} of the 20 SENDs");
}
