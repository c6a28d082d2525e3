//! The bandwidth tests of `rdma-emu bench` (write_bw, send_bw, read_bw, atomic_bw):
//! `--tx-depth` work requests in flight over `--qps` QPs, each round followed by the
//! one-QP run (with several QPs) and the baselines it is compared with.

use super::*;

/// Runs `o.rounds` rounds of `o`'s bandwidth test on `st` (the first round's devices)
/// and fresh devices after it, prints them and the median round with its one-QP run,
/// memory and baselines, and adds their fields to `json`. `rss` is the process's RSS
/// before and after the first set-up (KiB), for the memory a QP takes.
pub(super) fn rounds(
    o: &BenchOpts,
    st: Setup,
    size: u64,
    iters: u64,
    rss: [Option<u64>; 2],
    json: &mut String,
) -> Result<(), String> {
    let (send_wr, recv_wr) = o.bw_wrs();
    // A QP never has more than its share of the depth to post at once.
    let post_list = o.per_qp() as usize;
    let mut first = Some(st);
    let mut rounds: Vec<Round> = Vec::new();
    let mut peak = None;
    for _ in 0..o.rounds {
        let st = round_setup(o, size, send_wr, recv_wr, &mut first)?;
        let many = run_bw(o, &st, size, iters, post_list)?;
        report_losses(&st);
        if o.verify {
            verify_check(o, &st, size, many.msgs)?;
        }
        // The process's high-water mark after the first run, before any
        // baseline's buffers (memcpy's are 128 MiB) could raise it.
        if rounds.is_empty() {
            peak = peak_rss_kib();
        }
        drop(st);
        let one = one_qp_run(o, size, many.msgs, post_list)?;
        // The baselines right after the round, so that a round's ratio compares
        // runs a second apart, not minutes.
        let base = baselines(o, size)?;
        rounds.push(Round { many, one, base });
    }
    // The median round: by the ratio to one QP, else to the target's baseline
    // (memcpy, or GSO+GRO on UDP), else by bandwidth.
    let keys: Vec<f64> = rounds.iter().map(|r| r.key()).collect();
    let median = median_of(&keys);
    if rounds.len() > 1 {
        print_rounds(&rounds, median);
        println!("{}", line());
        *json += &rounds_json(&keys);
    }
    report(o, size, &rounds[median], peak, rss, json);
    Ok(())
}

/// With several QPs, the same test on one QP with the same total messages (`msgs`),
/// for the message-rate ratio; and the same work per message: WRs posted in lists no
/// longer than the many-QP run's (one WR per call when each QP has one in flight), or
/// the single QP would pay one verb call for up to `depth` messages.
fn one_qp_run(
    o: &BenchOpts,
    size: u64,
    msgs: u64,
    post_list: usize,
) -> Result<Option<BwResult>, String> {
    Ok(if o.qps > 1 {
        let depth = o.depth().min(4096);
        let st1 = setup(o, size, 1, depth, depth * 2)?;
        let mut o1 = o.clone();
        o1.qps = 1;
        o1.tx_depth = Some(depth);
        o1.qp_depth = None;
        Some(run_bw(&o1, &st1, size, msgs, post_list)?)
    } else {
        None
    })
}

/// A round's baselines (none with `--no-baseline`): memcpy on the fabric and the
/// shared-memory link (alone or chosen by `auto`), raw UDP otherwise.
fn baselines(o: &BenchOpts, size: u64) -> Result<Option<Baselines>, String> {
    Ok(if o.no_baseline {
        None
    } else if o.fabric || o.link != LinkKind::Udp {
        Some(Baselines::Memcpy(baseline::memcpy(size as usize)?))
    } else {
        let d = datagram(size, o.mtu);
        Some(Baselines::Udp {
            plain: baseline::plain_udp(d).map_err(|e| format!("baseline: {e}"))?,
            gso: baseline::gso_gro_udp(d).map_err(|e| format!("baseline: {e}"))?,
        })
    })
}

/// Prints one line per round, marking the median one.
fn print_rounds(rounds: &[Round], median: usize) {
    for (i, r) in rounds.iter().enumerate() {
        let mark = if i == median { " (median, below)" } else { "" };
        match &r.one {
            Some(one) => println!(
                " round {}: {:.6} Mpps, one QP {:.6} Mpps: {:.2}x{mark}",
                i + 1,
                r.many.mpps(),
                one.mpps(),
                r.key()
            ),
            None => match &r.base {
                Some(Baselines::Udp { plain, gso }) => println!(
                    " round {}: {:.2} MB/sec, GSO+GRO {gso:.2} MB/sec: {:.2}x (plain UDP {plain:.2} MB/sec: {:.2}x){mark}",
                    i + 1,
                    r.many.mbps(),
                    r.key(),
                    r.many.mbps() / plain
                ),
                Some(b) => println!(
                    " round {}: {:.2} MB/sec, baseline {:.2} MB/sec: {:.2}x{mark}",
                    i + 1,
                    r.many.mbps(),
                    b.target(),
                    r.key()
                ),
                None => println!(
                    " round {}: {:.2} MB/sec, {:.6} Mpps{mark}",
                    i + 1,
                    r.many.mbps(),
                    r.many.mpps()
                ),
            },
        }
    }
}

/// Prints the median round `round`: its figures, the one-QP comparison and memory
/// with several QPs (`peak` RSS after the first run, `rss` before and after the first
/// set-up), and its baselines; adds their fields to `json`.
fn report(
    o: &BenchOpts,
    size: u64,
    round: &Round,
    peak: Option<u64>,
    rss: [Option<u64>; 2],
    json: &mut String,
) {
    let [rss_before, rss_setup] = rss;
    let Round { many: r, one, base } = round;
    let avg = r.mbps();
    let mpps = r.mpps();
    println!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
    println!(
        " {:<10} {:<14} {:<18.2} {:<20.2} {:.6}",
        size, r.msgs, r.peak_mbps, avg, mpps
    );
    println!(
        " packets per message (both directions, ACKs included): {:.3}",
        r.packets_per_msg()
    );
    *json += &format!(
            ",\"bw_peak_mbps\":{},\"bw_avg_mbps\":{},\"msg_rate_mpps\":{},\"secs\":{},\"packets_per_msg\":{}",
            json_num(r.peak_mbps),
            json_num(avg),
            json_num(mpps),
            json_num(r.secs),
            json_num(r.packets_per_msg())
        );
    if o.verify {
        println!(" verify: the target matches the source byte for byte");
    }
    if let Some(r1) = one {
        // Both ends grow this process, or only the client's with the server in its
        // own.
        let ends = if o.two_processes { 1.0 } else { 2.0 };
        let per_qp_kib = match (rss_before, rss_setup) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / f64::from(o.qps) / ends),
            _ => None,
        };
        let mpps1 = r1.mpps();
        // The packet rates tell the device's cost per QP apart from the protocol's:
        // with one message in flight per QP each message needs its own ACK.
        let pps = r.packets as f64 / r.secs / 1e6;
        let pps1 = r1.packets as f64 / r1.secs / 1e6;
        println!("{}", line());
        println!(
            " one QP, same messages: {mpps1:.6} Mpps; {} QPs / one QP: {:.2}x",
            o.qps,
            mpps / mpps1
        );
        println!(
                " packets per message: {:.3} with {} QPs, {:.3} with one; packet rate {pps:.3} against {pps1:.3} M/s: {:.2}x",
                r.packets_per_msg(),
                o.qps,
                r1.packets_per_msg(),
                pps / pps1
            );
        if let Some(p) = peak {
            println!(" peak RSS: {:.1} MiB", p as f64 / 1024.0);
        }
        if let Some(k) = per_qp_kib {
            println!(
                " memory per connected RC QP (RSS growth of setup / QPs, {}): {k:.2} KiB",
                if o.two_processes {
                    "the client's end"
                } else {
                    "both ends"
                }
            );
        }
        *json += &format!(
                ",\"one_qp_mpps\":{},\"ratio_one_qp\":{},\"one_qp_packets_per_msg\":{},\"ratio_one_qp_packets\":{},\"peak_rss_kib\":{},\"kib_per_qp\":{}",
                json_num(mpps1),
                json_num(mpps / mpps1),
                json_num(r1.packets_per_msg()),
                json_num(pps / pps1),
                peak.map_or("null".into(), |p| p.to_string()),
                per_qp_kib.map_or("null".into(), json_num)
            );
    }
    match *base {
        None => {}
        Some(Baselines::Memcpy(m)) => {
            println!("{}", line());
            println!(" baseline: memcpy of {size}-byte blocks: {m:.2} MB/sec");
            println!(" ratio: {:.2}x", avg / m);
            *json += &format!(
                ",\"baseline\":\"memcpy\",\"baseline_mbps\":{},\"ratio\":{}",
                json_num(m),
                json_num(avg / m)
            );
        }
        Some(Baselines::Udp { plain, gso }) => {
            let d = datagram(size, o.mtu);
            println!("{}", line());
            println!(" baseline: raw UDP, {d}-byte datagrams, one per syscall: {plain:.2} MB/sec");
            println!(" baseline: raw UDP with GSO and GRO, {d}-byte segments: {gso:.2} MB/sec");
            println!(
                " ratio: {:.2}x plain, {:.2}x GSO+GRO",
                avg / plain,
                avg / gso
            );
            *json += &format!(
                    ",\"baseline\":\"udp_plain\",\"baseline_mbps\":{},\"ratio\":{},\"baseline_gso_gro_mbps\":{},\"ratio_gso_gro\":{}",
                    json_num(plain),
                    json_num(avg / plain),
                    json_num(gso),
                    json_num(avg / gso)
                );
        }
    }
    if let Some(p) = peak_rss_kib() {
        if o.qps == 1 {
            *json += &format!(",\"peak_rss_kib\":{p}");
        }
    }
}

/// One bandwidth run of `o`'s test on fresh devices, its data checked if `o.verify`:
/// MB/s.
pub(in crate::cli) fn measure_bw(o: &BenchOpts, iters: u64) -> Result<f64, String> {
    let size = o.size.unwrap_or(65536);
    let depth = o.depth();
    let st = setup(o, size, 1, depth, depth * 2)?;
    if o.verify {
        verify_fill(o, &st)?;
    }
    let r = run_bw(o, &st, size, iters, depth as usize)?;
    if o.verify {
        verify_check(o, &st, size, r.msgs)?;
    }
    Ok(r.mbps())
}

/// One round of a bandwidth test: the run, with several QPs the one-QP run made
/// right after it, and the baselines measured right after those.
struct Round {
    many: BwResult,
    one: Option<BwResult>,
    base: Option<Baselines>,
}

/// A round's baselines: memcpy for the fabric, raw UDP (plain, GSO+GRO) otherwise;
/// MB/s.
#[derive(Clone, Copy)]
enum Baselines {
    Memcpy(f64),
    Udp { plain: f64, gso: f64 },
}

impl Baselines {
    /// The baseline that orders rounds: memcpy, or raw UDP with GSO and GRO, the
    /// baseline of the UDP bandwidth target (docs/performance.md), so that the
    /// reported round is the median by the ratio the target states.
    fn target(&self) -> f64 {
        match *self {
            Baselines::Memcpy(m) => m,
            Baselines::Udp { gso, .. } => gso,
        }
    }
}

impl Round {
    /// What orders rounds: the message-rate ratio to one QP, else the ratio to the
    /// target's baseline ([`Baselines::target`]), else the bandwidth.
    fn key(&self) -> f64 {
        match (&self.one, &self.base) {
            (Some(one), _) => self.many.mpps() / one.mpps(),
            (None, Some(b)) => self.many.mbps() / b.target(),
            (None, None) => self.many.mbps(),
        }
    }
}

/// What a bandwidth run measured.
struct BwResult {
    bytes: u64,
    msgs: u64,
    secs: f64,
    peak_mbps: f64,
    /// Packets both devices sent during the run (requests, responses and ACKs).
    packets: u64,
}

impl BwResult {
    fn mbps(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e6
    }

    fn mpps(&self) -> f64 {
        self.msgs as f64 / self.secs / 1e6
    }

    /// Packets on the wire per message, both directions: one per MTU of payload,
    /// plus the ACKs (IBTA 9.7.5.1: a responder coalesces them only within a QP).
    fn packets_per_msg(&self) -> f64 {
        self.packets as f64 / self.msgs.max(1) as f64
    }
}

/// Runs the server's side of a bandwidth test until `stop`: reposts receives for
/// send_bw, otherwise only keeps the device polled.
fn serve(
    s: &Host,
    test: Test,
    region: u64,
    size: u64,
    stop: &AtomicBool,
    fabric: bool,
    wcs: &mut Vec<WorkCompletion>,
) -> Result<(), String> {
    if test != Test::SendBw && !fabric {
        // As perftest's server: nothing to repost, so no polling; the device thread
        // receives and answers (a spinning poller would take the socket over and
        // compete with the client for the cores).
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
        return Ok(());
    }
    while !stop.load(Ordering::Relaxed) {
        let n = s.poll(wcs)?;
        if test == Test::SendBw {
            for wc in wcs.iter() {
                s.post_recvs(wc.wr_id as usize, 1, region, size)?;
            }
        }
        if fabric {
            return Ok(());
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// The server's side of a bandwidth run in a thread of its own until `stop`.
pub(super) fn spawn_serve(
    h: Host,
    test: Test,
    region: u64,
    size: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<(), String>> {
    std::thread::spawn(move || {
        serve(
            &h,
            test,
            region,
            size,
            &stop,
            false,
            &mut Vec::with_capacity(64),
        )
    })
}

/// One bandwidth run: `iters` messages per QP, at most `post_list` WRs per
/// `post_send` call (perftest's `--post_list`).
fn run_bw(
    o: &BenchOpts,
    st: &Setup,
    size: u64,
    iters: u64,
    post_list: usize,
) -> Result<BwResult, String> {
    let (c, s) = (&st.client, &st.server);
    let qps = c.qpns.len();
    let per_qp = o.per_qp() as usize;
    let total = iters * qps as u64;
    let recvs = (per_qp * 2) as u32;
    let stop = Arc::new(AtomicBool::new(false));
    let mut server = None;
    // The child's device's packets, counted by the child.
    let mut child_tx = 0;
    match s {
        Server::Here(h) => {
            h.prepare_run(o.test, recvs, st.region, size)?;
            if st.fabric.is_none() {
                server = Some(spawn_serve(
                    h.share(),
                    o.test,
                    st.region,
                    size,
                    stop.clone(),
                ));
            }
        }
        Server::Child(c) => child_tx = c.run(st.region, size, recvs)?,
    }
    let mut outstanding = vec![0usize; qps];
    let mut posted = vec![0u64; qps];
    // `--tx-depth` bounds the WRs in flight over all QPs: with more QPs than that, each
    // may have one in flight but not all at once.
    let (depth, mut in_flight) = (o.depth() as usize, 0usize);
    let (mut done, mut next_qp) = (0u64, 0usize);
    let mut wcs = Vec::with_capacity(64);
    let mut server_wcs = Vec::with_capacity(64);
    let never = AtomicBool::new(false);
    let mut wrs: Vec<SendWr> = Vec::with_capacity(per_qp);
    let mut progress = Progress::new(total, o.json);
    let samples = 32u64;
    let mut marks: Vec<(Instant, u64)> = Vec::with_capacity(samples as usize + 2);
    let sent = || {
        c.dev.counters().tx_packets
            + match s {
                Server::Here(h) => h.dev.counters().tx_packets,
                Server::Child(_) => 0,
            }
    };
    let smr = s.mr();
    let packets_before = sent();
    let start = Instant::now();
    marks.push((start, 0));
    let result = (|| -> Result<(), String> {
        while done < total {
            // Up to 64 post_send calls between two polls, whatever the number of
            // QPs: QPs round robin, each posted as many lists as it has room for.
            let mut calls = 0;
            for _ in 0..qps.min(64) {
                let q = next_qp;
                next_qp = (next_qp + 1) % qps;
                while calls < 64 {
                    let room = (per_qp - outstanding[q])
                        .min((iters - posted[q]) as usize)
                        .min(post_list)
                        .min(depth.saturating_sub(in_flight));
                    if room == 0 {
                        break;
                    }
                    calls += 1;
                    wrs.clear();
                    let off = c.offset(q, st.region);
                    let roff = s.offset(q, st.region);
                    for _ in 0..room {
                        let op = match o.test {
                            Test::SendBw => WrOperation::Send,
                            Test::WriteBw => WrOperation::RdmaWrite {
                                remote_addr: smr.addr + roff,
                                rkey: smr.rkey,
                            },
                            Test::ReadBw => WrOperation::RdmaRead {
                                remote_addr: smr.addr + roff,
                                rkey: smr.rkey,
                            },
                            _ => WrOperation::AtomicFetchAndAdd {
                                remote_addr: smr.addr,
                                rkey: smr.rkey,
                                add: 1,
                            },
                        };
                        let mut wr = SendWr::new(q as u64, vec![c.sge(off, size)], op);
                        wr.send_flags = SendFlags::SIGNALED;
                        wrs.push(wr);
                    }
                    c.dev
                        .post_send(c.qpns[q], &wrs)
                        .map_err(|e| format!("post_send: {e}"))?;
                    outstanding[q] += room;
                    in_flight += room;
                    posted[q] += room as u64;
                }
            }
            let n = c.poll(&mut wcs)?;
            for wc in &wcs {
                outstanding[wc.wr_id as usize] -= 1;
            }
            in_flight -= wcs.len();
            done += n as u64;
            if n > 0 && done * samples / total > (marks.len() as u64 - 1) {
                marks.push((Instant::now(), done));
                progress.set(done);
            }
            if let (Some(_), Server::Here(h)) = (&st.fabric, s) {
                // One buffer for the whole run (a fresh one per call showed in
                // profiles: a 6 KiB allocation each time).
                serve(h, o.test, st.region, size, &never, true, &mut server_wcs)?;
            } else if n == 0 && !o.busy_poll {
                std::thread::yield_now();
            }
        }
        Ok(())
    })();
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = server {
        h.join().map_err(|_| "server thread panicked")??;
    }
    if let Server::Child(c) = s {
        child_tx = c.stop()?.tx_packets - child_tx;
    }
    progress.finish();
    result?;
    marks.push((Instant::now(), done));
    let peak_mbps = marks
        .windows(2)
        .filter_map(|w| {
            let dt = w[1].0.duration_since(w[0].0).as_secs_f64();
            (dt > 0.0).then(|| (w[1].1 - w[0].1) as f64 * size as f64 / dt / 1e6)
        })
        .fold(0.0, f64::max);
    Ok(BwResult {
        bytes: total * size,
        msgs: total,
        secs,
        peak_mbps,
        packets: sent() - packets_before + child_tx,
    })
}
