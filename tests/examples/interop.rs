//! Wire interop between an emulated device and kernel rxe, and fault probes toward rxe
//! (docs/interop.md; run by scripts/ci-interop.sh).
//!
//! ```text
//! interop agent [ADDR:PORT]         in the VM: runs the shell commands the host sends
//! interop vm ADDR:PORT CMD...       on the host: runs CMD in the VM through the agent,
//!                                   relays its output, exits with its status
//! interop peer PROBE                in the VM: the rxe side of a probe (needs --features hw)
//! interop probe PROBE PEER_IP [MY_IP]
//!                                   on the host: the emulated side, in interop mode with
//!                                   a fault hook; prints what rxe did; exit 0 if it did
//!                                   what the probe expects
//! ```
//! Probes: `ack-drop` (rxe retransmits after a dropped ACK and completes),
//! `ack-drop-all` (rxe completes RETRY_EXC_ERR), `rnr` (rxe waits the RNR timer we
//! send), `dup-read` (rxe replays a duplicate READ), `psn-skip` (rxe NAKs an
//! out-of-sequence PSN).
//!
//! The two sides exchange `QPN PSN GID RKEY VA` as one text line on TCP port 18600
//! (the rxe side listens), and the rxe side reports its completion status back in a
//! second line.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emu_core::nic::interop::{LinkOptions, PacketHook, Verdict};
use emu_core::nic::{EmuConfig, EmuDevice};
use emu_sims::{Action, Kind, Match, Rule, RuleHook};
use verbs_api::*;

const PROBE_PORT: u16 = 18600;
const RC_MARK: &str = "__INTEROP_RC__";
const MSG: usize = 64;

fn die(msg: &str) -> ! {
    eprintln!("interop: {msg}");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("agent") if args.len() <= 2 => agent(args.get(1).map_or("0.0.0.0:7000", String::as_str)),
        Some("vm") if args.len() >= 3 => std::process::exit(vm(&args[1], &args[2..].join(" "))),
        Some("peer") if args.len() == 2 => peer_main(&args[1]),
        Some("probe") if args.len() >= 3 => {
            let me = args.get(3).map_or("192.168.77.1", String::as_str);
            let ok = probe(
                &args[1],
                args[2].parse().unwrap_or_else(|_| die("bad peer address")),
                me.parse().unwrap_or_else(|_| die("bad address")),
            );
            std::process::exit(if ok { 0 } else { 1 })
        }
        _ => die("usage: interop agent [ADDR:PORT] | vm ADDR:PORT CMD... | peer PROBE | probe PROBE PEER_IP [MY_IP]"),
    }
}

// ---------------------------------------------------------------------------------
// The agent: the VM has no ssh; the host runs commands in it through this.

fn agent(listen: &str) {
    let l = TcpListener::bind(listen).unwrap_or_else(|e| die(&format!("bind {listen}: {e}")));
    eprintln!("interop agent listening on {listen}");
    for s in l.incoming().flatten() {
        std::thread::spawn(move || {
            let mut r = BufReader::new(s);
            let mut cmd = String::new();
            if r.read_line(&mut cmd).is_err() {
                return;
            }
            let mut s = r.into_inner();
            if cmd.trim() == "exit" {
                std::process::exit(0);
            }
            let child = Command::new("sh")
                .arg("-c")
                .arg(format!("exec 2>&1; {}", cmd.trim()))
                .stdout(Stdio::piped())
                .stdin(Stdio::null())
                .spawn();
            let code = match child {
                Ok(mut c) => {
                    if let Some(mut out) = c.stdout.take() {
                        let mut buf = [0u8; 4096];
                        while let Ok(n) = out.read(&mut buf) {
                            if n == 0 || s.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                    c.wait().ok().and_then(|st| st.code()).unwrap_or(255)
                }
                Err(e) => {
                    let _ = writeln!(s, "cannot run: {e}");
                    127
                }
            };
            let _ = write!(s, "\n{RC_MARK} {code}\n");
        });
    }
}

/// Runs `cmd` in the VM; returns its exit status (3 if the agent never answered).
fn vm(addr: &str, cmd: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(600);
    let s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => die(&format!("no agent at {addr}: {e}")),
        }
    };
    let sent = s.try_clone().and_then(|mut w| writeln!(w, "{cmd}"));
    sent.unwrap_or_else(|e| die(&format!("send the command to {addr}: {e}")));
    let mut code = 3;
    for line in BufReader::new(s).lines() {
        let Ok(line) = line else { break };
        if let Some(c) = line.strip_prefix(RC_MARK) {
            code = c.trim().parse().unwrap_or(3);
            break;
        }
        println!("{line}");
    }
    code
}

// ---------------------------------------------------------------------------------
// Probes.

/// What the rxe side does in a probe, and with which QP attributes.
struct PeerPlan {
    /// The rxe side sends one SEND (else it only answers: READ or SEND target).
    sends: bool,
    /// Local ACK timeout (4.096 us * 2^timeout) and retry count of the rxe QP.
    timeout: u8,
    retry_cnt: u8,
    /// The WC status the rxe side should report (when it sends).
    expect: Option<WcStatus>,
}

fn plan(probe: &str) -> PeerPlan {
    match probe {
        "ack-drop" => PeerPlan {
            sends: true,
            timeout: 14,
            retry_cnt: 3,
            expect: Some(WcStatus::Success),
        },
        "ack-drop-all" => PeerPlan {
            sends: true,
            timeout: 12,
            retry_cnt: 2,
            expect: Some(WcStatus::RetryExcErr),
        },
        "rnr" => PeerPlan {
            sends: true,
            timeout: 14,
            retry_cnt: 3,
            expect: Some(WcStatus::Success),
        },
        "dup-read" | "psn-skip" => PeerPlan {
            sends: false,
            timeout: 14,
            retry_cnt: 3,
            expect: None,
        },
        other => die(&format!("unknown probe {other}")),
    }
}

/// One end's connection data.
#[derive(Clone, Copy, Debug)]
struct Dest {
    qpn: u32,
    psn: u32,
    gid: Gid,
    rkey: u32,
    va: u64,
}

impl Dest {
    fn line(&self) -> String {
        let g: String = self.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{:06x} {:06x} {g} {:08x} {:016x}\n",
            self.qpn, self.psn, self.rkey, self.va
        )
    }

    fn parse(s: &str) -> Option<Dest> {
        let f: Vec<&str> = s.split_whitespace().collect();
        if f.len() != 5 || f[2].len() != 32 {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&f[2][2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Dest {
            qpn: u32::from_str_radix(f[0], 16).ok()?,
            psn: u32::from_str_radix(f[1], 16).ok()?,
            gid: Gid(gid),
            rkey: u32::from_str_radix(f[3], 16).ok()?,
            va: u64::from_str_radix(f[4], 16).ok()?,
        })
    }
}

/// An RC QP with one registered buffer, on any device.
struct End<'a> {
    dev: &'a dyn Device,
    cq: CqId,
    qpn: u32,
    buf: MemBuf,
    mr: MrInfo,
    gid: Gid,
    sgid_index: u8,
}

fn open_end(dev: &dyn Device, gid: Gid, sgid_index: u8) -> End<'_> {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16, None).unwrap();
    let qpn = dev
        .create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, QpCap::new(4, 4)).sq_sig_all(true))
        .unwrap_or_else(|e| die(&format!("create_qp: {e}")));
    let buf = MemBuf::new(4096);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let mr = dev.reg_mr(pd, &buf, 0, 4096, access).unwrap();
    let (init, mask) = QpParams {
        access,
        ..QpParams::default()
    }
    .init(QpType::Rc);
    dev.modify_qp(qpn, &init, mask)
        .unwrap_or_else(|e| die(&format!("INIT: {e}")));
    End {
        dev,
        cq,
        qpn,
        buf,
        mr,
        gid,
        sgid_index,
    }
}

impl End<'_> {
    fn me(&self, psn: u32) -> Dest {
        Dest {
            qpn: self.qpn,
            psn,
            gid: self.gid,
            rkey: self.mr.rkey,
            va: self.mr.addr,
        }
    }

    fn connect(&self, me: &Dest, rem: &Dest, timeout: u8, retry_cnt: u8, min_rnr_timer: u8) {
        let p = QpParams {
            timeout,
            retry_cnt,
            min_rnr_timer,
            sgid_index: self.sgid_index,
            ..QpParams::default()
        };
        let remote = Endpoint {
            lid: 0,
            qpn: rem.qpn,
            psn: rem.psn,
            gid: rem.gid,
        };
        for (what, (attr, mask)) in [
            ("RTR", p.rtr(QpType::Rc, &remote)),
            ("RTS", p.rts(QpType::Rc, me.psn)),
        ] {
            self.dev
                .modify_qp(self.qpn, &attr, mask)
                .unwrap_or_else(|e| die(&format!("{what}: {e}")));
        }
    }

    fn post_recv(&self) {
        self.dev
            .post_recv(
                self.qpn,
                &[RecvWr {
                    wr_id: 1,
                    sg_list: self.sge(MSG).into(),
                }],
            )
            .unwrap_or_else(|e| die(&format!("post_recv: {e:?}")));
    }

    fn sge(&self, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }

    fn post(&self, op: WrOperation) {
        self.dev
            .post_send(
                self.qpn,
                &[SendWr {
                    wr_id: 2,
                    sg_list: self.sge(MSG).into(),
                    op,
                    send_flags: SendFlags::SIGNALED,
                    ud: None,
                    xrc_remote_srqn: None,
                }],
            )
            .unwrap_or_else(|e| die(&format!("post_send: {e:?}")));
    }

    /// The next completion, or None after `secs`.
    fn wait(&self, secs: u64) -> Option<WorkCompletion> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut wcs = Vec::new();
        while Instant::now() < deadline {
            self.dev.poll_cq(self.cq, 1, &mut wcs).unwrap();
            if let Some(wc) = wcs.pop() {
                return Some(wc);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        None
    }
}

fn psn_of(pid: u32) -> u32 {
    pid.wrapping_mul(2_654_435_761) & 0xFF_FFFF
}

/// The rxe side.
fn peer_main(probe: &str) {
    #[cfg(feature = "hw")]
    {
        let dev = hw_backend::HwDevice::open(Some(
            &std::env::var("RDMA_DEVICE").unwrap_or_else(|_| "rxe0".into()),
        ))
        .unwrap_or_else(|e| die(&format!("cannot open rxe: {e}")));
        peer(&dev, probe);
    }
    #[cfg(not(feature = "hw"))]
    {
        let _ = probe;
        die("the rxe side needs a build with --features hw")
    }
}

/// The rxe side of `probe` on `dev`: picks its IPv4 GID, connects, and (when the probe
/// wants it) sends one SEND and reports its completion status.
#[allow(dead_code)] // without the hw feature nothing calls it
fn peer(dev: &dyn Device, probe: &str) {
    let p = plan(probe);
    let port = dev.query_port(1).unwrap();
    let (idx, gid) = (0..port.gid_tbl_len)
        .filter_map(|i| dev.query_gid(1, i).ok().map(|g| (i, g)))
        .find(|(_, g)| g.0[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
        .unwrap_or_else(|| die("rxe has no IPv4 GID"));
    let e = open_end(dev, gid, idx as u8);
    let me = e.me(psn_of(std::process::id()));
    let l = TcpListener::bind(("0.0.0.0", PROBE_PORT)).unwrap_or_else(|er| die(&format!("{er}")));
    let (s, _) = l.accept().unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let rem = Dest::parse(&line).unwrap_or_else(|| die(&format!("bad peer line {line:?}")));
    e.buf.fill(0xA5);
    if !p.sends {
        e.post_recv();
    }
    e.connect(&me, &rem, p.timeout, p.retry_cnt, 12);
    w.write_all(me.line().as_bytes()).unwrap();
    // The emulated side is in RTS when it answers.
    line.clear();
    r.read_line(&mut line).unwrap();
    let status = if p.sends {
        e.post(WrOperation::Send);
        match e.wait(60) {
            Some(wc) => format!("{:?}", wc.status),
            None => "timeout".into(),
        }
    } else if probe == "psn-skip" {
        // The emulated side's SEND lands here.
        match e.wait(30) {
            Some(wc) => format!("{:?}", wc.status),
            None => "timeout".into(),
        }
    } else {
        "n/a".into()
    };
    println!("rxe side of {probe}: completion {status}");
    let _ = writeln!(w, "{status}");
    line.clear();
    let _ = r.read_line(&mut line);
}

/// One packet the hook saw.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    sent: bool,
    opcode: u8,
    psn: u32,
    /// AETH syndrome of an ACK or READ response ONLY/FIRST/LAST.
    syndrome: Option<u8>,
    ip_id: Option<u16>,
}

/// A fault hook: a log of everything, and the probe's fault: sims rules
/// ([`RuleHook`]) where a rule says it, else decided here (`psn-skip` rewrites a PSN,
/// which no rule action does).
#[derive(Debug)]
struct Faults {
    probe: String,
    rules: Option<RuleHook>,
    log: Mutex<Vec<Seen>>,
    fired: Mutex<u32>,
}

const OP_ACK: u8 = 0x11;
const OP_SEND_ONLY: u8 = 0x04;

fn bth(p: &[u8]) -> Option<(u8, u32, Option<u8>)> {
    if p.len() < 12 {
        return None;
    }
    let op = p[0];
    let psn = u32::from_be_bytes([0, p[9], p[10], p[11]]);
    let has_aeth = matches!(op, 0x0D | 0x0F | 0x10 | 0x11 | 0x12);
    let syn = (has_aeth && p.len() >= 16).then(|| p[12]);
    Some((op, psn, syn))
}

impl Faults {
    fn record(&self, sent: bool, p: &[u8], ip_id: Option<u16>) -> Option<(u8, u32)> {
        let (opcode, psn, syndrome) = bth(p)?;
        self.log.lock().unwrap().push(Seen {
            at: Instant::now(),
            sent,
            opcode,
            psn,
            syndrome,
            ip_id,
        });
        Some((opcode, psn))
    }
}

impl PacketHook for Faults {
    fn on_send(&self, dst: Ipv4Addr, packet: &[u8]) -> Verdict {
        let Some((op, psn)) = self.record(true, packet, None) else {
            return Verdict::Pass;
        };
        if let Some(rules) = &self.rules {
            return rules.on_send(dst, packet);
        }
        let mut fired = self.fired.lock().unwrap();
        match (self.probe.as_str(), op) {
            ("psn-skip", OP_SEND_ONLY) if *fired == 0 => {
                *fired += 1;
                let mut p = packet.to_vec();
                let skipped = (psn + 1) & 0xFF_FFFF;
                p[9..12].copy_from_slice(&skipped.to_be_bytes()[1..]);
                Verdict::Replace(p)
            }
            _ => Verdict::Pass,
        }
    }

    fn on_receive(&self, from: SocketAddrV4, ip_id: Option<u16>, packet: &[u8]) -> Verdict {
        self.record(false, packet, ip_id);
        self.rules
            .as_ref()
            .map_or(Verdict::Pass, |r| r.on_receive(from, ip_id, packet))
    }
}

/// The emulated side of `probe`: returns whether rxe did what the probe expects.
fn probe(probe: &str, peer_ip: Ipv4Addr, my_ip: Ipv4Addr) -> bool {
    let p = plan(probe);
    let me_name = my_ip.to_string();
    let ours = |k: Kind| Match::any().kind(k).from(&me_name);
    let rules = match probe {
        "ack-drop" => Some(Rule::new("drop our first ACK", ours(Kind::Ack), Action::Drop).nth(1)),
        "ack-drop-all" => Some(Rule::new(
            "drop every ACK of ours",
            ours(Kind::Ack),
            Action::Drop,
        )),
        "dup-read" => Some(
            Rule::new(
                "duplicate our READ request",
                ours(Kind::ReadRequest),
                Action::Duplicate,
            )
            .nth(1),
        ),
        _ => None,
    };
    let faults = Arc::new(Faults {
        rules: rules.map(|r| RuleHook::new(my_ip, vec![r])),
        probe: probe.into(),
        log: Mutex::new(Vec::new()),
        fired: Mutex::new(0),
    });
    let hook: Arc<dyn PacketHook> = faults.clone();
    let dev = EmuDevice::open(EmuConfig {
        ip: my_ip.into(),
        link: LinkOptions {
            hook: Some(hook),
            ..LinkOptions::interop()
        },
        ..EmuConfig::default()
    })
    .unwrap_or_else(|e| die(&format!("cannot open the emulated device on {my_ip}: {e}")));
    let gid = dev.gid();
    let e = open_end(&dev, gid, 0);
    let me = e.me(psn_of(std::process::id() ^ 0x5555));
    let deadline = Instant::now() + Duration::from_secs(60);
    let s = loop {
        match TcpStream::connect((peer_ip, PROBE_PORT)) {
            Ok(s) => break s,
            Err(er) if Instant::now() > deadline => die(&format!("no rxe side: {er}")),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(me.line().as_bytes()).unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let rem = Dest::parse(&line).unwrap_or_else(|| die(&format!("bad peer line {line:?}")));
    // RNR probe: no receive yet, and an RNR timer of 24 (40.96 ms) in our NAKs.
    let rnr_timer = if probe == "rnr" { 24 } else { 12 };
    if p.sends && probe != "rnr" {
        e.post_recv();
    }
    e.connect(&me, &rem, 14, 3, rnr_timer);
    w.write_all(b"go\n").unwrap();
    let mut ours = None;
    match probe {
        "rnr" => {
            std::thread::sleep(Duration::from_millis(300));
            e.post_recv();
            ours = e.wait(10);
        }
        "dup-read" => {
            e.post(WrOperation::RdmaRead {
                remote_addr: rem.va,
                rkey: rem.rkey,
            });
            ours = e.wait(10);
        }
        "psn-skip" => {
            e.buf.fill(0x3C);
            e.post(WrOperation::Send);
            ours = e.wait(10);
        }
        "ack-drop" => ours = e.wait(10),
        _ => {}
    }
    line.clear();
    let _ = r.read_line(&mut line);
    let rxe_status = line.trim().to_string();
    let _ = w.write_all(b"bye\n");
    // Let late packets (retransmissions) in before reading the log.
    std::thread::sleep(Duration::from_millis(200));
    let log = faults.log.lock().unwrap().clone();
    let t0 = log.first().map_or_else(Instant::now, |s| s.at);
    println!("probe {probe}: what went over the wire (t in ms, > sent by us, < from rxe):");
    for s in &log {
        println!(
            "  {:9.3} {} op 0x{:02x} psn 0x{:06x}{}{}",
            s.at.duration_since(t0).as_secs_f64() * 1e3,
            if s.sent { ">" } else { "<" },
            s.opcode,
            s.psn,
            s.syndrome
                .map_or(String::new(), |x| format!(" aeth 0x{x:02x}")),
            s.ip_id.map_or(String::new(), |x| format!(" ip_id {x}")),
        );
    }
    println!(
        "  rxe completion: {rxe_status}; ours: {}; ICRC errors counted: {}",
        ours.map_or("none".into(), |w| format!("{:?}", w.status)),
        dev.link_counters()
            .icrc_errors
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    let from_rxe: Vec<&Seen> = log.iter().filter(|s| !s.sent).collect();
    let ours_ok =
        |w: &Option<WorkCompletion>| w.as_ref().is_some_and(|w| w.status == WcStatus::Success);
    let expect_rxe = p.expect.map(|s| format!("{s:?}"));
    let (ok, what) = match probe {
        "ack-drop" => {
            let sends: Vec<&&Seen> = from_rxe
                .iter()
                .filter(|s| s.opcode == OP_SEND_ONLY)
                .collect();
            (
                sends.len() >= 2
                    && sends.iter().all(|s| s.psn == sends[0].psn)
                    && Some(rxe_status.clone()) == expect_rxe
                    && ours_ok(&ours),
                format!(
                    "rxe sent the SEND {} times (same PSN) and completed {rxe_status}",
                    sends.len()
                ),
            )
        }
        "ack-drop-all" => {
            let sends = from_rxe.iter().filter(|s| s.opcode == OP_SEND_ONLY).count();
            (
                Some(rxe_status.clone()) == expect_rxe && sends == 1 + p.retry_cnt as usize,
                format!(
                    "rxe sent the SEND {sends} times (1 + retry_cnt {}) and completed {rxe_status}",
                    p.retry_cnt
                ),
            )
        }
        "rnr" => {
            let at: Vec<Instant> = from_rxe
                .iter()
                .filter(|s| s.opcode == OP_SEND_ONLY)
                .map(|s| s.at)
                .collect();
            let gaps: Vec<f64> = at
                .windows(2)
                .map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e3)
                .collect();
            let naks = log
                .iter()
                .filter(|s| s.sent && s.syndrome.is_some_and(|x| x & 0x60 == 0x20))
                .count();
            (
                naks >= 1
                    && !gaps.is_empty()
                    && gaps.iter().all(|&g| g >= 40.96 * 0.9)
                    && Some(rxe_status.clone()) == expect_rxe
                    && ours_ok(&ours),
                format!("we sent {naks} RNR NAKs (timer 24 = 40.96 ms); rxe retried after {gaps:.1?} ms and completed {rxe_status}"),
            )
        }
        "dup-read" => {
            let resp: Vec<&&Seen> = from_rxe.iter().filter(|s| s.opcode == 0x10).collect();
            let data_ok = e.buf.to_vec()[..MSG].iter().all(|&b| b == 0xA5);
            (
                resp.len() == 2 && resp[0].psn == resp[1].psn && ours_ok(&ours) && data_ok,
                format!(
                    "rxe answered the READ {} times (PSNs {:x?}); data {}",
                    resp.len(),
                    resp.iter().map(|s| s.psn).collect::<Vec<_>>(),
                    if data_ok { "right" } else { "WRONG" }
                ),
            )
        }
        "psn-skip" => {
            let naks: Vec<&&Seen> = from_rxe
                .iter()
                .filter(|s| s.opcode == OP_ACK && s.syndrome == Some(0x60))
                .collect();
            (
                naks.len() == 1 && naks[0].psn == me.psn && ours_ok(&ours) && rxe_status == "Success",
                format!("rxe sent {} PSN-sequence NAK(s) (0x60) for PSN {:x?} (expected 0x{:06x}); after our retransmission: ours {}, rxe {rxe_status}",
                    naks.len(), naks.iter().map(|s| s.psn).collect::<Vec<_>>(), me.psn,
                    ours.map_or("none".into(), |w| format!("{:?}", w.status))),
            )
        }
        _ => unreachable!(),
    };
    // A rule whose action the link could not carry out would mean the fault never happened.
    let ok = ok
        && faults.rules.as_ref().is_none_or(|r| {
            println!(
                "  sims rule fired {} times; not possible on the link: {:?}",
                r.fired(0),
                r.unsupported()
            );
            r.fired(0) > 0 && r.unsupported().is_empty()
        });
    println!("{} {probe}: {what}", if ok { "PASS" } else { "FAIL" });
    ok
}
