//! Ping-pong over emulated devices, after rdma-core's `ibv_rc_pingpong`,
//! `ibv_uc_pingpong`, `ibv_ud_pingpong` and `ibv_srq_pingpong` (shared by the
//! `rc_pingpong`, `uc_pingpong`, `ud_pingpong` and `srq_pingpong` examples).
//!
//! ```text
//! xx_pingpong [options]            server: waits for a client on TCP port 18515
//! xx_pingpong [options] HOST       client: connects to the server at HOST
//! xx_pingpong --loopback           both ends in one process (no HOST, --ip or -p)
//! options: -s SIZE (4096; UD 2048)  -n ITERS (1000)  -p TCP_PORT (18515)  --ip ADDR
//!          --udp-port N (4791)  -q NUM_QP (srq_pingpong: 16)
//! ```
//!
//! UD (as `ibv_ud_pingpong`): each receive buffer is SIZE + 40 bytes, the GRH first;
//! the QPs use Q_Key 0x11111111 and an address handle to the peer's GID; SIZE must fit
//! the port's MTU. SRQ (as `ibv_srq_pingpong`): NUM_QP RC QPs on each side share one
//! shared receive queue; every QP plays its own ping-pong, and a receive completion
//! names the QP (`qp_num`) that answers it.
//!
//! Each end opens its own emulated device. Its address defaults to 127.0.0.1 for the
//! server and 127.0.0.2 for the client, so two processes on one host need no flags;
//! across hosts give each end its own address with `--ip`. The ends exchange
//! `LID:QPN:PSN:GID` over TCP byte for byte as rdma-core's pingpong examples do
//! (`"%04x:%06x:%06x:%s"`, the GID as 32 hex digits, NUL-terminated, 52 bytes per QP;
//! the client writes first, the server connects its QPs before it answers, and the
//! client ends with `"done"` and its NUL), so either end can be `ibv_rc_pingpong`,
//! `ibv_uc_pingpong`, `ibv_ud_pingpong` or `ibv_srq_pingpong` (with `-g` naming the
//! peer's IPv4 GID). `--interop` opens the device in interop mode (exact ICRC checks
//! on a kernel rxe peer's packets; needs root or CAP_NET_RAW; docs/interop.md).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_core::nic::interop::LinkOptions;
use emu_core::nic::{EmuConfig, EmuDevice, ROCE_PORT};
use verbs_api::*;

use super::checks::{check_memory, check_mr, check_msg, die, positive, OrDie};

/// Which program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code)] // each example uses one
pub(crate) enum Mode {
    Rc,
    Uc,
    Ud,
    Srq,
}

impl Mode {
    fn qp_type(self) -> QpType {
        match self {
            Mode::Rc | Mode::Srq => QpType::Rc,
            Mode::Uc => QpType::Uc,
            Mode::Ud => QpType::Ud,
        }
    }
}

/// The Q_Key of `ibv_ud_pingpong`.
const QKEY: u32 = 0x1111_1111;
/// The GRH at the start of every UD receive buffer.
const GRH: usize = 40;

struct Opts {
    server: Option<String>,
    size: usize,
    num_qp: usize,
    iters: usize,
    tcp_port: Option<u16>,
    ip: Option<Ipv4Addr>,
    udp_port: u16,
    loopback: bool,
    timeout: u64,
    interop: bool,
}

fn parse_args(mode: Mode, args: Vec<String>) -> Opts {
    let mut o = Opts {
        server: None,
        size: if mode == Mode::Ud { 2048 } else { 4096 },
        num_qp: if mode == Mode::Srq { 16 } else { 1 },
        iters: 1000,
        tcp_port: None,
        ip: None,
        udp_port: ROCE_PORT,
        loopback: false,
        timeout: 60,
        interop: false,
    };
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "-s" | "--size" => o.size = positive("-s", val()),
            "-n" | "--iters" => o.iters = positive("-n", val()),
            "-q" | "--num_qp" if mode == Mode::Srq => o.num_qp = positive("-q", val()),
            "-p" | "--port" => o.tcp_port = Some(positive("-p", val())),
            "--ip" => {
                let v = val();
                o.ip = Some(
                    v.parse()
                        .unwrap_or_else(|_| die(&format!("--ip {v}: not an IPv4 address"))),
                )
            }
            "--udp-port" => o.udp_port = positive("--udp-port", val()),
            "--loopback" => o.loopback = true,
            "--interop" => o.interop = true,
            "--timeout" => o.timeout = positive("--timeout", val()),
            "-h" | "--help" => {
                println!("usage: rc_pingpong|uc_pingpong|ud_pingpong|srq_pingpong [-s SIZE] [-n ITERS] [-q NUM_QP (srq)] [-p TCP_PORT] [--ip ADDR] [--udp-port N] [--timeout SECS] [--loopback] [--interop] [HOST]");
                std::process::exit(0);
            }
            h if !h.starts_with('-') => {
                if let Some(first) = o.server.replace(h.to_string()) {
                    die(&format!("one HOST only (got {first} and {h})"));
                }
            }
            other => die(&format!("unknown option {other}")),
        }
    }
    if o.loopback {
        // Both ends are in this process at 127.0.0.1 and 127.0.0.2, with no TCP.
        let given = [
            o.server.as_ref().map(|h| format!("HOST {h}")),
            o.ip.map(|ip| format!("--ip {ip}")),
            o.tcp_port.map(|p| format!("-p {p}")),
        ];
        if let Some(g) = given.into_iter().flatten().next() {
            die(&format!(
                "{g} does not go with --loopback (both ends in this process on 127.0.0.1 and 127.0.0.2)"
            ));
        }
    }
    o
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
        // ASCII first: the digits are sliced by bytes, and a peer's text may hold
        // anything (it arrives through `from_utf8_lossy`).
        if g.len() != 32 || !g.is_ascii() {
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
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qps: Vec<Qp>,
    srq: Option<Srq>,
    /// UD: the address handle and QP number of each peer QP.
    ud: Vec<(Ah, u32)>,
    buf: MemBuf,
    mr: Mr,
    size: usize,
    mode: Mode,
    /// The GID index the QPs send from and the peer is told (`default_gid_index`:
    /// the IPv4 address's, as perftest picks it).
    gid_index: u8,
}

fn setup(
    ip: Ipv4Addr,
    udp_port: u16,
    size: usize,
    mode: Mode,
    num_qp: usize,
    interop: bool,
) -> Ctx {
    let dev = EmuDevice::open(EmuConfig {
        ip: ip.into(),
        port: udp_port,
        link: if interop {
            LinkOptions::interop()
        } else {
            LinkOptions::default()
        },
        ..EmuConfig::default()
    })
    .unwrap_or_else(|e| {
        die(&format!(
            "cannot open an emulated device on {ip}:{udp_port}: {e}"
        ))
    });
    if mode == Mode::Ud {
        let mtu = dev.query_port(1).or_die("query_port").active_mtu.bytes() as usize;
        if size > mtu {
            die(&format!("UD messages must fit the MTU: -s {size} > {mtu}"));
        }
    }
    // UD receives get the 40-byte GRH first.
    let len = if mode == Mode::Ud { size + GRH } else { size };
    check_msg(&dev, &format!("-s {size}"), size as u64).unwrap_or_else(|e| die(&e));
    check_mr(&dev, &format!("-s {size}"), len as u64).unwrap_or_else(|e| die(&e));
    let max_qp = dev.query_device().or_die("query_device").max_qp;
    if num_qp > max_qp as usize {
        die(&format!(
            "-q {num_qp} is more QPs than the device's max_qp ({max_qp})"
        ));
    }
    let ctx = Context::new(Arc::new(dev));
    let pd = ctx.alloc_pd().or_die("alloc_pd");
    let cq = ctx
        .create_cq((RX_DEPTH + num_qp) as u32, None)
        .or_die("create_cq");
    let srq = (mode == Mode::Srq).then(|| {
        pd.create_srq(&SrqAttr {
            max_wr: RX_DEPTH as u32,
            max_sge: 1,
            srq_limit: 0,
        })
        .or_die("create_srq")
    });
    let qps = (0..num_qp)
        .map(|_| {
            let qp = pd.qp(mode.qp_type(), &cq).max_send_wr(1);
            let qp = qp.max_recv_wr(RX_DEPTH as u32).sq_sig_all(false);
            match &srq {
                Some(srq) => qp.srq(srq).build(),
                None => qp.build(),
            }
            .unwrap_or_else(|e| die(&format!("couldn't create a QP: {e}")))
        })
        .collect::<Vec<_>>();
    let buf = MemBuf::new(len);
    let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).or_die("reg_mr");
    let gid_index = ctx.default_gid_index().or_die("query_gid");
    let (init, mask) = params(gid_index).init(mode.qp_type());
    for qp in &qps {
        qp.modify(&init, mask)
            .unwrap_or_else(|e| die(&format!("failed to modify QP to INIT: {e}")));
    }
    let c = Ctx {
        ctx,
        pd,
        cq,
        qps,
        srq,
        ud: Vec::new(),
        buf,
        mr,
        size,
        mode,
        gid_index,
    };
    post_recv(&c, RX_DEPTH);
    c
}

/// The QP parameters of rdma-core's pingpongs (MTU 1024, hop limit 1, Q_Key 0x11111111),
/// with an ACK timeout of ~1 s per try (4.096 us * 2^18): a loaded 2-core machine can
/// starve a device thread for longer than the 67 ms of timeout 14 times 7 retries;
/// sent from GID index `gid_index`.
fn params(gid_index: u8) -> QpParams {
    QpParams {
        sgid_index: gid_index,
        qkey: QKEY,
        hop_limit: 1,
        timeout: 18,
        ..QpParams::default()
    }
}

fn connect(c: &mut Ctx, mine: &[Dest], rems: &[Dest]) {
    let p = params(c.gid_index);
    let qp_type = c.mode.qp_type();
    for ((qp, me), rem) in c.qps.iter().zip(mine).zip(rems) {
        let remote = Endpoint {
            lid: rem.lid,
            qpn: rem.qpn,
            psn: rem.psn,
            gid: rem.gid,
        };
        let (rtr, rtr_mask) = p.rtr(qp_type, &remote);
        qp.modify(&rtr, rtr_mask)
            .unwrap_or_else(|e| die(&format!("failed to modify QP to RTR: {e}")));
        let (rts, rts_mask) = p.rts(qp_type, me.psn);
        qp.modify(&rts, rts_mask)
            .unwrap_or_else(|e| die(&format!("failed to modify QP to RTS: {e}")));
        let av = p.ah_attr(rem.gid);
        if c.mode == Mode::Ud {
            let ah =
                c.pd.create_ah(&av)
                    .unwrap_or_else(|e| die(&format!("failed to create AH: {e}")));
            c.ud.push((ah, rem.qpn));
        }
    }
}

/// Receives kept posted, as rdma-core's examples do.
const RX_DEPTH: usize = 500;
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// Posts `n` receives: to the SRQ, or to the (one) QP.
fn post_recv(c: &Ctx, n: usize) {
    let len = if c.mode == Mode::Ud {
        c.size + GRH
    } else {
        c.size
    };
    let wr = [RecvWr::new(RECV_WRID, c.mr.sge(0, len as u32))];
    for _ in 0..n {
        match &c.srq {
            Some(srq) => srq.post_recv(&wr),
            None => c.qps[0].post_recv(&wr),
        }
        .or_die("post_recv");
    }
}

/// Sends one message on QP number `i` (UD: from after the GRH area, to the peer's QP
/// through its address handle).
fn post_send(c: &Ctx, i: usize) {
    let off = if c.mode == Mode::Ud { GRH as u64 } else { 0 };
    let wr = SendWr {
        ud: c.ud.get(i).map(|(ah, remote_qpn)| UdDest {
            ah: ah.id(),
            remote_qpn: *remote_qpn,
            remote_qkey: QKEY,
        }),
        ..SendWr::send(SEND_WRID, c.mr.sge(off, c.size as u32)).signaled()
    };
    c.qps[i].post_send(&[wr]).or_die("post_send");
}

/// The ping-pong loop of ibv_rc_pingpong, per QP (ibv_srq_pingpong): every receive
/// is answered by a send on the QP that received it.
fn run(c: &Ctx, client: bool, iters: usize, timeout: u64) {
    // The receives were posted in INIT, before connecting (see `setup`): on UC and UD a
    // SEND that finds no receive is dropped, so none may arrive before they are there.
    let n = c.qps.len();
    let mut recvs_posted = RX_DEPTH;
    let (mut rcnt, mut scnt) = (vec![0; n], vec![0; n]);
    let mut pending_send = vec![false; n];
    let mut outstanding_recv = vec![false; n];
    if client {
        c.buf.fill(0x5a);
        for (i, p) in pending_send.iter_mut().enumerate() {
            post_send(c, i);
            *p = true;
        }
    }
    let start = Instant::now();
    let mut wcs = Vec::new();
    let mut deadline = Instant::now() + Duration::from_secs(timeout);
    let done = |r: &[usize], s: &[usize]| r.iter().chain(s).all(|&k| k >= iters);
    while !done(&rcnt, &scnt) {
        wcs.clear();
        c.cq.poll(16, &mut wcs).or_die("poll_cq");
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                die(&format!(
                    "failed status {} ({}) for wr_id {}",
                    wc.status,
                    wc.status.as_u32(),
                    wc.wr_id
                ));
            }
            let i = c
                .qps
                .iter()
                .position(|q| q.qpn() == wc.qp_num)
                .unwrap_or_else(|| die(&format!("completion for unknown QP {}", wc.qp_num)));
            match wc.wr_id {
                SEND_WRID => {
                    scnt[i] += 1;
                    pending_send[i] = false;
                }
                RECV_WRID => {
                    rcnt[i] += 1;
                    recvs_posted -= 1;
                    if recvs_posted <= n {
                        post_recv(c, RX_DEPTH - recvs_posted);
                        recvs_posted = RX_DEPTH;
                    }
                    outstanding_recv[i] = true;
                }
                other => die(&format!("completion for unknown wr_id {other}")),
            }
        }
        for i in 0..n {
            if outstanding_recv[i] && !pending_send[i] && scnt[i] < iters {
                outstanding_recv[i] = false;
                post_send(c, i);
                pending_send[i] = true;
            }
        }
        if wcs.is_empty() {
            if Instant::now() > deadline {
                die(&format!(
                    "no message from the peer for {timeout} s: it stopped{}",
                    match c.mode {
                        Mode::Rc | Mode::Srq => "",
                        Mode::Uc | Mode::Ud =>
                            ", or a packet was lost (UC and UD lose the message)",
                    }
                ));
            }
            std::thread::yield_now();
        } else {
            deadline = Instant::now() + Duration::from_secs(timeout);
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = (c.size * iters * 2 * n) as f64;
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

/// One address message as rdma-core's pingpong examples send it: the text and its NUL.
const WIRE_MSG: usize = "0000:000000:000000:00000000000000000000000000000000".len() + 1;

/// Writes our addresses, one `WIRE_MSG`-byte message per QP.
fn send_dests(stream: &mut TcpStream, mine: &[Dest]) {
    for d in mine {
        let mut msg = d.to_wire().into_bytes();
        msg.resize(WIRE_MSG, 0);
        stream
            .write_all(&msg)
            .unwrap_or_else(|e| die(&format!("couldn't send local address: {e}")));
    }
}

/// Reads the peer's `n` addresses.
fn recv_dests(stream: &mut TcpStream, n: usize) -> Vec<Dest> {
    (0..n)
        .map(|_| {
            let mut msg = [0u8; WIRE_MSG];
            stream
                .read_exact(&mut msg)
                .unwrap_or_else(|e| die(&format!("couldn't read remote address: {e}")));
            let text = String::from_utf8_lossy(&msg);
            Dest::from_wire(text.trim_end_matches('\0'))
                .unwrap_or_else(|| die(&format!("could not parse the peer's address {text:?}")))
        })
        .collect()
}

fn my_dests(c: &Ctx) -> Vec<Dest> {
    let gid = c
        .ctx
        .device()
        .query_gid(1, u32::from(c.gid_index))
        .or_die("query_gid");
    let salt = u32::from_be_bytes([gid.0[12], gid.0[13], gid.0[14], gid.0[15]]);
    c.qps
        .iter()
        .map(Qp::qpn)
        .map(|qpn| Dest {
            lid: 0,
            qpn,
            psn: (std::process::id().wrapping_mul(2_654_435_761) ^ qpn ^ salt.wrapping_mul(40_503))
                & 0xFF_FFFF,
            gid,
        })
        .collect()
}

fn print_dests(what: &str, ds: &[Dest]) {
    let label = format!("{what} address:");
    for d in ds {
        println!(
            "  {label:<16}LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            d.lid, d.qpn, d.psn, d.gid
        );
    }
}

/// Runs the program for `mode` with the command line's arguments.
#[allow(dead_code)] // `rdma-emu pingpong` calls `main_with_args`
pub(crate) fn main(mode: Mode) {
    main_with_args(mode, std::env::args().skip(1).collect())
}

/// Runs the program for `mode` with `args` (options and HOST, no program name); also
/// what `rdma-emu pingpong` runs (crate rdma-emu includes this file).
pub(crate) fn main_with_args(mode: Mode, args: Vec<String>) {
    let o = parse_args(mode, args);
    // Both devices of --loopback live in this process.
    let buffers = if o.loopback { 2 } else { 1 };
    let len = if mode == Mode::Ud {
        o.size + GRH
    } else {
        o.size
    };
    check_memory(
        &format!("-s {}", o.size),
        (len as u64).saturating_mul(buffers),
    )
    .unwrap_or_else(|e| die(&e));
    if o.loopback {
        let port = if o.udp_port == ROCE_PORT {
            20000 + (std::process::id() % 20000) as u16
        } else {
            o.udp_port
        };
        let mut a = setup(
            Ipv4Addr::new(127, 0, 0, 1),
            port,
            o.size,
            mode,
            o.num_qp,
            o.interop,
        );
        let mut b = setup(
            Ipv4Addr::new(127, 0, 0, 2),
            port,
            o.size,
            mode,
            o.num_qp,
            o.interop,
        );
        let (da, db) = (my_dests(&a), my_dests(&b));
        print_dests("local", &da);
        print_dests("remote", &db);
        connect(&mut a, &da, &db);
        connect(&mut b, &db, &da);
        let iters = o.iters;
        let timeout = o.timeout;
        let server = std::thread::spawn(move || run(&b, false, iters, timeout));
        run(&a, true, o.iters, o.timeout);
        if server.join().is_err() {
            die("the server's thread failed");
        }
        return;
    }
    let client = o.server.is_some();
    let ip = o.ip.unwrap_or(if client {
        Ipv4Addr::new(127, 0, 0, 2)
    } else {
        Ipv4Addr::new(127, 0, 0, 1)
    });
    let mut c = setup(ip, o.udp_port, o.size, mode, o.num_qp, o.interop);
    let mine = my_dests(&c);
    print_dests("local", &mine);
    let tcp_port = o.tcp_port.unwrap_or(18515);
    let stream = match &o.server {
        Some(host) => {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match TcpStream::connect((host.as_str(), tcp_port)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => {
                        die(&format!("couldn't connect to {host}:{tcp_port}: {e}"))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", tcp_port))
                .unwrap_or_else(|e| die(&format!("couldn't listen on port {tcp_port}: {e}")));
            l.accept().or_die("accept").0
        }
    };
    let mut stream = stream;
    // rdma-core's order: the server's QPs reach RTR before it answers, so the client's
    // first SEND (after "done") finds them ready.
    let rems = if client {
        send_dests(&mut stream, &mine);
        let rems = recv_dests(&mut stream, mine.len());
        stream
            .write_all(b"done\0")
            .unwrap_or_else(|e| die(&format!("couldn't send done: {e}")));
        connect(&mut c, &mine, &rems);
        rems
    } else {
        let rems = recv_dests(&mut stream, mine.len());
        connect(&mut c, &mine, &rems);
        send_dests(&mut stream, &mine);
        let mut done = [0u8; 5];
        stream
            .read_exact(&mut done)
            .unwrap_or_else(|e| die(&format!("couldn't read done: {e}")));
        rems
    };
    print_dests("remote", &rems);
    run(&c, client, o.iters, o.timeout);
}

#[cfg(test)]
mod tests {
    use super::Dest;
    use verbs_api::Gid;

    /// A peer's address goes through its wire form; one whose GID is 32 bytes but
    /// not 32 ASCII digits is refused, not a panic.
    #[test]
    fn a_peer_address_is_parsed_or_refused() {
        let d = Dest {
            lid: 0,
            qpn: 0x123,
            psn: 0xabcdef,
            gid: Gid::from(std::net::Ipv4Addr::new(127, 0, 0, 2)),
        };
        assert_eq!(Dest::from_wire(&d.to_wire()), Some(d));
        let replaced = format!("0000:000123:abcdef:ab{}", "\u{fffd}".repeat(10));
        assert_eq!(replaced.split(':').nth(3).map(str::len), Some(32));
        assert_eq!(Dest::from_wire(&replaced), None);
        assert_eq!(Dest::from_wire("0000:000123:abcdef:00ff"), None);
    }
}
