//! Hello, RDMA: the shortest tour of the verbs, for a first read.
//!
//! Two emulated NICs on loopback UDP. Each registers memory, creates a completion queue
//! and a reliable-connected queue pair, and the two QPs are connected by walking them
//! RESET -> INIT -> RTR -> RTS. Then one side SENDs a message, RDMA WRITEs into the
//! other's memory, RDMA READs it back and does an atomic fetch-and-add, polling the
//! completion queue after each.
//!
//! Run: `cargo run --release -p emu-core --example hello_rdma`

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

#[path = "common/checks.rs"]
mod checks;
use checks::{die, OrDie};

/// One side: a device and the objects a program needs.
struct Side {
    ctx: Context,
    mem: MemBuf,
    mr: Mr,
    cq: Cq,
    qp: Qp,
}

fn side(ip: [u8; 4], port: u16) -> Side {
    // 1. Open a device (an emulated one here; a real NIC is opened differently and the
    //    rest stays the same).
    let dev = Arc::new(
        EmuDevice::open(EmuConfig {
            ip: Ipv4Addr::from(ip).into(),
            port,
            ..EmuConfig::default()
        })
        .unwrap_or_else(|e| {
            die(&format!(
                "cannot open an emulated device on {}:{port}: {e}",
                Ipv4Addr::from(ip)
            ))
        }),
    );
    let ctx = Context::new(dev);
    // 2. A protection domain, and memory registered in it that peers may read and write.
    let pd = ctx.alloc_pd().or_die("alloc_pd");
    let mem = MemBuf::new(4096);
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.reg_mr(&mem, access).or_die("reg_mr");
    // 3. A completion queue and a queue pair that reports to it (128 WRs of one SGE
    //    each way, every send completing; `QpBuilder` changes any of it).
    let cq = ctx.create_cq(16, None).or_die("create_cq");
    let qp = pd.qp(QpType::Rc, &cq).build().or_die("create_qp");
    Side {
        ctx,
        mem,
        mr,
        cq,
        qp,
    }
}

/// 4. Connect: the QP numbers and GIDs were exchanged (here, in memory; normally over
///    TCP or the connection manager), then RESET -> INIT -> RTR -> RTS.
fn connect(me: &Side, peer: &Side) {
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpParams::default() // MTU 1024, timeout 14, 7 retries, one READ in flight
    };
    let remote = Endpoint {
        qpn: peer.qp.qpn(),
        gid: peer.ctx.gid().or_die("query_gid"),
        ..Endpoint::default()
    };
    // Each transition with the attributes IBTA requires of it for RC (manual 3.5).
    me.qp.connect(&params, 0, &remote).or_die("connect");
}

/// 5. Wait for one completion.
fn poll_one(cq: &Cq) -> WorkCompletion {
    let wc = cq
        .wait(Duration::from_secs(5))
        .or_die("wait for a completion");
    if wc.status != WcStatus::Success {
        die(&format!("work request {} failed: {}", wc.wr_id, wc.status));
    }
    wc
}

fn main() {
    checks::no_args();
    let port = checks::env_port();
    let (a, b) = (side([127, 0, 0, 1], port), side([127, 0, 0, 2], port));
    connect(&a, &b);
    connect(&b, &a);

    // SEND: b posts a receive buffer first; a's message lands in it.
    b.qp.post_recv(&[RecvWr::new(1, b.mr.sge(0, 64))])
        .or_die("post_recv");
    a.mem.write(0, b"hello, rdma").or_die("write");
    a.qp.post_send(&[SendWr::send(10, a.mr.sge(0, 11))])
        .or_die("post_send");
    poll_one(&a.cq);
    let got = poll_one(&b.cq);
    let mut text = vec![0u8; got.byte_len as usize];
    b.mem.read(0, &mut text).or_die("read");
    println!("SEND:  b received {:?}", String::from_utf8_lossy(&text));

    // RDMA WRITE: straight into b's memory, b's CPU not involved.
    a.mem.write(100, b"written by a").or_die("write");
    a.qp.post_send(&[SendWr::rdma_write(
        11,
        a.mr.sge(100, 12),
        b.mr.addr(100),
        b.mr.rkey(),
    )])
    .or_die("post_send");
    poll_one(&a.cq);
    let mut w = [0u8; 12];
    b.mem.read(100, &mut w).or_die("read");
    println!(
        "WRITE: b's memory now holds {:?}",
        String::from_utf8_lossy(&w)
    );

    // RDMA READ: fetch it back into a different place in a's memory.
    a.qp.post_send(&[SendWr::rdma_read(
        12,
        a.mr.sge(200, 12),
        b.mr.addr(100),
        b.mr.rkey(),
    )])
    .or_die("post_send");
    poll_one(&a.cq);
    a.mem.read(200, &mut w).or_die("read");
    println!("READ:  a read back {:?}", String::from_utf8_lossy(&w));

    // Atomic fetch-and-add on an 8-byte counter in b's memory; the old value comes back.
    b.mem.write_u64(512, 41).or_die("write_u64");
    a.qp.post_send(&[SendWr::atomic_fetch_add(
        13,
        a.mr.sge(512, 8),
        b.mr.addr(512),
        b.mr.rkey(),
        1,
    )])
    .or_die("post_send");
    poll_one(&a.cq);
    println!(
        "FETCH_ADD: old value {}, counter now {}",
        a.mem.read_u64(512).or_die("read_u64"),
        b.mem.read_u64(512).or_die("read_u64")
    );
}
