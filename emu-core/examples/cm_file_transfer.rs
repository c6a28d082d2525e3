//! The seed tutorial's "Lab 3" file transfer over the connection manager, as two
//! processes on emulated devices over UDP:
//!
//! ```sh
//! cargo run -p emu-core --example cm_file_transfer -- receive            # on 127.0.0.1
//! cargo run -p emu-core --example cm_file_transfer -- send 127.0.0.1 FILE # on 127.0.0.2
//! ```
//!
//! 1. The sender connects (rdma_cm: resolve address and route, connect) and SENDs the
//!    file's length and hash.
//! 2. The receiver registers a buffer that long for remote writes and SENDs back its
//!    address, length and rkey.
//! 3. The sender RDMA-WRITEs the file into it and SENDs DONE.
//! 4. The receiver hashes what arrived and answers good or bad; the sender disconnects.
//!
//! Options: `--port P` (the CM port, 7471), `--udp-port P` (the RoCE UDP port of both
//! devices, else `$EMU_PORT`, else 4791), `--ip A` (this side's device address).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_cm::{CmConfig, EmuCm};
use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

#[path = "common/checks.rs"]
mod checks;
use checks::{check_memory, check_mr, die, positive};

const MSG: u32 = 64;
const FILE_INFO: u8 = 1;
const MR_INFO: u8 = 2;
const DONE: u8 = 3;
const RESULT: u8 = 4;
const WAIT: Option<Duration> = Some(Duration::from_secs(30));
/// Largest single RDMA WRITE.
const CHUNK: usize = 1 << 20;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// FNV-1a, 64 bits: the "hash" both sides compute.
fn hash(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

struct Side {
    cm: EmuCm,
    ch: CmChannelId,
    _dev: Arc<dyn Device>,
}

fn open(ip: Ipv4Addr, udp_port: u16) -> Res<Side> {
    let dev: Arc<dyn Device> = Arc::new(EmuDevice::open(EmuConfig {
        name: format!("emu-{ip}"),
        ip: ip.into(),
        port: udp_port,
        ..EmuConfig::default()
    })?);
    let cm = EmuCm::open(
        vec![dev.clone()],
        CmConfig {
            response_timeout: 16,
            max_retries: 8,
            ..CmConfig::default()
        },
    )?;
    let ch = cm.create_event_channel()?;
    Ok(Side { cm, ch, _dev: dev })
}

/// The id's QP (RC) with one CQ, and a message buffer for two sends and two receives.
fn setup(cm: &EmuCm, id: CmId) -> Res<(MemBuf, MrInfo)> {
    let dev = cm.device(id)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16, None)?;
    cm.create_qp(
        id,
        &QpInitAttr::new(pd, cq, QpType::Rc, QpCap::new(8, 8)).sq_sig_all(true),
    )?;
    let buf = MemBuf::new(2 * MSG as usize);
    let mr = reg_msgs(cm, id, &buf, 0, buf.len())?;
    Ok((buf, mr))
}

/// Receive slot at 0, send slot at MSG.
fn send_msg(cm: &EmuCm, id: CmId, buf: &MemBuf, mr: &MrInfo, msg: &[u8]) -> Res<()> {
    buf.write(MSG as usize, msg)?;
    post_send(
        cm,
        id,
        1,
        mr.addr + u64::from(MSG),
        MSG,
        Some(mr),
        SendFlags::SIGNALED,
    )?;
    let wc = get_send_comp(cm, id, WAIT)?;
    if wc.status != WcStatus::Success {
        return Err(format!("send failed: {}", wc.status).into());
    }
    Ok(())
}

fn recv_msg(cm: &EmuCm, id: CmId, buf: &MemBuf, mr: &MrInfo, kind: u8) -> Res<Vec<u8>> {
    let wc = get_recv_comp(cm, id, WAIT)?;
    if wc.status != WcStatus::Success {
        return Err(format!("receive failed: {}", wc.status).into());
    }
    let mut m = vec![0u8; MSG as usize];
    buf.read(0, &mut m)?;
    if m[0] != kind {
        return Err(format!("expected message {kind}, got {}", m[0]).into());
    }
    post_recv(cm, id, 0, mr.addr, MSG, mr)?;
    Ok(m)
}

fn u64_at(m: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(m[at..at + 8].try_into().expect("8 bytes"))
}

fn receive(ip: Ipv4Addr, udp_port: u16, port: u16) -> Res<bool> {
    let s = open(ip, udp_port)?;
    let l = s.cm.create_id(s.ch, PortSpace::Tcp)?;
    s.cm.bind_addr(l, SocketAddr::from((ip, port)))?;
    s.cm.listen(l, 1)?;
    println!("listening on {ip}:{port}");
    let req = s.cm.get_request(l, None)?;
    let id = req.id;
    let (buf, mr) = setup(&s.cm, id)?;
    post_recv(&s.cm, id, 0, mr.addr, MSG, &mr)?;
    s.cm.accept(id, &ConnParam::default())?;
    expect_cm_event(&s.cm, s.ch, Some(id), CmEventType::Established, WAIT)?;

    let info = recv_msg(&s.cm, id, &buf, &mr, FILE_INFO)?;
    let (len, want) = (u64_at(&info, 8), u64_at(&info, 16));
    let what = format!("the sender's file of {len} bytes");
    check_memory(&what, len)?;
    check_mr(&*s.cm.device(id)?, &what, len)?;
    let len = usize::try_from(len)?;
    let file = MemBuf::new(len.max(1));
    let fmr = reg_write(&s.cm, id, &file, 0, len.max(1))?;
    let mut m = vec![MR_INFO; 1];
    m.resize(8, 0);
    m.extend_from_slice(&fmr.addr.to_be_bytes());
    m.extend_from_slice(&(len as u64).to_be_bytes());
    m.extend_from_slice(&u64::from(fmr.rkey).to_be_bytes());
    send_msg(&s.cm, id, &buf, &mr, &m)?;

    recv_msg(&s.cm, id, &buf, &mr, DONE)?;
    let got = file.with(|b| hash(&b[..len]));
    let ok = got == want;
    println!(
        "received {len} bytes, hash {got:016x}: {}",
        if ok { "good" } else { "BAD" }
    );
    send_msg(&s.cm, id, &buf, &mr, &[RESULT, u8::from(ok)])?;
    expect_cm_event(&s.cm, s.ch, Some(id), CmEventType::Disconnected, WAIT)?;
    // The usual answer to DISCONNECTED (librdmacm sends the DREP then).
    s.cm.disconnect(id)?;
    s.cm.destroy_qp(id)?;
    Ok(ok)
}

fn send(ip: Ipv4Addr, udp_port: u16, to: SocketAddr, path: &str) -> Res<bool> {
    let size = std::fs::metadata(path)
        .map_err(|e| format!("{path}: {e}"))?
        .len();
    // The file and its registered copy.
    check_memory(path, size.saturating_mul(2))?;
    let data = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let c = open(ip, udp_port)?;
    let id = c.cm.create_id(c.ch, PortSpace::Tcp)?;
    c.cm.resolve_addr(id, None, to, Duration::from_secs(2))?;
    expect_cm_event(&c.cm, c.ch, Some(id), CmEventType::AddrResolved, WAIT)?;
    c.cm.resolve_route(id, Duration::from_secs(2))?;
    expect_cm_event(&c.cm, c.ch, Some(id), CmEventType::RouteResolved, WAIT)?;
    let (buf, mr) = setup(&c.cm, id)?;
    post_recv(&c.cm, id, 0, mr.addr, MSG, &mr)?;
    c.cm.connect(id, &ConnParam::default())?;
    expect_cm_event(&c.cm, c.ch, Some(id), CmEventType::Established, WAIT)?;

    let t0 = Instant::now();
    let mut m = vec![FILE_INFO; 1];
    m.resize(8, 0);
    m.extend_from_slice(&(data.len() as u64).to_be_bytes());
    m.extend_from_slice(&hash(&data).to_be_bytes());
    send_msg(&c.cm, id, &buf, &mr, &m)?;
    let r = recv_msg(&c.cm, id, &buf, &mr, MR_INFO)?;
    let (addr, len, rkey) = (u64_at(&r, 8), u64_at(&r, 16), u64_at(&r, 24) as u32);
    if len as usize != data.len() {
        return Err("the receiver's buffer has the wrong length".into());
    }
    check_mr(&*c.cm.device(id)?, path, size)?;
    let file = MemBuf::from_slice(&data);
    let fmr = reg_msgs(&c.cm, id, &file, 0, file.len().max(1))?;
    for (k, off) in (0..data.len()).step_by(CHUNK).enumerate() {
        let n = CHUNK.min(data.len() - off);
        post_write(
            &c.cm,
            id,
            10 + k as u64,
            fmr.addr + off as u64,
            n as u32,
            &fmr,
            SendFlags::SIGNALED,
            addr + off as u64,
            rkey,
        )?;
        let wc = get_send_comp(&c.cm, id, WAIT)?;
        if wc.status != WcStatus::Success {
            return Err(format!("RDMA WRITE failed: {}", wc.status).into());
        }
    }
    send_msg(&c.cm, id, &buf, &mr, &[DONE])?;
    let r = recv_msg(&c.cm, id, &buf, &mr, RESULT)?;
    let ok = r[1] == 1;
    println!(
        "sent {} bytes in {:?}: the receiver says {}",
        data.len(),
        t0.elapsed(),
        if ok { "good" } else { "BAD" }
    );
    c.cm.disconnect(id)?;
    expect_cm_event(&c.cm, c.ch, Some(id), CmEventType::Disconnected, WAIT)?;
    c.cm.destroy_qp(id)?;
    Ok(ok)
}

fn main() {
    let (mut udp_port, mut port, mut ip) = (checks::env_port(), 7471u16, None::<Ipv4Addr>);
    let mut positional = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--udp-port" => udp_port = positive(&a, val()),
            "--port" => port = positive(&a, val()),
            "--ip" => {
                let v = val();
                ip = Some(
                    v.parse()
                        .unwrap_or_else(|_| die(&format!("--ip {v}: not an IPv4 address"))),
                );
            }
            o if o.starts_with('-') => die(&format!("unknown option {o}")),
            _ => positional.push(a),
        }
    }
    let positional: Vec<&str> = positional.iter().map(String::as_str).collect();
    let r = match positional.as_slice() {
        ["receive"] => receive(ip.unwrap_or(Ipv4Addr::LOCALHOST), udp_port, port),
        ["send", to, path] => {
            let to: Ipv4Addr = to
                .parse()
                .unwrap_or_else(|_| die(&format!("{to}: not an IPv4 address")));
            let ip = ip.unwrap_or(Ipv4Addr::new(127, 0, 0, 2));
            send(ip, udp_port, SocketAddr::from((to, port)), path)
        }
        _ => die("usage: cm_file_transfer [--port P] [--udp-port P] [--ip A] receive | send RECEIVER_IP FILE"),
    };
    match r {
        Ok(true) => {}
        Ok(false) => die("the file arrived damaged"),
        Err(e) => die(&e.to_string()),
    }
}
