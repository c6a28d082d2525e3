//! Two emulated RC NICs in one process, joined by an in-memory wire: every RC
//! operation, with the packets each one puts on the wire and the completions it
//! produces, then a short throughput run of 64 KiB RDMA WRITEs.
//!
//! Run: `cargo run --release -p emu-core --example engine_demo`

use std::time::{Duration, Instant};

use emu_core::engine::{Engine, MAX_PACKET};
use emu_wire::{check_icrc, write_icrc, Ipv4Endpoints, PacketRepr};
use verbs_api::{
    AccessFlags, Endpoint, Gid, MemBuf, Mtu, QpCap, QpParams, QpType, RecvWr, SendWr, Sge,
    WorkCompletion,
};
use verbs_api::{CqId, MrInfo, QpInitAttr};

#[path = "common/checks.rs"]
mod checks;
use checks::OrDie;

struct Nic {
    name: &'static str,
    engine: Engine,
    gid: Gid,
    cq: CqId,
    qpn: u32,
    buf: MemBuf,
    mr: MrInfo,
}

const BUF: usize = 1 << 20;

fn nic(name: &'static str, ip: [u8; 4]) -> Nic {
    let mut engine = Engine::default();
    // The port's GID: the address its packets leave from (a QP's path names it by index).
    engine.set_gid(Gid::from_ipv4(ip.into()));
    let pd = engine.alloc_pd().or_die("alloc_pd");
    let cq = engine.create_cq(4096).or_die("create_cq");
    let cap = QpCap {
        max_send_wr: 1024,
        max_recv_wr: 1024,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qpn = engine
        .create_qp(QpInitAttr::new(pd, cq, QpType::Rc, cap))
        .or_die("create_qp");
    let buf = MemBuf::new(BUF);
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = engine.reg_mr(pd, &buf, 0, BUF, access).or_die("reg_mr");
    Nic {
        name,
        engine,
        gid: Gid::from_ipv4(ip.into()),
        cq,
        qpn,
        buf,
        mr,
    }
}

/// RESET -> INIT -> RTR -> RTS, as every RC program does after exchanging QP numbers.
fn connect(n: &mut Nic, peer_qpn: u32, peer_gid: Gid, now: Instant) {
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
        qpn: peer_qpn,
        gid: peer_gid,
        ..Endpoint::default()
    };
    // The engine takes the same three modifies as the verbs, with the time passed in.
    for (attr, mask) in [
        params.init(QpType::Rc),
        params.rtr(QpType::Rc, &remote),
        params.rts(QpType::Rc, 0),
    ] {
        n.engine
            .modify_qp(now, n.qpn, &attr, mask)
            .or_die("modify_qp");
    }
}

/// Moves packets between the two engines until both are idle; returns packets moved.
fn run(x: &mut Nic, y: &mut Nic, now: Instant, show: bool) -> usize {
    let mut buf = vec![0u8; MAX_PACKET];
    let mut moved = 0;
    loop {
        let n = deliver(x, y, now, show, &mut buf) + deliver(y, x, now, show, &mut buf);
        if n == 0 {
            return moved;
        }
        moved += n;
    }
}

/// Moves every packet `from` wants to send now to `to`, filling in the ICRC on the way
/// out and checking it on the way in, as a UDP link does.
fn deliver(from: &mut Nic, to: &mut Nic, now: Instant, show: bool, buf: &mut [u8]) -> usize {
    let ep = Ipv4Endpoints {
        src: from.gid.to_ipv4().or_die("to_ipv4"),
        dst: to.gid.to_ipv4().or_die("to_ipv4"),
        ip_id: 0,
        src_port: 4791,
        dst_port: 4791,
    };
    let mut moved = 0;
    while let Some(t) = from.engine.poll_transmit(now, buf) {
        let packet = &mut buf[..t.size];
        write_icrc(&ep, packet);
        if show {
            let (repr, payload) = PacketRepr::parse(packet).or_die("parse");
            let aeth = repr
                .aeth
                .map(|a| format!(" AETH {:?} msn={}", a.syndrome, a.msn))
                .unwrap_or_default();
            println!(
                "    {} -> {}  {:<34} psn={:<4} {:>5} B{aeth}",
                from.name,
                to.name,
                repr.bth.opcode.name(),
                repr.bth.psn,
                payload.len()
            );
        }
        if check_icrc(&ep, packet) {
            to.engine.handle_datagram(now, from.gid, packet);
        }
        moved += 1;
    }
    moved
}

fn completions(n: &mut Nic) -> Vec<WorkCompletion> {
    let mut v = Vec::new();
    n.engine.poll_cq(n.cq, usize::MAX, &mut v).or_die("poll_cq");
    v
}

fn show(n: &mut Nic) {
    for wc in completions(n) {
        println!(
            "    {} completion: wr_id={} {:?} {} byte_len={}",
            n.name, wc.wr_id, wc.opcode, wc.status, wc.byte_len
        );
    }
}

fn main() {
    checks::no_args();
    let now = Instant::now();
    let mut a = nic("A", [10, 0, 0, 1]);
    let mut b = nic("B", [10, 0, 0, 2]);
    let (aq, bq, ag, bg) = (a.qpn, b.qpn, a.gid, b.gid);
    connect(&mut a, bq, bg, now);
    connect(&mut b, aq, ag, now);
    println!(
        "two emulated RC NICs: A qpn={:#x}, B qpn={:#x}, path MTU 4096\n",
        a.qpn, b.qpn
    );

    let sge = |n: &Nic, off: u64, len: u32| Sge {
        addr: n.mr.addr + off,
        length: len,
        lkey: n.mr.lkey,
    };
    // Every WR signaled: the QPs were created with sq_sig_all off.
    let post = |n: &mut Nic, wr: SendWr| {
        n.engine
            .post_send(now, n.qpn, &[wr.signaled()])
            .or_die("post_send");
    };

    println!("1. SEND 10000 bytes with immediate data (B posted a receive):");
    a.buf.write(0, &[7u8; 10000]).or_die("write");
    let recv = RecvWr::new(100, sge(&b, 0, 16384));
    b.engine.post_recv(now, b.qpn, &[recv]).or_die("post_recv");
    let wr = SendWr::send_with_imm(1, sge(&a, 0, 10000), 0x1234);
    post(&mut a, wr);
    run(&mut a, &mut b, now, true);
    show(&mut a);
    show(&mut b);

    println!("\n2. RDMA WRITE 5000 bytes into B's memory (no receive needed):");
    let (b_addr, b_rkey) = (b.mr.addr, b.mr.rkey);
    let wr = SendWr::rdma_write(2, sge(&a, 0, 5000), b_addr + 65536, b_rkey);
    post(&mut a, wr);
    run(&mut a, &mut b, now, true);
    show(&mut a);

    println!("\n3. RDMA READ 4100 bytes back from B:");
    let wr = SendWr::rdma_read(3, sge(&a, 131072, 4100), b_addr + 65536, b_rkey);
    post(&mut a, wr);
    run(&mut a, &mut b, now, true);
    show(&mut a);

    println!("\n4. FETCH_AND_ADD 5, then COMPARE_AND_SWAP 5 -> 99 on B's counter:");
    b.buf.write_u64(262144, 0).or_die("write_u64");
    let (old_add, old_cas) = (sge(&a, 8, 8), sge(&a, 16, 8));
    let counter = b_addr + 262144;
    post(
        &mut a,
        SendWr::atomic_fetch_add(4, old_add, counter, b_rkey, 5),
    );
    post(
        &mut a,
        SendWr::atomic_cmp_swp(5, old_cas, counter, b_rkey, 5, 99),
    );
    run(&mut a, &mut b, now, true);
    show(&mut a);
    println!(
        "    B's counter is now {}",
        b.buf.read_u64(262144).or_die("read_u64")
    );

    println!("\n5. RDMA WRITE with a wrong rkey: NAK, error completion, QP to ERR on both sides:");
    let wr = SendWr::rdma_write(6, sge(&a, 0, 64), b_addr, b_rkey ^ 0x100);
    post(&mut a, wr);
    run(&mut a, &mut b, now, true);
    show(&mut a);
    while let Some(ev) = b.engine.poll_event() {
        println!("    B async event: {} on {:?}", ev.event_type, ev.element);
    }

    println!("\n6. throughput: 64 KiB RDMA WRITEs through the engines, ICRC computed and checked:");
    let mut a = nic("A", [10, 0, 0, 1]);
    let mut b = nic("B", [10, 0, 0, 2]);
    let (aq, bq, ag, bg) = (a.qpn, b.qpn, a.gid, b.gid);
    connect(&mut a, bq, bg, now);
    connect(&mut b, aq, ag, now);
    let (b_addr, b_rkey) = (b.mr.addr, b.mr.rkey);
    let msgs = 4096u64;
    let start = Instant::now();
    let mut done = 0;
    let mut posted = 0;
    while done < msgs {
        while posted < msgs && posted - done < 64 {
            let off = (posted % 8) * 65536;
            let wr = SendWr::rdma_write(posted, sge(&a, off, 65536), b_addr + off, b_rkey);
            post(&mut a, wr);
            posted += 1;
        }
        run(&mut a, &mut b, now, false);
        done += completions(&mut a).len() as u64;
    }
    let secs = start
        .elapsed()
        .as_secs_f64()
        .max(Duration::from_nanos(1).as_secs_f64());
    println!(
        "    {msgs} x 64 KiB in {:.3} s: {:.0} MB/s",
        secs,
        (msgs * 65536) as f64 / secs / 1e6
    );
}
