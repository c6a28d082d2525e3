//! The latency tests of `rdma-emu bench` (send_lat, write_lat, read_lat): ping-pongs
//! on one QP, each round followed by the raw UDP ping-pongs it is compared with.

use super::*;

/// Runs `o.rounds` rounds of `o`'s latency test on `st` (the first round's devices)
/// and fresh devices after it, prints them and the median round with its baselines,
/// and adds their fields to `json`.
pub(super) fn rounds(
    o: &BenchOpts,
    st: Setup,
    size: u64,
    iters: u64,
    json: &mut String,
) -> Result<(), String> {
    let (send_wr, recv_wr) = LAT_WRS;
    let mut first = Some(st);
    let mut rounds: Vec<LatRound> = Vec::new();
    for _ in 0..o.rounds {
        let st = round_setup(o, size, send_wr, recv_wr, &mut first)?;
        let mut samples = run_lat(o, &st, size, iters)?;
        report_losses(&st);
        let stats = LatStats::of(&mut samples);
        if o.verify {
            verify_check(o, &st, size, iters)?;
        }
        drop(st);
        // The raw ping-pongs right after the run, as a bandwidth round measures
        // its baselines right after its run.
        let base = if o.no_baseline || o.one_thread {
            None
        } else {
            Some(lat_baselines(o, size, iters)?)
        };
        rounds.push(LatRound { stats, base });
    }
    let keys: Vec<f64> = rounds.iter().map(|r| r.key()).collect();
    let median = median_of(&keys);
    if rounds.len() > 1 {
        for (i, r) in rounds.iter().enumerate() {
            let mark = if i == median { " (median, below)" } else { "" };
            match &r.base {
                Some(b) => println!(
                    " round {}: {:.2} usec typical, baseline {:.2} usec: {:.2}x{mark}",
                    i + 1,
                    r.stats.typical,
                    b.raw,
                    r.key()
                ),
                None => println!(
                    " round {}: {:.2} usec typical{mark}",
                    i + 1,
                    r.stats.typical
                ),
            }
        }
        println!("{}", line());
        *json += &rounds_json(&keys);
    }
    let LatRound { stats: s, base } = &rounds[median];
    println!(
            " #bytes #iterations  t_min[usec]  t_max[usec]  t_typical[usec]  t_avg[usec]  t_stdev[usec]  99% percentile[usec]  99.9% percentile[usec]"
        );
    println!(
        " {:<6} {:<12} {:<12.2} {:<12.2} {:<16.2} {:<12.2} {:<14.2} {:<21.2} {:.2}",
        size, iters, s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    );
    if o.test == Test::ReadLat {
        println!(" (read_lat: whole round trips; send_lat and write_lat: half round trips)");
    }
    *json += &format!(
            ",\"lat_min_us\":{},\"lat_typical_us\":{},\"lat_max_us\":{},\"lat_avg_us\":{},\"lat_stdev_us\":{},\"lat_p99_us\":{},\"lat_p999_us\":{}",
            json_num(s.min), json_num(s.typical), json_num(s.max), json_num(s.avg),
            json_num(s.stdev), json_num(s.p99), json_num(s.p999)
        );
    if o.verify {
        println!(" verify: the target matches the source byte for byte");
    }
    if let Some(b) = base {
        let d = datagram(size, o.mtu);
        let mode = b.wait.name();
        let raw = b.raw;
        let ratio = s.typical / raw;
        println!("{}", line());
        println!(
            " baseline: raw UDP ping-pong, {d}-byte datagrams, {mode}: {raw:.2} usec typical{}",
            if o.test == Test::ReadLat {
                " (round trip)"
            } else {
                ""
            }
        );
        println!(" ratio (lower is better): {ratio:.2}x");
        *json += &format!(
            ",\"baseline\":\"udp_pingpong_{mode}\",\"baseline_us\":{},\"ratio\":{}",
            json_num(raw),
            json_num(ratio)
        );
        if let Some(l) = b.line {
            println!(
                " host: a cache line between two threads takes {l:.3} usec each way{} (the rings' floor); this test took {:.1} times that",
                if o.test == Test::ReadLat { ", doubled" } else { "" },
                s.typical / l
            );
            *json += &format!(",\"line_pingpong_us\":{}", json_num(l));
        }
        if let Some(block) = b.blocking {
            println!(
                    " baseline: raw UDP ping-pong, {d}-byte datagrams, blocking: {block:.2} usec typical; ratio {:.2}x",
                    s.typical / block
                );
            *json += &format!(
                ",\"baseline_blocking_us\":{},\"ratio_blocking\":{}",
                json_num(block),
                json_num(s.typical / block)
            );
        }
    }
    Ok(())
}

/// One latency run of `o`'s test on fresh devices: its statistics.
pub(in crate::cli) fn measure_lat(o: &BenchOpts, iters: u64) -> Result<LatStats, String> {
    let size = o.size.unwrap_or(8);
    let st = setup(o, size, 1, LAT_WRS.0, LAT_WRS.1)?;
    let mut samples = run_lat(o, &st, size, iters)?;
    Ok(LatStats::of(&mut samples))
}

/// One round of a latency test: the run's statistics and the raw ping-pongs measured
/// right after it.
struct LatRound {
    stats: LatStats,
    base: Option<LatBaselines>,
}

/// A latency round's baselines: the raw UDP ping-pong in the bench's polling mode and,
/// in the default (yielding) mode, the blocking one the target names; typical
/// half round trips (whole ones for read_lat) in microseconds.
struct LatBaselines {
    wait: baseline::Wait,
    raw: f64,
    blocking: Option<f64>,
    /// On the shared-memory rings (`--link shm` or `auto`): a cache line's half round
    /// trip between two threads, the rings' floor.
    line: Option<f64>,
}

impl LatRound {
    /// What orders rounds: the ratio to the raw ping-pong, else the typical latency.
    fn key(&self) -> f64 {
        match &self.base {
            Some(b) => self.stats.typical / b.raw,
            None => self.stats.typical,
        }
    }
}

/// Measures a latency round's baselines (see [`LatBaselines`]).
fn lat_baselines(o: &BenchOpts, size: u64, iters: u64) -> Result<LatBaselines, String> {
    let d = datagram(size, o.mtu);
    let n = iters.min(20_000) as usize;
    // read_lat is a whole round trip.
    let scale = if o.test == Test::ReadLat { 2.0 } else { 1.0 };
    let typical = |wait| -> Result<f64, String> {
        let mut raw = baseline::udp_pingpong(d, n, wait).map_err(|e| format!("baseline: {e}"))?;
        Ok(LatStats::of(&mut raw).typical * scale)
    };
    let wait = if o.busy_poll {
        baseline::Wait::Busy
    } else if o.events {
        baseline::Wait::Block
    } else {
        baseline::Wait::Yield
    };
    Ok(LatBaselines {
        wait,
        raw: typical(wait)?,
        // The default mode also against a blocking raw ping-pong (what a plain socket
        // program does; the target for this mode is stated against it). On a
        // VM its wake-up latency moves from run to run.
        blocking: if wait == baseline::Wait::Yield {
            Some(typical(baseline::Wait::Block)?)
        } else {
            None
        },
        line: (o.link != LinkKind::Udp)
            .then(|| LatStats::of(&mut baseline::line_pingpong(n)).typical * scale),
    })
}

/// One latency run: samples in microseconds (half round trips, or whole ones for
/// read_lat).
fn run_lat(o: &BenchOpts, st: &Setup, size: u64, iters: u64) -> Result<Vec<f64>, String> {
    let (c, s) = (&st.client, st.server.here()?);
    let mut out = Vec::with_capacity(iters as usize);
    let mut progress = Progress::new(iters, o.json);
    match o.test {
        Test::ReadLat => {
            let mut wcs = Vec::with_capacity(4);
            for i in 0..iters {
                let mut wr = SendWr::new(
                    i,
                    vec![c.sge(0, size)],
                    WrOperation::RdmaRead {
                        remote_addr: s.mr.addr,
                        rkey: s.mr.rkey,
                    },
                );
                wr.send_flags = SendFlags::SIGNALED;
                let t = Instant::now();
                c.dev
                    .post_send(c.qpns[0], &[wr])
                    .map_err(|e| format!("post_send: {e}"))?;
                while c.poll(&mut wcs)? == 0 {
                    if !o.busy_poll {
                        std::thread::yield_now();
                    }
                }
                out.push(t.elapsed().as_secs_f64() * 1e6);
                progress.set(i + 1);
            }
        }
        Test::SendLat | Test::WriteLat => {
            let send = o.test == Test::SendLat;
            if send {
                c.post_recvs(0, 64, st.region, size)?;
                s.post_recvs(0, 64, st.region, size)?;
            }
            // Each side builds its WRs once and reposts them, as perftest does: the
            // run measures the device, not the building of WR lists. A message is a
            // SEND, or a WRITE into the peer's buffer.
            let wrs_of = |h: &Host, peer: &Host| {
                let recv = vec![RecvWr::new(0, vec![h.sge(h.offset(0, st.region), size)]); 64];
                let op = if send {
                    WrOperation::Send
                } else {
                    WrOperation::RdmaWrite {
                        remote_addr: peer.mr.addr,
                        rkey: peer.mr.rkey,
                    }
                };
                let mut wr = SendWr::new(0, vec![h.sge(0, size)], op);
                wr.send_flags = SendFlags::SIGNALED;
                (recv, wr)
            };
            // Polls `h`'s CQs once: how many completions, and how many of them were
            // receives (reposted at once) and sends.
            let reap = |h: &Host,
                        wcs: &mut Vec<WorkCompletion>,
                        recv_wrs: &[RecvWr]|
             -> Result<(usize, usize, usize), String> {
                let n = h.poll(wcs)?;
                let recvs = wcs.iter().filter(|w| w.opcode.is_recv()).count();
                if recvs > 0 {
                    h.repost(&recv_wrs[..recvs])?;
                }
                Ok((n, recvs, n - recvs))
            };
            // With `--wait-send`, after a post: the send's own completion, as
            // perftest's latency tests wait for it (their send queue is one deep). A
            // receive found meanwhile (the peer's next message can come first) is
            // counted in `early` for the next wait.
            let await_send = |h: &Host,
                              wcs: &mut Vec<WorkCompletion>,
                              recv_wrs: &[RecvWr],
                              early: &mut usize|
             -> Result<(), String> {
                let mut armed = false;
                loop {
                    let (n, recvs, sends) = reap(h, wcs, recv_wrs)?;
                    *early += recvs;
                    if sends > 0 {
                        return Ok(());
                    }
                    if n == 0 {
                        h.idle(o, &mut armed)?;
                    }
                }
            };
            // Waits for message `i`: a receive completion (one found early counts),
            // or the last byte of the buffer turning to `mark`.
            let await_message = |h: &Host,
                                 mark: u8,
                                 wcs: &mut Vec<WorkCompletion>,
                                 recv_wrs: &[RecvWr],
                                 early: &mut usize|
             -> Result<(), String> {
                let mut armed = false;
                loop {
                    if send && *early > 0 {
                        *early -= 1;
                        return Ok(());
                    }
                    let (n, recvs, _) = reap(h, wcs, recv_wrs)?;
                    *early += recvs;
                    if !send && h.buf.with(|b| b[size as usize - 1] == mark) {
                        return Ok(());
                    }
                    if n == 0 {
                        h.idle(o, &mut armed)?;
                    }
                }
            };
            let post = |h: &Host, wr: &SendWr| {
                h.dev
                    .post_send(h.qpns[0], std::slice::from_ref(wr))
                    .map_err(|e| format!("post_send: {e}"))
            };
            if o.one_thread {
                // Both sides in turn: each poll finds what the other side's post
                // pushed, so the run is the devices' own work.
                let mut wcs = Vec::with_capacity(64);
                let (recv_c, mut wr) = wrs_of(c, s);
                let (recv_s, mut answer) = wrs_of(s, c);
                let (mut early_c, mut early_s) = (0, 0);
                for i in 0..iters {
                    let mark = (i % 127 + 1) as u8;
                    c.buf.with_mut(|b| b[size as usize - 1] = mark);
                    wr.wr_id = i;
                    answer.wr_id = i;
                    let t = Instant::now();
                    post(c, &wr)?;
                    await_message(s, mark, &mut wcs, &recv_s, &mut early_s)?;
                    s.buf.with_mut(|b| b[size as usize - 1] = mark | 0x80);
                    post(s, &answer)?;
                    await_message(c, mark | 0x80, &mut wcs, &recv_c, &mut early_c)?;
                    out.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                    progress.set(i + 1);
                }
                progress.finish();
                return Ok(out);
            }
            let result = std::thread::scope(|scope| -> Result<(), String> {
                let server = scope.spawn(|| -> Result<(), String> {
                    // The echoing side: answers each message in kind, the answer
                    // carrying the mark with the top bit set.
                    let mut wcs = Vec::with_capacity(64);
                    let (recv, mut answer) = wrs_of(s, c);
                    let mut early = 0;
                    for i in 0..iters {
                        let mark = (i % 127 + 1) as u8;
                        await_message(s, mark, &mut wcs, &recv, &mut early)?;
                        s.buf.with_mut(|b| b[size as usize - 1] = mark | 0x80);
                        answer.wr_id = i;
                        post(s, &answer)?;
                        if o.wait_send {
                            await_send(s, &mut wcs, &recv, &mut early)?;
                        }
                    }
                    // Let the last answer be acknowledged.
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_millis(50) {
                        s.poll(&mut wcs)?;
                        std::thread::yield_now();
                    }
                    Ok(())
                });
                let mut wcs = Vec::with_capacity(64);
                let (recv_wrs, mut wr) = wrs_of(c, s);
                let mut early = 0;
                for i in 0..iters {
                    let mark = (i % 127 + 1) as u8;
                    c.buf.with_mut(|b| b[size as usize - 1] = mark);
                    wr.wr_id = i;
                    let t = Instant::now();
                    post(c, &wr)?;
                    if o.wait_send {
                        await_send(c, &mut wcs, &recv_wrs, &mut early)?;
                    }
                    // The answer: a receive, or our last byte set to the mark.
                    await_message(c, mark | 0x80, &mut wcs, &recv_wrs, &mut early)?;
                    out.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                    progress.set(i + 1);
                }
                server.join().map_err(|_| "server thread panicked")??;
                Ok(())
            });
            result?;
        }
        _ => unreachable!("bandwidth tests run in run_bw"),
    }
    progress.finish();
    Ok(out)
}
