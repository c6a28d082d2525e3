//! The chaos soak: several RC pairs, a UC stream and a UD stream between three
//! emulated devices over UDP on 127.0.x.1-3, with seeded loss, duplication and
//! reordering on every device's link ([`RuleHook`]), a thread sending junk datagrams
//! to every device, and one device (the third) closed and opened again on the same
//! address halfway through. It checks every byte of every RC transfer against a shadow
//! of the responder's memory, every byte of every UC/UD message delivered, that every
//! completion is a success or a clean error (retries exhausted, or a flush: see
//! [`flows`]), that no work request waits longer than a bound (a hang), that the
//! restarted device's peers see their QPs fail and connect anew, and that each device
//! counted the junk it was sent under the right counter.
//!
//! The faults are a function of the seed and each packet's identity ([`faults`]), and
//! the traffic a function of the seed, so a run replays on the simulated [`Fabric`]
//! (virtual time, one thread, deterministic): [`SoakArgs::fabric`], with the number of
//! batches the UDP run made and when it restarted the device. The UDP run's summary
//! prints that command. (The junk is UDP's alone: the fabric carries what devices
//! send.)
//!
//! Run it with `cargo run --release -p emu-sims --example chaos_soak -- --secs 60`.

pub mod faults;
pub mod flows;
pub mod junk;

use std::fmt;
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_core::nic::interop::LinkOptions;
use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::{Device, QpType};

use crate::{Fabric, LinkConfig, RuleHook};
use faults::{FaultCounts, FaultRates};
use flows::{Ctx, DgFlow, FlowStats, RcFlow};
use junk::{Junk, JunkCounts, KINDS, LUCKY};

/// The soak's options (also the command line of the `chaos_soak` example).
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct SoakArgs {
    /// The seed of the traffic, the faults and the junk (random if not given; always
    /// printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// UDP: how long to run, in seconds (the restart comes halfway).
    #[arg(long, default_value_t = 60.0)]
    pub secs: f64,
    /// RC QP pairs (at least 3: A<->B both ways and each of A and B to the device that
    /// restarts).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(3..=64))]
    pub pairs: u32,
    /// Probability that a packet is lost.
    #[arg(long, default_value_t = 0.01)]
    pub loss: f64,
    /// Probability that a packet is duplicated.
    #[arg(long, default_value_t = 0.01)]
    pub dup: f64,
    /// Probability that a packet is held back 0.2-3 ms (reordered).
    #[arg(long, default_value_t = 0.02)]
    pub reorder: f64,
    /// UDP: junk datagrams per second sent to each device (0: none).
    #[arg(long, default_value_t = 1000)]
    pub junk: u32,
    /// Do not restart the third device.
    #[arg(long)]
    pub no_restart: bool,
    /// UDP: the devices are 127.0.NET.1-3, the junk comes from 127.0.NET.9.
    #[arg(long, default_value_t = 60)]
    pub net: u8,
    /// UDP: the port every device uses (0: a free one).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Fail when an RC connection is lost while no peer restarted (retries exhausted
    /// on a path that only loses, duplicates and delays a few percent).
    #[arg(long)]
    pub strict: bool,
    /// Run on the simulated fabric (virtual time, deterministic) instead of UDP: the
    /// replay of a UDP run.
    #[arg(long)]
    pub fabric: bool,
    /// Fabric: RC batches to run (all pairs together; the UC and UD streams run
    /// alongside).
    #[arg(long, default_value_t = 3000)]
    pub ops: u64,
    /// Fabric: restart the third device after this many RC batches (default: half of
    /// `--ops`).
    #[arg(long)]
    pub restart_at: Option<u64>,
}

impl Default for SoakArgs {
    fn default() -> Self {
        SoakArgs {
            seed: None,
            secs: 60.0,
            pairs: 6,
            loss: 0.01,
            dup: 0.01,
            reorder: 0.02,
            junk: 1000,
            no_restart: false,
            net: 60,
            port: 0,
            strict: false,
            fabric: false,
            ops: 3000,
            restart_at: None,
        }
    }
}

/// A device's junk accounting at the end of a UDP run.
#[derive(Clone, Debug)]
pub struct JunkReport {
    /// The device's address.
    pub ip: Ipv4Addr,
    /// What the junk thread sent to the device's current instance, by kind.
    pub sent: JunkCounts,
    /// The device's `icrc_errors`.
    pub icrc_errors: u64,
    /// Its engine's `rx_malformed`.
    pub malformed: u64,
    /// Its engine's `rx_unknown_qp`.
    pub unknown_qp: u64,
    /// Its engine's `out_of_sequence + duplicate_requests`.
    pub psn_errors: u64,
    /// Datagrams the kernel dropped at its socket, if known.
    pub kernel_drops: Option<u64>,
}

/// What a soak did and found.
#[derive(Clone, Debug)]
pub struct SoakReport {
    /// The options it ran with, the seed filled in.
    pub args: SoakArgs,
    /// Wall time (UDP) or virtual time (fabric).
    pub elapsed: Duration,
    /// What the flows counted.
    pub stats: FlowStats,
    /// RC batches done when the device restarted (None: no restart).
    pub restarted_after: Option<u64>,
    /// Packets the fault schedule saw, dropped, duplicated, delayed.
    pub faults: [u64; 4],
    /// UDP: junk accounting per device.
    pub junk: Vec<JunkReport>,
    /// UDP: milliseconds the restarted device's reopen waited for its address, which
    /// the closed device's delayed packets kept bound (EADDRINUSE).
    pub reopen_waits: u32,
    /// Every problem found; empty when the soak passed.
    pub failures: Vec<String>,
}

impl SoakReport {
    /// Whether the soak passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The command that replays this run on the fabric.
    pub fn replay_command(&self) -> String {
        let a = &self.args;
        let mut c = format!(
            "cargo run --release -p emu-sims --example chaos_soak -- --fabric --seed {} --pairs {} --loss {} --dup {} --reorder {} --ops {}",
            a.seed.unwrap_or(0),
            a.pairs,
            a.loss,
            a.dup,
            a.reorder,
            self.stats.batches.max(1)
        );
        match self.restarted_after {
            Some(n) => c.push_str(&format!(" --restart-at {n}")),
            None => c.push_str(" --no-restart"),
        }
        if a.strict {
            c.push_str(" --strict");
        }
        c
    }
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.args;
        let s = &self.stats;
        let net = if a.fabric {
            "the simulated fabric".to_owned()
        } else {
            format!("UDP on 127.0.{}.1-3", a.net)
        };
        writeln!(
            f,
            "chaos soak: seed {}, {net}, {:.1} s, {} RC pairs + UC + UD",
            a.seed.unwrap_or(0),
            self.elapsed.as_secs_f64(),
            a.pairs
        )?;
        let [seen, dropped, duplicated, delayed] = self.faults;
        writeln!(
            f,
            "  faults: {seen} packets, {dropped} dropped, {duplicated} duplicated, {delayed} reordered (loss {}, dup {}, reorder {})",
            a.loss, a.dup, a.reorder
        )?;
        writeln!(
            f,
            "  {} RC batches, {} RC work requests checked, {:.1} MiB checked byte for byte",
            s.batches,
            s.ops,
            s.bytes as f64 / (1 << 20) as f64
        )?;
        let statuses: Vec<String> = s
            .statuses
            .iter()
            .map(|(k, n)| format!("{k:?} {n}"))
            .collect();
        writeln!(f, "  completions: {}", statuses.join(", "))?;
        match self.restarted_after {
            Some(n) => writeln!(
                f,
                "  restart of the third device after {n} RC batches: {} survivor QPs ended in clean errors (the last {:.0} ms after), and connected anew",
                s.restart_failures,
                s.restart_detect.as_secs_f64() * 1e3
            )?,
            None => writeln!(f, "  no restart")?,
        }
        if self.reopen_waits > 0 {
            writeln!(
                f,
                "  the reopen waited {} ms for the address: the closed device's delayed packets held its socket",
                self.reopen_waits
            )?;
        }
        writeln!(
            f,
            "  RC connections lost with no restart: {}",
            s.lost_connections
        )?;
        writeln!(
            f,
            "  UC + UD: {} messages sent, {} delivered and checked ({} again: duplicated or delayed)",
            s.dg_sent, s.dg_delivered, s.dg_duplicates
        )?;
        for j in &self.junk {
            let sent: Vec<String> = KINDS
                .iter()
                .zip(j.sent)
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            writeln!(
                f,
                "  junk to {}: {} ({} of the random and bad-icrc pass their ICRC by chance); counted: icrc_errors {}, rx_malformed {}, rx_unknown_qp {}, out-of-sequence/duplicate {}, kernel drops {}",
                j.ip,
                sent.join(", "),
                j.sent[LUCKY],
                j.icrc_errors,
                j.malformed,
                j.unknown_qp,
                j.psn_errors,
                j.kernel_drops.map_or("unknown".into(), |n| n.to_string())
            )?;
        }
        if self.passed() {
            writeln!(f, "PASS (seed {})", a.seed.unwrap_or(0))
        } else {
            for x in &self.failures {
                writeln!(f, "FAILURE: {x}")?;
            }
            writeln!(f, "FAIL (seed {})", a.seed.unwrap_or(0))?;
            if a.fabric {
                writeln!(
                    f,
                    "replay: the same command (the fabric run is deterministic)"
                )
            } else {
                writeln!(f, "replay on the fabric: {}", self.replay_command())
            }
        }
    }
}

/// The three devices: where they are and how they are opened.
struct Net {
    ips: Vec<Ipv4Addr>,
    devs: Vec<Option<Arc<EmuDevice>>>,
    fabric: Option<Fabric>,
    port: u16,
    start: Instant,
    seed: u64,
    rates: FaultRates,
    counts: Arc<FaultCounts>,
    /// UDP: each device's hook, kept across a restart (as the fabric keeps its rules).
    hooks: Vec<Option<Arc<RuleHook>>>,
    /// UDP: reopens that found the address still bound (EADDRINUSE) and waited 1 ms.
    reopen_waits: u32,
}

impl Net {
    fn now(&self) -> Duration {
        match &self.fabric {
            Some(f) => f.now(),
            None => self.start.elapsed(),
        }
    }

    /// Nothing to do: let time pass. False if nothing will ever happen again.
    fn idle(&self) -> bool {
        match &self.fabric {
            Some(f) => f.step(),
            None => {
                std::thread::sleep(Duration::from_micros(100));
                true
            }
        }
    }

    fn cfg(&self, d: usize) -> EmuConfig {
        EmuConfig {
            // The rules name devices by their address (as RuleHook does).
            name: self.ips[d].to_string(),
            ip: self.ips[d].into(),
            port: self.port,
            ..EmuConfig::default()
        }
    }

    fn open(&mut self, d: usize, again: bool) -> Result<(), String> {
        let mut cfg = self.cfg(d);
        let me = self.ips[d].to_string();
        let rule = || faults::rule(self.seed, &me, self.rates, self.counts.clone());
        let dev = match &self.fabric {
            Some(f) if again => f.replace_device(cfg),
            Some(f) => {
                f.add_rule(rule());
                f.add_device_with(cfg)
            }
            None => {
                let ip = self.ips[d];
                let hook = self.hooks[d]
                    .get_or_insert_with(|| Arc::new(RuleHook::new(ip, vec![rule()])))
                    .clone();
                cfg.link = LinkOptions {
                    hook: Some(hook),
                    ..LinkOptions::default()
                };
                // A packet the hook delayed leaves from a thread holding a copy of the
                // closed device's socket, which keeps its address bound until then
                // (at most the longest delay, 3 ms): a reopen waits for it.
                let t0 = Instant::now();
                loop {
                    match EmuDevice::open(cfg.clone()) {
                        Err(verbs_api::Error::AddressInUse(_))
                            if again && t0.elapsed() < Duration::from_secs(2) =>
                        {
                            self.reopen_waits += 1;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        r => break r.map(Arc::new),
                    }
                }
            }
        }
        .map_err(|e| format!("opening {}: {e}", self.ips[d]))?;
        if again {
            // A new process's QPNs differ from the last one's (UDP devices start at a
            // random QPN; a fabric device at a fixed one, so skip some), so packets
            // still on the way to the old QPs are not taken for the new ones'.
            for _ in 0..256 {
                let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
                let cq = dev.create_cq(1, None).map_err(|e| e.to_string())?;
                let init =
                    verbs_api::QpInitAttr::new(pd, cq, QpType::Rc, verbs_api::QpCap::default());
                let qpn = dev.create_qp(&init).map_err(|e| e.to_string())?;
                let _ = dev.destroy_qp(qpn);
                let _ = dev.destroy_cq(cq);
                let _ = dev.dealloc_pd(pd);
                if self.fabric.is_none() {
                    break;
                }
            }
        }
        self.devs[d] = Some(dev);
        Ok(())
    }
}

/// A free UDP port on `ip`.
fn free_port(ip: Ipv4Addr) -> std::io::Result<u16> {
    Ok(UdpSocket::bind((ip, 0))?.local_addr()?.port())
}

/// Runs a soak; never panics on what it finds (a panic inside the emulator is caught
/// and reported as a failure).
pub fn run(args: &SoakArgs) -> SoakReport {
    let mut args = args.clone();
    let seed = *args.seed.get_or_insert_with(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        faults::mix(t ^ u64::from(std::process::id())) % 1_000_000_000
    });
    let empty = |args: &SoakArgs, failure: String| SoakReport {
        args: args.clone(),
        elapsed: Duration::ZERO,
        stats: FlowStats::default(),
        restarted_after: None,
        faults: [0; 4],
        junk: Vec::new(),
        reopen_waits: 0,
        failures: vec![failure],
    };
    let a2 = args.clone();
    match std::panic::catch_unwind(move || soak(&a2, seed)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => empty(&args, e),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            empty(&args, format!("panicked: {msg}"))
        }
    }
}

fn soak(args: &SoakArgs, seed: u64) -> Result<SoakReport, String> {
    let ips: Vec<Ipv4Addr> = (1..=3)
        .map(|h| Ipv4Addr::new(127, 0, args.net, h))
        .collect();
    let rates = FaultRates {
        loss: args.loss,
        duplicate: args.dup,
        reorder: args.reorder,
    };
    for (name, p) in [
        ("--loss", rates.loss),
        ("--dup", rates.duplicate),
        ("--reorder", rates.reorder),
    ] {
        if !(0.0..=0.5).contains(&p) {
            return Err(format!("{name} {p}: a probability from 0 to 0.5"));
        }
    }
    let secs_ok = args.secs > 0.0 && args.secs <= 86_400.0;
    if !args.fabric && !secs_ok {
        return Err(format!("--secs {}: from more than 0 to 86400", args.secs));
    }
    if args.fabric && args.ops == 0 {
        return Err("--ops 0: nothing to run".into());
    }
    let fabric = args.fabric.then(|| {
        let f = Fabric::new(seed);
        f.set_trace_mode(crate::TraceMode::Off);
        f.set_default_link(LinkConfig {
            latency: Duration::from_micros(10),
            ..LinkConfig::default()
        });
        f
    });
    let port = match (&fabric, args.port) {
        (Some(_), _) => emu_core::nic::ROCE_PORT,
        (None, 0) => free_port(ips[0]).map_err(|e| format!("no free port on {}: {e}", ips[0]))?,
        (None, p) => p,
    };
    let mut net = Net {
        ips: ips.clone(),
        devs: vec![None, None, None],
        fabric,
        port,
        start: Instant::now(),
        seed,
        rates,
        counts: Arc::new(FaultCounts::default()),
        hooks: vec![None, None, None],
        reopen_waits: 0,
    };
    for d in 0..3 {
        net.open(d, false)?;
    }
    let junk = (!args.fabric && args.junk > 0).then(|| Junk::new(3));
    let junk_thread = match &junk {
        Some(j) => {
            for d in 0..3 {
                j.up(d);
            }
            let t = j
                .start(
                    seed ^ 0x6A75_6E6B,
                    args.junk,
                    ips.clone(),
                    Ipv4Addr::new(127, 0, args.net, 9),
                    port,
                )
                .map_err(|e| format!("junk sender: {e}"))?;
            Some(t)
        }
        None => None,
    };
    // RC pairs: A->B, B->A, A->C, B->C, ... (C, the third, restarts; it is never the
    // active side, so its survivors are the requesters and see their QPs fail).
    let layout = [(0, 1), (1, 0), (0, 2), (1, 2)];
    let mut rc: Vec<RcFlow> = (0..args.pairs as usize)
        .map(|i| {
            let (a, p) = layout[i % layout.len()];
            RcFlow::new(i, seed, a, p)
        })
        .collect();
    let mut dg = [
        DgFlow::new(seed ^ 0x5543, QpType::Uc, 0, 1),
        DgFlow::new(seed ^ 0x5544, QpType::Ud, 1, 0),
    ];
    let mut stats = FlowStats::default();
    let mut failures = Vec::new();
    let mut restarted_after = None;
    let hang = Duration::from_secs(if args.fabric { 30 } else { 60 });
    let udp_end = Duration::from_secs_f64(args.secs);
    let restart_at = args.restart_at.unwrap_or(args.ops / 2);
    let mut draining = false;
    let mut drain_since = Duration::ZERO;
    let mut last_progress_print = Instant::now();
    let mut quiet = false;
    loop {
        let now = net.now();
        // Restart the third device: halfway (UDP), or after `restart_at` batches.
        let due = if args.fabric {
            stats.batches >= restart_at
        } else {
            now >= udp_end / 2
        };
        if !args.no_restart && restarted_after.is_none() && due && !draining {
            restarted_after = Some(stats.batches);
            if let Some(j) = &junk {
                j.down(2);
            }
            net.devs[2] = None;
            for f in &mut rc {
                f.closed(2, now);
            }
            if let Err(e) = net.open(2, true) {
                failures.push(format!("restart: {e}"));
                break;
            }
            if let Some(j) = &junk {
                j.up(2);
            }
        }
        if !draining {
            let end = if args.fabric {
                stats.batches >= args.ops
            } else {
                now >= udp_end
            };
            if end {
                draining = true;
                drain_since = now;
            }
        }
        let mut progress = false;
        let mut cx = Ctx {
            devs: &net.devs,
            ips: &net.ips,
            now,
            draining,
            junk: junk.as_deref(),
            stats: &mut stats,
            hang,
        };
        let mut result = Ok(());
        for f in &mut rc {
            match f.step(&mut cx) {
                Ok(p) => progress |= p,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if result.is_ok() {
            for f in &mut dg {
                match f.step(&mut cx) {
                    Ok(p) => progress |= p,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        if let Err(e) = result {
            failures.push(e);
            break;
        }
        if draining {
            let busy = rc.iter().any(RcFlow::busy) || dg.iter().any(DgFlow::busy);
            if !busy {
                break;
            }
            if now.saturating_sub(drain_since) > hang {
                failures.push(format!(
                    "work still outstanding {hang:?} after the end (hang)"
                ));
                break;
            }
        }
        // On the fabric an empty poll steps the fabric, which can complete work of a
        // flow that already looked in this round: a hang is a whole round that finds
        // nothing, after one in which the fabric had nothing left to do.
        if !progress && !net.idle() {
            if quiet {
                failures.push(
                    "the fabric has nothing left to do while work is outstanding (hang)".into(),
                );
                break;
            }
            quiet = true;
        } else {
            quiet = false;
        }
        if net.fabric.is_none() && last_progress_print.elapsed() >= Duration::from_secs(10) {
            last_progress_print = Instant::now();
            eprintln!(
                "chaos soak: {:.0} s, {} batches, {:.1} MiB checked",
                now.as_secs_f64(),
                stats.batches,
                stats.bytes as f64 / (1 << 20) as f64
            );
        }
    }
    let elapsed = net.now();
    if args.strict && stats.lost_connections > 0 {
        failures.push(format!(
            "{} RC connections lost with no peer restarting (--strict)",
            stats.lost_connections
        ));
    }
    if restarted_after.is_some() && failures.is_empty() {
        let survivors = rc.iter().filter(|f| f.devices().1 == 2).count() as u64;
        if stats.restart_failures < survivors {
            failures.push(format!(
                "{} of {survivors} RC QPs whose peer restarted ended in an error completion",
                stats.restart_failures
            ));
        }
    }
    // The junk's accounting: stop it, let the devices take what is queued, compare.
    let mut junk_reports = Vec::new();
    if let (Some(j), Some(t)) = (&junk, junk_thread) {
        j.stop();
        let _ = t.join();
        // The device threads take the socket back after a few naps without a poll.
        std::thread::sleep(Duration::from_millis(300));
        for (d, dev) in net.devs.iter().enumerate() {
            let Some(dev) = dev else { continue };
            let sent = j.sent(d);
            let icrc = dev
                .link_counters()
                .icrc_errors
                .load(std::sync::atomic::Ordering::Relaxed);
            let c = dev.counters();
            let drops = junk::kernel_drops(net.ips[d], port);
            for problem in junk::check_counts(&sent, icrc, &c, drops) {
                failures.push(format!("junk to {}: {problem}", net.ips[d]));
            }
            junk_reports.push(JunkReport {
                ip: net.ips[d],
                sent,
                icrc_errors: icrc,
                malformed: c.rx_malformed,
                unknown_qp: c.rx_unknown_qp,
                psn_errors: c.out_of_sequence + c.duplicate_requests,
                kernel_drops: drops,
            });
        }
    }
    let c = &net.counts;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let mut report_args = args.clone();
    report_args.seed = Some(seed);
    report_args.port = port;
    Ok(SoakReport {
        args: report_args,
        elapsed,
        stats,
        restarted_after,
        faults: [
            load(&c.seen),
            load(&c.dropped),
            load(&c.duplicated),
            load(&c.delayed),
        ],
        junk: junk_reports,
        reopen_waits: net.reopen_waits,
        failures,
    })
}
