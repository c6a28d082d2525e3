//! EmuDevice over real UDP on loopback, through the `Device` trait only: what user code
//! sees. Each test uses its own 127.0.x.y addresses and a port derived from the process
//! id, so parallel tests and parallel runs do not collide.

use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use rand::{Rng, SeedableRng};
use verbs_api::*;

fn port() -> u16 {
    20000 + (std::process::id() % 20000) as u16
}

fn open(net: u8, host: u8) -> EmuDevice {
    let cfg = EmuConfig {
        name: format!("emu{net}.{host}"),
        ip: Ipv4Addr::new(127, 0, net, host).into(),
        port: port(),
        ..EmuConfig::default()
    };
    EmuDevice::open(cfg).expect("open device")
}

struct End {
    pd: PdId,
    cq: CqId,
    qpn: u32,
    buf: MemBuf,
    mr: MrInfo,
}

fn end(d: &EmuDevice, len: usize, channel: Option<ChannelId>) -> End {
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(4096, channel).unwrap();
    let cap = QpCap {
        max_send_wr: 1024,
        max_recv_wr: 1024,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qpn = d
        .create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, cap))
        .unwrap();
    let buf = MemBuf::new(len);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = d.reg_mr(pd, &buf, 0, len, access).unwrap();
    End {
        pd,
        cq,
        qpn,
        buf,
        mr,
    }
}

fn connect(d: &EmuDevice, me: &End, peer_qpn: u32, peer: Gid) {
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        path_mtu: Mtu::Mtu4096,
        timeout: 12,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        ..QpParams::default()
    };
    let remote = Endpoint {
        qpn: peer_qpn,
        gid: peer,
        ..Endpoint::default()
    };
    connect_qp(d, me.qpn, QpType::Rc, &params, 0, &remote).unwrap();
}

fn wait_completions(d: &EmuDevice, cq: CqId, n: usize, limit: Duration) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    while out.len() < n {
        d.poll_cq(cq, n - out.len(), &mut out).unwrap();
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions",
            out.len()
        );
        std::thread::yield_now();
    }
    out
}

/// Writes `total` bytes from A to B in `chunk`-byte RDMA WRITEs, `depth` in flight.
fn write_all(da: &EmuDevice, a: &End, b: &End, total: usize, chunk: usize, depth: usize) {
    let mut posted = 0;
    let mut done = 0;
    let n = total / chunk;
    let mut wcs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while done < n {
        while posted < n && posted - done < depth {
            let off = (posted * chunk) as u64;
            let wr = SendWr {
                wr_id: posted as u64,
                sg_list: vec![Sge {
                    addr: a.mr.addr + off,
                    length: chunk as u32,
                    lkey: a.mr.lkey,
                }]
                .into(),
                op: WrOperation::RdmaWrite {
                    remote_addr: b.mr.addr + off,
                    rkey: b.mr.rkey,
                },
                send_flags: SendFlags::SIGNALED,
                ud: None,
                xrc_remote_srqn: None,
            };
            da.post_send(a.qpn, &[wr]).unwrap();
            posted += 1;
        }
        wcs.clear();
        da.poll_cq(a.cq, 64, &mut wcs).unwrap();
        for wc in &wcs {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
        done += wcs.len();
        assert!(Instant::now() < deadline, "transfer stalled at {done}/{n}");
        if wcs.is_empty() {
            std::thread::yield_now();
        }
    }
}

/// Manual 3.6: RDMA WRITE moves 64 MiB between two devices over UDP, byte-exact.
#[test]
fn rc_write_64_mib_over_udp_is_byte_exact() {
    let (da, db) = (open(1, 1), open(1, 2));
    let total = 64 << 20;
    let a = end(&da, total, None);
    let b = end(&db, total, None);
    connect(&da, &a, b.qpn, db.gid());
    connect(&db, &b, a.qpn, da.gid());
    a.buf.with_mut(|m| {
        m.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i * 7 + i / 4093) as u8)
    });
    write_all(&da, &a, &b, total, 64 << 10, 16);
    assert!(
        a.buf.with(|x| b.buf.with(|y| x == y)),
        "B's memory differs from A's"
    );
    assert_eq!(da.link_counters().icrc_errors.load(Ordering::Relaxed), 0);
    assert_eq!(db.link_counters().icrc_errors.load(Ordering::Relaxed), 0);
}

/// Manual 3.5: a completion channel wakes a blocked ibv_get_cq_event once per arming,
/// and its fd is readable while the event is pending.
#[test]
fn completion_channel_wakes_waiter() {
    let (da, db) = (open(2, 1), open(2, 2));
    let ch = db.create_comp_channel().unwrap();
    let a = end(&da, 4096, None);
    let b = end(&db, 4096, Some(ch));
    connect(&da, &a, b.qpn, db.gid());
    connect(&db, &b, a.qpn, da.gid());
    db.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 9,
            sg_list: vec![Sge {
                addr: b.mr.addr,
                length: 64,
                lkey: b.mr.lkey,
            }]
            .into(),
        }],
    )
    .unwrap();
    db.req_notify_cq(b.cq, false).unwrap();
    assert_eq!(
        db.get_cq_event(ch, Some(Duration::from_millis(20)))
            .unwrap_err()
            .errno(),
        110,
        "nothing yet: ETIMEDOUT"
    );
    a.buf.write(0, b"ping").unwrap();
    let wr = SendWr {
        wr_id: 1,
        sg_list: vec![Sge {
            addr: a.mr.addr,
            length: 4,
            lkey: a.mr.lkey,
        }]
        .into(),
        op: WrOperation::Send,
        send_flags: SendFlags::SIGNALED,
        ud: None,
        xrc_remote_srqn: None,
    };
    da.post_send(a.qpn, &[wr]).unwrap();
    assert_eq!(
        db.get_cq_event(ch, Some(Duration::from_secs(10))).unwrap(),
        b.cq
    );
    let wcs = wait_completions(&db, b.cq, 1, Duration::from_secs(10));
    assert_eq!((wcs[0].wr_id, wcs[0].byte_len), (9, 4));
    assert_eq!(b.buf.read(0, &mut [0u8; 4]).map(|_| ()), Ok(()));
    assert!(db.comp_channel_fd(ch).unwrap() >= 0);
    assert_eq!(
        db.destroy_comp_channel(ch).unwrap_err().errno(),
        16,
        "EBUSY while the CQ uses it"
    );
    let _ = (a.pd, b.pd);
}

/// What `d` dropped as junk: datagrams with a wrong ICRC, malformed packets, packets
/// for QPs it does not have.
fn junk_dropped(d: &EmuDevice) -> u64 {
    let c = d.counters();
    d.link_counters().icrc_errors.load(Ordering::Relaxed) + c.rx_malformed + c.rx_unknown_qp
}

/// Garbage at the port is dropped and counted and disturbs no live QP: 100k random
/// datagrams during an RC transfer leave the transfer intact and the drop count at
/// exactly 100k.
#[test]
fn flood_of_random_datagrams_is_dropped_and_counted() {
    let (da, db) = (open(3, 1), open(3, 2));
    let total = 16 << 20;
    let a = end(&da, total, None);
    let b = end(&db, total, None);
    connect(&da, &a, b.qpn, db.gid());
    connect(&db, &b, a.qpn, da.gid());
    a.buf.with_mut(|m| {
        m.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i % 251) as u8)
    });
    let target = (Ipv4Addr::new(127, 0, 3, 2), port());
    let dropped = || junk_dropped(&db);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let s = UdpSocket::bind((Ipv4Addr::new(127, 0, 3, 9), 0)).unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
            let mut buf = [0u8; 1500];
            for i in 0..100_000u32 {
                let n = rng.gen_range(0..buf.len());
                rng.fill(&mut buf[..n]);
                s.send_to(&buf[..n], target).unwrap();
                if i % 200 == 199 {
                    // Flow control: at most 200 datagrams in flight, so the socket
                    // buffer never overflows however starved the device thread is, and
                    // every datagram reaches the device to be counted.
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while dropped() < u64::from(i + 1) - 200 && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }
        });
        write_all(&da, &a, &b, total, 64 << 10, 8);
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while dropped() < 100_000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(dropped(), 100_000);
    assert!(a.buf.with(|x| b.buf.with(|y| x == y)));
}

/// Each kind of junk during a live RC transfer, one kind after another: every datagram
/// is counted under its own counter, and the transfer stays byte-exact. Kinds: random
/// bytes; a truncated header with a right ICRC; a valid packet with a wrong ICRC; a
/// right ICRC for a QP that does not exist; a request from the peer's own address with
/// a PSN far ahead (the responder counts it out of sequence and NAKs; the peer's
/// requester retransmits what that NAK names).
#[test]
fn every_kind_of_junk_is_counted_and_the_transfer_survives() {
    let (da, db) = (open(12, 1), open(12, 2));
    let total = 4 << 20;
    let a = end(&da, total, None);
    let b = end(&db, total, None);
    connect(&da, &a, b.qpn, db.gid());
    connect(&db, &b, a.qpn, da.gid());
    a.buf.with_mut(|m| {
        m.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i % 253) as u8)
    });
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 12, 1), Ipv4Addr::new(127, 0, 12, 2));
    // A packet from `src` (whose socket is `from`) with a right ICRC.
    let sealed = |from: &UdpSocket, src: Ipv4Addr, mut p: Vec<u8>| {
        let ep = emu_wire::Ipv4Endpoints {
            src,
            dst: ip_b,
            ip_id: 0,
            src_port: from.local_addr().unwrap().port(),
            dst_port: port(),
        };
        emu_wire::write_icrc(&ep, &mut p);
        (p, ep)
    };
    let request = |qpn: u32, psn: u32| {
        let mut repr = emu_wire::PacketRepr::new(
            emu_wire::Opcode::RcRdmaWriteOnly,
            qpn,
            emu_wire::Psn::new(psn),
        );
        repr.reth = Some(emu_wire::RethRepr {
            va: b.mr.addr,
            rkey: b.mr.rkey,
            dma_len: 16,
        });
        let mut p = vec![0u8; repr.buffer_len(16)];
        let n = repr.emit(&mut p, &[0xEE; 16]);
        p.truncate(n);
        p
    };
    let stranger = UdpSocket::bind((Ipv4Addr::new(127, 0, 12, 9), 0)).unwrap();
    let peer = UdpSocket::bind((ip_a, 0)).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    type Count = fn(&EmuDevice) -> u64;
    let icrc: Count = |d| d.link_counters().icrc_errors.load(Ordering::Relaxed);
    let any_drop: Count = junk_dropped;
    let kinds: Vec<(&str, &UdpSocket, Vec<Vec<u8>>, Count)> = vec![
        (
            "random bytes",
            &stranger,
            (0..2000)
                .map(|_| {
                    let n = rng.gen_range(0..1500);
                    (0..n).map(|_| rng.gen()).collect()
                })
                .collect(),
            any_drop,
        ),
        (
            "truncated header, right ICRC",
            &stranger,
            (0..2000)
                .map(|i| sealed(&stranger, Ipv4Addr::new(127, 0, 12, 9), vec![i as u8; 10]).0)
                .collect(),
            |d| d.counters().rx_malformed,
        ),
        (
            "wrong ICRC",
            &stranger,
            (0..2000)
                .map(|i| {
                    let (mut p, ep) =
                        sealed(&stranger, Ipv4Addr::new(127, 0, 12, 9), request(b.qpn, i));
                    p[20] ^= 0x40;
                    // Not one an IP ID would explain (2^-16 of corruptions are).
                    assert!(emu_wire::icrc_ip_id(&ep, &p).is_none());
                    p
                })
                .collect(),
            icrc,
        ),
        (
            "unknown QP",
            &stranger,
            (0..2000)
                .map(|i| {
                    let qpn = (b.qpn + 1 + i) & 0xFF_FFFF;
                    sealed(&stranger, Ipv4Addr::new(127, 0, 12, 9), request(qpn, 0)).0
                })
                .collect(),
            |d| d.counters().rx_unknown_qp,
        ),
        (
            "the peer's address, PSN far ahead",
            &peer,
            (0..2000)
                .map(|i| sealed(&peer, ip_a, request(b.qpn, 0x40_0000 + i)).0)
                .collect(),
            |d| d.counters().out_of_sequence,
        ),
    ];
    std::thread::scope(|scope| {
        let junk = scope.spawn(|| {
            for (name, from, packets, count) in &kinds {
                let before = count(&db);
                let deadline = Instant::now() + Duration::from_secs(30);
                for (i, p) in packets.iter().enumerate() {
                    from.send_to(p, (ip_b, port())).unwrap();
                    if i % 100 == 99 {
                        // At most 100 in flight: nothing is lost to a full socket, so
                        // every datagram is counted.
                        while count(&db) - before + 100 < i as u64 + 1 && Instant::now() < deadline
                        {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    }
                }
                while count(&db) - before < packets.len() as u64 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(count(&db) - before, packets.len() as u64, "{name}");
            }
        });
        // The transfer runs again and again until the junk is through.
        let mut passes = 0;
        while !junk.is_finished() || passes == 0 {
            b.buf.with_mut(|m| m.fill(0));
            write_all(&da, &a, &b, total, 64 << 10, 8);
            assert!(a.buf.with(|x| b.buf.with(|y| x == y)), "pass {passes}");
            passes += 1;
        }
        if let Err(e) = junk.join() {
            std::panic::resume_unwind(e);
        }
    });
    assert_eq!(db.link_counters().rx_overflow.load(Ordering::Relaxed), 0);
}

/// A flood faster than the device drains it overflows the socket: what the kernel
/// dropped shows in `rx_overflow` (loss by overload, not on the path), and with what
/// the device itself dropped it accounts for every datagram sent.
#[test]
fn kernel_drops_on_overload_are_counted() {
    let db = open(11, 1);
    let target = (Ipv4Addr::new(127, 0, 11, 1), port());
    // About 100 MB: several times what the socket buffer holds, in a burst short
    // enough not to starve the tests running beside it.
    let (threads, each) = (4u64, 3_000u64);
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                let s = UdpSocket::bind((Ipv4Addr::new(127, 0, 11, 10 + t as u8), 0)).unwrap();
                let junk = [0xA5u8; 9000];
                for _ in 0..each {
                    s.send_to(&junk, target).unwrap();
                }
            });
        }
    });
    let sent = threads * each;
    let accounted = || {
        let overflow = db.link_counters().rx_overflow.load(Ordering::Relaxed);
        (junk_dropped(&db), overflow)
    };
    // The device reads the kernel's count once a second.
    let deadline = Instant::now() + Duration::from_secs(30);
    while accounted().0 + accounted().1 < sent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (seen, overflow) = accounted();
    eprintln!("{sent} sent: {seen} dropped by the device, {overflow} by the kernel");
    assert_eq!(seen + overflow, sent);
}

/// A WRITE forged from the peer's address but another UDP port, with the right QP,
/// PSN, rkey and ICRC: accepted by default, as kernel rxe accepts it (RoCEv2 source
/// ports vary), and dropped and counted on a device with strict source checks, which
/// keeps taking the peer's own packets.
#[test]
fn strict_source_checks_pin_the_peers_port() {
    for (host, strict) in [(5u8, false), (6, true)] {
        let da = open(5, host * 10 + 1);
        let db = EmuDevice::open(EmuConfig {
            name: format!("strict{host}"),
            ip: Ipv4Addr::new(127, 0, 5, host * 10 + 2).into(),
            port: port(),
            link: emu_core::nic::interop::LinkOptions {
                strict_source_port: strict,
                ..Default::default()
            },
            ..EmuConfig::default()
        })
        .unwrap();
        let (a, b) = (end(&da, 4096, None), end(&db, 4096, None));
        connect(&da, &a, b.qpn, db.gid());
        connect(&db, &b, a.qpn, da.gid());
        // The peer's first WRITE (PSN 0) pins its port on the strict device.
        write_all(&da, &a, &b, 64, 64, 1);
        // The forged WRITE: PSN 1, the next one B expects.
        let mut repr = emu_wire::PacketRepr::new(
            emu_wire::Opcode::RcRdmaWriteOnly,
            b.qpn,
            emu_wire::Psn::new(1),
        );
        repr.reth = Some(emu_wire::RethRepr {
            va: b.mr.addr + 1024,
            rkey: b.mr.rkey,
            dma_len: 8,
        });
        let mut pkt = vec![0u8; repr.buffer_len(8)];
        let n = repr.emit(&mut pkt, b"FORGED!!");
        pkt.truncate(n);
        let forger = UdpSocket::bind((Ipv4Addr::new(127, 0, 5, host * 10 + 1), 0)).unwrap();
        let ep = emu_wire::Ipv4Endpoints {
            src: Ipv4Addr::new(127, 0, 5, host * 10 + 1),
            dst: Ipv4Addr::new(127, 0, 5, host * 10 + 2),
            ip_id: 0,
            src_port: forger.local_addr().unwrap().port(),
            dst_port: port(),
        };
        emu_wire::write_icrc(&ep, &mut pkt);
        forger.send_to(&pkt, (ep.dst, port())).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let mut got = [0u8; 8];
        b.buf.read(1024, &mut got).unwrap();
        let wrong = db.link_counters().wrong_source_port.load(Ordering::Relaxed);
        if strict {
            assert_eq!((&got, wrong), (&[0u8; 8], 1), "strict: dropped and counted");
        } else {
            assert_eq!((&got, wrong), (b"FORGED!!", 0), "default: accepted, as rxe");
        }
        // The peer itself still gets through (its PSN 1 on the strict device).
        write_all(&da, &a, &b, 64, 64, 1);
    }
}

/// Wrong-state and wrong-argument calls return the errno libibverbs returns.
#[test]
fn verbs_return_libibverbs_errnos() {
    let d = open(4, 1);
    assert_eq!(d.query_port(2).unwrap_err().errno(), 22);
    assert_eq!(d.query_gid(1, 9999).unwrap_err().errno(), 22);
    assert_eq!(
        d.query_gid(1, 0).unwrap(),
        Gid::from_ipv4(Ipv4Addr::new(127, 0, 4, 1))
    );
    assert_eq!(d.query_port(1).unwrap().link_layer, LinkLayer::Ethernet);
    let e = end(&d, 64, None);
    assert_eq!(
        d.dealloc_pd(e.pd).unwrap_err().errno(),
        16,
        "EBUSY: MR and QP use the PD"
    );
    assert_eq!(
        d.destroy_cq(e.cq).unwrap_err().errno(),
        16,
        "EBUSY: a QP uses the CQ"
    );
    let wr = SendWr {
        wr_id: 1,
        sg_list: vec![].into(),
        op: WrOperation::Send,
        send_flags: SendFlags::SIGNALED,
        ud: None,
        xrc_remote_srqn: None,
    };
    assert_eq!(
        d.post_send(e.qpn, &[wr]).unwrap_err().error.errno(),
        22,
        "RESET QP cannot send"
    );
    assert_eq!(d.create_cq(0, None).unwrap_err().errno(), 22);
    assert_eq!(
        d.reg_mr(e.pd, &e.buf, 0, 65, AccessFlags::LOCAL_WRITE)
            .unwrap_err()
            .errno(),
        22
    );
    assert_eq!(
        d.reg_mr(e.pd, &e.buf, 0, 8, AccessFlags::REMOTE_WRITE)
            .unwrap_err()
            .errno(),
        22
    );
    assert_eq!(
        d.get_async_event(Some(Duration::from_millis(1)))
            .unwrap_err()
            .errno(),
        110
    );
    // A device that keeps its address to itself cannot have one another device
    // holds (one that shares it can: tests/shared_address.rs).
    let taken = EmuDevice::open(EmuConfig {
        ip: Ipv4Addr::new(127, 0, 4, 1).into(),
        port: port(),
        link: emu_core::nic::interop::LinkOptions {
            exclusive: true,
            ..Default::default()
        },
        ..EmuConfig::default()
    });
    assert_eq!(taken.unwrap_err().errno(), 98, "EADDRINUSE");
}

fn write_wr(a: &End, b: &End, wr_id: u64, off: u64, len: u32) -> SendWr {
    SendWr {
        wr_id,
        sg_list: vec![Sge {
            addr: a.mr.addr + off,
            length: len,
            lkey: a.mr.lkey,
        }]
        .into(),
        op: WrOperation::RdmaWrite {
            remote_addr: b.mr.addr + off,
            rkey: b.mr.rkey,
        },
        send_flags: SendFlags::SIGNALED,
        ud: None,
        xrc_remote_srqn: None,
    }
}

/// A post made while the application polls may wait for the next poll to be sent
/// (doorbell batching); if the application stops polling, the device thread sends it.
#[test]
fn a_post_after_polling_leaves_when_the_application_stops_polling() {
    let (da, db) = (open(3, 1), open(3, 2));
    let a = end(&da, 4096, None);
    let b = end(&db, 4096, None);
    connect(&da, &a, b.qpn, db.gid());
    connect(&db, &b, a.qpn, da.gid());
    // Poll long enough for the device thread to see the application polling.
    let mut wcs = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(5) {
        da.poll_cq(a.cq, 4, &mut wcs).unwrap();
    }
    assert!(wcs.is_empty());
    a.buf.write(0, b"deferred").unwrap();
    da.post_send(a.qpn, &[write_wr(&a, &b, 1, 0, 8)]).unwrap();
    // No poll on A from here: only A's device thread can send the WRITE.
    let deadline = Instant::now() + Duration::from_secs(20);
    while b.buf.with(|m| &m[..8] != b"deferred") {
        assert!(Instant::now() < deadline, "the WRITE never left");
        std::thread::sleep(Duration::from_millis(1));
    }
    let wc = wait_completions(&da, a.cq, 1, Duration::from_secs(20));
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
}

/// One thread driving two devices: a post on A that waits for A's next poll (the
/// application polls, so posts batch) leaves when the thread polls B instead, not when
/// A's device thread ends its nap: B's first poll after the post has it. So does the
/// ACK B's poll held: A's first poll then has the send's completion.
#[test]
fn a_post_left_for_a_poll_leaves_when_the_thread_polls_another_device() {
    let (da, db) = (open(3, 5), open(3, 6));
    let a = end(&da, 4096, None);
    let b = end(&db, 4096, None);
    connect(&da, &a, b.qpn, db.gid());
    connect(&db, &b, a.qpn, da.gid());
    let mut wcs = Vec::new();
    for round in 0..20u64 {
        let wr = RecvWr::new(round, vec![Sge::new(b.mr.addr, 64, b.mr.lkey)]);
        db.post_recv(b.qpn, &[wr]).unwrap();
        // Both device threads nap while the application polls.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(3) {
            da.poll_cq(a.cq, 4, &mut wcs).unwrap();
            db.poll_cq(b.cq, 4, &mut wcs).unwrap();
        }
        wcs.clear();
        let mut wr = SendWr::send(round, vec![Sge::new(a.mr.addr, 8, a.mr.lkey)]);
        wr.send_flags = SendFlags::SIGNALED;
        da.post_send(a.qpn, &[wr]).unwrap();
        assert_eq!(
            db.poll_cq(b.cq, 4, &mut wcs).unwrap(),
            1,
            "round {round}: B's first poll has the SEND"
        );
        assert_eq!(wcs[0].status, WcStatus::Success);
        wcs.clear();
        assert_eq!(
            da.poll_cq(a.cq, 4, &mut wcs).unwrap(),
            1,
            "round {round}: A's first poll has the send's completion"
        );
        assert_eq!(wcs[0].status, WcStatus::Success);
    }
}

/// Posts to many QPs between two polls leave together (one GSO run per size) and
/// every one lands and completes, whatever the mix of sizes.
#[test]
fn posts_to_many_qps_between_polls_all_arrive() {
    let (da, db) = (open(3, 3), open(3, 4));
    let n = 40;
    let ends: Vec<(End, End)> = (0..n)
        .map(|_| {
            let a = end(&da, 8192, None);
            let b = end(&db, 8192, None);
            connect(&da, &a, b.qpn, db.gid());
            connect(&db, &b, a.qpn, da.gid());
            (a, b)
        })
        .collect();
    for round in 0..3u8 {
        for (i, (a, b)) in ends.iter().enumerate() {
            let len = [100, 100, 100, 4096, 5000, 1][(i + usize::from(round)) % 6];
            let fill = vec![round.wrapping_mul(40).wrapping_add(i as u8); len];
            a.buf.write(0, &fill).unwrap();
            da.post_send(a.qpn, &[write_wr(a, b, i as u64, 0, len as u32)])
                .unwrap();
        }
        for (i, (a, b)) in ends.iter().enumerate() {
            let wc = wait_completions(&da, a.cq, 1, Duration::from_secs(20));
            assert_eq!((wc[0].wr_id, wc[0].status), (i as u64, WcStatus::Success));
            let len = [100, 100, 100, 4096, 5000, 1][(i + usize::from(round)) % 6];
            let want = round.wrapping_mul(40).wrapping_add(i as u8);
            assert!(b.buf.with(|m| m[..len].iter().all(|&x| x == want)));
        }
    }
    assert_eq!(db.link_counters().icrc_errors.load(Ordering::Relaxed), 0);
}

/// A device reopened on the same address (the next process of a test run) hands out
/// other QP numbers than the last one, so that a peer's CM still holding the old
/// connection does not answer the new REQ with REJ "stale connection" (IBTA
/// 12.9.8.3.1); kernel rxe's cyclic allocation has the same effect.
#[test]
fn a_reopened_device_starts_at_another_qpn() {
    let first = |d: &EmuDevice| {
        let e = end(d, 64, None);
        let n = e.qpn;
        // Numbers stay within the 24 bits of a QPN, above the special QPs 0 and 1.
        assert!((2..0x0100_0000).contains(&n), "{n:#x}");
        d.destroy_qp(n).unwrap();
        n
    };
    let a = first(&open(9, 1));
    std::thread::sleep(Duration::from_millis(2));
    let b = first(&open(9, 1));
    assert_ne!(a, b);
}

/// Whether the file descriptor `fd` of this process is readable within `wait`, polled
/// through a second open of it (`/proc/self/fd`), as another program's poll/epoll sees
/// it, without `unsafe`.
fn fd_readable(fd: i32, wait: Duration) -> bool {
    let f = std::fs::File::open(format!("/proc/self/fd/{fd}")).expect("open the fd again");
    let mut fds = [nix::poll::PollFd::new(
        f.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    nix::poll::ppoll(&mut fds, Some(wait.into()), None).unwrap() > 0
}

/// The completion channel's fd and the async fd are real descriptors that poll(2)
/// sees readable exactly while an event waits (`ibv_comp_channel.fd`,
/// `ibv_context.async_fd`).
#[test]
fn event_fds_are_readable_while_an_event_waits() {
    let (da, db) = (open(2, 3), open(2, 4));
    let async_fd = db.async_fd().unwrap();
    assert!(!fd_readable(async_fd, Duration::ZERO));
    db.management().port_down().unwrap();
    assert!(fd_readable(async_fd, Duration::from_secs(5)));
    assert_eq!(
        db.get_async_event(Some(Duration::ZERO)).unwrap().event_type,
        AsyncEventType::PortErr
    );
    assert!(!fd_readable(async_fd, Duration::ZERO));
    db.management().port_up().unwrap();
    db.get_async_event(Some(Duration::from_secs(5))).unwrap();

    let ch = db.create_comp_channel().unwrap();
    let ch_fd = db.comp_channel_fd(ch).unwrap();
    let a = end(&da, 4096, None);
    let b = end(&db, 4096, Some(ch));
    connect(&da, &a, b.qpn, db.gid());
    connect(&db, &b, a.qpn, da.gid());
    let sge = |e: &End| Sge {
        addr: e.mr.addr,
        length: 4,
        lkey: e.mr.lkey,
    };
    db.post_recv(b.qpn, &[RecvWr::new(9, vec![sge(&b)])])
        .unwrap();
    db.req_notify_cq(b.cq, false).unwrap();
    assert!(!fd_readable(ch_fd, Duration::from_millis(20)));
    let wr = SendWr::new(1, vec![sge(&a)], WrOperation::Send).signaled();
    da.post_send(a.qpn, &[wr]).unwrap();
    assert!(fd_readable(ch_fd, Duration::from_secs(10)));
    assert_eq!(db.get_cq_event(ch, Some(Duration::ZERO)).unwrap(), b.cq);
    assert!(!fd_readable(ch_fd, Duration::ZERO));
}

/// A device whose address and port another program holds (a socket that does not share
/// them) fails with one line naming the address and the holder.
#[test]
fn a_held_address_names_its_holder() {
    let ip = Ipv4Addr::new(127, 0, 95, 9);
    let held = UdpSocket::bind((ip, 0)).unwrap();
    let port = held.local_addr().unwrap().port();
    let e = EmuDevice::open(EmuConfig {
        ip: ip.into(),
        port,
        ..EmuConfig::default()
    })
    .unwrap_err();
    assert_eq!(e.errno(), 98, "{e}");
    let text = e.to_string();
    let want = format!(
        "{ip}:{port} is already taken by process {} (",
        std::process::id()
    );
    assert!(text.contains(&want), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
}
