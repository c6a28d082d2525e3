//! Two processes, one RC connection over UDP: the client RDMA-WRITEs a pattern into the
//! server's memory, the server checks every byte. Exits non-zero on any mismatch.
//!
//! ```text
//! write_verify [--bytes N] [-p TCP_PORT] [--udp-port N] [--ip ADDR]        server (127.0.0.1)
//! write_verify [--bytes N] [-p TCP_PORT] [--udp-port N] [--ip ADDR] HOST   client (127.0.0.2)
//! ```
//! `--ip` gives the device another address (across hosts, each end's own); the path
//! MTU is the port's active MTU, which follows the interface under the address.
//! The server registers N bytes (default 64 MiB) and sends its QP number, PSN, address
//! and R_Key over TCP; the client writes them in 1 MiB RDMA WRITEs, 8 in flight, then
//! says DONE; the server compares the whole buffer with the pattern.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice, ROCE_PORT};
use verbs_api::*;

#[path = "common/checks.rs"]
mod checks;
use checks::{check_memory, check_mr, die, positive, OrDie};

fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(13) ^ (i >> 12) as u8
}

/// Reads the peer's next line; a peer that went away ends the program with one line.
fn read_msg(reader: &mut impl BufRead, line: &mut String, what: &str) {
    line.clear();
    if reader.read_line(line).or_die(what) == 0 {
        die(&format!(
            "the peer closed the connection (waiting for {what})"
        ));
    }
}

fn main() {
    let (mut bytes, mut tcp, mut udp, mut host, mut ip) = (
        64usize << 20,
        18516u16,
        ROCE_PORT,
        None::<String>,
        None::<Ipv4Addr>,
    );
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut v = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--bytes" => bytes = positive(&a, v()),
            "-p" => tcp = positive(&a, v()),
            "--udp-port" => udp = positive(&a, v()),
            "--ip" => ip = Some(v().parse().unwrap_or_else(|_| die("bad --ip"))),
            h if !h.starts_with('-') => {
                if let Some(first) = host.replace(h.into()) {
                    die(&format!("one HOST only (got {first} and {h})"));
                }
            }
            o => die(&format!("unknown option {o}")),
        }
    }
    check_memory(&format!("--bytes {bytes}"), bytes as u64).unwrap_or_else(|e| die(&e));
    let client = host.is_some();
    let ip = ip.unwrap_or(if client {
        Ipv4Addr::new(127, 0, 0, 2)
    } else {
        Ipv4Addr::new(127, 0, 0, 1)
    });
    let dev = Arc::new(
        EmuDevice::open(EmuConfig {
            ip: ip.into(),
            port: udp,
            ..EmuConfig::default()
        })
        .unwrap_or_else(|e| die(&format!("open: {e}"))),
    );
    let active_mtu = dev
        .query_port(1)
        .unwrap_or_else(|e| die(&format!("query_port: {e}")))
        .active_mtu;
    check_mr(&*dev, &format!("--bytes {bytes}"), bytes as u64).unwrap_or_else(|e| die(&e));
    let ctx = Context::new(dev);
    let pd = ctx.alloc_pd().or_die("alloc_pd");
    let mem = MemBuf::new(bytes);
    let mr = pd
        .reg_mr(&mem, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .or_die("reg_mr");
    let cq = ctx.create_cq(64, None).or_die("create_cq");
    let qp = pd
        .qp(QpType::Rc, &cq)
        .max_send_wr(16)
        .max_recv_wr(1)
        .sq_sig_all(false)
        .build()
        .or_die("create_qp");
    let psn = (std::process::id() ^ u32::from(ip)) & 0xFF_FFFF;

    let mut stream = match &host {
        Some(h) => {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match TcpStream::connect((h.as_str(), tcp)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => die(&format!("connect: {e}")),
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        None => {
            TcpListener::bind(("0.0.0.0", tcp))
                .unwrap_or_else(|e| die(&format!("listen: {e}")))
                .accept()
                .or_die("accept")
                .0
        }
    };
    let ip_word = u32::from(ip);
    writeln!(
        stream,
        "{:06x} {:06x} {:08x} {:x} {:x}",
        qp.qpn(),
        psn,
        ip_word,
        mr.addr(0),
        mr.rkey()
    )
    .or_die("send the connection data");
    let mut reader = BufReader::new(stream.try_clone().or_die("clone the TCP stream"));
    let mut line = String::new();
    read_msg(&mut reader, &mut line, "the connection data");
    let f: Vec<u64> = line
        .split_whitespace()
        .map(|x| u64::from_str_radix(x, 16).unwrap_or_else(|_| die("bad peer line")))
        .collect();
    if f.len() != 5 {
        die("bad connection data from the peer");
    }
    let (rqpn, rpsn, rip, raddr, rrkey) = (
        f[0] as u32,
        f[1] as u32,
        Ipv4Addr::from(f[2] as u32),
        f[3],
        f[4] as u32,
    );

    // The peer's IPv4 address, from our own (index 1 on a device on both families).
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        path_mtu: active_mtu,
        timeout: 12,
        sgid_index: ctx.default_gid_index().or_die("query_gid"),
        ..QpParams::default()
    };
    let remote = Endpoint {
        qpn: rqpn,
        psn: rpsn,
        gid: Gid::from_ipv4(rip),
        ..Endpoint::default()
    };
    qp.connect(&params, psn, &remote).or_die("connect the QP");
    // Both ends are in RTS before the first WRITE: each says so and waits for the other.
    writeln!(stream, "ready").or_die("say ready");
    read_msg(&mut reader, &mut line, "ready");

    if client {
        mem.with_mut(|m| m.iter_mut().enumerate().for_each(|(i, x)| *x = pattern(i)));
        let chunk = 1 << 20;
        let n = bytes.div_ceil(chunk);
        let start = Instant::now();
        let (mut posted, mut done) = (0, 0);
        let mut wcs = Vec::new();
        while done < n {
            while posted < n && posted - done < 8 {
                let off = posted * chunk;
                let sge = mr.sge(off as u64, chunk.min(bytes - off) as u32);
                let wr = SendWr::rdma_write(posted as u64, sge, raddr + off as u64, rrkey);
                qp.post_send(&[wr.signaled()]).or_die("post_send");
                posted += 1;
            }
            wcs.clear();
            cq.poll(16, &mut wcs).or_die("poll_cq");
            for wc in &wcs {
                if wc.status != WcStatus::Success {
                    die(&format!("write {} failed: {}", wc.wr_id, wc.status));
                }
            }
            done += wcs.len();
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "wrote {bytes} bytes in {secs:.2} s ({:.0} MB/s)",
            bytes as f64 / secs / 1e6
        );
        writeln!(stream, "done").or_die("say done");
        read_msg(&mut reader, &mut line, "the verdict");
        if line.trim() != "verified" {
            die(&format!("server says: {}", line.trim()));
        }
        println!("server verified every byte");
    } else {
        read_msg(&mut reader, &mut line, "done");
        let bad = mem.with(|m| m.iter().enumerate().position(|(i, &x)| x != pattern(i)));
        match bad {
            None => {
                writeln!(stream, "verified").or_die("say verified");
                println!("received and verified {bytes} bytes");
            }
            Some(i) => {
                writeln!(stream, "mismatch at byte {i}").or_die("report the mismatch");
                die(&format!("mismatch at byte {i}"));
            }
        }
    }
}
