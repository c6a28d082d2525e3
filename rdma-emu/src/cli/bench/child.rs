//! `--two-processes`: the server's device in a process of its own, as perftest's two
//! programs are, so that a bandwidth test measures what crosses between processes
//! (the shared-memory link's rings are mapped by both, each side's device thread
//! has its own address space).
//!
//! The bench starts itself again as the child (`rdma-emu bench TEST --serve-stdio`
//! with the link, port, MTU, depth and polling options of the parent) and drives it
//! with one line per request on the child's stdin, one line per answer on its
//! stdout (`ok ...` or `err MESSAGE`):
//!
//! ```text
//! setup SIZE QPS SEND_WR RECV_WR   ->  ok GID ADDR RKEY BUF_LEN QPN...  (GID as IPv6)
//! connect GID QPN...               ->  ok
//! run REGION SIZE RECVS            ->  ok TX_PACKETS
//! stop                             ->  ok TX_PACKETS SHM_PACKETS RX_OVERFLOW ICRC_ERRORS
//! close                            ->  ok
//! ```
//!
//! `setup` opens a fresh device and its QPs (the server's half of `setup`),
//! `connect` moves them to RTS against the parent's QPs, `run` posts `RECVS`
//! receives per QP (send_bw) and serves until `stop`, `close` drops the device. The
//! child ends when its stdin does, so it cannot outlive a parent that dies.

use std::io::{BufRead, BufReader, Write};
use std::net::Ipv6Addr;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use super::*;

/// The server's side in a child process, as the parent sees it.
pub(super) struct Child {
    proc: std::process::Child,
    pipe: Mutex<Option<(ChildStdin, BufReader<ChildStdout>)>>,
    /// The child's device's GID.
    pub(super) gid: Gid,
    /// Its QPs, in the order of the parent's.
    pub(super) qpns: Vec<u32>,
    /// Its registered buffer.
    pub(super) mr: MrInfo,
    /// The bytes of that buffer.
    pub(super) buf_len: u64,
    /// What the child's last `stop` reported.
    pub(super) counters: Mutex<Option<ChildCounters>>,
}

/// The device counters the child reports at `stop`.
#[derive(Clone, Copy, Debug)]
pub(super) struct ChildCounters {
    pub(super) tx_packets: u64,
    pub(super) shm_packets: u64,
    pub(super) rx_overflow: u64,
    pub(super) icrc_errors: u64,
}

impl Child {
    /// Starts the child with `o`'s options and has it open its device and QPs.
    pub(super) fn start(
        o: &BenchOpts,
        size: u64,
        qps: u32,
        send_wr: u32,
        recv_wr: u32,
    ) -> Result<Child, String> {
        let exe = std::env::current_exe().map_err(|e| format!("where is rdma-emu: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.args(["bench", o.test.name(), "--serve-stdio"])
            .args(["--link", o.link.name()])
            .args(["--port", &port_of(o).to_string()])
            .args(["--mtu", &o.mtu.to_string()])
            .args(["--tx-depth", &o.depth().to_string()]);
        if o.busy_poll {
            cmd.arg("--busy-poll");
        }
        let mut proc = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start the server process: {e}"))?;
        let (Some(stdin), Some(stdout)) = (proc.stdin.take(), proc.stdout.take()) else {
            return Err("the server process has no pipes".into());
        };
        let pipe = Mutex::new(Some((stdin, BufReader::new(stdout))));
        let mut child = Child {
            proc,
            pipe,
            gid: Gid::default(),
            qpns: Vec::new(),
            mr: MrInfo {
                addr: 0,
                length: 0,
                lkey: 0,
                rkey: 0,
            },
            buf_len: 0,
            counters: Mutex::new(None),
        };
        let w = child.request(&format!("setup {size} {qps} {send_wr} {recv_wr}"))?;
        let bad = || format!("the server process's setup answer: {w:?}");
        if w.len() < 4 {
            return Err(bad());
        }
        child.gid = w[0].parse::<Ipv6Addr>().map_err(|_| bad())?.into();
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
        child.mr = MrInfo {
            addr: num(&w[1])?,
            length: 0,
            lkey: 0,
            rkey: u32::try_from(num(&w[2])?).map_err(|_| bad())?,
        };
        child.buf_len = num(&w[3])?;
        child.mr.length = child.buf_len;
        child.qpns = w[4..]
            .iter()
            .map(|q| u32::try_from(num(q)?).map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        if child.qpns.len() != qps as usize {
            return Err(bad());
        }
        Ok(child)
    }

    /// Connects the child's QPs to the parent's `qpns` on the device with `gid`.
    pub(super) fn connect(&self, gid: Gid, qpns: &[u32]) -> Result<(), String> {
        let list: Vec<String> = qpns.iter().map(u32::to_string).collect();
        self.request(&format!("connect {} {}", gid.to_ipv6(), list.join(" ")))
            .map(drop)
    }

    /// Has the child serve a run: `recvs` receives of `size` bytes posted per QP
    /// (send_bw), each QP's at `region`-byte strides. Its device's packets sent so far.
    pub(super) fn run(&self, region: u64, size: u64, recvs: u32) -> Result<u64, String> {
        let w = self.request(&format!("run {region} {size} {recvs}"))?;
        w.first()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| format!("the server process's run answer: {w:?}"))
    }

    /// Ends the run the child serves: its device's counters.
    pub(super) fn stop(&self) -> Result<ChildCounters, String> {
        let w = self.request("stop")?;
        let n: Vec<u64> = w.iter().filter_map(|t| t.parse().ok()).collect();
        match n[..] {
            [tx_packets, shm_packets, rx_overflow, icrc_errors] => {
                let c = ChildCounters {
                    tx_packets,
                    shm_packets,
                    rx_overflow,
                    icrc_errors,
                };
                *self.counters.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
                Ok(c)
            }
            _ => Err(format!("the server process's stop answer: {w:?}")),
        }
    }

    /// One request, its answer's words after `ok`.
    fn request(&self, line: &str) -> Result<Vec<String>, String> {
        let mut p = self.pipe.lock().unwrap_or_else(|e| e.into_inner());
        let Some((stdin, stdout)) = &mut *p else {
            return Err("the server process is closed".into());
        };
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("the server process: {e}"))?;
        let mut answer = String::new();
        let n = stdout
            .read_line(&mut answer)
            .map_err(|e| format!("the server process: {e}"))?;
        if n == 0 {
            return Err("the server process ended".into());
        }
        let mut words = answer.split_whitespace();
        match words.next() {
            Some("ok") => Ok(words.map(str::to_owned).collect()),
            Some("err") => Err(format!(
                "the server process: {}",
                answer.trim_end().trim_start_matches("err ")
            )),
            _ => Err(format!(
                "the server process answered {:?}",
                answer.trim_end()
            )),
        }
    }
}

impl Drop for Child {
    /// Closes the device in the child, closes the child's stdin (which ends it) and
    /// waits for it; a child that has not ended after 5 s is killed.
    fn drop(&mut self) {
        let _ = self.request("close");
        drop(
            self.pipe
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Ok(None) = self.proc.try_wait() {
            if Instant::now() > deadline {
                let _ = self.proc.kill();
                let _ = self.proc.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A run being served: its stop flag and thread.
type Serving = (Arc<AtomicBool>, std::thread::JoinHandle<Result<(), String>>);

/// What the child holds between requests.
#[derive(Default)]
struct Served {
    host: Option<Host>,
    /// The run being served: its stop flag and thread.
    run: Option<Serving>,
}

impl Served {
    fn host(&self) -> Result<&Host, String> {
        self.host.as_ref().ok_or_else(|| "no setup yet".to_string())
    }

    fn stop(&mut self) -> Result<(), String> {
        match self.run.take() {
            Some((stop, thread)) => {
                stop.store(true, Ordering::Relaxed);
                thread.join().map_err(|_| "the serving thread panicked")?
            }
            None => Ok(()),
        }
    }
}

/// The child's side (`--serve-stdio`): answers the parent's requests on stdin until
/// stdin ends.
pub(super) fn serve_stdio(o: &BenchOpts) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    let mut served = Served::default();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        let answer = match answer(o, &line, &mut served) {
            Ok(words) => format!("ok {words}"),
            Err(e) => format!("err {}", e.replace('\n', " ")),
        };
        writeln!(out, "{}", answer.trim_end())
            .and_then(|()| out.flush())
            .map_err(|e| format!("stdout: {e}"))?;
    }
    served.stop()
}

/// One request's answer, the words after `ok`.
fn answer(o: &BenchOpts, line: &str, served: &mut Served) -> Result<String, String> {
    let mut words = line.split_whitespace();
    let request = words.next().unwrap_or("");
    let args: Vec<&str> = words.collect();
    let num = |i: usize| -> Result<u64, String> {
        args.get(i)
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| format!("{request}: argument {} is missing or not a number", i + 1))
    };
    let small = |i: usize| num(i).and_then(|n| u32::try_from(n).map_err(|e| e.to_string()));
    match request {
        "setup" => {
            served.stop()?;
            served.host = None;
            let (size, qps, send_wr, recv_wr) = (num(0)?, small(1)?, small(2)?, small(3)?);
            let (buf_len, _) = buffer(size, qps)?;
            let buf_len = usize::try_from(buf_len).map_err(|_| "the buffer does not fit memory")?;
            let dev = open_device(o, "emu1", 2)?;
            let h = open_host(dev, qps, send_wr, recv_wr, buf_len, false)?;
            let qpns: Vec<String> = h.qpns.iter().map(u32::to_string).collect();
            let words = format!(
                "{} {} {} {} {}",
                h.dev.gid().to_ipv6(),
                h.mr.addr,
                h.mr.rkey,
                h.buf.len(),
                qpns.join(" ")
            );
            served.host = Some(h);
            Ok(words)
        }
        "connect" => {
            let h = served.host()?;
            let gid: Gid = args
                .first()
                .and_then(|g| g.parse::<Ipv6Addr>().ok())
                .ok_or("connect: no GID")?
                .into();
            let peers = (1..args.len()).map(small).collect::<Result<Vec<_>, _>>()?;
            if peers.len() != h.qpns.len() {
                return Err(format!(
                    "connect: {} QPs named, {} set up",
                    peers.len(),
                    h.qpns.len()
                ));
            }
            let params = qp_params(o)?;
            for (i, (&qpn, &peer)) in h.qpns.iter().zip(&peers).enumerate() {
                let (client_psn, server_psn) = psns(i);
                let ce = Endpoint {
                    qpn: peer,
                    psn: client_psn,
                    gid,
                    ..Endpoint::default()
                };
                connect_qp(&*h.dev, qpn, QpType::Rc, &params, server_psn, &ce)
                    .map_err(os("connect"))?;
            }
            Ok(String::new())
        }
        "run" => {
            served.stop()?;
            let (region, size, recvs) = (num(0)?, num(1)?, small(2)?);
            let h = served.host()?;
            h.prepare_run(o.test, recvs, region, size)?;
            let tx = h.dev.counters().tx_packets;
            let stop = Arc::new(AtomicBool::new(false));
            let thread = bw::spawn_serve(h.share(), o.test, region, size, stop.clone());
            served.run = Some((stop, thread));
            Ok(tx.to_string())
        }
        "stop" => {
            served.stop()?;
            let h = served.host()?;
            let l = h.dev.link_counters();
            Ok(format!(
                "{} {} {} {}",
                h.dev.counters().tx_packets,
                l.shm_packets.load(Ordering::Relaxed),
                l.rx_overflow.load(Ordering::Relaxed),
                l.icrc_errors.load(Ordering::Relaxed)
            ))
        }
        "close" => {
            served.stop()?;
            served.host = None;
            Ok(String::new())
        }
        _ => Err(format!("unknown request {request:?}")),
    }
}
