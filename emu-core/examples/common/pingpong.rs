//! RC and UC ping-pong over emulated devices, after rdma-core's `ibv_rc_pingpong` and
//! `ibv_uc_pingpong` (shared by the `rc_pingpong` and `uc_pingpong` examples).
//!
//! ```text
//! xx_pingpong [options]            server: waits for a client on TCP port 18515
//! xx_pingpong [options] HOST       client: connects to the server at HOST
//! xx_pingpong --loopback           both ends in one process
//! options: -s SIZE (4096)  -n ITERS (1000)  -p TCP_PORT (18515)  --ip ADDR  --udp-port N (4791)
//! ```
//!
//! Each end opens its own emulated device. Its address defaults to 127.0.0.1 for the
//! server and 127.0.0.2 for the client, so two processes on one host need no flags;
//! across hosts give each end its own address with `--ip`. The ends exchange
//! `LID:QPN:PSN:GID` as text over TCP, in the format of rdma-core's pingpong examples.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice, ROCE_PORT};
use verbs_api::QpAttrMask as M;
use verbs_api::*;

struct Opts {
    server: Option<String>,
    size: usize,
    iters: usize,
    tcp_port: u16,
    ip: Option<Ipv4Addr>,
    udp_port: u16,
    loopback: bool,
    timeout: u64,
}

fn parse_args() -> Opts {
    let mut o = Opts {
        server: None,
        size: 4096,
        iters: 1000,
        tcp_port: 18515,
        ip: None,
        udp_port: ROCE_PORT,
        loopback: false,
        timeout: 60,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| {
            args.next()
                .unwrap_or_else(|| die(&format!("{name} needs a value")))
        };
        match a.as_str() {
            "-s" | "--size" => o.size = val("-s").parse().unwrap_or_else(|_| die("bad size")),
            "-n" | "--iters" => {
                o.iters = val("-n")
                    .parse()
                    .unwrap_or_else(|_| die("bad iteration count"))
            }
            "-p" | "--port" => o.tcp_port = val("-p").parse().unwrap_or_else(|_| die("bad port")),
            "--ip" => {
                o.ip = Some(
                    val("--ip")
                        .parse()
                        .unwrap_or_else(|_| die("bad IPv4 address")),
                )
            }
            "--udp-port" => {
                o.udp_port = val("--udp-port")
                    .parse()
                    .unwrap_or_else(|_| die("bad port"))
            }
            "--loopback" => o.loopback = true,
            "--timeout" => {
                o.timeout = val("--timeout")
                    .parse()
                    .unwrap_or_else(|_| die("bad timeout"))
            }
            "-h" | "--help" => {
                println!("usage: rc_pingpong|uc_pingpong [-s SIZE] [-n ITERS] [-p TCP_PORT] [--ip ADDR] [--udp-port N] [--timeout SECS] [--loopback] [HOST]");
                std::process::exit(0);
            }
            h if !h.starts_with('-') => o.server = Some(h.to_string()),
            other => die(&format!("unknown option {other}")),
        }
    }
    o
}

fn die(msg: &str) -> ! {
    eprintln!("pingpong: {msg}");
    std::process::exit(1)
}

/// One end's connection data, as rdma-core's examples print it: `LID:QPN:PSN:GID`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Dest {
    lid: u16,
    qpn: u32,
    psn: u32,
    gid: Gid,
}

impl Dest {
    fn to_wire(self) -> String {
        let g: String = self
            .gid
            .0
            .chunks(4)
            .map(|c| format!("{:08x}", u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        format!("{:04x}:{:06x}:{:06x}:{}", self.lid, self.qpn, self.psn, g)
    }

    fn from_wire(s: &str) -> Option<Dest> {
        let mut p = s.trim().split(':');
        let lid = u16::from_str_radix(p.next()?, 16).ok()?;
        let qpn = u32::from_str_radix(p.next()?, 16).ok()?;
        let psn = u32::from_str_radix(p.next()?, 16).ok()?;
        let g = p.next()?;
        if g.len() != 32 {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Dest {
            lid,
            qpn,
            psn,
            gid: Gid(gid),
        })
    }
}

struct Ctx {
    dev: EmuDevice,
    cq: CqId,
    qpn: u32,
    buf: MemBuf,
    mr: MrInfo,
    size: usize,
    qp_type: QpType,
}

fn setup(ip: Ipv4Addr, udp_port: u16, size: usize, qp_type: QpType) -> Ctx {
    let dev = EmuDevice::open(EmuConfig {
        ip,
        port: udp_port,
        ..EmuConfig::default()
    })
    .unwrap_or_else(|e| {
        die(&format!(
            "cannot open an emulated device on {ip}:{udp_port}: {e}"
        ))
    });
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256, None).unwrap();
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: 500,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qpn = dev
        .create_qp(&QpInitAttr {
            pd,
            send_cq: cq,
            recv_cq: cq,
            qp_type,
            cap,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    let buf = MemBuf::new(size.max(1));
    let mr = dev
        .reg_mr(pd, &buf, 0, size, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    dev.modify_qp(
        qpn,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    let c = Ctx {
        dev,
        cq,
        qpn,
        buf,
        mr,
        size,
        qp_type,
    };
    post_recv(&c, RX_DEPTH);
    c
}

fn connect(c: &Ctx, my_psn: u32, rem: Dest) {
    let mut a = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: rem.qpn,
        rq_psn: rem.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            grh: GlobalRoute {
                dgid: rem.gid,
                hop_limit: 1,
                ..Default::default()
            },
            is_global: true,
            port_num: 1,
            ..Default::default()
        },
        ..QpAttr::default()
    };
    let rc = c.qp_type == QpType::Rc;
    let mut rtr = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    if rc {
        rtr |= M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    }
    c.dev
        .modify_qp(c.qpn, &a, rtr)
        .unwrap_or_else(|e| die(&format!("failed to modify QP to RTR: {e}")));
    a.qp_state = QpState::Rts;
    // ~1 s per try (4.096 us * 2^18): a loaded 2-core machine can starve a device
    // thread for longer than the 67 ms of timeout 14 times 7 retries.
    a.timeout = 18;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = my_psn;
    a.max_rd_atomic = 1;
    let mut rts = M::STATE | M::SQ_PSN;
    if rc {
        rts |= M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    }
    c.dev
        .modify_qp(c.qpn, &a, rts)
        .unwrap_or_else(|e| die(&format!("failed to modify QP to RTS: {e}")));
}

/// Receives kept posted, as rdma-core's examples do.
const RX_DEPTH: usize = 500;
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

fn post_recv(c: &Ctx, n: usize) {
    let wr = RecvWr {
        wr_id: RECV_WRID,
        sg_list: vec![Sge {
            addr: c.mr.addr,
            length: c.size as u32,
            lkey: c.mr.lkey,
        }],
    };
    for _ in 0..n {
        c.dev
            .post_recv(c.qpn, std::slice::from_ref(&wr))
            .unwrap_or_else(|e| die(&format!("post_recv: {e}")));
    }
}

fn post_send(c: &Ctx) {
    let wr = SendWr {
        wr_id: SEND_WRID,
        sg_list: vec![Sge {
            addr: c.mr.addr,
            length: c.size as u32,
            lkey: c.mr.lkey,
        }],
        op: WrOperation::Send,
        send_flags: SendFlags::SIGNALED,
        ud: None,
    };
    c.dev
        .post_send(c.qpn, &[wr])
        .unwrap_or_else(|e| die(&format!("post_send: {e}")));
}

/// The ping-pong loop of ibv_rc_pingpong: every receive is answered by a send.
fn run(c: &Ctx, client: bool, iters: usize, timeout: u64) {
    // The receives were posted in INIT, before connecting (see `setup`): on UC a SEND
    // that finds no receive is dropped, so none may arrive before they are there.
    let mut recvs_posted = RX_DEPTH;
    let (mut rcnt, mut scnt) = (0, 0);
    let mut pending_send = false;
    let mut outstanding_recv = false;
    if client {
        c.buf.fill(0x5a);
        post_send(c);
        pending_send = true;
    }
    let start = Instant::now();
    let mut wcs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(timeout);
    while rcnt < iters || scnt < iters {
        wcs.clear();
        c.dev.poll_cq(c.cq, 16, &mut wcs).unwrap();
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                die(&format!(
                    "failed status {} ({}) for wr_id {}",
                    wc.status,
                    wc.status.as_u32(),
                    wc.wr_id
                ));
            }
            match wc.wr_id {
                SEND_WRID => {
                    scnt += 1;
                    pending_send = false;
                }
                RECV_WRID => {
                    rcnt += 1;
                    recvs_posted -= 1;
                    if recvs_posted <= 1 {
                        post_recv(c, 500 - recvs_posted);
                        recvs_posted = 500;
                    }
                    outstanding_recv = true;
                }
                other => die(&format!("completion for unknown wr_id {other}")),
            }
        }
        if outstanding_recv && !pending_send && scnt < iters {
            outstanding_recv = false;
            post_send(c);
            pending_send = true;
        }
        if wcs.is_empty() {
            if Instant::now() > deadline {
                die(&format!("no progress for {timeout} s (UC loses a message for good when a packet is lost)"));
            }
            std::thread::yield_now();
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = (c.size * iters * 2) as f64;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes as u64,
        usec / 1e6,
        bytes * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        iters,
        usec / 1e6,
        usec / iters as f64
    );
}

/// Sends our address and reads the peer's. One `BufReader` serves the whole
/// conversation: a reader made per line could swallow the peer's next line.
fn exchange(stream: &mut BufReader<TcpStream>, mine: Dest) -> Dest {
    stream
        .get_mut()
        .write_all(format!("{}\n", mine.to_wire()).as_bytes())
        .unwrap();
    let mut line = String::new();
    stream.read_line(&mut line).unwrap();
    Dest::from_wire(&line)
        .unwrap_or_else(|| die(&format!("could not parse the peer's address {line:?}")))
}

fn my_dest(c: &Ctx) -> Dest {
    let gid = c.dev.query_gid(1, 0).unwrap();
    let salt = u32::from_be_bytes([gid.0[12], gid.0[13], gid.0[14], gid.0[15]]);
    let psn = (std::process::id().wrapping_mul(2_654_435_761) ^ c.qpn ^ salt.wrapping_mul(40_503))
        & 0xFF_FFFF;
    Dest {
        lid: 0,
        qpn: c.qpn,
        psn,
        gid: c.dev.query_gid(1, 0).unwrap(),
    }
}

/// Runs the program for `qp_type` (RC or UC).
pub(crate) fn main(qp_type: QpType) {
    let o = parse_args();
    if o.loopback {
        let port = if o.udp_port == ROCE_PORT {
            20000 + (std::process::id() % 20000) as u16
        } else {
            o.udp_port
        };
        let a = setup(Ipv4Addr::new(127, 0, 0, 1), port, o.size, qp_type);
        let b = setup(Ipv4Addr::new(127, 0, 0, 2), port, o.size, qp_type);
        let (da, db) = (my_dest(&a), my_dest(&b));
        println!(
            "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            da.lid, da.qpn, da.psn, da.gid
        );
        println!(
            "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            db.lid, db.qpn, db.psn, db.gid
        );
        connect(&a, da.psn, db);
        connect(&b, db.psn, da);
        let iters = o.iters;
        let timeout = o.timeout;
        let server = std::thread::spawn(move || run(&b, false, iters, timeout));
        run(&a, true, o.iters, o.timeout);
        server.join().unwrap();
        return;
    }
    let client = o.server.is_some();
    let ip = o.ip.unwrap_or(if client {
        Ipv4Addr::new(127, 0, 0, 2)
    } else {
        Ipv4Addr::new(127, 0, 0, 1)
    });
    let c = setup(ip, o.udp_port, o.size, qp_type);
    let mine = my_dest(&c);
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        mine.lid, mine.qpn, mine.psn, mine.gid
    );
    let stream = match &o.server {
        Some(host) => {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match TcpStream::connect((host.as_str(), o.tcp_port)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => {
                        die(&format!("couldn't connect to {host}:{}: {e}", o.tcp_port))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", o.tcp_port))
                .unwrap_or_else(|e| die(&format!("couldn't listen on port {}: {e}", o.tcp_port)));
            l.accept().unwrap().0
        }
    };
    let mut stream = BufReader::new(stream);
    let rem = exchange(&mut stream, mine);
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.lid, rem.qpn, rem.psn, rem.gid
    );
    connect(&c, mine.psn, rem);
    // Both ends are in RTS before the first SEND (the TCP round trip is the barrier).
    stream.get_mut().write_all(b"ready\n").unwrap();
    let mut line = String::new();
    stream.read_line(&mut line).unwrap();
    run(&c, client, o.iters, o.timeout);
}
