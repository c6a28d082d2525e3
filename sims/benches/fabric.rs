//! Simulated packets per second, with a memcpy baseline measured in the same run.
//! Run: `cargo bench -p emu-sims --bench fabric` (release).
//!
//! - fabric: two endpoints that echo every packet back (64-byte RC WRITE ONLY), 64 in
//!   flight: the fabric's own cost per packet (ICRC on send, queue, delivery).
//! - rc-write: two EmuDevices, 64-byte RC WRITEs posted 64 at a time: the engine on
//!   both ends plus the fabric.
//! - memcpy: copying the same packet bytes, as the baseline.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use emu_core::nic::{Link, Route, Transmit};
use emu_sims::pair::{pair, PairConfig};
use emu_sims::{Fabric, Station, TraceMode};
use emu_wire::{Opcode, PacketRepr, Psn};
use verbs_api::{SendFlags, SendWr};

struct Echo {
    ip: Ipv4Addr,
    link: OnceLock<Arc<dyn Link>>,
}

impl Station for Echo {
    fn deliver(&self, src: Ipv4Addr, _dst: Ipv4Addr, packet: &[u8]) {
        let mut buf = [0u8; 256];
        let b = &mut buf[..packet.len()];
        b.copy_from_slice(packet);
        let route = Route {
            src: self.ip.into(),
            dst: src.into(),
            tos: 0,
        };
        let _ = self
            .link
            .get()
            .unwrap()
            .send(&mut [Transmit::one(route, b)]);
    }
}

fn packet() -> Vec<u8> {
    let repr = PacketRepr::new(Opcode::RcRdmaWriteOnly, 0x11, Psn::new(1));
    let mut buf = vec![0u8; repr.buffer_len(64)];
    let n = repr.emit(&mut buf, &[7u8; 64]);
    buf.truncate(n);
    buf
}

fn fabric_echo(packets: u64) -> f64 {
    let f = Fabric::new(1);
    f.set_trace_mode(TraceMode::Off);
    let ips = [Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2)];
    let eps: Vec<Arc<Echo>> = ips
        .iter()
        .map(|ip| {
            Arc::new(Echo {
                ip: *ip,
                link: OnceLock::new(),
            })
        })
        .collect();
    for (i, e) in eps.iter().enumerate() {
        let link = f.add_station(&format!("e{i}"), ips[i], e.clone()).unwrap();
        let _ = e.link.set(link);
    }
    let mut p = packet();
    for _ in 0..64 {
        eps[0]
            .link
            .get()
            .unwrap()
            .send(&mut [Transmit::one(
                Route {
                    src: (ips[0]).into(),
                    dst: (ips[1]).into(),
                    tos: 0,
                },
                &mut p,
            )])
            .unwrap();
    }
    // A step delivers every packet due at that instant (up to 64 here): count the
    // packets, not the steps.
    let start = Instant::now();
    let before = f.stats().delivered;
    while f.stats().delivered - before < packets && f.step() {}
    (f.stats().delivered - before) as f64 / start.elapsed().as_secs_f64()
}

fn rc_write(messages: u64) -> f64 {
    let f = Fabric::new(1);
    f.set_trace_mode(TraceMode::Off);
    let cfg = PairConfig {
        sq_sig_all: false,
        max_send_wr: 256,
        cq_size: 1024,
        ..PairConfig::default()
    };
    let (a, b) = pair(&f, &cfg);
    let batch: Vec<SendWr> = (0..64)
        .map(|i| {
            let w = SendWr::rdma_write(i, vec![a.sge(0, 64)], b.addr(0), b.rkey());
            if i == 63 {
                w.with_flags(SendFlags::SIGNALED)
            } else {
                w
            }
        })
        .collect();
    let start = Instant::now();
    for _ in 0..messages / 64 {
        a.post(&batch);
        assert_eq!(a.wait(1).len(), 1);
    }
    let sent = f.stats().sent;
    sent as f64 / start.elapsed().as_secs_f64()
}

fn memcpy(packets: u64) -> f64 {
    let p = packet();
    let mut dst = vec![0u8; p.len()];
    let start = Instant::now();
    for _ in 0..packets {
        dst.copy_from_slice(black_box(&p));
        black_box(&mut dst);
    }
    packets as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    // `cargo test --benches` runs this with --bench absent: keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n = if quick { 20_000 } else { 5_000_000 };
    let base = memcpy(n * 4);
    let echo = fabric_echo(n);
    let rc = rc_write(n / 4);
    println!(
        "memcpy of a {}-byte packet: {:>12.0} packets/s (baseline)",
        packet().len(),
        base
    );
    println!(
        "fabric echo:                {:>12.0} packets/s ({:.1}x the memcpy time per packet)",
        echo,
        base / echo
    );
    println!(
        "RC WRITE, 2 EmuDevices:     {:>12.0} packets/s ({:.1}x the memcpy time per packet)",
        rc,
        base / rc
    );
}
