//! tshark agrees: a pcap with one packet of every opcode in the table decodes as
//! InfiniBand with the opcode, QPN and PSN written, and passes the clean-decode filter of
//! roce-wire.md. tshark does not check the ICRC, so every ICRC in the file is re-verified
//! here. Skipped (with a printed reason) only when tshark is absent, unless
//! REQUIRE_TSHARK is set, as `.ci/run` does.

use std::process::Command;
use std::time::Duration;

use emu_wire::*;

/// tshark's InfiniBand payload heuristics misread arbitrary test payloads (RPC-over-RDMA,
/// SMB Direct, ...); these flags turn them off.
const NO_HEURISTICS: &[&str] = &[
    "--disable-heuristic",
    "rpcrdma_infiniband",
    "--disable-heuristic",
    "smb_direct_infiniband",
    "--disable-heuristic",
    "smcr_infiniband",
    "--disable-heuristic",
    "iser_infiniband",
    "--disable-heuristic",
    "lnet_ib",
    "--disable-heuristic",
    "sdp_infiniband",
    "--disable-heuristic",
    "fc_infiniband",
    "--disable-heuristic",
    "mellanox_eoib",
    "--disable-heuristic",
    "nvme_rdma",
    "--disable-heuristic",
    "eth_over_ib",
    "--disable-heuristic",
    "drbd_rdma",
];

const CLEAN: &str = r#"udp.dstport==4791 && (!infiniband.bth || _ws.malformed || _ws.expert.severity >= "Warning" || infiniband.vendor || infiniband.bth.tver != 0)"#;

fn tshark(args: &[&str]) -> String {
    let out = Command::new("tshark")
        .args(NO_HEURISTICS)
        .args(args)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn tshark_decodes_every_opcode_cleanly() {
    if Command::new("tshark").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("REQUIRE_TSHARK").is_none(),
            "REQUIRE_TSHARK is set but tshark is not installed"
        );
        println!("skipping: tshark not installed");
        return;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let path = std::env::temp_dir().join(format!(
        "emu-wire-tshark-{}-{nanos}.pcap",
        std::process::id()
    ));
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    let ep = Ipv4Endpoints {
        src: [10, 9, 0, 2].into(),
        dst: [10, 9, 0, 1].into(),
        ip_id: 0x1234,
        src_port: 49441,
        dst_port: 4791,
    };
    let mut expected = Vec::new();
    // tshark 4.0's InfiniBand dissector predates IBTA 1.5: it shows FLUSH and ATOMIC
    // WRITE as "Unknown OpCode" (the rxe corpus's tshark fields for them are empty too),
    // so they are left out here; tests/golden.rs checks them against kernel rxe 6.12.
    // It shows the XRC opcodes (0xA0..) as "Unknown OpCode" too, so they are left out
    // as well; src/packet.rs checks them against bytes written from the XRC annex.
    let ops: Vec<Opcode> = Opcode::ALL
        .iter()
        .copied()
        .filter(|o| !o.is_flush() && !o.is_atomic_write())
        .filter(|o| o.transport() != emu_wire::Transport::Xrc)
        .collect();
    for (i, op) in ops.iter().enumerate() {
        let qpn = 0x11 + i as u32;
        let psn = Psn::new(0xFF_FFF0 + 3 * i as u32);
        let mut repr = PacketRepr::new(*op, qpn, psn);
        if let Some(r) = repr.reth.as_mut() {
            *r = RethRepr {
                va: 0x7fa9_d4ea_f000,
                rkey: 0x25a,
                dma_len: 61,
            };
        }
        if let Some(d) = repr.deth.as_mut() {
            d.qkey = 0x1111_1111;
            d.src_qp = 0x16;
        }
        let payload: Vec<u8> = if op.has_payload() {
            (0..61u8).collect()
        } else {
            Vec::new()
        };
        let mut buf = vec![0u8; repr.buffer_len(payload.len())];
        let n = repr.emit(&mut buf, &payload);
        write_icrc(&ep, &mut buf[..n]);
        w.write_roce(Duration::from_millis(i as u64), &ep, &buf[..n])
            .unwrap();
        expected.push(format!(
            "{}\t{}\t{}\t{}",
            i + 1,
            u8::from(*op),
            qpn,
            psn.value()
        ));
    }
    drop(w);
    let p = path.to_str().unwrap();
    let fields = tshark(&[
        "-r",
        p,
        "-T",
        "fields",
        "-e",
        "frame.number",
        "-e",
        "infiniband.bth.opcode",
        "-e",
        "infiniband.bth.destqp",
        "-e",
        "infiniband.bth.psn",
    ]);
    let got: Vec<String> = fields
        .lines()
        .map(|l| {
            // destqp prints as hex (0x000011); normalise to decimal.
            let c: Vec<&str> = l.split('\t').collect();
            let qp = u32::from_str_radix(c[2].trim_start_matches("0x"), 16).unwrap();
            format!("{}\t{}\t{}\t{}", c[0], c[1], qp, c[3])
        })
        .collect();
    assert_eq!(got, expected);
    let dirty = tshark(&["-r", p, "-Y", CLEAN]);
    assert!(
        dirty.trim().is_empty(),
        "frames that do not decode cleanly:\n{dirty}"
    );
    // Every ICRC in the file, re-verified from the file itself.
    let bytes = std::fs::read(&path).unwrap();
    let mut at = 24;
    let mut frames = 0;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        assert!(check_icrc_frame(&bytes[at + 16..at + 16 + len]).unwrap());
        at += 16 + len;
        frames += 1;
    }
    assert_eq!(frames, ops.len());
    std::fs::remove_file(&path).ok();
}
