//! Our side of perftest's `ib_write_bw`, `ib_read_bw` and `ib_atomic_bw` (RC, one QP,
//! half duplex), over an emulated device: either end can be perftest (4.5, protocol of
//! perftest >= 5.70, as Debian 12's `perftest 4.5+0.17` which says "6.06").
//!
//! ```text
//! perftest_peer write|read|atomic [options]        server: waits on TCP port 18515
//! perftest_peer write|read|atomic [options] HOST   client: runs the test against HOST
//! options: -s SIZE (65536; atomic 8)  -n ITERS (5000)  -p TCP_PORT (18515)  --ip ADDR
//!          --udp-port N (4791)  -t TX_DEPTH (128)  --timeout SECS (60)  --interop
//! ```
//! perftest must be given `-x GID_INDEX` (its GID form of the exchange; on RoCE it uses
//! that form anyway), and the same `-s` and `-n`.
//!
//! perftest's out-of-band exchange, on one TCP connection, where in each exchange the
//! client writes first and the server reads first (facts read from perftest's
//! `perftest_communication.c`; the code is ours):
//! 1. the version, 16 bytes (`"6.06"`, NUL-padded); each side refuses a peer older
//!    than 5.70;
//! 2. the cycle buffer (page size) and the cache line size, 4 bytes each, big endian;
//!    each side uses the larger;
//! 3. the MTU as `"%d"` of the `ibv_mtu` code and its NUL (2 bytes); each side uses the
//!    smaller;
//! 4. the QP's keys, 108 bytes:
//!    `"%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:" + "%08x:"` and a NUL: LID,
//!    outstanding reads (the responder's `max_dest_rd_atomic`, which the requester uses
//!    as its `max_rd_atomic`), QPN, PSN, RKEY, VADDR, GID bytes, SRQN;
//! 5. the keys again (after both moved their QP to RTR/RTS), and once more;
//! 6. the client runs the test; the server waits in a 7th key exchange;
//! 7. the reports: message size and iterations (u64, big endian), peak BW, average
//!    BW, average message rate (f64, big-endian bits);
//! 8. a last key exchange, then each side writes `"done"` and its NUL and closes.
//!
//! The client posts WRITE, READ or FETCH AND ADD (add 1) work requests of SIZE bytes to
//! the server's VADDR + k * SIZE within the cycle buffer (as perftest), keeping up to
//! TX_DEPTH in flight, and fails unless all ITERS complete with SUCCESS. As server
//! (WRITE, READ and atomics land in our registered buffer), it checks what it can:
//! after WRITE that the buffer changed; after ATOMIC that the 64-bit words add up to
//! the client's iteration count.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_core::nic::interop::LinkOptions;
use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

const VERSION: &str = "6.06";
const PAGE: u32 = 4096;
const CACHE_LINE: u32 = 64;
const KEY_MSG: usize = 108;
/// READs/atomics our responder accepts (the emulator allows 128).
const OUT_READS: u32 = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verb {
    Write,
    Read,
    Atomic,
}

struct Opts {
    verb: Verb,
    server: Option<String>,
    size: usize,
    iters: u64,
    tcp_port: u16,
    ip: Ipv4Addr,
    udp_port: u16,
    tx_depth: usize,
    timeout: u64,
    interop: bool,
}

#[path = "common/checks.rs"]
mod checks;
use checks::{check_memory, check_mr, check_msg, die, positive, OrDie};

fn parse_args() -> Opts {
    let mut args = std::env::args().skip(1);
    let verb = match args.next().as_deref() {
        Some("write") => Verb::Write,
        Some("read") => Verb::Read,
        Some("atomic") => Verb::Atomic,
        _ => die("usage: perftest_peer write|read|atomic [-s SIZE] [-n ITERS] [-p TCP_PORT] [--ip ADDR] [--udp-port N] [-t TX_DEPTH] [--timeout SECS] [--interop] [HOST]"),
    };
    let mut o = Opts {
        verb,
        server: None,
        size: if verb == Verb::Atomic { 8 } else { 65536 },
        iters: 5000,
        tcp_port: 18515,
        ip: Ipv4Addr::LOCALHOST,
        udp_port: emu_core::nic::ROCE_PORT,
        tx_depth: 128,
        timeout: 60,
        interop: false,
    };
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "-s" => o.size = positive(&a, val()),
            "-n" => o.iters = positive(&a, val()),
            "-p" => o.tcp_port = positive(&a, val()),
            "--ip" => o.ip = val().parse().unwrap_or_else(|_| die("bad IPv4 address")),
            "--udp-port" => o.udp_port = positive(&a, val()),
            "-t" => o.tx_depth = positive(&a, val()),
            "--timeout" => o.timeout = positive(&a, val()),
            "--interop" => o.interop = true,
            h if !h.starts_with('-') => {
                if let Some(first) = o.server.replace(h.to_string()) {
                    die(&format!("one HOST only (got {first} and {h})"));
                }
            }
            other => die(&format!("unknown option {other}")),
        }
    }
    if o.verb == Verb::Atomic && o.size != 8 {
        die("atomics are 8 bytes");
    }
    o
}

/// A big-endian number of up to 8 bytes.
fn be(b: &[u8]) -> u64 {
    b.iter().fold(0, |n, &x| n << 8 | u64::from(x))
}

/// One side's `pingpong_dest`, as exchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Keys {
    lid: u16,
    out_reads: u32,
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    gid: Gid,
    srqn: u32,
}

impl Keys {
    /// The 108-byte message (`KEY_PRINT_FMT_GID` and its NUL).
    fn to_wire(self) -> [u8; KEY_MSG] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid.0 {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut m = [0u8; KEY_MSG];
        let n = s.len().min(KEY_MSG - 1);
        m[..n].copy_from_slice(&s.as_bytes()[..n]);
        m
    }

    fn from_wire(m: &[u8]) -> Option<Keys> {
        let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
        let s = std::str::from_utf8(&m[..end]).ok()?;
        let f: Vec<&str> = s.split(':').collect();
        if f.len() < 23 {
            return None;
        }
        let h32 = |x: &str| u32::from_str_radix(x, 16).ok();
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(f[6 + i], 16).ok()?;
        }
        Some(Keys {
            lid: u16::from_str_radix(f[0], 16).ok()?,
            out_reads: h32(f[1])?,
            qpn: h32(f[2])? & 0xFF_FFFF,
            psn: h32(f[3])? & 0xFF_FFFF,
            rkey: h32(f[4])?,
            vaddr: u64::from_str_radix(f[5], 16).ok()?,
            gid: Gid(gid),
            srqn: h32(f[22])?,
        })
    }
}

/// One exchange of `mine` for as many bytes from the peer: the client writes first.
fn xchg(s: &mut TcpStream, client: bool, mine: &[u8]) -> Vec<u8> {
    let mut theirs = vec![0u8; mine.len()];
    let r = if client {
        s.write_all(mine).and_then(|_| s.read_exact(&mut theirs))
    } else {
        s.read_exact(&mut theirs).and_then(|_| s.write_all(mine))
    };
    r.unwrap_or_else(|e| die(&format!("out-of-band exchange: {e}")));
    theirs
}

fn xchg_keys(s: &mut TcpStream, client: bool, me: &Keys) -> Keys {
    let m = xchg(s, client, &me.to_wire());
    Keys::from_wire(&m)
        .unwrap_or_else(|| die(&format!("bad keys {:?}", String::from_utf8_lossy(&m))))
}

/// `bw_report_data` as exchanged (perftest >= 5.33: 64-bit iterations).
#[derive(Clone, Copy, Debug, Default)]
struct Report {
    size: u64,
    iters: u64,
    bw_peak: f64,
    bw_avg: f64,
    msg_rate: f64,
}

fn xchg_reports(s: &mut TcpStream, client: bool, me: &Report) -> Report {
    let mut u = |v: u64| be(&xchg(s, client, &v.to_be_bytes()));
    Report {
        size: u(me.size),
        iters: u(me.iters),
        bw_peak: f64::from_bits(u(me.bw_peak.to_bits())),
        bw_avg: f64::from_bits(u(me.bw_avg.to_bits())),
        msg_rate: f64::from_bits(u(me.msg_rate.to_bits())),
    }
}

fn mtu_from_code(c: u8) -> Option<Mtu> {
    Some(match c {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}

fn main() {
    let o = parse_args();
    let client = o.server.is_some();
    let dev = Arc::new(
        EmuDevice::open(EmuConfig {
            ip: o.ip.into(),
            port: o.udp_port,
            link: if o.interop {
                LinkOptions::interop()
            } else {
                LinkOptions::default()
            },
            ..EmuConfig::default()
        })
        .unwrap_or_else(|e| die(&format!("cannot open an emulated device on {}: {e}", o.ip))),
    );
    // What the options ask of the device and of memory, before the peer is involved
    // (perftest's buffer is twice the message, at least).
    let max_qp_wr = dev.query_device().or_die("query_device").max_qp_wr;
    if o.tx_depth > max_qp_wr as usize {
        die(&format!(
            "-t {} is more than the device's max_qp_wr ({max_qp_wr})",
            o.tx_depth
        ));
    }
    let what = format!("-s {}", o.size);
    check_msg(&*dev, &what, o.size as u64).unwrap_or_else(|e| die(&e));
    check_memory(&what, (o.size as u64).saturating_mul(2)).unwrap_or_else(|e| die(&e));

    let mut s = match &o.server {
        Some(h) => {
            let deadline = Instant::now() + Duration::from_secs(o.timeout);
            loop {
                match TcpStream::connect((h.as_str(), o.tcp_port)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => die(&format!("connect {h}: {e}")),
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", o.tcp_port))
                .unwrap_or_else(|e| die(&format!("listen on {}: {e}", o.tcp_port)));
            l.accept()
                .unwrap_or_else(|e| die(&format!("accept: {e}")))
                .0
        }
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(o.timeout)));

    // 1-3: version, cycle buffer and cache line, MTU.
    let mut v = [0u8; 16];
    v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    let rv = xchg(&mut s, client, &v);
    let rem_version =
        String::from_utf8_lossy(&rv[..rv.iter().position(|&b| b == 0).unwrap_or(16)]).into_owned();
    if rem_version.parse::<f64>().map_or(true, |x| x < 5.70) {
        die(&format!(
            "peer version {rem_version:?}: perftest older than 5.70 speaks another protocol"
        ));
    }
    let cycle = be(&xchg(&mut s, client, &PAGE.to_be_bytes())).max(PAGE.into()) as usize;
    let cache_line =
        be(&xchg(&mut s, client, &CACHE_LINE.to_be_bytes())).max(CACHE_LINE.into()) as usize;
    let my_mtu = dev.query_port(1).or_die("query_port").active_mtu;
    let rm = xchg(&mut s, client, &[b'0' + my_mtu as u8, 0]);
    let mtu = match (rm[1], rm[0].checked_sub(b'0').and_then(mtu_from_code)) {
        (0, Some(m)) if (m as u8) < (my_mtu as u8) => m,
        _ => my_mtu,
    };

    // Resources: perftest's buffer (the larger of SIZE and the cycle buffer, to a cache
    // line, twice), all of it remote-accessible.
    let per = o.size.max(cycle).div_ceil(cache_line) * cache_line;
    let what = format!("-s {} (the peer's cycle buffer {cycle})", o.size);
    check_memory(&what, 2 * per as u64).unwrap_or_else(|e| die(&e));
    check_mr(&*dev, &what, 2 * per as u64).unwrap_or_else(|e| die(&e));
    let buf = MemBuf::new(per * 2);
    // The server's bytes start as 0xEE (atomics: 0), so it can tell what was written;
    // the client's WRITE source is 0x5A.
    buf.fill(match (o.verb, client) {
        (Verb::Atomic, _) => 0,
        (Verb::Write, true) => 0x5A,
        _ => 0xEE,
    });
    let ctx = Context::new(dev);
    let pd = ctx.alloc_pd().or_die("alloc_pd");
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.reg_mr(&buf, access).or_die("reg_mr");
    let depth = o.tx_depth as u32;
    let cq = ctx.create_cq(depth * 2, None).or_die("create_cq");
    let qp = pd
        .qp(QpType::Rc, &cq)
        .max_send_wr(depth)
        .max_recv_wr(1)
        .sq_sig_all(false)
        .build()
        .unwrap_or_else(|e| die(&format!("create QP: {e}")));
    // The IPv4 address's GID, as perftest picks it (`default_gid_index`).
    let gid_index = ctx.default_gid_index().or_die("query_gid");
    let gid = ctx
        .device()
        .query_gid(1, u32::from(gid_index))
        .or_die("query_gid");
    let me = Keys {
        lid: 0,
        out_reads: if o.verb == Verb::Write { 1 } else { OUT_READS },
        qpn: qp.qpn(),
        psn: (std::process::id().wrapping_mul(2_654_435_761) ^ qp.qpn()) & 0xFF_FFFF,
        rkey: mr.rkey(),
        vaddr: mr.addr(0),
        gid,
        srqn: 0,
    };

    // 4-5: keys, connect, keys twice more.
    let rem = xchg_keys(&mut s, client, &me);
    println!(
        " local  address: QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x} GID {gid}",
        me.qpn, me.psn, me.rkey, me.vaddr
    );
    println!(
        " remote address: QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x} GID {} OUT {}",
        rem.qpn, rem.psn, rem.rkey, rem.vaddr, rem.gid, rem.out_reads
    );
    let p = QpParams {
        access,
        path_mtu: mtu,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: rem.out_reads.clamp(1, 128) as u8,
        max_dest_rd_atomic: me.out_reads as u8,
        hop_limit: 0xFF,
        sgid_index: gid_index,
        ..QpParams::default()
    };
    let remote = Endpoint {
        lid: rem.lid,
        qpn: rem.qpn,
        psn: rem.psn,
        gid: rem.gid,
    };
    qp.connect(&p, me.psn, &remote)
        .unwrap_or_else(|e| die(&format!("connect the QP: {e}")));
    xchg_keys(&mut s, client, &me);
    xchg_keys(&mut s, client, &me);

    // 6-8.
    let mut mine = Report {
        size: o.size as u64,
        ..Report::default()
    };
    let ok = if client {
        let t = run(&o, &cq, &qp, &mr, &rem, cycle);
        let secs = t.as_secs_f64();
        mine.iters = o.iters;
        mine.bw_avg = (o.size as f64 * o.iters as f64) / secs / 1_048_576.0;
        mine.bw_peak = mine.bw_avg;
        mine.msg_rate = o.iters as f64 / secs / 1e6;
        println!(
            " #bytes {} #iterations {} BW average[MB/sec] {:.2} MsgRate[Mpps] {:.6}",
            o.size, o.iters, mine.bw_avg, mine.msg_rate
        );
        xchg_keys(&mut s, client, &me);
        xchg_reports(&mut s, client, &mine);
        true
    } else {
        xchg_keys(&mut s, client, &me);
        let theirs = xchg_reports(&mut s, client, &mine);
        println!(
            " peer's report: #bytes {} #iterations {} BW peak {:.2} average {:.2} MB/s, {:.6} Mpps",
            theirs.size, theirs.iters, theirs.bw_peak, theirs.bw_avg, theirs.msg_rate
        );
        check_server(o.verb, &buf, &theirs)
    };
    xchg_keys(&mut s, client, &me);
    let _ = s.write_all(b"done\0");
    std::process::exit(if ok { 0 } else { 1 })
}

/// The client's test: ITERS work requests, at most TX_DEPTH in flight, each signaled.
fn run(o: &Opts, cq: &Cq, qp: &Qp, mr: &Mr, rem: &Keys, cycle: usize) -> Duration {
    let len = o.size as u64;
    // perftest moves the remote address by SIZE within the cycle buffer when SIZE fits
    // twice in it; else it stays.
    let slots = if o.size <= cycle / 2 {
        (cycle / o.size) as u64
    } else {
        1
    };
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(o.timeout);
    let (mut posted, mut done, mut in_flight) = (0u64, 0u64, 0usize);
    let mut wcs = Vec::new();
    while done < o.iters {
        while posted < o.iters && in_flight < o.tx_depth {
            let off = (posted % slots) * len;
            let (sge, far, rkey) = (mr.sge(off, o.size as u32), rem.vaddr + off, rem.rkey);
            let wr = match o.verb {
                Verb::Write => SendWr::rdma_write(posted, sge, far, rkey),
                Verb::Read => SendWr::rdma_read(posted, sge, far, rkey),
                Verb::Atomic => SendWr::atomic_fetch_add(posted, sge, far, rkey, 1),
            };
            qp.post_send(&[wr.signaled()]).or_die("post_send");
            posted += 1;
            in_flight += 1;
        }
        wcs.clear();
        cq.poll(64, &mut wcs).or_die("poll_cq");
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                die(&format!(
                    "work request {} completed {:?}",
                    wc.wr_id, wc.status
                ));
            }
        }
        done += wcs.len() as u64;
        in_flight -= wcs.len();
        if wcs.is_empty() {
            if Instant::now() > deadline {
                die(&format!("timeout: {done} of {} completed", o.iters));
            }
            std::thread::yield_now();
        }
    }
    t0.elapsed()
}

/// What the server can check in its own buffer once the client is done.
fn check_server(verb: Verb, buf: &MemBuf, theirs: &Report) -> bool {
    match verb {
        Verb::Write => {
            let changed = buf.with(|b| b.iter().filter(|&&x| x != 0xEE).count());
            println!(" WRITE: {changed} bytes of our buffer were written");
            changed > 0
        }
        Verb::Read => {
            let intact = buf.with(|b| b.iter().all(|&x| x == 0xEE));
            println!(
                " READ: our buffer {}",
                if intact { "unchanged" } else { "CHANGED" }
            );
            intact
        }
        Verb::Atomic => {
            let sum: u64 = (0..buf.len() / 8)
                .map(|i| buf.read_u64(i * 8).or_die("read_u64"))
                .fold(0, u64::wrapping_add);
            println!(
                " ATOMIC: our 64-bit words add up to {sum}; the peer reports {} FETCH_ADD(1)s",
                theirs.iters
            );
            sum == theirs.iters
        }
    }
}
