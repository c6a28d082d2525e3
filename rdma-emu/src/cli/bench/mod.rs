//! `rdma-emu bench`: perftest-style bandwidth and latency tests between two emulated
//! devices, on UDP loopback (two devices in this process, 127.0.0.1 and 127.0.0.2) or
//! on the in-memory fabric (`--fabric`), each followed by its ratio against baselines
//! measured in the same run on the same path (see `baseline`).
//!
//! Bandwidth tests keep `--tx-depth` work requests in flight, spread over `--qps` QPs,
//! every one signaled; the server's application only reposts receives (send_bw).
//! Latency tests are ping-pongs on one QP: send_lat (SEND both ways; half the round
//! trip), write_lat (RDMA WRITE both ways, each side polling the last byte of its
//! buffer; half the round trip), read_lat (one RDMA READ; the whole round trip, as
//! perftest reports it).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use emu_core::nic::{EmuConfig, EmuDevice, SameHost};
use emu_sims::{Fabric, TraceMode};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use verbs_api::{
    connect_qp, AccessFlags, ChannelId, CqId, Device, Endpoint, Gid, MemBuf, MrInfo, Mtu, PdId,
    QpCap, QpInitAttr, QpParams, QpType, RecvWr, SendFlags, SendWr, Sge, WcStatus, WorkCompletion,
    WrOperation,
};

mod bw;
mod child;
mod lat;

pub(super) use bw::measure_bw;
pub(super) use lat::measure_lat;

use super::baseline;
use super::checks::{check_memory, check_mr};
use super::stats::{peak_rss_kib, rss_kib, LatStats};

/// The link between the bench's two devices (not on the fabric).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LinkKind {
    /// UDP on 127.0.0.1 and 127.0.0.2.
    Udp,
    /// The same-host shared-memory link (emu-core's `SameHost::Shm`).
    Shm,
    /// UDP devices that also offer the shared-memory link and use it to each other
    /// (emu-core's `SameHost::Auto`).
    Auto,
}

impl LinkKind {
    /// The name `--link` takes, and the JSON line's `transport`.
    fn name(self) -> &'static str {
        match self {
            LinkKind::Udp => "udp",
            LinkKind::Shm => "shm",
            LinkKind::Auto => "auto",
        }
    }
}

/// The test to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[allow(clippy::enum_variant_names)]
pub(crate) enum Test {
    /// SEND bandwidth.
    #[value(name = "send_bw")]
    SendBw,
    /// RDMA WRITE bandwidth.
    #[value(name = "write_bw")]
    WriteBw,
    /// RDMA READ bandwidth.
    #[value(name = "read_bw")]
    ReadBw,
    /// FETCH_ADD message rate (8 bytes each).
    #[value(name = "atomic_bw")]
    AtomicBw,
    /// SEND ping-pong latency.
    #[value(name = "send_lat")]
    SendLat,
    /// RDMA WRITE ping-pong latency.
    #[value(name = "write_lat")]
    WriteLat,
    /// RDMA READ latency.
    #[value(name = "read_lat")]
    ReadLat,
    /// Junk at the device's port: its discard rate against a raw receive loop, and RC
    /// WRITE bandwidth and latency with and without junk (module `flood`).
    #[value(name = "flood")]
    Flood,
}

impl Test {
    fn is_lat(self) -> bool {
        matches!(self, Test::SendLat | Test::WriteLat | Test::ReadLat)
    }

    fn title(self) -> &'static str {
        match self {
            Test::SendBw => "Send BW Test",
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::AtomicBw => "Atomic FETCH_ADD BW Test",
            Test::SendLat => "Send Latency Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::Flood => "Junk flood",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Test::SendBw => "send_bw",
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::AtomicBw => "atomic_bw",
            Test::SendLat => "send_lat",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::Flood => "flood",
        }
    }
}

/// Options of `rdma-emu bench`.
#[derive(Args, Clone, Debug)]
pub(crate) struct BenchOpts {
    /// The test.
    #[arg(value_enum)]
    pub(crate) test: Test,
    /// Message size in bytes (atomic_bw: always 8). Default: 65536 for bandwidth,
    /// 8 for latency.
    #[arg(long, short = 's')]
    pub(crate) size: Option<u64>,
    /// Messages per QP (bandwidth) or round trips (latency).
    #[arg(long, short = 'n')]
    pub(crate) iters: Option<u64>,
    /// Queue pairs (bandwidth tests; a run with more than one also measures one QP
    /// and prints the ratio).
    #[arg(long, short = 'q', default_value_t = 1)]
    pub(crate) qps: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, short = 'm', default_value_t = 4096)]
    pub(crate) mtu: u32,
    /// Work requests in flight (bandwidth tests), over all QPs. Default: 128.
    #[arg(long, short = 't')]
    pub(crate) tx_depth: Option<u32>,
    /// Work requests in flight on one QP (bandwidth tests), posted as one list, as
    /// perftest's `--tx-depth` with `--post_list`. Default: `--tx-depth` over
    /// `--qps`. With more QPs than `--tx-depth` over this, QPs take turns: each round
    /// robin pass posts this many to the next QPs while the total stays under
    /// `--tx-depth`, so a QP's messages still share an ACK and the devices' socket
    /// buffers hold what is in flight.
    #[arg(long)]
    pub(crate) qp_depth: Option<u32>,
    /// Fill the source with a pattern and check the target byte for byte at the end;
    /// exit non-zero on any mismatch.
    #[arg(long)]
    pub(crate) verify: bool,
    /// Run on the in-memory fabric instead of UDP loopback (baseline: memcpy).
    #[arg(long)]
    pub(crate) fabric: bool,
    /// Open the devices in busy-poll mode (an empty poll_cq receives itself) and spin
    /// on poll_cq; the latency baseline is then the busy-polling raw ping-pong.
    /// Without it the latency tests yield the CPU after each empty poll, and so does
    /// their raw ping-pong.
    #[arg(long)]
    pub(crate) busy_poll: bool,
    /// send_lat waits for each completion on a completion channel
    /// (`req_notify_cq`, then `get_cq_event` when a poll finds nothing, as perftest's
    /// `-e`) instead of polling; the latency baseline is then the blocking raw
    /// ping-pong.
    #[arg(long, conflicts_with = "busy_poll")]
    pub(crate) events: bool,
    /// send_lat and write_lat: after each post, wait for the send's own completion
    /// (its ACK) before waiting for the answer, on both sides, as perftest's latency
    /// tests do (their send queue is one deep, every send signaled). Without it a
    /// side waits for the answer only and reaps send completions on the way.
    #[arg(long)]
    pub(crate) wait_send: bool,
    /// send_lat and write_lat with `--busy-poll`: both sides' loops in one thread, in
    /// turn (the client posts, the server polls until the message is there and
    /// answers, the client polls until the answer is there). The run then measures
    /// the CPU the two devices spend on a round trip, without the wait for the other
    /// core (a cache line's trip between two cores, on the rings) or the scheduler:
    /// what the devices' code costs, steady while the host's speed moves. No baseline.
    #[arg(long, requires = "busy_poll", conflicts_with_all = ["wait_send", "events"])]
    pub(crate) one_thread: bool,
    /// The link between the two devices: UDP loopback, the same-host shared-memory
    /// link (rings in memory; bandwidth baseline: memcpy, latency baseline: the raw
    /// UDP ping-pong, as on UDP), or `auto`: UDP devices that choose the rings to a
    /// peer that offers them (baselines as `shm`).
    #[arg(long, value_enum, default_value_t = LinkKind::Udp, conflicts_with = "fabric")]
    pub(crate) link: LinkKind,
    /// The port of both devices: their UDP port, and on the rings part of the address
    /// each offers (`IP-PORT`); not for the fabric. Default: one picked from the
    /// process id.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) port: Option<u16>,
    /// Bandwidth tests on UDP, shm or auto: the server's device runs in a process of
    /// its own (this program, started again), as perftest's two programs do, not in
    /// this one beside the client's.
    #[arg(long, conflicts_with = "fabric")]
    pub(crate) two_processes: bool,
    /// The server's side of `--two-processes`, driven by its parent on stdin.
    #[arg(long, hide = true)]
    pub(crate) serve_stdio: bool,
    /// Skip the baselines (no ratios).
    #[arg(long)]
    pub(crate) no_baseline: bool,
    /// Run the test this many times (each with fresh devices and QPs; in a bandwidth
    /// test with `--qps` over 1, each round also runs one QP right after; the
    /// baselines after each round) and report the median round by its ratio (a UDP
    /// bandwidth test's against raw UDP with GSO and GRO), listing every round. A shared machine's load moves between runs a second apart; the
    /// median of rounds whose parts ran back to back is the steadier ratio.
    #[arg(long, default_value_t = 1)]
    pub(crate) rounds: u32,
    /// Print one JSON object with the results as the last line.
    #[arg(long)]
    pub(crate) json: bool,
}

/// One side of the test: a device, its QPs and its registered memory.
struct Host {
    dev: Arc<EmuDevice>,
    pd: PdId,
    /// The completion channel of every CQ (`--events`).
    channel: Option<ChannelId>,
    /// Completion queues, each shared by as many QPs as it can take with all their
    /// WRs completed at once (an overrun would move the QPs to the error state).
    cqs: Vec<CqId>,
    qpns: Vec<u32>,
    buf: MemBuf,
    mr: MrInfo,
}

/// The server's side: in this process, or in a child process (`--two-processes`).
enum Server {
    Here(Host),
    Child(child::Child),
}

impl Server {
    fn qpns(&self) -> &[u32] {
        match self {
            Server::Here(h) => &h.qpns,
            Server::Child(c) => &c.qpns,
        }
    }

    fn mr(&self) -> MrInfo {
        match self {
            Server::Here(h) => h.mr,
            Server::Child(c) => c.mr,
        }
    }

    fn gid(&self) -> Gid {
        match self {
            Server::Here(h) => h.dev.gid(),
            Server::Child(c) => c.gid,
        }
    }

    /// Where QP `qp`'s `region`-byte region of the buffer starts.
    fn offset(&self, qp: usize, region: u64) -> u64 {
        match self {
            Server::Here(h) => h.offset(qp, region),
            Server::Child(c) => region_offset(c.buf_len, qp, region),
        }
    }

    /// The host in this process; latency tests and `--verify` need it.
    fn here(&self) -> Result<&Host, String> {
        match self {
            Server::Here(h) => Ok(h),
            Server::Child(_) => Err("the server runs in another process".into()),
        }
    }
}

/// Two connected hosts and what keeps their network alive.
struct Setup {
    client: Host,
    server: Server,
    fabric: Option<Fabric>,
    /// Bytes of memory region per QP.
    region: u64,
}

fn mtu_of(bytes: u32) -> Result<Mtu, String> {
    Ok(match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => {
            return Err(format!(
                "--mtu {bytes}: must be 256, 512, 1024, 2048 or 4096"
            ))
        }
    })
}

fn os(what: &str) -> impl Fn(verbs_api::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn open_host(
    dev: Arc<EmuDevice>,
    qps: u32,
    send_wr: u32,
    recv_wr: u32,
    buf_len: usize,
    events: bool,
) -> Result<Host, String> {
    let pd = dev.alloc_pd().map_err(os("alloc_pd"))?;
    let channel = if events {
        Some(
            dev.create_comp_channel()
                .map_err(os("create_comp_channel"))?,
        )
    } else {
        None
    };
    // Each QP can have all its send and receive WRs completed before anyone polls.
    let per_qp = u64::from(send_wr) + u64::from(recv_wr);
    let max_cqe = u64::from(dev.query_device().map_err(os("query_device"))?.max_cqe);
    let qps_per_cq = (max_cqe / per_qp.max(1)).clamp(1, u64::from(qps.max(1))) as usize;
    let cqs = (0..(qps as usize).div_ceil(qps_per_cq).max(1))
        .map(|i| {
            let n = (qps as usize - i * qps_per_cq).min(qps_per_cq) as u64;
            dev.create_cq((n * per_qp).clamp(16, max_cqe) as u32, channel)
                .map_err(os("create_cq"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let cap = QpCap::new(send_wr, recv_wr);
    let qpns = (0..qps as usize)
        .map(|i| {
            let cq = cqs[i / qps_per_cq];
            dev.create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, cap))
                .map_err(os("create_qp"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_mr(&*dev, "the bench's buffer", buf_len as u64)?;
    let buf = MemBuf::new(buf_len);
    let mr = dev
        .reg_mr(pd, &buf, 0, buf.len(), ACCESS)
        .map_err(os("reg_mr"))?;
    Ok(Host {
        dev,
        pd,
        channel,
        cqs,
        qpns,
        buf,
        mr,
    })
}

/// The ACK timeout exponent for `depth` WRs in flight: 268 ms a try at least (a
/// loaded 2-core machine can starve a device thread), and longer than `depth`
/// messages take at 25 us each (40,000 a second, a fifth of the 200,000 two devices
/// managed beside two CPU hogs), since the last WR posted waits behind all the
/// others. A timer that expires before the ACK can come sends the WRs again, and the
/// duplicates slow the devices further, until a QP's retries run out
/// (docs/performance.md).
fn ack_timeout(depth: u32) -> u8 {
    let wait_ns = (u64::from(depth) * 25_000).max(268_000_000);
    // IBTA 9.7.6.1.3: 4.096 us * 2^timeout.
    (16..=30).find(|&t| 4096u64 << t >= wait_ns).unwrap_or(30)
}

/// The bytes of each side's buffer for `qps` QPs of `size`-byte messages, and each
/// QP's region of it: a region per QP as long as that stays under 256 MiB; beyond that
/// QPs share.
fn buffer(size: u64, qps: u32) -> Result<(u64, u64), String> {
    let region = size.max(8);
    let len = region
        .checked_mul(u64::from(qps).min((256u64 << 20).div_ceil(region).max(1)))
        .ok_or("the message does not fit memory")?;
    Ok((len, region))
}

fn setup(o: &BenchOpts, size: u64, qps: u32, send_wr: u32, recv_wr: u32) -> Result<Setup, String> {
    let (buf_len, region) = buffer(size, qps)?;
    let buf_len = usize::try_from(buf_len).map_err(|_| "the message does not fit memory")?;
    // One buffer on each side.
    check_memory(
        &format!("--size {size} with --qps {qps}"),
        (buf_len as u64).saturating_mul(2),
    )?;
    let (a, b, fabric) = if o.fabric {
        let f = Fabric::new(1);
        f.set_trace_mode(TraceMode::Off);
        let a = f
            .add_device("emu0", Ipv4Addr::new(10, 0, 0, 1))
            .map_err(os("fabric"))?;
        let b = f
            .add_device("emu1", Ipv4Addr::new(10, 0, 0, 2))
            .map_err(os("fabric"))?;
        (a, Some(b), Some(f))
    } else {
        let b = if o.two_processes {
            None
        } else {
            Some(open_device(o, "emu1", 2)?)
        };
        (open_device(o, "emu0", 1)?, b, None)
    };
    let client = open_host(a, qps, send_wr, recv_wr, buf_len, o.events)?;
    let server = match b {
        Some(b) => Server::Here(open_host(b, qps, send_wr, recv_wr, buf_len, o.events)?),
        None => Server::Child(child::Child::start(o, size, qps, send_wr, recv_wr)?),
    };
    let params = qp_params(o)?;
    for (i, (&cq, &sq)) in client.qpns.iter().zip(server.qpns()).enumerate() {
        let (client_psn, server_psn) = psns(i);
        let se = Endpoint {
            qpn: sq,
            psn: server_psn,
            gid: server.gid(),
            ..Endpoint::default()
        };
        connect_qp(&*client.dev, cq, QpType::Rc, &params, client_psn, &se)
            .map_err(os("connect"))?;
        if let Server::Here(s) = &server {
            let ce = Endpoint {
                qpn: cq,
                psn: client_psn,
                gid: client.dev.gid(),
                ..Endpoint::default()
            };
            connect_qp(&*s.dev, sq, QpType::Rc, &params, server_psn, &ce).map_err(os("connect"))?;
        }
    }
    if let Server::Child(c) = &server {
        c.connect(client.dev.gid(), &client.qpns)?;
    }
    Ok(Setup {
        client,
        server,
        fabric,
        region,
    })
}

/// The UDP port of both devices: `--port`, or one picked from the process id.
fn port_of(o: &BenchOpts) -> u16 {
    o.port
        .unwrap_or(20000 + (std::process::id() % 20000) as u16)
}

/// Opens the device `name` at 127.0.0.`last` with `o`'s port, link and polling.
fn open_device(o: &BenchOpts, name: &str, last: u8) -> Result<Arc<EmuDevice>, String> {
    EmuDevice::open(EmuConfig {
        name: name.into(),
        ip: Ipv4Addr::new(127, 0, 0, last).into(),
        port: port_of(o),
        busy_poll: o.busy_poll,
        same_host: match o.link {
            LinkKind::Udp => SameHost::Udp,
            LinkKind::Shm => SameHost::Shm,
            LinkKind::Auto => SameHost::Auto,
        },
        ..EmuConfig::default()
    })
    .map(Arc::new)
    .map_err(os("open the device"))
}

/// What both sides' buffers are registered with and their QPs allow: every test's
/// remote access.
const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// What both sides' QPs are moved to RTS with.
fn qp_params(o: &BenchOpts) -> Result<QpParams, String> {
    Ok(QpParams {
        path_mtu: mtu_of(o.mtu)?,
        access: ACCESS,
        timeout: ack_timeout(o.depth()),
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        ..QpParams::default()
    })
}

/// The first PSNs of the client's and the server's QP number `i`.
fn psns(i: usize) -> (u32, u32) {
    let psn = (i as u32).wrapping_mul(7919) & 0xFF_FFFF;
    (psn, psn ^ 0x5555)
}

/// Where QP `qp`'s `region`-byte region of a `buf_len`-byte buffer starts.
fn region_offset(buf_len: u64, qp: usize, region: u64) -> u64 {
    (qp as u64 * region) % buf_len.saturating_sub(region).saturating_add(1).max(1)
}

impl Host {
    /// Another handle on the same device, QPs and memory, for a thread that serves
    /// them.
    fn share(&self) -> Host {
        Host {
            dev: self.dev.clone(),
            pd: self.pd,
            channel: self.channel,
            cqs: self.cqs.clone(),
            qpns: self.qpns.clone(),
            buf: self.buf.clone(),
            mr: self.mr,
        }
    }

    fn sge(&self, offset: u64, len: u64) -> Sge {
        Sge {
            addr: self.mr.addr + offset,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }

    fn offset(&self, qp: usize, region: u64) -> u64 {
        region_offset(self.buf.len() as u64, qp, region)
    }

    /// The server's preparation for a bandwidth run of `test`: send_bw's `n` receives
    /// of `len` bytes on every QP, each QP's at its `region`-byte region.
    fn prepare_run(&self, test: Test, n: u32, region: u64, len: u64) -> Result<(), String> {
        if test == Test::SendBw {
            for q in 0..self.qpns.len() {
                self.post_recvs(q, n, region, len)?;
            }
        }
        Ok(())
    }

    fn post_recvs(&self, qp: usize, n: u32, region: u64, len: u64) -> Result<(), String> {
        let wr = RecvWr {
            wr_id: qp as u64,
            sg_list: self.sge(self.offset(qp, region), len).into(),
        };
        let wrs = vec![wr; n as usize];
        self.dev
            .post_recv(self.qpns[qp], &wrs)
            .map_err(|e| format!("post_recv: {e}"))
    }

    /// Posts receive WRs built beforehand (on QP 0).
    fn repost(&self, wrs: &[RecvWr]) -> Result<(), String> {
        self.dev
            .post_recv(self.qpns[0], wrs)
            .map_err(|e| format!("post_recv: {e}"))
    }

    /// What a latency test does after a poll that found nothing: spin (busy-poll),
    /// yield the CPU, or (`--events`) arm the CQs and poll once more, then, armed,
    /// block on the completion channel (the usual arm-poll-wait order: a completion
    /// that came before the arming is found by the poll after it).
    fn idle(&self, o: &BenchOpts, armed: &mut bool) -> Result<(), String> {
        match self.channel {
            Some(ch) if *armed => {
                self.dev
                    .get_cq_event(ch, Some(Duration::from_secs(5)))
                    .map_err(os("get_cq_event"))?;
                *armed = false;
            }
            Some(_) => {
                for &cq in &self.cqs {
                    self.dev
                        .req_notify_cq(cq, false)
                        .map_err(os("req_notify_cq"))?;
                }
                *armed = true;
            }
            None if o.busy_poll => {}
            None => std::thread::yield_now(),
        }
        Ok(())
    }

    fn poll(&self, out: &mut Vec<WorkCompletion>) -> Result<usize, String> {
        out.clear();
        let mut n = 0;
        for &cq in &self.cqs {
            n += self.dev.poll_cq(cq, 64, out).map_err(os("poll_cq"))?;
        }
        if let Some(bad) = out.iter().find(|w| w.status != WcStatus::Success) {
            return Err(format!(
                "completion with status {} on QP {:#x} (opcode {:?})",
                bad.status, bad.qp_num, bad.opcode
            ));
        }
        Ok(n)
    }
}

/// A progress bar that appears once the run has lasted a second (on a terminal).
struct Progress {
    bar: ProgressBar,
    start: Instant,
    shown: bool,
}

impl Progress {
    fn new(len: u64, json: bool) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
        if let Ok(style) =
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
        {
            bar.set_style(style);
        }
        Progress {
            bar,
            start: Instant::now(),
            // JSON output is for scripts: no bar.
            shown: json,
        }
    }

    fn set(&mut self, pos: u64) {
        if !self.shown && self.start.elapsed() > Duration::from_secs(1) {
            self.shown = true;
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        self.bar.set_position(pos);
    }

    fn finish(self) {
        self.bar.finish_and_clear();
    }
}

/// Fills the source with a pattern before the run, checks the target after it.
fn verify_fill(o: &BenchOpts, st: &Setup) -> Result<(), String> {
    let src = match o.test {
        Test::ReadBw | Test::ReadLat => &st.server.here()?.buf,
        _ => &st.client.buf,
    };
    src.with_mut(|b| {
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3];
        }
    });
    Ok(())
}

fn verify_check(o: &BenchOpts, st: &Setup, size: u64, msgs: u64) -> Result<(), String> {
    let server = st.server.here()?;
    let (src, dst) = match o.test {
        Test::ReadBw | Test::ReadLat => (&server.buf, &st.client.buf),
        _ => (&st.client.buf, &server.buf),
    };
    if o.test == Test::AtomicBw {
        let v = dst.read_u64(0).map_err(os("read"))?;
        return if v == msgs {
            Ok(())
        } else {
            Err(format!("verify: the counter is {v}, expected {msgs}"))
        };
    }
    let qps = st.client.qpns.len();
    for q in 0..qps {
        let (so, doff) = (
            st.client.offset(q, st.region),
            st.server.offset(q, st.region),
        );
        let (so, doff) = match o.test {
            Test::ReadBw | Test::ReadLat => (doff, so),
            _ => (so, doff),
        };
        let n = if o.is_lat_marked() { size - 1 } else { size } as usize;
        let a = src.with(|b| b[so as usize..so as usize + n].to_vec());
        let ok = dst.with(|b| b[doff as usize..doff as usize + n] == a[..]);
        if !ok {
            let first = dst.with(|b| {
                b[doff as usize..doff as usize + n]
                    .iter()
                    .zip(&a)
                    .position(|(x, y)| x != y)
                    .unwrap_or(0)
            });
            return Err(format!(
                "verify: QP {q}: the target differs from the source at byte {first}"
            ));
        }
    }
    Ok(())
}

/// The send and receive queue sizes of a latency test's QPs.
const LAT_WRS: (u32, u32) = (128, 128);

impl BenchOpts {
    /// The send and receive queue sizes of a bandwidth test's QPs: each QP's share of
    /// the depth, and twice that in receives.
    fn bw_wrs(&self) -> (u32, u32) {
        let per_qp = self.per_qp();
        (per_qp, per_qp.saturating_mul(2))
    }

    /// Latency tests that write a mark in the last byte.
    fn is_lat_marked(&self) -> bool {
        matches!(self.test, Test::SendLat | Test::WriteLat)
    }

    /// `--tx-depth`, or its default.
    fn depth(&self) -> u32 {
        self.tx_depth.unwrap_or(128)
    }

    /// WRs in flight on one QP, and posted in one list: `--qp-depth`, or the QP's
    /// share of `--tx-depth`.
    fn per_qp(&self) -> u32 {
        self.qp_depth
            .unwrap_or_else(|| self.depth().div_ceil(self.qps.max(1)).max(1))
    }
}

/// Says what the devices of `st` lost before the engine saw it, if anything: datagrams
/// the kernel dropped at a full socket (the host did not let the device keep up: loss
/// by overload, which RC repairs by retransmitting, not loss on the path) and datagrams
/// with a wrong ICRC. The kernel's count is read once a second, so a run shorter than
/// that may not show it yet. Also how many packets each device received through the
/// shared-memory rings, if any (`--link shm` or `auto`: which path auto chose).
fn report_losses(st: &Setup) {
    let counts = |h: &Host| {
        let l = h.dev.link_counters();
        Some([&l.shm_packets, &l.rx_overflow, &l.icrc_errors].map(|c| c.load(Ordering::Relaxed)))
    };
    let server = match &st.server {
        Server::Here(h) => counts(h),
        Server::Child(c) => c
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|c| [c.shm_packets, c.rx_overflow, c.icrc_errors]),
    };
    for (side, counts) in [("client", counts(&st.client)), ("server", server)] {
        let Some([shm, overflow, icrc]) = counts else {
            continue;
        };
        if shm > 0 {
            println!(" {side}: {shm} packets received through the shared-memory rings");
        }
        if overflow > 0 || icrc > 0 {
            println!(
                " {side}: {overflow} datagrams dropped by the kernel (socket buffer full: overload), {icrc} with a wrong ICRC"
            );
        }
    }
}

/// In a debug build, one banner line saying so: its figures and ratios are those of
/// unoptimized code, many times below a release build's.
pub(super) fn print_build() {
    if cfg!(debug_assertions) {
        println!(
            " Build           : DEBUG: figures of unoptimized code, far below a release build's"
        );
    }
}

pub(super) fn line() -> &'static str {
    "---------------------------------------------------------------------------------------"
}

/// The UDP payload of a full-sized data packet of this test: BTH, payload, ICRC (the
/// datagram size the baselines use).
fn datagram(size: u64, mtu: u32) -> usize {
    size.clamp(1, u64::from(mtu)) as usize + 12 + 4
}

fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "null".into()
    }
}

/// A round's devices and QPs: the ones set up before the first round, then fresh
/// ones (source filled again for `--verify`).
fn round_setup(
    o: &BenchOpts,
    size: u64,
    send_wr: u32,
    recv_wr: u32,
    first: &mut Option<Setup>,
) -> Result<Setup, String> {
    if let Some(st) = first.take() {
        return Ok(st);
    }
    let st = setup(o, size, o.qps, send_wr, recv_wr)?;
    if o.verify {
        verify_fill(o, &st)?;
    }
    Ok(st)
}

/// The JSON fields listing rounds: how many, and each one's ratio (or value).
fn rounds_json(keys: &[f64]) -> String {
    let values: Vec<String> = keys.iter().map(|&k| json_num(k)).collect();
    format!(
        ",\"rounds\":{},\"round_values\":[{}]",
        keys.len(),
        values.join(",")
    )
}

/// The index of the median of `keys` (the upper middle one of an even count).
fn median_of(keys: &[f64]) -> usize {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]));
    order[order.len() / 2]
}

/// The message size of `o`'s test: `--size`, else 8 for atomics and latency tests and
/// 65536 for bandwidth tests (flood: the junk datagram's, 1024).
fn size_of(o: &BenchOpts) -> u64 {
    o.size.unwrap_or(match o.test {
        Test::Flood => 1024,
        Test::AtomicBw => 8,
        t if t.is_lat() => 8,
        _ => 65536,
    })
}

/// Every rule on the options, checked before anything is printed: a bad option ends
/// `bench` with one line on stderr and no banner, and no count of zero runs nothing.
pub(crate) fn check(o: &BenchOpts) -> Result<(), String> {
    if o.iters == Some(0) {
        return Err("--iters must be at least 1".into());
    }
    if o.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    if o.qps == 0 {
        return Err("--qps must be at least 1".into());
    }
    if o.tx_depth == Some(0) {
        return Err("--tx-depth must be at least 1".into());
    }
    if o.qp_depth == Some(0) {
        return Err("--qp-depth must be at least 1".into());
    }
    if let Some(q) = o.qp_depth.filter(|&q| q > o.depth()) {
        return Err(format!(
            "--qp-depth {q}: over --tx-depth {}, which bounds the WRs in flight over all QPs",
            o.depth()
        ));
    }
    mtu_of(o.mtu)?;
    if o.test == Test::Flood {
        return super::flood::check(o);
    }
    let lat = o.test.is_lat();
    let size = size_of(o);
    if o.test == Test::AtomicBw && size != 8 {
        return Err(format!("--size {size}: atomic_bw's messages are 8 bytes"));
    }
    if size == 0 || size > 1 << 31 {
        return Err(format!("--size {size}: must be 1..=2147483648"));
    }
    if lat && o.qp_depth.is_some() {
        return Err(
            "--qp-depth is for bandwidth tests (a latency test has one message in flight)".into(),
        );
    }
    if lat && o.tx_depth.is_some() {
        return Err(
            "--tx-depth is for bandwidth tests (a latency test has one message in flight)".into(),
        );
    }
    if o.fabric && o.port.is_some() {
        return Err("--port is for the links (udp, shm, auto): the fabric has no ports".into());
    }
    if lat && o.qps != 1 {
        return Err("latency tests use one QP".into());
    }
    if o.wait_send && !matches!(o.test, Test::SendLat | Test::WriteLat) {
        return Err(
            "--wait-send is for send_lat and write_lat (a READ's completion is its answer)".into(),
        );
    }
    if o.one_thread && !matches!(o.test, Test::SendLat | Test::WriteLat) {
        return Err("--one-thread is for send_lat and write_lat (ping-pongs)".into());
    }
    if o.events && o.test != Test::SendLat {
        // An RDMA WRITE or READ completes nothing at the side that waits for it.
        return Err("--events is for send_lat (the answer is a receive completion)".into());
    }
    if lat && o.fabric {
        return Err(
            "latency tests run on a link (udp, shm or auto), not on the fabric: its time is virtual"
                .into(),
        );
    }
    if o.two_processes && lat {
        return Err("--two-processes is for bandwidth tests".into());
    }
    if o.two_processes && o.verify {
        return Err(
            "--verify compares both buffers in this process; --two-processes puts the server's in another"
                .into(),
        );
    }
    check_queues(o)?;
    let (buf_len, _) = buffer(size, o.qps)?;
    check_memory(
        &format!("--size {size} with --qps {}", o.qps),
        buf_len.saturating_mul(2),
    )
}

/// `--qps` and `--tx-depth` against the limits the bench's devices are opened with:
/// each QP holds its share of the depth as send WRs and twice that as receive WRs.
pub(super) fn check_queues(o: &BenchOpts) -> Result<(), String> {
    let l = EmuConfig::default().limits;
    if o.qps > l.max_qp {
        return Err(format!(
            "--qps {}: the device has at most {} QPs",
            o.qps, l.max_qp
        ));
    }
    let per_qp = u64::from(o.per_qp());
    if per_qp * 2 > u64::from(l.max_qp_wr) {
        return Err(format!(
            "--tx-depth {} with --qps {}: {per_qp} WRs per QP (and twice that in receives), over the device's max_qp_wr ({})",
            o.depth(),
            o.qps,
            l.max_qp_wr
        ));
    }
    Ok(())
}

/// Runs `rdma-emu bench`.
pub(crate) fn run(mut o: BenchOpts) -> Result<(), String> {
    if o.serve_stdio {
        return child::serve_stdio(&o);
    }
    check(&o)?;
    if o.test == Test::Flood {
        return super::flood::run(&o);
    }
    let lat = o.test.is_lat();
    let size = size_of(&o);
    let iters = o.iters.unwrap_or(if lat {
        10_000
    } else {
        ((4u64 << 30) / size / u64::from(o.qps)).clamp(1, 20_000)
    });
    o.size = Some(size);
    let procs = if o.two_processes {
        "two processes"
    } else {
        "one process"
    };
    let transport = if o.fabric {
        "in-memory fabric (emu_sims::Fabric)".to_string()
    } else if o.link == LinkKind::Shm {
        format!("shared-memory rings (127.0.0.1 <-> 127.0.0.2, {procs})")
    } else if o.link == LinkKind::Auto {
        format!("automatic: shared-memory rings to a peer that offers them, else UDP (127.0.0.1 <-> 127.0.0.2, {procs})")
    } else {
        format!("UDP loopback (127.0.0.1 <-> 127.0.0.2, {procs})")
    };
    println!("{}", line());
    println!("                    {}", o.test.title());
    println!(" Transport       : {transport}");
    println!(" Number of qps   : {:<10} Connection type : RC", o.qps);
    println!(
        " Mtu             : {}[B]      Busy poll       : {}",
        o.mtu,
        if o.busy_poll { "ON" } else { "OFF" }
    );
    if lat {
        println!(
            " Completions     : {}",
            match (o.events, o.wait_send, o.one_thread) {
                (_, _, true) => "polled, both sides in one thread in turn (no baseline)",
                (true, false, _) => "events (req_notify_cq, get_cq_event)",
                (true, true, _) => "events (req_notify_cq, get_cq_event), each send's awaited",
                (false, false, _) => "polled",
                (false, true, _) => "polled, each send's awaited before the answer",
            }
        );
    } else {
        println!(" TX depth        : {}", o.depth());
        if let Some(q) = o.qp_depth {
            println!(" QP depth        : {q}");
        }
    }
    println!(" ICRC            : computed on send, checked on receive");
    print_build();
    println!("{}", line());
    let rss_before = rss_kib();
    let (send_wr, recv_wr) = if lat { LAT_WRS } else { o.bw_wrs() };
    let st = setup(&o, size, o.qps, send_wr, recv_wr)?;
    let rss_setup = rss_kib();
    if o.verify {
        verify_fill(&o, &st)?;
    }
    let mut json = format!(
        "{{\"test\":\"{}\",\"transport\":\"{}\",\"size\":{},\"iters\":{},\"qps\":{},\"mtu\":{},\"busy_poll\":{},\"events\":{},\"wait_send\":{},\"one_thread\":{},\"processes\":{},\"debug_build\":{}",
        o.test.name(),
        if o.fabric { "fabric" } else { o.link.name() },
        size,
        iters,
        o.qps,
        o.mtu,
        o.busy_poll,
        o.events,
        o.wait_send,
        o.one_thread,
        if o.two_processes { 2 } else { 1 },
        cfg!(debug_assertions)
    );
    if lat {
        lat::rounds(&o, st, size, iters, &mut json)?;
    } else {
        bw::rounds(&o, st, size, iters, [rss_before, rss_setup], &mut json)?;
    }
    println!("{}", line());
    if o.json {
        println!("{json}}}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ack_timeout;

    /// IBTA 9.7.6.1.3: 4.096 us * 2^timeout, at least 268 ms and 25 us per WR in
    /// flight.
    #[test]
    fn the_ack_timeout_covers_every_wr_in_flight_at_25_us() {
        let ns = |t: u8| 4096u64 << t;
        assert_eq!(ack_timeout(128), 16);
        for depth in [128, 10_738, 10_739, 64_000, 80_000, 800_000, u32::MAX] {
            let t = ack_timeout(depth);
            let want = (u64::from(depth) * 25_000).max(268_000_000);
            assert!(ns(t) >= want || t == 30, "{depth}: {t}");
            assert!(t == 16 || ns(t - 1) < want, "{depth}: {t} is not the least");
        }
        assert_eq!(ack_timeout(64_000), 19);
    }
}
