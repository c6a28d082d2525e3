//! Two processes' worth of perftest's `ib_write_lat` on two UDP devices: each side
//! WRITEs one byte into the other's buffer, polls its CQ for its own send completion,
//! then spins on its buffer, without polling, until the peer's WRITE lands. A WRITE
//! makes no completion at the responder, so no poll of the waiting side brings it:
//! the device thread must receive it although the application polls between WRITEs.
//! It takes the socket back when a datagram is left on it (`socket_holds`), and every
//! WRITE lands.

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::{
    connect_qp, AccessFlags, CqId, Device, Endpoint, MemBuf, MrInfo, QpCap, QpInitAttr, QpParams,
    QpType, SendFlags, SendWr, Sge, WcStatus, WrOperation,
};

const ROUND_TRIPS: u32 = 100;

/// Two devices on 127.0.99.1 and .2 sharing a free port.
fn open_pair() -> (EmuDevice, EmuDevice) {
    let open = |host: u8, port: u16| {
        EmuDevice::open(EmuConfig {
            name: format!("spin{host}"),
            ip: Ipv4Addr::new(127, 0, 99, host),
            port,
            ..EmuConfig::default()
        })
    };
    for k in 0..64u16 {
        let port = 21_000 + k * 97;
        match open(1, port).and_then(|a| Ok((a, open(2, port)?))) {
            Ok(pair) => return pair,
            Err(e) if e.errno() == 98 => continue,
            Err(e) => panic!("open: {e}"),
        }
    }
    panic!("no shared free port");
}

struct Side {
    qpn: u32,
    cq: CqId,
    buf: MemBuf,
    mr: MrInfo,
}

fn side(d: &EmuDevice) -> Side {
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16, None).unwrap();
    let qpn = d
        .create_qp(&QpInitAttr {
            pd,
            send_cq: cq,
            recv_cq: cq,
            qp_type: QpType::Rc,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    let buf = MemBuf::new(64);
    let mr = d
        .reg_mr(
            pd,
            &buf,
            0,
            64,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    Side { qpn, cq, buf, mr }
}

/// One side's loop: the client writes first, the server answers each WRITE it sees.
fn ping_pong(d: &EmuDevice, me: &Side, peer: &MrInfo, client: bool) {
    let t0 = Instant::now();
    let mut out = Vec::new();
    for i in 0..ROUND_TRIPS {
        let mark = (i % 250 + 1) as u8;
        let wait = |m: u8| {
            // The peer's WRITE into byte 32, without a poll.
            while me.buf.with(|b| b[32]) != m {
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "round trip {i}: the peer's WRITE never landed"
                );
                std::hint::spin_loop();
            }
        };
        if !client {
            wait(mark);
        }
        me.buf.with_mut(|b| b[0] = mark);
        let mut wr = SendWr::new(
            u64::from(i),
            vec![Sge::new(me.mr.addr, 1, me.mr.lkey)],
            WrOperation::RdmaWrite {
                remote_addr: peer.addr + 32,
                rkey: peer.rkey,
            },
        );
        wr.send_flags = SendFlags::SIGNALED;
        d.post_send(me.qpn, &[wr]).unwrap();
        // Its send completion, by polling.
        loop {
            out.clear();
            if d.poll_cq(me.cq, 1, &mut out).unwrap() == 1 {
                assert_eq!(out[0].status, WcStatus::Success, "round trip {i}");
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "no send completion");
        }
        if client {
            wait(mark);
        }
    }
}

#[test]
fn writes_land_while_the_program_spins_on_memory_between_polls() {
    let (da, db) = open_pair();
    let (a, b) = (side(&da), side(&db));
    let params = QpParams {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..QpParams::default()
    };
    for (d, me, peer, gid) in [(&da, &a, &b, db.gid()), (&db, &b, &a, da.gid())] {
        let remote = Endpoint {
            qpn: peer.qpn,
            gid,
            ..Endpoint::default()
        };
        connect_qp(d, me.qpn, QpType::Rc, &params, 0, &remote).unwrap();
    }
    std::thread::scope(|s| {
        s.spawn(|| ping_pong(&db, &b, &a.mr, false));
        ping_pong(&da, &a, &b.mr, true);
    });
    let holds = |d: &EmuDevice| d.link_counters().socket_holds.load(Ordering::Relaxed);
    assert!(
        holds(&da) + holds(&db) > 0,
        "no device thread took the socket back from its spinning program"
    );
}
