//! `DeviceDriver::handle_datagrams`: a batch of datagrams goes to the engine under one
//! lock with one flush, each ICRC checked first. Two devices on a link that only
//! records what they send; the test carries the packets by hand.

use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use emu_core::nic::{EmuConfig, EmuDevice, Link, Transmit, ROCE_PORT};
use emu_wire::{write_icrc, AethRepr, Ipv4Endpoints, NakCode, Opcode, PacketRepr, Syndrome};
use verbs_api::*;

/// A link that keeps every packet sent (ICRC filled in) until the test takes it, and
/// how many packets each send call carried. With `max_batch` above 1 it takes runs
/// whole, as a UDP link with GSO does.
#[derive(Debug)]
struct Recorder {
    epoch: Instant,
    max_batch: usize,
    sent: Mutex<Vec<(Ipv4Addr, Ipv4Addr, Vec<u8>)>>,
    /// Per send call: which method, and how many packets it carried.
    calls: Mutex<Vec<(&'static str, usize)>>,
}

impl Recorder {
    /// Fills in the ICRC and keeps the packet.
    fn keep(&self, src: Ipv4Addr, dst: Ipv4Addr, packet: &mut [u8]) {
        let ep = Ipv4Endpoints {
            src,
            dst,
            ip_id: 0,
            src_port: ROCE_PORT,
            dst_port: ROCE_PORT,
        };
        write_icrc(&ep, packet);
        self.sent.lock().unwrap().push((src, dst, packet.to_vec()));
    }

    /// The packets sent since the last take.
    fn take(&self) -> Vec<(Ipv4Addr, Ipv4Addr, Vec<u8>)> {
        self.calls.lock().unwrap().clear();
        std::mem::take(&mut *self.sent.lock().unwrap())
    }

    /// The packets sent since the last take, grouped by send call, each with the
    /// method that sent it.
    fn take_calls(&self) -> Vec<(&'static str, Vec<Vec<u8>>)> {
        let calls = std::mem::take(&mut *self.calls.lock().unwrap());
        let mut sent = self.take().into_iter().map(|(_, _, p)| p);
        calls
            .iter()
            .map(|&(how, n)| (how, sent.by_ref().take(n).collect()))
            .collect()
    }
}

impl Link for Recorder {
    fn now(&self) -> Instant {
        self.epoch
    }
    /// Records each call the way the device makes it: two single packets at once
    /// (an answer and its held ACK), a run of several, or one packet.
    fn send(&self, runs: &mut [Transmit<'_>]) -> io::Result<()> {
        let how = match runs {
            [_, _] => "send_two",
            [t] if t.count() > 1 => "send_batch",
            _ => "send",
        };
        let mut n = 0;
        for t in runs {
            let (std::net::IpAddr::V4(src), std::net::IpAddr::V4(dst)) = (t.route.src, t.route.dst)
            else {
                panic!("an IPv4 device sends to IPv4 addresses");
            };
            for p in t.packets() {
                self.keep(src, dst, p);
                n += 1;
            }
        }
        self.calls.lock().unwrap().push((how, n));
        Ok(())
    }
    fn max_segments(&self) -> usize {
        self.max_batch
    }
}

struct Side {
    dev: EmuDevice,
    link: Arc<Recorder>,
    cq: CqId,
    qpn: u32,
    buf: MemBuf,
    mr: MrInfo,
}

fn side(name: &str, ip: Ipv4Addr, epoch: Instant, max_batch: usize) -> Side {
    let link = Arc::new(Recorder {
        epoch,
        max_batch,
        sent: Mutex::new(Vec::new()),
        calls: Mutex::new(Vec::new()),
    });
    let cfg = EmuConfig {
        name: name.into(),
        ip: ip.into(),
        ..EmuConfig::default()
    };
    let dev = EmuDevice::with_link(cfg, link.clone()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64, None).unwrap();
    let qpn = dev
        .create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, QpCap::new(16, 16)).sq_sig_all(true))
        .unwrap();
    let buf = MemBuf::new(4096);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = dev.reg_mr(pd, &buf, 0, 4096, access).unwrap();
    Side {
        dev,
        link,
        cq,
        qpn,
        buf,
        mr,
    }
}

fn pair() -> (Side, Side) {
    pair_batching(1)
}

/// [`pair`] on links that take runs of up to `max_batch` packets per send call.
fn pair_batching(max_batch: usize) -> (Side, Side) {
    let epoch = Instant::now();
    let a = side("a", Ipv4Addr::new(10, 0, 0, 1), epoch, max_batch);
    let b = side("b", Ipv4Addr::new(10, 0, 0, 2), epoch, max_batch);
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..QpParams::default()
    };
    let ea = Endpoint {
        qpn: a.qpn,
        psn: 100,
        gid: a.dev.gid(),
        ..Endpoint::default()
    };
    let eb = Endpoint {
        qpn: b.qpn,
        psn: 200,
        gid: b.dev.gid(),
        ..Endpoint::default()
    };
    connect_qp(&a.dev, a.qpn, QpType::Rc, &params, ea.psn, &eb).unwrap();
    connect_qp(&b.dev, b.qpn, QpType::Rc, &params, eb.psn, &ea).unwrap();
    (a, b)
}

/// A posts `n` one-packet RDMA WRITEs of 8 bytes each to B's buffer at `i * 8`.
fn post_writes(a: &Side, b: &Side, n: u64) {
    let wrs: Vec<SendWr> = (0..n)
        .map(|i| {
            a.buf
                .with_mut(|m| m[i as usize * 8..][..8].fill(i as u8 + 1));
            SendWr::new(
                i,
                vec![Sge {
                    addr: a.mr.addr + i * 8,
                    length: 8,
                    lkey: a.mr.lkey,
                }],
                WrOperation::RdmaWrite {
                    remote_addr: b.mr.addr + i * 8,
                    rkey: b.mr.rkey,
                },
            )
        })
        .collect();
    a.dev.post_send(a.qpn, &wrs).unwrap();
}

fn is_ack(p: &[u8]) -> bool {
    PacketRepr::parse(p).is_ok_and(|(r, _)| r.bth.opcode.is_ack())
}

#[test]
fn a_batch_is_checked_then_handled_under_one_flush() {
    let (a, b) = pair();
    post_writes(&a, &b, 4);
    let mut sent = a.link.take();
    assert_eq!(sent.len(), 4);
    // The third datagram is corrupted on the way: its ICRC fails.
    let last = sent[2].2.len() - 5;
    sent[2].2[last] ^= 0x40;
    let batch: Vec<(Ipv4Addr, Ipv4Addr, &[u8])> =
        sent.iter().map(|(s, d, p)| (*s, *d, &p[..])).collect();
    assert!(b.driver_handle(&batch));
    assert_eq!(b.dev.link_counters().icrc_errors.load(Ordering::Relaxed), 1);
    assert_eq!(b.dev.counters().rx_packets, 3);
    // The first two WRITEs landed; the corrupted one and the one after it (out of
    // sequence) did not write a byte.
    b.buf.with(|m| {
        assert_eq!(&m[..8], &[1; 8]);
        assert_eq!(&m[8..16], &[2; 8]);
        assert_eq!(&m[16..32], &[0; 16]);
    });
    // One flush for the whole batch: the ACK of the first two coalesced into one
    // packet, followed by the sequence NAK the fourth provoked.
    let out = b.link.take();
    let aeths: Vec<AethRepr> = out
        .iter()
        .map(|(_, _, p)| PacketRepr::parse(p).unwrap().0.aeth.unwrap())
        .collect();
    assert_eq!(aeths.len(), 2, "{aeths:?}");
    assert!(matches!(aeths[0].syndrome, Syndrome::Ack { .. }) && aeths[0].msn == 2);
    assert_eq!(aeths[1].syndrome, Syndrome::Nak(NakCode::PsnSequenceError));
    // Delivered back, the acknowledgement completes the first two WRITEs.
    let back: Vec<(Ipv4Addr, Ipv4Addr, &[u8])> =
        out.iter().map(|(s, d, p)| (*s, *d, &p[..])).collect();
    assert!(a.dev.driver().handle_datagrams(&back));
    let mut wcs = Vec::new();
    a.dev.poll_cq(a.cq, 16, &mut wcs).unwrap();
    assert!(wcs.len() >= 2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(wcs[0].wr_id, 0);
    assert_eq!(wcs[1].wr_id, 1);
}

#[test]
fn a_batch_of_good_requests_gets_one_ack_one_at_a_time_gets_one_each() {
    let (a, b) = pair();
    post_writes(&a, &b, 4);
    let sent = a.link.take();
    let batch: Vec<(Ipv4Addr, Ipv4Addr, &[u8])> =
        sent.iter().map(|(s, d, p)| (*s, *d, &p[..])).collect();
    assert!(b.dev.driver().handle_datagrams(&batch));
    let out = b.link.take();
    assert_eq!(out.len(), 1);
    assert!(is_ack(&out[0].2));
    b.buf.with(|m| {
        for i in 0..4 {
            assert_eq!(&m[i * 8..][..8], &[i as u8 + 1; 8]);
        }
    });
    let back: Vec<(Ipv4Addr, Ipv4Addr, &[u8])> =
        out.iter().map(|(s, d, p)| (*s, *d, &p[..])).collect();
    assert!(a.dev.driver().handle_datagrams(&back));
    let mut wcs = Vec::new();
    a.dev.poll_cq(a.cq, 16, &mut wcs).unwrap();
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );

    // The same four, one call each: four flushes, four ACKs.
    post_writes(&a, &b, 4);
    for (s, d, p) in a.link.take() {
        assert!(b.dev.driver().handle_datagram_to(s, d, &p));
    }
    let out = b.link.take();
    assert_eq!(out.len(), 4);
    assert!(out.iter().all(|(_, _, p)| is_ack(p)));
}

fn opcode(p: &[u8]) -> Opcode {
    PacketRepr::parse(p).unwrap().0.bth.opcode
}

/// On a link that sends runs, a flush that has requests and a held ACK for the same
/// peer: a lone request (a ping-pong's answer) leaves as a datagram of its own ahead
/// of the ACK, both in one `send_two` call, so the peer does not wait for the ACK's
/// delivery; a longer run carries the ACK at its end, one GSO send.
#[test]
fn a_lone_request_leaves_ahead_of_the_held_ack_and_a_run_carries_it() {
    for fenced in [1u64, 2] {
        let (a, b) = pair_batching(64);
        let sge = |s: &Side, at: u64| Sge {
            addr: s.mr.addr + at,
            length: 8,
            lkey: s.mr.lkey,
        };
        a.dev
            .post_recv(a.qpn, &[RecvWr::new(0, vec![sge(&a, 1024)])])
            .unwrap();
        let recvs: Vec<RecvWr> = (0..fenced)
            .map(|i| RecvWr::new(i, vec![sge(&b, 1024 + i * 8)]))
            .collect();
        b.dev.post_recv(b.qpn, &recvs).unwrap();
        // a: a READ of b's buffer, then SENDs fenced behind it (IBV_SEND_FENCE): they
        // wait for the READ's response.
        let mut wrs = vec![SendWr::new(
            0,
            vec![sge(&a, 0)],
            WrOperation::RdmaRead {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
        )];
        for i in 0..fenced {
            let mut w = SendWr::new(1 + i, vec![sge(&a, 8 + i * 8)], WrOperation::Send);
            w.send_flags = SendFlags::FENCE;
            wrs.push(w);
        }
        a.dev.post_send(a.qpn, &wrs).unwrap();
        let read = a.link.take();
        assert_eq!(read.len(), 1);
        assert_eq!(opcode(&read[0].2), Opcode::RcRdmaReadRequest);
        // b: a SEND to a, and the READ's response.
        b.dev
            .post_send(
                b.qpn,
                &[SendWr::new(9, vec![sge(&b, 0)], WrOperation::Send)],
            )
            .unwrap();
        let batch: Vec<(Ipv4Addr, Ipv4Addr, &[u8])> =
            read.iter().map(|(s, d, p)| (*s, *d, &p[..])).collect();
        assert!(b.driver_handle(&batch));
        let from_b = b.link.take();
        let ops: Vec<Opcode> = from_b.iter().map(|(_, _, p)| opcode(p)).collect();
        assert_eq!(ops, [Opcode::RcSendOnly, Opcode::RcRdmaReadResponseOnly]);
        // a gets both in one batch: one flush has the ACK of b's SEND and the fenced
        // SENDs the response released.
        let batch: Vec<(Ipv4Addr, Ipv4Addr, &[u8])> =
            from_b.iter().map(|(s, d, p)| (*s, *d, &p[..])).collect();
        assert!(a.driver_handle(&batch));
        let calls: Vec<(&str, Vec<Opcode>)> = a
            .link
            .take_calls()
            .iter()
            .map(|(how, c)| (*how, c.iter().map(|p| opcode(p)).collect()))
            .collect();
        let want = if fenced == 1 {
            vec![("send_two", vec![Opcode::RcSendOnly, Opcode::RcAcknowledge])]
        } else {
            vec![(
                "send_batch",
                vec![
                    Opcode::RcSendOnly,
                    Opcode::RcSendOnly,
                    Opcode::RcAcknowledge,
                ],
            )]
        };
        assert_eq!(calls, want, "{fenced} fenced SEND(s)");
    }
}

#[test]
fn a_dropped_device_takes_no_batch() {
    let (a, b) = pair();
    let driver = b.dev.driver();
    post_writes(&a, &b, 1);
    let sent = a.link.take();
    drop(b);
    let batch: Vec<(Ipv4Addr, Ipv4Addr, &[u8])> =
        sent.iter().map(|(s, d, p)| (*s, *d, &p[..])).collect();
    assert!(!driver.handle_datagrams(&batch));
}

impl Side {
    fn driver_handle(&self, batch: &[(Ipv4Addr, Ipv4Addr, &[u8])]) -> bool {
        self.dev.driver().handle_datagrams(batch)
    }
}
