//! The README's demo: two emulated RDMA NICs on loopback UDP (127.0.0.1 and 127.0.0.2,
//! port 4791), programmed through the verbs API's handles, doing every RC operation and
//! printing what happened, then measuring RDMA WRITE throughput.
//!
//! Run: `cargo run --release -p emu-core --example demo`

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

#[path = "common/checks.rs"]
mod checks;
use checks::{die, OrDie};

const BUF: usize = 64 << 20;

struct Nic {
    dev: Arc<EmuDevice>,
    cq: Cq,
    qp: Qp,
    buf: MemBuf,
    mr: Mr,
}

fn open(ip: [u8; 4], port: u16) -> Nic {
    let ip = Ipv4Addr::from(ip);
    let dev = Arc::new(
        EmuDevice::open(EmuConfig {
            name: format!("emu{}", ip.octets()[3] - 1),
            ip: ip.into(),
            port,
            ..EmuConfig::default()
        })
        .unwrap_or_else(|e| {
            die(&format!(
                "cannot open an emulated device on {ip}:{port}: {e}"
            ))
        }),
    );
    let ctx = Context::new(dev.clone());
    let pd = ctx.alloc_pd().or_die("alloc_pd");
    let cq = ctx.create_cq(4096, None).or_die("create_cq");
    let qp = pd
        .qp(QpType::Rc, &cq)
        .max_send_wr(256)
        .max_recv_wr(256)
        .max_inline_data(64)
        .sq_sig_all(false)
        .build()
        .or_die("create_qp");
    let buf = MemBuf::new(BUF);
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.reg_mr(&buf, all).or_die("reg_mr");
    Nic {
        dev,
        cq,
        qp,
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
        qpn: peer.qp.qpn(),
        gid: peer.dev.gid(),
        ..Endpoint::default()
    };
    n.qp.connect(&params, 0, &remote).or_die("connect_qp");
}

impl Nic {
    /// Posts `wr`, signaled (the QP signals only the WRs that ask).
    fn post(&self, wr: SendWr) {
        self.qp.post_send(&[wr.signaled()]).or_die("post_send");
    }

    /// Waits for `n` completions, 10 s for each, and prints them.
    fn show(&self, who: &str, n: usize) {
        for got in 0..n {
            let wc = match self.cq.wait(Duration::from_secs(10)) {
                Ok(wc) => wc,
                Err(Error::TimedOut) => die(&format!("{got} of {n} completions after 10 s")),
                Err(e) => die(&format!("poll_cq: {e}")),
            };
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
        let (name, gid, qpn) = (n.dev.name(), n.dev.gid(), n.qp.qpn());
        println!("  {name} GID {gid} QPN 0x{qpn:06x}");
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
    b.qp.post_recv(&[RecvWr::new(100, b.mr.sge(0, 16384))])
        .or_die("post_recv");
    a.post(SendWr::send_with_imm(1, a.mr.sge(0, 10000), 0x1234));
    a.show("emu0", 1);
    b.show("emu1", 1);

    println!("2. RDMA WRITE 5000 bytes into emu1's memory (no receive consumed):");
    let (far, rkey) = (b.mr.addr(65536), b.mr.rkey());
    a.post(SendWr::rdma_write(2, a.mr.sge(0, 5000), far, rkey));
    a.show("emu0", 1);
    println!("3. RDMA READ them back:");
    a.post(SendWr::rdma_read(3, a.mr.sge(131072, 5000), far, rkey));
    a.show("emu0", 1);
    let same = a.buf.with(|m| m[131072..136072].iter().all(|&x| x == 7));
    println!("    the bytes read back are the bytes written: {same}");

    println!("4. FETCH_AND_ADD 5, then COMPARE_AND_SWAP 5 -> 99, on a counter in emu1:");
    b.buf.write_u64(262144, 0).or_die("write_u64");
    let counter = b.mr.addr(262144);
    let (old_add, old_cas) = (a.mr.sge(8, 8), a.mr.sge(16, 8));
    a.post(SendWr::atomic_fetch_add(4, old_add, counter, rkey, 5));
    a.post(SendWr::atomic_cmp_swp(5, old_cas, counter, rkey, 5, 99));
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
            let sge = a.mr.sge(off, 65536);
            a.post(SendWr::rdma_write(1000 + posted, sge, b.mr.addr(off), rkey));
            posted += 1;
        }
        // One poll a round, as many as are there: on an emulated device an empty poll
        // receives from the socket itself, so draining the CQ would cost a receive.
        wcs.clear();
        a.cq.poll(16, &mut wcs).or_die("poll_cq");
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
    a.post(SendWr::rdma_write(
        6,
        a.mr.sge(0, 64),
        b.mr.addr(0),
        rkey ^ 0x100,
    ));
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
