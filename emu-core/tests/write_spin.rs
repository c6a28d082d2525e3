//! Two processes' worth of perftest's `ib_write_lat` on two UDP devices: each side
//! WRITEs one byte into the other's buffer, polls its CQ for its own send completion,
//! then spins on its buffer, without polling, until the peer's WRITE lands. A WRITE
//! makes no completion at the responder, so no poll of the waiting side brings it:
//! the device thread must receive it although the application polls between WRITEs.
//! It takes the socket back when a datagram is left on it (`socket_holds`), and every
//! WRITE lands.

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::{
    AccessFlags, Context, Cq, Endpoint, MemBuf, Mr, Qp, QpParams, QpType, SendWr, WcStatus,
};

const ROUND_TRIPS: u32 = 100;

/// Two devices on 127.0.99.1 and .2 sharing a free port.
fn open_pair() -> (Arc<EmuDevice>, Arc<EmuDevice>) {
    let open = |host: u8, port: u16| {
        EmuDevice::open(EmuConfig {
            name: format!("spin{host}"),
            ip: Ipv4Addr::new(127, 0, 99, host).into(),
            port,
            ..EmuConfig::default()
        })
    };
    for k in 0..64u16 {
        let port = 21_000 + k * 97;
        match open(1, port).and_then(|a| Ok((a, open(2, port)?))) {
            Ok((a, b)) => return (Arc::new(a), Arc::new(b)),
            Err(e) if e.errno() == 98 => continue,
            Err(e) => panic!("open: {e}"),
        }
    }
    panic!("no shared free port");
}

struct Side {
    ctx: Context,
    cq: Cq,
    qp: Qp,
    buf: MemBuf,
    mr: Mr,
}

fn side(dev: &Arc<EmuDevice>) -> Side {
    let ctx = Context::new(dev.clone());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd.qp(QpType::Rc, &cq).build().unwrap();
    let buf = MemBuf::new(64);
    let mr = pd
        .reg_mr(&buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    Side {
        ctx,
        cq,
        qp,
        buf,
        mr,
    }
}

/// One side's loop: the client writes first, the server answers each WRITE it sees.
fn ping_pong(me: &Side, peer: &Mr, client: bool) {
    let t0 = Instant::now();
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
        let wr = SendWr::rdma_write(u64::from(i), me.mr.sge(0, 1), peer.addr(32), peer.rkey());
        me.qp.post_send(&[wr.signaled()]).unwrap();
        // Its send completion, by polling.
        let wc = me.cq.wait(Duration::from_secs(60)).unwrap();
        assert_eq!(wc.status, WcStatus::Success, "round trip {i}");
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
    for (me, peer) in [(&a, &b), (&b, &a)] {
        let remote = Endpoint {
            qpn: peer.qp.qpn(),
            gid: peer.ctx.gid().unwrap(),
            ..Endpoint::default()
        };
        me.qp.connect(&params, 0, &remote).unwrap();
    }
    std::thread::scope(|s| {
        s.spawn(|| ping_pong(&b, &a.mr, false));
        ping_pong(&a, &b.mr, true);
    });
    let holds = |d: &EmuDevice| d.link_counters().socket_holds.load(Ordering::Relaxed);
    assert!(
        holds(&da) + holds(&db) > 0,
        "no device thread took the socket back from its spinning program"
    );
}
