//! Devices that open one address share it, as processes share one kernel rxe device:
//! each gets the packets of its own QPs and the CM MADs of its own connections, in one
//! process or in two, and a port one CM bound is taken for every CM of the host.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_cm::{CmConfig, EmuCm};
use emu_core::nic::interop::LinkOptions;
use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

const QKEY: u32 = 0x2222_2222;
const WAIT: Option<Duration> = Some(Duration::from_secs(10));

fn port() -> u16 {
    14000 + (std::process::id() % 9000) as u16
}

fn open(ip: Ipv4Addr, port: u16) -> EmuDevice {
    EmuDevice::open(EmuConfig {
        name: format!("sh{}", ip.octets()[3]),
        ip: ip.into(),
        port,
        ..EmuConfig::default()
    })
    .expect("open device")
}

fn shared_ip() -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 95, 1)
}

fn cap() -> QpCap {
    QpCap::new(32, 32)
}

struct Qp {
    pd: PdId,
    cq: CqId,
    qpn: u32,
    mr: MrInfo,
    buf: MemBuf,
}

fn qp(d: &dyn Device, t: QpType, len: usize) -> Qp {
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(128, None).unwrap();
    let qpn = d
        .create_qp(&QpInitAttr::new(pd, cq, t, cap()).sq_sig_all(true))
        .unwrap();
    let buf = MemBuf::new(len);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = d.reg_mr(pd, &buf, 0, len, access).unwrap();
    Qp {
        pd,
        cq,
        qpn,
        mr,
        buf,
    }
}

/// Brings UD QP `q` of `d` to RTS with [`QKEY`].
fn ud_ready(d: &dyn Device, q: &Qp) {
    let params = QpParams {
        qkey: QKEY,
        ..QpParams::default()
    };
    connect_qp(d, q.qpn, QpType::Ud, &params, 0, &Endpoint::default()).unwrap();
}

/// A UD send of `len` bytes at the start of `q`'s buffer to QP `remote_qpn` of the
/// shared address.
fn ud_send_to_shared(d: &dyn Device, q: &Qp, remote_qpn: u32, len: u32) -> SendWr {
    let attr = AhAttr {
        grh: GlobalRoute {
            dgid: Gid::from_ipv4(shared_ip()),
            hop_limit: 64,
            ..GlobalRoute::default()
        },
        is_global: true,
        port_num: 1,
        ..AhAttr::default()
    };
    let ah = d.create_ah(q.pd, &attr).unwrap();
    SendWr::send(1, vec![Sge::new(q.mr.addr, len, q.mr.lkey)]).with_ud(UdDest {
        ah,
        remote_qpn,
        remote_qkey: QKEY,
    })
}

fn wait(d: &dyn Device, cq: CqId, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} completions",
            out.len()
        );
        let mut got = Vec::new();
        d.poll_cq(cq, n - out.len(), &mut got).unwrap();
        out.extend(got);
        std::thread::yield_now();
    }
    for wc in &out {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    out
}

/// Two devices on one address hand out QPNs from different blocks; datagrams for each
/// one's UD QP reach it whichever of the two the kernel gave them to (sixteen senders,
/// each from its own source port: the kernel spreads them over both), and what the
/// other took was passed on.
#[test]
fn each_device_of_an_address_gets_its_own_datagrams() {
    let port = port();
    let (a, b) = (open(shared_ip(), port), open(shared_ip(), port));
    assert_ne!(a.qpn_block(), b.qpn_block());
    let qa = qp(&a, QpType::Ud, 64 * 64);
    let qb = qp(&b, QpType::Ud, 64 * 64);
    for (d, q) in [(&a, &qa), (&b, &qb)] {
        assert_eq!(u32::from(d.qpn_block()), q.qpn >> 18);
        ud_ready(d, q);
        let wrs: Vec<RecvWr> = (0..32)
            .map(|i| RecvWr::new(i, vec![Sge::new(q.mr.addr + i * 64, 64, q.mr.lkey)]))
            .collect();
        d.post_recv(q.qpn, &wrs).unwrap();
    }
    let senders: Vec<EmuDevice> = (0..16)
        .map(|i| open(Ipv4Addr::new(127, 0, 95, 10 + i), port))
        .collect();
    for (i, s) in senders.iter().enumerate() {
        let q = qp(s, QpType::Ud, 64);
        ud_ready(s, &q);
        q.buf.write(0, &[i as u8; 8]).unwrap();
        let wrs: Vec<SendWr> = [qa.qpn, qb.qpn]
            .iter()
            .map(|&remote_qpn| ud_send_to_shared(s, &q, remote_qpn, 8))
            .collect();
        s.post_send(q.qpn, &wrs).unwrap();
        wait(s, q.cq, 2);
    }
    for (d, q) in [(&a, &qa), (&b, &qb)] {
        let wcs = wait(d, q.cq, 16);
        let mut from: Vec<u8> = wcs
            .iter()
            .map(|wc| q.buf.to_vec()[wc.wr_id as usize * 64 + 40])
            .collect();
        from.sort_unstable();
        assert_eq!(from, (0..16).collect::<Vec<u8>>(), "one from each sender");
    }
    let passed = a.link_counters().passed_on.load(Ordering::Relaxed)
        + b.link_counters().passed_on.load(Ordering::Relaxed);
    assert!(passed > 0, "the kernel gave every datagram to its owner");
}

/// Connects RC QPs `qa` of `a` (on `ip_a`) and `qb` of `b` (on `ip_b`), local ACK
/// timeout `timeout`, and WRITEs all of each one's buffer into the other's, a pattern
/// each way, checking it arrived whole.
fn rc_write_both_ways(
    a: &dyn Device,
    qa: &Qp,
    ip_a: Ipv4Addr,
    b: &dyn Device,
    qb: &Qp,
    ip_b: Ipv4Addr,
    timeout: u8,
) {
    for (d, q, peer, ip) in [(a, qa, qb, ip_b), (b, qb, qa, ip_a)] {
        let remote = Endpoint {
            qpn: peer.qpn,
            gid: Gid::from_ipv4(ip),
            ..Endpoint::default()
        };
        let params = QpParams {
            access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            timeout,
            ..QpParams::default()
        };
        connect_qp(d, q.qpn, QpType::Rc, &params, 0, &remote).unwrap();
    }
    let len = qa.buf.len();
    let pattern = |seed: u8| -> Vec<u8> { (0..len).map(|i| (i as u8) ^ seed).collect() };
    for (d, q, peer, seed) in [(a, qa, qb, 0x5A), (b, qb, qa, 0xA5)] {
        q.buf.write(0, &pattern(seed)).unwrap();
        let wr = SendWr::new(
            1,
            vec![Sge::new(q.mr.addr, len as u32, q.mr.lkey)],
            WrOperation::RdmaWrite {
                remote_addr: peer.mr.addr,
                rkey: peer.mr.rkey,
            },
        );
        d.post_send(q.qpn, &[wr]).unwrap();
        wait(d, q.cq, 1);
        assert!(
            peer.buf.to_vec() == pattern(seed),
            "the WRITE arrived whole"
        );
    }
}

/// RC between two devices of one address: WRITEs of 256 KiB each way (GSO runs) and
/// a SEND arrive whole.
#[test]
fn rc_between_two_devices_of_one_address() {
    let port = port() + 1;
    let (a, b) = (open(shared_ip(), port), open(shared_ip(), port));
    const LEN: usize = 256 << 10;
    let (qa, qb) = (qp(&a, QpType::Rc, LEN), qp(&b, QpType::Rc, LEN));
    rc_write_both_ways(&a, &qa, shared_ip(), &b, &qb, shared_ip(), 14);
    b.post_recv(
        qb.qpn,
        &[RecvWr::new(5, vec![Sge::new(qb.mr.addr, 64, qb.mr.lkey)])],
    )
    .unwrap();
    a.post_send(
        qa.qpn,
        &[SendWr::send(6, vec![Sge::new(qa.mr.addr, 64, qa.mr.lkey)])],
    )
    .unwrap();
    wait(&a, qa.cq, 1);
    let wc = wait(&b, qb.cq, 1)[0];
    assert_eq!((wc.wr_id, wc.byte_len), (5, 64));
}

fn cm_cfg() -> CmConfig {
    CmConfig {
        response_timeout: 12,
        max_retries: 3,
        ..CmConfig::default()
    }
}

/// The server side of a CM exchange on `dev`: listens on `ip:sport`, accepts one
/// connection, takes one message and answers it.
fn cm_server(dev: Arc<dyn Device>, ip: Ipv4Addr, sport: u16, ready: impl FnOnce()) {
    let cm = EmuCm::open(vec![dev.clone()], cm_cfg()).unwrap();
    let ch = cm.create_event_channel().unwrap();
    let l = cm.create_id(ch, PortSpace::Tcp).unwrap();
    cm.bind_addr(l, SocketAddr::from((ip, sport))).unwrap();
    cm.listen(l, 4).unwrap();
    ready();
    let req = cm.get_request(l, WAIT).unwrap();
    let id = req.id;
    let q = qp(&*dev, QpType::Rc, 64);
    let init = QpInitAttr::new(dev.alloc_pd().unwrap(), q.cq, QpType::Rc, cap()).sq_sig_all(true);
    let qpn = cm.create_qp(id, &init).unwrap();
    let buf = MemBuf::new(64);
    let mr = reg_msgs(&cm, id, &buf, 0, 64).unwrap();
    post_recv(&cm, id, 1, mr.addr, 64, &mr).unwrap();
    cm.accept(id, &ConnParam::default()).unwrap();
    let e = cm.get_cm_event(ch, WAIT).unwrap();
    assert_eq!(e.event, CmEventType::Established, "{e:?}");
    get_recv_comp(&cm, id, WAIT).unwrap();
    assert_eq!(&buf.to_vec()[..4], b"ping");
    buf.write(0, b"pong").unwrap();
    post_send(&cm, id, 2, mr.addr, 4, Some(&mr), SendFlags::SIGNALED).unwrap();
    assert_eq!(
        get_send_comp(&cm, id, WAIT).unwrap().status,
        WcStatus::Success
    );
    let e = cm.get_cm_event(ch, WAIT).unwrap();
    assert_eq!(e.event, CmEventType::Disconnected, "{e:?}");
    cm.disconnect(id).unwrap();
    cm.destroy_qp(id).unwrap();
    let _ = qpn;
}

/// The client side: connects to `ip:sport`, sends "ping", expects "pong".
fn cm_client(dev: Arc<dyn Device>, ip: Ipv4Addr, sport: u16) {
    let cm = EmuCm::open(vec![dev.clone()], cm_cfg()).unwrap();
    let ch = cm.create_event_channel().unwrap();
    let id = cm.create_id(ch, PortSpace::Tcp).unwrap();
    cm.resolve_addr(
        id,
        None,
        SocketAddr::from((ip, sport)),
        Duration::from_millis(500),
    )
    .unwrap();
    assert_eq!(
        cm.get_cm_event(ch, WAIT).unwrap().event,
        CmEventType::AddrResolved
    );
    cm.resolve_route(id, Duration::from_millis(500)).unwrap();
    assert_eq!(
        cm.get_cm_event(ch, WAIT).unwrap().event,
        CmEventType::RouteResolved
    );
    let cq = dev.create_cq(64, None).unwrap();
    let init = QpInitAttr::new(dev.alloc_pd().unwrap(), cq, QpType::Rc, cap()).sq_sig_all(true);
    cm.create_qp(id, &init).unwrap();
    cm.connect(id, &ConnParam::default()).unwrap();
    let e = cm.get_cm_event(ch, WAIT).unwrap();
    assert_eq!(e.event, CmEventType::Established, "{e:?}");
    let buf = MemBuf::from_slice(b"ping");
    let mr = reg_msgs(&cm, id, &buf, 0, 4).unwrap();
    let rbuf = MemBuf::new(64);
    let rmr = reg_msgs(&cm, id, &rbuf, 0, 64).unwrap();
    post_recv(&cm, id, 3, rmr.addr, 64, &rmr).unwrap();
    post_send(&cm, id, 4, mr.addr, 4, Some(&mr), SendFlags::SIGNALED).unwrap();
    assert_eq!(
        get_send_comp(&cm, id, WAIT).unwrap().status,
        WcStatus::Success
    );
    get_recv_comp(&cm, id, WAIT).unwrap();
    assert_eq!(&rbuf.to_vec()[..4], b"pong");
    cm.disconnect(id).unwrap();
    let e = cm.get_cm_event(ch, WAIT).unwrap();
    assert_eq!(e.event, CmEventType::Disconnected, "{e:?}");
    cm.destroy_qp(id).unwrap();
}

/// Two CMs, each on its own device of one address: a connection from one to the
/// other's listener is made and carries data (the request reaches the listener's
/// device, each answer the device of the connection it names); a port one CM bound is
/// EADDRINUSE for the other, as the kernel's one port space is.
#[test]
fn cms_on_one_address_connect_to_each_other() {
    let port = port() + 2;
    let ip = shared_ip();
    let a: Arc<dyn Device> = Arc::new(open(ip, port));
    let b: Arc<dyn Device> = Arc::new(open(ip, port));
    let (tx, rx) = std::sync::mpsc::channel();
    let server = {
        let a = a.clone();
        std::thread::spawn(move || cm_server(a, ip, 7490, move || tx.send(()).unwrap()))
    };
    rx.recv().unwrap();
    let other = EmuCm::open(vec![b.clone()], cm_cfg()).unwrap();
    let ch = other.create_event_channel().unwrap();
    let id = other.create_id(ch, PortSpace::Tcp).unwrap();
    let e = other
        .bind_addr(id, SocketAddr::from((ip, 7490)))
        .unwrap_err();
    assert_eq!(e.errno(), 98, "{e}");
    drop(other);
    cm_client(b, ip, 7490);
    server.join().unwrap();
}

/// A device that keeps its address refuses to share it, and is refused where the
/// address is shared already.
#[test]
fn an_exclusive_device_does_not_share() {
    let port = port() + 3;
    let ip = shared_ip();
    let exclusive = |ip| {
        EmuDevice::open(EmuConfig {
            ip,
            port,
            link: LinkOptions {
                exclusive: true,
                ..LinkOptions::default()
            },
            ..EmuConfig::default()
        })
    };
    let shared = open(ip, port);
    assert_eq!(exclusive(ip.into()).unwrap_err().errno(), 98);
    drop(shared);
    // A child another test is spawning holds a copy of every descriptor of this
    // process until it runs its program: the closed socket may linger that long.
    let deadline = Instant::now() + Duration::from_secs(5);
    let alone = loop {
        match exclusive(ip.into()) {
            Err(e) if e.errno() == 98 && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            r => break r.unwrap(),
        }
    };
    let e = EmuDevice::open(EmuConfig {
        ip: ip.into(),
        port,
        ..EmuConfig::default()
    })
    .unwrap_err();
    assert_eq!(e.errno(), 98, "{e}");
    drop(alone);
}

/// Run as a child process by `two_processes_share_one_address`.
#[test]
fn child_cm_server() {
    let Ok(port) = std::env::var("SHARED_ADDRESS_CHILD") else {
        return;
    };
    let port: u16 = port.parse().unwrap();
    let dev: Arc<dyn Device> = Arc::new(open(shared_ip(), port));
    cm_server(dev, shared_ip(), 7491, || println!("listening"));
}

/// Two processes open the device of one address, as two programs open one rxe device;
/// the child listens, the parent connects to the same address and they exchange a
/// message each way.
#[test]
fn two_processes_share_one_address() {
    use std::io::{BufRead, BufReader};
    let port = port() + 4;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_cm_server",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SHARED_ADDRESS_CHILD", port.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended early"
        );
    }
    let dev: Arc<dyn Device> = Arc::new(open(shared_ip(), port));
    assert_ne!(dev.qpn_block(), 0, "the child holds the first block");
    cm_client(dev, shared_ip(), 7491);
    let status = child.wait().unwrap();
    assert!(status.success(), "the child failed: {status}");
}

/// Run as a child process by `a_datagram_sent_just_before_exit_arrives`: sends one UD
/// message to the parent's QP on the shared address, then exits at once (no device
/// teardown, as `os._exit` in a forked Python player).
#[test]
fn child_send_and_exit() {
    let Ok(spec) = std::env::var("SHARED_ADDRESS_SENDER") else {
        return;
    };
    let v: Vec<u32> = spec.split(',').map(|x| x.parse().unwrap()).collect();
    let (port, remote_qpn, tag) = (v[0] as u16, v[1], v[2] as u8);
    let d = open(shared_ip(), port);
    let q = qp(&d, QpType::Ud, 64);
    ud_ready(&d, &q);
    q.buf.write(0, &[tag; 8]).unwrap();
    let wr = ud_send_to_shared(&d, &q, remote_qpn, 8);
    d.post_send(q.qpn, &[wr]).unwrap();
    wait(&d, q.cq, 1);
    std::process::exit(0);
}

/// A process that sends to another device of its own address and exits at once loses
/// nothing: packets to the device's own address go straight to the inbox of the device
/// holding their QP, never into the kernel's pick among the address's sockets, whose
/// queue goes with the process that holds it.
#[test]
fn a_datagram_sent_just_before_exit_arrives() {
    let port = port() + 5;
    let d = open(shared_ip(), port);
    let q = qp(&d, QpType::Ud, 64 * 8);
    ud_ready(&d, &q);
    let wrs: Vec<RecvWr> = (0..8)
        .map(|i| RecvWr::new(i, vec![Sge::new(q.mr.addr + i * 64, 64, q.mr.lkey)]))
        .collect();
    d.post_recv(q.qpn, &wrs).unwrap();
    for tag in 0..6u8 {
        let status = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_send_and_exit", "--test-threads=1"])
            .env("SHARED_ADDRESS_SENDER", format!("{port},{},{tag}", q.qpn))
            .status()
            .unwrap();
        assert!(status.success(), "sender {tag}: {status}");
        let wc = wait(&d, q.cq, 1)[0];
        assert_eq!(
            q.buf.to_vec()[wc.wr_id as usize * 64 + 40],
            tag,
            "message {tag}"
        );
    }
}

/// `n` RC pairs at once, one thread each: a device on `ip_a` and one on `ip_b` (all on
/// `port`), 64 KiB written each way. What is tested is that the devices do not collide,
/// not how RC rides out a starved host (up to 64 device threads on a shared machine),
/// so the ACK timeout is a generous 18 (1.07 s) rather than rdma_cm's 14.
fn pairs_in_threads(n: usize, ip_a: Ipv4Addr, ip_b: Ipv4Addr, port: u16) {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let (a, b) = (open(ip_a, port), open(ip_b, port));
                let (qa, qb) = (qp(&a, QpType::Rc, 64 << 10), qp(&b, QpType::Rc, 64 << 10));
                rc_write_both_ways(&a, &qa, ip_a, &b, &qb, ip_b, 18);
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a pair failed");
    }
}

/// Devices opened at once never collide (issue: parallel `cargo test`): 32 pairs in
/// 32 threads, every device on one of two addresses and one port, each pair's
/// transfer whole.
#[test]
fn thirty_two_pairs_at_once_in_threads() {
    pairs_in_threads(
        32,
        Ipv4Addr::new(127, 0, 96, 1),
        Ipv4Addr::new(127, 0, 96, 2),
        port() + 6,
    );
}

/// Run as a child process by `thirty_two_pairs_at_once_in_processes`: eight pairs in
/// threads on the addresses and port it is given.
#[test]
fn child_pairs() {
    let Ok(port) = std::env::var("SHARED_ADDRESS_PAIRS") else {
        return;
    };
    pairs_in_threads(
        8,
        Ipv4Addr::new(127, 0, 97, 1),
        Ipv4Addr::new(127, 0, 97, 2),
        port.parse().unwrap(),
    );
}

/// The same as four processes of eight pairs each, started together, as `cargo test`
/// runs several test binaries.
#[test]
fn thirty_two_pairs_at_once_in_processes() {
    let port = (port() + 7).to_string();
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_pairs", "--test-threads=1"])
                .env("SHARED_ADDRESS_PAIRS", &port)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        let status = c.wait().unwrap();
        assert!(status.success(), "a child's pairs failed: {status}");
    }
}
