//! Every datagram the UDP link puts on the wire is valid RoCEv2, as a receiver that sees
//! the whole packet checks it: captured on the interface (an `AF_PACKET` socket inside
//! an unprivileged network namespace, on `lo` set to `gso_max_segs 1`, so the kernel
//! cuts GSO sends into their datagrams before the capture point as it does for a NIC
//! without segmentation offload), every frame's ICRC is recomputed over its headers as
//! captured, IP identification included, by the bitwise CRC below, which shares nothing
//! with `emu_wire` and is checked first against kernel rxe's frames.
//!
//! The traffic: RC SEND, WRITE (GSO runs from a connected socket), READ, compare-and-swap,
//! fetch-and-add, ATOMIC WRITE and FLUSH to a peer whose hook drops every fifth data packet it receives
//! (retransmissions); UC SEND and WRITE; UD SEND to a unicast peer and to a multicast
//! group; the connection manager's MADs on QP1. Skips, saying so, where namespaces
//! cannot be had.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_cm::{CmConfig, EmuCm};
use emu_core::nic::interop::{LinkOptions, PacketHook, Verdict};
use emu_core::nic::{EmuConfig, EmuDevice};
use socket2::{Domain, Protocol, Socket, Type};
use verbs_api::*;

mod netns_util;

/// CRC-32 (reflected, polynomial 0xEDB88320), one bit at a time.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A captured Ethernet frame's RoCEv2 packet: its BTH fields, addresses, IP ID, and
/// whether its ICRC is right (IBTA Annex A17.4: 8 bytes of 0xFF for the LRH, the IPv4
/// header with TOS, TTL and checksum all ones, the UDP header with its checksum all
/// ones, the BTH with byte 4 all ones, the rest up to the ICRC, stored little-endian).
/// `None` for anything that is not IPv4/UDP to port 4791.
#[derive(Debug, Clone)]
struct Frame {
    dst: Ipv4Addr,
    src: SocketAddrV4,
    ip_id: u16,
    opcode: u8,
    dst_qpn: u32,
    psn: u32,
    icrc_ok: bool,
}

fn roce(frame: &[u8]) -> Option<Frame> {
    if frame.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[14..];
    let ihl = usize::from(ip.first()? & 0x0F) * 4;
    let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
    if ip[0] >> 4 != 4 || *ip.get(9)? != 17 || total > ip.len() || total < ihl + 8 + 16 {
        return None;
    }
    let udp = &ip[ihl..total];
    if udp[2..4] != 4791u16.to_be_bytes() {
        return None;
    }
    let payload = &udp[8..];
    let mut m = vec![0xFF; 8];
    let mut iph = ip[..ihl].to_vec();
    iph[1] = 0xFF;
    iph[8] = 0xFF;
    iph[10] = 0xFF;
    iph[11] = 0xFF;
    m.extend_from_slice(&iph);
    m.extend_from_slice(&udp[..6]);
    m.extend_from_slice(&[0xFF, 0xFF]);
    let body = &payload[..payload.len() - 4];
    m.extend_from_slice(body);
    m[8 + ihl + 8 + 4] = 0xFF;
    let stored = u32::from_le_bytes(payload[payload.len() - 4..].try_into().unwrap());
    let a = |i: usize| Ipv4Addr::new(ip[i], ip[i + 1], ip[i + 2], ip[i + 3]);
    Some(Frame {
        dst: a(16),
        src: SocketAddrV4::new(a(12), u16::from_be_bytes([udp[0], udp[1]])),
        ip_id: u16::from_be_bytes([ip[4], ip[5]]),
        opcode: payload[0],
        dst_qpn: u32::from_be_bytes([0, payload[5], payload[6], payload[7]]),
        psn: u32::from_be_bytes([0, payload[9], payload[10], payload[11]]),
        icrc_ok: crc32(&m) == stored,
    })
}

/// The checker agrees with kernel rxe on every frame of the corpus whose ICRC rxe
/// computed right (and rejects the one it got wrong), non-zero IP IDs included.
#[test]
fn the_independent_checker_agrees_with_kernel_rxe() {
    let text = include_str!("../../emu-wire/tests/data/rxe-corpus.txt");
    let (mut good, mut bad, mut nonzero_id) = (0, 0, 0);
    let mut note = String::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            note.push_str(line);
            continue;
        }
        let bytes: Vec<u8> = (0..line.len() / 2)
            .map(|i| u8::from_str_radix(&line[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let f = roce(&bytes).expect("a RoCEv2 frame");
        let rxe_right = !note.contains("match=NO");
        assert_eq!(f.icrc_ok, rxe_right, "{note}");
        good += usize::from(f.icrc_ok);
        bad += usize::from(!f.icrc_ok);
        nonzero_id += usize::from(f.ip_id != 0);
        note.clear();
    }
    assert!(
        good >= 50 && bad == 1 && nonzero_id >= 40,
        "{good} {bad} {nonzero_id}"
    );
}

#[test]
fn every_datagram_on_the_wire_has_a_valid_icrc() {
    if netns_util::is_child() {
        return in_namespace();
    }
    let name = "every_datagram_on_the_wire_has_a_valid_icrc";
    let Some((ok, text)) = netns_util::run_child(name, false) else {
        return;
    };
    assert!(ok && text.contains("wire: all checks passed"), "{text}");
    eprintln!("{}", text.lines().find(|l| l.contains("wire:")).unwrap());
}

fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(st.success(), "{cmd}");
}

/// Every frame on every interface of the namespace, from a thread, until stopped.
struct Capture {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Vec<u8>>>,
}

impl Capture {
    fn start() -> Capture {
        // ETH_P_ALL, in network byte order.
        let s = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(0x0300))).unwrap();
        let _ = s.set_recv_buffer_size(64 << 20);
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut frames = Vec::new();
            let mut buf = vec![0u8; 70_000];
            while !flag.load(Ordering::Relaxed) {
                if let Ok(n) = (&s).read(&mut buf) {
                    frames.push(buf[..n].to_vec());
                }
            }
            frames
        });
        Capture { stop, thread }
    }

    fn stop(self) -> Vec<Vec<u8>> {
        std::thread::sleep(Duration::from_millis(200));
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Drops every fifth RC request packet it receives the first time it comes (not
/// ACKs; a PSN dropped once passes after), so the sender retransmits.
#[derive(Debug, Default)]
struct DropEveryFifth {
    count: AtomicUsize,
    dropped: parking_lot::Mutex<Vec<u32>>,
}

impl PacketHook for DropEveryFifth {
    fn on_send(&self, _: Ipv4Addr, _: &[u8]) -> Verdict {
        Verdict::Pass
    }
    fn on_receive(&self, _: SocketAddrV4, _: Option<u16>, p: &[u8]) -> Verdict {
        let request = matches!(p.first(), Some(0x00..=0x0C | 0x13 | 0x14 | 0x1C | 0x1D));
        if !request || p.len() < 12 {
            return Verdict::Pass;
        }
        let psn = u32::from_be_bytes([0, p[9], p[10], p[11]]);
        let mut dropped = self.dropped.lock();
        if self.count.fetch_add(1, Ordering::Relaxed) % 5 == 4 && !dropped.contains(&psn) {
            dropped.push(psn);
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }
}

fn device(ip: [u8; 4], hook: Option<Arc<dyn PacketHook>>) -> EmuDevice {
    EmuDevice::open(EmuConfig {
        name: format!("w{}", ip[3]),
        ip: Ipv4Addr::from(ip).into(),
        link: LinkOptions {
            hook,
            ..LinkOptions::default()
        },
        ..EmuConfig::default()
    })
    .unwrap()
}

struct End {
    pd: PdId,
    cq: CqId,
    qpn: u32,
    mr: MrInfo,
    _buf: MemBuf,
}

fn end(d: &EmuDevice, qp_type: QpType, len: usize) -> End {
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(1024, None).unwrap();
    let cap = QpCap::new(256, 256);
    let qpn = d
        .create_qp(&QpInitAttr::new(pd, cq, qp_type, cap).sq_sig_all(true))
        .unwrap();
    let buf = MemBuf::new(len);
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
        | AccessFlags::FLUSH_GLOBAL;
    let mr = d.reg_mr(pd, &buf, 0, len, access).unwrap();
    End {
        pd,
        cq,
        qpn,
        mr,
        _buf: buf,
    }
}

fn connect(d: &EmuDevice, me: &End, qp_type: QpType, peer: &End, peer_gid: Gid) {
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::FLUSH_GLOBAL,
        path_mtu: Mtu::Mtu4096,
        timeout: 14,
        retry_cnt: 7,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        ..QpParams::default()
    };
    let remote = Endpoint {
        qpn: peer.qpn,
        gid: peer_gid,
        ..Endpoint::default()
    };
    connect_qp(d, me.qpn, qp_type, &params, 0, &remote).unwrap();
}

/// Posts `wrs` on `me` and waits for each one's successful completion.
fn run(d: &EmuDevice, me: &End, wrs: Vec<SendWr>) {
    let n = wrs.len();
    d.post_send(me.qpn, &wrs).unwrap();
    wait(d, me.cq, n);
}

fn wait(d: &EmuDevice, cq: CqId, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut wcs = Vec::new();
    while wcs.len() < n {
        d.poll_cq(cq, n - wcs.len(), &mut wcs).unwrap();
        assert!(Instant::now() < deadline, "{} of {n}: {wcs:?}", wcs.len());
        std::thread::yield_now();
    }
    for wc in &wcs {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    wcs
}

fn sge(e: &End, off: u64, len: u32) -> Vec<Sge> {
    vec![Sge::new(e.mr.addr + off, len, e.mr.lkey)]
}

/// RC between 127.0.1.1 and 127.0.1.2, whose hook drops every fifth data packet.
fn rc() {
    let da = device([127, 0, 1, 1], None);
    let db = device([127, 0, 1, 2], Some(Arc::new(DropEveryFifth::default())));
    let (a, b) = (end(&da, QpType::Rc, 1 << 20), end(&db, QpType::Rc, 1 << 20));
    connect(&da, &a, QpType::Rc, &b, db.gid());
    connect(&db, &b, QpType::Rc, &a, da.gid());
    let recvs: Vec<RecvWr> = (0..8)
        .map(|i| RecvWr::new(i, sge(&b, 4096 * i, 4096)))
        .collect();
    db.post_recv(b.qpn, &recvs).unwrap();
    run(
        &da,
        &a,
        (0..8).map(|i| SendWr::send(i, sge(&a, 0, 3000))).collect(),
    );
    wait(&db, b.cq, 8);
    let (rkey, raddr) = (b.mr.rkey, b.mr.addr);
    let writes = (0..8u64)
        .map(|i| {
            let op = WrOperation::RdmaWrite {
                remote_addr: raddr + (i << 16),
                rkey,
            };
            SendWr::new(i, sge(&a, i << 16, 1 << 16), op)
        })
        .collect();
    run(&da, &a, writes);
    let reads = (0..4u64)
        .map(|i| {
            let op = WrOperation::RdmaRead {
                remote_addr: raddr + (i << 16),
                rkey,
            };
            SendWr::new(i, sge(&a, i << 16, 1 << 16), op)
        })
        .collect();
    run(&da, &a, reads);
    let atomics = (0..8u64)
        .map(|i| {
            let remote_addr = raddr + (1 << 19) + 8 * i;
            let op = if i % 2 == 0 {
                WrOperation::AtomicCmpAndSwp {
                    remote_addr,
                    rkey,
                    compare: 0,
                    swap: i,
                }
            } else {
                WrOperation::AtomicFetchAndAdd {
                    remote_addr,
                    rkey,
                    add: i,
                }
            };
            SendWr::new(i, sge(&a, (1 << 19) + 8 * i, 8), op)
        })
        .collect();
    run(&da, &a, atomics);
    // IBTA 1.5: ATOMIC WRITEs, then FLUSHes of the range and of the region.
    let atomic_writes = (0..8u64)
        .map(|i| SendWr::atomic_write(i, raddr + (1 << 19) + 64 + 8 * i, rkey, [i as u8; 8]))
        .collect();
    run(&da, &a, atomic_writes);
    let flushes = (0..4u64)
        .map(|i| {
            let level = if i % 2 == 0 {
                FlushLevel::Range
            } else {
                FlushLevel::Mr
            };
            SendWr::flush(
                i,
                raddr + (1 << 19),
                rkey,
                128,
                FlushPlacement::GLOBAL,
                level,
            )
        })
        .collect();
    run(&da, &a, flushes);
}

/// UC SEND and WRITE between 127.0.2.1 and 127.0.2.2.
fn uc() {
    let da = device([127, 0, 2, 1], None);
    let db = device([127, 0, 2, 2], None);
    let (a, b) = (end(&da, QpType::Uc, 1 << 18), end(&db, QpType::Uc, 1 << 18));
    connect(&da, &a, QpType::Uc, &b, db.gid());
    connect(&db, &b, QpType::Uc, &a, da.gid());
    db.post_recv(b.qpn, &[RecvWr::new(1, sge(&b, 0, 8192))])
        .unwrap();
    run(&da, &a, vec![SendWr::send(1, sge(&a, 0, 8192))]);
    wait(&db, b.cq, 1);
    let op = WrOperation::RdmaWrite {
        remote_addr: b.mr.addr,
        rkey: b.mr.rkey,
    };
    run(&da, &a, vec![SendWr::new(2, sge(&a, 0, 1 << 17), op)]);
}

/// UD SEND from 127.0.3.1 to 127.0.3.2, and to a group 127.0.3.2 joined.
fn ud() {
    let da = device([127, 0, 3, 1], None);
    let db = device([127, 0, 3, 2], None);
    let (a, b) = (end(&da, QpType::Ud, 1 << 16), end(&db, QpType::Ud, 1 << 16));
    let params = QpParams {
        qkey: 0x1111,
        ..QpParams::default()
    };
    for (d, e) in [(&da, &a), (&db, &b)] {
        connect_qp(d, e.qpn, QpType::Ud, &params, 0, &Endpoint::default()).unwrap();
    }
    let group = Gid::from_ipv4(Ipv4Addr::new(239, 0, 3, 9));
    db.attach_mcast(b.qpn, &group, 0).unwrap();
    let recvs: Vec<RecvWr> = (0..2)
        .map(|i| RecvWr::new(i, sge(&b, 4096 * i, 4096)))
        .collect();
    db.post_recv(b.qpn, &recvs).unwrap();
    for (i, (dgid, qpn)) in [(db.gid(), b.qpn), (group, 0xFF_FFFF)]
        .into_iter()
        .enumerate()
    {
        let attr = AhAttr {
            grh: GlobalRoute {
                dgid,
                hop_limit: 1,
                ..GlobalRoute::default()
            },
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        };
        let ah = da.create_ah(a.pd, &attr).unwrap();
        let wr = SendWr::send(i as u64, sge(&a, 0, 1024)).with_ud(UdDest {
            ah,
            remote_qpn: qpn,
            remote_qkey: 0x1111,
        });
        run(&da, &a, vec![wr]);
    }
    wait(&db, b.cq, 2);
}

/// The connection manager connects 127.0.4.2 to a listener on 127.0.4.1 (MADs on QP1).
fn cm() {
    let hosts: Vec<(Arc<dyn Device>, EmuCm, CmChannelId)> = [1, 2]
        .into_iter()
        .map(|n| {
            let dev: Arc<dyn Device> = Arc::new(device([127, 0, 4, n], None));
            let cm = EmuCm::open(vec![dev.clone()], CmConfig::default()).unwrap();
            let ch = cm.create_event_channel().unwrap();
            (dev, cm, ch)
        })
        .collect();
    let wait = Some(Duration::from_secs(10));
    let ev = |h: &(Arc<dyn Device>, EmuCm, CmChannelId), want| {
        let e = h.1.get_cm_event(h.2, wait).unwrap();
        assert_eq!(e.event, want, "{e:?}");
        e
    };
    let (s, c) = (&hosts[0], &hosts[1]);
    let server = SocketAddr::from(([127, 0, 4, 1], 7471));
    let l = s.1.create_id(s.2, PortSpace::Tcp).unwrap();
    s.1.bind_addr(l, server).unwrap();
    s.1.listen(l, 1).unwrap();
    let id = c.1.create_id(c.2, PortSpace::Tcp).unwrap();
    c.1.resolve_addr(id, None, server, Duration::from_millis(500))
        .unwrap();
    ev(c, CmEventType::AddrResolved);
    c.1.resolve_route(id, Duration::from_millis(500)).unwrap();
    ev(c, CmEventType::RouteResolved);
    let init = |dev: &dyn Device| {
        let cq = dev.create_cq(16, None).unwrap();
        QpInitAttr::new(dev.alloc_pd().unwrap(), cq, QpType::Rc, QpCap::new(4, 4)).sq_sig_all(true)
    };
    c.1.create_qp(id, &init(&*c.0)).unwrap();
    c.1.connect(id, &ConnParam::default()).unwrap();
    let req = s.1.get_request(l, wait).unwrap();
    s.1.create_qp(req.id, &init(&*s.0)).unwrap();
    s.1.accept(req.id, &ConnParam::default()).unwrap();
    ev(c, CmEventType::Established);
    ev(s, CmEventType::Established);
    c.1.disconnect(id).unwrap();
    ev(s, CmEventType::Disconnected);
}

fn in_namespace() {
    sh("ip link set lo up");
    // GSO sends are cut into datagrams before the capture point.
    sh("ip link set lo gso_max_segs 1");
    let cap = Capture::start();
    rc();
    uc();
    ud();
    cm();
    let frames: Vec<Frame> = cap.stop().iter().filter_map(|f| roce(f)).collect();
    let bad: Vec<&Frame> = frames.iter().filter(|f| !f.icrc_ok).collect();
    assert!(
        bad.is_empty(),
        "{} of {} frames with a wrong ICRC: {:?}",
        bad.len(),
        frames.len(),
        &bad[..bad.len().min(5)]
    );
    let seen = |op: u8| frames.iter().any(|f| f.opcode == op);
    // RC: SEND only, WRITE first/middle/last, READ request and first/middle/last/only
    // response, CAS, FADD, ACK, atomic ACK, FLUSH, ATOMIC WRITE; UC SEND first/last,
    // WRITE first/middle/last; UD SEND only.
    for op in [
        0x04, 0x06, 0x07, 0x08, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14, 0x1C, 0x1D,
        0x20, 0x22, 0x26, 0x27, 0x28, 0x64,
    ] {
        assert!(seen(op), "no opcode {op:#04x} captured");
    }
    assert!(frames.iter().any(|f| f.dst.is_multicast()), "no multicast");
    assert!(
        frames.iter().any(|f| f.opcode == 0x64 && f.dst_qpn == 1),
        "no MAD on QP1"
    );
    // GSO segments and connected sockets: IDs other than 0.
    let ids = frames.iter().filter(|f| f.ip_id != 0).count();
    assert!(ids > 0, "every IP ID was 0");
    // Retransmissions: the same request (sender, QP, PSN, opcode) sent twice, seen as
    // two different IP IDs (each datagram is captured twice on lo, out and in).
    let mut sends = std::collections::HashMap::<(SocketAddrV4, u32, u32, u8), Vec<u16>>::new();
    for f in frames
        .iter()
        .filter(|f| (f.opcode <= 0x14 && f.opcode != 0x11) || matches!(f.opcode, 0x1C | 0x1D))
    {
        let v = sends
            .entry((f.src, f.dst_qpn, f.psn, f.opcode))
            .or_default();
        if !v.contains(&f.ip_id) {
            v.push(f.ip_id);
        }
    }
    let resent = sends.values().filter(|v| v.len() > 1).count();
    assert!(resent > 0, "no retransmission captured");
    // Of twelve ATOMIC WRITEs and FLUSHes in a row the hook drops at least two.
    let resent_ibta15 = sends
        .iter()
        .filter(|(k, v)| matches!(k.3, 0x1C | 0x1D) && v.len() > 1)
        .count();
    assert!(resent_ibta15 > 0, "no ATOMIC WRITE or FLUSH retransmitted");
    println!(
        "wire: all checks passed: {} RoCEv2 frames captured, every ICRC right; {} with a non-zero IP ID; {} requests retransmitted",
        frames.len(),
        ids,
        resent
    );
}
