//! Per-packet costs of the wire layer: parsing, emitting and the ICRC, for the packets
//! that dominate traffic (an 8-byte SEND, a 4096-byte WRITE MIDDLE, an ACK).
//!
//! `cargo bench -p emu-wire --bench packet`; criterion prints time per packet and
//! bytes per second.
#![allow(missing_docs)] // criterion_group! generates an undocumented function

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use emu_wire::{
    check_icrc, icrc_ip_id, write_icrc, Ipv4Endpoints, Opcode, PacketRepr, Psn, RethRepr,
};

fn ep() -> Ipv4Endpoints {
    Ipv4Endpoints {
        src: Ipv4Addr::new(127, 0, 0, 1),
        dst: Ipv4Addr::new(127, 0, 0, 2),
        ip_id: 0,
        src_port: emu_wire::ROCEV2_PORT,
        dst_port: emu_wire::ROCEV2_PORT,
    }
}

/// (name, headers, payload length)
fn cases() -> Vec<(&'static str, PacketRepr, usize)> {
    let mut first = PacketRepr::new(Opcode::RcRdmaWriteFirst, 0x11, Psn::new(7));
    first.reth = Some(RethRepr {
        va: 0x7f00_0000_1000,
        rkey: 0x1234,
        dma_len: 65536,
    });
    vec![
        (
            "send_only_8",
            PacketRepr::new(Opcode::RcSendOnly, 0x11, Psn::new(7)),
            8,
        ),
        ("write_first_4096", first, 4096),
        (
            "write_middle_4096",
            PacketRepr::new(Opcode::RcRdmaWriteMiddle, 0x11, Psn::new(8)),
            4096,
        ),
        (
            "ack",
            PacketRepr::new(Opcode::RcAcknowledge, 0x11, Psn::new(9)),
            0,
        ),
    ]
}

fn build(repr: &PacketRepr, len: usize) -> Vec<u8> {
    let payload = vec![0xA5u8; len];
    let mut buf = vec![0u8; repr.buffer_len(len)];
    let n = repr.emit(&mut buf, &payload);
    buf.truncate(n);
    write_icrc(&ep(), &mut buf);
    buf
}

fn benches(c: &mut Criterion) {
    for (name, repr, len) in cases() {
        let packet = build(&repr, len);
        let payload = vec![0xA5u8; len];
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Bytes(packet.len() as u64));
        g.bench_function("parse", |b| {
            b.iter(|| PacketRepr::parse(black_box(&packet)).map(|(r, p)| (r.bth.psn, p.len())))
        });
        let mut out = vec![0u8; packet.len()];
        g.bench_function("emit", |b| {
            b.iter(|| black_box(&repr).emit(black_box(&mut out), black_box(&payload)))
        });
        let mut w = packet.clone();
        g.bench_function("icrc_write", |b| {
            b.iter(|| write_icrc(black_box(&ep()), black_box(&mut w)))
        });
        g.bench_function("icrc_check", |b| {
            b.iter(|| check_icrc(black_box(&ep()), black_box(&packet)))
        });
        // A receive solves the sender's IP ID from the ICRC: free for ID 0, a few dozen
        // table lookups more for any other.
        let mut numbered = packet.clone();
        write_icrc(
            &Ipv4Endpoints {
                ip_id: 0x1234,
                ..ep()
            },
            &mut numbered,
        );
        g.bench_function("icrc_ip_id", |b| {
            b.iter(|| icrc_ip_id(black_box(&ep()), black_box(&numbered)))
        });
        g.finish();
    }
}

criterion_group!(packet, benches);
criterion_main!(packet);
