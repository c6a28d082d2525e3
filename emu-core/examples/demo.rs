//! The README's demo: two emulated RDMA NICs on loopback UDP (127.0.0.1 and 127.0.0.2,
//! port 4791), programmed only through the `Device` trait, doing every RC operation and
//! printing what happened, then measuring RDMA WRITE throughput.
//!
//! Run: `cargo run --release -p emu-core --example demo`

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

#[path = "common/checks.rs"]
mod checks;
use checks::{die, OrDie};

const BUF: usize = 64 << 20;

struct Nic {
    dev: EmuDevice,
    cq: CqId,
    qpn: u32,
    buf: MemBuf,
    mr: MrInfo,
}

fn open(ip: [u8; 4], port: u16) -> Nic {
    let ip = Ipv4Addr::from(ip);
    let dev = EmuDevice::open(EmuConfig {
        name: format!("emu{}", ip.octets()[3] - 1),
        ip,
        port,
        ..EmuConfig::default()
    })
    .unwrap_or_else(|e| {
        die(&format!(
            "cannot open an emulated device on {ip}:{port}: {e}"
        ))
    });
    let pd = dev.alloc_pd().or_die("alloc_pd");
    let cq = dev.create_cq(4096, None).or_die("create_cq");
    let cap = QpCap {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qpn = dev
        .create_qp(&QpInitAttr {
            pd,
            send_cq: cq,
            recv_cq: cq,
            qp_type: QpType::Rc,
            cap,
            sq_sig_all: false,
            srq: None,
        })
        .or_die("create_qp");
    let buf = MemBuf::new(BUF);
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = dev.reg_mr(pd, &buf, 0, BUF, all).or_die("reg_mr");
    Nic {
        dev,
        cq,
        qpn,
        buf,
        mr,
    }
}

fn connect(n: &Nic, peer: &Nic) {
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        path_mtu: Mtu::Mtu4096,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        ..QpParams::default()
    };
    let remote = Endpoint {
        qpn: peer.qpn,
        gid: peer.dev.gid(),
        ..Endpoint::default()
    };
    connect_qp(&n.dev, n.qpn, QpType::Rc, &params, 0, &remote).or_die("connect_qp");
}

impl Nic {
    fn post(&self, wr_id: u64, op: WrOperation, off: u64, len: u32) {
        let sg_list = vec![Sge {
            addr: self.mr.addr + off,
            length: len,
            lkey: self.mr.lkey,
        }];
        self.dev
            .post_send(
                self.qpn,
                &[SendWr {
                    wr_id,
                    sg_list: sg_list.into(),
                    op,
                    send_flags: SendFlags::SIGNALED,
                    ud: None,
                }],
            )
            .or_die("post_send");
    }

    fn wait(&self, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.len() < n && Instant::now() < deadline {
            self.dev
                .poll_cq(self.cq, n - out.len(), &mut out)
                .or_die("poll_cq");
            std::thread::yield_now();
        }
        if out.len() < n {
            die(&format!("{} of {n} completions after 10 s", out.len()));
        }
        out
    }

    fn show(&self, who: &str, n: usize) {
        for wc in self.wait(n) {
            let imm = if wc.wc_flags.contains(WcFlags::WITH_IMM) {
                format!(" imm=0x{:x}", wc.imm_data)
            } else {
                String::new()
            };
            println!(
                "    {who}: wr_id={} {:?} \"{}\" byte_len={}{imm}",
                wc.wr_id, wc.opcode, wc.status, wc.byte_len
            );
        }
    }
}

fn main() {
    checks::no_args();
    let port = checks::env_port();
    let a = open([127, 0, 0, 1], port);
    let b = open([127, 0, 0, 2], port);
    connect(&a, &b);
    connect(&b, &a);
    let attr = a.dev.query_device().or_die("query_device");
    let p = a.dev.query_port(1).or_die("query_port");
    println!("two emulated RoCEv2 NICs on UDP port {port}:");
    for n in [&a, &b] {
        println!("  {} GID {} QPN 0x{:06x}", n.dev.name(), n.dev.gid(), n.qpn);
    }
    println!(
        "  max_qp={} max_qp_wr={} max_cqe={} port: {} MTU {} link layer {}\n",
        attr.max_qp,
        attr.max_qp_wr,
        attr.max_cqe,
        p.state,
        p.active_mtu.bytes(),
        p.link_layer
    );

    println!("1. SEND with immediate, 10000 bytes (3 packets at MTU 4096):");
    a.buf.write(0, &[7; 10000]).or_die("write");
    b.dev
        .post_recv(
            b.qpn,
            &[RecvWr {
                wr_id: 100,
                sg_list: vec![Sge {
                    addr: b.mr.addr,
                    length: 16384,
                    lkey: b.mr.lkey,
                }]
                .into(),
            }],
        )
        .or_die("post_recv");
    a.post(1, WrOperation::SendWithImm { imm_data: 0x1234 }, 0, 10000);
    a.show("emu0", 1);
    b.show("emu1", 1);

    println!("2. RDMA WRITE 5000 bytes into emu1's memory (no receive consumed):");
    a.post(
        2,
        WrOperation::RdmaWrite {
            remote_addr: b.mr.addr + 65536,
            rkey: b.mr.rkey,
        },
        0,
        5000,
    );
    a.show("emu0", 1);
    println!("3. RDMA READ them back:");
    a.post(
        3,
        WrOperation::RdmaRead {
            remote_addr: b.mr.addr + 65536,
            rkey: b.mr.rkey,
        },
        131072,
        5000,
    );
    a.show("emu0", 1);
    let same = a.buf.with(|m| m[131072..136072].iter().all(|&x| x == 7));
    println!("    the bytes read back are the bytes written: {same}");

    println!("4. FETCH_AND_ADD 5, then COMPARE_AND_SWAP 5 -> 99, on a counter in emu1:");
    b.buf.write_u64(262144, 0).or_die("write_u64");
    a.post(
        4,
        WrOperation::AtomicFetchAndAdd {
            remote_addr: b.mr.addr + 262144,
            rkey: b.mr.rkey,
            add: 5,
        },
        8,
        8,
    );
    a.post(
        5,
        WrOperation::AtomicCmpAndSwp {
            remote_addr: b.mr.addr + 262144,
            rkey: b.mr.rkey,
            compare: 5,
            swap: 99,
        },
        16,
        8,
    );
    a.show("emu0", 2);
    println!(
        "    counter: {} (originals returned: {} and {})",
        b.buf.read_u64(262144).or_die("read_u64"),
        a.buf.read_u64(8).or_die("read_u64"),
        a.buf.read_u64(16).or_die("read_u64")
    );

    println!(
        "5. throughput: RDMA WRITE of 64 KiB messages, 16 in flight, ICRC computed and checked:"
    );
    let msgs = 8192u64;
    let start = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut wcs = Vec::new();
    while done < msgs {
        while posted < msgs && posted - done < 16 {
            let off = (posted % 512) * 65536;
            a.post(
                1000 + posted,
                WrOperation::RdmaWrite {
                    remote_addr: b.mr.addr + off,
                    rkey: b.mr.rkey,
                },
                off,
                65536,
            );
            posted += 1;
        }
        wcs.clear();
        a.dev.poll_cq(a.cq, 16, &mut wcs).or_die("poll_cq");
        if let Some(w) = wcs.iter().find(|w| w.status != WcStatus::Success) {
            die(&format!("RDMA WRITE {} failed: {}", w.wr_id, w.status));
        }
        done += wcs.len() as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "    {msgs} x 64 KiB in {secs:.2} s = {:.0} MB/s",
        (msgs * 65536) as f64 / secs / 1e6
    );

    println!("6. RDMA WRITE with a wrong rkey: remote access error, both QPs to ERR:");
    a.post(
        6,
        WrOperation::RdmaWrite {
            remote_addr: b.mr.addr,
            rkey: b.mr.rkey ^ 0x100,
        },
        0,
        64,
    );
    a.show("emu0", 1);
    if let Ok(ev) = b.dev.get_async_event(Some(Duration::from_secs(5))) {
        println!(
            "    emu1 async event: \"{}\" on {:?}",
            ev.event_type, ev.element
        );
    }
    let c = b.dev.counters();
    println!(
        "\nemu1 counters: {} packets in, {} out, {} duplicates, {} retransmissions",
        c.rx_packets,
        c.tx_packets,
        c.duplicate_requests,
        a.dev.counters().retransmissions
    );
}
