//! An exchange between two devices on IPv6 addresses, captured and decoded by stock
//! tshark: the packets two `EmuDevice`s send each other over a small in-memory link
//! (IPv6 routes, delivered through each device's `DeviceDriver`, which checks every
//! ICRC over the IPv6 header) are written to a pcap as Ethernet + IPv6 + UDP frames,
//! and tshark decodes each as InfiniBand over UDP 4791 inside IPv6, with the opcodes
//! of an RC SEND and an RDMA WRITE and their ACKs. Skipped (saying so) only when
//! tshark is absent and REQUIRE_TSHARK is unset.

use std::net::{IpAddr, Ipv6Addr};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emu_core::nic::{
    DeviceDriver, EmuConfig, EmuDevice, Inbound, Link, Receiver, Transmit, ROCE_PORT,
};
use emu_wire::{check_icrc_frame, write_icrc_v6, Ipv6Endpoints, PcapWriter};
use verbs_api::*;

/// A packet in flight: from, to, the UDP payload (ICRC filled in).
type Packet = (Ipv6Addr, Ipv6Addr, Vec<u8>);

/// Two devices' shared wire: what was sent and not yet delivered, everything sent
/// (the capture), and the drivers to deliver to.
#[derive(Default)]
struct Wire {
    queue: Mutex<Vec<Packet>>,
    capture: Mutex<Vec<Packet>>,
    drivers: Mutex<Vec<(Ipv6Addr, DeviceDriver)>>,
}

#[derive(Clone)]
struct V6Link {
    wire: Arc<Wire>,
    epoch: Instant,
}

impl std::fmt::Debug for V6Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("V6Link")
    }
}

impl Link for V6Link {
    fn now(&self) -> Instant {
        self.epoch
    }

    fn send(&self, runs: &mut [Transmit<'_>]) -> std::io::Result<()> {
        for t in runs {
            let (IpAddr::V6(src), IpAddr::V6(dst)) = (t.route.src, t.route.dst) else {
                panic!("an IPv6 device routes to IPv6 addresses: {:?}", t.route);
            };
            let ep = Ipv6Endpoints {
                src,
                dst,
                src_port: ROCE_PORT,
                dst_port: ROCE_PORT,
            };
            for p in t.packets() {
                write_icrc_v6(&ep, p);
                self.wire.queue.lock().unwrap().push((src, dst, p.to_vec()));
                self.wire
                    .capture
                    .lock()
                    .unwrap()
                    .push((src, dst, p.to_vec()));
            }
        }
        Ok(())
    }

    /// Delivers everything queued (with no device lock held: the application polls).
    fn receive(&self, _into: &Inbound<'_>, _by: Receiver) -> usize {
        let queued = std::mem::take(&mut *self.wire.queue.lock().unwrap());
        let drivers = self.wire.drivers.lock().unwrap().clone();
        for (src, dst, p) in &queued {
            if let Some((_, d)) = drivers.iter().find(|(ip, _)| ip == dst) {
                assert!(d.handle_datagram_to(*src, *dst, p));
            }
        }
        usize::from(!queued.is_empty())
    }
}

fn device(wire: &Arc<Wire>, name: &str, ip: Ipv6Addr) -> EmuDevice {
    let link = V6Link {
        wire: wire.clone(),
        epoch: Instant::now(),
    };
    let cfg = EmuConfig {
        name: name.into(),
        ip: ip.into(),
        ..EmuConfig::default()
    };
    let d = EmuDevice::with_link(cfg, Arc::new(link)).unwrap();
    wire.drivers.lock().unwrap().push((ip, d.driver()));
    d
}

fn wait_one(d: &EmuDevice, cq: CqId) -> WorkCompletion {
    let mut out = Vec::new();
    for _ in 0..1000 {
        d.poll_cq(cq, 1, &mut out).unwrap();
        if let Some(wc) = out.first() {
            return *wc;
        }
    }
    panic!("no completion");
}

#[test]
fn stock_tshark_decodes_an_ipv6_exchange() {
    let wire = Arc::new(Wire::default());
    let (ip_a, ip_b): (Ipv6Addr, Ipv6Addr) =
        ("fd00:77::1".parse().unwrap(), "fd00:77::2".parse().unwrap());
    let (da, db) = (device(&wire, "v6a", ip_a), device(&wire, "v6b", ip_b));
    let mut qps = Vec::new();
    for d in [&da, &db] {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(16, None).unwrap();
        let qpn = d
            .create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, QpCap::new(8, 8)).sq_sig_all(true))
            .unwrap();
        let buf = MemBuf::new(4096);
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = d.reg_mr(pd, &buf, 0, 4096, access).unwrap();
        qps.push((cq, qpn, mr, buf));
    }
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..QpParams::default()
    };
    let ends = [(&da, &db, 0, 1), (&db, &da, 1, 0)];
    for (me, peer, i, j) in ends {
        let remote = Endpoint {
            qpn: qps[j].1,
            psn: 0,
            gid: peer.gid(),
            ..Endpoint::default()
        };
        connect_qp(me, qps[i].1, QpType::Rc, &params, 0, &remote).unwrap();
    }
    let (a, b) = (&qps[0], &qps[1]);
    db.post_recv(
        b.1,
        &[RecvWr::new(1, vec![Sge::new(b.2.addr, 4096, b.2.lkey)])],
    )
    .unwrap();
    a.3.write(0, b"hello over IPv6").unwrap();
    da.post_send(
        a.1,
        &[SendWr::send(1, vec![Sge::new(a.2.addr, 15, a.2.lkey)])],
    )
    .unwrap();
    assert_eq!(wait_one(&da, a.0).status, WcStatus::Success);
    assert_eq!(wait_one(&db, b.0).byte_len, 15);
    let wr = SendWr::rdma_write(
        2,
        vec![Sge::new(a.2.addr, 15, a.2.lkey)],
        b.2.addr + 100,
        b.2.rkey,
    );
    da.post_send(a.1, &[wr]).unwrap();
    assert_eq!(wait_one(&da, a.0).status, WcStatus::Success);
    let mut got = [0u8; 15];
    b.3.read(100, &mut got).unwrap();
    assert_eq!(&got, b"hello over IPv6");
    for d in [&da, &db] {
        let bad = d
            .link_counters()
            .icrc_errors
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(bad, 0);
    }

    // The capture: SEND Only, ACK, RDMA WRITE Only, ACK.
    let capture = wire.capture.lock().unwrap().clone();
    let opcodes: Vec<u8> = capture.iter().map(|(_, _, p)| p[0]).collect();
    assert_eq!(opcodes, [0x04, 0x11, 0x0A, 0x11]);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let path = std::env::temp_dir().join(format!("emu-ipv6-{}-{nanos}.pcap", std::process::id()));
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    for (i, (src, dst, p)) in capture.iter().enumerate() {
        let ep = Ipv6Endpoints {
            src: *src,
            dst: *dst,
            src_port: ROCE_PORT,
            dst_port: ROCE_PORT,
        };
        w.write_roce_v6(Duration::from_millis(i as u64), &ep, p)
            .unwrap();
        let frame = emu_wire::build_frame_v6(&ep, p);
        assert_eq!(check_icrc_frame(&frame), Ok(true), "frame {i}");
    }
    drop(w);

    if Command::new("tshark").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("REQUIRE_TSHARK").is_none(),
            "REQUIRE_TSHARK is set but tshark is not installed"
        );
        println!("skipping the tshark half: tshark not installed");
        return;
    }
    let config =
        std::env::temp_dir().join(format!("emu-ipv6-tshark-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&config).unwrap();
    let out = Command::new("tshark")
        .env("WIRESHARK_CONFIG_DIR", &config)
        .args([
            "-r",
            path.to_str().unwrap(),
            "-T",
            "fields",
            "-E",
            "separator=,",
        ])
        .args(["-e", "frame.protocols", "-e", "ipv6.src", "-e", "ipv6.dst"])
        .args(["-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp"])
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4, "{text}");
    for (row, (src, dst, p)) in rows.iter().zip(&capture) {
        assert!(
            row[0].starts_with("eth:ethertype:ipv6:udp:infiniband"),
            "{text}"
        );
        assert_eq!(row[1], src.to_string());
        assert_eq!(row[2], dst.to_string());
        assert_eq!(row[3], p[0].to_string());
        let qpn = u32::from_be_bytes([0, p[5], p[6], p[7]]);
        assert_eq!(row[4], format!("0x{qpn:06x}"));
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(&config);
}
